//! Docs that cannot drift: every `console` block of the README and docs/ is run, its output
//! compared with what the block shows (`[..]` matches any text within a line, `...` any
//! lines), and every relative link resolves. A block's commands run in order in one scratch
//! folder per file, with the built `virtprof` first on PATH; a command must succeed unless the
//! block shows `? N` (its exit code) after its output. Output kept as a measurement of a given
//! run (a bench's figures, a study's table) sits in `text` blocks that say so.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use super::util::{have_kvm, have_tracefs, repo, temp};

/// README.md and docs/*.md, as (path relative to the repository, text).
fn documents() -> Vec<(String, String)> {
    let mut paths = vec![repo().join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(repo().join("docs"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    paths.extend(docs);
    paths
        .into_iter()
        .map(|p| (p.strip_prefix(repo()).unwrap_or(&p).display().to_string(), std::fs::read_to_string(&p).unwrap()))
        .collect()
}

/// One command of a block: the line it starts on, the command, the output shown, the exit code.
struct Step {
    line: usize,
    command: String,
    expected: String,
    status: i32,
}

/// The steps of the `console` blocks of `text`.
fn steps(text: &str) -> Vec<Step> {
    let mut steps: Vec<Step> = Vec::new();
    let mut in_console = false;
    for (i, line) in text.lines().enumerate() {
        if let Some(info) = line.strip_prefix("```") {
            in_console = !in_console && info.trim() == "console";
            continue;
        }
        if !in_console {
            continue;
        }
        if let Some(command) = line.strip_prefix("$ ") {
            steps.push(Step { line: i + 1, command: command.to_string(), expected: String::new(), status: 0 });
        } else if let Some(step) = steps.last_mut() {
            match line.strip_prefix("? ").and_then(|code| code.parse().ok()) {
                Some(code) => step.status = code,
                None => {
                    step.expected.push_str(line);
                    step.expected.push('\n');
                }
            }
        }
    }
    steps
}

#[test]
fn every_console_block_in_the_docs_runs_as_shown() {
    let test = "every_console_block_in_the_docs_runs_as_shown";
    // The examples run VMs and record: they need what those need.
    if !have_tracefs(test) {
        return;
    }
    let Some(_vms) = have_kvm(test) else { return };
    let bin_dir = assert_cmd::cargo::cargo_bin("virtprof").parent().unwrap().to_path_buf();
    let path = std::env::join_paths(
        std::iter::once(bin_dir).chain(std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())),
    )
    .unwrap();
    let mut failures = Vec::new();
    let mut ran = 0;
    for (name, text) in documents() {
        let steps = steps(&text);
        if steps.is_empty() {
            continue;
        }
        let dir = temp(&format!("docs-{}", name.replace('/', "-")));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut groups = Vec::new();
        for step in steps {
            ran += 1;
            // Its own process group: what it leaves in the background is stopped with the file.
            let child = Command::new("timeout")
                .args(["300", "sh", "-c", &format!("{} 2>&1", step.command)])
                .current_dir(&dir)
                .env("PATH", &path)
                .env("COLUMNS", "100")
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .process_group(0)
                .spawn()
                .unwrap();
            groups.push(child.id());
            let out = child.wait_with_output().unwrap();
            let actual = String::from_utf8_lossy(&out.stdout).into_owned();
            let status = out.status.code().unwrap_or(-1);
            if status != step.status {
                failures.push(format!(
                    "{name}:{}: `{}` exited {status}, the doc says {}:\n{actual}",
                    step.line, step.command, step.status
                ));
                continue;
            }
            // Plain text: the diff goes to CI logs.
            let assert = snapbox::Assert::new().palette(snapbox::report::Palette::plain());
            if let Err(e) = assert.try_eq(
                Some(&format!("{name}:{}", step.line)),
                snapbox::IntoData::into_data(actual),
                snapbox::IntoData::into_data(step.expected.clone()),
            ) {
                failures.push(format!("{name}:{}: `{}`:\n{e}", step.line, step.command));
            }
        }
        for group in groups {
            // SAFETY: a signal to a process group this test made.
            unsafe { libc::kill(-(group as libc::pid_t), libc::SIGTERM) };
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
    assert!(ran >= 5, "only {ran} documented commands found");
    assert!(
        failures.is_empty(),
        "{} documented commands do not run as shown:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

/// Headings as GitHub anchors them: lower case, spaces to dashes, other punctuation dropped.
fn anchors(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.trim_start_matches('#').strip_prefix(' ').filter(|_| l.starts_with('#')))
        .map(|h| {
            h.trim()
                .to_lowercase()
                .chars()
                .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_' || *c == ' ')
                .collect::<String>()
                .replace(' ', "-")
        })
        .collect()
}

#[test]
fn every_relative_link_in_the_docs_resolves() {
    let link = regex::Regex::new(r"\]\(([^)\s]+)\)").unwrap();
    let mut broken = Vec::new();
    for (name, text) in documents() {
        let base = repo().join(&name).parent().unwrap().to_path_buf();
        for target in link.captures_iter(&text).map(|c| c[1].to_string()) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, anchor) = target.split_once('#').map_or((target.as_str(), None), |(p, a)| (p, Some(a)));
            let file = if path.is_empty() { repo().join(&name) } else { base.join(path) };
            if !file.exists() {
                broken.push(format!("{name}: {target}: no such file"));
            } else if let Some(anchor) = anchor.filter(|_| file.extension().is_some_and(|x| x == "md")) {
                if !anchors(&std::fs::read_to_string(&file).unwrap()).iter().any(|a| a == anchor) {
                    broken.push(format!("{name}: {target}: no such heading"));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// The commands a `--help` lists (wrapped description lines are indented further).
pub fn listed_commands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter(|l| !l.starts_with("   "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_string)
        .collect()
}

/// docs/reference.md is every command's `--help`, as the binary prints it:
/// `VIRTPROF_BLESS=1 cargo test -p virtprof-cli --test tests -- the_command_reference` rewrites it.
#[test]
fn the_command_reference_is_every_commands_help() {
    let help = |path: &[String]| -> String {
        let out = super::util::virtprof().args(path).arg("--help").env("COLUMNS", "100").output().unwrap();
        assert!(out.status.success(), "{path:?} --help");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let mut text = String::from(
        "# Command reference\n\nEvery command's `--help`, as `virtprof` prints it (also `man virtprof-COMMAND`). Made\n\
         by a test from the binary, which fails when they differ: `VIRTPROF_BLESS=1 cargo test -p\n\
         virtprof-cli --test tests -- the_command_reference` rewrites it. The [user guide](guide.md)\n\
         shows the commands at work.\n",
    );
    let mut pending: Vec<Vec<String>> = vec![Vec::new()];
    while let Some(path) = pending.pop() {
        let shown = help(&path);
        let title = std::iter::once("virtprof").chain(path.iter().map(String::as_str)).collect::<Vec<_>>().join(" ");
        text.push_str(&format!("\n## {title}\n\n```text\n{}\n```\n", shown.trim_end()));
        // Depth first, in the order the help lists them.
        for command in listed_commands(&shown).into_iter().rev() {
            let mut sub = path.clone();
            sub.push(command);
            pending.push(sub);
        }
    }
    let file = repo().join("docs/reference.md");
    if std::env::var_os("VIRTPROF_BLESS").is_some() {
        std::fs::write(&file, &text).unwrap();
    }
    let committed = std::fs::read_to_string(&file).unwrap_or_default();
    assert!(
        committed == text,
        "docs/reference.md is not the binary's help: VIRTPROF_BLESS=1 cargo test -p virtprof-cli --test tests -- the_command_reference"
    );
}
