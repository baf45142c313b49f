//! `serve`'s metrics: one scrape of the [`Sampler`] that `top` draws from, as Prometheus or
//! OpenMetrics text. Counters are cumulative since `serve` started (the sampler's `run`
//! window), so `rate()` over any range gives what `top` shows for that range.
//!
//! Names follow Prometheus conventions: base units in the name (`_seconds`, `_joules`),
//! `_total` on counters, and label values drawn from bounded sets (VMs on the host, their
//! vCPUs, the kernel's exit reasons, host CPUs).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};
use virtprof_analysis::explain::{explain, CauseKind, Explanation, VmFacts};
use virtprof_analysis::hist::Histogram;
use virtprof_analysis::qos::{RoleRow, VcpuRow, VmInfo, WindowReport};

use virtprof_engine::sampler::{Sampler, Snapshot, Taker};

/// Upper bounds of the exit-duration histogram's buckets, ns: 1 µs to 100 ms.
const DURATION_BOUNDS_NS: [u64; 16] = [
    1_000,
    2_500,
    5_000,
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
];

/// A counter family read straight off one kind of `top` row: name, help, unit, value (None:
/// unknown, and so no series).
type Family<Row> = (&'static str, &'static str, Option<Unit>, fn(&Row) -> Option<f64>);

/// The per-vCPU counters.
const VCPU_FAMILIES: [Family<VcpuRow>; 4] = [
    ("virtprof_vcpu_run", "Time the vCPU thread ran on a host CPU.", Some(Unit::Seconds), |v| {
        v.run_ns.map(|ns| ns as f64 / 1e9)
    }),
    (
        "virtprof_vcpu_wait",
        "Time the vCPU thread was runnable but waiting for a host CPU (the guest's steal).",
        Some(Unit::Seconds),
        |v| v.wait_ns.map(|ns| ns as f64 / 1e9),
    ),
    (
        "virtprof_vcpu_blocked",
        "Time the vCPU thread slept (guest idle, or waiting on I/O).",
        Some(Unit::Seconds),
        |v| v.blocked_ns.map(|ns| ns as f64 / 1e9),
    ),
    ("virtprof_vcpu_executions", "Times the vCPU thread was dispatched onto a host CPU.", None, |v| {
        v.exec_count.map(|n| n as f64)
    }),
];

/// Everything one scrape shows, gathered under the sampler's lock and encoded after it.
#[derive(Debug, Clone)]
pub struct Scrape {
    /// The sampler's `run` window (cumulative since start), with energy and loss.
    pub snapshot: Snapshot,
    /// The VMs as discovered (identity, owner).
    pub vms: Vec<VmInfo>,
    /// (VMM pid, vCPU index) → exits since the vCPU was created (KVM stats fd).
    pub kvm_exits: BTreeMap<(u32, u32), u64>,
    /// (vCPU thread, reason, traced exits since start).
    pub reasons: Vec<(u32, String, u64)>,
    /// Exit durations by reason since start.
    pub durations: Vec<(String, Histogram)>,
    /// VMM pid → CPU seconds of its threads other than the vCPUs.
    pub vmm_cpu_s: BTreeMap<u32, f64>,
    /// VMM pid → who ran while its vCPUs waited, by `by` label, most first (where the
    /// in-kernel program counts it).
    pub preempted_by: BTreeMap<u32, Vec<(String, u64)>>,
    /// Whether the source names who took the vCPUs' CPUs (the in-kernel program does).
    pub names_preemptors: bool,
    /// Seconds the collection took.
    pub collect_seconds: f64,
    /// Scrapes collected since serve started, this one included (requests answered from a
    /// recent one are not counted).
    pub scrapes: u64,
}

