/* kernels/gemm_bf16.c — mixed-precision GEMM: fp32 operands rounded to bfloat16 while they
 * are packed, products summed in fp32 (AVX512-BF16 VDPBF16PS). See gemm_bf16.h.
 *
 * Structure (Goto/BLIS): C is cut into NC-column blocks, K into KC-deep blocks, and A into
 * MC-row blocks; each block of B is packed once (converted to bf16) into NR-wide micro-panels
 * and each block of A into MR-high micro-panels, then a register-blocked micro-kernel computes
 * an MR x NR tile of C from one micro-panel of each. VDPBF16PS multiplies *pairs* along K:
 * lane j of dst += a[2p]*b[2p][j] + a[2p+1]*b[2p+1][j]. So a packed panel stores, for every
 * pair p of K indices, the two bf16 values of one row (of A) or one column (of B) side by side
 * as one 32-bit word: B panel [kp][NR] words, A panel [kp][MR] words; odd K is padded
 * with 0. (An A panel [MR][kp] of plain row conversions, read with a row stride, packs
 * cheaper than the transposition that A's contiguous rows need, but its 12 broadcast
 * streams made the products 1-3% slower over the step's shapes.) Rounding is to nearest even
 * (VCVTNE2PS2BF16), as PyTorch's casts; the instruction treats denormal inputs as zero.
 * Threads: see mt_gemm_bf16. */
#include "kernels/gemm_bf16.h"

#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "base/common.h"
#include "kernels/bf16_pack.h"
#include "kernels/blas.h"
#include "kernels/tier.h"
#include "kernels/ws.h"

#define MR 12
#define NR 32           /* two zmm of fp32 lanes */
#define KC 768          /* K indices per block (384 pairs): A micro-panel 18 KiB in L1, B's 48 KiB in L2 */
#define MC 192          /* rows of A per block: 288 KiB packed, in L2 */
#define NC 3072         /* columns of B per block: 4.5 MiB packed, in L3 */

#define BF16_TARGET MT_BF16_TARGET

/* the kernel tier in use has AVX512-BF16 (kernels/tier.h: the CPU has it and MT_CPU_TIER
 * does not force a lower tier) */
int mt_bf16_supported(void) { return mt_cpu_tier() == MT_TIER_AVX512BF16; }

float mt_bf16_round(float f) {
    uint32_t u = (uint32_t)mt_f32_to_bf16(f) << 16;
    float r;
    memcpy(&r, &u, 4);
    return r;
}

BF16_TARGET void mt_bf16_store_row(uint16_t *dst, const float *src, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(dst + i), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(src + i)));
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        _mm256_mask_storeu_epi16(dst + i, m, (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, src + i)));
    }
}

BF16_TARGET void mt_bf16_load_row(float *dst, const uint16_t *src, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(dst + i, _mm512_castsi512_ps(_mm512_slli_epi32(
                                      _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(src + i))), 16)));
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(dst + i, m, _mm512_castsi512_ps(_mm512_slli_epi32(
                                              _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, src + i)), 16)));
    }
}

void mt_bf16_store(uint16_t *dst, const float *src, size_t n) {
    const size_t chunk = 16384;
#pragma omp parallel for schedule(static)
    for (size_t i0 = 0; i0 < n; i0 += chunk) mt_bf16_store_row(dst + i0, src + i0, n - i0 < chunk ? n - i0 : chunk);
}

/* C[mr x nr] (ldc) = alpha * A_panel . B_panel + (first ? beta * Cin : C), Cin with C's row
 * stride (it may be C); beta == 0 never reads Cin. With C16 (C NULL; one K block, beta 0) the
 * tile is stored rounded to bf16 there instead. A panel [kp][MR] words, B panel [kp][NR]. */
