//! What this host's KVM offers, probed once: the vendor module, `/dev/kvm` access, and the
//! binary stats fd. `/sys/module/NAME` exists for loaded and built-in modules alike (built-ins
//! are missing from /proc/modules); the CPU flags (vmx/svm) are the last resort.

use std::os::fd::AsRawFd;

use kvm_ioctls::Kvm;
use virtprof_model::HostKind;

use crate::stats::StatsFd;

/// Facts about `/dev/kvm` on this host.
#[derive(Debug, Clone)]
pub struct KvmCaps {
    /// Vendor flavour (None: no KVM module loaded and no vmx/svm CPU flag).
    pub kind: Option<HostKind>,
    /// The KVM API version, or why `/dev/kvm` could not be opened.
    pub api_version: Result<i32, String>,
    /// Number of VM and vCPU statistics the stats fd exports, or why it failed.
    pub stats: Result<(usize, usize), String>,
}

impl KvmCaps {
    /// Probe the running host. Creates (and drops) one empty VM with one vCPU.
    pub fn probe() -> KvmCaps {
        let modules = ["kvm_intel", "kvm_amd", "kvm_pvm"]
            .into_iter()
            .filter(|m| std::path::Path::new("/sys/module").join(m).is_dir());
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let kind = HostKind::from_modules(modules).or_else(|| {
            let flags = cpuinfo.lines().find(|l| l.starts_with("flags"))?;
            let has = |f: &str| flags.split_whitespace().any(|w| w == f);
            (has("vmx").then_some(HostKind::Vmx)).or(has("svm").then_some(HostKind::Svm))
        });
        let kvm = Kvm::new();
        let api_version = kvm.as_ref().map(Kvm::get_api_version).map_err(|e| e.to_string());
        let kind = kind.or(api_version.is_ok().then_some(HostKind::Unknown));
        let stats = match &kvm {
            Err(e) => Err(format!("/dev/kvm: {e}")),
            Ok(kvm) => probe_stats(kvm),
        };
        KvmCaps { kind, api_version, stats }
    }
}

fn probe_stats(kvm: &Kvm) -> Result<(usize, usize), String> {
    let vm = kvm.create_vm().map_err(|e| format!("KVM_CREATE_VM: {e}"))?;
    let vcpu = vm.create_vcpu(0).map_err(|e| format!("KVM_CREATE_VCPU: {e}"))?;
    let vm_stats = StatsFd::open(vm.as_raw_fd()).map_err(|e| e.to_string())?;
    let vcpu_stats = StatsFd::open(vcpu.as_raw_fd()).map_err(|e| e.to_string())?;
    Ok((vm_stats.descriptors().len(), vcpu_stats.descriptors().len()))
}
