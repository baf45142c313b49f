//! Decompression and repetition bombs (`support/bombs.rs`) through `Session`, the way every
//! reading command opens a file: each is refused with a clear error naming what the file
//! claims, or read within memory bounded by what is decoded at once (one chunk per CPU),
//! never by what the file says it expands to. The process runs under an address-space limit,
//! so a runaway allocation aborts the test instead of passing slowly.

mod support;

use std::path::{Path, PathBuf};

use support::bombs::{self, Codec, DatBomb};
use virtprof_session::{Session, SessionError};

/// The address space this test process may use: the largest bomb accepted holds 256 MiB of
/// chunks at once; anything near this is a claim believed.
const ADDRESS_SPACE_LIMIT: u64 = 3 << 30;

fn limit_address_space() {
    let limit = libc::rlimit { rlim_cur: ADDRESS_SPACE_LIMIT, rlim_max: ADDRESS_SPACE_LIMIT };
    // SAFETY: setrlimit with a valid struct; lowering our own limit needs no privilege.
    unsafe { libc::setrlimit(libc::RLIMIT_AS, &limit) };
}

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("virtprof-bombs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// Open `path` and walk it whole; the events walked, or the error.
fn read(path: &Path) -> Result<u64, SessionError> {
    let session = Session::open_any(path, &Default::default())?;
    let mut decoder = session.decoder(&["sched"])?;
    let mut events = 0u64;
    session.walk(&mut decoder, |_, _| events += 1)?;
    Ok(events)
}

fn refused(path: &Path, says: &str) {
    match read(path) {
        Err(e) => {
            assert!(e.is_bad_input(), "{}: not bad input: {e}", path.display());
            assert!(e.to_string().contains(says), "{}: {e}", path.display());
            eprintln!("{}: refused: {e}", path.file_name().unwrap().to_string_lossy());
        }
        Ok(events) => panic!("{}: read ({events} events), not refused", path.display()),
    }
}

fn write(name: &str, bytes: &[u8]) -> PathBuf {
    let path = temp(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

#[test]
fn files_whose_sizes_are_claims_are_refused_or_read_within_what_is_decoded_at_once() {
    limit_address_space();
    // CPUs sharing one chunk (the 16 CPUs at one zstd chunk), in every codec, and
    // sharing raw pages in both versions (a time bomb: each CPU decodes the same pages).
    for codec in [Codec::Zstd, Codec::Zlib, Codec::None] {
        let bomb = DatBomb::v7(codec, 16, 4096).shared();
        refused(&write(&format!("shared-{codec:?}.dat"), &bombs::trace_dat(&bomb)), "lies inside CPU 0's");
    }
    refused(&write("shared-v6.dat", &bombs::trace_dat(&DatBomb::v6(1024, 256).shared())), "lies inside CPU 0's");
    // Chunks of their own, but more expanded at once than any real file: 64 CPUs of 16 MiB
    // chunks (1 GiB; the 1 024 CPUs claimed 1 TiB).
    for codec in [Codec::Zstd, Codec::Zlib] {
        let bomb = DatBomb::v7(codec, 64, 4096);
        refused(&write(&format!("wide-{codec:?}.dat"), &bombs::trace_dat(&bomb)), "expanded at once");
    }
    // A chunk claiming more than any chunk trace-cmd writes.
    refused(&write("big-chunk.dat", &bombs::trace_dat(&DatBomb::v7(Codec::Zstd, 1, 8192))), "implausible");
    // One section listed again and again; one CPU table under many buffers.
    let repeated = DatBomb { formats_options: 1000, ..DatBomb::v7(Codec::Zstd, 1, 10) };
    refused(&write("repeated.dat", &bombs::trace_dat(&repeated)), "a second option points at the section");
    let instances = DatBomb { instances: 10_000, ..DatBomb::v6(2, 10) };
    refused(&write("instances.dat", &bombs::trace_dat(&instances)), "points at a CPU table another buffer uses");

    // Within the bound, read: 16 CPUs of 16 MiB chunks walk in at most that at once.
    let fits = write("fits.dat", &bombs::trace_dat(&DatBomb { chunks: 2, ..DatBomb::v7(Codec::Zstd, 16, 4096) }));
    assert_eq!(read(&fits).unwrap(), 0, "empty pages hold no events");
    // More CPUs than the walk gives threads to (expanded one chunk at a time on one thread).
    let many = write("many.dat", &bombs::trace_dat(&DatBomb { chunks: 3, ..DatBomb::v7(Codec::Zlib, 200, 10) }));
    assert_eq!(read(&many).unwrap(), 0);

    // perf.data: one compressed record that inflates to 600 MiB (the 0.6 GiB).
    let seed = std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pvm-pio-user-2x40.perf.data"))
        .unwrap();
    refused(&write("bomb.perf.data", &bombs::perf_data_zstd(&seed, 600 << 20)), "expand past");
    // An expansion within the bound reads: the fixture's own samples, none lost.
    let small = read(&write("small.perf.data", &bombs::perf_data_zstd(&seed, 1 << 20))).unwrap();
    assert_eq!(small, read(&write("plain.perf.data", &seed)).unwrap());

    // A tracefs dump whose CPUs are one file, and ftrace text naming CPUs no kernel has.
    let dump = temp("dump");
    bombs::tracefs_dump_shared(&dump, 64, 256);
    refused(&dump, "are the same file");
    let formats =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../trace/tests/fixtures/kvm-amd-run3_2vcpu_2cpu_pinned/tracefs");
    let text = write("cpus.txt", bombs::ftrace_text_many_cpus(8000, 1000).as_bytes());
    let options = virtprof_session::SourceOptions { formats: Some(formats.clone()), ..Default::default() };
    let err = Session::open_any(&text, &options).err().expect("refused");
    assert!(err.to_string().contains("CPU 8192; no kernel has more than 8192"), "{err}");
    let text = write("cpus-ok.txt", bombs::ftrace_text_many_cpus(0, 8000).as_bytes());
    let session = Session::open_any(&text, &options).unwrap();
    assert_eq!(session.streams().len(), 8000);
    let _ = std::fs::remove_dir_all(temp("x").parent().unwrap());
}
