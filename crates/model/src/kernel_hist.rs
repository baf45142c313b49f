//! The kernel's own exit histograms (its hist triggers, `exits --kernel-hist`, `record
//! --kernel-hist`): per exit reason, what it timed, in `virtprof_analysis::hist`'s buckets.

/// One exit reason's histogram, as the kernel kept it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct ReasonHist {
    /// `kvm_exit`'s exit_reason.
    pub reason: u32,
    /// `kvm_exit`'s isa (1 VMX, 2 SVM).
    pub isa: u32,
    /// Exits timed.
    pub count: u64,
    /// Their durations' sum (ns).
    pub sum_ns: u64,
    /// The shortest, if any.
    pub min_ns: Option<u64>,
    /// The longest, if any.
    pub max_ns: Option<u64>,
    /// (smallest value of the bucket, exits), ascending.
    pub buckets: Vec<(u64, u64)>,
}

/// What the kernel's triggers counted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct KernelExitHists {
    /// Per (exit_reason, isa), sorted by them.
    pub reasons: Vec<ReasonHist>,
    /// Exits or threads a map had no room for (the kernel's `Dropped` totals): that many
    /// exits, at least, are missing from the figures.
    pub dropped: u64,
}

impl KernelExitHists {
    /// Exits timed, all reasons (saturating: a recording's footer is a claim).
    pub fn exits(&self) -> u64 {
        self.reasons.iter().fold(0u64, |n, r| n.saturating_add(r.count))
    }
}
