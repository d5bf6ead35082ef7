/* kernels/blas.c — CBLAS wrappers and the OpenBLAS kernel check (see blas.h). */
#include "kernels/blas.h"

#include <cblas.h>
#include <omp.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/common.h"
#include "parallel/launch.h"
#include "kernels/gemm_bf16.h"
#include "kernels/ops.h"
#include "kernels/rows.h"
#include "kernels/tier.h"

char *openblas_get_corename(void);
void openblas_set_num_threads(int n);

const char *mt_blas_corename(void) { return openblas_get_corename(); }

static int core_has_avx512(const char *c) {
    static const char *k[] = {"SkylakeX", "Cooperlake", "SapphireRapids", "Zen4", NULL};
    for (int i = 0; k[i]; i++) if (strcasecmp(c, k[i]) == 0) return 1;
    return 0;
}

static int core_has_avx2(const char *c) {
    static const char *k[] = {"Haswell", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids", "Zen4", NULL};
    for (int i = 0; k[i]; i++) if (strcasecmp(c, k[i]) == 0) return 1;
    return 0;
}

/* 1 when this process's OpenMP threads, together with those of the other ranks on this node
 * (Open MPI / MPICH launchers say how many), fit on the CPUs it may use. */
static int threads_fit_cpus(void) {
    cpu_set_t allowed;
    int cpus = sched_getaffinity(0, sizeof allowed, &allowed) == 0 ? CPU_COUNT(&allowed) : 1;
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    const char *e = getenv("OMP_NUM_THREADS");
    int threads = e && atoi(e) > 0 ? atoi(e) : cpus;
    const long ranks = mt_launch_local_size();
    return threads <= cpus && ranks * threads <= online;
}

void mt_blas_init(int argc, char **argv) {
    (void)argc;
    const char *no = getenv("MT_NO_BLAS_FIX");
    if ((no && *no && strcmp(no, "0") != 0) || getenv("MT_REEXECUTED")) return;
    int changed = 0;
    /* OpenMP threads that spin while waiting starve everything else on a shared or
     * oversubscribed machine (measured: 2.7x slower training with one busy neighbour, no
     * difference on an idle machine), so wait passively unless the user chose. */
    if (!getenv("OMP_WAIT_POLICY")) {
        setenv("OMP_WAIT_POLICY", "passive", 1);
        changed = 1;
        /* Sleeping costs a futex wake-up (~25 us on the development VM) at each end of each
         * of the ~500 parallel regions of a step. A short spin first (5000 rounds of pause,
         * about 250 us at most on a Zen 4) skips it; only when the threads have the CPUs to
         * themselves, as a spinning thread delays whatever shares its CPU. */
        if (!getenv("GOMP_SPINCOUNT") && threads_fit_cpus()) setenv("GOMP_SPINCOUNT", "5000", 1);
    }
    const char *core = openblas_get_corename();
    if (!getenv("OPENBLAS_CORETYPE")) {
        /* the kernel tier decides (kernels/tier.h): MT_CPU_TIER=avx2 on an AVX-512 CPU runs
         * OpenBLAS's AVX2 kernel too, as an AVX2 CPU would */
        const char *want = NULL;
        if (mt_cpu_tier() >= MT_TIER_AVX512) {
            if (!core_has_avx512(core)) want = "SkylakeX";
        } else if (!core_has_avx2(core) || core_has_avx512(core)) {
            want = "Haswell";
        }
        if (want) { setenv("OPENBLAS_CORETYPE", want, 1); changed = 1; }
    }
    if (!changed) return;
    /* both variables are read only when the libraries load: start again with them set */
    setenv("MT_REEXECUTED", "1", 1);
    execv("/proc/self/exe", argv);
    mt_warn("re-executing with OPENBLAS_CORETYPE/OMP_WAIT_POLICY set failed; BLAS kernel %s", core);
}

/* Pins OpenMP thread i to the i-th CPU this process may run on (modulo their count), so a
 * thread keeps its caches across the many parallel regions of a step. The BLAS uses the
 * same OpenMP threads. MT_PIN=0 disables it. */
static void pin_threads(int n) {
    const char *pin = getenv("MT_PIN");
    if (pin && strcmp(pin, "0") == 0) return;
    static cpu_set_t allowed;
    static int have_allowed = 0;
    if (!have_allowed) {
        if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return;
        have_allowed = 1;
    }
    int cpus[CPU_SETSIZE], ncpu = 0;
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &allowed)) cpus[ncpu++] = c;
    if (ncpu < 2) return;
#pragma omp parallel num_threads(n)
    {
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(cpus[omp_get_thread_num() % ncpu], &one);
        sched_setaffinity(0, sizeof one, &one);
    }
}

