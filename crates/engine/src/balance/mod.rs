//! One live balancing run: every period, sample the vCPU threads (the interval sampler's
//! schedstat, KVM stats and perf columns), turn each vCPU's activity into joules, book them
//! on the cores, let the policy decide, and move threads. Forced swaps (for the overhead
//! experiment) run on their own clock between periods. A dry run books and decides the same
//! way but never touches a thread.

mod actuator;
mod split;
pub mod verify;

use std::sync::atomic::Ordering;

use serde::Serialize;
use virtprof_analysis::balance::{Decision, PairDecision};
use virtprof_analysis::balancer::{CoreAccount, Ledger, Policy, Swap};
use virtprof_analysis::energy::{Activity, Weights};
use virtprof_host::affinity::prefer_realtime;
use virtprof_host::stop::STOP_REQUESTED;
use virtprof_host::{monotonic_ns, sleep_until_or_stop};
use virtprof_interval::counters::default_specs;
use virtprof_interval::sampler::{IntervalSampler, SamplerConfig};
use virtprof_kvm::discover::DiscoveredVm;
use virtprof_model::interval::Entity;
use virtprof_model::units::saturating_u64;

use crate::energy::Model;
use actuator::Actuator;
use split::RunSplit;
use verify::{Placement, Tracer, Verification};

/// A vCPU under balancing.
#[derive(Debug, Clone, Serialize)]
pub struct Target {
    /// VMM pid.
    pub pid: u32,
    /// vCPU index.
    pub index: u32,
    /// Its thread.
    pub tid: u32,
    /// `vmPID/vcpuN`, or the VM's name.
    pub label: String,
}

impl Target {
    /// Every vCPU of `vms`, in (pid, index) order.
    pub fn of(vms: &[DiscoveredVm]) -> Vec<Target> {
        let mut targets: Vec<Target> = vms
            .iter()
            .flat_map(|vm| {
                vm.vcpus.iter().map(|v| Target {
                    pid: vm.pid,
                    index: v.index,
                    tid: v.tid,
                    label: format!("{}/vcpu{}", vm.name, v.index),
                })
            })
            .collect();
        targets.sort_by_key(|t| (t.pid, t.index));
        targets
    }
}

/// How a run behaves.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// Host CPUs; ledger core `c` is `cpus[c]`.
    pub cpus: Vec<u32>,
    /// Accounting and decision period.
    pub period_ns: u64,
    /// Stop after this long (None: until SIGINT/SIGTERM or every VM has exited).
    pub duration_ns: Option<u64>,
    /// Who decides swaps at period ends.
    pub policy: Policy,
    /// Swap core pairs (0↔1, 2↔3, ...) this often regardless of the policy (0: never).
    pub forced_hz: f64,
    /// Move threads (false: dry run).
    pub actuate: bool,
    /// Check the moves in a sched trace with this per-CPU buffer (KiB).
    pub verify: Option<u32>,
    /// Energy weights and thermal parameters.
    pub model: Model,
    /// A status line on stderr every second.
    pub progress: bool,
}

/// One accounting period.
#[derive(Debug, Clone, Serialize)]
pub struct PeriodRow {
    /// End of the period, seconds from the start.
    pub t_s: f64,
    /// Joules of each vCPU in this period.
    pub vcpu_j: Vec<f64>,
    /// Each core's accounts after booking the period.
    pub cores: Vec<CoreAccount>,
    /// Largest per-core difference of energy since the start.
    pub gap_j: f64,
    /// The policy's decisions (empty for the fixed policy).
    pub decisions: Vec<PairDecision>,
}

/// One swap carried out (or, in a dry run, decided).
#[derive(Debug, Clone, Serialize)]
pub struct SwapRow {
    /// When, seconds from the start.
    pub t_s: f64,
    /// Host CPUs whose vCPUs were exchanged: the hotter one first.
    pub cpus: (u32, u32),
    /// The seed's case that decided it; 0 for a forced swap.
    pub case: u8,
    /// Threads moved, with their new CPU.
    pub moved: Vec<(u32, u32)>,
}

