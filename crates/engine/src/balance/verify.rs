//! `--verify`: the kernel's own word that swaps moved the threads. A private tracefs instance
//! records `sched_switch`; every time a vCPU thread is switched in or out, it must be on the
//! CPU the actuator last put it on. Switches while a move is in flight (between the start and
//! the end of the affinity calls) are not judged.
//!
//! Switch-outs count as evidence because switch-ins are not always traced: on some kernels
//! (this project's PVM-based CI host among them) a CPU leaving idle emits no `sched_switch`,
//! so a thread moved onto an idle CPU is first seen there when it leaves it.

use serde::Serialize;
use virtprof_model::event::{Event, EventKind};
use virtprof_model::Loss;

use virtprof_session::LiveTrace;

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
    /// Placements after which the thread was seen switching in or out on its new CPU.
    pub observed: u64,
    /// Switches (in and out) of vCPU threads judged.
    pub switches: u64,
    /// Switches on a CPU other than the one the thread was placed on.
    pub wrong_cpu: u64,
    /// The first few of those, for the report.
    pub examples: Vec<String>,
    /// Events the kernel dropped (the check is incomplete if this is not 0).
    pub lost_events: u64,
    /// Where and how they were lost, as every reading command reports it.
    pub loss: Loss,
    /// The same for people, times from the start of the trace.
    pub lost_events_text: String,
}

/// A running sched trace of the vCPU threads.
pub struct Tracer {
    trace: LiveTrace,
    /// When tracing began (CLOCK_MONOTONIC, the trace's clock).
    started_ns: u64,
    tids: Vec<u32>,
    switches: Vec<Switch>,
}

/// A vCPU thread entering or leaving a CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Switch {
    ts: u64,
    tid: u32,
    cpu: u32,
    /// Leaving (it ran there until `ts`) rather than entering.
    out: bool,
}

/// Note the switches of `tids` in `e`.
fn collect(tids: &[u32], switches: &mut Vec<Switch>, e: &Event) {
    if let EventKind::SchedSwitch { prev_tid, next_tid, .. } = e.kind {
        for (tid, out) in [(prev_tid, true), (next_tid, false)] {
            if tids.contains(&tid) {
                switches.push(Switch { ts: e.ts, tid, cpu: e.cpu, out });
            }
        }
    }
}

impl Tracer {
    /// Start tracing `sched_switch` for `tids`, `buffer_kb` KiB of ring buffer per CPU.
    pub fn start(tids: &[u32], buffer_kb: u32) -> anyhow::Result<Tracer> {
        let trace = LiveTrace::start(&["sched:sched_switch"], "mono", buffer_kb, &["sched"])?;
        if !trace.missing.is_empty() {
            anyhow::bail!("--verify needs the sched:sched_switch tracepoint, which this kernel lacks");
        }
        Ok(Tracer {
            trace,
            started_ns: virtprof_host::clock::monotonic_ns(),
            tids: tids.to_vec(),
            switches: Vec::new(),
        })
    }

    /// Take in what the kernel has buffered (call often enough that the buffer never fills).
    pub fn drain(&mut self) -> anyhow::Result<()> {
        let (tids, switches) = (&self.tids, &mut self.switches);
        Ok(self.trace.drain(|e| collect(tids, switches, e))?)
    }

    /// Stop, read the rest, and judge every placement.
    pub fn finish(self, placements: &[Placement]) -> anyhow::Result<Verification> {
        let Tracer { trace, started_ns, tids, mut switches } = self;
        let (lost, _) = trace.finish(|e| collect(&tids, &mut switches, e))?;
        let mut v = judge(&mut switches, placements);
        v.lost_events = lost.total();
        v.lost_events_text = lost.describe(started_ns);
        v.loss = lost;
        Ok(v)
    }
}

