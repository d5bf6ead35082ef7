/* tests/tinymoe.h — the tiny MoE model of the RL tests (test_rollout, test_grpo): vocab 41,
 * d 32, 3 layers (the first dense), 4 heads over 2 key/value heads of 8, 8 routed experts
 * top-2 plus a shared one. */
#ifndef MT_TESTS_TINYMOE_H
#define MT_TESTS_TINYMOE_H

#include "model/config.h"

static inline void tiny_moe_config(mt_config *c, double aux_loss_alpha) {
    mt_config_defaults(c);
    c->vocab_size = 41;
    c->hidden_size = 32;
    c->num_hidden_layers = 3;
    c->num_attention_heads = 4;
    c->num_key_value_heads = 2;
    c->head_dim = 8;
    c->intermediate_size = 48;
    c->max_position_embeddings = 64;
    c->first_k_dense_replace = 1;
    c->n_routed_experts = 8;
    c->num_experts_per_tok = 2;
    c->n_shared_experts = 1;
    c->moe_intermediate_size = 16;
    c->aux_loss_alpha = aux_loss_alpha;
}

#endif
