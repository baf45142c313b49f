//! One vCPU thread: pin, snapshot schedstat and KVM stats, run `KVM_RUN` until the guest's
//! "done" marker, then report. Exit classification is the free function [`classify`], so tests
//! can feed it fabricated exits.

use std::time::Duration;

use kvm_ioctls::{VcpuExit, VcpuFd, VmFd};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use virtprof_model::testvm::{GuestNoise, NoiseRecord, PhaseReport, SyncPoint, VcpuReport};

use super::exits::exit_reason_name;
use super::kvm_err;
use super::pc_sampler::{KickSlot, PcSampler};
use super::shared_page::SharedPage;
use super::wake::WakeSlot;
use crate::error::VmmError;
use crate::guest::layout::{self, ports, shared};
use crate::guest::SYNC_ROUNDS;
use crate::guest::{GuestProgram, Script};
use crate::stats::StatsFd;
use virtprof_host::{monotonic_ns, read_schedstat};

/// Everything a vCPU thread borrows from its VM.
pub(crate) struct VcpuContext<'a> {
    pub index: u32,
    pub pin: Option<u32>,
    pub io_latency: Duration,
    pub steal_time: bool,
    pub script: &'a Script,
    pub program: &'a GuestProgram,
    pub memory: &'a GuestMemoryMmap,
    pub page: SharedPage,
    /// Where the VMM's sampling timer kicks this vCPU, when sampling.
    pub kick: Option<&'a KickSlot>,
    /// The VM and this vCPU's wake-up line, when the script waits in WFI.
    pub wake: Option<(&'a VmFd, &'a WakeSlot)>,
    /// The VMM's I/O thread, when `io-bound` requests go to it.
    pub io: Option<super::io_thread::IoRequests>,
}

/// What the VMM does about one return from `KVM_RUN`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Action {
    /// Count it and re-enter the guest.
    Resume,
    /// A phase marker: the guest starts phase N.
    Phase(u32),
    /// The guest finished.
    Done,
    /// An `io-bound` request: sleep, then resume.
    Block,
    /// An exception reached a fault stub (vector).
    Fault(u32),
    /// A clock-sync exit of the noise workload.
    Sync,
    /// The guest took the interrupt that ended its WFI.
    WakeAck,
    /// Something the test bed never asks for.
    Unexpected(String),
}

/// Decide what an exit means for the test bed.
pub(crate) fn classify(exit: &VcpuExit<'_>) -> Action {
    let first_u32 =
        |data: &[u8]| data.iter().take(4).enumerate().fold(0u32, |acc, (i, b)| acc | u32::from(*b) << (8 * i));
    // Without port I/O (arm64) the guest stores to the port window instead.
    if let VcpuExit::MmioWrite(addr, data) = exit {
        if let Some(port) = layout::port_at(*addr) {
            return classify(&VcpuExit::IoOut(port, data));
        }
    }
    match exit {
        // HLT reaches the VMM only from the CPL0 `hlt` workload (at CPL3 it faults).
        VcpuExit::IoOut(ports::PIO_USER, _) | VcpuExit::Intr | VcpuExit::Hlt => Action::Resume,
        VcpuExit::IoOut(ports::PHASE, data) => Action::Phase(first_u32(data)),
        VcpuExit::IoOut(ports::DONE, _) => Action::Done,
        VcpuExit::IoOut(ports::IO_BLOCK, _) => Action::Block,
        VcpuExit::IoOut(ports::SYNC, _) => Action::Sync,
        VcpuExit::IoOut(ports::WAKE_ACK, _) => Action::WakeAck,
        VcpuExit::IoOut(ports::FAULT, data) => Action::Fault(first_u32(data)),
        VcpuExit::MmioWrite(layout::MMIO_USER_ADDR, _) => Action::Resume,
        VcpuExit::IoOut(port, _) => Action::Unexpected(format!("OUT to unexpected port {port:#x}")),
        VcpuExit::IoIn(port, _) => Action::Unexpected(format!("IN from unexpected port {port:#x}")),
        VcpuExit::MmioWrite(addr, _) => Action::Unexpected(format!("MMIO write to unexpected address {addr:#x}")),
        VcpuExit::MmioRead(addr, _) => Action::Unexpected(format!("MMIO read from unexpected address {addr:#x}")),
        VcpuExit::Shutdown => Action::Unexpected("KVM_EXIT_SHUTDOWN: the guest triple-faulted".into()),
        VcpuExit::FailEntry(reason, cpu) => {
            Action::Unexpected(format!("KVM_EXIT_FAIL_ENTRY: hardware entry failure reason {reason:#x} on CPU {cpu}"))
        }
        VcpuExit::InternalError => {
            Action::Unexpected("KVM_EXIT_INTERNAL_ERROR: KVM could not emulate an instruction".into())
        }
        other => Action::Unexpected(format!("unexpected exit {other:?}")),
    }
}

