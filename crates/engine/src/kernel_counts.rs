//! Exits and scheduling aggregated in the kernel: an eBPF program on the kvm and sched
//! tracepoints (source and build in `crates/engine/bpf/`) keeps, per vCPU thread, exits by
//! reason and time per scheduling state, so a live view reads a few hundred map entries per
//! refresh instead of decoding every event in user space. It counts what the traced path's
//! [`SchedAccounting`] counts from the same events, under the same keys.
//!
//! [`SchedAccounting`]: virtprof_analysis::sched::SchedAccounting

use std::path::Path;

use aya::maps::{Array, HashMap as BpfHashMap, MapData, PerCpuArray};
use aya::programs::{RawTracePoint, TracePoint};
use aya::{Ebpf, EbpfLoader, Pod};
use virtprof_analysis::hist::Histogram;
use virtprof_analysis::sched::{Counters, ReasonKey};
use virtprof_trace::format::{parse_event_format, EventFormat};

/// The compiled program (`scripts/bpf/build.sh`; a test checks it matches its source).
static OBJECT: &[u8] = aya::include_bytes_aligned!("../bpf/aggregate.bpf.o");

/// The exits map's key, as `struct exit_key` in aggregate.bpf.c.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct RawKey {
    tid: u32,
    kind: u32,
    reason: u32,
    isa: u32,
}

// SAFETY: four u32s, no padding, every bit pattern valid: what `Pod` asks.
unsafe impl Pod for RawKey {}

/// The threads map's value, as `struct thread` in aggregate.bpf.c.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct RawThread {
    since: u64,
    entered: u64,
    queued: u64,
    exec_start: u64,
    run_ns: u64,
    wait_ns: u64,
    blocked_ns: u64,
    unknown_ns: u64,
    execs: u64,
    inferred_execs: u64,
    preemptions: u64,
    alloc_sum_ns: u64,
    alloc_min_ns: u64,
    alloc_max_ns: u64,
    wait_max_ns: u64,
    wakeups: u64,
    io: u64,
    state: u32,
    cpu: u32,
    runs_guest: u32,
    generation: u32,
    exit_start: u64,
    exit_kind: u32,
    exit_reason: u32,
    exit_isa: u32,
    exit_open: u32,
}

// SAFETY: u64s, four u32s, a u64, four u32s: no padding, every bit pattern valid.
unsafe impl Pod for RawThread {}

/// The exit log's entry, as `struct exit_time`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct RawExitTime {
    tid: u32,
    kind: u32,
    reason: u32,
    isa: u32,
    start: u64,
    end: u64,
}

// SAFETY: four u32s, two u64s: no padding, every bit pattern valid.
unsafe impl Pod for RawExitTime {}

/// One timed exit as the program read the clock at its two ends (CLOCK_MONOTONIC ns).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoggedExit {
    /// The vCPU thread.
    pub tid: u32,
    /// Its reason, as the exits map keys it.
    pub reason: ReasonKey,
    /// The program's clock read at the exit's start and at its end.
    pub start_ns: u64,
    pub end_ns: u64,
}

/// The exits the program logged, in the order they ended, and how many it was offered (more
/// than it holds: the rest were dropped).
#[derive(Debug, Clone, Default)]
pub struct ExitLog {
    /// The exits held, in the order they ended.
    pub exits: Vec<LoggedExit>,
    /// The exits offered to the log, held or not.
    pub offered: u64,
}

/// Who took a CPU from a waiting vCPU thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Taker {
    /// A process, by tgid (0: the idle task, so nothing ran: a CPU limit held the thread back).
    Process(u32),
    /// The processes past the first [`BY_SLOTS`] that took a CPU from the thread, summed.
    Others,
}

/// Processes (by tgid) that named slots hold per vCPU thread, as `BY_SLOTS`.
const BY_SLOTS: usize = 16;

/// The waits_by map's value, as `struct waits`: who took the CPU from one vCPU thread while it
/// waited, the first [`BY_SLOTS`] processes by name and the later ones summed.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct RawWaits {
    by: [u32; BY_SLOTS],
    ns: [u64; BY_SLOTS],
    others_ns: u64,
}

