//! Exit codes and how errors become them: 0 success, 1 runtime failure, 2 bad input or a host
//! that cannot run the command (no /dev/kvm, no permission).

use std::process::ExitCode;

use virtprof_kvm::VmmError;

/// Bad input, or the host lacks what the command needs.
pub const USAGE: u8 = 2;
/// The command started but failed.
pub const FAILURE: u8 = 1;

/// An error caused by the user's input, with the fix in its message.
#[derive(Debug)]
pub struct UsageError(pub String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// Shorthand for returning a usage error.
pub fn usage(message: impl Into<String>) -> anyhow::Error {
    UsageError(message.into()).into()
}

/// Print `virtprof: error chain` on one line and choose the exit code.
pub fn report(err: &anyhow::Error) -> ExitCode {
    if is_broken_pipe(err) {
        // `virtprof ... | head` closing the pipe is not a failure.
        return ExitCode::SUCCESS;
    }
    eprintln!("virtprof: {err:#}");
    ExitCode::from(classify(err))
}

fn classify(err: &anyhow::Error) -> u8 {
    for cause in err.chain() {
        if cause.is::<UsageError>() {
            return USAGE;
        }
        if let Some(VmmError::OpenKvm(_)) = cause.downcast_ref::<VmmError>() {
            return USAGE;
        }
    }
    FAILURE
}

fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
