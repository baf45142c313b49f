//! Opening a recording: container chunks (store) → decoder and per-CPU pages (trace), plus the
//! adapter that lets analyzers name things through the recorded kernel's formats.

use std::fs::File;
use std::io::BufReader;
use std::path::Path;

use anyhow::Context;
use virtprof_analysis::Names;
use virtprof_model::StrId;
use virtprof_store::recording::{Chunk, Footer, Metadata, Reader};
use virtprof_trace::decode::{Decoder, Layout};
use virtprof_trace::format::{parse_event_format, parse_header_page};

use crate::exit::usage;

/// A recording read into memory.
pub struct Recording {
    /// Its metadata.
    pub metadata: Metadata,
    /// Its footer (None if the file was cut short before it).
    pub footer: Option<Footer>,
    /// Raw pages per CPU.
    pub cpus: Vec<(u32, Vec<u8>)>,
    /// Where the file was cut short, if it was.
    pub truncated_at: Option<u64>,
}

impl Recording {
    /// Read every chunk of `path`.
    pub fn open(path: &Path) -> anyhow::Result<Recording> {
        let file = File::open(path).map_err(|e| usage(format!("cannot open recording '{}': {e}", path.display())))?;
        let mut reader = Reader::new(BufReader::with_capacity(1 << 20, file))
            .map_err(|e| usage(format!("'{}': {e}", path.display())))?;
        let (mut metadata, mut footer) = (None, None);
        let mut cpus: Vec<(u32, Vec<u8>)> = Vec::new();
        while let Some(chunk) = reader.next_chunk().with_context(|| format!("reading '{}'", path.display()))? {
            match chunk {
                Chunk::Metadata(m) => metadata = Some(*m),
                Chunk::Pages { cpu, data } => match cpus.iter_mut().find(|(c, _)| *c == cpu) {
                    Some((_, pages)) => pages.extend_from_slice(&data),
                    None => cpus.push((cpu, data)),
                },
                Chunk::Footer(f) => footer = Some(f),
            }
        }
        let mut metadata: Metadata =
            metadata.ok_or_else(|| usage(format!("'{}' has no metadata chunk", path.display())))?;
        if let Some(f) = &footer {
            metadata.tasks.extend(f.tasks.iter().cloned());
        }
        cpus.sort_by_key(|(c, _)| *c);
        Ok(Recording { metadata, footer, cpus, truncated_at: reader.truncated_at })
    }

    /// A decoder for the recorded kernel's formats.
    pub fn decoder(&self) -> anyhow::Result<Decoder> {
        let header = parse_header_page(&self.metadata.header_page).context("recording's header_page")?;
        let formats = self
            .metadata
            .formats
            .iter()
            .map(|f| parse_event_format(&f.system, &f.text))
            .collect::<Result<Vec<_>, _>>()
            .context("recording's event formats")?;
        Ok(Decoder::new(Layout::new(header, formats)))
    }

    /// Per-CPU page slices, for [`virtprof_trace::merge::merge_cpus`].
    pub fn cpu_slices(&self) -> Vec<(u32, &[u8])> {
        self.cpus.iter().map(|(c, p)| (*c, p.as_slice())).collect()
    }

    /// Events the kernel reported dropped or overwritten, from the footer.
    pub fn lost_in_footer(&self) -> u64 {
        self.footer.as_ref().map_or(0, |f| f.cpu_loss.iter().map(|(_, overrun, dropped)| overrun + dropped).sum())
    }
}

/// Names through a decoder: the recorded kernel's own symbol tables and event names.
pub struct DecoderNames<'a>(pub &'a Decoder);

impl Names for DecoderNames<'_> {
    fn exit_reason(&self, reason: u32, isa: u32) -> String {
        self.0.exit_reason_name(reason, isa).map_or_else(|| format!("reason {reason:#x}"), str::to_string)
    }

    fn userspace_reason(&self, reason: u32) -> String {
        self.0
            .symbol("kvm", "kvm_userspace_exit", "reason", u64::from(reason))
            .map_or_else(|| format!("KVM_EXIT {reason}"), str::to_string)
    }

    fn event(&self, id: u16) -> String {
        self.0.layout().format(id).map_or_else(|| format!("event {id}"), |f| f.name.clone())
    }

    fn task(&self, id: StrId) -> String {
        self.0.strings.resolve(id).to_string()
    }
}
