//! The trace that explains the samples: the events that interrupt a thread (NMI, IRQ, IRQ
//! vectors, softirq) and the scheduler's switches, decoded as they come and kept for
//! attribution.

use virtprof_model::event::Event;
use virtprof_trace::decode::Decoder;

use virtprof_session::LiveTrace;

/// The events that explain noise on the measured CPUs.
pub const EVENTS: [&str; 8] = [
    "irq:irq_handler_entry",
    "irq:irq_handler_exit",
    "irq:softirq_entry",
    "irq:softirq_exit",
    "irq_vectors",
    "sched:sched_switch",
    "nmi:nmi_handler",
    "sched:sched_wakeup",
];

/// The host events that explain guest noise besides [`EVENTS`]: KVM's exits.
pub const HOST_EVENTS: [&str; 3] = ["kvm:kvm_userspace_exit", "kvm:kvm_exit", "kvm:kvm_entry"];

/// The events of `wanted` a recorded kernel has no format for (a whole system as `sys`).
pub fn missing(decoder: &Decoder, wanted: &[&str]) -> Vec<String> {
    let layout = decoder.layout();
    wanted
        .iter()
        .filter(|name| {
            let (system, event) = name.split_once(':').unwrap_or((name, ""));
            if event.is_empty() {
                !layout.formats().iter().any(|f| f.system == system)
            } else {
                layout.format_by_name(system, event).is_none()
            }
        })
        .map(|s| s.to_string())
        .collect()
}

/// A running trace of the measured CPUs.
pub struct NoiseTrace {
    trace: LiveTrace,
    cpus: Vec<u32>,
    events: Vec<Event>,
}

impl NoiseTrace {
    /// Start tracing `events` on trace clock `clock` (`mono_raw`, `mono`), keeping those of `cpus`.
    pub fn start(cpus: &[u32], clock: &str, events: &[&str]) -> anyhow::Result<NoiseTrace> {
        let trace = LiveTrace::start(events, clock, 8192, &["irq", "irq_vectors", "sched", "nmi", "kvm"])?;
        Ok(NoiseTrace { trace, cpus: cpus.to_vec(), events: Vec::new() })
    }

    /// Events this kernel lacks.
    pub fn missing(&self) -> &[String] {
        &self.trace.missing
    }

    /// Take in what the kernel has buffered (call every period so the buffers never fill).
    pub fn drain(&mut self) -> anyhow::Result<()> {
        let (cpus, events) = (&self.cpus, &mut self.events);
        Ok(self.trace.drain(|e| keep(cpus, events, e))?)
    }

    /// Stop and read the rest: the events sorted by CPU then time, the events lost on the
    /// measured CPUs, and the decoder (for task names).
    pub fn finish(self) -> anyhow::Result<(Vec<Event>, u64, Decoder)> {
        let NoiseTrace { trace, cpus, mut events } = self;
        let (mut loss, decoder) = trace.finish(|e| keep(&cpus, &mut events, e))?;
        events.sort_by_key(|e| (e.cpu, e.ts));
        // Only gaps on the measured CPUs leave samples unexplained.
        loss.cpus.retain(|c| cpus.contains(&c.cpu));
        let lost = loss.total();
        Ok((events, lost, decoder))
    }
}

fn keep(cpus: &[u32], events: &mut Vec<Event>, e: &Event) {
    if cpus.contains(&e.cpu) {
        events.push(*e);
    }
}
