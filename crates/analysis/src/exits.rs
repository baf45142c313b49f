//! Exit analysis: which VM exits happen, how long each takes, and why.
//!
//! Two paths, chosen by what the host emitted:
//! - **kvm_exit / kvm_entry** (VMX, SVM): each exit is paired with the next entry on the same
//!   thread. It is heavyweight if a `kvm_userspace_exit` lies between (the VMM handled it).
//!   Its duration splits into VMM time (userspace exit → next `kvm_fpu` load, else entry),
//!   time preempted (switched out runnable), time blocked (switched out sleeping) and
//!   hypervisor overhead (the rest). IRQs, softirqs and threads that ran on the exit's CPU
//!   meanwhile are counted (seed 004's `vm_noise`).
//! - **userspace round trips** (hosts without kvm_exit, e.g. PVM): each `kvm_userspace_exit`
//!   up to the next `kvm_fpu` load (or entry) on the thread is one heavyweight exit with a
//!   duration. Lightweight work is counted from the evidence events (`kvm_pio`, `kvm_mmio`,
//!   other kvm events) that no userspace exit followed; its durations are unavailable.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap as HashMap;

use serde::Serialize;
use virtprof_model::evidence::{Class, Figure, Holdings};
use virtprof_model::{Event, EventKind, HostKind, StrId};

use crate::hist::Histogram;
use crate::Names;

/// What to keep besides the per-reason tables.
#[derive(Debug, Clone, Default)]
pub struct ExitOptions {
    /// Keep per-exit rows (`--noise`).
    pub rows: bool,
    /// Keep only rows of exits longer than this (`--threshold-us`).
    pub min_row_ns: u64,
    /// Only these threads (vCPU threads of the selected VMs/vCPUs); empty = all.
    pub tids: Vec<u32>,
    /// Ids of other events that stand for one exit each (`kvm_cpuid`, `kvm_msr`, ...).
    pub evidence_events: Vec<u16>,
    /// The kind of host the trace comes from, if known. On VMX/SVM every exit is a
    /// `kvm_exit`, from the first event on (a userspace exit seen before any `kvm_exit`, such
    /// as QEMU's first `KVM_RUN` returning before the guest ran, is no exit); on PVM exits
    /// are timed by their userspace round trips. Unknown: whichever the trace shows.
    pub host: Option<HostKind>,
    /// What the source holds (a file made elsewhere with only some events enabled): the
    /// figures whose evidence it lacks are unknown, not zero.
    pub holdings: Holdings,
    /// Exits KVM counted over the source for the threads analysed (its stats fds), where
    /// known: on a host without kvm_exit, the lightweight ones are these less the userspace
    /// round trips (the evidence events show only some).
    pub kvm_exits: Option<u64>,
    /// Bin each reason's handling time (its vCPU's preemption and blocking left out) over
    /// time, at each exit's start (exits are short against the bins): what `explain --html`
    /// draws.
    pub timeline: Option<crate::bins::TimeBins>,
}

/// The key a reason is counted under, named at [`ExitAnalyzer::finish`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Key {
    /// A `kvm_exit` reason.
    Exit { reason: u32, isa: u32 },
    /// A `kvm_userspace_exit` reason (round-trip path).
    Userspace { reason: u32 },
    /// Lightweight evidence without a duration.
    Evidence(Evidence),
}

