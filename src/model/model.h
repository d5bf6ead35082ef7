/* model/model.h — parameters, activations and the explicit forward/backward of the
 * docs/FORMATS.md transformer (GQA or MLA attention + dense SwiGLU / MoE layers).
 *
 * One flat float buffer holds every parameter, another every gradient, laid out by
 * mt_model_layout() (a pure size function the planner can call for any config). Tensor
 * names are the safetensors names of docs/FORMATS.md, so checkpoints are a walk over the table.
 * Activations of one micro-batch live in one allocation sized by mt_acts_bytes(). */
#ifndef MT_MODEL_MODEL_H
#define MT_MODEL_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "model/config.h"
#include "model/sizes.h"

/* What a tensor is (bind() finds the pointers by role, not by position). */
enum mt_role {
    MT_R_EMBED = 0, MT_R_IN_NORM, MT_R_WQ, MT_R_WK, MT_R_WV, MT_R_WO, MT_R_POST_NORM,
    MT_R_GATE, MT_R_UP, MT_R_DOWN, MT_R_ROUTER, MT_R_EGATE, MT_R_EUP, MT_R_EDOWN,
    MT_R_SGATE, MT_R_SUP, MT_R_SDOWN, MT_R_NORM, MT_R_HEAD,
    MT_R_PRE_MLP_NORM, MT_R_POST_MLP_NORM, /* sandwich norm (config sandwich_norm) */
    /* MLA (MT_R_WQ is q_b_proj, or q_proj without query compression) */
    MT_R_WQA, MT_R_QA_NORM, MT_R_WKVA, MT_R_KVA_NORM, MT_R_WKVB,
    /* a multi-token-prediction block (layer L + k - 1): the norms of its two inputs, their
     * projection, the norm before the shared head */
    MT_R_ENORM, MT_R_HNORM, MT_R_EH_PROJ, MT_R_MTP_NORM
};

/* MTP blocks the trainer supports (num_nextn_predict_layers; DeepSeek-V3 and Pangu use 1) */
enum { MT_MAX_MTP = 4 };

typedef struct {
    char name[96];
    int ndim;
    int64_t shape[2];
    size_t offset;   /* in floats, into the flat buffer */
    size_t numel;
    int decay;       /* weight decay applies (matrices), 0 for norms */
    int role;        /* enum mt_role */
    int layer;       /* decoder layer, -1 for embedding / final norm / head */
    int expert;      /* routed expert index (global), -1 otherwise */
    int full_index;  /* index of this tensor in the whole model's table (checkpoint order) */
    int replica;     /* 1: a copy of a tensor another pipeline stage owns (tied embedding
                      * on the last stage); its gradient is summed with the owner's */
    int tp_dim;      /* tensor parallelism: -1 whole; 0: rows [tp_off, tp_off+shape[0]) of
                      * tp_full rows; 1: columns [tp_off, tp_off+shape[1]) of tp_full */
    int64_t tp_off, tp_full;
} mt_tensor;

/* Which part of the model a rank holds (pipeline, tensor and expert parallelism; "shard"
 * in moetrain means a token file, "range" a ZeRO slice). Tensor names stay the global
 * docs/FORMATS.md names; a part is a subset of the whole model's tensors. The routed
 * experts in slots [ep_rank*E/ep_size, (ep_rank+1)*E/ep_size) of every held MoE layer are
 * kept; with ep_size > 1 they are placed after every other tensor. With tp_size > 1 the
 * attention projections (q/k/v rows and o columns, by heads) and the dense FFN (gate/up
 * rows, down columns) hold the rank's slice (Megatron's column / row parallel linears) and
 * come first. The flat buffer is [TP slices | replicated | routed experts], each part
 * reduced over its own group. */
