//! Time in fixed-width bins over a window: what a timeline draws. A span is split across the
//! bins it crosses; time outside the window is left out (counted, so nothing is lost silently).

use serde::Serialize;

/// The most bins a timeline holds (a window stretched by a damaged timestamp must not ask for
/// more).
pub const MAX_BINS: usize = 4096;

/// Nanoseconds per bin from `start_ns`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TimeBins {
    /// Start of the first bin.
    pub start_ns: u64,
    /// Width of each.
    pub width_ns: u64,
    /// Time per bin, ns.
    pub ns: Vec<u64>,
    /// Time that fell outside the bins, ns.
    pub outside_ns: u64,
}

impl TimeBins {
    /// `count` bins (at most [`MAX_BINS`]) of `width_ns` (at least 1) from `start_ns`.
    pub fn new(start_ns: u64, width_ns: u64, count: usize) -> TimeBins {
        TimeBins { start_ns, width_ns: width_ns.max(1), ns: vec![0; count.min(MAX_BINS)], outside_ns: 0 }
    }

    /// The same bins, empty.
    pub fn empty_like(&self) -> TimeBins {
        TimeBins::new(self.start_ns, self.width_ns, self.ns.len())
    }

    /// Add the span `[from, to)`, split across the bins it crosses.
    pub fn add_span(&mut self, from: u64, to: u64) {
        let mut at = from.max(self.start_ns).min(to.max(from));
        self.outside_ns += at - from;
        while at < to {
            let Some(i) = self.index(at) else {
                self.outside_ns += to - at;
                return;
            };
            let bin_end = self.start_ns + (i as u64 + 1) * self.width_ns;
            let end = to.min(bin_end);
            self.ns[i] += end - at;
            at = end;
        }
    }

    /// Add `ns` at time `at` (a span short against the bins' width).
    pub fn add_at(&mut self, at: u64, ns: u64) {
        match self.index(at) {
            Some(i) => self.ns[i] += ns,
            None => self.outside_ns += ns,
        }
    }

    fn index(&self, at: u64) -> Option<usize> {
        let i = usize::try_from(at.checked_sub(self.start_ns)? / self.width_ns).ok()?;
        (i < self.ns.len()).then_some(i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_span_is_split_across_bins_and_time_outside_is_counted() {
        let mut b = TimeBins::new(100, 10, 3);
        b.add_span(105, 127);
        b.add_span(90, 101);
        b.add_at(129, 4);
        b.add_at(500, 7);
        assert_eq!(b.ns, [5 + 1, 10, 7 + 4]);
        assert_eq!(b.outside_ns, 10 + 7);
        assert_eq!(TimeBins::new(0, 0, 1 << 20).ns.len(), MAX_BINS);
    }
}
