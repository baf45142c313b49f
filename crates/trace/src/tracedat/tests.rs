use super::*;

fn start(version: &str, page_size: u32) -> Vec<u8> {
    let mut v = MAGIC.to_vec();
    v.extend_from_slice(version.as_bytes());
    v.extend_from_slice(&[0, 0, 8]);
    v.extend_from_slice(&page_size.to_le_bytes());
    v
}

#[test]
fn rejects_what_it_cannot_read_with_the_byte() {
    assert!(read(b"hello").unwrap_err().message.contains("bad magic"));
    let mut v5 = MAGIC.to_vec();
    v5.extend_from_slice(b"5\0\0\x08");
    assert!(read(&v5).unwrap_err().message.contains("version 5 is not supported"));
    let cut = &start("7", 4096)[..14];
    assert_eq!(read(cut).unwrap_err().offset, 14);
    assert!(read(&start("7", 4095)).unwrap_err().message.contains("power of two"));
    let mut lz4 = start("7", 4096);
    lz4.extend_from_slice(b"lz4\x001\0");
    assert!(read(&lz4).unwrap_err().message.contains("'lz4' is not supported"));
    // A v6 file cut inside its header_page.
    let mut v6 = start("6", 4096);
    v6.extend_from_slice(b"header_page\0\xff\0\0\0\0\0\0\0abc");
    let e = read(&v6).unwrap_err();
    assert!(e.message.contains("needs 255 more bytes") && e.offset == 38, "{e}");
}

#[test]
fn cpu_data_past_the_end_or_not_whole_pages_is_refused() {
    let data = vec![0u8; 8192];
    let e = cpu_segments(&data, 1, 4096, 8192, 4096, None).unwrap_err();
    assert!(e.message.contains("runs past the end of the file") && e.offset == 4096, "{e}");
    let e = cpu_segments(&data, 1, usize::MAX - 2, 8, 4096, None).unwrap_err();
    assert!(e.message.contains("runs past the end"), "{e}");
    assert!(cpu_segments(&data, 1, 0, 100, 4096, None).unwrap_err().message.contains("whole"));
    assert!(cpu_segments(&data, 1, 0, 0, 4096, None).unwrap().is_empty());
    // Compressed: a chunk count far larger than the data.
    let mut chunks = vec![0xff, 0xff, 0xff, 0x7f];
    chunks.resize(64, 0);
    let e = cpu_segments(&chunks, 0, 0, 64, 4096, Some(Codec::Zlib)).unwrap_err();
    assert!(e.message.contains("more bytes") || e.message.contains("whole"), "{e}");
}

#[test]
fn tsc_clocks_need_a_frequency_and_never_pass_as_nanoseconds() {
    let mut dat = TraceDat { clock: TSC_CLOCK.into(), ..Default::default() };
    assert!(dat.in_cycles());
    // Cycles without a conversion: counts only (no scale, said by the session).
    assert_eq!(dat.time_scale(None), (None, None));
    let (scale, whence) = dat.time_scale(TimeScale::from_khz(2_000_000).map(|s| (s, "--tsc-khz".to_string())));
    assert_eq!((scale.unwrap().apply(2_000_000_000), whence.as_deref()), (1_000_000_000, Some("--tsc-khz")));
    dat.tsc2nsec = Some(Tsc2Nsec { mult: 1 << 23, shift: 24, offset: 7 });
    assert!(!dat.in_cycles());
    let (scale, whence) = dat.time_scale(TimeScale::from_khz(5).map(|s| (s, "--tsc-khz 5".to_string())));
    assert_eq!(scale.unwrap().apply(1000), 500, "the file's TSC2NSEC wins");
    assert!(whence.unwrap().contains("TSC2NSEC"));
    dat.offset_ns = 100;
    assert_eq!(dat.time_scale(None).0.unwrap().apply(1000), 600);
    let local = TraceDat { clock: "local".into(), ..Default::default() };
    assert_eq!(local.time_scale(TimeScale::from_khz(5).map(|s| (s, String::new()))), (None, None));
}
