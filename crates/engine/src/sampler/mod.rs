//! Where `top`'s and `serve`'s numbers come from, best first. In the kernel (`kernel`): an eBPF
//! program on the sched and kvm tracepoints keeps each thread's time per state and exits by
//! reason in maps read at each refresh ([`kernel`]); nothing per event reaches user space.
//! Traced (`trace`; `serve`, which also times exits, and hosts where eBPF does not load): sched
//! and kvm events from a private instance, decoded and accounted as they arrive. Both add the
//! KVM stats fds for exact exit counts. Without tracefs (or with `--no-trace`): schedstat and
//! KVM stats polled each refresh, which gives wait and executions exactly, run time as
//! schedstat's plus the host's steal share (see [`HostCpu`]), blocked time only as the
//! remainder, and no allocation, I/O from the trace, or reasons.

mod kernel;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::{Path, PathBuf};

use serde::Serialize;
use virtprof_analysis::exits::{ExitAnalyzer, ExitOptions};
use virtprof_analysis::hist::Histogram;
use virtprof_analysis::qos::{window_report, VmInfo, WindowReport};
use virtprof_analysis::sched::{Counters, SchedAccounting, SchedOptions, Span};
use virtprof_host::monotonic_ns;
use virtprof_host::procfiles::ProcFiles;
use virtprof_host::procfs::clock_ticks_per_second;
use virtprof_host::Schedstat;
use virtprof_interval::procstat::ProcStat;
use virtprof_kvm::discover::Discovery;
use virtprof_kvm::remote::RemoteVmStats;
use virtprof_model::evidence::Holdings;
use virtprof_model::units::saturating_u64;
use virtprof_model::Loss;

pub use crate::kernel_counts::Taker;

use crate::energy::book::{CoreRow, EnergyBook};
use crate::tasks::HostTasks;
use virtprof_session::LiveTrace;
use virtprof_session::{evidence_event_ids, DecoderNames};

const SECOND: u64 = 1_000_000_000;
/// Accounting resolution: windows are whole buckets.
const BUCKET_NS: u64 = 100_000_000;
/// Kept history: the 10 s window plus slack.
const HISTORY_NS: u64 = 12 * SECOND;
/// Refreshes between listings of /proc for new VMs and re-reads of known VMs' thread lists.
const RESCAN_EVERY: u64 = 5;
/// The events `top` traces: scheduling, and the kvm events that carry exits and I/O.
const EVENTS: [&str; 12] = [
    "sched:sched_switch",
    "sched:sched_wakeup",
    "sched:sched_wakeup_new",
    "sched:sched_migrate_task",
    "kvm:kvm_exit",
    "kvm:kvm_userspace_exit",
    "kvm:kvm_pio",
    "kvm:kvm_mmio",
    "kvm:kvm_cpuid",
    "kvm:kvm_msr",
    "kvm:kvm_hypercall",
    "kvm:kvm_cr",
];
/// What timing exits adds (`serve`'s histogram): their ends, an entry or the VMM's return
/// through the FPU reload. `top` does without: on VMX/SVM `kvm_entry` doubles the events.
const DURATION_EVENTS: [&str; 2] = ["kvm:kvm_entry", "kvm:kvm_fpu"];

/// Why the sampler does not use a better source than the one it took.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fallback {
    /// In-kernel aggregation was tried and did not load (the reason).
    pub no_kernel: Option<String>,
    /// Polling, and why (`--no-trace`, or tracing unavailable).
    pub polling: Option<String>,
}

/// One refresh's view: the windows `top` shows.
#[derive(Debug, Clone, Serialize)]
pub struct Snapshot {
    /// `kernel`, `trace` or `polling`.
    pub mode: &'static str,
    /// True in polling mode: blocked is a remainder, allocation and reasons are missing.
    pub approximate: bool,
    /// Events the kernel dropped (trace mode), or that a full map could not count (kernel).
    pub lost_events: u64,
    /// Per CPU, with where the gaps were (trace mode).
    pub loss: Option<Loss>,
    /// Last 1 s, last 10 s, whole run.
    pub windows: Vec<WindowReport>,
    /// Per-core energy and temperature estimates (`balance`'s model).
    pub cores: Vec<CoreRow>,
    /// Swaps per second of running `virtprof balance` processes (None: none running).
    pub swaps_per_s: Option<f64>,
    /// The `virtprof balance` whose per-core accounts `cores` are (None: `top`'s estimate).
    pub balancer: Option<u32>,
    /// Guests seen from inside (`top --agent`), over the refresh interval.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub guests: Vec<crate::guests::GuestLive>,
}

