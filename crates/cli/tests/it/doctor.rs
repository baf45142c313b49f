//! `virtprof doctor --json`: the checks reflect this host, and the live probe's kvm event counts
//! match the probe VM's known work.

use super::util::{have_kvm, have_tracefs, host_kind, note, virtprof};

#[test]
fn doctor_json_reports_kvm_and_the_live_probe() {
    let test = "doctor_json_reports_kvm_and_the_live_probe";
    let out = virtprof().args(["doctor", "--json"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let check = |name: &str| report["checks"].as_array().unwrap().iter().find(|c| c["name"] == name).cloned();
    for name in ["/dev/kvm", "KVM stats fd", "perf hardware counters", "RAPL / powercap", "osnoise tracer", "tracefs"] {
        assert!(check(name).is_some(), "doctor lacks check {name}");
    }
    assert!(report["features"].as_array().unwrap().iter().any(|f| f["feature"] == "exits"));
    let Some(_vms) = have_kvm(test) else {
        return;
    };
    if !have_tracefs(test) {
        return;
    }
    assert_eq!(check("/dev/kvm").unwrap()["status"], "ok");
    let probe = check("kvm events in probe").expect("live probe ran");
    let detail = probe["detail"].as_str().unwrap();
    let traced = |event: &str| -> u64 {
        detail.split_whitespace().find_map(|kv| kv.strip_prefix(event)?.strip_prefix('=')?.parse().ok()).unwrap_or(0)
    };
    // Which operations exit comes from the probe VM's own KVM stats fd in this run; the
    // tracepoints must agree with it. Each phase runs 200 times; the VMM makes 7 marker PIOs.
    let ops = report["guest_operations"].as_array().expect("guest_operations");
    let exits = |op: &str| {
        let o = ops.iter().find(|o| o["operation"] == op).unwrap_or_else(|| panic!("no {op} in {ops:?}"));
        match o["verdict"].as_str().unwrap() {
            "exits" => true,
            "none" => {
                note(test, format!("{op} makes no exit into KVM on this host: {}", o["detail"]));
                false
            }
            other => panic!("{op} was not probed: {other}"),
        }
    };
    let per = |op: &str| if exits(op) { 200 } else { 0 };
    assert_eq!(traced("kvm_pio"), 7 + per("PIO (OUT), VMM port") + per("PIO (OUT), ioeventfd port"), "{detail}");
    assert_eq!(traced("kvm_mmio"), per("MMIO store, VMM address") + per("MMIO store, ioeventfd address"), "{detail}");
    assert_eq!(traced("kvm_userspace_exit"), 7 + per("PIO (OUT), VMM port") + per("MMIO store, VMM address"));
    assert_eq!(traced("kvm_cpuid"), per("CPUID"), "{detail}");
    for op in ["HLT", "RDMSR/WRMSR"] {
        let o = ops.iter().find(|o| o["operation"] == op).unwrap();
        assert_eq!(o["verdict"], "not probed", "{o}");
        note(test, format!("{op} not probed: {}", o["detail"]));
    }
    let exits = check("kvm_exit/kvm_entry").unwrap();
    if host_kind() == Some(virtprof_model::HostKind::Pvm) {
        assert_eq!(exits["status"], "missing", "PVM does not emit kvm_exit");
    }
    let leftovers = std::fs::read_dir("/sys/kernel/tracing/instances")
        .map(|d| {
            d.filter_map(Result::ok).filter(|e| e.file_name().to_string_lossy().starts_with("virtprof-doctor-")).count()
        })
        .unwrap_or(0);
    assert_eq!(leftovers, 0, "doctor left its tracefs instance behind");
}
