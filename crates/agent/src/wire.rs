//! The agent protocol's frames, sans I/O (documented in `docs/agent.md`).
//!
//! Every frame is an 8-byte header — magic `VA`, kind: u8, reserved 0, length: u32 (little
//! endian) — then `length` bytes of payload, at most [`MAX_PAYLOAD`]. The magic lets a reader
//! on a byte stream that outlives its peers (a virtio-serial port) find the next frame after
//! garbage: [`FrameReader`] skips to it and counts what it skipped.

use serde::{Deserialize, Serialize};
use virtprof_model::guest::{GuestInfo, GuestSeries, NoiseBatch};

/// Frame magic.
pub const MAGIC: [u8; 2] = *b"VA";
/// Header bytes.
pub const HEADER: usize = 8;
/// The largest payload: a row of 65 536 series (512 KiB) plus room.
pub const MAX_PAYLOAD: usize = 1 << 20;
/// Protocol version.
pub const VERSION: u32 = 1;

/// Frame kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Kind {
    Hello = 1,
    Welcome = 2,
    Ping = 3,
    Pong = 4,
    Row = 5,
    Schema = 6,
    Refused = 7,
    Noise = 8,
    Ptp = 9,
}

impl Kind {
    fn of(byte: u8) -> Option<Kind> {
        [
            Kind::Hello,
            Kind::Welcome,
            Kind::Ping,
            Kind::Pong,
            Kind::Row,
            Kind::Schema,
            Kind::Refused,
            Kind::Noise,
            Kind::Ptp,
        ]
        .into_iter()
        .find(|k| *k as u8 == byte)
    }
}

/// The host's opening: which protocol, its token (TCP), and the interval it wants.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// [`VERSION`].
    pub version: u32,
    /// The shared secret, on transports that need one.
    #[serde(default)]
    pub token: Option<String>,
}

/// The agent's answer: its guest and the series its rows carry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Welcome {
    /// [`VERSION`].
    pub version: u32,
    /// The guest.
    pub guest: GuestInfo,
    /// Columns of the rows that follow.
    pub series: Vec<GuestSeries>,
}

/// One clock exchange as the agent returns it: the host's send time, the guest's receive and
/// send times.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pong {
    /// The ping's number.
    pub seq: u64,
    /// Host time the ping was sent.
    pub t1: u64,
    /// Guest time it was read.
    pub t2: u64,
    /// Guest time the answer was written.
    pub t3: u64,
}

/// A ptp_kvm reading in the guest: the host's CLOCK_REALTIME (from KVM's clock pairing) at
/// a guest CLOCK_MONOTONIC time, and how far off the guest's conversion can be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PtpPair {
    /// Guest CLOCK_MONOTONIC.
    pub guest_ns: u64,
    /// Host CLOCK_REALTIME at that moment.
    pub host_realtime_ns: u64,
    /// The guest's uncertainty (its realtime-to-monotonic conversion), ns.
    pub uncertainty_ns: u64,
}

/// One interval of the guest: guest times and one value per series of the latest schema.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// Guest time the row starts.
    pub start_ns: u64,
    /// Guest time it ends.
    pub end_ns: u64,
    /// Values, in schema order.
    pub values: Vec<f64>,
}

/// A decoded frame.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    /// Host → agent, first.
    Hello(Hello),
    /// Agent → host, answering [`Message::Hello`].
    Welcome(Box<Welcome>),
    /// Host → agent: a clock exchange (number, host send time).
    Ping {
        /// Number.
        seq: u64,
        /// Host time sent.
        t1: u64,
    },
    /// Agent → host.
    Pong(Pong),
    /// Agent → host: one interval.
    Row(Row),
    /// Agent → host: the rows from here on carry these series.
    Schema(Vec<GuestSeries>),
    /// Agent → host: the hello was refused (a wrong token, another version).
    Refused(String),
    /// Agent → host: one period of the noise loop on one CPU (`agent --noise`).
    Noise(Box<NoiseBatch>),
    /// Agent → host: a ptp_kvm clock reading.
    Ptp(PtpPair),
}

