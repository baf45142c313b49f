//! The balancing policy over time: which vCPUs each core runs, each core's energy in the last
//! period and over the run, its temperature estimate, and the swaps made. The live actuator,
//! the dry run and the replay all drive this same ledger; only where the per-vCPU energies
//! come from and whether swaps touch real threads differ.

use serde::Serialize;

use crate::balance::{decide_all, CoreEnergy, PairDecision};
use crate::energy::Thermal;

/// What decides the swaps at the end of a period.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Policy {
    /// Never swap (the baseline).
    Fixed,
    /// Seed 002's seven cases with threshold `k`.
    Thermal {
        /// Threshold, > 1.
        k: f64,
    },
}

/// One core's accounts.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CoreAccount {
    /// Energy in the last period (J).
    pub last_j: f64,
    /// Energy since the start (J).
    pub total_j: f64,
    /// Temperature estimate (°C).
    pub temp_c: f64,
}

/// A swap carried out at the end of a period: the vCPUs of `hot` and `cold` changed places.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Swap {
    /// The core that consumed more in the last period, and its partner.
    pub pair: PairDecision,
    /// vCPUs (by ledger index) that moved from `hot` to `cold`.
    pub to_cold: Vec<usize>,
    /// vCPUs that moved from `cold` to `hot`.
    pub to_hot: Vec<usize>,
}

/// The per-core ledger of one policy run.
#[derive(Debug, Clone)]
pub struct Ledger {
    core_of: Vec<usize>,
    cores: Vec<CoreAccount>,
    thermal: Thermal,
    swaps: u64,
}

impl Ledger {
    /// `core_of[v]` is the core vCPU `v` starts on, among `cores` cores (every index below).
    pub fn new(core_of: Vec<usize>, cores: usize, thermal: Thermal) -> Ledger {
        assert!(core_of.iter().all(|&c| c < cores), "a vCPU on a core outside 0..{cores}");
        let idle = CoreAccount { last_j: 0.0, total_j: 0.0, temp_c: thermal.ambient_c };
        Ledger { core_of, cores: vec![idle; cores], thermal, swaps: 0 }
    }

    /// Book one period of `period_s` seconds in which vCPU `v` consumed `vcpu_j[v]` joules
    /// on the core it was mapped to.
    pub fn account(&mut self, vcpu_j: &[f64], period_s: f64) {
        self.account_split(vcpu_j, &[], period_s);
    }

    /// [`Ledger::account`] for vCPUs that moved within the period: `shares[v]` lists the
    /// cores vCPU `v` ran on and the fraction of its run time on each (summing to 1); a vCPU
    /// without shares is charged to the core it is mapped to now.
    pub fn account_split(&mut self, vcpu_j: &[f64], shares: &[Vec<(usize, f64)>], period_s: f64) {
        for core in &mut self.cores {
            core.last_j = 0.0;
        }
        for (v, &j) in vcpu_j.iter().enumerate() {
            match shares.get(v).filter(|s| !s.is_empty()) {
                Some(split) => {
                    for &(core, fraction) in split {
                        self.cores[core].last_j += j * fraction;
                    }
                }
                None => self.cores[self.core_of[v]].last_j += j,
            }
        }
        for core in &mut self.cores {
            core.total_j += core.last_j;
            let power_w = if period_s > 0.0 { core.last_j / period_s } else { 0.0 };
            core.temp_c = self.thermal.step(core.temp_c, power_w, period_s);
        }
    }

    /// The policy's decisions for the period just booked.
    pub fn decide(&self, policy: Policy) -> Vec<PairDecision> {
        match policy {
            Policy::Fixed => Vec::new(),
            Policy::Thermal { k } => {
                let energies: Vec<CoreEnergy> =
                    self.cores.iter().map(|c| CoreEnergy { last: c.last_j, total: c.total_j }).collect();
                decide_all(&energies, k)
            }
        }
    }

