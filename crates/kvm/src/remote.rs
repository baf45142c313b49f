//! Borrow the KVM file descriptors of another process (any VMM: QEMU, Firecracker, ours) to read
//! its binary stats. `/proc/PID/fd` names them; `pidfd_open` + `pidfd_getfd` (Linux ≥ 5.6,
//! needs ptrace rights over the target) duplicate them into this process without disturbing
//! the VMM.
//!
//! The kernel answers KVM ioctls only from the process that created the VM (`kvm->mm !=
//! current->mm` gives EIO), so a borrowed `kvm-vm` / `kvm-vcpu:N` fd cannot produce a stats fd
//! here. Stats fds the VMM already opened (`kvm-vm-stats`, `kvm-vcpu-stats:N`) have no such
//! check: reading them is a plain `pread`. virtprof's own VMM keeps them open for its lifetime;
//! QEMU opens and keeps them after its first QMP `query-stats`. For a VMM holding none, we still
//! try the ioctl (a future kernel may allow it) and otherwise say why it cannot work.

use std::fs::{self, File};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

use crate::error::StatsError;
use crate::stats::StatsFd;

/// A KVM fd seen in another process's fd table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvmFdKind {
    /// `anon_inode:kvm-vm`.
    Vm,
    /// `anon_inode:kvm-vcpu:N`, with N the vCPU index.
    Vcpu(u32),
    /// `anon_inode:kvm-vm-stats`: an open VM stats fd.
    VmStats,
    /// `anon_inode:kvm-vcpu-stats:N`: an open vCPU stats fd.
    VcpuStats(u32),
}

/// One KVM fd of a process: its number there and what it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteKvmFd {
    /// The fd number inside the target process.
    pub fd: i32,
    /// VM or vCPU.
    pub kind: KvmFdKind,
}

/// Classify a `/proc/PID/fd/N` link target.
pub fn classify_fd_link(target: &str) -> Option<KvmFdKind> {
    let name = target.strip_prefix("anon_inode:")?;
    if let Some(index) = name.strip_prefix("kvm-vcpu-stats:") {
        return index.parse().ok().map(KvmFdKind::VcpuStats);
    }
    if let Some(index) = name.strip_prefix("kvm-vcpu:") {
        return index.parse().ok().map(KvmFdKind::Vcpu);
    }
    match name {
        "kvm-vm" => Some(KvmFdKind::Vm),
        "kvm-vm-stats" => Some(KvmFdKind::VmStats),
        _ => None,
    }
}

/// List the KVM fds of process `pid` by reading `<proc_root>/PID/fd`.
pub fn list_kvm_fds(proc_root: &Path, pid: u32) -> Result<Vec<RemoteKvmFd>, StatsError> {
    let dir = proc_root.join(pid.to_string()).join("fd");
    let entries = fs::read_dir(&dir).map_err(|e| StatsError::Proc { path: dir.clone(), source: e })?;
    let mut fds = Vec::new();
    for entry in entries.filter_map(Result::ok) {
        let Some(fd) = entry.file_name().to_str().and_then(|name| name.parse().ok()) else { continue };
        // The list is readable without CAP_SYS_PTRACE over the process; the links are not.
        let target = match fs::read_link(entry.path()) {
            Ok(target) => target,
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                return Err(StatsError::Proc { path: entry.path(), source: e })
            }
            Err(_) => continue, // closed meanwhile
        };
        if let Some(kind) = target.to_str().and_then(classify_fd_link) {
            fds.push(RemoteKvmFd { fd, kind });
        }
    }
    fds.sort_by_key(|f| f.fd);
    Ok(fds)
}

/// A handle on another process through which its fds can be duplicated.
#[derive(Debug)]
pub struct PidFd(OwnedFd);

impl PidFd {
    /// `pidfd_open(pid)`.
    pub fn open(pid: u32) -> Result<Self, StatsError> {
        // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
        if fd < 0 {
            return Err(StatsError::Borrow { pid, fd: None, source: std::io::Error::last_os_error() });
        }
        // SAFETY: the kernel just returned this fd to us; nobody else owns it.
        Ok(PidFd(unsafe { OwnedFd::from_raw_fd(fd as i32) }))
    }

