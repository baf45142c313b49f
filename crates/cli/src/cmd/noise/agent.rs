//! `noise --host-recording FILE` for a real guest: the samples a guest's agent measured
//! (`agent --noise CPUS`, recorded by `record --agent`), placed on the host's clock with that
//! agent's measured alignment and explained by the host's trace of the vCPU thread that ran
//! each guest CPU: preempted (steal), a VM exit, a host IRQ or softirq, or nothing the host saw.

use std::collections::HashSet;
use std::path::Path;

use serde::Serialize;
use virtprof_analysis::noise::{HostCause, HostView};
use virtprof_analysis::Names;
use virtprof_kvm::discover::{vcpu_index, vmm_kind};
use virtprof_model::event::{Event, EventKind};
use virtprof_model::guest::{NoiseSummary, SeriesKind};
use virtprof_model::vmm::VmmKind;
use virtprof_session::guest::GuestStream;
use virtprof_session::Session;
use virtprof_sinks::table::UNKNOWN;

use super::explain::Explanation;
use super::trace::{missing, EVENTS, HOST_EVENTS};
use crate::exit::usage;
use virtprof_engine::pass::recording_tasks;

/// What `noise --host-recording` reports for agents' samples.
#[derive(Debug, Serialize)]
pub struct AgentNoiseReport {
    pub kind: &'static str,
    pub guests: Vec<GuestNoise>,
    pub lost_events: u64,
    pub missing_events: Vec<String>,
}

/// One guest's samples.
#[derive(Debug, Serialize)]
pub struct GuestNoise {
    pub agent: u32,
    pub name: String,
    /// The VM the agent ran in: VMM pid and name.
    pub vm_pid: u32,
    pub vm: String,
    /// The clock alignment's median and largest error bound.
    pub median_bound_ns: u64,
    pub max_bound_ns: u64,
    pub cpus: Vec<CpuNoise>,
}

/// One guest CPU's samples and the host's account of them.
#[derive(Debug, Serialize)]
pub struct CpuNoise {
    pub cpu: u32,
    /// The host thread of that vCPU.
    pub vcpu_tid: u32,
    pub threshold_ns: u64,
    /// The periods received, summed.
    #[serde(flatten)]
    pub noise: NoiseSummary,
    /// Share of measured time the loop ran, %.
    pub available_pct: f64,
    /// Samples that could not be placed on the host's clock (no clock point).
    pub unplaced_samples: u64,
    /// Samples placed before the trace's first event or after its last: not explained.
    pub outside_trace_samples: u64,
    /// The guest's own steal for that CPU over the whole recording (/proc/stat, 10 ms ticks).
    pub guest_steal_ns: Option<u64>,
    /// The host's account of the samples.
    #[serde(flatten)]
    pub host: Explanation,
}

