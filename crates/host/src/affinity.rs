//! CPU affinity of a thread by tid (0: the calling thread): what the VMM pins its vCPU threads
//! with, and what `virtprof balance` swaps between them.

use std::io;

/// The CPUs thread `tid` may run on.
pub fn get(tid: u32) -> io::Result<Vec<u32>> {
    // SAFETY: cpu_set_t is plain data; zeroed is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let pid = libc::pid_t::try_from(tid).map_err(|_| io::Error::from_raw_os_error(libc::ESRCH))?;
    // SAFETY: sched_getaffinity writes at most size_of::<cpu_set_t>() bytes into `set`.
    if unsafe { libc::sched_getaffinity(pid, std::mem::size_of::<libc::cpu_set_t>(), &mut set) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((0..libc::CPU_SETSIZE as u32)
        // SAFETY: CPU_ISSET reads one bit of `set`; the index is below CPU_SETSIZE.
        .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu as usize, &set) })
        .collect())
}

/// Let thread `tid` run only on `cpus`. The kernel moves a running thread off a CPU it may no
/// longer use before this returns.
pub fn set(tid: u32, cpus: &[u32]) -> io::Result<()> {
    // SAFETY: cpu_set_t is plain data; zeroed is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &cpu in cpus {
        if cpu as usize >= libc::CPU_SETSIZE as usize {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        // SAFETY: CPU_SET writes one bit inside `set`; the index was checked above.
        unsafe { libc::CPU_SET(cpu as usize, &mut set) };
    }
    let pid = libc::pid_t::try_from(tid).map_err(|_| io::Error::from_raw_os_error(libc::ESRCH))?;
    // SAFETY: sched_setaffinity reads `set` for thread `pid`.
    if unsafe { libc::sched_setaffinity(pid, std::mem::size_of::<libc::cpu_set_t>(), &set) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The host CPUs this process may run on (its affinity mask).
pub fn allowed_cpus() -> Vec<u32> {
    get(0).unwrap_or_default()
}

/// Whether a thread of this process can be pinned to `cpu`. A CPU outside the process's own
/// mask may still be one: `isolcpus=` takes a CPU out of every task's default mask, and that
/// CPU is just where a noise loop is meant to run.
pub fn can_pin(cpu: u32) -> bool {
    std::thread::scope(|s| s.spawn(|| set(0, &[cpu]).is_ok()).join().unwrap_or(false))
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

/// Move the calling thread (and the threads it starts later, which inherit its mask) off
/// `busy`, onto the other CPUs it may use: a tool's own bookkeeping must not run where it
/// measures. Returns the CPUs it moved to; empty (nothing changed) when `busy` covers them all.
pub fn keep_off(busy: &[u32]) -> Vec<u32> {
    let others: Vec<u32> = get(0).unwrap_or_default().into_iter().filter(|c| !busy.contains(c)).collect();
    if others.is_empty() || set(0, &others).is_err() {
        return Vec::new();
    }
    others
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_can_be_pinned_and_released() {
        let all = get(0).unwrap();
        assert!(!all.is_empty());
        let handle = std::thread::spawn(move || {
            set(0, &all[..1]).unwrap();
            let pinned = get(0).unwrap();
            set(0, &all).unwrap();
            (pinned, get(0).unwrap(), all)
        });
        let (pinned, released, all) = handle.join().unwrap();
        assert_eq!(pinned, all[..1]);
        assert_eq!(released, all);
        assert!(set(0, &[u32::MAX]).is_err());
    }

    #[test]
    fn a_cpu_outside_the_mask_is_still_one_to_pin_to_and_the_mask_stays() {
        // As isolcpus= leaves it: the process's mask lacks a CPU it may still be pinned to.
        let all = get(0).unwrap();
        let handle = std::thread::spawn(move || {
            set(0, &all[..1]).unwrap();
            let pinnable: Vec<bool> = all.iter().map(|&c| can_pin(c)).collect();
            (pinnable, get(0).unwrap(), can_pin(4096), all)
        });
        let (pinnable, mask, beyond, all) = handle.join().unwrap();
        assert!(pinnable.iter().all(|&p| p), "{all:?}: {pinnable:?}");
        assert_eq!(mask, all[..1], "the caller's own mask is not touched");
        assert!(!beyond);
    }

    #[test]
    fn keep_off_leaves_the_named_cpus_unless_they_are_all() {
        let all = get(0).unwrap();
        let first = all[0];
        let handle = std::thread::spawn(move || {
            let everywhere = keep_off(&all);
            let moved = keep_off(&[first]);
            (everywhere, moved, get(0).unwrap())
        });
        let (everywhere, moved, now) = handle.join().unwrap();
        assert!(everywhere.is_empty());
        assert!(!moved.contains(&first));
        if !moved.is_empty() {
            assert_eq!(now, moved);
        }
    }
}
