//! OS noise (rtla osnoise's model, extended for VMs): a measurement loop on each CPU sees gaps
//! in its own progress (noise samples); the trace of that CPU says what ran meanwhile. Each
//! sample's time is split by the innermost context at every instant (NMI over IRQ over softirq
//! over another thread), so nested interference is counted once, in the innermost class, as
//! osnoise's net durations do. What no traced context explains is hardware noise on bare
//! metal; inside a VM it is virtualization noise, split into steal and hypervisor.

use serde::Serialize;
use virtprof_model::event::{Event, EventKind, StrId};

/// Where noise time goes (the columns of `rtla osnoise top` plus the virtualization ones).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Class {
    /// Nothing traced explains it, on bare metal.
    Hw,
    /// An NMI handler.
    Nmi,
    /// A hard IRQ or an IRQ vector (timer, IPI, ...).
    Irq,
    /// A softirq.
    Softirq,
    /// Another thread ran on the CPU.
    Thread,
    /// The vCPU was preempted on the host.
    Steal,
    /// The hypervisor handled a lightweight exit (in the kernel).
    HypLw,
    /// The hypervisor handled a heavyweight exit (through the VMM).
    HypHw,
    /// Hypervisor time whose lightweight/heavyweight split this side cannot see.
    Hyp,
}

/// One value per [`Class`], serialized with the JSON keys of `virtprof noise`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ByClass {
    /// Hardware.
    pub hw: u64,
    /// NMI.
    pub nmi: u64,
    /// IRQ (and IRQ vectors).
    pub irq: u64,
    /// Softirq.
    pub softirq: u64,
    /// Other threads.
    pub thread: u64,
    /// Steal.
    pub steal: u64,
    /// Hypervisor, lightweight exits.
    pub hyp_lw: u64,
    /// Hypervisor, heavyweight exits.
    pub hyp_hw: u64,
    /// Hypervisor, split unknown.
    pub hyp: u64,
}

impl ByClass {
    /// The slot of `class`.
    pub fn get_mut(&mut self, class: Class) -> &mut u64 {
        match class {
            Class::Hw => &mut self.hw,
            Class::Nmi => &mut self.nmi,
            Class::Irq => &mut self.irq,
            Class::Softirq => &mut self.softirq,
            Class::Thread => &mut self.thread,
            Class::Steal => &mut self.steal,
            Class::HypLw => &mut self.hyp_lw,
            Class::HypHw => &mut self.hyp_hw,
            Class::Hyp => &mut self.hyp,
        }
    }

    /// Add `other` slot by slot.
    pub fn add(&mut self, other: &ByClass) {
        for class in CLASSES {
            *self.get_mut(class) += other.value(class);
        }
    }

    /// The value of `class`.
    pub fn value(&self, class: Class) -> u64 {
        match class {
            Class::Hw => self.hw,
            Class::Nmi => self.nmi,
            Class::Irq => self.irq,
            Class::Softirq => self.softirq,
            Class::Thread => self.thread,
            Class::Steal => self.steal,
            Class::HypLw => self.hyp_lw,
            Class::HypHw => self.hyp_hw,
            Class::Hyp => self.hyp,
        }
    }

    /// Sum over every class.
    pub fn total(&self) -> u64 {
        CLASSES.iter().map(|&c| self.value(c)).sum()
    }
}

/// Every class, in column order.
pub const CLASSES: [Class; 9] = [
    Class::Hw,
    Class::Nmi,
    Class::Irq,
    Class::Softirq,
    Class::Thread,
    Class::Steal,
    Class::HypLw,
    Class::HypHw,
    Class::Hyp,
];

/// A stretch of CPU time spent in one interfering context.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Segment {
    start: u64,
    end: u64,
    class: Class,
    /// The thread running, for [`Class::Thread`] (the measurement thread's own time is kept
    /// too and recognized when a sample is attributed).
    tid: u32,
    /// Which interference occurrence this belongs to (an IRQ that interrupts a softirq splits
    /// it into two segments of one occurrence).
    occurrence: u32,
}