/// Phase-marker bookkeeping: when each phase began, how many iterations were done then, and
/// KVM's `exits` stat at that marker (None where the stats fd has no such counter).
struct PhaseClock {
    starts: Vec<(u64, u64)>,
    exits_at: Vec<Option<u64>>,
    done: Option<(u64, u64)>,
}

/// Run one vCPU to its done marker; returns its report and the fd (kept open by the caller).
pub(crate) fn run_vcpu(
    mut vcpu: VcpuFd,
    stats: &StatsFd,
    ctx: VcpuContext<'_>,
) -> Result<(VcpuReport, VcpuFd), VmmError> {
    if let Some(cpu) = ctx.pin {
        pin_current_thread(cpu)
            .map_err(|source| VmmError::Os { what: format!("pinning vcpu{} to CPU {cpu}", ctx.index), source })?;
    }
    let stats_before = stats.read()?;
    let sched_before = read_schedstat();
    let mut exits_by_reason = [0u64; 64];
    let mut clock = PhaseClock {
        starts: Vec::with_capacity(ctx.script.phases.len()),
        exits_at: Vec::with_capacity(ctx.script.phases.len() + 1),
        done: None,
    };
    let (mut io_exits, mut mmio_exits, mut total) = (0u64, 0u64, 0u64);

    let mut sampler = ctx.kick.map(|slot| PcSampler::new(&mut vcpu, slot, ctx.index));
    let mut last_reason = 0;
    let mut sync = Vec::new();
    // Kicks that land inside the noise loop (between its two brackets of sync exits), and the
    // thread's schedstat where the loop starts and ends (its steal is summed over the loop).
    let mut loop_kicks = 0u64;
    let mut iterations_at_return = 0u64;
    let mut loop_sched = (None, None);

    while clock.done.is_none() {
        if let Some(s) = &sampler {
            s.entering();
        }
        let (action, interrupted) = match vcpu.run() {
            Ok(exit) => (classify(&exit), false),
            Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => (Action::Resume, true),
            Err(e) => return Err(kvm_err("KVM_RUN")(e)),
        };
        if let Some(s) = sampler.as_mut() {
            s.left(&vcpu, interrupted, last_reason)?;
        }
        // A kick counts when the loop ran since the previous return: one that lands while
        // this thread handles an exit returns at once from the next KVM_RUN, unseen by the
        // guest (its time falls into that exit's gap).
        let iterations = ctx.page.load(shared::ITERATIONS);
        if interrupted && sync.len() as u64 == SYNC_ROUNDS && iterations != iterations_at_return {
            loop_kicks += 1;
        }
        iterations_at_return = iterations;
        let reason = vcpu.get_kvm_run().exit_reason;
        if !interrupted {
            last_reason = reason;
        }
        exits_by_reason[(reason as usize).min(63)] += 1;
        total += 1;
        match reason {
            kvm_bindings::KVM_EXIT_IO => io_exits += 1,
            kvm_bindings::KVM_EXIT_MMIO => mmio_exits += 1,
            _ => {}
        }
        ctx.page.store(shared::VMM_USERSPACE_EXITS, total);
        ctx.page.store(shared::VMM_IO_EXITS, io_exits);
        ctx.page.store(shared::VMM_MMIO_EXITS, mmio_exits);
        match action {
            Action::Resume => {}
            Action::Block => match &ctx.io {
                Some(io) => io.serve(ctx.index)?,
                None => std::thread::sleep(ctx.io_latency),
            },
            Action::WakeAck => match ctx.wake {
                Some((vm, slot)) => slot.acknowledged(vm, ctx.index)?,
                None => {
                    return Err(VmmError::Guest {
                        vcpu: ctx.index,
                        message: "the guest acknowledged a wake-up nobody sent".into(),
                    })
                }
            },
            Action::Sync => {
                let before_ns = monotonic_ns();
                let tsc = super::arch::guest_counter(&vcpu)?;
                sync.push(SyncPoint { tsc, before_ns, after_ns: monotonic_ns() });
                match sync.len() as u64 {
                    n if n == SYNC_ROUNDS => loop_sched.0 = Some(read_schedstat()),
                    n if n == SYNC_ROUNDS + 1 => loop_sched.1 = Some(read_schedstat()),
                    _ => {}
                }
            }
            Action::Phase(_) => {
                clock.starts.push((monotonic_ns(), ctx.page.load(shared::ITERATIONS)));
                clock.exits_at.push(stats.read()?.get("exits"));
            }
            Action::Done => {
                clock.done = Some((monotonic_ns(), ctx.page.load(shared::ITERATIONS)));
                clock.exits_at.push(stats.read()?.get("exits"));
            }
            Action::Fault(vector) => {
                return Err(VmmError::Guest {
                    vcpu: ctx.index,
                    message: super::arch::fault_message(&vcpu, ctx.memory, ctx.program, vector),
                })
            }
            Action::Unexpected(what) => {
                let rip = super::arch::program_counter(&vcpu).unwrap_or(0);
                return Err(VmmError::Guest {
                    vcpu: ctx.index,
                    message: format!(
                        "{what} (exit reason {}) at PC {}",
                        exit_reason_name(reason),
                        ctx.program.describe(rip)
                    ),
                });
            }
        }
    }

    let sched = read_schedstat().since(sched_before);
    let kvm_stats = stats.read()?.delta(&stats_before, stats.cumulative_names());
    let (done_ns, iterations) = clock.done.unwrap_or_default();
    let start_ns = clock.starts.first().map_or(done_ns, |s| s.0);
    let phases = ctx
        .script
        .phases
        .iter()
        .zip(clock.starts.iter().enumerate())
        .map(|(phase, (i, &(start, iters_at_start)))| {
            let (end, iters_at_end) = clock.starts.get(i + 1).copied().unwrap_or((done_ns, iterations));
            PhaseReport {
                workload: phase.label().to_string(),
                iterations: iters_at_end - iters_at_start,
                start_monotonic_ns: start,
                end_monotonic_ns: end,
                // The next marker's exit is counted at the next reading; it is not this phase's.
                kvm_exits: match (clock.exits_at.get(i), clock.exits_at.get(i + 1)) {
                    (Some(Some(a)), Some(Some(b))) => Some(b.saturating_sub(*a).saturating_sub(1)),
                    _ => None,
                },
            }
        })
        .collect();
    let wall_ns = done_ns - start_ns;
    let userspace_exits = (0u32..)
        .zip(exits_by_reason)
        .filter(|&(_, n)| n > 0)
        .map(|(reason, n)| (exit_reason_name(reason).to_string(), n))
        .collect();
    let report = VcpuReport {
        index: ctx.index,
        tid: current_tid(),
        pinned_cpu: ctx.pin,
        completed: true,
        iterations,
        userspace_exits,
        ioeventfd_signals: 0,
        run_ns: sched.run_ns,
        wait_ns: sched.wait_ns,
        timeslices: sched.timeslices,
        wall_ns,
        ns_per_iteration: if iterations == 0 { 0.0 } else { wall_ns as f64 / iterations as f64 },
        steal_ns: ctx.steal_time.then(|| ctx.page.load(super::arch::STEAL_NS)),
        start_monotonic_ns: start_ns,
        phases,
        kvm_stats,
        samples: sampler.map(PcSampler::into_samples).unwrap_or_default(),
        noise: (!sync.is_empty()).then(|| {
            let loop_wait_ns = match loop_sched {
                (Some(start), Some(end)) => end.since(start).wait_ns,
                _ => 0,
            };
            guest_noise(&ctx, sync, loop_kicks, loop_wait_ns)
        }),
    };
    Ok((report, vcpu))
}

