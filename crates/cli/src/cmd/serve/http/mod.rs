//! `serve`'s HTTP side: who may connect, and the answer to each request. Read-only: GET or
//! HEAD of `/metrics` (and `/`, a pointer to it); anything else gets a 4xx, never a crash.
//!
//! No client can hold `serve` up: connections are read and written on their own threads, each
//! with deadlines (idle, head, write) and an 8 KiB head, at most [`Limits::connections`] at
//! once (the oldest idle one is closed to admit a new one). The main thread only scrapes:
//! a connection asks it through a queue and gets the text back, so a client that never reads
//! stalls nothing but itself, and a stop is seen within 100 ms whatever the clients do.
//!
//! No client can make `serve` work harder either: a scrape is answered from the latest one
//! ([`Latest`]) when that is no older than `--max-age` before the request came (requests that
//! wait together share one scrape), each connection is answered at most
//! [`Limits::client_rate`] times a second (faster requests wait), and each address opens at
//! most that many connections a second (twice as many at once; more are told 429).

mod connection;
mod request;
mod tls;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use virtprof_agent::limits::Rate;

use connection::Slots;

use crate::args::ServeArgs;
use crate::exit::usage;
use crate::watch::metrics::Format;

/// Where and how `serve` listens.
pub struct Config {
    pub listen: SocketAddr,
    /// The bearer token clients must send.
    pub token: Option<String>,
    /// The TLS configuration, checked when loaded.
    pub tls: Option<Arc<rustls::ServerConfig>>,
}

impl Config {
    /// Check the options: an address other hosts can reach needs a token; TLS material must
    /// be a certificate and its own key.
    pub fn from_args(args: &ServeArgs) -> anyhow::Result<Config> {
        let listen = args.listen.to_socket_addrs().ok().and_then(|mut a| a.next()).ok_or_else(|| {
            usage(format!("--listen '{}': not an address (HOST:PORT, e.g. 127.0.0.1:9477)", args.listen))
        })?;
        let token = args.token_file.as_deref().map(virtprof_engine::token::read_token).transpose()?;
        if !listen.ip().is_loopback() && token.is_none() {
            return Err(usage(format!(
                "--listen {listen}: other hosts can reach this address; give --token-file FILE \
                 (and --tls-cert/--tls-key), or listen on 127.0.0.1"
            )));
        }
        let tls = match (&args.tls_cert, &args.tls_key) {
            (Some(cert), Some(key)) => Some(tls::load(cert, key)?),
            _ => None,
        };
        if tls.is_none() && token.is_some() && !listen.ip().is_loopback() {
            eprintln!("virtprof: the bearer token travels in clear over plain HTTP; add --tls-cert/--tls-key");
        }
        Ok(Config { listen, token, tls })
    }
}

/// How much any one client, and all of them, may take.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections open at once; each is one fd and one thread.
    pub connections: usize,
    /// A connection with no request for this long is closed.
    pub idle: Duration,
    /// A request head must arrive whole within this long of its first byte.
    pub head: Duration,
    /// An answer must be taken by the client within this long.
    pub write: Duration,
    /// The longest a connection waits for the main thread's scrape.
    pub scrape: Duration,
    /// A scrape answers requests that came at most this long after it started.
    pub max_age: Duration,
    /// Answers per second to one connection, and new connections per second from one
    /// address (0: no limit).
    pub client_rate: u32,
}

impl Limits {
    /// The defaults, with at most a quarter of the fds this process may open given to
    /// connections (the rest stay for the trace, /proc and the VMs' stats fds).
    fn for_this_process(max_age: Duration, client_rate: u32) -> Limits {
        let fds = virtprof_host::procfiles::open_file_limit();
        Limits {
            connections: usize::try_from(fds / 4).unwrap_or(usize::MAX).clamp(4, 256),
            idle: Duration::from_secs(30),
            head: Duration::from_secs(10),
            write: Duration::from_secs(10),
            scrape: Duration::from_secs(30),
            max_age,
            client_rate,
        }
    }
}

/// A scrape a connection waits for: the main thread answers it.
pub struct ScrapeJob {
    pub format: Format,
    /// When the request came: a scrape started after this, less the max age, answers it.
    pub asked: Instant,
    reply: SyncSender<Result<Arc<str>, String>>,
}

impl ScrapeJob {
    /// Hand the text (or why there is none) back; a connection that gave up is no matter.
    pub fn answer(self, result: Result<Arc<str>, String>) {
        let _ = self.reply.try_send(result);
    }
}

/// The latest scrape, in the formats it was rendered in so far: what connections answer
/// from without asking the main thread, while it is recent enough for them.
pub struct Latest {
    max_age: Duration,
    published: Mutex<Option<Published>>,
}

struct Published {
    started: Instant,
    prometheus: Option<Arc<str>>,
    openmetrics: Option<Arc<str>>,
}

