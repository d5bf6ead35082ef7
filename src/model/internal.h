/* model/internal.h — what the model's own files share (not a public API): the activation
 * arena's structure, the bf16 scratch convention, and the blocks model.c composes. */
#ifndef MT_MODEL_INTERNAL_H
#define MT_MODEL_INTERNAL_H

#include <stdint.h>

#include "kernels/moe.h"
#include "kernels/ws.h"
#include "model/model.h"

enum { MAX_E = 4096 }; /* experts per layer the trainer supports (stack arrays in routing) */

/* The state of the local (size-1) expert exchange of one layer (moe_block.c) */
typedef struct {
    int N, K, C, E;
    int32_t *off, *slot_row, *perm_tok; /* the layer's routing tables */
    float *xe;                    /* the arena's rows: one of the two is set */
    uint16_t *xe16;
    const float *wsel;            /* [N*K] routing weights in slot order */
    float *wrow;                  /* [R] the same in row order (the backward's b->w) */
    int pending;                  /* 1: combine, 2: dispatch_bwd, done at the wait */
    float *dst;
    const float *src;
    int accumulate;
    float *vs;                    /* dispatch_bwd: the values' destination and source */
    const float *v;
    mt_ws ws;                     /* the permute's histograms (the dispatch's kernel workspace) */
    const int32_t *esel;          /* [N*K] the logical experts: set when the combine sums in */
    mt_moe_sum_order order;       /* this layout's order (mt_model.sum_order) */
} mt_local_plan;

/* What the backward of a layer needs from its forward (named, so a memory policy can later
 * keep, recompute or swap each). The normed inputs of attention and FFN are not kept: the
 * backward recomputes them from x / h and the saved 1/rms (cheap, element-wise). */
typedef struct {
    float *x;                     /* [N,C] layer input (residual stream) */
    float *rstd1;                 /* [N] 1/rms of x */
    float *q, *k, *v;             /* [N,H*D], [N,G*D] x2 (after RoPE); k, v NULL with kv16 */
    uint16_t *k16, *v16;          /* kv16: K and V rounded to bf16, all attention reads of them */
    float *att, *lse;             /* [N,H*D], [B,H,T] */
    /* MLA (model/mla.c; k, v are the per-head [N,H*(dn+dr)], [N,H*dv], att [N,H*dv]): */
    float *cq, *rstdq;            /* [N,ql] q_a_proj's output (before its norm), [N] its 1/rms */
    float *ckv, *rstdkv;          /* [N,kvl] c (before kv_a_layernorm), [N] */
    float *h;                     /* [N,C] residual after attention */
    float *rstd2;                 /* [N] */
    float *gu;                    /* dense: [N,2F] gate|up; NULL in bf16 mode, */
    uint16_t *gu16;               /* which keeps it as bf16 here (one of each such pair is set) */
    float *probs;                 /* MoE: [N,E] selection scores p */
    int32_t *sel;                 /* [N,k] */
    float *wsel;                  /* [N,k] final routing weights */
    int32_t *slot_row;            /* [N*k] permuted row of (token, slot) */
    int32_t *perm_tok;            /* [N*k] token of permuted row */
    int32_t *eoff;                /* [E+1] */
    float *egu;                   /* [N*k,2Fm] expert gate|up (permuted order) */
    float *sgu;                   /* [N,2Fs] shared experts gate|up */
    uint16_t *egu16, *sgu16;      /* bf16 mode: the same as bf16 (egu, sgu NULL) */
    float *f;                     /* [B,E] per-sequence routed fraction f_e */
    float *ya, *rstd_ya;          /* sandwich norm: [N,C] attention output before its norm, [N] its 1/rms */
    float *yf, *rstd_yf;          /* sandwich norm: [N,C] FFN output before its norm, [N] */
    mt_ep_batch epb;              /* the dispatch of this layer (its plan: the exchange's) */
    mt_local_plan local;          /* the local exchange's plan (moe_block.c) */
    float *ep_egu;                /* EP: [>= epb.R, 2Fm] expert gate|up (grown, kept) */
    uint16_t *ep_egu16;           /* bf16 mode: the same as bf16 (ep_egu NULL) */
    size_t ep_egu_cap;
} layer_acts;

/* What an MTP block (model/mtp.c) keeps besides its decoder layer's layer_acts (whose x is
 * the block's projected input u and whose output is out). */
typedef struct {
    int32_t *tok;                 /* [N] token whose embedding is the input (-1: past the window, zero) */
    int32_t *tg;                  /* [N] the block's targets */
    float *e;                     /* [N,C] the embeddings of tok */
    float *cat;                   /* [N,2C] rmsnorm(e, enorm) | rmsnorm(h, hnorm): eh_proj's input */
    float *rstd_e, *rstd_h;       /* [N] */
    float *out;                   /* [N,C] the block's output h^k */
    float *rstd_o;                /* [N] 1/rms of out (shared_head.norm) */
    float *dout;                  /* [N,C] gradient of out: its head's, then the next block's */
} mtp_acts;

