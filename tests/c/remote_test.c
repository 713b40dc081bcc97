/* The read-only `s3` and `http` drivers through the libblkio C ABI only (tests/suites/s3.sh runs
 * it against radosgw): properties set with blkio_set_str, connect, start, reads through
 * blkioq_do_io and through the completion eventfd (an event loop's way, QEMU's way, and a batch
 * submitted with min_completions 0 and reaped as the fd fires), compared
 * with the object's bytes from a local copy; writes refused with -EBADF on the read-only device;
 * connect failures (wrong credentials, a missing object, a dead endpoint) with their errno and a
 * non-empty blkio_get_error_msg(). Credentials come from the AWS_* environment (the drivers
 * take them from nowhere else). snapblk's own drivers, so not run against the real libblkio.
 *
 * usage: remote_test read DRIVER FILE PROP=VALUE...
 *            FILE holds the object's bytes; every PROP=VALUE is set with blkio_set_str
 *        remote_test fail DRIVER ERRNO TEXT PROP=VALUE...
 *            blkio_connect must fail with -ERRNO (EACCES, ENOENT, EHOSTUNREACH, EINVAL, EIO)
 *            and a message containing TEXT
 * One "PASS|FAIL name (line N)" line per check, then "N passed, N failed". */
#include "check.h"
#include <poll.h>
#include <stdint.h>
#include <unistd.h>

static unsigned char *obj;    /* the object's bytes (FILE) */
static uint64_t obj_size;
static const char *driver;

static struct blkio *create_with(int argc, char **argv)
{
    struct blkio *b = NULL;
    if (blkio_create(driver, &b) < 0) {
        printf("FAIL blkio_create(\"%s\"): %s\n", driver, blkio_get_error_msg());
        exit(1);
    }
    for (int i = 0; i < argc; i++) {
        char *eq = strchr(argv[i], '=');
        if (!eq) { fprintf(stderr, "not PROP=VALUE: %s\n", argv[i]); exit(2); }
        *eq = '\0';
        int rc = blkio_set_str(b, argv[i], eq + 1);
        char label[200];
        snprintf(label, sizeof(label), "blkio_set_str(%s)", argv[i]);
        check(label, rc == 0, 0, __LINE__);
        *eq = '=';
    }
    return b;
}

static int errno_of(const char *name)
{
    static const struct { const char *n; int e; } t[] = {
        { "EACCES", EACCES }, { "ENOENT", ENOENT }, { "EHOSTUNREACH", EHOSTUNREACH },
        { "EINVAL", EINVAL }, { "EIO", EIO },
    };
    for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++)
        if (strcmp(t[i].n, name) == 0) return t[i].e;
    fprintf(stderr, "unknown errno name %s\n", name);
    exit(2);
}

static int fail_mode(const char *ename, const char *text, int argc, char **argv)
{
    struct blkio *b = create_with(argc, argv);
    int rc = blkio_connect(b);
    const char *m = blkio_get_error_msg();
    char label[300];
    snprintf(label, sizeof(label), "connect fails with -%s and a message with \"%s\"", ename, text);
    CHECK(label, rc == -errno_of(ename) && m && m[0] && strstr(m, text));
    printf("  rc=%d msg=%s\n", rc, m ? m : "(null)");
    uint64_t cap;
    CHECK("capacity after the failed connect: -ENODEV", blkio_get_uint64(b, "capacity", &cap) == -ENODEV);
    blkio_destroy(&b);
    CHECK("blkio_destroy clears the pointer", b == NULL);
    printf("%d passed, %d failed\n", passes, fails);
    return fails != 0;
}

/* One request, completed by blkioq_do_io waiting for it. */
static int one(struct blkioq *q, int op, uint64_t off, void *buf, size_t len)
{
    switch (op) {
    case 'r': blkioq_read(q, off, buf, len, NULL, 0); break;
    case 'w': blkioq_write(q, off, buf, len, NULL, 0); break;
    case 'd': blkioq_discard(q, off, len, NULL, 0); break;
    case 'z': blkioq_write_zeroes(q, off, len, NULL, 0); break;
    default: blkioq_flush(q, NULL, 0); break;
    }
    return wait1(q, 60).ret;
}

