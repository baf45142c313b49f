//! Decoding the real kvm_amd captures (nested SVM under QEMU TCG, Debian 6.1 kernel) gives the
//! same events as the kernel's own text `trace` and an independent decoding (`raw_decoded.tsv`),
//! one for one, and the kvm_exit counts the probe program's ground truth predicts.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use virtprof_model::{Event, EventKind, StrId};
use virtprof_trace::decode::Decoder;
use virtprof_trace::decode::{field_value, FieldValue};
use virtprof_trace::dump::Dump;
use virtprof_trace::merge::{merge_cpus, CpuStream, WalkError, WalkStats};
use virtprof_trace::page::Page;

const RUNS: [&str; 2] = ["kvm-amd-run1_1vcpu_clock-local", "kvm-amd-run3_2vcpu_2cpu_pinned"];

fn fixture(run: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(run)
}

/// One event as both sides can state it: cpu, ts, name, pid, and field=value text.
#[derive(Debug, Clone, PartialEq)]
struct Flat {
    ts: u64,
    cpu: u32,
    name: String,
    pid: i64,
    fields: BTreeMap<String, String>,
}

/// Decode every CPU's pages into flat events (per CPU, in ring-buffer order).
fn decode_flat(run: &str) -> (Dump, Vec<Flat>) {
    let dump = Dump::open(&fixture(run).join("tracefs")).unwrap();
    let mut flat = Vec::new();
    for cpu in dump.cpus.clone() {
        let layout = dump.decoder.layout().clone();
        for bytes in cpu.raw.chunks(layout.header.page_size) {
            let page = Page::parse(bytes, &layout.header).unwrap();
            for rec in page.records() {
                let rec = rec.unwrap();
                let format = layout.format(rec.event_id().unwrap()).expect("every record has a format");
                let mut fields = BTreeMap::new();
                let mut pid = 0;
                for f in &format.fields {
                    let value = match field_value(f, rec.data) {
                        FieldValue::Signed(v) => v.to_string(),
                        FieldValue::Unsigned(v) => v.to_string(),
                        FieldValue::Str(s) => String::from_utf8_lossy(s).into_owned(),
                        FieldValue::Bytes(b) => format!("{b:?}"),
                    };
                    if f.name == "common_pid" {
                        pid = value.parse().unwrap();
                    }
                    if !f.name.starts_with("common_") {
                        fields.insert(f.name.clone(), value);
                    }
                }
                flat.push(Flat { ts: rec.ts, cpu: cpu.cpu, name: format.name.clone(), pid, fields });
            }
        }
    }
    (dump, flat)
}

/// Parse `raw_decoded.tsv`: `ts cpu event k=v ...` (values decimal, or hex with 0x).
fn tsv(run: &str) -> Vec<Flat> {
    let text = std::fs::read_to_string(fixture(run).join("raw_decoded.tsv")).unwrap();
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let mut cols = l.splitn(4, '\t');
            let ts = cols.next().unwrap().parse().unwrap();
            let cpu = cols.next().unwrap().parse().unwrap();
            let name = cols.next().unwrap().to_string();
            let mut fields = BTreeMap::new();
            let mut pid = 0;
            for kv in cols.next().unwrap_or("").split(' ').filter(|s| !s.is_empty()) {
                let (k, v) = kv.split_once('=').unwrap();
                let v = match v.strip_prefix("0x") {
                    Some(hex) => u64::from_str_radix(hex, 16).unwrap().to_string(),
                    None => v.to_string(),
                };
                if k == "common_pid" {
                    pid = v.parse().unwrap();
                } else {
                    fields.insert(k.to_string(), v);
                }
            }
            Flat { ts, cpu, name, pid, fields }
        })
        .collect()
}

fn per_cpu(events: &[Flat], cpu: u32) -> Vec<&Flat> {
    events.iter().filter(|e| e.cpu == cpu).collect()
}

