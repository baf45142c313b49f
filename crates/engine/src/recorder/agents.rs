//! `record --agent ADDR`: one link thread per guest agent, handing what it receives to the
//! recording's writer. Guest rows keep the guest's clock in the file; the clock points
//! measured all run long map them onto the recording's (CLOCK_MONOTONIC, the `mono` trace
//! clock) when read.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::SyncSender;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use virtprof_agent::limits::GuestLimits;
use virtprof_agent::link::{run, LinkConfig, LinkEvent, LinkSummary, StoredSize};
use virtprof_agent::transport::Address;
use virtprof_store::recording::{AgentFooter, AgentRecord};

use super::WriterMsg;

/// The links of one recording. Dropped before [`Links::finish`] (a run that failed to
/// start), they are told to stop, so no thread goes on reconnecting for nothing.
pub struct Links {
    running: Vec<Running>,
    stop: Arc<AtomicBool>,
    /// When the trace started (CLOCK_MONOTONIC ns; `u64::MAX` before): the time the links
    /// spent connecting before it is no gap in the recording.
    trace_start_ns: Arc<AtomicU64>,
}

impl Links {
    /// Start a link per agent (address and token), each handing what it receives to `tx`.
    pub fn start(
        agents: &[(Address, Option<String>)],
        limits: GuestLimits,
        tx: &SyncSender<WriterMsg>,
    ) -> std::io::Result<Links> {
        let mut links = Links {
            running: Vec::with_capacity(agents.len()),
            stop: Arc::new(AtomicBool::new(false)),
            trace_start_ns: Arc::new(AtomicU64::new(u64::MAX)),
        };
        for (i, (address, token)) in agents.iter().enumerate() {
            let agent = u32::try_from(i).unwrap_or(u32::MAX);
            links.running.push(Running::start(agent, address, token, limits, tx, &links.stop, &links.trace_start_ns)?);
        }
        Ok(links)
    }

    /// The trace has started: gaps are counted from now.
    pub fn trace_started(&self) {
        self.trace_start_ns.store(virtprof_host::clock::monotonic_ns(), Ordering::Relaxed);
    }

    /// Wait until every agent has welcomed its link, for `within` at most or until `stop`;
    /// the addresses of those that have not.
    pub fn wait_connected(&self, within: Duration, stop: &AtomicBool) -> Vec<&Address> {
        let deadline = Instant::now() + within;
        let waiting = || self.running.iter().filter(|r| !r.connected.load(Ordering::Relaxed));
        while waiting().next().is_some() && Instant::now() < deadline && !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(20));
        }
        waiting().map(|r| &r.address).collect()
    }

    /// Stop the links and give each one's figures for the footer.
    pub fn finish(mut self) -> anyhow::Result<Vec<AgentFooter>> {
        self.stop.store(true, Ordering::Relaxed);
        std::mem::take(&mut self.running).into_iter().map(Running::finish).collect()
    }
}

