/*
 * C test of the virtio-blk-vhost-vdpa driver through the libblkio ABI, against a VDUSE device
 * served by qemu-storage-daemon (7.2, vduse-blk, num-queues=2, 64 MiB, writable), run by
 * tests/vm/guest/vdpa-tests.sh in the VM against snapblk's libblkio.so.1 and the real
 * libblkio 1.5, each on its own device. Checks tagged [fix] are documented differences
 * (docs/blkio.md): the real library fails them, snapblk must pass everything. Every property
 * is also printed in every state ("PROP state name = value") for the script to compare the two
 * libraries line by line. The last check (a buffer outside every mapped region) is handed to
 * the device by the real library, so it runs last, with a timeout. Leaves 64 KiB of 0xab at
 * offset 0 and 0x5c at 1 MiB for the host to check in the backing image.
 *
 * Usage: vdpa_test /dev/vhost-vdpa-N
 */
#define _GNU_SOURCE
#include <blkio.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define PROP_PATH_LABEL "PATH"
#include "check.h"

#define ERRNO(name, expr, err) do { int rc_ = (expr); \
    check(name, rc_ == -(err), 0, __LINE__); if (rc_ != -(err)) printf("  got %d\n", rc_); } while (0)

static const char *all[] = {
    "driver", "path", "fd", "read-only", "capacity", "max-queues", "max-mem-regions",
    "mem-region-alignment", "needs-mem-regions", "needs-mem-region-fd", "may-pin-mem-regions",
    "request-alignment", "buf-alignment", "optimal-io-alignment", "optimal-io-size",
    "optimal-buf-alignment", "max-segments", "max-segment-len", "max-transfer",
    "max-write-zeroes-len", "discard-alignment", "discard-alignment-offset", "max-discard-len",
    "flush-needed", "can-grow", "supports-fua-natively", "supports-poll-queues",
    "can-add-queues", "num-queues", "num-poll-queues", "queue-size", "max-queue-size",
    "num-entries", "direct", "zoned", NULL};

/* Print every property of `b` in `state` (the device path replaced by PATH). */
static void dump(struct blkio *b, const char *state, const char *path)
{
    for (int i = 0; all[i]; i++) {
        char *v = NULL;
        int rc = blkio_get_str(b, all[i], &v);
        if (rc == 0 && path && strcmp(v, path) == 0)
            printf("PROP %s %s = PATH\n", state, all[i]);
        else if (rc == 0)
            printf("PROP %s %s = %s\n", state, all[i], v);
        else
            printf("PROP %s %s -> %d\n", state, all[i], rc);
        free(v);
    }
}

