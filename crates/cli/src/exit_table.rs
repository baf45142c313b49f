//! The per-reason exit table `exits` and `report` print.

use virtprof_analysis::exits::ReasonRow;
use virtprof_sinks::Table;

/// Nanoseconds as microseconds with two decimals (empty when unknown).
pub fn us(ns: Option<u64>) -> String {
    ns.map(|v| format!("{:.2}", v as f64 / 1000.0)).unwrap_or_default()
}

/// One row per exit reason: the columns of `perf kvm stat report`, plus percentiles and the
/// light/heavy split.
pub fn reason_table(rows: &[ReasonRow]) -> Table {
    let mut t = Table::new([
        "REASON", "COUNT", "COUNT%", "TIME%", "TOTAL_US", "MIN_US", "AVG_US", "P50_US", "P99_US", "MAX_US", "LIGHT",
        "HEAVY", "DESCHED",
    ]);
    for row in rows {
        t.row([
            row.reason.clone(),
            row.count.to_string(),
            format!("{:.2}", row.count_pct),
            row.time_pct.map(|p| format!("{p:.2}")).unwrap_or_default(),
            us(row.total_ns),
            us(row.min_ns),
            us(row.avg_ns),
            us(row.p50_ns),
            us(row.p99_ns),
            us(row.max_ns),
            row.lightweight.to_string(),
            row.heavyweight.to_string(),
            row.descheduled.to_string(),
        ]);
    }
    t
}
