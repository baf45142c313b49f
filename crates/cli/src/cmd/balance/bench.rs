//! `virtprof balance bench`: the two experiments of seed 002 on testvm guests.
//!
//! (a) Overhead (the seed's Table 6.3): two compute guests, one vCPU each, pinned to two
//! cores, swapped by force at 0, 1, 10, 20, 100 and 1000 Hz. Throughput is the guests' own
//! iteration count (their shared page) over each segment; segments of all frequencies are
//! interleaved in every repetition so drift on the host hits them alike, and the median over
//! repetitions is reported.
//!
//! (b) Policy: a hot (compute) and a cold (io-bound) guest on two cores, first with the
//! mapping kept, then with the policy: the per-core energy gap over time and the swap rate
//! the policy chose.

use std::path::Path;

use serde::Serialize;
use virtprof_analysis::balancer::{gap_bound_seen_j, Policy};
use virtprof_host::monotonic_ns;
use virtprof_host::stop::STOP_REQUESTED;
use virtprof_kvm::discover::inspect;
use virtprof_kvm::guest_counters::GuestCounters;

use crate::args::Experiment;
use virtprof_engine::balance::{self as live, RunConfig, RunResult, Target};
use virtprof_engine::energy::Model;
use virtprof_engine::testvms::TestVms;

/// The seed's migration frequencies.
pub const FREQUENCIES_HZ: [f64; 6] = [0.0, 1.0, 10.0, 20.0, 100.0, 1000.0];

/// How the bench runs.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// The two host CPUs.
    pub cpus: Vec<u32>,
    /// Length of one overhead segment.
    pub segment_ns: u64,
    /// Repetitions of the whole frequency sweep.
    pub reps: u32,
    /// Length of each policy run (without, then with).
    pub policy_ns: u64,
    /// Accounting period of the policy runs.
    pub period_ns: u64,
    /// Threshold.
    pub k: f64,
    /// Energy model.
    pub model: Model,
    /// Skip (a) or (b).
    pub only: Option<Experiment>,
}

/// One row of the overhead table.
#[derive(Debug, Clone, Serialize)]
pub struct OverheadRow {
    /// Forced swaps per second asked for.
    pub freq_hz: f64,
    /// Swaps per second carried out (median over repetitions).
    pub swaps_per_s: f64,
    /// Swaps carried out over all repetitions.
    pub swaps: u64,
    /// Forced-swap ticks due over all repetitions: each was swapped or missed.
    pub ticks_due: u64,
    /// Ticks skipped because the balancer woke up late (a loaded host).
    pub ticks_missed: u64,
    /// Guest iterations per second, both guests together (median over repetitions).
    pub throughput: f64,
    /// Loss against 0 Hz, percent.
    pub loss_pct: f64,
    /// Every repetition's throughput.
    pub runs: Vec<f64>,
}

/// The policy experiment.
#[derive(Debug, Clone, Serialize)]
pub struct PolicyResult {
    /// Threshold.
    pub k: f64,
    /// Accounting period, seconds.
    pub period_s: f64,
    /// Per-core energy gap at the end without the policy (J).
    pub gap_without_j: f64,
    /// The same with the policy (J).
    pub gap_with_j: f64,
    /// The largest gap seen with the policy (J).
    pub max_gap_with_j: f64,
    /// The seed's bound for the hottest and coldest period energies seen (J).
    pub bound_j: f64,
    /// Swaps per second the policy chose.
    pub swaps_per_s: f64,
    /// Growth of the gap without the policy: least-squares slope (J/s) and its R².
    pub slope_without_j_per_s: f64,
    /// How linear that growth is.
    pub r2_without: f64,
    /// How often each of the seven cases decided (with the policy).
    pub cases: [u64; 7],
    /// Periods accounted late (without, with the policy): a loaded host.
    pub late_periods: (u64, u64),
    /// Gap over time (s, J) without the policy.
    pub without: Vec<(f64, f64)>,
    /// Gap over time (s, J) with the policy.
    pub with: Vec<(f64, f64)>,
}

/// Both experiments.
#[derive(Debug, Clone, Serialize)]
pub struct BenchResult {
    /// The CPUs used.
    pub cpus: Vec<u32>,
    /// (a).
    pub overhead: Vec<OverheadRow>,
    /// (b).
    pub policy: Option<PolicyResult>,
}

