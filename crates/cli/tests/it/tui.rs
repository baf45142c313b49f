//! `virtprof demo` in a real terminal, driven through tmux: it draws the table, answers keys,
//! restores the terminal on `q`, and leaves no VM or tracefs instance behind.

use std::process::Command;
use std::time::{Duration, Instant};

use super::util::{have_kvm, have_tracefs, note};

struct Session(String);

impl Session {
    fn tmux(&self, args: &[&str]) -> std::process::Output {
        Command::new("tmux").args(args).output().expect("run tmux")
    }

    fn screen(&self) -> String {
        String::from_utf8_lossy(&self.tmux(&["capture-pane", "-p", "-t", &self.0]).stdout).into_owned()
    }

    fn keys(&self, keys: &str) {
        assert!(self.tmux(&["send-keys", "-t", &self.0, keys]).status.success());
    }

    /// Wait (up to 15 s) until the screen satisfies `ok`; return it.
    fn wait_for(&self, what: &str, ok: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let screen = self.screen();
            if ok(&screen) {
                return screen;
            }
            assert!(Instant::now() < deadline, "timed out waiting for {what}; screen:\n{screen}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = self.tmux(&["kill-session", "-t", &self.0]);
    }
}

#[test]
fn demo_in_tmux_answers_keys_and_restores_the_terminal() {
    let test = "demo_in_tmux_answers_keys_and_restores_the_terminal";
    let Some(_vms) = have_kvm(test) else { return };
    if !have_tracefs(test) {
        return;
    }
    if Command::new("tmux").arg("-V").output().is_err() {
        note(test, "SKIP: tmux is not installed (apt-get install tmux)");
        return;
    }
    let exe = assert_cmd::cargo::cargo_bin("virtprof");
    let session = Session(format!("virtprof-it-{}", std::process::id()));
    let command = format!("{} demo --duration 60s -d 1", exe.display());
    let started = session.tmux(&["new-session", "-d", "-s", &session.0, "-x", "200", "-y", "40", &command]);
    assert!(started.status.success(), "{}", String::from_utf8_lossy(&started.stderr));
    session.tmux(&["set-option", "-t", &session.0, "remain-on-exit", "on"]);

    let screen = session.wait_for("the demo VMs with figures", |s| {
        ["contend-0", "contend-1", "io ", "exits"].iter().all(|vm| s.contains(vm)) && s.contains("window 1s (1.0 s)")
    });
    assert!(screen.contains("RUN%") && screen.contains(" vcpu0"), "{screen}");
    // The contending VMs share CPU 0: both run, neither more than the CPU, and each row's shares
    // add up. (How the CPU splits between them is checked against schedstat in `sched.rs`;
    // here other load on the host may shift it.)
    let mut runs = Vec::new();
    for vm in ["contend-0", "contend-1"] {
        let row = screen.lines().find(|l| l.starts_with(vm)).unwrap();
        // Name, (kind), pid, then RUN%, WAIT%, BLK%.
        let pct = |i: usize| -> f64 {
            row.split_whitespace().nth(i).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{row}"))
        };
        let (run, wait, blocked) = (pct(3), pct(4), pct(5));
        assert!(run > 1.0 && run < 99.0, "{row}");
        assert!((run + wait + blocked - 100.0).abs() <= 1.0, "{row}");
        runs.push(run);
    }
    assert!(runs.iter().sum::<f64>() <= 101.0, "two VMs on one CPU: {runs:?}");
    let vmm_pids: Vec<u32> = screen
        .lines()
        .filter(|l| l.starts_with("contend") || l.starts_with("io ") || l.starts_with("exits"))
        .filter_map(|l| l.split_whitespace().find_map(|w| w.parse().ok()))
        .collect();
    assert_eq!(vmm_pids.len(), 4, "{screen}");

    session.keys("v");
    session.wait_for("VM rows only", |s| s.contains("contend-0") && !s.contains(" vcpu0"));
    session.keys("?");
    session.wait_for("the help overlay", |s| s.contains(" help ") && s.contains("host-side steal"));
    session.keys("?");
    session.keys("c");
    session.wait_for("the CPU 0 view", |s| s.contains("CPU 0 ·") && !s.contains(" help "));
    session.keys("q");
    let after = session.wait_for("the terminal restored", |s| !s.contains("RUN%"));
    assert!(!after.contains("virtprof top"), "{after}");

    // The demo's VMs are gone, and so is its tracefs instance.
    let deadline = Instant::now() + Duration::from_secs(10);
    while vmm_pids.iter().any(|p| std::path::Path::new(&format!("/proc/{p}")).exists()) {
        assert!(Instant::now() < deadline, "demo VMs still running after q: {vmm_pids:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let tracefs = virtprof_trace::Tracefs::locate().unwrap();
    let mine = std::fs::read_dir(tracefs.root().join("instances"))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|name| name.starts_with("virtprof-record-"))
        .filter(|name| {
            let pid = name.rsplit('-').next().unwrap_or("");
            !std::path::Path::new(&format!("/proc/{pid}")).exists()
        })
        .collect::<Vec<_>>();
    assert!(mine.is_empty(), "tracefs instances of dead processes left behind: {mine:?}");
}

/// A pseudo-terminal of 200×40; `(controller, terminal)`.
fn open_pty() -> (std::os::fd::OwnedFd, std::os::fd::OwnedFd) {
    use std::os::fd::FromRawFd;
    let (mut controller, mut terminal) = (-1, -1);
    let size = libc::winsize { ws_row: 40, ws_col: 200, ws_xpixel: 0, ws_ypixel: 0 };
    // SAFETY: openpty fills the two descriptors; no name buffer, no termios.
    let rc = unsafe { libc::openpty(&mut controller, &mut terminal, std::ptr::null_mut(), std::ptr::null(), &size) };
    assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
    // The controller must not leak into the child: the terminal only hangs up once every copy
    // of it is closed.
    // SAFETY: fcntl on the descriptor just opened.
    assert_eq!(unsafe { libc::fcntl(controller, libc::F_SETFD, libc::FD_CLOEXEC) }, 0);
    // SAFETY: both descriptors were just opened and are owned here only.
    unsafe { (std::os::fd::OwnedFd::from_raw_fd(controller), std::os::fd::OwnedFd::from_raw_fd(terminal)) }
}

/// Read the controller side until `needle` shows or 30 s pass; the screen so far.
fn read_until(controller: &std::os::fd::OwnedFd, needle: &str) -> String {
    use std::os::fd::AsRawFd;
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut screen = Vec::new();
    while Instant::now() < deadline && !String::from_utf8_lossy(&screen).contains(needle) {
        let mut p = libc::pollfd { fd: controller.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one pollfd, for the length given.
        if unsafe { libc::poll(&mut p, 1, 200) } > 0 {
            let mut buf = [0u8; 65536];
            // SAFETY: a read into a buffer of the length given.
            let n = unsafe { libc::read(controller.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                break;
            }
            screen.extend_from_slice(&buf[..n as usize]);
        }
    }
    String::from_utf8_lossy(&screen).into_owned()
}

/// Wait (up to 10 s) for the view started as `child` to end; then check that its tracefs
/// instance and its child processes `kids` are gone. Its exit status and how long it took.
fn ends_cleanly(mut child: std::process::Child, kids: &[u32], what: &str) -> (std::process::ExitStatus, Duration) {
    let pid = child.id();
    let since = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if since.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what}: still running after 10 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = since.elapsed();
    assert!(status.code().is_some(), "{what}: killed by a signal: {status:?}");
    assert!(!super::reliability::instance_left(pid), "{what}: tracefs instance left");
    let deadline = Instant::now() + Duration::from_secs(5);
    while kids.iter().any(|&k| super::reliability::alive(k)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!kids.iter().any(|&k| super::reliability::alive(k)), "{what}: children {kids:?} left running");
    (status, took)
}

/// `top` and `demo` end cleanly when their terminal goes away (the window closed, ssh
/// dropped), whether or not it was their controlling terminal (which also sends SIGHUP):
/// no spinning on end-of-file, no VM or tracefs instance left.
#[test]
fn top_and_demo_end_when_their_terminal_closes() {
    use std::os::unix::process::CommandExt;
    let test = "top_and_demo_end_when_their_terminal_closes";
    let Some(_vms) = have_kvm(test) else { return };
    if !have_tracefs(test) {
        return;
    }
    let exe = assert_cmd::cargo::cargo_bin("virtprof");
    let runs: [(&[&str], bool); 4] = [
        (&["top", "-d", "0.5"], false),
        (&["top", "-d", "0.5"], true),
        (&["demo", "--duration", "60s", "-d", "1"], false),
        (&["demo", "--duration", "60s", "-d", "1"], true),
    ];
    for (args, controlling) in runs {
        let what = format!("{args:?} (controlling terminal: {controlling})");
        let (controller, terminal) = open_pty();
        let mut command = Command::new(&exe);
        command
            .args(args)
            .stdin(terminal.try_clone().unwrap())
            .stdout(terminal.try_clone().unwrap())
            .stderr(terminal.try_clone().unwrap());
        if controlling {
            // SAFETY: async-signal-safe calls only, between fork and exec.
            unsafe {
                command.pre_exec(|| {
                    if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let child = command.spawn().unwrap();
        drop(terminal);
        let pid = child.id();
        let screen = read_until(&controller, "refresh");
        assert!(screen.contains("refresh"), "{what}: the view never drew:\n{screen}");
        let kids = super::reliability::children(pid);
        assert!(args[0] != "demo" || !kids.is_empty(), "{what}: the demo's VMs did not start");
        drop(controller);
        let (status, took) = ends_cleanly(child, &kids, &format!("{what}, its terminal closed"));
        assert_eq!(status.code(), Some(0), "{what}: a closed terminal is how a view ends, not a failure");
        note(test, format!("{what}: ended {took:?} after its terminal closed, {status}; {} children gone", kids.len()));
    }
}

/// A terminal that stops taking output (XOFF, a stalled ssh link) blocks the view's writes;
/// a stop signal still ends it within seconds, cleanly.
#[test]
fn a_stop_signal_ends_the_view_while_its_terminal_takes_no_output() {
    use std::os::fd::AsRawFd;
    let test = "a_stop_signal_ends_the_view_while_its_terminal_takes_no_output";
    let Some(_vms) = have_kvm(test) else { return };
    if !have_tracefs(test) {
        return;
    }
    let exe = assert_cmd::cargo::cargo_bin("virtprof");
    let (controller, terminal) = open_pty();
    let child = Command::new(&exe)
        .args(["demo", "--duration", "60s", "-d", "0.2"])
        .stdin(terminal.try_clone().unwrap())
        .stdout(terminal.try_clone().unwrap())
        .stderr(terminal.try_clone().unwrap())
        .spawn()
        .unwrap();
    let pid = child.id();
    let screen = read_until(&controller, "refresh");
    assert!(screen.contains("refresh"), "the view never drew:\n{screen}");
    let kids = super::reliability::children(pid);
    // Output stopped, as by XOFF: the view's next write blocks.
    // SAFETY: tcflow on the terminal descriptor this test holds.
    assert_eq!(unsafe { libc::tcflow(terminal.as_raw_fd(), libc::TCOOFF) }, 0);
    let deadline = Instant::now() + Duration::from_secs(15);
    let blocked = || std::fs::read_to_string(format!("/proc/{pid}/wchan")).is_ok_and(|w| w == "wait_woken");
    while !blocked() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(blocked(), "the view never blocked writing to the stopped terminal");
    // SAFETY: kill on the pid of the child spawned here, not yet reaped.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let (status, took) = ends_cleanly(child, &kids, "SIGTERM with its terminal stopped");
    assert_eq!(status.code(), Some(0), "{status:?}");
    note(test, format!("ended {took:?} after SIGTERM while blocked writing"));
}
