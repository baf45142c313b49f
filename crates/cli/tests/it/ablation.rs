//! Issue 55's ablation: one deterministic testvm run recorded at once by nested `virtprof
//! record`s (each makes its own tracefs instance, so all see the same VM run), each with one
//! class of events left out, and by `perf record` and trace-cmd with subsets. Every command
//! that reads recordings runs on each: every figure equals the full recording's (and the
//! run's ground truth) within its tolerance, or is unknown — never a number made up from
//! events the source does not hold.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use super::util::{have_kvm, have_tracefs, note, parse_report, temp, virtprof};

const TEST: &str = "every_figure_is_the_full_recordings_or_unknown_with_any_event_class_left_out";

/// The kvm events this kernel has, as `kvm:NAME`, but those in `without`.
fn kvm_events_but(without: &[&str]) -> String {
    let mut names: Vec<String> = std::fs::read_dir("/sys/kernel/tracing/events/kvm")
        .map(|dir| dir.flatten().filter(|e| e.path().is_dir()).map(|e| e.file_name().to_string_lossy().into_owned()))
        .into_iter()
        .flatten()
        .filter(|name| !without.contains(&name.as_str()))
        .map(|name| format!("kvm:{name}"))
        .collect();
    names.sort();
    names.join(",")
}

/// One source made of the run: its name and the events it was told to keep.
struct Variant {
    name: &'static str,
    events: String,
    /// More `record` options.
    options: &'static [&'static str],
}

fn variants() -> Vec<Variant> {
    let sched = "sched:sched_switch,sched:sched_wakeup,sched:sched_migrate_task";
    let evidence = ["kvm_cpuid", "kvm_msr", "kvm_hypercall", "kvm_hv_hypercall", "kvm_cr", "kvm_xsetbv"];
    vec![
        Variant { name: "full", events: format!("kvm,{sched},irq,irq_vectors"), options: &[] },
        Variant { name: "no-kvm-stats", events: format!("kvm,{sched},irq,irq_vectors"), options: &["--no-kvm-stats"] },
        Variant { name: "no-sched", events: "kvm,irq,irq_vectors".into(), options: &[] },
        Variant {
            name: "no-wakeup",
            events: "kvm,sched:sched_switch,sched:sched_migrate_task,irq,irq_vectors".into(),
            options: &[],
        },
        Variant {
            name: "no-userspace-exit",
            events: format!("{},{sched},irq,irq_vectors", kvm_events_but(&["kvm_userspace_exit"])),
            options: &[],
        },
        Variant {
            name: "no-exit-entry",
            events: format!("{},{sched},irq,irq_vectors", kvm_events_but(&["kvm_exit", "kvm_entry"])),
            options: &[],
        },
        Variant { name: "no-irq", events: format!("kvm,{sched}"), options: &[] },
        Variant {
            name: "no-evidence",
            events: format!("{},{sched},irq,irq_vectors", kvm_events_but(&evidence)),
            options: &[],
        },
    ]
}

/// How far a figure may be from the full recording's. The recordings see the same events of
/// the VM's threads; what differs is where each starts and stops, which moves a thread's
/// first and last states by up to a few ms.
fn within(key: &str, full: f64, part: f64) -> bool {
    let slack = if key.ends_with("_pct") {
        1.0
    } else if key.ends_with("_ns") {
        2e6
    } else if key.ends_with("_us") {
        0.05 * full.abs() + 20.0
    } else {
        2.0
    };
    (full - part).abs() <= slack + 0.02 * full.abs()
}

/// Keys whose value depends on the recording's own window or on the events it holds rather
/// than on the VM's run: not figures of the VM.
const NOT_FIGURES: &[&str] = &[
    "source",
    "loss",
    "lost_events",
    "lost_events_text",
    "unavailable",
    "clock",
    "events",
    "seconds",
    "start_ns",
    "end_ns",
    "exits_per_s",
    "per_s",
    "execs_per_s",
    "cpus",
    "recording",
    "origin",
    "host",
    "duration_s",
    "truncated_at",
    "timeline",
    "intervals",
    "label",
    "exits_source",
    "kvm_stats",
    "kvm_stats_exits_per_s",
    "unknown_pct",
    "inferred_exec_count",
    "wait_max_us",
    "alloc_min_us",
    "alloc_max_us",
    // Distributions: their sums and quantiles are compared in the reason rows.
    "histograms",
    // How many exits the source could not time: what it holds, not the VM's.
    "unfinished",
    "incomplete",
];

