//! The in-kernel aggregation against the traced path and the micro-VM's own counts, side by
//! side in one run: a VM runs in this process while the eBPF program counts and a private
//! tracefs instance records; per vCPU thread, exits by reason must agree exactly (and the
//! userspace exits be the VMM's own count), run/wait/blocked within 1 %. Needs root, tracefs and /dev/kvm; skips with
//! the reason where one is missing.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use virtprof_analysis::contention::Contention;
use virtprof_analysis::exits::{ExitAnalyzer, ExitOptions, ExitRow};
use virtprof_analysis::hist::{bucket_start, Histogram};
use virtprof_analysis::sched::{Counters, ReasonKey, SchedAccounting, SchedOptions};
use virtprof_analysis::{Analyzer, Names};
use virtprof_engine::kernel_counts::{ExitLog, KernelCounter, LoggedExit, Taker};
use virtprof_kvm::guest::Script;
use virtprof_kvm::vmm::{Vm, VmConfig};
use virtprof_model::Event;
use virtprof_session::{evidence_event_ids, DecoderNames, LiveTrace, EVIDENCE_EVENTS};

const TRACEFS: &str = "/sys/kernel/tracing";

/// The side-by-side tests run one at a time: their tracefs instances are named after this
/// process, and each one's load would disturb the other's figures.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
/// KVM_EXIT_IO.
const EXIT_IO: u32 = 2;

fn skip_reason() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root".into());
    }
    if !Path::new(TRACEFS).join("events/kvm").is_dir() {
        return Some(format!("no kvm events under {TRACEFS}"));
    }
    virtprof_kvm::launcher::check_kvm().err().map(|e| e.to_string())
}

/// The running kernel's major and minor version.
fn kernel_version() -> Vec<u32> {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    release.split(['.', '-']).take(2).filter_map(|p| p.trim().parse().ok()).collect()
}

