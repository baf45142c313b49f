//! Guest memory taken back by the host (`--reclaim-hz`), as a balloon driver or free page
//! reporting returns pages: the VMM removes the `touch` buffers' pages from guest RAM at a
//! fixed rate (`madvise(MADV_REMOVE)` on the shared memfd, as QEMU discards a RAM block), so
//! KVM unmaps them (`kvm_unmap_hva_range`) and must fault each one in again the next time the
//! guest touches it: a fault storm of known size.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

use crate::error::VmmError;
use crate::guest::layout;

/// The thread's name.
pub(crate) const NAME: &str = "reclaim";

/// The host range of every vCPU's buffer (they are contiguous).
pub(crate) struct Buffers {
    start: usize,
    len: usize,
}

impl Buffers {
    /// The buffers of a VM with `vcpus` vCPUs in `memory`.
    pub fn of(memory: &GuestMemoryMmap, vcpus: u32) -> Result<Buffers, VmmError> {
        let first = GuestAddress(layout::noise_buffer(0));
        let start = memory.get_host_address(first).map_err(|e| VmmError::Memory(e.to_string()))?;
        Ok(Buffers { start: start as usize, len: (layout::NOISE_AREA * u64::from(vcpus)) as usize })
    }

    /// Remove their pages from guest RAM.
    fn remove(&self) -> Result<(), VmmError> {
        // SAFETY: the range lies inside guest RAM, a shared mapping that outlives this thread;
        // removing its pages only makes the next access read zeros, which no one relies on.
        let done = unsafe { libc::madvise(self.start as *mut libc::c_void, self.len, libc::MADV_REMOVE) };
        if done != 0 {
            return Err(VmmError::Os {
                what: "madvise(MADV_REMOVE) of the touch buffers".into(),
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(())
    }
}

/// Remove the buffers' pages `hz` times a second while `running`; how many times it did.
pub(crate) fn run(buffers: &Buffers, hz: u32, running: &AtomicBool) -> Result<u64, VmmError> {
    let period = Duration::from_secs(1) / hz.max(1);
    let mut next = Instant::now() + period;
    let mut done = 0;
    while running.load(Ordering::Relaxed) {
        // Short sleeps, so the thread ends soon after the guests do.
        let now = Instant::now();
        if now < next {
            std::thread::sleep((next - now).min(Duration::from_millis(5)));
            continue;
        }
        buffers.remove()?;
        done += 1;
        next += period;
    }
    Ok(done)
}
