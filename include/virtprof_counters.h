/* virtprof application counters: publish named 64-bit counters that `virtprof agent` reads
 * each interval (layout in docs/agent.md). Updating one costs one atomic add, nothing else.
 *
 *   struct vp_counters c;
 *   const char *names[] = {"requests", "errors"};
 *   if (vp_counters_create(&c, "/run/virtprof/counters/web.counters", "web", names, 2) == 0)
 *       vp_counters_add(&c, 0, 1);
 */
#ifndef VIRTPROF_COUNTERS_H
#define VIRTPROF_COUNTERS_H

#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define VP_COUNTERS_SLOT 64
#define VP_COUNTERS_NAME 48

struct vp_counters {
    unsigned char *base;
    uint32_t slots;
};

/* Create PATH for APP with N counters named NAMES (all counters: kind 0). 0 on success. */
static inline int vp_counters_create(struct vp_counters *c, const char *path, const char *app,
                                     const char *const *names, uint32_t n) {
    size_t len = (size_t)VP_COUNTERS_SLOT * (n + 1);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return -1;
    if (ftruncate(fd, (off_t)len) != 0) { close(fd); return -1; }
    unsigned char *m = mmap(0, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) return -1;
    uint32_t version = 1;
    memcpy(m + 8, &version, 4);
    memcpy(m + 12, &n, 4);
    strncpy((char *)m + 16, app, VP_COUNTERS_NAME - 1);
    for (uint32_t i = 0; i < n; i++)
        strncpy((char *)m + VP_COUNTERS_SLOT * (i + 1), names[i], VP_COUNTERS_NAME - 1);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    memcpy(m, "VPCOUNT1", 8); /* last: the file is ready */
    c->base = m;
    c->slots = n;
    return 0;
}

static inline uint64_t *vp_counters_slot(struct vp_counters *c, uint32_t i) {
    return (uint64_t *)(c->base + VP_COUNTERS_SLOT * (i + 1) + 56);
}

/* Add N to counter I. */
static inline void vp_counters_add(struct vp_counters *c, uint32_t i, uint64_t n) {
    __atomic_fetch_add(vp_counters_slot(c, i), n, __ATOMIC_RELAXED);
}

#endif
