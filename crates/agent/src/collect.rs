//! What the agent samples inside the guest each interval, as one row of values: per-CPU time
//! from /proc/stat (steal included), /proc/schedstat, /proc/interrupts, chosen /proc/vmstat
//! counters, network interfaces (/proc/net/dev) and disks (/proc/diskstats), perf software
//! counters per CPU (hardware ones where the guest has a vPMU), and application counter files. Counters are sent as their increase over the row, gauges as
//! their level; a source the guest does not offer is listed with its reason, never sent as
//! zeros.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use perf_event_names::{hardware_specs, software_specs};
use virtprof_host::procfs::ProcFile;
use virtprof_interval::counters::{per_cpu_specs, CounterEvent, CounterSpec, Counters, Target};
use virtprof_interval::procstat::{ProcStat, FIELDS};
use virtprof_model::guest::{GuestSeries, SeriesKind, MARKER_AFTER, MARKER_BEFORE};

use crate::appcounters::CounterFile;
use crate::marker::Marker;

/// /proc/vmstat counters sent (the ones that explain a stall): name and kind.
const VMSTAT: [(&str, SeriesKind); 9] = [
    ("pgfault", SeriesKind::Counter),
    ("pgmajfault", SeriesKind::Counter),
    ("pgpgin", SeriesKind::Counter),
    ("pgpgout", SeriesKind::Counter),
    ("pswpin", SeriesKind::Counter),
    ("pswpout", SeriesKind::Counter),
    ("pgscan_kswapd", SeriesKind::Counter),
    ("oom_kill", SeriesKind::Counter),
    ("nr_free_pages", SeriesKind::Gauge),
];

/// /proc/net/dev columns sent per interface: (series suffix, column after the name, unit).
const NET_DEV: [(&str, usize, &str); 4] =
    [("rx_bytes", 0, "bytes"), ("rx_packets", 1, "events"), ("tx_bytes", 8, "bytes"), ("tx_packets", 9, "events")];

/// Lines before the first `NAME:` line of /proc/interrupts (the CPU names) and /proc/net/dev.
const INTERRUPTS_HEADER: usize = 1;
const NET_DEV_HEADER: usize = 2;

/// The `NAME: rest` lines of a /proc table after its `header` lines, names trimmed.
fn labelled_lines(text: &str, header: usize) -> impl Iterator<Item = (&str, &str)> {
    text.lines().skip(header).filter_map(|line| line.split_once(':').map(|(name, rest)| (name.trim(), rest)))
}

/// `out[k]` = the number in `words` at the k-th wanted column (columns ascending) times its
/// scale; a column the line lacks or cannot parse leaves its slot as it was.
fn read_columns<'a>(
    mut words: impl Iterator<Item = &'a str>,
    wanted: impl Iterator<Item = (usize, f64)>,
    out: &mut [f64],
) {
    let mut next = 0;
    for ((column, scale), slot) in wanted.zip(out) {
        let Some(word) = words.nth(column - next) else { return };
        next = column + 1;
        if let Ok(value) = word.parse::<f64>() {
            *slot = value * scale;
        }
    }
}

/// /proc/diskstats columns sent per disk: (series suffix, column after the name, scale to the
/// unit, unit). Sectors are 512 bytes whatever the device's block size; time is in ms.
const DISKSTATS: [(&str, usize, f64, &str); 5] = [
    ("reads", 0, 1.0, "events"),
    ("read_bytes", 2, 512.0, "bytes"),
    ("writes", 4, 1.0, "events"),
    ("write_bytes", 6, 512.0, "bytes"),
    ("busy_ns", 9, 1e6, "ns"),
];

/// The perf events the agent counts per CPU, named as the host's interval series are.
mod perf_event_names {
    use virtprof_interval::counters::{CounterEvent, CounterSpec, Modes};

