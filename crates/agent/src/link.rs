//! The host's side of one agent: connect, say hello, measure the clock with ping bursts all
//! run long, and hand on rows as they come. An agent that cannot be reached, hangs up, stalls
//! or sends garbage costs the host a gap in that guest's rows (reported with its host times
//! and cause) and nothing else; the link reconnects until it is stopped. What the guest sends
//! is taken within the host's [`GuestLimits`]: the excess is counted, dropped and, for rows,
//! recorded as a gap.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use virtprof_host::monotonic_ns;
use virtprof_model::guest::{Alignment, ClockPoint, GuestInfo, GuestSeries, NoiseBatch};

use crate::clock::{validate, Burst, Exchange, Validation};
use crate::limits::{GuestLimits, Names, Rate};
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
    /// What the guest may send.
    pub limits: GuestLimits,
    /// What each event costs where it is kept: the byte cap counts this.
    pub stored_size: StoredSize,
}

impl LinkConfig {
    /// The defaults for `address`: a burst of 8 pings every second, the default limits, events
    /// costing about what they hold ([`StoredSize::estimated`]).
    pub fn new(address: Address, token: Option<String>) -> LinkConfig {
        LinkConfig {
            address,
            token,
            ping_every: Duration::from_secs(1),
            burst: 8,
            limits: GuestLimits::default(),
            stored_size: StoredSize::estimated(),
        }
    }
}

/// The bytes an event takes where the link's user keeps it (a recording knows its own
/// encoding exactly): what [`GuestLimits::max_bytes`] counts.
#[derive(Clone)]
pub struct StoredSize(std::sync::Arc<dyn Fn(&LinkEvent) -> u64 + Send + Sync>);

impl StoredSize {
    /// Sizes from `of`.
    pub fn new(of: impl Fn(&LinkEvent) -> u64 + Send + Sync + 'static) -> StoredSize {
        StoredSize(std::sync::Arc::new(of))
    }

    /// What an event holds, about: 8 bytes a value or a sample's time, 16 a sample, the
    /// text of names and causes, and 64 bytes of framing each.
    pub fn estimated() -> StoredSize {
        StoredSize::new(|event| {
            64 + match event {
                LinkEvent::Connected { series, .. } | LinkEvent::Schema(series) => schema_bytes(series) + 512,
                LinkEvent::Row(row) => 8 * row.values.len() as u64,
                LinkEvent::Noise(batch) => 16 * batch.samples.len() as u64,
                LinkEvent::Clock(_) => 64,
                LinkEvent::Unreachable(cause) | LinkEvent::Gap { cause, .. } => cause.len() as u64,
            }
        })
    }

    fn of(&self, event: &LinkEvent) -> u64 {
        (self.0)(event)
    }
}

impl std::fmt::Debug for StoredSize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StoredSize")
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
        /// Host time of the last row taken.
        from_ns: u64,
        /// Host time rows were taken again (or the end).
        to_ns: u64,
        /// Why.
        cause: String,
    },
}

/// What the host dropped of what a guest sent, over its limits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Dropped {
    /// Rows over the guest's row rate or the byte cap.
    pub rows: u64,
    /// Noise periods over their rate or the byte cap.
    pub noise: u64,
    /// Clock points over their rate or count.
    pub points: u64,
    /// Schemas over the limits on series, their rate or the byte cap.
    pub schemas: u64,
    /// The byte cap was reached: nothing more was taken from then on.
    pub capped: bool,
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
    /// Bytes of what was taken, as stored ([`LinkConfig::stored_size`]).
    pub bytes: u64,
    /// What was over the limits.
    pub dropped: Dropped,
    /// Every exchange checked against the final alignment.
    pub validation: Validation,
    /// The agent refused us (wrong token, other version): the link gave up.
    pub refused: Option<String>,
    /// Welcomes the host refused (their series over its limits), and the last one's reason:
    /// nothing of those sessions was taken.
    pub rejected: Option<(u64, String)>,
}

