//! A log-linear histogram of nanosecond durations: fixed memory (64 exponents × 32 sub-buckets)
//! whatever the number of samples, percentiles within 1/32 (≈3%) of the true value, and exact
//! count, sum, min and max.

const SUB_BITS: u32 = 5;
const SUB: usize = 1 << SUB_BITS;

/// Duration histogram with exact count/sum/min/max.
#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    buckets: Vec<u32>,
    count: u64,
    sum: u128,
    min: u64,
    max: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram { buckets: vec![0; 64 * SUB], count: 0, sum: 0, min: u64::MAX, max: 0 }
    }
}

// Bucket arithmetic stays below 64 · SUB, so the narrowing casts here are exact.
#[allow(clippy::cast_possible_truncation)]
fn bucket_of(v: u64) -> usize {
    if v < SUB as u64 {
        return v as usize;
    }
    let exp = 63 - v.leading_zeros(); // ≥ SUB_BITS
    let sub = (v >> (exp - SUB_BITS)) as usize & (SUB - 1);
    (exp - SUB_BITS + 1) as usize * SUB + sub
}

/// The smallest value of the bucket `v` lands in: the key [`Histogram::buckets`] gives it.
pub fn bucket_start(v: u64) -> u64 {
    bucket_range(bucket_of(v)).0
}

/// The smallest and largest value that land in bucket `b`.
#[allow(clippy::cast_possible_truncation)]
fn bucket_range(b: usize) -> (u64, u64) {
    if b < SUB {
        return (b as u64, b as u64);
    }
    let exp = (b / SUB) as u32 + SUB_BITS - 1;
    let sub = (b % SUB) as u64;
    let lo = (1u64 << exp) | (sub << (exp - SUB_BITS));
    // Width minus one first: the top bucket ends at u64::MAX.
    (lo, lo + ((1u64 << (exp - SUB_BITS)) - 1))
}

impl Histogram {
    /// Add one sample.
    pub fn record(&mut self, v: u64) {
        self.buckets[bucket_of(v)] += 1;
        self.count += 1;
        self.sum += u128::from(v);
        self.min = self.min.min(v);
        self.max = self.max.max(v);
    }

    /// Number of samples.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Sum of samples.
    pub fn sum(&self) -> u64 {
        u64::try_from(self.sum).unwrap_or(u64::MAX)
    }

    /// Smallest sample (None when empty).
    pub fn min(&self) -> Option<u64> {
        (self.count > 0).then_some(self.min)
    }

    /// Largest sample (None when empty).
    pub fn max(&self) -> Option<u64> {
        (self.count > 0).then_some(self.max)
    }

    /// Mean (None when empty).
    pub fn mean(&self) -> Option<u64> {
        (self.count > 0).then(|| u64::try_from(self.sum / u128::from(self.count)).unwrap_or(u64::MAX))
    }

    /// The `q` quantile (0..=1), the midpoint of its bucket clamped to [min, max].
    pub fn quantile(&self, q: f64) -> Option<u64> {
        if self.count == 0 {
            return None;
        }
        // Rank of the sample, 1-based: the ceil(q·n)-th smallest; q·n lies in [0, count].
        #[allow(clippy::cast_possible_truncation)]
        let rank = ((q.clamp(0.0, 1.0) * self.count as f64).ceil() as u64).max(1);
        let mut seen = 0u64;
        for (b, &n) in self.buckets.iter().enumerate() {
            seen += u64::from(n);
            if seen >= rank {
                let (lo, hi) = bucket_range(b);
                return Some((lo + (hi - lo) / 2).clamp(self.min, self.max));
            }
        }
        Some(self.max)
    }

    /// The non-empty buckets, shortest first: (smallest value the bucket holds, samples).
    pub fn buckets(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.buckets.iter().enumerate().filter(|(_, &n)| n > 0).map(|(b, &n)| (bucket_range(b).0, u64::from(n)))
    }

    /// Samples at most each of `bounds` (ascending), as a Prometheus histogram's cumulative
    /// buckets: a bucket counts wholly below a bound its smallest value does not pass, so
    /// each figure is exact to within one bucket's width (1/32 of the bound).
    pub fn cumulative(&self, bounds: &[u64]) -> Vec<u64> {
        bounds.iter().map(|&bound| self.buckets().take_while(|&(lo, _)| lo <= bound).map(|(_, n)| n).sum()).collect()
    }

