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
