//! `record --agent ADDR`: one link thread per guest agent, handing what it receives to the
//! recording's writer. Guest rows keep the guest's clock in the file; the clock points
//! measured all run long map them onto the recording's (CLOCK_MONOTONIC, the `mono` trace
//! clock) when read.

use std::sync::atomic::AtomicBool;
use std::sync::mpsc::SyncSender;
use std::sync::Arc;
use std::thread::JoinHandle;

use virtprof_agent::limits::GuestLimits;
use virtprof_agent::link::{run, LinkConfig, LinkEvent, LinkSummary};
use virtprof_agent::transport::Address;
use virtprof_store::recording::{AgentFooter, AgentRecord};

use super::WriterMsg;

/// A running link.
pub struct Running {
    agent: u32,
    address: Address,
    handle: JoinHandle<LinkSummary>,
}

/// Start agent number `agent`'s link, until `stop`.
pub fn start(
    agent: u32,
    address: &Address,
    token: &Option<String>,
    limits: GuestLimits,
    tx: &SyncSender<WriterMsg>,
    stop: &Arc<AtomicBool>,
) -> std::io::Result<Running> {
    let config = LinkConfig { limits, ..LinkConfig::new(address.clone(), token.clone()) };
    let (tx, stop) = (tx.clone(), Arc::clone(stop));
    let name = address.to_string();
    let handle = std::thread::Builder::new().name(format!("virtprof-agent-{agent}")).spawn(move || {
        run(&config, &stop, &mut |event| {
            let msg = match event {
                LinkEvent::Connected { guest, series } => {
                    WriterMsg::Agent(AgentRecord::Connected { agent, address: name.clone(), guest, series })
                }
                LinkEvent::Schema(series) => WriterMsg::Agent(AgentRecord::Schema { agent, series }),
                LinkEvent::Clock(point) => WriterMsg::Agent(AgentRecord::Clock { agent, point }),
                LinkEvent::Gap { from_ns, to_ns, cause } => {
                    WriterMsg::Agent(AgentRecord::Gap { agent, from_ns, to_ns, cause })
                }
                LinkEvent::Row(r) => WriterMsg::AgentRow(agent, r.start_ns, r.end_ns, r.values),
                LinkEvent::Noise(batch) => WriterMsg::Agent(AgentRecord::Noise { agent, batch: *batch }),
                // The gap that follows records it.
                LinkEvent::Unreachable(_) => return,
            };
            let _ = tx.send(msg);
        })
    })?;
    Ok(Running { agent, address: address.clone(), handle })
}

impl Running {
    /// Wait for the link (its stop flag set) and give its figures for the footer.
    pub fn finish(self) -> anyhow::Result<AgentFooter> {
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
            gaps: s.gaps,
            garbage_bytes: s.garbage_bytes,
            bad_frames: s.bad_frames,
            exchanges_checked: s.validation.checked,
            exchanges_outside: s.validation.outside,
            worst_excess_ns: s.validation.worst_excess_ns,
            refused: s.refused,
            bytes: s.bytes,
            dropped_rows: s.dropped.rows,
            dropped_noise: s.dropped.noise,
            dropped_points: s.dropped.points,
            dropped_schemas: s.dropped.schemas,
            capped: s.dropped.capped,
        })
    }
}
