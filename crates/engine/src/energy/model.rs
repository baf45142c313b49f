//! The model file of `virtprof balance`: energy weights and thermal parameters in TOML. The
//! documented defaults are a file shipped in the binary (`virtprof balance weights` prints it),
//! so the comments users read and the values the code uses cannot drift apart.

use std::path::Path;

use serde::{Deserialize, Serialize};
use virtprof_analysis::energy::{Thermal, Weights};

use crate::usage;

/// The default model file, with its documentation.
pub const DEFAULT_TOML: &str = include_str!("../../assets/balance/model.toml");

/// Energy weights and thermal parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Model {
    /// W while running.
    pub active_power_w: f64,
    /// J per event, by metric.
    #[serde(default)]
    pub per_event_j: std::collections::BTreeMap<String, f64>,
    /// The RC model of a core.
    #[serde(default)]
    pub thermal: Thermal,
}

impl Model {
    /// The documented defaults.
    pub fn default_model() -> Model {
        toml::from_str(DEFAULT_TOML).expect("the shipped model file parses")
    }

    /// `--weights FILE`, or the defaults.
    pub fn load(path: Option<&Path>) -> anyhow::Result<Model> {
        let Some(path) = path else { return Ok(Model::default_model()) };
        let text = virtprof_host::input::read_text(path, "--weights", virtprof_host::input::SMALL_TEXT)?;
        let model: Model = toml::from_str(&text).map_err(|e| {
            let why = e.to_string();
            usage(format!(
                "--weights {}: {}\n(`virtprof balance weights` prints a documented example)",
                path.display(),
                why.trim_end()
            ))
        })?;
        model.check().map_err(|e| usage(format!("--weights {}: {e}", path.display())))?;
        Ok(model)
    }

    fn check(&self) -> Result<(), String> {
        if !(self.active_power_w.is_finite() && self.active_power_w >= 0.0) {
            return Err(format!("active_power_w = {}: must be a finite number of watts ≥ 0", self.active_power_w));
        }
        if let Some((name, w)) = self.per_event_j.iter().find(|(_, w)| !w.is_finite()) {
            return Err(format!("per_event_j.\"{name}\" = {w}: must be finite"));
        }
        let t = &self.thermal;
        if !(t.capacity_j_per_k > 0.0 && t.resistance_k_per_w > 0.0 && t.ambient_c.is_finite()) {
            return Err("thermal: capacity_j_per_k and resistance_k_per_w must be > 0".into());
        }
        Ok(())
    }

    /// The energy weights alone.
    pub fn weights(&self) -> Weights {
        Weights { active_power_w: self.active_power_w, per_event_j: self.per_event_j.clone() }
    }

    /// This model as a TOML file (for `calibrate -o`).
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).expect("a model serializes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_defaults_parse_and_pass_their_own_checks() {
        let m = Model::default_model();
        assert_eq!(m.active_power_w, 10.0);
        assert_eq!(m.per_event_j["kvm.exits"], 1e-6);
        assert_eq!(m.thermal, Thermal::default(), "the file documents the code's defaults");
        m.check().unwrap();
    }

    #[test]
    fn a_written_model_reads_back() {
        let mut m = Model::default_model();
        m.active_power_w = 12.5;
        let back: Model = toml::from_str(&m.to_toml()).unwrap();
        assert_eq!(back, m);
    }

    #[test]
    fn bad_files_are_explained() {
        let dir = std::env::temp_dir().join(format!("virtprof-model-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let bad = dir.join("bad.toml");
        std::fs::write(&bad, "active_power_w = 10\nactive_power = 3\n").unwrap();
        let e = format!("{:#}", Model::load(Some(&bad)).unwrap_err());
        assert!(e.contains("bad.toml") && e.contains("active_power"), "{e}");
        std::fs::write(&bad, "active_power_w = -1\n").unwrap();
        let e = format!("{:#}", Model::load(Some(&bad)).unwrap_err());
        assert!(e.contains("≥ 0"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