/// Everything a run produced.
#[derive(Debug, Clone, Serialize)]
pub struct RunResult {
    /// vCPUs balanced.
    pub targets: Vec<Target>,
    /// Host CPUs used.
    pub cpus: Vec<u32>,
    /// Seconds the run lasted.
    pub elapsed_s: f64,
    /// The CPU each target was on at the end (where the policy put it).
    pub final_cpus: Vec<u32>,
    /// Per period.
    pub periods: Vec<PeriodRow>,
    /// Swaps, in order.
    pub swaps: Vec<SwapRow>,
    /// Forced-swap ticks that came due (`forced_hz` × the run, counted on the fixed clock).
    pub forced_due: u64,
    /// Of those, ticks skipped because the balancer woke up after the next one was due (a
    /// loaded host): every due tick is either swapped or counted here.
    pub forced_missed: u64,
    /// Periods accounted late, after the next one was already due (a loaded host): each
    /// covers more than one period's energy, which raises the bound seen.
    pub late_periods: u64,
    /// How often each of the seed's cases (1–7) decided.
    pub cases: [u64; 7],
    /// Weighted metrics none of the vCPUs offers here (they count nothing).
    pub unavailable_metrics: Vec<String>,
    /// The sched-trace check (`--verify`).
    pub verify: Option<Verification>,
    /// Per core, how much of its busy time the vCPUs charged to it account for.
    pub core_time: Vec<CoreTime>,
}

/// A core's busy time against the run time of the vCPUs charged to it. A core's energy
/// counts only its vCPUs: host threads (a VMM's I/O, a load generator, this balancer) and
/// guests not balanced run on it unaccounted, and this says how much.
#[derive(Debug, Clone, Serialize)]
pub struct CoreTime {
    /// The host CPU.
    pub cpu: u32,
    /// Its non-idle time over the run (/proc/stat user, nice, system, irq, softirq); None
    /// where this CPU has no /proc/stat line.
    pub busy_s: Option<f64>,
    /// Run time of the vCPUs while they were on this core (read at every move, as their
    /// energy is split).
    pub vcpu_s: f64,
}

/// Where a vCPU's numbers are in the sampler's row.
struct Columns {
    run_ns: Option<usize>,
    events: Vec<(String, usize)>,
}

/// Run the balancer over `targets` until the duration ends, a stop is requested, or every
/// target's VMM has exited.
pub fn run(vms: &[DiscoveredVm], targets: Vec<Target>, config: &RunConfig) -> anyhow::Result<RunResult> {
    run_observed(vms, targets, config, &mut |_| {})
}