    /// `pidfd_getfd(pidfd, target_fd)`: a duplicate of the target's fd in this process.
    pub fn get_fd(&self, pid: u32, target_fd: i32) -> Result<File, StatsError> {
        // SAFETY: pidfd_getfd takes our pidfd, a fd number in the target and flags; returns a
        // new fd in this process or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_getfd, self.0.as_raw_fd(), target_fd, 0) };
        if fd < 0 {
            return Err(StatsError::Borrow { pid, fd: Some(target_fd), source: std::io::Error::last_os_error() });
        }
        // SAFETY: a fresh duplicate that only we own.
        Ok(unsafe { File::from_raw_fd(fd as i32) })
    }
}

/// Stats fds of one VMM process: the VM's and each vCPU's.
#[derive(Debug)]
pub struct RemoteVmStats {
    /// The VMM's pid.
    pub pid: u32,
    /// VM-wide stats (None if the process holds no VM fd, e.g. it already closed it).
    pub vm: Option<StatsFd>,
    /// (vCPU index, stats fd), sorted by index.
    pub vcpus: Vec<(u32, StatsFd)>,
}

impl RemoteVmStats {
    /// Borrow the KVM fds of `pid` and open their stats: the VMM's own stats fds where it holds
    /// them, otherwise `KVM_GET_STATS_FD` on its VM/vCPU fds (refused by current kernels).
    pub fn attach(pid: u32) -> Result<Self, StatsError> {
        let fds = list_kvm_fds(Path::new("/proc"), pid)?;
        if fds.is_empty() {
            return Err(StatsError::NoKvmFds { pid });
        }
        let pidfd = PidFd::open(pid)?;
        let borrow_stats = |fd: i32| StatsFd::from_file(pidfd.get_fd(pid, fd)?);
        let via_ioctl = |fd: i32| {
            let file = pidfd.get_fd(pid, fd)?;
            StatsFd::open(file.as_raw_fd()).map_err(|e| match e {
                StatsError::Ioctl(source) if source.raw_os_error() == Some(libc::EIO) => StatsError::ForeignVm { pid },
                other => other,
            })
        };
        let mut vm = None;
        let mut vcpus: Vec<(u32, StatsFd)> = Vec::new();
        for f in fds.iter().filter(|f| matches!(f.kind, KvmFdKind::VmStats | KvmFdKind::VcpuStats(_))) {
            match f.kind {
                KvmFdKind::VmStats if vm.is_none() => vm = Some(borrow_stats(f.fd)?),
                KvmFdKind::VcpuStats(i) if !vcpus.iter().any(|(j, _)| *j == i) => vcpus.push((i, borrow_stats(f.fd)?)),
                _ => {}
            }
        }
        for f in &fds {
            match f.kind {
                KvmFdKind::Vm if vm.is_none() => vm = Some(via_ioctl(f.fd)?),
                KvmFdKind::Vcpu(i) if !vcpus.iter().any(|(j, _)| *j == i) => vcpus.push((i, via_ioctl(f.fd)?)),
                _ => {}
            }
        }
        vcpus.sort_by_key(|(i, _)| *i);
        Ok(RemoteVmStats { pid, vm, vcpus })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_kvm_fd_links() {
        assert_eq!(classify_fd_link("anon_inode:kvm-vm"), Some(KvmFdKind::Vm));
        assert_eq!(classify_fd_link("anon_inode:kvm-vcpu:12"), Some(KvmFdKind::Vcpu(12)));
        assert_eq!(classify_fd_link("anon_inode:[eventfd]"), None);
        assert_eq!(classify_fd_link("anon_inode:kvm-vcpu:x"), None);
        assert_eq!(classify_fd_link("anon_inode:kvm-vm-stats"), Some(KvmFdKind::VmStats));
        assert_eq!(classify_fd_link("anon_inode:kvm-vcpu-stats:3"), Some(KvmFdKind::VcpuStats(3)));
        assert_eq!(classify_fd_link("/dev/kvm"), None);
    }
}
