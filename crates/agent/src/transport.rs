//! Where agent and host meet: AF_VSOCK (the VMM's vhost-vsock), a virtio-serial port (QEMU
//! `-chardev socket` on the host, `/dev/virtio-ports/NAME` in the guest), or TCP, only when
//! asked and then with a token. The host always connects; the agent listens (or, on a serial
//! port, keeps the port open and answers whoever speaks).

use std::fmt;
use std::fs::File;
use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The port the agent listens on when none is given (vsock and TCP).
pub const DEFAULT_PORT: u32 = 9478;

/// An agent's address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Address {
    /// `vsock:CID:PORT`; the agent listens on `vsock:PORT` (any CID).
    Vsock {
        /// The guest's context id (host side); `u32::MAX` (VMADDR_CID_ANY) when listening.
        cid: u32,
        /// Port.
        port: u32,
    },
    /// `serial:PATH`: on the host, QEMU's chardev socket; in the guest, the port's device (a
    /// bare name means `/dev/virtio-ports/NAME`).
    Serial(PathBuf),
    /// `tcp:HOST:PORT`.
    Tcp(String),
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Address::Vsock { cid, port } if *cid == libc::VMADDR_CID_ANY => write!(f, "vsock:{port}"),
            Address::Vsock { cid, port } => write!(f, "vsock:{cid}:{port}"),
            Address::Serial(p) => write!(f, "serial:{}", p.display()),
            Address::Tcp(a) => write!(f, "tcp:{a}"),
        }
    }
}

impl std::str::FromStr for Address {
    type Err = String;

    fn from_str(s: &str) -> Result<Address, String> {
        let number = |what: &str, v: &str| v.parse::<u32>().map_err(|_| format!("'{s}': {what} '{v}' is not a number"));
        let (scheme, rest) = s.split_once(':').ok_or_else(|| {
            format!("'{s}': give vsock:CID:PORT, serial:PATH or tcp:HOST:PORT (e.g. vsock:3:{DEFAULT_PORT})")
        })?;
        match scheme {
            "vsock" => match rest.split_once(':') {
                Some((cid, port)) => Ok(Address::Vsock { cid: number("CID", cid)?, port: number("port", port)? }),
                None => Ok(Address::Vsock { cid: libc::VMADDR_CID_ANY, port: number("port", rest)? }),
            },
            "serial" if rest.is_empty() => Err(format!("'{s}': serial needs a path or a port name")),
            "serial" if !rest.contains('/') => Ok(Address::Serial(PathBuf::from("/dev/virtio-ports").join(rest))),
            "serial" => Ok(Address::Serial(PathBuf::from(rest))),
            "tcp" if rest.rsplit_once(':').is_some_and(|(_, p)| p.parse::<u16>().is_ok()) => {
                Ok(Address::Tcp(rest.into()))
            }
            "tcp" => Err(format!("'{s}': tcp needs HOST:PORT")),
            _ => Err(format!("'{s}': unknown transport '{scheme}' (vsock, serial or tcp)")),
        }
    }
}

/// A connected byte stream.
pub enum Stream {
    /// TCP.
    Tcp(TcpStream),
    /// A QEMU chardev socket (host side of a serial port).
    Unix(UnixStream),
    /// AF_VSOCK.
    Vsock(File),
    /// The guest's serial port device.
    Port(File),
}

impl Stream {
    /// Made non-blocking: a write must never wait past its timeout for a stalled peer (a
    /// blocking socket's `send` waits until all of it is queued).
    fn nonblocking(self) -> io::Result<Stream> {
        let fd = self.fd();
        // SAFETY: fcntl on an fd this stream owns.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        // SAFETY: as above.
        if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(self)
    }

