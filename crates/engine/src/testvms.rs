//! Test VMs started by another command (`demo`, `balance bench`): `virtprof testvm` child
//! processes, found again as the VMM processes they start, and stopped whatever happens.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::usage;

/// The longest test VMs are given to start: on a loaded host (load 7 on 2 CPUs), 10 s was
/// once too short for four.
pub const START_WITHIN: Duration = Duration::from_secs(60);

/// Running `virtprof testvm` processes; dropping them stops them (and their VMMs).
pub struct TestVms {
    children: Vec<Child>,
    /// Who started them, for error messages (`demo`, `balance bench`).
    what: &'static str,
}

impl TestVms {
    /// None started yet.
    pub fn new(what: &'static str) -> TestVms {
        TestVms { children: Vec::new(), what }
    }

    /// Start `virtprof testvm ARGS`.
    pub fn start(&mut self, args: &[&str]) -> anyhow::Result<()> {
        let mut command = Command::new(std::env::current_exe()?);
        // Not outliving us, even killed with SIGKILL (testvm stops its VMMs on SIGTERM).
        virtprof_host::stop::die_with_parent(&mut command);
        let child = command
            .arg("testvm")
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?;
        self.children.push(child);
        Ok(())
    }

    /// The VMM processes (children of our testvm children) once `count` of them hold a VM
    /// with all its vCPU threads, in start order of the testvm processes; None when a stop
    /// signal came first (dropping `self` then stops what started). On a loaded host starting
    /// takes a while: after a few seconds it says it is still waiting, and gives up after
    /// [`START_WITHIN`].
    pub fn wait_for_vmms(&mut self, count: usize) -> anyhow::Result<Option<Vec<u32>>> {
        let parents: Vec<u32> = self.children.iter().map(Child::id).collect();
        let started = Instant::now();
        let deadline = started + START_WITHIN;
        let mut said = false;
        loop {
            let vmms: Vec<u32> = children_of(&parents)
                .into_iter()
                .filter(|&(pid, _)| {
                    virtprof_kvm::discover::inspect(Path::new("/proc"), pid).ok().flatten().is_some_and(|vm| {
                        vm.vcpu_fds > 0 && u32::try_from(vm.vcpus.len()).is_ok_and(|n| n == vm.vcpu_fds)
                    })
                })
                .map(|(pid, _)| pid)
                .collect();
            if vmms.len() == count {
                return Ok(Some(vmms));
            }
            if virtprof_host::stop::requested() {
                return Ok(None);
            }
            for child in &mut self.children {
                if let Some(status) = child.try_wait()? {
                    let mut stderr = String::new();
                    if let Some(mut e) = child.stderr.take() {
                        let _ = std::io::Read::read_to_string(&mut e, &mut stderr);
                    }
                    // testvm's own message says what to fix (no /dev/kvm, no permission, ...).
                    let reason = stderr.trim().lines().last().unwrap_or("no message").trim_start_matches("virtprof: ");
                    if status.success() {
                        anyhow::bail!(
                            "a {} test VM ended before all {count} had started (found {}): the host is too loaded to start them within their run",
                            self.what,
                            vmms.len()
                        );
                    }
                    return Err(usage(format!("a {} test VM failed to start ({status}): {reason}", self.what)));
                }
            }
            if Instant::now() > deadline {
                anyhow::bail!(
                    "the {} test VMs did not start within {} s (found {} of {count}); is the host overloaded?",
                    self.what,
                    START_WITHIN.as_secs(),
                    vmms.len()
                );
            }
            if !said && started.elapsed() > Duration::from_secs(5) {
                eprintln!(
                    "virtprof {}: still starting its test VMs ({} of {count} up; the host is busy)",
                    self.what,
                    vmms.len()
                );
                said = true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for TestVms {
    fn drop(&mut self) {
        for child in &mut self.children {
            // testvm forwards SIGTERM to its VMM processes and waits for them.
            let pid = libc::pid_t::try_from(child.id()).unwrap_or(0);
            // SAFETY: kill with the pid of a child we spawned and a valid signal.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        for child in &mut self.children {
            let _ = child.wait();
        }
    }
}

/// Processes whose parent is one of `parents`, as (pid, parent), ordered by parent position
/// then pid.
fn children_of(parents: &[u32]) -> Vec<(u32, usize)> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    let mut pids: Vec<(u32, usize)> = entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let rest = &stat[stat.rfind(')')? + 1..];
            let ppid = rest.split_whitespace().nth(1)?.parse::<u32>().ok()?;
            Some((pid, parents.iter().position(|&p| p == ppid)?))
        })
        .collect();
    pids.sort_unstable_by_key(|&(pid, parent)| (parent, pid));
    pids
}
