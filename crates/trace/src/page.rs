//! Decoding of one raw ring-buffer page (`trace_pipe_raw`): the page header (base timestamp,
//! commit word with the missed-events flags), then compressed event headers — data records,
//! padding, time extends and absolute timestamps. Sans-IO: a `&[u8]` in, borrowed records out,
//! nothing allocated.

use virtprof_model::clock::TimeScale;

use crate::format::PageHeader;

/// Type codes of the compressed event header (`events/header_event`).
const TYPE_PADDING: u32 = 29;
const TYPE_TIME_EXTEND: u32 = 30;
const TYPE_TIME_STAMP: u32 = 31;
/// Commit-word flags: events were lost before this page, and their count is stored after the
/// data (kernel `RB_MISSED_EVENTS`, `RB_MISSED_STORED`). The kernel defines them as `int`s
/// and *adds* them to the `long` commit word, so on a 64-bit kernel the sign of
/// `RB_MISSED_EVENTS` (`1 << 31`) fills the upper 32 bits: a lossy page's raw word reads e.g.
/// `0xffff_ffff_c000_0fe0` (both flags, 0xfe0 bytes of data).
const MISSED_EVENTS: u64 = 1 << 31;
const MISSED_STORED: u64 = 1 << 30;
/// The data size within the commit word: the kernel's `~RB_MISSED_MASK`, which as an `int`
/// promoted to `long` keeps the low 30 bits.
const COMMIT_SIZE_MASK: u64 = (1 << 30) - 1;
/// Absolute timestamps carry 59 bits; the page base supplies the rest.
const ABS_TS_MASK: u64 = (1 << 59) - 1;

/// A decoding problem, with its byte offset inside the page.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("at byte {offset} of the page: {message}")]
pub struct PageError {
    /// Offset inside the page.
    pub offset: usize,
    /// What is wrong.
    pub message: String,
}

/// Events the kernel dropped before a page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Missed {
    /// Nothing lost.
    None,
    /// Events lost; the count when the kernel stored it.
    Lost(Option<u64>),
}

/// One data record: its timestamp and its bytes (starting with `common_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawRecord<'a> {
    /// Timestamp in the trace clock.
    pub ts: u64,
    /// The event's bytes.
    pub data: &'a [u8],
}

impl RawRecord<'_> {
    /// The tracefs event id (`common_type`), or None for a record too short to hold one.
    pub fn event_id(&self) -> Option<u16> {
        Some(u16::from_le_bytes(self.data.get(..2)?.try_into().ok()?))
    }
}

/// A page ready to iterate.
#[derive(Debug, Clone, Copy)]
pub struct Page<'a> {
    data: &'a [u8],
    data_offset: usize,
    /// As stored (the records' deltas add to it in the same unit).
    base_ts: u64,
    scale: Option<TimeScale>,
    /// Events lost before this page.
    pub missed: Missed,
}

impl<'a> Page<'a> {
    /// Parse the page header. `page` is one whole page as `trace_pipe_raw` returns it.
    pub fn parse(page: &'a [u8], header: &PageHeader) -> Result<Page<'a>, PageError> {
        let err = |offset, message: String| PageError { offset, message };
        if page.len() < header.data_offset {
            return Err(err(
                0,
                format!("page of {} bytes is shorter than its {}-byte header", page.len(), header.data_offset),
            ));
        }
        let base_ts = read_u64(page, header.timestamp_offset);
        let commit = match header.commit_size {
            8 => read_u64(page, header.commit_offset),
            _ => u64::from(read_u32(page, header.commit_offset)),
        };
        let flags = commit & (MISSED_EVENTS | MISSED_STORED);
        // Above bit 31 only the sign extension of RB_MISSED_EVENTS may appear; anything else
        // is damage, not a kernel page.
        let high = commit >> 32;
        let expected_high = if flags & MISSED_EVENTS != 0 && header.commit_size == 8 { 0xffff_ffff } else { 0 };
        if high != expected_high || commit & !(COMMIT_SIZE_MASK | MISSED_EVENTS | MISSED_STORED) & 0xffff_ffff != 0 {
            return Err(err(header.commit_offset, format!("commit word {commit:#x} has bits no kernel sets")));
        }
        // At most 30 bits, so always a usize.
        let size = (commit & COMMIT_SIZE_MASK) as usize;
        let end = header.data_offset + size;
        if end > page.len() {
            return Err(err(
                header.commit_offset,
                format!("commit size {size} runs past the {}-byte page", page.len()),
            ));
        }
        // The count is an `unsigned long` right after the data, when the kernel had room for it.
        let missed = if flags & MISSED_EVENTS == 0 {
            Missed::None
        } else if flags & MISSED_STORED != 0 && end + header.commit_size <= page.len() {
            let count = match header.commit_size {
                8 => read_u64(page, end),
                _ => u64::from(read_u32(page, end)),
            };
            Missed::Lost(Some(count))
        } else {
            Missed::Lost(None)
        };
        Ok(Page {
            data: &page[header.data_offset..end],
            data_offset: header.data_offset,
            base_ts,
            scale: header.scale,
            missed,
        })
    }

    /// The page's base timestamp, in nanoseconds.
    pub fn base_ts(&self) -> u64 {
        scaled(self.scale, self.base_ts)
    }

    /// The data records, in order.
    pub fn records(&self) -> Records<'a> {
        Records {
            data: self.data,
            data_offset: self.data_offset,
            pos: 0,
            ts: self.base_ts,
            base_ts: self.base_ts,
            scale: self.scale,
            failed: false,
            error: None,
        }
    }
}

