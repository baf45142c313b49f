//! XenMon's table from an accounted [`Span`]: per VM and per vCPU, running / waiting / blocked
//! shares, executions, CPU and wait per execution, blocked time per I/O, allocation, I/O count
//! and exits per second with the top reasons. The same rows serve `virtprof top` (live, its
//! JSON and CSV log) and `virtprof sched` (recordings).

use rustc_hash::FxHashMap;
use serde::Serialize;

use crate::sched::{Counters, ReasonKey, Span};
use crate::Names;
use virtprof_model::evidence::{Class, Figure, Holdings};
use virtprof_model::vmm::{ThreadRole, VmOwner};
use virtprof_model::{Pid, Tid, VcpuThread};

/// A VM as discovery (or a recording's task list) knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmInfo {
    /// VMM process id.
    pub pid: Pid,
    /// VM name.
    pub name: String,
    /// VMM kind (`qemu`, `firecracker`, ...).
    pub kind: String,
    /// Its UUID, libvirt domain, pod and container, where known.
    pub owner: VmOwner,
    /// Its vCPUs and their threads.
    pub vcpus: Vec<VcpuThread>,
    /// The VMM's other threads that work for it (I/O threads, main loop, vhost workers).
    pub others: Vec<VmmThread>,
    /// Its vCPUs are emulated (QEMU TCG): scheduled like any, but they make no exits, so
    /// exits and I/O accesses are unknown, not zero.
    pub emulated: bool,
}

/// A VMM thread other than a vCPU, and what it does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VmmThread {
    /// Thread id.
    pub tid: u32,
    /// What it does for the VM.
    pub role: ThreadRole,
}

/// One window of the table.
#[derive(Debug, Clone, Serialize)]
pub struct WindowReport {
    /// Window length in seconds (what was covered: at most the nominal width); unknown where
    /// the timestamps are not time.
    pub seconds: Option<f64>,
    /// `1s`, `10s`, `run`, or a slice's start offset in a recording.
    pub label: String,
    /// Trace-clock bounds.
    pub start_ns: u64,
    /// Trace-clock bounds.
    pub end_ns: u64,
    /// Only time on this physical CPU (the per-CPU view), if set.
    pub cpu: Option<u32>,
    /// Where the exit counts come from: `kvm_exit`, `evidence` or `kvm-stats`.
    pub exits_source: String,
    /// VMs.
    pub vms: Vec<VmRow>,
    /// Figures the source cannot give (null in the rows), each with its reason.
    pub unavailable: Vec<String>,
}

impl WindowReport {
    /// How long the window is, for a heading: `0.325 s`, or `duration unknown`.
    pub fn length_text(&self, decimals: usize) -> String {
        self.seconds.map_or_else(|| "duration unknown".to_string(), |s| format!("{s:.decimals$} s"))
    }
}

/// One VM: shares averaged over its vCPUs, counts summed.
#[derive(Debug, Clone, Serialize)]
pub struct VmRow {
    /// VMM pid.
    pub pid: u32,
    /// Name.
    pub name: String,
    /// VMM kind.
    pub kind: String,
    /// Its UUID, libvirt domain, pod and container, where known.
    #[serde(skip_serializing_if = "VmOwner::is_empty")]
    pub owner: VmOwner,
    /// Running share, % of the vCPUs' observed time (None: unknown, as every figure below
    /// that the source lacks the events for; see the window's `unavailable`).
    pub running_pct: Option<f64>,
    /// Runnable but waiting (host-side steal).
    pub waiting_pct: Option<f64>,
    /// Blocked.
    pub blocked_pct: Option<f64>,
    /// Executions of all vCPUs.
    pub exec_count: Option<u64>,
    /// I/O accesses (None: unknown for one of its vCPUs).
    pub io_count: Option<u64>,
    /// Exits per second (None: unknown for one of its vCPUs).
    pub exits_per_s: Option<f64>,
    /// Per vCPU.
    pub vcpus: Vec<VcpuRow>,
    /// The VM's threads by role, vCPUs first: the work done for it inside and outside its
    /// vCPUs (XenMon's Dom0 share, here the VMM's own threads).
    pub roles: Vec<RoleRow>,
}

