//! Why a VM is slow: its vCPU time split into what it got and what it lost, and the losses
//! ranked by cause, each with its evidence, what it rules out and a fix to try. A cause is
//! weighed only from figures the source holds: where one is missing the cause is "cannot
//! tell", with what to record to tell; it is never guessed.
//!
//! The lost time of a VM is the sum of what each quantified cause took: its vCPUs' wait for a
//! CPU (who ran there instead), its exits' handling by reason (HLT, the guest idling, is not
//! lost), host interrupt and softirq handlers on its CPUs while its vCPUs ran, and its VMM's
//! I/O threads waiting for a CPU (seed 001: a starved I/O thread stalls every vCPU waiting on
//! its I/O). Each cause's share is of that sum.

use serde::Serialize;

/// A VM's lost time below this share of its vCPU time is "nothing to explain".
pub const HEALTHY_LOST_PCT: f64 = 5.0;

/// A cause below this share of the VM's vCPU time is not listed.
pub const LEAST_CAUSE_PCT: f64 = 1.0;

/// Migrations per vCPU-second from which they are listed (their cost is not in a trace).
pub const MIGRATIONS_PER_S: f64 = 50.0;

/// Guest pages faulted in per vCPU-second from which they are listed (their cost is not in
/// the fault events).
pub const FAULTS_PER_S: f64 = 1000.0;

/// Who or what a cause involves.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Entity {
    /// Another VM (its VMM process).
    Vm {
        /// VMM pid.
        pid: u32,
        /// Its name.
        name: String,
    },
    /// A host task.
    Task {
        /// Thread id.
        tid: u32,
        /// Its process, where known.
        pid: Option<u32>,
        /// Its name.
        name: String,
    },
    /// A host CPU.
    Cpu {
        /// CPU number.
        cpu: u32,
    },
    /// An exit reason.
    ExitReason {
        /// The kernel's name.
        reason: String,
        /// Exits counted.
        count: u64,
    },
    /// No task: the CPU a thread waited for ran idle. The thread was runnable and held back:
    /// throttled by a CPU limit (its cgroup's cpu.max or cpu.cfs_quota_us) or, briefly, the
    /// CPU waking from idle.
    IdleCpu,
    /// Threads of the VM's VMM by role.
    VmmRole {
        /// `io-thread`, `main-loop`, `vhost`, ...
        role: String,
        /// Threads.
        threads: usize,
    },
}

impl Entity {
    /// How it is named in text.
    pub fn label(&self) -> String {
        match self {
            Entity::Vm { pid, name } => format!("VM {name} (pid {pid})"),
            Entity::Task { tid, pid: Some(pid), name } if pid != tid => format!("{name}[{tid}] of pid {pid}"),
            Entity::Task { tid, name, .. } => format!("{name}[{tid}]"),
            Entity::Cpu { cpu } => format!("CPU {cpu}"),
            Entity::IdleCpu => "nothing (the CPU idle: a CPU limit throttled it)".into(),
            Entity::ExitReason { reason, count } => format!("{reason} ×{count}"),
            Entity::VmmRole { role, threads } => format!("{threads} {role} thread(s)"),
        }
    }
}

/// A kind of cause.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CauseKind {
    /// The vCPUs' CPUs were shared with other vCPUs or host tasks.
    CpuContention,
    /// The VMM's I/O threads waited for a CPU.
    VmmThreadsStarved,
    /// Exits of one reason took the vCPUs' time.
    ExitStorm,
    /// Host interrupts and softirqs on the vCPUs' CPUs.
    HostInterrupts,
    /// The vCPUs moved across CPUs.
    Migrations,
    /// KVM faulted guest memory in for the vCPUs (the host took it back: a balloon, reclaim).
    MemoryFaults,
    /// KVM polled halted vCPUs, spending host CPU.
    HaltPolling,
    /// Steal the guest's own kernel counted (its agent's rows).
    GuestSteal,
    /// OS noise the guest's own loop measured (its agent's noise periods).
    GuestNoise,
}

impl CauseKind {
    /// Its name in text.
    pub fn title(self) -> &'static str {
        match self {
            CauseKind::CpuContention => "CPU contention",
            CauseKind::VmmThreadsStarved => "VMM I/O threads starved",
            CauseKind::ExitStorm => "exit storm",
            CauseKind::HostInterrupts => "host interrupts on the vCPUs' CPUs",
            CauseKind::Migrations => "vCPU migrations",
            CauseKind::MemoryFaults => "guest memory faulted in by KVM",
            CauseKind::HaltPolling => "halt-polling",
            CauseKind::GuestSteal => "steal seen inside the guest",
            CauseKind::GuestNoise => "OS noise inside the guest",
        }
    }
}

