//! `explain`'s facts about each VM of a source: the shared pass's vCPU and VMM-thread
//! accounting, then per VM one more pass over its vCPU threads (their exits by reason, who
//! took their CPUs, host interrupts while they ran, their migrations), each figure gated by
//! what the source holds; `analysis::explain` weighs them.

use std::collections::BTreeMap;

use serde::Serialize;
use virtprof_analysis::bins::TimeBins;
use virtprof_analysis::contention::{Contention, Suffered};
use virtprof_analysis::exits::{ExitAnalyzer, ExitOptions, ExitReport};
use virtprof_analysis::explain::{
    explain, explain_guest, serves_io, Entity, ExitFacts, Explanation, GuestExplanation, GuestFacts, VmFacts,
};
use virtprof_analysis::memory::{MemoryCounter, MemoryFaults};
use virtprof_analysis::qos::{window_report, VmInfo};
use virtprof_analysis::{Analyzer, Names};
use virtprof_model::evidence::{Figure, Holdings};
use virtprof_model::Event;
use virtprof_session::{evidence_event_ids, DecoderNames, Session};

use crate::pass::{analyse_with, recording_tasks, Want, ACCOUNTING_SYSTEMS};
use crate::usage;

/// What `explain` prints and `--json` gives.
#[derive(Debug, Clone, Serialize)]
pub struct ExplainReport {
    /// The source.
    pub source: String,
    /// How its timestamps were read, where that needed saying.
    pub clock: Option<String>,
    /// Its loss, as every loss line says it.
    pub lost_events_text: String,
    /// The VMs explained, the one that lost the most first.
    pub vms: Vec<VmAnswer>,
    /// Guests seen from the inside (`record --agent`): their steal and noise.
    pub guests: Vec<GuestExplanation>,
}

/// One VM's answer and the timeline of its causes.
#[derive(Debug, Clone, Serialize)]
pub struct VmAnswer {
    /// The answer.
    #[serde(flatten)]
    pub explanation: Explanation,
    /// Its lost time over the window by cause (None where the timestamps are not time).
    pub timeline: Option<Timeline>,
}

/// Lost time per bin, by cause.
#[derive(Debug, Clone, Serialize)]
pub struct Timeline {
    /// Bin width, ns.
    pub bin_ns: u64,
    /// Each bin's start, seconds from the window's.
    pub t_s: Vec<f64>,
    /// One series per cause drawn.
    pub series: Vec<TimelineSeries>,
}

/// One cause's lost time per bin.
#[derive(Debug, Clone, Serialize)]
pub struct TimelineSeries {
    /// The cause's kind (`cpu_contention`, `exit_storm`, `host_interrupts`).
    pub cause: String,
    /// Its label.
    pub label: String,
    /// Milliseconds lost per bin (summed over the VM's vCPUs).
    pub ms: Vec<f64>,
}

/// Bins a timeline has.
const TIMELINE_BINS: usize = 120;

/// Exit reasons a timeline draws apart (the rest are not drawn).
const TIMELINE_REASONS: usize = 3;