/// The per-role counters (XenMon's accounting of the work done for a VM outside its vCPUs).
const ROLE_FAMILIES: [Family<RoleRow>; 4] = [
    (
        "virtprof_vmm_thread_run",
        "Time the VM's threads of this role (vcpu, io-thread, main-loop, vhost, worker, other) ran on a host CPU.",
        Some(Unit::Seconds),
        |r| r.run_ns.map(|ns| ns as f64 / 1e9),
    ),
    (
        "virtprof_vmm_thread_wait",
        "Time the VM's threads of this role were runnable but waiting for a host CPU.",
        Some(Unit::Seconds),
        |r| r.wait_ns.map(|ns| ns as f64 / 1e9),
    ),
    ("virtprof_vmm_thread_blocked", "Time the VM's threads of this role slept.", Some(Unit::Seconds), |r| {
        r.blocked_ns.map(|ns| ns as f64 / 1e9)
    }),
    ("virtprof_vmm_thread_executions", "Times the VM's threads of this role were dispatched.", None, |r| {
        r.exec_count.map(|n| n as f64)
    }),
];

impl Scrape {
    /// XenMon's accounting of the work done for each VM, inside and outside its vCPUs.
    fn encode_roles(&self, e: &mut DescriptorEncoder) -> fmt::Result {
        let rows = || {
            self.run().vms.iter().flat_map(|vm| {
                vm.roles.iter().map(move |r| {
                    let mut labels = vm_labels(&vm.name, &vm.kind, vm.pid);
                    labels.push(("role", r.role.to_string()));
                    (labels, r)
                })
            })
        };
        families(e, &ROLE_FAMILIES, rows)
    }

    /// `explain`'s answer per VM over serve's run, from what the sampler holds: each cause's
    /// lost time as a counter, and the top cause as a gauge an alert can quote. Causes the
    /// sampler cannot weigh (exit handling and host interrupts per VM need a trace) are not
    /// listed; a VM with nothing to explain says `none`.
    fn encode_causes(&self, e: &mut DescriptorEncoder) -> fmt::Result {
        let run = self.run();
        let answers: Vec<(Labels, Explanation)> = run
            .vms
            .iter()
            .map(|vm| (vm_labels(&vm.name, &vm.kind, vm.pid), explain(&vm_facts(vm, run.seconds))))
            .collect();
        counters(
            e,
            "virtprof_vm_lost",
            "Time a VM lost, by cause (explain's causes serve can weigh: cpu_contention, vmm_threads_starved).",
            Some(Unit::Seconds),
            answers.iter().flat_map(|(labels, x)| {
                let waiting = x.time.waiting_ns.map(|ns| ("cpu_contention", ns));
                let starved = x.causes.iter().find(|c| c.kind == CauseKind::VmmThreadsStarved);
                let starved = starved.and_then(|c| Some(("vmm_threads_starved", c.lost_ns?)));
                waiting.into_iter().chain(starved).map(move |(cause, ns)| {
                    let mut labels = labels.clone();
                    labels.push(("cause", cause.to_string()));
                    (labels, ns as f64 / 1e9)
                })
            }),
        )?;
        // Who took it, where the in-kernel program names them: series of their own, so that
        // summing the family above never counts a second twice.
        counters(
            e,
            "virtprof_vm_lost_by",
            "Time a VM lost to CPU contention, by the process that ran on the CPU its vCPUs waited for (vm PID: another VM, or its own VMM; task NAME: a host process, its name without its /N suffix; idle: nothing ran, a CPU limit such as cgroup cpu.max held them back; others: the processes past the first 16 per vCPU, or past 32 values per VM). Counted in the kernel (eBPF) only; what no process is named for is virtprof_vm_lost_seconds_total less their sum.",
            Some(Unit::Seconds),
            answers.iter().flat_map(|(labels, x)| {
                let by = self.preempted_by.get(&x.pid).map(Vec::as_slice).unwrap_or_default();
                by.iter().map(move |(by, ns)| {
                    let mut labels = labels.clone();
                    labels.push(("cause", "cpu_contention".to_string()));
                    labels.push(("by", by.clone()));
                    (labels, *ns as f64 / 1e9)
                })
            }),
        )?;
        gauges(
            e,
            "virtprof_vm_top_cause",
            "1 for the cause explain ranks first for the VM over serve's run among those serve can weigh (none: none of them took 1 % of its vCPU time); see `virtprof explain`.",
            None,
            // Among the causes serve can weigh: `none` when they are small, absent where even the
            // waiting is unknown.
            answers.iter().filter(|(_, x)| x.time.waiting_ns.is_some()).map(|(labels, x)| {
                let mut labels = labels.clone();
                let top = x.causes.first().map_or("none".to_string(), |c| cause_name(c.kind));
                labels.push(("cause", top));
                (labels, 1.0)
            }),
        )
    }

