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
}

/// The measured mapping from a guest's clock to the host's: points in host-time order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Alignment {
    points: Vec<ClockPoint>,
}

impl Alignment {
    /// From points in any order.
    pub fn new(mut points: Vec<ClockPoint>) -> Alignment {
        points.sort_by_key(|p| p.host_ns);
        points.dedup_by_key(|p| p.host_ns);
        Alignment { points }
    }

    /// Add a point measured later than every other.
    pub fn push(&mut self, point: ClockPoint) {
        if self.points.last().is_none_or(|last| last.host_ns < point.host_ns) {
            self.points.push(point);
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
        ClockPoint { host_ns, offset_ns, bound_ns }
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
    fn a_guest_behind_the_host_maps_forward_and_no_points_map_nothing() {
        let a = Alignment::new(vec![point(10_000, -4_000, 5)]);
        assert_eq!(a.to_host(6_000), Some((10_000, 5)));
        assert_eq!(Alignment::default().to_host(1), None);
        assert_eq!(Alignment::default().drift_ppm(), 0.0);
    }
}
