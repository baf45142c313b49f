//! Which VM each vCPU thread belongs to, from the best evidence the source has: the thread's
//! process (a recording's tasks, a dump's tgids), the capture's GUEST option (trace-cmd names
//! each guest's vCPU threads), the thread that made it (`sched_process_fork`, where the
//! capture has it: a VMM's vCPU threads share their maker), or, for threads none of these
//! name (a trace.dat has no tgids), the vCPU indexes their kvm_exit/kvm_entry events carry
//! (see [`by_vcpu_ids`]). Threads of different VMs are never folded into one; where the
//! evidence cannot tell (VMMs started at the same moment interleave their threads' ids), a VM
//! is split instead.

use std::collections::BTreeMap;

use serde::Serialize;
use virtprof_analysis::thread_parents::ThreadParents;
use virtprof_model::{Event, EventKind};
use virtprof_store::recording::{GuestVcpuThreads, Task, VmIdentity};

use crate::tasks::HostTasks;

/// The VM a vCPU thread was put in.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct VmOf {
    /// How to name it: "pid 1234", "guest NAME", "made by tid 1234", "VM 2 (inferred)".
    pub label: String,
    /// Its VMM process, where known.
    pub pid: Option<u32>,
    /// Which evidence put the thread there: "process", "guest option", "fork" or "vcpu ids".
    pub evidence: &'static str,
}

/// `(tid, vCPU index from its kvm events)` of each vCPU thread → its VM.
pub fn group(
    threads: &[(u32, Option<u32>)],
    tasks: &[Task],
    guests: &[GuestVcpuThreads],
    parents: &ThreadParents,
) -> BTreeMap<u32, VmOf> {
    let mut out = BTreeMap::new();
    let mut unplaced: Vec<(u32, Option<u32>)> = Vec::new();
    for &(tid, index) in threads {
        let process = tasks.iter().find(|t| t.tid == tid && t.pid != tid).map(|t| t.pid);
        let guest = guests.iter().find(|g| g.vcpus.iter().any(|&(_, host)| host == tid));
        let vm = match (process, guest, parents.parent(tid)) {
            (Some(pid), _, _) => VmOf { label: format!("pid {pid}"), pid: Some(pid), evidence: "process" },
            (None, Some(g), _) => VmOf { label: guest_label(g), pid: None, evidence: "guest option" },
            (None, None, Some(maker)) => VmOf { label: format!("made by tid {maker}"), pid: None, evidence: "fork" },
            (None, None, None) => {
                unplaced.push((tid, index));
                continue;
            }
        };
        out.insert(tid, vm);
    }
    for (tid, vm) in by_vcpu_ids(unplaced) {
        out.insert(tid, VmOf { label: format!("VM {} (inferred)", vm + 1), pid: None, evidence: "vcpu ids" });
    }
    out
}

/// What a walk learns of which VM a thread is a vCPU of, for [`group`]: the vCPU index its
/// kvm events carry, and the thread that made it. Every command that names VMs feeds one, so
/// they all group alike.
#[derive(Debug, Default)]
pub struct VcpuEvidence {
    /// tid → the vCPU index of its first kvm_exit/kvm_entry.
    indexes: BTreeMap<u32, u32>,
    /// The thread last looked up: a vCPU's kvm events come in runs, so most skip the map
    /// (this is fed every event of a trace).
    last: Option<u32>,
    pub parents: ThreadParents,
}

impl VcpuEvidence {
    pub fn on_event(&mut self, e: &Event) {
        match e.kind {
            EventKind::KvmExit { vcpu_id, .. } | EventKind::KvmEntry { vcpu_id, .. } if self.last != Some(e.tid) => {
                self.indexes.entry(e.tid).or_insert(vcpu_id);
                self.last = Some(e.tid);
            }
            EventKind::SchedFork { parent_tid, child_tid } => self.parents.record(parent_tid, child_tid),
            _ => {}
        }
    }

