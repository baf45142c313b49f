//! A real guest seen from inside (`virtprof agent`): what it is, the series it sends each
//! interval, and how its clock maps onto the host's.
//!
//! Guest time is the guest's CLOCK_MONOTONIC; host time is the recording's reference clock
//! (CLOCK_MONOTONIC, the `mono` trace clock). The mapping is measured, never assumed: NTP-style
//! exchanges give points `guest = host + offset` each with an error bound, and times between
//! points are interpolated linearly, which follows drift.

/// Whether a series counts (the agent sends the increase over the row) or reads a level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum SeriesKind {
    /// The increase over the row (ns of CPU time, events).
    Counter,
    /// The level at the row's end (free pages).
    Gauge,
}

/// One column of a guest's rows, e.g. `cpu1.steal_ns` or `app.web.requests`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct GuestSeries {
    /// Dotted name: source, then entity, then metric.
    pub name: String,
    /// Unit: `ns`, `events`, `pages`, `bytes`.
    pub unit: String,
    /// Counter or gauge.
    pub kind: SeriesKind,
}

impl GuestSeries {
    /// A counter.
    pub fn counter(name: impl Into<String>, unit: &str) -> GuestSeries {
        GuestSeries { name: name.into(), unit: unit.into(), kind: SeriesKind::Counter }
    }

    /// A gauge.
    pub fn gauge(name: impl Into<String>, unit: &str) -> GuestSeries {
        GuestSeries { name: name.into(), unit: unit.into(), kind: SeriesKind::Gauge }
    }
}

/// What an agent says about its guest when a host connects.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct GuestInfo {
    /// The guest's host name.
    pub hostname: String,
    /// Its kernel release.
    pub kernel: String,
    /// CPUs online in the guest.
    pub cpus: u32,
    /// The agent's interval, ns.
    pub interval_ns: u64,
    /// The agent's version.
    pub agent_version: String,
    /// The guest's clocksource (`kvm-clock`, `tsc`, ...).
    pub clocksource: String,
    /// A PTP clock backed by the host (ptp_kvm), if the guest has one.
    #[cfg_attr(feature = "serde", serde(default))]
    pub ptp_kvm: Option<String>,
    /// Sources the agent could not read, each with the reason (never sent as zeros).
    #[cfg_attr(feature = "serde", serde(default))]
    pub unavailable: Vec<(String, String)>,
    /// The I/O port the agent writes a marker to each row (`agent --marker-port`).
    #[cfg_attr(feature = "serde", serde(default))]
    pub marker_port: Option<u16>,
}

/// One measuring period of the agent's noise loop on one guest CPU (`agent --noise`): the
/// loop read CLOCK_MONOTONIC back to back from `start_ns` to `end_ns`, and every step longer
/// than the threshold is a sample — time the guest CPU did not run the loop (guest clock).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct NoiseBatch {
    /// Guest CPU.
    pub cpu: u32,
    /// Guest time the window started.
    pub start_ns: u64,
    /// Guest time it ended.
    pub end_ns: u64,
    /// The threshold, ns.
    pub threshold_ns: u64,
    /// Clock reads made.
    pub iterations: u64,
    /// Samples `(guest start, length)`, ns, at most [`NoiseBatch::MAX_SAMPLES`].
    pub samples: Vec<(u64, u64)>,
    /// Samples seen but not kept (over the cap, or a batch the agent could not send).
    pub dropped: u64,
}

impl NoiseBatch {
    /// The most samples one batch carries; more are counted in `dropped`.
    pub const MAX_SAMPLES: usize = 4096;

    /// Sum of sample lengths.
    pub fn noise_ns(&self) -> u64 {
        self.samples.iter().map(|s| s.1).sum()
    }
}

/// Noise periods summed up: per guest CPU in `report` and `noise`, over a window in `top`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct NoiseSummary {
    /// Periods.
    pub periods: u64,
    /// Time the loop measured.
    pub measured_ns: u64,
    /// Samples kept.
    pub samples: u64,
    /// Their lengths summed.
    pub noise_ns: u64,
    /// The longest.
    pub max_single_ns: u64,
    /// The shortest (None: no samples).
    #[cfg_attr(feature = "serde", serde(default))]
    pub min_single_ns: Option<u64>,
    /// Samples seen but not sent.
    pub dropped_samples: u64,
}

