//! The recording container (`.vprec`), documented in `docs/format.md`.
//!
//! A file is the 8-byte magic `VPROFREC`, a u32 version, then chunks. Each chunk is framed as
//! `kind: u32, length: u64, crc32: u32, payload[length]` (little endian), so a reader can stop
//! cleanly at the last whole chunk of a file cut short by SIGKILL or a full disk. Chunks:
//! one [`Metadata`] (JSON) first, any number of per-CPU page batches, and a [`Footer`] (JSON)
//! with the loss figures last. The container knows bytes and strings only; parsing formats and
//! pages is the trace crate's job.

use std::io::{self, Write};

use serde::{Deserialize, Serialize};
use virtprof_model::vmm::VmOwner;
use virtprof_model::KernelLoss;

/// File magic.
pub const MAGIC: &[u8; 8] = b"VPROFREC";
/// Container version.
pub const VERSION: u32 = 1;
const CHUNK_HEADER: usize = 16;
/// Refuse chunks larger than this (a corrupt length must not make us allocate gigabytes).
const MAX_CHUNK: u64 = 1 << 30;

/// Chunk kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum ChunkKind {
    /// [`Metadata`] as JSON.
    Metadata = 1,
    /// `cpu: u32` then whole raw pages.
    Pages = 2,
    /// [`Footer`] as JSON.
    Footer = 3,
    /// [`IntervalSchema`] as JSON: the series of the interval rows that follow.
    IntervalSchema = 4,
    /// Interval rows: `series: u32`, then rows of `index, start_ns, end_ns: u64` and one f64
    /// per series of the latest schema.
    Intervals = 5,
    /// [`AgentRecord`] as JSON: a guest agent connected, changed its series, measured a clock
    /// point, left a gap, or sent a period of noise samples.
    Agent = 6,
    /// One guest row: `agent: u32`, `values: u32`, `start_ns, end_ns: u64` (guest clock), then
    /// `values` f64 in the order of that agent's latest series.
    AgentRow = 7,
    /// [`TasksFound`] as JSON: threads and VMs a scan found while recording.
    Tasks = 8,
    /// One period of a guest agent's noise loop: `agent, cpu: u32`, `start_ns, end_ns,
    /// threshold_ns, iterations, dropped: u64` (guest clock), then `(start, length): u64` per
    /// sample. (Older recordings hold these as an [`AgentRecord::Noise`].)
    AgentNoise = 9,
    /// [`GuestMachine`] as JSON: the guest of a host trace (trace-cmd's host and guest files
    /// imported as one recording), whose pages follow as [`ChunkKind::GuestPages`].
    GuestMachine = 10,
    /// `cpu: u32` then whole raw pages of the guest's CPU `cpu`, in the guest's formats.
    GuestPages = 11,
}

/// Bytes of an [`ChunkKind::AgentNoise`] payload before its samples.
const NOISE_HEAD: usize = 48;

/// What a guest's record costs in a recording, chunk header included: what `--agent-max-mib`
/// counts.
pub fn agent_record_size(record: &AgentRecord) -> u64 {
    let json = serde_json::to_vec(record).map_or(0, |j| j.len());
    (CHUNK_HEADER + json) as u64
}

/// What a guest row of `values` values costs in a recording.
pub fn agent_row_size(values: usize) -> u64 {
    (CHUNK_HEADER + 24 + 8 * values) as u64
}

/// What a noise period of `samples` samples costs in a recording.
pub fn agent_noise_size(samples: usize) -> u64 {
    (CHUNK_HEADER + NOISE_HEAD + 16 * samples) as u64
}

/// A noise period from its chunk's payload (checked whole when the chunk was read).
pub fn decode_noise(payload: &[u8]) -> virtprof_model::guest::NoiseBatch {
    let word = |i: usize| payload.get(i..i + 8).map_or(0, |b| u64::from_le_bytes(b.try_into().expect("8")));
    let samples = payload.get(NOISE_HEAD..).unwrap_or_default();
    virtprof_model::guest::NoiseBatch {
        cpu: payload.get(4..8).map_or(0, |b| u32::from_le_bytes(b.try_into().expect("4"))),
        start_ns: word(8),
        end_ns: word(16),
        threshold_ns: word(24),
        iterations: word(32),
        dropped: word(40),
        samples: samples
            .chunks_exact(16)
            .map(|s| {
                let start = u64::from_le_bytes(s[0..8].try_into().expect("8"));
                (start, u64::from_le_bytes(s[8..16].try_into().expect("8")))
            })
            .collect(),
    }
}

