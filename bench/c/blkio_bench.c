/*
 * 4 KiB random-read load generator over the libblkio API (io_uring driver, or the driver
 * BLKIO_DRIVER names, e.g. virtio-blk-vhost-user with PATH a socket), for
 * bench/libblkio-bench.sh and bench/vhost-user-bench.sh: runs against whichever libblkio.so.1
 * LD_LIBRARY_PATH selects.
 * Usage: blkio_bench PATH QD SECONDS DIRECT(0|1) [INLINE(0|1)]   (DIRECT: io_uring only)
 *   -> prints "iops=N ios=N nowait=B iowq=N iowq_ms=N cpu_ns_per_io=N"
 * INLINE=0 sets snapblk's `inline-qd1` property to false (ring only); without the argument the
 * library's default is used (real libblkio has no such property). nowait is snapblk's `nowait`
 * property (the target's RWF_NOWAIT support; "na" for real libblkio). iowq counts this
 * process's io-wq worker threads (iou-wrk-*) at the end of the run: the kernel threads that
 * io_uring punts requests to when the target cannot do them without blocking; iowq_ms is the
 * CPU time they used (user + system, clock-tick resolution). Connect-time probes may start a
 * worker too, hence the CPU time.
 */
#define _GNU_SOURCE
#include <blkio.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

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

/* Threads of this process whose name starts with "iou-wrk"; their CPU time in *ms. */
static int count_iowq(long *ms)
{
    long ticks = 0, hz = sysconf(_SC_CLK_TCK);
    *ms = 0;
    DIR *d = opendir("/proc/self/task");
    if (!d) return -1;
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char path[300], comm[64] = "";
        snprintf(path, sizeof(path), "/proc/self/task/%s/comm", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        int wrk = fgets(comm, sizeof(comm), f) && strncmp(comm, "iou-wrk", 7) == 0;
        fclose(f);
        if (!wrk) continue;
        n++;
        char stat[1024] = "";
        snprintf(path, sizeof(path), "/proc/self/task/%s/stat", e->d_name);
        if (!(f = fopen(path, "r"))) continue;
        if (fgets(stat, sizeof(stat), f)) {
            /* utime and stime are fields 14 and 15; the name (field 2) is in parentheses. */
            char *p = strrchr(stat, ')');
            unsigned long ut, st;
            if (p && sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) == 2)
                ticks += ut + st;
        }
        fclose(f);
    }
    closedir(d);
    *ms = hz > 0 ? ticks * 1000 / hz : -1;
    return n;
}

#define DIE(what) do { fprintf(stderr, "%s: %s\n", what, blkio_get_error_msg()); return 1; } while (0)

int main(int argc, char **argv)
{
    if (argc < 5) { fprintf(stderr, "usage: %s PATH QD SECONDS DIRECT [INLINE]\n", argv[0]); return 2; }
    int qd = atoi(argv[2]);
    double secs = atof(argv[3]);
    struct blkio *b;
    const char *drv = getenv("BLKIO_DRIVER") ? getenv("BLKIO_DRIVER") : "io_uring";
    if (blkio_create(drv, &b) < 0) DIE("create");
    if (blkio_set_str(b, "path", argv[1]) < 0) DIE("path");
    if (strcmp(drv, "io_uring") == 0 && blkio_set_bool(b, "direct", atoi(argv[4]) != 0) < 0) DIE("direct");
    if (argc > 5 && blkio_set_bool(b, "inline-qd1", atoi(argv[5]) != 0) < 0) DIE("inline-qd1");
    if (blkio_connect(b) < 0) DIE("connect");
    bool nowait;
    const char *nw = blkio_get_bool(b, "nowait", &nowait) < 0 ? "na" : nowait ? "true" : "false";
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
    struct rusage ru0, ru1;
    getrusage(RUSAGE_SELF, &ru0);
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
    getrusage(RUSAGE_SELF, &ru1);
    double cpu = (ru1.ru_utime.tv_sec - ru0.ru_utime.tv_sec + ru1.ru_stime.tv_sec - ru0.ru_stime.tv_sec)
                 + (ru1.ru_utime.tv_usec - ru0.ru_utime.tv_usec + ru1.ru_stime.tv_usec - ru0.ru_stime.tv_usec) / 1e6;
    long iowq_ms;
    int iowq = count_iowq(&iowq_ms);
    printf("iops=%.0f ios=%llu nowait=%s iowq=%d iowq_ms=%ld cpu_ns_per_io=%.0f\n", done / (t1 - t0),
           (unsigned long long)done, nw, iowq, iowq_ms, done ? cpu * 1e9 / done : 0);
    blkio_destroy(&b);
    return 0;
}
