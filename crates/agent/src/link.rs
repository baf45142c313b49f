//! The host's side of one agent: connect, say hello, measure the clock with ping bursts all
//! run long, and hand on rows as they come. An agent that cannot be reached, hangs up, stalls
//! or sends garbage costs the host a gap in that guest's rows (reported with its host times
//! and cause) and nothing else; the link reconnects until it is stopped.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use virtprof_host::monotonic_ns;
use virtprof_model::guest::{Alignment, ClockPoint, GuestInfo, GuestSeries, NoiseBatch};

use crate::clock::{validate, Burst, Exchange, Validation};
use crate::transport::{Address, Stream};
use crate::wire::{FrameReader, Hello, Message, PtpPair, Row, VERSION};

/// Exchanges kept for the final check (about 5 hours at the default rate).
const MAX_EXCHANGES: usize = 1 << 17;

/// How the host talks to one agent.
#[derive(Debug, Clone)]
pub struct LinkConfig {
    /// Where the agent is.
    pub address: Address,
    /// Its token, if it wants one.
    pub token: Option<String>,
    /// A burst of pings this often.
    pub ping_every: Duration,
    /// Pings per burst (the least round trip of them makes the point).
    pub burst: u32,
}

impl LinkConfig {
    /// The defaults for `address`: a burst of 8 pings every second.
    pub fn new(address: Address, token: Option<String>) -> LinkConfig {
        LinkConfig { address, token, ping_every: Duration::from_secs(1), burst: 8 }
    }
}

/// What the link hands on, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum LinkEvent {
    /// The agent answered a hello: its guest and the series its rows carry.
    Connected {
        /// The guest.
        guest: GuestInfo,
        /// Columns.
        series: Vec<GuestSeries>,
    },
    /// The rows from here on carry these series.
    Schema(Vec<GuestSeries>),
    /// One interval of the guest (guest times).
    Row(Row),
    /// One period of the guest's noise loop on one CPU (guest times).
    Noise(Box<NoiseBatch>),
    /// A measured clock point.
    Clock(ClockPoint),
    /// The agent cannot be reached now, and why (said once per cause; the gap follows when
    /// it is back, or at the end).
    Unreachable(String),
    /// No rows between these host times, and why.
    Gap {
        /// Host time the guest was last heard.
        from_ns: u64,
        /// Host time it was heard again (or the end).
        to_ns: u64,
        /// Why.
        cause: String,
    },
}

/// The link's figures at the end.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LinkSummary {
    /// Connections that got a welcome.
    pub sessions: u64,
    /// Rows received.
    pub rows: u64,
    /// Noise periods received.
    pub noise_batches: u64,
    /// Gaps reported.
    pub gaps: u64,
    /// Bytes skipped as garbage.
    pub garbage_bytes: u64,
    /// Frames refused as malformed.
    pub bad_frames: u64,
    /// Clock points measured.
    pub clock_points: u64,
    /// Every exchange checked against the final alignment.
    pub validation: Validation,
    /// The agent refused us (wrong token, other version): the link gave up.
    pub refused: Option<String>,
}

/// A guest is stalled when nothing came for this long, once rows were flowing.
fn stall_after(interval_ns: u64) -> u64 {
    (3 * interval_ns).max(2_000_000_000)
}
/// A stalled guest is hung up on and reconnected after this long.
const GIVE_UP_NS: u64 = 10_000_000_000;
/// How long one ping of a burst waits for its pong.
const PONG_WITHIN_NS: u64 = 200_000_000;

