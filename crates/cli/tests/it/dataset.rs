//! `export --format parquet --dataset DIR`: three hosts' recordings filed as one
//! Hive-partitioned dataset, read back by DuckDB and by Spark (local mode), which must find
//! per host the exit counts `exits --json` gives for each recording.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use serde_json::Value;

use super::util::{have_kvm, have_tracefs, note, record_testvm, temp, virtprof};

/// Per host: (reason → count) as a reader of the dataset sums them.
type Counts = BTreeMap<String, BTreeMap<String, u64>>;

/// Run a Python script that prints JSON `{host: {reason: count}}`; None if `module` is missing.
fn python_counts(test: &str, module: &str, script: &str, dataset: &Path) -> Option<Counts> {
    let have = Command::new("python3").args(["-c", &format!("import {module}")]).output();
    if !have.is_ok_and(|o| o.status.success()) {
        note(test, format!("SKIP ({module} part): python3 cannot import {module} (scripts/test.sh installs it)"));
        return None;
    }
    let out = Command::new("python3").arg("-c").arg(script).arg(dataset).output().unwrap();
    assert!(out.status.success(), "{module}: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().last().unwrap_or_default();
    Some(serde_json::from_str(line).unwrap_or_else(|e| panic!("{module} printed {text}: {e}")))
}

const DUCKDB: &str = r#"
import duckdb, json, sys
root = sys.argv[1]
rows = duckdb.sql(f"""
    SELECT host, reason, sum(count)::BIGINT AS n
    FROM read_parquet('{root}/exit_reasons/*/*/*/*.parquet', hive_partitioning = true)
    GROUP BY host, reason
""").fetchall()
out = {}
for host, reason, n in rows:
    out.setdefault(host, {})[reason] = n
# The date partition is typed as a date, the sched table joins on the same keys.
kinds = duckdb.sql(f"SELECT typeof(date) FROM read_parquet('{root}/sched/*/*/*/*.parquet', hive_partitioning = true) LIMIT 1").fetchall()
assert kinds[0][0] == "DATE", kinds
print(json.dumps(out))
"#;

const SPARK: &str = r#"
import json, sys
from pyspark.sql import SparkSession, functions as F
root = sys.argv[1]
spark = (SparkSession.builder.master("local[1]").appName("virtprof-dataset")
         .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "1").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
rows = (spark.read.parquet(f"{root}/exit_reasons")
        .groupBy("host", "reason").agg(F.sum("count").alias("n")).collect())
out = {}
for r in rows:
    out.setdefault(r["host"], {})[r["reason"]] = int(r["n"])
spark.stop()
print(json.dumps(out))
"#;

/// `virtprof export FILE --format parquet --dataset DATASET --host HOST`.
fn export_into(dataset: &Path, host: &str, file: &Path) -> std::process::Output {
    virtprof()
        .args(["export", "--format", "parquet", "--dataset"])
        .arg(dataset)
        .args(["--host", host])
        .arg(file)
        .output()
        .unwrap()
}

#[test]
fn a_dataset_of_three_hosts_reads_in_duckdb_and_spark_with_the_exit_counts_of_exits_json() {
    let test = "a_dataset_of_three_hosts_reads_in_duckdb_and_spark_with_the_exit_counts_of_exits_json";
    let Some(_kvm) = have_kvm(test) else { return };
    if !have_tracefs(test) {
        return;
    }
    let dataset = temp("dataset");
    let _ = std::fs::remove_dir_all(&dataset);
    let workloads = [
        ("host-a", vec!["-w", "pio-user", "-n", "3000"]),
        ("host-b", vec!["-w", "mmio-user", "-n", "2000"]),
        ("host-c", vec!["-w", "io-bound", "-n", "200", "--io-latency", "100us"]),
    ];
    let mut expected = Counts::new();
    let mut files = Vec::new();
    for (host, args) in &workloads {
        let file = temp(&format!("dataset-{host}.vprec"));
        record_testvm(&file, &[], args);
        let exits = virtprof().arg("exits").arg(&file).arg("--json").output().unwrap();
        assert!(exits.status.success());
        let exits: Value = serde_json::from_slice(&exits.stdout).unwrap();
        let by_reason = exits["by_reason"].as_array().unwrap();
        let counts: BTreeMap<String, u64> = by_reason
            .iter()
            .map(|r| (r["reason"].as_str().unwrap().to_string(), r["count"].as_u64().unwrap()))
            .collect();
        assert_eq!(counts.values().sum::<u64>(), exits["totals"]["exits"].as_u64().unwrap());
        expected.insert(host.to_string(), counts);
        let out = export_into(&dataset, host, &file);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        files.push(file);
    }
    // Exporting one again replaces its partition: nothing counts twice.
    let again = export_into(&dataset, "host-a", &files[0]);
    assert!(String::from_utf8_lossy(&again.stderr).contains("replaced host=host-a/date="));
    // The layout: a manifest, and each table partitioned by host, day and recording.
    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(dataset.join("_virtprof_dataset.json")).unwrap()).unwrap();
    assert_eq!(manifest["schema_version"], 1);
    let today = virtprof_model::units::utc_date(
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs(),
    );
    for table in ["events", "exits", "exit_reasons", "sched"] {
        // temp() names the file virtprof-it-dataset-host-b.vprec-PID: its stem names the recording.
        let part = dataset.join(format!("{table}/host=host-b/date={today}/recording=virtprof-it-dataset-host-b"));
        assert!(part.join(format!("{table}.parquet")).exists(), "{}", part.display());
    }
    assert!(std::fs::read_dir(&dataset).unwrap().all(|e| !e
        .unwrap()
        .file_name()
        .to_string_lossy()
        .starts_with(".staging")));

    if let Some(duck) = python_counts(test, "duckdb", DUCKDB, &dataset) {
        assert_eq!(duck, expected, "DuckDB's per-host counts");
    }
    if let Some(spark) = python_counts(test, "pyspark", SPARK, &dataset) {
        assert_eq!(spark, expected, "Spark's per-host counts");
    }

    // A dataset of another schema version is refused, not mixed.
    std::fs::write(dataset.join("_virtprof_dataset.json"), "{\"schema_version\": 99}").unwrap();
    let refused = export_into(&dataset, "host-a", &files[0]);
    assert_eq!(refused.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("schema version 99"));
    let bad_host = export_into(&temp("dataset-2"), "a/b", &files[0]);
    assert_eq!(bad_host.status.code(), Some(2));
    let _ = std::fs::remove_dir_all(temp("dataset-2"));
    std::fs::remove_dir_all(&dataset).unwrap();
    for f in files {
        std::fs::remove_file(f).unwrap();
    }
}

