//! The micro-VMM: one VM per process, one thread per vCPU, raw KVM ioctls.
//!
//! Setup in [`Vm::new`] follows the kvm-ioctls walk-through: open `/dev/kvm`, create the VM,
//! back guest RAM with anonymous memory, write the program (and on x86-64 the descriptor
//! tables), create vCPUs at the script's privilege level ([`arch`] per architecture), register
//! ioeventfds, enable steal time. [`Vm::run`] then runs every vCPU on its own named thread and
//! gathers the ground truth.

mod arch;
mod exits;
mod io_thread;
mod pc_sampler;
mod reclaim;
mod shared_page;
mod vcpu;
mod wake;

use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;

use std::time::Duration;
use virtprof_host::stop::STOP_REQUESTED;

use kvm_bindings::kvm_userspace_memory_region;
use kvm_ioctls::{IoEventAddress, Kvm, NoDatamatch, VcpuFd, VmFd};
use serde::{Deserialize, Serialize};
use vm_memory::{Bytes, FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;

use virtprof_model::testvm::VmReport;

use crate::error::VmmError;
use crate::guest::layout::{self, ports, shared};
use crate::guest::{GuestProgram, Script};
use crate::stats::StatsFd;

pub use exits::exit_reason_name;
use shared_page::SharedPage;

/// What one VMM process runs. Serialized to the child process on its stdin.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VmConfig {
    /// Index of this VM within the run.
    pub index: u32,
    /// The program every vCPU runs.
    pub script: Script,
    /// Number of vCPUs.
    pub vcpus: u32,
    /// Host CPU for each vCPU (None: not pinned).
    pub pin: Vec<Option<u32>>,
    /// How long the VMM sleeps per `io-bound` request.
    pub io_latency_ns: u64,
    /// Enable the KVM steal-time record in guest memory.
    pub steal_time: bool,
    /// Keep the VM (and its fds) alive this long after the guest finished, for inspection.
    pub linger_ns: u64,
    /// Sample every vCPU's program counter at this rate (0: no sampling). Every sample is a
    /// heavyweight exit, which is how `noise --inject-hz` injects them.
    #[serde(default)]
    pub sample_hz: u32,
    /// The `noise` workload's threshold.
    #[serde(default)]
    pub noise_threshold_ns: u64,
    /// Serve `io-bound` requests on an I/O thread (pinned to the CPU given), not in the vCPU
    /// threads.
    #[serde(default)]
    pub io_thread: Option<Option<u32>>,
    /// Take the `touch` buffers back from the guest this often per second (0: never).
    #[serde(default)]
    pub reclaim_hz: u32,
}

/// An anonymous shared-memory file of `size` bytes named [`layout::GUEST_RAM_NAME`].
fn guest_ram_file(size: u64) -> Result<std::fs::File, VmmError> {
    use std::os::fd::FromRawFd;
    let name = std::ffi::CString::new(layout::GUEST_RAM_NAME).expect("no NUL in the name");
    // SAFETY: `name` is a valid C string; the returned fd is checked before use.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(VmmError::Memory(format!("memfd_create: {}", std::io::Error::last_os_error())));
    }
    // SAFETY: `fd` was just created and is owned by nothing else.
    let file = unsafe { std::fs::File::from_raw_fd(fd) };
    file.set_len(size).map_err(|e| VmmError::Memory(format!("sizing guest RAM: {e}")))?;
    Ok(file)
}

/// A VM ready to run.
pub struct Vm {
    config: VmConfig,
    vm: VmFd,
    memory: GuestMemoryMmap,
    program: GuestProgram,
    vcpus: Vec<VcpuFd>,
    doorbells: Vec<Vec<EventFd>>,
}