    /// Refresh `sampler` and gather one scrape.
    pub fn collect(sampler: &mut Sampler) -> anyhow::Result<Scrape> {
        let started = std::time::Instant::now();
        sampler.refresh()?;
        let snapshot = sampler.run_snapshot();
        let vms = sampler.vms().to_vec();
        let mut labels = ByLabels::new(&vms);
        let preempted_by =
            vms.iter().filter_map(|vm| Some((vm.pid.0, labels.fold(sampler.preempted_by(vm)?)))).collect();
        Ok(Scrape {
            preempted_by,
            names_preemptors: sampler.is_in_kernel(),
            kvm_exits: sampler.kvm_exits_now(),
            reasons: sampler.traced_exit_reasons(),
            durations: sampler.exit_durations(),
            vmm_cpu_s: sampler.vmm_cpu_seconds(),
            vms,
            snapshot,
            collect_seconds: started.elapsed().as_secs_f64(),
            scrapes: 0,
        })
    }

    /// The cumulative window.
    fn run(&self) -> &WindowReport {
        &self.snapshot.windows[0]
    }
}

/// Which text format a scraper asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// OpenMetrics 1.0 (`Accept: application/openmetrics-text`).
    OpenMetrics,
    /// Prometheus text 0.0.4 (everything else, and node_exporter's textfile collector).
    Prometheus,
}

impl Format {
    /// The format an `Accept` header asks for.
    pub fn from_accept(accept: Option<&str>) -> Format {
        match accept {
            Some(a) if a.contains("application/openmetrics-text") => Format::OpenMetrics,
            _ => Format::Prometheus,
        }
    }

    /// Its `Content-Type`.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Format::Prometheus => "text/plain; version=0.0.4; charset=utf-8",
        }
    }
}

/// A scrape shared by the formats it is rendered in.
#[derive(Debug)]
struct SharedScrape(std::sync::Arc<Scrape>);

impl Collector for SharedScrape {
    fn encode(&self, encoder: DescriptorEncoder) -> fmt::Result {
        self.0.encode(encoder)
    }
}

/// The scrape as text in `format`.
pub fn exposition(scrape: &std::sync::Arc<Scrape>, format: Format) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(SharedScrape(std::sync::Arc::clone(scrape))));
    let mut text = String::new();
    let encoded = match format {
        Format::OpenMetrics => prometheus_client::encoding::text::encode(&mut text, &registry),
        Format::Prometheus => prometheus_client::encoding::prometheus_text::encode(&mut text, &registry),
    };
    // Writing into a String cannot fail; an encoder error would be a bug in a metric name.
    encoded.expect("metric names are valid");
    text
}

