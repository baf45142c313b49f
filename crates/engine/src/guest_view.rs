//! A guest's own trace read beside its host's by `sched` and `report` (`--guest FILE`, or the
//! guest machine a recording `import --guest` made holds): per guest CPU its busy and idle
//! time, longest tasks, interrupts and softirqs, with the host thread that runs it. Each
//! figure is known only where the guest's trace holds its events.

use serde::Serialize;
use virtprof_analysis::guest_cpus::{GuestCpus, TaskTime};
use virtprof_analysis::Analyzer;
use virtprof_model::evidence::{Class, Figure, Unavailable};
use virtprof_session::guest_trace::Alignment;
use virtprof_session::{DecoderNames, GuestTrace};

/// Longest tasks shown per guest CPU.
const TOP_TASKS: usize = 3;

/// The guest's side, as `sched --json` and `report --json` give it (`guest_trace`).
#[derive(Debug, Clone, Serialize)]
pub struct GuestView {
    /// Its name (the host file's GUEST option, else the file's stem).
    pub name: String,
    /// Where its trace was read from.
    pub file: String,
    /// Whether its events are on the host's clock (by its TIME_SHIFT).
    pub aligned: bool,
    /// Why not, where not.
    pub not_aligned_because: Option<String>,
    /// How it was placed, in one line.
    pub placement: String,
    /// Events read.
    pub events: u64,
    /// Events on guest CPUs its corrections do not cover (left out).
    pub unplaced_events: u64,
    /// Its lost events, as every loss line says them.
    pub lost_events_text: String,
    /// Runs of tasks past the analysis' cap, whose time counts in busy time under no task.
    pub tasks_dropped: u64,
    /// Per guest CPU.
    pub cpus: Vec<GuestCpuRow>,
    /// Figures its trace cannot give, and why.
    pub unavailable: Vec<Unavailable>,
}

/// One guest CPU.
#[derive(Debug, Clone, Serialize)]
pub struct GuestCpuRow {
    /// Guest CPU.
    pub guest_cpu: u32,
    /// The host thread running it (the host file's GUEST option), where named.
    pub host_tid: Option<u32>,
    /// From its first sched_switch to the trace's end, ns.
    pub observed_ns: Option<u64>,
    /// Time a task ran (steal it suffered included: the guest's clock runs on).
    pub busy_ns: Option<u64>,
    /// Time its idle task ran.
    pub idle_ns: Option<u64>,
    /// busy / observed.
    pub busy_pct: Option<f64>,
    /// Context switches.
    pub switches: Option<u64>,
    /// Interrupt handler entries.
    pub irqs: Option<u64>,
    /// Softirq entries.
    pub softirqs: Option<u64>,
    /// Longest-running tasks (None where busy time is unknown).
    pub top_tasks: Option<Vec<TaskTime>>,
}

/// Read `guest`'s trace once.
pub fn read(guest: &GuestTrace) -> anyhow::Result<GuestView> {
    let mut decoder = guest.session.decoder(&["sched", "irq", "irq_vectors"])?;
    let mut cpus = GuestCpus::default();
    let walk = guest.walk(&mut decoder, |e, d| cpus.on_event(e, &DecoderNames(d)))?;
    let holdings = guest.holdings(&decoder);
    let mut unavailable = holdings.unavailable(&[Figure::GuestBusy, Figure::GuestIrqs, Figure::GuestSoftirqs]);
    let (busy, irqs, softirqs) =
        (holdings.knows(Figure::GuestBusy), holdings.knows(Figure::GuestIrqs), holdings.knows(Figure::GuestSoftirqs));
    let switches = holdings.has(Class::SchedSwitch);
    let tasks_dropped = cpus.tasks_dropped;
    let rows = cpus
        .finish(TOP_TASKS)
        .into_iter()
        .map(|c| {
            let observed = c.from_ns.map(|from| c.to_ns.saturating_sub(from)).filter(|_| busy);
            if busy && observed.is_none() {
                unavailable.push(Unavailable {
                    figure: format!("guest CPU {}'s busy and idle time", c.cpu),
                    missing: Vec::new(),
                    reason: "the guest's trace holds no sched_switch on this CPU".into(),
                });
            }
            let known = observed.is_some();
            GuestCpuRow {
                guest_cpu: c.cpu,
                host_tid: guest.vcpu_threads.iter().find(|&&(cpu, _)| cpu == c.cpu).map(|&(_, tid)| tid),
                observed_ns: observed,
                busy_ns: known.then_some(c.busy_ns),
                idle_ns: known.then_some(c.idle_ns),
                busy_pct: observed.filter(|&ns| ns > 0).map(|ns| 100.0 * c.busy_ns as f64 / ns as f64),
                switches: switches.then_some(c.switches),
                irqs: irqs.then_some(c.irqs),
                softirqs: softirqs.then_some(c.softirqs),
                top_tasks: known.then_some(c.top),
            }
        })
        .collect();
    let loss = guest.session.loss(&walk.stats);
    Ok(GuestView {
        name: guest.name.clone(),
        file: guest.session.path.display().to_string(),
        aligned: guest.aligned(),
        not_aligned_because: match &guest.alignment {
            Alignment::NotAligned(why) => Some(why.clone()),
            Alignment::Synced(_) => None,
        },
        placement: guest.describe(),
        events: walk.stats.events,
        unplaced_events: walk.unplaced,
        lost_events_text: guest.session.describe_loss(&loss, &decoder),
        tasks_dropped,
        cpus: rows,
        unavailable,
    })
}
