//! The live XenMon-style view of the host's VMs that `top` and `demo` open. The engine's sampler
//! gathers, [`view`] draws; this module runs the loop, the `--once` mode and the CSV log.

mod lines;
pub mod metrics;
mod tty;
pub mod view;

use std::fs::{File, OpenOptions};
use std::io::{IsTerminal, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use virtprof_host::stop::STOP_REQUESTED;

use crate::exit::usage;
use crate::qos::{log_rows, table, LOG_HEADER};
use tty::{Input, Keys};
use view::{Action, ViewState};
use virtprof_engine::sampler::{Mode, Sampler, Snapshot};
use virtprof_model::units::duration_ns;

/// How often the loop wakes between refreshes to notice SIGTERM or the demo's end.
const STOP_CHECK: Duration = Duration::from_millis(500);

/// How `top` (or `demo`) watches.
pub struct Watch<'a> {
    /// Refresh interval.
    pub delay: Duration,
    /// Only these VMM pids (empty: all).
    pub only: Vec<u32>,
    /// Print one table (or JSON) after one interval and exit.
    pub once: bool,
    /// With `once`: JSON.
    pub json: bool,
    /// Append CSV rows here.
    pub log: Option<&'a Path>,
    /// Where the figures may come from (in the kernel first; `--trace`: traced; `--no-trace`: polled).
    pub mode: Mode,
    /// Stop when this returns true (demo: its VMs ended).
    pub done: &'a dyn Fn() -> bool,
    /// Guest agents to show from inside (`top --agent`).
    pub agents: Vec<(virtprof_agent::transport::Address, Option<String>)>,
}

/// The interactive view draws on a terminal: without one (a pipe, a file, a service), say so
/// before anything starts.
pub fn check_terminal(once: bool) -> anyhow::Result<()> {
    if !once && !std::io::stdout().is_terminal() {
        return Err(usage(
            "the interactive view needs a terminal on standard output; use --once (or --once --json) to print one sample",
        ));
    }
    Ok(())
}

/// How often `--once` refreshes while it waits for its sample.
const ONCE_REFRESH: Duration = Duration::from_millis(250);

/// Where `top` and `demo` may get their figures, from their flags.
pub fn mode(args: &crate::args::WatchArgs) -> Mode {
    match (args.no_trace, args.trace) {
        (true, _) => Mode::Polled,
        (false, true) => Mode::Traced,
        (false, false) => Mode::Best,
    }
}

