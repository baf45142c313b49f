//! `report` (text, JSON, HTML in headless Chromium) and `export --format parquet|perfetto`
//! on the shared testvm `phases` recording, checked against testvm's own counts and against
//! each other.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

use serde_json::Value;

use super::intervals::{json, phases_run, PhasesRun};
use super::util::{chromium, note, temp, virtprof, vm_lock};

/// The testvm's own count of heavyweight (userspace I/O) exits.
fn io_exits(run: &PhasesRun) -> u64 {
    run.truth.vms[0].vcpus.iter().map(|v| v.userspace_exits.get("IO").copied().unwrap_or(0)).sum()
}

/// Exits with a duration: all of them but those the trace ends inside.
fn timed_exits(report: &Value) -> u64 {
    report["exits"]["totals"]["exits"].as_u64().unwrap() - report["exits"]["totals"]["incomplete"].as_u64().unwrap()
}

#[test]
fn report_lists_top_exits_and_vcpu_accounting() {
    let Some(run) = phases_run("report_lists_top_exits_and_vcpu_accounting") else { return };
    let io = io_exits(run);
    let report = json(&["report", "--json"], &run.rec);
    let top = &report["exits"]["by_reason"][0];
    assert_eq!(top["reason"], "KVM_EXIT_IO");
    assert_eq!(top["count"].as_u64(), Some(io));
    assert_eq!(report["exits"]["totals"]["heavyweight"].as_u64(), Some(io));
    assert_eq!(report["lost_events"], 0);
    // The latency histogram holds every timed exit.
    let hist: u64 =
        report["exits"]["histograms"][0]["buckets"].as_array().unwrap().iter().map(|b| b[1].as_u64().unwrap()).sum();
    assert_eq!(hist, timed_exits(&report));
    // Accounting: the testvm's vCPU, its time split adding up, and the timeline agreeing.
    let pid = run.truth.vms[0].pid;
    let vm = report["accounting"]["vms"].as_array().unwrap().iter().find(|v| v["pid"] == pid).expect("the VM");
    let v = &vm["vcpus"][0];
    let pct = |k: &str| v[k].as_f64().unwrap();
    let sum = pct("running_pct") + pct("waiting_pct") + pct("blocked_pct") + pct("unknown_pct");
    assert!((sum - 100.0).abs() < 0.01, "{sum}");
    assert!(pct("running_pct") > 50.0, "compute phases run most of the time: {v}");
    let line = report["timeline"]["vcpus"].as_array().unwrap().iter().find(|l| l["vm"] == pid).unwrap();
    let ran_ns: f64 = line["running_pct"].as_array().unwrap().iter().map(|p| p.as_f64().unwrap()).sum::<f64>()
        * report["timeline"]["bucket_ns"].as_f64().unwrap()
        / 100.0;
    let run_ns = v["run_ns"].as_f64().unwrap();
    assert!((ran_ns - run_ns).abs() / run_ns < 1e-6, "timeline {ran_ns} vs whole run {run_ns}");

    let text = virtprof().arg("report").arg(&run.rec).output().unwrap();
    assert!(text.status.success());
    let text = String::from_utf8(text.stdout).unwrap();
    let row = text.lines().find(|l| l.starts_with("KVM_EXIT_IO")).expect("top exits table");
    assert_eq!(row.split_whitespace().nth(1), Some(io.to_string().as_str()), "{row}");
    for section in ["lost events: 0", "vCPU accounting over the run", "phases:", "most correlated metrics"] {
        assert!(text.contains(section), "no '{section}' in:\n{text}");
    }
}