/// Explain the VMs of `recording` (`only`: one, by VMM pid or name).
pub fn explain_recording(recording: &mut Session, only: Option<&str>) -> anyhow::Result<ExplainReport> {
    let want = Want { accounting: true, ..Want::default() };
    let analysis = analyse_with(recording, want, &mut |_: &Event, _: &dyn Names| {})?;
    let Some(total) = &analysis.total else { return Err(usage("the source holds no vCPU thread to explain")) };
    let names = analysis.names();
    let window = window_report(total, "run", &analysis.vms, &names, None, &analysis.holdings);
    let chosen: Vec<&VmInfo> = match only {
        Some(which) => {
            let found: Vec<&VmInfo> =
                analysis.vms.iter().filter(|vm| vm.pid.0.to_string() == which || vm.name == which).collect();
            if found.is_empty() {
                let known: Vec<String> = analysis.vms.iter().map(|vm| format!("{} ({})", vm.pid.0, vm.name)).collect();
                return Err(usage(format!(
                    "--vm {which}: no such VM in the source (it has {})",
                    if known.is_empty() { "none".to_string() } else { known.join(", ") }
                )));
            }
            found
        }
        None => analysis.vms.iter().collect(),
    };
    if chosen.is_empty() {
        return Err(usage("no VM in the source: nothing to explain (was the kvm system recorded?)"));
    }
    let lost_events = analysis.loss.complete.then(|| analysis.loss.total());
    let host = recording_tasks(recording);
    let vm_names: BTreeMap<u32, String> = analysis.vms.iter().map(|vm| (vm.pid.0, vm.name.clone())).collect();
    let bins = window.seconds.map(|_| {
        let width = (window.end_ns.saturating_sub(window.start_ns) / TIMELINE_BINS as u64).max(1);
        TimeBins::new(window.start_ns, width, TIMELINE_BINS)
    });
    let each_vm: Vec<Watched> = chosen
        .iter()
        .map(|vm| Watched {
            vcpus: vm.vcpus.iter().map(|v| v.tid.0).collect(),
            serving: vm.others.iter().filter(|t| serves_io(&t.role.to_string())).map(|t| t.tid).collect(),
        })
        .collect();
    let passes = vcpu_pass(recording, &each_vm, &analysis.holdings, bins.as_ref())?;
    let mut vms = Vec::new();
    for (vm, pass) in chosen.into_iter().zip(passes) {
        let VcpuPass { exits, suffered, timelines, serving, memory } = pass;
        let row = window.vms.iter().find(|r| r.pid == vm.pid.0);
        let timeline = bins.as_ref().map(|bins| timeline(bins, &exits, timelines, &analysis.holdings));
        let sum = |f: fn(&virtprof_analysis::qos::VcpuRow) -> Option<u64>| -> Option<u64> {
            row.map_or(Some(0), |r| r.vcpus.iter().map(f).sum::<Option<u64>>())
        };
        let h = &analysis.holdings;
        let merged = merge(&suffered);
        let preemptors = h.knows(Figure::Preemptors).then(|| named_preemptors(&merged, &host, &vm_names));
        let vmm_preemptors = h.knows(Figure::Preemptors).then(|| named_preemptors(&merge(&serving), &host, &vm_names));
        let halt_poll_ns = exits.totals.halt_poll_ns;
        let mut unavailable: Vec<(String, String)> = h
            .unavailable(&[
                Figure::WaitingBlocked,
                Figure::Preemptors,
                Figure::HostIrqTime,
                Figure::Migrations,
                Figure::MemoryFaults,
                Figure::MemoryReclaims,
            ])
            .into_iter()
            .map(|u| (u.figure, u.reason))
            .collect();
        if !h.knows(Figure::ExitDurations) && !h.knows(Figure::RoundTripDurations) {
            let u = h.check(Figure::RoundTripDurations).expect_err("checked");
            unavailable.push(("exits' durations".into(), u.reason));
        }
        let facts = VmFacts {
            pid: vm.pid.0,
            name: vm.name.clone(),
            vcpus: vm.vcpus.len(),
            seconds: window.seconds,
            run_ns: sum(|v| v.run_ns),
            wait_ns: sum(|v| v.wait_ns),
            blocked_ns: sum(|v| v.blocked_ns),
            preemptors,
            exits: Some(exit_facts(&exits)),
            host_irq: h.knows(Figure::HostIrqTime).then_some((
                merged.irq_ns,
                merged.irqs,
                merged.softirq_ns,
                merged.softirqs,
            )),
            cpus: row.map(|r| r.vcpus.iter().filter_map(|v| v.cpu).collect()).unwrap_or_default(),
            migrations: h.knows(Figure::Migrations).then_some(merged.migrations),
            memory_faults: h.knows(Figure::MemoryFaults).then_some(memory.faults),
            reclaimers: h.knows(Figure::MemoryReclaims).then(|| reclaimers(&memory, &host, &vm_names)),
            vmm_roles: row
                .map(|r| r.roles.iter().map(|role| (role.role.to_string(), role.threads, role.wait_ns)).collect())
                .unwrap_or_default(),
            vmm_preemptors,
            halt_poll_ns,
            lost_events,
            unavailable,
        };
        vms.push(VmAnswer { explanation: explain(&facts), timeline });
    }
    vms.sort_by_key(|v| std::cmp::Reverse(v.explanation.lost_ns.unwrap_or(0)));
    let guests = recording.guests.iter().map(|g| explain_guest(&guest_facts(g))).collect();
    Ok(ExplainReport {
        source: recording.path.display().to_string(),
        clock: recording.clock_line(),
        lost_events_text: recording.describe_loss(&analysis.loss, &analysis.decoder),
        vms,
        guests,
    })
}

/// One VM's threads the second pass watches.
struct Watched {
    vcpus: Vec<u32>,
    /// Its VMM's threads that serve the guest's I/O.
    serving: Vec<u32>,
}

/// Per VM: its vCPU threads' exits by reason, what they suffered and, with `bins`, their
/// waiting and host-interrupt time over time; what its I/O-serving threads suffered.
struct VcpuPass {
    exits: ExitReport,
    suffered: Vec<Suffered>,
    timelines: Option<(TimeBins, TimeBins)>,
    serving: Vec<Suffered>,
    memory: MemoryFaults,
}