// SAFETY: sixteen u32s (64 bytes, so the u64s that follow are aligned), seventeen u64s: no
// padding, every bit pattern valid.
unsafe impl Pod for RawWaits {}

/// The timings map's key, as `struct timing_key`: a reason and a bucket (`SUMMARY`: none).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct RawTimingKey {
    kind: u32,
    reason: u32,
    isa: u32,
    bucket: u32,
}

// SAFETY: four u32s, no padding, every bit pattern valid.
unsafe impl Pod for RawTimingKey {}

/// The timings map's value, as `struct timing`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct RawTiming {
    count: u64,
    sum: u64,
    min: u64,
    max: u64,
}

// SAFETY: four u64s, no padding, every bit pattern valid.
unsafe impl Pod for RawTiming {}

/// A reason's entries in the timings map: (bucket, count) pairs and its summary.
type TimingParts = (Vec<(usize, u64)>, Option<RawTiming>);

/// The bucket of a reason's summary entry (count, sum, min, max).
const SUMMARY: u32 = u32::MAX;

/// `bpf_map_update_elem`'s flag: only if the key is absent (linux/bpf.h).
const BPF_NOEXIST: u64 = 1;

const KIND_EXIT: u32 = 1;
const KIND_USERSPACE: u32 = 2;
const KIND_EVIDENCE: u32 = 3;

/// A thread's scheduling state, as the program keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThreadState {
    /// Not known yet (added from /proc before its first event).
    Unknown,
    /// On a CPU.
    Running,
    /// Waiting for a CPU.
    Runnable,
    /// Sleeping.
    Blocked,
    /// Gone.
    Exited,
}

impl ThreadState {
    fn from_raw(state: u32) -> ThreadState {
        match state {
            1 => ThreadState::Running,
            2 => ThreadState::Runnable,
            3 => ThreadState::Blocked,
            4 => ThreadState::Exited,
            _ => ThreadState::Unknown,
        }
    }

    fn raw(self) -> u32 {
        match self {
            ThreadState::Unknown => 0,
            ThreadState::Running => 1,
            ThreadState::Runnable => 2,
            ThreadState::Blocked => 3,
            ThreadState::Exited => 4,
        }
    }
}

/// One thread as the program has accounted it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThreadTotals {
    /// Its state now, since `since_ns`.
    pub state: ThreadState,
    /// Accounted up to here (CLOCK_MONOTONIC).
    pub since_ns: u64,
    /// The CPU it runs on, waits on or last ran on.
    pub cpu: u32,
    /// It emitted kvm events: a vCPU thread.
    pub runs_guest: bool,
    /// Time and counts up to `since_ns` (exits and evidence are in [`KernelCounts::reasons`]);
    /// the extremes since the previous read.
    pub counters: Counters,
}

impl ThreadTotals {
    /// The counters as of `now_ns`: the time since `since_ns` added to the current state.
    pub fn at(&self, now_ns: u64) -> Counters {
        let mut c = self.counters;
        let open = now_ns.saturating_sub(self.since_ns);
        match self.state {
            ThreadState::Running => c.run_ns += open,
            ThreadState::Runnable => c.wait_ns += open,
            ThreadState::Blocked => c.blocked_ns += open,
            ThreadState::Unknown => c.unknown_ns += open,
            ThreadState::Exited => {}
        }
        c
    }
}