/// What polling (schedstat and KVM stats, no trace) cannot give, in every window it makes.
pub const POLLING_LACKS: [&str; 1] =
    ["exit reasons and durations: polling reads no trace (the in-kernel program or --trace gives them)"];

/// (pid, vCPU index) → cumulative KVM stats (exits, I/O exits).
type StatsSample = BTreeMap<(u32, u32), (u64, u64)>;
/// Every polled vCPU thread at one refresh, and the host's CPU time then.
#[derive(Clone, Default)]
struct PollSample {
    /// tid → (cpu, schedstat).
    threads: BTreeMap<u32, (u32, Schedstat)>,
    host: HostCpu,
}

/// This host's CPU time over all CPUs from `/proc/stat`, in ns: busy (user, nice, system, irq,
/// softirq) and stolen by its own hypervisor. Where the kernel accounts steal
/// (`CONFIG_PARAVIRT_TIME_ACCOUNTING`), schedstat's run time leaves it out, while a thread
/// that was on a CPU when its hypervisor took the CPU did not block: without this, a compute
/// vCPU on a cloud VM with 10 % steal shows 10 % "blocked". Steal is charged to threads in
/// proportion to their run time (a halted CPU is not runnable on the host, so it accrues
/// almost none), which is what a trace's timestamps see too.
#[derive(Clone, Copy, Default)]
struct HostCpu {
    busy_ns: f64,
    steal_ns: f64,
}

impl HostCpu {
    fn read(stat: &mut Option<ProcStat>) -> HostCpu {
        let mut host = HostCpu::default();
        let read = stat.as_mut().map(|s| {
            s.read(|_, v| {
                // user, nice, system, irq, softirq; then steal (see procstat::FIELDS).
                host.busy_ns += v[0] + v[1] + v[2] + v[5] + v[6];
                host.steal_ns += v[7];
            })
        });
        if !matches!(read, Some(Ok(()))) {
            return HostCpu::default();
        }
        host
    }

    /// Steal per nanosecond of busy time between `self` and a later reading (0 when unknown).
    fn steal_per_busy_ns(self, later: HostCpu) -> f64 {
        let busy = later.busy_ns - self.busy_ns;
        let steal = later.steal_ns - self.steal_ns;
        if busy > 0.0 && steal > 0.0 {
            steal / busy
        } else {
            0.0
        }
    }
}

/// A sample and when it was taken (monotonic ns).
type Timed<T> = (u64, T);

/// Samples taken at refreshes: the first (for the whole-run window) and those of the last
/// [`HISTORY_NS`] (for the 1 s and 10 s windows).
struct History<T> {
    first: Option<Timed<T>>,
    recent: VecDeque<Timed<T>>,
}

impl<T: Clone> History<T> {
    fn new() -> Self {
        History { first: None, recent: VecDeque::new() }
    }

    fn push(&mut self, now: u64, sample: T) {
        if self.first.is_none() {
            self.first = Some((now, sample.clone()));
        }
        self.recent.push_back((now, sample));
        while self.recent.front().is_some_and(|(t, _)| now - t > HISTORY_NS) {
            self.recent.pop_front();
        }
    }

    /// The samples bounding the window that ends at the newest sample and starts at `from`:
    /// the latest sample taken at or before `from` (else the first one), and the newest.
    fn window(&self, from: u64) -> Option<(&Timed<T>, &Timed<T>)> {
        let newest = self.recent.back()?;
        let start = self.recent.iter().rev().find(|(t, _)| *t <= from).or(self.first.as_ref())?;
        Some((start, newest))
    }
}

/// A vCPU's KVM stats over a window.
struct StatsDelta {
    exits: f64,
    io: f64,
    seconds: f64,
    /// The window began before the vCPU's first sample and was shortened to start there.
    clipped: bool,
}

