//! Self-contained HTML pages (`report --html`, `boot --html`): the data is embedded as JSON;
//! uPlot (vendored, MIT), the shared helpers and the page's own script draw it, so the file
//! works offline and from `file://`.

use serde::Serialize;

const TEMPLATE: &str = include_str!("../assets/page.html");
const PAGE_JS: &str = include_str!("../assets/page.js");
const PAGE_CSS: &str = include_str!("../assets/page.css");
const UPLOT_JS: &str = include_str!("../assets/vendor/uplot-1.6.32/uPlot.iife.min.js");
const UPLOT_CSS: &str = include_str!("../assets/vendor/uplot-1.6.32/uPlot.min.css");

/// A page titled `virtprof KIND: TITLE` that runs `script` over `data`.
pub fn render(kind: &str, title: &str, data: &impl Serialize, script: &str) -> crate::Result<String> {
    // Inside <script>, only "</" can end the element early; JSON allows "<\/" for it.
    let data = serde_json::to_string(data)?.replace("</", "<\\/");
    // Each placeholder is replaced once, data last, so nothing inside the data is rewritten.
    let page = TEMPLATE
        .replace("{{KIND}}", kind)
        .replacen("{{TITLE}}", &escape_text(title), 1)
        .replacen("{{UPLOT_CSS}}", UPLOT_CSS, 1)
        .replacen("{{PAGE_CSS}}", PAGE_CSS, 1)
        .replacen("{{UPLOT_JS}}", UPLOT_JS, 1)
        .replacen("{{PAGE_JS}}", PAGE_JS, 1)
        .replacen("{{SCRIPT}}", script, 1)
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
        for p in ["{{TITLE}}", "{{UPLOT_CSS}}", "{{PAGE_CSS}}", "{{UPLOT_JS}}", "{{PAGE_JS}}", "{{SCRIPT}}", "{{DATA}}"]
        {
            assert_eq!(TEMPLATE.matches(p).count(), 1, "{p}");
        }
        assert_eq!(TEMPLATE.matches("{{KIND}}").count(), 2);
    }
}