#[test]
fn report_html_renders_every_chart_in_headless_chromium() {
    let test = "report_html_renders_every_chart_in_headless_chromium";
    let Some(run) = phases_run(test) else { return };
    let Some(browser) = chromium() else {
        note(test, "SKIP: no Chromium (apt-get install chromium; scripts/test.sh does)");
        return;
    };
    let html = Path::new(env!("CARGO_TARGET_TMPDIR")).join("report.html");
    let out = virtprof().arg("report").arg(&run.rec).arg("--html").arg(&html).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(!page.contains("<script src") && !page.contains("<link"), "self-contained: nothing loaded from elsewhere");

    // Chromium is CPU-hungry: keep it off the VM tests' timing.
    let _vms = vm_lock();
    let headless = |extra: &[&str]| {
        Command::new(browser)
            .args(["--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=5000"])
            .args(extra)
            .arg(format!("file://{}", html.display()))
            .output()
            .unwrap()
    };
    let dom = headless(&["--dump-dom"]);
    assert!(dom.status.success(), "{}", String::from_utf8_lossy(&dom.stderr));
    let dom = String::from_utf8_lossy(&dom.stdout);
    let body = dom.split("<body").nth(1).and_then(|b| b.split('>').next()).expect("a <body> tag");
    assert!(body.contains("data-ready=\"ok\""), "the page reported errors: {body}\n{dom}");
    // One chart per exit histogram, per vCPU timeline and per metric series.
    let report = json(&["report", "--json"], &run.rec);
    let len = |v: &Value| v.as_array().map_or(0, Vec::len);
    let expected = len(&report["exits"]["histograms"])
        + len(&report["timeline"]["vcpus"])
        + len(&report["intervals"]["series"]["metrics"]);
    assert!(expected >= 3);
    assert!(body.contains(&format!("data-charts=\"{expected}\"")), "expected {expected} charts: {body}");
    assert_eq!(dom.matches("class=\"uplot").count(), expected, "uPlot canvases");
    assert!(dom.contains("class=\"heat\""), "correlation heatmap");
    assert!(dom.contains("class=\"phases\""), "phase timeline");

    let shot = Path::new(env!("CARGO_TARGET_TMPDIR")).join("report.png");
    let out = headless(&["--window-size=1280,4000", &format!("--screenshot={}", shot.display())]);
    assert!(out.status.success());
    assert!(std::fs::metadata(&shot).unwrap().len() > 10_000);
    eprintln!("report_html: page {} and screenshot {}", html.display(), shot.display());
}

/// Python with pyarrow, if installed.
fn have_pyarrow(test: &str) -> bool {
    let ok = Command::new("python3").args(["-c", "import pyarrow.parquet"]).output().is_ok_and(|o| o.status.success());
    if !ok {
        note(test, "SKIP: python3 with pyarrow is missing (pip install pyarrow; scripts/test.sh does)");
    }
    ok
}

#[test]
fn parquet_tables_load_in_pyarrow_with_the_recorded_counts() {
    let test = "parquet_tables_load_in_pyarrow_with_the_recorded_counts";
    let Some(run) = phases_run(test) else { return };
    if !have_pyarrow(test) {
        return;
    }
    let dir = temp("parquet");
    let out = virtprof().arg("export").arg(&run.rec).args(["--format", "parquet", "-o"]).arg(&dir).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let script = r#"
import json, sys, collections
import pyarrow.parquet as pq
d = sys.argv[1]
ev = pq.read_table(d + "/events.parquet").to_pydict()
ex = pq.read_table(d + "/exits.parquet").to_pydict()
iv = pq.read_table(d + "/intervals.parquet").to_pydict()
sums = collections.defaultdict(float)
for e, m, v in zip(iv["entity"], iv["metric"], iv["value"]):
    if v is not None:
        sums[e + " " + m] += v
print(json.dumps({
    "events": len(ev["ts_ns"]),
    "by_event": collections.Counter(ev["event"]),
    "ordered": all(a <= b for a, b in zip(ev["ts_ns"], ev["ts_ns"][1:])),
    "exits": len(ex["tid"]),
    "exit_reasons": collections.Counter(ex["reason"]),
    "exit_ns": sum(ex["duration_ns"]),
    "sums": sums,
}))
"#;
    let py = Command::new("python3").args(["-c", script]).arg(&dir).output().unwrap();
    assert!(py.status.success(), "{}", String::from_utf8_lossy(&py.stderr));
    let got: Value = serde_json::from_slice(&py.stdout).unwrap();
    let report = json(&["report", "--json"], &run.rec);
    let io = io_exits(run);
    assert_eq!(got["events"], report["events"]);
    assert_eq!(got["ordered"], true);
    assert_eq!(got["by_event"]["kvm_userspace_exit"].as_u64(), Some(io));
    assert_eq!(got["exits"].as_u64(), Some(timed_exits(&report)));
    assert_eq!(got["exit_reasons"]["KVM_EXIT_IO"].as_u64(), Some(timed_exits(&report)));
    assert_eq!(got["exit_ns"], report["exits"]["by_reason"][0]["total_ns"]);
    let vm = format!("vm{}", run.truth.vms[0].pid);
    let iterations: u64 = run.truth.vms[0].vcpus.iter().map(|v| v.iterations).sum();
    assert_eq!(got["sums"][format!("{vm} app.iterations")].as_f64(), Some(iterations as f64));
    assert_eq!(got["sums"][format!("{vm} trace.userspace_exit.KVM_EXIT_IO")].as_f64(), Some(io as f64));
    let _ = std::fs::remove_dir_all(dir);
}