/// One CPU's trace turned into segments of innermost context.
#[derive(Debug, Default)]
pub struct CpuContexts {
    segments: Vec<Segment>,
    nmis: Vec<(u64, u64, u32)>,
    /// Open contexts: class, occurrence.
    stack: Vec<(Class, u32)>,
    task: u32,
    since: Option<u64>,
    next_occurrence: u32,
    task_occurrence: u32,
}

impl CpuContexts {
    /// Feed the next event of this CPU (in time order).
    pub fn push(&mut self, e: &Event) {
        match e.kind {
            EventKind::IrqEntry { .. } | EventKind::IrqVectorEntry { .. } => self.enter(e, Class::Irq),
            EventKind::SoftirqEntry { .. } => self.enter(e, Class::Softirq),
            EventKind::IrqExit { .. } | EventKind::IrqVectorExit { .. } => self.leave(e, Class::Irq),
            EventKind::SoftirqExit { .. } => self.leave(e, Class::Softirq),
            EventKind::SchedSwitch { prev_tid, next_tid, .. } => {
                self.note_task(e.ts, prev_tid);
                self.close(e.ts);
                self.task = next_tid;
                self.task_occurrence = self.occurrence();
            }
            EventKind::Nmi { handler_ns } => {
                let occurrence = self.occurrence();
                self.nmis.push((e.ts.saturating_sub(handler_ns), e.ts, occurrence));
            }
            _ => {
                if self.stack.is_empty() {
                    self.note_task(e.ts, e.tid);
                }
            }
        }
    }

    /// Thread `tid` is known to run at `ts` in no interrupt context (a measurement loop that
    /// read its clock then): repairs a switch into it the trace missed.
    pub fn running(&mut self, ts: u64, tid: u32) {
        if self.stack.is_empty() {
            self.note_task(ts, tid);
        }
    }

    fn occurrence(&mut self) -> u32 {
        self.next_occurrence += 1;
        self.next_occurrence
    }

    /// The current task is `tid` (an event's `common_pid` says so): switches the trace missed
    /// (some kernels emit none when a CPU leaves idle) are repaired here.
    fn note_task(&mut self, ts: u64, tid: u32) {
        if self.since.is_none() {
            self.since = Some(ts);
            self.task = tid;
            self.task_occurrence = self.occurrence();
        } else if tid != self.task {
            self.close(ts);
            self.task = tid;
            self.task_occurrence = self.occurrence();
        }
    }

    fn enter(&mut self, e: &Event, class: Class) {
        if self.stack.is_empty() {
            self.note_task(e.ts, e.tid);
        }
        self.close(e.ts);
        let occurrence = self.occurrence();
        self.stack.push((class, occurrence));
    }

    fn leave(&mut self, e: &Event, class: Class) {
        // A context whose entry happened before tracing began closes nothing we know of.
        if self.stack.last().is_some_and(|&(c, _)| c == class) {
            self.close(e.ts);
            self.stack.pop();
        }
    }

    /// End the current segment at `ts` and start the next one there.
    fn close(&mut self, ts: u64) {
        let Some(start) = self.since.replace(ts) else { return };
        if ts <= start {
            return;
        }
        let (class, occurrence) = self.stack.last().copied().unwrap_or((Class::Thread, self.task_occurrence));
        self.segments.push(Segment { start, end: ts, class, tid: self.task, occurrence });
    }

    /// Close the open segment at `ts` (the end of the trace).
    pub fn finish(&mut self, ts: u64) {
        self.close(ts);
        self.segments.sort_unstable_by_key(|s| s.start);
        self.nmis.sort_unstable();
    }

