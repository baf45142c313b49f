//! perf.data as `perf record -e 'kvm:*'` writes it on this host: read directly by `exits` and
//! `import`, checked against perf's own reading of the same file (`perf script`, `perf report
//! -D`) and testvm's ground truth.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use super::exits::exits_json;
use super::util::{have_kvm, have_perf, have_tracefs, parse_report, temp, virtprof};

/// Events per name in `perf script` (`sys:name:` fields).
fn perf_script_counts(file: &Path) -> BTreeMap<String, u64> {
    let out = Command::new("perf").args(["script", "-i"]).arg(file).output().unwrap();
    assert!(out.status.success(), "perf script: {}", String::from_utf8_lossy(&out.stderr));
    let mut counts = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some(word) = line.split_whitespace().find(|w| w.ends_with(':') && w.matches(':').count() == 2) else {
            continue;
        };
        let name = word.trim_end_matches(':').split(':').nth(1).unwrap().to_string();
        *counts.entry(name).or_insert(0) += 1;
    }
    counts
}

/// Lost samples per CPU as perf reads its LOST records (`perf report -D`).
/// What perf says each CPU lost: its LOST records, or, where more, the end-of-run counters
/// (LOST_SAMPLES, per event) of that CPU's events, each placed by perf's own ID_INDEX; a
/// CPU's LOST records count all its events' losses in its one buffer, but losses after the
/// last record reach only the counters.
fn perf_lost_per_cpu(file: &Path) -> BTreeMap<String, u64> {
    let out = Command::new("perf").args(["report", "-D", "-i"]).arg(file).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |line: &str, key: &str| -> Option<u64> {
        let rest = &line[line.find(key)? + key.len()..];
        rest.trim_start().split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
    };
    let mut records: BTreeMap<u64, u64> = BTreeMap::new();
    let mut id_cpu: BTreeMap<u64, u64> = BTreeMap::new();
    let mut counters: BTreeMap<u64, u64> = BTreeMap::new();
    for line in text.lines() {
        if line.contains("PERF_RECORD_LOST: ") {
            let cpu: u64 = line.split_whitespace().next().unwrap().parse().unwrap();
            *records.entry(cpu).or_insert(0) += field(line, "lost:").unwrap();
        } else if line.contains(" idx: ") {
            id_cpu.insert(field(line, "id:").unwrap(), field(line, "cpu:").unwrap());
        } else if line.contains("PERF_RECORD_LOST_SAMPLES: ") {
            let cpu = id_cpu[&field(line, "id:").unwrap()];
            *counters.entry(cpu).or_insert(0) += field(line, "lost samples :").unwrap();
        }
    }
    for (cpu, n) in counters {
        let recorded = records.entry(cpu).or_insert(0);
        *recorded = (*recorded).max(n);
    }
    records.into_iter().filter(|(_, n)| *n > 0).map(|(cpu, n)| (format!("cpu{cpu}"), n)).collect()
}

fn perf_record(file: &Path, perf_args: &[&str], testvm: &[&str]) -> std::process::Output {
    let exe = assert_cmd::cargo::cargo_bin("virtprof");
    Command::new("perf")
        .arg("record")
        .args(perf_args)
        .arg("-o")
        .arg(file)
        .arg("--")
        .arg(exe)
        .arg("testvm")
        .args(testvm)
        .output()
        .unwrap()
}

/// Two testvm VMs of two vCPUs under `perf record -e 'kvm:*' -e sched -a`: every kvm event
/// perf script reads, virtprof reads; each vCPU's port writes are its iterations plus the
/// markers; the VMs are the two VMM processes (perf's COMM records name them); cut short,
/// the file is bad input.
#[test]
fn perf_record_of_kvm_tracepoints_reads_as_perf_reads_it() {
    let test = "perf_record_of_kvm_tracepoints_reads_as_perf_reads_it";
    if !have_perf(test) || !have_tracefs(test) {
        return;
    }
    let Some(_vms) = have_kvm(test) else { return };
    let file = temp("perf-kvm.data");
    let args = ["-w", "pio-user", "--vms", "2", "--vcpus", "2", "-n", "300", "--json"];
    let out = perf_record(&file, &["-e", "kvm:*", "-e", "sched:sched_switch", "-e", "sched:sched_wakeup", "-a"], &args);
    let truth = parse_report(&out, &args);
    let theirs = perf_script_counts(&file);
    let r = exits_json(&file, &[]);
    for event in ["kvm_userspace_exit", "kvm_pio", "kvm_fpu", "kvm_emulate_insn"] {
        assert_eq!(r["source"]["events"][event].as_u64(), theirs.get(event).copied(), "{event}");
    }
    let per_vcpu = 300 + truth.marker_io_exits_per_vcpu;
    for vm in &truth.vms {
        for vcpu in &vm.vcpus {
            let row = r["by_vcpu"].as_array().unwrap().iter().find(|v| v["tid"] == vcpu.tid).expect("each vCPU");
            assert_eq!(row["heavyweight"].as_u64(), Some(per_vcpu), "vCPU thread {}", vcpu.tid);
        }
        let by_vm = r["by_vm"].as_array().unwrap();
        let row = by_vm.iter().find(|v| v["pid"] == vm.pid).unwrap_or_else(|| panic!("VM {} in {by_vm:?}", vm.pid));
        assert_eq!((row["vcpus"].as_u64(), row["grouped_by"].as_str()), (Some(2), Some("process")));
    }
    let report = virtprof().args(["report", "--json"]).arg(&file).output().unwrap();
    let report: serde_json::Value = serde_json::from_slice(&report.stdout).unwrap();
    assert_eq!(report["events"].as_u64(), Some(theirs.values().sum()), "every sample perf script reads");
    let whole = std::fs::read(&file).unwrap();
    for cut in [64, whole.len() / 2] {
        let short = temp(&format!("perf-cut-{cut}.data"));
        std::fs::write(&short, &whole[..cut]).unwrap();
        let out = virtprof().arg("exits").arg(&short).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "cut at {cut}: {}", String::from_utf8_lossy(&out.stderr));
        let _ = std::fs::remove_file(short);
    }
    let _ = std::fs::remove_file(file);
}

