//! The view's terminal: keys read on a thread of their own, and its end noticed.
//!
//! crossterm reads the terminal in a loop until it has parsed an event. Once the terminal hangs
//! up (its window closed, the ssh connection dropped) every read returns end-of-file at once, so
//! that loop never returns: the process would spin at 100 % of a core, deaf to its stop flag,
//! holding its tracefs instance and its VMs. So crossterm only ever runs on the reader thread,
//! and both threads poll the terminal's descriptor for the hang-up themselves: the view ends
//! cleanly even if the reader is caught spinning (it dies with the process).

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::Duration;

use ratatui::crossterm::event::{self, Event, KeyEvent, KeyEventKind};

/// What waiting for a key gave.
pub enum Input {
    Key(KeyEvent),
    /// Nothing within the time given.
    Nothing,
    /// The terminal hung up or failed: there is nobody left to show the view to.
    Gone,
}

/// The terminal's key presses, from the reader thread.
pub struct Keys {
    fd: RawFd,
    /// `/dev/tty` when standard input is not the terminal; kept open for `fd`.
    _tty: Option<File>,
    presses: Receiver<io::Result<KeyEvent>>,
}

impl Keys {
    /// Start reading keys from the terminal crossterm reads: standard input when it is one,
    /// else `/dev/tty`.
    pub fn start() -> io::Result<Keys> {
        // SAFETY: isatty only inspects the descriptor.
        let (fd, tty) = if unsafe { libc::isatty(libc::STDIN_FILENO) } == 1 {
            (libc::STDIN_FILENO, None)
        } else {
            let tty = File::options().read(true).write(true).open("/dev/tty")?;
            (tty.as_raw_fd(), Some(tty))
        };
        let (send, presses) = mpsc::channel();
        std::thread::Builder::new().name("keys".into()).spawn(move || read_keys(fd, &send))?;
        Ok(Keys { fd, _tty: tty, presses })
    }

    /// The next key press within `timeout`, or why there is none.
    pub fn next(&self, timeout: Duration) -> io::Result<Input> {
        if hung_up(self.fd, Duration::ZERO) {
            return Ok(Input::Gone);
        }
        match self.presses.recv_timeout(timeout) {
            Ok(Ok(key)) => Ok(Input::Key(key)),
            Ok(Err(e)) => Err(e),
            Err(RecvTimeoutError::Timeout) => Ok(Input::Nothing),
            // The reader saw the hang-up and stopped.
            Err(RecvTimeoutError::Disconnected) => Ok(Input::Gone),
        }
    }
}

/// Hand key presses over until the terminal hangs up or the view goes away.
fn read_keys(fd: RawFd, send: &mpsc::Sender<io::Result<KeyEvent>>) {
    loop {
        // Wait here, not in crossterm: poll reports the hang-up; crossterm would spin on it.
        if hung_up(fd, Duration::from_secs(3600)) {
            return;
        }
        let mut pending = true;
        while pending {
            let press = match event::poll(Duration::ZERO).and_then(|ready| ready.then(event::read).transpose()) {
                Ok(Some(Event::Key(key))) if key.kind == KeyEventKind::Press => Some(Ok(key)),
                Ok(Some(_)) => None,
                Ok(None) => {
                    pending = false;
                    None
                }
                Err(e) => Some(Err(e)),
            };
            if let Some(press) = press {
                let failed = press.is_err();
                if send.send(press).is_err() || failed {
                    return;
                }
            }
        }
    }
}

/// How long the view may take to end after a stop signal before its output is cut off.
const STALL_GRACE: Duration = Duration::from_secs(1);

/// Ends the view even when its terminal stopped taking output (XOFF, a stalled ssh link): a
/// write to a full terminal blocks, and a stop signal only restarts it. If the view has not
/// ended [`STALL_GRACE`] after a stop was asked for, standard output is pointed at /dev/null and
/// the view's thread signalled: the restarted write completes there, and the view ends as on
/// any stop (instance removed, VMs stopped).
pub struct StallGuard {
    ended: Arc<AtomicBool>,
}

impl StallGuard {
    /// Guard the calling thread's writes to the terminal.
    pub fn start() -> io::Result<StallGuard> {
        let ended = Arc::new(AtomicBool::new(false));
        // SAFETY: pthread_self has no preconditions. The view runs on the main thread, whose
        // handle stays valid until the process exits.
        let view = unsafe { libc::pthread_self() };
        let guard_ended = ended.clone();
        std::thread::Builder::new().name("stall-guard".into()).spawn(move || {
            while !virtprof_host::stop::requested() {
                std::thread::sleep(Duration::from_millis(100));
                if guard_ended.load(Ordering::Relaxed) {
                    return;
                }
            }
            std::thread::sleep(STALL_GRACE);
            if guard_ended.load(Ordering::Relaxed) {
                return;
            }
            to_dev_null(libc::STDOUT_FILENO);
            // SAFETY: a stop signal (handled: it only sets the stop flag) to the view's thread,
            // to interrupt its blocked write.
            unsafe { libc::pthread_kill(view, libc::SIGTERM) };
        })?;
        Ok(StallGuard { ended })
    }
}

impl Drop for StallGuard {
    fn drop(&mut self) {
        self.ended.store(true, Ordering::Relaxed);
    }
}

/// Point standard output and error at /dev/null where they are a terminal that hung up: what is
/// still written on the way out (the cursor shown again, a last message) would fail there, and
/// `eprintln!` panics on a failed write. True when standard output was such a terminal.
pub fn silence_if_hung_up() -> bool {
    let mut output_gone = false;
    for fd in [libc::STDOUT_FILENO, libc::STDERR_FILENO] {
        if !hung_up(fd, Duration::ZERO) {
            continue;
        }
        output_gone |= fd == libc::STDOUT_FILENO;
        to_dev_null(fd);
    }
    output_gone
}

/// Point the standard descriptor `fd` at /dev/null: later writes to it succeed and go nowhere.
fn to_dev_null(fd: RawFd) {
    if let Ok(null) = File::options().write(true).open("/dev/null") {
        // SAFETY: dup2 onto a standard descriptor this process owns; `null` stays valid for
        // the call.
        unsafe { libc::dup2(null.as_raw_fd(), fd) };
    }
}

/// Whether `err` is the view's failed write to a terminal that hung up (EIO).
pub fn is_hang_up(err: &anyhow::Error) -> bool {
    err.chain().any(|e| e.downcast_ref::<io::Error>().is_some_and(|e| e.raw_os_error() == Some(libc::EIO)))
}

/// Wait up to `timeout` for input on `fd`; true when the terminal behind it is gone (hung up,
/// in error, or closed), false when input is there or the time is up.
fn hung_up(fd: RawFd, timeout: Duration) -> bool {
    let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: one valid pollfd for the length given.
    let n = unsafe { libc::poll(&mut p, 1, ms) };
    if n < 0 {
        // Interrupted by a signal: not a hang-up; any other failure means no terminal to read.
        return io::Error::last_os_error().kind() != io::ErrorKind::Interrupted;
    }
    n > 0 && p.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0
}
