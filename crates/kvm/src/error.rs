//! Errors of the KVM layer: one enum per area, each message naming the object and the fix.

use std::path::PathBuf;

/// Errors reading KVM binary statistics, ours or another process's.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StatsError {
    /// `KVM_GET_STATS_FD` failed (kernel older than 5.14, or not a KVM fd).
    #[error("KVM_GET_STATS_FD failed: {0} (needs Linux 5.14 or newer)")]
    Ioctl(#[source] std::io::Error),
    /// Reading the stats fd failed.
    #[error("reading KVM stats failed: {0}")]
    Read(#[source] std::io::Error),
    /// The stats header made no sense.
    #[error("malformed KVM stats header: {0}")]
    Malformed(String),
    /// Reading /proc failed.
    #[error("cannot read '{}': {source}", path.display())]
    Proc {
        /// The path that failed.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// pidfd_open or pidfd_getfd failed.
    #[error("cannot borrow {} of process {pid}: {source} (needs root or ptrace rights over it, and Linux 5.6+)", fd.map_or("a pidfd".to_string(), |fd| format!("fd {fd}")))]
    Borrow {
        /// The target process.
        pid: u32,
        /// The fd number in the target, if that was the step that failed.
        fd: Option<i32>,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The kernel refuses KVM ioctls from a process other than the VM's creator.
    #[error("process {pid} holds no open KVM stats fds, and the kernel answers KVM_GET_STATS_FD only to the VM's own process; for QEMU, run one QMP `query-stats` (QEMU then keeps its stats fds open); virtprof testvm VMs always hold theirs")]
    ForeignVm {
        /// The VMM process.
        pid: u32,
    },
    /// The process holds no `kvm-vm` / `kvm-vcpu` fds.
    #[error("process {pid} holds no KVM VM or vCPU file descriptors; is it a VMM?")]
    NoKvmFds {
        /// The process.
        pid: u32,
    },
}

/// Errors setting up or running a micro-VM.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VmmError {
    /// /dev/kvm could not be opened.
    #[error("cannot open /dev/kvm: {0} (load kvm_intel, kvm_amd or kvm_pvm, and run as root or in group 'kvm')")]
    OpenKvm(#[source] kvm_ioctls::Error),
    /// A KVM ioctl failed.
    #[error("{what} failed: {source}")]
    Kvm {
        /// Which operation.
        what: &'static str,
        /// The error from the kernel.
        #[source]
        source: kvm_ioctls::Error,
    },
    /// Guest memory could not be set up.
    #[error("guest memory: {0}")]
    Memory(String),
    /// The guest program could not be assembled.
    #[error("assembling the guest program: {0}")]
    Assemble(String),
    /// The guest faulted or stopped unexpectedly.
    #[error("vcpu{vcpu}: {message}")]
    Guest {
        /// vCPU index.
        vcpu: u32,
        /// What happened, with exit reason and RIP.
        message: String,
    },
    /// Pinning, naming or other OS-level setup failed.
    #[error("{what}: {source}")]
    Os {
        /// What we tried.
        what: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Statistics could not be read.
    #[error(transparent)]
    Stats(#[from] StatsError),
    /// This architecture cannot run the micro-VM (yet).
    #[error("not on this architecture: {0}")]
    Unsupported(String),
    /// A stop was asked for before VM `index` could report (it was ended before it ran).
    #[error("stopped before VM {index} had run: no ground truth to report")]
    Stopped {
        /// VM index.
        index: u32,
    },
    /// A VMM child process failed.
    #[error("VM {index} (pid {pid}): {message}")]
    Child {
        /// VM index.
        index: u32,
        /// Its pid.
        pid: u32,
        /// What it said.
        message: String,
    },
}