/// Run the link until `stop` is set, handing every event to `sink`.
pub fn run(config: &LinkConfig, stop: &AtomicBool, sink: &mut dyn FnMut(LinkEvent)) -> LinkSummary {
    let mut summary = LinkSummary::default();
    let mut alignment = Alignment::default();
    let mut exchanges = Vec::new();
    let started = monotonic_ns();
    // Host time the guest was last heard, or the start: a gap runs from here.
    let mut heard = started;
    let mut gap_cause: Option<String> = None;
    while !stop.load(Ordering::Relaxed) {
        let stream = match config.address.connect(Duration::from_secs(2)) {
            Ok(s) => s,
            Err(e) => {
                let cause = format!("cannot connect: {e}");
                if gap_cause.is_none() {
                    sink(LinkEvent::Unreachable(cause.clone()));
                }
                gap_cause.get_or_insert(cause);
                sleep_or_stop(Duration::from_secs(1), stop);
                continue;
            }
        };
        let mut s = Session { stream, reader: FrameReader::default(), config, interval_ns: 1_000_000_000 };
        let outcome = s.run(stop, &mut |event| match event {
            Event::Welcome(guest, series) => {
                summary.sessions += 1;
                if let Some(cause) = gap_cause.take() {
                    if summary.sessions > 1 || monotonic_ns() - started > 2_000_000_000 {
                        summary.gaps += 1;
                        sink(LinkEvent::Gap { from_ns: heard, to_ns: monotonic_ns(), cause });
                    }
                }
                sink(LinkEvent::Connected { guest, series });
            }
            Event::Heard(at) => heard = at,
            Event::Stalled(from, to) => {
                summary.gaps += 1;
                sink(LinkEvent::Gap { from_ns: from, to_ns: to, cause: "the agent stalled".into() });
            }
            Event::Schema(series) => sink(LinkEvent::Schema(series)),
            Event::Row(row) => {
                summary.rows += 1;
                sink(LinkEvent::Row(row));
            }
            Event::Noise(batch) => {
                summary.noise_batches += 1;
                sink(LinkEvent::Noise(batch));
            }
            Event::BadRow => summary.bad_frames += 1,
            Event::Exchange(e) => {
                if exchanges.len() < MAX_EXCHANGES {
                    exchanges.push(e);
                }
            }
            Event::Point(p) => {
                summary.clock_points += 1;
                alignment.push(p);
                sink(LinkEvent::Clock(p));
            }
        });
        summary.garbage_bytes += s.reader.skipped;
        summary.bad_frames += s.reader.refused;
        match outcome {
            Outcome::Stopped => break,
            Outcome::Refused(why) => {
                gap_cause.get_or_insert_with(|| format!("the agent refused us: {why}"));
                summary.refused = Some(why);
                break;
            }
            Outcome::Lost(cause) => {
                sink(LinkEvent::Unreachable(cause.clone()));
                gap_cause.get_or_insert(cause);
                sleep_or_stop(Duration::from_millis(200), stop);
            }
        }
    }
    if let Some(cause) = gap_cause {
        summary.gaps += 1;
        sink(LinkEvent::Gap { from_ns: heard, to_ns: monotonic_ns(), cause });
    }
    summary.validation = validate(&alignment, &exchanges);
    summary
}

fn sleep_or_stop(d: Duration, stop: &AtomicBool) {
    virtprof_host::clock::sleep_until_or_stop(monotonic_ns() + u64::try_from(d.as_nanos()).unwrap_or(0), stop);
}

enum Event {
    Welcome(GuestInfo, Vec<GuestSeries>),
    Heard(u64),
    Stalled(u64, u64),
    Schema(Vec<GuestSeries>),
    Row(Row),
    Noise(Box<NoiseBatch>),
    /// A row whose values do not match the series, or a noise period that cannot be what it
    /// claims: dropped, counted.
    BadRow,
    Exchange(Exchange),
    Point(ClockPoint),
}

enum Outcome {
    Stopped,
    Refused(String),
    Lost(String),
}

struct Session<'a> {
    stream: Stream,
    reader: FrameReader,
    config: &'a LinkConfig,
    interval_ns: u64,
}

