//! perf_event_open counters on one vCPU thread: software events (always), kvm tracepoint
//! counts, and hardware events split user/kernel and guest/host where the PMU allows. A
//! counter the kernel refuses is listed with its reason and never reported as zero.
//!
//! Software and tracepoint counters of a thread form one perf group, read with one `read(2)`:
//! reading a counter of a thread running on another CPU costs an IPI to that CPU, which
//! interrupts the vCPU (one per thread per interval instead of one per counter).
//!
//! Hardware events are opened in groups of at most `hw_counters` and take turns
//! ([`crate::mux::Rotation`]): the sampler calls [`Counters::rotate`] at every
//! sub-interval, and values are scaled to the interval with their multiplex ratio.

use std::os::fd::AsRawFd;
use std::path::Path;

use perf_event::events::{Hardware, Software, Tracepoint};
use perf_event::{Builder, Counter, Group, ReadFormat};
use virtprof_model::interval::SeriesKind;

use crate::mux::{groups_of, rotation_span, scale, Reading, Rotation};

/// What to count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CounterEvent {
    /// A software event (`PERF_COUNT_SW_*`).
    Software(u64),
    /// A tracepoint by id (from tracefs `events/SYSTEM/NAME/id`).
    Tracepoint(u64),
    /// An event that takes a PMU counter, by its `perf_event_attr` type and configs: a
    /// hardware, cache or raw event, or a sysfs PMU's ([`crate::event_names`]).
    Pmu {
        /// `PERF_TYPE_*`, or a sysfs PMU's dynamic type.
        type_: u32,
        /// `config`.
        config: u64,
        /// `config1`.
        config1: u64,
        /// `config2`.
        config2: u64,
        /// What it leaves out (perf's modifiers).
        modes: Modes,
    },
}

/// perf's event modifiers, as the exclusions they set (`cycles:u` leaves out kernel and
/// hypervisor; `:G` the host, `:H` the guest).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Modes {
    /// Leave out user mode.
    pub exclude_user: bool,
    /// Leave out kernel mode.
    pub exclude_kernel: bool,
    /// Leave out the hypervisor.
    pub exclude_hv: bool,
    /// Leave out the host (count the guest).
    pub exclude_host: bool,
    /// Leave out guests.
    pub exclude_guest: bool,
}

impl Modes {
    /// The modes of perf's `:u`, `:k` and `:G` (none leaves in the hypervisor).
    pub const USER: Modes = Modes { exclude_kernel: true, exclude_hv: true, ..Modes::NONE };
    /// `:k`.
    pub const KERNEL: Modes = Modes { exclude_user: true, exclude_hv: true, ..Modes::NONE };
    /// `:G`, as the built-in set counts it (the hypervisor left out).
    pub const GUEST: Modes = Modes { exclude_host: true, exclude_hv: true, ..Modes::NONE };
    /// Nothing left out (an event without modifiers).
    pub const NONE: Modes = Modes {
        exclude_user: false,
        exclude_kernel: false,
        exclude_hv: false,
        exclude_host: false,
        exclude_guest: false,
    };
}

/// `PERF_TYPE_HARDWARE`: the generic hardware events (`PERF_COUNT_HW_*` configs).
pub const TYPE_HARDWARE: u32 = 0;

impl CounterEvent {
    /// A generic hardware event (`PERF_COUNT_HW_*`).
    pub fn hardware(config: u64, modes: Modes) -> CounterEvent {
        CounterEvent::Pmu { type_: TYPE_HARDWARE, config, config1: 0, config2: 0, modes }
    }
}

/// An event given by its attributes: what `perf_event_open` is told.
#[derive(Debug, Clone, Copy)]
struct Attr {
    type_: u32,
    config: u64,
    config1: u64,
    config2: u64,
}

impl perf_event::events::Event for Attr {
    fn update_attrs(self, attr: &mut perf_event_open_sys::bindings::perf_event_attr) {
        attr.type_ = self.type_;
        attr.config = self.config;
        attr.config1 = self.config1;
        attr.config2 = self.config2;
    }
}

