//! KVM's own announcements of VMs. The kernel sends a uevent on the kvm device each time a
//! process creates a VM (`KVM_CREATE_VM`) and each time a VM is destroyed, naming the thread
//! that created it (`PID`: the thread's id, the process's pid only where its main thread did):
//!
//! ```text
//! change@/devices/virtual/misc/kvm  ACTION=change  DEVPATH=/devices/virtual/misc/kvm
//! SUBSYSTEM=misc  CREATED=3  COUNT=1  EVENT=create  PID=27209  STATS_PATH=/kvm/27209-4
//! ```
//!
//! Listening costs nothing until a VM comes, and hears every VM at its creation whatever else
//! starts meanwhile, where a look at /proc's newest pid cannot tell a VMM from a shell loop.
//! The announcements reach a socket in the initial user namespace's network namespaces only,
//! and a full receive buffer (a storm of other devices' uevents) drops them: callers keep
//! scanning /proc on their own schedule, which finds those VMs later.

use std::io;
use std::mem::{size_of, zeroed};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// The kernel's multicast group of uevents (udev's rebroadcast is group 2).
const KERNEL_GROUP: u32 = 1;
/// Room for one uevent: the kernel's are at most 2 KiB (`UEVENT_BUFFER_SIZE`).
const MESSAGE: usize = 4096;
/// Messages read per drain: a flood of uevents cannot hold the caller; the rest wait for the
/// next drain.
const MOST_PER_DRAIN: usize = 256;
/// Receive buffer asked for: a burst of VMs starting together fits.
const RECEIVE_BUFFER: libc::c_int = 1 << 20;

/// A listener for KVM's announcements.
#[derive(Debug)]
pub struct KvmUevents {
    socket: OwnedFd,
    message: Box<[u8; MESSAGE]>,
}

