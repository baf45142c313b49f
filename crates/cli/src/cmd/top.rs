//! `virtprof top`: the live view (`crate::watch`) of every VM on this host, or of `--vm` PIDs.

use std::path::Path;
use std::process::ExitCode;

use virtprof_agent::transport::Address;

use crate::args::TopArgs;
use crate::exit::usage;
use crate::watch::{delay, watch, Watch};

pub fn run(args: &TopArgs) -> anyhow::Result<ExitCode> {
    let delay = delay(args.watch.delay)?;
    for &pid in &args.vm {
        if !Path::new(&format!("/proc/{pid}")).exists() {
            return Err(usage(format!("--vm {pid}: no such process (list VMs with `virtprof top --once`)")));
        }
        if virtprof_kvm::discover::inspect(Path::new("/proc"), pid).ok().flatten().is_none() {
            return Err(usage(format!(
                "--vm {pid}: the process holds no KVM VM (or its fds are not readable: run as root)"
            )));
        }
    }
    let token = args.agent_token_file.as_deref().map(virtprof_engine::token::read_token).transpose()?;
    if let Some(a) = args.agent.iter().find(|a| matches!(a, Address::Tcp(_))).filter(|_| token.is_none()) {
        return Err(usage(format!("--agent {a}: a tcp agent needs its token: --agent-token-file FILE")));
    }
    watch(&Watch {
        agents: args.agent.iter().map(|a| (a.clone(), token.clone())).collect(),
        delay,
        only: args.vm.clone(),
        once: args.watch.once,
        json: args.watch.json,
        log: args.log.as_deref(),
        mode: crate::watch::mode(&args.watch),
        done: &|| false,
    })
}
