//! From raw records to typed [`Event`]s. Field offsets are looked up once per event id when the
//! [`Decoder`] is built; decoding a record is then a table index and a few little-endian reads.
//! Events virtprof does not model become [`EventKind::Other`], with the generic
//! [`field_value`] reader for anyone who wants their fields.

use std::sync::Arc;

use rustc_hash::FxHashMap as HashMap;

use virtprof_model::{Event, EventKind, StrId, ARM64_NOT_A_TRAP, ISA_ARM64};

use crate::format::{Condition, EventFormat, Field, FieldKind, PageHeader};
use crate::page::RawRecord;

/// Everything needed to decode one kernel's trace: the page header and every event format.
#[derive(Debug, Clone)]
pub struct Layout {
    /// Ring-buffer page layout.
    pub header: PageHeader,
    formats: Vec<EventFormat>,
    by_id: HashMap<u16, usize>,
}

impl Layout {
    /// Build from a parsed header page and event formats.
    pub fn new(header: PageHeader, formats: Vec<EventFormat>) -> Self {
        let by_id = formats.iter().enumerate().map(|(i, f)| (f.id, i)).collect();
        Layout { header, formats, by_id }
    }

    /// The format of an event id.
    pub fn format(&self, id: u16) -> Option<&EventFormat> {
        self.by_id.get(&id).map(|&i| &self.formats[i])
    }

    /// The format of `system:name`.
    pub fn format_by_name(&self, system: &str, name: &str) -> Option<&EventFormat> {
        self.formats.iter().find(|f| f.name == name && (system.is_empty() || f.system == system))
    }

    /// All formats.
    pub fn formats(&self) -> &[EventFormat] {
        &self.formats
    }
}

/// Offset and size of an integer field (size 0: the kernel lacks it; reads give 0). Small, so
/// an event id's table of them stays in few cache lines.
#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    offset: u32,
    size: u32,
}

impl Slot {
    /// A field at `offset` of `size` bytes; one no record can hold (a damaged format) reads
    /// as absent.
    fn new(offset: usize, size: usize) -> Slot {
        match (u32::try_from(offset), u32::try_from(size)) {
            (Ok(offset), Ok(size)) => Slot { offset, size },
            _ => Slot::default(),
        }
    }

    fn of(format: &EventFormat, name: &str) -> Slot {
        format.field(name).map_or(Slot::default(), |f| Slot::new(f.offset, f.size))
    }

    fn range(self) -> std::ops::Range<usize> {
        let start = self.offset as usize;
        start..start + self.size as usize
    }

    #[inline]
    fn read(self, data: &[u8]) -> u64 {
        match data.get(self.range()) {
            Some(b) if self.size == 8 => u64::from_le_bytes(b.try_into().expect("8")),
            Some(b) if self.size == 4 => u64::from(u32::from_le_bytes(b.try_into().expect("4"))),
            Some(b) if self.size == 2 => u64::from(u16::from_le_bytes(b.try_into().expect("2"))),
            Some(b) if self.size == 1 => u64::from(b[0]),
            _ => 0,
        }
    }

    fn bytes(self, data: &[u8]) -> &[u8] {
        data.get(self.range()).unwrap_or(&[])
    }
}

/// Per event id: how to build its [`EventKind`].
#[derive(Debug, Clone, Copy)]
enum Typed {
    KvmExit {
        reason: Slot,
        isa: Slot,
        rip: Slot,
        vcpu: Slot,
    },
    /// arm64's kvm_exit; `trap` is the exit code that means a trap (ARM_EXCEPTION_TRAP).
    KvmExitArm64 {
        ret: Slot,
        ec: Slot,
        pc: Slot,
        trap: u32,
    },
    KvmEntry {
        vcpu: Slot,
        rip: Slot,
    },
    KvmUserspaceExit {
        reason: Slot,
        errno: Slot,
    },
    KvmPio {
        rw: Slot,
        port: Slot,
        size: Slot,
        count: Slot,
    },
    KvmMmio {
        kind: Slot,
        len: Slot,
        gpa: Slot,
    },
    KvmEmulateInsn {
        rip: Slot,
        failed: Slot,
    },
    KvmFpu {
        load: Slot,
    },
    KvmVcpuWakeup {
        ns: Slot,
        waited: Slot,
    },
    SchedSwitch {
        prev_pid: Slot,
        prev_state: Slot,
        prev_comm: Slot,
        next_pid: Slot,
        next_comm: Slot,
    },
    SchedWakeup {
        pid: Slot,
        target_cpu: Slot,
    },
    SchedFork {
        parent: Slot,
        child: Slot,
    },
    SchedMigrate {
        pid: Slot,
        orig: Slot,
        dest: Slot,
    },
    IrqEntry {
        irq: Slot,
    },
    IrqExit {
        irq: Slot,
    },
    Softirq {
        vec: Slot,
        phase: SoftirqPhase,
    },
    Vector {
        vector: Slot,
        entry: bool,
        id: u16,
    },
    Nmi {
        delta: Slot,
    },
    Other {
        id: u16,
    },
}

