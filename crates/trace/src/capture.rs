//! Live capture from a private tracefs instance: configure it, then read whole raw pages from
//! every CPU's `trace_pipe_raw` (non-blocking) and hand them to a consumer in batches. Between
//! reads the reader sleeps until a buffer is [`WAKE_PERCENT`] full (the kernel wakes it) or a
//! short timer runs out. The buffers keep the size they start with (sized from the rate first,
//! when asked: [`crate::buffer_sizing`]): resizing them while tracing leaves a hole of 100-200 ms
//! in the trace that no loss counter shows (seen here: perf counted 21 805 kvm_pio in a 100 ms
//! row the trace had none of). Loss figures come from
//! `per_cpu/cpuN/stats` at the end. Dropping the capture removes the instance (see
//! [`crate::tracefs::Instance`]).

use std::fs::File;
use std::io::{ErrorKind, Read};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use virtprof_model::clock::{clock_unit, ClockUnit};
use virtprof_model::{Cpu, KernelLoss};

use crate::buffer_sizing::{self, Sizing};
use crate::error::TraceError;
use crate::exit_hist::{ExitHistTriggers, KernelExitHists};
use crate::tracefs::{Instance, Tracefs};

/// What to trace.
#[derive(Debug, Clone)]
pub struct CaptureConfig {
    /// `system` or `system:event` entries (`kvm`, `sched:sched_switch`).
    pub events: Vec<String>,
    /// Per-CPU ring buffer size (the least, with `fit_to_rate`).
    pub buffer_size_kb: u32,
    /// Grow the buffers to the event rate measured before tracing starts
    /// ([`crate::buffer_sizing`]).
    pub fit_to_rate: bool,
    /// Trace clock; `mono` matches CLOCK_MONOTONIC so guest/VMM timestamps align directly.
    pub clock: String,
    /// Have the kernel's hist triggers time every exit on the trace's own timestamps too
    /// ([`crate::exit_hist`]).
    pub exit_hist: bool,
}

impl CaptureConfig {
    /// The default event set of `virtprof record`.
    pub fn default_events() -> Vec<String> {
        [
            "kvm",
            "sched:sched_switch",
            "sched:sched_wakeup",
            "sched:sched_wakeup_new",
            "sched:sched_migrate_task",
            "irq",
            "irq_vectors",
            // One event per guest page KVM faults in (x86; absent elsewhere, then skipped):
            // rare once a guest's memory is mapped, a storm when the host takes it back.
            "kvmmmu:kvm_mmu_spte_requested",
        ]
        .map(String::from)
        .to_vec()
    }
}

/// The clock must be one the kernel lists in `trace_clock`, and count nanoseconds: every
/// duration virtprof prints is a difference of timestamps.
fn check_clock(tracefs: &Tracefs, clock: &str) -> Result<(), TraceError> {
    let path = tracefs.root().join("trace_clock");
    let listed = std::fs::read_to_string(&path).map_err(TraceError::file(&path))?;
    let offered: Vec<String> = listed.split_whitespace().map(|c| c.trim_matches(['[', ']']).to_string()).collect();
    if !offered.iter().any(|c| c == clock) {
        return Err(TraceError::NoSuchClock { clock: clock.to_string(), offered });
    }
    let counts = match clock_unit(clock) {
        ClockUnit::Nanoseconds => return Ok(()),
        ClockUnit::Ticks => "CPU cycles",
        ClockUnit::NotTime if clock == "counter" => "events, not time",
        ClockUnit::NotTime => "jiffies (10 ms steps)",
        ClockUnit::Unknown => "units this version does not know",
    };
    Err(TraceError::ClockNotNanoseconds { clock: clock.to_string(), counts })
}

/// How full (percent) a CPU's buffer gets before the kernel wakes the reader: the other three
/// quarters are the time the reader has to be scheduled.
pub const WAKE_PERCENT: u32 = 25;
/// The longest the reader sleeps when no buffer fills: live figures and `--duration` stay
/// timely on a quiet host.
const WAKE_AT_MOST: Duration = Duration::from_millis(50);
/// The shortest time between two reads: a kernel without `buffer_percent` wakes the reader on
/// every event, and reading page by page would cost more than it saves.
const WAKE_AT_LEAST: Duration = Duration::from_millis(10);

/// The largest per-CPU buffer: at 30 bytes an event, 35 M events, more than a second of the
/// fastest rate a CPU emits; asking for more is a typo (KB taken for bytes) more often than a need.
const MAX_BUFFER_KB: u32 = 1 << 20;

