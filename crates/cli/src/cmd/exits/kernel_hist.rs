//! `exits --duration --kernel-hist`: the kernel's own exit histograms (hist triggers in the
//! recording's instance: `virtprof_trace::exit_hist`), set beside the traced path's, reason by
//! reason. Both time the same exits (the same pairs, so their counts are equal where the trace
//! lost nothing) on the same clock. Their durations differ only where the kernel wrote an
//! event while another interrupted its write: the ring buffer then stores the interrupted
//! event with the time of the event before it (delta 0, as ring_buffer.c says), while the
//! hist trigger reads the time the writer took after the interruption. Such an exit may land in
//! another bucket (`exits_moved`); [`SharedStamps`] counts, from the trace alone, the exits one
//! of whose events shares its timestamp with the event before it on its CPU, which bounds them.
//! Where the trace lost events (or a kernel map had no room) the comparison is unknown, and
//! says why.

use std::collections::BTreeMap;
use std::io::Write;

use serde::Serialize;
use virtprof_analysis::hist::Histogram;
use virtprof_analysis::Names;
use virtprof_model::{Event, EventKind};
use virtprof_trace::exit_hist::KernelExitHists;

/// Per (exit_reason, isa), the exits the kernel's triggers pair (a thread's kvm_exit with its
/// next kvm_entry) whose kvm_exit or kvm_entry has the same timestamp as the event before it on
/// its CPU: the ring buffer's stamp for an event whose write was interrupted (or two events in
/// one nanosecond). Only those can be timed differently by the trace and the kernel's hist.
#[derive(Debug, Default)]
pub struct SharedStamps {
    /// Per CPU, the last event's timestamp.
    last: Vec<Option<u64>>,
    /// Per thread, its exit in flight: (reason, isa, CPU, its stamp shared).
    in_flight: BTreeMap<u32, (u32, u32, u32, bool)>,
    /// Exits timed on a shared stamp, per (reason, isa).
    pub exits: BTreeMap<(u32, u32), u64>,
}

impl SharedStamps {
    /// Feed every event of the walk, in order.
    pub fn on_event(&mut self, e: &Event) {
        let cpu = e.cpu as usize;
        if self.last.len() <= cpu {
            self.last.resize(cpu + 1, None);
        }
        let shared = self.last[cpu] == Some(e.ts);
        match e.kind {
            EventKind::KvmExit { reason, isa, .. } => {
                self.in_flight.insert(e.tid, (reason, isa, e.cpu, shared));
            }
            EventKind::KvmEntry { .. } => {
                if let Some((reason, isa, _, exit_shared)) = self.in_flight.remove(&e.tid) {
                    if exit_shared || shared {
                        *self.exits.entry((reason, isa)).or_default() += 1;
                    }
                }
            }
            // The kernel may pair across a gap; the comparison is then unknown anyway.
            EventKind::Lost { .. } => self.in_flight.retain(|_, x| x.2 != e.cpu),
            _ => {}
        }
        self.last[cpu] = Some(e.ts);
    }
}

/// The `kernel_hist` object of `exits --json`.
#[derive(Debug, Serialize)]
pub struct KernelHistCheck {
    /// Exits the kernel timed (kvm_exit → next kvm_entry of the thread).
    pub exits: u64,
    /// Entries the kernel's maps had no room for (their `Dropped` totals).
    pub dropped: u64,
    /// Every reason's count, sum, min, max and buckets equal the trace's; null when unknown.
    pub equal_to_trace: Option<bool>,
    /// Exits the two put in different buckets, at least (half the bucket differences).
    pub exits_moved: u64,
    /// Exits timed on a timestamp the ring buffer shared with the event before it.
    pub shared_stamps: u64,
    /// In every reason, the exits moved are no more than those on shared stamps: each
    /// difference is one the ring buffer's own stamping explains.
    pub differences_explained: bool,
    /// Why the comparison is unknown.
    pub unknown_because: Option<String>,
    /// Per reason, the kernel's figures and the trace's, most exits first.
    pub reasons: Vec<ReasonCheck>,
}

/// One reason, both ways.
#[derive(Debug, Serialize)]
pub struct ReasonCheck {
    pub reason: String,
    pub kernel: Figures,
    pub trace: Figures,
    /// Buckets whose counts differ (0 where equal).
    pub buckets_differing: usize,
    /// Exits in another bucket, at least: half the sum of the buckets' differences.
    pub exits_moved: u64,
    /// Of the trace's exits, those timed on a stamp shared with the event before it.
    pub shared_stamps: u64,
    pub equal: bool,
}

