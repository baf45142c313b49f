//! What a guest was doing just before each of its long exits: given a guest's own trace placed
//! on the host's clock, the last few guest events on the vCPU that exited, and the guest task
//! running there. Fed the guest's events in one pass; memory is a few events per asked exit.

use std::collections::{HashMap, VecDeque};

use serde::Serialize;
use virtprof_model::{Event, EventKind};

use crate::{Analyzer, Names};

/// Guest events kept per exit.
pub const EVENTS_BEFORE: usize = 4;

/// Guest events further back than this are not "just before" an exit.
pub const WINDOW_NS: u64 = 10_000_000;

/// The guest's side of one exit (`rows[].guest_before` in `exits --json`).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct GuestContext {
    /// The guest CPU the exiting vCPU runs.
    pub guest_cpu: u32,
    /// The guest task on it (from the guest's last sched_switch there; None before one).
    pub task: Option<String>,
    /// Its thread id in the guest.
    pub task_tid: Option<u32>,
    /// The last guest events on that CPU within [`WINDOW_NS`], oldest first.
    pub events: Vec<GuestEvent>,
}

/// One guest event before an exit.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct GuestEvent {
    /// How long before the exit, ns.
    pub before_ns: u64,
    /// The guest kernel's event name.
    pub event: String,
    /// The guest thread it fired in.
    pub tid: u32,
}

/// One exit asked about: its guest CPU, when it left the guest (host clock), and its row.
#[derive(Debug, Clone, Copy)]
pub struct Exit {
    /// Guest CPU of the exiting vCPU.
    pub guest_cpu: u32,
    /// Exit time on the host's clock.
    pub ts: u64,
    /// Index of the answer in [`GuestBefore::finish`].
    pub row: usize,
}

#[derive(Default)]
struct CpuWatch {
    recent: VecDeque<(u64, String, u32)>,
    task: Option<(String, u32)>,
    /// Exits on this CPU in time order, and the next one to answer.
    exits: Vec<Exit>,
    next: usize,
}

/// Push-fed: guest events in host time, per CPU in order.
pub struct GuestBefore {
    cpus: HashMap<u32, CpuWatch>,
    answers: Vec<Option<GuestContext>>,
    /// The guest trace's first and last event: exits outside it get no answer (the guest was
    /// not traced then).
    span: Option<(u64, u64)>,
}

impl GuestBefore {
    /// Watch for `exits` (one answer per `row` index below `rows`).
    pub fn new(mut exits: Vec<Exit>, rows: usize) -> GuestBefore {
        exits.sort_by_key(|e| e.ts);
        let mut cpus: HashMap<u32, CpuWatch> = HashMap::new();
        for exit in exits.into_iter().filter(|e| e.row < rows) {
            cpus.entry(exit.guest_cpu).or_default().exits.push(exit);
        }
        GuestBefore { cpus, answers: vec![None; rows], span: None }
    }

    /// Each asked exit's guest context (None for rows not asked about).
    pub fn finish(mut self) -> Vec<Option<GuestContext>> {
        let last = self.span.map_or(0, |(_, last)| last);
        for watch in self.cpus.values_mut() {
            while watch.exits.get(watch.next).is_some_and(|x| x.ts <= last) {
                answer(watch, &mut self.answers);
            }
        }
        // Exits before the guest's first event: it was not traced yet.
        let first = self.span.map_or(u64::MAX, |(first, _)| first);
        for watch in self.cpus.values() {
            for exit in watch.exits.iter().filter(|x| x.ts < first) {
                self.answers[exit.row] = None;
            }
        }
        self.answers
    }
}

