/*
 * C test of the nvme-io_uring driver through the libblkio ABI, run in the VM of
 * tests/suites/nvme-vm.sh against snapblk's libblkio.so.1 and the real libblkio 1.5 in the same
 * boot (QEMU -device nvme, MDTS 7 = 512 KiB, 512-byte blocks). Checks tagged [fix] are
 * documented differences (docs/blkio.md): the real library fails them, snapblk must pass
 * everything. Every property is printed in every state as "PROP <state> <name> = <value>" so the
 * script can compare the two libraries line by line.
 *
 * Usage:
 *   nvme_test conv NGDEV BLKDEV CTRLDEV TAG   conventional namespace; writes its pattern at
 *                                            32 MiB + TAG * 4 MiB (see pattern())
 *   nvme_test zns NGDEV ZONE                 zoned namespace (4 MiB zones, 8 open, 8 active):
 *                                            the zone requests (they end with every zone
 *                                            reset), then writes 128 KiB at the start of zone
 *                                            ZONE; every report is printed as "ZONE label i
 *                                            fields" for the script to compare
 *   nvme_test layout                         prints struct blkio_zone's layout and the zone
 *                                            enums of the header it was compiled with
 *   nvme_test meta NGDEV                     a namespace with 8 bytes of metadata per block
 *   nvme_test lba4k NGDEV TAG                an 8 MiB namespace of 4 KiB blocks; writes 64 KiB
 *                                            at 1 MiB + TAG MiB (block 2 zeroed)
 *   nvme_test gone NGDEV PCIDEV TAG          the same namespace; writes 8 KiB at 4 MiB + TAG MiB,
 *                                            then removes the controller (PCIDEV/remove)
 */
#define _GNU_SOURCE
#include <blkio.h>
#include <errno.h>
#include <stddef.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

static int passes, fails;

static void check(const char *name, int ok, int fix, int line)
{
    printf("%s %s%s (line %d)%s%s\n", ok ? "PASS" : "FAIL", fix ? "[fix] " : "", name, line,
           ok ? "" : " msg=", ok ? "" : blkio_get_error_msg());
    if (ok) passes++; else fails++;
}
#define CHECK(name, cond) check(name, !!(cond), 0, __LINE__)
#define FIX(name, cond) check(name, !!(cond), 1, __LINE__)

static const char *names[] = {
    "driver", "path", "fd", "read-only", "capacity", "max-queues", "max-mem-regions",
    "mem-region-alignment", "needs-mem-regions", "needs-mem-region-fd", "may-pin-mem-regions",
    "request-alignment", "buf-alignment", "optimal-io-alignment", "optimal-io-size",
    "optimal-buf-alignment", "max-segments", "max-segment-len", "max-transfer",
    "max-write-zeroes-len", "discard-alignment", "discard-alignment-offset", "max-discard-len",
    "flush-needed", "can-grow", "supports-fua-natively", "supports-poll-queues",
    "can-add-queues", "num-queues", "num-poll-queues", "num-entries", "zoned", "zone-size",
    "nr-zones", "max-open-zones", "max-active-zones", "append-support",
    "zone-append-max-bytes", "queue-size", "direct", NULL};

static void dump(struct blkio *b, const char *state)
{
    for (int i = 0; names[i]; i++) {
        char *v = NULL;
        int rc = blkio_get_str(b, names[i], &v);
        if (rc == 0) printf("PROP %s %s = %s\n", state, names[i], v);
        else printf("PROP %s %s -> %s\n", state, names[i], strerror(-rc));
        free(v);
    }
}

static uint64_t u64p(struct blkio *b, const char *n)
{
    uint64_t v = 0;
    if (blkio_get_uint64(b, n, &v)) return UINT64_MAX;
    return v;
}
static int intp(struct blkio *b, const char *n)
{
    int v = -12345;
    blkio_get_int(b, n, &v);
    return v;
}

static struct blkio_completion wait1(struct blkioq *q)
{
    struct blkio_completion c;
    memset(&c, 0, sizeof(c));
    struct timespec t = { 20, 0 };
    int n = blkioq_do_io(q, &c, 1, 1, &t);
    if (n != 1) c.ret = n < 0 ? n - 100000 : -99999;
    return c;
}
static const char *cmsg(struct blkio_completion c) { return c.error_msg ? c.error_msg : ""; }

static void pattern(unsigned char *p, size_t len, int tag)
{
    for (size_t i = 0; i < len; i++) p[i] = (unsigned char)(i * 7 + tag * 13 + 1 + i / 4096);
}

/* Sum of the interrupt counts of controller `ctrl`'s I/O queues (ctrlq1, ctrlq2, ...; q0 is
 * the admin queue), -1 if there is none. Poll queues have no interrupt vector. */
static long long nvme_irqs(const char *ctrl)
{
    FILE *f = fopen("/proc/interrupts", "r");
    if (!f) return -1;
    char line[1024], key[64];
    long long sum = -1;
    snprintf(key, sizeof(key), "%sq", ctrl);
    while (fgets(line, sizeof(line), f)) {
        char *k = strstr(line, key);
        if (!k) continue;
        char *after = k + strlen(key);
        if (*after == '0' && (after[1] < '0' || after[1] > '9')) continue;
        if (sum < 0) sum = 0;
        char *p = strchr(line, ':');
        if (!p) continue;
        p++;
        for (;;) {
            char *e;
            long long v = strtoll(p, &e, 10);
            if (e == p) break;
            sum += v;
            p = e;
        }
    }
    fclose(f);
    return sum;
}

/* How many io_uring instances of this process hold [addr, addr + len) as a registered
 * buffer, from /proc/self/fdinfo ("UserBufs:" then one "N: 0xADDR/LEN" line per buffer). */