/// Threads (new, or renamed) and VMs that a scan found during the recording, written as
/// found: a recording cut short before its footer still says whose threads its events are.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TasksFound {
    /// Threads, each replacing any earlier entry of its tid.
    #[serde(default)]
    pub tasks: Vec<Task>,
    /// VMs.
    #[serde(default)]
    pub vm_identities: Vec<VmIdentity>,
}

/// What a guest agent's link recorded (`record --agent`), in order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "record", rename_all = "snake_case")]
pub enum AgentRecord {
    /// The agent answered: its guest and the series of the rows that follow.
    Connected {
        /// Agent number in this recording (the order of `--agent`).
        agent: u32,
        /// Its address.
        address: String,
        /// The guest.
        guest: virtprof_model::guest::GuestInfo,
        /// Columns.
        series: Vec<virtprof_model::guest::GuestSeries>,
    },
    /// The rows from here on carry these series.
    Schema {
        /// Agent number.
        agent: u32,
        /// Columns.
        series: Vec<virtprof_model::guest::GuestSeries>,
    },
    /// A measured point of the guest's clock against the recording's.
    Clock {
        /// Agent number.
        agent: u32,
        /// The point.
        point: virtprof_model::guest::ClockPoint,
    },
    /// No rows from the guest between these host (trace clock) times.
    Gap {
        /// Agent number.
        agent: u32,
        /// Last heard.
        from_ns: u64,
        /// Heard again, or the end.
        to_ns: u64,
        /// Why.
        cause: String,
    },
    /// One period of the agent's noise loop on one guest CPU (guest clock).
    Noise {
        /// Agent number.
        agent: u32,
        /// The period.
        batch: virtprof_model::guest::NoiseBatch,
    },
}

/// A guest agent's link figures at the end of the recording.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct AgentFooter {
    /// Agent number.
    pub agent: u32,
    /// Its address.
    pub address: String,
    /// Sessions (connections that got a welcome).
    pub sessions: u64,
    /// Rows received.
    pub rows: u64,
    /// Noise periods received (`agent --noise`).
    #[serde(default)]
    pub noise_batches: u64,
    /// Gaps.
    pub gaps: u64,
    /// Garbage bytes skipped.
    pub garbage_bytes: u64,
    /// Malformed frames refused.
    pub bad_frames: u64,
    /// Clock exchanges checked against the final alignment.
    pub exchanges_checked: u64,
    /// Of those, exchanges outside their window by more than the bound.
    pub exchanges_outside: u64,
    /// The most any was outside, ns.
    pub worst_excess_ns: u64,
    /// The agent refused the link (a wrong token), if it did.
    #[serde(default)]
    pub refused: Option<String>,
    /// Welcomes the host refused (the guest's series over its limits), and why.
    #[serde(default)]
    pub rejected: Option<(u64, String)>,
    /// Bytes of rows, noise and schemas taken from the guest.
    #[serde(default)]
    pub bytes: u64,
    /// Rows dropped over the guest's rate or the byte cap (recorded as gaps).
    #[serde(default)]
    pub dropped_rows: u64,
    /// Noise periods dropped over their rate or the byte cap.
    #[serde(default)]
    pub dropped_noise: u64,
    /// Clock points dropped over their rate or count.
    #[serde(default)]
    pub dropped_points: u64,
    /// Schemas dropped (over the limits on series, their rate or the byte cap).
    #[serde(default)]
    pub dropped_schemas: u64,
    /// The guest's data reached the host's byte cap: nothing more was taken.
    #[serde(default)]
    pub capped: bool,
}

/// The series that the interval rows after it carry, in column order. A new schema chunk is
/// written whenever the set changes (a VM starts or stops); rows always use the latest one.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct IntervalSchema {
    /// Interval width in ns.
    pub interval_ns: u64,
    /// Columns.
    pub series: Vec<virtprof_model::interval::Series>,
    /// Metrics asked for that this host cannot count, with the reason (never written as zeros).
    #[serde(default)]
    pub unavailable: Vec<(String, String)>,
}