    /// `PERF_COUNT_SW_*` values (linux/perf_event.h).
    const SW_CPU_CLOCK: u64 = 0;
    const SW_PAGE_FAULTS: u64 = 2;
    const SW_CONTEXT_SWITCHES: u64 = 3;
    const SW_CPU_MIGRATIONS: u64 = 4;
    /// `PERF_COUNT_HW_*`.
    const HW_CPU_CYCLES: u64 = 0;
    const HW_INSTRUCTIONS: u64 = 1;

    pub fn software_specs() -> Vec<CounterSpec> {
        [
            ("cpu-clock", "ns", SW_CPU_CLOCK),
            ("context-switches", "events", SW_CONTEXT_SWITCHES),
            ("cpu-migrations", "events", SW_CPU_MIGRATIONS),
            ("page-faults", "events", SW_PAGE_FAULTS),
        ]
        .into_iter()
        .map(|(name, unit, config)| CounterSpec {
            metric: format!("perf.{name}"),
            unit,
            event: CounterEvent::Software(config),
        })
        .collect()
    }

    /// Cycles and instructions, user and kernel: four counters, one PMU group (no
    /// multiplexing to rotate).
    pub fn hardware_specs() -> Vec<CounterSpec> {
        let mut specs = Vec::new();
        for (name, config) in [("cycles", HW_CPU_CYCLES), ("instructions", HW_INSTRUCTIONS)] {
            for (suffix, user_only) in [("u", true), ("k", false)] {
                specs.push(CounterSpec {
                    metric: format!("perf.{name}:{suffix}"),
                    unit: "events",
                    event: CounterEvent::hardware(config, if user_only { Modes::USER } else { Modes::KERNEL }),
                });
            }
        }
        specs
    }
}

/// Settings of the sampler.
#[derive(Debug, Clone, Default)]
pub struct CollectConfig {
    /// Counter files, or folders of `*.counters` files (rescanned).
    pub counters: Vec<PathBuf>,
    /// Open perf counters (needs perf_event_paranoid ≤ 0 or CAP_PERFMON for per-CPU ones).
    pub perf: bool,
    /// With `perf`: these events per CPU instead of the built-in software and hardware sets
    /// (`agent --perf-events`, named as `record --counters` names them).
    pub perf_events: Option<Vec<CounterSpec>>,
    /// Write a marker byte to this I/O port each row (see [`crate::marker`]).
    pub marker_port: Option<u16>,
}

/// One row's sampler.
pub struct Collector {
    config: CollectConfig,
    series: Vec<GuestSeries>,
    /// Last cumulative reading of each counter series (gauges: unused).
    previous: Vec<f64>,
    /// This row's cumulative readings.
    now: Vec<f64>,
    stat: Option<ProcStat>,
    /// Column of cpuN's first /proc/stat field.
    stat_at: BTreeMap<u32, usize>,
    schedstat: Option<(ProcFile, usize)>,
    interrupts: Option<(ProcFile, BTreeMap<String, usize>, usize)>,
    vmstat: Option<(ProcFile, usize)>,
    /// /proc/net/dev and /proc/diskstats: the file and the first column of each device.
    net: Option<(ProcFile, BTreeMap<String, usize>)>,
    disks: Option<(ProcFile, BTreeMap<String, usize>)>,
    perf: Vec<(Counters, usize)>,
    apps: Vec<(CounterFile, usize)>,
    marker: Option<(Marker, usize)>,
    /// Sources not offered here, with the reason.
    pub unavailable: Vec<(String, String)>,
}

impl Collector {
    /// Open every source the guest offers.
    pub fn open(config: CollectConfig) -> Collector {
        let mut c = Collector {
            config,
            series: Vec::new(),
            previous: Vec::new(),
            now: Vec::new(),
            stat: None,
            stat_at: BTreeMap::new(),
            schedstat: None,
            interrupts: None,
            vmstat: None,
            net: None,
            disks: None,
            perf: Vec::new(),
            apps: Vec::new(),
            marker: None,
            unavailable: Vec::new(),
        };
        c.open_stat();
        c.open_schedstat();
        c.open_interrupts();
        c.open_vmstat();
        c.open_net();
        c.open_disks();
        if c.config.perf {
            c.open_perf();
        }
        if let Some(port) = c.config.marker_port {
            c.open_marker(port);
        }
        // Application series go last (they come and go).
        c.rescan_apps();
        c.now = vec![0.0; c.series.len()];
        c.sample_into_now();
        c.previous = c.now.clone();
        c
    }

