/* tests/test_tier.c — the kernels' CPU tiers (kernels/tier.h) in one process:
 *   1. the tier in use is MT_CPU_TIER's when set, else the CPU's best; names round-trip;
 *      a tier above the best is refused (and leaves the tier unchanged); bf16 (the GEMM and
 *      attention's pairs) is on offer exactly in the avx512bf16 tier;
 *   2. every tier the CPU has, switched to with mt_cpu_tier_set, against the plain
 *      reference (ref.c) on odd sizes: flash attention forward and backward (T = 77,
 *      grouped heads), SwiGLU, RMSNorm, the LM head with cross-entropy, the sum of squares;
 *      and each tier gives the same bits for 1 and 2 threads. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/common.h"
#include "kernels/attention.h"
#include "kernels/blas.h"
#include "kernels/gemm_bf16.h"
#include "kernels/ops.h"
#include "kernels/ref.h"
#include "kernels/tier.h"
#include "kstats.h"
#include "testutil.h"
#include "testws.h"

enum { S_ATT, S_SWIGLU, S_RMS, S_HEAD, S_SUMSQ, S_COUNT };
static stat stats[S_COUNT] = {{"attention fwd+bwd", 1e-5, 0, 0}, {"swiglu fwd+bwd", 1e-6, 0, 0},
                              {"rmsnorm fwd", 1e-6, 0, 0},        {"head_ce (loss, dx, dW)", 1e-5, 0, 0},
                              {"sumsq", 1e-12, 0, 0}};

static void test_selection(void) {
    snprintf(where, sizeof where, "selection");
    const char *e = getenv("MT_CPU_TIER");
    mt_tier best = mt_cpu_tier_best();
    if (e && *e) CHECK(strcmp(mt_cpu_tier_name(mt_cpu_tier()), e) == 0);
    else CHECK(mt_cpu_tier() == best);
    CHECK(mt_cpu_tier_check() == 0);
    CHECK(strcmp(mt_cpu_tier_name(MT_TIER_AVX2), "avx2") == 0 && strcmp(mt_cpu_tier_name(MT_TIER_AVX512BF16), "avx512bf16") == 0);
    mt_tier before = mt_cpu_tier();
    if (best < MT_TIER_AVX512BF16) {
        CHECK(mt_cpu_tier_set((mt_tier)(best + 1)) != 0);
        CHECK(strstr(mt_last_error(), "supports at most") != NULL);
        CHECK(mt_cpu_tier() == before);
    }
    for (int t = 0; t <= (int)best; t++) {
        CHECK(mt_cpu_tier_set((mt_tier)t) == 0);
        CHECK(mt_cpu_tier() == (mt_tier)t);
        CHECK(mt_bf16_supported() == (t == MT_TIER_AVX512BF16));
        CHECK(mt_attention_bf16_built() == (t == MT_TIER_AVX512BF16));
    }
    CHECK(mt_cpu_tier_set(before) == 0);
}

/* attention fwd + bwd at nthr threads; results into o, lse, dq, dk, dv */
static void attention(int nthr, const float *q, const float *k, const float *v, const float *dout, float *o,
                      float *lse, float *dq, float *dk, float *dv, int B, int T, int H, int G, int D) {
    float *scratch = falloc(mt_attention_scratch_floats(T, D) * (size_t)nthr);
    mt_attention_fwd(o, lse, q, k, v, NULL, B, T, H, G, D, scratch, nthr, 0);
    mt_attention_bwd(dq, dk, dv, dout, q, k, v, o, lse, NULL, B, T, H, G, D, scratch, nthr, 0);
    mt_free(scratch);
}