static int fixed_buf_rings(void *addr, size_t len)
{
    char want[64], path[64], line[256];
    snprintf(want, sizeof(want), "0x%llx/%zu", (unsigned long long)(uintptr_t)addr, len);
    int n = 0;
    for (int fd = 0; fd < 1024; fd++) {
        snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", fd);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        int bufs = 0, hit = 0;
        while (fgets(line, sizeof(line), f)) {
            if (strncmp(line, "UserBufs:", 9) == 0) bufs = 1;
            else if (bufs && strstr(line, want)) hit = 1;
        }
        fclose(f);
        n += hit;
    }
    return n;
}

/* Connect failures on paths that are no namespace, with a fresh instance each. */
static void bad_path(const char *what, const char *path, int err, const char *msg)
{
    struct blkio *b = NULL;
    char label[200];
    if (blkio_create("nvme-io_uring", &b)) { CHECK("create", 0); return; }
    blkio_set_str(b, "path", path);
    int rc = blkio_connect(b);
    snprintf(label, sizeof(label), "connect to %s (%s) fails with %s", what, path, strerror(err));
    check(label, rc == -err && (!msg || strcmp(blkio_get_error_msg(), msg) == 0), 0, __LINE__);
    blkio_destroy(&b);
}

static struct blkio *open_ns(const char *path, int ro, int nq)
{
    struct blkio *b = NULL;
    if (blkio_create("nvme-io_uring", &b)) return NULL;
    if (ro) blkio_set_bool(b, "read-only", true);
    blkio_set_str(b, "path", path);
    if (blkio_connect(b) || blkio_set_int(b, "num-queues", nq) || blkio_start(b)) {
        blkio_destroy(&b);
        return NULL;
    }
    return b;
}

/* ---- Zone management (zoned namespace: 16 zones of 4 MiB, 512-byte blocks) ---- */
#define ZSZ (4ull << 20)
#define NZ 16

static struct blkio_completion zop(struct blkioq *q, const char *what, uint64_t off)
{
    if (strcmp(what, "open") == 0) blkioq_open_zone(q, off, NULL, 0);
    else if (strcmp(what, "close") == 0) blkioq_close_zone(q, off, NULL, 0);
    else if (strcmp(what, "finish") == 0) blkioq_finish_zone(q, off, NULL, 0);
    else if (strcmp(what, "reset") == 0) blkioq_reset_zone(q, off, NULL, 0);
    else if (strcmp(what, "open-all") == 0) blkioq_open_all_zones(q, NULL, 0);
    else if (strcmp(what, "close-all") == 0) blkioq_close_all_zones(q, NULL, 0);
    else if (strcmp(what, "finish-all") == 0) blkioq_finish_all_zones(q, NULL, 0);
    else blkioq_reset_all_zones(q, NULL, 0);
    return wait1(q);
}

/* Report nr zones from off into z (entries past what is filled keep the 0xa5 sentinel);
 * prints every filled entry as "ZONE label i fields" for the host to compare. Returns the
 * completion's ret: the number of zones reported, or a negative errno. */
static int report(struct blkioq *q, const char *label, uint64_t off, struct blkio_zone *z, uint32_t nr)
{
    memset(z, 0xa5, sizeof(*z) * (nr + 2));
    blkioq_report_zones(q, off, z, nr, NULL, 0);
    struct blkio_completion c = wait1(q);
    if (c.ret < 0) printf("  (report %s: %d %s)\n", label, c.ret, cmsg(c));
    for (uint32_t i = 0; i < nr + 2; i++) {
        if (z[i].zone_type == 0xa5) continue;
        printf("ZONE %s %u start=%llu len=%llu cap=%llu wp=%llu type=%u state=%u reset=%u\n", label, i,
               (unsigned long long)z[i].start, (unsigned long long)z[i].len,
               (unsigned long long)z[i].capacity, (unsigned long long)z[i].write_pointer,
               z[i].zone_type, z[i].zone_state, z[i].reset);
    }
    return c.ret;
}

static int filled(const struct blkio_zone *z, int n)
{
    int k = 0;
    for (int i = 0; i < n; i++) k += z[i].zone_type != 0xa5;
    return k;
}

/* Zone i of a fresh report: state st, write pointer start + wp, QEMU's geometry. */
static int zone_is(const struct blkio_zone *z, int i, int st, uint64_t wp)
{
    return z->start == (uint64_t)i * ZSZ && z->len == ZSZ && z->capacity == ZSZ &&
           z->zone_type == BLKIO_ZONE_TYPE_SEQWRITE_REQ && z->zone_state == st &&
           z->write_pointer == (uint64_t)i * ZSZ + wp && z->reset == 0;
}

static int state_of(struct blkioq *q, int i, struct blkio_zone *z)
{
    char label[32];
    snprintf(label, sizeof(label), "z%d", i);
    if (report(q, label, (uint64_t)i * ZSZ, z, 1) != 1) return -1;
    return z->zone_state;
}

