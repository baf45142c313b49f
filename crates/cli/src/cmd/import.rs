//! `virtprof import SRC -o FILE`: turn a capture made elsewhere (a tracefs dump, a trace.dat,
//! a perf.data, ftrace text; opened by `virtprof_session::Session`) into a recording. Each
//! CPU's pages are written as they are read: a compressed trace.dat's chunks are expanded one
//! at a time, so memory stays at one chunk whatever the file expands to.

use std::io::BufWriter;
use std::process::ExitCode;

use virtprof_host::output::{OutputFile, Privacy};
use virtprof_session::Session;
use virtprof_store::recording::{Footer, Writer};

use crate::args::ImportArgs;
use crate::exit::usage;

/// Pages per chunk: 1 MiB, so a cut file loses at most that much per CPU.
const PAGES_PER_CHUNK: usize = 256;

pub fn run(args: &ImportArgs) -> anyhow::Result<ExitCode> {
    let src = &args.src;
    if !src.exists() {
        return Err(usage(format!("'{}' does not exist", src.display())));
    }
    if virtprof_session::import::file_head(src).starts_with(virtprof_store::recording::MAGIC) {
        return Err(usage(format!(
            "'{}' is a virtprof recording already: nothing to import; every command reads it as it is (e.g. `virtprof exits FILE`)",
            src.display()
        )));
    }
    let session = Session::open_any(src, &args.source.options())?;
    let metadata = session.recording_metadata();
    let page_size = virtprof_trace::format::parse_header_page(&metadata.header_page)?.page_size;
    let out = OutputFile::create(&args.output, Privacy::Private)?;
    let mut writer = Writer::new(BufWriter::with_capacity(1 << 20, out), &metadata)?;
    let mut pages = 0u64;
    let mut buffer = Vec::new();
    let streams = session.streams();
    for stream in &streams {
        for segment in &stream.segments {
            let raw = segment.pages(&mut buffer).map_err(|e| usage(format!("'{}': {e}", src.display())))?;
            for chunk in raw.chunks(page_size * PAGES_PER_CHUNK) {
                writer.pages(stream.cpu, chunk)?;
                pages += (chunk.len() / page_size) as u64;
            }
        }
    }
    let footer = session.footer.clone().unwrap_or_default();
    let out = writer.finish(&Footer { pages, ..footer })?;
    out.into_inner().map_err(|e| e.into_error())?.commit()?;
    eprintln!(
        "virtprof: imported {} ({} CPUs, {pages} pages) into {}",
        src.display(),
        streams.len(),
        args.output.display()
    );
    Ok(ExitCode::SUCCESS)
}
