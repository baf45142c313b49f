//! `report --html`: the shared page with the report's JSON and `assets/report.js`.

use virtprof_engine::report::Report;

const REPORT_JS: &str = include_str!("../../../assets/report.js");

/// The page for `report`.
pub fn render(report: &Report) -> anyhow::Result<String> {
    Ok(virtprof_sinks::html::render("report", &report.recording, report, REPORT_JS)?)
}
