//! The bytes a source is read from: a mapped file, or bytes made in memory (a live mode's
//! recording), shared by what reads them later (a guest's noise periods are decoded from
//! them when asked for, not held decoded).

use std::sync::Arc;

/// A recording's or trace.dat's bytes.
#[derive(Clone)]
pub enum Backing {
    /// Shared with the thread that faults its pages in (see `session::map_file`).
    Map(Arc<memmap2::Mmap>),
    /// Made in memory.
    Memory(Arc<[u8]>),
}

impl std::ops::Deref for Backing {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Backing::Map(map) => map,
            Backing::Memory(bytes) => bytes,
        }
    }
}

impl std::fmt::Debug for Backing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Backing({} bytes)", self.len())
    }
}
