/* cli/cmd_bench.c — `moetrain bench`: GEMM GFLOP/s of this machine (the MFU denominator;
 * SGEMM, or the bf16 GEMM with --bf16) and the training throughput of a config on synthetic
 * tokens; `moetrain bench kernels`: every optimised kernel against its plain reference on the
 * shapes of the "small" config, and the bf16 GEMMs against OpenBLAS SGEMM (bench/bench_kernels.sh
 * adds PyTorch to the comparison). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "cli/args.h"
#include "cli/cli.h"
#include "kernels/attention.h"
#include "kernels/blas.h"
#include "kernels/tier.h"
#include "kernels/gemm_bf16.h"
#include "kernels/moe.h"
#include "kernels/ops.h"
#include "kernels/ref.h"
#include "kernels/ref_moe.h"
#include "parallel/dist.h"
#include "parallel/launch.h"
#include "model/model.h"
#include "plan/calibrate.h"

/* ---- bench kernels ------------------------------------------------------------------- */

/* One row of the table: the optimised kernel and its reference on one shape. */
typedef struct {
    char kernel[32], shape[64];
    int flop_bound; /* 1: work counts FLOPs (GFLOP/s), 0: bytes read + written (GB/s) */
    double work;    /* of one call on the full shape */
    double t, t_ref; /* best seconds of one call; t_ref NaN when skipped */
    const char *ref; /* what the reference is */
    double ref_scale; /* the reference ran on 1/ref_scale of the work; t_ref is scaled back */
} kb_row;

enum { KB_MAX_ROWS = 64 };
typedef struct {
    kb_row rows[KB_MAX_ROWS];
    int n;
    double budget; /* seconds of repeats per timing */
    int bf16;      /* 1: also the bf16 rows (mt_gemm_bf16; the CPU has AVX512-BF16) */
    mt_ws kws;     /* the kernels' workspace, sized for every row (kernels/ws.h) */
} kb_table;


/* the reference of row r: timed on 1/ref_scale of the work, then scaled back */
#define KB_TIME_REF(r, budget, call) do { \
    MT_BEST_TIME((r)->t_ref, budget, call); \
    (r)->t_ref *= (r)->ref_scale; } while (0)

/* a bf16 row: the call in bf16 mode (tb->kws.bf16: every mt_sgemm runs mt_gemm_bf16;
 * attention takes it as its bf16 argument), its reference the same call in fp32 (OpenBLAS
 * SGEMM); the mode is back to fp32 afterwards */
#define KB_TIME_BF16(r, budget, call) do { \
    MT_ASSERT(tb->bf16); /* bf16 rows only when mt_bf16_supported() */ \
    tb->kws.bf16 = 1; \
    MT_BEST_TIME((r)->t, budget, call); \
    tb->kws.bf16 = 0; \
    KB_TIME_REF(r, budget, call); } while (0)

static kb_row *kb_add(kb_table *tb, const char *kernel, int flop_bound, double work, const char *ref,
                      double ref_scale, const char *shape_fmt, ...) __attribute__((format(printf, 7, 8)));
static kb_row *kb_add(kb_table *tb, const char *kernel, int flop_bound, double work, const char *ref,
                      double ref_scale, const char *shape_fmt, ...) {
    MT_ASSERT(tb->n < KB_MAX_ROWS);
    kb_row *r = &tb->rows[tb->n++];
    memset(r, 0, sizeof *r);
    snprintf(r->kernel, sizeof r->kernel, "%s", kernel);
    va_list ap;
    va_start(ap, shape_fmt);
    vsnprintf(r->shape, sizeof r->shape, shape_fmt, ap);
    va_end(ap);
    r->flop_bound = flop_bound;
    r->work = work;
    r->ref = ref;
    r->ref_scale = ref_scale;
    r->t = r->t_ref = NAN;
    return r;
}

static double kb_rate(const kb_row *r, double t) { return r->work / t * 1e-9; }

static float *kb_rand(size_t n, uint64_t seed, float lo, float hi) {
    float *a = mt_alloc(sizeof(float) * (n ? n : 1));
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) a[i] = lo + (hi - lo) * mt_u01(mt_hash4(seed, i, 0x6b62ULL, 0));
    return a;
}

/* top-K routing with K distinct experts per token, uniform */
static void kb_routing(int32_t *sel, int N, int K, int E) {
    for (int t = 0; t < N; t++)
        for (int j = 0; j < K; j++) {
            int e;
            uint64_t h = mt_hash4(11, (uint64_t)t, (uint64_t)j, 0);
            for (;;) {
                e = (int)(h % (uint64_t)E);
                int seen = 0;
                for (int i = 0; i < j; i++) seen |= sel[t * K + i] == e;
                if (!seen) break;
                h = mt_hash4(h, 1, 2, 3);
            }
            sel[t * K + j] = e;
        }
}

/* The "small" config: vocab 8192, hidden 512, 8 heads x 64 (8 kv heads), ffn 1408, 16
 * experts top-2 with moe ffn 352; micro-batch 8 x 512 -> N = 4096 tokens. */
enum { KB_V = 8192, KB_C = 512, KB_H = 8, KB_G = 8, KB_D = 64, KB_F = 1408, KB_E = 16, KB_K = 2,
       KB_FM = 352, KB_B = 8, KB_T = 512, KB_TLONG = 4096 };