impl History<StatsSample> {
    /// vCPU `key`'s exits and I/O exits over `[from, to]` clipped to the samples that hold it,
    /// the counts at both ends interpolated between the samples around them (KVM stats are
    /// read at refreshes; windows start and end between them).
    fn counts_over(&self, key: (u32, u32), from: u64, to: u64) -> Option<StatsDelta> {
        // The samples that hold it, looked up once (a window asks this for every vCPU).
        let holding: Vec<(u64, (u64, u64))> =
            self.first.iter().chain(self.recent.iter()).filter_map(|(at, s)| Some((*at, *s.get(&key)?))).collect();
        let first = holding.iter().map(|(at, _)| *at).min()?;
        let last = holding.iter().map(|(at, _)| *at).max()?;
        let clipped = from < first;
        let (from, to) = (from.max(first), to.min(last));
        if to <= from {
            return None;
        }
        let at = |t: u64| {
            let &(t0, a) = holding.iter().filter(|(at, _)| *at <= t).max_by_key(|(at, _)| *at)?;
            let &(t1, b) = holding.iter().filter(|(at, _)| *at >= t).min_by_key(|(at, _)| *at)?;
            let f = if t1 > t0 { (t - t0) as f64 / (t1 - t0) as f64 } else { 0.0 };
            let lerp = |x: u64, y: u64| x as f64 + f * (y as f64 - x as f64);
            Some((lerp(a.0, b.0), lerp(a.1, b.1)))
        };
        let ((exits0, io0), (exits1, io1)) = (at(from)?, at(to)?);
        Some(StatsDelta {
            exits: (exits1 - exits0).max(0.0),
            io: (io1 - io0).max(0.0),
            seconds: (to - from) as f64 / 1e9,
            clipped,
        })
    }
}

/// The live data source.
pub struct Sampler {
    discovery: Discovery,
    host: HostTasks,
    vms: Vec<VmInfo>,
    only: Vec<u32>,
    stats: HashMap<u32, Option<RemoteVmStats>>,
    stats_history: History<StatsSample>,
    source: Source,
    refreshes: u64,
    /// Traced threads no VM owned when last looked for.
    looked_for: std::collections::HashSet<u32>,
    energy: EnergyBook,
    /// The tasks' /proc files read at every refresh, kept open.
    proc_files: ProcFiles,
    /// VMM pid → the most CPU seconds its threads other than vCPUs have shown.
    vmm_cpu: BTreeMap<u32, f64>,
}

enum Source {
    Kernel(Box<kernel::KernelSource>),
    Trace(Box<TraceSource>),
    Polling(PollSource),
}

/// How the sampler may get its figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// In the kernel where eBPF loads, else traced, else polled.
    Best,
    /// Traced (every event decoded in user space), else polled (`--trace`).
    Traced,
    /// Polled only (`--no-trace`).
    Polled,
}

struct TraceSource {
    trace: LiveTrace,
    acc: SchedAccounting,
    /// Exit durations by reason (`serve`'s histogram), over the whole run, when asked for.
    exits: Option<ExitAnalyzer>,
    /// How full the fullest CPU's buffer was at the last drain (0 to 1).
    fill: f64,
}

struct PollSource {
    history: History<PollSample>,
    /// `/proc/stat`, kept open (None where it cannot be read: no steal share then).
    stat: Option<ProcStat>,
}

impl PollSource {
    fn new() -> PollSource {
        PollSource { history: History::new(), stat: ProcStat::open().ok() }
    }
}

impl Sampler {
    /// Start sampling the best way `mode` allows; with `durations`, exits are timed too.
    /// Returns, for the user, why a better way was not taken and whether it is polling.
    pub fn start(only: Vec<u32>, mode: Mode, durations: bool) -> anyhow::Result<(Sampler, Fallback)> {
        virtprof_host::procfiles::raise_open_file_limit();
        let mut fallback = Fallback::default();
        let mut source = None;
        if mode == Mode::Best {
            match kernel::KernelSource::start(durations) {
                Ok(k) => source = Some(Source::Kernel(Box::new(k))),
                Err(e) => fallback.no_kernel = Some(format!("{e:#}")),
            }
        }
        if source.is_none() && mode != Mode::Polled {
            match TraceSource::start(durations) {
                Ok(t) => source = Some(Source::Trace(Box::new(t))),
                Err(e) => fallback.polling = Some(format!("tracing unavailable ({e:#})")),
            }
        }
        if mode == Mode::Polled {
            fallback.polling = Some("--no-trace".to_string());
        }
        let source = source.unwrap_or_else(|| Source::Polling(PollSource::new()));
        let mut sampler = Sampler {
            discovery: Discovery::new("/proc", only.clone()),
            host: HostTasks::default(),
            vms: Vec::new(),
            only,
            stats: HashMap::new(),
            stats_history: History::new(),
            energy: EnergyBook::new(&virtprof_trace::capture::online_cpus()),
            source,
            refreshes: 0,
            looked_for: Default::default(),
            proc_files: ProcFiles::for_this_process(),
            vmm_cpu: BTreeMap::new(),
        };
        sampler.refresh()?;
        Ok((sampler, fallback))
    }

