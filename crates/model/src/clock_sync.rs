//! A guest's clock placed on its host's: the corrections trace-cmd's time synchronisation
//! measures while it records a host and its guests together (`trace-cmd record -A`), saved in
//! the guest's trace as its TIME_SHIFT option. Each guest CPU has its own samples; between two
//! samples the correction is interpolated when the recording says so, as trace-cmd's reader
//! does, so both tools put every guest event at the same host time.

/// One correction, measured at `time` on the guest's clock: host = (guest × scaling) >>
/// fraction + offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct SyncSample {
    /// When it was measured, on the guest's clock (raw, before any TSC conversion).
    pub time: u64,
    /// Host minus guest.
    pub offset: i64,
    /// Scaling ratio (1 where the clocks tick alike).
    pub scaling: u64,
    /// Fraction bits of `scaling`.
    pub fraction: u32,
}

/// A guest trace's corrections to its host's clock.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct ClockSync {
    /// The host trace's id (its TRACEID): the one file these corrections are against.
    pub peer_trace_id: u64,
    /// Interpolate between samples (trace-cmd's flag bit 0); otherwise each sample holds until
    /// the next.
    pub interpolate: bool,
    /// Per guest CPU, its samples in time order.
    pub cpus: Vec<Vec<SyncSample>>,
}

impl ClockSync {
    /// Samples in all.
    pub fn samples(&self) -> usize {
        self.cpus.iter().map(Vec::len).sum()
    }

    /// A raw guest timestamp of `cpu` on the host's clock; None where that CPU has no samples
    /// (its events cannot be placed).
    pub fn to_host(&self, cpu: u32, ts: u64) -> Option<u64> {
        let samples = self.cpus.get(cpu as usize)?;
        let (first, last) = (samples.first()?, samples.last()?);
        if samples.len() == 1 {
            // One measurement: an offset only.
            return Some(ts.saturating_add_signed(first.offset));
        }
        // The pair around `ts`; before the first or after the last, the nearest pair.
        let i = if ts <= first.time {
            0
        } else if ts >= last.time {
            samples.len() - 2
        } else {
            samples.partition_point(|s| s.time <= ts) - 1
        };
        Some(self.correct(ts, &samples[i], &samples[i + 1]))
    }

    fn correct(&self, ts: u64, from: &SyncSample, to: &SyncSample) -> u64 {
        let span = i128::from(to.time) - i128::from(from.time);
        let offset = if self.interpolate && span != 0 {
            // Saturating: a damaged file's samples may be 2^64 apart in both time and offset.
            let moved = (i128::from(ts) - i128::from(from.time))
                .saturating_mul(i128::from(to.offset) - i128::from(from.offset));
            // Half a span added before dividing, as trace-cmd rounds (toward zero past that).
            i128::from(from.offset).saturating_add(moved.saturating_add(span / 2) / span)
        } else {
            i128::from(from.offset)
        };
        let scaled = (u128::from(ts) * u128::from(from.scaling)) >> from.fraction.min(127);
        let placed = i128::try_from(scaled).unwrap_or(i128::MAX).saturating_add(offset);
        u64::try_from(placed.max(0)).unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(time: u64, offset: i64) -> SyncSample {
        SyncSample { time, offset, scaling: 1, fraction: 0 }
    }

    #[test]
    fn corrections_are_interpolated_per_cpu_and_extrapolated_past_the_ends() {
        let sync = ClockSync {
            peer_trace_id: 7,
            interpolate: true,
            cpus: vec![vec![sample(1_000, 500), sample(2_000, 700), sample(4_000, 600)], vec![sample(0, -100)]],
        };
        assert_eq!(sync.to_host(0, 1_000), Some(1_500));
        assert_eq!(sync.to_host(0, 1_500), Some(1_500 + 600));
        assert_eq!(sync.to_host(0, 2_000), Some(2_700));
        // Half-way down 100 ns: -49.5 rounds toward zero, as trace-cmd's integer division does.
        assert_eq!(sync.to_host(0, 3_000), Some(3_000 + 651));
        // Past the ends the nearest pair's line goes on.
        assert_eq!(sync.to_host(0, 0), Some(301));
        assert_eq!(sync.to_host(0, 6_000), Some(6_000 + 501));
        // One sample: an offset.
        assert_eq!(sync.to_host(1, 50), Some(0));
        assert_eq!(sync.to_host(1, 5_000), Some(4_900));
        assert_eq!(sync.to_host(2, 5_000), None);
        let stepwise = ClockSync { interpolate: false, ..sync };
        assert_eq!(stepwise.to_host(0, 1_999), Some(1_999 + 500));
    }

    #[test]
    fn scaling_is_applied_with_its_fraction_bits() {
        // Guest ticks 1.5 × faster on the host's scale: scaling 3 with one fraction bit.
        let s = |time, offset| SyncSample { time, offset, scaling: 3, fraction: 1 };
        let sync = ClockSync { peer_trace_id: 0, interpolate: true, cpus: vec![vec![s(0, 10), s(1_000, 10)]] };
        assert_eq!(sync.to_host(0, 1_000), Some(1_510));
        // Offsets far apart and huge times neither overflow nor wrap.
        let wide = ClockSync {
            peer_trace_id: 0,
            interpolate: true,
            cpus: vec![vec![sample(0, i64::MIN), sample(1, i64::MAX)]],
        };
        assert!(wide.to_host(0, u64::MAX).is_some());
        assert_eq!(wide.to_host(0, u64::MAX / 2), Some(u64::MAX));
        assert_eq!(wide.to_host(0, 0), Some(0));
    }
}
