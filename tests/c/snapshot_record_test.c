/* The snapshot driver through the libblkio C ABI with a COW record beside the COW: a block whose
 * payload is corrupt completes with -EIO, never with wrong bytes, and the blocks around it read
 * back as the new image. snapblk's own driver, so this test is not run against the real
 * libblkio. usage: snapshot_record_test BASE COW NEW_IMAGE BAD_BLOCK */
#include <blkio.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int passes, fails;
static void check(const char *name, int ok)
{
    printf("%s %s\n", ok ? "PASS" : "FAIL", name);
    if (ok) passes++; else fails++;
}

static int read_block(struct blkioq *q, unsigned long long blk, void *buf)
{
    struct blkio_completion c;
    blkioq_read(q, blk * 4096, buf, 4096, NULL, 0);
    if (blkioq_do_io(q, &c, 1, 1, NULL) != 1) return -9999;
    return c.ret;
}

int main(int argc, char **argv)
{
    if (argc != 5) { fprintf(stderr, "usage: %s BASE COW NEW BAD_BLOCK\n", argv[0]); return 2; }
    unsigned long long bad = strtoull(argv[4], NULL, 10);
    struct blkio *b = NULL;
    if (blkio_create("snapshot", &b) < 0 || blkio_set_str(b, "base", argv[1]) < 0 ||
        blkio_set_str(b, "cow", argv[2]) < 0 || blkio_connect(b) < 0 || blkio_start(b) < 0) {
        printf("FAIL open: %s\n", blkio_get_error_msg());
        return 1;
    }
    struct blkioq *q = blkio_get_queue(b, 0);
    FILE *f = fopen(argv[3], "rb");
    if (!f) { printf("FAIL open %s\n", argv[3]); return 1; }
    static char got[4096], want[4096];
    check("corrupt block completes with -EIO", read_block(q, bad, got) == -EIO);
    check("corrupt block, second read, -EIO again", read_block(q, bad, got) == -EIO);
    unsigned long long others[] = { 0, bad > 0 ? bad - 1 : bad + 2, bad + 1 };
    for (int i = 0; i < 3; i++) {
        unsigned long long blk = others[i];
        fseek(f, (long)(blk * 4096), SEEK_SET);
        int ok = fread(want, 1, 4096, f) == 4096 && read_block(q, blk, got) == 0 &&
                 memcmp(got, want, 4096) == 0;
        char name[96];
        snprintf(name, sizeof(name), "block %llu reads back as the new image", blk);
        check(name, ok);
    }
    fclose(f);
    blkio_destroy(&b);
    printf("%d passed, %d failed\n", passes, fails);
    return fails != 0;
}
