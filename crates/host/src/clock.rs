//! CLOCK_MONOTONIC, the clock tracefs calls `mono`: what every trace, interval row and guest
//! report of virtprof is aligned on.

/// CLOCK_MONOTONIC in nanoseconds (the clock tracefs calls `mono`).
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// CLOCK_REALTIME minus CLOCK_MONOTONIC now, ns, and how far off that can be (half the
/// tightest of a few monotonic reads around a realtime one): what turns a wall-clock time
/// from ptp_kvm into the monotonic clock rows and traces use.
pub fn realtime_minus_monotonic() -> (i64, u64) {
    let realtime = || {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: clock_gettime writes into the timespec we own.
        unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
        i128::from(ts.tv_sec) * 1_000_000_000 + i128::from(ts.tv_nsec)
    };
    (0..8)
        .map(|_| {
            let a = monotonic_ns();
            let r = realtime();
            let b = monotonic_ns();
            let mid = i128::from(a) + i128::from(b.saturating_sub(a)) / 2;
            (b.saturating_sub(a), i64::try_from(r - mid).unwrap_or(0))
        })
        .min()
        .map_or((0, u64::MAX), |(gap, offset)| (offset, gap / 2 + 1))
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

/// The longest a stoppable sleep goes without looking at its stop flag: a stop is seen
/// within this, whatever the period being slept.
pub const STOP_CHECK_NS: u64 = 20_000_000;

/// [`sleep_until`] `deadline_ns`, waking early when `stop` is set. Returns whether it was.
pub fn sleep_until_or_stop(deadline_ns: u64, stop: &std::sync::atomic::AtomicBool) -> bool {
    use std::sync::atomic::Ordering;
    loop {
        if stop.load(Ordering::Relaxed) {
            return true;
        }
        let now = crate::monotonic_ns();
        if now >= deadline_ns {
            return false;
        }
        sleep_until(deadline_ns.min(now + STOP_CHECK_NS));
    }
}

/// Can a loop read the TSC as a clock (constant rate, ticking in every C-state)?
pub fn tsc_usable() -> bool {
    cfg!(target_arch = "x86_64")
        && std::fs::read_to_string("/proc/cpuinfo")
            .is_ok_and(|c| c.contains(" constant_tsc") && c.contains(" nonstop_tsc"))
}
