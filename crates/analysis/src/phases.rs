//! Phase detection over interval vectors: every row is a point (its columns log-scaled and
//! z-scored), k-means
//! groups them, and k is the one with the best mean silhouette. Deterministic: the seeds are
//! chosen farthest-first from the first row, so the same table always gives the same phases.

/// The phases found.
#[derive(Debug, Clone, PartialEq)]
pub struct Phases {
    /// Clusters chosen.
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

/// Cluster `rows` (one feature vector each; NaN counts as the column's mean) into phases,
/// trying k = 1..=max_k. A single phase is chosen when no k ≥ 2 separates the rows well.
pub fn detect(rows: &[Vec<f64>], max_k: usize) -> Phases {
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
    let logged: Vec<Vec<f64>> = rows
        .iter()
        .map(|r| {
            kept.iter().map(|&c| if r[c].is_finite() { r[c].signum() * r[c].abs().ln_1p() } else { r[c] }).collect()
        })
        .collect();
    let points = standardize(&logged);
    let mut best = single;
    for k in 2..=max_k.min(n - 1) {
        let labels = kmeans(&points, k);
        let s = silhouette(&points, &labels, k);
        // A clearly better structure is needed to split further: over-splitting a phase
        // gives a slightly higher silhouette by noise alone.
        if s > best.silhouette + 0.02 && s > 0.25 {
            best = Phases { k, silhouette: s, ids: renumber(&labels) };
        }
    }
    best
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
            let members: Vec<&Vec<f64>> = points.iter().zip(&labels).filter(|(_, &l)| l == c).map(|(p, _)| p).collect();
            if members.is_empty() {
                continue;
            }
            for (d, x) in center.iter_mut().enumerate() {
                *x = members.iter().map(|m| m[d]).sum::<f64>() / members.len() as f64;
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
        let p = detect(&rows, 6);
        assert_eq!(p.k, 3, "silhouette {}", p.silhouette);
        assert_eq!(p.boundaries(), vec![30, 50, 75]);
        assert_eq!(p.ids[0], p.ids[104], "the return to the first phase gets its id back");
    }

    #[test]
    fn a_flat_run_is_one_phase() {
        let mut seed = 7;
        let p = detect(&noisy([100.0, 20.0], 50, &mut seed), 6);
        assert_eq!(p.k, 1);
        assert!(p.boundaries().is_empty());
    }
}