static void zone_checks(struct blkioq *q, unsigned char *m)
{
    struct blkio_zone *z = calloc(NZ + 8, sizeof(*z));
    struct blkio_completion c;
    if (!z) return;
    CHECK("reset-all", zop(q, "reset-all", 0).ret == 0);
    CHECK("report all 16 zones: ret 16", report(q, "after-reset-all", 0, z, NZ) == NZ);
    int ok = filled(z, NZ + 2) == NZ;
    for (int i = 0; i < NZ; i++) ok = ok && zone_is(&z[i], i, BLKIO_ZONE_STATE_EMPTY, 0);
    CHECK("every zone: start i*4 MiB, len = capacity = 4 MiB, seq-write-required, EMPTY, wp at start", ok);
    CHECK("report 17 zones fills only the 16 the device has", report(q, "all17", 0, z, NZ + 1) == NZ &&
          filled(z, NZ + 3) == NZ);

    /* A write moves the write pointer (implicitly open). */
    pattern(m, 65536, 3);
    blkioq_write(q, 3 * ZSZ, m, 65536, NULL, 0);
    CHECK("write 64 KiB at zone 3", wait1(q).ret == 0);
    CHECK("report at an offset inside zone 3 (start + 4 KiB)",
          report(q, "z3-written", 3 * ZSZ + 4096, z, 1) == 1 && filled(z, 3) == 1);
    CHECK("zone 3 is IMP_OPEN, write pointer at start + 64 KiB", zone_is(z, 3, BLKIO_ZONE_STATE_IMP_OPEN, 65536));
    CHECK("close zone 3", zop(q, "close", 3 * ZSZ).ret == 0);
    CHECK("zone 3 CLOSED", state_of(q, 3, z) == BLKIO_ZONE_STATE_CLOSED && z->write_pointer == 3 * ZSZ + 65536);
    CHECK("open zone 3", zop(q, "open", 3 * ZSZ).ret == 0);
    CHECK("zone 3 EXP_OPEN", state_of(q, 3, z) == BLKIO_ZONE_STATE_EXP_OPEN);
    CHECK("finish zone 3", zop(q, "finish", 3 * ZSZ).ret == 0);
    CHECK("zone 3 FULL", state_of(q, 3, z) == BLKIO_ZONE_STATE_FULL);
    CHECK("the full zone's write pointer is its end", z->write_pointer == 4 * ZSZ);
    blkioq_write(q, 3 * ZSZ + 65536, m, 4096, NULL, 0);
    c = wait1(q);
    CHECK("write to the full zone fails with EIO", c.ret == -EIO);
    CHECK("reset zone 3", zop(q, "reset", 3 * ZSZ).ret == 0);
    CHECK("zone 3 EMPTY, write pointer back at its start", state_of(q, 3, z) == BLKIO_ZONE_STATE_EMPTY &&
          zone_is(z, 3, BLKIO_ZONE_STATE_EMPTY, 0));
    memset(m + 65536, 0xee, 4096);
    blkioq_read(q, 3 * ZSZ, m + 65536, 4096, NULL, 0);
    c = wait1(q);
    int zero = c.ret == 0;
    for (int i = 0; i < 4096; i++) zero = zero && m[65536 + i] == 0;
    CHECK("the reset zone reads as zeros", zero);
    CHECK("open the empty zone 4", zop(q, "open", 4 * ZSZ).ret == 0);
    CHECK("zone 4 EXP_OPEN", state_of(q, 4, z) == BLKIO_ZONE_STATE_EXP_OPEN);
    CHECK("close zone 4 (no data)", zop(q, "close", 4 * ZSZ).ret == 0);
    int s4 = state_of(q, 4, z);
    printf("  (state of the closed zone 4 without data: %d)\n", s4);
    CHECK("zone 4 EMPTY or CLOSED", s4 == BLKIO_ZONE_STATE_EMPTY || s4 == BLKIO_ZONE_STATE_CLOSED);

    /* The all-zones forms on zones 5 and 6 with data. */
    for (int i = 5; i <= 6; i++) {
        pattern(m, 8192, i);
        blkioq_write(q, (uint64_t)i * ZSZ, m, 8192, NULL, 0);
        CHECK(i == 5 ? "write 8 KiB at zone 5" : "write 8 KiB at zone 6", wait1(q).ret == 0);
    }
    CHECK("close-all", zop(q, "close-all", 0).ret == 0);
    CHECK("zones 5 and 6 CLOSED", state_of(q, 5, z) == BLKIO_ZONE_STATE_CLOSED &&
          state_of(q, 6, z) == BLKIO_ZONE_STATE_CLOSED);
    CHECK("open-all", zop(q, "open-all", 0).ret == 0);
    CHECK("zones 5 and 6 EXP_OPEN", state_of(q, 5, z) == BLKIO_ZONE_STATE_EXP_OPEN &&
          state_of(q, 6, z) == BLKIO_ZONE_STATE_EXP_OPEN);
    CHECK("report all after open-all", report(q, "after-open-all", 0, z, NZ) == NZ);
    CHECK("finish-all", zop(q, "finish-all", 0).ret == 0);
    CHECK("report all after finish-all", report(q, "after-finish-all", 0, z, NZ) == NZ);
    CHECK("zones 5 and 6 FULL", z[5].zone_state == BLKIO_ZONE_STATE_FULL && z[6].zone_state == BLKIO_ZONE_STATE_FULL);
    CHECK("the empty zones stay EMPTY", z[7].zone_state == BLKIO_ZONE_STATE_EMPTY && z[0].zone_state == BLKIO_ZONE_STATE_EMPTY);
    CHECK("reset-all", zop(q, "reset-all", 0).ret == 0);
    CHECK("report all after reset-all", report(q, "after-reset-all-2", 0, z, NZ) == NZ);
    ok = filled(z, NZ + 2) == NZ;
    for (int i = 0; i < NZ; i++) ok = ok && zone_is(&z[i], i, BLKIO_ZONE_STATE_EMPTY, 0);
    CHECK("reset-all: every zone EMPTY again", ok);

    /* max-open-zones and max-active-zones (8): a ninth explicit open fails; reset-all frees them. */
    ok = 1;
    for (int i = 7; i < 15; i++) ok = ok && zop(q, "open", (uint64_t)i * ZSZ).ret == 0;
    CHECK("open 8 zones explicitly", ok);
    c = zop(q, "open", 15 * ZSZ);
    printf("  (a ninth open: %d %s)\n", c.ret, cmsg(c));
    CHECK("a ninth open fails with EIO (8 open, 8 active zones at most)", c.ret == -EIO);
    CHECK("report after 8 opens", report(q, "eight-open", 0, z, NZ) == NZ &&
          z[14].zone_state == BLKIO_ZONE_STATE_EXP_OPEN && z[15].zone_state == BLKIO_ZONE_STATE_EMPTY);
    CHECK("reset-all closes them", zop(q, "reset-all", 0).ret == 0 && state_of(q, 14, z) == BLKIO_ZONE_STATE_EMPTY);

    /* Partial reports. */
    CHECK("report 3 zones from zone 2", report(q, "from2", 2 * ZSZ, z, 3) == 3 && filled(z, 5) == 3 &&
          zone_is(&z[0], 2, BLKIO_ZONE_STATE_EMPTY, 0) && zone_is(&z[2], 4, BLKIO_ZONE_STATE_EMPTY, 0));
    CHECK("report 4 zones from zone 14 fills 2: ret 2", report(q, "from14", 14 * ZSZ, z, 4) == 2 &&
          filled(z, 6) == 2 && zone_is(&z[1], 15, BLKIO_ZONE_STATE_EMPTY, 0));
    CHECK("report 1 zone from the last block", report(q, "last", NZ * ZSZ - 512, z, 1) == 1 &&
          zone_is(&z[0], 15, BLKIO_ZONE_STATE_EMPTY, 0));

    /* Errors. */
    c = zop(q, "open", 2 * ZSZ + 4096);
    printf("  (open at zone start + 4 KiB: %d %s)\n", c.ret, cmsg(c));
    CHECK("open at an offset that is no zone start fails with EOPNOTSUPP", c.ret == -EOPNOTSUPP);
    c = zop(q, "reset", 2 * ZSZ + 512);
    printf("  (reset at zone start + 512: %d %s)\n", c.ret, cmsg(c));
    CHECK("reset at an offset that is no zone start fails with EOPNOTSUPP", c.ret == -EOPNOTSUPP);
    c = zop(q, "finish", NZ * ZSZ);
    printf("  (finish at the capacity: %d %s)\n", c.ret, cmsg(c));
    CHECK("finish at the capacity fails with EINVAL", c.ret == -EINVAL);
    blkioq_report_zones(q, NZ * ZSZ, z, 1, NULL, 0);
    c = wait1(q);
    printf("  (report at the capacity: %d %s)\n", c.ret, cmsg(c));
    CHECK("report at the capacity fails with EINVAL", c.ret == -EINVAL);
    CHECK("report at byte offset 100 reports zone 0", report(q, "at100", 100, z, 1) == 1 &&
          zone_is(z, 0, BLKIO_ZONE_STATE_EMPTY, 0));
    blkioq_report_zones(q, 0, z, 0, NULL, 0);
    c = wait1(q);
    printf("  (report of 0 zones: %d %s)\n", c.ret, cmsg(c));
    CHECK("report of 0 zones succeeds with ret 0", c.ret == 0);
    blkioq_open_zone(q, 0, NULL, BLKIO_REQ_FUA);
    CHECK("open with FUA fails with EINVAL", wait1(q).ret == -EINVAL);
    CHECK("final state: zone 2 EMPTY", report(q, "end", 0, z, NZ) == NZ && z[2].zone_state == BLKIO_ZONE_STATE_EMPTY);
    free(z);
}

