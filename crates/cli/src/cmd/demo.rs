//! `virtprof demo`: the embedded default. Starts a mix of test VMs that show every column of
//! `top` doing something — two compute VMs contending for one CPU (run/wait ~50/50), an
//! io-bound VM (mostly blocked, one I/O per wakeup), an exit-heavy VM (port I/O handled by the
//! VMM; MMIO on arm64, which has no port I/O) — then watches them, and stops them on the way out whatever happens.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use virtprof_model::units::{duration_ns, format_duration};

use crate::args::DemoArgs;
use crate::exit::usage;
use crate::watch::{self, Watch};
use virtprof_engine::testvms::TestVms;

/// The demo's VMs: (name, testvm arguments).
const VMS: [(&str, &[&str]); 3] = [
    ("contend", &["--workload", "compute", "--vms", "2", "--pin", "0"]),
    ("io", &["--workload", "io-bound", "--io-latency", "2ms"]),
    ("exits", &["--workload", if cfg!(target_arch = "aarch64") { "mmio-user" } else { "pio-user" }]),
];
/// VMM processes the demo starts (the compute entry starts two).
const VMM_COUNT: usize = 4;

pub fn run(args: &DemoArgs) -> anyhow::Result<ExitCode> {
    let duration_ns = duration_ns(args.duration);
    if duration_ns < 1_000_000_000 {
        return Err(usage("--duration: the demo needs at least 1s"));
    }
    let delay = watch::delay(args.watch.delay)?;
    watch::check_terminal(args.watch.once)?;
    virtprof_kvm::launcher::check_kvm()?;
    // From here a stop signal stops the VMs however far they got (TestVms drops).
    virtprof_host::stop::install_handler();
    // The VMs outlive the demo by the time they may take to start (`wait_for_vmms` waits
    // START_WITHIN): on a loaded host the first could otherwise end before the last has
    // started. The demo stops them when it ends.
    let start_within = virtprof_engine::testvms::START_WITHIN.as_millis();
    let duration = format!("{}ms", u128::from(duration_ns / 1_000_000) + start_within);
    let mut vms = TestVms::new("demo");
    for (name, testvm_args) in VMS {
        vms.start(&[testvm_args, &["--name", name, "--duration", &duration]].concat())?;
    }
    let Some(vmms) = vms.wait_for_vmms(VMM_COUNT)? else {
        eprintln!("virtprof demo: stopped while its VMs were starting; they are stopped");
        return Ok(ExitCode::SUCCESS);
    };
    eprintln!(
        "virtprof demo: {} test VMs running for {}; VMM pids {vmms:?}",
        vmms.len(),
        format_duration(args.duration)
    );
    let started = Instant::now();
    let run_for = Duration::from_nanos(duration_ns);
    // With --once, sample for --delay but never past the VMs' end.
    let delay = if args.watch.once { delay.min(run_for.saturating_sub(Duration::from_millis(500))) } else { delay };
    let done = || started.elapsed() >= run_for;
    watch::watch(&Watch {
        delay,
        only: vmms,
        once: args.watch.once,
        json: args.watch.json,
        log: None,
        mode: crate::watch::mode(&args.watch),
        done: &done,
        agents: Vec::new(),
    })
}
