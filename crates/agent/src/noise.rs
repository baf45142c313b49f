//! `agent --noise CPUS`: the OS-noise loop (`host::osnoise`, the one `virtprof noise` runs on
//! a host) on chosen guest CPUs. It reads CLOCK_MONOTONIC, the clock of the agent's rows and
//! clock exchanges, so each sample lands on the host's timeline with the same alignment and
//! the host can explain it by its own trace (`noise --host-recording`). Each period is handed
//! to the serving loop as a [`NoiseBatch`].

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;

use virtprof_host::osnoise::{run_periods, Clock, LoopConfig, Probe};
use virtprof_model::guest::NoiseBatch;

/// Periods buffered between the loops and the serving loop (a host that reads slowly, or
/// none: older periods are counted as dropped in the next one sent).
const QUEUED_PERIODS: usize = 64;

/// What the loops measure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoiseConfig {
    /// Guest CPUs, one loop each.
    pub cpus: Vec<u32>,
    /// A step between two reads longer than this is a sample.
    pub threshold_ns: u64,
    /// Period length.
    pub period_ns: u64,
    /// Measuring part of each period (the rest is left to the guest).
    pub runtime_ns: u64,
    /// Run between every two reads (each step one VM exit).
    pub probe: Probe,
}

/// The running loops.
pub struct NoiseLoops {
    periods: Receiver<NoiseBatch>,
    stop: Arc<AtomicBool>,
    /// Start of the current host's time (CLOCK_MONOTONIC ns): periods dropped before it were
    /// no host's to lose, and are not counted as dropped in what it is sent.
    since: Arc<AtomicU64>,
    threads: Vec<JoinHandle<std::io::Result<()>>>,
}

impl NoiseLoops {
    /// Start one pinned loop per CPU (CPUs this process may not run on are refused), then move
    /// the calling thread off them where it can: the agent's own work must not be the noise
    /// it measures.
    pub fn start(config: &NoiseConfig) -> std::io::Result<NoiseLoops> {
        if let Some(cpu) = config.cpus.iter().find(|&&c| !virtprof_host::affinity::can_pin(c)) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("CPU {cpu}: this process cannot pin a thread there (not online, or outside its cpuset)"),
            ));
        }
        let (tx, periods) = sync_channel(QUEUED_PERIODS);
        let stop = Arc::new(AtomicBool::new(false));
        let since = Arc::new(AtomicU64::new(0));
        // Periods start on a whole period boundary, the same for every loop.
        let t0 = (Clock::Mono.base_ns() / config.period_ns + 1) * config.period_ns;
        let mut threads = Vec::new();
        for &cpu in &config.cpus {
            let loop_config = LoopConfig {
                cpu,
                clock: Clock::Mono,
                threshold_ns: config.threshold_ns,
                t0_ns: t0,
                period_ns: config.period_ns,
                runtime_ns: config.runtime_ns,
                periods: u64::MAX,
                fifo: 0,
                stop_single_ns: None,
                stop_total_ns: None,
                capacity: NoiseBatch::MAX_SAMPLES,
                probe: config.probe,
            };
            let (tx, stop, since) = (tx.clone(), Arc::clone(&stop), Arc::clone(&since));
            let threshold_ns = config.threshold_ns;
            threads.push(
                std::thread::Builder::new()
                    .name(format!("noise/{cpu}"))
                    .spawn(move || measure(loop_config, threshold_ns, &tx, &stop, &since))?,
            );
        }
        virtprof_host::affinity::keep_off(&config.cpus);
        Ok(NoiseLoops { periods, stop, since, threads })
    }

    /// Forget what was measured until now: a new host starts here, or none is there to send
    /// it to. Periods that found the queue full before this are not counted as dropped later.
    pub fn restart(&self) {
        self.since.store(Clock::Mono.base_ns(), Ordering::Relaxed);
        drop(self.take());
    }

    /// The periods finished since the last call.
    pub fn take(&self) -> Vec<NoiseBatch> {
        self.periods.try_iter().collect()
    }

    /// Stop the loops; the first error one of them met, if any.
    pub fn stop(self) -> std::io::Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        let mut first = Ok(());
        for t in self.threads {
            let result = t.join().unwrap_or_else(|_| Err(std::io::Error::other("a noise loop panicked")));
            if first.is_ok() {
                first = result;
            }
        }
        first
    }
}

