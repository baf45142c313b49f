//! Issue 56's pathology suite: causes injected on purpose with known size (testvm VMs), each
//! recorded and run through `explain`. Every single-cause case must name its cause first, a
//! mixed case both in its top three, a healthy VM "nothing to explain"; each cause's share of
//! the vCPU time is checked against the run's own ground truth (the vCPU thread's schedstat
//! wait, the VMM's exit counts). A recording without the events a cause needs says it cannot
//! tell, never a guess. Cases that need a facility the host lacks (perf, a cgroup v1 cpu
//! controller) are left out and said.

use std::process::Command;

use serde_json::Value;

use super::util::{have_kvm, have_tracefs, parse_report, temp, virtprof};
use virtprof_model::testvm::TestvmReport;

const TEST: &str = "explain_names_each_injected_cause_first_with_its_size";

/// Record `workload` with `record_args` and explain it: (the run's truth, explain's JSON).
fn run_case(name: &str, record_args: &[&str], workload: &[&str]) -> (TestvmReport, Value) {
    let file = temp(&format!("explain-{name}.vprec"));
    let exe = assert_cmd::cargo::cargo_bin("virtprof");
    let out = Command::new(&exe)
        .args(["record", "-o", file.to_str().unwrap()])
        .args(record_args)
        .arg("--")
        .arg(&exe)
        .args(workload)
        .arg("--json")
        .output()
        .unwrap();
    let truth = parse_report(&out, workload);
    let out = virtprof().arg("explain").arg(&file).arg("--json").output().unwrap();
    assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
    let text = virtprof().arg("explain").arg(&file).output().unwrap();
    assert!(text.status.success() && !text.stdout.is_empty());
    let page = temp(&format!("explain-{name}.html"));
    let html = virtprof().arg("explain").arg(&file).arg("--html").arg(&page).output().unwrap();
    assert!(html.status.success(), "{}", String::from_utf8_lossy(&html.stderr));
    assert!(std::fs::read_to_string(&page).unwrap().contains("\"causes\":["));
    let _ = std::fs::remove_file(&page);
    let _ = std::fs::remove_file(&file);
    (truth, serde_json::from_slice(&out.stdout).unwrap())
}

/// explain's answer for the VM of VMM `pid`.
fn vm(report: &Value, pid: u32) -> &Value {
    report["vms"].as_array().unwrap().iter().find(|v| v["pid"] == pid).unwrap_or_else(|| panic!("VM {pid}: {report}"))
}

fn kinds(vm: &Value) -> Vec<String> {
    vm["causes"].as_array().unwrap().iter().map(|c| c["kind"].as_str().unwrap().to_string()).collect()
}

/// A cause's share of the vCPU time, %.
fn vcpu_pct(vm: &Value, kind: &str) -> Option<f64> {
    vm["causes"].as_array().unwrap().iter().find(|c| c["kind"] == kind)?["vcpu_time_pct"].as_f64()
}

