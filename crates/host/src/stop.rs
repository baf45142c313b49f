//! One stop request for the whole process: INT, TERM, HUP (a closed terminal or ssh session)
//! and QUIT all set it, and every long-running loop polls it, so runs end cleanly: tracefs
//! instances removed, VMs stopped, files finished.

use std::sync::atomic::{AtomicBool, Ordering};

/// Set by [`install_handler`]'s signals (or by [`request`]).
pub static STOP_REQUESTED: AtomicBool = AtomicBool::new(false);

/// The signals that stop a run.
pub const STOP_SIGNALS: [libc::c_int; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];

/// Install handlers for [`STOP_SIGNALS`] that set [`STOP_REQUESTED`].
pub fn install_handler() {
    extern "C" fn on_signal(_: libc::c_int) {
        STOP_REQUESTED.store(true, Ordering::Relaxed);
    }
    for signal in STOP_SIGNALS {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe { libc::signal(signal, on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t) };
    }
}

/// Whether a stop was asked for.
pub fn requested() -> bool {
    STOP_REQUESTED.load(Ordering::Relaxed)
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
        }
        STOP_REQUESTED.store(false, Ordering::Relaxed);
    }
}
