/*
 * C test of the virtio-blk-vfio-pci driver through the libblkio ABI, run in the VM of
 * tests/suites/vfio-vm.sh against snapblk's libblkio.so.1 and the real libblkio 1.5, each on its
 * own emulated virtio-blk-pci device (QEMU, iommu_platform=on, disable-legacy=on,
 * num-queues=2, 64 MiB raw image) bound to vfio-pci. Checks tagged [fix] are documented
 * differences (docs/blkio.md): the real library fails them, snapblk must pass everything.
 * Every property is checked in the created, connected and started states, so the two runs
 * print them side by side. The last check (a buffer outside every mapped region) may leave the
 * real library's device broken, so it runs last, with a timeout, on a second connection.
 * Leaves 64 KiB of 0xab at offset 0 and 0x5c at 1 MiB for the host to check in the image.
 *
 * Usage: vfio_test SYSFS_DIR          the checks above
 *        vfio_test bad SYSFS_DIR      connect only; prints "connect rc=N msg=M" (bad input)
 *        vfio_test shared SYSFS_DIR   two queues on a device with one MSI-X vector (snapblk
 *                                     shares it; the real library needs one per queue: [fix])
 *        vfio_test pollonly SYSFS_DIR one poll queue, no regular one: a write read back
 *                                     (a device without MSI-X); prints "pollonly: ..."
 *        vfio_test unplug SYSFS_DIR READY [poll]
 *                                     reads on two queues (one if the device has one; with
 *                                     "poll", a queue and a poll queue) until they fail; creates file READY
 *                                     once they work, so that the caller removes the device;
 *                                     prints "unplug: ..." lines and destroys the instance
 */
#define _GNU_SOURCE
#include <blkio.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define PROP_PATH_LABEL "DEVICE"
#include "check.h"


/* Two regular queues on a device with a single MSI-X vector: both complete requests, each
 * queue's own completion fd is signalled, and requests in flight on both complete in any
 * order of waiting. The real library refuses to start, so every check is a [fix]. */
static int shared_mode(const char *dev)
{
    struct blkio *b = NULL;
    if (blkio_create("virtio-blk-vfio-pci", &b) != 0) return 2;
    blkio_set_str(b, "path", dev);
    FIX("shared: connect", blkio_connect(b) == 0);
    blkio_set_int(b, "num-queues", 2);
    int started = blkio_start(b) == 0;
    FIX("shared: start 2 queues on one MSI-X vector", started);
    struct blkioq *q[2] = { NULL, NULL };
    struct blkio_mem_region r;
    memset(&r, 0, sizeof(r));
    int mapped = 0;
    if (started) {
        q[0] = blkio_get_queue(b, 0);
        q[1] = blkio_get_queue(b, 1);
        mapped = blkio_alloc_mem_region(b, &r, 1 << 16) == 0 && blkio_map_mem_region(b, &r) == 0;
    }
    FIX("shared: queues and a mapped region", q[0] && q[1] && mapped);
    int ok = q[0] && q[1] && mapped;
    int fd[2] = { ok ? blkioq_get_completion_fd(q[0]) : -1, ok ? blkioq_get_completion_fd(q[1]) : -1 };
    FIX("shared: each queue has its own completion fd", fd[0] >= 0 && fd[1] >= 0 && fd[0] != fd[1]);
    ok = ok && fd[0] >= 0 && fd[1] >= 0;
    char *m = r.addr;
    for (int i = 0; i < 2; i++) {
        char label[96];
        int good = 0;
        if (ok) {
            blkioq_set_completion_fd_enabled(q[i], true);
            memset(m + i * 4096, 0x30 + i, 4096);
            blkioq_write(q[i], i * 4096, m + i * 4096, 4096, NULL, 0);
            struct blkio_completion c;
            struct timespec t0 = { 0, 0 };
            /* Submit without taking completions, then wait for the queue's own completion fd. */
            int n = blkioq_do_io(q[i], NULL, 0, 0, &t0);
            struct pollfd p = { fd[i], POLLIN, 0 };
            if (n == 0) {
                good = poll(&p, 1, 20000) == 1;
                uint64_t v;
                if (read(fd[i], &v, 8) != 8) good = 0;
                c = wait1(q[i], 20);
                good = good && c.ret == 0;
            }
        }
        snprintf(label, sizeof(label), "shared: queue %d's completion fd wakes for its write", i);
        FIX(label, good);
    }
    /* Requests in flight on both queues; wait for queue 1 first. */
    int both = 0;
    if (ok) {
        blkioq_read(q[0], 0, m + 16384, 4096, NULL, 0);
        blkioq_read(q[1], 4096, m + 20480, 4096, NULL, 0);
        struct timespec t0 = { 0, 0 };
        blkioq_do_io(q[0], NULL, 0, 0, &t0);
        struct blkio_completion c1 = wait1(q[1], 20), c0 = wait1(q[0], 20);
        both = c0.ret == 0 && c1.ret == 0 && m[16384] == 0x30 && m[20480] == 0x31 &&
               memcmp(m + 16384, m, 4096) == 0 && memcmp(m + 20480, m + 4096, 4096) == 0;
    }
    FIX("shared: reads in flight on both queues complete, data read back", both);
    blkio_destroy(&b);
    printf("%d passed, %d failed\n", passes, fails);
    return fails ? 1 : 0;
}

