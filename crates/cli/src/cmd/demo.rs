//! `virtprof demo`: the embedded default. Starts a mix of test VMs that show every column of
//! `top` doing something — two compute VMs contending for one CPU (run/wait ~50/50), an
//! io-bound VM (mostly blocked, one I/O per wakeup), an exit-heavy VM (port I/O handled by the
//! VMM) — then watches them, and stops them on the way out whatever happens.

use std::path::Path;
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use virtprof_model::units::parse_duration_ns;

use crate::args::DemoArgs;
use crate::cmd::top::{self, Watch};
use crate::exit::usage;

/// The demo's VMs: (name, testvm arguments).
const VMS: [(&str, &[&str]); 3] = [
    ("contend", &["--workload", "compute", "--vms", "2", "--pin", "0"]),
    ("io", &["--workload", "io-bound", "--io-latency", "2ms"]),
    ("exits", &["--workload", "pio-user"]),
];
/// VMM processes the demo starts (the compute entry starts two).
const VMM_COUNT: usize = 4;

/// The testvm processes; dropping them stops them (and their VMMs).
struct DemoVms(Vec<Child>);

impl Drop for DemoVms {
    fn drop(&mut self) {
        for child in &mut self.0 {
            // testvm forwards SIGTERM to its VMM processes and waits for them.
            let pid = libc::pid_t::try_from(child.id()).unwrap_or(0);
            // SAFETY: kill with the pid of a child we spawned and a valid signal.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        for child in &mut self.0 {
            let _ = child.wait();
        }
    }
}

pub fn run(args: &DemoArgs) -> anyhow::Result<ExitCode> {
    let duration_ns = parse_duration_ns(&args.duration).map_err(|e| usage(format!("--duration: {e}")))?;
    if duration_ns < 1_000_000_000 {
        return Err(usage("--duration: the demo needs at least 1s"));
    }
    let delay = top::delay(args.watch.delay)?;
    virtprof_kvm::launcher::check_kvm()?;
    let exe = std::env::current_exe()?;
    let duration = format!("{}ms", duration_ns / 1_000_000);
    let mut vms = DemoVms(Vec::new());
    for (name, testvm_args) in VMS {
        let child = Command::new(&exe)
            .arg("testvm")
            .args(testvm_args)
            .args(["--name", name, "--duration", &duration])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?;
        vms.0.push(child);
    }
    let vmms = wait_for_vmms(&mut vms)?;
    eprintln!("virtprof demo: {} test VMs running for {}; VMM pids {vmms:?}", vmms.len(), args.duration);
    let started = Instant::now();
    let run_for = Duration::from_nanos(duration_ns);
    // With --once, sample for --delay but never past the VMs' end.
    let delay = if args.watch.once { delay.min(run_for.saturating_sub(Duration::from_millis(500))) } else { delay };
    let done = || started.elapsed() >= run_for;
    top::watch(&Watch {
        delay,
        only: vmms,
        once: args.watch.once,
        json: args.watch.json,
        log: None,
        no_trace: args.watch.no_trace,
        done: &done,
    })
}

/// The VMM processes (children of our testvm children) once they all hold a VM.
fn wait_for_vmms(vms: &mut DemoVms) -> anyhow::Result<Vec<u32>> {
    let parents: Vec<u32> = vms.0.iter().map(Child::id).collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let vmms: Vec<u32> = children_of(&parents)
            .into_iter()
            .filter(|&pid| virtprof_kvm::discover::inspect(Path::new("/proc"), pid).ok().flatten().is_some())
            .collect();
        if vmms.len() == VMM_COUNT {
            return Ok(vmms);
        }
        for child in &mut vms.0 {
            if let Some(status) = child.try_wait()? {
                let mut stderr = String::new();
                if let Some(mut e) = child.stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut e, &mut stderr);
                }
                // testvm's own message says what to fix (no /dev/kvm, no permission, ...).
                let reason = stderr.trim().lines().last().unwrap_or("no message").trim_start_matches("virtprof: ");
                return Err(usage(format!("a demo VM failed to start ({status}): {reason}")));
            }
        }
        if Instant::now() > deadline {
            anyhow::bail!("the demo VMs did not start within 10 s (found {} of {VMM_COUNT})", vmms.len());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Processes whose parent is one of `parents`.
fn children_of(parents: &[u32]) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    let mut pids: Vec<u32> = entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| {
                    let rest = &s[s.rfind(')')? + 1..];
                    rest.split_whitespace().nth(1)?.parse::<u32>().ok()
                })
                .is_some_and(|ppid| parents.contains(&ppid))
        })
        .collect();
    pids.sort_unstable();
    pids
}
