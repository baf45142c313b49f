//! What kind of KVM the host runs. Detection lives in `virtprof-kvm`; this is the vocabulary.

use std::fmt;

/// The hardware-virtualization flavour behind `/dev/kvm`, which decides what exit evidence
/// exists: VMX and SVM emit `kvm_exit`/`kvm_entry`; PVM (guest CPL0 emulated, no VM exits in
/// the hardware sense) does not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize), serde(rename_all = "lowercase"))]
pub enum HostKind {
    /// Intel VT-x (`kvm_intel`).
    Vmx,
    /// AMD-V (`kvm_amd`).
    Svm,
    /// Pagetable-based Virtual Machine (`kvm_pvm`): no VMX/SVM needed.
    Pvm,
    /// KVM on arm64 (built into the kernel; VHE, nVHE or pKVM).
    Arm64,
    /// `/dev/kvm` exists but the vendor module could not be identified.
    Unknown,
}

impl HostKind {
    /// Identify the host kind from the loaded module names (`/proc/modules` first column).
    pub fn from_modules<'a>(modules: impl IntoIterator<Item = &'a str>) -> Option<HostKind> {
        modules.into_iter().find_map(|m| match m {
            "kvm_intel" => Some(HostKind::Vmx),
            "kvm_amd" => Some(HostKind::Svm),
            "kvm_pvm" => Some(HostKind::Pvm),
            _ => None,
        })
    }

    /// The kind named by [`HostKind::as_str`] (how recordings store it).
    pub fn from_name(name: &str) -> Option<HostKind> {
        [HostKind::Vmx, HostKind::Svm, HostKind::Pvm, HostKind::Arm64, HostKind::Unknown]
            .into_iter()
            .find(|k| k.as_str() == name)
    }

    /// Whether KVM on this kind of host emits `kvm_exit`/`kvm_entry` (unknown: None).
    pub fn traces_exits(self) -> Option<bool> {
        match self {
            HostKind::Vmx | HostKind::Svm | HostKind::Arm64 => Some(true),
            HostKind::Pvm => Some(false),
            HostKind::Unknown => None,
        }
    }

    /// Short name for tables and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            HostKind::Vmx => "vmx",
            HostKind::Svm => "svm",
            HostKind::Pvm => "pvm",
            HostKind::Arm64 => "arm64",
            HostKind::Unknown => "unknown",
        }
    }
}

impl fmt::Display for HostKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_from_module_list() {
        assert_eq!(HostKind::from_modules(["kvm", "kvm_pvm"]), Some(HostKind::Pvm));
        assert_eq!(HostKind::from_modules(["kvm_amd", "kvm"]), Some(HostKind::Svm));
        assert_eq!(HostKind::from_modules(["ext4"]), None);
        assert_eq!(HostKind::from_name("svm"), Some(HostKind::Svm));
        assert_eq!(HostKind::from_name("none"), None);
    }
}
