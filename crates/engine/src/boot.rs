//! Where `boot`'s samples come from: the micro-VMM's kicks (`--testvm`), a QEMU gdbstub (`--qemu`,
//! `--gdb`), or the kvm_exit events of a recording (`--recording`).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use virtprof_analysis::exit_timeline::{ExitTimeline, TooManySamples, MAX_SAMPLES};
use virtprof_analysis::symbols::SymbolTable;
use virtprof_kvm::gdbstub::{GdbClient, GdbError};
use virtprof_kvm::guest::{boot, Script};
use virtprof_kvm::launcher::{self, TestvmConfig};
use virtprof_model::pcsample::{PcSample, Realm};

use regex::Regex;
use virtprof_session::Session;

use crate::usage;

/// How a live source is sampled.
pub struct Sampling {
    /// Samples per second per vCPU.
    pub rate: u32,
    /// Stop sampling after this long (--qemu, --gdb).
    pub limit: Option<Duration>,
    /// Search guest memory for the kernel's KASLR slide.
    pub find_kaslr: bool,
}

/// Samples and what is known about how they were taken.
pub struct Collected {
    /// Human description of the source.
    pub source: String,
    /// Sampling rate (None for exit-driven samples).
    pub rate_hz: Option<u32>,
    /// A caveat to print with the results.
    pub note: Option<String>,
    pub samples: Vec<PcSample>,
    /// The guest program's own symbols (testvm).
    pub program_symbols: Option<SymbolTable>,
    /// KASLR offset found in guest memory.
    pub detected_kaslr: Option<u64>,
    /// Ground truth from the test bed.
    pub truth: Option<Truth>,
}

/// What the testvm run says the profile should be.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Truth {
    /// Function → its share of the guest's run time, from the durations it was given.
    pub expected_shares: BTreeMap<String, f64>,
    /// Guest run time (first phase marker to done), seconds.
    pub boot_s: f64,
    /// Loop iterations the guest completed: its work done in that fixed time, which sampling
    /// overhead lowers.
    #[serde(default)]
    pub iterations: u64,
}

/// `--testvm`: run the boot workload with the VMM sampling every vCPU `rate` times a second.
pub fn testvm(script: Script, vcpus: u32, rate: u32) -> anyhow::Result<Collected> {
    let expected_shares = boot::expected_shares(&script).into_iter().collect();
    let config = TestvmConfig {
        script,
        vms: 1,
        vcpus,
        pin: Vec::new(),
        io_latency_ns: 0,
        steal_time: false,
        linger_ns: 0,
        name: Some("boot".into()),
        sample_hz: rate,
        noise_threshold_ns: 0,
        io_thread: None,
        reclaim_hz: 0,
    };
    virtprof_host::stop::install_handler();
    let exe = std::env::current_exe().context("locating the virtprof executable to start the VMM")?;
    let mut report = launcher::run_testvm(&exe, &config)?;
    let vm = report.vms.pop().context("the test bed reported no VM")?;
    let program_symbols = SymbolTable::from_system_map(&vm.system_map).context("the guest program's symbol map")?;
    let boot_s = vm.vcpus.iter().map(|v| v.wall_ns).max().unwrap_or(0) as f64 / 1e9;
    let iterations = vm.vcpus.iter().map(|v| v.iterations).sum();
    let samples = vm.vcpus.into_iter().flat_map(|v| v.samples).collect();
    Ok(Collected {
        source: format!("testvm boot workload ({vcpus} vCPU, pid {})", vm.pid),
        rate_hz: Some(rate),
        note: None,
        samples,
        program_symbols: Some(program_symbols),
        detected_kaslr: None,
        truth: Some(Truth { expected_shares, boot_s, iterations }),
    })
}

