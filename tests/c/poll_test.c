/*
 * Poll queues through the libblkio C ABI (snapblk's libblkio.so.1, io_uring driver).
 *
 *   poll_test nvme DEV    DEV is a block device with polling (an NVMe namespace with poll
 *                         queues, /sys/block/X/queue/io_poll = 1; run in the test VM):
 *                         O_DIRECT patterned writes/reads of 4 KiB and 64 KiB (write/writev,
 *                         read/readv, registered and plain buffers) at QD1 and QD16 through
 *                         blkio_get_poll_queue, reaped with min_completions 0 (spinning) and
 *                         > 0; proves the I/O was polled by counting the NVMe I/O queue
 *                         interrupts in /proc/interrupts (none for polled I/O, about one per
 *                         request for the same I/O on the regular queue); the spec's poll-queue
 *                         rules (no completion fd, flush/write-zeroes/discard/interruptible ->
 *                         ENOTSUP, add/remove poll queues), FUA, short transfer at the end.
 *   poll_test nopoll PATH PATH has no polling (tmpfs/ext4 file, loop device): O_DIRECT connect
 *                         reports supports-poll-queues=false and num-poll-queues=1 makes
 *                         blkio_start fail with EINVAL "Poll queues not supported"; regular
 *                         queues still work.
 *
 * Prints "PASS: name" / "FAIL: name" lines; exit status 1 if anything failed, 2 on setup errors.
 */
#define _GNU_SOURCE
#include <blkio.h>
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>

static int passes, fails;
static const char *tag = "";

static void check(const char *name, int ok, int line)
{
    printf("%s: %s%s (line %d)%s%s\n", ok ? "PASS" : "FAIL", tag, name, line,
           ok ? "" : " msg=", ok ? "" : blkio_get_error_msg());
    fflush(stdout);
    if (ok) passes++; else fails++;
}
#define CHECK(name, cond) check(name, !!(cond), __LINE__)
#define MSG_IS(m) (strcmp(blkio_get_error_msg(), (m)) == 0)
#define ERR(name, expr, err, msg) do { int rc_ = (expr); \
    check(name, rc_ == -(err) && MSG_IS(msg), __LINE__); } while (0)