impl Key {
    /// Its name; an evidence row says "(in kernel)" only where the userspace exits were
    /// recorded (`split_known`): without them, one the VMM handled looks the same.
    fn name(self, names: &dyn Names, split_known: bool) -> String {
        let evidence = match self {
            Key::Exit { reason, isa } => return names.exit_reason(reason, isa),
            Key::Userspace { reason } => return names.userspace_reason(reason),
            Key::Evidence(Evidence::Emulated) => "emulated insn".to_string(),
            Key::Evidence(Evidence::Pio) => "pio".to_string(),
            Key::Evidence(Evidence::Mmio) => "mmio".to_string(),
            Key::Evidence(Evidence::Event(id)) => names.event(id),
        };
        if split_known {
            format!("{evidence} (in kernel)")
        } else {
            evidence
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Evidence {
    /// KVM's instruction emulator ran; refined by the evidence that follows for the same exit.
    Emulated,
    Pio,
    Mmio,
    Event(u16),
}

/// One exit being timed.
#[derive(Debug, Clone)]
struct InFlight {
    start: u64,
    cpu: u32,
    key: Key,
    /// On CPU in the VMM (userspace) since then.
    userspace_at: Option<u64>,
    /// In the VMM (between the userspace exit and the return to KVM), on CPU or not.
    in_vmm: bool,
    heavy: bool,
    vmm_ns: u64,
    preempted_ns: u64,
    blocked_ns: u64,
    irqs_at_start: u64,
    softirqs_at_start: u64,
    threads: Vec<StrId>,
}

impl InFlight {
    /// An exit starting at `e`, with the exit CPU's IRQ/softirq counters at that moment.
    fn starting(e: &Event, key: Key, irqs_at_start: u64, softirqs_at_start: u64) -> Self {
        InFlight {
            start: e.ts,
            cpu: e.cpu,
            key,
            userspace_at: None,
            in_vmm: false,
            heavy: false,
            vmm_ns: 0,
            preempted_ns: 0,
            blocked_ns: 0,
            irqs_at_start,
            softirqs_at_start,
            threads: Vec::new(),
        }
    }
}

#[derive(Debug, Default)]
struct Thread {
    exit: Option<InFlight>,
    /// Switched out at (ts, blocked?) while an exit was in flight.
    off_cpu: Option<(u64, bool)>,
    /// The last evidence event not yet known to be light or heavy.
    pending: Option<Evidence>,
    /// Its exits (lightweight, heavyweight, time in timed ones); None until it has one.
    exits: Option<(u64, u64, u64)>,
    /// Time in its timed exits by reason (halts are told apart by name when finished).
    time_by_key: Vec<(Key, u64)>,
    /// The vCPU index its last kvm_exit/kvm_entry carried.
    vcpu_id: Option<u32>,
}

impl Thread {
    fn exits(&mut self) -> &mut (u64, u64, u64) {
        self.exits.get_or_insert_default()
    }

    /// `ns` more of exits under `key`: a thread's exits share a few reasons, the last one
    /// mostly, so a short list searched from its most recent entry does.
    fn add_time(&mut self, key: Key, ns: u64) {
        match self.time_by_key.iter_mut().rev().find(|(k, _)| *k == key) {
            Some((_, sum)) => *sum += ns,
            None => self.time_by_key.push((key, ns)),
        }
    }
}

/// Values by key in the order first seen, with the last key looked up in each of `SLOTS`
/// cache slots ([`Cached::slot`]) kept at hand: nearly every event comes from one of a few
/// vCPU threads, and consecutive exits mostly share their reason, so most lookups hash
/// nothing.
#[derive(Debug)]
struct Table<K, V, const SLOTS: usize> {
    rows: Vec<(K, V)>,
    index: HashMap<K, usize>,
    cached: [Option<(K, usize)>; SLOTS],
}

/// A key of a [`Table`]: which cache slot it takes.
trait Cached: Copy + Eq + std::hash::Hash {
    fn slot(&self) -> usize;
}

impl Cached for u32 {
    /// A thread id: vCPU threads' ids are usually consecutive, so they take different slots.
    fn slot(&self) -> usize {
        *self as usize
    }
}

impl Cached for Key {
    fn slot(&self) -> usize {
        0
    }
}

/// Every thread's state by tid; 16 slots, more than the vCPU threads a host usually
/// interleaves in one trace.
type Threads = Table<u32, Thread, 16>;
/// The statistics of each reason; one slot, the last reason.
type StatsTable = Table<Key, Stats, 1>;

impl<K: Cached, V: Default, const SLOTS: usize> Default for Table<K, V, SLOTS> {
    fn default() -> Self {
        Table { rows: Vec::new(), index: HashMap::default(), cached: [None; SLOTS] }
    }
}

impl<K: Cached, V: Default, const SLOTS: usize> Table<K, V, SLOTS> {
    #[inline]
    fn position(&mut self, key: K) -> Option<usize> {
        let slot = key.slot() % SLOTS;
        if let Some((cached, i)) = self.cached[slot] {
            if cached == key {
                return Some(i);
            }
        }
        let i = *self.index.get(&key)?;
        self.cached[slot] = Some((key, i));
        Some(i)
    }

    #[inline]
    fn get_mut(&mut self, key: K) -> Option<&mut V> {
        let i = self.position(key)?;
        Some(&mut self.rows[i].1)
    }

    /// The key's value, new if it had none.
    #[inline]
    fn entry(&mut self, key: K) -> &mut V {
        let i = self.position(key).unwrap_or_else(|| {
            let i = self.rows.len();
            self.rows.push((key, V::default()));
            self.index.insert(key, i);
            self.cached[key.slot() % SLOTS] = Some((key, i));
            i
        });
        &mut self.rows[i].1
    }

    fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.rows.iter().map(|(k, v)| (k, v))
    }

    fn iter_mut(&mut self) -> impl Iterator<Item = (K, &mut V)> {
        self.rows.iter_mut().map(|(k, v)| (*k, v))
    }

    fn into_map(self) -> HashMap<K, V> {
        self.rows.into_iter().collect()
    }
}

#[derive(Debug, Default, Clone)]
struct Stats {
    hist: Histogram,
    light: u64,
    heavy: u64,
    descheduled: u64,
    preempted_ns: u64,
    blocked_ns: u64,
    vmm_ns: u64,
    evidence_only: u64,
    /// In flight at the end: counted, never timed.
    unfinished: u64,
}

#[derive(Debug, Default, Clone, Copy)]
struct CpuCounters {
    irqs: u64,
    softirqs: u64,
    /// The vCPU thread switched out of this CPU during an exit, whose interference we collect.
    watching: Option<u32>,
}

/// One per-exit row (`vm_noise`).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ExitRow {
    /// vCPU thread.
    pub tid: u32,
    /// Reason name.
    pub reason: String,
    /// CPU where the exit happened.
    pub exit_cpu: u32,
    /// Timestamp of the exit.
    pub exit_ts: u64,
    /// CPU of the next entry.
    pub entry_cpu: u32,
    /// Exit to entry.
    pub duration_ns: u64,
    /// The VMM handled it (None: the source did not record userspace exits).
    pub heavyweight: Option<bool>,
    /// Hypervisor overhead: duration minus VMM, preempted and blocked time (None where one
    /// of those is unknown).
    pub overhead_ns: Option<u64>,
    /// In the VMM (userspace).
    pub vmm_ns: Option<u64>,
    /// Switched out, runnable.
    pub preempted_ns: Option<u64>,
    /// Switched out, sleeping.
    pub blocked_ns: Option<u64>,
    /// IRQs on the exit CPU meanwhile (None: the source did not record them).
    pub irqs: Option<u64>,
    /// Softirqs on the exit CPU meanwhile (None: not recorded).
    pub softirqs: Option<u64>,
    /// Threads that ran on the exit CPU while the vCPU was off it (None: sched_switch not
    /// recorded).
    pub threads: Option<Vec<String>>,
    /// What the guest did just before (its own trace given beside the host's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guest_before: Option<crate::guest_before::GuestContext>,
}

/// Totals (`totals` in the JSON).
#[derive(Debug, Clone, Serialize, PartialEq, Default)]
pub struct Totals {
    /// Exits with a duration plus lightweight evidence events.
    pub exits: u64,
    /// Exits handled in the kernel (None: the source did not record userspace exits).
    pub lightweight: Option<u64>,
    /// Exits handled by the VMM.
    pub heavyweight: Option<u64>,
    /// Time in timed exits other than halts: the cost of handling exits (None: the source's
    /// timestamps are not time).
    pub handling_ns: Option<u64>,
    /// Time in halt exits (HLT, WFx): the guest idling, not a cost of virtualization.
    pub guest_idle_ns: Option<u64>,
    /// Of the halted time the kernel measured (`kvm_vcpu_wakeup`), the part spent
    /// halt-polling (None: not recorded).
    pub halt_poll_ns: Option<u64>,
    /// Halted time the kernel measured, polling and blocked (None: not recorded).
    pub halted_ns: Option<u64>,
    /// Events the kernel dropped (a recording's loss).
    pub lost_events: u64,
    /// Exits whose end or start was never seen (trace edges, losses).
    pub incomplete: u64,
}

/// One reason's row (`by_reason[]`). Duration fields are None where the host emits no timing.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ReasonRow {
    /// The kernel's name for the reason.
    pub reason: String,
    /// Number of exits.
    pub count: u64,
    /// Handled in the kernel (None: the source did not record userspace exits).
    pub lightweight: Option<u64>,
    /// Handled by the VMM.
    pub heavyweight: Option<u64>,
    /// Exits that were switched out at least once (None: no sched_switch recorded).
    pub descheduled: Option<u64>,
    /// Of `count`, exits still in flight when the trace ended (no duration); what tools that
    /// count only finished exits (`perf kvm stat`) leave out.
    pub unfinished: u64,
    /// A halt (HLT, WFx): the guest idling; its time is not exit-handling time.
    pub guest_idle: bool,
    /// Share of all exits, percent.
    pub count_pct: f64,
    /// Share of exit-handling time (halts excluded), percent; None for halts and untimed
    /// reasons.
    pub time_pct: Option<f64>,
    /// Sum of durations.
    pub total_ns: Option<u64>,
    /// Shortest.
    pub min_ns: Option<u64>,
    /// Mean.
    pub avg_ns: Option<u64>,
    /// Median.
    pub p50_ns: Option<u64>,
    /// 99th percentile.
    pub p99_ns: Option<u64>,
    /// Longest.
    pub max_ns: Option<u64>,
    /// Sum of VMM time.
    pub vmm_ns: Option<u64>,
    /// Sum of time preempted.
    pub preempted_ns: Option<u64>,
    /// Sum of time blocked.
    pub blocked_ns: Option<u64>,
    /// The durations (empty where the host emits no timing); kept out of `exits --json`,
    /// drawn by `report --html`.
    #[serde(skip)]
    pub histogram: Histogram,
}