static int pollonly_mode(const char *dev)
{
    struct blkio *b = NULL;
    if (blkio_create("virtio-blk-vfio-pci", &b) != 0) return 2;
    blkio_set_str(b, "path", dev);
    struct blkio_mem_region r;
    if (blkio_connect(b) != 0 || blkio_set_int(b, "num-queues", 0) != 0 ||
        blkio_set_int(b, "num-poll-queues", 1) != 0 || blkio_start(b) != 0 ||
        blkio_alloc_mem_region(b, &r, 8192) != 0 || blkio_map_mem_region(b, &r) != 0) {
        printf("pollonly: setup failed: %s\n", blkio_get_error_msg());
        return 1;
    }
    struct blkioq *q = blkio_get_poll_queue(b, 0);
    char *m = r.addr;
    memset(m, 0x6d, 4096);
    memset(m + 4096, 0, 4096);
    blkioq_write(q, 8192, m, 4096, NULL, 0);
    struct blkio_completion w = wait1(q, 20);
    blkioq_read(q, 8192, m + 4096, 4096, NULL, 0);
    struct blkio_completion rd = wait1(q, 20);
    int same = memcmp(m, m + 4096, 4096) == 0;
    printf("pollonly: write ret=%d read ret=%d data %s\n", w.ret, rd.ret, same ? "same" : "differs");
    blkio_destroy(&b);
    return w.ret == 0 && rd.ret == 0 && same ? 0 : 1;
}

/* Reads on two queues (or the device's one) until the device goes away under them (the caller removes it once READY
 * exists): they must fail (not hang), new ones too, and destroy must return. */
