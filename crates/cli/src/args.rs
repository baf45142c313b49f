//! Command-line syntax. Parsed arguments are turned into library configs in `cmd/*`.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use virtprof_host::osnoise::Probe;

const EXAMPLES: &str = "\
EXAMPLES:
  virtprof doctor                                  what this host offers, and how to fix the rest
  virtprof testvm --workload pio-user -n 10000     one micro-VM making 10000 userspace PIO exits
  virtprof testvm --workload compute --vms 2 --pin 0 --duration 1s --json
                                                   two VMs fighting for CPU 0, ground truth as JSON
  virtprof testvm --phases compute:200ms,pio-user:10000,io-bound:50
  virtprof stats --pid 1234                        KVM binary stats of any VMM process";

/// The release and the commit it was built from (`build.rs`).
const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (", env!("VIRTPROF_COMMIT"), ")");

/// virtprof: a vertical profiler and monitor for KVM virtual machines.
#[derive(Debug, Parser)]
#[command(name = "virtprof", version = VERSION, about, after_help = EXAMPLES, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Check what this host offers (tracefs, /dev/kvm, kvm tracepoints, perf, RAPL...) and what
    /// each virtprof feature will therefore do.
    Doctor(DoctorArgs),
    /// Run built-in micro-VMs with exactly known behaviour and print their ground truth.
    Testvm(TestvmArgs),
    /// Show the KVM binary statistics of a VMM process (QEMU, Firecracker, virtprof-vm, ...).
    Stats(StatsArgs),
    /// Record kvm, sched, irq and irq_vectors events into a recording file.
    Record(RecordArgs),
    /// Turn a capture made elsewhere (a tracefs dump directory, a trace-cmd trace.dat) into a recording.
    Import(ImportArgs),
    /// VM exits: per reason count, time, min/avg/p50/p99/max, lightweight vs heavyweight.
    Exits(ExitsArgs),
    /// Why is this VM slow: where its vCPU time went, and its losses ranked by cause, each
    /// with its evidence and a fix to try (live, or from a recording).
    Explain(ExplainArgs),
    /// Live per-VM and per-vCPU scheduling QoS (XenMon for KVM): running, waiting, blocked, exits.
    Top(TopArgs),
    /// Serve top's figures to Prometheus (OpenMetrics endpoint), or write them for
    /// node_exporter's textfile collector.
    Serve(ServeArgs),
    /// The `top` table for a recording: whole run, or per --window.
    Sched(SchedArgs),
    /// Summarize a recording: host, VMs, loss, top exits, vCPU accounting, intervals; --html.
    Report(ReportArgs),
    /// Interval recordings side by side (two, or N runs a side): rates with their spread and the
    /// largest correlation changes.
    Compare(CompareArgs),
    /// Export a recording for other tools: csv, Parquet (DuckDB, pandas), Perfetto JSON.
    Export(ExportArgs),
    /// Start a mix of test VMs (contending, I/O-bound, exit-heavy) and watch them in `top`.
    Demo(DemoArgs),
    /// PC-sampling profile of a guest from its first instruction: realms, top symbols, time bins,
    /// sequences, differential profiles (testvm, QEMU gdbstub, or a recording's exits).
    Boot(Box<BootArgs>),
    /// Energy accounting per vCPU and core, and thermal balancing: swap hot and cold vCPUs
    /// between cores (live, --dry-run, --replay a recording; calibrate; bench).
    Balance(Box<BalanceArgs>),
    /// OS noise (osnoise for VMs): gaps a pinned loop sees, attributed to NMI, IRQ, softirq,
    /// thread, and inside a VM to steal and hypervisor; --testvm attributes guest noise to host events.
    Noise(Box<NoiseArgs>),
    /// Run inside a Linux guest: send guest kernel and application counters per interval to a
    /// host's `record --agent` over vsock, virtio-serial or TCP, answering its clock pings.
    Agent(AgentArgs),
    /// Print a shell completion script for virtprof to standard output.
    Completions(CompletionsArgs),
    /// Write virtprof's manual pages (virtprof(1) and one per command) into a folder.
    Manpages(ManpagesArgs),
    /// Internal: the VMM process of one test VM (reads its config on stdin).
    #[command(name = "__vmm", hide = true)]
    Vmm {
        /// The VM's name (only shown on the command line, for discovery).
        #[arg(long)]
        name: Option<String>,
    },
}

#[derive(Debug, Args)]
#[command(after_help = "\
EXAMPLES:
  virtprof completions bash > /etc/bash_completion.d/virtprof
  virtprof completions zsh > /usr/local/share/zsh/site-functions/_virtprof
  virtprof completions fish > ~/.config/fish/completions/virtprof.fish
(The Debian package installs all three.)")]
pub struct CompletionsArgs {
    /// The shell.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

#[derive(Debug, Args)]
#[command(after_help = "\
EXAMPLES:
  virtprof manpages /usr/local/share/man/man1 && man virtprof-explain
  virtprof manpages target/man && man -l target/man/virtprof.1")]
pub struct ManpagesArgs {
    /// The folder to write virtprof.1 and virtprof-COMMAND.1 into (made if missing).
    pub dir: PathBuf,
}

#[derive(Debug, Args)]
#[command(after_help = "\
WHAT IT SENDS, per interval: per-CPU time from /proc/stat (steal included), /proc/schedstat run
and wait, /proc/interrupts per line, page-fault and swap counters from /proc/vmstat, perf software
counters per CPU (--perf; hardware ones where the guest has a vPMU), and every application counter
file (--counters; see docs/agent.md, include/virtprof_counters.h, examples/counters.py). Hosts come
and go; the agent stays.

NOISE: --noise CPUS runs the OS-noise loop of `virtprof noise` on those guest CPUs (on
CLOCK_MONOTONIC, the clock its rows are aligned by) and sends every sample; on the host, `virtprof
noise --host-recording run.vprec` explains each one by the host's trace: the vCPU thread preempted
(steal), a VM exit (hypervisor), a host IRQ, or nothing the host saw (hardware). The loop takes its
CPUs for --noise-runtime of every --noise-period.

TRANSPORTS:
  vsock:PORT       AF_VSOCK (the VMM's vhost-vsock); the host records with --agent vsock:CID:PORT
  serial:NAME      a virtio-serial port (/dev/virtio-ports/NAME, or a path); on the host QEMU has
                   -chardev socket,id=vp,path=SOCK,server=on,wait=off -device virtio-serial
                   -device virtserialport,chardev=vp,name=NAME and records with --agent serial:SOCK
  tcp:ADDR:PORT    only when asked, and only with --token-file (the host gives the same file)

EXAMPLES:
  virtprof agent --listen vsock:9478                            in the guest
  virtprof record -o run.vprec --agent vsock:3:9478 -d 30s      on the host (guest CID 3)
  virtprof agent --listen serial:virtprof --interval 100ms
  virtprof agent --listen tcp:0.0.0.0:9478 --token-file /etc/virtprof.token
  virtprof agent --noise 1 --noise-runtime 900ms                 guest CPU 1's noise, for the host
  virtprof agent --noise 1 --noise-probe cpuid                   each noise sample one CPUID exit
  virtprof agent --marker-port 0xe9                              markers for the host's clock check
  virtprof report run.vprec                                      guest layers beside the host's")]
pub struct AgentArgs {
    /// Where to wait for the host: vsock:PORT, serial:NAME|PATH or tcp:ADDR:PORT.
    #[arg(long, value_name = "ADDR", default_value = "vsock:9478", value_parser = parse_agent_address)]
    pub listen: virtprof_agent::transport::Address,
    /// A file holding the token hosts must present (required with tcp).
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Row width.
    #[arg(short, long, value_name = "TIME[ms|s]", value_parser = duration, default_value = "1s")]
    pub interval: Duration,
    /// Application counter files, or folders of *.counters files (looked at each second).
    #[arg(long, value_name = "PATH", default_value = "/run/virtprof/counters")]
    pub counters: Vec<PathBuf>,
    /// Also count perf software events per CPU (and hardware ones where there is a vPMU).
    #[arg(long)]
    pub perf: bool,
    /// Count these perf events per guest CPU instead (implies --perf), named as `record
    /// --counters` takes them: cycles:u, L1-dcache-load-misses, msr/tsc/, r003c, …; those the
    /// guest cannot count are sent as unavailable with the kernel's reason.
    #[arg(long, value_name = "LIST")]
    pub perf_events: Option<String>,
    /// Serve this many hosts, then exit (default: until stopped).
    #[arg(long, value_name = "N")]
    pub sessions: Option<u32>,
    /// Measure OS noise on these guest CPUs (e.g. 1 or 0-3) and send every sample.
    #[arg(long, value_name = "CPUS", value_parser = cpu_list)]
    pub noise: Option<CpuList>,
    /// With --noise: a step between two clock reads longer than this is a sample.
    #[arg(long, value_name = "TIME[ns|us|ms]", value_parser = duration, default_value = "5us")]
    pub noise_threshold: Duration,
    /// With --noise: the loop's period.
    #[arg(long, value_name = "TIME[ms|s]", value_parser = duration, default_value = "1s")]
    pub noise_period: Duration,
    /// With --noise: the measuring part of each period (default: all of it).
    #[arg(long, value_name = "TIME[ms|s]", value_parser = duration)]
    pub noise_runtime: Option<Duration>,
    /// Each row, write a byte to this x86 I/O port (e.g. 0xe9, one nothing else in the VM
    /// uses) so the host can check the clock alignment against its kvm_pio events (root).
    #[arg(long, value_name = "PORT", value_parser = io_port)]
    pub marker_port: Option<u16>,
    /// With --noise: run this between every two clock reads, so each step is one VM exit
    /// timed from inside: `cpuid` (lightweight under KVM) or `inb:PORT` (an I/O port the VMM
    /// emulates: heavyweight; root).
    #[arg(long, value_name = "cpuid|inb:PORT", value_parser = probe, requires = "noise")]
    pub noise_probe: Option<Probe>,
}

/// A noise-loop probe: `cpuid` or `inb:PORT`.
pub fn probe(s: &str) -> Result<Probe, String> {
    match s.strip_prefix("inb:") {
        _ if s == "cpuid" => Ok(Probe::Cpuid),
        Some(port) => io_port(port).map(Probe::Inb),
        None => Err(format!("'{s}': cpuid, or inb:PORT (e.g. inb:0x3fd)")),
    }
}

/// An I/O port: decimal or 0x hex, 0–65535.
fn io_port(s: &str) -> Result<u16, String> {
    let parsed = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u16::from_str_radix(hex, 16),
        None => s.parse(),
    };
    parsed.map_err(|_| format!("'{s}' is not an I/O port (0-65535, or hex like 0xe9)"))
}

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Print the checks as JSON.
    #[arg(long)]
    pub json: bool,
    /// Skip the live probe that runs a micro-VM to see which kvm events fire.
    #[arg(long)]
    pub no_probe: bool,
    /// Remove tracefs instances left behind by virtprof processes that no longer exist.
    #[arg(long)]
    pub cleanup: bool,
}