/* The zone requests on a conventional namespace: EOPNOTSUPP each. */
static void conv_zone_checks(struct blkioq *q)
{
    static const char *ops[] = {"open", "close", "finish", "reset", "open-all", "close-all",
                                "finish-all", "reset-all"};
    struct blkio_zone z[2];
    blkioq_report_zones(q, 0, z, 2, NULL, 0);
    struct blkio_completion c = wait1(q);
    CHECK("report_zones on a conventional namespace fails with EOPNOTSUPP",
          c.ret == -EOPNOTSUPP && strcmp(cmsg(c), "Operation not supported") == 0);
    for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
        char label[160];
        c = zop(q, ops[i], 0);
        printf("  (%s on a conventional namespace: %d %s)\n", ops[i], c.ret, cmsg(c));
        snprintf(label, sizeof(label), "%s on a conventional namespace fails with EOPNOTSUPP", ops[i]);
        CHECK(label, c.ret == -EOPNOTSUPP && strcmp(cmsg(c), "Operation not supported") == 0);
    }
}

/* struct blkio_zone and the zone enums as the header compiled in lays them out. */
static int layout(void)
{
    printf("sizeof %zu start %zu len %zu capacity %zu write_pointer %zu zone_type %zu "
           "zone_state %zu reset %zu reserved_ %zu+%zu\n",
           sizeof(struct blkio_zone), offsetof(struct blkio_zone, start),
           offsetof(struct blkio_zone, len), offsetof(struct blkio_zone, capacity),
           offsetof(struct blkio_zone, write_pointer), offsetof(struct blkio_zone, zone_type),
           offsetof(struct blkio_zone, zone_state), offsetof(struct blkio_zone, reset),
           offsetof(struct blkio_zone, reserved_), sizeof(((struct blkio_zone *)0)->reserved_));
    printf("types %d %d %d states %d %d %d %d %d %d %d\n", BLKIO_ZONE_TYPE_CONVENTIONAL,
           BLKIO_ZONE_TYPE_SEQWRITE_REQ, BLKIO_ZONE_TYPE_SEQWRITE_PREF, BLKIO_ZONE_STATE_EMPTY,
           BLKIO_ZONE_STATE_IMP_OPEN, BLKIO_ZONE_STATE_EXP_OPEN, BLKIO_ZONE_STATE_CLOSED,
           BLKIO_ZONE_STATE_READONLY, BLKIO_ZONE_STATE_FULL, BLKIO_ZONE_STATE_OFFLINE);
    return 0;
}

