//! Program-counter profiles (`virtprof boot`): label each sample with its realm and symbol,
//! then count — realm split overall and per time bin, top symbols with fraction and rank (the
//! seed's Table 1), per-symbol timelines, symbol n-gram sequences, and the differential of two
//! profiles.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};
use virtprof_model::pcsample::{PcSample, Realm};

use crate::symbols::SymbolTable;

/// Names for samples no symbol covers.
pub const UNKNOWN_KERNEL: &str = "[kernel unknown]";
/// User samples without a user symbol table (the seed aggregates them the same way).
pub const UNKNOWN_USER: &str = "[user]";
/// Firmware-realm code below 1 MiB: BIOS, option ROMs, real-mode setup.
pub const FIRMWARE_LOW: &str = "[firmware <1MiB]";
/// Firmware-realm code above 1 MiB: boot loader, the kernel's decompressor.
pub const FIRMWARE_HIGH: &str = "[firmware >=1MiB]";
/// Hypervisor samples without a named activity.
pub const VMM: &str = "[vmm]";

/// A sample with its symbol.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Labeled {
    /// Nanoseconds since sampling started.
    pub t_ns: u64,
    /// vCPU index.
    pub vcpu: u32,
    /// Guest RIP.
    pub rip: u64,
    /// Realm.
    pub realm: Realm,
    /// Symbol (or one of the bracketed placeholders).
    pub symbol: String,
    /// Whether a symbol table resolved it.
    pub resolved: bool,
}

/// Resolve every sample: kernel samples against `kernel`, user samples against `user`.
pub fn label(samples: &[PcSample], kernel: Option<&SymbolTable>, user: Option<&SymbolTable>) -> Vec<Labeled> {
    samples
        .iter()
        .map(|s| {
            let (symbol, resolved) = match s.realm {
                Realm::Hypervisor if s.activity.is_empty() => (VMM.to_string(), true),
                Realm::Hypervisor => (s.activity.clone(), true),
                Realm::Firmware if s.rip < 0x10_0000 => (FIRMWARE_LOW.to_string(), false),
                Realm::Firmware => (FIRMWARE_HIGH.to_string(), false),
                Realm::Kernel => match kernel.and_then(|t| t.resolve(s.rip)) {
                    Some((name, _)) => (name.to_string(), true),
                    None => (UNKNOWN_KERNEL.to_string(), false),
                },
                Realm::User => match user.and_then(|t| t.resolve(s.rip)) {
                    Some((name, _)) => (name.to_string(), true),
                    None => (UNKNOWN_USER.to_string(), false),
                },
            };
            Labeled { t_ns: s.t_ns, vcpu: s.vcpu, rip: s.rip, realm: s.realm, symbol, resolved }
        })
        .collect()
}

/// One row of the symbol table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SymbolRow {
    /// Symbol name.
    pub name: String,
    /// Its realm.
    pub realm: Realm,
    /// Samples.
    pub count: u64,
    /// Share of all samples.
    pub fraction: f64,
    /// 1 = most sampled (ties share the order of first appearance).
    pub rank: u32,
}

/// A symbol's samples per time bin.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Timeline {
    /// Symbol name.
    pub name: String,
    /// Samples per bin.
    pub counts: Vec<u64>,
}

/// Realm counts per time bin.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Bins {
    /// Bin width.
    pub bin_ns: u64,
    /// Start of each bin, seconds since sampling started.
    pub t_s: Vec<f64>,
    /// Realm name → samples per bin.
    pub realms: BTreeMap<String, Vec<u64>>,
    /// The timelines asked for (and the top symbols').
    pub symbols: Vec<Timeline>,
}

/// A sequence of distinct consecutive symbols on one vCPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sequence {
    /// The symbols, in order.
    pub symbols: Vec<String>,
    /// How often it occurred.
    pub count: u64,
}

