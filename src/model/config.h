/* model/config.h — the model configuration of docs/FORMATS.md (HF-style config.json).
 *
 * mt_config_load parses and validates a config.json; every rule of docs/FORMATS.md ("config.json")
 * is checked there and reported as one line naming the file and the key. */
#ifndef MT_MODEL_CONFIG_H
#define MT_MODEL_CONFIG_H

#include <stdint.h>
#include <string.h>

enum mt_scoring { MT_SCORING_SOFTMAX = 0, MT_SCORING_SIGMOID = 1 };
enum mt_topk_method { MT_TOPK_GREEDY = 0, MT_TOPK_GROUP_LIMITED = 1, MT_TOPK_MOGE = 2 };

typedef struct {
    int vocab_size;               /* V */
    int hidden_size;              /* d */
    int num_hidden_layers;        /* L */
    int num_attention_heads;      /* H */
    int num_key_value_heads;      /* Hkv */
    int head_dim;                 /* hd */
    int intermediate_size;        /* dense SwiGLU hidden size */
    int max_position_embeddings;
    int first_k_dense_replace;    /* default L (all dense) */
    int n_routed_experts;         /* E, default 0 */
    int num_experts_per_tok;      /* k, default 0 */
    int n_shared_experts;         /* default 0 */
    int moe_intermediate_size;    /* 0 when absent */
    int scoring_func;             /* enum mt_scoring */
    int norm_topk_prob;           /* default 1 */
    double routed_scaling_factor; /* default 1.0 */
    int n_group;                  /* default 1 */
    int topk_group;               /* default 1 */
    int topk_method;              /* enum mt_topk_method */
    double aux_loss_alpha;        /* default 0.0 */
    double rope_theta;            /* default 10000 */
    double rms_norm_eps;          /* default 1e-6 */
    int tie_word_embeddings;      /* default 0 */
    char attention_type[16];      /* "gqa" or "mla" (multi-head latent attention, model/mla.c) */
    char model_type[64];          /* default "moetrain" */
    /* Multi-head latent attention (attention_type "mla", DeepSeek-V2/V3 keys); all 0 for
     * "gqa". kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim and v_head_dim are required
     * for "mla"; q_lora_rank may be null in the JSON (stored 0: no query compression). */
    int q_lora_rank;
    int kv_lora_rank;
    int qk_nope_head_dim;
    int qk_rope_head_dim;
    int v_head_dim;
    int num_nextn_predict_layers; /* multi-token-prediction modules, default 0 */
    double mtp_loss_weight;       /* weight of the MTP losses, default 0.3 */
    int rope_interleave;          /* RoPE pairs neighbouring dims; default 0 for gqa, 1 for mla */
    int sandwich_norm;            /* each sublayer's output normed before the residual add, default 0 */
} mt_config;

/* Fills the defaults of docs/FORMATS.md (all required keys 0). */
void mt_config_defaults(mt_config *c);
/* Parses and validates a config.json. On error: -1, message names the file and key. */
int mt_config_load(mt_config *c, const char *path);
/* Parses from a JSON string; `what` names the source in error messages. */
int mt_config_parse(mt_config *c, const char *json, const char *what);
/* Validates the invariants of docs/FORMATS.md; `what` names the source in messages. */
int mt_config_validate(const mt_config *c, const char *what);
/* Writes config.json (all keys, HF style, atomically). */
int mt_config_save(const mt_config *c, const char *path);
/* Returns a malloc'd JSON text of the config. */
char *mt_config_to_json(const mt_config *c);
/* The same with "torch_dtype" set to the given name ("float32", "bfloat16": the weights' type). */
char *mt_config_to_json_as(const mt_config *c, const char *torch_dtype);

/* Errors (naming `what` and max_position_embeddings) unless 0 < T <= max_position_embeddings. */
int mt_config_check_seq(const mt_config *c, int T, const char *what);

/* Multi-head latent attention (attention_type "mla")? */
static inline int mt_config_is_mla(const mt_config *c) { return strcmp(c->attention_type, "mla") == 0; }
/* The width RoPE rotates: head_dim for GQA, qk_rope_head_dim for MLA. */
static inline int mt_config_rope_dim(const mt_config *c) {
    return mt_config_is_mla(c) ? c->qk_rope_head_dim : c->head_dim;
}

/* Decoder layers of the model: the main stack's L, then the num_nextn_predict_layers MTP
 * blocks (block k is layer L + k - 1, as its tensors are named). */
static inline int mt_config_layers(const mt_config *c) {
    return c->num_hidden_layers + c->num_nextn_predict_layers;
}

/* Is layer l (main stack or MTP block) an MoE layer? An MTP block is one iff the main stack
 * has MoE layers. */
static inline int mt_config_is_moe(const mt_config *c, int l) {
    if (c->n_routed_experts <= 0) return 0;
    return l < c->num_hidden_layers ? l >= c->first_k_dense_replace
                                    : c->first_k_dense_replace < c->num_hidden_layers;
}

#endif