/// perf's own recording misses some sched_switch events of the run with no loss record
/// (`perf script` shows a thread switched in twice with no switch out between; `perf report
/// --stats` counts no lost events): the thread's state is unknown across each hole, which
/// changes the shares of its observed time and its waits. Printed, not compared; its run
/// and blocked time and executions are.
const PERF_WAITS: &[&str] = &["wait_ns", "waiting_pct", "wait_per_exec_us", "running_pct", "blocked_pct"];

/// The key rows of an array are matched by.
const ROW_KEYS: &[&str] = &["exit_ts", "tid", "reason", "vm", "pid", "role", "name"];

/// Every figure of `part` equals `full`'s within tolerance, or is null; a figure `part` knows
/// that `full` (holding more) does not is an error too. Rows are matched by their key.
fn agree(path: &str, full: &Value, part: &Value, errors: &mut Vec<String>) {
    match (full, part) {
        (_, Value::Null) => {}
        (Value::Number(f), Value::Number(p)) => {
            let (f, p) = (f.as_f64().unwrap(), p.as_f64().unwrap());
            let key = path.rsplit('.').next().unwrap_or(path);
            if !within(key, f, p) {
                errors.push(format!("{path}: {p} where the full recording has {f}"));
            }
        }
        (Value::Null, Value::Number(p)) => errors.push(format!("{path}: {p} where the full recording has none")),
        (Value::Object(f), Value::Object(p)) => {
            for (key, value) in p {
                if NOT_FIGURES.contains(&key.as_str()) {
                    continue;
                }
                match f.get(key) {
                    Some(fv) => agree(&format!("{path}.{key}"), fv, value, errors),
                    None if value.is_number() => errors.push(format!("{path}.{key}: only in the part")),
                    None => {}
                }
            }
        }
        (Value::Array(f), Value::Array(p)) => {
            let key = p.first().and_then(|row| ROW_KEYS.iter().find(|k| row.get(**k).is_some()));
            match key {
                Some(key) => {
                    let full_rows: BTreeMap<String, &Value> = f.iter().map(|r| (r[*key].to_string(), r)).collect();
                    for row in p {
                        let id = row[*key].to_string();
                        // A row the full recording has not: another name for the same
                        // exits (evidence without its userspace exit), checked by totals.
                        if let Some(full_row) = full_rows.get(&id) {
                            agree(&format!("{path}[{key}={id}]"), full_row, row, errors);
                        }
                    }
                }
                None if f.len() == p.len() => {
                    for (i, (fv, pv)) in f.iter().zip(p).enumerate() {
                        agree(&format!("{path}[{i}]"), fv, pv, errors);
                    }
                }
                None => {}
            }
        }
        _ => {}
    }
}

fn json(args: &[&str], file: &Path) -> Value {
    let out = virtprof().args(args).arg(file).arg("--json").output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{args:?} {}: {stderr}", file.display());
    assert!(!stderr.contains("panicked"), "{stderr}");
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

/// The figures every reading command gives of `file`, by command.
fn figures(file: &Path) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    for by in ["reason", "vcpu", "vm"] {
        out.insert(format!("exits --by {by}"), json(&["exits", "--by", by], file));
    }
    out.insert("exits --threshold-us 300".into(), json(&["exits", "--threshold-us", "300"], file));
    out.insert("sched".into(), json(&["sched"], file));
    let report = json(&["report"], file);
    out.insert("report".into(), serde_json::json!({ "exits": report["exits"], "accounting": report["accounting"] }));
    out
}

