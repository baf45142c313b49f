//! Importing ftrace *text* (`trace` file output) with the kernel's format files: each line is
//! matched against its event's own `print fmt` to recover field values, the record is encoded
//! with the format's layout, and records are packed into real ring-buffer pages, so a text
//! capture goes through the same decoder and analyzers as raw pages.
//!
//! What text can give back: `REC->field` values, `__print_symbolic` names (mapped back to their
//! values; for kvm_exit the matching table also sets `isa`), `__print_flags` (sched_switch's
//! `prev_state`) and `__get_str` strings. Other expressions leave their fields at zero, and
//! timestamps are as precise as the text (microseconds).

use std::collections::HashMap;

use crate::decode::Layout;
use crate::format::{matching_paren, parse_entries, parse_target, Condition, EventFormat, FieldKind};

/// One line of ftrace text output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextLine<'a> {
    /// Task name.
    pub comm: &'a str,
    /// Thread id.
    pub pid: u32,
    /// CPU.
    pub cpu: u32,
    /// Timestamp in ns (from `secs.usecs`).
    pub ts: u64,
    /// Event name.
    pub name: &'a str,
    /// What the print fmt produced.
    pub fields: &'a str,
}

/// Parse `comm-pid [cpu] flags secs.usecs: name: fields` (the flags column is optional, as in
/// `trace-cmd report`). Comments and malformed lines give None.
pub fn parse_line(line: &str) -> Option<TextLine<'_>> {
    if line.starts_with('#') {
        return None;
    }
    let open = line.find(" [")?;
    let task = line[..open].trim();
    let dash = task.rfind('-')?;
    let (comm, pid) = (&task[..dash], task[dash + 1..].parse().ok()?);
    let close = open + line[open..].find(']')?;
    let cpu = line[open + 2..close].trim().parse().ok()?;
    let rest = line[close + 1..].trim_start();
    let colon = rest.find(": ")?;
    let stamp = rest[..colon].split_whitespace().last()?;
    let (secs, usecs) = stamp.split_once('.')?;
    let ts = secs
        .parse::<u64>()
        .ok()?
        .checked_mul(1_000_000_000)?
        .checked_add(usecs.parse::<u64>().ok()?.checked_mul(1000)?)?;
    let after = &rest[colon + 2..];
    let (name, fields) = after.split_once(':').map_or((after.trim(), ""), |(n, f)| (n.trim(), f.trim_start()));
    Some(TextLine { comm, pid, cpu, ts, name, fields })
}

/// How a conversion's value goes back into the record.
#[derive(Debug, Clone)]
enum Sink {
    /// `REC->field`.
    Field(String),
    /// `__print_symbolic(REC->field ...)`: name → value (and the `isa` value its table implies).
    Symbolic { field: String, names: HashMap<String, (u64, Option<(String, u64)>)> },
    /// `__print_flags(REC->field, "|", ...)`.
    Flags { field: String, delim: String, flags: HashMap<String, u64> },
    /// `__get_str(field)`.
    Str(String),
    /// Not recoverable from text.
    Ignore,
}

#[derive(Debug, Clone)]
enum Piece {
    Literal(String),
    Conversion { hex: bool, sink: Sink },
}

/// Builds binary records of one layout from text lines.
pub struct TextEncoder<'a> {
    layout: &'a Layout,
    by_name: HashMap<&'a str, (&'a EventFormat, Vec<Piece>)>,
}

impl<'a> TextEncoder<'a> {
    /// Prepare a matcher for every event's print fmt.
    pub fn new(layout: &'a Layout) -> Self {
        let by_name = layout.formats().iter().map(|f| (f.name.as_str(), (f, pieces(f)))).collect();
        TextEncoder { layout, by_name }
    }

