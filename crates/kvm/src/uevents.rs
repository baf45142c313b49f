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
//! and a full receive buffer drops them: callers keep scanning /proc, less often, and scan at
//! once when [`Heard::missed`] says some were lost.

use std::io;
use std::mem::{size_of, zeroed};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// The kernel's multicast group of uevents (udev's rebroadcast is group 2).
const KERNEL_GROUP: u32 = 1;
/// Room for one uevent: the kernel's are at most 2 KiB (`UEVENT_BUFFER_SIZE`).
const MESSAGE: usize = 4096;
/// Messages read per drain: a flood of other devices' uevents cannot hold the caller; past it,
/// the rest counts as missed and the caller scans.
const MOST_PER_DRAIN: usize = 256;
/// Receive buffer asked for: a burst of VMs starting together fits.
const RECEIVE_BUFFER: libc::c_int = 1 << 20;

/// A listener for KVM's announcements.
#[derive(Debug)]
pub struct KvmUevents {
    socket: OwnedFd,
    message: Box<[u8; MESSAGE]>,
}

/// What was heard since the last drain.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Heard {
    /// The threads (by id) that created a VM.
    pub created: Vec<u32>,
    /// The threads (by id) that created a VM destroyed since; the thread may have ended.
    pub destroyed: Vec<u32>,
    /// Some announcements may have been lost (the receive buffer overflowed, or too many
    /// uevents came at once): what was heard is not all there was.
    pub missed: bool,
}

impl Heard {
    /// Whether a look for new VMs is due: one was created, or announcements were lost.
    pub fn news(&self) -> bool {
        !self.created.is_empty() || self.missed
    }
}

/// One KVM announcement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Announcement {
    Created(u32),
    Destroyed(u32),
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

    /// Everything announced since the last drain, without waiting.
    pub fn drain(&mut self) -> Heard {
        let mut heard = Heard::default();
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
                    Some(libc::EAGAIN) => return heard,
                    Some(libc::EINTR) => continue,
                    // ENOBUFS: the buffer overflowed, messages were dropped; the socket goes on.
                    Some(libc::ENOBUFS) => heard.missed = true,
                    _ => {
                        heard.missed = true;
                        return heard;
                    }
                }
                continue;
            }
            // Only the kernel speaks for KVM (a process may send on the group with privilege),
            // and a message longer than the buffer is no uevent of the kernel's.
            let len = n as usize;
            if sender.nl_pid != 0 || len > MESSAGE {
                continue;
            }
            match parse(&self.message[..len]) {
                Some(Announcement::Created(pid)) => heard.created.push(pid),
                Some(Announcement::Destroyed(pid)) => heard.destroyed.push(pid),
                None => {}
            }
        }
        // More may be waiting: the caller looks for itself.
        heard.missed = true;
        heard
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
        if uevents.drain().created.contains(&me) {
            drop(vm);
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    Err("a VM created here was not announced within 0.5 s (a network or user namespace of its own?)".into())
}

/// A KVM announcement from one uevent, or None for any other device's or a malformed one.
fn parse(message: &[u8]) -> Option<Announcement> {
    let mut fields = message.split(|&b| b == 0);
    let header = fields.next()?;
    if !header.ends_with(b"@/devices/virtual/misc/kvm") {
        return None;
    }
    let (mut event, mut pid) = (None, None);
    for field in fields {
        if let Some(value) = field.strip_prefix(b"EVENT=") {
            event = Some(value);
        } else if let Some(value) = field.strip_prefix(b"PID=") {
            pid = std::str::from_utf8(value).ok()?.parse::<u32>().ok();
        }
    }
    let pid = pid.filter(|&p| p > 0)?;
    match event? {
        b"create" => Some(Announcement::Created(pid)),
        b"destroy" => Some(Announcement::Destroyed(pid)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(fields: &[&str]) -> Vec<u8> {
        fields.join("\0").into_bytes()
    }

    #[test]
    fn a_created_and_a_destroyed_vm_are_read_with_their_pid() {
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
        assert_eq!(parse(&created), Some(Announcement::Created(27209)));
        let destroyed = message(&["change@/devices/virtual/misc/kvm", "EVENT=destroy", "PID=27209", "COUNT=0"]);
        assert_eq!(parse(&destroyed), Some(Announcement::Destroyed(27209)));
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
            assert_eq!(parse(&message(fields)), None, "{fields:?}");
        }
        assert_eq!(parse(b""), None);
        assert_eq!(parse(&[0xff; 64]), None);
    }

    #[test]
    fn news_is_a_created_vm_or_a_loss() {
        assert!(!Heard::default().news());
        assert!(!Heard { destroyed: vec![3], ..Heard::default() }.news());
        assert!(Heard { created: vec![3], ..Heard::default() }.news());
        assert!(Heard { missed: true, ..Heard::default() }.news());
    }

    /// Drain until `done` says what was heard is enough, for at most a second.
    fn listen_until(uevents: &mut KvmUevents, done: impl Fn(&Heard) -> bool) -> Heard {
        let mut all = Heard::default();
        for _ in 0..100 {
            let heard = uevents.drain();
            all.created.extend(heard.created);
            all.destroyed.extend(heard.destroyed);
            all.missed |= heard.missed;
            if done(&all) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        all
    }

    /// A real VM is announced at its creation and its end, with the creating thread's id; a process
    /// sending a look-alike announcement on the kernel's group is not believed.
    #[test]
    fn a_vm_is_heard_at_its_creation_and_its_end_and_a_spoofer_is_not() {
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
        let heard = listen_until(&mut uevents, |h| h.created.contains(&me));
        if heard.created.is_empty() {
            eprintln!("skipped: KVM's uevents do not reach this network namespace");
            return;
        }
        assert!(heard.created.contains(&me), "{heard:?}");
        drop(vm);
        let heard = listen_until(&mut uevents, |h| h.destroyed.contains(&me));
        assert!(heard.destroyed.contains(&me), "{heard:?}");

        // SAFETY: socket(2) with constant arguments, checked.
        let fd = unsafe {
            libc::socket(libc::AF_NETLINK, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, libc::NETLINK_KOBJECT_UEVENT)
        };
        assert!(fd >= 0);
        // SAFETY: just opened, owned here.
        let spoofer = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: all-zero is a valid sockaddr_nl.
        let mut to: libc::sockaddr_nl = unsafe { zeroed() };
        to.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        to.nl_groups = KERNEL_GROUP;
        let fake = message(&["change@/devices/virtual/misc/kvm", "EVENT=create", "PID=4242"]);
        // SAFETY: the message and the address are ours, of the sizes given.
        let sent = unsafe {
            libc::sendto(
                spoofer.as_raw_fd(),
                fake.as_ptr().cast(),
                fake.len(),
                0,
                (&to as *const libc::sockaddr_nl).cast(),
                size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if sent < 0 {
            eprintln!("the spoofer may not send here ({}): nothing to refuse", io::Error::last_os_error());
            return;
        }
        let heard = listen_until(&mut uevents, |_| false);
        assert!(!heard.created.contains(&4242), "a process's announcement was believed: {heard:?}");
    }
}
