//! `virtprof testvm` as a whole: one VMM process per VM (named `virtprof-vm`, like a real host
//! runs one QEMU per guest), each fed its [`VmConfig`] as JSON on stdin and answering with its
//! [`VmReport`] as JSON on stdout. The parent only launches, forwards SIGINT/SIGTERM, and
//! gathers.

use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::Duration;

use virtprof_model::testvm::{TestvmReport, VmReport};

use crate::error::VmmError;
use crate::guest::Script;
use virtprof_host::monotonic_ns;
use virtprof_host::stop::STOP_REQUESTED;

use crate::vmm::{Vm, VmConfig};

/// The hidden subcommand a VMM child process is started with.
pub const CHILD_SUBCOMMAND: &str = "__vmm";
/// The VMM processes' name (`comm`), so tools can find them.
pub const VMM_PROCESS_NAME: &str = "virtprof-vm";

/// A whole test-bed run.
#[derive(Debug, Clone)]
pub struct TestvmConfig {
    /// What every vCPU runs.
    pub script: Script,
    /// Number of VMs (VMM processes).
    pub vms: u32,
    /// vCPUs per VM.
    pub vcpus: u32,
    /// Host CPUs assigned to vCPUs in order across all VMs, cycling (`--pin 0` puts every vCPU
    /// on CPU 0; `--pin 0,1` alternates).
    pub pin: Vec<u32>,
    /// Sleep per `io-bound` request.
    pub io_latency_ns: u64,
    /// Enable the steal-time record.
    pub steal_time: bool,
    /// Keep VMs alive after their guests finish.
    pub linger_ns: u64,
    /// VM name prefix (default: the workload's name).
    pub name: Option<String>,
    /// Sample every vCPU's program counter at this rate (0: off; `virtprof boot --testvm`).
    pub sample_hz: u32,
    /// The `noise` workload's threshold.
    pub noise_threshold_ns: u64,
    /// Serve `io-bound` requests on an I/O thread per VM (pinned to the CPU given).
    pub io_thread: Option<Option<u32>>,
    /// Take the `touch` buffers back from the guests this often per second (0: never).
    pub reclaim_hz: u32,
}

impl TestvmConfig {
    /// The name of VM `index`: `NAME` for a single VM, `NAME-i` for several.
    pub fn vm_name(&self, index: u32) -> String {
        let base = self.name.clone().unwrap_or_else(|| {
            let script = self.script.to_string();
            script.split([':', ',', ' ']).next().unwrap_or("testvm").to_string()
        });
        if self.vms == 1 {
            base
        } else {
            format!("{base}-{index}")
        }
    }

    fn vm_config(&self, index: u32) -> VmConfig {
        let pin = (0..self.vcpus)
            .map(|v| {
                let global = (index * self.vcpus + v) as usize;
                (!self.pin.is_empty()).then(|| self.pin[global % self.pin.len()])
            })
            .collect();
        VmConfig {
            index,
            script: self.script.clone(),
            vcpus: self.vcpus,
            pin,
            io_latency_ns: self.io_latency_ns,
            steal_time: self.steal_time,
            linger_ns: self.linger_ns,
            sample_hz: self.sample_hz,
            noise_threshold_ns: self.noise_threshold_ns,
            io_thread: self.io_thread,
            reclaim_hz: self.reclaim_hz,
        }
    }
}

/// Can this process create VMs? The error says how to fix it when not.
pub fn check_kvm() -> Result<(), VmmError> {
    kvm_ioctls::Kvm::new().map(drop).map_err(VmmError::OpenKvm)
}

