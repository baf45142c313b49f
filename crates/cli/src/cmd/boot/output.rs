//! What `virtprof boot` prints: a text summary (realms, the seed's Table 1 of top symbols,
//! timelines as sparklines, sequences, the differential), or JSON, CSV, folded stacks, HTML.

use std::io::Write;
use std::path::PathBuf;

use serde::Serialize;
use virtprof_analysis::pcprof::{self, DiffRow, Options, Profile};
use virtprof_model::pcsample::Realm;
use virtprof_model::units::format_duration_ns;
use virtprof_sinks::Table;

use super::{SavedProfile, Truth};
use crate::exit::usage;

const BOOT_JS: &str = include_str!("../../../assets/boot.js");

/// How many symbols `--compare` lists and rank-correlates.
const COMPARE_TOP: usize = 20;

/// The `--json` document (docs/boot.md).
#[derive(Debug, Serialize)]
struct BootReport<'a> {
    source: &'a str,
    rate_hz: Option<u32>,
    note: Option<&'a str>,
    kaslr_offset: String,
    #[serde(flatten)]
    profile: Profile,
    truth: Option<&'a Truth>,
    compare: Option<CompareOut>,
}

#[derive(Debug, Serialize)]
struct CompareOut {
    other: String,
    other_source: String,
    /// Spearman correlation of this profile's top-20 ranks with their ranks in the other.
    rank_correlation_top20: Option<f64>,
    rows: Vec<DiffRow>,
}

/// How the profile is shown.
pub struct View {
    /// Time-bin width (0: about 50 bins).
    pub bin_ns: u64,
    /// Symbols whose profile over time is shown.
    pub symbols: Vec<String>,
    /// Rows of the top-symbol table.
    pub top: usize,
    pub format: Format,
    /// Also write charts here.
    pub html: Option<PathBuf>,
}

/// What goes to standard output.
pub enum Format {
    Text,
    Json,
    /// The symbol table.
    Csv,
    /// `realm;symbol count` lines for flame-graph tools.
    Folded,
}

pub fn write(view: &View, saved: &SavedProfile, other: Option<(String, SavedProfile)>) -> anyhow::Result<()> {
    let duration_ns = pcprof::duration_ns(&saved.samples);
    if let Some((bins, fits)) = pcprof::too_many_bins(duration_ns, view.bin_ns) {
        return Err(usage(format!(
            "--bin {} cuts the profile's {} into {bins} bins, over the {} a timeline holds: use --bin {}us or longer",
            format_duration_ns(view.bin_ns),
            format_duration_ns(duration_ns),
            pcprof::MAX_BINS,
            fits.div_ceil(1000)
        )));
    }
    let options = Options { bin_ns: view.bin_ns, timelines: view.symbols.clone(), ..Options::default() };
    let profile = pcprof::profile(&saved.samples, &options);
    if let Some(missing) = view.symbols.iter().find(|s| !profile.symbols.iter().any(|r| &r.name == *s)) {
        eprintln!("virtprof: warning: --symbol {missing} was never sampled");
    }
    let compare = other.map(|(path, o)| {
        let theirs = pcprof::profile(&o.samples, &Options::default());
        let mut rows = pcprof::compare(&profile.symbols, &theirs.symbols);
        rows.truncate(COMPARE_TOP.max(view.top));
        CompareOut {
            other: path,
            other_source: o.source,
            rank_correlation_top20: pcprof::rank_correlation(&profile.symbols, &theirs.symbols, COMPARE_TOP),
            rows,
        }
    });
    let report = BootReport {
        source: &saved.source,
        rate_hz: saved.rate_hz,
        note: saved.note.as_deref(),
        kaslr_offset: format!("{:#x}", saved.kaslr_offset),
        profile,
        truth: saved.truth.as_ref(),
        compare,
    };
    if let Some(path) = &view.html {
        let page = virtprof_sinks::html::render("boot profile", report.source, &report, BOOT_JS)?;
        virtprof_host::output::write_file(path, page.as_bytes(), virtprof_host::output::Privacy::Shared)?;
    }
    let mut out = crate::output::stdout();
    match view.format {
        Format::Json => {
            crate::output::write_json_pretty(&mut out, &report)?;
        }
        Format::Csv => symbol_table(&report, usize::MAX).write_csv(&mut out)?,
        Format::Folded => out.write_all(pcprof::folded(&report.profile.symbols).as_bytes())?,
        Format::Text => text(&report, view.top, &mut out)?,
    }
    Ok(())
}

