//! A run of whole ring-buffer pages as a source holds it: in place (a recording's chunk, an
//! uncompressed trace.dat, a live batch), or as one zstd frame (trace-cmd's compressed
//! trace.dat) that is expanded only when a walk reaches it, so memory stays at one frame per
//! CPU whatever the file's size.

/// Pages, or a compressed frame of them.
#[derive(Debug, Clone, Copy)]
pub enum Segment<'a> {
    /// Whole pages, read in place.
    Pages(&'a [u8]),
    /// One zstd frame holding `size` bytes of whole pages; `offset` is where the frame sits
    /// in its file (for error messages).
    Zstd {
        /// The compressed frame.
        frame: &'a [u8],
        /// Its size once expanded, as the file declares it.
        size: usize,
        /// Its byte offset in the file.
        offset: usize,
    },
}

/// A frame that would not expand.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("zstd frame at byte {offset}: {message}")]
pub struct SegmentError {
    /// The frame's byte offset in its file.
    pub offset: usize,
    /// What went wrong.
    pub message: String,
}

/// zstd rarely beats 50:1 on ring-buffer pages; a frame declaring far more is corrupt.
const MAX_RATIO: usize = 1000;
/// Whatever the ratio, no frame expands to more than this (trace-cmd's are a few pages).
const MAX_FRAME: usize = 256 << 20;

impl<'a> Segment<'a> {
    /// A compressed frame, refused up front if its declared size is implausible for it.
    pub fn zstd(frame: &'a [u8], size: usize, offset: usize) -> Result<Segment<'a>, SegmentError> {
        let plausible = frame.len().saturating_mul(MAX_RATIO).clamp(1 << 20, MAX_FRAME);
        if size > plausible {
            return Err(SegmentError {
                offset,
                message: format!("claims {size} bytes once expanded, implausible for its {} bytes", frame.len()),
            });
        }
        Ok(Segment::Zstd { frame, size, offset })
    }

    /// Bytes of pages it holds (once expanded).
    pub fn len(&self) -> usize {
        match self {
            Segment::Pages(pages) => pages.len(),
            Segment::Zstd { size, .. } => *size,
        }
    }

    /// True if it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True if reading it takes decompression.
    pub fn is_compressed(&self) -> bool {
        matches!(self, Segment::Zstd { .. })
    }

    /// Its pages: borrowed, or expanded into `buffer` (reused from frame to frame).
    pub fn pages<'b>(&'b self, buffer: &'b mut Vec<u8>) -> Result<&'b [u8], SegmentError> {
        match *self {
            Segment::Pages(pages) => Ok(pages),
            Segment::Zstd { frame, size, offset } => {
                let fail = |message: String| SegmentError { offset, message };
                buffer.clear();
                buffer.resize(size, 0);
                let n = zstd::bulk::Decompressor::new()
                    .and_then(|mut d| d.decompress_to_buffer(frame, buffer.as_mut_slice()))
                    .map_err(|e| fail(e.to_string()))?;
                if n != size {
                    return Err(fail(format!("expanded to {n} bytes, the file says {size}")));
                }
                Ok(buffer)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_expands_to_its_declared_size_and_no_other() {
        let pages = vec![7u8; 3 * 4096];
        let frame = zstd::bulk::compress(&pages, 3).unwrap();
        let mut buffer = Vec::new();
        let segment = Segment::zstd(&frame, pages.len(), 100).unwrap();
        assert_eq!(segment.pages(&mut buffer).unwrap(), &pages[..]);
        let wrong = Segment::zstd(&frame, pages.len() - 1, 100).unwrap();
        assert!(wrong.pages(&mut buffer).unwrap_err().offset == 100);
        let short = Segment::zstd(&frame, pages.len() + 1, 100).unwrap();
        assert!(short.pages(&mut buffer).unwrap_err().message.contains("expanded to"));
        assert!(Segment::zstd(&frame[..10], 64 << 30, 5).unwrap_err().message.contains("implausible"));
    }
}