static void kb_dense(kb_table *tb) {
    const int N = KB_B * KB_T, C = KB_C, F = KB_F;
    double bud = tb->budget;
    /* linear = sgemm: the reference (naive loops) runs on N/16 rows */
    {
        const int nr = N / 16;
        float *x = kb_rand((size_t)N * C, 1, -1, 1), *W = kb_rand((size_t)F * C, 2, -1, 1);
        float *y = kb_rand((size_t)N * F, 3, -1, 1), *dx = kb_rand((size_t)N * C, 4, -1, 1);
        float *dW = kb_rand((size_t)F * C, 5, -1, 1);
        kb_row *r = kb_add(tb, "linear_fwd", 1, 2.0 * N * C * F, "naive", 16, "N=%d In=%d O=%d", N, C, F);
        MT_BEST_TIME(r->t, bud, mt_linear_fwd(tb->kws, y, x, W, N, C, F, 0.0f));
        KB_TIME_REF(r, bud, mt_ref_linear_fwd(y, x, W, nr, C, F, 0.0f));
        r = kb_add(tb, "linear_bwd", 1, 4.0 * N * C * F, "naive", 16, "N=%d In=%d O=%d", N, C, F);
        MT_BEST_TIME(r->t, bud, mt_linear_bwd(tb->kws, dx, dW, y, x, W, N, C, F, 0.0f));
        KB_TIME_REF(r, bud, mt_ref_linear_bwd(dx, dW, y, x, W, nr, C, F, 0.0f));
        if (tb->bf16) { /* the same products in mixed precision against OpenBLAS SGEMM */
            r = kb_add(tb, "linear_fwd_bf16", 1, 2.0 * N * C * F, "OpenBLAS sgemm", 1, "N=%d In=%d O=%d", N, C, F);
            KB_TIME_BF16(r, bud, mt_linear_fwd(tb->kws, y, x, W, N, C, F, 0.0f));
            r = kb_add(tb, "linear_bwd_bf16", 1, 4.0 * N * C * F, "OpenBLAS sgemm", 1, "N=%d In=%d O=%d", N, C, F);
            KB_TIME_BF16(r, bud, mt_linear_bwd(tb->kws, dx, dW, y, x, W, N, C, F, 0.0f));
        }
        mt_free(x); mt_free(W); mt_free(y); mt_free(dx); mt_free(dW);
    }
    /* rmsnorm */
    {
        size_t n = (size_t)N * C;
        float *x = kb_rand(n, 6, -1, 1), *w = kb_rand(C, 7, 0.5f, 1.5f), *y = kb_rand(n, 8, -1, 1);
        float *rs = kb_rand(N, 9, 0, 1), *dx = kb_rand(n, 10, -1, 1), *dw = kb_rand(C, 11, -1, 1);
        kb_row *r = kb_add(tb, "rmsnorm_fwd", 0, 4.0 * (2.0 * n + N + C), "naive", 1, "N=%d C=%d", N, C);
        MT_BEST_TIME(r->t, bud, mt_rmsnorm_fwd(y, rs, x, w, N, C, 1e-6f));
        KB_TIME_REF(r, bud, mt_ref_rmsnorm_fwd(y, rs, x, w, N, C, 1e-6f));
        r = kb_add(tb, "rmsnorm_bwd", 0, 4.0 * (4.0 * n + N + 3.0 * C), "naive", 1, "N=%d C=%d", N, C);
        MT_BEST_TIME(r->t, bud, mt_rmsnorm_bwd(dx, dw, y, x, w, rs, N, C));
        KB_TIME_REF(r, bud, mt_ref_rmsnorm_bwd(dx, dw, y, x, w, rs, N, C));
        mt_free(x); mt_free(w); mt_free(y); mt_free(rs); mt_free(dx); mt_free(dw);
    }
    /* rope on q[N, H, D] (in place; a rotation, so repeats keep the scale) */
    for (int T = KB_T; T <= KB_TLONG; T *= KB_TLONG / KB_T) {
        size_t n = (size_t)N * KB_H * KB_D, nt = (size_t)T * (KB_D / 2);
        float *q = kb_rand(n, 12, -1, 1), *ct = mt_alloc(sizeof(float) * nt), *st = mt_alloc(sizeof(float) * nt);
        mt_rope_table(ct, st, T, KB_D, 1e4);
        kb_row *r = kb_add(tb, "rope", 0, 4.0 * (2.0 * n + 2.0 * nt), "naive", 1, "N=%d T=%d nh=%d D=%d", N, T,
                           KB_H, KB_D);
        MT_BEST_TIME(r->t, bud, mt_rope_apply(q, ct, st, N, T, KB_H, KB_D, 0));
        KB_TIME_REF(r, bud, mt_ref_rope_apply(q, N, T, KB_H, KB_D, 1e4, 0));
        mt_free(q); mt_free(ct); mt_free(st);
    }
    /* swiglu rows: the dense FFN (N x 1408) and the experts' rows (N*K x 352, weighted) */
    for (int pass = 0; pass < 2; pass++) {
        int R = pass ? N * KB_K : N, Fr = pass ? KB_FM : F;
        size_t n = (size_t)R * Fr;
        float *gu = kb_rand(2 * n, 13, -4, 4), *a = kb_rand(n, 14, -1, 1), *dgu = kb_rand(2 * n, 15, -1, 1);
        float *ws = pass ? kb_rand(R, 16, 0, 1) : NULL;
        kb_row *r = kb_add(tb, "swiglu_rows_fwd", 0, 4.0 * 3.0 * n, "naive", 1, "N=%d F=%d", R, Fr);
        MT_BEST_TIME(r->t, bud, mt_swiglu_rows_fwd(a, gu, R, Fr));
        KB_TIME_REF(r, bud, mt_ref_swiglu_rows_fwd(a, gu, R, Fr));
        r = kb_add(tb, "swiglu_rows_bwd", 0, 4.0 * (5.0 * n + (ws ? R : 0)), "naive", 1, "N=%d F=%d%s", R, Fr,
                   ws ? " wscale" : "");
        MT_BEST_TIME(r->t, bud, mt_swiglu_rows_bwd(dgu, a, gu, ws, R, Fr));
        KB_TIME_REF(r, bud, mt_ref_swiglu_rows_bwd(dgu, a, gu, ws, R, Fr));
        mt_free(gu); mt_free(a); mt_free(dgu); mt_free(ws);
    }
}

/* causal attention: FLOPs fwd = 4 D H T (T+1)/2 per sequence, bwd = 2.5 x fwd. The naive
 * reference runs on one sequence (B = 8) or one head (T = 4096) and is scaled back. */
