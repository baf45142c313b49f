//! Guest samples explained by the host's events, summed up: what `noise --testvm` and `noise
//! --host-recording` report for each guest CPU.

use std::collections::BTreeMap;

use serde::Serialize;
use virtprof_analysis::noise::{Attributed, HostCause};
use virtprof_model::evidence::{Figure, Holdings};
use virtprof_trace::decode::Decoder;

/// Samples and time per host cause.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct CauseTotal {
    pub samples: u64,
    /// Their time besides steal (None: the steal is unknown, see `unavailable`).
    pub ns: Option<u64>,
}

/// The host's account of a set of guest samples.
#[derive(Debug, Clone, Serialize)]
pub struct Explanation {
    /// Time the host trace shows the vCPU thread off its CPU during samples (None: the source
    /// lacks sched_switch, see `unavailable`).
    pub host_steal_ns: Option<u64>,
    /// By the cause of each sample's non-steal part (`steal` when preemption is all of it).
    pub by_cause: BTreeMap<HostCause, CauseTotal>,
    /// Who preempted the vCPU, ns.
    pub preemptors: BTreeMap<String, u64>,
    /// Exits that explain samples, by reason.
    pub exit_reasons: BTreeMap<String, u64>,
    /// Share of guest noise time the host explains, % (None: the source lacks an event class
    /// that explains noise, so the rest is not known to be unexplained).
    pub explained_pct: Option<f64>,
    /// Figures the source cannot give, with why.
    pub unavailable: Vec<String>,
    #[serde(skip)]
    explained_ns: u64,
    #[serde(skip)]
    total_ns: u64,
}

impl Explanation {
    /// Nothing yet (all of nothing is explained).
    pub fn new() -> Explanation {
        Explanation {
            host_steal_ns: Some(0),
            by_cause: BTreeMap::new(),
            preemptors: BTreeMap::new(),
            exit_reasons: BTreeMap::new(),
            explained_pct: Some(100.0),
            unavailable: Vec::new(),
            explained_ns: 0,
            total_ns: 0,
        }
    }

    /// Add one sample of `len` ns as the host attributed it (names through `decoder`).
    pub fn add(&mut self, len: u64, a: &Attributed, decoder: &Decoder) {
        self.host_steal_ns = self.host_steal_ns.map(|ns| ns + a.steal_ns);
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
        entry.ns = Some(entry.ns.unwrap_or(0) + len - a.steal_ns);
        self.total_ns += len;
        // An unexplained sample has no off-CPU time either (that would make it `steal`).
        self.explained_ns += if a.cause == HostCause::Unexplained { 0 } else { len };
        self.explained_pct = self.explained_pct.map(|_| {
            if self.total_ns == 0 {
                100.0
            } else {
                100.0 * self.explained_ns as f64 / self.total_ns as f64
            }
        });
    }

    /// Only what `holdings` has the events for: the host's steal and preemptors need
    /// sched_switch; the explained share needs every event class that explains noise.
    pub fn known_by(mut self, holdings: &Holdings) -> Explanation {
        if let Err(u) = holdings.check(Figure::NoiseHostSteal) {
            (self.host_steal_ns, self.preemptors) = (None, BTreeMap::new());
            // Each cause's time is besides steal: with the steal unknown, so is it.
            self.by_cause.values_mut().for_each(|t| t.ns = None);
            self.unavailable.push(u.to_string());
        }
        if let Err(u) = holdings.check(Figure::NoiseExplained) {
            self.explained_pct = None;
            self.unavailable.push(u.to_string());
        }
        self
    }
}
