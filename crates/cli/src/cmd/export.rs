//! `virtprof export FILE --format csv`: the interval table (sampled and trace-derived columns,
//! per-VM sums) as one wide CSV, a row per interval.

use std::io::Write;
use std::process::ExitCode;

use crate::args::ExportArgs;
use crate::cmd::report::interval_table;
use crate::exit::usage;

pub fn run(args: &ExportArgs) -> anyhow::Result<ExitCode> {
    if args.format != "csv" {
        return Err(usage(format!("--format {}: this build exports csv only", args.format)));
    }
    let (_, table, _) = interval_table(&args.file)?;
    let mut out: Box<dyn Write> = match &args.output {
        Some(path) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(path).map_err(|e| usage(format!("cannot create '{}': {e}", path.display())))?,
        )),
        None => Box::new(std::io::BufWriter::new(std::io::stdout().lock())),
    };
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
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}
