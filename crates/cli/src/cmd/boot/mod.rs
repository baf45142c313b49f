//! `virtprof boot`: a program-counter profile of a guest (seed 003): collect samples from one
//! source, label them with realm and symbol, and show the realm split, the top symbols, time
//! bins, sequences and a differential against a saved profile.

mod output;
mod sources;

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use serde::{Deserialize, Serialize};
use virtprof_analysis::pcprof::{self, Labeled};
use virtprof_analysis::symbols::SymbolTable;
use virtprof_model::pcsample::{PcSample, Realm};

use crate::args::BootArgs;
use crate::exit::usage;
pub use sources::Truth;

/// What `--save` writes and `--load`/`--compare` read.
#[derive(Debug, Serialize, Deserialize)]
pub struct SavedProfile {
    /// Always [`SAVED_FORMAT`].
    pub format: String,
    /// Where the samples came from.
    pub source: String,
    /// Samples per second (null: exit-driven).
    pub rate_hz: Option<u32>,
    /// A caveat about the samples.
    pub note: Option<String>,
    /// The kernel's KASLR slide used to resolve them.
    pub kaslr_offset: u64,
    /// Test-bed ground truth.
    pub truth: Option<Truth>,
    /// The labelled samples.
    pub samples: Vec<Labeled>,
}

/// The `format` of saved profiles.
pub const SAVED_FORMAT: &str = "virtprof-boot-profile/1";

pub fn run(args: &BootArgs) -> anyhow::Result<ExitCode> {
    if args.rate == 0 || args.rate > 100_000 {
        return Err(usage(format!("--rate {}: must be 1 to 100000", args.rate)));
    }
    let kaslr = match args.kaslr.as_str() {
        "auto" => None,
        hex => Some(
            u64::from_str_radix(hex.trim_start_matches("0x"), 16)
                .map_err(|_| usage(format!("--kaslr '{hex}': give a hex offset (0x2a000000) or 'auto'")))?,
        ),
    };
    let kernel = kernel_symbols(args)?;
    let user = match &args.user_symbols {
        Some(p) => Some(symbols_file(p)?),
        None => None,
    };
    let profile = if let Some(path) = &args.load {
        let mut saved = load(path)?;
        if kernel.is_some() || user.is_some() {
            let offset = kaslr.unwrap_or(saved.kaslr_offset);
            let kernel = kernel.map(|k| k.with_offset(offset));
            saved.samples = relabel(&saved.samples, kernel.as_ref(), user.as_ref());
            saved.kaslr_offset = offset;
        }
        saved
    } else {
        collect(args, kernel, user, kaslr)?
    };
    if profile.samples.is_empty() {
        return Err(anyhow::anyhow!("no samples were taken (the guest ended before the first tick?)"));
    }
    if let Some(path) = &args.save {
        let file = std::fs::File::create(path).with_context(|| format!("creating --save {}", path.display()))?;
        serde_json::to_writer(std::io::BufWriter::new(file), &profile)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    let other = match &args.compare {
        Some(path) => Some((path.display().to_string(), load(path)?)),
        None => None,
    };
    output::write(args, &profile, other)?;
    Ok(ExitCode::SUCCESS)
}

/// Take samples from the chosen source and label them.
fn collect(
    args: &BootArgs,
    kernel: Option<SymbolTable>,
    user: Option<SymbolTable>,
    kaslr: Option<u64>,
) -> anyhow::Result<SavedProfile> {
    let collected = if args.testvm {
        sources::testvm(args)?
    } else if args.qemu {
        sources::qemu(args, kernel.as_ref())?
    } else if let Some(address) = &args.gdb {
        sources::gdb(args, address, kernel.as_ref())?
    } else if let Some(path) = &args.recording {
        sources::recording(path)?
    } else {
        return Err(usage(
            "choose a source: --testvm, --qemu -- ARGS, --gdb HOST:PORT, --recording FILE or --load FILE",
        ));
    };
    let offset = kaslr.or(collected.detected_kaslr).unwrap_or(0);
    let kernel = kernel.map(|k| k.with_offset(offset));
    let user = user.or(collected.program_symbols);
    Ok(SavedProfile {
        format: SAVED_FORMAT.into(),
        source: collected.source,
        rate_hz: collected.rate_hz,
        note: collected.note,
        kaslr_offset: offset,
        truth: collected.truth,
        samples: pcprof::label(&collected.samples, kernel.as_ref(), user.as_ref()),
    })
}

/// Label saved samples again with other symbol tables (hypervisor labels are kept).
fn relabel(samples: &[Labeled], kernel: Option<&SymbolTable>, user: Option<&SymbolTable>) -> Vec<Labeled> {
    let raw: Vec<PcSample> = samples
        .iter()
        .map(|s| PcSample {
            t_ns: s.t_ns,
            vcpu: s.vcpu,
            rip: s.rip,
            realm: s.realm,
            activity: if s.realm == Realm::Hypervisor { s.symbol.clone() } else { String::new() },
        })
        .collect();
    pcprof::label(&raw, kernel, user)
}

fn kernel_symbols(args: &BootArgs) -> anyhow::Result<Option<SymbolTable>> {
    let path = [&args.system_map, &args.kallsyms, &args.vmlinux].into_iter().flatten().next();
    path.map(|p| symbols_file(p)).transpose()
}

/// A symbol file of any supported kind: ELF by its magic, otherwise System.map/kallsyms text.
fn symbols_file(path: &Path) -> anyhow::Result<SymbolTable> {
    let bytes = std::fs::read(path).map_err(|e| usage(format!("reading symbols '{}': {e}", path.display())))?;
    let table = if bytes.starts_with(b"\x7fELF") {
        SymbolTable::from_elf(&bytes)
    } else {
        SymbolTable::from_system_map(&String::from_utf8_lossy(&bytes))
    };
    table.map_err(|e| usage(format!("symbols '{}': {e}", path.display())))
}

fn load(path: &Path) -> anyhow::Result<SavedProfile> {
    let bytes = std::fs::read(path).map_err(|e| usage(format!("reading profile '{}': {e}", path.display())))?;
    let saved: SavedProfile = serde_json::from_slice(&bytes)
        .map_err(|e| usage(format!("'{}' is not a profile saved by `virtprof boot --save` ({e})", path.display())))?;
    if saved.format != SAVED_FORMAT {
        return Err(usage(format!("'{}': format '{}', expected '{SAVED_FORMAT}'", path.display(), saved.format)));
    }
    Ok(saved)
}
