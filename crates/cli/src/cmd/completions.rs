//! `virtprof completions SHELL`: the shell completion script, from the CLI definition.

use std::io::Write;
use std::process::ExitCode;

use clap::CommandFactory;

use crate::args::{Cli, CompletionsArgs};

pub fn run(args: &CompletionsArgs) -> anyhow::Result<ExitCode> {
    // Rendered whole first: the generator cannot report a failed write (a closed pipe).
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut Cli::command(), "virtprof", &mut script);
    match std::io::stdout().lock().write_all(&script) {
        // `virtprof completions bash | head` closing the pipe is not a failure.
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(anyhow::anyhow!("writing to standard output: {e}")),
        _ => Ok(ExitCode::SUCCESS),
    }
}