/// `--recording`: the kvm_exit/kvm_entry timeline of every vCPU, sampled `rate` times a second
/// (time in exits is the hypervisor realm; guest time takes the rip of the exit ending it).
pub fn recording(path: &Path, rate: u32) -> anyhow::Result<Collected> {
    let mut recording = Session::open_warning(path, &Default::default())?;
    let mut timeline = ExitTimeline::new(rate);
    let analysis = crate::pass::analyse_with(&mut recording, Default::default(), &mut timeline)?;
    eprintln!("virtprof: lost events: {}", recording.describe_loss(&analysis.loss, &analysis.decoder));
    let (samples, exit_share) = timeline.finish().map_err(|t| too_many_samples(path, rate, t))?;
    if samples.is_empty() {
        let why = match recording.host_kind() {
            Some(kind) if kind.traces_exits() == Some(false) => {
                format!("this {kind} host's KVM emits no kvm_exit/kvm_entry")
            }
            Some(kind) => format!("recorded on a {kind} host: were the kvm events recorded, with a VM running?"),
            None => "`virtprof doctor` says whether this host's KVM emits them".to_string(),
        };
        return Err(usage(format!(
            "'{}' holds no kvm_exit/kvm_entry pairs ({why}); use --testvm or --qemu",
            path.display()
        )));
    }
    let share = exit_share.map_or_else(String::new, |s| format!("; {:.1}% of the vCPUs' time was in exits", 100.0 * s));
    Ok(Collected {
        source: format!("kvm_exit/kvm_entry timeline in {}", path.display()),
        rate_hz: Some(rate),
        note: Some(format!(
            "reconstructed from exits: hypervisor time is measured; guest time between an entry and the next exit is \
             attributed to that exit's rip, so code that never exits is seen only where it stops{share}"
        )),
        samples,
        program_symbols: None,
        detected_kaslr: None,
        truth: None,
    })
}

/// The recording's timelines need more samples at `rate` than a profile holds: name the rate
/// that fits, or, where none would (a timeline longer than any boot), the likely corruption.
fn too_many_samples(path: &Path, rate: u32, t: TooManySamples) -> anyhow::Error {
    let covered = virtprof_model::units::format_duration_ns(t.covered_ns);
    let fits = u64::from(rate) * MAX_SAMPLES / t.wanted.max(1);
    let advice = if fits >= 1 {
        format!("use --rate {fits} or lower")
    } else {
        "no rate fits: a timeline this long suggests a corrupt timestamp (`virtprof exits` on the file shows its span)"
            .to_string()
    };
    usage(format!(
        "'{}': the vCPUs' kvm_exit/kvm_entry timelines cover {covered}: at --rate {rate} that is {} samples, over the \
         {MAX_SAMPLES} a profile holds; {advice}",
        path.display(),
        t.wanted
    ))
}

/// When gdbstub sampling stops.
struct Stop {
    deadline: Option<Instant>,
    /// Set by the console reader when `--until` matched.
    matched: Arc<AtomicBool>,
}

/// `--gdb ADDRESS`: attach to a running gdbstub.
pub fn gdb(address: &str, sampling: &Sampling, kernel: Option<&SymbolTable>) -> anyhow::Result<Collected> {
    // A stop signal ends sampling; the profile of what was sampled is still printed.
    virtprof_host::stop::install_handler();
    let mut client = GdbClient::connect(address).with_context(|| format!("connecting to the gdbstub at {address}"))?;
    client.attach()?;
    let stop = Stop { deadline: sampling.limit.map(|d| Instant::now() + d), matched: Arc::new(AtomicBool::new(false)) };
    let samples = sample_gdb(&mut client, sampling.rate, &stop)?;
    let detected_kaslr = detect_kaslr(&mut client, sampling, kernel);
    // Leave the guest running as we found it.
    let _ = client.resume();
    Ok(gdb_collected(format!("gdbstub at {address}"), sampling.rate, samples, detected_kaslr))
}

fn gdb_collected(source: String, rate: u32, samples: Vec<PcSample>, detected_kaslr: Option<u64>) -> Collected {
    Collected { source, rate_hz: Some(rate), note: None, samples, program_symbols: None, detected_kaslr, truth: None }
}

/// QEMU as `--qemu -- ARGS` starts it.
pub struct QemuLaunch {
    /// The binary.
    pub program: String,
    /// Its arguments (virtprof adds `-S` and the gdbstub).
    pub args: Vec<String>,
    /// Stop sampling when a console line matches.
    pub until: Option<Regex>,
    /// Copy the console here.
    pub console: Option<PathBuf>,
}

