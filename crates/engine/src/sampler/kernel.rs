//! The sampler's in-kernel source: the eBPF program's maps ([`KernelCounter`]), read at each
//! refresh. Each read is cumulative (time per state up to the read, exits by reason), so a
//! window is the difference of the reads around it, exact at refresh boundaries; no event
//! reaches user space, so none can be lost on the way (a full map is counted instead).

use std::collections::{BTreeMap, HashSet, VecDeque};

use virtprof_analysis::hist::Histogram;
use virtprof_analysis::sched::{Counters, ReasonKey, Span};
use virtprof_trace::decode::Decoder;
use virtprof_trace::tracefs::{load_layout, Tracefs};

use super::History;
use crate::kernel_counts::{KernelCounter, Taker, ThreadState};

/// Exited threads kept (their figures stay in the run window) after they leave the maps.
const MAX_RETIRED: usize = 65_536;

/// The program, the kernel's kvm formats (how reasons are named) and the reads so far.
pub(super) struct KernelSource {
    counter: KernelCounter,
    decoder: Decoder,
    history: History<KernelSample>,
    /// Exit durations by reason over the whole run, at the last read (when timed).
    durations: Vec<(ReasonKey, Histogram)>,
    /// Threads that exited, taken out of the maps (which are bounded) after their last read:
    /// their final figures, oldest first.
    retired: VecDeque<(u32, Retired)>,
    /// Threads in the maps: at the last read, and those added by [`KernelSource::track`] since.
    in_maps: HashSet<u32>,
    /// Who ran while each vCPU thread waited, since the start: waiter → (taker, ns), the
    /// retired threads' included.
    waits_by: BTreeMap<u32, Vec<(Taker, u64)>>,
}

/// An exited thread's final figures.
#[derive(Clone)]
struct Retired {
    cpu: u32,
    counters: Counters,
    guest: bool,
    reasons: Vec<(ReasonKey, u64)>,
    waits_by: Vec<(Taker, u64)>,
}

/// One read of the maps.
#[derive(Clone, Default)]
struct KernelSample {
    /// tid → (the CPU it runs on or last ran on, its counters as of the read, runs guest code);
    /// the extremes in the counters are those since the previous read.
    threads: BTreeMap<u32, (u32, Counters, bool)>,
    /// tid → its extremes since the first read (older reads leave the history).
    run_extremes: BTreeMap<u32, Extremes>,
    /// Exits and evidence so far, per (thread, reason).
    reasons: BTreeMap<(u32, ReasonKey), u64>,
    /// Events a full map could not count: exits, threads, timings, waits not named; and
    /// events the kernel skipped the program for.
    full: [u64; 4],
    missed: u64,
}

/// A thread's longest wait and allocation range over some reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Extremes {
    alloc_min_ns: u64,
    alloc_max_ns: u64,
    wait_max_ns: u64,
}

impl Extremes {
    const NONE: Extremes = Extremes { alloc_min_ns: u64::MAX, alloc_max_ns: 0, wait_max_ns: 0 };

    fn of(c: &Counters) -> Extremes {
        Extremes { alloc_min_ns: c.alloc_min_ns, alloc_max_ns: c.alloc_max_ns, wait_max_ns: c.wait_max_ns }
    }

    fn merge(self, other: Extremes) -> Extremes {
        Extremes {
            alloc_min_ns: self.alloc_min_ns.min(other.alloc_min_ns),
            alloc_max_ns: self.alloc_max_ns.max(other.alloc_max_ns),
            wait_max_ns: self.wait_max_ns.max(other.wait_max_ns),
        }
    }

    fn set(self, c: &mut Counters) {
        (c.alloc_min_ns, c.alloc_max_ns, c.wait_max_ns) = (self.alloc_min_ns, self.alloc_max_ns, self.wait_max_ns);
    }
}