#[derive(Debug, Clone, Copy)]
enum SoftirqPhase {
    Entry,
    Exit,
    Raise,
}

impl Typed {
    fn for_format(f: &EventFormat) -> Typed {
        let s = |name| Slot::of(f, name);
        match (f.system.as_str(), f.name.as_str()) {
            ("kvm", "kvm_exit") if f.field("esr_ec").is_some() => {
                Typed::KvmExitArm64 { ret: s("ret"), ec: s("esr_ec"), pc: s("vcpu_pc"), trap: arm64_trap_code(f) }
            }
            ("kvm", "kvm_exit") => {
                Typed::KvmExit { reason: s("exit_reason"), isa: s("isa"), rip: s("guest_rip"), vcpu: s("vcpu_id") }
            }
            // x86 records `rip` (and the vCPU), arm64 `vcpu_pc` only.
            ("kvm", "kvm_entry") if f.field("rip").is_none() => {
                Typed::KvmEntry { vcpu: s("vcpu_id"), rip: s("vcpu_pc") }
            }
            ("kvm", "kvm_entry") => Typed::KvmEntry { vcpu: s("vcpu_id"), rip: s("rip") },
            ("kvm", "kvm_userspace_exit") => Typed::KvmUserspaceExit { reason: s("reason"), errno: s("errno") },
            ("kvm", "kvm_pio") => Typed::KvmPio { rw: s("rw"), port: s("port"), size: s("size"), count: s("count") },
            ("kvm", "kvm_mmio") => Typed::KvmMmio { kind: s("type"), len: s("len"), gpa: s("gpa") },
            ("kvm", "kvm_emulate_insn") => Typed::KvmEmulateInsn { rip: s("rip"), failed: s("failed") },
            ("kvm", "kvm_fpu") => Typed::KvmFpu { load: s("load") },
            ("kvm", "kvm_vcpu_wakeup") => Typed::KvmVcpuWakeup { ns: s("ns"), waited: s("waited") },
            ("sched", "sched_switch") => Typed::SchedSwitch {
                prev_pid: s("prev_pid"),
                prev_state: s("prev_state"),
                prev_comm: s("prev_comm"),
                next_pid: s("next_pid"),
                next_comm: s("next_comm"),
            },
            ("sched", "sched_wakeup" | "sched_wakeup_new") => {
                Typed::SchedWakeup { pid: s("pid"), target_cpu: s("target_cpu") }
            }
            ("sched", "sched_process_fork") => Typed::SchedFork { parent: s("parent_pid"), child: s("child_pid") },
            ("sched", "sched_migrate_task") => {
                Typed::SchedMigrate { pid: s("pid"), orig: s("orig_cpu"), dest: s("dest_cpu") }
            }
            ("irq", "irq_handler_entry") => Typed::IrqEntry { irq: s("irq") },
            ("irq", "irq_handler_exit") => Typed::IrqExit { irq: s("irq") },
            ("irq", "softirq_entry") => Typed::Softirq { vec: s("vec"), phase: SoftirqPhase::Entry },
            ("irq", "softirq_exit") => Typed::Softirq { vec: s("vec"), phase: SoftirqPhase::Exit },
            ("irq", "softirq_raise") => Typed::Softirq { vec: s("vec"), phase: SoftirqPhase::Raise },
            ("irq_vectors", name) if name.ends_with("_entry") => {
                Typed::Vector { vector: s("vector"), entry: true, id: f.id }
            }
            ("irq_vectors", name) if name.ends_with("_exit") => {
                Typed::Vector { vector: s("vector"), entry: false, id: f.id }
            }
            ("nmi", "nmi_handler") => Typed::Nmi { delta: s("delta_ns") },
            _ => Typed::Other { id: f.id },
        }
    }
}

