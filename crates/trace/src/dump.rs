//! A tracefs dump on disk: `events/` (header_page and formats) plus
//! `per_cpu/cpuN/{trace_pipe_raw,stats}`, as `virtprof import` and the kvm_amd fixtures have
//! them. Decoding the pages is [`crate::merge`]'s job.

use std::fs;
use std::path::{Path, PathBuf};

use crate::decode::Decoder;
use crate::error::TraceError;
use crate::tracefs::{load_layout, read_file};

/// Raw pages of one CPU.
#[derive(Debug, Clone)]
pub struct CpuPages {
    /// CPU number.
    pub cpu: u32,
    /// Concatenated pages.
    pub raw: Vec<u8>,
    /// Where they came from.
    pub path: PathBuf,
    /// The CPU's `stats` file (overrun and dropped counts), empty if absent.
    pub stats: String,
}

/// The most one CPU's saved pages can be (they are read into memory).
const MAX_CPU_PAGES: u64 = 16 << 30;

/// Linux's largest CONFIG_NR_CPUS.
const MAX_CPUS: u32 = 8192;

/// Read `per_cpu/cpuN/trace_pipe_raw` (and `stats`) of every CPU in a dump, by CPU number.
/// Each CPU's pages must be a file of its own: one file behind several CPUs (links) would be
/// read, held and decoded once per CPU.
pub fn read_cpu_pages(root: &Path) -> Result<Vec<CpuPages>, TraceError> {
    use std::os::unix::fs::MetadataExt;
    let per_cpu = root.join("per_cpu");
    let mut cpus = Vec::new();
    let mut files: std::collections::HashMap<(u64, u64), PathBuf> = Default::default();
    for entry in fs::read_dir(&per_cpu).map_err(TraceError::file(&per_cpu))?.filter_map(Result::ok) {
        let name = entry.file_name();
        let Some(cpu) = name.to_str().and_then(|n| n.strip_prefix("cpu")).and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let path = entry.path().join("trace_pipe_raw");
        if cpu >= MAX_CPUS {
            return Err(TraceError::BadDump(format!(
                "'{}' names CPU {cpu}; no kernel has more than {MAX_CPUS} CPUs",
                entry.path().display()
            )));
        }
        if let Ok(meta) = fs::metadata(&path) {
            if let Some(other) = files.insert((meta.dev(), meta.ino()), path.clone()) {
                return Err(TraceError::BadDump(format!(
                    "'{}' and '{}' are the same file: every CPU's pages are a file of their own (the dump is damaged, or made to be read many times over)",
                    other.display(),
                    path.display()
                )));
            }
        }
        let raw =
            virtprof_host::input::read_bytes(&path, "trace_pipe_raw", MAX_CPU_PAGES).map_err(TraceError::Input)?;
        let stats = read_file(&entry.path().join("stats")).unwrap_or_default();
        cpus.push(CpuPages { cpu, raw, path, stats });
    }
    cpus.sort_by_key(|c| c.cpu);
    Ok(cpus)
}

/// A loaded dump: its decoder and each CPU's pages.
#[derive(Debug)]
pub struct Dump {
    /// Decoder for the dump's formats.
    pub decoder: Decoder,
    /// Per-CPU pages, by CPU number.
    pub cpus: Vec<CpuPages>,
}

impl Dump {
    /// Load a dump directory.
    pub fn open(root: &Path) -> Result<Dump, TraceError> {
        Ok(Dump { decoder: Decoder::new(load_layout(root, &[])?), cpus: read_cpu_pages(root)? })
    }
}
