//! `--verify`: the kernel's own word that swaps moved the threads. A private tracefs instance
//! records `sched_switch`; every time a vCPU thread is switched in, it must be on the CPU the
//! actuator last put it on. Switch-ins while a move is in flight (between the start and the
//! end of the affinity calls) are not judged.

use serde::Serialize;
use virtprof_model::event::EventKind;
use virtprof_trace::capture::{Capture, CaptureConfig};
use virtprof_trace::decode::Decoder;
use virtprof_trace::merge::{merge_cpus, CpuStream};
use virtprof_trace::tracefs::{load_layout, Tracefs};

/// A placement the actuator made: from `start_ns` (affinity calls begin) and settled at
/// `done_ns` (they returned), thread `tid` belongs on `cpu`.
#[derive(Debug, Clone, Copy)]
pub struct Placement {
    /// Thread.
    pub tid: u32,
    /// Its CPU from now on.
    pub cpu: u32,
    /// When the affinity calls of this move began (monotonic ns).
    pub start_ns: u64,
    /// When they had all returned.
    pub done_ns: u64,
}

/// What the trace showed.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Verification {
    /// Placements judged (pins and swap moves).
    pub placements: u64,
    /// Placements after which the thread was switched in on its new CPU before its next move.
    pub observed: u64,
    /// Switch-ins of vCPU threads judged.
    pub switch_ins: u64,
    /// Switch-ins on a CPU other than the one the thread was placed on.
    pub wrong_cpu: u64,
    /// The first few of those, for the report.
    pub examples: Vec<String>,
    /// Events the kernel dropped (the check is incomplete if this is not 0).
    pub lost_events: u64,
}

/// A running sched trace of the vCPU threads.
pub struct Tracer {
    // Field order is drop order: the capture (and its tracefs instance) goes first.
    capture: Capture,
    decoder: Decoder,
    tids: Vec<u32>,
    switch_ins: Vec<(u64, u32, u32)>,
}

impl Tracer {
    /// Start tracing `sched_switch` for `tids`.
    pub fn start(tids: &[u32]) -> anyhow::Result<Tracer> {
        let tracefs = Tracefs::locate_or_mount()?;
        let header_page = virtprof_trace::tracefs::read_file(&tracefs.root().join("events/header_page"))?;
        let page_size = virtprof_trace::format::parse_header_page(&header_page)?.page_size;
        let config =
            CaptureConfig { events: vec!["sched:sched_switch".into()], buffer_size_kb: 4096, clock: "mono".into() };
        let (capture, missing) = Capture::start(&tracefs, &config, page_size)?;
        if !missing.is_empty() {
            anyhow::bail!("--verify needs the sched:sched_switch tracepoint, which this kernel lacks");
        }
        let decoder = Decoder::new(load_layout(tracefs.root(), &["sched"])?);
        Ok(Tracer { capture, decoder, tids: tids.to_vec(), switch_ins: Vec::new() })
    }

    /// Take in what the kernel has buffered (call often enough that the buffer never fills).
    pub fn drain(&mut self) -> anyhow::Result<()> {
        let mut batches: Vec<(u32, Vec<u8>)> = Vec::new();
        while self.capture.poll(256, |cpu, pages| batches.push((cpu, pages)))? > 0 {}
        let streams: Vec<CpuStream<'_>> = batches.iter().map(|(cpu, raw)| CpuStream::contiguous(*cpu, raw)).collect();
        let (tids, switch_ins) = (&self.tids, &mut self.switch_ins);
        merge_cpus(&mut self.decoder, &streams, |e, _| {
            if let EventKind::SchedSwitch { next_tid, .. } = e.kind {
                if tids.contains(&next_tid) {
                    switch_ins.push((e.ts, next_tid, e.cpu));
                }
            }
        })?;
        Ok(())
    }

    /// Stop, read the rest, and judge every placement.
    pub fn finish(mut self, placements: &[Placement]) -> anyhow::Result<Verification> {
        self.capture.stop()?;
        self.drain()?;
        let lost_events = self.capture.loss().iter().map(|l| l.overrun + l.dropped).sum();
        let mut v = judge(&mut self.switch_ins, placements);
        v.lost_events = lost_events;
        self.capture.close();
        Ok(v)
    }
}

/// Judge switch-ins `(ts, tid, cpu)` against the placements: a switch-in on the new CPU from
/// the start of the thread's affinity call shows the move (the kernel may run it there before
/// the call returns); one on another CPU after the call returned is wrong.
fn judge(switch_ins: &mut [(u64, u32, u32)], placements: &[Placement]) -> Verification {
    switch_ins.sort_unstable();
    let mut v = Verification::default();
    for (n, p) in placements.iter().enumerate() {
        // This placement holds until the thread's next move begins.
        let until = placements[n + 1..].iter().find(|q| q.tid == p.tid).map_or(u64::MAX, |q| q.start_ns);
        v.placements += 1;
        let first = switch_ins.partition_point(|s| s.0 < p.start_ns);
        let mut seen = false;
        for &(ts, tid, cpu) in switch_ins[first..].iter().take_while(|s| s.0 < until) {
            if tid != p.tid {
                continue;
            }
            if cpu == p.cpu {
                seen = true;
            }
            if ts <= p.done_ns {
                continue;
            }
            v.switch_ins += 1;
            if cpu != p.cpu {
                v.wrong_cpu += 1;
                if v.examples.len() < 5 {
                    v.examples.push(format!("thread {tid} ran on CPU {cpu} at {ts} ns, placed on CPU {}", p.cpu));
                }
            }
        }
        v.observed += u64::from(seen);
        if !seen && v.examples.len() < 5 {
            v.examples.push(format!(
                "thread {} placed on CPU {} at {} ns was not seen running there before its next move",
                p.tid, p.cpu, p.start_ns
            ));
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(tid: u32, cpu: u32, start_ns: u64) -> Placement {
        Placement { tid, cpu, start_ns, done_ns: start_ns + 5 }
    }

    #[test]
    fn switch_ins_are_judged_against_the_latest_placement() {
        let placements = [at(1, 0, 0), at(2, 1, 0), at(1, 1, 100), at(2, 0, 100)];
        let mut ins = vec![(50, 1, 0), (60, 2, 1), (103, 1, 0), (150, 1, 1), (160, 2, 0), (170, 3, 1)];
        let v = judge(&mut ins, &placements);
        assert_eq!((v.placements, v.observed, v.switch_ins, v.wrong_cpu), (4, 4, 4, 0), "{v:?}");
        let mut ins = vec![(50, 1, 0), (150, 1, 0)];
        let v = judge(&mut ins, &placements);
        assert_eq!((v.observed, v.switch_ins, v.wrong_cpu), (1, 2, 1), "a move never seen on its CPU: {v:?}");
        assert!(v.examples.iter().any(|e| e.contains("thread 1 ran on CPU 0 at 150 ns")), "{v:?}");
        assert!(v.examples.iter().any(|e| e.contains("thread 1 placed on CPU 1 at 100 ns was not seen")), "{v:?}");
    }
}
