//! `virtprof import SRC -o FILE`: turn a capture made elsewhere (a tracefs dump, a trace.dat,
//! ftrace text; read by `virtprof_session::import`) into a recording.

use std::io::BufWriter;
use std::process::ExitCode;

use virtprof_host::output::{OutputFile, Privacy};
use virtprof_session::import::read_source;
use virtprof_store::recording::{Footer, Writer};

use crate::args::ImportArgs;

/// Pages per chunk: 1 MiB, so a cut file loses at most that much per CPU.
const PAGES_PER_CHUNK: usize = 256;

pub fn run(args: &ImportArgs) -> anyhow::Result<ExitCode> {
    let src = &args.src;
    let (metadata, cpus, footer) = read_source(src, &args.source.options())?;
    let out = OutputFile::create(&args.output, Privacy::Private)?;
    let mut writer = Writer::new(BufWriter::with_capacity(1 << 20, out), &metadata)?;
    let page_size = virtprof_trace::format::parse_header_page(&metadata.header_page)?.page_size;
    let mut pages = 0u64;
    for (cpu, raw) in &cpus {
        for chunk in raw.chunks(page_size * PAGES_PER_CHUNK) {
            writer.pages(*cpu, chunk)?;
            pages += (chunk.len() / page_size) as u64;
        }
    }
    let out = writer.finish(&Footer { pages, ..footer })?;
    out.into_inner().map_err(|e| e.into_error())?.commit()?;
    eprintln!(
        "virtprof: imported {} ({} CPUs, {pages} pages) into {}",
        src.display(),
        cpus.len(),
        args.output.display()
    );
    Ok(ExitCode::SUCCESS)
}