BF16_TARGET static void micro_kernel(int kp, const uint32_t *a, const uint32_t *b, float *C, const float *Cin,
                                     uint16_t *C16, int ldc, int mr, int nr, float alpha, float beta, int first) {
    __m512 acc[MR][2];
    for (int r = 0; r < MR; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    /* The lines the epilogue writes (and reads: C after the first K block, or Cin) are
     * requested before the products: they are mostly in memory, and the epilogue waited on
     * them. Measured on 2 threads, alternated: the forward and data-gradient products of the
     * FFN widths (beta 0) 2% faster, three accumulating data gradients 5%, output passes
     * reading a residual (Cin) 3-6% (three runs each). */
    for (int r = 0; r < mr; r++) {
        if (C16) {
            _m_prefetchw(C16 + (size_t)r * ldc);
            continue;
        }
        _m_prefetchw(C + (size_t)r * ldc);
        _m_prefetchw(C + (size_t)r * ldc + 16);
        if (first && beta != 0.0f && Cin != C) {
            _mm_prefetch((const char *)(Cin + (size_t)r * ldc), _MM_HINT_T0);
            _mm_prefetch((const char *)(Cin + (size_t)r * ldc + 16), _MM_HINT_T0);
        }
    }
    for (int p = 0; p < kp; p++) {
        __m512bh b0 = (__m512bh)_mm512_loadu_si512(b + (size_t)p * NR);
        __m512bh b1 = (__m512bh)_mm512_loadu_si512(b + (size_t)p * NR + 16);
        const uint32_t *ap = a + (size_t)p * MR;
#pragma GCC unroll 12
        for (int r = 0; r < MR; r++) {
            __m512bh av = (__m512bh)_mm512_set1_epi32((int)ap[r]);
            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], av, b0);
            acc[r][1] = _mm512_dpbf16_ps(acc[r][1], av, b1);
        }
    }
    __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
    __mmask16 m0 = nr >= 16 ? 0xffff : (__mmask16)((1u << nr) - 1);
    __mmask16 m1 = nr >= 32 ? 0xffff : nr <= 16 ? 0 : (__mmask16)((1u << (nr - 16)) - 1);
    if (C16) {
        const __mmask32 m = nr >= 32 ? 0xffffffffu : (__mmask32)((1u << nr) - 1);
        for (int r = 0; r < mr; r++) /* as mt_bf16_store rounds (VCVTNE2PS2BF16: low half from x0) */
            _mm512_mask_storeu_epi16(C16 + (size_t)r * ldc, m,
                                     (__m512i)_mm512_cvtne2ps_pbh(_mm512_mul_ps(acc[r][1], va), _mm512_mul_ps(acc[r][0], va)));
        return;
    }
    for (int r = 0; r < mr; r++) {
        float *c = C + (size_t)r * ldc;
        const float *ci = Cin + (size_t)r * ldc;
        __m512 x0 = _mm512_mul_ps(acc[r][0], va), x1 = _mm512_mul_ps(acc[r][1], va);
        if (!first) {
            x0 = _mm512_add_ps(x0, _mm512_maskz_loadu_ps(m0, c));
            x1 = _mm512_add_ps(x1, _mm512_maskz_loadu_ps(m1, c + 16));
        } else if (beta != 0.0f) {
            x0 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m0, ci), x0);
            x1 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m1, ci + 16), x1);
        }
        _mm512_mask_storeu_ps(c, m0, x0);
        _mm512_mask_storeu_ps(c + 16, m1, x1);
    }
}

/* The calling thread's packing buffers in the caller's workspace (mt_gemm_ws_bytes): A's
 * block [MC rows][KC/2 pairs], then B's [NC columns][KC/2 pairs] words. */
#define APACK_BYTES ((size_t)MC * (KC / 2) * 4)
#define BPACK_BYTES ((size_t)NC * (KC / 2) * 4)
#define THREAD_BYTES (mt_ws_round(APACK_BYTES) + mt_ws_round(BPACK_BYTES))

size_t mt_gemm_ws_bytes(int nthr) { return (size_t)(nthr > 1 ? nthr : 1) * THREAD_BYTES; }

/* Packed B: NC-column blocks one after another, each its K blocks one after another, each K
 * block its NR-wide micro-panels [kp][NR] side by side (a block of nc columns holds
 * ceil(nc/NR)*NR words per pair row). Every K block but the last has KC/2 pair rows. */
static size_t pair_rows_total(int K) { return (size_t)(K / KC) * (KC / 2) + (size_t)((K % KC) + 1) / 2; }

size_t mt_gemm_bf16_packed_words(int N, int K) {
    return N <= 0 || K <= 0 ? 0 : (size_t)((N + NR - 1) / NR * NR) * pair_rows_total(K);
}

/* words before the micro-panel of column col (a multiple of NR) in K block pc */
static size_t packed_offset(int N, int K, int col, int pc, int kp) {
    int jb = col / NC * NC, nb = N - jb < NC ? N - jb : NC;
    return (size_t)jb * pair_rows_total(K) + (size_t)(pc / KC) * (KC / 2) * ((nb + NR - 1) / NR * NR) +
           (size_t)(col - jb) * kp;
}

