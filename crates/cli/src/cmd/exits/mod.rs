//! `virtprof exits FILE`: per-reason exit counts and durations (the columns of
//! `perf kvm stat report`, plus percentiles, the light/heavy split and descheduling), per vCPU
//! or per VM, and per-exit `vm_noise` rows.

mod in_kernel;
mod kernel_hist;

use std::collections::BTreeMap;
use std::io::Write;
use std::process::ExitCode;

use serde::Serialize;
use virtprof_analysis::exits::{ExitAnalyzer, ExitOptions, ExitReport};
use virtprof_model::units::format_duration;
use virtprof_model::Loss;
use virtprof_sinks::table::known;
use virtprof_sinks::Table;
use virtprof_store::recording::Task;

use crate::args::{ExitsArgs, GroupBy};
use crate::exit::usage;
use crate::exit_table::{count, exits_line, reason_table, time_line, us};
use virtprof_engine::recorder::{record_into, RecordOptions};
use virtprof_engine::vcpu_vms::{VcpuEvidence, VmOf};
use virtprof_session::{evidence_event_ids, DecoderNames, Session};

/// JSON output: the analyzer's report plus per-VM totals and the recording's loss.
#[derive(Serialize)]
struct Output<'a> {
    #[serde(flatten)]
    report: &'a ExitReport,
    by_vm: Vec<VmRow>,
    kvm_stats: Vec<StatsDelta>,
    /// Lost events in all, as every command reports them (also in `totals`).
    lost_events: u64,
    /// Lost events per CPU, with where the gaps were.
    loss: &'a Loss,
    /// How the timestamps were read as time where they needed a conversion, or why they
    /// cannot be.
    clock: Option<String>,
    /// The guest's own trace, where given (`--guest`).
    #[serde(skip_serializing_if = "Option::is_none")]
    guest: Option<GuestSummary>,
    /// The kernel's own exit histograms against the trace's (`--kernel-hist`).
    #[serde(skip_serializing_if = "Option::is_none")]
    kernel_hist: Option<kernel_hist::KernelHistCheck>,
}

/// How a guest trace given with `--guest` was read (`guest` in the JSON).
#[derive(Serialize)]
struct GuestSummary {
    name: String,
    file: String,
    /// Its events are on the host's clock.
    aligned: bool,
    /// Why not, where not.
    not_aligned_because: Option<String>,
    /// (guest CPU, host thread), from the host file's GUEST option.
    vcpu_threads: Vec<(u32, u32)>,
    events: u64,
    /// Events of guest CPUs its corrections do not cover.
    unplaced_events: u64,
    lost_events: u64,
    /// Exit rows given their guest's events.
    rows_with_guest: usize,
    #[serde(skip)]
    line: String,
}

/// Each row's guest events just before it, from the guest's own trace.
fn guest_before(guest: &virtprof_session::GuestTrace, report: &mut ExitReport) -> anyhow::Result<GuestSummary> {
    use virtprof_analysis::guest_before::{Exit, GuestBefore};
    use virtprof_analysis::Analyzer;
    let exits: Vec<Exit> = if guest.aligned() {
        report
            .rows
            .iter()
            .enumerate()
            .filter_map(|(row, x)| Some(Exit { guest_cpu: guest.guest_cpu_of(x.tid)?, ts: x.exit_ts, row }))
            .collect()
    } else {
        Vec::new()
    };
    let mut before = GuestBefore::new(exits, report.rows.len());
    let mut decoder = guest.session.decoder(&["sched", "irq", "irq_vectors"])?;
    let walk = guest.walk(&mut decoder, |e, d| before.on_event(e, &DecoderNames(d)))?;
    let mut rows_with_guest = 0;
    for (row, context) in report.rows.iter_mut().zip(before.finish()) {
        rows_with_guest += usize::from(context.is_some());
        row.guest_before = context;
    }
    let loss = guest.session.loss(&walk.stats);
    let mut line = guest.describe();
    line += &format!("; {} guest events, lost {}", walk.stats.events, loss.total());
    if walk.unplaced > 0 {
        line += &format!(", {} on guest CPUs without time-sync samples (left out)", walk.unplaced);
    }
    if guest.aligned() && guest.vcpu_threads.is_empty() {
        line += "; the host file names no vCPU threads for this guest (no GUEST option with its trace id), so no exit can be matched to its guest CPU";
    }
    Ok(GuestSummary {
        name: guest.name.clone(),
        file: guest.session.path.display().to_string(),
        aligned: guest.aligned(),
        not_aligned_because: match &guest.alignment {
            virtprof_session::guest_trace::Alignment::NotAligned(why) => Some(why.clone()),
            virtprof_session::guest_trace::Alignment::Synced(_) => None,
        },
        vcpu_threads: guest.vcpu_threads.clone(),
        events: walk.stats.events,
        unplaced_events: walk.unplaced,
        lost_events: loss.total(),
        rows_with_guest,
        line,
    })
}

