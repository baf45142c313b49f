//! A recording's interval rows with their trace columns, for the commands that work on rows
//! (`compare`, `export --format csv`, `balance --replay`), and the features phase detection and
//! correlation look at.

use virtprof_analysis::intervals::IntervalTable;
use virtprof_model::interval::{Entity, SeriesKind};
use virtprof_session::Session;

use super::{analyse, Want};
use crate::usage;

/// The interval table of a recording with the trace-derived columns and per-VM sums added;
/// a usage error for a recording without interval rows.
pub fn interval_table(path: &std::path::Path) -> anyhow::Result<Intervals> {
    let mut recording = Session::open_warning(path, &Default::default())?;
    if recording.intervals.is_none() {
        return Err(usage(format!(
            "'{}' has no interval rows; record with `virtprof record --interval 10ms ...`",
            path.display()
        )));
    }
    let analysis = analyse(&mut recording, Want { binning: true, ..Want::default() })?;
    let lost_events = analysis.loss.total();
    let lost_events_text = recording.describe_loss(&analysis.loss, &analysis.decoder);
    let table = analysis.table.expect("the recording has interval rows, checked above");
    let guest_rates = recording.guests.iter().flat_map(guest_rates).collect();
    Ok(Intervals { table, lost_events, lost_events_text, guest_rates })
}

/// A recording's interval rows, and the events its trace lost (the rows' trace columns are
/// short by them).
pub struct Intervals {
    /// The rows, with trace columns.
    pub table: IntervalTable,
    /// Lost events in all.
    pub lost_events: u64,
    /// The loss as one line, with where.
    pub lost_events_text: String,
    /// Guest agents' counters per second of the time their rows cover: `guestN.SERIES`, with
    /// per-CPU times summed over the guest's CPUs (`guestN.cpu.steal_ns`).
    pub guest_rates: Vec<(String, f64)>,
}

/// One guest's counter rates (see [`Intervals::guest_rates`]).
fn guest_rates(g: &virtprof_session::guest::GuestStream) -> Vec<(String, f64)> {
    let layers = g.layers();
    let first = layers.iter().filter_map(|l| l.rows.first()).map(|r| r.start_ns).min();
    let last = layers.iter().filter_map(|l| l.rows.last()).map(|r| r.end_ns).max();
    let Some(seconds) = first.zip(last).map(|(a, b)| b.saturating_sub(a) as f64 / 1e9).filter(|s| *s > 0.0) else {
        return Vec::new();
    };
    let mut rates: Vec<(String, f64)> = Vec::new();
    for (series, total) in g.totals() {
        if series.kind != virtprof_model::guest::SeriesKind::Counter {
            continue;
        }
        let name = format!("guest{}.{}", g.agent, fold_cpus(&series.name));
        match rates.iter_mut().find(|(n, _)| *n == name) {
            Some((_, r)) => *r += total / seconds,
            None => rates.push((name, total / seconds)),
        }
    }
    rates
}

/// `cpu3.steal_ns` → `cpu.steal_ns`: one figure per guest, whatever its CPU count.
fn fold_cpus(name: &str) -> String {
    match name.split_once('.') {
        Some((cpu, rest)) if cpu.strip_prefix("cpu").is_some_and(|n| n.parse::<u32>().is_ok()) => format!("cpu.{rest}"),
        _ => name.to_string(),
    }
}

/// The features phase detection and correlation look at: host-level delta metrics per second
/// of their row, then each guest's (`guestN.METRIC`, its CPUs summed) in the same rows (app
/// counters and the phase gauge excluded: they are what the analysis should rediscover).
/// Rates, not counts: a row that covers a missed one is twice as long, and a short last row
/// counts little, yet neither is a change of phase.
pub fn features(table: &IntervalTable) -> Vec<(String, Vec<f64>)> {
    let seconds: Vec<f64> =
        table.start_ns.iter().zip(&table.end_ns).map(|(s, e)| e.saturating_sub(*s).max(1) as f64 / 1e9).collect();
    let mut counts = table.host_metrics();
    let mut guests: Vec<(String, Vec<f64>)> = Vec::new();
    for c in table.columns.iter().filter(|c| c.series.kind == SeriesKind::Delta) {
        let Entity::Guest(agent) = c.series.entity else { continue };
        let name = format!("guest{agent}.{}", fold_cpus(&c.series.metric));
        match guests.iter_mut().find(|(n, _)| *n == name) {
            Some((_, sum)) => sum.iter_mut().zip(&c.values).filter(|(_, v)| !v.is_nan()).for_each(|(s, v)| {
                *s = if s.is_nan() { *v } else { *s + v };
            }),
            None => guests.push((name, c.values.clone())),
        }
    }
    counts.extend(guests);
    counts
        .into_iter()
        .filter(|(m, _)| !m.starts_with("app.") && !m.split_once('.').is_some_and(|(_, rest)| rest.starts_with("app.")))
        .map(|(m, counts)| (m, counts.iter().zip(&seconds).map(|(c, s)| c / s).collect()))
        .collect()
}