/// Explain every agent's noise samples in `recording`, on `vm` if given.
pub fn run(recording: &Path, vm: Option<&str>) -> anyhow::Result<AgentNoiseReport> {
    let session = Session::open_warning(recording, &Default::default())?;
    if session.metadata.trace_clock != "mono" {
        return Err(usage(format!(
            "--host-recording: traced on the '{}' clock; agents are aligned to CLOCK_MONOTONIC (record with --clock mono, the default)",
            session.metadata.trace_clock
        )));
    }
    let noisy: Vec<&GuestStream> = session.guests.iter().filter(|g| !g.noise.is_empty()).collect();
    if noisy.is_empty() {
        return Err(usage(format!(
            "--host-recording '{}': no guest noise samples in it. Run `virtprof agent --noise CPUS` in the guest and `virtprof record --agent ADDR` on the host, or give --guest REPORT for a testvm run",
            recording.display()
        )));
    }
    let vms = vms_of(&session);
    // Each agent's candidate VMs: those with a thread for every guest CPU it measured (the
    // recording may also name VMs long gone, from the kernel's saved command lines).
    let mut candidates = Vec::new();
    for g in &noisy {
        let cpus = g.noise.cpus();
        let fits: Vec<(&GuestVm, Vec<(u32, u32)>)> = vms
            .iter()
            .filter(|v| vm.is_none_or(|w| v.name == w || v.pid.to_string() == w))
            .filter_map(|v| {
                let threads: Option<Vec<(u32, u32)>> =
                    cpus.iter().map(|&cpu| v.vcpus.iter().find(|t| t.0 == cpu).map(|t| (cpu, t.1))).collect();
                Some((v, threads?))
            })
            .collect();
        if fits.is_empty() {
            return Err(usage(no_vm(&vms, vm, &cpus)));
        }
        candidates.push((*g, fits));
    }
    let mut decoder = session.decoder(&["kvm", "sched", "irq", "irq_vectors", "nmi"])?;
    let missing_events = missing(&decoder, &[EVENTS.as_slice(), HOST_EVENTS.as_slice()].concat());
    let tids: HashSet<u32> =
        candidates.iter().flat_map(|(_, fits)| fits.iter().flat_map(|(_, t)| t.iter().map(|&(_, tid)| tid))).collect();
    // The vCPU threads' events and host interrupts: the rest of a long recording is skipped.
    let mut events = Vec::new();
    // What the trace covers: a sample outside it (the agent's first period began before the
    // trace did, or its last ended after) has no host events to explain it, which is not the
    // same as a host that saw nothing.
    let mut span = (u64::MAX, 0u64);
    let mut keep = |e: &Event, _: &dyn Names| {
        span = (span.0.min(e.ts), span.1.max(e.ts));
        let wanted = match e.kind {
            EventKind::SchedSwitch { prev_tid, next_tid, .. } => tids.contains(&prev_tid) || tids.contains(&next_tid),
            EventKind::IrqEntry { .. } | EventKind::IrqVectorEntry { .. } | EventKind::SoftirqEntry { .. } => true,
            _ => tids.contains(&e.tid),
        };
        if wanted {
            events.push(*e);
        }
    };
    let stats = session.analyse(&mut decoder, &mut [&mut keep])?;
    let lost_events = session.loss(&stats).total();
    events.sort_by_key(|e| e.ts);
    let active: HashSet<u32> = events
        .iter()
        .flat_map(|e| match e.kind {
            EventKind::SchedSwitch { prev_tid, next_tid, .. } => [prev_tid, next_tid],
            _ => [e.tid, e.tid],
        })
        .collect();
    let mut targets = Vec::new();
    for (g, fits) in candidates {
        // The VM whose threads ran while it was recorded; several: the one named after the guest.
        let running: Vec<_> = fits.into_iter().filter(|(_, t)| t.iter().all(|(_, tid)| active.contains(tid))).collect();
        let chosen = match running.as_slice() {
            [one] => one,
            [] => return Err(usage(format!(
                "--host-recording: no VM whose vCPU threads ran in the recording has the CPUs agent {} measured; record while the guest runs",
                g.agent
            ))),
            several => several.iter().find(|(v, _)| v.name == g.guest.hostname).ok_or_else(|| {
                let listed: Vec<String> = several.iter().map(|(v, _)| format!("{} (pid {})", v.name, v.pid)).collect();
                usage(format!(
                    "--host-recording: which VM did agent {} ('{}') run in? Give --vm NAME|PID (candidates: {})",
                    g.agent,
                    g.name(),
                    listed.join(", ")
                ))
            })?,
        };
        targets.push((g, chosen.0, chosen.1.clone()));
    }
    let guests = targets
        .into_iter()
        .map(|(g, vm, threads)| {
            let first_cpu = |tid: u32| events.iter().find(|e| e.tid == tid).map_or(0, |e| e.cpu);
            let views: Vec<HostView> =
                threads.iter().map(|&(_, tid)| HostView::new(&events, tid, first_cpu(tid))).collect();
            let mut cpus = explain_cpus(g, &threads, &views, span, &decoder);
            let holdings = session.holdings(&decoder);
            for c in &mut cpus {
                c.host = std::mem::replace(&mut c.host, Explanation::new()).known_by(&holdings);
            }
            GuestNoise {
                agent: g.agent,
                name: g.name(),
                vm_pid: vm.pid,
                vm: vm.name.clone(),
                median_bound_ns: g.alignment.median_bound_ns(),
                max_bound_ns: g.alignment.max_bound_ns(),
                cpus,
            }
        })
        .collect();
    Ok(AgentNoiseReport { kind: "noise-agent", guests, lost_events, missing_events })
}

/// A VM of the recording and the threads that run its CPUs.
#[derive(Debug)]
struct GuestVm {
    pid: u32,
    name: String,
    /// (vCPU index, host thread).
    vcpus: Vec<(u32, u32)>,
}

