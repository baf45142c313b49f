/* The init of a guest that runs one command and powers off: mounts proc, sysfs, devtmpfs and
 * tracefs, loads the modules listed in /lib/modules/order (guest-initrd.sh MODULES=...), brings
 * up lo and, if there is one, eth0 at QEMU user networking's guest address 10.0.2.15/24,
 * prints VIRTPROF-RUN-BEGIN, runs the command line given after `--` on the kernel
 * command line (the kernel passes those words to init as its arguments), prints
 * VIRTPROF-RUN-END with the command's exit status, and powers the machine off.
 * Built statically by guest-initrd.sh. */
#include <fcntl.h>
#include <net/if.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/reboot.h>
#include <sys/wait.h>
#include <unistd.h>

static void load_modules(void) {
    FILE *order = fopen("/lib/modules/order", "r");
    char name[256], path[300];
    if (!order) return;
    while (fgets(name, sizeof name, order)) {
        name[strcspn(name, "\n")] = 0;
        snprintf(path, sizeof path, "/lib/modules/%s.ko", name);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0 || syscall(SYS_finit_module, fd, "", 0) != 0) perror(path);
        if (fd >= 0) close(fd);
    }
    fclose(order);
}

static void interface_up(int s, const char *name, const char *address) {
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    strncpy(ifr.ifr_name, name, IFNAMSIZ - 1);
    if (address) {
        struct sockaddr_in *a = (struct sockaddr_in *)&ifr.ifr_addr;
        a->sin_family = AF_INET;
        inet_pton(AF_INET, address, &a->sin_addr);
        if (ioctl(s, SIOCSIFADDR, &ifr) != 0) return; /* no such interface */
        inet_pton(AF_INET, "255.255.255.0", &a->sin_addr);
        ioctl(s, SIOCSIFNETMASK, &ifr);
    }
    if (ioctl(s, SIOCGIFFLAGS, &ifr) == 0) {
        ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
        ioctl(s, SIOCSIFFLAGS, &ifr);
    }
}

static void network_up(void) {
    int s = socket(AF_INET, SOCK_DGRAM, 0);
    if (s < 0) return;
    interface_up(s, "lo", 0);
    interface_up(s, "eth0", "10.0.2.15");
    close(s);
}

int main(int argc, char **argv) {
    mount("proc", "/proc", "proc", 0, 0);
    mount("sysfs", "/sys", "sysfs", 0, 0);
    mount("devtmpfs", "/dev", "devtmpfs", 0, 0);
    mount("nodev", "/sys/kernel/tracing", "tracefs", 0, 0);
    load_modules();
    network_up();
    int status = -1;
    if (argc > 1) {
        printf("VIRTPROF-RUN-BEGIN\n");
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) {
            execv(argv[1], argv + 1);
            perror("run-init: exec");
            _exit(127);
        }
        if (pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status)) {
            status = WEXITSTATUS(status);
        }
    }
    printf("VIRTPROF-RUN-END status=%d\n", status);
    fflush(stdout);
    sync();
    reboot(RB_POWER_OFF);
    return 0;
}