/// One cause.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Cause {
    /// What kind.
    pub kind: CauseKind,
    /// One line.
    pub summary: String,
    /// Time it took from the VM, ns (None: not measurable from a trace, e.g. migrations).
    pub lost_ns: Option<u64>,
    /// Its share of the VM's lost time, %.
    pub share_pct: Option<f64>,
    /// Its share of the VM's vCPU time, %.
    pub vcpu_time_pct: Option<f64>,
    /// Who or what is involved, most first.
    pub entities: Vec<Entity>,
    /// The figures behind it, and the events they come from.
    pub evidence: Vec<String>,
    /// Commands that show more.
    pub see: Vec<String>,
    /// What it rules out.
    pub rules_out: Vec<String>,
    /// A fix a user can try.
    pub fix: String,
}

/// A cause the source cannot weigh, and what to record to tell.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CannotTell {
    /// What cannot be told.
    pub what: String,
    /// Why.
    pub why: String,
    /// What to record to tell.
    pub record: String,
}

/// One exit reason of the VM.
#[derive(Debug, Clone, PartialEq)]
pub struct ExitFacts {
    /// The kernel's name.
    pub reason: String,
    /// Exits.
    pub count: u64,
    /// Time handled, its vCPU's preemption (contention's) and blocking (the device's latency,
    /// or a starved I/O thread's) left out, ns; None where the source cannot time it.
    pub handling_ns: Option<u64>,
    /// The guest idling (HLT, WFx): not lost time.
    pub guest_idle: bool,
}

/// Everything `explain` weighs about one VM, each figure None where the source lacks its
/// events (with the reason in `unavailable`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct VmFacts {
    /// VMM pid.
    pub pid: u32,
    /// Its name.
    pub name: String,
    /// vCPUs.
    pub vcpus: usize,
    /// The window, seconds.
    pub seconds: Option<f64>,
    /// Its vCPUs' time running, waiting for a CPU and blocked, ns (sums).
    pub run_ns: Option<u64>,
    /// Waiting.
    pub wait_ns: Option<u64>,
    /// Blocked.
    pub blocked_ns: Option<u64>,
    /// Who ran on the CPUs its vCPUs waited for, most first.
    pub preemptors: Option<Vec<(Entity, u64)>>,
    /// Exits by reason, most time first.
    pub exits: Option<Vec<ExitFacts>>,
    /// Host hard-interrupt and softirq time while its vCPUs ran, ns, and their counts.
    pub host_irq: Option<(u64, u64, u64, u64)>,
    /// The CPUs its vCPUs ran on.
    pub cpus: Vec<u32>,
    /// Migrations of its vCPU threads.
    pub migrations: Option<u64>,
    /// Guest pages KVM faulted in for its vCPUs.
    pub memory_faults: Option<u64>,
    /// Who took guest memory back meanwhile (unmapped it), with how many unmaps, most first.
    pub reclaimers: Option<Vec<(Entity, u64)>>,
    /// Its VMM's non-vCPU threads by role: (role, threads, wait ns).
    pub vmm_roles: Vec<(String, usize, Option<u64>)>,
    /// Who ran on the CPUs its VMM's I/O-serving threads waited for, most first.
    pub vmm_preemptors: Option<Vec<(Entity, u64)>>,
    /// Halt-polling time, ns.
    pub halt_poll_ns: Option<u64>,
    /// Events lost in the source (None: unknown).
    pub lost_events: Option<u64>,
    /// Figures the source cannot give: (figure, why).
    pub unavailable: Vec<(String, String)>,
}

/// The answer for one VM.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Explanation {
    /// VMM pid.
    pub pid: u32,
    /// Its name.
    pub name: String,
    /// vCPUs.
    pub vcpus: usize,
    /// The window, seconds.
    pub seconds: Option<f64>,
    /// Where its vCPU time went, ns (None: unknown).
    pub time: TimeSplit,
    /// Its lost time, ns: the sum of the quantified causes.
    pub lost_ns: Option<u64>,
    /// That as a share of its vCPU time, %.
    pub lost_pct: Option<f64>,
    /// `nothing to explain`, `explained`, `partly explained` (causes found, but the lost time
    /// is unknown without some events) or `cannot tell`.
    pub verdict: String,
    /// Causes, ranked: those that took ≥ 5 % of the vCPU time by it, then those a trace cannot
    /// time, then the smaller measured ones.
    pub causes: Vec<Cause>,
    /// What the source cannot weigh.
    pub cannot_tell: Vec<CannotTell>,
}

/// Where the vCPUs' time went.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct TimeSplit {
    /// Running (guest, and exits handled in the kernel or VMM on its thread).
    pub running_ns: Option<u64>,
    /// Waiting for a CPU.
    pub waiting_ns: Option<u64>,
    /// Blocked (idle, or waiting on I/O).
    pub blocked_ns: Option<u64>,
    /// In exits (not idle), handling.
    pub exits_ns: Option<u64>,
    /// In host interrupt and softirq handlers while running.
    pub host_irq_ns: Option<u64>,
}

fn pct(part: u64, whole: u64) -> Option<f64> {
    (whole > 0).then(|| 100.0 * part as f64 / whole as f64)
}