/// A counter to open, with its metric name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CounterSpec {
    /// Metric name (`perf.task-clock`, `perf.kvm:kvm_pio`, `perf.cycles:u`).
    pub metric: String,
    /// Unit.
    pub unit: &'static str,
    /// Event.
    pub event: CounterEvent,
}

impl CounterSpec {
    /// Whether it takes a PMU counter, so takes turns with the others when they are more
    /// than the PMU has.
    fn rotates(&self) -> bool {
        matches!(self.event, CounterEvent::Pmu { .. })
    }

    fn builder(&self) -> Builder<'static> {
        let mut b = match self.event {
            CounterEvent::Software(c) => Builder::new(Software(c)),
            CounterEvent::Tracepoint(id) => Builder::new(Tracepoint::with_id(id)),
            CounterEvent::Pmu { type_, config, config1, config2, .. } => {
                Builder::new(Attr { type_, config, config1, config2 })
            }
        };
        // perf-event2 leaves out kernel mode and the hypervisor by default; tracepoints fire
        // only in the kernel, and the software events should see the thread's whole time.
        let modes = match self.event {
            CounterEvent::Pmu { modes, .. } => modes,
            _ => Modes { exclude_hv: true, ..Modes::NONE },
        };
        b.exclude_user(modes.exclude_user)
            .exclude_kernel(modes.exclude_kernel)
            .exclude_hv(modes.exclude_hv)
            .exclude_host(modes.exclude_host)
            .exclude_guest(modes.exclude_guest);
        b.read_format(ReadFormat::TOTAL_TIME_ENABLED | ReadFormat::TOTAL_TIME_RUNNING);
        b
    }
}

/// The per-CPU set made from a per-thread one: `cpu-clock` instead of `task-clock`, every
/// metric under `perf.cpu.` (so host-level sums never add a CPU's count to its threads'), and
/// no tracepoints: in a per-CPU group they count nothing on this kernel (6.18, measured: the
/// group leader counts, a `sched_switch` member stays 0 while the same event opened alone
/// counts), alone each would cost an IPI per CPU per interval, and the trace counts them
/// per CPU anyway.
pub fn per_cpu_specs(thread_specs: &[CounterSpec]) -> Vec<CounterSpec> {
    thread_specs
        .iter()
        .filter(|s| !matches!(s.event, CounterEvent::Tracepoint(_)))
        .map(|s| match s.event {
            CounterEvent::Software(c) if c == Software::TASK_CLOCK.0 => CounterSpec {
                metric: "perf.cpu.cpu-clock".into(),
                unit: s.unit,
                event: CounterEvent::Software(Software::CPU_CLOCK.0),
            },
            _ => CounterSpec { metric: s.metric.replacen("perf.", "perf.cpu.", 1), ..s.clone() },
        })
        .collect()
}

/// The default set: four software events, the kvm tracepoints this kernel has, and cycles
/// and instructions split four ways.
pub fn default_specs(tracefs: &Path) -> Vec<CounterSpec> {
    let mut specs: Vec<CounterSpec> = [
        ("task-clock", "ns", Software::TASK_CLOCK),
        ("context-switches", "count", Software::CONTEXT_SWITCHES),
        ("cpu-migrations", "count", Software::CPU_MIGRATIONS),
        ("page-faults", "count", Software::PAGE_FAULTS),
    ]
    .into_iter()
    .map(|(name, unit, sw)| CounterSpec { metric: format!("perf.{name}"), unit, event: CounterEvent::Software(sw.0) })
    .collect();
    for name in ["kvm_exit", "kvm_userspace_exit", "kvm_pio", "kvm_mmio"] {
        let id = std::fs::read_to_string(tracefs.join("events/kvm").join(name).join("id"));
        if let Some(id) = id.ok().and_then(|t| t.trim().parse().ok()) {
            specs.push(CounterSpec {
                metric: format!("perf.kvm:{name}"),
                unit: "count",
                event: CounterEvent::Tracepoint(id),
            });
        }
    }
    for (name, config) in [("cycles", Hardware::CPU_CYCLES.0), ("instructions", Hardware::INSTRUCTIONS.0)] {
        for (suffix, modes) in [("u", Modes::USER), ("k", Modes::KERNEL), ("guest", Modes::GUEST)] {
            specs.push(CounterSpec {
                metric: format!("perf.{name}:{suffix}"),
                unit: "count",
                event: CounterEvent::hardware(config, modes),
            });
        }
    }
    specs
}