/// Start every VM as a child process of `exe` and wait for their reports.
pub fn run_testvm(exe: &Path, config: &TestvmConfig) -> Result<TestvmReport, VmmError> {
    // Fail fast, in this process, with the clear /dev/kvm error rather than N child errors.
    check_kvm()?;
    let started = monotonic_ns();
    let mut children = Vec::new();
    for index in 0..config.vms {
        let json = serde_json::to_vec(&config.vm_config(index)).expect("VmConfig serializes");
        let mut command = Command::new(exe);
        // A VM must not outlive its launcher.
        virtprof_host::stop::die_with_parent(&mut command);
        let mut child = command
            .arg0(VMM_PROCESS_NAME)
            .arg(CHILD_SUBCOMMAND)
            .arg("--name")
            .arg(config.vm_name(index))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| VmmError::Os { what: format!("starting VMM process '{}'", exe.display()), source })?;
        child
            .stdin
            .take()
            .expect("stdin is piped")
            .write_all(&json)
            .map_err(|source| VmmError::Os { what: format!("sending the configuration to VM {index}"), source })?;
        let pid = child.id();
        let waiter = std::thread::spawn(move || child.wait_with_output());
        children.push((index, pid, waiter));
    }

    let mut forwarded = false;
    while !children.iter().all(|(_, _, w)| w.is_finished()) {
        if STOP_REQUESTED.load(Ordering::Relaxed) && !forwarded {
            for (_, pid, _) in &children {
                // SAFETY: kill with a pid we spawned and a valid signal number.
                unsafe { libc::kill(*pid as libc::pid_t, libc::SIGTERM) };
            }
            forwarded = true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }

    let mut vms = Vec::with_capacity(children.len());
    for (index, pid, waiter) in children {
        let output = waiter
            .join()
            .map_err(|_| VmmError::Child { index, pid, message: "waiter thread panicked".into() })?
            .map_err(|source| VmmError::Os { what: format!("waiting for VM {index}"), source })?;
        // Ended by the stop passed on to it, before it could report (before its own handler).
        if forwarded && std::os::unix::process::ExitStatusExt::signal(&output.status) == Some(libc::SIGTERM) {
            return Err(VmmError::Stopped { index });
        }
        if !output.status.success() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            let message = stderr
                .trim()
                .lines()
                .last()
                .unwrap_or("exited without a message")
                .trim_start_matches("virtprof: ")
                .to_string();
            return Err(VmmError::Child { index, pid, message: format!("{message} ({})", output.status) });
        }
        let report: VmReport = serde_json::from_slice(&output.stdout).map_err(|e| VmmError::Child {
            index,
            pid,
            message: format!("unreadable report: {e}"),
        })?;
        vms.push(report);
    }
    Ok(TestvmReport {
        workload: config.script.to_string(),
        cpl: config.script.privilege.cpl(),
        wall_ns: monotonic_ns() - started,
        marker_io_exits_per_vcpu: config.script.marker_exits(),
        vms,
    })
}

/// The body of a VMM child process: read a [`VmConfig`] from `input`, run it, write the
/// [`VmReport`] to `output`.
pub fn serve_child(mut input: impl Read, mut output: impl Write) -> Result<(), VmmError> {
    set_process_name(VMM_PROCESS_NAME);
    let mut json = Vec::new();
    input
        .read_to_end(&mut json)
        .map_err(|source| VmmError::Os { what: "reading the VM configuration".into(), source })?;
    let config: VmConfig =
        serde_json::from_slice(&json).map_err(|e| VmmError::Memory(format!("bad VM configuration on stdin: {e}")))?;
    let report = Vm::new(config)?.run()?;
    // In one write: standard output's buffer is 1 KiB, and a noise run's report is megabytes.
    let json = serde_json::to_vec(&report).expect("VmReport serializes");
    let written = output.write_all(&json).and_then(|()| output.flush());
    written.map_err(|source| VmmError::Os { what: "writing the report".into(), source })
}

/// Set the calling thread's `comm` (for the main thread, the process name `ps` shows).
fn set_process_name(name: &str) {
    let mut buf = [0u8; 16];
    let n = name.len().min(15);
    buf[..n].copy_from_slice(&name.as_bytes()[..n]);
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes from `buf`.
    unsafe { libc::prctl(libc::PR_SET_NAME, buf.as_ptr() as libc::c_ulong, 0, 0, 0) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guest::{Bound, Workload};

    #[test]
    fn pins_cycle_across_vms() {
        let config = TestvmConfig {
            script: Script::single(Workload::Compute, Bound::Iterations(1)),
            vms: 2,
            vcpus: 2,
            pin: vec![0, 1, 2],
            io_latency_ns: 0,
            steal_time: false,
            linger_ns: 0,
            name: None,
            sample_hz: 0,
            noise_threshold_ns: 0,
            io_thread: None,
            reclaim_hz: 0,
        };
        assert_eq!((config.vm_name(0), config.vm_name(1)), ("compute-0".into(), "compute-1".into()));
        assert_eq!(config.vm_config(0).pin, vec![Some(0), Some(1)]);
        assert_eq!(config.vm_config(1).pin, vec![Some(2), Some(0)]);
        let unpinned = TestvmConfig { pin: vec![], ..config };
        assert_eq!(unpinned.vm_config(1).pin, vec![None, None]);
    }
}