impl Session<'_> {
    fn send(&mut self, m: &Message) -> Result<(), Outcome> {
        let mut out = Vec::new();
        m.encode(&mut out);
        self.stream.write_all_within(&out, Duration::from_secs(2)).map_err(|e| Outcome::Lost(format!("writing: {e}")))
    }

    fn run(&mut self, stop: &AtomicBool, on: &mut dyn FnMut(Event)) -> Outcome {
        let hello = Message::Hello(Hello { version: VERSION, token: self.config.token.clone() });
        if let Err(o) = self.send(&hello) {
            return o;
        }
        let opened = monotonic_ns();
        let mut welcomed = false;
        let mut series = 0;
        let mut last_heard = opened;
        let mut stalled_since: Option<u64> = None;
        let ping_every = u64::try_from(self.config.ping_every.as_nanos()).unwrap_or(u64::MAX);
        let mut burst = Burst::default();
        let (mut next_burst, mut sent_in_burst, mut seq) = (opened, 0u32, 0u64);
        let mut waiting: Option<(u64, u64)> = None; // (seq, t1) of the ping in flight
        let mut buf = vec![0u8; 64 << 10];
        loop {
            if stop.load(Ordering::Relaxed) {
                return Outcome::Stopped;
            }
            let now = monotonic_ns();
            // Clock pings: one in flight at a time, a burst every `ping_every`.
            if welcomed {
                if waiting.is_some_and(|(_, t1)| now - t1 > PONG_WITHIN_NS) {
                    waiting = None;
                    sent_in_burst += 1;
                }
                if waiting.is_none() && now >= next_burst {
                    if sent_in_burst < self.config.burst {
                        seq += 1;
                        let t1 = monotonic_ns();
                        if let Err(o) = self.send(&Message::Ping { seq, t1 }) {
                            return o;
                        }
                        waiting = Some((seq, t1));
                    } else {
                        if let Some(p) = burst.take() {
                            on(Event::Point(p));
                        }
                        sent_in_burst = 0;
                        next_burst = now + ping_every;
                    }
                }
            }
            let readable = match self.stream.readable(Duration::from_millis(if waiting.is_some() { 1 } else { 20 })) {
                Ok(r) => r,
                Err(e) => return Outcome::Lost(format!("waiting: {e}")),
            };
            if readable {
                match self.stream.read_some(&mut buf) {
                    Ok(Some(0)) => return Outcome::Lost("the agent hung up".into()),
                    Ok(Some(n)) => {
                        let t4 = monotonic_ns();
                        self.reader.feed(&buf[..n]);
                        last_heard = t4;
                        on(Event::Heard(t4));
                        if let Some(from) = stalled_since.take() {
                            on(Event::Stalled(from, t4));
                        }
                        while let Some(m) = self.reader.next_message() {
                            match m {
                                Ok(Message::Welcome(w)) => {
                                    welcomed = true;
                                    self.interval_ns = w.guest.interval_ns.max(1_000_000);
                                    series = w.series.len();
                                    on(Event::Welcome(w.guest, w.series));
                                }
                                Ok(Message::Refused(why)) => return Outcome::Refused(why),
                                Ok(Message::Schema(s)) => {
                                    series = s.len();
                                    on(Event::Schema(s));
                                }
                                // A guest's rows must match its series, or the recording
                                // could not be read back: a row that does not is dropped.
                                Ok(Message::Row(r)) if welcomed && r.values.len() == series => on(Event::Row(r)),
                                Ok(Message::Row(_)) => on(Event::BadRow),
                                Ok(Message::Ptp(p)) if welcomed => on(Event::Point(ptp_point(p))),
                                Ok(Message::Noise(b)) if welcomed && plausible(&b) => on(Event::Noise(b)),
                                Ok(Message::Noise(_)) => on(Event::BadRow),
                                Ok(Message::Pong(p)) => {
                                    if waiting.is_some_and(|(s, _)| s == p.seq) {
                                        let e = Exchange { t1: p.t1, t2: p.t2, t3: p.t3, t4 };
                                        burst.offer(e);
                                        on(Event::Exchange(e));
                                        waiting = None;
                                        sent_in_burst += 1;
                                    }
                                }
                                Ok(_) | Err(_) => {}
                            }
                        }
                    }
                    Ok(None) => {}
                    Err(e) => return Outcome::Lost(format!("reading: {e}")),
                }
            }
            let now = monotonic_ns();
            if !welcomed && now - opened > 5_000_000_000 {
                return Outcome::Lost("no welcome within 5 s".into());
            }
            let quiet = now - last_heard;
            if welcomed && quiet > stall_after(self.interval_ns) && stalled_since.is_none() {
                stalled_since = Some(last_heard);
            }
            if quiet > GIVE_UP_NS {
                // The gap until the reconnection covers the stall.
                return Outcome::Lost("the agent stalled (silent for 10 s): hung up to reconnect".into());
            }
        }
    }
}

