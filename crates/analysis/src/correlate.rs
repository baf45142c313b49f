//! Correlation matrices over interval columns (VrtProf Figures 2 and 3), and the difference
//! of two runs' matrices with the largest changes first.

/// Pearson or Spearman (Pearson of ranks: robust to outliers and monotone non-linearity).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// Linear correlation.
    Pearson,
    /// Rank correlation.
    Spearman,
}

/// A symmetric matrix over named metrics.
#[derive(Debug, Clone, PartialEq)]
pub struct Matrix {
    /// Metric names, in row/column order.
    pub names: Vec<String>,
    /// Row-major values; NaN where a pair has too few common rows or no variance.
    pub values: Vec<f64>,
}

impl Matrix {
    /// Value at (i, j).
    pub fn get(&self, i: usize, j: usize) -> f64 {
        self.values[i * self.names.len() + j]
    }

    /// Value for two names.
    pub fn by_name(&self, a: &str, b: &str) -> Option<f64> {
        let i = self.names.iter().position(|n| n == a)?;
        let j = self.names.iter().position(|n| n == b)?;
        Some(self.get(i, j))
    }
}

/// Correlate every pair of `series` (name, values), over the rows where both are known.
/// Constant series (no variance) are dropped: their correlation is undefined.
pub fn matrix(series: &[(String, Vec<f64>)], method: Method) -> Matrix {
    let kept: Vec<&(String, Vec<f64>)> = series.iter().filter(|(_, v)| has_variance(v)).collect();
    let prepared: Vec<Vec<f64>> = kept
        .iter()
        .map(|(_, v)| match method {
            Method::Pearson => v.clone(),
            Method::Spearman => ranks(v),
        })
        .collect();
    let n = kept.len();
    let mut values = vec![f64::NAN; n * n];
    for i in 0..n {
        for j in i..n {
            let r = if i == j { 1.0 } else { pearson(&prepared[i], &prepared[j]) };
            values[i * n + j] = r;
            values[j * n + i] = r;
        }
    }
    Matrix { names: kept.iter().map(|(name, _)| name.clone()).collect(), values }
}

fn has_variance(v: &[f64]) -> bool {
    let mut known = v.iter().filter(|x| !x.is_nan());
    let Some(first) = known.next() else { return false };
    known.any(|x| x != first)
}

/// Pearson correlation over the positions where both are known.
pub fn pearson(a: &[f64], b: &[f64]) -> f64 {
    let pairs = || a.iter().zip(b).filter(|(x, y)| !x.is_nan() && !y.is_nan());
    let n = pairs().count() as f64;
    if n < 3.0 {
        return f64::NAN;
    }
    let (ma, mb) = pairs().fold((0.0, 0.0), |(sa, sb), (x, y)| (sa + x, sb + y));
    let (ma, mb) = (ma / n, mb / n);
    let (mut sab, mut saa, mut sbb) = (0.0, 0.0, 0.0);
    for (x, y) in pairs() {
        sab += (x - ma) * (y - mb);
        saa += (x - ma) * (x - ma);
        sbb += (y - mb) * (y - mb);
    }
    if saa == 0.0 || sbb == 0.0 {
        return f64::NAN;
    }
    (sab / (saa * sbb).sqrt()).clamp(-1.0, 1.0)
}

/// Average ranks (ties share their mean rank); NaN stays NaN.
pub fn ranks(v: &[f64]) -> Vec<f64> {
    let mut order: Vec<usize> = (0..v.len()).filter(|&i| !v[i].is_nan()).collect();
    order.sort_by(|&a, &b| v[a].total_cmp(&v[b]));
    let mut out = vec![f64::NAN; v.len()];
    let mut i = 0;
    while i < order.len() {
        let mut j = i;
        while j + 1 < order.len() && v[order[j + 1]] == v[order[i]] {
            j += 1;
        }
        let rank = (i + j) as f64 / 2.0 + 1.0;
        for &k in &order[i..=j] {
            out[k] = rank;
        }
        i = j + 1;
    }
    out
}

/// One pair's change between two runs.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    /// First metric.
    pub a: String,
    /// Second metric.
    pub b: String,
    /// Correlation in the first run (NaN: constant or absent there, counted as 0).
    pub before: f64,
    /// Correlation in the second run.
    pub after: f64,
}

impl Change {
    /// after − before, with undefined correlations taken as 0 (no linear relation).
    pub fn delta(&self) -> f64 {
        let z = |x: f64| if x.is_nan() { 0.0 } else { x };
        z(self.after) - z(self.before)
    }
}

/// Pairs over the union of both matrices' metrics, largest |change| first.
pub fn differences(before: &Matrix, after: &Matrix) -> Vec<Change> {
    let mut names: Vec<&String> = before.names.iter().chain(&after.names).collect();
    names.sort();
    names.dedup();
    let mut changes = Vec::new();
    for (i, a) in names.iter().enumerate() {
        for b in &names[i + 1..] {
            let get = |m: &Matrix| m.by_name(a, b).unwrap_or(f64::NAN);
            let change = Change { a: (*a).clone(), b: (*b).clone(), before: get(before), after: get(after) };
            if change.delta() != 0.0 {
                changes.push(change);
            }
        }
    }
    changes.sort_by(|x, y| y.delta().abs().total_cmp(&x.delta().abs()).then_with(|| x.a.cmp(&y.a)));
    changes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perfect_and_inverse_relations() {
        let x = vec![1.0, 2.0, 3.0, 4.0];
        let y = vec![2.0, 4.0, 6.0, 8.0];
        let z = vec![4.0, 3.0, 2.0, 1.0];
        let m =
            matrix(&[("x".into(), x), ("y".into(), y), ("z".into(), z), ("c".into(), vec![5.0; 4])], Method::Pearson);
        assert_eq!(m.names, vec!["x", "y", "z"], "constant series are dropped");
        assert!((m.by_name("x", "y").unwrap() - 1.0).abs() < 1e-12);
        assert!((m.by_name("x", "z").unwrap() + 1.0).abs() < 1e-12);
    }

    #[test]
    fn spearman_sees_monotone_relations_as_perfect() {
        let x: Vec<f64> = (1..=10).map(f64::from).collect();
        let y: Vec<f64> = x.iter().map(|v| v.powi(3)).collect();
        let m = matrix(&[("x".into(), x), ("y".into(), y)], Method::Spearman);
        assert!((m.by_name("x", "y").unwrap() - 1.0).abs() < 1e-12);
        let r = ranks(&[10.0, 20.0, 20.0, f64::NAN]);
        assert_eq!(&r[..3], &[1.0, 2.5, 2.5], "ties share their mean rank");
        assert!(r[3].is_nan());
    }

    #[test]
    fn differences_rank_the_largest_change_first() {
        let before = Matrix { names: vec!["a".into(), "b".into()], values: vec![1.0, 0.1, 0.1, 1.0] };
        let after = Matrix {
            names: vec!["a".into(), "b".into(), "c".into()],
            values: vec![1.0, 0.2, 0.9, 0.2, 1.0, 0.0, 0.9, 0.0, 1.0],
        };
        let d = differences(&before, &after);
        assert_eq!((d[0].a.as_str(), d[0].b.as_str()), ("a", "c"));
        assert!((d[0].delta() - 0.9).abs() < 1e-12);
    }
}