#[test]
fn kernel_counts_equal_the_traced_counts_and_the_vmms_own() {
    if let Some(why) = skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut counter = KernelCounter::start_logging_exits(Path::new(TRACEFS), &EVIDENCE_EVENTS, 1 << 18)
        .expect("the program loads and attaches");
    assert!(counter.attached().iter().any(|e| e == "kvm:kvm_userspace_exit"), "{:?}", counter.attached());
    // The counts below are then read in batches, the path live views take on Linux 5.6 and later.
    if kernel_version() >= vec![5, 6] {
        assert!(counter.reads_in_batches(), "Linux {:?} has BPF_MAP_LOOKUP_BATCH", kernel_version());
    }
    // The traced path reads the same events, so both see the same CPUs' last events.
    let events: Vec<&str> = counter.attached().iter().map(String::as_str).collect();
    let mut trace = LiveTrace::start(&events, "mono", 16384, &["kvm", "sched"]).expect("a tracefs instance");
    let evidence = evidence_event_ids(trace.decoder());
    let mut traced = SchedAccounting::new(SchedOptions { bucket_ns: 100_000_000, keep_buckets: 1 }, evidence.clone());
    let mut timed = ExitAnalyzer::new(ExitOptions {
        rows: true,
        evidence_events: evidence,
        host: virtprof_host::kind::detect(),
        ..Default::default()
    });

    // Three vCPUs on two CPUs (they wait), sleeping VMM I/O (they block), exits of each kind.
    let script =
        Script::parse_phases("compute:300ms,io-bound:300,pio-user:20000,pio-kernel:20000,cpuid:20000,mmio-user:5000")
            .unwrap();
    let config = vm_config(script, 3, vec![None, None, None], 300_000);
    let report = Vm::new(config).expect("a VM").run().expect("the VM runs");
    let end = virtprof_host::monotonic_ns();
    // Kept for who took the CPUs the vCPUs waited for: their threads are known only now.
    let mut events: Vec<Event> = Vec::new();
    let mut keep = |e: &Event, _: &dyn Names| events.push(*e);
    trace.drain_into(&mut [&mut traced, &mut timed, &mut keep]).expect("the trace drains");
    assert_eq!(trace.loss().total(), 0, "the trace lost events: the comparison would not hold");
    let traced = traced.finish(end);
    let kernel = counter.counts().expect("the maps read");
    assert_eq!(kernel.full, [0; 4]);

    for vcpu in &report.vcpus {
        let mut from_trace: Vec<(ReasonKey, u64)> =
            traced.reasons.iter().filter(|((t, _), _)| *t == vcpu.tid).map(|((_, r), n)| (*r, *n)).collect();
        from_trace.sort();
        let in_kernel: Vec<(ReasonKey, u64)> =
            kernel.reasons.iter().filter(|(t, _, _)| *t == vcpu.tid).map(|(_, r, n)| (*r, *n)).collect();
        assert_eq!(in_kernel, from_trace, "vCPU {} (tid {}): exits in the kernel vs traced", vcpu.index, vcpu.tid);
        let io = in_kernel.iter().find(|(r, _)| *r == ReasonKey::Userspace { reason: EXIT_IO }).map_or(0, |(_, n)| *n);
        assert_eq!(
            Some(&io),
            vcpu.userspace_exits.get("IO"),
            "vCPU {}: KVM_EXIT_IO against the VMM's count",
            vcpu.index
        );

        let mut t = Counters::default();
        for ((tid, _), c) in &traced.counters {
            if *tid == vcpu.tid {
                t.add(c);
            }
        }
        let k =
            kernel.threads.iter().find(|(tid, _)| *tid == vcpu.tid).expect("the program tracked the vCPU").1.at(end);
        println!(
            "vCPU {}: run {} / {} ms, wait {} / {}, blocked {} / {}, execs {} / {}, wakeups {} / {}, io {} / {} (kernel / traced)",
            vcpu.index,
            k.run_ns / 1_000_000,
            t.run_ns / 1_000_000,
            k.wait_ns / 1_000_000,
            t.wait_ns / 1_000_000,
            k.blocked_ns / 1_000_000,
            t.blocked_ns / 1_000_000,
            k.execs,
            t.execs,
            k.wakeups,
            t.wakeups,
            k.io,
            t.io
        );
        let observed = t.observed_ns().max(1) as f64;
        for (what, a, b) in
            [("run", k.run_ns, t.run_ns), ("wait", k.wait_ns, t.wait_ns), ("blocked", k.blocked_ns, t.blocked_ns)]
        {
            let off = a.abs_diff(b) as f64 / observed;
            assert!(
                off <= 0.01,
                "vCPU {}: {what} {a} ns in the kernel, {b} traced: {:.2} % apart",
                vcpu.index,
                off * 100.0
            );
        }
        assert_eq!(k.io, t.io, "vCPU {}: I/O", vcpu.index);
        // Read once, the extremes are the whole run's. Printed beside the trace's, not compared:
        // they agree within about 1 us in most runs, but on a loaded host (3 CPU hogs) about one
        // run in 5 to 20 has one execution whose start the two place a tick or more apart (counts,
        // preemptions and inferred switch-ins equal; e.g. longest allocation 12.0 vs 8.0 ms, run
        // 1020 vs 1016 ms), with the raw and the tracepoint programs alike; not explained yet.
        // Their per-read bookkeeping is checked by sampler::kernel's unit tests.
        println!(
            "vCPU {}: allocations {}-{} ns in the kernel, {}-{} traced; longest wait {} / {} (preemptions {} / {})",
            vcpu.index,
            k.alloc_min_ns,
            k.alloc_max_ns,
            t.alloc_min_ns,
            t.alloc_max_ns,
            k.wait_max_ns,
            t.wait_max_ns,
            k.preemptions,
            t.preemptions
        );
        if k.preemptions > 0 {
            assert!(
                k.alloc_min_ns <= k.alloc_max_ns && k.alloc_max_ns > 0,
                "vCPU {}: extremes kept: {k:?}",
                vcpu.index
            );
        }
        // A wakeup racing its wakee's switch-in on another CPU (the wakee is queued before
        // the wakeup tracepoint fires) is seen in either order, by the program as by the
        // ring buffer's timestamps: the one second is not a wakeup from blocked.
        for (what, a, b) in [("wakeups", k.wakeups, t.wakeups), ("executions", k.execs, t.execs)] {
            assert!(a.abs_diff(b) <= b / 50 + 2, "vCPU {}: {what} {a} in the kernel, {b} traced", vcpu.index);
        }
    }
    // Exit durations by reason: the same exits timed (counts exact), and the same times
    // within what separates the program's clock reads from the ring buffer's timestamps.
    let names = DecoderNames(trace.decoder());
    let traced_durations: Vec<(String, u64, u64)> =
        timed.durations(&names).into_iter().map(|(n, h)| (n, h.count(), h.sum())).collect();
    let mut kernel_durations: Vec<(String, u64, u64)> =
        kernel.durations.iter().map(|(k, h)| (k.name(&names), h.count(), h.sum())).collect();
    kernel_durations.sort();
    println!("durations (reason, count, sum ns): kernel {kernel_durations:?}, traced {traced_durations:?}");
    assert!(!traced_durations.is_empty(), "the traced path timed exits");
    assert_eq!(
        kernel_durations.iter().map(|(n, c, _)| (n, c)).collect::<Vec<_>>(),
        traced_durations.iter().map(|(n, c, _)| (n, c)).collect::<Vec<_>>(),
        "exits timed per reason"
    );
    for ((name, _, a), (_, _, b)) in kernel_durations.iter().zip(&traced_durations) {
        let off = a.abs_diff(*b) as f64 / (*b).max(1) as f64;
        assert!(off <= 0.05, "{name}: {a} ns timed in the kernel, {b} traced ({:.1} % apart)", off * 100.0);
    }
    // Bucket by bucket they can differ: the program reads the clock when it runs, the ring
    // buffer when it reserves the event, and on this host the two reads of one exit's ends can
    // be hundreds of ns apart (exits clustered at 9-10 us then cross bucket edges). The
    // program's log of each exit's own two reads says by how much, exit by exit: bucketed, its
    // durations are its histogram exactly, and each bucket differs from the trace's by at most
    // the exits whose traced duration lies within their gap of one of the bucket's edges.
    let log = counter.exit_log().expect("the exit log read");
    let rows = timed.finish(&names).rows;
    buckets_differ_only_by_the_exits_their_clock_gaps_move(&kernel.durations, &log, &rows, &names);
    // Who ran while each vCPU waited: the program names the processes the CPU it ended its wait
    // on ran since it was queued there (its last 16 runs); the trace follows a wait across
    // CPUs and names threads, summed here per process. Both name the same processes for
    // nearly all of it, and never more than it waited.
    let mut contention = Contention::new(report.vcpus.iter().map(|v| v.tid));
    for e in &events {
        contention.on_event(e, &names);
    }
    let suffered = contention.finish();
    let t_wait =
        |tid: u32| -> u64 { traced.counters.iter().filter(|((t, _), _)| *t == tid).map(|(_, c)| c.wait_ns).sum() };
    assert_eq!(kernel.full[3], 0, "every vCPU thread had room in the waits_by map");
    // The vCPU threads, which took the CPUs from each other, have ended: they were this process's.
    let vcpu_threads: Vec<u32> = report.vcpus.iter().map(|v| v.tid).collect();
    for vcpu in &report.vcpus {
        let named: BTreeMap<Taker, u64> =
            kernel.waits_by.iter().filter(|(w, _, _)| *w == vcpu.tid).map(|(_, by, ns)| (*by, *ns)).collect();
        let in_kernel: u64 = named.values().sum();
        let mut traced_by: BTreeMap<Taker, u64> = BTreeMap::new();
        for (tid, (_, ns)) in suffered.get(&vcpu.tid).map(|s| s.preemptors.iter()).into_iter().flatten() {
            let process = if vcpu_threads.contains(tid) { std::process::id() } else { process_of(*tid) };
            *traced_by.entry(Taker::Process(process)).or_default() += ns;
        }
        let traced_total: u64 = traced_by.values().sum();
        let k = kernel.threads.iter().find(|(tid, _)| *tid == vcpu.tid).unwrap().1.at(end);
        println!("vCPU {}: waits named {in_kernel} ns in the kernel, {traced_total} traced, of {} waited; kernel {named:?}, traced {traced_by:?}", vcpu.index, k.wait_ns);
        assert!(in_kernel <= k.wait_ns, "vCPU {}: named {in_kernel} ns of {} waited", vcpu.index, k.wait_ns);
        assert!(
            traced_total <= t_wait(vcpu.tid) + t_wait(vcpu.tid) / 100,
            "vCPU {}: traced names {traced_total} ns",
            vcpu.index
        );
        let same: u64 = named.iter().map(|(by, ns)| (*ns).min(traced_by.get(by).copied().unwrap_or(0))).sum();
        assert!(
            same as f64 >= 0.9 * traced_total as f64,
            "vCPU {}: the kernel and the trace agree on who took {same} of {traced_total} ns",
            vcpu.index
        );
    }
    // Exited threads leave the maps (bounded) once read.
    for vcpu in &report.vcpus {
        counter.forget(vcpu.tid).expect("forgetting a thread");
    }
    let after = counter.counts().expect("the maps read");
    assert!(
        report.vcpus.iter().all(|v| after.threads.iter().all(|(t, _)| *t != v.tid)
            && after.reasons.iter().all(|(t, _, _)| *t != v.tid)
            && after.waits_by.iter().all(|(t, _, _)| *t != v.tid)),
        "forgotten threads are gone from the maps"
    );
}