/// What to add to `record --events` for each missing figure.
fn record_hint(figure: &str) -> &'static str {
    if figure.contains("interrupt") || figure.contains("softirq") {
        "virtprof record --events kvm,sched,irq,irq_vectors"
    } else if figure.contains("faulted") {
        "virtprof record --events kvm,sched,kvmmmu:kvm_mmu_spte_requested (x86 hosts)"
    } else if figure.contains("took back") {
        "virtprof record --events kvm,sched (kvm:kvm_unmap_hva_range)"
    } else if figure.contains("migration") {
        "virtprof record --events kvm,sched:sched_switch,sched:sched_wakeup,sched:sched_migrate_task"
    } else if figure.contains("exit") || figure.contains("lightweight") {
        "virtprof record --events kvm,sched (all kvm events, on a host that emits kvm_exit)"
    } else {
        "virtprof record --events kvm,sched (sched_switch and sched_wakeup)"
    }
}

/// A VMM thread role that serves the guest's I/O (its waits stall blocked vCPUs).
pub fn serves_io(role: &str) -> bool {
    matches!(role, "io-thread" | "main-loop" | "vhost" | "worker")
}

/// The waiting was mostly with the CPU idle: a CPU limit held the threads back, not a task.
fn throttled(preemptors: &[(Entity, u64)]) -> bool {
    preemptors.first().is_some_and(|(e, _)| *e == Entity::IdleCpu)
}

/// Guest pages faulted in at `per_vcpu_s`, and who took the memory back meanwhile.
fn memory_faults(f: &VmFacts, faults: u64, per_vcpu_s: f64) -> Cause {
    let reclaimers = f.reclaimers.as_deref();
    let unmaps: u64 = reclaimers.unwrap_or_default().iter().map(|(_, n)| n).sum();
    let taken_back = match reclaimers {
        None => "whether the host took memory back is unknown (kvm_unmap_hva_range not recorded)".to_string(),
        Some([]) => "the host unmapped none of it meanwhile: first touches (a guest booting, or growing)".to_string(),
        Some(list) => {
            let who: Vec<String> = list.iter().take(3).map(|(e, n)| format!("{} ×{n}", e.label())).collect();
            format!("the host unmapped guest memory {unmaps} times meanwhile: {}", who.join(", "))
        }
    };
    Cause {
        kind: CauseKind::MemoryFaults,
        summary: format!("KVM faulted {faults} guest pages in for its vCPUs ({per_vcpu_s:.0} per vCPU-second); {taken_back}"),
        lost_ns: None,
        share_pct: None,
        vcpu_time_pct: None,
        entities: reclaimers.unwrap_or_default().iter().take(5).map(|(e, _)| e.clone()).collect(),
        evidence: vec![
            "kvmmmu:kvm_mmu_spte_requested on its vCPU threads (their time is not in that event: unquantified; where kvm_exit is traced, the EPT-violation or NPF exits hold it)".into(),
            "kvm:kvm_unmap_hva_range, by the task that unmapped the memory".into(),
        ],
        see: vec![format!("virtprof stats --pid {} (pf_fixed, pf_taken)", f.pid)],
        rules_out: Vec::new(),
        fix: "stop taking its memory back: deflate the balloon or turn off free page reporting, keep the host out of reclaim (memory pressure, kswapd), or back guest RAM with huge pages or locked memory (hugetlbfs, mlock)".into(),
    }
}

/// "Meanwhile there ran ...": the first three who ran while threads waited, with their time.
fn who_ran(preemptors: Option<&[(Entity, u64)]>) -> String {
    match preemptors {
        None => "tasks the source does not name (it holds no trace)".to_string(),
        Some([]) => "nothing the trace names".to_string(),
        Some(list) => {
            let top: Vec<String> =
                list.iter().take(3).map(|(e, ns)| format!("{} {:.1} ms", e.label(), *ns as f64 / 1e6)).collect();
            top.join(", ")
        }
    }
}