typedef struct {
    int ep_rank, ep_size;
    const int32_t *slot_of;     /* [L*E] expert placement (mt_expert_map), NULL = contiguous;
                                 * the model keeps its own copy */
    unsigned char layer[256];   /* 1 = decoder layer held here */
    int embed, head;            /* holds the token embedding / the final norm and head */
    int tp_rank, tp_size;       /* tensor parallelism: heads and dense FFN columns split */
    int sp;                     /* sequence parallelism: the residual stream split by tokens */
} mt_part;
/* The whole model (one process). */
void mt_part_whole(mt_part *s, const mt_config *c);

/* Expert placement: physical slot s of MoE layer l holds logical expert expert_of[l*E + s],
 * and slot s lives on EP rank s / (E / ep_size). Routing, load counts and checkpoints name
 * logical experts; the parameter buffer (experts in slot order) and the exchange name slots,
 * so moving an expert is a change of this map plus a move of its weights and moments.
 * Contiguous (the identity) by default. */
typedef struct {
    int L, E;
    int32_t *slot_of;           /* [L*E] logical expert -> slot */
    int32_t *expert_of;         /* [L*E] slot -> logical expert */
} mt_expert_map;
/* "contiguous" or "shuffled:SEED" (every layer's experts placed by a seeded permutation: the
 * results are those of the contiguous placement, up to the order of the combine's sums over
 * EP ranks); -1 with an error naming the value. */
int mt_expert_map_parse(mt_expert_map *m, const mt_config *c, const char *spec);
/* the identity */
void mt_expert_map_contiguous(mt_expert_map *m, const mt_config *c);
void mt_expert_map_free(mt_expert_map *m);

typedef struct {
    float *in_norm, *wq, *wk, *wv, *wo, *post_norm;
    float *gate, *up, *down;        /* dense SwiGLU: [F,C], [F,C] (adjacent: [2F,C]), [C,F] */
    float *router;                  /* [E,C] */
    float *egate, *eup, *edown;     /* experts: gate_e = egate + e*2*Fm*C [Fm,C], up_e right after
                                     * it (gate|up of an expert is one [2Fm,C] matrix);
                                     * down_e = edown + e*C*Fm [C,Fm] */
    float *sgate, *sup, *sdown;     /* shared experts: [Fs,C], [Fs,C] (adjacent), [C,Fs] (NULL if none) */
    /* sandwich norm: the FFN's input norm and its output's norm (NULL without); post_norm
     * is then the attention output's norm */
    float *pre_mlp_norm, *post_mlp_norm;
    /* MLA (wk, wv NULL; wq is q_b_proj [H*(dn+dr), ql], or q_proj [H*(dn+dr), C] when ql = 0):
     * q_a_proj [ql, C] and its norm (NULL when ql = 0), kv_a_proj_with_mqa [kvl+dr, C] (rows
     * [0, kvl) make c, the last dr k_pe), kv_a_layernorm [kvl], kv_b_proj [H*(dn+dv), kvl] */
    float *wqa, *qa_norm, *wkva, *kva_norm, *wkvb;
    /* MTP block: enorm, hnorm [C], eh_proj [C, 2C] (columns [0,C) take the normed embedding,
     * [C,2C) the normed hidden state), shared_head.norm [C] (NULL in main-stack layers) */
    float *enorm, *hnorm, *eh_proj, *mtp_norm;
} mt_layer_w;

/* Tensor-parallel collectives over the TP group, supplied by parallel/. With sp the residual
 * stream of a micro-batch is split into tp_size contiguous blocks of tokens; gather
 * assembles the whole [N, C] from the local [N/tp, C] blocks (all-gather) and reduce sums
 * the partial [N, C] of a row-parallel linear into this rank's block (reduce-scatter).
 * Without sp, gather is the identity (never called) and reduce is an all-reduce. */
typedef struct mt_tp_ops {
    void *ctx;
    int rank, size, sp;
    void (*gather)(void *ctx, float *full, const float *local, size_t local_n);
    void (*reduce)(void *ctx, float *out, float *full, size_t full_n);
    void (*sum_f32)(void *ctx, float *x, size_t n);
    void (*sum_f64)(void *ctx, double *x, size_t n);
} mt_tp_ops;

