//! Where each vCPU's run time went, core by core, within a balancing period: a vCPU swapped
//! several times a period ran on several cores, and each core is charged its part.

use super::Target;

/// Where each vCPU's run time of the current period went, core by core. Its thread's
/// schedstat is read whenever it moves: charging a whole period to the core a vCPU ends it on
/// aliases with the swap rate (at an even number of swaps per period a vCPU would never be
/// charged to its other core, and the per-core gap would be as if it never moved).
pub struct RunSplit {
    /// Each vCPU's (VMM pid, thread).
    threads: Vec<(u32, u32)>,
    /// Each vCPU's run time (ns) at its last read; None where it could not be read.
    last: Vec<Option<u64>>,
    /// ns each vCPU ran on each core this period, as far as read.
    ran: Vec<Vec<u64>>,
}

impl RunSplit {
    pub fn new(targets: &[Target], cores: usize) -> RunSplit {
        let threads: Vec<(u32, u32)> = targets.iter().map(|t| (t.pid, t.tid)).collect();
        let last = threads.iter().map(|&(pid, tid)| run_ns(pid, tid)).collect();
        RunSplit { threads, last, ran: vec![vec![0; cores]; targets.len()] }
    }

    /// vCPU `v` has left core `from`: what it ran since the last read was there. At a
    /// period's end a running thread's figure may lag by a tick; the lag is read with the next
    /// move off the same core, so it shifts between periods, never between cores.
    pub fn leaving(&mut self, v: usize, from: usize) {
        let (pid, tid) = self.threads[v];
        let now = run_ns(pid, tid);
        if let (Some(now), Some(last)) = (now, self.last[v]) {
            self.ran[v][from] += now.saturating_sub(last);
        }
        self.last[v] = now.or(self.last[v]);
    }

    /// At a period's end, with each vCPU on `core_of[v]`: the share of its period's run time
    /// on each core (empty where nothing was read: charged where it is), and a new period.
    pub fn shares(&mut self, core_of: &[usize]) -> Vec<Vec<(usize, f64)>> {
        (0..self.ran.len())
            .map(|v| {
                self.leaving(v, core_of[v]);
                let total: u64 = self.ran[v].iter().sum();
                let split = if total == 0 {
                    Vec::new()
                } else {
                    let ran = self.ran[v].iter().enumerate().filter(|(_, &ns)| ns > 0);
                    ran.map(|(core, &ns)| (core, ns as f64 / total as f64)).collect()
                };
                self.ran[v].fill(0);
                split
            })
            .collect()
    }
}

/// The run time (ns) in a thread's schedstat, if it is there.
fn run_ns(pid: u32, tid: u32) -> Option<u64> {
    virtprof_host::schedstat::of_thread(pid, tid).map(|s| s.run_ns)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_that_ran_on_two_cores_is_split_between_them_and_the_period_starts_anew() {
        // This test's own thread stands for a vCPU: it runs, "moves" from core 0, runs on.
        // SAFETY: getpid and gettid have no preconditions.
        let (pid, tid) = unsafe { (libc::getpid() as u32, libc::gettid() as u32) };
        let target = Target { pid, index: 0, tid, label: "self".into() };
        let mut split = RunSplit::new(&[target], 2);
        let spin = |ms: u64| {
            let until = std::time::Instant::now() + std::time::Duration::from_millis(ms);
            while std::time::Instant::now() < until {}
        };
        spin(30);
        split.leaving(0, 0);
        spin(30);
        let shares = split.shares(&[1]);
        assert_eq!(shares[0].len(), 2, "{shares:?}");
        let total: f64 = shares[0].iter().map(|s| s.1).sum();
        assert!((total - 1.0).abs() < 1e-9 && shares[0].iter().all(|s| s.1 > 0.2), "{shares:?}");
        // Nothing ran since: the next period has nothing to split, so it is charged where it is.
        let next = split.shares(&[1]);
        assert!(next[0].len() <= 1, "{next:?}");
    }
}
