//! Symbol tables for program-counter samples: `System.map` and `/proc/kallsyms` text, ELF
//! symbol tables (a `vmlinux`, through the `object` crate), and the testvm guest's map (which
//! is written in `System.map` form). A KASLR offset shifts every address.
//!
//! An address belongs to the nearest symbol at or below it, of any type; it resolves only when
//! that symbol is code (types `t T w W`), so addresses in data or past the end of the text stay
//! unresolved instead of being charged to the last function.

use object::{Object, ObjectSymbol, SymbolKind};

/// One named range.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Symbol {
    addr: u64,
    /// Exclusive end when the table knows the size; the next symbol bounds it otherwise.
    end: Option<u64>,
    name: String,
    code: bool,
}

/// Sorted symbols, with the offset at which they are loaded.
#[derive(Debug, Clone, Default)]
pub struct SymbolTable {
    symbols: Vec<Symbol>,
    /// Runtime address minus link-time address (the KASLR slide).
    offset: u64,
}

/// Why a symbol source could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SymbolError {
    /// A text line that is not `ADDRESS TYPE NAME`.
    #[error("line {line}: expected 'ADDRESS TYPE NAME' as in System.map, found '{text}'")]
    Line {
        /// 1-based line number.
        line: usize,
        /// The line, shortened.
        text: String,
    },
    /// Every address is zero: kallsyms read without the right to see addresses.
    #[error("every address is 0 (kallsyms read without CAP_SYSLOG?); read /proc/kallsyms as root or use System.map")]
    Hidden,
    /// No code symbols at all.
    #[error("no code symbols found")]
    Empty,
    /// The ELF parser refused the file.
    #[error("not a readable ELF file: {0}")]
    Elf(String),
}

