//! The recorder behind `virtprof record` and the live modes: capture raw trace pages from a
//! private tracefs instance into a recording (a file, or memory). The main thread reads pages; a writer thread behind a bounded channel writes them,
//! so memory stays bounded whatever the duration (a slow disk shows up as kernel-side loss,
//! which is reported, never hidden). With `--interval`, a third thread samples counters
//! per interval ([`intervals`]) into the same writer.

mod agents;
mod intervals;
mod vm_scans;

use std::collections::BTreeMap;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::sync_channel;
use std::sync::Arc;
use std::time::{Duration, Instant};

use virtprof_host::output::{OutputFile, Privacy};
use virtprof_host::stop::STOP_REQUESTED;
use virtprof_kvm::discover::{DiscoveredVm, Discovery};
use virtprof_kvm::remote::RemoteVmStats;
use virtprof_model::kernel_hist::KernelExitHists;
use virtprof_store::recording::{
    AgentRecord, Footer, FormatText, IntervalEncoder, IntervalSchema, IntervalStats, KvmStatsSnapshot, Metadata, Task,
    TasksFound, VmIdentity, Writer,
};
use virtprof_trace::buffer_sizing::Sizing;
use virtprof_trace::capture::{Capture, CaptureConfig};
use virtprof_trace::tracefs::{format_texts, Tracefs};

use crate::usage;

/// Batches in flight between reader and writer: at most this × 64 pages (16 MiB) buffered.
const CHANNEL_BATCHES: usize = 64;
/// How soon the reader rescans /proc for new threads and VMs after it last found some
/// (short-lived VMs come and go); each scan that finds nothing doubles the wait, up to
/// [`TASK_SCAN_AT_MOST`]. A full scan reads every thread's name and every process's fds:
/// at a fixed 50 ms it was most of record's own CPU time (4% of a CPU on an idle host).
/// Threads that come and go between scans are still named by the kernel's saved_cmdlines
/// and saved_tgids, read at the end; a VM must live through one scan to be identified, so
/// the longest wait stays short.
const TASK_SCAN: Duration = Duration::from_millis(50);
const TASK_SCAN_AT_MOST: Duration = Duration::from_millis(250);

/// What the writer thread writes.
pub enum WriterMsg {
    /// Raw pages of one CPU.
    Pages(u32, Vec<u8>),
    /// The interval columns from here on.
    Schema(IntervalSchema),
    /// A batch of interval rows.
    Rows(IntervalEncoder),
    /// What a guest agent's link recorded.
    Agent(AgentRecord),
    /// One guest row: agent, guest start and end, values.
    AgentRow(u32, u64, u64, Vec<f64>),
    /// One period of a guest's noise loop: agent, period.
    AgentNoise(u32, Box<virtprof_model::guest::NoiseBatch>),
    /// Threads and VMs a scan found.
    Tasks(TasksFound),
}

/// What a finished recording holds.
pub struct RecordSummary {
    pub pages: u64,
    pub bytes: u64,
    pub lost: u64,
    pub cpus: usize,
    pub missing_events: Vec<String>,
    pub intervals: IntervalStats,
    pub command_status: Option<std::process::ExitStatus>,
    /// The per-CPU buffers' size, and the rate it was fitted to.
    pub buffer: Sizing,
    /// Each guest agent's link figures.
    pub agents: Vec<virtprof_store::recording::AgentFooter>,
    /// What the kernel's hist triggers counted ([`RecordOptions::kernel_exit_hist`]), or why
    /// they could not be read.
    pub kernel_exit_hists: Option<Result<KernelExitHists, String>>,
}

/// Per-CPU ring buffer size when none is asked for.
pub const DEFAULT_BUFFER_KB: u32 = 8192;
/// The trace clock when none is asked for: aligns traces with CLOCK_MONOTONIC.
pub const DEFAULT_CLOCK: &str = "mono";
/// Hardware counters the PMU runs at once, when not told.
pub const DEFAULT_HW_COUNTERS: usize = 4;