/// [`run`], handing every period's per-vCPU activity to `observe` (calibration).
pub fn run_observed(
    vms: &[DiscoveredVm],
    targets: Vec<Target>,
    config: &RunConfig,
    observe: &mut dyn FnMut(&[Activity]),
) -> anyhow::Result<RunResult> {
    let weights = config.model.weights();
    let (mut sampler, columns, unavailable_metrics) = open_sampler(vms, &targets, &weights)?;
    let tids: Vec<u32> = targets.iter().map(|t| t.tid).collect();
    let core_of = starting_cores(&tids, &config.cpus, config.actuate);
    let mut ledger = Ledger::new(core_of.clone(), config.cpus.len(), config.model.thermal);
    let mut tracer = config.verify.map(|buffer_kb| Tracer::start(&tids, buffer_kb)).transpose()?;
    let mut placements = Vec::new();
    let t0 = monotonic_ns();
    let mut actuator = config.actuate.then(Actuator::new);
    // Move `tid` to `cpu` (when actuating), noting when its own affinity call began and ended.
    // False: the thread has exited and moved nowhere (its VM is going; the run ends at the
    // next period's check). A dry run moves nothing and says every move was made.
    let mut place = |actuator: &mut Option<Actuator>, tid: u32, cpu: u32| -> anyhow::Result<bool> {
        let Some(a) = actuator else { return Ok(true) };
        let start_ns = monotonic_ns();
        let moved = a.set(tid, cpu)?;
        if moved {
            placements.push(Placement { tid, cpu, start_ns, done_ns: monotonic_ns() });
        }
        Ok(moved)
    };
    for (&tid, &core) in tids.iter().zip(&core_of) {
        place(&mut actuator, tid, config.cpus[core])?;
    }
    prefer_realtime();
    // Only swaps carried out are published (a dry run moves nothing).
    let status = config.actuate.then(crate::energy::status::StatusFile::create);

    let mut row = vec![0.0; sampler.series().len()];
    sampler.sample(&mut row);
    let end = config.duration_ns.map_or(u64::MAX, |d| t0.saturating_add(d));
    let forced_every = (config.forced_hz > 0.0).then(|| saturating_u64(1e9 / config.forced_hz));
    let mut next_period = t0 + config.period_ns;
    let mut next_forced = forced_every.map_or(u64::MAX, |every| t0 + every);
    let mut next_status = t0 + 1_000_000_000;
    let period_s = config.period_ns as f64 / 1e9;
    let mut result = RunResult {
        targets,
        cpus: config.cpus.clone(),
        elapsed_s: 0.0,
        final_cpus: Vec::new(),
        periods: Vec::new(),
        swaps: Vec::new(),
        forced_due: 0,
        forced_missed: 0,
        late_periods: 0,
        cases: [0; 7],
        unavailable_metrics,
        verify: None,
        core_time: config.cpus.iter().map(|&cpu| CoreTime { cpu, busy_s: None, vcpu_s: 0.0 }).collect(),
    };
    let busy_columns = busy_columns(sampler.series(), &config.cpus);
    let seconds = |ns: u64| (ns - t0) as f64 / 1e9;
    let mut split = RunSplit::new(&result.targets, config.cpus.len());
    let mut carry_out = |swaps: Vec<Swap>,
                         case_of: &dyn Fn(&Swap) -> u8,
                         result: &mut RunResult,
                         split: &mut RunSplit|
     -> anyhow::Result<()> {
        for swap in swaps {
            let mut moved = Vec::new();
            for (&v, core) in
                swap.to_cold.iter().map(|v| (v, swap.pair.cold)).chain(swap.to_hot.iter().map(|v| (v, swap.pair.hot)))
            {
                let from = if core == swap.pair.cold { swap.pair.hot } else { swap.pair.cold };
                let cpu = config.cpus[core];
                if place(&mut actuator, tids[v], cpu)? {
                    moved.push((tids[v], cpu));
                }
                // Read after the move: a running thread's schedstat is brought up to date when
                // it is migrated off its CPU, and is stale by up to a tick before (the stale
                // part would be charged to the core it moves to).
                split.leaving(v, from);
            }
            let done_ns = monotonic_ns();
            result.swaps.push(SwapRow {
                t_s: seconds(done_ns),
                cpus: (config.cpus[swap.pair.hot], config.cpus[swap.pair.cold]),
                case: case_of(&swap),
                moved,
            });
        }
        Ok(())
    };

    loop {
        sleep_until_or_stop(next_period.min(next_forced).min(end), &STOP_REQUESTED);
        let now = monotonic_ns();
        let stopping = STOP_REQUESTED.load(Ordering::Relaxed) || now >= end;
        if let Some(every) = forced_every.filter(|_| now >= next_forced && !stopping) {
            let swaps: Vec<Swap> = (0..config.cpus.len() / 2)
                .map(|p| {
                    let forced = Decision { case: 0, swap: true };
                    ledger.swap(PairDecision { hot: 2 * p, cold: 2 * p + 1, decision: forced })
                })
                .collect();
            carry_out(swaps, &|_| 0, &mut result, &mut split)?;
            // A late wake-up skips the swaps it missed rather than bunching them.
            let due = advance(&mut next_forced, every, now);
            result.forced_due += due;
            result.forced_missed += due - 1;
        }
        if now >= next_period || stopping {
            sampler.sample(&mut row);
            let activities: Vec<Activity> = columns.iter().map(|c| activity(c, &row)).collect();
            let shares = split.shares(ledger.core_of());
            charge_core_time(&mut result.core_time, &activities, &shares, ledger.core_of(), &row, &busy_columns);
            observe(&activities);
            let vcpu_j: Vec<f64> = activities.iter().map(|a| weights.energy_j(a)).collect();
            ledger.account_split(&vcpu_j, &shares, period_s);
            let decisions = ledger.decide(config.policy);
            for d in &decisions {
                result.cases[usize::from(d.decision.case - 1)] += 1;
            }
            let swaps = if stopping { Vec::new() } else { ledger.apply(&decisions) };
            let case_of = |s: &Swap| s.pair.decision.case;
            carry_out(swaps, &case_of, &mut result, &mut split)?;
            result.periods.push(PeriodRow {
                t_s: seconds(now),
                vcpu_j,
                cores: ledger.cores().to_vec(),
                gap_j: ledger.gap_j(),
                decisions,
            });
            result.late_periods += u64::from(advance(&mut next_period, config.period_ns, now) > 1);
            if let Some(t) = tracer.as_mut() {
                t.drain()?;
            }
            // Checked per period, not per wake-up: forced swaps wake up to 1000 times a second.
            if targets_gone(&result.targets) {
                break;
            }
            if let Some(s) = &status {
                let cores = config.cpus.iter().zip(ledger.cores());
                s.publish(
                    result.swaps.len() as u64,
                    cores.map(|(&cpu, a)| (cpu, a.total_j, a.last_j / period_s, a.temp_c)).collect(),
                );
            }
        }
        if config.progress && now >= next_status {
            eprintln!("{}", status_line(seconds(now), &config.cpus, &ledger, result.swaps.len()));
            next_status += 1_000_000_000;
        }
        if stopping {
            // Ticks that fell due before the end while the balancer slept late were missed too.
            if let Some(every) = forced_every {
                while next_forced < now.min(end) {
                    next_forced += every;
                    result.forced_due += 1;
                    result.forced_missed += 1;
                }
            }
            break;
        }
    }
    result.elapsed_s = seconds(monotonic_ns());
    result.final_cpus = ledger.core_of().iter().map(|&c| config.cpus[c]).collect();
    // The trace stops before the threads get their own affinity back: a placement holds to
    // the end of the trace, and a thread the kernel moves once it is free again is not wrong.
    if let Some(t) = tracer {
        result.verify = Some(t.finish(&placements)?);
    }
    drop(actuator);
    Ok(result)
}