/// A guest is stalled when no row came for this long, once rows were flowing.
fn stall_after(interval_ns: u64) -> u64 {
    (3 * interval_ns).max(2_000_000_000)
}
/// A guest that sent no whole frame for this long is hung up on and reconnected.
const GIVE_UP_NS: u64 = 10_000_000_000;
/// How long one ping of a burst waits for its pong.
const PONG_WITHIN_NS: u64 = 200_000_000;
/// Rows dropped over the rate close their gap once none was dropped for this long.
const FLOOD_QUIET_NS: u64 = 1_000_000_000;

/// Rows dropped since `from_ns` (the last row taken before them), and why.
struct Flood {
    from_ns: u64,
    last_drop_ns: u64,
    rows: u64,
    why: &'static str,
}

/// The host's side of the limits, over the whole run (all sessions).
struct Gate {
    limits: GuestLimits,
    rows: Rate,
    noise: Rate,
    schemas: Rate,
    last_ptp_ns: Option<u64>,
    points: u64,
    bytes: u64,
    capped_at: Option<u64>,
    flood: Option<Flood>,
    names: Names,
    /// The current schema was taken: rows after a refused one are dropped.
    schema_ok: bool,
}

impl Gate {
    fn new(limits: GuestLimits, now: u64) -> Gate {
        Gate {
            limits,
            rows: Rate::new(limits.rows_per_second(1_000_000_000), 10.0, now),
            noise: Rate::new(limits.rows_per_second(1_000_000_000), 8.0, now),
            schemas: Rate::new(1.0, 5.0, now),
            last_ptp_ns: None,
            points: 0,
            bytes: 0,
            capped_at: None,
            flood: None,
            names: Names::default(),
            schema_ok: false,
        }
    }

    /// A new session's guest, cut to size, sets the rates it is held to; whether its series
    /// are taken (within the names and bytes left: `stored` is what the welcome costs with
    /// them).
    fn welcome(&mut self, guest: &mut GuestInfo, series: &[GuestSeries], stored: u64, now: u64) -> bool {
        self.limits.trim_info(guest);
        let rows = self.limits.rows_per_second(guest.interval_ns);
        let cpus = f64::from(guest.cpus.clamp(1, 1024));
        self.rows = Rate::new(rows, 10.0, now);
        self.noise = Rate::new(rows * cpus, 2.0 * cpus + 8.0, now);
        self.schema_ok = self.names.admit(series, self.limits.max_names) && self.fits(stored, now);
        self.schema_ok
    }

    /// Whether `bytes` more fit under the cap, less the room kept for the run's closing gaps
    /// (false from the first that does not, on).
    fn fits(&mut self, bytes: u64, now: u64) -> bool {
        let room = self.limits.max_bytes.saturating_sub(CLOSING_GAPS);
        if self.capped_at.is_some() || self.bytes.saturating_add(bytes) > room {
            self.capped_at.get_or_insert(now);
            return false;
        }
        self.bytes += bytes;
        true
    }

    /// The gaps that close the run (at most three, each under [`MAX_CAUSE`] of text): counted,
    /// never refused, in the room [`fits`](Gate::fits) leaves for them.
    fn charge(&mut self, bytes: u64) {
        self.bytes = self.bytes.saturating_add(bytes);
    }

    fn row(&mut self, stored: u64, now: u64) -> bool {
        self.schema_ok && self.rows.take(now) && self.fits(stored, now)
    }

    fn noise(&mut self, stored: u64, now: u64) -> bool {
        self.noise.take(now) && self.fits(stored, now)
    }

    fn schema(&mut self, series: &[GuestSeries], stored: u64, now: u64) -> bool {
        self.schema_ok =
            self.schemas.take(now) && self.names.admit(series, self.limits.max_names) && self.fits(stored, now);
        self.schema_ok
    }

    fn point(&mut self, ptp: bool, stored: u64, now: u64) -> bool {
        if self.points >= self.limits.max_points {
            return false;
        }
        // The rate first: a point refused for it is not stored, so it must not use the cap
        // (a guest flooding PTP pairs filled the cap with points that were all refused).
        if ptp && self.last_ptp_ns.is_some_and(|last| now.saturating_sub(last) < self.limits.ptp_every_ns) {
            return false;
        }
        if !self.fits(stored, now) {
            return false;
        }
        if ptp {
            self.last_ptp_ns = Some(now);
        }
        self.points += 1;
        true
    }
}

