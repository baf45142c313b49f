//! What runs inside the micro-VMs: the memory map, the CPU state that puts a vCPU in 64-bit
//! long mode at CPL3 (or CPL0), and the workload programs.

pub mod arm64;
pub mod boot;
pub mod layout;
pub mod program;
pub mod workload;

pub use program::{GuestProgram, ProgramBuilder, Symbol};
pub use workload::{Bound, Phase, Privilege, Script, Workload, SYNC_ROUNDS};
