// A minimal arm64 VMM for the arm64 bed (bed.sh): boots a Linux kernel Image as an L2 guest
// under the bed's KVM, with an in-kernel GICv3, PSCI 0.2, one 16550 UART at 0x09000000 (the
// kernel's console, polled), a device tree and an initramfs; it ends when the guest powers off
// (PSCI SYSTEM_OFF) and prints what it saw:
//     boot exits E uart U system_event TYPE pid PID tid TID
// With a deadline, a guest still running after it is stopped and described (its PC, the
// VMM's exits so far, the last unbacked address it touched), and kvm-boot exits 3: a boot
// that hangs under an emulated L1 ends with what it was doing, not with a killed bed.
// Memory map (as QEMU's virt): GIC distributor 0x08000000, redistributor 0x080a0000, UART
// 0x09000000, RAM at 0x40000000; the device tree at the start of RAM, the kernel 2 MiB in,
// the initramfs 128 MiB in.
//
//   aarch64-linux-gnu-gcc -O2 -static -o kvm-boot kvm-boot.c
//   kvm-boot IMAGE DTB INITRD [MEM_MIB [DEADLINE_S]]   (the DTB from kvm-boot.dts)
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "kvm-util.h"

#define GIC_DIST 0x08000000ull
#define GIC_REDIST 0x080a0000ull
#define UART 0x09000000ull
#define RAM_BASE 0x40000000ull
#define DTB_OFFSET 0ull
#define KERNEL_OFFSET 0x200000ull
#define INITRD_OFFSET 0x8000000ull

const char *tool = "kvm-boot";

static volatile sig_atomic_t expired;
static void on_deadline(int signal) { (void)signal; expired = 1; }

// `path` read into guest RAM at `at`, within `room` bytes; returns its size.
static size_t load(const char *path, uint8_t *at, size_t room) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) die(path);
    struct stat st;
    if (fstat(fd, &st) < 0) die(path);
    if ((size_t)st.st_size > room) {
        fprintf(stderr, "kvm-boot: %s: %lld bytes do not fit in %zu\n", path, (long long)st.st_size, room);
        exit(1);
    }
    size_t done = 0;
    while (done < (size_t)st.st_size) {
        ssize_t n = read(fd, at + done, st.st_size - done);
        if (n <= 0) die(path);
        done += n;
    }
    close(fd);
    return done;
}

