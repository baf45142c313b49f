//! Entities several crates pass around: a VM's vCPU threads and a CPU's kernel loss counters.
//! Both are stored as short arrays in files and JSON (`[index, tid]`, `[cpu, overrun, dropped]`),
//! which is how recordings have always held them.

use crate::ids::{Cpu, Tid};

/// A vCPU of a VM and the host thread that runs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(from = "(u32, Tid)", into = "(u32, Tid)")
)]
pub struct VcpuThread {
    /// The vCPU's index in its VM.
    pub index: u32,
    /// Its host thread.
    pub tid: Tid,
}

impl VcpuThread {
    /// vCPU `index`, run by thread `tid`.
    pub fn new(index: u32, tid: u32) -> VcpuThread {
        VcpuThread { index, tid: Tid(tid) }
    }
}

impl From<(u32, Tid)> for VcpuThread {
    fn from((index, tid): (u32, Tid)) -> Self {
        VcpuThread { index, tid }
    }
}

impl From<VcpuThread> for (u32, Tid) {
    fn from(v: VcpuThread) -> Self {
        (v.index, v.tid)
    }
}

/// One CPU's ring-buffer loss as the kernel counts it (`per_cpu/cpuN/stats`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(from = "(Cpu, u64, u64)", into = "(Cpu, u64, u64)")
)]
pub struct KernelLoss {
    /// The CPU.
    pub cpu: Cpu,
    /// Events overwritten before being read.
    pub overrun: u64,
    /// Events dropped because the buffer was full.
    pub dropped: u64,
}

impl KernelLoss {
    /// Both counts, saturating (corrupt counters must never wrap to a small figure).
    pub fn events(&self) -> u64 {
        self.overrun.saturating_add(self.dropped)
    }
}

impl From<(Cpu, u64, u64)> for KernelLoss {
    fn from((cpu, overrun, dropped): (Cpu, u64, u64)) -> Self {
        KernelLoss { cpu, overrun, dropped }
    }
}

impl From<KernelLoss> for (Cpu, u64, u64) {
    fn from(l: KernelLoss) -> Self {
        (l.cpu, l.overrun, l.dropped)
    }
}

#[cfg(all(test, feature = "serde"))]
mod tests {
    use super::*;

    #[test]
    fn entities_keep_their_array_form() {
        let v = VcpuThread::new(1, 4242);
        assert_eq!(serde_json::to_string(&v).unwrap(), "[1,4242]");
        assert_eq!(serde_json::from_str::<VcpuThread>("[1,4242]").unwrap(), v);
        let l = KernelLoss { cpu: Cpu(3), overrun: 5, dropped: 7 };
        assert_eq!(serde_json::to_string(&l).unwrap(), "[3,5,7]");
        assert_eq!(serde_json::from_str::<KernelLoss>("[3,5,7]").unwrap(), l);
        assert_eq!(KernelLoss { cpu: Cpu(0), overrun: u64::MAX, dropped: 1 }.events(), u64::MAX);
    }
}