impl KernelSource {
    /// Load and attach the program (with `timed`, timing exits too); the error says why this
    /// host cannot.
    pub(super) fn start(timed: bool) -> anyhow::Result<KernelSource> {
        let tracefs = Tracefs::locate_or_mount()?;
        let counter = KernelCounter::start(tracefs.root(), &virtprof_session::EVIDENCE_EVENTS, timed)?;
        let decoder = Decoder::new(load_layout(tracefs.root(), &["kvm"])?);
        Ok(KernelSource {
            counter,
            decoder,
            history: History::new(),
            durations: Vec::new(),
            retired: VecDeque::new(),
            in_maps: HashSet::new(),
            waits_by: BTreeMap::new(),
        })
    }

    /// Read the maps as of `now`; exited threads then leave them (their figures are kept).
    pub(super) fn read(&mut self, now: u64) -> anyhow::Result<()> {
        let counts = self.counter.counts()?;
        let mut sample = KernelSample { full: counts.full, missed: counts.missed, ..Default::default() };
        self.durations = counts.durations;
        // A retired thread's id in use again is a new thread: the old one's figures go.
        self.retired.retain(|(tid, _)| counts.threads.binary_search_by_key(tid, |(t, _)| *t).is_err());
        self.waits_by.clear();
        for (waiter, by, ns) in &counts.waits_by {
            self.waits_by.entry(*waiter).or_default().push((*by, *ns));
        }
        for (tid, r) in &self.retired {
            self.waits_by.insert(*tid, r.waits_by.clone());
            // Gone: nothing new since the previous read.
            let mut counters = r.counters;
            Extremes::NONE.set(&mut counters);
            sample.threads.insert(*tid, (r.cpu, counters, r.guest));
            sample.reasons.extend(r.reasons.iter().map(|(reason, n)| ((*tid, *reason), *n)));
        }
        sample.threads.extend(counts.threads.iter().map(|(tid, t)| (*tid, (t.cpu, t.at(now), t.runs_guest))));

        sample.reasons.extend(counts.reasons.iter().map(|(tid, reason, n)| ((*tid, *reason), *n)));
        for (tid, t) in counts.threads.iter().filter(|(_, t)| t.state == ThreadState::Exited) {
            let reasons = counts.reasons.iter().filter(|(t, _, _)| t == tid).map(|(_, r, n)| (*r, *n)).collect();
            let waits_by = self.waits_by.get(tid).cloned().unwrap_or_default();
            let retired = Retired { cpu: t.cpu, counters: t.at(now), guest: t.runs_guest, reasons, waits_by };
            self.retired.push_back((*tid, retired));
            self.counter.forget(*tid)?;
        }
        self.in_maps =
            counts.threads.iter().filter(|(_, t)| t.state != ThreadState::Exited).map(|(tid, _)| *tid).collect();
        while self.retired.len() > MAX_RETIRED {
            self.retired.pop_front();
        }
        push(&mut self.history, now, sample);
        Ok(())
    }

    /// Account `tid` from `now` on in the state /proc gives, unless the program already does.
    pub(super) fn track(&mut self, tid: u32, now: u64, cpu: u32, running: bool) {
        // A full map is counted by the program and shown as loss; nothing else can fail here
        // that a later refresh would not say again.
        if self.counter.track(tid, now, cpu, running).is_ok() {
            self.in_maps.insert(tid);
        }
    }

    /// Threads the program accounts: in its maps at the last read, or added since.
    pub(super) fn tracked(&self) -> HashSet<u32> {
        self.in_maps.clone()
    }

    /// Threads seen running guest code, at the last read.
    pub(super) fn kvm_threads(&self) -> Vec<u32> {
        let Some((_, s)) = self.history.recent.back() else { return Vec::new() };
        s.threads.iter().filter(|(_, (_, _, guest))| *guest).map(|(tid, _)| *tid).collect()
    }

    /// The kernel's kvm formats.
    pub(super) fn decoder(&self) -> &Decoder {
        &self.decoder
    }

    /// Events the program could not count (a map full, or skipped by the kernel), since the
    /// start.
    pub(super) fn uncounted(&self) -> u64 {
        self.history.recent.back().map_or(0, |(_, s)| s.full.iter().sum::<u64>() + s.missed)
    }

    /// Exit durations by reason since the start (empty unless timed).
    pub(super) fn durations(&self) -> &[(ReasonKey, Histogram)] {
        &self.durations
    }

