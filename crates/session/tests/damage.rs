//! Damage a checksum cannot see, found by fuzzing (`tests/fuzz.rs`) and kept here as
//! regression tests: each chunk is rewritten with a valid CRC.

use virtprof_session::Session;

fn fixture() -> Vec<u8> {
    std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/pvm-pio-user.vprec")).unwrap()
}

/// Rewrite the payload of the first chunk of `kind` with `edit`, fixing its length and CRC.
fn rewrite_chunk(bytes: &[u8], kind: u32, edit: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut at = 12;
    while at + 16 <= bytes.len() {
        let this = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
        let len = usize::try_from(u64::from_le_bytes(bytes[at + 4..at + 12].try_into().unwrap())).unwrap();
        if this == kind {
            let mut payload = bytes[at + 16..at + 16 + len].to_vec();
            edit(&mut payload);
            let mut out = bytes[..at].to_vec();
            out.extend_from_slice(&kind.to_le_bytes());
            out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
            out.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
            out.extend_from_slice(&payload);
            out.extend_from_slice(&bytes[at + 16 + len..]);
            return out;
        }
        at += 16 + len;
    }
    panic!("no chunk of kind {kind}");
}

const PAGES: u32 = 2;
const FOOTER: u32 = 3;

#[test]
fn a_cpu_id_no_kernel_has_is_refused() {
    // A pages chunk starts with its CPU as a u32; every per-CPU table is indexed by it.
    let bytes = rewrite_chunk(&fixture(), PAGES, |p| p[..4].copy_from_slice(&4_000_000_000u32.to_le_bytes()));
    let err = Session::from_bytes(bytes, "cpu.vprec").err().expect("refused");
    assert!(err.is_bad_input());
    assert!(err.to_string().contains("names CPU 4000000000"), "{err}");
}

#[test]
fn a_footer_that_disagrees_with_the_pages_is_noticed() {
    let intact = Session::from_bytes(fixture(), "ok.vprec").unwrap();
    assert_eq!(intact.footer_mismatch(), None);
    let bytes = rewrite_chunk(&fixture(), FOOTER, |p| {
        let mut footer: serde_json::Value = serde_json::from_slice(p).unwrap();
        footer["pages"] = serde_json::json!(footer["pages"].as_u64().unwrap() + 7);
        *p = serde_json::to_vec(&footer).unwrap();
    });
    let altered = Session::from_bytes(bytes, "altered.vprec").unwrap();
    let warning = altered.footer_mismatch().expect("a warning");
    assert!(warning.contains("the file was altered"), "{warning}");
}

/// The footer with its loss figures replaced by `cpu_loss` (JSON `[[cpu, overrun, dropped]]`).
fn with_footer_loss(cpu_loss: serde_json::Value) -> Session {
    let bytes = rewrite_chunk(&fixture(), FOOTER, |p| {
        let mut footer: serde_json::Value = serde_json::from_slice(p).unwrap();
        footer["cpu_loss"] = cpu_loss;
        *p = serde_json::to_vec(&footer).unwrap();
    });
    Session::from_bytes(bytes, "loss.vprec").unwrap()
}

#[test]
fn loss_figures_no_kernel_can_write_make_the_loss_unknown() {
    let intact = Session::from_bytes(fixture(), "ok.vprec").unwrap();
    assert_eq!(intact.footer_loss_doubt(), None);
    let plausible = with_footer_loss(serde_json::json!([[0, 1000, 0], [1, 0, 5]]));
    assert_eq!(plausible.footer_loss_doubt(), None);
    let walk = virtprof_trace::merge::WalkStats::default();
    assert_eq!(plausible.loss(&walk).total(), 1005);
    for (cpu_loss, says) in [
        (serde_json::json!([[0, u64::MAX, 0]]), "more than a CPU can emit"),
        (serde_json::json!([[0, 1u64 << 40, 1u64 << 40]]), "more than a CPU can emit"),
        (serde_json::json!([[7, 5, 0]]), "on CPU 7, which the recording does not have"),
    ] {
        let damaged = with_footer_loss(cpu_loss.clone());
        let doubt = damaged.footer_loss_doubt().unwrap_or_else(|| panic!("{cpu_loss} taken"));
        assert!(doubt.contains(says), "{doubt}");
        let loss = damaged.loss(&walk);
        assert!(!loss.complete, "{cpu_loss}: the loss is unknown, not {}", loss.total());
        assert!(loss.describe(0).starts_with("unknown: its footer counts"), "{}", loss.describe(0));
    }
}

/// The metadata with its trace clock replaced.
fn with_clock(clock: &str) -> Result<Session, virtprof_session::SessionError> {
    let bytes = rewrite_chunk(&fixture(), METADATA, |p| {
        let mut metadata: serde_json::Value = serde_json::from_slice(p).unwrap();
        metadata["trace_clock"] = serde_json::json!(clock);
        *p = serde_json::to_vec(&metadata).unwrap();
    });
    Session::from_bytes(bytes, "clock.vprec")
}

const METADATA: u32 = 1;

#[test]
fn timestamps_that_are_not_nanoseconds_are_read_as_counts_and_an_unknown_clock_is_doubted() {
    // "": a version 6 trace.dat that does not say its clock (not a damaged one).
    for clock in ["local", "mono", "boot", ""] {
        let session = with_clock(clock).unwrap();
        assert_eq!((session.clock_doubt(), session.clock_not_time()), (None, None), "{clock}");
    }
    // Counting needs no clock: the source opens, and says why no duration can be read.
    for (clock, says) in [("counter", "event counts"), ("uptime", "jiffies"), ("x86-tsc", "CPU cycles")] {
        let session = with_clock(clock).unwrap_or_else(|e| panic!("{clock}: {e}"));
        let not_time = session.clock_not_time().unwrap_or_else(|| panic!("{clock} read as time"));
        assert!(not_time.contains(says), "{clock}: {not_time}");
        let holdings = session.holdings(&session.decoder(&[]).unwrap());
        assert!(holdings.check(virtprof_model::evidence::Figure::Running).is_err(), "{clock}");
    }
    let doubt = with_clock("bogus").unwrap().clock_doubt().expect("a warning");
    assert!(doubt.contains("'bogus' is not one Linux has"), "{doubt}");
}
