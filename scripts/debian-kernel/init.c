/* The whole userspace of the boot-profiling test kernel: print a marker on the console, then
 * power off. No libc, so it builds with any gcc and runs before anything else exists. */
static long sys(long n, long a, long b, long c, long d) {
    long r;
    register long r10 __asm__("r10") = d;
    __asm__ volatile("syscall" : "=a"(r) : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10) : "rcx", "r11", "memory");
    return r;
}

void _start(void) {
    static const char marker[] = "VIRTPROF-INIT-MARKER\n";
    sys(1 /* write */, 1, (long)marker, sizeof marker - 1, 0);
    sys(169 /* reboot */, 0xfee1dead, 672274793, 0x4321fedc /* LINUX_REBOOT_CMD_POWER_OFF */, 0);
    for (;;) {
    }
}
