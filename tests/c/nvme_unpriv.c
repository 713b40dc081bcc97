/*
 * The nvme-io_uring driver opened by a caller without CAP_SYS_ADMIN (tests/suites/nvme-vm.sh):
 * drops to uid/gid UID (no supplementary groups), then connects to NGDEV (made rw for all by
 * the guest script), prints the zoned property and reads 4 KiB at offset 0.
 * Since Linux 6.2 such a caller may send Identify CNS 0, 1, 5, 6 and 8 only.
 *
 * Usage: nvme_unpriv NGDEV UID
 * Prints "zoned=N", "read=RC" and "uid=N"; exits 0 if connect, start and the read succeed.
 */
#define _GNU_SOURCE
#include <blkio.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: nvme_unpriv NGDEV UID\n");
        return 2;
    }
    uid_t id = (uid_t)atoi(argv[2]);
    if (setgroups(0, NULL) || setgid(id) || setuid(id)) {
        perror("dropping privileges");
        return 2;
    }
    printf("uid=%d euid=%d\n", (int)getuid(), (int)geteuid());
    struct blkio *b;
    if (blkio_create("nvme-io_uring", &b) || blkio_set_str(b, "path", argv[1]) ||
        blkio_connect(b)) {
        printf("connect failed: %s\n", blkio_get_error_msg());
        return 1;
    }
    int zoned = -1;
    blkio_get_int(b, "zoned", &zoned);
    printf("zoned=%d\n", zoned);
    if (blkio_start(b)) {
        printf("start failed: %s\n", blkio_get_error_msg());
        return 1;
    }
    struct blkio_mem_region r;
    if (blkio_alloc_mem_region(b, &r, 4096) || blkio_map_mem_region(b, &r)) {
        printf("mem region failed: %s\n", blkio_get_error_msg());
        return 1;
    }
    struct blkioq *q = blkio_get_queue(b, 0);
    struct blkio_completion c;
    blkioq_read(q, 0, r.addr, 4096, NULL, 0);
    int n = blkioq_do_io(q, &c, 1, 1, NULL);
    int ret = n == 1 ? c.ret : -1000;
    printf("read=%d%s%s\n", ret, n == 1 && c.error_msg ? " " : "",
           n == 1 && c.error_msg ? c.error_msg : "");
    blkio_destroy(&b);
    return ret == 0 ? 0 : 1;
}