/// Move a schedule `next` past `now` in steps of `every`; how many ticks had fallen due.
fn advance(next: &mut u64, every: u64, now: u64) -> u64 {
    let mut due = 0;
    while *next <= now {
        *next += every;
        due += 1;
    }
    due
}

/// Add a period to each core's time: its vCPUs' run time by the share each ran there (all of
/// it where it is, when nothing was read), and the CPU's busy time from /proc/stat's columns.
fn charge_core_time(
    core_time: &mut [CoreTime],
    activities: &[Activity],
    shares: &[Vec<(usize, f64)>],
    core_of: &[usize],
    row: &[f64],
    busy_columns: &[Option<Vec<usize>>],
) {
    for ((a, share), &core) in activities.iter().zip(shares).zip(core_of) {
        let run_s = a.run_ns as f64 / 1e9;
        if share.is_empty() {
            core_time[core].vcpu_s += run_s;
        }
        for &(core, fraction) in share {
            core_time[core].vcpu_s += run_s * fraction;
        }
    }
    for (time, at) in core_time.iter_mut().zip(busy_columns) {
        if let Some(at) = at {
            let busy_ns: f64 = at.iter().map(|&i| counted(row, i)).sum();
            *time.busy_s.get_or_insert(0.0) += busy_ns / 1e9;
        }
    }
}