impl Latest {
    fn new(max_age: Duration) -> Latest {
        Latest { max_age, published: Mutex::new(None) }
    }

    /// Whether a scrape started at `started` answers a request that came at `asked`.
    pub fn answers(&self, started: Instant, asked: Instant) -> bool {
        started + self.max_age >= asked
    }

    /// The latest scrape's text in `format`, if it answers a request that came at `asked`.
    pub fn text(&self, format: Format, asked: Instant) -> Option<Arc<str>> {
        let published = self.published.lock().unwrap_or_else(PoisonError::into_inner);
        let p = published.as_ref().filter(|p| self.answers(p.started, asked))?;
        match format {
            Format::Prometheus => p.prometheus.clone(),
            Format::OpenMetrics => p.openmetrics.clone(),
        }
    }

    /// The scrape started at `started`, rendered in `format` (a newer scrape replaces the
    /// texts of an older one).
    pub fn publish(&self, started: Instant, format: Format, text: Arc<str>) {
        let mut published = self.published.lock().unwrap_or_else(PoisonError::into_inner);
        let p = match published.as_mut() {
            Some(p) if p.started == started => p,
            _ => published.insert(Published { started, prometheus: None, openmetrics: None }),
        };
        match format {
            Format::Prometheus => p.prometheus = Some(text),
            Format::OpenMetrics => p.openmetrics = Some(text),
        }
    }
}

/// The main thread's side of [`Latest`]: the latest scrape itself (of any kind `T`), kept
/// to render it in a format not asked for yet.
pub struct Scrapes<T> {
    latest: Option<(Instant, Arc<T>)>,
}

impl<T> Scrapes<T> {
    pub fn new() -> Scrapes<T> {
        Scrapes { latest: None }
    }

    /// The text in `job`'s format of a scrape that answers it: the latest where it is recent
    /// enough (rendered in this format once, then shared), else a new one from `collect`;
    /// published for the connections to answer from.
    pub fn answer(
        &mut self,
        job: &ScrapeJob,
        published: &Latest,
        collect: impl FnOnce() -> anyhow::Result<T>,
        render: impl FnOnce(&Arc<T>, Format) -> String,
    ) -> anyhow::Result<Arc<str>> {
        if let Some(text) = published.text(job.format, job.asked) {
            return Ok(text);
        }
        let (started, scrape) = match &self.latest {
            Some((started, scrape)) if published.answers(*started, job.asked) => (*started, Arc::clone(scrape)),
            _ => {
                let started = Instant::now();
                let scrape = Arc::new(collect()?);
                self.latest = Some((started, Arc::clone(&scrape)));
                (started, scrape)
            }
        };
        let text: Arc<str> = render(&scrape, job.format).into();
        published.publish(started, job.format, Arc::clone(&text));
        Ok(text)
    }
}

/// A listening server: its acceptor thread, and the queue of scrapes for the main thread.
pub struct Server {
    pub address: SocketAddr,
    jobs: Receiver<ScrapeJob>,
    /// The latest scrape, shared with the connections.
    pub latest: Arc<Latest>,
    shutdown: Arc<AtomicBool>,
    acceptor: Option<JoinHandle<()>>,
}

impl Server {
    /// The next scrape asked for, waiting at most `timeout`.
    pub fn next_scrape(&self, timeout: Duration) -> Option<ScrapeJob> {
        self.jobs.recv_timeout(timeout).ok()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown.store(true, Ordering::Relaxed);
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
    }
}

/// What every connection shares.
struct Shared {
    token: Option<String>,
    tls: Option<Arc<rustls::ServerConfig>>,
    jobs: SyncSender<ScrapeJob>,
    limits: Limits,
    slots: Slots,
    latest: Arc<Latest>,
}

/// Listen as configured, and accept on a thread of its own.
pub fn bind(config: &Config, max_age: Duration, client_rate: u32) -> anyhow::Result<Server> {
    bind_with(config, Limits::for_this_process(max_age, client_rate))
}

fn bind_with(config: &Config, limits: Limits) -> anyhow::Result<Server> {
    let listener =
        TcpListener::bind(config.listen).map_err(|e| usage(format!("cannot listen on {}: {e}", config.listen)))?;
    listener.set_nonblocking(true)?;
    let address = listener.local_addr()?;
    let (jobs_tx, jobs) = sync_channel(limits.connections);
    let latest = Arc::new(Latest::new(limits.max_age));
    let shared = Arc::new(Shared {
        token: config.token.clone(),
        tls: config.tls.clone(),
        jobs: jobs_tx,
        limits,
        slots: Slots::new(limits.connections),
        latest: Arc::clone(&latest),
    });
    let shutdown = Arc::new(AtomicBool::new(false));
    let acceptor = {
        let shutdown = Arc::clone(&shutdown);
        std::thread::Builder::new().name("virtprof-http".into()).spawn(move || accept(&listener, &shared, &shutdown))?
    };
    Ok(Server { address, jobs, latest, shutdown, acceptor: Some(acceptor) })
}

