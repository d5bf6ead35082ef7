/* model/sizes.h — the recompute policies and the activation arena's size by part: the sizes
 * the trainer allocates (model/acts.c lays the arena out with the same code) and the planner
 * sums for the trainer's memory (plan/costs.h), so the two cannot drift apart. */
#ifndef MT_MODEL_SIZES_H
#define MT_MODEL_SIZES_H

#include <stddef.h>

#include "model/config.h"

/* Memory policy: what the backward recomputes instead of keeping. The trainer runs NONE and
 * SELECTIVE; the planner also models KEEP_ALL and FULL for other (GPU) trainers.
 *  NONE (`none`, the trainer's default): the cheap element-wise results (SwiGLU products)
 *    and the gathered expert inputs are recomputed; everything else is kept.
 *  SELECTIVE (`selective`): also the residual after attention (one GEMM: x + att Wo^T),
 *    the gate|up outputs of the routed and shared experts (one GEMM each) and MLA's per-head
 *    q, k, v (its up-projections, from the kept q latent and c); every layer then shares one
 *    buffer for each of them. Bit-identical results, ~12% more FLOPs on an MoE
 *    layer, and the activations that grow with the number of layers shrink by about a third.
 *  KEEP_ALL (`keep-all`, planner only): everything the forward produced.
 *  FULL (`full`, planner only): only each layer's input; the backward re-runs the layer's
 *    forward. */
enum mt_recompute {
    MT_RECOMPUTE_NONE = 0, MT_RECOMPUTE_SELECTIVE = 1, MT_RECOMPUTE_KEEP_ALL, MT_RECOMPUTE_FULL, MT_RECOMPUTE_N
};
/* The CLI name of a policy ("none", "selective", "keep-all", "full"). */
const char *mt_recompute_name(int policy);
/* A policy by CLI name, any of the four; -1 (no message) if none matches. */
int mt_recompute_lookup(const char *name);
/* 1 if moetrain's trainer runs the policy (NONE, SELECTIVE). */
int mt_recompute_trainer(int policy);
/* The trainer's `--recompute`: "none" / "selective" -> the policy, or -1 with an error that
 * names the value (a planner-only policy is refused as such). */
int mt_recompute_parse(const char *name);

/* The shape of one chunk's arena: a micro-batch of B x T tokens, nthr threads, a trainer
 * policy, TP degree (sp: sequence parallel, only with tp > 1), K and V as bf16 (kv16). */
typedef struct {
    int B, T, nthr, policy, tp, sp, kv16;
} mt_acts_dims;

/* The arena of a chunk holding decoder layers [lo, hi) (with the final norm and head when
 * last) is exactly mt_acts_base_bytes + sum of mt_acts_layer_bytes over its layers +
 * mt_acts_scratch_bytes (= mt_acts_bytes_chunk). */
/* What decoder layer l keeps for its backward. */
size_t mt_acts_layer_bytes(const mt_config *cfg, int l, const mt_acts_dims *d);
/* What a chunk holds whatever its layers: the residual stream and its gradients, the norms'
 * buffers, the RoPE tables, the TP gather buffers, SELECTIVE's shared buffers and the
 * per-thread attention scratch. */
size_t mt_acts_base_bytes(const mt_config *cfg, int last, const mt_acts_dims *d);
/* The backward's scratch: one region that the attention backward's gradients, the FFN / MoE
 * blocks' buffers (sized by the chunk's layers) and, when last, the head's logits share. */
size_t mt_acts_scratch_bytes(const mt_config *cfg, int lo, int hi, int last, const mt_acts_dims *d);

/* The attention sublayer of one decoder layer (GQA or MLA): one definition of its sizes, which
 * the trainer's counts (mt_model_active_params, mt_model_flops_per_token), the rollout
 * engine's KV cache (model/decode.c) and the planner (plan/costs.c) all call, so that they
 * cannot drift apart (model/sizes.c; mt_model_layout's tensor shapes are held to them by
 * tests/test_plan.c). */
typedef struct {
    /* projection weights TP splits by heads: GQA q, k, v, o; MLA q_b_proj (q_proj without
     * q_lora_rank), kv_b_proj, o_proj */
    double split;
    /* projection weights every head reads, whole on each TP rank: MLA q_a_proj and
     * kv_a_proj_with_mqa (0 for GQA) */
    double shared;
    /* the latent norms' gains, whole on each TP rank: MLA q_a_layernorm, kv_a_layernorm */
    double norms;
} mt_attn_params;
mt_attn_params mt_attn_param_counts(const mt_config *cfg);
/* Forward FLOPs per token of the score and value products (QK^T over the q/k width, PV over
 * the v width, 2 FLOPs a multiply-add) at sequence length T, causal: a token sees (T+1)/2
 * keys on average. The projections' forward FLOPs per token are 2 x (split + shared). */
double mt_attn_core_flops(const mt_config *cfg, int T);
/* Floats one position of one layer puts in the KV cache, as keys (*kw) and values (*vw):
 * GQA the Hkv heads' k and v (hd each); MLA absorbed (kv_b folded into the query and the
 * output) the normed c and the rotated k_pe (kv_lora_rank + qk_rope_head_dim) as keys and no
 * values, unabsorbed the per-head k (dn + dr) and v (dv) of the training forward. absorbed is
 * ignored for GQA. */
void mt_kv_widths(const mt_config *cfg, int absorbed, int *kw, int *vw);
/* Key positions the cache holds for `positions`: rounded up to 16, the blocks in which the
 * decoder keeps keys transposed for its attention (kernels/attention.h, mt_attention_row),
 * except absorbed MLA's latent rows, kept as rows. */
double mt_kv_key_positions(const mt_config *cfg, int absorbed, double positions);
/* Bytes of the KV cache of `layers` layers for `seqs` sequences of `positions` positions,
 * elt bytes a value (the rollout engine: 4) and every head's k and v (or the latent) held. */
double mt_kv_cache_bytes(const mt_config *cfg, int absorbed, int layers, double seqs, double positions, int elt);

#endif