type Labels = Vec<(&'static str, String)>;

/// What the sampler knows of a VM, as `explain` weighs it: its vCPUs' states and its VMM
/// threads' waits; exits and host interrupts per VM need a trace (unknown here).
fn vm_facts(vm: &virtprof_analysis::qos::VmRow, seconds: Option<f64>) -> VmFacts {
    let sum = |f: fn(&VcpuRow) -> Option<u64>| vm.vcpus.iter().map(f).sum::<Option<u64>>();
    VmFacts {
        pid: vm.pid,
        name: vm.name.clone(),
        vcpus: vm.vcpus.len(),
        seconds,
        run_ns: sum(|v| v.run_ns),
        wait_ns: sum(|v| v.wait_ns),
        blocked_ns: sum(|v| v.blocked_ns),
        cpus: vm.vcpus.iter().filter_map(|v| v.cpu).collect(),
        vmm_roles: vm.roles.iter().map(|r| (r.role.to_string(), r.threads, r.wait_ns)).collect(),
        lost_events: Some(0),
        ..VmFacts::default()
    }
}

/// `by` values a VM's series have at most; past them, tasks are summed as `others`. Names
/// are folded (`kworker/u8:2` is `task kworker`) so that a VM's values stay few and each
/// series only grows.
const MOST_BY: usize = 32;

/// `by` label values of the processes that ran while VMs' vCPUs waited: another VM as `vm
/// PID`, the idle task as `idle` (a CPU limit throttled them), a host process as `task NAME`
/// (its comm without a `/N` suffix; `task (exited)` when it is gone), and `others` for those
/// past the program's slots. Each process is named once per scrape, whichever VMs' vCPUs it
/// took the CPU from.
struct ByLabels {
    vms: HashSet<u32>,
    named: HashMap<u32, String>,
}

impl ByLabels {
    fn new(vms: &[VmInfo]) -> ByLabels {
        ByLabels { vms: vms.iter().map(|vm| vm.pid.0).collect(), named: HashMap::new() }
    }

    fn label(&mut self, taker: Taker) -> String {
        let Taker::Process(tgid) = taker else { return "others".into() };
        let vms = &self.vms;
        let name = self.named.entry(tgid).or_insert_with(|| match tgid {
            0 => "idle".into(),
            pid if vms.contains(&pid) => format!("vm {pid}"),
            _ => match std::fs::read_to_string(format!("/proc/{tgid}/comm")) {
                Ok(comm) => format!("task {}", comm.trim().split('/').next().unwrap_or_default()),
                Err(_) => "task (exited)".into(),
            },
        });
        name.clone()
    }

    /// One VM's (taker, ns) as (label, ns), most first, at most [`MOST_BY`] labels.
    fn fold(&mut self, preempted_by: Vec<(Taker, u64)>) -> Vec<(String, u64)> {
        let mut by: BTreeMap<String, u64> = BTreeMap::new();
        for (taker, ns) in preempted_by {
            let name = self.label(taker);
            let name = if by.len() >= MOST_BY && !by.contains_key(&name) { "others".to_string() } else { name };
            *by.entry(name).or_default() += ns;
        }
        let mut list: Vec<(String, u64)> = by.into_iter().collect();
        list.sort_by_key(|(_, ns)| std::cmp::Reverse(*ns));
        list
    }
}

/// A cause's label value.
fn cause_name(kind: CauseKind) -> String {
    serde_json::to_value(kind).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default()
}

fn vm_labels(name: &str, kind: &str, pid: u32) -> Labels {
    vec![("vm", name.to_string()), ("vmm", kind.to_string()), ("pid", pid.to_string())]
}

/// One counter or gauge family: a value per label set.
fn family(
    encoder: &mut DescriptorEncoder,
    kind: MetricType,
    name: &str,
    help: &str,
    unit: Option<Unit>,
    rows: impl IntoIterator<Item = (Labels, f64)>,
) -> fmt::Result {
    let mut family = encoder.encode_descriptor(name, help, unit.as_ref(), kind)?;
    for (labels, value) in rows {
        let metric = family.encode_family(&labels)?;
        match kind {
            MetricType::Counter => ConstCounter::new(value).encode(metric)?,
            _ => ConstGauge::new(value).encode(metric)?,
        }
    }
    Ok(())
}

fn counters(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<Unit>,
    rows: impl IntoIterator<Item = (Labels, f64)>,
) -> fmt::Result {
    family(e, MetricType::Counter, name, help, unit, rows)
}

/// One counter family per entry of `table`, each over the labelled rows `rows` yields.
fn families<'r, Row: 'r, Rows: Iterator<Item = (Labels, &'r Row)>>(
    e: &mut DescriptorEncoder,
    table: &[Family<Row>],
    rows: impl Fn() -> Rows,
) -> fmt::Result {
    for (name, help, unit, field) in table {
        // An unknown figure has no series (`virtprof_unavailable` says why).
        counters(e, name, help, unit.clone(), rows().filter_map(|(l, r)| Some((l, field(r)?))))?;
    }
    Ok(())
}

fn gauges(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<Unit>,
    rows: impl IntoIterator<Item = (Labels, f64)>,
) -> fmt::Result {
    family(e, MetricType::Gauge, name, help, unit, rows)
}

impl Collector for Scrape {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let run = self.run();
        let vcpus = || {
            run.vms.iter().flat_map(|vm| {
                vm.vcpus.iter().map(move |v| {
                    let mut labels = vm_labels(&vm.name, &vm.kind, vm.pid);
                    labels.push(("vcpu", v.index.to_string()));
                    (labels, (vm.pid, v))
                })
            })
        };
        let e = &mut encoder;
        families(e, &VCPU_FAMILIES, || vcpus().map(|(l, (_, v))| (l, v)))?;
        counters(
            e,
            "virtprof_vcpu_io",
            "Port and MMIO accesses of the vCPU (kvm_pio, kvm_mmio; KVM stats io_exits + mmio_exits when polling).",
            None,
            vcpus().filter_map(|(l, (_, v))| Some((l, v.io_count? as f64))),
        )?;
        counters(
            e,
            "virtprof_vcpu_exits",
            "VM exits of the vCPU since it was created (KVM's stats fd); where that is not readable, exits traced since serve started.",
            None,
            vcpus().filter_map(|(l, (pid, v))| Some((l, self.kvm_exits.get(&(pid, v.index)).copied().or(v.exits)? as f64))),
        )?;
        let by_tid: BTreeMap<u32, Labels> = vcpus().map(|(l, (_, v))| (v.tid, l)).collect();
        counters(
            e,
            "virtprof_vcpu_traced_exits",
            "Exits the trace saw, by reason: kvm_exit reasons where the host emits them, else userspace exits and in-kernel evidence.",
            None,
            self.reasons.iter().filter_map(|(tid, reason, n)| {
                let mut labels = by_tid.get(tid)?.clone();
                labels.push(("reason", reason.clone()));
                Some((labels, *n as f64))
            }),
        )?;
        self.encode_durations(e)?;
        counters(
            e,
            "virtprof_vmm_cpu",
            "CPU time of the VMM's threads other than its vCPUs (device emulation, I/O threads).",
            Some(Unit::Seconds),
            run.vms
                .iter()
                .filter_map(|vm| Some((vm_labels(&vm.name, &vm.kind, vm.pid), *self.vmm_cpu_s.get(&vm.pid)?))),
        )?;
        self.encode_roles(e)?;
        self.encode_causes(e)?;
        self.encode_info(e)?;
        self.encode_unavailable(e)?;
        self.encode_energy(e)?;
        counters(
            e,
            "virtprof_trace_lost_events",
            "Trace events the kernel dropped since serve started (figures above miss them).",
            None,
            [(Labels::new(), self.snapshot.lost_events as f64)],
        )?;
        gauges(
            e,
            "virtprof_scrape_collect",
            "Time this scrape spent collecting (draining the trace, reading KVM stats and /proc).",
            Some(Unit::Seconds),
            [(Labels::new(), self.collect_seconds)],
        )?;
        counters(
            e,
            "virtprof_scrapes",
            "Scrapes collected since serve started; requests answered from one no older than --max-age are not counted.",
            None,
            [(Labels::new(), self.scrapes as f64)],
        )?;
        Ok(())
    }
}

