//! Phase detection over interval vectors: every row is a point (its columns median-filtered
//! over time, log-scaled and z-scored), k-means groups them, k is the one with the best mean
//! silhouette, runs no longer than the filter's reach are merged into a neighbour, and each
//! boundary is then placed where the unfiltered rows change. Deterministic: the seeds are chosen farthest-first from the first row, so the same table
//! always gives the same phases.

/// The phases found.
#[derive(Debug, Clone, PartialEq)]
pub struct Phases {
    /// Distinct phases (the clusters left once short runs are merged into their neighbours).
    pub k: usize,
    /// Mean silhouette of that clustering (−1..1; above ~0.5 is a clear structure).
    pub silhouette: f64,
    /// Phase id of every row, numbered in order of first appearance.
    pub ids: Vec<usize>,
}

impl Phases {
    /// Rows where the phase id changes (the first row of each new phase).
    pub fn boundaries(&self) -> Vec<usize> {
        (1..self.ids.len()).filter(|&i| self.ids[i] != self.ids[i - 1]).collect()
    }
}

/// Rows at most this many enter the silhouette (it is quadratic); longer runs are strided.
const SILHOUETTE_ROWS: usize = 1500;

/// Cluster `rows` (one feature vector each, in time order; NaN counts as the column's mean)
/// into phases, trying k = 1..=max_k. A single phase is chosen when no k ≥ 2 separates the
/// rows well. Runs of at most `blip_rows` rows are not phases: a VM that got no CPU for an
/// interval or two (host contention) changes every count at once, which looks like a phase
/// to k-means but is not one of the workload's.
pub fn detect(rows: &[Vec<f64>], max_k: usize, blip_rows: usize) -> Phases {
    let n = rows.len();
    let single = Phases { k: 1, silhouette: 0.0, ids: vec![0; n] };
    // z-scoring makes noise look like structure, and the silhouette is scale-free: a run
    // whose every column stays within a few percent of its mean is one phase, whatever
    // k-means would make of its noise.
    if n < 4 || max_variation(rows) < MIN_VARIATION {
        return single;
    }
    // Counts span orders of magnitude between phases (a million loop iterations against a
    // hundred exits per interval): compare them on a log scale, which also keeps one startup
    // spike from dwarfing every other difference.
    // Events seen in only a few intervals (startup page faults, one TLB flush) do not make a
    // phase, and would pull single rows into clusters of their own: such columns are dropped.
    let width = rows[0].len();
    let min_rows = (n / 20).max(2);
    let kept: Vec<usize> =
        (0..width).filter(|&c| rows.iter().filter(|r| r[c].is_finite() && r[c] != 0.0).count() >= min_rows).collect();
    let kept_rows: Vec<Vec<f64>> = rows.iter().map(|r| kept.iter().map(|&c| r[c]).collect()).collect();
    let log = |rows: &[Vec<f64>]| -> Vec<Vec<f64>> {
        rows.iter()
            .map(|r| r.iter().map(|&v| if v.is_finite() { v.signum() * v.abs().ln_1p() } else { v }).collect())
            .collect()
    };
    let points = standardize(&log(&median_filtered(&kept_rows, blip_rows)));
    let mut best = single;
    for k in 2..=max_k.min(n - 1) {
        let labels = kmeans(&points, k);
        let s = silhouette(&points, &labels, k);
        // A better structure is needed to split further, by a margin: over-splitting a phase
        // gives a slightly higher silhouette by noise alone. The margin is small because a
        // short phase (a tenth of the run) raises the mean silhouette only a little, and the
        // median filter has already taken out most of the noise.
        if s > best.silhouette + 0.005 && s > 0.25 {
            best = Phases { k, silhouette: s, ids: labels };
        }
    }
    if best.k > 1 {
        absorb_blips(&mut best.ids, &points, blip_rows);
        refine_boundaries(&mut best.ids, &standardize(&log(&kept_rows)), blip_rows);
        best.ids = renumber(&best.ids);
        best.k = best.ids.iter().max().map_or(1, |m| m + 1);
    }
    best
}

