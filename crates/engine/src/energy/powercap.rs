//! RAPL package energy through the powercap sysfs interface
//! (`/sys/class/powercap/intel-rapl:N/energy_uj`, microjoules, wrapping at
//! `max_energy_range_uj`). Only top-level (package) zones are summed: sub-zones (core, uncore,
//! dram) are parts of their package or, for dram, outside the cores this model charges.

use std::path::{Path, PathBuf};

/// One package zone.
struct Zone {
    energy: PathBuf,
    range_uj: u64,
    last_uj: u64,
}

/// All package zones of the host.
pub struct Powercap {
    zones: Vec<Zone>,
}

impl Powercap {
    /// The package zones under `root` (normally `/sys/class/powercap`); None when there are
    /// none or their counters cannot be read (non-root on kernels that restrict them).
    pub fn open(root: &Path) -> Option<Powercap> {
        let mut zones = Vec::new();
        for entry in std::fs::read_dir(root).ok()?.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            // Packages are `intel-rapl:N` (or `amd-rapl:N`...); sub-zones add `:M`.
            if name.matches(':').count() != 1 {
                continue;
            }
            let dir = entry.path();
            let read = |f: &str| std::fs::read_to_string(dir.join(f)).ok()?.trim().parse::<u64>().ok();
            if let (Some(last_uj), Some(range_uj)) = (read("energy_uj"), read("max_energy_range_uj")) {
                zones.push(Zone { energy: dir.join("energy_uj"), range_uj, last_uj });
            }
        }
        (!zones.is_empty()).then_some(Powercap { zones })
    }

    /// Joules since the previous call (or since opening).
    pub fn joules(&mut self) -> f64 {
        let mut uj = 0u64;
        for z in &mut self.zones {
            let now = std::fs::read_to_string(&z.energy).ok().and_then(|t| t.trim().parse::<u64>().ok());
            if let Some(now) = now {
                uj += if now >= z.last_uj { now - z.last_uj } else { z.range_uj - z.last_uj + now };
                z.last_uj = now;
            }
        }
        uj as f64 / 1e6
    }
}

/// Where powercap lives.
pub const ROOT: &str = "/sys/class/powercap";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn package_zones_are_summed_across_a_wrap() {
        let root = std::env::temp_dir().join(format!("virtprof-powercap-{}", std::process::id()));
        let zone = |name: &str, uj: u64| {
            let dir = root.join(name);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("energy_uj"), format!("{uj}\n")).unwrap();
            std::fs::write(dir.join("max_energy_range_uj"), "1000000\n").unwrap();
        };
        assert!(Powercap::open(&root).is_none(), "no directory, no zones");
        zone("intel-rapl:0", 999_000);
        zone("intel-rapl:0:0", 5);
        zone("intel-rapl:1", 100);
        let mut p = Powercap::open(&root).unwrap();
        assert_eq!(p.zones.len(), 2, "sub-zones are parts of their package");
        zone("intel-rapl:0", 1_000); // wrapped: 1000 + 1000 µJ
        zone("intel-rapl:1", 2_100);
        assert!((p.joules() - 0.004).abs() < 1e-12);
        std::fs::remove_dir_all(&root).unwrap();
    }
}
