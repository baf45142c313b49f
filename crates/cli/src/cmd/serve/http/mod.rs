//! `serve`'s HTTP side: who may connect, and the answer to each request. Read-only: GET or
//! HEAD of `/metrics` (and `/`, a pointer to it); anything else gets a 4xx, never a crash.
//!
//! No client can hold `serve` up: connections are read and written on their own threads, each
//! with deadlines (idle, head, write) and an 8 KiB head, at most [`Limits::connections`] at
//! once (the oldest idle one is closed to admit a new one). The main thread only scrapes:
//! a connection asks it through a queue and gets the text back, so a client that never reads
//! stalls nothing but itself, and a stop is seen within 100 ms whatever the clients do.

mod connection;
mod request;
mod tls;

use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

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
}

impl Limits {
    /// The defaults, with at most a quarter of the fds this process may open given to
    /// connections (the rest stay for the trace, /proc and the VMs' stats fds).
    fn for_this_process() -> Limits {
        let fds = virtprof_host::procfiles::open_file_limit();
        Limits {
            connections: usize::try_from(fds / 4).unwrap_or(usize::MAX).clamp(4, 256),
            idle: Duration::from_secs(30),
            head: Duration::from_secs(10),
            write: Duration::from_secs(10),
            scrape: Duration::from_secs(30),
        }
    }
}

/// A scrape a connection waits for: the main thread answers it.
pub struct ScrapeJob {
    pub format: Format,
    reply: SyncSender<Result<String, String>>,
}

impl ScrapeJob {
    /// Hand the text (or why there is none) back; a connection that gave up is no matter.
    pub fn answer(self, result: Result<String, String>) {
        let _ = self.reply.try_send(result);
    }
}

/// A listening server: its acceptor thread, and the queue of scrapes for the main thread.
pub struct Server {
    pub address: SocketAddr,
    jobs: Receiver<ScrapeJob>,
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
}

/// Listen as configured, and accept on a thread of its own.
pub fn bind(config: &Config) -> anyhow::Result<Server> {
    bind_with(config, Limits::for_this_process())
}

fn bind_with(config: &Config, limits: Limits) -> anyhow::Result<Server> {
    let listener =
        TcpListener::bind(config.listen).map_err(|e| usage(format!("cannot listen on {}: {e}", config.listen)))?;
    listener.set_nonblocking(true)?;
    let address = listener.local_addr()?;
    let (jobs_tx, jobs) = sync_channel(limits.connections);
    let shared = Arc::new(Shared {
        token: config.token.clone(),
        tls: config.tls.clone(),
        jobs: jobs_tx,
        limits,
        slots: Slots::new(limits.connections),
    });
    let shutdown = Arc::new(AtomicBool::new(false));
    let acceptor = {
        let shutdown = Arc::clone(&shutdown);
        std::thread::Builder::new().name("virtprof-http".into()).spawn(move || accept(&listener, &shared, &shutdown))?
    };
    Ok(Server { address, jobs, shutdown, acceptor: Some(acceptor) })
}

/// Accept until shut down, a thread per admitted connection.
fn accept(listener: &TcpListener, shared: &Arc<Shared>, shutdown: &AtomicBool) {
    let mut said = String::new();
    while !shutdown.load(Ordering::Relaxed) {
        if !readable(listener, Duration::from_millis(50)) {
            continue;
        }
        match listener.accept() {
            Ok((stream, _)) => {
                said.clear();
                connection::start(stream, shared);
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

fn readable(listener: &TcpListener, timeout: Duration) -> bool {
    let mut p = libc::pollfd { fd: listener.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
    // SAFETY: one valid pollfd, for the length given.
    unsafe { libc::poll(&mut p, 1, ms) > 0 }
}

#[cfg(test)]
mod tests;
