/* tests/test_precision.c — two precisions in one process: the precision is a property of
 * the objects that run a model (mt_acts, mt_decoder: kernels/ws.h's ws.bf16), not of the
 * process. One model with fp32 and bf16 training activations and fp32 and bf16 decoders:
 * each computed alone first (fp32 before any bf16 object exists, as a pure fp32 process
 * would), then the four interleaved, call after call; every result (loss, logits, weight
 * gradients) must be the same bits as alone, and bf16 must differ from fp32 (it ran). On
 * a CPU without AVX512-BF16 (kernels/tier.h) the bf16 half is skipped (77) after checking
 * that bf16 objects are refused. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "kernels/attention.h"
#include "kernels/blas.h"
#include "kernels/gemm_bf16.h"
#include "kernels/tier.h"
#include "model/decode.h"
#include "model/model.h"

static int failures = 0;
#define CHECK(c, ...) do { if (!(c)) { printf("FAIL %s:%d: ", __FILE__, __LINE__); printf(__VA_ARGS__); printf("\n"); failures++; } } while (0)

enum { B = 2, T = 24 };

static void config(mt_config *c) {
    mt_config_defaults(c);
    c->vocab_size = 53;
    c->hidden_size = 64;
    c->num_hidden_layers = 3;
    c->num_attention_heads = 4;
    c->num_key_value_heads = 2;
    c->head_dim = 16; /* a multiple of 16: bf16 attention (K, V kept as bf16) where built */
    c->intermediate_size = 96;
    c->max_position_embeddings = 64;
    c->first_k_dense_replace = 1;
    c->n_routed_experts = 8;
    c->num_experts_per_tok = 2;
    c->n_shared_experts = 1;
    c->moe_intermediate_size = 32;
    c->aux_loss_alpha = 0.01;
}

/* what one computation produced */
typedef struct {
    double loss;
    float *logits, *grads; /* grads NULL for a decoder */
} result;

static int32_t in[B * T], tg[B * T];

/* a training step (forward and backward) with activations a */
static void train_step(mt_model *m, mt_acts *a, result *r) {
    const size_t NV = (size_t)B * T * m->cfg.vocab_size;
    if (!r->logits) r->logits = mt_alloc(sizeof(float) * NV);
    if (!r->grads) r->grads = mt_alloc(sizeof(float) * m->nparams);
    mt_step_stats st;
    mt_model_zero_grads(m);
    mt_model_step(m, a, in, tg, B, T, 1, 1.0f / (B * T), 1.0f / B, r->logits, &st);
    r->loss = st.ce_sum;
    memcpy(r->grads, m->grads, sizeof(float) * m->nparams);
}

/* the decoder's forward of row 0 as one prompt in slot 0, logits of every position */
static void decode(mt_model *m, mt_decoder *d, result *r) {
    if (!r->logits) r->logits = mt_alloc(sizeof(float) * (size_t)T * m->cfg.vocab_size);
    int32_t slot[T], pos[T], rows[T];
    for (int t = 0; t < T; t++) slot[t] = 0, pos[t] = t, rows[t] = t;
    mt_decoder_forward(d, m, in, slot, pos, T, rows, T, r->logits);
    r->loss = 0;
}

static int same(const result *x, const result *y, const mt_model *m, size_t nlogits) {
    return x->loss == y->loss && memcmp(x->logits, y->logits, sizeof(float) * nlogits) == 0 &&
           (!x->grads || memcmp(x->grads, y->grads, sizeof(float) * m->nparams) == 0);
}

static void result_free(result *r) {
    mt_free(r->logits);
    mt_free(r->grads);
}