/// One vCPU thread's totals (`by_vcpu[]`).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct VcpuRow {
    /// vCPU thread.
    pub tid: u32,
    /// The vCPU index its kvm_exit/kvm_entry events carry.
    pub vcpu_id: Option<u32>,
    /// Exits.
    pub exits: u64,
    /// Handled in the kernel (None: the source did not record userspace exits).
    pub lightweight: Option<u64>,
    /// Handled by the VMM.
    pub heavyweight: Option<u64>,
    /// Time in timed exits, the guest's idling in halts left out (as in `totals`; None: the
    /// source's timestamps are not time).
    pub total_ns: Option<u64>,
    /// Time in halt exits: the guest idling, not the host handling exits.
    pub guest_idle_ns: Option<u64>,
}

/// Which path produced the figures and what is missing (`source`).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Source {
    /// `kvm_exit` or `userspace_round_trips`.
    pub path: String,
    /// Events seen, by name, with counts.
    pub events: BTreeMap<String, u64>,
    /// Figures this trace cannot give, and why.
    pub unavailable: Vec<String>,
}

/// The analysis result.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ExitReport {
    /// What the host emitted and which path was used.
    pub source: Source,
    /// Totals.
    pub totals: Totals,
    /// Per reason, most frequent first.
    pub by_reason: Vec<ReasonRow>,
    /// Per vCPU thread.
    pub by_vcpu: Vec<VcpuRow>,
    /// Per-exit rows, when asked for.
    pub rows: Vec<ExitRow>,
    /// Per reason, its handling time over time (with `ExitOptions::timeline`; time known).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub timeline: Vec<ReasonTimeline>,
}

/// One reason's handling time over time.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReasonTimeline {
    /// The reason, as `by_reason` names it.
    pub reason: String,
    /// The guest idling (HLT, WFx): not handling.
    pub guest_idle: bool,
    /// The bins.
    pub bins: crate::bins::TimeBins,
}

/// An exit whose kvm_entry the trace does not hold (it ended first, it has a gap there, or the
/// thread's next kvm_exit came first): counted under its reason and its vCPU, never timed.
fn count_unfinished(stats: &mut StatsTable, thread: &mut Thread, x: &InFlight) {
    let s = stats.entry(x.key);
    s.unfinished += 1;
    let v = thread.exits();
    if x.heavy {
        s.heavy += 1;
        v.1 += 1;
    } else {
        s.light += 1;
        v.0 += 1;
    }
}

/// Push-fed exit analyzer.
#[derive(Debug, Default)]
pub struct ExitAnalyzer {
    options: ExitOptions,
    threads: Threads,
    cpus: Vec<CpuCounters>,
    stats: StatsTable,
    /// Halted time the kernel measured (`kvm_vcpu_wakeup`): (all, halt-polling only).
    halted_ns: (u64, u64),
    rows: Vec<(Key, RowDraft)>,
    seen: [u64; SEEN_NAMES.len()],
    seen_ids: HashMap<u16, u64>,
    /// Exits are timed from `kvm_exit` to `kvm_entry` (rather than by userspace round trips):
    /// the host kind says so, or a `kvm_exit` was seen.
    exit_path: bool,
    lost: u64,
    incomplete: u64,
    timeline: HashMap<Key, crate::bins::TimeBins>,
}

#[derive(Debug, Clone)]
struct RowDraft {
    tid: u32,
    exit: InFlight,
    entry_cpu: u32,
    duration: u64,
    irqs: u64,
    softirqs: u64,
}

/// The typed kvm events the analyzer counts for `source.events`, in [`SEEN_NAMES`] order.
#[derive(Debug, Clone, Copy)]
enum Seen {
    Exit,
    Entry,
    UserspaceExit,
    Fpu,
    Pio,
    Mmio,
    EmulateInsn,
}

const SEEN_NAMES: [&str; 7] =
    ["kvm_exit", "kvm_entry", "kvm_userspace_exit", "kvm_fpu", "kvm_pio", "kvm_mmio", "kvm_emulate_insn"];

impl ExitAnalyzer {
    /// A new analyzer.
    pub fn new(options: ExitOptions) -> Self {
        let exit_path = options.host.and_then(HostKind::traces_exits).unwrap_or(false);
        ExitAnalyzer { options, exit_path, ..Default::default() }
    }

    fn wanted(&self, tid: u32) -> bool {
        self.options.tids.is_empty() || self.options.tids.contains(&tid)
    }

    fn cpu(&mut self, cpu: u32) -> &mut CpuCounters {
        let i = cpu as usize;
        if self.cpus.len() <= i {
            self.cpus.resize(i + 1, CpuCounters::default());
        }
        &mut self.cpus[i]
    }

    fn count(&mut self, what: Seen) {
        self.seen[what as usize] += 1;
    }

    /// Each timed reason's durations so far (exits in flight are not in them yet): what a
    /// live exporter reads between events, without finishing.
    pub fn durations(&self, names: &dyn Names) -> Vec<(String, &Histogram)> {
        let split_known = self.options.holdings.knows(Figure::LightHeavySplit);
        let mut timed: Vec<(String, &Histogram)> = self
            .stats
            .iter()
            .filter(|(_, s)| s.hist.count() > 0)
            .map(|(&k, s)| (k.name(names, split_known), &s.hist))
            .collect();
        timed.sort_by(|a, b| a.0.cmp(&b.0));
        timed
    }