static int unplug_mode(const char *dev, const char *ready, int poll_queue)
{
    struct blkio *b = NULL;
    if (blkio_create("virtio-blk-vfio-pci", &b) != 0) return 2;
    blkio_set_str(b, "path", dev);
    blkio_set_bool(b, "read-only", true);
    if (blkio_connect(b) != 0) { printf("unplug: connect failed: %s\n", blkio_get_error_msg()); return 1; }
    int nq = 1;
    blkio_get_int(b, "max-queues", &nq);
    nq = nq >= 2 ? 2 : 1;
    /* With poll_queue: one regular queue and one poll queue. */
    blkio_set_int(b, "num-queues", poll_queue ? 1 : nq);
    blkio_set_int(b, "num-poll-queues", poll_queue ? 1 : 0);
    if (poll_queue) nq = 2;
    if (blkio_start(b) != 0) { printf("unplug: start failed: %s\n", blkio_get_error_msg()); return 1; }
    struct blkioq *q[2] = { blkio_get_queue(b, 0),
                            poll_queue ? blkio_get_poll_queue(b, 0)
                                       : nq == 2 ? blkio_get_queue(b, 1) : NULL };
    struct blkio_mem_region r;
    if (blkio_alloc_mem_region(b, &r, 1 << 16) != 0 || blkio_map_mem_region(b, &r) != 0) {
        printf("unplug: region: %s\n", blkio_get_error_msg());
        return 1;
    }
    time_t t0 = time(NULL);
    int rounds = 0, err = 0;
    const char *why = "";
    while (!err && time(NULL) - t0 < 180) {
        for (int i = 0; i < nq && !err; i++) {
            for (int k = 0; k < 4; k++)
                blkioq_read(q[i], (uint64_t)k * 4096, (char *)r.addr + (i * 4 + k) * 4096, 4096, NULL, 0);
            struct blkio_completion c[4];
            struct timespec t = { 30, 0 };
            int n = blkioq_do_io(q[i], c, 4, 4, &t);
            if (n < 0) { err = n; why = "do_io"; break; }
            for (int k = 0; k < n; k++)
                if (c[k].ret < 0 && !err) { err = c[k].ret; why = cmsg(c[k]); }
        }
        if (++rounds == 1 && !err) {
            FILE *f = fopen(ready, "w");
            if (f) fclose(f);
        }
    }
    printf("unplug: %d rounds; first error ret=%d (%s) msg=%s\n", rounds, err,
           err ? strerror(-err) : "none", why);
    for (int i = 0; i < nq; i++) {
        blkioq_read(q[i], 0, r.addr, 4096, NULL, 0);
        struct blkio_completion c = wait1(q[i], 30);
        printf("unplug: a new read on queue %d: ret=%d msg=%s\n", i, c.ret, cmsg(c));
    }
    blkio_destroy(&b);
    printf("unplug: destroyed\n");
    return 0;
}