void mt_set_threads(int n) {
    if (n < 1) n = 1;
    omp_set_num_threads(n);
    openblas_set_num_threads(n);
    pin_threads(n);
}

int mt_get_threads(void) { return omp_get_max_threads(); }

int mt_gemm_bf16_check(int on) {
    if (on && !mt_bf16_supported())
        return mt_error("bf16: mixed precision needs AVX512-BF16 (VDPBF16PS), which %s; run without --bf16",
                        mt_cpu_tier_best() == MT_TIER_AVX512BF16 ? "MT_CPU_TIER turns off" : "this CPU lacks");
    return 0;
}

void mt_gemm_scale_c(int M, int N, float beta, float *C, int ldc) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) C[(size_t)i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[(size_t)i * ldc + j];
}

/* OpenBLAS 0.3.21 threads a call made outside an active parallel region (one of more than
 * one thread) when M N K exceeds SMP_THRESHOLD_MIN (65536) x GEMM_MULTITHREAD_THRESHOLD (4). */
#define OPENBLAS_THREADED_MNK 262144.0

/* One OpenBLAS call run on the calling thread (inside a 2-thread region's single construct
 * where OpenBLAS would otherwise thread it). */
static void sgemm_1(int transA, int transB, int M, int N, int K, float alpha, const float *A, int lda,
                    const float *B, int ldb, float beta, float *C, int ldc) {
    if (!omp_in_parallel() && omp_get_max_threads() > 1 && (double)M * N * K > OPENBLAS_THREADED_MNK) {
#pragma omp parallel num_threads(2)
#pragma omp single
        sgemm_1(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    cblas_sgemm(CblasRowMajor, transA ? CblasTrans : CblasNoTrans, transB ? CblasTrans : CblasNoTrans,
                M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

/* SGEMM in parts of C whose bounds depend on the shape only, each part one single-threaded
 * OpenBLAS call, the threads taking parts as they finish. OpenBLAS's own threading splits C
 * by the thread count, and its Haswell/Zen kernels round an element differently depending
 * on where the split falls (0.3.21: 1 and 2 threads disagree in ~10% of the elements of a
 * 256 x 128 x 128 product), which broke "results do not depend on the thread count" on
 * every AVX2 CPU. Parts are rows when M >= N (each packs all of B), else columns; at least
 * MT_SGEMM_PART wide, about MT_SGEMM_PARTS of them, so a few threads stay balanced. Called
 * inside a parallel region (the grouped expert GEMMs' tiles), with any number of threads,
 * the product is one call on the calling thread. */
enum { MT_SGEMM_PART = 64, MT_SGEMM_PARTS = 8 };

static void sgemm_parts(int transA, int transB, int M, int N, int K, float alpha, const float *A, int lda,
                        const float *B, int ldb, float beta, float *C, int ldc) {
    const int by_rows = M >= N, total = by_rows ? M : N;
    int part = (total + MT_SGEMM_PARTS - 1) / MT_SGEMM_PARTS;
    part = (part + 15) / 16 * 16;
    if (part < MT_SGEMM_PART) part = MT_SGEMM_PART;
    const int nparts = (total + part - 1) / part;
    if (omp_get_level() > 0 || nparts == 1) {
        sgemm_1(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
#pragma omp parallel for schedule(dynamic, 1)
    for (int q = 0; q < nparts; q++) {
        int lo = q * part, n = total - lo < part ? total - lo : part;
        if (by_rows) {
            const float *a = transA ? A + lo : A + (size_t)lo * lda;
            sgemm_1(transA, transB, n, N, K, alpha, a, lda, B, ldb, beta, C + (size_t)lo * ldc, ldc);
        } else {
            const float *b = transB ? B + (size_t)lo * ldb : B + lo;
            sgemm_1(transA, transB, M, n, K, alpha, A, lda, b, ldb, beta, C + lo, ldc);
        }
    }
}

void mt_sgemm(mt_ws ws, int transA, int transB, int M, int N, int K, float alpha, const float *A, int lda,
              const float *B, int ldb, float beta, float *C, int ldc) {
    if (M == 0 || N == 0) return;
    if (ws.bf16) {
        mt_gemm_bf16(ws, transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    if (K == 0) {
        mt_gemm_scale_c(M, N, beta, C, ldc);
        return;
    }
    if (ws.rows && !transA && transB) {
        mt_rows_gemm(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    sgemm_parts(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void mt_sgemm_x(mt_ws ws, int transA, int transB, int M, int N, int K, float alpha, const float *A, const uint16_t *A16,
                int lda, const float *B, const uint16_t *B16, int ldb, float beta, float *C, int ldc) {
    if (!A16 && !B16) {
        mt_sgemm(ws, transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    MT_ASSERT(ws.bf16);
    if (M > 0 && N > 0) mt_gemm_bf16_mixed(ws, transA, transB, M, N, K, alpha, A, A16, lda, B, B16, ldb, beta, C, ldc);
}

void mt_linear_fwd_x(mt_ws ws, float *out, uint16_t *out16, const float *in, const uint16_t *in16, const float *W, int N,
                     int In, int O, float beta) {
    if (!out16) {
        mt_sgemm_x(ws, 0, 1, N, O, In, 1.0f, in, in16, In, W, NULL, In, beta, out, O);
        return;
    }
    MT_ASSERT(ws.bf16 && !out && beta == 0.0f);
    if (N > 0 && O > 0) mt_gemm_bf16_mixed_c16(ws, 0, 1, N, O, In, 1.0f, in, in16, In, W, NULL, In, out16, O);
}

void mt_linear_fwd_res(mt_ws ws, float *out, const float *res, const float *in, const uint16_t *in16, const float *W, int N,
                       int In, int O) {
    if (ws.bf16) {
        if (N > 0 && O > 0) mt_gemm_bf16_mixed_cin(ws, 0, 1, N, O, In, 1.0f, in, in16, In, W, NULL, In, 1.0f, res, out, O);
        return;
    }
    if (res != out) mt_copy(out, res, (size_t)N * O);
    mt_linear_fwd_x(ws, out, NULL, in, in16, W, N, In, O, 1.0f);
}

void mt_linear_bwd_x(mt_ws ws, float *din, float *dW, const float *dout, const uint16_t *dout16, const float *in,
                     const uint16_t *in16, const float *W, int N, int In, int O, float beta_in) {
    if (din) mt_sgemm_x(ws, 0, 0, N, In, O, 1.0f, dout, dout16, O, W, NULL, In, beta_in, din, In);
    if (dW && N > 0) mt_sgemm_x(ws, 1, 0, O, In, N, 1.0f, dout, dout16, O, in, in16, In, 1.0f, dW, In);
}

void mt_linear_fwd(mt_ws ws, float *out, const float *in, const float *W, int N, int In, int O, float beta) {
    mt_linear_fwd_x(ws, out, NULL, in, NULL, W, N, In, O, beta);
}

void mt_linear_bwd(mt_ws ws, float *din, float *dW, const float *dout, const float *in, const float *W,
                   int N, int In, int O, float beta_in) {
    mt_linear_bwd_x(ws, din, dW, dout, NULL, in, NULL, W, N, In, O, beta_in);
}

void mt_linear_bwd_weight_shared(mt_ws ws, int n, float *const *dW, const float *const *dout, const int *O,
                                 const float *in, const uint16_t *in16, int N, int In, void *pack, size_t pack_words) {
    if (!ws.bf16 || !pack || N <= 0 || mt_gemm_bf16_packed_words(In, N) > pack_words) {
        for (int i = 0; i < n; i++) mt_linear_bwd_x(ws, NULL, dW[i], dout[i], NULL, in, in16, NULL, N, In, O[i], 0.0f);
        return;
    }
    mt_gemm_bf16_pack_x(pack, 0, In, N, in, in16, In);
    for (int i = 0; i < n; i++) mt_gemm_bf16_packed(ws, 1, O[i], In, N, 1.0f, dout[i], O[i], pack, 1.0f, dW[i], In);
}

double mt_gemm_gflops(int n, double min_seconds, int bf16) {
    float *a = mt_alloc((size_t)n * n * sizeof(float));
    float *b = mt_alloc((size_t)n * n * sizeof(float));
    float *c = mt_alloc((size_t)n * n * sizeof(float));
    mt_ws ws = {.bf16 = bf16};
    if (bf16) mt_ws_reserve(&ws, mt_gemm_ws_bytes(mt_get_threads()));
    for (size_t i = 0; i < (size_t)n * n; i++) {
        a[i] = mt_u01(mt_hash4(1, 0, i, 0)) - 0.5f;
        b[i] = mt_u01(mt_hash4(2, 0, i, 0)) - 0.5f;
    }
    mt_linear_fwd(ws, c, a, b, n, n, n, 0.0f); /* warm-up */
    double best = 0;
    double t_start = mt_now();
    do {
        double t0 = mt_now();
        mt_linear_fwd(ws, c, a, b, n, n, n, 0.0f);
        double dt = mt_now() - t0;
        double g = 2.0 * n * (double)n * n / dt / 1e9;
        if (g > best) best = g;
    } while (mt_now() - t_start < min_seconds);
    mt_free(a); mt_free(b); mt_free(c);
    mt_ws_free(&ws);
    return best;
}
