//! What a guest's own CPUs did, from the guest's own trace: per guest CPU, from its first
//! sched_switch on, the time it ran a task and the time it ran its idle task (tid 0), the
//! tasks that ran longest, and its interrupts and softirqs. Beside its host's run / wait /
//! blocked of the vCPU thread that runs the CPU, it says whether a vCPU the host kept waiting
//! had work to do. The guest's clock runs on while its vCPU is off the host CPU, so a task's
//! time includes the steal it suffered.

use std::collections::{BTreeMap, HashMap};

use virtprof_model::{Event, EventKind};

use crate::{Analyzer, Names};

/// Distinct tasks kept per guest (a hostile file may name millions): past it a task's time
/// counts in its CPU's busy time but under no task.
pub const MAX_TASKS: usize = 65_536;

/// One guest task's time on one guest CPU.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct TaskTime {
    /// Guest thread id.
    pub tid: u32,
    /// Its name when first seen.
    pub name: String,
    /// Time it ran, ns.
    pub ns: u64,
}

/// One guest CPU's use.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GuestCpuUse {
    /// Guest CPU.
    pub cpu: u32,
    /// Its first sched_switch (before it, who ran is unknown), host clock; None: it had none.
    pub from_ns: Option<u64>,
    /// The trace's last event.
    pub to_ns: u64,
    /// Time a task other than the idle task ran.
    pub busy_ns: u64,
    /// Time the idle task ran.
    pub idle_ns: u64,
    /// Context switches.
    pub switches: u64,
    /// Interrupt handler entries.
    pub irqs: u64,
    /// Softirq entries.
    pub softirqs: u64,
    /// The tasks that ran longest, longest first (the idle task left out).
    pub top: Vec<TaskTime>,
}

/// The task on a guest CPU since its last switch.
#[derive(Default)]
struct Cpu {
    first_switch: Option<u64>,
    running: Option<(u64, u32)>,
    busy_ns: u64,
    idle_ns: u64,
    switches: u64,
    irqs: u64,
    softirqs: u64,
    /// tid → (ns, name).
    tasks: HashMap<u32, (u64, String)>,
}

impl Cpu {
    /// Charge the running task up to `ts`; returns its tid and time.
    fn close(&mut self, ts: u64) -> Option<(u32, u64)> {
        let (since, tid) = self.running.take()?;
        let ns = ts.saturating_sub(since);
        if tid == 0 {
            self.idle_ns += ns;
        } else {
            self.busy_ns += ns;
        }
        Some((tid, ns))
    }
}

/// Push-fed: the guest's events, in time order per CPU.
#[derive(Default)]
pub struct GuestCpus {
    cpus: BTreeMap<u32, Cpu>,
    tasks: usize,
    last_ts: u64,
    /// Runs of tasks past the first [`MAX_TASKS`], whose time counts in busy time under no task.
    pub tasks_dropped: u64,
}

impl GuestCpus {
    /// Each guest CPU's use, the task running at the end charged up to the last event;
    /// `top` tasks each.
    pub fn finish(mut self, top: usize) -> Vec<GuestCpuUse> {
        let end = self.last_ts;
        let mut out = Vec::with_capacity(self.cpus.len());
        for (number, mut cpu) in std::mem::take(&mut self.cpus) {
            if let Some((tid, ns)) = cpu.close(end) {
                if let Some(task) = cpu.tasks.get_mut(&tid) {
                    task.0 += ns;
                }
            }
            let mut tasks: Vec<TaskTime> = cpu
                .tasks
                .into_iter()
                .filter(|&(tid, _)| tid != 0)
                .map(|(tid, (ns, name))| TaskTime { tid, name, ns })
                .collect();
            tasks.sort_by(|a, b| b.ns.cmp(&a.ns).then(a.tid.cmp(&b.tid)));
            tasks.truncate(top);
            out.push(GuestCpuUse {
                cpu: number,
                from_ns: cpu.first_switch,
                to_ns: end,
                busy_ns: cpu.busy_ns,
                idle_ns: cpu.idle_ns,
                switches: cpu.switches,
                irqs: cpu.irqs,
                softirqs: cpu.softirqs,
                top: tasks,
            });
        }
        out
    }
}

impl Analyzer for GuestCpus {
    fn on_event(&mut self, e: &Event, names: &dyn Names) {
        self.last_ts = self.last_ts.max(e.ts);
        let cpu = self.cpus.entry(e.cpu).or_default();
        match e.kind {
            EventKind::SchedSwitch { next_tid, next_comm, .. } => {
                cpu.switches += 1;
                cpu.first_switch.get_or_insert(e.ts);
                if let Some((tid, ns)) = cpu.close(e.ts) {
                    if let Some(task) = cpu.tasks.get_mut(&tid) {
                        task.0 += ns;
                    }
                }
                cpu.running = Some((e.ts, next_tid));
                if let std::collections::hash_map::Entry::Vacant(entry) = cpu.tasks.entry(next_tid) {
                    if self.tasks < MAX_TASKS {
                        self.tasks += 1;
                        entry.insert((0, names.task(next_comm)));
                    } else {
                        self.tasks_dropped += 1;
                    }
                }
            }
            EventKind::IrqEntry { .. } | EventKind::IrqVectorEntry { .. } => cpu.irqs += 1,
            EventKind::SoftirqEntry { .. } => cpu.softirqs += 1,
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_and_idle_from_the_first_switch_with_the_longest_tasks() {
        let switch = crate::switch_to;
        let mut g = GuestCpus::default();
        for (ts, cpu, kind) in [
            (10, 0, EventKind::IrqEntry { irq: 4 }),
            (20, 0, switch(7, 1)),
            (30, 0, EventKind::SoftirqEntry { vec: 1 }),
            (50, 0, switch(0, 0)),
            (60, 0, switch(8, 2)),
            (70, 0, switch(7, 1)),
            (90, 1, EventKind::Other { event: 3 }),
        ] {
            g.on_event(&Event { ts, cpu, tid: 0, kind }, &crate::TestNames);
        }
        let cpus = g.finish(2);
        let c = &cpus[0];
        assert_eq!((c.from_ns, c.to_ns, c.busy_ns, c.idle_ns), (Some(20), 90, 30 + 10 + 20, 10));
        assert_eq!((c.switches, c.irqs, c.softirqs), (4, 1, 1));
        let top: Vec<_> = c.top.iter().map(|t| (t.tid, t.name.as_str(), t.ns)).collect();
        assert_eq!(top, [(7, "task1", 50), (8, "task2", 10)]);
        // A CPU with no switch: nothing known of who ran.
        assert_eq!((cpus[1].from_ns, cpus[1].busy_ns, cpus[1].idle_ns), (None, 0, 0));
    }
}
