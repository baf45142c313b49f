//! `virtprof compare A B`, or `compare A1 .. An --vs B1 .. Bm`: interval recordings side by side
//! (VrtProf Figures 2 to 4). Each metric's rate per side is the mean over the side's runs that
//! have it, with their spread; the correlation matrices of each side's runs are averaged pair by
//! pair, and the pairs whose mean correlation changed most between the sides are listed, marked
//! where the change is larger than the runs' own spread. A metric a side lacks is unknown there.

use std::process::ExitCode;

use serde::Serialize;
use virtprof_analysis::correlate::{self, Matrix, Method, Spread, Summary};

use crate::args::CompareArgs;
use crate::exit::usage;
use virtprof_engine::pass::{features, interval_table};

/// One recording's rates and correlations.
struct Run {
    path: String,
    lost_events: u64,
    lost_events_text: String,
    /// Per second over the run: host metrics, then the guests' `guestN.SERIES`.
    rates: Vec<(String, f64)>,
    /// Whether the run has trace-derived columns: a `trace.*` metric it lacks then counted
    /// nothing (the columns are made as their first event comes), rather than being unknown.
    traced: bool,
    matrix: Matrix,
    exit_rate: Option<ExitRate>,
}

/// A run's exits per second over time (VrtProf Figure 4): every `kvm_exit` reason summed per
/// interval, or where the trace has no `kvm_exit` (this kind of host) the exits to userspace.
#[derive(Serialize, Clone)]
struct ExitRate {
    path: String,
    /// "kvm_exit" or "userspace exits".
    counts: &'static str,
    /// Seconds from the run's first interval, at each interval's end.
    t: Vec<f64>,
    per_s: Vec<f64>,
}

impl ExitRate {
    fn of(
        path: &str,
        table: &virtprof_analysis::intervals::IntervalTable,
        features: &[(String, Vec<f64>)],
    ) -> Option<Self> {
        let sum = |prefix: &str| {
            let mut columns = features.iter().filter(|(m, _)| m.starts_with(prefix)).peekable();
            columns.peek()?;
            let mut total = vec![0.0; table.rows()];
            for (_, v) in columns {
                total.iter_mut().zip(v).filter(|(_, x)| !x.is_nan()).for_each(|(t, x)| *t += x);
            }
            Some(total)
        };
        let (counts, per_s) = match sum("trace.exit.") {
            Some(v) => ("kvm_exit", v),
            None => ("userspace exits", sum("trace.userspace_exit.")?),
        };
        let first = *table.start_ns.first()?;
        let t = table.end_ns.iter().map(|e| e.saturating_sub(first) as f64 / 1e9).collect();
        Some(ExitRate { path: path.to_string(), counts, t, per_s })
    }
}

impl Run {
    fn load(path: &std::path::Path, method: Method) -> anyhow::Result<Run> {
        let intervals = interval_table(path)?;
        let table = &intervals.table;
        let features = features(table);
        let seconds = table.seconds().max(f64::MIN_POSITIVE);
        let totals = table.host_metrics();
        // Host metrics as the correlations see them (application columns left out), then guests.
        let mut rates: Vec<(String, f64)> = totals
            .iter()
            .filter(|(name, _)| features.iter().any(|(f, _)| f == name))
            .map(|(name, v)| (name.clone(), v.iter().filter(|x| !x.is_nan()).sum::<f64>() / seconds))
            .collect();
        rates.extend(intervals.guest_rates.iter().cloned());
        let path = path.display().to_string();
        Ok(Run {
            exit_rate: ExitRate::of(&path, table, &features),
            path,
            lost_events: intervals.lost_events,
            lost_events_text: intervals.lost_events_text,
            traced: rates.iter().any(|(m, _)| m.starts_with("trace.")),
            rates,
            matrix: correlate::matrix(&features, method),
        })
    }