/// Every column replaced by its running median over `reach` rows either side (the window
/// shrinks at the ends). A median keeps the edge of a step where it is, unlike a mean, and
/// removes any excursion of at most `reach` rows.
fn median_filtered(rows: &[Vec<f64>], reach: usize) -> Vec<Vec<f64>> {
    if reach == 0 {
        return rows.to_vec();
    }
    let mut out = rows.to_vec();
    let mut window = Vec::with_capacity(2 * reach + 1);
    for c in 0..rows.first().map_or(0, Vec::len) {
        for (r, row) in out.iter_mut().enumerate() {
            window.clear();
            let span = r.saturating_sub(reach)..(r + reach + 1).min(rows.len());
            window.extend(rows[span].iter().map(|w| w[c]).filter(|v| v.is_finite()));
            if window.is_empty() {
                continue;
            }
            window.sort_unstable_by(f64::total_cmp);
            let mid = window.len() / 2;
            row[c] = if window.len() % 2 == 1 { window[mid] } else { (window[mid - 1] + window[mid]) / 2.0 };
        }
    }
    out
}

/// Merges every run of at most `blip_rows` rows into the neighbouring run whose centre is
/// nearer, shortest runs first, until none is left (or one run remains). A run between two
/// phases (the rows that straddle a change) joins one of them: the boundary moves by at most
/// its length.
fn absorb_blips(labels: &mut [usize], points: &[Vec<f64>], blip_rows: usize) {
    loop {
        let runs = runs(labels);
        if runs.len() < 2 {
            return;
        }
        let Some(short) = (0..runs.len()).filter(|&i| runs[i].len() <= blip_rows).min_by_key(|&i| runs[i].len()) else {
            return;
        };
        let run = runs[short].clone();
        let neighbours = [short.checked_sub(1), (short + 1 < runs.len()).then_some(short + 1)];
        let target = neighbours
            .into_iter()
            .flatten()
            .min_by(|&a, &b| run_distance(points, &run, &runs[a]).total_cmp(&run_distance(points, &run, &runs[b])))
            .expect("a run among two or more has a neighbour");
        let label = labels[runs[target].start];
        labels[run].fill(label);
    }
}

/// Moves every boundary to where the unfiltered rows change: the median filter keeps a clean
/// step in place, but on noisy rows (few events per interval) it can shift it by a few rows.
/// Each boundary may move by up to `reach` rows, staying inside its two runs, to the split
/// that puts the rows around it nearest to their runs' centres.
fn refine_boundaries(labels: &mut [usize], raw: &[Vec<f64>], reach: usize) {
    let runs = runs(labels);
    // Taken before any boundary moves: a moved boundary may relabel the next run's first row.
    let run_labels: Vec<usize> = runs.iter().map(|r| labels[r.start]).collect();
    for (i, pair) in runs.windows(2).enumerate() {
        let (a, b) = (&pair[0], &pair[1]);
        let (ca, cb) = (centre(raw, a), centre(raw, b));
        let lo = b.start.saturating_sub(reach).max(a.start + 1);
        let hi = (b.start + reach).min(b.end - 1);
        let cost = |split: usize| -> f64 {
            (lo - 1..=hi).map(|r| distance2(&raw[r], if r < split { &ca } else { &cb })).sum()
        };
        let best =
            (lo..=hi).min_by(|&x, &y| cost(x).total_cmp(&cost(y)).then(x.abs_diff(b.start).cmp(&y.abs_diff(b.start))));
        if let Some(split) = best {
            labels[lo - 1..split].fill(run_labels[i]);
            labels[split..=hi].fill(run_labels[i + 1]);
        }
    }
}

/// Mean of a run of rows (runs are never empty).
fn centre(points: &[Vec<f64>], run: &std::ops::Range<usize>) -> Vec<f64> {
    mean(&points[run.clone()]).expect("a run has rows")
}

/// Component-wise mean of some points; None when there are none.
fn mean<'a>(points: impl IntoIterator<Item = &'a Vec<f64>>) -> Option<Vec<f64>> {
    let mut points = points.into_iter();
    let mut sum = points.next()?.clone();
    let mut n = 1.0;
    for p in points {
        sum.iter_mut().zip(p).for_each(|(s, x)| *s += x);
        n += 1.0;
    }
    sum.iter_mut().for_each(|s| *s /= n);
    Some(sum)
}

/// Consecutive rows with the same label.
fn runs(labels: &[usize]) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    for i in 1..=labels.len() {
        if i == labels.len() || labels[i] != labels[start] {
            out.push(start..i);
            start = i;
        }
    }
    out
}

