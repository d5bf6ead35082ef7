/* tests/test_config.c — config.json parsing, validation and writing: defaults, integral
 * floats, strict types, unsupported-architecture keys, every consistency rule of docs/FORMATS.md
 * (each message must name the source and the key), MLA keys, and save -> load equality. */
#include "base/common.h"
#include "model/config.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures = 0;
#define CHECK(c) do { if (!(c)) { \
    fprintf(stderr, "%s:%d: CHECK failed: %s (last error: %s)\n", __FILE__, __LINE__, #c, \
            mt_last_error()); failures++; } } while (0)
/* expr must fail with a message containing every given substring. */
#define CHECK_ERR(expr, ...) do { \
    int rc_ = (expr); \
    if (rc_ != -1) { fprintf(stderr, "%s:%d: expected failure: %s\n", __FILE__, __LINE__, #expr); \
                     failures++; break; } \
    const char *subs_[] = {__VA_ARGS__}; \
    for (size_t i_ = 0; i_ < sizeof subs_ / sizeof subs_[0]; i_++) \
        if (!strstr(mt_last_error(), subs_[i_])) { \
            fprintf(stderr, "%s:%d: error \"%s\" lacks \"%s\"\n", __FILE__, __LINE__, \
                    mt_last_error(), subs_[i_]); failures++; } \
} while (0)

static char tmpdir[512];

/* Required keys of a small valid GQA config, as JSON members (no braces). */
#define REQ "\"vocab_size\": 300, \"hidden_size\": 64, \"num_hidden_layers\": 4, " \
            "\"num_attention_heads\": 8, \"num_key_value_heads\": 2, \"head_dim\": 16, " \
            "\"intermediate_size\": 128, \"max_position_embeddings\": 256"
/* MoE keys of a valid config (E = 16, k = 4, 4 groups). */
#define MOE "\"first_k_dense_replace\": 1, \"n_routed_experts\": 16, \"num_experts_per_tok\": 4, " \
            "\"n_shared_experts\": 1, \"moe_intermediate_size\": 32, \"n_group\": 4, " \
            "\"topk_group\": 2"

/* Parses base with the members of extra ("" or JSON members without braces) merged in,
 * replacing keys of the same name (so a test can override one key), as "cfg.json". */
static int parse_merged(mt_config *c, const char *base, const char *extra) {
    char buf[4096];
    snprintf(buf, sizeof buf, "{%s}", extra);
    cJSON *b = cJSON_Parse(base), *e = cJSON_Parse(buf);
    MT_ASSERT(b && e);
    while (e->child) {
        cJSON *item = cJSON_DetachItemViaPointer(e, e->child);
        char key[128];
        snprintf(key, sizeof key, "%s", item->string); /* Replace frees item->string */
        if (cJSON_GetObjectItemCaseSensitive(b, key))
            cJSON_ReplaceItemInObjectCaseSensitive(b, key, item);
        else
            cJSON_AddItemToObject(b, key, item);
    }
    char *text = cJSON_PrintUnformatted(b);
    cJSON_Delete(b);
    cJSON_Delete(e);
    int rc = mt_config_parse(c, text, "cfg.json");
    cJSON_free(text);
    return rc;
}

/* A valid MoE config with extra keys merged in. */
static int parse_with(mt_config *c, const char *extra) {
    return parse_merged(c, "{" REQ ", " MOE "}", extra);
}

/* A dense model (unless extra adds MoE keys) with extra keys merged in. */
static int parse_dense(mt_config *c, const char *extra) {
    return parse_merged(c, "{" REQ "}", extra);
}

