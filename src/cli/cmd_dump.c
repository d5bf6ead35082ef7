/* cli/cmd_dump.c — `moetrain dump`: logits, losses and gradients of a checkpoint on the first
 * B rows of T+1 tokens of a shard, written as safetensors for the PyTorch oracle test
 * (tests/oracle). Row b = tokens[b*(T+1) .. b*(T+1)+T]. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "base/safetensors.h"
#include "cli/args.h"
#include "cli/cli.h"
#include "data/shard.h"
#include "kernels/blas.h"
#include "train/checkpoint.h"

int mt_cmd_dump(int argc, char **argv) {
    const char *ckpt = NULL, *tokens = NULL, *out = NULL;
    int B = 2, T = 16, allow_nonfinite = 0;
    mt_arg specs[] = {
        {"ckpt", MT_ARG_STR, &ckpt, "checkpoint or run folder (required)", NULL},
        {"tokens", MT_ARG_STR, &tokens, "token shard holding B*(T+1) tokens (required)", NULL},
        {"batch", MT_ARG_INT, &B, "rows (default 2)", NULL},
        {"seq", MT_ARG_INT, &T, "sequence length (default 16)", NULL},
        {"out", MT_ARG_STR, &out, "output .safetensors (required)", NULL},
        {"allow-nonfinite", MT_ARG_BOOL, &allow_nonfinite, "load a checkpoint that holds NaN or Inf values (a warning names them) instead of refusing it", NULL},
        {NULL, 0, NULL, NULL, NULL}};
    int rc = mt_args_parse("dump", "--ckpt DIR --tokens FILE --out FILE [--batch B --seq T]", specs, argc, argv, 2,
                           NULL, 0, NULL);
    if (rc) return rc > 0 ? 0 : mt_cli_fail();
    if (!ckpt || !tokens || !out) { mt_error("moetrain dump: --ckpt, --tokens and --out are required"); return mt_cli_fail(); }
    if (B < 1) { mt_error("moetrain dump: --batch must be at least 1"); return mt_cli_fail(); }
    mt_model m;
    if (mt_ckpt_open_model(ckpt, &m, NULL, 0, allow_nonfinite) != 0) return mt_cli_fail();
    const mt_config *c = &m.cfg;
    if (mt_config_check_seq(c, T, "moetrain dump: --seq") != 0) { mt_model_free(&m); return mt_cli_fail(); }
    uint32_t *tok;
    size_t n;
    if (mt_shard_read(tokens, &tok, &n) != 0) { mt_model_free(&m); return mt_cli_fail(); }
    if (n < (size_t)B * (T + 1)) {
        mt_error("%s: holds %zu tokens, need %d rows of %d", tokens, n, B, T + 1);
        free(tok);
        mt_model_free(&m);
        return mt_cli_fail();
    }
    size_t N = (size_t)B * T;
    int32_t *in = mt_xmalloc(sizeof(int32_t) * N), *tg = mt_xmalloc(sizeof(int32_t) * N);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            uint32_t x = tok[(size_t)b * (T + 1) + t], y = tok[(size_t)b * (T + 1) + t + 1];
            if (x >= (uint32_t)c->vocab_size || y >= (uint32_t)c->vocab_size) { /* before int32: 2^31 and up */
                mt_error("%s: token id %u exceeds vocab_size %d", tokens, x > y ? x : y, c->vocab_size);
                free(tok); free(in); free(tg); mt_model_free(&m);
                return mt_cli_fail();
            }
            in[(size_t)b * T + t] = (int32_t)x;
            tg[(size_t)b * T + t] = (int32_t)y;
        }
    free(tok);
    int64_t nvalid = 0;
    for (size_t i = 0; i < N; i++) nvalid += tg[i] >= 0;
    float *logits = mt_alloc(sizeof(float) * N * c->vocab_size);
    mt_acts *a = mt_acts_new(c, B, T, mt_get_threads(), 0);
    /* the MTP blocks (D of them) with their own normalisers, their logits kept */
    const int D = c->num_nextn_predict_layers;
    float ms[MT_MAX_MTP], mce[MT_MAX_MTP];
    int64_t mnv[MT_MAX_MTP];
    float *mlogits = D ? mt_alloc(sizeof(float) * N * c->vocab_size * (size_t)D) : NULL;
    for (int k = 1; k <= D; k++) mnv[k - 1] = mt_mtp_valid(tg, B, T, k);
    mt_mtp_scales(c, mnv, ms);
    const mt_loss spec = {nvalid ? 1.0f / (float)nvalid : 0.0f, NULL, NULL, NULL, 0, D ? ms : NULL, mlogits};
    mt_step_stats st;
    memset(&st, 0, sizeof st);
    mt_model_zero_grads(&m);
    mt_model_forward(&m, a, in, tg, NULL, B, T, 1, &spec, logits, &st);
    mt_model_backward(&m, a, in, NULL, B, T, 1.0f / (float)B);
    int nmoe = 0;
    for (int l = 0; l < mt_config_layers(c); l++) nmoe += mt_config_is_moe(c, l);
    float ce = nvalid ? (float)(st.ce_sum / (double)nvalid) : 0.0f;
    float *bal = mt_xcalloc((size_t)(nmoe ? nmoe : 1), sizeof(float));
    double loss = ce;
    for (int k = 0; k < D; k++) {
        mce[k] = mnv[k] ? (float)(st.mtp_ce_sum[k] / (double)mnv[k]) : 0.0f;
        loss += c->mtp_loss_weight / D * mce[k];
    }
    /* main MoE layers, then the MTP blocks' */
    for (int l = 0, j = 0; l < mt_config_layers(c); l++)
        if (mt_config_is_moe(c, l)) {
            bal[j] = (float)(st.bal_sum[l] / B);
            loss += c->aux_loss_alpha * bal[j++];
        }
    float lossf = (float)loss;
    const int nfix = D ? 6 : 4, ne = nfix + m.ntensors;
    mt_st_entry *e = mt_xcalloc((size_t)ne, sizeof *e);
    char **names = mt_xcalloc((size_t)ne, sizeof(char *));
    e[0] = (mt_st_entry){"logits", logits, 3, {B, T, c->vocab_size}};
    e[1] = (mt_st_entry){"ce", &ce, 1, {1}};
    e[2] = (mt_st_entry){"balance", bal, 1, {nmoe}};
    e[3] = (mt_st_entry){"loss", &lossf, 1, {1}};
    if (D) {
        e[4] = (mt_st_entry){"mtp_ce", mce, 1, {D}};
        e[5] = (mt_st_entry){"mtp_logits", mlogits, 4, {D, B, T, c->vocab_size}};
    }
    for (int i = 0; i < m.ntensors; i++) {
        const mt_tensor *t = &m.tensors[i];
        size_t len = strlen(t->name) + 6;
        names[i] = mt_xmalloc(len);
        snprintf(names[i], len, "grad.%s", t->name);
        e[nfix + i] = (mt_st_entry){names[i], m.grads + t->offset, t->ndim, {t->shape[0], t->shape[1]}};
    }
    rc = mt_st_write(out, e, ne, NULL, 0);
    if (rc == 0)
        printf("wrote %s: ce %.6f, loss %.6f, %d MoE layers, %d MTP blocks, %d gradients\n", out, ce, loss, nmoe, D,
               m.ntensors);
    for (int i = 0; i < m.ntensors; i++) free(names[i]);
    free(names);
    free(e);
    free(bal);
    mt_free(logits);
    mt_free(mlogits);
    free(in);
    free(tg);
    mt_acts_free(a);
    mt_model_free(&m);
    return rc == 0 ? 0 : mt_cli_fail();
}
