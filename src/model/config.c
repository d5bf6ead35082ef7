/* model/config.c — config.json parsing, validation and writing (see config.h and the
 * "config.json" section of docs/FORMATS.md).
 *
 * The text must be strict JSON (base/json.h: RFC 8259 numbers, no NUL byte, no trailing
 * text, every key once). Parsing is strict about types (integers may be written 8 or 8.0,
 * never 8.5; booleans are JSON booleans; strings are strings) and about keys that would change the
 * architecture in ways docs/FORMATS.md does not cover (rope_scaling, moe_layer_freq, biases,
 * hidden_act, quantization_config, ...): those are errors rather than silently wrong models.
 * Other unknown keys are ignored. Every message is one line "<file>: key <name>: <problem>".
 * Range and consistency rules live in mt_config_validate only, so a config built in code
 * and one read from disk are checked by the same lines. */
#include "model/config.h"

#include "base/common.h"
#include "base/json.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <stddef.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

void mt_config_defaults(mt_config *c) {
    memset(c, 0, sizeof *c);
    /* first_k_dense_replace defaults to L, which is unknown here: the parser sets it once
     * num_hidden_layers is read. Code that fills a config by hand must set it. */
    c->scoring_func = MT_SCORING_SOFTMAX;
    c->norm_topk_prob = 1;
    c->routed_scaling_factor = 1.0;
    c->n_group = 1;
    c->topk_group = 1;
    c->topk_method = MT_TOPK_GREEDY;
    c->aux_loss_alpha = 0.0;
    c->rope_theta = 10000.0;
    c->rms_norm_eps = 1e-6;
    c->tie_word_embeddings = 0;
    c->mtp_loss_weight = 0.3;
    snprintf(c->attention_type, sizeof c->attention_type, "%s", "gqa");
    snprintf(c->model_type, sizeof c->model_type, "%s", "moetrain");
}

/* ---- parsing helpers ---- */

/* The value as compact JSON for messages, shortened to fit `cap`. */
static void show_value(const cJSON *v, char *buf, size_t cap) {
    char *s = cJSON_PrintUnformatted(v);
    if (!s) { snprintf(buf, cap, "?"); return; }
    if (strlen(s) + 1 > cap && cap > 4) snprintf(buf, cap, "%.*s...", (int)(cap - 4), s);
    else snprintf(buf, cap, "%s", s);
    cJSON_free(s);
}

/* The item of `key`, or NULL when absent or JSON null (both mean "use the default"). */
static const cJSON *get(const cJSON *root, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    return cJSON_IsNull(v) ? NULL : v;
}

static int missing(const char *what, const char *key) {
    return mt_error("%s: key %s: required key is missing", what, key);
}

/* Integer key (8 or 8.0). Leaves *out unchanged when absent; error when required. */
static int read_int(const cJSON *root, const char *what, const char *key, int required, int *out) {
    const cJSON *v = get(root, key);
    if (!v) return required ? missing(what, key) : 0;
    char s[64];
    if (!cJSON_IsNumber(v)) {
        show_value(v, s, sizeof s);
        return mt_error("%s: key %s: expected an integer, got %s", what, key, s);
    }
    double d = v->valuedouble;
    if (!isfinite(d) || floor(d) != d) {
        show_value(v, s, sizeof s);
        return mt_error("%s: key %s: expected an integer, got %s", what, key, s);
    }
    if (d < (double)INT_MIN || d > (double)INT_MAX) {
        show_value(v, s, sizeof s);
        return mt_error("%s: key %s: integer %s is out of range", what, key, s);
    }
    *out = (int)d;
    return 0;
}

static int read_double(const cJSON *root, const char *what, const char *key, double *out) {
    const cJSON *v = get(root, key);
    if (!v) return 0;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) {
        char s[64];
        show_value(v, s, sizeof s);
        return mt_error("%s: key %s: expected a number, got %s", what, key, s);
    }
    *out = v->valuedouble;
    return 0;
}

static int read_bool(const cJSON *root, const char *what, const char *key, int *out) {
    const cJSON *v = get(root, key);
    if (!v) return 0;
    if (!cJSON_IsBool(v)) {
        char s[64];
        show_value(v, s, sizeof s);
        return mt_error("%s: key %s: expected a boolean (true or false), got %s", what, key, s);
    }
    *out = cJSON_IsTrue(v) ? 1 : 0;
    return 0;
}