    /// Read what is there: `Ok(None)` when nothing is (yet), `Ok(Some(0))` at the peer's end.
    pub fn read_some(&mut self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        match self.read(buf) {
            Ok(n) => Ok(Some(n)),
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn fd(&self) -> RawFd {
        match self {
            Stream::Tcp(s) => s.as_raw_fd(),
            Stream::Unix(s) => s.as_raw_fd(),
            Stream::Vsock(f) | Stream::Port(f) => f.as_raw_fd(),
        }
    }

    /// Wait until there is something to read (or the peer hung up), at most `timeout`.
    pub fn readable(&self, timeout: Duration) -> io::Result<bool> {
        // Hang-up and error count as readable: the read that follows says which.
        Ok(poll(self.fd(), libc::POLLIN, timeout)? != 0)
    }

    /// Write all of `bytes`, giving up after `timeout` without progress (a stalled peer) or
    /// at once when the peer has hung up.
    pub fn write_all_within(&mut self, mut bytes: &[u8], timeout: Duration) -> io::Result<()> {
        let mut deadline = Instant::now() + timeout;
        while !bytes.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "the peer stopped reading"));
            }
            let ready = poll(self.fd(), libc::POLLOUT, left)?;
            if ready & libc::POLLOUT == 0 {
                // A virtio-serial port whose host left polls as hung up, never writable, and
                // its writes say EAGAIN: waiting on would spin until the deadline for nothing.
                if ready & (libc::POLLHUP | libc::POLLERR) != 0 {
                    return Err(io::Error::new(io::ErrorKind::BrokenPipe, "the peer hung up"));
                }
                continue;
            }
            match self.write(bytes) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    bytes = &bytes[n..];
                    deadline = Instant::now() + timeout;
                }
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
            Stream::Vsock(f) | Stream::Port(f) => f.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
            Stream::Vsock(f) | Stream::Port(f) => f.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// poll(2) one fd for `events`: the events it reported (hang-up and error included), 0 when
/// the time ran out or a signal came.
fn poll(fd: RawFd, events: libc::c_short, timeout: Duration) -> io::Result<libc::c_short> {
    let mut p = libc::pollfd { fd, events, revents: 0 };
    // Rounded up: a deadline less than a millisecond away is waited for, not spun on.
    let ms = libc::c_int::try_from(timeout.as_nanos().div_ceil(1_000_000)).unwrap_or(libc::c_int::MAX);
    // SAFETY: one valid pollfd, for the length given.
    match unsafe { libc::poll(&mut p, 1, ms) } {
        -1 if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted => Ok(0),
        -1 => Err(io::Error::last_os_error()),
        _ => Ok(p.revents),
    }
}

/// sockaddr_vm's size (16 bytes).
#[allow(clippy::cast_possible_truncation)] // 16 bytes
const VSOCK_ADDR_LEN: libc::socklen_t = std::mem::size_of::<libc::sockaddr_vm>() as libc::socklen_t;

fn vsock_addr(cid: u32, port: u32) -> libc::sockaddr_vm {
    // SAFETY: sockaddr_vm is plain old data; all zeroes is a valid value.
    let mut a: libc::sockaddr_vm = unsafe { std::mem::zeroed() };
    a.svm_family = libc::sa_family_t::try_from(libc::AF_VSOCK).expect("AF_VSOCK fits sa_family_t");
    a.svm_cid = cid;
    a.svm_port = port;
    a
}

