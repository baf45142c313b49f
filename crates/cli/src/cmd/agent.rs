//! `virtprof agent`: the guest side (`virtprof_agent::serve`), with its options checked.

use std::process::ExitCode;

use virtprof_agent::collect::CollectConfig;
use virtprof_agent::noise::NoiseConfig;
use virtprof_agent::serve::{serve, ServeConfig};
use virtprof_agent::transport::Address;
use virtprof_host::stop::STOP_REQUESTED;
use virtprof_model::units::{duration_ns, format_duration_ns};

use crate::args::AgentArgs;
use crate::exit::usage;

pub fn run(args: &AgentArgs) -> anyhow::Result<ExitCode> {
    let interval_ns = duration_ns(args.interval);
    if !(10_000_000..=3_600_000_000_000).contains(&interval_ns) {
        return Err(usage("--interval: between 10ms and 1h"));
    }
    let token = args.token_file.as_deref().map(virtprof_engine::token::read_token).transpose()?;
    if matches!(args.listen, Address::Tcp(_)) && token.is_none() {
        return Err(usage(format!(
            "--listen {}: TCP is open to anyone who can reach it; give --token-file FILE (the host passes the same file to --agent-token-file)",
            args.listen
        )));
    }
    let config = ServeConfig {
        address: args.listen.clone(),
        token,
        interval_ns,
        collect: CollectConfig {
            counters: args.counters.clone(),
            perf: args.perf || args.perf_events.is_some(),
            perf_events: args.perf_events.as_deref().map(perf_events).transpose()?,
            marker_port: args.marker_port,
        },
        sessions: args.sessions,
        noise: noise_config(args)?,
    };
    virtprof_host::stop::install_handler();
    serve(&config, &STOP_REQUESTED, &mut |line| {
        eprintln!("virtprof agent: {}", virtprof_model::units::printable(line))
    })
    .map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound | std::io::ErrorKind::AddrInUse | std::io::ErrorKind::PermissionDenied => {
            usage(format!("--listen {}: {e}", args.listen))
        }
        _ if e.raw_os_error() == Some(libc::EAFNOSUPPORT) || e.raw_os_error() == Some(libc::ENODEV) => usage(format!(
            "--listen {}: {e} (this guest has no vsock device: give the VM vhost-vsock, or use serial: or tcp:)",
            args.listen
        )),
        _ => anyhow::Error::new(e).context(format!("serving on {}", args.listen)),
    })?;
    Ok(ExitCode::SUCCESS)
}

/// `--perf-events LIST`, checked against this guest's tracefs and PMUs.
fn perf_events(list: &str) -> anyhow::Result<Vec<virtprof_interval::counters::CounterSpec>> {
    let tracefs = std::path::Path::new("/sys/kernel/tracing");
    let pmus = std::path::Path::new("/sys/bus/event_source/devices");
    virtprof_interval::event_names::parse_counters(list, tracefs, pmus)
        .map_err(|e| usage(format!("--perf-events: {e}")))
}

/// `--noise CPUS` and its timing, checked.
fn noise_config(args: &AgentArgs) -> anyhow::Result<Option<NoiseConfig>> {
    let Some(cpus) = &args.noise else { return Ok(None) };
    let threshold_ns = duration_ns(args.noise_threshold);
    let period_ns = duration_ns(args.noise_period);
    let runtime_ns = args.noise_runtime.map_or(period_ns, duration_ns);
    if threshold_ns == 0 {
        return Err(usage("--noise-threshold must be more than 0"));
    }
    if !(10_000_000..=60_000_000_000).contains(&period_ns) {
        return Err(usage("--noise-period: between 10ms and 60s"));
    }
    if runtime_ns == 0 || runtime_ns > period_ns {
        return Err(usage(format!(
            "--noise-runtime {}: more than 0 and at most --noise-period {}",
            format_duration_ns(runtime_ns),
            format_duration_ns(period_ns)
        )));
    }
    // An isolcpus= CPU is in no task's default mask, yet pinning there is the point.
    if let Some(cpu) = cpus.0.iter().find(|&&c| !virtprof_host::affinity::can_pin(c)) {
        return Err(usage(format!(
            "--noise: CPU {cpu}: this agent cannot pin a thread there (not online, or outside its cpuset)"
        )));
    }
    let probe = args.noise_probe.unwrap_or_default();
    Ok(Some(NoiseConfig { cpus: cpus.0.clone(), threshold_ns, period_ns, runtime_ns, probe }))
}
