//! `virtprof stats --pid`: KVM binary stats read from another process through borrowed fds
//! equal what the VMM itself measured.

use std::io::Read;
use std::process::Stdio;
use std::time::{Duration, Instant};

use super::util::{have_kvm, note, parse_report, virtprof};

#[test]
fn stats_of_another_process_match_its_own_counts() {
    let Some(_vms) = have_kvm("stats_of_another_process_match_its_own_counts") else {
        return;
    };
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        note("stats_of_another_process_match_its_own_counts", "SKIP: pidfd_getfd needs root");
        return;
    }
    let n = 800u64;
    let args = ["testvm", "--workload", "pio-user", "-n", "800", "--vcpus", "2", "--linger", "3s", "--json"];
    let mut run = virtprof().args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let parent = run.id();

    // Find the VMM child, then poll its stats until the guests are done (values stop moving).
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut last: Option<serde_json::Value> = None;
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        let Some(vmm) = child_named(parent, "virtprof-vm") else {
            continue;
        };
        let out = virtprof().args(["stats", "--pid", &vmm.to_string(), "--json"]).output().unwrap();
        if !out.status.success() {
            continue;
        }
        let value: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let done = last.as_ref() == Some(&value);
        last = Some(value);
        if done {
            break;
        }
    }
    let remote = last.expect("read the VMM's stats while it lingered");
    let mut stdout = Vec::new();
    run.stdout.take().unwrap().read_to_end(&mut stdout).unwrap();
    let output = run.wait_with_output().unwrap();
    let report = parse_report(&std::process::Output { stdout, ..output }, &args);

    assert_eq!(remote["pid"], report.vms[0].pid);
    let vcpus = remote["vcpus"].as_array().unwrap();
    assert_eq!(vcpus.len(), 2);
    for (remote_vcpu, v) in vcpus.iter().zip(report.vcpus()) {
        assert_eq!(remote_vcpu["index"], v.index);
        // A fresh vCPU starts at zero, so the remote absolute values equal the run's deltas,
        // whatever counters this host's KVM has.
        for name in v.kvm_stats.keys().filter(|n| v.stat(n) > 0) {
            assert_eq!(remote_vcpu["stats"][name].as_u64(), Some(v.stat(name)), "stat {name} of vcpu{}", v.index);
        }
        assert!(v.stat("exits") >= n);
    }
    assert!(remote["vm"].as_object().is_some_and(|m| !m.is_empty()));
}

#[test]
fn stats_of_a_non_vmm_process_is_a_usage_error() {
    let out = virtprof().args(["stats", "--pid", &std::process::id().to_string()]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("holds no KVM VM or vCPU file descriptors"));
}

/// The pid of a child of `parent` whose comm is `name`.
fn child_named(parent: u32, name: &str) -> Option<u32> {
    let children = std::fs::read_to_string(format!("/proc/{parent}/task/{parent}/children")).ok()?;
    children
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .find(|pid: &u32| std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == name))
}
