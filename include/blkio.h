/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * blkio.h - block I/O library API, ABI-compatible with libblkio 1.x (libblkio.so.1).
 * Written for snapblk (https://example.invalid/snapblk); see docs/blkio.md for the
 * differences from libblkio 1.5 (bug fixes only).
 *
 * Every function returning int returns >= 0 on success and a negative errno on failure,
 * with a message for the calling thread in blkio_get_error_msg().
 */
#ifndef BLKIO_H
#define BLKIO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <signal.h>
#include <time.h>
#include <sys/uio.h>

#ifdef __cplusplus
extern "C" {
#endif

struct blkio;   /* a device instance (opaque) */
struct blkioq;  /* a request queue (opaque), used by one thread at a time */

/* A memory region; layout is part of the ABI (40 bytes). */
struct blkio_mem_region {
    void *addr;
    size_t len;
    uint64_t iova;      /* reserved, 0 */
    int64_t fd_offset;
    int fd;             /* -1 if the memory has no fd */
    uint32_t flags;     /* reserved, 0 */
};

/* One completed request (32 bytes). */
struct blkio_completion {
    void *user_data;       /* as passed with the request */
    const char *error_msg; /* static string or NULL; NULL when ret == 0 */
    int ret;               /* 0 or a negative errno */
    uint8_t reserved_[12];
};

/* Zoned-storage descriptor (64 bytes), filled by blkioq_report_zones. */
struct blkio_zone {
    uint64_t start;
    uint64_t len;
    uint64_t capacity;
    uint64_t write_pointer;
    uint8_t zone_type;
    uint8_t zone_state;
    uint8_t reset;
    uint8_t reserved_[29];
};

enum {
    BLKIO_REQ_FUA = 1 << 0,         /* write is durable on completion */
    BLKIO_REQ_NO_UNMAP = 1 << 1,    /* write_zeroes: keep the blocks allocated */
    BLKIO_REQ_NO_FALLBACK = 1 << 2, /* write_zeroes: fail rather than write zero buffers */
};

enum {
    BLKIO_ZONE_TYPE_CONVENTIONAL = 0x1,
    BLKIO_ZONE_TYPE_SEQWRITE_REQ = 0x2,
    BLKIO_ZONE_TYPE_SEQWRITE_PREF = 0x3,
};

enum {
    BLKIO_ZONE_STATE_EMPTY = 0x1,
    BLKIO_ZONE_STATE_IMP_OPEN = 0x2,
    BLKIO_ZONE_STATE_EXP_OPEN = 0x3,
    BLKIO_ZONE_STATE_CLOSED = 0x4,
    BLKIO_ZONE_STATE_READONLY = 0xD,
    BLKIO_ZONE_STATE_FULL = 0xE,
    BLKIO_ZONE_STATE_OFFLINE = 0xF,
};

/* The calling thread's last error message ("" before any error). */
const char *blkio_get_error_msg(void);

/* Lifecycle: created -> connected -> started. */
int blkio_create(const char *driver, struct blkio **bp);
int blkio_connect(struct blkio *b);
int blkio_start(struct blkio *b);
void blkio_destroy(struct blkio **bp);

/* Properties (names use '-'); *_str accessors work for every type. */
int blkio_get_bool(struct blkio *b, const char *name, bool *value);
int blkio_get_int(struct blkio *b, const char *name, int *value);
int blkio_get_uint64(struct blkio *b, const char *name, uint64_t *value);
int blkio_get_str(struct blkio *b, const char *name, char **value); /* free() the string */
int blkio_set_bool(struct blkio *b, const char *name, bool value);
int blkio_set_int(struct blkio *b, const char *name, int value);
int blkio_set_uint64(struct blkio *b, const char *name, uint64_t value);
int blkio_set_str(struct blkio *b, const char *name, const char *value);

/* Memory regions. */
int blkio_alloc_mem_region(struct blkio *b, struct blkio_mem_region *region, size_t len);
void blkio_free_mem_region(struct blkio *b, const struct blkio_mem_region *region);
int blkio_map_mem_region(struct blkio *b, const struct blkio_mem_region *region);
void blkio_unmap_mem_region(struct blkio *b, const struct blkio_mem_region *region);

/* Queues. */
struct blkioq *blkio_get_queue(struct blkio *b, int index);
struct blkioq *blkio_get_poll_queue(struct blkio *b, int index);
int blkio_add_queue(struct blkio *b);
int blkio_add_poll_queue(struct blkio *b);
int blkio_remove_queue(struct blkio *b, int index);
int blkio_remove_poll_queue(struct blkio *b, int index);
int blkioq_get_completion_fd(struct blkioq *q);
void blkioq_set_completion_fd_enabled(struct blkioq *q, bool enable);

/* Requests: never fail synchronously; each produces exactly one completion. */
void blkioq_read(struct blkioq *q, uint64_t start, void *buf, size_t len,
                 void *user_data, uint32_t flags);
void blkioq_write(struct blkioq *q, uint64_t start, const void *buf, size_t len,
                  void *user_data, uint32_t flags);
void blkioq_readv(struct blkioq *q, uint64_t start, const struct iovec *iovec,
                  int iovcnt, void *user_data, uint32_t flags);
void blkioq_writev(struct blkioq *q, uint64_t start, struct iovec *iovec,
                   int iovcnt, void *user_data, uint32_t flags);
void blkioq_write_zeroes(struct blkioq *q, uint64_t start, uint64_t len,
                         void *user_data, uint32_t flags);
void blkioq_discard(struct blkioq *q, uint64_t start, uint64_t len,
                    void *user_data, uint32_t flags);
void blkioq_flush(struct blkioq *q, void *user_data, uint32_t flags);

/* Zoned storage: carried out by nvme-io_uring on a zoned namespace (a report's completion ret
 * is the number of zones filled, possibly fewer than nr_zones; continue from the next zone's
 * start for more); -EOPNOTSUPP on a conventional namespace, -ENOTSUP in every other driver. */
void blkioq_report_zones(struct blkioq *q, uint64_t offset, struct blkio_zone *zones,
                         uint32_t nr_zones, void *user_data, uint32_t flags);
void blkioq_close_zone(struct blkioq *q, uint64_t offset, void *user_data, uint32_t flags);
void blkioq_finish_zone(struct blkioq *q, uint64_t offset, void *user_data, uint32_t flags);
void blkioq_open_zone(struct blkioq *q, uint64_t offset, void *user_data, uint32_t flags);
void blkioq_reset_zone(struct blkioq *q, uint64_t offset, void *user_data, uint32_t flags);
void blkioq_close_all_zones(struct blkioq *q, void *user_data, uint32_t flags);
void blkioq_finish_all_zones(struct blkioq *q, void *user_data, uint32_t flags);
void blkioq_open_all_zones(struct blkioq *q, void *user_data, uint32_t flags);
void blkioq_reset_all_zones(struct blkioq *q, void *user_data, uint32_t flags);

/* Submit queued requests and reap between min and max completions. */
int blkioq_do_io(struct blkioq *q, struct blkio_completion *completions,
                 int min_completions, int max_completions, struct timespec *timeout);
int blkioq_do_io_interruptible(struct blkioq *q, struct blkio_completion *completions,
                               int min_completions, int max_completions,
                               struct timespec *timeout, const sigset_t *sig);

#ifdef __cplusplus
}
#endif

#endif /* BLKIO_H */
