//! Mutation fuzzing of whole sources on stable Rust, through `Session` and two analyzers (the
//! exit table and the run/wait/blocked accounting with 1 ms buckets, the analysis whose
//! memory grows with the time a recording spans):
//!
//! - `recording`: a real `virtprof record` capture of a testvm (its task table trimmed to the
//!   VM's threads and its formats to the events it can hold), with its chunks mutated and CRCs
//!   fixed up, so the damage reaches the decoders (page data, page timestamps, the metadata
//!   and footer JSON) instead of stopping at the checksum;
//! - `tracedat`: trace-cmd's trace.dat of a kvm_amd run (and its v6 and zlib rewrites);
//! - `perfdata`: a perf.data of `perf record -e kvm:kvm_userspace_exit -e kvm:kvm_pio -e
//!   sched:sched_switch -a` over a testvm run (pio-user, 2 vCPUs, 40 iterations);
//! - `text`: ftrace text of that run, re-encoded through its formats;
//! - `pair`: the guest half of a host + guest pair (`trace-cmd attach` on the kvm_amd bed),
//!   mutated mostly in its last options (TIME_SHIFT), read beside its host and placed;
//! - `bombs`: trace.dat files of `support/bombs.rs` with random CPU counts, chunk sizes,
//!   sharing and repetition (v6, v7 in every codec), and perf.data with a compressed record of
//!   random expansion, then mutated: each read within the address-space limit or refused.
//!
//! Every input must give a value or a clean error: no panic, no hang (each input has a time
//! limit), memory bounded (the process runs under an address-space limit, so a runaway
//! allocation aborts the test). `VIRTPROF_FUZZ_ITERS` inputs per target (default 1 500 in CI);
//! `benches/fuzz.sh` runs a million per target in release and prints peak RSS.

// Random bytes and indices are made by truncating random u64s on purpose.
#![allow(clippy::cast_possible_truncation)]

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use virtprof_analysis::exits::{ExitAnalyzer, ExitOptions};
use virtprof_analysis::sched::{SchedAccounting, SchedOptions};
use virtprof_analysis::{Analyzer, Names};
use virtprof_model::Event;
use virtprof_session::Session;

mod support;
use support::bombs::{Codec, DatBomb};

/// An input running longer than this is a hang.
const INPUT_TIME_LIMIT: Duration = Duration::from_secs(20);
/// The address space the fuzzing process may use: the seeds are under 1 MB, so anything near
/// this is a runaway allocation.
const ADDRESS_SPACE_LIMIT: u64 = 8 << 30;

use virtprof_host::fuzz::Rng;

fn iterations() -> usize {
    virtprof_host::fuzz::iterations(1_500)
}

