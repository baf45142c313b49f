//! `top --agent`: guests seen from inside, live. One link thread per agent keeps its recent
//! rows and noise periods; each refresh turns them into one line per guest: CPU split (steal
//! included), the busiest application counters, its OS noise (`agent --noise`), the clock
//! bound, or why it is not there.

use std::collections::VecDeque;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use serde::Serialize;
use virtprof_agent::link::{run, LinkConfig, LinkEvent};
use virtprof_agent::transport::Address;
use virtprof_host::monotonic_ns;
use virtprof_model::guest::{Alignment, GuestSeries, NoiseSummary, SeriesKind};

/// Rows kept per guest: the longest window `top` shows (10 s) at 10 ms rows.
const KEPT_ROWS: usize = 1000;
/// Noise periods kept per guest: 10 s of 10 ms periods on 16 CPUs.
const KEPT_PERIODS: usize = 16_000;

/// What `top` shows for one guest over a window.
#[derive(Debug, Clone, Serialize)]
pub struct GuestLive {
    pub agent: usize,
    pub address: String,
    pub name: String,
    /// Rows in the window.
    pub rows: usize,
    /// Percent of the guest's CPU time: user, system, steal, idle...
    pub cpu_pct: Vec<(String, f64)>,
    /// Application counters per second, busiest first.
    pub app_per_s: Vec<(String, f64)>,
    /// The guest's OS noise over the window (`agent --noise`), all measured CPUs together.
    pub noise: Option<NoiseLive>,
    /// The clock alignment's bound at the latest point, ns.
    pub bound_ns: Option<u64>,
    /// Why there are no rows now (a gap's cause), if there are none.
    pub status: Option<String>,
}

/// A guest's noise over a window.
#[derive(Debug, Clone, Copy, Serialize, Default)]
pub struct NoiseLive {
    /// The periods in the window, summed.
    #[serde(flatten)]
    pub summary: NoiseSummary,
    /// Share of measured time that was noise, %.
    pub noise_pct: f64,
}

#[derive(Default)]
struct Shared {
    name: String,
    series: Vec<GuestSeries>,
    /// (host end time, guest row length ns, values) of recent rows.
    rows: VecDeque<(u64, u64, Vec<f64>)>,
    /// (host end time, figures) of recent periods.
    noise: VecDeque<(u64, NoiseSummary)>,
    alignment: Alignment,
    status: Option<String>,
}

/// The running links.
pub struct Guests {
    links: Vec<(Address, Arc<Mutex<Shared>>, JoinHandle<()>)>,
    stop: Arc<AtomicBool>,
}

impl Guests {
    /// Start a link per agent.
    pub fn start(agents: &[(Address, Option<String>)]) -> std::io::Result<Guests> {
        let stop = Arc::new(AtomicBool::new(false));
        let mut links = Vec::new();
        for (i, (address, token)) in agents.iter().enumerate() {
            let shared = Arc::new(Mutex::new(Shared { status: Some("connecting".into()), ..Default::default() }));
            let (config, state, stop) = (live_link(address, token), shared.clone(), stop.clone());
            let handle = std::thread::Builder::new().name(format!("virtprof-agent-{i}")).spawn(move || {
                run(&config, &stop, &mut |event| {
                    let mut s = state.lock().unwrap_or_else(|p| p.into_inner());
                    match event {
                        LinkEvent::Connected { guest, series } => {
                            s.name = guest.hostname;
                            s.series = series;
                            s.rows.clear();
                            s.status = None;
                        }
                        LinkEvent::Schema(series) => {
                            s.series = series;
                            s.rows.clear();
                        }
                        LinkEvent::Clock(p) => s.alignment.push(p),
                        LinkEvent::Gap { cause, .. } | LinkEvent::Unreachable(cause) => s.status = Some(cause),
                        LinkEvent::Row(r) => {
                            let host_end = s.alignment.to_host(r.end_ns).map_or(monotonic_ns(), |(h, _)| h);
                            if s.rows.len() == KEPT_ROWS {
                                s.rows.pop_front();
                            }
                            s.rows.push_back((host_end, r.end_ns.saturating_sub(r.start_ns), r.values));
                            s.status = None;
                        }
                        // Samples are explained from a recording (`noise --host-recording`);
                        // live, each period is summed up.
                        LinkEvent::Noise(b) => {
                            let host_end = s.alignment.to_host(b.end_ns).map_or(monotonic_ns(), |(h, _)| h);
                            if s.noise.len() == KEPT_PERIODS {
                                s.noise.pop_front();
                            }
                            s.noise.push_back((host_end, NoiseSummary::of(&b)));
                        }
                    }
                })
                .refused
                .into_iter()
                .for_each(|why| {
                    state.lock().unwrap_or_else(|p| p.into_inner()).status = Some(format!("refused: {why}"))
                });
            })?;
            links.push((address.clone(), shared, handle));
        }
        Ok(Guests { links, stop })
    }

