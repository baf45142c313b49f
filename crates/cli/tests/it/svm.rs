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
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "L1 job failed ({}):\n{log}\n{err}", run.status);
    if let Some(line) = err.lines().find(|l| l.contains("running the job again")) {
        note(test, line);
    }
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

/// The testvm workloads run at CPL3 and what their loop makes on VMX/SVM.
const WORKLOADS: [&str; 6] = ["pio-user", "pio-kernel", "mmio-user", "mmio-kernel", "cpuid", "io-bound"];

#[test]
fn on_kvm_amd_every_testvm_workload_is_counted_exactly_and_its_time_adds_up() {
    let test = "on_kvm_amd_every_testvm_workload_is_counted_exactly_and_its_time_adds_up";
    // Per workload: the kernel's hist triggers (exits by reason, userspace exits) around a
    // recorded run, then every view of that recording. Then live `exits --duration` around a
    // run, with the hist around it too.
    let job = format!(
        r#"
set -e
T=/sys/kernel/tracing
H=$T/events/kvm
cp $H/kvm_exit/format /out/format
hist() {{
    echo "$1hist:keys=exit_reason" > $H/kvm_exit/trigger
    echo "$1hist:keys=common_pid" > $H/kvm_userspace_exit/trigger
}}
for w in {workloads}; do
    n=200; [ $w = io-bound ] && n=50
    mkdir -p /out/$w
    hist ""
    virtprof record -o /tmp/$w.vprec -- virtprof testvm -w $w -n $n --json > /out/$w/testvm.json
    cat $H/kvm_exit/hist > /out/$w/hist
    cat $H/kvm_userspace_exit/hist > /out/$w/uhist
    hist "!"
    virtprof exits /tmp/$w.vprec --json --noise > /out/$w/exits.json
    virtprof exits /tmp/$w.vprec --json --by vcpu > /out/$w/by_vcpu.json
    virtprof exits /tmp/$w.vprec --json --by vm > /out/$w/by_vm.json
done
virtprof sched /tmp/io-bound.vprec --json > /out/sched.json
virtprof report /tmp/pio-user.vprec --json > /out/report.json
mkdir -p /out/live
hist ""
virtprof exits --duration 6s --json > /out/live/exits.json &
sleep 2
virtprof testvm -w pio-user -n 200 > /dev/null
wait
cat $H/kvm_exit/hist > /out/live/hist
cat $H/kvm_userspace_exit/hist > /out/live/uhist
hist "!"
ls $T/instances > /out/instances
"#,
        workloads = WORKLOADS.join(" ")
    );
    let Some(out) = in_l1(test, &job) else { return };
    let read = |name: &str| std::fs::read_to_string(out.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    let json = |name: &str| -> Value { serde_json::from_str(&read(name)).unwrap() };
    let names = exit_names(&read("format"));
    let kernel = |dir: &str| -> BTreeMap<String, u64> {
        hist_counts(&read(&format!("{dir}/hist")))
            .into_iter()
            .map(|(code, n)| (names.get(&code).cloned().unwrap_or_else(|| format!("0x{code:x}")), n))
            .collect()
    };
    let userspace_exits = |dir: &str| -> u64 {
        read(&format!("{dir}/uhist"))
            .lines()
            .filter_map(|l| l.split("hitcount:").nth(1)?.trim().parse::<u64>().ok())
            .sum()
    };
    let per_reason = |exits: &Value| -> BTreeMap<String, u64> {
        exits["by_reason"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| (r["reason"].as_str().unwrap().to_string(), r["count"].as_u64().unwrap()))
            .collect()
    };

    for w in WORKLOADS {
        let exits = json(&format!("{w}/exits.json"));
        let totals = &exits["totals"];
        assert_eq!(exits["source"]["path"], "kvm_exit", "{w}");
        assert_eq!(exits["lost_events"], 0, "{w}: {}", exits["loss"]);
        // Exact per reason: every kvm_exit the kernel counted, and no other.
        assert_eq!(per_reason(&exits), kernel(w), "{w}: virtprof exits vs the kernel's hist trigger");
        // Heavyweight exits are the exits that went to the VMM: its userspace exits.
        assert_eq!(
            totals["heavyweight"].as_u64().unwrap(),
            userspace_exits(w),
            "{w}: heavyweight vs kvm_userspace_exit"
        );
        // The by-vCPU and by-VM tables hold every exit the totals hold (in flight ones too).
        let all = totals["exits"].as_u64().unwrap();
        for (by, list) in [("by_vcpu", "by_vcpu"), ("by_vm", "by_vm")] {
            let grouped = json(&format!("{w}/{by}.json"));
            let sum: u64 = grouped[list].as_array().unwrap().iter().map(|r| r["exits"].as_u64().unwrap()).sum();
            assert_eq!(sum, all, "{w}: {by} sums to the totals");
        }
        // Each exit's time splits into parts that add up to it: none overlaps another.
        let rows = exits["rows"].as_array().unwrap();
        assert!(rows.len() as u64 + totals["incomplete"].as_u64().unwrap() >= all, "{w}: a row per timed exit");
        for r in rows {
            let part = |k: &str| r[k].as_u64().unwrap();
            let parts = part("overhead_ns") + part("vmm_ns") + part("preempted_ns") + part("blocked_ns");
            assert_eq!(parts, part("duration_ns"), "{w}: parts of {r}");
        }
    }
    // io-bound blocks in its VMM: that time is blocked, not the VMM's.
    let io = json("io-bound/exits.json");
    let io_row = io["by_reason"].as_array().unwrap().iter().find(|r| r["reason"] == "io").unwrap().clone();
    let (vmm, blocked, total) = (
        io_row["vmm_ns"].as_u64().unwrap(),
        io_row["blocked_ns"].as_u64().unwrap(),
        io_row["total_ns"].as_u64().unwrap(),
    );
    assert!(blocked > 0 && vmm + blocked <= total, "io-bound io exits: vmm {vmm} + blocked {blocked} of {total}");

    // sched sees the io-bound vCPU block; report agrees with exits on the same recording.
    let sched = json("sched.json");
    let vcpu = &sched["windows"][0]["vms"][0]["vcpus"][0];
    assert!(vcpu["blocked_pct"].as_f64().unwrap() > 0.0 && vcpu["running_pct"].as_f64().unwrap() > 0.0, "{vcpu}");
    let report = json("report.json");
    let pio = json("pio-user/exits.json");
    assert_eq!(report["exits"]["totals"]["exits"], pio["totals"]["exits"], "report vs exits");
    assert_eq!(report["lost_events"], 0);

    // Live: every exit of the testvm run inside the window, per reason, as the kernel counted.
    let live = json("live/exits.json");
    assert_eq!(live["lost_events"], 0, "{}", live["loss"]);
    assert_eq!(per_reason(&live), kernel("live"), "live exits --duration vs the kernel's hist trigger");
    assert_eq!(live["totals"]["heavyweight"].as_u64().unwrap(), userspace_exits("live"));
    assert_eq!(read("instances").trim(), "", "no tracefs instance left in L1");
    note(test, format!("kvm_amd in L1: io-bound io exits: vmm {vmm} ns + blocked {blocked} ns of {total} ns"));
}