/// Explain one VM from its facts.
pub fn explain(f: &VmFacts) -> Explanation {
    // The vCPUs' observed time; without the states, their wall time over the window.
    let observed = match (f.run_ns, f.wait_ns, f.blocked_ns) {
        (Some(r), Some(w), Some(b)) => Some(r + w + b),
        _ => f.seconds.map(|s| virtprof_model::units::saturating_u64(s * 1e9).saturating_mul(f.vcpus as u64)),
    };
    let exits_ns: Option<u64> = f
        .exits
        .as_ref()
        .and_then(|rows| rows.iter().filter(|x| !x.guest_idle).map(|x| x.handling_ns).sum::<Option<u64>>());
    let host_irq_ns = f.host_irq.map(|(irq, _, soft, _)| irq + soft);
    // A VMM thread that serves I/O stalls the vCPUs only while they wait on it (blocked): its
    // wait counts up to their blocked time.
    let starved_wait: Option<u64> = f.vmm_roles.iter().filter(|r| serves_io(&r.0)).map(|r| r.2).sum();
    let starved_ns = match (starved_wait, f.blocked_ns) {
        (Some(w), Some(b)) => Some(w.min(b)),
        _ => None,
    };
    let mut causes = Vec::new();
    let share_of_vcpu = |ns: u64| observed.and_then(|o| pct(ns, o));
    let big_enough = |ns: u64| share_of_vcpu(ns).is_some_and(|p| p >= LEAST_CAUSE_PCT);
    let cpus: Vec<String> = f.cpus.iter().map(u32::to_string).collect();
    let cpu_list = cpus.join(",");

    if let Some(wait) = f.wait_ns {
        if big_enough(wait) {
            // Who ran meanwhile needs a trace; the live sampler knows the waiting only.
            let preemptors = f.preemptors.as_deref().unwrap_or_default();
            let fix = if throttled(preemptors) {
                "raise the CPU limit of its VMM's cgroup (cpu.max, or cpu.cfs_quota_us on cgroup v1): its vCPUs waited with their CPU idle".to_string()
            } else {
                format!(
                    "give its vCPUs CPUs of their own (pin them: taskset -pc CPU TID, or libvirt vcpupin), or move the tasks above off CPU {}",
                    if cpu_list.is_empty() { "them".to_string() } else { cpu_list.clone() }
                )
            };
            causes.push(Cause {
                kind: CauseKind::CpuContention,
                summary: format!(
                    "its vCPUs waited {:.1} ms for a CPU; meanwhile there ran {}",
                    wait as f64 / 1e6,
                    who_ran(f.preemptors.as_deref())
                ),
                lost_ns: Some(wait),
                share_pct: None,
                vcpu_time_pct: share_of_vcpu(wait),
                entities: preemptors.iter().take(5).map(|(e, _)| e.clone()).collect(),
                evidence: vec![
                    "waiting time: sched_switch (preempted, state R or R+) and sched_wakeup to the next sched_switch in"
                        .into(),
                    "who ran meanwhile: the tasks sched_switch put on the CPU each vCPU waited for".into(),
                ],
                see: vec![
                    format!("virtprof sched FILE --vm {}", f.pid),
                    "virtprof export FILE --format perfetto".into(),
                ],
                rules_out: vec!["the guest itself: this time the vCPUs were runnable and not running".into()],
                fix,
            });
        }
    }
    if let Some(starved) = starved_ns.filter(|&ns| big_enough(ns)) {
        let roles = f.vmm_roles.iter().filter(|r| serves_io(&r.0));
        let preemptors = f.vmm_preemptors.as_deref().unwrap_or_default();
        let fix = if throttled(preemptors) {
            "raise the CPU limit of the cgroup its I/O threads are in (cpu.max, or cpu.cfs_quota_us on cgroup v1): they waited with their CPU idle"
        } else {
            "give the VMM's I/O threads a CPU (an iothread pinned apart from the vCPUs, or a higher cgroup cpu.weight)"
        };
        causes.push(Cause {
            kind: CauseKind::VmmThreadsStarved,
            summary: format!(
                "its VMM's I/O threads waited {:.1} ms for a CPU while its vCPUs were blocked (on their I/O, or idle); meanwhile there ran {}",
                starved as f64 / 1e6,
                who_ran(f.vmm_preemptors.as_deref())
            ),
            lost_ns: Some(starved),
            share_pct: None,
            vcpu_time_pct: share_of_vcpu(starved),
            entities: roles
                .map(|r| Entity::VmmRole { role: r.0.clone(), threads: r.1 })
                .chain(preemptors.iter().take(3).map(|(e, _)| e.clone()))
                .collect(),
            evidence: vec![
                "each VMM thread's waiting time: sched_switch and sched_wakeup; roles from thread names; counted up to the vCPUs' blocked time".into(),
                "who ran meanwhile: the tasks sched_switch put on the CPU each I/O thread waited for (idle: none)".into(),
            ],
            see: vec![format!("virtprof sched FILE --vm {} (by role)", f.pid)],
            rules_out: vec!["the guest's own I/O pattern: the thread serving it was runnable and not running".into()],
            fix: fix.into(),
        });
    }
    if let Some(exits) = &f.exits {
        for x in exits.iter().filter(|x| !x.guest_idle) {
            let Some(ns) = x.handling_ns.filter(|&ns| big_enough(ns)) else { continue };
            causes.push(Cause {
                kind: CauseKind::ExitStorm,
                summary: format!(
                    "{} {} exits took {:.1} ms{}",
                    x.count,
                    x.reason,
                    ns as f64 / 1e6,
                    f.seconds.map(|s| format!(" ({:.0}/s)", x.count as f64 / s.max(1e-9))).unwrap_or_default()
                ),
                lost_ns: Some(ns),
                share_pct: None,
                vcpu_time_pct: share_of_vcpu(ns),
                entities: vec![Entity::ExitReason { reason: x.reason.clone(), count: x.count }],
                evidence: vec!["exit durations: kvm_exit to kvm_entry, or kvm_userspace_exit to the next entry".into()],
                see: vec![format!("virtprof exits FILE --vm {} --by reason", f.pid)],
                rules_out: vec![
                    "CPU contention for this time: the vCPU's preemption during exits is counted there".into()
                ],
                fix: exit_fix(&x.reason),
            });
        }
    }
    if let Some((irq, irqs, soft, softirqs)) = f.host_irq {
        if big_enough(irq + soft) {
            causes.push(Cause {
                kind: CauseKind::HostInterrupts,
                summary: format!(
                    "host interrupts ({irqs}, {:.1} ms) and softirqs ({softirqs}, {:.1} ms) ran on its vCPUs' CPUs while they ran",
                    irq as f64 / 1e6,
                    soft as f64 / 1e6
                ),
                lost_ns: Some(irq + soft),
                share_pct: None,
                vcpu_time_pct: share_of_vcpu(irq + soft),
                entities: f.cpus.iter().map(|&cpu| Entity::Cpu { cpu }).collect(),
                evidence: vec!["irq_handler_entry/exit, irq_vectors, softirq_entry/exit on the CPU a vCPU thread ran on".into()],
                see: vec!["virtprof exits FILE --threshold-us 100 (IRQS, SOFTIRQS per exit)".into()],
                rules_out: vec!["the guest: this is host work on the vCPUs' CPUs".into()],
                fix: format!("steer host IRQs away from CPU {cpu_list} (/proc/irq/*/smp_affinity, irqbalance --banirq) and isolate them (isolcpus, nohz_full)"),
            });
        }
    }
    if let (Some(m), Some(s)) = (f.migrations, f.seconds) {
        let per_vcpu_s = m as f64 / (s.max(1e-9) * f.vcpus.max(1) as f64);
        if per_vcpu_s >= MIGRATIONS_PER_S {
            causes.push(Cause {
                kind: CauseKind::Migrations,
                summary: format!(
                    "its vCPUs moved across CPUs {m} times ({per_vcpu_s:.0} per vCPU-second): cold caches after each"
                ),
                lost_ns: None,
                share_pct: None,
                vcpu_time_pct: None,
                entities: f.cpus.iter().map(|&cpu| Entity::Cpu { cpu }).collect(),
                evidence: vec![
                    "sched_migrate_task of its vCPU threads (their cost is not in a trace: unquantified)".into()
                ],
                see: vec![format!("virtprof sched FILE --vm {} --window 100ms", f.pid)],
                rules_out: Vec::new(),
                fix: "pin each vCPU thread to one CPU (taskset -pc CPU TID, libvirt vcpupin)".into(),
            });
        }
    }
    if let (Some(faults), Some(s)) = (f.memory_faults, f.seconds) {
        let per_vcpu_s = faults as f64 / (s.max(1e-9) * f.vcpus.max(1) as f64);
        if per_vcpu_s >= FAULTS_PER_S {
            causes.push(memory_faults(f, faults, per_vcpu_s));
        }
    }
    if let (Some(poll), Some(run)) = (f.halt_poll_ns, f.run_ns) {
        if pct(poll, run).is_some_and(|p| p >= HEALTHY_LOST_PCT) {
            causes.push(Cause {
                kind: CauseKind::HaltPolling,
                summary: format!(
                    "KVM polled its halted vCPUs for {:.1} ms of host CPU ({:.0} % of their run time)",
                    poll as f64 / 1e6,
                    pct(poll, run).unwrap_or(0.0)
                ),
                lost_ns: None,
                share_pct: None,
                vcpu_time_pct: None,
                entities: Vec::new(),
                evidence: vec!["kvm_vcpu_wakeup: time halted, polling only or polling then sleeping".into()],
                see: vec![format!("virtprof exits FILE --vm {}", f.pid)],
                rules_out: vec!["lost guest time: polling burns host CPU others could use".into()],
                fix: "lower halt polling (/sys/module/kvm/parameters/halt_poll_ns, or a guest cpuidle-haltpoll)".into(),
            });
        }
    }

    let lost: Option<u64> = match (f.wait_ns, exits_ns, host_irq_ns, starved_ns) {
        (Some(w), Some(x), Some(i), Some(s)) => Some(w + x + i + s),
        _ => None,
    };
    // Shares of a lost time that is itself known only.
    for c in &mut causes {
        c.share_pct = c.lost_ns.zip(lost).and_then(|(ns, whole)| pct(ns, whole));
    }
    // Measured causes that took at least 5 % of the vCPU time first, by their time; then
    // those a trace cannot time (migrations, faults), which may be large; then the small ones.
    let tier = |c: &Cause| match (c.lost_ns, c.vcpu_time_pct) {
        (Some(_), Some(p)) if p >= HEALTHY_LOST_PCT => 0,
        (None, _) => 1,
        _ => 2,
    };
    causes.sort_by(|a, b| {
        tier(a).cmp(&tier(b)).then_with(|| match (a.lost_ns, b.lost_ns) {
            (Some(x), Some(y)) => y.cmp(&x),
            _ => a.kind.cmp(&b.kind),
        })
    });

    let mut cannot_tell: Vec<CannotTell> = f
        .unavailable
        .iter()
        .map(|(figure, why)| CannotTell { what: figure.clone(), why: why.clone(), record: record_hint(figure).into() })
        .collect();
    match f.lost_events {
        Some(0) => {}
        Some(n) => cannot_tell.push(CannotTell {
            what: "every figure near the gaps".into(),
            why: format!("{n} events were lost: states across each gap are taken from the next event"),
            record: "virtprof record --buffer-size 65536 (or fewer events)".into(),
        }),
        None => cannot_tell.push(CannotTell {
            what: "whether events were lost".into(),
            why: "the source does not say (a recording cut short, a file without loss counts)".into(),
            record: "virtprof record (its footer counts every CPU's loss)".into(),
        }),
    }
    let lost_pct = lost.and_then(|l| observed.and_then(|o| pct(l, o)));
    let verdict = match lost_pct {
        None if causes.is_empty() => "cannot tell",
        None => "partly explained",
        Some(p) if p < HEALTHY_LOST_PCT && causes.iter().all(|c| c.lost_ns.is_some()) => "nothing to explain",
        _ if causes.is_empty() => "nothing to explain",
        _ => "explained",
    };
    if verdict == "nothing to explain" {
        causes.clear();
    }
    Explanation {
        pid: f.pid,
        name: f.name.clone(),
        vcpus: f.vcpus,
        seconds: f.seconds,
        time: TimeSplit {
            running_ns: f.run_ns,
            waiting_ns: f.wait_ns,
            blocked_ns: f.blocked_ns,
            exits_ns,
            host_irq_ns,
        },
        lost_ns: lost,
        lost_pct,
        verdict: verdict.into(),
        causes,
        cannot_tell,
    }
}

