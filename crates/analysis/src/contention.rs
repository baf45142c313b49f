//! Who took the CPU from a set of watched threads (a VM's vCPUs), and what the host did on
//! their CPUs while they ran: XenMon's "who takes whose CPU" and seed 004's host noise, per
//! thread. While a watched thread waits runnable (preempted, or woken and not yet running),
//! the time of each task that runs on the CPU it waits for is charged to that task; while it
//! runs, the host's interrupt, vector and softirq handlers on its CPU are charged to it; its
//! migrations are counted.

use std::collections::{HashMap, HashSet};

use virtprof_model::{Event, EventKind};

use crate::bins::TimeBins;
use crate::{Analyzer, Names};

/// Preemptors kept per watched thread (a host can run many short tasks): past it their time
/// counts under no task.
pub const MAX_PREEMPTORS: usize = 1024;

/// What a watched thread suffered.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Suffered {
    /// Tasks that ran on the CPU it waited for, with their time there meanwhile, ns:
    /// tid → (name, ns).
    pub preemptors: HashMap<u32, (String, u64)>,
    /// Waiting time charged to tasks past [`MAX_PREEMPTORS`].
    pub unnamed_ns: u64,
    /// Hard interrupt handlers (irq and x86 vectors) on its CPU while it ran, ns.
    pub irq_ns: u64,
    /// Interrupts counted.
    pub irqs: u64,
    /// Softirqs on its CPU while it ran, ns.
    pub softirq_ns: u64,
    /// Softirqs counted.
    pub softirqs: u64,
    /// Times the kernel moved it to another CPU.
    pub migrations: u64,
}

impl Suffered {
    /// Add `other` (another thread of the same VM): preemptors by tid, the rest summed.
    pub fn add(&mut self, other: &Suffered) {
        for (tid, (name, ns)) in &other.preemptors {
            self.preemptors.entry(*tid).or_insert_with(|| (name.clone(), 0)).1 += ns;
        }
        self.unnamed_ns += other.unnamed_ns;
        self.irq_ns += other.irq_ns;
        self.irqs += other.irqs;
        self.softirq_ns += other.softirq_ns;
        self.softirqs += other.softirqs;
        self.migrations += other.migrations;
    }
}

/// A watched thread waiting for a CPU.
#[derive(Debug, Clone, Copy)]
struct Waiting {
    tid: u32,
    cpu: u32,
    since: u64,
}

/// One host CPU.
#[derive(Debug, Clone, Default)]
struct Cpu {
    /// The task on it, since when, and its name (None before its first sched_switch).
    current: Option<(u32, u64, virtprof_model::StrId)>,
    /// Its last event's time.
    last_ts: u64,
    /// Open hard interrupt (irq or vector) and softirq handlers' start times.
    irq_since: Option<u64>,
    softirq_since: Option<u64>,
}

/// Push-fed: every host event, in time order.
#[derive(Debug, Default)]
pub struct Contention {
    watched: HashSet<u32>,
    cpus: Vec<Cpu>,
    waiting: Vec<Waiting>,
    suffered: HashMap<u32, Suffered>,
    /// The watched threads' waiting and host-interrupt time over time, where asked for.
    timelines: Option<(TimeBins, TimeBins)>,
}

impl Contention {
    /// Watch these threads.
    pub fn new(watched: impl IntoIterator<Item = u32>) -> Contention {
        Contention { watched: watched.into_iter().collect(), ..Default::default() }
    }

    /// Also bin the watched threads' waiting and host-interrupt time like `bins`.
    pub fn with_timeline(mut self, bins: &TimeBins) -> Contention {
        self.timelines = Some((bins.empty_like(), bins.empty_like()));
        self
    }

    /// The watched threads' waiting and host-interrupt time over time (with
    /// [`Contention::with_timeline`]).
    pub fn take_timelines(&mut self) -> Option<(TimeBins, TimeBins)> {
        self.timelines.take()
    }

    /// What each watched thread suffered (those that suffered nothing are absent).
    pub fn finish(self) -> HashMap<u32, Suffered> {
        self.suffered
    }