    /// Feed one event (events must arrive in timestamp order).
    pub fn on_event(&mut self, e: &Event) {
        match e.kind {
            EventKind::IrqEntry { .. } | EventKind::IrqVectorEntry { .. } => self.cpu(e.cpu).irqs += 1,
            EventKind::SoftirqEntry { .. } => self.cpu(e.cpu).softirqs += 1,
            EventKind::SchedSwitch { prev_tid, prev_state, next_tid, next_comm, .. } => {
                self.on_switch(e, prev_tid, prev_state, next_tid, next_comm)
            }
            EventKind::Lost { count } => {
                self.lost += count.unwrap_or(0);
                // Pairing across a gap would invent durations: what was in flight there is
                // counted, untimed.
                for (_, t) in self.threads.iter_mut() {
                    if let Some(x) = t.exit.take_if(|x| x.cpu == e.cpu) {
                        self.incomplete += 1;
                        count_unfinished(&mut self.stats, t, &x);
                    }
                }
            }
            _ if !self.wanted(e.tid) => {}
            EventKind::KvmExit { reason, isa, vcpu_id, .. } => {
                self.count(Seen::Exit);
                self.exit_path = true;
                let (irqs, softirqs) = self.cpus.get(e.cpu as usize).map_or((0, 0), |c| (c.irqs, c.softirqs));
                let thread = self.threads.entry(e.tid);
                thread.vcpu_id = Some(vcpu_id);
                // The previous exit's kvm_entry is not in the trace: it happened (the kernel's
                // count has it) but cannot be timed.
                if let Some(x) = thread.exit.take() {
                    self.incomplete += 1;
                    count_unfinished(&mut self.stats, thread, &x);
                }
                thread.pending = None;
                thread.exit = Some(InFlight::starting(e, Key::Exit { reason, isa }, irqs, softirqs));
            }
            EventKind::KvmUserspaceExit { reason, .. } => {
                self.count(Seen::UserspaceExit);
                let (irqs, softirqs) = self.cpus.get(e.cpu as usize).map_or((0, 0), |c| (c.irqs, c.softirqs));
                let exit_path = self.exit_path;
                let thread = self.threads.entry(e.tid);
                // The evidence right before a userspace exit is what the VMM handles.
                thread.pending = None;
                // A round trip still open: its end (kvm_fpu, kvm_entry) is not in the trace,
                // never fired or was not recorded. It happened; it is counted, untimed.
                if let Some(x) = thread.exit.take_if(|x| matches!(x.key, Key::Userspace { .. })) {
                    self.incomplete += 1;
                    count_unfinished(&mut self.stats, thread, &x);
                }
                match &mut thread.exit {
                    Some(x) => {
                        x.heavy = true;
                        x.in_vmm = true;
                        x.userspace_at = Some(e.ts);
                    }
                    None if !exit_path && !self.options.holdings.has(Class::RoundTripEnd) => {
                        let s = self.stats.entry(Key::Userspace { reason });
                        s.heavy += 1;
                        thread.exits().1 += 1;
                    }
                    None if !exit_path => {
                        let mut x = InFlight::starting(e, Key::Userspace { reason }, irqs, softirqs);
                        x.heavy = true;
                        x.in_vmm = true;
                        x.userspace_at = Some(e.ts);
                        thread.exit = Some(x);
                    }
                    None => {}
                }
            }
            EventKind::KvmFpu { load } => {
                self.count(Seen::Fpu);
                if load {
                    self.vmm_done(e);
                    let round_trip = self
                        .threads
                        .get_mut(e.tid)
                        .is_some_and(|t| matches!(t.exit, Some(InFlight { key: Key::Userspace { .. }, .. })));
                    if round_trip {
                        self.finish_exit(e);
                    }
                }
            }
            EventKind::KvmVcpuWakeup { ns, waited } => {
                self.halted_ns.0 = self.halted_ns.0.saturating_add(ns);
                if !waited {
                    self.halted_ns.1 = self.halted_ns.1.saturating_add(ns);
                }
            }
            EventKind::KvmEntry { vcpu_id, .. } => {
                // The thread's row, kept at hand in the table's cache for the calls below.
                self.threads.entry(e.tid).vcpu_id = Some(vcpu_id);
                self.count(Seen::Entry);
                self.vmm_done(e);
                self.settle_pending(e.tid);
                self.finish_exit(e);
            }
            EventKind::KvmPio { .. } => {
                self.count(Seen::Pio);
                self.evidence(e.tid, Evidence::Pio);
            }
            EventKind::KvmMmio { .. } => {
                self.count(Seen::Mmio);
                self.evidence(e.tid, Evidence::Mmio);
            }
            EventKind::KvmEmulateInsn { .. } => {
                self.count(Seen::EmulateInsn);
                self.evidence(e.tid, Evidence::Emulated);
            }
            EventKind::Other { event } if self.options.evidence_events.contains(&event) => {
                *self.seen_ids.entry(event).or_insert(0) += 1;
                self.evidence(e.tid, Evidence::Event(event));
            }
            _ => {}
        }
    }

    /// Evidence of KVM work on a thread: the previous pending one, not followed by a userspace
    /// exit, was lightweight.
    fn evidence(&mut self, tid: u32, what: Evidence) {
        let thread = self.threads.entry(tid);
        if thread.pending == Some(Evidence::Emulated) && what != Evidence::Emulated {
            // The emulated instruction was this PIO/MMIO/CPUID...: one exit, now named.
            thread.pending = Some(what);
            return;
        }
        if let Some(before) = thread.pending.replace(what) {
            settle(&mut self.stats, thread, before, self.exit_path);
        }
    }

    fn settle_pending(&mut self, tid: u32) {
        if let Some(thread) = self.threads.get_mut(tid) {
            if let Some(what) = thread.pending.take() {
                settle(&mut self.stats, thread, what, self.exit_path);
            }
        }
    }

    /// The VMM handed the exit back to KVM.
    fn vmm_done(&mut self, e: &Event) {
        if let Some(x) = self.threads.get_mut(e.tid).and_then(|t| t.exit.as_mut()) {
            if let Some(at) = x.userspace_at.take() {
                x.vmm_ns += e.ts.saturating_sub(at);
            }
            x.in_vmm = false;
        }
    }

    fn on_switch(&mut self, e: &Event, prev: u32, prev_state: u32, next: u32, next_comm: StrId) {
        if let Some(t) = self.threads.get_mut(prev).filter(|t| t.exit.is_some()) {
            // Low byte 0 is TASK_RUNNING (0x100 marks preemption on newer kernels): runnable.
            let blocked = prev_state & 0xff != 0;
            t.off_cpu = Some((e.ts, blocked));
            // Time off CPU is preempted or blocked time, never the VMM's: the parts of an
            // exit never overlap, so they add up to its duration.
            if let Some(x) = t.exit.as_mut() {
                if let Some(at) = x.userspace_at.take() {
                    x.vmm_ns += e.ts.saturating_sub(at);
                }
            }
            self.cpu(e.cpu).watching = Some(prev);
        }
        let watching = self.cpus.get(e.cpu as usize).and_then(|c| c.watching);
        if let Some(w) = watching.filter(|&w| w != next) {
            if let Some(x) = self.threads.get_mut(w).and_then(|t| t.exit.as_mut()) {
                if x.threads.len() < 4 && !x.threads.contains(&next_comm) && next != 0 {
                    x.threads.push(next_comm);
                }
            }
        }
        if let Some(t) = self.threads.get_mut(next) {
            if let Some((since, blocked)) = t.off_cpu.take() {
                if let Some(x) = t.exit.as_mut() {
                    let gap = e.ts.saturating_sub(since);
                    if blocked {
                        x.blocked_ns += gap;
                    } else {
                        x.preempted_ns += gap;
                    }
                    if x.in_vmm {
                        x.userspace_at = Some(e.ts);
                    }
                }
            }
            for c in &mut self.cpus {
                if c.watching == Some(next) {
                    c.watching = None;
                }
            }
        }
    }

