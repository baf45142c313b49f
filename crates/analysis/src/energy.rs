//! The energy model of seed 002 (§4.4): a vCPU's energy in an accounting period is its active
//! power times its run time plus a weighted sum of the events it caused. Weights are fitted by
//! least squares against measured energy (RAPL/powercap) where the host has it; a first-order RC
//! model turns each core's power into a temperature estimate.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Model parameters: watts while running, joules per event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Weights {
    /// Power while a vCPU runs, whatever it does (W).
    pub active_power_w: f64,
    /// Energy per counted event, by metric name (`perf.page-faults`, `kvm.exits`, ...), in J.
    #[serde(default)]
    pub per_event_j: BTreeMap<String, f64>,
}

/// One accounting period of one vCPU (or core): run time and event counts.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Activity {
    /// Nanoseconds running.
    pub run_ns: u64,
    /// Event counts by metric name.
    pub events: BTreeMap<String, f64>,
}

impl Weights {
    /// Joules for `activity`; events without a weight cost nothing.
    pub fn energy_j(&self, activity: &Activity) -> f64 {
        let events: f64 =
            activity.events.iter().map(|(name, n)| self.per_event_j.get(name).map_or(0.0, |w| w * n)).sum();
        self.active_power_w * activity.run_ns as f64 / 1e9 + events
    }
}

/// Why weights could not be fitted.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CalibrationError {
    /// Fewer periods than unknowns.
    #[error("{periods} periods for {unknowns} unknowns: record longer or with fewer metrics")]
    TooFewPeriods {
        /// Periods given.
        periods: usize,
        /// Weights to fit (active power plus one per metric).
        unknowns: usize,
    },
    /// The metrics are linearly dependent (e.g. one never changes, or two always move together).
    #[error("the metrics do not vary independently ({0} is a combination of the others); drop it")]
    Degenerate(String),
}

/// Least-squares fit of `measured_j[p] ≈ P·run_s[p] + Σ w_m·count_m[p]` over the periods
/// (normal equations, solved by Gaussian elimination with partial pivoting).
pub fn calibrate(periods: &[Activity], measured_j: &[f64], metrics: &[String]) -> Result<Weights, CalibrationError> {
    let unknowns = metrics.len() + 1;
    if periods.len() < unknowns {
        return Err(CalibrationError::TooFewPeriods { periods: periods.len(), unknowns });
    }
    let row = |a: &Activity| -> Vec<f64> {
        std::iter::once(a.run_ns as f64 / 1e9)
            .chain(metrics.iter().map(|m| a.events.get(m).copied().unwrap_or(0.0)))
            .collect()
    };
    // Columns are scaled to unit size so watts and per-event joules (orders of magnitude apart)
    // do not ruin the pivoting.
    let rows: Vec<Vec<f64>> = periods.iter().map(row).collect();
    let scale: Vec<f64> =
        (0..unknowns).map(|c| rows.iter().map(|r| r[c].abs()).fold(0.0, f64::max).max(f64::MIN_POSITIVE)).collect();
    let mut ata = vec![vec![0.0; unknowns + 1]; unknowns];
    for (r, &y) in rows.iter().zip(measured_j) {
        for a in 0..unknowns {
            for b in 0..unknowns {
                ata[a][b] += r[a] / scale[a] * r[b] / scale[b];
            }
            ata[a][unknowns] += r[a] / scale[a] * y;
        }
    }
    let solution = solve(ata).map_err(|c| {
        CalibrationError::Degenerate(if c == 0 { "run time".to_string() } else { metrics[c - 1].clone() })
    })?;
    let w: Vec<f64> = solution.iter().zip(&scale).map(|(x, s)| x / s).collect();
    Ok(Weights { active_power_w: w[0], per_event_j: metrics.iter().cloned().zip(w[1..].iter().copied()).collect() })
}

/// Solve the augmented system in place; Err(column) when a pivot vanishes.
fn solve(mut m: Vec<Vec<f64>>) -> Result<Vec<f64>, usize> {
    let n = m.len();
    for col in 0..n {
        let pivot = (col..n).max_by(|&a, &b| m[a][col].abs().total_cmp(&m[b][col].abs())).expect("rows remain");
        if m[pivot][col].abs() < 1e-12 {
            return Err(col);
        }
        m.swap(col, pivot);
        let pivot_row = m[col].clone();
        for (r, row) in m.iter_mut().enumerate() {
            if r != col {
                let f = row[col] / pivot_row[col];
                for (x, p) in row[col..].iter_mut().zip(&pivot_row[col..]) {
                    *x -= f * p;
                }
            }
        }
    }
    Ok((0..n).map(|r| m[r][n] / m[r][r]).collect())
}