/// One VM's analyzers in the second pass.
struct VmAnalyzers {
    exits: ExitAnalyzer,
    vcpus: Contention,
    serving: Contention,
    memory: MemoryCounter,
}

/// One pass for every VM: the source is decoded once, each event handed to each VM's
/// analyzers (each needs the other threads' events too: who preempted, which IRQs ran).
fn vcpu_pass(
    recording: &Session,
    each_vm: &[Watched],
    holdings: &Holdings,
    bins: Option<&TimeBins>,
) -> anyhow::Result<Vec<VcpuPass>> {
    let mut decoder = recording.decoder(ACCOUNTING_SYSTEMS)?;
    let evidence = evidence_event_ids(&decoder);
    let id = |figure: Figure, system: &str, name: &str| {
        holdings.knows(figure).then(|| decoder.layout().format_by_name(system, name).map(|f| f.id)).flatten()
    };
    let fault_event = id(Figure::MemoryFaults, "kvmmmu", "kvm_mmu_spte_requested");
    let unmap_event = id(Figure::MemoryReclaims, "kvm", "kvm_unmap_hva_range");
    let mut analyzers: Vec<VmAnalyzers> = each_vm
        .iter()
        .map(|watched| {
            let options = ExitOptions {
                tids: watched.vcpus.clone(),
                evidence_events: evidence.clone(),
                host: recording.host_kind(),
                holdings: holdings.clone(),
                timeline: bins.cloned(),
                ..Default::default()
            };
            let vcpus = Contention::new(watched.vcpus.iter().copied());
            VmAnalyzers {
                exits: ExitAnalyzer::new(options),
                vcpus: match bins {
                    Some(b) => vcpus.with_timeline(b),
                    None => vcpus,
                },
                serving: Contention::new(watched.serving.iter().copied()),
                memory: MemoryCounter::new(watched.vcpus.iter().copied(), fault_event, unmap_event),
            }
        })
        .collect();
    recording.walk(&mut decoder, |e, d| {
        for vm in &mut analyzers {
            vm.exits.on_event(e);
            vm.vcpus.on_event(e, &DecoderNames(d));
            vm.serving.on_event(e, &DecoderNames(d));
            vm.memory.on_event(e, &DecoderNames(d));
        }
    })?;
    let names = DecoderNames(&decoder);
    Ok(analyzers
        .into_iter()
        .map(|mut vm| VcpuPass {
            timelines: vm.vcpus.take_timelines(),
            exits: vm.exits.finish(&names),
            suffered: vm.vcpus.finish().into_values().collect(),
            serving: vm.serving.finish().into_values().collect(),
            memory: vm.memory.finish(),
        })
        .collect())
}

/// What a VM's threads suffered, together.
fn merge(threads: &[Suffered]) -> Suffered {
    threads.iter().fold(Suffered::default(), |mut all, s| {
        all.add(s);
        all
    })
}

/// The lost time per bin by cause, each drawn only where the source holds its events:
/// waiting, host interrupts, the exit reasons that took the most handling time.
fn timeline(
    bins: &TimeBins,
    exits: &ExitReport,
    waits_irqs: Option<(TimeBins, TimeBins)>,
    holdings: &Holdings,
) -> Timeline {
    let ms = |b: &TimeBins| b.ns.iter().map(|&ns| ns as f64 / 1e6).collect::<Vec<f64>>();
    let mut series = Vec::new();
    if let Some((waits, irqs)) = &waits_irqs {
        if holdings.knows(Figure::Preemptors) {
            series.push(TimelineSeries {
                cause: "cpu_contention".into(),
                label: "waiting for a CPU".into(),
                ms: ms(waits),
            });
        }
        if holdings.knows(Figure::HostIrqTime) {
            series.push(TimelineSeries {
                cause: "host_interrupts".into(),
                label: "host interrupts".into(),
                ms: ms(irqs),
            });
        }
    }
    let mut reasons: Vec<&virtprof_analysis::exits::ReasonTimeline> =
        exits.timeline.iter().filter(|r| !r.guest_idle).collect();
    reasons.sort_by_key(|r| std::cmp::Reverse(r.bins.ns.iter().sum::<u64>()));
    for r in reasons.into_iter().take(TIMELINE_REASONS) {
        series.push(TimelineSeries {
            cause: "exit_storm".into(),
            label: format!("exits: {}", r.reason),
            ms: ms(&r.bins),
        });
    }
    Timeline {
        bin_ns: bins.width_ns,
        t_s: (0..bins.ns.len()).map(|i| (i as u64 * bins.width_ns) as f64 / 1e9).collect(),
        series,
    }
}

