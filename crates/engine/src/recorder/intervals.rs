//! The interval thread of `record --interval D`: wakes at every interval boundary of the
//! monotonic clock (the trace clock of a recording), samples every source into the ring slot
//! of that interval number, and drains the ring to the writer in batches. Intervals it woke
//! too late for are counted as missed and their counts land in the next row, whose start and
//! end say so.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::SyncSender;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use virtprof_host::affinity::prefer_realtime;
use virtprof_host::{monotonic_ns, sleep_until_or_stop};
use virtprof_interval::counters::{default_specs, CounterSpec};
use virtprof_interval::ring::IntervalRing;
use virtprof_interval::sampler::{IntervalSampler, SamplerConfig};
use virtprof_kvm::discover::Discovery;
use virtprof_kvm::uevents::KvmUevents;
use virtprof_store::recording::{IntervalEncoder, IntervalSchema, IntervalStats};

use super::vm_scans::ScanSchedule;
use super::WriterMsg;

/// Ring slots: at 1 ms intervals, a second of rows before the writer must have drained.
const RING_SLOTS: usize = 1024;
/// Drain the ring at least this often.
const DRAIN_EVERY: Duration = Duration::from_millis(100);
/// The running interval thread.
pub struct IntervalThread {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<anyhow::Result<IntervalStats>>,
}

impl IntervalThread {
    /// Start sampling every `interval_ns` into `tx`.
    /// `counters`: per vCPU thread (and, as `counters::per_cpu_specs` makes them, per CPU);
    /// the built-in set when None.
    pub fn start(
        interval_ns: u64,
        counters: Option<Vec<CounterSpec>>,
        hw_counters: usize,
        tracefs: &std::path::Path,
        tx: SyncSender<WriterMsg>,
    ) -> anyhow::Result<Self> {
        let config = SamplerConfig { counters: counters.unwrap_or_else(|| default_specs(tracefs)), hw_counters };
        let mut sampler = IntervalSampler::new(config)?;
        let mut discovery = Discovery::new("/proc", Vec::new());
        sampler.add_vms(&discovery.scan());
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let handle = std::thread::Builder::new().name("virtprof-interval".into()).spawn(move || {
            prefer_realtime();
            run(interval_ns, sampler, discovery, &flag, &tx)
        })?;
        Ok(IntervalThread { stop, handle })
    }

    /// Take the last (partial) interval, drain, and return the figures.
    pub fn finish(self) -> anyhow::Result<IntervalStats> {
        self.stop.store(true, Ordering::Release);
        self.handle.join().map_err(|_| anyhow::anyhow!("interval thread panicked"))?
    }
}

fn run(
    interval_ns: u64,
    mut sampler: IntervalSampler,
    mut discovery: Discovery,
    stop: &AtomicBool,
    tx: &SyncSender<WriterMsg>,
) -> anyhow::Result<IntervalStats> {
    let mut ring = IntervalRing::new(RING_SLOTS, sampler.series().len());
    let mut encoder = IntervalEncoder::default();
    let mut row = vec![0.0; sampler.series().len()];
    let send_schema = |sampler: &IntervalSampler| {
        let schema = IntervalSchema {
            interval_ns,
            series: sampler.series().to_vec(),
            unavailable: sampler.unavailable().to_vec(),
        };
        tx.send(WriterMsg::Schema(schema)).map_err(|_| anyhow::anyhow!("writer stopped"))
    };
    send_schema(&sampler)?;
    // The baseline: every column's first delta is measured from here.
    let t0 = monotonic_ns();
    sampler.sample(&mut row);
    let (mut next, mut last_end, mut rows) = (0u64, t0, 0u64);
    let (mut last_drain, mut last_scan_ns) = (Instant::now(), t0);
    let mut scans = ScanSchedule::new(last_pid());
    // KVM announces each VM it creates: heard, a scan comes at the next wake-up whatever the
    // back-off. Where the announcements do not reach us, the schedule alone decides.
    let mut announcements = KvmUevents::open().ok();
    let drain = |ring: &mut IntervalRing, upto: u64, encoder: &mut IntervalEncoder| -> anyhow::Result<u64> {
        encoder.begin(ring.width());
        ring.drain(upto, |index, start, end, values| encoder.row(index, start, end, values));
        let n = encoder.rows() as u64;
        if n > 0 {
            let batch = std::mem::take(encoder);
            tx.send(WriterMsg::Rows(batch)).map_err(|_| anyhow::anyhow!("writer stopped"))?;
        }
        Ok(n)
    };
    loop {
        let stopping = stop.load(Ordering::Acquire);
        if !stopping {
            // Hardware counter groups take turns: one sub-interval each, every interval.
            let subs = sampler.sub_intervals() as u64;
            for s in 1..=subs {
                // A stop (the end of the recording) cuts the interval short, so `record`
                // ends within a few ms whatever --interval is; the last row is partial.
                if sleep_until_or_stop(t0 + next * interval_ns + s * interval_ns / subs, stop) {
                    break;
                }
                sampler.rotate();
            }
        }
        let now = monotonic_ns();
        // The interval this wake-up ends; later than `next` when we overslept.
        let stopping = stopping || stop.load(Ordering::Acquire);
        let index = if stopping { next } else { ((now - t0) / interval_ns).saturating_sub(1).max(next) };
        sampler.sample(&mut row);
        ring.produce(index, last_end, now).copy_from_slice(&row);
        last_end = now;
        next = index + 1;
        if stopping {
            rows += drain(&mut ring, index, &mut encoder)?;
            break;
        }
        if last_drain.elapsed() >= DRAIN_EVERY {
            rows += drain(&mut ring, index, &mut encoder)?;
            last_drain = Instant::now();
        }
        // Timed from the wake-ups, which keep to the interval grid whatever a scan took.
        let announced = announcements.as_mut().is_some_and(|a| !a.drain().is_empty());
        if announced || scans.due(Duration::from_nanos(now.saturating_sub(last_scan_ns)), last_pid) {
            last_scan_ns = now;
            let pid = last_pid();
            let found = discovery.scan();
            let new_vm = sampler.add_vms(&found);
            scans.scanned(pid, &found, new_vm);
            if new_vm {
                rows += drain(&mut ring, index, &mut encoder)?;
                ring.set_width(sampler.series().len());
                row.resize(sampler.series().len(), 0.0);
                send_schema(&sampler)?;
            }
        }
    }
    Ok(IntervalStats { interval_ns, rows, missed: ring.missed(), overwritten: ring.overwritten() })
}

/// The pid the kernel handed out last (the fifth field of /proc/loadavg), which changes
/// whenever a process or thread begins; None where it cannot be read (then scans keep to
/// their back-off).
fn last_pid() -> Option<u32> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    text.split_ascii_whitespace().nth(4)?.parse().ok()
}