static int conv(const char *ng, const char *blk, const char *ctrl, int tag)
{
    struct blkio *b = NULL;
    CHECK("create nvme-io_uring", blkio_create("nvme-io_uring", &b) == 0);
    if (!b) return 1;
    dump(b, "created");
    int e = blkio_set_int(b, "num-entries", 64);
    CHECK("num-entries before connect fails with ENODEV", e == -ENODEV);
    CHECK("set path", blkio_set_str(b, "path", ng) == 0);
    CHECK("connect", blkio_connect(b) == 0);
    dump(b, "connected");
    CHECK("capacity 64 MiB", u64p(b, "capacity") == 64u << 20);
    CHECK("request-alignment 512", intp(b, "request-alignment") == 512);
    CHECK("not zoned", intp(b, "zoned") == 0);
    int mt = intp(b, "max-transfer");
    FIX("max-transfer respects MDTS (512 KiB)", mt == 512 * 1024);
    CHECK("num-entries 64 when connected", blkio_set_int(b, "num-entries", 64) == 0);
    CHECK("num-poll-queues 1", blkio_set_int(b, "num-poll-queues", 1) == 0);
    CHECK("num-queues 2", blkio_set_int(b, "num-queues", 2) == 0);
    int src = blkio_start(b);
    FIX("start with 2 queues and a poll queue", src == 0);
    if (src) { /* libblkio: EINVAL "num_poll_queues must be 0" */
        blkio_set_int(b, "num-poll-queues", 0);
        src = blkio_start(b);
    }
    CHECK("start", src == 0);
    dump(b, "started");
    struct blkioq *q = blkio_get_queue(b, 0), *q1 = blkio_get_queue(b, 1);
    CHECK("two queues", q && q1);
    if (!q || !q1) return 1;
    CHECK("completion fd", blkioq_get_completion_fd(q) >= 0);

    size_t big = (size_t)(mt > 0 ? mt : 1 << 20) * 2;
    unsigned char *m = aligned_alloc(4096, big + (4 << 20));
    if (!m) return 1;
    unsigned char *rd = m + big;
    uint64_t base = (32u << 20) + (uint64_t)tag * (4u << 20);
    struct blkio_completion c;

    /* The pattern the host checks: 256 KiB at base (write), the second 128 KiB of it
     * rewritten with FUA, then 64 KiB at base + 512 KiB zeroed by write-zeroes and 64 KiB at
     * base + 1 MiB written, then discarded. */
    pattern(m, 256 * 1024, tag);
    blkioq_write(q, base, m, 256 * 1024, NULL, 0);
    CHECK("write 256 KiB", (c = wait1(q)).ret == 0);
    blkioq_write(q, base + 131072, m + 131072, 131072, NULL, BLKIO_REQ_FUA);
    CHECK("write 128 KiB FUA", (c = wait1(q)).ret == 0);
    memset(rd, 0, 256 * 1024);
    blkioq_read(q1, base, rd, 256 * 1024, NULL, 0);
    c = wait1(q1);
    CHECK("read back 256 KiB on the second queue", c.ret == 0 && memcmp(m, rd, 256 * 1024) == 0);
    /* Vectored: 3 x 4 KiB scattered in memory. */
    struct iovec iov[3];
    for (int i = 0; i < 3; i++) { iov[i].iov_base = rd + 262144 + i * 16384; iov[i].iov_len = 4096; }
    memset(rd + 262144, 0, 3 * 16384);
    blkioq_readv(q, base + 8192, iov, 3, NULL, 0);
    c = wait1(q);
    int same = c.ret == 0;
    for (int i = 0; i < 3; i++) same = same && memcmp(iov[i].iov_base, m + 8192 + i * 4096, 4096) == 0;
    CHECK("readv of 3 segments", same);
    pattern(m + 524288, 65536, tag + 1);
    for (int i = 0; i < 2; i++) { iov[i].iov_base = m + 524288 + i * 32768; iov[i].iov_len = 32768; }
    blkioq_writev(q, base + 524288, iov, 2, NULL, 0);
    CHECK("writev of 2 segments", wait1(q).ret == 0);
    blkioq_read(q, base + 524288, rd, 65536, NULL, 0);
    c = wait1(q);
    CHECK("writev data reads back", c.ret == 0 && memcmp(rd, m + 524288, 65536) == 0);
    blkioq_write_zeroes(q, base + 524288, 65536, NULL, 0);
    CHECK("write-zeroes 64 KiB", wait1(q).ret == 0);
    memset(rd, 1, 65536);
    blkioq_read(q, base + 524288, rd, 65536, NULL, 0);
    c = wait1(q);
    int zero = c.ret == 0;
    for (int i = 0; i < 65536; i++) zero = zero && rd[i] == 0;
    CHECK("write-zeroes range reads as zeros", zero);
    blkioq_write(q, base + 524288, m, 4096, NULL, 0);
    CHECK("write 4 KiB over the zeroed range", wait1(q).ret == 0);
    blkioq_write_zeroes(q, base + 524288, 4096, NULL, BLKIO_REQ_NO_UNMAP | BLKIO_REQ_FUA);
    CHECK("write-zeroes NO_UNMAP|FUA", wait1(q).ret == 0);
    memset(rd, 1, 4096);
    blkioq_read(q, base + 524288, rd, 4096, NULL, 0);
    c = wait1(q);
    zero = c.ret == 0;
    for (int i = 0; i < 4096; i++) zero = zero && rd[i] == 0;
    CHECK("write-zeroes NO_UNMAP range reads as zeros", zero);
    /* Discard of written data: reads back as zeros (the image is opened with discard=unmap,
     * so QEMU punches a hole); the host checks the range too. */
    blkioq_write(q, base + 1048576, m, 65536, NULL, 0);
    CHECK("write 64 KiB to discard", wait1(q).ret == 0);
    blkioq_discard(q, base + 1048576, 65536, NULL, 0);
    CHECK("discard 64 KiB", wait1(q).ret == 0);
    memset(rd, 1, 65536);
    blkioq_read(q, base + 1048576, rd, 65536, NULL, 0);
    c = wait1(q);
    zero = c.ret == 0;
    for (int i = 0; i < 65536; i++) zero = zero && rd[i] == 0;
    CHECK("discarded range reads as zeros", zero);
    blkioq_flush(q, NULL, 0);
    CHECK("flush", wait1(q).ret == 0);

    /* A mapped memory region: registered as a fixed buffer of every queue's ring (the rings'
     * fdinfo lists it), I/O from it on both queues, and still usable once unmapped. */
    struct blkio_mem_region r;
    CHECK("alloc a 1 MiB region", blkio_alloc_mem_region(b, &r, 1 << 20) == 0);
    CHECK("map it", blkio_map_mem_region(b, &r) == 0);
    int nreg = fixed_buf_rings(r.addr, r.len);
    FIX("the mapped region is a fixed buffer of every queue's ring", nreg >= 3);
    printf("  (rings holding the region as a fixed buffer: %d)\n", nreg);
    unsigned char *rm = r.addr;
    pattern(rm, 65536, tag + 20);
    blkioq_write(q, base + 3584 * 1024, rm, 65536, NULL, 0);
    CHECK("write 64 KiB from the region", wait1(q).ret == 0);
    memset(rm + 65536, 0, 65536);
    blkioq_read(q1, base + 3584 * 1024, rm + 65536, 65536, NULL, 0);
    c = wait1(q1);
    CHECK("read it back into the region on the second queue", c.ret == 0 && memcmp(rm, rm + 65536, 65536) == 0);
    blkio_unmap_mem_region(b, &r);
    FIX("unmapped: no ring holds it any more", fixed_buf_rings(r.addr, r.len) == 0);
    memset(rm + 65536, 0, 65536);
    blkioq_read(q, base + 3584 * 1024, rm + 65536, 65536, NULL, 0);
    c = wait1(q);
    CHECK("the unmapped region still works for I/O", c.ret == 0 && memcmp(rm, rm + 65536, 65536) == 0);
    blkio_free_mem_region(b, &r);

    /* Request validation. */
    blkioq_read(q, 1, rd, 512, NULL, 0);
    c = wait1(q);
    CHECK("read at start 1 fails with EINVAL",
          c.ret == -EINVAL && strcmp(cmsg(c), "start and len must be multiples of property \"request-alignment\"") == 0);
    blkioq_read(q, 0, rd, 100, NULL, 0);
    CHECK("read of 100 bytes fails with EINVAL", wait1(q).ret == -EINVAL);
    blkioq_read(q, base, rd + 1, 4096, NULL, 0);
    c = wait1(q);
    /* Below buf-alignment: neither library checks; the kernel copies through a bounce buffer. */
    CHECK("read into a buffer at an odd address works", c.ret == 0 && memcmp(rd + 1, m, 4096) == 0);
    blkioq_read(q, 0, rd, 0, NULL, 0);
    CHECK("read of 0 bytes fails with EINVAL", wait1(q).ret == -EINVAL);
    blkioq_read(q, 0, m, big, NULL, 0);
    CHECK("read of twice max-transfer fails with EINVAL", wait1(q).ret == -EINVAL);
    if (mt > 0) {
        blkioq_read(q, 0, m, (size_t)mt, NULL, 0);
        c = wait1(q);
        FIX("read of max-transfer bytes succeeds", c.ret == 0);
        if (c.ret) printf("  read of %d bytes: %d %s\n", mt, c.ret, cmsg(c));
    }
    blkioq_read(q, 64u << 20, rd, 4096, NULL, 0);
    c = wait1(q);
    FIX("read at capacity fails with EIO (libblkio: EINVAL)", c.ret == -EIO);
    printf("  (read at capacity: %d %s)\n", c.ret, cmsg(c));
    blkioq_write(q, (64u << 20) - 4096, m, 8192, NULL, 0);
    c = wait1(q);
    FIX("write across the end fails with EIO (libblkio: EINVAL)", c.ret == -EIO);
    printf("  (write across the end: %d %s)\n", c.ret, cmsg(c));
    blkioq_read(q, 0, rd, 4096, NULL, BLKIO_REQ_FUA);
    CHECK("read with FUA fails with EINVAL", wait1(q).ret == -EINVAL);
    conv_zone_checks(q);

    /* The poll queue (QEMU NVMe with nvme.poll_queues=1): data, every request type, and no
     * interrupt on the controller's I/O queues while it runs. */
    struct blkioq *pq = blkio_get_poll_queue(b, 0);
    FIX("poll queue has no completion fd", pq && blkioq_get_completion_fd(pq) == -1);
    const char *cn = strrchr(ctrl, '/') ? strrchr(ctrl, '/') + 1 : ctrl;
    long long irq0 = nvme_irqs(cn);
    for (int i = 0; i < 8; i++) {
        blkioq_read(q, base + i * 4096, rd, 4096, NULL, 0);
        wait1(q);
    }
    long long irqq = nvme_irqs(cn);
    CHECK("regular-queue I/O raises interrupts (the counter sees them)", irq0 >= 0 && irqq - irq0 >= 4);
    irq0 = irqq;
    int okp = pq != NULL;
    pattern(m, 131072, tag + 9);
    for (int i = 0; i < 32 && okp; i++) {
        blkioq_write(pq, base + (2u << 20) + i * 4096, m + i * 4096, 4096, NULL, 0);
        okp = wait1(pq).ret == 0;
        memset(rd, 0, 4096);
        blkioq_read(pq, base + (2u << 20) + i * 4096, rd, 4096, NULL, 0);
        okp = okp && wait1(pq).ret == 0 && memcmp(rd, m + i * 4096, 4096) == 0;
    }
    long long irq1 = nvme_irqs(cn);
    FIX("poll queue: 32 writes read back", okp);
    FIX("poll queue I/O raises no interrupt", okp && irq0 >= 0 && irq1 - irq0 < 4);
    printf("  (I/O queue interrupts of %s during the poll I/O: %lld)\n", cn, irq1 - irq0);
    if (pq) {
        blkioq_write(pq, base + (3u << 20), m, 8192, NULL, BLKIO_REQ_FUA);
        okp = wait1(pq).ret == 0;
        blkioq_flush(pq, NULL, 0);
        okp = okp && wait1(pq).ret == 0;
        blkioq_write_zeroes(pq, base + (3u << 20), 4096, NULL, 0);
        okp = okp && wait1(pq).ret == 0;
        blkioq_discard(pq, base + (3u << 20) + 4096, 4096, NULL, 0);
        okp = okp && wait1(pq).ret == 0;
    }
    FIX("poll queue: FUA write, flush, write-zeroes, discard", pq && okp);
    blkio_destroy(&b);

    /* Read-only instance. */
    b = open_ns(ng, 1, 1);
    CHECK("read-only open", b != NULL);
    if (b) {
        q = blkio_get_queue(b, 0);
        dump(b, "read-only");
        pattern(m, 4096, tag + 5);
        blkioq_write(q, base, m, 4096, NULL, 0);
        c = wait1(q);
        CHECK("write on a read-only instance fails with EBADF",
              c.ret == -EBADF && strcmp(cmsg(c), "driver is in read-only mode") == 0);
        pattern(m, 4096, tag);
        blkioq_read(q, base, rd, 4096, NULL, 0);
        c = wait1(q);
        CHECK("read on a read-only instance", c.ret == 0 && memcmp(rd, m, 4096) == 0);
        blkio_destroy(&b);
    }

    /* Paths that are no namespace character device. */
    bad_path("a block device", blk, EINVAL, "The file must be a character device");
    bad_path("a directory", "/dev", EINVAL, "The file must be a character device");
    bad_path("a missing file", "/dev/nonexistent-ng", ENOENT, NULL);
    bad_path("/dev/null", "/dev/null", ENOTTY, NULL);
    bad_path("the controller device", ctrl, ENOTTY, NULL);
    struct blkio *nb = NULL;
    blkio_create("nvme-io_uring", &nb);
    CHECK("connect without path fails with EINVAL", blkio_connect(nb) == -EINVAL);
    blkio_destroy(&nb);
    int nfd = open(ng, O_RDWR | O_CLOEXEC);
    blkio_create("nvme-io_uring", &nb);
    blkio_set_str(nb, "path", ng);
    blkio_set_int(nb, "fd", nfd);
    int prc = blkio_connect(nb);
    printf("  (path and fd: %d %s)\n", prc, prc ? blkio_get_error_msg() : "");
    CHECK("connect with both path and fd fails with EINVAL", nfd >= 0 && prc == -EINVAL);
    blkio_destroy(&nb);
    if (nfd >= 0) close(nfd);
    free(m);
    printf("%d passed, %d failed\n", passes, fails);
    return fails ? 1 : 0;
}

