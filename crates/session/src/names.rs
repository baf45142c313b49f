//! Names through a decoder: what lets analyzers, which know no kernel, name exit reasons,
//! events and tasks with the recorded kernel's own symbol tables and formats.

use virtprof_analysis::Names;
use virtprof_model::StrId;
use virtprof_trace::decode::Decoder;

/// kvm events that stand for one exit each where `kvm_exit` does not fire (the in-kernel
/// handlers' own tracepoints).
pub const EVIDENCE_EVENTS: [&str; 6] =
    ["kvm_cpuid", "kvm_msr", "kvm_hypercall", "kvm_hv_hypercall", "kvm_cr", "kvm_xsetbv"];

/// The ids of [`EVIDENCE_EVENTS`] in the recorded kernel.
pub fn evidence_event_ids(decoder: &Decoder) -> Vec<u16> {
    EVIDENCE_EVENTS.iter().filter_map(|name| decoder.layout().format_by_name("kvm", name).map(|f| f.id)).collect()
}

/// Names through a decoder: the recorded kernel's own symbol tables and event names.
pub struct DecoderNames<'a>(pub &'a Decoder);

impl Names for DecoderNames<'_> {
    fn exit_reason(&self, reason: u32, isa: u32) -> String {
        self.0.exit_name(reason, isa).unwrap_or_else(|| format!("reason {reason:#x}"))
    }

    fn userspace_reason(&self, reason: u32) -> String {
        self.0
            .symbol("kvm", "kvm_userspace_exit", "reason", u64::from(reason))
            .map_or_else(|| format!("KVM_EXIT {reason}"), str::to_string)
    }

    fn event(&self, id: u16) -> String {
        self.0.layout().format(id).map_or_else(|| format!("event {id}"), |f| f.name.clone())
    }

    fn task(&self, id: StrId) -> String {
        self.0.strings.resolve(id).to_string()
    }
}
