//! `virtprof balance calibrate`: fit the model's weights by least squares to measured energy.
//! The measurements come from a CSV (any meter: RAPL logged elsewhere, a wall-plug meter, or
//! synthetic data) or, where the host has it, live from RAPL through powercap. A `seconds`
//! column, when present, fits a static power too (package energy includes idle power, which
//! is not any vCPU's); it is reported and left out of the written model.

use std::path::Path;

use serde::Serialize;
use virtprof_analysis::energy::{calibrate, Activity};
use virtprof_model::units::saturating_u64;

use crate::exit::usage;
use virtprof_engine::energy::Model;

/// The pseudo-metric of period length: its weight is static power (W).
pub const SECONDS: &str = "seconds";

/// Periods read from a calibration CSV.
pub struct Samples {
    /// Activity per period.
    pub periods: Vec<Activity>,
    /// Measured joules per period.
    pub measured_j: Vec<f64>,
    /// Metric columns, in file order.
    pub metrics: Vec<String>,
}

/// A fit and how well it explains the measurements.
#[derive(Debug, Clone, Serialize)]
pub struct Fit {
    /// The fitted model (static power excluded).
    pub model: Model,
    /// Static power, when a `seconds` column was given (W).
    pub static_power_w: Option<f64>,
    /// Periods used.
    pub periods: usize,
    /// Root-mean-square error of the fit relative to the mean measured energy.
    pub rms_error_pct: f64,
}

/// Read `run_ns,METRIC...,energy_j` rows.
pub fn read_csv(path: &Path) -> anyhow::Result<Samples> {
    let text = virtprof_host::input::read_text(path, "--input", 1 << 30)?;
    let mut lines = text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty() && !l.starts_with('#'));
    let (_, header) = lines.next().ok_or_else(|| usage(format!("--input {}: empty file", path.display())))?;
    let names: Vec<&str> = header.split(',').map(str::trim).collect();
    let column = |name: &str| names.iter().position(|n| *n == name);
    let (Some(run_at), Some(energy_at)) = (column("run_ns"), column("energy_j")) else {
        return Err(usage(format!(
            "--input {}: the header needs `run_ns` and `energy_j` columns (and one column per metric), found `{header}`",
            path.display()
        )));
    };
    let metric_columns: Vec<(usize, &str)> =
        names.iter().copied().enumerate().filter(|(_, n)| !["run_ns", "energy_j"].contains(n)).collect();
    let metrics: Vec<String> = metric_columns.iter().map(|(_, n)| (*n).to_string()).collect();
    let mut samples = Samples { periods: Vec::new(), measured_j: Vec::new(), metrics };
    for (line_no, line) in lines {
        let cells: Vec<&str> = line.split(',').map(str::trim).collect();
        let number = |at: usize| -> anyhow::Result<f64> {
            let cell = cells.get(at).copied().unwrap_or("");
            cell.parse::<f64>().ok().filter(|v| v.is_finite()).ok_or_else(|| {
                usage(format!(
                    "--input {}:{}: `{cell}` in column `{}` is not a number",
                    path.display(),
                    line_no + 1,
                    names[at]
                ))
            })
        };
        if cells.len() != names.len() {
            return Err(usage(format!(
                "--input {}:{}: {} cells for {} columns",
                path.display(),
                line_no + 1,
                cells.len(),
                names.len()
            )));
        }
        let mut activity = Activity { run_ns: saturating_u64(number(run_at)?), ..Activity::default() };
        for &(at, name) in &metric_columns {
            activity.events.insert(name.to_string(), number(at)?);
        }
        samples.periods.push(activity);
        samples.measured_j.push(number(energy_at)?);
    }
    Ok(samples)
}

/// Fit the weights; thermal parameters come from `base`.
pub fn fit(samples: &Samples, base: &Model) -> anyhow::Result<Fit> {
    let weights = calibrate(&samples.periods, &samples.measured_j, &samples.metrics)
        .map_err(|e| usage(format!("cannot calibrate: {e}")))?;
    let mut residual = 0.0;
    for (p, &m) in samples.periods.iter().zip(&samples.measured_j) {
        residual += (weights.energy_j(p) - m).powi(2);
    }
    let n = samples.periods.len() as f64;
    let mean = samples.measured_j.iter().sum::<f64>() / n;
    let mut per_event_j = weights.per_event_j;
    let static_power_w = per_event_j.remove(SECONDS);
    Ok(Fit {
        model: Model { active_power_w: weights.active_power_w, per_event_j, thermal: base.thermal },
        static_power_w,
        periods: samples.periods.len(),
        rms_error_pct: if mean != 0.0 { 100.0 * (residual / n).sqrt() / mean.abs() } else { 0.0 },
    })
}
