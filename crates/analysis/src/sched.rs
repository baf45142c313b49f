//! Scheduling accounting of vCPU threads, as XenMon does it for Xen domains: for every vCPU
//! thread, time running, runnable but waiting (the host-side steal), and blocked; how often it
//! was dispatched (executions) and how long the executions that ended by preemption lasted
//! (allocation); its I/O and exits.
//!
//! The state machine per thread, driven by `sched_switch` and `sched_wakeup`:
//!
//! ```text
//!            switch in                switch out, preempted (prev_state R / R+)
//!  Runnable ──────────► Running ────────────────────────────────────────────► Runnable
//!     ▲                    │ switch out, sleeping (S, D, ...)
//!     └─── wakeup ──── Blocked ◄─┘
//! ```
//!
//! Time is accumulated per (thread, physical CPU) into fixed-width buckets of trace time, so
//! any window (the last 1 s, the last 10 s, a `--window` slice of a recording) is a sum of
//! buckets, and the whole run is kept as a running total. A thread's state before its first
//! event is unknown; that first event tells what it was (a switch-out: running; a switch-in:
//! runnable; a wakeup: blocked), and the unknown stretch is filled in afterwards, so nothing
//! is guessed. After lost events every state is unknown again until the next event.
//!
//! Pure: no clocks or files. The live sampler and `virtprof sched` feed the same analyzer.

use std::collections::VecDeque;

use rustc_hash::FxHashMap;
use serde::Serialize;
use virtprof_model::{Event, EventKind, Timestamp};

use crate::Names;

/// `sched_switch` prev_state bits of a task that is exiting (`X` dead, `Z` zombie).
const EXITING_STATES: u32 = 0x10 | 0x20;
/// The low byte of prev_state holds the task-state bits; 0 there (`R`, or `R+` = 0x100 in
/// newer kernels, the preemption marker) means the task was still runnable: preempted.
const STATE_BITS: u32 = 0xff;

/// What a `sched_switch` prev_state says of the task switched out: None if it is exiting,
/// `Some(true)` if it is still runnable (preempted), `Some(false)` if it sleeps (blocked).
pub fn preempted(prev_state: u32) -> Option<bool> {
    if prev_state & EXITING_STATES != 0 {
        None
    } else {
        Some(prev_state & STATE_BITS == 0)
    }
}

/// Time and event counts of one vCPU thread on one physical CPU over a span.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Counters {
    /// Running on the CPU.
    pub run_ns: u64,
    /// Runnable, waiting for the CPU (host-side steal).
    pub wait_ns: u64,
    /// Sleeping (waiting for I/O, a timer, a halt).
    pub blocked_ns: u64,
    /// State not known (before the thread's first event, or after lost events).
    pub unknown_ns: u64,
    /// Dispatches (switch-ins).
    pub execs: u64,
    /// Of those, switch-ins the trace did not show, inferred from the thread's own events
    /// (some kernels skip `sched_switch` when leaving the idle task: see [`SchedAccounting`]).
    pub inferred_execs: u64,
    /// Executions that ended by preemption (their lengths are the allocation).
    pub preemptions: u64,
    /// Sum, min and max of those executions' lengths.
    pub alloc_sum_ns: u64,
    /// Shortest allocation (`u64::MAX` when none).
    pub alloc_min_ns: u64,
    /// Longest allocation.
    pub alloc_max_ns: u64,
    /// Longest wait seen whole, from becoming runnable to running (the worst dispatch delay).
    pub wait_max_ns: u64,
    /// Wakeups from blocked.
    pub wakeups: u64,
    /// Port and MMIO accesses (`kvm_pio`, satisfied `kvm_mmio`).
    pub io: u64,
    /// `kvm_exit` events.
    pub exits: u64,
    /// Exit evidence on hosts without `kvm_exit`: userspace exits and in-kernel handlers.
    pub evidence: u64,
}

impl Default for Counters {
    fn default() -> Self {
        Counters {
            run_ns: 0,
            wait_ns: 0,
            blocked_ns: 0,
            unknown_ns: 0,
            execs: 0,
            inferred_execs: 0,
            preemptions: 0,
            alloc_sum_ns: 0,
            alloc_min_ns: u64::MAX,
            alloc_max_ns: 0,
            wait_max_ns: 0,
            wakeups: 0,
            io: 0,
            exits: 0,
            evidence: 0,
        }
    }
}

impl Counters {
    /// Add `other` (sums, min of mins, max of maxes).
    pub fn add(&mut self, other: &Counters) {
        self.run_ns += other.run_ns;
        self.wait_ns += other.wait_ns;
        self.blocked_ns += other.blocked_ns;
        self.unknown_ns += other.unknown_ns;
        self.execs += other.execs;
        self.inferred_execs += other.inferred_execs;
        self.preemptions += other.preemptions;
        self.alloc_sum_ns += other.alloc_sum_ns;
        self.alloc_min_ns = self.alloc_min_ns.min(other.alloc_min_ns);
        self.alloc_max_ns = self.alloc_max_ns.max(other.alloc_max_ns);
        self.wait_max_ns = self.wait_max_ns.max(other.wait_max_ns);
        self.wakeups += other.wakeups;
        self.io += other.io;
        self.exits += other.exits;
        self.evidence += other.evidence;
    }

    /// All the time accounted: run + wait + blocked + unknown.
    pub fn observed_ns(&self) -> u64 {
        self.run_ns + self.wait_ns + self.blocked_ns + self.unknown_ns
    }

    fn time_mut(&mut self, state: State) -> &mut u64 {
        match state {
            State::Running => &mut self.run_ns,
            State::Runnable => &mut self.wait_ns,
            State::Blocked => &mut self.blocked_ns,
            State::Unknown | State::Exited => &mut self.unknown_ns,
        }
    }
}