static int same(const unsigned char *buf, uint64_t off, size_t len)
{
    return off + len <= obj_size && memcmp(buf, obj + off, len) == 0;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next(void)
{
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return rng;
}

/* The "requests" and "hits" counters of the driver's `stats` property (JSON). */
static int stats(struct blkio *b, uint64_t *requests, uint64_t *hits)
{
    char *s = NULL;
    if (blkio_get_str(b, "stats", &s) < 0) return -1;
    const char *r = strstr(s, "\"requests\":"), *h = strstr(s, "\"hits\":");
    int ok = r && h;
    if (ok) {
        *requests = strtoull(r + 11, NULL, 10);
        *hits = strtoull(h + 7, NULL, 10);
    }
    free(s);
    return ok ? 0 : -1;
}

static int read_mode(int argc, char **argv)
{
    const size_t max = 1 << 20;
    unsigned char *buf = malloc(max), *buf2 = malloc(max);
    if (!buf || !buf2) return 2;
    struct blkio *b = create_with(argc, argv);
    for (int i = 0; i < argc; i++) {
        if (strncmp(argv[i], "url=", 4) != 0) continue;
        char *v = NULL;
        CHECK("created: url reads back as set", blkio_get_str(b, "url", &v) == 0 && strcmp(v, argv[i] + 4) == 0);
        free(v);
    }
    uint64_t cap = 0;
    ERR("created: capacity is ENODEV", blkio_get_uint64(b, "capacity", &cap), ENODEV, "Device must be connected");
    if (blkio_connect(b) < 0) {
        printf("FAIL blkio_connect: %s\n", blkio_get_error_msg());
        return 1;
    }
    CHECK("connected: capacity is the object's size", blkio_get_uint64(b, "capacity", &cap) == 0 && cap == obj_size);
    printf("  capacity %llu\n", (unsigned long long)cap);
    bool ro = false;
    CHECK("connected: read-only is true without asking", blkio_get_bool(b, "read-only", &ro) == 0 && ro);
    CHECK("connected: url can no longer be set", blkio_set_str(b, "url", "s3://other/key") < 0);
    CHECK("blkio_start", blkio_start(b) == 0);
    struct blkioq *q = blkio_get_queue(b, 0);
    CHECK("queue 0 exists", q != NULL);
    if (!q || cap != obj_size || obj_size < 3 * 65536) {
        printf("FAIL cannot go on (object of %llu bytes; at least 192 KiB wanted)\n", (unsigned long long)obj_size);
        printf("%d passed, %d failed\n", passes, fails);
        return 1;
    }

    /* Random ranges anywhere, any length up to 256 KiB, byte-granular (request-alignment 1). */
    int align = 0;
    CHECK("request-alignment is 1", blkio_get_int(b, "request-alignment", &align) == 0 && align == 1);
    int bad = -1;
    for (int i = 0; i < 64 && bad < 0; i++) {
        uint64_t off = next() % obj_size;
        size_t len = 1 + next() % (256 << 10);
        if (len > obj_size - off) len = obj_size - off;
        memset(buf, 0, len);
        int rc = one(q, 'r', off, buf, len);
        if (rc != 0 || !same(buf, off, len)) {
            bad = i;
            printf("  read %d: %zu bytes at %llu: ret %d\n", i, len, (unsigned long long)off, rc);
        }
    }
    CHECK("64 random range reads (1 B to 256 KiB, any offset) match the object", bad < 0);

    /* The whole object in 1 MiB reads, in order (the sequential, readahead path). */
    bad = 0;
    for (uint64_t off = 0; off < obj_size && !bad; off += max) {
        size_t len = obj_size - off < max ? obj_size - off : max;
        bad = one(q, 'r', off, buf, len) != 0 || !same(buf, off, len);
    }
    CHECK("the whole object read in 1 MiB reads matches", !bad);

    /* Served from the cache: the same 4 KiB twice adds a hit and no request. */
    uint64_t r0, h0, r1, h1;
    int ok = one(q, 'r', 4096, buf, 4096) == 0 && stats(b, &r0, &h0) == 0 &&
             one(q, 'r', 4096, buf, 4096) == 0 && stats(b, &r1, &h1) == 0;
    CHECK("stats: a repeated read is a cache hit, no request", ok && r1 == r0 && h1 > h0 && same(buf, 4096, 4096));

    /* readv: three segments. */
    struct iovec iov[3] = { { buf, 1000 }, { buf + 4096, 5000 }, { buf + 16384, 7 } };
    uint64_t voff = obj_size / 2 - 3000;
    blkioq_readv(q, voff, iov, 3, NULL, 0);
    struct blkio_completion c = wait1(q, 60);
    CHECK("readv of 3 segments matches", c.ret == 0 && same(buf, voff, 1000) &&
          same(buf + 4096, voff + 1000, 5000) && same(buf + 16384, voff + 6000, 7));

    /* Eight reads in one batch, told apart by user_data. */
    struct blkio_completion cs[8];
    for (int i = 0; i < 8; i++)
        blkioq_read(q, (uint64_t)i * 20000 + 7, buf + i * 65536, 65536, (void *)(intptr_t)(i + 1), 0);
    int n = blkioq_do_io(q, cs, 8, 8, NULL);
    ok = n == 8;
    int seen = 0;
    for (int i = 0; ok && i < 8; i++) {
        intptr_t k = (intptr_t)cs[i].user_data - 1;
        ok = cs[i].ret == 0 && k >= 0 && k < 8 && !(seen & (1 << k)) &&
             same(buf + k * 65536, (uint64_t)k * 20000 + 7, 65536);
        seen |= 1 << k;
    }
    CHECK("8 reads in one batch complete with their user_data and bytes", ok && seen == 0xff);

    /* The completion fd, as an event loop uses it: enqueue, wait for the fd, reap with min 0. */
    int fd = blkioq_get_completion_fd(q);
    CHECK("completion fd", fd >= 0);
    blkioq_set_completion_fd_enabled(q, true);
    struct pollfd p = { .fd = fd, .events = POLLIN };
    uint64_t v;
    /* The reads above left the counter set (nobody watched the fd): start from quiet. */
    while (poll(&p, 1, 0) == 1 && read(fd, &v, 8) == 8) {}
    CHECK("the drained fd is quiet", poll(&p, 1, 0) == 0);
    uint64_t eoff = obj_size - 65536 - 11;
    memset(buf2, 0, 65536);
    blkioq_read(q, eoff, buf2, 65536, (void *)42, 0);
    ok = poll(&p, 1, 10000) == 1 && read(fd, &v, 8) == 8;
    n = ok ? blkioq_do_io(q, cs, 0, 4, NULL) : -1;
    CHECK("eventfd readable after a read, then do_io(min 0) reaps it with its bytes",
          ok && n == 1 && cs[0].ret == 0 && cs[0].user_data == (void *)42 && same(buf2, eoff, 65536));

    /* QEMU's way: do_io(NULL, 0, 0) submits, the fd fires, do_io(min 0, max 1) until none. */
    CHECK("the fd is quiet again", poll(&p, 1, 0) == 0);
    memset(buf2, 0, 2 * 65536);
    blkioq_read(q, 12345, buf2, 65536, (void *)1, 0);
    blkioq_read(q, 99999, buf2 + 65536, 65536, (void *)2, 0);
    ok = blkioq_do_io(q, NULL, 0, 0, NULL) == 0;
    int got = 0, rets = 0;
    while (ok && got < 2) {
        /* The reads complete on the driver's threads: wait for the fd again until both are in. */
        if (poll(&p, 1, 30000) != 1 || read(fd, &v, 8) != 8) { ok = 0; break; }
        while (got < 3 && blkioq_do_io(q, &cs[got], 0, 1, NULL) == 1) {
            rets |= cs[got].ret;
            got++;
        }
    }
    CHECK("QEMU-style submit, eventfd, reap one at a time: both reads with their bytes",
          ok && got == 2 && rets == 0 && same(buf2, 12345, 65536) && same(buf2 + 65536, 99999, 65536));
    /* The fd may still hold a wakeup for a completion the loop already reaped: drain it. */
    while (poll(&p, 1, 0) == 1 && read(fd, &v, 8) == 8) {}
    CHECK("nothing left over: do_io(min 0) finds nothing", blkioq_do_io(q, cs, 0, 4, NULL) == 0);

    /* Asynchronous submission: 16 reads at scattered offsets handed over by do_io(min 0), which
     * returns without waiting for HTTP (a read the cache cannot serve is fetched by a worker);
     * the completion fd brings the rest in, as an event loop sees them. */
    enum { NA = 16 };
    struct blkio_completion ca[NA];
    uint64_t aoff[NA];
    memset(buf, 0, NA * 65536);
    for (int i = 0; i < NA; i++) {
        aoff[i] = next() % (obj_size - 65536);
        blkioq_read(q, aoff[i], buf + i * 65536, 65536, (void *)(intptr_t)(100 + i), 0);
    }
    got = blkioq_do_io(q, ca, 0, NA, NULL);
    ok = got >= 0;
    printf("  do_io(min 0) right after submitting %d reads returned %d\n", NA, got);
    while (ok && got < NA) {
        if (poll(&p, 1, 30000) != 1 || read(fd, &v, 8) != 8) { ok = 0; break; }
        n = blkioq_do_io(q, ca + got, 0, NA - got, NULL);
        if (n < 0) { ok = 0; break; }
        got += n;
    }
    seen = 0;
    for (int i = 0; ok && i < NA; i++) {
        intptr_t k = (intptr_t)ca[i].user_data - 100;
        ok = ca[i].ret == 0 && k >= 0 && k < NA && !(seen & (1 << k)) &&
             same(buf + k * 65536, aoff[k], 65536);
        seen |= 1 << k;
    }
    CHECK("16 reads submitted with do_io(min 0), reaped as the completion fd fires, match the object",
          ok && got == NA && seen == (1 << NA) - 1);
    while (poll(&p, 1, 0) == 1 && read(fd, &v, 8) == 8) {}
    CHECK("all reaped: do_io(min 0) finds nothing", blkioq_do_io(q, ca, 0, NA, NULL) == 0);

    /* Past the end, as a file driver's short read: -EIO. */
    CHECK("a read crossing the end fails with -EIO", one(q, 'r', obj_size - 100, buf, 4096) == -EIO);
    CHECK("a read at the capacity fails with -EIO", one(q, 'r', obj_size, buf, 512) == -EIO);

    /* Read-only: writes, discards and write-zeroes refused with -EBADF (libblkio's errno for a
     * read-only device), a flush succeeds, and the queue goes on reading. */
    memset(buf, 0x5a, 4096);
    CHECK("write refused with -EBADF", one(q, 'w', 0, buf, 4096) == -EBADF);
    CHECK("discard refused with -EBADF", one(q, 'd', 0, NULL, 4096) == -EBADF);
    CHECK("write-zeroes refused with -EBADF", one(q, 'z', 0, NULL, 4096) == -EBADF);
    CHECK("flush succeeds (nothing to flush)", one(q, 'f', 0, NULL, 0) == 0);
    CHECK("reads go on after the refusals", one(q, 'r', 0, buf, 4096) == 0 && same(buf, 0, 4096));

    blkio_destroy(&b);
    CHECK("blkio_destroy clears the pointer", b == NULL);
    free(buf);
    free(buf2);
    printf("%d passed, %d failed\n", passes, fails);
    return fails != 0;
}

int main(int argc, char **argv)
{
    if (argc >= 4 && strcmp(argv[1], "read") == 0) {
        driver = argv[2];
        FILE *f = fopen(argv[3], "rb");
        if (!f || fseek(f, 0, SEEK_END) != 0) { perror(argv[3]); return 2; }
        obj_size = (uint64_t)ftell(f);
        rewind(f);
        obj = malloc(obj_size ? obj_size : 1);
        if (!obj || fread(obj, 1, obj_size, f) != obj_size) { perror(argv[3]); return 2; }
        fclose(f);
        return read_mode(argc - 4, argv + 4);
    }
    if (argc >= 5 && strcmp(argv[1], "fail") == 0) {
        driver = argv[2];
        return fail_mode(argv[3], argv[4], argc - 5, argv + 5);
    }
    fprintf(stderr, "usage: %s read DRIVER FILE PROP=VALUE... | fail DRIVER ERRNO TEXT PROP=VALUE...\n", argv[0]);
    return 2;
}
