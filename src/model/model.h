/* model/model.h — parameters, activations and the explicit forward/backward of the
 * MODEL.md transformer (GQA attention + dense SwiGLU / MoE layers).
 *
 * One flat float buffer holds every parameter, another every gradient, laid out by
 * mt_model_layout() (a pure size function the planner can call for any config). Tensor
 * names are the safetensors names of MODEL.md, so checkpoints are a walk over the table.
 * Activations of one micro-batch live in one allocation sized by mt_acts_bytes(). */
#ifndef MT_MODEL_MODEL_H
#define MT_MODEL_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "model/config.h"

typedef struct {
    char name[96];
    int ndim;
    int64_t shape[2];
    size_t offset;   /* in floats, into the flat buffer */
    size_t numel;
    int decay;       /* weight decay applies (matrices), 0 for norms */
} mt_tensor;

typedef struct {
    float *in_norm, *wq, *wk, *wv, *wo, *post_norm;
    float *gate, *up, *down;        /* dense SwiGLU: [F,C], [F,C] (adjacent: [2F,C]), [C,F] */
    float *router;                  /* [E,C] */
    float *egate, *eup, *edown;     /* experts: gate_e = egate + e*2*Fm*C [Fm,C], up_e right after
                                     * it (gate|up of an expert is one [2Fm,C] matrix);
                                     * down_e = edown + e*C*Fm [C,Fm] */
    float *sgate, *sup, *sdown;     /* shared experts: [Fs,C], [Fs,C] (adjacent), [C,Fs] (NULL if none) */
} mt_layer_w;

typedef struct {
    mt_config cfg;
    int ntensors;
    mt_tensor *tensors;
    size_t nparams;
    float *params, *grads;
    mt_layer_w *w, *g;              /* [L] views into params / grads */
    float *embed, *norm, *head;     /* head == embed when tied */
    float *d_embed, *d_norm, *d_head;
} mt_model;

/* Size function: fills tensors (if not NULL, capacity from mt_model_layout(cfg, NULL)) in
 * checkpoint order and returns the tensor count; *nparams gets the total floats. */
int mt_model_layout(const mt_config *cfg, mt_tensor *tensors, size_t *nparams);
/* Parameters per token that take part in the forward (matmul weights only: attention,
 * the dense or the selected k + shared experts, router, head; embedding excluded). */
double mt_model_active_params(const mt_config *cfg);
/* Training FLOPs per token (forward + backward = 3x forward) at sequence length T:
 * 6 x active params + causal attention scores and values. */
double mt_model_flops_per_token(const mt_config *cfg, int T);

int mt_model_init(mt_model *m, const mt_config *cfg);
void mt_model_free(mt_model *m);
/* Seeded, layout-independent init: matrices ~ N(0, std^2), norms = 1. */
void mt_model_init_weights(mt_model *m, uint64_t seed, float std);
const mt_tensor *mt_model_find(const mt_model *m, const char *name);
void mt_model_zero_grads(mt_model *m);

/* Activations of one micro-batch of up to B x T tokens, plus backward scratch. */
typedef struct mt_acts mt_acts;
size_t mt_acts_bytes(const mt_config *cfg, int B, int T, int nthr);
mt_acts *mt_acts_new(const mt_config *cfg, int B, int T, int nthr);
/* Memory policy: what the backward recomputes instead of keeping.
 * SELECTIVE: the residual after attention (one GEMM: x + att Wo^T) and the gate|up outputs
 * of the routed and shared experts (one GEMM each); every layer then shares one buffer for
 * each of them. Bit-identical results, ~12% more FLOPs on an MoE layer, and the activations
 * that grow with the number of layers shrink by about a third. */
enum mt_recompute { MT_RECOMPUTE_NONE = 0, MT_RECOMPUTE_SELECTIVE = 1 };
/* "none" / "selective" -> the policy, or -1 with an error naming the value. */
int mt_recompute_parse(const char *name);
size_t mt_acts_bytes_policy(const mt_config *cfg, int B, int T, int nthr, int policy);
mt_acts *mt_acts_new_policy(const mt_config *cfg, int B, int T, int nthr, int policy);
void mt_acts_free(mt_acts *a);

typedef struct {
    double ce_sum;           /* sum of CE over valid targets of the micro-batch */
    int64_t n_valid;         /* valid targets */
    double bal_sum[256];     /* per layer: sum over the micro-batch's sequences of balance_loss */
} mt_step_stats;

/* Forward of a micro-batch (B rows of T tokens, T <= the acts' T, B*T <= capacity), and,
 * when train != 0, the backward, accumulating into m->grads the gradient of
 *   ce_scale * CE_sum + aux_loss_alpha * bal_scale * sum_l sum_seq balance_l
 * (ce_scale = 1/valid targets of the global batch, bal_scale = 1/sequences of the global
 * batch). logits (optional, [B*T, V]) receives the logits. */
void mt_model_step(mt_model *m, mt_acts *a, const int32_t *inputs, const int32_t *targets,
                   int B, int T, int train, float ce_scale, float bal_scale, float *logits,
                   mt_step_stats *st);
/* The same with document mode (MODEL.md): pos[B*T] is each token's position inside its
 * document (mt_doc_positions); attention and RoPE restart at every document. pos == NULL
 * is the normal mode (a row is one sequence). */
void mt_model_step_pos(mt_model *m, mt_acts *a, const int32_t *inputs, const int32_t *targets,
                       const int32_t *pos, int B, int T, int train, float ce_scale, float bal_scale,
                       float *logits, mt_step_stats *st);
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
