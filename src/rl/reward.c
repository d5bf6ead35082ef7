/* rl/reward.c — the reward interface and the arithmetic verifier (see reward.h). */
#include "rl/reward.h"

#include "base/common.h"
#include "data/tokenizer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

mt_verdict mt_math_verdict_tk(const mt_tokenizer *tk, const int32_t *completion, int n, int stopped_at_eot,
                              const char *answer) {
    MT_ASSERT(n >= 0 && (completion || n == 0) && answer);
    mt_tokenizer byte;
    mt_tokenizer_byte(&byte);
    if (!tk) tk = &byte;
    if (!stopped_at_eot || n == 0 || completion[n - 1] != tk->eot) return MT_VERDICT_MALFORMED;
    int body = n - 1;
    for (int i = 0; i < body; i++)
        if (!mt_tokenizer_is_text(tk, completion[i])) return MT_VERDICT_MALFORMED;
    /* byte for byte with lengths, so a NUL byte cannot end the comparison early */
    char *text = NULL;
    size_t tlen = 0, cap = 0;
    mt_tokenizer_decode(tk, completion, (size_t)body, &text, &tlen, &cap);
    const size_t alen = strlen(answer);
    const mt_verdict v = tlen == alen && memcmp(text, answer, alen) == 0 ? MT_VERDICT_CORRECT : MT_VERDICT_WRONG;
    free(text);
    return v;
}

mt_verdict mt_math_verdict(const int32_t *completion, int n, int stopped_at_eot, const char *answer) {
    return mt_math_verdict_tk(NULL, completion, n, stopped_at_eot, answer);
}

float mt_math_reward_of(mt_verdict v, float format_penalty) {
    if (v == MT_VERDICT_CORRECT) return 1.0f;
    /* no penalty gives +0, not -0 (a dump would print "-0") */
    return v == MT_VERDICT_MALFORMED && format_penalty > 0 ? -format_penalty : 0.0f;
}

typedef struct {
    float format_penalty;
    const mt_tokenizer *tk;
} math_ctx;

static float math_score(void *ctx, const int32_t *completion, int n, int stopped_at_eot, const char *answer) {
    const math_ctx *c = ctx;
    return mt_math_reward_of(mt_math_verdict_tk(c->tk, completion, n, stopped_at_eot, answer), c->format_penalty);
}

int mt_reward_init(mt_reward *r, const char *name, float format_penalty, const mt_tokenizer *tk) {
    MT_ASSERT(r && name);
    memset(r, 0, sizeof *r);
    if (strcmp(name, "math") != 0) return mt_error("reward '%s' unknown (known: math)", name);
    if (!isfinite(format_penalty) || format_penalty < 0)
        return mt_error("reward %s: format penalty %g invalid (need a finite number >= 0)", name,
                        (double)format_penalty);
    math_ctx *c = mt_xmalloc(sizeof *c);
    c->format_penalty = format_penalty;
    c->tk = tk;
    r->name = "math";
    r->score = math_score;
    r->ctx = c;
    r->free_ctx = free;
    return 0;
}

void mt_reward_free(mt_reward *r) {
    if (!r) return;
    if (r->free_ctx) r->free_ctx(r->ctx);
    memset(r, 0, sizeof *r);
}
