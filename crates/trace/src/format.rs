//! Event layouts from the kernel's own `events/SYS/NAME/format` files and `header_page`, and
//! symbol tables from the `__print_symbolic(...)` calls in each print fmt. Nothing here is a
//! hard-coded table: VMX, SVM and future vendors are named the way the recorded kernel names
//! them.

use std::fmt;

use virtprof_model::clock::TimeScale;

/// Where a format-file problem is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what}: {}{message}", if *line == 0 { String::new() } else { format!("line {line}: ") })]
pub struct FormatError {
    /// Which file or event (e.g. `kvm/kvm_exit/format`).
    pub what: String,
    /// 1-based line number (0: the file as a whole).
    pub line: usize,
    /// What is wrong.
    pub message: String,
}

/// How a field's bytes are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldKind {
    /// An integer (or pointer) of `size` bytes.
    Int,
    /// A fixed array; `char x[16]` is a string.
    Array {
        /// Bytes per element.
        elem_size: usize,
        /// Element type is `char`.
        is_char: bool,
    },
    /// `__data_loc`: a u32 whose low 16 bits are the offset of the data within the record and
    /// high 16 bits its length.
    DataLoc {
        /// Element type is `char`.
        is_char: bool,
    },
    /// `__rel_loc`: like `__data_loc`, with the offset relative to the end of this field.
    RelLoc {
        /// Element type is `char`.
        is_char: bool,
    },
}

/// One field of an event record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    /// Field name (`exit_reason`, `common_pid`).
    pub name: String,
    /// The C type as declared.
    pub c_type: String,
    /// Byte offset in the record.
    pub offset: usize,
    /// Size in bytes.
    pub size: usize,
    /// Signed integer.
    pub signed: bool,
    /// Layout.
    pub kind: FieldKind,
}

/// When a symbol table applies: `(REC->isa == 1) ? __print_symbolic(A) : __print_symbolic(B)`
/// gives A `FieldEq("isa", 1)` and B `FieldNe("isa", 1)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Condition {
    /// Always.
    Always,
    /// When another field equals a value.
    FieldEq(String, i64),
    /// When another field differs from a value.
    FieldNe(String, i64),
}

/// One `__print_symbolic` table: the value of `field & mask` names a symbol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SymbolTable {
    /// The field it decodes.
    pub field: String,
    /// Mask applied to the field first (`!0` when none).
    pub mask: u64,
    /// When it applies.
    pub condition: Condition,
    /// (value, name), in the kernel's order.
    pub entries: Vec<(i64, String)>,
}

impl SymbolTable {
    /// The name of `value` (after masking), if the table has one.
    pub fn lookup(&self, value: u64) -> Option<&str> {
        let v = value & self.mask;
        self.entries
            .iter()
            .find(|(k, _)| *k as u64 & self.mask == v || (*k < 0 && *k as u64 == value))
            .map(|(_, n)| n.as_str())
    }
}

/// An event's layout and print format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventFormat {
    /// tracefs event id (`common_type`).
    pub id: u16,
    /// Subsystem (`kvm`).
    pub system: String,
    /// Event name (`kvm_exit`).
    pub name: String,
    /// All fields, common ones first.
    pub fields: Vec<Field>,
    /// The print fmt line after `print fmt: `.
    pub print_fmt: String,
    /// Symbol tables found in the print fmt.
    pub symbols: Vec<SymbolTable>,
}

impl EventFormat {
    /// A field by name.
    pub fn field(&self, name: &str) -> Option<&Field> {
        self.fields.iter().find(|f| f.name == name)
    }

    /// The tables that decode `field`.
    pub fn tables_for<'a>(&'a self, field: &'a str) -> impl Iterator<Item = &'a SymbolTable> + 'a {
        self.symbols.iter().filter(move |t| t.field == field)
    }
}

impl fmt::Display for EventFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{} (id {})", self.system, self.name, self.id)
    }
}

