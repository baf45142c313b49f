// What kvm-probe.c and kvm-boot.c share: failing with the call's error, one-reg access, and a
// vCPU of the host's preferred target with PSCI 0.2 (so HVC PSCI calls are KVM's).
#include <errno.h>
#include <linux/kvm.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>

// The program's name in messages; each tool defines it.
extern const char *tool;

static inline void die(const char *what) {
    fprintf(stderr, "%s: %s: %s\n", tool, what, strerror(errno));
    exit(1);
}

#define CORE(field) (KVM_REG_ARM64 | KVM_REG_SIZE_U64 | KVM_REG_ARM_CORE | (offsetof(struct kvm_regs, field) / sizeof(uint32_t)))

static inline void set_reg(int vcpu, uint64_t id, uint64_t value) {
    struct kvm_one_reg reg = {.id = id, .addr = (uint64_t)&value};
    if (ioctl(vcpu, KVM_SET_ONE_REG, &reg) < 0) die("KVM_SET_ONE_REG");
}

static inline uint64_t get_reg(int vcpu, uint64_t id) {
    uint64_t value = 0;
    struct kvm_one_reg reg = {.id = id, .addr = (uint64_t)&value};
    if (ioctl(vcpu, KVM_GET_ONE_REG, &reg) < 0) die("KVM_GET_ONE_REG");
    return value;
}

static inline int create_vcpu(int vm) {
    int vcpu = ioctl(vm, KVM_CREATE_VCPU, 0);
    if (vcpu < 0) die("KVM_CREATE_VCPU");
    struct kvm_vcpu_init init;
    if (ioctl(vm, KVM_ARM_PREFERRED_TARGET, &init) < 0) die("KVM_ARM_PREFERRED_TARGET");
    init.features[0] |= 1u << KVM_ARM_VCPU_PSCI_0_2;
    if (ioctl(vcpu, KVM_ARM_VCPU_INIT, &init) < 0) die("KVM_ARM_VCPU_INIT");
    return vcpu;
}