/// Where a source lacks the evidence, the figure must be unknown: (command, JSON pointer of
/// the figure in its output, the variants where it is unknown).
fn must_be_unknown(variant: &str, figures: &BTreeMap<String, Value>, no_exit_events: bool, errors: &mut Vec<String>) {
    let vcpu = |f: &Value| f["windows"][0]["vms"][0]["vcpus"][0].clone();
    let sched = vcpu(&figures["sched"]);
    let reasons = figures["exits --by reason"]["by_reason"].as_array().cloned().unwrap_or_default();
    let rows = figures["exits --threshold-us 300"]["rows"].as_array().cloned().unwrap_or_default();
    let mut known = Vec::new();
    let mut expect = |what: &str, value: &Value| {
        if !value.is_null() {
            known.push(format!("{variant}: {what} is {value}, where the events it needs were left out"));
        }
    };
    match variant {
        "no-sched" => {
            for figure in ["running_pct", "waiting_pct", "blocked_pct", "exec_count", "run_ns"] {
                expect(&format!("sched {figure}"), &sched[figure]);
            }
            reasons.iter().for_each(|r| expect(&format!("{} descheduled", r["reason"]), &r["descheduled"]));
            rows.iter().for_each(|r| expect("a row's threads", &r["threads"]));
        }
        "no-wakeup" => {
            for figure in ["waiting_pct", "blocked_pct", "wait_ns", "blocked_ns"] {
                expect(&format!("sched {figure}"), &sched[figure]);
            }
        }
        "no-userspace-exit" => {
            for r in &reasons {
                expect(&format!("{} lightweight", r["reason"]), &r["lightweight"]);
                expect(&format!("{} heavyweight", r["reason"]), &r["heavyweight"]);
                if r["reason"].as_str().is_some_and(|n| n.contains("in kernel")) {
                    expect(&format!("{}'s name", r["reason"]), &Value::Bool(true));
                }
            }
            expect("sched exits_per_s", &sched["exits_per_s"]);
        }
        // Where the host emits no kvm_exit, lightweight exits are KVM's count less the
        // userspace ones: without the stats snapshots, unknown.
        "no-kvm-stats" if no_exit_events => {
            expect("lightweight exits", &figures["exits --by reason"]["totals"]["lightweight"]);
        }
        "no-irq" => {
            for r in &rows {
                expect("a row's irqs", &r["irqs"]);
                expect("a row's softirqs", &r["softirqs"]);
            }
        }
        _ => {}
    }
    errors.extend(known);
}

/// The exits each variant counts: every one of the VMM's userspace exits where those were
/// recorded, else every access the kernel traced (kvm_pio: the same exits).
fn check_counts(variant: &str, figures: &BTreeMap<String, Value>, io_exits: u64, errors: &mut Vec<String>) {
    let exits = figures["exits --by reason"]["totals"]["exits"].as_u64();
    if exits != Some(io_exits) {
        errors.push(format!("{variant}: {exits:?} exits where the VMM handled {io_exits}"));
    }
    let io = figures["sched"]["windows"][0]["vms"][0]["vcpus"][0]["io_count"].as_u64();
    if io.is_some_and(|io| io != io_exits) {
        errors.push(format!("{variant}: sched's I/O count {io:?}, where the VMM handled {io_exits}"));
    }
}