static void set_attr(int device, uint32_t group, uint64_t attr, void *value) {
    struct kvm_device_attr a = {.group = group, .attr = attr, .addr = (uint64_t)value};
    if (ioctl(device, KVM_SET_DEVICE_ATTR, &a) < 0) die("KVM_SET_DEVICE_ATTR (vGIC)");
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: kvm-boot IMAGE DTB INITRD [MEM_MIB [DEADLINE_S]]\n");
        return 2;
    }
    uint64_t ram_size = (argc > 4 ? strtoull(argv[4], NULL, 10) : 256) << 20;
    int kvm = open("/dev/kvm", O_RDWR | O_CLOEXEC);
    if (kvm < 0) die("/dev/kvm");
    int vm = ioctl(kvm, KVM_CREATE_VM, 0);
    if (vm < 0) die("KVM_CREATE_VM");
    uint8_t *ram = mmap(NULL, ram_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (ram == MAP_FAILED) die("mmap");
    struct kvm_userspace_memory_region region = {
        .slot = 0, .guest_phys_addr = RAM_BASE, .memory_size = ram_size, .userspace_addr = (uint64_t)ram};
    if (ioctl(vm, KVM_SET_USER_MEMORY_REGION, &region) < 0) die("KVM_SET_USER_MEMORY_REGION");
    load(argv[1], ram + KERNEL_OFFSET, INITRD_OFFSET - KERNEL_OFFSET);
    load(argv[2], ram + DTB_OFFSET, KERNEL_OFFSET - DTB_OFFSET);
    load(argv[3], ram + INITRD_OFFSET, ram_size - INITRD_OFFSET);

    // The vGIC: created before the vCPU, placed, and initialized after it.
    struct kvm_create_device gic = {.type = KVM_DEV_TYPE_ARM_VGIC_V3};
    if (ioctl(vm, KVM_CREATE_DEVICE, &gic) < 0) die("KVM_CREATE_DEVICE (GICv3)");
    uint64_t dist = GIC_DIST, redist = GIC_REDIST;
    set_attr(gic.fd, KVM_DEV_ARM_VGIC_GRP_ADDR, KVM_VGIC_V3_ADDR_TYPE_DIST, &dist);
    set_attr(gic.fd, KVM_DEV_ARM_VGIC_GRP_ADDR, KVM_VGIC_V3_ADDR_TYPE_REDIST, &redist);

    int vcpu = create_vcpu(vm);
    uint32_t irqs = 128;
    set_attr(gic.fd, KVM_DEV_ARM_VGIC_GRP_NR_IRQS, 0, &irqs);
    set_attr(gic.fd, KVM_DEV_ARM_VGIC_GRP_CTRL, KVM_DEV_ARM_VGIC_CTRL_INIT, NULL);

    // The boot protocol: MMU off, x0 = the device tree, at the Image's first instruction.
    set_reg(vcpu, CORE(regs.pstate), 0x3c5); // EL1h, DAIF masked
    set_reg(vcpu, CORE(regs.pc), RAM_BASE + KERNEL_OFFSET);
    set_reg(vcpu, CORE(regs.regs[0]), RAM_BASE + DTB_OFFSET);

    int size = ioctl(kvm, KVM_GET_VCPU_MMAP_SIZE, 0);
    struct kvm_run *run = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, vcpu, 0);
    if (run == MAP_FAILED) die("mmap kvm_run");
    unsigned deadline = argc > 5 ? (unsigned)atoi(argv[5]) : 0;
    if (deadline) {
        struct sigaction action = {.sa_handler = on_deadline};
        sigaction(SIGALRM, &action, NULL);
        alarm(deadline);
    }
    long exits = 0, uart = 0, unbacked = 0;
    uint64_t last_unbacked = 0;
    for (;;) {
        if (ioctl(vcpu, KVM_RUN, 0) < 0) {
            if (errno == EINTR && expired) {
                fflush(stdout);
                fprintf(stderr,
                        "kvm-boot: the guest did not power off within %u s: PC %#llx, %ld exits to this VMM "
                        "(uart %ld, unbacked %ld, the last at %#llx)\n",
                        deadline, (unsigned long long)get_reg(vcpu, CORE(regs.pc)), exits, uart, unbacked,
                        (unsigned long long)last_unbacked);
                return 3;
            }
            if (errno == EINTR || errno == EAGAIN) continue;
            die("KVM_RUN");
        }
        exits++;
        if (run->exit_reason == KVM_EXIT_SYSTEM_EVENT) break;
        if (run->exit_reason != KVM_EXIT_MMIO) {
            fprintf(stderr, "kvm-boot: unexpected exit %u\n", run->exit_reason);
            return 1;
        }
        uint64_t offset = run->mmio.phys_addr - UART;
        if (run->mmio.phys_addr < UART || offset >= 8) {
            // Unbacked: reads are zero, writes go nowhere (as a bus with nothing there).
            if (!run->mmio.is_write) memset(run->mmio.data, 0, run->mmio.len);
            unbacked++;
            last_unbacked = run->mmio.phys_addr;
            continue;
        }
        uart++;
        if (run->mmio.is_write) {
            if (offset == 0) fputc(run->mmio.data[0], stdout);
        } else {
            memset(run->mmio.data, 0, run->mmio.len);
            if (offset == 5) run->mmio.data[0] = 0x60; // LSR: transmitter empty
        }
    }
    fflush(stdout);
    fprintf(stderr, "\nboot exits %ld uart %ld system_event %u pid %d tid %ld\n", exits, uart,
            run->system_event.type, getpid(), (long)syscall(SYS_gettid));
    return 0;
}
