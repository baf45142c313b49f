//! The kernel's own exit histograms, kept by hist triggers in the capture's instance: each
//! kvm_exit → next kvm_entry of a thread is timed on the two events' ring-buffer timestamps
//! (the ones the trace holds) and counted per (exit_reason, isa) in the buckets of
//! `virtprof_analysis::hist`, with the exact sum, min and max. Where the trace lost nothing,
//! these equal the traced path's figures exactly; where it did, they show what it missed.
//!
//! The kernel (CONFIG_HIST_TRIGGERS) does it with:
//! - on kvm_exit, per thread: its timestamp, reason and isa saved in variables;
//! - on kvm_entry, per thread: `lat = now - exit's timestamp`, then a synthetic event
//!   `virtprof_exit_<pid>(reason, isa, lat)` (a variable is read once, so an entry with no exit
//!   since the last entry makes none);
//! - on that event: one histogram per power of two of `lat`, bucketed `lat.buckets=2^(e-5)`,
//!   so each key is one of our buckets (32 per power of two, exact below 64 ns); one keyed by
//!   reason with the sum and `onmax` of `lat` (the max), one with `onmax` of `2^62 - lat` (the
//!   min).
//!
//! Each map's `Dropped` total (an entry it had no room for) is reported, never hidden. The
//! triggers and the synthetic event are taken out when this is dropped (before the instance,
//! which the kernel will not remove while they are there), and by the reaper after a kill.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use virtprof_host::reaper::{self, Undo};
use virtprof_host::triggers;
pub use virtprof_model::kernel_hist::{KernelExitHists, ReasonHist};

use crate::error::TraceError;
use crate::tracefs::{read_file, Instance, Tracefs, SYNTHETIC_PREFIX};

/// Durations of 2^`LAST_EXP`+1 ns (36 minutes) and more are kept exact in one more map.
const LAST_EXP: u32 = 40;
/// `2^62 - lat` is largest for the smallest `lat`: its `onmax` is the minimum.
const MIN_BIAS: u64 = 1 << 62;
/// Threads the per-thread maps hold (the kernel takes powers of two up to 2^17).
const THREADS: u32 = 8192;
/// Keys each histogram holds: reasons × 32 sub-buckets of a power of two.
const KEYS: u32 = 2048;

/// The triggers, attached to an instance.
#[derive(Debug)]
pub struct ExitHistTriggers {
    root: PathBuf,
    synthetic: String,
    /// (trigger file, command), in the order written: taken out in reverse.
    attached: Vec<(PathBuf, String)>,
}

/// Why the kernel cannot keep exit histograms here, if it cannot.
pub fn unavailable(tracefs: &Tracefs) -> Option<String> {
    let root = tracefs.root();
    if !root.join("synthetic_events").is_file() || !root.join("events/sched/sched_switch/hist").is_file() {
        return Some("this kernel has no hist triggers or synthetic events (CONFIG_HIST_TRIGGERS is off)".into());
    }
    if !tracefs.has_event("kvm", "kvm_exit") || !tracefs.has_event("kvm", "kvm_entry") {
        return Some(
            "this host's KVM has no kvm_exit/kvm_entry events (a PVM host; VMX and SVM hosts have them)".into(),
        );
    }
    let format = read_file(&root.join("events/kvm/kvm_exit/format")).unwrap_or_default();
    if !format.contains(" exit_reason;") || !format.contains(" isa;") {
        return Some("this kernel's kvm_exit has no exit_reason and isa fields (an arm64 host?)".into());
    }
    None
}

