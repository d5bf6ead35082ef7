/* cli/cmd_bench.c — `moetrain bench`: GEMM GFLOP/s of this machine (the MFU denominator)
 * and the training throughput of a config on synthetic tokens. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "cli/args.h"
#include "cli/cli.h"
#include "kernels/blas.h"
#include "kernels/ops.h"
#include "model/model.h"

int mt_cmd_bench(int argc, char **argv) {
    const char *config = NULL;
    int B = 8, T = 512, steps = 5, threads = 0;
    mt_arg specs[] = {
        {"config", MT_ARG_STR, &config, "also time training steps of this config (preset or file)", NULL},
        {"batch", MT_ARG_INT, &B, "micro-batch (default 8)", NULL},
        {"seq", MT_ARG_INT, &T, "sequence length (default 512)", NULL},
        {"steps", MT_ARG_INT, &steps, "timed steps after one warm-up step (default 5)", NULL},
        {"threads", MT_ARG_INT, &threads, "threads (default all cores)", NULL},
        {NULL, 0, NULL, NULL, NULL}};
    int rc = mt_args_parse("bench", "[--config NAME --batch B --seq T --steps N]", specs, argc, argv, 2, NULL, 0, NULL);
    if (rc) return rc > 0 ? 0 : mt_cli_fail();
    if (threads > 0) mt_set_threads(threads);
    printf("BLAS kernel %s, %d threads\n", mt_blas_corename(), mt_get_threads());
    double peak = 0;
    for (int n = 512; n <= 2048; n *= 2) {
        double g = mt_gemm_gflops(n, 0.5);
        if (g > peak) peak = g;
        printf("sgemm %4d^3        %7.1f GFLOP/s\n", n, g);
    }
    printf("peak (MFU denominator) %.1f GFLOP/s\n", peak);
    if (!config) return 0;
    mt_config c;
    if (mt_config_load(&c, mt_cli_config_path(config)) != 0) return mt_cli_fail();
    if (mt_config_check_seq(&c, T, "moetrain bench: --seq") != 0) return mt_cli_fail();
    mt_model m;
    if (mt_model_init(&m, &c) != 0) return mt_cli_fail();
    mt_model_init_weights(&m, 1, sqrtf(1.0f / (2.0f * c.hidden_size * c.num_hidden_layers)));
    float *am = mt_alloc(m.nparams * sizeof(float)), *av = mt_alloc(m.nparams * sizeof(float));
    mt_acts *a = mt_acts_new(&c, B, T, mt_get_threads());
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
    printf("train %s B=%d T=%d: %.0f tok/s, MFU %.1f%%, activations %.1f MiB, peak RSS %.1f MiB\n", config, B, T, tps,
           100 * mfu, mt_acts_bytes(&c, B, T, mt_get_threads()) / 1048576.0, mt_peak_rss() / 1048576.0);
    free(in);
    free(tg);
    mt_acts_free(a);
    mt_free(am);
    mt_free(av);
    mt_model_free(&m);
    return 0;
}