    /// What explains `[start, end)` for measurement thread `tid`: net ns per class and the
    /// interference occurrences seen, per class.
    pub fn explain(&self, start: u64, end: u64, tid: u32) -> Explained {
        let mut out = Explained::default();
        let first = self.segments.partition_point(|s| s.end <= start);
        for s in self.segments[first..].iter().take_while(|s| s.start < end) {
            let ns = overlap(s.start, s.end, start, end);
            if ns == 0 || (s.class == Class::Thread && s.tid == tid) {
                continue;
            }
            *out.ns.get_mut(s.class) += ns;
            out.count(s.class, s.occurrence);
        }
        // An NMI takes its time from whatever context it interrupted.
        let first = self.nmis.partition_point(|n| n.1 <= start);
        for &(from, to, occurrence) in self.nmis[first..].iter().take_while(|n| n.0 < end) {
            let ns = overlap(from, to, start, end);
            if ns == 0 {
                continue;
            }
            let mut left = ns;
            for s in self.segments.iter().skip(self.segments.partition_point(|s| s.end <= from)) {
                if s.start >= to || left == 0 {
                    break;
                }
                if s.class == Class::Thread && s.tid == tid {
                    continue;
                }
                let taken = overlap(s.start, s.end, from.max(start), to.min(end)).min(left);
                let slot = out.ns.get_mut(s.class);
                *slot = slot.saturating_sub(taken);
                left -= taken;
            }
            out.ns.nmi += ns;
            out.count(Class::Nmi, occurrence);
        }
        out
    }
}

impl CpuContexts {
    /// The threads other than `tid` that ran in `[start, end)`, with their ns (an NMI inside a
    /// thread's time is not subtracted here): who the `thread` class was.
    pub fn threads(&self, start: u64, end: u64, tid: u32) -> impl Iterator<Item = (u32, u64)> + '_ {
        let first = self.segments.partition_point(|s| s.end <= start);
        self.segments[first..]
            .iter()
            .take_while(move |s| s.start < end)
            .filter(move |s| s.class == Class::Thread && s.tid != tid)
            .map(move |s| (s.tid, overlap(s.start, s.end, start, end)))
            .filter(|&(_, ns)| ns > 0)
    }
}

fn overlap(a0: u64, a1: u64, b0: u64, b1: u64) -> u64 {
    a1.min(b1).saturating_sub(a0.max(b0))
}

/// What the trace explains of one sample.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Explained {
    /// Net ns per class.
    pub ns: ByClass,
    /// Interference occurrences per class.
    pub counts: ByClass,
    seen: Vec<u32>,
}

impl Explained {
    fn count(&mut self, class: Class, occurrence: u32) {
        if !self.seen.contains(&occurrence) {
            self.seen.push(occurrence);
            *self.counts.get_mut(class) += 1;
        }
    }

    /// Did any traced context interfere?
    pub fn any(&self) -> bool {
        !self.seen.is_empty()
    }
}

/// A gap the measurement loop saw, attributed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sample {
    /// When the gap began (ns, the trace clock).
    pub start_ns: u64,
    /// Its length.
    pub len_ns: u64,
    /// Net ns per class; sums to `len_ns`.
    pub ns: ByClass,
    /// Interference occurrences per class (a sample no traced context explains counts once as
    /// hardware, steal or hypervisor).
    pub counts: ByClass,
}

/// Attribute one sample: traced contexts first, the rest to hardware (bare metal) or to the
/// hypervisor (in a VM; [`split_steal`] later moves steal out of it).
pub fn attribute(contexts: &CpuContexts, start_ns: u64, len_ns: u64, tid: u32, in_vm: bool) -> Sample {
    let explained = contexts.explain(start_ns, start_ns + len_ns, tid);
    let rest_class = if in_vm { Class::Hyp } else { Class::Hw };
    let mut ns = explained.ns;
    let rest = len_ns.saturating_sub(ns.total());
    *ns.get_mut(rest_class) += rest;
    let mut counts = explained.counts;
    if !explained.any() {
        *counts.get_mut(rest_class) += 1;
    }
    Sample { start_ns, len_ns, ns, counts }
}