    /// The columns of the rows.
    pub fn series(&self) -> &[GuestSeries] {
        &self.series
    }

    fn add(&mut self, s: GuestSeries) -> usize {
        self.series.push(s);
        self.series.len() - 1
    }

    fn open_stat(&mut self) {
        match ProcStat::open().and_then(|mut s| s.cpus().map(|cpus| (s, cpus))) {
            Ok((stat, cpus)) => {
                for cpu in cpus {
                    let at = self.series.len();
                    for f in FIELDS {
                        self.add(GuestSeries::counter(format!("cpu{cpu}.{f}_ns"), "ns"));
                    }
                    self.stat_at.insert(cpu, at);
                }
                self.stat = Some(stat);
            }
            Err(e) => self.unavailable.push(("/proc/stat".into(), e.to_string())),
        }
    }

    fn open_schedstat(&mut self) {
        let opened = ProcFile::open("/proc/schedstat").and_then(|mut f| {
            let cpus = f.read()?.lines().filter(|l| l.starts_with("cpu")).count();
            Ok((f, cpus))
        });
        match opened {
            Ok((f, cpus)) => {
                let at = self.series.len();
                for cpu in 0..cpus {
                    self.add(GuestSeries::counter(format!("cpu{cpu}.sched_run_ns"), "ns"));
                    self.add(GuestSeries::counter(format!("cpu{cpu}.sched_wait_ns"), "ns"));
                    self.add(GuestSeries::counter(format!("cpu{cpu}.sched_timeslices"), "events"));
                }
                self.schedstat = Some((f, at));
            }
            Err(e) => self.unavailable.push(("/proc/schedstat".into(), e.to_string())),
        }
    }

    fn open_interrupts(&mut self) {
        let opened = ProcFile::open("/proc/interrupts").and_then(|mut f| {
            let names: Vec<String> = labelled_lines(f.read()?, INTERRUPTS_HEADER).map(|(n, _)| n.into()).collect();
            Ok((f, names))
        });
        match opened {
            Ok((f, names)) => {
                let at = self.series.len();
                let mut columns = BTreeMap::new();
                for name in names {
                    let i = self.add(GuestSeries::counter(format!("irq.{name}"), "events"));
                    columns.insert(name, i);
                }
                self.interrupts = Some((f, columns, at));
            }
            Err(e) => self.unavailable.push(("/proc/interrupts".into(), e.to_string())),
        }
    }

    fn open_vmstat(&mut self) {
        match ProcFile::open("/proc/vmstat") {
            Ok(f) => {
                let at = self.series.len();
                for (name, kind) in VMSTAT {
                    let unit = if kind == SeriesKind::Gauge { "pages" } else { "events" };
                    self.add(GuestSeries { name: format!("vmstat.{name}"), unit: unit.into(), kind });
                }
                self.vmstat = Some((f, at));
            }
            Err(e) => self.unavailable.push(("/proc/vmstat".into(), e.to_string())),
        }
    }

    /// Every interface there at the start (one that comes later is not followed).
    fn open_net(&mut self) {
        let opened = ProcFile::open("/proc/net/dev").and_then(|mut f| {
            let names: Vec<String> = labelled_lines(f.read()?, NET_DEV_HEADER).map(|(n, _)| n.into()).collect();
            Ok((f, names))
        });
        match opened {
            Ok((f, names)) => {
                let mut columns = BTreeMap::new();
                for name in names {
                    let at = self.series.len();
                    for (suffix, _, unit) in NET_DEV {
                        self.add(GuestSeries::counter(format!("net.{name}.{suffix}"), unit));
                    }
                    columns.insert(name, at);
                }
                self.net = Some((f, columns));
            }
            Err(e) => self.unavailable.push(("/proc/net/dev".into(), e.to_string())),
        }
    }