/// What a guest's agent told of it (`record --agent`): its own view of its CPUs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GuestFacts {
    /// Agent number in the recording.
    pub agent: u32,
    /// The guest's host name.
    pub name: String,
    /// Its CPUs.
    pub cpus: u32,
    /// Its CPUs' time as its kernel counted it (/proc/stat, every field), ns; None where the
    /// agent could not read it.
    pub cpu_ns: Option<u64>,
    /// Of that, steal (KVM's steal-time record), ns.
    pub steal_ns: Option<u64>,
    /// Its noise loop's periods (`agent --noise`): samples, their total, the time measured.
    pub noise: Option<(u64, u64, u64)>,
    /// Rows missing (gaps in the link), as a count.
    pub gaps: usize,
}

/// The answer for one guest, from the inside.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GuestExplanation {
    /// Agent number.
    pub agent: u32,
    /// Its host name.
    pub name: String,
    /// `nothing to explain`, `explained` or `cannot tell`.
    pub verdict: String,
    /// Steal, % of its CPU time.
    pub steal_pct: Option<f64>,
    /// Noise, % of the noise loop's time.
    pub noise_pct: Option<f64>,
    /// Causes, ranked by share.
    pub causes: Vec<Cause>,
    /// What cannot be told.
    pub cannot_tell: Vec<CannotTell>,
}