impl ExitHistTriggers {
    /// Attach the triggers to `instance` (its events enabled, tracing not yet on), their
    /// timestamps on `clock` (the instance's: a hist trigger would otherwise switch the
    /// instance to the `global` clock). Refused, saying why, where [`unavailable`] says so.
    pub fn attach(tracefs: &Tracefs, instance: &Instance, clock: &str) -> Result<ExitHistTriggers, TraceError> {
        if let Some(why) = unavailable(tracefs) {
            return Err(TraceError::Unsupported(format!("the kernel's exit histograms: {why}")));
        }
        let pid = std::process::id();
        let name = format!("{SYNTHETIC_PREFIX}exit_{pid}");
        let mut this =
            ExitHistTriggers { root: tracefs.root().to_path_buf(), synthetic: name.clone(), attached: Vec::new() };
        let fields = "unsigned int reason; u32 isa; u64 lat";
        reaper::watch(&Undo::SyntheticEvent { root: this.root.clone(), name: name.clone() });
        this.write(&this.root.join("synthetic_events"), &format!("{name} {fields}"), instance)?;
        let event = |path: &str| instance.path().join("events").join(path).join("trigger");
        let v = |var: &str| format!("vp{pid}{var}");
        let per_thread = format!("hist:keys=common_pid:size={THREADS}:clock={clock}");
        let exit = format!("{per_thread}:{}=common_timestamp,{}=exit_reason,{}=isa", v("t0"), v("r"), v("i"));
        let entry = format!(
            "{per_thread}:{lat}=common_timestamp-${t0}:onmatch(kvm.kvm_exit).trace({name},${r},${i},${lat})",
            lat = v("lat"),
            t0 = v("t0"),
            r = v("r"),
            i = v("i")
        );
        this.attach_one(event("kvm/kvm_exit"), exit, instance)?;
        this.attach_one(event("kvm/kvm_entry"), entry, instance)?;
        let on_exits = event(&format!("synthetic/{name}"));
        for command in histogram_commands(&v("max"), &v("neg")) {
            this.attach_one(on_exits.clone(), command, instance)?;
        }
        Ok(this)
    }

    /// Read what the kernel counted so far (tracing stopped: nothing moves under the read).
    pub fn read(&self, instance: &Instance) -> Result<KernelExitHists, TraceError> {
        let hist = |event: &str| {
            let path = instance.path().join("events").join(event).join("hist");
            read_file(&path).map_err(TraceError::file(path))
        };
        let mut hists = parse_exit_hists(&hist(&format!("synthetic/{}", self.synthetic))?);
        for event in ["kvm/kvm_exit", "kvm/kvm_entry"] {
            hists.dropped += dropped(&hist(event)?);
        }
        Ok(hists)
    }

    fn attach_one(&mut self, file: PathBuf, command: String, instance: &Instance) -> Result<(), TraceError> {
        self.write(&file, &command, instance)?;
        self.attached.push((file, command));
        Ok(())
    }

    /// Append `text` to `file`; a refusal carries the kernel's own reason (its `error_log`).
    fn write(&self, file: &Path, text: &str, instance: &Instance) -> Result<(), TraceError> {
        triggers::append(file, text).map_err(|e| {
            let said = instance.read("error_log").ok().and_then(|log| last_error(&log)).unwrap_or_default();
            TraceError::Unsupported(format!("the kernel refused `{text}` in '{}': {e}{said}", file.display()))
        })
    }
}

impl Drop for ExitHistTriggers {
    fn drop(&mut self) {
        for (file, command) in self.attached.drain(..).rev() {
            if let Err(e) = triggers::append(&file, &format!("!{command}")) {
                log::warn!("could not remove the hist trigger in {}: {e}", file.display());
            }
        }
        match triggers::remove_synthetic_event(&self.root, &self.synthetic) {
            Ok(()) => reaper::done(&Undo::SyntheticEvent { root: self.root.clone(), name: self.synthetic.clone() }),
            Err(e) => log::warn!("could not delete synthetic event {}: {e}", self.synthetic),
        }
    }
}