/// What to record: `record`'s options as plain values, for `record` and the live modes.
#[derive(Debug, Clone)]
pub struct RecordOptions {
    /// Events (systems or system:event); the default set when empty.
    pub events: Vec<String>,
    /// Stop after this long.
    pub duration: Option<Duration>,
    /// Per-CPU ring buffer size (the least, with `fit_buffer_to_rate`).
    pub buffer_size_kb: u32,
    /// Grow the buffers to hold seconds of the event rate seen as the recording starts.
    pub fit_buffer_to_rate: bool,
    /// Trace clock.
    pub clock: String,
    /// VMMs whose KVM stats must be snapshotted.
    pub vm: Vec<u32>,
    /// Snapshot every VM's KVM stats at the start and the end (false: none at all).
    pub kvm_stats: bool,
    /// Sample counters every this many ns.
    pub interval_ns: Option<u64>,
    /// Counters sampled per interval (the built-in set when None).
    pub counters: Option<Vec<virtprof_interval::counters::CounterSpec>>,
    /// Hardware counters at once.
    pub hw_counters: usize,
    /// Record until this command exits.
    pub command: Vec<String>,
    /// Guest agents to connect to, each with its token.
    pub agents: Vec<(virtprof_agent::transport::Address, Option<String>)>,
    /// What each agent's guest may send (its byte cap is per recording).
    pub agent_limits: virtprof_agent::limits::GuestLimits,
    /// How long to wait for the agents to answer before the trace starts (none: start now).
    pub agent_wait: Duration,
    /// Have the kernel's hist triggers time every exit on the trace's own timestamps too
    /// (`exits --kernel-hist`, `record --kernel-hist`; kept in the footer): refused where the
    /// kernel has none.
    pub kernel_exit_hist: bool,
    /// Said on stderr once tracing is on (a live command's "recording for ..."): whoever
    /// waits for it may start what it wants traced.
    pub started_message: Option<String>,
}

impl Default for RecordOptions {
    fn default() -> Self {
        RecordOptions {
            events: Vec::new(),
            duration: None,
            buffer_size_kb: DEFAULT_BUFFER_KB,
            fit_buffer_to_rate: false,
            clock: DEFAULT_CLOCK.into(),
            vm: Vec::new(),
            kvm_stats: true,
            interval_ns: None,
            counters: None,
            hw_counters: DEFAULT_HW_COUNTERS,
            command: Vec::new(),
            agents: Vec::new(),
            agent_limits: virtprof_agent::limits::GuestLimits::default(),
            agent_wait: Duration::ZERO,
            kernel_exit_hist: false,
            started_message: None,
        }
    }
}

/// What [`record_into`] gives back.
pub struct Recorded<W> {
    pub summary: RecordSummary,
    /// The output: finished, or without its footer after `write_error`.
    pub out: W,
    /// Writing failed (a full disk): what was written before is in `out`, and the
    /// capture stopped at once.
    pub write_error: Option<std::io::Error>,
}

/// Refuse `--kernel-hist` (a usage error saying why) where the kernel cannot keep exit
/// histograms, or where `events` (empty: the default set) leave out kvm_exit or kvm_entry.
pub fn check_kernel_exit_hist(events: &[String]) -> anyhow::Result<()> {
    let tracefs = Tracefs::locate_or_mount().map_err(|e| usage(e.to_string()))?;
    if let Some(why) = virtprof_trace::exit_hist::unavailable(&tracefs) {
        return Err(usage(format!("--kernel-hist: {why}; without it, exits are timed from the trace alone")));
    }
    let traced = |event: &str| events.is_empty() || events.iter().any(|e| e == "kvm" || e == event);
    if !traced("kvm:kvm_exit") || !traced("kvm:kvm_entry") {
        return Err(usage(
            "--kernel-hist with --events: the events must include kvm:kvm_exit and kvm:kvm_entry (or kvm)",
        ));
    }
    Ok(())
}