/* One product: C = alpha op(A) op(B) + beta C, B as fp32 (B, ldb, transB) or packed (pre). */
typedef struct {
    int transA, transB, N, K;
    float alpha, beta;
    const float *A, *B;
    const uint16_t *A16, *B16; /* the operand as bf16 instead (A, B unused) */
    const uint32_t *pre;
    float *C;
    const float *Cin; /* what beta scales: C, or another matrix with C's row stride */
    uint16_t *C16;    /* instead of C: the result rounded to bf16 (K <= KC, beta 0) */
    int lda, ldb, ldc;
    mt_ws ws;         /* the threads' packing buffers (THREAD_BYTES each, by thread number) */
} gemm_args;

/* C[m0:m1, n0:n1] on the calling thread. B comes from g->pre when given, else the part packs
 * it into the thread's B buffer; *b_ready (when not NULL) says that buffer already holds all
 * of this call's B, in the packed layout (row parts, N <= NC, all of B fits: gemm_run), so
 * only the thread's first part packs. */
BF16_TARGET static void gemm_part(const gemm_args *g, int m0, int m1, int n0, int n1, int *b_ready) {
    const int K = g->K, lda = g->lda, ldc = g->ldc;
    uint32_t *ap = mt_ws_thread(g->ws, THREAD_BYTES);
    uint32_t *bp = g->pre ? NULL : (uint32_t *)((char *)ap + mt_ws_round(APACK_BYTES));
    for (int jc = n0; jc < n1; jc += NC) {
        int nc = n1 - jc < NC ? n1 - jc : NC;
        for (int pc = 0; pc < K; pc += KC) {
            int kc = K - pc < KC ? K - pc : KC, kp = (kc + 1) / 2;
            /* the block's micro-panel jr: in the kept B's slot of the block, or from the
             * start of the buffer (packed B: see BPANEL) */
            uint32_t *bpc = !bp ? NULL : b_ready ? bp + packed_offset(g->N, K, 0, pc, kp) : bp;
#define BPANEL(jr) (g->pre ? g->pre + packed_offset(g->N, K, jc + (jr), pc, kp) : bpc + (size_t)(jr) * kp)
            /* B(k, n): transB stores it at B[n*ldb + k] (pairs contiguous), else B[k*ldb + n] */
            if (bp && (!b_ready || !*b_ready))
                for (int jr = 0; jr < nc; jr += NR) {
                    int w = nc - jr < NR ? nc - jr : NR;
                    if (g->B16) mt_bf16_pack_panel16(bpc + (size_t)jr * kp, NR, g->B16, g->ldb, !g->transB, pc, kc, jc + jr, w);
                    else mt_bf16_pack_panel(bpc + (size_t)jr * kp, NR, g->B, g->ldb, !g->transB, pc, kc, jc + jr, w);
                }
            for (int ic = m0; ic < m1; ic += MC) {
                int mc = m1 - ic < MC ? m1 - ic : MC;
                /* A(m, k): transA stores it at A[k*lda + m] (two rows give a pair), else A[m*lda + k] */
                for (int ir = 0; ir < mc; ir += MR) {
                    int h = mc - ir < MR ? mc - ir : MR;
                    if (g->A16) mt_bf16_pack_panel16(ap + (size_t)ir * kp, MR, g->A16, lda, g->transA, pc, kc, ic + ir, h);
                    else mt_bf16_pack_panel(ap + (size_t)ir * kp, MR, g->A, lda, g->transA, pc, kc, ic + ir, h);
                }
                for (int jr = 0; jr < nc; jr += NR) {
                    int nr = nc - jr < NR ? nc - jr : NR;
                    for (int ir = 0; ir < mc; ir += MR) {
                        int mr = mc - ir < MR ? mc - ir : MR;
                        const size_t ct = (size_t)(ic + ir) * ldc + jc + jr;
                        if (g->C16)
                            micro_kernel(kp, ap + (size_t)ir * kp, BPANEL(jr), NULL, NULL, g->C16 + ct, ldc, mr, nr,
                                         g->alpha, 0.0f, 1);
                        else
                            micro_kernel(kp, ap + (size_t)ir * kp, BPANEL(jr), g->C + ct, g->Cin + ct, NULL, ldc, mr,
                                         nr, g->alpha, g->beta, pc == 0);
                    }
                }
            }
        }
    }
#undef BPANEL
    if (b_ready) *b_ready = 1;
}

