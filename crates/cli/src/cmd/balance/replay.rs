//! `--replay FILE`: the policy simulated on a recording's interval rows. Each vCPU's energy per
//! period comes from its recorded columns (schedstat run time, exits, perf counts); the same
//! energies go through a fixed mapping and through the policy, so the two gaps differ only by
//! what the policy did.

use std::path::Path;

use serde::Serialize;
use virtprof_analysis::balancer::{gap_bound_seen_j, replay, ReplayPoint};
use virtprof_analysis::energy::Activity;
use virtprof_analysis::intervals::IntervalTable;
use virtprof_model::interval::Entity;
use virtprof_model::units::saturating_u64;

use crate::exit::usage;
use virtprof_engine::energy::Model;
use virtprof_engine::pass::interval_table;

/// What a replay found.
#[derive(Debug, Clone, Serialize)]
pub struct Replay {
    /// The recording.
    pub file: String,
    /// vCPUs, as `vmPID/vcpuN`, and the core each starts on.
    pub vcpus: Vec<(String, usize)>,
    /// Cores simulated.
    pub cores: usize,
    /// Accounting period (a whole number of the recording's intervals).
    pub period_s: f64,
    /// Threshold.
    pub k: f64,
    /// Per period.
    pub points: Vec<ReplayPoint>,
    /// Swaps the policy made per second.
    pub swaps_per_s: f64,
    /// The seed's bound on the gap for the largest and smallest per-core period energies seen.
    pub bound_j: f64,
    /// Events the recording's trace lost (its trace columns are short by them).
    pub lost_events: u64,
    /// The same as one line, with where.
    pub lost_events_text: String,
}

/// Replay `file` with `cores` cores (0: one per vCPU, at least 2).
pub fn run(file: &Path, period_ns: u64, k: f64, cores: usize, model: &Model) -> anyhow::Result<Replay> {
    let rows = interval_table(file)?;
    let table = rows.table;
    let vcpus: Vec<Entity> = {
        let mut v: Vec<Entity> = table
            .columns
            .iter()
            .filter(|c| c.series.metric == "schedstat.run_ns" && matches!(c.series.entity, Entity::Vcpu { .. }))
            .map(|c| c.series.entity)
            .collect();
        v.sort();
        v
    };
    if vcpus.is_empty() {
        return Err(usage(format!(
            "'{}' has no vCPU run times (schedstat.run_ns): record a VM with `virtprof record --interval 10ms`",
            file.display()
        )));
    }
    let rows_per_period = usize::try_from((period_ns / table.interval_ns.max(1)).max(1)).unwrap_or(usize::MAX);
    let period_s = (rows_per_period as u64 * table.interval_ns) as f64 / 1e9;
    let cores = if cores == 0 { vcpus.len().max(2) } else { cores };
    let core_of: Vec<usize> = (0..vcpus.len()).map(|v| v % cores).collect();
    let periods = vcpu_energy(&table, &vcpus, rows_per_period, model);
    let points = replay(&periods, period_s, &core_of, cores, k, model.thermal);
    let swaps: u32 = points.iter().map(|p| p.swaps).sum();
    let seconds = points.last().map_or(0.0, |p| p.t_s);
    // Per-core energies per period under the fixed mapping bound the hot and cold loads.
    let on_core =
        |vj: &[f64], c: usize| -> f64 { vj.iter().zip(&core_of).filter(|(_, &k)| k == c).map(|(j, _)| j).sum() };
    let per_core = periods.iter().flat_map(|vj| (0..cores).map(move |c| on_core(vj, c)));
    let bound_j = gap_bound_seen_j(per_core, k);
    Ok(Replay {
        lost_events: rows.lost_events,
        lost_events_text: rows.lost_events_text,
        file: file.display().to_string(),
        vcpus: vcpus.iter().map(ToString::to_string).zip(core_of).collect(),
        cores,
        period_s,
        k,
        points,
        swaps_per_s: if seconds > 0.0 { f64::from(swaps) / seconds } else { 0.0 },
        bound_j,
    })
}

/// Joules per period per vCPU; the last, partial period is dropped.
fn vcpu_energy(table: &IntervalTable, vcpus: &[Entity], rows_per_period: usize, model: &Model) -> Vec<Vec<f64>> {
    let weights = model.weights();
    let sum = |entity: Entity, metric: &str, rows: std::ops::Range<usize>| -> f64 {
        table.find(entity, metric).map_or(0.0, |c| c.values[rows].iter().filter(|v| v.is_finite()).sum())
    };
    (0..table.rows() / rows_per_period)
        .map(|p| {
            let rows = p * rows_per_period..(p + 1) * rows_per_period;
            vcpus
                .iter()
                .map(|&e| {
                    let activity = Activity {
                        run_ns: saturating_u64(sum(e, "schedstat.run_ns", rows.clone())),
                        events: weights.per_event_j.keys().map(|m| (m.clone(), sum(e, m, rows.clone()))).collect(),
                    };
                    weights.energy_j(&activity)
                })
                .collect()
        })
        .collect()
}