impl NoiseSummary {
    /// One period's figures.
    pub fn of(b: &NoiseBatch) -> NoiseSummary {
        NoiseSummary {
            periods: 1,
            measured_ns: b.end_ns.saturating_sub(b.start_ns),
            samples: b.samples.len() as u64,
            noise_ns: b.noise_ns(),
            max_single_ns: b.samples.iter().map(|s| s.1).max().unwrap_or(0),
            min_single_ns: b.samples.iter().map(|s| s.1).min(),
            dropped_samples: b.dropped,
        }
    }

    /// Add another summary's figures.
    pub fn add(&mut self, o: &NoiseSummary) {
        self.periods += o.periods;
        self.measured_ns += o.measured_ns;
        self.samples += o.samples;
        self.noise_ns += o.noise_ns;
        self.max_single_ns = self.max_single_ns.max(o.max_single_ns);
        self.min_single_ns = match (self.min_single_ns, o.min_single_ns) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.dropped_samples += o.dropped_samples;
    }

    /// Share of measured time that was noise, %.
    pub fn noise_pct(&self) -> f64 {
        if self.measured_ns == 0 {
            0.0
        } else {
            100.0 * self.noise_ns as f64 / self.measured_ns as f64
        }
    }
}

/// The guest time just before a row's marker write (`agent --marker-port`), a gauge series.
pub const MARKER_BEFORE: &str = "marker.before_ns";
/// The guest time just after it.
pub const MARKER_AFTER: &str = "marker.after_ns";

/// The alignment checked against markers: guest port writes (guest times just before and
/// after each) that the host traced (`kvm_pio`, host time).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct MarkerCheck {
    /// Markers the guest wrote (rows that carry one) while the host traced.
    pub written: u64,
    /// Markers written before the trace began or after it ended (not checked).
    pub outside_trace: u64,
    /// Of those, markers with a traced write near enough to be theirs.
    pub matched: u64,
    /// Matched markers whose host time fell outside the mapped guest times by more than the
    /// alignment's bound there.
    pub outside: u64,
    /// The most any was outside its bound, ns.
    pub worst_excess_ns: u64,
    /// The largest distance of a host time from its mapped guest window (inside the bound
    /// or not), ns: how far off the alignment really was, against the bound it claimed.
    pub max_error_ns: u64,
    /// The largest bound claimed for a matched marker, ns.
    pub max_bound_ns: u64,
}

/// One measured point of the mapping: at host time `host_ns`, guest time was
/// `host_ns + offset_ns`, give or take `bound_ns`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct ClockPoint {
    /// Host time of the point.
    pub host_ns: u64,
    /// Guest minus host.
    pub offset_ns: i64,
    /// Half the exchange's round trip less the guest's own turnaround: the true offset lies
    /// within this of `offset_ns`.
    pub bound_ns: u64,
    /// Measured by the guest's ptp_kvm clock (a cross-timestamp the host's KVM made), not by
    /// an exchange: where a guest has such points, only they are used.
    #[cfg_attr(feature = "serde", serde(default))]
    pub ptp: bool,
}

/// The measured mapping from a guest's clock to the host's: points in host-time order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Alignment {
    points: Vec<ClockPoint>,
}

impl Alignment {
    /// From points in any order (only the ptp_kvm ones, if there are any).
    pub fn new(mut points: Vec<ClockPoint>) -> Alignment {
        if points.iter().any(|p| p.ptp) {
            points.retain(|p| p.ptp);
        }
        points.sort_by_key(|p| p.host_ns);
        points.dedup_by_key(|p| p.host_ns);
        Alignment { points }
    }

    /// Add a point measured later than every other. The first ptp_kvm point replaces the
    /// exchanges' points; exchanges' points after it are not taken.
    pub fn push(&mut self, point: ClockPoint) {
        match (self.source_is_ptp(), point.ptp) {
            (false, true) => self.points.clear(),
            (true, false) => return,
            _ => {}
        }
        if self.points.last().is_none_or(|last| last.host_ns < point.host_ns) {
            self.points.push(point);
        }
    }

    fn source_is_ptp(&self) -> bool {
        self.points.first().is_some_and(|p| p.ptp)
    }

