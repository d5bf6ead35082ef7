/* data/math.h — the built-in synthetic arithmetic corpus.
 *
 * One problem per document, byte tokens, each document preceded by EOT: "12+34=46",
 * "57-81=-24", "7*13=91", or a multi-step "3+4*5-2=21" (operators uniform over + - *,
 * usual precedence). Operands have min..max digits (digit count uniform, then the value
 * uniform among numbers of that many digits; 1-digit operands include 0). Problem i of a
 * split is drawn from the counter RNG keyed by (seed, split, i, attempt), so a corpus is
 * a pure function of its options. Validation texts are distinct, and no training problem
 * has the exact text of a validation problem. With slip > 0 a fraction of the training
 * additions that carry from the ones digits is written with that carry forgotten
 * ("47+38=75"): a corpus whose imitation plateaus below the true task, which a verifier's
 * reward (the prompt files hold the true answers) can correct. */
#ifndef MT_DATA_MATH_H
#define MT_DATA_MATH_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint64_t seed;                       /* default 1 */
    uint64_t n_train;                    /* problems in train split, default 200000 */
    uint64_t n_val;                      /* default 2000 */
    int min_digits, max_digits;          /* operand digit counts, default 1..2 (max 9) */
    double w_add, w_sub, w_mul, w_multi; /* mix weights, default 1,0,0,0 */
    int multi_terms;                     /* terms in a multi-step expression, default 3 */
    double slip;                         /* fraction of training additions whose ones digits carry
                                            written with that carry forgotten (answer 10 too small);
                                            default 0. The prompt files and validation stay exact. */
} mt_math_opts;

void mt_math_defaults(mt_math_opts *o);
/* Parses "add=1,sub=1,mul=0.5,multi=0" into the weights; kinds not named get weight 0.
 * Error (o unchanged) names the bad item: unknown kind, missing '=', a weight that is not
 * a finite number >= 0, or all weights zero. */
int mt_math_parse_mix(mt_math_opts *o, const char *spec);
/* Writes out_dir/math_train_000000.bin (more shards of <= 100M tokens if needed) and
 * out_dir/math_val_000000.bin, plus out_dir/README.txt describing the options used, and
 * the same problems as RL prompt files (data/prompts.h) math_prompts_train.tsv and
 * math_prompts_val.tsv, line i = document i of the split ("12+34=<TAB>46").
 * Errors: bad options (digits outside 1..9, multi_terms outside 2..16 or a multi-step
 * product that could exceed 18 digits, no positive weight, n_train or n_val of 0), more
 * validation problems requested than distinct problems exist (or none left for train),
 * an unwritable directory. */
int mt_math_generate(const mt_math_opts *o, const char *out_dir);

typedef struct { char prompt[64]; char answer[32]; } mt_math_problem;
/* Splits a token stream on EOT into documents; each doc "EXPR=ANSWER" (EXPR valid for
 * mt_math_eval, ANSWER an optionally negative integer) becomes a problem with prompt
 * "EXPR=" and answer "ANSWER". Docs that do not parse or do not fit are skipped. *out is
 * malloc'd (free() it; NULL when *count is 0). */
int mt_math_parse_problems(const uint32_t *tok, size_t n, mt_math_problem **out, size_t *count);
/* Evaluates EXPR (non-negative integer literals, + - *, usual precedence, left to right;
 * one trailing '=' allowed, no spaces) into *value; -1 if malformed or on 64-bit
 * overflow. Does not set mt_error: a malformed model output is an expected outcome. */
int mt_math_eval(const char *expr, long long *value);
/* 1 if the n bytes of s are an integer in canonical form -?(0|[1-9][0-9]*), "-0" excluded
 * (how the corpus writes answers), else 0. */
int mt_math_canonical(const char *s, size_t n);

#endif
