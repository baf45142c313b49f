//! The OS-noise measurement loop that `virtprof noise` runs on the host and `virtprof agent
//! --noise` runs in a guest: one thread per CPU, pinned, optionally SCHED_FIFO, each reading a
//! clock in a tight loop. A step between two reads longer than the threshold is a noise
//! sample: the thread was kept from running for that long. Nothing is allocated or logged
//! inside the loop; samples go into a buffer sized up front, handed on after each period.
//!
//! In a VM the loop can also run a [`Probe`] between its reads, an instruction that always
//! exits to the hypervisor (seed 004's CPUID and I/O-port loops): every step is then one exit,
//! timed from inside the guest.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use virtprof_model::units::saturating_u64;

use crate::affinity;

/// The clock the loop reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Clock {
    /// The time-stamp counter (cheapest read; converted to ns with a frequency measured
    /// against CLOCK_MONOTONIC_RAW over the run).
    Tsc,
    /// CLOCK_MONOTONIC_RAW through the vDSO.
    MonoRaw,
    /// CLOCK_MONOTONIC through the vDSO: the clock a guest agent's rows and clock exchanges
    /// use, so its samples map onto the host with the same alignment.
    Mono,
}

impl Clock {
    /// The clock periods are scheduled on and results are given in: CLOCK_MONOTONIC for
    /// [`Clock::Mono`], CLOCK_MONOTONIC_RAW otherwise (TSC ticks are mapped onto it).
    pub fn base_ns(self) -> u64 {
        match self {
            Clock::Mono => crate::monotonic_ns(),
            Clock::Tsc | Clock::MonoRaw => mono_raw_ns(),
        }
    }
}

/// An instruction run between every two clock reads, so that each step is one VM exit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Probe {
    /// Nothing: the plain noise loop.
    #[default]
    None,
    /// CPUID leaf 0: intercepted by every x86 hypervisor and handled in its kernel (a
    /// lightweight exit under KVM).
    Cpuid,
    /// A one-byte IN from this port, made by the kernel through `/dev/port`: emulated by the
    /// VMM in user space (a heavyweight exit under KVM, for ports no in-kernel device claims).
    /// Needs root.
    Inb(u16),
}

impl std::fmt::Display for Probe {
    /// As the command line takes it: `none`, `cpuid`, `inb:0x3fd`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Probe::None => write!(f, "none"),
            Probe::Cpuid => write!(f, "cpuid"),
            Probe::Inb(port) => write!(f, "inb:{port:#x}"),
        }
    }
}

#[cfg(target_arch = "x86_64")]
fn cpuid() {
    // The result is not wanted, only the exit; black_box keeps the instruction.
    std::hint::black_box(core::arch::x86_64::__cpuid(0));
}

/// `/dev/port` opened for an IN probe. The kernel makes the IN at CPL0 for a one-byte pread:
/// that needs no per-thread I/O bitmap (`ioperm`), which kernels without
/// CONFIG_X86_IOPL_IOPERM lack and one emulated nested bed here gets wrong (a user-mode IN
/// faults there); the price is a system call in every step.
fn open_port(port: u16) -> std::io::Result<std::fs::File> {
    std::fs::File::open("/dev/port").map_err(|e| {
        std::io::Error::new(
            e.kind(),
            format!(
                "/dev/port for the inb:{port:#x} probe: {e} (needs root or CAP_SYS_RAWIO, and an x86 kernel with CONFIG_DEVPORT)"
            ),
        )
    })
}

/// Ask every loop of `virtprof noise` to stop at its next read.
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
    /// Start of period 0 ([`Clock::base_ns`]), the same for every thread.
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
    /// Sample buffer size (per period when streaming, per run otherwise).
    pub capacity: usize,
    /// Run between every two reads.
    pub probe: Probe,
}

/// One period as the loop hands it on (times in clock units until converted).
#[derive(Debug)]
pub struct Period<'a> {
    /// First read of the measuring window.
    pub start: u64,
    /// Last read.
    pub end: u64,
    /// Reads made.
    pub iterations: u64,
    /// Samples `(start, length)`.
    pub samples: &'a [(u64, u64)],
    /// Samples that did not fit the buffer.
    pub dropped: u64,
}

/// What one thread saw, in [`Clock::base_ns`] ns once converted.
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