/// A column a [`Counters`] fills: metric, unit, kind.
pub type Column = (String, &'static str, SeriesKind);

/// What a set of counters observes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// One thread (a vCPU), on whatever CPU it runs.
    Thread(u32),
    /// Everything that runs on one CPU.
    Cpu(u32),
}

impl Target {
    fn apply(self, b: &mut Builder<'_>) {
        match self {
            // Thread ids fit in pid_t (the kernel's PID_MAX_LIMIT is 2^22).
            #[allow(clippy::cast_possible_wrap)]
            Target::Thread(tid) => b.observe_pid(tid as i32).any_cpu(),
            Target::Cpu(cpu) => b.any_pid().one_cpu(cpu as usize),
        };
    }
}

/// Software and tracepoint counters of one target in one perf group (never multiplexed: they
/// always count), read together.
struct PlainGroup {
    group: Group,
    /// The members, kept open; their values come in this order after the leader's.
    members: Vec<Counter>,
    /// A last member that is never reported (see [`PlainGroup::pad`]).
    pad: Option<Counter>,
    /// The previous read's counts, per member.
    previous: Vec<u64>,
    /// Read buffer: nr, time_enabled, time_running, then (value, id) of the leader and of
    /// each member (perf-event2 always asks for ids with a group).
    buf: Vec<u64>,
}

impl PlainGroup {
    /// A group on `target` (with a dummy leader that counts nothing).
    fn open(target: Target) -> std::io::Result<Self> {
        let mut leader = Group::builder();
        target.apply(&mut leader);
        leader.enabled(true);
        Ok(PlainGroup {
            group: leader.build_group()?,
            members: Vec::new(),
            pad: None,
            previous: Vec::new(),
            buf: Vec::new(),
        })
    }

    /// Events in the group after the leader.
    fn events(&self) -> usize {
        self.members.len() + usize::from(self.pad.is_some())
    }

    /// End the group with a dummy event. Measured on 6.18: in a per-CPU group read from
    /// another CPU, `cpu-clock` reads 0 when it is the group's last event and counts when
    /// any event follows it (`perf stat -a` is right: it reads each event alone).
    fn pad(&mut self, target: Target) -> std::io::Result<()> {
        let mut b = Builder::new(Software::DUMMY);
        target.apply(&mut b);
        b.enabled(true);
        self.pad = Some(self.group.add(&b)?);
        self.buf.resize(Self::words(self.events()), 0);
        Ok(())
    }

    /// Words a group read of `members` (plus the leader) fills.
    fn words(members: usize) -> usize {
        3 + 2 * (1 + members)
    }

    /// Add `spec` (counting from now).
    fn add(&mut self, spec: &CounterSpec, target: Target) -> std::io::Result<()> {
        let mut b = spec.builder();
        target.apply(&mut b);
        b.enabled(true);
        self.members.push(self.group.add(&b)?);
        self.previous.push(0);
        self.buf.resize(Self::words(self.events()), 0);
        Ok(())
    }

    /// Read every member's count since the previous read into `out` (NaN if the read fails).
    fn sample(&mut self, out: &mut [f64]) {
        let bytes = std::mem::size_of_val(self.buf.as_slice());
        // SAFETY: `buf` is a live, writable allocation of exactly `bytes` bytes, and the fd is
        // the group leader's, open for as long as `self.group` lives.
        let n = unsafe { libc::read(self.group.as_counter().as_raw_fd(), self.buf.as_mut_ptr().cast(), bytes) };
        let (members, events) = (self.members.len(), self.events());
        if usize::try_from(n).ok() != Some(8 * Self::words(events)) || self.buf[0] != 1 + events as u64 {
            out[..members].iter_mut().for_each(|v| *v = f64::NAN);
            return;
        }
        for (i, previous) in self.previous.iter_mut().enumerate() {
            // Skip the header (3 words) and the leader's (value, id).
            let now = self.buf[5 + 2 * i];
            out[i] = now.wrapping_sub(*previous) as f64;
            *previous = now;
        }
    }
}