/// A compute VM whose vCPU thread the test moves between CPU 0 and 1 every 2 ms: (truth,
/// explain's JSON, moves made).
fn run_migrating() -> (TestvmReport, Value, u64) {
    let file = temp("explain-migrating.vprec");
    let exe = assert_cmd::cargo::cargo_bin("virtprof");
    let workload = ["testvm", "-w", "compute", "--duration", "1500ms", "--name", "explain-migrating"];
    let child = Command::new(&exe)
        .args(["record", "-o", file.to_str().unwrap(), "--"])
        .arg(&exe)
        .args(workload)
        .arg("--json")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut tid = None;
    while tid.is_none() && std::time::Instant::now() < deadline {
        tid = thread_of("explain-migrating", "vcpu0");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let tid = tid.expect("the testvm's vCPU thread");
    let mut flips = 0u64;
    for cpu in [0usize, 1].iter().cycle() {
        // SAFETY: a cpu_set_t zeroed then set through libc's macros; the call reads it only.
        let moved = unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(*cpu, &mut set);
            libc::sched_setaffinity(tid as libc::pid_t, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
        };
        if !moved {
            break; // the thread ended
        }
        flips += 1;
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    let out = child.wait_with_output().unwrap();
    let truth = parse_report(&out, &workload);
    let json = virtprof().arg("explain").arg(&file).arg("--json").output().unwrap();
    assert!(json.status.success(), "{}", String::from_utf8_lossy(&json.stderr));
    let _ = std::fs::remove_file(&file);
    (truth, serde_json::from_slice(&json.stdout).unwrap(), flips)
}

/// A compute VM pinned on CPU 1 while perf samples CPU 1 at 20 kHz: (truth, explain's JSON,
/// perf's samples taken in the vCPU thread); None (noted) without perf.
fn run_interrupted() -> Option<(TestvmReport, Value, u64)> {
    let perf = Command::new("perf").arg("--version").output().is_ok_and(|o| o.status.success());
    if !perf {
        super::util::note(TEST, "perf is missing: no interrupt-source case");
        return None;
    }
    let file = temp("explain-interrupted.vprec");
    let data = temp("explain-interrupted.perf.data");
    let exe = assert_cmd::cargo::cargo_bin("virtprof");
    let workload = ["testvm", "-w", "compute", "--pin", "1", "--duration", "1500ms"];
    let script = format!(
        "taskset -c 0 perf record -q -C 1 -e cpu-clock -F 20000 -o {} -- sleep 1.7 & {} {} --json; wait",
        data.display(),
        exe.display(),
        workload.join(" ")
    );
    let out =
        Command::new(&exe).args(["record", "-o", file.to_str().unwrap(), "--", "sh", "-c", &script]).output().unwrap();
    let truth = parse_report(&out, &workload);
    let comms = Command::new("perf").args(["script", "-F", "comm", "-i"]).arg(&data).output().unwrap();
    let in_vcpu = String::from_utf8_lossy(&comms.stdout).lines().filter(|l| l.trim() == "vcpu0").count() as u64;
    assert!(in_vcpu > 1000, "perf sampled the vCPU {in_vcpu} times");
    let json = virtprof().arg("explain").arg(&file).arg("--json").output().unwrap();
    assert!(json.status.success(), "{}", String::from_utf8_lossy(&json.stderr));
    let _ = std::fs::remove_file(&file);
    let _ = std::fs::remove_file(&data);
    Some((truth, serde_json::from_slice(&json.stdout).unwrap(), in_vcpu))
}

/// A process killed when dropped (the CPU hog), even when the test fails.
pub(super) struct Killed(pub(super) std::process::Child);

impl Killed {
    /// A shell loop that spins on `cpu`.
    pub(super) fn hog(cpu: u32) -> Killed {
        let cpu = cpu.to_string();
        Killed(Command::new("taskset").args(["-c", &cpu, "sh", "-c", "while :; do :; done"]).spawn().expect("taskset"))
    }
}

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A cgroup v1 CPU-bandwidth group, removed when dropped (after its tasks are gone).
struct CpuLimit(std::path::PathBuf);

impl CpuLimit {
    /// `quota` of every `period` microseconds for the tasks put in it; None (said) where the
    /// host has no cgroup v1 cpu controller.
    fn new(name: &str, quota_us: u64, period_us: u64) -> Option<CpuLimit> {
        let root = std::path::Path::new("/sys/fs/cgroup/cpu");
        if !root.join("cpu.cfs_quota_us").exists() {
            return None;
        }
        let dir = root.join(name);
        let _ = std::fs::remove_dir(&dir);
        std::fs::create_dir(&dir).ok()?;
        std::fs::write(dir.join("cpu.cfs_period_us"), period_us.to_string()).ok()?;
        std::fs::write(dir.join("cpu.cfs_quota_us"), quota_us.to_string()).ok()?;
        Some(CpuLimit(dir))
    }

    /// Move one thread in.
    fn add(&self, tid: u32) {
        std::fs::write(self.0.join("tasks"), tid.to_string()).unwrap();
    }

    /// How often the group was throttled.
    fn throttled(&self) -> u64 {
        let stat = std::fs::read_to_string(self.0.join("cpu.stat")).unwrap_or_default();
        stat.lines().find_map(|l| l.strip_prefix("nr_throttled ")?.parse().ok()).unwrap_or(0)
    }
}

impl Drop for CpuLimit {
    fn drop(&mut self) {
        for _ in 0..100 {
            if std::fs::remove_dir(&self.0).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}

/// An io-bound VM whose I/O thread, on CPU 0, is in a CPU-limited cgroup (2 ms of every
/// 20) with a CPU hog that spends the group's quota, the vCPU alone on CPU 1: its requests
/// wait for the thread while the group is throttled, its CPU idle. (truth, explain's JSON,
/// times throttled); None (said) without a cgroup v1 cpu controller.
fn run_starved() -> Option<(TestvmReport, Value, u64)> {
    let Some(limit) = CpuLimit::new(&format!("virtprof-it-starved-{}", std::process::id()), 2_000, 20_000) else {
        super::util::note(TEST, "no cgroup v1 cpu controller (/sys/fs/cgroup/cpu): no starved I/O thread case");
        return None;
    };
    let hog = Killed::hog(0);
    limit.add(hog.0.id());
    let file = temp("explain-starved.vprec");
    let exe = assert_cmd::cargo::cargo_bin("virtprof");
    let workload = [
        "testvm",
        "-w",
        "io-bound",
        "-n",
        "50",
        "--io-latency",
        "1ms",
        "--io-thread",
        "0",
        "--pin",
        "1",
        "--name",
        "explain-starved",
    ];
    let child = Command::new(&exe)
        .args(["record", "-o", file.to_str().unwrap(), "--"])
        .arg(&exe)
        .args(workload)
        .arg("--json")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let io_thread = loop {
        if let Some(tid) = thread_of("explain-starved", "IO iothread0") {
            break tid;
        }
        assert!(std::time::Instant::now() < deadline, "no I/O thread appeared");
        std::thread::sleep(std::time::Duration::from_millis(1));
    };
    limit.add(io_thread);
    let out = child.wait_with_output().unwrap();
    let truth = parse_report(&out, &workload);
    let throttled = limit.throttled();
    drop(hog);
    let json = virtprof().arg("explain").arg(&file).arg("--json").output().unwrap();
    assert!(json.status.success(), "{}", String::from_utf8_lossy(&json.stderr));
    let _ = std::fs::remove_file(&file);
    Some((truth, serde_json::from_slice(&json.stdout).unwrap(), throttled))
}

/// The thread named `comm` of the testvm VM named `name`, once it runs.
fn thread_of(name: &str, comm: &str) -> Option<u32> {
    for process in std::fs::read_dir("/proc").ok()?.flatten() {
        let cmdline = std::fs::read(process.path().join("cmdline")).unwrap_or_default();
        if !String::from_utf8_lossy(&cmdline).contains(name) {
            continue;
        }
        for task in std::fs::read_dir(process.path().join("task")).into_iter().flatten().flatten() {
            let found = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
            if found.trim() == comm {
                return task.file_name().to_str()?.parse().ok();
            }
        }
    }
    None
}

/// One row of the suite's table: the case, what it should name, what it named first, the
/// share it gave against the truth.
struct Row {
    case: &'static str,
    expected: Vec<&'static str>,
    named: Vec<String>,
    share_error_pts: Option<f64>,
}

#[test]
fn explain_names_each_injected_cause_first_with_its_size() {
    if !have_tracefs(TEST) {
        return;
    }
    let Some(_vms) = have_kvm(TEST) else { return };
    let mut rows = Vec::new();

    // A noisy neighbour: two compute VMs pinned on one CPU; each waits about half the time,
    // and the other VM is who ran meanwhile.
    let (truth, r) =
        run_case("neighbour", &[], &["testvm", "-w", "compute", "--vms", "2", "--pin", "1", "--duration", "1s"]);
    let (a, b) = (&truth.vms[0], &truth.vms[1]);
    let v = vm(&r, a.pid);
    let wait_pct = 100.0 * a.vcpus[0].wait_ns as f64 / (a.vcpus[0].run_ns + a.vcpus[0].wait_ns) as f64;
    assert!(wait_pct > 20.0, "the neighbour took {wait_pct:.1} %");
    let cause = &v["causes"][0];
    assert_eq!(cause["kind"], "cpu_contention", "{v}");
    // Who ran meanwhile: the other VM among the first named (a loaded host adds its own tasks).
    let entities = cause["entities"].as_array().unwrap();
    assert!(entities.iter().take(3).any(|e| e["kind"] == "vm" && e["pid"] == b.pid), "{v}");
    // The timeline's waiting adds up to the waiting time.
    let series = v["timeline"]["series"].as_array().unwrap();
    let waits: f64 = series.iter().find(|s| s["cause"] == "cpu_contention").unwrap()["ms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .sum();
    let waiting_ms = v["time"]["waiting_ns"].as_f64().unwrap() / 1e6;
    assert!((waits - waiting_ms).abs() <= 0.02 * waiting_ms + 5.0, "timeline {waits} ms, waiting {waiting_ms} ms");
    let got = vcpu_pct(v, "cpu_contention").unwrap();
    rows.push(Row {
        case: "noisy neighbour",
        expected: vec!["cpu_contention"],
        named: kinds(v),
        share_error_pts: Some(got - wait_pct),
    });

    // An MMIO-heavy guest: user-space MMIO exits, as many as the VMM handled.
    let (truth, r) = run_case("mmio", &[], &["testvm", "-w", "mmio-user", "-n", "20000"]);
    let vcpu = &truth.vms[0].vcpus[0];
    let v = vm(&r, truth.vms[0].pid);
    let causes = v["causes"].as_array().unwrap();
    let storm = causes.iter().find(|c| c["kind"] == "exit_storm").unwrap_or_else(|| panic!("no exit storm: {v}"));
    let reason = storm["entities"][0]["reason"].as_str().unwrap();
    assert!(reason.contains("MMIO"), "{reason}");
    assert_eq!(storm["entities"][0]["count"].as_u64(), Some(vcpu.exits("MMIO")), "{v}");
    // First, unless the host's own load took the vCPU's CPU for longer (its schedstat says).
    if causes[0]["kind"] != "exit_storm" {
        assert_eq!(causes[0]["kind"], "cpu_contention", "{v}");
        // (schedstat and the trace differ a little about where the run starts and ends)
        let storm_ns = storm["lost_ns"].as_f64().unwrap();
        assert!(vcpu.wait_ns as f64 >= 0.9 * storm_ns, "contention ranked first, truth: {}", vcpu.wait_ns);
    }
    // On a loaded host the truth has two causes: both are expected.
    let loaded = 100.0 * vcpu.wait_ns as f64 / (vcpu.run_ns + vcpu.wait_ns) as f64 >= 5.0;
    let expected = if loaded { vec!["exit_storm", "cpu_contention"] } else { vec!["exit_storm"] };
    rows.push(Row { case: "MMIO-heavy guest", expected, named: kinds(v), share_error_pts: None });

    // Both at once: an MMIO-heavy guest beside another on one CPU.
    let (truth, r) = run_case("mixed", &[], &["testvm", "-w", "mmio-user", "-n", "20000", "--vms", "2", "--pin", "1"]);
    let v = vm(&r, truth.vms[0].pid);
    let top3: Vec<String> = kinds(v).into_iter().take(3).collect();
    assert!(top3.contains(&"cpu_contention".into()) && top3.contains(&"exit_storm".into()), "{v}");
    rows.push(Row {
        case: "MMIO guest + neighbour",
        expected: vec!["cpu_contention", "exit_storm"],
        named: kinds(v),
        share_error_pts: None,
    });

    // A VM alone: nothing to explain, unless the host's other load took its CPU (the run's
    // own schedstat says how much), which must then be named as such.
    let (truth, r) = run_case("healthy", &[], &["testvm", "-w", "compute", "--pin", "1", "--duration", "500ms"]);
    let t = &truth.vms[0].vcpus[0];
    let v = vm(&r, truth.vms[0].pid);
    let wait_pct = 100.0 * t.wait_ns as f64 / (t.run_ns + t.wait_ns) as f64;
    // explain's line is at 5 % lost; the trace and schedstat differ by a little about where
    // the run starts and ends, so near the line either answer is right.
    let nothing = v["verdict"] == "nothing to explain";
    let contention_first = v["causes"][0]["kind"] == "cpu_contention";
    match wait_pct {
        p if p < 3.5 => assert!(nothing, "{p:.1} % waiting: {v}"),
        p if p > 6.5 => assert!(contention_first, "{p:.1} % waiting: {v}"),
        p => assert!(nothing || contention_first, "{p:.1} % waiting: {v}"),
    }
    let expected = if nothing { vec![] } else { vec!["cpu_contention"] };
    rows.push(Row { case: "healthy", expected, named: kinds(v), share_error_pts: None });

    // Forced migrations: the vCPU thread moved between CPU 0 and 1 every 2 ms while it
    // computes (500 per second, counted by the flipper as ground truth).
    let (truth, r, flips) = run_migrating();
    let t = &truth.vms[0].vcpus[0];
    let v = vm(&r, truth.vms[0].pid);
    let causes = v["causes"].as_array().unwrap();
    let moved = causes.iter().find(|c| c["kind"] == "migrations").unwrap_or_else(|| panic!("{flips} flips: {v}"));
    let summary = moved["summary"].as_str().unwrap();
    let count: u64 =
        summary.split("moved across CPUs ").nth(1).and_then(|r| r.split(' ').next()?.parse().ok()).unwrap();
    // Each move the flipper made is one sched_migrate_task (the kernel may add its own).
    assert!(count >= flips * 9 / 10, "{count} migrations traced, {flips} moves made: {summary}");
    // Migrations have no measured time: first unless a measured cause took ≥ 1 % (the host's
    // own load, which schedstat shows as waiting).
    let wait_pct = 100.0 * t.wait_ns as f64 / (t.run_ns + t.wait_ns) as f64;
    if causes[0]["kind"] != "migrations" {
        assert!(wait_pct >= 0.5 && causes[0]["kind"] == "cpu_contention", "{wait_pct:.1} % waiting: {v}");
    }
    let expected =
        if causes[0]["kind"] == "migrations" { vec!["migrations"] } else { vec!["cpu_contention", "migrations"] };
    rows.push(Row { case: "forced migrations", expected, named: kinds(v), share_error_pts: None });

    // A fault storm: the VMM takes the guest's touch buffer back 50 times a second (as a
    // balloon returns pages to the host) and KVM faults every page in again at the guest's
    // next touch; the vCPU's KVM stats fd (pf_fixed) counts them.
    let workload = ["testvm", "-w", "touch", "--pin", "1", "--duration", "1s", "--reclaim-hz", "50"];
    let (truth, r) = run_case("faults", &[], &workload);
    let (vm0, v) = (&truth.vms[0], vm(&r, truth.vms[0].pid));
    let fixed = vm0.vcpus[0].kvm_stats["pf_fixed"];
    let reclaims = vm0.reclaims.expect("the reclaim count");
    let causes = v["causes"].as_array().unwrap();
    let storm = causes.iter().find(|c| c["kind"] == "memory_faults").unwrap_or_else(|| panic!("{fixed} faults: {v}"));
    let summary = storm["summary"].as_str().unwrap();
    let number_after = |text: &str| -> u64 {
        summary
            .split(text)
            .nth(1)
            .and_then(|r| r.split(' ').next()?.parse().ok())
            .unwrap_or_else(|| panic!("{summary}"))
    };
    // One traced fault per page KVM fixed (a retried fault is traced once more: 1 % at most).
    let faults = number_after("KVM faulted ");
    assert!(faults.abs_diff(fixed) <= fixed / 100, "{faults} faults traced, KVM fixed {fixed}");
    assert!(fixed > 20 * reclaims, "{fixed} faults for {reclaims} reclaims");
    // Who took the memory back: the VM's own VMM, at least once per reclaim.
    assert_eq!((&storm["entities"][0]["kind"], &storm["entities"][0]["pid"]), (&"vm".into(), &vm0.pid.into()));
    assert!(number_after("unmapped guest memory ") >= reclaims, "{reclaims} reclaims: {summary}");
    // First, unless a measured cause took ≥ 5 % (a loaded host's contention).
    let first = causes[0]["kind"] == "memory_faults";
    if !first {
        assert!(causes[0]["kind"] == "cpu_contention" && causes[0]["vcpu_time_pct"].as_f64() >= Some(5.0), "{v}");
    }
    let expected = if first { vec!["memory_faults"] } else { vec!["cpu_contention", "memory_faults"] };
    rows.push(Row { case: "fault storm (reclaim)", expected, named: kinds(v), share_error_pts: None });

    // An interrupt source on the vCPU's CPU: perf (itself on CPU 0) sampling CPU 1 at
    // 20 kHz, a timer interrupt each, while the VM computes there. perf's samples taken in
    // the vCPU thread are interrupts that hit it: the ground truth of the count.
    if let Some((truth, r, in_vcpu)) = run_interrupted() {
        let t = &truth.vms[0].vcpus[0];
        let v = vm(&r, truth.vms[0].pid);
        let causes = v["causes"].as_array().unwrap();
        let irq = causes.iter().find(|c| c["kind"] == "host_interrupts").unwrap_or_else(|| panic!("{v}"));
        let summary = irq["summary"].as_str().unwrap();
        let count: u64 =
            summary.split("host interrupts (").nth(1).and_then(|r| r.split(',').next()?.parse().ok()).unwrap();
        // perf's own samples, and at most the kernel's tick (≤ 1000 Hz) more. Traced counts
        // run a few % under perf's on a loaded host (92.5 % with a build beside it, 99 % on a
        // quiet one): not yet understood, so the bound is loose.
        assert!(
            count >= in_vcpu * 85 / 100 && count <= in_vcpu + 2_000,
            "{count} interrupts traced, perf sampled {in_vcpu}"
        );
        if causes[0]["kind"] != "host_interrupts" {
            let irq_ns = irq["lost_ns"].as_f64().unwrap();
            assert!(causes[0]["kind"] == "cpu_contention" && t.wait_ns as f64 >= 0.9 * irq_ns, "{v}");
        }
        let expected = if causes[0]["kind"] == "host_interrupts" {
            vec!["host_interrupts"]
        } else {
            vec!["cpu_contention", "host_interrupts"]
        };
        rows.push(Row { case: "interrupts on its CPU", expected, named: kinds(v), share_error_pts: None });
    }

    // A starved I/O thread: its cgroup's CPU limit spent by a hog (seed 001's starved I/O
    // thread, as a VMM in a quota-limited cgroup gets it): the vCPU waits on its requests
    // while the thread waits, its CPU idle.
    if let Some((truth, r, throttled)) = run_starved() {
        let io = truth.vms[0].io_thread.clone().expect("the I/O thread's report");
        let v = vm(&r, truth.vms[0].pid);
        assert_eq!(io.requests, 50);
        assert!(throttled > 0, "the group was never throttled");
        let starved = &v["causes"][0];
        assert_eq!(starved["kind"], "vmm_threads_starved", "I/O thread waited {} ns: {v}", io.wait_ns);
        let entities = starved["entities"].as_array().unwrap();
        assert!(entities.iter().any(|e| e["role"] == "io-thread"), "{starved}");
        // Held back by the limit, not by a task: its CPU idle while it waited.
        let who = entities.iter().find(|e| e["kind"] != "vmm_role").unwrap_or_else(|| panic!("{starved}"));
        assert_eq!(who["kind"], "idle_cpu", "{starved}");
        assert!(starved["fix"].as_str().unwrap().contains("cpu.max"), "{starved}");
        // At least the I/O thread's own schedstat wait (but for the requests it served before
        // the test moved it into the group), and no more than the vCPU was blocked.
        let lost = starved["lost_ns"].as_f64().unwrap();
        let blocked = v["time"]["blocked_ns"].as_f64().unwrap();
        assert!(lost >= 0.9 * io.wait_ns as f64 && lost <= blocked, "{lost} ns; I/O thread waited {} ns", io.wait_ns);
        rows.push(Row {
            case: "cgroup-starved I/O thread",
            expected: vec!["vmm_threads_starved"],
            named: kinds(v),
            share_error_pts: Some(
                vcpu_pct(v, "vmm_threads_starved").unwrap()
                    - 100.0 * io.wait_ns as f64
                        / (v["time"]["running_ns"].as_f64().unwrap()
                            + v["time"]["waiting_ns"].as_f64().unwrap()
                            + blocked),
            ),
        });
    }

    // The neighbour recorded without sched events: contention cannot be told, and is not
    // guessed.
    let (_, r) = run_case(
        "blind",
        &["--events", "kvm"],
        &["testvm", "-w", "compute", "--vms", "2", "--pin", "1", "--duration", "500ms"],
    );
    for v in r["vms"].as_array().unwrap() {
        assert!(!kinds(v).contains(&"cpu_contention".into()), "{v}");
        assert!(v["lost_ns"].is_null(), "{v}");
        let cannot = v["cannot_tell"].to_string();
        assert!(cannot.contains("sched_switch was not recorded") && cannot.contains("--events kvm,sched"), "{cannot}");
    }

    // The suite's table: precision and recall of the first-named cause.
    let (mut hits, mut named, mut expected) = (0, 0, 0);
    println!("{:<26} {:<32} {:<40} SHARE ERR", "CASE", "EXPECTED", "NAMED (ranked)");
    for row in &rows {
        let first: Vec<&String> = row.named.iter().take(row.expected.len().max(1)).collect();
        named += first.len();
        expected += row.expected.len();
        hits += row.expected.iter().filter(|e| first.iter().any(|n| n == *e)).count();
        println!(
            "{:<26} {:<32} {:<40} {}",
            row.case,
            row.expected.join(","),
            row.named.join(","),
            row.share_error_pts.map_or("-".into(), |e| format!("{e:+.1} pts"))
        );
    }
    println!("precision {hits}/{named}, recall {hits}/{expected}");
    assert_eq!(hits, expected);
}

/// A guest seen from the inside (`record --agent`, here an agent on this host over loopback,
/// its noise loop on the CPU two pinned VMs share): explain names the noise its loop measured,
/// as much as the recording's own guest layer holds, and what the agent did not send.
#[test]
fn explain_names_the_noise_a_guest_agent_measured() {
    let test = "explain_names_the_noise_a_guest_agent_measured";
    if !have_tracefs(test) {
        return;
    }
    let Some(_vms) = have_kvm(test) else { return };
    let token = super::agent::token_file("explain-agent-token");
    let port = super::agent::free_port();
    let mut agent = virtprof()
        .args(["agent", "--listen", &format!("tcp:127.0.0.1:{port}"), "--interval", "100ms", "--sessions", "1"])
        .args(["--noise", "1", "--noise-runtime", "900ms", "--token-file"])
        .arg(&token)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(500));
    let rec = temp("explain-agent.vprec");
    let exe = assert_cmd::cargo::cargo_bin("virtprof");
    let out = Command::new(&exe)
        .args(["record", "-d", "3s", "--agent", &format!("tcp:127.0.0.1:{port}"), "--agent-token-file"])
        .arg(&token)
        .arg("-o")
        .arg(&rec)
        .arg("--")
        .arg(&exe)
        .args(["testvm", "-w", "compute", "--vms", "2", "--pin", "1", "--duration", "1500ms"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(agent.wait().unwrap().success());
    let report = super::agent::report_json(&rec);
    let noise = &report["guests"][0]["noise"];
    let sum = |key: &str| noise.as_array().unwrap().iter().map(|n| n[key].as_f64().unwrap()).sum::<f64>();
    let (noise_ns, measured_ns) = (sum("noise_ns"), sum("measured_ns"));
    let out = virtprof().arg("explain").arg(&rec).arg("--json").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    let g = &r["guests"][0];
    let pct = g["noise_pct"].as_f64().unwrap();
    assert!((pct - 100.0 * noise_ns / measured_ns).abs() < 1e-6, "{pct} against {noise_ns}/{measured_ns}");
    // The loop shares CPU 1 with two busy VMs: its noise is large and named.
    if pct >= 1.0 {
        assert!(g["causes"].as_array().unwrap().iter().any(|c| c["kind"] == "guest_noise"), "{g}");
    }
    assert!(g["steal_pct"].is_number(), "the agent sends /proc/stat: {g}");
    let _ = std::fs::remove_file(&rec);
    let _ = std::fs::remove_file(&token);
}
