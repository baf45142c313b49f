//! The test bed's counts agree with the kernel's own tracepoint counts: `perf stat -e kvm:...`
//! wrapped around the same `virtprof testvm` command.

use std::process::Command;

use super::util::{have_kvm, have_tracefs, note, parse_report};

#[test]
fn testvm_counts_equal_perf_stat_tracepoint_counts() {
    let test = "testvm_counts_equal_perf_stat_tracepoint_counts";
    let Some(_vms) = have_kvm(test) else {
        return;
    };
    if !have_tracefs(test) {
        return;
    }
    if Command::new("perf").arg("--version").output().is_err() {
        note(test, "SKIP: perf is not installed (apt-get install linux-perf)");
        return;
    }
    let exe = assert_cmd::cargo::cargo_bin("virtprof");
    let script = "pio-user:700,mmio-user:300,pio-kernel:200,mmio-kernel:100,compute:20ms";
    let csv = std::env::temp_dir().join(format!("virtprof-perf-stat-{}.csv", std::process::id()));
    let output = Command::new("perf")
        .args(["stat", "-x", ",", "-o"])
        .arg(&csv)
        .args(["-e", "kvm:kvm_pio,kvm:kvm_mmio,kvm:kvm_userspace_exit", "--"])
        .arg(&exe)
        .args(["testvm", "--workload", "phases", "--phases", script, "--vcpus", "2", "--json"])
        .output()
        .unwrap();
    let report = parse_report(&output, &[script]);
    let perf = std::fs::read_to_string(&csv).unwrap();
    let _ = std::fs::remove_file(&csv);
    let count = |event: &str| -> u64 {
        perf.lines()
            .find(|l| l.contains(event))
            .and_then(|l| l.split(',').next()?.parse().ok())
            .unwrap_or_else(|| panic!("perf stat has no count for {event}:\n{perf}"))
    };

    let vcpus: Vec<_> = report.vcpus().collect();
    let userspace: u64 = vcpus.iter().map(|v| v.userspace_exits.values().sum::<u64>()).sum();
    let io: u64 = vcpus.iter().map(|v| v.exits("IO")).sum();
    let mmio: u64 = vcpus.iter().map(|v| v.exits("MMIO")).sum();
    let markers = report.marker_io_exits_per_vcpu * vcpus.len() as u64;
    assert_eq!(io, 2 * 700 + markers);
    assert_eq!(mmio, 2 * 300);
    assert_eq!(count("kvm:kvm_userspace_exit"), userspace);
    // kvm_pio fires for every PIO, userspace-handled or ioeventfd; likewise kvm_mmio.
    assert_eq!(count("kvm:kvm_pio"), io + 2 * 200);
    assert_eq!(count("kvm:kvm_mmio"), mmio + 2 * 100);
}
