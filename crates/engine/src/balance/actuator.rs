//! The actuator: vCPU threads pinned one core each, and swaps that exchange two threads'
//! affinities. Every thread gets its original affinity back when the actuator is dropped, so
//! an interrupted `balance` leaves the VMs as it found them; killed, its reaper gives it back.

use virtprof_host::affinity;
use virtprof_host::reaper::{self, Undo};

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
    /// `Ok(false)`: the thread has exited (its VM is shutting down), nothing moved.
    pub fn set(&mut self, tid: u32, cpu: u32) -> anyhow::Result<bool> {
        let gone = |e: &std::io::Error| e.raw_os_error() == Some(libc::ESRCH);
        if !self.original.iter().any(|(t, _)| *t == tid) {
            match affinity::get(tid) {
                Ok(before) => {
                    reaper::watch(&Undo::Affinity { tid, cpus: before.clone() });
                    self.original.push((tid, before));
                }
                Err(e) if gone(&e) => return Ok(false),
                Err(e) => anyhow::bail!("reading the CPU affinity of vCPU thread {tid}: {e}"),
            }
        }
        match affinity::set(tid, &[cpu]) {
            Ok(()) => Ok(true),
            Err(e) if gone(&e) => Ok(false),
            Err(e) => anyhow::bail!("pinning vCPU thread {tid} to CPU {cpu}: {e}"),
        }
    }
}

impl Drop for Actuator {
    fn drop(&mut self) {
        for (tid, cpus) in &self.original {
            // A thread that exited has nothing to restore.
            if let Err(e) = affinity::set(*tid, cpus) {
                log::debug!("restoring the affinity of thread {tid}: {e}");
            }
            reaper::done(&Undo::Affinity { tid: *tid, cpus: cpus.clone() });
        }
    }
}