/// Deltas of a VMM's KVM stats fd over the recording (start and end snapshots).
#[derive(Serialize)]
struct StatsDelta {
    pid: u32,
    stats: BTreeMap<String, u64>,
}

#[derive(Serialize)]
struct VmRow {
    /// "pid N", "guest NAME" or "VM N (inferred)".
    vm: String,
    /// The VMM process, where the source says.
    pid: Option<u32>,
    /// What put the vCPU threads together: "process", "guest option", "fork" or "vcpu ids".
    grouped_by: &'static str,
    vcpus: usize,
    /// Its vCPU threads, by id.
    tids: Vec<u32>,
    exits: u64,
    lightweight: Option<u64>,
    heavyweight: Option<u64>,
    /// Time in exits, halts apart (None: not time, or not kept per thread).
    total_ns: Option<u64>,
    /// Time in halt exits (the guest idling).
    guest_idle_ns: Option<u64>,
}

pub fn run(args: &ExitsArgs) -> anyhow::Result<ExitCode> {
    if args.bpf {
        return in_kernel::run(args);
    }
    let (recording, kernel_hists) = match &args.file {
        Some(path) => {
            let session = Session::open_warning(path, &args.source.options())?;
            let kept = session.footer.as_ref().and_then(kernel_hist::kept_in);
            (session, kept)
        }
        None => record_live(args)?,
    };
    // Never dropped, nor is the decoder: unmapping a big file and freeing a trace.dat's
    // thousands of formats and tasks took a millisecond of a 20 ms run, and the process ends
    // right after this command, which frees them all at once.
    let recording = std::mem::ManuallyDrop::new(recording);
    let tids = selected_tids(&recording.metadata.tasks, &args.vm, args.vcpu)?;
    let min_row_ns = match args.threshold_us {
        Some(us) if !(0.0..1e12).contains(&us) => {
            return Err(usage(format!("--threshold-us {us}: must be between 0 and 1e12")))
        }
        // In range: checked just above.
        #[allow(clippy::cast_possible_truncation)]
        Some(us) => (us * 1000.0) as u64,
        None => 0,
    };
    let mut decoder = std::mem::ManuallyDrop::new(recording.decoder(&["kvm", "sched", "irq", "irq_vectors"])?);
    let evidence_events = evidence_event_ids(&decoder);
    let rows = args.noise || args.threshold_us.is_some();
    let holdings = recording.holdings(&decoder);
    // KVM's count covers every thread: only with all of them analysed.
    let kvm_exits = recording.kvm_exits().filter(|_| tids.is_empty());
    let options = ExitOptions {
        rows,
        min_row_ns,
        tids,
        evidence_events,
        host: recording.host_kind(),
        holdings,
        kvm_exits,
        timeline: None,
    };
    let mut analyzer = ExitAnalyzer::new(options);
    let mut vcpus = VcpuEvidence::default();
    let mut shared_stamps = kernel_hists.as_ref().map(|_| kernel_hist::SharedStamps::default());
    // Fed in one closure the walk inlines: no dynamic call per event, which shows on big
    // traces.
    let stats = recording.walk(&mut decoder, |e, _| {
        analyzer.on_event(e);
        vcpus.on_event(e);
        if let Some(s) = shared_stamps.as_mut() {
            s.on_event(e);
        }
    })?;
    let mut report = analyzer.finish(&DecoderNames(&decoder));
    let loss = recording.loss(&stats);
    report.totals.lost_events = loss.total();
    let guest = match virtprof_session::GuestTrace::of(&recording, args.guest.as_deref(), &args.source.options())? {
        Some(guest) => Some(guest_before(&guest, &mut report)?),
        None => None,
    };

    let kernel_hist = kernel_hists.map(|read| {
        let names = DecoderNames(&decoder);
        let traced = report.by_reason.iter().map(|r| (r.reason.as_str(), &r.histogram));
        match read {
            Err(why) => kernel_hist::unknown(format!("the kernel's histograms could not be read: {why}")),
            Ok(_) if !args.vm.is_empty() || args.vcpu.is_some() => kernel_hist::unknown(
                "with --vm/--vcpu: the kernel's histograms are of every thread, the table of some".into(),
            ),
            Ok(kernel) => kernel_hist::check(&kernel, traced, &shared_stamps.unwrap_or_default(), &names, loss.total()),
        }
    });
    let vms = vms_of(&report, &recording, &vcpus);
    let by_vm = vm_rows(&report, &vms);
    let kvm_stats = stats_deltas(&recording);
    let mut out = crate::output::stdout();
    if args.json {
        let output = Output {
            report: &report,
            by_vm,
            kvm_stats,
            lost_events: loss.total(),
            loss: &loss,
            clock: recording.clock_line(),
            guest,
            kernel_hist,
        };
        crate::output::write_json_pretty(&mut out, &output)?;
        return Ok(ExitCode::SUCCESS);
    }
    let table = if args.noise || args.threshold_us.is_some() {
        rows_table(&report)
    } else {
        match args.by {
            GroupBy::Reason => reason_table(&report.by_reason),
            GroupBy::Vcpu => vcpu_table(&report, &recording.metadata.tasks, &vms),
            GroupBy::Vm => vm_table(&by_vm),
        }
    };
    if args.csv {
        table.write_csv(&mut out)?;
        return Ok(ExitCode::SUCCESS);
    }
    table.write_text(&mut out)?;
    let t = &report.totals;
    writeln!(out, "\n{} | source: {} | incomplete: {}", exits_line(t), report.source.path, t.incomplete)?;
    if let Some(clock) = recording.clock_line() {
        writeln!(out, "clock: {clock}")?;
    }
    if let Some(line) = time_line(t) {
        writeln!(out, "{line}")?;
    }
    let across = "exits in flight across one are counted as incomplete, and counts near them are short";
    writeln!(out, "{}", recording.loss_report(&loss, &decoder, across))?;
    if let Some(check) = &kernel_hist {
        kernel_hist::write_text(&mut out, check)?;
    }
    for d in &kvm_stats {
        let get = |k: &str| d.stats.get(k).copied().unwrap_or(0);
        writeln!(
            out,
            "KVM stats fd, VM pid {}: {} exits, {} emulated insns, {} io, {} mmio, {} halt during the recording",
            d.pid,
            get("exits"),
            get("insn_emulation"),
            get("io_exits"),
            get("mmio_exits"),
            get("halt_exits")
        )?;
    }
    for note in &report.source.unavailable {
        writeln!(out, "unavailable: {note}")?;
    }
    if let Some(g) = &guest {
        writeln!(out, "{}", g.line)?;
        if !rows {
            writeln!(out, "(add --threshold-us US or --noise for each exit's guest events before it)")?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The kernel's exit histograms as read at the end of a live run, or why they could not be.
type KernelHists = Option<Result<virtprof_trace::exit_hist::KernelExitHists, String>>;

/// `exits --duration`: record this host for that long into memory (no file), then analyse.
fn record_live(args: &ExitsArgs) -> anyhow::Result<(Session, KernelHists)> {
    if args.kernel_hist {
        virtprof_engine::recorder::check_kernel_exit_hist(&[])?;
    }
    let options = RecordOptions {
        duration: Some(args.duration),
        kernel_exit_hist: args.kernel_hist,
        started_message: Some(format!(
            "virtprof: recording for {} (Ctrl-C to stop early)...",
            format_duration(args.duration)
        )),
        ..RecordOptions::default()
    };
    let recorded = record_into(&options, Vec::new())?;
    let (summary, bytes) = (recorded.summary, recorded.out);
    eprintln!("virtprof: recorded {} pages; lost events: {}", summary.pages, summary.lost);
    Ok((Session::from_bytes(bytes, "the live trace")?, summary.kernel_exit_hists))
}

/// Per VM with both snapshots, the vCPU stats summed and differenced (cumulative counters).
fn stats_deltas(recording: &Session) -> Vec<StatsDelta> {
    const KEYS: [&str; 5] = ["exits", "insn_emulation", "io_exits", "mmio_exits", "halt_exits"];
    let sum = |snap: &virtprof_store::recording::KvmStatsSnapshot, key: &str| -> u64 {
        snap.vcpus.iter().filter_map(|(_, m)| m.get(key)).sum()
    };
    recording
        .kvm_stats_spans()
        .into_iter()
        .map(|(start, end)| {
            let stats = KEYS
                .iter()
                .map(|k| (k.to_string(), sum(end, k).saturating_sub(start.map_or(0, |s| sum(s, k)))))
                .collect();
            StatsDelta { pid: end.pid, stats }
        })
        .collect()
}

/// Threads of the selected VMs (`--vm PID`) and vCPU (`--vcpu N`); empty means all.
fn selected_tids(tasks: &[Task], vms: &[u32], vcpu: Option<u32>) -> anyhow::Result<Vec<u32>> {
    if vms.is_empty() && vcpu.is_none() {
        return Ok(Vec::new());
    }
    for pid in vms {
        if !tasks.iter().any(|t| t.pid == *pid) {
            return Err(usage(format!("--vm {pid}: no such process in the recording")));
        }
    }
    let tids: Vec<u32> = tasks
        .iter()
        .filter(|t| vms.is_empty() || vms.contains(&t.pid))
        .filter(|t| vcpu.is_none() || virtprof_kvm::discover::vcpu_index(&t.comm) == vcpu)
        .map(|t| t.tid)
        .collect();
    if tids.is_empty() {
        return Err(usage("no thread matches --vm/--vcpu in this recording"));
    }
    Ok(tids)
}

fn comm_of(tasks: &[Task], tid: u32) -> String {
    tasks.iter().find(|t| t.tid == tid).map(|t| t.comm.clone()).unwrap_or_default()
}

/// Each vCPU thread's VM (see [`virtprof_engine::vcpu_vms`]).
fn vms_of(r: &ExitReport, recording: &Session, vcpus: &VcpuEvidence) -> BTreeMap<u32, VmOf> {
    // A trace.dat's saved cmdlines name thousands of tasks: copied only to add the footer's.
    let mut tasks = std::borrow::Cow::Borrowed(recording.metadata.tasks.as_slice());
    if let Some(footer) = recording.footer.as_ref().filter(|f| !f.tasks.is_empty()) {
        tasks.to_mut().extend(footer.tasks.iter().cloned());
    }
    let threads: Vec<(u32, Option<u32>)> =
        r.by_vcpu.iter().map(|v| (v.tid, vcpus.index(v.tid, &comm_of(&tasks, v.tid)))).collect();
    virtprof_engine::vcpu_vms::group(&threads, &tasks, &recording.metadata.guests, &vcpus.parents)
}

fn vcpu_table(r: &ExitReport, tasks: &[Task], vms: &BTreeMap<u32, VmOf>) -> Table {
    let mut t = Table::new(["TID", "THREAD", "VM", "VCPU", "EXITS", "LIGHT", "HEAVY", "TOTAL_US", "IDLE_US"]);
    for v in &r.by_vcpu {
        t.row([
            v.tid.to_string(),
            comm_of(tasks, v.tid),
            vms.get(&v.tid).map(|vm| vm.label.clone()).unwrap_or_default(),
            v.vcpu_id.map(|i| i.to_string()).unwrap_or_default(),
            v.exits.to_string(),
            count(v.lightweight),
            count(v.heavyweight),
            us(v.total_ns),
            us(v.guest_idle_ns),
        ]);
    }
    t.footer("TOTAL_US: time in exits, the guest's idling in halts apart (IDLE_US), as in the reason table");
    t
}

fn vm_rows(r: &ExitReport, vms: &BTreeMap<u32, VmOf>) -> Vec<VmRow> {
    let mut by_vm: BTreeMap<VmOf, VmRow> = BTreeMap::new();
    for v in &r.by_vcpu {
        let Some(vm) = vms.get(&v.tid) else { continue };
        let row = by_vm.entry(vm.clone()).or_insert(VmRow {
            vm: vm.label.clone(),
            pid: vm.pid,
            grouped_by: vm.evidence,
            vcpus: 0,
            tids: Vec::new(),
            exits: 0,
            lightweight: Some(0),
            heavyweight: Some(0),
            total_ns: Some(0),
            guest_idle_ns: Some(0),
        });
        row.vcpus += 1;
        row.tids.push(v.tid);
        row.exits += v.exits;
        row.lightweight = row.lightweight.zip(v.lightweight).map(|(a, b)| a + b);
        row.heavyweight = row.heavyweight.zip(v.heavyweight).map(|(a, b)| a + b);
        row.total_ns = row.total_ns.zip(v.total_ns).map(|(a, b)| a + b);
        row.guest_idle_ns = row.guest_idle_ns.zip(v.guest_idle_ns).map(|(a, b)| a + b);
    }
    by_vm.into_values().collect()
}

fn vm_table(rows: &[VmRow]) -> Table {
    let mut t = Table::new(["VM", "GROUPED_BY", "VCPUS", "EXITS", "LIGHT", "HEAVY", "TOTAL_US", "IDLE_US"]);
    for v in rows {
        t.row([
            v.vm.clone(),
            v.grouped_by.to_string(),
            v.vcpus.to_string(),
            v.exits.to_string(),
            count(v.lightweight),
            count(v.heavyweight),
            us(v.total_ns),
            us(v.guest_idle_ns),
        ]);
    }
    t.footer("TOTAL_US: time in exits, the guest's idling in halts apart (IDLE_US), as in the reason table");
    t
}

/// "cpu1 bash[42]: irq_handler_entry -12us, sched_switch -3us": the guest CPU, its task and
/// its last events, each with how long before the exit.
fn guest_cell(g: &virtprof_analysis::guest_before::GuestContext) -> String {
    let task = match (&g.task, g.task_tid) {
        (Some(name), Some(tid)) => format!(" {name}[{tid}]"),
        _ => String::new(),
    };
    let events: Vec<String> =
        g.events.iter().map(|e| format!("{} -{}us", e.event, (e.before_ns as f64 / 1e3).round())).collect();
    format!("cpu{}{task}: {}", g.guest_cpu, if events.is_empty() { "-".to_string() } else { events.join(", ") })
}

fn rows_table(r: &ExitReport) -> Table {
    let with_guest = r.rows.iter().any(|x| x.guest_before.is_some());
    let mut headers = vec![
        "EXIT_TS",
        "TID",
        "EXIT_CPU",
        "ENTRY_CPU",
        "REASON",
        "DURATION_US",
        "HEAVY",
        "OVERHEAD_US",
        "VMM_US",
        "PREEMPTED_US",
        "BLOCKED_US",
        "IRQS",
        "SOFTIRQS",
        "THREADS",
    ];
    if with_guest {
        headers.push("GUEST_BEFORE");
    }
    let mut t = Table::new(headers);
    for x in &r.rows {
        let mut cells = vec![
            format!("{:.6}", x.exit_ts as f64 / 1e9),
            x.tid.to_string(),
            x.exit_cpu.to_string(),
            x.entry_cpu.to_string(),
            x.reason.clone(),
            us(Some(x.duration_ns)),
            match x.heavyweight {
                Some(true) => "yes",
                Some(false) => "no",
                None => "unknown",
            }
            .to_string(),
            us(x.overhead_ns),
            us(x.vmm_ns),
            us(x.preempted_ns),
            us(x.blocked_ns),
            count(x.irqs),
            count(x.softirqs),
            known(x.threads.as_ref(), |t| t.join(",")),
        ];
        if with_guest {
            cells.push(x.guest_before.as_ref().map_or_else(|| "-".to_string(), guest_cell));
        }
        t.row(cells);
    }
    t
}
