//! `--format perfetto`: a Chrome/Perfetto JSON trace (the Trace Event Format) that
//! ui.perfetto.dev and chrome://tracing open. Per VM a process; per vCPU two tracks: its
//! scheduling state (running / waiting / blocked / unknown slices: the sched accounting's own,
//! so they add up to what `sched` reports) and its exits
//! (a slice per timed exit, reason as name). Interval recordings add counter tracks per VM;
//! guests recorded with `record --agent` are processes of their own on the same timeline, a
//! counter track per series (counters as rates). A guest's own trace given beside its host's
//! (`--guest`) is a process too: a track per guest CPU with the guest tasks that ran there and
//! its interrupts, on the host's clock.
//! Layout documented in docs/export.md.

use std::collections::HashMap;
use std::io::Write;

use serde_json::json;
use virtprof_analysis::exits::ExitRow;
use virtprof_analysis::intervals::IntervalTable;
use virtprof_analysis::qos::VmInfo;
use virtprof_analysis::sched::StateSlice;
use virtprof_model::interval::{Entity, SeriesKind};
use virtprof_model::{Pid, Tid, VcpuThread};

/// Exit tracks get thread ids above every real one: `EXIT_TRACK + vCPU tid`.
pub const EXIT_TRACK: u64 = 1 << 32;

/// Microseconds (the format's unit) with nanosecond precision.
fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

/// What the trace file holds.
pub struct Tracks<'a> {
    /// The VMs and their vCPU threads: a process per VM, two tracks per vCPU.
    pub vms: &'a [VmInfo],
    /// The vCPU threads' state slices (the sched accounting's own).
    pub states: &'a [StateSlice],
    /// Timed exits, a slice each.
    pub exits: &'a [ExitRow],
    /// Interval rows, drawn as counter tracks.
    pub table: Option<&'a IntervalTable>,
    /// Guests seen from inside (`record --agent`), placed on the recording's clock: a process
    /// each, beside the VMs.
    pub guests: &'a [virtprof_model::guest::GuestLayer],
    /// Those guests' noise samples: a slice each, on a track per guest CPU in its process;
    /// handed to the visitor a noise period at a time (a guest can fill a recording with
    /// them: they are read as they are written, never all held).
    pub guest_noise: &'a dyn Fn(&mut NoiseVisitor<'_>),
    /// Guests' own traces (`--guest`), placed on the host's clock.
    pub guest_traces: &'a [GuestMachine],
    /// Timestamps are written relative to this.
    pub origin_ns: u64,
}

/// What receives guests' noise periods, one at a time.
pub type NoiseVisitor<'v> = dyn FnMut(virtprof_model::guest::PlacedNoise) + 'v;

/// A guest's own trace: its CPUs' tasks and interrupts.
pub struct GuestMachine {
    /// Its name (the host file's GUEST option).
    pub name: String,
    /// Whether it is on the host's clock (otherwise drawn on its own, and named so).
    pub aligned: bool,
    /// (guest CPU, host thread running it).
    pub vcpu_threads: Vec<(u32, u32)>,
    /// Per guest CPU.
    pub cpus: Vec<virtprof_analysis::guest_tasks::GuestCpu>,
}

/// Guest processes get ids above every real pid: `GUEST_PROCESS + agent`.
pub const GUEST_PROCESS: u64 = 1 << 32;

/// Guest traces' processes: `GUEST_TRACE_PROCESS + index`.
pub const GUEST_TRACE_PROCESS: u64 = 3 << 32;

