//! Who made each thread, from `sched_process_fork`: the one account of a thread's process a
//! trace.dat can carry (it has no tgids). The event does not say whether the child is a
//! thread or a process, so only the direct parent is kept, never a chain: two threads made
//! by the same thread are in one process unless one of them is a new process, and a vCPU
//! thread is never that (it runs its VM's KVM_RUN in the VMM's own address space).

use std::collections::BTreeMap;

use virtprof_model::{Event, EventKind};

use crate::{Analyzer, Names};

/// Children kept at most; a fork storm past it is counted, not kept, so memory stays bounded.
const MAX_CHILDREN: usize = 1 << 20;

/// Child thread → the thread that made it, for the forks the trace saw.
#[derive(Debug, Default)]
pub struct ThreadParents {
    parents: BTreeMap<u32, u32>,
    /// Forks past [`MAX_CHILDREN`], not kept.
    pub dropped: u64,
}

impl ThreadParents {
    /// The thread that made `tid`, if the trace saw it being made.
    pub fn parent(&self, tid: u32) -> Option<u32> {
        self.parents.get(&tid).copied()
    }

    /// `parent_tid` made `child_tid`.
    pub fn record(&mut self, parent_tid: u32, child_tid: u32) {
        // A tid reused after its thread ended belongs to its newest maker.
        if self.parents.len() < MAX_CHILDREN || self.parents.contains_key(&child_tid) {
            self.parents.insert(child_tid, parent_tid);
        } else {
            self.dropped += 1;
        }
    }
}

impl Analyzer for ThreadParents {
    fn on_event(&mut self, e: &Event, _: &dyn Names) {
        if let EventKind::SchedFork { parent_tid, child_tid } = e.kind {
            self.record(parent_tid, child_tid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TestNames;

    fn fork(parent_tid: u32, child_tid: u32) -> Event {
        Event { ts: 1, cpu: 0, tid: parent_tid, kind: EventKind::SchedFork { parent_tid, child_tid } }
    }

    #[test]
    fn each_thread_has_its_latest_maker_and_other_events_are_ignored() {
        let mut p = ThreadParents::default();
        for e in
            [fork(100, 101), fork(100, 102), fork(7, 101), Event { kind: EventKind::Other { event: 3 }, ..fork(1, 2) }]
        {
            p.on_event(&e, &TestNames);
        }
        assert_eq!((p.parent(101), p.parent(102), p.parent(2), p.dropped), (Some(7), Some(100), None, 0));
    }
}
