//! Scheduling accounting (`sched` on recordings, `top --once` live) against the kernel's own
//! figures: each vCPU thread's schedstat (testvm reports its run/wait deltas and wall time),
//! testvm's I/O counts, and the switch-ins `perf record` saw per thread.

use std::path::Path;
use std::process::Command;

use serde_json::Value;
use virtprof_model::testvm::VcpuReport;

use super::util::{have_kvm, have_tracefs, host_steal_ns, note, parse_report, record_testvm, virtprof};

pub(super) fn sched_json(file: &Path, extra: &[&str]) -> Value {
    let out = virtprof().arg("sched").arg(file).args(extra).arg("--json").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The whole-run row of the vCPU thread `tid`.
pub(super) fn vcpu_row(report: &Value, tid: u32) -> Value {
    let run = report["windows"].as_array().unwrap().last().unwrap();
    assert_eq!(run["label"], "run");
    run["vms"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|vm| vm["vcpus"].as_array().unwrap().iter())
        .find(|v| v["tid"] == tid)
        .unwrap_or_else(|| panic!("no vCPU row for tid {tid} in {report}"))
        .clone()
}

fn pct(part: u64, whole: u64) -> f64 {
    100.0 * part as f64 / whole as f64
}

#[test]
fn two_compute_vms_on_one_cpu_match_schedstat_and_perf_switch_ins() {
    let test = "two_compute_vms_on_one_cpu_match_schedstat_and_perf_switch_ins";
    let Some(_vms) = have_kvm(test) else { return };
    if !have_tracefs(test) {
        return;
    }
    let file = std::env::temp_dir().join(format!("virtprof-it-sched-{}.vprec", std::process::id()));
    // perf records every context switch system-wide meanwhile; switch-ins are counted per next_pid.
    let perf_data = std::env::temp_dir().join(format!("virtprof-it-sched-{}.perf", std::process::id()));
    let exe = assert_cmd::cargo::cargo_bin("virtprof");
    let args = ["--workload", "compute", "--vms", "2", "--pin", "0", "--duration", "2s", "--name", "contend"];
    let steal_before = host_steal_ns(0);
    let perf = Command::new("perf")
        .args(["record", "-q", "-a", "-e", "sched:sched_switch", "-o"])
        .arg(&perf_data)
        .arg("--")
        .arg(&exe)
        .args(["record", "-o"])
        .arg(&file)
        .args(["--", exe.to_str().unwrap(), "testvm"])
        .args(args)
        .arg("--json")
        .output();
    let (report, switch_ins) = match perf {
        Ok(output) if output.status.success() => (parse_report(&output, &args), perf_switch_ins(test, &perf_data)),
        _ => {
            note(test, "perf unavailable; checking against schedstat only");
            (record_testvm(&file, &[], &args), None)
        }
    };
    // What this host's hypervisor took from CPU 0 meanwhile, plus a tick for /proc/stat's grain.
    let host_steal = host_steal_ns(0) - steal_before + 10_000_000;
    let sched = sched_json(&file, &[]);
    let vcpus: Vec<&VcpuReport> = report.vcpus().collect();
    assert_eq!(vcpus.len(), 2);
    for v in &vcpus {
        let row = vcpu_row(&sched, v.tid);
        let observed =
            row["run_ns"].as_u64().unwrap() + row["wait_ns"].as_u64().unwrap() + row["blocked_ns"].as_u64().unwrap();
        // schedstat's run and wait over the thread's life, as shares of what we observed.
        let (run, wait) = (row["running_pct"].as_f64().unwrap(), row["waiting_pct"].as_f64().unwrap());
        // The trace's run time holds what this host's hypervisor stole; schedstat's does not.
        let stolen = pct(host_steal, observed);
        assert!(
            (run - pct(v.run_ns, observed)).abs() < 2.0 + stolen,
            "run {run} vs schedstat {} (this host's steal on CPU 0: {stolen:.2} %): {row}",
            pct(v.run_ns, observed)
        );
        assert!(
            (wait - pct(v.wait_ns, observed)).abs() < 2.0,
            "wait {wait} vs schedstat {}: {row}",
            pct(v.wait_ns, observed)
        );
        assert!((35.0..65.0).contains(&run) && (35.0..65.0).contains(&wait), "{row}");
        assert_eq!(row["cpu"], 0);
        // Every execution but the first ends by preemption (the other VM wants CPU 0).
        assert!(row["alloc_avg_us"].as_f64().unwrap() > 0.0);
        // schedstat counts switch-ins too (pcount); the trace sees the same ones.
        let diff = row["exec_count"].as_u64().unwrap().abs_diff(v.timeslices);
        assert!(diff <= 2 + v.timeslices / 100, "execs {} vs schedstat timeslices {}", row["exec_count"], v.timeslices);
        // Every switch-in the trace saw is one perf saw (an inferred execution had none).
        if let Some(switch_ins) = &switch_ins {
            let traced = row["exec_count"].as_u64().unwrap() - row["inferred_exec_count"].as_u64().unwrap();
            let seen = switch_ins.get(&v.tid).copied().unwrap_or(0);
            assert_eq!(traced, seen, "thread {}: traced switch-ins vs perf's sched_switch next_pid: {row}", v.tid);
        }
    }
    // --window slices add up to the run.
    let sliced = sched_json(&file, &["--window", "500ms"]);
    let windows = sliced["windows"].as_array().unwrap();
    assert!(windows.len() >= 5, "{} windows", windows.len());
    let tid = vcpus[0].tid;
    let sum: u64 = windows[..windows.len() - 1]
        .iter()
        .flat_map(|w| w["vms"].as_array().unwrap().iter())
        .flat_map(|vm| vm["vcpus"].as_array().unwrap().iter())
        .filter(|v| v["tid"] == tid)
        .map(|v| v["exec_count"].as_u64().unwrap())
        .sum();
    assert_eq!(sum, vcpu_row(&sliced, tid)["exec_count"].as_u64().unwrap());
    let _ = std::fs::remove_file(file);
    let _ = std::fs::remove_file(perf_data);
}

/// Switch-ins per thread in a `perf record -e sched:sched_switch` file, as `perf script` decodes
/// them; `None` where perf cannot read it back or lost events (then it is no ground truth).
fn perf_switch_ins(test: &str, data: &Path) -> Option<std::collections::HashMap<u32, u64>> {
    let out = Command::new("perf").args(["script", "-F", "trace", "-i"]).arg(data).output().ok()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() || stderr.contains("LOST") || stderr.contains("lost") {
        note(
            test,
            format!("perf script on {}: {}; {stderr}; checking against schedstat only", data.display(), out.status),
        );
        return None;
    }
    let mut counts = std::collections::HashMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let next_pid = line.split_whitespace().find_map(|f| f.strip_prefix("next_pid=")?.parse::<u32>().ok());
        if let Some(tid) = next_pid {
            *counts.entry(tid).or_insert(0u64) += 1;
        }
    }
    Some(counts)
}

