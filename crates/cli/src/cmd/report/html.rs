//! `report --html`: one self-contained page. The report's JSON is embedded as data; uPlot
//! (vendored, MIT) and our script draw it, so the file works offline and from `file://`.

use super::model::Report;

const TEMPLATE: &str = include_str!("../../../assets/report.html");
const REPORT_JS: &str = include_str!("../../../assets/report.js");
const REPORT_CSS: &str = include_str!("../../../assets/report.css");
const UPLOT_JS: &str = include_str!("../../../assets/vendor/uplot-1.6.32/uPlot.iife.min.js");
const UPLOT_CSS: &str = include_str!("../../../assets/vendor/uplot-1.6.32/uPlot.min.css");

/// The page for `report`.
pub fn render(report: &Report) -> anyhow::Result<String> {
    // Inside <script>, only "</" can end the element early; JSON allows "<\/" for it.
    let data = serde_json::to_string(report)?.replace("</", "<\\/");
    let title = escape_text(&report.recording);
    // Each placeholder is replaced once, data last, so nothing inside the data is rewritten.
    let page = TEMPLATE
        .replacen("{{TITLE}}", &title, 1)
        .replacen("{{UPLOT_CSS}}", UPLOT_CSS, 1)
        .replacen("{{REPORT_CSS}}", REPORT_CSS, 1)
        .replacen("{{UPLOT_JS}}", UPLOT_JS, 1)
        .replacen("{{REPORT_JS}}", REPORT_JS, 1)
        .replacen("{{DATA}}", &data, 1);
    Ok(page)
}

/// Text made safe for an HTML text node.
fn escape_text(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_escaped() {
        assert_eq!(escape_text("a<b>&c"), "a&lt;b&gt;&amp;c");
    }

    #[test]
    fn template_has_each_placeholder_once() {
        for p in ["{{TITLE}}", "{{UPLOT_CSS}}", "{{REPORT_CSS}}", "{{UPLOT_JS}}", "{{REPORT_JS}}", "{{DATA}}"] {
            assert_eq!(TEMPLATE.matches(p).count(), 1, "{p}");
        }
    }
}
