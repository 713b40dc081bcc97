/* Which drivers a build of libblkio.so.1 ships (drivers are cargo features of the library):
 * every name after "+" must create and destroy, every name after "-" must fail exactly as
 * libblkio fails for a name it does not know (-ENOENT, "Unknown driver name").
 * usage: drivers_test [+NAME | -NAME]... */
#include <blkio.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
    int passes = 0, fails = 0;
    if (argc < 2) { fprintf(stderr, "usage: %s [+NAME | -NAME]...\n", argv[0]); return 2; }
    for (int i = 1; i < argc; i++) {
        const char *name = argv[i] + 1;
        struct blkio *b = NULL;
        int rc = blkio_create(name, &b);
        int ok;
        if (argv[i][0] == '+') {
            ok = rc == 0 && b != NULL;
            printf("%s driver %s is built in%s%s\n", ok ? "PASS" : "FAIL", name,
                   ok ? "" : ": ", ok ? "" : blkio_get_error_msg());
        } else {
            ok = rc == -ENOENT && b == NULL && strcmp(blkio_get_error_msg(), "Unknown driver name") == 0;
            printf("%s driver %s is left out (rc=%d, msg=%s)\n", ok ? "PASS" : "FAIL", name, rc,
                   blkio_get_error_msg());
        }
        if (b) blkio_destroy(&b);
        if (ok) passes++; else fails++;
    }
    return fails ? 1 : 0;
}
