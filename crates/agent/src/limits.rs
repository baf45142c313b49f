//! What a guest may send the host, whatever it claims: a guest is untrusted, and a
//! compromised one must not be able to fill the host's memory or disk through virtprof. Rows,
//! noise periods and clock points are taken at most at a rate set by the host (from the
//! interval the guest claims, clamped), data in all at most up to a byte cap per run, series
//! names in number and length; what is over is counted and dropped, and the rows' loss is
//! recorded as a gap.

use std::collections::HashSet;

use virtprof_model::guest::{GuestInfo, GuestSeries};

/// How often an agent sends a ptp_kvm clock point (a line through points a second apart
/// aligns rows of any interval). The host takes one at most every half of that: arrivals
/// jitter, and an honest agent must never be over the limit.
pub const PTP_EVERY_NS: u64 = 1_000_000_000;

/// The host's limits on one agent's link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GuestLimits {
    /// The shortest row interval taken from a guest's claim (shorter claims are clamped).
    pub min_interval_ns: u64,
    /// Bytes of rows, noise periods and schemas taken from the agent over the whole run.
    pub max_bytes: u64,
    /// Series in one schema.
    pub max_series: usize,
    /// Bytes in one series name or unit.
    pub max_name_bytes: usize,
    /// ptp_kvm clock points are taken at most this often (host time).
    pub ptp_every_ns: u64,
    /// Clock points kept over the whole run.
    pub max_points: u64,
    /// Distinct series names over the whole run (every name becomes a column of the
    /// recording's interval table, so names multiply with rows).
    pub max_names: usize,
}

impl Default for GuestLimits {
    fn default() -> GuestLimits {
        GuestLimits {
            min_interval_ns: 10_000_000,
            max_bytes: 256 << 20,
            max_series: 4096,
            max_name_bytes: 256,
            ptp_every_ns: PTP_EVERY_NS / 2,
            max_points: 1 << 17,
            max_names: 16384,
        }
    }
}

impl GuestLimits {
    /// Whether a schema is within the limits; why not, if it is not.
    pub fn check_series(&self, series: &[GuestSeries]) -> Result<(), String> {
        if series.len() > self.max_series {
            return Err(format!("{} series (the most taken is {})", series.len(), self.max_series));
        }
        match series.iter().find(|s| s.name.len() > self.max_name_bytes || s.unit.len() > self.max_name_bytes) {
            Some(s) => Err(format!(
                "a series name or unit of {} bytes (the most taken is {})",
                s.name.len().max(s.unit.len()),
                self.max_name_bytes
            )),
            None => Ok(()),
        }
    }

    /// The guest's description cut to size: its strings to `max_name_bytes` each (at a
    /// character boundary), its list of unavailable sources to 64 entries.
    pub fn trim_info(&self, info: &mut GuestInfo) {
        let cut = |s: &mut String, max: usize| {
            if s.len() > max {
                let at = (0..=max).rev().find(|&i| s.is_char_boundary(i)).unwrap_or(0);
                s.truncate(at);
            }
        };
        for s in [&mut info.hostname, &mut info.kernel, &mut info.agent_version, &mut info.clocksource] {
            cut(s, self.max_name_bytes);
        }
        if let Some(p) = &mut info.ptp_kvm {
            cut(p, self.max_name_bytes);
        }
        info.unavailable.truncate(64);
        for (what, why) in &mut info.unavailable {
            cut(what, self.max_name_bytes);
            cut(why, 2 * self.max_name_bytes);
        }
    }

    /// Rows per second taken from a guest that claims `interval_ns`: twice its claim (a late
    /// row and the next may come close together), clamped at `min_interval_ns`.
    pub fn rows_per_second(&self, interval_ns: u64) -> f64 {
        2e9 / interval_ns.max(self.min_interval_ns) as f64
    }
}

/// The distinct series names a guest has used, up to the limit.
#[derive(Debug, Default)]
pub struct Names {
    seen: HashSet<String>,
}

impl Names {
    /// Take the names of `series` if, with those seen before, they stay within `max`.
    pub fn admit(&mut self, series: &[GuestSeries], max: usize) -> bool {
        let new: HashSet<&str> = series.iter().map(|s| s.name.as_str()).filter(|n| !self.seen.contains(*n)).collect();
        if self.seen.len() + new.len() > max {
            return false;
        }
        self.seen.extend(new.into_iter().map(String::from));
        true
    }
}

/// A token bucket on host time: `take` is true while the rate (with its burst) allows.
#[derive(Debug, Clone, Copy)]
pub struct Rate {
    per_ns: f64,
    burst: f64,
    tokens: f64,
    last_ns: u64,
}

impl Rate {
    /// `per_second` on average, up to `burst` at once; full at `now_ns`.
    pub fn new(per_second: f64, burst: f64, now_ns: u64) -> Rate {
        Rate { per_ns: per_second / 1e9, burst, tokens: burst, last_ns: now_ns }
    }

    /// Whether the bucket has refilled by `now_ns` (it then says nothing a new one would not).
    pub fn is_full(&self, now_ns: u64) -> bool {
        self.tokens + now_ns.saturating_sub(self.last_ns) as f64 * self.per_ns >= self.burst
    }

    /// Take one token at `now_ns`, if there is one.
    pub fn take(&mut self, now_ns: u64) -> bool {
        let elapsed = now_ns.saturating_sub(self.last_ns) as f64;
        self.last_ns = self.last_ns.max(now_ns);
        self.tokens = (self.tokens + elapsed * self.per_ns).min(self.burst);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rate_takes_its_burst_then_its_rate_and_no_more() {
        let mut r = Rate::new(10.0, 5.0, 0);
        let taken = (0..100).filter(|_| r.take(0)).count();
        assert_eq!(taken, 5, "the burst");
        // One second later: ten more (the bucket holds at most five at once).
        let mut taken = 0;
        for i in 0..1000u64 {
            taken += usize::from(r.take(i * 1_000_000));
        }
        assert!((9..=10).contains(&taken), "{taken}");
        assert!(!r.take(0), "time going backwards gives nothing");
    }

    #[test]
    fn claims_are_clamped_and_schemas_bounded() {
        let l = GuestLimits::default();
        assert_eq!(l.rows_per_second(1), 200.0, "a 1 ns claim counts as 10 ms");
        assert_eq!(l.rows_per_second(100_000_000), 20.0);
        let many: Vec<GuestSeries> = (0..5000).map(|i| GuestSeries::counter(format!("s{i}"), "x")).collect();
        assert!(l.check_series(&many).unwrap_err().contains("5000 series"));
        let long = [GuestSeries::counter("n".repeat(300), "x")];
        assert!(l.check_series(&long).unwrap_err().contains("300 bytes"));
        assert!(l.check_series(&many[..10]).is_ok());
        let mut names = Names::default();
        assert!(names.admit(&many[..3000], 4000));
        assert!(names.admit(&many[..3000], 4000), "names seen before are free");
        assert!(!names.admit(&many[2000..5000], 4000), "2000 new ones are too many");
        assert!(names.admit(&many[3000..4000], 4000));
        let mut info =
            GuestInfo { hostname: "é".repeat(200), unavailable: vec![Default::default(); 100], ..Default::default() };
        l.trim_info(&mut info);
        assert_eq!((info.hostname.len(), info.unavailable.len()), (256, 64));
    }
}