int main(int argc, char **argv) {
    mt_blas_init(argc, argv); /* the OpenBLAS kernel the product runs (moetrain sets it at start-up) */
    mt_config c;
    config(&c);
    mt_model m;
    MT_ASSERT(mt_model_init(&m, &c) == 0);
    mt_model_init_weights(&m, 5, 0.2f);
    for (int i = 0; i < B * T; i++) {
        in[i] = (int32_t)(mt_hash4(61, (uint64_t)i, 0, 0) % (uint64_t)c.vocab_size);
        tg[i] = (int32_t)(mt_hash4(62, (uint64_t)i, 0, 0) % (uint64_t)c.vocab_size);
    }
    const int nthr = mt_get_threads();
    const size_t NT = (size_t)B * T * c.vocab_size, ND = (size_t)T * c.vocab_size;

    /* fp32 alone: no bf16 object exists yet */
    mt_acts *a32 = mt_acts_new(&c, B, T, nthr, 0);
    mt_decoder *d32 = mt_decoder_new(&m, 1, T, T, nthr, 0);
    MT_ASSERT(d32 && !mt_acts_bf16(a32));
    result t32 = {0}, k32 = {0};
    train_step(&m, a32, &t32);
    decode(&m, d32, &k32);

    if (!mt_bf16_supported()) {
        CHECK(mt_gemm_bf16_check(1) != 0 && mt_decoder_new(&m, 1, T, T, nthr, 1) == NULL,
              "bf16 accepted on a CPU without AVX512-BF16");
        printf("no AVX512-BF16 at this kernel tier (%s): the bf16 half is skipped\n", mt_cpu_tier_name(mt_cpu_tier()));
        mt_acts_free(a32);
        mt_decoder_free(d32);
        result_free(&t32), result_free(&k32);
        mt_model_free(&m);
        if (failures) return 1;
        return 77;
    }

    /* bf16 alone */
    mt_acts *a16 = mt_acts_new(&c, B, T, nthr, 1);
    mt_decoder *d16 = mt_decoder_new(&m, 1, T, T, nthr, 1);
    MT_ASSERT(d16 && mt_acts_bf16(a16));
    result t16 = {0}, k16 = {0};
    train_step(&m, a16, &t16);
    decode(&m, d16, &k16);
    CHECK(!same(&t16, &t32, &m, NT), "the bf16 training step gave the fp32 bits: it did not run in bf16");
    CHECK(memcmp(k16.logits, k32.logits, sizeof(float) * ND) != 0, "the bf16 decoder gave the fp32 bits");
    printf("%-34s loss fp32 %.9f, bf16 %.9f (bf16 attention: %s)\n", "alone", t32.loss, t16.loss,
           mt_attention_bf16(1, c.head_dim) ? "yes" : "no");

    /* interleaved, in both orders: every call the same bits as alone */
    result x = {0}, y = {0};
    for (int round = 0; round < 3; round++) {
        const int first16 = round & 1;
        train_step(&m, first16 ? a16 : a32, &x);
        decode(&m, first16 ? d32 : d16, &y);
        CHECK(same(&x, first16 ? &t16 : &t32, &m, NT), "round %d: the %s step differs from alone", round,
              first16 ? "bf16" : "fp32");
        CHECK(memcmp(y.logits, (first16 ? &k32 : &k16)->logits, sizeof(float) * ND) == 0,
              "round %d: the %s decoder differs from alone", round, first16 ? "fp32" : "bf16");
        train_step(&m, first16 ? a32 : a16, &x);
        decode(&m, first16 ? d16 : d32, &y);
        CHECK(same(&x, first16 ? &t32 : &t16, &m, NT), "round %d: the %s step differs from alone", round,
              first16 ? "fp32" : "bf16");
        CHECK(memcmp(y.logits, (first16 ? &k16 : &k32)->logits, sizeof(float) * ND) == 0,
              "round %d: the %s decoder differs from alone", round, first16 ? "bf16" : "fp32");
    }
    printf("%-34s %s\n", "interleaved fp32 / bf16 (3 rounds)", failures ? "DIFFER" : "the same bits as alone");

    /* an fp32 rollout copy next to the model trained in bf16 (RL): its own weights, the same values */
    mt_model r;
    MT_ASSERT(mt_model_init_infer(&r, &c) == 0 && r.nparams == m.nparams);
    memcpy(r.params, m.params, sizeof(float) * m.nparams);
    mt_decoder *dr = mt_decoder_new(&r, 1, T, T, nthr, 0);
    MT_ASSERT(dr);
    train_step(&m, a16, &x);
    decode(&r, dr, &y);
    CHECK(same(&x, &t16, &m, NT) && memcmp(y.logits, k32.logits, sizeof(float) * ND) == 0,
          "an fp32 copy next to bf16 training differs from each alone");
    mt_decoder_free(dr);
    mt_model_free(&r);

    result_free(&x), result_free(&y), result_free(&t16), result_free(&k16), result_free(&t32), result_free(&k32);
    mt_acts_free(a32), mt_acts_free(a16);
    mt_decoder_free(d32), mt_decoder_free(d16);
    mt_model_free(&m);
    if (failures) {
        printf("%d failure(s)\n", failures);
        return 1;
    }
    printf("OK\n");
    return 0;
}