    /// Whole disks (those /sys/block lists; partitions would count their I/O twice), without
    /// the loop and RAM devices.
    fn open_disks(&mut self) {
        let disks: Vec<String> = match std::fs::read_dir("/sys/block") {
            Ok(entries) => entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| !n.starts_with("loop") && !n.starts_with("ram"))
                .collect(),
            Err(e) => {
                self.unavailable.push(("/sys/block".into(), e.to_string()));
                return;
            }
        };
        match ProcFile::open("/proc/diskstats") {
            Ok(f) => {
                let mut columns = BTreeMap::new();
                for name in disks {
                    let at = self.series.len();
                    for (suffix, _, _, unit) in DISKSTATS {
                        self.add(GuestSeries::counter(format!("disk.{name}.{suffix}"), unit));
                    }
                    columns.insert(name, at);
                }
                self.disks = Some((f, columns));
            }
            Err(e) => self.unavailable.push(("/proc/diskstats".into(), e.to_string())),
        }
    }

    fn open_perf(&mut self) {
        let cpus: Vec<u32> = self.stat_at.keys().copied().collect();
        let families = match &self.config.perf_events {
            Some(chosen) => {
                for t in chosen.iter().filter(|s| matches!(s.event, CounterEvent::Tracepoint(_))) {
                    let why = "a tracepoint is not counted per CPU (in a CPU's counter group it counts nothing); \
                               the host's trace counts this guest's exits";
                    self.unavailable.push((t.metric.clone(), why.into()));
                }
                // Named as the host names its per-CPU counters; those over the guest's 4
                // counters take turns (their share in `.mux` series).
                vec![(per_cpu_specs(chosen), 4)]
            }
            None => vec![(software_specs(), 0), (hardware_specs(), 4)],
        };
        for (specs, hw) in families {
            for &cpu in &cpus {
                let (counters, refused) = Counters::open(Target::Cpu(cpu), &specs, hw);
                // The same reasons on every CPU: said for the first.
                for (metric, why) in refused.iter().filter(|_| cpu == cpus[0]) {
                    let fix = if why.contains("os error 13") {
                        " (counting a whole CPU needs perf_event_paranoid ≤ 0, CAP_PERFMON or root)"
                    } else if why.contains("no PMU") {
                        " (a guest needs a vPMU)"
                    } else {
                        ""
                    };
                    self.unavailable.push((metric.clone(), format!("{why}{fix}")));
                }
                if counters.columns().is_empty() {
                    continue;
                }
                let at = self.series.len();
                for (metric, unit, kind) in counters.columns() {
                    // Hardware columns come with their multiplex ratio, a level.
                    let kind = match kind {
                        virtprof_model::interval::SeriesKind::Delta => SeriesKind::Counter,
                        _ => SeriesKind::Gauge,
                    };
                    self.add(GuestSeries { name: format!("cpu{cpu}.{metric}"), unit: unit.to_string(), kind });
                }
                self.perf.push((counters, at));
            }
        }
    }

    fn open_marker(&mut self, port: u16) {
        match Marker::open(port) {
            Ok(m) => {
                let at = self.add(GuestSeries::gauge(MARKER_BEFORE, "ns"));
                self.add(GuestSeries::gauge(MARKER_AFTER, "ns"));
                self.marker = Some((m, at));
            }
            Err(e) => self.unavailable.push((format!("marker port {port:#x}"), e.to_string())),
        }
    }

    /// The marker port, if markers are written.
    pub fn marker_port(&self) -> Option<u16> {
        self.marker.as_ref().map(|(m, _)| m.port())
    }

    /// Look for new counter files; true if the series changed (a new schema must be sent).
    pub fn rescan_apps(&mut self) -> bool {
        let mut files = Vec::new();
        for p in &self.config.counters {
            if p.is_dir() {
                if let Ok(entries) = std::fs::read_dir(p) {
                    let mut found: Vec<PathBuf> = entries
                        .filter_map(Result::ok)
                        .map(|e| e.path())
                        .filter(|p| p.extension().is_some_and(|e| e == "counters"))
                        .collect();
                    found.sort();
                    files.extend(found);
                }
            } else if p.exists() || p.extension().is_some_and(|e| e == "counters") {
                files.push(p.clone());
            }
            // A folder that is not there (yet) is not a failure: it is looked at again.
        }
        let mut changed = false;
        // Drop files that went away or were rewritten.
        let before = self.apps.len();
        self.apps.retain_mut(|(f, _)| files.iter().any(|p| p == f.path()) && f.refresh().is_ok());
        if self.apps.len() != before {
            changed = true;
            self.rebuild_app_series();
        }
        for path in files {
            if self.apps.iter().any(|(f, _)| f.path() == path) {
                continue;
            }
            match CounterFile::open(&path) {
                Ok(f) => {
                    let at = self.series.len();
                    for s in f.series() {
                        self.add(s);
                    }
                    self.apps.push((f, at));
                    changed = true;
                }
                Err(e) => {
                    let key = path.display().to_string();
                    if !self.unavailable.iter().any(|(k, _)| *k == key) {
                        self.unavailable.push((key, e.to_string()));
                    }
                }
            }
        }
        if changed {
            self.now.resize(self.series.len(), 0.0);
            self.sample_apps();
            self.previous.resize(self.series.len(), 0.0);
            for (f, at) in &self.apps {
                for i in 0..f.slots.len() {
                    self.previous[at + i] = self.now[at + i];
                }
            }
        }
        changed
    }

    /// App files sit last: after one goes away, renumber the rest.
    fn rebuild_app_series(&mut self) {
        let first_app = self.apps.iter().map(|(_, at)| *at).min().unwrap_or(self.series.len());
        let keep =
            self.series.iter().position(|s| s.name.starts_with("app.")).unwrap_or(self.series.len()).min(first_app);
        self.series.truncate(keep);
        for (f, at) in &mut self.apps {
            *at = self.series.len();
            self.series.extend(f.series());
        }
        self.now.resize(self.series.len(), 0.0);
        self.previous.resize(self.series.len(), 0.0);
    }

    fn sample_apps(&mut self) {
        for (f, at) in &mut self.apps {
            if f.refresh().is_ok() {
                for i in 0..f.slots.len() {
                    self.now[*at + i] = f.value(i) as f64;
                }
            }
        }
    }

    /// Read every source into `now` (cumulative values; perf columns are already deltas).
    fn sample_into_now(&mut self) {
        let now = &mut self.now;
        if let Some(stat) = self.stat.as_mut() {
            let at = &self.stat_at;
            let _ = stat.read(|cpu, fields| {
                if let Some(&i) = at.get(&cpu) {
                    now[i..i + 8].copy_from_slice(&fields);
                }
            });
        }
        if let Some((f, at)) = self.schedstat.as_mut() {
            if let Ok(text) = f.read() {
                for (n, line) in text.lines().filter(|l| l.starts_with("cpu")).enumerate() {
                    let v: Vec<f64> = line.split_whitespace().skip(1).filter_map(|w| w.parse().ok()).collect();
                    if v.len() >= 9 && *at + 3 * n + 3 <= now.len() {
                        now[*at + 3 * n..*at + 3 * n + 3].copy_from_slice(&v[6..9]);
                    }
                }
            }
        }
        if let Some((f, columns, _)) = self.interrupts.as_mut() {
            if let Ok(text) = f.read() {
                for (name, rest) in labelled_lines(text, INTERRUPTS_HEADER) {
                    let Some(&i) = columns.get(name) else { continue };
                    // Per-CPU counts come first; the device's name follows them.
                    now[i] = rest.split_whitespace().map_while(|w| w.parse::<f64>().ok()).sum();
                }
            }
        }
        if let Some((f, at)) = self.vmstat.as_mut() {
            if let Ok(text) = f.read() {
                for line in text.lines() {
                    let Some((name, value)) = line.split_once(' ') else { continue };
                    if let Some(k) = VMSTAT.iter().position(|(n, _)| *n == name) {
                        now[*at + k] = value.trim().parse().unwrap_or(0.0);
                    }
                }
            }
        }
        if let Some((f, columns)) = self.net.as_mut() {
            if let Ok(text) = f.read() {
                for (name, rest) in labelled_lines(text, NET_DEV_HEADER) {
                    let Some(&at) = columns.get(name) else { continue };
                    let wanted = NET_DEV.iter().map(|&(_, column, _)| (column, 1.0));
                    read_columns(rest.split_whitespace(), wanted, &mut now[at..at + NET_DEV.len()]);
                }
            }
        }
        if let Some((f, columns)) = self.disks.as_mut() {
            if let Ok(text) = f.read() {
                for line in text.lines() {
                    // MAJOR MINOR NAME then the counts.
                    let mut words = line.split_whitespace().skip(2);
                    let Some(&at) = words.next().and_then(|name| columns.get(name)) else { continue };
                    let wanted = DISKSTATS.iter().map(|&(_, column, scale, _)| (column, scale));
                    read_columns(words, wanted, &mut now[at..at + DISKSTATS.len()]);
                }
            }
        }
        self.sample_apps();
        if let Some((m, at)) = self.marker.as_mut() {
            // Exact as f64 for 104 days of uptime; NaN: no marker this row.
            let (before, after) = m.write().map_or((f64::NAN, f64::NAN), |(b, a)| (b as f64, a as f64));
            (self.now[*at], self.now[*at + 1]) = (before, after);
        }
    }

    /// One row: counters' increase since the last call, gauges' level, perf deltas.
    pub fn sample(&mut self, row: &mut Vec<f64>) {
        self.sample_into_now();
        row.clear();
        row.extend(self.series.iter().enumerate().map(|(i, s)| match s.kind {
            SeriesKind::Counter => (self.now[i] - self.previous[i]).max(0.0),
            SeriesKind::Gauge => self.now[i],
        }));
        std::mem::swap(&mut self.previous, &mut self.now);
        self.now.copy_from_slice(&self.previous);
        for (counters, at) in &mut self.perf {
            let n = counters.columns().len();
            counters.sample(&mut row[*at..*at + n]);
        }
    }
}