/// Why in-kernel aggregation is not available here, for the user (and `doctor`).
#[derive(Debug, thiserror::Error)]
pub enum KernelCountError {
    /// The running kernel lacks an event or a field the program reads.
    #[error("{0}")]
    Format(String),
    /// Loading, attaching or reading failed (no BPF permission, the verifier refused, no
    /// tracepoint).
    #[error("{what}: {source}")]
    Bpf {
        /// What was being done.
        what: String,
        /// aya's error, with the verifier's log where it refused.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

fn bpf<E: std::error::Error + Send + Sync + 'static>(what: impl Into<String>) -> impl FnOnce(E) -> KernelCountError {
    let what = what.into();
    move |source| KernelCountError::Bpf { what, source: Box::new(source) }
}

/// Everything counted since [`KernelCounter::start`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KernelCounts {
    /// Exits and evidence per thread and reason, sorted.
    pub reasons: Vec<(u32, ReasonKey, u64)>,
    /// Every tracked thread, by tid, sorted.
    pub threads: Vec<(u32, ThreadTotals)>,
    /// Exit durations by reason (when started with timing), sorted.
    pub durations: Vec<(ReasonKey, Histogram)>,
    /// Events not counted because a map was full: exits, threads, timings, and waits not named
    /// because the waits_by map had no room for their vCPU thread.
    pub full: [u64; 4],
    /// Exits that began before their thread's previous one ended: not timed.
    pub incomplete: u64,
    /// Who ran on the CPU a vCPU thread waited for: (waiter, taker, ns), sorted. A wait is
    /// charged to the runs on the CPU it ended on since it was queued there, as far as the
    /// CPU's last 16 runs reach: the rest of it is named by no task.
    pub waits_by: Vec<(u32, Taker, u64)>,
    /// Events the kernel did not run the program for (`recursion_misses`: it skips a
    /// tracepoint's program while another BPF program, or a BPF map syscall such as our own
    /// reads, holds the CPU's BPF guard; see `trace_call_bpf`).
    pub missed: u64,
}

/// The program, attached; dropping it detaches and unloads everything (so does the process
/// dying: the kernel holds nothing for us past our file descriptors).
pub struct KernelCounter {
    ebpf: Ebpf,
    /// Tracepoints attached, `system:event`.
    attached: Vec<String>,
    /// Of those, the sched events read by raw tracepoint programs (see `attach_sched`).
    raw: Vec<String>,
    /// The program's `generation`: the number of reads so far (extremes are since the last).
    generation: u32,
}

/// The running kernel's format of `system:event`, if it has the event.
fn format(tracefs: &Path, system: &str, event: &str) -> Result<Option<EventFormat>, KernelCountError> {
    let path = tracefs.join("events").join(system).join(event).join("format");
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(KernelCountError::Format(format!("reading {}: {e} (run as root)", path.display()))),
    };
    parse_event_format(system, &text)
        .map(Some)
        .map_err(|e| KernelCountError::Format(format!("{}: {e}", path.display())))
}

/// Byte offset and size of `field` in `f`, for the program's read of at most `max` bytes.
fn field(f: &EventFormat, field: &str, max: usize) -> Result<(u32, u32), KernelCountError> {
    let fail = |what: String| KernelCountError::Format(format!("{}:{} {what}", f.system, f.name));
    let x = f.fields.iter().find(|x| x.name == field).ok_or_else(|| fail(format!("has no field {field}")))?;
    if x.size == 0 || x.size > max {
        return Err(fail(format!("field {field} is {} bytes; the in-kernel program reads up to {max}", x.size)));
    }
    let offset = u32::try_from(x.offset).map_err(|_| fail(format!("field {field}: offset out of range")))?;
    // At most 8: checked just above.
    #[allow(clippy::cast_possible_truncation)]
    Ok((offset, x.size as u32))
}

impl KernelCounter {
    /// Load the program against the formats under `tracefs` and attach it to the kvm and
    /// sched events it reads (and to each of `evidence`, kvm event names, that exists); with
    /// `timed`, also to the events that end exits (`kvm_entry`, `kvm_fpu`), to time them.
    pub fn start(tracefs: &Path, evidence: &[&str], timed: bool) -> Result<KernelCounter, KernelCountError> {
        Self::load(tracefs, evidence, timed, None)
    }

    /// As [`KernelCounter::start`] with exits timed, also logging each timed exit's own two
    /// clock reads (up to `capacity` of them; see [`KernelCounter::exit_log`]): how a test sets
    /// the program's times beside the trace's timestamps exit by exit.
    pub fn start_logging_exits(
        tracefs: &Path,
        evidence: &[&str],
        capacity: u32,
    ) -> Result<KernelCounter, KernelCountError> {
        Self::load(tracefs, evidence, true, Some(capacity.max(1)))
    }

