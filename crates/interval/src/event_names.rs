//! Counters chosen by name (`record --counters LIST`), in the syntax `perf stat -e` takes:
//!
//! - hardware: `cycles`, `instructions`, `cache-misses`, `branch-misses`, `ref-cycles`, …
//! - software: `task-clock`, `cpu-clock`, `page-faults`, `context-switches` (`cs`), …
//! - hardware cache: `L1-dcache-load-misses`, `LLC-loads`, `dTLB-store-misses`, …
//! - tracepoints: `SYSTEM:NAME` (`kvm:kvm_exit`), counted on the thread or CPU;
//! - raw PMU codes: `rHEX` (`r003c`);
//! - a sysfs PMU's event or terms: `PMU/EVENT/` or `PMU/term=value,…/` (`msr/tsc/`,
//!   `cpu/event=0x3c,umask=0/`), resolved from `/sys/bus/event_source/devices/PMU`;
//!
//! with perf's modifiers after a colon on hardware, cache, raw and PMU events: `u` (user),
//! `k` (kernel), `h` (hypervisor), `G` (guest only), `H` (host only); `p` (precise) means
//! nothing when counting and is accepted. `default` stands for the built-in set.
//!
//! Names are checked here, before recording; whether this host can count each one is only
//! known when it is opened, and a refusal is reported per counter with the kernel's reason.

use std::path::Path;

use perf_event::events::Dynamic;
use perf_event::events::Event;

use crate::counters::{default_specs, CounterEvent, CounterSpec, Modes, TYPE_HARDWARE};

/// `PERF_TYPE_HW_CACHE` and `PERF_TYPE_RAW` (linux/perf_event.h).
const TYPE_HW_CACHE: u32 = 3;
const TYPE_RAW: u32 = 4;

/// Generic hardware events (`PERF_COUNT_HW_*`), by every name perf gives them.
const HARDWARE: [(&str, u64); 13] = [
    ("cycles", 0),
    ("cpu-cycles", 0),
    ("instructions", 1),
    ("cache-references", 2),
    ("cache-misses", 3),
    ("branches", 4),
    ("branch-instructions", 4),
    ("branch-misses", 5),
    ("bus-cycles", 6),
    ("stalled-cycles-frontend", 7),
    ("idle-cycles-frontend", 7),
    ("stalled-cycles-backend", 8),
    ("ref-cycles", 9),
];

/// Software events (`PERF_COUNT_SW_*`) with their units. bpf-output (10) only samples.
const SOFTWARE: [(&str, u64, &str); 14] = [
    ("cpu-clock", 0, "ns"),
    ("task-clock", 1, "ns"),
    ("page-faults", 2, "count"),
    ("faults", 2, "count"),
    ("context-switches", 3, "count"),
    ("cs", 3, "count"),
    ("cpu-migrations", 4, "count"),
    ("migrations", 4, "count"),
    ("minor-faults", 5, "count"),
    ("major-faults", 6, "count"),
    ("alignment-faults", 7, "count"),
    ("emulation-faults", 8, "count"),
    ("dummy", 9, "count"),
    ("cgroup-switches", 11, "count"),
];

/// Hardware cache ids (`PERF_COUNT_HW_CACHE_*`), as perf spells them.
const CACHES: [(&str, u64); 7] =
    [("l1-dcache", 0), ("l1-icache", 1), ("llc", 2), ("dtlb", 3), ("itlb", 4), ("branch", 5), ("node", 6)];

/// Cache operations: (access form, miss form, `PERF_COUNT_HW_CACHE_OP_*`).
const CACHE_OPS: [(&str, &str, u64); 3] =
    [("loads", "load-misses", 0), ("stores", "store-misses", 1), ("prefetches", "prefetch-misses", 2)];

/// The most events one list may name.
pub const MAX_COUNTERS: usize = 256;

