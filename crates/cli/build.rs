//! Stamps the commit the binary is built from into `--version` (`VIRTPROF_COMMIT`): from the
//! environment where set (a source tarball's build), else from git, else "unknown commit".

use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=VIRTPROF_COMMIT");
    let commit = std::env::var("VIRTPROF_COMMIT").ok().filter(|c| !c.is_empty()).or_else(git_commit);
    println!("cargo:rustc-env=VIRTPROF_COMMIT={}", commit.as_deref().unwrap_or("unknown commit"));
}

/// HEAD's short hash, rebuilding when HEAD moves.
fn git_commit() -> Option<String> {
    let git = |args: &[&str]| -> Option<String> {
        let out = Command::new("git").args(args).output().ok()?;
        out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    let git_dir = git(&["rev-parse", "--absolute-git-dir"])?;
    // HEAD names a branch; the branch's file (or packed-refs) moves at each commit.
    for file in ["HEAD", "packed-refs"] {
        println!("cargo:rerun-if-changed={git_dir}/{file}");
    }
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        let reference = Path::new(&git_dir).join(branch);
        println!("cargo:rerun-if-changed={}", reference.display());
    }
    git(&["rev-parse", "--short=12", "HEAD"])
}