/// What an exit or piece of exit evidence is counted under, named in reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ReasonKey {
    /// A `kvm_exit` reason.
    Exit {
        /// Raw reason.
        reason: u32,
        /// Its instruction set.
        isa: u32,
    },
    /// A `kvm_userspace_exit` reason.
    Userspace {
        /// `KVM_EXIT_*`.
        reason: u32,
    },
    /// An in-kernel handler's event (`kvm_cpuid`, `kvm_msr`, ...).
    Event {
        /// Event id.
        id: u16,
    },
}

impl ReasonKey {
    /// The kernel's name for it.
    pub fn name(self, names: &dyn Names) -> String {
        match self {
            ReasonKey::Exit { reason, isa } => names.exit_reason(reason, isa),
            ReasonKey::Userspace { reason } => names.userspace_reason(reason),
            ReasonKey::Event { id } => names.event(id),
        }
    }

    /// A `kvm_exit` reason (not a userspace exit or evidence).
    pub fn is_kvm_exit(self) -> bool {
        matches!(self, ReasonKey::Exit { .. })
    }
}

/// Everything accounted over one span of trace time.
#[derive(Debug, Clone, Default)]
pub struct Span {
    /// Start (inclusive), trace ns.
    pub start_ns: Timestamp,
    /// End (exclusive).
    pub end_ns: Timestamp,
    /// Per (thread, CPU).
    pub counters: FxHashMap<(u32, u32), Counters>,
    /// Exits and evidence per (thread, reason).
    pub reasons: FxHashMap<(u32, ReasonKey), u64>,
}

impl Span {
    fn empty(start_ns: Timestamp, end_ns: Timestamp) -> Span {
        Span { start_ns, end_ns, ..Default::default() }
    }

    /// Fold `other` in, widening the span to cover both.
    pub fn merge(&mut self, other: &Span) {
        if self.counters.is_empty() && self.reasons.is_empty() && self.start_ns == self.end_ns {
            self.start_ns = other.start_ns;
        }
        self.start_ns = self.start_ns.min(other.start_ns);
        self.end_ns = self.end_ns.max(other.end_ns);
        for (key, c) in &other.counters {
            self.counters.entry(*key).or_default().add(c);
        }
        for (key, n) in &other.reasons {
            *self.reasons.entry(*key).or_default() += n;
        }
    }

    /// One thread's counters summed over CPUs (or on `cpu` only).
    pub fn thread(&self, tid: u32, cpu: Option<u32>) -> Counters {
        let mut sum = Counters::default();
        for ((t, c), counters) in &self.counters {
            if *t == tid && cpu.is_none_or(|want| want == *c) {
                sum.add(counters);
            }
        }
        sum
    }

    /// The CPU a thread ran on longest in this span.
    pub fn main_cpu(&self, tid: u32) -> Option<u32> {
        self.counters
            .iter()
            .filter(|((t, _), _)| *t == tid)
            .max_by_key(|(_, c)| (c.run_ns, c.observed_ns()))
            .map(|((_, cpu), _)| *cpu)
    }

    /// Whether any `kvm_exit` was counted (otherwise exits come from evidence).
    pub fn has_kvm_exits(&self) -> bool {
        self.reasons.keys().any(|(_, r)| r.is_kvm_exit())
    }

    /// (thread, reason, count) of the exits as counted: `kvm_exit` reasons where the trace has
    /// them, else userspace exits and in-kernel evidence (never both, so they add up).
    pub fn counted_reasons(&self) -> impl Iterator<Item = (u32, ReasonKey, u64)> + '_ {
        let kvm_exit = self.has_kvm_exits();
        self.reasons
            .iter()
            .filter(move |((_, key), _)| kvm_exit == key.is_kvm_exit())
            .map(|((t, key), n)| (*t, *key, *n))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Unknown,
    Running,
    Runnable,
    Blocked,
    Exited,
}

impl State {
    /// The name timelines show.
    fn name(self) -> &'static str {
        match self {
            State::Unknown => "unknown",
            State::Running => "running",
            State::Runnable => "waiting",
            State::Blocked => "blocked",
            State::Exited => "exited",
        }
    }
}

/// One stretch of a tracked thread in one state (`running`, `waiting`, `blocked`, or
/// `unknown` where a gap in the trace leaves it so), exactly as the accounting counted it:
/// a timeline drawn from these (Perfetto's state tracks) adds up to the accounting's totals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateSlice {
    /// Thread.
    pub tid: u32,
    /// State name.
    pub state: &'static str,
    /// Start, trace clock.
    pub start_ns: u64,
    /// End, trace clock.
    pub end_ns: u64,
}

/// The slices, when asked for: each thread's last slice is extended while its state lasts;
/// unknown ones are renamed when the thread's next event tells what they were.
#[derive(Debug, Default)]
struct SliceLog {
    slices: Vec<StateSlice>,
    last: FxHashMap<u32, usize>,
    unknown: FxHashMap<u32, Vec<usize>>,
}

impl SliceLog {
    fn add(&mut self, tid: u32, state: State, from: Timestamp, to: Timestamp) {
        if let Some(&i) = self.last.get(&tid) {
            let slice = &mut self.slices[i];
            if slice.state == state.name() && slice.end_ns == from {
                slice.end_ns = to;
                return;
            }
        }
        self.last.insert(tid, self.slices.len());
        if state == State::Unknown {
            self.unknown.entry(tid).or_default().push(self.slices.len());
        }
        self.slices.push(StateSlice { tid, state: state.name(), start_ns: from, end_ns: to });
    }

