//! Read a running testvm guest's application counters from another process. The VMM backs
//! guest RAM with a memfd named [`layout::GUEST_RAM_NAME`]; we borrow that fd (`pidfd_getfd`)
//! and map it read-only, so sampling a counter is one memory load, at any interval.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use virtprof_model::appcounters;

use crate::error::StatsError;
use crate::guest::layout::{self, shared};
use crate::remote::PidFd;

/// One vCPU's application-layer counters, as its guest published them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AppCounters {
    /// Workload iterations completed.
    pub iterations: u64,
    /// Index of the phase running now.
    pub phase: u64,
}

/// A read-only view of a testvm VM's guest RAM.
pub struct GuestCounters {
    map: memmap2::Mmap,
    /// Per vCPU, the slots of `iterations` and `phase`, found by name once.
    slots: Vec<std::sync::OnceLock<(usize, usize)>>,
}

impl GuestCounters {
    /// Map the guest RAM of VMM `pid`; `Ok(None)` when the process is not a virtprof testvm.
    pub fn attach(proc_root: &Path, pid: u32) -> Result<Option<Self>, StatsError> {
        let dir = proc_root.join(pid.to_string()).join("fd");
        let entries = std::fs::read_dir(&dir).map_err(|e| StatsError::Proc { path: dir.clone(), source: e })?;
        let wanted = format!("/memfd:{}", layout::GUEST_RAM_NAME);
        let fd = entries.filter_map(Result::ok).find_map(|entry| {
            let target = std::fs::read_link(entry.path()).ok()?;
            target.to_str()?.starts_with(&wanted).then(|| entry.file_name().to_str()?.parse::<i32>().ok())?
        });
        let Some(fd) = fd else { return Ok(None) };
        let file = PidFd::open(pid)?.get_fd(pid, fd)?;
        // SAFETY: a read-only shared mapping of the guest RAM file. The guest and VMM keep
        // writing it, so every read goes through atomics (`load`), never through references
        // to plain memory that could change under us.
        let map = unsafe { memmap2::MmapOptions::new().len(layout::RAM_SIZE as usize).map(&file) }
            .map_err(|e| StatsError::Proc { path: dir, source: e })?;
        let slots = (0..layout::MAX_VCPUS).map(|_| std::sync::OnceLock::new()).collect();
        Ok(Some(GuestCounters { map, slots }))
    }

    fn load(&self, gpa: u64) -> u64 {
        let offset = gpa as usize;
        assert!(offset % 8 == 0 && offset + 8 <= self.map.len(), "shared-page offsets are aligned and inside RAM");
        // SAFETY: the address is 8-byte aligned and inside the mapping (checked above), the
        // mapping lives as long as `self`, and AtomicU64 has u64's layout; the guest writes
        // these words concurrently, which atomics allow.
        unsafe { AtomicU64::from_ptr(self.map.as_ptr().add(offset).cast_mut().cast()) }.load(Ordering::Acquire)
    }

    /// vCPU `index`'s counters, or None if that vCPU's shared page is not (yet) set up.
    pub fn read(&self, index: u32) -> Option<AppCounters> {
        if index >= layout::MAX_VCPUS {
            return None;
        }
        let page = layout::shared_page(index);
        if self.load(page + shared::MAGIC) != shared::MAGIC_VALUE {
            return None;
        }
        // The guest's counters in the published layout, read the way any reader reads them:
        // by name (once per vCPU). The header is the VMM's, written before the vCPU ran.
        let base = page + shared::COUNTERS;
        let cached = self.slots.get(usize::try_from(index).ok()?)?;
        let &(iterations, phase) = match cached.get() {
            Some(slots) => slots,
            None => {
                let words = appcounters::size(shared::counter_slots().len()) / 8;
                let bytes: Vec<u8> = (0..words).flat_map(|w| self.load(base + 8 * w as u64).to_le_bytes()).collect();
                let header = appcounters::parse(&bytes).ok()?;
                let slot = |name: &str| header.slots.iter().position(|s| s.name == name);
                let found = (slot("iterations")?, slot("phase")?);
                cached.get_or_init(|| found)
            }
        };
        let value = |i: usize| self.load(base + appcounters::value_offset(i) as u64);
        Some(AppCounters { iterations: value(iterations), phase: value(phase) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_without_guest_ram_is_not_a_testvm() {
        let me = std::process::id();
        assert!(GuestCounters::attach(Path::new("/proc"), me).unwrap().is_none());
    }
}