/// The `ret` of arm64's kvm_exit that means a trap: the value its print fmt names TRAP (2,
/// ARM_EXCEPTION_TRAP, in every kernel so far).
pub fn arm64_trap_code(f: &EventFormat) -> u32 {
    f.tables_for("ret")
        .flat_map(|t| &t.entries)
        .find(|(_, name)| name == "TRAP")
        .and_then(|&(value, _)| u32::try_from(value).ok())
        .unwrap_or(2)
}

/// A record the decoder could not use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Shorter than the common header.
    #[error("record of {0} bytes is too short for the common fields")]
    Short(usize),
}

/// Interned task names.
#[derive(Debug, Default)]
pub struct StringTable {
    ids: HashMap<Vec<u8>, StrId>,
    names: Vec<String>,
}

impl StringTable {
    /// The id of `bytes` (a NUL-padded C string), interning it on first sight.
    pub fn intern(&mut self, bytes: &[u8]) -> StrId {
        let bytes = &bytes[..bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len())];
        if let Some(&id) = self.ids.get(bytes) {
            return id;
        }
        let id = StrId(u32::try_from(self.names.len()).expect("fewer than 4 billion task names"));
        self.names.push(String::from_utf8_lossy(bytes).into_owned());
        self.ids.insert(bytes.to_vec(), id);
        id
    }

    /// The string of an id.
    pub fn resolve(&self, id: StrId) -> &str {
        self.names.get(id.0 as usize).map_or("?", String::as_str)
    }

    /// The names interned from the `first`-th on (ids `first..`), in id order.
    pub fn names_from(&self, first: usize) -> &[String] {
        self.names.get(first..).unwrap_or_default()
    }
}

/// Decodes records of one layout into typed events.
#[derive(Debug)]
pub struct Decoder {
    /// Shared with the decoders forked from this one (every event format: large to copy).
    layout: Arc<Layout>,
    typed: Vec<Typed>,
    common_pid: Slot,
    /// Task names seen in the events.
    pub strings: StringTable,
}

impl Decoder {
    /// Precompute the field offsets of every event in `layout`.
    pub fn new(layout: Layout) -> Self {
        let max_id = layout.formats().iter().map(|f| f.id).max().unwrap_or(0);
        let mut typed: Vec<Typed> = (0..=max_id).map(|id| Typed::Other { id }).collect();
        for f in layout.formats() {
            typed[f.id as usize] = Typed::for_format(f);
        }
        // Every event shares the common fields; take them from any format that lists fields
        // (name-only formats have none), else the layout every kernel uses.
        let common_pid = layout
            .formats()
            .iter()
            .find_map(|f| f.field("common_pid").map(|c| Slot::new(c.offset, c.size)))
            .unwrap_or(Slot { offset: 4, size: 4 });
        Decoder { layout: Arc::new(layout), typed, common_pid, strings: StringTable::default() }
    }

    /// A decoder of the same layout that has interned no names yet: one per thread when CPUs
    /// are decoded in parallel, its names merged back into this one's afterwards.
    pub fn fork(&self) -> Decoder {
        Decoder {
            layout: Arc::clone(&self.layout),
            typed: self.typed.clone(),
            common_pid: self.common_pid,
            strings: StringTable::default(),
        }
    }

