//! When the interval thread looks for new VMs. A scan of /proc costs about 1 % of a CPU at
//! every 10 ms on a quiet host (a scan re-reads the fd tables of every process younger than
//! 10 s: a quarter of a CPU where processes start all the time), so scans back off while
//! nothing changes; three signs bring the next one forward: a VM found (its vCPU threads
//! follow), a VM seen before its vCPU threads are (the moment between KVM_CREATE_VM and the
//! threads' start), and a new pid (a process or thread began). Without the last, a VM starting
//! late in a recording and living less than the longest wait was never sampled at all. New
//! pids that bring no VM back off in turn: where tasks start all the time, scans keep to the
//! timed back-off, as they did before; once the pids rest, the next new one is acted on at
//! once. Where KVM announces its VMs (a uevent at each KVM_CREATE_VM; see
//! `virtprof_kvm::uevents`), the interval thread scans at the next wake-up after one, whatever
//! the back-off: this schedule is then what finds VMs only where the announcements do not come.

use std::collections::HashMap;
use std::time::Duration;

use virtprof_kvm::discover::DiscoveredVm;

/// The first wait, and the wait after any sign of a new VM.
pub const FIRST: Duration = Duration::from_millis(10);
/// The longest wait between scans while nothing changes.
pub const AT_MOST: Duration = Duration::from_millis(500);
/// How early a wake-up may come for its wait (timer slack, a late wake-up before it).
const EARLY: Duration = Duration::from_millis(1);
/// Scans in a row a VM may stay short of its vCPU threads and still be looked at again at
/// once: a VMM whose threads are never named as vCPUs must not keep scans at their fastest.
const UNSETTLED_SCANS: u8 = 8;

/// The back-off and the signs that cut it short.
#[derive(Debug)]
pub struct ScanSchedule {
    wait: Duration,
    /// The least time after a scan that a new pid brings the next one.
    pid_wait: Duration,
    /// The last pid the kernel had handed out at the last scan.
    pid_at_scan: Option<u32>,
    /// VMs seen short of their vCPU threads: scans they have been so.
    unsettled: HashMap<u32, u8>,
}

impl ScanSchedule {
    /// A schedule whose first scan comes [`FIRST`] after the one made at the start.
    pub fn new(last_pid: Option<u32>) -> Self {
        ScanSchedule { wait: FIRST, pid_wait: FIRST, pid_at_scan: last_pid, unsettled: HashMap::new() }
    }

    /// Whether a scan is due `since` the last one; `last_pid` reads the kernel's last pid
    /// (only when the answer hangs on it). A wake-up a little early for its wait counts: at
    /// 10 ms intervals one 9.9 ms after the last scan would otherwise put scans 20 ms apart.
    pub fn due(&self, since: Duration, last_pid: impl FnOnce() -> Option<u32>) -> bool {
        let since = since + EARLY;
        since >= self.wait || (since >= self.pid_wait && last_pid() != self.pid_at_scan)
    }

