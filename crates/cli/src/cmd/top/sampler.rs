//! Where `top`'s numbers come from. With tracefs: sched and kvm events from a private
//! instance, decoded and accounted as they arrive, plus the KVM stats fds for exact exit
//! counts. Without (or with `--no-trace`): schedstat and KVM stats polled each refresh, which
//! gives run, wait and executions exactly but blocked time only as the remainder, and no
//! allocation, I/O from the trace, or reasons.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::Path;

use serde::Serialize;
use virtprof_analysis::qos::{window_report, VmInfo, WindowReport};
use virtprof_analysis::sched::{Counters, SchedAccounting, SchedOptions, Span};
use virtprof_kvm::discover::{threads, Discovery};
use virtprof_kvm::remote::RemoteVmStats;
use virtprof_kvm::vmm::monotonic_ns;
use virtprof_kvm::vmm::Schedstat;
use virtprof_trace::capture::{Capture, CaptureConfig};
use virtprof_trace::decode::Decoder;
use virtprof_trace::merge::{merge_cpus, CpuStream};
use virtprof_trace::tracefs::{load_layout, Tracefs};

use crate::qos::HostTasks;
use crate::recording::{evidence_event_ids, DecoderNames};

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

/// One refresh's view: the windows `top` shows.
#[derive(Debug, Clone, Serialize)]
pub struct Snapshot {
    /// `trace` or `polling`.
    pub mode: &'static str,
    /// True in polling mode: blocked is a remainder, allocation and reasons are missing.
    pub approximate: bool,
    /// Events the kernel dropped (trace mode).
    pub lost_events: u64,
    /// Last 1 s, last 10 s, whole run.
    pub windows: Vec<WindowReport>,
}

/// (monotonic ns, (pid, vCPU index) → cumulative KVM stats exits and I/O exits).
type StatsSample = (u64, BTreeMap<(u32, u32), (u64, u64)>);

/// The live data source.
pub struct Sampler {
    discovery: Discovery,
    host: HostTasks,
    vms: Vec<VmInfo>,
    only: Vec<u32>,
    stats: HashMap<u32, Option<RemoteVmStats>>,
    stats_history: VecDeque<StatsSample>,
    source: Source,
    started_ns: u64,
    refreshes: u64,
}

enum Source {
    Trace(Box<TraceSource>),
    Polling(PollSource),
}

struct TraceSource {
    // Field order is drop order: the capture (and its tracefs instance) goes first.
    capture: Capture,
    decoder: Decoder,
    acc: SchedAccounting,
    total_lost: u64,
}

#[derive(Default)]
struct PollSource {
    /// The first sample (for the whole-run window).
    first: Option<PollSample>,
    /// Samples of the last [`HISTORY_NS`].
    history: VecDeque<PollSample>,
}

/// (monotonic ns, tid → (cpu, schedstat)).
type PollSample = (u64, BTreeMap<u32, (u32, Schedstat)>);

impl Sampler {
    /// Start sampling: tracing unless `no_trace` or tracefs is unusable (then polling, and the
    /// reason is returned for the user).
    pub fn start(only: Vec<u32>, no_trace: bool) -> anyhow::Result<(Sampler, Option<String>)> {
        let (source, why_polling) = if no_trace {
            (Source::Polling(PollSource::default()), Some("--no-trace".to_string()))
        } else {
            match TraceSource::start() {
                Ok(t) => (Source::Trace(Box::new(t)), None),
                Err(e) => (Source::Polling(PollSource::default()), Some(format!("tracing unavailable ({e:#})"))),
            }
        };
        let mut sampler = Sampler {
            discovery: Discovery::new("/proc", only.clone()),
            host: HostTasks::default(),
            vms: Vec::new(),
            only,
            stats: HashMap::new(),
            stats_history: VecDeque::new(),
            source,
            started_ns: monotonic_ns(),
            refreshes: 0,
        };
        sampler.refresh()?;
        Ok((sampler, why_polling))
    }

    /// Take in everything since the last refresh.
    pub fn refresh(&mut self) -> anyhow::Result<()> {
        let now = monotonic_ns();
        self.rediscover(now);
        match &mut self.source {
            Source::Trace(t) => t.drain(now)?,
            Source::Polling(p) => p.poll(now, &self.vms),
        }
        self.poll_kvm_stats(now);
        Ok(())
    }