/// `--qemu -- ARGS`: start QEMU halted with a gdbstub on a private socket and sample it.
pub fn qemu(launch: &QemuLaunch, sampling: &Sampling, kernel: Option<&SymbolTable>) -> anyhow::Result<Collected> {
    // A stop signal ends sampling; QEMU is stopped and the profile of what was sampled printed.
    virtprof_host::stop::install_handler();
    let matched = Arc::new(AtomicBool::new(false));
    let dir = std::env::temp_dir().join(format!("virtprof-boot-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let socket = dir.join("gdb.sock");
    let program = &launch.program;
    let mut command = Command::new(program);
    // QEMU must not outlive us, even if we are killed with SIGKILL.
    virtprof_host::stop::die_with_parent(&mut command);
    // In a process group of its own: a Ctrl-C at the terminal reaches virtprof only, which
    // stops sampling and then QEMU (QEMU ending first made the gdbstub answer `W00` mid-sample).
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    let mut child = command
        .args(&launch.args)
        .arg("-S")
        .arg("-chardev")
        .arg(format!("socket,id=virtprof-gdb,path={},server=on,wait=off", socket.display()))
        .arg("-gdb")
        .arg("chardev:virtprof-gdb")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            usage(format!("starting '{program}': {e} (install qemu-system-x86, or name the binary first after --)"))
        })?;
    let guard = QemuGuard { child: &mut child, dir: &dir };
    let console = Console::start(guard.child, launch.until.clone(), launch.console.as_deref(), Arc::clone(&matched))?;
    if !wait_for_socket(guard.child, &socket, &console)? {
        eprintln!("virtprof: stopped before QEMU's gdbstub opened: nothing sampled");
        return Ok(gdb_collected(format!("QEMU gdbstub ({program})"), sampling.rate, Vec::new(), None));
    }
    let mut client = GdbClient::connect(&socket.to_string_lossy()).context("connecting to QEMU's gdbstub")?;
    let stop = Stop { deadline: sampling.limit.map(|d| Instant::now() + d), matched };
    let samples = sample_gdb(&mut client, sampling.rate, &stop)?;
    let detected_kaslr = detect_kaslr(&mut client, sampling, kernel);
    if launch.until.is_some() && !stop.matched.load(Ordering::Relaxed) {
        eprintln!(
            "virtprof: warning: --until never matched the console; the profile runs to QEMU's exit or --duration"
        );
    }
    drop(guard);
    Ok(gdb_collected(format!("QEMU gdbstub ({program})"), sampling.rate, samples, detected_kaslr))
}

/// Kills QEMU and removes the socket directory however sampling ends.
struct QemuGuard<'a> {
    child: &'a mut Child,
    dir: &'a Path,
}

impl Drop for QemuGuard<'_> {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(self.dir);
    }
}

/// QEMU's console (stdout): copied to `--console`, matched against `--until`, tail kept.
struct Console {
    tail: Arc<Mutex<Vec<String>>>,
    stderr: Arc<Mutex<String>>,
}

impl Console {
    fn start(
        child: &mut Child,
        until: Option<regex::Regex>,
        copy: Option<&Path>,
        matched: Arc<AtomicBool>,
    ) -> anyhow::Result<Self> {
        let mut copy = match copy {
            Some(p) => Some(std::fs::File::create(p).with_context(|| format!("creating --console {}", p.display()))?),
            None => None,
        };
        let tail = Arc::new(Mutex::new(Vec::new()));
        let stdout = child.stdout.take().expect("stdout is piped");
        let lines = Arc::clone(&tail);
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).split(b'\n').map_while(Result::ok) {
                let line = String::from_utf8_lossy(&line).trim_end_matches('\r').to_string();
                if let Some(f) = copy.as_mut() {
                    let _ = writeln!(f, "{line}");
                }
                if until.as_ref().is_some_and(|r| r.is_match(&line)) {
                    matched.store(true, Ordering::Relaxed);
                }
                let mut t = lines.lock().expect("console tail");
                t.push(line);
                if t.len() > 20 {
                    t.remove(0);
                }
            }
        });
        let stderr = Arc::new(Mutex::new(String::new()));
        let err_pipe = child.stderr.take().expect("stderr is piped");
        let err = Arc::clone(&stderr);
        std::thread::spawn(move || {
            for line in BufReader::new(err_pipe).lines().map_while(Result::ok) {
                let mut e = err.lock().expect("stderr tail");
                e.push_str(&line);
                e.push('\n');
            }
        });
        Ok(Console { tail, stderr })
    }

    fn describe(&self) -> String {
        let err = self.stderr.lock().expect("stderr tail").trim().to_string();
        if !err.is_empty() {
            return err;
        }
        self.tail.lock().expect("console tail").join("\n")
    }
}

