//! Events the kernel lost, counted once for every command: the kernel's own per-CPU counters
//! (`per_cpu/cpuN/stats`: overrun + dropped, the figure `record` prints), where the ring-buffer
//! pages flagged missed events (CPU and trace-clock span), and whether the figure is known at
//! all (a recording cut before its footer has no kernel counters).
use crate::entity::KernelLoss;

/// Lost events on one CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct CpuLoss {
    /// CPU number.
    pub cpu: u32,
    /// The kernel's count (overrun + dropped) when the recording ended, if known.
    pub reported: Option<u64>,
    /// Sum of the counts stored on lossy pages.
    pub on_pages: u64,
    /// Pages that said events were lost before them (each one gap in the stream).
    pub gaps: u64,
    /// Of those, pages that had no room to store the count.
    pub gaps_uncounted: u64,
    /// Trace-clock span holding every gap: from the last event before the first gap to the
    /// first page after the last one.
    pub span_ns: Option<(u64, u64)>,
}

impl CpuLoss {
    /// The best figure for this CPU: the kernel's count, or what the pages said if more (the
    /// counters are read once at the end; a page can never overstate them on a sane host).
    pub fn total(&self) -> u64 {
        self.reported.unwrap_or(0).max(self.on_pages)
    }

    /// A gap on a page of this CPU: `count` events (if stored) lost between `from_ns` and
    /// `to_ns`.
    pub fn add_gap(&mut self, count: Option<u64>, from_ns: u64, to_ns: u64) {
        self.gaps = self.gaps.saturating_add(1);
        match count {
            Some(n) => self.on_pages = self.on_pages.saturating_add(n),
            None => self.gaps_uncounted = self.gaps_uncounted.saturating_add(1),
        }
        let (lo, hi) = self.span_ns.unwrap_or((from_ns, to_ns));
        self.span_ns = Some((lo.min(from_ns), hi.max(to_ns)));
    }

    /// Fold another account of the same CPU into this one.
    pub fn merge(&mut self, other: &CpuLoss) {
        self.reported = match (self.reported, other.reported) {
            (Some(a), Some(b)) => Some(a.saturating_add(b)),
            (a, b) => a.or(b),
        };
        self.on_pages = self.on_pages.saturating_add(other.on_pages);
        self.gaps = self.gaps.saturating_add(other.gaps);
        self.gaps_uncounted = self.gaps_uncounted.saturating_add(other.gaps_uncounted);
        if let Some((from, to)) = other.span_ns {
            let (lo, hi) = self.span_ns.unwrap_or((from, to));
            self.span_ns = Some((lo.min(from), hi.max(to)));
        }
    }
}

/// Lost events of a whole trace.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Loss {
    /// Per CPU, those with any loss or a kernel count, by CPU number.
    pub cpus: Vec<CpuLoss>,
    /// Whether the kernel's counters are known for the whole trace. False for a recording
    /// without its footer (a killed `record`): loss after `known_until_byte` is unknown.
    pub complete: bool,
    /// Where an incomplete recording ends: loss is known only up to this byte.
    #[cfg_attr(feature = "serde", serde(default, skip_serializing_if = "Option::is_none"))]
    pub known_until_byte: Option<u64>,
    /// Why the kernel's counts are unknown, where it is not a missing footer (e.g. a footer
    /// whose figures no kernel can have written).
    #[cfg_attr(feature = "serde", serde(default, skip_serializing_if = "Option::is_none"))]
    pub unknown_because: Option<String>,
    /// Events skipped because their timestamps lie outside the recording's time span (a
    /// damaged page): not lost by the kernel, but not in any figure either.
    #[cfg_attr(feature = "serde", serde(default, skip_serializing_if = "is_zero"))]
    pub outside_span: u64,
}

