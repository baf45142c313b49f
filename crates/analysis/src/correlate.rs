//! Correlation matrices over interval columns (VrtProf Figures 2 and 3), several runs'
//! matrices summarised (mean and spread per pair), and the difference of two sides with the
//! largest changes first.

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

    /// Where each of `names` is in this matrix, found once for lookups over many pairs.
    fn positions<S: AsRef<str>>(&self, names: &[S]) -> Vec<Option<usize>> {
        names.iter().map(|name| self.names.iter().position(|n| n == name.as_ref())).collect()
    }

    /// The value at two positions from `positions` (NaN where either name is absent).
    fn at(&self, i: Option<usize>, j: Option<usize>) -> f64 {
        i.zip(j).map_or(f64::NAN, |(i, j)| self.get(i, j))
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

/// What several runs say of one figure: its mean over the runs that have it, their sample
/// standard deviation (None with fewer than two), and how many runs had it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spread {
    /// Mean over the runs that have the figure.
    pub mean: f64,
    /// Sample standard deviation (n − 1), None under two runs.
    pub sd: Option<f64>,
    /// Runs that had it.
    pub runs: usize,
}

impl Spread {
    /// The spread of the known (non-NaN) values; None if there are none.
    pub fn of(values: impl IntoIterator<Item = f64>) -> Option<Spread> {
        let known: Vec<f64> = values.into_iter().filter(|v| !v.is_nan()).collect();
        let n = known.len();
        if n == 0 {
            return None;
        }
        let mean = known.iter().sum::<f64>() / n as f64;
        let sd = (n >= 2).then(|| (known.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt());
        Some(Spread { mean, sd, runs: n })
    }
}

/// One side's runs: per pair, the spread of its correlation over the runs where it is
/// defined (a pair constant or absent in a run says nothing there).
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    /// Metric names, sorted: every name some run has.
    pub names: Vec<String>,
    /// Row-major; None where no run defines the pair.
    pub pairs: Vec<Option<Spread>>,
    /// Runs summarised.
    pub runs: usize,
}

impl Summary {
    /// Summarise the runs of one side.
    pub fn of(runs: &[Matrix]) -> Summary {
        let mut names: Vec<String> = runs.iter().flat_map(|m| m.names.iter().cloned()).collect();
        names.sort();
        names.dedup();
        let n = names.len();
        let positions: Vec<Vec<Option<usize>>> = runs.iter().map(|m| m.positions(&names)).collect();
        let mut pairs = vec![None; n * n];
        for i in 0..n {
            for j in i..n {
                let spread = Spread::of(runs.iter().zip(&positions).map(|(m, at)| m.at(at[i], at[j])));
                pairs[i * n + j] = spread;
                pairs[j * n + i] = spread;
            }
        }
        Summary { names, pairs, runs: runs.len() }
    }

    /// The spread of one pair's correlation, if some run defines it.
    pub fn pair(&self, a: &str, b: &str) -> Option<Spread> {
        let i = self.names.iter().position(|n| n == a)?;
        let j = self.names.iter().position(|n| n == b)?;
        self.pairs[i * self.names.len() + j]
    }

    /// The mean correlations as a matrix (NaN where no run defines a pair).
    pub fn mean(&self) -> Matrix {
        let values = self.pairs.iter().map(|p| p.map_or(f64::NAN, |s| s.mean)).collect();
        Matrix { names: self.names.clone(), values }
    }
}

/// One pair's change between two runs (or two sides' mean over their runs).
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
    let (in_before, in_after) = (before.positions(&names), after.positions(&names));
    let mut changes = Vec::new();
    for (i, a) in names.iter().enumerate() {
        for (j, b) in names.iter().enumerate().skip(i + 1) {
            let (was, now) = (before.at(in_before[i], in_before[j]), after.at(in_after[i], in_after[j]));
            let change = Change { a: (*a).clone(), b: (*b).clone(), before: was, after: now };
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
    fn runs_are_summarised_per_pair_over_the_runs_that_define_it() {
        let run = |r: f64| Matrix { names: vec!["a".into(), "b".into()], values: vec![1.0, r, r, 1.0] };
        let only_a = Matrix { names: vec!["a".into()], values: vec![1.0] };
        let s = Summary::of(&[run(0.2), run(0.4), only_a]);
        assert_eq!((s.names.len(), s.runs), (2, 3));
        let ab = s.pair("a", "b").unwrap();
        assert_eq!(ab.runs, 2, "the run without b says nothing of the pair");
        assert!((ab.mean - 0.3).abs() < 1e-12);
        assert!((ab.sd.unwrap() - (0.02f64).sqrt()).abs() < 1e-12, "sample sd of 0.2 and 0.4");
        assert_eq!(s.pair("a", "a").unwrap().runs, 3);
        assert!(s.pair("a", "zz").is_none());
        assert_eq!(Spread::of([f64::NAN]), None);
        assert_eq!(Spread::of([2.0]).unwrap().sd, None, "one run has no spread");
        assert!((s.mean().by_name("a", "b").unwrap() - 0.3).abs() < 1e-12);
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