/// At least one page per CPU, at most [`MAX_BUFFER_KB`], and all CPUs' buffers within half
/// the memory available now (the kernel allocates them at once, unswappable).
fn check_buffer_size(kb: u32, cpus: usize) -> Result<(), TraceError> {
    if kb < 4 {
        return Err(TraceError::BufferSize { kb, why: "the smallest buffer is one 4 KB page per CPU".into() });
    }
    if kb > MAX_BUFFER_KB {
        return Err(TraceError::BufferSize {
            kb,
            why: format!(
                "over {} MiB per CPU, which already holds more than a second of the busiest CPU's events; the kernel \
                 would pin {} MiB and take seconds per GiB to fill it before tracing starts; at most {MAX_BUFFER_KB} KB",
                MAX_BUFFER_KB / 1024,
                u64::from(kb) * cpus.max(1) as u64 / 1024
            ),
        });
    }
    let available_kb = buffer_sizing::available_kb();
    let total_kb = u64::from(kb) * cpus.max(1) as u64;
    match available_kb {
        Some(available) if total_kb > available / 2 => Err(TraceError::BufferSize {
            kb,
            why: format!(
                "{cpus} CPUs x {kb} KB = {} MiB of unswappable trace buffers, more than half the {} MiB available; \
                 at most {} KB per CPU here",
                total_kb / 1024,
                available / 1024,
                available / 2 / cpus.max(1) as u64
            ),
        }),
        _ => Ok(()),
    }
}

/// A running capture.
pub struct Capture {
    // Field order is drop order: the readers must close before the instance is removed (the
    // kernel refuses to remove an instance with open trace_pipe_raw files).
    readers: Vec<(u32, File)>,
    // Its triggers must be gone before the instance can be.
    exit_hist: Option<ExitHistTriggers>,
    instance: Instance,
    page_size: usize,
    /// The systems whose formats the recording needs.
    pub systems: Vec<String>,
    /// The events enabled (`system:name`): what the recording holds, and so which figures it
    /// can give (a system's formats are all saved; only these were traced).
    pub events: Vec<String>,
    /// The buffers' size, and the rate it was fitted to.
    pub sizing: Sizing,
}

impl Capture {
    /// Create the instance `virtprof-record-<pid>`, enable the events, open the per-CPU pipes
    /// and start tracing. Events that do not exist on this kernel are skipped and returned.
    pub fn start(
        tracefs: &Tracefs,
        config: &CaptureConfig,
        page_size: usize,
    ) -> Result<(Capture, Vec<String>), TraceError> {
        // Settings the kernel would refuse (or, for a huge buffer, take the host's memory for)
        // are refused here, naming what would do, before any instance exists.
        check_clock(tracefs, &config.clock)?;
        check_buffer_size(config.buffer_size_kb, online_cpus().len())?;
        let present = |spec: &String| match spec.split_once(':') {
            Some((system, name)) => tracefs.has_event(system, name),
            None => !tracefs.events(spec).is_empty(),
        };
        if !config.events.is_empty() && !config.events.iter().any(present) {
            return Err(TraceError::NoEvents { root: tracefs.root().to_path_buf(), asked: config.events.clone() });
        }
        let mut instance = tracefs.create_instance("record")?;
        instance.write("buffer_size_kb", &config.buffer_size_kb.to_string())?;
        instance.write("trace_clock", &config.clock)?;
        // Older kernels have no buffer_percent (they wake a polling reader on every event):
        // the reader then paces itself (WAKE_AT_LEAST).
        let _ = instance.write("buffer_percent", &WAKE_PERCENT.to_string());
        // Have the kernel remember tid → tgid of traced tasks (`saved_tgids`), so threads of
        // processes that exit before the recording ends can still be mapped to their VM.
        let _ = instance.write("options/record-tgid", "1");
        let mut missing = Vec::new();
        let mut systems: Vec<String> = Vec::new();
        let mut events: Vec<String> = Vec::new();
        for spec in &config.events {
            if !present(spec) {
                missing.push(spec.clone());
                continue;
            }
            let (system, name) = match spec.split_once(':') {
                Some((s, n)) => (s, Some(n)),
                None => (spec.as_str(), None),
            };
            instance.enable(system, name)?;
            match name {
                Some(name) => events.push(format!("{system}:{name}")),
                None => events.extend(tracefs.events(system).into_iter().map(|e| format!("{system}:{e}"))),
            }
            if !systems.iter().any(|s| s == system) {
                systems.push(system.to_string());
            }
        }
        events.sort();
        events.dedup();
        let cpus = online_cpus();
        let sizing = if config.fit_to_rate {
            fit_to_rate(&instance, &cpus, config.buffer_size_kb)?
        } else {
            Sizing::fixed(config.buffer_size_kb)
        };
        let mut readers = Vec::new();
        let per_cpu = instance.path().join("per_cpu");
        for cpu in cpus {
            let path = per_cpu.join(format!("cpu{cpu}")).join("trace_pipe_raw");
            let file = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(&path)
                .map_err(TraceError::file(&path))?;
            readers.push((cpu, file));
        }
        // After the rate probe: the kernel's histograms hold the traced window's exits only.
        let exit_hist =
            if config.exit_hist { Some(ExitHistTriggers::attach(tracefs, &instance, &config.clock)?) } else { None };
        instance.write("tracing_on", "1")?;
        Ok((Capture { readers, exit_hist, instance, page_size, systems, events, sizing }, missing))
    }

