//! `virtprof noise --testvm`: the guest-side loop runs in a micro-VM (the `noise` workload)
//! while the host is traced; the guest's TSC is mapped onto the host clock through the sync
//! exits around the loop, and every guest sample is explained by what the host did meanwhile.
//! `--host-recording FILE --guest REPORT` does the same afterwards, from a `virtprof record`
//! of the host and the JSON report of the testvm run it recorded.

use std::path::Path;

use serde::Serialize;
use virtprof_analysis::noise::{guest_columns, GuestColumns, GuestSample, HostView};
use virtprof_analysis::Names;
use virtprof_kvm::guest::{Bound, Script, Workload, SYNC_ROUNDS};
use virtprof_kvm::launcher::{self, TestvmConfig};
use virtprof_model::event::{Event, EventKind};
use virtprof_model::testvm::{GuestNoise, SyncPoint, TestvmReport, VcpuReport};
use virtprof_model::units::saturating_u64;

use virtprof_trace::decode::Decoder;

use super::explain::Explanation;
use super::trace::{missing, NoiseTrace, EVENTS, HOST_EVENTS};
use super::Settings;
use crate::exit::usage;
use virtprof_session::Session;

/// Guest TSC → host CLOCK_MONOTONIC, with its error bound.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct ClockMap {
    /// Host ns at guest TSC 0 (the offset), as a float to keep sub-ns precision of the slope.
    pub offset_ns: f64,
    /// Host ns per guest TSC tick.
    pub ns_per_tick: f64,
    /// Every mapped time is within this of the truth (half the widest of the two brackets used).
    pub bound_ns: u64,
}

impl ClockMap {
    /// The line through the tightest sync point before the loop and the tightest after it.
    fn from_sync(sync: &[SyncPoint]) -> anyhow::Result<ClockMap> {
        let rounds = usize::try_from(SYNC_ROUNDS).unwrap_or(8);
        if sync.len() < 2 * rounds {
            anyhow::bail!("the guest made {} clock-sync exits; {} expected", sync.len(), 2 * rounds);
        }
        let tightest =
            |points: &[SyncPoint]| *points.iter().min_by_key(|p| p.after_ns - p.before_ns).expect("not empty");
        let (a, b) = (tightest(&sync[..rounds]), tightest(&sync[sync.len() - rounds..]));
        let mid = |p: SyncPoint| (p.before_ns as f64 + p.after_ns as f64) / 2.0;
        let ns_per_tick = (mid(b) - mid(a)) / (b.tsc - a.tsc).max(1) as f64;
        let bound_ns = (a.after_ns - a.before_ns).max(b.after_ns - b.before_ns).div_ceil(2);
        Ok(ClockMap { offset_ns: mid(a) - a.tsc as f64 * ns_per_tick, ns_per_tick, bound_ns })
    }

    fn ns(&self, tsc: u64) -> u64 {
        saturating_u64(self.offset_ns + tsc as f64 * self.ns_per_tick)
    }

    fn len(&self, ticks: u64) -> u64 {
        saturating_u64(ticks as f64 * self.ns_per_tick)
    }
}

/// What `noise --testvm` reports.
#[derive(Debug, Serialize)]
pub struct GuestReport {
    pub kind: &'static str,
    pub cpu: u32,
    pub vcpu_tid: u32,
    pub duration_ns: u64,
    pub threshold_ns: u64,
    /// The kick rate asked for (null when explaining a recording: the report does not say).
    pub inject_hz: Option<u32>,
    /// Heavyweight exits the VMM's kicks caused inside the loop (`INTR` returns between the
    /// sync exits; kicks before or after the loop are not noise the guest can see).
    pub injected: u64,
    pub clock: ClockMap,
    /// The seed's guest-side columns.
    pub guest: GuestColumns,
    /// Samples the guest detected but had no room to keep.
    pub dropped_samples: u64,
    /// The vCPU thread's schedstat wait over the loop (compare with `guest.steal_ns`).
    pub schedstat_wait_ns: u64,
    /// The host's account of the samples.
    #[serde(flatten)]
    pub host: Explanation,
    pub lost_events: u64,
    pub missing_events: Vec<String>,
}