impl KvmUevents {
    /// Listen from now on; the error says why this host cannot (no netlink uevents).
    pub fn open() -> io::Result<KvmUevents> {
        // SAFETY: socket(2) with constant arguments; the result is checked before use.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_DGRAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                libc::NETLINK_KOBJECT_UEVENT,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just opened and is owned by nothing else.
        let socket = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: an all-zero sockaddr_nl is valid; the fields that matter are set below.
        let mut address: libc::sockaddr_nl = unsafe { zeroed() };
        address.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        address.nl_groups = KERNEL_GROUP;
        // SAFETY: `address` is a sockaddr_nl of the size given.
        let bound = unsafe {
            libc::bind(
                socket.as_raw_fd(),
                (&address as *const libc::sockaddr_nl).cast(),
                size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if bound < 0 {
            return Err(io::Error::last_os_error());
        }
        // Best effort: the default buffer holds a few hundred uevents, and a drop is said anyway.
        // SAFETY: the option value is a c_int of the size given.
        unsafe {
            libc::setsockopt(
                socket.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVBUF,
                (&RECEIVE_BUFFER as *const libc::c_int).cast(),
                size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
        Ok(KvmUevents { socket, message: Box::new([0; MESSAGE]) })
    }

    /// The threads (by id) that created a VM since the last drain, without waiting: the
    /// process's pid where its main thread did, as VMMs do.
    pub fn drain(&mut self) -> Vec<u32> {
        let mut created = Vec::new();
        for _ in 0..MOST_PER_DRAIN {
            // SAFETY: an all-zero sockaddr_nl is valid for the kernel to fill.
            let mut sender: libc::sockaddr_nl = unsafe { zeroed() };
            let mut sender_len = size_of::<libc::sockaddr_nl>() as libc::socklen_t;
            // SAFETY: the buffer and the address are ours, of the sizes given.
            let n = unsafe {
                libc::recvfrom(
                    self.socket.as_raw_fd(),
                    self.message.as_mut_ptr().cast(),
                    MESSAGE,
                    libc::MSG_DONTWAIT | libc::MSG_TRUNC,
                    (&mut sender as *mut libc::sockaddr_nl).cast(),
                    &mut sender_len,
                )
            };
            if n < 0 {
                match io::Error::last_os_error().raw_os_error() {
                    // ENOBUFS: the buffer overflowed and some were dropped; the socket goes on.
                    Some(libc::EINTR | libc::ENOBUFS) => continue,
                    _ => break,
                }
            }
            // Only the kernel speaks for KVM (a process may send on the group with privilege),
            // and a message longer than the buffer is no uevent of the kernel's.
            let len = n as usize;
            if sender.nl_pid != 0 || len > MESSAGE {
                continue;
            }
            created.extend(created_by(&self.message[..len]));
        }
        created
    }
}

/// Whether KVM's announcements reach this process: a VM created now must be heard within half
/// a second. The error says why not (no /dev/kvm, no uevent socket, or nothing heard: another
/// user or network namespace).
pub fn probe() -> Result<(), String> {
    let kvm = kvm_ioctls::Kvm::new().map_err(|e| format!("no /dev/kvm to try with ({e})"))?;
    let mut uevents = KvmUevents::open().map_err(|e| format!("no uevent socket ({e})"))?;
    // SAFETY: gettid has no preconditions.
    let me = unsafe { libc::gettid() } as u32;
    let vm = kvm.create_vm().map_err(|e| format!("no VM to try with ({e})"))?;
    for _ in 0..50 {
        if uevents.drain().contains(&me) {
            drop(vm);
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    Err("a VM created here was not announced within 0.5 s (a network or user namespace of its own?)".into())
}

/// The thread that created a VM, from one uevent; None for a VM's end, any other device's
/// uevent or a malformed one.
fn created_by(message: &[u8]) -> Option<u32> {
    let mut fields = message.split(|&b| b == 0);
    let header = fields.next()?;
    if !header.ends_with(b"@/devices/virtual/misc/kvm") {
        return None;
    }
    let (mut created, mut pid) = (false, None);
    for field in fields {
        if let Some(value) = field.strip_prefix(b"EVENT=") {
            created = value == b"create";
        } else if let Some(value) = field.strip_prefix(b"PID=") {
            pid = std::str::from_utf8(value).ok()?.parse::<u32>().ok();
        }
    }
    pid.filter(|&p| created && p > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(fields: &[&str]) -> Vec<u8> {
        fields.join("\0").into_bytes()
    }

    #[test]
    fn a_created_vm_is_read_with_its_creators_id_and_its_end_is_not_a_creation() {
        let created = message(&[
            "change@/devices/virtual/misc/kvm",
            "ACTION=change",
            "DEVPATH=/devices/virtual/misc/kvm",
            "SUBSYSTEM=misc",
            "CREATED=1533",
            "COUNT=1",
            "EVENT=create",
            "PID=27209",
            "STATS_PATH=/kvm/27209-4",
            "SEQNUM=5021",
        ]);
        assert_eq!(created_by(&created), Some(27209));
        let destroyed = message(&["change@/devices/virtual/misc/kvm", "EVENT=destroy", "PID=27209", "COUNT=0"]);
        assert_eq!(created_by(&destroyed), None);
    }

    #[test]
    fn other_devices_and_malformed_announcements_are_not_vms() {
        let cases: [&[&str]; 7] = [
            &["add@/devices/virtual/net/tap0", "EVENT=create", "PID=1"],
            &["change@/devices/virtual/misc/kvm", "EVENT=create"],
            &["change@/devices/virtual/misc/kvm", "EVENT=create", "PID=x1"],
            &["change@/devices/virtual/misc/kvm", "EVENT=create", "PID=0"],
            &["change@/devices/virtual/misc/kvm", "EVENT=create", "PID=99999999999"],
            &["change@/devices/virtual/misc/kvm", "EVENT=open", "PID=5"],
            &["change@/devices/virtual/misc/kvm"],
        ];
        for fields in cases {
            assert_eq!(created_by(&message(fields)), None, "{fields:?}");
        }
        assert_eq!(created_by(b""), None);
        assert_eq!(created_by(&[0xff; 64]), None);
    }

    /// A socket that sends on the kernel's uevent group, as only a privileged process may.
    struct Spoofer(OwnedFd);

    impl Spoofer {
        fn new() -> Spoofer {
            // SAFETY: socket(2) with constant arguments, checked.
            let fd = unsafe {
                libc::socket(libc::AF_NETLINK, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, libc::NETLINK_KOBJECT_UEVENT)
            };
            assert!(fd >= 0, "{}", io::Error::last_os_error());
            // SAFETY: just opened, owned here.
            Spoofer(unsafe { OwnedFd::from_raw_fd(fd) })
        }

        /// Send `message` to the kernel's group; false where this process may not.
        fn send(&self, message: &[u8]) -> bool {
            // SAFETY: all-zero is a valid sockaddr_nl.
            let mut to: libc::sockaddr_nl = unsafe { zeroed() };
            to.nl_family = libc::AF_NETLINK as libc::sa_family_t;
            to.nl_groups = KERNEL_GROUP;
            // SAFETY: the message and the address are ours, of the sizes given.
            let sent = unsafe {
                libc::sendto(
                    self.0.as_raw_fd(),
                    message.as_ptr().cast(),
                    message.len(),
                    0,
                    (&to as *const libc::sockaddr_nl).cast(),
                    size_of::<libc::sockaddr_nl>() as libc::socklen_t,
                )
            };
            sent >= 0
        }
    }

    /// Drain until `me` is heard, for at most a second; everything heard.
    fn listen_for(uevents: &mut KvmUevents, me: u32) -> Vec<u32> {
        let mut all = Vec::new();
        for _ in 0..100 {
            all.extend(uevents.drain());
            if all.contains(&me) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        all
    }

    /// A real VM is announced at its creation with the creating thread's id; a process flooding
    /// the kernel's group with look-alike announcements is not believed, and a VM created after
    /// the flood is heard.
    #[test]
    fn a_vm_is_heard_at_its_creation_and_a_flood_of_look_alikes_is_not() {
        let Ok(kvm) = kvm_ioctls::Kvm::new() else {
            eprintln!("skipped: no /dev/kvm");
            return;
        };
        let mut uevents = match KvmUevents::open() {
            Ok(u) => u,
            Err(e) => {
                eprintln!("skipped: no uevent socket here ({e})");
                return;
            }
        };
        // SAFETY: gettid has no preconditions.
        let me = unsafe { libc::gettid() } as u32;
        let vm = kvm.create_vm().expect("a VM");
        let heard = listen_for(&mut uevents, me);
        if heard.is_empty() {
            eprintln!("skipped: KVM's uevents do not reach this network namespace");
            return;
        }
        assert!(heard.contains(&me), "{heard:?}");
        drop(vm);

        let spoofer = Spoofer::new();
        let fake = message(&["change@/devices/virtual/misc/kvm", "EVENT=create", "PID=4242"]);
        const FLOOD: usize = 2000;
        let sent = (0..FLOOD).take_while(|_| spoofer.send(&fake)).count();
        if sent == 0 {
            eprintln!("the spoofer may not send here ({}): nothing to refuse", io::Error::last_os_error());
            return;
        }
        // The buffer holds part of the flood (the rest was dropped): enough drains read it all,
        // and none of it is believed.
        for _ in 0..=FLOOD / MOST_PER_DRAIN {
            assert!(!uevents.drain().contains(&4242), "a process's announcement was believed");
        }
        // After the flood, a VM is heard again.
        let vm = kvm.create_vm().expect("a VM");
        assert!(listen_for(&mut uevents, me).contains(&me), "a VM after the flood was not heard");
        drop(vm);
    }
}
