//! `virtprof boot`: a program-counter profile of a guest (seed 003): collect samples from one
//! source, label them with realm and symbol, and show the realm split, the top symbols, time
//! bins, sequences and a differential against a saved profile.

mod output;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde::{Deserialize, Serialize};
use virtprof_analysis::pcprof::{self, Labeled};
use virtprof_analysis::symbols::SymbolTable;
use virtprof_kvm::guest::{boot, Script};
use virtprof_model::pcsample::{PcSample, Realm};
use virtprof_model::units::duration_ns;

use crate::args::{BootArgs, Kaslr};
use crate::exit::usage;
pub use virtprof_engine::boot::Truth;
use virtprof_engine::boot::{self as sources, Sampling};

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

/// What `boot` was asked to do, checked: the command line is not read past [`Options::from_args`].
struct Options {
    source: Source,
    sampling: Sampling,
    kernel_symbols: Option<PathBuf>,
    user_symbols: Option<PathBuf>,
    kaslr: Kaslr,
    save: Option<PathBuf>,
    compare: Option<PathBuf>,
    view: output::View,
}

/// Where the profile comes from.
enum Source {
    /// A profile saved with --save.
    Load(PathBuf),
    /// Samples taken now.
    Collect(Collector),
}

/// Where samples are taken from.
enum Collector {
    Testvm { script: Script, vcpus: u32 },
    Qemu(sources::QemuLaunch),
    Gdb(String),
    Recording(PathBuf),
}

impl Options {
    fn from_args(args: &BootArgs) -> anyhow::Result<Options> {
        let source = if args.testvm {
            let total_ns = args.duration.map_or(1_000_000_000, duration_ns);
            let script = boot::script_from_specs(&args.shares, args.balloon.as_deref(), total_ns).map_err(usage)?;
            let max = virtprof_kvm::guest::layout::MAX_VCPUS;
            if args.vcpus == 0 || args.vcpus > max {
                return Err(usage(format!("--vcpus {}: must be 1 to {max}", args.vcpus)));
            }
            Source::Collect(Collector::Testvm { script, vcpus: args.vcpus })
        } else if args.qemu {
            let (program, qemu_args) = match args.qemu_args.split_first() {
                Some((first, rest)) if !first.starts_with('-') => (first.clone(), rest.to_vec()),
                _ => ("qemu-system-x86_64".to_string(), args.qemu_args.clone()),
            };
            Source::Collect(Collector::Qemu(sources::QemuLaunch {
                program,
                args: qemu_args,
                until: args.until.clone(),
                console: args.console.clone(),
            }))
        } else if let Some(address) = &args.gdb {
            Source::Collect(Collector::Gdb(address.clone()))
        } else if let Some(path) = &args.recording {
            Source::Collect(Collector::Recording(path.clone()))
        } else if let Some(path) = &args.load {
            Source::Load(path.clone())
        } else {
            return Err(usage(
                "choose a source: --testvm, --qemu -- ARGS, --gdb HOST:PORT, --recording FILE or --load FILE",
            ));
        };
        let format = match (args.json, args.csv, args.folded) {
            (true, _, _) => output::Format::Json,
            (_, true, _) => output::Format::Csv,
            (_, _, true) => output::Format::Folded,
            _ => output::Format::Text,
        };
        Ok(Options {
            source,
            sampling: Sampling { rate: args.rate, limit: args.duration, find_kaslr: args.kaslr == Kaslr::Auto },
            kernel_symbols: [&args.system_map, &args.kallsyms, &args.vmlinux].into_iter().flatten().next().cloned(),
            user_symbols: args.user_symbols.clone(),
            kaslr: args.kaslr,
            save: args.save.clone(),
            compare: args.compare.clone(),
            view: output::View {
                bin_ns: args.bin.map_or(0, duration_ns),
                symbols: args.symbols.clone(),
                top: args.top,
                format,
                html: args.html.clone(),
            },
        })
    }
}

pub fn run(args: &BootArgs) -> anyhow::Result<ExitCode> {
    let options = Options::from_args(args)?;
    let kernel = options.kernel_symbols.as_deref().map(symbols_file).transpose()?;
    let user = options.user_symbols.as_deref().map(symbols_file).transpose()?;
    let given_kaslr = match options.kaslr {
        Kaslr::Auto => None,
        Kaslr::Offset(offset) => Some(offset),
    };
    let profile = match &options.source {
        Source::Load(path) => {
            let mut saved = load(path)?;
            if kernel.is_some() || user.is_some() {
                let offset = given_kaslr.unwrap_or(saved.kaslr_offset);
                let kernel = kernel.map(|k| k.with_offset(offset));
                saved.samples = relabel(&saved.samples, kernel.as_ref(), user.as_ref());
                saved.kaslr_offset = offset;
            }
            saved
        }
        Source::Collect(collector) => collect(collector, &options.sampling, kernel, user, given_kaslr)?,
    };
    if profile.samples.is_empty() {
        // Stopped (Ctrl-C, a signal) before the first tick: the source said so; a stop is
        // how a boot profile ends, not a failure.
        if virtprof_host::stop::requested() {
            return Ok(ExitCode::SUCCESS);
        }
        return Err(anyhow::anyhow!("no samples were taken (the guest ended before the first tick?)"));
    }
    if let Some(path) = &options.save {
        let mut out = crate::output::Output::open(Some(path), virtprof_host::output::Privacy::Shared)?;
        serde_json::to_writer(&mut out, &profile)?;
        out.finish()?;
    }
    let other = match &options.compare {
        Some(path) => Some((path.display().to_string(), load(path)?)),
        None => None,
    };
    output::write(&options.view, &profile, other)?;
    Ok(ExitCode::SUCCESS)
}

/// Take samples from the chosen source and label them.
fn collect(
    collector: &Collector,
    sampling: &Sampling,
    kernel: Option<SymbolTable>,
    user: Option<SymbolTable>,
    kaslr: Option<u64>,
) -> anyhow::Result<SavedProfile> {
    let collected = match collector {
        Collector::Testvm { script, vcpus } => sources::testvm(script.clone(), *vcpus, sampling.rate)?,
        Collector::Qemu(launch) => sources::qemu(launch, sampling, kernel.as_ref())?,
        Collector::Gdb(address) => sources::gdb(address, sampling, kernel.as_ref())?,
        Collector::Recording(path) => sources::recording(path, sampling.rate)?,
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

/// A symbol file of any supported kind: ELF by its magic, otherwise System.map/kallsyms text.
fn symbols_file(path: &Path) -> anyhow::Result<SymbolTable> {
    // A vmlinux with debug information is a few hundred MB.
    let bytes = virtprof_host::input::read_bytes(path, "symbols", 4 << 30)?;
    let table = if bytes.starts_with(b"\x7fELF") {
        SymbolTable::from_elf(&bytes)
    } else {
        SymbolTable::from_system_map(&String::from_utf8_lossy(&bytes))
    };
    table.map_err(|e| usage(format!("symbols '{}': {e}", path.display())))
}

fn load(path: &Path) -> anyhow::Result<SavedProfile> {
    let bytes = virtprof_host::input::read_bytes(path, "profile", 1 << 30)?;
    let saved: SavedProfile = serde_json::from_slice(&bytes)
        .map_err(|e| usage(format!("'{}' is not a profile saved by `virtprof boot --save` ({e})", path.display())))?;
    if saved.format != SAVED_FORMAT {
        return Err(usage(format!("'{}': format '{}', expected '{SAVED_FORMAT}'", path.display(), saved.format)));
    }
    Ok(saved)
}