    /// VMs and their vCPU threads now; new vCPU threads start being accounted.
    fn rediscover(&mut self, now: u64) {
        // Listing /proc costs a lookup per process: new VMs are looked for every few refreshes,
        // known ones (exits, late vCPU threads) on every one. Thread lists likewise: read for
        // new VMs and every few refreshes.
        let periodic = self.refreshes % RESCAN_EVERY == 0;
        self.refreshes += 1;
        let found = if periodic { self.discovery.scan() } else { self.discovery.rescan_known() };
        self.host.identities = found.iter().map(|v| (v.pid, (v.kind.to_string(), v.name.clone()))).collect();
        self.host.threads.retain(|_, (pid, _)| found.iter().any(|v| v.pid == *pid));
        for vm in &found {
            let known = self.host.threads.values().any(|(pid, _)| *pid == vm.pid);
            if periodic || !known {
                self.host.threads.retain(|_, (pid, _)| *pid != vm.pid);
                for (tid, comm) in threads(Path::new("/proc"), vm.pid) {
                    self.host.threads.insert(tid, (vm.pid, comm));
                }
            }
        }
        self.stats.retain(|pid, _| found.iter().any(|v| v.pid == *pid));
        let tracked: Vec<u32> = match &self.source {
            Source::Trace(t) => t.acc.tracked().collect(),
            Source::Polling(_) => Vec::new(),
        };
        self.vms = self.host.vms(&tracked, &self.only);
        if let Source::Trace(t) = &mut self.source {
            let tracked: std::collections::HashSet<u32> = t.acc.tracked().collect();
            for vm in &self.vms {
                for &(_, tid) in vm.vcpus.iter().filter(|(_, tid)| !tracked.contains(tid)) {
                    if let Some((cpu, running)) = proc_state(vm.pid, tid) {
                        t.acc.track_from_proc(tid, now, cpu, running);
                    }
                }
            }
        }
    }

    fn poll_kvm_stats(&mut self, now: u64) {
        let mut sample = BTreeMap::new();
        for vm in &self.vms {
            let stats = self.stats.entry(vm.pid).or_insert_with(|| RemoteVmStats::attach(vm.pid).ok());
            let Some(stats) = stats else { continue };
            for (index, fd) in &stats.vcpus {
                if let Ok(s) = fd.read() {
                    let io = s.get("io_exits").unwrap_or(0) + s.get("mmio_exits").unwrap_or(0);
                    sample.insert((vm.pid, *index), (s.get("exits").unwrap_or(0), io));
                }
            }
        }
        self.stats_history.push_back((now, sample));
        while self.stats_history.front().is_some_and(|(t, _)| now - t > HISTORY_NS) {
            self.stats_history.pop_front();
        }
    }

    /// The windows, for all CPUs or only `cpu`.
    pub fn snapshot(&self, cpu: Option<u32>) -> Snapshot {
        let (mode, approximate, lost, spans, names): (
            _,
            _,
            _,
            Vec<(Span, &str)>,
            Box<dyn virtprof_analysis::Names + '_>,
        ) = match &self.source {
            Source::Trace(t) => (
                "trace",
                false,
                t.total_lost,
                vec![(t.acc.last(SECOND), "1s"), (t.acc.last(10 * SECOND), "10s"), (t.acc.total().clone(), "run")],
                Box::new(DecoderNames(&t.decoder)),
            ),
            Source::Polling(p) => (
                "polling",
                true,
                0,
                vec![(p.span(SECOND), "1s"), (p.span(10 * SECOND), "10s"), (p.span(u64::MAX), "run")],
                Box::new(NoNames),
            ),
        };
        let windows = spans
            .iter()
            .map(|(span, label)| {
                let mut report = window_report(span, label, &self.vms, names.as_ref(), cpu);
                self.apply_kvm_stats(&mut report);
                report
            })
            .collect();
        Snapshot { mode, approximate, lost_events: lost, windows }
    }

    /// Exits per second from the KVM stats fds (exact on every host) where they are readable.
    fn apply_kvm_stats(&self, report: &mut WindowReport) {
        let Some((end_ns, latest)) = self.stats_history.back() else { return };
        // Windows are in the trace clock, which is CLOCK_MONOTONIC like the samples.
        let start = report.start_ns.max(self.started_ns);
        let Some((start_ns, earliest)) = sample_at(&self.stats_history, start) else { return };
        let seconds = (end_ns - start_ns) as f64 / 1e9;
        if seconds <= 0.0 {
            return;
        }
        let mut used = false;
        for vm in &mut report.vms {
            let mut vm_rate = 0.0;
            for v in &mut vm.vcpus {
                if let (Some(now), Some(then)) = (latest.get(&(vm.pid, v.index)), earliest.get(&(vm.pid, v.index))) {
                    v.exits = now.0 - then.0;
                    v.exits_per_s = v.exits as f64 / seconds;
                    used = true;
                }
                vm_rate += v.exits_per_s;
            }
            vm.exits_per_s = vm_rate;
        }
        if used {
            report.exits_source = "kvm-stats".into();
        }
    }

