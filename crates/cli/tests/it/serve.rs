//! `virtprof serve`: the Prometheus endpoint checked against the test VM's own counts, its
//! access rules, the textfile mode, and (in `prometheus.rs`) a real Prometheus scraping it.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::util::{have_kvm, have_tracefs, note, temp, virtprof};

/// A running `virtprof serve` and the address it bound.
pub struct Served {
    pub child: Child,
    pub address: String,
    pub https: bool,
}

impl Served {
    /// `virtprof serve ARGS --listen 127.0.0.1:0`, once it says where it listens.
    // The child is waited for by `stop`, or ends by its own `-d` if a test fails first.
    #[allow(clippy::zombie_processes)]
    pub fn start(args: &[&str]) -> Served {
        Served::start_under(&[], args)
    }

    /// The same, run by `wrapper` (a command that runs the rest of its arguments: setpriv).
    #[allow(clippy::zombie_processes)]
    pub fn start_under(wrapper: &[&str], args: &[&str]) -> Served {
        let mut command = match wrapper.split_first() {
            Some((program, rest)) => {
                let mut command = std::process::Command::new(program);
                command.args(rest).arg(assert_cmd::cargo::cargo_bin("virtprof"));
                command
            }
            None => virtprof(),
        };
        let mut child = command
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(args)
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        loop {
            line.clear();
            if stderr.read_line(&mut line).unwrap_or(0) == 0 {
                let status = child.wait();
                panic!("serve ended before listening: {status:?}");
            }
            if let Some(rest) = line.trim().strip_prefix("virtprof: serving ") {
                let https = rest.starts_with("https");
                let address = rest.split("://").nth(1).unwrap().split('/').next().unwrap().to_string();
                // Keep draining stderr so serve never blocks on a full pipe.
                std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
                return Served { child, address, https };
            }
        }
    }

    /// Stop it as a user would (SIGINT) and check it ended cleanly.
    pub fn stop(mut self) {
        // SAFETY: kill on our own child's pid.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGINT) };
        let status = self.child.wait().unwrap();
        assert!(status.success(), "serve ended with {status}");
        let instance = format!("/sys/kernel/tracing/instances/virtprof-{}", self.child.id());
        assert!(!std::path::Path::new(&instance).exists(), "{instance} left behind");
    }
}

/// One HTTP/1.1 request: (status, headers and body as text).
pub fn http(address: &str, request: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(address).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let status = response.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, response)
}

/// GET /metrics (with `extra` header lines).
pub fn scrape(address: &str, extra: &str) -> String {
    let (status, response) =
        http(address, &format!("GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{extra}\r\n"));
    assert_eq!(status, 200, "{response}");
    response.split_once("\r\n\r\n").unwrap().1.to_string()
}

/// A sample: (name, labels, value).
pub type Sample = (String, BTreeMap<String, String>, f64);