/// Record into the file `output`, created 0600 like perf.data (traces hold process names,
/// command lines and kernel addresses) under a temporary name until it is whole; a refused
/// run leaves nothing behind. When the disk fills, what was written is kept and said.
pub fn record(options: &RecordOptions, output: &Path) -> anyhow::Result<RecordSummary> {
    // Before the temporary file exists: a stop from here on ends the run through its clean-up.
    virtprof_host::stop::install_handler();
    let mut file = OutputFile::create(output, Privacy::Private)?;
    // A recording killed with SIGKILL is still one, cut short: kept under its name.
    file.keep_if_killed();
    let recorded = record_into(options, BufWriter::with_capacity(1 << 20, file))?;
    let Some(cause) = recorded.write_error else {
        recorded.out.into_inner().map_err(|e| e.into_error())?.commit()?;
        return Ok(recorded.summary);
    };
    let (file, _unwritten) = recorded.out.into_parts();
    let kept = file.keep_partial()?;
    Err(anyhow::Error::new(cause).context(format!(
        "recording cut short: kept {:.1} MiB ({} pages) in '{}', readable up to its last whole chunk",
        kept as f64 / (1 << 20) as f64,
        recorded.summary.pages,
        output.display()
    )))
}

/// Record into `out` (a file, or memory for the live modes), returning it when finished.
pub fn record_into<W: Write + Send + 'static>(options: &RecordOptions, out: W) -> anyhow::Result<Recorded<W>> {
    let duration = options.duration;
    let events = if options.events.is_empty() { CaptureConfig::default_events() } else { options.events.clone() };
    let interval_ns = options.interval_ns;
    let tracefs = Tracefs::locate_or_mount().map_err(|e| usage(format!("{e}")))?;
    let header_path = tracefs.root().join("events/header_page");
    let header_page = virtprof_trace::tracefs::read_file(&header_path)
        .map_err(|e| virtprof_trace::TraceError::File { path: header_path, source: e })?;
    let page_size = virtprof_trace::format::parse_header_page(&header_page)?.page_size;
    let config = CaptureConfig {
        events,
        buffer_size_kb: options.buffer_size_kb,
        fit_to_rate: options.fit_buffer_to_rate,
        clock: options.clock.clone(),
        exit_hist: options.kernel_exit_hist,
    };

    for &pid in &options.vm {
        if kvm_snapshot(pid).is_none() {
            return Err(usage(format!(
                "--vm {pid}: not a VMM whose KVM stats can be read (see `virtprof stats --pid {pid}`)"
            )));
        }
    }
    // Snapshots before tracing starts (and after it stops), so their window encloses the trace.
    let mut discovery = Discovery::new("/proc", Vec::new());
    let found = discovery.scan();
    let mut vms = options.vm.clone();
    vms.extend(found.iter().map(|v| v.pid).filter(|p| !options.vm.contains(p)));
    let mut identities: BTreeMap<u32, VmIdentity> = found.iter().map(|v| (v.pid, identity(v))).collect();
    let mut held = HeldStats::new(options.kvm_stats);
    held.observe(&found);
    held.attach(&options.vm);
    let kvm_stats = held.snapshots();
    virtprof_host::stop::install_handler();
    // Guests first, as trace-cmd's agents are: a guest that answers slowly (a loaded or
    // emulated host) must not miss the run. What links receive before the writer starts
    // waits in the channel.
    let (tx, rx) = sync_channel::<WriterMsg>(CHANNEL_BATCHES);
    let links = agents::Links::start(&options.agents, options.agent_limits, &tx)?;
    if !options.agents.is_empty() && !options.agent_wait.is_zero() {
        for address in links.wait_connected(options.agent_wait, &STOP_REQUESTED) {
            if virtprof_host::stop::requested() {
                eprintln!("virtprof: stopped while waiting for agent {address}");
                continue;
            }
            eprintln!(
                "virtprof: agent {address} did not answer within {}; recording without it until it does (the gap is in the recording)",
                virtprof_model::units::format_duration_ns(u64::try_from(options.agent_wait.as_nanos()).unwrap_or(u64::MAX))
            );
        }
    }
    let (mut capture, missing_events) = Capture::start(&tracefs, &config, page_size)?;
    links.trace_started();
    if let Some(message) = &options.started_message {
        eprintln!("{message}");
    }
    let systems: Vec<&str> = capture.systems.iter().map(String::as_str).collect();
    let formats =
        format_texts(tracefs.root(), &systems)?.into_iter().map(|(system, text)| FormatText { system, text }).collect();
    let mut tasks = scan_tasks();
    let mut host = host_facts();
    host.insert("buffer_size_kb".into(), capture.sizing.kb.to_string());
    if let Some(rate) = capture.sizing.busiest_bytes_per_s {
        host.insert("buffer_fitted_to_bytes_per_s".into(), rate.to_string());
    }
    let metadata = Metadata {
        origin: "virtprof record".into(),
        trace_clock: config.clock.clone(),
        header_page,
        formats,
        events: Some(capture.events.clone()),
        cpus: capture.cpus(),
        host,
        tasks: tasks.values().cloned().collect(),
        vms: vms.clone(),
        kvm_stats,
        vm_identities: identities.values().cloned().collect(),
        ..Default::default()
    };

    let mut writer = Writer::new(out, &metadata)?;
    // On disk at once, not when the buffer fills: a recording killed from here on is kept by
    // the reaper as one that reads (its metadata, then whatever chunks came before the kill).
    writer.flush()?;
    let writer_failed = Arc::new(AtomicBool::new(false));
    let writer_thread = std::thread::Builder::new().name("virtprof-writer".into()).spawn({
        let writer_failed = writer_failed.clone();
        move || {
            let mut writer = writer;
            let mut pages = 0u64;
            let mut failure = None;
            for msg in rx {
                // After a failure, keep receiving (and dropping) so no sender blocks while
                // the capture stops.
                if failure.is_some() {
                    continue;
                }
                let written = match msg {
                    WriterMsg::Pages(cpu, data) => {
                        writer.pages(cpu, &data).map(|()| pages += (data.len() / page_size) as u64)
                    }
                    WriterMsg::Schema(schema) => writer.interval_schema(&schema),
                    WriterMsg::Rows(rows) => writer.intervals(&rows),
                    WriterMsg::Agent(record) => writer.agent(&record),
                    WriterMsg::AgentRow(agent, start, end, values) => writer.agent_row(agent, start, end, &values),
                    WriterMsg::AgentNoise(agent, batch) => writer.agent_noise(agent, &batch),
                    WriterMsg::Tasks(found) => writer.tasks(&found),
                };
                if let Err(e) = written {
                    failure = Some(e);
                    writer_failed.store(true, Ordering::Relaxed);
                }
            }
            (writer, pages, failure)
        }
    })?;
    let interval_thread = match interval_ns {
        Some(ns) => Some(intervals::IntervalThread::start(
            ns,
            options.counters.clone(),
            options.hw_counters,
            tracefs.root(),
            tx.clone(),
        )?),
        None => None,
    };

    let mut child = match options.command.split_first() {
        Some((program, rest)) => {
            let mut command = Command::new(program);
            // Killed with SIGKILL, record can pass on no signal: the kernel sends the command
            // SIGTERM instead, as for any other way record ends.
            virtprof_host::stop::die_with_parent(&mut command);
            Some(command.args(rest).spawn().map_err(|e| usage(format!("cannot run '{program}': {e}")))?)
        }
        None => None,
    };
    let started = Instant::now();
    let mut last_scan = Instant::now();
    let mut scan_every = TASK_SCAN;
    let mut command_status = None;
    let result = capture.run(
        &STOP_REQUESTED,
        || {
            if last_scan.elapsed() >= scan_every {
                // Written as found, not only in the footer: a recording cut short still says
                // whose threads its events are.
                let scanned = discovery.scan();
                held.observe(&scanned);
                let found = TasksFound {
                    tasks: scan_tasks().into_values().filter(|t| tasks.get(&t.tid) != Some(t)).collect(),
                    vm_identities: scanned.iter().map(identity).filter(|v| identities.get(&v.pid) != Some(v)).collect(),
                };
                last_scan = Instant::now();
                if found.tasks.is_empty() && found.vm_identities.is_empty() {
                    scan_every = (scan_every * 2).min(TASK_SCAN_AT_MOST);
                } else {
                    scan_every = TASK_SCAN;
                    tasks.extend(found.tasks.iter().map(|t| (t.tid, t.clone())));
                    identities.extend(found.vm_identities.iter().map(|v| (v.pid, v.clone())));
                    let _ = tx.send(WriterMsg::Tasks(found));
                }
            }
            if let Some(c) = child.as_mut() {
                if let Ok(Some(status)) = c.try_wait() {
                    command_status = Some(status);
                    return true;
                }
            }
            writer_failed.load(Ordering::Relaxed) || duration.is_some_and(|d| started.elapsed() >= d)
        },
        |cpu, pages| {
            // A full channel blocks here; the kernel buffer absorbs the stall or counts loss.
            let _ = tx.send(WriterMsg::Pages(cpu, pages));
        },
    );
    if let Some(mut c) = child {
        if command_status.is_none() {
            command_status = Some(stop_command(&mut c)?);
        }
    }
    // What the file does not hold yet (the metadata and the tasks chunks hold the rest): the
    // threads and VMs the last scan finds new or changed, written once, in the footer.
    let mut late_tasks: BTreeMap<u32, Task> =
        scan_tasks().into_iter().filter(|(tid, t)| tasks.get(tid) != Some(t)).collect();
    let at_end = discovery.scan();
    let late_vms: Vec<VmIdentity> = at_end.iter().map(identity).filter(|v| identities.get(&v.pid) != Some(v)).collect();
    held.observe(&at_end);
    let end_stats = held.snapshots();
    drop(held);
    // Threads that came and went between scans: the kernel's own tid → tgid/comm cache.
    for (tid, pid, comm) in virtprof_trace::capture::saved_tasks(&tracefs) {
        if !tasks.contains_key(&tid) {
            late_tasks.entry(tid).or_insert(Task { tid, pid, comm });
        }
    }
    let loss = capture.loss();
    let buffer = capture.sizing;
    let kernel_exit_hists = capture.exit_hists().map(|r| r.map_err(|e| e.to_string()));
    capture.close();
    let intervals = match interval_thread {
        Some(thread) => thread.finish()?,
        None => IntervalStats::default(),
    };
    let agents = links.finish()?;
    drop(tx);
    result?;
    let (writer, pages, write_error) = writer_thread.join().map_err(|_| anyhow::anyhow!("writer thread panicked"))?;
    // The figure every reading command will report for this file (sums saturate).
    let mut kernel_loss = virtprof_model::Loss::default();
    for counters in &loss {
        kernel_loss.report_counters(counters);
    }
    let lost = kernel_loss.total();
    let footer = Footer {
        cpu_loss: loss,
        pages,
        duration_ns: u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX),
        tasks: late_tasks.into_values().collect(),
        kvm_stats: end_stats,
        vm_identities: late_vms,
        intervals,
        agents,
        guest: None,
        kernel_exit_hists: kernel_exit_hists.clone().and_then(Result::ok),
        kernel_exit_hists_unreadable: kernel_exit_hists.clone().and_then(Result::err),
    };
    let bytes = writer.written();
    let summary = RecordSummary {
        pages,
        bytes,
        lost,
        cpus: footer.cpu_loss.len(),
        missing_events,
        intervals,
        command_status,
        buffer,
        agents: footer.agents.clone(),
        kernel_exit_hists,
    };
    if let Some(e) = write_error {
        return Ok(Recorded { summary, out: writer.abandon(), write_error: Some(e) });
    }
    let out = writer.finish(&footer)?;
    Ok(Recorded { summary, out, write_error: None })
}