/// perf with one page of buffer per CPU loses samples: its LOST records become the loss,
/// CPU by CPU as perf reads them, with the gaps where they were; perf's end-of-run lost
/// counters (LOST_SAMPLES at time 0) repeat those and are not counted twice, but what they
/// count beyond them (lost after a CPU's last LOST record) is loss of that CPU.
#[test]
fn perf_lost_records_are_the_loss_per_cpu() {
    let test = "perf_lost_records_are_the_loss_per_cpu";
    if !have_perf(test) || !have_tracefs(test) {
        return;
    }
    let Some(_vms) = have_kvm(test) else { return };
    let file = temp("perf-lost.data");
    let out =
        perf_record(&file, &["-m", "1", "-e", "kvm:*", "-a"], &["-w", "pio-kernel", "-n", "100000", "--vcpus", "2"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let theirs = perf_lost_per_cpu(&file);
    let r = exits_json(&file, &[]);
    let ours: BTreeMap<String, u64> = r["loss"]["cpus"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["reported"].as_u64().unwrap_or(0) > 0)
        .map(|c| (format!("cpu{}", c["cpu"]), c["reported"].as_u64().unwrap()))
        .collect();
    if theirs.is_empty() {
        super::util::note(test, "perf lost nothing with -m 1 on this run; the per-CPU comparison is empty");
    }
    assert_eq!(ours, theirs, "lost per CPU, ours against perf report -D");
    assert_eq!(r["lost_events"].as_u64(), Some(theirs.values().sum()));
    let _ = std::fs::remove_file(file);
}

/// Issue 55: perf's pipe mode (`perf record -o -`) reads as perf reads it (`perf script`)
/// and as the same run recorded to a file at the same time by an outer `perf record`; a
/// stream cut off mid-record reads up to the cut and says so; one cut before its tracepoint
/// formats is bad input. (`perf inject` of this host's pipe streams fails inside their
/// tracing data, so it cannot make the file.)
#[test]
fn perf_pipe_mode_reads_as_perf_reads_it_and_as_a_file_of_the_same_run() {
    let test = "perf_pipe_mode_reads_as_perf_reads_it_and_as_a_file_of_the_same_run";
    if !have_perf(test) || !have_tracefs(test) {
        return;
    }
    let Some(_vms) = have_kvm(test) else { return };
    let (pipe, file, truth) = (temp("perf-pipe.data"), temp("perf-pipe-file.data"), temp("perf-pipe-truth.json"));
    let exe = assert_cmd::cargo::cargo_bin("virtprof");
    // The stream is the inner perf's standard output: the workload's goes to a file.
    let workload = format!("'{}' testvm -w pio-user -n 500 --json > '{}'", exe.display(), truth.display());
    let events = ["-e", "kvm:kvm_userspace_exit", "-e", "kvm:kvm_pio", "-e", "sched:sched_switch"];
    let out = Command::new("perf")
        .args(["record", "-q", "-a", "-o"])
        .arg(&file)
        .args(events)
        .args(["--", "perf", "record", "-q", "-a", "-o", "-"])
        .args(events)
        .args(["--", "sh", "-c", &workload])
        .stdout(std::fs::File::create(&pipe).unwrap())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let truth: virtprof_model::testvm::TestvmReport = serde_json::from_slice(&std::fs::read(&truth).unwrap()).unwrap();
    let stream = std::fs::read(&pipe).unwrap();
    assert_eq!(&stream[8..16], &16u64.to_le_bytes(), "perf wrote a pipe-mode stream");

    let theirs = perf_script_counts(&pipe);
    let (from_pipe, from_file) = (exits_json(&pipe, &[]), exits_json(&file, &[]));
    for event in ["kvm_userspace_exit", "kvm_pio"] {
        assert_eq!(from_pipe["source"]["events"][event].as_u64(), theirs.get(event).copied(), "{event}");
    }
    let report = virtprof().args(["report", "--json"]).arg(&pipe).output().unwrap();
    let report: serde_json::Value = serde_json::from_slice(&report.stdout).unwrap();
    assert_eq!(report["events"].as_u64(), Some(theirs.values().sum()), "every sample perf script reads");
    let vcpu = &truth.vms[0].vcpus[0];
    let row = |r: &serde_json::Value| r["by_vcpu"].as_array().unwrap().iter().find(|v| v["tid"] == vcpu.tid).cloned();
    let (pipe_row, file_row) = (row(&from_pipe).expect("the vCPU"), row(&from_file).expect("the vCPU"));
    assert_eq!(pipe_row["heavyweight"].as_u64(), Some(vcpu.exits("IO")), "{pipe_row}");
    assert_eq!(pipe_row["heavyweight"], file_row["heavyweight"]);

    // Cut inside a record past the formats: read up to it, said.
    let cut = temp("perf-pipe-cut.data");
    std::fs::write(&cut, &stream[..stream.len() - 5]).unwrap();
    let out = virtprof().arg("exits").arg(&cut).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && stderr.contains("ends inside a record"), "{stderr}");
    // Cut before the formats: nothing to decode with.
    std::fs::write(&cut, &stream[..200.min(stream.len())]).unwrap();
    let out = virtprof().arg("exits").arg(&cut).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    for f in [pipe, file, cut] {
        let _ = std::fs::remove_file(f);
    }
}