    /// The instance directory.
    pub fn instance_path(&self) -> &Path {
        self.instance.path()
    }

    /// CPUs being read.
    pub fn cpus(&self) -> Vec<u32> {
        self.readers.iter().map(|(c, _)| *c).collect()
    }

    /// Read every available page of every CPU, at most `max_pages` per CPU per call, and hand
    /// each CPU's batch to `sink` by value (pages are read straight into it: no copies).
    /// Returns the number of pages read.
    pub fn poll(&mut self, max_pages: usize, mut sink: impl FnMut(u32, Vec<u8>)) -> Result<usize, TraceError> {
        let mut total = 0;
        for (cpu, file) in &mut self.readers {
            let mut batch: Vec<u8> = Vec::new();
            while batch.len() < max_pages * self.page_size {
                let start = batch.len();
                // Zero-filled, so a short read (never seen: the kernel hands out whole pages)
                // still leaves a page-shaped, decodable buffer.
                batch.resize(start + self.page_size, 0);
                match file.read(&mut batch[start..]) {
                    Ok(0) => {
                        batch.truncate(start);
                        break;
                    }
                    Ok(_) => {}
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        batch.truncate(start);
                        break;
                    }
                    Err(e) if e.kind() == ErrorKind::Interrupted => batch.truncate(start),
                    Err(e) => {
                        let path = self.instance.path().join(format!("per_cpu/cpu{cpu}/trace_pipe_raw"));
                        return Err(TraceError::File { path, source: e });
                    }
                }
            }
            if !batch.is_empty() {
                total += batch.len() / self.page_size;
                sink(*cpu, batch);
            }
        }
        Ok(total)
    }

    /// Stop tracing (the buffers keep what they hold for a final [`Capture::poll`]).
    pub fn stop(&self) -> Result<(), TraceError> {
        self.instance.write("tracing_on", "0")
    }

    /// What the kernel's hist triggers counted, when asked for ([`CaptureConfig::exit_hist`]).
    pub fn exit_hists(&self) -> Option<Result<KernelExitHists, TraceError>> {
        self.exit_hist.as_ref().map(|h| h.read(&self.instance))
    }

    /// Per-CPU overrun and dropped counts.
    pub fn loss(&self) -> Vec<KernelLoss> {
        self.readers
            .iter()
            .map(|(cpu, _)| {
                let stats = self.instance.read(&format!("per_cpu/cpu{cpu}/stats")).unwrap_or_default();
                KernelLoss {
                    cpu: Cpu(*cpu),
                    overrun: stat_value(&stats, "overrun"),
                    dropped: stat_value(&stats, "dropped events"),
                }
            })
            .collect()
    }

    /// The kernel's counts so far with where the pages flagged gaps: the one loss figure live
    /// views show (sums saturate).
    pub fn account(&self, page_loss: &virtprof_model::Loss) -> virtprof_model::Loss {
        let mut loss = page_loss.clone();
        loss.complete = true;
        for l in self.loss() {
            loss.report_counters(&l);
        }
        loss
    }

    /// Run until `stop` is set or `until` says so, feeding pages to `sink`; then drain.
    pub fn run(
        &mut self,
        stop: &AtomicBool,
        mut until: impl FnMut() -> bool,
        mut sink: impl FnMut(u32, Vec<u8>),
    ) -> Result<(), TraceError> {
        while !stop.load(Ordering::Relaxed) && !until() {
            if self.poll(64, &mut sink)? == 0 {
                let woke = Instant::now();
                self.wait(WAKE_AT_MOST);
                if let Some(early) = WAKE_AT_LEAST.checked_sub(woke.elapsed()) {
                    std::thread::sleep(early);
                }
            }
        }
        self.stop()?;
        while self.poll(256, &mut sink)? > 0 {}
        Ok(())
    }

    /// Sleep until a CPU's buffer is [`WAKE_PERCENT`] full (the kernel's `buffer_percent`), a
    /// signal arrives, or `timeout` passes.
    fn wait(&self, timeout: Duration) {
        let mut fds: Vec<libc::pollfd> = self
            .readers
            .iter()
            .map(|(_, f)| libc::pollfd { fd: f.as_raw_fd(), events: libc::POLLIN, revents: 0 })
            .collect();
        let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
        // SAFETY: `fds` is a valid array of the length given; poll only writes `revents`.
        unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    }

    /// Close the readers and remove the instance (the kernel refuses while readers are open).
    pub fn close(self) {
        let Capture { instance, readers, exit_hist, .. } = self;
        drop(readers);
        drop(exit_hist);
        drop(instance);
    }
}