    /// A histogram counted elsewhere with the same buckets (the in-kernel program's): samples
    /// per bucket index, and the exact sum, min and max. Buckets past the last are refused.
    pub fn from_parts(
        buckets: impl IntoIterator<Item = (usize, u64)>,
        sum: u64,
        min: u64,
        max: u64,
    ) -> Option<Histogram> {
        let mut h = Histogram::default();
        for (b, n) in buckets {
            let slot = h.buckets.get_mut(b)?;
            *slot = slot.saturating_add(u32::try_from(n).unwrap_or(u32::MAX));
            h.count = h.count.saturating_add(n);
        }
        h.sum = u128::from(sum);
        (h.min, h.max) = if h.count > 0 { (min, max) } else { (u64::MAX, 0) };
        Some(h)
    }

    /// The bucket index `v` lands in (what [`Histogram::from_parts`] takes).
    pub fn bucket_index(v: u64) -> usize {
        bucket_of(v)
    }

    /// Add another histogram's samples.
    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.buckets.iter_mut().zip(&other.buckets) {
            *a = a.saturating_add(*b);
        }
        self.count = self.count.saturating_add(other.count);
        self.sum += other.sum;
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_histogram_from_its_parts_equals_the_one_recorded() {
        let mut h = Histogram::default();
        let samples = [3u64, 31, 32, 33, 1000, 1023, 1024, 123_456_789];
        samples.iter().for_each(|&v| h.record(v));
        let mut parts = std::collections::BTreeMap::new();
        for &v in &samples {
            *parts.entry(Histogram::bucket_index(v)).or_insert(0u64) += 1;
        }
        let rebuilt = Histogram::from_parts(parts, samples.iter().sum(), 3, 123_456_789).unwrap();
        assert_eq!(rebuilt, h);
        assert!(Histogram::from_parts([(64 * SUB, 1)], 1, 1, 1).is_none());
    }

    #[test]
    fn listed_buckets_hold_every_sample() {
        let mut h = Histogram::default();
        [5u64, 5, 40, 1_000_000].iter().for_each(|&v| h.record(v));
        let listed: Vec<(u64, u64)> = h.buckets().collect();
        assert_eq!(listed.iter().map(|b| b.1).sum::<u64>(), 4);
        assert_eq!(listed[0], (5, 2));
        assert!(listed.windows(2).all(|w| w[0].0 < w[1].0));
    }

    #[test]
    fn cumulative_counts_are_within_a_bucket_of_exact() {
        let mut h = Histogram::default();
        (1..=10_000u64).for_each(|v| h.record(v * 100));
        let bounds = [50, 1_000, 25_000, 500_000, 1_000_000, 2_000_000];
        let got = h.cumulative(&bounds);
        for (&bound, &n) in bounds.iter().zip(&got) {
            let exact = (bound / 100).min(10_000);
            assert!(n.abs_diff(exact) <= exact / 32 + 1, "≤{bound}: {n} vs {exact}");
        }
        assert_eq!(got.last(), Some(&10_000));
        assert!(got.windows(2).all(|w| w[0] <= w[1]));
    }

    #[test]
    fn buckets_cover_values_in_order() {
        for v in [0u64, 1, 31, 32, 33, 63, 64, 1000, 123_456_789, u64::MAX / 3] {
            let (lo, hi) = bucket_range(bucket_of(v));
            assert!(lo <= v && v <= hi, "{v} not in [{lo}, {hi}]");
        }
    }

    #[test]
    fn quantiles_are_within_the_bucket_precision() {
        let mut h = Histogram::default();
        for v in 1..=10_000u64 {
            h.record(v * 100);
        }
        assert_eq!((h.count(), h.min(), h.max()), (10_000, Some(100), Some(1_000_000)));
        assert_eq!(h.mean(), Some(500_050));
        for (q, exact) in [(0.5, 500_000.0), (0.99, 990_000.0)] {
            let got = h.quantile(q).unwrap() as f64;
            assert!((got - exact).abs() / exact < 1.0 / 32.0, "q{q}: {got} vs {exact}");
        }
        assert_eq!(Histogram::default().quantile(0.5), None);
    }
}
