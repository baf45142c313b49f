// A KVM guest on arm64 with exactly known exits, for the arm64 bed (bed.sh): one vCPU at EL1,
// MMU off, RAM at guest-physical 0 (where the reset VBAR_EL1 points), runs N rounds of
//     an MMIO store to an address no memslot backs (DABT_LOW, handed to this VMM), then
//     HVC #0 with PSCI_VERSION in x0 (HVC64, answered by KVM's PSCI in the kernel),
// then one more store to the DONE address. The probe prints what it saw return from KVM_RUN:
//     mmio EXITS hvc N done 1 pid PID tid TID
// so a test knows DABT_LOW = N + 1 and HVC64 = N exactly (IRQ exits come on top, as the host
// interrupts the vCPU thread). WFI is `virtprof testvm --workload wfi`'s (a trapped WFI waits
// for an interrupt, which needs a VMM that raises one).
//
//   aarch64-linux-gnu-gcc -O2 -static -o kvm-probe kvm-probe.c
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "kvm-util.h"

#define RAM_BASE 0ull
#define RAM_SIZE 0x10000ull
#define MMIO_ADDR 0x09000000ull
#define DONE_ADDR (MMIO_ADDR + 8)
#define FAULT_ADDR (MMIO_ADDR + 16)

// The guest, assembled into this binary and copied to RAM_BASE; x19 holds N at entry.
// Its size comes from the assembler: the difference of two unrelated C arrays is undefined,
// and GCC folds it to 0.
extern const unsigned char guest_start[];
extern const uint64_t guest_size;
__asm__(".pushsection .rodata\n"
        ".globl guest_start, guest_size\n"
        ".balign 4096\n"
        "guest_start:\n"
        "    b 3f\n"
        // VBAR_EL1 is 0 after reset: a synchronous exception at EL1 lands at 0x200. The
        // guest reports ESR_EL1 and ELR_EL1 to the FAULT address and stops there.
        "    .skip 0x200 - (. - guest_start)\n"
        "    mrs x3, esr_el1\n"
        "    mrs x4, elr_el1\n"
        "    movz x5, #0x0900, lsl #16\n"
        "    stp x3, x4, [x5, #16]\n"
        "4:  b 4b\n"
        "    .skip 0x800 - (. - guest_start)\n"
        // x19, x20: an SMCCC call returns in x0-x3 (KVM zeroes x1-x3) and keeps x19 up.
        "3:  movz x20, #0x0900, lsl #16\n"    // x20 = MMIO_ADDR
        "1:  str x19, [x20]\n"               // DABT_LOW: KVM_EXIT_MMIO
        "    movz x0, #0x8400, lsl #16\n"     // PSCI_VERSION
        "    hvc #0\n"                       // HVC64: PSCI, in the kernel
        "    subs x19, x19, #1\n"
        "    b.ne 1b\n"
        "    str x19, [x20, #8]\n"           // DONE
        "2:  b 2b\n"
        "guest_end:\n"
        ".balign 8\n"
        "guest_size: .quad guest_end - guest_start\n"
        ".popsection\n");

const char *tool = "kvm-probe";

// A guest that made no exit to this VMM for 10 s is stuck: say where, and what it last took.
static void stuck(int vcpu, void *ram) {
    uint32_t at0;
    memcpy(&at0, ram, sizeof at0);
    fprintf(stderr, "kvm-probe: the guest is stuck: PC %#llx, ELR_EL1 %#llx, ESR_EL1 %#llx, word at 0: %#x\n",
            (unsigned long long)get_reg(vcpu, CORE(regs.pc)), (unsigned long long)get_reg(vcpu, CORE(elr_el1)),
            (unsigned long long)get_reg(vcpu, ARM64_SYS_REG(3, 0, 5, 2, 0)), at0);
    exit(1);
}

static void on_alarm(int signal) { (void)signal; }

int main(int argc, char **argv) {
    long rounds = argc > 1 ? atol(argv[1]) : 1000;
    if (rounds < 1) { fprintf(stderr, "usage: kvm-probe [ROUNDS >= 1]\n"); return 2; }
    int kvm = open("/dev/kvm", O_RDWR | O_CLOEXEC);
    if (kvm < 0) die("/dev/kvm");
    int vm = ioctl(kvm, KVM_CREATE_VM, 0);
    if (vm < 0) die("KVM_CREATE_VM");
    void *ram = mmap(NULL, RAM_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (ram == MAP_FAILED) die("mmap");
    memcpy(ram, guest_start, guest_size);
    struct kvm_userspace_memory_region region = {
        .slot = 0, .guest_phys_addr = RAM_BASE, .memory_size = RAM_SIZE, .userspace_addr = (uint64_t)ram};
    if (ioctl(vm, KVM_SET_USER_MEMORY_REGION, &region) < 0) die("KVM_SET_USER_MEMORY_REGION");
    int vcpu = create_vcpu(vm);
    set_reg(vcpu, CORE(regs.pc), RAM_BASE);
    set_reg(vcpu, CORE(regs.regs[19]), (uint64_t)rounds);
    int size = ioctl(kvm, KVM_GET_VCPU_MMAP_SIZE, 0);
    struct kvm_run *run = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, vcpu, 0);
    if (run == MAP_FAILED) die("mmap kvm_run");
    long mmio = 0;
    struct sigaction alarm_action = {.sa_handler = on_alarm};
    sigaction(SIGALRM, &alarm_action, NULL);
    for (;;) {
        alarm(10);
        if (ioctl(vcpu, KVM_RUN, 0) < 0) {
            if (errno == EINTR) stuck(vcpu, ram);
            die("KVM_RUN");
        }
        if (run->exit_reason != KVM_EXIT_MMIO) {
            fprintf(stderr, "kvm-probe: unexpected exit %u\n", run->exit_reason);
            return 1;
        }
        mmio++;
        if (run->mmio.phys_addr == DONE_ADDR) break;
        if (run->mmio.phys_addr == FAULT_ADDR) {
            uint64_t esr;
            memcpy(&esr, run->mmio.data, sizeof esr);
            fprintf(stderr, "kvm-probe: the guest took an exception: ESR_EL1 %#llx (EC %#llx)\n",
                    (unsigned long long)esr, (unsigned long long)(esr >> 26));
            return 1;
        }
        if (run->mmio.phys_addr != MMIO_ADDR || !run->mmio.is_write) {
            fprintf(stderr, "kvm-probe: unexpected MMIO at %#llx\n", (unsigned long long)run->mmio.phys_addr);
            return 1;
        }
    }
    printf("mmio %ld hvc %ld done 1 pid %d tid %ld\n", mmio, rounds, getpid(),
           (long)syscall(SYS_gettid));
    return 0;
}