/// Move `steal_ns` (the CPU's steal-time delta over these samples' period) out of their
/// hypervisor time: largest first, since the host preempts for whole time slices while exit
/// handling takes microseconds. A sample that received steal and had no traced interference
/// counts as steal instead of hypervisor.
pub fn split_steal(samples: &mut [Sample], steal_ns: u64) {
    let mut order: Vec<usize> = (0..samples.len()).filter(|&i| samples[i].ns.hyp > 0).collect();
    order.sort_unstable_by_key(|&i| std::cmp::Reverse(samples[i].ns.hyp));
    let mut left = steal_ns;
    for i in order {
        if left == 0 {
            break;
        }
        let s = &mut samples[i];
        let moved = s.ns.hyp.min(left);
        s.ns.hyp -= moved;
        s.ns.steal += moved;
        left -= moved;
        if s.counts.hyp > 0 && s.ns.hyp == 0 {
            s.counts.hyp -= 1;
            s.counts.steal += 1;
        }
    }
}

/// One period's figures (one line of `rtla osnoise top`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct PeriodSummary {
    /// Loop time measured in the period.
    pub runtime_ns: u64,
    /// Sum of the samples' lengths.
    pub noise_ns: u64,
    /// Share of the runtime the loop had, %.
    pub available_pct: f64,
    /// Longest sample.
    pub max_single_ns: u64,
    /// Shortest sample (None: no samples). With a probe, the cheapest exit seen from inside.
    pub min_single_ns: Option<u64>,
    /// Samples.
    pub samples: u64,
    /// Interference occurrences per class.
    pub counts: ByClass,
    /// Net noise per class.
    pub noise_ns_by_class: ByClass,
}

/// Sum up a period's attributed samples.
pub fn summarize(runtime_ns: u64, samples: &[Sample]) -> PeriodSummary {
    let mut p = PeriodSummary { runtime_ns, samples: samples.len() as u64, ..Default::default() };
    for s in samples {
        p.noise_ns += s.len_ns;
        p.max_single_ns = p.max_single_ns.max(s.len_ns);
        p.min_single_ns = Some(p.min_single_ns.map_or(s.len_ns, |m| m.min(s.len_ns)));
        p.counts.add(&s.counts);
        p.noise_ns_by_class.add(&s.ns);
    }
    p.available_pct =
        if runtime_ns == 0 { 0.0 } else { 100.0 * runtime_ns.saturating_sub(p.noise_ns) as f64 / runtime_ns as f64 };
    p
}

/// The seed's guest-side columns (its osnoise extension), from the guest's own samples: STEAL
/// from the steal-time record, VIRT the rest of samples during which the vCPU exited or was
/// descheduled, HW_NOISE the samples with neither, LW_EX and HW_EX the exit counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct GuestColumns {
    /// Samples.
    pub samples: u64,
    /// Sum of sample lengths.
    pub noise_ns: u64,
    /// STEAL.
    pub steal_ns: u64,
    /// VIRT (hypervisor: KVM or the VMM).
    pub virt_ns: u64,
    /// HW_NOISE.
    pub hw_noise_ns: u64,
    /// Samples counted as hardware noise.
    pub hw_count: u64,
    /// LW_EX.
    pub lw_exits: u64,
    /// HW_EX.
    pub hw_exits: u64,
    /// Samples during which a heavyweight exit happened.
    pub hw_exit_samples: u64,
}

/// One guest sample: length and what the guest's counters said meanwhile.
#[derive(Debug, Clone, Copy, Default)]
pub struct GuestSample {
    /// Length, ns.
    pub len_ns: u64,
    /// Steal since the previous sample, ns.
    pub steal_ns: u64,
    /// Heavyweight exits since the previous sample.
    pub hw_exits: u64,
    /// Lightweight exits since the previous sample.
    pub lw_exits: u64,
}

