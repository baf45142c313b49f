//! Helpers: run the binary, parse its JSON, and skip (loudly) where the host lacks a facility.

use std::process::Output;
use std::sync::{Mutex, MutexGuard};

use assert_cmd::cargo::CommandCargoExt;
use virtprof_model::testvm::TestvmReport;

/// Say something about this host that a passing test would otherwise hide (a skip, or a
/// behaviour the host lacks): on stderr, and appended to `host-notes.txt` in cargo's test temp
/// folder, which `scripts/test.sh` prints after the suite.
pub fn note(test: &str, message: impl std::fmt::Display) {
    use std::io::Write;
    let line = format!("{test}: {message}");
    eprintln!("{line}");
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("host-notes.txt");
    if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
        let _ = writeln!(f, "{line}");
    }
}

/// `virtprof` built by cargo for this test run.
pub fn virtprof() -> std::process::Command {
    std::process::Command::cargo_bin("virtprof").expect("virtprof binary")
}

/// Tests that run VMs hold this, so scheduling-share assertions never compete with another
/// test's VMs for the same CPU.
static VM_LOCK: Mutex<()> = Mutex::new(());

/// If /dev/kvm can be opened, the exclusive right to run VMs; otherwise print why the test is
/// skipped and return None.
pub fn have_kvm(test: &str) -> Option<VmLock> {
    match std::fs::OpenOptions::new().read(true).write(true).open("/dev/kvm") {
        Ok(_) => Some(vm_lock()),
        Err(e) => {
            note(test, format!("SKIP: /dev/kvm unavailable ({e})"));
            None
        }
    }
}

/// The exclusive right to run VMs (KVM or emulated): CPU-hungry guests would skew the others'
/// timing.
pub fn vm_lock() -> VmLock {
    let guard = VM_LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    VmLock { _guard: guard, since: std::time::Instant::now() }
}

/// Held while a test runs VMs. The tests holding it run one after another, so their hold
/// times add up to most of the suite's length: each is appended to `vm-lock-times.txt` in
/// cargo's test temp folder, which `scripts/test.sh` sums up after the suite.
pub struct VmLock {
    _guard: MutexGuard<'static, ()>,
    since: std::time::Instant,
}

impl Drop for VmLock {
    fn drop(&mut self) {
        use std::io::Write;
        let held = self.since.elapsed().as_secs_f64();
        let test = std::thread::current().name().unwrap_or("unnamed").to_string();
        let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("vm-lock-times.txt");
        if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
            let _ = writeln!(f, "{held:.1} {test}");
        }
    }
}

/// True if we are root with tracefs mounted (or mountable); otherwise print why not.
pub fn have_tracefs(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        note(test, "SKIP: needs root for tracefs");
        return false;
    }
    match virtprof_trace::Tracefs::locate_or_mount() {
        Ok(_) => true,
        Err(e) => {
            note(test, format!("SKIP: {e}"));
            false
        }
    }
}

/// A path in the temp dir unique to this test process.
pub fn temp(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("virtprof-it-{name}-{}", std::process::id()))
}

/// A fresh, empty folder of this test process.
pub fn empty_dir(name: &str) -> std::path::PathBuf {
    let dir = temp(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `virtprof record -o FILE RECORD_ARGS -- virtprof testvm ARGS --json`, returning testvm's
/// report; panics with stderr on failure.
pub fn record_testvm(file: &std::path::Path, record_args: &[&str], args: &[&str]) -> TestvmReport {
    let exe = assert_cmd::cargo::cargo_bin("virtprof");
    let output = virtprof()
        .args(["record", "-o"])
        .arg(file)
        .args(record_args)
        .args(["--", exe.to_str().unwrap(), "testvm"])
        .args(args)
        .arg("--json")
        .output()
        .unwrap();
    parse_report(&output, args)
}

/// Run `virtprof testvm ARGS --json` and parse the report; panics with stderr on failure.
pub fn testvm(args: &[&str]) -> TestvmReport {
    let output = virtprof().arg("testvm").args(args).arg("--json").output().expect("run virtprof");
    parse_report(&output, args)
}

pub fn parse_report(output: &Output, args: &[&str]) -> TestvmReport {
    assert!(
        output.status.success(),
        "virtprof testvm {args:?} failed: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("testvm --json output parses as a TestvmReport")
}

/// The host kind doctor would report.
pub fn host_kind() -> Option<virtprof_model::HostKind> {
    virtprof_kvm::caps::KvmCaps::probe().kind
}

/// Debian's Chromium, if installed.
pub fn chromium() -> Option<&'static str> {
    ["/usr/bin/chromium", "/usr/bin/chromium-browser"].into_iter().find(|p| std::path::Path::new(p).exists())
}

/// The document after Chromium loaded `html` (a file named `.html`) and ran its scripts; None
/// without Chromium.
pub fn rendered_dom(html: &std::path::Path) -> Option<String> {
    let browser = chromium()?;
    let dom = std::process::Command::new(browser)
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=5000", "--dump-dom"])
        .arg(format!("file://{}", html.display()))
        .output()
        .unwrap();
    Some(String::from_utf8_lossy(&dom.stdout).into_owned())
}

/// The attributes of `<body>` after Chromium ran the page's scripts (pages set `data-ready`
/// and `data-charts` there); None without Chromium.
pub fn rendered_body(html: &std::path::Path) -> Option<String> {
    let dom = rendered_dom(html)?;
    Some(dom.split("<body").nth(1).and_then(|b| b.split('>').next()).expect("a <body> tag").to_string())
}

/// The Debian kernel, its real System.map and the marker initramfs from
/// scripts/debian-kernel/fetch.sh (scripts/test.sh runs it), if QEMU is here too; otherwise
/// print why the test is skipped and return None.
pub fn debian_kernel(test: &str) -> Option<std::path::PathBuf> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/debian-kernel");
    let qemu =
        std::process::Command::new("qemu-system-x86_64").arg("--version").output().is_ok_and(|o| o.status.success());
    if !qemu || !dir.join("initrd.cpio").exists() {
        note(test, "SKIP: needs qemu-system-x86_64 and target/debian-kernel (scripts/test.sh installs both)");
        return None;
    }
    Some(dir)
}

/// Whether `perf` is installed; if not, print why `test` skips.
pub fn have_perf(test: &str) -> bool {
    let ok = std::process::Command::new("perf").arg("--version").output().is_ok_and(|o| o.status.success());
    if !ok {
        note(test, "SKIP: perf is not installed (apt-get install linux-perf)");
    }
    ok
}

/// Run `argv` under `perf stat -e EVENTS` (counting its whole process tree) and return its
/// output and the kernel's count of each event: ground truth measured in the same run.
pub fn perf_stat(events: &[&str], argv: &[&std::ffi::OsStr]) -> (Output, std::collections::BTreeMap<String, u64>) {
    static RUNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let csv = temp(&format!("perf-stat-{}.csv", RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)));
    let output = std::process::Command::new("perf")
        .args(["stat", "-x", ",", "-o"])
        .arg(&csv)
        .args(["-e", &events.join(","), "--"])
        .args(argv)
        .output()
        .expect("run perf stat");
    let text = std::fs::read_to_string(&csv).unwrap_or_default();
    let _ = std::fs::remove_file(&csv);
    let counts = events
        .iter()
        .map(|&event| {
            let count = text
                .lines()
                .find(|l| l.split(',').nth(2) == Some(event))
                .and_then(|l| l.split(',').next()?.parse().ok())
                .unwrap_or_else(|| panic!("perf stat has no count for {event}:\n{text}"));
            (event.to_string(), count)
        })
        .collect();
    (output, counts)
}

