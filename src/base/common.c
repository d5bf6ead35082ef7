/* base/common.c — see common.h. */
#include "base/common.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <libgen.h>
#include <math.h>
#include <stdarg.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static _Thread_local char err_buf[1024];

int mt_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err_buf, sizeof err_buf, fmt, ap);
    va_end(ap);
    return -1;
}

const char *mt_last_error(void) { return err_buf; }

void mt_warn(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("moetrain: warning: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

void mt_assert_fail(const char *expr, const char *file, int line) {
    fprintf(stderr, "moetrain: internal error: assertion '%s' failed at %s:%d\n", expr, file, line);
    fflush(stderr);
    abort();
}

/* Transparent huge pages for large blocks (mt_memory_policy; MT_HUGEPAGES=0 turns them off):
 * the step of "small" with --bf16, whose GEMMs and packing are moetrain's own, ran 2-10%
 * faster with them (fp32, whose GEMMs are OpenBLAS's, no change); see DESIGN.md "Memory". */
enum { HUGE_PAGE = 2 << 20, HUGE_MIN = 2 * HUGE_PAGE };
static int huge_pages;

/* On unless MT_HUGEPAGES=0, or the kernel has no THP for us ("[never]", or no such file):
 * then the blocks are not rounded to 2 MiB pages for nothing. */
static void huge_pages_decide(void) {
    const char *h = getenv("MT_HUGEPAGES");
    int on = !(h && strcmp(h, "0") == 0);
#ifdef MADV_HUGEPAGE
    char line[128] = "";
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (!f || !fgets(line, sizeof line, f) || strstr(line, "[never]")) on = 0;
    if (f) fclose(f);
#else
    on = 0;
#endif
    huge_pages = on;
}

/* decided when the library loads (every program, tests included), again in mt_memory_policy */
__attribute__((constructor)) static void huge_pages_init(void) { huge_pages_decide(); }

void mt_memory_policy(void) {
    huge_pages_decide();
    /* glibc gives every block above 128 KiB (adaptive up to 32 MiB) its own mmap and unmaps
     * it on free, so a buffer allocated per step (the expert exchange's rows, its plans)
     * is page-faulted in again every time: 2-3x the cost of the exchange itself, measured.
     * Keep large blocks in the heap and freed memory in the process instead (the peak RSS is
     * the same; the resident size no longer drops after a temporary peak). */
    mallopt(M_MMAP_THRESHOLD, 1 << 30);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

void *mt_try_alloc(size_t bytes) {
    if (bytes == 0) bytes = MT_ALIGN;
    if (bytes > SIZE_MAX - MT_ALIGN) return NULL;
    size_t rounded = (bytes + MT_ALIGN - 1) / MT_ALIGN * MT_ALIGN;
    if (huge_pages && rounded >= HUGE_MIN) {
        /* the advice covers the whole 2 MiB pages inside the block and nothing else. The block
         * itself is not 2 MiB-aligned: glibc serves aligned_alloc(2 MiB, n) from a chunk of
         * n + 2 MiB, which the n-byte chunk a free gave back never satisfies, so a buffer
         * allocated and freed every step (the rollout's KV cache) grew the heap by its size
         * each time (RL, 'demo': +6 MiB of RSS per step, none with MT_HUGEPAGES=0) */
        void *p = aligned_alloc(MT_ALIGN, rounded);
        if (p) {
#ifdef MADV_HUGEPAGE
            const uintptr_t a = ((uintptr_t)p + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE,
                            b = ((uintptr_t)p + rounded) / HUGE_PAGE * HUGE_PAGE;
            if (b > a) madvise((void *)a, b - a, MADV_HUGEPAGE); /* advice: refused is not an error */
#endif
            memset(p, 0, rounded);
        }
        return p;
    }
    void *p = aligned_alloc(MT_ALIGN, rounded);
    if (p) memset(p, 0, rounded);
    return p;
}

void *mt_alloc(size_t bytes) {
    void *p = mt_try_alloc(bytes);
    if (!p) {
        fprintf(stderr, "moetrain: out of memory allocating %zu bytes\n", bytes);
        abort();
    }
    return p;
}

void mt_free(void *p) { free(p); }

void mt_release_pages(void *p, size_t bytes) {
    const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE), a = ((uintptr_t)p + pg - 1) / pg * pg,
                    b = ((uintptr_t)p + bytes) / pg * pg;
    if (b > a && madvise((void *)a, b - a, MADV_DONTNEED) != 0) memset(p, 0, bytes);
    /* the page fragments at both ends stay resident: zero them so that the whole range reads 0 */
    if (b > a) {
        memset(p, 0, a - (uintptr_t)p);
        memset((void *)b, 0, (uintptr_t)p + bytes - b);
    } else {
        memset(p, 0, bytes);
    }
}

void *mt_xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) { fprintf(stderr, "moetrain: out of memory allocating %zu bytes\n", bytes); abort(); }
    return p;
}

void *mt_xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) { fprintf(stderr, "moetrain: out of memory allocating %zu x %zu bytes\n", n, size); abort(); }
    return p;
}

