//! Version 6: the metadata in a fixed order right after the initial header, then blocks named
//! by a 10-byte marker: `options  ` (options up to a DONE id with no size), `latency  ` (the
//! rest of the file is text) or `flyrecord` (per CPU `offset: u64, size: u64`, then the clock
//! text when a TRACECLOCK option was given). An instance buffer's BUFFER option holds
//! `offset: u64, name\0`; at that offset lie a `flyrecord` marker and its per-CPU offsets and
//! sizes (trace-cmd 3.3 writes the marker there too).

use super::cursor::Cursor;
use super::options::{self, BUFFER, DONE, TRACECLOCK};
use super::{cpu_segments, Buffer, BufferText, TraceDat, TraceDatError};

const OPTIONS: &[u8; 10] = b"options  \0";
const LATENCY: &[u8; 10] = b"latency  \0";
const FLYRECORD: &[u8; 10] = b"flyrecord\0";

pub(super) fn read<'a>(c: &mut Cursor<'a>, out: &mut TraceDat<'a>) -> Result<(), TraceDatError> {
    let data = c.data;
    metadata(c, out)?;
    let cmdlines = c.size64()?;
    out.cmdlines = c.text(cmdlines)?;
    let cpus = c.size32()?;
    if cpus > super::MAX_CPUS {
        return c.fail(format!("the file claims {cpus} CPUs; no kernel has more than {}", super::MAX_CPUS));
    }
    let mut instances = Vec::new();
    let mut clock_given = false;
    // Each CPU table is read once: buffers pointing at one table (or at overlapping ones)
    // would list the same CPUs' data again and again.
    let mut tables = std::collections::BTreeMap::new();
    loop {
        if c.remaining() == 0 {
            return c.fail("the file ends before its trace data (no flyrecord or latency block)");
        }
        let marker = c.bytes(10)?;
        if marker == OPTIONS {
            while let Some((id, body, at)) = option(c)? {
                clock_given |= id == TRACECLOCK;
                if options::apply(id, body, at, out)? {
                    continue;
                }
                if id == BUFFER {
                    let mut b = Cursor::within(body, at);
                    instances.push((b.size64()?, b.cstr()?));
                }
            }
        } else if marker == LATENCY {
            let text = String::from_utf8_lossy(&c.data[c.pos..]).into_owned();
            out.texts.push(BufferText { name: String::new(), clock: out.clock.clone(), text });
            return Ok(());
        } else if marker == FLYRECORD {
            super::claim(&mut tables, c.pos, c.pos.saturating_add(cpus * 16));
            let top = flyrecord(data, c, cpus, out.page_size)?;
            if clock_given {
                // The trace_clock file once more, after the CPU table.
                let len = c.size64()?;
                let text = c.text(len)?;
                out.clock = crate::tracefs::selected_clock(&text);
            }
            out.buffers.push(Buffer { name: String::new(), clock: out.clock.clone(), cpus: top });
            break;
        } else {
            let shown = String::from_utf8_lossy(marker).escape_debug().to_string();
            return Err(TraceDatError {
                offset: c.pos - 10,
                message: format!("'{shown}' is none of options, latency, flyrecord"),
            });
        }
    }
    for (offset, name) in instances {
        let mut at = Cursor::at(data, offset);
        if offset >= data.len() {
            return at.fail(format!("buffer '{name}' points past the end of the file ({} bytes)", data.len()));
        }
        // trace-cmd writes the marker again there (the man page does not say so).
        if data[offset..].starts_with(FLYRECORD) {
            at.pos += FLYRECORD.len();
        }
        if !super::claim(&mut tables, at.pos, at.pos.saturating_add(cpus * 16)) {
            return at.fail(format!(
                "buffer '{name}' points at a CPU table another buffer uses: trace-cmd writes one per buffer (the file is damaged, or made to list the same data again and again)"
            ));
        }
        let cpus = flyrecord(data, &mut at, cpus, out.page_size)?;
        out.buffers.push(Buffer { name, clock: out.clock.clone(), cpus });
    }
    Ok(())
}

/// The metadata every version-6 layout starts with (perf.data's tracing data too): header
/// page and event, ftrace and event formats, kallsyms and printk formats (skipped).
pub(super) fn metadata<'a>(c: &mut Cursor<'a>, out: &mut TraceDat<'a>) -> Result<(), TraceDatError> {
    super::read_header_info(c, out)?;
    if c.cstr()? != "header_event" {
        return c.fail("header_page is not followed by header_event");
    }
    let len = c.size64()?;
    c.bytes(len)?;
    out.formats.extend(super::borrowed(super::ftrace_formats(c)?));
    out.formats.extend(super::borrowed(super::event_formats(c)?));
    let kallsyms = c.size32()?;
    c.bytes(kallsyms)?;
    let printk = c.size32()?;
    c.bytes(printk)?;
    Ok(())
}

/// An option's id, body, and the body's byte offset.
type RawOption<'a> = (u16, &'a [u8], usize);

/// One v6 option; None at DONE (which has no size in version 6).
fn option<'a>(c: &mut Cursor<'a>) -> Result<Option<RawOption<'a>>, TraceDatError> {
    let id = c.u16()?;
    if id == DONE {
        return Ok(None);
    }
    let size = c.size32()?;
    let at = c.pos;
    Ok(Some((id, c.bytes(size)?, at)))
}

/// Per CPU `offset: u64, size: u64`, CPUs numbered in order.
fn flyrecord<'a>(
    data: &'a [u8],
    c: &mut Cursor<'a>,
    cpus: usize,
    page_size: usize,
) -> Result<Vec<(u32, Vec<crate::segment::Segment<'a>>)>, TraceDatError> {
    (0..cpus)
        .map(|cpu| {
            let cpu = u32::try_from(cpu).expect("at most MAX_CPUS");
            let offset = c.size64()?;
            let size = c.size64()?;
            Ok((cpu, cpu_segments(data, cpu, offset, size, page_size, None)?))
        })
        .collect()
}