static void kb_attention(kb_table *tb, int quick) {
    const int H = KB_H, G = KB_G, D = KB_D, nthr = mt_get_threads();
    double bud = tb->budget;
    for (int pass = 0; pass < 2; pass++) {
        int B = pass ? 1 : KB_B, T = pass ? KB_TLONG : KB_T;
        size_t nq = (size_t)B * T * H * D, nk = (size_t)B * T * G * D, nl = (size_t)B * H * T;
        float *q = kb_rand(nq, 20, -1, 1), *k = kb_rand(nk, 21, -1, 1), *v = kb_rand(nk, 22, -1, 1);
        float *dout = kb_rand(nq, 23, -1, 1), *o = kb_rand(nq, 24, 0, 0), *l = kb_rand(nl, 25, 0, 0);
        float *dq = kb_rand(nq, 26, 0, 0), *dk = kb_rand(nk, 27, 0, 0), *dv = kb_rand(nk, 28, 0, 0);
        float *scratch = mt_alloc(sizeof(float) * (size_t)nthr * mt_attention_scratch_floats(T, D));
        double ff = 4.0 * D * H * (double)T * (T + 1) / 2.0 * B;
        /* reference: one sequence of B (scale B) or one head of H (scale H) */
        int rB = 1, rH = pass ? 1 : H, rG = pass ? 1 : G;
        double scale = pass ? H : B;
        kb_row *rf = kb_add(tb, "attention_fwd", 1, ff, "naive", scale, "B=%d T=%d H=%d G=%d D=%d", B, T, H, G, D);
        kb_row *rb = kb_add(tb, "attention_bwd", 1, 2.5 * ff, "naive", scale, "B=%d T=%d H=%d G=%d D=%d", B, T, H,
                            G, D);
        MT_BEST_TIME(rf->t, bud, mt_attention_fwd(o, l, q, k, v, NULL, B, T, H, G, D, scratch, nthr, 0));
        MT_BEST_TIME(rb->t, bud, mt_attention_bwd(dq, dk, dv, dout, q, k, v, o, l, NULL, B, T, H, G, D, scratch, nthr, 0));
        if (!(quick && pass)) { /* reference of the long shape: ~10 s, skipped by --quick */
            /* one head: q/k/v of that shape are fresh [1,T,1,D] slices of the same data */
            KB_TIME_REF(rf, bud, mt_ref_attention_fwd(o, l, q, k, v, NULL, rB, T, rH, rG, D));
            KB_TIME_REF(rb, bud, mt_ref_attention_bwd(dq, dk, dv, dout, q, k, v, NULL, rB, T, rH, rG, D));
        }
        if (tb->bf16) { /* mixed precision (products on bf16 pairs) against the fp32 kernel */
            rf = kb_add(tb, "attention_fwd_bf16", 1, ff, "fp32 flash attention", 1, "B=%d T=%d H=%d G=%d D=%d", B, T, H,
                        G, D);
            KB_TIME_BF16(rf, bud,
                         mt_attention_fwd(o, l, q, k, v, NULL, B, T, H, G, D, scratch, nthr, tb->kws.bf16));
            rb = kb_add(tb, "attention_bwd_bf16", 1, 2.5 * ff, "fp32 flash attention", 1, "B=%d T=%d H=%d G=%d D=%d", B,
                        T, H, G, D);
            KB_TIME_BF16(rb, bud, mt_attention_bwd(dq, dk, dv, dout, q, k, v, o, l, NULL, B, T, H, G, D, scratch, nthr,
                                                   tb->kws.bf16));
        }
        mt_free(q); mt_free(k); mt_free(v); mt_free(dout); mt_free(o); mt_free(l); mt_free(dq);
        mt_free(dk); mt_free(dv); mt_free(scratch);
    }
}

/* MLA's flash attention (q/k of dn + dr = 192, v of dv = 128: DeepSeek-V3's head, G = H) at
 * T = 4096 against the GQA kernel at that length (D 64, the attention_fwd/bwd rows' shape),
 * timed in alternation (rounds of each, the best of every kernel kept), so that a load that
 * comes and goes on the machine falls on both. The reference time is the GQA kernel's for
 * the MLA row's FLOPs (its time scaled by the FLOP ratio): the speedup column is the ratio of
 * the two GFLOP/s. FLOPs per (query, visible key) and head: fwd 2 (Dk + Dv) (q.k, p v); bwd
 * 2 (3 Dk + 2 Dv) (q.k again, dO.v, dV, dQ, dK); for GQA (Dk = Dv = D) 4 D and 10 D. */
