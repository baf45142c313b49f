//! Version 7: after the initial header, the compression header and the offset of the first
//! options section; every other part is a section (`id: u16, flags: u16, description: u32,
//! size: u64`, compressed as `compressed: u32, size: u32, bytes` when flagged) that an option
//! points to.

use std::borrow::Cow;

use super::cursor::Cursor;
use super::options::{self, BUFFER, BUFFER_TEXT, CMDLINES, DONE, EVENT_FORMATS, FTRACE_EVENTS, HEADER_INFO};
use super::{cpu_segments, Buffer, BufferText, FormatText, TraceDat, TraceDatError};
use crate::segment::{Codec, Segment};

const SECTION_COMPRESSED: u16 = 1;
/// Options sections chain through their DONE option; a file with more is looping.
const MAX_OPTION_SECTIONS: usize = 64;

pub(super) fn read<'a>(c: &mut Cursor<'a>, out: &mut TraceDat<'a>) -> Result<(), TraceDatError> {
    let data = c.data;
    let compression = c.cstr()?;
    let _compression_version = c.cstr()?;
    let codec = match compression.as_str() {
        "none" => None,
        "zstd" => Some(Codec::Zstd),
        "zlib" => Some(Codec::Zlib),
        other => {
            return c.fail(format!("compression '{}' is not supported (zstd, zlib and none are)", other.escape_debug()))
        }
    };
    out.compression = codec;
    let mut next_options = c.size64()?;
    check_sections_fit(data, c.pos)?;
    let mut sections = Sections::new(data, codec);
    let mut buffers = Vec::new();
    let mut texts = Vec::new();
    let mut seen = 0;
    while next_options != 0 {
        seen += 1;
        if seen > MAX_OPTION_SECTIONS {
            return c.fail(format!("more than {MAX_OPTION_SECTIONS} options sections: a loop?"));
        }
        let (options, base) = sections.read(next_options)?;
        next_options = 0;
        let mut o = Cursor::within(&options, base);
        while o.remaining() > 0 {
            let id = o.u16()?;
            let size = o.size32()?;
            let at = o.base + o.pos;
            let body = o.bytes(size)?;
            if options::apply(id, body, at, out)? {
                continue;
            }
            let mut b = Cursor::within(body, at);
            match id {
                DONE => {
                    next_options = b.size64()?;
                    break;
                }
                BUFFER => buffers.push((body.to_vec(), at)),
                BUFFER_TEXT => texts.push((body.to_vec(), at)),
                HEADER_INFO => {
                    let (s, base) = sections.read(b.size64()?)?;
                    super::read_header_info(&mut Cursor::within(&s, base), out)?;
                }
                FTRACE_EVENTS => {
                    let (s, base) = sections.read(b.size64()?)?;
                    formats(s, base, super::ftrace_formats, out)?;
                }
                EVENT_FORMATS => {
                    let (s, base) = sections.read(b.size64()?)?;
                    formats(s, base, super::event_formats, out)?;
                }
                CMDLINES => {
                    let (s, base) = sections.read(b.size64()?)?;
                    let mut sc = Cursor::within(&s, base);
                    let len = sc.size64()?;
                    out.cmdlines = sc.text(len)?;
                }
                _ => {} // KALLSYMS, PRINTK, PROCMAPS, HOOK, STRINGS: nothing we use
            }
        }
    }
    for (body, at) in buffers {
        out.buffers.push(buffer(data, &body, at, out.page_size, codec)?);
    }
    for (body, at) in texts {
        out.texts.push(buffer_text(&mut sections, &body, at)?);
    }
    Ok(())
}

/// The formats of a section: left in the file where the section is stored plainly, copied
/// out of an expanded one.
fn formats<'a>(
    section: Cow<'a, [u8]>,
    base: usize,
    read: impl for<'c> Fn(&mut Cursor<'c>) -> Result<Vec<(String, &'c [u8])>, TraceDatError>,
    out: &mut TraceDat<'a>,
) -> Result<(), TraceDatError> {
    match section {
        Cow::Borrowed(bytes) => out.formats.extend(super::borrowed(read(&mut Cursor::within(bytes, base))?)),
        Cow::Owned(bytes) => out.formats.extend(
            read(&mut Cursor::within(&bytes, base))?
                .into_iter()
                .map(|(system, text)| FormatText { system, text: Cow::Owned(text.to_vec()) }),
        ),
    }
    Ok(())
}

/// The sections follow one another from `first` to the end of the file (trace-cmd writes
/// them so): one that runs past the end means the file was cut short, which reading only the
/// sections an option points to could miss.
fn check_sections_fit(data: &[u8], first: usize) -> Result<(), TraceDatError> {
    let mut at = first;
    while at < data.len() {
        let mut c = Cursor::at(data, at);
        let cut = |what: String| {
            Err(TraceDatError {
                offset: at,
                message: format!("the file is cut short: {what}, and the file ends at byte {}", data.len()),
            })
        };
        let (Ok(id), Ok(_), Ok(_), Ok(size)) = (c.u16(), c.u16(), c.u32(), c.u64()) else {
            return cut("a section header starts here".into());
        };
        match usize::try_from(size).ok().and_then(|size| c.pos.checked_add(size)).filter(|&end| end <= data.len()) {
            Some(end) => at = end,
            None => return cut(format!("the section here (id {id}) holds {size} bytes")),
        }
    }
    Ok(())
}

