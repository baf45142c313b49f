//! The measurement threads: one per CPU, pinned, optionally SCHED_FIFO, each reading a clock
//! in a tight loop. A step between two reads longer than the threshold is a noise sample: the
//! thread was kept from running for that long. Nothing is allocated or logged inside the
//! loop; samples go into a buffer sized up front.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use virtprof_host::affinity;
use virtprof_model::units::saturating_u64;

/// The clock the loop reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Clock {
    /// The time-stamp counter (cheapest read; converted to ns with a frequency measured
    /// against CLOCK_MONOTONIC_RAW over the run).
    Tsc,
    /// CLOCK_MONOTONIC_RAW through the vDSO.
    MonoRaw,
}

/// Ask every loop to stop at its next read.
pub static STOP: AtomicBool = AtomicBool::new(false);
/// The sample that triggered `--stop-single` / `--stop-total`: CPU, start (raw clock units),
/// length (ns); 0 length: none.
pub static STOPPED_BY: [AtomicU64; 3] = [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)];

/// What one thread does.
#[derive(Debug, Clone, Copy)]
pub struct LoopConfig {
    /// CPU to pin to.
    pub cpu: u32,
    /// Clock.
    pub clock: Clock,
    /// Gap that makes a sample, ns.
    pub threshold_ns: u64,
    /// Start of period 0 (CLOCK_MONOTONIC_RAW ns), the same for every thread.
    pub t0_ns: u64,
    /// Period and the measuring part of it.
    pub period_ns: u64,
    /// Measuring part of each period.
    pub runtime_ns: u64,
    /// Periods to run (u64::MAX: until stopped).
    pub periods: u64,
    /// SCHED_FIFO priority (0: keep the default policy).
    pub fifo: u8,
    /// Stop everything when one sample exceeds this (ns).
    pub stop_single_ns: Option<u64>,
    /// Stop everything when a period's noise exceeds this (ns).
    pub stop_total_ns: Option<u64>,
    /// Sample buffer size.
    pub capacity: usize,
}

/// What one thread saw, in CLOCK_MONOTONIC_RAW ns.
#[derive(Debug, Default)]
pub struct LoopResult {
    /// Its CPU.
    pub cpu: u32,
    /// Its thread id.
    pub tid: u32,
    /// Measuring windows `(start, end, iterations)`, one per period.
    pub periods: Vec<(u64, u64, u64)>,
    /// Samples `(start, length)`.
    pub samples: Vec<(u64, u64)>,
    /// Samples that did not fit the buffer.
    pub dropped: u64,
    /// Smallest step between two reads (the clock's read cost).
    pub min_step_ns: u64,
}

/// CLOCK_MONOTONIC_RAW in ns.
pub fn mono_raw_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid timespec to write; CLOCK_MONOTONIC_RAW always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_RAW, &mut ts) };
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap_or(0)
}

