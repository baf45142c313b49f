//! Issue 54, item 1: decompression and repetition bombs (made by the session crate's
//! generator) through the commands people run on files from elsewhere, `import` and `exits`,
//! each a process of its own under an address-space limit, its peak memory measured by the
//! kernel (wait4, in a small parent of its own). Every bomb exits 2 with what the file claims,
//! leaves no output file, and stays small; a file within the bounds reads in memory bounded by
//! one chunk per CPU.

#[path = "../../../session/tests/support/bombs.rs"]
pub(super) mod generator;

use std::path::{Path, PathBuf};
use std::process::Stdio;

use generator::{Codec, DatBomb};

use super::util::{temp, virtprof};

/// What a run of virtprof did: exit code, stderr, peak RSS in MiB.
struct Run {
    code: Option<i32>,
    stderr: String,
    peak_mib: u64,
}

/// Starts its arguments as a child under a 4 GiB address-space limit, stdout to /dev/null, and
/// prints the child's wait status and peak RSS (KiB). The child is forked from this small
/// parent, not from the test binary: at exec the kernel counts the forking process's peak into
/// the child's ru_maxrss, and a test binary running the whole suite's threads once made a bomb
/// that peaks at 18 MiB read as 70.
const MEASURE: &str = r#"
import os, resource, sys
pid = os.fork()
if pid == 0:
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    os.execv(sys.argv[1], sys.argv[1:])
_, status, usage = os.wait4(pid, 0)
print(os.waitstatus_to_exitcode(status), usage.ru_maxrss)
"#;

/// Run `virtprof ARGS` under a 4 GiB address-space limit and measure its peak RSS.
fn run(args: &[&std::ffi::OsStr]) -> Run {
    let err_path = temp(&format!("bomb-stderr-{}", args.len()));
    let err = std::fs::File::create(&err_path).unwrap();
    let binary = virtprof().get_program().to_owned();
    let measured = std::process::Command::new("python3")
        .args(["-c".as_ref(), MEASURE.as_ref(), binary.as_os_str()])
        .args(args)
        .stderr(Stdio::from(err))
        .output()
        .expect("python3 (scripts/test.sh installs it)");
    let stdout = String::from_utf8_lossy(&measured.stdout);
    let (code, kib) = stdout.trim().split_once(' ').unwrap_or_else(|| panic!("measuring virtprof: {stdout:?}"));
    let code: i32 = code.parse().unwrap();
    let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
    let _ = std::fs::remove_file(&err_path);
    Run { code: (code >= 0).then_some(code), stderr, peak_mib: kib.parse::<u64>().unwrap() / 1024 }
}

fn write(name: &str, bytes: &[u8]) -> PathBuf {
    let path = temp(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

/// `import` and `exits` on `path` both exit 2 saying `says`, within `most_mib`, and import
/// leaves no recording behind.
fn refused(path: &Path, says: &str, most_mib: u64) {
    let out = temp("bomb-import.vprec");
    for args in [vec![path.as_os_str(), "-o".as_ref(), out.as_os_str()], vec![path.as_os_str()]] {
        let command = if args.len() == 3 { "import" } else { "exits" };
        let mut argv: Vec<&std::ffi::OsStr> = vec![command.as_ref()];
        argv.extend(args);
        let r = run(&argv);
        let name = path.file_name().unwrap().to_string_lossy();
        eprintln!("{command} {name}: exit {:?}, peak {} MiB: {}", r.code, r.peak_mib, r.stderr.trim());
        assert_eq!(r.code, Some(2), "{command} {name}: {}", r.stderr);
        assert!(r.stderr.contains(says), "{command} {name}: {}", r.stderr);
        assert!(r.peak_mib <= most_mib, "{command} {name}: peak {} MiB", r.peak_mib);
        assert!(!out.exists(), "import left {}", out.display());
    }
}

#[test]
fn decompression_bombs_exit_2_in_little_memory_and_what_fits_reads_a_chunk_at_a_time() {
    let shared = write("bomb-shared.dat", &generator::trace_dat(&DatBomb::v7(Codec::Zstd, 16, 4096).shared()));
    refused(&shared, "lies inside CPU 0's", 64);
    let wide = write("bomb-wide.dat", &generator::trace_dat(&DatBomb::v7(Codec::Zlib, 64, 4096)));
    refused(&wide, "expanded at once", 64);
    let v6 = write("bomb-v6.dat", &generator::trace_dat(&DatBomb::v6(1024, 256).shared()));
    refused(&v6, "lies inside CPU 0's", 64);
    let perf = std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../session/tests/fixtures/pvm-pio-user-2x40.perf.data"),
    )
    .unwrap();
    let perf = write("bomb.perf.data", &generator::perf_data_zstd(&perf, 600 << 20));
    refused(&perf, "expand past", 64);
    let dump = temp("bomb-dump");
    generator::tracefs_dump_shared(&dump, 64, 4096);
    refused(&dump, "are the same file", 64);

    // Within the bounds: 16 CPUs of two 16 MiB chunks each (512 MiB once expanded). `exits`
    // holds a chunk per CPU at once (256 MiB on its decoding threads); `import` one chunk.
    let fits =
        write("bomb-fits.dat", &generator::trace_dat(&DatBomb { chunks: 2, ..DatBomb::v7(Codec::Zstd, 16, 4096) }));
    let r = run(&["exits".as_ref(), fits.as_os_str()]);
    eprintln!("exits on 16 CPUs of 16 MiB chunks: exit {:?}, peak {} MiB", r.code, r.peak_mib);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(r.peak_mib <= 256 + 96, "peak {} MiB", r.peak_mib);
    let out = temp("bomb-fits.vprec");
    let r = run(&["import".as_ref(), fits.as_os_str(), "-o".as_ref(), out.as_os_str()]);
    eprintln!("import of it: exit {:?}, peak {} MiB", r.code, r.peak_mib);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(r.peak_mib <= 96, "peak {} MiB", r.peak_mib);
    assert!(std::fs::metadata(&out).unwrap().len() > 512 << 20, "the recording holds every page");
    for p in [shared, wide, v6, perf, fits, out] {
        let _ = std::fs::remove_file(p);
    }
    let _ = std::fs::remove_dir_all(dump);
}
