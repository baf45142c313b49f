//! `top`'s per-core energy line. While a `virtprof balance` runs, its own per-core accounts
//! and swaps/s (from its status file). Otherwise `top`'s estimate: each refresh, every vCPU's
//! run time and exits since the last refresh are turned into joules with `balance`'s default
//! model and charged to the CPU the vCPU is on at the refresh (exact for pinned vCPUs), and each
//! core's RC model is stepped.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;
use virtprof_analysis::energy::{Activity, Thermal, Weights};
use virtprof_analysis::qos::WindowReport;

use super::{status, Model};

/// One core in the energy line.
#[derive(Debug, Clone, Serialize)]
pub struct CoreRow {
    /// Host CPU.
    pub cpu: u32,
    /// Power of its vCPUs over the last refresh (W).
    pub power_w: f64,
    /// Energy since `top` started (J).
    pub total_j: f64,
    /// RC-model temperature (°C).
    pub temp_c: f64,
}

/// The energy line's state between refreshes.
pub struct EnergyBook {
    weights: Weights,
    thermal: Thermal,
    cores: BTreeMap<u32, CoreRow>,
    /// tid → (run ns, exits) at the last refresh.
    previous: HashMap<u32, (u64, u64)>,
    last_ns: Option<u64>,
    swaps: Option<(u64, u64)>,
    /// Swaps per second of running balancers over the last refresh (None: none running).
    pub swaps_per_s: Option<f64>,
    /// The balancer whose accounts are shown, if one runs.
    pub balancer: Option<u32>,
    balanced: Vec<CoreRow>,
}

impl EnergyBook {
    /// Cores `cpus`, at ambient temperature.
    pub fn new(cpus: &[u32]) -> EnergyBook {
        let model = Model::default_model();
        let cores = cpus
            .iter()
            .map(|&cpu| (cpu, CoreRow { cpu, power_w: 0.0, total_j: 0.0, temp_c: model.thermal.ambient_c }))
            .collect();
        EnergyBook {
            weights: model.weights(),
            thermal: model.thermal,
            cores,
            previous: HashMap::new(),
            last_ns: None,
            swaps: None,
            swaps_per_s: None,
            balancer: None,
            balanced: Vec::new(),
        }
    }

    /// Book the refresh at `now` from the whole-run window (cumulative per vCPU).
    pub fn update(&mut self, now: u64, run: &WindowReport) {
        let mut joules: BTreeMap<u32, f64> = BTreeMap::new();
        for v in run.vms.iter().flat_map(|vm| &vm.vcpus) {
            // Live windows know every vCPU's run time and exits (live tracing records both).
            let (run_ns, exits) = (v.run_ns.unwrap_or(0), v.exits.unwrap_or(0));
            let (run0, exits0) = self.previous.insert(v.tid, (run_ns, exits)).unwrap_or((run_ns, exits));
            let activity = Activity {
                run_ns: run_ns.saturating_sub(run0),
                events: [("kvm.exits".to_string(), exits.saturating_sub(exits0) as f64)].into(),
            };
            if let Some(cpu) = v.cpu {
                *joules.entry(cpu).or_default() += self.weights.energy_j(&activity);
            }
        }
        let dt_s = self.last_ns.map_or(0.0, |t| now.saturating_sub(t) as f64 / 1e9);
        self.last_ns = Some(now);
        for (cpu, core) in &mut self.cores {
            let j = joules.get(cpu).copied().unwrap_or(0.0);
            core.power_w = if dt_s > 0.0 { j / dt_s } else { 0.0 };
            core.total_j += j;
            core.temp_c = self.thermal.step(core.temp_c, core.power_w, dt_s);
        }
        let balancers = status::read_all();
        let swaps: u64 = balancers.iter().map(|s| s.swaps).sum();
        self.swaps_per_s = match (self.swaps, balancers.is_empty()) {
            (_, true) => None,
            (Some((n, t)), false) if now > t => Some(swaps.saturating_sub(n) as f64 / ((now - t) as f64 / 1e9)),
            _ => Some(0.0),
        };
        self.swaps = (!balancers.is_empty()).then_some((swaps, now));
        self.balancer = balancers.iter().find(|b| !b.cores.is_empty()).map(|b| b.pid);
        self.balanced = balancers
            .iter()
            .find(|b| !b.cores.is_empty())
            .map(|b| {
                b.cores
                    .iter()
                    .map(|&(cpu, total_j, power_w, temp_c)| CoreRow { cpu, power_w, total_j, temp_c })
                    .collect()
            })
            .unwrap_or_default();
    }

    /// The cores, by CPU: the balancer's accounts while one runs, else the estimate.
    pub fn rows(&self) -> Vec<CoreRow> {
        if self.balanced.is_empty() {
            self.cores.values().cloned().collect()
        } else {
            self.balanced.clone()
        }
    }
}
