/* model/sizes.c — the attention sublayer's sizes (sizes.h): parameters, FLOPs and KV-cache
 * widths of GQA and MLA, shared by the trainer, the rollout engine and the planner. (The
 * activation arena's sizes by part live in acts.c: they run its carving code dry.) */
#include "model/sizes.h"

#include <math.h>

mt_attn_params mt_attn_param_counts(const mt_config *c) {
    const double C = c->hidden_size, H = c->num_attention_heads;
    mt_attn_params p = {0, 0, 0};
    if (!mt_config_is_mla(c)) {
        const double D = c->head_dim, G = c->num_key_value_heads;
        p.split = C * H * D * 2 + C * G * D * 2; /* q, o; k, v */
        return p;
    }
    /* q = q_b(norm(q_a(x))) (q_proj(x) without q_lora), [c | k_pe] = kv_a(x),
     * [k_nope | v] per head = kv_b(norm(c)), o_proj */
    const double ql = c->q_lora_rank, kvl = c->kv_lora_rank, dn = c->qk_nope_head_dim;
    const double dr = c->qk_rope_head_dim, dv = c->v_head_dim;
    p.split = (ql > 0 ? ql : C) * H * (dn + dr) + kvl * H * (dn + dv) + H * dv * C;
    p.shared = (ql > 0 ? C * ql : 0) + C * (kvl + dr);
    p.norms = (ql > 0 ? ql : 0) + kvl;
    return p;
}

double mt_attn_core_flops(const mt_config *c, int T) {
    const int mla = mt_config_is_mla(c);
    const double qk = mla ? c->qk_nope_head_dim + c->qk_rope_head_dim : c->head_dim;
    const double v = mla ? c->v_head_dim : c->head_dim;
    /* per (head, visible key): 2*qk for the score, 2*v for the value */
    return 2.0 * c->num_attention_heads * (qk + v) * ((double)T + 1) / 2.0;
}

void mt_kv_widths(const mt_config *c, int absorbed, int *kw, int *vw) {
    if (!mt_config_is_mla(c)) {
        *kw = *vw = c->num_key_value_heads * c->head_dim;
        return;
    }
    const int H = c->num_attention_heads;
    /* absorbed: one row of normed c and rotated k_pe per position, shared by all heads */
    *kw = absorbed ? c->kv_lora_rank + c->qk_rope_head_dim : H * (c->qk_nope_head_dim + c->qk_rope_head_dim);
    *vw = absorbed ? 0 : H * c->v_head_dim;
}

double mt_kv_key_positions(const mt_config *c, int absorbed, double positions) {
    return mt_config_is_mla(c) && absorbed ? positions : ceil(positions / 16) * 16;
}

double mt_kv_cache_bytes(const mt_config *c, int absorbed, int layers, double seqs, double positions, int elt) {
    int kw, vw;
    mt_kv_widths(c, absorbed, &kw, &vw);
    return (double)layers * seqs * (mt_kv_key_positions(c, absorbed, positions) * kw + positions * vw) * elt;
}