#[test]
fn raw_pages_equal_the_independent_decoding_field_by_field() {
    for run in RUNS {
        let (dump, ours) = decode_flat(run);
        let theirs = tsv(run);
        assert_eq!(ours.len(), theirs.len(), "{run}: event count");
        for cpu in dump.cpus.iter().map(|c| c.cpu) {
            let (a, b) = (per_cpu(&ours, cpu), per_cpu(&theirs, cpu));
            assert_eq!(a.len(), b.len(), "{run} cpu{cpu}");
            for (x, y) in a.iter().zip(&b) {
                assert_eq!((x.ts, &x.name, x.pid), (y.ts, &y.name, y.pid), "{run} cpu{cpu}");
                for (k, v) in &y.fields {
                    if k == "exit_reason_name" {
                        let reason = x.fields["exit_reason"].parse().unwrap();
                        let isa = x.fields["isa"].parse().unwrap();
                        assert_eq!(dump.decoder.exit_reason_name(reason, isa), Some(v.as_str()), "{run} {x:?}");
                        continue;
                    }
                    let mine = x.fields.get(k).unwrap_or_else(|| panic!("{run}: we lack field {k} of {}", x.name));
                    // A signed field may print negative in one decoding and as its two's
                    // complement in the other: compare modulo 2^64.
                    match (mine.parse::<i128>(), v.parse::<i128>()) {
                        (Ok(m), Ok(t)) => {
                            assert!(m.rem_euclid(1 << 64) == t.rem_euclid(1 << 64), "{run} {} {k}: {m} vs {t}", x.name)
                        }
                        _ => assert_eq!(mine, v, "{run} {} field {k}", x.name),
                    }
                }
            }
        }
    }
}

/// `comm-pid [cpu] flags ts: name: rest` → (cpu, µs timestamp, pid, name, rest).
fn text_trace(run: &str) -> Vec<(u32, u64, i64, String, String)> {
    let text = std::fs::read_to_string(fixture(run).join("tracefs/trace")).unwrap();
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| {
            let (task, rest) = l.split_once(" [").unwrap();
            let pid = task.rsplit('-').next().unwrap().trim().parse().unwrap();
            let (cpu, rest) = rest.split_once(']').unwrap();
            let rest = rest.trim_start();
            let (_flags, rest) = rest.split_once(' ').unwrap();
            let (ts, rest) = rest.trim_start().split_once(": ").unwrap();
            let (secs, usecs) = ts.split_once('.').unwrap();
            let us = secs.parse::<u64>().unwrap() * 1_000_000 + usecs.parse::<u64>().unwrap();
            let (name, fields) = rest.split_once(": ").unwrap_or((rest, ""));
            (cpu.parse().unwrap(), us, pid, name.to_string(), fields.to_string())
        })
        .collect()
}

#[test]
fn raw_pages_equal_the_kernels_text_trace() {
    for run in RUNS {
        let (dump, ours) = decode_flat(run);
        let text = text_trace(run);
        assert_eq!(ours.len(), text.len(), "{run}");
        for cpu in dump.cpus.iter().map(|c| c.cpu) {
            let mine = per_cpu(&ours, cpu);
            let theirs: Vec<_> = text.iter().filter(|t| t.0 == cpu).collect();
            assert_eq!(mine.len(), theirs.len(), "{run} cpu{cpu}");
            for (m, t) in mine.iter().zip(theirs) {
                // ftrace prints microseconds rounded to nearest.
                assert_eq!(((m.ts + 500) / 1000, m.pid, m.name.as_str()), (t.1, t.2, t.3.as_str()), "{run} cpu{cpu}");
                match m.name.as_str() {
                    "kvm_exit" => {
                        let name = dump
                            .decoder
                            .exit_reason_name(
                                m.fields["exit_reason"].parse().unwrap(),
                                m.fields["isa"].parse().unwrap(),
                            )
                            .unwrap();
                        assert!(t.4.contains(&format!(" reason {name} ")), "{run}: '{name}' not in '{}'", t.4);
                        let rip = format!("rip 0x{:x}", m.fields["guest_rip"].parse::<u64>().unwrap());
                        assert!(t.4.contains(&rip), "{run}: '{rip}' not in '{}'", t.4);
                    }
                    "sched_switch" => {
                        for k in ["prev_comm", "prev_pid", "next_comm", "next_pid"] {
                            assert!(t.4.contains(&format!("{k}={} ", m.fields[k])), "{run}: {k} in '{}'", t.4);
                        }
                    }
                    "local_timer_entry" | "local_timer_exit" | "reschedule_entry" | "reschedule_exit" => {
                        assert_eq!(t.4, format!("vector={}", m.fields["vector"]));
                    }
                    "softirq_entry" | "softirq_exit" | "softirq_raise" => {
                        assert!(t.4.starts_with(&format!("vec={} ", m.fields["vec"])), "{}", t.4);
                    }
                    _ => {}
                }
            }
        }
    }
}