/// Judge switches against the placements. A switch on the new CPU from the start of the
/// thread's affinity call shows the move (the kernel may run it there before the call
/// returns); so does a switch-out there until the thread's next move has settled (that move
/// is what takes it off). A switch on another CPU after the call returned and before the next
/// move began is wrong.
fn judge(switches: &mut [Switch], placements: &[Placement]) -> Verification {
    switches.sort_unstable();
    let mut v = Verification::default();
    for (n, p) in placements.iter().enumerate() {
        // This placement holds until the thread's next move begins.
        let next = placements[n + 1..].iter().find(|q| q.tid == p.tid);
        let (until, settled) = next.map_or((u64::MAX, u64::MAX), |q| (q.start_ns, q.done_ns));
        v.placements += 1;
        let first = switches.partition_point(|s| s.ts < p.start_ns);
        let mut seen = false;
        for s in switches[first..].iter().take_while(|s| s.ts <= settled).filter(|s| s.tid == p.tid) {
            if s.ts >= until {
                seen |= s.out && s.cpu == p.cpu;
                continue;
            }
            seen |= s.cpu == p.cpu;
            if s.ts <= p.done_ns {
                continue;
            }
            v.switches += 1;
            if s.cpu != p.cpu {
                v.wrong_cpu += 1;
                if v.examples.len() < 5 {
                    let what = if s.out { "left" } else { "entered" };
                    v.examples
                        .push(format!("thread {} {what} CPU {} at {} ns, placed on CPU {}", s.tid, s.cpu, s.ts, p.cpu));
                }
            }
        }
        v.observed += u64::from(seen);
        if !seen && v.examples.len() < 5 {
            v.examples.push(format!(
                "thread {} placed on CPU {} at {} ns was not seen there before its next move",
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

    fn enter(ts: u64, tid: u32, cpu: u32) -> Switch {
        Switch { ts, tid, cpu, out: false }
    }

    fn leave(ts: u64, tid: u32, cpu: u32) -> Switch {
        Switch { ts, tid, cpu, out: true }
    }

    #[test]
    fn switches_are_judged_against_the_latest_placement() {
        let placements = [at(1, 0, 0), at(2, 1, 0), at(1, 1, 100), at(2, 0, 100)];
        let mut sw = vec![enter(50, 1, 0), enter(60, 2, 1), enter(103, 1, 0), enter(150, 1, 1), enter(160, 2, 0)];
        sw.push(enter(170, 3, 1));
        let v = judge(&mut sw, &placements);
        assert_eq!((v.placements, v.observed, v.switches, v.wrong_cpu), (4, 4, 4, 0), "{v:?}");
        let mut sw = vec![enter(50, 1, 0), enter(150, 1, 0)];
        let v = judge(&mut sw, &placements);
        assert_eq!((v.observed, v.switches, v.wrong_cpu), (1, 2, 1), "a move never seen on its CPU: {v:?}");
        assert!(v.examples.iter().any(|e| e.contains("thread 1 entered CPU 0 at 150 ns")), "{v:?}");
        assert!(v.examples.iter().any(|e| e.contains("thread 1 placed on CPU 1 at 100 ns was not seen")), "{v:?}");
    }

    #[test]
    fn a_switch_out_shows_a_move_whose_switch_in_was_not_traced() {
        // Thread 1 goes onto an idle CPU 1 at 100 (no switch-in traced) and is taken off it by
        // its next move at 200, which is settled at 205.
        let placements = [at(1, 0, 0), at(1, 1, 100), at(1, 0, 200)];
        let mut sw = vec![enter(10, 1, 0), leave(101, 1, 0), leave(202, 1, 1), enter(204, 1, 0)];
        let v = judge(&mut sw, &placements);
        assert_eq!((v.placements, v.observed, v.wrong_cpu), (3, 3, 0), "{v:?}");
        // A switch-out on the old CPU after the move settled is wrong.
        let mut sw = vec![enter(10, 1, 0), leave(150, 1, 0), leave(202, 1, 1)];
        let v = judge(&mut sw, &placements);
        assert_eq!(v.wrong_cpu, 1, "{v:?}");
        assert!(v.examples.iter().any(|e| e.contains("thread 1 left CPU 0 at 150 ns, placed on CPU 1")), "{v:?}");
    }
}
