//! One client connection on its own thread: read a head within its deadlines, answer it,
//! write the answer within its deadline, and again for the next (keep-alive, pipelining),
//! until the client closes, misbehaves or runs out of time. `Slots` bounds how many there are.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, RecvTimeoutError};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use virtprof_agent::serve::constant_time_eq;

use super::request::{parse, Head, Method, Parsed, HEAD_LIMIT};
use super::{ScrapeJob, Shared};
use crate::watch::metrics::Format;

/// The open connections: each one's socket (shared, so it can be shut from here without a
/// second fd), what it is doing and since when.
pub struct Slots {
    max: usize,
    next_id: AtomicU64,
    open: Mutex<Vec<Slot>>,
}

struct Slot {
    id: u64,
    stream: Arc<TcpStream>,
    since: Instant,
    /// Waiting for the main thread's scrape: not closed to admit another.
    scraping: bool,
}

impl Slots {
    pub fn new(max: usize) -> Slots {
        Slots { max, next_id: AtomicU64::new(0), open: Mutex::new(Vec::new()) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Slot>> {
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Admit a connection, closing the oldest one not waiting for a scrape if all slots are
    /// taken (an idle or slow client gives way to a new one). None: all are scraping.
    pub(super) fn admit(&self, stream: &Arc<TcpStream>) -> Option<u64> {
        let mut open = self.lock();
        if open.len() >= self.max && !close_oldest(&mut open) {
            return None;
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        open.push(Slot { id, stream: Arc::clone(stream), since: Instant::now(), scraping: false });
        Some(id)
    }

    /// Close the oldest connection not waiting for a scrape (out of fds).
    pub fn close_oldest_idle(&self) {
        close_oldest(&mut self.lock());
    }

    fn set(&self, id: u64, scraping: bool) {
        if let Some(slot) = self.lock().iter_mut().find(|s| s.id == id) {
            slot.since = Instant::now();
            slot.scraping = scraping;
        }
    }

    fn leave(&self, id: u64) {
        self.lock().retain(|s| s.id != id);
    }

    #[cfg(test)]
    pub fn count(&self) -> usize {
        self.lock().len()
    }
}

fn close_oldest(open: &mut Vec<Slot>) -> bool {
    let Some(at) = open.iter().enumerate().filter(|(_, s)| !s.scraping).min_by_key(|(_, s)| s.since).map(|(i, _)| i)
    else {
        return false;
    };
    // Its thread's next read or write fails at once and it ends.
    let _ = open.swap_remove(at).stream.shutdown(Shutdown::Both);
    true
}

/// Take a new connection: admitted, it gets a thread; refused (every slot scraping, or no
/// thread to be had), it is closed.
pub fn start(stream: TcpStream, shared: &Arc<Shared>) {
    // Blocking I/O with per-call timeouts set from each deadline.
    if stream.set_nonblocking(false).is_err() {
        return;
    }
    let stream = Arc::new(stream);
    let Some(id) = shared.slots.admit(&stream) else { return };
    let thread_shared = Arc::clone(shared);
    let thread_stream = Arc::clone(&stream);
    let spawned = std::thread::Builder::new().name("virtprof-http-conn".into()).spawn(move || {
        let _ = serve_connection(&thread_stream, id, &thread_shared);
        thread_shared.slots.leave(id);
    });
    if spawned.is_err() {
        shared.slots.leave(id);
    }
}

/// The socket, readable and writable through a shared handle (`&TcpStream` is both).
struct Socket(Arc<TcpStream>);

impl Read for Socket {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        (&*self.0).read(buf)
    }
}

impl Write for Socket {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        (&*self.0).write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Plain or TLS, read and written the same way.
enum Channel {
    Plain(Socket),
    Tls(Box<rustls::StreamOwned<rustls::ServerConnection, Socket>>),
}

impl Read for Channel {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Channel::Plain(s) => s.read(buf),
            Channel::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Channel {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Channel::Plain(s) => s.write(buf),
            Channel::Tls(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Channel::Plain(s) => s.flush(),
            Channel::Tls(s) => s.flush(),
        }
    }
}

/// Why a connection ends early.
type Closed = io::Error;

fn serve_connection(stream: &Arc<TcpStream>, id: u64, shared: &Shared) -> Result<(), Closed> {
    let _ = stream.set_nodelay(true);
    // Reads and writes made outside `write_within` (a TLS handshake writes while it reads)
    // are bounded too.
    stream.set_write_timeout(Some(shared.limits.write))?;
    let mut channel = match &shared.tls {
        Some(config) => {
            let tls = rustls::ServerConnection::new(Arc::clone(config)).map_err(io::Error::other)?;
            Channel::Tls(Box::new(rustls::StreamOwned::new(tls, Socket(Arc::clone(stream)))))
        }
        None => Channel::Plain(Socket(Arc::clone(stream))),
    };
    let limits = shared.limits;
    let mut buf: Vec<u8> = Vec::with_capacity(1024);
    let mut chunk = [0u8; 2048];
    // When this connection may be answered next: at most `client_rate` times a second.
    let mut next_answer = Instant::now();
    let spacing = match limits.client_rate {
        0 => Duration::ZERO,
        rate => Duration::from_secs(1) / rate,
    };
    loop {
        // Read until a whole head is buffered: the idle deadline runs until its first byte,
        // the head deadline from then on.
        let mut deadline = Instant::now() + limits.idle;
        let mut started = !buf.is_empty();
        if started {
            deadline = Instant::now() + limits.head;
        }
        let (head, len) = loop {
            match parse(&buf) {
                Parsed::Complete { head, len } => break (head, len),
                Parsed::Invalid(status, why) => {
                    let answer = Answer::text(status, &format!("{why}\n")).closing();
                    return write_within(&mut channel, stream, &answer.bytes(), limits.write);
                }
                Parsed::Partial => {}
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                if started {
                    let answer = Answer::text(408, "the request head took too long\n").closing();
                    let _ = write_within(&mut channel, stream, &answer.bytes(), limits.write);
                }
                return Ok(());
            }
            stream.set_read_timeout(Some(left))?;
            let room = (HEAD_LIMIT - buf.len().min(HEAD_LIMIT)).clamp(1, chunk.len());
            match channel.read(&mut chunk[..room]) {
                Ok(0) => return Ok(()),
                Ok(n) => {
                    buf.extend_from_slice(&chunk[..n]);
                    if !started {
                        started = true;
                        deadline = Instant::now() + limits.head;
                    }
                }
                Err(e) if matches!(e.kind(), io::ErrorKind::Interrupted) => {}
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {}
                Err(e) => return Err(e),
            }
        };
        buf.drain(..len);
        // A client asking faster than its rate waits (asleep, costing nothing) rather than
        // being refused: a scraper in a loop gets the same answers, slower.
        let wait = next_answer.saturating_duration_since(Instant::now());
        if !wait.is_zero() {
            std::thread::sleep(wait);
        }
        next_answer = Instant::now() + spacing;
        let asked = Instant::now();
        let answer = respond(&head, id, shared, asked);
        let close = head.close || answer.close;
        write_within(&mut channel, stream, &answer.head(), limits.write)?;
        if head.method != Method::Head {
            write_within(&mut channel, stream, answer.body.as_bytes(), limits.write)?;
        }
        if close {
            return Ok(());
        }
        shared.slots.set(id, false);
    }
}

/// Write all of `bytes` within `limit`, or fail (a client that does not read).
fn write_within(channel: &mut Channel, stream: &TcpStream, bytes: &[u8], limit: Duration) -> Result<(), Closed> {
    let deadline = Instant::now() + limit;
    let mut rest = bytes;
    while !rest.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "the client does not read its answer"));
        }
        stream.set_write_timeout(Some(left))?;
        match channel.write(rest) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => rest = &rest[n..],
            Err(e) if matches!(e.kind(), io::ErrorKind::Interrupted) => {}
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {}
            Err(e) => return Err(e),
        }
    }
    // TLS holds the last records until flushed.
    stream.set_write_timeout(Some(deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1))))?;
    channel.flush()
}