#[test]
fn io_bound_vm_blocked_share_and_io_count_match_testvm() {
    let test = "io_bound_vm_blocked_share_and_io_count_match_testvm";
    let Some(_vms) = have_kvm(test) else { return };
    if !have_tracefs(test) {
        return;
    }
    let file = std::env::temp_dir().join(format!("virtprof-it-sched-io-{}.vprec", std::process::id()));
    let report =
        record_testvm(&file, &[], &["--workload", "io-bound", "-n", "150", "--io-latency", "4ms", "--name", "io"]);
    let sched = sched_json(&file, &[]);
    let v = report.vcpus().next().unwrap();
    let row = vcpu_row(&sched, v.tid);
    // Every port access of the guest (requests and the two markers) is one I/O.
    assert_eq!(row["io_count"].as_u64().unwrap(), v.exits("IO"), "{row}");
    // Blocked is what schedstat leaves of the thread's wall time.
    let expected_blocked = pct(v.wall_ns.saturating_sub(v.run_ns + v.wait_ns), v.wall_ns);
    let blocked = row["blocked_pct"].as_f64().unwrap();
    assert!((blocked - expected_blocked).abs() < 2.0, "blocked {blocked} vs schedstat {expected_blocked}: {row}");
    assert!(blocked > 70.0, "{row}");
    // One execution per request, as schedstat counts them (some inferred where this kernel
    // leaves sched_switch out).
    let execs = row["exec_count"].as_u64().unwrap();
    assert!(execs.abs_diff(v.timeslices) <= 3, "execs {execs} vs schedstat timeslices {}: {row}", v.timeslices);
    let per_io = row["blocked_per_io_us"].as_f64().unwrap();
    assert!((3000.0..20000.0).contains(&per_io), "blocked per I/O {per_io} us with a 4 ms latency: {row}");
    // Other VMs on the host (a test's QEMU) may be in the recording too.
    let vm = sched["windows"][0]["vms"].as_array().unwrap().iter().find(|v| v["name"] == "io").expect("the VM 'io'");
    assert_eq!(vm["kind"].as_str(), Some("virtprof-testvm"));
    let _ = std::fs::remove_file(file);
}

/// A background testvm run, stopped (SIGTERM) when dropped.
struct Background(std::process::Child);

impl Drop for Background {
    fn drop(&mut self) {
        // SAFETY: kill with our child's pid and a valid signal.
        unsafe { libc::kill(self.0.id() as libc::pid_t, libc::SIGTERM) };
        let _ = self.0.wait();
    }
}