/// A histogram's figures: timed exits, their sum, extremes, and (bucket start, exits).
#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct Figures {
    pub count: u64,
    pub sum_ns: u64,
    pub min_ns: Option<u64>,
    pub max_ns: Option<u64>,
    pub buckets: Vec<(u64, u64)>,
}

impl Figures {
    fn of(h: &Histogram) -> Figures {
        Figures { count: h.count(), sum_ns: h.sum(), min_ns: h.min(), max_ns: h.max(), buckets: h.buckets().collect() }
    }
}

/// The kernel's figures against the traced path's (per reason name, its timed exits'
/// histogram), `lost_events` being the trace's loss.
pub fn check<'a>(
    kernel: &KernelExitHists,
    traced: impl IntoIterator<Item = (&'a str, &'a Histogram)>,
    shared: &SharedStamps,
    names: &dyn Names,
    lost_events: u64,
) -> KernelHistCheck {
    let mut shared_by_name: BTreeMap<String, u64> = BTreeMap::new();
    for (&(reason, isa), &n) in &shared.exits {
        *shared_by_name.entry(names.exit_reason(reason, isa)).or_default() += n;
    }
    let mut per_reason: BTreeMap<String, Histogram> = BTreeMap::new();
    for r in &kernel.reasons {
        // Our buckets: a kernel key is a bucket's start (or, below 64 ns and past the last
        // power of two it splits, the value itself).
        let buckets = r.buckets.iter().map(|&(lo, n)| (Histogram::bucket_index(lo), n));
        let min = r.min_ns.unwrap_or(u64::MAX);
        let h = Histogram::from_parts(buckets, r.sum_ns, min, r.max_ns.unwrap_or(0)).unwrap_or_default();
        per_reason.entry(names.exit_reason(r.reason, r.isa)).or_default().merge(&h);
    }
    let traced: BTreeMap<&str, &Histogram> = traced.into_iter().collect();
    let empty = Histogram::default();
    let mut reasons: Vec<ReasonCheck> = per_reason
        .keys()
        .map(String::as_str)
        .chain(traced.keys().copied())
        .collect::<std::collections::BTreeSet<&str>>()
        .into_iter()
        .map(|reason| {
            let k = per_reason.get(reason).unwrap_or(&empty);
            let t = traced.get(reason).copied().unwrap_or(&empty);
            let (kernel, trace) = (Figures::of(k), Figures::of(t));
            let (buckets_differing, exits_moved) = differing(&kernel.buckets, &trace.buckets);
            let equal = kernel == trace;
            let shared_stamps = shared_by_name.get(reason).copied().unwrap_or(0);
            ReasonCheck {
                reason: reason.to_string(),
                kernel,
                trace,
                buckets_differing,
                exits_moved,
                shared_stamps,
                equal,
            }
        })
        .filter(|r| r.kernel.count > 0 || r.trace.count > 0)
        .collect();
    reasons.sort_by(|a, b| b.kernel.count.cmp(&a.kernel.count).then_with(|| a.reason.cmp(&b.reason)));
    let unknown_because = if lost_events > 0 {
        Some(format!("the trace lost {lost_events} events: exits near its gaps are timed by the kernel alone"))
    } else if kernel.dropped > 0 {
        Some(format!("the kernel's maps had no room for {} entries", kernel.dropped))
    } else {
        None
    };
    KernelHistCheck {
        exits: kernel.exits(),
        dropped: kernel.dropped,
        equal_to_trace: unknown_because.is_none().then(|| reasons.iter().all(|r| r.equal)),
        exits_moved: reasons.iter().fold(0u64, |n, r| n.saturating_add(r.exits_moved)),
        shared_stamps: reasons.iter().fold(0u64, |n, r| n.saturating_add(r.shared_stamps)),
        differences_explained: reasons
            .iter()
            .all(|r| r.exits_moved <= r.shared_stamps && r.kernel.count == r.trace.count),
        unknown_because,
        reasons,
    }
}

/// The kernel's histograms a recording keeps (`record --kernel-hist`), or why they could not
/// be read when it was made.
pub fn kept_in(footer: &virtprof_store::recording::Footer) -> Option<Result<KernelExitHists, String>> {
    match (&footer.kernel_exit_hists, &footer.kernel_exit_hists_unreadable) {
        (Some(hists), _) => Some(Ok(hists.clone())),
        (None, Some(why)) => Some(Err(why.clone())),
        (None, None) => None,
    }
}