/* String key; *found tells whether it was present. */
static int read_string(const cJSON *root, const char *what, const char *key, char *buf,
                       size_t cap, int *found) {
    const cJSON *v = get(root, key);
    if (found) *found = v != NULL;
    if (!v) return 0;
    if (!cJSON_IsString(v)) {
        char s[64];
        show_value(v, s, sizeof s);
        return mt_error("%s: key %s: expected a string, got %s", what, key, s);
    }
    if (strlen(v->valuestring) >= cap)
        return mt_error("%s: key %s: string longer than %zu characters", what, key, cap - 1);
    snprintf(buf, cap, "%s", v->valuestring);
    return 0;
}

/* Keys that change the architecture beyond docs/FORMATS.md: accepted only at their neutral value. */
static int check_unsupported(const cJSON *root, const char *what) {
    const cJSON *v = get(root, "rope_scaling");
    if (v) {
        char s[64];
        show_value(v, s, sizeof s);
        return mt_error("%s: key rope_scaling: RoPE scaling is not supported (must be null or "
                        "absent), got %s", what, s);
    }
    v = get(root, "moe_layer_freq");
    if (v && !(cJSON_IsNumber(v) && v->valuedouble == 1.0)) {
        char s[64];
        show_value(v, s, sizeof s);
        return mt_error("%s: key moe_layer_freq: only 1 (every layer from first_k_dense_replace "
                        "on is MoE) is supported, got %s", what, s);
    }
    static const char *const bias_keys[] = {"attention_bias", "mlp_bias"};
    for (size_t i = 0; i < sizeof bias_keys / sizeof bias_keys[0]; i++) {
        int b = 0;
        if (read_bool(root, what, bias_keys[i], &b) != 0) return -1;
        if (b)
            return mt_error("%s: key %s: linear-layer biases are not supported (must be false)",
                            what, bias_keys[i]);
    }
    v = get(root, "rope_parameters");
    if (v && !cJSON_IsNull(v)) {
        const cJSON *t = cJSON_IsObject(v) ? cJSON_GetObjectItemCaseSensitive(v, "rope_type") : NULL;
        if (!cJSON_IsObject(v) || (t && !(cJSON_IsString(t) && strcmp(t->valuestring, "default") == 0))) {
            char s[64];
            show_value(t ? t : v, s, sizeof s);
            return mt_error("%s: key rope_parameters: only the default RoPE (rope_type \"default\" or absent) is "
                            "supported, got %s", what, s);
        }
    }
    char act[32];
    int found = 0;
    if (read_string(root, what, "hidden_act", act, sizeof act, &found) != 0) return -1;
    if (found && strcmp(act, "silu") != 0)
        return mt_error("%s: key hidden_act: activation \"%s\" is not supported (only \"silu\")",
                        what, act);
    /* DeepSeek-V3's published config.json describes FP8 block-quantized weights */
    v = get(root, "quantization_config");
    if (v) {
        const cJSON *qm = cJSON_IsObject(v) ? cJSON_GetObjectItemCaseSensitive(v, "quant_method") : NULL;
        char s[64];
        show_value(qm ? qm : v, s, sizeof s);
        return mt_error("%s: key quantization_config: quantized weights (quant_method %s) are not supported: "
                        "moetrain reads F32 and BF16 tensors (dequantize to BF16 and drop the key)", what, s);
    }
    /* false is DeepSeek's batch-wise balance loss; section 1.4's is per sequence */
    v = get(root, "seq_aux");
    if (v && !cJSON_IsTrue(v)) {
        char s[64];
        show_value(v, s, sizeof s);
        return mt_error("%s: key seq_aux: only the sequence-wise balance loss (true) is supported, got %s", what, s);
    }
    v = get(root, "attention_dropout");
    if (v && !(cJSON_IsNumber(v) && v->valuedouble == 0.0)) {
        char s[64];
        show_value(v, s, sizeof s);
        return mt_error("%s: key attention_dropout: dropout is not supported (must be 0), got %s", what, s);
    }
    return 0;
}