/// How long `record -- CMD` lets the command end after passing on a stop signal.
const COMMAND_GRACE: Duration = Duration::from_secs(2);

/// End `record -- CMD`'s command when the recording stops before it exits: pass on the signal
/// that stopped us (a `kill` aimed at virtprof alone would otherwise leave it running), give
/// it [`COMMAND_GRACE`], then kill it; reap it either way.
fn stop_command(child: &mut std::process::Child) -> anyhow::Result<std::process::ExitStatus> {
    let signal = virtprof_host::stop::signal().unwrap_or(libc::SIGTERM);
    // SAFETY: kill on our own child's pid, not yet reaped (so the pid is still ours).
    unsafe { libc::kill(child.id() as libc::pid_t, signal) };
    let deadline = Instant::now() + COMMAND_GRACE;
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.kill()?;
    Ok(child.wait()?)
}

/// What a recording (and `top`) keeps of a discovered VM.
pub fn identity(vm: &DiscoveredVm) -> VmIdentity {
    VmIdentity { pid: vm.pid, kind: vm.kind.to_string(), name: vm.name.clone(), owner: vm.owner.clone() }
}

/// The KVM binary stats of one VMM now (None if it holds no readable stats fds).
fn kvm_snapshot(pid: u32) -> Option<KvmStatsSnapshot> {
    virtprof_kvm::remote::RemoteVmStats::attach(pid).ok().map(|remote| snapshot(&remote))
}