/// Distance between the centres of two runs of rows.
fn run_distance(points: &[Vec<f64>], a: &std::ops::Range<usize>, b: &std::ops::Range<usize>) -> f64 {
    distance2(&centre(points, a), &centre(points, b))
}

/// Coefficient of variation (sd / |mean|) a column needs for the run to have phases at all.
const MIN_VARIATION: f64 = 0.15;

fn max_variation(rows: &[Vec<f64>]) -> f64 {
    let width = rows.first().map_or(0, Vec::len);
    (0..width)
        .filter_map(|c| column_mean_sd(rows, c))
        .map(|(mean, sd)| if sd == 0.0 { 0.0 } else { sd / mean.abs().max(f64::MIN_POSITIVE) })
        .fold(0.0, f64::max)
}

/// Mean and standard deviation of column `c` over its finite values (None when it has none).
fn column_mean_sd(rows: &[Vec<f64>], c: usize) -> Option<(f64, f64)> {
    let (n, sum) = rows.iter().map(|r| r[c]).filter(|v| v.is_finite()).fold((0usize, 0.0), |(n, s), v| (n + 1, s + v));
    if n == 0 {
        return None;
    }
    let mean = sum / n as f64;
    let var = rows.iter().map(|r| r[c]).filter(|v| v.is_finite()).map(|v| (v - mean).powi(2)).sum::<f64>() / n as f64;
    Some((mean, var.sqrt()))
}

fn standardize(rows: &[Vec<f64>]) -> Vec<Vec<f64>> {
    let width = rows.first().map_or(0, Vec::len);
    let mut out = vec![vec![0.0; width]; rows.len()];
    for c in 0..width {
        let Some((mean, sd)) = column_mean_sd(rows, c) else { continue };
        for (r, row) in rows.iter().enumerate() {
            let v = if row[c].is_finite() { row[c] } else { mean };
            // Clipped, so that an outlier row weighs like a strong value, not like a phase.
            out[r][c] = if sd > 0.0 { ((v - mean) / sd).clamp(-3.0, 3.0) } else { 0.0 };
        }
    }
    out
}

fn distance2(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum()
}

fn kmeans(points: &[Vec<f64>], k: usize) -> Vec<usize> {
    // Farthest-first seeds: deterministic and spread over the data.
    let mut centers = vec![points[0].clone()];
    while centers.len() < k {
        let far = (0..points.len())
            .max_by(|&a, &b| {
                let da = centers.iter().map(|c| distance2(&points[a], c)).fold(f64::MAX, f64::min);
                let db = centers.iter().map(|c| distance2(&points[b], c)).fold(f64::MAX, f64::min);
                da.total_cmp(&db)
            })
            .expect("points is not empty");
        centers.push(points[far].clone());
    }
    let mut labels = vec![0; points.len()];
    for _ in 0..100 {
        let mut moved = false;
        for (p, label) in points.iter().zip(labels.iter_mut()) {
            let nearest = (0..k).min_by(|&a, &b| distance2(p, &centers[a]).total_cmp(&distance2(p, &centers[b])));
            let nearest = nearest.expect("k >= 1");
            moved |= nearest != *label;
            *label = nearest;
        }
        for (c, center) in centers.iter_mut().enumerate() {
            // An emptied cluster keeps its centre.
            if let Some(m) = mean(points.iter().zip(&labels).filter(|(_, &l)| l == c).map(|(p, _)| p)) {
                *center = m;
            }
        }
        if !moved {
            break;
        }
    }
    labels
}

fn silhouette(points: &[Vec<f64>], labels: &[usize], k: usize) -> f64 {
    let stride = points.len().div_ceil(SILHOUETTE_ROWS).max(1);
    let sample: Vec<usize> = (0..points.len()).step_by(stride).collect();
    let mut total = 0.0;
    for &i in &sample {
        let mut sums = vec![(0.0, 0usize); k];
        for &j in &sample {
            if i != j {
                let s = &mut sums[labels[j]];
                s.0 += distance2(&points[i], &points[j]).sqrt();
                s.1 += 1;
            }
        }
        let own = sums[labels[i]];
        if own.1 == 0 {
            continue; // a singleton scores 0
        }
        let a = own.0 / own.1 as f64;
        let b = (0..k)
            .filter(|&c| c != labels[i] && sums[c].1 > 0)
            .map(|c| sums[c].0 / sums[c].1 as f64)
            .fold(f64::MAX, f64::min);
        if b == f64::MAX {
            continue;
        }
        total += (b - a) / a.max(b).max(f64::MIN_POSITIVE);
    }
    total / sample.len() as f64
}

