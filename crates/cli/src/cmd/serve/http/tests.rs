//! Hostile clients against the server, loopback only, each bounded in time: a client that
//! pipelines requests and never reads, a head without end, more idle sockets than slots, and
//! a trickle. The main thread is played by `answer_scrapes`: it answers every scrape with a
//! large body, as `serve` with many VMs does.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;

/// A server on 127.0.0.1 with small limits, its scrapes answered with `body` by a thread
/// that plays serve's main loop.
struct Running {
    address: SocketAddr,
    done: Arc<AtomicBool>,
    main: Option<std::thread::JoinHandle<()>>,
}

impl Running {
    /// Stop as serve does (its main loop ends, the server is dropped); how long that took.
    fn stop(mut self) -> Duration {
        let started = Instant::now();
        self.done.store(true, Ordering::Relaxed);
        self.main.take().unwrap().join().unwrap();
        started.elapsed()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Relaxed);
    }
}

fn server(token: Option<&str>, limits: Limits, body: usize) -> Running {
    let config = Config { listen: "127.0.0.1:0".parse().unwrap(), token: token.map(String::from), tls: None };
    let server = bind_with(&config, limits).unwrap();
    let address = server.address;
    let done = Arc::new(AtomicBool::new(false));
    let main = {
        let done = Arc::clone(&done);
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                if let Some(job) = server.next_scrape(Duration::from_millis(20)) {
                    job.answer(Ok("x".repeat(body)));
                }
            }
        })
    };
    Running { address, done, main: Some(main) }
}

fn limits() -> Limits {
    Limits {
        connections: 16,
        idle: Duration::from_secs(2),
        head: Duration::from_secs(1),
        write: Duration::from_secs(1),
        scrape: Duration::from_secs(5),
    }
}

/// One scrape on a new connection: its status, within `within`.
fn get(server: &Running, token: Option<&str>, within: Duration) -> u16 {
    let mut s = TcpStream::connect(server.address).unwrap();
    s.set_read_timeout(Some(within)).unwrap();
    let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    s.write_all(format!("GET /metrics HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n").as_bytes()).unwrap();
    let mut response = Vec::new();
    let _ = s.read_to_end(&mut response);
    String::from_utf8_lossy(&response).split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0)
}

#[test]
fn a_client_that_pipelines_and_never_reads_stalls_only_itself() {
    for token in [None, Some("s3cret-token")] {
        let server = server(token, limits(), 4 << 20);
        // Pipelined scrapes (401s with a token: this client has none), never read.
        let mut hog = TcpStream::connect(server.address).unwrap();
        hog.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
        let request = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n".repeat(2000);
        let _ = hog.write_all(&request);
        // Others are answered meanwhile, and again after the hog's write deadline.
        for _ in 0..3 {
            let started = Instant::now();
            assert_eq!(get(&server, token, Duration::from_secs(10)), 200, "token {token:?}");
            assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
        }
        std::thread::sleep(limits().write + Duration::from_millis(500));
        assert_eq!(get(&server, token, Duration::from_secs(10)), 200);
        // The hog was closed: its reads end (after what was buffered).
        hog.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut sink = vec![0u8; 1 << 20];
        let mut total = 0usize;
        loop {
            match hog.read(&mut sink) {
                Ok(0) | Err(_) => break,
                Ok(n) => total += n,
            }
            assert!(total < 64 << 20, "the hog is still being fed");
        }
        // The server stops at once, whatever the clients do.
        let took = server.stop();
        assert!(took < Duration::from_millis(500), "{took:?}");
    }
}

#[test]
fn a_head_without_end_costs_at_most_the_head_limit_and_gets_431() {
    let server = server(None, limits(), 10);
    let mut s = TcpStream::connect(server.address).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nX-Long: ").unwrap();
    // Far more than the limit: the server stops reading at 8 KiB and answers.
    let mut sent = 0usize;
    let line = vec![b'a'; 64 << 10];
    while sent < (64 << 20) && s.write_all(&line).is_ok() {
        sent += line.len();
    }
    let mut response = Vec::new();
    let _ = s.read_to_end(&mut response);
    assert!(String::from_utf8_lossy(&response).starts_with("HTTP/1.1 431"), "{}", String::from_utf8_lossy(&response));
    assert!(sent < (64 << 20), "the server kept reading");
}

#[test]
fn more_idle_sockets_than_slots_cannot_keep_a_scrape_out() {
    let server = server(None, limits(), 10);
    let idle: Vec<TcpStream> =
        (0..limits().connections * 4).map(|_| TcpStream::connect(server.address).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(get(&server, None, Duration::from_secs(5)), 200);
    drop(idle);
}

#[test]
fn slots_stay_within_their_bound_and_idle_and_slow_clients_are_closed_in_time() {
    let config = Config { listen: "127.0.0.1:0".parse().unwrap(), token: None, tls: None };
    let limits = limits();
    let listener_server = bind_with(&config, limits).unwrap();
    // Raw access to the slot count: a second view of the same limits.
    let slots = Slots::new(4);
    let streams: Vec<Arc<TcpStream>> =
        (0..8).map(|_| Arc::new(TcpStream::connect(listener_server.address).unwrap())).collect();
    for s in &streams {
        assert!(slots.admit(s).is_some());
        assert!(slots.count() <= 4);
    }
    // An idle client is closed after the idle limit, a trickling one after the head limit.
    let mut idle = TcpStream::connect(listener_server.address).unwrap();
    let mut slow = TcpStream::connect(listener_server.address).unwrap();
    slow.write_all(b"GET /metr").unwrap();
    let started = Instant::now();
    let mut byte = [0u8; 1];
    slow.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut answer = Vec::new();
    let _ = slow.read_to_end(&mut answer);
    assert!(String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 408"));
    assert!(started.elapsed() < limits.head + Duration::from_secs(2));
    idle.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    assert_eq!(idle.read(&mut byte).unwrap_or(0), 0, "closed without an answer");
    assert!(started.elapsed() < limits.idle + Duration::from_secs(2));
}
