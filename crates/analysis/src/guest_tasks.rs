//! A guest's own CPUs as slices: which guest task ran on each guest CPU when (from the guest's
//! sched_switch events), and its interrupts as instants, for drawing the guest beside its host
//! on one timeline. Built from a guest trace already placed on the host's clock.

use std::collections::BTreeMap;

use virtprof_model::{Event, EventKind};

use crate::{Analyzer, Names};

/// Slices and instants kept in all; past it they are counted, not kept.
pub const MAX_ITEMS: usize = 4_000_000;

/// A guest task on a guest CPU.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskSlice {
    /// From, host clock.
    pub start_ns: u64,
    /// To.
    pub end_ns: u64,
    /// Guest thread id (0: the idle task).
    pub tid: u32,
    /// Its name.
    pub name: String,
}

/// One guest CPU's timeline.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GuestCpu {
    /// Guest CPU.
    pub cpu: u32,
    /// Tasks that ran, in time order (from the first sched_switch seen on it).
    pub slices: Vec<TaskSlice>,
    /// Interrupt entries: (time, what).
    pub irqs: Vec<(u64, String)>,
}

/// The task on a guest CPU since its last sched_switch.
struct Running {
    since_ns: u64,
    tid: u32,
    name: String,
}

impl Running {
    fn until(self, end_ns: u64) -> TaskSlice {
        TaskSlice { start_ns: self.since_ns, end_ns: end_ns.max(self.since_ns), tid: self.tid, name: self.name }
    }
}

/// One guest CPU while the trace is read.
struct CpuState {
    timeline: GuestCpu,
    running: Option<Running>,
}

/// Push-fed: guest events on the host's clock.
#[derive(Default)]
pub struct GuestTasks {
    cpus: BTreeMap<u32, CpuState>,
    items: usize,
    /// Slices and instants left out over [`MAX_ITEMS`].
    pub dropped: u64,
    last_ts: u64,
}

impl GuestTasks {
    /// Each CPU's timeline; the task running at the end is closed at the last event.
    pub fn finish(self) -> Vec<GuestCpu> {
        let end = self.last_ts;
        self.cpus
            .into_values()
            .map(|mut cpu| {
                if let Some(running) = cpu.running {
                    cpu.timeline.slices.push(running.until(end));
                }
                cpu.timeline
            })
            .collect()
    }

    fn cpu(&mut self, cpu: u32) -> &mut CpuState {
        self.cpus
            .entry(cpu)
            .or_insert_with(|| CpuState { timeline: GuestCpu { cpu, ..Default::default() }, running: None })
    }

    fn room(&mut self) -> bool {
        if self.items < MAX_ITEMS {
            self.items += 1;
            true
        } else {
            self.dropped += 1;
            false
        }
    }
}

impl Analyzer for GuestTasks {
    fn on_event(&mut self, e: &Event, names: &dyn Names) {
        self.last_ts = self.last_ts.max(e.ts);
        let irq = match e.kind {
            EventKind::SchedSwitch { next_tid, next_comm, .. } => {
                let room = self.room();
                let cpu = self.cpu(e.cpu);
                let next = Running { since_ns: e.ts, tid: next_tid, name: names.task(next_comm) };
                if let Some(running) = cpu.running.replace(next) {
                    if room {
                        cpu.timeline.slices.push(running.until(e.ts));
                    }
                }
                return;
            }
            EventKind::IrqEntry { irq, .. } => format!("irq {irq}"),
            EventKind::IrqVectorEntry { vector, .. } => format!("vector {vector:#x}"),
            EventKind::SoftirqEntry { vec } => format!("softirq {vec}"),
            _ => return,
        };
        if self.room() {
            self.cpu(e.cpu).timeline.irqs.push((e.ts, irq));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn switches_make_slices_per_cpu_and_irqs_instants() {
        let switch = crate::switch_to;
        let mut g = GuestTasks::default();
        for (ts, cpu, kind) in [
            (10, 0, EventKind::IrqEntry { irq: 4 }),
            (20, 0, switch(7, 1)),
            (25, 1, switch(0, 0)),
            (30, 0, EventKind::IrqEntry { irq: 4 }),
            (50, 0, switch(0, 0)),
            (90, 1, EventKind::Other { event: 3 }),
        ] {
            g.on_event(&Event { ts, cpu, tid: 0, kind }, &crate::TestNames);
        }
        let cpus = g.finish();
        let slices: Vec<_> = cpus[0].slices.iter().map(|s| (s.start_ns, s.end_ns, s.tid, s.name.as_str())).collect();
        // The task running at the end is closed at the last event of the trace.
        assert_eq!(slices, [(20, 50, 7, "task1"), (50, 90, 0, "task0")]);
        assert_eq!(cpus[0].irqs, [(10, "irq 4".to_string()), (30, "irq 4".to_string())]);
        assert_eq!(cpus[1].slices.len(), 1);
    }
}