/// Iterator over a page's data records; stops at the first error (after yielding it).
#[derive(Debug, Clone)]
pub struct Records<'a> {
    data: &'a [u8],
    data_offset: usize,
    pos: usize,
    /// Raw (unscaled), as the deltas add up.
    ts: u64,
    base_ts: u64,
    scale: Option<TimeScale>,
    failed: bool,
    /// Where the page was found damaged, until taken.
    error: Option<PageError>,
}

impl<'a> Records<'a> {
    /// The timestamp reached so far, in nanoseconds: after the last record, the page's last
    /// event time.
    pub fn ts(&self) -> u64 {
        scaled(self.scale, self.ts)
    }

    fn fail(&mut self, message: String) -> Option<RawRecord<'a>> {
        self.failed = true;
        self.error = Some(PageError { offset: self.data_offset + self.pos, message });
        None
    }

    /// Where the page was found damaged, once [`Records::next_record`] stopped there.
    pub fn take_error(&mut self) -> Option<PageError> {
        self.error.take()
    }

    /// The next record; None at the end of the page or where it is damaged, which
    /// [`Records::take_error`] then says. The iterator gives the same as `Result`s; this is
    /// the decoding threads' loop, which moves less.
    #[inline(always)]
    pub fn next_record(&mut self) -> Option<RawRecord<'a>> {
        loop {
            if self.failed || self.pos + 4 > self.data.len() {
                return None;
            }
            let word = read_u32(self.data, self.pos);
            let (type_len, delta) = (word & 0x1f, u64::from(word >> 5));
            let array0 = || (self.pos + 8 <= self.data.len()).then(|| read_u32(self.data, self.pos + 4));
            match type_len {
                TYPE_PADDING => {
                    let len = array0()?;
                    if delta == 0 {
                        // A null padding event: the rest of the page is unused.
                        return None;
                    }
                    self.pos += 4 + len as usize;
                }
                TYPE_TIME_EXTEND => {
                    let Some(high) = array0() else {
                        return self.fail("truncated time extend".into());
                    };
                    self.ts = self.ts.wrapping_add(delta | (u64::from(high) << 27));
                    self.pos += 8;
                }
                TYPE_TIME_STAMP => {
                    let Some(high) = array0() else {
                        return self.fail("truncated absolute timestamp".into());
                    };
                    let abs = delta | (u64::from(high) << 27);
                    self.ts = (self.base_ts & !ABS_TS_MASK) | (abs & ABS_TS_MASK);
                    self.pos += 8;
                }
                0 => {
                    let Some(len) = array0() else {
                        return self.fail("truncated length word".into());
                    };
                    let (start, len) = (self.pos + 8, (len as usize).saturating_sub(4));
                    if len == 0 || start + len > self.data.len() {
                        return self.fail(format!("record length {len} does not fit the page"));
                    }
                    self.ts = self.ts.wrapping_add(delta);
                    self.pos = start + align4(len);
                    return Some(RawRecord { ts: scaled(self.scale, self.ts), data: &self.data[start..start + len] });
                }
                n => {
                    let (start, len) = (self.pos + 4, n as usize * 4);
                    if start + len > self.data.len() {
                        return self.fail(format!("record of {len} bytes does not fit the page"));
                    }
                    self.ts = self.ts.wrapping_add(delta);
                    self.pos = start + len;
                    return Some(RawRecord { ts: scaled(self.scale, self.ts), data: &self.data[start..start + len] });
                }
            }
        }
    }
}

impl<'a> Iterator for Records<'a> {
    type Item = Result<RawRecord<'a>, PageError>;

    fn next(&mut self) -> Option<Self::Item> {
        match self.next_record() {
            Some(record) => Some(Ok(record)),
            None => self.take_error().map(Err),
        }
    }
}

/// A stored timestamp in nanoseconds.
#[inline]
fn scaled(scale: Option<TimeScale>, ts: u64) -> u64 {
    match scale {
        None => ts,
        Some(scale) => scale.apply(ts),
    }
}

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

pub(crate) fn read_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