/// A first-order thermal model of one core: heat capacity C (J/K) and resistance to ambient
/// R (K/W); dT/dt = (P − (T − T_ambient)/R) / C.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Thermal {
    /// Heat capacity, J/K.
    pub capacity_j_per_k: f64,
    /// Thermal resistance to ambient, K/W.
    pub resistance_k_per_w: f64,
    /// Ambient temperature, °C.
    pub ambient_c: f64,
}

impl Default for Thermal {
    /// A desktop core with its share of a heat sink: τ = RC = 10 s, 0.5 K/W.
    fn default() -> Self {
        Thermal { capacity_j_per_k: 20.0, resistance_k_per_w: 0.5, ambient_c: 40.0 }
    }
}

impl Thermal {
    /// The temperature after `dt_s` seconds at constant `power_w`, starting from `t_c`: the
    /// exact solution of the linear ODE, so any period length is stable.
    pub fn step(&self, t_c: f64, power_w: f64, dt_s: f64) -> f64 {
        let steady = self.ambient_c + power_w * self.resistance_k_per_w;
        let tau = self.resistance_k_per_w * self.capacity_j_per_k;
        steady + (t_c - steady) * (-dt_s / tau).exp()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn activity(run_ms: u32, faults: f64, exits: f64) -> Activity {
        Activity {
            run_ns: u64::from(run_ms) * 1_000_000,
            events: [("perf.page-faults".to_string(), faults), ("kvm.exits".to_string(), exits)].into(),
        }
    }

    #[test]
    fn energy_is_active_power_times_run_time_plus_weighted_events() {
        let w = Weights { active_power_w: 10.0, per_event_j: [("kvm.exits".to_string(), 1e-6)].into() };
        let a = activity(500, 1000.0, 2_000_000.0);
        assert!((w.energy_j(&a) - (5.0 + 2.0)).abs() < 1e-12, "page faults have no weight");
    }

    #[test]
    fn calibration_recovers_known_weights_within_five_percent() {
        let truth = Weights {
            active_power_w: 12.5,
            per_event_j: [("perf.page-faults".to_string(), 2e-6), ("kvm.exits".to_string(), 7e-7)].into(),
        };
        // Deterministic pseudo-random periods, and ±1 % measurement noise.
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut rnd = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 10_000) as f64 / 10_000.0
        };
        let periods: Vec<Activity> =
            (0..200u32).map(|i| activity(1 + i * 37 % 100, rnd() * 4e5, rnd() * 3e6)).collect();
        let measured: Vec<f64> = periods.iter().map(|p| truth.energy_j(p) * (1.0 + (rnd() - 0.5) * 0.02)).collect();
        let metrics = vec!["perf.page-faults".to_string(), "kvm.exits".to_string()];
        let fit = calibrate(&periods, &measured, &metrics).unwrap();
        let close = |got: f64, want: f64| (got - want).abs() <= 0.05 * want;
        assert!(close(fit.active_power_w, 12.5), "{fit:?}");
        for (name, want) in &truth.per_event_j {
            assert!(close(fit.per_event_j[name], *want), "{name}: {fit:?}");
        }
    }

    #[test]
    fn calibration_explains_what_it_cannot_fit() {
        let metrics = vec!["kvm.exits".to_string()];
        let err = calibrate(&[activity(1, 0.0, 1.0)], &[1.0], &metrics).unwrap_err();
        assert!(matches!(err, CalibrationError::TooFewPeriods { periods: 1, unknowns: 2 }));
        // exits always 3 × run milliseconds: not separable from run time.
        let periods: Vec<Activity> = (1..10).map(|ms| activity(ms, 0.0, 3.0 * ms as f64)).collect();
        let measured = vec![1.0; 9];
        assert!(matches!(calibrate(&periods, &measured, &metrics), Err(CalibrationError::Degenerate(_))));
    }

    #[test]
    fn the_thermal_model_approaches_its_steady_state() {
        let t = Thermal::default();
        assert_eq!(t.step(40.0, 0.0, 5.0), 40.0);
        let hot = t.step(40.0, 30.0, 1000.0);
        assert!((hot - 55.0).abs() < 1e-6, "steady state ambient + P·R: {hot}");
        let one_tau = t.step(40.0, 30.0, 10.0);
        assert!((one_tau - (55.0 - 15.0 / std::f64::consts::E)).abs() < 1e-9);
        // Two half steps equal one whole step: exact, not Euler.
        assert!((t.step(t.step(40.0, 30.0, 2.5), 30.0, 2.5) - t.step(40.0, 30.0, 5.0)).abs() < 1e-9);
    }
}