/// The triggers on the synthetic event: `lat < 64` exact (each value its own bucket), one per
/// power of two above, the rest exact; then the per-reason sum with the max (`max_var`) and the
/// min (`neg_var`).
fn histogram_commands(max_var: &str, neg_var: &str) -> Vec<String> {
    let keys = |lat: &str| format!("hist:keys=reason,isa,{lat}:vals=hitcount:size={KEYS}");
    let mut commands = vec![format!("{} if lat < 64", keys("lat"))];
    for e in 6..=LAST_EXP {
        let width = 1u64 << (e - 5);
        commands.push(format!(
            "{} if lat >= {} && lat < {}",
            keys(&format!("lat.buckets={width}")),
            1u64 << e,
            1u64 << (e + 1)
        ));
    }
    commands.push(format!("{} if lat >= {}", keys("lat"), 1u64 << (LAST_EXP + 1)));
    commands
        .push(format!("hist:keys=reason,isa:vals=hitcount,lat:{max_var}=lat:size={KEYS}:onmax(${max_var}).save(lat)"));
    commands.push(format!(
        "hist:keys=reason,isa:vals=hitcount:{neg_var}={MIN_BIAS}-lat:size={KEYS}:onmax(${neg_var}).save(lat)"
    ));
    commands
}

/// The last error the instance's `error_log` holds, as ` (the kernel: ...)`.
fn last_error(log: &str) -> Option<String> {
    let line = log.lines().rev().find(|l| l.contains("error:"))?;
    let said = line.split("error:").nth(1)?.trim();
    Some(format!(" (the kernel: {said})"))
}

/// The sum of a hist file's `Dropped:` totals.
fn dropped(text: &str) -> u64 {
    text.lines().filter_map(|l| l.trim().strip_prefix("Dropped:")?.trim().parse::<u64>().ok()).sum()
}

/// The number after `name:` in a hist line (`lat: ~ 2048-2111` gives 2048).
fn field(line: &str, name: &str) -> Option<u64> {
    let rest = line.split(&format!("{name}:")).nth(1)?.trim_start().trim_start_matches('~').trim_start();
    let end = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
    rest[..end].parse().ok()
}

/// The synthetic event's hist file, every section (one per trigger) read back.
pub fn parse_exit_hists(text: &str) -> KernelExitHists {
    let mut reasons: BTreeMap<(u32, u32), ReasonHist> = BTreeMap::new();
    let mut dropped_total = 0;
    let mut buckets: BTreeMap<(u32, u32), BTreeMap<u64, u64>> = BTreeMap::new();
    for section in text.split("# event histogram").skip(1) {
        let info = section.lines().find_map(|l| l.strip_prefix("# trigger info: ")).unwrap_or_default();
        let kind = if info.contains("onmax") {
            if info.contains("-lat") {
                Section::Min
            } else {
                Section::Max
            }
        } else {
            Section::Buckets
        };
        let mut key: Option<(u32, u32)> = None;
        for line in section.lines() {
            if let Some(entry) = line.strip_prefix("{ ") {
                let (keys, values) = entry.split_once('}').unwrap_or((entry, ""));
                let reason = field(keys, "reason").and_then(|r| u32::try_from(r).ok());
                let isa = field(keys, "isa").and_then(|i| u32::try_from(i).ok());
                key = reason.zip(isa);
                let (Some(k), Some(hits)) = (key, field(values, "hitcount")) else { continue };
                match kind {
                    Section::Buckets => {
                        if let Some(lo) = field(keys, "lat") {
                            *buckets.entry(k).or_default().entry(lo).or_default() += hits;
                        }
                    }
                    Section::Max => {
                        let r = reasons.entry(k).or_default();
                        r.count = hits;
                        r.sum_ns = field(values, "lat").unwrap_or(0);
                    }
                    Section::Min => {}
                }
            } else if line.trim_start().starts_with("max:") {
                // `max: M  lat: L` under its key: L is the saved duration.
                let (Some(k), Some(lat)) = (key, field(line, "lat")) else { continue };
                let r = reasons.entry(k).or_default();
                match kind {
                    Section::Max => r.max_ns = Some(lat),
                    Section::Min => r.min_ns = Some(lat),
                    Section::Buckets => {}
                }
            }
        }
        dropped_total += dropped(section);
    }
    for (k, b) in buckets {
        reasons.entry(k).or_default().buckets = b.into_iter().collect();
    }
    let reasons = reasons.into_iter().map(|((reason, isa), r)| ReasonHist { reason, isa, ..r }).collect();
    KernelExitHists { reasons, dropped: dropped_total }
}