void *mt_xrealloc(void *p, size_t bytes) {
    void *q = realloc(p, bytes ? bytes : 1);
    if (!q) { fprintf(stderr, "moetrain: out of memory allocating %zu bytes\n", bytes); abort(); }
    return q;
}

char *mt_xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = mt_xmalloc(n);
    memcpy(d, s, n);
    return d;
}

double mt_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double mt_cpu_time(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int mt_reset_peak_rss(void) {
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f) return -1;
    int ok = fputs("5", f) >= 0;
    return fclose(f) == 0 && ok ? 0 : -1;
}

size_t mt_peak_rss(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return 0;
    char line[256];
    size_t kb = 0;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "VmHWM:", 6) == 0) { kb = (size_t)strtoull(line + 6, NULL, 10); break; }
    fclose(f);
    return kb * 1024;
}

double mt_proc_status_kb(const char *key) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return 0;
    char line[256];
    double kb = 0;
    size_t n = strlen(key);
    while (fgets(line, sizeof line, f))
        if (strncmp(line, key, n) == 0) { kb = strtod(line + n, NULL); break; }
    fclose(f);
    return kb;
}

/* The first number in file path (0 if unreadable or not a number, e.g. "max"). */
static double file_number(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    double x = 0;
    if (fscanf(f, "%lf", &x) != 1) x = 0;
    fclose(f);
    return x;
}

/* MemAvailable counts the page cache the kernel would drop, which MemFree misses; a
 * container's /proc/meminfo is the host's, so its cgroup limit caps what it may use. */
double mt_mem_available(void) {
    double avail = 0, swap = 0;
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[256];
        while (fgets(line, sizeof line, f)) {
            if (strncmp(line, "MemAvailable:", 13) == 0) avail = strtod(line + 13, NULL) * 1024;
            else if (strncmp(line, "SwapFree:", 9) == 0) swap = strtod(line + 9, NULL) * 1024;
        }
        fclose(f);
    }
    if (avail <= 0) avail = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    if (avail <= 0) return 0;
    avail += swap;
    const char *lim[2][2] = {{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"},
                             {"/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"}};
    for (int i = 0; i < 2; i++) {
        const double l = file_number(lim[i][0]), used = file_number(lim[i][1]);
        if (l > 0 && l < 0x1p60 && l - used < avail) avail = l > used ? l - used : 0; /* "max" / v1's huge value: none */
    }
    return avail;
}

static inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

uint64_t mt_hash4(uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
    uint64_t h = mix64(a + 0x9e3779b97f4a7c15ULL);
    h = mix64(h ^ (b + 0x632be59bd9b4e019ULL));
    h = mix64(h ^ (c + 0x85ebca6b27d4eb4fULL));
    h = mix64(h ^ (d + 0xc2b2ae3d27d4eb4fULL));
    return h;
}

float mt_u01(uint64_t h) { return (float)(h >> 40) * (1.0f / 16777216.0f); }

float mt_normal(uint64_t seed, uint64_t stream, uint64_t index) {
    uint64_t h = mt_hash4(seed, stream, index, 0x6e6f726d616cULL);
    /* two 32-bit uniforms in (0,1] and [0,1) */
    double u1 = ((double)(h >> 32) + 1.0) / 4294967296.0;
    double u2 = (double)(h & 0xffffffffULL) / 4294967296.0;
    return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}