/// The threads of one role of a VM's VMM over a window.
#[derive(Debug, Clone, Serialize)]
pub struct RoleRow {
    /// `vcpu`, `io-thread`, `main-loop`, `vhost`, `worker` or `other`.
    pub role: ThreadRole,
    /// Threads of this role seen in the window.
    pub threads: usize,
    /// CPU time used, in CPUs (run time over the window's length).
    pub cpus: Option<f64>,
    /// Running, % of its threads' observed time.
    pub running_pct: Option<f64>,
    /// Runnable but waiting for a CPU.
    pub waiting_pct: Option<f64>,
    /// Blocked.
    pub blocked_pct: Option<f64>,
    /// Time running, ns (all its threads).
    pub run_ns: Option<u64>,
    /// Time waiting, ns.
    pub wait_ns: Option<u64>,
    /// Time blocked, ns.
    pub blocked_ns: Option<u64>,
    /// Executions (dispatches) of all its threads.
    pub exec_count: Option<u64>,
    /// Executions per second.
    pub execs_per_s: Option<f64>,
    /// Mean CPU time per execution.
    pub cpu_per_exec_us: Option<f64>,
    /// Mean wait per execution.
    pub wait_per_exec_us: Option<f64>,
    /// The VM's I/O accesses (its vCPUs' port and MMIO exits: the guest asking its devices)
    /// per execution of this role: XenMon's I/O count per execution period (Fig. 7b). None
    /// where the VM's I/O is unknown or the role did not run.
    pub io_per_exec: Option<f64>,
}

/// One vCPU thread.
#[derive(Debug, Clone, Serialize)]
pub struct VcpuRow {
    /// vCPU index.
    pub index: u32,
    /// Thread id.
    pub tid: u32,
    /// The physical CPU it ran on longest (or last).
    pub cpu: Option<u32>,
    /// Running, % of its observed time (None: unknown, as every figure below that the
    /// source lacks the events for; see the window's `unavailable`).
    pub running_pct: Option<f64>,
    /// Waiting runnable (host-side steal).
    pub waiting_pct: Option<f64>,
    /// Blocked.
    pub blocked_pct: Option<f64>,
    /// Not known (before its first event, after lost events).
    pub unknown_pct: Option<f64>,
    /// Time running, ns.
    pub run_ns: Option<u64>,
    /// Time waiting, ns.
    pub wait_ns: Option<u64>,
    /// Time blocked, ns.
    pub blocked_ns: Option<u64>,
    /// Dispatches.
    pub exec_count: Option<u64>,
    /// Of those, dispatches the trace did not show (inferred from the thread's own events).
    pub inferred_exec_count: Option<u64>,
    /// Mean CPU time per execution.
    pub cpu_per_exec_us: Option<f64>,
    /// Mean wait per execution.
    pub wait_per_exec_us: Option<f64>,
    /// Blocked time per I/O (0 without I/O).
    pub blocked_per_io_us: Option<f64>,
    /// Allocation (executions ended by preemption): min, mean, max; null when none.
    pub alloc_min_us: Option<f64>,
    /// Mean allocation.
    pub alloc_avg_us: Option<f64>,
    /// Longest allocation.
    pub alloc_max_us: Option<f64>,
    /// Longest single wait the source saw whole, from runnable to running (the worst
    /// dispatch delay); null when it saw none.
    pub wait_max_us: Option<f64>,
    /// I/O accesses, port and MMIO (None: unknown, e.g. polling a VMM whose KVM stats are not
    /// readable).
    pub io_count: Option<u64>,
    /// Exits (or evidence of exits, see `exits_source`); None where the host traces no
    /// kvm_exit and the source has no userspace exits to count.
    pub exits: Option<u64>,
    /// Exits per second (None: unknown, e.g. polling a VMM whose KVM stats are not readable).
    pub exits_per_s: Option<f64>,
    /// The same from the vCPU's KVM stats over the window, where they are readable (live
    /// views), whichever source `exits_per_s` took.
    pub kvm_stats_exits_per_s: Option<f64>,
    /// The most frequent exit reasons.
    pub top_reasons: Vec<ReasonRate>,
}

/// An exit reason's rate.
#[derive(Debug, Clone, Serialize)]
pub struct ReasonRate {
    /// The kernel's name for it.
    pub reason: String,
    /// Per second.
    pub per_s: f64,
}

/// How many reasons a vCPU row lists.
const TOP_REASONS: usize = 3;