/// Validate a `-d SECONDS` value.
pub fn delay(seconds: f64) -> anyhow::Result<Duration> {
    if !(0.1..=3600.0).contains(&seconds) {
        return Err(usage(format!("-d {seconds}: the refresh interval must be between 0.1 and 3600 seconds")));
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// Watch VMs: once, or interactively until q, SIGINT/SIGTERM or `done`.
pub fn watch(w: &Watch<'_>) -> anyhow::Result<ExitCode> {
    check_terminal(w.once)?;
    virtprof_host::stop::install_handler();
    let mut log = match w.log {
        Some(path) => Some(open_log(path)?),
        None => None,
    };
    let (mut sampler, fallback) = Sampler::start(w.only.clone(), w.mode, false)?;
    let guests = virtprof_engine::guests::Guests::start(&w.agents)?;
    if let Some(why) = &fallback.no_kernel {
        eprintln!("virtprof: in-kernel aggregation unavailable ({why}): decoding every traced event instead");
    }
    if let Some(why) = &fallback.polling {
        eprintln!("virtprof: {why}: polling schedstat and KVM stats; figures are approximate");
    }
    if w.once {
        // Refresh along the way too: the kernel's buffers are drained before they fill, and the
        // KVM stats have a sample near the start of every window, not only at the two ends.
        let started = Instant::now();
        let mut refreshed = Instant::now();
        while started.elapsed() < w.delay && !STOP_REQUESTED.load(Ordering::Relaxed) && !(w.done)() {
            std::thread::sleep(Duration::from_millis(50).min(w.delay));
            if refreshed.elapsed() >= ONCE_REFRESH {
                sampler.refresh()?;
                refreshed = Instant::now();
            }
        }
        sampler.refresh()?;
        let mut snapshot = sampler.snapshot(None);
        snapshot.guests = guests.snapshot(duration_ns(w.delay));
        write_log(&mut log, &snapshot)?;
        print_once(&snapshot, w.json, w.delay)?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut terminal = ratatui::try_init()
        .map_err(|e| usage(format!("cannot open the terminal for the interactive view: {e}; use --once")))?;
    let stall_guard = tty::StallGuard::start()?;
    let result = interactive(&mut terminal, &mut sampler, &guests, w, &mut log);
    // A window closed or a dropped connection: what follows must not write to the dead terminal,
    // and the view's last draw failing there is how it ended, not an error.
    let result = match (tty::silence_if_hung_up(), result) {
        (true, Err(e)) if tty::is_hang_up(&e) => Ok(ExitCode::SUCCESS),
        (_, result) => result,
    };
    // Restoring fails only when the terminal is gone, and then there is nothing to restore.
    let _ = ratatui::try_restore();
    // The terminal shows its cursor again as it drops: still under the guard.
    drop(terminal);
    drop(stall_guard);
    result
}

fn interactive(
    terminal: &mut ratatui::DefaultTerminal,
    sampler: &mut Sampler,
    guests: &virtprof_engine::guests::Guests,
    w: &Watch<'_>,
    log: &mut Option<File>,
) -> anyhow::Result<ExitCode> {
    let mut state = ViewState::default();
    let cpus = sampler.cpus();
    let mut shown: Snapshot = sampler.snapshot(state.cpu);
    shown.guests = guests.snapshot(duration_ns(w.delay));
    let mut last_refresh = Instant::now();
    let keys = Keys::start()?;
    loop {
        let status = format!("refresh {:.1} s", w.delay.as_secs_f64());
        terminal.draw(|f| view::render(f, &shown, &state, &status))?;
        // Wait for the next refresh, answering keys meanwhile.
        loop {
            if STOP_REQUESTED.load(Ordering::Relaxed) || (w.done)() {
                return Ok(ExitCode::SUCCESS);
            }
            let left = w.delay.saturating_sub(last_refresh.elapsed());
            if left.is_zero() {
                break;
            }
            let key = match keys.next(left.min(STOP_CHECK))? {
                Input::Key(key) => key,
                Input::Nothing => continue,
                // The window closed or the connection dropped: end as on `q`.
                Input::Gone => return Ok(ExitCode::SUCCESS),
            };
            let cpu_before = state.cpu;
            match view::handle_key(&mut state, key, &cpus) {
                Action::Quit => return Ok(ExitCode::SUCCESS),
                Action::Redraw => {
                    if !state.paused || state.cpu != cpu_before {
                        shown = sampler.snapshot(state.cpu);
                        shown.guests = guests.snapshot(duration_ns(w.delay));
                    }
                    terminal.draw(|f| view::render(f, &shown, &state, &status))?;
                }
                Action::None => {}
            }
        }
        // Keep reading the kernel's buffers even when paused, so nothing is lost.
        sampler.refresh()?;
        last_refresh = Instant::now();
        if log.is_some() {
            write_log(log, &sampler.snapshot(None))?;
        }
        if !state.paused {
            shown = sampler.snapshot(state.cpu);
            shown.guests = guests.snapshot(duration_ns(w.delay));
        }
    }
}

fn print_once(snapshot: &Snapshot, json: bool, delay: Duration) -> anyhow::Result<()> {
    if snapshot.windows[0].vms.is_empty() {
        eprintln!("virtprof: no VM found (no process holds a readable KVM VM fd; run as root, or start one with `virtprof testvm --duration 60s`)");
    }
    let mut out = crate::output::stdout();
    if json {
        crate::output::write_json_pretty(&mut out, snapshot)?;
        return Ok(());
    }
    // The window that matches the sampling time.
    let window = if delay.as_secs_f64() <= 1.0 { &snapshot.windows[0] } else { &snapshot.windows[1] };
    writeln!(
        out,
        "last {} · mode {}{} · exits from {} · lost events {}",
        window.length_text(1),
        snapshot.mode,
        if snapshot.approximate { " (approximate)" } else { "" },
        window.exits_source,
        snapshot.lost_events
    )?;
    table(window, true).write_text(&mut out)?;
    writeln!(out, "{}", lines::energy(&snapshot.cores, snapshot.swaps_per_s, snapshot.balancer))?;
    for g in &snapshot.guests {
        writeln!(out, "{}", lines::guest(g))?;
    }
    for line in crate::qos::owner_lines(window) {
        writeln!(out, "{line}")?;
    }
    Ok(())
}

fn open_log(path: &Path) -> anyhow::Result<File> {
    // Not through a symlink: a log is appended to in place, so a planted link would make us
    // append to whatever it points at.
    let mut file =
        OpenOptions::new().create(true).read(true).append(true).custom_flags(libc::O_NOFOLLOW).open(path).map_err(
            |e| match e.raw_os_error() {
                Some(libc::ELOOP) => usage(format!(
                    "--log '{}' is a symbolic link: name the file itself (a log is appended to in place)",
                    path.display()
                )),
                _ => usage(format!("--log '{}': {e}", path.display())),
            },
        )?;
    if file.metadata().map(|m| m.len() == 0).unwrap_or(false) {
        writeln!(file, "{LOG_HEADER}")?;
        return Ok(file);
    }
    // Rows are only appended under their own header: a log begun by another version (other
    // columns) or another program would mix two layouts in one file.
    let mut head = [0u8; LOG_HEADER.len() + 1];
    let n = std::io::Read::read(&mut file, &mut head).unwrap_or(0);
    if &head[..n] != format!("{LOG_HEADER}\n").as_bytes() {
        return Err(usage(format!(
            "--log '{}': the file's first line is not this version's header ({}...); give a new file",
            path.display(),
            LOG_HEADER.split(',').take(3).collect::<Vec<_>>().join(",")
        )));
    }
    Ok(file)
}

/// Append the 1 s window's rows, stamped with wall-clock seconds since the epoch.
fn write_log(log: &mut Option<File>, snapshot: &Snapshot) -> anyhow::Result<()> {
    let Some(file) = log else { return Ok(()) };
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
    for line in log_rows(&snapshot.windows[0], now) {
        writeln!(file, "{line}")?;
    }
    file.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_is_appended_to_only_under_this_versions_header() {
        let dir = std::env::temp_dir().join(format!("virtprof-log-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("top.csv");
        drop(open_log(&log).unwrap());
        drop(open_log(&log).unwrap());
        assert_eq!(std::fs::read_to_string(&log).unwrap(), format!("{LOG_HEADER}\n"), "one header, written once");
        let old = dir.join("old.csv");
        std::fs::write(&old, "time_s,window,entity,pid,vm,vcpu,tid\n1,1s,vm,2,x,,\n").unwrap();
        let e = open_log(&old).unwrap_err();
        assert!(e.downcast_ref::<crate::exit::UsageError>().is_some() && e.to_string().contains("new file"), "{e}");
        assert!(std::fs::read_to_string(&old).unwrap().ends_with("x,,\n"), "nothing appended");
        // A planted link is refused, and what it points at is left alone.
        let link = dir.join("link.csv");
        std::os::unix::fs::symlink(&old, &link).unwrap();
        let e = open_log(&link).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        assert!(std::fs::read_to_string(&old).unwrap().ends_with("x,,\n"), "nothing appended through the link");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
