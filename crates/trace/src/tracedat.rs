//! Reading trace-cmd's `trace.dat`, version 7 (what trace-cmd 3.x writes): an initial header,
//! then sections located through options. We take what a recording needs: page header, event
//! formats, saved cmdlines, the trace clock, per-CPU stats, and each CPU's raw ring-buffer
//! pages, in place: uncompressed ones as they are, zstd-compressed chunks as frames a walk
//! expands when it reaches them ([`Segment`]).
//!
//! Layout facts from trace-cmd.dat.v7(5), checked against files trace-cmd 3.1 wrote: a section
//! header is `id: u16, flags: u16, description: u32, size: u64` (the man page says the size is
//! 4 bytes; the files carry 8).

use crate::segment::Segment;

/// A problem in a trace.dat file, with its byte offset.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("trace.dat at byte {offset}: {message}")]
pub struct TraceDatError {
    /// Where.
    pub offset: usize,
    /// What.
    pub message: String,
}

/// What a recording needs from a trace.dat.
#[derive(Debug, Clone, Default)]
pub struct TraceDat<'a> {
    /// Target page size.
    pub page_size: usize,
    /// `events/header_page` text.
    pub header_page: String,
    /// (system, format text) of every event.
    pub formats: Vec<(String, String)>,
    /// `saved_cmdlines` text (`pid comm` lines).
    pub cmdlines: String,
    /// The trace clock of the flyrecord buffer.
    pub clock: String,
    /// `per_cpu/cpuN/stats` texts, in CPU order.
    pub cpu_stats: Vec<String>,
    /// Each CPU's pages, in order, borrowed from the file (compressed chunks stay compressed).
    pub cpus: Vec<(u32, Vec<Segment<'a>>)>,
}

const MAGIC: &[u8] = b"\x17\x08\x44tracing";
const OPTION_DONE: u16 = 0;
const OPTION_CPUSTAT: u16 = 2;
const OPTION_BUFFER: u16 = 3;
const OPTION_TRACECLOCK: u16 = 4;
const OPTION_HEADER_INFO: u16 = 16;
const OPTION_EVENT_FORMATS: u16 = 18;
const OPTION_CMDLINES: u16 = 21;
const SECTION_COMPRESSED: u16 = 1;

/// True if `bytes` start like a trace.dat file.
pub fn is_trace_dat(bytes: &[u8]) -> bool {
    bytes.starts_with(MAGIC)
}

/// A bounds-checked little-endian cursor over the file.
struct Cursor<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn at(data: &'a [u8], pos: usize) -> Self {
        Cursor { data, pos }
    }

    fn fail<T>(&self, message: impl Into<String>) -> Result<T, TraceDatError> {
        Err(TraceDatError { offset: self.pos, message: message.into() })
    }

    fn bytes(&mut self, n: usize) -> Result<&'a [u8], TraceDatError> {
        match self.pos.checked_add(n).filter(|&end| end <= self.data.len()) {
            Some(end) => {
                let b = &self.data[self.pos..end];
                self.pos = end;
                Ok(b)
            }
            None => self.fail(format!("needs {n} more bytes, the data ends at byte {}", self.data.len())),
        }
    }

    fn u16(&mut self) -> Result<u16, TraceDatError> {
        Ok(u16::from_le_bytes(self.bytes(2)?.try_into().expect("2")))
    }

    fn u32(&mut self) -> Result<u32, TraceDatError> {
        Ok(u32::from_le_bytes(self.bytes(4)?.try_into().expect("4")))
    }

    fn u64(&mut self) -> Result<u64, TraceDatError> {
        Ok(u64::from_le_bytes(self.bytes(8)?.try_into().expect("8")))
    }

    fn offset(&mut self) -> Result<usize, TraceDatError> {
        let v = self.u64()?;
        usize::try_from(v).or_else(|_| self.fail(format!("offset {v} is too large")))
    }

    fn cstr(&mut self) -> Result<String, TraceDatError> {
        let rest = &self.data[self.pos.min(self.data.len())..];
        let Some(len) = rest.iter().position(|&b| b == 0) else { return self.fail("unterminated string") };
        let s = String::from_utf8_lossy(&rest[..len]).into_owned();
        self.pos += len + 1;
        Ok(s)
    }

    fn text(&mut self, len: usize) -> Result<String, TraceDatError> {
        Ok(String::from_utf8_lossy(self.bytes(len)?).into_owned())
    }
}