#[test]
fn every_figure_is_the_full_recordings_or_unknown_with_any_event_class_left_out() {
    if !have_tracefs(TEST) {
        return;
    }
    let Some(_vms) = have_kvm(TEST) else { return };
    let dir = temp("ablation");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let exe = assert_cmd::cargo::cargo_bin("virtprof");
    let variants = variants();
    // record full -- record no-sched -- ... -- testvm: one run, seen by every recording.
    let mut command = Command::new(&exe);
    let mut args: Vec<String> = Vec::new();
    for (i, v) in variants.iter().enumerate() {
        if i > 0 {
            args.push(exe.display().to_string());
        }
        let file = dir.join(format!("{}.vprec", v.name));
        args.extend(
            ["record", "-o", file.to_str().unwrap(), "--events", &v.events, "--interval", "10ms"].map(String::from),
        );
        args.extend(v.options.iter().map(|o| o.to_string()));
        args.extend(["--buffer-size", "16384", "--"].map(String::from));
    }
    // perf's own recording of the same run, with the kvm and sched events only (no irq).
    let perf_data = dir.join("perf.data");
    let perf = Command::new("perf").arg("--version").output().is_ok_and(|o| o.status.success());
    if perf {
        args.extend(["perf", "record", "-q", "-a", "-o", perf_data.to_str().unwrap()].map(String::from));
        args.extend(
            ["-e", "kvm:kvm_userspace_exit", "-e", "kvm:kvm_pio", "-e", "kvm:kvm_entry", "-e", "kvm:kvm_exit"]
                .map(String::from),
        );
        args.extend(["-e", "sched:sched_switch", "-e", "sched:sched_wakeup", "--"].map(String::from));
    } else {
        note(TEST, "perf is missing: no perf.data variant");
    }
    // `perf kvm stat record`'s own event set (kvm only).
    let kvm_stat = dir.join("kvm-stat.data");
    if perf {
        args.extend(
            ["perf", "kvm", "stat", "record", "-q", "-a", "-o", kvm_stat.to_str().unwrap(), "--"].map(String::from),
        );
    }
    // trace-cmd's trace.dat of the same run: userspace exits and sched_switch only.
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let trace_dat = dir.join("trace-cmd.dat");
    let trace_cmd = workspace.join("target/trace-cmd-trixie");
    if trace_cmd.join("root/usr/bin/trace-cmd").exists() {
        args.extend(["bash", workspace.join("scripts/trace-cmd/record.sh").to_str().unwrap()].map(String::from));
        args.extend([trace_cmd.to_str().unwrap(), trace_dat.to_str().unwrap()].map(String::from));
        args.extend(
            ["-e", "kvm:kvm_userspace_exit", "-e", "kvm:kvm_pio", "-e", "sched:sched_switch", "--"].map(String::from),
        );
    } else {
        note(TEST, "no target/trace-cmd-trixie (scripts/trace-cmd/fetch.sh): no trace.dat variant");
    }

    let workload =
        ["testvm", "-w", "phases", "--phases", "pio-user:3000,io-bound:100", "--io-latency", "1ms", "--json"];
    args.push(exe.display().to_string());
    args.extend(workload.map(String::from));
    let out = command.args(&args).output().unwrap();
    let truth = parse_report(&out, &workload);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let vcpu = &truth.vms[0].vcpus[0];
    let io_exits = vcpu.exits("IO");
    assert!(io_exits > 3000, "{io_exits}");
    for v in &variants {
        assert!(
            stderr.contains(&format!("into {}.vprec; lost events: 0", v.name)) || stderr.contains(v.name),
            "{stderr}"
        );
    }

    let mut sources: Vec<(String, PathBuf)> =
        variants.iter().map(|v| (v.name.to_string(), dir.join(format!("{}.vprec", v.name)))).collect();
    for (name, file) in [("perf.data", &perf_data), ("perf kvm stat", &kvm_stat), ("trace.dat", &trace_dat)] {
        if file.exists() {
            sources.push((name.into(), file.clone()));
        }
    }
    let all: Vec<(String, BTreeMap<String, Value>)> =
        sources.iter().map(|(name, file)| (name.clone(), figures(file))).collect();
    let full = &all[0].1;
    let mut errors = Vec::new();

    // The full recording against the run's ground truth: the VMM's exits, the thread's
    // schedstat run time.
    check_counts("full", full, io_exits, &mut errors);
    // Where the host emits no kvm_exit, lightweight exits are the KVM stats' exits less the
    // userspace ones: the stats fds held through the run (the VM began and ended within it).
    let no_exit_events =
        full["exits --by reason"]["source"]["unavailable"].to_string().contains("never emits kvm_exit");
    if no_exit_events {
        let light = full["exits --by reason"]["totals"]["lightweight"].as_u64();
        let truth = vcpu.stat("exits") - vcpu.exits("IO");
        if light != Some(truth) {
            errors.push(format!("full: {light:?} lightweight exits, where KVM's stats count {truth}"));
        }
    }
    let full_vcpu = &full["sched"]["windows"][0]["vms"][0]["vcpus"][0];
    let run_ns = full_vcpu["run_ns"].as_f64().unwrap();
    let truth_run = vcpu.run_ns as f64;
    assert!((run_ns - truth_run).abs() <= 0.05 * truth_run + 5e6, "full run_ns {run_ns}, schedstat {truth_run}");

    for (name, figures) in &all[1..] {
        check_counts(name, figures, io_exits, &mut errors);
        must_be_unknown(name, figures, no_exit_events, &mut errors);
        for (command, value) in figures {
            let mut found = Vec::new();
            agree(&format!("{name}: {command}"), &full[command], value, &mut found);
            let (waits, others): (Vec<String>, Vec<String>) = found
                .into_iter()
                .partition(|e| name == "perf.data" && PERF_WAITS.iter().any(|w| e.contains(&format!(".{w}:"))));
            waits.iter().for_each(|w| println!("perf.data (events missing in perf's own file): {w}"));
            errors.extend(others);
        }
        println!("{name}: {} exits", figures["exits --by reason"]["totals"]["exits"]);
    }

    // The commands whose outputs are files or pages: each source is read, every export made.
    for (name, file) in &sources {
        for format in ["perfetto", "parquet", "csv"] {
            let target = dir.join(format!("{name}.{format}"));
            let out =
                virtprof().args(["export", "--format", format]).arg(file).arg("-o").arg(&target).output().unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            // csv is of interval rows: a file with none (perf.data) is refused, and says why.
            let refused = out.status.code() == Some(2) && stderr.contains("has no interval rows");
            if !(out.status.success() || (format == "csv" && refused)) {
                errors.push(format!("{name}: export {format}: {stderr}"));
            }
        }
        let states = perfetto_states(&dir.join(format!("{name}.perfetto")));
        let has_switch = !matches!(name.as_str(), "no-sched" | "perf kvm stat");
        if has_switch != (states > 0) {
            errors.push(format!("{name}: {states} Perfetto state slices (sched_switch recorded: {has_switch})"));
        }
        let html = dir.join(format!("{name}.html"));
        let out = virtprof().arg("report").arg(file).arg("--html").arg(&html).output().unwrap();
        if !out.status.success() {
            errors.push(format!("{name}: report --html: {}", String::from_utf8_lossy(&out.stderr)));
        }
        // Refusals that say what the file lacks are unknowns, as the rule wants. A recording
        // whose VM started while its scans for new VMs were backed off (the recorders started
        // first see the others' burst of new pids; docs/intervals.md) has interval rows but
        // none of the VM's: `balance --replay` says it has no vCPU run times.
        for (args, refusals) in [
            (vec!["balance", "--replay"], &["interval rows", "has no vCPU run times"][..]),
            (vec!["boot", "--recording"], &["kvm_exit"][..]),
        ] {
            let out = virtprof().args(&args).arg(file).output().unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            let clear_refusal = out.status.code() == Some(2) && refusals.iter().any(|r| stderr.contains(r));
            if !(out.status.success() || clear_refusal) || stderr.contains("panicked") {
                errors.push(format!("{name}: {args:?}: exit {:?}: {stderr}", out.status.code()));
            }
        }
        let out = virtprof().arg("compare").arg(&sources[0].1).arg(file).arg("--json").output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        if !(out.status.success() || (out.status.code() == Some(2) && stderr.contains("interval rows"))) {
            errors.push(format!("{name}: compare: {stderr}"));
        }
    }
    parquet_agrees(&dir, &sources, &mut errors);
    assert!(errors.is_empty(), "{} disagreements:\n{}", errors.len(), errors.join("\n"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Slices on the Perfetto state tracks (running / waiting / blocked).
fn perfetto_states(file: &Path) -> usize {
    let Ok(bytes) = std::fs::read(file) else { return 0 };
    let trace: Value = serde_json::from_slice(&bytes).unwrap();
    trace["traceEvents"].as_array().unwrap().iter().filter(|e| e["cat"] == "state" && e["ph"] == "X").count()
}

/// sched.parquet of each source against the full recording's: run, wait, blocked, executions,
/// exits and I/O per vCPU equal within tolerance, or null.
fn parquet_agrees(dir: &Path, sources: &[(String, PathBuf)], errors: &mut Vec<String>) {
    let script = "import json, sys, pyarrow.parquet as pq\n\
                  rows = pq.read_table(sys.argv[1] + '/sched.parquet').to_pylist()\n\
                  print(json.dumps({str(r['tid']): r for r in rows}))";
    let read = |name: &str| -> Option<Value> {
        let out =
            Command::new("python3").args(["-c", script]).arg(dir.join(format!("{name}.parquet"))).output().ok()?;
        out.status.success().then(|| serde_json::from_slice(&out.stdout).ok()).flatten()
    };
    let Some(full) = read(&sources[0].0) else {
        note(TEST, "pyarrow is missing (or sched.parquet unreadable): the Parquet export is not compared");
        return;
    };
    for (name, _) in &sources[1..] {
        match read(name) {
            Some(part) => {
                let mut found = Vec::new();
                agree(&format!("{name}: sched.parquet"), &full, &part, &mut found);
                // perf's own file: see PERF_WAITS.
                found.retain(|e| !(name == "perf.data" && e.contains(".wait_ns:")));
                errors.extend(found);
            }
            None => errors.push(format!("{name}: sched.parquet is not readable")),
        }
    }
}

/// The same for `noise --host-recording`: one pinned `testvm -w noise` run recorded at once
/// with all events, without sched and without irq. The guest's own figures are the run's; the
/// host's steal needs sched_switch, and the share the host explains needs every class that
/// explains noise: without them they are unknown, never a smaller number (without irq events,
/// 64.8 % explained read as 3.2 %).
#[test]
fn noise_explained_by_a_recording_is_the_full_ones_or_unknown() {
    let test = "noise_explained_by_a_recording_is_the_full_ones_or_unknown";
    if !have_tracefs(test) {
        return;
    }
    let Some(_vms) = have_kvm(test) else { return };
    let dir = temp("ablation-noise");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let exe = assert_cmd::cargo::cargo_bin("virtprof");
    let sched = "sched:sched_switch,sched:sched_wakeup,sched:sched_migrate_task";
    let variants = [
        ("full", format!("kvm,{sched},irq,irq_vectors")),
        ("no-sched", "kvm,irq,irq_vectors".to_string()),
        ("no-irq", format!("kvm,{sched}")),
    ];
    let mut command = Command::new(&exe);
    for (i, (name, events)) in variants.iter().enumerate() {
        if i > 0 {
            command.arg(&exe);
        }
        command.args(["record", "-o"]).arg(dir.join(format!("{name}.vprec"))).args(["--events", events, "--"]);
    }
    let cpu = if std::thread::available_parallelism().map_or(1, |n| n.get()) > 1 { "1" } else { "0" };
    let workload = ["testvm", "-w", "noise", "--pin", cpu, "-d", "1s", "--json"];
    let out = command.arg(&exe).args(workload).output().unwrap();
    let report = dir.join("guest.json");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    std::fs::write(&report, &out.stdout).unwrap();
    let noise = |name: &str| -> Value {
        let file = dir.join(format!("{name}.vprec"));
        let out = virtprof()
            .args(["noise", "--host-recording"])
            .arg(&file)
            .arg("--guest")
            .arg(&report)
            .arg("--json")
            .output()
            .unwrap();
        assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let full = noise("full");
    assert!(full["explained_pct"].is_number() && full["host_steal_ns"].is_number(), "{full}");
    let mut errors = Vec::new();
    for (name, _) in &variants[1..] {
        let part = noise(name);
        for figure in ["guest", "schedstat_wait_ns", "host_steal_ns", "explained_pct"] {
            agree(&format!("{name}: noise.{figure}"), &full[figure], &part[figure], &mut errors);
        }
        let expect_unknown: &[&str] = match *name {
            "no-sched" => &["host_steal_ns", "explained_pct"],
            _ => &["explained_pct"],
        };
        for figure in expect_unknown {
            if !part[*figure].is_null() {
                errors.push(format!("{name}: noise {figure} is {}, where its events were left out", part[*figure]));
            }
        }
        if part["unavailable"].as_array().is_none_or(Vec::is_empty) {
            errors.push(format!("{name}: noise says nothing is unavailable"));
        }
    }
    assert!(errors.is_empty(), "{}", errors.join("\n"));
    let _ = std::fs::remove_dir_all(&dir);
}
