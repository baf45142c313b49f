//! The per-reason exit table `exits` and `report` print, and the figures around it.

use virtprof_analysis::exits::{ReasonRow, Totals};
use virtprof_sinks::table::known;
use virtprof_sinks::Table;

/// Nanoseconds as microseconds with two decimals ("unknown" without the evidence).
pub fn us(ns: Option<u64>) -> String {
    known(ns, |v| format!("{:.2}", v as f64 / 1000.0))
}

/// Nanoseconds as milliseconds, three decimals.
fn ms(ns: u64) -> String {
    format!("{:.3} ms", ns as f64 / 1e6)
}

/// A count the source may not support: "unknown" rather than a zero it cannot back.
pub fn count(n: Option<u64>) -> String {
    known(n, |n| n.to_string())
}

/// One row per exit reason: the columns of `perf kvm stat report`, plus percentiles and the
/// light/heavy split. TIME% is the share of exit-handling time: a halt (the guest idling) is
/// marked and left out of it.
pub fn reason_table(rows: &[ReasonRow]) -> Table {
    let mut t = Table::new([
        "REASON", "COUNT", "COUNT%", "TIME%", "TOTAL_US", "MIN_US", "AVG_US", "P50_US", "P99_US", "MAX_US", "LIGHT",
        "HEAVY", "DESCHED",
    ]);
    for row in rows {
        let (reason, time_pct) = if row.guest_idle {
            (format!("{} (guest idle)", row.reason), "idle".to_string())
        } else {
            (row.reason.clone(), row.time_pct.map(|p| format!("{p:.2}")).unwrap_or_default())
        };
        t.row([
            reason,
            row.count.to_string(),
            format!("{:.2}", row.count_pct),
            time_pct,
            us(row.total_ns),
            us(row.min_ns),
            us(row.avg_ns),
            us(row.p50_ns),
            us(row.p99_ns),
            us(row.max_ns),
            count(row.lightweight),
            count(row.heavyweight),
            count(row.descheduled),
        ]);
    }
    t
}

/// "N exits (L lightweight, H heavyweight)", or why the split is unknown.
pub fn exits_line(t: &Totals) -> String {
    match (t.lightweight, t.heavyweight) {
        (Some(light), Some(heavy)) => {
            format!("{} exits ({light} lightweight, {heavy} heavyweight)", light.saturating_add(heavy).max(t.exits))
        }
        (None, Some(heavy)) => format!("{} exits traced ({heavy} heavyweight; lightweight: unknown)", t.exits),
        _ => format!("{} exits (lightweight/heavyweight: unknown)", t.exits),
    }
}

/// Handling time apart from the guest's idling in halts, with the halt-polling part where
/// the source recorded it; None when no exit was timed.
pub fn time_line(t: &Totals) -> Option<String> {
    let (Some(handling_ns), Some(guest_idle_ns)) = (t.handling_ns, t.guest_idle_ns) else {
        return Some("exit handling and guest idle time: unknown".to_string());
    };
    if handling_ns == 0 && guest_idle_ns == 0 {
        return None;
    }
    let mut line = format!("exit handling: {}; guest idle in halt exits: {}", ms(handling_ns), ms(guest_idle_ns));
    match (t.halted_ns, t.halt_poll_ns) {
        (Some(halted), Some(poll)) if halted > 0 => {
            line += &format!(" (the kernel measured {} halted, {} of it halt-polling)", ms(halted), ms(poll))
        }
        (None, _) if guest_idle_ns > 0 => line += " (halt-polling: unknown, kvm_vcpu_wakeup not recorded)",
        _ => {}
    }
    Some(line)
}