/* The expert exchange of a MoE layer: the (token, expert) rows go to the ranks that own the
 * experts (dispatch), the expert outputs come back weighted (combine), and the backward
 * runs both ways again. Experts are addressed by physical slot: slot s lives on rank
 * s / (E / size) (the model maps logical experts to slots, mt_expert_map). The local case
 * (no expert parallelism) is an exchange of size 1 (model/moe_block.c); parallel/ep.c supplies
 * the MPI one. The model does not know MPI.
 *
 * Split-phase: every operation begins a transfer; test() progresses the pending one and
 * returns 1 once it is complete; wait() completes it. One transfer is pending per batch at a
 * time, and what an operation writes is defined only after its wait: the caller computes
 * something else in between (the overlap seam). An operation that accumulates into a caller
 * buffer (combine, dispatch_bwd) does so at the wait, so the caller may write that buffer
 * until then. A batch is one dispatch; errors inside an exchange end the job (they are broken
 * invariants: every rank routed with the same model). */
typedef struct {
    int R;                 /* rows received (after the dispatch's wait) */
    const int32_t *off;    /* [local experts + 1] rows of local expert le: off[le]..off[le+1] */
    const float *xe;       /* [R, C] the token rows, fp32, or */
    const uint16_t *xe16;  /* [R, C] as bf16 (an exchange with bf16_rows, in bf16 mode); one is set */
    const float *w;        /* [R] routing weight of each row (after the gather's wait: the backward's) */
    void *plan;            /* the exchange's own state */
} mt_ep_batch;

typedef struct mt_ep_ops {
    void *ctx;
    int rank, size;        /* in the expert-parallel group */
    int bf16_rows;         /* moves rows as bf16 when given them (x16, xr16): the local exchange */
    const int *node_of;    /* [size] the node of each rank, in the combine's summation order
                            * (parallel/a2a.h); NULL: one node */
    /* x[N,C] (or x16), sel[N*K] physical slots, w[N*K] -> b's rows */
    void (*dispatch)(void *ctx, mt_ep_batch *b, const float *x, const uint16_t *x16, const int32_t *sel,
                     const float *w, int N, int K, int C, int E);
    /* at the wait: out[N,C] += per token sum_j w_j y_j, y[R,C] in the batch's layout */
    void (*combine)(void *ctx, mt_ep_batch *b, float *out, const float *y);
    /* xr[R,C] (or xr16) = x[token of row r], unweighted (x is [N,C] on the source ranks) */
    void (*gather)(void *ctx, mt_ep_batch *b, float *xr, uint16_t *xr16, const float *x);
    /* b->xe again from x / x16 along the same routing, for an exchange that does not keep the
     * dispatched rows until the backward (the local one: its rows live in shared scratch) */
    void (*redispatch)(void *ctx, mt_ep_batch *b, const float *x, const uint16_t *x16);
    /* at the wait: dx[N,C] (+= when accumulate) per token the sum over its rows of dxe[R,C],
     * and vs[N*K] (slot order of the source tokens) = v[R] of the rows: one exchange */
    void (*dispatch_bwd)(void *ctx, mt_ep_batch *b, float *dx, const float *dxe, int accumulate, float *vs,
                         const float *v);
    int (*test)(void *ctx, mt_ep_batch *b);
    void (*wait)(void *ctx, mt_ep_batch *b);
    void (*release)(void *ctx, mt_ep_batch *b);
    /* x[n] summed over the EP group (all-reduce; the balance loss's ep-group scope); called
     * by every rank of the group at the same point, with no transfer pending */
    void (*sum_f64)(void *ctx, double *x, size_t n);
} mt_ep_ops;

