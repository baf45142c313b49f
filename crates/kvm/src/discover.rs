//! Finding the VMs on a host: processes holding an `anon_inode:kvm-vm` fd, what VMM they run,
//! the name their command line gives the VM, and which of their threads are vCPUs.
//!
//! Every VMM names its vCPU threads differently; [`vcpu_index`] knows them all. A VMM that
//! names none (QEMU without `-name debug-threads=on`, or an unknown one) yields a VM with no
//! vCPU threads here, and the caller falls back on the threads that emit kvm events.
//!
//! Everything reads through a `proc_root` so tests can point it at a fake `/proc` tree.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use virtprof_host::procfiles::{open_file_limit, ProcFiles};
use virtprof_host::procfs::parse_start_ticks;
use virtprof_model::vmm::{ThreadRole, VmOwner, VmmKind};

use crate::remote::{list_kvm_fds, KvmFdKind};

/// A VM found on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveredVm {
    /// The VMM process.
    pub pid: u32,
    /// Which VMM it is.
    pub kind: VmmKind,
    /// The VM's name from the VMM's command line, or `<kind>-<pid>`.
    pub name: String,
    /// vCPU fds the VMM holds (the VM's vCPU count, even when threads are not named).
    pub vcpu_fds: u32,
    /// vCPU threads recognized by name, by index.
    pub vcpus: Vec<VcpuThread>,
    /// Its UUID, libvirt domain, pod and container, where the host has them.
    pub owner: VmOwner,
}

/// One vCPU thread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VcpuThread {
    /// vCPU index within its VM.
    pub index: u32,
    /// Thread id.
    pub tid: u32,
}

/// The VMM kind from the process name (`comm`, at most 15 bytes) and its argv.
pub fn vmm_kind(comm: &str, argv: &[String]) -> VmmKind {
    let exe = argv.first().map(|a| a.rsplit('/').next().unwrap_or(a)).unwrap_or("");
    let is = |prefix: &str| comm.starts_with(prefix) || exe.starts_with(prefix);
    if comm == crate::launcher::VMM_PROCESS_NAME || exe == crate::launcher::VMM_PROCESS_NAME {
        VmmKind::VirtprofTestvm
    } else if is("qemu-system") || is("qemu-kvm") || comm == "qemu" {
        VmmKind::Qemu
    } else if is("firecracker") {
        VmmKind::Firecracker
    } else if is("cloud-hyperviso") {
        VmmKind::CloudHypervisor
    } else if is("crosvm") {
        VmmKind::Crosvm
    } else {
        VmmKind::Unknown
    }
}

/// The VM's name as the VMM's command line gives it: QEMU `-name NAME` or
/// `-name guest=NAME,...`, Firecracker `--id ID`, crosvm/cloud-hypervisor/testvm `--name`.
pub fn vm_name(kind: VmmKind, argv: &[String], pid: u32) -> String {
    let value_of = |flags: &[&str]| {
        argv.iter().enumerate().find_map(|(i, arg)| {
            flags.iter().find_map(|flag| {
                if arg == flag {
                    argv.get(i + 1).cloned()
                } else {
                    arg.strip_prefix(flag).and_then(|rest| rest.strip_prefix('=')).map(str::to_string)
                }
            })
        })
    };
    let name = match kind {
        VmmKind::Qemu => value_of(&["-name", "--name"]).map(|v| {
            let mut parts = v.split(',');
            let first = parts.next().unwrap_or_default();
            std::iter::once(first)
                .chain(parts)
                .find_map(|p| p.strip_prefix("guest="))
                .unwrap_or(if first.contains('=') { "" } else { first })
                .to_string()
        }),
        VmmKind::Firecracker => value_of(&["--id"]),
        _ => value_of(&["--name"]),
    };
    // Names come from a command line anyone can set: escape what a terminal would act on.
    name.filter(|n| !n.is_empty())
        .map(|n| virtprof_model::units::printable(&n).into_owned())
        .unwrap_or_else(|| format!("{kind}-{pid}"))
}