fn vsock_socket() -> io::Result<OwnedFd> {
    // SAFETY: socket(2) with constant arguments; the fd returned is ours alone.
    let fd = unsafe { libc::socket(libc::AF_VSOCK, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh fd owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

impl Address {
    /// Connect (the host's side), giving up after `timeout` where the transport allows.
    pub fn connect(&self, timeout: Duration) -> io::Result<Stream> {
        match self {
            Address::Tcp(a) => {
                let addr = a
                    .to_socket_addrs()?
                    .next()
                    .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("{a}: no address")))?;
                let s = TcpStream::connect_timeout(&addr, timeout)?;
                s.set_nodelay(true)?;
                Stream::Tcp(s).nonblocking()
            }
            Address::Serial(path) => Stream::Unix(UnixStream::connect(path)?).nonblocking(),
            Address::Vsock { cid, port } => {
                let fd = vsock_socket()?;
                let a = vsock_addr(*cid, *port);
                let len = VSOCK_ADDR_LEN;
                // SAFETY: a valid sockaddr_vm of the given length, on our own socket.
                if unsafe { libc::connect(fd.as_raw_fd(), (&raw const a).cast(), len) } != 0 {
                    return Err(io::Error::last_os_error());
                }
                Stream::Vsock(File::from(fd)).nonblocking()
            }
        }
    }

    /// Start listening (the agent's side).
    pub fn listen(&self) -> io::Result<Listener> {
        match self {
            Address::Tcp(a) => Ok(Listener::Tcp(TcpListener::bind(a.as_str())?)),
            Address::Serial(path) => Ok(Listener::Port(path.clone())),
            Address::Vsock { cid, port } => {
                let fd = vsock_socket()?;
                let a = vsock_addr(*cid, *port);
                let len = VSOCK_ADDR_LEN;
                // SAFETY: a valid sockaddr_vm of the given length, on our own socket.
                if unsafe { libc::bind(fd.as_raw_fd(), (&raw const a).cast(), len) } != 0 {
                    return Err(io::Error::last_os_error());
                }
                // SAFETY: listen on our own bound socket.
                if unsafe { libc::listen(fd.as_raw_fd(), 4) } != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(Listener::Vsock(fd))
            }
        }
    }
}

/// Where the agent waits for a host.
pub enum Listener {
    /// TCP.
    Tcp(TcpListener),
    /// AF_VSOCK.
    Vsock(OwnedFd),
    /// A serial port: "accepting" opens the device.
    Port(PathBuf),
}

impl Listener {
    /// The next host, or None after `timeout` (so the caller can look at the stop flag).
    pub fn accept(&self, timeout: Duration) -> io::Result<Option<Stream>> {
        match self {
            Listener::Tcp(l) => {
                if poll(l.as_raw_fd(), libc::POLLIN, timeout)? == 0 {
                    return Ok(None);
                }
                let (s, _) = l.accept()?;
                s.set_nodelay(true)?;
                Stream::Tcp(s).nonblocking().map(Some)
            }
            Listener::Vsock(fd) => {
                if poll(fd.as_raw_fd(), libc::POLLIN, timeout)? == 0 {
                    return Ok(None);
                }
                // SAFETY: accept on our own listening socket; no address wanted.
                let conn = unsafe {
                    libc::accept4(fd.as_raw_fd(), std::ptr::null_mut(), std::ptr::null_mut(), libc::SOCK_CLOEXEC)
                };
                if conn < 0 {
                    return Err(io::Error::last_os_error());
                }
                // SAFETY: a fresh fd from accept4, owned by nobody else.
                Stream::Vsock(File::from(unsafe { OwnedFd::from_raw_fd(conn) })).nonblocking().map(Some)
            }
            Listener::Port(path) => {
                let f = std::fs::OpenOptions::new().read(true).write(true).open(port_device(path))?;
                Stream::Port(f).nonblocking().map(Some)
            }
        }
    }
}

/// The device of a virtio-serial port. `/dev/virtio-ports/NAME` is a symlink udev makes; a
/// guest without udev (a minimal initramfs) has only `/dev/vportNpM`, named in sysfs.
fn port_device(path: &Path) -> PathBuf {
    let Some(name) = path.strip_prefix("/dev/virtio-ports").ok().filter(|_| !path.exists()) else {
        return path.to_path_buf();
    };
    let found = std::fs::read_dir("/sys/class/virtio-ports")
        .into_iter()
        .flatten()
        .flatten()
        .find(|e| std::fs::read_to_string(e.path().join("name")).is_ok_and(|n| Path::new(n.trim()) == name));
    found.map_or_else(|| path.to_path_buf(), |e| Path::new("/dev").join(e.file_name()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A peer that never reads holds a write for the timeout and no longer; one that left
    /// ends it at once.
    #[test]
    fn writes_give_up_on_a_stalled_peer_after_the_timeout_and_at_once_on_a_gone_one() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let mut stream = Stream::Unix(ours).nonblocking().unwrap();
        let lots = vec![0u8; 16 << 20];
        let started = Instant::now();
        let e = stream.write_all_within(&lots, Duration::from_millis(200)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut, "{e}");
        assert!(started.elapsed() >= Duration::from_millis(200));
        drop(theirs);
        let e = stream.write_all_within(&lots, Duration::from_secs(3600)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::BrokenPipe, "{e}");
        assert!(stream.readable(Duration::from_secs(3600)).unwrap(), "a hang-up reads as readable");
    }

    #[test]
    fn addresses_parse_print_and_say_what_is_wrong() {
        let a: Address = "vsock:3:9478".parse().unwrap();
        assert_eq!(a, Address::Vsock { cid: 3, port: 9478 });
        assert_eq!(a.to_string(), "vsock:3:9478");
        assert_eq!("vsock:9478".parse::<Address>().unwrap().to_string(), "vsock:9478");
        assert_eq!("serial:virtprof".parse::<Address>().unwrap(), Address::Serial("/dev/virtio-ports/virtprof".into()));
        assert_eq!("serial:/tmp/p.sock".parse::<Address>().unwrap(), Address::Serial("/tmp/p.sock".into()));
        assert_eq!("tcp:127.0.0.1:9478".parse::<Address>().unwrap(), Address::Tcp("127.0.0.1:9478".into()));
        for (bad, says) in [
            ("9478", "give vsock"),
            ("vsock:x:1", "CID 'x'"),
            ("tcp:host", "HOST:PORT"),
            ("udp:1", "unknown transport"),
        ] {
            let e = bad.parse::<Address>().unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn tcp_connects_to_a_listener_and_a_stalled_peer_times_out_instead_of_blocking() {
        let l = Address::Tcp("127.0.0.1:0".into()).listen().unwrap();
        let Listener::Tcp(tcp) = &l else { unreachable!() };
        let port = tcp.local_addr().unwrap().port();
        let mut host = Address::Tcp(format!("127.0.0.1:{port}")).connect(Duration::from_secs(2)).unwrap();
        let _agent = l.accept(Duration::from_secs(2)).unwrap().expect("a connection");
        // The agent never reads: the host's writes fill the socket buffers, then time out.
        let chunk = vec![0u8; 1 << 20];
        let mut err = None;
        for _ in 0..64 {
            if let Err(e) = host.write_all_within(&chunk, Duration::from_millis(100)) {
                err = Some(e);
                break;
            }
        }
        assert_eq!(err.map(|e| e.kind()), Some(io::ErrorKind::TimedOut));
    }

    #[test]
    fn a_vsock_listener_binds_and_waits_and_an_unreachable_cid_is_an_error_not_a_hang() {
        let address = Address::Vsock { cid: libc::VMADDR_CID_ANY, port: 9599 };
        let listener = match address.listen() {
            Ok(l) => l,
            // No AF_VSOCK on this machine: nothing to check.
            Err(e) if e.raw_os_error() == Some(libc::EAFNOSUPPORT) => return,
            Err(e) => panic!("vsock listen: {e}"),
        };
        assert!(listener.accept(Duration::from_millis(50)).unwrap().is_none());
        // CID 1 is the local loopback, which needs vsock_loopback; either way a connect to a
        // port nobody serves ends in an error within the kernel's connect timeout.
        let started = std::time::Instant::now();
        assert!(Address::Vsock { cid: 1, port: 9598 }.connect(Duration::from_secs(1)).is_err());
        assert!(started.elapsed() < Duration::from_secs(30));
    }
}