fn here(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn trace_fixture(rel: &str) -> PathBuf {
    here("../trace/tests/fixtures").join(rel)
}

/// Flip bits, write interesting values, overwrite 8-byte words (timestamps, lengths),
/// truncate, or copy a run of bytes elsewhere, within `data[from..]`.
/// The fixture rewritten by trixie's trace-cmd (`scripts/trace-cmd/fetch.sh`) as version 6 and
/// zlib, where it was fetched; none (said on stderr) otherwise.
fn trace_dat_variants(original: &std::path::Path) -> Vec<Vec<u8>> {
    let trace_cmd = here("../../target/trace-cmd-trixie/trace-cmd");
    let dir = std::env::temp_dir().join(format!("virtprof-fuzz-variants-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let mut out = Vec::new();
    for (name, args) in [("v6.dat", ["--file-version", "6"]), ("zlib.dat", ["--compression", "zlib"])] {
        let file = dir.join(name);
        let made = std::process::Command::new(&trace_cmd)
            .arg("convert")
            .args(args)
            .arg("-i")
            .arg(original)
            .arg("-o")
            .arg(&file)
            .output()
            .is_ok_and(|o| o.status.success());
        match std::fs::read(&file) {
            Ok(bytes) if made => out.push(bytes),
            _ => eprintln!("fuzz: no {name} seed (needs target/trace-cmd-trixie, scripts/trace-cmd/fetch.sh)"),
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    out
}

fn mutate_bytes(rng: &mut Rng, data: &mut Vec<u8>, from: usize) {
    const INTERESTING: [u64; 8] = [0, u64::MAX, 0x7fff_ffff, 0x8000_0000, 1 << 40, 1 << 62, 0xffff, 1];
    for _ in 0..=rng.below(6) {
        if data.len() <= from {
            return;
        }
        let span = data.len() - from;
        let i = from + rng.below(span);
        match rng.below(8) {
            0..=2 => data[i] ^= 1 << rng.below(8),
            3 => data[i] = rng.word() as u8,
            4 | 5 if span >= 8 => {
                let at = from + rng.below(span - 7);
                let value = if rng.below(2) == 0 { INTERESTING[rng.below(8)] } else { rng.word() };
                data[at..at + 8].copy_from_slice(&value.to_le_bytes());
            }
            6 if span >= 64 => {
                let len = 1 + rng.below(64);
                let src = from + rng.below(span - len);
                let dst = from + rng.below(span - len);
                data.copy_within(src..src + len, dst);
            }
            7 if rng.below(4) == 0 => data.truncate(from + rng.below(span)),
            _ => {}
        }
    }
}

/// Chunks of a recording: (header offset, payload range).
fn chunks(bytes: &[u8]) -> Vec<(usize, std::ops::Range<usize>)> {
    let mut out = Vec::new();
    let mut at = 12;
    while at + 16 <= bytes.len() {
        let len = u64::from_le_bytes(bytes[at + 4..at + 12].try_into().unwrap()) as usize;
        let payload = at + 16..(at + 16).saturating_add(len).min(bytes.len());
        let end = payload.end;
        out.push((at, payload));
        at = end;
    }
    out
}

/// Mutate one chunk's payload of a recording (or its framing) and fix up its CRC.
fn mutate_recording(rng: &mut Rng, seed: &[u8]) -> Vec<u8> {
    let mut bytes = seed.to_vec();
    let list = chunks(&bytes);
    let (header, payload) = list[rng.below(list.len())].clone();
    match rng.below(10) {
        // The chunk framing itself (kind, length, CRC): the container's own checks.
        0 => {
            let from = header.min(bytes.len());
            mutate_bytes(rng, &mut bytes, from)
        }
        _ => {
            let mut body = bytes[payload.clone()].to_vec();
            mutate_bytes(rng, &mut body, 0);
            let crc = crc32fast::hash(&body);
            bytes[header + 4..header + 12].copy_from_slice(&(body.len() as u64).to_le_bytes());
            bytes[header + 12..header + 16].copy_from_slice(&crc.to_le_bytes());
            bytes.splice(payload, body);
        }
    }
    bytes
}

fn mutate_text(rng: &mut Rng, text: &str) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    for _ in 0..=rng.below(6) {
        if lines.is_empty() {
            break;
        }
        let i = rng.below(lines.len());
        let line = &mut lines[i];
        match rng.below(6) {
            0 => {
                let digits: Vec<usize> =
                    line.char_indices().filter(|(_, c)| c.is_ascii_digit()).map(|(i, _)| i).collect();
                if !digits.is_empty() {
                    let at = digits[rng.below(digits.len())];
                    line.replace_range(at..at + 1, &(rng.below(10)).to_string());
                }
            }
            1 => line.insert_str(
                rng.below(line.len() + 1).min(line.len()),
                ["99999999999", "-1", "\u{1b}[2J", "=", " ", "\0"][rng.below(6)],
            ),
            2 => {
                let copy = line.clone();
                lines.insert(i, copy);
            }
            3 => {
                lines.remove(i);
            }
            4 => {
                let cut =
                    (0..=line.len()).filter(|&c| line.is_char_boundary(c)).nth(rng.below(line.len() + 1)).unwrap_or(0);
                line.truncate(cut);
            }
            _ => {
                let j = rng.below(lines.len());
                lines.swap(i, j)
            }
        }
    }
    lines.join("\n")
}

/// Every event to both analyzers; the accounting tracks every thread it sees, in 1 ms
/// buckets kept for the whole run.
struct Analyses {
    exits: ExitAnalyzer,
    sched: SchedAccounting,
}

impl Analyses {
    fn new() -> Self {
        Analyses {
            exits: ExitAnalyzer::new(ExitOptions::default()),
            sched: SchedAccounting::new(SchedOptions { bucket_ns: 1_000_000, keep_buckets: usize::MAX }, Vec::new()),
        }
    }
}

impl Analyzer for Analyses {
    fn on_event(&mut self, e: &Event, names: &dyn Names) {
        Analyzer::on_event(&mut self.exits, e, names);
        if e.tid != 0 && self.sched.cpu_of(e.tid).is_none() && self.sched.tracked().count() < 8 {
            self.sched.track(e.tid, e.ts);
        }
        self.sched.on_event(e);
    }
}

fn analyse(session: &Session) {
    let Ok(mut decoder) = session.decoder(&["kvm", "sched"]) else { return };
    let mut analyses = Analyses::new();
    if let Ok(walk) = session.analyse(&mut decoder, &mut [&mut analyses]) {
        let loss = session.loss(&walk);
        let _ = session.describe_loss(&loss, &decoder);
        let _ = analyses.sched.buckets().count();
    }
}

/// Watches the input in flight: a hang fails the test naming the target and iteration.
struct Watchdog {
    started: Arc<Mutex<Option<(Instant, String)>>>,
    /// The input in flight, saved to a file on a hang to replay it.
    input: Arc<Mutex<Vec<u8>>>,
}

impl Watchdog {
    fn start() -> Watchdog {
        let started: Arc<Mutex<Option<(Instant, String)>>> = Arc::default();
        let input: Arc<Mutex<Vec<u8>>> = Arc::default();
        let (watched, held) = (started.clone(), input.clone());
        std::thread::spawn(move || loop {
            std::thread::sleep(Duration::from_millis(500));
            if let Some((at, what)) = watched.lock().unwrap().as_ref() {
                if at.elapsed() > INPUT_TIME_LIMIT {
                    let saved = std::env::temp_dir().join("virtprof-fuzz-hang.bin");
                    let _ = std::fs::write(&saved, &*held.lock().unwrap());
                    eprintln!("fuzz: HANG: {what} ran over {INPUT_TIME_LIMIT:?}; input saved to {}", saved.display());
                    std::process::abort();
                }
            }
        });
        Watchdog { started, input }
    }

    fn holding(&self, bytes: &[u8]) {
        let mut held = self.input.lock().unwrap();
        held.clear();
        held.extend_from_slice(bytes);
    }

    fn input(&self, what: String) {
        *self.started.lock().unwrap() = Some((Instant::now(), what));
    }
}

fn limit_address_space() {
    let limit = libc::rlimit { rlim_cur: ADDRESS_SPACE_LIMIT, rlim_max: ADDRESS_SPACE_LIMIT };
    // SAFETY: setrlimit with a valid struct; lowering our own limit needs no privilege.
    unsafe { libc::setrlimit(libc::RLIMIT_AS, &limit) };
}

fn peak_rss_mib() -> u64 {
    // SAFETY: getrusage fills the zeroed struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    usage.ru_maxrss as u64 / 1024
}

/// Run `n` mutated inputs of one target; returns how many opened as a session.
fn run_target(name: &str, seed: u64, n: usize, watchdog: &Watchdog, mut one: impl FnMut(&mut Rng) -> bool) {
    // Shards of a long run (`benches/fuzz.sh`) each start from their own seed.
    let shard: u64 = std::env::var("VIRTPROF_FUZZ_SHARD").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    let seed = seed ^ shard.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let mut rng = Rng(seed);
    let opened = AtomicU64::new(0);
    let started = Instant::now();
    for iteration in 0..n {
        watchdog.input(format!("{name} iteration {iteration} (seed {seed:#x})"));
        let result = catch_unwind(AssertUnwindSafe(|| {
            if one(&mut rng) {
                opened.fetch_add(1, Ordering::Relaxed);
            }
        }));
        assert!(result.is_ok(), "fuzz: PANIC in {name} at iteration {iteration} (seed {seed:#x})");
    }
    eprintln!(
        "fuzz: {name}: {n} inputs, {} opened, 0 panics, 0 hangs, {:.0} inputs/s, peak RSS {} MiB",
        opened.load(Ordering::Relaxed),
        n as f64 / started.elapsed().as_secs_f64(),
        peak_rss_mib()
    );
}

#[test]
fn whole_sources_never_panic_hang_or_grow_on_mutated_input() {
    limit_address_space();
    let watchdog = Watchdog::start();
    let n = iterations();
    let only = std::env::var("VIRTPROF_FUZZ_TARGET").ok();
    let wanted = |t: &str| only.as_deref().is_none_or(|o| o == t);

    if wanted("recording") {
        let seed = std::fs::read(here("tests/fixtures/pvm-pio-user.vprec")).unwrap();
        run_target("recording", 0x7ec0_4d1e, n, &watchdog, |rng| {
            let bytes = mutate_recording(rng, &seed);
            watchdog.holding(&bytes);
            let Ok(session) = Session::from_bytes(bytes, "fuzz.vprec") else { return false };
            analyse(&session);
            true
        });
    }
    if wanted("tracedat") {
        let original = trace_fixture("kvm-amd-run5_tracecmd_2vcpu_pinned/trace.dat");
        let mut seeds = vec![std::fs::read(&original).unwrap()];
        seeds.extend(trace_dat_variants(&original));
        run_target("tracedat", 0x7d47_0001, n, &watchdog, |rng| {
            let mut bytes = seeds[rng.below(seeds.len())].clone();
            // Most mutations in the headers and options, where the structure is.
            let from = if rng.below(2) == 0 { 0 } else { rng.below(bytes.len()) };
            let from = from.min(bytes.len().saturating_sub(1));
            mutate_bytes(rng, &mut bytes, from);
            watchdog.holding(&bytes);
            let Ok(session) = Session::trace_dat_from_bytes(bytes, "fuzz.dat") else { return false };
            analyse(&session);
            true
        });
    }
    if wanted("perfdata") {
        let seed = std::fs::read(here("tests/fixtures/pvm-pio-user-2x40.perf.data")).unwrap();
        let dir = std::env::temp_dir().join(format!("virtprof-fuzz-perf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let input = dir.join("fuzz.perf.data");
        run_target("perfdata", 0x9e4f_0003, n, &watchdog, |rng| {
            let mut bytes = seed.clone();
            let from = if rng.below(2) == 0 { 0 } else { rng.below(bytes.len()) };
            let from = from.min(bytes.len().saturating_sub(1));
            mutate_bytes(rng, &mut bytes, from);
            if !bytes.starts_with(b"PERFILE2") {
                bytes[..8].copy_from_slice(b"PERFILE2");
            }
            watchdog.holding(&bytes);
            std::fs::write(&input, &bytes).unwrap();
            let Ok(session) = Session::open_any(&input, &Default::default()) else { return false };
            analyse(&session);
            true
        });
        let _ = std::fs::remove_dir_all(&dir);
    }
    if wanted("pair") {
        let host = Session::open_any(&trace_fixture("kvm-amd-pair-attach/host.dat"), &Default::default()).unwrap();
        let seed = std::fs::read(trace_fixture("kvm-amd-pair-attach/guest.dat")).unwrap();
        let dir = std::env::temp_dir().join(format!("virtprof-fuzz-pair-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let input = dir.join("guest.dat");
        run_target("pair", 0x9a12_0004, n, &watchdog, |rng| {
            let mut bytes = seed.clone();
            // Mostly the last options section (TIME_SHIFT, TSC2NSEC), 195 bytes from the end.
            let from = if rng.below(4) == 0 { rng.below(bytes.len()) } else { bytes.len().saturating_sub(200) };
            mutate_bytes(rng, &mut bytes, from);
            watchdog.holding(&bytes);
            std::fs::write(&input, &bytes).unwrap();
            let Ok(guest) = virtprof_session::GuestTrace::open(&host, &input, &Default::default()) else {
                return false;
            };
            let Ok(mut decoder) = guest.session.decoder(&["sched", "irq"]) else { return false };
            let mut events = 0u64;
            guest.walk(&mut decoder, |_, _| events += 1).is_ok()
        });
        let _ = std::fs::remove_dir_all(&dir);
    }
    if wanted("bombs") {
        let perf_seed = std::fs::read(here("tests/fixtures/pvm-pio-user-2x40.perf.data")).unwrap();
        let dir = std::env::temp_dir().join(format!("virtprof-fuzz-bombs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let input = dir.join("bomb");
        // Each input compresses up to 32 MiB: a tenth of the other targets' count.
        run_target("bombs", 0xb0b5_0005, n.div_ceil(10), &watchdog, |rng| {
            let mut bytes = if rng.below(5) == 0 {
                support::bombs::perf_data_zstd(&perf_seed, 8 << rng.below(27))
            } else {
                let codec = [Codec::Zstd, Codec::Zlib, Codec::None][rng.below(3)];
                let cpu_bits = rng.below(12);
                let bomb = DatBomb {
                    version: if rng.below(4) == 0 { 6 } else { 7 },
                    codec,
                    cpus: 1 + rng.below(1 << cpu_bits) as u32,
                    chunk_pages: 1 << rng.below(14),
                    chunks: 1 + rng.below(3),
                    shared: rng.below(3) == 0,
                    formats_options: 1 + usize::from(rng.below(8) == 0) * rng.below(100),
                    instances: usize::from(rng.below(8) == 0) * rng.below(100),
                };
                // A bomb's data is its bytes' bulk: at most 64 MiB made per input.
                let raw = codec == Codec::None || bomb.version == 6;
                let stored = if bomb.shared { 1 } else { bomb.cpus as usize };
                if raw && stored * bomb.chunk_pages * bomb.chunks > 16 << 10 {
                    return false;
                }
                support::bombs::trace_dat(&bomb)
            };
            if rng.below(2) == 0 {
                let from = rng.below(bytes.len().min(4096));
                mutate_bytes(rng, &mut bytes, from);
            }
            watchdog.holding(&bytes);
            std::fs::write(&input, &bytes).unwrap();
            let Ok(session) = Session::open_any(&input, &Default::default()) else { return false };
            analyse(&session);
            true
        });
        let _ = std::fs::remove_dir_all(&dir);
    }
    if wanted("text") {
        let root = trace_fixture("kvm-amd-run3_2vcpu_2cpu_pinned/tracefs");
        let text: String =
            std::fs::read_to_string(root.join("trace")).unwrap().lines().take(400).collect::<Vec<_>>().join("\n");
        let dir = std::env::temp_dir().join(format!("virtprof-fuzz-text-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let input = dir.join("trace.txt");
        run_target("text", 0x7e47_0002, n, &watchdog, |rng| {
            let mutated = mutate_text(rng, &text);
            watchdog.holding(mutated.as_bytes());
            std::fs::write(&input, mutated).unwrap();
            let Ok(session) = Session::open_any(
                &input,
                &virtprof_session::SourceOptions { formats: Some(root.clone()), ..Default::default() },
            ) else {
                return false;
            };
            analyse(&session);
            true
        });
        let _ = std::fs::remove_dir_all(&dir);
    }
}
