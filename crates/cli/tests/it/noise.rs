//! `virtprof noise`: host-side measurement with attribution, and the guest-side loop in a
//! micro-VM explained by the host's trace, against the kernel's own schedstat and the VMM's
//! own counts.

use std::process::{Command, Stdio};

use super::sched::{sched_json, vcpu_row};
use super::util::{have_kvm, have_tracefs, note, temp, virtprof, vm_lock};

pub(super) fn json(args: &[&str]) -> serde_json::Value {
    let out = virtprof().args(args).output().unwrap();
    assert!(out.status.success(), "virtprof {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

/// The highest CPU this process may use (the vCPU goes there; the rest of the test elsewhere).
fn last_cpu() -> u32 {
    virtprof_host::affinity::allowed_cpus().last().copied().unwrap_or(0)
}

#[test]
fn host_noise_is_measured_attributed_and_split_by_period() {
    let test = "host_noise_is_measured_attributed_and_split_by_period";
    if !have_tracefs(test) {
        return;
    }
    let _lock = vm_lock();
    let cpu = last_cpu().to_string();
    let r = json(&["noise", "--cpus", &cpu, "--duration", "2s", "--period", "500ms", "--runtime", "400ms", "--json"]);
    let in_vm = std::fs::read_to_string("/proc/cpuinfo").unwrap().contains(" hypervisor");
    assert_eq!(r["in_vm"], in_vm, "{}", r["in_vm"]);
    assert_eq!(r["traced"], true);
    assert_eq!(r["lost_events"], 0);
    let c = &r["cpus"][0];
    let periods = c["periods"].as_array().unwrap();
    assert_eq!(periods.len(), 4, "2 s in 500 ms periods");
    let mut samples = 0;
    for p in periods {
        let runtime = p["runtime_ns"].as_u64().unwrap();
        assert!((390_000_000..=410_000_000).contains(&runtime), "runtime {runtime}");
        // Every sample's time is split over the classes, exactly.
        let by_class: u64 = p["noise_ns_by_class"].as_object().unwrap().values().map(|v| v.as_u64().unwrap()).sum();
        assert_eq!(by_class, p["noise_ns"].as_u64().unwrap(), "{p}");
        let noise = p["noise_ns"].as_f64().unwrap();
        let avail = p["available_pct"].as_f64().unwrap();
        assert!((avail - 100.0 * (1.0 - noise / runtime as f64)).abs() < 1e-6, "{p}");
        assert!(p["max_single_ns"].as_u64().unwrap() <= p["noise_ns"].as_u64().unwrap());
        for key in ["hw", "nmi", "irq", "softirq", "thread", "steal", "hyp_lw", "hyp_hw"] {
            assert!(p["counts"][key].is_u64() && p["noise_ns_by_class"][key].is_u64(), "{key} in {p}");
        }
        samples += p["samples"].as_u64().unwrap();
    }
    assert!(samples > 0, "a 1 us threshold sees some noise in 1.6 s");
    // The timer interrupt fires on every CPU: the trace explains some samples as IRQs.
    assert!(c["total"]["counts"]["irq"].as_u64().unwrap() > 0, "{}", c["total"]);
    if in_vm {
        // Inside a VM, unexplained time is virtualization, never hardware.
        assert_eq!(c["total"]["noise_ns_by_class"]["hw"], 0, "{}", c["total"]);
    } else {
        assert_eq!(c["total"]["noise_ns_by_class"]["steal"], 0, "{}", c["total"]);
    }
    let hist: u64 = c["hist"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).sum();
    assert_eq!(hist + c["hist_over"].as_u64().unwrap(), c["total"]["samples"].as_u64().unwrap());
}

#[test]
fn a_competing_thread_is_attributed_and_stop_single_saves_a_snapshot() {
    let test = "a_competing_thread_is_attributed_and_stop_single_saves_a_snapshot";
    if !have_tracefs(test) {
        return;
    }
    let _lock = vm_lock();
    let cpu = last_cpu().to_string();
    // A CPU hog at the same priority shares the CPU: the loop loses time slices to it.
    let mut hog = Command::new("taskset").args(["-c", &cpu, "sh", "-c", "while :; do :; done"]).spawn().unwrap();
    let snapshot = temp("noise-stop.txt");
    let r = json(&[
        "noise",
        "--cpus",
        &cpu,
        "--duration",
        "3s",
        "--stop-single",
        "1ms",
        "--snapshot",
        snapshot.to_str().unwrap(),
        "--json",
    ]);
    hog.kill().unwrap();
    let _ = hog.wait();
    let stop = &r["stopped"];
    assert!(stop["len_ns"].as_u64().unwrap() > 1_000_000, "{stop}");
    assert!(stop["noise_ns_by_class"]["thread"].as_u64().unwrap() > 500_000, "the hog explains it: {stop}");
    let text = std::fs::read_to_string(&snapshot).unwrap();
    assert!(text.contains("sched_switch") && text.lines().any(|l| l.starts_with('*')), "{text}");
    let runtime: u64 =
        r["cpus"][0]["periods"].as_array().unwrap().iter().map(|p| p["runtime_ns"].as_u64().unwrap()).sum();
    assert!(runtime < 3_000_000_000, "stopped early: {runtime}");
}

#[test]
fn guest_steal_equals_schedstat_wait_and_the_host_explains_it() {
    let test = "guest_steal_equals_schedstat_wait_and_the_host_explains_it";
    let Some(_lock) = have_kvm(test) else { return };
    if !have_tracefs(test) {
        return;
    }
    let cpu = last_cpu().to_string();
    let mut hog = Command::new("taskset")
        .args(["-c", &cpu, "sh", "-c", "while :; do :; done"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let stolen_before = stolen_from_this_machine_ns(&cpu);
    let r = json(&["noise", "--testvm", "--pin", &cpu, "--duration", "2s", "--json"]);
    let stolen_below = stolen_from_this_machine_ns(&cpu).saturating_sub(stolen_before);
    hog.kill().unwrap();
    let _ = hog.wait();
    let steal = r["guest"]["steal_ns"].as_f64().unwrap();
    let wait = r["schedstat_wait_ns"].as_f64().unwrap();
    assert!(steal > 0.2e9, "the hog takes a large share of the vCPU's CPU: steal {steal}");
    assert!((steal - wait).abs() <= 0.02 * wait, "guest steal {steal} vs schedstat wait {wait}");
    // The host trace sees the same preemption, and names the hog.
    let host = r["host_steal_ns"].as_f64().unwrap();
    assert!((host - steal).abs() <= 0.02 * steal, "host trace {host} vs guest {steal}");
    let (who, ns) = r["preemptors"].as_object().unwrap().iter().max_by_key(|(_, v)| v.as_u64().unwrap()).unwrap();
    assert_eq!(who, "sh", "{ns}");
    assert_eq!(r["lost_events"], 0);
    // What the host trace cannot see: this machine's own hypervisor taking the CPU (the guest
    // sees a gap, the host no event). 99.4-99.6 % here alone or beside CPU and memory hogs;
    // CI measured 94.8 % and 94.5 % while QEMU TCG beds and other tests loaded the other CPU
    // (the second: 18 000 gaps of 3 us on average, none on the steal clock). Allowed: 10 % of
    // the noise plus what the machine's steal clock says was taken from this CPU; below 95 %
    // it is noted.
    let (explained, noise) = (r["explained_pct"].as_f64().unwrap(), r["guest"]["noise_ns"].as_f64().unwrap());
    let unexplained = r["by_cause"]["unexplained"]["ns"].as_f64().unwrap_or(0.0);
    assert!(
        explained >= 90.0 || unexplained <= 0.10 * noise + stolen_below as f64,
        "explained {explained} %: unexplained {unexplained} ns of {noise}, {stolen_below} ns stolen from this machine; {}",
        r["by_cause"]
    );
    if explained < 95.0 {
        note(
            test,
            format!("explained {explained:.1} %; this machine's hypervisor took {stolen_below} ns of CPU {cpu}"),
        );
    }
    assert!(r["clock"]["bound_ns"].as_u64().unwrap() < 50_000, "{}", r["clock"]);
}

/// Time this machine's own hypervisor has taken from `cpu` (the steal column of /proc/stat,
/// in clock ticks), in nanoseconds; 0 where it is not told.
fn stolen_from_this_machine_ns(cpu: &str) -> u64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let line = stat.lines().find(|l| l.split_whitespace().next() == Some(&format!("cpu{cpu}")));
    // SAFETY: sysconf has no preconditions.
    let hz = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).unwrap_or(100).max(1);
    let ticks = line.and_then(|l| l.split_whitespace().nth(8)).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    ticks * (1_000_000_000 / hz)
}

#[test]
fn injected_heavyweight_exits_show_up_as_hyp_samples_at_their_count() {
    let test = "injected_heavyweight_exits_show_up_as_hyp_samples_at_their_count";
    let Some(_lock) = have_kvm(test) else { return };
    if !have_tracefs(test) {
        return;
    }
    let cpu = last_cpu().to_string();
    let r = json(&["noise", "--testvm", "--pin", &cpu, "--duration", "2s", "--inject-hz", "100", "--json"]);
    // How many kicks land inside the loop depends on how the host schedules the kicking thread
    // (a loaded host delays some); what must hold is that each one that landed is seen once by
    // every witness below.
    let injected = r["injected"].as_u64().unwrap();
    assert!((1..=210).contains(&injected), "100 Hz for 2 s: {injected}");
    if injected < 190 {
        note(test, format!("only {injected} of ~200 kicks landed inside the loop (a loaded host)"));
    }
    // Every kick lands in exactly one guest sample, seen by the guest's counter and by the
    // host's kvm_userspace_exit (reason KVM_EXIT_INTR).
    assert_eq!(r["guest"]["hw_exit_samples"], injected, "{}", r["guest"]);
    assert_eq!(r["guest"]["hw_exits"], injected);
    assert_eq!(r["by_cause"]["hyp_hw"]["samples"], injected, "{}", r["by_cause"]);
    assert_eq!(r["exit_reasons"]["KVM_EXIT_INTR"], injected, "{}", r["exit_reasons"]);
}

#[test]
fn noise_usage_errors_exit_2() {
    for (args, needle) in [
        (&["noise", "--threshold", "fast"][..], "--threshold"),
        (&["noise", "--cpus", "999"], "not online"),
        (&["noise", "--period", "1s", "--runtime", "2s"], "longer than --period"),
        (&["noise", "--testvm", "--hist"], "drop them with --testvm"),
        (&["noise", "--no-trace", "--stop-single", "1ms"], "cannot be used with"),
        (&["noise", "--probe", "rdtsc"], "cpuid, or inb:PORT"),
        (&["noise", "--probe", "inb:0x10000"], "0x10000"),
        (&["noise", "--probe", "cpuid", "--testvm"], "cannot be used with"),
        (&["agent", "--noise-probe", "cpuid"], "--noise"),
    ] {
        let out = virtprof().args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}

#[test]
fn without_a_trace_samples_are_counted_but_not_attributed() {
    let test = "without_a_trace_samples_are_counted_but_not_attributed";
    if !have_tracefs(test) {
        return;
    }
    let _lock = vm_lock();
    let cpu = last_cpu().to_string();
    let r = json(&["noise", "--cpus", &cpu, "--duration", "500ms", "--no-trace", "--json"]);
    assert_eq!(r["traced"], false);
    let total = &r["cpus"][0]["total"];
    let rest = if r["in_vm"] == true { "hyp" } else { "hw" };
    // Untraced, a sample is steal where the steal clock says so (it needs no trace; this
    // machine is itself a guest whose host may be busy), and unexplained otherwise: the one
    // class holds all the rest.
    let sum = |what: &str| total[what][rest].as_u64().unwrap() + total[what]["steal"].as_u64().unwrap();
    assert_eq!(sum("noise_ns_by_class"), total["noise_ns"].as_u64().unwrap(), "{total}");
    assert_eq!(sum("counts"), total["samples"].as_u64().unwrap(), "{total}");
}

/// Inside a QEMU TCG guest running Debian's kernel (the guest's init runs the test's own
/// binary and powers off): the command works there, sees it is in a VM, and traces that
/// kernel.
#[test]
fn noise_runs_inside_a_qemu_tcg_debian_guest() {
    let test = "noise_runs_inside_a_qemu_tcg_debian_guest";
    let Some(dir) = super::util::debian_kernel(test) else { return };
    let _lock = vm_lock();
    let initrd = temp("noise-guest.cpio");
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/debian-kernel/guest-initrd.sh");
    let built =
        Command::new("bash").arg(&script).arg(assert_cmd::cargo::cargo_bin("virtprof")).arg(&initrd).output().unwrap();
    assert!(built.status.success(), "guest-initrd.sh: {}", String::from_utf8_lossy(&built.stderr));
    let command = "/virtprof noise --cpus 1 --duration 1s --period 500ms --threshold 20us --json";
    // One host thread for both vCPUs: with a thread each (MTTCG), two CI runs under load saw the
    // guest lock up as virtprof enabled its tracepoints (CPU 0 stuck in virtprof for 250 s,
    // CPU 1 stuck in its idle task with its timers dead): the cross-vCPU code patching that
    // enabling a tracepoint does is where multi-threaded TCG went wrong.
    let out = Command::new("timeout")
        .args(["300", "qemu-system-x86_64", "-accel", "tcg,thread=single", "-cpu", "max", "-smp", "2", "-m", "1G"])
        .args(["-nographic", "-no-reboot", "-net", "none", "-kernel"])
        .arg(dir.join("vmlinuz"))
        .arg("-initrd")
        .arg(&initrd)
        .args(["-append", &format!("console=ttyS0 quiet -- {command}")])
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&initrd);
    let console = String::from_utf8_lossy(&out.stdout);
    let body = console
        .split_once("VIRTPROF-RUN-BEGIN")
        .and_then(|(_, rest)| rest.split_once("VIRTPROF-RUN-END status=0"))
        .unwrap_or_else(|| panic!("no successful run on the guest console:\n{console}"))
        .0;
    // The serial console turns \n into \r\n.
    let r: serde_json::Value = serde_json::from_str(&body.replace('\r', "")).unwrap();
    assert_eq!(r["in_vm"], true, "QEMU sets the hypervisor CPUID bit");
    assert_eq!(r["traced"], true, "the guest kernel's tracefs");
    assert_eq!(r["own_cpus"], serde_json::json!([0]), "virtprof's own threads stay off CPU 1");
    let c = &r["cpus"][0];
    assert_eq!(c["cpu"], 1);
    let periods = c["periods"].as_array().unwrap();
    assert_eq!(periods.len(), 2, "1 s in 500 ms periods");
    for p in periods {
        let split: u64 = p["noise_ns_by_class"].as_object().unwrap().values().map(|v| v.as_u64().unwrap()).sum();
        assert_eq!(split, p["noise_ns"].as_u64().unwrap(), "{p}");
        assert!(p["runtime_ns"].as_u64().unwrap() > 400_000_000, "{p}");
    }
    // The guest kernel's timer interrupts land in the trace and explain samples.
    assert!(c["total"]["counts"]["irq"].as_u64().unwrap() > 0, "{}", c["total"]);
}

/// A guest run recorded by `virtprof record` and explained afterwards gives the same exact
/// counts as the live `--testvm` path: every kick is one guest sample with a heavyweight exit
/// and one host `hyp_hw` sample.
#[test]
fn a_recorded_guest_run_is_explained_from_the_host_recording() {
    let test = "a_recorded_guest_run_is_explained_from_the_host_recording";
    let Some(_lock) = have_kvm(test) else { return };
    if !have_tracefs(test) {
        return;
    }
    let cpu = last_cpu().to_string();
    let (rec, guest) = (temp("noise-host.vprec"), temp("noise-guest.json"));
    let exe = assert_cmd::cargo::cargo_bin("virtprof");
    let out = virtprof()
        .args(["record", "-o"])
        .arg(&rec)
        .args(["--", exe.to_str().unwrap(), "testvm", "-w", "noise", "--pin", &cpu, "--duration", "1s"])
        .args(["--inject-hz", "100", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    std::fs::write(&guest, &out.stdout).unwrap();
    let (rec_s, guest_s) = (rec.to_str().unwrap(), guest.to_str().unwrap());
    let r = json(&["noise", "--host-recording", rec_s, "--guest", guest_s, "--json"]);
    let injected = r["injected"].as_u64().unwrap();
    assert!((1..=105).contains(&injected), "100 Hz for 1 s: {injected}");
    if injected < 90 {
        note(test, format!("only {injected} of ~100 kicks landed inside the loop (a loaded host)"));
    }
    assert_eq!(r["guest"]["hw_exit_samples"], injected, "{}", r["guest"]);
    assert_eq!(r["by_cause"]["hyp_hw"]["samples"], injected, "{}", r["by_cause"]);
    assert_eq!(r["exit_reasons"]["KVM_EXIT_INTR"], injected, "{}", r["exit_reasons"]);
    assert_eq!(r["inject_hz"], serde_json::Value::Null, "a recording does not say the rate");
    assert_eq!(r["lost_events"], 0);
    // The guest's steal equals the vCPU thread's schedstat wait over the loop (both are the
    // host scheduler's run_delay), but for the loop's edges: KVM updates the guest's steal
    // record when it enters the guest, and the VMM reads schedstat at the sync exits around
    // the loop, so a wait between the VMM's read and the guest's first (or last) look at its
    // record is in schedstat's figure only. Each edge holds at most one wait, no longer than
    // the longest the recording shows for the thread.
    let (steal, wait) = (r["guest"]["steal_ns"].as_f64().unwrap(), r["schedstat_wait_ns"].as_f64().unwrap());
    let tid = u32::try_from(r["vcpu_tid"].as_u64().unwrap()).unwrap();
    let longest_wait = vcpu_row(&sched_json(&rec, &[]), tid)["wait_max_us"].as_f64().unwrap_or(0.0) * 1e3;
    let slack = 0.02 * wait.max(1e6);
    assert!(steal <= wait + slack, "guest steal {steal} is more than schedstat wait {wait}");
    assert!(
        wait - steal <= slack + 2.0 * longest_wait,
        "guest steal {steal} vs schedstat wait {wait} (the thread's longest wait: {longest_wait} ns)"
    );
    // The same report moved 1000 s later (another run's) is refused: no host event can explain it.
    let mut moved: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for point in moved["vms"][0]["vcpus"][0]["noise"]["sync"].as_array_mut().unwrap() {
        for key in ["before_ns", "after_ns"] {
            point[key] = serde_json::json!(point[key].as_u64().unwrap() + 1_000_000_000_000);
        }
    }
    std::fs::write(&guest, serde_json::to_vec(&moved).unwrap()).unwrap();
    let other = virtprof().args(["noise", "--host-recording", rec_s, "--guest", guest_s]).output().unwrap();
    let stderr = String::from_utf8_lossy(&other.stderr);
    assert_eq!(other.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("they are from different runs"), "{stderr}");
    // A report that is not testvm's is refused with exit 2, naming the file.
    let bad = virtprof().args(["noise", "--host-recording", rec_s, "--guest", rec_s]).output().unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--guest"), "{}", String::from_utf8_lossy(&bad.stderr));
    let _ = std::fs::remove_file(&rec);
    let _ = std::fs::remove_file(&guest);
}