/// The answer to one request, which came at `asked`.
fn respond(head: &Head, id: u64, shared: &Shared, asked: Instant) -> Answer {
    if head.method == Method::Other {
        return Answer::text(405, "virtprof serve is read-only: GET /metrics\n").header("Allow", "GET, HEAD").closing();
    }
    if head.has_body {
        return Answer::text(413, "virtprof serve takes no request body\n").closing();
    }
    if let Some(token) = &shared.token {
        if !head.bearer.as_deref().is_some_and(|s| constant_time_eq(s.as_bytes(), token.as_bytes())) {
            return Answer::text(401, "a bearer token is required (Authorization: Bearer TOKEN)\n")
                .header("WWW-Authenticate", "Bearer realm=\"virtprof\"");
        }
    }
    match head.path.as_str() {
        "/metrics" => scrape(Format::from_accept(head.accept.as_deref()), id, shared, asked),
        "/" => Answer::text(200, "virtprof serve: metrics at /metrics\n"),
        _ => Answer::text(404, "not found: virtprof serves /metrics\n"),
    }
}

/// The latest scrape if it is recent enough, else ask the main thread for one and wait for
/// it, within the limit.
fn scrape(format: Format, id: u64, shared: &Shared, asked: Instant) -> Answer {
    let metrics = |body: Arc<str>| Answer {
        status: 200,
        content_type: format.content_type(),
        extra: Vec::new(),
        body,
        close: false,
    };
    if let Some(text) = shared.latest.text(format, asked) {
        return metrics(text);
    }
    let (reply, answer) = sync_channel(1);
    shared.slots.set(id, true);
    if shared.jobs.try_send(ScrapeJob { format, asked, reply }).is_err() {
        shared.slots.set(id, false);
        return Answer::text(503, "too many scrapes waiting; try again\n").header("Retry-After", "1");
    }
    let reply = answer.recv_timeout(shared.limits.scrape);
    shared.slots.set(id, false);
    match reply {
        Ok(Ok(body)) => metrics(body),
        Ok(Err(why)) => Answer::text(500, &format!("scrape failed: {why}\n")),
        Err(RecvTimeoutError::Timeout) => Answer::text(503, "the scrape took too long\n"),
        Err(RecvTimeoutError::Disconnected) => Answer::text(503, "virtprof serve is stopping\n").closing(),
    }
}

