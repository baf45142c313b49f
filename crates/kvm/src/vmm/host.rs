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
    // SAFETY: cpu_set_t is plain data; zeroed is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: sched_getaffinity writes at most size_of::<cpu_set_t>() bytes into `set`.
    if unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) } != 0 {
        return Vec::new();
    }
    (0..libc::CPU_SETSIZE as u32)
        // SAFETY: CPU_ISSET reads one bit of `set`; the index is below CPU_SETSIZE.
        .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu as usize, &set) })
        .collect()
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