    fn cpu(&mut self, cpu: u32) -> &mut Cpu {
        let i = cpu as usize;
        if self.cpus.len() <= i {
            self.cpus.resize(i + 1, Cpu::default());
        }
        &mut self.cpus[i]
    }

    /// Charge the task running on `cpu` with the waits on that CPU, up to `now`. The task
    /// keeps running there until the next switch, so this is done at a switch only.
    fn charge_waits(&mut self, cpu: u32, now: u64, names: &dyn Names) {
        self.charge(cpu, now, names, None);
    }

    /// `tid` makes an event on `cpu` at `now`: if it waited, the trace missed its switch-in.
    /// It ran from where the scheduler accounting places that switch-in
    /// (`SchedAccounting::infer_switch_in`): this CPU's last event since it began waiting,
    /// else when it was queued here, else now. Until then what ran where it waited took it.
    fn end_inferred_wait(&mut self, tid: u32, cpu: u32, now: u64, names: &dyn Names) {
        let Some(w) = self.waiting.iter().find(|w| w.tid == tid).copied() else { return };
        let last = self.cpus.get(cpu as usize).map_or(0, |c| c.last_ts);
        let before = (last > w.since && last <= now).then_some(last);
        let ran_from = match before {
            Some(before) => before,
            None if w.cpu == cpu => w.since,
            None => now,
        };
        self.end_wait(tid, ran_from, names);
    }

    /// The wait of `tid` ended at `now` away from its switch-in on the CPU it waited for (it
    /// runs elsewhere, or its switch-in was not traced): what ran there took it until now.
    fn end_wait(&mut self, tid: u32, now: u64, names: &dyn Names) {
        if let Some(w) = self.waiting.iter().find(|w| w.tid == tid).copied() {
            self.charge(w.cpu, now, names, Some(tid));
            self.waiting.retain(|x| x.tid != tid);
        }
    }

    /// Charge the task running on `cpu` with the waits on it (`only` that one's), to `now`.
    fn charge(&mut self, cpu: u32, now: u64, names: &dyn Names, only: Option<u32>) {
        let Some((running, since, comm)) = self.cpus.get(cpu as usize).and_then(|c| c.current) else { return };
        let waits = self.waiting.iter().filter(|w| w.cpu == cpu && w.tid != running);
        for w in waits.filter(|w| only.is_none_or(|tid| tid == w.tid)) {
            let ns = now.saturating_sub(since.max(w.since));
            if ns == 0 {
                continue;
            }
            if let Some((waits, _)) = &mut self.timelines {
                waits.add_span(since.max(w.since), now);
            }
            let s = self.suffered.entry(w.tid).or_default();
            let room = s.preemptors.len() < MAX_PREEMPTORS;
            match s.preemptors.entry(running) {
                std::collections::hash_map::Entry::Occupied(mut entry) => entry.get_mut().1 += ns,
                std::collections::hash_map::Entry::Vacant(entry) if room => {
                    entry.insert((names.task(comm), ns));
                }
                std::collections::hash_map::Entry::Vacant(_) => s.unnamed_ns += ns,
            }
        }
    }

    /// The watched thread running on `cpu`, if one is.
    fn watched_on(&self, cpu: u32) -> Option<u32> {
        let (tid, _, _) = self.cpus.get(cpu as usize)?.current?;
        self.watched.contains(&tid).then_some(tid)
    }

    /// A host handler ran on a watched thread's CPU from `since` to `to`.
    fn handler(&mut self, since: u64, to: u64) {
        if let Some((_, irqs)) = &mut self.timelines {
            irqs.add_span(since, to);
        }
    }

    fn start_wait(&mut self, tid: u32, cpu: u32, since: u64) {
        self.waiting.retain(|w| w.tid != tid);
        self.waiting.push(Waiting { tid, cpu, since });
    }
}

impl Analyzer for Contention {
    fn on_event(&mut self, e: &Event, names: &dyn Names) {
        // A waiting thread that makes an event runs: the trace missed its switch-in (some
        // kernels resume a task without sched_switch). Its wait ended by now.
        self.end_inferred_wait(e.tid, e.cpu, e.ts, names);
        self.on_kind(e, names);
        self.cpu(e.cpu).last_ts = e.ts;
    }
}

