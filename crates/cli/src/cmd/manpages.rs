//! `virtprof manpages DIR`: virtprof(1) and one page per command, from the CLI definition.

use std::process::ExitCode;

use anyhow::Context;
use clap::CommandFactory;

use crate::args::{Cli, ManpagesArgs};

pub fn run(args: &ManpagesArgs) -> anyhow::Result<ExitCode> {
    let dir = &args.dir;
    std::fs::create_dir_all(dir).with_context(|| format!("making {}", dir.display()))?;
    clap_mangen::generate_to(Cli::command(), dir)
        .with_context(|| format!("writing manual pages into {}", dir.display()))?;
    let mut pages: Vec<String> = std::fs::read_dir(dir)
        .with_context(|| format!("listing {}", dir.display()))?
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .filter(|name| name.starts_with("virtprof") && name.ends_with(".1"))
        .collect();
    pages.sort();
    println!("{} manual pages in {}: {}", pages.len(), dir.display(), pages.join(" "));
    Ok(ExitCode::SUCCESS)
}