    /// The exits logged so far (none unless started by [`KernelCounter::start_logging_exits`]).
    pub fn exit_log(&self) -> Result<ExitLog, KernelCountError> {
        let map = |name: &str| self.ebpf.map(name).ok_or_else(|| KernelCountError::Format(format!("no map {name}")));
        let len: Array<&MapData, u64> = Array::try_from(map("exit_log_len")?).map_err(bpf("map exit_log_len"))?;
        let offered = len.get(&0, 0).map_err(bpf("reading map exit_log_len"))?;
        let log: Array<&MapData, RawExitTime> = Array::try_from(map("exit_log")?).map_err(bpf("map exit_log"))?;
        let held = offered.min(u64::from(log.len()));
        let mut exits = Vec::with_capacity(usize::try_from(held).unwrap_or(0));
        for at in 0..held {
            // `held` is at most the log's u32 length.
            #[allow(clippy::cast_possible_truncation)]
            let e = log.get(&(at as u32), 0).map_err(bpf("reading map exit_log"))?;
            if let Some(reason) = reason_key(e.kind, e.reason, e.isa) {
                exits.push(LoggedExit { tid: e.tid, reason, start_ns: e.start, end_ns: e.end });
            }
        }
        Ok(ExitLog { exits, offered })
    }

    fn load(
        tracefs: &Path,
        evidence: &[&str],
        timed: bool,
        exit_log: Option<u32>,
    ) -> Result<KernelCounter, KernelCountError> {
        let kvm = |event| format(tracefs, "kvm", event);
        let sched = |event| format(tracefs, "sched", event);
        let exit = kvm("kvm_exit")?;
        let userspace = kvm("kvm_userspace_exit")?;
        if exit.is_none() && userspace.is_none() {
            return Err(KernelCountError::Format(format!(
                "{}: neither kvm:kvm_exit nor kvm:kvm_userspace_exit exists (is the kvm module loaded?)",
                tracefs.join("events/kvm").display()
            )));
        }
        let need = |f: Option<EventFormat>, name: &str| {
            f.ok_or_else(|| KernelCountError::Format(format!("this kernel has no {name} tracepoint")))
        };
        let switch = need(sched("sched_switch")?, "sched:sched_switch")?;
        let wakeup = need(sched("sched_wakeup")?, "sched:sched_wakeup")?;
        let migrate = sched("sched_migrate_task")?;
        let mmio = kvm("kvm_mmio")?;

        let mut globals: Vec<(&str, u32)> = Vec::new();
        if let Some(f) = &exit {
            let has = |name: &str| f.fields.iter().any(|x| x.name == name);
            if has("ret") && has("esr_ec") && !has("exit_reason") {
                // arm64: keyed as the decoder keys them (`decode::arm64_trap_code`).
                globals.push(("exit_ret_offset", field(f, "ret", 4)?.0));
                globals.push(("exit_esr_ec_offset", field(f, "esr_ec", 4)?.0));
                globals.push(("arm64_trap_code", virtprof_trace::decode::arm64_trap_code(f)));
            } else {
                globals.push(("exit_reason_offset", field(f, "exit_reason", 4)?.0));
                if has("isa") {
                    globals.push(("exit_isa_offset", field(f, "isa", 4)?.0));
                }
            }
        }
        if let Some(f) = &userspace {
            globals.push(("userspace_reason_offset", field(f, "reason", 4)?.0));
        }
        globals.push(("switch_prev_pid_offset", field(&switch, "prev_pid", 4)?.0));
        let (state_at, state_size) = field(&switch, "prev_state", 8)?;
        globals.push(("switch_prev_state_offset", state_at));
        globals.push(("switch_prev_state_size", state_size));
        globals.push(("switch_next_pid_offset", field(&switch, "next_pid", 4)?.0));
        let wakeup_fields = (field(&wakeup, "pid", 4)?.0, field(&wakeup, "target_cpu", 4)?.0);
        globals.push(("wakeup_pid_offset", wakeup_fields.0));
        globals.push(("wakeup_target_cpu_offset", wakeup_fields.1));
        if let Some(f) = &migrate {
            globals.push(("migrate_pid_offset", field(f, "pid", 4)?.0));
            globals.push(("migrate_dest_cpu_offset", field(f, "dest_cpu", 4)?.0));
        }
        if let Some(f) = &mmio {
            globals.push(("mmio_type_offset", field(f, "type", 4)?.0));
        }
        // Each evidence event's program reports the id tracefs gives the event (see
        // `evidence_id_*` in the program's source).
        let mut evidence_ids = Vec::new();
        for &event in evidence {
            if let Some(f) = kvm(event)? {
                evidence_ids.push((event, u32::from(f.id)));
            }
        }
        let evidence_globals: Vec<String> =
            evidence_ids.iter().map(|(event, _)| format!("evidence_id_{event}")).collect();
        for ((_, id), name) in evidence_ids.iter().zip(&evidence_globals) {
            globals.push((name, *id));
        }
        let fpu = if timed { kvm("kvm_fpu")? } else { None };
        if let Some(f) = &fpu {
            globals.push(("fpu_load_offset", field(f, "load", 4)?.0));
        }
        // The raw programs' task fields are placed by the kernel's BTF; without it they would
        // read wherever the source's own layout puts them, so they are not used at all.
        let btf = aya::Btf::from_sys_fs().ok();
        let mut loader = EbpfLoader::new();
        loader.btf(btf.as_ref());
        for (name, value) in &globals {
            loader.set_global(name, value, true);
        }
        if let Some(capacity) = exit_log {
            loader.set_global("exit_log_on", &1u32, true);
            loader.set_max_entries("exit_log", capacity);
        }
        let ebpf = loader.load(OBJECT).map_err(bpf("loading the in-kernel aggregation program"))?;
        let mut counter = KernelCounter { ebpf, attached: Vec::new(), raw: Vec::new(), generation: 0 };
        let raw = btf.is_some();

        // The ends of exits before their starts: attaching takes a while (tens of ms each on a
        // slow host), and an exit started with no program yet to end it would count as an
        // incomplete one at the thread's next exit (the arm64 bed showed ~800 in 2 s).
        if timed {
            if kvm("kvm_entry")?.is_some() {
                counter.attach("kvm_entry", "kvm", "kvm_entry")?;
            }
            if fpu.is_some() {
                counter.attach("kvm_fpu", "kvm", "kvm_fpu")?;
            }
        }
        if exit.is_some() {
            counter.attach("kvm_exit", "kvm", "kvm_exit")?;
        }
        if userspace.is_some() {
            counter.attach("kvm_userspace_exit", "kvm", "kvm_userspace_exit")?;
        }
        for (event, _) in &evidence_ids {
            counter.attach(&format!("evidence_{event}"), "kvm", event)?;
        }
        if kvm("kvm_pio")?.is_some() {
            counter.attach("kvm_pio", "kvm", "kvm_pio")?;
        }
        if mmio.is_some() {
            counter.attach("kvm_mmio", "kvm", "kvm_mmio")?;
        }
        counter.attach_sched("sched_switch", "sched_switch", raw)?;
        counter.attach_sched("sched_wakeup", "sched_wakeup", raw)?;
        if let Some(f) = sched("sched_wakeup_new")? {
            // One tracepoint program reads both: only where their layouts agree.
            if (field(&f, "pid", 4)?.0, field(&f, "target_cpu", 4)?.0) == wakeup_fields {
                counter.attach_sched("sched_wakeup", "sched_wakeup_new", raw)?;
            }
        }
        if migrate.is_some() {
            counter.attach_sched("sched_migrate_task", "sched_migrate_task", raw)?;
        }
        Ok(counter)
    }

