/* An I/O error of the disk reaches a libblkio C client as -EIO: snapblk's test-only `fault`
 * driver (built with the fault-injection feature, tests/suites/capi-faults.sh) is a zero-filled
 * in-memory disk whose reads touching [bad-offset, bad-offset + bad-length) fail. Requests that
 * touch the bad range complete with -EIO, the others with their data, on one queue.
 * snapblk's own driver, so this test is not run against the real libblkio.
 * usage: fault_test            (against the fault-injection build)
 *        fault_test --absent   (against the shipped build: blkio_create("fault") is -ENOENT) */
#include <blkio.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

static int passes, fails;
static void check(const char *name, int ok)
{
    printf("%s %s%s%s\n", ok ? "PASS" : "FAIL", name, ok ? "" : " msg=", ok ? "" : blkio_get_error_msg());
    if (ok) passes++; else fails++;
}

#define SIZE (4u << 20)
#define BAD ((1u << 20) + 8192)

static char buf[65536];

static int do_one(struct blkioq *q, int write, unsigned long long off, size_t len)
{
    struct blkio_completion c;
    if (write) blkioq_write(q, off, buf, len, NULL, 0);
    else blkioq_read(q, off, buf, len, NULL, 0);
    if (blkioq_do_io(q, &c, 1, 1, NULL) != 1) return -9999;
    return c.ret;
}

int main(int argc, char **argv)
{
    struct blkio *b = NULL;
    if (argc == 2 && strcmp(argv[1], "--absent") == 0) {
        /* The shipped library has no fault driver. */
        check("the shipped library has no fault driver", blkio_create("fault", &b) == -ENOENT);
        printf("%d passed, %d failed\n", passes, fails);
        return fails != 0;
    }
    if (blkio_create("fault", &b) < 0 || blkio_set_uint64(b, "size", SIZE) < 0 ||
        blkio_set_uint64(b, "bad-offset", BAD) < 0 || blkio_set_uint64(b, "bad-length", 512) < 0 ||
        blkio_connect(b) < 0 || blkio_start(b) < 0) {
        printf("FAIL open the fault driver: %s\n", blkio_get_error_msg());
        return 1;
    }
    struct blkioq *q = blkio_get_queue(b, 0);
    memset(buf, 0x5a, 4096);
    check("write next to the bad range", do_one(q, 1, BAD - 4096 - 8192, 4096) == 0);
    memset(buf, 0, 4096);
    check("read back next to the bad range", do_one(q, 0, BAD - 4096 - 8192, 4096) == 0 &&
          buf[0] == 0x5a && buf[4095] == 0x5a);
    check("read covering the bad range completes with -EIO", do_one(q, 0, BAD - 4096, 65536) == -EIO);
    check("read of the bad sector completes with -EIO", do_one(q, 0, BAD, 512) == -EIO);
    check("read of the bad sector, again, -EIO", do_one(q, 0, BAD, 4096) == -EIO);
    check("read after the errors succeeds", do_one(q, 0, 3u << 20, 4096) == 0 && buf[0] == 0);
    /* Several requests in one batch: only the one touching the bad range fails. */
    static char a[4096], c2[4096], d[4096];
    blkioq_read(q, 0, a, 4096, (void *)1, 0);
    blkioq_read(q, BAD, c2, 4096, (void *)2, 0);
    blkioq_read(q, 2u << 20, d, 4096, (void *)3, 0);
    struct blkio_completion cs[3];
    int n = blkioq_do_io(q, cs, 3, 3, NULL);
    int ok = n == 3;
    for (int i = 0; ok && i < 3; i++)
        ok = cs[i].ret == ((long)cs[i].user_data == 2 ? -EIO : 0);
    check("a batch fails only the request touching the bad range", ok);
    blkio_destroy(&b);
    printf("%d passed, %d failed\n", passes, fails);
    return fails != 0;
}