/// The vCPU index a thread name denotes under any VMM's naming scheme: QEMU `CPU n/KVM`,
/// Firecracker `fc_vcpu n`, cloud-hypervisor and testvm `vcpuN`, crosvm `crosvm_vcpuN`.
pub fn vcpu_index(thread_comm: &str) -> Option<u32> {
    let digits = |s: &str| (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())).then(|| s.parse().ok()).flatten();
    if let Some(rest) = thread_comm.strip_prefix("CPU ") {
        return digits(rest.strip_suffix("/KVM")?);
    }
    if let Some(rest) = thread_comm.strip_prefix("fc_vcpu") {
        return digits(rest.trim_start());
    }
    if let Some(rest) = thread_comm.strip_prefix("crosvm_vcpu") {
        return digits(rest.trim_start());
    }
    digits(thread_comm.strip_prefix("vcpu")?)
}

/// The vCPU index of a QEMU thread emulating a vCPU without KVM (`CPU n/TCG`): a VM all the
/// same, whose vCPUs are scheduled like any, but one that makes no exits.
pub fn emulated_vcpu_index(thread_comm: &str) -> Option<u32> {
    let index = thread_comm.strip_prefix("CPU ")?.strip_suffix("/TCG")?;
    (!index.is_empty() && index.bytes().all(|b| b.is_ascii_digit())).then(|| index.parse().ok()).flatten()
}

/// The VMM process a vhost worker serves: the kernel names it `vhost-PID` after its owner
/// (a thread of that process since Linux 6.4, a kernel thread before).
pub fn vhost_owner(thread_comm: &str) -> Option<u32> {
    thread_comm.strip_prefix("vhost-")?.parse().ok()
}

/// What thread `tid` (named `comm`) of VMM process `pid` does for its VM.
pub fn thread_role(pid: u32, tid: u32, comm: &str) -> ThreadRole {
    if vcpu_index(comm).is_some() || emulated_vcpu_index(comm).is_some() {
        ThreadRole::Vcpu
    } else if vhost_owner(comm).is_some() {
        ThreadRole::Vhost
    } else if tid == pid {
        ThreadRole::MainLoop
    } else if comm.starts_with("IO ") || ["_net", "_disk", "_block", "_virtio"].iter().any(|p| comm.starts_with(p)) {
        // QEMU names an iothread `IO <object id>`; cloud-hypervisor its device threads.
        ThreadRole::IoThread
    } else if comm == "worker" {
        ThreadRole::Worker
    } else {
        ThreadRole::Other
    }
}

/// Inspect process `pid`: `Ok(None)` if it holds no KVM VM.
pub fn inspect(proc_root: &Path, pid: u32) -> std::io::Result<Option<DiscoveredVm>> {
    let fds = list_kvm_fds(proc_root, pid).map_err(|e| match e {
        // Kept whole: a refusal (no CAP_SYS_PTRACE) is told from a process that went away.
        crate::error::StatsError::Proc { source, .. } => source,
        e => std::io::Error::other(e.to_string()),
    })?;
    if !fds.iter().any(|f| f.kind == KvmFdKind::Vm) {
        return Ok(None);
    }
    let vcpu_fds = fds.iter().filter(|f| matches!(f.kind, KvmFdKind::Vcpu(_))).count();
    Ok(Some(describe(proc_root, pid, u32::try_from(vcpu_fds).unwrap_or(u32::MAX), vcpu_index)))
}

/// Process `pid` as a VM whose vCPUs QEMU emulates without KVM (threads `CPU n/TCG`), or
/// None. Such a VM has no exits to count, but its vCPU threads run, wait and move like any.
pub fn inspect_emulated(proc_root: &Path, pid: u32) -> Option<DiscoveredVm> {
    let vm = describe(proc_root, pid, 0, emulated_vcpu_index);
    (!vm.vcpus.is_empty()).then_some(vm)
}