/* The balance loss's scope (train --aux-scope). SEQUENCE (the default, docs/FORMATS.md): per
 * sequence, averaged over the global batch's sequences. EP_GROUP (Pangu Ultra MoE): f_e and
 * P_e over every token of a micro-batch on the ranks of the expert-parallel group (one
 * process: the micro-batch's tokens; with --sp a rank holds 1/TP of them), so its value
 * depends on the layout; the group's value stands for each of its sequences in the mean.
 * Not with a per-row fed length (RL). */
enum mt_aux_scope { MT_AUX_SEQUENCE = 0, MT_AUX_EP_GROUP = 1 };

/* The order an expert-parallel layout's combine sums a token's weighted expert rows in
 * (parallel/a2a.h): by EP rank, then node. A model whose experts are all local sums in it
 * when ranks > 0 (mt_model_sum_like), so that its forward has that layout's bits. */
typedef struct {
    int ranks;                      /* 0: none */
    int32_t *owner;                 /* [L*E] the EP rank of each logical expert of each layer */
    int *node_of;                   /* [ranks] */
} mt_sum_order;

typedef struct {
    mt_config cfg;
    mt_part part;
    const mt_ep_ops *ep;            /* NULL: every expert is local */
    const mt_tp_ops *tp;            /* NULL: no tensor parallelism */
    int aux_scope;                  /* enum mt_aux_scope, MT_AUX_SEQUENCE after init */
    int32_t *slot_of;               /* [L*E] the expert placement (mt_expert_map); NULL: contiguous */
    mt_sum_order sum_order;         /* experts all local: the combine's summation order (ranks 0: slot order) */
    size_t n_tp;                    /* floats of the TP-sliced part (0 without TP) */
    size_t n_dense;                 /* floats before the expert part (== nparams without EP) */
    int ntensors;
    mt_tensor *tensors;
    size_t nparams;
    float *params, *grads;
    mt_layer_w *w, *g;              /* [L] views into params / grads */
    float *embed, *norm, *head;     /* head == embed when tied */
    float *d_embed, *d_norm, *d_head;
    /* called by mt_model_backward after each layer's backward (MTP blocks included) while set:
     * the trainer sets it on a chunk's last backward of a step, so that the layer's gradient
     * buckets go out while the layers below compute (train/optimizer.h) */
    void (*grad_ready)(void *ctx, int layer);
    /* called by mt_model_forward before it reads layer l's weights (at its start for its
     * first layer, which covers the embedding; INT_MAX before the head) while set: ZeRO-1's
     * parameter all-gather may still be in flight (train/optimizer.h) */
    void (*params_ready)(void *ctx, int layer);
    void *hook_ctx;
} mt_model;

/* Size function: fills tensors (if not NULL, capacity from mt_model_layout(cfg, NULL)) in
 * checkpoint order and returns the tensor count; *nparams gets the total floats. */
int mt_model_layout(const mt_config *cfg, mt_tensor *tensors, size_t *nparams);
/* Parameters per token that take part in the forward (matmul weights only: attention,
 * the dense or the selected k + shared experts, router, head; embedding excluded), the MTP
 * blocks included (each also runs eh_proj and the head). */
double mt_model_active_params(const mt_config *cfg);
/* Training FLOPs per token (forward + backward = 3x forward) at sequence length T:
 * 6 x active params + causal attention scores and values. */
double mt_model_flops_per_token(const mt_config *cfg, int T);

/* The trainer's limits (layers, experts, MTP blocks, a parameter count that does not
 * overflow): 0, or -1 with an error naming `what` (the config file) and the key.
 * mt_model_init checks them too; call it before sizing anything per layer. */
int mt_model_check(const mt_config *cfg, const char *what);
int mt_model_init(mt_model *m, const mt_config *cfg);
/* The whole model with parameters only (grads NULL): forward and decode, no backward
 * (RL's rollout copy when training splits the model). */
