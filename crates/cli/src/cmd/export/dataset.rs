//! `export --format parquet --dataset DIR`: many hosts' recordings as one dataset. Each
//! table is its own Hive-partitioned folder, so DuckDB, Spark or Trino read `DIR/exits` (or
//! any other table) as one table with `host`, `date` and `recording` columns:
//!
//! ```text
//! DIR/_virtprof_dataset.json                   schema version and tables
//! DIR/exits/host=H/date=D/recording=R/exits.parquet
//! DIR/exit_reasons/host=H/date=D/recording=R/exit_reasons.parquet
//! ...
//! ```
//!
//! A recording is written aside (`DIR/.staging-PID`, which readers skip as hidden) and each
//! table's partition moved into place whole; exporting the same recording name for the same
//! host and day again replaces it. The schema version is checked before anything is written:
//! a dataset made by an incompatible virtprof is refused, not mixed.

use std::path::{Path, PathBuf};

use serde_json::json;
use virtprof_session::Session;

use crate::args::ExportArgs;
use crate::exit::usage;

/// The version of the tables' columns (docs/fleet.md). Bumped when a column changes meaning
/// or type; adding a table or a nullable column keeps it.
pub const SCHEMA_VERSION: u64 = 1;
/// The manifest at the dataset's root (underscore: Spark and Hive readers skip it).
const MANIFEST: &str = "_virtprof_dataset.json";
/// The tables a recording may have (intervals and guests only when it has them).
const TABLES: [&str; 6] = ["events", "exits", "exit_reasons", "sched", "intervals", "guests"];

/// Add `args.file` to the dataset at `args.dataset`.
pub fn add(args: &ExportArgs) -> anyhow::Result<()> {
    let dir = args.dataset.as_deref().expect("called with --dataset");
    check_manifest(dir)?;
    let mut recording = Session::open_warning(&args.file, None)?;
    let facts = &recording.metadata.host;
    let host = match args.host.as_deref().or(facts.get("hostname").map(String::as_str).filter(|h| !h.is_empty())) {
        Some(h) => partition_value(h, "--host")?,
        None => {
            return Err(usage(format!(
            "'{}' does not say which host made it (imported, or recorded before virtprof kept it): give --host NAME",
            args.file.display()
        )))
        }
    };
    let date = match (&args.date, facts.get("started_unix_ns").and_then(|n| n.parse::<u64>().ok())) {
        (Some(d), _) => checked_date(d)?,
        (None, Some(ns)) => virtprof_model::units::utc_date(ns / 1_000_000_000),
        (None, None) => {
            return Err(usage(format!(
                "'{}' does not say when it was made (imported, or recorded before virtprof kept it): give --date YYYY-MM-DD",
                args.file.display()
            )))
        }
    };
    let stem = args.file.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let name = partition_value(&stem, "the recording's file name")?;
    let staging = dir.join(format!(".staging-{}", std::process::id()));
    std::fs::create_dir_all(&staging).map_err(|e| anyhow::anyhow!("cannot create '{}': {e}", staging.display()))?;
    let result =
        super::write_tables(&mut recording, &staging).and_then(|()| file_tables(dir, &staging, &host, &date, &name));
    let _ = std::fs::remove_dir_all(&staging);
    result
}

/// Move each table the staging folder holds into its partition.
fn file_tables(dir: &Path, staging: &Path, host: &str, date: &str, name: &str) -> anyhow::Result<()> {
    let mut replaced = false;
    for table in TABLES {
        let file = staging.join(format!("{table}.parquet"));
        if !file.exists() {
            continue;
        }
        let partition: PathBuf = [
            dir,
            Path::new(table),
            Path::new(&format!("host={host}")),
            Path::new(&format!("date={date}")),
            Path::new(&format!("recording={name}")),
        ]
        .iter()
        .collect();
        if partition.exists() {
            std::fs::remove_dir_all(&partition)
                .map_err(|e| anyhow::anyhow!("cannot replace '{}': {e}", partition.display()))?;
            replaced = true;
        }
        let part = staging.join(format!("{table}.part"));
        std::fs::create_dir(&part)?;
        std::fs::rename(&file, part.join(format!("{table}.parquet")))?;
        let parent = partition.parent().expect("partition has a parent");
        std::fs::create_dir_all(parent).map_err(|e| anyhow::anyhow!("cannot create '{}': {e}", parent.display()))?;
        std::fs::rename(&part, &partition)
            .map_err(|e| anyhow::anyhow!("cannot move into '{}': {e}", partition.display()))?;
    }
    let verb = if replaced { "replaced" } else { "added" };
    eprintln!("virtprof: {verb} host={host}/date={date}/recording={name} in {}", dir.display());
    Ok(())
}

