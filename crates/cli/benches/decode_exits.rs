//! Decode + exit analysis throughput on one core, in events/s: the real kvm_amd capture's raw
//! pages (9 625 events), repeated 50 times per CPU, through the per-CPU merge, the typed
//! decoder and the exits analyzer — the path `virtprof exits FILE` takes after reading the file
//! (on one core; the last figure decodes each CPU on a thread of its own, as `exits` does on
//! big files).
//!
//! `cargo bench -p virtprof-cli --bench decode_exits`

use std::hint::black_box;
use std::path::Path;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use virtprof_analysis::exits::{ExitAnalyzer, ExitOptions};
use virtprof_analysis::Names;
use virtprof_model::StrId;
use virtprof_trace::decode::Decoder;
use virtprof_trace::dump::Dump;
use virtprof_trace::merge::{merge_cpus_parallel, merge_cpus_serial, CpuStream};

const REPEAT: usize = 50;

struct NoNames;
impl Names for NoNames {
    fn exit_reason(&self, reason: u32, _: u32) -> String {
        reason.to_string()
    }
    fn userspace_reason(&self, reason: u32) -> String {
        reason.to_string()
    }
    fn event(&self, id: u16) -> String {
        id.to_string()
    }
    fn task(&self, id: StrId) -> String {
        id.0.to_string()
    }
}

fn bench(c: &mut Criterion) {
    let root =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../trace/tests/fixtures/kvm-amd-run3_2vcpu_2cpu_pinned/tracefs");
    let dump = Dump::open(&root).unwrap();
    let cpus: Vec<(u32, Vec<u8>)> = dump.cpus.iter().map(|c| (c.cpu, c.raw.repeat(REPEAT))).collect();
    let slices: Vec<CpuStream<'_>> = cpus.iter().map(|(c, r)| CpuStream::contiguous(*c, r)).collect();
    let layout = dump.decoder.layout().clone();
    let mut count = Decoder::new(layout.clone());
    let events = merge_cpus_serial(&mut count, &slices, |_, _| {}).unwrap().events;
    let mut group = c.benchmark_group("decode");
    group.throughput(Throughput::Elements(events));
    group.sample_size(20);
    group.bench_function("merge+decode", |b| {
        b.iter(|| {
            let mut decoder = Decoder::new(layout.clone());
            merge_cpus_serial(&mut decoder, &slices, |e, _| {
                black_box(e);
            })
            .unwrap()
        })
    });
    group.bench_function("merge+decode+exits", |b| {
        b.iter(|| {
            let mut decoder = Decoder::new(layout.clone());
            let mut exits = ExitAnalyzer::new(ExitOptions::default());
            merge_cpus_serial(&mut decoder, &slices, |e, _| exits.on_event(e)).unwrap();
            black_box(exits.finish(&NoNames))
        })
    });
    // What `virtprof exits` does on a big file: each CPU decoded on its own thread, the merge
    // and the analysis on this one.
    group.bench_function("parallel merge+decode+exits", |b| {
        b.iter(|| {
            let mut decoder = Decoder::new(layout.clone());
            let mut exits = ExitAnalyzer::new(ExitOptions::default());
            merge_cpus_parallel(&mut decoder, &slices, |e, _| exits.on_event(e)).unwrap();
            black_box(exits.finish(&NoNames))
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