    /// Physical CPUs seen (for the per-CPU view).
    pub fn cpus(&self) -> Vec<u32> {
        match &self.source {
            Source::Trace(t) => t.capture.cpus(),
            Source::Polling(_) => virtprof_trace::capture::online_cpus(),
        }
    }
}

impl TraceSource {
    fn start() -> anyhow::Result<TraceSource> {
        let tracefs = Tracefs::locate_or_mount()?;
        let header_page = virtprof_trace::tracefs::read_file(&tracefs.root().join("events/header_page"))?;
        let page_size = virtprof_trace::format::parse_header_page(&header_page)?.page_size;
        let config =
            CaptureConfig { events: EVENTS.map(String::from).to_vec(), buffer_size_kb: 4096, clock: "mono".into() };
        let (capture, _missing) = Capture::start(&tracefs, &config, page_size)?;
        let decoder = Decoder::new(load_layout(tracefs.root(), &["sched", "kvm"])?);
        let evidence = evidence_event_ids(&decoder);
        let acc = SchedAccounting::new(
            SchedOptions { bucket_ns: BUCKET_NS, keep_buckets: (HISTORY_NS / BUCKET_NS) as usize },
            evidence,
        );
        Ok(TraceSource { capture, decoder, acc, total_lost: 0 })
    }

    /// Decode and account every page the kernel has, then close buckets up to `now`.
    fn drain(&mut self, now: u64) -> anyhow::Result<()> {
        let mut batches: Vec<(u32, Vec<u8>)> = Vec::new();
        while self.capture.poll(256, |cpu, pages| batches.push((cpu, pages)))? > 0 {}
        let streams: Vec<CpuStream<'_>> = batches.iter().map(|(cpu, raw)| CpuStream::contiguous(*cpu, raw)).collect();
        let acc = &mut self.acc;
        let stats = merge_cpus(&mut self.decoder, &streams, |e, _| acc.on_event(e))?;
        let kernel_lost: u64 = self.capture.loss().iter().map(|l| l.overrun + l.dropped).sum();
        self.total_lost = self.total_lost.max(kernel_lost).max(stats.lost);
        self.acc.roll_to(now);
        Ok(())
    }
}

impl PollSource {
    fn poll(&mut self, now: u64, vms: &[VmInfo]) {
        let mut sample = BTreeMap::new();
        for vm in vms {
            for &(_, tid) in &vm.vcpus {
                let base = format!("/proc/{}/task/{tid}", vm.pid);
                let stat = std::fs::read_to_string(format!("{base}/schedstat")).ok();
                if let Some(s) = stat.as_deref().and_then(Schedstat::parse) {
                    let cpu = proc_state(vm.pid, tid).map_or(0, |(cpu, _)| cpu);
                    sample.insert(tid, (cpu, s));
                }
            }
        }
        if self.first.is_none() {
            self.first = Some((now, sample.clone()));
        }
        self.history.push_back((now, sample));
        while self.history.front().is_some_and(|(t, _)| now - t > HISTORY_NS) {
            self.history.pop_front();
        }
    }

    /// Counters over the last `ns` from schedstat deltas: run and wait exactly, executions
    /// from timeslices, blocked as the remainder of the window.
    fn span(&self, ns: u64) -> Span {
        let Some((end, latest)) = self.history.back() else { return Span::default() };
        let from = end.saturating_sub(ns);
        let earliest = if ns == u64::MAX { self.first.as_ref() } else { sample_at(&self.history, from) };
        let Some((start, earliest)) = earliest else { return Span::default() };
        let mut span = Span { start_ns: *start, end_ns: *end, ..Default::default() };
        for (tid, (cpu, now)) in latest {
            let then = earliest.get(tid).map_or_else(Schedstat::default, |(_, s)| *s);
            let d = now.since(then);
            let window = end - start;
            let c = Counters {
                run_ns: d.run_ns,
                wait_ns: d.wait_ns,
                blocked_ns: window.saturating_sub(d.run_ns + d.wait_ns),
                execs: d.timeslices,
                ..Default::default()
            };
            span.counters.insert((*tid, *cpu), c);
        }
        span
    }
}

/// The latest sample taken at or before `ts` (else the oldest kept): the start of a window
/// ending at the newest sample, as close to the nominal width as the refreshes allow.
fn sample_at<T>(history: &VecDeque<(u64, T)>, ts: u64) -> Option<&(u64, T)> {
    history.iter().rev().find(|(t, _)| *t <= ts).or_else(|| history.front())
}

/// `/proc` state of a thread: (the CPU it last ran on, whether it is runnable).
fn proc_state(pid: u32, tid: u32) -> Option<(u32, bool)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the comm: state is field 3 (index 0 here), processor is field 39 (index 36).
    let running = fields.first()? == &"R";
    let cpu = fields.get(36)?.parse().ok()?;
    Some((cpu, running))
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