/// What `/proc` says of VMM `pid`, its vCPU threads being those `index_of` names.
fn describe(proc_root: &Path, pid: u32, vcpu_fds: u32, index_of: fn(&str) -> Option<u32>) -> DiscoveredVm {
    let dir = proc_root.join(pid.to_string());
    let comm = virtprof_host::procfs::read_trimmed(&dir.join("comm"));
    let argv: Vec<String> = fs::read(dir.join("cmdline"))
        .unwrap_or_default()
        .split(|&b| b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let kind = vmm_kind(&comm, &argv);
    let mut vcpus: Vec<VcpuThread> = virtprof_host::procfs::threads(proc_root, pid)
        .into_iter()
        .filter_map(|(tid, name)| Some(VcpuThread { index: index_of(&name)?, tid }))
        .collect();
    vcpus.sort_by_key(|v| (v.index, v.tid));
    DiscoveredVm {
        pid,
        kind,
        name: vm_name(kind, &argv, pid),
        owner: crate::owner::owner(proc_root, pid, kind, &argv),
        vcpu_fds,
        vcpus,
    }
}

/// Keeps the host's VM list current. [`Discovery::scan`] lists `/proc` and inspects the fd
/// tables of new processes; [`Discovery::rescan_known`] skips the listing (a dentry lookup per
/// process) and only re-checks known VMs and recently seen processes, for callers that refresh
/// often and can look for new processes less often.
#[derive(Debug)]
pub struct Discovery {
    proc_root: PathBuf,
    /// pid → what was learned about it.
    known: HashMap<u32, Known>,
    /// Restrict to these VMM pids (empty: every VM).
    only: Vec<u32>,
    /// Known VMs' pidfds (Linux 5.3 on): one `poll` over them says which VMs exited, where
    /// reading each VM's stat file again cost a /proc read per VM at every check.
    pidfds: HashMap<u32, OwnedFd>,
    /// VMs' stat files, kept open, where a pidfd cannot be had (a test's stand-in root, an
    /// older kernel): each VM's is read at every check (other processes' once).
    stat_files: ProcFiles,
}

/// A process seen by discovery.
#[derive(Debug, Clone)]
struct Known {
    /// Start time (clock ticks since boot), to tell a reused pid.
    start: u64,
    /// When discovery first saw it: a process holding no VM is re-inspected for
    /// [`RECHECK_FOR`] (a VMM creates its VM a moment after starting).
    first_seen: Instant,
    /// Its VM, if it holds one.
    vm: Option<DiscoveredVm>,
    /// Its fd table could not be read: permission denied (a VM it runs is not seen).
    denied: bool,
}

impl Known {
    fn worth_rechecking(&self) -> bool {
        self.vm.is_some() || self.first_seen.elapsed() < RECHECK_FOR
    }
}

/// Whether this process holds CAP_SYS_PTRACE (bit 19 of `CapEff` in /proc/self/status),
/// which lets it read any process's fd table.
fn may_ptrace_any() -> bool {
    static HOLDS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HOLDS.get_or_init(|| {
        let status = fs::read_to_string("/proc/self/status").unwrap_or_default();
        let effective = status.lines().find_map(|l| l.strip_prefix("CapEff:")).map(str::trim);
        effective.and_then(|hex| u64::from_str_radix(hex, 16).ok()).is_some_and(|caps| caps & (1 << 19) != 0)
    })
}

/// How long a new process holding no VM keeps being re-inspected.
const RECHECK_FOR: Duration = Duration::from_secs(10);

impl Discovery {
    /// Discovery over `proc_root`, restricted to `only` when that is not empty.
    pub fn new(proc_root: impl Into<PathBuf>, only: Vec<u32>) -> Discovery {
        Discovery {
            proc_root: proc_root.into(),
            known: HashMap::new(),
            only,
            pidfds: HashMap::new(),
            stat_files: ProcFiles::for_this_process(),
        }
    }

    /// The VMs alive now, by pid: every process is considered (or the `only` ones). VMs that
    /// exited are dropped; new ones appear. A VM's vCPU threads are re-read while fewer are
    /// named than it has vCPU fds (VMMs start them late).
    pub fn scan(&mut self) -> Vec<DiscoveredVm> {
        let pids: Vec<u32> = if self.only.is_empty() {
            let Ok(entries) = fs::read_dir(&self.proc_root) else { return Vec::new() };
            entries.filter_map(Result::ok).filter_map(|e| e.file_name().to_str()?.parse().ok()).collect()
        } else {
            self.only.clone()
        };
        let exited = self.exited_vms();
        let mut alive = HashMap::with_capacity(pids.len());
        for pid in pids {
            if let Some(known) = self.check(pid, &exited) {
                alive.insert(pid, known);
            }
        }
        self.known = alive;
        self.watch_new_vms();
        self.vms()
    }

    /// Like [`Discovery::scan`] without listing `/proc`: known VMs are re-checked (exits,
    /// reused pids, late vCPU threads) and recently seen processes re-inspected; processes
    /// started since the last [`Discovery::scan`] are not found.
    pub fn rescan_known(&mut self) -> Vec<DiscoveredVm> {
        let pids: Vec<u32> = self.known.iter().filter(|(_, k)| k.worth_rechecking()).map(|(pid, _)| *pid).collect();
        let exited = self.exited_vms();
        for pid in pids {
            match self.check(pid, &exited) {
                Some(known) => self.known.insert(pid, known),
                None => self.known.remove(&pid),
            };
        }
        self.watch_new_vms();
        self.vms()
    }

    /// The watched VMs whose process has exited (its pidfd is readable then).
    fn exited_vms(&self) -> HashSet<u32> {
        let (pids, mut fds): (Vec<u32>, Vec<libc::pollfd>) = self
            .pidfds
            .iter()
            .map(|(pid, fd)| (*pid, libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 }))
            .unzip();
        let Ok(count) = libc::nfds_t::try_from(fds.len()) else { return HashSet::new() };
        // SAFETY: `fds` is an array of `count` pollfds; a zero timeout does not block.
        if unsafe { libc::poll(fds.as_mut_ptr(), count, 0) } <= 0 {
            return HashSet::new();
        }
        pids.into_iter().zip(&fds).filter(|(_, p)| p.revents != 0).map(|(pid, _)| pid).collect()
    }

    /// Open a pidfd for each VM found since the last look (where the kernel has them), and
    /// close those of processes no longer known as VMs.
    fn watch_new_vms(&mut self) {
        let known = &self.known;
        self.pidfds.retain(|pid, _| known.get(pid).is_some_and(|k| k.vm.is_some()));
        if self.proc_root != Path::new("/proc") {
            return;
        }
        // At most an eighth of the files this process may open: VMs past that are checked
        // through their stat files (which keep to a budget of their own).
        let room = usize::try_from(open_file_limit() / 8).unwrap_or(usize::MAX).saturating_sub(self.pidfds.len());
        let new: Vec<(u32, u64)> = known
            .iter()
            .filter(|(pid, k)| k.vm.is_some() && !self.pidfds.contains_key(pid))
            .map(|(pid, k)| (*pid, k.start))
            .take(room)
            .collect();
        for (pid, start) in new {
            let Some(fd) = pidfd_open(pid) else { continue };
            // The pid may have been given to a new process since it was checked: the pidfd is
            // kept only if the process it holds started when the VM's did.
            if start_time(&self.proc_root, pid) == Some(start) {
                self.pidfds.insert(pid, fd);
            }
        }
    }

    /// `exited`: watched VMs whose process has exited.
    fn check(&mut self, pid: u32, exited: &HashSet<u32>) -> Option<Known> {
        if pid == std::process::id() {
            return None;
        }
        let root = &self.proc_root;
        let inspect = || match inspect(root, pid) {
            Ok(vm) => (vm, false),
            // Holding CAP_SYS_PTRACE, a refusal is a process exiting meanwhile (the kernel
            // says EACCES once its task is gone), not one this process may not see.
            Err(e) => (None, e.kind() == std::io::ErrorKind::PermissionDenied && !may_ptrace_any()),
        };
        match self.known.remove(&pid) {
            Some(known) if !known.worth_rechecking() => Some(known),
            Some(known) => {
                let stat = root.join(pid.to_string()).join("stat");
                let start = match (&known.vm, self.pidfds.contains_key(&pid)) {
                    // Its pidfd holds this very process: alive, it is the same VM.
                    (Some(_), true) if !exited.contains(&pid) => known.start,
                    (Some(_), true) => return None,
                    (Some(_), false) => parse_start_ticks(self.stat_files.read(&stat)?)?,
                    (None, _) => start_time(root, pid)?,
                };
                if start != known.start {
                    let (vm, denied) = inspect();
                    return Some(Known { start, first_seen: Instant::now(), vm, denied });
                }
                // Seen between KVM_CREATE_VM and its first KVM_CREATE_VCPU, a VM has no vCPU fds
                // yet: that is not complete, or its vCPUs would never be looked for again.
                let complete =
                    known.vm.as_ref().is_some_and(|vm| vm.vcpu_fds > 0 && vm.vcpus.len() >= vm.vcpu_fds as usize);
                Some(if complete {
                    known
                } else {
                    let (vm, denied) = inspect();
                    Known { vm, denied, ..known }
                })
            }
            None => {
                let start = start_time(root, pid)?;
                let (vm, denied) = inspect();
                Some(Known { start, first_seen: Instant::now(), vm, denied })
            }
        }
    }

    /// Processes whose fd tables this process may not read (it lacks CAP_SYS_PTRACE over
    /// them): any VM they run is not found.
    pub fn denied(&self) -> usize {
        self.known.values().filter(|k| k.denied).count()
    }

    fn vms(&self) -> Vec<DiscoveredVm> {
        let mut vms: Vec<DiscoveredVm> = self.known.values().filter_map(|k| k.vm.clone()).collect();
        vms.sort_by_key(|v| v.pid);
        vms
    }
}