int mt_open_regular(const char *path) {
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return mt_error("%s: cannot open: %s", path, strerror(errno));
    struct stat st; /* a directory opens too, and tells a size of LONG_MAX */
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return mt_error("%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        const char *kind = S_ISDIR(st.st_mode) ? "a folder" : S_ISFIFO(st.st_mode) ? "a FIFO"
                         : S_ISSOCK(st.st_mode) ? "a socket" : "a device";
        return mt_error("%s: not a regular file (%s)", path, kind);
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        close(fd);
        return mt_error("%s: cannot open: %s", path, strerror(errno));
    }
    return fd;
}

int mt_read_file(const char *path, char **data, size_t *len) {
    int fd = mt_open_regular(path);
    if (fd < 0) return -1;
    FILE *f = fdopen(fd, "rb");
    if (!f) { close(fd); return mt_error("%s: cannot open: %s", path, strerror(errno)); }
    if (fseek(f, 0, SEEK_END) != 0) { fclose(f); return mt_error("%s: cannot seek", path); }
    long n = ftell(f);
    if (n < 0) { fclose(f); return mt_error("%s: cannot tell size", path); }
    rewind(f);
    char *buf = mt_xmalloc((size_t)n + 1);
    if (n > 0 && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        fclose(f);
        free(buf);
        return mt_error("%s: read failed", path);
    }
    fclose(f);
    buf[n] = 0;
    *data = buf;
    if (len) *len = (size_t)n;
    return 0;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

int mt_rm_tree(const char *path) {
    struct stat st;
    if (lstat(path, &st) != 0) return errno == ENOENT ? 0 : mt_error("%s: %s", path, strerror(errno));
    if (nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS) != 0) return mt_error("%s: cannot remove: %s", path, strerror(errno));
    return 0;
}

int mt_fsync_dir_of(const char *path) {
    char *tmp = mt_xstrdup(path);
    int fd = open(dirname(tmp), O_RDONLY | O_DIRECTORY);
    free(tmp);
    if (fd < 0) return 0; /* best effort */
    fsync(fd);
    close(fd);
    return 0;
}

int mt_write_file_atomic(const char *path, const void *data, size_t len) {
    size_t n = strlen(path) + 8;
    char *tmp = mt_xmalloc(n);
    snprintf(tmp, n, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) { int r = mt_error("%s: cannot create: %s", tmp, strerror(errno)); free(tmp); return r; }
    const char *p = data;
    size_t left = len;
    while (left > 0) {
        ssize_t w = write(fd, p, left);
        if (w < 0) {
            if (errno == EINTR) continue;
            int r = mt_error("%s: write failed: %s", tmp, strerror(errno));
            close(fd); unlink(tmp); free(tmp);
            return r;
        }
        p += w;
        left -= (size_t)w;
    }
    if (fsync(fd) != 0 || close(fd) != 0) {
        int r = mt_error("%s: fsync/close failed: %s", tmp, strerror(errno));
        unlink(tmp); free(tmp);
        return r;
    }
    if (rename(tmp, path) != 0) {
        int r = mt_error("%s: rename failed: %s", path, strerror(errno));
        unlink(tmp); free(tmp);
        return r;
    }
    free(tmp);
    return mt_fsync_dir_of(path);
}

int mt_file_check(FILE *f, const char *name) {
    errno = 0;
    if (fflush(f) == 0 && !ferror(f)) return 0;
    /* an earlier buffered write may have failed: its errno can be gone by now */
    return mt_error("%s: write failed: %s", name, strerror(errno ? errno : EIO));
}

int mt_file_close(FILE *f, const char *name) {
    int rc = mt_file_check(f, name);
    errno = 0;
    if (fclose(f) != 0 && rc == 0) rc = mt_error("%s: write failed: %s", name, strerror(errno ? errno : EIO));
    return rc;
}

int mt_mkdir_p(const char *path) {
    char *p = mt_xstrdup(path);
    for (char *s = p + 1; *s; s++) {
        if (*s != '/') continue;
        *s = 0;
        if (mkdir(p, 0755) != 0 && errno != EEXIST) {
            int r = mt_error("%s: cannot create directory: %s", p, strerror(errno));
            free(p);
            return r;
        }
        *s = '/';
    }
    if (mkdir(p, 0755) != 0 && errno != EEXIST) {
        int r = mt_error("%s: cannot create directory: %s", p, strerror(errno));
        free(p);
        return r;
    }
    struct stat st;
    if (stat(p, &st) != 0 || !S_ISDIR(st.st_mode)) {
        int r = mt_error("%s: exists and is not a directory", p);
        free(p);
        return r;
    }
    free(p);
    return 0;
}
