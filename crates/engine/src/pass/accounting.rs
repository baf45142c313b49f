//! The scheduling accounting of a recording's vCPU threads: `analysis::sched` told which
//! threads to follow from the recording's task table, and from when.

use std::collections::HashSet;

use virtprof_analysis::qos::VmInfo;
use virtprof_analysis::sched::{SchedAccounting, SchedOptions, MAX_KEPT_BUCKETS};
use virtprof_analysis::{Analyzer, Names};
use virtprof_model::units::format_duration_ns;
use virtprof_model::EventKind;
use virtprof_session::Session;
use virtprof_store::recording::GuestVcpuThreads;

use crate::tasks::HostTasks;
use crate::vcpu_vms::VcpuEvidence;

/// Run/wait/blocked accounting of a recording's vCPU threads and the other threads of their
/// VMMs. Named threads alive at
/// the start are accounted from the first event; threads that appear later from their first
/// event (before it they did not exist).
pub struct VcpuAccounting {
    pub inner: SchedAccounting,
    initial: Vec<u32>,
    late: HashSet<u32>,
    first: bool,
    first_ts: u64,
    last_ts: u64,
    source: std::path::PathBuf,
    /// What puts vCPU threads of no known process in their VMs, as `exits --by vm` does.
    vcpus: VcpuEvidence,
    guests: Vec<GuestVcpuThreads>,
}

impl VcpuAccounting {
    pub fn new(recording: &Session, host: &HostTasks, options: SchedOptions, evidence: Vec<u16>) -> Self {
        // vCPU threads and the VMM's other threads (I/O threads, main loop, vhost workers).
        let named: Vec<u32> = host
            .vms(&[], &[])
            .iter()
            .flat_map(|vm| vm.vcpus.iter().map(|v| v.tid.0).chain(vm.others.iter().map(|t| t.tid)))
            .collect();
        let at_start: HashSet<u32> = recording
            .metadata
            .tasks
            .iter()
            .map(|t| t.tid)
            .filter(|t| recording.appeared.binary_search(t).is_err())
            .collect();
        let (initial, late): (Vec<u32>, Vec<u32>) = named.iter().partition(|t| at_start.contains(t));
        VcpuAccounting {
            inner: SchedAccounting::new(options, evidence),
            initial,
            late: late.into_iter().collect(),
            first: true,
            first_ts: 0,
            last_ts: 0,
            source: recording.path.clone(),
            vcpus: VcpuEvidence::default(),
            guests: recording.metadata.guests.clone(),
        }
    }

    /// Feed one event (in timestamp order).
    fn on_event(&mut self, e: &virtprof_model::Event) {
        if self.first {
            self.initial.iter().for_each(|&tid| self.inner.track(tid, e.ts));
            self.first = false;
            self.first_ts = e.ts;
        }
        if !self.late.is_empty() {
            let mentioned = match e.kind {
                EventKind::SchedSwitch { prev_tid, next_tid, .. } => [prev_tid, next_tid],
                EventKind::SchedWakeup { tid, .. } | EventKind::SchedMigrate { tid, .. } => [tid, tid],
                _ => [e.tid, e.tid],
            };
            for tid in mentioned {
                if self.late.remove(&tid) {
                    self.inner.track(tid, e.ts);
                }
            }
        }
        self.inner.on_event(e);
        self.vcpus.on_event(e);
        self.last_ts = e.ts;
    }

    /// The VMs whose vCPU threads were seen (of `only`, when not empty), given the whole run.
    pub fn vms(&self, host: &HostTasks, total: &virtprof_analysis::sched::Span, only: &[u32]) -> Vec<VmInfo> {
        let tracked: Vec<u32> = self.inner.kvm_threads().collect();
        let host = crate::vcpu_vms::regrouped(host, &tracked, &self.guests, &self.vcpus);
        // The kernel's task caches remember threads of VMs long gone: keep what was seen running.
        let mut vms = host.vms(&tracked, only);
        for vm in &mut vms {
            vm.vcpus.retain(|v| total.thread(v.tid.0, None).observed_ns() > 0);
            vm.others.retain(|t| total.thread(t.tid, None).observed_ns() > 0);
        }
        vms.retain(|vm| !vm.vcpus.is_empty());
        vms
    }

    /// Close the run at the last event and return it whole; an error if its windows would
    /// not fit in memory (a damaged timestamp, or windows too small for its length).
    pub fn finish(&mut self) -> anyhow::Result<virtprof_analysis::sched::Span> {
        if let Some(ts) = self.inner.overflow() {
            let width = self.inner.options().bucket_ns;
            return Err(crate::usage(format!(
                "'{}': an event {} after the first needs more than {MAX_KEPT_BUCKETS} windows of {}: ask for a wider --window, or the file is damaged there (see the `lost events` line of `virtprof exits`)",
                self.source.display(),
                format_duration_ns(ts.saturating_sub(self.first_ts)),
                format_duration_ns(width),
            )));
        }
        Ok(self.inner.finish(self.last_ts))
    }
}

impl Analyzer for VcpuAccounting {
    fn on_event(&mut self, event: &virtprof_model::Event, _: &dyn Names) {
        VcpuAccounting::on_event(self, event);
    }
}

/// Threads and VM identities a recording knows.
pub fn recording_tasks(recording: &Session) -> HostTasks {
    let md = &recording.metadata;
    let mut host = HostTasks::default();
    for t in &md.tasks {
        host.threads.insert(t.tid, (t.pid, t.comm.clone()));
    }
    let late = recording.footer.iter().flat_map(|f| f.vm_identities.iter());
    for vm in md.vm_identities.iter().chain(late) {
        host.identities.insert(vm.pid, vm.clone());
    }
    host
}