/// A pidfd for process `pid` (None where the kernel has none, before Linux 5.3, or refuses).
fn pidfd_open(pid: u32) -> Option<OwnedFd> {
    let pid = libc::pid_t::try_from(pid).ok()?;
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    let fd = std::os::fd::RawFd::try_from(fd).ok().filter(|&fd| fd >= 0)?;
    // SAFETY: the fd was just returned by the kernel and is owned by nobody else.
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The process's start time in clock ticks (field 22 of `/proc/PID/stat`).
fn start_time(proc_root: &Path, pid: u32) -> Option<u64> {
    parse_start_ticks(&fs::read(proc_root.join(pid.to_string()).join("stat")).ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One fake process: pid, comm, argv, fd link targets, thread names.
    type FakeProcess<'a> = (u32, &'a str, &'a [&'a str], &'a [&'a str], &'a [&'a str]);
    /// A VM as the test compares it: pid, kind, name, (vCPU index, tid).
    type Seen<'a> = (u32, VmmKind, &'a str, Vec<(u32, u32)>);

    /// A fake `/proc` with one process per entry.
    fn fake_proc(procs: &[FakeProcess<'_>]) -> PathBuf {
        static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let root = std::env::temp_dir().join(format!("virtprof-fakeproc-{}-{n}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        for (pid, comm, argv, fds, threads) in procs {
            let dir = root.join(pid.to_string());
            fs::create_dir_all(dir.join("fd")).unwrap();
            fs::write(dir.join("comm"), format!("{comm}\n")).unwrap();
            fs::write(dir.join("cmdline"), argv.iter().map(|a| format!("{a}\0")).collect::<String>()).unwrap();
            fs::write(dir.join("stat"), format!("{pid} ({comm}) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 4242 0 0"))
                .unwrap();
            for (i, target) in fds.iter().enumerate() {
                std::os::unix::fs::symlink(target, dir.join("fd").join((i + 3).to_string())).unwrap();
            }
            for (i, name) in threads.iter().enumerate() {
                let t = dir.join("task").join((pid + i as u32).to_string());
                fs::create_dir_all(&t).unwrap();
                fs::write(t.join("comm"), format!("{name}\n")).unwrap();
            }
        }
        root
    }

    const VM_FDS: &[&str] = &["anon_inode:kvm-vm", "anon_inode:kvm-vcpu:0", "anon_inode:kvm-vcpu:1", "/dev/null"];

    #[test]
    fn every_vmm_naming_scheme_is_recognized() {
        let root = fake_proc(&[
            (
                100,
                "qemu-system-x86",
                &["/usr/bin/qemu-system-x86_64", "-name", "guest=web1,debug-threads=on", "-smp", "2"],
                VM_FDS,
                &["qemu-system-x86", "CPU 0/KVM", "CPU 1/KVM", "IO mon_iothread"],
            ),
            (
                200,
                "firecracker",
                &["firecracker", "--id", "fc-7", "--api-sock", "/tmp/s"],
                VM_FDS,
                &["firecracker", "fc_api", "fc_vcpu 0", "fc_vcpu 1"],
            ),
            (
                300,
                "cloud-hyperviso",
                &["cloud-hypervisor", "--cpus", "boot=2"],
                VM_FDS,
                &["cloud-hyperviso", "vcpu0", "vcpu1", "http-server"],
            ),
            (
                400,
                "crosvm",
                &["crosvm", "run", "--name", "cros1", "vmlinux"],
                VM_FDS,
                &["crosvm", "crosvm_vcpu0", "crosvm_vcpu1"],
            ),
            (
                500,
                "virtprof-vm",
                &["virtprof-vm", "__vmm", "--name", "compute-0"],
                VM_FDS,
                &["virtprof-vm", "vcpu0", "vcpu1"],
            ),
            (600, "mystery", &["mystery"], VM_FDS, &["mystery", "worker"]),
            (700, "bash", &["bash"], &["/dev/null"], &["bash"]),
        ]);
        let vms = Discovery::new(&root, Vec::new()).scan();
        let got: Vec<Seen<'_>> = vms
            .iter()
            .map(|v| (v.pid, v.kind, v.name.as_str(), v.vcpus.iter().map(|c| (c.index, c.tid)).collect()))
            .collect();
        assert_eq!(
            got,
            vec![
                (100, VmmKind::Qemu, "web1", vec![(0, 101), (1, 102)]),
                (200, VmmKind::Firecracker, "fc-7", vec![(0, 202), (1, 203)]),
                (300, VmmKind::CloudHypervisor, "cloud-hypervisor-300", vec![(0, 301), (1, 302)]),
                (400, VmmKind::Crosvm, "cros1", vec![(0, 401), (1, 402)]),
                (500, VmmKind::VirtprofTestvm, "compute-0", vec![(0, 501), (1, 502)]),
                (600, VmmKind::Unknown, "unknown-600", vec![]),
            ]
        );
        assert!(vms.iter().all(|v| v.vcpu_fds == 2));
        fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn vms_that_appear_and_exit_are_tracked() {
        let root = fake_proc(&[(10, "firecracker", &["firecracker", "--id=a"], VM_FDS, &["fc_vcpu 0"])]);
        let mut discovery = Discovery::new(&root, Vec::new());
        assert_eq!(discovery.scan().iter().map(|v| v.name.clone()).collect::<Vec<_>>(), ["a"]);
        // A second VM starts, the first exits.
        let other =
            fake_proc(&[(20, "qemu-system-x86", &["qemu-system-x86_64", "-name", "b"], VM_FDS, &["CPU 0/KVM"])]);
        fs::rename(other.join("20"), root.join("20")).unwrap();
        fs::remove_dir_all(root.join("10")).unwrap();
        // Without listing /proc the exit is noticed, the new VM is not; a scan finds it.
        assert!(discovery.rescan_known().is_empty());
        let seen = discovery.scan();
        assert_eq!(seen.iter().map(|v| (v.pid, v.name.clone())).collect::<Vec<_>>(), [(20, "b".into())]);
        fs::remove_dir_all(root).unwrap();
        fs::remove_dir_all(other).unwrap();
    }

    #[test]
    fn a_vm_seen_before_its_vcpus_exist_gets_them_later() {
        // Between KVM_CREATE_VM and KVM_CREATE_VCPU: a VM fd, no vCPU fds, no vCPU threads.
        let root = fake_proc(&[(30, "virtprof-vm", &["virtprof-vm"], &["anon_inode:kvm-vm"], &["virtprof-vm"])]);
        let mut discovery = Discovery::new(&root, Vec::new());
        assert_eq!(discovery.scan()[0].vcpus.len(), 0);
        let later = fake_proc(&[(30, "virtprof-vm", &["virtprof-vm"], VM_FDS, &["virtprof-vm", "vcpu0", "vcpu1"])]);
        fs::remove_dir_all(root.join("30")).unwrap();
        fs::rename(later.join("30"), root.join("30")).unwrap();
        assert_eq!(discovery.scan()[0].vcpus.len(), 2, "the vCPUs are looked for again");
        fs::remove_dir_all(root).unwrap();
        fs::remove_dir_all(later).unwrap();
    }

    #[test]
    fn thread_names_map_to_indexes() {
        for (name, index) in
            [("CPU 12/KVM", Some(12)), ("fc_vcpu 3", Some(3)), ("vcpu7", Some(7)), ("crosvm_vcpu2", Some(2))]
        {
            assert_eq!(vcpu_index(name), index, "{name}");
        }
        for name in ["CPU 1/TCG", "vcpu", "vcpux", "fc_api", "qemu-system-x86", "CPU /KVM"] {
            assert_eq!(vcpu_index(name), None, "{name}");
        }
    }

    #[test]
    fn vmm_threads_have_roles() {
        let role = |tid, comm| thread_role(100, tid, comm);
        assert_eq!(role(101, "CPU 0/KVM"), ThreadRole::Vcpu);
        assert_eq!(role(101, "CPU 1/TCG"), ThreadRole::Vcpu);
        assert_eq!(emulated_vcpu_index("CPU 1/TCG"), Some(1));
        assert_eq!(emulated_vcpu_index("CPU /TCG"), None);
        assert_eq!(role(100, "qemu-system-x86"), ThreadRole::MainLoop);
        assert_eq!(role(102, "IO iothread0"), ThreadRole::IoThread);
        assert_eq!(role(102, "_net1"), ThreadRole::IoThread);
        assert_eq!(role(103, "vhost-100"), ThreadRole::Vhost);
        assert_eq!(vhost_owner("vhost-100"), Some(100));
        assert_eq!(vhost_owner("vhost-x"), None);
        assert_eq!(role(104, "worker"), ThreadRole::Worker);
        assert_eq!(role(105, "call_rcu"), ThreadRole::Other);
        assert_eq!(role(106, "fc_api"), ThreadRole::Other);
    }

    #[test]
    fn qemu_names_in_every_spelling() {
        let argv = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(vm_name(VmmKind::Qemu, &argv(&["qemu", "-name", "plain"]), 1), "plain");
        assert_eq!(vm_name(VmmKind::Qemu, &argv(&["qemu", "-name", "guest=g,debug-threads=on"]), 1), "g");
        assert_eq!(vm_name(VmmKind::Qemu, &argv(&["qemu", "-name", "debug-threads=on"]), 1), "qemu-1");
        assert_eq!(vm_name(VmmKind::Qemu, &argv(&["qemu"]), 9), "qemu-9");
    }

    #[test]
    fn a_watched_process_is_seen_to_exit_by_one_poll() {
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let mut discovery = Discovery::new("/proc", Vec::new());
        let Some(fd) = pidfd_open(child.id()) else {
            child.kill().unwrap();
            child.wait().unwrap();
            eprintln!("skipped: this kernel gives no pidfds (before Linux 5.3)");
            return;
        };
        discovery.pidfds.insert(child.id(), fd);
        assert!(discovery.exited_vms().is_empty(), "alive");
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(discovery.exited_vms(), HashSet::from([child.id()]), "exited and reaped");
    }
}