    fn finish_exit(&mut self, e: &Event) {
        let Some(x) = self.threads.get_mut(e.tid).and_then(|t| t.exit.take()) else {
            return;
        };
        let duration = e.ts.saturating_sub(x.start);
        let s = self.stats.entry(x.key);
        s.hist.record(duration);
        if x.heavy {
            s.heavy += 1;
        } else {
            s.light += 1;
        }
        if x.preempted_ns + x.blocked_ns > 0 {
            s.descheduled += 1;
        }
        s.preempted_ns += x.preempted_ns;
        s.blocked_ns += x.blocked_ns;
        s.vmm_ns += x.vmm_ns;
        let thread = self.threads.entry(e.tid);
        thread.add_time(x.key, duration);
        let v = thread.exits();
        if x.heavy {
            v.1 += 1;
        } else {
            v.0 += 1;
        }
        v.2 += duration;
        if let Some(template) = &self.options.timeline {
            let bins = self.timeline.entry(x.key).or_insert_with(|| template.empty_like());
            bins.add_at(x.start, duration.saturating_sub(x.preempted_ns).saturating_sub(x.blocked_ns));
        }
        if self.options.rows && duration >= self.options.min_row_ns {
            let (irqs, softirqs) = self.cpus.get(x.cpu as usize).map_or((0, 0), |c| (c.irqs, c.softirqs));
            let (irqs, softirqs) = (irqs - x.irqs_at_start, softirqs - x.softirqs_at_start);
            self.rows.push((x.key, RowDraft { tid: e.tid, exit: x, entry_cpu: e.cpu, duration, irqs, softirqs }));
        }
    }