/// The counters of one thread or CPU.
pub struct Counters {
    /// Software and tracepoint counters (None if not even the group could be opened).
    plain: Option<PlainGroup>,
    /// Hardware counters by rotation group.
    hardware: Vec<Vec<(Counter, Reading)>>,
    rotation: Rotation,
    columns: Vec<Column>,
    /// Each hardware counter's change over the interval being sampled.
    deltas: Vec<Option<Reading>>,
    /// Each hardware group's enabled time over it.
    group_enabled: Vec<u64>,
}

impl Counters {
    /// Open `specs` on `target`. Returns the counters and, for each refused spec, its
    /// metric and the kernel's reason.
    pub fn open(target: Target, specs: &[CounterSpec], hw_counters: usize) -> (Self, Vec<(String, String)>) {
        let mut unavailable = Vec::new();
        let mut columns = Vec::new();
        let (hw_specs, plain_specs): (Vec<&CounterSpec>, Vec<&CounterSpec>) = specs.iter().partition(|s| s.rotates());
        let mut plain = match PlainGroup::open(target) {
            Ok(group) => Some(group),
            Err(e) => {
                unavailable.extend(plain_specs.iter().map(|s| (s.metric.clone(), e.to_string())));
                None
            }
        };
        if let Some(group) = plain.as_mut() {
            for spec in &plain_specs {
                match group.add(spec, target) {
                    Ok(()) => columns.push((spec.metric.clone(), spec.unit, SeriesKind::Delta)),
                    Err(e) => unavailable.push((spec.metric.clone(), e.to_string())),
                }
            }
            if matches!(target, Target::Cpu(_)) && !group.members.is_empty() {
                if let Err(e) = group.pad(target) {
                    log::debug!("padding a CPU's counter group: {e}");
                }
            }
            // Baseline: counts start at the first read.
            let mut scratch = vec![0.0; group.members.len()];
            group.sample(&mut scratch);
        }
        // Every hardware event is opened alone and disabled, so one refusal does not sink a
        // group; those the PMU accepts are grouped, and group 0 starts counting.
        let mut opened = Vec::new();
        for spec in hw_specs {
            match open_disabled(spec, target) {
                Ok(c) => {
                    opened.push(c);
                    columns.push((spec.metric.clone(), spec.unit, SeriesKind::Delta));
                    columns.push((format!("{}.mux", spec.metric), "ratio", SeriesKind::Ratio));
                }
                Err(e) => unavailable.push((spec.metric.clone(), pmu_refusal(&e))),
            }
        }
        let mut counters = opened.into_iter();
        let mut hardware: Vec<Vec<(Counter, Reading)>> = groups_of(counters.len(), hw_counters)
            .into_iter()
            .map(|range| counters.by_ref().take(range.len()).map(|c| (c, Reading::default())).collect())
            .collect();
        if let Some(first) = hardware.first_mut() {
            for (c, _) in first {
                if let Err(e) = c.enable() {
                    log::debug!("enabling a hardware counter: {e}");
                }
            }
        }
        let rotation = Rotation::new(hardware.len());
        let deltas = Vec::with_capacity(hardware.iter().map(Vec::len).sum());
        let group_enabled = Vec::with_capacity(hardware.len());
        (Counters { plain, hardware, rotation, columns, deltas, group_enabled }, unavailable)
    }

    /// The columns [`Counters::sample`] fills, in order.
    pub fn columns(&self) -> &[Column] {
        &self.columns
    }

    /// Sub-intervals per interval the hardware rotation needs (1 when nothing rotates).
    pub fn sub_intervals(&self) -> usize {
        if self.hardware.len() > 1 {
            self.rotation.sub_intervals()
        } else {
            1
        }
    }

