//! The shared secret of the agent link and of `serve`'s scrapers: a token file's first line.

use std::path::Path;

use crate::usage;

/// A token file's first line (a secret: read with a size limit, never echoed).
pub fn read_token(path: &Path) -> anyhow::Result<String> {
    let text = virtprof_host::input::read_text(path, "token file", 4096).map_err(|e| usage(e.to_string()))?;
    let token = text.lines().next().unwrap_or("").trim().to_string();
    warn_if_others_can_read(path);
    if token.len() < 8 {
        return Err(usage(format!("token file '{}': the token needs 8 characters or more", path.display())));
    }
    Ok(token)
}

/// A secret others on the host can read is no secret: say so (the run goes on; the file is
/// the user's to fix).
fn warn_if_others_can_read(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(meta) = std::fs::metadata(path) {
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o004 != 0 {
            eprintln!(
                "virtprof: warning: token file '{}' is readable by every user (mode {mode:04o}); chmod 600 it",
                path.display()
            );
        }
    }
}