/// A whole profile.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Profile {
    /// Samples.
    pub samples: u64,
    /// From the first to the last sample.
    pub duration_ns: u64,
    /// Realm → share of samples (every realm present, zeros included).
    pub realms: BTreeMap<String, f64>,
    /// Realm → samples.
    pub realm_counts: BTreeMap<String, u64>,
    /// Realm → share of its samples a symbol table resolved.
    pub resolved: BTreeMap<String, f64>,
    /// Every symbol, most sampled first.
    pub symbols: Vec<SymbolRow>,
    /// Time-binned realms and symbol timelines.
    pub bins: Bins,
    /// Most frequent symbol pairs.
    pub bigrams: Vec<Sequence>,
    /// Most frequent symbol triples.
    pub trigrams: Vec<Sequence>,
}

/// Samples of one symbol and where it first appeared.
type SymbolTally = (u64, usize);

/// What to compute beyond the fixed parts.
#[derive(Debug, Clone)]
pub struct Options {
    /// Bin width (0: about 50 bins over the run).
    pub bin_ns: u64,
    /// Symbols whose timelines to include, besides the top ones.
    pub timelines: Vec<String>,
    /// How many of the top symbols get timelines.
    pub top_timelines: usize,
    /// How many n-grams to keep.
    pub top_sequences: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options { bin_ns: 0, timelines: Vec::new(), top_timelines: 5, top_sequences: 10 }
    }
}

/// The most time bins a profile's timelines hold (per realm and per symbol shown).
pub const MAX_BINS: u64 = 100_000;

/// The time the samples span, from 0 to the last.
pub fn duration_ns(samples: &[Labeled]) -> u64 {
    samples.iter().map(|s| s.t_ns).max().unwrap_or(0)
}

/// With `bin_ns`-wide bins (0: the default), timelines of `duration_ns` need more than
/// [`MAX_BINS`]: how many, and the narrowest bin that fits.
pub fn too_many_bins(duration_ns: u64, bin_ns: u64) -> Option<(u64, u64)> {
    let bins = (duration_ns / bin_ns.max(1)).saturating_add(1);
    (bin_ns > 0 && bins > MAX_BINS).then(|| (bins, duration_ns.div_ceil(MAX_BINS - 1)))
}

