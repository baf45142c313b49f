//! Process and host plumbing shared by every part of virtprof: the stop request and its
//! signals, CLOCK_MONOTONIC, CPU affinity, schedstat, /proc scans, and the host kind. No KVM, no tracing:
//! the facts about this process and this machine those build on.
#![deny(missing_docs)]

pub mod affinity;
pub mod clock;
pub mod kind;
pub mod procfs;
pub mod schedstat;
pub mod stop;

pub use clock::{monotonic_ns, sleep_until};
pub use schedstat::{read_schedstat, Schedstat};