    /// The record bytes for one line, or why not.
    pub fn encode(&self, line: &TextLine<'_>) -> Result<Vec<u8>, String> {
        let (format, pieces) =
            self.by_name.get(line.name).ok_or_else(|| format!("no format for event '{}'", line.name))?;
        let size = format.fields.iter().map(|f| f.offset + f.size).max().unwrap_or(8);
        let mut rec = vec![0u8; size];
        let put = |rec: &mut Vec<u8>, name: &str, value: u64| {
            if let Some(f) = format.field(name).filter(|f| f.kind == FieldKind::Int) {
                let bytes = value.to_le_bytes();
                rec[f.offset..f.offset + f.size.min(8)].copy_from_slice(&bytes[..f.size.min(8)]);
            }
        };
        put(&mut rec, "common_type", u64::from(format.id));
        put(&mut rec, "common_pid", u64::from(line.pid));
        let mut strings: Vec<(String, String)> = Vec::new();
        let mut text = line.fields;
        for (i, piece) in pieces.iter().enumerate() {
            match piece {
                Piece::Literal(lit) => match text.strip_prefix(lit.as_str()) {
                    Some(rest) => text = rest,
                    None => break, // the line no longer follows the format: keep what matched
                },
                Piece::Conversion { hex, sink } => {
                    let end = match pieces.get(i + 1) {
                        Some(Piece::Literal(next)) if !next.is_empty() => {
                            text.find(next.as_str()).unwrap_or(text.len())
                        }
                        // Another conversion follows directly (`%s%s`): take only what this
                        // one's names can spell, and leave the rest to the next.
                        _ => names_prefix(sink, text).unwrap_or_else(|| {
                            let next_literal = pieces[i + 1..].iter().find_map(|p| match p {
                                Piece::Literal(l) if !l.is_empty() => Some(l.as_str()),
                                _ => None,
                            });
                            next_literal.and_then(|l| text.find(l)).unwrap_or(text.len())
                        }),
                    };
                    let token = &text[..end];
                    text = &text[end..];
                    let number = || parse_number(token, *hex);
                    match sink {
                        Sink::Field(name) => match format.field(name).map(|f| f.kind) {
                            Some(FieldKind::Int) => put(&mut rec, name, number().unwrap_or(0)),
                            Some(FieldKind::Array { is_char: true, .. }) => {
                                let f = format.field(name).expect("checked");
                                let n = token.len().min(f.size.saturating_sub(1));
                                rec[f.offset..f.offset + n].copy_from_slice(&token.as_bytes()[..n]);
                            }
                            _ => {}
                        },
                        Sink::Symbolic { field, names } => {
                            if let Some((value, isa)) = names.get(token) {
                                put(&mut rec, field, *value);
                                if let Some((isa_field, isa_value)) = isa {
                                    put(&mut rec, isa_field, *isa_value);
                                }
                            }
                        }
                        Sink::Flags { field, delim, flags } => {
                            let value = token.split(delim.as_str()).filter_map(|f| flags.get(f)).fold(0, |a, b| a | b);
                            if value != 0 {
                                put(&mut rec, field, value);
                            }
                        }
                        Sink::Str(name) => strings.push((name.clone(), token.to_string())),
                        Sink::Ignore => {}
                    }
                }
            }
        }
        // __data_loc strings go after the fixed part: low 16 bits offset, high 16 bits length.
        for (name, value) in strings {
            if let Some(f) = format.field(&name).filter(|f| matches!(f.kind, FieldKind::DataLoc { .. })) {
                // A __data_loc holds a 16-bit offset and a 16-bit length.
                let (Ok(offset), Ok(len)) = (u16::try_from(rec.len()), u16::try_from(value.len() + 1)) else {
                    continue;
                };
                rec.extend_from_slice(value.as_bytes());
                rec.push(0);
                let loc = u32::from(offset) | (u32::from(len) << 16);
                rec[f.offset..f.offset + 4].copy_from_slice(&loc.to_le_bytes());
            }
        }
        Ok(rec)
    }

    /// The layout encoded for.
    pub fn layout(&self) -> &Layout {
        self.layout
    }
}

fn parse_number(token: &str, hex: bool) -> Option<u64> {
    let t = token.trim();
    let (negative, t) = match t.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, t),
    };
    let t = t.strip_prefix("0x").unwrap_or(t);
    let v = if hex { u64::from_str_radix(t, 16).ok()? } else { t.parse::<u64>().ok()? };
    Some(if negative { v.wrapping_neg() } else { v })
}