    /// The metric per second; None where the run cannot say (a source it did not have).
    fn rate(&self, metric: &str) -> Option<f64> {
        match self.rates.iter().find(|(m, _)| m == metric) {
            Some((_, r)) => Some(*r),
            None if self.traced && metric.starts_with("trace.") => Some(0.0),
            None => None,
        }
    }
}

#[derive(Serialize)]
struct Output {
    /// Each side's recordings.
    a: Vec<String>,
    b: Vec<String>,
    /// Events each recording's trace lost, in the same order.
    a_lost_events: Vec<u64>,
    b_lost_events: Vec<u64>,
    rates: Vec<RateOut>,
    changes: Vec<ChangeOut>,
    #[serde(skip_serializing_if = "Option::is_none")]
    matrices: Option<Matrices>,
    /// Each run's exits per second over time, per side (with --matrix or --html).
    #[serde(skip_serializing_if = "Option::is_none")]
    exit_rates: Option<[Vec<ExitRate>; 2]>,
}

/// A metric per second on each side: the mean over the runs that have it (null: none has it),
/// the sample standard deviation (null under two runs), the runs that have it.
#[derive(Serialize)]
struct RateOut {
    metric: String,
    a_per_second: Option<f64>,
    b_per_second: Option<f64>,
    a_sd: Option<f64>,
    b_sd: Option<f64>,
    a_runs: usize,
    b_runs: usize,
}

#[derive(Serialize)]
struct ChangeOut {
    a: String,
    b: String,
    /// Mean correlation on each side (null: constant or absent in all its runs, counted as 0).
    r_in_a: Option<f64>,
    r_in_b: Option<f64>,
    /// Their spread over the runs (null under two runs defining the pair).
    a_sd: Option<f64>,
    b_sd: Option<f64>,
    change: f64,
    /// Whether |change| exceeds both spreads together (null: a side has no spread).
    beyond_spread: Option<bool>,
}

/// The sides' mean correlation matrices over one list of names, and B − A (null: undefined).
#[derive(Serialize)]
struct Matrices {
    names: Vec<String>,
    a_mean: Vec<Vec<Option<f64>>>,
    b_mean: Vec<Vec<Option<f64>>>,
    difference: Vec<Vec<Option<f64>>>,
}

/// The recordings of each side, from the arguments: `A B`, or `A.. --vs B..`.
fn sides(args: &CompareArgs) -> anyhow::Result<(&[std::path::PathBuf], &[std::path::PathBuf])> {
    match (args.runs.as_slice(), args.vs.as_slice()) {
        ([a, b], []) => Ok((std::slice::from_ref(a), std::slice::from_ref(b))),
        (runs, []) => Err(usage(format!(
            "{} recording(s) given: compare two (A B), or runs of two sides (A1 A2 .. --vs B1 B2 ..)",
            runs.len()
        ))),
        (a, b) => Ok((a, b)),
    }
}

fn rates(a: &[Run], b: &[Run]) -> Vec<RateOut> {
    let mut names: Vec<&String> = Vec::new();
    for run in a.iter().chain(b) {
        for (name, _) in &run.rates {
            if !names.contains(&name) {
                names.push(name);
            }
        }
    }
    // Host metrics sorted first, the guests' after them, as each run lists them.
    names.sort_by_key(|n| (n.starts_with("guest"), n.as_str()));
    let spread = |side: &[Run], m: &str| Spread::of(side.iter().filter_map(|r| r.rate(m)));
    names
        .into_iter()
        .map(|m| {
            let (sa, sb) = (spread(a, m), spread(b, m));
            RateOut {
                metric: m.clone(),
                a_per_second: sa.map(|s| s.mean),
                b_per_second: sb.map(|s| s.mean),
                a_sd: sa.and_then(|s| s.sd),
                b_sd: sb.and_then(|s| s.sd),
                a_runs: sa.map_or(0, |s| s.runs),
                b_runs: sb.map_or(0, |s| s.runs),
            }
        })
        .filter(|r| r.a_per_second.unwrap_or(0.0) != 0.0 || r.b_per_second.unwrap_or(0.0) != 0.0)
        .collect()
}