/// The noise workload's samples, read out of guest memory.
fn guest_noise(ctx: &VcpuContext<'_>, sync: Vec<SyncPoint>, loop_kicks: u64, loop_wait_ns: u64) -> GuestNoise {
    let detected = ctx.page.load(shared::NOISE_SAMPLES);
    let kept = detected.min(layout::NOISE_AREA / layout::NOISE_RECORD);
    let base = layout::noise_buffer(ctx.index);
    let samples = (0..kept)
        .map(|i| {
            let word =
                |k: u64| ctx.memory.read_obj::<u64>(GuestAddress(base + i * layout::NOISE_RECORD + 8 * k)).unwrap_or(0);
            let exits = word(3);
            NoiseRecord {
                start_tsc: word(0),
                len_tsc: word(1),
                steal_ns: word(2),
                hw_exits: (exits & 0xffff_ffff) as u32,
                lw_exits: (exits >> 32) as u32,
            }
        })
        .collect();
    GuestNoise {
        tsc_khz: ctx.page.load(shared::TSC_KHZ),
        threshold_ticks: ctx.page.load(shared::NOISE_THRESHOLD),
        detected,
        samples,
        sync,
        loop_kicks,
        loop_wait_ns,
    }
}

fn pin_current_thread(cpu: u32) -> std::io::Result<()> {
    virtprof_host::affinity::set(0, &[cpu])
}