static int zns(const char *ng, int zone)
{
    struct blkio *b = NULL;
    CHECK("create nvme-io_uring", blkio_create("nvme-io_uring", &b) == 0);
    if (!b) return 1;
    blkio_set_str(b, "path", ng);
    CHECK("connect to the zoned namespace", blkio_connect(b) == 0);
    dump(b, "zns-connected");
    CHECK("zoned = 2 (host-managed)", intp(b, "zoned") == 2);
    CHECK("zone-size 4 MiB", u64p(b, "zone-size") == 4u << 20);
    CHECK("nr-zones 16", u64p(b, "nr-zones") == 16);
    CHECK("max-open-zones 8", intp(b, "max-open-zones") == 8);
    CHECK("max-active-zones 8", intp(b, "max-active-zones") == 8);
    bool app = false;
    CHECK("append-support", blkio_get_bool(b, "append-support", &app) == 0 && app);
    FIX("zone-append-max-bytes = MDTS (ZASL 0)", u64p(b, "zone-append-max-bytes") == 512 * 1024);
    CHECK("start", blkio_start(b) == 0);
    struct blkioq *q = blkio_get_queue(b, 0);
    if (!q) return 1;
    unsigned char *m = aligned_alloc(4096, 1 << 20);
    unsigned char *rd = m + (512 << 10);
    zone_checks(q, m);
    uint64_t z = (uint64_t)zone * (4u << 20);
    struct blkio_completion c;
    pattern(m, 131072, zone);
    blkioq_write(q, z, m, 65536, NULL, 0);
    CHECK("write at the write pointer (zone start)", (c = wait1(q)).ret == 0);
    blkioq_write(q, z + 65536, m + 65536, 65536, NULL, BLKIO_REQ_FUA);
    CHECK("write at the advanced write pointer (FUA)", (c = wait1(q)).ret == 0);
    blkioq_write(q, z + (1u << 20), m, 4096, NULL, 0);
    c = wait1(q);
    CHECK("write away from the write pointer fails with EIO", c.ret == -EIO);
    printf("  (away from the write pointer: %d %s)\n", c.ret, cmsg(c));
    blkioq_write(q, z, m, 4096, NULL, 0);
    CHECK("write below the write pointer fails with EIO", wait1(q).ret == -EIO);
    memset(rd, 0, 131072);
    blkioq_read(q, z, rd, 131072, NULL, 0);
    c = wait1(q);
    CHECK("read back 128 KiB of the zone", c.ret == 0 && memcmp(rd, m, 131072) == 0);
    blkioq_flush(q, NULL, 0);
    CHECK("flush", wait1(q).ret == 0);
    blkio_destroy(&b);

    /* A read-only instance: reports work, management requests fail. */
    b = open_ns(ng, 1, 1);
    CHECK("read-only open of the zoned namespace", b != NULL);
    if (b) {
        q = blkio_get_queue(b, 0);
        struct blkio_zone rz[3];
        CHECK("report on a read-only instance", report(q, "ro", (uint64_t)zone * ZSZ, rz, 1) == 1 &&
              zone_is(rz, zone, BLKIO_ZONE_STATE_IMP_OPEN, 131072));
        c = zop(q, "reset", (uint64_t)zone * ZSZ);
        printf("  (reset on a read-only instance: %d %s)\n", c.ret, cmsg(c));
        FIX("reset on a read-only instance fails with EBADF", c.ret == -EBADF);
        c = zop(q, "finish-all", 0);
        FIX("finish-all on a read-only instance fails with EBADF", c.ret == -EBADF);
        blkio_destroy(&b);
    }
    free(m);
    printf("%d passed, %d failed\n", passes, fails);
    return fails ? 1 : 0;
}

