//! Guest samples explained by the host's events, summed up: what `noise --testvm` and `noise
//! --host-recording` report for each guest CPU.

use std::collections::BTreeMap;

use serde::Serialize;
use virtprof_analysis::noise::{Attributed, HostCause};
use virtprof_trace::decode::Decoder;

/// Samples and time per host cause.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct CauseTotal {
    pub samples: u64,
    pub ns: u64,
}

/// The host's account of a set of guest samples.
#[derive(Debug, Clone, Serialize)]
pub struct Explanation {
    /// Time the host trace shows the vCPU thread off its CPU during samples.
    pub host_steal_ns: u64,
    /// By the cause of each sample's non-steal part (`steal` when preemption is all of it).
    pub by_cause: BTreeMap<HostCause, CauseTotal>,
    /// Who preempted the vCPU, ns.
    pub preemptors: BTreeMap<String, u64>,
    /// Exits that explain samples, by reason.
    pub exit_reasons: BTreeMap<String, u64>,
    /// Share of guest noise time the host explains, %.
    pub explained_pct: f64,
    #[serde(skip)]
    explained_ns: u64,
    #[serde(skip)]
    total_ns: u64,
}

impl Explanation {
    /// Nothing yet (all of nothing is explained).
    pub fn new() -> Explanation {
        Explanation {
            host_steal_ns: 0,
            by_cause: BTreeMap::new(),
            preemptors: BTreeMap::new(),
            exit_reasons: BTreeMap::new(),
            explained_pct: 100.0,
            explained_ns: 0,
            total_ns: 0,
        }
    }

    /// Add one sample of `len` ns as the host attributed it (names through `decoder`).
    pub fn add(&mut self, len: u64, a: &Attributed, decoder: &Decoder) {
        self.host_steal_ns += a.steal_ns;
        if let Some(who) = a.preemptor {
            *self.preemptors.entry(decoder.strings.resolve(who).to_string()).or_default() += a.steal_ns;
        }
        if let Some((heavy, reason, isa)) = a.reason {
            let name = if heavy {
                decoder.symbol("kvm", "kvm_userspace_exit", "reason", u64::from(reason)).map(str::to_string)
            } else {
                decoder.exit_name(reason, isa)
            };
            *self.exit_reasons.entry(name.unwrap_or_else(|| reason.to_string())).or_default() += 1;
        }
        let entry = self.by_cause.entry(a.cause).or_default();
        entry.samples += 1;
        entry.ns += len - a.steal_ns;
        self.total_ns += len;
        // An unexplained sample has no off-CPU time either (that would make it `steal`).
        self.explained_ns += if a.cause == HostCause::Unexplained { 0 } else { len };
        self.explained_pct =
            if self.total_ns == 0 { 100.0 } else { 100.0 * self.explained_ns as f64 / self.total_ns as f64 };
    }
}