static int same_config(const mt_config *a, const mt_config *b) {
#define EQ(f) if (a->f != b->f) { fprintf(stderr, "field " #f " differs\n"); return 0; }
#define EQD(f) if (memcmp(&a->f, &b->f, sizeof(double)) != 0) { \
        fprintf(stderr, "field " #f " differs: %.17g vs %.17g\n", a->f, b->f); return 0; }
    EQ(vocab_size) EQ(hidden_size) EQ(num_hidden_layers) EQ(num_attention_heads)
    EQ(num_key_value_heads) EQ(head_dim) EQ(intermediate_size) EQ(max_position_embeddings)
    EQ(first_k_dense_replace) EQ(n_routed_experts) EQ(num_experts_per_tok) EQ(n_shared_experts)
    EQ(moe_intermediate_size) EQ(scoring_func) EQ(norm_topk_prob) EQD(routed_scaling_factor)
    EQ(n_group) EQ(topk_group) EQ(topk_method) EQD(aux_loss_alpha) EQD(rope_theta)
    EQD(rms_norm_eps) EQ(tie_word_embeddings) EQ(q_lora_rank) EQ(kv_lora_rank)
    EQ(qk_nope_head_dim) EQ(qk_rope_head_dim) EQ(v_head_dim) EQ(num_nextn_predict_layers)
#undef EQ
#undef EQD
    if (strcmp(a->attention_type, b->attention_type) != 0) return 0;
    if (strcmp(a->model_type, b->model_type) != 0) return 0;
    return 1;
}

static void test_parse_and_defaults(void) {
    mt_config c;
    CHECK(parse_dense(&c, "") == 0);
    CHECK(c.vocab_size == 300 && c.hidden_size == 64 && c.num_hidden_layers == 4);
    CHECK(c.num_attention_heads == 8 && c.num_key_value_heads == 2 && c.head_dim == 16);
    CHECK(c.intermediate_size == 128 && c.max_position_embeddings == 256);
    CHECK(c.first_k_dense_replace == 4); /* default L: all dense */
    CHECK(c.n_routed_experts == 0 && c.num_experts_per_tok == 0 && c.n_shared_experts == 0);
    CHECK(c.moe_intermediate_size == 0);
    CHECK(c.scoring_func == MT_SCORING_SOFTMAX && c.norm_topk_prob == 1);
    CHECK(c.routed_scaling_factor == 1.0 && c.n_group == 1 && c.topk_group == 1);
    CHECK(c.topk_method == MT_TOPK_GREEDY && c.aux_loss_alpha == 0.0);
    CHECK(c.rope_theta == 10000.0 && c.rms_norm_eps == 1e-6 && c.tie_word_embeddings == 0);
    CHECK(strcmp(c.attention_type, "gqa") == 0 && strcmp(c.model_type, "moetrain") == 0);
    CHECK(c.num_nextn_predict_layers == 0 && c.kv_lora_rank == 0);
    for (int l = 0; l < 4; l++) CHECK(!mt_config_is_moe(&c, l));

    CHECK(parse_with(&c, "\"scoring_func\": \"sigmoid\", \"norm_topk_prob\": false, "
                         "\"routed_scaling_factor\": 2.5, \"topk_method\": \"group_limited\", "
                         "\"aux_loss_alpha\": 0.001, \"rope_theta\": 500000, "
                         "\"rms_norm_eps\": 1e-5, \"tie_word_embeddings\": true, "
                         "\"model_type\": \"deepseek_v3\", \"num_nextn_predict_layers\": 1") == 0);
    CHECK(c.first_k_dense_replace == 1 && c.n_routed_experts == 16 && c.num_experts_per_tok == 4);
    CHECK(c.n_shared_experts == 1 && c.moe_intermediate_size == 32 && c.n_group == 4);
    CHECK(c.topk_group == 2 && c.scoring_func == MT_SCORING_SIGMOID && c.norm_topk_prob == 0);
    CHECK(c.routed_scaling_factor == 2.5 && c.topk_method == MT_TOPK_GROUP_LIMITED);
    CHECK(c.aux_loss_alpha == 0.001 && c.rope_theta == 500000.0 && c.rms_norm_eps == 1e-5);
    CHECK(c.tie_word_embeddings == 1 && strcmp(c.model_type, "deepseek_v3") == 0);
    CHECK(c.num_nextn_predict_layers == 1);
    CHECK(!mt_config_is_moe(&c, 0) && mt_config_is_moe(&c, 1) && mt_config_is_moe(&c, 3));

    /* Integral floats are integers; unknown keys ignored; neutral values of unsupported
     * features accepted; null means default. */
    CHECK(parse_dense(&c, "\"hidden_size\": 64.0, \"num_hidden_layers\": 4.0, "
                          "\"some_future_key\": {\"x\": [1, 2]}, \"initializer_range\": 0.02, "
                          "\"rope_scaling\": null, \"moe_layer_freq\": 1, "
                          "\"attention_bias\": false, \"mlp_bias\": false, "
                          "\"hidden_act\": \"silu\", \"n_routed_experts\": null, "
                          "\"architectures\": [\"X\"], \"torch_dtype\": \"bfloat16\"") == 0);
    CHECK(c.hidden_size == 64 && c.num_hidden_layers == 4 && c.n_routed_experts == 0);
    /* n_group > 1 with greedy is allowed (groups ignored). */
    CHECK(parse_with(&c, "\"topk_method\": \"greedy\", \"topk_group\": 1") == 0);
    CHECK(c.n_group == 4 && c.topk_method == MT_TOPK_GREEDY);
    /* first_k_dense_replace >= L: all dense, experts need not be configured. */
    CHECK(parse_dense(&c, "\"first_k_dense_replace\": 10") == 0);
    CHECK(!mt_config_is_moe(&c, 3));
    /* moge with k divisible by n_group. */
    CHECK(parse_with(&c, "\"topk_method\": \"moge\"") == 0 && c.topk_method == MT_TOPK_MOGE);
}

static void test_type_errors(void) {
    mt_config c;
    CHECK_ERR(parse_dense(&c, "\"hidden_size\": 8.5"), "cfg.json", "key hidden_size", "8.5");
    CHECK_ERR(parse_with(&c, "\"n_group\": 2.5"), "cfg.json", "key n_group");
    CHECK_ERR(parse_dense(&c, "\"hidden_size\": \"64\""), "cfg.json", "key hidden_size");
    CHECK_ERR(parse_dense(&c, "\"hidden_size\": true"), "cfg.json", "key hidden_size");
    CHECK_ERR(parse_dense(&c, "\"hidden_size\": 1e12"), "cfg.json", "key hidden_size", "range");
    CHECK_ERR(parse_dense(&c, "\"tie_word_embeddings\": 1"), "cfg.json", "key tie_word_embeddings",
              "boolean");
    CHECK_ERR(parse_with(&c, "\"norm_topk_prob\": 0"), "cfg.json", "key norm_topk_prob", "boolean");
    CHECK_ERR(parse_with(&c, "\"norm_topk_prob\": \"true\""), "key norm_topk_prob");
    CHECK_ERR(parse_with(&c, "\"scoring_func\": 1"), "cfg.json", "key scoring_func", "string");
    CHECK_ERR(parse_dense(&c, "\"model_type\": [\"a\"]"), "cfg.json", "key model_type");
    CHECK_ERR(parse_dense(&c, "\"rope_theta\": \"1e4\""), "cfg.json", "key rope_theta");
    CHECK_ERR(parse_dense(&c, "\"rms_norm_eps\": 0"), "cfg.json", "key rms_norm_eps");
    CHECK_ERR(parse_dense(&c, "\"rope_theta\": -1.0"), "cfg.json", "key rope_theta");
    CHECK_ERR(parse_with(&c, "\"aux_loss_alpha\": -0.5"), "cfg.json", "key aux_loss_alpha");
    CHECK_ERR(parse_with(&c, "\"routed_scaling_factor\": 0"), "key routed_scaling_factor");
    CHECK_ERR(mt_config_parse(&c, "{" REQ ", \"vocab_size\": 300}", "cfg.json"), "cfg.json",
              "key vocab_size", "more than once");

    /* Missing required keys, one at a time. */
    static const char *const req[] = {"vocab_size", "hidden_size", "num_hidden_layers",
                                      "num_attention_heads", "num_key_value_heads", "head_dim",
                                      "intermediate_size", "max_position_embeddings"};
    static const int val[] = {300, 64, 4, 8, 2, 16, 128, 256};
    for (int skip = 0; skip < 8; skip++) {
        char buf[1024] = "{";
        for (int i = 0; i < 8; i++) {
            if (i == skip) continue;
            char m[96];
            snprintf(m, sizeof m, "%s\"%s\": %d", strlen(buf) > 1 ? ", " : "", req[i], val[i]);
            strcat(buf, m);
        }
        strcat(buf, "}");
        char key[96];
        snprintf(key, sizeof key, "key %s", req[skip]);
        CHECK_ERR(mt_config_parse(&c, buf, "cfg.json"), "cfg.json", key, "missing");
        /* ... and zero / negative values. */
        for (int sign = 0; sign < 2; sign++) {
            char b2[1024], m[96];
            snprintf(m, sizeof m, ", \"%s\": %d}", req[skip], sign ? -3 : 0);
            snprintf(b2, sizeof b2, "%.*s%s", (int)strlen(buf) - 1, buf, m);
            CHECK_ERR(mt_config_parse(&c, b2, "cfg.json"), "cfg.json", key, "positive");
        }
    }
    CHECK_ERR(parse_with(&c, "\"moe_intermediate_size\": 0") , "key moe_intermediate_size");
    CHECK_ERR(parse_with(&c, "\"n_shared_experts\": -1") , "key n_shared_experts");
    CHECK_ERR(parse_with(&c, "\"first_k_dense_replace\": -1") , "key first_k_dense_replace");
    CHECK_ERR(parse_with(&c, "\"n_group\": 0"), "key n_group");

    /* Malformed JSON and a non-object top level. */
    CHECK_ERR(mt_config_parse(&c, "{\"vocab_size\": 300,\n \"hidden_size\": }", "cfg.json"),
              "cfg.json", "JSON", "line 2");
    CHECK_ERR(mt_config_parse(&c, "{\"vocab_size\": 300} trailing", "cfg.json"), "cfg.json", "JSON");
    CHECK_ERR(mt_config_parse(&c, "", "cfg.json"), "cfg.json", "JSON");
    CHECK_ERR(mt_config_parse(&c, "[1, 2]", "cfg.json"), "cfg.json", "object");
}

static void test_unsupported(void) {
    mt_config c;
    CHECK_ERR(parse_dense(&c, "\"rope_scaling\": {\"type\": \"yarn\", \"factor\": 4}"),
              "cfg.json", "key rope_scaling", "not supported");
    CHECK_ERR(parse_with(&c, "\"moe_layer_freq\": 2"), "cfg.json", "key moe_layer_freq");
    CHECK_ERR(parse_with(&c, "\"moe_layer_freq\": \"1\""), "cfg.json", "key moe_layer_freq");
    CHECK_ERR(parse_dense(&c, "\"attention_bias\": true"), "cfg.json", "key attention_bias",
              "not supported");
    CHECK_ERR(parse_dense(&c, "\"attention_bias\": 0"), "cfg.json", "key attention_bias");
    CHECK_ERR(parse_dense(&c, "\"mlp_bias\": true"), "cfg.json", "key mlp_bias");
    CHECK_ERR(parse_dense(&c, "\"hidden_act\": \"gelu\""), "cfg.json", "key hidden_act");
    CHECK_ERR(parse_dense(&c, "\"attention_type\": \"mha\""), "cfg.json", "key attention_type",
              "mha");
    CHECK_ERR(parse_with(&c, "\"scoring_func\": \"tanh\""), "cfg.json", "key scoring_func", "tanh");
    CHECK_ERR(parse_with(&c, "\"topk_method\": \"noaux_tc\""), "cfg.json", "key topk_method",
              "noaux_tc");
    CHECK_ERR(parse_with(&c, "\"topk_method\": \"group_limited_greedy\""), "key topk_method");
}

static void test_consistency(void) {
    mt_config c;
    CHECK_ERR(parse_dense(&c, "\"num_key_value_heads\": 3"), "cfg.json", "key num_key_value_heads",
              "(8)", "(3)");
    CHECK_ERR(parse_dense(&c, "\"head_dim\": 15"), "cfg.json", "key head_dim", "even");
    CHECK_ERR(parse_with(&c, "\"num_experts_per_tok\": 17"), "cfg.json",
              "key num_experts_per_tok", "17", "16");
    CHECK_ERR(parse_with(&c, "\"n_group\": 3"), "cfg.json", "key n_group", "16", "3");
    CHECK_ERR(parse_with(&c, "\"topk_group\": 5"), "cfg.json", "key topk_group", "5", "4");
    /* group_limited: 2 groups of 4 experts hold 8 < 9. */
    CHECK_ERR(parse_with(&c, "\"topk_method\": \"group_limited\", \"num_experts_per_tok\": 9"),
              "cfg.json", "key num_experts_per_tok", "group_limited");
    CHECK(parse_with(&c, "\"topk_method\": \"group_limited\", \"num_experts_per_tok\": 8") == 0);
    /* ... the same k is fine with greedy, which ignores groups. */
    CHECK(parse_with(&c, "\"topk_method\": \"greedy\", \"num_experts_per_tok\": 9") == 0);
    CHECK_ERR(parse_with(&c, "\"topk_method\": \"moge\", \"num_experts_per_tok\": 6"),
              "cfg.json", "key num_experts_per_tok", "moge");
    /* MoE layers present but experts missing. */
    CHECK_ERR(parse_dense(&c, "\"first_k_dense_replace\": 2"), "cfg.json", "key n_routed_experts");
    CHECK_ERR(parse_dense(&c, "\"first_k_dense_replace\": 2, \"n_routed_experts\": 8, "
                              "\"moe_intermediate_size\": 32"),
              "cfg.json", "key num_experts_per_tok");
    CHECK_ERR(parse_dense(&c, "\"first_k_dense_replace\": 2, \"n_routed_experts\": 8, "
                              "\"num_experts_per_tok\": 2"),
              "cfg.json", "key moe_intermediate_size", "missing");
    CHECK_ERR(parse_dense(&c, "\"first_k_dense_replace\": 0, \"n_routed_experts\": 8, "
                              "\"num_experts_per_tok\": 2, \"moe_intermediate_size\": null"),
              "key moe_intermediate_size");

    /* Sequence length check. */
    CHECK(parse_dense(&c, "") == 0);
    CHECK(mt_config_check_seq(&c, 256, "train.seq_len") == 0);
    CHECK(mt_config_check_seq(&c, 1, "train.seq_len") == 0);
    CHECK_ERR(mt_config_check_seq(&c, 257, "train.seq_len"), "train.seq_len", "257",
              "max_position_embeddings", "256");
    CHECK_ERR(mt_config_check_seq(&c, 0, "train.seq_len"), "train.seq_len");

    /* Validation of a config built in code. */
    mt_config d;
    mt_config_defaults(&d);
    CHECK_ERR(mt_config_validate(&d, "built"), "built", "key vocab_size");
    d = c;
    d.topk_method = 7;
    CHECK_ERR(mt_config_validate(&d, "built"), "built", "key topk_method");
}

/* An MLA config; q is the q_lora_rank JSON value, `drop` a key to leave out (or NULL). */
static int parse_mla(mt_config *c, const char *q, int rope, const char *drop) {
    char buf[1024];
    snprintf(buf, sizeof buf, "{\"vocab_size\": 300, \"hidden_size\": 64, "
             "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
             "\"intermediate_size\": 128, \"max_position_embeddings\": 128, "
             "\"attention_type\": \"mla\", \"q_lora_rank\": %s, \"kv_lora_rank\": 16, "
             "\"qk_nope_head_dim\": 12, \"qk_rope_head_dim\": %d, \"v_head_dim\": 12}", q, rope);
    if (drop) {
        char key[64];
        snprintf(key, sizeof key, "\"%s\"", drop);
        char *k = strstr(buf, key);
        MT_ASSERT(k);
        k[1] = 'X'; /* renamed: the key is now missing */
    }
    return mt_config_parse(c, buf, "mla.json");
}

static void test_mla(void) {
    mt_config c;
    CHECK(parse_mla(&c, "24", 8, NULL) == 0);
    CHECK(strcmp(c.attention_type, "mla") == 0 && c.q_lora_rank == 24 && c.kv_lora_rank == 16);
    CHECK(c.qk_nope_head_dim == 12 && c.qk_rope_head_dim == 8 && c.v_head_dim == 12);
    CHECK(c.head_dim == 8 && c.num_key_value_heads == 4); /* HF defaults for MLA */
    /* q_lora_rank null: no query compression. */
    CHECK(parse_mla(&c, "null", 8, NULL) == 0 && c.q_lora_rank == 0);
    CHECK_ERR(parse_mla(&c, "0", 8, NULL), "mla.json", "key q_lora_rank");
    static const char *const keys[] = {"kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                                       "v_head_dim", "q_lora_rank"};
    for (int i = 0; i < 5; i++) {
        char want[64];
        snprintf(want, sizeof want, "key %s", keys[i]);
        CHECK_ERR(parse_mla(&c, "24", 8, keys[i]), "mla.json", want, "missing");
    }
    CHECK_ERR(parse_mla(&c, "24", 7, NULL), "mla.json", "key qk_rope_head_dim", "even");
}

static void test_save_load(void) {
    char path[700];
    snprintf(path, sizeof path, "%s/config.json", tmpdir);
    mt_config c, d;
    CHECK(parse_with(&c, "\"scoring_func\": \"sigmoid\", \"norm_topk_prob\": false, "
                         "\"routed_scaling_factor\": 2.5, \"topk_method\": \"moge\", "
                         "\"aux_loss_alpha\": 0.25, \"rope_theta\": 500000, "
                         "\"rms_norm_eps\": 1e-5, \"tie_word_embeddings\": true, "
                         "\"num_nextn_predict_layers\": 2, \"model_type\": \"pangu\"") == 0);
    /* Set in code: the test's JSON merge goes through cJSON's printer, which is not
     * round-trip exact for every double (mt_config_to_json is). */
    c.routed_scaling_factor = 1.0 / 3.0;
    c.aux_loss_alpha = 0.1 + 0.2;
    CHECK(mt_config_save(&c, path) == 0);
    CHECK(mt_config_load(&d, path) == 0);
    CHECK(same_config(&c, &d));

    char *text = NULL;
    CHECK(mt_read_file(path, &text, NULL) == 0);
    if (text) {
        CHECK(strstr(text, "\"architectures\"") && strstr(text, "\"MoetrainForCausalLM\""));
        CHECK(strstr(text, "\"torch_dtype\":") && strstr(text, "\"float32\""));
        CHECK(strstr(text, "\"rope_theta\":\t500000.0"));
        CHECK(strstr(text, "\"rms_norm_eps\":\t1e-05"));
        CHECK(strstr(text, "\"aux_loss_alpha\":\t0.30000000000000004"));
        CHECK(strstr(text, "\"tie_word_embeddings\":\ttrue"));
        CHECK(strstr(text, "\"vocab_size\":\t300,"));
        CHECK(strstr(text, "\"topk_method\":\t\"moge\""));
        free(text);
    }
    /* Dense config (moe_intermediate_size absent) and an MLA config round trip too. */
    CHECK(parse_dense(&c, "") == 0);
    CHECK(mt_config_save(&c, path) == 0 && mt_config_load(&d, path) == 0 && same_config(&c, &d));
    CHECK(mt_config_parse(&c, "{\"vocab_size\": 300, \"hidden_size\": 64, "
                              "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
                              "\"intermediate_size\": 128, \"max_position_embeddings\": 128, "
                              "\"attention_type\": \"mla\", \"q_lora_rank\": null, "
                              "\"kv_lora_rank\": 16, \"qk_nope_head_dim\": 12, "
                              "\"qk_rope_head_dim\": 8, \"v_head_dim\": 12}", "mla.json") == 0);
    CHECK(mt_config_save(&c, path) == 0 && mt_config_load(&d, path) == 0 && same_config(&c, &d));

    /* Load errors name the file; an invalid config is not saved. */
    char bad[700];
    snprintf(bad, sizeof bad, "%s/bad_config.json", tmpdir);
    const char *txt = "{\"vocab_size\": 300, \"hidden_size\": 60, \"num_hidden_layers\": 2, "
                      "\"num_attention_heads\": 12, \"num_key_value_heads\": 5, "
                      "\"head_dim\": 8, \"intermediate_size\": 64, "
                      "\"max_position_embeddings\": 64}";
    CHECK(mt_write_file_atomic(bad, txt, strlen(txt)) == 0);
    CHECK_ERR(mt_config_load(&d, bad), "bad_config.json", "key num_key_value_heads",
              "num_attention_heads (12) is not divisible by num_key_value_heads (5)");
    snprintf(bad, sizeof bad, "%s/no_such_config.json", tmpdir);
    CHECK_ERR(mt_config_load(&d, bad), "no_such_config.json");
    c.num_key_value_heads = 3;
    CHECK_ERR(mt_config_save(&c, path), "config.json", "key num_key_value_heads");
}

int main(void) {
    const char *base = getenv("MT_TEST_TMP");
    snprintf(tmpdir, sizeof tmpdir, "%s/test_config", base && *base ? base : "/tmp/mt_test_st");
    if (mt_mkdir_p(tmpdir) != 0) {
        fprintf(stderr, "cannot create %s: %s\n", tmpdir, mt_last_error());
        return 1;
    }
    test_parse_and_defaults();
    test_type_errors();
    test_unsupported();
    test_consistency();
    test_mla();
    test_save_load();
    if (failures) {
        fprintf(stderr, "test_config: %d check(s) FAILED\n", failures);
        return 1;
    }
    printf("test_config: all checks passed\n");
    return 0;
}
