//! Which VMM runs a VM. Detection lives in `virtprof-kvm`; this is only the vocabulary.

use std::fmt;

/// The kind of virtual machine monitor behind a KVM VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize), serde(rename_all = "kebab-case"))]
pub enum VmmKind {
    /// QEMU (`qemu-system-*`).
    Qemu,
    /// Firecracker.
    Firecracker,
    /// Cloud Hypervisor.
    CloudHypervisor,
    /// crosvm.
    Crosvm,
    /// virtprof's own micro-VMM (`virtprof testvm`).
    VirtprofTestvm,
    /// Anything else holding a KVM VM file descriptor.
    Unknown,
}

impl VmmKind {
    /// The stable name used in tables and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            VmmKind::Qemu => "qemu",
            VmmKind::Firecracker => "firecracker",
            VmmKind::CloudHypervisor => "cloud-hypervisor",
            VmmKind::Crosvm => "crosvm",
            VmmKind::VirtprofTestvm => "virtprof-testvm",
            VmmKind::Unknown => "unknown",
        }
    }
}

impl fmt::Display for VmmKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a VMM's thread does for its VM: XenMon's Dom0 work, in KVM terms, is split over these.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize), serde(rename_all = "kebab-case"))]
pub enum ThreadRole {
    /// Runs a vCPU (QEMU `CPU n/KVM` or `CPU n/TCG`, Firecracker `fc_vcpu n`, `vcpuN`).
    Vcpu,
    /// A device I/O thread (QEMU `IO <id>` iothreads, cloud-hypervisor's `_net0`, `_disk0`).
    IoThread,
    /// The VMM's first thread: QEMU's main loop (device emulation without an iothread, the
    /// network backends), Firecracker's event loop.
    MainLoop,
    /// A vhost worker serving the VM's queues in the kernel (`vhost-PID`).
    Vhost,
    /// A pool thread (QEMU `worker`: blocking disk I/O off the main loop).
    Worker,
    /// Anything else (`call_rcu`, `fc_api`, ...).
    Other,
}

impl ThreadRole {
    /// Every role, in the order tables list them.
    pub const ALL: [ThreadRole; 6] = [
        ThreadRole::Vcpu,
        ThreadRole::IoThread,
        ThreadRole::MainLoop,
        ThreadRole::Vhost,
        ThreadRole::Worker,
        ThreadRole::Other,
    ];

    /// The stable name used in tables, JSON and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            ThreadRole::Vcpu => "vcpu",
            ThreadRole::IoThread => "io-thread",
            ThreadRole::MainLoop => "main-loop",
            ThreadRole::Vhost => "vhost",
            ThreadRole::Worker => "worker",
            ThreadRole::Other => "other",
        }
    }
}

impl fmt::Display for ThreadRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Who owns a VM beyond its VMM process: what fleet tools key VMs by. Every field is optional:
/// each comes from where the host has it (the VMM's command line, its cgroup path), and none
/// is guessed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize), serde(default))]
pub struct VmOwner {
    /// The VM's UUID (QEMU `-uuid`, cloud-hypervisor `--platform uuid=`).
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "Option::is_none"))]
    pub uuid: Option<String>,
    /// The libvirt domain that runs it (from libvirt's machine scope in the cgroup path).
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "Option::is_none"))]
    pub libvirt_domain: Option<String>,
    /// The Kubernetes pod whose container runs the VMM (KubeVirt's virt-launcher), by UID.
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "Option::is_none"))]
    pub pod_uid: Option<String>,
    /// The container (containerd, CRI-O, Docker) that runs the VMM.
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "Option::is_none"))]
    pub container_id: Option<String>,
    /// The VMM's cgroup (v2 path, or v1's systemd hierarchy).
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "Option::is_none"))]
    pub cgroup: Option<String>,
}

impl VmOwner {
    /// True when nothing is known.
    pub fn is_empty(&self) -> bool {
        *self == VmOwner::default()
    }
}