    /// Exchange the vCPUs of the pairs whose decision says swap; returns what moved.
    pub fn apply(&mut self, decisions: &[PairDecision]) -> Vec<Swap> {
        decisions.iter().filter(|d| d.decision.swap).map(|&pair| self.swap(pair)).collect()
    }

    /// Exchange the vCPUs of two cores whatever the policy says (forced swaps).
    pub fn swap(&mut self, pair: PairDecision) -> Swap {
        let on = |core| (0..self.core_of.len()).filter(|&v| self.core_of[v] == core).collect::<Vec<_>>();
        let (to_cold, to_hot) = (on(pair.hot), on(pair.cold));
        for &v in &to_cold {
            self.core_of[v] = pair.cold;
        }
        for &v in &to_hot {
            self.core_of[v] = pair.hot;
        }
        self.swaps += 1;
        Swap { pair, to_cold, to_hot }
    }

    /// The core each vCPU is on now.
    pub fn core_of(&self) -> &[usize] {
        &self.core_of
    }

    /// Every core's accounts.
    pub fn cores(&self) -> &[CoreAccount] {
        &self.cores
    }

    /// The largest difference between two cores' energy since the start (J).
    pub fn gap_j(&self) -> f64 {
        let totals = self.cores.iter().map(|c| c.total_j);
        let max = totals.clone().fold(f64::NEG_INFINITY, f64::max);
        let min = totals.fold(f64::INFINITY, f64::min);
        if self.cores.is_empty() {
            0.0
        } else {
            max - min
        }
    }

    /// Swaps made so far.
    pub fn swaps(&self) -> u64 {
        self.swaps
    }
}

/// One period of a replay: the gap without and with the policy.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReplayPoint {
    /// End of the period, seconds from the start.
    pub t_s: f64,
    /// Largest per-core energy difference with the mapping kept (J).
    pub gap_without_j: f64,
    /// The same with the policy swapping (J).
    pub gap_with_j: f64,
    /// Swaps the policy made in this period.
    pub swaps: u32,
    /// Hottest core temperature without and with the policy (°C).
    pub max_temp_without_c: f64,
    /// Hottest core temperature with the policy (°C).
    pub max_temp_with_c: f64,
}

/// Run the same per-vCPU energies (`periods[p][v]`, joules) through a fixed mapping and through
/// the policy; every vCPU starts on `core_of[v]`.
pub fn replay(
    periods: &[Vec<f64>],
    period_s: f64,
    core_of: &[usize],
    cores: usize,
    k: f64,
    thermal: Thermal,
) -> Vec<ReplayPoint> {
    let mut fixed = Ledger::new(core_of.to_vec(), cores, thermal);
    let mut balanced = Ledger::new(core_of.to_vec(), cores, thermal);
    let hottest = |l: &Ledger| l.cores().iter().map(|c| c.temp_c).fold(f64::NEG_INFINITY, f64::max);
    periods
        .iter()
        .enumerate()
        .map(|(p, vcpu_j)| {
            fixed.account(vcpu_j, period_s);
            balanced.account(vcpu_j, period_s);
            let decisions = balanced.decide(Policy::Thermal { k });
            let swaps = balanced.apply(&decisions).len();
            ReplayPoint {
                t_s: (p + 1) as f64 * period_s,
                gap_without_j: fixed.gap_j(),
                gap_with_j: balanced.gap_j(),
                swaps: u32::try_from(swaps).unwrap_or(u32::MAX),
                max_temp_without_c: hottest(&fixed),
                max_temp_with_c: hottest(&balanced),
            }
        })
        .collect()
}

/// The seed's bound on the long-run gap between two cores under the policy, for a hot and a
/// cold load of at most `hot_j` and at least `cold_j` per period: a swap may leave the gap at
/// twice the period's difference (its eq. 4.10), waiting may let it reach 2(k − 1)e_j (4.19),
/// and the period being accounted adds at most one more `hot_j`.
pub fn gap_bound_j(hot_j: f64, cold_j: f64, k: f64) -> f64 {
    2.0 * (hot_j - cold_j).max((k - 1.0) * cold_j) + hot_j
}

