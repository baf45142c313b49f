//! KVM binary statistics (`KVM_GET_STATS_FD`, Linux ≥ 5.14), for VMs and vCPUs.
//!
//! The stats fd is self-describing: a header, then one descriptor per statistic (name, type,
//! unit, size), then the values. We read descriptors once and values by `pread` as often as
//! needed, so polling costs one syscall per snapshot. Works on any VM or vCPU fd, including one
//! borrowed from another process (see [`crate::remote`]).

use std::collections::BTreeMap;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::fs::FileExt;

use crate::error::StatsError;

/// `KVM_GET_STATS_FD` = `_IO(KVMIO, 0xce)`.
const KVM_GET_STATS_FD: libc::c_ulong = 0xae_ce;
const HEADER_SIZE: usize = 24;
const DESC_FIXED_SIZE: usize = 16;

/// What kind of quantity a statistic is (low 4 bits of the descriptor flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatKind {
    /// A counter that only grows: deltas are meaningful.
    Cumulative,
    /// A current value (e.g. pages in use).
    Instant,
    /// A high-water mark.
    Peak,
    /// A histogram with linear buckets.
    LinearHistogram,
    /// A histogram with log2 buckets.
    LogHistogram,
    /// A type this virtprof does not know yet.
    Other(u32),
}

/// One statistic's descriptor.
#[derive(Debug, Clone)]
pub struct StatDesc {
    /// The kernel's name, e.g. `exits`, `io_exits`, `halt_poll_success_ns`.
    pub name: String,
    /// Counter, instant value, peak or histogram.
    pub kind: StatKind,
    /// Unit exponent (base 10 or 2, see `flags`); `-9` for nanosecond stats.
    pub exponent: i16,
    /// Number of u64 values (1, or the bucket count of a histogram).
    pub size: u16,
    offset: u32,
}

/// A readable stats fd with its descriptors parsed.
#[derive(Debug)]
pub struct StatsFd {
    file: File,
    data_offset: u64,
    descs: Vec<StatDesc>,
}

impl StatsFd {
    /// Open the stats fd of a VM or vCPU file descriptor (ours or borrowed).
    pub fn open(kvm_fd: RawFd) -> Result<Self, StatsError> {
        // SAFETY: KVM_GET_STATS_FD takes no argument and returns a new fd or -1.
        let fd = unsafe { libc::ioctl(kvm_fd, KVM_GET_STATS_FD as _) };
        if fd < 0 {
            return Err(StatsError::Ioctl(std::io::Error::last_os_error()));
        }
        // SAFETY: `fd` is a fresh descriptor returned by the kernel that nothing else owns.
        let file = unsafe { File::from_raw_fd(fd) };
        Self::from_file(file)
    }

    /// Parse header and descriptors from an already opened stats fd.
    pub fn from_file(file: File) -> Result<Self, StatsError> {
        let mut header = [0u8; HEADER_SIZE];
        file.read_exact_at(&mut header, 0).map_err(StatsError::Read)?;
        let word = |i: usize| u32::from_ne_bytes(header[i * 4..i * 4 + 4].try_into().unwrap());
        let (name_size, num_desc, desc_offset, data_offset) =
            (word(1) as usize, word(2) as usize, word(4) as u64, word(5) as u64);
        if num_desc > 65_536 || name_size > 4096 {
            return Err(StatsError::Malformed(format!("header says {num_desc} descriptors of name size {name_size}")));
        }
        let desc_size = DESC_FIXED_SIZE + name_size;
        let mut raw = vec![0u8; desc_size * num_desc];
        file.read_exact_at(&mut raw, desc_offset).map_err(StatsError::Read)?;
        let descs = raw.chunks_exact(desc_size).map(parse_desc).collect();
        Ok(StatsFd { file, data_offset, descs })
    }

    /// The statistics this kernel exports, in the kernel's order.
    pub fn descriptors(&self) -> &[StatDesc] {
        &self.descs
    }

    /// Read every scalar statistic (histograms are summed over their buckets).
    pub fn read(&self) -> Result<StatsSnapshot, StatsError> {
        let (mut scratch, mut sums) = (Vec::new(), Vec::new());
        self.read_into(&mut scratch, &mut sums)?;
        Ok(StatsSnapshot { values: self.descs.iter().map(|d| d.name.clone()).zip(sums).collect() })
    }