impl Scrape {
    fn encode_durations(&self, e: &mut DescriptorEncoder) -> fmt::Result {
        let mut family = e.encode_descriptor(
            "virtprof_exit_duration",
            "Durations of the host's VM exits by reason, all VMs (exit to entry, or the userspace round trip); buckets exact to 1/32 of their bound.",
            Some(&Unit::Seconds),
            MetricType::Histogram,
        )?;
        let bounds: Vec<f64> = DURATION_BOUNDS_NS.iter().map(|&ns| ns as f64 / 1e9).collect();
        for (reason, hist) in &self.durations {
            let cumulative = hist.cumulative(&DURATION_BOUNDS_NS);
            let mut buckets: Vec<(f64, u64)> = bounds.iter().copied().zip(cumulative).collect();
            buckets.push((f64::INFINITY, hist.count()));
            // The encoder takes per-bucket counts and accumulates them itself.
            let mut previous = 0;
            for bucket in &mut buckets {
                (bucket.1, previous) = (bucket.1 - previous, bucket.1);
            }
            let labels: Labels = vec![("reason", reason.clone())];
            family.encode_family(&labels)?.encode_histogram::<Labels>(
                hist.sum() as f64 / 1e9,
                hist.count(),
                &buckets,
                None,
            )?;
        }
        Ok(())
    }

