/*
 * rachunk: the reference warm-up of the readahead anchors
 * (shared/notes/anchors-readahead-sched-bench.md, A.3: "readahead(2) per 2 MiB chunk,
 * 1 thread", 3.9-4.3 s settled on /usr/lib when the disk read 4.4 GiB/s). Walks TREE with
 * nftw, calls readahead(2) on every 2 MiB chunk of every regular file, then waits until every
 * page is up to date (mmap + mincore, re-checking only incomplete files) so that its time is
 * comparable with `snapblk readahead warm`, which also ends when the data is verified
 * resident. readahead(2) is advisory and the kernel occasionally drops a chunk (seen: a run
 * that never settled), so like snapblk it re-issues the chunks of files found incomplete,
 * here on every check pass; already cached pages cost nothing to re-issue.
 *
 * Usage: rachunk TREE          prints: files N bytes N issue_s X settled_s Y resident_pct Z
 * Built by bench/readahead-bench.sh with `cc -O2`.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define CHUNK (2UL << 20)

static char **paths;
static size_t npaths, cap;

static void issue(int fd, off_t size)
{
	for (off_t off = 0; off < size; off += CHUNK)
		readahead(fd, off, CHUNK);
}
static unsigned long long total_bytes;

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int visit(const char *p, const struct stat *st, int type, struct FTW *ftw)
{
	(void)ftw;
	if (type != FTW_F || !S_ISREG(st->st_mode) || st->st_size == 0)
		return 0;
	int fd = open(p, O_RDONLY | O_NOATIME | O_CLOEXEC);
	if (fd < 0)
		fd = open(p, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	issue(fd, st->st_size);
	close(fd);
	total_bytes += st->st_size;
	if (npaths == cap) {
		cap = cap ? cap * 2 : 4096;
		paths = realloc(paths, cap * sizeof(*paths));
		if (!paths) {
			perror("realloc");
			exit(1);
		}
	}
	paths[npaths++] = strdup(p);
	return 0;
}

/* Pages of PATH not yet up to date (0 if the file vanished or cannot be mapped); with
 * REISSUE, incomplete files get their chunks issued again. */
static size_t missing(const char *path, size_t *pages_out, int reissue)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	off_t size = lseek(fd, 0, SEEK_END);
	long ps = sysconf(_SC_PAGESIZE);
	size_t pages = (size + ps - 1) / ps, miss = 0;
	*pages_out = pages;
	void *m = size > 0 ? mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0) : MAP_FAILED;
	close(fd);
	if (m == MAP_FAILED)
		return 0;
	unsigned char *vec = malloc(pages);
	if (vec && mincore(m, size, vec) == 0)
		for (size_t i = 0; i < pages; i++)
			miss += !(vec[i] & 1);
	free(vec);
	munmap(m, size);
	if (miss && reissue) {
		fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd >= 0) {
			issue(fd, size);
			close(fd);
		}
	}
	return miss;
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: %s TREE\n", argv[0]);
		return 2;
	}
	double t0 = now();
	if (nftw(argv[1], visit, 64, FTW_PHYS | FTW_MOUNT) != 0) {
		perror("nftw");
		return 1;
	}
	double t1 = now();
	/* Settle: re-check incomplete files until all are resident (at most 60 s). */
	size_t pending = npaths, all_pages = 0, missing_pages = 0;
	size_t *idx = malloc(npaths * sizeof(*idx));
	for (size_t i = 0; i < npaths; i++)
		idx[i] = i;
	int first = 1;
	while (pending && now() - t1 < 60) {
		size_t keep = 0;
		missing_pages = 0;
		for (size_t k = 0; k < pending; k++) {
			size_t pages = 0, miss = missing(paths[idx[k]], &pages, !first);
			if (first)
				all_pages += pages;
			if (miss) {
				idx[keep++] = idx[k];
				missing_pages += miss;
			}
		}
		first = 0;
		pending = keep;
		if (pending)
			usleep(10000);
	}
	double t2 = now();
	printf("files %zu bytes %llu issue_s %.3f settled_s %.3f resident_pct %.3f\n", npaths,
	       total_bytes, t1 - t0, t2 - t0,
	       all_pages ? 100.0 * (all_pages - missing_pages) / all_pages : 100.0);
	return 0;
}
