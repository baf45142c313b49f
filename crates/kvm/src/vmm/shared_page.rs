//! The per-vCPU page both sides write: the VMM publishes its counters and the stop flag, the
//! guest publishes its application counters (iterations, phase). Accesses are atomic because
//! the guest runs concurrently on another thread.

use std::sync::atomic::{AtomicU64, Ordering};

use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

use crate::error::VmmError;
use crate::guest::layout;

/// A host view of one vCPU's shared page.
#[derive(Clone)]
pub(crate) struct SharedPage {
    base: *mut u8,
}

// SAFETY: the page lives in guest RAM owned by the `Vm`, which outlives every thread that
// holds a `SharedPage` (they run inside `std::thread::scope`), and all access is atomic.
unsafe impl Send for SharedPage {}

impl SharedPage {
    pub(crate) fn new(memory: &GuestMemoryMmap, index: u32) -> Result<Self, VmmError> {
        let gpa = GuestAddress(layout::shared_page(index));
        let base = memory.get_host_address(gpa).map_err(|e| VmmError::Memory(e.to_string()))?;
        Ok(SharedPage { base })
    }

    fn slot(&self, offset: u64) -> &AtomicU64 {
        debug_assert!(offset % 8 == 0 && offset < 4096);
        // SAFETY: `offset` is an 8-byte aligned offset inside the page (the layout constants),
        // the page is mapped for the VM's lifetime, and AtomicU64 has u64's layout.
        unsafe { AtomicU64::from_ptr(self.base.add(offset as usize).cast()) }
    }

    pub(crate) fn load(&self, offset: u64) -> u64 {
        self.slot(offset).load(Ordering::Acquire)
    }

    pub(crate) fn store(&self, offset: u64, value: u64) {
        self.slot(offset).store(value, Ordering::Release)
    }
}
