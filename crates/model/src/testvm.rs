//! Ground truth emitted by `virtprof testvm`: what the micro-VMs did, counted by the VMM itself,
//! by the kernel's schedstat and by the KVM binary stats fd. Every later analyzer is tested
//! against these numbers, so the schema is stable (see `docs/testvm.md`).

use std::collections::BTreeMap;

/// The whole run: one or more VMs, each a separate VMM process.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct TestvmReport {
    /// The workload as given on the command line (`pio-user`, or the phase script).
    pub workload: String,
    /// The privilege level the guest code ran at: 3 (user) or 0 (kernel).
    #[cfg_attr(feature = "serde", serde(default = "user_cpl"))]
    pub cpl: u8,
    /// Wall time of the whole run in nanoseconds, launch to last VM exit.
    pub wall_ns: u64,
    /// Marker exits each vCPU makes besides its workload: one `IO` exit per phase start plus
    /// one for "done". A single-workload run has 2.
    pub marker_io_exits_per_vcpu: u64,
    /// One entry per VMM process.
    pub vms: Vec<VmReport>,
}

/// Reports written before `--cpl` existed ran at CPL3.
#[cfg(feature = "serde")]
fn user_cpl() -> u8 {
    3
}

/// One VM, run by one VMM process named `virtprof-vm`.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct VmReport {
    /// Index of this VM within the run (0-based).
    pub index: u32,
    /// Process id of the VMM.
    pub pid: u32,
    /// VM-wide KVM binary stats deltas over the run, by the kernel's stat name.
    pub kvm_vm_stats: BTreeMap<String, u64>,
    /// The VM's vCPUs.
    pub vcpus: Vec<VcpuReport>,
    /// The guest program's symbols in `System.map` form, when its vCPUs were sampled.
    #[cfg_attr(feature = "serde", serde(default, skip_serializing_if = "String::is_empty"))]
    pub system_map: String,
    /// CLOCK_MONOTONIC when sampling started (sample times count from here).
    #[cfg_attr(feature = "serde", serde(default, skip_serializing_if = "Option::is_none"))]
    pub sampling_start_ns: Option<u64>,
    /// The VMM's I/O thread (`--io-thread`), where it had one.
    #[cfg_attr(feature = "serde", serde(default, skip_serializing_if = "Option::is_none"))]
    pub io_thread: Option<ThreadReport>,
    /// Times the VMM took the touch buffers back from the guest (`--reclaim-hz`): each is
    /// one `madvise(MADV_REMOVE)` of them all.
    #[cfg_attr(feature = "serde", serde(default, skip_serializing_if = "Option::is_none"))]
    pub reclaims: Option<u64>,
}

/// A VMM thread other than a vCPU (the I/O thread): what it served and its schedstat.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct ThreadReport {
    /// Its thread id.
    pub tid: u32,
    /// The host CPU it was pinned to, if any.
    pub pinned_cpu: Option<u32>,
    /// Requests it served.
    pub requests: u64,
    /// Time on a CPU (schedstat), ns.
    pub run_ns: u64,
    /// Time runnable but waiting for a CPU (schedstat), ns.
    pub wait_ns: u64,
}

/// One vCPU: its thread, what its guest program did, and what the host saw.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct VcpuReport {
    /// vCPU index within its VM.
    pub index: u32,
    /// Thread id of the vCPU thread (named `vcpuN`).
    pub tid: u32,
    /// The host CPU the thread was pinned to, if any.
    pub pinned_cpu: Option<u32>,
    /// Whether the guest reached its "done" port.
    pub completed: bool,
    /// Workload iterations the guest reported in the shared page.
    pub iterations: u64,
    /// Returns from `KVM_RUN` handled by the VMM, by KVM exit name (`IO`, `MMIO`, `INTR`, ...).
    pub userspace_exits: BTreeMap<String, u64>,
    /// Signals received on this vCPU's ioeventfds (in-kernel PIO/MMIO doorbells).
    pub ioeventfd_signals: u64,
    /// CPU time of the vCPU thread over the run, from its schedstat.
    pub run_ns: u64,
    /// Time the vCPU thread spent runnable but not running, from its schedstat.
    pub wait_ns: u64,
    /// Times the thread was scheduled in, from its schedstat.
    pub timeslices: u64,
    /// Wall time from the first phase marker to the done marker.
    pub wall_ns: u64,
    /// `wall_ns / iterations` (0 when no iterations ran).
    pub ns_per_iteration: f64,
    /// Steal time the kernel wrote into the guest's steal-time record, when enabled.
    pub steal_ns: Option<u64>,
    /// CLOCK_MONOTONIC of the first phase marker, for aligning with host traces.
    pub start_monotonic_ns: u64,
    /// Per phase: name, iterations and CLOCK_MONOTONIC span.
    pub phases: Vec<PhaseReport>,
    /// The vCPU's KVM binary stats deltas over the run, by the kernel's stat name.
    pub kvm_stats: BTreeMap<String, u64>,
    /// Program-counter samples, when the VMM sampled this vCPU (`virtprof boot --testvm`).
    #[cfg_attr(feature = "serde", serde(default, skip_serializing_if = "Vec::is_empty"))]
    pub samples: Vec<crate::pcsample::PcSample>,
    /// What the `noise` workload recorded in guest memory.
    #[cfg_attr(feature = "serde", serde(default, skip_serializing_if = "Option::is_none"))]
    pub noise: Option<GuestNoise>,
}

