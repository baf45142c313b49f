//! The `virtprof` binary: parse arguments, run the command, map errors to exit codes.

mod args;
mod cmd;
mod exit;
mod exit_table;
mod guest_table;
mod output;
mod qos;
mod watch;

use std::process::ExitCode;

fn main() -> ExitCode {
    // Re-executed as the reaper that cleans up after a killed run (`host::reaper`).
    if std::env::args_os().nth(1).is_some_and(|a| a == virtprof_host::reaper::REAPER_ARG) {
        virtprof_host::reaper::run();
    }
    virtprof_host::reaper::enable();
    virtprof_host::stop::remember_early_signals();
    let args = match parse_args() {
        Ok(args) => args,
        Err(e) if e.use_stderr() => {
            if let Some(message) = negative_number(&e) {
                eprintln!("virtprof: {message}");
                return ExitCode::from(exit::USAGE);
            }
            // A usage error: one line, like every other bad input (clap's own text, which
            // names the option and the value, without its banner).
            let text = e.render().to_string();
            let message: Vec<&str> = text.lines().take_while(|l| !l.trim().is_empty()).map(str::trim).collect();
            let message = message.join(" ");
            let message = message.strip_prefix("error: ").unwrap_or(&message);
            eprintln!("virtprof: {} (see --help)", virtprof_model::units::printable(message));
            return ExitCode::from(exit::USAGE);
        }
        Err(e) => {
            // Help and version go to stdout.
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
    };
    // `print!` panics when standard output fails (a closed pipe, a full disk). The panic
    // unwinds, so every guard on the way (tracefs instances, VMs, pinned threads) is dropped;
    // here it becomes the answer a shell user expects instead of a backtrace.
    let quiet_default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if stdout_failure(info.payload()).is_none() {
            quiet_default(info);
        }
    }));
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| cmd::run(args))) {
        Ok(Ok(code)) => code,
        Ok(Err(err)) => exit::report(&err),
        Err(payload) => match stdout_failure(payload.as_ref()) {
            // `virtprof ... | head` closing the pipe is not a failure.
            Some(cause) if cause.contains("Broken pipe") => ExitCode::SUCCESS,
            Some(cause) => {
                eprintln!("virtprof: writing to standard output: {cause}");
                ExitCode::from(exit::FAILURE)
            }
            None => std::panic::resume_unwind(payload),
        },
    }
}

/// The command line, with numbers such as `-5` taken as values (so they can be named as
/// negative) rather than as unknown options.
fn parse_args() -> Result<args::Cli, clap::Error> {
    use clap::{CommandFactory, FromArgMatches};
    fn allow_negative(command: clap::Command) -> clap::Command {
        command.allow_negative_numbers(true).mut_subcommands(allow_negative)
    }
    let matches = allow_negative(args::Cli::command()).try_get_matches()?;
    args::Cli::from_arg_matches(&matches)
}

/// `--vcpus -5`: say the number is negative and what is accepted, instead of "invalid digit".
fn negative_number(e: &clap::Error) -> Option<String> {
    use clap::error::ErrorKind;
    use clap::error::{ContextKind, ContextValue};
    if !matches!(e.kind(), ErrorKind::InvalidValue | ErrorKind::ValueValidation) {
        return None;
    }
    let value = match e.get(ContextKind::InvalidValue)? {
        ContextValue::String(v) => v,
        _ => return None,
    };
    let digits = value.strip_prefix('-')?;
    digits.trim_end_matches(|c: char| c.is_ascii_alphabetic()).parse::<f64>().ok()?;
    let option = match e.get(ContextKind::InvalidArg)? {
        ContextValue::String(a) => a.split_whitespace().next().unwrap_or(a).to_string(),
        _ => return None,
    };
    Some(format!("{option} {value}: negative; it takes a number of 0 or more (see --help)"))
}

/// The OS error of a panic raised by `print!` failing to write standard output.
fn stdout_failure(payload: &(dyn std::any::Any + Send)) -> Option<&str> {
    let message =
        payload.downcast_ref::<String>().map(String::as_str).or_else(|| payload.downcast_ref::<&str>().copied())?;
    message.strip_prefix("failed printing to stdout: ")
}