/// Parse one `format` file of event system `system`.
pub fn parse_event_format(system: &str, text: &str) -> Result<EventFormat, FormatError> {
    let what = || format!("{system}/format");
    let err = |line: usize, message: String| FormatError { what: what(), line, message };
    let (mut name, mut id, mut print_fmt) = (None, None, None);
    let mut fields = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        let t = line.trim();
        if let Some(v) = t.strip_prefix("name:") {
            name = Some(v.trim().to_string());
        } else if let Some(v) = t.strip_prefix("ID:") {
            id = Some(v.trim().parse::<u16>().map_err(|e| err(n, format!("bad ID '{}': {e}", v.trim())))?);
        } else if t.starts_with("field:") {
            fields.push(parse_field(t).map_err(|m| err(n, m))?);
        } else if let Some(v) = line.strip_prefix("print fmt:") {
            print_fmt = Some(v.trim().to_string());
        }
    }
    let name = name.ok_or_else(|| err(0, "no 'name:' line".into()))?;
    let id = id.ok_or_else(|| err(0, "no 'ID:' line".into()))?;
    if fields.is_empty() {
        return Err(err(0, "no fields".into()));
    }
    let print_fmt = print_fmt.unwrap_or_default();
    let symbols = parse_symbol_tables(&print_fmt);
    Ok(EventFormat { id, system: system.to_string(), name, fields, print_fmt, symbols })
}

/// Only the name and id of an event (for systems whose fields nobody will read): much cheaper
/// than [`parse_event_format`] when a trace carries thousands of formats. It reads the first
/// three lines of `text` (`name:`, `ID:`, `format:`), as bytes: the rest is never touched.
pub fn parse_event_identity(system: &str, text: &[u8]) -> Result<EventFormat, FormatError> {
    let err = |message: String| FormatError { what: format!("{system}/format"), line: 0, message };
    let (mut name, mut id) = (None, None);
    for line in text.split(|&b| b == b'\n').take(3) {
        if let Some(v) = line.strip_prefix(b"name:") {
            name = Some(owned_text(v.trim_ascii()));
        } else if let Some(v) = line.strip_prefix(b"ID:") {
            // Read where it lies (digits only: nothing of it is decoded as characters), and
            // copied only to say what is wrong with it.
            let v = v.trim_ascii();
            id = match std::str::from_utf8(v).ok().and_then(|digits| digits.parse::<u16>().ok()) {
                Some(id) => Some(id),
                None => {
                    let v = owned_text(v);
                    Some(v.parse::<u16>().map_err(|e| err(format!("bad ID '{v}': {e}")))?)
                }
            };
        }
    }
    Ok(EventFormat {
        id: id.ok_or_else(|| err("no 'ID:' line".into()))?,
        system: system.to_string(),
        name: name.ok_or_else(|| err("no 'name:' line".into()))?,
        fields: Vec::new(),
        print_fmt: String::new(),
        symbols: Vec::new(),
    })
}

/// `bytes` as text (bytes that are not UTF-8 replaced), copied before they are checked: bytes
/// of a mapped file can change under the reader, and a `str` must stay valid once checked.
pub fn owned_text(bytes: &[u8]) -> String {
    text_of(bytes.to_vec())
}

/// `bytes` as text, any byte that is not UTF-8 replaced (copied only then).
pub fn text_of(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// `field:unsigned int exit_reason; offset:8; size:4; signed:0;`
fn parse_field(line: &str) -> Result<Field, String> {
    let mut decl = None;
    let (mut offset, mut size, mut signed) = (None, None, false);
    for part in line.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        let (key, value) = part.split_once(':').ok_or_else(|| format!("'{part}' is not key:value"))?;
        match key.trim() {
            "field" => decl = Some(value.trim().to_string()),
            "offset" => offset = Some(value.trim().parse::<usize>().map_err(|e| format!("bad offset '{value}': {e}"))?),
            "size" => size = Some(value.trim().parse::<usize>().map_err(|e| format!("bad size '{value}': {e}"))?),
            "signed" => signed = value.trim() == "1",
            _ => {}
        }
    }
    let decl = decl.ok_or("no field declaration")?;
    let (offset, size) = (offset.ok_or("no offset")?, size.ok_or("no size")?);
    if size == 0 && !decl.contains('[') {
        return Err(format!("field '{decl}' has size 0"));
    }
    let (c_type, name, array) = split_declaration(&decl)?;
    let is_char = c_type.replace("[]", " ").split_whitespace().any(|w| w == "char");
    let kind = if c_type.starts_with("__data_loc") {
        FieldKind::DataLoc { is_char }
    } else if c_type.starts_with("__rel_loc") {
        FieldKind::RelLoc { is_char }
    } else if let Some(len) = array {
        let elem_size = size.checked_div(len).unwrap_or(1);
        FieldKind::Array { elem_size: elem_size.max(1), is_char }
    } else {
        FieldKind::Int
    };
    Ok(Field { name, c_type, offset, size, signed, kind })
}

