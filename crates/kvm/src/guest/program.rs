//! A guest program: machine code plus the symbol map its labels become; x86-64 programs are
//! assembled here with iced-x86 (arm64's in [`super::arm64`]).
//!
//! Workload generators call [`ProgramBuilder::function`] for every named routine; the symbols
//! are what `virtprof boot` later resolves sampled RIPs against, and what guest-fault messages
//! print (`pio_user_loop+0x7`).

use iced_x86::code_asm::{CodeAssembler, CodeLabel};
use iced_x86::BlockEncoderOptions;

use crate::error::VmmError;

/// A named address range in guest code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Symbol {
    /// The label's name.
    pub name: String,
    /// Guest-virtual (= guest-physical, identity mapped) start address.
    pub addr: u64,
    /// Bytes until the next symbol or the end of the code.
    pub size: u64,
}

/// Assembled guest code, ready to copy into guest memory at `base`.
#[derive(Debug, Clone)]
pub struct GuestProgram {
    /// Load address.
    pub base: u64,
    /// Where the vCPU starts (x86-64: the base; arm64: after the exception vector table).
    pub entry: u64,
    /// Machine code.
    pub code: Vec<u8>,
    /// Symbols sorted by address.
    pub symbols: Vec<Symbol>,
}

impl GuestProgram {
    /// A program of `code` loaded at `base`, started at `entry`, with its labels (`size` 0):
    /// each symbol's size becomes the distance to the next one or to the end of the code.
    /// Refused if it does not fit below the per-vCPU areas.
    pub fn new(base: u64, entry: u64, code: Vec<u8>, mut symbols: Vec<Symbol>) -> Result<Self, VmmError> {
        if code.len() as u64 > super::layout::CODE_MAX {
            return Err(VmmError::Assemble(format!(
                "program of {} bytes exceeds {}",
                code.len(),
                super::layout::CODE_MAX
            )));
        }
        symbols.sort_by_key(|s| s.addr);
        let end = base + code.len() as u64;
        for i in 0..symbols.len() {
            let next = symbols.get(i + 1).map_or(end, |s| s.addr);
            symbols[i].size = next - symbols[i].addr;
        }
        Ok(GuestProgram { base, entry, code, symbols })
    }

    /// The address of a symbol, if defined.
    pub fn symbol_addr(&self, name: &str) -> Option<u64> {
        self.symbols.iter().find(|s| s.name == name).map(|s| s.addr)
    }

    /// `name+0xoff` for an address inside the code, or the bare hex address.
    pub fn describe(&self, addr: u64) -> String {
        match self.symbols.iter().rev().find(|s| s.addr <= addr && addr < s.addr + s.size.max(1)) {
            Some(s) => format!("{:#x} ({}+{:#x})", addr, s.name, addr - s.addr),
            None => format!("{addr:#x}"),
        }
    }

    /// The symbol map in `System.map` form (`addr t name`), for external symbolizers.
    pub fn system_map(&self) -> String {
        self.symbols.iter().map(|s| format!("{:016x} t {}\n", s.addr, s.name)).collect()
    }
}

/// Builds a [`GuestProgram`]: an iced-x86 assembler plus named labels.
pub struct ProgramBuilder {
    /// The assembler; workload generators emit instructions into it directly.
    pub asm: CodeAssembler,
    named: Vec<(String, CodeLabel)>,
}

impl ProgramBuilder {
    /// A 64-bit assembler.
    pub fn new() -> Result<Self, VmmError> {
        Ok(ProgramBuilder { asm: CodeAssembler::new(64).map_err(asm_err)?, named: Vec::new() })
    }

    /// Start a named function here: its label becomes a symbol, and is returned so code can
    /// jump to it. iced allows one label per instruction, so emit code before the next one.
    pub fn function(&mut self, name: impl Into<String>) -> Result<CodeLabel, VmmError> {
        let mut label = self.asm.create_label();
        self.asm.set_label(&mut label).map_err(asm_err)?;
        self.named.push((name.into(), label));
        Ok(label)
    }

    /// Assemble at `base` and resolve every named label to an address.
    pub fn finish(mut self, base: u64) -> Result<GuestProgram, VmmError> {
        let result =
            self.asm.assemble_options(base, BlockEncoderOptions::RETURN_NEW_INSTRUCTION_OFFSETS).map_err(asm_err)?;
        let code = result.inner.code_buffer.clone();
        let mut symbols = Vec::with_capacity(self.named.len());
        for (name, label) in &self.named {
            let addr = result.label_ip(label).map_err(asm_err)?;
            symbols.push(Symbol { name: name.clone(), addr, size: 0 });
        }
        GuestProgram::new(base, base, code, symbols)
    }
}

pub(crate) fn asm_err(e: iced_x86::IcedError) -> VmmError {
    VmmError::Assemble(e.to_string())
}