impl SymbolTable {
    /// Parse `System.map` or `/proc/kallsyms` text (`ffffffff81000000 T _text [module]`).
    pub fn from_system_map(text: &str) -> Result<Self, SymbolError> {
        let mut symbols = Vec::new();
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let bad = || SymbolError::Line { line: i + 1, text: line.chars().take(80).collect() };
            let mut fields = line.split_whitespace();
            let (Some(addr), Some(kind), Some(name)) = (fields.next(), fields.next(), fields.next()) else {
                return Err(bad());
            };
            let addr = u64::from_str_radix(addr, 16).map_err(|_| bad())?;
            let kind = kind.chars().next().ok_or_else(bad)?;
            let name = match fields.next() {
                Some(module) => format!("{name} {module}"),
                None => name.to_string(),
            };
            symbols.push(Symbol { addr, end: None, name, code: matches!(kind, 't' | 'T' | 'w' | 'W') });
        }
        if !symbols.is_empty() && symbols.iter().all(|s| s.addr == 0) {
            return Err(SymbolError::Hidden);
        }
        Self::build(symbols)
    }

    /// Read an ELF file's symbol table (`vmlinux` with symbols, or any executable).
    pub fn from_elf(bytes: &[u8]) -> Result<Self, SymbolError> {
        let file = object::File::parse(bytes).map_err(|e| SymbolError::Elf(e.to_string()))?;
        let symbols = file
            .symbols()
            .filter(|s| s.address() != 0 && !s.name().unwrap_or("").is_empty())
            .filter(|s| matches!(s.kind(), SymbolKind::Text | SymbolKind::Data | SymbolKind::Unknown))
            .map(|s| Symbol {
                addr: s.address(),
                end: (s.size() > 0).then(|| s.address() + s.size()),
                name: s.name().unwrap_or("").to_string(),
                code: s.kind() == SymbolKind::Text,
            })
            .collect();
        Self::build(symbols)
    }

    fn build(mut symbols: Vec<Symbol>) -> Result<Self, SymbolError> {
        if !symbols.iter().any(|s| s.code) {
            return Err(SymbolError::Empty);
        }
        // At one address, prefer code, then the name with fewer leading underscores (a function
        // over a section marker like `_text`), then the first one the source listed.
        let underscores = |s: &Symbol| s.name.bytes().take_while(|&b| b == b'_').count();
        symbols.sort_by(|a, b| a.addr.cmp(&b.addr).then(b.code.cmp(&a.code)).then(underscores(a).cmp(&underscores(b))));
        symbols.dedup_by_key(|s| s.addr);
        Ok(SymbolTable { symbols, offset: 0 })
    }

    /// The same table loaded `offset` bytes above its link addresses.
    pub fn with_offset(mut self, offset: u64) -> Self {
        self.offset = offset;
        self
    }

    /// The KASLR slide.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Link-time address of a symbol.
    pub fn address_of(&self, name: &str) -> Option<u64> {
        self.symbols.iter().find(|s| s.name == name).map(|s| s.addr)
    }

    /// Number of code symbols.
    pub fn code_symbols(&self) -> usize {
        self.symbols.iter().filter(|s| s.code).count()
    }

    /// The code symbol holding runtime address `addr`, and the offset into it.
    pub fn resolve(&self, addr: u64) -> Option<(&str, u64)> {
        let link = addr.wrapping_sub(self.offset);
        let at = self.symbols.partition_point(|s| s.addr <= link).checked_sub(1)?;
        let s = &self.symbols[at];
        let end = s.end.or_else(|| self.symbols.get(at + 1).map(|n| n.addr))?;
        (s.code && link < end).then(|| (s.name.as_str(), link - s.addr))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAP: &str = "\
ffffffff81000000 T _text
ffffffff81000000 T startup_64
ffffffff81000100 t secondary_startup_64
ffffffff81000200 T do_one_initcall
ffffffff81000300 D _etext
ffffffff82000000 d some_data
ffffffff83000000 T _sinittext
ffffffff83000000 T start_kernel
ffffffff83000400 t __init_end_marker
ffffffff83000800 B __bss_start
";

    #[test]
    fn resolves_to_the_code_symbol_below_and_not_into_data() {
        let t = SymbolTable::from_system_map(MAP).unwrap();
        assert_eq!(t.resolve(0xffff_ffff_8100_0000), Some(("startup_64", 0)));
        assert_eq!(t.resolve(0xffff_ffff_8100_0250), Some(("do_one_initcall", 0x50)));
        assert_eq!(t.resolve(0xffff_ffff_8100_0300), None, "_etext is data");
        assert_eq!(t.resolve(0xffff_ffff_8300_0010), Some(("start_kernel", 0x10)));
        assert_eq!(t.resolve(0xffff_ffff_8300_0900), None, "past the last code symbol");
        assert_eq!(t.resolve(0x1000), None);
        assert_eq!(t.code_symbols(), 5, "aliases at one address count once");
    }

    #[test]
    fn a_kaslr_offset_shifts_every_address() {
        let t = SymbolTable::from_system_map(MAP).unwrap().with_offset(0x2a00_0000);
        assert_eq!(t.resolve(0xffff_ffff_ab00_0210), Some(("do_one_initcall", 0x10)));
        assert_eq!(t.resolve(0xffff_ffff_8100_0210), None);
    }

    #[test]
    fn kallsyms_modules_and_hidden_addresses() {
        let t =
            SymbolTable::from_system_map("ffffffffc0001000 t vmx_vcpu_run\t[kvm_intel]\nffffffffc0002000 t x [m]\n")
                .unwrap();
        assert_eq!(t.resolve(0xffff_ffff_c000_1004).unwrap().0, "vmx_vcpu_run [kvm_intel]");
        let hidden = SymbolTable::from_system_map("0000000000000000 T a\n0000000000000000 T b\n");
        assert!(matches!(hidden, Err(SymbolError::Hidden)));
        let bad = SymbolTable::from_system_map("ffffffff81000000 T a\nnot a map\n").unwrap_err();
        assert!(bad.to_string().starts_with("line 2:"), "{bad}");
    }

    #[test]
    fn reads_the_symbols_of_this_test_binary() {
        let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let t = SymbolTable::from_elf(&exe).unwrap();
        let addr = t.address_of("main").expect("the test harness has main");
        assert_eq!(t.resolve(addr), Some(("main", 0)));
        assert!(SymbolTable::from_elf(b"not elf").is_err());
    }
}
