//! `virtprof serve`: `top`'s sampler behind a Prometheus endpoint (or a node_exporter
//! textfile). The sampler is refreshed often enough that the kernel's trace buffers never fill
//! between scrapes (every 1 to 10 s, by how fast they filled), and once more at each scrape,
//! so what a scrape shows is current to within `--max-age`: a scrape that recent answers every
//! request (requests that wait together share one), so no client makes serve scrape more
//! often than that.

mod http;

use std::path::Path;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use virtprof_host::output::{write_file, Privacy};
use virtprof_host::stop::STOP_REQUESTED;

use crate::args::ServeArgs;
use crate::exit::usage;
use crate::watch::metrics::{exposition, Format, Scrape};
use http::{Latest, ScrapeJob, Scrapes};
use virtprof_engine::sampler::{Mode, Sampler};

/// How often the sampler refreshes between scrapes: at least every second while the trace
/// fills its buffers fast, at most every 10 s while it is quiet (refreshes are most of serve's
/// cost: /proc, every vCPU's KVM stats).
const REFRESH_MIN: Duration = Duration::from_secs(1);
const REFRESH_MAX: Duration = Duration::from_secs(10);
/// The textfile node_exporter reads.
const TEXTFILE: &str = "virtprof.prom";
/// The shortest `--interval` between textfile rewrites: node_exporter reads the file at its
/// own scrapes (every 15 s or so), and each rewrite costs a scrape's work.
const TEXTFILE_MIN_INTERVAL: Duration = Duration::from_secs(1);

/// The sampler and what scrapes keep between them.
pub struct Collector {
    sampler: Sampler,
    refreshed: Instant,
    /// When the next refresh is due after `refreshed`.
    next: Duration,
    /// The latest scrape, for formats not rendered yet.
    scrapes: Scrapes<Scrape>,
    /// Scrapes collected so far.
    made: u64,
}

/// Where `serve` may get its figures, from its flags.
fn mode(args: &ServeArgs) -> Mode {
    match (args.no_trace, args.trace) {
        (true, _) => Mode::Polled,
        (false, true) => Mode::Traced,
        (false, false) => Mode::Best,
    }
}

impl Collector {
    fn start(only: Vec<u32>, mode: Mode) -> anyhow::Result<Collector> {
        let (sampler, fallback) = Sampler::start(only, mode, true)?;
        if let Some(why) = &fallback.no_kernel {
            eprintln!("virtprof: in-kernel aggregation unavailable ({why}): decoding every traced event instead");
        }
        if let Some(why) = fallback.polling {
            eprintln!("virtprof: {why}: polling schedstat and KVM stats (no exit reasons, durations or traced I/O)");
        }
        Ok(Collector { sampler, refreshed: Instant::now(), next: REFRESH_MIN, scrapes: Scrapes::new(), made: 0 })
    }

    /// Drain the trace if a refresh is due.
    fn tick(&mut self) -> anyhow::Result<()> {
        if self.refreshed.elapsed() >= self.next {
            self.sampler.refresh()?;
            self.refreshed();
        }
        Ok(())
    }

    /// One scrape, as text in `format`.
    pub fn scrape(&mut self, format: Format) -> anyhow::Result<String> {
        let scrape = Arc::new(collect(&mut self.sampler, &mut self.made)?);
        self.refreshed();
        Ok(exposition(&scrape, format))
    }

    /// The text that answers `job`: from a recent enough scrape, or a new one.
    fn answer(&mut self, job: &ScrapeJob, latest: &Latest) -> anyhow::Result<Arc<str>> {
        let Collector { sampler, scrapes, made, .. } = self;
        let before = *made;
        let text = scrapes.answer(job, latest, || collect(sampler, made), exposition);
        if self.made != before {
            self.refreshed();
        }
        text
    }

    /// A refresh just happened: the next is due in a quarter of the time the fullest trace
    /// buffer would take to fill at the rate just seen. Polled counters and the in-kernel
    /// program's maps are cumulative (nothing fills between reads): only scrapes read them.
    fn refreshed(&mut self) {
        let elapsed = self.refreshed.elapsed();
        self.refreshed = Instant::now();
        self.next = if self.sampler.is_polling() || self.sampler.is_in_kernel() {
            Duration::MAX
        } else {
            next_refresh(self.sampler.buffer_fill(), elapsed)
        };
    }
}

/// One more scrape of `sampler`, counted in `made`.
fn collect(sampler: &mut Sampler, made: &mut u64) -> anyhow::Result<Scrape> {
    *made += 1;
    Ok(Scrape { scrapes: *made, ..Scrape::collect(sampler)? })
}