/// The host's side of a guest run: its events in time order, and what the trace lacked.
struct HostTrace {
    events: Vec<Event>,
    lost_events: u64,
    missing_events: Vec<String>,
    decoder: Decoder,
}

/// Run the noise guest on `cpu` (its vCPU kicked `inject_hz` times a second) while tracing
/// the host, and explain its samples.
pub fn run(s: &Settings, cpu: u32, inject_hz: u32) -> anyhow::Result<GuestReport> {
    virtprof_host::stop::install_handler();
    let allowed = virtprof_host::affinity::allowed_cpus();
    // Drain the trace from another CPU, or this thread is noise in the guest it measures.
    virtprof_host::affinity::keep_off(&[cpu]);
    let events: Vec<&str> = EVENTS.iter().chain(HOST_EVENTS.iter()).copied().collect();
    let mut trace = NoiseTrace::start(&allowed, "mono", &events)?;
    let config = TestvmConfig {
        script: Script::single(Workload::Noise, Bound::Duration { ns: s.duration_ns }),
        vms: 1,
        vcpus: 1,
        pin: vec![cpu],
        io_latency_ns: 0,
        steal_time: true,
        linger_ns: 0,
        name: Some("noise".into()),
        sample_hz: inject_hz,
        noise_threshold_ns: s.threshold_ns,
        io_thread: None,
        reclaim_hz: 0,
    };
    let exe = std::env::current_exe()?;
    let vm = std::thread::spawn(move || launcher::run_testvm(&exe, &config));
    while !vm.is_finished() {
        std::thread::sleep(std::time::Duration::from_millis(100));
        trace.drain()?;
    }
    let report = vm.join().map_err(|_| anyhow::anyhow!("the test VM thread panicked"))??;
    let missing_events = trace.missing().to_vec();
    let (mut events, lost_events, decoder) = trace.finish()?;
    events.sort_by_key(|e| e.ts);
    let host = HostTrace { events, lost_events, missing_events, decoder };
    let out = explain(&report, host, Some(inject_hz))?;
    Ok(out)
}

/// `--host-recording FILE --guest REPORT`: a testvm `noise` run recorded by `virtprof record`
/// (on the default `mono` clock), explained afterwards.
pub fn run_recorded(recording: &Path, guest: &Path) -> anyhow::Result<GuestReport> {
    let text = virtprof_host::input::read_text(guest, "--guest", 1 << 30)?;
    let report: TestvmReport = serde_json::from_str(&text).map_err(|e| {
        usage(format!(
            "--guest '{}': not a `virtprof testvm --json` report ({e}); save one with `virtprof testvm -w noise --pin CPU --json > FILE`",
            guest.display()
        ))
    })?;
    let vcpu = first_vcpu(&report).map_err(|e| usage(format!("--guest '{}': {e}", guest.display())))?;
    let cpu = vcpu.pinned_cpu.ok_or_else(|| {
        usage(format!("--guest '{}': the vCPU was not pinned; run testvm with --pin CPU", guest.display()))
    })?;
    let recording = Session::open_warning(recording, &Default::default())?;
    if recording.metadata.trace_clock != "mono" {
        return Err(usage(format!(
            "--host-recording: traced on the '{}' clock; the guest's sync points are CLOCK_MONOTONIC (record with --clock mono, the default)",
            recording.metadata.trace_clock
        )));
    }
    let mut decoder = recording.decoder(&["kvm", "sched", "irq", "irq_vectors", "nmi"])?;
    check_same_run(&recording, &decoder, &report, guest)?;
    let missing_events = missing(&decoder, &[EVENTS.as_slice(), HOST_EVENTS.as_slice()].concat());
    // Only the vCPU's CPU and the vCPU thread matter: the rest of a long recording is skipped.
    let tid = vcpu.tid;
    let mut events = Vec::new();
    let mut keep = |e: &Event, _: &dyn Names| {
        let involves_vcpu = match e.kind {
            EventKind::SchedSwitch { prev_tid, next_tid, .. } => prev_tid == tid || next_tid == tid,
            _ => e.tid == tid,
        };
        if e.cpu == cpu || involves_vcpu {
            events.push(*e);
        }
    };
    let stats = recording.analyse(&mut decoder, &mut [&mut keep])?;
    let lost_events = recording.loss(&stats).total();
    let holdings = recording.holdings(&decoder);
    let host = HostTrace { events, lost_events, missing_events, decoder };
    let mut explained = explain(&report, host, None)?;
    explained.host = explained.host.known_by(&holdings);
    Ok(explained)
}

