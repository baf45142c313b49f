//! Counter multiplexing (VrtProf §III): with more hardware events than counters, the events
//! are split into groups that take turns over sub-intervals, round-robin, and each group's
//! counts are scaled up to the whole interval. Every value carries its multiplex ratio (the
//! fraction of the interval its group was counting), so a reader knows how much is measured
//! and how much is extrapolated.
//!
//! Two ways of sharing exist and both scale the same way, `count × span / running`:
//! - the kernel multiplexes by itself when counters are over-committed; `span` is the
//!   counter's `time_enabled` and `running` its `time_running`;
//! - virtprof rotates groups explicitly ([`Rotation`]), enabling one group per sub-interval;
//!   a disabled counter's `time_enabled` stops too, so `span` is the interval's length.

/// A counter's cumulative reading (`read_format` with both times).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Reading {
    /// Events counted.
    pub count: u64,
    /// ns the counter was enabled.
    pub enabled_ns: u64,
    /// ns it was actually on a hardware counter.
    pub running_ns: u64,
}

impl Reading {
    /// `self - earlier`, for one interval.
    pub fn since(self, earlier: Reading) -> Reading {
        Reading {
            count: self.count.wrapping_sub(earlier.count),
            enabled_ns: self.enabled_ns.saturating_sub(earlier.enabled_ns),
            running_ns: self.running_ns.saturating_sub(earlier.running_ns),
        }
    }
}

/// A value scaled to the interval, with how much of it was measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scaled {
    /// Estimated events over the whole span.
    pub value: f64,
    /// running / span, in [0, 1]: 1 means counted the whole time, 0.25 means extrapolated ×4.
    pub ratio: f64,
}

/// Scale one interval's delta to `span_ns`. None when the counter never ran in the interval
/// (nothing was measured: the value is unknown, not zero).
pub fn scale(delta: Reading, span_ns: u64) -> Option<Scaled> {
    if delta.running_ns == 0 || span_ns == 0 {
        return None;
    }
    let ratio = (delta.running_ns as f64 / span_ns as f64).min(1.0);
    Some(Scaled { value: delta.count as f64 / ratio, ratio })
}

/// The span groups taking turns scale to in one interval: the sum of each group's enabled
/// time. Each group is enabled in its turns only, and a thread's counters only while the
/// thread runs, so a vCPU thread's counters scale to the time it ran (as `perf stat -p`
/// reports it), not to the wall clock; a CPU's, to the interval.
pub fn rotation_span(group_enabled_ns: impl IntoIterator<Item = u64>) -> u64 {
    group_enabled_ns.into_iter().fold(0, u64::saturating_add)
}

/// Scale a kernel-multiplexed delta (span = its own time enabled).
pub fn scale_kernel_multiplexed(delta: Reading) -> Option<Scaled> {
    scale(delta, delta.enabled_ns)
}

/// Round-robin turns of counter groups over the sub-intervals of each interval.
#[derive(Debug, Clone)]
pub struct Rotation {
    groups: usize,
    turn: usize,
}

impl Rotation {
    /// Rotate `groups` groups (at least 1); group 0 counts first.
    pub fn new(groups: usize) -> Self {
        Rotation { groups: groups.max(1), turn: 0 }
    }

    /// Sub-intervals per interval: one turn per group, so every group counts in every interval.
    pub fn sub_intervals(&self) -> usize {
        self.groups
    }

    /// The group counting now.
    pub fn current(&self) -> usize {
        self.turn
    }

    /// End the current sub-interval: returns (group to disable, group to enable).
    pub fn advance(&mut self) -> (usize, usize) {
        let previous = self.turn;
        self.turn = (self.turn + 1) % self.groups;
        (previous, self.turn)
    }
}

