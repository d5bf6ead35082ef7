/* cli/cmd_info.c — `moetrain info`: sizes and FLOPs of a config from the size functions. */
#include <stdio.h>

#include "base/common.h"
#include "cli/args.h"
#include "cli/cli.h"
#include "kernels/blas.h"
#include "model/model.h"

int mt_cmd_info(int argc, char **argv) {
    const char *config = NULL;
    int B = 8, T = 0, threads = 0;
    mt_arg specs[] = {
        {"config", MT_ARG_STR, &config, "model config.json or preset name (required)", NULL},
        {"batch", MT_ARG_INT, &B, "micro-batch for the memory estimate (default 8)", NULL},
        {"seq", MT_ARG_INT, &T, "sequence length (default min(512, max positions))", NULL},
        {"threads", MT_ARG_INT, &threads, "threads the activation scratch is sized for", NULL},
        {NULL, 0, NULL, NULL, NULL}};
    int rc = mt_args_parse("info", "--config FILE [--batch B --seq T]", specs, argc, argv, 2, NULL, 0, NULL);
    if (rc) return rc > 0 ? 0 : mt_cli_fail();
    if (!config) { mt_error("moetrain info: --config is required"); return mt_cli_fail(); }
    if (B < 1) { mt_error("moetrain info: --batch must be at least 1"); return mt_cli_fail(); }
    mt_config c;
    if (mt_config_load(&c, mt_cli_config_path(config)) != 0) return mt_cli_fail();
    if (T <= 0) T = c.max_position_embeddings < 512 ? c.max_position_embeddings : 512;
    if (mt_config_check_seq(&c, T, "moetrain info: --seq") != 0) return mt_cli_fail();
    if (threads > 0) mt_set_threads(threads);
    size_t np;
    mt_model_layout(&c, NULL, &np);
    double active = mt_model_active_params(&c), fpt = mt_model_flops_per_token(&c, T);
    size_t acts = mt_acts_bytes(&c, B, T, mt_get_threads());
    size_t acts_sel = mt_acts_bytes_policy(&c, B, T, mt_get_threads(), MT_RECOMPUTE_SELECTIVE);
    double mib = 1048576.0;
    printf("config              %s\n", config);
    printf("parameters          %zu (%.2fM)\n", np, np / 1e6);
    printf("active per token    %.2fM (matmul weights used per token, embedding excluded)\n", active / 1e6);
    printf("train FLOPs/token   %.3f GFLOP at T=%d (6 x active + causal attention)\n", fpt / 1e9, T);
    printf("memory (B=%d, T=%d):\n", B, T);
    printf("  weights           %8.1f MiB\n", np * 4 / mib);
    printf("  gradients         %8.1f MiB\n", np * 4 / mib);
    printf("  AdamW moments     %8.1f MiB\n", np * 8 / mib);
    printf("  activations       %8.1f MiB (%.1f MiB with --recompute selective)\n", acts / mib, acts_sel / mib);
    printf("  total             %8.1f MiB\n", (np * 16 + acts) / mib);
    return 0;
}
