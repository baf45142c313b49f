//! One module per subcommand; `run` dispatches.

pub mod agent;
mod balance;
mod boot;
mod compare;
mod completions;
mod demo;
mod doctor;
mod exits;
mod explain;
mod export;
pub mod import;
mod manpages;
pub mod noise;
mod record;
mod report;
mod sched;
mod serve;
mod stats;
mod testvm;
mod top;

use std::process::ExitCode;

use crate::args::{Cli, Command};

pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Doctor(args) => doctor::run(&args),
        Command::Testvm(args) => testvm::run(&args),
        Command::Stats(args) => stats::run(&args),
        Command::Import(args) => import::run(&args),
        Command::Record(args) => record::run(&args),
        Command::Exits(args) => exits::run(&args),
        Command::Explain(args) => explain::run(&args),
        Command::Sched(args) => sched::run(&args),
        Command::Report(args) => report::run(&args),
        Command::Compare(args) => compare::run(&args),
        Command::Export(args) => export::run(&args),
        Command::Top(args) => top::run(&args),
        Command::Serve(args) => serve::run(&args),
        Command::Demo(args) => demo::run(&args),
        Command::Boot(args) => boot::run(&args),
        Command::Balance(args) => balance::run(&args),
        Command::Noise(args) => noise::run(&args),
        Command::Agent(args) => agent::run(&args),
        Command::Completions(args) => completions::run(&args),
        Command::Manpages(args) => manpages::run(&args),
        Command::Vmm { .. } => {
            virtprof_host::stop::install_handler();
            virtprof_kvm::launcher::serve_child(std::io::stdin().lock(), std::io::stdout().lock())?;
            Ok(ExitCode::SUCCESS)
        }
    }
}
