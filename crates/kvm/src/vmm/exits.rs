//! Names of KVM's userspace exit reasons (`KVM_EXIT_*`, a stable kernel ABI in
//! include/uapi/linux/kvm.h), as the report keys them: `IO`, `MMIO`, `INTR`, ...

/// The `KVM_EXIT_*` name (without prefix) of a `kvm_run.exit_reason` value.
pub fn exit_reason_name(reason: u32) -> &'static str {
    const NAMES: [&str; 41] = [
        "UNKNOWN",
        "EXCEPTION",
        "IO",
        "HYPERCALL",
        "DEBUG",
        "HLT",
        "MMIO",
        "IRQ_WINDOW_OPEN",
        "SHUTDOWN",
        "FAIL_ENTRY",
        "INTR",
        "SET_TPR",
        "TPR_ACCESS",
        "S390_SIEIC",
        "S390_RESET",
        "DCR",
        "NMI",
        "INTERNAL_ERROR",
        "OSI",
        "PAPR_HCALL",
        "S390_UCONTROL",
        "WATCHDOG",
        "S390_TSCH",
        "EPR",
        "SYSTEM_EVENT",
        "S390_STSI",
        "IOAPIC_EOI",
        "HYPERV",
        "ARM_NISV",
        "X86_RDMSR",
        "X86_WRMSR",
        "DIRTY_RING_FULL",
        "AP_RESET_HOLD",
        "X86_BUS_LOCK",
        "XEN",
        "RISCV_SBI",
        "RISCV_CSR",
        "NOTIFY",
        "LOONGARCH_IOCSR",
        "MEMORY_FAULT",
        "TDX",
    ];
    NAMES.get(reason as usize).copied().unwrap_or("OTHER")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_the_uapi_numbers() {
        assert_eq!(exit_reason_name(kvm_bindings::KVM_EXIT_IO), "IO");
        assert_eq!(exit_reason_name(kvm_bindings::KVM_EXIT_MMIO), "MMIO");
        assert_eq!(exit_reason_name(kvm_bindings::KVM_EXIT_INTR), "INTR");
        assert_eq!(exit_reason_name(kvm_bindings::KVM_EXIT_SYSTEM_EVENT), "SYSTEM_EVENT");
        assert_eq!(exit_reason_name(kvm_bindings::KVM_EXIT_MEMORY_FAULT), "MEMORY_FAULT");
        assert_eq!(exit_reason_name(9999), "OTHER");
    }
}