    /// Who ran on the CPU each vCPU thread waited for, since the start: waiter → (taker, ns).
    /// A wait is named as far as its CPU's last runs reach (see `KernelCounts::waits_by`).
    pub(super) fn waits_by(&self) -> &BTreeMap<u32, Vec<(Taker, u64)>> {
        &self.waits_by
    }

    /// Exits and evidence since the start, per (thread, reason).
    pub(super) fn reasons(&self) -> Vec<(u32, ReasonKey, u64)> {
        let Some((_, s)) = self.history.recent.back() else { return Vec::new() };
        s.reasons.iter().map(|((tid, reason), n)| (*tid, *reason, *n)).collect()
    }

    /// The last `ns` (u64::MAX: since the first read), as the difference of the reads around it.
    pub(super) fn span(&self, ns: u64) -> Span {
        span_of(&self.history, ns)
    }
}

/// Add a read to `history`, with each thread's extremes since the first read (the first
/// read's own are from before it).
fn push(history: &mut History<KernelSample>, now: u64, mut sample: KernelSample) {
    if let Some((_, previous)) = history.recent.back() {
        sample.run_extremes = sample
            .threads
            .iter()
            .map(|(tid, (_, c, _))| {
                let before = previous.run_extremes.get(tid).copied().unwrap_or(Extremes::NONE);
                (*tid, before.merge(Extremes::of(c)))
            })
            .collect();
    }
    history.push(now, sample);
}

/// The last `ns` of `history` (u64::MAX: since its first read).
fn span_of(history: &History<KernelSample>, ns: u64) -> Span {
    let from = history.recent.back().map_or(0, |(end, _)| end.saturating_sub(ns));
    let Some(((start, earliest), (end, latest))) = history.window(from) else { return Span::default() };
    let mut span = Span { start_ns: *start, end_ns: *end, ..Default::default() };
    // Extremes of the reads after the window's first one; from the first read ever where the
    // history no longer holds it.
    let in_recent = history.recent.front().is_some_and(|(t, _)| t <= start);
    let extremes = |tid: u32| -> Extremes {
        if !in_recent {
            return latest.run_extremes.get(&tid).copied().unwrap_or(Extremes::NONE);
        }
        history
            .recent
            .iter()
            .filter(|(t, _)| t > start)
            .filter_map(|(_, s)| s.threads.get(&tid))
            .fold(Extremes::NONE, |e, (_, c, _)| e.merge(Extremes::of(c)))
    };
    for ((tid, reason), n) in &latest.reasons {
        let d = n.saturating_sub(earliest.reasons.get(&(*tid, *reason)).copied().unwrap_or(0));
        if d > 0 {
            span.reasons.insert((*tid, *reason), d);
        }
    }
    for (tid, (cpu, now, _)) in &latest.threads {
        let mut c = match earliest.threads.get(tid) {
            Some((_, then, _)) => difference(now, then),
            None => *now,
        };
        extremes(*tid).set(&mut c);
        for ((_, reason), n) in span.reasons.iter().filter(|((t, _), _)| t == tid) {
            if reason.is_kvm_exit() {
                c.exits += n;
            } else {
                c.evidence += n;
            }
        }
        span.counters.insert((*tid, *cpu), c);
    }
    span
}

