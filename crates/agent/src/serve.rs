//! The agent's loop in the guest: wait for a host, say what the guest is, then send one row
//! per interval and answer clock pings at once, until the host goes (it hangs up, stops
//! reading, or falls silent); then wait for the next one. Hosts come and go; the agent stays.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use virtprof_host::monotonic_ns;
use virtprof_model::guest::GuestInfo;

use crate::collect::{guest_facts, ptp_kvm, CollectConfig, Collector};
use crate::limits::PTP_EVERY_NS;
use crate::noise::{NoiseConfig, NoiseLoops};
use crate::ptp::PtpKvm;
use crate::transport::{Address, Stream};
use crate::wire::{FrameReader, Hello, Message, Pong, Welcome, VERSION};

/// A host that sends nothing (no ping) for this long is gone.
pub const HOST_SILENCE: Duration = Duration::from_secs(5);
/// A host that reads nothing for this long is stalled: the agent hangs up.
pub const HOST_STALL: Duration = Duration::from_secs(2);
/// How long a connection has to say hello: a silent one is closed then.
const HELLO_WITHIN: Duration = Duration::from_secs(2);
/// Connections waiting to say hello at once; a new one closes the oldest beyond this, so
/// silent or unauthenticated peers cannot keep the real host out.
const MAX_PENDING: usize = 16;
/// How often counter folders are looked at for new files.
const RESCAN_EVERY_NS: u64 = 1_000_000_000;

/// How the agent runs.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Where to wait for hosts.
    pub address: Address,
    /// The token a host must present (required on TCP).
    pub token: Option<String>,
    /// Row width.
    pub interval_ns: u64,
    /// What to sample.
    pub collect: CollectConfig,
    /// Serve this many hosts, then exit (None: until stopped).
    pub sessions: Option<u32>,
    /// Run the noise loop on these CPUs and send its periods (None: no loop).
    pub noise: Option<NoiseConfig>,
}

/// How one host's session ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionEnd {
    /// Rows sent.
    pub rows: u64,
    /// Pings answered.
    pub pongs: u64,
    /// Why it ended.
    pub cause: String,
}

/// Serve hosts until `stop` is set (or the sessions asked for are done), telling `log` about
/// each one.
pub fn serve(config: &ServeConfig, stop: &AtomicBool, log: &mut dyn FnMut(&str)) -> std::io::Result<()> {
    let listener = config.address.listen()?;
    let mut collector = Collector::open(config.collect.clone());
    let noise = config.noise.as_ref().map(NoiseLoops::start).transpose()?;
    if noise.is_some() {
        collector.unavailable.push((
            "noise: exit counts".into(),
            "a Linux guest cannot see its VM exits; the host's trace explains its samples (noise --host-recording)"
                .into(),
        ));
    }
    let ptp = ptp_kvm().and_then(|path| match PtpKvm::open(&path) {
        Ok(clock) => Some(clock),
        Err(e) => {
            collector.unavailable.push((format!("ptp_kvm clock {path}"), e.to_string()));
            None
        }
    });
    for (what, why) in &collector.unavailable {
        log(&format!("not sampled: {what}: {why}"));
    }
    log(&format!("listening on {} ({} series)", config.address, collector.series().len()));
    let mut served = 0;
    let mut last_error = String::new();
    let mut pending: Vec<Pending> = Vec::new();
    let serial = matches!(listener, crate::transport::Listener::Port(_));
    while !stop.load(Ordering::Relaxed) && config.sessions.is_none_or(|n| served < n) {
        // Periods measured while no host is there have no one to go to.
        noise.iter().for_each(NoiseLoops::restart);
        // A serial port "accepts" by opening the device: only while nobody is on it.
        if !serial || pending.is_empty() {
            let wait = Duration::from_millis(if pending.is_empty() { 200 } else { 20 });
            match listener.accept(wait) {
                Ok(Some(stream)) => {
                    last_error.clear();
                    if pending.len() >= MAX_PENDING {
                        pending.remove(0);
                    }
                    pending.push(Pending { stream, reader: FrameReader::default(), opened: monotonic_ns() });
                }
                Ok(None) => {}
                Err(e) => {
                    // Said once, not every retry (a port that has not appeared yet).
                    let error = format!("accepting: {e} (retrying)");
                    if error != last_error {
                        log(&error);
                        last_error = error;
                    }
                    std::thread::sleep(Duration::from_millis(200));
                    continue;
                }
            }
        } else {
            std::thread::sleep(Duration::from_millis(20));
        }
        let Some((stream, reader)) = hello_from(&mut pending, config, log) else {
            if serial && pending.is_empty() {
                // A serial port with no host on it reads end-of-file at once: wait, quietly.
                std::thread::sleep(Duration::from_millis(200));
            }
            continue;
        };
        // The one host served: the others waiting are closed (they may come back).
        pending.clear();
        let sources = Sources { noise: noise.as_ref(), ptp: ptp.as_ref() };
        let end = session(stream, reader, config, &mut collector, sources, stop);
        served += 1;
        log(&format!("host gone after {} rows and {} pings: {}", end.rows, end.pongs, end.cause));
    }
    match noise.map(NoiseLoops::stop) {
        Some(Err(e)) => Err(std::io::Error::new(e.kind(), format!("the noise loop: {e}"))),
        _ => Ok(()),
    }
}