/// The recording's VMs: the VMMs discovery named and processes named like a VMM, each with
/// its threads named like vCPUs — KVM's, or QEMU's emulating ones (`CPU N/TCG`), whose
/// preemption a guest feels just the same.
fn vms_of(session: &Session) -> Vec<GuestVm> {
    let tasks = recording_tasks(session);
    let mut pids: Vec<u32> = tasks.identities.keys().copied().collect();
    pids.extend(
        tasks
            .threads
            .iter()
            .filter(|(tid, (pid, comm))| tid == &pid && vmm_kind(comm, &[]) != VmmKind::Unknown)
            .map(|(tid, _)| *tid),
    );
    pids.sort_unstable();
    pids.dedup();
    pids.into_iter()
        .map(|pid| {
            let vcpus = tasks
                .threads
                .iter()
                .filter(|(_, (p, _))| *p == pid)
                .filter_map(|(tid, (_, comm))| Some((vcpu_index(comm).or_else(|| tcg_index(comm))?, *tid)))
                .collect();
            let name = tasks.identities.get(&pid).map_or_else(
                || tasks.threads.get(&pid).map_or_else(|| format!("pid-{pid}"), |(_, comm)| format!("{comm}-{pid}")),
                |id| id.name.clone(),
            );
            GuestVm { pid, name, vcpus }
        })
        .collect()
}

/// QEMU's thread of emulated CPU N: `CPU N/TCG`.
fn tcg_index(comm: &str) -> Option<u32> {
    comm.strip_prefix("CPU ")?.strip_suffix("/TCG")?.parse().ok()
}

/// Why no VM fits: what was asked, what the recording has.
fn no_vm(vms: &[GuestVm], wanted: Option<&str>, cpus: &[u32]) -> String {
    let named: Vec<String> =
        vms.iter().filter(|v| !v.vcpus.is_empty()).map(|v| format!("{} (pid {})", v.name, v.pid)).collect();
    match wanted {
        Some(w) if !vms.iter().any(|v| v.name == w || v.pid.to_string() == w) => {
            format!("--vm {w}: no such VM in the recording (VMs with named vCPU threads: {})", named.join(", "))
        }
        _ => format!(
            "--host-recording: no VM in the recording has named threads for guest CPUs {cpus:?}; QEMU names them with `-name NAME,debug-threads=on` (VMs with named vCPU threads: {})",
            if named.is_empty() { "none".to_string() } else { named.join(", ") }
        ),
    }
}

/// Each guest CPU's noise explained by its vCPU thread's host events (`threads`: guest CPU
/// and host thread, `views` their host events), in one pass over the guest's noise periods
/// (read from the recording a period at a time).
fn explain_cpus(
    g: &GuestStream,
    threads: &[(u32, u32)],
    views: &[HostView],
    (traced_from, traced_to): (u64, u64),
    decoder: &virtprof_trace::decode::Decoder,
) -> Vec<CpuNoise> {
    let mut cpus: Vec<CpuNoise> = threads
        .iter()
        .map(|&(cpu, vcpu_tid)| CpuNoise {
            cpu,
            vcpu_tid,
            threshold_ns: 0,
            noise: NoiseSummary::default(),
            available_pct: 100.0,
            unplaced_samples: 0,
            outside_trace_samples: 0,
            guest_steal_ns: guest_steal(g, cpu),
            host: Explanation::new(),
        })
        .collect();
    for b in g.noise.iter() {
        let Some(at) = cpus.iter().position(|c| c.cpu == b.cpu) else { continue };
        let (c, host) = (&mut cpus[at], &views[at]);
        c.threshold_ns = b.threshold_ns;
        c.noise.add(&NoiseSummary::of(&b));
        for &(start, len) in &b.samples {
            match g.alignment.to_host(start) {
                Some((host_start, _)) if host_start < traced_from || host_start + len > traced_to => {
                    c.outside_trace_samples += 1
                }
                Some((host_start, bound)) => c.host.add(len, &host.attribute(host_start, len, bound), decoder),
                None => c.unplaced_samples += 1,
            }
        }
    }
    for c in &mut cpus {
        if c.noise.measured_ns > 0 {
            c.available_pct = 100.0 - c.noise.noise_pct();
        }
    }
    cpus
}