/* A namespace whose LBA format carries 8 bytes of metadata: refused at connect. */
static int meta(const char *ng)
{
    struct blkio *b = NULL;
    CHECK("create nvme-io_uring", blkio_create("nvme-io_uring", &b) == 0);
    if (!b) return 1;
    blkio_set_str(b, "path", ng);
    int rc = blkio_connect(b);
    printf("  (connect to the metadata namespace: %d %s)\n", rc, rc ? blkio_get_error_msg() : "");
    CHECK("connect to a namespace with metadata fails with EINVAL", rc == -EINVAL);
    FIX("the message names the metadata", rc && strstr(blkio_get_error_msg(), "metadata") != NULL);
    blkio_destroy(&b);
    printf("%d passed, %d failed\n", passes, fails);
    return fails ? 1 : 0;
}

/* A namespace of 4 KiB blocks: the alignments follow the block size. */
static int lba4k(const char *ng, int tag)
{
    struct blkio *b = NULL;
    CHECK("create nvme-io_uring", blkio_create("nvme-io_uring", &b) == 0);
    if (!b) return 1;
    blkio_set_str(b, "path", ng);
    CHECK("connect to the 4 KiB namespace", blkio_connect(b) == 0);
    dump(b, "lba4k-connected");
    CHECK("request-alignment 4096", intp(b, "request-alignment") == 4096);
    CHECK("buf-alignment 4096", intp(b, "buf-alignment") == 4096);
    CHECK("capacity 8 MiB", u64p(b, "capacity") == 8u << 20);
    CHECK("start", blkio_start(b) == 0);
    struct blkioq *q = blkio_get_queue(b, 0);
    if (!q) return 1;
    unsigned char *m = aligned_alloc(4096, 1 << 20);
    uint64_t base = (1u << 20) + (uint64_t)tag * (1u << 20);
    struct blkio_completion c;
    pattern(m, 65536, tag + 30);
    blkioq_write(q, base + 512, m, 4096, NULL, 0);
    CHECK("write at a 512-byte offset fails with EINVAL", wait1(q).ret == -EINVAL);
    blkioq_write(q, base, m, 512, NULL, 0);
    CHECK("write of 512 bytes fails with EINVAL", wait1(q).ret == -EINVAL);
    blkioq_write(q, base, m, 65536, NULL, BLKIO_REQ_FUA);
    CHECK("write 64 KiB (FUA)", wait1(q).ret == 0);
    memset(m + 65536, 0, 65536);
    blkioq_read(q, base, m + 65536, 65536, NULL, 0);
    c = wait1(q);
    CHECK("read back 64 KiB", c.ret == 0 && memcmp(m, m + 65536, 65536) == 0);
    blkioq_write_zeroes(q, base + 8192, 4096, NULL, 0);
    CHECK("write-zeroes of one block", wait1(q).ret == 0);
    blkio_destroy(&b);
    free(m);
    printf("%d passed, %d failed\n", passes, fails);
    return fails ? 1 : 0;
}