#[test]
fn kvm_exits_match_the_probe_ground_truth() {
    // kvm_probe -n 200 -H: per vCPU cpuid n+2, io 2n+10, msr n, hlt 1, npf 2n + first-touch faults.
    let n = 200u64;
    for run in RUNS {
        let mut dump = Dump::open(&fixture(run).join("tracefs")).unwrap();
        let mut events: Vec<Event> = Vec::new();
        let streams: Vec<CpuStream<'_>> = dump.cpus.iter().map(|c| CpuStream::contiguous(c.cpu, &c.raw)).collect();
        let stats = merge_cpus(&mut dump.decoder, &streams, |e, _| events.push(*e)).unwrap();
        assert_eq!((stats.page_loss.total(), stats.page_loss.gaps()), (0, 0));
        let mut per_tid: BTreeMap<u32, BTreeMap<String, u64>> = BTreeMap::new();
        let (mut exits, mut entries) = (0, 0);
        for e in &events {
            match e.kind {
                EventKind::KvmExit { reason, isa, .. } => {
                    exits += 1;
                    let name = dump.decoder.exit_reason_name(reason, isa).unwrap().to_string();
                    *per_tid.entry(e.tid).or_default().entry(name).or_default() += 1;
                }
                EventKind::KvmEntry { .. } => entries += 1,
                _ => {}
            }
        }
        assert_eq!(exits, entries, "{run}: exits == entries");
        let vcpus = if run.contains("2vcpu") { 2 } else { 1 };
        assert_eq!(per_tid.len(), vcpus, "{run}: one vCPU thread each");
        for (tid, reasons) in &per_tid {
            assert_eq!(reasons["cpuid"], n + 2, "{run} tid {tid}");
            assert_eq!(reasons["io"], 2 * n + 10, "{run} tid {tid}");
            assert_eq!(reasons["msr"], n, "{run} tid {tid}");
            assert_eq!(reasons["hlt"], 1, "{run} tid {tid}");
            let npf = reasons["npf"];
            assert!((2 * n..2 * n + 16).contains(&npf), "{run} tid {tid}: npf {npf}");
        }
    }
}