/// Count `samples` (labelled, in any order). A `bin_ns` that [`too_many_bins`] refuses is
/// widened to the narrowest that fits.
pub fn profile(samples: &[Labeled], options: &Options) -> Profile {
    let n = samples.len() as u64;
    let duration_ns = duration_ns(samples);
    let mut realm_counts: BTreeMap<String, u64> = Realm::ALL.iter().map(|r| (r.name().to_string(), 0)).collect();
    let mut resolved_counts: BTreeMap<String, u64> = BTreeMap::new();
    // (symbol, realm) → (samples, index of the first one), so ties rank in order of appearance.
    let mut by_symbol: FxHashMap<(&str, Realm), SymbolTally> = FxHashMap::default();
    for (i, s) in samples.iter().enumerate() {
        *realm_counts.entry(s.realm.name().to_string()).or_default() += 1;
        *resolved_counts.entry(s.realm.name().to_string()).or_default() += u64::from(s.resolved);
        by_symbol.entry((s.symbol.as_str(), s.realm)).or_insert((0, i)).0 += 1;
    }
    let share = |count: u64, of: u64| if of == 0 { 0.0 } else { count as f64 / of as f64 };
    let realms = realm_counts.iter().map(|(r, &c)| (r.clone(), share(c, n))).collect();
    let resolved =
        realm_counts.iter().filter(|(_, &c)| c > 0).map(|(r, &c)| (r.clone(), share(resolved_counts[r], c))).collect();

    let mut rows: Vec<_> = by_symbol.into_iter().collect();
    rows.sort_by(|a, b| b.1 .0.cmp(&a.1 .0).then(a.1 .1.cmp(&b.1 .1)));
    let symbols: Vec<SymbolRow> = rows
        .iter()
        .zip(1u32..)
        .map(|(((name, realm), (count, _)), rank)| SymbolRow {
            name: name.to_string(),
            realm: *realm,
            count: *count,
            fraction: share(*count, n),
            rank,
        })
        .collect();

    let bin_ns = match too_many_bins(duration_ns, options.bin_ns) {
        Some((_, fits)) => fits,
        None if options.bin_ns > 0 => options.bin_ns,
        None => round_bin(duration_ns / 50),
    };
    let bins_len = usize::try_from(duration_ns / bin_ns + 1).unwrap_or(usize::MAX);
    let mut realm_bins: BTreeMap<String, Vec<u64>> =
        Realm::ALL.iter().map(|r| (r.name().to_string(), vec![0; bins_len])).collect();
    let mut wanted: Vec<String> = symbols.iter().take(options.top_timelines).map(|r| r.name.clone()).collect();
    for name in &options.timelines {
        if !wanted.contains(name) {
            wanted.push(name.clone());
        }
    }
    let mut timelines: Vec<Timeline> =
        wanted.into_iter().map(|name| Timeline { name, counts: vec![0; bins_len] }).collect();
    for s in samples {
        let bin = usize::try_from(s.t_ns / bin_ns).unwrap_or(usize::MAX).min(bins_len - 1);
        if let Some(v) = realm_bins.get_mut(s.realm.name()) {
            v[bin] += 1;
        }
        if let Some(t) = timelines.iter_mut().find(|t| t.name == s.symbol) {
            t.counts[bin] += 1;
        }
    }
    let t_s = (0..bins_len).map(|i| (i as u64 * bin_ns) as f64 / 1e9).collect();

    let (bigrams, trigrams) = sequences(samples, options.top_sequences);
    Profile {
        samples: n,
        duration_ns,
        realms,
        realm_counts,
        resolved,
        symbols,
        bins: Bins { bin_ns, t_s, realms: realm_bins, symbols: timelines },
        bigrams,
        trigrams,
    }
}

/// A bin width of 1, 2 or 5 × 10^k ns at or above `ns`, at least 1 ms.
fn round_bin(ns: u64) -> u64 {
    let mut scale = 1_000_000;
    loop {
        for step in [1, 2, 5] {
            if step * scale >= ns {
                return step * scale;
            }
        }
        scale *= 10;
    }
}

/// Per vCPU, in time order, runs of one symbol collapse to one step; count the 2- and 3-step
/// windows (the seed's "scrit system_call scrit system_call").
fn sequences(samples: &[Labeled], top: usize) -> (Vec<Sequence>, Vec<Sequence>) {
    let mut order: Vec<&Labeled> = samples.iter().collect();
    order.sort_by_key(|s| (s.vcpu, s.t_ns));
    let mut steps: Vec<Vec<&str>> = Vec::new();
    let mut last_vcpu = None;
    for s in order {
        if last_vcpu != Some(s.vcpu) {
            steps.push(Vec::new());
            last_vcpu = Some(s.vcpu);
        }
        let run = steps.last_mut().expect("pushed above");
        if run.last() != Some(&s.symbol.as_str()) {
            run.push(&s.symbol);
        }
    }
    let count = |width: usize| {
        let mut counts: FxHashMap<&[&str], u64> = FxHashMap::default();
        for run in &steps {
            for w in run.windows(width) {
                *counts.entry(w).or_default() += 1;
            }
        }
        let mut out: Vec<Sequence> = counts
            .into_iter()
            .map(|(w, count)| Sequence { symbols: w.iter().map(|s| s.to_string()).collect(), count })
            .collect();
        out.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.symbols.cmp(&b.symbols)));
        out.truncate(top);
        out
    };
    (count(2), count(3))
}

