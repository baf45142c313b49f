//! The hostile cases of issue 23: damaged timestamps, inputs that are not files, outputs on a
//! full disk or behind a symlink, signals at awkward moments, negative numbers, escape bytes.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use super::util::{copy_tree, have_tracefs, note, temp, virtprof};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../session/tests/fixtures/pvm-pio-user.vprec")
}

/// The largest resident set of any child waited for so far, in MiB.
fn children_peak_rss_mib() -> u64 {
    // SAFETY: getrusage fills the zeroed struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) };
    usage.ru_maxrss as u64 / 1024
}

/// A recording's chunks: (header offset, kind, payload range).
fn chunks(bytes: &[u8]) -> Vec<(usize, u32, std::ops::Range<usize>)> {
    let mut out = Vec::new();
    let mut at = 12;
    while at + 16 <= bytes.len() {
        let kind = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
        let len = usize::try_from(u64::from_le_bytes(bytes[at + 4..at + 12].try_into().unwrap())).unwrap();
        out.push((at, kind, at + 16..at + 16 + len));
        at += 16 + len;
    }
    out
}

/// The fixture with its first page chunk's first page stamped `seconds` later, CRC fixed up:
/// damage the checksum cannot see.
fn with_a_page_moved(seconds: u64) -> PathBuf {
    let mut bytes = std::fs::read(fixture()).unwrap();
    // The last pages chunk: the vCPU's first events (which name it a vCPU) stay in place.
    let (header, _, payload) = chunks(&bytes).into_iter().rfind(|(_, kind, _)| *kind == 2).expect("a pages chunk");
    // Payload: the CPU (u32), then pages; a page starts with its u64 timestamp.
    let ts_at = payload.start + 4;
    let ts = u64::from_le_bytes(bytes[ts_at..ts_at + 8].try_into().unwrap());
    bytes[ts_at..ts_at + 8].copy_from_slice(&(ts + seconds * 1_000_000_000).to_le_bytes());
    let crc = crc32fast::hash(&bytes[payload.clone()]);
    bytes[header + 12..header + 16].copy_from_slice(&crc.to_le_bytes());
    let path = temp("moved-page").with_extension("vprec");
    std::fs::write(&path, bytes).unwrap();
    path
}

#[test]
fn events_outside_the_recordings_span_are_counted_and_skipped_in_bounded_memory() {
    let damaged = with_a_page_moved(26_300);
    let clean = virtprof().args(["exits", "--json"]).arg(fixture()).output().unwrap();
    let clean: serde_json::Value = serde_json::from_slice(&clean.stdout).unwrap();
    for args in [
        &["exits", "--json"][..],
        &["sched", "--window", "1ms", "--json"],
        &["report", "--json"],
        &["export", "--format", "perfetto", "-o", "/dev/null"],
    ] {
        let out = virtprof().arg(args[0]).arg(&damaged).args(&args[1..]).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {stderr}");
        assert!(
            stdout.contains("\"outside_span\"")
                || stdout.contains("outside the recording's time span")
                || stderr.contains("outside the recording's time span"),
            "{args:?}: the skipped events are reported: {stderr}"
        );
        assert!(children_peak_rss_mib() < 1024, "{args:?}: peak RSS {} MiB", children_peak_rss_mib());
        if args[0] == "exits" {
            let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            // The page moved held some of the exits; every other one is still counted.
            let (now, before) = (json["totals"]["exits"].as_u64().unwrap(), clean["totals"]["exits"].as_u64().unwrap());
            assert!(now <= before && now > 0, "{now} of {before}");
            assert!(json["loss"]["outside_span"].as_u64().unwrap() > 0, "{}", json["loss"]);
        }
    }
    let _ = std::fs::remove_file(damaged);
}

