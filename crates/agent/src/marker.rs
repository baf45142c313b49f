//! `agent --marker-port PORT`: each row, one byte written to an x86 I/O port between two reads
//! of the guest's CLOCK_MONOTONIC. In a VM that write is an exit the host traces
//! (`kvm:kvm_pio`) at a host time that must fall between the two guest reads once they are
//! mapped onto the host's clock: a check of the clock alignment against an event both sides
//! see, independent of the exchanges the alignment was measured with.
//!
//! The write goes through `/dev/port` (the kernel's OUT at CPL0) rather than `ioperm` and an
//! OUT in user mode: that needs no per-thread permission bitmap, which one emulated nested
//! bed here gets wrong (the user-mode OUT faults there).

use std::fs::File;
use std::os::unix::fs::FileExt;

use virtprof_host::monotonic_ns;

/// The port writer.
#[derive(Debug)]
pub struct Marker {
    dev: File,
    port: u16,
    seq: u8,
}

impl Marker {
    /// Open `/dev/port` for `port` (root or CAP_SYS_RAWIO).
    pub fn open(port: u16) -> std::io::Result<Marker> {
        let dev = std::fs::OpenOptions::new().write(true).open("/dev/port").map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("/dev/port: {e} (needs root or CAP_SYS_RAWIO, and an x86 kernel with CONFIG_DEVPORT)"),
            )
        })?;
        Ok(Marker { dev, port, seq: 0 })
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Write the next byte; the guest times just before and just after (None if the write
    /// failed: no marker this row).
    pub fn write(&mut self) -> Option<(u64, u64)> {
        self.seq = self.seq.wrapping_add(1);
        let before = monotonic_ns();
        let written = self.dev.write_at(&[self.seq], u64::from(self.port)).ok()?;
        (written == 1).then(|| (before, monotonic_ns()))
    }
}
