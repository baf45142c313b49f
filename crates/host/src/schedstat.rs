//! A thread's schedstat: time on a CPU, time runnable but waiting (host-side steal), and
//! timeslices, as the kernel counts them (`CONFIG_SCHEDSTATS`/`SCHED_INFO`).

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

/// Thread `tid` of process `pid` (None if it is gone or the kernel lacks schedstat).
pub fn of_thread(pid: u32, tid: u32) -> Option<Schedstat> {
    Schedstat::parse(&std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/schedstat")).ok()?)
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