/// Sum up guest samples by the seed's rules.
pub fn guest_columns(samples: &[GuestSample]) -> GuestColumns {
    let mut c = GuestColumns::default();
    for s in samples {
        c.samples += 1;
        c.noise_ns += s.len_ns;
        let steal = s.steal_ns.min(s.len_ns);
        c.steal_ns += s.steal_ns;
        c.lw_exits += s.lw_exits;
        c.hw_exits += s.hw_exits;
        c.hw_exit_samples += u64::from(s.hw_exits > 0);
        if s.hw_exits > 0 || s.lw_exits > 0 || s.steal_ns > 0 {
            c.virt_ns += s.len_ns - steal;
        } else {
            c.hw_noise_ns += s.len_ns;
            c.hw_count += 1;
        }
    }
    c
}

/// What the host was doing during a guest sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HostCause {
    /// The vCPU thread was preempted for all of it.
    Steal,
    /// A return to the VMM (heavyweight exit).
    HypHw,
    /// A `kvm_exit` handled in the kernel (lightweight exit).
    HypLw,
    /// A host IRQ or IRQ vector on the vCPU's CPU (on hosts without `kvm_exit`, each is a
    /// lightweight exit as well).
    HostIrq,
    /// A host softirq on the vCPU's CPU.
    HostSoftirq,
    /// Nothing on the host: hardware.
    Unexplained,
}

/// The host's trace of one vCPU thread, indexed for attribution.
#[derive(Debug, Default)]
pub struct HostView {
    /// Times the thread was off its CPU while runnable or not: (from, to, the task that took
    /// the CPU).
    off_cpu: Vec<(u64, u64, StrId)>,
    /// Returns to the VMM: (time, KVM exit reason).
    userspace_exits: Vec<(u64, u32)>,
    /// `kvm_exit`: (time, reason, isa).
    kvm_exits: Vec<(u64, u32, u32)>,
    irqs: Vec<u64>,
    softirqs: Vec<u64>,
}

impl HostView {
    /// Index the events (all CPUs, time order) of vCPU thread `tid`, first seen on `cpu`. An
    /// unpinned thread is followed: host IRQs count where it ran last (its switches in, and
    /// any event it emitted, say where that is).
    pub fn new(events: &[Event], tid: u32, cpu: u32) -> HostView {
        let mut v = HostView::default();
        let mut off: Option<(u64, StrId)> = None;
        let mut cpu = cpu;
        for e in events {
            let running_again = match e.kind {
                EventKind::SchedSwitch { next_tid, .. } => next_tid == tid,
                _ => e.tid == tid,
            };
            if running_again {
                cpu = e.cpu;
                if let Some((from, who)) = off.take() {
                    v.off_cpu.push((from, e.ts, who));
                }
            }
            match e.kind {
                EventKind::SchedSwitch { prev_tid, next_comm, .. } if prev_tid == tid => off = Some((e.ts, next_comm)),
                EventKind::KvmUserspaceExit { reason, .. } if e.tid == tid => v.userspace_exits.push((e.ts, reason)),
                EventKind::KvmExit { reason, isa, .. } if e.tid == tid => v.kvm_exits.push((e.ts, reason, isa)),
                EventKind::IrqEntry { .. } | EventKind::IrqVectorEntry { .. } if e.cpu == cpu => v.irqs.push(e.ts),
                EventKind::SoftirqEntry { .. } if e.cpu == cpu => v.softirqs.push(e.ts),
                _ => {}
            }
        }
        v.off_cpu.sort_unstable_by_key(|o| o.0);
        v
    }