/// Explain one guest from its agent's rows (seed 004: the guest's steal and noise, which the
/// host's view of the VM explains).
pub fn explain_guest(g: &GuestFacts) -> GuestExplanation {
    let steal_pct = g.cpu_ns.zip(g.steal_ns).and_then(|(cpu, steal)| pct(steal, cpu));
    let noise_pct = g.noise.and_then(|(_, noise, measured)| pct(noise, measured));
    let mut causes = Vec::new();
    let mut cannot_tell = Vec::new();
    match (steal_pct, g.steal_ns) {
        (Some(p), Some(steal)) if p >= LEAST_CAUSE_PCT => causes.push(Cause {
            kind: CauseKind::GuestSteal,
            summary: format!(
                "its kernel counted {:.1} ms stolen ({p:.1} % of its {} CPUs' time): its vCPUs waited for host CPUs",
                steal as f64 / 1e6,
                g.cpus
            ),
            lost_ns: Some(steal),
            share_pct: None,
            vcpu_time_pct: Some(p),
            entities: Vec::new(),
            evidence: vec!["the guest's /proc/stat steal (KVM's steal-time record), sent by `virtprof agent`".into()],
            see: vec![
                "virtprof report FILE (the guest's layer)".into(),
                "virtprof explain FILE --vm VM (who took the host CPUs)".into(),
            ],
            rules_out: vec!["the guest's own load: stolen time is time its vCPUs were not running".into()],
            fix: "the host side of the same loss: give the VM's vCPUs CPUs of their own, or move what ran there".into(),
        }),
        (None, _) => cannot_tell.push(CannotTell {
            what: "the guest's steal".into(),
            why: "its agent sent no /proc/stat rows".into(),
            record: "virtprof agent in the guest, virtprof record --agent ADDRESS".into(),
        }),
        _ => {}
    }
    match (noise_pct, g.noise) {
        (Some(p), Some((samples, noise, _))) if p >= LEAST_CAUSE_PCT => causes.push(Cause {
            kind: CauseKind::GuestNoise,
            summary: format!(
                "its noise loop lost {:.1} ms in {samples} samples ({p:.1} % of its time)",
                noise as f64 / 1e6
            ),
            lost_ns: Some(noise),
            share_pct: None,
            vcpu_time_pct: Some(p),
            entities: Vec::new(),
            evidence: vec![
                "the guest's noise loop (`virtprof agent --noise CPUS`), every gap above its threshold".into()
            ],
            see: vec![
                "virtprof noise --host-recording FILE --guest REPORT (which host events explain each sample)".into()
            ],
            rules_out: Vec::new(),
            fix: "isolate the guest's measuring CPUs on the host too: pinned vCPUs, host IRQs steered away, nohz_full"
                .into(),
        }),
        (None, _) => cannot_tell.push(CannotTell {
            what: "OS noise inside the guest".into(),
            why: "its agent ran no noise loop".into(),
            record: "virtprof agent --noise CPUS in the guest".into(),
        }),
        _ => {}
    }
    if g.gaps > 0 {
        cannot_tell.push(CannotTell {
            what: "the guest's figures across its link's gaps".into(),
            why: format!("{} gaps in its rows", g.gaps),
            record: "a steadier link (vsock), or a longer --agent-wait".into(),
        });
    }
    let total: u64 = causes.iter().filter_map(|c| c.lost_ns).sum();
    for c in &mut causes {
        c.share_pct = c.lost_ns.and_then(|ns| pct(ns, total));
    }
    causes.sort_by_key(|c| std::cmp::Reverse(c.lost_ns.unwrap_or(0)));
    let verdict = match (steal_pct, noise_pct) {
        (None, None) => "cannot tell",
        _ if causes.is_empty() => "nothing to explain",
        _ => "explained",
    };
    GuestExplanation {
        agent: g.agent,
        name: g.name.clone(),
        verdict: verdict.into(),
        steal_pct,
        noise_pct,
        causes,
        cannot_tell,
    }
}

