//! `exits --duration --bpf`: the exit table from the in-kernel program's counts, where no event
//! reaches user space. The program counts events per (thread, reason) and times exits per
//! reason; it does not pair a kvm_exit with the userspace exit that may follow, nor follow a
//! thread through an exit. So per reason the light/heavy split and descheduling are unknown
//! (said so in `source.unavailable`, never shown as zero); the totals' split is known where
//! kvm_exit fires (every userspace exit followed one).

use std::collections::BTreeMap;

use virtprof_analysis::exits::{is_halt, ExitReport, ReasonRow, Source, Totals, VcpuRow};
use virtprof_analysis::hist::Histogram;
use virtprof_analysis::sched::ReasonKey;
use virtprof_analysis::Names;

use crate::kernel_counts::KernelCounts;

/// `counts` (from a [`crate::kernel_counts::KernelCounter`] started with timing) as an exit
/// report: where kvm_exit fired, one row per kvm_exit reason; else (PVM) one per userspace
/// exit reason, the exits the VMM handled (those handled in the kernel are known there only by
/// pairing evidence events with userspace exits, which the program does not do: unknown, and
/// the evidence events' counts are listed in `source.events`). Only threads in `tids` when
/// given.
pub fn exit_report(counts: &KernelCounts, names: &dyn Names, tids: Option<&[u32]>) -> ExitReport {
    let wanted = |tid: u32| tids.is_none_or(|t| t.contains(&tid));
    let exit_path = counts.reasons.iter().any(|(_, r, _)| r.is_kvm_exit());
    let is_row = |r: &ReasonKey| {
        if exit_path {
            r.is_kvm_exit()
        } else {
            matches!(r, ReasonKey::Userspace { .. })
        }
    };
    let mut events: BTreeMap<String, u64> = BTreeMap::new();
    let mut per_reason: BTreeMap<ReasonKey, u64> = BTreeMap::new();
    let mut per_thread: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
    for &(tid, reason, n) in counts.reasons.iter().filter(|(tid, _, _)| wanted(*tid)) {
        let event = match reason {
            ReasonKey::Exit { .. } => "kvm_exit".to_string(),
            ReasonKey::Userspace { .. } => "kvm_userspace_exit".to_string(),
            ReasonKey::Event { id } => names.event(id),
        };
        *events.entry(event).or_insert(0) += n;
        let t = per_thread.entry(tid).or_default();
        if is_row(&reason) {
            *per_reason.entry(reason).or_default() += n;
            t.0 += n;
        }
        if matches!(reason, ReasonKey::Userspace { .. }) {
            t.1 += n;
        }
    }
    // Durations are kept per reason for all threads: with a thread filter they are unknown.
    let durations: BTreeMap<ReasonKey, &Histogram> =
        if tids.is_none() { counts.durations.iter().map(|(k, h)| (*k, h)).collect() } else { BTreeMap::new() };
    let total: u64 = per_reason.values().sum();
    let name = |k: ReasonKey| k.name(names);
    let idle = |k: ReasonKey| is_halt(&name(k));
    let sum_of = |halts: bool| -> u64 {
        durations.iter().filter(|(k, _)| per_reason.contains_key(k) && idle(**k) == halts).map(|(_, h)| h.sum()).sum()
    };
    let (handling_ns, guest_idle_ns) = (sum_of(false), sum_of(true));
    let mut by_reason: Vec<ReasonRow> = per_reason
        .iter()
        .map(|(&k, &count)| {
            let hist = durations.get(&k).filter(|h| h.count() > 0).copied();
            let t = |f: fn(&Histogram) -> Option<u64>| hist.and_then(f);
            ReasonRow {
                reason: name(k),
                count,
                // Without kvm_exit the rows are the userspace exits: each one heavyweight.
                lightweight: (!exit_path).then_some(0),
                heavyweight: (!exit_path).then_some(count),
                descheduled: None,
                unfinished: 0,
                guest_idle: idle(k),
                count_pct: pct(count, total),
                time_pct: hist.filter(|_| !idle(k)).map(|h| pct(h.sum(), handling_ns)),
                total_ns: t(|h| Some(h.sum())),
                min_ns: t(Histogram::min),
                avg_ns: t(Histogram::mean),
                p50_ns: t(|h| h.quantile(0.5)),
                p99_ns: t(|h| h.quantile(0.99)),
                max_ns: t(Histogram::max),
                vmm_ns: None,
                preempted_ns: None,
                blocked_ns: None,
                histogram: hist.cloned().unwrap_or_default(),
            }
        })
        .collect();
    by_reason.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.reason.cmp(&b.reason)));
    let heavy: u64 = per_thread.values().map(|t| t.1).sum();
    let by_vcpu = per_thread
        .iter()
        .filter(|(_, t)| t.0 > 0)
        .map(|(&tid, &(exits, to_vmm))| VcpuRow {
            tid,
            vcpu_id: None,
            exits,
            lightweight: exit_path.then(|| exits.saturating_sub(to_vmm)),
            heavyweight: Some(to_vmm),
            // The program keeps durations by reason, not by thread.
            total_ns: None,
            guest_idle_ns: None,
        })
        .collect();
    let mut unavailable = Vec::new();
    if exit_path {
        unavailable.push(
            "per kvm_exit reason, lightweight/heavyweight: the in-kernel program does not pair exits with userspace exits (--trace pairs them)".to_string(),
        );
    }
    unavailable.extend([
        "descheduled, VMM, preempted and blocked time: the in-kernel program does not follow a thread through an exit"
            .to_string(),
        "per vCPU, exit time: durations are kept per reason".to_string(),
    ]);
    if tids.is_some() {
        unavailable
            .push("durations with --vm/--vcpu: the in-kernel program keeps them per reason for all threads".into());
    }
    if !exit_path {
        unavailable.push(
            "exits handled in the kernel: with no kvm_exit on this host they are known only by pairing evidence events with userspace exits (--trace pairs them)".into(),
        );
    }
    if counts.durations.is_empty() {
        unavailable.push("durations: this kernel's events do not end exits the program can time".into());
    }
    ExitReport {
        source: Source {
            path: if exit_path { "in-kernel kvm_exit" } else { "in-kernel userspace_round_trips" }.to_string(),
            events,
            unavailable,
        },
        totals: Totals {
            exits: total,
            lightweight: exit_path.then(|| total.saturating_sub(heavy)),
            heavyweight: Some(heavy),
            handling_ns: Some(handling_ns),
            guest_idle_ns: Some(guest_idle_ns),
            halt_poll_ns: None,
            halted_ns: None,
            lost_events: counts.full.iter().sum::<u64>() + counts.missed,
            incomplete: counts.incomplete,
        },
        by_reason,
        by_vcpu,
        rows: Vec::new(),
        timeline: Vec::new(),
    }
}

