//! A recording's interval rows with their trace columns, for the commands that work on rows
//! (`compare`, `export --format csv`, `balance --replay`), and the features phase detection and
//! correlation look at.

use virtprof_analysis::intervals::IntervalTable;
use virtprof_session::Session;

use super::{analyse, Want};
use crate::exit::usage;

/// The interval table of a recording with the trace-derived columns and per-VM sums added;
/// a usage error for a recording without interval rows.
pub fn interval_table(path: &std::path::Path) -> anyhow::Result<Intervals> {
    let mut recording = Session::open_warning(path, None)?;
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
        // cpu3.steal_ns -> cpu.steal_ns: one figure per guest, whatever its CPU count.
        let name = match series.name.split_once('.') {
            Some((cpu, rest)) if cpu.strip_prefix("cpu").is_some_and(|n| n.parse::<u32>().is_ok()) => {
                format!("cpu.{rest}")
            }
            _ => series.name.clone(),
        };
        let name = format!("guest{}.{name}", g.agent);
        match rates.iter_mut().find(|(n, _)| *n == name) {
            Some((_, r)) => *r += total / seconds,
            None => rates.push((name, total / seconds)),
        }
    }
    rates
}

/// The features phase detection and correlation look at: host-level delta metrics per second
/// of their row (app counters and the phase gauge excluded: they are what the analysis should
/// rediscover). Rates, not counts: a row that covers a missed one is twice as long, and a
/// short last row counts little, yet neither is a change of phase.
pub fn features(table: &IntervalTable) -> Vec<(String, Vec<f64>)> {
    let seconds: Vec<f64> =
        table.start_ns.iter().zip(&table.end_ns).map(|(s, e)| e.saturating_sub(*s).max(1) as f64 / 1e9).collect();
    table
        .host_metrics()
        .into_iter()
        .filter(|(m, _)| !m.starts_with("app."))
        .map(|(m, counts)| (m, counts.iter().zip(&seconds).map(|(c, s)| c / s).collect()))
        .collect()
}