/// One interval row read back.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IntervalRow<'a> {
    /// Global interval number since the recording started (gaps are missed intervals).
    pub index: u64,
    /// Start, in the recording's trace clock.
    pub start_ns: u64,
    /// End, in the recording's trace clock.
    pub end_ns: u64,
    /// One value per series, little-endian f64.
    values: &'a [u8],
}

impl IntervalRow<'_> {
    /// Value of column `i`.
    pub fn value(&self, i: usize) -> f64 {
        f64::from_le_bytes(self.values[i * 8..i * 8 + 8].try_into().expect("8 bytes"))
    }
}

/// Interval rows of one chunk.
#[derive(Debug, Clone, PartialEq)]
pub struct IntervalRows<'a> {
    series: usize,
    data: &'a [u8],
}

impl<'a> IntervalRows<'a> {
    /// Series per row.
    pub fn series(&self) -> usize {
        self.series
    }

    /// The rows in order.
    pub fn iter(&self) -> impl Iterator<Item = IntervalRow<'a>> + '_ {
        let row_len = 24 + 8 * self.series;
        self.data.chunks_exact(row_len).map(|r| IntervalRow {
            index: u64::from_le_bytes(r[0..8].try_into().expect("8")),
            start_ns: u64::from_le_bytes(r[8..16].try_into().expect("8")),
            end_ns: u64::from_le_bytes(r[16..24].try_into().expect("8")),
            values: &r[24..],
        })
    }
}

/// Encodes interval rows into a chunk payload, reusing its buffer.
#[derive(Debug, Default)]
pub struct IntervalEncoder {
    buf: Vec<u8>,
    series: usize,
    rows: usize,
}

impl IntervalEncoder {
    /// Start a batch of rows of `series` values each.
    pub fn begin(&mut self, series: usize) {
        self.buf.clear();
        self.buf.extend_from_slice(&u32::try_from(series).unwrap_or(u32::MAX).to_le_bytes());
        self.series = series;
        self.rows = 0;
    }

    /// Append one row (`values.len()` must equal the batch's series count).
    pub fn row(&mut self, index: u64, start_ns: u64, end_ns: u64, values: &[f64]) {
        debug_assert_eq!(values.len(), self.series);
        for v in [index, start_ns, end_ns] {
            self.buf.extend_from_slice(&v.to_le_bytes());
        }
        for v in values {
            self.buf.extend_from_slice(&v.to_le_bytes());
        }
        self.rows += 1;
    }

    /// Rows in the batch.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// The payload.
    pub fn payload(&self) -> &[u8] {
        &self.buf
    }
}

/// Interval engine figures, in the footer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct IntervalStats {
    /// Interval width in ns (0: no interval rows were recorded).
    pub interval_ns: u64,
    /// Rows written.
    pub rows: u64,
    /// Interval numbers skipped because the sampler woke late (their counts are folded into
    /// the next row, whose start and end say so).
    pub missed: u64,
    /// Rows overwritten in the ring before the writer drained them (lost).
    pub overwritten: u64,
}

/// One event format as the kernel printed it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FormatText {
    /// Event system.
    pub system: String,
    /// The `format` file's text.
    pub text: String,
}

/// A process and its threads at recording time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Task {
    /// Thread id.
    pub tid: u32,
    /// Process id.
    pub pid: u32,
    /// Thread name.
    pub comm: String,
}

/// A VM as discovery named it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmIdentity {
    /// The VMM process.
    pub pid: u32,
    /// VMM kind (`qemu`, `firecracker`, `virtprof-testvm`, ...).
    pub kind: String,
    /// The VM's name from the VMM's command line.
    pub name: String,
    /// Its UUID, libvirt domain, pod and container, where the host had them (absent in
    /// recordings made before they were kept).
    #[serde(default, skip_serializing_if = "VmOwner::is_empty")]
    pub owner: VmOwner,
}

