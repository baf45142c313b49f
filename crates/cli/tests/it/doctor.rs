//! `virtprof doctor --json`: the checks reflect this host, and the live probe's kvm event counts
//! match the probe VM's known work.

use super::util::{have_kvm, have_tracefs, host_kind, virtprof};

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
    // The probe VM runs pio-user:200, mmio-user:200, pio-kernel:200, cpuid:200 (+5 markers).
    assert!(detail.contains("kvm_pio=405"), "{detail}");
    assert!(detail.contains("kvm_mmio=200"), "{detail}");
    assert!(detail.contains("kvm_userspace_exit=405"), "{detail}");
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
