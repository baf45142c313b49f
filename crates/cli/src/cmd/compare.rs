//! `virtprof compare A B`: two interval recordings side by side (VrtProf Figures 2 and 3):
//! each metric's rate in both, and the pairs of metrics whose correlation changed most.

use std::process::ExitCode;

use serde::Serialize;
use virtprof_analysis::correlate::{self, Method};

use crate::args::CompareArgs;
use crate::pass::{features, interval_table};

#[derive(Serialize)]
struct Output {
    a: String,
    b: String,
    /// Events each recording's trace lost.
    a_lost_events: u64,
    b_lost_events: u64,
    rates: Vec<Rate>,
    changes: Vec<ChangeOut>,
}

#[derive(Serialize)]
struct Rate {
    metric: String,
    a_per_second: f64,
    b_per_second: f64,
}

#[derive(Serialize)]
struct ChangeOut {
    a: String,
    b: String,
    r_in_a: Option<f64>,
    r_in_b: Option<f64>,
    change: f64,
}

/// The guest layers' rates side by side (`guestN.SERIES`, N the agent's number in each).
fn guest_rates(a: &[(String, f64)], b: &[(String, f64)]) -> Vec<Rate> {
    let mut names: Vec<&String> = a.iter().chain(b).map(|(n, _)| n).collect();
    names.sort();
    names.dedup();
    let of = |v: &[(String, f64)], n: &str| v.iter().find(|(m, _)| m == n).map_or(0.0, |(_, r)| *r);
    names.into_iter().map(|n| Rate { metric: n.clone(), a_per_second: of(a, n), b_per_second: of(b, n) }).collect()
}

pub fn run(args: &CompareArgs) -> anyhow::Result<ExitCode> {
    let (ra, rb) = (interval_table(&args.a)?, interval_table(&args.b)?);
    let (ta, tb) = (&ra.table, &rb.table);
    let (fa, fb) = (features(ta), features(tb));
    let (totals_a, totals_b) = (ta.host_metrics(), tb.host_metrics());
    let rate = |totals: &[(String, Vec<f64>)], name: &str, seconds: f64| {
        totals.iter().find(|(m, _)| m == name).map_or(0.0, |(_, v)| v.iter().filter(|x| !x.is_nan()).sum::<f64>())
            / seconds.max(f64::MIN_POSITIVE)
    };
    let mut names: Vec<&String> = fa.iter().chain(&fb).map(|(m, _)| m).collect();
    names.sort();
    names.dedup();
    let rates = names
        .iter()
        .map(|m| Rate {
            metric: (*m).clone(),
            a_per_second: rate(&totals_a, m, ta.seconds()),
            b_per_second: rate(&totals_b, m, tb.seconds()),
        })
        .chain(guest_rates(&ra.guest_rates, &rb.guest_rates))
        .filter(|r| r.a_per_second != 0.0 || r.b_per_second != 0.0)
        .collect();
    let method = if args.spearman { Method::Spearman } else { Method::Pearson };
    let (ma, mb) = (correlate::matrix(&fa, method), correlate::matrix(&fb, method));
    let finite = |x: f64| x.is_finite().then_some(x);
    let changes = correlate::differences(&ma, &mb)
        .into_iter()
        .take(args.top)
        .map(|c| ChangeOut { change: c.delta(), r_in_a: finite(c.before), r_in_b: finite(c.after), a: c.a, b: c.b })
        .collect();
    let out = Output {
        a: args.a.display().to_string(),
        b: args.b.display().to_string(),
        a_lost_events: ra.lost_events,
        b_lost_events: rb.lost_events,
        rates,
        changes,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "A = {} (lost events: {})\nB = {} (lost events: {})\n",
        out.a, ra.lost_events_text, out.b, rb.lost_events_text
    );
    println!("{:<40} {:>16} {:>16} {:>8}", "METRIC (per second)", "A", "B", "B/A");
    for r in &out.rates {
        let ratio = if r.a_per_second != 0.0 { format!("{:.2}", r.b_per_second / r.a_per_second) } else { "-".into() };
        println!("{:<40} {:>16.1} {:>16.1} {:>8}", r.metric, r.a_per_second, r.b_per_second, ratio);
    }
    println!("\nlargest correlation changes (A -> B):");
    let show = |r: Option<f64>| r.map_or("  n/a".to_string(), |r| format!("{r:+.2}"));
    for c in &out.changes {
        println!("  {:+.2}  {} ~ {}  ({} -> {})", c.change, c.a, c.b, show(c.r_in_a), show(c.r_in_b));
    }
    Ok(ExitCode::SUCCESS)
}