/// The kernel's text `trace`, re-encoded through the format files into pages, decodes to the
/// same events as the raw pages: same order per CPU, µs timestamps, pids, names, and the field
/// values the text shows (kvm_exit reason and rip, sched_switch pids and state, vectors).
#[test]
fn text_trace_reencoded_equals_the_raw_pages() {
    use virtprof_trace::text::{parse_line, PageWriter, TextEncoder};
    for run in RUNS {
        let (dump, raw) = decode_flat(run);
        let layout = dump.decoder.layout().clone();
        let encoder = TextEncoder::new(&layout);
        let text = std::fs::read_to_string(fixture(run).join("tracefs/trace")).unwrap();
        let mut writers: BTreeMap<u32, PageWriter> = BTreeMap::new();
        let mut lines = 0;
        for line in text.lines().filter_map(parse_line) {
            let record = encoder.encode(&line).unwrap();
            writers.entry(line.cpu).or_insert_with(|| PageWriter::new(&layout)).push(line.ts, &record).unwrap();
            lines += 1;
        }
        assert_eq!(lines, raw.len(), "{run}: one record per text line");
        let mut decoder = virtprof_trace::decode::Decoder::new(layout.clone());
        for (cpu, mut w) in writers {
            w.flush();
            let mine = per_cpu(&raw, cpu);
            let mut i = 0;
            for bytes in w.pages.chunks(layout.header.page_size) {
                let page = Page::parse(bytes, &layout.header).unwrap();
                for rec in page.records() {
                    let rec = rec.unwrap();
                    let e = decoder.decode(cpu, &rec).unwrap();
                    let want = mine[i];
                    i += 1;
                    assert_eq!((e.ts / 1000, e.tid as i64), ((want.ts + 500) / 1000, want.pid), "{run} cpu{cpu} #{i}");
                    let field = |k: &str| want.fields[k].parse::<u64>().unwrap();
                    let field32 = |k: &str| want.fields[k].parse::<u32>().unwrap();
                    match e.kind {
                        EventKind::KvmExit { reason, isa, guest_rip, vcpu_id, .. } => {
                            assert_eq!(want.name, "kvm_exit");
                            let got = decoder.exit_reason_name(reason, isa).unwrap();
                            let expected =
                                dump.decoder.exit_reason_name(field32("exit_reason"), field32("isa")).unwrap();
                            assert_eq!((got, guest_rip, vcpu_id), (expected, field("guest_rip"), field32("vcpu_id")));
                        }
                        EventKind::SchedSwitch { prev_tid, next_tid, prev_state, .. } => {
                            assert_eq!((prev_tid, next_tid), (field32("prev_pid"), field32("next_pid")));
                            // The text shows the state's task-state bits ("R", "S", "I", "R+" ...).
                            assert_eq!(u64::from(prev_state) & 0xff, field("prev_state") & 0xff, "{run}: prev_state");
                        }
                        EventKind::IrqVectorEntry { vector, .. } | EventKind::IrqVectorExit { vector, .. } => {
                            assert_eq!(u64::from(vector), field("vector"));
                        }
                        _ => {}
                    }
                }
            }
            assert_eq!(i, mine.len(), "{run} cpu{cpu}: event count");
        }
    }
}

/// Events as delivered, task names spelled out (each decoder numbers them its own way).
type Delivered = Vec<(Event, String, String)>;

