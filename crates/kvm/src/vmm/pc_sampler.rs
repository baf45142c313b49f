//! Program-counter sampling from the VMM (`virtprof boot --testvm`): a timer in the VMM's main
//! thread kicks every vCPU thread with a signal; the signal makes `KVM_RUN` return (`EINTR`,
//! through `kvm_run.immediate_exit` so a kick landing just before entry is not lost), and the
//! vCPU thread reads RIP and CPL before it re-enters. A kick that lands while the VMM is
//! handling an exit is a hypervisor-realm sample: the guest was not running.

use std::cell::Cell;
use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicU8, Ordering};
use std::time::Duration;

use kvm_ioctls::VcpuFd;

use virtprof_model::pcsample::{PcSample, Realm};

use super::exits::exit_reason_name;
use crate::error::VmmError;
use virtprof_host::monotonic_ns;

thread_local! {
    /// True while this thread is inside `KVM_RUN` (or about to enter it).
    static IN_RUN: Cell<bool> = const { Cell::new(false) };
    /// Set by the signal handler when a kick arrived outside `KVM_RUN`.
    static LANDED_IN_VMM: Cell<bool> = const { Cell::new(false) };
    /// This thread's `kvm_run.immediate_exit` byte.
    static IMMEDIATE_EXIT: AtomicPtr<u8> = const { AtomicPtr::new(std::ptr::null_mut()) };
}

/// The kick signal: a real-time signal nothing else in the VMM uses.
fn kick_signal() -> c_int {
    libc::SIGRTMIN() + 4
}

extern "C" fn on_kick(_signal: c_int) {
    // Only const-initialized, drop-free thread-locals are touched: no allocation, no locks.
    let byte = IMMEDIATE_EXIT.with(|p| p.load(Ordering::Relaxed));
    if !byte.is_null() {
        // SAFETY: the pointer is this thread's mapped kvm_run structure, set by `PcSampler::new`
        // and valid while the vCPU fd lives; the kernel reads the byte at the next KVM_RUN.
        unsafe { AtomicU8::from_ptr(byte) }.store(1, Ordering::Relaxed);
    }
    if !IN_RUN.with(Cell::get) {
        LANDED_IN_VMM.with(|f| f.set(true));
    }
}