/// The guest's `cpuN.steal_ns` over all its rows, if it sent that series.
fn guest_steal(g: &GuestStream, cpu: u32) -> Option<u64> {
    let name = format!("cpu{cpu}.steal_ns");
    g.totals()
        .into_iter()
        .find(|(s, _)| s.name == name && s.kind == SeriesKind::Counter)
        .map(|(_, v)| virtprof_model::units::saturating_u64(v))
}

/// Per-guest text.
pub fn table(r: &AgentNoiseReport) -> String {
    use std::fmt::Write;
    let us = |ns: u64| ns as f64 / 1000.0;
    let mut s = String::new();
    for g in &r.guests {
        let _ = writeln!(
            s,
            "guest {} (agent {}) in VM {} (pid {}); clock bound median ±{:.1} us, largest ±{:.1} us",
            virtprof_model::units::printable(&g.name),
            g.agent,
            virtprof_model::units::printable(&g.vm),
            g.vm_pid,
            us(g.median_bound_ns),
            us(g.max_bound_ns)
        );
        for c in &g.cpus {
            let _ = writeln!(
                s,
                "  CPU {} (vCPU thread {}): {} samples over {:.3} s measured, threshold {} us; noise {:.1} us, max {:.1} us, {:.4} % available",
                c.cpu,
                c.vcpu_tid,
                c.noise.samples,
                c.noise.measured_ns as f64 / 1e9,
                us(c.threshold_ns),
                us(c.noise.noise_ns),
                us(c.noise.max_single_ns),
                c.available_pct
            );
            let guest_steal = c.guest_steal_ns.map_or_else(|| "not sent".into(), |ns| format!("{:.1} us", us(ns)));
            let _ = writeln!(
                s,
                "    steal: host trace (vCPU thread off its CPU in samples) {}; guest /proc/stat over the recording {guest_steal}",
                c.host.host_steal_ns.map_or_else(|| UNKNOWN.to_string(), |ns| format!("{:.1} us", us(ns)))
            );
            for (cause, t) in &c.host.by_cause {
                let name = match cause {
                    // Without every explaining event class, not known to be off the host.
                    HostCause::Unexplained if c.host.explained_pct.is_none() => "unattributed".to_string(),
                    HostCause::Unexplained => "not on host".to_string(),
                    _ => serde_json::to_value(cause)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_string))
                        .unwrap_or_default(),
                };
                let _ = writeln!(
                    s,
                    "    {name:<13} {:>7} samples {:>12} (besides steal)",
                    t.samples,
                    t.ns.map_or_else(|| UNKNOWN.to_string(), |ns| format!("{:.1} us", us(ns)))
                );
            }
            let mut reasons: Vec<_> = c.host.exit_reasons.iter().collect();
            reasons.sort_by_key(|(name, n)| (std::cmp::Reverse(**n), (*name).clone()));
            for (reason, n) in reasons.iter().take(8) {
                let _ = writeln!(s, "    exit {reason}: {n} samples");
            }
            for (who, ns) in &c.host.preemptors {
                let _ = writeln!(s, "    preempted by {}: {:.1} us", virtprof_model::units::printable(who), us(*ns));
            }
            match c.host.explained_pct {
                Some(pct) => {
                    let _ = writeln!(
                        s,
                        "    explained by host events: {pct:.1} % of guest noise time (the rest is the guest's own interrupts, or hardware)"
                    );
                }
                None => {
                    let _ = writeln!(s, "    explained by host events: {UNKNOWN}");
                }
            }
            for u in &c.host.unavailable {
                let _ = writeln!(s, "    unavailable: {u}");
            }
            if c.noise.dropped_samples > 0 {
                let _ = writeln!(
                    s,
                    "    warning: the guest kept {} samples from us (its per-period cap)",
                    c.noise.dropped_samples
                );
            }
            if c.outside_trace_samples > 0 {
                let _ = writeln!(
                    s,
                    "    note: {} samples fell outside the host's trace (before it began or after it ended): not explained",
                    c.outside_trace_samples
                );
            }
            if c.unplaced_samples > 0 {
                let _ = writeln!(s, "    warning: {} samples could not be placed (no clock point)", c.unplaced_samples);
            }
        }
    }
    if r.lost_events > 0 {
        let _ = writeln!(s, "warning: the kernel lost {} trace events: attribution is incomplete", r.lost_events);
    }
    if !r.missing_events.is_empty() {
        let _ = writeln!(s, "note: the host kernel has no {}", r.missing_events.join(", "));
    }
    s
}