/// What a walk delivered and how it ended, on the fixture `run` (with page `cut` of the first
/// CPU damaged, if given).
fn walk(
    run: &str,
    cut: Option<usize>,
    merge: impl Fn(&mut Decoder, &[CpuStream<'_>], &mut dyn FnMut(&Event, &Decoder)) -> Result<WalkStats, WalkError>,
) -> (Delivered, Result<WalkStats, String>) {
    let mut dump = Dump::open(&fixture(run).join("tracefs")).unwrap();
    let mut raws: Vec<(u32, Vec<u8>)> = dump.cpus.iter().map(|c| (c.cpu, c.raw.clone())).collect();
    if let Some(page) = cut {
        // Break one CPU's page: a commit size larger than the page.
        let raw = &mut raws[0].1;
        raw[page * 4096 + 8..page * 4096 + 16].copy_from_slice(&u64::MAX.to_le_bytes());
    }
    let streams: Vec<CpuStream<'_>> = raws.iter().map(|(cpu, raw)| CpuStream::contiguous(*cpu, raw)).collect();
    let mut out = Vec::new();
    let result = merge(&mut dump.decoder, &streams, &mut |e, d| {
        let mut e = *e;
        let names = match &mut e.kind {
            EventKind::SchedSwitch { prev_comm, next_comm, .. } => {
                let names = (d.strings.resolve(*prev_comm).to_string(), d.strings.resolve(*next_comm).to_string());
                (*prev_comm, *next_comm) = (StrId(0), StrId(0));
                names
            }
            _ => (String::new(), String::new()),
        };
        out.push((e, names.0, names.1));
    });
    (out, result.map_err(|e| e.to_string()))
}

#[test]
fn parallel_decoding_delivers_what_serial_decoding_does() {
    use virtprof_trace::merge::{merge_cpus_parallel, merge_cpus_serial};
    let serial = |d: &mut _, s: &[CpuStream<'_>], f: &mut dyn FnMut(&Event, &_)| merge_cpus_serial(d, s, f);
    let parallel = |d: &mut _, s: &[CpuStream<'_>], f: &mut dyn FnMut(&Event, &_)| merge_cpus_parallel(d, s, f);
    for run in RUNS {
        let (a, sa) = walk(run, None, serial);
        let (b, sb) = walk(run, None, parallel);
        assert!(a.len() > 1000 && a.iter().any(|x| !x.1.is_empty()), "{run}: events with task names");
        assert_eq!(a, b, "{run}: same events, same order, same names");
        assert_eq!(sa, sb, "{run}: same counts");
        // A damaged page: the same events up to it, then the same error.
        let (a, sa) = walk(run, Some(1), serial);
        let (b, sb) = walk(run, Some(1), parallel);
        assert!(sa.is_err(), "{run}: {sa:?}");
        assert_eq!((a, sa), (b, sb), "{run}");
    }
}

/// A dump made on this project's PVM host (Linux 6.18) with 4 KB per-CPU buffers: the kernel
/// dropped events and flagged the first page (`scripts/fixtures/lossy.sh`).
const LOSSY: &str = "pvm-6.18-lossy";

#[test]
fn lossy_pages_decode_like_the_kernels_text_and_count_what_it_dropped() {
    let (dump, ours) = decode_flat(LOSSY);
    let text = text_trace(LOSSY);
    assert!(!text.is_empty());
    assert_eq!(ours.len(), text.len());
    for cpu in dump.cpus.iter().map(|c| c.cpu) {
        let theirs: Vec<_> = text.iter().filter(|t| t.0 == cpu).collect();
        for (m, t) in per_cpu(&ours, cpu).iter().zip(theirs) {
            assert_eq!(((m.ts + 500) / 1000, m.pid, m.name.as_str()), (t.1, t.2, t.3.as_str()), "cpu{cpu}");
        }
    }
    // The counts stored on the pages are exactly the kernel's per-CPU overrun counters.
    let mut dump = dump;
    let cpus = dump.cpus.clone();
    let streams: Vec<CpuStream<'_>> = cpus.iter().map(|c| CpuStream::contiguous(c.cpu, &c.raw)).collect();
    let mut lost_markers = Vec::new();
    let stats = merge_cpus(&mut dump.decoder, &streams, |e, _| {
        if let EventKind::Lost { count } = e.kind {
            lost_markers.push((e.cpu, count));
        }
    })
    .unwrap();
    let mut lossy_cpus = 0;
    for cpu in &cpus {
        let overrun: u64 = cpu
            .stats
            .lines()
            .find_map(|l| l.strip_prefix("overrun: "))
            .and_then(|v| v.trim().parse().ok())
            .expect("stats has overrun");
        let on_pages = stats.page_loss.cpus.iter().find(|c| c.cpu == cpu.cpu).map_or(0, |c| c.on_pages);
        assert_eq!(on_pages, overrun, "cpu{}", cpu.cpu);
        lossy_cpus += usize::from(overrun > 0);
    }
    assert!(lossy_cpus > 0, "the fixture must hold a lossy page");
    assert_eq!(lost_markers.len() as u64, stats.page_loss.gaps());
    assert!(lost_markers.iter().all(|(_, count)| count.is_some()), "{lost_markers:?}");
}