    /// A scan was made (at `last_pid`) and found `vms`, `new_vm` of them or their vCPUs new.
    pub fn scanned(&mut self, last_pid: Option<u32>, vms: &[DiscoveredVm], new_vm: bool) {
        let new_pids = last_pid != self.pid_at_scan;
        self.pid_at_scan = last_pid;
        let unsettled: HashMap<u32, u8> = vms
            .iter()
            .filter(|vm| vm.vcpu_fds == 0 || vm.vcpus.len() < vm.vcpu_fds as usize)
            .map(|vm| (vm.pid, self.unsettled.get(&vm.pid).map_or(1, |n| n.saturating_add(1))))
            .collect();
        let settling = unsettled.values().any(|&n| n <= UNSETTLED_SCANS);
        self.unsettled = unsettled;
        if new_vm || settling {
            (self.wait, self.pid_wait) = (FIRST, FIRST);
        } else {
            self.wait = (self.wait * 2).min(AT_MOST);
            self.pid_wait = if new_pids { (self.pid_wait * 2).min(AT_MOST) } else { FIRST };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use virtprof_kvm::discover::VcpuThread;
    use virtprof_model::vmm::VmmKind;

    fn vm(pid: u32, vcpu_fds: u32, threads: u32) -> DiscoveredVm {
        DiscoveredVm {
            pid,
            kind: VmmKind::Unknown,
            name: String::new(),
            vcpu_fds,
            vcpus: (0..threads).map(|index| VcpuThread { index, tid: pid + 1 + index }).collect(),
            owner: Default::default(),
        }
    }

    #[test]
    fn backs_off_while_nothing_changes() {
        let mut s = ScanSchedule::new(Some(100));
        let mut waits = Vec::new();
        for _ in 0..8 {
            s.scanned(Some(100), &[], false);
            waits.push(s.wait.as_millis());
        }
        assert_eq!(waits, [20, 40, 80, 160, 320, 500, 500, 500]);
        assert!(!s.due(Duration::from_millis(498), || Some(100)));
        assert!(s.due(Duration::from_millis(499), || Some(100)));
    }

    #[test]
    fn a_new_pid_after_a_rest_brings_the_scan_forward_but_not_under_the_first_wait() {
        let mut s = ScanSchedule::new(Some(100));
        (0..8).for_each(|_| s.scanned(Some(100), &[], false));
        assert!(!s.due(Duration::from_millis(8), || Some(101)));
        assert!(s.due(Duration::from_micros(9_500), || Some(101)));
        // Where the pid cannot be read, the back-off alone.
        s.scanned(None, &[], false);
        assert!(!s.due(Duration::from_millis(100), || None));
    }

    #[test]
    fn new_pids_that_bring_no_vm_back_off_until_the_pids_rest() {
        let mut s = ScanSchedule::new(Some(100));
        // A host where tasks start all the time: each scan sees new pids and finds nothing.
        let gaps: Vec<u128> = (1..=7)
            .map(|pid| {
                s.scanned(Some(100 + pid), &[], false);
                s.pid_wait.as_millis()
            })
            .collect();
        assert_eq!(gaps, [20, 40, 80, 160, 320, 500, 500]);
        assert!(!s.due(Duration::from_millis(400), || Some(1000)));
        // The pids rest for a scan: the next new one is acted on at once again.
        s.scanned(Some(107), &[], false);
        s.scanned(Some(107), &[], false);
        assert!(s.due(Duration::from_millis(10), || Some(108)));
        // A VM found: everything at its fastest.
        (1..=7).for_each(|pid| s.scanned(Some(200 + pid), &[], false));
        s.scanned(Some(300), &[vm(300, 1, 1)], true);
        assert!(s.due(Duration::from_millis(10), || Some(301)));
    }

    #[test]
    fn a_vm_short_of_its_vcpu_threads_is_looked_at_again_soon_for_a_while() {
        let mut s = ScanSchedule::new(None);
        (0..8).for_each(|_| s.scanned(None, &[], false));
        s.scanned(None, &[vm(7, 0, 0)], false);
        assert_eq!(s.wait, FIRST, "between KVM_CREATE_VM and its vCPUs");
        s.scanned(None, &[vm(7, 2, 1)], true);
        assert_eq!(s.wait, FIRST);
        s.scanned(None, &[vm(7, 2, 2)], false);
        assert_eq!(s.wait, 2 * FIRST, "complete: back off again");
        // A VMM whose threads are never named as vCPUs: fast for a few scans, then back off.
        let mut s = ScanSchedule::new(None);
        let waits: Vec<u128> = (0..12)
            .map(|_| {
                s.scanned(None, &[vm(9, 1, 0)], false);
                s.wait.as_millis()
            })
            .collect();
        assert_eq!(waits, [10, 10, 10, 10, 10, 10, 10, 10, 20, 40, 80, 160]);
    }
}