impl Drop for Links {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// What each of agent `agent`'s events takes in the recording, chunk header included: the
/// cap (`--agent-max-mib`) counts what is stored, not what the guest sent.
fn recorded_size(agent: u32, address: String) -> StoredSize {
    use virtprof_store::recording::{agent_noise_size, agent_record_size, agent_row_size};
    StoredSize::new(move |event| match event {
        LinkEvent::Connected { guest, series } => agent_record_size(&AgentRecord::Connected {
            agent,
            address: address.clone(),
            guest: guest.clone(),
            series: series.clone(),
        }),
        LinkEvent::Schema(series) => agent_record_size(&AgentRecord::Schema { agent, series: series.clone() }),
        LinkEvent::Clock(point) => agent_record_size(&AgentRecord::Clock { agent, point: *point }),
        LinkEvent::Gap { from_ns, to_ns, cause } => {
            agent_record_size(&AgentRecord::Gap { agent, from_ns: *from_ns, to_ns: *to_ns, cause: cause.clone() })
        }
        LinkEvent::Row(row) => agent_row_size(row.values.len()),
        LinkEvent::Noise(batch) => agent_noise_size(batch.samples.len()),
        LinkEvent::Unreachable(_) => 0,
    })
}

/// A running link.
struct Running {
    agent: u32,
    address: Address,
    /// Set at its first welcome.
    connected: Arc<AtomicBool>,
    /// Gaps written: those within the trace.
    gaps: Arc<AtomicU64>,
    handle: JoinHandle<LinkSummary>,
}

impl Running {
    /// Start agent number `agent`'s link, until `stop`.
    fn start(
        agent: u32,
        address: &Address,
        token: &Option<String>,
        limits: GuestLimits,
        tx: &SyncSender<WriterMsg>,
        stop: &Arc<AtomicBool>,
        trace_start_ns: &Arc<AtomicU64>,
    ) -> std::io::Result<Running> {
        let stored_size = recorded_size(agent, address.to_string());
        let config = LinkConfig { limits, stored_size, ..LinkConfig::new(address.clone(), token.clone()) };
        let (connected, gaps) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
        let (tx, stop, welcomed, gaps_kept) = (tx.clone(), Arc::clone(stop), Arc::clone(&connected), Arc::clone(&gaps));
        let trace_start_ns = Arc::clone(trace_start_ns);
        let name = address.to_string();
        let handle = std::thread::Builder::new().name(format!("virtprof-agent-{agent}")).spawn(move || {
            run(&config, &stop, &mut |event| {
                let msg = match event {
                    LinkEvent::Connected { guest, series } => {
                        welcomed.store(true, Ordering::Relaxed);
                        WriterMsg::Agent(AgentRecord::Connected { agent, address: name.clone(), guest, series })
                    }
                    LinkEvent::Schema(series) => WriterMsg::Agent(AgentRecord::Schema { agent, series }),
                    LinkEvent::Clock(point) => WriterMsg::Agent(AgentRecord::Clock { agent, point }),
                    LinkEvent::Gap { from_ns, to_ns, cause } => {
                        // Only what lies within the trace.
                        let start = trace_start_ns.load(Ordering::Relaxed);
                        if to_ns <= start {
                            return;
                        }
                        gaps_kept.fetch_add(1, Ordering::Relaxed);
                        WriterMsg::Agent(AgentRecord::Gap { agent, from_ns: from_ns.max(start), to_ns, cause })
                    }
                    LinkEvent::Row(r) => WriterMsg::AgentRow(agent, r.start_ns, r.end_ns, r.values),
                    LinkEvent::Noise(batch) => WriterMsg::AgentNoise(agent, batch),
                    // The gap that follows records it.
                    LinkEvent::Unreachable(_) => return,
                };
                let _ = tx.send(msg);
            })
        })?;
        Ok(Running { agent, address: address.clone(), connected, gaps, handle })
    }

    /// Wait for the link (its stop flag set) and give its figures for the footer.
    fn finish(self) -> anyhow::Result<AgentFooter> {
        let s = self.handle.join().map_err(|_| anyhow::anyhow!("agent link thread panicked"))?;
        let d = s.dropped;
        if d.capped || d.rows + d.noise + d.points + d.schemas > 0 {
            eprintln!(
                "virtprof: agent {} ({}): over the host's limits, dropped {} rows, {} noise periods, {} clock points, {} schemas{}",
                self.agent,
                self.address,
                d.rows,
                d.noise,
                d.points,
                d.schemas,
                if d.capped { "; its data reached --agent-max-mib, the rest of the run is a gap" } else { "" }
            );
        }
        Ok(AgentFooter {
            agent: self.agent,
            address: self.address.to_string(),
            sessions: s.sessions,
            rows: s.rows,
            noise_batches: s.noise_batches,
            gaps: self.gaps.load(Ordering::Relaxed),
            garbage_bytes: s.garbage_bytes,
            bad_frames: s.bad_frames,
            exchanges_checked: s.validation.checked,
            exchanges_outside: s.validation.outside,
            worst_excess_ns: s.validation.worst_excess_ns,
            refused: s.refused,
            rejected: s.rejected,
            bytes: s.bytes,
            dropped_rows: s.dropped.rows,
            dropped_noise: s.dropped.noise,
            dropped_points: s.dropped.points,
            dropped_schemas: s.dropped.schemas,
            capped: s.dropped.capped,
        })
    }
}
