//! Per-CPU ring buffers sized from the event rate the host shows as a capture starts.
//!
//! A buffer must hold what arrives while the reader is not running: on a loaded host that is
//! seconds, not the milliseconds between wake-ups. So before tracing for real, the capture
//! traces its events for [`PROBE`] into the floor-sized buffers, reads how many bytes the
//! busiest CPU wrote, and grows every CPU's buffer to hold [`FIT_SECONDS`] of that rate. The
//! probe's events are then cleared: the recording starts after the resize. Resizing while
//! tracing is not an option: the kernel stops the instance for the resize (100-200 ms here)
//! and no loss counter shows the hole.
//!
//! What it cannot see: a rate that rises later (`record -- CMD` starts its command after the
//! probe). Loss then is counted and reported as ever.

use std::time::Duration;

use crate::error::TraceError;
use crate::tracefs::Instance;

/// How long the rate is measured for.
pub const PROBE: Duration = Duration::from_millis(100);
/// How long the reader may go unscheduled at the probed rate before events are lost.
pub const FIT_SECONDS: u64 = 4;
/// The largest buffer a fit picks per CPU: larger takes the kernel seconds to allocate.
const FIT_AT_MOST_KB: u64 = 256 * 1024;
/// All CPUs' fitted buffers stay within this share of the memory available now.
const FIT_MEMORY_SHARE: u64 = 8;

/// The buffer size a capture runs with, and where it came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sizing {
    /// KB per CPU.
    pub kb: u32,
    /// The busiest CPU's bytes per second during the probe (None: size given, no probe).
    pub busiest_bytes_per_s: Option<u64>,
    /// The rate wanted more than the ceiling allowed.
    pub capped: bool,
}

impl Sizing {
    /// A size given, not probed.
    pub fn fixed(kb: u32) -> Sizing {
        Sizing { kb, busiest_bytes_per_s: None, capped: false }
    }
}

/// The size per CPU that holds [`FIT_SECONDS`] of `busiest_bytes_per_s`: never below
/// `floor_kb`; at most [`FIT_AT_MOST_KB`], and all `cpus` within 1/[`FIT_MEMORY_SHARE`] of
/// `available_kb` (when known). True when a ceiling cut it.
pub fn fit(floor_kb: u32, busiest_bytes_per_s: u64, cpus: usize, available_kb: Option<u64>) -> (u32, bool) {
    // Whole MiB: the size reads as what it is for (and the kernel rounds to pages anyway).
    let want_kb = busiest_bytes_per_s.saturating_mul(FIT_SECONDS).div_ceil(1 << 20).saturating_mul(1024);
    let memory_kb = available_kb.map_or(u64::MAX, |a| a / FIT_MEMORY_SHARE / cpus.max(1) as u64);
    let ceiling_kb = FIT_AT_MOST_KB.min(memory_kb).max(u64::from(floor_kb));
    let kb = want_kb.clamp(u64::from(floor_kb), ceiling_kb);
    (u32::try_from(kb).unwrap_or(u32::MAX), want_kb > ceiling_kb)
}

/// Trace into `instance` (events enabled, not tracing, `floor_kb` per CPU) for [`PROBE`] and
/// return the busiest of `cpus`' bytes per second. A CPU whose buffer overran during the probe
/// counts as at least a full buffer's worth.
pub(crate) fn probe(instance: &Instance, cpus: &[u32], floor_kb: u32) -> Result<u64, TraceError> {
    instance.write("tracing_on", "1")?;
    std::thread::sleep(PROBE);
    instance.write("tracing_on", "0")?;
    let probe_ms = u64::try_from(PROBE.as_millis()).unwrap_or(u64::MAX).max(1);
    let mut busiest = 0;
    for cpu in cpus {
        let stats = instance.read(&format!("per_cpu/cpu{cpu}/stats"))?;
        let mut bytes = crate::capture::stat_value(&stats, "bytes");
        if crate::capture::stat_value(&stats, "overrun") > 0 {
            bytes = bytes.max(u64::from(floor_kb) * 1024);
        }
        busiest = busiest.max(bytes.saturating_mul(1000) / probe_ms);
    }
    Ok(busiest)
}

/// The kernel's MemAvailable, in KB.
pub(crate) fn available_kb() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    meminfo.lines().find_map(|l| l.strip_prefix("MemAvailable:")?.split_whitespace().next()?.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quiet_host_keeps_the_floor() {
        assert_eq!(fit(8192, 0, 2, Some(1 << 24)), (8192, false));
        assert_eq!(fit(8192, 1 << 20, 2, Some(1 << 24)), (8192, false)); // 4 s of 1 MiB/s is under 8 MiB
    }

    #[test]
    fn a_busy_host_gets_its_seconds_of_rate() {
        // 6 MiB/s on the busiest CPU: 24 MiB per CPU; a little more, the next MiB.
        assert_eq!(fit(8192, 6 << 20, 2, Some(24 << 20)), (24 * 1024, false));
        assert_eq!(fit(8192, (6 << 20) + 1, 2, Some(24 << 20)), (25 * 1024, false));
    }

    #[test]
    fn the_fit_stops_at_its_ceilings_and_says_so() {
        // 1 GiB/s would want 4 GiB per CPU.
        assert_eq!(fit(8192, 1 << 30, 2, Some(24 << 20)), (256 * 1024, true));
        // 1 GiB available, 2 CPUs: 64 MiB each.
        assert_eq!(fit(8192, 1 << 30, 2, Some(1 << 20)), (64 * 1024, true));
        // A ceiling under the floor leaves the floor (the floor was checked on its own).
        assert_eq!(fit(8192, 1 << 30, 64, Some(1 << 20)), (8192, true));
    }
}