    /// The index `tid`'s kvm events carry, else the one in its name ("CPU 1/KVM"): the
    /// userspace round-trip path has no kvm_exit to carry it.
    pub fn index(&self, tid: u32, comm: &str) -> Option<u32> {
        self.indexes.get(&tid).copied().or_else(|| virtprof_kvm::discover::vcpu_index(comm))
    }
}

/// `host` with the vCPU threads (`tids`) whose process it does not know put in the VM
/// [`group`] finds for them: such a VM's threads share a process named by the label `exits
/// --by vm` shows ("guest web", "made by tid 500"), numbered by its lowest thread id. Threads
/// with a known process are left as they are.
pub fn regrouped(host: &HostTasks, tids: &[u32], guests: &[GuestVcpuThreads], evidence: &VcpuEvidence) -> HostTasks {
    let tasks: Vec<Task> =
        host.threads.iter().map(|(&tid, (pid, comm))| Task { tid, pid: *pid, comm: comm.clone() }).collect();
    let comm = |tid: u32| host.threads.get(&tid).map_or("", |(_, c)| c.as_str());
    let threads: Vec<(u32, Option<u32>)> = tids.iter().map(|&tid| (tid, evidence.index(tid, comm(tid)))).collect();
    let mut by_vm: BTreeMap<VmOf, Vec<u32>> = BTreeMap::new();
    for (tid, vm) in group(&threads, &tasks, guests, &evidence.parents) {
        if vm.pid.is_none() {
            by_vm.entry(vm).or_default().push(tid);
        }
    }
    let mut out = host.clone();
    for (vm, members) in by_vm {
        let Some(&pid) = members.iter().min() else { continue };
        for tid in members {
            out.threads.insert(tid, (pid, comm(tid).to_string()));
        }
        let identity = VmIdentity { pid, kind: "unknown".into(), name: vm.label, owner: Default::default() };
        out.identities.entry(pid).or_insert(identity);
    }
    out
}

/// Threads known only by their vCPU indexes → VM numbers. A VMM makes its vCPU threads in
/// index order, so among threads sorted by id each joins the one VM whose highest index so
/// far is below its own. Where two VMs could take it (VMMs that started at once), the thread
/// is a VM of its own, as is one without an index: a VM split, never two folded into one.
fn by_vcpu_ids(mut threads: Vec<(u32, Option<u32>)>) -> Vec<(u32, usize)> {
    threads.sort_unstable();
    // Per VM so far: the highest index in it, None once nothing may join it.
    let mut open: Vec<Option<u32>> = Vec::new();
    let mut out = Vec::with_capacity(threads.len());
    for (tid, index) in threads {
        let takers: Vec<usize> = open
            .iter()
            .enumerate()
            .filter(|(_, top)| top.zip(index).is_some_and(|(top, i)| top < i))
            .map(|(vm, _)| vm)
            .take(2)
            .collect();
        let vm = match (index, takers.as_slice()) {
            (Some(i), &[vm]) => {
                open[vm] = Some(i);
                vm
            }
            // The first of its VM seen (its lower vCPUs, if it has any, left no trace).
            (Some(i), []) => {
                open.push(Some(i));
                open.len() - 1
            }
            // Two VMs could take it, or it has no index: a VM of its own that nothing joins.
            _ => {
                open.push(None);
                open.len() - 1
            }
        };
        out.push((tid, vm));
    }
    out
}