/// KVM binary stats of one VMM at one moment.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct KvmStatsSnapshot {
    /// The VMM process.
    pub pid: u32,
    /// CLOCK_MONOTONIC when read.
    pub monotonic_ns: u64,
    /// VM-wide statistics by name.
    pub vm: std::collections::BTreeMap<String, u64>,
    /// Per vCPU index, statistics by name.
    pub vcpus: Vec<(u32, std::collections::BTreeMap<String, u64>)>,
}

/// Everything needed to decode and interpret the pages.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Metadata {
    /// How the recording was made (`virtprof record`, `import tracefs-dump`, ...).
    pub origin: String,
    /// The trace clock of the timestamps (`local`, `mono`, ...).
    pub trace_clock: String,
    /// `events/header_page` text.
    pub header_page: String,
    /// Formats of the recorded events.
    pub formats: Vec<FormatText>,
    /// The events traced (`system:name`), where the source says; without it, every event
    /// with a format counts as traced (a trace.dat and a perf.data save only those).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub events: Option<Vec<String>>,
    /// CPUs recorded.
    pub cpus: Vec<u32>,
    /// Host facts (kernel release, host kind, ...).
    pub host: std::collections::BTreeMap<String, String>,
    /// Threads known at recording time (vCPU threads among them).
    pub tasks: Vec<Task>,
    /// VMM processes (holding KVM VM fds) at the start.
    #[serde(default)]
    pub vms: Vec<u32>,
    /// KVM stats of those VMMs at the start.
    #[serde(default)]
    pub kvm_stats: Vec<KvmStatsSnapshot>,
    /// Kind and name of those VMMs' VMs.
    #[serde(default)]
    pub vm_identities: Vec<VmIdentity>,
    /// How the pages' timestamps become nanoseconds, where they are not (an import of a
    /// trace in TSC cycles, or with a time offset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_scale: Option<virtprof_model::clock::TimeScale>,
    /// Guests a host trace.dat names (its GUEST options): each vCPU's host thread.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub guests: Vec<GuestVcpuThreads>,
    /// A guest trace's corrections to its host's clock (trace-cmd's TIME_SHIFT), against the
    /// raw timestamps (before `time_scale`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock_sync: Option<virtprof_model::clock_sync::ClockSync>,
}

/// A guest whose vCPU threads a capture names (trace-cmd's GUEST option).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuestVcpuThreads {
    /// The guest's name.
    pub name: String,
    /// The guest trace's id (its TRACEID), where the capture says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<u64>,
    /// (guest CPU, host thread).
    pub vcpus: Vec<(u32, u32)>,
}

/// A guest machine traced with its host (`import host.dat --guest guest.dat`): everything
/// needed to read its pages, which are the guest's own (its kernel's formats, its clock,
/// placed on the host's by its TIME_SHIFT corrections in `metadata.clock_sync`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct GuestMachine {
    /// The file it was imported from.
    pub file: String,
    /// Its metadata, as a recording of the guest's trace alone would hold it.
    pub metadata: Metadata,
}

/// Per-CPU loss figures and totals, written last.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Footer {
    /// Per CPU: the kernel's loss counters from `per_cpu/cpuN/stats`.
    pub cpu_loss: Vec<KernelLoss>,
    /// Pages written.
    pub pages: u64,
    /// Recording length in ns of the trace clock.
    pub duration_ns: u64,
    /// Threads first seen during the recording (those at the start are in the metadata).
    #[serde(default)]
    pub tasks: Vec<Task>,
    /// KVM stats of the VMMs still running at the end.
    #[serde(default)]
    pub kvm_stats: Vec<KvmStatsSnapshot>,
    /// VMs first seen during the recording (started after it began).
    #[serde(default)]
    pub vm_identities: Vec<VmIdentity>,
    /// The interval engine's row counts and losses (`record --interval`).
    #[serde(default)]
    pub intervals: IntervalStats,
    /// Guest agents' link figures (`record --agent`).
    #[serde(default)]
    pub agents: Vec<AgentFooter>,
    /// The guest machine's own footer (its loss and pages), where the recording holds one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest: Option<Box<Footer>>,
    /// The kernel's own exit histograms, kept by hist triggers in the recording's instance
    /// (`record --kernel-hist`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_exit_hists: Option<virtprof_model::kernel_hist::KernelExitHists>,
    /// Why they were asked for and could not be read back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_exit_hists_unreadable: Option<String>,
}

