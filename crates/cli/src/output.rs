//! Where commands write: standard output, whose failures name it (a full disk or a closed pipe
//! must not read as a problem with some input file), or an output file put in place only when
//! whole (`virtprof_host::output`). `-o -` means standard output.

use std::io::{self, BufWriter, StdoutLock, Write};
use std::path::Path;

use virtprof_host::output::{OutputError, OutputFile, Privacy};

/// Standard output (line-buffered, as std keeps it, so a write error surfaces at the line
/// that met it), its errors saying so.
pub fn stdout() -> Stdout {
    Stdout(io::stdout().lock())
}

/// Standard output whose errors name it.
pub struct Stdout(StdoutLock<'static>);

impl Write for Stdout {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write(buf).map_err(named)
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.0.write_all(buf).map_err(named)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush().map_err(named)
    }
}

/// `value` as indented JSON and a newline, in one write. Standard output is line-buffered:
/// serialized straight into it, a report cost a write(2) per line (a 2.3 MB `testvm --json`
/// took 70 s in the emulated arm64 bed, where each system call is slow).
pub fn write_json_pretty(out: &mut impl Write, value: &impl serde::Serialize) -> anyhow::Result<()> {
    let mut text = serde_json::to_vec_pretty(value)?;
    text.push(b'\n');
    out.write_all(&text)?;
    Ok(())
}

/// Keep the kind (a closed pipe is still `BrokenPipe`, so it ends quietly) and say where.
fn named(e: io::Error) -> io::Error {
    let text = match e.raw_os_error() {
        Some(code) => io::Error::from_raw_os_error(code).to_string(),
        None => e.to_string(),
    };
    io::Error::new(e.kind(), format!("writing to standard output: {text}"))
}

/// An output that is a file (`-o PATH`) or standard output (no `-o`, or `-o -`).
pub enum Output {
    Stdout(BufWriter<Stdout>),
    File(BufWriter<OutputFile>),
}

impl Output {
    /// Open `path` (Some) or standard output.
    pub fn open(path: Option<&Path>, privacy: Privacy) -> Result<Output, OutputError> {
        Ok(match path {
            Some(p) if p.as_os_str() != "-" => {
                Output::File(BufWriter::with_capacity(1 << 20, OutputFile::create(p, privacy)?))
            }
            _ => Output::Stdout(BufWriter::with_capacity(1 << 16, stdout())),
        })
    }

    /// Flush, and put a file in place.
    pub fn finish(self) -> anyhow::Result<()> {
        match self {
            Output::Stdout(mut out) => out.flush()?,
            Output::File(out) => out.into_inner().map_err(|e| e.into_error())?.commit()?,
        }
        Ok(())
    }
}

impl Write for Output {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Output::Stdout(out) => out.write(buf),
            Output::File(out) => out.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Output::Stdout(out) => out.flush(),
            Output::File(out) => out.flush(),
        }
    }
}
