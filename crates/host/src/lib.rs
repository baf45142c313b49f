//! Process and host plumbing shared by every part of virtprof: the stop request and its
//! signals, input files checked before they are read, output files put in place only when whole, CLOCK_MONOTONIC, CPU affinity, schedstat, /proc scans, and the host kind. No KVM, no tracing:
//! the facts about this process and this machine those build on.
#![deny(missing_docs)]

pub mod affinity;
pub mod clock;
pub mod fuzz;
pub mod input;
pub mod kind;
pub mod osnoise;
pub mod output;
pub mod procfiles;
pub mod procfs;
pub mod reaper;
pub mod schedstat;
pub mod stop;
pub mod triggers;

pub use clock::{monotonic_ns, sleep_until, sleep_until_or_stop};
pub use schedstat::{read_schedstat, Schedstat};