fn measure(
    config: LoopConfig,
    threshold_ns: u64,
    tx: &SyncSender<NoiseBatch>,
    stop: &AtomicBool,
    since: &AtomicU64,
) -> std::io::Result<()> {
    // Samples of periods that found the queue full, carried into the next one sent, and when
    // the last of those periods ended.
    let (mut carried, mut carried_end) = (0, 0);
    run_periods(config, 1.0, stop, &mut |p| {
        if carried_end < since.load(Ordering::Relaxed) {
            carried = 0;
        }
        let batch = NoiseBatch {
            cpu: config.cpu,
            start_ns: p.start,
            end_ns: p.end,
            threshold_ns,
            iterations: p.iterations,
            samples: p.samples.to_vec(),
            dropped: p.dropped + carried,
        };
        let lost = batch.samples.len() as u64 + batch.dropped;
        match tx.try_send(batch) {
            Ok(()) => carried = 0,
            Err(TrySendError::Full(_)) => (carried, carried_end) = (lost, p.end),
            Err(TrySendError::Disconnected(_)) => stop.store(true, Ordering::Relaxed),
        }
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plain loop (no probe, 1 us threshold) on `cpu`.
    fn plain(cpu: u32, period_ns: u64, runtime_ns: u64) -> NoiseConfig {
        NoiseConfig { cpus: vec![cpu], threshold_ns: 1_000, period_ns, runtime_ns, probe: Probe::None }
    }

    #[test]
    fn loops_hand_on_periods_with_samples_inside_their_windows() {
        let cpu = virtprof_host::affinity::allowed_cpus()[0];
        let config = plain(cpu, 50_000_000, 20_000_000);
        let loops = NoiseLoops::start(&config).unwrap();
        let mut got = Vec::new();
        while got.len() < 3 {
            std::thread::sleep(std::time::Duration::from_millis(20));
            got.extend(loops.take());
        }
        loops.stop().unwrap();
        for b in &got {
            assert_eq!((b.cpu, b.threshold_ns), (cpu, 1_000));
            // Each period starts on the grid, within its measuring part (a loaded host wakes
            // the loop late and shortens the window), and lasts about the runtime at most.
            let window = b.end_ns - b.start_ns;
            assert!(b.start_ns % config.period_ns < config.runtime_ns, "{b:?}");
            assert!((1..=config.runtime_ns + 20_000_000).contains(&window), "{window}");
            assert!(b.iterations > 0);
            assert!(b.samples.iter().all(|&(s, len)| s >= b.start_ns && s + len <= b.end_ns && len > 1_000), "{b:?}");
        }
        // Consecutive periods of one CPU start a period apart.
        assert!(got.windows(2).all(|w| w[1].start_ns - w[0].start_ns >= 40_000_000), "{got:?}");
    }

    #[test]
    fn periods_dropped_before_a_restart_are_not_counted_after_it() {
        let cpu = virtprof_host::affinity::allowed_cpus()[0];
        let config = plain(cpu, 2_000_000, 1_000_000);
        let loops = NoiseLoops::start(&config).unwrap();
        // Nobody takes: the queue fills and later periods are dropped.
        std::thread::sleep(std::time::Duration::from_millis(3 * QUEUED_PERIODS as u64 * 2));
        loops.restart();
        let mut got = Vec::new();
        while got.len() < 5 {
            std::thread::sleep(std::time::Duration::from_millis(10));
            got.extend(loops.take());
        }
        loops.stop().unwrap();
        assert!(got.iter().all(|b| b.dropped == 0), "{got:?}");
    }

    #[test]
    fn a_cpu_not_allowed_is_refused() {
        let config = plain(100_000, 1_000_000, 1);
        let e = NoiseLoops::start(&config).err().unwrap();
        assert!(e.to_string().contains("CPU 100000"), "{e}");
    }
}