/// What is said when the comparison cannot be made (`why`: the whole reason).
pub fn unknown(why: String) -> KernelHistCheck {
    KernelHistCheck {
        exits: 0,
        dropped: 0,
        equal_to_trace: None,
        exits_moved: 0,
        shared_stamps: 0,
        differences_explained: false,
        unknown_because: Some(why),
        reasons: Vec::new(),
    }
}

/// Buckets present on one side only or with different counts, and the exits that makes move
/// at least (each moved exit leaves one bucket and enters another).
fn differing(a: &[(u64, u64)], b: &[(u64, u64)]) -> (usize, u64) {
    let a: BTreeMap<u64, u64> = a.iter().copied().collect();
    let b: BTreeMap<u64, u64> = b.iter().copied().collect();
    let keys: std::collections::BTreeSet<&u64> = a.keys().chain(b.keys()).collect();
    let gaps: Vec<u64> = keys.into_iter().map(|k| a.get(k).unwrap_or(&0).abs_diff(*b.get(k).unwrap_or(&0))).collect();
    (gaps.iter().filter(|&&g| g > 0).count(), gaps.iter().fold(0u64, |n, g| n.saturating_add(*g)).div_ceil(2))
}

/// The text report's lines.
pub fn write_text(out: &mut dyn Write, check: &KernelHistCheck) -> std::io::Result<()> {
    let verdict = match (check.equal_to_trace, &check.unknown_because) {
        (Some(true), _) => "equal to the trace's in every reason: count, sum, min, max and every bucket".to_string(),
        (Some(false), _) if check.differences_explained => format!(
            "{} of them in other buckets than the trace's, no more in any reason than the {} the trace times on a stamp shared with the event before it (a write another event interrupted: the ring buffer keeps the earlier event's time, the kernel's hist the writer's own clock read)",
            check.exits_moved, check.shared_stamps
        ),
        (Some(false), _) => format!(
            "NOT equal to the trace's: {} exits in other buckets, more in some reason than the {} on shared stamps (below)",
            check.exits_moved, check.shared_stamps
        ),
        (None, Some(why)) => format!("compared with the trace's: unknown, {why}"),
        (None, None) => "compared with the trace's: unknown".to_string(),
    };
    writeln!(
        out,
        "kernel hist triggers (kvm_exit -> kvm_entry on the trace's timestamps): {} exits in {} reasons, {verdict}",
        check.exits,
        check.reasons.iter().filter(|r| r.kernel.count > 0).count()
    )?;
    for r in check.reasons.iter().filter(|r| !r.equal) {
        writeln!(
            out,
            "  {}: kernel {} exits, {} ns; trace {} exits, {} ns; {} exits in {} buckets differ",
            r.reason,
            r.kernel.count,
            r.kernel.sum_ns,
            r.trace.count,
            r.trace.sum_ns,
            r.exits_moved,
            r.buckets_differing
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use virtprof_trace::exit_hist::ReasonHist;

    struct Codes;
    impl Names for Codes {
        fn exit_reason(&self, reason: u32, _isa: u32) -> String {
            format!("r{reason}")
        }
        fn userspace_reason(&self, reason: u32) -> String {
            format!("u{reason}")
        }
        fn event(&self, id: u16) -> String {
            format!("event {id}")
        }
        fn task(&self, _: virtprof_model::StrId) -> String {
            String::new()
        }
    }

    /// The traced path's histograms of `durations` per reason.
    fn traced(durations: &[(&'static str, &[u64])]) -> Vec<(&'static str, Histogram)> {
        durations
            .iter()
            .map(|(reason, values)| {
                let mut h = Histogram::default();
                values.iter().for_each(|&v| h.record(v));
                (*reason, h)
            })
            .collect()
    }

    fn compare(kernel: &KernelExitHists, durations: &[(&'static str, &[u64])], lost: u64) -> KernelHistCheck {
        compare_shared(kernel, durations, &SharedStamps::default(), lost)
    }

    fn compare_shared(
        kernel: &KernelExitHists,
        durations: &[(&'static str, &[u64])],
        shared: &SharedStamps,
        lost: u64,
    ) -> KernelHistCheck {
        let t = traced(durations);
        check(kernel, t.iter().map(|(r, h)| (*r, h)), shared, &Codes, lost)
    }

    fn kernel(values: &[u64]) -> KernelExitHists {
        let mut buckets: BTreeMap<u64, u64> = BTreeMap::new();
        for &v in values {
            let lo = if v < 64 { v } else { virtprof_analysis::hist::bucket_start(v) };
            *buckets.entry(lo).or_default() += 1;
        }
        let r = ReasonHist {
            reason: 7,
            isa: 2,
            count: values.len() as u64,
            sum_ns: values.iter().sum(),
            min_ns: values.iter().min().copied(),
            max_ns: values.iter().max().copied(),
            buckets: buckets.into_iter().collect(),
        };
        KernelExitHists { reasons: vec![r], dropped: 0 }
    }

    #[test]
    fn the_same_durations_are_equal_and_one_moved_across_an_edge_is_not() {
        let values = [40, 2047, 2048, 70_000, 1 << 42];
        let same = compare(&kernel(&values), &[("r7", &values)], 0);
        assert_eq!(same.equal_to_trace, Some(true), "{same:?}");
        assert_eq!(same.exits, 5);
        let moved = compare(&kernel(&values), &[("r7", &[40, 2048, 2048, 70_000, 1 << 42])], 0);
        assert_eq!(moved.equal_to_trace, Some(false));
        assert_eq!((moved.reasons[0].buckets_differing, moved.exits_moved), (2, 1));
        assert!(!moved.differences_explained, "no exit on a shared stamp");
        let mut text = Vec::new();
        write_text(&mut text, &moved).unwrap();
        assert!(String::from_utf8(text).unwrap().contains("NOT equal"));
        // One exit whose kvm_entry shares its stamp with the event before it on its CPU.
        let mut shared = SharedStamps::default();
        let ev = |ts, tid, kind| Event { ts, cpu: 1, tid, kind };
        let exit = EventKind::KvmExit { reason: 7, isa: 2, guest_rip: 0, vcpu_id: 0 };
        let entry = EventKind::KvmEntry { vcpu_id: 0, rip: 0 };
        for e in [ev(10, 5, exit), ev(20, 6, EventKind::Other { event: 3 }), ev(20, 5, entry)] {
            shared.on_event(&e);
        }
        for e in [ev(30, 5, exit), ev(40, 5, entry)] {
            shared.on_event(&e);
        }
        assert_eq!(shared.exits, [((7, 2), 1)].into());
        // Events lost on its CPU: the exit in flight there is not followed.
        for e in [ev(50, 5, exit), ev(60, 6, EventKind::Lost { count: None }), ev(60, 5, entry)] {
            shared.on_event(&e);
        }
        assert_eq!(shared.exits, [((7, 2), 1)].into());
        let explained = compare_shared(&kernel(&values), &[("r7", &[40, 2048, 2048, 70_000, 1 << 42])], &shared, 0);
        assert!(explained.differences_explained && explained.shared_stamps == 1);
        let mut text = Vec::new();
        write_text(&mut text, &explained).unwrap();
        assert!(String::from_utf8(text).unwrap().contains("1 of them in other buckets"));
    }

    #[test]
    fn a_recordings_counts_that_lie_are_compared_without_overflowing() {
        let lie = |reason| ReasonHist {
            reason,
            isa: 2,
            count: u64::MAX,
            sum_ns: u64::MAX,
            min_ns: Some(0),
            max_ns: Some(u64::MAX),
            buckets: vec![(0, u64::MAX), (1 << 40, u64::MAX), (u64::MAX, u64::MAX)],
        };
        // Two reasons the names fold into one: their histograms are merged.
        let hists = KernelExitHists { reasons: vec![lie(7), lie(7)], dropped: u64::MAX };
        assert_eq!(hists.exits(), u64::MAX);
        let c = compare(&hists, &[("r7", &[1])], 0);
        assert_eq!((c.equal_to_trace, c.exits), (None, u64::MAX));
        assert!(c.exits_moved > 0);
    }

    #[test]
    fn with_events_lost_or_entries_dropped_the_comparison_is_unknown_and_says_why() {
        let values = [100, 200];
        let lost = compare(&kernel(&values), &[("r7", &[100])], 3);
        assert_eq!(lost.equal_to_trace, None);
        assert!(lost.unknown_because.unwrap().contains("lost 3 events"));
        let mut dropped = kernel(&values);
        dropped.dropped = 1;
        let full = compare(&dropped, &[("r7", &values)], 0);
        assert_eq!((full.equal_to_trace, full.dropped), (None, 1));
        // A reason only the trace has is listed with the kernel's side empty.
        let only_traced = compare(&kernel(&values), &[("r7", &values), ("r9", &[5])], 0);
        assert_eq!(only_traced.equal_to_trace, Some(false));
        assert_eq!(only_traced.reasons.len(), 2);
    }
}