static void kb_attention_mla(kb_table *tb) {
    enum { DK = 192, DV = 128, ROUNDS = 3 };
    const int H = KB_H, G = KB_G, D = KB_D, T = KB_TLONG, nthr = mt_get_threads();
    const double bud = tb->budget / ROUNDS;
    const size_t nq = (size_t)T * H * DK, nv = (size_t)T * H * DV, nl = (size_t)H * T;
    const size_t gq = (size_t)T * H * D, gk = (size_t)T * G * D;
    float *q = kb_rand(nq, 40, -1, 1), *k = kb_rand(nq, 41, -1, 1), *v = kb_rand(nv, 42, -1, 1);
    float *dout = kb_rand(nv, 43, -1, 1), *o = kb_rand(nv, 44, 0, 0), *l = kb_rand(nl, 45, 0, 0);
    float *dq = kb_rand(nq, 46, 0, 0), *dk = kb_rand(nq, 47, 0, 0), *dv = kb_rand(nv, 48, 0, 0);
    float *Gq = kb_rand(gq, 20, -1, 1), *Gk = kb_rand(gk, 21, -1, 1), *Gv = kb_rand(gk, 22, -1, 1);
    float *Gdo = kb_rand(gq, 23, -1, 1), *Go = kb_rand(gq, 24, 0, 0), *Gdq = kb_rand(gq, 26, 0, 0);
    float *Gdk = kb_rand(gk, 27, 0, 0), *Gdv = kb_rand(gk, 28, 0, 0);
    float *scratch = mt_alloc(sizeof(float) * (size_t)nthr * mt_attention_scratch_floats(T, DK));
    const double pairs = H * (double)T * (T + 1) / 2.0;
    const double ff = 2.0 * (DK + DV) * pairs, fb = 2.0 * (3 * DK + 2 * DV) * pairs;
    const double gf = 4.0 * D * pairs, gb = 10.0 * D * pairs;
    for (int bf = 0; bf <= tb->bf16; bf++) {
        kb_row *rf = kb_add(tb, bf ? "attention_mla_fwd_bf16" : "attention_mla_fwd", 1, ff, "GQA kernel's rate, paired",
                            ff / gf, "B=1 T=%d H=%d Dk=%d Dv=%d", T, H, DK, DV);
        kb_row *rb = kb_add(tb, bf ? "attention_mla_bwd_bf16" : "attention_mla_bwd", 1, fb,
                            "GQA kernel's rate, paired", fb / gb, "B=1 T=%d H=%d Dk=%d Dv=%d", T, H, DK, DV);
        double t[4] = {INFINITY, INFINITY, INFINITY, INFINITY}, x;
        for (int r = 0; r < ROUNDS; r++) {
            MT_BEST_TIME(x, bud, mt_attention_fwd(Go, l, Gq, Gk, Gv, NULL, 1, T, H, G, D, scratch, nthr, bf));
            t[0] = x < t[0] ? x : t[0];
            MT_BEST_TIME(x, bud, mt_attention_fwd_dv(o, l, q, k, v, NULL, 1, T, H, H, DK, DV, scratch, nthr, bf));
            t[1] = x < t[1] ? x : t[1];
            MT_BEST_TIME(x, bud, mt_attention_fwd(Go, l, Gq, Gk, Gv, NULL, 1, T, H, G, D, scratch, nthr, bf));
            MT_BEST_TIME(x, bud, mt_attention_bwd(Gdq, Gdk, Gdv, Gdo, Gq, Gk, Gv, Go, l, NULL, 1, T, H, G, D, scratch,
                                                  nthr, bf));
            t[2] = x < t[2] ? x : t[2];
            MT_BEST_TIME(x, bud, mt_attention_fwd_dv(o, l, q, k, v, NULL, 1, T, H, H, DK, DV, scratch, nthr, bf));
            MT_BEST_TIME(x, bud, mt_attention_bwd_dv(dq, dk, dv, dout, q, k, v, o, l, NULL, 1, T, H, H, DK, DV,
                                                     scratch, nthr, bf));
            t[3] = x < t[3] ? x : t[3];
        }
        rf->t = t[1];
        rf->t_ref = t[0] * rf->ref_scale;
        rb->t = t[3];
        rb->t_ref = t[2] * rb->ref_scale;
    }
    mt_free(q); mt_free(k); mt_free(v); mt_free(dout); mt_free(o); mt_free(l); mt_free(dq);
    mt_free(dk); mt_free(dv); mt_free(Gq); mt_free(Gk); mt_free(Gv); mt_free(Gdo); mt_free(Go);
    mt_free(Gdq); mt_free(Gdk); mt_free(Gdv); mt_free(scratch);
}

/* LM head + cross-entropy, forward and backward: 6 N C V FLOPs (2 fwd, 4 bwd) */
static void kb_head(kb_table *tb) {
    const int N = KB_B * KB_T, C = KB_C, V = KB_V, nr = 32;
    double bud = tb->budget;
    float *x = kb_rand((size_t)N * C, 30, -1, 1), *W = kb_rand((size_t)V * C, 31, -0.05f, 0.05f);
    float *dx = kb_rand((size_t)N * C, 32, 0, 0), *dW = kb_rand((size_t)V * C, 33, 0, 0);
    float *scratch = mt_alloc(sizeof(float) * mt_head_scratch_floats(V));
    int32_t *tg = mt_xmalloc(sizeof(int32_t) * N);
    for (int i = 0; i < N; i++) tg[i] = (int32_t)(mt_hash4(34, (uint64_t)i, 0, 0) % V);
    kb_row *r = kb_add(tb, "head_ce_fwd_bwd", 1, 6.0 * N * C * V, "naive", N / nr, "N=%d C=%d V=%d", N, C, V);
    MT_BEST_TIME(r->t, bud, mt_head_ce(tb->kws, dx, dW, NULL, x, W, tg, N, C, V, 1.0f / N, NULL, scratch));
    KB_TIME_REF(r, bud, mt_ref_head_ce(dx, dW, NULL, x, W, tg, nr, C, V, 1.0f / N));
    if (tb->bf16) { /* mixed precision (the weight packed once for all chunks) against fp32 */
        r = kb_add(tb, "head_ce_fwd_bwd_bf16", 1, 6.0 * N * C * V, "fp32 head", 1, "N=%d C=%d V=%d", N, C, V);
        KB_TIME_BF16(r, bud, mt_head_ce(tb->kws, dx, dW, NULL, x, W, tg, N, C, V, 1.0f / N, NULL, scratch));
    }
    mt_free(x); mt_free(W); mt_free(dx); mt_free(dW); mt_free(scratch); free(tg);
}

/* the decode's fp32 products (the few-row kernel, ws.rows, kernels/rows.h) against the same
 * calls on OpenBLAS: one decode step of "small" at batch 64 over the weights of its 7 MoE layers
 * (every routed expert gets 8 rows; 242 MB of weights, so they come from memory as in a decode)
 * and the attention projections of 8 layers at 64 rows */