/// Install the kick handler (process-wide; only vCPU threads are ever sent the signal).
pub(crate) fn install_handler() -> Result<(), VmmError> {
    // SAFETY: sigaction is plain data; zeroed is a valid empty mask and no flags.
    let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
    action.sa_sigaction = on_kick as extern "C" fn(c_int) as usize;
    // No SA_RESTART: KVM_RUN must return EINTR.
    action.sa_flags = 0;
    // SAFETY: `action` is fully initialized and the handler is async-signal-safe.
    if unsafe { libc::sigaction(kick_signal(), &action, std::ptr::null_mut()) } != 0 {
        return Err(VmmError::Os {
            what: "installing the sampling signal handler".into(),
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(())
}

/// Shared between the kicking thread and one vCPU thread.
#[derive(Debug, Default)]
pub(crate) struct KickSlot {
    /// The vCPU thread's pthread id (0 until it starts).
    thread: AtomicU64,
    pending: AtomicBool,
    /// When the pending kick was sent, ns since sampling started.
    kicked_at: AtomicU64,
}

/// The vCPU side: records one sample per kick.
pub(crate) struct PcSampler<'a> {
    slot: &'a KickSlot,
    index: u32,
    samples: Vec<PcSample>,
}

impl<'a> PcSampler<'a> {
    /// Arm sampling on the calling (vCPU) thread.
    pub fn new(vcpu: &mut VcpuFd, slot: &'a KickSlot, index: u32) -> Self {
        let run = vcpu.get_kvm_run();
        IMMEDIATE_EXIT.with(|p| p.store(std::ptr::addr_of_mut!(run.immediate_exit), Ordering::Relaxed));
        // SAFETY: pthread_self has no preconditions.
        slot.thread.store(unsafe { libc::pthread_self() }, Ordering::Release);
        PcSampler { slot, index, samples: Vec::with_capacity(4096) }
    }

    /// Call right before `KVM_RUN`.
    pub fn entering(&self) {
        IN_RUN.with(|f| f.set(true));
    }

    /// Call right after `KVM_RUN` returned; `interrupted` when it returned EINTR, `last_exit`
    /// the exit the VMM handled before (what a kick outside `KVM_RUN` interrupted).
    pub fn left(&mut self, vcpu: &VcpuFd, interrupted: bool, last_exit: u32) -> Result<(), VmmError> {
        IN_RUN.with(|f| f.set(false));
        if !interrupted {
            return Ok(());
        }
        let byte = IMMEDIATE_EXIT.with(|p| p.load(Ordering::Relaxed));
        // SAFETY: as in `on_kick`: this thread's live kvm_run mapping.
        unsafe { AtomicU8::from_ptr(byte) }.store(0, Ordering::Relaxed);
        if !self.slot.pending.swap(false, Ordering::AcqRel) {
            return Ok(());
        }
        let in_vmm = LANDED_IN_VMM.with(|f| f.replace(false));
        let rip = super::arch::program_counter(vcpu)?;
        let (realm, activity) = if in_vmm {
            (Realm::Hypervisor, format!("vmm:{}", exit_reason_name(last_exit)))
        } else {
            let cpl = super::arch::privilege_level(vcpu)?;
            (Realm::of_cpl(cpl), String::new())
        };
        let t_ns = self.slot.kicked_at.load(Ordering::Acquire);
        self.samples.push(PcSample { t_ns, vcpu: self.index, rip, realm, activity });
        Ok(())
    }
}

impl PcSampler<'_> {
    /// Disarm sampling on this thread and hand over the samples.
    pub fn into_samples(mut self) -> Vec<PcSample> {
        std::mem::take(&mut self.samples)
    }
}

impl Drop for PcSampler<'_> {
    fn drop(&mut self) {
        IMMEDIATE_EXIT.with(|p| p.store(std::ptr::null_mut(), Ordering::Relaxed));
    }
}

/// The kicking side: the VMM's main thread, at `hz`.
pub(crate) struct Kicker {
    period: Duration,
    start_ns: u64,
    next_ns: u64,
}

impl Kicker {
    pub fn new(hz: u32) -> Self {
        let start_ns = monotonic_ns();
        Kicker { period: Duration::from_secs(1) / hz.max(1), start_ns, next_ns: start_ns }
    }

    /// CLOCK_MONOTONIC when sampling started.
    pub fn start_ns(&self) -> u64 {
        self.start_ns
    }

    /// Sleep to the next tick, then kick every thread whose slot is idle.
    /// A slot still pending from the last tick is not kicked again: its vCPU has not been
    /// back in the VMM since, and one sample per tick is all a tick may add.
    pub fn tick(&mut self, slots: &[KickSlot]) {
        self.next_ns += self.period.as_nanos() as u64;
        let now = monotonic_ns();
        if self.next_ns > now {
            std::thread::sleep(Duration::from_nanos(self.next_ns - now));
        } else {
            // Fell behind (the host was busy): skip ticks rather than burst.
            self.next_ns = now;
        }
        let t = monotonic_ns() - self.start_ns;
        for slot in slots {
            let thread = slot.thread.load(Ordering::Acquire);
            if thread == 0 || slot.pending.load(Ordering::Acquire) {
                continue;
            }
            slot.kicked_at.store(t, Ordering::Release);
            slot.pending.store(true, Ordering::Release);
            // SAFETY: the thread handle stays valid until it is joined, which happens after
            // the kicking loop ends; an exited thread only makes pthread_kill return ESRCH.
            unsafe { libc::pthread_kill(thread, kick_signal()) };
        }
    }
}