int main(int argc, char **argv)
{
    struct blkio *b = NULL;
    if (argc == 3 && strcmp(argv[1], "bad") == 0) {
        if (blkio_create("virtio-blk-vfio-pci", &b) != 0) return 2;
        blkio_set_str(b, "path", argv[2]);
        int rc = blkio_connect(b);
        printf("connect rc=%d msg=%s\n", rc, rc ? blkio_get_error_msg() : "");
        blkio_destroy(&b);
        return 0;
    }
    if (argc == 3 && strcmp(argv[1], "shared") == 0) return shared_mode(argv[2]);
    if (argc == 3 && strcmp(argv[1], "pollonly") == 0) return pollonly_mode(argv[2]);
    if ((argc == 4 || argc == 5) && strcmp(argv[1], "unplug") == 0)
        return unplug_mode(argv[2], argv[3], argc == 5 && strcmp(argv[4], "poll") == 0);
    if (argc != 2) { fprintf(stderr, "usage: %s SYSFS_DIR | bad SYSFS_DIR\n", argv[0]); return 2; }
    const char *dev = argv[1];
    CHECK("create virtio-blk-vfio-pci", blkio_create("virtio-blk-vfio-pci", &b) == 0);
    if (!b) return 1;
    static const char *created[][2] = {
        {"driver", "virtio-blk-vfio-pci"}, {"path", ""}, {"fd", "-1"}, {"read-only", "false"},
        {"capacity", "ENODEV"}, {"max-queues", "ENODEV"}, {"max-mem-regions", "ENODEV"},
        {"mem-region-alignment", "1"}, {"needs-mem-regions", "true"},
        {"needs-mem-region-fd", "true"}, {"may-pin-mem-regions", "true"},
        {"request-alignment", "512"}, {"buf-alignment", "1"}, {"optimal-io-alignment", "512"},
        {"optimal-io-size", "0"}, {"optimal-buf-alignment", "1"}, {"max-segments", "1"},
        {"max-segment-len", "0"}, {"max-transfer", "0"}, {"max-write-zeroes-len", "0"},
        {"discard-alignment", "512"}, {"discard-alignment-offset", "0"},
        {"max-discard-len", "0"}, {"flush-needed", "true"}, {"can-grow", "false"},
        {"supports-fua-natively", "false"}, {"supports-poll-queues", "true"},
        {"can-add-queues", "false"}, {"num-queues", "1"}, {"num-poll-queues", "0"},
        {"queue-size", "256"}, {"max-queue-size", "32768"}, {"num-entries", "ENOENT"},
        {"direct", "ENOENT"}, {"reconnect", "ENOENT"},
    };
    for (size_t i = 0; i < sizeof(created) / sizeof(created[0]); i++)
        prop(b, "created", created[i][0], created[i][1]);
    ERR("connect without path or fd", blkio_connect(b), EINVAL, "One of path and fd must be set");
    /* QEMU probes fd first and falls back to path when setting it fails. */
    ERR("set fd in created state", blkio_set_int(b, "fd", 5), ENOENT, "fd property not supported");
    prop(b, "created", "fd", "-1");
    CHECK("set path", blkio_set_str(b, "path", dev) == 0);
    ERR("queue-size before connect", blkio_set_int(b, "queue-size", 64), ENODEV,
        "Device must be connected");
    CHECK("connect", blkio_connect(b) == 0);
    static const char *connected[][2] = {
        {"path", NULL}, {"fd", "-1"}, {"read-only", "false"}, {"capacity", "67108864"},
        {"max-queues", "2"}, {"max-mem-regions", "65535"}, {"mem-region-alignment", "4096"},
        {"needs-mem-regions", "true"}, {"needs-mem-region-fd", "false"},
        {"may-pin-mem-regions", "true"}, {"request-alignment", "512"}, {"buf-alignment", "1"},
        {"optimal-io-alignment", "512"}, {"optimal-io-size", "0"},
        {"optimal-buf-alignment", "1"}, {"max-segments", "254"}, {"max-segment-len", "0"},
        {"max-transfer", "0"}, {"max-write-zeroes-len", "2147483136"},
        {"discard-alignment", "512"}, {"discard-alignment-offset", "0"},
        {"max-discard-len", "2147483136"}, {"flush-needed", "true"}, {"can-grow", "false"},
        {"supports-fua-natively", "false"}, {"supports-poll-queues", "true"},
        {"can-add-queues", "false"}, {"num-queues", "1"}, {"num-poll-queues", "0"},
        {"queue-size", "256"}, {"max-queue-size", "32768"},
    };
    for (size_t i = 0; i < sizeof(connected) / sizeof(connected[0]); i++)
        prop(b, "connected", connected[i][0], connected[i][1] ? connected[i][1] : dev);
    ERR("set path when connected", blkio_set_str(b, "path", "/x"), EBUSY,
        "Cannot set property in connected state");
    ERR("queue-size 100", blkio_set_int(b, "queue-size", 100), EINVAL,
        "queue_size must be a power of two");
    ERR("queue-size 65536", blkio_set_int(b, "queue-size", 65536), EINVAL,
        "queue_size must be smaller than 32768");
    ERR("queue-size 0", blkio_set_int(b, "queue-size", 0), EINVAL,
        "queue_size must be greater than 0");
    CHECK("num-queues 3", blkio_set_int(b, "num-queues", 3) == 0);
    ERR("start with 3 queues of 2", blkio_start(b), EINVAL,
        "num_queues + num_poll_queues must not be greater than 2");
    blkio_set_int(b, "num-queues", 1);
    blkio_set_int(b, "num-poll-queues", 1);
    CHECK("start 1 + 1 poll", blkio_start(b) == 0);
    for (size_t i = 0; i < sizeof(connected) / sizeof(connected[0]); i++) {
        const char *want = connected[i][1] ? connected[i][1] : dev;
        if (strcmp(connected[i][0], "num-poll-queues") == 0) want = "1";
        prop(b, "started", connected[i][0], want);
    }
    struct blkioq *q = blkio_get_queue(b, 0), *pq = blkio_get_poll_queue(b, 0);
    CHECK("queues exist", q && pq);
    if (!q || !pq) return 1;
    CHECK("queue completion fd", blkioq_get_completion_fd(q) >= 0);
    CHECK("poll queue completion fd is -1", blkioq_get_completion_fd(pq) == -1);

    /* needs-mem-region-fd is false: anonymous memory can be mapped. */
    unsigned char *anon = mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE,
                               MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    struct blkio_mem_region ar = { .addr = anon, .len = 1 << 20, .fd = -1 };
    CHECK("map a region without fd", blkio_map_mem_region(b, &ar) == 0);
    struct blkio_mem_region r;
    CHECK("alloc 1 MiB", blkio_alloc_mem_region(b, &r, 1 << 20) == 0 && r.fd >= 0);
    CHECK("map", blkio_map_mem_region(b, &r) == 0);
    ERR("map again", blkio_map_mem_region(b, &r), EINVAL, "memory region already mapped");
    unsigned char *m = r.addr; /* valid until the region is freed below */
    memset(m, 0xab, 65536);
    memset(m + 65536, 0x5c, 65536);
    struct blkio_completion c;
    virtio_io_checks(q, pq, m);
    /* Beyond the common checks: a region without fd, and 64 requests in flight at once. */
    memset(anon, 0, 65536);
    blkioq_read(q, 1 << 20, anon, 65536, NULL, 0);
    c = wait1(q, 10);
    CHECK("read into the region without fd", c.ret == 0 && memcmp(anon, m + 65536, 65536) == 0);
    for (int i = 0; i < 64; i++)
        blkioq_read(q, (uint64_t)i * 4096, m + 524288 + (i % 64) * 4096, 4096, NULL, 0);
    struct blkio_completion many[64];
    struct timespec t10 = { 10, 0 };
    int got = 0, bad = 0;
    while (got < 64) {
        int n = blkioq_do_io(q, many, 1, 64, &t10);
        if (n <= 0) break;
        for (int i = 0; i < n; i++) bad += many[i].ret != 0;
        got += n;
    }
    CHECK("64 reads in flight", got == 64 && bad == 0);
    /* Completion fd: silent by default on virtio queues; once enabled, a completion makes it
     * readable. */
    int fd = blkioq_get_completion_fd(q);
    blkioq_set_completion_fd_enabled(q, true);
    blkioq_read(q, 0, m + 393216, 4096, NULL, 0);
    CHECK("submit with max 0", blkioq_do_io(q, &c, 0, 0, NULL) == 0);
    struct pollfd pfd = { .fd = fd, .events = POLLIN };
    CHECK("completion fd readable after enabling", poll(&pfd, 1, 5000) == 1);
    uint64_t cnt;
    CHECK("completion fd read", read(fd, &cnt, 8) == 8);
    c = wait1(q, 5);
    CHECK("completion reaped after the fd fired", c.ret == 0);
    blkioq_set_completion_fd_enabled(q, false);
    blkio_unmap_mem_region(b, &ar);
    blkio_unmap_mem_region(b, &r);
    blkio_free_mem_region(b, &r);
    blkio_destroy(&b);
    CHECK("destroy", b == NULL);

    /* A second connection to the same device (the first one reset and released it): a buffer
     * outside every mapped region. The real library hands its address to the device, which
     * faults in the IOMMU. */
    CHECK("create again", blkio_create("virtio-blk-vfio-pci", &b) == 0);
    blkio_set_str(b, "path", dev);
    CHECK("connect again", blkio_connect(b) == 0);
    CHECK("start again", blkio_start(b) == 0);
    q = blkio_get_queue(b, 0);
    if (!q) return 1;
    struct blkio_mem_region r2;
    CHECK("alloc and map again", blkio_alloc_mem_region(b, &r2, 1 << 16) == 0 &&
          blkio_map_mem_region(b, &r2) == 0);
    blkioq_read(q, 1 << 20, r2.addr, 4096, NULL, 0);
    c = wait1(q, 10);
    int all5c = c.ret == 0;
    for (int i = 0; i < 4096; i++) all5c = all5c && ((unsigned char *)r2.addr)[i] == 0x5c;
    CHECK("read on the second connection", all5c);
    char *heap = malloc(4096);
    memset(heap, 1, 4096);
    blkioq_write(q, 2 << 20, heap, 4096, NULL, 0);
    c = wait1(q, 3);
    FIX("buffer outside mapped regions fails with EFAULT at once",
        c.ret == -EFAULT && strcmp(cmsg(c), "buffer is not inside a mapped memory region") == 0);
    printf("%d passed, %d failed\n", passes, fails);
    fflush(stdout);
    /* No destroy: with the real library a request may still be in flight. */
    _exit(fails ? 1 : 0);
}