/// How many connections each address has opened lately: a token bucket per address.
struct Arrivals {
    per_second: u32,
    rates: HashMap<IpAddr, Rate>,
}

/// Addresses remembered at most; past this, those whose bucket has refilled are forgotten.
const MAX_ADDRESSES: usize = 4096;

impl Arrivals {
    /// Whether `peer` may open another connection now.
    fn admit(&mut self, peer: IpAddr) -> bool {
        if self.per_second == 0 {
            return true;
        }
        let now = virtprof_host::monotonic_ns();
        let rate = f64::from(self.per_second);
        if self.rates.len() >= MAX_ADDRESSES {
            // A bucket that has refilled is as good as a new one.
            self.rates.retain(|_, r| !r.is_full(now));
            // Still as many busy addresses (a flood from many): new ones wait for room.
            if self.rates.len() >= MAX_ADDRESSES && !self.rates.contains_key(&peer) {
                return false;
            }
        }
        self.rates.entry(peer).or_insert_with(|| Rate::new(rate, 2.0 * rate, now)).take(now)
    }
}

/// Accept until shut down, a thread per admitted connection.
fn accept(listener: &TcpListener, shared: &Arc<Shared>, shutdown: &AtomicBool) {
    let mut said = String::new();
    let mut arrivals = Arrivals { per_second: shared.limits.client_rate, rates: HashMap::new() };
    let mut refused = Refused::default();
    // Refusing costs an accept, a write and a close: past this many a second, connections
    // wait in the kernel's backlog (and a flooding client in its own retries) until the
    // budget refills, so a flood of connections costs serve a bounded share of a core.
    // Clients on kept-alive connections (Prometheus) are not concerned.
    let mut refusals = Rate::new(REFUSALS_PER_SECOND, REFUSALS_PER_SECOND, virtprof_host::monotonic_ns());
    while !shutdown.load(Ordering::Relaxed) {
        refused.close_done();
        if !readable(listener, Duration::from_millis(50)) {
            continue;
        }
        match listener.accept() {
            Ok((stream, peer)) => {
                said.clear();
                if arrivals.admit(peer.ip()) {
                    connection::start(stream, shared);
                } else {
                    refused.add(stream, shared.tls.is_some());
                    while !refusals.take(virtprof_host::monotonic_ns()) && !shutdown.load(Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => {
                // Out of fds (or memory): the connection waits in the backlog; closing idle
                // ones as new ones come frees fds again. Said once per cause, not per try.
                let now = format!("virtprof: serve: accepting a connection: {e} (retrying)");
                if now != said {
                    eprintln!("{now}");
                    said = now;
                }
                shared.slots.close_oldest_idle();
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// Connections over their address's rate, on the acceptor's thread (no thread is spent on
/// them): each told so in one write that cannot block (plain HTTP; over TLS, nothing), its
/// sending side closed, and closed for good once its request is read or after a second (a
/// socket closed with its request unread would reset the connection, and the client would
/// see that instead of the answer). Past [`MAX_REFUSED`] at once, closed at once.
#[derive(Default)]
struct Refused {
    closing: Vec<(TcpStream, Instant)>,
}

const MAX_REFUSED: usize = 256;
/// Connections refused a second, at most (see [`accept`]).
const REFUSALS_PER_SECOND: f64 = 200.0;

impl Refused {
    fn add(&mut self, stream: TcpStream, tls: bool) {
        if tls || stream.set_nonblocking(true).is_err() {
            return;
        }
        let body = "too many connections from this address; try again in a second\n";
        let answer = format!(
            "HTTP/1.1 429 Too Many Requests\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        let _ = (&stream).write_all(answer.as_bytes());
        let _ = stream.shutdown(std::net::Shutdown::Write);
        if self.closing.len() < MAX_REFUSED {
            self.closing.push((stream, Instant::now() + Duration::from_secs(1)));
        }
    }

    /// Close those whose client has closed (or sent all it will) or whose second is up.
    fn close_done(&mut self) {
        let mut scratch = [0u8; 1024];
        self.closing.retain(|(stream, until)| loop {
            match (&*stream).read(&mut scratch) {
                Ok(0) => return false,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Instant::now() < *until,
                Err(_) => return false,
            }
        });
    }
}

fn readable(listener: &TcpListener, timeout: Duration) -> bool {
    let mut p = libc::pollfd { fd: listener.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
    // SAFETY: one valid pollfd, for the length given.
    unsafe { libc::poll(&mut p, 1, ms) > 0 }
}

#[cfg(test)]
mod tests;
