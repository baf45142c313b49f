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
