//! Recordings whose ring buffers overflowed read everywhere, and every command reports the same
//! loss `record` printed, with where it happened; live views keep running through loss; a
//! recording without its footer says its loss is unknown.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;

use super::util::{have_kvm, have_tracefs, note, temp, virtprof};

/// The regression fixtures made on this project's PVM host (`scripts/fixtures/lossy.sh`).
fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../trace/tests/fixtures/pvm-6.18-lossy").join(name)
}

/// The figure in `record`'s summary line (`...; lost events: N`).
fn recorded_loss(summary: &str) -> u64 {
    summary
        .lines()
        .find_map(|l| l.split("lost events: ").nth(1))
        .and_then(|n| n.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok())
        .unwrap_or_else(|| panic!("no loss figure in {summary:?}"))
}

fn run(args: &[&str], file: &Path) -> Output {
    let out = virtprof().args(&args[..1]).arg(file).args(&args[1..]).output().unwrap();
    assert!(
        out.status.success(),
        "virtprof {args:?} {}: {}\n{}",
        file.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Every reading command on `file`: exit 0, and the loss it reports equals `expected` (text:
/// the `lost events: N` line on stdout or stderr; JSON: `lost_events`).
fn every_command_reports(file: &Path, expected: u64, with_intervals: bool) {
    let dir = temp(&format!("loss-out-{}", file.file_name().unwrap().to_string_lossy()));
    let _ = std::fs::create_dir_all(&dir);
    let text_line = format!("lost events: {expected}");
    let mut text_commands: Vec<Vec<String>> = vec![
        vec!["exits".into()],
        vec!["exits".into(), "--by".into(), "vcpu".into()],
        vec!["sched".into()],
        vec!["report".into()],
        vec!["report".into(), "--html".into(), dir.join("r.html").display().to_string()],
        vec![
            "export".into(),
            "--format".into(),
            "perfetto".into(),
            "-o".into(),
            dir.join("p.json").display().to_string(),
        ],
        vec!["export".into(), "--format".into(), "parquet".into(), "-o".into(), dir.join("pq").display().to_string()],
    ];
    if with_intervals {
        text_commands.push(vec![
            "export".into(),
            "--format".into(),
            "csv".into(),
            "-o".into(),
            dir.join("c.csv").display().to_string(),
        ]);
        text_commands.push(vec!["compare".into(), file.display().to_string()]);
        text_commands.push(vec!["balance".into(), "--replay".into()]);
    }
    for args in &text_commands {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        // `balance --replay FILE`: the file follows the flag.
        let out = if args[0] == "balance" {
            let out = virtprof().args(&args).arg(file).output().unwrap();
            assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
            out
        } else {
            run(&args, file)
        };
        let all = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(all.contains(&text_line), "virtprof {args:?}: no '{text_line}' in\n{all}");
    }
    for args in [&["exits", "--json"][..], &["sched", "--json"], &["report", "--json"]] {
        let out = run(args, file);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["lost_events"], expected, "virtprof {args:?}");
        assert_eq!(v["loss"]["complete"], true, "virtprof {args:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_lossy_fixtures_read_everywhere_with_the_kernels_loss() {
    let rec = fixture("tiny-buffer.vprec");
    let expected = recorded_loss(&std::fs::read_to_string(fixture("record.txt")).unwrap());
    assert!(expected > 0);
    every_command_reports(&rec, expected, false);
    // Where: the CPU and a time span inside the recording.
    let v: Value = serde_json::from_slice(&run(&["exits", "--json"], &rec).stdout).unwrap();
    let lossy: Vec<&Value> = v["loss"]["cpus"].as_array().unwrap().iter().filter(|c| c["gaps"] != 0).collect();
    assert_eq!(lossy.len(), 1, "{}", v["loss"]);
    assert_eq!(lossy[0]["on_pages"], expected, "the pages' counts equal the kernel's");
    assert!(lossy[0]["span_ns"].is_array());

    // The raw dump: the loss equals the kernel's per-CPU overrun counters in its stats files.
    let dump = fixture("tracefs");
    let overrun: u64 = (0..2)
        .map(|cpu| {
            let stats = std::fs::read_to_string(dump.join(format!("per_cpu/cpu{cpu}/stats"))).unwrap();
            stats.lines().find_map(|l| l.strip_prefix("overrun: ")?.trim().parse::<u64>().ok()).unwrap()
        })
        .sum();
    assert!(overrun > 0);
    for args in [&["exits", "--json"][..], &["report", "--json"]] {
        let v: Value = serde_json::from_slice(&run(args, &dump).stdout).unwrap();
        assert_eq!(v["lost_events"], overrun, "virtprof {args:?} on the dump");
    }
}

/// Byte offset of the last chunk (the footer) of a recording: chunks follow the 12-byte file
/// header, each a 16-byte header (kind u32, length u64, crc u32) and its payload.
fn last_chunk_offset(bytes: &[u8]) -> usize {
    let (mut at, mut last) = (12, 12);
    while at + 16 <= bytes.len() {
        last = at;
        at += 16 + usize::try_from(u64::from_le_bytes(bytes[at + 4..at + 12].try_into().unwrap())).unwrap();
    }
    last
}

#[test]
fn a_recording_without_its_footer_says_its_loss_is_unknown() {
    let bytes = std::fs::read(fixture("tiny-buffer.vprec")).unwrap();
    let end = last_chunk_offset(&bytes);
    assert_eq!(u32::from_le_bytes(bytes[end..end + 4].try_into().unwrap()), 3, "the last chunk is the footer");
    let (at_boundary, mid_chunk) = (temp("nofooter.vprec"), temp("midchunk.vprec"));
    std::fs::write(&at_boundary, &bytes[..end]).unwrap();
    std::fs::write(&mid_chunk, &bytes[..end + 20]).unwrap();
    for file in [&at_boundary, &mid_chunk] {
        for args in [&["exits"][..], &["report"]] {
            let out = run(args, file);
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(stdout.contains(&format!("lost events: unknown past byte {end}")), "{args:?}: {stdout}");
        }
        let v: Value = serde_json::from_slice(&run(&["report", "--json"], file).stdout).unwrap();
        assert_eq!(v["loss"]["complete"], false);
        assert_eq!(v["loss"]["known_until_byte"], end);
        // Commands that stop early still say it, on stderr.
        let out = virtprof().arg("sched").arg(file).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(&format!("past byte {end}")) || stderr.contains("unknown"), "{stderr}");
    }
    let _ = (std::fs::remove_file(at_boundary), std::fs::remove_file(mid_chunk));
}

#[test]
fn a_live_tiny_buffer_recording_reads_everywhere_with_records_figure() {
    let test = "a_live_tiny_buffer_recording_reads_everywhere_with_records_figure";
    let Some(_vms) = have_kvm(test) else { return };
    if !have_tracefs(test) {
        return;
    }
    let rec = temp("tiny.vprec");
    let exe = assert_cmd::cargo::cargo_bin("virtprof");
    let out = virtprof()
        .args(["record", "-o"])
        .arg(&rec)
        .args(["--buffer-size", "4", "--interval", "10ms", "--"])
        .arg(&exe)
        .args(["testvm", "--workload", "phases", "--phases", "pio-kernel:20000,compute:100ms,pio-user:2000"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let expected = recorded_loss(&stderr);
    assert!(expected > 0, "a 4 KB buffer on an exit-heavy guest must overflow: {stderr}");
    every_command_reports(&rec, expected, true);
    let _ = std::fs::remove_file(rec);
}

#[test]
fn a_recording_cut_short_before_its_footer_still_names_its_vms() {
    // The VM starts after the trace does, so only the scans during the recording name its
    // threads: before tasks chunks, that was the footer alone, and `sched` on a file cut short
    // (a full disk) said "no thread emitted kvm events" while `exits` read thousands.
    let test = "a_recording_cut_short_before_its_footer_still_names_its_vms";
    let Some(_vms) = have_kvm(test) else { return };
    if !have_tracefs(test) {
        return;
    }
    let (rec, cut) = (temp("cut-whole.vprec"), temp("cut-short.vprec"));
    let exe = assert_cmd::cargo::cargo_bin("virtprof");
    let out = virtprof()
        .args(["record", "-o"])
        .arg(&rec)
        .arg("--")
        .arg(&exe)
        .args(["testvm", "--workload", "pio-user", "--duration", "400ms"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let bytes = std::fs::read(&rec).unwrap();
    let end = last_chunk_offset(&bytes);
    std::fs::write(&cut, &bytes[..end]).unwrap();
    let vms = |file: &Path| -> Vec<(Value, Value, Value)> {
        let v: Value = serde_json::from_slice(&run(&["sched", "--json"], file).stdout).unwrap();
        let vms = v["windows"][0]["vms"].as_array().unwrap().clone();
        vms.iter().map(|vm| (vm["pid"].clone(), vm["name"].clone(), vm["io_count"].clone())).collect()
    };
    let (whole, short) = (vms(&rec), vms(&cut));
    assert!(!whole.is_empty(), "the whole recording has the VM");
    assert_eq!(short, whole, "the same VMs, named and counted the same, without the footer");
    let _ = (std::fs::remove_file(rec), std::fs::remove_file(cut));
}

/// A child process stopped with SIGTERM and reaped when dropped (testvm stops its VMs and
/// waits for them, so no load outlives the test).
struct Reaped(std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        // SAFETY: kill with our child's pid and a valid signal.
        unsafe { libc::kill(self.0.id() as libc::pid_t, libc::SIGTERM) };
        let _ = self.0.wait();
    }
}

/// Exit-heavy testvm VMs (`pio-kernel`, with `args`) running in the background, quietly.
fn testvm_load(args: &[&str]) -> Reaped {
    Reaped(
        virtprof()
            .args(["testvm", "--workload", "pio-kernel"])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    )
}

#[test]
fn live_views_keep_running_through_loss_under_load() {
    let test = "live_views_keep_running_through_loss_under_load";
    let Some(_vms) = have_kvm(test) else { return };
    if !have_tracefs(test) {
        return;
    }
    // The test's own load: 16 exit-heavy VMs and a CPU hog per CPU.
    let vms = testvm_load(&["--vms", "16", "--duration", "25s", "--name", "lossload"]);
    let hogs: Vec<Reaped> = (0..2)
        .map(|_| Reaped(Command::new("sh").args(["-c", "while :; do :; done"]).stdout(Stdio::null()).spawn().unwrap()))
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(500));

    // The traced path: the one events can be lost on the way to user space.
    let top = virtprof().args(["top", "--once", "-d", "2", "--json", "--trace"]).output().unwrap();
    assert!(top.status.success(), "top: {}", String::from_utf8_lossy(&top.stderr));
    let v: Value = serde_json::from_slice(&top.stdout).unwrap();
    assert_eq!(v["mode"], "trace");
    let lost = v["lost_events"].as_u64().expect("top reports a loss figure");
    assert_eq!(v["loss"]["complete"], true);
    let summed: u64 = v["loss"]["cpus"].as_array().unwrap().iter().map(|c| c["reported"].as_u64().unwrap_or(0)).sum();
    assert!(lost >= summed);
    note(test, format!("top --once -d 2 beside 16 VMs and 2 hogs lost {lost} events"));

    let demo = virtprof().args(["demo", "--once", "--duration", "4s"]).output().unwrap();
    let text = String::from_utf8_lossy(&demo.stdout);
    assert!(demo.status.success(), "demo: {}\n{text}", String::from_utf8_lossy(&demo.stderr));
    assert!(text.contains("lost events "), "{text}");
    drop(hogs);
    drop(vms);
}

#[test]
fn noise_explains_a_tiny_buffer_recording_with_records_loss_figure() {
    let test = "noise_explains_a_tiny_buffer_recording_with_records_loss_figure";
    let Some(_vms) = have_kvm(test) else { return };
    if !have_tracefs(test) {
        return;
    }
    let cpu = virtprof_host::affinity::allowed_cpus().last().copied().unwrap_or(0).to_string();
    let (rec, guest) = (temp("noise-tiny.vprec"), temp("noise-tiny.json"));
    let exe = assert_cmd::cargo::cargo_bin("virtprof");
    let out = virtprof()
        .args(["record", "-o"])
        .arg(&rec)
        .args(["--buffer-size", "4", "--"])
        .arg(&exe)
        .args(["testvm", "-w", "noise", "--pin", &cpu, "--duration", "1s", "--inject-hz", "1000", "--json"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    std::fs::write(&guest, &out.stdout).unwrap();
    let expected = recorded_loss(&stderr);
    if expected == 0 {
        note(test, "the 4 KB buffers did not overflow this time: the figures agree at 0");
    }
    let noise = virtprof()
        .args(["noise", "--host-recording"])
        .arg(&rec)
        .arg("--guest")
        .arg(&guest)
        .arg("--json")
        .output()
        .unwrap();
    assert!(noise.status.success(), "{}", String::from_utf8_lossy(&noise.stderr));
    let v: Value = serde_json::from_slice(&noise.stdout).unwrap();
    assert_eq!(v["lost_events"], expected, "noise --host-recording");
    for args in [&["exits", "--json"][..], &["sched", "--json"], &["report", "--json"]] {
        let v: Value = serde_json::from_slice(&run(args, &rec).stdout).unwrap();
        assert_eq!(v["lost_events"], expected, "virtprof {args:?}");
    }
    let _ = (std::fs::remove_file(rec), std::fs::remove_file(guest));
}

/// `record` without `--buffer-size` measures the event rate before it starts and sizes each
/// CPU's buffer to hold [`FIT_SECONDS`] of the busiest CPU's (at least the 8 MiB default): the
/// size and the rate are in the recording, the rate is the one the recording then shows, and
/// a recorder stalled (SIGSTOP) for 1.5 s at that rate loses nothing, where a 512 KB buffer
/// under the same stall loses events and says how many.
#[test]
fn buffers_fit_the_rate_seen_at_the_start_and_ride_out_a_stalled_reader() {
    use virtprof_trace::buffer_sizing::FIT_SECONDS;
    let test = "buffers_fit_the_rate_seen_at_the_start_and_ride_out_a_stalled_reader";
    let Some(_vms) = have_kvm(test) else { return };
    if !have_tracefs(test) {
        return;
    }
    let _load = testvm_load(&["--vcpus", "2", "--duration", "30s", "--name", "fitload"]);
    std::thread::sleep(std::time::Duration::from_millis(700));
    // `watch`: the test's own instance, tracing from the start until the stall: the rate
    // the probe should have seen, measured in the same second by another reader.
    let stalled_record = |extra: &[&str], file: &Path, watch: Option<&Watch>| -> String {
        let child = Reaped(
            virtprof()
                .args(["record", "--duration", "4s", "-o"])
                .arg(file)
                .args(extra)
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
        );
        let pid = child.0.id();
        // Past the probe (0.1 s) and tracing for real.
        std::thread::sleep(std::time::Duration::from_millis(1000));
        watch.iter().for_each(|w| w.stop());
        // SAFETY: kill with our child's pid and valid signals.
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGSTOP) };
        std::thread::sleep(std::time::Duration::from_millis(1500));
        // SAFETY: as above.
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGCONT) };
        let mut child = child;
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut child.0.stderr.take().unwrap(), &mut stderr).unwrap();
        assert!(child.0.wait().unwrap().success(), "record {extra:?}: {stderr}");
        stderr
    };

    let fitted = temp("fitted.vprec");
    let watch = Watch::start();
    let said = stalled_record(&[], &fitted, Some(&watch));
    let report = run(&["report", "--json"], &fitted);
    let host = serde_json::from_slice::<Value>(&report.stdout).unwrap()["host"].clone();
    let figure =
        |key: &str| host[key].as_str().and_then(|v| v.parse::<u64>().ok()).unwrap_or_else(|| panic!("{key}: {host}"));
    let (kb, rate) = (figure("buffer_size_kb"), figure("buffer_fitted_to_bytes_per_s"));
    let want = rate * FIT_SECONDS;
    assert!(kb >= 8192, "{kb} KB is under the default");
    assert!(kb * 1024 >= want.min(256 << 20), "{kb} KB holds less than {FIT_SECONDS} s of {rate} B/s");
    assert!(kb == 8192 || kb * 1024 < want + (2 << 20), "{kb} KB is more than {FIT_SECONDS} s of {rate} B/s");
    assert_eq!(kb > 8192, said.contains("trace buffers grown to"), "{said}");
    // The probe's rate is the one another reader measured over the same first second on its
    // busiest CPU, within a factor 3 (0.1 s against 1 s of a guest sharing two CPUs with
    // other tests). The recording's own pages are no measure: a page is read before it is
    // full, and the stall speeds the guest up.
    let seen = watch.busiest_bytes_per_s();
    assert!(
        rate > seen / 3 && rate < seen.saturating_mul(3),
        "probed {rate} B/s on the busiest CPU where another reader saw {seen} B/s: {said}"
    );
    let exits = run(&["exits", "--json"], &fitted);
    assert_eq!(recorded_loss(&said), 0, "a {kb} KB buffer lost events in a 1.5 s stall at {rate} B/s: {said}");
    assert!(serde_json::from_slice::<Value>(&exits.stdout).unwrap()["lost_events"] == 0);

    let small = temp("small.vprec");
    let said_small = stalled_record(&["--buffer-size", "512"], &small, None);
    assert!(!said_small.contains("trace buffers grown"), "{said_small}");
    let lost = recorded_loss(&said_small);
    assert!(lost > 0, "a 512 KB buffer lost nothing in a 1.5 s stall at {rate} B/s: {said_small}");
    note(
        test,
        format!(
            "probed {:.2} MiB/s on the busiest CPU (another reader: {:.2}) -> {kb} KB per CPU; 1.5 s stall: 0 lost; with 512 KB: {lost} lost",
            rate as f64 / f64::from(1 << 20),
            seen as f64 / f64::from(1 << 20)
        ),
    );
    let _ = std::fs::remove_file(fitted);
    let _ = std::fs::remove_file(small);
}

/// A tracefs instance of the test's own with `record`'s default events, tracing from
/// [`Watch::start`] to [`Watch::stop`] into buffers large enough for a second of any rate
/// seen here.
struct Watch {
    instance: virtprof_trace::tracefs::Instance,
    started: std::time::Instant,
    traced: std::cell::Cell<std::time::Duration>,
}

impl Watch {
    fn start() -> Watch {
        let tracefs = virtprof_trace::tracefs::Tracefs::locate().expect("tracefs is mounted");
        let mut instance = tracefs.create_instance("test-watch").unwrap();
        instance.write("buffer_size_kb", "65536").unwrap();
        for event in virtprof_trace::capture::CaptureConfig::default_events() {
            let (system, name) = event.split_once(':').map_or((event.as_str(), None), |(s, n)| (s, Some(n)));
            // Events this kernel lacks are skipped by `record` too.
            let _ = instance.enable(system, name);
        }
        instance.write("tracing_on", "1").unwrap();
        Watch { instance, started: std::time::Instant::now(), traced: std::cell::Cell::new(std::time::Duration::ZERO) }
    }

    fn stop(&self) {
        self.instance.write("tracing_on", "0").unwrap();
        self.traced.set(self.started.elapsed());
    }

    /// The busiest CPU's bytes per second while it traced (overwritten bytes would make it
    /// an underestimate: none may be).
    fn busiest_bytes_per_s(&self) -> u64 {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let stat = |stats: &str, key: &str| virtprof_trace::capture::stat_value(stats, key);
        let mut busiest = 0u64;
        for cpu in 0..cpus {
            let stats = self.instance.read(&format!("per_cpu/cpu{cpu}/stats")).unwrap();
            assert_eq!(stat(&stats, "overrun"), 0, "the watching instance overran on CPU {cpu}: {stats}");
            busiest = busiest.max(stat(&stats, "bytes"));
        }
        let ms = u64::try_from(self.traced.get().as_millis()).unwrap_or(u64::MAX).max(1);
        busiest.saturating_mul(1000) / ms
    }
}