fn changes(sa: &Summary, sb: &Summary, top: usize) -> Vec<ChangeOut> {
    let finite = |x: f64| x.is_finite().then_some(x);
    correlate::differences(&sa.mean(), &sb.mean())
        .into_iter()
        .take(top)
        .map(|c| {
            let (pa, pb) = (sa.pair(&c.a, &c.b), sb.pair(&c.a, &c.b));
            let (a_sd, b_sd) = (pa.and_then(|p| p.sd), pb.and_then(|p| p.sd));
            ChangeOut {
                change: c.delta(),
                beyond_spread: a_sd.zip(b_sd).map(|(x, y)| c.delta().abs() > x + y),
                r_in_a: finite(c.before),
                r_in_b: finite(c.after),
                a_sd,
                b_sd,
                a: c.a,
                b: c.b,
            }
        })
        .collect()
}

fn matrices(sa: &Summary, sb: &Summary) -> Matrices {
    let mut names: Vec<String> = sa.names.iter().chain(&sb.names).cloned().collect();
    names.sort();
    names.dedup();
    let grid = |f: &dyn Fn(&str, &str) -> Option<f64>| -> Vec<Vec<Option<f64>>> {
        names.iter().map(|x| names.iter().map(|y| f(x, y)).collect()).collect()
    };
    let mean = |s: &Summary, x: &str, y: &str| s.pair(x, y).map(|p| p.mean);
    Matrices {
        a_mean: grid(&|x, y| mean(sa, x, y)),
        b_mean: grid(&|x, y| mean(sb, x, y)),
        difference: grid(&|x, y| Some(mean(sb, x, y)? - mean(sa, x, y)?)),
        names,
    }
}