/// Split a print fmt into literal pieces and conversions bound to their arguments.
fn pieces(format: &EventFormat) -> Vec<Piece> {
    let pf = format.print_fmt.trim();
    let Some(body) = pf.strip_prefix('"') else { return Vec::new() };
    let mut fmt = String::new();
    let mut chars = body.chars();
    let mut rest_start = None;
    let mut consumed = 1;
    while let Some(c) = chars.next() {
        consumed += c.len_utf8();
        match c {
            '\\' => {
                if let Some(n) = chars.next() {
                    consumed += n.len_utf8();
                    fmt.push(match n {
                        'n' => '\n',
                        't' => '\t',
                        other => other,
                    });
                }
            }
            '"' => {
                rest_start = Some(consumed);
                break;
            }
            c => fmt.push(c),
        }
    }
    let args = rest_start.map(|s| split_args(&pf[s..])).unwrap_or_default();
    let mut out = Vec::new();
    let mut literal = String::new();
    let mut arg = 0;
    let mut it = fmt.chars().peekable();
    while let Some(c) = it.next() {
        if c != '%' {
            literal.push(c);
            continue;
        }
        if it.peek() == Some(&'%') {
            it.next();
            literal.push('%');
            continue;
        }
        let mut spec = String::new();
        while let Some(&n) = it.peek() {
            it.next();
            if n.is_ascii_alphabetic() && !matches!(n, 'l' | 'h' | 'z') {
                spec.push(n);
                break;
            }
            spec.push(n);
        }
        out.push(Piece::Literal(std::mem::take(&mut literal)));
        let conv = spec.chars().last().unwrap_or('d');
        let sink = args.get(arg).map_or(Sink::Ignore, |a| sink_for(format, a));
        arg += 1;
        out.push(Piece::Conversion { hex: matches!(conv, 'x' | 'X' | 'p'), sink });
    }
    out.push(Piece::Literal(literal));
    out
}

/// The arguments after the format string, split at top-level commas.
fn split_args(s: &str) -> Vec<String> {
    let (mut depth, mut in_string, mut current) = (0i32, false, String::new());
    let mut args = Vec::new();
    for c in s.chars() {
        match c {
            '"' => in_string = !in_string,
            '(' | '{' if !in_string => depth += 1,
            ')' | '}' if !in_string => depth -= 1,
            ',' if !in_string && depth == 0 => {
                if !current.trim().is_empty() {
                    args.push(current.trim().to_string());
                }
                current.clear();
                continue;
            }
            _ => {}
        }
        current.push(c);
    }
    if !current.trim().is_empty() {
        args.push(current.trim().to_string());
    }
    args
}

fn sink_for(format: &EventFormat, arg: &str) -> Sink {
    if let Some(field) = arg.strip_prefix("REC->").filter(|f| f.chars().all(|c| c.is_alphanumeric() || c == '_')) {
        return Sink::Field(field.to_string());
    }
    if let Some(pos) = arg.find("__print_symbolic(") {
        let body = &arg[pos + "__print_symbolic(".len()..];
        if let Some((field, _)) = body.split_once(',').and_then(|(t, _)| parse_target(t)) {
            let mut names = HashMap::new();
            for table in format.tables_for(&field) {
                let isa = match &table.condition {
                    Condition::FieldEq(f, v) => Some((f.clone(), *v as u64)),
                    // SVM is the other instruction set kvm_exit names (isa 2).
                    Condition::FieldNe(f, v) => Some((f.clone(), if *v == 1 { 2 } else { 0 })),
                    Condition::Always => None,
                };
                for (value, name) in &table.entries {
                    names.entry(name.clone()).or_insert((*value as u64, isa.clone()));
                }
            }
            return Sink::Symbolic { field, names };
        }
    }
    if let Some(pos) = arg.find("__print_flags(") {
        let body = &arg[pos + "__print_flags(".len()..];
        let body = &body[..matching_paren(body).unwrap_or(body.len())];
        let mut parts = body.splitn(3, ',');
        if let (Some(target), Some(delim), Some(entries)) = (parts.next(), parts.next(), parts.next()) {
            // The target may carry a computed mask (sched_switch's prev_state): take the field.
            if let Some(field) = first_field(target) {
                let delim = delim.trim().trim_matches('"').to_string();
                let flags = parse_entries(entries).into_iter().map(|(v, n)| (n, v as u64)).collect();
                return Sink::Flags { field, delim, flags };
            }
        }
    }
    if let Some(name) = arg.strip_prefix("__get_str(").and_then(|r| r.strip_suffix(')')) {
        return Sink::Str(name.trim().to_string());
    }
    Sink::Ignore
}

