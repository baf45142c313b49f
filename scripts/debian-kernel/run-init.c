/* The init of a guest that runs one command and powers off: mounts proc, sysfs, devtmpfs and
 * tracefs, prints VIRTPROF-RUN-BEGIN, runs the command line given after `--` on the kernel
 * command line (the kernel passes those words to init as its arguments), prints
 * VIRTPROF-RUN-END with the command's exit status, and powers the machine off.
 * Built statically by guest-initrd.sh. */
#include <stdio.h>
#include <sys/mount.h>
#include <sys/reboot.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
    mount("proc", "/proc", "proc", 0, 0);
    mount("sysfs", "/sys", "sysfs", 0, 0);
    mount("devtmpfs", "/dev", "devtmpfs", 0, 0);
    mount("nodev", "/sys/kernel/tracing", "tracefs", 0, 0);
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