static void kb_decode(kb_table *tb) {
    enum { L = 7, LA = 8, S = 64, R = S * KB_K / KB_E };
    const int C = KB_C, F2 = 2 * KB_FM, E = KB_E;
    const size_t wgu = (size_t)F2 * C, wd = (size_t)C * KB_FM;
    double bud = tb->budget;
    float *Wgu = kb_rand(wgu * E * L, 40, -0.05f, 0.05f), *Wd = kb_rand(wd * E * L, 41, -0.05f, 0.05f);
    float *x = kb_rand((size_t)S * KB_K * C, 42, -1, 1), *h = kb_rand((size_t)S * KB_K * F2, 43, -1, 1);
    float *y = kb_rand((size_t)S * KB_K * C, 44, -1, 1), *Wa = kb_rand((size_t)4 * C * C * LA, 45, -0.05f, 0.05f);
    int32_t off[KB_E + 1];
    for (int e = 0; e <= E; e++) off[e] = e * R;
#define KB_DECODE_EXPERTS                                                                                        \
    for (int l = 0; l < L; l++) {                                                                                \
        mt_grouped_linear_fwd(tb->kws, h, x, Wgu + wgu * E * l, wgu, off, E, C, F2, 0.0f);                       \
        mt_grouped_linear_fwd(tb->kws, y, h, Wd + wd * E * l, wd, off, E, KB_FM, C, 0.0f);                       \
    }
#define KB_DECODE_ATTN                                                                                           \
    for (int l = 0; l < 4 * LA; l++) mt_linear_fwd(tb->kws, y, x, Wa + (size_t)C * C * l, S, C, C, 0.0f);
    kb_row *r = kb_add(tb, "decode_experts", 1, 2.0 * L * E * R * (double)(wgu + wd), "OpenBLAS sgemm", 1,
                       "%d layers E=%d x %d rows", L, E, R);
    tb->kws.rows = 1;
    MT_BEST_TIME(r->t, bud, KB_DECODE_EXPERTS);
    tb->kws.rows = 0;
    KB_TIME_REF(r, bud, KB_DECODE_EXPERTS);
    r = kb_add(tb, "decode_linear", 1, 2.0 * 4 * LA * S * (double)C * C, "OpenBLAS sgemm", 1, "%d x N=%d In=%d O=%d",
               4 * LA, S, C, C);
    tb->kws.rows = 1;
    MT_BEST_TIME(r->t, bud, KB_DECODE_ATTN);
    tb->kws.rows = 0;
    KB_TIME_REF(r, bud, KB_DECODE_ATTN);
#undef KB_DECODE_EXPERTS
#undef KB_DECODE_ATTN
    mt_free(Wgu); mt_free(Wd); mt_free(x); mt_free(h); mt_free(y); mt_free(Wa);
}

/* grouped expert GEMMs against a loop over experts of the dense BLAS product (what a
 * framework without a grouped GEMM does) */
static void kb_loop_fwd(mt_ws kws, float *out, const float *in, const float *W, size_t ws, const int32_t *off, int E,
                        int In, int O) {
    for (int e = 0; e < E; e++)
        mt_linear_fwd(kws, out + (size_t)off[e] * O, in + (size_t)off[e] * In, W + (size_t)e * ws, off[e + 1] - off[e],
                      In, O, 0.0f);
}
static void kb_loop_bwd(mt_ws kws, float *din, float *dW, const float *dout, const float *in, const float *W, size_t ws,
                        const int32_t *off, int E, int In, int O) {
    for (int e = 0; e < E; e++)
        mt_linear_bwd(kws, din ? din + (size_t)off[e] * In : NULL, dW ? dW + (size_t)e * ws : NULL,
                      dout + (size_t)off[e] * O, in + (size_t)off[e] * In, W + (size_t)e * ws, off[e + 1] - off[e],
                      In, O, 0.0f);
}