/// Length of the longest prefix of `text` spelled by a flags or symbolic sink's names (None
/// for other sinks).
fn names_prefix(sink: &Sink, text: &str) -> Option<usize> {
    match sink {
        Sink::Symbolic { names, .. } => {
            Some(names.keys().filter(|n| text.starts_with(n.as_str())).map(String::len).max().unwrap_or(0))
        }
        Sink::Flags { flags, delim, .. } => {
            let mut end = 0;
            loop {
                let rest = &text[end..];
                let Some(n) = flags.keys().filter(|n| rest.starts_with(n.as_str())).map(String::len).max() else {
                    break;
                };
                end += n;
                match text[end..].strip_prefix(delim.as_str()) {
                    Some(_) if !delim.is_empty() => end += delim.len(),
                    _ => break,
                }
            }
            Some(end)
        }
        _ => None,
    }
}

/// The first `REC->name` in an expression.
fn first_field(expr: &str) -> Option<String> {
    let rest = &expr[expr.find("REC->")? + 5..];
    let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
    (!name.is_empty()).then_some(name)
}

/// Packs records into ring-buffer pages of the layout's page format (one writer per CPU).
pub struct PageWriter {
    page_size: usize,
    data_offset: usize,
    page: Vec<u8>,
    used: usize,
    last_ts: u64,
    /// Events lost before the current page (flagged on it, the count stored after its data).
    lost: Option<u64>,
    /// Finished pages.
    pub pages: Vec<u8>,
}

impl PageWriter {
    /// A writer for pages of `layout`.
    pub fn new(layout: &Layout) -> Self {
        let h = layout.header;
        PageWriter {
            page_size: h.page_size,
            data_offset: h.data_offset,
            page: Vec::new(),
            used: 0,
            last_ts: 0,
            lost: None,
            pages: Vec::new(),
        }
    }

    /// `count` events were lost here: the next page says so, as the kernel flags a page
    /// that follows a gap (the missed-events bits, the count after the data).
    pub fn lost(&mut self, ts: u64, count: u64) {
        self.flush();
        self.lost = Some(count);
        self.page = vec![0u8; self.page_size];
        self.page[0..8].copy_from_slice(&ts.to_le_bytes());
        self.last_ts = ts;
    }

    /// Append one record at `ts` (timestamps must not go backwards); an error if the record
    /// cannot fit even an empty page.
    pub fn push(&mut self, ts: u64, record: &[u8]) -> Result<(), String> {
        let padded = record.len().div_ceil(4) * 4;
        let long = padded > 28 * 4;
        let need = 8 + padded + if long { 4 } else { 0 };
        // A page after a gap keeps room for the lost count after its data.
        let reserve = if self.lost.is_some() { 8 } else { 0 };
        let capacity = self.page_size.saturating_sub(self.data_offset + reserve);
        if need > capacity {
            return Err(format!("a record of {} bytes does not fit a page of {capacity}", record.len()));
        }
        // A time extend takes two more words (found by fuzzing: it overran a full page).
        let extend = if ts.saturating_sub(self.last_ts) >= 1 << 27 { 8 } else { 0 };
        if self.page.is_empty() || self.used + need + extend > capacity {
            self.flush();
            self.page = vec![0u8; self.page_size];
            self.page[0..8].copy_from_slice(&ts.to_le_bytes());
            self.last_ts = ts;
        }
        let mut delta = ts.saturating_sub(self.last_ts);
        if delta >= 1 << 27 {
            // Time extend: 27 low bits in the header, the rest in the following word.
            let low = u32::try_from(delta & ((1 << 27) - 1)).expect("27 bits");
            self.word(30 | (low << 5));
            self.word(u32::try_from(delta >> 27).unwrap_or(u32::MAX));
            delta = 0;
        }
        let delta = u32::try_from(delta).expect("below 2^27 here") << 5;
        let padded_word = u32::try_from(padded).expect("a record fits a page");
        if long {
            self.word(delta);
            self.word(padded_word + 4);
        } else {
            self.word((padded_word / 4) | delta);
        }
        let at = self.data_offset + self.used;
        self.page[at..at + record.len()].copy_from_slice(record);
        self.used += padded;
        self.last_ts = ts;
        Ok(())
    }

