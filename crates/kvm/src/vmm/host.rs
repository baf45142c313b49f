//! The few host facts a vCPU thread reads about itself: the clock and its schedstat.

/// CLOCK_MONOTONIC in nanoseconds (the clock tracefs calls `mono`).
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A thread's `/proc/.../schedstat`: time on CPU, time runnable but waiting, timeslices.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Schedstat {
    /// Nanoseconds running.
    pub run_ns: u64,
    /// Nanoseconds runnable, waiting for a CPU (host-side steal).
    pub wait_ns: u64,
    /// Times scheduled in.
    pub timeslices: u64,
}

impl Schedstat {
    /// Parse the three numbers of a schedstat file.
    pub fn parse(text: &str) -> Option<Schedstat> {
        let mut it = text.split_ascii_whitespace().map(|w| w.parse::<u64>().ok());
        Some(Schedstat { run_ns: it.next()??, wait_ns: it.next()??, timeslices: it.next()?? })
    }

    /// `self - earlier`.
    pub fn since(self, earlier: Schedstat) -> Schedstat {
        Schedstat {
            run_ns: self.run_ns.saturating_sub(earlier.run_ns),
            wait_ns: self.wait_ns.saturating_sub(earlier.wait_ns),
            timeslices: self.timeslices.saturating_sub(earlier.timeslices),
        }
    }
}

/// The calling thread's schedstat (zeros if the kernel lacks CONFIG_SCHEDSTATS/SCHED_INFO).
pub fn read_schedstat() -> Schedstat {
    std::fs::read_to_string("/proc/thread-self/schedstat").ok().and_then(|t| Schedstat::parse(&t)).unwrap_or_default()
}

/// The host CPUs this process may run on (its affinity mask).
pub fn allowed_cpus() -> Vec<u32> {
    crate::affinity::get(0).unwrap_or_default()
}

/// Ask for SCHED_FIFO priority 1 for the calling thread: a sampler or actuator that wakes late
/// blurs its intervals, while the few microseconds it runs per wake-up cost the same either
/// way. Busy vCPU threads otherwise delay its wake-ups by whole scheduler slices. Without the
/// privilege the thread stays best-effort (callers count and report late wake-ups).
pub fn prefer_realtime() {
    let param = libc::sched_param { sched_priority: 1 };
    // SAFETY: pid 0 is the calling thread; `param` is a valid sched_param we own.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) } != 0 {
        log::debug!("this thread stays best-effort: {}", std::io::Error::last_os_error());
    }
}

/// Sleep until `deadline_ns` of CLOCK_MONOTONIC ([`monotonic_ns`]).
pub fn sleep_until(deadline_ns: u64) {
    let ts = libc::timespec {
        tv_sec: (deadline_ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (deadline_ns % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: an absolute CLOCK_MONOTONIC sleep on a timespec we own; EINTR just wakes early,
    // which the caller's interval arithmetic tolerates.
    unsafe { libc::clock_nanosleep(libc::CLOCK_MONOTONIC, libc::TIMER_ABSTIME, &ts, std::ptr::null_mut()) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_schedstat() {
        let s = Schedstat::parse("53520923 378447 3\n").unwrap();
        assert_eq!(s, Schedstat { run_ns: 53_520_923, wait_ns: 378_447, timeslices: 3 });
        assert_eq!(Schedstat::parse("1 2"), None);
        assert!(read_schedstat().timeslices > 0);
    }
}