    /// Take in everything since the last refresh.
    pub fn refresh(&mut self) -> anyhow::Result<()> {
        let now = monotonic_ns();
        self.rediscover(now);
        match &mut self.source {
            Source::Kernel(k) => k.read(now)?,
            Source::Trace(t) => t.drain(now)?,
            Source::Polling(p) => p.poll(&self.vms, &mut self.proc_files),
        }
        self.poll_kvm_stats();
        self.proc_files.sweep();
        let run = self.window("run", u64::MAX, None);
        self.energy.update(now, &run);
        Ok(())
    }

    /// Who ran on the CPUs a VM's vCPUs waited for since the start, summed per process: (taker,
    /// ns), most first. None where the source cannot tell (polled, or traced: only the
    /// in-kernel program names them).
    pub fn preempted_by(&self, vm: &VmInfo) -> Option<Vec<(Taker, u64)>> {
        let Source::Kernel(k) = &self.source else { return None };
        let mut by: BTreeMap<Taker, u64> = BTreeMap::new();
        for vcpu in &vm.vcpus {
            for (tid, ns) in k.waits_by().get(&vcpu.tid.0).into_iter().flatten() {
                *by.entry(*tid).or_default() += ns;
            }
        }
        let mut list: Vec<(Taker, u64)> = by.into_iter().collect();
        list.sort_by_key(|(_, ns)| std::cmp::Reverse(*ns));
        Some(list)
    }

    /// VMs and their vCPU threads now; new vCPU threads start being accounted.
    fn rediscover(&mut self, now: u64) {
        // Listing /proc costs a lookup per process: new VMs are looked for every few refreshes,
        // known ones (exits, late vCPU threads) on every one. Thread lists likewise: read for
        // new VMs and every few refreshes.
        // A thread the trace saw making kvm events that no known VM owns is a new VM: look
        // now, once per such thread (one that ended stays unowned).
        let unowned: Vec<u32> = self
            .kvm_threads()
            .into_iter()
            .filter(|tid| !self.host.threads.contains_key(tid) && !self.looked_for.contains(tid))
            .collect();
        let periodic = self.refreshes % RESCAN_EVERY == 0 || !unowned.is_empty();
        self.looked_for.extend(unowned);
        self.refreshes += 1;
        let found = if periodic { self.discovery.scan() } else { self.discovery.rescan_known() };
        self.host.identities = found.iter().map(|v| (v.pid, crate::recorder::identity(v))).collect();
        self.host.threads.retain(|_, (pid, _)| found.iter().any(|v| v.pid == *pid));
        for vm in &found {
            let known = self.host.threads.values().any(|(pid, _)| *pid == vm.pid);
            if periodic || !known {
                self.host.threads.retain(|_, (pid, _)| *pid != vm.pid);
                for (tid, comm) in self.proc_files.threads(Path::new("/proc"), vm.pid) {
                    self.host.threads.insert(tid, (vm.pid, comm));
                }
            }
        }
        self.stats.retain(|pid, _| found.iter().any(|v| v.pid == *pid));
        let tracked = self.kvm_threads();
        let previous = std::mem::replace(&mut self.vms, self.host.vms(&tracked, &self.only));
        keep_exited_threads(&mut self.vms, &previous);
        // Threads accounted already need no look at /proc: with hundreds of VMs, reading every
        // thread's stat file at each refresh was most of its cost.
        let tracked: std::collections::HashSet<u32> = match &self.source {
            Source::Trace(t) => t.acc.tracked().collect(),
            Source::Kernel(k) => k.tracked(),
            Source::Polling(_) => return,
        };
        for vm in &self.vms {
            let threads = vm.vcpus.iter().map(|v| v.tid.0).chain(vm.others.iter().map(|t| t.tid));
            for tid in threads.filter(|tid| !tracked.contains(tid)) {
                let Some((cpu, running)) = proc_state(&mut self.proc_files, vm.pid.0, tid) else { continue };
                match &mut self.source {
                    Source::Trace(t) => t.acc.track_from_proc(tid, now, cpu, running),
                    Source::Kernel(k) => k.track(tid, now, cpu, running),
                    Source::Polling(_) => {}
                }
            }
        }
    }

