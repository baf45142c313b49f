//! Exit codes and how errors become them: 0 success, 1 runtime failure, 2 bad input or a host
//! that cannot run the command (no /dev/kvm, no permission).

use std::io::Write;
use std::process::ExitCode;

use virtprof_host::input::InputError;
use virtprof_host::output::OutputError;
use virtprof_kvm::VmmError;
use virtprof_session::SessionError;
use virtprof_sinks::SinkError;
use virtprof_trace::TraceError;

pub use virtprof_engine::{usage, UsageError};

/// Bad input, or the host lacks what the command needs.
pub const USAGE: u8 = 2;
/// The command started but failed.
pub const FAILURE: u8 = 1;

/// Print `virtprof: error chain` on one line and choose the exit code.
pub fn report(err: &anyhow::Error) -> ExitCode {
    if is_broken_pipe(err) {
        // `virtprof ... | head` closing the pipe is not a failure.
        return ExitCode::SUCCESS;
    }
    // Not eprintln!: it panics when standard error has gone too (a closed terminal), and the
    // exit code is the one thing left to say then.
    let _ = writeln!(std::io::stderr(), "virtprof: {}", virtprof_model::units::printable(&one_line(err)));
    ExitCode::from(classify(err))
}

/// The error chain on one line, `outer: inner: ...`, leaving out a cause whose text the line
/// already contains (library errors often embed their OS error in their own message).
fn one_line(err: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in err.chain() {
        let text = cause.to_string();
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

fn classify(err: &anyhow::Error) -> u8 {
    for cause in err.chain() {
        if cause.is::<UsageError>() {
            return USAGE;
        }
        if let Some(VmmError::OpenKvm(_)) = cause.downcast_ref::<VmmError>() {
            return USAGE;
        }
        if cause.downcast_ref::<SessionError>().is_some_and(SessionError::is_bad_input) {
            return USAGE;
        }
        if cause.downcast_ref::<SinkError>().is_some_and(SinkError::is_bad_input) {
            return USAGE;
        }
        if cause.downcast_ref::<TraceError>().is_some_and(TraceError::is_bad_input) {
            return USAGE;
        }
        if cause.downcast_ref::<InputError>().is_some_and(InputError::is_bad_input) {
            return USAGE;
        }
        // An output path that cannot be opened is the user's to fix; a disk that fills is not.
        if cause.downcast_ref::<OutputError>().is_some_and(OutputError::is_bad_path) {
            return USAGE;
        }
    }
    FAILURE
}

fn is_broken_pipe(err: &anyhow::Error) -> bool {
    use std::io::ErrorKind::BrokenPipe;
    err.chain().any(|c| {
        c.downcast_ref::<std::io::Error>().is_some_and(|e| e.kind() == BrokenPipe)
            || c.downcast_ref::<serde_json::Error>().is_some_and(|e| e.io_error_kind() == Some(BrokenPipe))
            || c.downcast_ref::<SinkError>().is_some_and(SinkError::is_broken_pipe)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_drops_repeated_causes() {
        let os = std::io::Error::from_raw_os_error(libc::EACCES);
        let err = anyhow::Error::new(VmmError::Os { what: "pinning".into(), source: os }).context("running VM 0");
        assert_eq!(one_line(&err), "running VM 0: pinning: Permission denied (os error 13)");
    }
}