/// One symbol in two profiles.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DiffRow {
    /// Symbol name.
    pub name: String,
    /// Its realm.
    pub realm: Realm,
    /// Share in this profile.
    pub fraction: f64,
    /// Share in the other profile.
    pub other_fraction: f64,
    /// `fraction − other_fraction`, in percentage points.
    pub delta_pp: f64,
    /// Rank here (None: not sampled).
    pub rank: Option<u32>,
    /// Rank in the other profile.
    pub other_rank: Option<u32>,
}

/// Every symbol of either profile, largest share change first.
pub fn compare(this: &[SymbolRow], other: &[SymbolRow]) -> Vec<DiffRow> {
    let find =
        |rows: &[SymbolRow], r: &SymbolRow| rows.iter().find(|o| o.name == r.name && o.realm == r.realm).cloned();
    let mut out: Vec<DiffRow> = this
        .iter()
        .map(|r| (Some(r.clone()), find(other, r)))
        .chain(other.iter().filter(|o| find(this, o).is_none()).map(|o| (None, Some(o.clone()))))
        .map(|(a, b)| {
            let any = a.as_ref().or(b.as_ref()).expect("one side is present");
            let (fa, fb) = (a.as_ref().map_or(0.0, |r| r.fraction), b.as_ref().map_or(0.0, |r| r.fraction));
            DiffRow {
                name: any.name.clone(),
                realm: any.realm,
                fraction: fa,
                other_fraction: fb,
                delta_pp: 100.0 * (fa - fb),
                rank: a.map(|r| r.rank),
                other_rank: b.map(|r| r.rank),
            }
        })
        .collect();
    out.sort_by(|a, b| b.delta_pp.abs().total_cmp(&a.delta_pp.abs()).then_with(|| a.name.cmp(&b.name)));
    out
}

/// Spearman rank correlation of the `top` symbols of `this`: their shares here against their
/// shares in `other` (0 where `other` never sampled them), ranked with ties averaged. None with
/// fewer than 3 symbols.
pub fn rank_correlation(this: &[SymbolRow], other: &[SymbolRow], top: usize) -> Option<f64> {
    let head = &this[..top.min(this.len())];
    let xs: Vec<f64> = head.iter().map(|r| r.fraction).collect();
    let ys: Vec<f64> = head
        .iter()
        .map(|r| other.iter().find(|o| o.name == r.name && o.realm == r.realm).map_or(0.0, |o| o.fraction))
        .collect();
    let r = crate::correlate::pearson(&crate::correlate::ranks(&xs), &crate::correlate::ranks(&ys));
    (!r.is_nan()).then_some(r)
}