    /// Attach `program` to `sched:event`: as a raw tracepoint program (`raw_PROGRAM`) where
    /// `raw` allows and the kernel takes it, else as a tracepoint program. The kernel skips a
    /// tracepoint program on a CPU that is inside a BPF map syscall or another such program
    /// (one guard for them all): a reader of the maps, or an interrupt during a kvm event's
    /// program, made it miss wakeups. A raw one is only kept from running inside itself. The
    /// kernel refuses it where the tracepoint has fewer arguments than it reads
    /// (`sched_switch` before Linux 5.18).
    fn attach_sched(&mut self, program: &str, event: &str, raw: bool) -> Result<(), KernelCountError> {
        if raw && self.attach_raw(&format!("raw_{program}"), event).is_ok() {
            self.attached.push(format!("sched:{event}"));
            self.raw.push(format!("sched:{event}"));
            return Ok(());
        }
        self.attach(program, "sched", event)
    }

    fn attach_raw(&mut self, program: &str, event: &str) -> Result<(), KernelCountError> {
        let tp: &mut RawTracePoint = self
            .ebpf
            .program_mut(program)
            .ok_or_else(|| KernelCountError::Format(format!("the object has no program {program}")))?
            .try_into()
            .map_err(bpf(format!("program {program}")))?;
        if tp.fd().is_err() {
            tp.load().map_err(bpf(format!("the kernel's verifier, on program {program}")))?;
        }
        tp.attach(event).map_err(bpf(format!("attaching to raw tracepoint {event}")))?;
        Ok(())
    }

