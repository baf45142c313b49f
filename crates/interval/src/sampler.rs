//! One sample per interval from every source: `/proc/stat` per CPU, and per vCPU thread its
//! schedstat, KVM stats, perf counters and (testvm guests) application counters. Columns are
//! fixed between [`IntervalSampler::add_vms`] calls; sampling reads into preallocated buffers
//! and allocates nothing.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use virtprof_kvm::discover::{DiscoveredVm, VcpuThread};
use virtprof_kvm::guest_counters::GuestCounters;
use virtprof_kvm::remote::RemoteVmStats;
use virtprof_kvm::stats::StatsFd;
use virtprof_model::interval::{Entity, Series, SeriesKind};

use crate::counters::{per_cpu_specs, CounterSpec, Counters, Target};
use crate::procstat::{self, ProcStat};

/// KVM vCPU statistics worth a column, when the kernel has them.
const KVM_VCPU_STATS: [&str; 24] = [
    "exits",
    "io_exits",
    "mmio_exits",
    "halt_exits",
    "irq_exits",
    "signal_exits",
    "irq_window_exits",
    "nmi_window_exits",
    "request_irq_exits",
    "insn_emulation",
    "insn_emulation_fail",
    "hypercalls",
    "halt_wakeup",
    "halt_successful_poll",
    "halt_attempted_poll",
    "halt_wait_ns",
    "preemption_reported",
    "pf_taken",
    "pf_emulate",
    "tlb_flush",
    "host_state_reload",
    "fpu_reload",
    "nested_run",
    "notify_window_exits",
];

/// How a column's value comes out of its raw reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Diff {
    /// The source gives a running total: the column is its change over the interval.
    Cumulative,
    /// The source gives the interval's value itself (gauges, perf deltas).
    AsIs,
}

struct Vcpu {
    index: u32,
    schedstat: Option<File>,
    kvm: Option<(StatsFd, Vec<usize>)>,
    counters: Counters,
}

struct Vm {
    pid: u32,
    guest: Option<GuestCounters>,
    vcpus: Vec<Vcpu>,
}

/// Interval sampling configuration.
#[derive(Debug, Clone)]
pub struct SamplerConfig {
    /// perf counters per vCPU thread (per CPU: the same, see [`per_cpu_specs`]).
    pub counters: Vec<CounterSpec>,
    /// Hardware counters the PMU can run at once (groups rotate beyond that).
    pub hw_counters: usize,
}

/// Reads every source into one row.
pub struct IntervalSampler {
    config: SamplerConfig,
    procstat: ProcStat,
    cpus: Vec<u32>,
    /// perf counters per CPU, in `cpus` order.
    cpu_counters: Vec<Counters>,
    vms: Vec<Vm>,
    series: Vec<Series>,
    diffs: Vec<Diff>,
    unavailable: Vec<(String, String)>,
    raw: Vec<f64>,
    previous: Vec<f64>,
    stats_scratch: Vec<u8>,
    stats_values: Vec<u64>,
}

impl IntervalSampler {
    /// A sampler of the host's CPUs and no VMs yet.
    pub fn new(config: SamplerConfig) -> std::io::Result<Self> {
        let mut procstat = ProcStat::open()?;
        let cpus = procstat.cpus()?;
        let cpu_specs = per_cpu_specs(&config.counters);
        let mut unavailable = Vec::new();
        let cpu_counters = cpus
            .iter()
            .map(|&cpu| {
                let (counters, refused) = Counters::open(Target::Cpu(cpu), &cpu_specs, config.hw_counters);
                unavailable.extend(refused);
                counters
            })
            .collect();
        let mut sampler = IntervalSampler {
            config,
            procstat,
            cpus,
            cpu_counters,
            vms: Vec::new(),
            series: Vec::new(),
            diffs: Vec::new(),
            unavailable: Vec::new(),
            raw: Vec::new(),
            previous: Vec::new(),
            stats_scratch: Vec::new(),
            stats_values: Vec::new(),
        };
        sampler.note_unavailable(unavailable);
        sampler.rebuild_columns();
        Ok(sampler)
    }