/// A connection that has not said hello yet.
struct Pending {
    stream: Stream,
    reader: FrameReader,
    opened: u64,
}

/// Read what the waiting connections sent: the first with a good hello is the host (with
/// what it sent after the hello); a bad hello is refused, a silent or closed connection
/// dropped at its deadline.
fn hello_from(
    pending: &mut Vec<Pending>,
    config: &ServeConfig,
    log: &mut dyn FnMut(&str),
) -> Option<(Stream, FrameReader)> {
    let hello_within = u64::try_from(HELLO_WITHIN.as_nanos()).unwrap_or(u64::MAX);
    let mut buf = [0u8; 4096];
    let mut at = 0;
    while at < pending.len() {
        let p = &mut pending[at];
        let mut keep = monotonic_ns() - p.opened <= hello_within;
        let mut hello = None;
        // At most a few reads per turn: one peer cannot hold the others up.
        for _ in 0..4 {
            match p.stream.read_some(&mut buf) {
                Ok(Some(0)) | Err(_) => keep = false,
                Ok(Some(n)) => p.reader.feed(&buf[..n]),
                Ok(None) => {}
            }
            while let Some(m) = p.reader.next_message() {
                if let Ok(Message::Hello(h)) = m {
                    hello = Some(h);
                    break;
                }
            }
            // A peer that sends kilobytes of anything but a hello is not a host.
            if hello.is_some() || !keep || p.reader.buffered() > 64 << 10 {
                keep &= p.reader.buffered() <= 64 << 10;
                break;
            }
        }
        match hello {
            Some(h) => {
                let mut p = pending.swap_remove(at);
                match check_hello(&h, config) {
                    Ok(()) => return Some((p.stream, p.reader)),
                    Err(why) => {
                        let mut out = Vec::new();
                        Message::Refused(why.clone()).encode(&mut out);
                        let _ = p.stream.write_all_within(&out, Duration::from_millis(200));
                        log(&format!("refused: {why}"));
                    }
                }
            }
            None if keep => at += 1,
            None => drop(pending.swap_remove(at)),
        }
    }
    None
}

fn guest_info(config: &ServeConfig, collector: &Collector) -> GuestInfo {
    let (hostname, kernel, clocksource) = guest_facts();
    GuestInfo {
        hostname,
        kernel,
        cpus: u32::try_from(collector.series().iter().filter(|s| s.name.ends_with(".steal_ns")).count()).unwrap_or(0),
        interval_ns: config.interval_ns,
        agent_version: env!("CARGO_PKG_VERSION").into(),
        clocksource,
        ptp_kvm: ptp_kvm(),
        unavailable: collector.unavailable.clone(),
        marker_port: collector.marker_port(),
    }
}

/// What a session sends besides the collector's rows.
#[derive(Clone, Copy)]
struct Sources<'a> {
    noise: Option<&'a NoiseLoops>,
    ptp: Option<&'a PtpKvm>,
}

