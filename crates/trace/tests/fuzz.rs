//! Mutation fuzzing of the decoders on stable Rust: pages, event formats and header_page built
//! from the real fixtures, mutated deterministically (bit flips, interesting bytes, truncation,
//! text edits). Any input must give a value or a clean error, never a panic.
//!
//! CI runs `VIRTPROF_FUZZ_ITERS` (default 50 000) inputs; the long run is
//! `VIRTPROF_FUZZ_ITERS=1000000 cargo test --release -p virtprof-trace --test fuzz`.
//! A failure prints the seed and iteration to replay it.

// Random bytes and indices are made by truncating random u64s on purpose.
#![allow(clippy::cast_possible_truncation)]

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;

use virtprof_trace::decode::{field_value, Decoder};
use virtprof_trace::dump::Dump;
use virtprof_trace::format::{parse_event_format, parse_header_page, parse_symbol_tables};
use virtprof_trace::page::Page;

use virtprof_host::fuzz::Rng;

fn iterations() -> usize {
    virtprof_host::fuzz::iterations(50_000)
}

fn fixture_dump() -> Dump {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/kvm-amd-run3_2vcpu_2cpu_pinned/tracefs");
    Dump::open(&root).unwrap()
}

fn mutate_bytes(rng: &mut Rng, data: &mut Vec<u8>) {
    const INTERESTING: [u8; 8] = [0, 0xff, 0x7f, 0x80, 0x1d, 0x1e, 0x1f, 0x01];
    for _ in 0..=rng.below(8) {
        match rng.below(6) {
            0 | 1 => {
                let i = rng.below(data.len());
                data[i] ^= 1 << rng.below(8);
            }
            2 => {
                let i = rng.below(data.len());
                data[i] = INTERESTING[rng.below(INTERESTING.len())];
            }
            // The commit word and event headers are the most sensitive places.
            3 if data.len() > 24 => {
                let i = 8 + rng.below(16);
                data[i] = rng.word() as u8;
            }
            4 if data.len() >= 4 => {
                let i = rng.below(data.len() / 4) * 4;
                data[i..i + 4].copy_from_slice(&(rng.word() as u32).to_le_bytes());
            }
            3 | 4 => {}
            _ => data.truncate(rng.below(data.len() + 1)),
        }
        if data.is_empty() {
            return;
        }
    }
}

fn mutate_text(rng: &mut Rng, text: &str) -> String {
    let mut chars: Vec<char> = text.chars().collect();
    for _ in 0..=rng.below(4) {
        if chars.is_empty() {
            break;
        }
        let i = rng.below(chars.len());
        match rng.below(5) {
            0 => {
                let end = (i + rng.below(40)).min(chars.len());
                chars.drain(i..end);
            }
            1 => chars.insert(i, ['{', '}', '(', ')', '"', ';', ':', '[', ']', '9', '-', 'é', '\n'][rng.below(13)]),
            2 => chars[i] = char::from(b'0' + rng.below(10) as u8),
            3 => {
                let end = (i + rng.below(60)).min(chars.len());
                let copy: Vec<char> = chars[i..end].to_vec();
                chars.splice(i..i, copy);
            }
            _ => chars.truncate(i),
        }
    }
    chars.into_iter().collect()
}

/// Decode one page fully, touching every field of every record.
fn decode_page(decoder: &mut Decoder, page: &[u8]) {
    let header = decoder.layout().header;
    let Ok(page) = Page::parse(page, &header) else { return };
    for rec in page.records() {
        let Ok(rec) = rec else { return };
        let _ = decoder.decode(0, &rec);
        if let Some(format) = rec.event_id().and_then(|id| decoder.layout().format(id)).cloned() {
            for f in &format.fields {
                let _ = field_value(f, rec.data);
            }
        }
    }
}

#[test]
fn decoders_never_panic_on_mutated_input() {
    let mut dump = fixture_dump();
    let page_size = dump.decoder.layout().header.page_size;
    let pages: Vec<Vec<u8>> = dump.cpus.iter().flat_map(|c| c.raw.chunks(page_size).map(<[u8]>::to_vec)).collect();
    let formats: Vec<(String, String)> = dump
        .decoder
        .layout()
        .formats()
        .iter()
        .map(|f| {
            let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/fixtures/kvm-amd-run3_2vcpu_2cpu_pinned/tracefs/events")
                .join(&f.system)
                .join(&f.name)
                .join("format");
            (f.system.clone(), std::fs::read_to_string(dir).unwrap())
        })
        .collect();
    let header_page = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/kvm-amd-run3_2vcpu_2cpu_pinned/tracefs/events/header_page"),
    )
    .unwrap();
    let seed = 0x5e_ed0f_f022_u64;
    let mut rng = Rng(seed);
    let n = iterations();
    for iteration in 0..n {
        let choice = rng.below(10);
        let result = catch_unwind(AssertUnwindSafe(|| match choice {
            0..=6 => {
                let mut page = pages[rng.below(pages.len())].clone();
                mutate_bytes(&mut rng, &mut page);
                decode_page(&mut dump.decoder, &page);
            }
            7 | 8 => {
                let (system, text) = &formats[rng.below(formats.len())];
                let text = mutate_text(&mut rng, text);
                if let Ok(f) = parse_event_format(system, &text) {
                    let _ = parse_symbol_tables(&f.print_fmt);
                    let sample = &pages[rng.below(pages.len())];
                    for field in &f.fields {
                        let _ = field_value(field, &sample[16..]);
                    }
                }
            }
            _ => {
                let _ = parse_header_page(&mutate_text(&mut rng, &header_page));
            }
        }));
        assert!(result.is_ok(), "panic at iteration {iteration} (seed {seed:#x}, choice {choice})");
    }
    // SAFETY: getrusage fills the zeroed struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    eprintln!("fuzz: {n} inputs, no panic, peak RSS {} MiB", usage.ru_maxrss / 1024);
}