/// `realm;symbol count` lines for flame-graph tools (`flamegraph.pl`, inferno, speedscope).
pub fn folded(rows: &[SymbolRow]) -> String {
    rows.iter().map(|r| format!("{};{} {}\n", r.realm, r.name, r.count)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(t_ms: u64, realm: Realm, symbol: &str) -> Labeled {
        Labeled { t_ns: t_ms * 1_000_000, vcpu: 0, rip: 0, realm, symbol: symbol.into(), resolved: true }
    }

    fn run(spec: &[(&str, u64)]) -> Vec<Labeled> {
        let mut out = Vec::new();
        for (name, n) in spec {
            for _ in 0..*n {
                out.push(sample(out.len() as u64, Realm::User, name));
            }
        }
        out
    }

    #[test]
    fn counts_fractions_ranks_and_bins() {
        let mut s = run(&[("a", 60), ("b", 30)]);
        s.push(sample(90, Realm::Hypervisor, "vmm:IO"));
        s.extend((91..100).map(|t| sample(t, Realm::Kernel, "k")));
        let p = profile(&s, &Options { bin_ns: 10_000_000, ..Options::default() });
        assert_eq!(p.samples, 100);
        assert_eq!(p.realms["user"], 0.9);
        assert_eq!(p.realms["hypervisor"], 0.01);
        assert_eq!(p.symbols[0], SymbolRow { name: "a".into(), realm: Realm::User, count: 60, fraction: 0.6, rank: 1 });
        assert_eq!(p.symbols[2].name, "k");
        assert_eq!(p.bins.realms["user"][..3], [10, 10, 10]);
        assert_eq!(p.bins.realms["kernel"][9], 9);
        let a = p.bins.symbols.iter().find(|t| t.name == "a").unwrap();
        assert_eq!(a.counts.iter().sum::<u64>(), 60);
        assert_eq!(a.counts[6], 0);
    }

    #[test]
    fn default_bins_are_round() {
        assert_eq!(round_bin(0), 1_000_000);
        assert_eq!(round_bin(40_014_906), 50_000_000);
        assert_eq!(round_bin(150_000_000), 200_000_000);
    }

    #[test]
    fn sequences_collapse_runs_per_vcpu() {
        let mut s = run(&[("scrit", 3), ("system_call", 2), ("scrit", 1), ("system_call", 4)]);
        s.push(Labeled { vcpu: 1, ..sample(0, Realm::User, "other") });
        let p = profile(&s, &Options::default());
        assert_eq!(p.bigrams[0], Sequence { symbols: vec!["scrit".into(), "system_call".into()], count: 2 });
        assert_eq!(p.bigrams[1].count, 1);
        assert_eq!(p.trigrams.len(), 2);
        assert!(p.bigrams.iter().all(|b| !b.symbols.contains(&"other".to_string())), "vCPUs are separate runs");
    }

    #[test]
    fn compare_lists_share_and_rank_changes() {
        let a = profile(&run(&[("x", 70), ("y", 30)]), &Options::default()).symbols;
        let b = profile(&run(&[("y", 50), ("x", 40), ("z", 10)]), &Options::default()).symbols;
        let c = profile(&run(&[("z", 50), ("y", 40), ("x", 10)]), &Options::default()).symbols;
        let d = compare(&a, &b);
        assert_eq!(d[0].name, "x");
        assert!((d[0].delta_pp - 30.0).abs() < 1e-9);
        assert_eq!((d[0].rank, d[0].other_rank), (Some(1), Some(2)));
        let z = d.iter().find(|r| r.name == "z").unwrap();
        assert_eq!((z.rank, z.other_rank), (None, Some(3)));
        assert_eq!(rank_correlation(&b, &b, 20), Some(1.0));
        assert_eq!(rank_correlation(&b, &c, 2), None, "two symbols say nothing");
        assert!((rank_correlation(&b, &c, 20).unwrap() + 0.5).abs() < 1e-9);
        assert_eq!(folded(&a), "user;x 70\nuser;y 30\n");
    }

    #[test]
    fn labels_by_realm_with_placeholders() {
        let table = SymbolTable::from_system_map(
            "0000000000010000 T init_mm\n0000000000010100 T end\n0000000000010200 D data\n",
        )
        .unwrap();
        let samples = [
            PcSample { t_ns: 0, vcpu: 0, rip: 0x10010, realm: Realm::User, activity: String::new() },
            PcSample { t_ns: 1, vcpu: 0, rip: 0x90000, realm: Realm::User, activity: String::new() },
            PcSample { t_ns: 2, vcpu: 0, rip: 0x10010, realm: Realm::Hypervisor, activity: "vmm:IO".into() },
            PcSample { t_ns: 3, vcpu: 0, rip: 0xffff_ffff_8100_0000, realm: Realm::Kernel, activity: String::new() },
        ];
        let l = label(&samples, None, Some(&table));
        let names: Vec<&str> = l.iter().map(|s| s.symbol.as_str()).collect();
        assert_eq!(names, ["init_mm", UNKNOWN_USER, "vmm:IO", UNKNOWN_KERNEL]);
        let p = profile(&l, &Options::default());
        assert_eq!(p.resolved["user"], 0.5);
        assert_eq!(p.resolved["kernel"], 0.0);
    }
}