/// Container errors, with the byte offset.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RecordingError {
    /// Not a recording.
    #[error(
        "not a virtprof recording: bad magic at byte 0 (expected 'VPROFREC'); use `virtprof import` for other formats"
    )]
    BadMagic,
    /// A version this build does not read.
    #[error("recording version {0} is not supported (this virtprof reads version {VERSION})")]
    Version(u32),
    /// A chunk failed its checksum.
    #[error("chunk at byte {offset} is corrupt (checksum mismatch)")]
    Checksum {
        /// Offset of the chunk header.
        offset: u64,
    },
    /// A chunk's header makes no sense.
    #[error("chunk at byte {offset}: {message}")]
    Malformed {
        /// Offset of the chunk header.
        offset: u64,
        /// What is wrong.
        message: String,
    },
    /// Metadata or footer JSON is invalid.
    #[error("chunk at byte {offset}: invalid JSON: {source}")]
    Json {
        /// Offset of the chunk header.
        offset: u64,
        /// Parser error.
        #[source]
        source: serde_json::Error,
    },
}

/// Writes a recording.
#[derive(Debug)]
pub struct Writer<W: Write> {
    out: W,
    written: u64,
}

impl<W: Write> Writer<W> {
    /// Start a recording with its metadata.
    pub fn new(mut out: W, metadata: &Metadata) -> io::Result<Self> {
        out.write_all(MAGIC)?;
        out.write_all(&VERSION.to_le_bytes())?;
        let mut w = Writer { out, written: 12 };
        w.chunk(ChunkKind::Metadata, &[&serde_json::to_vec(metadata).map_err(io::Error::other)?])?;
        Ok(w)
    }

    /// Push what is buffered to the output (a file: so a kill from here on leaves it there).
    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }

    /// Append whole raw pages of one CPU.
    pub fn pages(&mut self, cpu: u32, pages: &[u8]) -> io::Result<()> {
        self.chunk(ChunkKind::Pages, &[&cpu.to_le_bytes(), pages])
    }

    /// Declare the series of the interval rows that follow.
    pub fn interval_schema(&mut self, schema: &IntervalSchema) -> io::Result<()> {
        self.chunk(ChunkKind::IntervalSchema, &[&serde_json::to_vec(schema).map_err(io::Error::other)?])
    }

    /// Append a batch of interval rows.
    pub fn intervals(&mut self, rows: &IntervalEncoder) -> io::Result<()> {
        self.chunk(ChunkKind::Intervals, &[rows.payload()])
    }

    /// Append what an agent's link recorded.
    pub fn agent(&mut self, record: &AgentRecord) -> io::Result<()> {
        self.chunk(ChunkKind::Agent, &[&serde_json::to_vec(record).map_err(io::Error::other)?])
    }

    /// Declare the guest machine whose pages follow.
    pub fn guest_machine(&mut self, guest: &GuestMachine) -> io::Result<()> {
        self.chunk(ChunkKind::GuestMachine, &[&serde_json::to_vec(guest).map_err(io::Error::other)?])
    }

    /// Append whole raw pages of one of the guest machine's CPUs.
    pub fn guest_pages(&mut self, cpu: u32, pages: &[u8]) -> io::Result<()> {
        self.chunk(ChunkKind::GuestPages, &[&cpu.to_le_bytes(), pages])
    }

    /// Append the threads and VMs a scan found.
    pub fn tasks(&mut self, found: &TasksFound) -> io::Result<()> {
        self.chunk(ChunkKind::Tasks, &[&serde_json::to_vec(found).map_err(io::Error::other)?])
    }

    /// Append one guest row.
    pub fn agent_row(&mut self, agent: u32, start_ns: u64, end_ns: u64, values: &[f64]) -> io::Result<()> {
        let mut head = [0u8; 24];
        head[0..4].copy_from_slice(&agent.to_le_bytes());
        head[4..8].copy_from_slice(&u32::try_from(values.len()).unwrap_or(u32::MAX).to_le_bytes());
        head[8..16].copy_from_slice(&start_ns.to_le_bytes());
        head[16..24].copy_from_slice(&end_ns.to_le_bytes());
        let body: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.chunk(ChunkKind::AgentRow, &[&head, &body])
    }

    /// Append one period of an agent's noise loop.
    pub fn agent_noise(&mut self, agent: u32, batch: &virtprof_model::guest::NoiseBatch) -> io::Result<()> {
        let mut head = [0u8; NOISE_HEAD];
        head[0..4].copy_from_slice(&agent.to_le_bytes());
        head[4..8].copy_from_slice(&batch.cpu.to_le_bytes());
        for (i, word) in
            [batch.start_ns, batch.end_ns, batch.threshold_ns, batch.iterations, batch.dropped].into_iter().enumerate()
        {
            head[8 + 8 * i..16 + 8 * i].copy_from_slice(&word.to_le_bytes());
        }
        let body: Vec<u8> = batch
            .samples
            .iter()
            .flat_map(|&(start, len)| start.to_le_bytes().into_iter().chain(len.to_le_bytes()))
            .collect();
        self.chunk(ChunkKind::AgentNoise, &[&head, &body])
    }

    /// Give up the recording without a footer (its output failed): readers take it as cut
    /// short, readable up to its last whole chunk.
    pub fn abandon(self) -> W {
        self.out
    }

    /// Write the footer and flush.
    pub fn finish(mut self, footer: &Footer) -> io::Result<W> {
        self.chunk(ChunkKind::Footer, &[&serde_json::to_vec(footer).map_err(io::Error::other)?])?;
        self.out.flush()?;
        Ok(self.out)
    }

    /// Bytes written so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    fn chunk(&mut self, kind: ChunkKind, parts: &[&[u8]]) -> io::Result<()> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let mut crc = crc32fast::Hasher::new();
        parts.iter().for_each(|p| crc.update(p));
        let mut header = [0u8; CHUNK_HEADER];
        header[0..4].copy_from_slice(&(kind as u32).to_le_bytes());
        header[4..12].copy_from_slice(&(len as u64).to_le_bytes());
        header[12..16].copy_from_slice(&crc.finalize().to_le_bytes());
        self.out.write_all(&header)?;
        for p in parts {
            self.out.write_all(p)?;
        }
        // Flushed per chunk so a killed recorder leaves every chunk it wrote readable.
        self.out.flush()?;
        self.written += (CHUNK_HEADER + len) as u64;
        Ok(())
    }
}