fn snapshot(remote: &RemoteVmStats) -> KvmStatsSnapshot {
    let vm = remote.vm.as_ref().and_then(|s| s.read().ok()).map(|s| s.values).unwrap_or_default();
    let vcpus = remote.vcpus.iter().filter_map(|(i, s)| Some((*i, s.read().ok()?.values))).collect();
    KvmStatsSnapshot { pid: remote.pid, monotonic_ns: virtprof_host::monotonic_ns(), vm, vcpus }
}

/// VMs whose stats fds a recording holds at most (each holds its VM's KVM structures, not
/// its memory, until the recording ends).
const MAX_HELD_VMS: usize = 4096;

/// The KVM stats fds of every VM the recording found, held from when it was found to the
/// end: a VM that starts during the recording and ends before it (`record -- testvm`) still
/// gives its final counts, since a stats fd keeps its VM's counters alive after the VMM
/// exits. Its counts from its start are then exact: a VM born during the recording starts at
/// zero.
struct HeldStats {
    enabled: bool,
    vms: BTreeMap<u32, RemoteVmStats>,
}

impl HeldStats {
    fn new(enabled: bool) -> HeldStats {
        HeldStats { enabled, vms: BTreeMap::new() }
    }

    /// Hold the stats of VMs found now; again for one with more vCPUs than its stats held
    /// (found between creating its VM and its vCPUs).
    fn observe(&mut self, found: &[DiscoveredVm]) {
        let stale: Vec<u32> = found
            .iter()
            .filter(|vm| self.vms.get(&vm.pid).is_none_or(|held| held.vcpus.len() < vm.vcpu_fds as usize))
            .map(|vm| vm.pid)
            .collect();
        self.attach(&stale);
    }