    fn word(&mut self, w: u32) {
        let at = self.data_offset + self.used;
        self.page[at..at + 4].copy_from_slice(&w.to_le_bytes());
        self.used += 4;
    }

    /// Close the current page.
    pub fn flush(&mut self) {
        if self.page.is_empty() {
            return;
        }
        let mut commit = self.used as u64;
        if let Some(count) = self.lost.take() {
            // RB_MISSED_EVENTS | RB_MISSED_STORED, sign-extended as a 64-bit kernel stores it.
            let flagged = u32::try_from(commit).expect("a page's size") | 0xc000_0000;
            commit = u64::from(flagged) | 0xffff_ffff_0000_0000;
            let at = self.data_offset + self.used;
            self.page[at..at + 8].copy_from_slice(&count.to_le_bytes());
        }
        self.page[8..16].copy_from_slice(&commit.to_le_bytes());
        self.pages.extend_from_slice(&self.page);
        self.page.clear();
        self.used = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 64-byte pages: three 8-byte records fill one.
    fn small_page() -> crate::format::PageHeader {
        crate::format::PageHeader {
            timestamp_offset: 0,
            commit_offset: 8,
            commit_size: 8,
            data_offset: 16,
            page_size: 64,
            scale: None,
        }
    }

    #[test]
    fn a_gap_flags_the_next_page_with_its_count() {
        let header = small_page();
        let layout = Layout::new(header, Vec::new());
        let mut w = PageWriter::new(&layout);
        w.push(1, &[1u8; 8]).unwrap();
        w.lost(50, 7);
        for ts in 60..64 {
            w.push(ts, &[2u8; 8]).unwrap();
        }
        w.flush();
        let pages: Vec<_> = w.pages.chunks(64).map(|p| crate::page::Page::parse(p, &header).unwrap()).collect();
        assert_eq!(pages.len(), 3, "the flagged page keeps room for its count");
        assert_eq!(pages[0].missed, crate::page::Missed::None);
        assert_eq!((pages[1].missed, pages[1].base_ts()), (crate::page::Missed::Lost(Some(7)), 50));
        assert_eq!(pages[1].records().count() + pages[2].records().count(), 4);
    }

    #[test]
    fn a_time_extend_at_the_end_of_a_page_starts_a_new_one() {
        // Found by the fuzzer: a far timestamp's extend words overran a nearly full page.
        let header = small_page();
        let layout = Layout::new(header, Vec::new());
        let mut w = PageWriter::new(&layout);
        // Three records of 4 + 8 bytes leave 12 of 48: room for the record, not its extend.
        for i in 0..3 {
            w.push(i, &[0u8; 8]).unwrap();
        }
        w.push(1 << 40, &[0u8; 4]).unwrap();
        w.flush();
        assert_eq!(w.pages.len(), 2 * 64);
        assert!(w.push(1 << 41, &[0u8; 64]).unwrap_err().contains("does not fit"));
    }

    #[test]
    fn a_timestamp_too_large_is_not_a_line() {
        // Found by the fuzzer: the microseconds times 1000 overflowed.
        assert!(parse_line("qemu-1 [000] 1.99999999999999999: kvm_exit: reason 1").is_none());
        assert!(parse_line("qemu-1 [000] 18446744074.000001: kvm_exit: reason 1").is_none());
    }

    #[test]
    fn parses_trace_and_report_lines() {
        let l = parse_line("          <idle>-0       [001] dnh1.     8.215030: reschedule_entry: vector=253").unwrap();
        assert_eq!(
            (l.comm, l.pid, l.cpu, l.ts, l.name, l.fields),
            ("<idle>", 0, 1, 8_215_030_000, "reschedule_entry", "vector=253")
        );
        let r = parse_line("       kvm_probe-436   [000]    26.908324: local_timer_entry:    vector=236").unwrap();
        assert_eq!((r.pid, r.cpu, r.name, r.fields), (436, 0, "local_timer_entry", "vector=236"));
        assert!(parse_line("# tracer: nop").is_none());
        assert!(parse_line("garbage").is_none());
    }

    #[test]
    fn splits_args_at_top_level() {
        assert_eq!(
            split_args(r#", REC->a, f(REC->b, "x,y"), { 1, "z" }"#),
            ["REC->a", r#"f(REC->b, "x,y")"#, r#"{ 1, "z" }"#]
        );
    }
}