/// Parse a `--counters` list against this host's tracefs and sysfs PMUs (`pmus`, normally
/// `/sys/bus/event_source/devices`). The error names the entry and what is accepted.
pub fn parse_counters(list: &str, tracefs: &Path, pmus: &Path) -> Result<Vec<CounterSpec>, String> {
    let mut specs: Vec<CounterSpec> = Vec::new();
    for entry in split_list(list)? {
        let added = if entry == "default" { default_specs(tracefs) } else { vec![parse_one(entry, tracefs, pmus)?] };
        for spec in added {
            if specs.iter().any(|s| s.metric == spec.metric) {
                return Err(format!("'{entry}' is listed twice"));
            }
            specs.push(spec);
        }
    }
    if specs.is_empty() {
        return Err("an empty list; e.g. task-clock,cycles:u,kvm:kvm_exit".into());
    }
    // Each event is a file descriptor per CPU and per vCPU thread.
    if specs.len() > MAX_COUNTERS {
        return Err(format!("{} events; at most {MAX_COUNTERS}", specs.len()));
    }
    Ok(specs)
}

/// Entries separated by commas, except those inside a PMU's `/…/` (`cpu/event=1,umask=2/`).
fn split_list(list: &str) -> Result<Vec<&str>, String> {
    let mut entries = Vec::new();
    let (mut start, mut slashes) = (0, 0);
    for (i, ch) in list.char_indices() {
        match ch {
            '/' => slashes += 1,
            ',' if slashes % 2 == 0 => {
                entries.push(list[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    if slashes % 2 != 0 {
        return Err(format!("'{}': a PMU event is PMU/…/, and this one is not closed", list[start..].trim()));
    }
    entries.push(list[start..].trim());
    Ok(entries.into_iter().filter(|e| !e.is_empty()).collect())
}

fn parse_one(entry: &str, tracefs: &Path, pmus: &Path) -> Result<CounterSpec, String> {
    let spec = |event, unit| CounterSpec { metric: format!("perf.{entry}"), unit, event };
    if let Some((pmu, rest)) = entry.split_once('/') {
        let (terms, mods) = rest.rsplit_once('/').ok_or_else(|| format!("'{entry}': a PMU event is PMU/…/"))?;
        let modes = modes(entry, mods.strip_prefix(':').unwrap_or(mods))?;
        let [type_, config, config1, config2] = pmu_event(entry, pmu, terms, pmus)?;
        let type_ = u32::try_from(type_).map_err(|e| format!("'{entry}': {e}"))?;
        return Ok(spec(CounterEvent::Pmu { type_, config, config1, config2, modes }, "count"));
    }
    // A tracepoint's name has a colon too: `kvm:kvm_exit`, never modifiers alone.
    if let Some((system, name)) = entry.split_once(':') {
        if let Some(id) = tracepoint_id(tracefs, system, name) {
            return Ok(spec(CounterEvent::Tracepoint(id), "count"));
        }
        if !is_named_event(system) {
            return Err(format!(
                "'{entry}': no tracepoint {system}:{name} on this kernel ({} lists them)",
                tracefs.join("events").join(system).display()
            ));
        }
    }
    let (name, mods) = entry.split_once(':').unwrap_or((entry, ""));
    let modes = modes(entry, mods)?;
    if let Some(&(_, config, unit)) = SOFTWARE.iter().find(|(n, ..)| *n == name) {
        if !mods.is_empty() {
            return Err(format!(
                "'{entry}': modifiers apply to hardware, cache, raw and PMU events, not software ones"
            ));
        }
        return Ok(spec(CounterEvent::Software(config), unit));
    }
    let event = |type_, config| CounterEvent::Pmu { type_, config, config1: 0, config2: 0, modes };
    if let Some(&(_, config)) = HARDWARE.iter().find(|(n, _)| *n == name) {
        return Ok(spec(event(TYPE_HARDWARE, config), "count"));
    }
    if let Some(config) = cache_config(name) {
        return Ok(spec(event(TYPE_HW_CACHE, config), "count"));
    }
    if let Some(config) = raw_config(name) {
        return Ok(spec(event(TYPE_RAW, config), "count"));
    }
    Err(format!(
        "'{entry}': not an event perf knows on this host; give a hardware event (cycles, instructions, cache-misses, \
         branch-misses, ref-cycles), a software one (task-clock, cpu-clock, page-faults, context-switches, \
         cpu-migrations), a cache event (L1-dcache-load-misses, LLC-loads), a tracepoint (SYSTEM:NAME, as in \
         /sys/kernel/tracing/events), a raw code (r003c) or a PMU event (PMU/EVENT/ or PMU/term=value/; `perf list` \
         shows them)"
    ))
}

/// Whether `name` is a hardware, software, cache or raw event (so what follows its colon
/// is modifiers, not a tracepoint's name).
fn is_named_event(name: &str) -> bool {
    HARDWARE.iter().any(|(n, _)| *n == name)
        || SOFTWARE.iter().any(|(n, ..)| *n == name)
        || cache_config(name).is_some()
        || raw_config(name).is_some()
}

/// `rHEX` → its raw config.
fn raw_config(name: &str) -> Option<u64> {
    let hex =
        name.strip_prefix('r').filter(|h| (1..=16).contains(&h.len()) && h.chars().all(|c| c.is_ascii_hexdigit()))?;
    u64::from_str_radix(hex, 16).ok()
}

/// perf's modifier letters after a colon.
fn modes(entry: &str, letters: &str) -> Result<Modes, String> {
    let mut m = Modes::NONE;
    let (mut user, mut kernel, mut hv) = (false, false, false);
    for ch in letters.chars() {
        match ch {
            'u' => user = true,
            'k' => kernel = true,
            'h' => hv = true,
            'G' => m.exclude_host = true,
            'H' => m.exclude_guest = true,
            'p' => {}
            other => {
                return Err(format!(
                    "'{entry}': unknown modifier '{other}' (u user, k kernel, h hypervisor, G guest only, H host only)"
                ))
            }
        }
    }
    // As perf does: naming some privilege levels leaves out the others.
    if user || kernel || hv {
        (m.exclude_user, m.exclude_kernel, m.exclude_hv) = (!user, !kernel, !hv);
    }
    if m.exclude_host && m.exclude_guest {
        return Err(format!("'{entry}': G (guest only) and H (host only) leave nothing to count"));
    }
    Ok(m)
}

/// A tracepoint's id, if this kernel has it.
fn tracepoint_id(tracefs: &Path, system: &str, name: &str) -> Option<u64> {
    let plain = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if !plain(system) || !plain(name) {
        return None;
    }
    let text = std::fs::read_to_string(tracefs.join("events").join(system).join(name).join("id")).ok()?;
    text.trim().parse().ok()
}

/// `L1-dcache-load-misses` → its `PERF_TYPE_HW_CACHE` config, for the names `perf list`
/// prints (perf ignores case here).
fn cache_config(name: &str) -> Option<u64> {
    let lower = name.to_ascii_lowercase();
    CACHES.iter().find_map(|&(cache, id)| {
        let op = lower.strip_prefix(cache)?.strip_prefix('-')?;
        CACHE_OPS.iter().find_map(|&(access, miss, op_id)| {
            let result = match op {
                _ if op == access => 0,
                _ if op == miss => 1,
                _ => return None,
            };
            Some(id | op_id << 8 | result << 16)
        })
    })
}

/// `PMU/EVENT/` or `PMU/term=value,…/`, resolved from the PMU's sysfs folder under `pmus`:
/// its type, config, config1 and config2.
fn pmu_event(entry: &str, pmu: &str, terms: &str, pmus: &Path) -> Result<[u64; 4], String> {
    let plain = |s: &str| {
        !s.starts_with('.') && !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c))
    };
    if !plain(pmu) {
        return Err(format!("'{entry}': '{pmu}' is not a PMU name"));
    }
    let dir = pmus.join(pmu);
    let mut builder = Dynamic::builder(&dir).map_err(|e| {
        let have: Vec<String> = std::fs::read_dir(pmus)
            .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        format!("'{entry}': no PMU '{pmu}' on this host ({e}; it has: {})", have.join(", "))
    })?;
    for term in terms.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        match term.split_once('=') {
            Some((field, value)) => {
                let mut names: Vec<String> = builder.fields().map(|(f, _)| f.to_string()).collect();
                names.sort();
                let fields = names.join(", ");
                if field.starts_with("config") {
                    return Err(format!("'{entry}': set the PMU's own fields ({fields}) rather than {field}"));
                }
                let value = parse_number(value).ok_or_else(|| format!("'{entry}': '{value}' is not a number"))?;
                if let Err(e) = builder.field(field, value) {
                    return Err(format!("'{entry}': {e} (PMU '{pmu}' has fields {fields})"));
                }
            }
            None if terms.contains('=') => return Err(format!("'{entry}': '{term}' needs a value (term=value)")),
            None => {
                builder.event(term).map_err(|e| {
                    let events: Vec<String> = std::fs::read_dir(dir.join("events"))
                        .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
                        .unwrap_or_default();
                    format!("'{entry}': PMU '{pmu}' has no event '{term}' ({e}; it has: {})", events.join(", "))
                })?;
            }
        }
    }
    let event = builder.build().map_err(|e| format!("'{entry}': {e}"))?;
    let mut attr = perf_event_open_sys::bindings::perf_event_attr::default();
    event.update_attrs(&mut attr);
    Ok([u64::from(attr.type_), attr.config, attr.config1, attr.config2])
}

/// Decimal or 0x-hexadecimal.
fn parse_number(text: &str) -> Option<u64> {
    match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => text.parse().ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tracefs with `kvm:kvm_exit` (id 1234) and a sysfs holding a PMU `fake` (type 42)
    /// with fields event (config 0-7) and umask (config 8-15) and an event `ticks`.
    fn fixture(test: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("virtprof-event-names-{test}-{}", std::process::id()));
        let write = |path: &str, text: &str| {
            let path = dir.join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        };
        write("tracing/events/kvm/kvm_exit/id", "1234\n");
        write("pmus/fake/type", "42\n");
        write("pmus/fake/format/event", "config:0-7\n");
        write("pmus/fake/format/umask", "config:8-15\n");
        write("pmus/fake/events/ticks", "event=0x3c,umask=0x01\n");
        dir
    }

    fn parse(test: &str, list: &str) -> Result<Vec<CounterSpec>, String> {
        let dir = fixture(test);
        parse_counters(list, &dir.join("tracing"), &dir.join("pmus"))
    }

    #[test]
    fn every_kind_of_name_resolves_to_its_attributes() {
        let specs = parse("kinds", "task-clock,cs,cycles:u,L1-dcache-load-misses,LLC-stores,kvm:kvm_exit,r1a3,fake/ticks/,fake/event=0x10,umask=2/:G").unwrap();
        let events: Vec<(&str, &CounterEvent)> = specs.iter().map(|s| (s.metric.as_str(), &s.event)).collect();
        let pmu = |type_, config, modes| CounterEvent::Pmu { type_, config, config1: 0, config2: 0, modes };
        let (user, guest) = (Modes::USER, Modes { exclude_host: true, ..Modes::NONE });
        assert_eq!(
            events,
            [
                ("perf.task-clock", &CounterEvent::Software(1)),
                ("perf.cs", &CounterEvent::Software(3)),
                ("perf.cycles:u", &pmu(0, 0, user)),
                ("perf.L1-dcache-load-misses", &pmu(3, 1 << 16, Modes::NONE)),
                ("perf.LLC-stores", &pmu(3, 2 | 1 << 8, Modes::NONE)),
                ("perf.kvm:kvm_exit", &CounterEvent::Tracepoint(1234)),
                ("perf.r1a3", &pmu(4, 0x1a3, Modes::NONE)),
                ("perf.fake/ticks/", &pmu(42, 0x13c, Modes::NONE)),
                ("perf.fake/event=0x10,umask=2/:G", &pmu(42, 0x210, guest)),
            ]
        );
        assert_eq!(specs[0].unit, "ns");
    }

    #[test]
    fn default_stands_for_the_built_in_set() {
        let dir = fixture("default");
        let specs = parse("default", "default,minor-faults").unwrap();
        assert_eq!(specs.len(), default_specs(&dir.join("tracing")).len() + 1);
    }

    #[test]
    fn bad_names_are_refused_saying_what_is_accepted() {
        for (list, says) in [
            ("cycels", "not an event perf knows"),
            ("task-clock,task-clock", "listed twice"),
            ("cycles:x", "unknown modifier 'x'"),
            ("cycles:GH", "leave nothing"),
            ("task-clock:u", "not software ones"),
            ("nopmu/ticks/", "no PMU 'nopmu' on this host"),
            ("fake/tocks/", "has no event 'tocks'"),
            ("fake/colour=1/", "fields"),
            ("fake/config=1/", "rather than config"),
            ("fake/event=zz/", "not a number"),
            ("fake/ticks", "not closed"),
            ("../ticks/", "not a PMU name"),
            ("kvm:kvm_nope", "no tracepoint kvm:kvm_nope on this kernel"),
            (" , ", "empty list"),
            (&(0..300).map(|i| format!("r{i:x}")).collect::<Vec<_>>().join(","), "300 events; at most 256"),
        ] {
            let err = parse("bad", list).unwrap_err();
            assert!(err.contains(says), "{list}: {err}");
        }
    }
}