int mt_model_init_infer(mt_model *m, const mt_config *cfg);
/* slot[L*E] = m's expert placement (mt_expert_map's slot_of; the identity when contiguous) */
void mt_model_slots(const mt_model *m, int32_t *slot);
/* Sets m's expert placement to slot_of[L*E] (mt_expert_map's) and lays its tensor table
 * and views out for it; the caller has moved the experts' values (train/balance.h). */
void mt_model_set_placement(mt_model *m, const int32_t *slot_of);
/* The order src's expert exchange sums in (src->ep set; its placement and nodes). */
void mt_sum_order_init(mt_sum_order *o, const mt_model *src);
void mt_sum_order_free(mt_sum_order *o);
/* m, whose experts are all local, sums each token's expert rows as src's exchange does, so
 * that m's forward has src's bits: RL's rollout copy and its trainer in different layouts.
 * m->sum_order may also be set directly (the model frees it). */
void mt_model_sum_like(mt_model *m, const mt_model *src);
/* The same for the part sh (ep and tp as for mt_model_init_part). */
int mt_model_init_infer_part(mt_model *m, const mt_config *cfg, const mt_part *sh, const mt_ep_ops *ep,
                             const mt_tp_ops *tp);
/* The part of the model described by sh (tensor table, offsets and pointers for it only);
 * ep may be NULL when sh->ep_size == 1. */
int mt_model_init_part(mt_model *m, const mt_config *cfg, const mt_part *sh, const mt_ep_ops *ep,
                        const mt_tp_ops *tp);
/* Tensor table of a part (like mt_model_layout; NULL sh = whole model). */
int mt_model_layout_part(const mt_config *cfg, const mt_part *sh, mt_tensor *tensors, size_t *nparams,
                          size_t *n_tp, size_t *n_dense);
void mt_model_free(mt_model *m);
/* Seeded, layout-independent init (keyed by full_index): matrices ~ N(0, std^2), norms = 1,
 * but with sandwich_norm the gains of the norms on the sublayer outputs, which start at
 * c / sqrt(L): post_attention_layernorm MT_DSSN_C_ATTN / sqrt(L), post_mlp_layernorm
 * MT_DSSN_C_MLP / sqrt(L) (the depth-scaled sandwich norm, Pangu Ultra's constants;
 * docs/DESIGN.md). */
#define MT_DSSN_C_ATTN 0.283
#define MT_DSSN_C_MLP 0.432
void mt_model_init_weights(mt_model *m, uint64_t seed, float std);
/* The same with the token embedding ~ N(0, embed_std^2) (TinyInit: train --init-scheme tiny);
 * the draws are those of mt_model_init_weights, scaled. */
void mt_model_init_weights_embed(mt_model *m, uint64_t seed, float std, float embed_std);
#define MT_TINYINIT_EMBED_STD 0.5
const mt_tensor *mt_model_find(const mt_model *m, const char *name);
void mt_model_zero_grads(mt_model *m);
/* Points the model at another parameter buffer of the same layout (nparams floats, e.g. a
 * frozen reference copy) and returns the one it used: the views follow. */
float *mt_model_use_params(mt_model *m, float *params);

/* Activations of one micro-batch of up to B x T tokens, plus backward scratch, and the
 * execution context of the steps run with them: the kernels' workspace and the precision,
 * bf16 (mixed precision: GEMM operands rounded to bf16, fp32 sums; needs
 * mt_gemm_bf16_check(1) == 0) or fp32 (0), fixed at creation. Acts of either precision may
 * be used side by side on the same model. In bf16 mode K and V are kept as bf16 when
 * mt_attention_bf16(1, head_dim): the sizes below and the arena follow bf16. */
typedef struct mt_acts mt_acts;
size_t mt_acts_bytes(const mt_config *cfg, int B, int T, int nthr, int bf16);
mt_acts *mt_acts_new(const mt_config *cfg, int B, int T, int nthr, int bf16);
/* policy: MT_RECOMPUTE_NONE or MT_RECOMPUTE_SELECTIVE (model/sizes.h, with the arena's size
 * by part) */