/* The MoE blocks' scratch outside the arena, grown to the largest need and kept: over EP the
 * routed experts' buffers for the rows one dispatch brings; with a non-contiguous expert
 * placement the selection in slots */
typedef struct {
    float *act, *ye, *dact, *dgu, *dwr;
    uint16_t *act16, *ye16, *dgu16; /* bf16 mode: act16, dgu16 (act, dgu NULL); ye16: ye's bytes */
    int32_t *slot_sel;
    size_t cap[6];
} mt_moe_scratch;

struct mt_acts {
    int B, T, nthr, nlayers, nexperts, policy, count_load;
    int bf16;                     /* the precision the blocks run in (bf16 GEMMs; ws.bf16 the same) */
    int kv16;                     /* K, V kept as bf16 (bf16 attention: the same bits) */
    int lo, hi, first, last;      /* the chunk: decoder layers [lo, hi), embedding, head */
    int nmtp;                     /* MTP blocks held (the last chunk's, after its head): layer_acts
                                   * L[hi - lo + k - 1] and M[k - 1] are block k's (layer Lm + k - 1) */
    int nL, Lm;                   /* layer_acts in L (hi - lo + nmtp); the main stack's layers */
    int mtp_ran;                  /* the last forward ran the MTP blocks (mt_loss.mtp_scale) */
    int tp, sp;                   /* tensor parallel size, sequence parallelism */
    int Nl, g0;                   /* last forward: rows of the residual stream, first token's index */
    const int32_t *fed;           /* last forward: real positions per row (mt_loss), NULL = all */
    const int32_t *replay;        /* last forward: routing replay (mt_loss), NULL = none */
    int replay_stride;
    float *gat, *part, *dgat;     /* TP: [N,C] gathered input, row-parallel partial sums, gathered gradient */
    size_t cap;                   /* capacity B*T */
    layer_acts *L;
    mtp_acts *M;
    float *xf, *lnf, *rstdf;      /* chunk output (final residual), final norm out, rstd */
    float *cos_t, *sin_t;
    int rope_T, rope_D;           /* the tables' shape and base, to rebuild them (mt_acts_park) */
    double rope_theta;
    /* scratch shared by all layers */
    float *ln, *rstd_tmp;         /* normed input of the current block [N,C], [N] */
    uint16_t *ln16;               /* ln's bytes, as bf16 (norm_in writes one or the other) */
    float *hbuf, *gubuf;          /* SELECTIVE: the one h [N,C] and gate|up buffer all layers share */
    float *yabuf;                 /* SELECTIVE with sandwich norm: the one attention output [N,C] */
    float *mqbuf, *mkbuf, *mvbuf; /* SELECTIVE with MLA: the one per-head q, k, v (rebuilt by the backward) */
    float *dsub;                  /* sandwich norm: [N,C] gradient of a sublayer's output (before its norm) */
    uint16_t *gubuf16;            /* bf16 mode: gubuf as bf16 (gubuf NULL) */
    float *dres, *dln, *datt, *dq, *dk, *dv;
    /* MLA's scratch next to datt..dv: kv_b's output / gradient [N,H*(dn+dv)], k_pe [N,dr],
     * normed c and q and their gradients, c's gradient [N,kvl], q_a's [N,ql] */
    float *dkv, *kpe, *cn, *dcn, *dckv, *cqn, *dcqn, *dcq;
    float *big1, *big2, *big3;    /* [max(ffn_rows*F, R*Fm, N*Fs)] x2, [twice that] */
    uint16_t *big1_16, *big3_16;  /* bf16 mode: big1, big3 as bf16 (big1, big3 NULL) */
    int ffn_rows;                 /* rows of the dense FFN per pass over big1-3 (<= B*T) */
    float *xe, *ye, *ds, *dw, *wrow;
    uint16_t *xe16, *ye16;        /* bf16 mode: xe as bf16 (xe NULL); ye16: ye's bytes, as bf16 */
    float *att_scratch, *head_scratch;
    mt_moe_scratch moe;
    mt_ws ws;                     /* the kernels' workspace (kernels/ws.h), outside the arena: grown by
                                   * mt_acts_ws_reserve, between kernels only */
    int64_t *load;
    char *arena;
    size_t arena_bytes;
};

/* Grows a->ws to what the blocks' kernels need for N rows (the larger of what each needs
 * alone: they run one after another) with the threads in use now and the acts' precision. The forward
 * and backward entry points call it first; the routed experts' grouped GEMMs over EP, whose
 * rows depend on the exchange, grow it again before they run (mt_grouped_ws_bytes). */
void mt_acts_ws_reserve(mt_acts *a, const mt_config *c, int N);

