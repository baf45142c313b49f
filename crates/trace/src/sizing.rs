//! How big a capture's per-CPU ring buffers must be for the event rate it sees.
//!
//! A buffer loses events when its reader stays away longer than the buffer takes to fill. The
//! reader is woken when a buffer is [`crate::capture::WAKE_PERCENT`] full, so what protects the
//! recording is how long the buffer holds at the rate seen: it is grown to hold [`HEADROOM`] of
//! the busiest CPU's rate (never shrunk: the pages may hold events), within a memory limit.

use std::time::Duration;

/// How long a buffer must hold at the busiest CPU's rate: a reader descheduled on a loaded
/// host, or a writer stuck behind a slow disk, for this long loses nothing.
pub const HEADROOM: Duration = Duration::from_secs(4);
/// Rates are measured over windows this long (shorter ones see bursts, not rates).
pub const WINDOW: Duration = Duration::from_secs(1);
/// The largest per-CPU buffer grown to, whatever the memory: beyond it a rate is better met by
/// fewer events (`--events`) than by more memory.
pub const MOST_KB: u32 = 256 * 1024;

/// Follows the bytes each CPU produced and says when the buffers should grow.
#[derive(Debug)]
pub struct Sizer {
    kb: u32,
    most_kb: u32,
    /// Bytes read per CPU (by position in the capture's CPU list) in this window.
    read: Vec<u64>,
    /// Bytes each CPU's buffer held unread at the start of this window.
    held: Vec<u64>,
    window_ns: u64,
}

impl Sizer {
    /// Buffers of `kb` per CPU on `cpus` CPUs, to grow to at most `most_kb`.
    pub fn new(kb: u32, most_kb: u32, cpus: usize) -> Sizer {
        Sizer { kb, most_kb: most_kb.max(kb), read: vec![0; cpus], held: vec![0; cpus], window_ns: 0 }
    }

    /// The current size per CPU.
    pub fn kb(&self) -> u32 {
        self.kb
    }

    /// `bytes` were read from the CPU at `index`.
    pub fn read(&mut self, index: usize, bytes: usize) {
        if let Some(b) = self.read.get_mut(index) {
            *b += bytes as u64;
        }
    }

    /// `elapsed` more time passed; true when a [`WINDOW`] is complete (then [`Sizer::end_window`]).
    pub fn due(&mut self, elapsed: Duration) -> bool {
        self.window_ns = self.window_ns.saturating_add(u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX));
        u128::from(self.window_ns) >= WINDOW.as_nanos()
    }

    /// End the window, given the bytes each CPU's buffer holds unread now: the size to grow to,
    /// if the busiest CPU's rate needs more than the buffers have (then [`Sizer::grew`]). The
    /// rate is what the CPU produced (read, plus what its buffer gained), so a reader draining
    /// a backlog after a stall does not count it twice.
    pub fn end_window(&mut self, held: &[u64]) -> Option<u32> {
        let produced = self
            .read
            .iter()
            .zip(&self.held)
            .zip(held)
            .map(|((&read, &before), &now)| (read + now).saturating_sub(before));
        let busiest = produced.max().unwrap_or(0);
        let window_ns = self.window_ns;
        self.read.iter_mut().for_each(|b| *b = 0);
        self.held.iter_mut().zip(held).for_each(|(before, &now)| *before = now);
        self.window_ns = 0;
        grow_to(self.kb, self.most_kb, busiest, window_ns)
    }

    /// The buffers are now `kb` per CPU.
    pub fn grew(&mut self, kb: u32) {
        self.kb = kb;
    }
}

/// The per-CPU size (KB, a power of two, at most `most_kb`) that holds [`HEADROOM`] at the rate
/// of `bytes` in `window_ns`, when that is more than `kb`.
fn grow_to(kb: u32, most_kb: u32, bytes: u64, window_ns: u64) -> Option<u32> {
    let needed_kb = u128::from(bytes) * HEADROOM.as_nanos() / u128::from(window_ns.max(1)) / 1024;
    if needed_kb <= u128::from(kb) || kb >= most_kb {
        return None;
    }
    let needed_kb = u32::try_from(needed_kb).unwrap_or(most_kb).min(most_kb);
    Some(needed_kb.checked_next_power_of_two().unwrap_or(most_kb).min(most_kb))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_grow_to_hold_the_headroom_of_the_busiest_cpu() {
        let second = 1_000_000_000;
        // 9 MiB/s on one CPU needs 36 MiB for 4 s: the next power of two is 64 MiB.
        assert_eq!(grow_to(8192, MOST_KB, 9 << 20, second), Some(65536));
        // A rate the buffer already holds: no change.
        assert_eq!(grow_to(8192, MOST_KB, 1 << 20, second), None);
        // Never past the limit.
        assert_eq!(grow_to(8192, 20000, 1 << 30, second), Some(20000));
        assert_eq!(grow_to(20000, 20000, 1 << 30, second), None);
        // No time passed: no division by zero.
        assert_eq!(grow_to(8192, MOST_KB, 0, 0), None);
    }

    #[test]
    fn the_rate_is_what_the_busiest_cpu_produced_over_a_whole_window() {
        let mut sizer = Sizer::new(4096, MOST_KB, 2);
        sizer.read(0, 1 << 20);
        sizer.read(1, 6 << 20);
        assert!(!sizer.due(Duration::from_millis(500)));
        assert!(sizer.due(Duration::from_millis(500)));
        // CPU 1: 6 MiB read and 2 MiB more waiting = 8 MiB in 1 s: 32 MiB for 4 s.
        assert_eq!(sizer.end_window(&[0, 2 << 20]), Some(32768));
        sizer.grew(32768);
        assert_eq!(sizer.kb(), 32768);
        // A stalled reader drains its backlog: 8 MiB read, the buffer 2 MiB emptier, in 1 s
        // is 6 MiB produced, which 32 MiB already holds.
        sizer.read(1, 8 << 20);
        assert!(sizer.due(WINDOW));
        assert_eq!(sizer.end_window(&[0, 0]), None);
        // CPUs the capture does not have are ignored.
        sizer.read(5, 1 << 30);
        assert!(sizer.due(WINDOW));
        assert_eq!(sizer.end_window(&[0, 0]), None);
    }
}
