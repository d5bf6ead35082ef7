/* kernels/tier_names.h — the public functions of the kernels compiled once per CPU tier
 * (kernels/tier.h). CMakeLists.txt force-includes this file into attention.c, ops.c, moe.c
 * and rows.c with MT_TIER_SUFFIX set (__avx2, __avx512, __avx512bf16): each copy then defines
 * mt_x__avx2 and so on, and calls its own tier's functions; kernels/tier.c defines the
 * public mt_x as a jump to the tier in use, from the same list (MT_TIERED). A public
 * function of those files missing here fails the link (three copies of one name). */
#ifndef MT_KERNELS_TIER_NAMES_H
#define MT_KERNELS_TIER_NAMES_H

#define MT_TIERED(X) \
    X(mt_adamw) \
    X(mt_adamw_multi) \
    X(mt_add) \
    X(mt_attention_bf16) \
    X(mt_attention_bf16_built) \
    X(mt_attention_bwd) \
    X(mt_attention_bwd_dv) \
    X(mt_attention_bwd_kv16) \
    X(mt_attention_fwd) \
    X(mt_attention_fwd_dv) \
    X(mt_attention_fwd_kv16) \
    X(mt_attention_row) \
    X(mt_attention_row_scratch_floats) \
    X(mt_attention_scratch_floats) \
    X(mt_attention_set_diag_skip) \
    X(mt_copy) \
    X(mt_grouped_linear_bwd_data) \
    X(mt_grouped_linear_bwd_data_x) \
    X(mt_grouped_linear_bwd_weight) \
    X(mt_grouped_linear_bwd_weight_x) \
    X(mt_grouped_linear_fwd) \
    X(mt_grouped_linear_fwd_x) \
    X(mt_grouped_ws_bytes) \
    X(mt_head_ce) \
    X(mt_head_packed_bytes) \
    X(mt_head_scratch_floats) \
    X(mt_head_ws_bytes) \
    X(mt_moe_gather) \
    X(mt_moe_gather_x) \
    X(mt_moe_permute) \
    X(mt_moe_permute_bwd) \
    X(mt_moe_permute_ws_bytes) \
    X(mt_moe_unpermute) \
    X(mt_moe_unpermute_ordered) \
    X(mt_rmsnorm_bwd) \
    X(mt_rmsnorm_fwd) \
    X(mt_rmsnorm_fwd16) \
    X(mt_rope_apply) \
    X(mt_rope_apply_ld) \
    X(mt_rope_apply_pos) \
    X(mt_rope_store16) \
    X(mt_rope_table) \
    X(mt_rows_gemm) \
    X(mt_sumsq) \
    X(mt_swiglu_bwd) \
    X(mt_swiglu_fwd) \
    X(mt_swiglu_row_wgrad) \
    X(mt_swiglu_row_wgrad_x) \
    X(mt_swiglu_rows_bwd) \
    X(mt_swiglu_rows_bwd_x) \
    X(mt_swiglu_rows_fwd) \
    X(mt_swiglu_rows_fwd_x) \
    X(mt_zero)

