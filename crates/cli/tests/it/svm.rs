//! virtprof live on a real kvm_amd host: the nested-SVM test bed (`scripts/nested-svm/bed.sh`)
//! boots Debian's kernel under QEMU TCG with emulated SVM, and the build under test runs there.
//! Ground truth comes from the same run: the kernel's own hist trigger on kvm_exit, keyed by
//! exit code, named through the kvm_exit format's print table.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use super::util::{note, temp};

/// Run `job` (a shell script) in L1; its /out comes back in the returned folder.
fn in_l1(test: &str, job: &str) -> Option<PathBuf> {
    let have = |program: &str| Command::new("sh").arg("-c").arg(format!("command -v {program}")).output();
    for program in ["qemu-system-x86_64", "busybox", "apt-get"] {
        if !have(program).is_ok_and(|o| o.status.success()) {
            note(test, format!("SKIP: the nested-SVM bed needs {program} (scripts/test.sh installs it)"));
            return None;
        }
    }
    let out = temp(&format!("{test}-out"));
    let _ = std::fs::remove_dir_all(&out);
    let script = temp(&format!("{test}.sh"));
    std::fs::write(&script, job).unwrap();
    let bed = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/nested-svm/bed.sh");
    let run = Command::new("bash")
        .arg(bed)
        .args(["run", "-t", "600"])
        .arg(&script)
        .env("VIRTPROF", env!("CARGO_BIN_EXE_virtprof"))
        .env("BED_OUT", &out)
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "L1 job failed ({}):\n{log}\n{}", run.status, String::from_utf8_lossy(&run.stderr));
    Some(out)
}

/// exit code → name, from the print table of a kvm_exit format file (`{ 0x07b, "io" }`).
fn exit_names(format: &str) -> BTreeMap<u64, String> {
    let mut names = BTreeMap::new();
    let mut rest = format;
    while let Some(open) = rest.find("{ ") {
        rest = &rest[open + 2..];
        let Some(close) = rest.find(" }") else { break };
        if let Some((code, name)) = rest[..close].split_once(", \"") {
            let code = code.trim();
            let code = code.strip_prefix("0x").map_or_else(|| code.parse().ok(), |h| u64::from_str_radix(h, 16).ok());
            if let (Some(code), Some(name)) = (code, name.strip_suffix('"')) {
                names.insert(code, name.to_string());
            }
        }
    }
    names
}

/// `{ exit_reason: 123 } hitcount: 45` lines of a hist file.
fn hist_counts(hist: &str) -> BTreeMap<u64, u64> {
    hist.lines()
        .filter_map(|l| {
            let key = l.split("exit_reason:").nth(1)?.split('}').next()?.trim().parse().ok()?;
            let count = l.split("hitcount:").nth(1)?.split_whitespace().next()?.parse().ok()?;
            Some((key, count))
        })
        .collect()
}

#[test]
fn on_kvm_amd_doctor_sees_svm_and_recorded_exits_equal_the_kernels_count() {
    let test = "on_kvm_amd_doctor_sees_svm_and_recorded_exits_equal_the_kernels_count";
    // The hist is read before its trigger is removed (removing it drops the counts).
    let job = r#"
set -e
T=/sys/kernel/tracing
virtprof doctor --json > /out/doctor.json
cp $T/events/kvm/kvm_exit/format /out/format
echo 'hist:keys=exit_reason' > $T/events/kvm/kvm_exit/trigger
virtprof record -o /tmp/r.vprec -- virtprof testvm -w phases --phases pio-user:300,cpuid:300,mmio-user:200 --json > /out/testvm.json
cat $T/events/kvm/kvm_exit/hist > /out/hist
echo '!hist:keys=exit_reason' > $T/events/kvm/kvm_exit/trigger
virtprof exits /tmp/r.vprec --json > /out/exits.json
ls $T/instances > /out/instances
"#;
    let Some(out) = in_l1(test, job) else { return };
    let read = |name: &str| std::fs::read_to_string(out.join(name)).unwrap();

    let doctor: Value = serde_json::from_str(&read("doctor.json")).unwrap();
    let text = doctor.to_string();
    assert!(text.contains("\"svm\""), "doctor names the host kind svm: {text}");
    assert!(text.contains("kvm_exit") && text.contains("emitted"), "kvm_exit fires on kvm_amd: {text}");

    // Every exit the kernel counted while recording is in the recording, per reason.
    let names = exit_names(&read("format"));
    let kernel: BTreeMap<String, u64> = hist_counts(&read("hist"))
        .into_iter()
        .map(|(code, n)| (names.get(&code).cloned().unwrap_or_else(|| format!("0x{code:x}")), n))
        .collect();
    assert!(!kernel.is_empty(), "the hist trigger counted exits:\n{}", read("hist"));
    let exits: Value = serde_json::from_str(&read("exits.json")).unwrap();
    let ours: BTreeMap<String, u64> = exits["by_reason"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["reason"].as_str().unwrap().to_string(), r["count"].as_u64().unwrap()))
        .collect();
    assert_eq!(exits["lost_events"], 0, "{}", exits["loss"]);
    assert_eq!(ours, kernel, "per-reason kvm_exit counts: virtprof exits vs the kernel's hist trigger");
    assert!(kernel.get("io").copied().unwrap_or(0) >= 300, "{kernel:?}");
    assert!(kernel.get("cpuid").copied().unwrap_or(0) >= 300, "{kernel:?}");
    assert_eq!(read("instances").trim(), "", "no tracefs instance left in L1");
    note(test, format!("kvm_amd in L1: per-reason exits {ours:?}"));
}