fn background_testvm(args: &[&str]) -> (Background, Vec<u32>) {
    let child = virtprof().arg("testvm").args(args).stdout(std::process::Stdio::null()).spawn().unwrap();
    let parent = child.id();
    let guard = Background(child);
    // Its VMM processes: children holding a VM, named on their command line.
    for _ in 0..200 {
        let vmms: Vec<u32> = std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .filter(|pid| {
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
                let ppid =
                    stat.rsplit(')').next().and_then(|r| r.split_whitespace().nth(1)).and_then(|p| p.parse().ok());
                ppid == Some(parent)
            })
            .filter(|pid| {
                virtprof_kvm::discover::inspect(Path::new("/proc"), *pid)
                    .ok()
                    .flatten()
                    .is_some_and(|vm| !vm.vcpus.is_empty())
            })
            .collect();
        if !vmms.is_empty() {
            return (guard, vmms);
        }
        std::thread::sleep(std::time::Duration::from_millis(25));
    }
    panic!("testvm {args:?} started no VM");
}

/// Whether `doctor` finds that the in-kernel aggregation program loads here.
fn bpf_loads() -> bool {
    let out = virtprof().args(["doctor", "--no-probe", "--json"]).output().unwrap();
    let doctor: Value = serde_json::from_slice(&out.stdout).unwrap();
    doctor["checks"].as_array().unwrap().iter().any(|c| c["name"] == "eBPF aggregation" && c["status"] == "ok")
}

fn top_json(extra: &[&str]) -> Value {
    let out = virtprof().args(["top", "--once", "--json"]).args(extra).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn top_once_finds_the_vm_by_name_in_every_mode() {
    let test = "top_once_finds_the_vm_by_name_in_every_mode";
    let Some(_vms) = have_kvm(test) else { return };
    let (_vm, pids) =
        background_testvm(&["--workload", "compute", "--vcpus", "2", "--duration", "20s", "--name", "busy"]);
    let pid = pids[0].to_string();
    let log = std::env::temp_dir().join(format!("virtprof-it-top-{}.csv", std::process::id()));
    let mut modes: Vec<(Vec<&str>, &str)> = vec![(vec!["--no-trace"], "polling")];
    if have_tracefs(test) {
        // In the kernel where the eBPF program loads (doctor says), by default.
        let best = if bpf_loads() { "kernel" } else { "trace" };
        modes.push((vec![], best));
        modes.push((vec!["--bpf"], best));
        modes.push((vec!["--trace"], "trace"));
    }
    for (mode, expected) in &modes {
        let mut extra = vec!["--vm", pid.as_str(), "--log", log.to_str().unwrap()];
        extra.extend(mode);
        let top = top_json(&extra);
        assert_eq!(top["mode"], *expected, "top --once {mode:?}");
        let windows = top["windows"].as_array().unwrap();
        assert_eq!(windows.iter().map(|w| w["label"].as_str().unwrap()).collect::<Vec<_>>(), ["1s", "10s", "run"]);
        let vm = &windows[0]["vms"][0];
        assert_eq!((vm["name"].as_str(), vm["kind"].as_str()), (Some("busy"), Some("virtprof-testvm")), "{top}");
        let vcpus = vm["vcpus"].as_array().unwrap();
        assert_eq!(vcpus.iter().map(|v| v["index"].as_u64().unwrap()).collect::<Vec<_>>(), [0, 1]);
        for v in vcpus {
            for key in [
                "tid",
                "cpu",
                "running_pct",
                "waiting_pct",
                "blocked_pct",
                "exec_count",
                "cpu_per_exec_us",
                "wait_per_exec_us",
                "io_count",
                "exits_per_s",
            ] {
                assert!(!v[key].is_null(), "{key} missing: {v}");
            }
            // A compute vCPU never blocks: it runs or waits for a CPU.
            let busy = v["running_pct"].as_f64().unwrap() + v["waiting_pct"].as_f64().unwrap();
            assert!(busy > 95.0, "{mode:?}: {v}");
        }
    }
    let csv = std::fs::read_to_string(&log).unwrap();
    let _ = std::fs::remove_file(&log);
    assert!(csv.starts_with("time_s,window,entity,pid,vm,vcpu"), "{csv}");
    // One 1 s row per vCPU per run of top.
    assert_eq!(csv.lines().filter(|l| l.contains(",1s,vcpu,")).count(), 2 * modes.len(), "{csv}");
}

#[test]
fn top_survives_a_vm_exiting_mid_sample_and_rejects_bad_input() {
    let test = "top_survives_a_vm_exiting_mid_sample_and_rejects_bad_input";
    for (args, message) in [
        (vec!["top", "--vm", "999999999"], "no such process"),
        (vec!["top", "-d", "0"], "between 0.1 and 3600"),
        (vec!["top", "--json"], "--once"),
        (vec!["sched", "/nonexistent.vprec"], "cannot open recording"),
        (vec!["demo", "--duration", "10ms"], "at least 1s"),
    ] {
        let out = virtprof().args(&args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(message), "{args:?}: {stderr}");
    }
    let Some(_vms) = have_kvm(test) else { return };
    let (_vm, pids) = background_testvm(&["--workload", "compute", "--duration", "600ms", "--name", "brief"]);
    let out =
        virtprof().args(["top", "--once", "--json", "-d", "1.5", "--vm"]).arg(pids[0].to_string()).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let top: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(top["windows"].is_array());
}