    /// What measured the points: `ptp_kvm` or `exchanges`.
    pub fn source(&self) -> &'static str {
        if self.source_is_ptp() {
            "ptp_kvm"
        } else {
            "exchanges"
        }
    }

    /// The points.
    pub fn points(&self) -> &[ClockPoint] {
        &self.points
    }

    /// Host time of guest time `guest_ns`, and the error bound there: linear between the two
    /// points around it (the larger of their bounds); outside them, the line through the
    /// nearest two carried on (the nearest one's bound). None before any point was measured.
    pub fn to_host(&self, guest_ns: u64) -> Option<(u64, u64)> {
        let guest_of = |p: &ClockPoint| i128::from(p.host_ns) + i128::from(p.offset_ns);
        let g = i128::from(guest_ns);
        let on_line = |a: &ClockPoint, b: &ClockPoint| {
            let (ga, gb) = (guest_of(a), guest_of(b));
            let span = if gb == ga { 1 } else { gb - ga };
            i128::from(a.offset_ns) + (i128::from(b.offset_ns) - i128::from(a.offset_ns)) * (g - ga) / span
        };
        let after = self.points.partition_point(|p| guest_of(p) <= g);
        let n = self.points.len();
        let (offset, bound) = match (after.checked_sub(1).map(|i| &self.points[i]), self.points.get(after)) {
            (Some(a), _) if guest_of(a) == g => (i128::from(a.offset_ns), a.bound_ns),
            (Some(a), Some(b)) => (on_line(a, b), a.bound_ns.max(b.bound_ns)),
            (Some(last), None) if n >= 2 => (on_line(&self.points[n - 2], last), last.bound_ns),
            (None, Some(first)) if n >= 2 => (on_line(first, &self.points[1]), first.bound_ns),
            (Some(p), None) | (None, Some(p)) => (i128::from(p.offset_ns), p.bound_ns),
            (None, None) => return None,
        };
        let host = u64::try_from((g - offset).max(0)).unwrap_or(u64::MAX);
        Some((host, bound))
    }

    /// Check the alignment against `markers` (guest times just before and after each write)
    /// and the host times of the traced writes (`host`, sorted), traced from `traced.0` to
    /// `traced.1`. A marker matches the traced write nearest its mapped middle if that is
    /// within `window_ns` (half the distance between markers: farther, it is another marker's
    /// or lost).
    pub fn check_markers(
        &self,
        markers: &[(u64, u64)],
        host: &[u64],
        traced: (u64, u64),
        window_ns: u64,
    ) -> MarkerCheck {
        let mut check = MarkerCheck::default();
        for &(before, after) in markers {
            let (Some((from, b0)), Some((to, b1))) = (self.to_host(before), self.to_host(after)) else {
                check.outside_trace += 1;
                continue;
            };
            if to < traced.0 || from > traced.1 {
                check.outside_trace += 1;
                continue;
            }
            check.written += 1;
            let (to, bound) = (to.max(from), b0.max(b1));
            let mid = from + (to - from) / 2;
            let i = host.partition_point(|&t| t < mid);
            let nearest = [i.checked_sub(1), Some(i)]
                .into_iter()
                .flatten()
                .filter_map(|k| host.get(k).copied())
                .min_by_key(|t| t.abs_diff(mid));
            let Some(t) = nearest.filter(|t| t.abs_diff(mid) <= window_ns) else { continue };
            check.matched += 1;
            let error = if t < from { from - t } else { t.saturating_sub(to) };
            check.max_error_ns = check.max_error_ns.max(error);
            check.max_bound_ns = check.max_bound_ns.max(bound);
            if error > bound {
                check.outside += 1;
                check.worst_excess_ns = check.worst_excess_ns.max(error - bound);
            }
        }
        check
    }

    /// The largest bound of any point.
    pub fn max_bound_ns(&self) -> u64 {
        self.points.iter().map(|p| p.bound_ns).max().unwrap_or(0)
    }

    /// The median bound (what a typical row is placed with).
    pub fn median_bound_ns(&self) -> u64 {
        let mut b: Vec<u64> = self.points.iter().map(|p| p.bound_ns).collect();
        b.sort_unstable();
        b.get(b.len() / 2).copied().unwrap_or(0)
    }

    /// Guest clock drift against the host in parts per million (least squares over the
    /// points); 0 with fewer than two points.
    pub fn drift_ppm(&self) -> f64 {
        let n = self.points.len();
        if n < 2 {
            return 0.0;
        }
        let t0 = self.points[0].host_ns as f64;
        let xs: Vec<f64> = self.points.iter().map(|p| p.host_ns as f64 - t0).collect();
        let ys: Vec<f64> = self.points.iter().map(|p| p.offset_ns as f64).collect();
        let (mx, my) = (xs.iter().sum::<f64>() / n as f64, ys.iter().sum::<f64>() / n as f64);
        let sxx: f64 = xs.iter().map(|x| (x - mx).powi(2)).sum();
        if sxx == 0.0 {
            return 0.0;
        }
        let sxy: f64 = xs.iter().zip(&ys).map(|(x, y)| (x - mx) * (y - my)).sum();
        sxy / sxx * 1e6
    }
}