#[test]
fn too_many_windows_is_a_usage_error_naming_the_smallest_that_fits() {
    let out = virtprof().arg("sched").arg(fixture()).args(["--window", "1ns"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("windows, over the 100000") && stderr.contains("or longer"), "{stderr}");
}

fn mkfifo(path: &Path) {
    let name = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo on a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
}

/// Run with a time limit: a hang fails the test instead of blocking CI.
fn output_within(command: &mut Command, limit: Duration) -> Output {
    output_within_child(command.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap(), limit)
}

#[test]
fn fifos_and_devices_as_inputs_are_refused_without_blocking() {
    let dir = temp("fifo-inputs");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let fifo = dir.join("fifo");
    mkfifo(&fifo);
    let cases: Vec<Vec<std::ffi::OsString>> = vec![
        vec!["exits".into(), fifo.clone().into()],
        vec!["exits".into(), "/dev/zero".into()],
        vec!["balance".into(), "calibrate".into(), "--input".into(), fifo.clone().into()],
        vec!["boot".into(), "--load".into(), fifo.clone().into()],
        vec!["noise".into(), "--host-recording".into(), fixture().into(), "--guest".into(), fifo.clone().into()],
    ];
    for args in cases {
        let out = output_within(virtprof().args(&args), Duration::from_secs(30));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains("not a regular file"), "{args:?}: {stderr}");
    }
    // A dump whose trace_pipe_raw is a FIFO, and one whose header_page is /dev/zero.
    let fixture_dump =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../trace/tests/fixtures/kvm-amd-run3_2vcpu_2cpu_pinned/tracefs");
    let dump = dir.join("dump");
    copy_tree(&fixture_dump, &dump);
    let raw = dump.join("per_cpu/cpu0/trace_pipe_raw");
    std::fs::remove_file(&raw).unwrap();
    mkfifo(&raw);
    let out = output_within(virtprof().arg("exits").arg(&dump), Duration::from_secs(30));
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    copy_tree(&fixture_dump, &dump);
    let header = dump.join("events/header_page");
    std::fs::remove_file(&header).unwrap();
    std::os::unix::fs::symlink("/dev/zero", &header).unwrap();
    let out = output_within(virtprof().arg("exits").arg(&dump), Duration::from_secs(30));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("not a regular file"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn outputs_replace_a_planted_symlink_and_recordings_are_private() {
    let dir = temp("symlink-output");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let precious = dir.join("precious");
    std::fs::write(&precious, "keep").unwrap();
    let out = dir.join("out.pftrace");
    std::os::unix::fs::symlink(&precious, &out).unwrap();
    let run = virtprof().arg("export").arg(fixture()).args(["--format", "perfetto", "-o"]).arg(&out).output().unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    assert_eq!(std::fs::read_to_string(&precious).unwrap(), "keep");
    assert!(!std::fs::symlink_metadata(&out).unwrap().file_type().is_symlink());
    // `import` writes a recording: 0600, like perf.data.
    let recording = dir.join("imported.vprec");
    let dump =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../trace/tests/fixtures/kvm-amd-run3_2vcpu_2cpu_pinned/tracefs");
    let run = virtprof().arg("import").arg(&dump).arg("-o").arg(&recording).output().unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&recording).unwrap().permissions().mode() & 0o777, 0o600);
    // `-o -` is standard output, not a file named "-".
    let run = virtprof()
        .arg("export")
        .arg(fixture())
        .args(["--format", "perfetto", "-o", "-"])
        .current_dir(&dir)
        .output()
        .unwrap();
    assert!(run.status.success() && run.stdout.len() > 1000);
    assert!(!dir.join("-").exists());
    // `-o /dev/stdout` with standard output redirected to a file writes that file (and never
    // replaces /dev/stdout).
    let redirected = dir.join("redirected.pftrace");
    let file = std::fs::File::create(&redirected).unwrap();
    let run = virtprof()
        .arg("export")
        .arg(fixture())
        .args(["--format", "perfetto", "-o", "/dev/stdout"])
        .stdout(file)
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    assert!(std::fs::metadata(&redirected).unwrap().len() > 1000);
    assert!(std::fs::symlink_metadata("/dev/stdout").unwrap().file_type().is_symlink());
    // `top --log` appends in place, so it refuses a planted link rather than append through it.
    let log = dir.join("top.csv");
    std::os::unix::fs::symlink(&precious, &log).unwrap();
    let run = virtprof().args(["top", "--once", "--no-trace", "-d", "1", "--log"]).arg(&log).output().unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("is a symbolic link"), "{stderr}");
    assert_eq!(std::fs::read_to_string(&precious).unwrap(), "keep");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn negative_numbers_and_escape_bytes_are_named_not_echoed() {
    for (args, flag) in
        [(&["testvm", "--vcpus", "-5"][..], "--vcpus -5"), (&["report", "x", "--top", "-1"], "--top -1")]
    {
        let out = virtprof().args(args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains(&format!("{flag}: negative")), "{stderr}");
    }
    let out = virtprof().args(["exits", "no\u{1b}[2Jsuch"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(!stderr.contains('\u{1b}') && stderr.contains("\\u{1b}[2J"), "{stderr}");
}

/// A tmpfs of `kib` KiB, unmounted on drop.
struct SmallDisk(PathBuf);

impl SmallDisk {
    fn mount(kib: u32) -> Option<SmallDisk> {
        let dir = temp("small-disk");
        std::fs::create_dir_all(&dir).ok()?;
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={kib}k"), "tmpfs"])
            .arg(&dir)
            .status()
            .is_ok_and(|s| s.success());
        ok.then_some(SmallDisk(dir))
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir(&self.0);
    }
}

#[test]
fn a_full_disk_keeps_what_was_recorded_names_the_path_and_reads_back() {
    let test = "a_full_disk_keeps_what_was_recorded_names_the_path_and_reads_back";
    if !have_tracefs(test) {
        return;
    }
    // Its load (a fork storm, every syscall traced) must not overlap the tests that time VMs.
    let _cpus = super::util::vm_lock();
    let Some(disk) = SmallDisk::mount(1024) else {
        note(test, "SKIP: cannot mount a tmpfs (not root?)");
        return;
    };
    let path = disk.0.join("full.vprec");
    // Every event of a busy host for up to 20 s: far more than 1 MiB.
    let child = virtprof()
        .args(["record", "--events", "sched,irq,syscalls,raw_syscalls,timer", "--duration", "20s", "-o"])
        .arg(&path)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = std::thread::spawn({
        let done = done.clone();
        move || {
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = Command::new("true").status();
            }
        }
    });
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = load.join();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("recording cut short")
            && stderr.contains(&format!("'{}'", path.display()))
            && stderr.contains("No space left on device"),
        "{stderr}"
    );
    // What was kept reads, up to its last whole chunk, and says its loss is unknown after it.
    let read = virtprof().args(["exits"]).arg(&path).output().unwrap();
    let read_err = String::from_utf8_lossy(&read.stderr);
    assert_eq!(read.status.code(), Some(0), "{read_err}");
    assert!(String::from_utf8_lossy(&read.stdout).contains("unknown"), "{read_err}");
    assert!(!instance_left(pid), "the tracefs instance was removed after the error");
    assert!(std::fs::read_dir(&disk.0).unwrap().count() == 1, "no temporary left");
}