    /// Attribute the guest sample `[start, start + len)` (host ns), widening the search for
    /// events by the clock mapping's error bound.
    pub fn attribute(&self, start: u64, len: u64, bound: u64) -> Attributed {
        let end = start + len;
        let (a, b) = (start.saturating_sub(bound), end + bound);
        let mut steal_ns = 0;
        let mut preemptor = None;
        let mut longest = 0;
        let first = self.off_cpu.partition_point(|o| o.1 <= start);
        for &(from, to, who) in self.off_cpu[first..].iter().take_while(|o| o.0 < end) {
            let ns = overlap(from, to, start, end);
            steal_ns += ns;
            if ns > longest {
                (longest, preemptor) = (ns, Some(who));
            }
        }
        let within = |times: &[u64]| {
            let i = times.partition_point(|&t| t < a);
            times.get(i).is_some_and(|&t| t <= b)
        };
        let userspace = self.userspace_exits.partition_point(|x| x.0 < a);
        let kvm = self.kvm_exits.partition_point(|x| x.0 < a);
        let (cause, reason) = match (self.userspace_exits.get(userspace), self.kvm_exits.get(kvm)) {
            (Some(&(t, reason)), _) if t <= b => (HostCause::HypHw, Some((true, reason, 0))),
            (_, Some(&(t, reason, isa))) if t <= b => (HostCause::HypLw, Some((false, reason, isa))),
            _ if within(&self.irqs) => (HostCause::HostIrq, None),
            _ if within(&self.softirqs) => (HostCause::HostSoftirq, None),
            _ if steal_ns > 0 => (HostCause::Steal, None),
            _ => (HostCause::Unexplained, None),
        };
        Attributed { steal_ns: steal_ns.min(len), preemptor, cause, reason }
    }
}

