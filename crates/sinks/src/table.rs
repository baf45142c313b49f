//! A plain table: a header, rows of already formatted cells, optional footer lines.
//! Numbers are right-aligned, text left-aligned; empty cells print as `-` (as rtla does).

use std::io::{self, Write};

/// A table ready to render.
#[derive(Debug, Clone, Default)]
pub struct Table {
    headers: Vec<String>,
    rows: Vec<Vec<String>>,
    footer: Vec<String>,
}

impl Table {
    /// A table with these column headers.
    pub fn new<S: Into<String>>(headers: impl IntoIterator<Item = S>) -> Self {
        Table { headers: headers.into_iter().map(Into::into).collect(), ..Default::default() }
    }

    /// Append a row; missing cells are padded, extra ones dropped.
    pub fn row<S: Into<String>>(&mut self, cells: impl IntoIterator<Item = S>) {
        // Cells hold names from /proc, guests and files: never raw escape sequences.
        let mut cells: Vec<String> =
            cells.into_iter().map(|c| virtprof_model::units::printable(&c.into()).into_owned()).collect();
        cells.resize(self.headers.len(), String::new());
        self.rows.push(cells);
    }

    /// A line printed under the table (loss counts, notes).
    pub fn footer(&mut self, line: impl Into<String>) {
        self.footer.push(line.into());
    }

    /// Number of data rows.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// True when there are no data rows.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Render aligned text.
    pub fn write_text(&self, mut w: impl Write) -> io::Result<()> {
        let cell = |c: &str| {
            if c.is_empty() {
                "-".to_string()
            } else {
                c.to_string()
            }
        };
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        let numeric: Vec<bool> = (0..self.headers.len())
            .map(|i| self.rows.iter().all(|r| r[i].is_empty() || looks_numeric(&r[i])) && !self.rows.is_empty())
            .collect();
        for row in &self.rows {
            for (i, c) in row.iter().enumerate() {
                widths[i] = widths[i].max(cell(c).chars().count());
            }
        }
        let line = |cells: &[String], w: &mut dyn Write| -> io::Result<()> {
            let mut out = String::new();
            for (i, c) in cells.iter().enumerate() {
                let c = cell(c);
                let pad = widths[i] - c.chars().count();
                if i > 0 {
                    out.push_str("  ");
                }
                if numeric[i] {
                    out.extend(std::iter::repeat_n(' ', pad));
                    out.push_str(&c);
                } else {
                    out.push_str(&c);
                    if i + 1 < cells.len() {
                        out.extend(std::iter::repeat_n(' ', pad));
                    }
                }
            }
            writeln!(w, "{}", out.trim_end())
        };
        line(&self.headers, &mut w)?;
        for row in &self.rows {
            line(row, &mut w)?;
        }
        for f in &self.footer {
            writeln!(w, "{f}")?;
        }
        Ok(())
    }

    /// Render CSV (RFC 4180 quoting; footers are not data and are left out). An unknown
    /// figure ([`UNKNOWN`]) is an empty field, as a null is everywhere else.
    pub fn write_csv(&self, mut w: impl Write) -> io::Result<()> {
        let quote = |c: &str| {
            if c == UNKNOWN {
                String::new()
            } else if c.contains([',', '"', '\n']) {
                format!("\"{}\"", c.replace('"', "\"\""))
            } else {
                c.to_string()
            }
        };
        for row in std::iter::once(&self.headers).chain(&self.rows) {
            writeln!(w, "{}", row.iter().map(|c| quote(c)).collect::<Vec<_>>().join(","))?;
        }
        Ok(())
    }
}

/// A cell whose figure the source has no evidence for (`model::evidence`): "unknown" in text,
/// empty in CSV; what it lacks is said below the table.
pub const UNKNOWN: &str = "unknown";

/// A figure as a cell: `show(value)`, or [`UNKNOWN`].
pub fn known<T>(value: Option<T>, show: impl FnOnce(T) -> String) -> String {
    value.map_or_else(|| UNKNOWN.to_string(), show)
}

fn looks_numeric(s: &str) -> bool {
    if s == UNKNOWN {
        return true;
    }
    let s = s.trim_end_matches(['%', 's']).trim_end_matches("m").trim_end_matches("µ").trim_end_matches('n');
    !s.is_empty() && s.parse::<f64>().is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligns_numbers_right_and_text_left() {
        let mut t = Table::new(["NAME", "COUNT"]);
        t.row(["io", "12"]);
        t.row(["mmio_exits", "3"]);
        t.row(["x", ""]);
        t.footer("lost events: 0");
        let mut out = Vec::new();
        t.write_text(&mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "NAME        COUNT\nio             12\nmmio_exits      3\nx               -\nlost events: 0\n"
        );
    }

    #[test]
    fn quotes_csv() {
        let mut t = Table::new(["a", "b"]);
        t.row(["1,2", "say \"hi\""]);
        let mut out = Vec::new();
        t.write_csv(&mut out).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), "a,b\n\"1,2\",\"say \"\"hi\"\"\"\n");
    }
}