#ifdef MT_TIER_SUFFIX
#define MT_TIER_CAT_(a, b) a##b
#define MT_TIER_CAT(a, b) MT_TIER_CAT_(a, b)
#define mt_adamw MT_TIER_CAT(mt_adamw, MT_TIER_SUFFIX)
#define mt_adamw_multi MT_TIER_CAT(mt_adamw_multi, MT_TIER_SUFFIX)
#define mt_add MT_TIER_CAT(mt_add, MT_TIER_SUFFIX)
#define mt_attention_bf16 MT_TIER_CAT(mt_attention_bf16, MT_TIER_SUFFIX)
#define mt_attention_bf16_built MT_TIER_CAT(mt_attention_bf16_built, MT_TIER_SUFFIX)
#define mt_attention_bwd MT_TIER_CAT(mt_attention_bwd, MT_TIER_SUFFIX)
#define mt_attention_bwd_dv MT_TIER_CAT(mt_attention_bwd_dv, MT_TIER_SUFFIX)
#define mt_attention_bwd_kv16 MT_TIER_CAT(mt_attention_bwd_kv16, MT_TIER_SUFFIX)
#define mt_attention_fwd MT_TIER_CAT(mt_attention_fwd, MT_TIER_SUFFIX)
#define mt_attention_fwd_dv MT_TIER_CAT(mt_attention_fwd_dv, MT_TIER_SUFFIX)
#define mt_attention_fwd_kv16 MT_TIER_CAT(mt_attention_fwd_kv16, MT_TIER_SUFFIX)
#define mt_attention_row MT_TIER_CAT(mt_attention_row, MT_TIER_SUFFIX)
#define mt_attention_row_scratch_floats MT_TIER_CAT(mt_attention_row_scratch_floats, MT_TIER_SUFFIX)
#define mt_attention_scratch_floats MT_TIER_CAT(mt_attention_scratch_floats, MT_TIER_SUFFIX)
#define mt_attention_set_diag_skip MT_TIER_CAT(mt_attention_set_diag_skip, MT_TIER_SUFFIX)
#define mt_copy MT_TIER_CAT(mt_copy, MT_TIER_SUFFIX)
#define mt_grouped_linear_bwd_data MT_TIER_CAT(mt_grouped_linear_bwd_data, MT_TIER_SUFFIX)
#define mt_grouped_linear_bwd_data_x MT_TIER_CAT(mt_grouped_linear_bwd_data_x, MT_TIER_SUFFIX)
#define mt_grouped_linear_bwd_weight MT_TIER_CAT(mt_grouped_linear_bwd_weight, MT_TIER_SUFFIX)
#define mt_grouped_linear_bwd_weight_x MT_TIER_CAT(mt_grouped_linear_bwd_weight_x, MT_TIER_SUFFIX)
#define mt_grouped_linear_fwd MT_TIER_CAT(mt_grouped_linear_fwd, MT_TIER_SUFFIX)
#define mt_grouped_linear_fwd_x MT_TIER_CAT(mt_grouped_linear_fwd_x, MT_TIER_SUFFIX)
#define mt_grouped_ws_bytes MT_TIER_CAT(mt_grouped_ws_bytes, MT_TIER_SUFFIX)
#define mt_head_ce MT_TIER_CAT(mt_head_ce, MT_TIER_SUFFIX)
#define mt_head_packed_bytes MT_TIER_CAT(mt_head_packed_bytes, MT_TIER_SUFFIX)
#define mt_head_scratch_floats MT_TIER_CAT(mt_head_scratch_floats, MT_TIER_SUFFIX)
#define mt_head_ws_bytes MT_TIER_CAT(mt_head_ws_bytes, MT_TIER_SUFFIX)
#define mt_moe_gather MT_TIER_CAT(mt_moe_gather, MT_TIER_SUFFIX)
#define mt_moe_gather_x MT_TIER_CAT(mt_moe_gather_x, MT_TIER_SUFFIX)
#define mt_moe_permute MT_TIER_CAT(mt_moe_permute, MT_TIER_SUFFIX)
#define mt_moe_permute_bwd MT_TIER_CAT(mt_moe_permute_bwd, MT_TIER_SUFFIX)
#define mt_moe_permute_ws_bytes MT_TIER_CAT(mt_moe_permute_ws_bytes, MT_TIER_SUFFIX)
#define mt_moe_unpermute MT_TIER_CAT(mt_moe_unpermute, MT_TIER_SUFFIX)
#define mt_moe_unpermute_ordered MT_TIER_CAT(mt_moe_unpermute_ordered, MT_TIER_SUFFIX)
#define mt_rmsnorm_bwd MT_TIER_CAT(mt_rmsnorm_bwd, MT_TIER_SUFFIX)
#define mt_rmsnorm_fwd MT_TIER_CAT(mt_rmsnorm_fwd, MT_TIER_SUFFIX)
#define mt_rmsnorm_fwd16 MT_TIER_CAT(mt_rmsnorm_fwd16, MT_TIER_SUFFIX)
#define mt_rope_apply MT_TIER_CAT(mt_rope_apply, MT_TIER_SUFFIX)
#define mt_rope_apply_ld MT_TIER_CAT(mt_rope_apply_ld, MT_TIER_SUFFIX)
#define mt_rope_apply_pos MT_TIER_CAT(mt_rope_apply_pos, MT_TIER_SUFFIX)
#define mt_rope_store16 MT_TIER_CAT(mt_rope_store16, MT_TIER_SUFFIX)
#define mt_rope_table MT_TIER_CAT(mt_rope_table, MT_TIER_SUFFIX)
#define mt_rows_gemm MT_TIER_CAT(mt_rows_gemm, MT_TIER_SUFFIX)
#define mt_sumsq MT_TIER_CAT(mt_sumsq, MT_TIER_SUFFIX)
#define mt_swiglu_bwd MT_TIER_CAT(mt_swiglu_bwd, MT_TIER_SUFFIX)
#define mt_swiglu_fwd MT_TIER_CAT(mt_swiglu_fwd, MT_TIER_SUFFIX)
#define mt_swiglu_row_wgrad MT_TIER_CAT(mt_swiglu_row_wgrad, MT_TIER_SUFFIX)
#define mt_swiglu_row_wgrad_x MT_TIER_CAT(mt_swiglu_row_wgrad_x, MT_TIER_SUFFIX)
#define mt_swiglu_rows_bwd MT_TIER_CAT(mt_swiglu_rows_bwd, MT_TIER_SUFFIX)
#define mt_swiglu_rows_bwd_x MT_TIER_CAT(mt_swiglu_rows_bwd_x, MT_TIER_SUFFIX)
#define mt_swiglu_rows_fwd MT_TIER_CAT(mt_swiglu_rows_fwd, MT_TIER_SUFFIX)
#define mt_swiglu_rows_fwd_x MT_TIER_CAT(mt_swiglu_rows_fwd_x, MT_TIER_SUFFIX)
#define mt_zero MT_TIER_CAT(mt_zero, MT_TIER_SUFFIX)
#endif

#endif