    /// Add these VMs, and vCPU threads of known VMs that appeared since, to the sampled set.
    /// Nothing is ever removed: a VM that exits keeps its columns, and the sources that
    /// outlive it (mapped guest RAM, KVM stats fds, perf counters) still give its final counts.
    /// Returns true when columns were added.
    pub fn add_vms(&mut self, found: &[DiscoveredVm]) -> bool {
        let mut changed = false;
        for vm in found {
            let known = self.vms.iter().position(|v| v.pid == vm.pid);
            let at = known.unwrap_or_else(|| {
                self.vms.push(Vm { pid: vm.pid, guest: None, vcpus: Vec::new() });
                self.vms.len() - 1
            });
            // A VMM creates its VM before it maps guest RAM, so discovery can see the VM first:
            // keep trying until the RAM is there (its counters start from zero either way).
            if self.vms[at].guest.is_none() {
                self.vms[at].guest = GuestCounters::attach(Path::new("/proc"), vm.pid).ok().flatten();
                changed |= self.vms[at].guest.is_some() && !self.vms[at].vcpus.is_empty();
            }
            let new_threads: Vec<_> =
                vm.vcpus.iter().filter(|t| !self.vms[at].vcpus.iter().any(|v| v.index == t.index)).cloned().collect();
            if new_threads.is_empty() {
                continue;
            }
            let mut remote = RemoteVmStats::attach(vm.pid).ok();
            for thread in new_threads {
                let vcpu = self.open_vcpu(vm.pid, &thread, remote.as_mut());
                self.vms[at].vcpus.push(vcpu);
            }
            self.vms[at].vcpus.sort_by_key(|v| v.index);
            changed = true;
        }
        if changed {
            self.rebuild_columns();
        }
        changed
    }

    fn open_vcpu(&mut self, pid: u32, thread: &VcpuThread, remote: Option<&mut RemoteVmStats>) -> Vcpu {
        let schedstat = File::open(format!("/proc/{pid}/task/{}/schedstat", thread.tid)).ok();
        let kvm = remote.and_then(|r| {
            let at = r.vcpus.iter().position(|(i, _)| *i == thread.index)?;
            let (_, fd) = r.vcpus.swap_remove(at);
            let picked = KVM_VCPU_STATS
                .iter()
                .filter_map(|name| fd.descriptors().iter().position(|d| d.name == *name))
                .collect();
            Some((fd, picked))
        });
        let (counters, unavailable) =
            Counters::open(Target::Thread(thread.tid), &self.config.counters, self.config.hw_counters);
        self.note_unavailable(unavailable);
        Vcpu { index: thread.index, schedstat, kvm, counters }
    }

    fn note_unavailable(&mut self, refused: Vec<(String, String)>) {
        for u in refused {
            if !self.unavailable.contains(&u) {
                self.unavailable.push(u);
            }
        }
    }

    fn rebuild_columns(&mut self) {
        let mut series = Vec::new();
        let mut diffs = Vec::new();
        let mut add = |entity, metric: String, unit: &str, kind, diff| {
            series.push(Series { entity, metric, unit: unit.to_string(), kind });
            diffs.push(diff);
        };
        for &cpu in &self.cpus {
            for field in procstat::FIELDS {
                add(Entity::Cpu(cpu), format!("stat.{field}_ns"), "ns", SeriesKind::Delta, Diff::Cumulative);
            }
        }
        for (&cpu, counters) in self.cpus.iter().zip(&self.cpu_counters) {
            for (metric, unit, kind) in counters.columns() {
                add(Entity::Cpu(cpu), metric.clone(), unit, *kind, Diff::AsIs);
            }
        }
        for vm in &self.vms {
            for v in &vm.vcpus {
                let entity = Entity::Vcpu { pid: vm.pid, index: v.index };
                if v.schedstat.is_some() {
                    for (m, unit) in [("run_ns", "ns"), ("wait_ns", "ns"), ("timeslices", "count")] {
                        add(entity, format!("schedstat.{m}"), unit, SeriesKind::Delta, Diff::Cumulative);
                    }
                }
                if let Some((fd, picked)) = &v.kvm {
                    for &i in picked {
                        let d = &fd.descriptors()[i];
                        let unit = if d.exponent == -9 { "ns" } else { "count" };
                        add(entity, format!("kvm.{}", d.name), unit, SeriesKind::Delta, Diff::Cumulative);
                    }
                }
                if vm.guest.is_some() {
                    add(entity, "app.iterations".into(), "count", SeriesKind::Delta, Diff::Cumulative);
                    add(entity, "app.phase".into(), "index", SeriesKind::Gauge, Diff::AsIs);
                }
                for (metric, unit, kind) in v.counters.columns() {
                    add(entity, metric.clone(), unit, *kind, Diff::AsIs);
                }
            }
        }
        // Columns kept keep their last reading; a new VM's start from zero, since its VMM,
        // threads and guest counters were created after sampling began.
        let earlier: HashMap<(Entity, &str), f64> =
            self.series.iter().zip(&self.previous).map(|(s, &p)| ((s.entity, s.metric.as_str()), p)).collect();
        let previous = series
            .iter()
            .map(|s| match earlier.get(&(s.entity, s.metric.as_str())) {
                Some(&p) => p,
                None if s.entity.vm().is_some() => 0.0,
                None => f64::NAN,
            })
            .collect();
        self.previous = previous;
        self.series = series;
        self.diffs = diffs;
        self.raw = vec![0.0; self.series.len()];
    }

