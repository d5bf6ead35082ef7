/* tests/test_alloc.c — mt_alloc's contract: zero-filled, 64-byte aligned; blocks of 4 MiB
 * and more advised for transparent huge pages over the whole 2 MiB pages inside them (unless MT_HUGEPAGES=0,
 * or the system's THP mode is "never": then plain blocks), which the kernel reports as
 * "THPeligible: 1" for the mapping that holds the block. Only THP's madvise mode (Debian's
 * default) tells the advice apart: in "always" mode every mapping is eligible, in "never"
 * none is, so the advice checks pass there without it. */
#include "base/common.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures = 0;
#define CHECK(c) do { if (!(c)) { fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #c); \
                                  failures++; } } while (0)

/* the system's THP mode: the bracketed word of /sys/kernel/mm/transparent_hugepage/enabled */
static void thp_mode(char *out, size_t n) {
    snprintf(out, n, "unknown");
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (!f) return;
    char line[256];
    if (fgets(line, sizeof line, f)) {
        char *a = strchr(line, '['), *b = a ? strchr(a, ']') : NULL;
        if (a && b) snprintf(out, n, "%.*s", (int)(b - a - 1), a + 1);
    }
    fclose(f);
}

/* THPeligible of the mapping in /proc/self/smaps that holds p: 1, 0, or -1 when not found */
static int thp_eligible(const void *p) {
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return -1;
    char line[512];
    int inside = 0, found = -1;
    const uintptr_t a = (uintptr_t)p;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            inside = a >= lo && a < hi;
            continue;
        }
        int v;
        if (inside && sscanf(line, "THPeligible: %d", &v) == 1) {
            found = v;
            break;
        }
    }
    fclose(f);
    return found;
}

static int all_zero(const unsigned char *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i]) return 0;
    return 1;
}

int main(void) {
    char mode[32];
    thp_mode(mode, sizeof mode);
    printf("THP mode: %s\n", mode);

    /* small blocks: 64-byte aligned and zeroed */
    for (size_t n = 0; n <= 4096; n = n * 3 + 1) {
        unsigned char *p = mt_alloc(n);
        CHECK((uintptr_t)p % 64 == 0);
        CHECK(all_zero(p, n));
        memset(p, 0xab, n); /* the whole size is writable (ASan checks the bounds) */
        mt_free(p);
    }

    /* large blocks: whole huge pages, advised */
    unsetenv("MT_HUGEPAGES");
    mt_memory_policy();
    const int thp = strcmp(mode, "madvise") == 0 || strcmp(mode, "always") == 0;
    const size_t big = ((size_t)9 << 20) + 123;
    unsigned char *p = mt_alloc(big);
    CHECK((uintptr_t)p % 64 == 0);
    CHECK(all_zero(p, big));
    p[big - 1] = 1;
    /* the advice covers the whole 2 MiB pages inside the block */
    const size_t hp = (size_t)2 << 20;
    unsigned char *inner = (unsigned char *)(((uintptr_t)p + hp - 1) / hp * hp);
    int e = thp_eligible(inner); /* -1: a kernel without the THPeligible line */
    printf("9 MiB block: THPeligible %d (its first whole 2 MiB page)\n", e);
    if (thp && e >= 0) CHECK(e == 1);

    /* MT_HUGEPAGES=0: no advice (visible only in madvise mode) */
    setenv("MT_HUGEPAGES", "0", 1);
    mt_memory_policy();
    unsigned char *q = mt_alloc(big);
    CHECK((uintptr_t)q % 64 == 0);
    CHECK(all_zero(q, big));
    int e0 = thp_eligible(q);
    printf("9 MiB block with MT_HUGEPAGES=0: THPeligible %d\n", e0);
    if (strcmp(mode, "madvise") == 0 && e0 >= 0) CHECK(e0 == 0);
    mt_free(q);
    mt_free(p);

    if (failures) fprintf(stderr, "test_alloc: %d failure(s)\n", failures);
    else printf("test_alloc: ok\n");
    return failures ? 1 : 0;
}