static int parse_object(mt_config *c, const cJSON *root, const char *what) {
    if (check_unsupported(root, what) != 0) return -1;

    int have_type = 0;
    if (read_string(root, what, "attention_type", c->attention_type, sizeof c->attention_type,
                    &have_type) != 0)
        return -1;
    /* DeepSeek-V2/V3 configs have no such key: their MLA keys say it */
    if (!have_type && get(root, "kv_lora_rank"))
        snprintf(c->attention_type, sizeof c->attention_type, "%s", "mla");
    int mla = strcmp(c->attention_type, "mla") == 0;
    if (!mla && strcmp(c->attention_type, "gqa") != 0)
        return mt_error("%s: key attention_type: \"%s\" is not supported (\"gqa\" or \"mla\")",
                        what, c->attention_type);

    static const struct { const char *key; size_t off; } req[] = {
        {"vocab_size", offsetof(mt_config, vocab_size)},
        {"hidden_size", offsetof(mt_config, hidden_size)},
        {"num_hidden_layers", offsetof(mt_config, num_hidden_layers)},
        {"num_attention_heads", offsetof(mt_config, num_attention_heads)},
        {"num_key_value_heads", offsetof(mt_config, num_key_value_heads)},
        {"head_dim", offsetof(mt_config, head_dim)},
        {"intermediate_size", offsetof(mt_config, intermediate_size)},
        {"max_position_embeddings", offsetof(mt_config, max_position_embeddings)},
    };
    for (size_t i = 0; i < sizeof req / sizeof req[0]; i++) {
        int *dst = (int *)((char *)c + req[i].off);
        /* MLA configs (DeepSeek-V3) omit head_dim (HF then uses qk_rope_head_dim) and may
         * omit num_key_value_heads (meaningless for MLA; default H). */
        int optional = mla && (dst == &c->head_dim || dst == &c->num_key_value_heads);
        if (read_int(root, what, req[i].key, !optional, dst) != 0) return -1;
    }

    static const struct { const char *key; size_t off; } opt[] = {
        {"first_k_dense_replace", offsetof(mt_config, first_k_dense_replace)},
        {"n_routed_experts", offsetof(mt_config, n_routed_experts)},
        {"num_experts_per_tok", offsetof(mt_config, num_experts_per_tok)},
        {"n_shared_experts", offsetof(mt_config, n_shared_experts)},
        {"moe_intermediate_size", offsetof(mt_config, moe_intermediate_size)},
        {"n_group", offsetof(mt_config, n_group)},
        {"topk_group", offsetof(mt_config, topk_group)},
        {"num_nextn_predict_layers", offsetof(mt_config, num_nextn_predict_layers)},
    };
    c->first_k_dense_replace = c->num_hidden_layers;
    for (size_t i = 0; i < sizeof opt / sizeof opt[0]; i++)
        if (read_int(root, what, opt[i].key, 0, (int *)((char *)c + opt[i].off)) != 0) return -1;
    /* 0 means "absent" in the struct; written explicitly it is a bad size. */
    if (get(root, "moe_intermediate_size") && c->moe_intermediate_size <= 0)
        return mt_error("%s: key moe_intermediate_size: must be positive (got %d)", what,
                        c->moe_intermediate_size);

    if (mla) {
        static const struct { const char *key; size_t off; } mk[] = {
            {"q_lora_rank", offsetof(mt_config, q_lora_rank)},
            {"kv_lora_rank", offsetof(mt_config, kv_lora_rank)},
            {"qk_nope_head_dim", offsetof(mt_config, qk_nope_head_dim)},
            {"qk_rope_head_dim", offsetof(mt_config, qk_rope_head_dim)},
            {"v_head_dim", offsetof(mt_config, v_head_dim)},
        };
        for (size_t i = 0; i < sizeof mk / sizeof mk[0]; i++) {
            int *dst = (int *)((char *)c + mk[i].off);
            /* q_lora_rank: null means no query compression (DeepSeek-V2-Lite). */
            if (dst == &c->q_lora_rank) {
                if (!cJSON_GetObjectItemCaseSensitive(root, mk[i].key)) return missing(what, mk[i].key);
                if (read_int(root, what, mk[i].key, 0, dst) != 0) return -1;
                if (get(root, mk[i].key) && *dst <= 0)
                    return mt_error("%s: key q_lora_rank: must be positive, or null for no "
                                    "query compression (got %d)", what, *dst);
            } else if (read_int(root, what, mk[i].key, 1, dst) != 0) {
                return -1;
            }
        }
        if (!get(root, "head_dim")) c->head_dim = c->qk_rope_head_dim;
        if (!get(root, "num_key_value_heads")) c->num_key_value_heads = c->num_attention_heads;
    }

    char s[32] = "softmax";
    if (read_string(root, what, "scoring_func", s, sizeof s, NULL) != 0) return -1;
    if (strcmp(s, "softmax") == 0) c->scoring_func = MT_SCORING_SOFTMAX;
    else if (strcmp(s, "sigmoid") == 0) c->scoring_func = MT_SCORING_SIGMOID;
    else
        return mt_error("%s: key scoring_func: \"%s\" is not supported (\"softmax\" or "
                        "\"sigmoid\")", what, s);
    snprintf(s, sizeof s, "%s", "greedy");
    if (read_string(root, what, "topk_method", s, sizeof s, NULL) != 0) return -1;
    if (strcmp(s, "greedy") == 0) c->topk_method = MT_TOPK_GREEDY;
    else if (strcmp(s, "group_limited") == 0) c->topk_method = MT_TOPK_GROUP_LIMITED;
    else if (strcmp(s, "moge") == 0) c->topk_method = MT_TOPK_MOGE;
    else if (strcmp(s, "noaux_tc") == 0)
        return mt_error("%s: key topk_method: \"noaux_tc\" (DeepSeek-V3's selection by scores plus the learned "
                        "e_score_correction_bias) is not supported (\"greedy\", \"group_limited\" or \"moge\")",
                        what);
    else
        return mt_error("%s: key topk_method: \"%s\" is not supported (\"greedy\", "
                        "\"group_limited\" or \"moge\")", what, s);

    if (read_bool(root, what, "norm_topk_prob", &c->norm_topk_prob) != 0 ||
        read_bool(root, what, "tie_word_embeddings", &c->tie_word_embeddings) != 0 ||
        read_double(root, what, "routed_scaling_factor", &c->routed_scaling_factor) != 0 ||
        read_double(root, what, "aux_loss_alpha", &c->aux_loss_alpha) != 0 ||
        read_double(root, what, "rope_theta", &c->rope_theta) != 0 ||
        read_double(root, what, "rms_norm_eps", &c->rms_norm_eps) != 0 ||
        read_string(root, what, "model_type", c->model_type, sizeof c->model_type, NULL) != 0 ||
        read_bool(root, what, "sandwich_norm", &c->sandwich_norm) != 0 ||
        read_double(root, what, "mtp_loss_weight", &c->mtp_loss_weight) != 0)
        return -1;
    /* absent: the convention of the attention type (a DeepSeek-V3 config has no such key) */
    c->rope_interleave = mla;
    if (read_bool(root, what, "rope_interleave", &c->rope_interleave) != 0) return -1;
    return 0;
}

