//! Timestamps that are not nanoseconds yet: a trace recorded with the `x86-tsc` clock holds CPU
//! cycles, which trace-cmd converts with its TSC2NSEC option (the kernel's perf clock
//! multiplier and shift) or a user-given frequency, and files may add a fixed offset.

/// Raw timestamp → nanoseconds: `((raw × mult) >> shift) + offset_ns`, saturating.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct TimeScale {
    /// Multiplier.
    pub mult: u64,
    /// Right shift after multiplying (at most 63).
    pub shift: u32,
    /// Added last (trace-cmd's OFFSET and DATE options; may be negative).
    pub offset_ns: i64,
}

impl TimeScale {
    /// Only an offset.
    pub fn offset(offset_ns: i64) -> TimeScale {
        TimeScale { mult: 1, shift: 0, offset_ns }
    }

    /// Cycles of a clock ticking `khz` thousand times a second; None for 0.
    pub fn from_khz(khz: u64) -> Option<TimeScale> {
        // ns = cycles × 10^6 / khz, as a 32-bit fixed-point multiplier.
        let mult = (1_000_000u128 << 32) / u128::from(khz.max(1));
        (khz > 0).then(|| TimeScale { mult: u64::try_from(mult).unwrap_or(u64::MAX), shift: 32, offset_ns: 0 })
    }

    /// `raw` in nanoseconds.
    #[inline]
    pub fn apply(&self, raw: u64) -> u64 {
        let scaled = (u128::from(raw) * u128::from(self.mult)) >> self.shift.min(127);
        let scaled = u64::try_from(scaled).unwrap_or(u64::MAX);
        scaled.saturating_add_signed(self.offset_ns)
    }

    /// This scale with `offset_ns` more added (a file's OFFSET on top of its TSC conversion).
    pub fn with_offset(self, offset_ns: i64) -> TimeScale {
        TimeScale { offset_ns: self.offset_ns.saturating_add(offset_ns), ..self }
    }
}

/// What a trace clock's timestamps count, by its name in tracefs' `trace_clock` (the kernel's
/// table of clocks marks which count nanoseconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClockUnit {
    /// local, global, perf, mono, mono_raw, boot, tai.
    Nanoseconds,
    /// x86-tsc and ppc-tb: a hardware counter's ticks, time once scaled by its frequency.
    Ticks,
    /// counter (one per event) and uptime (jiffies, in 10 ms ticks): no duration or
    /// latency can be read from them.
    NotTime,
    /// A name no Linux kernel has.
    Unknown,
}

/// The trace clocks that count nanoseconds, for messages.
pub const NANOSECOND_CLOCKS: &str = "local, global, perf, mono, mono_raw, boot, tai";

/// What the trace clock `name` counts.
pub fn clock_unit(name: &str) -> ClockUnit {
    match name {
        "local" | "global" | "perf" | "mono" | "mono_raw" | "boot" | "tai" => ClockUnit::Nanoseconds,
        "x86-tsc" | "ppc-tb" => ClockUnit::Ticks,
        "counter" | "uptime" => ClockUnit::NotTime,
        _ => ClockUnit::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_clocks_by_what_they_count() {
        assert_eq!(clock_unit("mono"), ClockUnit::Nanoseconds);
        assert_eq!(clock_unit("x86-tsc"), ClockUnit::Ticks);
        assert_eq!(clock_unit("counter"), ClockUnit::NotTime);
        assert_eq!(clock_unit("uptime"), ClockUnit::NotTime);
        assert_eq!(clock_unit("bogus"), ClockUnit::Unknown);
    }

    #[test]
    fn converts_cycles_and_offsets() {
        let ghz3 = TimeScale::from_khz(3_000_000).unwrap();
        assert_eq!(ghz3.apply(3_000_000_000), 999_999_999); // 1 s, truncated like the kernel's
        assert_eq!(TimeScale::from_khz(0), None);
        assert_eq!(TimeScale::offset(-5).apply(3), 0);
        assert_eq!(TimeScale::offset(5).apply(u64::MAX), u64::MAX);
        // The kernel's perf-clock pair for a 2.5 GHz TSC: mult 6710886, shift 24.
        let perf = TimeScale { mult: 6_710_886, shift: 24, offset_ns: 0 };
        assert_eq!(perf.apply(2_500_000_000) / 1000, 999_999);
        assert_eq!(perf.with_offset(10).apply(0), 10);
    }
}
