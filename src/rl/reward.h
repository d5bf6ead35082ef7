/* rl/reward.h — rewards of RL completions (docs/FORMATS.md "RL prompt files and rewards").
 *
 * A reward is pluggable: a name and a score function over one completion's tokens (as the
 * rollout recorded them, a final end-of-text included), whether the rollout stopped at
 * end-of-text (else it hit max_new_tokens), and the prompt's expected answer string.
 * Every reward is a float.
 *
 * The built-in "math" verifier (RL.md "Reward"): the completion is MALFORMED when
 *   - it did not end with end-of-text (stopped at max_new_tokens; also an empty one), or
 *   - any token other than that final end-of-text is not a byte (id outside 0..255; an
 *     end-of-text before the last position counts here).
 * Otherwise its text is its bytes without the final end-of-text, and it is CORRECT when
 * that text equals the expected answer byte for byte (the expected answer is the integer
 * in canonical form, so "046", "+46" or "46 " are merely WRONG, not malformed). Reward:
 * correct 1, wrong 0, malformed -format_penalty (0 without a penalty). Under a
 * tokenizer.json the end of text is its id, a "byte" is a token of its text and the text
 * is the decoded tokens (mt_math_verdict_tk). */
#ifndef MT_RL_REWARD_H
#define MT_RL_REWARD_H

#include <stdint.h>

#include "data/tokenizer.h"

typedef float (*mt_reward_fn)(void *ctx, const int32_t *completion, int n, int stopped_at_eot, const char *answer);

typedef struct {
    const char *name;
    mt_reward_fn score;
    void *ctx;                   /* passed to score */
    void (*free_ctx)(void *ctx); /* NULL: ctx is not owned */
} mt_reward;

/* Makes a built-in reward by name ("math") for completions of tokenizer tk (NULL: the byte
 * tokenizer; kept by pointer). format_penalty f >= 0 (finite): a malformed completion
 * scores -f instead of 0. Errors name an unknown reward (listing the known ones) or a bad
 * penalty. A custom reward fills the struct itself. */
int mt_reward_init(mt_reward *r, const char *name, float format_penalty, const mt_tokenizer *tk);
void mt_reward_free(mt_reward *r);

static inline float mt_reward_score(const mt_reward *r, const int32_t *completion, int n, int stopped_at_eot,
                                    const char *answer) {
    return r->score(r->ctx, completion, n, stopped_at_eot, answer);
}

typedef enum { MT_VERDICT_WRONG = 0, MT_VERDICT_CORRECT = 1, MT_VERDICT_MALFORMED = 2 } mt_verdict;

/* The math verifier's judgement of one completion (rules above). "Ended with end-of-text"
 * needs both stopped_at_eot and a last token of MT_BYTE_EOT; a caller whose flag and tokens
 * disagree gets malformed rather than a trusted flag. */
mt_verdict mt_math_verdict(const int32_t *completion, int n, int stopped_at_eot, const char *answer);
/* The same under tokenizer tk (NULL: bytes): the end of text is tk's, a token other than
 * the final one is malformed unless it is text of the vocabulary (mt_tokenizer_is_text),
 * and the text compared with the answer is the decoded body. */
mt_verdict mt_math_verdict_tk(const mt_tokenizer *tk, const int32_t *completion, int n, int stopped_at_eot,
                              const char *answer);
/* The math reward of a verdict: 1, 0 or -format_penalty. */
float mt_math_reward_of(mt_verdict v, float format_penalty);

#endif