/// `unsigned int exit_reason` → ("unsigned int", "exit_reason", None);
/// `char prev_comm[16]` → ("char", "prev_comm", Some(16)); `__data_loc char[] name` → (.., "name", None).
fn split_declaration(decl: &str) -> Result<(String, String, Option<usize>), String> {
    let (head, array) = match decl.find('[') {
        Some(open) if !decl.starts_with("__data_loc") && !decl.starts_with("__rel_loc") => {
            let close = decl[open..].find(']').ok_or_else(|| format!("unclosed '[' in '{decl}'"))? + open;
            let len = decl[open + 1..close].trim();
            (decl[..open].trim(), Some(len.parse::<usize>().unwrap_or(0)))
        }
        _ => (decl, None),
    };
    let head = head.trim();
    let (split, sep) = head
        .char_indices()
        .rev()
        .find(|&(_, c)| !(c.is_alphanumeric() || c == '_'))
        .ok_or_else(|| format!("no type in '{decl}'"))?;
    let end = split + sep.len_utf8();
    let (c_type, name) = (head[..end].trim(), &head[end..]);
    if name.is_empty() {
        return Err(format!("no field name in '{decl}'"));
    }
    Ok((c_type.to_string(), name.to_string(), array))
}

/// Every `__print_symbolic(REC->field [& mask], { v, "name" }, ...)` in a print fmt, with the
/// ternary condition that selects it.
pub fn parse_symbol_tables(print_fmt: &str) -> Vec<SymbolTable> {
    const CALL: &str = "__print_symbolic(";
    let mut tables: Vec<SymbolTable> = Vec::new();
    let mut pos = 0;
    while let Some(found) = print_fmt[pos..].find(CALL) {
        let start = pos + found;
        let body_start = start + CALL.len();
        let Some(body_len) = matching_paren(&print_fmt[body_start..]) else {
            break;
        };
        let body = &print_fmt[body_start..body_start + body_len];
        pos = body_start + body_len;
        let Some((target, rest)) = body.split_once(',') else {
            continue;
        };
        let Some((field, mask)) = parse_target(target) else {
            continue;
        };
        let condition = condition_before(&print_fmt[..start], tables.last());
        tables.push(SymbolTable { field, mask, condition, entries: parse_entries(rest) });
    }
    tables
}