#[derive(Debug, Args)]
#[command(after_help = "\
WORKLOADS:
  compute      pure loop, no exits (the baseline)
  pio-user     OUT to a port the VMM handles in userspace: 1 IO exit per iteration
  pio-kernel   OUT to a KVM_IOEVENTFD port: handled in the kernel, 1 ioeventfd signal each
  mmio-user    store to unbacked memory: 1 MMIO exit per iteration
  mmio-kernel  store to a KVM_IOEVENTFD MMIO address: 1 ioeventfd signal each
  io-bound     each request makes the VMM sleep --io-latency (the vCPU blocks like on a disk)
  cpuid        CPUID leaf 0 (a lightweight exit on VMX/SVM; on this project's PVM host none
               reaches KVM: the phase table shows 0 KVM_EXITS and says so)
  fault        UD2: shows how guest faults are reported
  touch        a store to the next page of a 4 MiB buffer (wrapping): no exit once mapped, unless
               --reclaim-hz takes the buffer back, when KVM faults each page in again (x86)
  noise        a TSC gap loop: each gap above --noise-threshold is stored with steal and exit
               counts (seed 004's guest columns; --duration only)
  hlt          HLT, at --cpl 0 only: KVM hands each halt to the VMM (1 HLT exit per iteration)
  rdmsr        RDMSR of IA32_APIC_BASE, at --cpl 0 only: KVM answers it (a lightweight msr exit
               on VMX/SVM)
  phases       a script: --phases compute:200ms,pio-user:10000,io-bound:50
  boot         named functions, each for its --shares of --duration (profiled by virtprof boot)

ON ARM64 HOSTS (no port I/O: markers and io-bound are stores to an MMIO window, so MMIO exits):
  compute, mmio-user, mmio-kernel, io-bound, fault, noise (the virtual counter; steal time from
  KVM's PV time record), phases, and
  hvc          HVC #0 with PSCI_VERSION, at --cpl 0 (EL1) only: KVM's PSCI answers it in the
               kernel (1 lightweight HVC64 exit per iteration; KVM stats fd: hvc_exit_stat)
  wfi          WFI: KVM traps it and the vCPU waits until the VMM raises its IRQ line, about
               1 ms (1 WFx exit per iteration, mostly guest idle; stats fd: wfi_exit_stat)
  sysreg       a read of ID_AA64PFR0_EL1, at --cpl 0 (EL1) only: KVM traps ID registers and
               answers in the kernel (1 lightweight SYS64 exit per iteration)

Guest code runs at CPL3 (arm64: EL0) unless --cpl 0 asks for CPL0 (EL1), where a guest kernel
runs; every workload runs at either, except hlt, rdmsr, hvc and sysreg (privileged: --cpl 0).

Every vCPU also makes one IO exit (arm64: MMIO) per phase start and one when done (markers). Which
operations reach KVM depends on the host: each phase's exits into KVM are read from the vCPU's
KVM stats fd at its markers and printed per phase (JSON: phases[].kvm_exits); an operation that
made none is noted, not reported as missing exits.

EXAMPLES:
  virtprof testvm --workload pio-user --iterations 10000
  virtprof testvm --workload compute --vms 2 --pin 0 --duration 2s
  virtprof testvm --workload io-bound -n 100 --io-latency 2ms --json
  virtprof testvm --workload boot --shares init_mm=61,probe_devices=27,start_user=12 --duration 2s
  virtprof testvm --workload hlt --cpl 0 -n 1000     a guest kernel's HLT: one VMM exit per halt
  virtprof testvm --workload touch --reclaim-hz 50   a balloon's fault storm (stats: pf_fixed)
  virtprof testvm --workload hvc --cpl 0 -n 1000     (arm64) 1000 HVC64 exits answered by KVM")]
pub struct TestvmArgs {
    /// What every vCPU runs.
    #[arg(short, long, value_name = "WORKLOAD", default_value = "compute")]
    pub workload: String,
    /// Phase script for --workload phases: WORKLOAD:COUNT or WORKLOAD:DURATION, comma-separated.
    #[arg(long, value_name = "SCRIPT")]
    pub phases: Option<String>,
    /// For --workload boot: named functions and their weights; each runs for its share of
    /// --duration, in order.
    #[arg(long, value_name = "NAME=WEIGHT,...", default_value = "init_mm=61,probe_devices=27,start_user=12")]
    pub shares: String,
    /// For --workload boot: make these functions K times longer (the seed's ballooning).
    #[arg(long, value_name = "NAME=K,...")]
    pub balloon: Option<String>,
    /// Iterations per vCPU.
    #[arg(short = 'n', long, value_name = "N", conflicts_with = "duration")]
    pub iterations: Option<u64>,
    /// Run time per vCPU instead of a count (default 1s).
    #[arg(short, long, value_name = "TIME[ns|us|ms|s|m]", value_parser = duration)]
    pub duration: Option<Duration>,
    /// vCPUs per VM.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub vcpus: u32,
    /// Number of VMs, each its own VMM process named virtprof-vm.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub vms: u32,
    /// Pin vCPUs to these host CPUs, in order across all VMs, cycling.
    #[arg(long, value_name = "CPULIST", value_parser = cpu_list)]
    pub pin: Option<CpuList>,
    /// How long the VMM sleeps per io-bound request.
    #[arg(long, value_name = "TIME", default_value = "1ms", value_parser = duration)]
    pub io_latency: Duration,
    /// Serve io-bound requests on an I/O thread per VM (named as QEMU names its iothreads),
    /// as a virtio device's queue is served: the vCPU blocks until the thread answers. With a
    /// CPU, the thread is pinned there (`--io-thread 0`); `any` leaves it unpinned.
    #[arg(long, value_name = "CPU|any")]
    pub io_thread: Option<String>,
    /// For --workload touch: take every VM's touch buffers back HZ times a second
    /// (madvise MADV_REMOVE, as a balloon returns guest pages to the host), so KVM faults each
    /// page in again at the guest's next touch: a fault storm of known size.
    #[arg(long, value_name = "HZ", default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=10_000))]
    pub reclaim_hz: u32,
    /// Enable the KVM steal-time record (MSR_KVM_STEAL_TIME) in each vCPU's shared page
    /// (always on for --workload noise).
    #[arg(long)]
    pub steal_time: bool,
    /// For --workload noise: a TSC step longer than this is a noise sample.
    #[arg(long, value_name = "TIME", default_value = "1us", value_parser = duration)]
    pub noise_threshold: Duration,
    /// Kick every vCPU thread this often: each kick is a heavyweight exit (KVM_RUN returns EINTR).
    #[arg(long, value_name = "HZ", default_value_t = 0)]
    pub inject_hz: u32,
    /// Keep the VMs alive this long after their guests finish, so other tools can inspect them.
    #[arg(long, value_name = "TIME", value_parser = duration)]
    pub linger: Option<Duration>,
    /// Name the VMs NAME (one VM) or NAME-0, NAME-1, ... (on their VMM command line, where
    /// `virtprof top` finds it); default: the workload name.
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// Run the guest program at this privilege level: 3 (user, like an application; EL0 on
    /// arm64) or 0 (kernel, like a guest OS; EL1 on arm64; needed by hlt, rdmsr, hvc and sysreg).
    /// PVM hosts interpret every CPL0 instruction, so CPL0 loops run far slower there.
    #[arg(long, value_name = "0|3", default_value_t = 3, value_parser = clap::value_parser!(u8).range(0..=3))]
    pub cpl: u8,
    /// Print the ground truth as one JSON object.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
#[command(after_help = "\
Each VM's vCPU time is split into running, waiting for a CPU, blocked, in exits and in host
interrupts; its lost time (waiting, exit handling other than the guest idling, host interrupts
while it ran, its VMM's I/O threads waiting) is ranked by cause: CPU contention (and who ran
instead), VMM I/O threads starved, exit storms by reason, host interrupts on its CPUs, vCPU
migrations, halt-polling. Each cause gives its share of the lost time, its evidence, what it
rules out and a fix to try. A cause whose events the source lacks is 'cannot tell', with what
to record to tell: never a guess. A VM that loses under 5 % of its vCPU time has nothing to
explain.

EXAMPLES:
  virtprof explain                               record this host for 5 s and explain every VM
  virtprof explain --vm 1234 --duration 10s      one VM, by VMM pid (or its name)
  virtprof explain run.vprec                     a recording (or trace.dat, perf.data, ...)
  virtprof explain run.vprec --json              causes ranked: kind, share, entities, evidence, fix
  virtprof explain run.vprec --html why.html     the same as a page, with each VM's causes over time")]
pub struct ExplainArgs {
    /// A recording or a capture `import` reads; without it, this host is recorded live.
    pub file: Option<PathBuf>,
    #[command(flatten)]
    pub source: SourceArgs,
    /// Only this VM: its VMM's pid, or its name.
    #[arg(long, value_name = "PID|NAME")]
    pub vm: Option<String>,
    /// Live mode: how long to record before explaining.
    #[arg(short, long, value_name = "TIME[ms|s|m]", default_value = "5s", conflicts_with = "file", value_parser = duration)]
    pub duration: Duration,
    /// Print JSON: per VM, the time split and `causes`, ranked.
    #[arg(long)]
    pub json: bool,
    /// Also write a self-contained HTML page: each VM's causes and their timeline.
    #[arg(long, value_name = "OUT")]
    pub html: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct StatsArgs {
    /// The VMM process.
    #[arg(long, value_name = "PID")]
    pub pid: u32,
    /// Print as JSON.
    #[arg(long)]
    pub json: bool,
    /// Show every statistic, not only the non-zero ones.
    #[arg(long)]
    pub all: bool,
}

#[derive(Debug, Args)]
#[command(after_help = "\
EXAMPLES:
  virtprof import /tmp/tracefs-dump -o run.vprec     a directory laid out like /sys/kernel/tracing
  virtprof import trace.dat -o run.vprec             trace-cmd output (v6 or v7; zstd, zlib or none)
  virtprof import tsc.dat --tsc-khz 2893202 -o run.vprec
                                                     a trace.dat in TSC cycles, without TSC2NSEC
  virtprof import perf.data -o run.vprec             perf record -e 'kvm:*' / perf kvm stat record
  virtprof import trace.txt --formats /sys/kernel/tracing -o run.vprec
                                                     ftrace text (timestamps keep microseconds)
  virtprof import host.dat --guest guest.dat -o pair.vprec
                                                     a trace-cmd host+guest pair (record -A) as one
                                                     recording: exits, sched, report and export read
                                                     its guest as with --guest")]
pub struct ImportArgs {
    /// The capture: a tracefs dump directory (events/, per_cpu/cpuN/trace_pipe_raw, saved_cmdlines),
    /// a trace-cmd trace.dat (version 6 or 7), a perf.data with tracepoint samples, or ftrace
    /// text (with --formats).
    pub src: PathBuf,
    /// The recording to write.
    #[arg(short, long, value_name = "FILE")]
    pub output: PathBuf,
    /// The guest's own trace.dat recorded with this host trace (`trace-cmd record -A`): kept in
    /// the recording beside the host's, placed on its clock by the guest's TIME_SHIFT.
    #[arg(long, value_name = "FILE")]
    pub guest: Option<PathBuf>,
    #[command(flatten)]
    pub source: SourceArgs,
}

/// How to read a capture made elsewhere (shared by the commands that open one).
#[derive(Debug, Args)]
pub struct SourceArgs {
    /// For ftrace text: the tracefs root (or a dump) whose events/*/format and
    /// events/header_page describe the traced kernel.
    #[arg(long, value_name = "DIR")]
    pub formats: Option<PathBuf>,
    /// For a trace.dat recorded with the x86-tsc clock and no TSC2NSEC option (its timestamps
    /// are CPU cycles): the traced host's TSC frequency in kHz, e.g. 2893202 for the dmesg line
    /// 'tsc: Refined TSC clocksource calibration: 2893.202 MHz'.
    #[arg(long, value_name = "KHZ", value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub tsc_khz: Option<u64>,
}

impl SourceArgs {
    /// As the session library takes them.
    pub fn options(&self) -> virtprof_session::SourceOptions {
        virtprof_session::SourceOptions { formats: self.formats.clone(), tsc_khz: self.tsc_khz, tsc_scale: None }
    }
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum GroupBy {
    Reason,
    Vcpu,
    Vm,
}

#[derive(Debug, Args)]
#[command(after_help = "\
On hosts with kvm_exit/kvm_entry (VMX, SVM) every exit is timed and split into hypervisor
overhead, VMM time, preempted and blocked. On hosts without them (PVM) heavyweight exits are
timed as userspace round trips and lightweight work is counted from evidence events; the
footer names what is unavailable. A guest operation the host handles below KVM (on this
project's PVM host, a CPL3 CPUID) makes no exit at all: it has no row, and `virtprof doctor`
(GUEST OPERATIONS) and `virtprof testvm` (each phase's KVM_EXITS) say which operations exit.
Lost events are reported per CPU with the time span of the gaps; exits in flight across a gap
are counted as incomplete. HLT exits are the guest idling: marked (guest idle) and totalled
apart from exit-handling time. A file made elsewhere that did not record kvm_userspace_exit or
sched_switch leaves light/heavy or preempted/blocked unknown, never zero. --by vm groups vCPU
threads by process, by the trace.dat's GUEST option, or by their vCPU indexes (GROUPED_BY).

EXAMPLES:
  virtprof exits --duration 10s                  live: record 10 s of this host, then analyse
  virtprof exits --duration 60s --bpf            live, counted in the kernel: no event decoded
  virtprof exits --duration 10s --kernel-hist    live, with the kernel's own hist triggers timing
                                                 the same exits: checked bucket by bucket
  virtprof exits run.vprec                       per reason
  virtprof exits trace.dat                       a trace-cmd capture (v6/v7, any compression)
  virtprof exits perf.data                       perf record -e 'kvm:*' or perf kvm stat record
  virtprof exits run.vprec --by vcpu --json
  virtprof exits run.vprec --threshold-us 50     every exit over 50 us, with what ran meanwhile
  virtprof exits run.vprec --noise --csv         one vm_noise row per exit
  virtprof exits host.dat --guest guest.dat --threshold-us 1000
                                                 a trace-cmd host+guest pair: the guest's last
                                                 events before each exit over 1 ms, on the host's
                                                 clock")]
pub struct ExitsArgs {
    /// A recording (`virtprof record`/`import`), or a capture `import` reads: trace.dat,
    /// perf.data, tracefs dump, ftrace text (with --formats). Without it, record live.
    pub file: Option<PathBuf>,
    #[command(flatten)]
    pub source: SourceArgs,
    /// Live mode: how long to record before analysing.
    #[arg(short, long, value_name = "TIME[ms|s|m]", default_value = "5s", conflicts_with = "file", value_parser = duration)]
    pub duration: Duration,
    /// Only the VM whose VMM has this pid (repeatable).
    #[arg(long, value_name = "PID")]
    pub vm: Vec<u32>,
    /// Only this vCPU index (from the vCPU thread names).
    #[arg(long, value_name = "N")]
    pub vcpu: Option<u32>,
    /// Group the table by exit reason, vCPU thread or VM.
    #[arg(long, value_enum, default_value = "reason")]
    pub by: GroupBy,
    /// One row per exit (seed 004's vm_noise): cpus, duration, reason, overhead, interference.
    #[arg(long)]
    pub noise: bool,
    /// Only exits longer than this many microseconds (implies per-exit rows).
    #[arg(long, value_name = "US")]
    pub threshold_us: Option<f64>,
    /// The guest's own trace, recorded with the host's (`trace-cmd record -A`): each exit row
    /// shows what the guest did just before it (placed by the file's TIME_SHIFT).
    #[arg(long, value_name = "GUEST.dat", requires = "file")]
    pub guest: Option<PathBuf>,
    /// Live mode: count in the kernel (eBPF) instead of tracing: exits per reason and their
    /// durations with no event handed to user space; the per-reason light/heavy split,
    /// descheduling and per-exit rows are then unknown.
    #[arg(long, conflicts_with_all = ["file", "noise", "threshold_us"])]
    pub bpf: bool,
    /// Live mode: also have the kernel's hist triggers time every exit (kvm_exit to kvm_entry)
    /// on the trace's own timestamps, and set their histograms beside the traced ones: equal
    /// bucket by bucket where the trace lost nothing. Needs CONFIG_HIST_TRIGGERS and a VMX or
    /// SVM host (`virtprof doctor` says whether this one has them).
    #[arg(long, conflicts_with_all = ["file", "bpf", "vm", "vcpu"])]
    pub kernel_hist: bool,
    /// Print JSON (schema in docs/exits.md).
    #[arg(long, conflicts_with = "csv")]
    pub json: bool,
    /// Print the table as CSV.
    #[arg(long)]
    pub csv: bool,
}

#[derive(Debug, Args)]
#[command(after_help = "\
Per vCPU thread, from sched_switch/sched_wakeup and the kvm events: RUN% (on a CPU), WAIT%
(runnable, waiting: host-side steal), BLK% (sleeping, e.g. on I/O or halt), executions, CPU and
wait per execution, blocked time per I/O, allocation (executions ended by preemption), I/O
count, exits/s with top reasons. Per VM: vCPU shares averaged, counts summed. Counted in the
kernel by an eBPF program on the sched and kvm tracepoints (mode kernel; `virtprof doctor` says
whether it loads here); with --trace, or where it does not load, decoded from a private tracefs
instance (mode trace); without tracefs (or with --no-trace) it polls schedstat and KVM stats
instead and says so.

KEYS: q quit  c cycle physical CPU  s sort  f filter  v VM/vCPU rows  w 1 s/10 s window
      p pause  ? help

EXAMPLES:
  virtprof top                              every VM on this host
  virtprof top -d 2 --vm 4242               one VMM, refresh every 2 s
  virtprof top --once --json                sample 1 s, print the JSON (schema: docs/top.md)
  virtprof top --log qos.csv                also append CSV rows per VM and vCPU per refresh
  virtprof top --once --trace               the same, every traced event decoded here")]
pub struct TopArgs {
    #[command(flatten)]
    pub watch: WatchArgs,
    /// Only the VM whose VMM has this pid (repeatable).
    #[arg(long, value_name = "PID")]
    pub vm: Vec<u32>,
    /// Append CSV rows (one per VM and vCPU per refresh) to FILE.
    #[arg(long, value_name = "FILE")]
    pub log: Option<PathBuf>,
    /// Also show a guest from inside (`virtprof agent` in it): vsock:CID:PORT, serial:PATH
    /// or tcp:HOST:PORT; repeat for more guests.
    #[arg(long, value_name = "ADDR", value_parser = parse_agent_address)]
    pub agent: Vec<virtprof_agent::transport::Address>,
    /// The agents' token file (tcp agents need one).
    #[arg(long, value_name = "FILE")]
    pub agent_token_file: Option<PathBuf>,
}

#[derive(Debug, Args)]
#[command(after_help = "\
WHAT IT SERVES: per VM and vCPU, run / wait (steal) / blocked seconds, executions, I/O accesses
and exits (virtprof_vcpu_*_total, with vm, vmm, pid and vcpu labels), traced exits by reason, an
exit-duration histogram, the VMM's own CPU time outside the vCPUs, virtprof_vm_info (uuid, libvirt
domain, pod, container), per-core energy, power and temperature estimates, and its own lost events
and collection time. Counters start when serve starts; figures come from the same sampler as `top`
(counted in the kernel by eBPF where it loads; with --trace every traced event decoded here),
refreshed every second and at each scrape. See docs/fleet.md for every metric, the scrape config and
the Grafana dashboard.

ACCESS: loopback only by default. Listening elsewhere needs --token-file (clients send
`Authorization: Bearer TOKEN`); add --tls-cert/--tls-key to keep the token off the wire. Read-only:
GET or HEAD /metrics; anything else gets 4xx.

COST: a scrape answers every request made up to --max-age after it started (requests that wait
together share one), each connection is answered at most --client-rate times a second and each
address opens at most that many connections a second (429 past it): no client, however fast it
asks, makes serve scrape more than once per --max-age.

EXAMPLES:
  virtprof serve                                   # http://127.0.0.1:9477/metrics
  virtprof serve --max-age 0                       # every request scrapes (shared when concurrent)
  virtprof serve --listen 0.0.0.0:9477 --token-file /etc/virtprof/token \\
      --tls-cert /etc/virtprof/cert.pem --tls-key /etc/virtprof/key.pem
  virtprof serve --textfile /var/lib/prometheus/node-exporter --interval 15s
  curl -s localhost:9477/metrics | grep virtprof_vcpu_wait")]
pub struct ServeArgs {
    /// Address to listen on (host:port).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9477")]
    pub listen: String,
    /// File holding the bearer token clients must send (required off loopback).
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Serve HTTPS with this PEM certificate (chain).
    #[arg(long, value_name = "PEM", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Instead of listening, write DIR/virtprof.prom every --interval (node_exporter's
    /// textfile collector), replaced whole each time.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["listen", "token_file", "tls_cert"])]
    pub textfile: Option<PathBuf>,
    /// With --textfile: how often the file is rewritten.
    #[arg(long, value_name = "TIME[ms|s]", value_parser = duration, default_value = "15s", requires = "textfile")]
    pub interval: std::time::Duration,
    /// Stop after this long (default: until interrupted).
    #[arg(short, long, value_name = "TIME[ms|s|m]", value_parser = duration)]
    pub duration: Option<std::time::Duration>,
    /// Answer a scrape from one that started at most this long before it was asked for (0:
    /// every request scrapes anew; requests that wait together still share one). Bounds
    /// serve's CPU whatever the request rate.
    #[arg(long, value_name = "TIME[ms|s]", value_parser = duration, default_value = "1s")]
    pub max_age: std::time::Duration,
    /// Answers per second to one client connection (faster requests wait), and new
    /// connections per second from one address (twice as many at once; more are answered 429
    /// Too Many Requests); 0: no limit.
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub client_rate: u32,
    /// Only the VM whose VMM has this pid (repeatable).
    #[arg(long, value_name = "PID")]
    pub vm: Vec<u32>,
    /// Do not trace: poll schedstat and KVM stats (no reasons, durations or I/O from the trace).
    #[arg(long, conflicts_with_all = ["bpf", "trace"])]
    pub no_trace: bool,
    /// Decode every traced event here instead of counting in the kernel (eBPF): exact exit
    /// durations from the ring buffer's timestamps, at several times the CPU (docs/fleet.md).
    #[arg(long, conflicts_with = "bpf")]
    pub trace: bool,
    /// Count in the kernel (eBPF), falling back to --trace where the program does not load:
    /// the default.
    #[arg(long)]
    pub bpf: bool,
}

/// How `top` and `demo` watch.
#[derive(Debug, Args)]
pub struct WatchArgs {
    /// Refresh interval in seconds (with --once: the sampling time).
    #[arg(short = 'd', long = "delay", value_name = "SECONDS", default_value_t = 1.0)]
    pub delay: f64,
    /// Sample for one refresh interval, print one table (or --json) to stdout, and exit.
    #[arg(long)]
    pub once: bool,
    /// With --once: print JSON.
    #[arg(long, requires = "once")]
    pub json: bool,
    /// Do not trace: poll schedstat and KVM stats (approximate; what `top` does without tracefs).
    #[arg(long, conflicts_with_all = ["bpf", "trace"])]
    pub no_trace: bool,
    /// Decode every traced event here instead of counting in the kernel (eBPF): the same
    /// figures at several times the CPU (docs/top.md#modes).
    #[arg(long, conflicts_with = "bpf")]
    pub trace: bool,
    /// Count in the kernel (eBPF), falling back to --trace where the program does not load:
    /// the default.
    #[arg(long)]
    pub bpf: bool,
}

#[derive(Debug, Args)]
#[command(after_help = "\
Any recording or capture `import` reads: host, VMs, duration, lost events, the top exits with
durations, and run/wait/blocked per vCPU. Recordings made with `record --interval D` add the
interval analyses: per-metric totals and rates, phases, and the most correlated metrics.
`--html` writes one self-contained page (works offline): exit latency histograms, run/wait/
blocked over time per vCPU, per-metric timelines, the correlation heatmap and the phases.

EXAMPLES:
  virtprof record -o run.vprec --interval 10ms -- \\
      virtprof testvm -w phases --phases compute:1s,pio-user:20000
  virtprof report run.vprec
  virtprof report run.vprec --html run.html
  virtprof report run.vprec --json --top 20 --spearman
  virtprof report host.dat --guest guest.dat   a trace-cmd host+guest pair: the guest's CPUs too")]
pub struct ReportArgs {
    /// The recording (or a trace.dat, tracefs dump, ...).
    pub file: PathBuf,
    /// The guest's own trace recorded with this host trace (`trace-cmd record -A`): per guest
    /// CPU its busy and idle time, longest tasks and interrupts, beside the host thread running
    /// it. A recording `import --guest` made holds it already.
    #[arg(long, value_name = "FILE")]
    pub guest: Option<PathBuf>,
    /// Print JSON (the same data the HTML page draws).
    #[arg(long)]
    pub json: bool,
    /// Write a self-contained HTML report to OUT.
    #[arg(long, value_name = "OUT")]
    pub html: Option<PathBuf>,
    /// Exit reasons to list.
    #[arg(long, default_value_t = 10)]
    pub top_exits: usize,
    /// Correlated pairs to list.
    #[arg(long, default_value_t = 10)]
    pub top: usize,
    /// Rank (Spearman) instead of linear (Pearson) correlation.
    #[arg(long)]
    pub spearman: bool,
}

#[derive(Debug, Args)]
#[command(after_help = "\
Formats:
  csv       the interval table (`record --interval` recordings), one row per interval; columns
            are `ENTITY METRIC` (`cpu0 stat.steal_ns`, `vm1234 kvm.exits`,
            `vm1234/vcpu0 trace.userspace_exit.KVM_EXIT_IO`); empty cells are unknown, not zero.
  parquet   a directory (-o, required) with events.parquet (every trace event), exits.parquet
            (one row per timed exit) and, with interval rows, intervals.parquet (long form).
  perfetto  Chrome/Perfetto JSON trace: per VM a process, per vCPU a state track (running /
            waiting / blocked) and an exit track (a slice per timed exit), counter tracks per VM
            from interval rows; with --guest, the guest's own trace as a second machine (a track
            per guest CPU: its tasks and interrupts, on the host's clock). Open it in
            https://ui.perfetto.dev or chrome://tracing.
Schemas: docs/export.md.

EXAMPLES:
  virtprof export run.vprec --format csv -o run.csv
  virtprof export run.vprec --format parquet -o run.parquet/
  duckdb -c \"SELECT reason, count(*), median(duration_ns)
             FROM 'run.parquet/exits.parquet' GROUP BY 1\"
  virtprof export run.vprec --format perfetto -o run.json
  virtprof export host.dat --format perfetto --guest guest.dat -o pair.json")]
pub struct ExportArgs {
    /// The recording (or a trace.dat, tracefs dump, ...).
    pub file: PathBuf,
    /// Output format.
    #[arg(long, value_enum, default_value_t = ExportFormat::Csv)]
    pub format: ExportFormat,
    /// Output file (csv, perfetto; default: standard output) or directory (parquet).
    #[arg(short, long, value_name = "PATH")]
    pub output: Option<PathBuf>,
    /// With --format perfetto: a guest's own trace recorded with this host trace
    /// (`trace-cmd record -A`), drawn as a second machine on the same timeline.
    #[arg(long, value_name = "GUEST.dat")]
    pub guest: Option<PathBuf>,
    /// With --format parquet: add the recording's tables to the Hive-partitioned dataset in DIR
    /// (TABLE/host=H/date=D/recording=R/TABLE.parquet) that DuckDB, Spark or Trino read as
    /// one table per TABLE over every host. See docs/fleet.md.
    #[arg(long, value_name = "DIR", conflicts_with = "output")]
    pub dataset: Option<PathBuf>,
    /// With --dataset: the host partition (default: the host name the recording kept).
    #[arg(long, value_name = "NAME", requires = "dataset")]
    pub host: Option<String>,
    /// With --dataset: the date partition (default: the UTC day the recording started).
    #[arg(long, value_name = "YYYY-MM-DD", requires = "dataset")]
    pub date: Option<String>,
}

/// `export --format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ExportFormat {
    Csv,
    Parquet,
    Perfetto,
}

#[derive(Debug, Args)]
#[command(after_help = "\
Every recording needs interval rows (`virtprof record --interval D`). Metrics are summed over all
vCPUs and CPUs, so runs with different VMs compare (native vs virtualized, before vs after). With
several runs a side, each figure is the mean over the runs that have it, with its spread (sample
standard deviation); a correlation change larger than both sides' spreads together is marked
`beyond spread`. A metric one side lacks is unknown there (-), never 0.

EXAMPLES:
  virtprof compare compute.vprec pio.vprec
  virtprof compare a.vprec b.vprec --top 20 --json
  virtprof compare native-1.vprec native-2.vprec native-3.vprec \\
      --vs vm-1.vprec vm-2.vprec vm-3.vprec
  virtprof compare native-*.vprec --vs vm-*.vprec --matrix --json   the whole difference matrix
  virtprof compare native-*.vprec --vs vm-*.vprec --html compare.html")]
pub struct CompareArgs {
    /// Side A: one recording, or several runs of it (with --vs); without --vs, exactly two
    /// recordings A B.
    #[arg(required = true, value_name = "A")]
    pub runs: Vec<PathBuf>,
    /// Side B's runs (side A's are the recordings before it).
    #[arg(long, num_args = 1.., value_name = "B")]
    pub vs: Vec<PathBuf>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// Correlation changes to list.
    #[arg(long, default_value_t = 15)]
    pub top: usize,
    /// Rank (Spearman) instead of linear (Pearson) correlation.
    #[arg(long)]
    pub spearman: bool,
    /// With --json: both sides' mean correlation matrices and their difference (B − A), whole,
    /// and each run's exit rate over time.
    #[arg(long)]
    pub matrix: bool,
    /// Write one self-contained page: runs, rates with their spread, the largest changes, each
    /// run's exit rate over time, and both sides' mean matrices and their difference as heatmaps.
    #[arg(long, value_name = "OUT")]
    pub html: Option<PathBuf>,
}

#[derive(Debug, Args)]
#[command(after_help = "\
EXAMPLES:
  virtprof sched run.vprec                  whole run, per VM and vCPU
  virtprof sched run.vprec --window 1s      one table per second of the recording
  virtprof sched run.vprec --cpu 0          only time on physical CPU 0
  virtprof sched run.vprec --json           schema: docs/top.md (same as top --once --json)
  virtprof sched host.dat --guest guest.dat a trace-cmd host+guest pair: each guest CPU's busy
                                            and idle time beside its vCPU thread's run/wait/blocked")]
pub struct SchedArgs {
    /// A recording (`virtprof record`/`import`) or a capture `import` reads.
    pub file: PathBuf,
    /// The guest's own trace recorded with this host trace (`trace-cmd record -A`): per guest
    /// CPU its busy and idle time, longest tasks and interrupts, beside the host thread running
    /// it. A recording `import --guest` made holds it already.
    #[arg(long, value_name = "FILE")]
    pub guest: Option<PathBuf>,
    #[command(flatten)]
    pub source: SourceArgs,
    /// Also a table per consecutive window of this length.
    #[arg(long, value_name = "TIME[ms|s|m]", value_parser = duration)]
    pub window: Option<Duration>,
    /// Only the VM whose VMM has this pid (repeatable).
    #[arg(long, value_name = "PID")]
    pub vm: Vec<u32>,
    /// Only time on this physical CPU (XenMon's per-CPU view).
    #[arg(long, value_name = "N")]
    pub cpu: Option<u32>,
    /// Print JSON.
    #[arg(long, conflicts_with = "csv")]
    pub json: bool,
    /// Print CSV rows (one per VM and vCPU per window).
    #[arg(long)]
    pub csv: bool,
}

#[derive(Debug, Args)]
#[command(after_help = "\
Starts four test VMs (virtprof testvm): two compute VMs pinned to the same CPU (each should get
about half of it and wait the other half), an io-bound VM (mostly blocked), and an exit-heavy VM
(port I/O to the VMM), then opens `virtprof top` on them. The VMs are stopped on exit.

EXAMPLES:
  virtprof demo                        interactive (q to quit)
  virtprof demo --once --duration 3s   run 3 s, print the table once, exit
  virtprof demo --once --json          the same as JSON")]
pub struct DemoArgs {
    /// How long the VMs run (the demo ends then; interactive mode also ends on q).
    #[arg(long, value_name = "TIME[s|m]", default_value = "10m", value_parser = duration)]
    pub duration: Duration,
    #[command(flatten)]
    pub watch: WatchArgs,
}

#[derive(Debug, Args)]
#[command(after_help = "\
Records until --duration ends, the COMMAND exits, or Ctrl-C. Reads raw ring-buffer pages from a
private tracefs instance (removed on exit); per-CPU loss is always reported.

EXAMPLES:
  virtprof record -o run.vprec --duration 10s
  virtprof record -o run.vprec -- virtprof testvm --workload pio-user -n 10000
  virtprof record -o run.vprec --events kvm,sched:sched_switch --buffer-size 16384
  virtprof record -o run.vprec --interval 10ms -- \\
      virtprof testvm -w phases --phases compute:200ms,pio-user:5000

With --interval, every source (per-CPU /proc/stat, per-vCPU schedstat, KVM stats, perf
counters, testvm application counters) is also sampled once per interval; see `virtprof report`
and `virtprof export`.")]
pub struct RecordArgs {
    /// The recording to write.
    #[arg(short, long, value_name = "FILE")]
    pub output: PathBuf,
    /// Events: systems or system:event, comma-separated [default: kvm, sched switch/wakeup/migrate, irq, irq_vectors].
    #[arg(long, value_name = "SET")]
    pub events: Option<String>,
    /// Stop after this long.
    #[arg(short, long, value_name = "TIME[ms|s|m]", value_parser = duration)]
    pub duration: Option<Duration>,
    /// Per-CPU ring buffer size (4 to 1048576; all CPUs' within half the free memory)
    /// [default: 4 s of the busiest CPU's event rate, measured for 0.1 s before the recording
    /// starts; at least 8192].
    #[arg(long = "buffer-size", value_name = "KB")]
    pub buffer_size_kb: Option<u32>,
    /// Trace clock, one counting nanoseconds: local, global, perf, mono, mono_raw, boot, tai
    /// (mono aligns with CLOCK_MONOTONIC, as testvm reports).
    #[arg(long, value_name = "CLOCK", default_value = virtprof_engine::recorder::DEFAULT_CLOCK)]
    pub clock: String,
    /// VMM processes to snapshot KVM stats of at start and end (every VMM already running
    /// is included anyway; this makes a missing one an error).
    #[arg(long, value_name = "PID")]
    pub vm: Vec<u32>,
    /// Keep no KVM stats snapshots: figures that need them (lightweight exits on a host that
    /// never emits kvm_exit, the stats cross-check) are then unknown. Without it, each VM's
    /// stats fds are held from when it is found, so a VM that ends during the recording
    /// still gives its final counts (its counters outlive its VMM until the recording ends).
    #[arg(long, conflicts_with = "vm")]
    pub no_kvm_stats: bool,
    /// Also have the kernel's hist triggers time every exit (kvm_exit to kvm_entry) on the
    /// trace's own timestamps, kept in the recording: `virtprof exits FILE` sets them beside
    /// the traced histograms. Needs CONFIG_HIST_TRIGGERS and a VMX or SVM host.
    #[arg(long)]
    pub kernel_hist: bool,
    /// Also sample counters every interval (down to 1ms): per CPU, per VM and per vCPU.
    #[arg(long, value_name = "TIME[us|ms|s]", value_parser = duration)]
    pub interval: Option<Duration>,
    /// With --interval: the counters to sample per vCPU thread and per CPU, instead of the
    /// built-in set, named as `perf stat -e` takes them: hardware (cycles, instructions,
    /// cache-misses, …), software (task-clock, page-faults, …), cache (L1-dcache-load-misses),
    /// tracepoints (kvm:kvm_exit), raw codes (r003c) and sysfs PMU events (msr/tsc/,
    /// cpu/event=0x3c,umask=0/), with modifiers :u :k :h :G :H; `default` adds the built-in
    /// set. Tracepoints are counted per vCPU thread (the trace has them per CPU). Those over --hw-counters take turns and are scaled (their share in `.mux` series);
    /// one this host cannot count is reported with the kernel's reason, the rest kept.
    #[arg(long, value_name = "LIST", requires = "interval")]
    pub counters: Option<String>,
    /// Hardware counters the PMU runs at once; more hardware events rotate over sub-intervals.
    #[arg(long, value_name = "N", default_value_t = virtprof_engine::recorder::DEFAULT_HW_COUNTERS)]
    pub hw_counters: usize,
    /// Also record a guest agent (`virtprof agent` inside a guest): vsock:CID:PORT,
    /// serial:PATH (QEMU's `-chardev socket,path=PATH` of a virtserialport) or tcp:HOST:PORT.
    /// Repeat for more guests; its rows are placed on this recording's clock.
    #[arg(long, value_name = "ADDR", value_parser = parse_agent_address)]
    pub agent: Vec<virtprof_agent::transport::Address>,
    /// The token the agents were started with (`agent --token-file`); tcp agents need one.
    #[arg(long, value_name = "FILE")]
    pub agent_token_file: Option<PathBuf>,
    /// The most each agent's guest may add to the recording, in MiB (rows, noise, schemas);
    /// past it the rest is dropped and recorded as a gap. A guest is untrusted: this keeps a
    /// compromised one from filling the host's disk.
    #[arg(long, value_name = "MIB", default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    pub agent_max_mib: u64,
    /// How long to wait for every agent to answer before the trace starts (0: start at once);
    /// one that has not answered by then is recorded from when it does, the time before
    /// marked as a gap.
    #[arg(long, value_name = "TIME[ms|s]", default_value = "10s", value_parser = duration)]
    pub agent_wait: Duration,
    /// Run this command and record until it exits. A signal that stops the recording (or
    /// --duration running out) is passed on to it; it is killed 2 s later if still running.
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

fn parse_agent_address(s: &str) -> Result<virtprof_agent::transport::Address, String> {
    s.parse()
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn the_command_line_definition_is_consistent() {
        // Catches clashing short flags and the like, which release builds would not.
        super::Cli::command().debug_assert();
    }

    #[test]
    fn help_texts_fit_the_width_clap_wraps_at() {
        // clap re-wraps a line longer than 100 columns wherever it falls, breaking examples
        // and sentences mid-way (`agent --help` did): ours are laid out to fit.
        fn check(cmd: &clap::Command, path: &str) {
            for text in [cmd.get_after_help(), cmd.get_after_long_help()].into_iter().flatten() {
                for line in text.to_string().lines() {
                    assert!(line.chars().count() <= 100, "{path}: {} columns: {line}", line.chars().count());
                }
            }
            for sub in cmd.get_subcommands() {
                check(sub, &format!("{path} {}", sub.get_name()));
            }
        }
        check(&super::Cli::command(), "virtprof");
    }
}

#[derive(Debug, Args)]
#[command(after_help = "\
SOURCES (one):
  --testvm             the testvm `boot` workload; the micro-VMM kicks each vCPU at --rate and reads
                       RIP and CPL (samples landing while the VMM handles an exit: hypervisor realm)
  --qemu -- ARGS       start QEMU halted with a gdbstub, sample from its first instruction until
                       --until REGEX shows on its console (give -nographic or -serial stdio),
                       --duration, or QEMU exits; works for TCG and KVM guests
  --gdb HOST:PORT      attach to a gdbstub already listening (QEMU -gdb tcp::1234, or a socket path)
  --recording FILE     a recording's kvm_exit/kvm_entry timeline sampled at --rate: time in exits is
                       the hypervisor realm (measured); guest time takes the rip of the exit that
                       ended it
  --load FILE          a profile saved earlier with --save

Realms: hypervisor (the VMM handles an exit), firmware (CPL0 below the kernel half: BIOS, boot
loader, decompressor), kernel (CPL0 in the upper half), user (CPL3).

EXAMPLES:
  virtprof boot --testvm --shares init_mm=61,probe_devices=27,start_user=12 --duration 2s
  virtprof boot --testvm --balloon probe_devices=8 --save ballooned.json --compare control.json
  virtprof boot --qemu --system-map /boot/System.map-6.1.0-28-amd64 --until 'Run /init' -- \\
      -accel tcg -kernel /boot/vmlinuz-6.1.0-28-amd64 -initrd initrd.img \\
      -append 'console=ttyS0' -nographic
  virtprof boot --recording l2.vprec --system-map System.map --rate 10000   the hypervisor's share
  virtprof boot --load run.json --symbol do_one_initcall --bin 100ms --html boot.html
  virtprof boot --load run.json --folded | flamegraph.pl > boot.svg")]
pub struct BootArgs {
    /// Sample the testvm `boot` workload in a micro-VM.
    #[arg(long, group = "source")]
    pub testvm: bool,
    /// Start QEMU with the arguments after `--` and sample it through its gdbstub.
    #[arg(long, group = "source", requires = "qemu_args")]
    pub qemu: bool,
    /// Attach to a running gdbstub: HOST:PORT or a Unix socket path.
    #[arg(long, value_name = "HOST:PORT", group = "source")]
    pub gdb: Option<String>,
    /// Sample a recording's kvm_exit/kvm_entry timeline (hypervisor time measured).
    #[arg(long, value_name = "FILE", group = "source")]
    pub recording: Option<PathBuf>,
    /// Analyse a profile saved with --save.
    #[arg(long, value_name = "FILE", group = "source")]
    pub load: Option<PathBuf>,
    /// Samples per second per vCPU (1 to 100000).
    #[arg(long, value_name = "HZ", default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub rate: u32,
    /// Stop when a console line matches this regular expression (--qemu).
    #[arg(long, value_name = "REGEX", value_parser = regex)]
    pub until: Option<regex::Regex>,
    /// --testvm: the workload's run time before ballooning (default 1s); --qemu/--gdb: stop
    /// sampling after this long.
    #[arg(short, long, value_name = "TIME", value_parser = duration)]
    pub duration: Option<Duration>,
    /// --testvm: named functions and their weights.
    #[arg(long, value_name = "NAME=WEIGHT,...", default_value = "init_mm=61,probe_devices=27,start_user=12")]
    pub shares: String,
    /// --testvm: make these functions K times longer (the seed's ballooning).
    #[arg(long, value_name = "NAME=K,...")]
    pub balloon: Option<String>,
    /// --testvm: vCPUs.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub vcpus: u32,
    /// Kernel symbols from a System.map.
    #[arg(long, value_name = "FILE", group = "kernel_symbols")]
    pub system_map: Option<PathBuf>,
    /// Kernel symbols from /proc/kallsyms text (read as root).
    #[arg(long, value_name = "FILE", group = "kernel_symbols")]
    pub kallsyms: Option<PathBuf>,
    /// Kernel symbols from an ELF vmlinux.
    #[arg(long, value_name = "FILE", group = "kernel_symbols")]
    pub vmlinux: Option<PathBuf>,
    /// User-realm symbols (System.map form or ELF); --testvm uses its own program's map.
    #[arg(long, value_name = "FILE")]
    pub user_symbols: Option<PathBuf>,
    /// KASLR offset of the kernel in hex, or `auto` (find linux_banner in guest memory; --qemu
    /// and --gdb only; 0 elsewhere).
    #[arg(long, value_name = "HEX|auto", default_value = "auto", value_parser = kaslr)]
    pub kaslr: Kaslr,
    /// Time-bin width for the realm split and timelines (default: about 50 bins).
    #[arg(long, value_name = "TIME", value_parser = duration)]
    pub bin: Option<Duration>,
    /// Show this symbol's profile over time (repeatable).
    #[arg(long = "symbol", value_name = "NAME")]
    pub symbols: Vec<String>,
    /// Rows of the top-symbol table.
    #[arg(long, value_name = "N", default_value_t = 20)]
    pub top: usize,
    /// Differential profile against a profile saved with --save: share and rank changes.
    #[arg(long, value_name = "FILE")]
    pub compare: Option<PathBuf>,
    /// Save the labelled samples (for --load and --compare).
    #[arg(long, value_name = "FILE")]
    pub save: Option<PathBuf>,
    /// Print JSON (schema: docs/boot.md).
    #[arg(long, group = "format")]
    pub json: bool,
    /// Print the symbol table as CSV.
    #[arg(long, group = "format")]
    pub csv: bool,
    /// Print `realm;symbol count` lines for flame-graph tools.
    #[arg(long, group = "format")]
    pub folded: bool,
    /// Write charts (realm stacked area over time, top symbols, per-symbol timelines) to OUT.
    #[arg(long, value_name = "OUT")]
    pub html: Option<PathBuf>,
    /// --qemu: copy the guest console to this file.
    #[arg(long, value_name = "FILE")]
    pub console: Option<PathBuf>,
    /// QEMU's own arguments (after `--`).
    #[arg(last = true, value_name = "QEMU ARGS")]
    pub qemu_args: Vec<String>,
}

#[derive(Debug, Args)]
#[command(
    args_conflicts_with_subcommands = true,
    after_help = "\
Every --period, each vCPU's energy is active power x its run time + the weighted sum of its
events (exits, emulated instructions, context switches, page faults...; weights: --weights FILE,
defaults: `virtprof balance weights`). A core's energy is the sum over its vCPUs. The policy is
seed 002's seven cases with threshold --k, pairing the hottest core of the last period with the
coldest; a swap exchanges the CPU affinity of their vCPU threads. Threads get their original
affinity back on exit.

EXAMPLES:
  virtprof balance --vm 4242 --vm 4243 --duration 30s     balance two VMs' vCPUs over all CPUs
  virtprof balance --dry-run --json                       decisions only, nothing moves
  virtprof balance --vm 4242 --force-hz 100 --verify      swap 100x/s and check the sched trace
  virtprof balance --vm 4242 --verify --buffer-size 16384  more trace buffer if --verify lost events
  virtprof balance --replay run.vpr --k 1.2 --html gap.html
  virtprof balance bench --html bench.html                seed 002's overhead table and gap plot
  virtprof balance calibrate --input meter.csv -o weights.toml"
)]
pub struct BalanceArgs {
    #[command(subcommand)]
    pub action: Option<BalanceAction>,
    /// Balance the vCPUs of this VMM process, KVM or QEMU TCG (repeatable; default: every
    /// KVM VM found).
    #[arg(long, value_name = "PID")]
    pub vm: Vec<u32>,
    /// Host CPUs to balance over (default: every online CPU).
    #[arg(long, value_name = "LIST", value_parser = cpu_list)]
    pub cpus: Option<CpuList>,
    /// Accounting and decision period.
    #[arg(long, value_name = "TIME", default_value = "100ms", value_parser = duration)]
    pub period: Duration,
    /// Threshold k > 1: swap only when the hotter core used more than k times the energy.
    #[arg(long, value_name = "K", default_value_t = 1.2)]
    pub k: f64,
    /// Energy weights and thermal parameters (TOML).
    #[arg(long, value_name = "FILE")]
    pub weights: Option<PathBuf>,
    /// Stop after this long (default: until Ctrl-C or the VMs exit).
    #[arg(short, long, value_name = "TIME", value_parser = duration)]
    pub duration: Option<Duration>,
    /// Decide and account, but move no thread.
    #[arg(long)]
    pub dry_run: bool,
    /// Simulate on a recording's interval rows: energy gap with and without the policy.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["vm", "dry_run", "force_hz", "verify"])]
    pub replay: Option<PathBuf>,
    /// --replay: cores to simulate, 1 to 1024 (default: one per vCPU).
    #[arg(long, value_name = "N", requires = "replay", value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub cores: Option<u16>,
    /// Swap core pairs this often instead of following the policy (the overhead experiment;
    /// 0 places the vCPUs one a core and keeps them there: its baseline).
    #[arg(long, value_name = "HZ")]
    pub force_hz: Option<f64>,
    /// Trace sched_switch and check that every moved thread runs on its new core.
    #[arg(long)]
    pub verify: bool,
    /// --verify: per-CPU ring buffer of the sched trace, in KiB (raise it if events are lost).
    #[arg(long = "buffer-size", value_name = "KB", default_value_t = 4096, requires = "verify",
          value_parser = clap::value_parser!(u32).range(4..=1_048_576))]
    pub buffer_size_kb: u32,
    /// Print JSON (schema: docs/balance.md).
    #[arg(long)]
    pub json: bool,
    /// Write charts (per-core energy gap and temperature over time) to OUT.
    #[arg(long, value_name = "OUT")]
    pub html: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum BalanceAction {
    /// Print the default model file (energy weights, thermal parameters) with its documentation.
    Weights,
    /// Fit the energy weights by least squares to measured energy.
    Calibrate(CalibrateArgs),
    /// Seed 002's experiments on test VMs: forced-swap overhead, and the policy's energy gap.
    Bench(BalanceBenchArgs),
}

#[derive(Debug, Args)]
#[command(after_help = "\
--input CSV: a header `run_ns,METRIC...,energy_j` (and optionally `seconds`, which fits static
power), then one row per period: vCPU run time, event counts, and the energy measured.
--live: sample every VM's vCPUs and RAPL package energy (powercap) every --period.

EXAMPLES:
  virtprof balance calibrate --input meter.csv
  virtprof balance calibrate --live --duration 60s -o weights.toml")]
pub struct CalibrateArgs {
    /// Periods with measured energy, as CSV.
    #[arg(long, value_name = "CSV", group = "source", required = true)]
    pub input: Option<PathBuf>,
    /// Measure: every VM's vCPU activity against RAPL/powercap package energy.
    #[arg(long, group = "source")]
    pub live: bool,
    /// --live: how long.
    #[arg(short, long, value_name = "TIME", default_value = "60s", value_parser = duration)]
    pub duration: Duration,
    /// --live: period length.
    #[arg(long, value_name = "TIME", default_value = "1s", value_parser = duration)]
    pub period: Duration,
    /// Thermal parameters to keep in the written file.
    #[arg(long, value_name = "FILE")]
    pub weights: Option<PathBuf>,
    /// Write the fitted model here (TOML, for --weights).
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
#[command(after_help = "\
(a) overhead: two compute test VMs, one vCPU each, pinned to two CPUs and swapped by force at 0,
1, 10, 20, 100 and 1000 Hz; guest throughput from the guests' own counters, loss against 0 Hz.
(b) policy: a compute (hot) and an io-bound (cold) test VM on two CPUs, without and with the
policy: the per-core energy gap over time and the swap rate the policy chose.

EXAMPLES:
  virtprof balance bench
  virtprof balance bench --segment 3s --reps 5 --json > bench.json
  virtprof balance bench --only policy --k 1.5 --html policy.html")]
pub struct BalanceBenchArgs {
    /// The two host CPUs (default: the first two online).
    #[arg(long, value_name = "LIST", value_parser = cpu_list)]
    pub cpus: Option<CpuList>,
    /// Length of one overhead measurement.
    #[arg(long, value_name = "TIME", default_value = "3s", value_parser = duration)]
    pub segment: Duration,
    /// Repetitions of the frequency sweep (medians are reported).
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub reps: u32,
    /// Length of each policy run (without, then with the policy).
    #[arg(long = "policy-time", value_name = "TIME", default_value = "5s", value_parser = duration)]
    pub policy_time: Duration,
    /// Accounting period of the policy runs.
    #[arg(long, value_name = "TIME", default_value = "100ms", value_parser = duration)]
    pub period: Duration,
    /// Threshold.
    #[arg(long, value_name = "K", default_value_t = 1.2)]
    pub k: f64,
    /// Energy weights and thermal parameters.
    #[arg(long, value_name = "FILE")]
    pub weights: Option<PathBuf>,
    /// Run one experiment only.
    #[arg(long, value_enum)]
    pub only: Option<Experiment>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// Write the table and plots to OUT.
    #[arg(long, value_name = "OUT")]
    pub html: Option<PathBuf>,
}

/// One of `balance bench`'s experiments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Experiment {
    /// (a) forced-swap overhead.
    Overhead,
    /// (b) the policy on a hot and a cold vCPU.
    Policy,
}

#[derive(Debug, Args)]
#[command(after_help = "\
One thread per CPU, pinned, reads the clock in a loop; a step longer than --threshold is a
noise sample. A private tracefs instance records NMIs, IRQs, IRQ vectors, softirqs and context
switches on those CPUs, and each sample's time is split by the innermost context (nested
interference is subtracted). What the trace does not explain is hardware noise on bare metal;
inside a VM (detected) it is virtualization noise: steal (the CPU's steal-time delta, largest
samples first) and hypervisor. Times are in microseconds.

--testvm runs the guest-side loop inside a micro-VM instead, records the host meanwhile, and
attributes every guest sample to host events (preemption, exits, host IRQs) on a clock mapping
whose error bound is printed. --host-recording FILE --guest REPORT does the same afterwards,
from a recording of the host made while `virtprof testvm -w noise` ran pinned. For a real
guest, run `virtprof agent --noise CPUS` in it and `virtprof record --agent ADDR` on the host;
--host-recording FILE alone then explains each guest sample the same way, by the vCPU thread of
that guest CPU (QEMU names them with `-name NAME,debug-threads=on`).

EXAMPLES:
  virtprof noise --cpus 1 --duration 10s                   rtla osnoise top, plus STEAL and HYP
  virtprof noise --threshold 5us --hist                    histogram of sample lengths
  virtprof noise --stop-single 200us --snapshot stop.txt   stop at the first 200 us sample
  virtprof noise --cpus 1 --no-trace                       counts only, as oslat does
  virtprof noise --testvm --pin 1 --inject-hz 100 --json   guest noise explained by the host
  virtprof record -o h.vprec -- virtprof testvm -w noise --pin 1 --json > g.json
  virtprof noise --host-recording h.vprec --guest g.json   the same, afterwards
  virtprof record -o h.vprec --agent vsock:3:9478 -d 30s   (guest: virtprof agent --noise 1)
  virtprof noise --host-recording h.vprec                  the guest's samples explained")]
pub struct NoiseArgs {
    /// CPUs to measure (default: every online CPU).
    #[arg(long, value_name = "LIST", value_parser = cpu_list)]
    pub cpus: Option<CpuList>,
    /// How long to measure.
    #[arg(short, long, value_name = "TIME", default_value = "5s", value_parser = duration)]
    pub duration: Duration,
    /// A step between two clock reads longer than this is a noise sample.
    #[arg(long, value_name = "TIME", default_value = "1us", value_parser = duration)]
    pub threshold: Duration,
    /// Reporting period.
    #[arg(long, value_name = "TIME", default_value = "1s", value_parser = duration)]
    pub period: Duration,
    /// Measuring part of each period (default: all of it).
    #[arg(long, value_name = "TIME", value_parser = duration)]
    pub runtime: Option<Duration>,
    /// The clock the loop reads: tsc (default where the TSC is constant) or mono-raw.
    #[arg(long, value_enum)]
    pub clock: Option<NoiseClock>,
    /// Run the measurement threads SCHED_FIFO at this priority.
    #[arg(long, value_name = "PRIO")]
    pub fifo: Option<u8>,
    /// Print a histogram of sample lengths (rtla osnoise hist).
    #[arg(long)]
    pub hist: bool,
    /// Histogram bucket width.
    #[arg(long, value_name = "TIME", default_value = "1us", value_parser = duration)]
    pub bucket_size: Duration,
    /// Histogram buckets (longer samples count in `over`).
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub entries: usize,
    /// Stop when a single sample is longer than this, and save a trace snapshot around it.
    #[arg(long, value_name = "TIME", value_parser = duration)]
    pub stop_single: Option<Duration>,
    /// Stop when a period's noise on one CPU exceeds this, and save a trace snapshot.
    #[arg(long, value_name = "TIME", value_parser = duration)]
    pub stop_total: Option<Duration>,
    /// Where a stop saves its trace snapshot.
    #[arg(long, value_name = "FILE", default_value = "noise-snapshot.txt")]
    pub snapshot: PathBuf,
    /// Print JSON (schema in docs/noise.md).
    #[arg(long)]
    pub json: bool,
    /// Count samples without tracing (oslat's mode: the least overhead, nothing attributed).
    #[arg(long, conflicts_with_all = ["stop_single", "stop_total", "testvm"])]
    pub no_trace: bool,
    /// Measure inside a micro-VM (the guest-side loop) and attribute its samples to host events.
    #[arg(long)]
    pub testvm: bool,
    /// --testvm: host CPU of the vCPU.
    #[arg(long, value_name = "CPU")]
    pub pin: Option<u32>,
    /// Explain a recorded guest's noise instead: a `virtprof record --agent` of a guest whose
    /// agent ran with --noise, or (with --guest) the host's record of a testvm `noise` run.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["testvm", "no_trace"])]
    pub host_recording: Option<PathBuf>,
    /// --host-recording with agent samples: the VM the agent ran in (name or VMM pid), when
    /// the recording saw several and none is named after the guest.
    #[arg(long, value_name = "NAME|PID", requires = "host_recording")]
    pub vm: Option<String>,
    /// --host-recording: the `virtprof testvm -w noise --pin CPU --json` report of the recorded run.
    #[arg(long, value_name = "FILE", requires = "host_recording")]
    pub guest: Option<PathBuf>,
    /// --testvm: inject heavyweight exits at this rate (the VMM kicks the vCPU thread).
    #[arg(long, value_name = "HZ", default_value_t = 0)]
    pub inject_hz: u32,
    /// In a VM: run this between every two clock reads, so each sample is one VM exit timed
    /// from inside: `cpuid` (lightweight under KVM) or `inb:PORT` (a port the VMM emulates:
    /// heavyweight; root). Samples then count exits, and min/average their cost.
    #[arg(long, value_name = "cpuid|inb:PORT", value_parser = probe, conflicts_with_all = ["testvm", "host_recording"])]
    pub probe: Option<Probe>,
}

/// The loop's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum NoiseClock {
    /// The time-stamp counter, calibrated against CLOCK_MONOTONIC_RAW.
    Tsc,
    /// CLOCK_MONOTONIC_RAW.
    MonoRaw,
}

/// A duration with a unit (`200ms`, `1.5s`, `10us`), parsed once where the command line is
/// read: a bad one is a usage error (exit 2) that names its option.
/// The longest duration any option takes: a run, window or interval over a year is a typo
/// (`300000000m`) that would otherwise run until killed.
const MAX_DURATION: Duration = Duration::from_secs(366 * 24 * 3600);

fn duration(text: &str) -> Result<Duration, String> {
    let d = virtprof_model::units::parse_duration_ns(text).map(Duration::from_nanos)?;
    if d > MAX_DURATION {
        return Err(format!("'{}' is over a year; the longest taken is 366 days", text.trim()));
    }
    Ok(d)
}

/// A CPU list (`0-3,8`), parsed once where the command line is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuList(pub Vec<u32>);

fn cpu_list(text: &str) -> Result<CpuList, String> {
    virtprof_model::units::parse_cpu_list(text).map(CpuList)
}

fn regex(text: &str) -> Result<regex::Regex, String> {
    regex::Regex::new(text).map_err(|e| e.to_string())
}

/// Where the guest kernel was loaded: given, or found in guest memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kaslr {
    /// Search guest memory for `linux_banner` (--qemu, --gdb).
    Auto,
    /// The slide, in bytes.
    Offset(u64),
}

fn kaslr(text: &str) -> Result<Kaslr, String> {
    if text == "auto" {
        return Ok(Kaslr::Auto);
    }
    u64::from_str_radix(text.trim_start_matches("0x"), 16)
        .map(Kaslr::Offset)
        .map_err(|_| "give a hex offset (0x2a000000) or 'auto'".to_string())
}
