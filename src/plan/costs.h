/* plan/costs.h — parameters, FLOPs and activation bytes of every module of a docs/FORMATS.md model
 * (GQA or MLA attention, dense SwiGLU or MoE FFN, multi-token-prediction modules,
 * embedding, head), as pure functions of the config.
 *
 * The model is a list of pipeline "units" in execution order: the embedding, the L
 * decoder layers, the MTP modules, then the final norm + LM head + loss. The planner
 * splits the layers over pipeline stages and sums units. Everything is per token so that
 * the parallel layout enters only as divisions: with Megatron-style sequence parallelism
 * every per-token tensor and every GEMM is split over TP (token-wise or head-wise), and the
 * routed experts are spread over EP with ETP = 1 (each expert whole on one device).
 *
 * The attention's parameters and FLOPs (GQA and MLA) are the trainer's own size functions
 * (model/sizes.h mt_attn_param_counts, mt_attn_core_flops), and the totals agree with
 * mt_model_layout, mt_model_active_params and mt_model_flops_per_token exactly; the bytes a
 * layer keeps per token are those of the trainer's arena (mt_acts_layer_bytes) at elt bytes a
 * value. For the trainer's memory the arena is not modelled per token:
 * mt_cost_trainer_acts_bytes sums the trainer's own size functions by part (model/sizes.h). */
#ifndef MT_PLAN_COSTS_H
#define MT_PLAN_COSTS_H

#include "model/config.h"
#include "model/sizes.h"

enum mt_unit_kind { MT_UNIT_EMBED = 0, MT_UNIT_DENSE, MT_UNIT_MOE, MT_UNIT_MTP, MT_UNIT_HEAD };

/* Recompute policies: enum mt_recompute (model/sizes.h), the trainer's names: keep-all
 * (everything the forward produced), none (the trainer's default: cheap element-wise
 * results and the gathered expert inputs recomputed), selective (also the output projection
 * and the routed and shared experts' gate|up GEMMs, into buffers the layers share), full
 * (only each layer's input kept; the backward re-runs the layer's forward). */

typedef struct {
    int kind;            /* enum mt_unit_kind */
    /* parameters (elements) of the whole unit */
    double p_tp;         /* matrices split over TP (attention, dense/shared FFN, vocab rows) */
    double p_tp_trainer; /* the part of p_tp moetrain's own TP splits (attention, dense FFN); the
                          * rest (vocabulary, shared experts) is whole on every TP rank there */
    double p_rep;        /* replicated on every TP rank (norms, router) */
    double p_expert;     /* routed experts (split over EP, whole on a device) */
    double p_active;     /* matmul parameters a token uses (MFU numerator; embedding excluded) */
    /* forward FLOPs per token; the backward is twice the forward */
    double f_gemm;       /* GEMMs outside the routed experts (incl. router) */
    double f_gemm_tp_rep;/* of which moetrain's TP runs on all the gathered tokens of every TP
                          * rank (MLA's q_a and kv_a: replicated weights); the GPU mode splits
                          * them with the tokens, as a sequence-parallel MLA can */
    double f_att;        /* causal attention core (QK^T and PV) at sequence length T */
    double f_expert;     /* routed experts, all k of them */
    double f_shared;     /* of f_gemm, the shared experts' (the overlapped schedule's pieces) */
    double gemm_width;   /* a typical dense GEMM's FLOPs per row (sizes the efficiency curve) */
    /* forward element-wise memory traffic per token (norms, RoPE, SwiGLU, residuals,
     * permute/unpermute), bytes; dense part and routed part */
    double mem_tok, mem_expert_tok;
    /* bytes per token kept for the backward, per enum mt_recompute; dense / routed part */
    double act_tok[MT_RECOMPUTE_N], act_expert_tok[MT_RECOMPUTE_N];
    /* forward GEMM FLOPs per token re-done by selective: dense part, routed part */
    double f_rc_gemm, f_rc_expert;
    /* bytes per token of the backward's working tensors (not kept between micro-batches):
     * the FFN / MoE block's (dense part, routed part), and the attention block's, which
     * shares that memory (the two blocks never run at once): a layer needs the larger */
    double work_tok, work_expert_tok, work_att_tok;
    double work_rc_tok, work_rc_expert_tok; /* more under selective (its shared buffers) */
    int tp_colls;        /* TP all-gather or reduce-scatter of a [tokens, d] tensor per forward */
    int moe;             /* has a routed-expert block (two all-to-alls per forward) */
} mt_unit_cost;

/* Units of the model in pipeline order: embedding, L layers, num_nextn_predict_layers MTP
 * modules, head. Returns the count (L + MTP + 2); fills u when not NULL. elt = bytes of an
 * activation element (4 for the fp32 trainer, 2 for bf16); router scores, norm statistics
 * and log-sum-exps stay fp32 and indices int32 whatever elt is. T = sequence length. */
int mt_cost_units(const mt_config *c, int T, int elt, mt_unit_cost *u);

/* Totals over the main model (MTP modules excluded, as published figures count them):
 * parameters, active parameters and training FLOPs per token; without MTP modules these are
 * mt_model_layout's nparams, mt_model_active_params and mt_model_flops_per_token. */
double mt_cost_params(const mt_config *c);
/* Parameters with the MTP modules: what moetrain's trainer holds (mt_model_layout's). */
double mt_cost_params_mtp(const mt_config *c);
double mt_cost_active_params(const mt_config *c);
double mt_cost_flops_per_token(const mt_config *c, int T);
/* Model FLOPs per token including the MTP modules (the planner's MFU numerator; the
 * trainer's mt_model_flops_per_token, which runs them). */
double mt_cost_model_flops_per_token(const mt_config *c, int T);

/* The trainer's activation arena of one pipeline chunk (decoder layers [lo, hi), the final
 * norm and head when last): the trainer's size functions of its parts (model/sizes.h)
 * summed over the chunk's units; equal to mt_acts_bytes_chunk. */
double mt_cost_trainer_acts_bytes(const mt_config *c, int lo, int hi, int last, const mt_acts_dims *d);

#endif
