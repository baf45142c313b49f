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
                    job.answer(Ok("x".repeat(body).into()));
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
        max_age: Duration::ZERO,
        client_rate: 0,
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

/// A server whose main thread scrapes as `serve` does (through [`Scrapes`] and the server's
/// [`Latest`]), each scrape taking `cost`; the number of scrapes made.
fn scraping_server(limits: Limits, cost: Duration) -> (Running, Arc<std::sync::atomic::AtomicU64>) {
    let config = Config { listen: "127.0.0.1:0".parse().unwrap(), token: None, tls: None };
    let server = bind_with(&config, limits).unwrap();
    let address = server.address;
    let done = Arc::new(AtomicBool::new(false));
    let made = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let main = {
        let (done, made) = (Arc::clone(&done), Arc::clone(&made));
        std::thread::spawn(move || {
            let mut scrapes: Scrapes<u64> = Scrapes::new();
            while !done.load(Ordering::Relaxed) {
                if let Some(job) = server.next_scrape(Duration::from_millis(20)) {
                    let text = scrapes.answer(
                        &job,
                        &server.latest,
                        || {
                            std::thread::sleep(cost);
                            Ok(made.fetch_add(1, Ordering::Relaxed) + 1)
                        },
                        |n, format| format!("scrape {n} as {format:?}\n"),
                    );
                    job.answer(text.map_err(|e| e.to_string()));
                }
            }
        })
    };
    (Running { address, done, main: Some(main) }, made)
}

/// Requests on one keep-alive connection, as fast as answers come, for `run`: how many
/// were answered 200.
fn loop_on_one_connection(address: SocketAddr, run: Duration) -> u64 {
    let mut s = TcpStream::connect(address).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let started = Instant::now();
    let mut answered = 0;
    loop {
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let head = read_answer(&mut s);
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        answered += 1;
        if started.elapsed() >= run {
            return answered;
        }
    }
}

/// One whole answer from `s` (head and its Content-Length of body); its head.
fn read_answer(s: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(s.read(&mut byte).unwrap(), 1, "the answer ended early");
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .and_then(|n| n.trim().parse().ok())
        .expect("a Content-Length");
    let mut body = vec![0u8; length];
    s.read_exact(&mut body).unwrap();
    head
}

#[test]
fn a_client_asking_as_fast_as_it_can_costs_one_scrape_per_max_age() {
    let unpaced = Limits { max_age: Duration::from_millis(500), client_rate: 0, ..limits() };
    let (server, made) = scraping_server(unpaced, Duration::from_millis(5));
    let answered = loop_on_one_connection(server.address, Duration::from_secs(2));
    let scrapes = made.load(Ordering::Relaxed);
    eprintln!("unpaced: {answered} answers in 2 s from {scrapes} scrapes");
    assert!(answered > 100, "{answered}");
    assert!((2..=6).contains(&scrapes), "{scrapes} scrapes for {answered} answers within a 500 ms max age");
    server.stop();

    // Paced: 10 answers a second to one connection, whatever it asks.
    let paced = Limits { max_age: Duration::ZERO, client_rate: 10, ..limits() };
    let (server, made) = scraping_server(paced, Duration::from_millis(5));
    let answered = loop_on_one_connection(server.address, Duration::from_secs(2));
    eprintln!("paced at 10/s: {answered} answers in 2 s, {} scrapes", made.load(Ordering::Relaxed));
    assert!((15..=22).contains(&answered), "{answered}");
    server.stop();
}

#[test]
fn requests_that_wait_together_share_one_scrape() {
    // Every request scrapes anew (max age 0), but a scrape takes 300 ms: the 16 that come
    // meanwhile are all answered by the next one.
    let (server, made) = scraping_server(Limits { connections: 64, ..limits() }, Duration::from_millis(300));
    let address = server.address;
    let first = std::thread::spawn(move || loop_on_one_connection(address, Duration::from_millis(1)));
    std::thread::sleep(Duration::from_millis(50));
    let waiting: Vec<_> = (0..16)
        .map(|_| std::thread::spawn(move || loop_on_one_connection(address, Duration::from_millis(1))))
        .collect();
    for w in waiting {
        assert_eq!(w.join().unwrap(), 1);
    }
    first.join().unwrap();
    assert_eq!(made.load(Ordering::Relaxed), 2, "one scrape for the first, one for the 16 that waited");
    server.stop();
}

#[test]
fn an_address_opening_connections_in_a_loop_is_told_429_past_its_rate() {
    let rated = Limits { client_rate: 5, ..limits() };
    let (server, _made) = scraping_server(rated, Duration::ZERO);
    let mut codes = std::collections::BTreeMap::<u16, u32>::new();
    for _ in 0..40 {
        *codes.entry(get(&server, None, Duration::from_secs(5))).or_default() += 1;
    }
    eprintln!("40 connections at once from one address: {codes:?}");
    // The burst (twice the rate) and what refilled meanwhile are answered; the rest get 429.
    assert!((10..=15).contains(&codes[&200]), "{codes:?}");
    assert_eq!(codes[&200] + codes[&429], 40, "{codes:?}");
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(get(&server, None, Duration::from_secs(5)), 200, "a second later it may connect again");
    server.stop();
}