    /// CPU seconds of each VM's VMM threads other than its vCPUs: the process's total (which
    /// keeps the time of threads that exited) minus its vCPU threads'. Reads are not atomic
    /// across threads, so a figure never goes below what an earlier call showed.
    pub fn vmm_cpu_seconds(&mut self) -> BTreeMap<u32, f64> {
        let tick = clock_ticks_per_second();
        let vms = &self.vms;
        self.vmm_cpu.retain(|pid, _| vms.iter().any(|v| v.pid.0 == *pid));
        for vm in vms {
            let pid = vm.pid.0;
            let files = &mut self.proc_files;
            let vcpus: u64 = vm
                .vcpus
                .iter()
                .filter_map(|v| files.task_stat(Path::new(&format!("/proc/{pid}/task/{}/stat", v.tid.0))))
                .map(|s| s.cpu_ticks)
                .sum();
            let Some(total) = files.task_stat(Path::new(&format!("/proc/{pid}/stat"))) else { continue };
            let seconds = total.cpu_ticks.saturating_sub(vcpus) as f64 / tick;
            let kept = self.vmm_cpu.entry(pid).or_insert(0.0);
            *kept = kept.max(seconds);
        }
        self.vmm_cpu.clone()
    }

    /// Threads seen running guest code (none known when polling).
    fn kvm_threads(&self) -> Vec<u32> {
        match &self.source {
            Source::Kernel(k) => k.kvm_threads(),
            Source::Trace(t) => t.acc.kvm_threads().collect(),
            Source::Polling(_) => Vec::new(),
        }
    }

    /// Read every VM's KVM stats. The sample is timestamped when the counters are read, after
    /// any slow first attach, so a window's rate divides by the time the counts really span.
    fn poll_kvm_stats(&mut self) {
        for vm in &self.vms {
            self.stats.entry(vm.pid.0).or_insert_with(|| RemoteVmStats::attach(vm.pid.0).ok());
        }
        let now = monotonic_ns();
        let mut sample = BTreeMap::new();
        for vm in &self.vms {
            let Some(Some(stats)) = self.stats.get(&vm.pid.0) else { continue };
            for (index, fd) in &stats.vcpus {
                if let Ok(s) = fd.read() {
                    let io = s.get("io_exits").unwrap_or(0) + s.get("mmio_exits").unwrap_or(0);
                    sample.insert((vm.pid.0, *index), (s.get("exits").unwrap_or(0), io));
                }
            }
        }
        self.stats_history.push(now, sample);
    }

    /// The windows, for all CPUs or only `cpu`.
    pub fn snapshot(&self, cpu: Option<u32>) -> Snapshot {
        self.snapshot_of(&[("1s", SECOND), ("10s", 10 * SECOND), ("run", u64::MAX)], cpu)
    }

    /// Only the whole run's window (what `serve`'s counters are), for all CPUs.
    pub fn run_snapshot(&self) -> Snapshot {
        self.snapshot_of(&[("run", u64::MAX)], None)
    }

    fn snapshot_of(&self, windows: &[(&str, u64)], cpu: Option<u32>) -> Snapshot {
        let (mode, loss, lost_events) = match &self.source {
            Source::Kernel(k) => ("kernel", None, k.uncounted()),
            Source::Trace(t) => ("trace", Some(t.trace.loss()), t.trace.loss().total()),
            Source::Polling(_) => ("polling", None, 0),
        };
        let windows = windows.iter().map(|&(label, ns)| self.window(label, ns, cpu)).collect();
        Snapshot {
            mode,
            approximate: mode == "polling",
            lost_events,
            loss,
            windows,
            cores: self.energy.rows(),
            swaps_per_s: self.energy.swaps_per_s,
            balancer: self.energy.balancer,
            guests: Vec::new(),
        }
    }

    /// The window of the last `ns` (u64::MAX: the whole run), for all CPUs or only `cpu`.
    fn window(&self, label: &str, ns: u64, cpu: Option<u32>) -> WindowReport {
        let (span, names): (_, Box<dyn virtprof_analysis::Names + '_>) = match &self.source {
            Source::Kernel(k) => (k.span(ns), Box::new(DecoderNames(k.decoder()))),
            Source::Trace(t) if ns == u64::MAX => (t.acc.total().clone(), Box::new(DecoderNames(t.trace.decoder()))),
            Source::Trace(t) => (t.acc.last(ns), Box::new(DecoderNames(t.trace.decoder()))),
            Source::Polling(p) => (p.span(ns), Box::new(NoNames)),
        };
        // A live view traces (or counts in the kernel) every event its figures need.
        let mut report = window_report(&span, label, &self.vms, names.as_ref(), cpu, &Holdings::all());
        if let Source::Polling(_) = &self.source {
            report.unavailable.extend(POLLING_LACKS.iter().map(|s| s.to_string()));
        }
        let denied = self.discovery.denied();
        if denied > 0 {
            report.unavailable.push(format!(
                "VMs of {denied} processes this run may not inspect: reading their /proc/PID/fd was \
                 refused (run as root, with CAP_SYS_PTRACE)"
            ));
        }
        self.apply_kvm_stats(&mut report);
        report
    }