/// One chunk read back. Page data borrows from the recording's bytes (usually a mapping of
/// the file), so reading allocates nothing per chunk.
#[derive(Debug, Clone, PartialEq)]
pub enum Chunk<'a> {
    /// The metadata.
    Metadata(Box<Metadata>),
    /// Raw pages of one CPU.
    Pages {
        /// CPU.
        cpu: u32,
        /// Whole pages.
        data: &'a [u8],
    },
    /// The footer.
    Footer(Footer),
    /// Series of the interval rows that follow.
    IntervalSchema(IntervalSchema),
    /// Interval rows.
    Intervals(IntervalRows<'a>),
    /// A guest agent's record.
    Agent(AgentRecord),
    /// One guest row.
    AgentRow {
        /// Agent number.
        agent: u32,
        /// Guest start time.
        start_ns: u64,
        /// Guest end time.
        end_ns: u64,
        /// Values, little-endian f64 (read with [`agent_value`]).
        values: &'a [u8],
    },
    /// Threads and VMs found during the recording.
    Tasks(TasksFound),
    /// One period of an agent's noise loop, left encoded ([`decode_noise`] reads it): a
    /// reader keeps where these are, not what they hold.
    AgentNoise {
        /// Agent number.
        agent: u32,
        /// The payload.
        payload: &'a [u8],
    },
    /// The guest machine of a host trace.
    GuestMachine(Box<GuestMachine>),
    /// Raw pages of one of the guest machine's CPUs.
    GuestPages {
        /// Guest CPU.
        cpu: u32,
        /// Whole pages.
        data: &'a [u8],
    },
}

/// Value `i` of a guest row's `values`.
pub fn agent_value(values: &[u8], i: usize) -> f64 {
    values.get(i * 8..i * 8 + 8).map_or(f64::NAN, |b| f64::from_le_bytes(b.try_into().expect("8 bytes")))
}

