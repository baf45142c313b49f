//! `virtprof doctor --json`: the checks reflect this host, and the live probe's kvm event counts
//! match the probe VM's known work.

use super::util::{have_tracefs, host_kind, note, virtprof, vm_lock};

#[test]
fn doctor_json_reports_kvm_and_the_live_probe() {
    let test = "doctor_json_reports_kvm_and_the_live_probe";
    // The live probe runs micro-VMs: not beside another test's VMs (or a recording of them).
    let _vms = vm_lock();
    let out = virtprof().args(["doctor", "--json"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let check = |name: &str| report["checks"].as_array().unwrap().iter().find(|c| c["name"] == name).cloned();
    for name in ["/dev/kvm", "KVM stats fd", "perf hardware counters", "RAPL / powercap", "osnoise tracer", "tracefs"] {
        assert!(check(name).is_some(), "doctor lacks check {name}");
    }
    assert!(report["features"].as_array().unwrap().iter().any(|f| f["feature"] == "exits"));
    // kvm_stat's source is said readable only where its files read, not where the folder lists
    // (on this host most of them give EPERM).
    let debugfs = check("debugfs kvm stats").expect("the debugfs kvm check");
    let unreadable = std::fs::read_dir("/sys/kernel/debug/kvm")
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .any(|e| e.path().is_file() && std::fs::read(e.path()).is_err());
    if unreadable {
        assert_eq!(debugfs["status"], "warn", "{debugfs}");
        assert!(debugfs["detail"].as_str().unwrap().contains("kvm_stat will not work here"), "{debugfs}");
    }
    // Holding the VM lock already (above).
    if let Err(e) = std::fs::OpenOptions::new().read(true).write(true).open("/dev/kvm") {
        note(test, format!("SKIP: /dev/kvm unavailable ({e})"));
        return;
    }
    if !have_tracefs(test) {
        return;
    }
    assert_eq!(check("/dev/kvm").unwrap()["status"], "ok");
    // How near the in-kernel figures come to the trace's is said, with whether this kernel has
    // the hist triggers that would bucket on the trace's own timestamps.
    let feature = |name: &str| report["features"].as_array().unwrap().iter().find(|f| f["feature"] == name).cloned();
    let aggregation = feature("in-kernel aggregation").expect("the in-kernel aggregation feature");
    let mode = aggregation["mode"].as_str().unwrap();
    let hist = std::path::Path::new("/sys/kernel/tracing/events/kvm/kvm_exit/hist").exists();
    if check("eBPF aggregation").unwrap()["status"] == "ok" {
        let said = if hist { "this kernel has hist triggers" } else { "no hist triggers here" };
        assert!(mode.contains(said) && mode.contains("neighbouring bucket"), "{mode}");
    }
    let probe = check("kvm events in probe").expect("live probe ran");
    let detail = probe["detail"].as_str().unwrap();
    let traced = |event: &str| -> u64 {
        detail.split_whitespace().find_map(|kv| kv.strip_prefix(event)?.strip_prefix('=')?.parse().ok()).unwrap_or(0)
    };
    // Which operations exit comes from the probe VMs' own KVM stats fds in this run; the
    // tracepoints must agree with it. Each phase runs 200 times; the CPL3 VM makes 8 marker
    // PIOs (7 phases and done), the CPL0 VM 7.
    let ops = report["guest_operations"].as_array().expect("guest_operations");
    let verdict = |op: &str, cpl: u64| {
        let o = ops
            .iter()
            .find(|o| o["operation"] == op && o["cpl"] == cpl)
            .unwrap_or_else(|| panic!("no {op} at CPL{cpl} in {ops:?}"));
        let verdict = o["verdict"].as_str().unwrap();
        if verdict != "exits" {
            note(test, format!("{op} at CPL{cpl}: {verdict}: {}", o["detail"]));
        }
        verdict
    };
    // Operations KVM sees (an exit, or handled in KVM without one) fire their event once each.
    let per = |op: &str, cpl: u64| match verdict(op, cpl) {
        "exits" | "in KVM, no exit" => 200,
        "none" => 0,
        other => panic!("{op} at CPL{cpl} was not probed: {other}"),
    };
    let exits = |op: &str, cpl: u64| if verdict(op, cpl) == "exits" { 200 } else { 0 };
    let markers = 8 + 7;
    assert_eq!(
        traced("kvm_pio"),
        markers + per("PIO (OUT), VMM port", 3) + per("PIO (OUT), ioeventfd port", 3) + per("PIO (OUT), VMM port", 0),
        "{detail}"
    );
    assert_eq!(
        traced("kvm_mmio"),
        per("MMIO store, VMM address", 3) + per("MMIO store, ioeventfd address", 3),
        "{detail}"
    );
    assert_eq!(
        traced("kvm_userspace_exit"),
        markers
            + exits("PIO (OUT), VMM port", 3)
            + exits("MMIO store, VMM address", 3)
            + exits("PIO (OUT), VMM port", 0)
            + exits("HLT (no in-kernel APIC)", 0),
        "{detail}"
    );
    assert_eq!(traced("kvm_cpuid"), per("CPUID", 3) + per("CPUID", 0), "{detail}");
    assert_eq!(traced("kvm_msr"), per("RDMSR IA32_APIC_BASE", 0), "{detail}");
    // HLT with no in-kernel interrupt controller goes to the VMM on every host.
    assert_eq!(verdict("HLT (no in-kernel APIC)", 0), "exits");
    let differences = report["host_differences"].as_array().unwrap();
    let exits = check("kvm_exit/kvm_entry").unwrap();
    if host_kind() == Some(virtprof_model::HostKind::Pvm) {
        assert_eq!(exits["status"], "missing", "PVM does not emit kvm_exit");
        let said = |what: &str| differences.iter().any(|d| d.as_str().unwrap().contains(what));
        assert!(said("kvm_exit/kvm_entry never fire") && said("interpreted"), "{differences:?}");
    }
    let leftovers = std::fs::read_dir("/sys/kernel/tracing/instances")
        .map(|d| {
            d.filter_map(Result::ok).filter(|e| e.file_name().to_string_lossy().starts_with("virtprof-doctor-")).count()
        })
        .unwrap_or(0);
    assert_eq!(leftovers, 0, "doctor left its tracefs instance behind");
}