/// The guest's run (its clock-sync exits, on the host's CLOCK_MONOTONIC) must lie in the
/// recording: a report from another run would be explained by no host event at all.
fn check_same_run(recording: &Session, decoder: &Decoder, report: &TestvmReport, guest: &Path) -> anyhow::Result<()> {
    let sync = first_vcpu(report)?.noise.as_ref().map_or(&[][..], |n| n.sync.as_slice());
    let (Some(first), Some(last), Some((start, end))) = (sync.first(), sync.last(), recording.time_range(decoder))
    else {
        return Ok(());
    };
    let (run_from, run_to) = (first.before_ns, last.after_ns.max(first.before_ns));
    let covered = end.min(run_to).saturating_sub(start.max(run_from));
    let s = |ns: u64| ns as f64 / 1e9;
    if covered == 0 {
        return Err(usage(format!(
            "--guest '{}': the guest ran at {:.3}-{:.3} s of CLOCK_MONOTONIC, the recording spans {:.3}-{:.3} s: they are from different runs (record the run the report comes from)",
            guest.display(),
            s(run_from),
            s(run_to),
            s(start),
            s(end)
        )));
    }
    let run = run_to - run_from;
    if covered < run - run / 100 {
        eprintln!(
            "virtprof: warning: the recording covers {:.1} % of the guest's run ({:.3}-{:.3} s of CLOCK_MONOTONIC, recorded {:.3}-{:.3} s): samples outside it have no host events to explain them",
            covered as f64 * 100.0 / run.max(1) as f64,
            s(run_from),
            s(run_to),
            s(start),
            s(end)
        );
    }
    Ok(())
}

fn first_vcpu(report: &TestvmReport) -> anyhow::Result<&VcpuReport> {
    report.vms.first().and_then(|v| v.vcpus.first()).ok_or_else(|| anyhow::anyhow!("the test VM reported no vCPU"))
}

/// Explain every guest sample of `report`'s first vCPU by `host`'s events.
fn explain(report: &TestvmReport, host_trace: HostTrace, inject_hz: Option<u32>) -> anyhow::Result<GuestReport> {
    let decoder = &host_trace.decoder;
    let vcpu = first_vcpu(report)?;
    let cpu = vcpu.pinned_cpu.ok_or_else(|| anyhow::anyhow!("the vCPU was not pinned"))?;
    let noise: &GuestNoise =
        vcpu.noise.as_ref().ok_or_else(|| anyhow::anyhow!("the test VM recorded no noise samples"))?;
    let clock = ClockMap::from_sync(&noise.sync)?;

    let guest_samples: Vec<GuestSample> = noise
        .samples
        .iter()
        .map(|r| GuestSample {
            len_ns: clock.len(r.len_tsc),
            steal_ns: r.steal_ns,
            hw_exits: u64::from(r.hw_exits),
            lw_exits: u64::from(r.lw_exits),
        })
        .collect();
    let host = HostView::new(&host_trace.events, vcpu.tid, cpu);
    let mut explanation = Explanation::new();
    for r in &noise.samples {
        let (start, len) = (clock.ns(r.start_tsc), clock.len(r.len_tsc));
        explanation.add(len, &host.attribute(start, len, clock.bound_ns), decoder);
    }
    Ok(GuestReport {
        kind: "noise-testvm",
        cpu,
        vcpu_tid: vcpu.tid,
        duration_ns: vcpu.wall_ns,
        threshold_ns: saturating_u64((noise.threshold_ticks as f64 * 1e6 / noise.tsc_khz.max(1) as f64).round()),
        inject_hz,
        injected: noise.loop_kicks,
        clock,
        guest: guest_columns(&guest_samples),
        dropped_samples: noise.detected - noise.samples.len() as u64,
        schedstat_wait_ns: noise.loop_wait_ns,
        host: explanation,
        lost_events: host_trace.lost_events,
        missing_events: host_trace.missing_events,
    })
}
