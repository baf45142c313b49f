//! A bounds-checked little-endian cursor over a trace.dat: every read says where it failed.

use super::TraceDatError;

pub(super) struct Cursor<'a> {
    pub data: &'a [u8],
    pub pos: usize,
    /// Added to positions in errors: where `data` sits in the file (a section read out of it).
    pub base: usize,
}

impl<'a> Cursor<'a> {
    pub fn at(data: &'a [u8], pos: usize) -> Self {
        Cursor { data, pos, base: 0 }
    }

    /// A cursor over bytes taken out of the file at `base` (an expanded section).
    pub fn within(data: &'a [u8], base: usize) -> Self {
        Cursor { data, pos: 0, base }
    }

    pub fn fail<T>(&self, message: impl Into<String>) -> Result<T, TraceDatError> {
        Err(TraceDatError { offset: self.base + self.pos, message: message.into() })
    }

    pub fn remaining(&self) -> usize {
        self.data.len().saturating_sub(self.pos)
    }

    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], TraceDatError> {
        match self.pos.checked_add(n).filter(|&end| end <= self.data.len()) {
            Some(end) => {
                let b = &self.data[self.pos..end];
                self.pos = end;
                Ok(b)
            }
            None => self.fail(format!("needs {n} more bytes, the data ends at byte {}", self.base + self.data.len())),
        }
    }

    pub fn u8(&mut self) -> Result<u8, TraceDatError> {
        Ok(self.bytes(1)?[0])
    }

    pub fn u16(&mut self) -> Result<u16, TraceDatError> {
        Ok(u16::from_le_bytes(self.bytes(2)?.try_into().expect("2")))
    }

    pub fn u32(&mut self) -> Result<u32, TraceDatError> {
        Ok(u32::from_le_bytes(self.bytes(4)?.try_into().expect("4")))
    }

    pub fn u64(&mut self) -> Result<u64, TraceDatError> {
        Ok(u64::from_le_bytes(self.bytes(8)?.try_into().expect("8")))
    }

    /// A 32-bit size, as a usize.
    pub fn size32(&mut self) -> Result<usize, TraceDatError> {
        Ok(self.u32()? as usize)
    }

    /// A 64-bit offset or size, as a usize.
    pub fn size64(&mut self) -> Result<usize, TraceDatError> {
        let v = self.u64()?;
        usize::try_from(v).or_else(|_| self.fail(format!("offset {v} is too large")))
    }

    pub fn cstr(&mut self) -> Result<String, TraceDatError> {
        let rest = &self.data[self.pos.min(self.data.len())..];
        let Some(len) = rest.iter().position(|&b| b == 0) else { return self.fail("unterminated string") };
        let s = String::from_utf8_lossy(&rest[..len]).into_owned();
        self.pos += len + 1;
        Ok(s)
    }

    pub fn text(&mut self, len: usize) -> Result<String, TraceDatError> {
        let bytes = self.bytes(len)?;
        // Checked whole first: a file holds thousands of format texts, nearly always ASCII,
        // and the lossy path's chunking is several times slower on each.
        Ok(std::str::from_utf8(bytes).map_or_else(|_| String::from_utf8_lossy(bytes).into_owned(), str::to_owned))
    }
}
