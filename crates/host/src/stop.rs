//! One stop request for the whole process: INT, TERM, HUP (a closed terminal or ssh session)
//! and QUIT all set it, and every long-running loop polls it, so runs end cleanly: tracefs
//! instances removed, VMs stopped, files finished.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

/// Set by [`install_handler`]'s signals (or by [`request`]).
pub static STOP_REQUESTED: AtomicBool = AtomicBool::new(false);
/// The last stop signal received (0: none), to pass on to a command being run.
static LAST_SIGNAL: AtomicI32 = AtomicI32::new(0);

/// The signals that stop a run.
pub const STOP_SIGNALS: [libc::c_int; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];

/// A stop signal that came before [`install_handler`], to a process started ignoring it.
static EARLY_SIGNAL: AtomicI32 = AtomicI32::new(0);

/// Called first thing in `main`: a stop signal that comes before a command watches for stops
/// is not lost. A process started with a stop signal ignored (a background job of a shell
/// script has SIGINT and SIGQUIT so) would drop it, and a command that does watch would run
/// on to its end; such signals are remembered instead, and honoured by [`install_handler`]
/// (commands that never watch ignore them, as asked). Signals the process was started with
/// blocked are unblocked: one already pending is delivered now, remembered or, for a signal
/// with its default action, ending the process before it has made anything.
pub fn remember_early_signals() {
    extern "C" fn remember(signal: libc::c_int) {
        EARLY_SIGNAL.store(signal, Ordering::Relaxed);
    }
    for signal in STOP_SIGNALS {
        // SAFETY: a zeroed sigaction is a valid out-parameter; querying changes nothing.
        let mut current: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: querying the disposition with a null new action.
        let queried = unsafe { libc::sigaction(signal, std::ptr::null(), &mut current) } == 0;
        if queried && current.sa_sigaction == libc::SIG_IGN {
            // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
            unsafe { libc::signal(signal, remember as extern "C" fn(libc::c_int) as libc::sighandler_t) };
        }
    }
    // SAFETY: a set built by sigemptyset/sigaddset, applied to this (still the only) thread.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for signal in STOP_SIGNALS {
            libc::sigaddset(&mut set, signal);
        }
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
    }
}

/// Install handlers for [`STOP_SIGNALS`] that set [`STOP_REQUESTED`]; a stop signal
/// remembered before (see [`remember_early_signals`]) requests the stop now.
pub fn install_handler() {
    extern "C" fn on_signal(signal: libc::c_int) {
        LAST_SIGNAL.store(signal, Ordering::Relaxed);
        STOP_REQUESTED.store(true, Ordering::Relaxed);
    }
    for signal in STOP_SIGNALS {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe { libc::signal(signal, on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t) };
    }
    let early = EARLY_SIGNAL.swap(0, Ordering::Relaxed);
    if early != 0 {
        LAST_SIGNAL.store(early, Ordering::Relaxed);
        STOP_REQUESTED.store(true, Ordering::Relaxed);
    }
}

/// Whether a stop was asked for.
pub fn requested() -> bool {
    STOP_REQUESTED.load(Ordering::Relaxed)
}

/// The stop signal received, if a signal (not [`request`]) asked for the stop.
pub fn signal() -> Option<libc::c_int> {
    Some(LAST_SIGNAL.load(Ordering::Relaxed)).filter(|&s| s != 0)
}

/// Make the child `command` starts end with this process, even one killed with SIGKILL: the
/// kernel sends it SIGTERM (a clean stop) when we die; if we died between its fork and exec,
/// it exits at once.
pub fn die_with_parent(command: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: getpid has no preconditions.
    let parent = unsafe { libc::getpid() };
    // SAFETY: the closure runs in the forked child before exec and calls only prctl, getppid
    // and _exit, which are async-signal-safe.
    unsafe {
        command.pre_exec(move || {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM as libc::c_ulong, 0, 0, 0);
            if libc::getppid() != parent {
                libc::_exit(1);
            }
            Ok(())
        })
    };
}

/// Ask for a stop from inside the process (e.g. a `done` condition).
pub fn request() {
    STOP_REQUESTED.store(true, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_stop_signal_sets_the_flag() {
        install_handler();
        for signal in STOP_SIGNALS {
            STOP_REQUESTED.store(false, Ordering::Relaxed);
            // SAFETY: raise delivers a signal whose handler only stores to an atomic.
            unsafe { libc::raise(signal) };
            assert!(requested(), "signal {signal}");
            assert_eq!(super::signal(), Some(signal));
        }
        STOP_REQUESTED.store(false, Ordering::Relaxed);
    }
}