/// One guest sample as the host explains it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attributed {
    /// Time the vCPU thread was off its CPU.
    pub steal_ns: u64,
    /// Who took the CPU for the longest part of that.
    pub preemptor: Option<StrId>,
    /// What explains the rest of the sample.
    pub cause: HostCause,
    /// The exit's reason (heavyweight?, reason, isa), when the cause is an exit.
    pub reason: Option<(bool, u32, u32)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(ts: u64, tid: u32, kind: EventKind) -> Event {
        Event { ts, cpu: 0, tid, kind }
    }

    fn switch(ts: u64, prev: u32, next: u32) -> Event {
        ev(
            ts,
            prev,
            EventKind::SchedSwitch {
                prev_tid: prev,
                prev_state: 0,
                prev_comm: StrId(0),
                next_tid: next,
                next_comm: StrId(0),
            },
        )
    }

    const ME: u32 = 7;

    /// Loop thread 7; at 100 a softirq runs until 160, interrupted by an IRQ 120..130; a
    /// thread runs 300..400 and an NMI of 5 ns lands inside it.
    fn contexts() -> CpuContexts {
        let mut c = CpuContexts::default();
        for e in [
            switch(0, 1, ME),
            ev(100, ME, EventKind::SoftirqEntry { vec: 1 }),
            ev(120, ME, EventKind::IrqEntry { irq: 5 }),
            ev(130, ME, EventKind::IrqExit { irq: 5 }),
            ev(160, ME, EventKind::SoftirqExit { vec: 1 }),
            switch(300, ME, 9),
            ev(350, 9, EventKind::Nmi { handler_ns: 5 }),
            switch(400, 9, ME),
        ] {
            c.push(&e);
        }
        c.finish(1000);
        c
    }

    #[test]
    fn nested_interference_is_counted_once_in_the_innermost_class() {
        let s = attribute(&contexts(), 95, 70, ME, false);
        assert_eq!((s.ns.softirq, s.ns.irq, s.ns.hw), (50, 10, 10), "{s:?}");
        assert_eq!((s.counts.softirq, s.counts.irq, s.counts.hw), (1, 1, 0), "{s:?}");
        assert_eq!(s.ns.total(), 70);
    }

    #[test]
    fn threads_and_nmis_take_their_net_time() {
        let s = attribute(&contexts(), 290, 120, ME, false);
        assert_eq!((s.ns.thread, s.ns.nmi, s.ns.hw), (95, 5, 20), "{s:?}");
        assert_eq!((s.counts.thread, s.counts.nmi), (1, 1), "{s:?}");
    }

    #[test]
    fn the_interfering_thread_is_named_with_its_time() {
        let c = contexts();
        assert_eq!(c.threads(290, 410, ME).collect::<Vec<_>>(), vec![(9, 100)]);
        assert_eq!(c.threads(95, 165, ME).count(), 0, "the loop's own time is not interference");
    }

    #[test]
    fn unexplained_time_is_hardware_on_bare_metal_and_hypervisor_in_a_vm() {
        let bare = attribute(&contexts(), 500, 40, ME, false);
        assert_eq!((bare.ns.hw, bare.counts.hw), (40, 1));
        let mut vm = vec![attribute(&contexts(), 500, 40, ME, true), attribute(&contexts(), 600, 10, ME, true)];
        assert_eq!((vm[0].ns.hyp, vm[0].counts.hyp), (40, 1));
        split_steal(&mut vm, 45);
        // Largest first: all 40 of the first, then 5 of the second.
        assert_eq!((vm[0].ns.steal, vm[0].ns.hyp, vm[0].counts.steal), (40, 0, 1), "{vm:?}");
        assert_eq!((vm[1].ns.steal, vm[1].ns.hyp, vm[1].counts.hyp), (5, 5, 1), "{vm:?}");
        let p = summarize(1000, &vm);
        assert_eq!((p.noise_ns, p.max_single_ns, p.samples), (50, 40, 2));
        assert_eq!((p.counts.steal, p.counts.hyp), (1, 1));
        assert!((p.available_pct - 95.0).abs() < 1e-9);
    }

    #[test]
    fn guest_columns_follow_the_seed() {
        let g = |len_ns, steal_ns, hw_exits, lw_exits| GuestSample { len_ns, steal_ns, hw_exits, lw_exits };
        let c = guest_columns(&[g(100, 60, 0, 1), g(50, 0, 1, 0), g(30, 0, 0, 0)]);
        assert_eq!((c.steal_ns, c.virt_ns, c.hw_noise_ns, c.hw_count), (60, 90, 30, 1));
        assert_eq!((c.lw_exits, c.hw_exits, c.hw_exit_samples, c.noise_ns), (1, 1, 1, 180));
    }

    #[test]
    fn host_events_explain_guest_samples() {
        const VCPU: u32 = 50;
        let mut events = vec![
            switch(1000, VCPU, 60),
            switch(1400, 60, VCPU),
            ev(2000, VCPU, EventKind::KvmUserspaceExit { reason: 10, errno: 0 }),
            ev(3000, 0, EventKind::IrqVectorEntry { vector: 236, event: 1 }),
        ];
        events.iter_mut().for_each(|e| e.cpu = 1);
        let host = HostView::new(&events, VCPU, 1);
        let a = host.attribute(990, 450, 0);
        assert_eq!((a.steal_ns, a.cause), (400, HostCause::Steal), "{a:?}");
        assert_eq!(host.attribute(1990, 30, 0).cause, HostCause::HypHw);
        assert_eq!(host.attribute(1990, 30, 0).reason, Some((true, 10, 0)));
        assert_eq!(host.attribute(2995, 30, 0).cause, HostCause::HostIrq);
        // Out of reach unless the clock bound widens the search.
        assert_eq!(host.attribute(3010, 30, 0).cause, HostCause::Unexplained);
        assert_eq!(host.attribute(3010, 30, 20).cause, HostCause::HostIrq);
    }

    #[test]
    fn a_switch_in_the_trace_missed_is_repaired_from_common_pid() {
        // The CPU went idle (switch to 0) and the switch back to the loop was not traced; an
        // IRQ interrupting the loop thread shows it ran again.
        let mut c = CpuContexts::default();
        for e in
            [switch(0, ME, 0), ev(50, ME, EventKind::IrqEntry { irq: 1 }), ev(60, ME, EventKind::IrqExit { irq: 1 })]
        {
            c.push(&e);
        }
        c.finish(100);
        let s = attribute(&c, 55, 30, ME, false);
        assert_eq!((s.ns.irq, s.ns.thread, s.ns.hw), (5, 0, 25), "{s:?}");
    }
}