/// Run one measurement thread to the end (call on its own thread), keeping every sample up to
/// `config.capacity`. `ticks_per_ns` converts the clock's units for the threshold (1.0 for the
/// clock_gettime clocks). Times in the result are in clock units until [`convert`] is applied.
pub fn run(config: LoopConfig, ticks_per_ns: f64) -> std::io::Result<LoopResult> {
    let mut r = LoopResult {
        cpu: config.cpu,
        samples: Vec::with_capacity(config.capacity),
        min_step_ns: u64::MAX,
        ..Default::default()
    };
    let (tid, min_step) = run_periods(config, ticks_per_ns, &STOP, &mut |p| {
        r.periods.push((p.start, p.end, p.iterations));
        let room = config.capacity - r.samples.len();
        r.samples.extend_from_slice(&p.samples[..p.samples.len().min(room)]);
        r.dropped += p.dropped + p.samples.len().saturating_sub(room) as u64;
    })?;
    (r.tid, r.min_step_ns) = (tid, min_step);
    Ok(r)
}

/// Run one measurement thread until its periods are done or `stop` is set, handing each
/// period to `on_period` between windows (never inside one). Returns the thread id and the
/// smallest step seen (clock units; `u64::MAX` if none).
pub fn run_periods(
    config: LoopConfig,
    ticks_per_ns: f64,
    stop: &AtomicBool,
    on_period: &mut dyn FnMut(Period),
) -> std::io::Result<(u32, u64)> {
    affinity::set(0, &[config.cpu]).map_err(|e| {
        std::io::Error::new(e.kind(), format!("pinning the measurement thread to CPU {}: {e}", config.cpu))
    })?;
    if config.fifo > 0 {
        set_fifo(config.fifo)?;
    }
    let result = match config.probe {
        Probe::None => on_clock(config, ticks_per_ns, stop, on_period, || {}),
        #[cfg(target_arch = "x86_64")]
        Probe::Cpuid => on_clock(config, ticks_per_ns, stop, on_period, cpuid),
        Probe::Inb(port) => {
            use std::os::unix::fs::FileExt;
            let dev = open_port(port)?;
            on_clock(config, ticks_per_ns, stop, on_period, move || {
                // A failed read is still an exit taken (or none): the step says which.
                let _ = dev.read_at(&mut [0u8], u64::from(port));
            })
        }
        #[cfg(not(target_arch = "x86_64"))]
        Probe::Cpuid => {
            return Err(std::io::Error::new(std::io::ErrorKind::Unsupported, "the CPUID probe is x86 only"))
        }
    };
    // SAFETY: gettid has no preconditions.
    let tid = u32::try_from(unsafe { libc::gettid() }).unwrap_or(0);
    Ok((tid, result))
}

/// One monomorphized loop per clock and probe: the read and the probe are inlined, not
/// indirect calls.
fn on_clock(
    config: LoopConfig,
    ticks_per_ns: f64,
    stop: &AtomicBool,
    on_period: &mut dyn FnMut(Period),
    probe: impl Fn(),
) -> u64 {
    match config.clock {
        Clock::Tsc => measure(config, ticks_per_ns, stop, on_period, tsc, probe),
        Clock::MonoRaw => measure(config, ticks_per_ns, stop, on_period, mono_raw_ns, probe),
        Clock::Mono => measure(config, ticks_per_ns, stop, on_period, crate::monotonic_ns, probe),
    }
}

fn measure(
    config: LoopConfig,
    ticks_per_ns: f64,
    stop: &AtomicBool,
    on_period: &mut dyn FnMut(Period),
    read: impl Fn() -> u64,
    probe: impl Fn(),
) -> u64 {
    let to_ticks = |ns: u64| saturating_u64(ns as f64 * ticks_per_ns);
    let threshold = to_ticks(config.threshold_ns);
    let stop_single = config.stop_single_ns.map(to_ticks);
    let stop_total = config.stop_total_ns.map(to_ticks);
    let mut samples: Vec<(u64, u64)> = Vec::with_capacity(config.capacity);
    let mut min_step = u64::MAX;
    let mut period = 0;
    while period < config.periods && !stop.load(Ordering::Relaxed) {
        let start_ns = config.t0_ns + period * config.period_ns;
        sleep_until(config.clock, start_ns, stop);
        let end_ns = start_ns + config.runtime_ns;
        // The loop's deadline in clock units, from a pair read now.
        let (now_ns, now) = (config.clock.base_ns(), read());
        let deadline = now + to_ticks(end_ns.saturating_sub(now_ns));
        let first = read();
        let (mut prev, mut total, mut iterations, mut dropped) = (first, 0u64, 0u64, 0u64);
        samples.clear();
        loop {
            probe();
            let t = read();
            let step = t.wrapping_sub(prev);
            iterations += 1;
            if step > threshold {
                if samples.len() < config.capacity {
                    samples.push((prev, step));
                } else {
                    dropped += 1;
                }
                total += step;
                let too_long = stop_single.is_some_and(|s| step > s) || stop_total.is_some_and(|s| total > s);
                if too_long {
                    STOPPED_BY[0].store(u64::from(config.cpu), Ordering::Relaxed);
                    STOPPED_BY[1].store(prev, Ordering::Relaxed);
                    STOPPED_BY[2].store(step, Ordering::Relaxed);
                    stop.store(true, Ordering::Relaxed);
                }
            } else if step > 0 && step < min_step {
                min_step = step;
            }
            prev = t;
            if t >= deadline || (iterations & 0xfff == 0 && stop.load(Ordering::Relaxed)) {
                break;
            }
        }
        on_period(Period { start: first, end: prev, iterations, samples: &samples, dropped });
        period += 1;
    }
    min_step
}

