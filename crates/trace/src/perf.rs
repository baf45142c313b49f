//! perf_event_open probes: which counter classes this host offers. Counting itself (groups,
//! multiplexing) comes with the interval engine; here we only ask the kernel.

use perf_event::events::{Hardware, Software};
use perf_event::Builder;

/// Whether a class of perf events can be opened, and if not, why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Availability {
    /// Opened and counted.
    Available,
    /// The kernel refused; the OS error text says why (ENOENT: the PMU lacks it, EACCES:
    /// perf_event_paranoid).
    Unavailable(String),
}

/// Try to open, enable and read one software event (task-clock) on this thread.
pub fn probe_software() -> Availability {
    probe(Builder::new(Software::TASK_CLOCK))
}

/// Try to open, enable and read one hardware event (cycles) on this thread.
pub fn probe_hardware() -> Availability {
    probe(Builder::new(Hardware::CPU_CYCLES))
}

fn probe(mut builder: Builder<'_>) -> Availability {
    let result = builder.observe_self().any_cpu().build().and_then(|mut counter| {
        counter.enable()?;
        std::hint::black_box((0..10_000u64).sum::<u64>());
        counter.read()
    });
    match result {
        Ok(_) => Availability::Available,
        Err(e) => Availability::Unavailable(e.to_string()),
    }
}

/// `/proc/sys/kernel/perf_event_paranoid` (None if unreadable).
pub fn paranoid_level() -> Option<i32> {
    std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid").ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn software_events_open_where_perf_exists() {
        // Every Linux with perf_event_open has task-clock for the calling thread at paranoid <= 2.
        // Under QEMU user mode (the aarch64 tests in CI) the system call itself is missing.
        match probe_software() {
            Availability::Unavailable(e) if e.contains("os error 38") => {
                eprintln!("SKIP: no perf_event_open here ({e}: QEMU user mode?)");
            }
            found if paranoid_level().is_some_and(|p| p <= 2) => assert_eq!(found, Availability::Available),
            _ => {}
        }
    }
}