fn current_tid() -> u32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() as u32 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_the_test_bed_ports() {
        assert_eq!(classify(&VcpuExit::IoOut(ports::PIO_USER, &[0])), Action::Resume);
        assert_eq!(classify(&VcpuExit::IoOut(ports::PHASE, &[2, 0, 0, 0])), Action::Phase(2));
        assert_eq!(classify(&VcpuExit::IoOut(ports::DONE, &[0])), Action::Done);
        assert_eq!(classify(&VcpuExit::IoOut(ports::IO_BLOCK, &[0])), Action::Block);
        assert_eq!(classify(&VcpuExit::IoOut(ports::FAULT, &[6, 0, 0, 0])), Action::Fault(6));
        assert_eq!(classify(&VcpuExit::MmioWrite(layout::MMIO_USER_ADDR, &[0; 4])), Action::Resume);
        assert_eq!(classify(&VcpuExit::Intr), Action::Resume);
        assert_eq!(classify(&VcpuExit::Hlt), Action::Resume);
        match classify(&VcpuExit::IoOut(0x3f8, &[0])) {
            Action::Unexpected(m) => assert!(m.contains("0x3f8")),
            other => panic!("{other:?}"),
        }
        assert!(matches!(classify(&VcpuExit::Shutdown), Action::Unexpected(m) if m.contains("triple-faulted")));
    }

    #[test]
    fn stores_to_the_port_window_are_the_ports() {
        let store = |port| layout::port_address(port);
        assert_eq!(classify(&VcpuExit::MmioWrite(store(ports::PHASE), &[3, 0, 0, 0])), Action::Phase(3));
        assert_eq!(classify(&VcpuExit::MmioWrite(store(ports::DONE), &[0; 4])), Action::Done);
        assert_eq!(classify(&VcpuExit::MmioWrite(store(ports::FAULT), &[8, 0, 0, 0])), Action::Fault(8));
        assert_eq!(classify(&VcpuExit::MmioWrite(store(ports::IO_BLOCK), &[0; 4])), Action::Block);
        assert_eq!(classify(&VcpuExit::MmioWrite(store(ports::WAKE_ACK), &[0; 4])), Action::WakeAck);
        assert!(matches!(classify(&VcpuExit::MmioWrite(layout::PORT_WINDOW + 4, &[0; 4])), Action::Unexpected(_)));
    }
}