fn schema_bytes(series: &[GuestSeries]) -> u64 {
    series.iter().map(|s| 16 + s.name.len() as u64 + s.unit.len() as u64).sum()
}

/// Run the link until `stop` is set, handing every event to `sink`.
pub fn run(config: &LinkConfig, stop: &AtomicBool, sink: &mut dyn FnMut(LinkEvent)) -> LinkSummary {
    let mut summary = LinkSummary::default();
    let mut alignment = Alignment::default();
    let mut exchanges = Vec::new();
    let started = monotonic_ns();
    let mut gate = Gate::new(config.limits, started);
    // Host time of the last row taken, or the start: a gap runs from here.
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
        let size = |event: &LinkEvent| config.stored_size.of(event);
        let outcome = s.run(stop, &mut |event| {
            let now = monotonic_ns();
            match event {
                Event::Welcome(guest, series) => {
                    summary.sessions += 1;
                    // Series over the names or bytes left are not taken, nor the rows after.
                    let mut welcome = LinkEvent::Connected { guest, series };
                    let stored = size(&welcome);
                    let LinkEvent::Connected { guest, series } = &mut welcome else { unreachable!() };
                    let mut taken = gate.welcome(guest, series, stored, now);
                    if !taken {
                        summary.dropped.schemas += 1;
                        series.clear();
                        // Without its series, if even that fits (past the cap, nothing does).
                        taken = gate.fits(size(&welcome), now);
                    }
                    if let Some(cause) = gap_cause.take() {
                        if summary.sessions > 1 || now - started > 2_000_000_000 {
                            let gap = LinkEvent::Gap { from_ns: heard, to_ns: now, cause };
                            if gate.fits(size(&gap), now) {
                                summary.gaps += 1;
                                sink(gap);
                            }
                        }
                    }
                    heard = now;
                    if taken {
                        sink(welcome);
                    }
                }
                Event::Stalled(from, to) => {
                    let gap = LinkEvent::Gap { from_ns: from, to_ns: to, cause: "the agent stalled".into() };
                    if gate.fits(size(&gap), now) {
                        summary.gaps += 1;
                        sink(gap);
                    }
                }
                Event::Schema(series) => {
                    let event = LinkEvent::Schema(series);
                    let stored = size(&event);
                    let LinkEvent::Schema(series) = &event else { unreachable!() };
                    if gate.schema(series, stored, now) {
                        sink(event);
                    } else {
                        summary.dropped.schemas += 1;
                    }
                }
                Event::Row(row) => {
                    let event = LinkEvent::Row(row);
                    if gate.row(size(&event), now) {
                        summary.rows += 1;
                        if let Some(f) = gate.flood.take_if(|f| now - f.last_drop_ns > FLOOD_QUIET_NS) {
                            let gap = flood_gap(&f);
                            if gate.fits(size(&gap), now) {
                                summary.gaps += 1;
                                sink(gap);
                            }
                        }
                        heard = now;
                        sink(event);
                        return;
                    }
                    summary.dropped.rows += 1;
                    // Past the byte cap, the cap's own gap covers the rest of the run.
                    if gate.capped_at.is_none() {
                        let why = if gate.schema_ok {
                            "the guest sent rows faster than its interval allows"
                        } else {
                            "the guest's series were over the host's limits"
                        };
                        let f = gate.flood.get_or_insert(Flood { from_ns: heard, last_drop_ns: now, rows: 0, why });
                        f.last_drop_ns = now;
                        f.rows += 1;
                    }
                }
                Event::Noise(batch) => {
                    let event = LinkEvent::Noise(batch);
                    if gate.noise(size(&event), now) {
                        summary.noise_batches += 1;
                        sink(event);
                    } else {
                        summary.dropped.noise += 1;
                    }
                }
                Event::BadRow => summary.bad_frames += 1,
                Event::BadSchema => summary.dropped.schemas += 1,
                Event::Exchange(e) => {
                    if exchanges.len() < MAX_EXCHANGES {
                        exchanges.push(e);
                    }
                }
                Event::Point(p) if gate.point(p.ptp, size(&LinkEvent::Clock(p)), now) => {
                    summary.clock_points += 1;
                    alignment.push(p);
                    sink(LinkEvent::Clock(p));
                }
                Event::Point(_) => summary.dropped.points += 1,
            }
        });
        summary.garbage_bytes += s.reader.skipped;
        summary.bad_frames += s.reader.refused;
        match outcome {
            Outcome::Stopped => break,
            Outcome::Refused(why) => {
                // The guest's words, kept short: they are stored in the gap and the footer.
                let why = cut(why, MAX_CAUSE);
                gap_cause.get_or_insert_with(|| format!("the agent refused us: {why}"));
                summary.refused = Some(why);
                break;
            }
            Outcome::Rejected(why) => {
                let why = cut(why, MAX_CAUSE);
                let cause = format!("the host refused the guest: {why}");
                sink(LinkEvent::Unreachable(cause.clone()));
                gap_cause.get_or_insert(cause);
                let times = summary.rejected.as_ref().map_or(0, |(n, _)| *n) + 1;
                summary.rejected = Some((times, why));
                sleep_or_stop(AFTER_REJECTION, stop);
            }
            Outcome::Lost(cause) => {
                sink(LinkEvent::Unreachable(cause.clone()));
                gap_cause.get_or_insert(cause);
                sleep_or_stop(Duration::from_millis(200), stop);
            }
        }
    }
    let end = monotonic_ns();
    let mut gaps = Vec::new();
    if let Some(f) = gate.flood.take() {
        gaps.push(flood_gap(&f));
    }
    if let Some(at) = gate.capped_at {
        summary.dropped.capped = true;
        let cause = format!(
            "the guest's data reached the host's cap of {:.1} MiB for this run: the rest was dropped",
            gate.limits.max_bytes as f64 / f64::from(1u32 << 20)
        );
        gaps.push(LinkEvent::Gap { from_ns: at, to_ns: end, cause });
    }
    if let Some(cause) = gap_cause {
        gaps.push(LinkEvent::Gap { from_ns: heard, to_ns: end, cause: cut(cause, MAX_CAUSE) });
    }
    for g in gaps {
        summary.gaps += 1;
        gate.charge(config.stored_size.of(&g));
        sink(g);
    }
    summary.bytes = gate.bytes;
    summary.validation = validate(&alignment, &exchanges);
    summary
}