/// Probe the rate into `instance` (events enabled, not yet tracing), grow its buffers to fit
/// it, and clear what the probe traced: the capture proper starts empty.
fn fit_to_rate(instance: &Instance, cpus: &[u32], floor_kb: u32) -> Result<Sizing, TraceError> {
    let busiest = buffer_sizing::probe(instance, cpus, floor_kb)?;
    let (mut kb, capped) = buffer_sizing::fit(floor_kb, busiest, cpus.len(), buffer_sizing::available_kb());
    if kb > floor_kb {
        instance.write("buffer_size_kb", &kb.to_string())?;
        // What the kernel made of it (it rounds to whole pages).
        kb = instance.read("buffer_size_kb").ok().and_then(|t| t.trim().parse().ok()).unwrap_or(kb);
    }
    instance.clear()?;
    Ok(Sizing { kb, busiest_bytes_per_s: Some(busiest), capped })
}

/// Tasks the kernel saw while tracing: (tid, tgid, comm) from `saved_tgids` and
/// `saved_cmdlines` (a bounded kernel cache: recent tasks only).
pub fn saved_tasks(tracefs: &Tracefs) -> Vec<(u32, u32, String)> {
    let read = |f: &str| crate::tracefs::read_file(&tracefs.root().join(f)).unwrap_or_default();
    crate::tracefs::parse_saved_tasks(&read("saved_cmdlines"), &read("saved_tgids"))
}

/// A number from a `per_cpu/cpuN/stats` file (`overrun: 0`, `dropped events: 0`).
pub fn stat_value(stats: &str, key: &str) -> u64 {
    stats.lines().find_map(|l| l.strip_prefix(key)?.trim_start().strip_prefix(':')?.trim().parse().ok()).unwrap_or(0)
}

/// Online CPUs from /sys/devices/system/cpu/online (`0-1`).
pub fn online_cpus() -> Vec<u32> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap_or_else(|_| "0".into());
    let mut cpus = Vec::new();
    for part in text.trim().split(',') {
        let (lo, hi) = part.split_once('-').unwrap_or((part, part));
        if let (Ok(lo), Ok(hi)) = (lo.parse::<u32>(), hi.parse::<u32>()) {
            cpus.extend(lo..=hi);
        }
    }
    cpus
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffer_sizes_are_checked_against_a_page_a_ceiling_and_the_memory_available() {
        assert!(check_buffer_size(0, 2).unwrap_err().is_bad_input());
        assert!(check_buffer_size(3, 2).is_err());
        assert!(check_buffer_size(4, 2).is_ok());
        let huge = check_buffer_size(u32::MAX, 2).unwrap_err().to_string();
        assert!(huge.contains("at most 1048576 KB"), "{huge}");
        let many = check_buffer_size(MAX_BUFFER_KB, 4096).unwrap_err().to_string();
        assert!(many.contains("more than half the") && many.contains("KB per CPU here"), "{many}");
    }

    #[test]
    fn parses_cpu_stats() {
        let stats = "entries: 4812\noverrun: 3\ncommit overrun: 0\ndropped events: 7\n";
        assert_eq!(stat_value(stats, "overrun"), 3);
        assert_eq!(stat_value(stats, "dropped events"), 7);
        assert_eq!(stat_value(stats, "missing"), 0);
        assert!(!online_cpus().is_empty());
    }
}
