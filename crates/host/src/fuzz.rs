//! What the mutation fuzz tests share (on stable Rust, in `tests/fuzz.rs` of the decoder
//! crates and in `serve`'s request parser): a small deterministic generator and the number of
//! inputs to run.

/// xorshift64*: small, deterministic, good enough to drive mutations.
#[derive(Debug, Clone)]
pub struct Rng(pub u64);

impl Rng {
    /// The next value.
    pub fn word(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A value below `n` (0 for `n` of 0).
    pub fn below(&mut self, n: usize) -> usize {
        usize::try_from(self.word() % u64::try_from(n.max(1)).unwrap_or(u64::MAX)).unwrap_or(0)
    }

    /// A random byte.
    pub fn byte(&mut self) -> u8 {
        self.word().to_le_bytes()[0]
    }
}

/// Inputs per target: `VIRTPROF_FUZZ_ITERS`, else `default` (CI's short pass).
pub fn iterations(default: usize) -> usize {
    std::env::var("VIRTPROF_FUZZ_ITERS").ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}