pub fn run(args: &CompareArgs) -> anyhow::Result<ExitCode> {
    let (paths_a, paths_b) = sides(args)?;
    let method = if args.spearman { Method::Spearman } else { Method::Pearson };
    let load =
        |paths: &[std::path::PathBuf]| paths.iter().map(|p| Run::load(p, method)).collect::<anyhow::Result<Vec<_>>>();
    let (a, b) = (load(paths_a)?, load(paths_b)?);
    let summary = |side: &[Run]| Summary::of(&side.iter().map(|r| r.matrix.clone()).collect::<Vec<_>>());
    let (sa, sb) = (summary(&a), summary(&b));
    let whole = args.matrix || args.html.is_some();
    let out = Output {
        a: a.iter().map(|r| r.path.clone()).collect(),
        b: b.iter().map(|r| r.path.clone()).collect(),
        a_lost_events: a.iter().map(|r| r.lost_events).collect(),
        b_lost_events: b.iter().map(|r| r.lost_events).collect(),
        rates: rates(&a, &b),
        changes: changes(&sa, &sb, args.top),
        matrices: whole.then(|| matrices(&sa, &sb)),
        exit_rates: whole.then(|| [&a, &b].map(|side| side.iter().filter_map(|r| r.exit_rate.clone()).collect())),
    };
    if let Some(path) = &args.html {
        let title = format!("{} vs {}", out.a.join(", "), out.b.join(", "));
        let page = virtprof_sinks::html::render("compare", &title, &out, COMPARE_JS)?;
        virtprof_host::output::write_file(path, page.as_bytes(), virtprof_host::output::Privacy::Shared)?;
        eprintln!("virtprof: wrote {} ({} KiB)", path.display(), page.len() / 1024);
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else if args.html.is_none() {
        print_text(&out, &a, &b);
    }
    Ok(ExitCode::SUCCESS)
}

const COMPARE_JS: &str = include_str!("../../assets/compare.js");

fn print_text(out: &Output, a: &[Run], b: &[Run]) {
    for (label, side) in [("A", a), ("B", b)] {
        match side {
            [run] => println!("{label} = {} (lost events: {})", run.path, run.lost_events_text),
            runs => {
                println!("{label} = {} runs:", runs.len());
                for run in runs {
                    println!("    {} (lost events: {})", run.path, run.lost_events_text);
                }
            }
        }
    }
    let several = a.len() > 1 || b.len() > 1;
    let cell = |mean: Option<f64>, sd: Option<f64>| match (mean, sd) {
        (None, _) => "-".to_string(),
        (Some(m), Some(sd)) => format!("{m:.1} ±{sd:.1}"),
        (Some(m), None) => format!("{m:.1}"),
    };
    let heading = if several { "  mean ±sd over runs" } else { "" };
    println!("\n{:<40} {:>24} {:>24} {:>8}{heading}", "METRIC (per second)", "A", "B", "B/A");
    for r in &out.rates {
        let ratio = match (r.a_per_second, r.b_per_second) {
            (Some(x), Some(y)) if x != 0.0 => format!("{:.2}", y / x),
            _ => "-".into(),
        };
        println!(
            "{:<40} {:>24} {:>24} {:>8}",
            r.metric,
            cell(r.a_per_second, r.a_sd),
            cell(r.b_per_second, r.b_sd),
            ratio
        );
    }
    if several {
        println!("\nlargest changes of the mean correlation (A -> B), ± the spread over runs:");
    } else {
        println!("\nlargest correlation changes (A -> B):");
    }
    let show = |r: Option<f64>, sd: Option<f64>| match (r, sd) {
        (None, _) => "  n/a".to_string(),
        (Some(r), Some(sd)) => format!("{r:+.2} ±{sd:.2}"),
        (Some(r), None) => format!("{r:+.2}"),
    };
    for c in &out.changes {
        let mark = if c.beyond_spread == Some(true) { "  beyond spread" } else { "" };
        println!(
            "  {:+.2}  {} ~ {}  ({} -> {}){mark}",
            c.change,
            c.a,
            c.b,
            show(c.r_in_a, c.a_sd),
            show(c.r_in_b, c.b_sd)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(rates: &[(&str, f64)]) -> Run {
        let rates: Vec<(String, f64)> = rates.iter().map(|(m, r)| (m.to_string(), *r)).collect();
        Run {
            path: String::new(),
            lost_events: 0,
            lost_events_text: String::new(),
            traced: rates.iter().any(|(m, _)| m.starts_with("trace.")),
            rates,
            matrix: Matrix { names: Vec::new(), values: Vec::new() },
            exit_rate: None,
        }
    }

    #[test]
    fn a_sides_rate_is_the_mean_of_its_runs_and_a_missing_source_is_unknown_not_zero() {
        let a = [run(&[("stat.user_ns", 10.0), ("trace.pio", 4.0)]), run(&[("stat.user_ns", 20.0)])];
        let b = [run(&[("stat.user_ns", 30.0), ("trace.irq", 1.0), ("guest0.cpu.steal_ns", 5.0)])];
        let rates = rates(&a, &b);
        let of = |m: &str| rates.iter().find(|r| r.metric == m).unwrap();
        let user = of("stat.user_ns");
        assert_eq!((user.a_per_second, user.a_runs, user.b_per_second, user.b_sd), (Some(15.0), 2, Some(30.0), None));
        assert!((user.a_sd.unwrap() - 50f64.sqrt()).abs() < 1e-12, "sample sd of 10 and 20");
        // The second run of A has no trace column: it says nothing of trace.pio. B was traced
        // and saw no port I/O: zero, known.
        let pio = of("trace.pio");
        assert_eq!((pio.a_per_second, pio.a_runs, pio.b_per_second), (Some(4.0), 1, Some(0.0)));
        // No agent on side A: its guest series are unknown there, never zero.
        let steal = of("guest0.cpu.steal_ns");
        assert_eq!((steal.a_per_second, steal.a_runs, steal.b_per_second), (None, 0, Some(5.0)));
        assert_eq!(rates.last().unwrap().metric, "guest0.cpu.steal_ns", "guests after the host");
    }
}
