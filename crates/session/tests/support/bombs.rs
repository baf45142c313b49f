//! Hostile files whose declared sizes are lies: trace-cmd trace.dat (v6, v7 with zstd, zlib or
//! no compression) whose CPUs share one chunk or claim chunks that expand far past the file,
//! a perf.data whose one compressed record inflates to hundreds of MiB, a tracefs dump whose
//! CPUs are one file, and ftrace text naming CPUs no kernel has. Made here, in the tests that
//! read them (`tests/bombs.rs`, the `bombs` fuzz target, the CLI's `it::bombs`), never stored.

// Sizes and counts in these layouts are u32 and u64 by the formats' definitions.
#![allow(clippy::cast_possible_truncation, dead_code)]

use std::io::Write;
use std::path::Path;

/// The page layout every bomb declares (x86-64's, 4 KiB pages).
pub const HEADER_PAGE: &str = "\tfield: u64 timestamp;\toffset:0;\tsize:8;\tsigned:0;\n\tfield: local_t commit;\toffset:8;\tsize:8;\tsigned:1;\n\tfield: int overwrite;\toffset:8;\tsize:1;\tsigned:1;\n\tfield: char data;\toffset:16;\tsize:4080;\tsigned:0;\n";
pub const PAGE: usize = 4096;

/// How a v7 file's chunks are compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    Zstd,
    Zlib,
    /// Version 7 without compression (pages in place, like version 6).
    None,
}

/// A trace.dat bomb: `cpus` CPUs, each with `chunks` chunks of `chunk_pages` empty pages
/// (their timestamps random, so the chunks do not compress to nothing; every chunk the same
/// bytes, so a bomb of many CPUs is cheap to make), all CPUs pointing at the first CPU's data
/// where `shared`. `formats_options` options point at the one formats section (v7; 1 in a
/// real file), `instances` more buffers at the top buffer's CPU table (v6; 0 in a real file).
#[derive(Debug, Clone, Copy)]
pub struct DatBomb {
    pub version: u32,
    pub codec: Codec,
    pub cpus: u32,
    pub chunk_pages: usize,
    pub chunks: usize,
    pub shared: bool,
    pub formats_options: usize,
    pub instances: usize,
}

impl DatBomb {
    /// A v7 file of `cpus` CPUs with one chunk of `chunk_pages` each, nothing else odd.
    pub fn v7(codec: Codec, cpus: u32, chunk_pages: usize) -> DatBomb {
        DatBomb { version: 7, codec, cpus, chunk_pages, chunks: 1, shared: false, formats_options: 1, instances: 0 }
    }

    /// A v6 file of `cpus` CPUs with `pages` pages each.
    pub fn v6(cpus: u32, pages: usize) -> DatBomb {
        DatBomb {
            version: 6,
            codec: Codec::None,
            cpus,
            chunk_pages: pages,
            chunks: 1,
            shared: false,
            formats_options: 1,
            instances: 0,
        }
    }

    pub fn shared(self) -> DatBomb {
        DatBomb { shared: true, ..self }
    }
}

/// Empty pages (commit 0) with random timestamps.
fn empty_pages(pages: usize, seed: &mut u64) -> Vec<u8> {
    let mut out = vec![0u8; pages * PAGE];
    for page in out.chunks_exact_mut(PAGE) {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        page[..8].copy_from_slice(&(*seed >> 8).to_le_bytes());
    }
    out
}

fn compress(codec: Codec, bytes: &[u8]) -> Vec<u8> {
    match codec {
        Codec::Zstd => zstd::bulk::compress(bytes, 3).unwrap(),
        Codec::Zlib => {
            let mut c = libdeflater::Compressor::new(libdeflater::CompressionLvl::default());
            let mut out = vec![0; c.zlib_compress_bound(bytes.len())];
            let n = c.zlib_compress(bytes, &mut out).unwrap();
            out.truncate(n);
            out
        }
        Codec::None => bytes.to_vec(),
    }
}

fn header_info() -> Vec<u8> {
    let mut v = b"header_page\0".to_vec();
    v.extend_from_slice(&(HEADER_PAGE.len() as u64).to_le_bytes());
    v.extend_from_slice(HEADER_PAGE.as_bytes());
    v.extend_from_slice(b"header_event\0");
    v.extend_from_slice(&0u64.to_le_bytes());
    v
}

fn start(version: u32) -> Vec<u8> {
    let mut v = b"\x17\x08\x44tracing".to_vec();
    v.extend_from_slice(format!("{version}\0").as_bytes());
    v.extend_from_slice(&[0, 8]);
    v.extend_from_slice(&(PAGE as u32).to_le_bytes());
    v
}

