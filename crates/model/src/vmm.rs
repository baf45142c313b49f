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
