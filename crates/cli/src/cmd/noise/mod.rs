//! `virtprof noise`: OS noise per CPU with its causes (rtla osnoise top's columns plus STEAL and
//! HYP), or, with `--testvm`, a guest's noise explained by host events.

mod agent;
mod explain;
mod guest;
mod output;
mod trace;

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde::Serialize;
use virtprof_analysis::noise::{attribute, split_steal, summarize, CpuContexts, PeriodSummary, Sample};
use virtprof_interval::procstat::ProcStat;
use virtprof_model::event::{Event, EventKind};
use virtprof_model::units::{duration_ns, format_duration_ns, saturating_u64};
use virtprof_trace::decode::Decoder;

use crate::args::{NoiseArgs, NoiseClock};
use crate::exit::usage;
use virtprof_host::osnoise::{self as measure, Clock, LoopConfig, LoopResult, Probe, TscMap};

/// Settings common to both modes, validated.
pub struct Settings {
    pub cpus: Vec<u32>,
    pub duration_ns: u64,
    pub threshold_ns: u64,
    pub period_ns: u64,
    pub runtime_ns: u64,
    pub clock: Clock,
    pub stop_single_ns: Option<u64>,
    pub stop_total_ns: Option<u64>,
    pub bucket_ns: u64,
    /// Histogram buckets kept.
    pub entries: usize,
    /// SCHED_FIFO priority of the measuring threads (0: normal).
    pub fifo: u8,
    /// Trace the measured CPUs to attribute samples.
    pub trace: bool,
    /// Where a stop's trace snapshot goes.
    pub snapshot: PathBuf,
    /// Run between every two clock reads.
    pub probe: Probe,
}

/// What `noise` measures.
enum Target {
    /// Host CPUs.
    Host,
    /// A testvm noise guest pinned to `cpu`, its vCPU kicked `inject_hz` times a second.
    Guest { cpu: u32, inject_hz: u32 },
    /// A recorded host trace and the guest report of the same run.
    Recorded { recording: PathBuf, guest: PathBuf },
    /// A `record --agent` recording holding a guest agent's noise samples.
    Agent { recording: PathBuf, vm: Option<String> },
}

pub fn run(args: &NoiseArgs) -> anyhow::Result<ExitCode> {
    let show = output::Show { json: args.json, hist: args.hist };
    let target = target(args)?;
    if let Target::Recorded { recording, guest } = &target {
        return output::print_guest(&guest::run_recorded(recording, guest)?, show);
    }
    if let Target::Agent { recording, vm } = &target {
        let report = agent::run(recording, vm.as_deref())?;
        let text = if show.json { serde_json::to_string_pretty(&report)? + "\n" } else { agent::table(&report) };
        std::io::Write::write_all(&mut crate::output::stdout(), text.as_bytes())?;
        return Ok(ExitCode::SUCCESS);
    }
    let settings = settings(args)?;
    if let Target::Guest { cpu, inject_hz } = target {
        return output::print_guest(&guest::run(&settings, cpu, inject_hz)?, show);
    }
    virtprof_host::stop::install_handler();
    let report = measure_host(&settings)?;
    output::print(&report, show)
}

fn target(args: &NoiseArgs) -> anyhow::Result<Target> {
    if let (Some(recording), Some(guest)) = (&args.host_recording, &args.guest) {
        return Ok(Target::Recorded { recording: recording.clone(), guest: guest.clone() });
    }
    if let Some(recording) = &args.host_recording {
        if args.hist || args.stop_single.is_some() || args.stop_total.is_some() {
            return Err(usage(
                "--hist, --stop-single and --stop-total measure host CPUs; drop them with --host-recording",
            ));
        }
        return Ok(Target::Agent { recording: recording.clone(), vm: args.vm.clone() });
    }
    if !args.testvm {
        return Ok(Target::Host);
    }
    if args.hist || args.stop_single.is_some() || args.stop_total.is_some() {
        return Err(usage("--hist, --stop-single and --stop-total measure host CPUs; drop them with --testvm"));
    }
    let allowed = virtprof_host::affinity::allowed_cpus();
    let cpu = args.pin.or_else(|| allowed.last().copied()).unwrap_or(0);
    if !allowed.contains(&cpu) {
        return Err(usage(format!("--pin {cpu}: CPU not available here (allowed: {allowed:?})")));
    }
    Ok(Target::Guest { cpu, inject_hz: args.inject_hz })
}