/// "guest NAME"; `trace-cmd attach` leaves the name empty: then its trace id.
fn guest_label(g: &GuestVcpuThreads) -> String {
    match (g.name.as_str(), g.trace_id) {
        ("", Some(id)) => format!("guest {id:#x}"),
        ("", None) => "guest (unnamed)".to_string(),
        (name, _) => format!("guest {name}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(tid: u32, pid: u32) -> Task {
        Task { tid, pid, comm: format!("CPU {}/KVM", tid % 10) }
    }

    #[test]
    fn process_then_guest_option_then_fork_then_vcpu_ids() {
        let tasks = vec![task(101, 100), task(102, 100), task(201, 201), task(301, 301)];
        let guests = vec![GuestVcpuThreads { name: "web".into(), trace_id: None, vcpus: vec![(0, 201)] }];
        // 301, 302, 303 carry indexes 0, 1, 0: two VMs (0-1, then 0); 401 has none.
        let threads = [(101, Some(0)), (102, Some(1)), (201, Some(0)), (301, Some(0)), (302, Some(1)), (303, Some(0))];
        let vms = group(&threads, &tasks, &guests, &ThreadParents::default());
        assert_eq!(vms[&101].label, "pid 100");
        assert_eq!(vms[&102], vms[&101]);
        assert_eq!((vms[&201].label.as_str(), vms[&201].evidence), ("guest web", "guest option"));
        assert_eq!(vms[&301].label, "VM 1 (inferred)");
        assert_eq!(vms[&302], vms[&301]);
        assert_eq!(vms[&303].label, "VM 2 (inferred)");
        let lone = group(&[(5, None), (6, None)], &[], &[], &ThreadParents::default());
        assert_ne!(lone[&5], lone[&6], "threads without indexes are never folded together");
    }

    /// VMMs started one after the other keep their threads' ids apart: the indexes give them.
    /// Where ids interleave, a thread two VMs could take is a VM of its own (split, never
    /// folded), and a later vCPU of the first VM after the second began is not put in it.
    #[test]
    fn vcpu_indexes_group_threads_only_where_one_vm_can_take_them() {
        let vms_of = |threads: &[(u32, Option<u32>)]| -> Vec<usize> {
            let vms = by_vcpu_ids(threads.to_vec());
            threads.iter().map(|(tid, _)| vms.iter().find(|(t, _)| t == tid).unwrap().1).collect()
        };
        // A0 A1 A2 B0 B1: two VMs.
        assert_eq!(vms_of(&[(1, Some(0)), (2, Some(1)), (3, Some(2)), (4, Some(0)), (5, Some(1))]), [0, 0, 0, 1, 1]);
        // A0 B0 then two index-1 threads either VM could own: each alone.
        assert_eq!(vms_of(&[(1, Some(0)), (2, Some(0)), (3, Some(1)), (4, Some(1))]), [0, 1, 2, 3]);
        // A0 A1 A2 B0 B1 then index 3: A's or B's, so alone (the old rule put it in B).
        let late = vms_of(&[(1, Some(0)), (2, Some(1)), (3, Some(2)), (4, Some(0)), (5, Some(1)), (6, Some(3))]);
        assert_eq!(late, [0, 0, 0, 1, 1, 2]);
        // A VM whose vCPU 0 left no trace still holds together; no index: alone.
        assert_eq!(vms_of(&[(1, Some(1)), (2, Some(2)), (3, None), (4, Some(3))]), [0, 0, 1, 0]);
    }

    /// Two VMMs started at once: their vCPU threads' ids interleave, which the indexes alone
    /// cannot sort out; the fork events say which VMM made which.
    #[test]
    fn interleaved_vmms_are_told_apart_by_the_thread_that_made_each_vcpu() {
        let threads = [(501, Some(0)), (502, Some(0)), (503, Some(1)), (504, Some(1))];
        let by_ids = group(&threads, &[], &[], &ThreadParents::default());
        assert_eq!(by_ids.values().map(|v| v.label.as_str()).collect::<std::collections::BTreeSet<_>>().len(), 4);
        let mut parents = ThreadParents::default();
        for (maker, child) in [(500, 501), (510, 502), (510, 503), (500, 504)] {
            parents.record(maker, child);
        }
        let vms = group(&threads, &[], &[], &parents);
        assert_eq!((vms[&501].label.as_str(), vms[&501].evidence), ("made by tid 500", "fork"));
        assert_eq!((vms[&501] == vms[&504], vms[&502] == vms[&503], vms[&501] == vms[&502]), (true, true, false));
    }
}