static void kb_moe(kb_table *tb) {
    const int N = KB_B * KB_T, K = KB_K, E = KB_E, C = KB_C, Fm = KB_FM, R = N * K;
    double bud = tb->budget;
    int32_t *sel = mt_xmalloc(sizeof(int32_t) * R), *off = mt_xmalloc(sizeof(int32_t) * (E + 1));
    int32_t *slot = mt_xmalloc(sizeof(int32_t) * R), *tok = mt_xmalloc(sizeof(int32_t) * R);
    kb_routing(sel, N, K, E);
    float *x = kb_rand((size_t)N * C, 40, -1, 1), *xe = kb_rand((size_t)R * C, 41, 0, 0);
    float *w = kb_rand(R, 42, 0, 1), *y = kb_rand((size_t)N * C, 43, 0, 0);
    double rc = (double)R * C, nc = (double)N * C;
    kb_row *r = kb_add(tb, "moe_permute", 0, 4.0 * (2.0 * rc + 3.0 * R + E + 1), "unfused argsort+gather", 1,
                       "N=%d K=%d E=%d C=%d", N, K, E, C);
    MT_BEST_TIME(r->t, bud, mt_moe_permute(tb->kws, xe, off, slot, tok, x, sel, N, K, E, C));
    KB_TIME_REF(r, bud, mt_ref_moe_permute(xe, off, slot, tok, x, sel, N, K, E, C));
    r = kb_add(tb, "moe_permute_bwd", 0, 4.0 * (rc + nc + R), "naive index_add", 1, "N=%d K=%d E=%d C=%d", N, K,
               E, C);
    MT_BEST_TIME(r->t, bud, mt_moe_permute_bwd(y, xe, slot, N, K, C, 0));
    KB_TIME_REF(r, bud, mt_ref_moe_permute_bwd(y, xe, slot, N, K, C, 0));
    r = kb_add(tb, "moe_unpermute", 0, 4.0 * (rc + nc + 2.0 * R), "naive mul+index_add", 1, "N=%d K=%d E=%d C=%d",
               N, K, E, C);
    MT_BEST_TIME(r->t, bud, mt_moe_unpermute(y, xe, w, slot, N, K, C, 0));
    KB_TIME_REF(r, bud, mt_ref_moe_unpermute(y, xe, w, slot, N, K, C, 0));

    /* expert GEMMs: gate|up [E, 2Fm, C] and down [E, C, Fm] on the routed rows */
    static const char *names[2] = {"gate_up", "down"};
    for (int pass = 0; pass < 2; pass++) {
        int In = pass ? Fm : C, O = pass ? C : 2 * Fm;
        size_t ws = (size_t)O * In;
        float *W = kb_rand(E * ws, 44, -0.05f, 0.05f), *dW = kb_rand(E * ws, 45, 0, 0);
        float *in = kb_rand((size_t)R * In, 46, -1, 1), *out = kb_rand((size_t)R * O, 47, -1, 1);
        float *din = kb_rand((size_t)R * In, 48, 0, 0);
        double fl = 2.0 * R * In * O;
        char kn[32];
        snprintf(kn, sizeof kn, "grouped_fwd_%s", names[pass]);
        r = kb_add(tb, kn, 1, fl, "per-expert mt_linear loop", 1, "R=%d E=%d In=%d O=%d", R, E, In, O);
        MT_BEST_TIME(r->t, bud, mt_grouped_linear_fwd(tb->kws, out, in, W, ws, off, E, In, O, 0.0f));
        KB_TIME_REF(r, bud, kb_loop_fwd(tb->kws, out, in, W, ws, off, E, In, O));
        snprintf(kn, sizeof kn, "grouped_bwd_data_%s", names[pass]);
        r = kb_add(tb, kn, 1, fl, "per-expert mt_linear loop", 1, "R=%d E=%d In=%d O=%d", R, E, In, O);
        MT_BEST_TIME(r->t, bud, mt_grouped_linear_bwd_data(tb->kws, din, out, W, ws, off, E, In, O, 0.0f));
        KB_TIME_REF(r, bud, kb_loop_bwd(tb->kws, din, NULL, out, in, W, ws, off, E, In, O));
        snprintf(kn, sizeof kn, "grouped_bwd_weight_%s", names[pass]);
        r = kb_add(tb, kn, 1, fl, "per-expert mt_linear loop", 1, "R=%d E=%d In=%d O=%d", R, E, In, O);
        MT_BEST_TIME(r->t, bud, mt_grouped_linear_bwd_weight(tb->kws, dW, ws, out, in, off, E, In, O));
        KB_TIME_REF(r, bud, kb_loop_bwd(tb->kws, NULL, dW, out, in, W, ws, off, E, In, O));
        if (tb->bf16) { /* the grouped GEMMs in mixed precision against themselves in fp32 */
            static const char *gref = "fp32 grouped (OpenBLAS sgemm)";
            snprintf(kn, sizeof kn, "grouped_fwd_%s_bf16", names[pass]);
            r = kb_add(tb, kn, 1, fl, gref, 1, "R=%d E=%d In=%d O=%d", R, E, In, O);
            KB_TIME_BF16(r, bud, mt_grouped_linear_fwd(tb->kws, out, in, W, ws, off, E, In, O, 0.0f));
            snprintf(kn, sizeof kn, "grouped_bwd_data_%s_bf16", names[pass]);
            r = kb_add(tb, kn, 1, fl, gref, 1, "R=%d E=%d In=%d O=%d", R, E, In, O);
            KB_TIME_BF16(r, bud, mt_grouped_linear_bwd_data(tb->kws, din, out, W, ws, off, E, In, O, 0.0f));
            snprintf(kn, sizeof kn, "grouped_bwd_weight_%s_bf16", names[pass]);
            r = kb_add(tb, kn, 1, fl, gref, 1, "R=%d E=%d In=%d O=%d", R, E, In, O);
            KB_TIME_BF16(r, bud, mt_grouped_linear_bwd_weight(tb->kws, dW, ws, out, in, off, E, In, O));
            /* the input given as bf16 (train --bf16 keeps the experts' inputs and SwiGLU
             * outputs so) against the same products from the fp32 input */
            static const char *iref = "bf16 GEMM from fp32 input";
            uint16_t *in16 = mt_alloc((size_t)R * In * sizeof(uint16_t) + 64);
            mt_bf16_store(in16, in, (size_t)R * In);
            tb->kws.bf16 = 1;
            snprintf(kn, sizeof kn, "grouped_fwd_%s_in16", names[pass]);
            r = kb_add(tb, kn, 1, fl, iref, 1, "R=%d E=%d In=%d O=%d", R, E, In, O);
            MT_BEST_TIME(r->t, bud, mt_grouped_linear_fwd_x(tb->kws, out, NULL, NULL, in16, W, ws, off, E, In, O, 0.0f));
            KB_TIME_REF(r, bud, mt_grouped_linear_fwd(tb->kws, out, in, W, ws, off, E, In, O, 0.0f));
            snprintf(kn, sizeof kn, "grouped_bwd_weight_%s_in16", names[pass]);
            r = kb_add(tb, kn, 1, fl, iref, 1, "R=%d E=%d In=%d O=%d", R, E, In, O);
            MT_BEST_TIME(r->t, bud, mt_grouped_linear_bwd_weight_x(tb->kws, dW, ws, out, NULL, NULL, in16, off, E, In, O));
            KB_TIME_REF(r, bud, mt_grouped_linear_bwd_weight(tb->kws, dW, ws, out, in, off, E, In, O));
            tb->kws.bf16 = 0;
            mt_free(in16);
        }
        mt_free(W); mt_free(dW); mt_free(in); mt_free(out); mt_free(din);
    }
    free(sel); free(off); free(slot); free(tok);
    mt_free(x); mt_free(xe); mt_free(w); mt_free(y);
}

/* AdamW on n parameters: reads p, g, m, v and writes p, m, v (28 bytes per parameter) */
static void kb_adamw(kb_table *tb, size_t n) {
    double bud = tb->budget;
    float *p = kb_rand(n, 50, -1, 1), *g = kb_rand(n, 51, -1, 1), *m = kb_rand(n, 52, 0, 0), *v = kb_rand(n, 53, 0, 0);
    kb_row *r = kb_add(tb, "adamw", 0, 28.0 * n, "naive (double)", 1, "n=%zu", n);
    int step = 1;
    MT_BEST_TIME(r->t, bud, mt_adamw(p, g, m, v, n, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, step++));
    KB_TIME_REF(r, bud, mt_ref_adamw(p, g, m, v, n, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, step++));
    mt_free(p); mt_free(g); mt_free(m); mt_free(v);
}

static int kb_write_json(const kb_table *tb, const char *path, int threads) {
    cJSON *root = cJSON_CreateObject(), *arr = cJSON_CreateArray();
    cJSON_AddStringToObject(root, "impl", "moetrain");
    cJSON_AddNumberToObject(root, "threads", threads);
    cJSON_AddStringToObject(root, "blas", mt_blas_corename());
    cJSON_AddItemToObject(root, "rows", arr);
    for (int i = 0; i < tb->n; i++) {
        const kb_row *r = &tb->rows[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "kernel", r->kernel);
        cJSON_AddStringToObject(o, "shape", r->shape);
        cJSON_AddStringToObject(o, "unit", r->flop_bound ? "GFLOP/s" : "GB/s");
        cJSON_AddNumberToObject(o, "work", r->work);
        cJSON_AddNumberToObject(o, "ms", r->t * 1e3);
        cJSON_AddNumberToObject(o, "rate", kb_rate(r, r->t));
        if (isnan(r->t_ref)) {
            cJSON_AddNullToObject(o, "ref_ms");
        } else {
            cJSON_AddNumberToObject(o, "ref_ms", r->t_ref * 1e3);
            cJSON_AddNumberToObject(o, "ref_rate", kb_rate(r, r->t_ref));
            cJSON_AddNumberToObject(o, "speedup", r->t_ref / r->t);
        }
        cJSON_AddStringToObject(o, "ref", r->ref);
        cJSON_AddNumberToObject(o, "ref_scale", r->ref_scale);
        cJSON_AddItemToArray(arr, o);
    }
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    int rc = mt_write_file_atomic(path, text, strlen(text));
    cJSON_free(text);
    return rc;
}