    /// The thread's last slice, in state `was` up to `to`, was `state` from `from` on.
    fn rename_tail(&mut self, tid: u32, was: State, from: Timestamp, to: Timestamp, state: State) {
        let Some(&i) = self.last.get(&tid) else { return };
        let slice = &mut self.slices[i];
        if slice.state != was.name() || slice.end_ns != to {
            return;
        }
        if slice.start_ns >= from {
            slice.state = state.name();
            return;
        }
        slice.end_ns = from;
        self.last.insert(tid, self.slices.len());
        self.slices.push(StateSlice { tid, state: state.name(), start_ns: from, end_ns: to });
    }

    fn resolve(&mut self, tid: u32, state: State) {
        for i in self.unknown.remove(&tid).unwrap_or_default() {
            self.slices[i].state = state.name();
        }
    }
}

#[derive(Debug, Clone)]
struct Thread {
    state: State,
    /// Start of the current state (accounted up to here).
    since: Timestamp,
    /// The CPU it runs on, waits on, or last ran on.
    cpu: u32,
    /// Start of the current execution.
    exec_start: Timestamp,
    /// When it entered its current state (not moved by accounting, unlike `since`).
    entered: Timestamp,
    /// When it was last put on a run queue (woken, preempted or migrated while runnable).
    queued: Timestamp,
    /// Unknown stretches not yet resolved: (bucket sequence number, cpu, ns).
    unresolved: Vec<(u64, u32, u64)>,
    /// It emitted kvm events: a vCPU thread, whatever it is named.
    runs_guest: bool,
}

/// Bucket width and how many closed buckets to keep.
#[derive(Debug, Clone, Copy)]
pub struct SchedOptions {
    /// Bucket width in ns (the resolution of windows).
    pub bucket_ns: u64,
    /// Closed buckets kept (older ones live on only in the whole-run total).
    pub keep_buckets: usize,
}

/// The accounting analyzer.
#[derive(Debug)]
pub struct SchedAccounting {
    options: SchedOptions,
    evidence_events: Vec<u16>,
    threads: FxHashMap<u32, Thread>,
    /// Closed buckets, oldest first, each with its sequence number.
    closed: VecDeque<(u64, Span)>,
    current: Option<(u64, Span)>,
    total: Span,
    /// State slices, when [`SchedAccounting::record_slices`] asked for them.
    slices: Option<SliceLog>,
    /// Lost-event records and the events they counted (None: count unknown).
    pub lost: (u64, u64),
    /// The first event that would have needed more than [`MAX_KEPT_BUCKETS`]; from there on
    /// nothing is accounted (see [`SchedAccounting::overflow`]).
    overflow: Option<Timestamp>,
    /// Per CPU, the time of the last event seen on it: bounds a switch-in the trace missed.
    cpu_last_ts: Vec<u64>,
}

/// The most buckets a run keeping every bucket (a recording's windows) may hold. Each holds
/// every tracked thread's counters, so a damaged timestamp far in the future, or a tiny
/// window over a long recording, must stop here rather than fill memory.
pub const MAX_KEPT_BUCKETS: usize = 100_000;

/// CPUs whose last event is kept (a damaged CPU number beyond it just goes without).
const MAX_CPUS: usize = 8192;

impl SchedAccounting {
    /// An analyzer with `options`; `evidence_events` are event ids counted as exit evidence.
    pub fn new(options: SchedOptions, evidence_events: Vec<u16>) -> SchedAccounting {
        assert!(options.bucket_ns > 0, "bucket width must be positive");
        SchedAccounting {
            options,
            evidence_events,
            threads: FxHashMap::default(),
            closed: VecDeque::new(),
            current: None,
            total: Span::default(),
            slices: None,
            lost: (0, 0),
            overflow: None,
            cpu_last_ts: Vec::new(),
        }
    }

    /// Its bucket width and how many it keeps.
    pub fn options(&self) -> SchedOptions {
        self.options
    }

    /// Where the run outgrew [`MAX_KEPT_BUCKETS`] (an event's timestamp): the accounting
    /// stopped there and its figures cover only what came before.
    pub fn overflow(&self) -> Option<Timestamp> {
        self.overflow
    }

    /// Also keep every thread's state slices (memory grows with the tracked threads' switches).
    pub fn record_slices(&mut self) {
        self.slices.get_or_insert_with(SliceLog::default);
    }

    /// The state slices so far (call after [`SchedAccounting::finish`] for the whole run).
    pub fn take_slices(&mut self) -> Vec<StateSlice> {
        self.slices.as_mut().map(|log| std::mem::take(&mut log.slices)).unwrap_or_default()
    }

    /// Account thread `tid` from `ts` on (its state is learned from its first event).
    /// Threads that emit kvm events are tracked on their own from that event on.
    pub fn track(&mut self, tid: u32, ts: Timestamp) {
        self.roll_to(ts);
        self.threads.entry(tid).or_insert(Thread {
            state: State::Unknown,
            since: ts,
            cpu: 0,
            exec_start: ts,
            entered: ts,
            queued: ts,
            unresolved: Vec::new(),
            runs_guest: false,
        });
    }

    /// Account thread `tid` from `ts` on, starting in the state `/proc` reports: running
    /// (`R`: on `cpu` or about to be; the first switch event corrects it) or sleeping.
    pub fn track_from_proc(&mut self, tid: u32, ts: Timestamp, cpu: u32, running: bool) {
        if self.threads.contains_key(&tid) {
            return;
        }
        self.track(tid, ts);
        let state = if running { State::Running } else { State::Blocked };
        self.transition(tid, state, cpu, ts);
        if let Some(t) = self.threads.get_mut(&tid) {
            t.exec_start = ts;
        }
    }