    /// The columns, in row order.
    pub fn series(&self) -> &[Series] {
        &self.series
    }

    /// Counters this host refused, with reasons.
    pub fn unavailable(&self) -> &[(String, String)] {
        &self.unavailable
    }

    /// Sub-intervals per interval for hardware counter rotation.
    pub fn sub_intervals(&self) -> usize {
        let threads = self.vms.iter().flat_map(|vm| &vm.vcpus).map(|v| &v.counters);
        self.cpu_counters.iter().chain(threads).map(Counters::sub_intervals).max().unwrap_or(1)
    }

    /// Hand every rotating counter group over to the next (at each sub-interval boundary).
    pub fn rotate(&mut self) {
        self.cpu_counters.iter_mut().for_each(Counters::rotate);
        self.vms.iter_mut().flat_map(|vm| &mut vm.vcpus).for_each(|v| v.counters.rotate());
    }

    /// Read every source and write the interval's values into `out`, one per series. A source that cannot be read gives NaN (unknown), never zero; so does a CPU
    /// column's first sample, which has no earlier reading to subtract.
    pub fn sample(&mut self, out: &mut [f64]) {
        let raw = &mut self.raw;
        let cpus = &self.cpus;
        let mut filled = 0;
        let _ = self.procstat.read(|cpu, values| {
            if let Some(k) = cpus.iter().position(|&c| c == cpu) {
                raw[k * 8..k * 8 + 8].copy_from_slice(&values);
                filled += 1;
            }
        });
        if filled < cpus.len() {
            raw[..cpus.len() * 8].iter_mut().for_each(|v| *v = f64::NAN);
        }
        let mut i = cpus.len() * 8;
        for counters in &mut self.cpu_counters {
            let n = counters.columns().len();
            counters.sample(&mut raw[i..i + n]);
            i += n;
        }
        let mut text = [0u8; 128];
        for vm in &mut self.vms {
            for v in &mut vm.vcpus {
                if let Some(file) = &v.schedstat {
                    let parsed = file
                        .read_at(&mut text, 0)
                        .ok()
                        .and_then(|n| std::str::from_utf8(&text[..n]).ok())
                        .and_then(virtprof_host::Schedstat::parse);
                    let values =
                        parsed.map_or([f64::NAN; 3], |s| [s.run_ns as f64, s.wait_ns as f64, s.timeslices as f64]);
                    raw[i..i + 3].copy_from_slice(&values);
                    i += 3;
                }
                if let Some((fd, picked)) = &v.kvm {
                    let ok = fd.read_into(&mut self.stats_scratch, &mut self.stats_values).is_ok();
                    for &k in picked {
                        raw[i] = if ok { self.stats_values[k] as f64 } else { f64::NAN };
                        i += 1;
                    }
                }
                if let Some(guest) = &vm.guest {
                    let app = guest.read(v.index);
                    raw[i] = app.map_or(f64::NAN, |a| a.iterations as f64);
                    raw[i + 1] = app.map_or(f64::NAN, |a| a.phase as f64);
                    i += 2;
                }
                let n = v.counters.columns().len();
                v.counters.sample(&mut raw[i..i + n]);
                i += n;
            }
        }
        debug_assert_eq!(i, raw.len());
        for (k, diff) in self.diffs.iter().enumerate() {
            out[k] = match diff {
                Diff::AsIs => raw[k],
                Diff::Cumulative => raw[k] - self.previous[k],
            };
            self.previous[k] = raw[k];
        }
    }
}