    /// Exits per second from the KVM stats fds (exact on every host) over the window itself
    /// (counts interpolated at its ends), where they are readable: kept beside the trace's
    /// figure, and used unless the trace counted every `kvm_exit` of the window itself
    /// (VMX/SVM, nothing lost). In polling mode also the I/O count (`io_exits` +
    /// `mmio_exits`, where the host counts them), and the exits and I/O of VMs whose stats are
    /// not readable are unknown, not 0.
    fn apply_kvm_stats(&self, report: &mut WindowReport) {
        let polling = matches!(self.source, Source::Polling(_));
        let exact_trace = match &self.source {
            Source::Kernel(k) => report.exits_source == "kvm_exit" && k.uncounted() == 0,
            Source::Trace(t) => report.exits_source == "kvm_exit" && t.trace.loss().total() == 0,
            Source::Polling(_) => false,
        };
        let (start, end) = (report.start_ns, report.end_ns);
        let mut used = false;
        for vm in &mut report.vms {
            for v in &mut vm.vcpus {
                match self.stats_history.counts_over((vm.pid, v.index), start, end) {
                    // Beside an exact traced figure, a stats figure over another span would mislead.
                    Some(StatsDelta { clipped: true, .. }) if exact_trace => {}
                    Some(d) => {
                        let rate = d.exits / d.seconds;
                        v.kvm_stats_exits_per_s = Some(rate);
                        if !exact_trace {
                            v.exits = Some(saturating_u64(d.exits.round()));
                            v.exits_per_s = Some(rate);
                            used = true;
                        }
                        if polling {
                            v.io_count = Some(saturating_u64(d.io.round()));
                        }
                    }
                    None if polling => (v.exits_per_s, v.io_count) = (None, None),
                    None => {}
                }
            }
            vm.exits_per_s = vm.vcpus.iter().map(|v| v.exits_per_s).sum();
            vm.io_count = vm.vcpus.iter().map(|v| v.io_count).sum();
        }
        if used {
            report.exits_source = "kvm-stats".into();
        } else if polling {
            report.exits_source = "unknown".into();
        }
    }

    /// Traced exits since the start, per vCPU thread and reason, named (`kvm_exit` reasons
    /// where the host emits them, else userspace exits and in-kernel evidence). Empty when
    /// polling.
    pub fn traced_exit_reasons(&self) -> Vec<(u32, String, u64)> {
        let mut rows: Vec<(u32, String, u64)> = match &self.source {
            Source::Kernel(k) => {
                let names = DecoderNames(k.decoder());
                let all = k.reasons();
                // As `Span::counted_reasons`: kvm_exit reasons where there are any, else the rest.
                let kvm_exit = all.iter().any(|(_, key, _)| key.is_kvm_exit());
                all.into_iter()
                    .filter(|(_, key, _)| key.is_kvm_exit() == kvm_exit)
                    .map(|(tid, key, n)| (tid, key.name(&names), n))
                    .collect()
            }
            Source::Trace(t) => {
                let names = DecoderNames(t.trace.decoder());
                t.acc.total().counted_reasons().map(|(tid, key, n)| (tid, key.name(&names), n)).collect()
            }
            Source::Polling(_) => return Vec::new(),
        };
        rows.sort();
        rows
    }

    /// Exit durations since the start, by reason (empty when polling, or where the host
    /// times no exits).
    pub fn exit_durations(&self) -> Vec<(String, Histogram)> {
        match &self.source {
            Source::Kernel(k) => {
                let names = DecoderNames(k.decoder());
                let mut named: Vec<(String, Histogram)> =
                    k.durations().iter().map(|(key, h)| (key.name(&names), h.clone())).collect();
                named.sort_by(|a, b| a.0.cmp(&b.0));
                named
            }
            Source::Trace(t) => t.exits.as_ref().map_or_else(Vec::new, |exits| {
                exits.durations(&DecoderNames(t.trace.decoder())).into_iter().map(|(r, h)| (r, h.clone())).collect()
            }),
            Source::Polling(_) => Vec::new(),
        }
    }

