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
    match cmd::run(args) {
        Ok(code) => code,
        Err(err) => exit::report(&err),
    }
}
