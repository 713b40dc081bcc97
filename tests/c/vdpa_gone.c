/*
 * The vhost-vdpa device going away under snapblk's libblkio.so.1 (tests/vm/guest/vdpa-tests.sh),
 * on the VDUSE device NAME served by qemu-storage-daemon (pid QSD_PID):
 *  1. `vdpa dev del NAME` while the device is open: the kernel waits for the close, and I/O
 *     goes on meanwhile;
 *  2. the daemon killed with a request in flight: requests must then fail with EIO, not hang
 *     (the kernel keeps the device for a daemon that may come back, so only the driver's stall
 *     probe notices);
 *  3. destroy returns, and the pending `vdpa dev del` finishes.
 * Writes only at 16 MiB and above (the data at 0 and 1 MiB is checked by the host).
 *
 * Usage: vdpa_gone /dev/vhost-vdpa-N QSD_PID NAME
 */
#define _GNU_SOURCE
#include <blkio.h>
#include <errno.h>
#include <signal.h>
#include <sys/wait.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int passes, fails;
static void check(const char *name, int ok, int line)
{
    printf("%s %s (line %d)%s%s\n", ok ? "PASS" : "FAIL", name, line, ok ? "" : " msg=",
           ok ? "" : blkio_get_error_msg());
    if (ok) passes++; else fails++;
}
#define CHECK(name, cond) check(name, !!(cond), __LINE__)

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    if (argc != 4) { fprintf(stderr, "usage: %s DEV QSD_PID NAME\n", argv[0]); return 2; }
    pid_t qsd = (pid_t)atoi(argv[2]);
    struct blkio *b = NULL;
    CHECK("create", blkio_create("virtio-blk-vhost-vdpa", &b) == 0);
    if (!b) return 1;
    blkio_set_str(b, "path", argv[1]);
    CHECK("connect", blkio_connect(b) == 0);
    CHECK("start", blkio_start(b) == 0);
    struct blkioq *q = blkio_get_queue(b, 0);
    struct blkio_mem_region r;
    CHECK("alloc+map", q && blkio_alloc_mem_region(b, &r, 1 << 20) == 0 &&
          blkio_map_mem_region(b, &r) == 0);
    if (!q) return 1;
    memset(r.addr, 0x42, 1 << 20);
    struct blkio_completion c;
    struct timespec t = { 10, 0 };
    blkioq_write(q, 16 << 20, r.addr, 65536, NULL, 0);
    CHECK("write while the daemon runs", blkioq_do_io(q, &c, 1, 1, &t) == 1 && c.ret == 0);
    pid_t del = fork();
    if (del == 0) {
        execl("/test/bin/vdpa", "vdpa", "dev", "del", argv[3], (char *)NULL);
        _exit(127);
    }
    sleep(2);
    CHECK("vdpa dev del waits while the device is open", del > 0 && waitpid(del, NULL, WNOHANG) == 0);
    blkioq_read(q, 16 << 20, (char *)r.addr + 65536, 65536, NULL, 0);
    CHECK("I/O goes on while vdpa dev del waits",
          blkioq_do_io(q, &c, 1, 1, &t) == 1 && c.ret == 0 &&
          memcmp(r.addr, (char *)r.addr + 65536, 65536) == 0);
    CHECK("kill the daemon", kill(qsd, SIGKILL) == 0);
    for (int i = 0; i < 100 && kill(qsd, 0) == 0; i++) usleep(100000);
    /* No timeout: the driver must end the wait itself. */
    double t0 = now();
    blkioq_write(q, 17 << 20, r.addr, 65536, NULL, 0);
    int n = blkioq_do_io(q, &c, 1, 1, NULL);
    printf("INFO: do_io after the kill: n=%d ret=%d msg=%s after %.1f s\n", n,
           n == 1 ? c.ret : 0, n == 1 && c.error_msg ? c.error_msg : "", now() - t0);
    CHECK("a request after the daemon died fails with EIO", n == 1 && c.ret == -EIO);
    blkioq_read(q, 16 << 20, r.addr, 4096, NULL, 0);
    n = blkioq_do_io(q, &c, 1, 1, NULL);
    CHECK("later requests fail with EIO too", n == 1 && c.ret == -EIO);
    t0 = now();
    blkio_destroy(&b);
    printf("INFO: destroy took %.1f s\n", now() - t0);
    CHECK("destroy returns", b == NULL);
    int st = -1;
    CHECK("vdpa dev del finishes after destroy", del > 0 && waitpid(del, &st, 0) == del);
    printf("INFO: vdpa dev del exit status %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    printf("%d passed, %d failed\n", passes, fails);
    return fails ? 1 : 0;
}