    /// Name everything and build the report.
    pub fn finish(mut self, names: &dyn Names) -> ExitReport {
        let tids: Vec<u32> = self.threads.iter().map(|(tid, _)| *tid).collect();
        for tid in tids {
            self.settle_pending(tid);
        }
        // Exits still in flight at the end of the trace (e.g. a final HLT the VMM never
        // re-entered) count under their reason, without a duration.
        for (_, t) in self.threads.iter_mut() {
            if let Some(x) = t.exit.take() {
                self.incomplete += 1;
                count_unfinished(&mut self.stats, t, &x);
            }
        }
        let holdings = &self.options.holdings;
        // Light or heavy needs the userspace exits on either path (without them, an exit or
        // evidence event the VMM handled looks handled in the kernel).
        let split_known = holdings.knows(Figure::LightHeavySplit);
        let name = |k: Key| k.name(names, split_known);
        let mut stats = std::mem::take(&mut self.stats).into_map();
        // Evidence rows only exist on the round-trip path; drop any from before a late kvm_exit.
        let exit_path = self.exit_path;
        if exit_path {
            stats.retain(|k, _| !matches!(k, Key::Evidence(_)));
        }
        let sched_known = holdings.knows(Figure::Descheduled);
        let vmm_known = holdings.knows(Figure::VmmTime);
        let time_known = holdings.has(Class::Time);
        let (irqs_known, softirqs_known, threads_known) = (
            holdings.knows(Figure::IrqsDuringExit),
            holdings.knows(Figure::SoftirqsDuringExit),
            holdings.knows(Figure::ThreadsDuringExit),
        );
        let known = |v: u64| split_known.then_some(v);
        let idle: HashMap<Key, bool> = stats.keys().map(|&k| (k, is_halt(&name(k)))).collect();
        let total_count: u64 = stats.values().map(|s| s.light + s.heavy).sum();
        let handling_ns: u64 = stats.iter().filter(|(k, _)| !idle[k]).map(|(_, s)| s.hist.sum()).sum();
        let guest_idle_ns: u64 = stats.iter().filter(|(k, _)| idle[k]).map(|(_, s)| s.hist.sum()).sum();
        let mut by_reason: Vec<ReasonRow> = stats
            .iter()
            .map(|(&k, s)| {
                let count = s.light + s.heavy;
                let timed = s.hist.count() > 0 && time_known;
                let t = |v: Option<u64>| if timed { v } else { None };
                ReasonRow {
                    reason: name(k),
                    count,
                    lightweight: known(s.light),
                    heavyweight: known(s.heavy),
                    // Descheduled during an exit: only of exits whose span is known.
                    descheduled: (sched_known && timed).then_some(s.descheduled),
                    unfinished: s.unfinished,
                    guest_idle: idle[&k],
                    count_pct: pct(count, total_count),
                    time_pct: (timed && !idle[&k]).then(|| pct(s.hist.sum(), handling_ns)),
                    total_ns: t(Some(s.hist.sum())),
                    min_ns: t(s.hist.min()),
                    avg_ns: t(s.hist.mean()),
                    p50_ns: t(s.hist.quantile(0.5)),
                    p99_ns: t(s.hist.quantile(0.99)),
                    max_ns: t(s.hist.max()),
                    vmm_ns: t(Some(s.vmm_ns)).filter(|_| vmm_known),
                    preempted_ns: t(Some(s.preempted_ns)).filter(|_| sched_known),
                    blocked_ns: t(Some(s.blocked_ns)).filter(|_| sched_known),
                    histogram: s.hist.clone(),
                }
            })
            .collect();
        by_reason.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.reason.cmp(&b.reason)));
        let wakeups = holdings.knows(Figure::HaltPolling);
        let time = |ns: u64| time_known.then_some(ns);
        let heavyweight: u64 = stats.values().map(|s| s.heavy).sum();
        // Without kvm_exit, evidence events show only some lightweight exits: KVM's own count
        // gives them all, or they are unknown.
        let lightweight = if exit_path {
            known(stats.values().map(|s| s.light).sum())
        } else {
            self.options
                .kvm_exits
                .filter(|_| holdings.knows(Figure::LightweightWithoutExitEvents))
                .map(|kvm| kvm.saturating_sub(heavyweight))
        };
        let any_timed = total_count == 0 || stats.values().any(|s| s.hist.count() > 0);
        // Userspace exits whose round trips never ended in the trace (none of their end events
        // fired, as on a perf.data of kvm_userspace_exit and a kvm_entry PVM never emits).
        let round_trips_unended = stats.iter().any(|(k, s)| matches!(k, Key::Userspace { .. }) && s.heavy > 0)
            && !stats.iter().any(|(k, s)| matches!(k, Key::Userspace { .. }) && s.hist.count() > 0);
        let totals = Totals {
            exits: total_count,
            lightweight,
            heavyweight: known(heavyweight),
            // Sums of the timed exits: none timed (evidence without its round trip), unknown.
            handling_ns: time(handling_ns).filter(|_| any_timed),
            guest_idle_ns: time(guest_idle_ns).filter(|_| any_timed),
            halt_poll_ns: wakeups.then_some(self.halted_ns.1),
            halted_ns: wakeups.then_some(self.halted_ns.0),
            lost_events: self.lost,
            incomplete: self.incomplete,
        };
        let mut halts: HashMap<Key, bool> = HashMap::default();
        let mut per_vcpu: Vec<_> = self
            .threads
            .iter()
            .filter_map(|(tid, t)| {
                let idle: u64 = t
                    .time_by_key
                    .iter()
                    .filter(|(k, _)| *halts.entry(*k).or_insert_with(|| is_halt(&name(*k))))
                    .map(|(_, ns)| ns)
                    .sum();
                Some((*tid, t.vcpu_id, t.exits?, idle, !t.time_by_key.is_empty()))
            })
            .collect();
        per_vcpu.sort_unstable();
        let by_vcpu = per_vcpu
            .into_iter()
            .map(|(tid, vcpu_id, (light, heavy, total_ns), idle_ns, timed)| VcpuRow {
                tid,
                vcpu_id,
                exits: light + heavy,
                // Per thread, KVM's count is not at hand: without kvm_exit, unknown.
                lightweight: known(light).filter(|_| exit_path),
                heavyweight: known(heavy),
                total_ns: time(total_ns - idle_ns).filter(|_| timed || light + heavy == 0),
                guest_idle_ns: time(idle_ns).filter(|_| timed || light + heavy == 0),
            })
            .collect();
        // Rows are exits over a duration: with timestamps that are not time, none.
        let rows = self
            .rows
            .into_iter()
            .filter(|_| time_known)
            .map(|(k, r)| {
                let x = &r.exit;
                let (vmm, sched) = (vmm_known.then_some(x.vmm_ns), sched_known.then_some(()));
                ExitRow {
                    tid: r.tid,
                    reason: name(k),
                    exit_cpu: x.cpu,
                    exit_ts: x.start,
                    entry_cpu: r.entry_cpu,
                    duration_ns: r.duration,
                    heavyweight: split_known.then_some(x.heavy),
                    overhead_ns: vmm
                        .zip(sched)
                        .map(|(vmm, ())| r.duration.saturating_sub(vmm + x.preempted_ns + x.blocked_ns)),
                    vmm_ns: vmm,
                    preempted_ns: sched.map(|()| x.preempted_ns),
                    blocked_ns: sched.map(|()| x.blocked_ns),
                    irqs: irqs_known.then_some(r.irqs),
                    softirqs: softirqs_known.then_some(r.softirqs),
                    threads: threads_known.then(|| x.threads.iter().map(|&s| names.task(s)).collect()),
                    guest_before: None,
                }
            })
            .collect();
        let events = SEEN_NAMES
            .iter()
            .zip(self.seen)
            .filter(|&(_, n)| n > 0)
            .map(|(name, n)| (name.to_string(), n))
            .chain(self.seen_ids.iter().map(|(id, n)| (names.event(*id), *n)))
            .collect();
        let rows_figures: &[Figure] = if self.options.rows {
            &[Figure::IrqsDuringExit, Figure::SoftirqsDuringExit, Figure::ThreadsDuringExit]
        } else {
            &[]
        };
        let rows_figures: Vec<Figure> =
            rows_figures.iter().copied().chain((!time_known).then_some(Figure::ExitDurations)).collect();
        let rows_figures = rows_figures.as_slice();
        let (path, unavailable) = if exit_path {
            let figures = [Figure::LightHeavySplit, Figure::VmmTime, Figure::Descheduled, Figure::HaltPolling];
            let missing = holdings.unavailable(&figures).into_iter().chain(holdings.unavailable(rows_figures));
            ("kvm_exit".to_string(), missing.map(|u| u.to_string()).collect())
        } else {
            let lightweight = match holdings.check(Figure::ExitDurations) {
                Err(u) => u.to_string(),
                // Recorded, yet none fired: a host that does not trace its exits.
                Ok(()) => format!(
                    "{}: kvm_exit and kvm_entry were recorded but none fired (a host whose exits KVM does not trace, such as PVM)",
                    Figure::ExitDurations.label()
                ),
            };
            let figures = [
                Figure::LightHeavySplit,
                Figure::RoundTripDurations,
                Figure::VmmTime,
                Figure::Descheduled,
                Figure::HaltPolling,
            ];
            let light_count = match holdings.check(Figure::LightweightWithoutExitEvents) {
                Err(u) => Some(u.to_string()),
                Ok(()) if self.options.kvm_exits.is_none() => Some(format!(
                    "{}: a VM's KVM stats lack a snapshot at the start or the end (or only some threads were analysed)",
                    Figure::LightweightWithoutExitEvents.label()
                )),
                Ok(()) => None,
            };
            let unended = (round_trips_unended && holdings.knows(Figure::RoundTripDurations)).then(|| {
                format!(
                    "{}: no userspace exit was followed by its end (kvm_fpu or kvm_entry) in the trace",
                    Figure::RoundTripDurations.label()
                )
            });
            let missing = std::iter::once(lightweight)
                .chain(light_count)
                .chain(unended)
                .chain(
                    holdings
                        .unavailable(&figures)
                        .into_iter()
                        .chain(holdings.unavailable(rows_figures))
                        .map(|u| u.to_string()),
                )
                .chain(std::iter::once(
                    "hardware exit reasons: only KVM_EXIT_* reasons of userspace exits and evidence events".to_string(),
                ));
            ("userspace_round_trips".to_string(), missing.collect())
        };
        let mut timeline: Vec<ReasonTimeline> = std::mem::take(&mut self.timeline)
            .into_iter()
            .filter(|_| time_known)
            .map(|(k, bins)| ReasonTimeline {
                reason: name(k),
                guest_idle: idle.get(&k).copied().unwrap_or(false),
                bins,
            })
            .collect();
        timeline.sort_by(|a, b| a.reason.cmp(&b.reason));
        ExitReport { source: Source { path, events, unavailable }, totals, by_reason, by_vcpu, rows, timeline }
    }
}

/// Evidence `what` of `thread` was followed by no userspace exit: a lightweight exit (counted
/// only on the round-trip path; with kvm_exit the exits themselves are counted).
fn settle(stats: &mut StatsTable, thread: &mut Thread, what: Evidence, exit_path: bool) {
    if !exit_path {
        let s = stats.entry(Key::Evidence(what));
        s.light += 1;
        s.evidence_only += 1;
        thread.exits().0 += 1;
    }
}

/// True for a reason that is the guest halting (x86 HLT; arm64 WFI/WFE, WFx): time the
/// guest chose to idle, which is no cost of handling the exit.
pub fn is_halt(reason: &str) -> bool {
    let r = reason.to_ascii_lowercase();
    r == "hlt" || r.starts_with("wfx") || r.starts_with("wfi") || r.starts_with("wfe") || r == "kvm_exit_hlt"
}

fn pct(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        (part as f64 * 10_000.0 / whole as f64).round() / 100.0
    }
}