fn flood_gap(f: &Flood) -> LinkEvent {
    LinkEvent::Gap { from_ns: f.from_ns, to_ns: f.last_drop_ns, cause: format!("{}: {} rows dropped", f.why, f.rows) }
}

fn sleep_or_stop(d: Duration, stop: &AtomicBool) {
    virtprof_host::clock::sleep_until_or_stop(monotonic_ns() + u64::try_from(d.as_nanos()).unwrap_or(0), stop);
}
enum Event {
    Welcome(GuestInfo, Vec<GuestSeries>),
    Stalled(u64, u64),
    Schema(Vec<GuestSeries>),
    Row(Row),
    Noise(Box<NoiseBatch>),
    /// A row whose values do not match the series, or a noise period that cannot be what it
    /// claims: dropped, counted.
    BadRow,
    /// A schema over the limits on series: dropped, and rows until the next good one too.
    BadSchema,
    Exchange(Exchange),
    Point(ClockPoint),
}

enum Outcome {
    Stopped,
    /// The agent refused us.
    Refused(String),
    /// We refused the agent's welcome.
    Rejected(String),
    Lost(String),
}

/// Room the byte cap keeps for the gaps that close a run (flood, cap, last cause): three
/// gaps of at most [`MAX_CAUSE`] bytes of text and their framing.
const CLOSING_GAPS: u64 = 3 * (MAX_CAUSE as u64 + 256);
/// The most text of a cause a gap keeps (a guest's refusal is its own words).
const MAX_CAUSE: usize = 512;

/// `text` cut to at most `max` bytes, at a character boundary.
fn cut(mut text: String, max: usize) -> String {
    if text.len() > max {
        let at = (0..=max).rev().find(|&i| text.is_char_boundary(i)).unwrap_or(0);
        text.truncate(at);
    }
    text
}

/// How long the link waits before greeting again an agent whose welcome it refused (it will
/// say the same until it is changed).
const AFTER_REJECTION: Duration = Duration::from_secs(5);

