//! The actuator: vCPU threads pinned one core each, and swaps that exchange two threads'
//! affinities. Every thread gets its original affinity back when the actuator is dropped, so
//! an interrupted `balance` leaves the VMs as it found them.

use virtprof_host::affinity;

/// Pinned threads and what they had before.
pub struct Actuator {
    original: Vec<(u32, Vec<u32>)>,
}

impl Actuator {
    /// Nothing moved yet.
    pub fn new() -> Actuator {
        Actuator { original: Vec::new() }
    }

    /// Move thread `tid` to `cpu`, remembering its affinity the first time it is moved.
    pub fn set(&mut self, tid: u32, cpu: u32) -> anyhow::Result<()> {
        if !self.original.iter().any(|(t, _)| *t == tid) {
            let before = affinity::get(tid)
                .map_err(|e| anyhow::anyhow!("reading the CPU affinity of vCPU thread {tid}: {e}"))?;
            self.original.push((tid, before));
        }
        affinity::set(tid, &[cpu]).map_err(|e| anyhow::anyhow!("pinning vCPU thread {tid} to CPU {cpu}: {e}"))
    }
}

impl Drop for Actuator {
    fn drop(&mut self) {
        for (tid, cpus) in &self.original {
            // A thread that exited has nothing to restore.
            if let Err(e) = affinity::set(*tid, cpus) {
                log::debug!("restoring the affinity of thread {tid}: {e}");
            }
        }
    }
}