/// Time this host's own hypervisor took from `cpu` so far (the steal column of /proc/stat),
/// in ns, to the kernel's tick. It is in a trace's timestamps but not in schedstat's run
/// time (`CONFIG_PARAVIRT_TIME_ACCOUNTING` takes it out), so a comparison of the two allows it.
pub fn host_steal_ns(cpu: u32) -> u64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let label = format!("cpu{cpu}");
    let ticks: u64 = stat
        .lines()
        .find(|l| l.split_whitespace().next() == Some(label.as_str()))
        .and_then(|l| l.split_whitespace().nth(8)?.parse().ok())
        .unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    ticks * (1_000_000_000 / hz)
}

/// A copy of the folder `from` (a tracefs dump fixture) at `to`, replacing what was there.
pub fn copy_tree(from: &std::path::Path, to: &std::path::Path) {
    let _ = std::fs::remove_dir_all(to);
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// `boot --recording RECORDING --system-map MAP` of a Linux guest's boot, as JSON, checked for
/// what every such profile must show: the hypervisor's share equal to the time the note says
/// the vCPUs spent in exits, firmware (code before the kernel's half) and kernel samples, and
/// the kernel's samples resolved through the map.
pub fn linux_boot_profile(recording: &std::path::Path, system_map: &std::path::Path) -> serde_json::Value {
    let boot = virtprof()
        .args(["boot", "--recording"])
        .arg(recording)
        .arg("--system-map")
        .arg(system_map)
        .args(["--rate", "10000", "--json"])
        .output()
        .unwrap();
    assert!(boot.status.success(), "{}", String::from_utf8_lossy(&boot.stderr));
    let boot: serde_json::Value = serde_json::from_slice(&boot.stdout).unwrap();
    let realm = |name: &str| boot["realms"][name].as_f64().unwrap();
    let note_text = boot["note"].as_str().unwrap();
    let measured: f64 = note_text.split("; ").last().unwrap().split('%').next().unwrap().parse().unwrap();
    assert!((100.0 * realm("hypervisor") - measured).abs() < 1.0, "{} vs {measured}%", realm("hypervisor"));
    assert!(realm("firmware") > 0.0 && realm("kernel") > 0.0, "{}", boot["realms"]);
    let resolved = boot["resolved"]["kernel"].as_f64().unwrap();
    assert!(resolved > 0.9, "kernel samples resolved through {}: {resolved}", system_map.display());
    boot
}

/// The static binary `scripts/package.sh` made (`VIRTPROF_PACKAGE_DIR`, default
/// target/package), if it was built from this very source (its `--version` is this build's);
/// otherwise None, with a note saying how to make it (`scripts/test.sh` does before the tests).
pub fn static_binary(test: &str) -> Option<std::path::PathBuf> {
    let dir = std::env::var_os("VIRTPROF_PACKAGE_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/package"));
    let binary = dir.join("virtprof");
    let version = |command: &mut std::process::Command| {
        command.arg("--version").output().ok().map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
    };
    let ours = version(&mut virtprof());
    match version(&mut std::process::Command::new(&binary)) {
        Some(theirs) if Some(&theirs) == ours.as_ref() => Some(binary),
        Some(theirs) => {
            note(
                test,
                format!(
                    "SKIP: {} is {} not this build's {ours:?}: run scripts/package.sh",
                    binary.display(),
                    theirs.trim()
                ),
            );
            None
        }
        None => {
            note(test, format!("SKIP: no static binary at {} (scripts/package.sh makes it)", binary.display()));
            None
        }
    }
}

/// The repository's root.
pub fn repo() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}
