//! The `virtprof` binary: parse arguments, run the command, map errors to exit codes.

mod args;
mod cmd;
mod exit;
mod qos;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args = match args::Cli::try_parse() {
        Ok(args) => args,
        Err(e) => {
            // clap prints help/version to stdout (exit 0) and usage errors to stderr (exit 2).
            let _ = e.print();
            return if e.use_stderr() { ExitCode::from(exit::USAGE) } else { ExitCode::SUCCESS };
        }
    };
    match cmd::run(args) {
        Ok(code) => code,
        Err(err) => exit::report(&err),
    }
}