/// A guest's ptp_kvm reading as a clock point: its host CLOCK_REALTIME put on the host's
/// CLOCK_MONOTONIC with the offset between the two read now.
fn ptp_point(p: PtpPair) -> ClockPoint {
    let (realtime_minus_mono, uncertainty_ns) = virtprof_host::clock::realtime_minus_monotonic();
    let host = i128::from(p.host_realtime_ns) - i128::from(realtime_minus_mono);
    let host_ns = u64::try_from(host.max(0)).unwrap_or(0);
    let offset = i128::from(p.guest_ns) - i128::from(host_ns);
    ClockPoint {
        host_ns,
        offset_ns: i64::try_from(offset).unwrap_or(if offset < 0 { i64::MIN } else { i64::MAX }),
        bound_ns: p.uncertainty_ns.saturating_add(uncertainty_ns),
        ptp: true,
    }
}

/// Whether a noise period from a guest can be what it claims: within the sample cap, and
/// every sample inside its window (else a guest could make the host explain nonsense).
fn plausible(b: &NoiseBatch) -> bool {
    b.start_ns <= b.end_ns
        && b.samples.len() <= NoiseBatch::MAX_SAMPLES
        && b.samples.iter().all(|&(start, len)| start >= b.start_ns && start.saturating_add(len) <= b.end_ns)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_noise_period_must_keep_its_samples_inside_its_window_and_cap() {
        let batch = |samples: Vec<(u64, u64)>| NoiseBatch { start_ns: 100, end_ns: 200, samples, ..Default::default() };
        assert!(plausible(&batch(vec![(100, 10), (150, 50)])));
        assert!(!plausible(&batch(vec![(90, 5)])), "starts before the window");
        assert!(!plausible(&batch(vec![(150, 51)])), "ends after it");
        assert!(!plausible(&batch(vec![(150, u64::MAX)])), "no overflow");
        assert!(!plausible(&batch(vec![(100, 1); NoiseBatch::MAX_SAMPLES + 1])), "over the cap");
        assert!(!plausible(&NoiseBatch { start_ns: 2, end_ns: 1, ..Default::default() }));
    }
    use crate::collect::CollectConfig;
    use crate::serve::{serve, ServeConfig};
    use std::io::Write;
    use std::sync::Arc;

    fn free_port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
    }

    /// Run a link for `d`, collecting its events.
    fn link_for(config: &LinkConfig, d: Duration) -> (LinkSummary, Vec<LinkEvent>) {
        let stop = Arc::new(AtomicBool::new(false));
        let stopper = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                std::thread::sleep(d);
                stop.store(true, Ordering::Relaxed);
            })
        };
        let mut events = Vec::new();
        let summary = run(config, &stop, &mut |e| events.push(e));
        stopper.join().unwrap();
        (summary, events)
    }

    /// An agent on this host over TCP wanting `token`, serving one host; its stop flag.
    fn start_agent(token: &str) -> (Address, Arc<AtomicBool>, std::thread::JoinHandle<std::io::Result<()>>) {
        let address = Address::Tcp(format!("127.0.0.1:{}", free_port()));
        let serve_config = ServeConfig {
            address: address.clone(),
            token: Some(token.into()),
            interval_ns: 100_000_000,
            collect: CollectConfig::default(),
            sessions: Some(1),
            noise: None,
        };
        let stop = Arc::new(AtomicBool::new(false));
        let agent = {
            let stop = stop.clone();
            std::thread::spawn(move || serve(&serve_config, &stop, &mut |_| {}))
        };
        std::thread::sleep(Duration::from_millis(200));
        (address, stop, agent)
    }

    #[test]
    fn an_agent_on_this_host_sends_rows_and_its_clock_offset_is_zero_within_the_bound() {
        let (address, agent_stop, agent) = start_agent("k");
        let (summary, events) = link_for(&LinkConfig::new(address, Some("k".into())), Duration::from_millis(2500));
        agent_stop.store(true, Ordering::Relaxed);
        agent.join().unwrap().unwrap();
        assert_eq!(summary.sessions, 1, "{summary:?}");
        assert!(
            matches!(&events[0], LinkEvent::Connected { series, .. } if series.iter().any(|s| s.name == "cpu0.steal_ns"))
        );
        // 2.5 s of 100 ms rows (the first starts at the hello).
        assert!((20..=26).contains(&summary.rows), "{summary:?}");
        assert!(summary.clock_points >= 2, "{summary:?}");
        // Guest and host share one CLOCK_MONOTONIC here: the true offset is 0.
        for e in &events {
            if let LinkEvent::Clock(p) = e {
                assert!(p.offset_ns.unsigned_abs() <= p.bound_ns, "{p:?}");
            }
        }
        assert_eq!(summary.validation.outside, 0, "{summary:?}");
        assert!(summary.validation.checked >= 16, "{summary:?}");
        assert_eq!((summary.gaps, summary.garbage_bytes, summary.bad_frames), (0, 0, 0));
    }

    #[test]
    fn a_wrong_token_is_refused_and_the_link_gives_up_saying_so() {
        let (address, agent_stop, agent) = start_agent("right");
        let (summary, events) = link_for(&LinkConfig::new(address, Some("wrong".into())), Duration::from_secs(3));
        // A refused host is not a session served: the agent waits for the next one.
        assert!(!agent.is_finished());
        agent_stop.store(true, Ordering::Relaxed);
        agent.join().unwrap().unwrap();
        assert!(summary.refused.as_deref().is_some_and(|r| r.contains("token")), "{summary:?}");
        assert_eq!(summary.rows, 0);
        assert!(matches!(events.last(), Some(LinkEvent::Gap { cause, .. }) if cause.contains("refused")), "{events:?}");
    }

    #[test]
    fn garbage_a_stall_and_no_agent_cost_the_host_a_reported_gap_and_nothing_else() {
        // A fake agent: welcomes, sends garbage and two rows, then stalls without reading.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = Address::Tcp(listener.local_addr().unwrap().to_string());
        let fake = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut out = Vec::new();
            let welcome = crate::wire::Welcome {
                version: VERSION,
                guest: GuestInfo { interval_ns: 100_000_000, ..Default::default() },
                series: vec![GuestSeries::counter("x", "events")],
            };
            Message::Welcome(Box::new(welcome)).encode(&mut out);
            out.extend_from_slice(b"\x00garbage VA\xff\xff");
            for i in 0..2 {
                Message::Row(Row { start_ns: i, end_ns: i + 1, values: vec![1.0] }).encode(&mut out);
            }
            // A row that does not match the series: dropped, or the recording would not read.
            Message::Row(Row { start_ns: 3, end_ns: 4, values: vec![1.0, 2.0] }).encode(&mut out);
            s.write_all(&out).unwrap();
            std::thread::sleep(Duration::from_millis(3500));
            drop(s);
        });
        let (summary, events) = link_for(&LinkConfig::new(address, None), Duration::from_millis(4500));
        fake.join().unwrap();
        assert_eq!(summary.rows, 2, "{summary:?}");
        assert!(summary.garbage_bytes > 0 && summary.bad_frames >= 2, "{summary:?}");
        assert_eq!(events.iter().filter(|e| matches!(e, LinkEvent::Row(_))).count(), 2);
        let gaps: Vec<&LinkEvent> = events.iter().filter(|e| matches!(e, LinkEvent::Gap { .. })).collect();
        assert!(!gaps.is_empty(), "{events:?}");
        assert_eq!(summary.gaps, gaps.len() as u64);
        // The agent went quiet after its rows, then away: one gap from then to the end, with
        // the first cause seen (the reset, or the stall had the link hung up first).
        let Some(LinkEvent::Gap { from_ns, to_ns, cause }) = gaps.last() else { unreachable!() };
        assert!(to_ns - from_ns > 3_000_000_000 && !cause.is_empty(), "{gaps:?}");
    }
}
