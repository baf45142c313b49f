//! The status file a running `balance` keeps in [`DIR`] (`balance-PID.json`: swaps so far and
//! its per-core accounts), so `top` can show swaps/s and the balancer's own energy figures.
//! Written by rename, removed when the run ends.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Where status files live.
pub const DIR: &str = "/run/virtprof";

/// What a running balancer publishes.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Status {
    /// The balancer's pid.
    pub pid: u32,
    /// Swaps carried out so far.
    pub swaps: u64,
    /// Per core: (CPU, J since start, W over the last period, °C).
    pub cores: Vec<(u32, f64, f64, f64)>,
}

/// This process's status file; removed on drop.
pub struct StatusFile {
    path: Option<PathBuf>,
}

impl StatusFile {
    /// Create the directory if needed; without it (not root) there is simply no status file.
    pub fn create() -> StatusFile {
        let path = std::fs::create_dir_all(DIR)
            .ok()
            .map(|()| PathBuf::from(DIR).join(format!("balance-{}.json", std::process::id())));
        let file = StatusFile { path };
        file.publish(0, Vec::new());
        file
    }

    /// Publish the swap count and the cores' accounts.
    pub fn publish(&self, swaps: u64, cores: Vec<(u32, f64, f64, f64)>) {
        let Some(path) = &self.path else { return };
        let status = Status { pid: std::process::id(), swaps, cores };
        let tmp = path.with_extension("tmp");
        let written = std::fs::write(&tmp, serde_json::to_vec(&status).expect("status serializes"))
            .and_then(|()| std::fs::rename(&tmp, path));
        if let Err(e) = written {
            log::debug!("status file {}: {e}", path.display());
        }
    }
}

impl Drop for StatusFile {
    fn drop(&mut self) {
        if let Some(path) = &self.path {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Every live balancer's status.
pub fn read_all() -> Vec<Status> {
    let Ok(entries) = std::fs::read_dir(DIR) else { return Vec::new() };
    entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".json"))
        .filter_map(|e| serde_json::from_slice::<Status>(&std::fs::read(e.path()).ok()?).ok())
        .filter(|s| std::path::Path::new(&format!("/proc/{}", s.pid)).exists())
        .collect()
}