/// The samples of an exposition (comments skipped; label values must not hold `",`).
pub fn samples(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|line| {
            let (series, value) = line.rsplit_once(' ').unwrap();
            let (name, labels) = match series.split_once('{') {
                Some((name, rest)) => (name, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            let labels = labels
                .split("\",")
                .filter(|kv| !kv.is_empty())
                .map(|kv| {
                    let (k, v) = kv.split_once('=').unwrap();
                    // Values are escaped as the exposition format says: \\ \" \n.
                    let v = v.trim_matches('"').replace("\\\\", "\\").replace("\\\"", "\"").replace("\\n", "\n");
                    (k.to_string(), v)
                })
                .collect();
            (name.to_string(), labels, value.parse().unwrap())
        })
        .collect()
}

/// The value of `name` for the VM named `vm`, summed over its series matching `filter`.
fn value(samples: &[Sample], name: &str, vm: &str, filter: &dyn Fn(&BTreeMap<String, String>) -> bool) -> Option<f64> {
    let found: Vec<f64> = samples
        .iter()
        .filter(|(n, l, _)| n == name && l.get("vm").map(String::as_str) == Some(vm) && filter(l))
        .map(|s| s.2)
        .collect();
    (!found.is_empty()).then(|| found.iter().sum())
}

/// Ground truth from the VM itself: a VM does 20 000 port writes, then computes. Scraped
/// while it computes, serve counts every write and its phase markers (traced), and its exits
/// as KVM's stats fd does: at least the exits KVM counted over the write phase, at most all
/// the VM ever made.
#[test]
fn serve_counts_a_vms_port_writes_exactly_and_its_exits_as_kvm_does() {
    let test = "serve_counts_a_vms_port_writes_exactly_and_its_exits_as_kvm_does";
    let Some(_kvm) = have_kvm(test) else { return };
    if !have_tracefs(test) {
        return;
    }
    let served = Served::start(&["-d", "120s"]);
    let vm = virtprof()
        .args(["testvm", "-w", "phases", "--phases", "pio-user:20000,compute:6s", "--json", "--name", "serve-gt"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // The write phase takes about a second here; scrape during the compute phase.
    std::thread::sleep(Duration::from_secs(4));
    let text = scrape(&served.address, "");
    let out = vm.wait_with_output().unwrap();
    assert!(out.status.success());
    served.stop();
    let truth: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let vcpu = &truth["vms"][0]["vcpus"][0];
    let phases = vcpu["phases"].as_array().unwrap();
    let s = samples(&text);
    let all = |_: &BTreeMap<String, String>| true;
    // Port writes: the phase's iterations and the two phase-start markers seen so far (the
    // "done" marker comes after the compute phase).
    let writes = phases[0]["iterations"].as_u64().unwrap() + 2;
    assert_eq!(value(&s, "virtprof_vcpu_io_total", "serve-gt", &all), Some(writes as f64), "{text}");
    let traced = value(&s, "virtprof_vcpu_traced_exits_total", "serve-gt", &|l| l["reason"] == "KVM_EXIT_IO");
    assert_eq!(traced, Some(writes as f64));
    let exits = value(&s, "virtprof_vcpu_exits_total", "serve-gt", &all).unwrap();
    let (during_writes, ever) =
        (phases[0]["kvm_exits"].as_f64().unwrap(), vcpu["kvm_stats"]["exits"].as_f64().unwrap());
    assert!(during_writes <= exits && exits <= ever, "exits {exits} outside [{during_writes}, {ever}]");
    // Identity, time and the histogram.
    let pid = truth["vms"][0]["pid"].as_u64().unwrap().to_string();
    let info = s.iter().find(|(n, l, _)| n == "virtprof_vm_info" && l["vm"] == "serve-gt").expect("info metric");
    assert_eq!((info.1["vmm"].as_str(), info.1["pid"].as_str(), info.2), ("virtprof-testvm", pid.as_str(), 1.0));
    let run = value(&s, "virtprof_vcpu_run_seconds_total", "serve-gt", &all).unwrap();
    assert!(run > 0.5, "ran {run} s in 4 s of compute");
    // By role: the vCPU role is the vCPUs' own figure; the VMM's first thread is its main loop.
    let role = |name: &str, r: &str| value(&s, name, "serve-gt", &|l| l["role"] == r);
    assert_eq!(role("virtprof_vmm_thread_run_seconds_total", "vcpu"), Some(run), "{text}");
    assert!(role("virtprof_vmm_thread_executions_total", "main-loop").is_some(), "{text}");
    // explain's causes: the contention counter is the vCPU's waiting; a top cause is named.
    let wait = value(&s, "virtprof_vcpu_wait_seconds_total", "serve-gt", &all);
    let lost = value(&s, "virtprof_vm_lost_seconds_total", "serve-gt", &|l| l["cause"] == "cpu_contention");
    assert_eq!(lost, wait, "{text}");
    assert!(s.iter().any(|(n, l, v)| n == "virtprof_vm_top_cause" && l["vm"] == "serve-gt" && *v == 1.0), "{text}");
    let io_exits =
        s.iter().find(|(n, l, _)| n == "virtprof_exit_duration_seconds_count" && l["reason"] == "KVM_EXIT_IO");
    assert!(io_exits.is_some_and(|(_, _, n)| *n >= writes as f64), "every port write timed");
    check_conventions(&text);
}

/// Two VMs pinned on one CPU: serve names CPU contention as each one's top cause, and its
/// lost time is the waiting the VM's own schedstat shows.
#[test]
fn serve_names_cpu_contention_as_the_top_cause_of_two_vms_on_one_cpu() {
    let test = "serve_names_cpu_contention_as_the_top_cause_of_two_vms_on_one_cpu";
    let Some(_kvm) = have_kvm(test) else { return };
    if !have_tracefs(test) {
        return;
    }
    let served = Served::start(&["-d", "120s"]);
    let vms = virtprof()
        .args(["testvm", "-w", "compute", "--vms", "2", "--pin", "1", "--duration", "5s", "--name", "contend"])
        .args(["--json"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(3));
    let text = scrape(&served.address, "");
    let out = vms.wait_with_output().unwrap();
    assert!(out.status.success());
    let truth: virtprof_model::testvm::TestvmReport = serde_json::from_slice(&out.stdout).unwrap();
    served.stop();
    let s = samples(&text);
    let in_kernel = !text.contains("counted in the kernel (eBPF) only");
    for (vm, other) in [("contend-0", truth.vms[1].pid), ("contend-1", truth.vms[0].pid)] {
        let top = s.iter().find(|(n, l, _)| n == "virtprof_vm_top_cause" && l["vm"] == vm);
        assert_eq!(top.map(|(_, l, _)| l["cause"].as_str()), Some("cpu_contention"), "{vm}: {text}");
        let lost = value(&s, "virtprof_vm_lost_seconds_total", vm, &|l| l["cause"] == "cpu_contention").unwrap();
        let run = value(&s, "virtprof_vcpu_run_seconds_total", vm, &|_| true).unwrap();
        assert!(lost > 0.3 * run, "{vm}: lost {lost} s to contention, ran {run} s");
        // Who took it: the other VM, most of it (the in-kernel program names them).
        if in_kernel {
            let by = |l: &BTreeMap<String, String>| l["by"] == format!("vm {other}");
            let by_other = value(&s, "virtprof_vm_lost_by_seconds_total", vm, &by).unwrap_or(0.0);
            let named: f64 = s
                .iter()
                .filter(|(n, l, _)| n == "virtprof_vm_lost_by_seconds_total" && l["vm"] == vm)
                .map(|(_, _, v)| v)
                .sum();
            assert!(by_other > 0.5 * lost, "{vm}: {by_other} s by VM {other} of {lost} s lost:\n{text}");
            assert!(named <= lost * 1.01, "{vm}: {named} s named, {lost} s lost");
        } else {
            note(test, "serve does not count in the kernel here: who took the CPU is not named");
        }
    }
    check_conventions(&text);
}

/// Every family has HELP and TYPE; counters end in `_total`; names are virtprof's.
fn check_conventions(text: &str) {
    let mut typed = BTreeMap::new();
    let mut helped = std::collections::BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            typed.insert(name.to_string(), kind.to_string());
        } else if let Some(rest) = line.strip_prefix("# HELP ") {
            helped.insert(rest.split(' ').next().unwrap().to_string());
        }
    }
    assert!(typed.len() >= 15, "{typed:?}");
    for (name, kind) in &typed {
        assert!(name.starts_with("virtprof_"), "{name}");
        assert!(helped.contains(name), "{name} has no HELP");
        assert_eq!(kind == "counter", name.ends_with("_total"), "{name} is a {kind}");
    }
}

/// Read-only, loopback unless a token guards it, 4xx for anything odd, TLS when asked.
#[test]
fn serve_answers_only_what_it_should() {
    let test = "serve_answers_only_what_it_should";
    if !have_tracefs(test) {
        return;
    }
    // A tracer and its scrapes load the host: not beside tests that time VMs.
    let _cpus = super::util::vm_lock();
    let token = temp("serve-token");
    std::fs::write(&token, "a-long-enough-token\n").unwrap();
    let served = Served::start(&["--token-file", token.to_str().unwrap(), "-d", "60s"]);
    let ask = |request: &str| http(&served.address, request).0;
    assert_eq!(ask("GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n"), 401);
    assert_eq!(ask("GET /metrics HTTP/1.1\r\nAuthorization: Bearer wrong-token\r\nConnection: close\r\n\r\n"), 401);
    let auth = "Authorization: Bearer a-long-enough-token\r\n";
    assert_eq!(ask(&format!("POST /metrics HTTP/1.1\r\n{auth}Content-Length: 0\r\nConnection: close\r\n\r\n")), 405);
    assert_eq!(ask(&format!("GET /secret HTTP/1.1\r\n{auth}Connection: close\r\n\r\n")), 404);
    assert!(ask("NONSENSE\r\n\r\n") >= 400);
    // OpenMetrics when asked for, Prometheus text otherwise.
    let om = scrape(&served.address, &format!("{auth}Accept: application/openmetrics-text; version=1.0.0\r\n"));
    assert!(om.trim_end().ends_with("# EOF"), "OpenMetrics ends with # EOF");
    assert!(om.contains("# UNIT virtprof_vcpu_run_seconds seconds"));
    let text = scrape(&served.address, auth);
    assert!(!text.contains("# EOF") && text.contains("virtprof_trace_lost_events_total 0"), "{text}");
    // A client that connects and says nothing does not stop the others.
    let idle = TcpStream::connect(&served.address).unwrap();
    assert!(scrape(&served.address, auth).contains("virtprof_scrape_collect_seconds"));
    drop(idle);
    served.stop();

    // Off loopback without a token, or a bad address: usage errors.
    for args in [vec!["--listen", "0.0.0.0:0"], vec!["--listen", "nowhere"]] {
        let out = virtprof().arg("serve").args(&args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }

    // TLS with a self-signed certificate.
    let (cert, key) = (temp("serve-cert.pem"), temp("serve-key.pem"));
    let made = std::process::Command::new("openssl")
        .args(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost", "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output();
    if !made.is_ok_and(|o| o.status.success()) {
        note(test, "SKIP (TLS part): no openssl to make a certificate");
        return;
    }
    let served = Served::start(&[
        "--token-file",
        token.to_str().unwrap(),
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
        "-d",
        "60s",
    ]);
    assert!(served.https);
    let curl = std::process::Command::new("curl")
        .args(["-sk", "-H", "Authorization: Bearer a-long-enough-token"])
        .arg(format!("https://{}/metrics", served.address))
        .output();
    match curl {
        Ok(out) => {
            assert!(String::from_utf8_lossy(&out.stdout).contains("virtprof_vcpu_run_seconds_total"), "HTTPS scrape")
        }
        Err(e) => note(test, format!("SKIP (HTTPS scrape): curl: {e}")),
    }
    // Plain HTTP to the TLS port is refused, not served.
    assert_ne!(http(&served.address, "GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n").0, 200);
    served.stop();
    for f in [token, cert, key] {
        let _ = std::fs::remove_file(f);
    }
}

/// Clients that attack serve (issue 32): one that pipelines scrapes and never reads its
/// answers, with no token, and one that sends a header line without end, while a real
/// scraper keeps being answered and a stop still ends serve at once. Loopback, bounded.
#[test]
fn a_client_that_never_reads_cannot_hang_serve_or_its_stop() {
    // Floods of requests load the host: not beside tests that time VMs.
    let _cpus = super::util::vm_lock();
    let token = temp("serve-hostile-token");
    std::fs::write(&token, "a-long-enough-token\n").unwrap();
    let served = Served::start(&["--no-trace", "--token-file", token.to_str().unwrap(), "-d", "60s"]);
    let mut hog = TcpStream::connect(&served.address).unwrap();
    hog.set_write_timeout(Some(Duration::from_secs(3))).unwrap();
    let _ = hog.write_all(&b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n".repeat(20_000));
    let mut endless = TcpStream::connect(&served.address).unwrap();
    endless.set_write_timeout(Some(Duration::from_secs(3))).unwrap();
    let _ = endless.write_all(b"GET /metrics HTTP/1.1\r\nX: ");
    let mut fed = 0usize;
    while fed < (32 << 20) && endless.write_all(&[b'a'; 1 << 16]).is_ok() {
        fed += 1 << 16;
    }
    assert!(fed < (32 << 20), "serve kept reading a header line without end");
    let auth = "Authorization: Bearer a-long-enough-token\r\n";
    for _ in 0..3 {
        assert!(scrape(&served.address, auth).contains("virtprof_scrape_collect_seconds"));
    }
    let started = Instant::now();
    let pid = served.child.id();
    served.stop();
    assert!(started.elapsed() < Duration::from_secs(2), "serve {pid} took {:?} to stop", started.elapsed());
    drop((hog, endless));
    let _ = std::fs::remove_file(token);
}

/// Under `ulimit -n 64`, 300 idle sockets cannot end serve (it ended with "Too many open
/// files" at about 510 under 1024) nor keep a scraper out: the oldest idle ones are closed.
#[test]
fn idle_sockets_past_the_fd_limit_cannot_end_serve_or_keep_scrapes_out() {
    // Floods of requests load the host: not beside tests that time VMs.
    let _cpus = super::util::vm_lock();
    let mut child = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!(
            // No connection rate: the sockets must reach the fd limit, not a 429.
            "ulimit -n 64; exec {} serve --no-trace --listen 127.0.0.1:0 -d 60s --client-rate 0",
            env!("CARGO_BIN_EXE_virtprof")
        ))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    let address = loop {
        line.clear();
        assert!(stderr.read_line(&mut line).unwrap() > 0, "serve ended before listening");
        if let Some(rest) = line.trim().strip_prefix("virtprof: serving http://") {
            break rest.trim_end_matches("/metrics").to_string();
        }
    };
    std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
    let idle: Vec<TcpStream> = (0..300).map(|_| TcpStream::connect(&address).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(500));
    for _ in 0..5 {
        assert!(scrape(&address, "").contains("virtprof_scrape_collect_seconds"));
    }
    assert!(child.try_wait().unwrap().is_none(), "serve ended");
    // SAFETY: kill on our own child's pid.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
    assert!(child.wait().unwrap().success());
    drop(idle);
}

/// Issue 54 item 2: clients asking as fast as they can (one on a kept-alive connection, one
/// opening a connection per request) cost serve one scrape per `--max-age` (its own
/// `virtprof_scrapes_total` says how many it made), are answered at most `--client-rate` a
/// second per connection and told 429 past it per address, and a scraper at Prometheus' pace
/// beside them is answered every time.
#[test]
fn scrapers_in_a_loop_cost_one_scrape_per_max_age_and_a_paced_scraper_is_always_answered() {
    let test = "scrapers_in_a_loop_cost_one_scrape_per_max_age_and_a_paced_scraper_is_always_answered";
    let Some(_kvm) = have_kvm(test) else { return };
    let mut vm = virtprof()
        .args(["testvm", "-w", "io-bound", "--io-latency", "1ms", "--duration", "60s", "--name", "flooded"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let served = Served::start(&["-d", "120s"]);
    let address = served.address.clone();
    let run = Duration::from_secs(5);
    let kept_alive = {
        let address = address.clone();
        std::thread::spawn(move || {
            let mut s = TcpStream::connect(&address).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            let started = Instant::now();
            let mut answered = 0u32;
            while started.elapsed() < run {
                s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
                assert_eq!(read_answer(&mut s).0, 200);
                answered += 1;
            }
            answered
        })
    };
    let reconnecting = {
        let address = address.clone();
        std::thread::spawn(move || {
            let started = Instant::now();
            let mut codes = BTreeMap::<u16, u32>::new();
            while started.elapsed() < run {
                let (status, _) = http(&address, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
                *codes.entry(status).or_default() += 1;
            }
            codes
        })
    };
    // At Prometheus' pace (here once a second), on its own kept-alive connection.
    let mut paced = TcpStream::connect(&address).unwrap();
    paced.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut slowest = Duration::ZERO;
    for _ in 0..5 {
        let started = Instant::now();
        paced.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        assert_eq!(read_answer(&mut paced).0, 200, "the paced scraper was not answered");
        slowest = slowest.max(started.elapsed());
        std::thread::sleep(Duration::from_secs(1));
    }
    let (kept_alive, codes) = (kept_alive.join().unwrap(), reconnecting.join().unwrap());
    // The last answer, on the paced connection (the reconnecting loop used the address's).
    paced.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let (status, final_text) = read_answer(&mut paced);
    assert_eq!(status, 200);
    let found = samples(&final_text).into_iter().find(|(n, _, _)| n == "virtprof_scrapes_total");
    let scrapes = found.expect("virtprof_scrapes_total").2;
    served.stop();
    // SAFETY: SIGTERM to the test VM this test started.
    unsafe { libc::kill(vm.id() as libc::pid_t, libc::SIGTERM) };
    vm.wait().unwrap();
    let answered = kept_alive + codes.get(&200).copied().unwrap_or(0) + 5;
    note(
        test,
        format!(
            "in ~5 s: kept-alive loop answered {kept_alive}, reconnecting loop {codes:?}, paced scraper 5 of 5 (slowest {slowest:?}); serve made {scrapes} scrapes for {answered} answers"
        ),
    );
    // 10 a second to the kept-alive connection; the reconnecting one gets its burst (20) and
    // 10 a second, the rest 429; serve scraped about once a second for all of them.
    assert!((30..=62).contains(&kept_alive), "{kept_alive}");
    assert!(codes.get(&429).copied().unwrap_or(0) > 0, "{codes:?}");
    assert!(codes.get(&200).copied().unwrap_or(0) <= 20 + 10 * 7, "{codes:?}");
    assert!(scrapes <= 10.0, "{scrapes} scrapes for {answered} answers in about 6 s with a 1 s max age");
}

/// One whole answer from a kept-alive connection: its status and body.
fn read_answer(s: &mut TcpStream) -> (u16, String) {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(s.read(&mut byte).unwrap(), 1, "the answer ended early");
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let status = head.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let length: usize =
        head.lines().find_map(|l| l.strip_prefix("Content-Length: ")).and_then(|n| n.trim().parse().ok()).unwrap_or(0);
    let mut body = vec![0u8; length];
    s.read_exact(&mut body).unwrap();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// TLS material is checked before anything is served: junk, a certificate without its key,
/// a key of another certificate are exit-2 errors naming the file; a SEC1 EC key works. A
/// textfile interval under a second is refused; a token file every user can read is warned of.
#[test]
fn serve_checks_tls_material_intervals_and_token_files_before_serving() {
    // Floods of requests load the host: not beside tests that time VMs.
    let _cpus = super::util::vm_lock();
    let test = "serve_checks_tls_material_intervals_and_token_files_before_serving";
    let openssl =
        |args: &[&str]| std::process::Command::new("openssl").args(args).output().is_ok_and(|o| o.status.success());
    let dir = temp("serve-tls");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let p = |name: &str| dir.join(name).to_str().unwrap().to_string();
    let ec = openssl(&["ecparam", "-genkey", "-name", "prime256v1", "-noout", "-out", &p("ec.pem")])
        && openssl(&[
            "req",
            "-x509",
            "-new",
            "-key",
            &p("ec.pem"),
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-out",
            &p("ec-cert.pem"),
        ]);
    let other = openssl(&["ecparam", "-genkey", "-name", "prime256v1", "-noout", "-out", &p("other.pem")]);
    if !(ec && other) {
        note(test, "SKIP (TLS part): no openssl to make keys");
    } else {
        assert!(std::fs::read_to_string(p("ec.pem")).unwrap().contains("BEGIN EC PRIVATE KEY"), "a SEC1 key");
        std::fs::write(p("junk.pem"), "-----BEGIN PRIVATE KEY-----\nnot base64 at all\n-----END PRIVATE KEY-----\n")
            .unwrap();
        std::fs::write(p("text.pem"), "hello\n").unwrap();
        for (cert, key, says) in [
            ("ec-cert.pem", "junk.pem", "junk.pem"),
            ("ec-cert.pem", "text.pem", "text.pem"),
            ("text.pem", "ec.pem", "text.pem"),
            ("ec-cert.pem", "other.pem", "is not the private key of"),
        ] {
            let out = virtprof()
                .args([
                    "serve",
                    "--no-trace",
                    "--listen",
                    "127.0.0.1:0",
                    "-d",
                    "5s",
                    "--tls-cert",
                    &p(cert),
                    "--tls-key",
                    &p(key),
                ])
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{cert} {key}: {stderr}");
            assert!(stderr.contains(says) && !stderr.contains("serving"), "{cert} {key}: {stderr}");
        }
        let served =
            Served::start(&["--no-trace", "-d", "30s", "--tls-cert", &p("ec-cert.pem"), "--tls-key", &p("ec.pem")]);
        assert!(served.https);
        // Over TLS too, a client that pipelines scrapes and never reads stalls only itself:
        // openssl s_client sends them, and its own output is never read.
        let mut hog = std::process::Command::new("openssl")
            .args(["s_client", "-quiet", "-connect", &served.address])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .ok();
        if let Some(h) = &mut hog {
            let mut stdin = h.stdin.take().unwrap();
            std::thread::spawn(move || {
                let _ = stdin.write_all(&b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n".repeat(5000));
                std::thread::sleep(Duration::from_secs(30));
            });
            std::thread::sleep(Duration::from_secs(2));
        }
        for _ in 0..3 {
            let curl = std::process::Command::new("curl")
                .args(["-sk", "--max-time", "10"])
                .arg(format!("https://{}/metrics", served.address))
                .output();
            match curl {
                Ok(out) => assert!(String::from_utf8_lossy(&out.stdout).contains("virtprof_scrape_collect_seconds")),
                Err(e) => note(test, format!("SKIP (HTTPS scrape): curl: {e}")),
            }
        }
        let started = Instant::now();
        served.stop();
        assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
        if let Some(mut h) = hog {
            let _ = h.kill();
            let _ = h.wait();
        }
    }
    for interval in ["0s", "1ms", "999ms"] {
        let out = virtprof()
            .args(["serve", "--no-trace", "--textfile"])
            .arg(&dir)
            .args(["--interval", interval])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "--interval {interval}: {}", String::from_utf8_lossy(&out.stderr));
    }
    std::fs::write(p("token"), "a-long-enough-token\n").unwrap();
    std::fs::set_permissions(p("token"), std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let out = virtprof()
        .args(["serve", "--no-trace", "--listen", "127.0.0.1:0", "-d", "300ms", "--token-file", &p("token")])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("readable by every user"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--textfile DIR`: node_exporter's format, rewritten whole at each interval.
#[test]
fn serve_textfile_writes_whole_files_for_node_exporter() {
    let test = "serve_textfile_writes_whole_files_for_node_exporter";
    if !have_tracefs(test) {
        return;
    }
    // A tracer and its scrapes load the host: not beside tests that time VMs.
    let _cpus = super::util::vm_lock();
    let dir = temp("serve-textfile");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let started = Instant::now();
    let out =
        virtprof().args(["serve", "--textfile"]).arg(&dir).args(["--interval", "1s", "-d", "2500ms"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(started.elapsed() < Duration::from_secs(30));
    let names: Vec<String> =
        std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    assert_eq!(names, ["virtprof.prom"], "one file, no temporaries left");
    let text = std::fs::read_to_string(dir.join("virtprof.prom")).unwrap();
    assert!(!text.contains("# EOF"), "the textfile collector reads Prometheus text, not OpenMetrics");
    assert!(samples(&text).iter().any(|(n, _, _)| n == "virtprof_scrape_collect_seconds"));
    check_conventions(&text);
    let bad = virtprof().args(["serve", "--textfile", "/nonexistent-folder"]).output().unwrap();
    assert_eq!(bad.status.code(), Some(2));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The unified (v2) cgroup hierarchy's mount point, if any.
fn cgroup2_root() -> Option<std::path::PathBuf> {
    let mounts = std::fs::read_to_string("/proc/mounts").ok()?;
    mounts.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.get(2) == Some(&"cgroup2")).then(|| std::path::PathBuf::from(f[1]))
    })
}

/// The pid of the VMM process named `name` (testvm's `virtprof-vm --name NAME`).
fn vmm_pid(name: &str) -> Option<u32> {
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(10) {
        for entry in std::fs::read_dir("/proc").ok()?.flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
            if args.windows(2).any(|w| w[0] == b"--name" && w[1] == name.as_bytes())
                && args.iter().any(|a| *a == b"__vmm")
            {
                return Some(pid);
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    None
}

/// A VMM moved into cgroups named the way libvirt and Kubernetes name theirs is labelled with
/// its libvirt domain, pod and container, by `serve` and in `top --json`.
#[test]
fn a_vmm_in_libvirt_and_kubernetes_cgroups_is_labelled_with_its_domain_and_pod() {
    let test = "a_vmm_in_libvirt_and_kubernetes_cgroups_is_labelled_with_its_domain_and_pod";
    let Some(_kvm) = have_kvm(test) else { return };
    if !have_tracefs(test) {
        return;
    }
    let Some(root) = cgroup2_root() else {
        note(test, "SKIP: no cgroup2 hierarchy mounted");
        return;
    };
    let name = format!("cg-vm-{}", std::process::id());
    let mut vm = virtprof()
        .args(["testvm", "-w", "io-bound", "--duration", "30s", "--name", &name])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let pid = vmm_pid(&name).expect("the testvm's VMM process");
    let pod = "0d5b7c1e-2f3a-4b5c-8d9e-0f1a2b3c4d5e";
    let container = "c0ffee".repeat(10) + "abcd";
    let groups = [
        format!("machine.slice/machine-qemu\\x2d7\\x2dweb\\x2d{pid}.scope"),
        format!(
            "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{container}.scope",
            pod.replace('-', "_")
        ),
    ];
    let move_to = |group: &std::path::Path| std::fs::write(group.join("cgroup.procs"), pid.to_string());
    let mut cleanup = Cgroups { root: root.clone(), pid, created: Vec::new() };
    let mut seen = Vec::new();
    for group in &groups {
        let path = root.join(group);
        if let Err(e) = std::fs::create_dir_all(&path).and_then(|()| move_to(&path)) {
            note(test, format!("SKIP: cannot move a process into {}: {e}", path.display()));
            break;
        }
        cleanup.created.push(path);
        // A fresh sampler reads the owner when it discovers the VM.
        let top = virtprof().args(["top", "--once", "--json", "-d", "0.5", "--vm", &pid.to_string()]).output().unwrap();
        let top: Value = serde_json::from_slice(&top.stdout).unwrap();
        seen.push(top["windows"][0]["vms"][0]["owner"].clone());
        if group.starts_with("machine.slice") {
            let served = Served::start(&["-d", "60s", "--vm", &pid.to_string()]);
            let text = scrape(&served.address, "");
            served.stop();
            let info = samples(&text).into_iter().find(|(n, l, _)| n == "virtprof_vm_info" && l["vm"] == name);
            let labels = info.expect("info metric").1;
            assert_eq!(
                labels.get("libvirt_domain").map(String::as_str),
                Some(format!("web-{pid}").as_str()),
                "{labels:?}"
            );
            assert_eq!(labels.get("cgroup").map(String::as_str), Some(format!("/{}", groups[0]).as_str()));
        }
    }
    drop(cleanup);
    let _ = vm.kill();
    let _ = vm.wait();
    if seen.len() == groups.len() {
        assert_eq!(seen[0]["libvirt_domain"], format!("web-{pid}"), "{}", seen[0]);
        assert_eq!(seen[1]["pod_uid"], pod, "{}", seen[1]);
        assert_eq!(seen[1]["container_id"], container.as_str(), "{}", seen[1]);
        assert!(seen[1]["libvirt_domain"].is_null());
    }
}

/// Cgroups a test made: on drop (a failed assertion too), the process goes back to the root
/// and the folders are removed, deepest first.
struct Cgroups {
    root: std::path::PathBuf,
    pid: u32,
    created: Vec<std::path::PathBuf>,
}

impl Drop for Cgroups {
    fn drop(&mut self) {
        let _ = std::fs::write(self.root.join("cgroup.procs"), self.pid.to_string());
        for path in self.created.iter().rev() {
            let mut dir = path.as_path();
            while dir != self.root {
                let _ = std::fs::remove_dir(dir);
                dir = dir.parent().unwrap_or(&self.root);
            }
        }
    }
}