/* The one path from text to a checked config: strict JSON (base/json.h), then the keys. */
static int parse_text(mt_config *c, const char *json, size_t len, const char *what) {
    mt_config_defaults(c);
    cJSON *root = mt_json_parse(what, json, len);
    if (!root) return -1;
    int rc;
    if (!cJSON_IsObject(root)) rc = mt_error("%s: top level is not a JSON object", what);
    else rc = parse_object(c, root, what);
    cJSON_Delete(root);
    if (rc != 0) return -1;
    return mt_config_validate(c, what);
}

int mt_config_parse(mt_config *c, const char *json, const char *what) {
    MT_ASSERT(c && json && what);
    return parse_text(c, json, strlen(json), what);
}

int mt_config_load(mt_config *c, const char *path) {
    char *text = NULL;
    size_t len = 0;
    if (mt_read_file(path, &text, &len) != 0) return -1;
    int rc = parse_text(c, text, len, path); /* the length, not strlen: a NUL byte is an error */
    free(text);
    return rc;
}

/* ---- validation ---- */

static int check_min(const char *what, const char *key, long long v, long long min) {
    if (v >= min) return 0;
    if (min == 1) return mt_error("%s: key %s: must be positive (got %lld)", what, key, v);
    return mt_error("%s: key %s: must be at least %lld (got %lld)", what, key, min, v);
}

