//! Whole eBPF hash maps read in a few system calls.
//!
//! Iterating a map through aya takes two `bpf()` calls per entry (the next key, then its
//! value): with hundreds of vCPU threads that was a fifth of a live view's refresh.
//! `BPF_MAP_LOOKUP_BATCH` (Linux 5.6 on) copies many entries per call; where the kernel lacks
//! it, the caller iterates as before.

use std::io;
use std::mem::size_of;
use std::os::fd::{AsFd, AsRawFd};

use aya::maps::MapData;
use aya::Pod;

/// `enum bpf_cmd`'s `BPF_MAP_LOOKUP_BATCH`.
const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
/// Entries asked for per call.
const CHUNK: usize = 256;

/// `union bpf_attr` as the batch commands read it.
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// Every entry of hash map `map`, whose keys are `K` and values `V` (the caller has checked
/// the sizes, e.g. by making an aya `HashMap` of it first). None where the kernel has no batch
/// lookup for it.
pub fn entries<K: Pod, V: Pod>(map: &MapData) -> io::Result<Option<Vec<(K, V)>>> {
    let fd = map.fd().as_fd().as_raw_fd();
    let map_fd = u32::try_from(fd).map_err(|_| io::Error::other("bad map fd"))?;
    let mut out = Vec::new();
    // The hash map's cursor is a bucket number; room for a key of any size is given anyway.
    let (mut cursor, mut next) = ([0u64; 64], [0u64; 64]);
    let mut first = true;
    let mut chunk = CHUNK;
    loop {
        let mut keys: Vec<K> = Vec::with_capacity(chunk);
        let mut values: Vec<V> = Vec::with_capacity(chunk);
        let mut attr = BatchAttr {
            in_batch: if first { 0 } else { cursor.as_ptr() as u64 },
            out_batch: next.as_mut_ptr() as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: u32::try_from(chunk).unwrap_or(u32::MAX),
            map_fd,
            ..BatchAttr::default()
        };
        // SAFETY: the kernel writes at most `count` keys and values into buffers of that many
        // (their sizes are the map's, checked by the caller), and a cursor into `next`.
        let rc = unsafe {
            libc::syscall(libc::SYS_bpf, BPF_MAP_LOOKUP_BATCH, &mut attr as *mut BatchAttr, size_of::<BatchAttr>())
        };
        let error = (rc < 0).then(io::Error::last_os_error);
        let filled = (attr.count as usize).min(chunk);
        match error.as_ref().and_then(io::Error::raw_os_error) {
            None | Some(libc::ENOENT) => {
                // SAFETY: the kernel filled the first `filled` entries of both buffers.
                unsafe {
                    keys.set_len(filled);
                    values.set_len(filled);
                }
                out.extend(keys.into_iter().zip(values));
                if error.is_some() || filled == 0 {
                    // ENOENT: the walk is at the end.
                    return Ok(Some(out));
                }
                cursor = next;
                first = false;
            }
            // A bucket holds more entries than were asked for: ask for more.
            Some(libc::ENOSPC) if chunk < 1 << 20 => chunk *= 4,
            // No batch lookup here (EINVAL before 5.6; ENOTSUPP, 524, for a map type without it).
            Some(libc::EINVAL | libc::ENOSYS | 524) if first => return Ok(None),
            Some(_) => return Err(error.unwrap_or_else(|| io::Error::other("bpf"))),
        }
    }
}
