/*
 * Shared by the C driver tests that compare snapblk's libblkio.so.1 with the real libblkio 1.5
 * (vhost_user_test.c, vdpa_test.c, vfio_test.c): one "PASS|FAIL [fix] name (line N)" line per
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

#endif