static int bench_kernels(int argc, char **argv) {
    int threads = 0, quick = 0;
    const char *json = NULL;
    mt_arg specs[] = {
        {"threads", MT_ARG_INT, &threads, "threads of the optimised kernels (default all cores)", NULL},
        {"quick", MT_ARG_BOOL, &quick, "shorter timings, smaller AdamW, no T=4096 attention reference", NULL},
        {"json", MT_ARG_STR, &json, "also write the rows to this JSON file", NULL},
        {NULL, 0, NULL, NULL, NULL}};
    int rc = mt_args_parse("bench kernels", "[--threads N] [--quick] [--json FILE]", specs, argc, argv, 3, NULL, 0,
                           NULL);
    if (rc) return rc > 0 ? 0 : mt_cli_fail();
    if (threads > 0) mt_set_threads(threads);
    kb_table *tb = mt_xcalloc(1, sizeof *tb);
    tb->budget = quick ? 0.25 : 1.0;
    tb->bf16 = mt_bf16_supported();
    { /* the largest of the rows' workspaces, for the threads and both precisions */
        const int nthr = mt_get_threads(), O = 2 * KB_FM > KB_C ? 2 * KB_FM : KB_C;
        mt_ws_reserve(&tb->kws, mt_head_ws_bytes(KB_B * KB_T, KB_C, KB_V, 1, 1, nthr) +
                                    mt_grouped_ws_bytes(KB_B * KB_T * KB_K, KB_E, O, 1, nthr) +
                                    mt_moe_permute_ws_bytes(KB_E, nthr));
    }
    double t0 = mt_now();
    printf("bench kernels: kernels %s, BLAS kernel %s, %d threads (references: 1 thread, except the per-expert loops "
           "and the fp32 references of the bf16 rows)\n",
           mt_cpu_tier_name(mt_cpu_tier()), mt_blas_corename(), mt_get_threads());
    if (!tb->bf16) printf("bench kernels: kernel tier %s has no AVX512-BF16, the *_bf16 rows (mt_gemm_bf16) are skipped\n",
                          mt_cpu_tier_name(mt_cpu_tier()));
    fflush(stdout);
    kb_dense(tb);
    kb_attention(tb, quick);
    kb_attention_mla(tb);
    kb_head(tb);
    kb_moe(tb);
    kb_decode(tb);
    kb_adamw(tb, quick ? (size_t)4 << 20 : (size_t)16 << 20);
    printf("%-31s %-26s %9s %8s %-7s %9s %8s %8s  %s\n", "kernel", "shape", "ms", "rate", "unit", "ref ms",
           "ref rate", "speedup", "reference");
    for (int i = 0; i < tb->n; i++) {
        const kb_row *r = &tb->rows[i];
        char refs[16] = "-", rrate[16] = "-", sp[16] = "-", note[96];
        if (!isnan(r->t_ref)) {
            snprintf(refs, sizeof refs, "%.2f", r->t_ref * 1e3);
            snprintf(rrate, sizeof rrate, "%.2f", kb_rate(r, r->t_ref));
            snprintf(sp, sizeof sp, "%.1fx", r->t_ref / r->t);
        }
        if (r->ref_scale > 1) snprintf(note, sizeof note, "%s (timed on 1/%g, scaled)", r->ref, r->ref_scale);
        else snprintf(note, sizeof note, "%s", isnan(r->t_ref) ? "skipped" : r->ref);
        printf("%-31s %-26s %9.3f %8.2f %-7s %9s %8s %8s  %s\n", r->kernel, r->shape, r->t * 1e3,
               kb_rate(r, r->t), r->flop_bound ? "GFLOP/s" : "GB/s", refs, rrate, sp, note);
    }
    printf("bench kernels: %d rows in %.1f s; rate = GFLOP/s for FLOP-bound kernels, GB/s (bytes read + "
           "written) for the others; speedup = reference time / optimised time\n",
           tb->n, mt_now() - t0);
    rc = json ? kb_write_json(tb, json, mt_get_threads()) : 0;
    mt_ws_free(&tb->kws);
    free(tb);
    return rc ? mt_cli_fail() : 0;
}