    /// Each vCPU's exits since it was created, from its KVM stats fd at the last refresh:
    /// (VMM pid, vCPU index) → exits. vCPUs whose stats are not readable are absent.
    pub fn kvm_exits_now(&self) -> BTreeMap<(u32, u32), u64> {
        self.stats_history
            .recent
            .back()
            .map(|(_, s)| s.iter().map(|(k, (exits, _))| (*k, *exits)).collect())
            .unwrap_or_default()
    }

    /// True when the figures come from the kernel's maps (eBPF).
    pub fn is_in_kernel(&self) -> bool {
        matches!(self.source, Source::Kernel(_))
    }

    /// True when polling schedstat and KVM stats instead of tracing.
    pub fn is_polling(&self) -> bool {
        matches!(self.source, Source::Polling(_))
    }

    /// How full the fullest CPU's trace buffer was at the last refresh (0 to 1; 0 when
    /// polling): what says when the next refresh is due.
    pub fn buffer_fill(&self) -> f64 {
        match &self.source {
            Source::Trace(t) => t.fill,
            Source::Kernel(_) | Source::Polling(_) => 0.0,
        }
    }

    /// The VMs as last discovered, with their vCPU threads.
    pub fn vms(&self) -> &[VmInfo] {
        &self.vms
    }

    /// Physical CPUs seen (for the per-CPU view).
    pub fn cpus(&self) -> Vec<u32> {
        match &self.source {
            Source::Trace(t) => t.trace.cpus(),
            Source::Kernel(_) | Source::Polling(_) => virtprof_trace::capture::online_cpus(),
        }
    }
}

impl TraceSource {
    fn start(durations: bool) -> anyhow::Result<TraceSource> {
        let extra: &[&str] = if durations { &DURATION_EVENTS } else { &[] };
        let events: Vec<&str> = EVENTS.iter().chain(extra).copied().collect();
        let trace = LiveTrace::start(&events, "mono", 4096, &["sched", "kvm"])?;
        let evidence = evidence_event_ids(trace.decoder());
        let exits = durations.then(|| {
            ExitAnalyzer::new(ExitOptions {
                evidence_events: evidence.clone(),
                host: virtprof_host::kind::detect(),
                ..Default::default()
            })
        });
        let acc = SchedAccounting::new(
            SchedOptions { bucket_ns: BUCKET_NS, keep_buckets: (HISTORY_NS / BUCKET_NS) as usize },
            evidence,
        );
        Ok(TraceSource { trace, acc, exits, fill: 0.0 })
    }

    /// Decode and account every page the kernel has, then close buckets up to `now`.
    fn drain(&mut self, now: u64) -> anyhow::Result<()> {
        self.fill = match &mut self.exits {
            Some(exits) => self.trace.drain_into(&mut [&mut self.acc, exits])?,
            None => self.trace.drain_into(&mut [&mut self.acc])?,
        };
        self.acc.roll_to(now);
        Ok(())
    }
}

impl PollSource {
    /// Read every vCPU's schedstat, timestamped when read (not when the refresh began: a
    /// slow /proc scan before it would otherwise count as blocked time).
    fn poll(&mut self, vms: &[VmInfo], files: &mut ProcFiles) {
        let now = monotonic_ns();
        let mut sample = PollSample { host: HostCpu::read(&mut self.stat), ..Default::default() };
        for vm in vms {
            for tid in vm.vcpus.iter().map(|v| v.tid.0) {
                let schedstat = PathBuf::from(format!("/proc/{}/task/{tid}/schedstat", vm.pid));
                if let Some(s) = files.schedstat(&schedstat) {
                    let cpu = proc_state(files, vm.pid.0, tid).map_or(0, |(cpu, _)| cpu);
                    sample.threads.insert(tid, (cpu, s));
                }
            }
        }
        self.history.push(now, sample);
    }