#[derive(Clone, Copy)]
enum Section {
    Buckets,
    Max,
    Min,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sections as the 6.1 kernel prints them (trimmed from the svm bed's).
    const HIST: &str = "# event histogram
#
# trigger info: hist:keys=reason,isa,lat:vals=hitcount:sort=hitcount:size=2048 if lat < 64 [active]
#

{ reason:        123, isa:          2, lat:         40 } hitcount:          2

Totals:
    Hits: 2
    Entries: 1
    Dropped: 0

# event histogram
#
# trigger info: hist:keys=reason,isa,lat.buckets=2048:vals=hitcount:sort=hitcount:size=2048 if lat >= 65536 && lat < 131072 [active]
#

{ reason:        123, isa:          2, lat: ~ 67584-69631 } hitcount:          3
{ reason:       1024, isa:          2, lat: ~ 65536-67583 } hitcount:          1

Totals:
    Hits: 4
    Entries: 2
    Dropped: 1

# event histogram
#
# trigger info: hist:keys=reason,isa:vals=hitcount,lat:vp9max=lat:sort=hitcount:size=2048:onmax($vp9max).save(lat) [active]
#

{ reason:        123, isa:          2 } hitcount:          5  lat:     206000
\tmax:      69000  lat:      69000
{ reason:       1024, isa:          2 } hitcount:          1  lat:      65600
\tmax:      65600  lat:      65600

Totals:
    Hits: 6
    Entries: 2
    Dropped: 0

# event histogram
#
# trigger info: hist:keys=reason,isa:vals=hitcount:vp9neg=4611686018427387904-lat:sort=hitcount:size=2048:onmax($vp9neg).save(lat) [active]
#

{ reason:        123, isa:          2 } hitcount:          5
\tmax: 4611686018427387864  lat:         40
{ reason:       1024, isa:          2 } hitcount:          1
\tmax: 4611686018427322304  lat:      65600

Totals:
    Hits: 6
    Entries: 2
    Dropped: 0
";

    #[test]
    fn every_section_is_read_back_per_reason() {
        let hists = parse_exit_hists(HIST);
        assert_eq!(hists.dropped, 1);
        assert_eq!(hists.exits(), 6);
        let io = &hists.reasons[0];
        assert_eq!(
            io,
            &ReasonHist {
                reason: 123,
                isa: 2,
                count: 5,
                sum_ns: 206000,
                min_ns: Some(40),
                max_ns: Some(69000),
                buckets: vec![(40, 2), (67584, 3)]
            }
        );
        let npf = &hists.reasons[1];
        assert_eq!((npf.reason, npf.isa), (1024, 2));
        assert_eq!((npf.min_ns, npf.max_ns, npf.buckets.as_slice()), (Some(65600), Some(65600), &[(65536, 1)][..]));
        assert_eq!(parse_exit_hists(""), KernelExitHists::default());
        assert_eq!(parse_exit_hists("# event histogram\n{ reason: x } hitcount: \n\tmax: lat:\n").exits(), 0);
    }

    #[test]
    fn each_power_of_two_has_its_map_with_buckets_as_wide_as_ours() {
        let commands = histogram_commands("m", "n");
        assert_eq!(commands.len(), (LAST_EXP - 6 + 1) as usize + 4);
        assert_eq!(commands[0], "hist:keys=reason,isa,lat:vals=hitcount:size=2048 if lat < 64");
        assert_eq!(commands[1], "hist:keys=reason,isa,lat.buckets=2:vals=hitcount:size=2048 if lat >= 64 && lat < 128");
        assert!(commands.last().unwrap().contains("n=4611686018427387904-lat"));
    }

    #[test]
    fn the_kernels_reason_for_a_refusal_is_quoted() {
        let log = "[  6.28] hist:kvm:kvm_entry: error: Param type doesn't match synthetic event field type\n  Command: hist:keys=...\n";
        assert_eq!(last_error(log).unwrap(), " (the kernel: Param type doesn't match synthetic event field type)");
        assert_eq!(last_error(""), None);
    }
}