/// Length up to (not including) the `)` closing an already opened paren, skipping strings.
pub(crate) fn matching_paren(s: &str) -> Option<usize> {
    let (mut depth, mut in_string) = (1i32, false);
    for (i, c) in s.char_indices() {
        match c {
            '"' => in_string = !in_string,
            '(' if !in_string => depth += 1,
            ')' if !in_string => {
                depth -= 1;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

/// `REC->exit_reason & 0xffff` → ("exit_reason", 0xffff).
pub(crate) fn parse_target(target: &str) -> Option<(String, u64)> {
    let target = target.trim().trim_start_matches('(').trim_end_matches(')');
    let (field, mask) = match target.split_once('&') {
        Some((f, m)) => (f.trim(), parse_int(m.trim()).map(|v| v as u64)?),
        None => (target.trim(), u64::MAX),
    };
    let field = field.strip_prefix("REC->")?;
    field.chars().all(|c| c.is_alphanumeric() || c == '_').then(|| (field.to_string(), mask))
}

/// The condition of a table: `(REC->f == N) ?` just before it, or `:` just before it (the
/// negation of the previous table's condition).
fn condition_before(prefix: &str, previous: Option<&SymbolTable>) -> Condition {
    let p = prefix.trim_end();
    if let Some(before_q) = p.strip_suffix('?') {
        let before_q = before_q.trim_end();
        if let Some(inner) = before_q.strip_suffix(')').and_then(|s| s.rfind('(').map(|i| &s[i + 1..])) {
            if let Some((lhs, rhs)) = inner.split_once("==") {
                if let (Some(f), Some(v)) = (lhs.trim().strip_prefix("REC->"), parse_int(rhs.trim())) {
                    return Condition::FieldEq(f.to_string(), v);
                }
            }
        }
    } else if p.ends_with(':') {
        if let Some(Condition::FieldEq(f, v)) = previous.map(|t| &t.condition) {
            return Condition::FieldNe(f.clone(), *v);
        }
    }
    Condition::Always
}

/// `{ 0, "EXCEPTION_NMI" }, { 0x040 + 1, "DB excp" }, ...`
pub(crate) fn parse_entries(s: &str) -> Vec<(i64, String)> {
    let mut entries = Vec::new();
    let mut rest = s;
    while let Some(open) = rest.find('{') {
        let Some(close) = rest[open..].find('}') else {
            break;
        };
        let item = &rest[open + 1..open + close];
        rest = &rest[open + close + 1..];
        let Some((value, name)) = item.split_once(',') else {
            continue;
        };
        // Adjacent C string literals concatenate: `"KVM_EXIT_" "IO"` is `KVM_EXIT_IO`.
        let name: String = name.split('"').skip(1).step_by(2).collect();
        // Macro-expanded constants come parenthesized: arm64's `{ (0x24), "DABT_LOW" }`.
        let value = value.replace(['(', ')'], "");
        let value: Option<i64> = value.split('+').map(|t| parse_int(t.trim())).sum();
        if let Some(value) = value {
            entries.push((value, name));
        }
    }
    entries
}

/// A C integer literal: decimal, hex, negative, with optional U/L suffixes.
pub(crate) fn parse_int(s: &str) -> Option<i64> {
    let s = s.trim().trim_end_matches(['U', 'L', 'u', 'l']);
    let (negative, digits) = match s.strip_prefix('-') {
        Some(d) => (true, d.trim()),
        None => (false, s),
    };
    let value = match digits.strip_prefix("0x").or_else(|| digits.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok()? as i64,
        None => digits.parse::<i64>().ok()?,
    };
    Some(if negative { -value } else { value })
}

/// The ring-buffer page layout from `events/header_page`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageHeader {
    /// Offset of the page's base timestamp (u64).
    pub timestamp_offset: usize,
    /// Offset of the commit word.
    pub commit_offset: usize,
    /// Size of the commit word (8 on 64-bit kernels).
    pub commit_size: usize,
    /// Offset of the event data.
    pub data_offset: usize,
    /// Whole page size (data offset + data size).
    pub page_size: usize,
    /// How the pages' timestamps become nanoseconds, where they are not (a trace in TSC
    /// cycles, a file with a time offset); None: they already are.
    pub scale: Option<TimeScale>,
}

/// Parse `events/header_page`.
pub fn parse_header_page(text: &str) -> Result<PageHeader, FormatError> {
    let err = |line: usize, message: String| FormatError { what: "header_page".into(), line, message };
    let mut found: [Option<Field>; 3] = [None, None, None];
    for (i, line) in text.lines().enumerate() {
        let t = line.trim();
        if !t.starts_with("field:") {
            continue;
        }
        let f = parse_field(t).map_err(|m| err(i + 1, m))?;
        let slot = match f.name.as_str() {
            "timestamp" => 0,
            "commit" => 1,
            "data" => 2,
            _ => continue,
        };
        found[slot] = Some(f);
    }
    let [Some(ts), Some(commit), Some(data)] = found else {
        return Err(err(0, "needs timestamp, commit and data fields".into()));
    };
    if ts.size != 8 || !(commit.size == 4 || commit.size == 8) {
        return Err(err(0, format!("unsupported sizes: timestamp {} commit {}", ts.size, commit.size)));
    }
    if ts.offset + 8 > data.offset || commit.offset + commit.size > data.offset || data.size == 0 || data.size > 1 << 20
    {
        let layout = format!(
            "timestamp at {}, commit at {}, data at {} size {}",
            ts.offset, commit.offset, data.offset, data.size
        );
        return Err(err(0, format!("inconsistent layout: {layout}")));
    }
    Ok(PageHeader {
        timestamp_offset: ts.offset,
        commit_offset: commit.offset,
        commit_size: commit.size,
        data_offset: data.offset,
        page_size: data.offset + data.size,
        scale: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const KVM_PIO: &str = "name: kvm_pio\nID: 1422\nformat:\n\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;\n\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;\n\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n\tfield:unsigned int rw;\toffset:8;\tsize:4;\tsigned:0;\n\tfield:unsigned int port;\toffset:12;\tsize:4;\tsigned:0;\n\tfield:char comm[16];\toffset:16;\tsize:16;\tsigned:1;\n\tfield:__data_loc char[] name;\toffset:32;\tsize:4;\tsigned:0;\n\nprint fmt: \"pio_%s at 0x%x\", REC->rw ? \"write\" : \"read\", REC->port\n";

    #[test]
    fn parses_fields_of_every_kind() {
        let f = parse_event_format("kvm", KVM_PIO).unwrap();
        assert_eq!((f.id, f.name.as_str(), f.fields.len()), (1422, "kvm_pio", 8));
        assert_eq!(f.field("port").unwrap().offset, 12);
        assert!(f.field("common_pid").unwrap().signed);
        assert_eq!(f.field("comm").unwrap().kind, FieldKind::Array { elem_size: 1, is_char: true });
        assert_eq!(f.field("name").unwrap().kind, FieldKind::DataLoc { is_char: true });
        assert_eq!(f.field("rw").unwrap().c_type, "unsigned int");
    }

    #[test]
    fn reports_bad_lines_with_their_number() {
        let bad = KVM_PIO.replace("offset:12;", "offset:twelve;");
        let e = parse_event_format("kvm", &bad).unwrap_err();
        assert_eq!(e.line, 10);
        assert!(e.to_string().contains("bad offset"), "{e}");
        assert!(parse_event_format("kvm", "name: x\n").unwrap_err().message.contains("ID"));
    }

    #[test]
    fn symbol_tables_carry_their_ternary_condition() {
        let fmt = r#""reason %s", (REC->isa == 1) ? __print_symbolic(REC->exit_reason & 0xffff, { 0, "EXCEPTION_NMI" }, { 10, "CPUID" }) : __print_symbolic(REC->exit_reason, { 0x040 + 14, "PF excp" }, { 0x072, "cpuid" }, { -1, "invalid_guest_state" })"#;
        let t = parse_symbol_tables(fmt);
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].condition, Condition::FieldEq("isa".into(), 1));
        assert_eq!(t[0].mask, 0xffff);
        assert_eq!(t[0].lookup(0x8000_000a), Some("CPUID"));
        assert_eq!(t[1].condition, Condition::FieldNe("isa".into(), 1));
        assert_eq!(t[1].lookup(0x4e), Some("PF excp"));
        assert_eq!(t[1].lookup(0x72), Some("cpuid"));
        assert_eq!(t[1].lookup(u64::MAX), Some("invalid_guest_state"));
        assert_eq!(t[1].lookup(0x999), None);
    }

    /// arm64's kvm_exit as Debian's 6.1 kernel writes it: the exception classes come
    /// parenthesized by macro expansion (`{ (0x24), "DABT_LOW" }`).
    #[test]
    fn reads_arm64_kvm_exit_tables() {
        let text = include_str!("../tests/fixtures/arm64-6.1-debian/kvm_exit.format");
        let f = parse_event_format("kvm", text).unwrap();
        let ec = f.tables_for("esr_ec").next().unwrap();
        assert_eq!(
            (ec.lookup(0x24), ec.lookup(0x16), ec.lookup(0x01), ec.lookup(0x3c)),
            (Some("DABT_LOW"), Some("HVC64"), Some("WFx"), Some("BRK64"))
        );
        let ret = f.tables_for("ret").next().unwrap();
        assert_eq!(
            (ret.lookup(0), ret.lookup(2), ret.lookup(0xbadca11)),
            (Some("IRQ"), Some("TRAP"), Some("HYP_GONE"))
        );
    }

    #[test]
    fn concatenates_adjacent_string_literals() {
        let fmt = r#""reason %s (%d)", REC->errno < 0 ? (REC->errno == -4 ? "restart" : "error") : __print_symbolic(REC->reason, { 0, "KVM_EXIT_" "UNKNOWN" }, { 2, "KVM_EXIT_" "IO" }), REC->errno"#;
        let t = parse_symbol_tables(fmt);
        assert_eq!(t.len(), 1);
        assert_eq!((t[0].field.as_str(), &t[0].condition), ("reason", &Condition::Always));
        assert_eq!(t[0].lookup(2), Some("KVM_EXIT_IO"));
    }

    #[test]
    fn parses_header_page() {
        let text = "\tfield: u64 timestamp;\toffset:0;\tsize:8;\tsigned:0;\n\tfield: local_t commit;\toffset:8;\tsize:8;\tsigned:1;\n\tfield: int overwrite;\toffset:8;\tsize:1;\tsigned:1;\n\tfield: char data;\toffset:16;\tsize:4080;\tsigned:1;\n";
        let h = parse_header_page(text).unwrap();
        assert_eq!(
            h,
            PageHeader {
                timestamp_offset: 0,
                commit_offset: 8,
                commit_size: 8,
                data_offset: 16,
                page_size: 4096,
                scale: None
            }
        );
    }
}
