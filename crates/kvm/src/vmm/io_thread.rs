//! A device I/O thread, as QEMU's iothreads serve virtio queues (`--io-thread`): the vCPU
//! thread hands each `io-bound` request to it and blocks until it answers; it waits out the
//! device latency and answers only once it gets a CPU. Starving it (its CPU taken, a low
//! weight) keeps the vCPUs blocked longer: seed 001's finding, reproduced on purpose.

use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::time::Duration;

use virtprof_model::testvm::ThreadReport;

use crate::error::VmmError;

/// The thread's name: what QEMU names an iothread, so discovery gives it the io-thread role.
pub(crate) const NAME: &str = "IO iothread0";

/// How the vCPU threads reach the I/O thread.
#[derive(Clone)]
pub(crate) struct IoRequests {
    requests: SyncSender<SyncSender<()>>,
}

impl IoRequests {
    /// Hand one request over and wait for its answer.
    pub fn serve(&self, vcpu: u32) -> Result<(), VmmError> {
        let (answer, answered) = sync_channel(1);
        let gone = || VmmError::Guest { vcpu, message: "the I/O thread is gone".into() };
        self.requests.send(answer).map_err(|_| gone())?;
        answered.recv().map_err(|_| gone())
    }
}

/// The requests and the receiving end the thread serves.
pub(crate) fn channel(vcpus: u32) -> (IoRequests, Receiver<SyncSender<()>>) {
    let (requests, incoming) = sync_channel(vcpus.max(1) as usize);
    (IoRequests { requests }, incoming)
}

/// Serve requests until every vCPU has let go of its sender; its schedstat over the run.
pub(crate) fn run(incoming: &Receiver<SyncSender<()>>, latency: Duration, pin: Option<u32>) -> ThreadReport {
    if let Some(cpu) = pin {
        // Best effort: unpinned, it is still an I/O thread (the report says where it ran).
        let _ = virtprof_host::affinity::set(0, &[cpu]);
    }
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() } as u32;
    let before = virtprof_host::read_schedstat();
    let mut requests = 0u64;
    while let Ok(answer) = incoming.recv() {
        std::thread::sleep(latency);
        let _ = answer.send(());
        requests += 1;
    }
    let sched = virtprof_host::read_schedstat().since(before);
    ThreadReport { tid, pinned_cpu: pin, requests, run_ns: sched.run_ns, wait_ns: sched.wait_ns }
}
