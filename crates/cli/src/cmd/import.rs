//! `virtprof import SRC -o FILE`: turn a capture made elsewhere (a tracefs dump, a trace.dat,
//! a perf.data, ftrace text; opened by `virtprof_session::Session`) into a recording. Each
//! CPU's pages are written as they are read: a compressed trace.dat's chunks are expanded one
//! at a time, so memory stays at one chunk whatever the file expands to. With `--guest`, a
//! guest's own trace recorded with the host's is kept beside it as the recording's guest
//! machine.

use std::io::BufWriter;
use std::process::ExitCode;

use virtprof_host::output::{OutputFile, Privacy};
use virtprof_session::{GuestTrace, Session};
use virtprof_store::recording::{Footer, GuestMachine, Writer};

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
    let options = args.source.options();
    let session = Session::open_any(src, &options)?;
    // Opened (and checked to be this host's guest) before anything is written.
    let guest = match &args.guest {
        Some(path) if !path.exists() => return Err(usage(format!("--guest '{}' does not exist", path.display()))),
        Some(path) => Some(GuestTrace::open(&session, path, &options)?),
        None => None,
    };
    let metadata = session.recording_metadata();
    let out = OutputFile::create(&args.output, Privacy::Private)?;
    let mut writer = Writer::new(BufWriter::with_capacity(1 << 20, out), &metadata)?;
    let pages = copy_pages(&session, &mut writer, Writer::pages)?;
    let mut footer = Footer { pages, ..session.footer.clone().unwrap_or_default() };
    let mut line = format!("{} ({} CPUs, {pages} pages)", src.display(), session.streams().len());
    if let Some(guest) = &guest {
        let file = guest.session.path.display().to_string();
        writer.guest_machine(&GuestMachine { file: file.clone(), metadata: guest.recording_metadata() })?;
        let pages = copy_pages(&guest.session, &mut writer, Writer::guest_pages)?;
        footer.guest = Some(Box::new(Footer { pages, ..guest.session.footer.clone().unwrap_or_default() }));
        line += &format!(" and its guest '{}' from {file} ({pages} pages)", guest.name);
    }
    let out = writer.finish(&footer)?;
    out.into_inner().map_err(|e| e.into_error())?.commit()?;
    eprintln!("virtprof: imported {line} into {}", args.output.display());
    Ok(ExitCode::SUCCESS)
}

/// Copy every CPU's pages of `session` through `write` (the host's or the guest machine's
/// chunks) in chunks of [`PAGES_PER_CHUNK`], one compressed frame expanded at a time.
fn copy_pages<W: std::io::Write>(
    session: &Session,
    writer: &mut Writer<W>,
    write: fn(&mut Writer<W>, u32, &[u8]) -> std::io::Result<()>,
) -> anyhow::Result<u64> {
    let page_size = virtprof_trace::format::parse_header_page(&session.metadata.header_page)?.page_size;
    let mut pages = 0u64;
    let mut buffer = Vec::new();
    for stream in &session.streams() {
        for segment in &stream.segments {
            let raw = segment.pages(&mut buffer).map_err(|e| usage(format!("'{}': {e}", session.path.display())))?;
            for chunk in raw.chunks(page_size * PAGES_PER_CHUNK) {
                write(writer, stream.cpu, chunk)?;
                pages += (chunk.len() / page_size) as u64;
            }
        }
    }
    Ok(pages)
}