#[test]
fn a_stopped_record_passes_the_signal_to_its_command_and_stops_mid_interval() {
    let test = "a_stopped_record_passes_the_signal_to_its_command_and_stops_mid_interval";
    if !have_tracefs(test) {
        return;
    }
    let path = temp("stop-command").with_extension("vprec");
    let marker = temp("stop-command-child");
    let _ = std::fs::remove_file(&marker);
    // The command writes its pid and sleeps; only virtprof is signalled.
    let script = format!("echo $$ > {}; exec sleep 600", marker.display());
    let child = virtprof()
        .args(["record", "--interval", "100s", "-o"])
        .arg(&path)
        .args(["--", "sh", "-c", &script])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while !marker.exists() && started.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    let command_pid: i32 = std::fs::read_to_string(&marker).unwrap().trim().parse().unwrap();
    // SAFETY: kill on the pid of the child we spawned.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Within the command's 600 s and the interval's 100 s by far: it did not wait for either.
    assert!(started.elapsed() < Duration::from_secs(60), "{stderr}");
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    // SAFETY: signal 0 only checks whether the pid exists.
    assert_ne!(unsafe { libc::kill(command_pid, 0) }, 0, "the command {command_pid} was reaped");
    let read = virtprof().arg("exits").arg(&path).output().unwrap();
    assert!(read.status.success(), "{}", String::from_utf8_lossy(&read.stderr));
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_file(&marker);
}

