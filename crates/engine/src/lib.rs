//! What the commands run, apart from how they are asked and how they print: the live sampler
//! `top`, `serve` and `demo` refresh ([`sampler`], with the guests' links in [`guests`] and the
//! host's VMs in [`tasks`]), the recorder `record` and the live modes write with
//! ([`recorder`]), the in-kernel eBPF counts ([`kernel_counts`]) and the exit table made from them ([`kernel_exits`]), the one analysis pass the reading commands share ([`pass`]) and the report
//! built from it ([`report`]), the boot profiler's sample sources ([`boot`]), the live energy balancer ([`balance`]) with its energy model and
//! RAPL ([`energy`]), each vCPU thread's VM ([`vcpu_vms`]) and test VMs other commands start
//! ([`testvms`]); the agent link's and scrapers' token ([`token`]). Errors the user can fix are [`UsageError`]s (exit code 2).

pub mod balance;
pub mod boot;
mod bpf_maps;
pub mod energy;
pub mod explain;
pub mod guest_view;
pub mod guests;
pub mod kernel_counts;
pub mod kernel_exits;
pub mod pass;
pub mod recorder;
pub mod report;
pub mod sampler;
pub mod tasks;
pub mod testvms;
pub mod token;
mod usage;
pub mod vcpu_vms;

pub use usage::{usage, UsageError};
