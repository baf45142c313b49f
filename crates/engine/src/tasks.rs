//! Which of the host's threads are whose vCPUs: the VMs `top`, `serve`, `sched` and `demo`
//! show, from process names, discovery's identities and the threads that emitted kvm events.

use std::collections::BTreeMap;

use virtprof_analysis::qos::{VmInfo, VmmThread};
use virtprof_kvm::discover::{emulated_vcpu_index, thread_role, vcpu_index, vhost_owner};
use virtprof_model::vmm::{VmOwner, VmmKind};
use virtprof_model::{Pid, VcpuThread};
use virtprof_store::recording::VmIdentity;

/// What is known about the host's processes: threads (tid → pid, comm) and VM identities.
#[derive(Debug, Default, Clone)]
pub struct HostTasks {
    /// tid → (pid, comm).
    pub threads: BTreeMap<u32, (u32, String)>,
    /// pid → what discovery (or a recording) knew of the VM.
    pub identities: BTreeMap<u32, VmIdentity>,
}

impl HostTasks {
    /// The VMs: processes discovery named, processes whose name is a known VMM, and the
    /// processes of threads that emitted kvm events (`tracked`). vCPUs are the threads named
    /// like vCPUs, or else the tracked threads of that process. `only` restricts to VMM pids.
    pub fn vms(&self, tracked: &[u32], only: &[u32]) -> Vec<VmInfo> {
        let tracked: std::collections::HashSet<u32> = tracked.iter().copied().collect();
        let mut pids: Vec<u32> = self.identities.keys().copied().collect();
        for (tid, (pid, comm)) in &self.threads {
            let process_comm = self.threads.get(pid).map_or("", |(_, c)| c.as_str());
            let vmm = tid == pid && virtprof_kvm::discover::vmm_kind(comm, &[]) != VmmKind::Unknown;
            if vmm || tracked.contains(tid) || (vcpu_index(comm).is_some() && is_vmm(process_comm)) {
                pids.push(*pid);
            }
        }
        pids.sort_unstable();
        pids.dedup();
        pids.retain(|p| only.is_empty() || only.contains(p));
        // Each process's threads, and the vhost workers serving it, gathered once (in tid order):
        // looking through every thread of the host for each VM cost VMs x threads.
        let mut own: BTreeMap<u32, Vec<(u32, &str)>> = BTreeMap::new();
        let mut vhost: BTreeMap<u32, Vec<(u32, &str)>> = BTreeMap::new();
        for (&tid, (pid, comm)) in &self.threads {
            own.entry(*pid).or_default().push((tid, comm));
            if let Some(owner) = vhost_owner(comm) {
                vhost.entry(owner).or_default().push((tid, comm));
            }
        }
        pids.into_iter()
            .filter_map(|pid| {
                let threads = own.get(&pid).map_or(&[][..], Vec::as_slice);
                let mut vcpus: Vec<VcpuThread> =
                    threads.iter().filter_map(|&(tid, comm)| Some(VcpuThread::new(vcpu_index(comm)?, tid))).collect();
                let mut emulated = false;
                if vcpus.is_empty() {
                    vcpus = threads
                        .iter()
                        .filter_map(|&(tid, comm)| Some(VcpuThread::new(emulated_vcpu_index(comm)?, tid)))
                        .collect();
                    emulated = !vcpus.is_empty();
                }
                if vcpus.is_empty() {
                    let unnamed = threads.iter().filter(|(t, _)| tracked.contains(t));
                    vcpus = unnamed
                        .enumerate()
                        .map(|(i, &(tid, _))| VcpuThread::new(u32::try_from(i).unwrap_or(u32::MAX), tid))
                        .collect();
                }
                vcpus.sort_unstable();
                if vcpus.is_empty() {
                    return None;
                }
                let process_comm = self.threads.get(&pid).map_or("", |(_, c)| c.as_str());
                let id = self.identities.get(&pid).cloned().unwrap_or_else(|| {
                    let kind = virtprof_kvm::discover::vmm_kind(process_comm, &[]);
                    VmIdentity { pid, kind: kind.to_string(), name: format!("{kind}-{pid}"), owner: VmOwner::default() }
                });
                let serving = vhost.get(&pid).map_or(&[][..], Vec::as_slice);
                let others = others(pid, threads, serving, &vcpus);
                Some(VmInfo { pid: Pid(pid), name: id.name, kind: id.kind, owner: id.owner, vcpus, others, emulated })
            })
            .collect()
    }
}

/// The threads of VMM `pid` (`own`) that are not its `vcpus`, by role, and the vhost workers
/// serving it (`serving`: threads of its own or, before Linux 6.4, kernel threads), in tid
/// order, each once.
fn others(pid: u32, own: &[(u32, &str)], serving: &[(u32, &str)], vcpus: &[VcpuThread]) -> Vec<VmmThread> {
    let mut threads: Vec<(u32, &str)> = own.iter().chain(serving).copied().collect();
    threads.sort_unstable_by_key(|(tid, _)| *tid);
    threads.dedup_by_key(|(tid, _)| *tid);
    threads
        .into_iter()
        .filter(|(tid, _)| !vcpus.iter().any(|v| v.tid.0 == *tid))
        .map(|(tid, comm)| VmmThread { tid, role: thread_role(pid, tid, comm) })
        .collect()
}

fn is_vmm(comm: &str) -> bool {
    virtprof_kvm::discover::vmm_kind(comm, &[]) != VmmKind::Unknown
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tasks(list: &[(u32, u32, &str)]) -> HostTasks {
        HostTasks {
            threads: list.iter().map(|(tid, pid, comm)| (*tid, (*pid, comm.to_string()))).collect(),
            identities: BTreeMap::new(),
        }
    }

    #[test]
    fn vcpus_by_name_or_by_kvm_events() {
        let host = tasks(&[
            (10, 10, "virtprof-vm"),
            (11, 10, "vcpu0"),
            (12, 10, "vcpu1"),
            (20, 20, "qemu-system-x86"),
            (21, 20, "qemu-system-x86"),
            (22, 20, "qemu-system-x86"),
            (30, 30, "bash"),
            (31, 30, "vcpu0"), // not a VMM: a thread that happens to be called vcpu0
        ]);
        let vms = host.vms(&[22], &[]);
        assert_eq!(
            vms.iter().map(|v| (v.pid.0, v.name.as_str())).collect::<Vec<_>>(),
            [(10, "virtprof-testvm-10"), (20, "qemu-20")]
        );
        let v = VcpuThread::new;
        assert_eq!((vms[0].vcpus.as_slice(), vms[1].vcpus.as_slice()), (&[v(0, 11), v(1, 12)][..], &[v(0, 22)][..]));
        assert_eq!(host.vms(&[22], &[20]).len(), 1);
    }
}
