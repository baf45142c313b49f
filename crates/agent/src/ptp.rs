//! The guest's ptp_kvm clock, where it has one: `PTP_SYS_OFFSET_PRECISE` returns the host's
//! CLOCK_REALTIME as KVM's clock pairing read it, cross-timestamped with the guest's own
//! CLOCK_REALTIME at the same TSC value. Converted to the guest's CLOCK_MONOTONIC, that is a
//! clock point with a bound of tens of nanoseconds instead of half a round trip; the host
//! converts the realtime side to its own monotonic clock when it receives it.

use std::fs::File;
use std::os::fd::AsRawFd;

use virtprof_host::clock::realtime_minus_monotonic;

use crate::wire::PtpPair;

/// `struct ptp_clock_time` (linux/ptp_clock.h).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct PtpClockTime {
    sec: i64,
    nsec: u32,
    reserved: u32,
}

/// `struct ptp_sys_offset_precise`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct PtpSysOffsetPrecise {
    device: PtpClockTime,
    sys_realtime: PtpClockTime,
    sys_monoraw: PtpClockTime,
    rsv: [u32; 4],
}

/// `PTP_SYS_OFFSET_PRECISE`: `_IOWR('=', 8, struct ptp_sys_offset_precise)`.
const PTP_SYS_OFFSET_PRECISE: libc::c_ulong = (3 << 30) | (64 << 16) | ((b'=' as libc::c_ulong) << 8) | 8;

/// An open ptp_kvm clock.
#[derive(Debug)]
pub struct PtpKvm {
    dev: File,
}

impl PtpKvm {
    /// Open `path` (a `/dev/ptpN` whose clock is KVM's) and read it once to see it works.
    pub fn open(path: &str) -> std::io::Result<PtpKvm> {
        let dev = File::open(path)?;
        let clock = PtpKvm { dev };
        clock.read()?;
        Ok(clock)
    }

    /// One reading.
    pub fn read(&self) -> std::io::Result<PtpPair> {
        let mut x = PtpSysOffsetPrecise::default();
        // SAFETY: the request takes a pointer to a `ptp_sys_offset_precise`, which `x` is
        // (repr(C), 64 bytes as the request number encodes), and only writes into it.
        if unsafe { libc::ioctl(self.dev.as_raw_fd(), PTP_SYS_OFFSET_PRECISE, &mut x) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let (realtime_minus_mono, uncertainty_ns) = realtime_minus_monotonic();
        let ns = |t: PtpClockTime| i128::from(t.sec) * 1_000_000_000 + i128::from(t.nsec);
        let guest = ns(x.sys_realtime) - i128::from(realtime_minus_mono);
        let to_u64 = |v: i128| u64::try_from(v).map_err(|_| std::io::Error::other("a ptp time before the epoch"));
        Ok(PtpPair { guest_ns: to_u64(guest)?, host_realtime_ns: to_u64(ns(x.device))?, uncertainty_ns })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_number_is_the_kernels() {
        assert_eq!(std::mem::size_of::<PtpSysOffsetPrecise>(), 64);
        assert_eq!(PTP_SYS_OFFSET_PRECISE, 0xc040_3d08);
    }
}