    fn attach(&mut self, program: &str, system: &str, event: &str) -> Result<(), KernelCountError> {
        let tp: &mut TracePoint = self
            .ebpf
            .program_mut(program)
            .ok_or_else(|| KernelCountError::Format(format!("the object has no program {program}")))?
            .try_into()
            .map_err(bpf(format!("program {program}")))?;
        if tp.fd().is_err() {
            tp.load().map_err(bpf(format!("the kernel's verifier, on program {program}")))?;
        }
        tp.attach(system, event).map_err(bpf(format!("attaching to {system}:{event}")))?;
        self.attached.push(format!("{system}:{event}"));
        Ok(())
    }

    /// The sched events read by raw tracepoint programs (not skipped while the maps are read),
    /// `system:event`; the others are read by tracepoint programs.
    pub fn raw_events(&self) -> &[String] {
        &self.raw
    }

    /// The tracepoints the program is attached to, `system:event`.
    pub fn attached(&self) -> &[String] {
        &self.attached
    }

    /// Account thread `tid` from `now_ns` on, in the state /proc reports (running on `cpu`
    /// or sleeping), if the program does not track it yet: a vCPU thread found before its
    /// first kvm event.
    pub fn track(&mut self, tid: u32, now_ns: u64, cpu: u32, running: bool) -> Result<(), KernelCountError> {
        let map = self.ebpf.map_mut("threads").ok_or_else(|| KernelCountError::Format("no map threads".into()))?;
        let mut threads: BpfHashMap<&mut MapData, u32, RawThread> =
            BpfHashMap::try_from(map).map_err(bpf("map threads"))?;
        let state = if running { ThreadState::Running } else { ThreadState::Blocked };
        let fresh = RawThread {
            since: now_ns,
            entered: now_ns,
            queued: now_ns,
            exec_start: now_ns,
            alloc_min_ns: u64::MAX,
            state: state.raw(),
            cpu,
            ..RawThread::default()
        };
        // BPF_NOEXIST: a thread the program already tracks keeps its state; the map being
        // full is said where the program counts it.
        match threads.insert(tid, fresh, BPF_NOEXIST) {
            Ok(()) => Ok(()),
            Err(aya::maps::MapError::SyscallError(e)) if e.io_error.raw_os_error() == Some(libc::EEXIST) => Ok(()),
            Err(e) => Err(bpf(format!("tracking thread {tid}"))(e)),
        }
    }

