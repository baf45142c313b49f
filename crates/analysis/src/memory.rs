//! Guest memory faulted in by KVM, and taken back by the host: a balloon inflating, free page
//! reporting, host reclaim (kswapd) or a VMM discarding RAM unmaps guest pages
//! (`kvm_unmap_hva_range`); the guest's next touch of each makes KVM fault it in again
//! (`kvm_mmu_spte_requested`, on the vCPU's thread). Counted per watched vCPU thread, and
//! the unmaps per task that made them. (Their time is not in these events: on hosts that trace
//! kvm_exit it is the EPT-violation or NPF exits'.)

use std::collections::{HashMap, HashSet};

use virtprof_model::{Event, EventKind};

use crate::{Analyzer, Names};

/// Tasks kept by name (a host can run many short-lived ones): past it their unmaps count
/// under no task.
pub const MAX_TASKS: usize = 256;

/// What it counted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemoryFaults {
    /// Pages KVM faulted in for the watched vCPU threads.
    pub faults: u64,
    /// Unmaps of guest memory, by the task that made them: tid → unmaps.
    pub unmaps_by: HashMap<u32, u64>,
    /// Unmaps made by tasks past [`MAX_TASKS`].
    pub unmaps_unnamed: u64,
}

/// Push-fed: every host event.
#[derive(Debug)]
pub struct MemoryCounter {
    watched: HashSet<u32>,
    fault_event: Option<u16>,
    unmap_event: Option<u16>,
    counted: MemoryFaults,
}

impl MemoryCounter {
    /// Count faults on `watched` threads; `fault_event` and `unmap_event` are the source's ids
    /// of `kvmmmu:kvm_mmu_spte_requested` and `kvm:kvm_unmap_hva_range` (None: not held).
    pub fn new(watched: impl IntoIterator<Item = u32>, fault_event: Option<u16>, unmap_event: Option<u16>) -> Self {
        MemoryCounter { watched: watched.into_iter().collect(), fault_event, unmap_event, counted: Default::default() }
    }

    /// What it counted.
    pub fn finish(self) -> MemoryFaults {
        self.counted
    }
}

impl Analyzer for MemoryCounter {
    fn on_event(&mut self, e: &Event, _: &dyn Names) {
        let EventKind::Other { event } = e.kind else { return };
        if Some(event) == self.fault_event && self.watched.contains(&e.tid) {
            self.counted.faults += 1;
        } else if Some(event) == self.unmap_event {
            let room = self.counted.unmaps_by.len() < MAX_TASKS;
            match self.counted.unmaps_by.get_mut(&e.tid) {
                Some(n) => *n += 1,
                None if room => {
                    self.counted.unmaps_by.insert(e.tid, 1);
                }
                None => self.counted.unmaps_unnamed += 1,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_count_on_the_watched_vcpus_and_unmaps_by_who_made_them() {
        let mut m = MemoryCounter::new([10], Some(7), Some(8));
        for (tid, event) in [(10, 7), (10, 7), (11, 7), (20, 8), (20, 8), (30, 8), (10, 9)] {
            m.on_event(&Event { ts: 0, cpu: 0, tid, kind: EventKind::Other { event } }, &crate::TestNames);
        }
        let counted = m.finish();
        assert_eq!(counted.faults, 2);
        assert_eq!(counted.unmaps_by, HashMap::from([(20, 2), (30, 1)]));
        // Without the events held, nothing is counted (the figures are then unknown).
        let mut blind = MemoryCounter::new([10], None, None);
        blind.on_event(&Event { ts: 0, cpu: 0, tid: 10, kind: EventKind::Other { event: 7 } }, &crate::TestNames);
        assert_eq!(blind.finish(), MemoryFaults::default());
    }
}