int mt_cmd_bench(int argc, char **argv) {
    if (argc > 2 && strcmp(argv[2], "kernels") == 0) return bench_kernels(argc, argv);
    const char *config = NULL;
    int B = 8, T = -1, steps = 5, threads = 0; /* T: -1 = 512, or the config's maximum when smaller */
    const char *recompute = "none", *calibrate = NULL;
    int quick = 0, bf16 = 0, step_flags = 0; /* step_flags: one of the --config run's flags was given */
    mt_arg specs[] = {
        {"calibrate", MT_ARG_STR, &calibrate, "measure this machine and write a cluster file for moetrain plan (SGEMM and, with AVX512-BF16, the bf16 GEMM of train --bf16)", NULL},
        {"quick", MT_ARG_BOOL, &quick, "with --calibrate: shorter timings, smaller buffers, no T=4096 attention", NULL},
        {"config", MT_ARG_STR, &config, "also time training steps of this config (preset or file)", NULL},
        {"batch", MT_ARG_INT, &B, "with --config: micro-batch (default 8)", &step_flags},
        {"seq", MT_ARG_INT, &T, "with --config: sequence length (default 512, or the config's max_position_embeddings when smaller)", &step_flags},
        {"steps", MT_ARG_INT, &steps, "with --config: timed steps after one warm-up step (default 5)", &step_flags},
        {"threads", MT_ARG_INT, &threads, "threads (default all cores)", NULL},
        {"recompute", MT_ARG_STR, &recompute, "with --config: memory policy, none or selective (default none)", &step_flags},
        {"bf16", MT_ARG_BOOL, &bf16, "GEMMs in bf16 with fp32 sums, as train --bf16 (AVX512-BF16)", NULL},
        {NULL, 0, NULL, NULL, NULL}};
    int rc = mt_args_parse("bench", "[--bf16] [--config NAME --batch B --seq T --steps N]  |  --calibrate OUT.json [--quick]  |  bench kernels --help", specs, argc, argv, 2, NULL, 0, NULL);
    if (rc) return rc > 0 ? 0 : mt_cli_fail();
    if (step_flags && !config) {
        mt_error("moetrain bench: --batch, --seq, --steps and --recompute time training steps: they need --config");
        return mt_cli_fail();
    }
    if (quick && !calibrate) {
        mt_error("moetrain bench: --quick shortens --calibrate (or bench kernels --quick)");
        return mt_cli_fail();
    }
    if (calibrate) {
        if (config) {
            mt_error("moetrain bench: --calibrate and --config are separate runs");
            return mt_cli_fail();
        }
        if (bf16) {
            mt_error("moetrain bench: --bf16 applies to the GEMM peak and --config, not to --calibrate (which "
                     "measures the bf16 GEMM as well when the CPU has AVX512-BF16: plan --bf16 uses it)");
            return mt_cli_fail();
        }
        /* under mpirun the calibration also measures the links between ranks; MPI first,
         * so that the threads are placed as the trainer places them (dist.c turns the
         * pinning off when ranks share a node) */
        const int mpi = mt_launch_under_mpi();
        if (mpi && mt_dist_init(&argc, &argv) != 0) return mt_cli_fail();
        mt_set_threads(threads > 0 ? threads : mt_get_threads());
        rc = mt_calibrate(calibrate, quick);
        if (mpi) mt_dist_finalize();
        return rc ? mt_cli_fail() : 0;
    }
    if (B < 1 || steps < 1) {
        mt_error("moetrain bench: --batch and --steps must be at least 1");
        return mt_cli_fail();
    }
    int policy = mt_recompute_parse(recompute); /* before the timings: a typo fails at once */
    if (policy < 0) return mt_cli_fail();
    /* bf16: every GEMM below (the peak and the steps) runs mt_gemm_bf16 */
    if (mt_gemm_bf16_check(bf16) != 0) return mt_cli_fail();
    const char *gemm = bf16 ? "gemm bf16" : "sgemm";
    mt_set_threads(threads > 0 ? threads : mt_get_threads());
    if (bf16)
        printf("kernels %s, GEMM kernel gemm bf16 (operands rounded to bf16, fp32 sums, AVX512-BF16), %d threads\n",
               mt_cpu_tier_name(mt_cpu_tier()), mt_get_threads());
    else
        printf("kernels %s, BLAS kernel %s, %d threads\n", mt_cpu_tier_name(mt_cpu_tier()), mt_blas_corename(),
               mt_get_threads());
    double peak = 0;
    for (int n = 512; n <= 2048; n *= 2) {
        double g = mt_gemm_gflops(n, 0.5, bf16);
        if (g > peak) peak = g;
        printf("%-9s %4d^3    %7.1f GFLOP/s\n", gemm, n, g);
    }
    printf("peak %s (MFU denominator) %.1f GFLOP/s\n", gemm, peak);
    if (!config) return 0;
    mt_config c;
    const char *cpath = mt_cli_config_path(config);
    if (mt_config_load(&c, cpath) != 0 || mt_model_check(&c, cpath) != 0) return mt_cli_fail();
    if (T == -1) T = c.max_position_embeddings < 512 ? c.max_position_embeddings : 512;
    if (mt_config_check_seq(&c, T, "moetrain bench: --seq") != 0) return mt_cli_fail();
    mt_model m;
    if (mt_model_init(&m, &c) != 0) return mt_cli_fail();
    mt_model_init_weights(&m, 1, sqrtf(1.0f / (2.0f * c.hidden_size * c.num_hidden_layers)));
    float *am = mt_alloc(m.nparams * sizeof(float)), *av = mt_alloc(m.nparams * sizeof(float));
    mt_acts *a = mt_acts_new_policy(&c, B, T, mt_get_threads(), policy, bf16);
    size_t N = (size_t)B * T;
    int32_t *in = mt_xmalloc(sizeof(int32_t) * N), *tg = mt_xmalloc(sizeof(int32_t) * N);
    double total = 0;
    for (int s = 0; s <= steps; s++) {
        for (size_t i = 0; i < N; i++) {
            in[i] = (int32_t)(mt_hash4(7, (uint64_t)s, i, 0) % (uint64_t)c.vocab_size);
            tg[i] = (int32_t)(mt_hash4(7, (uint64_t)s, i, 1) % (uint64_t)c.vocab_size);
        }
        double t0 = mt_now();
        mt_step_stats st;
        mt_model_zero_grads(&m);
        mt_model_step(&m, a, in, tg, B, T, 1, 1.0f / (float)N, 1.0f / (float)B, NULL, &st);
        for (int i = 0; i < m.ntensors; i++) {
            const mt_tensor *t = &m.tensors[i];
            mt_adamw(m.params + t->offset, m.grads + t->offset, am + t->offset, av + t->offset, t->numel, 1e-4f,
                     0.9f, 0.95f, 1e-8f, t->decay ? 0.1f : 0.0f, 1.0f, s + 1);
        }
        double dt = mt_now() - t0;
        if (s > 0) total += dt;
        printf("step %d: %.3f s (%.0f tok/s)%s\n", s, dt, N / dt, s == 0 ? " warm-up" : "");
    }
    double tps = N * steps / total;
    double mfu = mt_model_flops_per_token(&c, T) * tps / (peak * 1e9);
    printf("train %s B=%d T=%d%s: %.0f tok/s, MFU %.1f%%, activations %.1f MiB, peak RSS %.1f MiB\n", config, B, T,
           bf16 ? " bf16" : "", tps, 100 * mfu, mt_acts_arena_bytes(a) / 1048576.0,
           mt_peak_rss() / 1048576.0);
    free(in);
    free(tg);
    mt_acts_free(a);
    mt_free(am);
    mt_free(av);
    mt_model_free(&m);
    return 0;
}