/// One host, from its (checked) hello to its going; `reader` holds what it sent after the hello.
fn session(
    mut stream: Stream,
    mut reader: FrameReader,
    config: &ServeConfig,
    collector: &mut Collector,
    Sources { noise, ptp }: Sources,
    stop: &AtomicBool,
) -> SessionEnd {
    let mut end = SessionEnd { rows: 0, pongs: 0, cause: String::new() };
    let mut buf = vec![0u8; 64 << 10];
    let mut out = Vec::new();
    let mut row = Vec::new();
    // A new baseline: the first row covers from here, and noise periods from before the host
    // came are not its.
    collector.sample(&mut row);
    noise.iter().for_each(|n| n.restart());
    let mut last_row = monotonic_ns();
    let mut next_row = (last_row / config.interval_ns + 1) * config.interval_ns;
    let welcome =
        Welcome { version: VERSION, guest: guest_info(config, collector), series: collector.series().to_vec() };
    Message::Welcome(Box::new(welcome)).encode(&mut out);
    if let Err(e) = stream.write_all_within(&out, HOST_STALL) {
        end.cause = format!("writing: {e}");
        return end;
    }
    let mut last_heard = monotonic_ns();
    let mut next_rescan = last_heard + RESCAN_EVERY_NS;
    let mut next_ptp = 0;
    let silence = u64::try_from(HOST_SILENCE.as_nanos()).unwrap_or(u64::MAX);
    // Pings that came with the hello are answered first.
    if let Err(cause) = answer_pings(&mut reader, last_heard, &mut stream, &mut end) {
        end.cause = cause;
        return end;
    }
    loop {
        if stop.load(Ordering::Relaxed) {
            end.cause = "the agent was stopped".into();
            return end;
        }
        let now = monotonic_ns();
        // Wakes for the next row, a host frame, or every 100 ms to look at the stop flag.
        let wait = next_row.saturating_sub(now).min(100_000_000);
        match stream.readable(Duration::from_nanos(wait)) {
            Ok(true) => match stream.read_some(&mut buf) {
                Ok(Some(0)) => {
                    end.cause = "it hung up".into();
                    return end;
                }
                Ok(Some(n)) => {
                    last_heard = monotonic_ns();
                    reader.feed(&buf[..n]);
                    if let Err(cause) = answer_pings(&mut reader, last_heard, &mut stream, &mut end) {
                        end.cause = cause;
                        return end;
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    end.cause = format!("reading: {e}");
                    return end;
                }
            },
            Ok(false) => {}
            Err(e) => {
                end.cause = format!("waiting: {e}");
                return end;
            }
        }
        let now = monotonic_ns();
        if now - last_heard > silence {
            end.cause = format!("silent for {} s", HOST_SILENCE.as_secs());
            return end;
        }
        if now >= next_row {
            out.clear();
            if now >= next_rescan {
                next_rescan = now + RESCAN_EVERY_NS;
                if collector.rescan_apps() {
                    Message::Schema(collector.series().to_vec()).encode(&mut out);
                }
            }
            collector.sample(&mut row);
            Message::encode_row(&mut out, last_row, now, &row);
            for batch in noise.map(NoiseLoops::take).unwrap_or_default() {
                Message::Noise(Box::new(batch)).encode(&mut out);
            }
            // A failed reading is skipped: the host keeps the points it has.
            if now >= next_ptp {
                if let Some(Ok(pair)) = ptp.map(PtpKvm::read) {
                    Message::Ptp(pair).encode(&mut out);
                    next_ptp = now + PTP_EVERY_NS;
                }
            }
            last_row = now;
            // Rows stay on the interval grid; a late wake-up makes one longer row.
            next_row = (now / config.interval_ns + 1) * config.interval_ns;
            if let Err(e) = stream.write_all_within(&out, HOST_STALL) {
                end.cause = format!("the host stopped reading ({e})");
                return end;
            }
            end.rows += 1;
        }
    }
}

/// Answer the pings buffered in `reader` (read at guest time `t2`); anything else from a
/// host is ignored, garbage skipped.
fn answer_pings(reader: &mut FrameReader, t2: u64, stream: &mut Stream, end: &mut SessionEnd) -> Result<(), String> {
    let mut out = Vec::new();
    while let Some(message) = reader.next_message() {
        if let Ok(Message::Ping { seq, t1 }) = message {
            Message::Pong(Pong { seq, t1, t2, t3: monotonic_ns() }).encode(&mut out);
            end.pongs += 1;
        }
    }
    // Pongs go out with their guest send time as late as possible.
    if out.is_empty() {
        return Ok(());
    }
    stream.write_all_within(&out, HOST_STALL).map_err(|e| format!("writing: {e}"))
}

/// Whether a hello may go on: same protocol, and the token when one is set.
fn check_hello(hello: &Hello, config: &ServeConfig) -> Result<(), String> {
    if hello.version != VERSION {
        return Err(format!("protocol version {} (this agent speaks {VERSION})", hello.version));
    }
    match (&config.token, &hello.token) {
        (Some(want), Some(got)) if constant_time_eq(want.as_bytes(), got.as_bytes()) => Ok(()),
        (Some(_), _) => Err("wrong or missing token".into()),
        (None, _) => Ok(()),
    }
}

/// Compare without returning early at the first difference (no timing oracle on the token).
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hellos_are_checked_for_version_and_token() {
        let config = ServeConfig {
            address: Address::Tcp("127.0.0.1:0".into()),
            token: Some("t0k".into()),
            interval_ns: 100_000_000,
            collect: CollectConfig::default(),
            sessions: None,
            noise: None,
        };
        let hello = |version, token: Option<&str>| Hello { version, token: token.map(String::from) };
        assert!(check_hello(&hello(VERSION, Some("t0k")), &config).is_ok());
        assert!(check_hello(&hello(VERSION, Some("t0K")), &config).unwrap_err().contains("token"));
        assert!(check_hello(&hello(VERSION, None), &config).is_err());
        assert!(check_hello(&hello(9, Some("t0k")), &config).unwrap_err().contains("version 9"));
        assert!(check_hello(&hello(VERSION, None), &ServeConfig { token: None, ..config }).is_ok());
    }
}