fn pct(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        100.0 * part as f64 / whole as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Named;
    impl Names for Named {
        fn exit_reason(&self, reason: u32, _isa: u32) -> String {
            match reason {
                120 => "HLT".into(),
                _ => format!("R{reason}"),
            }
        }
        fn userspace_reason(&self, reason: u32) -> String {
            format!("KVM_EXIT_{reason}")
        }
        fn event(&self, id: u16) -> String {
            format!("event{id}")
        }
        fn task(&self, id: virtprof_model::StrId) -> String {
            format!("task{id:?}")
        }
    }

    fn hist(values: &[u64]) -> Histogram {
        let mut h = Histogram::default();
        values.iter().for_each(|v| h.record(*v));
        h
    }

    /// Where kvm_exit fires: rows per kvm_exit reason, halts apart from handling time, the
    /// totals' split from the userspace exits, per-reason splits unknown.
    #[test]
    fn kvm_exit_rows_with_the_split_only_in_the_totals() {
        let exit = |reason| ReasonKey::Exit { reason, isa: 1 };
        let io = ReasonKey::Userspace { reason: 2 };
        let counts = KernelCounts {
            reasons: vec![(7, exit(30), 10), (7, exit(120), 2), (7, io, 4), (8, exit(30), 5)],
            durations: vec![(exit(30), hist(&[1_000; 15])), (exit(120), hist(&[50_000, 70_000]))],
            missed: 1,
            ..KernelCounts::default()
        };
        let r = exit_report(&counts, &Named, None);
        assert_eq!(r.source.path, "in-kernel kvm_exit");
        assert_eq!((r.totals.exits, r.totals.lightweight, r.totals.heavyweight), (17, Some(13), Some(4)));
        assert_eq!(
            (r.totals.handling_ns, r.totals.guest_idle_ns, r.totals.lost_events),
            (Some(15_000), Some(120_000), 1)
        );
        let rows: Vec<(&str, u64, bool)> = r.by_reason.iter().map(|x| (&x.reason[..], x.count, x.guest_idle)).collect();
        assert_eq!(rows, [("R30", 15, false), ("HLT", 2, true)]);
        assert!(r.by_reason.iter().all(|x| x.lightweight.is_none() && x.descheduled.is_none()));
        assert_eq!(r.by_reason[0].time_pct, Some(100.0));
        let vcpus: Vec<(u32, u64, Option<u64>)> = r.by_vcpu.iter().map(|v| (v.tid, v.exits, v.heavyweight)).collect();
        assert_eq!(vcpus, [(7, 12, Some(4)), (8, 5, Some(0))]);
        // A thread filter keeps its counts; durations become unknown.
        let only = exit_report(&counts, &Named, Some(&[8]));
        assert_eq!((only.totals.exits, only.by_reason[0].total_ns), (5, None));
    }

    /// Where no kvm_exit fires (PVM): the userspace exits are the rows, all heavyweight; the
    /// lightweight ones are unknown and the evidence events counted apart.
    #[test]
    fn round_trips_where_no_kvm_exit_fires() {
        let io = ReasonKey::Userspace { reason: 2 };
        let pio = ReasonKey::Event { id: 33 };
        let counts = KernelCounts {
            reasons: vec![(7, io, 4), (7, pio, 9)],
            durations: vec![(io, hist(&[10_000; 4]))],
            ..KernelCounts::default()
        };
        let r = exit_report(&counts, &Named, None);
        assert_eq!(r.source.path, "in-kernel userspace_round_trips");
        assert_eq!((r.totals.exits, r.totals.lightweight, r.totals.heavyweight), (4, None, Some(4)));
        assert_eq!(r.by_reason.iter().map(|x| &x.reason[..]).collect::<Vec<_>>(), ["KVM_EXIT_2"]);
        assert_eq!(r.by_reason[0].total_ns, Some(40_000));
        assert_eq!((r.by_reason[0].lightweight, r.by_reason[0].heavyweight), (Some(0), Some(4)));
        assert_eq!((r.source.events["event33"], r.source.events["kvm_userspace_exit"]), (9, 4));
        assert_eq!((r.by_vcpu[0].exits, r.by_vcpu[0].lightweight, r.by_vcpu[0].heavyweight), (4, None, Some(4)));
    }
}