int mt_config_validate(const mt_config *c, const char *what) {
    MT_ASSERT(c && what);
    const int mla = strcmp(c->attention_type, "mla") == 0;
    if (!mla && strcmp(c->attention_type, "gqa") != 0)
        return mt_error("%s: key attention_type: \"%s\" is not supported (\"gqa\" or \"mla\")",
                        what, c->attention_type);
#define MIN(key, m) do { if (check_min(what, #key, c->key, m) != 0) return -1; } while (0)
    MIN(vocab_size, 1);
    MIN(hidden_size, 1);
    MIN(num_hidden_layers, 1);
    MIN(num_attention_heads, 1);
    MIN(num_key_value_heads, 1);
    MIN(head_dim, 1);
    MIN(intermediate_size, 1);
    MIN(max_position_embeddings, 1);
    MIN(first_k_dense_replace, 0);
    MIN(n_routed_experts, 0);
    MIN(num_experts_per_tok, 0);
    MIN(n_shared_experts, 0);
    MIN(moe_intermediate_size, 0);
    MIN(n_group, 1);
    MIN(topk_group, 1);
    MIN(num_nextn_predict_layers, 0);
    if (mla) {
        MIN(q_lora_rank, 0);
        MIN(kv_lora_rank, 1);
        MIN(qk_nope_head_dim, 0); /* 0: every query and key dimension rotated */
        MIN(qk_rope_head_dim, 1);
        MIN(v_head_dim, 1);
    }
#undef MIN
    if (c->scoring_func != MT_SCORING_SOFTMAX && c->scoring_func != MT_SCORING_SIGMOID)
        return mt_error("%s: key scoring_func: invalid value %d", what, c->scoring_func);
    if (c->topk_method < MT_TOPK_GREEDY || c->topk_method > MT_TOPK_MOGE)
        return mt_error("%s: key topk_method: invalid value %d", what, c->topk_method);
    if (!isfinite(c->rope_theta) || c->rope_theta <= 0)
        return mt_error("%s: key rope_theta: must be positive (got %g)", what, c->rope_theta);
    if (!isfinite(c->rms_norm_eps) || c->rms_norm_eps <= 0)
        return mt_error("%s: key rms_norm_eps: must be positive (got %g)", what, c->rms_norm_eps);
    if (!isfinite(c->routed_scaling_factor) || c->routed_scaling_factor <= 0)
        return mt_error("%s: key routed_scaling_factor: must be positive (got %g)", what,
                        c->routed_scaling_factor);
    if (!isfinite(c->aux_loss_alpha) || c->aux_loss_alpha < 0)
        return mt_error("%s: key aux_loss_alpha: must be non-negative (got %g)", what,
                        c->aux_loss_alpha);
    if (!isfinite(c->mtp_loss_weight) || c->mtp_loss_weight < 0)
        return mt_error("%s: key mtp_loss_weight: must be non-negative (got %g)", what, c->mtp_loss_weight);

    const int H = c->num_attention_heads, Hkv = c->num_key_value_heads;
    if (H % Hkv != 0)
        return mt_error("%s: key num_key_value_heads: num_attention_heads (%d) is not divisible "
                        "by num_key_value_heads (%d)", what, H, Hkv);
    if (mla) {
        if (c->qk_rope_head_dim % 2 != 0)
            return mt_error("%s: key qk_rope_head_dim: must be even for RoPE (got %d)", what,
                            c->qk_rope_head_dim);
    } else if (c->head_dim % 2 != 0) {
        return mt_error("%s: key head_dim: must be even for RoPE (got %d)", what, c->head_dim);
    }
    /* Weight dimensions must fit an int (the model indexes rows with int). */
    if ((long long)H * c->head_dim > INT_MAX)
        return mt_error("%s: key head_dim: num_attention_heads * head_dim overflows", what);
    if (mla && ((long long)H * ((long long)c->qk_nope_head_dim + c->qk_rope_head_dim) > INT_MAX ||
                (long long)H * ((long long)c->qk_nope_head_dim + c->v_head_dim) > INT_MAX ||
                (long long)H * c->kv_lora_rank > INT_MAX))
        return mt_error("%s: key num_attention_heads: num_attention_heads times an MLA head width "
                        "(qk_nope_head_dim + qk_rope_head_dim or + v_head_dim, or kv_lora_rank) overflows", what);
    if ((long long)(c->n_shared_experts > 1 ? c->n_shared_experts : 1) * c->moe_intermediate_size > INT_MAX)
        return mt_error("%s: key n_shared_experts: n_shared_experts * moe_intermediate_size "
                        "overflows", what);

    const int L = c->num_hidden_layers, E = c->n_routed_experts, k = c->num_experts_per_tok;
    const int G = c->n_group;
    if (c->first_k_dense_replace < L) {
        if (E == 0)
            return mt_error("%s: key n_routed_experts: layers %d..%d are MoE "
                            "(first_k_dense_replace = %d < num_hidden_layers = %d) but "
                            "n_routed_experts is 0", what, c->first_k_dense_replace, L - 1,
                            c->first_k_dense_replace, L);
        if (k == 0)
            return mt_error("%s: key num_experts_per_tok: MoE layers are present "
                            "(first_k_dense_replace = %d < num_hidden_layers = %d) but "
                            "num_experts_per_tok is 0", what, c->first_k_dense_replace, L);
        if (c->moe_intermediate_size == 0)
            return mt_error("%s: key moe_intermediate_size: missing, but MoE layers are present "
                            "(first_k_dense_replace = %d < num_hidden_layers = %d)", what,
                            c->first_k_dense_replace, L);
    }
    if (k > E)
        return mt_error("%s: key num_experts_per_tok: num_experts_per_tok (%d) exceeds "
                        "n_routed_experts (%d)", what, k, E);
    if (E > 0 && E % G != 0)
        return mt_error("%s: key n_group: n_routed_experts (%d) is not divisible by n_group (%d)",
                        what, E, G);
    if (c->topk_group > G)
        return mt_error("%s: key topk_group: topk_group (%d) exceeds n_group (%d)", what,
                        c->topk_group, G);
    if (c->topk_method == MT_TOPK_GROUP_LIMITED && E > 0 &&
        (long long)k > (long long)c->topk_group * (E / G))
        return mt_error("%s: key num_experts_per_tok: num_experts_per_tok (%d) exceeds the %d "
                        "experts of topk_group (%d) groups of %d with group_limited", what, k,
                        c->topk_group * (E / G), c->topk_group, E / G);
    if (c->topk_method == MT_TOPK_MOGE && k % G != 0)
        return mt_error("%s: key num_experts_per_tok: num_experts_per_tok (%d) is not divisible "
                        "by n_group (%d) with moge", what, k, G);
    return 0;
}