/* The controller disappears while the instance is started: PCIDEV is its sysfs directory,
 * whose "remove" this program writes. Requests then fail (no hang) and destroy returns. */
static int gone(const char *ng, const char *pcidev, int tag)
{
    struct blkio *b = open_ns(ng, 0, 1);
    CHECK("open the 4 KiB namespace", b != NULL);
    if (!b) return 1;
    struct blkioq *q = blkio_get_queue(b, 0);
    unsigned char *m = aligned_alloc(4096, 65536);
    uint64_t base = (4u << 20) + (uint64_t)tag * (1u << 20);
    struct blkio_completion c;
    pattern(m, 8192, tag + 40);
    blkioq_write(q, base, m, 8192, NULL, BLKIO_REQ_FUA);
    CHECK("write 8 KiB (FUA) before the removal", wait1(q).ret == 0);
    char path[512];
    snprintf(path, sizeof(path), "%s/remove", pcidev);
    FILE *f = fopen(path, "w");
    int removed = f && fputs("1", f) >= 0;
    if (f) removed = fclose(f) == 0 && removed;
    CHECK("remove the controller (sysfs remove)", removed);
    blkioq_read(q, base, m + 8192, 4096, NULL, 0);
    c = wait1(q);
    printf("  (read after the removal: %d %s)\n", c.ret, cmsg(c));
    CHECK("a read after the removal fails with ENODEV, no hang", c.ret == -ENODEV);
    blkioq_write(q, base + 8192, m, 4096, NULL, 0);
    c = wait1(q);
    printf("  (write after the removal: %d %s)\n", c.ret, cmsg(c));
    CHECK("a write after the removal fails with ENODEV, no hang", c.ret == -ENODEV);
    blkio_destroy(&b);
    CHECK("destroy returns", b == NULL);
    struct blkio *b2 = NULL;
    blkio_create("nvme-io_uring", &b2);
    blkio_set_str(b2, "path", ng);
    int rc = blkio_connect(b2);
    CHECK("connect to the removed namespace fails with ENOENT", rc == -ENOENT);
    blkio_destroy(&b2);
    free(m);
    printf("%d passed, %d failed\n", passes, fails);
    return fails ? 1 : 0;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    alarm(120);
    if (argc == 6 && strcmp(argv[1], "conv") == 0) return conv(argv[2], argv[3], argv[4], atoi(argv[5]));
    if (argc == 4 && strcmp(argv[1], "zns") == 0) return zns(argv[2], atoi(argv[3]));
    if (argc == 2 && strcmp(argv[1], "layout") == 0) return layout();
    if (argc == 3 && strcmp(argv[1], "meta") == 0) return meta(argv[2]);
    if (argc == 5 && strcmp(argv[1], "gone") == 0) return gone(argv[2], argv[3], atoi(argv[4]));
    if (argc == 4 && strcmp(argv[1], "lba4k") == 0) return lba4k(argv[2], atoi(argv[3]));
    fprintf(stderr, "usage: %s conv NGDEV BLKDEV CTRLDEV TAG | zns NGDEV ZONE | meta NGDEV | "
            "lba4k NGDEV TAG | gone NGDEV PCIDEV TAG\n", argv[0]);
    return 2;
}
