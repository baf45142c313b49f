//! The workspace's shape, as docs/design.md draws it: the CLI crate parses, runs commands and
//! renders; what the commands run lives in the engine and below.

use std::fs;
use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files
}

fn lines(files: &[PathBuf]) -> usize {
    files.iter().map(|f| fs::read_to_string(f).unwrap().lines().count()).sum()
}

/// Each command is its own module: what two commands share belongs to the engine (or to the
/// CLI's renderers), never to one of them.
#[test]
fn no_command_module_imports_another() {
    let cmd = workspace().join("crates/cli/src/cmd");
    let offenders: Vec<String> = rust_files(&cmd)
        .iter()
        .filter(|f| f.file_name().is_some_and(|n| n != "mod.rs") || f.parent() != Some(cmd.as_path()))
        .flat_map(|f| {
            let text = fs::read_to_string(f).unwrap();
            let shown = f.strip_prefix(&cmd).unwrap().display().to_string();
            text.lines()
                .filter(|l| l.contains("crate::cmd::") || l.contains("super::super::"))
                .map(|l| format!("{shown}: {}", l.trim()))
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(offenders.is_empty(), "command modules importing others:\n{}", offenders.join("\n"));
}

/// The CLI crate is argument parsing, commands and rendering: at most a quarter of the
/// workspace's library and binary code (its integration tests, here, are not counted).
#[test]
fn the_cli_is_at_most_a_quarter_of_the_code() {
    let crates = workspace().join("crates");
    let mut all = Vec::new();
    for entry in fs::read_dir(&crates).unwrap() {
        let src = entry.unwrap().path().join("src");
        if src.is_dir() {
            all.extend(rust_files(&src));
        }
    }
    let cli = rust_files(&crates.join("cli/src"));
    let (cli, all) = (lines(&cli), lines(&all));
    println!("crates/cli/src: {cli} of {all} lines in crates/*/src ({:.1} %)", cli as f64 * 100.0 / all as f64);
    assert!(cli * 4 <= all, "crates/cli/src holds {cli} of {all} lines: more than a quarter");
}
