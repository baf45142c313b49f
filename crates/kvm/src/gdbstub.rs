//! A small client of the GDB remote serial protocol, enough to sample a guest's program
//! counter through QEMU's gdbstub: stop the guest (`^C`), read each vCPU's registers (`g`),
//! continue (`c`). It also reads guest memory (`m`), for finding the KASLR offset.
//!
//! Packets are `$DATA#CK` with CK the modulo-256 sum of DATA in hex; each is acknowledged with
//! `+` unless the stub accepts `QStartNoAckMode` (QEMU 7.2 does not).

use std::io::{BufReader, BufWriter, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

/// What went wrong talking to a gdbstub.
#[derive(Debug, thiserror::Error)]
pub enum GdbError {
    /// Socket trouble (including the stub going away).
    #[error("gdbstub connection: {0}")]
    Io(#[from] std::io::Error),
    /// The stub answered something this client does not understand.
    #[error("gdbstub: unexpected reply to '{request}': '{reply}'")]
    Protocol {
        /// What was sent.
        request: String,
        /// What came back (shortened).
        reply: String,
    },
    /// The guest stopped for good (QEMU exited or the guest powered off).
    #[error("the guest exited ({0})")]
    Exited(String),
}

trait Stream: Read + Write + Send {}
impl<T: Read + Write + Send> Stream for T {}

/// Longest wait for any reply: a stopped guest answers in microseconds, so this only ends a
/// conversation with a stub that will never answer.
const REPLY_TIMEOUT: Duration = Duration::from_secs(15);

/// x86-64 registers a sample needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct X86Sample {
    /// RIP (an offset in CS when the CPU is not in long mode).
    pub rip: u64,
    /// CS selector; its low two bits are the CPL in protected mode.
    pub cs: u32,
}

/// A connected gdbstub client.
pub struct GdbClient {
    reader: BufReader<Box<dyn Stream>>,
    writer: BufWriter<Box<dyn Stream>>,
    threads: Vec<String>,
    /// Whether every received packet must still be acknowledged with `+`.
    acks: bool,
    /// A stop reply arrived unasked (QEMU announces the stop it makes on attach).
    saw_stop: bool,
}

impl GdbClient {
    /// Connect to `HOST:PORT` (TCP) or a Unix socket path.
    pub fn connect(address: &str) -> Result<Self, GdbError> {
        let (a, b): (Box<dyn Stream>, Box<dyn Stream>) = if Path::new(address).is_absolute() {
            let s = UnixStream::connect(address)?;
            s.set_read_timeout(Some(REPLY_TIMEOUT))?;
            (Box::new(s.try_clone()?), Box::new(s))
        } else {
            let s = TcpStream::connect(address)?;
            s.set_nodelay(true)?;
            s.set_read_timeout(Some(REPLY_TIMEOUT))?;
            (Box::new(s.try_clone()?), Box::new(s))
        };
        let mut client = GdbClient {
            reader: BufReader::new(a),
            writer: BufWriter::new(b),
            threads: Vec::new(),
            acks: true,
            saw_stop: false,
        };
        client.handshake()?;
        Ok(client)
    }

    fn handshake(&mut self) -> Result<(), GdbError> {
        // Acknowledgement mode until the stub agrees to drop it; an empty reply means it
        // cannot, and every packet keeps its `+`.
        match self.request("QStartNoAckMode")?.as_str() {
            "OK" => self.acks = false,
            "" => {}
            other => return Err(GdbError::Protocol { request: "QStartNoAckMode".into(), reply: other.to_string() }),
        }
        self.threads = self.list_threads()?;
        Ok(())
    }

    fn list_threads(&mut self) -> Result<Vec<String>, GdbError> {
        let mut out = Vec::new();
        let mut reply = self.request("qfThreadInfo")?;
        while let Some(list) = reply.strip_prefix('m') {
            out.extend(list.split(',').map(str::to_string));
            reply = self.request("qsThreadInfo")?;
        }
        if out.is_empty() {
            out.push("1".into());
        }
        Ok(out)
    }

    /// Make sure the guest is stopped: QEMU pauses it when a debugger connects, and then
    /// ignores `^C`, so ask for the stop reason (`?`) and interrupt only if it is running.
    pub fn attach(&mut self) -> Result<(), GdbError> {
        if self.saw_stop {
            return Ok(());
        }
        self.send("?")?;
        let reply = self.receive()?;
        match reply.as_bytes().first() {
            Some(b'T' | b'S') => Ok(()),
            Some(b'W' | b'X') => Err(GdbError::Exited(reply)),
            _ => self.interrupt(),
        }
    }

    /// Stop the guest and wait for the stop reply.
    pub fn interrupt(&mut self) -> Result<(), GdbError> {
        self.writer.write_all(&[0x03])?;
        self.writer.flush()?;
        self.wait_stop()
    }

    fn wait_stop(&mut self) -> Result<(), GdbError> {
        loop {
            let reply = self.receive()?;
            match reply.as_bytes().first() {
                Some(b'T' | b'S') => return Ok(()),
                Some(b'W' | b'X') => return Err(GdbError::Exited(reply)),
                // Console output (`O...`) and anything else while waiting: skip.
                _ => continue,
            }
        }
    }

    /// Resume the guest (no reply until the next stop).
    pub fn resume(&mut self) -> Result<(), GdbError> {
        self.send("c")
    }

    /// RIP and CS of every vCPU (the guest must be stopped).
    pub fn sample_all(&mut self) -> Result<Vec<X86Sample>, GdbError> {
        let mut out = Vec::with_capacity(self.threads.len());
        for t in 0..self.threads.len() {
            if self.threads.len() > 1 {
                let select = format!("Hg{}", self.threads[t]);
                let ok = self.request(&select)?;
                if ok != "OK" {
                    return Err(GdbError::Protocol { request: select, reply: ok });
                }
            }
            let regs = self.request("g")?;
            out.push(
                parse_x86_64_registers(&regs).ok_or_else(|| GdbError::Protocol {
                    request: "g".into(),
                    reply: regs.chars().take(60).collect(),
                })?,
            );
        }
        Ok(out)
    }

    /// Read `len` bytes of guest-virtual memory (None where unmapped).
    pub fn read_memory(&mut self, addr: u64, len: usize) -> Result<Option<Vec<u8>>, GdbError> {
        let reply = self.request(&format!("m{addr:x},{len:x}"))?;
        if reply.starts_with('E') || reply.is_empty() {
            return Ok(None);
        }
        Ok(hex_bytes(&reply))
    }

    /// Send a packet that is not a stop request and return its reply; stop replies that
    /// arrive meanwhile (none of these replies starts with `T` or `S`) are noted and skipped.
    /// An exit reply (`W`, `X`: none of these replies starts so either) means the guest is gone.
    fn request(&mut self, data: &str) -> Result<String, GdbError> {
        self.send(data)?;
        loop {
            let reply = self.receive()?;
            if reply.starts_with(['T', 'S']) {
                self.saw_stop = true;
                continue;
            }
            if reply.starts_with(['W', 'X']) {
                return Err(GdbError::Exited(reply));
            }
            return Ok(reply);
        }
    }

    fn send(&mut self, data: &str) -> Result<(), GdbError> {
        let sum = data.bytes().fold(0u8, u8::wrapping_add);
        write!(self.writer, "${data}#{sum:02x}")?;
        self.writer.flush()?;
        Ok(())
    }

    /// The next byte from the stub. A signal (our stop handler's) interrupts a socket read even
    /// under SA_RESTART; that is not the stub's doing, so the read is retried.
    fn read_byte(&mut self) -> Result<u8, GdbError> {
        let mut byte = [0u8; 1];
        loop {
            match self.reader.read(&mut byte) {
                Ok(0) => return Err(GdbError::Exited("the gdbstub closed the connection".into())),
                Ok(_) => return Ok(byte[0]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }

    fn receive(&mut self) -> Result<String, GdbError> {
        // Skip acknowledgements and noise up to the packet start.
        while self.read_byte()? != b'$' {}
        let mut data = Vec::new();
        loop {
            let byte = self.read_byte()?;
            if byte == b'#' {
                break;
            }
            data.push(byte);
        }
        let mut checksum = [0u8; 2];
        self.reader.read_exact(&mut checksum)?;
        if self.acks {
            self.writer.write_all(b"+")?;
            self.writer.flush()?;
        }
        Ok(unescape(&data))
    }
}

/// Binary packet data: `}` escapes the next byte (xor 0x20); `*` run-length encoding expands.
fn unescape(data: &[u8]) -> String {
    let mut out = Vec::with_capacity(data.len());
    let mut i = 0;
    while i < data.len() {
        match data[i] {
            b'}' if i + 1 < data.len() => {
                out.push(data[i + 1] ^ 0x20);
                i += 2;
            }
            b'*' if i + 1 < data.len() && !out.is_empty() => {
                let repeat = usize::from(data[i + 1].saturating_sub(29));
                let last = *out.last().expect("checked non-empty");
                out.extend(std::iter::repeat_n(last, repeat));
                i += 2;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn hex_bytes(hex: &str) -> Option<Vec<u8>> {
    if hex.len() % 2 != 0 {
        return None;
    }
    (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok()).collect()
}

/// QEMU's x86-64 `g` reply: 16 general registers and RIP (8 bytes each, little-endian), then
/// EFLAGS, CS, SS, ... (4 bytes each).
fn parse_x86_64_registers(hex: &str) -> Option<X86Sample> {
    let bytes = hex_bytes(hex.get(..(17 * 8 + 8) * 2)?)?;
    let rip = u64::from_le_bytes(bytes[16 * 8..17 * 8].try_into().ok()?);
    let cs = u32::from_le_bytes(bytes[17 * 8 + 4..17 * 8 + 8].try_into().ok()?);
    Some(X86Sample { rip, cs })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packets_unescape_and_expand() {
        assert_eq!(unescape(b"a}\x03b"), "a#b");
        // "0* " is '0' repeated 3 more times (' ' = 32, 32 - 29 = 3).
        assert_eq!(unescape(b"0* "), "0000");
    }

    #[test]
    fn x86_64_registers_give_rip_and_cs() {
        let mut regs = "00".repeat(16 * 8);
        regs += "efbeadde00000000"; // rip = 0xdeadbeef
        regs += "46020000"; // eflags
        regs += "33000000"; // cs = 0x33 (CPL3)
        regs += &"00".repeat(200);
        assert_eq!(parse_x86_64_registers(&regs), Some(X86Sample { rip: 0xdead_beef, cs: 0x33 }));
        assert_eq!(parse_x86_64_registers("00"), None);
    }
}