    /// Each guest over the last `window_ns`.
    pub fn snapshot(&self, window_ns: u64) -> Vec<GuestLive> {
        let since = monotonic_ns().saturating_sub(window_ns);
        self.links
            .iter()
            .enumerate()
            .map(|(agent, (address, shared, _))| {
                let s = shared.lock().unwrap_or_else(|p| p.into_inner());
                let recent: Vec<&(u64, u64, Vec<f64>)> = s.rows.iter().filter(|r| r.0 >= since).collect();
                let seconds = recent.iter().map(|r| r.1).sum::<u64>() as f64 / 1e9;
                let total = |i: usize| recent.iter().map(|r| r.2.get(i).copied().unwrap_or(0.0)).sum::<f64>();
                let mut cpu: Vec<(String, f64)> = Vec::new();
                let mut apps = Vec::new();
                for (i, series) in s.series.iter().enumerate() {
                    if let Some(field) = virtprof_agent::collect::cpu_field(&series.name) {
                        match cpu.iter_mut().find(|(f, _)| f == field) {
                            Some((_, v)) => *v += total(i),
                            None => cpu.push((field.to_string(), total(i))),
                        }
                    } else if series.name.starts_with("app.") && series.kind == SeriesKind::Counter && seconds > 0.0 {
                        apps.push((series.name.clone(), total(i) / seconds));
                    }
                }
                let all: f64 = cpu.iter().map(|(_, v)| v).sum();
                cpu.iter_mut().for_each(|(_, v)| *v = if all > 0.0 { 100.0 * *v / all } else { 0.0 });
                apps.sort_by(|a, b| b.1.total_cmp(&a.1));
                apps.truncate(3);
                let mut summary = NoiseSummary::default();
                s.noise.iter().filter(|p| p.0 >= since).for_each(|p| summary.add(&p.1));
                let noise = (summary.periods > 0).then(|| NoiseLive { summary, noise_pct: summary.noise_pct() });
                GuestLive {
                    agent,
                    address: address.to_string(),
                    name: s.name.clone(),
                    rows: recent.len(),
                    cpu_pct: cpu,
                    app_per_s: apps,
                    noise,
                    bound_ns: s.alignment.points().last().map(|p| p.bound_ns),
                    status: if recent.is_empty() { s.status.clone().or(Some("no rows yet".into())) } else { None },
                }
            })
            .collect()
    }
}

impl Drop for Guests {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for (_, _, handle) in self.links.drain(..) {
            let _ = handle.join();
        }
    }
}

/// A live link: rates and series held to the limits; no byte cap, as nothing is stored
/// past the window kept (the cap protects a recording's disk).
fn live_link(address: &Address, token: &Option<String>) -> LinkConfig {
    let mut config = LinkConfig::new(address.clone(), token.clone());
    config.limits.max_bytes = u64::MAX;
    config
}
