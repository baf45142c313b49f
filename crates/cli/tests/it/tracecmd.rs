//! Files made by trace-cmd itself, of every kind it writes: versions 6 and 7, zlib, zstd and
//! uncompressed, several buffers, kvm_amd and VMX exits. Each is checked against trace-cmd's
//! own reading of the same file (`trace-cmd report`) and against ground truth. trixie's
//! trace-cmd 3.3 (zlib-capable; `scripts/trace-cmd/fetch.sh`, run by scripts/test.sh) writes
//! the variants; bookworm's 3.1 reads the ones it can.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use super::exits::exits_json;
use super::util::{have_kvm, have_tracefs, note, parse_report, temp, virtprof};
use virtprof_model::testvm::TestvmReport;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// trixie's trace-cmd, if fetched; otherwise say why `test` skips.
fn trace_cmd_33(test: &str) -> Option<PathBuf> {
    let path = workspace().join("target/trace-cmd-trixie/trace-cmd");
    let works = Command::new(&path).args(["list", "-c"]).output().is_ok_and(|o| o.status.success());
    if !works {
        note(test, "SKIP: needs target/trace-cmd-trixie (bash scripts/trace-cmd/fetch.sh target/trace-cmd-trixie)");
        return None;
    }
    Some(path)
}

fn run5() -> PathBuf {
    workspace().join("crates/trace/tests/fixtures/kvm-amd-run5_tracecmd_2vcpu_pinned/trace.dat")
}