    /// The layout decoded.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Decode one record seen on `cpu`.
    // Each field is read at its declared width and stored in the model's type for it, so the
    // narrowing casts below keep every value the kernel can write.
    #[allow(clippy::cast_possible_truncation)]
    #[inline(always)]
    pub fn decode(&mut self, cpu: u32, rec: &RawRecord<'_>) -> Result<Event, DecodeError> {
        let d = rec.data;
        if d.len() < 8 {
            return Err(DecodeError::Short(d.len()));
        }
        let id = u16::from_le_bytes([d[0], d[1]]);
        let tid = self.common_pid.read(d) as u32;
        let kind = match *self.typed.get(id as usize).unwrap_or(&Typed::Other { id }) {
            Typed::KvmExit { reason, isa, rip, vcpu } => EventKind::KvmExit {
                reason: reason.read(d) as u32,
                isa: isa.read(d) as u32,
                guest_rip: rip.read(d),
                vcpu_id: vcpu.read(d) as u32,
            },
            Typed::KvmExitArm64 { ret, ec, pc, trap } => {
                // Bit 31 of `ret` flags an SError pending beside the code (ARM_EXIT_WITH_SERROR_BIT).
                let code = ret.read(d) as u32 & !ARM64_NOT_A_TRAP;
                let reason = if code == trap { ec.read(d) as u32 } else { ARM64_NOT_A_TRAP | code };
                EventKind::KvmExit { reason, isa: ISA_ARM64, guest_rip: pc.read(d), vcpu_id: 0 }
            }
            Typed::KvmEntry { vcpu, rip } => EventKind::KvmEntry { vcpu_id: vcpu.read(d) as u32, rip: rip.read(d) },
            Typed::KvmUserspaceExit { reason, errno } => {
                EventKind::KvmUserspaceExit { reason: reason.read(d) as u32, errno: errno.read(d) as u32 as i32 }
            }
            Typed::KvmPio { rw, port, size, count } => EventKind::KvmPio {
                write: rw.read(d) != 0,
                port: port.read(d) as u16,
                size: size.read(d) as u8,
                count: count.read(d) as u32,
            },
            Typed::KvmMmio { kind, len, gpa } => {
                EventKind::KvmMmio { kind: kind.read(d) as u8, len: len.read(d) as u8, gpa: gpa.read(d) }
            }
            Typed::KvmEmulateInsn { rip, failed } => {
                EventKind::KvmEmulateInsn { rip: rip.read(d), failed: failed.read(d) != 0 }
            }
            Typed::KvmFpu { load } => EventKind::KvmFpu { load: load.read(d) != 0 },
            Typed::KvmVcpuWakeup { ns, waited } => {
                EventKind::KvmVcpuWakeup { ns: ns.read(d), waited: waited.read(d) != 0 }
            }
            Typed::SchedSwitch { prev_pid, prev_state, prev_comm, next_pid, next_comm } => EventKind::SchedSwitch {
                prev_tid: prev_pid.read(d) as u32,
                prev_state: prev_state.read(d) as u32,
                prev_comm: self.strings.intern(prev_comm.bytes(d)),
                next_tid: next_pid.read(d) as u32,
                next_comm: self.strings.intern(next_comm.bytes(d)),
            },
            Typed::SchedWakeup { pid, target_cpu } => {
                EventKind::SchedWakeup { tid: pid.read(d) as u32, target_cpu: target_cpu.read(d) as u32 }
            }
            Typed::SchedFork { parent, child } => {
                EventKind::SchedFork { parent_tid: parent.read(d) as u32, child_tid: child.read(d) as u32 }
            }
            Typed::SchedMigrate { pid, orig, dest } => EventKind::SchedMigrate {
                tid: pid.read(d) as u32,
                orig_cpu: orig.read(d) as u32,
                dest_cpu: dest.read(d) as u32,
            },
            Typed::IrqEntry { irq } => EventKind::IrqEntry { irq: irq.read(d) as u32 },
            Typed::IrqExit { irq } => EventKind::IrqExit { irq: irq.read(d) as u32 },
            Typed::Softirq { vec, phase } => {
                let vec = vec.read(d) as u32;
                match phase {
                    SoftirqPhase::Entry => EventKind::SoftirqEntry { vec },
                    SoftirqPhase::Exit => EventKind::SoftirqExit { vec },
                    SoftirqPhase::Raise => EventKind::SoftirqRaise { vec },
                }
            }
            Typed::Vector { vector, entry: true, id } => {
                EventKind::IrqVectorEntry { vector: vector.read(d) as u32, event: id }
            }
            Typed::Vector { vector, entry: false, id } => {
                EventKind::IrqVectorExit { vector: vector.read(d) as u32, event: id }
            }
            Typed::Nmi { delta } => EventKind::Nmi { handler_ns: delta.read(d) },
            Typed::Other { id } => EventKind::Other { event: id },
        };
        Ok(Event { ts: rec.ts, cpu, tid, kind })
    }

    /// The name `value` of `field` has in `system:event`'s unconditional symbol tables
    /// (e.g. `kvm_userspace_exit` reason 2 → `KVM_EXIT_IO`).
    pub fn symbol<'a>(&'a self, system: &str, event: &str, field: &'a str, value: u64) -> Option<&'a str> {
        let format = self.layout.format_by_name(system, event)?;
        format.tables_for(field).filter(|t| t.condition == Condition::Always).find_map(|t| t.lookup(value))
    }