/// Who ran while the threads waited, most first: another VM's threads as that VM, the idle
/// task as the CPU idle (a CPU limit held them back), the rest as host tasks named by the
/// recording's task table.
fn named_preemptors(
    merged: &Suffered,
    host: &crate::tasks::HostTasks,
    vm_names: &BTreeMap<u32, String>,
) -> Vec<(Entity, u64)> {
    let threads = merged.preemptors.iter().map(|(tid, (name, ns))| (*tid, Some(name.as_str()), *ns));
    ranked(threads, host, vm_names)
}

/// Who unmapped guest memory, most first, named as [`named_preemptors`] names them. (The
/// unmap event names no VM: a task's unmaps may have been of any VM's memory.)
fn reclaimers(
    memory: &MemoryFaults,
    host: &crate::tasks::HostTasks,
    vm_names: &BTreeMap<u32, String>,
) -> Vec<(Entity, u64)> {
    let mut list = ranked(memory.unmaps_by.iter().map(|(tid, n)| (*tid, None, *n)), host, vm_names);
    if memory.unmaps_unnamed > 0 {
        list.push((Entity::Task { tid: 0, pid: None, name: "other tasks".into() }, memory.unmaps_unnamed));
    }
    list
}

/// Threads' amounts summed by the entity each is named as, most first.
fn ranked<'a>(
    threads: impl Iterator<Item = (u32, Option<&'a str>, u64)>,
    host: &crate::tasks::HostTasks,
    vm_names: &BTreeMap<u32, String>,
) -> Vec<(Entity, u64)> {
    let mut by: BTreeMap<String, (Entity, u64)> = BTreeMap::new();
    for (tid, name, amount) in threads {
        let entity = task_entity(tid, name, host, vm_names);
        by.entry(entity.label()).or_insert((entity, 0)).1 += amount;
    }
    let mut list: Vec<(Entity, u64)> = by.into_values().collect();
    list.sort_by_key(|e| std::cmp::Reverse(e.1));
    list
}

/// A thread as `explain` names it: its VM's, or a host task (`name` where the task table does
/// not know it).
fn task_entity(
    tid: u32,
    name: Option<&str>,
    host: &crate::tasks::HostTasks,
    vm_names: &BTreeMap<u32, String>,
) -> Entity {
    let pid = host.threads.get(&tid).map(|(pid, _)| *pid);
    match pid.and_then(|p| vm_names.get(&p).map(|n| (p, n))) {
        _ if tid == 0 => Entity::IdleCpu,
        Some((p, n)) => Entity::Vm { pid: p, name: n.clone() },
        None => Entity::Task {
            tid,
            pid,
            name: host
                .threads
                .get(&tid)
                .map(|(_, comm)| comm.clone())
                .or_else(|| name.map(str::to_string))
                .unwrap_or_else(|| format!("tid {tid}")),
        },
    }
}

/// A VM's exits by reason as `explain` weighs them.
fn exit_facts(report: &ExitReport) -> Vec<ExitFacts> {
    report
        .by_reason
        .iter()
        .map(|r| ExitFacts {
            reason: r.reason.clone(),
            count: r.count,
            // The vCPU's preemption is contention's; its blocking is the device's latency (or
            // a starved I/O thread's): neither is handling.
            handling_ns: r
                .total_ns
                .map(|t| t.saturating_sub(r.preempted_ns.unwrap_or(0)).saturating_sub(r.blocked_ns.unwrap_or(0))),
            guest_idle: r.guest_idle,
        })
        .collect()
}

/// What a guest's agent sent: its CPUs' time and steal from /proc/stat, its noise loop.
fn guest_facts(g: &virtprof_session::guest::GuestStream) -> GuestFacts {
    let (mut cpu_ns, mut steal_ns, mut any) = (0.0, 0.0, false);
    for (series, total) in g.totals() {
        if let Some(field) = virtprof_agent::collect::cpu_field(&series.name) {
            any = true;
            cpu_ns += total;
            if field == "steal" {
                steal_ns += total;
            }
        }
    }
    let noise = (!g.noise.is_empty()).then(|| {
        g.noise.iter().fold((0u64, 0u64, 0u64), |(n, ns, measured), b| {
            let lost: u64 = b.samples.iter().map(|s| s.1).sum();
            (n + b.samples.len() as u64, ns + lost, measured + b.end_ns.saturating_sub(b.start_ns))
        })
    });
    let ns = virtprof_model::units::saturating_u64;
    GuestFacts {
        agent: g.agent,
        name: g.name(),
        cpus: g.guest.cpus,
        cpu_ns: any.then(|| ns(cpu_ns)),
        steal_ns: any.then(|| ns(steal_ns)),
        noise,
        gaps: g.gaps.len(),
    }
}