/// The committed recording of a testvm run: exportable on any host.
fn fixture() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../session/tests/fixtures/pvm-pio-user.vprec")
}

/// `export --dataset DIR --host HOST --date DATE FIXTURE`, killed if it runs 60 s.
fn export_fixture(dataset: &Path, host: &str, date: &str) -> std::process::Output {
    let child = virtprof()
        .args(["export", "--format", "parquet", "--dataset"])
        .arg(dataset)
        .args(["--host", host, "--date", date])
        .arg(fixture())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let killer = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_secs(60));
        // SAFETY: kill on a pid we started (a no-op once it is reaped and not reused so soon).
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
    });
    let out = child.wait_with_output().unwrap();
    drop(killer);
    out
}

/// Issue 32: several exporters at once into one new folder all land, the same partition
/// exported at once by several ends as one partition, dates are real dates, and a manifest
/// or table folder that is not what it should be is refused before anything is read or
/// written through it.
#[test]
fn concurrent_exporters_all_land_and_a_tampered_dataset_is_refused() {
    // Six exporters at once load every CPU: not beside tests that time VMs or find phases.
    let _cpus = super::util::vm_lock();
    let dataset = temp("dataset-concurrent");
    let _ = std::fs::remove_dir_all(&dataset);
    let run = |hosts: Vec<String>| {
        let handles: Vec<_> = hosts
            .into_iter()
            .map(|h| {
                let dataset = dataset.clone();
                std::thread::spawn(move || (h.clone(), export_fixture(&dataset, &h, "2026-11-26")))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect::<Vec<_>>()
    };
    for (host, out) in run((0..6).map(|i| format!("host-{i}")).collect()) {
        assert!(out.status.success(), "{host}: {}", String::from_utf8_lossy(&out.stderr));
    }
    for (host, out) in run(vec!["same".to_string(); 6]) {
        assert!(out.status.success(), "{host}: {}", String::from_utf8_lossy(&out.stderr));
    }
    let hosts: Vec<String> = std::fs::read_dir(dataset.join("exits"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(hosts.len(), 7, "{hosts:?}");
    let same = dataset.join("exits/host=same/date=2026-11-26");
    assert_eq!(std::fs::read_dir(&same).unwrap().count(), 1, "one partition for the same recording");
    let leftovers: Vec<_> = std::fs::read_dir(&dataset)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".staging"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");

    for bad in ["2026-02-31", "2026-1-011", "+2026-1-01", "0000-01-01"] {
        let out = export_fixture(&dataset, "host-x", bad);
        assert_eq!(out.status.code(), Some(2), "--date {bad}");
    }

    // A manifest that is a FIFO, or a link to /dev/zero: refused at once, not read.
    let manifest = dataset.join("_virtprof_dataset.json");
    let kept = std::fs::read(&manifest).unwrap();
    std::fs::remove_file(&manifest).unwrap();
    let fifo = std::ffi::CString::new(manifest.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo with a valid C string.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    let out = export_fixture(&dataset, "host-x", "2026-11-26");
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("FIFO"));
    std::fs::remove_file(&manifest).unwrap();
    std::os::unix::fs::symlink("/dev/zero", &manifest).unwrap();
    let out = export_fixture(&dataset, "host-x", "2026-11-26");
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    std::fs::remove_file(&manifest).unwrap();
    std::fs::write(&manifest, kept).unwrap();

    // A table folder that is a symlink elsewhere: refused, and nothing there touched.
    let outside = temp("dataset-outside");
    let _ = std::fs::remove_dir_all(&outside);
    std::fs::create_dir_all(outside.join("host=host-y/date=2026-11-26/recording=keep")).unwrap();
    std::fs::rename(dataset.join("sched"), temp("dataset-sched-aside")).unwrap();
    std::os::unix::fs::symlink(&outside, dataset.join("sched")).unwrap();
    let out = export_fixture(&dataset, "host-y", "2026-11-26");
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("symbolic link"));
    assert!(outside.join("host=host-y/date=2026-11-26/recording=keep").is_dir());
    assert_eq!(std::fs::read_dir(outside.join("host=host-y/date=2026-11-26")).unwrap().count(), 1);
    std::fs::remove_dir_all(&dataset).unwrap();
    std::fs::remove_dir_all(&outside).unwrap();
    std::fs::remove_dir_all(temp("dataset-sched-aside")).unwrap();
}
