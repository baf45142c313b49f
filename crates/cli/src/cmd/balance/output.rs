//! What `balance` prints: text tables, JSON (docs/balance.md), and HTML charts.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;
use std::process::ExitCode;

use serde::Serialize;
use virtprof_analysis::balancer::{gap_bound_seen_j, Policy};

use super::bench::BenchResult;
use super::calibrate::Fit;
use super::replay::Replay;
use virtprof_engine::balance::{CoreTime, RunConfig, RunResult};
use virtprof_sinks::html as page;

const SCRIPT: &str = include_str!("../../../assets/balance.js");

/// A core at the end of a live run.
#[derive(Debug, Serialize)]
struct CoreSummary {
    cpu: u32,
    total_j: f64,
    mean_w: f64,
    last_j: f64,
    temp_c: f64,
}

/// The JSON and HTML form of a live or dry run.
#[derive(Debug, Serialize)]
struct RunReport<'a> {
    kind: &'static str,
    mode: &'static str,
    policy: Policy,
    forced_hz: f64,
    period_s: f64,
    swap_count: usize,
    swaps_per_s: f64,
    gap_j: f64,
    max_gap_j: f64,
    /// The seed's bound for the hottest and coldest per-core period energies seen.
    bound_j: f64,
    cores: Vec<CoreSummary>,
    #[serde(flatten)]
    run: &'a RunResult,
}

pub fn run(result: &RunResult, config: &RunConfig, json: bool, html: Option<&Path>) -> anyhow::Result<ExitCode> {
    let last = result.periods.last();
    let k = match config.policy {
        Policy::Thermal { k } => k,
        Policy::Fixed => f64::NAN,
    };
    let report = RunReport {
        kind: "run",
        mode: if config.actuate { "live" } else { "dry-run" },
        policy: config.policy,
        forced_hz: config.forced_hz,
        period_s: config.period_ns as f64 / 1e9,
        swap_count: result.swaps.len(),
        swaps_per_s: result.swaps.len() as f64 / result.elapsed_s.max(1e-9),
        gap_j: last.map_or(0.0, |p| p.gap_j),
        max_gap_j: result.periods.iter().map(|p| p.gap_j).fold(0.0, f64::max),
        bound_j: if k.is_finite() {
            gap_bound_seen_j(result.periods.iter().flat_map(|p| p.cores.iter().map(|c| c.last_j)), k)
        } else {
            0.0
        },
        cores: result
            .cpus
            .iter()
            .enumerate()
            .map(|(c, &cpu)| {
                let account = last.map(|p| p.cores[c]);
                let total_j = account.map_or(0.0, |a| a.total_j);
                CoreSummary {
                    cpu,
                    total_j,
                    mean_w: total_j / result.elapsed_s.max(1e-9),
                    last_j: account.map_or(0.0, |a| a.last_j),
                    temp_c: account.map_or(config.model.thermal.ambient_c, |a| a.temp_c),
                }
            })
            .collect(),
        run: result,
    };
    if let Some(out) = html {
        write_html(out, "balance", &format!("{} s over CPUs {:?}", round(result.elapsed_s), result.cpus), &report)?;
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", run_text(&report));
    }
    Ok(verdict(result))
}

/// A run whose sched trace showed a thread on the wrong CPU failed, and says so on standard
/// error whatever the output format (a script reading `--json` sees the exit code and why).
fn verdict(result: &RunResult) -> ExitCode {
    match &result.verify {
        Some(v) if v.wrong_cpu > 0 => {
            // Not eprintln!: with standard error gone, the exit code still says it failed.
            let _ = writeln!(
                std::io::stderr(),
                "virtprof balance: --verify failed: {} of {} switches of vCPU threads were on a CPU they were not placed on ({})",
                v.wrong_cpu,
                v.switches,
                v.examples.join("; ")
            );
            ExitCode::FAILURE
        }
        _ => ExitCode::SUCCESS,
    }
}