static void gemm_run(const gemm_args *g, int M) {
    const int N = g->N, K = g->K;
    if (M <= 0 || N <= 0) return;
    MT_ASSERT(!g->C16 || (K <= KC && g->beta == 0.0f && !g->pre));
    if (K <= 0 && g->C16) {
        for (int i = 0; i < M; i++) memset(g->C16 + (size_t)i * g->ldc, 0, sizeof(uint16_t) * N);
        return;
    }
    if (K <= 0) {
        if (g->Cin != g->C)
            for (int i = 0; i < M; i++) memcpy(g->C + (size_t)i * g->ldc, g->Cin + (size_t)i * g->ldc, sizeof(float) * N);
        mt_gemm_scale_c(M, N, g->beta, g->C, g->ldc);
        return;
    }
    int nthr = omp_in_parallel() ? 1 : omp_get_max_threads();
    if (nthr > 1 && (double)M * N * K < 2e6) nthr = 1;
    /* inside a parallel region this runs on the calling thread, whose number indexes ws */
    mt_ws_check(g->ws, THREAD_BYTES, omp_in_parallel() ? omp_get_num_threads() : nthr);
    if (nthr == 1) {
        gemm_part(g, 0, M, 0, N, NULL);
        return;
    }
    /* Top level: C in parts that the threads take as they finish (dynamic schedule), so a
     * thread held up by the OS or a neighbour costs little and no barrier is needed. Parts
     * are row blocks or column blocks; sums never split, so the result does not depend on
     * the parts. A part packs what it needs: with row parts all of B (once per thread when
     * all of B fits the thread's buffer; never when B comes packed), with column parts all
     * of A. So parts are rows when M >= N; with B packed, also when A is at least a quarter
     * of B's width (reading packed B again costs much less than packing A again). About
     * four parts per thread, but where a part must pack again (or, packed, stream again) a
     * whole operand, parts of about 512 rows (columns) or more, which keeps that repacking
     * near 2% of the part's work (packing an element costs about 20 flops), and at least
     * one part per thread. */
    const int by_rows = g->pre ? 4 * M >= N : M >= N, unit = by_rows ? MR : NR, total = by_rows ? M : N;
    /* with several K blocks the kept B outgrows L2 and is streamed again by every part,
     * which then wants as many rows as a repacking part */
    const int whole_b = !g->pre && by_rows && N <= NC && mt_gemm_bf16_packed_words(N, K) <= (size_t)NC * (KC / 2);
    const int repack = !whole_b || K > KC;
    const int per_thread = (total + nthr - 1) / nthr;
    int part = (total + 4 * nthr - 1) / (4 * nthr);
    if (repack && part < 512) part = 512 < per_thread ? 512 : per_thread;
    /* a multiple of the threads in equal parts: 3 parts of 512 on 2 threads would leave
     * one thread idle for a third of the call */
    int nparts = (total + part - 1) / part;
    nparts = (nparts + nthr - 1) / nthr * nthr;
    part = (total + nparts - 1) / nparts;
    part = (part + unit - 1) / unit * unit;
    nparts = (total + part - 1) / part;
    /* keeping B pays when a thread runs several parts (a single one streams it once anyway) */
    const int keep_b = whole_b && (K <= KC || nparts > nthr);
#pragma omp parallel num_threads(nthr)
    {
        int b_ready = 0;
#pragma omp for schedule(dynamic, 1)
        for (int q = 0; q < nparts; q++) {
            int lo = q * part, hi = lo + part < total ? lo + part : total;
            if (by_rows) gemm_part(g, lo, hi, 0, N, keep_b ? &b_ready : NULL);
            else gemm_part(g, 0, M, lo, hi, NULL);
        }
    }
}

void mt_gemm_bf16(mt_ws ws, int transA, int transB, int M, int N, int K, float alpha, const float *A, int lda,
                  const float *B, int ldb, float beta, float *C, int ldc) {
    gemm_args g = {transA, transB, N, K, alpha, beta, A, B, NULL, NULL, NULL, C, C, NULL, lda, ldb, ldc, ws};
    gemm_run(&g, M);
}

