//! The text lines of the live view and of `--once` that are not the XenMon table: one per
//! guest agent, and the energy line.

use virtprof_engine::energy::book::CoreRow;
use virtprof_engine::guests::GuestLive;

/// One text line per guest, for `--once` and the live view.
pub fn guest(g: &GuestLive) -> String {
    let name = if g.name.is_empty() { g.address.clone() } else { format!("{} ({})", g.name, g.address) };
    let name = virtprof_model::units::printable(&name);
    if let Some(status) = &g.status {
        return format!("guest {name}: {}", virtprof_model::units::printable(status));
    }
    let pick = ["user", "system", "steal", "idle"];
    let cpu: Vec<String> =
        g.cpu_pct.iter().filter(|(f, _)| pick.contains(&f.as_str())).map(|(f, v)| format!("{f} {v:.1}%")).collect();
    let apps: Vec<String> = g.app_per_s.iter().map(|(n, r)| format!("{n} {r:.1}/s")).collect();
    let bound =
        g.bound_ns.map(|b| format!(" · clock ±{}", virtprof_model::units::format_duration_ns(b))).unwrap_or_default();
    let noise = g
        .noise
        .map(|n| {
            format!(
                " · noise {:.3}% ({} samples, max {:.1} µs)",
                n.noise_pct,
                n.summary.samples,
                n.summary.max_single_ns as f64 / 1e3
            )
        })
        .unwrap_or_default();
    // Series names are the guest's own words: escaped for a terminal, like its name.
    let line = format!(
        "guest {name}: {}{}{noise}{bound}",
        cpu.join(" "),
        if apps.is_empty() { String::new() } else { format!(" · {}", apps.join(" ")) }
    );
    virtprof_model::units::printable(&line).into_owned()
}

/// `energy: cpu0 10.0 W 12 J 45.0 °C · cpu1 ... · swaps/s 9.5` (or `swaps/s –` with no balancer;
/// `energy (balance PID)` when the figures are a balancer's).
pub fn energy(cores: &[CoreRow], swaps_per_s: Option<f64>, balancer: Option<u32>) -> String {
    let mut parts: Vec<String> = cores
        .iter()
        .map(|c| format!("cpu{} {:.1} W {:.0} J {:.1} °C", c.cpu, c.power_w, c.total_j, c.temp_c))
        .collect();
    parts.push(swaps_per_s.map_or_else(|| "swaps/s –".to_string(), |s| format!("swaps/s {s:.1}")));
    let source = balancer.map_or_else(|| "energy".to_string(), |pid| format!("energy (balance {pid})"));
    format!("{source}: {}", parts.join(" · "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use virtprof_engine::guests::GuestLive;

    /// A guest's own words (its name, its counters' names, a gap's cause) reach the terminal
    /// escaped: a compromised guest cannot set the pane title or clear the screen.
    #[test]
    fn a_guests_escape_sequences_never_reach_the_terminal() {
        let mut g = GuestLive {
            agent: 0,
            address: "vsock:3:9478".into(),
            name: "evil\u{1b}[2J".into(),
            rows: 5,
            cpu_pct: vec![("user".into(), 1.0)],
            app_per_s: vec![("app.\u{1b}]0;pwned\u{7}.x".into(), 3.0)],
            noise: None,
            bound_ns: None,
            status: None,
        };
        let shown = guest(&g);
        assert!(!shown.chars().any(char::is_control), "{shown:?}");
        assert!(shown.contains("app.\\u{1b}]0;pwned\\u{7}.x 3.0/s"), "{shown}");
        g.status = Some("stalled\r\u{1b}[1A".into());
        assert!(!guest(&g).chars().any(char::is_control));
    }
}
