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

/// What the recorded kernel's formats show was not recorded: a source lists the formats of
/// the events it enabled (trace-cmd saves only those), so a missing format is a figure the
/// exit analysis must call unknown.
pub fn unrecorded_events(decoder: &Decoder) -> virtprof_analysis::exits::Unrecorded {
    let missing = |system: &str, event: &str| decoder.layout().format_by_name(system, event).is_none();
    virtprof_analysis::exits::Unrecorded {
        userspace_exits: missing("kvm", "kvm_userspace_exit"),
        sched_switch: missing("sched", "sched_switch"),
        vcpu_wakeup: missing("kvm", "kvm_vcpu_wakeup"),
        round_trip_ends: missing("kvm", "kvm_fpu") && missing("kvm", "kvm_entry"),
    }
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