/// A frame that cannot be what it claims.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WireError {
    /// Length over [`MAX_PAYLOAD`].
    #[error("a frame of {0} bytes (the most is {MAX_PAYLOAD})")]
    TooLarge(usize),
    /// A kind no version knows.
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    /// A payload that does not parse as its kind.
    #[error("a bad {kind} frame: {why}")]
    BadPayload {
        /// Frame kind.
        kind: &'static str,
        /// What is wrong.
        why: String,
    },
}

impl Message {
    /// Append this message as one frame to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        framed(out, |out| match self {
            Message::Hello(h) => json(out, h, Kind::Hello),
            Message::Welcome(w) => json(out, w, Kind::Welcome),
            Message::Ping { seq, t1 } => {
                words(out, &[*seq, *t1]);
                Kind::Ping
            }
            Message::Pong(p) => {
                words(out, &[p.seq, p.t1, p.t2, p.t3]);
                Kind::Pong
            }
            Message::Row(r) => row_payload(out, r.start_ns, r.end_ns, &r.values),
            Message::Schema(s) => json(out, s, Kind::Schema),
            Message::Refused(why) => json(out, why, Kind::Refused),
            Message::Noise(batch) => json(out, batch, Kind::Noise),
            Message::Ptp(p) => {
                words(out, &[p.guest_ns, p.host_realtime_ns, p.uncertainty_ns]);
                Kind::Ptp
            }
        });
    }

    /// Append a row frame from borrowed values: the same bytes as encoding a
    /// [`Message::Row`], without building one (the agent reuses its row buffer).
    pub fn encode_row(out: &mut Vec<u8>, start_ns: u64, end_ns: u64, values: &[f64]) {
        framed(out, |out| row_payload(out, start_ns, end_ns, values));
    }

    fn decode(kind: u8, payload: &[u8]) -> Result<Message, WireError> {
        let kind = Kind::of(kind).ok_or(WireError::UnknownKind(kind))?;
        let bad = |name: &'static str, why: String| WireError::BadPayload { kind: name, why };
        let fixed = |name: &'static str, n: usize| -> Result<Vec<u64>, WireError> {
            if payload.len() != 8 * n {
                return Err(bad(name, format!("{} bytes, not {}", payload.len(), 8 * n)));
            }
            Ok(payload.chunks_exact(8).map(le_u64).collect())
        };
        Ok(match kind {
            Kind::Hello => Message::Hello(parse(payload).map_err(|e| bad("hello", e))?),
            Kind::Welcome => Message::Welcome(Box::new(parse(payload).map_err(|e| bad("welcome", e))?)),
            Kind::Schema => Message::Schema(parse(payload).map_err(|e| bad("schema", e))?),
            Kind::Refused => Message::Refused(parse(payload).map_err(|e| bad("refused", e))?),
            Kind::Noise => Message::Noise(Box::new(parse(payload).map_err(|e| bad("noise", e))?)),
            Kind::Ping => {
                let w = fixed("ping", 2)?;
                Message::Ping { seq: w[0], t1: w[1] }
            }
            Kind::Ptp => {
                let w = fixed("ptp", 3)?;
                Message::Ptp(PtpPair { guest_ns: w[0], host_realtime_ns: w[1], uncertainty_ns: w[2] })
            }
            Kind::Pong => {
                let w = fixed("pong", 4)?;
                Message::Pong(Pong { seq: w[0], t1: w[1], t2: w[2], t3: w[3] })
            }
            Kind::Row => {
                if payload.len() < 16 || payload.len() % 8 != 0 {
                    return Err(bad("row", format!("{} bytes", payload.len())));
                }
                let values = payload[16..].chunks_exact(8).map(|b| f64::from_bits(le_u64(b))).collect();
                Message::Row(Row { start_ns: le_u64(&payload[..8]), end_ns: le_u64(&payload[8..16]), values })
            }
        })
    }
}

/// Append one frame: the header, then what `payload` writes, then the header's kind and length.
fn framed(out: &mut Vec<u8>, payload: impl FnOnce(&mut Vec<u8>) -> Kind) {
    let start = out.len();
    out.extend_from_slice(&[MAGIC[0], MAGIC[1], 0, 0, 0, 0, 0, 0]);
    let kind = payload(out);
    let len = u32::try_from(out.len() - start - HEADER).unwrap_or(u32::MAX);
    out[start + 2] = kind as u8;
    out[start + 4..start + 8].copy_from_slice(&len.to_le_bytes());
}

