//! Which KVM this host runs, without opening `/dev/kvm`: the vendor module
//! (`/sys/module/NAME` exists for loaded and built-in modules alike; built-ins are missing from
//! /proc/modules), else the CPU flags (vmx/svm). One probe for `doctor`, `record` and the rest.

use std::path::Path;

use virtprof_model::HostKind;

/// The host kind from its KVM module, else its CPU flags (on arm64, where KVM is built in and
/// has no vendor module: a `/dev/kvm`); None when neither says.
pub fn detect() -> Option<HostKind> {
    if cfg!(target_arch = "aarch64") {
        return Path::new("/dev/kvm").exists().then_some(HostKind::Arm64);
    }
    let modules = ["kvm_intel", "kvm_amd", "kvm_pvm"].into_iter().filter(|m| Path::new("/sys/module").join(m).is_dir());
    HostKind::from_modules(modules)
        .or_else(|| from_cpuinfo(&std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default()))
}

/// vmx or svm in the first `flags` line of `/proc/cpuinfo` text.
fn from_cpuinfo(cpuinfo: &str) -> Option<HostKind> {
    let flags = cpuinfo.lines().find(|l| l.starts_with("flags"))?;
    let has = |f: &str| flags.split_whitespace().any(|w| w == f);
    (has("vmx").then_some(HostKind::Vmx)).or(has("svm").then_some(HostKind::Svm))
}

/// Whether this kernel runs as a guest itself (the `hypervisor` CPU flag).
pub fn in_vm() -> bool {
    std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default().contains(" hypervisor")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_flags_name_the_vendor() {
        assert_eq!(from_cpuinfo("flags\t: fpu vmx sse\n"), Some(HostKind::Vmx));
        assert_eq!(from_cpuinfo("flags\t: fpu svm\n"), Some(HostKind::Svm));
        assert_eq!(from_cpuinfo("flags\t: fpu sse\n"), None);
    }
}
