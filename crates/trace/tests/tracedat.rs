//! A trace-cmd 3.1 `trace.dat` (version 7, zstd) of the kvm_amd probe decodes to the same events,
//! one for one, as trace-cmd's own `trace-cmd report` of that file, and to the probe's ground
//! truth exit counts.

use std::collections::BTreeMap;
use std::path::Path;

use virtprof_model::EventKind;
use virtprof_trace::decode::{Decoder, Layout};
use virtprof_trace::format::{parse_event_format, parse_header_page};
use virtprof_trace::merge::{merge_cpus, merge_cpus_parallel, merge_cpus_serial, CpuStream};
use virtprof_trace::segment::Segment;

fn run5() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/kvm-amd-run5_tracecmd_2vcpu_pinned")
}

#[test]
fn trace_dat_equals_trace_cmd_report() {
    let bytes = std::fs::read(run5().join("trace.dat")).unwrap();
    let dat = virtprof_trace::tracedat::read(&bytes).unwrap();
    assert_eq!((dat.page_size, dat.cpus().len()), (4096, 2));
    let header = parse_header_page(&dat.header_page).unwrap();
    let formats = dat.formats.iter().map(|f| parse_event_format(&f.system, &f.text()).unwrap()).collect();
    let mut decoder = Decoder::new(Layout::new(header, formats));
    let slices: Vec<CpuStream<'_>> =
        dat.cpus().iter().map(|(c, segments)| CpuStream { cpu: *c, segments: segments.clone() }).collect();
    let mut ours: Vec<(u32, u64, u32, String)> = Vec::new();
    let mut exits: BTreeMap<(u32, String), u64> = BTreeMap::new();
    merge_cpus(&mut decoder, &slices, |e, d| {
        let name = match e.kind {
            EventKind::Lost { .. } => return,
            EventKind::KvmExit { reason, isa, .. } => {
                *exits.entry((e.tid, d.exit_reason_name(reason, isa).unwrap().to_string())).or_default() += 1;
                "kvm_exit".to_string()
            }
            _ => String::new(),
        };
        ours.push((e.cpu, (e.ts + 500) / 1000, e.tid, name));
    })
    .unwrap();

    // trace-cmd report: `comm-pid [cpu] secs.usecs: name: fields`, first line `cpus=N`.
    let report = std::fs::read_to_string(run5().join("trace-cmd_report.txt")).unwrap();
    let theirs: Vec<(u32, u64, u32, String)> = report
        .lines()
        .filter(|l| l.contains("]"))
        .map(|l| {
            let (task, rest) = l.split_once(" [").unwrap();
            let pid = task.rsplit('-').next().unwrap().trim().parse().unwrap();
            let (cpu, rest) = rest.split_once(']').unwrap();
            let (ts, rest) = rest.trim_start().split_once(": ").unwrap();
            let (s, us) = ts.split_once('.').unwrap();
            let name = rest.split(':').next().unwrap().trim().to_string();
            (cpu.parse().unwrap(), s.parse::<u64>().unwrap() * 1_000_000 + us.parse::<u64>().unwrap(), pid, name)
        })
        .collect();
    assert_eq!(ours.len(), theirs.len(), "event count");
    // trace-cmd report merges CPUs by timestamp too; compare per CPU to be independent of ties.
    for cpu in 0..2 {
        let a: Vec<_> = ours.iter().filter(|e| e.0 == cpu).collect();
        let b: Vec<_> = theirs.iter().filter(|e| e.0 == cpu).collect();
        assert_eq!(a.len(), b.len(), "cpu{cpu}");
        for (x, y) in a.iter().zip(b) {
            assert_eq!((x.1, x.2), (y.1, y.2), "cpu{cpu}: {x:?} vs {y:?}");
            if x.3 == "kvm_exit" {
                assert_eq!(y.3, "kvm_exit");
            }
        }
    }
    // kvm_probe -n 200 -H per vCPU: cpuid 202, io 410, msr 200, hlt 1.
    let per_tid: BTreeMap<u32, BTreeMap<&str, u64>> = exits.iter().fold(BTreeMap::new(), |mut m, ((tid, r), n)| {
        m.entry(*tid).or_default().insert(r.as_str(), *n);
        m
    });
    assert_eq!(per_tid.len(), 2);
    for reasons in per_tid.values() {
        assert_eq!((reasons["cpuid"], reasons["io"], reasons["msr"], reasons["hlt"]), (202, 410, 200, 1));
    }
}

fn decoder_of(dat: &virtprof_trace::tracedat::TraceDat<'_>) -> Decoder {
    let header = parse_header_page(&dat.header_page).unwrap();
    let formats = dat.formats.iter().map(|f| parse_event_format(&f.system, &f.text()).unwrap()).collect();
    Decoder::new(Layout::new(header, formats))
}

#[test]
fn compressed_frames_stream_through_both_walks_alike() {
    let bytes = std::fs::read(run5().join("trace.dat")).unwrap();
    let dat = virtprof_trace::tracedat::read(&bytes).unwrap();
    // The pages stay compressed until a walk reaches them.
    assert!(
        dat.cpus().iter().all(|(_, s)| s.len() > 1 && s.iter().all(Segment::is_compressed)),
        "{:?}",
        dat.cpus().len()
    );
    let streams: Vec<CpuStream<'_>> =
        dat.cpus().iter().map(|(c, segments)| CpuStream { cpu: *c, segments: segments.clone() }).collect();
    let walk = |parallel: bool| {
        let mut decoder = decoder_of(&dat);
        let mut events = Vec::new();
        let sink = |e: &virtprof_model::Event, _: &Decoder| events.push((e.ts, e.cpu, e.tid));
        let stats = if parallel {
            merge_cpus_parallel(&mut decoder, &streams, sink)
        } else {
            merge_cpus_serial(&mut decoder, &streams, sink)
        }
        .unwrap();
        (stats, events)
    };
    let (serial, parallel) = (walk(false), walk(true));
    assert_eq!(serial.1.len() as u64, serial.0.events);
    assert_eq!(serial, parallel);

    // A damaged frame is a walk error naming its CPU and where in the file the frame is.
    let all = dat.cpus();
    let (cpu, segments) = &all[1];
    let Segment::Frame { codec, frame, size, offset } = segments[2] else { unreachable!() };
    let mut damaged = frame.to_vec();
    damaged[frame.len() / 2] ^= 0xff;
    let mut broken = segments.clone();
    broken[2] = Segment::Frame { codec, frame: &damaged, size, offset };
    let streams = [CpuStream { cpu: *cpu, segments: broken }];
    for parallel in [false, true] {
        let mut decoder = decoder_of(&dat);
        let result = if parallel {
            merge_cpus_parallel(&mut decoder, &streams, |_, _| {})
        } else {
            merge_cpus_serial(&mut decoder, &streams, |_, _| {})
        };
        let err = result.unwrap_err();
        assert_eq!(err.cpu, *cpu);
        assert!(err.message.contains(&format!("zstd frame at byte {offset}")), "{err}");
    }
}
