/* model/decode.h — the inference forward with a KV cache: the model half of the rollout
 * engine (rl/rollout.h).
 *
 * A cache holds up to `slots` sequences of up to `tmax` positions; each layer keeps every
 * slot's keys (after RoPE) and values in fp32 (MLA: by default its compressed form, see
 * mt_decoder_new_form). One call feeds any mix of tokens: a prompt
 * being prefilled (several consecutive positions of one slot) and sequences being decoded
 * (one token each), so finished sequences can be replaced while others continue
 * (continuous batching). A token attends to the positions 0..pos of its own slot, which
 * the call writes before reading. The layers are those of the training forward
 * (model/model.c), run on the fed tokens only; no pipeline parallelism. A model whose
 * routed experts are split over an EP group (m->ep) decodes collectively: every rank of the
 * group makes the same calls (each with its own tokens), whose MoE layers exchange rows as
 * in training. A tensor-parallel model (m->tp, without SP) decodes collectively too: every
 * rank of the TP group makes the same calls with the same tokens, caches its own heads'
 * keys and values (absorbed MLA: the shared compressed rows), and the attention output and
 * dense FFN products are summed over the group (Megatron's row-parallel all-reduce). */
#ifndef MT_MODEL_DECODE_H
#define MT_MODEL_DECODE_H

#include <stddef.h>
#include <stdint.h>

#include "model/model.h"

typedef struct mt_decoder mt_decoder;

/* A decoder for m with `slots` sequences of up to tmax positions and up to cap fed tokens
 * per call, whose products run in bf16 (mixed precision, as mt_acts_new's bf16) or fp32 (0);
 * NULL with an error when tmax exceeds max_position_embeddings or the model is split over
 * PP or TP with SP or bf16 cannot run here (mt_gemm_bf16_check) or the memory cannot be had. Decoders
 * and training activations of either precision may share one model. */
mt_decoder *mt_decoder_new(const mt_model *m, int slots, int tmax, int cap, int nthr, int bf16);
/* The same choosing MLA's cache form (ignored for GQA): absorbed (1, mt_decoder_new's) caches
 * per position only the normed c and the rotated k_pe (kv_lora_rank + qk_rope_head_dim
 * floats) and folds kv_b_proj's key part into the query and its value part into the output,
 * as DeepSeek's inference does; unabsorbed (0) caches the per-head k (dn + dr) and v (dv) of
 * the training forward. */
mt_decoder *mt_decoder_new_form(const mt_model *m, int slots, int tmax, int cap, int nthr, int bf16, int absorbed);
/* A decoder (absorbed MLA form) that also drafts tokens with the model's first MTP block
 * (speculative decoding, mt_decoder_draft): its cache holds that block's keys and values
 * too. NULL with an error when the model has no MTP block. */
mt_decoder *mt_decoder_new_draft(const mt_model *m, int slots, int tmax, int cap, int nthr, int bf16);
void mt_decoder_free(mt_decoder *d);
/* Bytes of cached keys and values the attention has read so far (all layers, all calls). */
size_t mt_decoder_kv_read(const mt_decoder *d);
/* Bytes the decoder holds (cache, activations, scratch). */
size_t mt_decoder_bytes(const mt_decoder *d);
int mt_decoder_cap(const mt_decoder *d);

/* Forward of n <= cap tokens: token i is tokens[i] at position pos[i] of cache slot
 * slot[i] (pos[i] < tmax; the tokens of a slot in one call consecutive, in increasing
 * positions; positions before a slot's first fed one must have been fed by earlier
 * calls). logits[j, V] receives the logits of fed token rows[j], j < no. */
void mt_decoder_forward(mt_decoder *d, mt_model *m, const int32_t *tokens, const int32_t *slot, const int32_t *pos,
                        int n, const int32_t *rows, int no, float *logits);
/* After a forward, the MTP block 1 on its fed tokens (a drafting decoder only): token i's
 * input is the main stack's output there and next[i], the token that follows it (< 0: none
 * known, e.g. a rejected draft: the row is skipped), and it writes the block's cache at
 * (slot[i], pos[i]) (the forward's arrays). For the rows[j] (with a next token) the block's
 * logits go to logits[j, V] and its most likely token (lowest id on ties) to draft[j]: the
 * guess of the token after next. */
/* Collective like the forward: under EP a rank with no row left joins the group's exchange
 * with one row of its own, whose results are dropped. */
void mt_decoder_draft(mt_decoder *d, mt_model *m, const int32_t *next, const int32_t *slot, const int32_t *pos,
                      int n, const int32_t *rows, int no, int32_t *draft, float *logits);
/* The experts each fed token of the last call was routed to in MoE layer l (logical ids,
 * [n * num_experts_per_tok], the training forward's order), NULL for a dense layer. */
const int32_t *mt_decoder_routing(const mt_decoder *d, int l);

#endif
