//! What this host's KVM offers, probed once: the host kind (`virtprof_host::kind`),
//! `/dev/kvm` access, and the binary stats fd.

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
        let kind = virtprof_host::kind::detect();
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