/// Create the manifest, or check that the dataset's schema is this one.
fn check_manifest(dir: &Path) -> anyhow::Result<()> {
    let path = dir.join(MANIFEST);
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let manifest: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| usage(format!("'{}': not a virtprof dataset manifest ({e})", path.display())))?;
            match manifest["schema_version"].as_u64() {
                Some(SCHEMA_VERSION) => Ok(()),
                Some(v) => Err(usage(format!(
                    "'{}' holds schema version {v}; this virtprof writes version {SCHEMA_VERSION}: use a new --dataset folder",
                    dir.display()
                ))),
                None => Err(usage(format!("'{}': no schema_version", path.display()))),
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if dir.exists() && std::fs::read_dir(dir).is_ok_and(|mut d| d.next().is_some()) {
                return Err(usage(format!(
                    "--dataset '{}': the folder holds files but no {MANIFEST}; give an empty or new folder",
                    dir.display()
                )));
            }
            std::fs::create_dir_all(dir).map_err(|e| usage(format!("--dataset '{}': {e}", dir.display())))?;
            let manifest = json!({
                "schema_version": SCHEMA_VERSION,
                "layout": "TABLE/host=HOST/date=YYYY-MM-DD/recording=NAME/TABLE.parquet",
                "tables": TABLES,
                "docs": "docs/fleet.md",
            });
            let text = serde_json::to_string_pretty(&manifest)? + "\n";
            virtprof_host::output::write_file(&path, text.as_bytes(), virtprof_host::output::Privacy::Shared)?;
            Ok(())
        }
        Err(e) => Err(usage(format!("'{}': {e}", path.display()))),
    }
}

/// A partition value: letters, digits, `.`, `_` and `-` (a Hive path segment every engine
/// reads back unchanged); anything else is refused, not rewritten.
fn partition_value(value: &str, what: &str) -> anyhow::Result<String> {
    let ok = !value.is_empty()
        && !value.starts_with('.')
        && value.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(value.to_string())
    } else {
        Err(usage(format!(
            "{what} '{}' cannot name a partition: use letters, digits, '.', '_' and '-'",
            virtprof_model::units::printable(value)
        )))
    }
}

/// `--date`: a real day, as YYYY-MM-DD.
fn checked_date(text: &str) -> anyhow::Result<String> {
    let parts: Vec<u32> = text.split('-').filter_map(|p| p.parse().ok()).collect();
    let shaped = text.len() == 10 && parts.len() == 3;
    let valid = shaped && (1..=12).contains(&parts[1]) && (1..=31).contains(&parts[2]);
    if valid {
        Ok(text.to_string())
    } else {
        Err(usage(format!("--date '{}': not a date (YYYY-MM-DD)", virtprof_model::units::printable(text))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_values_are_safe_path_segments() {
        assert_eq!(partition_value("kvm-host-1.dc2", "--host").unwrap(), "kvm-host-1.dc2");
        for bad in ["", "a/b", "x=y", "..", ".hidden", "tab\there", "ünï"] {
            assert!(partition_value(bad, "--host").is_err(), "{bad:?}");
        }
        assert_eq!(checked_date("2026-11-25").unwrap(), "2026-11-25");
        for bad in ["2026-13-01", "26-11-25", "yesterday", "2026-11-25x"] {
            assert!(checked_date(bad).is_err(), "{bad:?}");
        }
    }
}
