//! Which VM each vCPU thread belongs to, from the best evidence the source has: the thread's
//! process (a recording's tasks, a dump's tgids), the capture's GUEST option (trace-cmd names
//! each guest's vCPU threads), the thread that made it (`sched_process_fork`, where the
//! capture has it: a VMM's vCPU threads share their maker), or, for threads none of these
//! name (a trace.dat has no tgids), the vCPU indexes their kvm_exit/kvm_entry events carry:
//! a VMM starts its vCPU threads in order, so among threads sorted by id the index restarting
//! means the next VM. That last one is a guess: VMMs started at the same moment interleave
//! their threads' ids, and then it can split a VM or put threads of two VMs in one.

use std::collections::BTreeMap;

use serde::Serialize;
use virtprof_analysis::thread_parents::ThreadParents;
use virtprof_store::recording::{GuestVcpuThreads, Task};

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
    unplaced.sort_unstable();
    let mut vm = 0;
    let mut last: Option<u32> = None;
    for (tid, index) in unplaced {
        // A thread without an index, or one not above the previous, starts the next VM.
        if last.is_some() && index.is_none_or(|i| last.is_some_and(|l| i <= l)) {
            vm += 1;
        }
        last = index.or(Some(u32::MAX));
        out.insert(tid, VmOf { label: format!("VM {} (inferred)", vm + 1), pid: None, evidence: "vcpu ids" });
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

    /// Two VMMs started at once: their vCPU threads' ids interleave, which the indexes alone
    /// read as three VMs with one of them mixed; the fork events say which VMM made which.
    #[test]
    fn interleaved_vmms_are_told_apart_by_the_thread_that_made_each_vcpu() {
        let threads = [(501, Some(0)), (502, Some(0)), (503, Some(1)), (504, Some(1))];
        let by_ids = group(&threads, &[], &[], &ThreadParents::default());
        assert_eq!(by_ids.values().map(|v| v.label.as_str()).collect::<std::collections::BTreeSet<_>>().len(), 3);
        let mut parents = ThreadParents::default();
        for (maker, child) in [(500, 501), (510, 502), (510, 503), (500, 504)] {
            parents.record(maker, child);
        }
        let vms = group(&threads, &[], &[], &parents);
        assert_eq!((vms[&501].label.as_str(), vms[&501].evidence), ("made by tid 500", "fork"));
        assert_eq!((vms[&501] == vms[&504], vms[&502] == vms[&503], vms[&501] == vms[&502]), (true, true, false));
    }
}