/// A quarter of the time a buffer filled to `fill` over `elapsed` takes to fill, within
/// [`REFRESH_MIN`, `REFRESH_MAX`].
fn next_refresh(fill: f64, elapsed: Duration) -> Duration {
    if fill <= 0.0 {
        return REFRESH_MAX;
    }
    let to_full = elapsed.as_secs_f64() / fill;
    Duration::from_secs_f64((to_full / 4.0).clamp(REFRESH_MIN.as_secs_f64(), REFRESH_MAX.as_secs_f64()))
}

pub fn run(args: &ServeArgs) -> anyhow::Result<ExitCode> {
    virtprof_host::stop::install_handler();
    let deadline = args.duration.map(|d| Instant::now() + d);
    if let Some(dir) = &args.textfile {
        check_textfile_dir(dir)?;
        if args.interval < TEXTFILE_MIN_INTERVAL {
            return Err(usage(format!(
                "--interval {:?}: rewriting the textfile more often than every {} s only costs CPU \
                 (node_exporter reads it at its own scrapes); give --interval 1s or more",
                args.interval,
                TEXTFILE_MIN_INTERVAL.as_secs()
            )));
        }
        let mut collector = Collector::start(args.vm.clone(), mode(args))?;
        return textfile(&mut collector, dir, args.interval, deadline);
    }
    let config = http::Config::from_args(args)?;
    let server = http::bind(&config, args.max_age, args.client_rate)?;
    let mut collector = Collector::start(args.vm.clone(), mode(args))?;
    // The bound address: with port 0 the kernel picked one.
    let bound = server.address;
    eprintln!(
        "virtprof: serving http{}://{bound}/metrics{}",
        if config.tls.is_some() { "s" } else { "" },
        if config.token.is_some() { " (bearer token required)" } else { "" }
    );
    while !STOP_REQUESTED.load(Ordering::Relaxed) && deadline.is_none_or(|d| Instant::now() < d) {
        collector.tick()?;
        // Short waits: a stop request or a due refresh is noticed within 100 ms. Clients are
        // read and written on their own threads; this one only scrapes.
        if let Some(job) = server.next_scrape(Duration::from_millis(100)) {
            let result = collector.answer(&job, &server.latest).map_err(|e| {
                eprintln!("virtprof: scrape failed: {e:#}");
                format!("{e:#}")
            });
            job.answer(result);
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn check_textfile_dir(dir: &Path) -> anyhow::Result<()> {
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(usage(format!("--textfile '{}': not a folder", dir.display()))),
        Err(e) => Err(usage(format!(
            "--textfile '{}': {e} (give node_exporter's --collector.textfile.directory)",
            dir.display()
        ))),
    }
}

/// Rewrite `DIR/virtprof.prom` every `interval` until stopped; each version is whole (written
/// aside and renamed), as the textfile collector may read at any moment.
fn textfile(
    collector: &mut Collector,
    dir: &Path,
    interval: Duration,
    deadline: Option<Instant>,
) -> anyhow::Result<ExitCode> {
    let path = dir.join(TEXTFILE);
    eprintln!("virtprof: writing {} every {:.1} s", path.display(), interval.as_secs_f64());
    let mut next = Instant::now() + interval;
    // The stop flag and the deadline are looked at every turn, whatever the interval.
    while !STOP_REQUESTED.load(Ordering::Relaxed) && deadline.is_none_or(|d| Instant::now() < d) {
        if Instant::now() < next {
            collector.tick()?;
            std::thread::sleep(Duration::from_millis(50));
            continue;
        }
        let text = collector.scrape(Format::Prometheus)?;
        write_file(&path, text.as_bytes(), Privacy::Shared)?;
        // A rewrite that took longer than the interval is not made up for in a burst.
        next = (next + interval).max(Instant::now());
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refreshes_come_sooner_the_faster_the_buffers_fill() {
        let second = Duration::from_secs(1);
        assert_eq!(next_refresh(0.0, second), REFRESH_MAX);
        assert_eq!(next_refresh(0.01, second), REFRESH_MAX);
        // A quarter full in 2 s: full in 8 s, drained again in 2 s.
        assert_eq!(next_refresh(0.25, 2 * second), 2 * second);
        assert_eq!(next_refresh(0.9, second), REFRESH_MIN);
        assert_eq!(next_refresh(1.0, second), REFRESH_MIN);
    }
}