/// The direct children of `pid` now.
pub(super) fn children(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return Vec::new() };
    tasks
        .filter_map(Result::ok)
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|c| c.split_whitespace().filter_map(|p| p.parse().ok()).collect::<Vec<u32>>())
        .collect()
}

/// Whether process `pid` has a handler for `signal` (its SigCgt mask in /proc).
fn catches(pid: u32, signal: i32) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let mask = status.lines().find_map(|l| l.strip_prefix("SigCgt:")).map(str::trim);
    mask.and_then(|m| u64::from_str_radix(m, 16).ok()).is_some_and(|m| m & (1 << (signal - 1)) != 0)
}

pub(super) fn alive(pid: u32) -> bool {
    // A zombie is gone for our purpose: it runs nothing.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| s.rsplit(')').next().is_some_and(|rest| !rest.trim_start().starts_with('Z')))
}

pub(super) fn instance_left(pid: u32) -> bool {
    std::fs::read_dir("/sys/kernel/tracing/instances")
        .is_ok_and(|d| d.filter_map(Result::ok).any(|e| e.file_name().to_string_lossy().ends_with(&format!("-{pid}"))))
}

#[test]
fn every_stop_signal_at_any_moment_ends_long_runs_cleanly() {
    let test = "every_stop_signal_at_any_moment_ends_long_runs_cleanly";
    if !have_tracefs(test) {
        return;
    }
    let Some(_vms) = super::util::have_kvm(test) else { return };
    let recording = temp("signals").with_extension("vprec");
    let words = |w: &[&str]| -> Vec<std::ffi::OsString> { w.iter().map(Into::into).collect() };
    let mut commands: Vec<(&str, Vec<std::ffi::OsString>)> = vec![
        ("record", vec!["record".into(), "--duration".into(), "60s".into(), "-o".into(), recording.clone().into()]),
        ("testvm", words(&["testvm", "-w", "compute", "--duration", "60s"])),
        ("exits", words(&["exits", "--duration", "60s"])),
        ("serve", words(&["serve", "--listen", "127.0.0.1:0", "--duration", "60s"])),
        // At 50 ms the demo is still starting its VMs; at 700 ms it watches them.
        ("demo", words(&["demo", "--once", "--duration", "60s", "-d", "30"])),
    ];
    if let Some(dir) = super::util::debian_kernel(test) {
        let mut boot = words(&["boot", "--qemu", "--duration", "60s", "--"]);
        boot.extend(super::boot::qemu_args(&dir).into_iter().map(Into::into));
        commands.push(("boot --qemu", boot));
    }
    for (name, args) in &commands {
        for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT] {
            for delay_ms in [50, 700] {
                let _ = std::fs::remove_file(&recording);
                let child = virtprof().args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
                let pid = child.id();
                // Counted from when it catches the signal: before that (exec, the loader, the
                // arguments; CI's load once made that 50 ms) the kernel's default ends any program.
                let catching = Instant::now() + Duration::from_secs(10);
                while !catches(pid, signal) && Instant::now() < catching {
                    std::thread::sleep(Duration::from_millis(1));
                }
                std::thread::sleep(Duration::from_millis(delay_ms));
                let kids = children(pid);
                // SAFETY: kill on the pid of the child we spawned, not yet reaped.
                unsafe { libc::kill(pid as i32, signal) };
                let started = Instant::now();
                let out = output_within_child(child, Duration::from_secs(30));
                let what = format!("{name} signal {signal} at {delay_ms} ms");
                let stderr = String::from_utf8_lossy(&out.stderr);
                assert!(out.status.code().is_some(), "{what}: killed by the signal: {stderr}");
                assert!(!stderr.contains("panicked"), "{what}: {stderr}");
                if matches!(*name, "demo" | "boot --qemu") {
                    // A stop is how these end: what was sampled is printed, rc 0.
                    assert_eq!(out.status.code(), Some(0), "{what}: {stderr}");
                    let nothing_yet = stderr.contains("stopped before") || stderr.contains("stopped while");
                    assert!(!out.stdout.is_empty() || nothing_yet, "{what}: printed nothing: {stderr}");
                }
                assert!(started.elapsed() < Duration::from_secs(20), "{what}: took {:?}", started.elapsed());
                assert!(!instance_left(pid), "{what}: tracefs instance left");
                let deadline = Instant::now() + Duration::from_secs(5);
                while kids.iter().any(|&k| alive(k)) && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(50));
                }
                assert!(!kids.iter().any(|&k| alive(k)), "{what}: children {kids:?} left running");
                if *name == "record" && recording.exists() {
                    let read = virtprof().arg("exits").arg(&recording).output().unwrap();
                    assert!(read.status.success(), "{what}: {}", String::from_utf8_lossy(&read.stderr));
                    assert!(String::from_utf8_lossy(&read.stdout).contains("lost events: "), "{what}");
                }
            }
        }
    }
    let _ = std::fs::remove_file(&recording);
}