#[cfg(feature = "serde")]
fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Loss {
    /// The CPU's entry, created if new (kept sorted by CPU).
    pub fn cpu(&mut self, cpu: u32) -> &mut CpuLoss {
        let i = match self.cpus.binary_search_by_key(&cpu, |c| c.cpu) {
            Ok(i) => i,
            Err(i) => {
                self.cpus.insert(i, CpuLoss { cpu, ..CpuLoss::default() });
                i
            }
        };
        &mut self.cpus[i]
    }

    /// Record the kernel's count for `cpu` (added to what is there: sums saturate, so
    /// corrupt counters can never wrap to a small figure).
    pub fn report(&mut self, cpu: u32, count: u64) {
        let c = self.cpu(cpu);
        c.reported = Some(c.reported.unwrap_or(0).saturating_add(count));
    }

    /// Record the kernel's `per_cpu/cpuN/stats` counters of a CPU: events overwritten before
    /// they were read plus events dropped because the buffer was full.
    pub fn report_counters(&mut self, counters: &KernelLoss) {
        self.report(counters.cpu.0, counters.events());
    }

    /// Fold `other` in, CPU by CPU.
    pub fn merge(&mut self, other: &Loss) {
        for c in &other.cpus {
            self.cpu(c.cpu).merge(c);
        }
        self.outside_span = self.outside_span.saturating_add(other.outside_span);
    }

    /// Events lost in all, saturating.
    pub fn total(&self) -> u64 {
        self.cpus.iter().fold(0u64, |sum, c| sum.saturating_add(c.total()))
    }

    /// Gaps (lossy pages) over all CPUs.
    pub fn gaps(&self) -> u64 {
        self.cpus.iter().fold(0u64, |sum, c| sum.saturating_add(c.gaps))
    }

    /// One line for people, e.g. `19508 (cpu1: 19508 in 29 gaps, 0.012-0.870 s)` or
    /// `unknown past byte 4096 (at least 12 on the pages before it)`; times count from
    /// `origin_ns` on the trace clock.
    pub fn describe(&self, origin_ns: u64) -> String {
        let total = self.total();
        let mut text = if self.complete {
            total.to_string()
        } else if let Some(why) = &self.unknown_because {
            format!("unknown: {why} (at least {total} on the pages)")
        } else {
            let at = self.known_until_byte.map_or_else(String::new, |b| format!(" past byte {b}"));
            format!("unknown{at}: the recording has no footer with the kernel's counts (at least {total} on the pages)")
        };
        let places: Vec<String> = self
            .cpus
            .iter()
            .filter(|c| c.total() > 0 || c.gaps > 0)
            .map(|c| {
                let mut s = format!("cpu{}: {}", c.cpu, c.total());
                if c.gaps > 0 {
                    s += &format!(" in {} gap{}", c.gaps, if c.gaps == 1 { "" } else { "s" });
                    if c.gaps_uncounted > 0 {
                        s += &format!(" ({} uncounted)", c.gaps_uncounted);
                    }
                }
                if let Some((from, to)) = c.span_ns {
                    let s_of = |ns: u64| ns.saturating_sub(origin_ns) as f64 / 1e9;
                    s += &format!(", {:.3}-{:.3} s", s_of(from), s_of(to));
                }
                s
            })
            .collect();
        if !places.is_empty() {
            text += &format!(" ({})", places.join("; "));
        }
        if self.outside_span > 0 {
            text += &format!(
                "; {} events skipped: their timestamps lie outside the recording's time span (a damaged page?)",
                self.outside_span
            );
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_saturate_instead_of_wrapping() {
        let mut loss = Loss { complete: true, ..Loss::default() };
        loss.report(0, u64::MAX);
        loss.report(1, u64::MAX);
        loss.report(2, 12);
        assert_eq!(loss.total(), u64::MAX);
        loss.report(0, 5);
        assert_eq!(loss.cpus[0].reported, Some(u64::MAX));
    }

    #[test]
    fn the_kernel_count_and_the_pages_agree_or_the_larger_wins() {
        let mut loss = Loss { complete: true, ..Loss::default() };
        loss.report(1, 100);
        loss.cpu(1).add_gap(Some(60), 2_000, 3_000);
        loss.cpu(1).add_gap(None, 5_000, 6_000);
        assert_eq!(loss.total(), 100);
        loss.cpu(0).add_gap(Some(7), 1_000, 1_500);
        assert_eq!(loss.total(), 107);
        assert_eq!(
            loss.describe(1_000),
            "107 (cpu0: 7 in 1 gap, 0.000-0.000 s; cpu1: 100 in 2 gaps (1 uncounted), 0.000-0.000 s)"
        );
        assert_eq!(loss.cpus[1].span_ns, Some((2_000, 6_000)));
    }

    #[test]
    fn an_incomplete_recording_says_its_loss_is_unknown() {
        let mut loss = Loss { complete: false, known_until_byte: Some(4096), ..Loss::default() };
        loss.cpu(0).add_gap(Some(12), 0, 10);
        assert!(loss.describe(0).starts_with("unknown past byte 4096"), "{}", loss.describe(0));
        assert!(loss.describe(0).contains("at least 12"));
    }
}
