/* cli/cmd_info.c — `moetrain info`: sizes and FLOPs of a config from the size functions. */
#include <stdio.h>

#include "base/common.h"
#include "cli/args.h"
#include "cli/cli.h"
#include "kernels/attention.h"
#include "kernels/blas.h"
#include "kernels/ops.h"
#include "model/model.h"

int mt_cmd_info(int argc, char **argv) {
    const char *config = NULL;
    int B = 8, T = 0, threads = 0, bf16 = 0;
    mt_arg specs[] = {
        {"config", MT_ARG_STR, &config, "model config.json or preset name (required)", NULL},
        {"batch", MT_ARG_INT, &B, "micro-batch for the memory estimate (default 8)", NULL},
        {"seq", MT_ARG_INT, &T, "sequence length (default min(512, max positions))", NULL},
        {"threads", MT_ARG_INT, &threads, "threads the activation scratch is sized for", NULL},
        {"bf16", MT_ARG_BOOL, &bf16, "memory of train --bf16 (K and V kept as bf16, the head's packed weight)", NULL},
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
    const int L = c.num_hidden_layers, kv16 = mt_attention_bf16(bf16, c.head_dim);
    size_t acts = mt_acts_bytes_chunk(&c, 0, L, 1, 1, B, T, mt_get_threads(), MT_RECOMPUTE_NONE, 1, 0, kv16);
    size_t acts_sel = mt_acts_bytes_chunk(&c, 0, L, 1, 1, B, T, mt_get_threads(), MT_RECOMPUTE_SELECTIVE, 1, 0, kv16);
    size_t head = mt_head_packed_bytes(B * T, c.hidden_size, c.vocab_size, bf16, 1);
    double mib = 1048576.0;
    printf("config              %s\n", config);
    printf("parameters          %zu (%.2fM)\n", np, np / 1e6);
    printf("active per token    %.2fM (matmul weights used per token, embedding excluded)\n", active / 1e6);
    printf("train FLOPs/token   %.3f GFLOP at T=%d (6 x active + causal attention)\n", fpt / 1e9, T);
    printf("memory (B=%d, T=%d%s):\n", B, T, bf16 ? ", --bf16" : "");
    printf("  weights           %8.1f MiB\n", np * 4 / mib);
    printf("  gradients         %8.1f MiB\n", np * 4 / mib);
    printf("  AdamW moments     %8.1f MiB\n", np * 8 / mib);
    printf("  activations       %8.1f MiB (%.1f MiB with --recompute selective)\n", acts / mib, acts_sel / mib);
    if (bf16) printf("  head packed bf16  %8.1f MiB\n", head / mib);
    printf("  total             %8.1f MiB\n", (np * 16 + acts + head) / mib);
    return 0;
}
