//! The XenMon table `top`, `sched` and `demo` share, as text, CSV and JSON.

use virtprof_analysis::qos::{RoleRow, VcpuRow, VmRow, WindowReport};
use virtprof_model::units::printable;
use virtprof_model::vmm::{ThreadRole, VmOwner};
use virtprof_sinks::table::{known, Table, UNKNOWN};

/// `owner: web (pid 812): libvirt domain web-1 · uuid … · pod … · container …`, for each VM
/// the host says more about than its cgroup.
pub fn owner_lines(window: &WindowReport) -> Vec<String> {
    window
        .vms
        .iter()
        .filter(|vm| vm.owner != VmOwner { cgroup: vm.owner.cgroup.clone(), ..VmOwner::default() })
        .map(|vm| {
            let o = &vm.owner;
            let parts: Vec<String> = [
                ("libvirt domain", &o.libvirt_domain),
                ("uuid", &o.uuid),
                ("pod", &o.pod_uid),
                ("container", &o.container_id),
                ("cgroup", &o.cgroup),
            ]
            .into_iter()
            .filter_map(|(what, v)| Some(format!("{what} {}", v.as_deref()?)))
            .collect();
            // Names come from other processes' command lines and cgroups: escaped for a terminal.
            printable(&format!("owner: {} (pid {}): {}", vm.name, vm.pid, parts.join(" · "))).into_owned()
        })
        .collect()
}

/// The columns of the XenMon table, in `top`'s screen and in text output alike.
pub const COLUMNS: [&str; 14] = [
    "VM / VCPU",
    "PID/TID",
    "CPU",
    "RUN%",
    "WAIT%",
    "BLK%",
    "EXECS",
    "CPU/EX_US",
    "WAIT/EX_US",
    "BLK/IO_US",
    "ALLOC_US avg (min-max)",
    "IO",
    "EXITS/S",
    "TOP EXIT REASONS /s",
];

/// A VM's row under [`COLUMNS`].
pub fn vm_cells(vm: &VmRow) -> [String; 14] {
    [
        printable(&format!("{} ({})", vm.name, vm.kind)).into_owned(),
        vm.pid.to_string(),
        String::new(),
        pct(vm.running_pct),
        pct(vm.waiting_pct),
        pct(vm.blocked_pct),
        known(vm.exec_count, |n| n.to_string()),
        String::new(),
        String::new(),
        String::new(),
        String::new(),
        count_cell(vm.io_count),
        rate_cell(vm.exits_per_s),
        String::new(),
    ]
}

/// A vCPU's row under [`COLUMNS`].
pub fn vcpu_cells(v: &VcpuRow) -> [String; 14] {
    [
        format!("  vcpu{}", v.index),
        v.tid.to_string(),
        v.cpu.map(|c| c.to_string()).unwrap_or_default(),
        pct(v.running_pct),
        pct(v.waiting_pct),
        pct(v.blocked_pct),
        known(v.exec_count, |n| n.to_string()),
        known(v.cpu_per_exec_us, |us| format!("{us:.1}")),
        known(v.wait_per_exec_us, |us| format!("{us:.1}")),
        match (v.blocked_per_io_us, v.io_count) {
            (Some(us), _) => format!("{us:.1}"),
            // No I/O: no figure to give. Unknown I/O, or unknown blocked time: unknown.
            (None, Some(0)) => "-".into(),
            (None, _) => UNKNOWN.into(),
        },
        match (v.alloc_avg_us, v.alloc_min_us, v.alloc_max_us, v.exec_count) {
            (Some(avg), Some(min), Some(max), _) => format!("{avg:.0} ({min:.0}-{max:.0})"),
            (_, _, _, None) => UNKNOWN.into(),
            _ => "-".into(),
        },
        count_cell(v.io_count),
        rate_cell(v.exits_per_s),
        // Reasons are rated with the exits: unknown with them.
        match v.exits_per_s {
            Some(_) => {
                v.top_reasons.iter().map(|r| format!("{} {:.0}", r.reason, r.per_s)).collect::<Vec<_>>().join(", ")
            }
            None => UNKNOWN.into(),
        },
    ]
}

/// A row under [`COLUMNS`] for a VM's threads of one role other than its vCPUs (`top`).
pub fn role_cells(r: &RoleRow) -> [String; 14] {
    let io = io_per_exec_cell(r);
    [
        format!("  {} ×{}", r.role, r.threads),
        String::new(),
        String::new(),
        pct(r.running_pct),
        pct(r.waiting_pct),
        pct(r.blocked_pct),
        known(r.exec_count, |n| n.to_string()),
        known(r.cpu_per_exec_us, |us| format!("{us:.1}")),
        known(r.wait_per_exec_us, |us| format!("{us:.1}")),
        String::new(),
        known(r.cpus, |cpus| format!("{cpus:.2} CPUs")),
        String::new(),
        String::new(),
        format!("io/exec {io}"),
    ]
}