/// The committed object is what its source builds to (scripts/bpf/build.sh --check), so the
/// program the kernel runs is the one in the repository.
#[test]
fn the_committed_object_is_built_from_its_source() {
    let have =
        |tool: &str| std::process::Command::new(tool).arg("--version").output().is_ok_and(|o| o.status.success());
    if !have("clang-14") || !Path::new("/usr/include/bpf/bpf_helpers.h").exists() {
        eprintln!("skipped: needs clang-14 and libbpf-dev (scripts/test.sh installs them)");
        return;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/bpf/build.sh");
    let out = std::process::Command::new("bash").arg(&script).arg("--check").output().expect("bash runs");
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
}

/// The program is not blinded by its own reader: a thread reading the maps every millisecond
/// on the CPU where three vCPUs contend (the case a busy host gives `top` and `serve`) leaves
/// the kernel's figures where the trace's are, and the kernel says it skipped nothing. The
/// kernel skips a tracepoint program while its CPU is inside a map syscall or another such
/// program (`bpf_prog_active`): with tracepoint programs on the sched events this run lost
/// 2-18 wakeups (2 of them with no reader at all: interrupts during a kvm event's program).
/// Raw tracepoint programs, used where the kernel has BTF and sched_switch's fourth argument
/// (Linux 5.18), have a guard of their own.
#[test]
fn a_reader_on_the_loaded_cpu_does_not_blind_the_program() {
    if let Some(why) = skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut counter = KernelCounter::start(Path::new(TRACEFS), &EVIDENCE_EVENTS, false).expect("the program loads");
    if !Path::new("/sys/kernel/btf/vmlinux").exists() || kernel_version() < vec![5, 18] {
        eprintln!("skipped: the sched events are read by tracepoint programs here (no BTF, or before Linux 5.18)");
        return;
    }
    assert_eq!(
        counter.raw_events(),
        ["sched:sched_switch", "sched:sched_wakeup", "sched:sched_wakeup_new", "sched:sched_migrate_task"],
        "every sched event through a raw tracepoint program"
    );
    let events: Vec<String> = counter.attached().to_vec();
    let events: Vec<&str> = events.iter().map(String::as_str).collect();
    let mut trace = LiveTrace::start(&events, "mono", 16384, &["kvm", "sched"]).expect("a tracefs instance");
    let evidence = evidence_event_ids(trace.decoder());
    let mut traced = SchedAccounting::new(SchedOptions { bucket_ns: 100_000_000, keep_buckets: 1 }, evidence);
    // Compute (preempted by each other), sleeping I/O (woken from the timer interrupt, on the
    // reader's CPU), compute again.
    let script = Script::parse_phases("compute:700ms,io-bound:400,compute:700ms").unwrap();
    let config = vm_config(script, 3, vec![Some(0); 3], 300_000);
    let done = std::sync::atomic::AtomicBool::new(false);
    let reading = &mut counter;
    let (report, reads) = std::thread::scope(|s| {
        let reader = s.spawn(|| {
            virtprof_host::affinity::set(0, &[0]).expect("pinning the reader");
            let mut reads = 0u64;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                reading.counts().expect("the maps read");
                reads += 1;
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            reads
        });
        let report = Vm::new(config).expect("a VM").run().expect("the VM runs");
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        (report, reader.join().unwrap())
    });
    let end = virtprof_host::monotonic_ns();
    trace.drain_into(&mut [&mut traced]).expect("the trace drains");
    assert_eq!(trace.loss().total(), 0, "the trace lost events: the comparison would not hold");
    let traced = traced.finish(end);
    let kernel = counter.counts().expect("the maps read");
    println!("{reads} reads of the maps on CPU 0 meanwhile; the kernel skipped the program {} times", kernel.missed);
    assert!(reads > 100, "the reader read often: {reads}");
    for vcpu in &report.vcpus {
        let mut t = Counters::default();
        for ((tid, _), c) in &traced.counters {
            if *tid == vcpu.tid {
                t.add(c);
            }
        }
        let k =
            kernel.threads.iter().find(|(tid, _)| *tid == vcpu.tid).expect("the program tracked the vCPU").1.at(end);
        println!(
            "vCPU {}: run {} / {} ms, wait {} / {}, blocked {} / {}, execs {} / {} (kernel / traced)",
            vcpu.index,
            k.run_ns / 1_000_000,
            t.run_ns / 1_000_000,
            k.wait_ns / 1_000_000,
            t.wait_ns / 1_000_000,
            k.blocked_ns / 1_000_000,
            t.blocked_ns / 1_000_000,
            k.execs,
            t.execs
        );
        let observed = t.observed_ns().max(1) as f64;
        for (what, a, b) in
            [("run", k.run_ns, t.run_ns), ("wait", k.wait_ns, t.wait_ns), ("blocked", k.blocked_ns, t.blocked_ns)]
        {
            let off = a.abs_diff(b) as f64 / observed;
            assert!(
                off <= 0.01,
                "vCPU {}: {what} {a} ns in the kernel, {b} traced ({:.2} % apart; {} skipped events)",
                vcpu.index,
                off * 100.0,
                kernel.missed
            );
        }
        assert!(
            k.execs.abs_diff(t.execs) <= t.execs / 50 + 2,
            "vCPU {}: executions {} vs {}",
            vcpu.index,
            k.execs,
            t.execs
        );
    }
    assert_eq!(kernel.missed, 0, "the kernel skipped the program on some events");
}

/// A vCPU that more processes take the CPU from than the program has slots for: the map stays
/// one entry per vCPU thread, the first 16 processes are named, the later ones summed as
/// others, and the named and summed time never exceeds what it waited. (Keyed by waiter and
/// task, a hundred contending VMs filled the map in seconds and the rest went unnamed.)
#[test]
fn a_vcpu_preempted_by_more_processes_than_slots_names_sixteen_and_sums_the_rest() {
    if let Some(why) = skip_reason() {
        eprintln!("skipped: {why}");
        return;
    }
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut counter = KernelCounter::start(Path::new(TRACEFS), &EVIDENCE_EVENTS, false).expect("the program loads");
    let config = vm_config(Script::parse_phases("compute:1500ms").unwrap(), 1, vec![Some(1)], 0);
    const PROCESSES: usize = 24;
    let report = std::thread::scope(|s| {
        let vm = s.spawn(|| Vm::new(config).expect("a VM").run().expect("the VM runs"));
        std::thread::sleep(std::time::Duration::from_millis(200));
        let spin = "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done";
        let children: Vec<_> = (0..PROCESSES)
            .map(|_| std::process::Command::new("taskset").args(["-c", "1", "sh", "-c", spin]).spawn())
            .collect::<Result<_, _>>()
            .expect("taskset and sh run");
        for mut child in children {
            assert!(child.wait().expect("a spinner ends").success());
        }
        vm.join().unwrap()
    });
    let end = virtprof_host::monotonic_ns();
    let kernel = counter.counts().expect("the maps read");
    let vcpu = report.vcpus[0].tid;
    let waits: Vec<(Taker, u64)> =
        kernel.waits_by.iter().filter(|(w, _, _)| *w == vcpu).map(|(_, by, ns)| (*by, *ns)).collect();
    let waited = kernel.threads.iter().find(|(tid, _)| *tid == vcpu).expect("the vCPU tracked").1.at(end).wait_ns;
    let named = waits.iter().filter(|(by, _)| matches!(by, Taker::Process(_))).count();
    let others = waits.iter().find(|(by, _)| *by == Taker::Others).map_or(0, |(_, ns)| *ns);
    let total: u64 = waits.iter().map(|(_, ns)| ns).sum();
    println!("vCPU waited {waited} ns; {named} processes named, {others} ns by others, {total} ns in all: {waits:?}");
    assert_eq!(named, 16, "every slot taken: {waits:?}");
    assert!(others > 0, "the processes past the slots are summed: {waits:?}");
    assert!(total <= waited, "named and summed {total} ns of {waited} waited");
    assert_eq!(kernel.full[3], 0, "the vCPU had room in the map");
    assert!(
        kernel.waits_by.iter().all(|(w, _, _)| kernel.threads.iter().any(|(t, x)| t == w && x.runs_guest)),
        "only vCPU threads (running guest code) have waits named"
    );
}

/// The kernel's exit histograms against the trace's, given the program's log of each exit's
/// clock reads and the trace's rows of the same exits: the log is complete, its exits pair
/// with the trace's one to one (per thread, in order, starting within 1 ms of each other), its
/// durations bucket into the kernel's histograms exactly, and each bucket of the trace's
/// differs from the kernel's by no more than the exits whose traced duration lies within their
/// own gap (kernel duration less traced) of one of that bucket's edges.
fn buckets_differ_only_by_the_exits_their_clock_gaps_move(
    durations: &[(ReasonKey, Histogram)],
    log: &ExitLog,
    rows: &[ExitRow],
    names: &dyn Names,
) {
    assert_eq!(log.offered, log.exits.len() as u64, "the exit log held every timed exit");
    assert_eq!(log.exits.len(), rows.len(), "the program and the trace timed as many exits");
    let mut logged: BTreeMap<u32, Vec<&LoggedExit>> = BTreeMap::new();
    for e in &log.exits {
        logged.entry(e.tid).or_default().push(e);
    }
    let mut traced: BTreeMap<u32, Vec<&ExitRow>> = BTreeMap::new();
    for r in rows {
        traced.entry(r.tid).or_default().push(r);
    }
    // Per reason: the kernel's durations bucketed, and each exit's (traced duration, gap).
    let mut bucketed: BTreeMap<String, Histogram> = BTreeMap::new();
    let mut exits: BTreeMap<String, Vec<(u64, u64)>> = BTreeMap::new();
    for (tid, kernel) in &logged {
        let mut kernel = kernel.clone();
        kernel.sort_by_key(|e| e.start_ns);
        let mut trace = traced.remove(tid).unwrap_or_default();
        trace.sort_by_key(|r| r.exit_ts);
        assert_eq!(kernel.len(), trace.len(), "thread {tid}: exits logged and traced");
        for (k, t) in kernel.iter().zip(&trace) {
            let name = k.reason.name(names);
            assert_eq!(name, t.reason, "thread {tid}: the exit at {} ns paired with another reason", k.start_ns);
            assert!(k.start_ns.abs_diff(t.exit_ts) < 1_000_000, "thread {tid}: exits paired {k:?} / {t:?}");
            let ns = k.end_ns.saturating_sub(k.start_ns);
            bucketed.entry(name.clone()).or_default().record(ns);
            exits.entry(name).or_default().push((t.duration_ns, ns.abs_diff(t.duration_ns)));
        }
    }
    assert!(traced.is_empty(), "threads traced but not logged: {:?}", traced.keys());
    let per_bucket = |h: &Histogram| h.buckets().collect::<BTreeMap<u64, u64>>();
    for (key, kernel) in durations {
        let name = key.name(names);
        let own = bucketed.get(&name).map(per_bucket).unwrap_or_default();
        assert_eq!(per_bucket(kernel), own, "{name}: the kernel's buckets are its own durations bucketed");
        let moves: Vec<(u64, u64)> = exits[&name]
            .iter()
            .map(|&(ns, gap)| (bucket_start(ns.saturating_sub(gap)), bucket_start(ns.saturating_add(gap))))
            .filter(|(low, high)| low != high)
            .collect();
        let traced = per_bucket(&{
            let mut h = Histogram::default();
            exits[&name].iter().for_each(|&(ns, _)| h.record(ns));
            h
        });
        let edges: BTreeSet<u64> = own.keys().chain(traced.keys()).copied().collect();
        let mut moved = 0;
        for b in &edges {
            let differ = own.get(b).unwrap_or(&0).abs_diff(*traced.get(b).unwrap_or(&0));
            let may = moves.iter().filter(|(low, high)| low <= b && b <= high).count() as u64;
            assert!(differ <= may, "{name}: bucket from {b} ns differs by {differ}, but only {may} exits lie within their clock gap of its edges");
            moved += differ;
        }
        println!(
            "{name}: {} exits, {} within their clock gap of a bucket edge, {} in another bucket",
            exits[&name].len(),
            moves.len(),
            moved / 2
        );
    }
}

/// A test VM of `vcpus` vCPUs running `script`, pinned as `pin` says.
fn vm_config(script: Script, vcpus: u32, pin: Vec<Option<u32>>, io_latency_ns: u64) -> VmConfig {
    VmConfig {
        index: 0,
        script,
        vcpus,
        pin,
        io_latency_ns,
        steal_time: false,
        linger_ns: 0,
        sample_hz: 0,
        noise_threshold_ns: 0,
        io_thread: None,
        reclaim_hz: 0,
    }
}

/// The process thread `tid` belongs to (its tgid), from /proc; a thread gone since is taken
/// as its own process, as the idle task (0) is.
fn process_of(tid: u32) -> u32 {
    let status = std::fs::read_to_string(format!("/proc/{tid}/status")).unwrap_or_default();
    status.lines().find_map(|l| l.strip_prefix("Tgid:")).and_then(|v| v.trim().parse().ok()).unwrap_or(tid)
}
