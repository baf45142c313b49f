//! arm64 KVM hosts: exits named from arm64's own kvm_exit (exit code × exception class, the
//! class in hex), counted against a guest whose exits are known exactly (`kvm-probe`, see
//! scripts/arm64/kvm-probe.c) and against the kernel's own hist trigger. The bed
//! (scripts/arm64/bed.sh) boots Debian's arm64 kernel under QEMU TCG with EL2, and the aarch64
//! build under test records and reads exits there.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use super::util::{note, temp, virtprof, vm_lock};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../trace/tests/fixtures/arm64-6.1-debian")
}

fn exits_json(file: &Path) -> Value {
    let out = virtprof().arg("exits").arg(file).arg("--json").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// reason → (count, lightweight, heavyweight, guest idle)
fn by_reason(r: &Value) -> BTreeMap<String, (u64, u64, u64, bool)> {
    r["by_reason"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| {
            let n = |k: &str| x[k].as_u64().unwrap_or(u64::MAX);
            let (light, heavy) = (n("lightweight"), n("heavyweight"));
            (x["reason"].as_str().unwrap().to_string(), (n("count"), light, heavy, x["guest_idle"] == true))
        })
        .collect()
}

/// `mmio N hvc M ...`: what kvm-probe saw come back from KVM_RUN, and the calls it made.
fn probe_truth(text: &str) -> (u64, u64) {
    let line = text.lines().find(|l| l.starts_with("mmio ")).expect("kvm-probe's line");
    let words: Vec<&str> = line.split_whitespace().collect();
    (words[1].parse().unwrap(), words[3].parse().unwrap())
}

/// A recording the aarch64 build made on the arm64 bed: each exit named by its class in hex as
/// the architecture numbers them, counted as the probe made them, the stores to the VMM
/// heavyweight and the PSCI calls handled in the kernel lightweight.
#[test]
fn arm64_exits_are_named_by_class_in_hex_and_counted_as_the_guest_made_them() {
    let dir = fixture();
    let (mmio, hvc) = probe_truth(&std::fs::read_to_string(dir.join("probe-500.txt")).unwrap());
    let r = exits_json(&dir.join("probe-500.vprec"));
    let reasons = by_reason(&r);
    assert_eq!(reasons["DABT_LOW (EC 0x24)"], (mmio, 0, mmio, false), "{reasons:?}");
    assert_eq!(reasons["HVC64 (EC 0x16)"], (hvc, hvc, 0, false), "{reasons:?}");
    // The rest: host interrupts (IRQ) and the first touch of guest RAM (IABT_LOW), in-kernel.
    for (reason, (count, light, heavy, _)) in &reasons {
        if reason != "DABT_LOW (EC 0x24)" {
            assert_eq!((*light, *heavy), (*count, 0), "{reason}");
        }
    }
    assert!(reasons.keys().all(|k| k == "IRQ" || k.contains("(EC 0x")), "{reasons:?}");
    let text = virtprof().arg("exits").arg(dir.join("probe-500.vprec")).output().unwrap();
    assert!(String::from_utf8_lossy(&text.stdout).contains("DABT_LOW (EC 0x24)"));
}

/// What a kvm_exit was, as the kernel's `hist:keys=esr_ec,ret` and our names both tell it: a
/// trap (ret 2, ARM_EXCEPTION_TRAP) by its exception class, anything else by its exit code
/// (whose esr_ec is the last trap's, stale).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Trap(u64),
    Code(u64),
}

/// Hits per kind, from the hist file.
fn hist_counts(hist: &str) -> BTreeMap<Kind, u64> {
    let mut counts = BTreeMap::new();
    for line in hist.lines().filter(|l| l.starts_with("{ esr_ec:")) {
        let num = |key: &str| -> u64 {
            let at = line.find(key).unwrap() + key.len();
            line[at..].trim_start().split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap()
        };
        let kind = if num("ret:") == 2 { Kind::Trap(num("esr_ec:")) } else { Kind::Code(num("ret:")) };
        *counts.entry(kind).or_insert(0) += num("hitcount:");
    }
    counts
}