fn settings(args: &NoiseArgs) -> anyhow::Result<Settings> {
    let time = |flag: &str, d: Duration| -> anyhow::Result<u64> {
        let ns = duration_ns(d);
        if ns == 0 {
            return Err(usage(format!("{flag} must be more than 0")));
        }
        Ok(ns)
    };
    let online = virtprof_trace::capture::online_cpus();
    let cpus = args.cpus.as_ref().map_or_else(|| online.clone(), |l| l.0.clone());
    if let Some(cpu) = cpus.iter().find(|c| !online.contains(c)) {
        return Err(usage(format!("--cpus: CPU {cpu} is not online (online: {online:?})")));
    }
    let period_ns = time("--period", args.period)?;
    let runtime_ns = args.runtime.map(|r| time("--runtime", r)).transpose()?.unwrap_or(period_ns);
    if runtime_ns > period_ns {
        return Err(usage(format!(
            "--runtime {} is longer than --period {}",
            format_duration_ns(runtime_ns),
            format_duration_ns(period_ns)
        )));
    }
    let tsc_usable = virtprof_host::clock::tsc_usable();
    let clock = match args.clock {
        Some(NoiseClock::Tsc) if !tsc_usable => {
            return Err(usage("--clock tsc: this CPU's TSC is not constant and non-stop; use --clock mono-raw"))
        }
        Some(NoiseClock::Tsc) => Clock::Tsc,
        Some(NoiseClock::MonoRaw) => Clock::MonoRaw,
        None if tsc_usable => Clock::Tsc,
        None => Clock::MonoRaw,
    };
    if args.entries == 0 {
        return Err(usage("--entries must be at least 1"));
    }
    Ok(Settings {
        cpus,
        duration_ns: time("--duration", args.duration)?,
        threshold_ns: time("--threshold", args.threshold)?,
        period_ns,
        runtime_ns,
        clock,
        stop_single_ns: args.stop_single.map(|t| time("--stop-single", t)).transpose()?,
        stop_total_ns: args.stop_total.map(|t| time("--stop-total", t)).transpose()?,
        bucket_ns: time("--bucket-size", args.bucket_size)?,
        entries: args.entries,
        fifo: args.fifo.unwrap_or(0),
        trace: !args.no_trace,
        snapshot: args.snapshot.clone(),
        probe: args.probe.unwrap_or_default(),
    })
}

/// One CPU's results.
#[derive(Debug, Serialize)]
pub struct CpuReport {
    pub cpu: u32,
    /// The measurement thread.
    pub tid: u32,
    /// Mean time of one loop iteration.
    pub loop_ns: f64,
    /// Smallest step between two reads seen (the clock's read cost).
    pub min_step_ns: u64,
    /// Samples that did not fit the buffer.
    pub dropped_samples: u64,
    pub periods: Vec<PeriodSummary>,
    /// The whole run.
    pub total: PeriodSummary,
    /// Sample lengths in `bucket_ns` buckets.
    pub hist: Vec<u64>,
    /// Samples longer than the last bucket.
    pub hist_over: u64,
    /// The threads that took this CPU from the loop, most time first (at most
    /// [`TOP_THREADS`]).
    pub threads: Vec<ThreadNoise>,
}

/// How many interfering threads a CPU's report names.
const TOP_THREADS: usize = 8;

/// A thread that ran while the loop waited.
#[derive(Debug, Clone, Serialize)]
pub struct ThreadNoise {
    pub tid: u32,
    /// Its name as the scheduler last reported it ("?" if no switch named it).
    pub comm: String,
    /// Samples it ran in.
    pub samples: u64,
    /// Its time inside samples.
    pub noise_ns: u64,
}

/// Why the run stopped early.
#[derive(Debug, Serialize)]
pub struct StopReport {
    pub cpu: u32,
    pub start_ns: u64,
    pub len_ns: u64,
    /// The sample's attribution, ns per class.
    pub noise_ns_by_class: virtprof_analysis::noise::ByClass,
    pub snapshot: String,
}

