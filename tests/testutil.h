/* tests/testutil.h — buffers, seeded data and error measures shared by the C kernel tests.
 * Define TEST_SALT before including to give a test file its own data stream. */
#ifndef MT_TESTS_TESTUTIL_H
#define MT_TESTS_TESTUTIL_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "base/common.h"

#ifndef TEST_SALT
#define TEST_SALT 0x74657374ULL
#endif

static inline float *falloc(size_t n) { return mt_xmalloc(sizeof(float) * (n ? n : 1)); }
static inline int32_t *ialloc(size_t n) { return mt_xmalloc(sizeof(int32_t) * (n ? n : 1)); }

/* a[i] = lo + (hi - lo) * u01, keyed by (seed, i). */
static inline void fill(float *a, size_t n, uint64_t seed, float lo, float hi) {
    for (size_t i = 0; i < n; i++) a[i] = lo + (hi - lo) * mt_u01(mt_hash4(seed, i, TEST_SALT, 0));
}
static inline void fill_nan(float *a, size_t n) {
    for (size_t i = 0; i < n; i++) a[i] = NAN;
}
static inline float *rnd(size_t n, uint64_t seed, float lo, float hi) {
    float *a = falloc(n);
    fill(a, n, seed, lo, hi);
    return a;
}
static inline float *dup(const float *a, size_t n) {
    float *b = falloc(n);
    memcpy(b, a, sizeof(float) * (n ? n : 1));
    return b;
}

/* ||a - b|| / ||b||  (||a - b|| when b == 0); NaN anywhere gives NaN. */
static inline double nerr(const float *a, const float *b, size_t n) {
    double d = 0.0, r = 0.0;
    for (size_t i = 0; i < n; i++) {
        double e = (double)a[i] - b[i];
        d += e * e;
        r += (double)b[i] * b[i];
    }
    return r > 0 ? sqrt(d / r) : sqrt(d);
}
static inline double dot_d(const float *a, const float *b, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}
static inline double rms(const float *a, size_t n) { return n ? sqrt(dot_d(a, a, n) / n) : 0.0; }

#endif