/// Issue 54: a stop signal that comes before a command watches for stops, to a process
/// started ignoring it (as a shell script starts its background jobs), stops the command once
/// it watches instead of being lost (it ran to its end). The signal is made pending before
/// virtprof's first instruction (blocked and raised between fork and exec), the earliest it
/// can come.
#[test]
fn a_stop_signal_before_the_command_watches_for_it_is_not_lost() {
    use std::os::unix::process::CommandExt;
    let test = "a_stop_signal_before_the_command_watches_for_it_is_not_lost";
    if !have_tracefs(test) {
        return;
    }
    let Some(_vms) = super::util::have_kvm(test) else { return };
    let recording = temp("early-signal").with_extension("vprec");
    let commands: Vec<Vec<&str>> = vec![
        vec!["demo", "--once", "--duration", "30s", "-d", "20"],
        vec!["record", "-o", recording.to_str().unwrap(), "--duration", "30s"],
        vec!["exits", "--duration", "30s"],
        vec!["testvm", "-w", "compute", "--duration", "30s"],
    ];
    for args in &commands {
        let what = args.join(" ");
        let mut command = virtprof();
        command.args(args).stdout(Stdio::null()).stderr(Stdio::piped());
        // SAFETY: signal, sigprocmask and raise are async-signal-safe; they run between fork and exec.
        unsafe {
            command.pre_exec(|| {
                libc::signal(libc::SIGINT, libc::SIG_IGN);
                let mut set: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut set);
                libc::sigaddset(&mut set, libc::SIGINT);
                libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
                libc::raise(libc::SIGINT);
                Ok(())
            });
        }
        let started = Instant::now();
        let out = output_within_child(command.spawn().unwrap(), Duration::from_secs(25));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{what}: {stderr}");
        assert!(started.elapsed() < Duration::from_secs(15), "{what}: ran {:?} of its 30 s", started.elapsed());
        note(test, format!("{what}: stopped after {:?}", started.elapsed()));
    }
    let _ = std::fs::remove_file(&recording);
}