/// Split `events` into groups of at most `counters` (the PMU's general-purpose counters).
pub fn groups_of(events: usize, counters: usize) -> Vec<std::ops::Range<usize>> {
    let counters = counters.max(1);
    (0..events).step_by(counters).map(|start| start..(start + counters).min(events)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_counter_that_ran_throughout_is_not_scaled() {
        let s = scale_kernel_multiplexed(Reading { count: 1000, enabled_ns: 500, running_ns: 500 }).unwrap();
        assert_eq!((s.value, s.ratio), (1000.0, 1.0));
    }

    #[test]
    fn a_counter_that_ran_a_quarter_is_scaled_four_times() {
        let s = scale_kernel_multiplexed(Reading { count: 250, enabled_ns: 1000, running_ns: 250 }).unwrap();
        assert_eq!((s.value, s.ratio), (1000.0, 0.25));
    }

    #[test]
    fn turns_scale_to_what_they_add_up_to() {
        // A thread that ran 60 ms of a 100 ms interval, counted by group 0 for 25 ms of it and
        // by group 1 for 35 ms: each scales to the 60 ms it ran, not to the 100 ms.
        let span = rotation_span([25_000_000, 35_000_000]);
        assert_eq!(span, 60_000_000);
        let s = scale(Reading { count: 250, enabled_ns: 25_000_000, running_ns: 25_000_000 }, span).unwrap();
        assert_eq!(s.value, 600.0);
        assert!((s.ratio - 25.0 / 60.0).abs() < 1e-12);
    }

    #[test]
    fn a_counter_that_never_ran_is_unknown_not_zero() {
        assert_eq!(scale_kernel_multiplexed(Reading { count: 0, enabled_ns: 1000, running_ns: 0 }), None);
    }

    #[test]
    fn readings_subtract_per_interval() {
        let a = Reading { count: 10, enabled_ns: 100, running_ns: 50 };
        let b = Reading { count: 30, enabled_ns: 300, running_ns: 100 };
        assert_eq!(b.since(a), Reading { count: 20, enabled_ns: 200, running_ns: 50 });
    }

    #[test]
    fn events_split_into_groups_of_the_counter_count() {
        assert_eq!(groups_of(5, 2), vec![0..2, 2..4, 4..5]);
        assert_eq!(groups_of(2, 4), vec![0..2]);
    }

    /// Synthetic PMU: each event has a constant rate (events/ns). Rotating G groups over the
    /// G sub-intervals of each interval and scaling by interval/running must give back
    /// rate × interval for every event, with ratio 1/G.
    #[test]
    fn rotation_recovers_constant_rates() {
        // Events per ns, as whole events per sub-interval so the synthetic counts are exact.
        let rates = [0.5, 2.0, 3.0, 7.0, 11.0];
        let groups = groups_of(rates.len(), 2);
        let mut rotation = Rotation::new(groups.len());
        let interval_ns = 3_000_000u64;
        let sub = interval_ns / rotation.sub_intervals() as u64;
        let mut cumulative = vec![Reading::default(); rates.len()];
        let mut previous = cumulative.clone();
        for _interval in 0..10 {
            for _ in 0..rotation.sub_intervals() {
                for e in groups[rotation.current()].clone() {
                    cumulative[e].count += [1, 4, 6, 14, 22][e] * sub / 2;
                    cumulative[e].running_ns += sub;
                    cumulative[e].enabled_ns += sub;
                }
                rotation.advance();
            }
            for (e, &rate) in rates.iter().enumerate() {
                let s = scale(cumulative[e].since(previous[e]), interval_ns).unwrap();
                assert!((s.value - rate * interval_ns as f64).abs() < 1.0, "event {e}: {}", s.value);
                assert!((s.ratio - 1.0 / 3.0).abs() < 1e-9);
            }
            previous.clone_from(&cumulative);
        }
    }

    proptest! {
        #[test]
        fn scaling_never_shrinks_and_ratio_stays_in_range(count in 0u64..1 << 40, running in 1u64..1 << 30, extra in 0u64..1 << 30) {
            let s = scale_kernel_multiplexed(Reading { count, enabled_ns: running + extra, running_ns: running }).unwrap();
            prop_assert!(s.value + 1e-6 >= count as f64);
            prop_assert!(s.ratio > 0.0 && s.ratio <= 1.0);
        }
    }
}