fn text(r: &BootReport<'_>, top: usize, out: &mut impl Write) -> anyhow::Result<()> {
    let p = &r.profile;
    let rate = r.rate_hz.map_or("exit-driven".to_string(), |hz| format!("{hz} Hz"));
    writeln!(
        out,
        "virtprof boot: {}, {rate}, {} samples over {:.3} s, KASLR offset {}",
        r.source,
        p.samples,
        p.duration_ns as f64 / 1e9,
        r.kaslr_offset
    )?;
    if let Some(note) = r.note {
        writeln!(out, "note: {note}")?;
    }
    if let Some(t) = r.truth {
        writeln!(out, "guest run time (ground truth): {:.3} s", t.boot_s)?;
    }
    writeln!(out)?;
    let mut realms = Table::new(["REALM", "SAMPLES", "SHARE", "RESOLVED"]);
    for name in Realm::ALL.map(Realm::name) {
        let count = p.realm_counts.get(name).copied().unwrap_or(0);
        let resolved = p.resolved.get(name).map_or("-".to_string(), |f| format!("{:.1}%", 100.0 * f));
        realms.row([name.to_string(), count.to_string(), format!("{:.1}%", 100.0 * p.realms[name]), resolved]);
    }
    realms.write_text(&mut *out)?;
    writeln!(out)?;
    symbol_table(r, top).write_text(&mut *out)?;

    writeln!(out, "\nover time ({} bins of {} ms):", p.bins.t_s.len(), p.bins.bin_ns as f64 / 1e6)?;
    let width = p.bins.symbols.iter().map(|t| t.name.len()).max().unwrap_or(0).max(10);
    for (name, counts) in p.bins.realms.iter().filter(|(_, c)| c.iter().any(|&n| n > 0)) {
        writeln!(out, "  {name:width$}  {}", sparkline(counts))?;
    }
    for t in &p.bins.symbols {
        writeln!(out, "  {:width$}  {}", t.name, sparkline(&t.counts))?;
    }
    for (title, seqs) in [("symbol pairs", &p.bigrams), ("symbol triples", &p.trigrams)] {
        if seqs.is_empty() {
            continue;
        }
        writeln!(out, "\n{title} (consecutive samples per vCPU, repeats collapsed):")?;
        for s in seqs.iter().take(5) {
            writeln!(out, "  {:6}  {}", s.count, s.symbols.join(" → "))?;
        }
    }
    if let Some(c) = &r.compare {
        let rho = c.rank_correlation_top20.map_or("-".to_string(), |v| format!("{v:.3}"));
        writeln!(out, "\ncompared with {} ({}): top-20 rank correlation {rho}", c.other, c.other_source)?;
        let mut t = Table::new(["SYMBOL", "REALM", "SHARE", "OTHER", "DELTA_PP", "RANK", "OTHER_RANK"]);
        let rank = |r: Option<u32>| r.map_or("-".to_string(), |r| r.to_string());
        for d in c.rows.iter().take(top) {
            t.row([
                d.name.clone(),
                d.realm.to_string(),
                format!("{:.2}%", 100.0 * d.fraction),
                format!("{:.2}%", 100.0 * d.other_fraction),
                format!("{:+.2}", d.delta_pp),
                rank(d.rank),
                rank(d.other_rank),
            ]);
        }
        t.write_text(&mut *out)?;
    }
    Ok(())
}

/// The seed's Table 1, plus the expected share where the test bed knows it.
fn symbol_table(r: &BootReport<'_>, top: usize) -> Table {
    let truth = r.truth.map(|t| &t.expected_shares);
    let mut headers = vec!["RANK", "REALM", "SYMBOL", "COUNT", "FRACTION"];
    if truth.is_some() {
        headers.push("EXPECTED");
    }
    let mut t = Table::new(headers);
    for row in r.profile.symbols.iter().take(top) {
        let mut cells = vec![
            row.rank.to_string(),
            row.realm.to_string(),
            row.name.clone(),
            row.count.to_string(),
            format!("{:.5}", row.fraction),
        ];
        if let Some(truth) = truth {
            cells.push(truth.get(&row.name).map_or(String::new(), |f| format!("{f:.5}")));
        }
        t.row(cells);
    }
    if r.profile.symbols.len() > top {
        t.footer(format!("... {} more symbols (--top N, --csv for all)", r.profile.symbols.len() - top));
    }
    t
}

/// Counts as block characters, at most 72 wide (neighbouring bins summed).
fn sparkline(counts: &[u64]) -> String {
    const BLOCKS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let group = counts.len().div_ceil(72).max(1);
    let sums: Vec<u64> = counts.chunks(group).map(|c| c.iter().sum()).collect();
    let max = sums.iter().copied().max().unwrap_or(0).max(1);
    sums.iter()
        .map(|&v| if v == 0 { ' ' } else { BLOCKS[usize::try_from((v * 7).div_ceil(max)).unwrap_or(7).min(7)] })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sparklines_scale_to_the_maximum_and_fit() {
        assert_eq!(sparkline(&[0, 1, 2, 4]), " ▃▅█");
        assert_eq!(sparkline(&vec![1; 500]).chars().count(), 72);
    }
}
