//! The sources of virtprof's pipeline, opened one way (SPEC §2: sources → decode → events):
//! a [`Session`] holds a recording, a trace-cmd trace.dat, a tracefs dump or ftrace text as
//! per-CPU page streams with its metadata (tasks, VMs, clock), a decoder for its kernel's
//! formats, and its [`Loss`](virtprof_model::Loss); a [`LiveTrace`] does the same for a
//! private tracefs instance while it runs. Both count lost events the same way, once.
#![deny(missing_docs)]

mod backing;
pub mod error;
pub mod guest;
pub mod guest_trace;
pub mod import;
pub mod live;
pub mod names;
pub mod perfdata;
pub mod session;

pub use error::{Result, SessionError};
pub use guest_trace::GuestTrace;
pub use import::SourceOptions;
pub use live::LiveTrace;
pub use names::{evidence_event_ids, DecoderNames, EVIDENCE_EVENTS};
pub use session::Session;