    fn encode_info(&self, e: &mut DescriptorEncoder) -> fmt::Result {
        let mut family = e.encode_descriptor(
            "virtprof_vm",
            "A VM on this host: its name, VMM and pid, with its UUID, libvirt domain, pod and container where the host has them.",
            None,
            MetricType::Info,
        )?;
        for vm in &self.vms {
            let mut labels = vm_labels(&vm.name, &vm.kind, vm.pid.0);
            labels.push(("vcpus", vm.vcpus.len().to_string()));
            let owner = &vm.owner;
            let optional = [
                ("uuid", &owner.uuid),
                ("libvirt_domain", &owner.libvirt_domain),
                ("pod_uid", &owner.pod_uid),
                ("container_id", &owner.container_id),
                ("cgroup", &owner.cgroup),
            ];
            labels.extend(optional.into_iter().filter_map(|(k, v)| Some((k, v.clone()?))));
            family.encode_family(&Labels::new())?.encode_info(&labels)?;
        }
        Ok(())
    }

    /// A series per figure this serve cannot give (its mode lacks the events), with the
    /// reason: where a figure's own series is absent, this says why.
    fn encode_unavailable(&self, e: &mut DescriptorEncoder) -> fmt::Result {
        let mut family = e.encode_descriptor(
            "virtprof_unavailable",
            "A figure this serve cannot give, and why (its own series is absent, never 0).",
            None,
            MetricType::Info,
        )?;
        let preemptors = (!self.names_preemptors).then(|| {
            "who ran on the CPU a vCPU waited for (virtprof_vm_lost_by_seconds_total): counted in the kernel (eBPF) only, and this serve traces or polls"
                .to_string()
        });
        for u in self.run().unavailable.iter().chain(&preemptors) {
            let (figure, reason) = u.split_once(": ").unwrap_or((u.as_str(), ""));
            let labels: Labels = vec![("figure", figure.to_string()), ("reason", reason.to_string())];
            family.encode_family(&Labels::new())?.encode_info(&labels)?;
        }
        Ok(())
    }

    fn encode_energy(&self, e: &mut DescriptorEncoder) -> fmt::Result {
        let cpu = |c: u32| vec![("cpu", c.to_string())];
        let cores = &self.snapshot.cores;
        let source = if self.snapshot.balancer.is_some() { "virtprof balance's accounts" } else { "the energy model" };
        counters(
            e,
            "virtprof_core_energy",
            &format!("Energy of each host core's vCPU work since serve started, estimated by {source} (no RAPL on every host)."),
            Some(Unit::Joules),
            cores.iter().map(|c| (cpu(c.cpu), c.total_j)),
        )?;
        gauges(
            e,
            "virtprof_core_power",
            "Power of each host core's vCPU work over the last refresh, estimated.",
            Some(Unit::Other("watts".into())),
            cores.iter().map(|c| (cpu(c.cpu), c.power_w)),
        )?;
        gauges(
            e,
            "virtprof_core_temperature",
            "Temperature of each host core from the thermal RC model.",
            Some(Unit::Celsius),
            cores.iter().map(|c| (cpu(c.cpu), c.temp_c)),
        )?;
        gauges(
            e,
            "virtprof_balance_swap_rate",
            "vCPU swaps per second of running `virtprof balance` processes (absent when none runs).",
            None,
            self.snapshot.swaps_per_s.map(|s| (Labels::new(), s)),
        )
    }
}