/// Parse a version 7 trace.dat held in memory.
pub fn read(data: &[u8]) -> Result<TraceDat<'_>, TraceDatError> {
    let mut c = Cursor::at(data, 0);
    if !is_trace_dat(data) {
        return c.fail("not a trace.dat file (bad magic)");
    }
    c.pos = MAGIC.len();
    let version = c.cstr()?;
    if version != "7" {
        return c.fail(format!(
            "trace.dat version {version} is not supported (version 7 is; re-record with trace-cmd 3.x)"
        ));
    }
    let endian = c.bytes(1)?[0];
    if endian != 0 {
        return c.fail("big-endian trace.dat files are not supported");
    }
    let _long_size = c.bytes(1)?[0];
    let page_size = c.u32()? as usize;
    let compression = c.cstr()?;
    let _compression_version = c.cstr()?;
    let codec = match compression.as_str() {
        "none" => Codec::None,
        "zstd" => Codec::Zstd,
        other => return c.fail(format!("compression '{other}' is not supported (zstd and none are)")),
    };
    let mut out = TraceDat { page_size, ..Default::default() };
    let mut next_options = c.offset()?;
    let mut buffers = Vec::new();
    let mut seen = 0;
    while next_options != 0 {
        seen += 1;
        if seen > 64 {
            return c.fail("more than 64 options sections: a loop?");
        }
        let options = section(data, next_options, codec)?;
        next_options = 0;
        let mut o = Cursor::at(&options, 0);
        while o.pos < options.len() {
            let id = o.u16()?;
            let size = o.u32()? as usize;
            let body = o.bytes(size)?;
            let mut b = Cursor::at(body, 0);
            match id {
                OPTION_DONE => {
                    next_options = b.offset()?;
                    break;
                }
                OPTION_CPUSTAT => out.cpu_stats.push(b.cstr().unwrap_or_default()),
                OPTION_TRACECLOCK => out.clock = crate::tracefs::selected_clock(&b.cstr().unwrap_or_default()),
                OPTION_BUFFER => buffers.push(body.to_vec()),
                OPTION_HEADER_INFO => read_header_info(&section(data, b.offset()?, codec)?, &mut out)?,
                OPTION_EVENT_FORMATS => read_event_formats(&section(data, b.offset()?, codec)?, &mut out)?,
                OPTION_CMDLINES => {
                    let s = section(data, b.offset()?, codec)?;
                    let mut sc = Cursor::at(&s, 0);
                    let len = sc.offset()?;
                    out.cmdlines = sc.text(len)?;
                }
                _ => {}
            }
        }
    }
    for buffer in buffers {
        let mut b = Cursor::at(&buffer, 0);
        let _section = b.offset()?;
        let name = b.cstr()?;
        let clock = b.cstr()?;
        if !name.is_empty() {
            continue; // instances other than the top one are not imported
        }
        if out.clock.is_empty() {
            out.clock = clock;
        }
        // trace-cmd 3.1 writes the buffer's page size (u32) before the CPU count, which the
        // man page omits; each CPU entry is 20 bytes, so the remaining length tells which.
        let remaining = buffer.len() - b.pos;
        if remaining >= 8 && (remaining - 8) % 20 == 0 && (remaining - 4) % 20 != 0 {
            let _page_size = b.u32()?;
        }
        let count = b.u32()?;
        for _ in 0..count {
            let cpu = b.u32()?;
            let offset = b.offset()?;
            let size = b.offset()?;
            out.cpus.push((cpu, cpu_segments(data, offset, size, codec)?));
        }
    }
    if out.header_page.is_empty() {
        return c.fail("no HEADER_INFO section: the file lacks the page layout");
    }
    out.cpus.sort_by_key(|(cpu, _)| *cpu);
    Ok(out)
}

