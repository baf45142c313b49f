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
//!
//! Many exporters, on one host or many sharing the folder, may add to it at once: the
//! manifest's creation and each filing of partitions happen under an exclusive lock on
//! `DIR/.virtprof-dataset.lock` (flock; on NFS the server's lock manager). The slow part,
//! writing the tables, runs outside it. Nothing in the folder is taken on trust: the manifest
//! is read as a regular file of bounded size, and table, host and date folders must be real
//! folders (a symlink there would make an export write or delete outside the dataset).

use std::fs::File;
use std::os::fd::AsRawFd;
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
/// The tables a recording may have (roles, intervals and guests only when it has them).
const TABLES: [&str; 7] = ["events", "exits", "exit_reasons", "sched", "roles", "intervals", "guests"];
/// The lock every exporter takes to create the manifest and to file partitions.
const LOCK: &str = ".virtprof-dataset.lock";
/// The largest manifest read.
const MANIFEST_LIMIT: u64 = 64 << 10;

/// An exclusive lock on the dataset, held while its file is open (until dropped).
struct DatasetLock {
    _held: File,
}

impl DatasetLock {
    fn take(dir: &Path) -> anyhow::Result<DatasetLock> {
        let path = dir.join(LOCK);
        check_not_link(&path)?;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| anyhow::anyhow!("cannot open the dataset's lock '{}': {e}", path.display()))?;
        loop {
            // SAFETY: flock on a file we hold open.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } == 0 {
                return Ok(DatasetLock { _held: file });
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(anyhow::anyhow!("cannot lock the dataset ('{}'): {e}", path.display()));
            }
        }
    }
}

/// Add `args.file` to the dataset at `args.dataset`.
pub fn add(args: &ExportArgs) -> anyhow::Result<()> {
    let dir = args.dataset.as_deref().expect("called with --dataset");
    std::fs::create_dir_all(dir).map_err(|e| usage(format!("--dataset '{}': {e}", dir.display())))?;
    {
        let _lock = DatasetLock::take(dir)?;
        check_manifest(dir)?;
    }
    let mut recording = Session::open_warning(&args.file, &Default::default())?;
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
    // Unique across the hosts sharing the folder, not just this host's pids.
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let staging = dir.join(format!(".staging-{}-{nanos:x}", std::process::id()));
    std::fs::create_dir_all(&staging).map_err(|e| anyhow::anyhow!("cannot create '{}': {e}", staging.display()))?;
    let result = super::write_tables(&mut recording, &staging).and_then(|()| {
        let _lock = DatasetLock::take(dir)?;
        file_tables(dir, &staging, &host, &date, &name)
    });
    let _ = std::fs::remove_dir_all(&staging);
    result
}

/// Move each table the staging folder holds into its partition (the lock held).
fn file_tables(dir: &Path, staging: &Path, host: &str, date: &str, name: &str) -> anyhow::Result<()> {
    let mut replaced = false;
    // Every folder between the dataset and a partition is checked before anything moves.
    for table in TABLES.iter().filter(|t| staging.join(format!("{t}.parquet")).exists()) {
        let mut at = dir.join(table);
        for segment in [format!("host={host}"), format!("date={date}"), format!("recording={name}"), String::new()] {
            check_folder(&at)?;
            at.push(segment);
        }
    }
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

/// A path inside the dataset that must be a real folder if it exists (not a symlink, a
/// file or anything else).
fn check_folder(path: &Path) -> anyhow::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_dir() => Ok(()),
        Ok(m) => Err(usage(format!(
            "dataset folder '{}' is a {}, not a folder: the dataset is damaged or was tampered with; move it away",
            path.display(),
            if m.file_type().is_symlink() { "symbolic link" } else { "file" }
        ))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(anyhow::anyhow!("cannot look at '{}': {e}", path.display())),
    }
}

/// A path inside the dataset that must not be a symbolic link.
fn check_not_link(path: &Path) -> anyhow::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => Err(usage(format!(
            "'{}' is a symbolic link: the dataset is damaged or was tampered with; move it away",
            path.display()
        ))),
        _ => Ok(()),
    }
}

/// Create the manifest, or check that the dataset's schema is this one (the lock held).
fn check_manifest(dir: &Path) -> anyhow::Result<()> {
    let path = dir.join(MANIFEST);
    check_not_link(&path)?;
    match virtprof_host::input::read_text(&path, "dataset manifest", MANIFEST_LIMIT) {
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
        Err(virtprof_host::input::InputError::Open { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            // Other exporters' lock and staging folders are no one's data.
            let foreign = std::fs::read_dir(dir).into_iter().flatten().flatten().any(|e| {
                let name = e.file_name();
                let name = name.to_string_lossy();
                name != LOCK && !name.starts_with(".staging-")
            });
            if foreign {
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
        Err(e) => Err(usage(e.to_string())),
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

/// `--date`: a real day of the Gregorian calendar, written YYYY-MM-DD (ISO 8601's calendar
/// date; what DuckDB and Spark read as DATE), from 0001-01-01 to 9999-12-31.
fn checked_date(text: &str) -> anyhow::Result<String> {
    let bad = || usage(format!("--date '{}': not a date (YYYY-MM-DD)", virtprof_model::units::printable(text)));
    let b = text.as_bytes();
    let shaped = b.len() == 10
        && b[4] == b'-'
        && b[7] == b'-'
        && b.iter().enumerate().all(|(i, c)| i == 4 || i == 7 || c.is_ascii_digit());
    if !shaped {
        return Err(bad());
    }
    let number = |r: std::ops::Range<usize>| text[r].parse::<u32>().map_err(|_| bad());
    let (year, month, day) = (number(0..4)?, number(5..7)?, number(8..10)?);
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let days = match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return Err(bad()),
    };
    if year == 0 || day == 0 || day > days {
        return Err(bad());
    }
    Ok(text.to_string())
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
        for good in ["2024-02-29", "2000-02-29", "0001-01-01", "9999-12-31"] {
            assert_eq!(checked_date(good).unwrap(), good);
        }
        for bad in [
            "2026-13-01",
            "26-11-25",
            "yesterday",
            "2026-11-25x",
            "2026-02-31",
            "2026-1-011",
            "+2026-1-01",
            "0000-01-01",
            "2026-02-29",
            "1900-02-29",
            "2026-00-10",
            "2026-04-31",
            "2026-11-00",
            "２０２６-11-25",
        ] {
            assert!(checked_date(bad).is_err(), "{bad:?}");
        }
    }
}
