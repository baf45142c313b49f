//! Mutation fuzzing of the agent's frame decoder on stable Rust (issue 23's fuzzing,
//! extended to the guest link): streams of every kind of frame, damaged (bytes flipped,
//! inserted, cut, magic repeated, lengths forged) and fed in pieces of random size, as a
//! hostile guest or a noisy serial port would. Every input must give frames or counted
//! errors: no panic, memory bounded by a frame (the reader never holds more than a frame's
//! header and payload plus one piece), and work linear in the bytes fed.
//! `VIRTPROF_FUZZ_ITERS` inputs (default 3 000); `benches/fuzz.sh` runs a million.

// Random bytes and indices are made by truncating random u64s on purpose.
#![allow(clippy::cast_possible_truncation)]

use virtprof_agent::wire::{FrameReader, Hello, Message, PtpPair, Row, HEADER, MAX_PAYLOAD, VERSION};
use virtprof_model::guest::{GuestSeries, NoiseBatch};

use virtprof_host::fuzz::Rng;

fn seed_stream() -> Vec<u8> {
    let mut out = Vec::new();
    for m in [
        Message::Hello(Hello { version: VERSION, token: Some("t0ken-long".into()) }),
        Message::Schema(vec![GuestSeries::counter("app.x", "events"), GuestSeries::gauge("vmstat.y", "pages")]),
        Message::Row(Row { start_ns: 1, end_ns: 2, values: vec![1.0, 2.0] }),
        Message::Ping { seq: 3, t1: 4 },
        Message::Ptp(PtpPair { guest_ns: 5, host_realtime_ns: 6, uncertainty_ns: 7 }),
        Message::Noise(Box::new(NoiseBatch { start_ns: 1, end_ns: 9, samples: vec![(2, 3)], ..Default::default() })),
        Message::Refused("no".into()),
    ] {
        m.encode(&mut out);
    }
    out
}

fn mutate(rng: &mut Rng, input: &mut Vec<u8>) {
    for _ in 0..=rng.below(6) {
        let at = rng.below(input.len() + 1);
        match rng.below(6) {
            0 if at < input.len() => input[at] = rng.byte(),
            1 => input.insert(at, rng.byte()),
            2 if at < input.len() => {
                input.remove(at);
            }
            // Repeated magic: a run of headers that are no frames.
            3 => {
                let run = [b'V', b'A', rng.byte(), rng.below(2) as u8, 0, 0, 0, 0].repeat(rng.below(5000));
                input.splice(at..at, run);
            }
            // A forged length.
            4 if at + HEADER <= input.len() => {
                input[at] = b'V';
                input[at + 1] = b'A';
                input[at + 3] = 0;
                input[at + 4..at + 8].copy_from_slice(&(rng.word() as u32).to_le_bytes());
            }
            _ => input.truncate(at),
        }
    }
}

#[test]
fn fuzz_frame_reader() {
    let iters = virtprof_host::fuzz::iterations(3_000);
    let seed = seed_stream();
    let mut rng = Rng(
        0x5eed_0000_0000_0001 ^ std::env::var("VIRTPROF_FUZZ_SHARD").ok().and_then(|v| v.parse().ok()).unwrap_or(0)
    );
    for i in 0..iters {
        let mut input = seed.repeat(1 + rng.below(4));
        mutate(&mut rng, &mut input);
        let mut reader = FrameReader::default();
        let (mut at, mut steps, mut largest) = (0, 0usize, 0usize);
        while at < input.len() {
            let piece = 1 + rng.below(70_000);
            let end = (at + piece).min(input.len());
            reader.feed(&input[at..end]);
            largest = largest.max(end - at);
            at = end;
            while reader.next_message().is_some() {
                steps += 1;
                assert!(steps <= input.len() + 8, "input {i}: more steps than bytes");
            }
            assert!(reader.buffered() <= HEADER + MAX_PAYLOAD + largest, "input {i}: {} buffered", reader.buffered());
        }
    }
}