/// Everything `virtprof noise` measured.
#[derive(Debug, Serialize)]
pub struct NoiseReport {
    pub kind: &'static str,
    pub in_vm: bool,
    pub clock: &'static str,
    pub tsc_hz: Option<f64>,
    pub threshold_ns: u64,
    pub period_ns: u64,
    pub runtime_ns: u64,
    pub bucket_ns: u64,
    /// Was a trace recorded (else nothing is attributed)?
    pub traced: bool,
    /// What ran between every two reads (`--probe`; null: nothing).
    pub probe: Option<String>,
    /// Events the kernel lacks (their causes fall into hw / virtualization).
    pub missing_events: Vec<String>,
    pub lost_events: u64,
    /// Where virtprof's own threads (trace readers, main) ran: the CPUs not measured.
    pub own_cpus: Vec<u32>,
    pub cpus: Vec<CpuReport>,
    pub stopped: Option<StopReport>,
}

fn measure_host(s: &Settings) -> anyhow::Result<NoiseReport> {
    let in_vm = virtprof_host::kind::in_vm();
    // Like oslat's main thread: trace readers and this thread keep off the measured CPUs.
    let own_cpus = virtprof_host::affinity::keep_off(&s.cpus);
    let trace_clock = match s.clock {
        // The trace runs on CLOCK_MONOTONIC_RAW either way; TSC samples are mapped onto it.
        Clock::Tsc | Clock::MonoRaw => "mono_raw",
        Clock::Mono => "mono",
    };
    let mut tracer = match trace::NoiseTrace::start(&s.cpus, trace_clock, &trace::EVENTS) {
        _ if !s.trace => None,
        Ok(t) => Some(t),
        Err(e) => {
            eprintln!("virtprof noise: no trace ({e:#}); samples are counted but not attributed");
            None
        }
    };
    let mut procstat = ProcStat::open().ok();
    let mut steal_at = Vec::new();
    let read_steal = |procstat: &mut Option<ProcStat>| {
        let mut steal = vec![0u64; s.cpus.len()];
        if let Some(p) = procstat {
            let _ = p.read(|cpu, f| {
                if let Some(i) = s.cpus.iter().position(|&c| c == cpu) {
                    steal[i] = saturating_u64(f[7]);
                }
            });
        }
        steal
    };
    let periods = s.duration_ns.div_ceil(s.period_ns);
    let first_pair = TscMap::pair();
    let ticks_per_ns = match s.clock {
        Clock::Tsc => calibrate_tsc(),
        Clock::MonoRaw | Clock::Mono => 1.0,
    };
    let t0 = measure::mono_raw_ns() + 20_000_000;
    let config = |cpu| LoopConfig {
        cpu,
        clock: s.clock,
        threshold_ns: s.threshold_ns,
        t0_ns: t0,
        period_ns: s.period_ns,
        runtime_ns: s.runtime_ns,
        periods,
        fifo: s.fifo,
        stop_single_ns: s.stop_single_ns,
        stop_total_ns: s.stop_total_ns,
        capacity: 1 << 20,
        probe: s.probe,
    };
    steal_at.push(read_steal(&mut procstat));
    let results: Vec<anyhow::Result<LoopResult>> = std::thread::scope(|scope| {
        let handles: Vec<_> = s
            .cpus
            .iter()
            .map(|&cpu| {
                let c = config(cpu);
                std::thread::Builder::new().name(format!("noise/{cpu}")).spawn_scoped(scope, move || {
                    // Refused SCHED_FIFO (the only permission the loop needs) is the user's
                    // to fix: the message says how.
                    measure::run(c, ticks_per_ns).map_err(|e| match e.kind() {
                        std::io::ErrorKind::PermissionDenied => usage(e.to_string()),
                        _ => e.into(),
                    })
                })
            })
            .collect();
        // Every period: steal counters and the trace buffers.
        for k in 1..=periods {
            let end = t0 + (k - 1) * s.period_ns + s.runtime_ns;
            while measure::mono_raw_ns() < end + 1_000_000 && !measure::STOP.load(Ordering::Relaxed) {
                if virtprof_host::stop::STOP_REQUESTED.load(Ordering::Relaxed) {
                    measure::STOP.store(true, Ordering::Relaxed);
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            steal_at.push(read_steal(&mut procstat));
            if let Some(t) = tracer.as_mut() {
                if let Err(e) = t.drain() {
                    eprintln!("virtprof noise: reading the trace: {e:#}");
                }
            }
            if measure::STOP.load(Ordering::Relaxed) {
                break;
            }
        }
        measure::STOP.store(true, Ordering::Relaxed);
        handles
            .into_iter()
            .map(|h| match h {
                Ok(h) => h.join().unwrap_or_else(|_| Err(anyhow::anyhow!("a measurement thread panicked"))),
                Err(e) => Err(anyhow::anyhow!("starting a measurement thread: {e}")),
            })
            .collect()
    });
    let map = (s.clock == Clock::Tsc).then(|| TscMap::between(first_pair, TscMap::pair()));
    let mut loops = Vec::with_capacity(results.len());
    for r in results {
        let mut r = r?;
        measure::convert(&mut r, map.as_ref());
        loops.push(r);
    }
    let (events, lost_events, missing_events, traced, names) = match tracer {
        Some(t) => {
            let missing = t.missing().to_vec();
            let (events, lost, decoder) = t.finish()?;
            let names = task_names(&events, &decoder);
            (events, lost, missing, true, names)
        }
        None => (Vec::new(), 0, Vec::new(), false, HashMap::new()),
    };
    let stop = stop_sample(map.as_ref());
    let mut cpus = Vec::new();
    let mut stopped = None;
    for (i, l) in loops.iter().enumerate() {
        let cpu_events: &[Event] = slice_of_cpu(&events, l.cpu);
        let contexts = contexts_of(cpu_events, l);
        let mut summaries = Vec::new();
        let mut all: Vec<Sample> = Vec::new();
        for (k, &(start, end, _)) in l.periods.iter().enumerate() {
            // Samples are in time order: each period takes its own slice.
            let (from, to) = (l.samples.partition_point(|s| s.0 < start), l.samples.partition_point(|s| s.0 <= end));
            let mut samples: Vec<Sample> =
                l.samples[from..to].iter().map(|&(t, len)| attribute(&contexts, t, len, l.tid, in_vm)).collect();
            if in_vm {
                let steal = match (steal_at.get(k), steal_at.get(k + 1)) {
                    (Some(a), Some(b)) => b[i].saturating_sub(a[i]),
                    _ => 0,
                };
                split_steal(&mut samples, steal);
            }
            summaries.push(summarize(end - start, &samples));
            all.extend(samples);
        }
        if let Some((cpu, start, len)) = stop.filter(|&(cpu, ..)| cpu == l.cpu) {
            let sample = all
                .iter()
                .find(|x| x.start_ns == start)
                .cloned()
                .unwrap_or_else(|| attribute(&contexts, start, len, l.tid, in_vm));
            let snapshot = output::write_snapshot(&s.snapshot, &events, &names, start, len)?;
            stopped = Some(StopReport { cpu, start_ns: start, len_ns: len, noise_ns_by_class: sample.ns, snapshot });
        }
        let runtime: u64 = l.periods.iter().map(|p| p.1 - p.0).sum();
        let iterations: u64 = l.periods.iter().map(|p| p.2).sum();
        let (hist, hist_over) = histogram(&all, s.bucket_ns, s.entries);
        cpus.push(CpuReport {
            cpu: l.cpu,
            tid: l.tid,
            loop_ns: if iterations == 0 { 0.0 } else { runtime as f64 / iterations as f64 },
            min_step_ns: if l.min_step_ns == u64::MAX { 0 } else { l.min_step_ns },
            dropped_samples: l.dropped,
            total: summarize(runtime, &all),
            periods: summaries,
            hist,
            hist_over,
            threads: interfering_threads(&contexts, &all, l.tid, &names),
        });
    }
    Ok(NoiseReport {
        kind: "noise",
        in_vm,
        clock: match s.clock {
            Clock::Tsc => "tsc",
            Clock::MonoRaw => "mono-raw",
            Clock::Mono => "mono",
        },
        tsc_hz: map.map(|m| m.hz()),
        threshold_ns: s.threshold_ns,
        period_ns: s.period_ns,
        runtime_ns: s.runtime_ns,
        bucket_ns: s.bucket_ns,
        traced,
        probe: (s.probe != Probe::None).then(|| s.probe.to_string()),
        missing_events,
        lost_events,
        own_cpus,
        cpus,
        stopped,
    })
}

/// Task names by tid, from the scheduler's switches (the last name wins, as after an exec).
fn task_names(events: &[Event], decoder: &Decoder) -> HashMap<u32, String> {
    let mut names = HashMap::new();
    for e in events {
        if let EventKind::SchedSwitch { prev_tid, prev_comm, next_tid, next_comm, .. } = e.kind {
            names.insert(prev_tid, decoder.strings.resolve(prev_comm).to_string());
            names.insert(next_tid, decoder.strings.resolve(next_comm).to_string());
        }
    }
    names
}

/// The threads that ran inside `samples` instead of loop thread `tid`, most time first.
fn interfering_threads(
    contexts: &CpuContexts,
    samples: &[Sample],
    tid: u32,
    names: &HashMap<u32, String>,
) -> Vec<ThreadNoise> {
    let mut by_tid: HashMap<u32, (u64, u64)> = HashMap::new();
    for sample in samples.iter().filter(|x| x.ns.thread > 0) {
        let mut seen = Vec::new();
        for (who, ns) in contexts.threads(sample.start_ns, sample.start_ns + sample.len_ns, tid) {
            let entry = by_tid.entry(who).or_default();
            entry.1 += ns;
            if !seen.contains(&who) {
                seen.push(who);
                entry.0 += 1;
            }
        }
    }
    let mut threads: Vec<ThreadNoise> = by_tid
        .into_iter()
        .map(|(who, (samples, noise_ns))| ThreadNoise {
            tid: who,
            comm: names.get(&who).map_or_else(|| "?".to_string(), Clone::clone),
            samples,
            noise_ns,
        })
        .collect();
    threads.sort_unstable_by_key(|t| (std::cmp::Reverse(t.noise_ns), t.tid));
    threads.truncate(TOP_THREADS);
    threads
}

/// One CPU's contexts. The loop thread is known to run where each of its periods begins: that
/// repairs a switch into it the kernel did not trace (some emit none when a CPU leaves idle),
/// which would otherwise leave its first samples inside the idle task.
fn contexts_of(cpu_events: &[Event], l: &LoopResult) -> CpuContexts {
    let mut contexts = CpuContexts::default();
    let mut starts = l.periods.iter().map(|p| p.0).peekable();
    for e in cpu_events {
        while let Some(start) = starts.next_if(|&start| start <= e.ts) {
            contexts.running(start, l.tid);
        }
        contexts.push(e);
    }
    for start in starts {
        contexts.running(start, l.tid);
    }
    let end = cpu_events.last().map_or(0, |e| e.ts).max(l.periods.last().map_or(0, |p| p.1));
    contexts.finish(end);
    contexts
}

/// The events of one CPU (they are sorted by CPU, then time).
fn slice_of_cpu(events: &[Event], cpu: u32) -> &[Event] {
    let a = events.partition_point(|e| e.cpu < cpu);
    let b = events.partition_point(|e| e.cpu <= cpu);
    &events[a..b]
}

/// TSC ticks per ns over a short busy wait (only for the loop's threshold; samples are mapped
/// with the run-long pairs).
fn calibrate_tsc() -> f64 {
    let a = TscMap::pair();
    let until = a.1 + 20_000_000;
    while measure::mono_raw_ns() < until {}
    TscMap::between(a, TscMap::pair()).hz() / 1e9
}

/// The sample that stopped the run, in ns.
fn stop_sample(map: Option<&TscMap>) -> Option<(u32, u64, u64)> {
    let len = measure::STOPPED_BY[2].load(Ordering::Relaxed);
    if len == 0 {
        return None;
    }
    let cpu = u32::try_from(measure::STOPPED_BY[0].load(Ordering::Relaxed)).unwrap_or(0);
    let start = measure::STOPPED_BY[1].load(Ordering::Relaxed);
    Some(match map {
        Some(m) => (cpu, m.ns(start), m.len_ns(len)),
        None => (cpu, start, len),
    })
}

/// Sample lengths in buckets of `bucket_ns`, and how many were longer.
fn histogram(samples: &[Sample], bucket_ns: u64, entries: usize) -> (Vec<u64>, u64) {
    let mut hist = vec![0u64; entries];
    let mut over = 0;
    for s in samples {
        match hist.get_mut(usize::try_from(s.len_ns / bucket_ns).unwrap_or(usize::MAX)) {
            Some(slot) => *slot += 1,
            None => over += 1,
        }
    }
    (hist, over)
}