    /// End a sub-interval: the counting hardware group hands over to the next.
    pub fn rotate(&mut self) {
        if self.hardware.len() < 2 {
            return;
        }
        let (off, on) = self.rotation.advance();
        for (c, _) in &mut self.hardware[off] {
            let _ = c.disable();
        }
        for (c, _) in &mut self.hardware[on] {
            let _ = c.enable();
        }
    }

    /// Write one interval into `out` (one value per column; NaN where a counter did not run
    /// or could not be read).
    pub fn sample(&mut self, out: &mut [f64]) {
        let mut i = 0;
        if let Some(group) = self.plain.as_mut() {
            group.sample(&mut out[..group.members.len()]);
            i = group.members.len();
        }
        // Into buffers kept from interval to interval: sampling allocates nothing.
        let (deltas, group_enabled) = (&mut self.deltas, &mut self.group_enabled);
        deltas.clear();
        group_enabled.clear();
        for group in &mut self.hardware {
            let mut enabled = 0;
            for (counter, previous) in group.iter_mut() {
                let delta = read(counter).map(|now| now.since(std::mem::replace(previous, now)));
                enabled = enabled.max(delta.map_or(0, |d| d.enabled_ns));
                deltas.push(delta);
            }
            group_enabled.push(enabled);
        }
        let rotated = self.hardware.len() > 1;
        let span = rotation_span(group_enabled.iter().copied());
        for delta in deltas.iter() {
            // Alone, a counter scales by its own enabled time (the kernel's multiplexing);
            // taking turns, by the time all the turns add up to.
            let scaled = delta.and_then(|d| scale(d, if rotated { span } else { d.enabled_ns }));
            out[i] = scaled.map_or(f64::NAN, |s| s.value);
            out[i + 1] = scaled.map_or(0.0, |s| s.ratio);
            i += 2;
        }
    }
}

/// Why the kernel would not open a PMU event, in words a user can act on.
fn pmu_refusal(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::ENOENT | libc::EOPNOTSUPP) => format!("no PMU on this host counts it ({e})"),
        Some(libc::EACCES | libc::EPERM) => {
            format!("not permitted ({e}): run as root, or lower /proc/sys/kernel/perf_event_paranoid")
        }
        Some(libc::EINVAL) => format!("its PMU refuses these settings, e.g. a modifier it cannot honour ({e})"),
        _ => e.to_string(),
    }
}

/// `spec` on `target`, not counting until enabled.
fn open_disabled(spec: &CounterSpec, target: Target) -> std::io::Result<Counter> {
    let mut b = spec.builder();
    target.apply(&mut b);
    b.enabled(false);
    b.build()
}

fn read(counter: &mut Counter) -> Option<Reading> {
    let r = counter.read_count_and_time().ok()?;
    Some(Reading { count: r.count, enabled_ns: r.time_enabled, running_ns: r.time_running })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn software_counters_count_this_thread_and_hardware_is_explained_when_refused() {
        let tid = u32::try_from(unsafe_gettid()).unwrap();
        let specs = default_specs(Path::new("/sys/kernel/tracing"));
        let (mut counters, unavailable) = Counters::open(Target::Thread(tid), &specs, 4);
        let n = counters.columns().len();
        let task_clock = counters.columns().iter().position(|c| c.0 == "perf.task-clock");
        let Some(task_clock) = task_clock else {
            eprintln!("SKIP: perf software events unavailable here: {unavailable:?}");
            return;
        };
        std::hint::black_box((0..2_000_000u64).sum::<u64>());
        let mut out = vec![0.0; n];
        counters.sample(&mut out);
        assert!(out[task_clock] > 0.0, "task-clock counted this thread's work");
        for (metric, reason) in &unavailable {
            assert!(!reason.is_empty(), "{metric} refused without a reason");
            assert!(!counters.columns().iter().any(|c| &c.0 == metric), "{metric} is not also a column");
        }
    }

    fn unsafe_gettid() -> i64 {
        // SAFETY: gettid has no preconditions.
        unsafe { libc::syscall(libc::SYS_gettid) }
    }
}