impl crate::Analyzer for ExitAnalyzer {
    fn on_event(&mut self, event: &Event, _: &dyn Names) {
        ExitAnalyzer::on_event(self, event);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::TestNames;

    fn ev(ts: u64, cpu: u32, tid: u32, kind: EventKind) -> Event {
        Event { ts, cpu, tid, kind }
    }

    fn exit(ts: u64, tid: u32, reason: u32) -> Event {
        ev(ts, 0, tid, EventKind::KvmExit { reason, isa: 2, guest_rip: 0, vcpu_id: 0 })
    }

    fn entry(ts: u64, tid: u32) -> Event {
        ev(ts, 0, tid, EventKind::KvmEntry { vcpu_id: 0, rip: 0 })
    }

    #[test]
    fn pairs_exits_and_splits_heavyweight_time() {
        let mut a = ExitAnalyzer::new(ExitOptions { rows: true, ..Default::default() });
        let events = [
            exit(100, 7, 1),
            entry(150, 7),
            exit(200, 7, 2),
            ev(210, 0, 7, EventKind::KvmUserspaceExit { reason: 2, errno: 0 }),
            ev(260, 0, 7, EventKind::KvmFpu { load: true }),
            entry(300, 7),
            exit(400, 7, 1),
            ev(
                410,
                0,
                7,
                EventKind::SchedSwitch {
                    prev_tid: 7,
                    prev_state: 0,
                    prev_comm: StrId(0),
                    next_tid: 9,
                    next_comm: StrId(5),
                },
            ),
            ev(415, 0, 9, EventKind::IrqEntry { irq: 3 }),
            ev(
                450,
                0,
                9,
                EventKind::SchedSwitch {
                    prev_tid: 9,
                    prev_state: 1,
                    prev_comm: StrId(5),
                    next_tid: 7,
                    next_comm: StrId(0),
                },
            ),
            entry(470, 7),
        ];
        events.iter().for_each(|e| a.on_event(e));
        let r = a.finish(&TestNames);
        assert_eq!(r.source.path, "kvm_exit");
        assert_eq!(
            (r.totals.exits, r.totals.lightweight, r.totals.heavyweight, r.totals.incomplete),
            (3, Some(2), Some(1), 0)
        );
        let r1 = r.by_reason.iter().find(|x| x.reason == "r1").unwrap();
        assert_eq!(
            (r1.count, r1.min_ns, r1.max_ns, r1.total_ns, r1.descheduled),
            (2, Some(50), Some(70), Some(120), Some(1))
        );
        assert_eq!(r1.preempted_ns, Some(40));
        let r2 = r.by_reason.iter().find(|x| x.reason == "r2").unwrap();
        assert_eq!((r2.heavyweight, r2.vmm_ns, r2.total_ns), (Some(1), Some(50), Some(100)));
        let preempted = r.rows.iter().find(|x| x.exit_ts == 400).unwrap();
        assert_eq!(
            (preempted.overhead_ns, preempted.irqs, preempted.threads.clone()),
            (Some(30), Some(1), Some(vec!["task5".to_string()]))
        );
        assert_eq!(
            r.by_vcpu,
            vec![VcpuRow {
                tid: 7,
                vcpu_id: Some(0),
                exits: 3,
                lightweight: Some(2),
                heavyweight: Some(1),
                total_ns: Some(220),
                guest_idle_ns: Some(0),
            }]
        );
    }

    #[test]
    fn round_trips_and_evidence_without_kvm_exit() {
        let mut a = ExitAnalyzer::new(ExitOptions { evidence_events: vec![33], ..Default::default() });
        let pio = |ts| ev(ts, 1, 5, EventKind::KvmPio { write: true, port: 0xe0, size: 1, count: 1 });
        let events = [
            pio(10), // in kernel: followed by more evidence, no userspace exit
            pio(20),
            ev(21, 1, 5, EventKind::KvmFpu { load: false }),
            ev(22, 1, 5, EventKind::KvmUserspaceExit { reason: 2, errno: 0 }),
            ev(90, 1, 5, EventKind::KvmFpu { load: true }),
            ev(93, 1, 5, EventKind::KvmEmulateInsn { rip: 0, failed: false }),
            ev(95, 1, 5, EventKind::Other { event: 33 }), // refines the emulated insn: one exit
            ev(96, 1, 5, EventKind::Other { event: 34 }), // not exit evidence: ignored
            ev(99, 1, 5, EventKind::Lost { count: Some(4) }),
        ];
        events.iter().for_each(|e| a.on_event(e));
        let r = a.finish(&TestNames);
        assert_eq!(r.source.path, "userspace_round_trips");
        assert!(!r.source.unavailable.is_empty());
        // Evidence events show only some lightweight exits: without KVM's count, unknown.
        assert_eq!((r.totals.heavyweight, r.totals.lightweight, r.totals.lost_events), (Some(1), None, 4));
        assert!(r.source.unavailable.iter().any(|u| u.starts_with("lightweight exits (KVM's count")), "{:?}", r.source);
        let heavy = r.by_reason.iter().find(|x| x.reason == "KVM_EXIT_2").unwrap();
        assert_eq!((heavy.count, heavy.total_ns, heavy.vmm_ns), (1, Some(68), Some(68)));
        let light = r.by_reason.iter().find(|x| x.reason == "pio (in kernel)").unwrap();
        assert_eq!((light.count, light.total_ns, light.lightweight), (1, None, Some(1)));
        assert!(r.by_reason.iter().any(|x| x.reason == "event33 (in kernel)"));
        // With KVM's count of the run's exits (its stats fds), the lightweight ones are known.
        let mut a =
            ExitAnalyzer::new(ExitOptions { evidence_events: vec![33], kvm_exits: Some(10), ..Default::default() });
        events.iter().for_each(|e| a.on_event(e));
        let r = a.finish(&TestNames);
        assert_eq!((r.totals.heavyweight, r.totals.lightweight), (Some(1), Some(9)));
    }

    fn switch(ts: u64, prev: u32, prev_state: u32, next: u32) -> Event {
        let kind = EventKind::SchedSwitch {
            prev_tid: prev,
            prev_state,
            prev_comm: StrId(0),
            next_tid: next,
            next_comm: StrId(1),
        };
        ev(ts, 0, prev, kind)
    }

    #[test]
    fn on_svm_a_userspace_exit_before_any_kvm_exit_is_no_exit() {
        // QEMU's first KVM_RUN returns before the guest ever ran: no kvm_exit precedes it.
        let events = [
            ev(10, 0, 7, EventKind::KvmUserspaceExit { reason: 0, errno: 0 }),
            ev(20, 0, 7, EventKind::KvmFpu { load: true }),
            exit(100, 7, 1),
            entry(150, 7),
        ];
        let run = |host| {
            let mut a = ExitAnalyzer::new(ExitOptions { host, ..Default::default() });
            events.iter().for_each(|e| a.on_event(e));
            a.finish(&TestNames)
        };
        let svm = run(Some(HostKind::Svm));
        assert_eq!((svm.totals.exits, svm.totals.heavyweight), (1, Some(0)), "{:?}", svm.by_reason);
        assert_eq!(svm.source.path, "kvm_exit");
        // Without the host kind the trace decides, as before (the first event is all it has).
        assert_eq!(run(None).totals.exits, 2);
    }

    #[test]
    fn an_exits_parts_never_overlap() {
        // A heavyweight exit whose VMM sleeps (io-bound): 100..1100, in the VMM from 200, off
        // CPU blocked 300..900, back in KVM at 1000.
        let mut a = ExitAnalyzer::new(ExitOptions { rows: true, host: Some(HostKind::Svm), ..Default::default() });
        let events = [
            exit(100, 7, 1),
            ev(200, 0, 7, EventKind::KvmUserspaceExit { reason: 2, errno: 0 }),
            switch(300, 7, 1, 0),
            switch(900, 0, 0, 7),
            ev(1000, 0, 7, EventKind::KvmFpu { load: true }),
            entry(1100, 7),
        ];
        events.iter().for_each(|e| a.on_event(e));
        let r = a.finish(&TestNames);
        let row = &r.rows[0];
        assert_eq!(
            (row.duration_ns, row.vmm_ns, row.blocked_ns, row.preempted_ns),
            (1000, Some(200), Some(600), Some(0))
        );
        let parts = [row.overhead_ns, row.vmm_ns, row.blocked_ns, row.preempted_ns];
        assert_eq!(parts.iter().map(|p| p.unwrap()).sum::<u64>(), row.duration_ns);
        let reason = &r.by_reason[0];
        assert_eq!((reason.vmm_ns, reason.blocked_ns), (Some(200), Some(600)));
    }

    #[test]
    fn every_kvm_exit_counts_under_its_reason_even_without_its_entry() {
        // Seen on kvm_amd: a kvm_exit whose kvm_entry the trace lacks was dropped from the
        // per-reason counts, one short of the kernel's hist trigger.
        let mut a = ExitAnalyzer::new(ExitOptions { host: Some(HostKind::Svm), ..Default::default() });
        let gap = ev(400, 0, 0, EventKind::Lost { count: Some(3) });
        [exit(100, 7, 1), exit(200, 7, 3), entry(250, 7), exit(300, 7, 5), gap, entry(500, 7)]
            .iter()
            .for_each(|e| a.on_event(e));
        let r = a.finish(&TestNames);
        let counts: Vec<u64> = r.by_reason.iter().map(|row| row.count).collect();
        assert_eq!(counts, [1, 1, 1], "{:?}", r.by_reason);
        assert_eq!((r.totals.exits, r.totals.incomplete), (3, 2));
        assert_eq!(r.by_vcpu.iter().map(|v| v.exits).sum::<u64>(), 3);
        assert_eq!(r.rows.len(), 0, "only the paired exit is timed, and rows were not asked for");
    }

    #[test]
    fn per_vcpu_counts_include_exits_still_in_flight() {
        let mut a = ExitAnalyzer::new(ExitOptions { host: Some(HostKind::Svm), ..Default::default() });
        [exit(100, 7, 1), entry(150, 7), exit(200, 7, 3)].iter().for_each(|e| a.on_event(e));
        let r = a.finish(&TestNames);
        assert_eq!((r.totals.exits, r.totals.incomplete), (2, 1));
        assert_eq!(r.by_vcpu.iter().map(|v| v.exits).sum::<u64>(), r.totals.exits);
    }

    #[test]
    fn a_quiet_trace_says_why_it_has_no_exit_durations() {
        let quiet = |host, holdings| {
            let a = ExitAnalyzer::new(ExitOptions { host, holdings, ..Default::default() });
            let r = a.finish(&TestNames);
            (r.source.path, r.source.unavailable.join("; "))
        };
        assert_eq!(quiet(Some(HostKind::Svm), Holdings::all()), ("kvm_exit".to_string(), String::new()));
        let pvm = Holdings::all().never_emitted(Class::ExitEntry);
        assert!(quiet(Some(HostKind::Pvm), pvm).1.contains("this host never emits kvm_exit"));
        assert!(quiet(None, Holdings::all()).1.contains("kvm_exit and kvm_entry were recorded but none fired"));
        let unrecorded = Holdings::of(|_, e| e != "kvm_exit", true, None);
        assert!(quiet(None, unrecorded).1.contains("kvm_exit and kvm_entry were not recorded"));
    }

    /// A VMX capture made elsewhere with only kvm_exit/kvm_entry: which exits went to the VMM,
    /// and what was preempted or blocked, is unknown, never zero; the halt's time is the
    /// guest idling, apart from the handling time.
    #[test]
    fn what_a_source_did_not_record_is_unknown_and_halts_are_idle() {
        struct Vmx;
        impl Names for Vmx {
            fn exit_reason(&self, reason: u32, _isa: u32) -> String {
                if reason == 12 { "HLT" } else { "CPUID" }.to_string()
            }
            fn userspace_reason(&self, r: u32) -> String {
                format!("u{r}")
            }
            fn event(&self, id: u16) -> String {
                format!("e{id}")
            }
            fn task(&self, _: StrId) -> String {
                String::new()
            }
        }
        let recorded = ["kvm_exit", "kvm_entry", "kvm_vcpu_wakeup", "irq_handler_entry", "softirq_entry"];
        let holdings = Holdings::of(|_, e| recorded.contains(&e), false, None);
        let mut a = ExitAnalyzer::new(ExitOptions { rows: true, holdings, ..Default::default() });
        let events = [
            exit(100, 7, 10),
            entry(110, 7),
            exit(200, 7, 12),
            ev(5_150, 0, 7, EventKind::KvmVcpuWakeup { ns: 4_900, waited: true }),
            entry(5_200, 7),
            exit(6_000, 7, 12),
            ev(6_040, 0, 7, EventKind::KvmVcpuWakeup { ns: 30, waited: false }),
            entry(6_050, 7),
        ];
        events.iter().for_each(|e| a.on_event(e));
        let r = a.finish(&Vmx);
        assert_eq!((r.totals.exits, r.totals.lightweight, r.totals.heavyweight), (3, None, None));
        assert_eq!((r.totals.handling_ns, r.totals.guest_idle_ns), (Some(10), Some(5_050)));
        assert_eq!((r.totals.halted_ns, r.totals.halt_poll_ns), (Some(4_930), Some(30)));
        let hlt = r.by_reason.iter().find(|x| x.reason == "HLT").unwrap();
        assert!(hlt.guest_idle && hlt.time_pct.is_none() && hlt.lightweight.is_none() && hlt.descheduled.is_none());
        let cpuid = r.by_reason.iter().find(|x| x.reason == "CPUID").unwrap();
        assert_eq!((cpuid.time_pct, cpuid.preempted_ns, cpuid.vmm_ns), (Some(100.0), None, None));
        assert!(r.rows.iter().all(|x| x.heavyweight.is_none() && x.overhead_ns.is_none()));
        let missing = r.source.unavailable.join("; ");
        assert!(
            missing.contains("kvm_userspace_exit was not recorded") && missing.contains("sched_switch"),
            "{missing}"
        );
        let json = serde_json::to_value(&r.totals).unwrap();
        assert!(json["lightweight"].is_null() && json["heavyweight"].is_null(), "{json}");
    }
}
