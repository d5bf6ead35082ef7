/* tests/testutil.h — buffers, seeded data and error measures shared by the C kernel tests.
 * Define TEST_SALT before including to give a test file its own data stream. */
#ifndef MT_TESTS_TESTUTIL_H
#define MT_TESTS_TESTUTIL_H

#include <math.h>
#include <stdio.h>
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

/* Loss closure: evaluates the scalar loss of a reference forward at the current inputs. */
typedef double (*loss_fn)(void *ctx);

/* Central differences of f with respect to param[i] at nco random coordinates, compared
 * with each of the analytic gradients g_ref (reference backward) and g_opt (optimised
 * backward, may be NULL). eps is absolute; the step actually taken is the float difference
 * of the perturbed values, so rounding of param[i] +- eps cancels. Errors are relative to
 * max(|numeric|, 0.1 rms(g_ref)). Prints the coordinates above tol; returns the worst. */
static inline double fd_worst(const char *what, float *param, size_t n, const float *g_ref,
                              const float *g_opt, loss_fn f, void *ctx, uint64_t seed, int nco,
                              double eps, double tol) {
    double floor = 0.1 * rms(g_ref, n);
    if (floor == 0.0) floor = 1e-12;
    double worst = 0.0;
    for (int c = 0; c < nco; c++) {
        size_t i = (size_t)(mt_hash4(seed, (uint64_t)c, 0xfdULL, 0) % n);
        float x0 = param[i], xp = (float)(x0 + eps), xm = (float)(x0 - eps);
        param[i] = xp;
        double Lp = f(ctx);
        param[i] = xm;
        double Lm = f(ctx);
        param[i] = x0;
        double num = (Lp - Lm) / ((double)xp - (double)xm);
        double den = fabs(num) > floor ? fabs(num) : floor;
        double e = fabs(g_ref[i] - num) / den;
        if (g_opt) {
            double e2 = fabs(g_opt[i] - num) / den;
            if (e2 > e || isnan(e2)) e = e2;
        }
        if (!(e <= tol))
            fprintf(stderr, "  %s[%zu]: numeric %.6e ref %.6e opt %.6e\n", what, i, num, (double)g_ref[i],
                    g_opt ? (double)g_opt[i] : NAN);
        if (e > worst || isnan(e)) worst = e;
    }
    return worst;
}

#endif