impl Vm {
    /// Create and set up the VM described by `config`.
    pub fn new(config: VmConfig) -> Result<Self, VmmError> {
        if config.vcpus == 0 || config.vcpus > layout::MAX_VCPUS {
            return Err(VmmError::Memory(format!(
                "{} vCPUs requested; 1 to {} supported",
                config.vcpus,
                layout::MAX_VCPUS
            )));
        }
        let buffered = config.script.phases.iter().find(|p| p.workload.uses_buffer());
        if let Some(phase) = buffered.filter(|_| config.vcpus > layout::NOISE_VCPUS) {
            return Err(VmmError::Memory(format!(
                "{} vCPUs requested; the {} workload has buffers for {}",
                config.vcpus,
                phase.workload,
                layout::NOISE_VCPUS
            )));
        }
        let kvm = Kvm::new().map_err(VmmError::OpenKvm)?;
        let vm = kvm.create_vm().map_err(kvm_err("KVM_CREATE_VM"))?;

        // Guest RAM lives in a named memfd so that a profiler in another process can map the
        // shared pages read-only and sample the application counters (`crate::guest_counters`).
        let ram = guest_ram_file(layout::RAM_SIZE)?;
        let memory = GuestMemoryMmap::<()>::from_ranges_with_files(&[(
            GuestAddress(0),
            layout::RAM_SIZE as usize,
            Some(FileOffset::new(ram, 0)),
        )])
        .map_err(|e| VmmError::Memory(e.to_string()))?;
        let host_addr = memory.get_host_address(GuestAddress(0)).map_err(|e| VmmError::Memory(e.to_string()))?;
        let region = kvm_userspace_memory_region {
            slot: 0,
            flags: 0,
            guest_phys_addr: 0,
            memory_size: layout::RAM_SIZE,
            userspace_addr: host_addr as u64,
        };
        // SAFETY: `memory` maps RAM_SIZE bytes at `host_addr` and lives as long as `self`,
        // which owns both the mapping and the VM fd.
        unsafe { vm.set_user_memory_region(region) }.map_err(kvm_err("KVM_SET_USER_MEMORY_REGION"))?;

        let vcpus = arch::create_vcpus(&kvm, &vm, config.vcpus)?;
        let tsc_khz = arch::counter_khz(&vcpus[0])?;
        let program = config.script.assemble(tsc_khz)?;

        let mut image = vec![0u8; layout::CODE_ADDR as usize];
        arch::prepare_memory(&mut image, &program)?;
        memory.write_slice(&image, GuestAddress(0)).map_err(|e| VmmError::Memory(e.to_string()))?;
        memory.write_slice(&program.code, GuestAddress(program.base)).map_err(|e| VmmError::Memory(e.to_string()))?;

        let mut doorbells = Vec::with_capacity(vcpus.len());
        for (index, vcpu) in (0u32..).zip(&vcpus) {
            let page = SharedPage::new(&memory, index)?;
            let counters = virtprof_model::appcounters::image("testvm", &shared::counter_slots());
            memory
                .write_slice(&counters, GuestAddress(layout::shared_page(index) + shared::COUNTERS))
                .map_err(|e| VmmError::Memory(e.to_string()))?;
            page.store(shared::MAGIC, shared::MAGIC_VALUE);
            page.store(shared::TSC_KHZ, tsc_khz);
            page.store(shared::VCPU_INDEX, u64::from(index));
            page.store(shared::PIO_KERNEL_PORT, u64::from(pio_doorbell(index)));
            page.store(shared::MMIO_KERNEL_ADDR, mmio_doorbell(index));
            page.store(shared::NOISE_THRESHOLD, config.noise_threshold_ns * tsc_khz / 1_000_000);
            page.store(shared::NOISE_BUFFER, layout::noise_buffer(index));
            doorbells.push(register_doorbells(&vm, index)?);
            arch::init_registers(vcpu, &program, config.script.privilege, index)?;
            if config.steal_time {
                arch::enable_steal_time(vcpu, layout::shared_page(index) + shared::STEAL_TIME)?;
            }
        }
        Ok(Vm { config, vm, memory, program, vcpus, doorbells })
    }

    /// The assembled guest program (for symbols).
    pub fn program(&self) -> &GuestProgram {
        &self.program
    }

