//! The decompression floor of a compressed trace.dat: the time to expand its page chunks and
//! do nothing else, with the decompressors `virtprof` itself uses (libzstd, libdeflate), the
//! file already in memory. `benches/vs_tracecmd.sh` sets `virtprof exits` against it.
//!
//! ```text
//! cargo run --release -p virtprof-trace --example expand_pages -- FILE [REPS]
//! ```
//!
//! Prints the frames, their compressed and expanded bytes, and the best of REPS (default 5)
//! wall times in milliseconds two ways: one thread expanding every frame (what `zstd -d` of
//! the pages alone would take) and one thread per CPU (the parallelism `exits` has). The
//! file's metadata sections are left out, so the floor is the pages' alone.

use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use virtprof_trace::segment::{Segment, SegmentError};
use virtprof_trace::tracedat;

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let (Some(path), reps) = (args.next(), args.next()) else {
        eprintln!("usage: expand_pages FILE [REPS]");
        return ExitCode::from(2);
    };
    let reps = match reps.map(|r| r.parse::<u32>()) {
        None => 5,
        Some(Ok(n)) if n > 0 => n,
        Some(_) => {
            eprintln!("expand_pages: REPS must be a positive whole number");
            return ExitCode::from(2);
        }
    };
    let data = match std::fs::read(&path) {
        Ok(data) => data,
        Err(e) => {
            eprintln!("expand_pages: {path}: {e}");
            return ExitCode::from(2);
        }
    };
    let file = match tracedat::read(&data) {
        Ok(file) => file,
        Err(e) => {
            eprintln!("expand_pages: {path}: {e}");
            return ExitCode::from(2);
        }
    };
    let cpus: Vec<Vec<Segment<'_>>> = file.cpus().into_iter().map(|(_, segments)| segments).collect();
    let frames: Vec<&Segment<'_>> = cpus.iter().flatten().filter(|s| s.is_compressed()).collect();
    if frames.is_empty() {
        eprintln!("expand_pages: {path}: no compressed page chunks (nothing to expand)");
        return ExitCode::from(2);
    }
    let compressed: usize = frames.iter().map(|s| compressed_len(s)).sum();
    let expanded: usize = frames.iter().map(|s| s.len()).sum();
    let serial = best_of(reps, || expand_all(frames.iter().copied()));
    let parallel = best_of(reps, || {
        std::thread::scope(|scope| {
            let workers: Vec<_> =
                cpus.iter().map(|segments| scope.spawn(move || expand_all(segments.iter()))).collect();
            workers.into_iter().try_for_each(|w| w.join().expect("an expanding thread panicked"))
        })
    });
    match (serial, parallel) {
        (Ok(serial), Ok(parallel)) => {
            let line = format!(
                "expand_pages: {} frames, {compressed} compressed bytes into {expanded}; best of {reps}: serial {:.1} ms, per CPU in parallel {:.1} ms",
                frames.len(),
                ms(serial),
                ms(parallel)
            );
            // A closed pipe or a full disk is said, not a panic.
            match writeln!(std::io::stdout(), "{line}") {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("expand_pages: writing the result: {e}");
                    ExitCode::from(1)
                }
            }
        }
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("expand_pages: {path}: {e}");
            ExitCode::from(2)
        }
    }
}

/// Expand every compressed segment into one reused buffer, as a walk does.
fn expand_all<'s, 'a: 's>(segments: impl Iterator<Item = &'s Segment<'a>>) -> Result<(), SegmentError> {
    let mut buffer = Vec::new();
    for segment in segments.filter(|s| s.is_compressed()) {
        std::hint::black_box(segment.pages(&mut buffer)?);
    }
    Ok(())
}

fn compressed_len(segment: &Segment<'_>) -> usize {
    match segment {
        Segment::Frame { frame, .. } => frame.len(),
        Segment::Pages(_) => 0,
    }
}

/// The shortest wall time of `reps` runs of `work` (its first error, if any).
fn best_of(reps: u32, mut work: impl FnMut() -> Result<(), SegmentError>) -> Result<Duration, SegmentError> {
    let mut best = Duration::MAX;
    for _ in 0..reps {
        let start = Instant::now();
        work()?;
        best = best.min(start.elapsed());
    }
    Ok(best)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