size_t mt_acts_bytes_policy(const mt_config *cfg, int B, int T, int nthr, int policy, int bf16);
mt_acts *mt_acts_new_policy(const mt_config *cfg, int B, int T, int nthr, int policy, int bf16);
/* The precision a was created with (1: bf16). */
int mt_acts_bf16(const mt_acts *a);
/* Activations of one pipeline chunk: decoder layers [lo, hi), with the embedding when
 * first and the final norm, head and loss when last. kv16: K and V as bf16 (give
 * mt_attention_bf16(bf16, head_dim); mt_acts_new_chunk derives it from its bf16). */
size_t mt_acts_bytes_chunk(const mt_config *cfg, int lo, int hi, int first, int last, int B, int T, int nthr,
                           int policy, int tp, int sp, int kv16);
/* A dense FFN wider than the MoE blocks' [rows, F] scratch runs over row chunks of at
 * least this many rows (fewer only when the micro-batch has fewer): the GEMMs stay long. */
enum { MT_FFN_MIN_ROWS = 512 };
mt_acts *mt_acts_new_chunk(const mt_config *cfg, int lo, int hi, int first, int last, int B, int T, int nthr,
                           int policy, int tp, int sp, int bf16);
/* Gives the arena's and the workspace's pages back to the system between steps (RL's
 * rollout runs meanwhile); they are found again, zeroed, at the next touch. */
void mt_acts_park(mt_acts *a);
/* fp32: the forwards' A B^T products on the few-row kernel (kernels/rows.h), as the decoder
 * runs them, so a forward's logits are the decoder's bits; the backward keeps OpenBLAS. */
void mt_acts_fwd_rows(mt_acts *a, int on);
/* Bytes of the arena a was given (what mt_acts_bytes_chunk said for it at creation). */
size_t mt_acts_arena_bytes(const mt_acts *a);
/* Rows of the residual stream a chunk holds for a micro-batch of n tokens (n / tp with sp). */
int mt_acts_rows(const mt_acts *a, int n);
/* [B*T, C] buffers of a chunk: where a non-first chunk's input is received, its output,
 * and the gradient buffer (before mt_model_backward: the gradient of the output, received
 * by a non-last chunk; after it: the gradient of the input, to send to the previous stage). */
float *mt_acts_input(mt_acts *a);
float *mt_acts_output(mt_acts *a);
float *mt_acts_grad(mt_acts *a);
void mt_acts_free(mt_acts *a);

/* The head's loss for a micro-batch: cross-entropy, its gradient scaled by ce_scale (the
 * default), or a per-token objective (RL, kernels/ops.h; row b, position t of the
 * micro-batch is token obj->base + b*T + t); fed[b] (NULL: all T) is how many leading
 * positions of row b are real: the balance loss counts only those (padding after a short
 * row carries neither loss). */
typedef struct {
    float ce_scale;
    const struct mt_head_obj *obj;
    const int32_t *fed;
    /* routing replay (RL): per token (b*T + t) replay_stride ints, each MoE layer's K expert
     * ids in layer order; the forward routes to them instead of its own top-k (a negative
     * first id: its own). NULL: none */
    const int32_t *replay;
    int replay_stride;
    /* multi-token prediction: block k's CE gradient scale (mtp_loss_weight / D / its valid
     * targets in the global batch) at [k-1]; NULL: the MTP blocks do not run (evaluation,
     * RL objectives). mtp_logits (optional, [D][B*T, V]) receives their logits. */
    const float *mtp_scale;
    float *mtp_logits;
} mt_loss;
/* The part of a step's loss (its objective's tokens, fed rows and replay numbered over
 * micro-batches of B x T) that micro-batch mb sees; the objective's copy goes to *obj. */
mt_loss mt_loss_micro(const mt_loss *l, int mb, int B, int T, struct mt_head_obj *obj);

