//! `virtprof stats --pid PID`: the KVM binary statistics of any VMM process, read through
//! borrowed fds (like kvm_stat, but per vCPU and without debugfs).

use std::collections::BTreeMap;
use std::io::Write;
use std::process::ExitCode;

use anyhow::Context;
use serde::Serialize;
use virtprof_kvm::remote::RemoteVmStats;
use virtprof_kvm::StatsError;
use virtprof_sinks::Table;

use crate::args::StatsArgs;
use crate::exit::usage;

/// JSON shape: `{"pid", "vm": {name: value}, "vcpus": [{"index", "stats": {name: value}}]}`.
#[derive(Serialize)]
struct StatsOutput {
    pid: u32,
    vm: BTreeMap<String, u64>,
    vcpus: Vec<VcpuStats>,
}

#[derive(Serialize)]
struct VcpuStats {
    index: u32,
    stats: BTreeMap<String, u64>,
}

pub fn run(args: &StatsArgs) -> anyhow::Result<ExitCode> {
    let remote = match RemoteVmStats::attach(args.pid) {
        Err(e @ (StatsError::Proc { .. } | StatsError::NoKvmFds { .. })) => {
            return Err(usage(format!("{e}; list VMs with `ps -C qemu-system-x86_64,firecracker,virtprof-vm`")))
        }
        other => other.with_context(|| format!("reading KVM stats of process {}", args.pid))?,
    };
    let output = StatsOutput {
        pid: remote.pid,
        vm: match &remote.vm {
            Some(vm) => vm.read()?.values,
            None => BTreeMap::new(),
        },
        vcpus: remote
            .vcpus
            .iter()
            .map(|(index, fd)| Ok(VcpuStats { index: *index, stats: fd.read()?.values }))
            .collect::<Result<_, StatsError>>()?,
    };
    let mut out = crate::output::stdout();
    if args.json {
        crate::output::write_json_pretty(&mut out, &output)?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut headers = vec!["STAT".to_string(), "VM".to_string()];
    headers.extend(output.vcpus.iter().map(|v| format!("VCPU{}", v.index)));
    let mut table = Table::new(headers);
    let mut names: Vec<&String> = output.vm.keys().chain(output.vcpus.iter().flat_map(|v| v.stats.keys())).collect();
    names.sort();
    names.dedup();
    for name in names {
        let cells: Vec<Option<u64>> = std::iter::once(output.vm.get(name).copied())
            .chain(output.vcpus.iter().map(|v| v.stats.get(name).copied()))
            .collect();
        if !args.all && cells.iter().all(|c| c.unwrap_or(0) == 0) {
            continue;
        }
        let mut row = vec![name.clone()];
        row.extend(cells.iter().map(|c| c.map(|v| v.to_string()).unwrap_or_default()));
        table.row(row);
    }
    writeln!(
        out,
        "KVM binary stats of process {} ({} vCPUs){}",
        output.pid,
        output.vcpus.len(),
        if args.all { "" } else { ", non-zero only (--all for every stat)" }
    )?;
    table.write_text(&mut out)?;
    Ok(ExitCode::SUCCESS)
}