/// One CPU's data: v7 compressed chunks (`count: u32`, then `compressed: u32, size: u32,
/// bytes` each), or raw pages.
fn cpu_data(b: &DatBomb) -> Vec<u8> {
    let pages = empty_pages(b.chunk_pages, &mut 0x9e37_79b9_7f4a_7c15);
    if b.codec == Codec::None || b.version == 6 {
        return pages.repeat(b.chunks);
    }
    let frame = compress(b.codec, &pages);
    let mut v = (b.chunks as u32).to_le_bytes().to_vec();
    for _ in 0..b.chunks {
        v.extend_from_slice(&(frame.len() as u32).to_le_bytes());
        v.extend_from_slice(&(pages.len() as u32).to_le_bytes());
        v.extend_from_slice(&frame);
    }
    v
}

/// The bomb's bytes.
pub fn trace_dat(b: &DatBomb) -> Vec<u8> {
    match b.version {
        6 => trace_dat_v6(b),
        _ => trace_dat_v7(b),
    }
}

fn trace_dat_v6(b: &DatBomb) -> Vec<u8> {
    let mut v = start(6);
    v.extend_from_slice(&header_info());
    v.extend_from_slice(&0u32.to_le_bytes()); // ftrace formats
    v.extend_from_slice(&0u32.to_le_bytes()); // event systems
    v.extend_from_slice(&0u32.to_le_bytes()); // kallsyms
    v.extend_from_slice(&0u32.to_le_bytes()); // printk
    v.extend_from_slice(&0u64.to_le_bytes()); // cmdlines
    v.extend_from_slice(&b.cpus.to_le_bytes());
    v.extend_from_slice(b"options  \0");
    // Instance buffers (BUFFER: `offset: u64, name`), all pointing at the top buffer's table,
    // patched in once it is placed.
    let mut patches = Vec::new();
    for i in 0..b.instances {
        let name = format!("i{i}\0");
        v.extend_from_slice(&3u16.to_le_bytes());
        v.extend_from_slice(&(8 + name.len() as u32).to_le_bytes());
        patches.push(v.len());
        v.extend_from_slice(&0u64.to_le_bytes());
        v.extend_from_slice(name.as_bytes());
    }
    v.extend_from_slice(&0u16.to_le_bytes()); // DONE
    v.extend_from_slice(b"flyrecord\0");
    let table = v.len();
    for at in patches {
        v[at..at + 8].copy_from_slice(&(table as u64).to_le_bytes());
    }
    v.resize(table + 16 * b.cpus as usize, 0);
    for (cpu, (offset, size)) in place_cpus(&mut v, b).into_iter().enumerate() {
        v[table + 16 * cpu..table + 16 * cpu + 8].copy_from_slice(&offset.to_le_bytes());
        v[table + 16 * cpu + 8..table + 16 * cpu + 16].copy_from_slice(&size.to_le_bytes());
    }
    v
}

/// Every CPU's data appended to `v` (or, shared, the first CPU's only): each CPU's (offset,
/// size).
fn place_cpus(v: &mut Vec<u8>, b: &DatBomb) -> Vec<(u64, u64)> {
    let data = cpu_data(b);
    let mut first = None;
    (0..b.cpus)
        .map(|_| match first {
            Some(place) if b.shared => place,
            _ => {
                let place = (v.len() as u64, data.len() as u64);
                v.extend_from_slice(&data);
                first.get_or_insert(place);
                place
            }
        })
        .collect()
}

/// A v7 section: `id: u16, flags: u16, description: u32, size: u64`, then its payload.
fn section(v: &mut Vec<u8>, id: u16, payload: &[u8]) -> u64 {
    let at = v.len() as u64;
    v.extend_from_slice(&id.to_le_bytes());
    v.extend_from_slice(&0u16.to_le_bytes());
    v.extend_from_slice(&0u32.to_le_bytes());
    v.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    v.extend_from_slice(payload);
    at
}

fn option(v: &mut Vec<u8>, id: u16, body: &[u8]) {
    v.extend_from_slice(&id.to_le_bytes());
    v.extend_from_slice(&(body.len() as u32).to_le_bytes());
    v.extend_from_slice(body);
}

fn trace_dat_v7(b: &DatBomb) -> Vec<u8> {
    let mut v = start(7);
    let (name, version) = match b.codec {
        Codec::Zstd => ("zstd", "1.5.6"),
        Codec::Zlib => ("zlib", "1.3"),
        Codec::None => ("none", ""),
    };
    v.extend_from_slice(format!("{name}\0{version}\0").as_bytes());
    let first_options = v.len();
    v.extend_from_slice(&0u64.to_le_bytes());
    let header = section(&mut v, 16, &header_info());
    let formats = section(&mut v, 18, &0u32.to_le_bytes());
    // The flyrecord section: every CPU's data, one after another (or the first CPU's only).
    let data_section = v.len();
    v.extend_from_slice(&[0u8; 16]);
    let places = place_cpus(&mut v, b);
    let size = (v.len() - data_section - 16) as u64;
    v[data_section..data_section + 2].copy_from_slice(&3u16.to_le_bytes());
    v[data_section + 8..data_section + 16].copy_from_slice(&size.to_le_bytes());
    let mut options = Vec::new();
    option(&mut options, 16, &header.to_le_bytes());
    for _ in 0..b.formats_options {
        option(&mut options, 18, &formats.to_le_bytes());
    }
    let mut buffer = (data_section as u64).to_le_bytes().to_vec();
    buffer.extend_from_slice(b"\0local\0");
    buffer.extend_from_slice(&(PAGE as u32).to_le_bytes());
    buffer.extend_from_slice(&b.cpus.to_le_bytes());
    for (cpu, (offset, size)) in places.iter().enumerate() {
        buffer.extend_from_slice(&(cpu as u32).to_le_bytes());
        buffer.extend_from_slice(&offset.to_le_bytes());
        buffer.extend_from_slice(&size.to_le_bytes());
    }
    option(&mut options, 3, &buffer);
    option(&mut options, 0, &0u64.to_le_bytes());
    let options_at = section(&mut v, 0, &options);
    v[first_options..first_options + 8].copy_from_slice(&options_at.to_le_bytes());
    v
}