/// A fix to try for exits of `reason`.
fn exit_fix(reason: &str) -> String {
    let r = reason.to_ascii_lowercase();
    if r.contains("mmio") || r.contains("npf") || r.contains("ept_misconfig") {
        "serve the device in the kernel: an ioeventfd/irqfd (virtio with vhost) instead of user-space MMIO emulation"
            .into()
    } else if r.contains("io") {
        "serve the port in the kernel: KVM_IOEVENTFD, or a virtio device with vhost, instead of user-space port I/O"
            .into()
    } else if r.contains("msr") || r.contains("timer") || r.contains("apic") {
        "avoid MSR/timer exits: TSC-deadline timer with posted interrupts, the guest's kvm-clock, or APICv/AVIC".into()
    } else if r.contains("ept") || r.contains("fault") || r.contains("pf") {
        "avoid page-fault exits: back guest memory with huge pages and pre-fault it (no balloon churn)".into()
    } else if r.contains("interrupt") || r.contains("intr") {
        "external interrupts on the vCPUs' CPUs: steer host IRQs away from them".into()
    } else {
        format!("see what the guest does to cause {reason} exits (`virtprof exits FILE --threshold-us 100`)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts() -> VmFacts {
        VmFacts {
            pid: 7,
            name: "vm".into(),
            vcpus: 1,
            seconds: Some(1.0),
            run_ns: Some(500_000_000),
            wait_ns: Some(400_000_000),
            blocked_ns: Some(100_000_000),
            preemptors: Some(vec![(Entity::Vm { pid: 9, name: "noisy".into() }, 390_000_000)]),
            exits: Some(vec![
                ExitFacts {
                    reason: "KVM_EXIT_MMIO".into(),
                    count: 20_000,
                    handling_ns: Some(100_000_000),
                    guest_idle: false,
                },
                ExitFacts { reason: "HLT".into(), count: 10, handling_ns: Some(90_000_000), guest_idle: true },
            ]),
            host_irq: Some((1_000_000, 100, 2_000_000, 50)),
            cpus: vec![1],
            migrations: Some(3),
            vmm_roles: Vec::new(),
            vmm_preemptors: Some(Vec::new()),
            memory_faults: Some(0),
            reclaimers: Some(Vec::new()),
            halt_poll_ns: Some(0),
            lost_events: Some(0),
            unavailable: Vec::new(),
        }
    }

    #[test]
    fn causes_are_ranked_by_the_time_they_took_and_share_the_lost_time() {
        let e = explain(&facts());
        let kinds: Vec<CauseKind> = e.causes.iter().map(|c| c.kind).collect();
        // Host interrupts (0.3 %) are under the least share listed; HLT is idling, not lost.
        assert_eq!(kinds, [CauseKind::CpuContention, CauseKind::ExitStorm]);
        assert_eq!(e.lost_ns, Some(400_000_000 + 100_000_000 + 3_000_000));
        let share = e.causes[0].share_pct.unwrap();
        assert!((share - 100.0 * 400.0 / 503.0).abs() < 1e-9, "{share}");
        assert_eq!(e.causes[0].entities[0], Entity::Vm { pid: 9, name: "noisy".into() });
        assert_eq!(e.verdict, "explained");
    }

    #[test]
    fn waiting_with_the_cpu_idle_is_named_a_cpu_limit_not_a_task() {
        // An I/O thread that waited 300 ms, 290 of them with its CPU idle: its cgroup's limit.
        let f = VmFacts {
            wait_ns: Some(0),
            blocked_ns: Some(400_000_000),
            exits: Some(Vec::new()),
            vmm_roles: vec![("io-thread".into(), 1, Some(300_000_000))],
            vmm_preemptors: Some(vec![
                (Entity::IdleCpu, 290_000_000),
                (Entity::Task { tid: 7, pid: Some(7), name: "sh".into() }, 10_000_000),
            ]),
            ..facts()
        };
        let e = explain(&f);
        let starved = &e.causes[0];
        assert_eq!(starved.kind, CauseKind::VmmThreadsStarved);
        assert_eq!(starved.lost_ns, Some(300_000_000));
        assert!(starved.entities.contains(&Entity::IdleCpu), "{:?}", starved.entities);
        assert!(starved.summary.contains("the CPU idle") && starved.fix.contains("cpu.max"), "{starved:?}");
        // A task that took the CPU is not a limit.
        let f = VmFacts {
            vmm_preemptors: Some(vec![(Entity::Task { tid: 7, pid: Some(7), name: "sh".into() }, 290_000_000)]),
            ..f
        };
        assert!(explain(&f).causes[0].fix.contains("cpu.weight"));
    }

    #[test]
    fn a_fault_storm_is_named_with_who_took_the_memory_back_and_left_unquantified() {
        let balloon = Entity::Task { tid: 8, pid: Some(5), name: "reclaim".into() };
        // 2 % of its time waiting: measured, but small; the faults' cost is unknown.
        let f = VmFacts {
            wait_ns: Some(20_000_000),
            exits: Some(Vec::new()),
            memory_faults: Some(20_000),
            reclaimers: Some(vec![(balloon.clone(), 50)]),
            ..facts()
        };
        let e = explain(&f);
        let kinds: Vec<CauseKind> = e.causes.iter().map(|c| c.kind).collect();
        assert_eq!(kinds, [CauseKind::MemoryFaults, CauseKind::CpuContention]);
        let cause = &e.causes[0];
        assert_eq!((cause.lost_ns, cause.entities.first()), (None, Some(&balloon)));
        assert!(cause.summary.contains("20000 guest pages") && cause.summary.contains("50 times"), "{cause:?}");
        // Under the rate, not listed; without the unmap event, who took it back is unknown.
        assert!(explain(&VmFacts { memory_faults: Some(500), ..f.clone() }).causes.is_empty());
        let blind = explain(&VmFacts { reclaimers: None, ..f });
        assert!(blind.causes[0].summary.contains("unknown (kvm_unmap_hva_range not recorded)"));
    }

    #[test]
    fn a_vm_that_loses_little_has_nothing_to_explain() {
        let e = explain(&VmFacts {
            wait_ns: Some(10_000_000),
            exits: Some(Vec::new()),
            preemptors: Some(Vec::new()),
            run_ns: Some(990_000_000),
            ..facts()
        });
        assert_eq!(e.verdict, "nothing to explain");
        assert!(e.causes.is_empty());
    }

    #[test]
    fn a_guest_names_the_steal_and_noise_it_saw_and_what_its_agent_did_not_send() {
        let g = GuestFacts {
            agent: 0,
            name: "web".into(),
            cpus: 2,
            cpu_ns: Some(2_000_000_000),
            steal_ns: Some(300_000_000),
            noise: None,
            gaps: 0,
        };
        let e = explain_guest(&g);
        assert_eq!(e.verdict, "explained");
        assert_eq!(e.causes[0].kind, CauseKind::GuestSteal);
        assert_eq!(e.steal_pct, Some(15.0));
        assert!(e.cannot_tell[0].record.contains("--noise"), "{:?}", e.cannot_tell);
        let quiet = explain_guest(&GuestFacts { steal_ns: Some(1_000_000), ..g.clone() });
        assert_eq!(quiet.verdict, "nothing to explain");
        let blind = explain_guest(&GuestFacts { cpu_ns: None, steal_ns: None, ..g });
        assert_eq!(blind.verdict, "cannot tell");
    }

    #[test]
    fn without_the_events_a_cause_needs_it_cannot_be_told_never_guessed() {
        let e = explain(&VmFacts {
            wait_ns: None,
            run_ns: None,
            blocked_ns: None,
            preemptors: None,
            unavailable: vec![("waiting (host steal) and blocked time".into(), "sched_switch was not recorded".into())],
            ..facts()
        });
        assert!(e.causes.iter().all(|c| c.kind != CauseKind::CpuContention));
        assert_eq!(e.lost_ns, None);
        assert!(e.cannot_tell[0].record.contains("sched"), "{:?}", e.cannot_tell);
    }
}
