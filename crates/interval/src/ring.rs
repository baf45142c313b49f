//! A fixed-size circular buffer of interval rows indexed by the global interval counter
//! (`slot = index % slots`), as VrtProf's log buffer: the producer never waits and never
//! allocates, and because every slot remembers its interval number the consumer can tell
//! intervals that were never produced (missed) from rows it was too slow to drain
//! (overwritten).

/// The circular buffer.
#[derive(Debug)]
pub struct IntervalRing {
    width: usize,
    values: Vec<f64>,
    /// Per slot: (interval index + 1, start ns, end ns); 0 marks an empty slot.
    meta: Vec<(u64, u64, u64)>,
    /// Next interval index the consumer expects.
    next_to_drain: u64,
    missed: u64,
    overwritten: u64,
}

impl IntervalRing {
    /// A ring of `slots` rows of `width` values.
    pub fn new(slots: usize, width: usize) -> Self {
        let slots = slots.max(1);
        IntervalRing {
            width,
            values: vec![0.0; slots * width],
            meta: vec![(0, 0, 0); slots],
            next_to_drain: 0,
            missed: 0,
            overwritten: 0,
        }
    }

    /// Values per row.
    pub fn width(&self) -> usize {
        self.width
    }

    /// Change the row width. Only between drains: rows still held are dropped and counted as
    /// overwritten, so call [`IntervalRing::drain`] first.
    pub fn set_width(&mut self, width: usize) {
        let held = self.meta.iter().filter(|m| m.0 != 0).count() as u64;
        self.overwritten += held;
        self.meta.iter_mut().for_each(|m| *m = (0, 0, 0));
        self.width = width;
        self.values.resize(self.meta.len() * width, 0.0);
    }

    /// The slot for interval `index`, to be filled with its values. A slot still holding an
    /// undrained earlier row is overwritten (and counted).
    pub fn produce(&mut self, index: u64, start_ns: u64, end_ns: u64) -> &mut [f64] {
        let slot = self.slot(index);
        if self.meta[slot].0 != 0 {
            self.overwritten += 1;
        }
        self.meta[slot] = (index + 1, start_ns, end_ns);
        &mut self.values[slot * self.width..(slot + 1) * self.width]
    }

    /// Hand every row up to interval `upto` (inclusive) to `sink` in order, and count the
    /// interval numbers in between that hold no row as missed.
    pub fn drain(&mut self, upto: u64, mut sink: impl FnMut(u64, u64, u64, &[f64])) {
        let slots = self.meta.len() as u64;
        // Rows older than one ring's length are gone whatever happened to them.
        if upto >= self.next_to_drain + slots {
            let skipped = upto + 1 - slots - self.next_to_drain;
            self.missed += skipped;
            self.next_to_drain += skipped;
        }
        while self.next_to_drain <= upto {
            let index = self.next_to_drain;
            let slot = self.slot(index);
            let (tag, start, end) = self.meta[slot];
            if tag == index + 1 {
                sink(index, start, end, &self.values[slot * self.width..(slot + 1) * self.width]);
                self.meta[slot] = (0, 0, 0);
            } else {
                self.missed += 1;
            }
            self.next_to_drain += 1;
        }
    }

    fn slot(&self, index: u64) -> usize {
        // The remainder is below the slot count, which is a usize.
        usize::try_from(index % self.meta.len() as u64).expect("remainder below a usize length")
    }

    /// Interval numbers that never got a row (sampler late).
    pub fn missed(&self) -> u64 {
        self.missed
    }

    /// Rows overwritten before they were drained (consumer late).
    pub fn overwritten(&self) -> u64 {
        self.overwritten
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drained(ring: &mut IntervalRing, upto: u64) -> Vec<(u64, f64)> {
        let mut out = Vec::new();
        ring.drain(upto, |i, _, _, v| out.push((i, v[0])));
        out
    }

    #[test]
    fn rows_come_back_in_interval_order() {
        let mut ring = IntervalRing::new(4, 1);
        for i in 0..3 {
            ring.produce(i, i * 10, i * 10 + 10)[0] = i as f64;
        }
        assert_eq!(drained(&mut ring, 2), vec![(0, 0.0), (1, 1.0), (2, 2.0)]);
        assert_eq!((ring.missed(), ring.overwritten()), (0, 0));
    }

    #[test]
    fn skipped_interval_numbers_are_missed() {
        let mut ring = IntervalRing::new(8, 1);
        ring.produce(0, 0, 1)[0] = 1.0;
        ring.produce(3, 1, 4)[0] = 2.0;
        assert_eq!(drained(&mut ring, 3), vec![(0, 1.0), (3, 2.0)]);
        assert_eq!(ring.missed(), 2);
    }

    #[test]
    fn a_slow_consumer_sees_overwritten_rows() {
        let mut ring = IntervalRing::new(4, 1);
        for i in 0..6 {
            ring.produce(i, i, i + 1)[0] = i as f64;
        }
        assert_eq!(ring.overwritten(), 2);
        assert_eq!(drained(&mut ring, 5), vec![(2, 2.0), (3, 3.0), (4, 4.0), (5, 5.0)]);
        assert_eq!(ring.missed(), 2, "intervals 0 and 1 were overwritten, so the consumer never saw them");
    }
}
