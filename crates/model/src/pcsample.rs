//! Program-counter samples of a guest, as `virtprof boot` collects them: where each vCPU was
//! at a moment, and in which realm (the seed's hypervisor / guest kernel / guest user split).

use std::fmt;

/// Start of the x86-64 upper canonical half, where 64-bit kernels live.
const KERNEL_HALF: u64 = 0xffff_8000_0000_0000;

/// Who owned the vCPU when the sample was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
pub enum Realm {
    /// The VMM (or KVM) was handling an exit: the guest did not run.
    Hypervisor,
    /// Guest code at CPL0.
    Kernel,
    /// Guest code at CPL3.
    User,
    /// Guest CPL0 code outside the kernel's address range: BIOS, option ROMs, the boot loader,
    /// the kernel's decompressor (before the kernel proper runs at its link address).
    Firmware,
}

impl Realm {
    /// Every realm, in report order.
    pub const ALL: [Realm; 4] = [Realm::Hypervisor, Realm::Firmware, Realm::Kernel, Realm::User];

    /// The realm of guest code at privilege level `cpl`.
    pub fn of_cpl(cpl: u8) -> Realm {
        if cpl == 0 {
            Realm::Kernel
        } else {
            Realm::User
        }
    }

    /// The realm of a full guest (not VMM) sample: CPL3 is user; CPL0 is the kernel in the
    /// upper canonical half and firmware below it (`rip` is the linear address, CS base added).
    pub fn of_guest(cpl: u8, rip: u64) -> Realm {
        match cpl {
            3 => Realm::User,
            _ if rip >= KERNEL_HALF => Realm::Kernel,
            _ => Realm::Firmware,
        }
    }

    /// The realm of a guest-virtual address when the privilege level is unknown: the x86-64
    /// upper canonical half is the kernel's (the seed splits realms by address the same way).
    pub fn of_address(rip: u64) -> Realm {
        if rip >= KERNEL_HALF {
            Realm::Kernel
        } else {
            Realm::User
        }
    }

    /// The lowercase name used in tables and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Realm::Hypervisor => "hypervisor",
            Realm::Kernel => "kernel",
            Realm::User => "user",
            Realm::Firmware => "firmware",
        }
    }
}

impl fmt::Display for Realm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One sample.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct PcSample {
    /// Nanoseconds since the sampler started.
    pub t_ns: u64,
    /// vCPU index.
    pub vcpu: u32,
    /// Guest RIP (for hypervisor samples: where the guest will resume).
    pub rip: u64,
    /// Who owned the vCPU.
    pub realm: Realm,
    /// For hypervisor samples, what the VMM was doing (`exit:IO`); otherwise empty.
    #[cfg_attr(feature = "serde", serde(default, skip_serializing_if = "String::is_empty"))]
    pub activity: String,
}
