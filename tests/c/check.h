/*
 * Shared by the C driver tests that compare snapblk's libblkio.so.1 with the real libblkio 1.5
 * (vhost_user_test.c, vdpa_test.c, vfio_test.c), and remote_test.c (snapblk's own s3/http
 * drivers): one "PASS|FAIL [fix] name (line N)" line per
 * check, counted in passes/fails; [fix] marks a documented difference the real library fails.
 * A file may define PROP_PATH_LABEL (the word printed instead of the "path" property's value,
 * which differs between runs) before including this header.
 */
#ifndef SNAPBLK_TESTS_CHECK_H
#define SNAPBLK_TESTS_CHECK_H

#include <blkio.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>

#ifndef PROP_PATH_LABEL
#define PROP_PATH_LABEL "PATH"
#endif

static int passes, fails;

static inline void check(const char *name, int ok, int fix, int line)
{
    printf("%s %s%s (line %d)%s%s\n", ok ? "PASS" : "FAIL", fix ? "[fix] " : "", name, line,
           ok ? "" : " msg=", ok ? "" : blkio_get_error_msg());
    if (ok) passes++; else fails++;
}
#define CHECK(name, cond) check(name, !!(cond), 0, __LINE__)
#define FIX(name, cond) check(name, !!(cond), 1, __LINE__)
#define MSG_IS(m) (strcmp(blkio_get_error_msg(), (m)) == 0)
#define ERR(name, expr, err, msg) do { int rc_ = (expr); \
    check(name, rc_ == -(err) && MSG_IS(msg), 0, __LINE__); } while (0)

/* Property `name` formatted as a string equals `want` ("ENODEV" etc. for an error). */
static inline void prop(struct blkio *b, const char *state, const char *name, const char *want)
{
    char *v = NULL, label[160];
    int rc = blkio_get_str(b, name, &v);
    const char *got = rc == 0 ? v : rc == -ENODEV ? "ENODEV" : rc == -ENOENT ? "ENOENT" : "error";
    snprintf(label, sizeof(label), "%s: %s = %s", state, name,
             strcmp(name, "path") == 0 && want[0] ? PROP_PATH_LABEL : want);
    check(label, strcmp(got, want) == 0, 0, __LINE__);
    if (strcmp(got, want) != 0) printf("  got %s\n", got);
    free(v);
}

/* Submit and wait up to `secs` for one completion; ret -99999 on a timeout. */
static inline struct blkio_completion wait1(struct blkioq *q, int secs)
{
    struct blkio_completion c;
    memset(&c, 0, sizeof(c));
    struct timespec t = { secs, 0 };
    int n = blkioq_do_io(q, &c, 1, 1, &t);
    if (n != 1) c.ret = n < 0 ? n - 100000 : -99999;
    return c;
}

static inline const char *cmsg(struct blkio_completion c) { return c.error_msg ? c.error_msg : ""; }

/* The I/O checks every virtio-blk driver test runs on its started instance (64 MiB device):
 * regular queue q, poll queue pq, m a mapped region of at least 512 KiB. Leaves 64 KiB of 0xab
 * at offset 0 and 0x5c at 1 MiB on the device (and in m at 0 and 64 KiB). */
static inline void virtio_io_checks(struct blkioq *q, struct blkioq *pq, unsigned char *m)
{
    struct blkio_completion c;
    blkioq_write(q, 0, m, 65536, NULL, 0);
    c = wait1(q, 10);
    CHECK("write 64 KiB", c.ret == 0);
    blkioq_write(q, 1 << 20, m + 65536, 65536, NULL, BLKIO_REQ_FUA);
    c = wait1(q, 10);
    CHECK("write 64 KiB FUA", c.ret == 0);
    memset(m + 131072, 0, 65536);
    blkioq_read(q, 0, m + 131072, 65536, NULL, 0);
    c = wait1(q, 10);
    CHECK("read 64 KiB", c.ret == 0 && memcmp(m, m + 131072, 65536) == 0);
    blkioq_read(q, 1, m + 131072, 512, NULL, 0);
    c = wait1(q, 10);
    CHECK("read at start 1 fails with EINVAL", c.ret == -EINVAL && strcmp(cmsg(c), "invalid start offset") == 0);
    blkioq_read(q, 0, m + 131072, 100, NULL, 0);
    c = wait1(q, 10);
    FIX("read of 100 bytes refused with EINVAL (not sent to the device)", c.ret == -EINVAL);
    blkioq_read(q, 67108864, m + 131072, 512, NULL, 0);
    c = wait1(q, 10);
    CHECK("read at capacity fails with EIO", c.ret == -EIO);
    blkioq_flush(q, NULL, 0);
    CHECK("flush", wait1(q, 10).ret == 0);
    blkioq_discard(q, 8 << 20, 65536, NULL, 0);
    CHECK("discard 64 KiB", wait1(q, 10).ret == 0);
    blkioq_write_zeroes(q, 4 << 20, 65536, NULL, 0);
    CHECK("write-zeroes", wait1(q, 10).ret == 0);
    blkioq_write_zeroes(q, 4 << 20, 65536, NULL, BLKIO_REQ_NO_UNMAP);
    CHECK("write-zeroes NO_UNMAP", wait1(q, 10).ret == 0);
    blkioq_write_zeroes(q, 4 << 20, 65536, NULL, BLKIO_REQ_FUA);
    CHECK("write-zeroes FUA", wait1(q, 10).ret == 0);
    struct iovec iov[3];
    for (int i = 0; i < 3; i++) { iov[i].iov_base = m + 262144 + i * 8192; iov[i].iov_len = 4096; }
    memset(m + 262144, 0, 3 * 8192);
    blkioq_readv(q, 1 << 20, iov, 3, NULL, 0);
    c = wait1(q, 10);
    int same = c.ret == 0;
    for (int i = 0; i < 3; i++) same = same && memcmp(iov[i].iov_base, m + 65536, 4096) == 0;
    CHECK("readv of 3 segments", same);
    struct blkio_completion two[2];
    ERR("min_completions above outstanding", blkioq_do_io(q, two, 1, 2, NULL), EINVAL,
        "min_completions is larger than total outstanding requests");
    blkioq_read(pq, 0, m + 393216, 4096, NULL, 0);
    c = wait1(pq, 10);
    CHECK("poll-queue read", c.ret == 0 && memcmp(m + 393216, m, 4096) == 0);
}

#endif