    /// Run every vCPU to completion and report what happened.
    pub fn run(self) -> Result<VmReport, VmmError> {
        let Vm { config, vm, memory, program, vcpus, doorbells } = self;
        let vm_stats = StatsFd::open(vm.as_raw_fd())?;
        let vm_before = vm_stats.read()?;
        let pages: Vec<SharedPage> =
            (0..config.vcpus).map(|i| SharedPage::new(&memory, i)).collect::<Result<_, _>>()?;

        // Opened here and kept until the process exits, so other tools (`virtprof stats`) can
        // borrow them: the kernel serves KVM_GET_STATS_FD only to this process.
        let vcpu_stats: Vec<StatsFd> = vcpus.iter().map(|v| StatsFd::open(v.as_raw_fd())).collect::<Result<_, _>>()?;
        let sampling = config.sample_hz > 0;
        if sampling {
            pc_sampler::install_handler()?;
        }
        let slots: Vec<pc_sampler::KickSlot> = (0..config.vcpus).map(|_| Default::default()).collect();
        let mut kicker = pc_sampler::Kicker::new(config.sample_hz);
        let noise = config.script.phases.iter().any(|p| p.workload == crate::guest::Workload::Noise);
        if noise {
            keep_off_vcpu_cpus(&config.pin);
        }
        let waits = config.script.phases.iter().any(|p| p.workload == crate::guest::Workload::Wfi);
        let wake_slots: Vec<wake::WakeSlot> = (0..config.vcpus).map(|_| wake::WakeSlot::new()).collect();
        let mut wake_error = None;
        let reclaiming = std::sync::atomic::AtomicBool::new(config.reclaim_hz > 0);
        let results = std::thread::scope(|scope| {
            let mut handles = Vec::new();
            let (io_requests, io_incoming) = io_thread::channel(config.vcpus);
            let reclaim_handle = if config.reclaim_hz > 0 {
                let buffers = reclaim::Buffers::of(&memory, config.vcpus)?;
                let (hz, running) = (config.reclaim_hz, &reclaiming);
                Some(
                    std::thread::Builder::new()
                        .name(reclaim::NAME.into())
                        .spawn_scoped(scope, move || reclaim::run(&buffers, hz, running))
                        .map_err(|e| VmmError::Os { what: "spawning the reclaim thread".into(), source: e })?,
                )
            } else {
                None
            };
            let io_handle = match config.io_thread {
                Some(pin) => {
                    let latency = Duration::from_nanos(config.io_latency_ns);
                    let incoming = io_incoming;
                    Some(
                        std::thread::Builder::new()
                            .name(io_thread::NAME.into())
                            .spawn_scoped(scope, move || io_thread::run(&incoming, latency, pin))
                            .map_err(|e| VmmError::Os { what: "spawning the I/O thread".into(), source: e })?,
                    )
                }
                None => None,
            };
            for (((index, vcpu), page), stats) in (0u32..).zip(vcpus).zip(pages.iter().cloned()).zip(&vcpu_stats) {
                let ctx = vcpu::VcpuContext {
                    index,
                    pin: config.pin.get(index as usize).copied().flatten(),
                    io_latency: Duration::from_nanos(config.io_latency_ns),
                    steal_time: config.steal_time,
                    script: &config.script,
                    program: &program,
                    memory: &memory,
                    page,
                    kick: sampling.then(|| &slots[index as usize]),
                    wake: waits.then(|| (&vm, &wake_slots[index as usize])),
                    io: io_handle.is_some().then(|| io_requests.clone()),
                };
                let handle = std::thread::Builder::new()
                    .name(format!("vcpu{index}"))
                    .spawn_scoped(scope, move || vcpu::run_vcpu(vcpu, stats, ctx))
                    .map_err(|e| VmmError::Os { what: format!("spawning thread vcpu{index}"), source: e })?;
                handles.push(handle);
            }
            // Forward a stop request (SIGINT/SIGTERM) into every guest's shared page; the guest
            // loops check it each iteration and finish through their "done" marker.
            while !handles.iter().all(|h| h.is_finished()) {
                if STOP_REQUESTED.load(Ordering::Relaxed) {
                    pages.iter().for_each(|p| p.store(shared::STOP, 1));
                }
                if noise {
                    publish_lightweight_exits(&pages, &vcpu_stats);
                }
                if waits {
                    for (index, slot) in (0u32..).zip(&wake_slots) {
                        if let Err(e) = slot.tick(&vm, index) {
                            // The run cannot be what was asked: stop every guest (a later tick
                            // may still wake those in WFI) and report the error.
                            pages.iter().for_each(|p| p.store(shared::STOP, 1));
                            wake_error.get_or_insert(e);
                        }
                    }
                }
                if sampling {
                    kicker.tick(&slots);
                } else if noise || waits {
                    std::thread::sleep(Duration::from_micros(100));
                } else {
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
            let results = handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err(VmmError::Memory("a vCPU thread panicked".into()))))
                .collect::<Result<Vec<_>, VmmError>>();
            // The vCPUs' senders are gone with their threads: the I/O thread ends with this one.
            drop(io_requests);
            let io_report = io_handle.and_then(|h| h.join().ok());
            reclaiming.store(false, Ordering::Relaxed);
            let reclaims = match reclaim_handle.map(|h| h.join()) {
                None => None,
                Some(Ok(done)) => Some(done?),
                Some(Err(_)) => return Err(VmmError::Memory("the reclaim thread panicked".into())),
            };
            results.map(|r| (r, io_report, reclaims))
        })?;
        let (results, io_report, reclaims) = results;

        if let Some(e) = wake_error {
            return Err(e);
        }
        let mut vcpu_reports = Vec::with_capacity(results.len());
        let mut finished_vcpus = Vec::with_capacity(results.len());
        for ((mut report, vcpu), bells) in results.into_iter().zip(&doorbells) {
            report.ioeventfd_signals = bells.iter().map(|fd| fd.read().unwrap_or(0)).sum();
            vcpu_reports.push(report);
            finished_vcpus.push(vcpu);
        }
        let kvm_vm_stats = vm_stats.read()?.delta(&vm_before, vm_stats.cumulative_names());
        if config.linger_ns > 0 {
            std::thread::sleep(Duration::from_nanos(config.linger_ns));
        }
        drop((finished_vcpus, vcpu_stats, vm_stats));
        Ok(VmReport {
            index: config.index,
            pid: std::process::id(),
            kvm_vm_stats,
            vcpus: vcpu_reports,
            system_map: if sampling { program.system_map() } else { String::new() },
            sampling_start_ns: sampling.then(|| kicker.start_ns()),
            io_thread: io_report,
            reclaims,
        })
    }
}