/// The figures a window reports, by the evidence each needs.
const FIGURES: [Figure; 3] = [Figure::Running, Figure::WaitingBlocked, Figure::IoCount];

/// The table of `span` for `vms` (only time on `cpu` when set), each figure known only where
/// `holdings` has its evidence.
pub fn window_report(
    span: &Span,
    label: &str,
    vms: &[VmInfo],
    names: &dyn Names,
    cpu: Option<u32>,
    holdings: &Holdings,
) -> WindowReport {
    let seconds = span.end_ns.saturating_sub(span.start_ns) as f64 / 1e9;
    let kvm_exit = span.has_kvm_exits();
    let by_thread = ByThread::new(span);
    let known = Known::of(holdings);
    let vms = vms
        .iter()
        .map(|vm| {
            let vcpus: Vec<VcpuRow> = vm
                .vcpus
                .iter()
                .map(|&VcpuThread { index, tid: Tid(tid) }| {
                    vcpu_row(&by_thread, index, tid, cpu, seconds, kvm_exit, names, known)
                })
                .filter(|row| {
                    let c = by_thread.thread(row.tid, cpu);
                    cpu.is_none() || c.run_ns + c.wait_ns + c.blocked_ns > 0
                })
                .map(|row| if vm.emulated { VcpuRow { io_count: None, exits_per_s: None, ..row } } else { row })
                .collect();
            let mean = |f: fn(&VcpuRow) -> Option<f64>| -> Option<f64> {
                let values: Option<Vec<f64>> = vcpus.iter().map(f).collect();
                values.map(|v| if v.is_empty() { 0.0 } else { v.iter().sum::<f64>() / v.len() as f64 })
            };
            let io_count: Option<u64> = vcpus.iter().map(|v| v.io_count).sum();
            VmRow {
                roles: role_rows(&by_thread, vm, cpu, seconds, io_count, known),
                pid: vm.pid.0,
                name: vm.name.clone(),
                kind: vm.kind.clone(),
                owner: vm.owner.clone(),
                running_pct: mean(|v| v.running_pct),
                waiting_pct: mean(|v| v.waiting_pct),
                blocked_pct: mean(|v| v.blocked_pct),
                exec_count: vcpus.iter().map(|v| v.exec_count).sum(),
                io_count,
                exits_per_s: vcpus.iter().map(|v| v.exits_per_s).sum(),
                vcpus,
            }
        })
        .collect();
    WindowReport {
        seconds: known.time.then_some(seconds),
        label: label.to_string(),
        start_ns: span.start_ns,
        end_ns: span.end_ns,
        cpu,
        exits_source: if kvm_exit { "kvm_exit" } else { "evidence" }.into(),
        vms,
        unavailable: holdings
            .unavailable(&FIGURES)
            .iter()
            .chain(holdings.unavailable(&[Figure::ExitRateWithoutExitEvents]).iter().filter(|_| !kvm_exit))
            .map(ToString::to_string)
            .collect(),
    }
}

/// Which of a window's figures the source can give.
#[derive(Debug, Clone, Copy)]
struct Known {
    running: bool,
    waiting_blocked: bool,
    io: bool,
    /// Rates need the timestamps to be time.
    time: bool,
    /// Exit rates without kvm_exit: of the userspace exits, so they must be recorded.
    exit_rate: bool,
    /// Exit counts without kvm_exit: the same without time.
    exit_count: bool,
}

impl Known {
    fn of(holdings: &Holdings) -> Known {
        Known {
            running: holdings.knows(Figure::Running),
            waiting_blocked: holdings.knows(Figure::WaitingBlocked),
            io: holdings.knows(Figure::IoCount),
            time: holdings.has(Class::Time),
            exit_rate: holdings.knows(Figure::ExitRateWithoutExitEvents),
            exit_count: holdings.has(Class::UserspaceExit),
        }
    }

    fn running<T>(self, v: T) -> Option<T> {
        self.running.then_some(v)
    }

    fn waits<T>(self, v: T) -> Option<T> {
        self.waiting_blocked.then_some(v)
    }
}

/// A span's entries grouped by thread, made once per window: looking each thread up in the
/// whole span made a window cost VMs x threads (with 256 VMs, most of a scrape).
struct ByThread<'a> {
    /// tid → (CPU, its counters there).
    counters: FxHashMap<u32, Vec<(u32, &'a Counters)>>,
    /// tid → its exits as counted ([`Span::counted_reasons`]).
    reasons: FxHashMap<u32, Vec<(ReasonKey, u64)>>,
}

