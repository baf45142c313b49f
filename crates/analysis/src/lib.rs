//! virtprof's analyzers: pure functions from the event stream to tables. They never touch the
//! system (no clocks, files or threads), so every analyzer runs identically live, on a
//! recording, or in a test. Names (exit reasons, task names) come through [`Names`], which the
//! caller implements over its decoder.
#![deny(missing_docs)]

pub mod balance;
pub mod balancer;
pub mod bins;
pub mod contention;
pub mod correlate;
pub mod energy;
pub mod exit_timeline;
pub mod exits;
pub mod explain;
pub mod guest_before;
pub mod guest_cpus;
pub mod guest_tasks;
pub mod hist;
pub mod intervals;
pub mod memory;
pub mod noise;
pub mod pcprof;
pub mod phases;
pub mod qos;
pub mod sched;
pub mod symbols;
pub mod thread_parents;

use virtprof_model::{Event, StrId};

/// One consumer of the event stream. A driver walks a source once
/// (`virtprof_session::Session::analyse`, or a live trace's drain) and hands every event, in
/// timestamp order, to each analyzer it was given; each keeps what it needs and gives its
/// results through its own methods afterwards, since their types differ.
pub trait Analyzer {
    /// Take one event; `names` resolves what the analyzer needs named.
    fn on_event(&mut self, event: &Event, names: &dyn Names);
}

/// Any closure over events is an analyzer (a sink that collects or writes them).
impl<F: FnMut(&Event, &dyn Names)> Analyzer for F {
    fn on_event(&mut self, event: &Event, names: &dyn Names) {
        self(event, names);
    }
}

/// How analyzers turn raw codes into the names the recorded kernel uses.
pub trait Names {
    /// Name of a `kvm_exit` reason (`npf`, `EPT_VIOLATION`, ...).
    fn exit_reason(&self, reason: u32, isa: u32) -> String;
    /// Name of a `kvm_userspace_exit` reason (`KVM_EXIT_IO`, ...).
    fn userspace_reason(&self, reason: u32) -> String;
    /// Name of an event id (`kvm_cpuid`).
    fn event(&self, id: u16) -> String;
    /// A task name.
    fn task(&self, id: StrId) -> String;
}

/// A switch from the idle task to `next_tid`, named `task{next_comm}` by [`TestNames`].
#[cfg(test)]
pub(crate) fn switch_to(next_tid: u32, next_comm: u32) -> virtprof_model::EventKind {
    virtprof_model::EventKind::SchedSwitch {
        prev_tid: 0,
        prev_state: 0,
        prev_comm: StrId(0),
        next_tid,
        next_comm: StrId(next_comm),
    }
}

/// Names for unit tests: `event7`, `task3`.
#[cfg(test)]
pub(crate) struct TestNames;

#[cfg(test)]
impl Names for TestNames {
    fn exit_reason(&self, reason: u32, _: u32) -> String {
        format!("r{reason}")
    }
    fn userspace_reason(&self, reason: u32) -> String {
        format!("KVM_EXIT_{reason}")
    }
    fn event(&self, id: u16) -> String {
        format!("event{id}")
    }
    fn task(&self, id: StrId) -> String {
        format!("task{}", id.0)
    }
}