/// Run the VMM's main thread off the CPUs its vCPUs are pinned to, so that its polling is not
/// noise in the guest it measures (when there is another CPU to go to).
fn keep_off_vcpu_cpus(pin: &[Option<u32>]) {
    let pinned: Vec<u32> = pin.iter().flatten().copied().collect();
    virtprof_host::affinity::keep_off(&pinned);
}

/// Tell each guest how many lightweight exits its vCPU has taken: KVM's `exits` counter minus
/// the returns to this VMM (the heavyweight ones, which the vCPU thread publishes itself).
fn publish_lightweight_exits(pages: &[SharedPage], stats: &[StatsFd]) {
    for (page, fd) in pages.iter().zip(stats) {
        if let Some(exits) = fd.read().ok().and_then(|s| s.get("exits")) {
            page.store(shared::VMM_LW_EXITS, exits.saturating_sub(page.load(shared::VMM_USERSPACE_EXITS)));
        }
    }
}

fn pio_doorbell(index: u32) -> u16 {
    ports::PIO_KERNEL_BASE + index as u16
}

fn mmio_doorbell(index: u32) -> u64 {
    layout::MMIO_KERNEL_BASE + 8 * u64::from(index)
}

/// vCPU `index`'s in-kernel doorbells: an MMIO one, and a PIO one where there is port I/O.
fn register_doorbells(vm: &VmFd, index: u32) -> Result<Vec<EventFd>, VmmError> {
    let new_fd = || EventFd::new(libc::EFD_NONBLOCK).map_err(|e| VmmError::Os { what: "eventfd".into(), source: e });
    let mmio = new_fd()?;
    vm.register_ioevent(&mmio, &IoEventAddress::Mmio(mmio_doorbell(index)), NoDatamatch)
        .map_err(kvm_err("KVM_IOEVENTFD (MMIO)"))?;
    let mut bells = vec![mmio];
    if arch::HAS_PORT_IO {
        let pio = new_fd()?;
        vm.register_ioevent(&pio, &IoEventAddress::Pio(u64::from(pio_doorbell(index))), NoDatamatch)
            .map_err(kvm_err("KVM_IOEVENTFD (PIO)"))?;
        bells.push(pio);
    }
    Ok(bells)
}

pub(crate) fn kvm_err(what: &'static str) -> impl Fn(kvm_ioctls::Error) -> VmmError {
    move |source| VmmError::Kvm { what, source }
}