/// Run the experiments, printing progress on stderr.
pub fn run(config: &BenchConfig) -> anyhow::Result<BenchResult> {
    let mut result = BenchResult { cpus: config.cpus.clone(), overhead: Vec::new(), policy: None };
    if config.only != Some(Experiment::Policy) {
        result.overhead = overhead(config)?;
    }
    if config.only != Some(Experiment::Overhead) && !STOP_REQUESTED.load(std::sync::atomic::Ordering::Relaxed) {
        result.policy = Some(policy(config)?);
    }
    Ok(result)
}

fn run_config(config: &BenchConfig, policy: Policy, forced_hz: f64, duration_ns: u64) -> RunConfig {
    RunConfig {
        cpus: config.cpus.clone(),
        period_ns: config.period_ns,
        duration_ns: Some(duration_ns),
        policy,
        forced_hz,
        actuate: true,
        verify: None,
        model: config.model.clone(),
        progress: false,
    }
}

/// Start test VMs and return them with their discovered VMs and vCPU targets.
fn start_guests(
    vms: &mut TestVms,
    guests: &[&[&str]],
    count: usize,
) -> anyhow::Result<(Vec<virtprof_kvm::discover::DiscoveredVm>, Vec<Target>)> {
    for args in guests {
        vms.start(args)?;
    }
    let pids = vms.wait_for_vmms(count)?.ok_or_else(|| anyhow::anyhow!("stopped before the test VMs started"))?;
    let found: Vec<_> = pids.iter().filter_map(|&pid| inspect(Path::new("/proc"), pid).ok().flatten()).collect();
    let mut targets = Target::of(&found);
    // Keep the start order (hot guest first) rather than pid order.
    targets.sort_by_key(|t| pids.iter().position(|&p| p == t.pid));
    Ok((found, targets))
}

fn overhead(config: &BenchConfig) -> anyhow::Result<Vec<OverheadRow>> {
    let total_s =
        (config.segment_ns as f64 / 1e9 + 0.3) * (FREQUENCIES_HZ.len() as f64) * f64::from(config.reps) + 30.0;
    let duration = format!("{}s", total_s.ceil());
    let mut vms = TestVms::new("balance bench");
    let (found, targets) = start_guests(
        &mut vms,
        &[&["--workload", "compute", "--vms", "2", "--name", "bench-compute", "--duration", &duration]],
        2,
    )?;
    let guests: Vec<GuestCounters> = found.iter().map(|vm| attach_counters(vm.pid)).collect::<anyhow::Result<_>>()?;
    let iterations = || guests.iter().map(|g| g.read(0).map_or(0, |c| c.iterations)).sum::<u64>();
    // Let the guests get past their start-up before the first segment is timed.
    std::thread::sleep(std::time::Duration::from_millis(500));
    let mut runs: Vec<Vec<(f64, f64)>> = vec![Vec::new(); FREQUENCIES_HZ.len()];
    let mut ticks = [(0, 0, 0); FREQUENCIES_HZ.len()];
    for rep in 0..config.reps {
        for step in 0..FREQUENCIES_HZ.len() {
            // Rotate the order each repetition so no frequency always runs first.
            let at = (step + rep as usize) % FREQUENCIES_HZ.len();
            let hz = FREQUENCIES_HZ[at];
            eprintln!("virtprof balance bench: overhead rep {}/{} at {hz} Hz", rep + 1, config.reps);
            let (i0, t0) = (iterations(), monotonic_ns());
            let run = live::run(&found, targets.clone(), &run_config(config, Policy::Fixed, hz, config.segment_ns))?;
            let (i1, t1) = (iterations(), monotonic_ns());
            let seconds = (t1 - t0) as f64 / 1e9;
            runs[at].push(((i1 - i0) as f64 / seconds, run.swaps.len() as f64 / run.elapsed_s.max(1e-9)));
            let (swaps, due, missed) = ticks[at];
            ticks[at] = (swaps + run.swaps.len() as u64, due + run.forced_due, missed + run.forced_missed);
            if STOP_REQUESTED.load(std::sync::atomic::Ordering::Relaxed) {
                anyhow::bail!("interrupted");
            }
        }
    }
    let rows: Vec<(f64, f64, Vec<f64>)> = runs
        .iter()
        .map(|r| {
            let throughputs: Vec<f64> = r.iter().map(|x| x.0).collect();
            (median(&throughputs), median(&r.iter().map(|x| x.1).collect::<Vec<_>>()), throughputs)
        })
        .collect();
    let base = rows[0].0;
    Ok(FREQUENCIES_HZ
        .iter()
        .zip(rows)
        .zip(ticks)
        .map(|((&freq_hz, (throughput, swaps_per_s, runs)), (swaps, ticks_due, ticks_missed))| OverheadRow {
            freq_hz,
            swaps_per_s,
            swaps,
            ticks_due,
            ticks_missed,
            throughput,
            loss_pct: if base > 0.0 { 100.0 * (1.0 - throughput / base) } else { 0.0 },
            runs,
        })
        .collect())
}