typedef struct {
    double ce_sum;           /* sum of CE over valid targets of the micro-batch */
    int64_t n_valid;         /* valid targets */
    double bal_sum[256];     /* per layer: sum over the micro-batch's sequences of balance_loss */
    double mtp_ce_sum[MT_MAX_MTP];   /* MTP block k at [k-1]: CE sum over its valid targets */
    int64_t mtp_n_valid[MT_MAX_MTP];
} mt_step_stats;

/* Valid targets of MTP block k (1..D) in rows of T targets: its target at position i is
 * targets[i + k] (none for i >= T - k). */
int64_t mt_mtp_valid(const int32_t *targets, int rows, int T, int k);
/* The MTP blocks' CE gradient scales (mt_loss.mtp_scale) from their valid targets in the
 * global batch: mtp_loss_weight / D / nvalid[k] (0 without any). */
void mt_mtp_scales(const mt_config *c, const int64_t *nvalid, float *scale);

/* Forward of a micro-batch (B rows of T tokens, T <= the acts' T, B*T <= capacity), and,
 * when train != 0, the backward, accumulating into m->grads the gradient of
 *   ce_scale * CE_sum + aux_loss_alpha * bal_scale * sum_l sum_seq balance_l
 * (ce_scale = 1/valid targets of the global batch, bal_scale = 1/sequences of the global
 * batch). logits (optional, [B*T, V]) receives the logits. With MTP blocks (acts of a last
 * chunk) they run too, each CE_k scaled by mtp_loss_weight / D / its valid targets in this
 * batch (st->mtp_*). */
void mt_model_step(mt_model *m, mt_acts *a, const int32_t *inputs, const int32_t *targets,
                   int B, int T, int train, float ce_scale, float bal_scale, float *logits,
                   mt_step_stats *st);
/* The same with document mode (docs/FORMATS.md): pos[B*T] is each token's position inside its
 * document (mt_doc_positions); attention and RoPE restart at every document. pos == NULL
 * is the normal mode (a row is one sequence). */
void mt_model_step_pos(mt_model *m, mt_acts *a, const int32_t *inputs, const int32_t *targets,
                       const int32_t *pos, int B, int T, int train, float ce_scale, float bal_scale,
                       float *logits, mt_step_stats *st);
/* The two halves of mt_model_step_pos for one chunk (pipeline parallelism). forward adds
 * into *st (the caller zeroes it); a first chunk embeds `inputs`, others read
 * mt_acts_input(a); a last chunk computes the head and CE (and, when train, the head's
 * backward). backward accumulates the weight gradients of the chunk; a non-last chunk
 * starts from mt_acts_grad(a), which it overwrites with the gradient of its input. */
void mt_model_forward(mt_model *m, mt_acts *a, const int32_t *inputs, const int32_t *targets,
                      const int32_t *pos, int B, int T, int train, const mt_loss *loss, float *logits,
                      mt_step_stats *st);
void mt_model_backward(mt_model *m, mt_acts *a, const int32_t *inputs, const int32_t *pos, int B, int T,
                       float bal_scale);
/* Document-mode positions: position 0 at the start of a row and after every `eot` token
 * (the end-of-text token itself ends the previous document). */
void mt_doc_positions(const int32_t *inputs, int B, int T, int32_t eot, int32_t *pos);

/* Expert load counters accumulated by mt_model_step: tokens routed to expert e of layer l
 * (layer-major [L*E]); mt_acts_reset_load() clears them. */
const int64_t *mt_acts_load(const mt_acts *a);
void mt_acts_reset_load(mt_acts *a);

/* A hash of every routing decision (selected experts) of the last mt_model_step: tests use
 * it to tell a smooth change of the loss from a routing flip. */
uint64_t mt_acts_routing_hash(const mt_acts *a, const mt_config *cfg);

/* Routing of one token (exposed for tests): p[E] selection scores -> sel[k] (descending by
 * p, ties to the lower index) per the config's topk_method. */
void mt_route_select(const mt_config *c, const float *p, int *sel);

#endif