fn row_payload(out: &mut Vec<u8>, start_ns: u64, end_ns: u64, values: &[f64]) -> Kind {
    words(out, &[start_ns, end_ns]);
    for v in values {
        out.extend_from_slice(&v.to_le_bytes());
    }
    Kind::Row
}

fn json<T: Serialize + ?Sized>(out: &mut Vec<u8>, value: &T, kind: Kind) -> Kind {
    // Our own types always serialize.
    serde_json::to_writer(&mut *out, value).expect("serializable");
    kind
}

fn words(out: &mut Vec<u8>, words: &[u64]) {
    for w in words {
        out.extend_from_slice(&w.to_le_bytes());
    }
}

fn parse<T: serde::de::DeserializeOwned>(payload: &[u8]) -> Result<T, String> {
    serde_json::from_slice(payload).map_err(|e| e.to_string())
}

fn le_u64(b: &[u8]) -> u64 {
    u64::from_le_bytes(b.try_into().expect("8 bytes"))
}

/// Frames out of a byte stream fed in pieces, in bounded memory and linear time: bytes
/// before `start` are consumed, and are dropped from the buffer only once they are half of it
/// (so a stream of repeated magic bytes costs each byte once, not once per skip).
#[derive(Debug, Default)]
pub struct FrameReader {
    buf: Vec<u8>,
    start: usize,
    /// Bytes skipped looking for a frame (garbage, or a frame cut by a reconnect).
    pub skipped: u64,
    /// Frames refused (too large, unknown kind, bad payload).
    pub refused: u64,
}

impl FrameReader {
    /// Append bytes read from the stream.
    pub fn feed(&mut self, bytes: &[u8]) {
        if self.start > 0 && self.start >= self.buf.len() / 2 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// Bytes buffered and not yet taken (at most a frame's header and payload, plus what
    /// the last `feed` brought).
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.start
    }

