/*
 * C test of the libblkio ABI, run against snapblk's libblkio.so.1 and (tests/suites/capi-compat.sh)
 * against the real libblkio 1.5. Checks tagged [fix] are the documented differences: the real
 * library fails them (bugs listed in docs/blkio.md), snapblk must pass everything.
 * Calls that crash the real library run in a forked child.
 *
 * Usage: capi_test TMPFS_DIR EXT4_DIR
 */
#define _GNU_SOURCE
#include <blkio.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static int passes, fails;
static char tmpfs_file[512], ext4_file[512], dir_path[512];

static void check(const char *name, int ok, int fix, int line)
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

static void make_file(const char *path, size_t len)
{
    int fd = open(path, O_CREAT | O_TRUNC | O_RDWR, 0644);
    char *buf = malloc(len);
    for (size_t i = 0; i < len; i++) buf[i] = (char)(i * 7 + 3);
    if (fd < 0 || write(fd, buf, len) != (ssize_t)len) { perror(path); exit(2); }
    free(buf);
    close(fd);
}

/* Run fn in a child; returns 1 if it exited 0 (no crash, its own checks passed). */
static int in_child(void (*fn)(void))
{
    fflush(stdout);
    pid_t p = fork();
    if (p == 0) { fn(); _exit(0); }
    int st = 0;
    waitpid(p, &st, 0);
    return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

static struct blkio *open_dev(const char *path, bool direct, int nq, bool start)
{
    struct blkio *b = NULL;
    if (blkio_create("io_uring", &b) < 0) { printf("create: %s\n", blkio_get_error_msg()); exit(2); }
    blkio_set_str(b, "path", path);
    blkio_set_bool(b, "direct", direct);
    if (blkio_connect(b) < 0) { printf("connect %s: %s\n", path, blkio_get_error_msg()); exit(2); }
    blkio_set_int(b, "num-queues", nq);
    if (start && blkio_start(b) < 0) { printf("start: %s\n", blkio_get_error_msg()); exit(2); }
    return b;
}

/* Submit and wait for exactly one completion. */
static struct blkio_completion wait1(struct blkioq *q)
{
    struct blkio_completion c;
    memset(&c, 0xff, sizeof(c));
    int n = blkioq_do_io(q, &c, 1, 1, NULL);
    if (n != 1) { printf("do_io returned %d: %s\n", n, blkio_get_error_msg()); c.ret = -9999; }
    return c;
}

static void test_abi(void)
{
    CHECK("sizeof completion", sizeof(struct blkio_completion) == 32);
    CHECK("completion offsets", offsetof(struct blkio_completion, error_msg) == 8 &&
          offsetof(struct blkio_completion, ret) == 16 && offsetof(struct blkio_completion, reserved_) == 20);
    CHECK("sizeof mem_region", sizeof(struct blkio_mem_region) == 40);
    CHECK("mem_region offsets", offsetof(struct blkio_mem_region, len) == 8 &&
          offsetof(struct blkio_mem_region, iova) == 16 && offsetof(struct blkio_mem_region, fd_offset) == 24 &&
          offsetof(struct blkio_mem_region, fd) == 32 && offsetof(struct blkio_mem_region, flags) == 36);
    CHECK("sizeof zone", sizeof(struct blkio_zone) == 64 && offsetof(struct blkio_zone, zone_type) == 32 &&
          offsetof(struct blkio_zone, reserved_) == 35);
    CHECK("flag values", BLKIO_REQ_FUA == 1 && BLKIO_REQ_NO_UNMAP == 2 && BLKIO_REQ_NO_FALLBACK == 4);
}

static const char *thread_msg;
static void *msg_thread(void *arg)
{
    (void)arg;
    thread_msg = blkio_get_error_msg();
    int empty = thread_msg[0] == 0;
    struct blkio *b;
    blkio_create("nope", &b);
    return (void *)(long)empty;
}

extern const char *blkio_get_error_msg_(void);
extern void blkio_set_error_msg_(const char *msg, size_t len);

static void test_errors_and_create(void)
{
    CHECK("error msg initially empty", blkio_get_error_msg() != NULL && blkio_get_error_msg()[0] == 0);
    struct blkio *b = (struct blkio *)1;
    ERR("create unknown driver", blkio_create("no-such-driver", &b), ENOENT, "Unknown driver name");
    CHECK("create failure NULLs *bp", b == NULL);
    ERR("create is case-sensitive", blkio_create("IO_URING", &b), ENOENT, "Unknown driver name");
    ERR("create NULL bp", blkio_create("io_uring", NULL), EINVAL, "bp must be non-NULL");
    ERR("create non-UTF-8", blkio_create("\xff\xfe", &b), EINVAL, "Invalid driver name");
    CHECK("create io_uring", blkio_create("io_uring", &b) == 0 && b != NULL);
    CHECK("success keeps last message", MSG_IS("Invalid driver name"));
    blkio_destroy(&b);
    CHECK("destroy NULLs pointer", b == NULL);
    blkio_destroy(NULL);
    pthread_t t;
    void *empty;
    pthread_create(&t, NULL, msg_thread, NULL);
    pthread_join(t, &empty);
    CHECK("error buffer is per thread", empty && thread_msg != blkio_get_error_msg() &&
          MSG_IS("Invalid driver name"));
    char big[400];
    memset(big, 'x', sizeof(big));
    blkio_set_error_msg_(big, sizeof(big));
    CHECK("message truncated to 255", strlen(blkio_get_error_msg()) == 255);
    CHECK("get_error_msg_ is the same buffer", blkio_get_error_msg_() == blkio_get_error_msg());
}

static void destroy_null_instance(void) { struct blkio *b = NULL; blkio_destroy(&b); }
static void null_instance_calls(void)
{
    /* misuse must give errors, not crashes */
    if (blkio_connect(NULL) != -EINVAL) _exit(1);
    if (blkio_start(NULL) != -EINVAL) _exit(1);
    int v;
    if (blkio_get_int(NULL, "num-queues", &v) != -EINVAL) _exit(1);
    if (blkio_get_queue(NULL, 0) != NULL) _exit(1);
    if (blkioq_do_io(NULL, NULL, 0, 0, NULL) != -EINVAL) _exit(1);
    blkioq_read(NULL, 0, NULL, 0, NULL, 0);
    struct blkio *b = open_dev(tmpfs_file, false, 1, true);
    if (blkio_get_int(b, NULL, &v) != -EINVAL) _exit(1);
    if (blkio_map_mem_region(b, NULL) != -EINVAL) _exit(1);
    blkio_free_mem_region(b, NULL);
    blkio_destroy(&b);
}

static void test_lifecycle(void)
{
    struct blkio *b;
    blkio_create("io_uring", &b);
    ERR("connect without path/fd", blkio_connect(b), EINVAL, "One of path and fd must be set");
    ERR("start before connect", blkio_start(b), ENODEV, "Device must be connected");
    blkio_set_str(b, "path", "/nonexistent/file");
    ERR("connect ENOENT", blkio_connect(b), ENOENT, "No such file or directory (os error 2)");
    blkio_set_int(b, "fd", 0);
    ERR("path and fd", blkio_connect(b), EINVAL, "path and fd cannot be set at the same time");
    blkio_set_int(b, "fd", -1);
    blkio_set_str(b, "path", dir_path);
    ERR("connect directory rw", blkio_connect(b), EISDIR, "Is a directory (os error 21)");
    blkio_set_bool(b, "read-only", true);
    ERR("connect directory ro", blkio_connect(b), EINVAL, "The file must be a block device or a regular file");
    int fd = 99;
    blkio_get_int(b, "fd", &fd);
    FIX("no stale fd after failed connect", fd == -1);
    blkio_set_str(b, "path", "/dev/null");
    FIX("retry after failed connect works", blkio_connect(b) == -EINVAL &&
        MSG_IS("The file must be a block device or a regular file"));
    blkio_set_int(b, "fd", -1);
    blkio_set_bool(b, "read-only", false);
    blkio_set_str(b, "path", tmpfs_file);
    CHECK("connect", blkio_connect(b) == 0);
    CHECK("connect again is a no-op", blkio_connect(b) == 0);
    CHECK("start", blkio_start(b) == 0);
    CHECK("start again is a no-op", blkio_start(b) == 0);
    ERR("connect after start", blkio_connect(b), EBUSY, "Cannot set property in connected state");
    blkio_destroy(&b);

    /* an fd handed over through the property; a failed connect must not close it */
    int dfd = open(dir_path, O_RDONLY);
    blkio_create("io_uring", &b);
    blkio_set_int(b, "fd", dfd);
    ERR("connect fd of a directory", blkio_connect(b), EINVAL, "The file must be a block device or a regular file");
    FIX("failed connect leaves the caller's fd open", fcntl(dfd, F_GETFD) >= 0);
    blkio_destroy(&b);
    close(dfd);
    int ffd = open(tmpfs_file, O_RDONLY);
    blkio_create("io_uring", &b);
    blkio_set_int(b, "fd", ffd);
    CHECK("connect via fd", blkio_connect(b) == 0);
    bool ro = false;
    char *path = NULL;
    blkio_get_bool(b, "read-only", &ro);
    blkio_get_str(b, "path", &path);
    int gotfd = -1;
    blkio_get_int(b, "fd", &gotfd);
    CHECK("fd connect reflects access mode", ro && path && path[0] == 0 && gotfd == ffd);
    free(path);
    blkio_destroy(&b);
    CHECK("destroy closes the adopted fd", fcntl(ffd, F_GETFD) < 0);

    CHECK("destroy(&NULL) does not crash", 1);
    FIX("destroy(&NULL) is a no-op", in_child(destroy_null_instance));
    FIX("NULL instance/queue/region arguments return errors", in_child(null_instance_calls));
}

static void test_properties(void)
{
    struct blkio *b;
    blkio_create("io_uring", &b);
    int i = 7; bool bo = true; uint64_t u = 7; char *s = (char *)1;
    ERR("get unknown", blkio_get_int(b, "no-such", &i), ENOENT, "Unknown property name");
    CHECK("failed get writes 0", i == 0);
    ERR("get_int on bool", blkio_get_int(b, "direct", &i), ENOTTY, "Property is not an int");
    ERR("get_bool on int", blkio_get_bool(b, "num-entries", &bo), ENOTTY, "Property is not a bool");
    CHECK("failed get_bool writes false", bo == false);
    ERR("get_uint64 on int", blkio_get_uint64(b, "num-entries", &u), ENOTTY, "Property is not an unsigned 64-bit integer");
    ERR("set_uint64 on int", blkio_set_uint64(b, "num-entries", 1), ENOTTY, "Property is not an unsigned 64-bit int");
    ERR("capacity needs connect", blkio_get_uint64(b, "capacity", &u), ENODEV, "Device must be connected");
    ERR("get_str unknown", blkio_get_str(b, "nope", &s), ENOENT, "Unknown property name");
    CHECK("failed get_str writes NULL", s == NULL);
    ERR("set read-only prop", blkio_set_uint64(b, "capacity", 5), EACCES, "Property is read-only");
    ERR("set_str parse before access", blkio_set_str(b, "capacity", "abc"), EINVAL, "Value must be an unsigned 64-bit integer");
    ERR("num-queues in created", blkio_set_int(b, "num-queues", 2), ENODEV, "Device must be connected");
    CHECK("num-entries default", blkio_get_int(b, "num-entries", &i) == 0 && i == 128);
    CHECK("max-queues", blkio_get_int(b, "max-queues", &i) == 0 && i == INT_MAX);
    CHECK("max-mem-regions", blkio_get_uint64(b, "max-mem-regions", &u) == 0 && u == UINT64_MAX);
    CHECK("created defaults", blkio_get_bool(b, "can-add-queues", &bo) == 0 && bo &&
          blkio_get_bool(b, "needs-mem-regions", &bo) == 0 && !bo &&
          blkio_get_bool(b, "supports-poll-queues", &bo) == 0 && !bo &&
          blkio_get_int(b, "fd", &i) == 0 && i == -1);
    CHECK("get_str driver", blkio_get_str(b, "driver", &s) == 0 && strcmp(s, "io_uring") == 0);
    free(s);
    ERR("set_str bool", blkio_set_str(b, "direct", "1"), EINVAL, "Value must be \"true\" or \"false\"");
    CHECK("set_str bool ok", blkio_set_str(b, "direct", "false") == 0);
    ERR("no logical-block-size", blkio_get_int(b, "logical-block-size", &i), ENOENT, "Unknown property name");
    blkio_set_str(b, "path", tmpfs_file);
    blkio_connect(b);
    ERR("created-only after connect", blkio_set_str(b, "path", "x"), EBUSY, "Cannot set property in connected state");
    ERR("num-queues -1", blkio_set_int(b, "num-queues", -1), EINVAL, "num_queues must be equal to or greater than 0");
    ERR("num-poll-queues -1", blkio_set_int(b, "num-poll-queues", -1), EINVAL, "num_poll_queues must be equal to or greater than 0");
    ERR("num-entries 0", blkio_set_int(b, "num-entries", 0), EINVAL, "num-entries must be greater than 0");
    ERR("set_str int hex", blkio_set_str(b, "num-entries", "0x10"), EINVAL, "Value must be a signed 32-bit integer");
    CHECK("set_str int +32", blkio_set_str(b, "num-entries", "+32") == 0 && blkio_get_int(b, "num-entries", &i) == 0 && i == 32);
    CHECK("capacity", blkio_get_uint64(b, "capacity", &u) == 0 && u == 1 << 20);
    CHECK("buffered alignments", blkio_get_int(b, "request-alignment", &i) == 0 && i == 1 &&
          blkio_get_uint64(b, "mem-region-alignment", &u) == 0 && u == 1 &&
          blkio_get_int(b, "optimal-buf-alignment", &i) == 0 && i == 4096 &&
          blkio_get_int(b, "max-segments", &i) == 0 && i == 1024 &&
          blkio_get_bool(b, "can-grow", &bo) == 0 && bo);
    CHECK("get_str int", blkio_get_str(b, "num-entries", &s) == 0 && strcmp(s, "32") == 0);
    free(s);
    blkio_start(b);
    ERR("connected-only after start", blkio_set_int(b, "num-queues", 1), EBUSY, "Cannot set property in started state");
    ERR("created-only after start", blkio_set_bool(b, "read-only", true), EBUSY, "Cannot set property in connected state");
    blkio_destroy(&b);
}

static void test_queues(void)
{
    struct blkio *b = open_dev(tmpfs_file, false, 3, false);
    CHECK("get_queue before start", blkio_get_queue(b, 0) == NULL);
    ERR("add_queue before start", blkio_add_queue(b), EBUSY, "Device must be started");
    blkio_start(b);
    struct blkioq *q0 = blkio_get_queue(b, 0), *q1 = blkio_get_queue(b, 1), *q2 = blkio_get_queue(b, 2);
    CHECK("queue indices", !blkio_get_queue(b, -1) && q0 && q1 && q2 && !blkio_get_queue(b, 3) &&
          q0 != q1 && q1 != q2 && blkio_get_queue(b, 1) == q1);
    CHECK("add_queue", blkio_add_queue(b) == 3);
    CHECK("remove_queue", blkio_remove_queue(b, 1) == 0 && blkio_get_queue(b, 1) == NULL && blkio_get_queue(b, 2) == q2);
    ERR("remove again", blkio_remove_queue(b, 1), ENOENT, "no queue with index 1");
    ERR("remove -1", blkio_remove_queue(b, -1), ENOENT, "no queue with index -1");
    ERR("remove poll queue", blkio_remove_poll_queue(b, 0), ENOENT, "no queue with index 0");
    CHECK("add reuses lowest slot", blkio_add_queue(b) == 1);
    ERR("add_poll_queue unsupported", blkio_add_poll_queue(b), EINVAL, "Poll queues not supported");
    CHECK("no poll queue", blkio_get_poll_queue(b, 0) == NULL);
    int fd = blkioq_get_completion_fd(q0);
    CHECK("completion fd nonblock+cloexec+stable", fd >= 0 && (fcntl(fd, F_GETFL) & O_NONBLOCK) &&
          (fcntl(fd, F_GETFD) & FD_CLOEXEC) && blkioq_get_completion_fd(q0) == fd);
    blkio_destroy(&b);
    b = open_dev(tmpfs_file, false, 0, false);
    blkio_set_int(b, "num-poll-queues", 1);
    ERR("start with poll queue unsupported", blkio_start(b), EINVAL, "Poll queues not supported");
    blkio_set_int(b, "num-poll-queues", 0);
    CHECK("start with zero queues", blkio_start(b) == 0 && blkio_get_queue(b, 0) == NULL && blkio_add_queue(b) == 0);
    blkio_destroy(&b);
}

static void free_mapped_region(void)
{
    struct blkio *b = open_dev(tmpfs_file, false, 1, true);
    struct blkio_mem_region r;
    blkio_alloc_mem_region(b, &r, 4096);
    blkio_map_mem_region(b, &r);
    blkio_free_mem_region(b, &r);           /* refused (real: abort) */
    struct blkio_mem_region bogus = r;
    bogus.addr = (char *)bogus.addr + 4096 * 16;
    blkio_free_mem_region(b, &bogus);       /* never allocated (real: abort) */
    blkio_unmap_mem_region(b, &r);
    blkio_free_mem_region(b, &r);
    blkio_destroy(&b);
}

static void test_mem_regions(void)
{
    struct blkio *b;
    struct blkio_mem_region r;
    blkio_create("io_uring", &b);
    ERR("alloc in created", blkio_alloc_mem_region(b, &r, 4096), ENODEV, "Device must be connected");
    blkio_set_str(b, "path", tmpfs_file);
    blkio_set_bool(b, "direct", true);
    blkio_connect(b);
    uint64_t align = 0;
    blkio_get_uint64(b, "mem-region-alignment", &align);
    CHECK("tmpfs O_DIRECT alignment 4096", align == 4096);
    ERR("alloc misaligned len", blkio_alloc_mem_region(b, &r, 4097), EINVAL, "len 4097 violates mem-region-alignment 4096");
    CHECK("alloc 1 MiB", blkio_alloc_mem_region(b, &r, 1 << 20) == 0 && r.len == 1 << 20 && r.iova == 0 &&
          r.fd_offset == 0 && r.flags == 0 && r.fd >= 0 && ((uintptr_t)r.addr % 4096) == 0);
    FIX("region memfd is close-on-exec", fcntl(r.fd, F_GETFD) & FD_CLOEXEC);
    ERR("map before start", blkio_map_mem_region(b, &r), EBUSY, "Device must be started");
    blkio_start(b);
    CHECK("map", blkio_map_mem_region(b, &r) == 0);
    ERR("map twice", blkio_map_mem_region(b, &r), EINVAL, "memory region already mapped");
    struct blkio_mem_region bad = r;
    bad.len = 4095;
    ERR("map misaligned len", blkio_map_mem_region(b, &bad), EINVAL, "len 0xfff violates mem-region-alignment 4096");
    /* I/O through the mapped region (registered buffer in snapblk) */
    struct blkioq *q = blkio_get_queue(b, 0);
    memset(r.addr, 0x5a, 8192);
    blkioq_write(q, 8192, r.addr, 8192, NULL, 0);
    struct blkio_completion c = wait1(q);
    memset(r.addr, 0, 8192);
    blkioq_read(q, 8192, (char *)r.addr + 65536, 8192, NULL, 0);
    c = wait1(q);
    CHECK("I/O in a mapped region", c.ret == 0 && ((unsigned char *)r.addr)[65536 + 100] == 0x5a);
    blkio_unmap_mem_region(b, &r);
    blkio_unmap_mem_region(b, &r);
    CHECK("map again after unmap", blkio_map_mem_region(b, &r) == 0);
    void *user = NULL;
    if (posix_memalign(&user, 4096, 65536)) exit(2);
    struct blkio_mem_region ur = { .addr = user, .len = 65536, .fd = -1 };
    CHECK("map user buffer", blkio_map_mem_region(b, &ur) == 0);
    blkioq_read(q, 8192, user, 4096, NULL, 0);
    c = wait1(q);
    CHECK("I/O in a mapped user buffer", c.ret == 0 && ((unsigned char *)user)[5] == 0x5a);
    blkio_unmap_mem_region(b, &ur);
    free(user);
    blkio_unmap_mem_region(b, &r);
    blkio_free_mem_region(b, &r);
    struct blkio_mem_region leak;
    CHECK("alloc left for destroy", blkio_alloc_mem_region(b, &leak, 4096) == 0);
    blkio_map_mem_region(b, &leak);
    blkio_destroy(&b);
    CHECK("destroy frees regions", fcntl(leak.fd, F_GETFD) < 0);
    FIX("freeing a mapped or unknown region does not abort", in_child(free_mapped_region));
}

static void test_requests(void)
{
    struct blkio *b = open_dev(tmpfs_file, false, 1, true);
    struct blkioq *q = blkio_get_queue(b, 0);
    char w[16384], r[16384];
    for (int i = 0; i < (int)sizeof(w); i++) w[i] = (char)(i * 13 + 1);
    blkioq_write(q, 4096, w, sizeof(w), (void *)0x1234, 0);
    struct blkio_completion c = wait1(q);
    CHECK("write", c.ret == 0 && c.user_data == (void *)0x1234 && c.error_msg == NULL);
    static const uint8_t zero12[12];
    CHECK("reserved_ zeroed", memcmp(c.reserved_, zero12, 12) == 0);
    memset(r, 0, sizeof(r));
    blkioq_read(q, 4096, r, sizeof(r), NULL, 0);
    c = wait1(q);
    CHECK("read back", c.ret == 0 && memcmp(r, w, sizeof(r)) == 0);
    struct iovec iov[3] = { { w, 100 }, { w + 100, 3996 }, { w + 4096, 4096 } };
    blkioq_writev(q, 65536, iov, 3, NULL, BLKIO_REQ_FUA);
    c = wait1(q);
    CHECK("writev FUA", c.ret == 0);
    memset(r, 0, sizeof(r));
    struct iovec riov[2] = { { r, 5000 }, { r + 5000, 3192 } };
    blkioq_readv(q, 65536, riov, 2, NULL, 0);
    c = wait1(q);
    CHECK("readv", c.ret == 0 && memcmp(r, w, 8192) == 0);
    blkioq_readv(q, 0, riov, 0, NULL, 0);
    CHECK("readv iovcnt 0", wait1(q).ret == 0);
    blkioq_readv(q, 0, riov, -1, NULL, 0);
    c = wait1(q);
    CHECK("readv iovcnt -1", c.ret == -EINVAL && c.error_msg &&
          strcmp(c.error_msg, "iovcnt must be non-negative and fit in a signed 32-bit integer") == 0);
    blkioq_read(q, 0, r, 0, NULL, 0);
    CHECK("read len 0", wait1(q).ret == 0);
    blkioq_read(q, 0, r, 8ULL << 30, NULL, 0);
    c = wait1(q);
    CHECK("read len > u32", c.ret == -EINVAL && c.error_msg && strcmp(c.error_msg, "len must fit in an unsigned 32-bit integer") == 0);
    blkioq_write_zeroes(q, 4096, 8192, NULL, 0);
    CHECK("write_zeroes", wait1(q).ret == 0);
    blkioq_read(q, 4096, r, 12288, NULL, 0);
    c = wait1(q);
    int zeros = 1;
    for (int i = 0; i < 8192; i++) zeros &= r[i] == 0;
    CHECK("write_zeroes reads zeros", c.ret == 0 && zeros && memcmp(r + 8192, w + 8192, 4096) == 0);
    blkioq_write_zeroes(q, 4096, 4096, NULL, BLKIO_REQ_FUA | BLKIO_REQ_NO_FALLBACK);
    CHECK("write_zeroes FUA|NO_FALLBACK", wait1(q).ret == 0);
    blkioq_flush(q, NULL, 0);
    CHECK("flush", wait1(q).ret == 0);
    blkioq_write(q, 0, w, 16384, NULL, 0);
    wait1(q);
    blkioq_discard(q, 0, 16384, NULL, 0);
    c = wait1(q);
    FIX("discard works", c.ret == 0);
    memset(r, 1, sizeof(r));
    blkioq_read(q, 0, r, 16384, NULL, 0);
    wait1(q);
    zeros = 1;
    for (int i = 0; i < 16384; i++) zeros &= r[i] == 0;
    FIX("discarded range reads zeros", zeros);
    blkioq_discard(q, 0, 4096, NULL, BLKIO_REQ_FUA);
    c = wait1(q);
    CHECK("discard FUA invalid", c.ret == -EINVAL && c.error_msg && strcmp(c.error_msg, "BLKIO_REQ_FUA is invalid for this request type") == 0);
    blkioq_read(q, 0, r, 4096, NULL, BLKIO_REQ_NO_UNMAP);
    c = wait1(q);
    CHECK("read NO_UNMAP invalid", c.ret == -EINVAL && strcmp(c.error_msg, "BLKIO_REQ_NO_UNMAP is invalid for this request type") == 0);
    blkioq_write(q, 0, w, 4096, NULL, 1u << 5);
    c = wait1(q);
    CHECK("unknown flag bits", c.ret == -EINVAL && strcmp(c.error_msg, "unsupported bits in request flags") == 0);
    blkioq_flush(q, NULL, BLKIO_REQ_FUA);
    CHECK("flush FUA invalid", wait1(q).ret == -EINVAL);
    struct blkio_zone z[2];
    blkioq_report_zones(q, 0, z, 2, NULL, 0);
    c = wait1(q);
    CHECK("report_zones ENOTSUP", c.ret == -ENOTSUP && strcmp(c.error_msg, "request not supported for this driver") == 0);
    blkioq_reset_zone(q, 0, NULL, 0);
    blkioq_open_all_zones(q, NULL, 0);
    blkioq_close_zone(q, 0, NULL, 0);
    blkioq_finish_zone(q, 0, NULL, 0);
    blkioq_open_zone(q, 0, NULL, 0);
    blkioq_close_all_zones(q, NULL, 0);
    blkioq_finish_all_zones(q, NULL, 0);
    blkioq_reset_all_zones(q, NULL, 0);
    struct blkio_completion cs[64];
    int n = blkioq_do_io(q, cs, 8, 8, NULL);
    int all = n == 8;
    for (int i = 0; i < n; i++) all &= cs[i].ret == -ENOTSUP;
    CHECK("all zone ops ENOTSUP", all);
    uint64_t cap = 0;
    blkio_get_uint64(b, "capacity", &cap);
    memset(r, 1, 8192);
    blkioq_read(q, cap - 4096, r, 8192, NULL, 0);
    c = wait1(q);
    CHECK("read straddling EOF zero-fills", c.ret == 0 && r[4096] == 0 && r[8191] == 0);
    blkioq_write(q, cap + 4096, w, 4096, NULL, 0);
    wait1(q);
    uint64_t cap2 = 0;
    blkio_get_uint64(b, "capacity", &cap2);
    CHECK("capacity follows growth", cap2 == cap + 8192);
    blkio_destroy(&b);

    /* backlog: 64 requests on a 4-entry ring */
    b = open_dev(tmpfs_file, false, 1, false);
    blkio_set_int(b, "num-entries", 4);
    blkio_start(b);
    q = blkio_get_queue(b, 0);
    static char bufs[64][512];
    for (long i = 0; i < 64; i++) blkioq_read(q, 131072 + i * 512, bufs[i], 512, (void *)i, 0);
    n = blkioq_do_io(q, cs, 64, 64, NULL);
    long sum = 0;
    all = n == 64;
    for (int i = 0; i < n; i++) { all &= cs[i].ret == 0; sum += (long)cs[i].user_data; }
    CHECK("64 requests on num-entries=4", all && sum == 63 * 64 / 2 && bufs[5][0] == (char)((131072 + 5 * 512) * 7 + 3));
    blkio_destroy(&b);
}

static void test_do_io(void)
{
    struct blkio *b = open_dev(tmpfs_file, false, 1, true);
    struct blkioq *q = blkio_get_queue(b, 0);
    struct blkio_completion cs[4];
    struct timespec ts = { 0, 1000000000 };
    char buf[4096];
    CHECK("do_io nothing", blkioq_do_io(q, NULL, 0, 0, NULL) == 0);
    ERR("min > outstanding", blkioq_do_io(q, cs, 1, 1, NULL), EINVAL, "min_completions is larger than total outstanding requests");
    ERR("min > max", blkioq_do_io(q, cs, 2, 1, NULL), EINVAL, "min_completions must be less than or equal to max_completions");
    ERR("min < 0", blkioq_do_io(q, cs, -1, 1, NULL), EINVAL, "min_completions cannot be negative");
    ERR("max < 0", blkioq_do_io(q, cs, 0, -1, NULL), EINVAL, "max_completions cannot be negative");
    ERR("NULL completions", blkioq_do_io(q, NULL, 0, 1, NULL), EINVAL, "max_completions must be 0 when completions is NULL");
    ERR("tv_nsec", blkioq_do_io(q, cs, 0, 1, &ts), EINVAL, "tv_nsec must be less than one second");
    CHECK("timeout untouched on arg error", ts.tv_nsec == 1000000000);
    ts.tv_sec = -1; ts.tv_nsec = 0;
    ERR("tv_sec", blkioq_do_io(q, cs, 0, 1, &ts), EINVAL, "tv_sec cannot be negative");
    ts.tv_sec = 5; ts.tv_nsec = 0;
    blkioq_read(q, 0, buf, 4096, (void *)1, 0);
    CHECK("timeout wait", blkioq_do_io(q, cs, 1, 1, &ts) == 1 && ts.tv_sec <= 4 && ts.tv_sec >= 3);
    blkioq_read(q, 0, buf, 4096, (void *)2, 0);
    ERR("min 2 with 1 outstanding", blkioq_do_io(q, cs, 2, 2, NULL), EINVAL, "min_completions is larger than total outstanding requests");
    CHECK("completion kept", blkioq_do_io(q, cs, 1, 1, NULL) == 1 && cs[0].user_data == (void *)2);
    blkioq_read(q, 0, buf, 4096, (void *)3, 0);
    blkioq_do_io(q, NULL, 0, 0, NULL);
    blkioq_read(q, 0, buf, 4096, (void *)4, BLKIO_REQ_FUA);
    CHECK("enqueue failures first", blkioq_do_io(q, cs, 2, 2, NULL) == 2 && cs[0].user_data == (void *)4 &&
          cs[0].ret == -EINVAL && cs[1].user_data == (void *)3 && cs[1].ret == 0);
    /* loop mode: min 0 until the completion shows up */
    blkioq_read(q, 0, buf, 4096, (void *)5, 0);
    long spins = 0;
    int n;
    while ((n = blkioq_do_io(q, cs, 0, 1, NULL)) == 0 && spins < 100000000) spins++;
    CHECK("busy loop waiting", n == 1 && cs[0].user_data == (void *)5);
    /* eventfd mode */
    int fd = blkioq_get_completion_fd(q);
    uint64_t v;
    while (read(fd, &v, 8) == 8) {}
    blkioq_set_completion_fd_enabled(q, true);
    blkioq_read(q, 0, buf, 4096, (void *)6, 0);
    blkioq_do_io(q, NULL, 0, 0, NULL);
    struct pollfd p = { fd, POLLIN, 0 };
    CHECK("eventfd readable", poll(&p, 1, 5000) == 1 && read(fd, &v, 8) == 8 && v >= 1);
    CHECK("eventfd then do_io", blkioq_do_io(q, cs, 0, 1, NULL) == 1 && cs[0].user_data == (void *)6);
    CHECK("eventfd drained", read(fd, &v, 8) < 0 && errno == EAGAIN);
    blkioq_read(q, 0, buf, 4096, NULL, BLKIO_REQ_FUA);
    CHECK("enqueue failure signals eventfd", poll(&p, 1, 0) == 1);
    blkioq_do_io(q, cs, 1, 1, NULL);
    while (read(fd, &v, 8) == 8) {}
    blkioq_set_completion_fd_enabled(q, false);
    blkioq_read(q, 0, buf, 4096, NULL, 0);
    blkioq_do_io(q, cs, 1, 1, NULL);
    FIX("disabled completion fd stays quiet", poll(&p, 1, 0) == 0);
    blkio_destroy(&b);

    /* interruptible waiting where the kernel must sleep (O_DIRECT on the disk) */
    void *al = NULL;
    if (posix_memalign(&al, 4096, 4096)) exit(2);
    b = open_dev(ext4_file, true, 1, true);
    q = blkio_get_queue(b, 0);
    sigset_t none;
    sigemptyset(&none);
    int ok = 1;
    for (int i = 0; i < 20; i++) {
        blkioq_read(q, (uint64_t)i * 4096, al, 4096, NULL, 0);
        n = blkioq_do_io_interruptible(q, cs, 1, 1, NULL, &none);
        if (n != 1) { ok = 0; blkioq_do_io(q, cs, 1, 1, NULL); }
    }
    FIX("do_io_interruptible sleeps correctly", ok);
    free(al);
    blkio_destroy(&b);
}

struct thr { struct blkioq *q; uint64_t off; int ok; };
static void *io_thread(void *arg)
{
    struct thr *t = arg;
    char w[4096], r[4096];
    t->ok = 1;
    for (int i = 0; i < 200; i++) {
        memset(w, (int)(t->off / 4096 + i), sizeof(w));
        blkioq_write(t->q, t->off, w, sizeof(w), NULL, 0);
        struct blkio_completion c = wait1(t->q);
        blkioq_read(t->q, t->off, r, sizeof(r), NULL, 0);
        struct blkio_completion c2 = wait1(t->q);
        if (c.ret || c2.ret || memcmp(w, r, sizeof(r))) t->ok = 0;
    }
    return NULL;
}

static void test_threads(void)
{
    struct blkio *b = open_dev(tmpfs_file, false, 2, true);
    struct thr t[2] = { { blkio_get_queue(b, 0), 0, 0 }, { blkio_get_queue(b, 1), 65536, 0 } };
    pthread_t th[2];
    for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, io_thread, &t[i]);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    CHECK("two queues from two threads", t[0].ok && t[1].ok);
    blkio_destroy(&b);
}

int main(int argc, char **argv)
{
    if (argc < 3) { fprintf(stderr, "usage: %s TMPFS_DIR EXT4_DIR\n", argv[0]); return 2; }
    snprintf(tmpfs_file, sizeof(tmpfs_file), "%s/capi-test.img", argv[1]);
    snprintf(ext4_file, sizeof(ext4_file), "%s/capi-test-direct.img", argv[2]);
    snprintf(dir_path, sizeof(dir_path), "%s", argv[1]);
    make_file(tmpfs_file, 1 << 20);
    make_file(ext4_file, 1 << 20);
    setvbuf(stdout, NULL, _IOLBF, 0);
    test_abi();
    test_errors_and_create();
    test_lifecycle();
    test_properties();
    make_file(tmpfs_file, 1 << 20);
    test_queues();
    test_mem_regions();
    make_file(tmpfs_file, 1 << 20);
    test_requests();
    make_file(tmpfs_file, 1 << 20);
    test_do_io();
    test_threads();
    unlink(tmpfs_file);
    unlink(ext4_file);
    printf("%d passed, %d failed\n", passes, fails);
    return fails ? 1 : 0;
}
