/* kernels/attention.h — fused causal GQA attention for the CPU (FlashAttention-2 style).
 *
 * The sequence is tiled into query blocks and key blocks; the forward keeps a running
 * max and sum per query row (online softmax) and never builds a score row or the T x T
 * matrix. The backward recomputes the
 * probabilities block by block from the forward's log-sum-exp.
 *
 * Dimension letters as in ops.h: B batch, T time, H query heads, G kv heads (H % G == 0,
 * query head h reads kv head h / (H/G)), D head_dim (even). Scores s = q.k / sqrt(D).
 *
 * Masking: a query at row index t sees keys s with t - pos[t] <= s <= t. pos[B*T] is the
 * position of each token inside its document (0 after an end-of-text token: "document
 * mode", packed sequences); pos == NULL means positions 0..T-1 of the row (plain causal).
 * Requires 0 <= pos[t] <= t (position restarts, never exceeds the row index).
 *
 * Determinism: each output element is computed by one thread in a fixed order, so the
 * results are the same bits for any thread count. */
#ifndef MT_KERNELS_ATTENTION_H
#define MT_KERNELS_ATTENTION_H

#include <stddef.h>
#include <stdint.h>

/* 1 when this build has the bf16 attention kernels (compiled for a CPU with AVX512-BF16,
 * e.g. the default -march=native on one): then in the GEMMs' bf16 mode (the bf16 arguments
 * below, as kernels/ws.h's ws.bf16) attention multiplies bf16 pairs too when D % 16 == 0. A portable build (MT_NATIVE=OFF)
 * keeps attention in fp32 in that mode. */
int mt_attention_bf16_built(void);

/* 1 when attention runs on bf16 pairs for head_dim D with the GEMMs in bf16 (gemm_bf16 != 0):
 * in a build that has the kernels, with D % 16 == 0. Then every product reads K and V
 * rounded to bf16, so callers may keep them as bf16 (the _kv16 entry points below): same
 * bits, half the memory. */
int mt_attention_bf16(int gemm_bf16, int D);

/* For tests: 0 makes the bf16 backward compute its diagonal blocks whole instead of skipping
 * the pairs the causal mask zeroes (default 1); the results must be the same bits. */
void mt_attention_set_diag_skip(int on);

/* Scratch floats needed PER THREAD by the forward and the backward: O(T * D) (the
 * backward keeps one head's q and dO rows contiguous). */
size_t mt_attention_scratch_floats(int T, int D);

/* q[B,T,H,D] k,v[B,T,G,D] pos[B*T] or NULL -> out[B,T,H,D] (overwrite), lse[B,H,T]
 * (natural log-sum-exp of each row of scaled, masked scores; overwrite).
 * scratch: nthr * mt_attention_scratch_floats(T, D) floats; at most nthr threads, over
 * (batch, head, group of query blocks). bf16: the GEMMs' precision (bf16 pairs when
 * mt_attention_bf16(bf16, D), else fp32). */
void mt_attention_fwd(float *out, float *lse, const float *q, const float *k, const float *v,
                      const int32_t *pos, int B, int T, int H, int G, int D, float *scratch,
                      int nthr, int bf16);

/* Inverts the line above: dq[B,T,H,D], dk,dv[B,T,G,D] (all overwrite) from dout[B,T,H,D],
 * given the forward's out and lse and the same pos. Threads over (batch, kv head).
 * scratch as for the forward. */
void mt_attention_bwd(float *dq, float *dk, float *dv, const float *dout, const float *q,
                      const float *k, const float *v, const float *out, const float *lse,
                      const int32_t *pos, int B, int T, int H, int G, int D, float *scratch,
                      int nthr, int bf16);

/* The same with K and V kept as bf16 (mt_bf16_store of the fp32 values, after RoPE), in bf16
 * mode: the same bits as the fp32 entry points given those values and bf16 = 1. Only when
 * mt_attention_bf16(1, D) (asserted). */
void mt_attention_fwd_kv16(float *out, float *lse, const float *q, const uint16_t *k, const uint16_t *v,
                           const int32_t *pos, int B, int T, int H, int G, int D, float *scratch,
                           int nthr);
void mt_attention_bwd_kv16(float *dq, float *dk, float *dv, const float *dout, const float *q,
                           const uint16_t *k, const uint16_t *v, const float *out, const float *lse,
                           const int32_t *pos, int B, int T, int H, int G, int D, float *scratch,
                           int nthr);

/* The same with separate widths: q, k [.., Dk] (Dk even; scores q.k / sqrt(Dk)) and v, out
 * [.., Dv] (MLA: q and k carry the RoPE part, v does not). Scratch: nthr *
 * mt_attention_scratch_floats(T, max(Dk, Dv)); bf16 pairs when mt_attention_bf16 holds for
 * both widths. With Dk == Dv the same bits as mt_attention_fwd / _bwd. */
void mt_attention_fwd_dv(float *out, float *lse, const float *q, const float *k, const float *v,
                         const int32_t *pos, int B, int T, int H, int G, int Dk, int Dv, float *scratch,
                         int nthr, int bf16);
void mt_attention_bwd_dv(float *dq, float *dk, float *dv, const float *dout, const float *q,
                         const float *k, const float *v, const float *out, const float *lse,
                         const int32_t *pos, int B, int T, int H, int G, int Dk, int Dv, float *scratch,
                         int nthr, int bf16);

/* Decoding: one query (its Dk values at q) over its P keys, with mt_attention_fwd's arithmetic
 * for that query, so the output is the training forward's bits for the last query of a row
 * holding these keys (from position 0). Keys are stored in blocks of 16 positions, each block
 * transposed: key t's element c at Kb[(t / 16) * ldkb + c * 16 + t % 16], and the last block
 * is read whole (storage for ceil(P / 16) blocks; its positions past P may hold anything,
 * they are never used); value t's row at V + t * ldv. out: Dv floats. scratch:
 * mt_attention_row_scratch_floats(Dk, Dv) floats. */
size_t mt_attention_row_scratch_floats(int Dk, int Dv);
void mt_attention_row(float *out, const float *q, const float *Kb, size_t ldkb, const float *V, size_t ldv, int P,
                      int Dk, int Dv, float *scratch);

#endif