/// A slice on a track: start and duration in µs, and its name.
type Slice = (f64, f64, String);

#[test]
fn perfetto_trace_has_valid_vcpu_state_exit_and_counter_tracks() {
    let Some(run) = phases_run("perfetto_trace_has_valid_vcpu_state_exit_and_counter_tracks") else { return };
    let out = virtprof().arg("export").arg(&run.rec).args(["--format", "perfetto"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let trace: Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    let events = trace["traceEvents"].as_array().expect("traceEvents[]");
    let report = json(&["report", "--json"], &run.rec);

    // Schema: every event has the fields its phase requires, with the right types.
    let mut named_tracks = std::collections::HashSet::new();
    let mut slices: HashMap<(u64, u64), Vec<Slice>> = HashMap::new();
    let mut counters = 0;
    for e in events {
        let (pid, tid) = (e["pid"].as_u64().expect("pid"), e["tid"].as_u64().expect("tid"));
        let name = e["name"].as_str().expect("name").to_string();
        match e["ph"].as_str().expect("ph") {
            "M" => {
                assert!(["process_name", "thread_name", "thread_sort_index"].contains(&name.as_str()), "{e}");
                if name == "thread_name" {
                    named_tracks.insert((pid, tid));
                }
            }
            "X" => {
                let (ts, dur) = (e["ts"].as_f64().expect("ts"), e["dur"].as_f64().expect("dur"));
                assert!(ts >= 0.0 && dur >= 0.0, "{e}");
                assert!(["state", "exit"].contains(&e["cat"].as_str().unwrap()), "{e}");
                slices.entry((pid, tid)).or_default().push((ts, dur, name));
            }
            "C" => {
                assert!(e["ts"].as_f64().unwrap() >= 0.0);
                assert!(e["args"]["value"].as_f64().expect("a numeric counter value").is_finite());
                counters += 1;
            }
            other => panic!("unexpected phase {other}: {e}"),
        }
    }
    assert!(counters > 0, "counter tracks from the interval rows");
    // Slices on one track never overlap (the format draws overlapping ones wrongly).
    for (track, list) in &mut slices {
        assert!(named_tracks.contains(track), "track {track:?} has a name");
        list.sort_by(|a, b| a.0.total_cmp(&b.0));
        for w in list.windows(2) {
            assert!(w[0].0 + w[0].1 <= w[1].0 + 1e-3, "overlap on {track:?}: {w:?}");
        }
    }
    // The vCPU's tracks: one exit slice per timed exit, and state time matching the accounting.
    let pid = u64::from(run.truth.vms[0].pid);
    let tid = report["timeline"]["vcpus"].as_array().unwrap().iter().find(|l| l["vm"] == pid).unwrap()["tid"]
        .as_u64()
        .unwrap();
    let exits = &slices[&(pid, (1u64 << 32) + tid)];
    assert_eq!(exits.len() as u64, timed_exits(&report));
    assert!(exits.iter().all(|s| s.2 == "KVM_EXIT_IO"));
    let state_us = |state: &str| slices[&(pid, tid)].iter().filter(|s| s.2 == state).map(|s| s.1).sum::<f64>();
    let acc = &report["accounting"]["vms"].as_array().unwrap().iter().find(|v| v["pid"] == pid).unwrap()["vcpus"][0];
    // The state track is the accounting's own slices: the same totals, to rounding.
    for (state, key) in [("running", "run_ns"), ("waiting", "wait_ns"), ("blocked", "blocked_ns")] {
        let (track, whole) = (state_us(state) * 1000.0, acc[key].as_f64().unwrap());
        assert!((track - whole).abs() <= 1000.0, "{state}: track {track} ns vs accounting {whole} ns");
    }
}