/// The `noise` workload's own record: its samples and the clock-sync exits around the loop.
#[derive(Debug, Clone, PartialEq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct GuestNoise {
    /// Guest TSC frequency.
    pub tsc_khz: u64,
    /// The loop's threshold in TSC ticks.
    pub threshold_ticks: u64,
    /// Samples the guest detected (those beyond its buffer are not in `samples`).
    pub detected: u64,
    /// The samples, in order.
    pub samples: Vec<NoiseRecord>,
    /// Clock-sync exits, before and after the loop.
    pub sync: Vec<SyncPoint>,
    /// Kicks (`--inject-hz`) that landed inside the loop, between the two brackets of sync
    /// exits: each is one heavyweight exit the loop can see.
    #[cfg_attr(feature = "serde", serde(default))]
    pub loop_kicks: u64,
    /// The vCPU thread's schedstat wait over the loop (from the last sync exit before it to
    /// the first after it): what the guest's steal samples add up to.
    #[cfg_attr(feature = "serde", serde(default))]
    pub loop_wait_ns: u64,
}

/// One gap the guest loop saw, with what its counters said meanwhile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct NoiseRecord {
    /// Guest TSC before the gap.
    pub start_tsc: u64,
    /// Gap length in TSC ticks.
    pub len_tsc: u64,
    /// Steal time (the KVM steal-time record) accrued since the previous sample, ns.
    pub steal_ns: u64,
    /// Heavyweight exits (KVM_RUN returns the VMM handled) since the previous sample.
    pub hw_exits: u32,
    /// Lightweight exits (KVM stats fd, published by the VMM) since the previous sample.
    pub lw_exits: u32,
}

/// The guest's TSC read (by the VMM, at a sync exit) between two host CLOCK_MONOTONIC readings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct SyncPoint {
    /// Guest TSC.
    pub tsc: u64,
    /// Host CLOCK_MONOTONIC before the read.
    pub before_ns: u64,
    /// Host CLOCK_MONOTONIC after it.
    pub after_ns: u64,
}

/// One scripted phase as the VMM observed it through the phase markers.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct PhaseReport {
    /// The phase's workload name.
    pub workload: String,
    /// Iterations the guest completed in this phase.
    pub iterations: u64,
    /// CLOCK_MONOTONIC when the phase's marker exit arrived.
    pub start_monotonic_ns: u64,
    /// CLOCK_MONOTONIC when the next marker (or done) arrived.
    pub end_monotonic_ns: u64,
    /// Exits this phase made into KVM: the vCPU's KVM stats `exits` counter read at this
    /// phase's marker and at the next one, less that next marker's own exit. Independent of
    /// any trace, so it tells which guest operations reach KVM on this host at all.
    #[cfg_attr(feature = "serde", serde(default, skip_serializing_if = "Option::is_none"))]
    pub kvm_exits: Option<u64>,
}

impl PhaseReport {
    /// Exits into KVM per iteration (None: no stats-fd reading, or no iterations).
    pub fn kvm_exits_per_iteration(&self) -> Option<f64> {
        self.kvm_exits.filter(|_| self.iterations > 0).map(|e| e as f64 / self.iterations as f64)
    }

    /// Whether the phase's operation reaches KVM: one that does makes an exit each time; one
    /// handled below KVM makes none, bar a stray host interrupt or two (a few hundredths).
    pub fn reaches_kvm(&self) -> Option<bool> {
        self.kvm_exits_per_iteration().map(|rate| rate >= 0.5)
    }
}

impl VcpuReport {
    /// Userspace exits of one kind (0 if none).
    pub fn exits(&self, name: &str) -> u64 {
        self.userspace_exits.get(name).copied().unwrap_or(0)
    }

    /// A KVM stat delta by name (0 if the kernel does not export it).
    pub fn stat(&self, name: &str) -> u64 {
        self.kvm_stats.get(name).copied().unwrap_or(0)
    }
}

impl TestvmReport {
    /// All vCPUs of all VMs, in order.
    pub fn vcpus(&self) -> impl Iterator<Item = &VcpuReport> {
        self.vms.iter().flat_map(|vm| vm.vcpus.iter())
    }
}