/// Write the trace as JSON, one event per line.
pub fn write(t: &Tracks<'_>, out: &mut dyn Write) -> crate::Result<()> {
    let vm_of: HashMap<u32, (Pid, u32)> = t
        .vms
        .iter()
        .flat_map(|vm| vm.vcpus.iter().map(move |&VcpuThread { index, tid: Tid(tid) }| (tid, (vm.pid, index))))
        .collect();
    let rel = |ns: u64| us(ns.saturating_sub(t.origin_ns));
    let mut first = true;
    let mut emit = |out: &mut dyn Write, v: serde_json::Value| -> std::io::Result<()> {
        out.write_all(if first { b"\n" } else { b",\n" })?;
        first = false;
        serde_json::to_writer(&mut *out, &v)?;
        Ok(())
    };
    out.write_all(b"{\"displayTimeUnit\":\"ns\",\"traceEvents\":[")?;
    for vm in t.vms {
        emit(
            out,
            json!({"ph": "M", "name": "process_name", "pid": vm.pid, "tid": 0, "args": {"name": format!("VM {} {} ({})", vm.pid, vm.name, vm.kind)}}),
        )?;
        for &VcpuThread { index, tid: Tid(tid) } in &vm.vcpus {
            emit(
                out,
                json!({"ph": "M", "name": "thread_name", "pid": vm.pid, "tid": tid, "args": {"name": format!("vCPU {index} state")}}),
            )?;
            emit(
                out,
                json!({"ph": "M", "name": "thread_sort_index", "pid": vm.pid, "tid": tid, "args": {"sort_index": 2 * index}}),
            )?;
            let exit_tid = EXIT_TRACK + u64::from(tid);
            emit(
                out,
                json!({"ph": "M", "name": "thread_name", "pid": vm.pid, "tid": exit_tid, "args": {"name": format!("vCPU {index} exits")}}),
            )?;
            emit(
                out,
                json!({"ph": "M", "name": "thread_sort_index", "pid": vm.pid, "tid": exit_tid, "args": {"sort_index": 2 * index + 1}}),
            )?;
        }
    }
    for s in t.states {
        let Some(&(pid, _)) = vm_of.get(&s.tid) else { continue };
        emit(
            out,
            json!({"ph": "X", "cat": "state", "name": s.state, "pid": pid, "tid": s.tid, "ts": rel(s.start_ns), "dur": us(s.end_ns - s.start_ns)}),
        )?;
    }
    for x in t.exits {
        let Some(&(pid, _)) = vm_of.get(&x.tid) else { continue };
        let args = json!({"heavyweight": x.heavyweight, "exit_cpu": x.exit_cpu, "entry_cpu": x.entry_cpu, "vmm_ns": x.vmm_ns, "preempted_ns": x.preempted_ns, "blocked_ns": x.blocked_ns, "overhead_ns": x.overhead_ns});
        emit(
            out,
            json!({"ph": "X", "cat": "exit", "name": x.reason, "pid": pid, "tid": EXIT_TRACK + u64::from(x.tid), "ts": rel(x.exit_ts), "dur": us(x.duration_ns), "args": args}),
        )?;
    }
    if let Some(table) = t.table {
        for c in &table.columns {
            let Entity::Vm(pid) = c.series.entity else { continue };
            if c.series.kind != SeriesKind::Delta {
                continue;
            }
            let name = format!("{} /s", c.series.metric);
            for r in 0..table.rows() {
                let v = c.values[r];
                if !v.is_finite() {
                    continue;
                }
                let seconds = table.end_ns[r].saturating_sub(table.start_ns[r]).max(1) as f64 / 1e9;
                emit(
                    out,
                    json!({"ph": "C", "name": name, "pid": pid, "tid": 0, "ts": rel(table.start_ns[r]), "args": {"value": v / seconds}}),
                )?;
            }
        }
    }
    for layer in t.guests {
        let pid = GUEST_PROCESS + u64::from(layer.agent);
        emit(
            out,
            json!({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": format!("guest {} (agent {}, inside view)", layer.name, layer.agent)}}),
        )?;
        for (i, s) in layer.series.iter().enumerate() {
            let (name, per_second) = match s.kind {
                virtprof_model::guest::SeriesKind::Counter => (format!("{} /s", s.name), true),
                virtprof_model::guest::SeriesKind::Gauge => (s.name.clone(), false),
            };
            for r in &layer.rows {
                let Some(v) = r.values.get(i).copied().filter(|v| v.is_finite()) else { continue };
                let seconds = r.end_ns.saturating_sub(r.start_ns).max(1) as f64 / 1e9;
                let value = if per_second { v / seconds } else { v };
                emit(
                    out,
                    json!({"ph": "C", "name": name, "pid": pid, "tid": 0, "ts": rel(r.start_ns), "args": {"value": value}}),
                )?;
            }
        }
    }
    let mut named = std::collections::HashSet::new();
    let mut failed: Option<std::io::Error> = None;
    (t.guest_noise)(&mut |noise| {
        if failed.is_some() {
            return;
        }
        let pid = GUEST_PROCESS + u64::from(noise.agent);
        // Thread 0 holds the guest's counters.
        let tid = u64::from(noise.cpu) + 1;
        let mut period = || -> std::io::Result<()> {
            if named.insert((pid, tid)) {
                emit(
                    out,
                    json!({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": format!("noise CPU {}", noise.cpu)}}),
                )?;
            }
            for &(start, len) in &noise.samples {
                emit(
                    out,
                    json!({"ph": "X", "name": "noise", "pid": pid, "tid": tid, "ts": rel(start), "dur": us(len)}),
                )?;
            }
            Ok(())
        };
        failed = period().err();
    });
    if let Some(e) = failed {
        return Err(e.into());
    }
    for (i, guest) in t.guest_traces.iter().enumerate() {
        let pid = GUEST_TRACE_PROCESS + i as u64;
        let clock = if guest.aligned { "on the host's clock" } else { "NOT aligned: its own clock" };
        emit(
            out,
            json!({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": format!("guest {} (its own trace, {clock})", guest.name)}}),
        )?;
        for cpu in &guest.cpus {
            let tid = u64::from(cpu.cpu) + 1;
            let host = guest.vcpu_threads.iter().find(|&&(c, _)| c == cpu.cpu).map(|&(_, t)| t);
            let name = match host {
                Some(host) => format!("guest CPU {} (host thread {host})", cpu.cpu),
                None => format!("guest CPU {}", cpu.cpu),
            };
            emit(out, json!({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}}))?;
            emit(
                out,
                json!({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": cpu.cpu}}),
            )?;
            for s in &cpu.slices {
                emit(
                    out,
                    json!({"ph": "X", "cat": "guest", "name": s.name, "pid": pid, "tid": tid, "ts": rel(s.start_ns), "dur": us(s.end_ns - s.start_ns), "args": {"guest_tid": s.tid}}),
                )?;
            }
            for (ts, what) in &cpu.irqs {
                emit(
                    out,
                    json!({"ph": "i", "s": "t", "cat": "guest", "name": what, "pid": pid, "tid": tid, "ts": rel(*ts)}),
                )?;
            }
        }
    }
    out.write_all(b"\n]}\n")?;
    out.flush()?;
    Ok(())
}