/// The sampler over the targets' VMs, where each target's columns are, and the weighted
/// metrics no target offers.
fn open_sampler(
    vms: &[DiscoveredVm],
    targets: &[Target],
    weights: &Weights,
) -> anyhow::Result<(IntervalSampler, Vec<Columns>, Vec<String>)> {
    let tracefs = virtprof_trace::tracefs::Tracefs::locate_or_mount()
        .map(|t| t.root().to_path_buf())
        .unwrap_or_else(|_| "/sys/kernel/tracing".into());
    let mut sampler = IntervalSampler::new(SamplerConfig { counters: default_specs(&tracefs), hw_counters: 4 })?;
    sampler.add_vms(vms);
    let series = sampler.series();
    let find = |t: &Target, metric: &str| {
        series.iter().position(|s| s.entity == Entity::Vcpu { pid: t.pid, index: t.index } && s.metric == metric)
    };
    let columns: Vec<Columns> = targets
        .iter()
        .map(|t| Columns {
            run_ns: find(t, "schedstat.run_ns"),
            events: weights.per_event_j.keys().filter_map(|m| find(t, m).map(|at| (m.clone(), at))).collect(),
        })
        .collect();
    if let Some(t) = targets.iter().zip(&columns).find(|(_, c)| c.run_ns.is_none()).map(|(t, _)| t) {
        anyhow::bail!(
            "no schedstat for vCPU thread {} of VM {}: the kernel needs CONFIG_SCHED_INFO, and the thread must still exist",
            t.tid,
            t.pid
        );
    }
    let unavailable = weights
        .per_event_j
        .keys()
        .filter(|m| !columns.iter().any(|c| c.events.iter().any(|(name, _)| name == *m)))
        .cloned()
        .collect();
    Ok((sampler, columns, unavailable))
}

/// Where each of `cpus`' busy-time fields are in the sampler's row (None: no /proc/stat line).
fn busy_columns(series: &[virtprof_model::interval::Series], cpus: &[u32]) -> Vec<Option<Vec<usize>>> {
    const BUSY: [&str; 5] = ["stat.user_ns", "stat.nice_ns", "stat.system_ns", "stat.irq_ns", "stat.softirq_ns"];
    cpus.iter()
        .map(|&cpu| {
            let at: Vec<usize> = BUSY
                .iter()
                .filter_map(|m| series.iter().position(|s| s.entity == Entity::Cpu(cpu) && s.metric == *m))
                .collect();
            (at.len() == BUSY.len()).then_some(at)
        })
        .collect()
}

/// A sampled delta as counted: an unreadable (NaN) or negative figure counts nothing.
fn counted(row: &[f64], at: usize) -> f64 {
    if row[at].is_finite() {
        row[at].max(0.0)
    } else {
        0.0
    }
}

fn activity(columns: &Columns, row: &[f64]) -> Activity {
    let value = |at: usize| counted(row, at);
    Activity {
        run_ns: columns.run_ns.map_or(0, |at| saturating_u64(value(at))),
        events: columns.events.iter().map(|(m, at)| (m.clone(), value(*at))).collect(),
    }
}

/// Where each vCPU starts: round-robin over the cores, except that a dry run keeps a thread
/// already pinned to one of the cores where it is.
fn starting_cores(tids: &[u32], cpus: &[u32], actuate: bool) -> Vec<usize> {
    tids.iter()
        .enumerate()
        .map(|(v, &tid)| {
            let pinned = if actuate { None } else { virtprof_host::affinity::get(tid).ok() };
            match pinned.as_deref() {
                Some(&[cpu]) => cpus.iter().position(|&c| c == cpu).unwrap_or(v % cpus.len()),
                _ => v % cpus.len(),
            }
        })
        .collect()
}

fn targets_gone(targets: &[Target]) -> bool {
    targets.iter().all(|t| !std::path::Path::new(&format!("/proc/{}/task/{}", t.pid, t.tid)).exists())
}

fn status_line(t_s: f64, cpus: &[u32], ledger: &Ledger, swaps: usize) -> String {
    let cores: Vec<String> = cpus
        .iter()
        .zip(ledger.cores())
        .map(|(cpu, a)| format!("cpu{cpu} {:.1} J {:.1} °C", a.total_j, a.temp_c))
        .collect();
    format!("{t_s:6.1}s  {}  gap {:.2} J  swaps {swaps}", cores.join("  "), ledger.gap_j())
}

#[cfg(test)]
mod tests {
    use super::advance;

    #[test]
    fn a_late_schedule_skips_what_it_missed_and_says_how_many() {
        let mut next = 100;
        assert_eq!(advance(&mut next, 10, 99), 0);
        assert_eq!((advance(&mut next, 10, 100), next), (1, 110));
        assert_eq!((advance(&mut next, 10, 145), next), (4, 150));
    }
}