impl<'a> ByThread<'a> {
    fn new(span: &'a Span) -> ByThread<'a> {
        let mut counters: FxHashMap<u32, Vec<(u32, &Counters)>> = FxHashMap::default();
        for (&(tid, cpu), c) in &span.counters {
            counters.entry(tid).or_default().push((cpu, c));
        }
        let mut reasons: FxHashMap<u32, Vec<(ReasonKey, u64)>> = FxHashMap::default();
        for (tid, key, n) in span.counted_reasons() {
            reasons.entry(tid).or_default().push((key, n));
        }
        ByThread { counters, reasons }
    }

    /// A thread's entries: (CPU, counters).
    fn entries(&self, tid: u32) -> &[(u32, &'a Counters)] {
        self.counters.get(&tid).map_or(&[], Vec::as_slice)
    }

    /// A thread's counters on `cpu`, or on all CPUs.
    fn thread(&self, tid: u32, cpu: Option<u32>) -> Counters {
        let mut sum = Counters::default();
        for (_, c) in self.entries(tid).iter().filter(|(on, _)| cpu.is_none_or(|want| want == *on)) {
            sum.add(c);
        }
        sum
    }

    /// The CPU a thread ran on longest (ties: the lower CPU).
    fn main_cpu(&self, tid: u32) -> Option<u32> {
        self.entries(tid)
            .iter()
            .max_by_key(|(cpu, c)| (c.run_ns, c.observed_ns(), std::cmp::Reverse(*cpu)))
            .map(|(cpu, _)| *cpu)
    }
}

/// A row per role that has threads, vCPUs first.
fn role_rows(
    span: &ByThread<'_>,
    vm: &VmInfo,
    cpu: Option<u32>,
    seconds: f64,
    io: Option<u64>,
    known: Known,
) -> Vec<RoleRow> {
    let threads: Vec<(ThreadRole, u32)> =
        vm.vcpus.iter().map(|v| (ThreadRole::Vcpu, v.tid.0)).chain(vm.others.iter().map(|t| (t.role, t.tid))).collect();
    let mut sums: FxHashMap<ThreadRole, (Counters, u64)> = FxHashMap::default();
    // A thread listed twice (a vCPU also among the others) counts once, as a walk over the
    // span's entries would.
    let mut seen = rustc_hash::FxHashSet::default();
    for &(role, tid) in threads.iter().filter(|(_, tid)| seen.insert(*tid)) {
        for &(on, counters) in span.entries(tid) {
            let (c, observed) = sums.entry(role).or_insert_with(|| (Counters::default(), 0));
            *observed += counters.observed_ns();
            if cpu.is_none_or(|want| want == on) {
                c.add(counters);
            }
        }
    }
    ThreadRole::ALL
        .into_iter()
        .filter_map(|role| {
            let count = threads.iter().filter(|(r, _)| *r == role).count();
            if count == 0 {
                return None;
            }
            let (c, observed) = sums.get(&role).copied().unwrap_or_default();
            let pct = |ns: u64| if observed > 0 { 100.0 * ns as f64 / observed as f64 } else { 0.0 };
            let per = |ns: u64| if c.execs > 0 { ns as f64 / c.execs as f64 / 1e3 } else { 0.0 };
            Some(RoleRow {
                role,
                threads: count,
                cpus: known.running(if seconds > 0.0 { c.run_ns as f64 / 1e9 / seconds } else { 0.0 }),
                running_pct: known.running(pct(c.run_ns)),
                waiting_pct: known.waits(pct(c.wait_ns)),
                blocked_pct: known.waits(pct(c.blocked_ns)),
                run_ns: known.running(c.run_ns),
                wait_ns: known.waits(c.wait_ns),
                blocked_ns: known.waits(c.blocked_ns),
                exec_count: known.running(c.execs),
                execs_per_s: known.running(if seconds > 0.0 { c.execs as f64 / seconds } else { 0.0 }),
                cpu_per_exec_us: known.running(per(c.run_ns)),
                wait_per_exec_us: known.waits(per(c.wait_ns)),
                io_per_exec: io.filter(|_| c.execs > 0 && known.running).map(|io| io as f64 / c.execs as f64),
            })
        })
        .collect()
}

#[allow(clippy::too_many_arguments)]
fn vcpu_row(
    span: &ByThread<'_>,
    index: u32,
    tid: u32,
    cpu: Option<u32>,
    seconds: f64,
    kvm_exit: bool,
    names: &dyn Names,
    known: Known,
) -> VcpuRow {
    let all = span.thread(tid, None);
    let c: Counters = span.thread(tid, cpu);
    let observed = all.observed_ns() as f64;
    let pct = |ns: u64| if observed > 0.0 { 100.0 * ns as f64 / observed } else { 0.0 };
    let per = |ns: u64, n: u64| if n > 0 { ns as f64 / n as f64 / 1e3 } else { 0.0 };
    let rate = |n: u64| if seconds > 0.0 { n as f64 / seconds } else { 0.0 };
    let exits = if kvm_exit { c.exits } else { c.evidence };
    let rated = known.time && (kvm_exit || known.exit_rate);
    let mut reasons: Vec<(ReasonKey, u64)> = span.reasons.get(&tid).cloned().unwrap_or_default();
    reasons.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let alloc = c.preemptions > 0;
    let io = known.io.then_some(c.io);
    VcpuRow {
        index,
        tid,
        cpu: cpu.or_else(|| span.main_cpu(tid)),
        running_pct: known.running(pct(c.run_ns)),
        waiting_pct: known.waits(pct(c.wait_ns)),
        blocked_pct: known.waits(pct(c.blocked_ns)),
        unknown_pct: known.running(pct(c.unknown_ns)),
        run_ns: known.running(c.run_ns),
        wait_ns: known.waits(c.wait_ns),
        blocked_ns: known.waits(c.blocked_ns),
        exec_count: known.running(c.execs),
        inferred_exec_count: known.running(c.inferred_execs),
        cpu_per_exec_us: known.running(per(c.run_ns, c.execs)),
        wait_per_exec_us: known.waits(per(c.wait_ns, c.execs)),
        // Blocked time per I/O: with I/O only (none: no figure to give, not an unknown).
        blocked_per_io_us: io.filter(|&n| n > 0 && known.waiting_blocked).map(|n| per(c.blocked_ns, n)),
        alloc_min_us: alloc.then(|| c.alloc_min_ns as f64 / 1e3).filter(|_| known.running),
        alloc_avg_us: alloc.then(|| per(c.alloc_sum_ns, c.preemptions)).filter(|_| known.running),
        alloc_max_us: alloc.then(|| c.alloc_max_ns as f64 / 1e3).filter(|_| known.running),
        wait_max_us: (c.wait_max_ns > 0).then(|| c.wait_max_ns as f64 / 1e3).filter(|_| known.waiting_blocked),
        io_count: io,
        exits: (kvm_exit || known.exit_count).then_some(exits),
        exits_per_s: rated.then(|| rate(exits)),
        kvm_stats_exits_per_s: None,
        top_reasons: reasons
            .into_iter()
            .take(TOP_REASONS)
            .filter(|_| rated)
            .map(|(key, n)| ReasonRate { reason: key.name(names), per_s: rate(n) })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TestNames;

    fn counters(run_ns: u64, wait_ns: u64, blocked_ns: u64, execs: u64, io: u64) -> Counters {
        Counters { run_ns, wait_ns, blocked_ns, execs, io, ..Counters::default() }
    }

    fn vm(emulated: bool) -> VmInfo {
        VmInfo {
            pid: Pid(100),
            name: "web".into(),
            kind: "qemu".into(),
            owner: VmOwner::default(),
            vcpus: vec![VcpuThread::new(0, 101)],
            others: vec![
                VmmThread { tid: 100, role: ThreadRole::MainLoop },
                VmmThread { tid: 102, role: ThreadRole::IoThread },
                VmmThread { tid: 103, role: ThreadRole::Worker },
                VmmThread { tid: 104, role: ThreadRole::Worker },
            ],
            emulated,
        }
    }

    #[test]
    fn a_window_reads_each_thread_as_a_walk_over_the_whole_span_would() {
        let mut span = Span { start_ns: 0, end_ns: 1_000_000_000, ..Span::default() };
        for tid in 1..40u32 {
            let n = u64::from(tid);
            // Threads on 0 to 3 CPUs, each entry different (no ties for the main CPU).
            for cpu in 0..tid % 4 {
                let c = counters(1_000 * n + 10 * u64::from(cpu), u64::from(cpu) + 1, n, n, u64::from(cpu));
                span.counters.insert((tid, cpu), c);
            }
            span.reasons.insert((tid, ReasonKey::Userspace { reason: 2 }), n);
            span.reasons.insert((tid, ReasonKey::Event { id: 7 }), 2 * n);
            if tid % 5 == 0 {
                span.reasons.insert((tid, ReasonKey::Exit { reason: 30, isa: 1 }), n);
            }
        }
        let index = ByThread::new(&span);
        for tid in 0..41 {
            for cpu in [None, Some(0), Some(1), Some(2), Some(9)] {
                assert_eq!(index.thread(tid, cpu), span.thread(tid, cpu), "thread {tid} on {cpu:?}");
            }
            assert_eq!(index.main_cpu(tid), span.main_cpu(tid), "thread {tid}");
            let mut want: Vec<(ReasonKey, u64)> =
                span.counted_reasons().filter(|(t, _, _)| *t == tid).map(|(_, key, n)| (key, n)).collect();
            let mut got = index.reasons.get(&tid).cloned().unwrap_or_default();
            want.sort();
            got.sort();
            assert_eq!(got, want, "thread {tid}: only kvm_exit reasons, as the span has some");
        }
    }

    #[test]
    fn a_vms_threads_are_summed_by_role_with_its_io_per_execution() {
        let mut span = Span { start_ns: 0, end_ns: 1_000_000_000, ..Span::default() };
        span.counters.insert((101, 0), counters(600_000_000, 100_000_000, 300_000_000, 40, 80));
        span.counters.insert((100, 0), counters(100_000_000, 50_000_000, 700_000_000, 10, 0));
        span.counters.insert((100, 1), counters(100_000_000, 0, 50_000_000, 10, 0));
        span.counters.insert((103, 1), counters(10_000_000, 0, 490_000_000, 2, 0));
        span.counters.insert((104, 1), counters(30_000_000, 0, 470_000_000, 2, 0));
        span.counters.insert((999, 0), counters(900_000_000, 0, 0, 1, 0)); // another process
        let report = window_report(&span, "run", &[vm(false)], &TestNames, None, &Holdings::all());
        let roles = &report.vms[0].roles;
        let names: Vec<_> = roles.iter().map(|r| (r.role, r.threads)).collect();
        assert_eq!(
            names,
            [(ThreadRole::Vcpu, 1), (ThreadRole::IoThread, 1), (ThreadRole::MainLoop, 1), (ThreadRole::Worker, 2)]
        );
        let main = &roles[2];
        assert_eq!(
            (main.run_ns, main.wait_ns, main.blocked_ns, main.exec_count),
            (Some(200_000_000), Some(50_000_000), Some(750_000_000), Some(20))
        );
        assert!((main.cpus.unwrap() - 0.2).abs() < 1e-9 && (main.running_pct.unwrap() - 20.0).abs() < 1e-9);
        // The VM's 80 I/O accesses over the main loop's 20 executions.
        assert_eq!(main.io_per_exec, Some(4.0));
        // An I/O thread that never ran: no executions, so no I/O per execution.
        assert_eq!((roles[1].exec_count, roles[1].io_per_exec), (Some(0), None));
        let workers = &roles[3];
        assert_eq!((workers.run_ns, workers.exec_count), (Some(40_000_000), Some(4)));
        // Only CPU 1: the main loop's time there, its shares still of all its time.
        let on_1 = window_report(&span, "run", &[vm(false)], &TestNames, Some(1), &Holdings::all());
        assert_eq!(on_1.vms[0].roles[2].run_ns, Some(100_000_000));
        assert!((on_1.vms[0].roles[2].running_pct.unwrap() - 10.0).abs() < 1e-9);
        // Emulated vCPUs make no exits: the VM's I/O is unknown, never 0.
        let tcg = window_report(&span, "run", &[vm(true)], &TestNames, None, &Holdings::all());
        assert_eq!((tcg.vms[0].io_count, tcg.vms[0].exits_per_s), (None, None));
        assert!(tcg.vms[0].roles.iter().all(|r| r.io_per_exec.is_none()));
    }
}