/// The time-stamp counter.
#[cfg(target_arch = "x86_64")]
pub fn tsc() -> u64 {
    // SAFETY: RDTSC has no preconditions on x86_64 (user-mode reads are allowed unless the
    // kernel set CR4.TSD, which Linux does not do for ordinary processes).
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// The time-stamp counter (absent off x86_64: the TSC clock is refused there).
#[cfg(not(target_arch = "x86_64"))]
pub fn tsc() -> u64 {
    0
}

/// A TSC → CLOCK_MONOTONIC_RAW mapping from two pairs read back to back.
#[derive(Debug, Clone, Copy)]
pub struct TscMap {
    tsc0: u64,
    ns0: u64,
    ns_per_tick: f64,
}

impl TscMap {
    /// A `(tsc, ns)` pair read as close together as this thread can: the tightest of a few.
    pub fn pair() -> (u64, u64) {
        (0..16)
            .map(|_| {
                let a = tsc();
                let ns = mono_raw_ns();
                let b = tsc();
                (b - a, a + (b - a) / 2, ns)
            })
            .min()
            .map(|(_, t, ns)| (t, ns))
            .unwrap_or_default()
    }

    /// The line through two pairs.
    pub fn between(first: (u64, u64), last: (u64, u64)) -> TscMap {
        let ticks = last.0.saturating_sub(first.0).max(1) as f64;
        TscMap { tsc0: first.0, ns0: first.1, ns_per_tick: last.1.saturating_sub(first.1) as f64 / ticks }
    }

    /// Ticks → ns since boot.
    pub fn ns(&self, tsc: u64) -> u64 {
        let dt = (tsc as i128 - self.tsc0 as i128) as f64 * self.ns_per_tick;
        saturating_u64(self.ns0 as f64 + dt)
    }

    /// A tick count → ns.
    pub fn len_ns(&self, ticks: u64) -> u64 {
        saturating_u64(ticks as f64 * self.ns_per_tick)
    }

    /// TSC frequency.
    pub fn hz(&self) -> f64 {
        1e9 / self.ns_per_tick
    }
}

/// Run one measurement thread (call on its own thread). `ns_per_tick` converts the clock's
/// units for the threshold (1.0 for CLOCK_MONOTONIC_RAW). Times in the result are in clock
/// units until [`convert`] is applied.
pub fn run(config: LoopConfig, ticks_per_ns: f64) -> anyhow::Result<LoopResult> {
    affinity::set(0, &[config.cpu])
        .map_err(|e| anyhow::anyhow!("pinning the measurement thread to CPU {}: {e}", config.cpu))?;
    if config.fifo > 0 {
        set_fifo(config.fifo)?;
    }
    // One monomorphized loop per clock: the read is inlined, not an indirect call.
    match config.clock {
        Clock::Tsc => measure(config, ticks_per_ns, tsc),
        Clock::MonoRaw => measure(config, ticks_per_ns, mono_raw_ns),
    }
}

fn measure(config: LoopConfig, ticks_per_ns: f64, read: impl Fn() -> u64) -> anyhow::Result<LoopResult> {
    let to_ticks = |ns: u64| saturating_u64(ns as f64 * ticks_per_ns);
    let threshold = to_ticks(config.threshold_ns);
    let stop_single = config.stop_single_ns.map(to_ticks);
    let stop_total = config.stop_total_ns.map(to_ticks);
    let mut r = LoopResult {
        cpu: config.cpu,
        // SAFETY: gettid has no preconditions.
        tid: u32::try_from(unsafe { libc::gettid() }).unwrap_or(0),
        samples: Vec::with_capacity(config.capacity),
        min_step_ns: u64::MAX,
        ..Default::default()
    };
    let mut period = 0;
    while period < config.periods && !STOP.load(Ordering::Relaxed) {
        let start_ns = config.t0_ns + period * config.period_ns;
        sleep_until_raw(start_ns);
        let end_ns = start_ns + config.runtime_ns;
        // The loop's deadline in clock units, from a pair read now.
        let (now_ns, now) = (mono_raw_ns(), read());
        let deadline = now + to_ticks(end_ns.saturating_sub(now_ns));
        let first = read();
        let (mut prev, mut total, mut iterations) = (first, 0u64, 0u64);
        loop {
            let t = read();
            let step = t.wrapping_sub(prev);
            iterations += 1;
            if step > threshold {
                if r.samples.len() < config.capacity {
                    r.samples.push((prev, step));
                } else {
                    r.dropped += 1;
                }
                total += step;
                let too_long = stop_single.is_some_and(|s| step > s) || stop_total.is_some_and(|s| total > s);
                if too_long {
                    STOPPED_BY[0].store(u64::from(config.cpu), Ordering::Relaxed);
                    STOPPED_BY[1].store(prev, Ordering::Relaxed);
                    STOPPED_BY[2].store(step, Ordering::Relaxed);
                    STOP.store(true, Ordering::Relaxed);
                }
            } else if step > 0 && step < r.min_step_ns {
                r.min_step_ns = step;
            }
            prev = t;
            if t >= deadline || (iterations & 0xfff == 0 && STOP.load(Ordering::Relaxed)) {
                break;
            }
        }
        r.periods.push((first, prev, iterations));
        period += 1;
    }
    Ok(r)
}

/// Sleep until CLOCK_MONOTONIC_RAW reads `ns` (clock_nanosleep does not take that clock).
fn sleep_until_raw(ns: u64) {
    let now = mono_raw_ns();
    if ns > now {
        std::thread::sleep(std::time::Duration::from_nanos(ns - now));
    }
}

fn set_fifo(priority: u8) -> anyhow::Result<()> {
    let param = libc::sched_param { sched_priority: i32::from(priority) };
    // SAFETY: `param` is a valid sched_param; pid 0 is the calling thread.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) } != 0 {
        anyhow::bail!(
            "SCHED_FIFO priority {priority} for the measurement thread: {} (run as root, or drop --fifo)",
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

/// Put a result's times in CLOCK_MONOTONIC_RAW ns (a no-op for that clock).
pub fn convert(r: &mut LoopResult, map: Option<&TscMap>) {
    let Some(map) = map else { return };
    for s in &mut r.samples {
        *s = (map.ns(s.0), map.len_ns(s.1));
    }
    for p in &mut r.periods {
        *p = (map.ns(p.0), map.ns(p.1), p.2);
    }
    if r.min_step_ns != u64::MAX {
        r.min_step_ns = map.len_ns(r.min_step_ns);
    }
}