/// A count, or `-` where it is unknown.
fn count_cell(count: Option<u64>) -> String {
    count.map_or_else(|| "-".to_string(), |n| n.to_string())
}

/// A rate, or `-` where it is unknown.
fn rate_cell(rate: Option<f64>) -> String {
    rate.map_or_else(|| UNKNOWN.to_string(), |r| format!("{r:.0}"))
}

/// The XenMon table of one window: a row per VM, and per vCPU when `vcpus` is set.
pub fn table(report: &WindowReport, vcpus: bool) -> Table {
    let mut t = Table::new(COLUMNS);
    for vm in &report.vms {
        t.row(vm_cells(vm));
        if vcpus {
            vm.vcpus.iter().for_each(|v| t.row(vcpu_cells(v)));
        }
    }
    t
}

/// The work done for each VM by role (vCPUs, then the VMM's I/O threads, main loop, vhost
/// workers, ...), or None where no VM has threads other than its vCPUs.
pub fn roles_table(report: &WindowReport) -> Option<Table> {
    if report.vms.iter().all(|vm| vm.roles.iter().all(|r| r.role == ThreadRole::Vcpu)) {
        return None;
    }
    let mut t = Table::new([
        "VM",
        "ROLE",
        "THREADS",
        "CPUS",
        "RUN%",
        "WAIT%",
        "BLK%",
        "EXECS",
        "EXECS/S",
        "CPU/EX_US",
        "WAIT/EX_US",
        "IO/EXEC",
    ]);
    for vm in &report.vms {
        for r in &vm.roles {
            t.row([
                printable(&format!("{} ({})", vm.name, vm.pid)).into_owned(),
                r.role.to_string(),
                r.threads.to_string(),
                known(r.cpus, |c| format!("{c:.2}")),
                pct(r.running_pct),
                pct(r.waiting_pct),
                pct(r.blocked_pct),
                known(r.exec_count, |n| n.to_string()),
                known(r.execs_per_s, |n| format!("{n:.0}")),
                known(r.cpu_per_exec_us, |us| format!("{us:.1}")),
                known(r.wait_per_exec_us, |us| format!("{us:.1}")),
                io_per_exec_cell(r),
            ]);
        }
    }
    Some(t)
}

/// The VM's I/O accesses per execution of a role; "-" where exits are unseen (emulated).
fn io_per_exec_cell(r: &RoleRow) -> String {
    match (r.io_per_exec, r.exec_count) {
        (Some(n), _) => format!("{n:.2}"),
        (None, None) => UNKNOWN.into(),
        (None, Some(_)) => "-".into(),
    }
}

/// A share, or "unknown" without the evidence for it.
fn pct(v: Option<f64>) -> String {
    known(v, |v| format!("{v:.1}"))
}

/// The CSV header of [`log_rows`].
pub const LOG_HEADER: &str = "time_s,window,entity,pid,vm,vcpu,tid,running_pct,waiting_pct,blocked_pct,exec_count,cpu_per_exec_us,wait_per_exec_us,io_count,exits_per_s,role";

/// CSV lines (no header) for every VM, vCPU and thread role (entity `role`, named in the last
/// column: the VMM's main loop, I/O threads, vhost workers, ...) of `report`.
pub fn log_rows(report: &WindowReport, time_s: f64) -> Vec<String> {
    let mut lines = Vec::new();
    // Unknown figures are empty fields, as everywhere in CSV.
    let opt = |v: Option<f64>| v.map(|x| format!("{x:.3}")).unwrap_or_default();
    let n = |v: Option<u64>| v.map(|n| n.to_string()).unwrap_or_default();
    for vm in &report.vms {
        let name = vm.name.replace(|c: char| c == ',' || c == '"' || c.is_control(), "_");
        lines.push(format!(
            "{time_s:.3},{},vm,{},{name},,,{},{},{},{},,,{},{},",
            report.label,
            vm.pid,
            opt(vm.running_pct),
            opt(vm.waiting_pct),
            opt(vm.blocked_pct),
            n(vm.exec_count),
            n(vm.io_count),
            opt(vm.exits_per_s)
        ));
        for v in &vm.vcpus {
            lines.push(format!(
                "{time_s:.3},{},vcpu,{},{name},{},{},{},{},{},{},{},{},{},{},",
                report.label,
                vm.pid,
                v.index,
                v.tid,
                opt(v.running_pct),
                opt(v.waiting_pct),
                opt(v.blocked_pct),
                n(v.exec_count),
                opt(v.cpu_per_exec_us),
                opt(v.wait_per_exec_us),
                n(v.io_count),
                opt(v.exits_per_s)
            ));
        }
        for r in &vm.roles {
            lines.push(format!(
                "{time_s:.3},{},role,{},{name},,,{},{},{},{},{},{},,,{}",
                report.label,
                vm.pid,
                opt(r.running_pct),
                opt(r.waiting_pct),
                opt(r.blocked_pct),
                n(r.exec_count),
                opt(r.cpu_per_exec_us),
                opt(r.wait_per_exec_us),
                r.role
            ));
        }
    }
    lines
}