    /// Stop accounting thread `tid` (it exited and its figures were read): its entries leave
    /// the maps, making room for new threads.
    pub fn forget(&mut self, tid: u32) -> Result<(), KernelCountError> {
        let map = self.ebpf.map_mut("exits").ok_or_else(|| KernelCountError::Format("no map exits".into()))?;
        let mut exits: BpfHashMap<&mut MapData, RawKey, u64> = BpfHashMap::try_from(map).map_err(bpf("map exits"))?;
        let keys: Vec<RawKey> = exits.keys().filter_map(Result::ok).filter(|k| k.tid == tid).collect();
        for key in keys {
            // Gone already is what was wanted.
            let _ = exits.remove(&key);
        }
        let map = self.ebpf.map_mut("threads").ok_or_else(|| KernelCountError::Format("no map threads".into()))?;
        let mut threads: BpfHashMap<&mut MapData, u32, RawThread> =
            BpfHashMap::try_from(map).map_err(bpf("map threads"))?;
        let _ = threads.remove(&tid);
        let map = self.ebpf.map_mut("waits_by").ok_or_else(|| KernelCountError::Format("no map waits_by".into()))?;
        let mut waits: BpfHashMap<&mut MapData, u32, RawWaits> =
            BpfHashMap::try_from(map).map_err(bpf("map waits_by"))?;
        let _ = waits.remove(&tid);
        Ok(())
    }

    /// Whether this kernel reads the program's maps in batches (`BPF_MAP_LOOKUP_BATCH`, Linux
    /// 5.6 on), or one entry at a time (two system calls each).
    pub fn reads_in_batches(&self) -> bool {
        match self.ebpf.map("threads") {
            Some(aya::maps::Map::HashMap(data)) => {
                matches!(crate::bpf_maps::entries::<u32, RawThread>(data), Ok(Some(_)))
            }
            _ => false,
        }
    }

    /// Everything counted so far; the extremes (longest wait, allocation range) since the
    /// previous call, which starts them afresh.
    pub fn counts(&mut self) -> Result<KernelCounts, KernelCountError> {
        let counts = self.read()?;
        // Extremes are the program's since this number changed: from here on, the next read's.
        let next = self.generation.wrapping_add(1);
        let map =
            self.ebpf.map_mut("generation").ok_or_else(|| KernelCountError::Format("no map generation".into()))?;
        let mut generation: Array<&mut MapData, u32> = Array::try_from(map).map_err(bpf("map generation"))?;
        generation.set(0, next, 0).map_err(bpf("starting the next read's extremes"))?;
        self.generation = next;
        Ok(counts)
    }

    fn read(&self) -> Result<KernelCounts, KernelCountError> {
        let map = |name: &str| self.ebpf.map(name).ok_or_else(|| KernelCountError::Format(format!("no map {name}")));
        let mut reasons: Vec<(u32, ReasonKey, u64)> = entries::<RawKey, u64>(map("exits")?, "exits")?
            .into_iter()
            .filter_map(|(key, n)| Some((key.tid, reason_key(key.kind, key.reason, key.isa)?, n)))
            .collect();
        reasons.sort();
        let mut threads: Vec<(u32, ThreadTotals)> = entries::<u32, RawThread>(map("threads")?, "threads")?
            .into_iter()
            .map(|(tid, t)| (tid, totals(&t, self.generation)))
            .collect();
        threads.sort_by_key(|(tid, _)| *tid);
        let full: PerCpuArray<&MapData, u64> = PerCpuArray::try_from(map("full")?).map_err(bpf("map full"))?;
        let sum = |i: u32| -> Result<u64, KernelCountError> {
            Ok(full.get(&i, 0).map_err(bpf("reading map full"))?.iter().sum())
        };
        let mut waits_by: Vec<(u32, Taker, u64)> = entries::<u32, RawWaits>(map("waits_by")?, "waits_by")?
            .into_iter()
            .flat_map(|(waiter, w)| {
                let named =
                    w.by.into_iter().zip(w.ns).filter(|(_, ns)| *ns > 0).map(|(by, ns)| (Taker::Process(by), ns));
                let others = (w.others_ns > 0).then_some((Taker::Others, w.others_ns));
                named.chain(others).map(move |(taker, ns)| (waiter, taker, ns))
            })
            .collect();
        waits_by.sort_unstable();
        let durations = self.durations()?;
        let missed = self.missed();
        Ok(KernelCounts {
            reasons,
            threads,
            durations,
            full: [sum(0)?, sum(1)?, sum(2)?, sum(5)?],
            incomplete: sum(3)?,
            waits_by,
            missed,
        })
    }

