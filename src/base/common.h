/* base/common.h — errors, checked allocation, timing and the counter-based RNG.
 *
 * Error convention (Redis/SQLite style): a function that can fail on user input returns
 * int (0 = ok, -1 = error) after calling mt_error() with one line naming the thing and the
 * problem; the caller passes -1 up to the one place that reports mt_last_error().
 * A broken internal invariant is a bug, not an input error: MT_ASSERT aborts with file
 * and line. */
#ifndef MT_BASE_COMMON_H
#define MT_BASE_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define MT_ALIGN 64

/* fp32 -> bf16 bits, round to nearest even (NaN kept, quiet): the rule of VCVTNEPS2BF16, used
 * by the bf16 kernels' scalar paths and by the BF16 safetensors writer */
static inline uint16_t mt_f32_to_bf16(float f) {
    uint32_t u;
    __builtin_memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    /* a carry into the exponent is the correct rounding up (to Inf past the largest bf16) */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* Records the error message (printf format) for this thread; always returns -1. */
int mt_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The last message recorded by mt_error() on this thread ("" if none). */
const char *mt_last_error(void);

/* Warnings and progress go to stderr, prefixed "moetrain: warning: ". */
void mt_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

void mt_assert_fail(const char *expr, const char *file, int line) __attribute__((noreturn));
#define MT_ASSERT(c) do { if (!(c)) mt_assert_fail(#c, __FILE__, __LINE__); } while (0)

/* Process-wide allocator policy (call first in main): large blocks from the heap, freed
 * memory kept for reuse, so per-step buffers do not page-fault again every step; blocks of
 * 4 MiB and more in transparent huge pages unless MT_HUGEPAGES=0 (read here). */
void mt_memory_policy(void);
/* 64-byte aligned (2 MiB and advised for huge pages from 4 MiB), zero-filled allocation;
 * aborts on out-of-memory (with the size). */
void *mt_alloc(size_t bytes);
/* The same, returning NULL when the memory is not there (for sizes that come from input). */
void *mt_try_alloc(size_t bytes);
void mt_free(void *p);
/* Plain checked allocation helpers for small bookkeeping (abort on OOM). */
void *mt_xmalloc(size_t bytes);
void *mt_xcalloc(size_t n, size_t size);
void *mt_xrealloc(void *p, size_t bytes);
char *mt_xstrdup(const char *s);

/* Monotonic wall-clock seconds. */
double mt_now(void);
/* Best wall time (seconds, into dst) of the statement `call` within `budget` seconds of
 * repeats: at least two runs (the first warms caches and threads) unless one run alone
 * exceeds the budget; at most 50. For benchmarks and calibration. */
#define MT_BEST_TIME(dst, budget, call) do { \
    double best_ = INFINITY, spent_ = 0; \
    for (int n_ = 0; n_ < 50; n_++) { \
        double t0_ = mt_now(); \
        call; \
        double t_ = mt_now() - t0_; \
        spent_ += t_; \
        if (t_ < best_) best_ = t_; \
        if (n_ >= 1 ? spent_ + best_ > (budget) : t_ > (budget)) break; \
    } \
    (dst) = best_; } while (0)

/* CPU seconds used by all threads of this process. The trainer's waiting share is timed
 * from the parallel regions instead (kernels/blas.h, mt_busy_time), since a thread that
 * spins while it waits uses CPU time; this is its fallback. */
double mt_cpu_time(void);

/* Gives the pages of [p, p + bytes) back to the system (madvise MADV_DONTNEED): the range
 * stays allocated and reads as zeros, its memory is found again on the next touch. For
 * buffers idle for a while (RL parks its rollout copy of the weights during training). */
void mt_release_pages(void *p, size_t bytes);

/* Peak resident set size of this process in bytes (VmHWM). */
size_t mt_peak_rss(void);
/* Resets the peak RSS (VmHWM) to the current RSS (Linux >= 4.0, /proc/self/clear_refs); 0 on success. */
int mt_reset_peak_rss(void);
/* A "Key:   123 kB" line of /proc/self/status (e.g. "VmRSS:"), in kB (0 if missing). */
double mt_proc_status_kb(const char *key);

/* Bytes this process can still get without pushing others out: MemAvailable + SwapFree of
 * /proc/meminfo (physical memory when MemAvailable is missing), capped by the room left
 * under the cgroup's memory limit when there is one; 0 when nothing can be read. */
double mt_mem_available(void);

/* Counter-based RNG: a pure function of its inputs, so any thread count or parallel
 * layout draws the same numbers. mt_hash4 mixes four 64-bit words (splitmix/murmur
 * finaliser rounds). */
uint64_t mt_hash4(uint64_t a, uint64_t b, uint64_t c, uint64_t d);
/* Uniform in [0,1) with 24 bits of resolution from a hash value. */
float mt_u01(uint64_t h);
/* Standard normal draw keyed by (seed, stream, index) (Box-Muller in double). */
float mt_normal(uint64_t seed, uint64_t stream, uint64_t index);

/* A read-only descriptor of the regular file at path, or -1 after mt_error(). Opened
 * non-blocking and checked with fstat, so a FIFO or device named like an input is refused
 * instead of blocking the open forever (the descriptor is blocking again on return). */
int mt_open_regular(const char *path);
/* Whole-file helpers. mt_read_file returns a malloc'd buffer (NUL-terminated; *len tells
 * the bytes, which may include NULs). Only regular files (mt_open_regular). */
int mt_read_file(const char *path, char **data, size_t *len);
/* Writes path atomically: path.tmp, fsync, rename, fsync of the directory. */
int mt_write_file_atomic(const char *path, const void *data, size_t len);
/* fsync of the folder that holds path, so a rename or removal in it is durable (best
 * effort: always 0). */
int mt_fsync_dir_of(const char *path);
/* A stream's writes so far reached the file: flushes f and checks its error flag; -1 with
 * "NAME: write failed: <strerror>" otherwise (name: the file or flag the user knows). */
int mt_file_check(FILE *f, const char *name);
/* mt_file_check, then fclose (whose error counts too); f is closed either way. */
int mt_file_close(FILE *f, const char *name);
/* mkdir -p */
int mt_mkdir_p(const char *path);
/* Removes a file or a folder with everything in it (nothing there: 0); -1 with an error. */
int mt_rm_tree(const char *path);

#endif