/// Wait for QEMU's gdbstub socket; false when a stop was asked for first.
fn wait_for_socket(child: &mut Child, socket: &Path, console: &Console) -> anyhow::Result<bool> {
    let started = Instant::now();
    while !socket.exists() {
        if virtprof_host::stop::requested() {
            return Ok(false);
        }
        if let Some(status) = child.try_wait()? {
            std::thread::sleep(Duration::from_millis(50));
            return Err(usage(format!("QEMU exited ({status}) before its gdbstub opened:\n{}", console.describe())));
        }
        if started.elapsed() > Duration::from_secs(20) {
            return Err(anyhow::anyhow!("QEMU did not open its gdbstub socket within 20 s"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(true)
}

/// Stop, read every vCPU, resume, at `rate` — until `stop` says so or the guest exits. The
/// guest is stopped on entry and on return (unless it exited).
fn sample_gdb(client: &mut GdbClient, rate: u32, stop: &Stop) -> anyhow::Result<Vec<PcSample>> {
    let period = Duration::from_secs(1) / rate.max(1);
    let start = Instant::now();
    let mut next = start;
    let mut samples = Vec::new();
    loop {
        let t_ns = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let all = match client.sample_all() {
            Ok(all) => all,
            // The guest ended (QEMU exited, or closed the connection) between two samples.
            Err(GdbError::Exited(_)) => return Ok(samples),
            Err(e) => return Err(e.into()),
        };
        for (vcpu, regs) in (0u32..).zip(all) {
            let cpl = (regs.cs & 3) as u8;
            samples.push(PcSample {
                t_ns,
                vcpu,
                rip: regs.rip,
                realm: Realm::of_guest(cpl, regs.rip),
                activity: String::new(),
            });
        }
        if stop.matched.load(Ordering::Relaxed)
            || stop.deadline.is_some_and(|d| Instant::now() >= d)
            || virtprof_host::stop::requested()
        {
            return Ok(samples);
        }
        client.resume()?;
        next += period;
        match next.checked_duration_since(Instant::now()) {
            Some(wait) => std::thread::sleep(wait),
            None => next = Instant::now(),
        }
        match client.interrupt() {
            Ok(()) => {}
            Err(GdbError::Exited(_)) => return Ok(samples),
            Err(GdbError::Io(e)) if e.kind() == std::io::ErrorKind::ConnectionReset => return Ok(samples),
            Err(e) => return Err(e.into()),
        }
    }
}

/// KASLR slide of the guest kernel: `linux_banner` ("Linux version ...") is searched at every
/// 2 MiB-aligned slide of its link address (x86-64 randomizes the kernel's virtual base in
/// 2 MiB steps within 1 GiB).
fn detect_kaslr(client: &mut GdbClient, sampling: &Sampling, kernel: Option<&SymbolTable>) -> Option<u64> {
    if !sampling.find_kaslr {
        return None;
    }
    let banner = kernel?.address_of("linux_banner")?;
    const STEP: u64 = 2 << 20;
    (0..512u64).map(|k| k * STEP).find(|&slide| {
        banner
            .checked_add(slide)
            .is_some_and(|addr| matches!(client.read_memory(addr, 14), Ok(Some(bytes)) if bytes == b"Linux version "))
    })
}