    /// The kernel's count of events each attached program was skipped for, summed (from the
    /// programs' fdinfo, which every kernel with the counter shows; 0 where it has none).
    fn missed(&self) -> u64 {
        use std::os::fd::{AsFd, AsRawFd};
        self.ebpf
            .programs()
            .filter_map(|(_, program)| program.fd().ok())
            .filter_map(|fd| std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_fd().as_raw_fd())).ok())
            .filter_map(|info| {
                info.lines()
                    .find_map(|l| l.strip_prefix("recursion_misses:").and_then(|v| v.trim().parse::<u64>().ok()))
            })
            .sum()
    }

    /// Each reason's durations, from its summary entry and its bucket entries.
    fn durations(&self) -> Result<Vec<(ReasonKey, Histogram)>, KernelCountError> {
        let map = self.ebpf.map("timings").ok_or_else(|| KernelCountError::Format("no map timings".into()))?;
        let mut parts: std::collections::BTreeMap<ReasonKey, TimingParts> = Default::default();
        for (key, value) in entries::<RawTimingKey, RawTiming>(map, "timings")? {
            let Some(reason) = reason_key(key.kind, key.reason, key.isa) else { continue };
            let part = parts.entry(reason).or_default();
            if key.bucket == SUMMARY {
                part.1 = Some(value);
            } else {
                part.0.push((key.bucket as usize, value.count));
            }
        }
        Ok(parts
            .into_iter()
            .filter_map(|(reason, (buckets, summary))| {
                let s = summary?;
                Some((reason, Histogram::from_parts(buckets, s.sum, s.min, s.max)?))
            })
            .collect())
    }
}

/// Every entry of hash map `name`: in batches where the kernel can, else one by one.
fn entries<K: Pod, V: Pod>(map: &aya::maps::Map, name: &str) -> Result<Vec<(K, V)>, KernelCountError> {
    // Made first so aya checks the map's key and value sizes against K and V.
    let table: BpfHashMap<&MapData, K, V> = BpfHashMap::try_from(map).map_err(bpf(format!("map {name}")))?;
    let data = match map {
        aya::maps::Map::HashMap(data) | aya::maps::Map::LruHashMap(data) => data,
        _ => return Err(KernelCountError::Format(format!("map {name} is not a hash map"))),
    };
    match crate::bpf_maps::entries::<K, V>(data) {
        Ok(Some(all)) => Ok(all),
        Ok(None) => table.iter().map(|entry| entry.map_err(bpf(format!("reading map {name}")))).collect(),
        Err(e) => Err(bpf(format!("reading map {name}"))(e)),
    }
}

/// The reason a map key names.
fn reason_key(kind: u32, reason: u32, isa: u32) -> Option<ReasonKey> {
    match kind {
        KIND_EXIT => Some(ReasonKey::Exit { reason, isa }),
        KIND_USERSPACE => Some(ReasonKey::Userspace { reason }),
        // The program stores the u16 event id the loader gave it.
        #[allow(clippy::cast_possible_truncation)]
        KIND_EVIDENCE => Some(ReasonKey::Event { id: reason as u16 }),
        _ => None,
    }
}

/// A thread's figures; its extremes only where the program counted them since read `generation`
/// (else none: it was not preempted, nor did it wait, since).
fn totals(t: &RawThread, generation: u32) -> ThreadTotals {
    let fresh = t.generation == generation;
    ThreadTotals {
        state: ThreadState::from_raw(t.state),
        since_ns: t.since,
        cpu: t.cpu,
        runs_guest: t.runs_guest != 0,
        counters: Counters {
            run_ns: t.run_ns,
            wait_ns: t.wait_ns,
            blocked_ns: t.blocked_ns,
            unknown_ns: t.unknown_ns,
            execs: t.execs,
            inferred_execs: t.inferred_execs,
            preemptions: t.preemptions,
            alloc_sum_ns: t.alloc_sum_ns,
            alloc_min_ns: if fresh { t.alloc_min_ns } else { u64::MAX },
            alloc_max_ns: if fresh { t.alloc_max_ns } else { 0 },
            wait_max_ns: if fresh { t.wait_max_ns } else { 0 },
            wakeups: t.wakeups,
            io: t.io,
            ..Counters::default()
        },
    }
}