    /// An exit's name as users read it: x86's from the `exit_reason` tables
    /// ([`Decoder::exit_reason_name`]); arm64's from the exception class's table, with the class
    /// in hex as the architecture numbers them (`DABT_LOW (EC 0x24)`), or else the exit code's
    /// (`IRQ`). None where the file has no kvm_exit format.
    pub fn exit_name(&self, reason: u32, isa: u32) -> Option<String> {
        if isa != ISA_ARM64 {
            return self.exit_reason_name(reason, isa).map(str::to_string);
        }
        let format = self.layout.format_by_name("kvm", "kvm_exit")?;
        let named = |field: &'static str, value: u32| {
            format.tables_for(field).find_map(|t| t.lookup(u64::from(value))).map(str::to_string)
        };
        Some(if reason & ARM64_NOT_A_TRAP != 0 {
            let code = reason & !ARM64_NOT_A_TRAP;
            named("ret", code).unwrap_or_else(|| format!("exit code {code:#x}"))
        } else {
            named("esr_ec", reason).map_or_else(|| format!("EC {reason:#04x}"), |n| format!("{n} (EC {reason:#04x})"))
        })
    }

    /// The kernel's name for an x86 `kvm_exit` reason, from the recorded print fmt's tables.
    pub fn exit_reason_name(&self, reason: u32, isa: u32) -> Option<&str> {
        let format = self.layout.format_by_name("kvm", "kvm_exit")?;
        format.tables_for("exit_reason").find_map(|t| {
            let applies = match &t.condition {
                Condition::Always => true,
                Condition::FieldEq(f, v) => f == "isa" && i64::from(isa) == *v,
                Condition::FieldNe(f, v) => f == "isa" && i64::from(isa) != *v,
            };
            if applies {
                t.lookup(u64::from(reason))
            } else {
                None
            }
        })
    }
}

/// A field's value, generically.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FieldValue<'a> {
    /// Signed integer.
    Signed(i64),
    /// Unsigned integer.
    Unsigned(u64),
    /// A C string (char array or `__data_loc char[]`), up to its NUL.
    Str(&'a [u8]),
    /// Any other array.
    Bytes(&'a [u8]),
}

/// Read `field` out of a record's bytes.
pub fn field_value<'a>(field: &Field, data: &'a [u8]) -> FieldValue<'a> {
    let slot = Slot::new(field.offset, field.size);
    let c_string = |b: &'a [u8]| &b[..b.iter().position(|&c| c == 0).unwrap_or(b.len())];
    match field.kind {
        FieldKind::Int => {
            let raw = slot.read(data);
            if field.signed {
                let bits = 8 * field.size.clamp(1, 8);
                let shift = 64 - u32::try_from(bits).expect("at most 64");
                FieldValue::Signed(((raw << shift) as i64) >> shift)
            } else {
                FieldValue::Unsigned(raw)
            }
        }
        FieldKind::Array { is_char: true, .. } => FieldValue::Str(c_string(slot.bytes(data))),
        FieldKind::Array { is_char: false, .. } => FieldValue::Bytes(slot.bytes(data)),
        FieldKind::DataLoc { is_char } | FieldKind::RelLoc { is_char } => {
            let loc = Slot::new(field.offset, 4).read(data);
            let mut start = (loc & 0xffff) as usize;
            if matches!(field.kind, FieldKind::RelLoc { .. }) {
                start += field.offset + 4;
            }
            let bytes = data.get(start..start + (loc >> 16) as usize).unwrap_or(&[]);
            if is_char {
                FieldValue::Str(c_string(bytes))
            } else {
                FieldValue::Bytes(bytes)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{parse_event_format, parse_event_identity, PageHeader};

    const SWITCHLESS: &str = "name: kvm_fpu\nID: 7\nformat:\n\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;\n\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;\n\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n\tfield:u32 load;\toffset:8;\tsize:4;\tsigned:0;\n\nprint fmt: \"%s\", REC->load ? \"load\" : \"unload\"\n";

    #[test]
    fn common_pid_comes_from_a_format_with_fields_even_if_name_only_ones_come_first() {
        let header = PageHeader {
            timestamp_offset: 0,
            commit_offset: 8,
            commit_size: 8,
            data_offset: 16,
            page_size: 4096,
            scale: None,
        };
        let name_only = parse_event_identity("alarmtimer", b"name: alarmtimer_fired\nID: 1\nformat:\n").unwrap();
        let fpu = parse_event_format("kvm", SWITCHLESS).unwrap();
        let mut d = Decoder::new(Layout::new(header, vec![name_only, fpu]));
        let mut data = [0u8; 12];
        data[0..2].copy_from_slice(&7u16.to_le_bytes());
        data[4..8].copy_from_slice(&4242u32.to_le_bytes());
        data[8..12].copy_from_slice(&1u32.to_le_bytes());
        let e = d.decode(3, &RawRecord { ts: 9, data: &data }).unwrap();
        assert_eq!((e.tid, e.cpu, e.kind), (4242, 3, EventKind::KvmFpu { load: true }));
    }
}
