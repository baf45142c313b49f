//! The `boot` workload: a guest program of named functions, each running for a chosen share of
//! the run, so that `virtprof boot --testvm` has exact ground truth to measure against (the
//! seed's ballooning experiment included: `--balloon NAME=K` makes one function K times longer).

use super::workload::{Bound, Phase, Privilege, Script, Workload};

/// `init_mm=61,probe_devices=27,start_user=12`: function names with relative weights.
pub fn parse_shares(spec: &str) -> Result<Vec<(String, f64)>, String> {
    let mut out: Vec<(String, f64)> = Vec::new();
    for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (name, weight) = item
            .split_once('=')
            .ok_or_else(|| format!("'{item}': write NAME=WEIGHT, e.g. init_mm=61,probe_devices=27,start_user=12"))?;
        let name = name.trim();
        let valid = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(format!("'{name}' is not a symbol name (letters, digits and _, not starting with a digit)"));
        }
        if out.iter().any(|(n, _)| n == name) {
            return Err(format!("'{name}' is given twice"));
        }
        let weight: f64 = weight.trim().parse().map_err(|_| format!("'{item}': the weight must be a number"))?;
        if !(weight.is_finite() && weight > 0.0) {
            return Err(format!("'{item}': the weight must be positive"));
        }
        out.push((name.to_string(), weight));
    }
    if out.is_empty() {
        return Err("no functions given".into());
    }
    Ok(out)
}

/// The longest boot run a script may make: an hour.
const MAX_RUN_NS: u64 = 3_600_000_000_000;

/// A script running each function in order for its share of `total_ns`, functions named in
/// `balloon` K times longer (so the run grows, as ballooning does).
pub fn boot_script(shares: &[(String, f64)], total_ns: u64, balloon: &[(String, f64)]) -> Result<Script, String> {
    if let Some((name, _)) = balloon.iter().find(|(b, _)| !shares.iter().any(|(n, _)| n == b)) {
        return Err(format!("--balloon {name}: no such function in --shares"));
    }
    let sum: f64 = shares.iter().map(|(_, w)| w).sum();
    let durations: Vec<f64> = shares
        .iter()
        .map(|(name, weight)| {
            let k = balloon.iter().find(|(b, _)| b == name).map_or(1.0, |(_, k)| *k);
            total_ns as f64 * weight / sum * k
        })
        .collect();
    // `--balloon f=1e12` must be refused, not run until the end of time.
    let run_ns: f64 = durations.iter().sum();
    if run_ns.is_nan() || run_ns > MAX_RUN_NS as f64 {
        return Err(format!(
            "--balloon makes the run {:.0} s long; the most is {} s (use a smaller factor)",
            run_ns / 1e9,
            MAX_RUN_NS / 1_000_000_000
        ));
    }
    let phases = shares
        .iter()
        .zip(durations)
        .map(|((name, _), ns)| Phase {
            workload: Workload::Compute,
            bound: Bound::Duration { ns: ns.round() as u64 },
            function: Some(name.clone()),
        })
        .collect();
    Ok(Script { phases, privilege: Privilege::User })
}

/// The script for `--shares SPEC [--balloon SPEC]` over `total_ns`; errors name the option.
pub fn script_from_specs(shares: &str, balloon: Option<&str>, total_ns: u64) -> Result<Script, String> {
    let shares = parse_shares(shares).map_err(|e| format!("--shares: {e}"))?;
    let balloon = match balloon {
        Some(spec) => parse_shares(spec).map_err(|e| format!("--balloon: {e}"))?,
        None => Vec::new(),
    };
    boot_script(&shares, total_ns, &balloon)
}

/// Each named function's expected share of the run's time: its duration over the total.
pub fn expected_shares(script: &Script) -> Vec<(String, f64)> {
    let ns = |p: &Phase| match p.bound {
        Bound::Duration { ns } => ns as f64,
        Bound::Iterations(_) => 0.0,
    };
    let total: f64 = script.phases.iter().map(ns).sum();
    script.phases.iter().map(|p| (p.label().to_string(), ns(p) / total.max(1.0))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_become_durations_and_ballooning_grows_one() {
        let shares = parse_shares("init_mm=61, probe_devices=27,start_user=12").unwrap();
        let script = boot_script(&shares, 1_000_000_000, &[]).unwrap();
        assert_eq!(script.phases[1].bound, Bound::Duration { ns: 270_000_000 });
        assert_eq!(script.phases[1].label(), "probe_devices");
        let ballooned = boot_script(&shares, 1_000_000_000, &[("start_user".into(), 4.0)]).unwrap();
        let expected = expected_shares(&ballooned);
        // 12 × 4 = 48 of 61 + 27 + 48 = 136.
        assert!((expected[2].1 - 48.0 / 136.0).abs() < 1e-9, "{expected:?}");
        let program = ballooned.assemble(2_000_000).unwrap();
        for name in ["init_mm", "probe_devices", "start_user"] {
            assert!(program.symbol_addr(name).is_some(), "{name}");
        }
        assert!(program.symbol_addr("start_user_loop").is_none(), "named functions hold their loops");
    }

    #[test]
    fn rejects_bad_shares() {
        assert!(parse_shares("a=1,a=2").unwrap_err().contains("twice"));
        assert!(parse_shares("9x=1").unwrap_err().contains("not a symbol name"));
        assert!(parse_shares("a=-1").unwrap_err().contains("positive"));
        assert!(parse_shares("a").unwrap_err().contains("NAME=WEIGHT"));
        let shares = parse_shares("a=1").unwrap();
        assert!(boot_script(&shares, 1, &[("b".into(), 2.0)]).unwrap_err().contains("no such function"));
        let err = boot_script(&shares, 1_000_000_000, &[("a".into(), 1e12)]).unwrap_err();
        assert!(err.contains("the most is 3600 s"), "{err}");
    }
}
