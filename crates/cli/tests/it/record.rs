//! `virtprof record` live on this host: a recorded testvm run gives exactly its heavyweight
//! exits as timed round trips, the same count `perf stat -e kvm:kvm_userspace_exit` sees, and
//! the tracefs instance is gone afterwards, also after SIGINT/SIGTERM.

use std::ffi::OsStr;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use virtprof_model::testvm::TestvmReport;

use super::util::{have_kvm, have_perf, have_tracefs, note, parse_report, perf_stat, temp, virtprof};

/// A child process killed (SIGKILL) when dropped, e.g. when an assertion fails.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Whether the tracefs instance of the recorder with this pid exists.
fn instance_of(pid: u32) -> bool {
    std::path::Path::new(&format!("/sys/kernel/tracing/instances/virtprof-record-{pid}")).exists()
}

#[test]
fn recorded_pio_run_gives_its_heavyweight_exits_and_perf_agrees() {
    let test = "recorded_pio_run_gives_its_heavyweight_exits_and_perf_agrees";
    let Some(_vms) = have_kvm(test) else { return };
    if !have_tracefs(test) {
        return;
    }
    if Command::new("perf").arg("--version").output().is_err() {
        note(test, "SKIP: perf is not installed");
        return;
    }
    let n = 1500u64;
    let (rec, perf_csv) = (temp("pio.vprec"), temp("perf.csv"));
    let exe = assert_cmd::cargo::cargo_bin("virtprof");
    let perf_cmd = Command::new("perf")
        .args(["stat", "-x", ",", "-e", "kvm:kvm_userspace_exit", "-o"])
        .arg(&perf_csv)
        .arg("--")
        .arg(&exe)
        .args(["record", "-o"])
        .arg(&rec)
        .arg("--")
        .arg(&exe)
        .args(["testvm", "--workload", "pio-user", "-n", &n.to_string(), "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = perf_cmd.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("lost events: 0"));
    let truth: TestvmReport = serde_json::from_slice(&out.stdout).unwrap();
    let vm = &truth.vms[0];
    let vcpu = &vm.vcpus[0];
    assert_eq!(vcpu.exits("IO"), n + 2);

    let report = virtprof().arg("exits").arg(&rec).args(["--json", "--vm", &vm.pid.to_string()]).output().unwrap();
    assert!(report.status.success(), "{}", String::from_utf8_lossy(&report.stderr));
    let r: Value = serde_json::from_slice(&report.stdout).unwrap();
    let io = r["by_reason"].as_array().unwrap().iter().find(|x| x["reason"] == "KVM_EXIT_IO").expect("IO row");
    assert_eq!(io["heavyweight"], n + 2, "every userspace IO exit is a heavyweight exit");
    assert!(io["min_ns"].as_u64().unwrap() > 0 && io["p50_ns"].as_u64().unwrap() <= io["max_ns"].as_u64().unwrap());
    assert_eq!(r["totals"]["lost_events"], 0);
    let userspace: u64 = vcpu.userspace_exits.values().sum();
    assert_eq!(r["source"]["events"]["kvm_userspace_exit"], userspace);

    // perf counted the same tracepoint over the same process tree.
    let perf = std::fs::read_to_string(&perf_csv).unwrap();
    let perf_count: u64 = perf
        .lines()
        .find(|l| l.contains("kvm:kvm_userspace_exit"))
        .and_then(|l| l.split(',').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no perf count in {perf}"));
    assert_eq!(perf_count, userspace);
    let leftovers: Vec<_> = std::fs::read_dir("/sys/kernel/tracing/instances")
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("virtprof-record-"))
        .filter(|e| {
            let pid = e.file_name().to_string_lossy().rsplit('-').next().unwrap().to_string();
            !std::path::Path::new("/proc").join(pid).exists()
        })
        .collect();
    assert!(leftovers.is_empty(), "instance of a finished recorder left behind: {leftovers:?}");
    let _ = (std::fs::remove_file(rec), std::fs::remove_file(perf_csv));
}

#[test]
fn sigint_and_sigterm_stop_cleanly_and_remove_the_instance() {
    let test = "sigint_and_sigterm_stop_cleanly_and_remove_the_instance";
    if !have_tracefs(test) {
        return;
    }
    for signal in [libc::SIGINT, libc::SIGTERM] {
        let rec = temp(&format!("sig{signal}.vprec"));
        let child =
            virtprof().args(["record", "-o"]).arg(&rec).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
        // Killed on drop, so a failing assertion never leaves a recorder running.
        let mut child = KillOnDrop(child);
        std::thread::sleep(Duration::from_millis(700));
        assert!(instance_of(child.0.id()), "instance exists while recording");
        // SAFETY: kill with our child's pid and a valid signal.
        unsafe { libc::kill(child.0.id() as libc::pid_t, signal) };
        let status = child.0.wait().unwrap();
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut child.0.stderr.take().unwrap(), &mut stderr).unwrap();
        assert!(status.success(), "signal {signal}: {status} {stderr}");
        assert!(stderr.contains("lost events:"), "{stderr}");
        assert!(!instance_of(child.0.id()), "signal {signal}: instance left behind");
        let out = virtprof().arg("exits").arg(&rec).output().unwrap();
        assert!(out.status.success(), "recording after signal {signal} unreadable");
        let _ = std::fs::remove_file(rec);
    }
}

#[test]
fn recorded_phases_count_every_exit_kind_exactly() {
    let test = "recorded_phases_count_every_exit_kind_exactly";
    let Some(_vms) = have_kvm(test) else { return };
    if !have_tracefs(test) || !have_perf(test) {
        return;
    }
    let rec = temp("phases.vprec");
    let script = "pio-user:300,mmio-user:200,pio-kernel:400,mmio-kernel:100,cpuid:250";
    let exe = assert_cmd::cargo::cargo_bin("virtprof");
    let argv: Vec<&OsStr> = [exe.as_os_str(), "record".as_ref(), "-o".as_ref(), rec.as_os_str(), "--".as_ref()]
        .into_iter()
        .chain([exe.as_os_str()])
        .chain(["testvm", "--workload", "phases", "--phases", script, "--json"].map(OsStr::new))
        .collect();
    // What reaches KVM on this host, counted by the kernel around the same run.
    let (out, kernel) = perf_stat(&["kvm:kvm_pio", "kvm:kvm_mmio", "kvm:kvm_cpuid", "kvm:kvm_userspace_exit"], &argv);
    let truth = parse_report(&out, &[script]);
    let vcpu = truth.vcpus().next().unwrap();
    let pid = truth.vms[0].pid.to_string();
    let r: Value = serde_json::from_slice(
        &virtprof().arg("exits").arg(&rec).args(["--json", "--vm", &pid]).output().unwrap().stdout,
    )
    .unwrap();
    let count = |name: &str| {
        r["by_reason"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["reason"] == name)
            .map_or(0, |x| x["count"].as_u64().unwrap())
    };
    let (io, mmio) = (vcpu.exits("IO"), vcpu.exits("MMIO"));
    assert_eq!((io, mmio), (300 + truth.marker_io_exits_per_vcpu, 200), "the VMM handled every userspace exit");
    assert_eq!(kernel["kvm:kvm_userspace_exit"], vcpu.userspace_exits.values().sum::<u64>());
    let cpuid_phase = vcpu.phases.iter().find(|p| p.workload == "cpuid").unwrap();
    assert_eq!(cpuid_phase.iterations, 250);
    if kernel["kvm:kvm_cpuid"] == 0 {
        // Nothing to find in the trace; the stats fd must agree that CPUIDs did not reach KVM
        // (a stray host interrupt during the phase may add an exit or two, not one per CPUID).
        note(test, "CPUID made no exit into KVM on this host (perf stat: 0 kvm_cpuid)");
        assert!(cpuid_phase.kvm_exits.unwrap_or(0) < cpuid_phase.iterations / 10, "{cpuid_phase:?}");
    }
    if r["source"]["path"] == "userspace_round_trips" {
        assert_eq!(count("KVM_EXIT_IO"), io);
        assert_eq!(count("KVM_EXIT_MMIO"), mmio);
        assert_eq!(count("pio (in kernel)"), kernel["kvm:kvm_pio"] - io);
        assert_eq!(count("mmio (in kernel)"), kernel["kvm:kvm_mmio"] - mmio);
        assert_eq!(count("kvm_cpuid (in kernel)"), kernel["kvm:kvm_cpuid"]);
    } else {
        // VMX/SVM: every exit is timed; the light/heavy split must match the VMM's counts.
        assert_eq!(r["totals"]["heavyweight"], io + mmio);
        // Reason names differ by vendor (VMX `CPUID`, SVM `cpuid`).
        assert_eq!(count("CPUID") + count("cpuid"), kernel["kvm:kvm_cpuid"]);
    }
    let _ = std::fs::remove_file(rec);
}

#[test]
fn record_vm_snapshots_kvm_stats_that_bracket_the_traced_exits() {
    let test = "record_vm_snapshots_kvm_stats_that_bracket_the_traced_exits";
    let Some(_vms) = have_kvm(test) else { return };
    if !have_tracefs(test) {
        return;
    }
    let not_a_vmm =
        virtprof().args(["record", "-o", "/tmp/x.vprec", "--vm", &std::process::id().to_string()]).output().unwrap();
    assert_eq!(not_a_vmm.status.code(), Some(2), "{}", String::from_utf8_lossy(&not_a_vmm.stderr));

    // The guest exits all through the recording however slow a loaded host makes it start:
    // it writes to a port for 30 s and is stopped once recorded.
    let mut vm = virtprof()
        .args(["testvm", "--workload", "pio-user", "--duration", "30s"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let pid = (0..200)
        .find_map(|_| {
            std::thread::sleep(Duration::from_millis(50));
            let kids = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", vm.id())).ok()?;
            kids.split_whitespace().next()?.parse::<u32>().ok()
        })
        .expect("the VMM process started");
    // Wait until the VMM holds its stats fds (it opens them as its vCPUs start running).
    let readable = (0..500).any(|_| {
        std::thread::sleep(Duration::from_millis(20));
        virtprof().args(["stats", "--pid", &pid.to_string()]).output().is_ok_and(|o| o.status.success())
    });
    assert!(readable, "the VMM's KVM stats never became readable");
    let rec = temp("vm.vprec");
    let out = virtprof()
        .args(["record", "-o"])
        .arg(&rec)
        .args(["--duration", "700ms", "--vm", &pid.to_string()])
        .output()
        .unwrap();
    // SAFETY: kill on our own child's pid: testvm stops its VMs and exits.
    unsafe { libc::kill(vm.id() as libc::pid_t, libc::SIGTERM) };
    vm.wait().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r: Value = serde_json::from_slice(
        &virtprof().arg("exits").arg(&rec).args(["--json", "--vm", &pid.to_string()]).output().unwrap().stdout,
    )
    .unwrap();
    let traced = r["totals"]["exits"].as_u64().unwrap();
    let stats = r["kvm_stats"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["pid"] == pid)
        .unwrap_or_else(|| panic!("no start and end snapshots of {pid}: {}", r["kvm_stats"]));
    let counted = stats["stats"]["exits"].as_u64().unwrap();
    assert!(traced > 0, "the guest was exiting during the recording");
    // The snapshots enclose the trace window and every traced exit is at least one KVM exit.
    assert!(counted >= traced, "stats fd {counted} < traced {traced}");
    let _ = std::fs::remove_file(rec);
}

#[test]
fn an_unwritable_output_is_refused_before_tracing_starts() {
    let test = "an_unwritable_output_is_refused_before_tracing_starts";
    if !have_tracefs(test) {
        return;
    }
    // The output's temporary file is created first; an error after the instance exists (a
    // full disk) is in reliability.rs.
    let child = virtprof()
        .args(["record", "-o", "/nonexistent-dir/x.vprec", "--duration", "1s"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot create '/nonexistent-dir/x.vprec'"));
    assert!(!instance_of(pid), "instance virtprof-record-{pid} left behind after an error");
}

/// The recorded command's failure is record's (as with `time CMD`): its exit code passed on,
/// a death by a signal named (the command itself says nothing then), the recording kept.
#[test]
fn the_commands_failure_is_passed_on_and_a_killing_signal_named() {
    let test = "the_commands_failure_is_passed_on_and_a_killing_signal_named";
    if !have_tracefs(test) {
        return;
    }
    let rec = temp("failing-command.vprec");
    for (script, code, said) in
        [("exit 7", 7, None), ("kill -SEGV $$", 1, Some("the recorded command was killed by signal 11"))]
    {
        let out = virtprof().args(["record", "-o"]).arg(&rec).args(["--", "sh", "-c", script]).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{script}: {stderr}");
        assert_eq!(said.is_some_and(|s| stderr.contains(s)), said.is_some(), "{script}: {stderr}");
        assert!(stderr.contains("lost events: 0") && rec.exists(), "{script}: the recording is kept: {stderr}");
    }
    let _ = std::fs::remove_file(rec);
}