    fn consume(&mut self, n: usize) {
        self.start += n;
        if self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        }
    }

    /// The next whole frame, if one is buffered. A bad frame is skipped (counted) and its
    /// error returned; the reader then looks for the next magic.
    pub fn next_message(&mut self) -> Option<Result<Message, WireError>> {
        let rest = &self.buf[self.start..];
        let at = rest.windows(2).position(|w| w == MAGIC).unwrap_or(rest.len().saturating_sub(1));
        if at > 0 {
            self.skipped += at as u64;
            self.consume(at);
        }
        let rest = &self.buf[self.start..];
        if rest.len() < HEADER {
            return None;
        }
        let len = usize::try_from(u32::from_le_bytes(rest[4..8].try_into().expect("4 bytes"))).unwrap_or(usize::MAX);
        if len > MAX_PAYLOAD || rest[3] != 0 {
            // Not a frame after all (or a hostile one): skip its magic and look on.
            self.refused += 1;
            self.skipped += 2;
            self.consume(2);
            return Some(Err(WireError::TooLarge(len)));
        }
        if rest.len() < HEADER + len {
            return None;
        }
        let message = Message::decode(rest[2], &rest[HEADER..HEADER + len]);
        self.consume(HEADER + len);
        if message.is_err() {
            self.refused += 1;
            self.skipped += (HEADER + len) as u64;
        }
        Some(message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(reader: &mut FrameReader) -> Vec<Result<Message, WireError>> {
        std::iter::from_fn(|| reader.next_message()).collect()
    }

    #[test]
    fn a_row_from_borrowed_values_is_the_same_frame() {
        let values = [1.5, f64::NAN, -2.0];
        let (mut a, mut b) = (Vec::new(), Vec::new());
        Message::encode_row(&mut a, 10, 20, &values);
        Message::Row(Row { start_ns: 10, end_ns: 20, values: values.to_vec() }).encode(&mut b);
        assert_eq!(a, b);
    }

    #[test]
    fn every_message_round_trips_through_bytes_fed_one_at_a_time() {
        let messages = vec![
            Message::Hello(Hello { version: VERSION, token: Some("s3cret".into()) }),
            Message::Welcome(Box::new(Welcome {
                version: VERSION,
                guest: GuestInfo { hostname: "g".into(), cpus: 2, ..Default::default() },
                series: vec![GuestSeries::counter("cpu0.steal_ns", "ns")],
            })),
            Message::Ping { seq: 7, t1: 123 },
            Message::Pong(Pong { seq: 7, t1: 123, t2: 456, t3: 789 }),
            Message::Ptp(PtpPair { guest_ns: 5, host_realtime_ns: 1_700_000_000_000_000_000, uncertainty_ns: 40 }),
            Message::Row(Row { start_ns: 1, end_ns: 2, values: vec![0.5, -1.0, f64::MAX] }),
            Message::Schema(vec![GuestSeries::gauge("vmstat.nr_free_pages", "pages")]),
            Message::Refused("wrong token".into()),
        ];
        let mut bytes = Vec::new();
        for m in &messages {
            m.encode(&mut bytes);
        }
        let mut reader = FrameReader::default();
        let mut got = Vec::new();
        for b in bytes {
            reader.feed(&[b]);
            got.extend(all(&mut reader));
        }
        assert_eq!(got, messages.into_iter().map(Ok).collect::<Vec<_>>());
        assert_eq!((reader.skipped, reader.refused), (0, 0));
    }

    #[test]
    fn garbage_and_bad_frames_are_skipped_and_counted_and_the_next_frame_still_reads() {
        let mut bytes = b"noise before".to_vec();
        // A header claiming 4 GiB, an unknown kind, and a ping of the wrong size.
        bytes.extend_from_slice(&[b'V', b'A', 4, 0, 0xff, 0xff, 0xff, 0xff]);
        bytes.extend_from_slice(&[b'V', b'A', 99, 0, 0, 0, 0, 0]);
        bytes.extend_from_slice(&[b'V', b'A', 3, 0, 1, 0, 0, 0, 0]);
        Message::Ping { seq: 1, t1: 2 }.encode(&mut bytes);
        let mut reader = FrameReader::default();
        reader.feed(&bytes);
        let got = all(&mut reader);
        assert_eq!(got.last(), Some(&Ok(Message::Ping { seq: 1, t1: 2 })));
        assert_eq!(got.iter().filter(|m| m.is_err()).count(), 3);
        assert_eq!(reader.refused, 3);
        assert!(reader.skipped >= 12 + 8 + 8 + 9 - 6, "{}", reader.skipped);
        assert_eq!(reader.buffered(), 0);
    }

    /// Repeated magic bytes (each a header that is no frame) cost each byte once: 8 MiB of
    /// them are read in about as many steps, not 8 Mi × 8 Mi.
    #[test]
    fn repeated_magic_is_skipped_in_linear_time() {
        let mut bad = Vec::new();
        for _ in 0..(1 << 20) {
            bad.extend_from_slice(&[b'V', b'A', 1, 1, 0, 0, 0, 0]);
        }
        let mut reader = FrameReader::default();
        let mut steps = 0u64;
        for chunk in bad.chunks(64 << 10) {
            reader.feed(chunk);
            while reader.next_message().is_some() {
                steps += 1;
            }
            assert!(reader.buf.len() <= 2 * (64 << 10) + HEADER, "{}", reader.buf.len());
        }
        assert_eq!(steps, 1 << 20);
        let mut ok = Vec::new();
        Message::Ping { seq: 1, t1: 2 }.encode(&mut ok);
        reader.feed(&ok);
        assert_eq!(reader.next_message(), Some(Ok(Message::Ping { seq: 1, t1: 2 })));
    }

    #[test]
    fn a_half_frame_waits_for_the_rest_without_growing_past_it() {
        let mut bytes = Vec::new();
        Message::Row(Row { start_ns: 5, end_ns: 6, values: vec![1.0; 100] }).encode(&mut bytes);
        let mut reader = FrameReader::default();
        reader.feed(&bytes[..500]);
        assert!(reader.next_message().is_none());
        reader.feed(&bytes[500..]);
        assert!(matches!(reader.next_message(), Some(Ok(Message::Row(r))) if r.values.len() == 100));
    }
}
