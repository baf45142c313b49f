//! The `virtprof` binary: parse arguments, run the command, map errors to exit codes.

mod args;
mod cmd;
mod energy;
mod exit;
mod exit_table;
mod pass;
mod qos;
mod recorder;
mod testvms;
mod watch;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args = match args::Cli::try_parse() {
        Ok(args) => args,
        Err(e) if e.use_stderr() => {
            // A usage error: one line, like every other bad input (clap's own text, which
            // names the option and the value, without its banner).
            let text = e.render().to_string();
            let message: Vec<&str> = text.lines().take_while(|l| !l.trim().is_empty()).map(str::trim).collect();
            let message = message.join(" ");
            eprintln!("virtprof: {} (see --help)", message.strip_prefix("error: ").unwrap_or(&message));
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

/// The OS error of a panic raised by `print!` failing to write standard output.
fn stdout_failure(payload: &(dyn std::any::Any + Send)) -> Option<&str> {
    let message =
        payload.downcast_ref::<String>().map(String::as_str).or_else(|| payload.downcast_ref::<&str>().copied())?;
    message.strip_prefix("failed printing to stdout: ")
}
