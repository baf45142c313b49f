//! `--format perfetto`: a Chrome/Perfetto JSON trace (the Trace Event Format) that
//! ui.perfetto.dev and chrome://tracing open. Per VM a process; per vCPU two tracks: its
//! scheduling state (running / waiting / blocked slices from the sched trace) and its exits
//! (a slice per timed exit, reason as name). Interval recordings add counter tracks per VM.
//! Layout documented in docs/export.md.

use std::collections::HashMap;
use std::io::Write;

use serde_json::json;
use virtprof_analysis::exits::ExitRow;
use virtprof_analysis::intervals::IntervalTable;
use virtprof_analysis::qos::VmInfo;
use virtprof_analysis::sched::preempted;
use virtprof_model::interval::{Entity, SeriesKind};
use virtprof_model::{Event, EventKind};

/// Exit tracks get thread ids above every real one: `EXIT_TRACK + vCPU tid`.
pub const EXIT_TRACK: u64 = 1 << 32;

/// Where a vCPU thread is, for its state track.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Running,
    Waiting,
    Blocked,
}

impl State {
    fn name(self) -> &'static str {
        match self {
            State::Running => "running",
            State::Waiting => "waiting",
            State::Blocked => "blocked",
        }
    }
}

/// One state slice of a vCPU thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateSlice {
    pub tid: u32,
    pub state: &'static str,
    pub start_ns: u64,
    pub end_ns: u64,
}

/// Turns sched events into state slices per vCPU thread. A thread's first slice starts at the
/// first event that tells its state.
#[derive(Debug, Default)]
pub struct StateTracks {
    current: HashMap<u32, (State, u64)>,
    vcpus: HashMap<u32, u32>,
    /// Finished slices, in the order they ended.
    pub slices: Vec<StateSlice>,
}

impl StateTracks {
    /// Track these threads (vCPU tid → VM pid).
    pub fn new(vcpus: HashMap<u32, u32>) -> Self {
        StateTracks { vcpus, ..Default::default() }
    }

    fn enter(&mut self, tid: u32, state: State, ts: u64) {
        if !self.vcpus.contains_key(&tid) {
            return;
        }
        match self.current.insert(tid, (state, ts)) {
            Some((was, since)) if was != state => {
                self.slices.push(StateSlice { tid, state: was.name(), start_ns: since, end_ns: ts })
            }
            // The same state again (a wakeup of a runnable thread): keep the earlier start.
            Some((was, since)) => {
                self.current.insert(tid, (was, since));
            }
            None => {}
        }
    }

    /// Feed one event (in timestamp order).
    pub fn on_event(&mut self, e: &Event) {
        // A thread that emits an event runs, whatever the sched trace showed (as the
        // accounting does: dispatches the trace misses are inferred).
        if !matches!(e.kind, EventKind::SchedSwitch { .. } | EventKind::SchedWakeup { .. })
            && self.current.get(&e.tid).is_some_and(|(s, _)| *s != State::Running)
        {
            self.enter(e.tid, State::Running, e.ts);
        }
        match e.kind {
            EventKind::SchedSwitch { prev_tid, prev_state, next_tid, .. } => {
                match preempted(prev_state) {
                    Some(true) => self.enter(prev_tid, State::Waiting, e.ts),
                    Some(false) => self.enter(prev_tid, State::Blocked, e.ts),
                    None => self.close(prev_tid, e.ts),
                }
                self.enter(next_tid, State::Running, e.ts);
            }
            EventKind::SchedWakeup { tid, .. } if self.current.get(&tid).is_none_or(|(s, _)| *s == State::Blocked) => {
                self.enter(tid, State::Waiting, e.ts);
            }
            _ => {}
        }
    }

    fn close(&mut self, tid: u32, ts: u64) {
        if let Some((state, since)) = self.current.remove(&tid) {
            self.slices.push(StateSlice { tid, state: state.name(), start_ns: since, end_ns: ts });
        }
    }

    /// Close every open slice at `ts` (the end of the trace).
    pub fn finish(&mut self, ts: u64) {
        let mut open: Vec<u32> = self.current.keys().copied().collect();
        open.sort_unstable();
        for tid in open {
            self.close(tid, ts);
        }
    }
}

/// Microseconds (the format's unit) with nanosecond precision.
fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

/// What the trace file holds.
pub struct Tracks<'a> {
    pub vms: &'a [VmInfo],
    pub states: &'a [StateSlice],
    pub exits: &'a [ExitRow],
    pub table: Option<&'a IntervalTable>,
    /// Timestamps are written relative to this.
    pub origin_ns: u64,
}

/// Write the trace as JSON, one event per line.
pub fn write(t: &Tracks<'_>, out: &mut dyn Write) -> anyhow::Result<()> {
    let vm_of: HashMap<u32, (u32, u32)> =
        t.vms.iter().flat_map(|vm| vm.vcpus.iter().map(move |&(index, tid)| (tid, (vm.pid, index)))).collect();
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
        for &(index, tid) in &vm.vcpus {
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
    out.write_all(b"\n]}\n")?;
    out.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use virtprof_model::StrId;

    fn switch(ts: u64, prev: u32, prev_state: u64, next: u32) -> Event {
        let kind = EventKind::SchedSwitch {
            prev_tid: prev,
            prev_state,
            prev_comm: StrId(0),
            next_tid: next,
            next_comm: StrId(0),
        };
        Event { ts, cpu: 0, tid: prev, kind }
    }

    #[test]
    fn states_follow_switches_and_wakeups() {
        let mut t = StateTracks::new([(7, 100)].into_iter().collect());
        t.on_event(&switch(10, 0, 0, 7)); // 7 runs
        t.on_event(&switch(20, 7, 0, 9)); // preempted: waiting
        t.on_event(&switch(30, 9, 1, 7)); // runs again
        t.on_event(&switch(40, 7, 1, 0)); // sleeps: blocked
        t.on_event(&Event { ts: 55, cpu: 0, tid: 0, kind: EventKind::SchedWakeup { tid: 7, target_cpu: 0 } });
        // Its own event while the trace shows it waiting: it runs (a dispatch the trace missed).
        t.on_event(&Event { ts: 58, cpu: 1, tid: 7, kind: EventKind::KvmFpu { load: true } });
        t.finish(60);
        let got: Vec<(&str, u64, u64)> = t.slices.iter().map(|s| (s.state, s.start_ns, s.end_ns)).collect();
        assert_eq!(
            got,
            [
                ("running", 10, 20),
                ("waiting", 20, 30),
                ("running", 30, 40),
                ("blocked", 40, 55),
                ("waiting", 55, 58),
                ("running", 58, 60)
            ]
        );
    }
}