    fn attach(&mut self, pids: &[u32]) {
        for &pid in pids {
            let room = self.vms.len() < MAX_HELD_VMS || self.vms.contains_key(&pid);
            if !self.enabled || !room {
                continue;
            }
            if let Ok(remote) = RemoteVmStats::attach(pid) {
                self.vms.insert(pid, remote);
            }
        }
    }

    fn snapshots(&self) -> Vec<KvmStatsSnapshot> {
        self.vms.values().map(snapshot).collect()
    }
}

/// Every thread on the host: tid → (pid, comm).
fn scan_tasks() -> BTreeMap<u32, Task> {
    virtprof_host::procfs::all_threads(Path::new("/proc"))
        .into_iter()
        .map(|(tid, pid, comm)| (tid, Task { tid, pid, comm }))
        .collect()
}

fn host_facts() -> BTreeMap<String, String> {
    let mut host = BTreeMap::new();
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    host.insert("kernel".into(), release.trim().to_string());
    // The same probe doctor uses, so a recording and doctor never disagree on the kind.
    let kind = virtprof_host::kind::detect();
    host.insert("host_kind".into(), kind.map_or("none", |k| k.as_str()).to_string());
    host.insert("cpus".into(), virtprof_trace::capture::online_cpus().len().to_string());
    // Which host and when: the partition a fleet dataset files the recording under.
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    host.insert("hostname".into(), hostname.trim().to_string());
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    host.insert("started_unix_ns".into(), now.as_nanos().to_string());
    host
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scans_this_process_threads() {
        let tasks = scan_tasks();
        let me = std::process::id();
        assert!(tasks.get(&me).is_some_and(|t| t.pid == me && !t.comm.is_empty()));
    }
}