static void test_tier_kernels(mt_tier t) {
    MT_ASSERT(mt_cpu_tier_set(t) == 0);
    snprintf(where, sizeof where, "tier %s", mt_cpu_tier_name(t));
    /* attention: T = 77 leaves a partial block, D = 40 a partial 16-column strip */
    const int B = 2, T = 77, H = 4, G = 2, D = 40;
    const size_t nq = (size_t)B * T * H * D, nk = (size_t)B * T * G * D;
    float *q = rnd(nq, 1, -1, 1), *k = rnd(nk, 2, -1, 1), *v = rnd(nk, 3, -1, 1), *dout = rnd(nq, 4, -1, 1);
    float *ro = falloc(nq), *rl = falloc((size_t)B * H * T), *rdq = falloc(nq), *rdk = falloc(nk), *rdv = falloc(nk);
    mt_ref_attention_fwd(ro, rl, q, k, v, NULL, B, T, H, G, D);
    mt_ref_attention_bwd(rdq, rdk, rdv, dout, q, k, v, NULL, B, T, H, G, D);
    float *o[2], *l[2], *dq[2], *dk[2], *dv[2];
    for (int i = 0; i < 2; i++) {
        o[i] = falloc(nq); l[i] = falloc((size_t)B * H * T); dq[i] = falloc(nq); dk[i] = falloc(nk); dv[i] = falloc(nk);
        attention(i + 1, q, k, v, dout, o[i], l[i], dq[i], dk[i], dv[i], B, T, H, G, D);
    }
    double e = nerr(o[1], ro, nq);
    double e2 = nerr(dq[1], rdq, nq), e3 = nerr(dk[1], rdk, nk), e4 = nerr(dv[1], rdv, nk);
    RECORD(S_ATT, "out", e); RECORD(S_ATT, "dq", e2); RECORD(S_ATT, "dk", e3); RECORD(S_ATT, "dv", e4);
    CHECK_SAME_F(o[0], o[1], nq); CHECK_SAME_F(dq[0], dq[1], nq); CHECK_SAME_F(dk[0], dk[1], nk);
    CHECK_SAME_F(dv[0], dv[1], nk);
    for (int i = 0; i < 2; i++) { mt_free(o[i]); mt_free(l[i]); mt_free(dq[i]); mt_free(dk[i]); mt_free(dv[i]); }
    mt_free(q); mt_free(k); mt_free(v); mt_free(dout); mt_free(ro); mt_free(rl); mt_free(rdq); mt_free(rdk); mt_free(rdv);

    /* SwiGLU over an odd count (a masked tail), with inputs past exp's range */
    const size_t n = 1003;
    float *g = rnd(n, 5, -12, 12), *u = rnd(n, 6, -2, 2), *da = rnd(n, 7, -1, 1);
    g[0] = -100.0f; g[1] = 100.0f;
    float *a = falloc(n), *ra = falloc(n), *dg = falloc(n), *du = falloc(n), *rdg = falloc(n), *rdu = falloc(n);
    mt_swiglu_fwd(a, g, u, n); mt_ref_swiglu_fwd(ra, g, u, n);
    mt_swiglu_bwd(dg, du, da, g, u, n); mt_ref_swiglu_bwd(rdg, rdu, da, g, u, n);
    RECORD(S_SWIGLU, "a", nerr(a, ra, n)); RECORD(S_SWIGLU, "dg", nerr(dg, rdg, n)); RECORD(S_SWIGLU, "du", nerr(du, rdu, n));
    mt_free(g); mt_free(u); mt_free(da); mt_free(a); mt_free(ra); mt_free(dg); mt_free(du); mt_free(rdg); mt_free(rdu);

    /* RMSNorm, C = 37 (a masked tail in the row's sum of squares) */
    const int N = 19, C = 37;
    float *x = rnd((size_t)N * C, 8, -3, 3), *w = rnd(C, 9, 0.5f, 1.5f);
    float *y = falloc((size_t)N * C), *ry = falloc((size_t)N * C), *rs = falloc(N), *rrs = falloc(N);
    mt_rmsnorm_fwd(y, rs, x, w, N, C, 1e-6f); mt_ref_rmsnorm_fwd(ry, rrs, x, w, N, C, 1e-6f);
    RECORD(S_RMS, "out", nerr(y, ry, (size_t)N * C)); RECORD(S_RMS, "rstd", nerr(rs, rrs, N));
    mt_free(x); mt_free(w); mt_free(y); mt_free(ry); mt_free(rs); mt_free(rrs);

    /* LM head + cross-entropy: V = 301 (no multiple of 8 or 16), one ignored target */
    const int HN = 37, HC = 24, V = 301;
    float *hx = rnd((size_t)HN * HC, 10, -1, 1), *hw = rnd((size_t)V * HC, 11, -1, 1);
    int32_t *tg = ialloc(HN);
    for (int i = 0; i < HN; i++) tg[i] = (i * 37) % V;
    tg[3] = -1;
    float *dx = falloc((size_t)HN * HC), *rdx = falloc((size_t)HN * HC), *dW = falloc((size_t)V * HC), *rdW = falloc((size_t)V * HC);
    memset(dW, 0, sizeof(float) * (size_t)V * HC); memset(rdW, 0, sizeof(float) * (size_t)V * HC);
    float *hs = falloc(mt_head_scratch_floats(V));
    double loss = mt_head_ce(tws(), dx, dW, NULL, hx, hw, tg, HN, HC, V, 0.5f, NULL, hs);
    double rloss = mt_ref_head_ce(rdx, rdW, NULL, hx, hw, tg, HN, HC, V, 0.5f);
    RECORD(S_HEAD, "loss", fabs(loss - rloss) / fabs(rloss));
    RECORD(S_HEAD, "dx", nerr(dx, rdx, (size_t)HN * HC)); RECORD(S_HEAD, "dW", nerr(dW, rdW, (size_t)V * HC));
    mt_free(hx); mt_free(hw); mt_free(tg); mt_free(dx); mt_free(rdx); mt_free(dW); mt_free(rdW); mt_free(hs);

    const size_t ns = 100003;
    float *sx = rnd(ns, 12, -2, 2);
    double ss = mt_sumsq(sx, ns), rss = mt_ref_sumsq(sx, ns);
    RECORD(S_SUMSQ, "sumsq", fabs(ss - rss) / rss);
    mt_free(sx);
}

int main(void) {
    double t0 = mt_now();
    mt_set_threads(2);
    test_selection();
    mt_tier saved = mt_cpu_tier();
    for (int t = 0; t <= (int)mt_cpu_tier_best(); t++) test_tier_kernels((mt_tier)t);
    MT_ASSERT(mt_cpu_tier_set(saved) == 0);
    mt_set_threads(2);
    printf("tiers tested: avx2..%s, in use %s\n", mt_cpu_tier_name(mt_cpu_tier_best()), mt_cpu_tier_name(mt_cpu_tier()));
    return print_stats("test_tier", stats, S_COUNT, mt_now() - t0, mt_get_threads(), mt_blas_corename());
}