/* In bf16 mode (a->bf16) the FFNs keep the activations and gradients that only products read (the
 * gathered expert rows and output gradients, the SwiGLU output, the gate|up gradient) as
 * bf16, in the scratch that holds them as fp32 otherwise: the products round them anyway, so
 * the same bits in half the bytes (docs/DESIGN.md, Mixed precision). The gate|up outputs
 * that the backward keeps (gu, egu, sgu) are bf16 too, rounded as the product writes them,
 * as autocast keeps a product's output: the SwiGLU forward and backward both read the
 * rounded values, in fp32 math. Each such buffer has a pointer pair, as k / k16: acts_layout
 * (or the EP scratch's growth) sets the bf16 one in bf16 mode and the fp32 one otherwise,
 * the other NULL; the kernels take both and use the one that is set. The buffers that hold
 * either within one mode (ln, ye) have both set, to the same bytes. */

/* The layer whose activations are a->L[i] (the chunk's layers, then its MTP blocks). */
static inline int mt_acts_layer_of(const mt_acts *a, int i) {
    return i < a->hi - a->lo ? a->lo + i : a->Lm + (i - (a->hi - a->lo));
}

/* model.c: decoder layer l's forward from L->x into xout (adding its balance loss to st), and
 * its backward: d is the gradient of its output on entry, of its input on return. */
void mt_layer_fwd(const mt_model *m, mt_acts *a, layer_acts *L, int l, float *xout, const int32_t *pos, int B, int T,
                  int train, mt_step_stats *st);
void mt_layer_bwd(const mt_model *m, mt_acts *a, layer_acts *L, int l, float *d, const int32_t *pos, int B, int T,
                  float bal_coef);

/* mtp.c: the MTP blocks of the last chunk after the main head (a->xf is h^0): their forward
 * with heads (and, when train, the heads' backward), and their backward, which adds into
 * a->dres (the gradient of h^0, from the main head already) and m->d_embed. */
void mt_mtp_fwd(const mt_model *m, mt_acts *a, const int32_t *inputs, const int32_t *targets, const int32_t *pos,
                int B, int T, int train, const mt_loss *loss, mt_step_stats *st);
void mt_mtp_bwd(mt_model *m, mt_acts *a, const int32_t *pos, int B, int T, float bal_coef);
/* An MTP block's input (the training forward's and the decoder's drafts): u[N,C] = eh_proj
 * [rmsnorm(e, enorm) | rmsnorm(h, hnorm)], the concatenation left in cat[N,2C] (tmp[N,C]
 * scratch; u may be e, which is read first). */
void mt_mtp_input(mt_ws ws, const mt_layer_w *w, float *u, float *cat, float *tmp, float *rstd_e, float *rstd_h,
                  const float *e, const float *h, int N, int C, float eps);

/* mla.c: the MLA attention sublayer on the normed input (lnf, or ln16: bf16 without TP) of
 * all N tokens of the micro-batch. fwd writes L->att (the heads' outputs, before o_proj); bwd
 * takes a->datt = d(att), accumulates the gradients of the weights before o_proj and writes
 * the input gradient into dl: a->dln, or under TP the rank's part of the sum over TP
 * (a->part, which the caller reduces). */
void mt_mla_fwd(const mt_model *m, mt_acts *a, layer_acts *L, const mt_layer_w *w, const float *lnf,
                const uint16_t *ln16, const int32_t *pos, int B, int T);
void mt_mla_bwd(const mt_model *m, mt_acts *a, layer_acts *L, const mt_layer_w *w, mt_layer_w *dw, const float *lnf,
                const uint16_t *ln16, const int32_t *pos, int B, int T, float *dl);

/* ffn.c: the SwiGLU FFN (dense layers and shared experts) */
void mt_ffn_fwd(mt_acts *a, float *out, const float *res, float *gu, uint16_t *gu16, const float *x,
                const uint16_t *x16, const float *wgu, const float *wd, int N, int C, int F, int rows);
void mt_ffn_bwd(mt_acts *a, float *dx, float *dwgu, float *dwd, const float *dout, const float *x,
                const uint16_t *x16, const float *gu, const uint16_t *gu16, const float *wgu, const float *wd, int N,
                int C, int F, int rows);

/* moe_block.c: the MoE block of layer l on the normed input ln (or ln16) of a->Nl rows:
 * out = res + shared(ln) + sum_j w_j E_j(ln) (res NULL: 0), and its backward (dln overwritten) */
void mt_moe_block_fwd(const mt_model *m, mt_acts *a, layer_acts *L, const mt_layer_w *w, int l, int B, int T,
                      const float *ln, const uint16_t *ln16, const float *res, float *out, int train);
void mt_moe_block_bwd(const mt_model *m, mt_acts *a, layer_acts *L, const mt_layer_w *w, mt_layer_w *dw, int T,
                      const float *ln, const uint16_t *ln16, const float *dout, float *dln, float bal_coef);
/* frees the MoE blocks' scratch outside the arena (mt_acts_free) */
void mt_moe_scratch_free(mt_acts *a);
/* the balance loss of each sequence, summed into *sum_out */
void mt_balance_fwd(const mt_model *m, const mt_acts *a, const layer_acts *L, int B, int T, double *sum_out);

#endif
