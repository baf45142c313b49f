//! A run of whole ring-buffer pages as a source holds it: in place (a recording's chunk, an
//! uncompressed trace.dat, a live batch), or as one compressed frame (trace-cmd's zstd or
//! zlib trace.dat) that is expanded only when a walk reaches it, so memory stays at one frame
//! per CPU whatever the file's size.

/// How a frame is compressed (trace-cmd writes zstd, or zlib where it was built without zstd).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    /// A zstd frame.
    Zstd,
    /// A zlib stream (RFC 1950: deflate with its header and checksum), as `compress2` writes.
    Zlib,
}

impl Codec {
    /// Its name in a trace.dat header.
    pub fn name(self) -> &'static str {
        match self {
            Codec::Zstd => "zstd",
            Codec::Zlib => "zlib",
        }
    }
}

/// Pages, or a compressed frame of them.
#[derive(Debug, Clone, Copy)]
pub enum Segment<'a> {
    /// Whole pages, read in place.
    Pages(&'a [u8]),
    /// One compressed frame holding `size` bytes of whole pages; `offset` is where the frame
    /// sits in its file (for error messages).
    Frame {
        /// How it is compressed.
        codec: Codec,
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
#[error("{} frame at byte {offset}: {message}", codec.name())]
pub struct SegmentError {
    /// How the frame is compressed.
    pub codec: Codec,
    /// The frame's byte offset in its file.
    pub offset: usize,
    /// What went wrong.
    pub message: String,
}

/// zstd and zlib rarely beat 50:1 on ring-buffer pages (a chunk of nearly empty pages may
/// reach a few hundred); a frame declaring far more is corrupt, or made to exhaust memory.
const MAX_RATIO: usize = 1000;
/// Whatever the ratio, no chunk of pages expands to more than this: trace-cmd writes chunks
/// of 10 pages (40 KiB; 640 KiB with 64 KiB pages), and a walk holds one expanded chunk per
/// CPU at a time, so this times the CPU count is what a file can make a reader hold.
pub const MAX_FRAME: usize = 16 << 20;

impl<'a> Segment<'a> {
    /// A compressed chunk of pages, refused up front if its declared size is implausible for
    /// it (over [`MAX_FRAME`], or over [`MAX_RATIO`] times its own size).
    pub fn frame(codec: Codec, frame: &'a [u8], size: usize, offset: usize) -> Result<Segment<'a>, SegmentError> {
        Segment::frame_at_most(codec, frame, size, offset, MAX_FRAME)
    }

    /// A compressed frame expanding to at most `most` bytes (and [`MAX_RATIO`] times its
    /// own size, or 1 MiB), refused up front otherwise.
    pub fn frame_at_most(
        codec: Codec,
        frame: &'a [u8],
        size: usize,
        offset: usize,
        most: usize,
    ) -> Result<Segment<'a>, SegmentError> {
        let plausible = frame.len().saturating_mul(MAX_RATIO).clamp(1 << 20, most.max(1 << 20));
        if size > plausible {
            return Err(SegmentError {
                codec,
                offset,
                message: format!(
                    "claims {size} bytes once expanded, implausible for its {} bytes (at most {plausible} are taken): the file is damaged, or made to exhaust memory",
                    frame.len()
                ),
            });
        }
        Ok(Segment::Frame { codec, frame, size, offset })
    }

    /// Bytes of pages it holds (once expanded).
    pub fn len(&self) -> usize {
        match self {
            Segment::Pages(pages) => pages.len(),
            Segment::Frame { size, .. } => *size,
        }
    }

    /// True if it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True if reading it takes decompression.
    pub fn is_compressed(&self) -> bool {
        matches!(self, Segment::Frame { .. })
    }

    /// Its pages: borrowed, or expanded into `buffer` (reused from frame to frame).
    pub fn pages<'b>(&'b self, buffer: &'b mut Vec<u8>) -> Result<&'b [u8], SegmentError> {
        match *self {
            Segment::Pages(pages) => Ok(pages),
            Segment::Frame { codec, frame, size, offset } => {
                let fail = |message: String| SegmentError { codec, offset, message };
                // Not cleared first: every byte is written by the expansion (its length is
                // checked below), so zeroing the buffer for each frame would be wasted work.
                buffer.resize(size, 0);
                let n = match codec {
                    Codec::Zstd => expand_zstd(frame, buffer).map_err(fail)?,
                    Codec::Zlib => inflate(frame, buffer).map_err(fail)?,
                };
                if n != size {
                    return Err(fail(format!("expanded to {n} bytes, the file says {size}")));
                }
                Ok(buffer)
            }
        }
    }
}

// A file holds thousands of frames, expanded on a few threads: each thread keeps its
// decompressor (their state is tens of KiB to set up) rather than making one per frame.
thread_local! {
    static INFLATER: std::cell::RefCell<libdeflater::Decompressor> =
        std::cell::RefCell::new(libdeflater::Decompressor::new());
    static ZSTD: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> =
        const { std::cell::RefCell::new(None) };
}

/// Expand one zlib stream into `out` (its declared size); the bytes written.
fn inflate(frame: &[u8], out: &mut [u8]) -> Result<usize, String> {
    INFLATER.with_borrow_mut(|inflater| match inflater.zlib_decompress(frame, out) {
        Ok(n) => Ok(n),
        Err(libdeflater::DecompressionError::InsufficientSpace) => {
            Err(format!("expands past the {} bytes the file says", out.len()))
        }
        Err(libdeflater::DecompressionError::BadData) => Err("not a whole, valid zlib stream".into()),
    })
}

/// Expand one zstd frame into `out` (its declared size); the bytes written.
fn expand_zstd(frame: &[u8], out: &mut [u8]) -> Result<usize, String> {
    ZSTD.with_borrow_mut(|cached| {
        let d = match cached {
            Some(d) => d,
            None => cached.insert(zstd::bulk::Decompressor::new().map_err(|e| e.to_string())?),
        };
        d.decompress_to_buffer(frame, out).map_err(|e| e.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_expands_to_its_declared_size_and_no_other() {
        let pages: Vec<u8> = (0..3 * 4096u32).map(|i| (i % 251) as u8).collect();
        let zstd_frame = zstd::bulk::compress(&pages, 3).unwrap();
        let mut zlib = libdeflater::Compressor::new(libdeflater::CompressionLvl::default());
        let mut zlib_frame = vec![0; zlib.zlib_compress_bound(pages.len())];
        let n = zlib.zlib_compress(&pages, &mut zlib_frame).unwrap();
        zlib_frame.truncate(n);
        for (codec, frame) in [(Codec::Zstd, &zstd_frame), (Codec::Zlib, &zlib_frame)] {
            let mut buffer = Vec::new();
            let segment = Segment::frame(codec, frame, pages.len(), 100).unwrap();
            assert_eq!(segment.pages(&mut buffer).unwrap(), &pages[..]);
            let wrong = Segment::frame(codec, frame, pages.len() - 1, 100).unwrap();
            assert!(wrong.pages(&mut buffer).unwrap_err().offset == 100);
            let short = Segment::frame(codec, frame, pages.len() + 1, 100).unwrap();
            assert!(short.pages(&mut buffer).is_err(), "{codec:?}");
            let cut = Segment::frame(codec, &frame[..frame.len() / 2], pages.len(), 100).unwrap();
            assert!(cut.pages(&mut buffer).is_err(), "{codec:?}");
            let err = Segment::frame(codec, &frame[..10], 64 << 30, 5).unwrap_err();
            assert!(err.message.contains("implausible") && err.to_string().starts_with(codec.name()));
        }
    }
}