/// [`gap_bound_j`] for the loads seen: the largest and smallest per-core period energies.
pub fn gap_bound_seen_j(per_core_period_j: impl IntoIterator<Item = f64>, k: f64) -> f64 {
    let (hot, cold) = per_core_period_j
        .into_iter()
        .fold((0.0, f64::INFINITY), |(hot, cold), j| (f64::max(hot, j), f64::min(cold, j)));
    gap_bound_j(hot, cold.min(hot), k)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::balance::Decision;

    fn pair(hot: usize, cold: usize) -> PairDecision {
        PairDecision { hot, cold, decision: Decision { case: 0, swap: true } }
    }

    #[test]
    fn accounting_charges_each_vcpu_to_its_core() {
        let mut l = Ledger::new(vec![0, 1, 1], 2, Thermal::default());
        l.account(&[3.0, 1.0, 0.5], 1.0);
        assert_eq!(l.cores()[0].last_j, 3.0);
        assert_eq!(l.cores()[1].last_j, 1.5);
        l.account(&[1.0, 1.0, 1.0], 1.0);
        assert_eq!((l.cores()[0].total_j, l.cores()[1].total_j), (4.0, 3.5));
        assert_eq!(l.gap_j(), 0.5);
        assert!(l.cores()[0].temp_c > l.cores()[1].temp_c, "the hotter core warms more");
    }

    #[test]
    fn a_vcpu_that_moved_within_a_period_is_charged_to_every_core_it_ran_on() {
        let mut l = Ledger::new(vec![0, 1], 2, Thermal::default());
        // vCPU 0 ran a quarter of its time on core 1 before moving back; vCPU 1 has no split.
        l.account_split(&[4.0, 2.0], &[vec![(1, 0.25), (0, 0.75)], vec![]], 1.0);
        assert_eq!((l.cores()[0].last_j, l.cores()[1].last_j), (3.0, 3.0));
        assert_eq!(l.gap_j(), 0.0);
    }

    #[test]
    fn a_swap_exchanges_whole_cores() {
        let mut l = Ledger::new(vec![0, 1, 1, 2], 3, Thermal::default());
        let s = l.swap(pair(1, 0));
        assert_eq!((s.to_cold, s.to_hot), (vec![1, 2], vec![0]));
        assert_eq!(l.core_of(), &[1, 0, 0, 2]);
        assert_eq!(l.swaps(), 1);
    }

    #[test]
    fn the_fixed_policy_never_swaps() {
        let mut l = Ledger::new(vec![0, 1], 2, Thermal::default());
        l.account(&[10.0, 0.1], 0.1);
        assert!(l.decide(Policy::Fixed).is_empty());
        assert_eq!(l.decide(Policy::Thermal { k: 1.2 }).len(), 1);
    }

    #[test]
    fn a_replay_keeps_the_gap_bounded_where_the_fixed_mapping_lets_it_grow() {
        let periods: Vec<Vec<f64>> = (0..500).map(|_| vec![1.0, 0.1]).collect();
        let points = replay(&periods, 0.1, &[0, 1], 2, 1.2, Thermal::default());
        let last = points.last().unwrap();
        assert!((last.gap_without_j - 450.0).abs() < 1e-6, "0.9 J per period for 500 periods");
        let bound = gap_bound_j(1.0, 0.1, 1.2);
        assert_eq!(gap_bound_seen_j([0.1, 1.0, 0.5], 1.2), bound);
        assert!(points.iter().all(|p| p.gap_with_j <= bound + 1e-9), "bound {bound}");
        assert!(last.max_temp_with_c < last.max_temp_without_c, "balanced cores run cooler");
        let swaps: u32 = points.iter().map(|p| p.swaps).sum();
        assert!(swaps > 100, "a hot/cold pair is swapped often: {swaps}");
    }
}
