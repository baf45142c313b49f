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
