//! `--format csv`: the interval table (sampled and trace-derived columns, per-VM sums) as one
//! wide CSV, a row per interval; empty cells are unknown, not zero.

use std::io::Write;

use virtprof_analysis::intervals::IntervalTable;

/// Write `table` as CSV: `index,start_ns,end_ns`, then one column per series.
pub fn write(table: &IntervalTable, out: &mut dyn Write) -> std::io::Result<()> {
    write!(out, "index,start_ns,end_ns")?;
    for c in &table.columns {
        write!(out, ",{} {}", c.series.entity, c.series.metric)?;
    }
    writeln!(out)?;
    for r in 0..table.rows() {
        write!(out, "{},{},{}", table.index[r], table.start_ns[r], table.end_ns[r])?;
        for c in &table.columns {
            let v = c.values[r];
            if v.is_nan() {
                write!(out, ",")?;
            } else {
                write!(out, ",{v}")?;
            }
        }
        writeln!(out)?;
    }
    out.flush()
}