fn renumber(labels: &[usize]) -> Vec<usize> {
    let mut order: Vec<usize> = Vec::new();
    labels
        .iter()
        .map(|&l| match order.iter().position(|&o| o == l) {
            Some(i) => i,
            None => {
                order.push(l);
                order.len() - 1
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn noisy(level: [f64; 2], n: usize, seed: &mut u64) -> Vec<Vec<f64>> {
        (0..n)
            .map(|_| {
                level
                    .iter()
                    .map(|&l| {
                        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                        l + ((*seed >> 33) as f64 / (1u64 << 31) as f64 - 0.5) * 0.1 * l.max(1.0)
                    })
                    .collect()
            })
            .collect()
    }

    #[test]
    fn three_scripted_phases_are_found_with_their_boundaries() {
        let mut seed = 1;
        let mut rows = noisy([100.0, 0.0], 30, &mut seed);
        rows.extend(noisy([10.0, 5000.0], 20, &mut seed));
        rows.extend(noisy([50.0, 0.0], 25, &mut seed));
        rows.extend(noisy([100.0, 0.0], 30, &mut seed));
        let p = detect(&rows, 6, 1);
        assert_eq!(p.k, 3, "silhouette {}", p.silhouette);
        assert_eq!(p.boundaries(), vec![30, 50, 75]);
        assert_eq!(p.ids[0], p.ids[104], "the return to the first phase gets its id back");
    }

    #[test]
    fn a_flat_run_is_one_phase() {
        let mut seed = 7;
        let p = detect(&noisy([100.0, 20.0], 50, &mut seed), 6, 1);
        assert_eq!(p.k, 1);
        assert!(p.boundaries().is_empty());
    }

    /// Host contention: now and then the VM gets no CPU for an interval or two, and every
    /// count drops at once. Those rows are not phases.
    #[test]
    fn starved_intervals_are_not_phases() {
        let mut seed = 3;
        let mut rows = noisy([1000.0, 0.0], 30, &mut seed);
        rows.extend(noisy([100.0, 5000.0], 30, &mut seed));
        rows.extend(noisy([1000.0, 0.0], 30, &mut seed));
        for starved in [5, 6, 20, 41, 42, 70] {
            rows[starved].iter_mut().for_each(|v| *v *= 0.05);
        }
        let p = detect(&rows, 6, 2);
        assert_eq!(p.boundaries(), vec![30, 60]);
        assert_eq!(p.k, 2);
        let blips = detect(&rows, 6, 0);
        assert!(blips.boundaries().len() > 2, "without the filter the starved rows split: {:?}", blips.boundaries());
    }

    #[test]
    fn a_run_between_two_phases_joins_the_nearer_one() {
        let points = vec![vec![0.0], vec![0.0], vec![0.0], vec![0.9], vec![1.0], vec![1.0], vec![1.0]];
        let mut labels = vec![0, 0, 0, 2, 1, 1, 1];
        absorb_blips(&mut labels, &points, 1);
        assert_eq!(labels, vec![0, 0, 0, 1, 1, 1, 1]);
        let mut a_b_a = vec![0, 0, 1, 0, 0];
        absorb_blips(&mut a_b_a, &points[..5], 1);
        assert_eq!(a_b_a, vec![0; 5]);
    }

    #[test]
    fn boundaries_move_to_where_the_unfiltered_rows_change() {
        let raw: Vec<Vec<f64>> = (0..30).map(|r| vec![if (10..20).contains(&r) { 1.0 } else { 0.0 }]).collect();
        // Both boundaries found two rows early: moving the first one relabels the second
        // run's first row, which must not change the label the second boundary gives it.
        let mut labels: Vec<usize> = (0..30)
            .map(|r| {
                if r < 8 {
                    0
                } else if r < 18 {
                    1
                } else {
                    2
                }
            })
            .collect();
        refine_boundaries(&mut labels, &raw, 3);
        let want: Vec<usize> = (0..30).map(|r| r / 10).collect();
        assert_eq!(labels, want);
    }
}