fn policy(config: &BenchConfig) -> anyhow::Result<PolicyResult> {
    let duration = format!("{}s", (2.0 * config.policy_ns as f64 / 1e9 + 30.0).ceil());
    let mut vms = TestVms::new("balance bench");
    let (found, targets) = start_guests(
        &mut vms,
        &[
            &["--workload", "compute", "--name", "bench-hot", "--duration", &duration],
            &["--workload", "io-bound", "--io-latency", "2ms", "--name", "bench-cold", "--duration", &duration],
        ],
        2,
    )?;
    eprintln!("virtprof balance bench: policy, mapping kept");
    let without = live::run(&found, targets.clone(), &run_config(config, Policy::Fixed, 0.0, config.policy_ns))?;
    eprintln!("virtprof balance bench: policy, k = {}", config.k);
    let with = live::run(&found, targets, &run_config(config, Policy::Thermal { k: config.k }, 0.0, config.policy_ns))?;
    Ok(summarize(config, &without, &with))
}

/// The figures of the policy experiment from its two runs.
pub fn summarize(config: &BenchConfig, without: &RunResult, with: &RunResult) -> PolicyResult {
    let curve = |r: &RunResult| r.periods.iter().map(|p| (p.t_s, p.gap_j)).collect::<Vec<_>>();
    let (without_curve, with_curve) = (curve(without), curve(with));
    let last_gap = |c: &[(f64, f64)]| c.last().map_or(0.0, |p| p.1);
    let (slope, r2) = linear_fit(&without_curve);
    PolicyResult {
        k: config.k,
        period_s: config.period_ns as f64 / 1e9,
        gap_without_j: last_gap(&without_curve),
        gap_with_j: last_gap(&with_curve),
        max_gap_with_j: with_curve.iter().map(|p| p.1).fold(0.0, f64::max),
        bound_j: gap_bound_seen_j(with.periods.iter().flat_map(|p| p.cores.iter().map(|c| c.last_j)), config.k),
        swaps_per_s: with.swaps.len() as f64 / with.elapsed_s.max(1e-9),
        slope_without_j_per_s: slope,
        r2_without: r2,
        cases: with.cases,
        late_periods: (without.late_periods, with.late_periods),
        without: without_curve,
        with: with_curve,
    }
}

fn attach_counters(pid: u32) -> anyhow::Result<GuestCounters> {
    // The VMM maps guest RAM just after it creates the VM; give it a moment.
    for _ in 0..100 {
        if let Some(g) = GuestCounters::attach(Path::new("/proc"), pid)? {
            return Ok(g);
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    anyhow::bail!("the application counters of test VM {pid} never appeared")
}

fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Least-squares line through the points: (slope, R²).
fn linear_fit(points: &[(f64, f64)]) -> (f64, f64) {
    let n = points.len() as f64;
    if points.len() < 2 {
        return (0.0, 0.0);
    }
    let (mx, my) = (points.iter().map(|p| p.0).sum::<f64>() / n, points.iter().map(|p| p.1).sum::<f64>() / n);
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let syy: f64 = points.iter().map(|p| (p.1 - my).powi(2)).sum();
    if sxx == 0.0 || syy == 0.0 {
        return (0.0, 0.0);
    }
    (sxy / sxx, sxy * sxy / (sxx * syy))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_fits_exactly_and_noise_lowers_r2() {
        let line: Vec<(f64, f64)> = (0..10).map(|i| (f64::from(i), 3.0 * f64::from(i) + 1.0)).collect();
        let (slope, r2) = linear_fit(&line);
        assert!((slope - 3.0).abs() < 1e-12 && (r2 - 1.0).abs() < 1e-12);
        let zigzag: Vec<(f64, f64)> = (0..10).map(|i| (f64::from(i), f64::from(i % 2))).collect();
        assert!(linear_fit(&zigzag).1 < 0.1);
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
    }
}