void mt_gemm_bf16_mixed(mt_ws ws, int transA, int transB, int M, int N, int K, float alpha, const float *A,
                        const uint16_t *A16, int lda, const float *B, const uint16_t *B16, int ldb, float beta,
                        float *C, int ldc) {
    mt_gemm_bf16_mixed_cin(ws, transA, transB, M, N, K, alpha, A, A16, lda, B, B16, ldb, beta, C, C, ldc);
}

void mt_gemm_bf16_mixed_cin(mt_ws ws, int transA, int transB, int M, int N, int K, float alpha, const float *A,
                            const uint16_t *A16, int lda, const float *B, const uint16_t *B16, int ldb, float beta,
                            const float *Cin, float *C, int ldc) {
    MT_ASSERT(!A != !A16 && !B != !B16);
    gemm_args g = {transA, transB, N, K, alpha, beta, A, B, A16, B16, NULL, C, Cin, NULL, lda, ldb, ldc, ws};
    gemm_run(&g, M);
}

void mt_gemm_bf16_mixed_c16(mt_ws ws, int transA, int transB, int M, int N, int K, float alpha, const float *A,
                            const uint16_t *A16, int lda, const float *B, const uint16_t *B16, int ldb, uint16_t *C16,
                            int ldc) {
    MT_ASSERT(!A != !A16 && !B != !B16);
    if (K <= KC) { /* one K block: the micro-kernel rounds its finished tile */
        gemm_args g = {transA, transB, N, K, alpha, 0.0f, A, B, A16, B16, NULL, NULL, NULL, C16, lda, ldb, ldc, ws};
        gemm_run(&g, M);
        return;
    }
    /* deeper sums need fp32 partial sums between K blocks: chunks of rows in fp32, rounded */
    const int ch = M < 256 ? M : 256;
    float *tmp = mt_alloc(sizeof(float) * (size_t)ch * N);
    for (int r0 = 0; r0 < M; r0 += ch) {
        const int rows = M - r0 < ch ? M - r0 : ch;
        const size_t ao = transA ? (size_t)r0 : (size_t)r0 * lda;
        gemm_args g = {transA, transB, N, K, alpha, 0.0f, A ? A + ao : NULL, B, A16 ? A16 + ao : NULL, B16, NULL,
                       tmp, tmp, NULL, lda, ldb, N, ws};
        gemm_run(&g, rows);
#pragma omp parallel for schedule(static) if (!omp_in_parallel())
        for (int i = 0; i < rows; i++) mt_bf16_store_row(C16 + (size_t)(r0 + i) * ldc, tmp + (size_t)i * N, (size_t)N);
    }
    mt_free(tmp);
}

void mt_gemm_bf16_pack(uint32_t *packed, int transB, int N, int K, const float *B, int ldb) {
    mt_gemm_bf16_pack_x(packed, transB, N, K, B, NULL, ldb);
}

void mt_gemm_bf16_pack_x(uint32_t *packed, int transB, int N, int K, const float *B, const uint16_t *B16, int ldb) {
    if (N <= 0 || K <= 0) return;
    const int np = (N + NR - 1) / NR, nkb = (K + KC - 1) / KC;
#pragma omp parallel for schedule(static) if (!omp_in_parallel() && (double)N * K >= 1e6)
    for (int t = 0; t < np * nkb; t++) {
        int col = t / nkb * NR, pc = t % nkb * KC;
        int kc = K - pc < KC ? K - pc : KC, w = N - col < NR ? N - col : NR;
        uint32_t *o = packed + packed_offset(N, K, col, pc, (kc + 1) / 2);
        if (B16) mt_bf16_pack_panel16(o, NR, B16, ldb, !transB, pc, kc, col, w);
        else mt_bf16_pack_panel(o, NR, B, ldb, !transB, pc, kc, col, w);
    }
}

void mt_gemm_bf16_packed(mt_ws ws, int transA, int M, int N, int K, float alpha, const float *A, int lda,
                         const uint32_t *packed, float beta, float *C, int ldc) {
    mt_gemm_bf16_packed_x(ws, transA, M, N, K, alpha, A, NULL, lda, packed, beta, C, ldc);
}

void mt_gemm_bf16_packed_x(mt_ws ws, int transA, int M, int N, int K, float alpha, const float *A, const uint16_t *A16,
                           int lda, const uint32_t *packed, float beta, float *C, int ldc) {
    MT_ASSERT(!A != !A16);
    gemm_args g = {transA, 0, N, K, alpha, beta, A, NULL, A16, NULL, packed, C, C, NULL, lda, 0, ldc, ws};
    gemm_run(&g, M);
}