fn output_within_child(mut child: std::process::Child, limit: Duration) -> Output {
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > limit {
            child.kill().unwrap();
            panic!("still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().unwrap()
}

#[test]
fn a_user_without_tracing_rights_is_told_what_is_missing() {
    let test = "a_user_without_tracing_rights_is_told_what_is_missing";
    if !have_tracefs(test) {
        return;
    }
    // The binary where `nobody` can run it.
    let exe = temp("nonroot-virtprof");
    std::fs::copy(assert_cmd::cargo::cargo_bin("virtprof"), &exe).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    let recording = temp("nonroot").with_extension("vprec");
    for args in
        [vec!["record", "--duration", "1s", "-o", recording.to_str().unwrap()], vec!["exits", "--duration", "1s"]]
    {
        let Ok(out) = Command::new("runuser").args(["-u", "nobody", "--"]).arg(&exe).args(&args).output() else {
            note(test, "SKIP: no runuser");
            return;
        };
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains("tracing needs root or CAP_SYS_ADMIN/CAP_PERFMON"), "{args:?}: {stderr}");
    }
    assert!(!recording.exists());
    let _ = std::fs::remove_file(&exe);
}

/// Processes descended from `pid` whose name is `virtprof-vm` (the micro-VMM processes).
fn vmms_under(pid: u32) -> Vec<u32> {
    let mut found = Vec::new();
    let mut frontier = vec![pid];
    while let Some(p) = frontier.pop() {
        for child in children(p) {
            let comm = std::fs::read_to_string(format!("/proc/{child}/comm")).unwrap_or_default();
            if comm.trim() == "virtprof-vm" {
                found.push(child);
            }
            frontier.push(child);
        }
    }
    found
}

/// SIGKILL leaves no micro-VM running: whatever started them (directly, or through a testvm
/// child), every VMM ends within a second of its ancestor's death.
#[test]
fn no_vm_outlives_a_sigkilled_virtprof_by_more_than_a_second() {
    let test = "no_vm_outlives_a_sigkilled_virtprof_by_more_than_a_second";
    let Some(_vms) = super::util::have_kvm(test) else { return };
    let recording = temp("sigkill").with_extension("vprec");
    let exe = assert_cmd::cargo::cargo_bin("virtprof");
    let exe = exe.to_str().unwrap();
    let mut commands: Vec<Vec<&str>> = vec![
        vec!["testvm", "-w", "compute", "--vms", "2", "--duration", "60s"],
        vec!["noise", "--testvm", "--duration", "60s"],
        vec!["demo", "--once", "--duration", "60s", "-d", "30"],
        vec!["boot", "--testvm", "--duration", "60s"],
    ];
    if have_tracefs(test) {
        let path = recording.to_str().unwrap();
        commands.push(vec!["record", "-o", path, "--", exe, "testvm", "-w", "compute", "--duration", "60s"]);
    }
    for args in &commands {
        let what = args.join(" ");
        let mut child = virtprof().args(args).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
        let pid = child.id();
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut vmms = vmms_under(pid);
        while vmms.is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
            vmms = vmms_under(pid);
        }
        assert!(!vmms.is_empty(), "{what}: no VM started within 20 s");
        // Let every VM of the command start.
        std::thread::sleep(Duration::from_millis(500));
        let vmms = vmms_under(pid);
        child.kill().unwrap();
        child.wait().unwrap();
        let killed = Instant::now();
        while vmms.iter().any(|&v| alive(v)) && killed.elapsed() < Duration::from_secs(1) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let left: Vec<u32> = vmms.iter().copied().filter(|&v| alive(v)).collect();
        for &v in &left {
            // SAFETY: SIGKILL to a leftover VM found above, so the next run starts clean.
            unsafe { libc::kill(v as i32, libc::SIGKILL) };
        }
        assert!(left.is_empty(), "{what}: VMs {left:?} of {vmms:?} still running 1 s after SIGKILL");
        note(test, format!("{what}: {} VMs gone {:?} after SIGKILL", vmms.len(), killed.elapsed()));
    }
    let _ = std::fs::remove_file(&recording);
}