/// A status, headers and body (shared with every other answer from the same scrape).
struct Answer {
    status: u16,
    content_type: &'static str,
    extra: Vec<(&'static str, &'static str)>,
    body: Arc<str>,
    close: bool,
}

impl Answer {
    fn text(status: u16, body: &str) -> Answer {
        Answer { status, content_type: "text/plain; charset=utf-8", extra: Vec::new(), body: body.into(), close: false }
    }

    fn header(mut self, name: &'static str, value: &'static str) -> Answer {
        self.extra.push((name, value));
        self
    }

    fn closing(mut self) -> Answer {
        self.close = true;
        self
    }

    /// The status line and headers on the wire (the body follows, except for HEAD).
    fn head(&self) -> Vec<u8> {
        let reason = match self.status {
            200 => "OK",
            400 => "Bad Request",
            401 => "Unauthorized",
            404 => "Not Found",
            405 => "Method Not Allowed",
            429 => "Too Many Requests",
            408 => "Request Timeout",
            413 => "Content Too Large",
            431 => "Request Header Fields Too Large",
            500 => "Internal Server Error",
            _ => "Service Unavailable",
        };
        let mut out = format!(
            "HTTP/1.1 {} {reason}\r\nContent-Type: {}\r\nContent-Length: {}\r\n",
            self.status,
            self.content_type,
            self.body.len()
        );
        for (name, value) in &self.extra {
            out.push_str(&format!("{name}: {value}\r\n"));
        }
        if self.close {
            out.push_str("Connection: close\r\n");
        }
        out.push_str("\r\n");
        out.into_bytes()
    }

    /// The whole answer on the wire, for one that ends the connection.
    fn bytes(&self) -> Vec<u8> {
        let mut out = self.head();
        out.extend_from_slice(self.body.as_bytes());
        out
    }
}