/// The /proc/stat field (`user`, `steal`, ...) of a per-CPU time series `cpuN.FIELD_ns`.
pub fn cpu_field(name: &str) -> Option<&str> {
    let (n, f) = name.strip_prefix("cpu")?.split_once('.')?;
    n.parse::<u32>().ok()?;
    f.strip_suffix("_ns").filter(|f| FIELDS.contains(f))
}

/// The guest's host name, kernel and clocksource.
pub fn guest_facts() -> (String, String, String) {
    let read = |p: &str| std::fs::read_to_string(p).map(|s| s.trim().to_string()).unwrap_or_default();
    (
        read("/proc/sys/kernel/hostname"),
        read("/proc/sys/kernel/osrelease"),
        read("/sys/devices/system/clocksource/clocksource0/current_clocksource"),
    )
}

/// The guest's ptp_kvm clock device, if it has one.
pub fn ptp_kvm() -> Option<String> {
    let dir = Path::new("/sys/class/ptp");
    std::fs::read_dir(dir).ok()?.filter_map(Result::ok).find_map(|e| {
        let name = std::fs::read_to_string(e.path().join("clock_name")).ok()?;
        name.trim().contains("KVM").then(|| format!("/dev/{}", e.file_name().to_string_lossy()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_lines_give_names_and_the_wanted_columns_scaled() {
        let net = "Inter-|   Receive\n face |bytes\n  eth0: 10 2 0 0 0 0 0 0 30 4 0\n    lo: 5 1\n";
        let lines: Vec<_> = labelled_lines(net, NET_DEV_HEADER).collect();
        assert_eq!(lines.iter().map(|l| l.0).collect::<Vec<_>>(), ["eth0", "lo"]);
        let mut out = [f64::NAN; 4];
        read_columns(lines[0].1.split_whitespace(), NET_DEV.iter().map(|c| (c.1, 2.0)), &mut out);
        assert_eq!(out, [20.0, 4.0, 60.0, 8.0]);
        // A short line sets what it has and leaves the rest.
        let mut out = [-1.0; 4];
        read_columns(lines[1].1.split_whitespace(), NET_DEV.iter().map(|c| (c.1, 1.0)), &mut out);
        assert_eq!(out, [5.0, 1.0, -1.0, -1.0]);
    }

    #[test]
    fn bytes_sent_over_loopback_are_counted_on_lo_and_disks_are_whole() {
        use std::io::{Read, Write};
        let mut c = Collector::open(CollectConfig::default());
        if c.net.is_none() {
            eprintln!("SKIP: no /proc/net/dev here");
            return;
        }
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut sender = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut receiver, _) = listener.accept().unwrap();
        let mut row = Vec::new();
        c.sample(&mut row);
        let sent = 4 << 20;
        let reader = std::thread::spawn(move || {
            let mut buf = vec![0u8; 64 << 10];
            let mut got = 0;
            while got < sent {
                got += receiver.read(&mut buf).unwrap();
            }
        });
        sender.write_all(&vec![7u8; sent]).unwrap();
        reader.join().unwrap();
        c.sample(&mut row);
        let col = |name: &str| c.series().iter().position(|s| s.name == name).unwrap();
        // Headers ride on top: at least the payload, and not twice it (other local traffic
        // in the meantime is small beside 4 MiB).
        let rx = row[col("net.lo.rx_bytes")];
        assert!(rx >= sent as f64 && rx < 2.0 * sent as f64, "lo received {rx} bytes for {sent}");
        assert!(c.series().iter().all(|s| !s.name.starts_with("disk.loop")), "no loop devices");
    }

    #[test]
    fn a_row_counts_this_hosts_cpu_time_and_a_counter_file() {
        let dir = std::env::temp_dir().join(format!("vp-collect-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut c = Collector::open(CollectConfig { counters: vec![dir.clone()], ..Default::default() });
        assert!(c.series().iter().any(|s| s.name == "cpu0.steal_ns"));
        assert!(c.series().iter().any(|s| s.name == "vmstat.nr_free_pages" && s.kind == SeriesKind::Gauge));
        let slots = [crate::appcounters::Slot { name: "hits".into(), kind: SeriesKind::Counter }];
        let w = crate::appcounters::CounterWriter::create(&dir.join("t.counters"), "t", &slots).unwrap();
        w.add(0, 5);
        assert!(c.rescan_apps(), "a new file changes the series");
        w.add(0, 3);
        std::thread::sleep(std::time::Duration::from_millis(50));
        let mut row = Vec::new();
        c.sample(&mut row);
        let col = |name: &str| c.series().iter().position(|s| s.name == name).unwrap();
        assert_eq!(row[col("app.t.hits")], 3.0, "the increase since the file was found");
        let cpu_ns: f64 = c
            .series()
            .iter()
            .enumerate()
            .filter(|(_, s)| s.name.starts_with("cpu") && s.name.ends_with("_ns") && !s.name.contains("sched"))
            .map(|(i, _)| row[i])
            .sum();
        assert!(cpu_ns > 0.0, "some CPU time passed");
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(!c.rescan_apps() || c.series().iter().all(|s| !s.name.starts_with("app.")));
    }
}