/// A BUFFER option: `section offset: u64, name\0, clock\0, [page size: u32,] cpus: u32,
/// (cpu: u32, offset: u64, size: u64)...`.
fn buffer<'a>(
    data: &'a [u8],
    body: &[u8],
    at: usize,
    page_size: usize,
    codec: Option<Codec>,
) -> Result<Buffer<'a>, TraceDatError> {
    let mut b = Cursor::within(body, at);
    let _section = b.u64()?;
    let name = b.cstr()?;
    let clock = b.cstr()?;
    // trace-cmd 3.1 and later write the buffer's page size before the CPU count, which the
    // man page omits; each CPU entry is 20 bytes, so the remaining length tells which.
    let remaining = b.remaining();
    if remaining >= 8 && (remaining - 8) % 20 == 0 && (remaining - 4) % 20 != 0 {
        let buffer_page = b.size32()?;
        if buffer_page != page_size {
            return b.fail(format!("buffer '{name}' has {buffer_page}-byte pages, the file {page_size}"));
        }
    }
    let count = b.size32()?;
    if count.saturating_mul(20) > b.remaining() {
        return b.fail(format!("buffer '{name}' claims {count} CPUs; its option is shorter"));
    }
    let mut cpus: Vec<(u32, Vec<Segment<'a>>)> = Vec::with_capacity(count);
    for _ in 0..count {
        let cpu = b.u32()?;
        let offset = b.size64()?;
        let size = b.size64()?;
        if cpu as usize >= super::MAX_CPUS || cpus.iter().any(|(c, _)| *c == cpu) {
            return b.fail(format!("buffer '{name}' lists CPU {cpu} twice or past {}", super::MAX_CPUS));
        }
        cpus.push((cpu, cpu_segments(data, cpu, offset, size, page_size, codec)?));
    }
    Ok(Buffer { name, clock, cpus })
}

/// A BUFFER_TEXT option: `section offset: u64, name\0, clock\0`; the section holds the text.
fn buffer_text(sections: &mut Sections, body: &[u8], at: usize) -> Result<BufferText, TraceDatError> {
    let mut b = Cursor::within(body, at);
    let offset = b.size64()?;
    let name = b.cstr()?;
    let clock = b.cstr().unwrap_or_default();
    let (text, _) = sections.read(offset)?;
    Ok(BufferText { name, clock, text: String::from_utf8_lossy(&text).into_owned() })
}

/// The most one compressed metadata section may expand to (the event formats, the largest
/// read, are a few MiB; kallsyms is never expanded).
const MAX_SECTION: usize = 64 << 20;
/// The most all expanded metadata sections of a file may hold together.
const MAX_SECTIONS: usize = 256 << 20;

/// The sections of one file, each read at most once, their expansion within a budget: a file
/// whose options point at one section many times (or loop back to an options section) would
/// otherwise make a reader expand or list the same bytes without end.
struct Sections<'a> {
    data: &'a [u8],
    codec: Option<Codec>,
    read: std::collections::HashSet<usize>,
    expanded: usize,
}

impl<'a> Sections<'a> {
    fn new(data: &'a [u8], codec: Option<Codec>) -> Sections<'a> {
        Sections { data, codec, read: Default::default(), expanded: 0 }
    }

    /// A section's payload (expanded if flagged), with the byte offset it came from.
    fn read(&mut self, offset: usize) -> Result<(Cow<'a, [u8]>, usize), TraceDatError> {
        let data = self.data;
        let mut c = Cursor::at(data, offset);
        if offset >= data.len() {
            return c.fail(format!("a section offset points past the end of the file ({} bytes)", data.len()));
        }
        if !self.read.insert(offset) {
            return c.fail(
                "a second option points at the section here: trace-cmd writes each section once (the file is damaged, or made to loop)",
            );
        }
        let _id = c.u16()?;
        let flags = c.u16()?;
        let _description = c.u32()?;
        let size = c.size64()?;
        if flags & SECTION_COMPRESSED == 0 {
            let at = c.pos;
            return Ok((Cow::Borrowed(c.bytes(size)?), at));
        }
        let Some(codec) = self.codec else { return c.fail("a compressed section in a file that says 'none'") };
        let compressed = c.size32()?;
        let expanded = c.size32()?;
        let at = c.pos;
        if self.expanded.saturating_add(expanded) > MAX_SECTIONS {
            return c.fail(format!(
                "a section claims {expanded} bytes once expanded, past the {MAX_SECTIONS} bytes all of a file's metadata may take (the file is damaged, or made to exhaust memory)"
            ));
        }
        let frame = Segment::frame_at_most(codec, c.bytes(compressed)?, expanded, at, MAX_SECTION)
            .map_err(|e| TraceDatError { offset: at, message: e.to_string() })?;
        let mut out = Vec::new();
        frame.pages(&mut out).map_err(|e| TraceDatError { offset: at, message: e.to_string() })?;
        self.expanded += expanded;
        Ok((Cow::Owned(out), at))
    }
}