/// `perf.data` (the fixture `seed`, a real one) with one PERF_RECORD_COMPRESSED appended to
/// its data: a zstd stream of `expanded` bytes of 8-byte records (FINISHED_ROUND's type,
/// harmless to a reader that gets that far). The feature sections after the data move along.
pub fn perf_data_zstd(seed: &[u8], expanded: usize) -> Vec<u8> {
    let u64_at = |v: &[u8], at: usize| u64::from_le_bytes(v[at..at + 8].try_into().unwrap());
    let (data_at, data_size) = (u64_at(seed, 40) as usize, u64_at(seed, 48) as usize);
    let record = {
        let mut unit = Vec::with_capacity(1 << 20);
        while unit.len() < 1 << 20 {
            unit.extend_from_slice(&68u32.to_le_bytes());
            unit.extend_from_slice(&0u16.to_le_bytes());
            unit.extend_from_slice(&8u16.to_le_bytes());
        }
        let mut z = zstd::stream::Encoder::new(Vec::new(), 19).unwrap();
        let mut left = expanded;
        while left > 0 {
            let n = left.min(unit.len()) & !7;
            z.write_all(&unit[..n.max(8)]).unwrap();
            left = left.saturating_sub(n.max(8));
        }
        let body = z.finish().unwrap();
        assert!(body.len() + 8 <= 0xffff, "the compressed stream of {expanded} bytes is {} bytes", body.len());
        // The whole body is the stream (no padding: that is what COMPRESSED2 added).
        let mut record = 81u32.to_le_bytes().to_vec();
        record.extend_from_slice(&0u16.to_le_bytes());
        record.extend_from_slice(&(body.len() as u16 + 8).to_le_bytes());
        record.extend_from_slice(&body);
        record
    };
    let end = data_at + data_size;
    let mut out = seed[..end].to_vec();
    out.extend_from_slice(&record);
    out.extend_from_slice(&seed[end..]);
    let grow = record.len() as u64;
    out[48..56].copy_from_slice(&(data_size as u64 + grow).to_le_bytes());
    // The feature table follows the data: each feature section's offset moves by the record.
    let features: u32 = (0..4).map(|w| u64_at(seed, 72 + 8 * w).count_ones()).sum();
    let table = end + record.len();
    for i in 0..features as usize {
        let at = table + 16 * i;
        let offset = u64_at(&out, at);
        if offset as usize >= end {
            out[at..at + 8].copy_from_slice(&(offset + grow).to_le_bytes());
        }
    }
    out
}

/// A tracefs dump in `dir` whose `cpus` CPUs' `trace_pipe_raw` are one file of `pages` empty
/// pages (hard links).
pub fn tracefs_dump_shared(dir: &Path, cpus: u32, pages: usize) {
    std::fs::create_dir_all(dir.join("events")).unwrap();
    std::fs::write(dir.join("events/header_page"), HEADER_PAGE).unwrap();
    let shared = dir.join("shared.raw");
    std::fs::write(&shared, empty_pages(pages, &mut 7)).unwrap();
    for cpu in 0..cpus {
        let cpu_dir = dir.join(format!("per_cpu/cpu{cpu}"));
        std::fs::create_dir_all(&cpu_dir).unwrap();
        std::fs::hard_link(&shared, cpu_dir.join("trace_pipe_raw")).unwrap();
    }
}

/// ftrace text whose lines each name another CPU, from `first` on (`lines` of them), all of
/// one event the formats hold (`sched_switch` of the kvm_amd dump's formats).
pub fn ftrace_text_many_cpus(first: u64, lines: usize) -> String {
    let mut text = String::new();
    for i in 0..lines as u64 {
        text.push_str(&format!(
            "          <idle>-0       [{:03}] d..2.  {}.{:06}: sched_switch: prev_comm=swapper/0 prev_pid=0 prev_prio=120 prev_state=R ==> next_comm=cat next_pid=5 next_prio=120\n",
            first + i,
            100 + i / 1_000_000,
            i % 1_000_000
        ));
    }
    text
}