pub(crate) fn read_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: PageHeader = PageHeader {
        timestamp_offset: 0,
        commit_offset: 8,
        commit_size: 8,
        data_offset: 16,
        page_size: 4096,
        scale: None,
    };

    /// The kernel's flag values as it applies them: `int` constants added to a `long`.
    const KERNEL_MISSED_EVENTS: i64 = (1i32 << 31) as i64;
    const KERNEL_MISSED_STORED: i64 = 1 << 30;

    /// A page whose commit word is the data size plus `kernel_flags`, added as the kernel
    /// adds them (`local_add`).
    fn page(base: u64, kernel_flags: i64, events: &[u32]) -> Vec<u8> {
        let mut p = vec![0u8; 4096];
        p[0..8].copy_from_slice(&base.to_le_bytes());
        let size = (events.len() * 4) as i64;
        p[8..16].copy_from_slice(&size.wrapping_add(kernel_flags).to_le_bytes());
        for (i, w) in events.iter().enumerate() {
            p[16 + 4 * i..20 + 4 * i].copy_from_slice(&w.to_le_bytes());
        }
        p
    }

    fn header(type_len: u32, delta: u32) -> u32 {
        type_len | (delta << 5)
    }

    #[test]
    fn decodes_data_extends_and_absolute_stamps() {
        let events = [
            header(2, 10),
            0x0000_0007,
            0xaaaa_aaaa, // 8-byte record, +10
            header(TYPE_TIME_EXTEND, 5),
            1, // +5 + (1 << 27)
            header(1, 3),
            0x0000_0009, // 4-byte record, +3
            header(TYPE_TIME_STAMP, 42),
            0, // absolute 42
            header(0, 1),
            12,
            0x0000_000b,
            0xbbbb_bbbb, // long form: len word 12 = 8 data bytes + 4
        ];
        let p = page(1000, 0, &events);
        let page = Page::parse(&p, &HEADER).unwrap();
        assert_eq!(page.missed, Missed::None);
        let recs: Vec<_> = page.records().map(Result::unwrap).collect();
        assert_eq!(recs.len(), 3);
        assert_eq!((recs[0].ts, recs[0].event_id(), recs[0].data.len()), (1010, Some(7), 8));
        assert_eq!(recs[1].ts, 1010 + 5 + (1 << 27) + 3);
        assert_eq!((recs[2].ts, recs[2].event_id(), recs[2].data.len()), (43, Some(11), 8));
    }

    #[test]
    fn reports_missed_events() {
        let mut p = page(0, KERNEL_MISSED_STORED + KERNEL_MISSED_EVENTS, &[header(1, 1), 5]);
        p[16 + 8..16 + 16].copy_from_slice(&77u64.to_le_bytes());
        let page_ = Page::parse(&p, &HEADER).unwrap();
        assert_eq!(page_.missed, Missed::Lost(Some(77)));
        assert_eq!(page_.records().count(), 1);
        let p = page(0, KERNEL_MISSED_EVENTS, &[header(1, 1), 5]);
        assert_eq!(Page::parse(&p, &HEADER).unwrap().missed, Missed::Lost(None));
    }

    #[test]
    fn a_real_lossy_commit_word_decodes() {
        // Copied from a page this kernel (6.18) wrote with a 4 KB buffer: both flags set,
        // 0xfe0 bytes of data, and the stored count right after them.
        let mut p = vec![0u8; 4096];
        p[8..16].copy_from_slice(&0xffff_ffff_c000_0fe0u64.to_le_bytes());
        p[16 + 0xfe0..16 + 0xfe8].copy_from_slice(&605_904u64.to_le_bytes());
        let page = Page::parse(&p, &HEADER).unwrap();
        assert_eq!(page.missed, Missed::Lost(Some(605_904)));
        assert_eq!(page.data.len(), 0xfe0);
    }

    #[test]
    fn stray_high_bits_are_damage() {
        for word in [0x0000_0001_0000_0010u64, 0xffff_ffff_0000_0010, 0x8000_0000_8000_0010] {
            let mut p = page(0, 0, &[]);
            p[8..16].copy_from_slice(&word.to_le_bytes());
            let e = Page::parse(&p, &HEADER).unwrap_err();
            assert!(e.message.contains("no kernel sets"), "{word:#x}: {e}");
        }
    }

    #[test]
    fn padding_and_corruption() {
        let p = page(0, 0, &[header(TYPE_PADDING, 7), 4, 0xdead, header(1, 1), 5]);
        assert_eq!(Page::parse(&p, &HEADER).unwrap().records().count(), 1);
        let p = page(0, 0, &[header(28, 1), 5]);
        let mut recs = Page::parse(&p, &HEADER).unwrap().records();
        assert!(recs.next().unwrap().unwrap_err().message.contains("does not fit"));
        assert!(recs.next().is_none());
        let mut p = page(0, 0, &[]);
        p[8..16].copy_from_slice(&5000u64.to_le_bytes());
        assert!(Page::parse(&p, &HEADER).unwrap_err().message.contains("runs past"));
    }
}