#[derive(Debug, Clone, Copy)]
enum Codec {
    None,
    Zstd,
}

fn decompress(codec: Codec, input: &[u8], expected: usize, offset: usize) -> Result<Vec<u8>, TraceDatError> {
    match codec {
        Codec::None => Ok(input.to_vec()),
        Codec::Zstd => {
            let mut out = Vec::new();
            Segment::zstd(input, expected, offset)
                .and_then(|frame| frame.pages(&mut out).map(|_| ()))
                .map_err(|e| TraceDatError { offset, message: format!("zstd: {}", e.message) })?;
            Ok(out)
        }
    }
}

/// A section's payload (decompressed if flagged).
fn section(data: &[u8], offset: usize, codec: Codec) -> Result<Vec<u8>, TraceDatError> {
    let mut c = Cursor::at(data, offset);
    let _id = c.u16()?;
    let flags = c.u16()?;
    let _description = c.u32()?;
    let size = c.offset()?;
    if flags & SECTION_COMPRESSED == 0 {
        return Ok(c.bytes(size)?.to_vec());
    }
    let compressed = c.u32()? as usize;
    let uncompressed = c.u32()? as usize;
    let at = c.pos;
    decompress(codec, c.bytes(compressed)?, uncompressed, at)
}

/// A CPU's flyrecord data: raw pages, or compressed chunks (`count`, then `comp, uncomp, data`
/// each), each chunk one zstd frame.
fn cpu_segments(data: &[u8], offset: usize, size: usize, codec: Codec) -> Result<Vec<Segment<'_>>, TraceDatError> {
    let mut c = Cursor::at(data, offset);
    if let Codec::None = codec {
        return Ok(vec![Segment::Pages(c.bytes(size)?)]);
    }
    let chunks = c.u32()?;
    let mut list = Vec::new();
    for _ in 0..chunks {
        let compressed = c.u32()? as usize;
        let uncompressed = c.u32()? as usize;
        let at = c.pos;
        let frame = c.bytes(compressed)?;
        list.push(
            Segment::zstd(frame, uncompressed, at).map_err(|e| TraceDatError { offset: at, message: e.message })?,
        );
    }
    Ok(list)
}

fn read_header_info(s: &[u8], out: &mut TraceDat) -> Result<(), TraceDatError> {
    let mut c = Cursor::at(s, 0);
    if c.cstr()? != "header_page" {
        return c.fail("HEADER_INFO does not start with header_page");
    }
    let len = c.offset()?;
    out.header_page = c.text(len)?;
    Ok(())
}

fn read_event_formats(s: &[u8], out: &mut TraceDat) -> Result<(), TraceDatError> {
    let mut c = Cursor::at(s, 0);
    let systems = c.u32()?;
    for _ in 0..systems {
        let system = c.cstr()?;
        let events = c.u32()?;
        for _ in 0..events {
            let len = c.offset()?;
            out.formats.push((system.clone(), c.text(len)?));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_what_it_cannot_read() {
        assert!(read(b"hello").unwrap_err().message.contains("bad magic"));
        let mut v6 = MAGIC.to_vec();
        v6.extend_from_slice(b"6\0\0\x08");
        assert!(read(&v6).unwrap_err().message.contains("version 6 is not supported"));
        let mut cut = MAGIC.to_vec();
        cut.extend_from_slice(b"7\0\0\x08\x00\x10");
        let e = read(&cut).unwrap_err();
        assert_eq!(e.offset, 14);
    }
}
