//! Ends the `wfi` workload's waits. With no interrupt controller in the VM, nothing else would
//! end a trapped WFI: [`WAIT`] after a vCPU's line went down, the VMM's main thread raises it
//! (KVM then finds the vCPU runnable and its WFI completes); the guest takes the interrupt
//! right after the WFI and acknowledges it with a store to [`ports::WAKE_ACK`], and the vCPU
//! thread lowers the line before the guest runs on. So the line is down whenever a WFI starts,
//! and every WFI traps to KVM and waits about [`WAIT`].
//!
//! [`ports::WAKE_ACK`]: crate::guest::layout::ports::WAKE_ACK

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use kvm_ioctls::VmFd;
use virtprof_host::monotonic_ns;

use crate::error::VmmError;

/// How long a WFI waits before the VMM wakes it.
pub(crate) const WAIT: Duration = Duration::from_millis(1);

/// One vCPU's line: since when (CLOCK_MONOTONIC ns) it has been down, or 0 while it is up.
pub(crate) struct WakeSlot {
    down_since_ns: AtomicU64,
}

impl WakeSlot {
    pub(crate) fn new() -> Self {
        WakeSlot { down_since_ns: AtomicU64::new(monotonic_ns().max(1)) }
    }

    /// The main thread: raise the line if it has been down for [`WAIT`].
    pub(crate) fn tick(&self, vm: &VmFd, index: u32) -> Result<(), VmmError> {
        let since = self.down_since_ns.load(Ordering::Acquire);
        if since == 0 || monotonic_ns().saturating_sub(since) < WAIT.as_nanos() as u64 {
            return Ok(());
        }
        self.down_since_ns.store(0, Ordering::Release);
        super::arch::set_wake_line(vm, index, true)
    }

    /// The vCPU thread, at the guest's acknowledgement: lower the line before the guest runs on.
    pub(crate) fn acknowledged(&self, vm: &VmFd, index: u32) -> Result<(), VmmError> {
        super::arch::set_wake_line(vm, index, false)?;
        self.down_since_ns.store(monotonic_ns().max(1), Ordering::Release);
        Ok(())
    }
}