    /// Counters over the last `ns` from schedstat deltas: wait exactly, run with its share
    /// of the host's steal ([`HostCpu`]), executions from timeslices, blocked as the remainder
    /// of the window.
    fn span(&self, ns: u64) -> Span {
        let from = self.history.recent.back().map_or(0, |(end, _)| end.saturating_sub(ns));
        let Some(((start, earliest), (end, latest))) = self.history.window(from) else { return Span::default() };
        let mut span = Span { start_ns: *start, end_ns: *end, ..Default::default() };
        let steal_per_busy_ns = earliest.host.steal_per_busy_ns(latest.host);
        let window = end - start;
        for (tid, (cpu, now)) in &latest.threads {
            let then = earliest.threads.get(tid).map_or_else(Schedstat::default, |(_, s)| *s);
            let d = now.since(then);
            let stolen = saturating_u64(d.run_ns as f64 * steal_per_busy_ns);
            let run_ns = (d.run_ns + stolen).min(window.saturating_sub(d.wait_ns));
            let c = Counters {
                run_ns,
                wait_ns: d.wait_ns,
                blocked_ns: window.saturating_sub(run_ns + d.wait_ns),
                execs: d.timeslices,
                ..Default::default()
            };
            span.counters.insert((*tid, *cpu), c);
        }
        span
    }
}

/// `/proc` state of a thread: (the CPU it last ran on, whether it is runnable).
fn proc_state(files: &mut ProcFiles, pid: u32, tid: u32) -> Option<(u32, bool)> {
    let stat = files.task_stat(Path::new(&format!("/proc/{pid}/task/{tid}/stat")))?;
    Some((stat.cpu, stat.runnable))
}

/// Names in polling mode, where no reasons are counted.
struct NoNames;

impl virtprof_analysis::Names for NoNames {
    fn exit_reason(&self, reason: u32, _isa: u32) -> String {
        format!("reason {reason}")
    }
    fn userspace_reason(&self, reason: u32) -> String {
        format!("KVM_EXIT {reason}")
    }
    fn event(&self, id: u16) -> String {
        format!("event {id}")
    }
    fn task(&self, _id: virtprof_model::StrId) -> String {
        String::new()
    }
}

/// The most VMM threads other than vCPUs kept per VM once they have exited (QEMU's pool
/// threads come and go): enough for any VMM, bounded against one that churns threads.
const MAX_EXITED_VMM_THREADS: usize = 4096;

/// Threads a VM's VMM had before and no longer lists stay in its rows (their time stays
/// counted), so the run window's per-role figures never go down when a pool thread exits.
fn keep_exited_threads(vms: &mut [VmInfo], previous: &[VmInfo]) {
    for vm in vms {
        let Some(old) = previous.iter().find(|o| o.pid == vm.pid) else { continue };
        for t in &old.others {
            if !vm.others.contains(t) && vm.others.len() < MAX_EXITED_VMM_THREADS {
                vm.others.push(*t);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(run_ns: u64, wait_ns: u64, busy_ns: f64, steal_ns: f64) -> PollSample {
        PollSample {
            threads: BTreeMap::from([(7, (0, Schedstat { run_ns, wait_ns, timeslices: 1 }))]),
            host: HostCpu { busy_ns, steal_ns },
        }
    }

    /// One second polled: (run, wait, blocked) of a thread whose schedstat moved by
    /// `run_ns`/`wait_ns` while the host was busy `busy_ns` and lost `steal_ns` to steal.
    fn one_second(run_ns: u64, wait_ns: u64, busy_ns: f64, steal_ns: f64) -> (u64, u64, u64) {
        let mut poll = PollSource { history: History::new(), stat: None };
        poll.history.push(1_000_000_000, sample(0, 0, 0.0, 0.0));
        poll.history.push(2_000_000_000, sample(run_ns, wait_ns, busy_ns, steal_ns));
        let c = poll.span(1_000_000_000).counters[&(7, 0)];
        (c.run_ns, c.wait_ns, c.blocked_ns)
    }

    #[test]
    fn a_compute_thread_under_host_steal_runs_rather_than_blocks() {
        // The host lost 0.16 s to steal in 1.6 s busy, so 0.08 s of the thread's 0.8 s on a
        // CPU (as schedstat counts it, steal left out) was stolen: it ran 0.88 s.
        assert_eq!(one_second(800_000_000, 100_000_000, 1.6e9, 0.16e9), (880_000_000, 100_000_000, 20_000_000));
    }

    #[test]
    fn without_steal_figures_schedstat_run_time_is_kept() {
        assert_eq!(one_second(800_000_000, 100_000_000, 0.0, 0.0), (800_000_000, 100_000_000, 100_000_000));
    }

    #[test]
    fn the_steal_share_never_makes_run_and_wait_exceed_the_window() {
        assert_eq!(one_second(900_000_000, 100_000_000, 1.0e9, 1.0e9), (900_000_000, 100_000_000, 0));
    }
}