/// A guest's rows placed on the recording's clock: what sinks draw beside the host's tracks.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct GuestLayer {
    /// Agent number in the recording.
    pub agent: u32,
    /// The guest's name (host name, else the agent's address).
    pub name: String,
    /// Columns of the rows.
    pub series: Vec<GuestSeries>,
    /// Rows in order.
    pub rows: Vec<LayerRow>,
}

/// One guest CPU's noise samples (`agent --noise`) placed on the recording's clock.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PlacedNoise {
    /// Agent number in the recording.
    pub agent: u32,
    /// Guest CPU.
    pub cpu: u32,
    /// Samples `(host start, length)`, ns.
    pub samples: Vec<(u64, u64)>,
}

/// One guest row on the recording's clock.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerRow {
    /// Guest time it starts.
    pub guest_start_ns: u64,
    /// Guest time it ends.
    pub guest_end_ns: u64,
    /// Host time it starts.
    pub start_ns: u64,
    /// Host time it ends.
    pub end_ns: u64,
    /// The alignment's error bound there.
    pub bound_ns: u64,
    /// One value per series.
    pub values: Vec<f64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(host_ns: u64, offset_ns: i64, bound_ns: u64) -> ClockPoint {
        ClockPoint { host_ns, offset_ns, bound_ns, ptp: false }
    }

    #[test]
    fn ptp_kvm_points_take_over_from_the_exchanges() {
        let ptp = |host_ns, offset_ns| ClockPoint { host_ns, offset_ns, bound_ns: 1, ptp: true };
        let mut a = Alignment::default();
        a.push(point(10, 500, 40));
        assert_eq!(a.source(), "exchanges");
        a.push(ptp(20, 480));
        a.push(point(30, 520, 40));
        a.push(ptp(40, 481));
        assert_eq!((a.source(), a.points().len(), a.max_bound_ns()), ("ptp_kvm", 2, 1));
        let b = Alignment::new(vec![point(10, 500, 40), ptp(20, 480), point(30, 520, 40), ptp(40, 481)]);
        assert_eq!(a, b, "the same from a recording's points");
    }

    #[test]
    fn guest_times_map_between_points_and_follow_drift() {
        // The guest runs 100 ppm fast: its offset grows 100 µs per host second.
        let a = Alignment::new(vec![point(2_000_000_000, 5_000_100, 30), point(1_000_000_000, 5_000_000, 20)]);
        assert_eq!(a.to_host(1_005_000_000), Some((1_000_000_000, 20)));
        // Half-way in guest time, half the offset change.
        let mid_guest = 1_500_000_000 + 5_000_050;
        assert_eq!(a.to_host(mid_guest), Some((1_500_000_000, 30)));
        // Outside the points: the drift carried on.
        assert_eq!(a.to_host(3_005_000_200), Some((3_000_000_000, 30)));
        assert_eq!(a.to_host(4_999_900), Some((0, 20)));
        assert!((a.drift_ppm() - 0.1).abs() < 1e-9, "{}", a.drift_ppm());
        assert_eq!((a.max_bound_ns(), a.median_bound_ns()), (30, 30));
    }

    #[test]
    fn markers_are_matched_to_the_nearest_traced_write_and_checked_against_the_bound() {
        // Guest 1000 ns ahead of the host, bound 50 ns.
        let a = Alignment::new(vec![point(0, 1_000, 50), point(1_000_000, 1_000, 50)]);
        let markers = [(11_000, 11_100), (21_000, 21_100), (31_000, 31_100), (41_000, 41_100), (99_000, 99_100)];
        // Inside its window; 30 ns early (within the bound); 80 ns late (30 over); none near;
        // the last written after the trace ended.
        let host = [10_050, 19_970, 30_180, 90_000];
        let c = a.check_markers(&markers, &host, (0, 95_000), 5_000);
        assert_eq!((c.written, c.matched, c.outside, c.worst_excess_ns, c.max_error_ns), (4, 3, 1, 30, 80));
        assert_eq!((c.max_bound_ns, c.outside_trace), (50, 1));
        assert_eq!(Alignment::default().check_markers(&markers, &host, (0, 95_000), 5_000).outside_trace, 5);
    }

    #[test]
    fn a_guest_behind_the_host_maps_forward_and_no_points_map_nothing() {
        let a = Alignment::new(vec![point(10_000, -4_000, 5)]);
        assert_eq!(a.to_host(6_000), Some((10_000, 5)));
        assert_eq!(Alignment::default().to_host(1), None);
        assert_eq!(Alignment::default().drift_ppm(), 0.0);
    }
}