    /// Threads accounted so far.
    pub fn tracked(&self) -> impl Iterator<Item = u32> + '_ {
        self.threads.keys().copied()
    }

    /// Threads seen running guest code (they emitted kvm events): vCPU threads, named so or
    /// not, unlike other tracked threads (a VMM's I/O threads).
    pub fn kvm_threads(&self) -> impl Iterator<Item = u32> + '_ {
        self.threads.iter().filter(|(_, t)| t.runs_guest).map(|(&tid, _)| tid)
    }

    /// The CPU thread `tid` last ran or waits on.
    pub fn cpu_of(&self, tid: u32) -> Option<u32> {
        self.threads.get(&tid).map(|t| t.cpu)
    }

    /// Feed one event (in timestamp order; slightly late events are clamped, never negative).
    pub fn on_event(&mut self, e: &Event) {
        self.roll_to(e.ts);
        if self.overflow.is_some() {
            return;
        }
        self.infer_switch_in(e);
        let cpu = e.cpu as usize;
        if cpu < MAX_CPUS {
            if self.cpu_last_ts.len() <= cpu {
                self.cpu_last_ts.resize(cpu + 1, 0);
            }
            self.cpu_last_ts[cpu] = e.ts;
        }
        match e.kind {
            EventKind::SchedSwitch { prev_tid, prev_state, next_tid, .. } => {
                if self.threads.contains_key(&prev_tid) {
                    self.switch_out(prev_tid, prev_state, e);
                }
                if self.threads.contains_key(&next_tid) {
                    self.switch_in(next_tid, e);
                }
            }
            EventKind::SchedWakeup { tid, target_cpu } => {
                if let Some(t) = self.threads.get(&tid) {
                    match t.state {
                        State::Unknown => self.resolve(tid, State::Blocked, e.ts),
                        State::Blocked => {}
                        _ => return, // a wakeup of a runnable task changes nothing
                    }
                    self.transition(tid, State::Runnable, target_cpu, e.ts);
                    self.count(tid, target_cpu, |c| c.wakeups += 1);
                }
            }
            EventKind::SchedMigrate { tid, dest_cpu, .. } => {
                if let Some(t) = self.threads.get(&tid) {
                    let state = t.state;
                    if state != State::Running {
                        self.transition(tid, state, dest_cpu, e.ts);
                    }
                }
            }
            EventKind::KvmPio { .. } => self.kvm_event(e, |c| c.io += 1, None),
            EventKind::KvmMmio { kind, .. } if kind != 0 => self.kvm_event(e, |c| c.io += 1, None),
            EventKind::KvmExit { reason, isa, .. } => {
                self.kvm_event(e, |c| c.exits += 1, Some(ReasonKey::Exit { reason, isa }))
            }
            EventKind::KvmUserspaceExit { reason, .. } => {
                self.kvm_event(e, |c| c.evidence += 1, Some(ReasonKey::Userspace { reason }))
            }
            EventKind::Other { event } if self.evidence_events.contains(&event) => {
                self.kvm_event(e, |c| c.evidence += 1, Some(ReasonKey::Event { id: event }))
            }
            EventKind::KvmMmio { .. } | EventKind::KvmEntry { .. } | EventKind::KvmEmulateInsn { .. } => {
                self.kvm_event(e, |_| {}, None)
            }
            EventKind::Lost { count } => {
                self.lost.0 += 1;
                self.lost.1 += count.unwrap_or(0);
                let tids: Vec<u32> = self.threads.keys().copied().collect();
                for tid in tids {
                    let cpu = self.threads[&tid].cpu;
                    if self.threads[&tid].state != State::Exited {
                        self.transition(tid, State::Unknown, cpu, e.ts);
                    }
                }
            }
            _ => {}
        }
    }

    /// A thread that emits an event is running. If it was blocked or waiting, the trace missed
    /// its switch-in: some kernels (this PVM host's, on its second CPU) do not emit
    /// `sched_switch` when the idle task hands over, though schedstat counts the dispatch.
    fn infer_switch_in(&mut self, e: &Event) {
        let Some(t) = self.threads.get(&e.tid) else { return };
        if !matches!(t.state, State::Blocked | State::Runnable) {
            return;
        }
        if matches!(e.kind, EventKind::SchedSwitch { next_tid, .. } if next_tid == e.tid) {
            return;
        }
        // It ran from the last event on this CPU since it stopped: what the CPU did before it
        // (an interrupt in idle, the one that woke it, another task) came first, and the
        // thread's own first event can be a whole tick later. Queued on this CPU, not before it
        // was queued, and from then if the CPU did nothing since: an idle CPU runs what is
        // queued on it at once. Otherwise from this event. Windows closed since are restated.
        let before = self.cpu_last_ts.get(e.cpu as usize).copied().filter(|&ts| ts > t.entered && ts <= e.ts);
        let queued_here = (t.state == State::Runnable && t.cpu == e.cpu).then_some(t.queued.min(e.ts));
        let at = match (queued_here, before) {
            (Some(queued), before) => before.map_or(queued, |ts| ts.max(queued)),
            (None, before) => before.unwrap_or(e.ts),
        };
        self.ran_already_from(e.tid, at, e.cpu);
        self.transition(e.tid, State::Running, e.cpu, at);
        if let Some(t) = self.threads.get_mut(&e.tid) {
            t.exec_start = at;
        }
        self.count(e.tid, e.cpu, |c| {
            c.execs += 1;
            c.inferred_execs += 1;
        });
    }

    /// Thread `tid` has been running on `cpu` since `from`, before where its accounting has
    /// reached: windows closed meanwhile counted that stretch in its previous state. Move it to
    /// running there, in the whole-run total and in the slices, so that where windows start
    /// never changes what a thread did (5 ms windows once took 2 ms off a 15 ms run).
    fn ran_already_from(&mut self, tid: u32, from: Timestamp, cpu: u32) {
        let Some(t) = self.threads.get(&tid) else { return };
        let (was, was_cpu, to) = (t.state, t.cpu, t.since);
        if from >= to {
            return;
        }
        let restate = |span: &mut Span, ns: u64| {
            if ns == 0 {
                return;
            }
            let old = span.counters.entry((tid, was_cpu)).or_default().time_mut(was);
            let moved = ns.min(*old);
            *old -= moved;
            span.counters.entry((tid, cpu)).or_default().run_ns += moved;
        };
        let overlap = |span: &Span| to.min(span.end_ns).saturating_sub(from.max(span.start_ns));
        let mut closed_until = to;
        if let Some((_, span)) = self.current.as_mut() {
            closed_until = span.start_ns.min(to);
            restate(span, overlap(span));
        }
        for (_, span) in self.closed.iter_mut().rev().take_while(|(_, s)| s.end_ns > from) {
            restate(span, overlap(span));
        }
        restate(&mut self.total, closed_until.saturating_sub(from));
        if let Some(log) = self.slices.as_mut() {
            log.rename_tail(tid, was, from, to, State::Running);
        }
    }

    /// A kvm event from a vCPU thread: it is running, on this CPU, now.
    fn kvm_event(&mut self, e: &Event, count: impl FnOnce(&mut Counters), reason: Option<ReasonKey>) {
        match self.threads.get(&e.tid).map(|t| t.state) {
            None => {
                self.track(e.tid, e.ts);
                self.transition(e.tid, State::Running, e.cpu, e.ts);
            }
            Some(State::Unknown) => {
                self.resolve(e.tid, State::Running, e.ts);
                self.transition(e.tid, State::Running, e.cpu, e.ts);
            }
            // Blocked or runnable threads were made running by `infer_switch_in`.
            Some(_) => {}
        }
        if let Some(t) = self.threads.get_mut(&e.tid) {
            t.runs_guest = true;
        }
        self.count(e.tid, e.cpu, count);
        if let (Some(reason), Some((_, span))) = (reason, self.current.as_mut()) {
            *span.reasons.entry((e.tid, reason)).or_default() += 1;
        }
    }

    fn switch_out(&mut self, tid: u32, prev_state: u32, e: &Event) {
        let state = self.threads[&tid].state;
        if state == State::Unknown {
            self.resolve(tid, State::Running, e.ts);
        } else if state != State::Running {
            return; // inconsistent after loss; the next events resynchronize
        }
        let exec_start = self.threads[&tid].exec_start;
        let next = if preempted(prev_state).is_none() {
            State::Exited
        } else if preempted(prev_state) == Some(true) {
            // An execution ended by preemption: its length is an allocation.
            if state == State::Running {
                let len = e.ts.saturating_sub(exec_start);
                self.count(tid, e.cpu, |c| {
                    c.preemptions += 1;
                    c.alloc_sum_ns += len;
                    c.alloc_min_ns = c.alloc_min_ns.min(len);
                    c.alloc_max_ns = c.alloc_max_ns.max(len);
                });
            }
            State::Runnable
        } else {
            State::Blocked
        };
        self.transition(tid, next, e.cpu, e.ts);
    }

    fn switch_in(&mut self, tid: u32, e: &Event) {
        let thread = &self.threads[&tid];
        if thread.state == State::Runnable {
            let waited = e.ts.saturating_sub(thread.entered);
            self.count(tid, e.cpu, |c| c.wait_max_ns = c.wait_max_ns.max(waited));
        }
        if self.threads[&tid].state == State::Unknown {
            self.resolve(tid, State::Runnable, e.ts);
        }
        self.transition(tid, State::Running, e.cpu, e.ts);
        if let Some(t) = self.threads.get_mut(&tid) {
            t.exec_start = e.ts;
        }
        self.count(tid, e.cpu, |c| c.execs += 1);
    }

    /// Account the thread's current state up to `ts`, then enter `state` on `cpu`.
    fn transition(&mut self, tid: u32, state: State, cpu: u32, ts: Timestamp) {
        self.account(tid, ts);
        if let Some(t) = self.threads.get_mut(&tid) {
            if t.state != state {
                t.entered = ts;
            }
            if state == State::Runnable {
                t.queued = ts;
            }
            t.state = state;
            t.cpu = cpu;
        }
    }

    /// Add the thread's time in its current state, from `since` to `ts`, to the current bucket.
    fn account(&mut self, tid: u32, ts: Timestamp) {
        let Some((seq, span)) = self.current.as_mut() else { return };
        let Some(t) = self.threads.get_mut(&tid) else { return };
        let from = t.since.max(span.start_ns);
        let ns = ts.saturating_sub(from);
        t.since = t.since.max(ts);
        if ns == 0 || t.state == State::Exited {
            return;
        }
        if t.state == State::Unknown {
            t.unresolved.push((*seq, t.cpu, ns));
        }
        *span.counters.entry((tid, t.cpu)).or_default().time_mut(t.state) += ns;
        if let Some(log) = self.slices.as_mut() {
            log.add(tid, t.state, ts - ns, ts);
        }
    }

    /// The thread's unknown stretches turn out to have been `state`: move them there, in
    /// whichever bucket (and the total) they were counted.
    fn resolve(&mut self, tid: u32, state: State, ts: Timestamp) {
        self.account(tid, ts);
        if let Some(log) = self.slices.as_mut() {
            log.resolve(tid, state);
        }
        let Some(t) = self.threads.get_mut(&tid) else { return };
        for (seq, cpu, ns) in std::mem::take(&mut t.unresolved) {
            let mut spans: Vec<&mut Span> = Vec::with_capacity(2);
            match &mut self.current {
                Some((s, span)) if *s == seq => spans.push(span),
                _ => {
                    if let Some((_, span)) = self.closed.iter_mut().find(|(s, _)| *s == seq) {
                        spans.push(span);
                    }
                    spans.push(&mut self.total);
                }
            }
            for span in spans {
                let c = span.counters.entry((tid, cpu)).or_default();
                c.unknown_ns = c.unknown_ns.saturating_sub(ns);
                *c.time_mut(state) += ns;
            }
        }
    }

    fn count(&mut self, tid: u32, cpu: u32, f: impl FnOnce(&mut Counters)) {
        if let Some((_, span)) = self.current.as_mut() {
            f(span.counters.entry((tid, cpu)).or_default());
        }
    }

    /// Close every bucket that ends at or before `ts` (accounting each thread's ongoing state
    /// into it), so windows up to `ts` are complete. Call with "now" in live mode.
    pub fn roll_to(&mut self, ts: Timestamp) {
        let width = self.options.bucket_ns;
        if self.current.is_none() {
            // Buckets start at the first event, so a recording's windows start with it.
            self.current = Some((0, Span::empty(ts, ts + width)));
        }
        while let Some(end) = self.current.as_ref().map(|(_, s)| s.end_ns).filter(|&end| ts >= end) {
            if self.options.keep_buckets > MAX_KEPT_BUCKETS && self.closed.len() >= MAX_KEPT_BUCKETS {
                self.overflow.get_or_insert(ts);
                return;
            }
            let tids: Vec<u32> = self.threads.keys().copied().collect();
            for tid in tids {
                self.account(tid, end);
            }
            let (seq, span) = self.current.take().expect("checked above");
            self.total.merge(&span);
            self.closed.push_back((seq, span));
            while self.closed.len() > self.options.keep_buckets {
                self.closed.pop_front();
            }
            // With nothing tracked, skip the empty buckets in one step, staying on the grid.
            let next_start = if self.threads.is_empty() { ts - (ts - end) % width } else { end };
            self.current = Some((seq + 1, Span::empty(next_start, next_start + width)));
        }
    }

    /// The closed buckets covering the last `ns` (up to the last closed bucket), merged.
    pub fn last(&self, ns: u64) -> Span {
        let mut out = Span::default();
        let Some((_, newest)) = self.closed.back() else { return out };
        let from = newest.end_ns.saturating_sub(ns);
        for (_, span) in self.closed.iter().rev().take_while(|(_, s)| s.start_ns >= from) {
            out.merge(span);
        }
        out
    }

    /// Closed buckets, oldest first (with `keep_buckets` large: every bucket of a recording).
    pub fn buckets(&self) -> impl Iterator<Item = &Span> {
        self.closed.iter().map(|(_, s)| s)
    }

    /// Close the current bucket at `ts` (the end of a recording) and return the whole run.
    pub fn finish(&mut self, ts: Timestamp) -> Span {
        if let Some((_, span)) = self.current.as_mut() {
            span.end_ns = span.end_ns.min(ts.max(span.start_ns));
            let end = span.end_ns;
            self.roll_to(end);
        }
        self.total.clone()
    }

    /// The whole run so far (closed buckets).
    pub fn total(&self) -> &Span {
        &self.total
    }
}

