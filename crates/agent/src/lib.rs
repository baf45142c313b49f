//! `virtprof agent`: a real Linux guest seen from inside, on the host's timeline.
//!
//! - [`wire`]: the frames agent and host exchange (sans I/O).
//! - [`clock`]: NTP-style exchanges → the guest-to-host clock mapping and its check.
//! - [`appcounters`]: the counter file any program can publish.
//! - [`collect`]: what the agent samples in the guest each interval.
//! - [`noise`]: the OS-noise loop on chosen guest CPUs (`agent --noise`).
//! - [`marker`]: I/O port writes the host traces, to check the clock alignment.
//! - [`ptp`]: the guest's ptp_kvm clock, which aligns it far tighter than exchanges.
//! - [`transport`]: vsock, virtio-serial and TCP addresses, listened on and connected to.
//! - [`serve`]: the agent's loop in the guest.
//! - [`limits`]: what a guest may send the host (rates, a byte cap, series), whatever it claims.
//! - [`link`]: the host's side of one agent: connect, align clocks, receive rows, report gaps.

pub mod appcounters;
pub mod clock;
pub mod collect;
pub mod limits;
pub mod link;
pub mod marker;
pub mod noise;
pub mod ptp;
pub mod serve;
pub mod transport;
pub mod wire;