/// `trace-cmd convert` of `src` into `dst` with `args`; panics with its stderr.
fn convert(trace_cmd: &Path, src: &Path, dst: &Path, args: &[&str]) {
    let out = Command::new(trace_cmd).arg("convert").args(args).arg("-i").arg(src).arg("-o").arg(dst).output().unwrap();
    assert!(out.status.success(), "trace-cmd convert {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// Events per name in `trace-cmd report` (the word before the first ": " after the
/// timestamp), and all events.
fn report_counts(trace_cmd: &Path, file: &Path) -> BTreeMap<String, u64> {
    let out = Command::new(trace_cmd).args(["report", "-i"]).arg(file).output().unwrap();
    assert!(out.status.success(), "trace-cmd report {}: {}", file.display(), String::from_utf8_lossy(&out.stderr));
    let mut counts = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        // `comm-pid [cpu] ts: name: fields`; with several buffers, lines start `buffer: `.
        let Some((_, rest)) = line.split_once("] ") else { continue };
        let Some((_, rest)) = rest.split_once(": ") else { continue };
        let name = rest.split(':').next().unwrap_or_default().trim().to_string();
        *counts.entry(name).or_insert(0) += 1;
        *counts.entry("(all)".to_string()).or_insert(0) += 1;
    }
    counts
}

fn reason_counts(r: &serde_json::Value) -> BTreeMap<String, u64> {
    r["by_reason"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| (x["reason"].as_str().unwrap().into(), x["count"].as_u64().unwrap()))
        .collect()
}

/// The kvm_amd capture (trace-cmd 3.1, v7 zstd) as trace-cmd 3.3 rewrites it: version 6,
/// zlib, zstd and uncompressed. Every variant holds the events trace-cmd reads from the
/// original (convert has been seen to drop CPU 0's events), and virtprof reads each exactly
/// as it reads the original: the same exits, reason by reason, vCPU by vCPU.
#[test]
fn every_kind_of_trace_dat_trace_cmd_writes_reads_the_same() {
    let test = "every_kind_of_trace_dat_trace_cmd_writes_reads_the_same";
    let Some(trace_cmd) = trace_cmd_33(test) else { return };
    let dir = temp("tracedat-kinds");
    std::fs::create_dir_all(&dir).unwrap();
    let original = run5();
    let truth = report_counts(&trace_cmd, &original);
    assert_eq!(truth["kvm_exit"], 2444, "the fixture's own count");
    let want = exits_json(&original, &[]);
    let variants: [(&str, &[&str]); 4] = [
        ("v6.dat", &["--file-version", "6"]),
        ("zlib.dat", &["--compression", "zlib"]),
        ("zstd.dat", &["--compression", "zstd"]),
        ("none.dat", &["--compression", "none"]),
    ];
    for (name, args) in variants {
        let file = dir.join(name);
        convert(&trace_cmd, &original, &file, args);
        assert_eq!(report_counts(&trace_cmd, &file), truth, "{name}: trace-cmd reads other events than the original");
        let got = exits_json(&file, &[]);
        assert_eq!(got["by_reason"], want["by_reason"], "{name}");
        assert_eq!(got["by_vcpu"], want["by_vcpu"], "{name}");
        assert_eq!(got["totals"], want["totals"], "{name}");
        assert_eq!(got["source"]["events"]["kvm_exit"].as_u64(), Some(truth["kvm_exit"]), "{name}");
        // Read without a warning: a version 6 file that does not name its clock is not damaged.
        let clean = virtprof().arg("exits").arg(&file).output().unwrap();
        assert_eq!(String::from_utf8_lossy(&clean.stderr), "", "{name}");
        let version = if name == "v6.dat" { "6" } else { "7" };
        let whole = std::fs::read(&file).unwrap();
        assert_eq!(&whole[10..11], version.as_bytes(), "{name}: convert wrote another version");
        // Cut anywhere, each is bad input named by its byte: exit 2, never a panic or a hang.
        for cut in [20, whole.len() / 3, whole.len() - 100] {
            let short = dir.join(format!("cut-{cut}-{name}"));
            std::fs::write(&short, &whole[..cut]).unwrap();
            let out = virtprof().arg("exits").arg(&short).output().unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{name} cut at {cut}: {stderr}");
            assert!(stderr.contains("trace.dat at byte"), "{name} cut at {cut}: {stderr}");
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// Records made here by trace-cmd itself (`record -B` makes two buffers in one file) of
/// testvm VMs with known exits: every variant of the file gives testvm's exit counts per
/// vCPU, the kvm events trace-cmd reads, and the VMs as they were (two, of two vCPUs each,
/// found from the threads that made them; a trace.dat has no tgids).
#[test]
fn a_trace_cmd_recording_with_two_buffers_matches_trace_cmd_and_the_vms() {
    let test = "a_trace_cmd_recording_with_two_buffers_matches_trace_cmd_and_the_vms";
    let Some(trace_cmd) = trace_cmd_33(test) else { return };
    if !have_tracefs(test) {
        return;
    }
    let Some(_vms) = have_kvm(test) else { return };
    let dir = temp("tracedat-record");
    std::fs::create_dir_all(&dir).unwrap();
    let recorded = dir.join("record.dat");
    let exe = assert_cmd::cargo::cargo_bin("virtprof");
    let args = ["testvm", "-w", "pio-user", "--vms", "2", "--vcpus", "2", "-n", "300", "--json"];
    let out = Command::new("bash")
        .arg(workspace().join("scripts/trace-cmd/record.sh"))
        .arg(workspace().join("target/trace-cmd-trixie"))
        .arg(&recorded)
        .args(["-e", "kvm", "-e", "sched:sched_switch", "-e", "sched:sched_process_fork", "-B", "second", "-e", "irq"])
        .args(["-e", "sched:sched_wakeup", "--"])
        .arg(&exe)
        .args(args)
        .output()
        .unwrap();
    let truth = parse_report(&out, &args);
    assert!(!Path::new("/sys/kernel/tracing/instances/second").exists(), "record.sh left the instance behind");
    let theirs = report_counts(&trace_cmd, &recorded);
    let variants =
        [("record.dat", recorded.clone()), ("v6.dat", dir.join("v6.dat")), ("zlib.dat", dir.join("zlib.dat"))];
    convert(&trace_cmd, &recorded, &variants[1].1, &["--file-version", "6"]);
    convert(&trace_cmd, &recorded, &variants[2].1, &["--compression", "zlib"]);
    for (name, file) in &variants {
        assert_eq!(report_counts(&trace_cmd, file), theirs, "{name}: trace-cmd convert changed the events");
        let r = exits_json(file, &["--by", "vm"]);
        for event in ["kvm_userspace_exit", "kvm_pio", "kvm_fpu", "kvm_emulate_insn"] {
            assert_eq!(r["source"]["events"][event].as_u64(), theirs.get(event).copied(), "{name}: {event}");
        }
        // Every vCPU's port writes are its iterations plus testvm's markers.
        let per_vcpu = 300 + truth.marker_io_exits_per_vcpu;
        for vm in &truth.vms {
            for vcpu in &vm.vcpus {
                let row =
                    r["by_vcpu"].as_array().unwrap().iter().find(|v| v["tid"] == vcpu.tid).expect("each vCPU thread");
                assert_eq!(row["heavyweight"].as_u64(), Some(per_vcpu), "{name}: vCPU thread {}", vcpu.tid);
            }
        }
        check_vms(&r, &truth, name);
        // Both buffers are read: the events in all equal trace-cmd's.
        let report = virtprof().args(["report", "--json"]).arg(file).output().unwrap();
        assert!(report.status.success(), "{name}: {}", String::from_utf8_lossy(&report.stderr));
        let report: serde_json::Value = serde_json::from_slice(&report.stdout).unwrap();
        assert_eq!(report["events"].as_u64(), Some(theirs["(all)"]), "{name}: events in both buffers");
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// A trace.dat has no tgids: the VMs come from the thread that made each vCPU thread
/// (`sched_process_fork`, recorded here). testvm starts its VMs as processes side by side, so
/// their vCPU threads' ids often interleave, where the vCPU indexes alone would guess wrong;
/// the makers still give testvm's VMs exactly.
fn check_vms(r: &serde_json::Value, truth: &TestvmReport, name: &str) {
    let vm_of_tid: BTreeMap<u32, usize> =
        truth.vms.iter().enumerate().flat_map(|(vm, report)| report.vcpus.iter().map(move |v| (v.tid, vm))).collect();
    let vms = r["by_vm"].as_array().unwrap();
    assert_eq!(vms.len(), 2, "{name}: {vms:?}");
    for v in vms {
        let tids: BTreeSet<u32> =
            v["tids"].as_array().unwrap().iter().map(|t| u32::try_from(t.as_u64().unwrap()).unwrap()).collect();
        let truth_vms: BTreeSet<usize> = tids.iter().map(|t| vm_of_tid[t]).collect();
        assert_eq!((truth_vms.len(), tids.len()), (1, 2), "{name}: {v}");
        assert_eq!(v["grouped_by"], "fork", "{name}: {v}");
    }
}

/// The kvm_amd capture rewritten as a kvm_intel host would have written it: the same kernel
/// event definition (its print fmt carries both the VMX and the SVM tables), each kvm_exit's
/// SVM code replaced by the VMX basic reason of the same exit and its isa set to VMX. Returns
/// the exits patched.
fn vmx_from_svm(file: &Path) -> usize {
    use virtprof_trace::format::{parse_event_format, parse_header_page};
    use virtprof_trace::page::Page;
    use virtprof_trace::segment::Segment;
    let mut bytes = std::fs::read(file).unwrap();
    let offsets: Vec<usize>;
    let (reason_at, isa_at, info1_at);
    {
        let dat = virtprof_trace::tracedat::read(&bytes).unwrap();
        let header = parse_header_page(&dat.header_page).unwrap();
        let kvm_exit =
            dat.formats.iter().find(|f| f.system == "kvm" && f.text.starts_with(b"name: kvm_exit\n")).unwrap();
        let format = parse_event_format(&kvm_exit.system, &kvm_exit.text()).unwrap();
        let at = |name: &str| format.field(name).unwrap().offset;
        (reason_at, isa_at, info1_at) = (at("exit_reason"), at("isa"), at("info1"));
        let base = bytes.as_ptr() as usize;
        let mut found = Vec::new();
        for (_, segments) in dat.cpus() {
            for segment in segments {
                let Segment::Pages(pages) = segment else { panic!("convert --compression none writes pages in place") };
                for page in pages.chunks(header.page_size) {
                    for record in Page::parse(page, &header).unwrap().records() {
                        let record = record.unwrap();
                        if record.event_id() == Some(format.id) {
                            found.push(record.data.as_ptr() as usize - base);
                        }
                    }
                }
            }
        }
        offsets = found;
    }
    let u32_at = |b: &[u8], at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
    for &record in &offsets {
        let svm = u32_at(&bytes, record + reason_at);
        let write = u32_at(&bytes, record + info1_at) != 0;
        // SVM exit code → VMX basic exit reason (Intel SDM appendix C).
        let vmx: u32 = match svm {
            0x7b => 30,          // IOIO → IO_INSTRUCTION
            0x72 => 10,          // CPUID
            0x7c if write => 32, // MSR (info1 = 1: WRMSR) → MSR_WRITE
            0x7c => 31,          // MSR_READ
            0x78 => 12,          // HLT
            0x400 => 48,         // NPF → EPT_VIOLATION
            0x60 => 1,           // INTR → EXTERNAL_INTERRUPT
            other => panic!("no VMX reason for SVM exit {other:#x} in the fixture"),
        };
        bytes[record + reason_at..record + reason_at + 4].copy_from_slice(&vmx.to_le_bytes());
        bytes[record + isa_at..record + isa_at + 4].copy_from_slice(&1u32.to_le_bytes());
    }
    std::fs::write(file, bytes).unwrap();
    offsets.len()
}

/// Exits of a kvm_intel host are named from the recorded print fmt's VMX table, as trace-cmd
/// names them, reason by reason; the probe's ground truth holds under the VMX names; HLT is
/// the guest idling.
#[test]
fn vmx_exits_are_named_and_counted_as_trace_cmd_reads_them() {
    let test = "vmx_exits_are_named_and_counted_as_trace_cmd_reads_them";
    let Some(trace_cmd) = trace_cmd_33(test) else { return };
    let file = temp("vmx.dat");
    convert(&trace_cmd, &run5(), &file, &["--compression", "none"]);
    assert_eq!(vmx_from_svm(&file), 2444);
    let report = Command::new(&trace_cmd).args(["report", "-i"]).arg(&file).output().unwrap();
    let mut theirs: BTreeMap<String, u64> = BTreeMap::new();
    for line in String::from_utf8_lossy(&report.stdout).lines().filter(|l| l.contains(" kvm_exit:")) {
        let reason = line.split(" reason ").nth(1).and_then(|r| r.split_whitespace().next()).expect("a reason");
        *theirs.entry(reason.to_string()).or_insert(0) += 1;
    }
    let r = exits_json(&file, &[]);
    let ours = reason_counts(&r);
    // trace-cmd's kvm plugin and the print fmt agree on VMX names; exits in flight at the
    // end are counted by both.
    assert_eq!(ours, theirs, "per reason, ours against trace-cmd report's");
    for vcpu in ["0", "1"] {
        let per = reason_counts(&exits_json(&file, &["--vcpu", vcpu]));
        let n = |reason: &str| per.get(reason).copied().unwrap_or(0);
        assert_eq!(
            (n("CPUID"), n("IO_INSTRUCTION"), n("MSR_READ"), n("MSR_WRITE"), n("HLT")),
            (202, 410, 200, 0, 1),
            "the probe's truth per vCPU (kvm_probe -n 200 -H reads the TSC MSR)"
        );
    }
    let hlt = r["by_reason"].as_array().unwrap().iter().find(|x| x["reason"] == "HLT").unwrap();
    assert_eq!(hlt["guest_idle"], true);
    let text = virtprof().arg("exits").arg(&file).output().unwrap();
    assert!(String::from_utf8_lossy(&text.stdout).contains("HLT (guest idle)"));
    let _ = std::fs::remove_file(file);
}

/// A capture of only kvm_exit and kvm_entry (what many users record): the real kvm_amd dump
/// with every other event's format left out. Counts per reason equal the kernel's own text
/// of the same buffer; which exits went to the VMM, and preemption, are unknown (null in
/// JSON, "unknown" in text), never zero.
#[test]
fn a_capture_of_exits_and_entries_only_leaves_the_split_unknown() {
    let src = workspace().join("crates/trace/tests/fixtures/kvm-amd-run3_2vcpu_2cpu_pinned/tracefs");
    let dump = temp("exit-entry-only");
    let copy = |rel: &str| {
        let to = dump.join(rel);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(src.join(rel), to).unwrap();
    };
    for rel in ["events/header_page", "events/header_event", "saved_cmdlines", "saved_tgids", "trace_clock"] {
        copy(rel);
    }
    for rel in ["events/kvm/kvm_exit/format", "events/kvm/kvm_entry/format"] {
        copy(rel);
    }
    for cpu in ["cpu0", "cpu1"] {
        copy(&format!("per_cpu/{cpu}/trace_pipe_raw"));
        copy(&format!("per_cpu/{cpu}/stats"));
    }
    let kernel = std::fs::read_to_string(src.join("trace")).unwrap();
    let mut theirs: BTreeMap<String, u64> = BTreeMap::new();
    for line in kernel.lines().filter(|l| l.contains(" kvm_exit: ")) {
        let reason = line.split(" reason ").nth(1).and_then(|r| r.split_whitespace().next()).unwrap();
        *theirs.entry(reason.to_string()).or_insert(0) += 1;
    }
    let r = exits_json(&dump, &["--by", "vm"]);
    assert_eq!(reason_counts(&r), theirs);
    assert!(r["totals"]["lightweight"].is_null() && r["totals"]["heavyweight"].is_null(), "{}", r["totals"]);
    for row in r["by_reason"].as_array().unwrap() {
        assert!(row["lightweight"].is_null() && row["descheduled"].is_null() && row["preempted_ns"].is_null(), "{row}");
    }
    let missing = r["source"]["unavailable"].to_string();
    assert!(missing.contains("kvm_userspace_exit was not recorded") && missing.contains("sched_switch"), "{missing}");
    // The dump's saved_tgids is empty: the vCPU indexes 0 and 1 of threads 284 and 285 make
    // them one VM.
    assert_eq!(r["by_vm"].as_array().unwrap().len(), 1, "{}", r["by_vm"]);
    assert_eq!((r["by_vm"][0]["grouped_by"].as_str(), r["by_vm"][0]["vcpus"].as_u64()), (Some("vcpu ids"), Some(2)));
    let text = virtprof().arg("exits").arg(&dump).output().unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("lightweight/heavyweight: unknown"), "{text}");
    assert!(!text.contains(" 0 lightweight"), "{text}");
    let _ = std::fs::remove_dir_all(dump);
}

/// The host trace's id, in the fixture guest's TIME_SHIFT.
const GUEST_PEER: u64 = 0xC8E8_547B_7C85_BF40;

/// `guest` (the fixture: its TIME_SHIFT option first in its last options section, which ends the
/// file) with a TIME_SHIFT of three samples per CPU around the real offset, interpolated, and a
/// scaling of 1 + 2^-20 in 20 fraction bits: what trace-cmd's tsync writes, not `attach`.
fn with_time_shift(guest: &[u8], peer: u64) -> Vec<u8> {
    with_time_shift_moved(guest, peer, 0)
}

/// [`with_time_shift`] with every offset moved by `moved` cycles (negative: earlier).
fn with_time_shift_moved(guest: &[u8], peer: u64, moved: i64) -> Vec<u8> {
    let option = [&12u16.to_le_bytes()[..], &88u32.to_le_bytes(), &peer.to_le_bytes()].concat();
    let at = guest.windows(option.len()).position(|w| w == option).expect("the TIME_SHIFT option");
    let section = at - 16;
    let rest = &guest[at + 6 + 88..];
    let offset = 79_367_182_636i64 + moved;
    // Guest TSC times (cycles at 2.5 GHz) around the traced seconds, offsets ±1 µs apart.
    let samples = [(100_000_000_000u64, offset), (106_000_000_000, offset + 2_500), (108_000_000_000, offset - 2_500)];
    let samples = samples.map(|(ts, offset)| (ts, u64::from_le_bytes(offset.to_le_bytes())));
    let mut body = Vec::new();
    body.extend(peer.to_le_bytes());
    body.extend(1u32.to_le_bytes()); // interpolate
    body.extend(2u32.to_le_bytes());
    for _cpu in 0..2 {
        body.extend(3u32.to_le_bytes());
        body.extend(samples.iter().flat_map(|s| s.0.to_le_bytes()));
        body.extend(samples.iter().flat_map(|s| s.1.to_le_bytes()));
        body.extend(samples.iter().flat_map(|_| ((1u64 << 20) + 1).to_le_bytes()));
    }
    for _cpu in 0..2 {
        body.extend(samples.iter().flat_map(|_| 20u64.to_le_bytes()));
    }
    let mut out = guest[..at].to_vec();
    out.extend(12u16.to_le_bytes());
    out.extend(u32::try_from(body.len()).unwrap().to_le_bytes());
    out.extend(&body);
    out.extend(rest);
    // The section's size: everything after its 16-byte header.
    let size = (out.len() - section - 16) as u64;
    out[section + 8..section + 16].copy_from_slice(&size.to_le_bytes());
    out
}

fn pair() -> (PathBuf, PathBuf) {
    let dir = workspace().join("crates/trace/tests/fixtures/kvm-amd-pair-attach");
    (dir.join("host.dat"), dir.join("guest.dat"))
}

/// One guest event as `trace-cmd report -t` prints it: (guest CPU, host-clock ns, event).
type GuestEvent = (u32, u64, String);

/// The guest's events in `trace-cmd report -t -i host -i guest`, on trace-cmd's host clock.
fn trace_cmd_guest_events(trace_cmd: &Path, host: &Path, guest: &Path) -> Vec<GuestEvent> {
    let out =
        Command::new(trace_cmd).args(["report", "-t", "-N", "-i"]).arg(host).arg("-i").arg(guest).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let guest_name = format!("{}:", guest.file_name().unwrap().to_string_lossy());
    text.lines()
        .filter_map(|line| {
            let rest = line.trim_start().strip_prefix(&guest_name)?;
            let (_, after_cpu) = rest.split_once("] ")?;
            let cpu = rest.split_once('[')?.1.split_once(']')?.0.parse().ok()?;
            let mut words = after_cpu.split_whitespace().skip(1);
            let (seconds, ns) = words.next()?.trim_end_matches(':').split_once('.')?;
            let ts = seconds.parse::<u64>().ok()? * 1_000_000_000 + ns.parse::<u64>().ok()?;
            let event = words.next()?.trim_end_matches(':').to_string();
            Some((cpu, ts, event))
        })
        .collect()
}

/// The guest events `exits --guest --json` shows before its exit rows, on the host clock.
fn guest_events_before_exits(r: &serde_json::Value) -> Vec<GuestEvent> {
    let mut out = Vec::new();
    for row in r["rows"].as_array().unwrap() {
        let Some(before) = row.get("guest_before") else { continue };
        let cpu = u32::try_from(before["guest_cpu"].as_u64().unwrap()).unwrap();
        let exit_ts = row["exit_ts"].as_u64().unwrap();
        for e in before["events"].as_array().unwrap() {
            out.push((cpu, exit_ts - e["before_ns"].as_u64().unwrap(), e["event"].as_str().unwrap().to_string()));
        }
    }
    out
}

/// A host trace and its guest's from a real kvm_amd host, paired by trace-cmd itself (`trace-cmd
/// attach` writes the guest's TIME_SHIFT and the host's GUEST option; the fixture's README says
/// how it was made). Every guest event virtprof places lands on the nanosecond where trace-cmd
/// places it, and inside a stretch when its vCPU thread was in guest mode on the host (the
/// ground truth of any alignment: a guest runs only between a kvm_entry and the next kvm_exit);
/// each exit row shows what its guest CPU did just before. Perfetto draws both machines.
/// A guest file without time-sync data is said to be not aligned; one synchronised with another
/// host trace is refused.
#[test]
fn a_host_and_guest_pair_is_placed_on_one_clock_as_trace_cmd_places_it() {
    let test = "a_host_and_guest_pair_is_placed_on_one_clock_as_trace_cmd_places_it";
    let Some(trace_cmd) = trace_cmd_33(test) else { return };
    let (host, guest) = pair();
    let theirs = trace_cmd_guest_events(&trace_cmd, &host, &guest);
    assert!(theirs.len() > 10_000, "{} guest events in trace-cmd's report", theirs.len());

    let r = exits_json(&host, &["--guest", guest.to_str().unwrap(), "--threshold-us", "0"]);
    let g = &r["guest"];
    assert_eq!(g["aligned"], true, "{g}");
    // GUEST: guest CPU 0 and 1 run in "CPU 0/KVM" (164) and "CPU 1/KVM" (165).
    assert_eq!(g["vcpu_threads"], serde_json::json!([[0, 164], [1, 165]]), "{g}");
    assert_eq!(g["events"].as_u64(), Some(theirs.len() as u64), "{g}");
    assert_eq!((g["unplaced_events"].as_u64(), g["lost_events"].as_u64()), (Some(0), Some(0)), "{g}");
    let tc: std::collections::HashSet<&GuestEvent> = theirs.iter().collect();
    let mut placed = std::collections::HashSet::new();
    for event in guest_events_before_exits(&r) {
        assert!(tc.contains(&event), "guest event {event:?} is not where trace-cmd puts it");
        placed.insert(event);
    }
    assert!(placed.len() > 10_000, "{} guest events shown before exits", placed.len());

    // Ground truth: no guest event lies inside an exit of its own vCPU thread. The same check
    // with the guest 1 ms off finds many: it has teeth.
    let mut exits: BTreeMap<u32, Vec<(u64, u64)>> = BTreeMap::new();
    for row in r["rows"].as_array().unwrap() {
        let start = row["exit_ts"].as_u64().unwrap();
        exits
            .entry(u32::try_from(row["tid"].as_u64().unwrap()).unwrap())
            .or_default()
            .push((start, start + row["duration_ns"].as_u64().unwrap()));
    }
    let inside = |shift: i64| {
        theirs
            .iter()
            .filter(|(cpu, ts, _)| {
                let ts = ts.saturating_add_signed(shift);
                let spans = &exits[&(164 + cpu)];
                let i = spans.partition_point(|&(start, _)| start < ts);
                i > 0 && ts < spans[i - 1].1
            })
            .count()
    };
    assert_eq!(inside(0), 0, "guest events inside their vCPU's exits");
    assert!(inside(1_000_000) > theirs.len() / 10, "a guest 1 ms off lands inside exits: {}", inside(1_000_000));

    // The text table shows the guest beside each long exit.
    let out = virtprof()
        .arg("exits")
        .arg(&host)
        .arg("--guest")
        .arg(&guest)
        .args(["--threshold-us", "10000"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("GUEST_BEFORE") && text.contains("cpu0 swapper/0[0]: softirq_entry"),
        "{text}"
    );
    assert!(text.contains("aligned to the host by its TIME_SHIFT"), "{text}");

    // Perfetto: a process for the guest, a track per guest CPU named with its host thread, a
    // slice per guest task run (one per sched_switch) and an instant per interrupt entry.
    let trace = temp("pair.perfetto.json");
    let out = virtprof()
        .args(["export", "--format", "perfetto"])
        .arg(&host)
        .arg("--guest")
        .arg(&guest)
        .arg("-o")
        .arg(&trace)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let t: serde_json::Value = serde_json::from_slice(&std::fs::read(&trace).unwrap()).unwrap();
    let events = t["traceEvents"].as_array().unwrap();
    let names: Vec<&str> =
        events.iter().filter(|e| e["name"] == "thread_name").filter_map(|e| e["args"]["name"].as_str()).collect();
    assert!(
        names.contains(&"guest CPU 0 (host thread 164)") && names.contains(&"guest CPU 1 (host thread 165)"),
        "{names:?}"
    );
    let count = |ph: &str| events.iter().filter(|e| e["cat"] == "guest" && e["ph"] == ph).count();
    let of = |name: &str| theirs.iter().filter(|(_, _, e)| e == name).count();
    assert_eq!(count("X"), of("sched_switch"));
    assert_eq!(count("i"), of("irq_handler_entry") + of("softirq_entry"));
    let _ = std::fs::remove_file(&trace);

    // trace-cmd's tsync (ptp, kvm) writes several samples per CPU, interpolated, and scaling
    // with fraction bits: the same guest with such a TIME_SHIFT is placed where trace-cmd
    // places it, event by event.
    let resynced = temp("resynced-guest.dat");
    std::fs::write(&resynced, with_time_shift(&std::fs::read(&guest).unwrap(), GUEST_PEER)).unwrap();
    let theirs = trace_cmd_guest_events(&trace_cmd, &host, &resynced);
    let r = exits_json(&host, &["--guest", resynced.to_str().unwrap(), "--threshold-us", "0"]);
    let tc: std::collections::HashSet<&GuestEvent> = theirs.iter().collect();
    let placed = guest_events_before_exits(&r);
    for event in &placed {
        assert!(tc.contains(event), "{event:?}: not where trace-cmd puts it with interpolated, scaled samples");
    }
    let checked = placed.len();
    assert!(checked > 10_000, "{checked}");
    let _ = std::fs::remove_file(&resynced);

    // A guest file with no time-sync data (another capture): not aligned, said so, no rows.
    let unsynced = run5();
    let r = exits_json(&host, &["--guest", unsynced.to_str().unwrap(), "--threshold-us", "0"]);
    assert_eq!(r["guest"]["aligned"], false);
    assert!(r["guest"]["not_aligned_because"].as_str().unwrap().contains("no time-sync data"), "{}", r["guest"]);
    assert!(r["rows"].as_array().unwrap().iter().all(|row| row.get("guest_before").is_none()));
    // One synchronised with another host trace: the files are not a pair.
    let mut bytes = std::fs::read(&guest).unwrap();
    let at = bytes.windows(8).position(|w| w == GUEST_PEER.to_le_bytes()).expect("the peer id");
    bytes[at] ^= 1;
    let other = temp("other-peer.dat");
    std::fs::write(&other, &bytes).unwrap();
    let out = virtprof().arg("exits").arg(&host).arg("--guest").arg(&other).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("was synchronised with the host trace") && err.contains("give the host file"), "{err}");
    let _ = std::fs::remove_file(&other);
}

/// Issue 55: a valid trace.dat whose CPUs hold no events (v7 with no CPUs, v6 with empty
/// ones) reads as empty in every command (exit 0, "0 events"), not as bad input; and a
/// trace.dat's loss is the same read directly or through the recording `import` makes of it.
#[test]
fn an_empty_trace_dat_reads_as_empty_and_an_import_keeps_the_loss() {
    use super::bombs::generator::{trace_dat, Codec, DatBomb};
    let empty = [
        ("empty-v7.dat", trace_dat(&DatBomb { cpus: 0, ..DatBomb::v7(Codec::Zstd, 0, 1) })),
        ("empty-v6.dat", trace_dat(&DatBomb { chunk_pages: 0, ..DatBomb::v6(2, 0) })),
    ];
    for (name, bytes) in empty {
        let path = temp(name);
        std::fs::write(&path, bytes).unwrap();
        let run = |args: &[&str]| {
            let out = virtprof().args(args).arg(&path).output().unwrap();
            let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
            assert_eq!(out.status.code(), Some(0), "{name} {args:?}: {stderr}");
            stdout.into_owned()
        };
        assert!(run(&["exits"]).contains("0 exits"), "{name}");
        assert!(run(&["sched"]).contains("0 events"), "{name}");
        let report: serde_json::Value = serde_json::from_str(&run(&["report", "--json"])).unwrap();
        assert_eq!(report["events"], 0, "{name}");
        let rec = temp(&format!("{name}.vprec"));
        let out = virtprof().arg("import").arg(&path).arg("-o").arg(&rec).output().unwrap();
        assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
        let _ = std::fs::remove_file(&rec);
        let _ = std::fs::remove_file(&path);
    }
    let fixtures = workspace().join("crates/trace/tests/fixtures");
    for file in [run5(), fixtures.join("kvm-amd-pair-attach/host.dat"), fixtures.join("kvm-amd-pair-attach/guest.dat")]
    {
        let rec = temp("imported-loss.vprec");
        let out = virtprof().arg("import").arg(&file).arg("-o").arg(&rec).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let (direct, imported) = (exits_json(&file, &[]), exits_json(&rec, &[]));
        assert_eq!(direct["loss"], imported["loss"], "{}", file.display());
        assert_eq!(imported["loss"]["complete"], true, "{}: {}", file.display(), imported["loss"]);
        let _ = std::fs::remove_file(&rec);
    }
}

/// Issue 55: a real kvm_amd capture whose VM is known only by trace-cmd's GUEST option (a
/// trace.dat has no tgids): `exits --by vm`, `sched`, `report` and every export put its two
/// vCPU threads in one VM with one name.
#[test]
fn one_vm_by_the_guest_option_in_every_command() {
    let (host, _) = pair();
    let json = |args: &[&str]| -> serde_json::Value {
        let out = virtprof().args(args).arg(&host).arg("--json").output().unwrap();
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let by_vm = exits_json(&host, &["--by", "vm"]);
    let vms = by_vm["by_vm"].as_array().unwrap();
    assert_eq!(vms.len(), 1, "{vms:?}");
    let name = vms[0]["vm"].as_str().unwrap().to_string();
    assert_eq!(
        (&vms[0]["grouped_by"], &vms[0]["tids"]),
        (&serde_json::json!("guest option"), &serde_json::json!([164, 165]))
    );
    let vcpu_tids = |vm: &serde_json::Value| -> Vec<u64> {
        vm["vcpus"].as_array().unwrap().iter().map(|v| v["tid"].as_u64().unwrap()).collect()
    };
    let sched = json(&["sched"]);
    let sched_vms = sched["windows"][0]["vms"].as_array().unwrap();
    assert_eq!(sched_vms.len(), 1, "{sched_vms:?}");
    assert_eq!((sched_vms[0]["name"].as_str(), vcpu_tids(&sched_vms[0])), (Some(name.as_str()), vec![164, 165]));
    let report = json(&["report"]);
    let report_vms = report["accounting"]["vms"].as_array().unwrap();
    assert_eq!(report_vms.len(), 1, "{report_vms:?}");
    assert_eq!((report_vms[0]["name"].as_str(), vcpu_tids(&report_vms[0])), (Some(name.as_str()), vec![164, 165]));

    let trace = temp("guest-option.perfetto.json");
    let out = virtprof().args(["export", "--format", "perfetto"]).arg(&host).arg("-o").arg(&trace).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let t: serde_json::Value = serde_json::from_slice(&std::fs::read(&trace).unwrap()).unwrap();
    let processes: Vec<&str> = t["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["name"] == "process_name")
        .filter_map(|e| e["args"]["name"].as_str())
        .collect();
    assert_eq!(processes.len(), 1, "{processes:?}");
    assert!(processes[0].contains(&name), "{processes:?}");
    let _ = std::fs::remove_file(&trace);
    let vms = "t = pq.read_table(DIR + '/sched.parquet').to_pylist(); print(sorted({(r['vm'], r['pid']) for r in t}), sorted(r['tid'] for r in t))";
    match parquet_read_by_python(&host, vms) {
        Some(text) => assert_eq!(text.trim(), format!("[('{name}', 164)] [164, 165]"), "{text}"),
        None => note(
            "one_vm_by_the_guest_option_in_every_command",
            "pyarrow is missing: sched.parquet's VMs are not checked",
        ),
    }
}

/// What `script` prints of `file` exported as Parquet (`pq` is pyarrow.parquet, `DIR` the
/// export's directory); None where pyarrow is missing.
fn parquet_read_by_python(file: &Path, script: &str) -> Option<String> {
    let dir = temp(&format!("{}.parquet", file.file_name().unwrap().to_string_lossy()));
    let out = virtprof().args(["export", "--format", "parquet"]).arg(file).arg("-o").arg(&dir).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let python = format!("import pyarrow.parquet as pq\nDIR = {:?}\n{script}", dir.display().to_string());
    let out = Command::new("python3").args(["-c", &python]).output().ok().filter(|o| o.status.success());
    let _ = std::fs::remove_dir_all(&dir);
    Some(String::from_utf8_lossy(&out?.stdout).into_owned())
}

/// Issue 55: a guest whose own trace began before its host's keeps its events at their time in
/// the Perfetto export: time 0 is the guest's first event, and the host's events sit as far
/// after it as the guest's TIME_SHIFT says (they used to be clamped to 0 with the guest's).
#[test]
fn a_guest_trace_that_began_before_its_host_is_drawn_at_its_time() {
    let (host, guest) = pair();
    let export = |guest: &Path| -> (Vec<f64>, Vec<f64>) {
        let trace = temp("early-guest.perfetto.json");
        let out = virtprof()
            .args(["export", "--format", "perfetto"])
            .arg(&host)
            .arg("--guest")
            .arg(guest)
            .arg("-o")
            .arg(&trace)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let t: serde_json::Value = serde_json::from_slice(&std::fs::read(&trace).unwrap()).unwrap();
        let _ = std::fs::remove_file(&trace);
        let times = |guest: bool| -> Vec<f64> {
            t["traceEvents"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|e| e.get("ts").is_some() && (e["cat"] == "guest") == guest)
                .map(|e| e["ts"].as_f64().unwrap())
                .collect()
        };
        (times(true), times(false))
    };
    let min = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min);
    let (guest_times, host_times) = export(&guest);
    let in_step = min(&guest_times) - min(&host_times);
    assert!(in_step > 0.0, "the fixture's guest starts after its host");
    // The same guest 60 s earlier (150e9 cycles at 2.5 GHz): before the host's first event.
    let early = temp("early-guest.dat");
    std::fs::write(&early, with_time_shift_moved(&std::fs::read(&guest).unwrap(), GUEST_PEER, -150_000_000_000))
        .unwrap();
    let (guest_times, host_times) = export(&early);
    let _ = std::fs::remove_file(&early);
    assert_eq!(min(&guest_times), 0.0, "time 0 is the guest's first event");
    let at_zero = guest_times.iter().filter(|&&t| t == 0.0).count();
    assert!(at_zero <= 2, "{at_zero} guest events at time 0: clamped");
    // The host's first event 60 s less the fixture's head start after the guest's (µs; the
    // TIME_SHIFT's scaling and interpolation move it by well under 1 ms).
    let expected = 60e6 - in_step;
    assert!(
        (min(&host_times) - expected).abs() < 1_000.0,
        "host's first at {} µs, expected {expected}",
        min(&host_times)
    );
}

/// Issue 55: a guest's trace.dat read alone is placed by its own TIME_SHIFT, as trace-cmd
/// reads it alone: every event at the nanosecond `trace-cmd report -t` prints, and the clock
/// line says so.
#[test]
fn a_guest_trace_read_alone_is_placed_by_its_time_shift_as_trace_cmd_does() {
    let test = "a_guest_trace_read_alone_is_placed_by_its_time_shift_as_trace_cmd_does";
    let Some(trace_cmd) = trace_cmd_33(test) else { return };
    let (_, guest) = pair();
    let out = Command::new(&trace_cmd).args(["report", "-t", "-N", "-i"]).arg(&guest).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // "comm-tid [cpu] flags seconds.nanoseconds: event: ..."
    let mut theirs: Vec<u64> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            let after_cpu = line.split_once("] ")?.1;
            let stamp = after_cpu.split_whitespace().nth(1)?.trim_end_matches(':');
            let (s, ns) = stamp.split_once('.')?;
            Some(s.parse::<u64>().ok()? * 1_000_000_000 + ns.parse::<u64>().ok()?)
        })
        .collect();
    theirs.sort_unstable();
    assert!(theirs.len() > 10_000, "{}", theirs.len());
    let times =
        "print('\\n'.join(str(t) for t in sorted(pq.read_table(DIR + '/events.parquet').column('ts_ns').to_pylist())))";
    match parquet_read_by_python(&guest, times) {
        Some(text) => {
            let ours: Vec<u64> = text.lines().map(|l| l.parse().unwrap()).collect();
            assert_eq!(ours.len(), theirs.len());
            assert!(ours == theirs, "first differing: {:?}", ours.iter().zip(&theirs).find(|(a, b)| a != b));
        }
        None => note(test, "pyarrow is missing: the events' times are not compared"),
    }
    // Imported, it keeps its TIME_SHIFT and reads the same.
    let rec = temp("guest-alone.vprec");
    let out = virtprof().arg("import").arg(&guest).arg("-o").arg(&rec).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for file in [&guest, &rec] {
        let r = exits_json(file, &[]);
        let clock = r["clock"].as_str().unwrap_or_default();
        assert!(clock.contains("placed on its host's clock by its TIME_SHIFT"), "{}: {clock}", file.display());
        let report = virtprof().args(["report", "--json"]).arg(file).output().unwrap();
        let report: serde_json::Value = serde_json::from_slice(&report.stdout).unwrap();
        let start = report["accounting"]["start_ns"].as_u64();
        assert_eq!(start, Some(theirs[0]), "{}: the first event where trace-cmd puts it", file.display());
    }
    let _ = std::fs::remove_file(rec);
}

/// What `trace-cmd report -t -i host -i guest` says each guest CPU did: (switches, softirqs,
/// busy ns, idle ns) from its first sched_switch to the guest's last event.
fn trace_cmd_guest_cpu_use(trace_cmd: &Path, host: &Path, guest: &Path) -> BTreeMap<u32, (u64, u64, u64, u64)> {
    let out =
        Command::new(trace_cmd).args(["report", "-t", "-N", "-i"]).arg(host).arg("-i").arg(guest).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let prefix = format!("{}:", guest.file_name().unwrap().to_string_lossy());
    // (cpu, ts, event, next_pid)
    let mut events: Vec<(u32, u64, String, Option<u32>)> = Vec::new();
    for line in text.lines() {
        let Some(rest) = line.trim_start().strip_prefix(&prefix) else { continue };
        let Some((_, after_cpu)) = rest.split_once("] ") else { continue };
        let cpu: u32 = rest.split_once('[').unwrap().1.split_once(']').unwrap().0.parse().unwrap();
        let mut words = after_cpu.split_whitespace().skip(1);
        let (seconds, ns) = words.next().unwrap().trim_end_matches(':').split_once('.').unwrap();
        let ts = seconds.parse::<u64>().unwrap() * 1_000_000_000 + ns.parse::<u64>().unwrap();
        let event = words.next().unwrap().trim_end_matches(':').to_string();
        let next = after_cpu.split_whitespace().find_map(|w| w.strip_prefix("next_pid=")).map(|p| p.parse().unwrap());
        events.push((cpu, ts, event, next));
    }
    let end = events.iter().map(|e| e.1).max().unwrap();
    let mut out: BTreeMap<u32, (u64, u64, u64, u64)> = BTreeMap::new();
    let mut running: BTreeMap<u32, (u64, u32)> = BTreeMap::new();
    let charge = |out: &mut BTreeMap<u32, (u64, u64, u64, u64)>, cpu: u32, (since, pid): (u64, u32), to: u64| {
        let row = out.entry(cpu).or_default();
        if pid == 0 {
            row.3 += to - since;
        } else {
            row.2 += to - since;
        }
    };
    for (cpu, ts, event, next) in &events {
        let row = out.entry(*cpu).or_default();
        match event.as_str() {
            "sched_switch" => {
                row.0 += 1;
                if let Some(run) = running.insert(*cpu, (*ts, next.unwrap())) {
                    charge(&mut out, *cpu, run, *ts);
                }
            }
            "softirq_entry" => row.1 += 1,
            _ => {}
        }
    }
    for (cpu, run) in running {
        charge(&mut out, cpu, run, end);
    }
    out
}

/// `pair`'s recording made again with the guest machine's event list set to `events` (what a
/// guest trace recorded without the others says of itself).
fn with_guest_events(pair: &[u8], events: &[&str]) -> Vec<u8> {
    use virtprof_store::recording::{Chunk, Reader, Writer};
    let mut reader = Reader::new(pair).unwrap();
    let mut writer = None;
    let mut out = None;
    while let Some(chunk) = reader.next_chunk().unwrap() {
        match chunk {
            Chunk::Metadata(m) => writer = Some(Writer::new(Vec::new(), &m).unwrap()),
            Chunk::Pages { cpu, data } => writer.as_mut().unwrap().pages(cpu, data).unwrap(),
            Chunk::GuestMachine(mut g) => {
                g.metadata.events = Some(events.iter().map(|e| e.to_string()).collect());
                writer.as_mut().unwrap().guest_machine(&g).unwrap();
            }
            Chunk::GuestPages { cpu, data } => writer.as_mut().unwrap().guest_pages(cpu, data).unwrap(),
            Chunk::Footer(f) => out = Some(writer.take().unwrap().finish(&f).unwrap()),
            other => panic!("unexpected chunk {other:?}"),
        }
    }
    out.unwrap()
}

fn json_of(args: &[&str], file: &Path) -> serde_json::Value {
    let out = virtprof().args(args).arg(file).arg("--json").output().unwrap();
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Issue 55: a trace-cmd host+guest pair imported as one recording (`import host.dat --guest
/// guest.dat`) reads as the two files do in every command: `exits` shows each exit's guest
/// events, `export` draws the guest, and `sched` / `report` (given both, or the recording)
/// show per guest CPU its busy and idle time, switches and softirqs equal to what trace-cmd's
/// own reading of the pair gives, to the nanosecond. A guest trace that holds no sched_switch
/// or irq events leaves those figures unknown; a recording cut short leaves the guest's loss
/// unknown.
#[test]
fn a_host_and_guest_pair_imports_as_one_recording_and_sched_and_report_read_the_guest() {
    let test = "a_host_and_guest_pair_imports_as_one_recording_and_sched_and_report_read_the_guest";
    let Some(trace_cmd) = trace_cmd_33(test) else { return };
    let (host, guest) = pair();
    let recording = temp("pair.vprec");
    let out =
        virtprof().arg("import").arg(&host).arg("--guest").arg(&guest).arg("-o").arg(&recording).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && err.contains("and its guest 'guest'"), "{err}");

    // exits: the same rows, each with the same guest events before it.
    let from_files = exits_json(&host, &["--guest", guest.to_str().unwrap(), "--threshold-us", "0"]);
    let from_recording = exits_json(&recording, &["--threshold-us", "0"]);
    assert_eq!(from_files["rows"], from_recording["rows"]);
    for key in ["aligned", "vcpu_threads", "events", "lost_events", "rows_with_guest"] {
        assert_eq!(from_files["guest"][key], from_recording["guest"][key], "{key}");
    }

    // sched and report: the guest's CPUs, as trace-cmd reads them.
    let truth = trace_cmd_guest_cpu_use(&trace_cmd, &host, &guest);
    let guest_arg = guest.to_str().unwrap();
    let views = [
        json_of(&["sched", "--guest", guest_arg], &host)["guest_trace"].clone(),
        json_of(&["sched"], &recording)["guest_trace"].clone(),
        json_of(&["report", "--guest", guest_arg], &host)["guest_trace"].clone(),
        json_of(&["report"], &recording)["guest_trace"].clone(),
    ];
    for view in &views {
        let cpus = view["cpus"].as_array().unwrap();
        assert_eq!(cpus.len(), truth.len(), "{view}");
        for c in cpus {
            let cpu = u32::try_from(c["guest_cpu"].as_u64().unwrap()).unwrap();
            let (switches, softirqs, busy, idle) = truth[&cpu];
            let ours = (c["switches"].as_u64(), c["softirqs"].as_u64(), c["busy_ns"].as_u64(), c["idle_ns"].as_u64());
            assert_eq!(ours, (Some(switches), Some(softirqs), Some(busy), Some(idle)), "guest CPU {cpu}: {c}");
            // GUEST option: guest CPU 0 and 1 run in host threads 164 and 165.
            assert_eq!(c["host_tid"].as_u64(), Some(164 + u64::from(cpu)));
            assert!(busy > 0 && idle > 0, "{c}");
        }
        assert_eq!(view["aligned"], true);
        assert_eq!(view["unavailable"], serde_json::json!([]), "{view}");
    }
    // The text says the same, and the HTML page carries it.
    let out = virtprof().arg("sched").arg(&recording).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("guest 'guest', from its own trace") && text.contains("BUSY%"), "{text}");
    let page = temp("pair.html");
    assert!(virtprof().arg("report").arg(&recording).arg("--html").arg(&page).status().unwrap().success());
    assert!(std::fs::read_to_string(&page).unwrap().contains("\"guest_trace\":{"));
    let _ = std::fs::remove_file(&page);

    // export: the guest's tracks from the recording as from the two files.
    let count_guest = |args: &[&str], file: &Path| {
        let trace = temp("pair-export.json");
        let out =
            virtprof().args(["export", "--format", "perfetto"]).arg(file).args(args).arg("-o").arg(&trace).output();
        assert!(out.unwrap().status.success());
        let t: serde_json::Value = serde_json::from_slice(&std::fs::read(&trace).unwrap()).unwrap();
        let _ = std::fs::remove_file(&trace);
        t["traceEvents"].as_array().unwrap().iter().filter(|e| e["cat"] == "guest").count()
    };
    let drawn = count_guest(&["--guest", guest_arg], &host);
    assert!(drawn > 1000, "{drawn}");
    assert_eq!(count_guest(&[], &recording), drawn);

    // A guest trace without sched_switch or irq events: those figures are unknown, with why.
    let bytes = std::fs::read(&recording).unwrap();
    let blind = temp("pair-blind.vprec");
    std::fs::write(&blind, with_guest_events(&bytes, &["sched:sched_wakeup"])).unwrap();
    let view = json_of(&["sched"], &blind)["guest_trace"].clone();
    for c in view["cpus"].as_array().unwrap() {
        for figure in ["busy_ns", "idle_ns", "busy_pct", "observed_ns", "switches", "irqs", "softirqs", "top_tasks"] {
            assert!(c[figure].is_null(), "{figure} is {} without its events", c[figure]);
        }
    }
    let reasons = view["unavailable"].to_string();
    assert!(reasons.contains("sched_switch was not recorded") && reasons.contains("softirq_entry"), "{reasons}");
    let text = String::from_utf8_lossy(&virtprof().arg("report").arg(&blind).output().unwrap().stdout).into_owned();
    assert!(text.contains("unavailable: a guest CPU's busy and idle time"), "{text}");
    let _ = std::fs::remove_file(&blind);

    // Cut short before its footer: the guest's loss is unknown, not 0.
    let cut = temp("pair-cut.vprec");
    std::fs::write(&cut, &bytes[..bytes.len() - 20]).unwrap();
    let view = json_of(&["sched"], &cut)["guest_trace"].clone();
    assert!(view["lost_events_text"].as_str().unwrap().contains("unknown"), "{}", view["lost_events_text"]);
    let _ = std::fs::remove_file(&cut);

    // A guest file that is not this host's guest is refused before anything is written.
    let mut other = std::fs::read(&guest).unwrap();
    let at = other.windows(8).position(|w| w == GUEST_PEER.to_le_bytes()).expect("the peer id");
    other[at] ^= 1;
    let other_path = temp("pair-other-peer.dat");
    std::fs::write(&other_path, &other).unwrap();
    let refused = temp("pair-refused.vprec");
    let _ = std::fs::remove_file(&refused);
    let out =
        virtprof().arg("import").arg(&host).arg("--guest").arg(&other_path).arg("-o").arg(&refused).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!refused.exists());
    let _ = std::fs::remove_file(&other_path);
    let _ = std::fs::remove_file(&recording);
}