/// Each thread of process `pid`'s CPU affinity, as /proc lists it.
fn cpus_allowed(pid: &str) -> Vec<String> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).unwrap();
    tasks
        .filter_map(Result::ok)
        .map(|t| {
            let status = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
            status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")).unwrap_or("").trim().to_string()
        })
        .collect()
}

/// The tracefs instance of `pid`, if it has one now, and whether it is tracing.
fn instance_of(pid: u32) -> Option<(PathBuf, bool)> {
    let entry = std::fs::read_dir("/sys/kernel/tracing/instances")
        .ok()?
        .filter_map(Result::ok)
        .find(|e| e.file_name().to_string_lossy().ends_with(&format!("-{pid}")))?;
    let on = std::fs::read_to_string(entry.path().join("tracing_on")).is_ok_and(|t| t.trim() == "1");
    Some((entry.path(), on))
}

/// Issue 54 item 3: every command that traces, killed with SIGKILL while tracing, leaves no
/// tracefs instance (its reaper turns tracing off and removes it within moments), and a
/// killed `record` leaves its recording in place cut short, readable, with no hidden
/// temporary beside it. An instance of a dead virtprof found by the next one is removed and
/// said so.
#[test]
fn a_sigkilled_tracer_leaves_nothing_tracing_and_its_recording_in_place() {
    let test = "a_sigkilled_tracer_leaves_nothing_tracing_and_its_recording_in_place";
    if !have_tracefs(test) {
        return;
    }
    let Some(_vms) = super::util::have_kvm(test) else { return };
    let recording = temp("killed").with_extension("vprec");
    let rec = recording.to_str().unwrap();
    // A VM for balance to move, running through the whole test.
    let mut vm = virtprof()
        .args(["testvm", "-w", "compute", "--vcpus", "2", "--duration", "300s"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut vmm = vmms_under(vm.id());
    while vmm.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        vmm = vmms_under(vm.id());
    }
    let vmm = vmm.first().expect("the test VM started").to_string();
    let before = cpus_allowed(&vmm);
    let commands: Vec<Vec<&str>> = vec![
        vec!["record", "-o", rec, "--duration", "30s"],
        vec!["record", "-o", rec, "--interval", "100ms", "--duration", "30s"],
        vec!["exits", "--duration", "30s"],
        vec!["noise", "--duration", "30s"],
        vec!["noise", "--testvm", "--duration", "30s"],
        vec!["balance", "--vm", &vmm, "--verify", "--force-hz", "100", "--duration", "30s"],
        vec!["top", "--trace", "--once", "-d", "30"],
    ];
    for args in &commands {
        let what = args.join(" ");
        let _ = std::fs::remove_file(&recording);
        let mut child = virtprof().args(args).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
        let pid = child.id();
        let hidden =
            recording.with_file_name(format!(".{}.{pid}.tmp", recording.file_name().unwrap().to_string_lossy()));
        let deadline = Instant::now() + Duration::from_secs(30);
        while !instance_of(pid).is_some_and(|(_, on)| on) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let (instance, _) = instance_of(pid).unwrap_or_else(|| panic!("{what}: no instance tracing within 30 s"));
        // A moment of tracing, so a recording has chunks to keep; a recording's metadata is on
        // disk first (written once tracing is on: on a loaded host that can take longer).
        std::thread::sleep(Duration::from_millis(700));
        if args[0] == "record" {
            while std::fs::metadata(&hidden).map_or(true, |m| m.len() == 0) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        child.kill().unwrap();
        child.wait().unwrap();
        let killed = Instant::now();
        while instance.exists() && killed.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(10));
        }
        let tracing = std::fs::read_to_string(instance.join("tracing_on")).unwrap_or_default();
        assert!(!instance.exists(), "{what}: {} left 5 s after SIGKILL (tracing_on {tracing:?})", instance.display());
        let mut note_text = format!("{what}: instance gone {:?} after SIGKILL", killed.elapsed());
        if args[0] == "balance" {
            // The vCPU threads it pinned get their affinity back from the reaper too.
            let allowed = || cpus_allowed(&vmm);
            while allowed() != before && killed.elapsed() < Duration::from_secs(5) {
                std::thread::sleep(Duration::from_millis(10));
            }
            assert_eq!(allowed(), before, "{what}: the VM's threads' affinity was not given back");
            note_text += "; vCPU threads' affinity given back";
        }
        if args[0] == "record" {
            while !recording.exists() && killed.elapsed() < Duration::from_secs(5) {
                std::thread::sleep(Duration::from_millis(10));
            }
            assert!(recording.exists() && !hidden.exists(), "{what}: no recording in place ({})", hidden.display());
            let read = virtprof().arg("exits").arg(&recording).output().unwrap();
            let stderr = String::from_utf8_lossy(&read.stderr);
            assert!(read.status.success(), "{what}: the kept recording does not read: {stderr}");
            assert!(stderr.contains("without its footer") || stderr.contains("cut short"), "{what}: {stderr}");
            note(test, format!("{note_text}; recording kept, {} bytes", std::fs::metadata(&recording).unwrap().len()));
        } else {
            note(test, note_text);
        }
    }
    // An instance a dead virtprof left (as one killed before this reaper existed would): the
    // next virtprof that traces removes it and says so.
    let stale = Path::new("/sys/kernel/tracing/instances/virtprof-record-4000000");
    std::fs::create_dir(stale).unwrap();
    std::fs::write(stale.join("tracing_on"), "1").unwrap();
    let out = virtprof().args(["exits", "--duration", "200ms"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stale.exists(), "{stderr}");
    assert!(stderr.contains("removed tracefs instance /sys/kernel/tracing/instances/virtprof-record-4000000 left by a virtprof that is gone"), "{stderr}");
    // SAFETY: SIGTERM to the test VM this test started.
    unsafe { libc::kill(vm.id() as i32, libc::SIGTERM) };
    vm.wait().unwrap();
    let _ = std::fs::remove_file(&recording);
}

/// `-o DIR` where a file is written: refused at once (exit 2, before any recording), and no
/// temporary file is left beside it.
#[test]
fn a_folder_given_as_an_output_file_is_refused_before_any_work() {
    let dir = temp("output-folder");
    let out = dir.join("out");
    std::fs::create_dir_all(&out).unwrap();
    let fixture = fixture();
    let dump =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../trace/tests/fixtures/kvm-amd-run3_2vcpu_2cpu_pinned/tracefs");
    let runs: [(&str, Vec<&std::ffi::OsStr>); 4] = [
        ("import", vec!["import".as_ref(), dump.as_os_str(), "-o".as_ref(), out.as_os_str()]),
        ("record", vec!["record".as_ref(), "-d".as_ref(), "10s".as_ref(), "-o".as_ref(), out.as_os_str()]),
        ("report --html", vec!["report".as_ref(), fixture.as_os_str(), "--html".as_ref(), out.as_os_str()]),
        (
            "export",
            vec![
                "export".as_ref(),
                fixture.as_os_str(),
                "--format".as_ref(),
                "perfetto".as_ref(),
                "-o".as_ref(),
                out.as_os_str(),
            ],
        ),
    ];
    for (what, args) in runs {
        let started = Instant::now();
        let run = output_within(virtprof().args(&args), Duration::from_secs(30));
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert_eq!(run.status.code(), Some(2), "{what}: {stderr}");
        assert!(stderr.contains("Is a directory") && stderr.contains(out.to_str().unwrap()), "{what}: {stderr}");
        // record refused instead of tracing for its 10 s first.
        assert!(started.elapsed() < Duration::from_secs(10), "{what} took {:?}", started.elapsed());
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left.len(), 1, "{what}: left beside the folder: {left:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