static int fd_open(int fd) { return fcntl(fd, F_GETFD) >= 0; }

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    if (argc != 2) { fprintf(stderr, "usage: %s /dev/vhost-vdpa-N\n", argv[0]); return 2; }
    const char *dev = argv[1];
    const char *D = "virtio-blk-vhost-vdpa";
    struct blkio *b = NULL;
    CHECK("create virtio-blk-vhost-vdpa", blkio_create(D, &b) == 0);
    if (!b) return 1;
    dump(b, "created", NULL);
    static const char *created[][2] = {
        {"driver", "virtio-blk-vhost-vdpa"}, {"path", ""}, {"fd", "-1"}, {"read-only", "false"},
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
        {"direct", "ENOENT"},
    };
    for (size_t i = 0; i < sizeof(created) / sizeof(created[0]); i++)
        prop(b, "created", created[i][0], created[i][1]);
    ERR("queue-size before connect", blkio_set_int(b, "queue-size", 64), ENODEV,
        "Device must be connected");
    ERR("connect with neither path nor fd", blkio_connect(b), EINVAL,
        "One of path and fd must be set");
    CHECK("set path", blkio_set_str(b, "path", dev) == 0);
    CHECK("set fd", blkio_set_int(b, "fd", 1000) == 0);
    ERR("connect with path and fd", blkio_connect(b), EINVAL,
        "path and fd cannot be set at the same time");
    CHECK("fd back to -1", blkio_set_int(b, "fd", -1) == 0);
    CHECK("connect", blkio_connect(b) == 0);
    dump(b, "connected", dev);
    static const char *connected[][2] = {
        {"path", NULL}, {"fd", "-1"}, {"capacity", "67108864"}, {"max-queues", "2"},
        {"max-mem-regions", "18446744073709551615"}, {"mem-region-alignment", "4096"},
        {"needs-mem-region-fd", "true"}, {"request-alignment", "512"},
        {"optimal-io-alignment", "512"}, {"optimal-io-size", "512"}, {"max-segments", "254"},
        {"max-segment-len", "0"}, {"max-transfer", "0"}, {"max-write-zeroes-len", "16777216"},
        {"discard-alignment", "512"}, {"max-discard-len", "16777216"},
        {"flush-needed", "true"}, {"supports-poll-queues", "true"}, {"queue-size", "256"},
    };
    for (size_t i = 0; i < sizeof(connected) / sizeof(connected[0]); i++)
        prop(b, "connected", connected[i][0], connected[i][1] ? connected[i][1] : dev);
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
    dump(b, "started", dev);
    struct blkioq *q = blkio_get_queue(b, 0), *pq = blkio_get_poll_queue(b, 0);
    CHECK("queues exist", q && pq);
    if (!q || !pq) return 1;
    CHECK("queue completion fd", blkioq_get_completion_fd(q) >= 0);
    CHECK("poll queue completion fd is -1", blkioq_get_completion_fd(pq) == -1);
    ERRNO("add a queue after start", blkio_add_queue(b), ENOTSUP);

    /* VDUSE reaches only file-backed memory: a region without fd (needs-mem-region-fd) is
     * refused. The real library maps it, and the device cannot use it. */
    void *anon = mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    struct blkio_mem_region ar = { .addr = anon, .len = 1 << 20, .fd = -1 };
    int mr = blkio_map_mem_region(b, &ar);
    FIX("map a region without fd refused with EBADF", mr == -EBADF);
    if (mr == 0) blkio_unmap_mem_region(b, &ar);
    struct blkio_mem_region r;
    CHECK("alloc 1 MiB", blkio_alloc_mem_region(b, &r, 1 << 20) == 0 && r.fd >= 0);
    CHECK("map", blkio_map_mem_region(b, &r) == 0);
    ERR("map again", blkio_map_mem_region(b, &r), EINVAL, "memory region already mapped");
    unsigned char *m = r.addr;
    memset(m, 0xab, 65536);
    memset(m + 65536, 0x5c, 65536);
    struct blkio_completion c;
    virtio_io_checks(q, pq, m);
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
    /* A region unmapped again: its buffer is outside every mapped region from then on. */
    struct blkio_mem_region r2;
    CHECK("alloc a second region", blkio_alloc_mem_region(b, &r2, 65536) == 0);
    CHECK("map the second region", blkio_map_mem_region(b, &r2) == 0);
    memset(r2.addr, 0x77, 4096);
    blkioq_write(q, 2 << 20, r2.addr, 4096, NULL, 0);
    CHECK("write from the second region", wait1(q, 10).ret == 0);
    blkio_unmap_mem_region(b, &r2);
    blkio_free_mem_region(b, &r2);
    blkio_unmap_mem_region(b, &r);
    blkio_free_mem_region(b, &r);
    blkio_destroy(&b);
    CHECK("destroy", b == NULL);

    /* A start that fails (a queue larger than the device's largest, 256 on VDUSE) can be
     * retried. The real library fails it with another errno, and then every later start with
     * "Memory is already allocated". */
    CHECK("create for a failing start", blkio_create(D, &b) == 0);
    blkio_set_str(b, "path", dev);
    CHECK("connect for a failing start", blkio_connect(b) == 0);
    CHECK("queue-size 512", blkio_set_int(b, "queue-size", 512) == 0);
    int rs = blkio_start(b);
    printf("INFO start with queue-size 512: %d %s\n", rs, rs ? blkio_get_error_msg() : "");
    FIX("start with queue-size above the device's largest queue fails with EINVAL", rs == -EINVAL);
    CHECK("queue-size 256 after the failed start", blkio_set_int(b, "queue-size", 256) == 0);
    FIX("start again after a failed start", blkio_start(b) == 0);
    blkio_destroy(&b);

    /* The fd property, as libvirt/QEMU pass it: the library owns the fd from connect on. */
    CHECK("create with fd", blkio_create(D, &b) == 0);
    int vfd = open(dev, O_RDWR);
    CHECK("open the device", vfd >= 0);
    CHECK("set fd", blkio_set_int(b, "fd", vfd) == 0);
    CHECK("connect by fd", blkio_connect(b) == 0);
    dump(b, "connected-fd", dev);
    int got = -2;
    CHECK("fd reads back", blkio_get_int(b, "fd", &got) == 0 && got == vfd);
    CHECK("start by fd", blkio_start(b) == 0);
    q = blkio_get_queue(b, 0);
    CHECK("alloc+map by fd", q && blkio_alloc_mem_region(b, &r, 65536) == 0 &&
          blkio_map_mem_region(b, &r) == 0);
    if (!q) return 1;
    memset(r.addr, 0, 4096);
    blkioq_read(q, 0, r.addr, 4096, NULL, 0);
    c = wait1(q, 10);
    CHECK("read by fd", c.ret == 0 && ((unsigned char *)r.addr)[0] == 0xab);
    blkio_destroy(&b);
    CHECK("the fd is closed by destroy", !fd_open(vfd));
    CHECK("create with a wrong fd", blkio_create(D, &b) == 0);
    int nfd = open("/dev/null", O_RDWR);
    blkio_set_int(b, "fd", nfd);
    ERRNO("connect with /dev/null as fd fails", blkio_connect(b), EIO);
    blkio_destroy(&b);

    /* A buffer outside every mapped region. The real library hands it to the device. */
    CHECK("create again", blkio_create(D, &b) == 0);
    blkio_set_str(b, "path", dev);
    CHECK("connect again", blkio_connect(b) == 0);
    CHECK("start again", blkio_start(b) == 0);
    q = blkio_get_queue(b, 0);
    if (!q) return 1;
    char *heap = aligned_alloc(4096, 4096);
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