static void die(const char *what)
{
    printf("FAIL: %s%s: %s\n", tag, what, blkio_get_error_msg());
    exit(2);
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

/* Sum of the interrupt counts of the NVMe I/O queues (nvme0q1, nvme0q2, ...; q0 is the admin
 * queue), or -1 if there is no such line. Poll queues have no interrupt vector. */
static long long nvme_io_irqs(void)
{
    FILE *f = fopen("/proc/interrupts", "r");
    if (!f) return -1;
    char line[1024];
    long long sum = 0;
    int found = 0;
    while (fgets(line, sizeof(line), f)) {
        char *q = strstr(line, "nvme0q");
        if (!q || (q[6] == '0' && !isdigit((unsigned char)q[7]))) continue;
        char *p = strchr(line, ':');
        if (!p) continue;
        p++;
        found = 1;
        for (;;) {
            char *end;
            while (*p == ' ') p++;
            if (!isdigit((unsigned char)*p)) break;
            sum += strtoll(p, &end, 10);
            p = end;
        }
    }
    fclose(f);
    return found ? sum : -1;
}

/* Pattern: every 512-byte sector starts with its device offset and the seed, then bytes
 * derived from both, so misplaced or stale sectors are caught. */
static void fill(uint8_t *buf, size_t len, uint64_t off, uint32_t seed)
{
    for (size_t s = 0; s < len; s += 512) {
        uint64_t hdr[2] = { off + s, seed };
        memcpy(buf + s, hdr, sizeof(hdr));
        for (size_t i = sizeof(hdr); i < 512; i++)
            buf[s + i] = (uint8_t)((off + s) / 512 * 31 + seed * 7 + i);
    }
}

struct ctx {
    struct blkio *b;
    uint8_t *region;      /* registered (mapped) memory: the fixed-buffer path */
    uint8_t *plain;       /* plain aligned memory: the general path */
    uint8_t *check;       /* expected data */
    size_t area;          /* bytes per buffer */
};

static struct blkio_completion cs[64];

/* Wait for n completions: min_completions == n in one call, or spinning with 0. Fills cs. */
static int reap(struct blkioq *q, int n, int spin, long *calls)
{
    int got = 0;
    double t0 = now();
    *calls = 0;
    memset(cs, 0xff, sizeof(cs));
    while (got < n) {
        int r = blkioq_do_io(q, cs + got, spin ? 0 : n - got, n - got, NULL);
        (*calls)++;
        if (r < 0) { printf("do_io: %d %s\n", r, blkio_get_error_msg()); return r; }
        got += r;
        if (spin && now() - t0 > 20) { printf("spin: no progress after 20 s (%d/%d)\n", got, n); return -ETIME; }
    }
    return got;
}

static int all_ok(int n)
{
    uint64_t seen = 0;
    for (int i = 0; i < n; i++) {
        uintptr_t ud = (uintptr_t)cs[i].user_data;
        if (cs[i].ret != 0 || cs[i].error_msg != NULL || ud >= 64 || (seen >> ud & 1)) {
            printf("completion %d: ret %d user_data %p msg %s\n", i, cs[i].ret, cs[i].user_data,
                   cs[i].error_msg ? cs[i].error_msg : "(null)");
            return 0;
        }
        seen |= 1ull << ud;
    }
    return 1;
}

/* Queue qd requests of len bytes at base + k*len from buf (write or read, single or 4-segment
 * vectors). */
static void queue_io(struct blkioq *q, int write, uint64_t base, uint8_t *buf, size_t len, int qd,
                     int vec, struct iovec *iov)
{
    for (int k = 0; k < qd; k++) {
        uint8_t *p = buf + (size_t)k * len;
        uint64_t off = base + (uint64_t)k * len;
        void *ud = (void *)(uintptr_t)k;
        if (vec) {
            /* 4 segments of len/4 (4 KiB -> 1 KiB: still sector-aligned) */
            struct iovec *v = iov + 4 * k;
            for (int s = 0; s < 4; s++) { v[s].iov_base = p + s * (len / 4); v[s].iov_len = len / 4; }
            if (write) blkioq_writev(q, off, v, 4, ud, 0); else blkioq_readv(q, off, v, 4, ud, 0);
        } else {
            if (write) blkioq_write(q, off, p, len, ud, 0); else blkioq_read(q, off, p, len, ud, 0);
        }
    }
}

/* Write qd blocks of len at base through q, read them back through rq (fresh zeroed buffer),
 * compare. Returns 1 if everything matched. */
static int roundtrip(struct ctx *c, struct blkioq *q, struct blkioq *rq, uint64_t base, size_t len,
                     int qd, int registered, int vec, int spin, uint32_t seed, long *spins)
{
    static struct iovec iov[4 * 64];
    uint8_t *buf = registered ? c->region : c->plain;
    long calls;
    for (int k = 0; k < qd; k++) fill(buf + (size_t)k * len, len, base + (uint64_t)k * len, seed);
    memcpy(c->check, buf, (size_t)qd * len);
    queue_io(q, 1, base, buf, len, qd, vec, iov);
    if (reap(q, qd, spin, &calls) != qd || !all_ok(qd)) return 0;
    *spins += calls;
    memset(buf, 0, (size_t)qd * len);
    queue_io(rq, 0, base, buf, len, qd, vec, iov);
    if (reap(rq, qd, spin, &calls) != qd || !all_ok(qd)) return 0;
    *spins += calls;
    if (memcmp(buf, c->check, (size_t)qd * len) != 0) { printf("data mismatch at base %" PRIu64 "\n", base); return 0; }
    return 1;
}

static struct blkio *open_dev(const char *path, int direct)
{
    struct blkio *b = NULL;
    if (blkio_create("io_uring", &b) < 0) die("blkio_create");
    if (blkio_set_str(b, "path", path) < 0 || blkio_set_bool(b, "direct", direct) < 0) die("set path/direct");
    if (blkio_connect(b) < 0) die("blkio_connect");
    return b;
}

static void nvme(const char *dev)
{
    bool bo = false;
    int i = 0;
    uint64_t cap = 0;
    char name[200];

    /* buffered: no polling (IOPOLL needs O_DIRECT) -> start refuses the poll queue */
    tag = "nvme buffered: ";
    struct blkio *b = open_dev(dev, 0);
    CHECK("supports-poll-queues false", blkio_get_bool(b, "supports-poll-queues", &bo) == 0 && !bo);
    CHECK("num-poll-queues=1", blkio_set_int(b, "num-poll-queues", 1) == 0);
    ERR("start fails EINVAL", blkio_start(b), EINVAL, "Poll queues not supported");
    blkio_destroy(&b);

    tag = "nvme direct: ";
    b = open_dev(dev, 1);
    CHECK("supports-poll-queues true", blkio_get_bool(b, "supports-poll-queues", &bo) == 0 && bo);
    CHECK("request-alignment 512", blkio_get_int(b, "request-alignment", &i) == 0 && i == 512);
    CHECK("capacity >= 64 MiB", blkio_get_uint64(b, "capacity", &cap) == 0 && cap >= 64 << 20);
    CHECK("num-queues=1 num-poll-queues=1", blkio_set_int(b, "num-queues", 1) == 0 &&
          blkio_set_int(b, "num-poll-queues", 1) == 0);
    if (blkio_start(b) < 0) die("blkio_start with a poll queue");
    struct blkioq *q = blkio_get_queue(b, 0), *p = blkio_get_poll_queue(b, 0);
    CHECK("get_poll_queue(0) != NULL, distinct from queue 0", p && q && p != q);
    CHECK("get_poll_queue(1) == NULL", blkio_get_poll_queue(b, 1) == NULL);
    CHECK("poll queue completion fd is -1", blkioq_get_completion_fd(p) == -1);
    CHECK("regular queue completion fd >= 0", blkioq_get_completion_fd(q) >= 0);

    struct ctx c = { .b = b, .area = 16 * 65536 };
    struct blkio_mem_region r;
    if (blkio_alloc_mem_region(b, &r, c.area) < 0 || blkio_map_mem_region(b, &r) < 0) die("mem region");
    c.region = r.addr;
    if (posix_memalign((void **)&c.plain, 4096, c.area) || posix_memalign((void **)&c.check, 4096, c.area)) die("memalign");

    /* ---- polled: every combination, written and read back through the poll queue */
    long long irq0 = nvme_io_irqs();
    CHECK("nvme I/O queue interrupts readable in /proc/interrupts", irq0 >= 0);
    int polled_reqs = 0, polled_qd1 = 0;
    long spins = 0;
    uint64_t base = 0;
    static const size_t lens[] = { 4096, 65536 };
    static const int qds[] = { 1, 16 };
    uint32_t seed = 1;
    for (int qi = 0; qi < 2; qi++)
        for (int li = 0; li < 2; li++)
            for (int reg = 0; reg < 2; reg++)
                for (int vec = 0; vec < 2; vec++)
                    for (int spin = 0; spin < 2; spin++) {
                        int qd = qds[qi];
                        size_t len = lens[li];
                        snprintf(name, sizeof(name), "poll QD%d %zu KiB %s %s, min_completions %s: write+read back",
                                 qd, len / 1024, vec ? "writev/readv" : "write/read",
                                 reg ? "registered buffer" : "plain buffer", spin ? "0 (spinning)" : "> 0");
                        CHECK(name, roundtrip(&c, p, p, base, len, qd, reg, vec, spin, seed++, &spins));
                        polled_reqs += 2 * qd;
                        if (qd == 1) polled_qd1 += 2;
                        base += (uint64_t)qd * len;
                    }
    long long irq1 = nvme_io_irqs();
    printf("INFO: %d polled requests (%d at QD1), %lld NVMe I/O queue interrupts, %ld do_io calls\n",
           polled_reqs, polled_qd1, irq1 - irq0, spins);
    /* An interrupt-driven ring takes about one interrupt per QD1 request (QD16 batches share
     * interrupts): polled I/O must take (almost) none. */
    snprintf(name, sizeof(name), "polled I/O raised no NVMe I/O interrupts (%lld for %d requests, %d at QD1)",
             irq1 - irq0, polled_reqs, polled_qd1);
    CHECK(name, irq0 >= 0 && (irq1 - irq0) * 16 < polled_qd1);

    /* ---- control: QD1 I/O on the regular queue must raise interrupts (the counter works) */
    tag = "nvme direct regular queue: ";
    int ok = 1;
    for (int k = 0; k < 32 && ok; k++) {
        ok = roundtrip(&c, q, q, base, 4096, 1, k & 1, 0, 0, seed++, &spins);
        base += 4096;
    }
    CHECK("32 x QD1 4 KiB write+read back", ok);
    long long irq2 = nvme_io_irqs();
    printf("INFO: 64 QD1 regular-queue requests, %lld NVMe I/O queue interrupts\n", irq2 - irq1);
    snprintf(name, sizeof(name), "regular-queue QD1 I/O raised interrupts (%lld for 64 requests): the counter works",
             irq2 - irq1);
    CHECK(name, (irq2 - irq1) * 2 >= 64);
    long long irq2b = irq2;
    CHECK("QD16 4 KiB write+read back", roundtrip(&c, q, q, base, 4096, 16, 1, 0, 0, seed++, &spins));
    base += 16 * 4096;
    irq2 = nvme_io_irqs();
    printf("INFO: 32 QD16 regular-queue requests, %lld NVMe I/O queue interrupts\n", irq2 - irq2b);

    /* ---- across queues: written polled, read on the regular queue and the other way round */
    tag = "nvme direct: ";
    CHECK("write on poll queue, read back on regular queue (QD16 64 KiB)",
          roundtrip(&c, p, q, base, 65536, 16, 1, 0, 0, seed++, &spins));
    base += 16 * 65536;
    CHECK("write on regular queue, read back on poll queue (QD16 64 KiB writev)",
          roundtrip(&c, q, p, base, 65536, 16, 0, 1, 1, seed++, &spins));
    base += 16 * 65536;

    /* ---- FUA write on the poll queue (RWF_DSYNC), then read back */
    long calls;
    fill(c.region, 4096, base, seed);
    memcpy(c.check, c.region, 4096);
    blkioq_write(p, base, c.region, 4096, (void *)0, BLKIO_REQ_FUA);
    CHECK("FUA write on poll queue", reap(p, 1, 0, &calls) == 1 && all_ok(1));
    memset(c.region, 0, 4096);
    blkioq_read(p, base, c.region, 4096, (void *)0, 0);
    CHECK("FUA write reads back", reap(p, 1, 1, &calls) == 1 && all_ok(1) && memcmp(c.region, c.check, 4096) == 0);
    base += 4096;

    /* ---- flush: not a polled operation; the spec's ENOTSUP on the poll queue, works on the
     * regular queue of the same device */
    static const char *nosup = "request not supported on poll queues for this driver";
    blkioq_flush(p, (void *)0, 0);
    CHECK("flush on poll queue -> ENOTSUP with message",
          reap(p, 1, 0, &calls) == 1 && cs[0].ret == -ENOTSUP && cs[0].error_msg && strcmp(cs[0].error_msg, nosup) == 0);
    blkioq_write_zeroes(p, base, 4096, (void *)0, 0);
    CHECK("write_zeroes on poll queue -> ENOTSUP",
          reap(p, 1, 0, &calls) == 1 && cs[0].ret == -ENOTSUP && cs[0].error_msg && strcmp(cs[0].error_msg, nosup) == 0);
    blkioq_discard(p, base, 4096, (void *)0, 0);
    CHECK("discard on poll queue -> ENOTSUP",
          reap(p, 1, 0, &calls) == 1 && cs[0].ret == -ENOTSUP && cs[0].error_msg && strcmp(cs[0].error_msg, nosup) == 0);
    blkioq_flush(q, (void *)0, 0);
    CHECK("flush on regular queue after polled writes", reap(q, 1, 1, &calls) == 1 && all_ok(1));
    sigset_t none;
    sigemptyset(&none);
    ERR("do_io_interruptible on poll queue -> ENOTSUP",
        blkioq_do_io_interruptible(p, cs, 0, 1, NULL, &none), ENOTSUP,
        "blkioq_do_io_interruptible() is not supported on poll queues");
    ERR("min_completions > outstanding on poll queue -> EINVAL", blkioq_do_io(p, cs, 1, 1, NULL), EINVAL,
        "min_completions is larger than total outstanding requests");
    CHECK("do_io(min 0) with nothing outstanding returns 0", blkioq_do_io(p, cs, 0, 1, NULL) == 0);

    /* ---- a read across the end: the first (polled) read is short, the resubmitted rest
     * reads 0 bytes -> EIO on a block device */
    blkioq_read(p, cap - 4096, c.region, 8192, (void *)0, 0);
    CHECK("read across the end on poll queue -> EIO", reap(p, 1, 1, &calls) == 1 && cs[0].ret == -EIO);

    /* ---- dynamically added poll queue */
    int idx = blkio_add_poll_queue(b);
    CHECK("add_poll_queue -> 1", idx == 1);
    struct blkioq *p1 = blkio_get_poll_queue(b, 1);
    CHECK("added poll queue: completion fd -1", p1 && blkioq_get_completion_fd(p1) == -1);
    irq2 = nvme_io_irqs();
    if (p1) {
        CHECK("added poll queue: QD16 4 KiB round trip",
              roundtrip(&c, p1, p1, base, 4096, 16, 1, 0, 1, seed++, &spins));
        base += 16 * 4096;
    }
    long long irq3 = nvme_io_irqs();
    snprintf(name, sizeof(name), "added poll queue I/O raised no interrupts (%lld)", irq3 - irq2);
    CHECK(name, irq3 - irq2 <= 1);
    CHECK("remove_poll_queue(1)", blkio_remove_poll_queue(b, 1) == 0 && blkio_get_poll_queue(b, 1) == NULL);
    ERR("remove_poll_queue(1) again", blkio_remove_poll_queue(b, 1), ENOENT, "no queue with index 1");

    /* ---- QD1 4 KiB read latency, polled vs interrupt (information only: TCG-emulated) */
    for (int pass = 0; pass < 2; pass++) {
        struct blkioq *t = pass ? q : p;
        const int n = 256;
        double t0 = now();
        ok = 1;
        for (int k = 0; k < n && ok; k++) {
            blkioq_read(t, (uint64_t)(k % 64) * 4096, c.region, 4096, (void *)0, 0);
            ok = reap(t, 1, 0, &calls) == 1 && cs[0].ret == 0;
        }
        printf("INFO: QD1 4 KiB O_DIRECT read on the %s queue: %.1f us/read (%d reads, TCG guest)\n",
               pass ? "regular" : "poll", (now() - t0) / n * 1e6, n);
        CHECK(pass ? "QD1 latency loop (regular)" : "QD1 latency loop (poll)", ok);
    }

    blkio_unmap_mem_region(b, &r);
    blkio_free_mem_region(b, &r);
    free(c.plain);
    free(c.check);
    blkio_destroy(&b);
}

static void nopoll(const char *path)
{
    bool bo = true;
    char t[300];
    snprintf(t, sizeof(t), "no polling (%s): ", path);
    tag = t;
    struct blkio *b = open_dev(path, 1);
    CHECK("O_DIRECT supports-poll-queues false", blkio_get_bool(b, "supports-poll-queues", &bo) == 0 && !bo);
    CHECK("num-poll-queues=1 accepted while connected", blkio_set_int(b, "num-poll-queues", 1) == 0);
    ERR("blkio_start fails EINVAL", blkio_start(b), EINVAL, "Poll queues not supported");
    CHECK("no poll queue after the failed start", blkio_get_poll_queue(b, 0) == NULL && blkio_get_queue(b, 0) == NULL);
    CHECK("num-poll-queues=0 then start", blkio_set_int(b, "num-poll-queues", 0) == 0 && blkio_start(b) == 0);
    ERR("add_poll_queue fails EINVAL", blkio_add_poll_queue(b), EINVAL, "Poll queues not supported");
    struct blkioq *q = blkio_get_queue(b, 0);
    uint8_t *buf, *chk;
    if (!q || posix_memalign((void **)&buf, 4096, 4096) || posix_memalign((void **)&chk, 4096, 4096)) die("queue/memalign");
    long calls;
    fill(buf, 4096, 0, 99);
    memcpy(chk, buf, 4096);
    blkioq_write(q, 0, buf, 4096, (void *)0, 0);
    int ok = reap(q, 1, 0, &calls) == 1 && all_ok(1);
    memset(buf, 0, 4096);
    blkioq_read(q, 0, buf, 4096, (void *)0, 0);
    ok = ok && reap(q, 1, 0, &calls) == 1 && all_ok(1) && memcmp(buf, chk, 4096) == 0;
    CHECK("regular queue O_DIRECT round trip still works", ok);
    free(buf);
    free(chk);
    blkio_destroy(&b);
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "nvme") == 0) nvme(argv[2]);
    else if (argc == 3 && strcmp(argv[1], "nopoll") == 0) nopoll(argv[2]);
    else { fprintf(stderr, "usage: poll_test nvme DEV | poll_test nopoll PATH\n"); return 2; }
    printf("poll_test: %d passed, %d failed\n", passes, fails);
    return fails ? 1 : 0;
}
