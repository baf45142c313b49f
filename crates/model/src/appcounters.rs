//! The application counter layout (`docs/agent.md`): a 64-byte header and 64-byte slots of
//! named 64-bit values that a program updates with atomic adds. The same bytes are a file
//! `virtprof agent` reads in a guest (`agent::appcounters`) and the page testvm's guest
//! program publishes its own counters in (`kvm::guest::layout::shared::COUNTERS`).
//!
//! ```text
//! offset 0   magic "VPCOUNT1"   written last: the counters are ready once it is there
//! offset 8   version: u32       1
//! offset 12  slots: u32         at most MAX_SLOTS
//! offset 16  app: [u8; 48]      NUL-padded UTF-8
//! offset 64  slot[slots]        name [u8; 48], kind u32 (0 counter, 1 gauge), reserved u32,
//!                               value u64
//! ```

use crate::guest::SeriesKind;

/// Magic.
pub const MAGIC: &[u8; 8] = b"VPCOUNT1";
/// Layout version.
pub const VERSION: u32 = 1;
/// Header and slot size.
pub const SLOT: usize = 64;
/// The most slots a layout may declare.
pub const MAX_SLOTS: usize = 4096;
/// Bytes of a name.
pub const NAME_BYTES: usize = 48;

/// Byte offset of slot `i`'s value (8-byte aligned).
pub const fn value_offset(i: usize) -> usize {
    SLOT * (i + 1) + 56
}

/// Bytes of a layout with `slots` slots.
pub const fn size(slots: usize) -> usize {
    SLOT * (slots + 1)
}

/// One published counter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    /// Its name.
    pub name: String,
    /// Counter or gauge.
    pub kind: SeriesKind,
}

/// A layout's header and names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// The application's name.
    pub app: String,
    /// Its slots, in order.
    pub slots: Vec<Slot>,
}

/// Header and names (all values 0), magic included.
pub fn image(app: &str, slots: &[Slot]) -> Vec<u8> {
    let mut b = vec![0u8; size(slots.len().min(MAX_SLOTS))];
    b[..8].copy_from_slice(MAGIC);
    b[8..12].copy_from_slice(&VERSION.to_le_bytes());
    b[12..16].copy_from_slice(&u32::try_from(slots.len().min(MAX_SLOTS)).unwrap_or(0).to_le_bytes());
    put_name(&mut b[16..16 + NAME_BYTES], app);
    for (i, s) in slots.iter().take(MAX_SLOTS).enumerate() {
        let at = SLOT * (i + 1);
        put_name(&mut b[at..at + NAME_BYTES], &s.name);
        let kind: u32 = if s.kind == SeriesKind::Gauge { 1 } else { 0 };
        b[at + NAME_BYTES..at + NAME_BYTES + 4].copy_from_slice(&kind.to_le_bytes());
    }
    b
}

/// Read a layout's header and names from its first bytes (`bytes` may be longer).
pub fn parse(bytes: &[u8]) -> Result<Header, String> {
    if bytes.len() < SLOT || &bytes[..8] != MAGIC {
        return Err("no VPCOUNT1 magic (not ready yet, or not application counters)".into());
    }
    let word = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
    if word(8) != VERSION {
        return Err(format!("layout version {}; this virtprof reads {VERSION}", word(8)));
    }
    let count = usize::try_from(word(12)).unwrap_or(usize::MAX);
    if count > MAX_SLOTS || size(count) > bytes.len() {
        return Err(format!("{count} slots do not fit in {} bytes", bytes.len()));
    }
    let slots = (0..count)
        .map(|i| {
            let at = SLOT * (i + 1);
            let kind = if word(at + NAME_BYTES) == 1 { SeriesKind::Gauge } else { SeriesKind::Counter };
            Slot { name: name(&bytes[at..at + NAME_BYTES]), kind }
        })
        .collect();
    Ok(Header { app: name(&bytes[16..16 + NAME_BYTES]), slots })
}

/// Slot `i`'s value in `bytes` (0 past the end).
pub fn value(bytes: &[u8], i: usize) -> u64 {
    let at = value_offset(i);
    bytes.get(at..at + 8).map_or(0, |b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
}

fn name(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    // Names become series names: printable ASCII, no dots (they separate a series' parts).
    String::from_utf8_lossy(&bytes[..end])
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '_' })
        .collect()
}

fn put_name(dest: &mut [u8], name: &str) {
    let n = name.len().min(dest.len() - 1);
    dest[..n].copy_from_slice(&name.as_bytes()[..n]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_image_parses_back_and_damage_is_named() {
        let slots = [
            Slot { name: "iterations".into(), kind: SeriesKind::Counter },
            Slot { name: "phase now".into(), kind: SeriesKind::Gauge },
        ];
        let mut b = image("testvm", &slots);
        b[value_offset(0)..value_offset(0) + 8].copy_from_slice(&42u64.to_le_bytes());
        let h = parse(&b).unwrap();
        assert_eq!(h.app, "testvm");
        assert_eq!(h.slots[1], Slot { name: "phase_now".into(), kind: SeriesKind::Gauge });
        assert_eq!(value(&b, 0), 42);
        assert_eq!(value_offset(0) % 8, 0);
        b[12] = 99;
        assert!(parse(&b).unwrap_err().contains("do not fit"));
        b[8] = 2;
        assert!(parse(&b).unwrap_err().contains("version 2"));
        assert!(parse(b"short").is_err());
    }
}