int mt_config_check_seq(const mt_config *c, int T, const char *what) {
    MT_ASSERT(c && what);
    if (T <= 0) return mt_error("%s: sequence length %d must be positive", what, T);
    if (T > c->max_position_embeddings)
        return mt_error("%s: sequence length %d exceeds max_position_embeddings (%d)", what, T,
                        c->max_position_embeddings);
    return 0;
}

/* ---- writing ---- */

/* A float literal with the shortest %.{15,16,17}g text that reads back exactly, always
 * containing '.' or an exponent so JSON readers see a float (10000.0, not 10000). */
static cJSON *json_float(double v) {
    char buf[40];
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, v);
        if (strtod(buf, NULL) == v) break;
    }
    if (!strpbrk(buf, ".eE")) strcat(buf, ".0");
    return cJSON_CreateRaw(buf);
}

static const char *scoring_name(int s) { return s == MT_SCORING_SIGMOID ? "sigmoid" : "softmax"; }
static const char *topk_name(int m) {
    return m == MT_TOPK_GROUP_LIMITED ? "group_limited" : m == MT_TOPK_MOGE ? "moge" : "greedy";
}

char *mt_config_to_json(const mt_config *c) { return mt_config_to_json_as(c, "float32"); }

char *mt_config_to_json_as(const mt_config *c, const char *torch_dtype) {
    cJSON *o = cJSON_CreateObject();
    cJSON *arch = cJSON_AddArrayToObject(o, "architectures");
    cJSON_AddItemToArray(arch, cJSON_CreateString("MoetrainForCausalLM"));
    cJSON_AddStringToObject(o, "model_type", c->model_type);
    cJSON_AddStringToObject(o, "torch_dtype", torch_dtype);
    cJSON_AddNumberToObject(o, "vocab_size", c->vocab_size);
    cJSON_AddNumberToObject(o, "hidden_size", c->hidden_size);
    cJSON_AddNumberToObject(o, "num_hidden_layers", c->num_hidden_layers);
    cJSON_AddNumberToObject(o, "num_attention_heads", c->num_attention_heads);
    cJSON_AddNumberToObject(o, "num_key_value_heads", c->num_key_value_heads);
    cJSON_AddNumberToObject(o, "head_dim", c->head_dim);
    cJSON_AddNumberToObject(o, "intermediate_size", c->intermediate_size);
    cJSON_AddNumberToObject(o, "max_position_embeddings", c->max_position_embeddings);
    cJSON_AddStringToObject(o, "attention_type", c->attention_type);
    if (strcmp(c->attention_type, "mla") == 0) {
        if (c->q_lora_rank > 0) cJSON_AddNumberToObject(o, "q_lora_rank", c->q_lora_rank);
        else cJSON_AddNullToObject(o, "q_lora_rank");
        cJSON_AddNumberToObject(o, "kv_lora_rank", c->kv_lora_rank);
        cJSON_AddNumberToObject(o, "qk_nope_head_dim", c->qk_nope_head_dim);
        cJSON_AddNumberToObject(o, "qk_rope_head_dim", c->qk_rope_head_dim);
        cJSON_AddNumberToObject(o, "v_head_dim", c->v_head_dim);
    }
    cJSON_AddStringToObject(o, "hidden_act", "silu");
    cJSON_AddFalseToObject(o, "attention_bias");
    cJSON_AddFalseToObject(o, "mlp_bias");
    cJSON_AddItemToObject(o, "rope_theta", json_float(c->rope_theta));
    cJSON_AddNullToObject(o, "rope_scaling");
    cJSON_AddItemToObject(o, "rms_norm_eps", json_float(c->rms_norm_eps));
    cJSON_AddBoolToObject(o, "tie_word_embeddings", c->tie_word_embeddings != 0);
    cJSON_AddNumberToObject(o, "first_k_dense_replace", c->first_k_dense_replace);
    cJSON_AddNumberToObject(o, "moe_layer_freq", 1);
    cJSON_AddNumberToObject(o, "n_routed_experts", c->n_routed_experts);
    cJSON_AddNumberToObject(o, "num_experts_per_tok", c->num_experts_per_tok);
    cJSON_AddNumberToObject(o, "n_shared_experts", c->n_shared_experts);
    if (c->moe_intermediate_size > 0)
        cJSON_AddNumberToObject(o, "moe_intermediate_size", c->moe_intermediate_size);
    else
        cJSON_AddNullToObject(o, "moe_intermediate_size");
    cJSON_AddStringToObject(o, "scoring_func", scoring_name(c->scoring_func));
    cJSON_AddBoolToObject(o, "norm_topk_prob", c->norm_topk_prob != 0);
    cJSON_AddItemToObject(o, "routed_scaling_factor", json_float(c->routed_scaling_factor));
    cJSON_AddNumberToObject(o, "n_group", c->n_group);
    cJSON_AddNumberToObject(o, "topk_group", c->topk_group);
    cJSON_AddStringToObject(o, "topk_method", topk_name(c->topk_method));
    cJSON_AddItemToObject(o, "aux_loss_alpha", json_float(c->aux_loss_alpha));
    cJSON_AddNumberToObject(o, "num_nextn_predict_layers", c->num_nextn_predict_layers);
    cJSON_AddItemToObject(o, "mtp_loss_weight", json_float(c->mtp_loss_weight));
    cJSON_AddBoolToObject(o, "rope_interleave", c->rope_interleave != 0);
    cJSON_AddBoolToObject(o, "sandwich_norm", c->sandwich_norm != 0);
    char *s = cJSON_Print(o);
    cJSON_Delete(o);
    MT_ASSERT(s);
    size_t n = strlen(s);
    char *out = mt_xmalloc(n + 2);
    memcpy(out, s, n);
    out[n] = '\n';
    out[n + 1] = 0;
    cJSON_free(s);
    return out;
}

int mt_config_save(const mt_config *c, const char *path) {
    if (mt_config_validate(c, path) != 0) return -1;
    char *s = mt_config_to_json(c);
    int rc = mt_write_file_atomic(path, s, strlen(s));
    free(s);
    return rc;
}