/// `now − then` for times and counts (the extremes are set by the caller).
fn difference(now: &Counters, then: &Counters) -> Counters {
    Counters {
        run_ns: now.run_ns.saturating_sub(then.run_ns),
        wait_ns: now.wait_ns.saturating_sub(then.wait_ns),
        blocked_ns: now.blocked_ns.saturating_sub(then.blocked_ns),
        unknown_ns: now.unknown_ns.saturating_sub(then.unknown_ns),
        execs: now.execs.saturating_sub(then.execs),
        inferred_execs: now.inferred_execs.saturating_sub(then.inferred_execs),
        preemptions: now.preemptions.saturating_sub(then.preemptions),
        alloc_sum_ns: now.alloc_sum_ns.saturating_sub(then.alloc_sum_ns),
        wakeups: now.wakeups.saturating_sub(then.wakeups),
        io: now.io.saturating_sub(then.io),
        ..*now
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(run_ms: u64, blocked_ms: u64, io: u64, exits: u64, evidence: u64) -> KernelSample {
        let ms = 1_000_000;
        let c = Counters { run_ns: run_ms * ms, blocked_ns: blocked_ms * ms, io, execs: run_ms, ..Counters::default() };
        KernelSample {
            threads: BTreeMap::from([(7, (1, c, true))]),
            reasons: BTreeMap::from([
                ((7, ReasonKey::Exit { reason: 30, isa: 1 }), exits),
                ((7, ReasonKey::Userspace { reason: 2 }), evidence),
            ]),
            full: [0; 4],
            missed: 0,
            ..KernelSample::default()
        }
    }

    /// A window is the difference of the reads around it, and a thread's exits and evidence
    /// are counted in its counters as the traced path counts them.
    #[test]
    fn windows_are_differences_of_reads() {
        let mut history = History::new();
        history.push(1_000_000_000, sample(100, 0, 5, 10, 1));
        history.push(2_000_000_000, sample(700, 300, 25, 70, 4));
        let span = span_of(&history, 1_000_000_000);
        assert_eq!((span.start_ns, span.end_ns), (1_000_000_000, 2_000_000_000));
        let c = span.counters[&(7, 1)];
        assert_eq!(
            (c.run_ns, c.blocked_ns, c.io, c.execs, c.exits, c.evidence),
            (600_000_000, 300_000_000, 20, 600, 60, 3)
        );
        assert_eq!(span.reasons[&(7, ReasonKey::Exit { reason: 30, isa: 1 })], 60);
        // The whole run: from the first read.
        assert_eq!(span_of(&history, u64::MAX).counters[&(7, 1)].run_ns, 600_000_000);
    }

    /// Extremes cannot be differenced: each read brings those since the previous one, and a
    /// window's are those of the reads it spans (the run's too, once the first read has left
    /// the history).
    #[test]
    fn a_windows_extremes_are_those_of_its_reads() {
        let ms = 1_000_000;
        let read = |i: u64, extremes: Option<(u64, u64, u64)>| {
            let mut s = sample(100 * i, 0, 0, 0, 0);
            let e = extremes.map_or(Extremes::NONE, |(min, max, wait)| Extremes {
                alloc_min_ns: min * ms,
                alloc_max_ns: max * ms,
                wait_max_ns: wait * ms,
            });
            e.set(&mut s.threads.get_mut(&7).unwrap().1);
            s
        };
        let second = 1_000_000_000;
        let mut history = History::new();
        push(&mut history, second, read(1, Some((1, 90, 50)))); // before the first read: not counted
        push(&mut history, 2 * second, read(2, Some((4, 6, 3))));
        push(&mut history, 3 * second, read(3, None)); // neither preempted nor waiting
        push(&mut history, 4 * second, read(4, Some((2, 5, 7))));
        let extremes = |history: &History<KernelSample>, ns| Extremes::of(&span_of(history, ns).counters[&(7, 1)]);
        let e = |min: u64, max: u64, wait: u64| Extremes {
            alloc_min_ns: min * ms,
            alloc_max_ns: max * ms,
            wait_max_ns: wait * ms,
        };
        assert_eq!(extremes(&history, second), e(2, 5, 7));
        assert_eq!(extremes(&history, 2 * second), e(2, 5, 7));
        assert_eq!(extremes(&history, 3 * second), e(2, 6, 7));
        assert_eq!(extremes(&history, u64::MAX), e(2, 6, 7));
        // A window of a read with none has none.
        let mut quiet = History::new();
        push(&mut quiet, second, read(1, Some((1, 90, 50))));
        push(&mut quiet, 2 * second, read(2, None));
        assert_eq!(Extremes::of(&span_of(&quiet, second).counters[&(7, 1)]), Extremes::NONE);
        // Once the first read has left the history, the run's extremes are the kept ones.
        for i in 5..40 {
            push(&mut history, i * second, read(i, None));
        }
        assert!(history.recent.front().unwrap().0 > second);
        assert_eq!(extremes(&history, u64::MAX), e(2, 6, 7));
    }
}