struct Session<'a> {
    stream: Stream,
    reader: FrameReader,
    config: &'a LinkConfig,
    interval_ns: u64,
}

/// Rows match no schema (until a good one comes).
const NO_SCHEMA: usize = usize::MAX;

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
        let mut series = NO_SCHEMA;
        // Host times of the last whole frame and of the last row (or the welcome): a guest
        // trickling bytes inside a frame is heard from by neither.
        let (mut last_frame, mut last_row) = (opened, opened);
        let mut stalled_since: Option<u64> = None;
        let ping_every = u64::try_from(self.config.ping_every.as_nanos()).unwrap_or(u64::MAX);
        let mut burst = Burst::default();
        let (mut next_burst, mut sent_in_burst, mut seq) = (opened, 0u32, 0u64);
        let mut waiting: Option<(u64, u64)> = None; // (seq, t1) of the ping in flight
        let mut buf = vec![0u8; 64 << 10];
        loop {
            if stop.load(Ordering::Relaxed) {
                if let Some(from) = stalled_since {
                    on(Event::Stalled(from, monotonic_ns()));
                }
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
                        while let Some(m) = self.reader.next_message() {
                            if m.is_ok() {
                                last_frame = t4;
                            }
                            match m {
                                Ok(Message::Welcome(w)) => {
                                    if let Err(why) = self.config.limits.check_series(&w.series) {
                                        return Outcome::Rejected(format!(
                                            "its welcome was over the host's limits: {why}"
                                        ));
                                    }
                                    welcomed = true;
                                    last_row = t4;
                                    self.interval_ns = w.guest.interval_ns.max(self.config.limits.min_interval_ns);
                                    series = w.series.len();
                                    on(Event::Welcome(w.guest, w.series));
                                }
                                Ok(Message::Refused(why)) => return Outcome::Refused(why),
                                Ok(Message::Schema(s)) if welcomed && self.config.limits.check_series(&s).is_ok() => {
                                    series = s.len();
                                    on(Event::Schema(s));
                                }
                                Ok(Message::Schema(_)) => {
                                    series = NO_SCHEMA;
                                    on(Event::BadSchema);
                                }
                                // A guest's rows must match its series, or the recording
                                // could not be read back: a row that does not is dropped.
                                Ok(Message::Row(r)) if welcomed && r.values.len() == series => {
                                    last_row = t4;
                                    if let Some(from) = stalled_since.take() {
                                        on(Event::Stalled(from, t4));
                                    }
                                    on(Event::Row(r));
                                }
                                Ok(Message::Row(_)) => on(Event::BadRow),
                                Ok(Message::Ptp(p)) if welcomed => on(Event::Point(ptp_point(p))),
                                Ok(Message::Noise(b)) if welcomed && plausible(&b) => on(Event::Noise(b)),
                                Ok(Message::Noise(_)) => on(Event::BadRow),
                                Ok(Message::Pong(p)) => {
                                    // The send time is the host's own record, never the
                                    // guest's echo of it: a guest cannot shrink the bound.
                                    if let Some((_, t1)) = waiting.filter(|(s, _)| *s == p.seq) {
                                        let e = Exchange { t1, t2: p.t2, t3: p.t3, t4 };
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
            if welcomed && now - last_row > stall_after(self.interval_ns) && stalled_since.is_none() {
                stalled_since = Some(last_row);
            }
            if now - last_frame > GIVE_UP_NS {
                // The gap until the reconnection covers the stall, from the last row.
                return Outcome::Lost("the agent stalled (no whole frame for 10 s): hung up to reconnect".into());
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

    /// A fake agent on 127.0.0.1 playing `script` on each of the first `sessions` hosts
    /// that connect.
    fn fake_agent(sessions: usize, script: impl Fn(usize, std::net::TcpStream) + Send + 'static) -> Address {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = Address::Tcp(listener.local_addr().unwrap().to_string());
        std::thread::spawn(move || {
            for n in 0..sessions {
                let Ok((s, _)) = listener.accept() else { return };
                script(n, s);
            }
        });
        address
    }

    fn welcome(interval_ns: u64, series: usize) -> Vec<u8> {
        let mut out = Vec::new();
        let welcome = crate::wire::Welcome {
            version: VERSION,
            guest: GuestInfo { interval_ns, cpus: 1, ..Default::default() },
            series: (0..series).map(|i| GuestSeries::counter(format!("s{i}"), "events")).collect(),
        };
        Message::Welcome(Box::new(welcome)).encode(&mut out);
        out
    }

    fn gaps(events: &[LinkEvent]) -> Vec<(u64, u64, String)> {
        events
            .iter()
            .filter_map(|e| match e {
                LinkEvent::Gap { from_ns, to_ns, cause } => Some((*from_ns, *to_ns, cause.clone())),
                _ => None,
            })
            .collect()
    }

    /// A guest claiming 100 ms rows sends them (and ptp points) as fast as it can: the host
    /// takes twice its claim at most, a ptp point every half second, and records the excess as
    /// a gap.
    #[test]
    fn a_flooding_guest_is_held_to_its_rate_and_the_excess_is_a_gap() {
        let address = fake_agent(1, |_, mut s| {
            s.write_all(&welcome(100_000_000, 1)).unwrap();
            let mut burst = Vec::new();
            for i in 0..1000 {
                Message::Row(Row { start_ns: i, end_ns: i + 1, values: vec![1.0] }).encode(&mut burst);
                Message::Ptp(PtpPair { guest_ns: i, host_realtime_ns: 1, uncertainty_ns: 0 }).encode(&mut burst);
            }
            let until = std::time::Instant::now() + Duration::from_secs(3);
            while std::time::Instant::now() < until && s.write_all(&burst).is_ok() {}
        });
        let (summary, events) = link_for(&LinkConfig::new(address, None), Duration::from_millis(3500));
        // 3.5 s at 20 rows/s, plus the burst of 10.
        assert!(summary.rows <= 3 * 20 + 20 + 10, "{summary:?}");
        assert!(summary.dropped.rows > 10 * summary.rows, "{summary:?}");
        assert!(summary.clock_points <= 8 && summary.dropped.points > 1000, "{summary:?}");
        let flood: Vec<_> = gaps(&events).into_iter().filter(|g| g.2.contains("faster than its interval")).collect();
        assert_eq!(flood.len(), 1, "{events:?}");
        assert!(flood[0].2.contains(&format!("{} rows dropped", summary.dropped.rows)), "{flood:?} {summary:?}");
        // Refused points are not stored: they never fill the cap.
        assert!(!summary.dropped.capped && summary.bytes < 1 << 20, "{summary:?}");
    }

    /// Past the byte cap nothing more is taken, and the rest of the run is a gap saying why.
    #[test]
    fn a_guest_over_the_byte_cap_is_cut_off_with_a_gap() {
        let address = fake_agent(1, |_, mut s| {
            s.write_all(&welcome(10_000_000, 1000)).unwrap();
            for i in 0..200 {
                let mut out = Vec::new();
                Message::Row(Row { start_ns: i, end_ns: i + 1, values: vec![1.0; 1000] }).encode(&mut out);
                if s.write_all(&out).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        let mut config = LinkConfig::new(address, None);
        config.limits.max_bytes = 64 << 10;
        let (summary, events) = link_for(&config, Duration::from_millis(2500));
        assert!(summary.dropped.capped, "{summary:?}");
        // The schema of 1000 series takes about 23 KiB, then 8 016 bytes a row: 5 rows fit.
        assert!((4..=5).contains(&summary.rows) && summary.bytes <= 64 << 10, "{summary:?}");
        assert!(summary.dropped.rows > 100, "{summary:?}");
        assert!(gaps(&events).iter().any(|g| g.2.contains("cap of 0.1 MiB")), "{events:?}");
    }

    /// A guest that goes silent (trickling a byte at a time inside a frame) and comes back:
    /// the gap runs from its last row to its first row again, not a zero-length gap at the
    /// reconnection.
    #[test]
    fn a_trickling_guest_leaves_a_gap_with_its_true_span() {
        let address = fake_agent(2, |n, mut s| {
            s.write_all(&welcome(100_000_000, 1)).unwrap();
            let row = |i| {
                let mut out = Vec::new();
                Message::Row(Row { start_ns: i, end_ns: i + 1, values: vec![1.0] }).encode(&mut out);
                out
            };
            for i in 0..5 {
                s.write_all(&row(i)).unwrap();
                std::thread::sleep(Duration::from_millis(100));
            }
            if n == 0 {
                // Half a frame, a byte every 300 ms: never whole.
                let r = row(9);
                for b in &r[..r.len() - 1] {
                    if s.write_all(&[*b]).is_err() {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(300));
                }
            } else {
                std::thread::sleep(Duration::from_secs(20));
            }
        });
        let mut config = LinkConfig::new(address, None);
        config.ping_every = Duration::from_secs(3600);
        let (summary, events) = link_for(&config, Duration::from_millis(14_000));
        let gaps = gaps(&events);
        assert!(summary.sessions == 2, "{summary:?} {events:?}");
        // The stall from the last row (about 0.5 s in) to the second welcome (about 10.5 s).
        let long: Vec<_> = gaps.iter().filter(|g| g.1 - g.0 > 9_000_000_000).collect();
        assert_eq!(long.len(), 1, "{gaps:?}");
        assert!(gaps.iter().all(|g| g.1 > g.0), "no zero-length gaps: {gaps:?}");
    }

    /// A guest that answers pings with a later send time than the host's (to make the round
    /// trip look short) changes nothing: the host's own send time is used.
    #[test]
    fn the_clock_bound_comes_from_host_times_only() {
        let address = fake_agent(1, |_, s| {
            let mut s = s;
            s.write_all(&welcome(100_000_000, 1)).unwrap();
            s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
            let mut reader = FrameReader::default();
            let mut buf = [0u8; 4096];
            let until = std::time::Instant::now() + Duration::from_secs(3);
            while std::time::Instant::now() < until {
                let Ok(n) = std::io::Read::read(&mut s, &mut buf) else { continue };
                if n == 0 {
                    return;
                }
                reader.feed(&buf[..n]);
                while let Some(m) = reader.next_message() {
                    if let Ok(Message::Ping { seq, t1 }) = m {
                        // Hold the pong 5 ms, then claim the ping left 5 ms later than it did.
                        std::thread::sleep(Duration::from_millis(5));
                        let t = monotonic_ns();
                        let mut out = Vec::new();
                        Message::Pong(crate::wire::Pong { seq, t1: t1 + 5_000_000, t2: t, t3: t }).encode(&mut out);
                        let _ = s.write_all(&out);
                    }
                }
            }
        });
        let (summary, events) = link_for(&LinkConfig::new(address, None), Duration::from_millis(2500));
        assert!(summary.clock_points >= 1, "{summary:?}");
        for e in &events {
            if let LinkEvent::Clock(p) = e {
                // Host and fake guest share one clock: the true offset is 0, and the round trip
                // is at least the 5 ms held, so the bound is at least 2.5 ms.
                assert!(p.bound_ns >= 2_500_000 && p.offset_ns.unsigned_abs() <= p.bound_ns, "{p:?}");
            }
        }
    }

    /// Silent sockets and peers sending garbage, with no token, do not keep the real host
    /// out: it is served within a few seconds.
    #[test]
    fn silent_and_unauthenticated_peers_cannot_keep_the_host_out() {
        let (address, agent_stop, agent) = start_agent("the-token");
        let Address::Tcp(at) = &address else { unreachable!() };
        let mut peers = Vec::new();
        for i in 0..60 {
            let mut s = std::net::TcpStream::connect(at.as_str()).unwrap();
            if i % 3 == 0 {
                let _ = s.write_all(&[b'V', b'A', 1, 0, 0, 0, 0, 0].repeat(100));
            }
            if i % 3 == 1 {
                let mut hello = Vec::new();
                Message::Hello(Hello { version: VERSION, token: Some("wrong".into()) }).encode(&mut hello);
                let _ = s.write_all(&hello);
            }
            peers.push(s);
        }
        let (summary, _) = link_for(&LinkConfig::new(address, Some("the-token".into())), Duration::from_millis(3000));
        agent_stop.store(true, Ordering::Relaxed);
        agent.join().unwrap().unwrap();
        assert_eq!(summary.sessions, 1, "{summary:?}");
        assert!(summary.rows >= 10, "{summary:?}");
        drop(peers);
    }
}
