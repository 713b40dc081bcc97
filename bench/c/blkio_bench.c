/*
 * 4 KiB random-read load generator over the libblkio API (io_uring driver), for
 * bench/libblkio-bench.sh: runs against whichever libblkio.so.1 LD_LIBRARY_PATH selects.
 * Usage: blkio_bench PATH QD SECONDS DIRECT(0|1)   -> prints "iops=N ios=N"
 */
#define _GNU_SOURCE
#include <blkio.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static uint64_t rnd(uint64_t *s)
{
    *s ^= *s << 13; *s ^= *s >> 7; *s ^= *s << 17;
    return *s;
}

#define DIE(what) do { fprintf(stderr, "%s: %s\n", what, blkio_get_error_msg()); return 1; } while (0)

int main(int argc, char **argv)
{
    if (argc < 5) { fprintf(stderr, "usage: %s PATH QD SECONDS DIRECT\n", argv[0]); return 2; }
    int qd = atoi(argv[2]);
    double secs = atof(argv[3]);
    struct blkio *b;
    if (blkio_create("io_uring", &b) < 0) DIE("create");
    if (blkio_set_str(b, "path", argv[1]) < 0) DIE("path");
    if (blkio_set_bool(b, "direct", atoi(argv[4]) != 0) < 0) DIE("direct");
    if (blkio_connect(b) < 0) DIE("connect");
    if (blkio_start(b) < 0) DIE("start");
    uint64_t cap;
    if (blkio_get_uint64(b, "capacity", &cap) < 0) DIE("capacity");
    struct blkio_mem_region r;
    if (blkio_alloc_mem_region(b, &r, (size_t)qd * 4096) < 0) DIE("alloc");
    if (blkio_map_mem_region(b, &r) < 0) DIE("map");
    struct blkioq *q = blkio_get_queue(b, 0);
    struct blkio_completion *cs = calloc(qd, sizeof(*cs));
    uint64_t seed = 0x9e3779b97f4a7c15ULL, blocks = cap / 4096, done = 0;
    for (long i = 0; i < qd; i++)
        blkioq_read(q, (rnd(&seed) % blocks) * 4096, (char *)r.addr + i * 4096, 4096, (void *)i, 0);
    double t0 = now(), t1 = t0;
    while (1) {
        int n = blkioq_do_io(q, cs, 1, qd, NULL);
        if (n < 0) DIE("do_io");
        for (int i = 0; i < n; i++) {
            if (cs[i].ret != 0) { fprintf(stderr, "I/O error %d\n", cs[i].ret); return 1; }
            long slot = (long)cs[i].user_data;
            blkioq_read(q, (rnd(&seed) % blocks) * 4096, (char *)r.addr + slot * 4096, 4096, (void *)slot, 0);
        }
        done += n;
        if ((done & 1023) < (uint64_t)n && (t1 = now()) - t0 >= secs) break;
    }
    printf("iops=%.0f ios=%llu\n", done / (t1 - t0), (unsigned long long)done);
    blkio_destroy(&b);
    return 0;
}