/// Counts per kind, from our reasons (`DABT_LOW (EC 0x24)`, `IRQ`).
fn our_counts(reasons: &BTreeMap<String, (u64, u64, u64, bool)>) -> BTreeMap<Kind, u64> {
    let codes = [("IRQ", 0), ("SERROR", 1), ("ILLEGAL", 3)];
    reasons
        .iter()
        .map(|(name, c)| {
            let kind = match name.split_once("(EC 0x") {
                Some((_, hex)) => Kind::Trap(u64::from_str_radix(hex.trim_end_matches(')'), 16).unwrap()),
                None => Kind::Code(codes.iter().find(|(n, _)| n == name).map_or(u64::MAX, |&(_, v)| v)),
            };
            (kind, c.0)
        })
        .collect()
}

/// On a live arm64 KVM host (the bed): `virtprof record` by the aarch64 build around the probe;
/// per reason, the exits it recorded equal the kernel's hist trigger over the same run and the
/// probe's own counts, and the x86-64 build reads the recording as the aarch64 one does.
#[test]
fn on_an_arm64_host_recorded_exits_equal_the_kernels_count_and_the_guests() {
    let test = "on_an_arm64_host_recorded_exits_equal_the_kernels_count_and_the_guests";
    let Some(aarch64) = std::env::var_os("VIRTPROF_AARCH64").map(PathBuf::from).filter(|p| p.exists()) else {
        note(test, "SKIP: no aarch64 build (scripts/test.sh builds one and sets VIRTPROF_AARCH64)");
        return;
    };
    let have = |program: &str| Command::new("sh").arg("-c").arg(format!("command -v {program}")).output();
    for program in ["qemu-system-aarch64", "aarch64-linux-gnu-gcc"] {
        if !have(program).is_ok_and(|o| o.status.success()) {
            note(test, format!("SKIP: the arm64 bed needs {program} (scripts/test.sh installs it)"));
            return;
        }
    }
    let _cpus = vm_lock();
    let out = temp("arm64-bed-out");
    let _ = std::fs::remove_dir_all(&out);
    let job = temp("arm64-bed.sh");
    std::fs::write(
        &job,
        r#"set -e
t=/sys/kernel/tracing/events/kvm/kvm_exit/trigger
echo 'hist:keys=esr_ec,ret' > $t
virtprof record -o /out/run.vprec -- kvm-probe 300 > /out/probe.txt 2> /out/record.txt
cat /sys/kernel/tracing/events/kvm/kvm_exit/hist > /out/hist.txt
echo '!hist:keys=esr_ec,ret' > $t
virtprof exits /out/run.vprec --json > /out/exits.json
virtprof doctor > /out/doctor.txt 2>&1 || true
"#,
    )
    .unwrap();
    let bed = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/arm64/bed.sh");
    let run = Command::new("bash")
        .arg(bed)
        .args(["run", "-t", "600"])
        .arg(&job)
        .env("VIRTPROF", &aarch64)
        .env("BED_OUT", &out)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "arm64 bed job failed ({}):\n{}\n{}",
        run.status,
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    let read = |name: &str| std::fs::read_to_string(out.join(name)).unwrap();
    let (mmio, hvc) = probe_truth(&read("probe.txt"));
    assert_eq!((mmio, hvc), (301, 300), "the probe's own count");
    let theirs = hist_counts(&read("hist.txt"));
    let inside: Value = serde_json::from_str(&read("exits.json")).unwrap();
    let ours = by_reason(&inside);
    // Every kvm_exit the kernel counted while the trigger was on, which spans the recording:
    // the host runs no other guest, so they are the probe's.
    assert_eq!(our_counts(&ours), theirs, "recorded exits per kind against the kernel's hist trigger");
    assert_eq!(ours["DABT_LOW (EC 0x24)"], (mmio, 0, mmio, false), "{ours:?}");
    assert_eq!(ours["HVC64 (EC 0x16)"], (hvc, hvc, 0, false), "{ours:?}");
    // The x86-64 build reads the arm64 recording as the aarch64 one did.
    let outside = exits_json(&out.join("run.vprec"));
    assert_eq!(by_reason(&outside), ours);
    assert_eq!(outside["totals"], inside["totals"]);
    let doctor = read("doctor.txt");
    assert!(doctor.contains("aarch64"), "{doctor}");
    let _ = std::fs::remove_dir_all(&out);
}