/// Sleep until `clock`'s base reads `ns` (clock_nanosleep does not take CLOCK_MONOTONIC_RAW),
/// waking for `stop` at least every 100 ms.
fn sleep_until(clock: Clock, ns: u64, stop: &AtomicBool) {
    loop {
        let now = clock.base_ns();
        if ns <= now || stop.load(Ordering::Relaxed) {
            return;
        }
        std::thread::sleep(std::time::Duration::from_nanos((ns - now).min(100_000_000)));
    }
}

fn set_fifo(priority: u8) -> std::io::Result<()> {
    let param = libc::sched_param { sched_priority: i32::from(priority) };
    // SAFETY: `param` is a valid sched_param; pid 0 is the calling thread.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) } != 0 {
        let e = std::io::Error::last_os_error();
        // SAFETY: geteuid has no preconditions.
        let hint = if unsafe { libc::geteuid() } == 0 {
            // Root was refused: a cgroup without a real-time budget (cgroup v1 cpu.rt_runtime_us
            // of 0) or a container without CAP_SYS_NICE.
            "refused to root: give this cgroup a real-time budget or the container CAP_SYS_NICE, or drop --fifo"
        } else {
            "run as root, or drop --fifo"
        };
        return Err(std::io::Error::new(
            e.kind(),
            format!("SCHED_FIFO priority {priority} for the measurement thread: {e} ({hint})"),
        ));
    }
    Ok(())
}

/// Put a result's times in CLOCK_MONOTONIC_RAW ns (a no-op for the clock_gettime clocks).
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

#[cfg(test)]
mod tests {
    use super::*;

    /// 20 ms of one period on this thread's first allowed CPU, with no threshold.
    fn every_step(probe: Probe) -> std::io::Result<LoopResult> {
        let cpu = crate::affinity::allowed_cpus()[0];
        let t0 = Clock::MonoRaw.base_ns();
        let config = LoopConfig {
            cpu,
            clock: Clock::MonoRaw,
            threshold_ns: 0,
            t0_ns: t0,
            period_ns: 20_000_000,
            runtime_ns: 20_000_000,
            periods: 1,
            fifo: 0,
            stop_single_ns: None,
            stop_total_ns: None,
            capacity: 1 << 16,
            probe,
        };
        std::thread::scope(|s| s.spawn(|| run(config, 1.0)).join().unwrap())
    }

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn with_a_probe_every_step_holds_one_and_is_kept_or_counted() {
        // With no threshold every step is a sample; whatever CPUID costs here, each
        // iteration ran it once and none is lost from the count.
        let r = every_step(Probe::Cpuid).unwrap();
        let iterations = r.periods[0].2;
        assert!(iterations > 0);
        assert_eq!(r.samples.len() as u64 + r.dropped, iterations, "{} samples", r.samples.len());
        let (start, end, _) = r.periods[0];
        let within: u64 = r.samples.iter().map(|s| s.1).sum();
        assert!(within <= end - start, "the steps tile the window: {within} of {}", end - start);
    }

    #[test]
    fn an_inb_probe_without_dev_port_says_what_is_missing() {
        if std::path::Path::new("/dev/port").exists() {
            return;
        }
        let e = every_step(Probe::Inb(0x80)).unwrap_err().to_string();
        assert!(e.contains("/dev/port") && e.contains("CONFIG_DEVPORT"), "{e}");
    }

    #[test]
    fn probes_print_as_the_command_line_takes_them() {
        let names: Vec<String> = [Probe::None, Probe::Cpuid, Probe::Inb(0x3fd)].iter().map(Probe::to_string).collect();
        assert_eq!(names, ["none", "cpuid", "inb:0x3fd"]);
    }
}