impl crate::Analyzer for SchedAccounting {
    fn on_event(&mut self, event: &Event, _: &dyn crate::Names) {
        SchedAccounting::on_event(self, event);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use virtprof_model::StrId;

    const MS: u64 = 1_000_000;

    fn switch(ts: u64, cpu: u32, prev: u32, prev_state: u32, next: u32) -> Event {
        Event {
            ts,
            cpu,
            tid: prev,
            kind: EventKind::SchedSwitch {
                prev_tid: prev,
                prev_state,
                prev_comm: StrId(0),
                next_tid: next,
                next_comm: StrId(0),
            },
        }
    }

    fn wakeup(ts: u64, tid: u32, cpu: u32) -> Event {
        Event { ts, cpu, tid: 0, kind: EventKind::SchedWakeup { tid, target_cpu: cpu } }
    }

    fn pio(ts: u64, cpu: u32, tid: u32) -> Event {
        Event { ts, cpu, tid, kind: EventKind::KvmPio { write: true, port: 0x10, size: 1, count: 1 } }
    }

    fn analyzer(bucket_ns: u64) -> SchedAccounting {
        SchedAccounting::new(SchedOptions { bucket_ns, keep_buckets: 1000 }, Vec::new())
    }

    #[test]
    fn a_far_timestamp_stops_the_accounting_instead_of_filling_memory() {
        // Found by the fuzzer: one damaged event 26 300 s on, 1 ms buckets kept for the run.
        let mut a = SchedAccounting::new(SchedOptions { bucket_ns: 1_000_000, keep_buckets: usize::MAX }, Vec::new());
        a.track(7, 0);
        a.on_event(&pio(1_000, 0, 7));
        a.on_event(&pio(26_300_000_000_000, 0, 7));
        assert_eq!(a.overflow(), Some(26_300_000_000_000));
        assert_eq!(a.buckets().count(), MAX_KEPT_BUCKETS);
        // Live views keep few buckets and are never stopped.
        let mut live = analyzer(1_000_000);
        live.track(7, 0);
        live.on_event(&pio(300_000_000_000, 0, 7));
        assert_eq!(live.overflow(), None);
    }

    #[test]
    fn the_longest_wait_runs_from_wakeup_or_preemption_to_switch_in_and_not_from_the_unknown() {
        let mut a = analyzer(100 * MS);
        a.track(1, 0);
        // Seen first being switched in: how long it waited before is unknown, not counted.
        a.on_event(&switch(5 * MS, 0, 0, 0, 1));
        a.on_event(&switch(6 * MS, 0, 1, 1, 0)); // blocks
        a.on_event(&wakeup(10 * MS, 1, 0));
        a.on_event(&switch(13 * MS, 0, 0, 0, 1)); // waited 3 ms
        a.on_event(&switch(14 * MS, 0, 1, 0x100, 2)); // preempted
        a.on_event(&switch(15 * MS, 0, 2, 0x100, 1)); // waited 1 ms
        let t = a.finish(20 * MS).thread(1, None);
        // The first 5 ms are resolved as waiting (it was runnable when first seen), but that
        // wait was not seen whole, so it is no candidate for the longest.
        assert_eq!((t.wait_ns, t.wait_max_ns), (9 * MS, 3 * MS));
    }

    #[test]
    fn two_threads_sharing_a_cpu_run_and_wait_half_each() {
        let mut a = analyzer(100 * MS);
        a.track(1, 0);
        a.track(2, 0);
        // 1 and 2 alternate on CPU 0 in 10 ms slices, each preempting the other.
        for i in 0..20u64 {
            let (prev, next) = if i % 2 == 0 { (2, 1) } else { (1, 2) };
            a.on_event(&switch(i * 10 * MS, 0, prev, 0x100, next));
        }
        let total = a.finish(200 * MS);
        let (t1, t2) = (total.thread(1, None), total.thread(2, None));
        assert_eq!((t1.run_ns, t1.wait_ns, t1.blocked_ns, t1.unknown_ns), (100 * MS, 100 * MS, 0, 0));
        // Thread 2's first event (switched out, preempted) tells it ran from 0 to 0.
        assert_eq!((t2.run_ns, t2.wait_ns, t2.unknown_ns), (100 * MS, 100 * MS, 0));
        assert_eq!((t1.execs, t2.execs), (10, 10));
        assert_eq!((t1.preemptions, t1.alloc_min_ns, t1.alloc_max_ns), (10, 10 * MS, 10 * MS));
        assert_eq!((t1.wait_max_ns, t2.wait_max_ns), (10 * MS, 10 * MS));
        assert_eq!(a.buckets().count(), 2);
        assert_eq!(a.last(100 * MS).thread(1, None).run_ns, 50 * MS);
    }

    #[test]
    fn blocked_time_and_io_of_an_io_bound_thread() {
        let mut a = analyzer(1000 * MS);
        a.track(7, 0);
        // First event: a wakeup, so it was blocked from 0 to 5 ms.
        let mut ts = 5 * MS;
        for _ in 0..4 {
            a.on_event(&wakeup(ts, 7, 1));
            a.on_event(&switch(ts + MS, 1, 0, 0, 7)); // waits 1 ms
            a.on_event(&pio(ts + 2 * MS, 1, 7)); // runs 2 ms, doing one OUT
            a.on_event(&switch(ts + 3 * MS, 1, 7, 1, 0)); // sleeps (S)
            ts += 10 * MS; // blocked 7 ms
        }
        let t = a.finish(ts).thread(7, None);
        assert_eq!((t.run_ns, t.wait_ns, t.blocked_ns), (8 * MS, 4 * MS, 5 * MS + 4 * 7 * MS));
        assert_eq!((t.execs, t.wakeups, t.io, t.preemptions), (4, 4, 4, 0));
        assert_eq!(a.cpu_of(7), Some(1));
    }

    #[test]
    fn state_slices_add_up_to_the_accounting_and_unknown_ones_resolve() {
        let mut a = analyzer(10 * MS);
        a.record_slices();
        a.track(3, 0);
        a.track(7, 0);
        // 3: unknown until switched out at 35 ms (it ran), then blocked; 7: the io-bound loop.
        a.on_event(&switch(35 * MS, 2, 3, 1, 0));
        let mut ts = 5 * MS;
        for _ in 0..4 {
            a.on_event(&wakeup(ts, 7, 1));
            a.on_event(&switch(ts + MS, 1, 0, 0, 7));
            a.on_event(&switch(ts + 3 * MS, 1, 7, 1, 0));
            ts += 10 * MS;
        }
        let total = a.finish(ts);
        let slices = a.take_slices();
        for tid in [3, 7] {
            let t = total.thread(tid, None);
            let sum = |state: &str| -> u64 {
                slices.iter().filter(|s| s.tid == tid && s.state == state).map(|s| s.end_ns - s.start_ns).sum()
            };
            assert_eq!(
                (sum("running"), sum("waiting"), sum("blocked"), sum("unknown")),
                (t.run_ns, t.wait_ns, t.blocked_ns, t.unknown_ns),
                "tid {tid}"
            );
        }
        // Thread 3's unknown start became one running slice from 0 to 35 ms.
        assert!(slices.iter().any(|s| s.tid == 3 && s.state == "running" && s.start_ns == 0 && s.end_ns >= 30 * MS));
        // Slices of a thread never overlap.
        for tid in [3, 7] {
            let mine: Vec<_> = slices.iter().filter(|s| s.tid == tid).collect();
            assert!(mine.windows(2).all(|w| w[0].end_ns <= w[1].start_ns), "{mine:?}");
        }
    }

    #[test]
    fn unknown_stretches_resolve_into_closed_buckets() {
        let mut a = analyzer(10 * MS);
        a.track(3, 0);
        // No event for 35 ms, then the thread is switched out: it ran all along.
        a.on_event(&switch(35 * MS, 2, 3, 1, 0));
        let total = a.finish(40 * MS);
        let t = total.thread(3, None);
        assert_eq!((t.run_ns, t.blocked_ns, t.unknown_ns), (35 * MS, 5 * MS, 0));
        let first = a.buckets().next().unwrap();
        assert_eq!(first.thread(3, None).run_ns, 10 * MS);
    }

    #[test]
    fn kvm_events_track_unnamed_vcpu_threads_and_loss_resets_states() {
        let mut a = analyzer(10 * MS);
        a.on_event(&pio(MS, 0, 42));
        assert!(a.tracked().any(|t| t == 42));
        a.on_event(&Event { ts: 2 * MS, cpu: 0, tid: 0, kind: EventKind::Lost { count: Some(3) } });
        a.on_event(&switch(4 * MS, 0, 42, 0, 1));
        let t = a.finish(5 * MS).thread(42, None);
        assert_eq!((t.run_ns, t.wait_ns, t.io, t.unknown_ns), (3 * MS, MS, 1, 0));
        assert_eq!(a.lost, (1, 3));
    }

    #[test]
    fn switch_ins_the_trace_missed_are_inferred_from_the_threads_events() {
        let mut a = analyzer(100 * MS);
        a.track(9, 0);
        a.on_event(&switch(MS, 1, 9, 1, 0)); // sleeps
        a.on_event(&wakeup(5 * MS, 9, 1));
        // No sched_switch into 9: its first kvm event shows it running, and as it was queued
        // on this CPU (idle: the handover the kernel leaves out), running since its wakeup.
        a.on_event(&pio(6 * MS, 1, 9));
        a.on_event(&switch(8 * MS, 1, 9, 1, 0));
        let t = a.finish(10 * MS).thread(9, None);
        assert_eq!((t.execs, t.inferred_execs, t.io), (1, 1, 1));
        assert_eq!((t.run_ns, t.wait_ns, t.blocked_ns), (MS + 3 * MS, 0, 4 * MS + 2 * MS));

        // Queued on CPU 0 but seen running on CPU 1 (moved unseen): running from the event.
        let mut a = analyzer(100 * MS);
        a.track(9, 0);
        a.on_event(&switch(MS, 1, 9, 1, 0));
        a.on_event(&wakeup(5 * MS, 9, 0));
        a.on_event(&pio(6 * MS, 1, 9));
        a.on_event(&switch(8 * MS, 1, 9, 1, 0));
        let t = a.finish(10 * MS).thread(9, None);
        assert_eq!((t.run_ns, t.wait_ns), (MS + 2 * MS, MS));

        // No wakeup seen either (this host's second CPU, CI): the CPU's last event since the
        // thread stopped (the idle task's interrupt, what woke it) bounds its start; its own
        // first event came a tick later (a 52 ms run was short by 4 ms).
        let mut a = analyzer(100 * MS);
        a.track(9, 0);
        a.on_event(&switch(MS, 1, 9, 1, 0));
        a.on_event(&Event { ts: 5 * MS, cpu: 1, tid: 0, kind: EventKind::IrqEntry { irq: 9 } });
        a.on_event(&Event { ts: 5 * MS + 10_000, cpu: 0, tid: 0, kind: EventKind::IrqEntry { irq: 9 } });
        a.on_event(&pio(9 * MS, 1, 9));
        a.on_event(&switch(12 * MS, 1, 9, 1, 0));
        let t = a.finish(20 * MS).thread(9, None);
        assert_eq!((t.run_ns, t.inferred_execs), (MS + 7 * MS, 1));

        // Preempted on CPU 1 (queued there), another task's event there at 4 ms: it waited
        // at least until then, though an idle CPU would have run it at once.
        let mut a = analyzer(100 * MS);
        a.track(9, 0);
        a.on_event(&switch(MS, 1, 9, 0, 20));
        a.on_event(&Event { ts: 4 * MS, cpu: 1, tid: 20, kind: EventKind::IrqEntry { irq: 9 } });
        a.on_event(&pio(6 * MS, 1, 9));
        let t = a.finish(10 * MS).thread(9, None);
        assert_eq!((t.run_ns, t.wait_ns, t.inferred_execs), (MS + 6 * MS, 3 * MS, 1));
    }

    #[test]
    fn where_windows_start_never_changes_an_inferred_switch_in() {
        // Asleep from 1 ms; an interrupt on its CPU at 5.5 ms, its own first event at 9 ms (no
        // switch-in seen), and the same unseen handover after a wakeup queued it on CPU 1.
        let events = [
            switch(MS, 1, 9, 1, 0),
            Event { ts: 5 * MS + MS / 2, cpu: 1, tid: 0, kind: EventKind::IrqEntry { irq: 9 } },
            pio(9 * MS, 1, 9),
            switch(12 * MS, 1, 9, 1, 0),
            wakeup(13 * MS + MS / 3, 9, 1),
            pio(17 * MS, 1, 9),
            switch(19 * MS, 1, 9, 1, 0),
        ];
        let whole = |width: u64| {
            let mut a = analyzer(width);
            a.record_slices();
            a.track(9, 0);
            events.iter().for_each(|e| a.on_event(e));
            let total = a.finish(20 * MS);
            let in_buckets = a.buckets().fold(Counters::default(), |mut sum, b| {
                sum.add(&b.thread(9, None));
                sum
            });
            let sliced: u64 =
                a.take_slices().iter().filter(|s| s.state == "running").map(|s| s.end_ns - s.start_ns).sum();
            let t = total.thread(9, None);
            assert_eq!((in_buckets.run_ns, sliced), (t.run_ns, t.run_ns), "{width} ns windows");
            (t.run_ns, t.wait_ns, t.blocked_ns)
        };
        let one_window = whole(100 * MS);
        assert_eq!(
            one_window,
            (MS + (12 * MS - 5 * MS - MS / 2) + (19 * MS - 13 * MS - MS / 3), 0, 20 * MS - one_window.0)
        );
        for width in [MS, 2 * MS, 3 * MS, 4 * MS, 7 * MS] {
            assert_eq!(whole(width), one_window, "{width} ns windows");
        }
    }

    #[test]
    fn exiting_threads_stop_accumulating() {
        let mut a = analyzer(10 * MS);
        a.track(5, 0);
        a.on_event(&switch(2 * MS, 0, 5, 0x10, 0));
        let t = a.finish(50 * MS).thread(5, None);
        assert_eq!(t.observed_ns(), 2 * MS);
    }
}