impl Analyzer for GuestBefore {
    fn on_event(&mut self, e: &Event, names: &dyn Names) {
        self.span = Some(self.span.map_or((e.ts, e.ts), |(first, last)| (first.min(e.ts), last.max(e.ts))));
        let Some(watch) = self.cpus.get_mut(&e.cpu) else { return };
        while watch.exits.get(watch.next).is_some_and(|x| x.ts < e.ts) {
            answer(watch, &mut self.answers);
        }
        let event = match e.kind {
            EventKind::Lost { .. } => "(events lost)".to_string(),
            EventKind::Other { event } => names.event(event),
            kind => kind.typed_name().unwrap_or("?").to_string(),
        };
        if watch.recent.len() == EVENTS_BEFORE {
            watch.recent.pop_front();
        }
        watch.recent.push_back((e.ts, event, e.tid));
        if let EventKind::SchedSwitch { next_tid, next_comm, .. } = e.kind {
            watch.task = Some((names.task(next_comm), next_tid));
        }
    }
}

fn answer(watch: &mut CpuWatch, answers: &mut [Option<GuestContext>]) {
    let exit = watch.exits[watch.next];
    watch.next += 1;
    let events = watch
        .recent
        .iter()
        .filter(|(ts, ..)| *ts <= exit.ts && exit.ts - ts <= WINDOW_NS)
        .map(|(ts, event, tid)| GuestEvent { before_ns: exit.ts - ts, event: event.clone(), tid: *tid })
        .collect();
    answers[exit.row] = Some(GuestContext {
        guest_cpu: exit.guest_cpu,
        task: watch.task.as_ref().map(|(name, _)| name.clone()),
        task_tid: watch.task.as_ref().map(|&(_, tid)| tid),
        events,
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use virtprof_model::StrId;

    fn at(ts: u64, cpu: u32, kind: EventKind) -> Event {
        Event { ts, cpu, tid: 9, kind }
    }

    #[test]
    fn each_exit_gets_the_last_guest_events_of_its_cpu_before_it() {
        let exits = vec![
            Exit { guest_cpu: 1, ts: 1_000, row: 0 },
            Exit { guest_cpu: 0, ts: 5_000, row: 2 },
            Exit { guest_cpu: 1, ts: 50_000_000, row: 1 },
            Exit { guest_cpu: 0, ts: 50, row: 3 },
            Exit { guest_cpu: 0, ts: 90_000_000, row: 4 },
        ];
        let mut g = GuestBefore::new(exits, 5);
        let switch = EventKind::SchedSwitch {
            prev_tid: 0,
            prev_state: 0,
            prev_comm: StrId(1),
            next_tid: 42,
            next_comm: StrId(2),
        };
        for (ts, cpu, kind) in [
            (100, 1, switch),
            (200, 0, EventKind::Other { event: 7 }),
            (300, 1, EventKind::Other { event: 8 }),
            (400, 1, EventKind::Other { event: 9 }),
            (500, 1, EventKind::Other { event: 9 }),
            (900, 1, EventKind::Other { event: 10 }),
            (2_000, 1, EventKind::Other { event: 11 }),
            (60_000_000, 1, EventKind::Other { event: 12 }),
        ] {
            g.on_event(&at(ts, cpu, kind), &crate::TestNames);
        }
        let got = g.finish();
        let first = got[0].as_ref().unwrap();
        assert_eq!((first.guest_cpu, first.task.as_deref(), first.task_tid), (1, Some("task2"), Some(42)));
        let names: Vec<_> = first.events.iter().map(|e| (e.before_ns, e.event.as_str())).collect();
        assert_eq!(names, [(700, "event8"), (600, "event9"), (500, "event9"), (100, "event10")]);
        // 48 ms after the last event: nothing "just before", but the task is known.
        let late = got[1].as_ref().unwrap();
        assert!(late.events.is_empty() && late.task.is_some(), "{late:?}");
        // CPU 0 saw no sched_switch: its task is unknown.
        let other = got[2].as_ref().unwrap();
        assert_eq!((other.task.as_deref(), other.events.len()), (None, 1));
        // Before the guest's first event and after its last, the guest was not traced.
        assert_eq!((&got[3], &got[4]), (&None, &None));
    }
}