impl Contention {
    fn on_kind(&mut self, e: &Event, names: &dyn Names) {
        match e.kind {
            EventKind::SchedSwitch { prev_tid, prev_state, next_tid, next_comm, .. } => {
                // The outgoing task held the CPU the waiters on it wanted.
                self.charge_waits(e.cpu, e.ts, names);
                if let Some(w) = self.waiting.iter().find(|w| w.tid == next_tid).copied() {
                    if w.cpu == e.cpu {
                        // Charged just above.
                        self.waiting.retain(|x| x.tid != next_tid);
                    } else {
                        // It waited for another CPU: what ran there until now took it.
                        self.end_wait(next_tid, e.ts, names);
                    }
                }
                // Preempted: R, or R+ (0x100) when the kernel preempted it (a tick, a CPU
                // limit's throttling).
                if crate::sched::preempted(prev_state) == Some(true) && self.watched.contains(&prev_tid) {
                    self.start_wait(prev_tid, e.cpu, e.ts);
                }
                let cpu = self.cpu(e.cpu);
                cpu.current = Some((next_tid, e.ts, next_comm));
                // A handler open across a switch is not the next task's.
                cpu.irq_since = None;
                cpu.softirq_since = None;
            }
            EventKind::SchedWakeup { tid, target_cpu } if self.watched.contains(&tid) => {
                self.start_wait(tid, target_cpu, e.ts);
            }
            EventKind::SchedMigrate { tid, dest_cpu, .. } if self.watched.contains(&tid) => {
                self.suffered.entry(tid).or_default().migrations += 1;
                // Waiting, it now waits for the CPU it was moved to.
                if self.waiting.iter().any(|w| w.tid == tid) {
                    self.end_wait(tid, e.ts, names);
                    self.start_wait(tid, dest_cpu, e.ts);
                }
            }
            EventKind::IrqEntry { .. } | EventKind::IrqVectorEntry { .. } => {
                self.cpu(e.cpu).irq_since = Some(e.ts);
            }
            EventKind::SoftirqEntry { .. } => self.cpu(e.cpu).softirq_since = Some(e.ts),
            EventKind::IrqExit { .. } | EventKind::IrqVectorExit { .. } => {
                let since = self.cpu(e.cpu).irq_since.take();
                if let (Some(since), Some(tid)) = (since, self.watched_on(e.cpu)) {
                    self.handler(since, e.ts);
                    let s = self.suffered.entry(tid).or_default();
                    s.irq_ns += e.ts.saturating_sub(since);
                    s.irqs += 1;
                }
            }
            EventKind::SoftirqExit { .. } => {
                let since = self.cpu(e.cpu).softirq_since.take();
                if let (Some(since), Some(tid)) = (since, self.watched_on(e.cpu)) {
                    self.handler(since, e.ts);
                    let s = self.suffered.entry(tid).or_default();
                    s.softirq_ns += e.ts.saturating_sub(since);
                    s.softirqs += 1;
                }
            }
            // Across lost events no wait or handler can be timed.
            EventKind::Lost { .. } => {
                self.waiting.retain(|w| w.cpu != e.cpu);
                let cpu = self.cpu(e.cpu);
                *cpu = Cpu::default();
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::switch_to;
    use virtprof_model::StrId;

    fn switch(prev_tid: u32, prev_state: u32, next_tid: u32) -> EventKind {
        EventKind::SchedSwitch {
            prev_tid,
            prev_state,
            prev_comm: StrId(prev_tid),
            next_tid,
            next_comm: StrId(next_tid),
        }
    }

    #[test]
    fn the_tasks_that_ran_while_a_vcpu_waited_and_the_interrupts_while_it_ran() {
        let mut c = Contention::new([10]);
        for (ts, cpu, kind) in [
            (0, 1, switch_to(10, 10)),
            // While the vCPU runs: an interrupt of 5 and a softirq of 7.
            (100, 1, EventKind::IrqEntry { irq: 4 }),
            (105, 1, EventKind::IrqExit { irq: 4 }),
            (110, 1, EventKind::SoftirqEntry { vec: 1 }),
            (117, 1, EventKind::SoftirqExit { vec: 1 }),
            // Preempted by 20 for 50 (R+: the kernel preempted it), then 30 for 30.
            (200, 1, switch(10, 0x100, 20)),
            (250, 1, switch(20, 1, 30)),
            (280, 1, switch(30, 1, 10)),
            // Blocked (not waiting) while 20 runs: nothing charged.
            (300, 1, switch(10, 1, 20)),
            (350, 0, switch_to(40, 40)),
            // Woken for CPU 0, where 40 runs; it runs there at 420: 40 took 20.
            (400, 1, EventKind::SchedWakeup { tid: 10, target_cpu: 0 }),
            (410, 0, EventKind::SchedMigrate { tid: 10, orig_cpu: 1, dest_cpu: 0 }),
            (420, 0, switch(40, 0, 10)),
        ] {
            c.on_event(&Event { ts, cpu, tid: 0, kind }, &crate::TestNames);
        }
        let s = &c.finish()[&10];
        let mut by: Vec<_> = s.preemptors.iter().map(|(tid, (name, ns))| (*tid, name.as_str(), *ns)).collect();
        by.sort();
        assert_eq!(by, [(20, "task20", 50), (30, "task30", 30), (40, "task40", 20)]);
        assert_eq!((s.irq_ns, s.irqs, s.softirq_ns, s.softirqs, s.migrations), (5, 1, 7, 1, 1));
    }

    #[test]
    fn a_wait_ends_at_the_threads_own_event_and_follows_it_to_the_cpu_it_is_moved_to() {
        let mut c = Contention::new([10]);
        for (ts, cpu, tid, kind) in [
            (0, 0, 0, switch_to(20, 20)),
            (0, 1, 0, switch_to(30, 30)),
            // Preempted by 20 on CPU 0 at 100; moved to CPU 1 at 150, where 30 runs.
            (100, 0, 10, switch(10, 0x100, 20)),
            (150, 0, 0, EventKind::SchedMigrate { tid: 10, orig_cpu: 0, dest_cpu: 1 }),
            (170, 1, 30, EventKind::SchedWakeup { tid: 50, target_cpu: 0 }),
            // Its own event at 180: it runs (its switch-in was not traced), at the latest
            // since CPU 1's last event. 20 ran on CPU 0 meanwhile, and is charged for 50
            // only; 30 for the 20 on CPU 1.
            (180, 1, 10, EventKind::KvmFpu { load: true }),
            (300, 0, 20, switch(20, 1, 40)),
            (300, 1, 30, switch(30, 1, 40)),
        ] {
            c.on_event(&Event { ts, cpu, tid, kind }, &crate::TestNames);
        }
        let s = &c.finish()[&10];
        let mut by: Vec<_> = s.preemptors.iter().map(|(tid, (_, ns))| (*tid, *ns)).collect();
        by.sort();
        assert_eq!(by, [(20, 50), (30, 20)]);
        assert_eq!(s.migrations, 1);
    }

    #[test]
    fn a_switch_in_the_trace_missed_ends_the_wait_where_the_scheduler_accounting_places_it() {
        let mut c = Contention::new([10]);
        for (ts, tid, kind) in [
            (0, 0, switch_to(10, 10)),
            // Preempted by 20 at 100 (R); 20 runs, its last event at 150; no switch back to 10
            // is traced, 10's own event comes at 400: it ran from 150, waited 50.
            (100, 10, switch(10, 0, 20)),
            (150, 20, EventKind::SchedWakeup { tid: 30, target_cpu: 0 }),
            (400, 10, EventKind::KvmFpu { load: true }),
        ] {
            c.on_event(&Event { ts, cpu: 1, tid, kind }, &crate::TestNames);
        }
        let s = &c.finish()[&10];
        assert_eq!(s.preemptors.iter().map(|(tid, (_, ns))| (*tid, *ns)).collect::<Vec<_>>(), [(20, 50)]);
    }
}