fn run_text(r: &RunReport<'_>) -> String {
    let mut s = String::new();
    let run = r.run;
    let _ = writeln!(
        s,
        "virtprof balance ({}): {} vCPUs over CPUs {:?} for {:.1} s, period {} ms{}",
        r.mode,
        run.targets.len(),
        run.cpus,
        run.elapsed_s,
        round(r.period_s * 1000.0),
        match r.policy {
            Policy::Thermal { k } => format!(", k {k}"),
            Policy::Fixed if r.forced_hz > 0.0 => format!(", swapped by force at {} Hz", r.forced_hz),
            Policy::Fixed => ", mapping kept".into(),
        }
    );
    let _ = writeln!(
        s,
        "\n{:>5} {:>12} {:>9} {:>11} {:>9} {:>8}",
        "CPU", "energy J", "mean W", "last J", "temp °C", "busy s"
    );
    for (c, time) in r.cores.iter().zip(&run.core_time) {
        let busy = time.busy_s.map_or_else(|| "?".into(), |b| format!("{b:.2}"));
        let _ = writeln!(
            s,
            "{:>5} {:>12.2} {:>9.2} {:>11.3} {:>9.1} {busy:>8}",
            c.cpu, c.total_j, c.mean_w, c.last_j, c.temp_c
        );
    }
    let _ = writeln!(s, "{}", coverage_text(&run.core_time));
    let bound = match r.policy {
        Policy::Thermal { .. } => format!("; seed bound {:.3} J", r.bound_j),
        Policy::Fixed => String::new(),
    };
    let _ = writeln!(
        s,
        "\ngap {:.3} J (largest {:.3} J{bound})   swaps {} ({:.2}/s{})",
        r.gap_j,
        r.max_gap_j,
        r.swap_count,
        r.swaps_per_s,
        if r.forced_hz > 0.0 || r.policy == Policy::Fixed {
            format!(", forced at {} Hz", r.forced_hz)
        } else {
            String::new()
        }
    );
    if run.forced_missed > 0 || run.late_periods > 0 {
        let _ = writeln!(
            s,
            "host busy: the balancer woke late, {} of {} forced swaps skipped, {} periods accounted late",
            run.forced_missed, run.forced_due, run.late_periods
        );
    }
    if let Policy::Thermal { .. } = r.policy {
        let cases: Vec<String> = run.cases.iter().enumerate().map(|(i, n)| format!("{}:{n}", i + 1)).collect();
        let _ = writeln!(s, "decisions by seed case: {}", cases.join(" "));
    }
    let now: Vec<String> = run
        .targets
        .iter()
        .zip(&run.final_cpus)
        .map(|(t, cpu)| format!("{} (tid {}) on CPU {cpu}", t.label, t.tid))
        .collect();
    let _ = writeln!(s, "vCPUs: {}", now.join(", "));
    if !run.unavailable_metrics.is_empty() {
        let _ = writeln!(s, "weights without a metric on this host (count 0): {}", run.unavailable_metrics.join(", "));
    }
    if let Some(v) = &run.verify {
        let _ = writeln!(
            s,
            "verify (sched trace): {} placements, {} seen running after the move, {} switches judged, {} on a wrong CPU, {} events lost",
            v.placements, v.observed, v.switches, v.wrong_cpu, v.lost_events
        );
        if v.lost_events > 0 {
            let _ = writeln!(s, "  the check is incomplete: lost events {}; raise --buffer-size", v.lost_events_text);
        }
        for e in &v.examples {
            let _ = writeln!(s, "  {e}");
        }
    }
    s
}

/// How much of the balanced CPUs' busy time the per-core energy covers.
fn coverage_text(cores: &[CoreTime]) -> String {
    let vcpu_s: f64 = cores.iter().map(|c| c.vcpu_s).sum();
    match cores.iter().map(|c| c.busy_s).sum::<Option<f64>>() {
        Some(busy_s) if busy_s > 0.0 => format!(
            "CPUs busy {busy_s:.2} s, vCPUs ran {vcpu_s:.2} s ({:.0} %): a core's energy is its vCPUs' alone; \
             the other {:.2} s (host threads, guests not balanced, this balancer) is charged to no core",
            100.0 * vcpu_s / busy_s,
            (busy_s - vcpu_s).max(0.0)
        ),
        _ => format!(
            "vCPUs ran {vcpu_s:.2} s; the CPUs' busy time is unknown (no /proc/stat lines), so what else ran on them is too"
        ),
    }
}