/// Reads a recording held in memory, chunk by chunk.
#[derive(Debug)]
pub struct Reader<'a> {
    bytes: &'a [u8],
    offset: usize,
    /// Set when the file ended inside a chunk: the recording was cut short there.
    pub truncated_at: Option<u64>,
}

impl<'a> Reader<'a> {
    /// Check the magic and version.
    pub fn new(bytes: &'a [u8]) -> Result<Self, RecordingError> {
        if bytes.len() < 12 || &bytes[..8] != MAGIC {
            return Err(RecordingError::BadMagic);
        }
        let version = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
        if version != VERSION {
            return Err(RecordingError::Version(version));
        }
        Ok(Reader { bytes, offset: 12, truncated_at: None })
    }

    /// The next chunk; None at the end, or where the file was cut short (see `truncated_at`).
    pub fn next_chunk(&mut self) -> Result<Option<Chunk<'a>>, RecordingError> {
        let at = self.offset as u64;
        let rest = &self.bytes[self.offset..];
        if rest.is_empty() {
            return Ok(None);
        }
        if rest.len() < CHUNK_HEADER {
            self.truncated_at = Some(at);
            return Ok(None);
        }
        let kind = u32::from_le_bytes(rest[0..4].try_into().expect("4"));
        let len = u64::from_le_bytes(rest[4..12].try_into().expect("8"));
        let crc = u32::from_le_bytes(rest[12..16].try_into().expect("4"));
        if len > MAX_CHUNK {
            return Err(RecordingError::Malformed {
                offset: at,
                message: format!("chunk length {len} is implausible"),
            });
        }
        let len = usize::try_from(len).expect("checked against MAX_CHUNK");
        let Some(payload) = rest.get(CHUNK_HEADER..CHUNK_HEADER + len) else {
            self.truncated_at = Some(at);
            return Ok(None);
        };
        if crc32fast::hash(payload) != crc {
            return Err(RecordingError::Checksum { offset: at });
        }
        self.offset += CHUNK_HEADER + len;
        let json = |source| RecordingError::Json { offset: at, source };
        Ok(Some(match kind {
            1 => Chunk::Metadata(Box::new(serde_json::from_slice(payload).map_err(json)?)),
            2 | 11 => {
                if payload.len() < 4 {
                    return Err(RecordingError::Malformed {
                        offset: at,
                        message: "page chunk without a CPU number".into(),
                    });
                }
                let cpu = u32::from_le_bytes(payload[0..4].try_into().expect("4"));
                let data = &payload[4..];
                if kind == 2 {
                    Chunk::Pages { cpu, data }
                } else {
                    Chunk::GuestPages { cpu, data }
                }
            }
            3 => Chunk::Footer(serde_json::from_slice(payload).map_err(json)?),
            4 => Chunk::IntervalSchema(serde_json::from_slice(payload).map_err(json)?),
            5 => {
                let series = payload.get(0..4).map(|b| u32::from_le_bytes(b.try_into().expect("4")) as usize);
                let data = &payload[4.min(payload.len())..];
                match series {
                    Some(series) if data.len() % (24 + 8 * series) == 0 => {
                        Chunk::Intervals(IntervalRows { series, data })
                    }
                    _ => {
                        return Err(RecordingError::Malformed {
                            offset: at,
                            message: "interval rows do not match their series count".into(),
                        })
                    }
                }
            }
            6 => Chunk::Agent(serde_json::from_slice(payload).map_err(json)?),
            7 => {
                let word = |i: usize| u64::from_le_bytes(payload[i..i + 8].try_into().expect("8"));
                let count = payload.get(4..8).map(|b| u32::from_le_bytes(b.try_into().expect("4")) as usize);
                match count {
                    Some(n) if payload.len() == 24 + 8 * n => Chunk::AgentRow {
                        agent: u32::from_le_bytes(payload[0..4].try_into().expect("4")),
                        start_ns: word(8),
                        end_ns: word(16),
                        values: &payload[24..],
                    },
                    _ => {
                        return Err(RecordingError::Malformed {
                            offset: at,
                            message: "a guest row whose length does not match its value count".into(),
                        })
                    }
                }
            }
            8 => Chunk::Tasks(serde_json::from_slice(payload).map_err(json)?),
            9 if payload.len() >= NOISE_HEAD && (payload.len() - NOISE_HEAD) % 16 == 0 => {
                Chunk::AgentNoise { agent: u32::from_le_bytes(payload[0..4].try_into().expect("4")), payload }
            }
            9 => {
                return Err(RecordingError::Malformed {
                    offset: at,
                    message: "a guest noise period whose length is not whole samples".into(),
                })
            }
            10 => Chunk::GuestMachine(Box::new(serde_json::from_slice(payload).map_err(json)?)),
            other => {
                return Err(RecordingError::Malformed { offset: at, message: format!("unknown chunk kind {other}") })
            }
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<u8> {
        let meta =
            Metadata { origin: "test".into(), trace_clock: "mono".into(), cpus: vec![0, 1], ..Default::default() };
        let mut w = Writer::new(Vec::new(), &meta).unwrap();
        w.pages(0, &[1u8; 4096]).unwrap();
        w.pages(1, &[2u8; 8192]).unwrap();
        w.finish(&Footer { pages: 3, ..Default::default() }).unwrap()
    }

    fn read_all(bytes: &[u8]) -> (Vec<Chunk<'_>>, Option<u64>) {
        let mut r = Reader::new(bytes).unwrap();
        let mut chunks = Vec::new();
        while let Some(c) = r.next_chunk().unwrap() {
            chunks.push(c);
        }
        (chunks, r.truncated_at)
    }

    #[test]
    fn round_trips() {
        let bytes = sample();
        let (chunks, truncated) = read_all(&bytes);
        assert_eq!(truncated, None);
        assert_eq!(chunks.len(), 4);
        assert!(matches!(&chunks[0], Chunk::Metadata(m) if m.cpus == vec![0, 1]));
        assert!(matches!(&chunks[2], Chunk::Pages { cpu: 1, data } if data.len() == 8192));
        assert!(matches!(&chunks[3], Chunk::Footer(f) if f.pages == 3));
    }

    #[test]
    fn interval_rows_round_trip() {
        use virtprof_model::interval::{Entity, Series, SeriesKind};
        let schema = IntervalSchema {
            interval_ns: 1_000_000,
            series: vec![Series {
                entity: Entity::Vcpu { pid: 7, index: 1 },
                metric: "schedstat.run_ns".into(),
                unit: "ns".into(),
                kind: SeriesKind::Delta,
            }],
            unavailable: vec![("perf.cycles".into(), "not supported".into())],
        };
        let mut w = Writer::new(Vec::new(), &Metadata::default()).unwrap();
        w.interval_schema(&schema).unwrap();
        let mut enc = IntervalEncoder::default();
        enc.begin(1);
        enc.row(0, 10, 20, &[5.5]);
        enc.row(2, 20, 40, &[7.0]);
        w.intervals(&enc).unwrap();
        let bytes = w.finish(&Footer::default()).unwrap();
        let (chunks, _) = read_all(&bytes);
        assert!(matches!(&chunks[1], Chunk::IntervalSchema(s) if *s == schema));
        let Chunk::Intervals(rows) = &chunks[2] else { panic!("rows expected") };
        let rows: Vec<_> = rows.iter().map(|r| (r.index, r.start_ns, r.end_ns, r.value(0))).collect();
        assert_eq!(rows, vec![(0, 10, 20, 5.5), (2, 20, 40, 7.0)]);
    }

    #[test]
    fn a_cut_file_reads_up_to_its_last_whole_chunk() {
        let full = sample();
        let cut = &full[..full.len() - 10]; // inside the footer
        let (chunks, truncated) = read_all(cut);
        assert_eq!(chunks.len(), 3);
        assert!(truncated.is_some());
    }

    #[test]
    fn corruption_is_reported_with_its_offset() {
        let mut bad = sample();
        bad[200] ^= 0xff; // inside the first page chunk
        let mut r = Reader::new(&bad).unwrap();
        let mut err = None;
        while err.is_none() {
            match r.next_chunk() {
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(e) => err = Some(e),
            }
        }
        let msg = err.expect("corruption detected").to_string();
        assert!(msg.starts_with("chunk at byte ") && msg.contains("checksum"), "{msg}");
        assert!(matches!(Reader::new(b"NOTAREC!...."), Err(RecordingError::BadMagic)));
    }
}