    /// Read every statistic into `out`, one value per descriptor in order (histograms summed),
    /// with `scratch` as the read buffer: once both are sized, polling allocates nothing.
    pub fn read_into(&self, scratch: &mut Vec<u8>, out: &mut Vec<u64>) -> Result<(), StatsError> {
        let words: usize = self.descs.iter().map(|d| d.offset as usize / 8 + d.size as usize).max().unwrap_or(0);
        scratch.resize(words * 8, 0);
        self.file.read_exact_at(scratch, self.data_offset).map_err(StatsError::Read)?;
        let value = |i: usize| u64::from_ne_bytes(scratch[i * 8..i * 8 + 8].try_into().unwrap());
        out.clear();
        out.extend(self.descs.iter().map(|d| {
            let first = d.offset as usize / 8;
            (first..first + d.size as usize).map(value).fold(0u64, u64::wrapping_add)
        }));
        Ok(())
    }

    /// Names of the cumulative statistics (the ones whose deltas mean "how many happened").
    pub fn cumulative_names(&self) -> impl Iterator<Item = &str> {
        self.descs.iter().filter(|d| d.kind == StatKind::Cumulative).map(|d| d.name.as_str())
    }
}

impl AsRawFd for StatsFd {
    fn as_raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }
}

fn parse_desc(raw: &[u8]) -> StatDesc {
    let flags = u32::from_ne_bytes(raw[0..4].try_into().unwrap());
    let exponent = i16::from_ne_bytes(raw[4..6].try_into().unwrap());
    let size = u16::from_ne_bytes(raw[6..8].try_into().unwrap());
    let offset = u32::from_ne_bytes(raw[8..12].try_into().unwrap());
    let name_bytes = &raw[DESC_FIXED_SIZE..];
    let len = name_bytes.iter().position(|&b| b == 0).unwrap_or(name_bytes.len());
    let kind = match flags & 0xf {
        0 => StatKind::Cumulative,
        1 => StatKind::Instant,
        2 => StatKind::Peak,
        3 => StatKind::LinearHistogram,
        4 => StatKind::LogHistogram,
        other => StatKind::Other(other),
    };
    StatDesc { name: String::from_utf8_lossy(&name_bytes[..len]).into_owned(), kind, exponent, size, offset }
}

/// Values of every statistic at one moment, by name.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StatsSnapshot {
    /// Statistic name → value (histograms: sum of buckets).
    pub values: BTreeMap<String, u64>,
}

impl StatsSnapshot {
    /// One statistic (None if the kernel does not export it).
    pub fn get(&self, name: &str) -> Option<u64> {
        self.values.get(name).copied()
    }

    /// `self - earlier` for the cumulative statistics named in `names`.
    pub fn delta<'a>(&self, earlier: &StatsSnapshot, names: impl Iterator<Item = &'a str>) -> BTreeMap<String, u64> {
        names
            .filter_map(|name| {
                let now = self.get(name)?;
                let then = earlier.get(name).unwrap_or(0);
                Some((name.to_string(), now.saturating_sub(then)))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desc_bytes(flags: u32, size: u16, offset: u32, name: &str, name_size: usize) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&flags.to_ne_bytes());
        v.extend_from_slice(&0i16.to_ne_bytes());
        v.extend_from_slice(&size.to_ne_bytes());
        v.extend_from_slice(&offset.to_ne_bytes());
        v.extend_from_slice(&0u32.to_ne_bytes());
        let mut n = name.as_bytes().to_vec();
        n.resize(name_size, 0);
        v.extend_from_slice(&n);
        v
    }

    #[test]
    fn parses_a_synthetic_stats_file() {
        let name_size = 48;
        let descs = [desc_bytes(0, 1, 0, "exits", name_size), desc_bytes(4, 2, 8, "halt_wait_hist", name_size)];
        let desc_offset = 24u32;
        let data_offset = desc_offset + (descs.len() * (16 + name_size)) as u32;
        let mut file = Vec::new();
        for w in [0u32, name_size as u32, 2, 0, desc_offset, data_offset] {
            file.extend_from_slice(&w.to_ne_bytes());
        }
        descs.iter().for_each(|d| file.extend_from_slice(d));
        for v in [42u64, 3, 4] {
            file.extend_from_slice(&v.to_ne_bytes());
        }
        let path = std::env::temp_dir().join(format!("virtprof-stats-test-{}", std::process::id()));
        std::fs::write(&path, &file).unwrap();
        let stats = StatsFd::from_file(File::open(&path).unwrap()).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(stats.descriptors().len(), 2);
        assert_eq!(stats.descriptors()[1].kind, StatKind::LogHistogram);
        let snap = stats.read().unwrap();
        assert_eq!(snap.get("exits"), Some(42));
        assert_eq!(snap.get("halt_wait_hist"), Some(7));
        assert_eq!(stats.cumulative_names().collect::<Vec<_>>(), ["exits"]);
    }
}