pub fn replay(r: &Replay, json: bool, html: Option<&Path>) -> anyhow::Result<ExitCode> {
    #[derive(Serialize)]
    struct Page<'a> {
        kind: &'static str,
        #[serde(flatten)]
        replay: &'a Replay,
    }
    let page = Page { kind: "replay", replay: r };
    if let Some(out) = html {
        write_html(out, "balance replay", &r.file, &page)?;
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&page)?);
        return Ok(ExitCode::SUCCESS);
    }
    let last = r.points.last();
    println!(
        "virtprof balance --replay {}: {} vCPUs on {} simulated cores, {} periods of {} ms, k {}",
        r.file,
        r.vcpus.len(),
        r.cores,
        r.points.len(),
        round(r.period_s * 1000.0),
        r.k
    );
    println!("\n{:>10} {:>14} {:>14} {:>8}", "time s", "gap kept J", "gap policy J", "swaps");
    let step = (r.points.len() / 10).max(1);
    for p in r.points.iter().skip(step - 1).step_by(step) {
        println!("{:>10.2} {:>14.3} {:>14.3} {:>8}", p.t_s, p.gap_without_j, p.gap_with_j, p.swaps);
    }
    if let Some(p) = last {
        println!(
            "\nfinal gap {:.3} J kept, {:.3} J with the policy (largest {:.3} J; seed bound {:.3} J); {:.2} swaps/s",
            p.gap_without_j,
            p.gap_with_j,
            r.points.iter().map(|p| p.gap_with_j).fold(0.0, f64::max),
            r.bound_j,
            r.swaps_per_s
        );
        println!("hottest core {:.1} °C kept, {:.1} °C with the policy", p.max_temp_without_c, p.max_temp_with_c);
    }
    println!("lost events: {}", r.lost_events_text);
    Ok(ExitCode::SUCCESS)
}

pub fn calibration(fit: &Fit, json: bool, written: Option<&Path>) -> anyhow::Result<ExitCode> {
    if json {
        println!("{}", serde_json::to_string_pretty(fit)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!("fitted on {} periods (rms error {:.2}% of the mean energy)", fit.periods, fit.rms_error_pct);
    println!("  active_power_w = {:.6}", fit.model.active_power_w);
    if let Some(w) = fit.static_power_w {
        println!("  static power   = {w:.6} W (not charged to vCPUs; left out of the model)");
    }
    for (m, w) in &fit.model.per_event_j {
        println!("  {m:<28} = {w:.6e} J");
    }
    if let Some(path) = written {
        println!("written to {} (use with --weights)", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

pub fn bench(r: &BenchResult, json: bool, html: Option<&Path>) -> anyhow::Result<ExitCode> {
    #[derive(Serialize)]
    struct Page<'a> {
        kind: &'static str,
        #[serde(flatten)]
        bench: &'a BenchResult,
    }
    let page = Page { kind: "bench", bench: r };
    if let Some(out) = html {
        write_html(out, "balance bench", &format!("CPUs {:?}", r.cpus), &page)?;
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&page)?);
        return Ok(ExitCode::SUCCESS);
    }
    if !r.overhead.is_empty() {
        println!("(a) forced swaps of two compute vCPUs on CPUs {:?} (seed 002, Table 6.3)\n", r.cpus);
        println!("{:>10} {:>10} {:>10} {:>16} {:>10}", "freq Hz", "swaps/s", "missed", "iterations/s", "loss %");
        for o in &r.overhead {
            println!(
                "{:>10} {:>10.1} {:>10} {:>16.0} {:>10.2}",
                o.freq_hz,
                o.swaps_per_s,
                format!("{}/{}", o.ticks_missed, o.ticks_due),
                o.throughput,
                o.loss_pct
            );
        }
    }
    if let Some(p) = &r.policy {
        println!(
            "\n(b) a hot (compute) and a cold (io-bound) vCPU, period {} ms, k {}\n",
            round(p.period_s * 1000.0),
            p.k
        );
        println!(
            "  without the policy: gap {:.2} J after {:.1} s, growing {:.3} J/s (R² {:.3})",
            p.gap_without_j,
            p.without.last().map_or(0.0, |x| x.0),
            p.slope_without_j_per_s,
            p.r2_without
        );
        println!(
            "  with the policy:    gap {:.3} J (largest {:.3} J; seed bound {:.3} J), {:.2} swaps/s",
            p.gap_with_j, p.max_gap_with_j, p.bound_j, p.swaps_per_s
        );
        let cases: Vec<String> = p.cases.iter().enumerate().map(|(i, n)| format!("{}:{n}", i + 1)).collect();
        println!("  decisions by seed case: {}", cases.join(" "));
        if p.late_periods != (0, 0) {
            println!(
                "  host busy: {} periods accounted late without the policy, {} with it",
                p.late_periods.0, p.late_periods.1
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn write_html(out: &Path, kind: &str, title: &str, data: &impl Serialize) -> anyhow::Result<()> {
    let page = page::render(kind, title, data, SCRIPT)?;
    virtprof_host::output::write_file(out, page.as_bytes(), virtprof_host::output::Privacy::Shared)?;
    eprintln!("virtprof: wrote {}", out.display());
    Ok(())
}

fn round(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}
