/* tests/test_reward.c — RL prompt files (data/prompts.h), the math reward (rl/reward.h),
 * group advantages (rl/advantage.h) and the prompt files `moetrain data math` writes.
 * Exits 1 with file:line on the first failure. */
#include "base/common.h"
#include "data/math.h"
#include "data/prompts.h"
#include "data/shard.h"
#include "data/tokenizer.h"
#include "rl/advantage.h"
#include "rl/reward.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define CHECK(c) do { if (!(c)) { \
    fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #c); exit(1); } } while (0)
#define CHECK_OK(e) do { if ((e) != 0) { \
    fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #e, mt_last_error()); exit(1); } } while (0)
/* e must fail (return -1) with an error message containing needle */
#define CHECK_ERR(e, needle) do { mt_error("%s", ""); if ((e) != -1) { \
    fprintf(stderr, "%s:%d: %s did not fail, expected an error\n", __FILE__, __LINE__, #e); exit(1); } \
    if (!strstr(mt_last_error(), (needle))) { \
    fprintf(stderr, "%s:%d: error \"%s\" does not mention \"%s\"\n", __FILE__, __LINE__, mt_last_error(), (needle)); \
    exit(1); } } while (0)
/* |a - b| <= 1e-6 * max(1, |b|): the float rounding of a value computed in double */
#define CHECK_NEAR(a, b) do { double a_ = (a), b_ = (b); \
    if (!(fabs(a_ - b_) <= 1e-6 * fmax(1.0, fabs(b_)))) { \
    fprintf(stderr, "%s:%d: %s = %.9g, expected %.9g\n", __FILE__, __LINE__, #a, a_, b_); exit(1); } } while (0)

static char tmp_root[512];

static void write_text(const char *path, const char *data, size_t n) {
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    CHECK(fwrite(data, 1, n, f) == n);
    CHECK(fclose(f) == 0);
}

static int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

/* completion tokens: the bytes of text, then EOT when eot is set; returns the count */
static int toks(const char *text, int eot, int32_t *out) {
    int n = 0;
    for (const char *c = text; *c; c++) out[n++] = (unsigned char)*c;
    if (eot) out[n++] = MT_BYTE_EOT;
    return n;
}

/* ---- canonical integers ---- */

static void test_canonical(void) {
    const char *good[] = {"0", "7", "10", "46", "-24", "-1", "123456789012345678"};
    const char *bad[] = {"", "-", "-0", "00", "046", "-046", "+4", "4a", " 4", "4 ", "--4", "4-", "1e3", "0x1"};
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) CHECK(mt_math_canonical(good[i], strlen(good[i])));
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) CHECK(!mt_math_canonical(bad[i], strlen(bad[i])));
    CHECK(mt_math_canonical("46x", 2)); /* only the n bytes count */
}

/* ---- the math verifier ---- */

static void test_verdict(void) {
    int32_t t[64];
    int n;
    /* correct: the bytes before the final EOT equal the answer */
    n = toks("46", 1, t);
    CHECK(mt_math_verdict(t, n, 1, "46") == MT_VERDICT_CORRECT);
    n = toks("-24", 1, t);
    CHECK(mt_math_verdict(t, n, 1, "-24") == MT_VERDICT_CORRECT);
    n = toks("0", 1, t);
    CHECK(mt_math_verdict(t, n, 1, "0") == MT_VERDICT_CORRECT);
    /* wrong, not malformed: other, non-canonical or padded answers, prefixes, extensions */
    const char *wrong[] = {"47", "046", "+46", "46 ", " 46", "4", "466", "", "46=", "-46", "4 6"};
    for (size_t i = 0; i < sizeof wrong / sizeof *wrong; i++) {
        n = toks(wrong[i], 1, t);
        CHECK(mt_math_verdict(t, n, 1, "46") == MT_VERDICT_WRONG);
    }
    n = toks("-0", 1, t);
    CHECK(mt_math_verdict(t, n, 1, "0") == MT_VERDICT_WRONG); /* -0 is not 0's canonical form */
    n = toks("24", 1, t);
    CHECK(mt_math_verdict(t, n, 1, "-24") == MT_VERDICT_WRONG);
    /* a NUL byte is a byte: compared by length, "46\0" is not "46" */
    int32_t nul[] = {'4', '6', 0, MT_BYTE_EOT};
    CHECK(mt_math_verdict(nul, 4, 1, "46") == MT_VERDICT_WRONG);
    /* bytes >= 128 compare as unsigned */
    int32_t hi[] = {0xc3, 0xa9, MT_BYTE_EOT};
    CHECK(mt_math_verdict(hi, 3, 1, "\xc3\xa9") == MT_VERDICT_CORRECT);
    CHECK(mt_math_verdict(hi, 3, 1, "\xc3\xa8") == MT_VERDICT_WRONG);

    /* malformed: stopped at max_new_tokens without EOT, even with the right bytes */
    n = toks("46", 0, t);
    CHECK(mt_math_verdict(t, n, 0, "46") == MT_VERDICT_MALFORMED);
    CHECK(mt_math_verdict(t, n, 1, "46") == MT_VERDICT_MALFORMED); /* flag says EOT, tokens do not */
    n = toks("46", 1, t);
    CHECK(mt_math_verdict(t, n, 0, "46") == MT_VERDICT_MALFORMED); /* tokens end in EOT, flag does not */
    CHECK(mt_math_verdict(t, 0, 0, "46") == MT_VERDICT_MALFORMED); /* empty (max_new_tokens 0) */
    CHECK(mt_math_verdict(t, 0, 1, "46") == MT_VERDICT_MALFORMED);
    CHECK(mt_math_verdict(NULL, 0, 0, "46") == MT_VERDICT_MALFORMED);
    /* malformed: a non-byte token other than the final EOT, wherever it is */
    int32_t mid_eot[] = {'4', MT_BYTE_EOT, '6', MT_BYTE_EOT};
    CHECK(mt_math_verdict(mid_eot, 4, 1, "46") == MT_VERDICT_MALFORMED);
    int32_t two_eot[] = {'4', '6', MT_BYTE_EOT, MT_BYTE_EOT};
    CHECK(mt_math_verdict(two_eot, 4, 1, "46") == MT_VERDICT_MALFORMED);
    int32_t first_eot[] = {MT_BYTE_EOT, '4', '6', MT_BYTE_EOT};
    CHECK(mt_math_verdict(first_eot, 4, 1, "46") == MT_VERDICT_MALFORMED);
    const int32_t nonbyte[] = {257, 300, 65535, 1 << 20, -1, INT32_MIN};
    for (size_t i = 0; i < sizeof nonbyte / sizeof *nonbyte; i++) {
        int32_t c[] = {'4', nonbyte[i], '6', MT_BYTE_EOT};
        CHECK(mt_math_verdict(c, 4, 1, "46") == MT_VERDICT_MALFORMED);
        int32_t d[] = {nonbyte[i], MT_BYTE_EOT};
        CHECK(mt_math_verdict(d, 2, 1, "46") == MT_VERDICT_MALFORMED);
    }
    int32_t last255[] = {'4', '6', 255, MT_BYTE_EOT}; /* 255 is still a byte */
    CHECK(mt_math_verdict(last255, 4, 1, "46") == MT_VERDICT_WRONG);
}

/* a custom reward: completion length, to check the plug-in path */
static float length_score(void *ctx, const int32_t *completion, int n, int stopped_at_eot, const char *answer) {
    (void)completion; (void)answer;
    return (float)n * *(const float *)ctx + (stopped_at_eot ? 0.5f : 0.0f);
}

static void test_reward(void) {
    int32_t t[64];
    int n;
    mt_reward r;
    CHECK_OK(mt_reward_init(&r, "math", 0.0f, NULL));
    CHECK(strcmp(r.name, "math") == 0 && r.score && r.ctx);
    n = toks("46", 1, t);
    CHECK(mt_reward_score(&r, t, n, 1, "46") == 1.0f);
    n = toks("47", 1, t);
    CHECK(mt_reward_score(&r, t, n, 1, "46") == 0.0f);
    n = toks("46", 0, t);
    float m = mt_reward_score(&r, t, n, 0, "46");
    CHECK(m == 0.0f && !signbit(m)); /* no penalty: +0, not -0 */
    mt_reward_free(&r);
    CHECK(r.score == NULL && r.ctx == NULL);

    CHECK_OK(mt_reward_init(&r, "math", 0.5f, NULL));
    n = toks("46", 1, t);
    CHECK(mt_reward_score(&r, t, n, 1, "46") == 1.0f);
    n = toks("046", 1, t);
    CHECK(mt_reward_score(&r, t, n, 1, "46") == 0.0f); /* wrong is not penalised */
    n = toks("46", 0, t);
    CHECK(mt_reward_score(&r, t, n, 0, "46") == -0.5f); /* no EOT */
    int32_t bad[] = {'4', 300, MT_BYTE_EOT};
    CHECK(mt_reward_score(&r, bad, 3, 1, "46") == -0.5f); /* non-byte token */
    mt_reward_free(&r);
    mt_reward_free(&r); /* twice is harmless */

    CHECK(mt_math_reward_of(MT_VERDICT_CORRECT, 2.0f) == 1.0f);
    CHECK(mt_math_reward_of(MT_VERDICT_WRONG, 2.0f) == 0.0f);
    CHECK(mt_math_reward_of(MT_VERDICT_MALFORMED, 2.0f) == -2.0f);

    CHECK_ERR(mt_reward_init(&r, "maths", 0.0f, NULL), "'maths' unknown (known: math)");
    CHECK(r.score == NULL);
    CHECK_ERR(mt_reward_init(&r, "math", -0.1f, NULL), "format penalty -0.1");
    CHECK_ERR(mt_reward_init(&r, "math", NAN, NULL), "format penalty");
    CHECK_ERR(mt_reward_init(&r, "math", INFINITY, NULL), "format penalty");

    float scale = 0.25f;
    mt_reward custom = {"length", length_score, &scale, NULL};
    CHECK(mt_reward_score(&custom, t, 4, 1, "x") == 1.5f);
    mt_reward_free(&custom); /* ctx not owned: left alone */
    CHECK(scale == 0.25f);
}

/* ---- advantages ---- */

static void test_advantage(void) {
    mt_adv_opts o;
    mt_adv_defaults(&o);
    CHECK(o.scale == 1 && o.drop_uniform_groups == 0);
    float a[16];

    /* {1,0,0,0}: mean 1/4, sample variance (9/16 + 3 * 1/16) / 3 = 1/4, std 1/2 */
    const float r1[] = {1, 0, 0, 0};
    CHECK(mt_adv_group(&o, r1, 4, a) == 0);
    CHECK_NEAR(a[0], 0.75 / (0.5 + 1e-6));
    for (int i = 1; i < 4; i++) CHECK_NEAR(a[i], -0.25 / (0.5 + 1e-6));
    CHECK_NEAR(a[0], 1.499997); /* the same, written out */
    /* {1,0}: mean 1/2, sample variance 1/2 (divides by G-1 = 1, not by G = 2) */
    const float r2[] = {1, 0};
    CHECK(mt_adv_group(&o, r2, 2, a) == 0);
    CHECK_NEAR(a[0], 0.5 / (sqrt(0.5) + 1e-6));
    CHECK_NEAR(a[1], -0.5 / (sqrt(0.5) + 1e-6));
    CHECK(fabs(a[0] - 1.0) > 0.2); /* a population std (1/2) would give 0.999998 */
    /* with a format penalty {1,-0.5,0}: mean 1/6, sum of squares 42/36, variance 21/36 */
    const float r3[] = {1, -0.5f, 0};
    CHECK(mt_adv_group(&o, r3, 3, a) == 0);
    double sd = sqrt(21.0) / 6.0;
    CHECK_NEAR(a[0], (5.0 / 6.0) / (sd + 1e-6));
    CHECK_NEAR(a[1], (-4.0 / 6.0) / (sd + 1e-6));
    CHECK_NEAR(a[2], (-1.0 / 6.0) / (sd + 1e-6));
    CHECK_NEAR(a[0], 1.0910880226);
    /* scale off: plain r - mean */
    mt_adv_opts raw = o;
    raw.scale = 0;
    CHECK(mt_adv_group(&raw, r1, 4, a) == 0);
    CHECK(a[0] == 0.75f && a[1] == -0.25f && a[2] == -0.25f && a[3] == -0.25f);
    CHECK(mt_adv_group(&raw, r3, 3, a) == 0);
    CHECK_NEAR(a[0], 5.0 / 6.0);
    CHECK_NEAR(a[1], -4.0 / 6.0);
    /* non-binary float rewards, computed in double: {0.1,0.2,0.3} has std 0.1 */
    const float r4[] = {0.1f, 0.2f, 0.3f};
    CHECK(mt_adv_group(&o, r4, 3, a) == 0);
    CHECK_NEAR(a[0], -0.1 / (0.1 + 1e-6));
    CHECK(fabs(a[1]) < 1e-6);
    CHECK_NEAR(a[2], 0.1 / (0.1 + 1e-6));
    /* a tiny but non-zero spread still scales to about +-1 (the 1e-6 keeps it finite) */
    const float r5[] = {1.0f, nextafterf(1.0f, 2.0f)};
    CHECK(mt_adv_group(&o, r5, 2, a) == 0);
    CHECK(isfinite(a[0]) && a[0] < 0 && a[1] > 0 && a[1] < 0.1f);

    /* uniform groups: exactly 0, whatever the value, scaled or not */
    const float u1[] = {1, 1, 1}, u2[] = {-0.5f, -0.5f}, u3[] = {0, 0, 0, 0};
    for (int s = 0; s < 2; s++) {
        mt_adv_opts p = o;
        p.scale = s;
        a[0] = a[1] = a[2] = a[3] = 7;
        CHECK(mt_adv_group(&p, u1, 3, a) == 1 && a[0] == 0 && a[1] == 0 && a[2] == 0);
        CHECK(mt_adv_group(&p, u2, 2, a) == 1 && a[0] == 0 && a[1] == 0);
        CHECK(mt_adv_group(&p, u3, 4, a) == 1 && a[3] == 0);
    }
    /* group sizes below 2 are refused */
    CHECK_ERR(mt_adv_group(&o, r1, 1, a), "group size 1");
    CHECK_ERR(mt_adv_group(&o, r1, 0, a), "group size 0");
    CHECK_ERR(mt_advantages(&o, r1, 4, 1, a, NULL, NULL), "at least 2 completions");
    CHECK_ERR(mt_advantages(&o, r1, 1, -3, a, NULL, NULL), "group size -3");
    CHECK_ERR(mt_advantages(&o, r1, -1, 2, a, NULL, NULL), "-1 groups");
    /* non-finite rewards are refused, naming where */
    const float nan3[] = {1, 0, 0, NAN};
    CHECK_ERR(mt_adv_group(&o, nan3, 4, a), "reward 3");
    const float inf3[] = {1, 0, 1, 0, 0, -INFINITY};
    CHECK_ERR(mt_advantages(&o, inf3, 3, 2, a, NULL, NULL), "completion 1 of group 2");

    /* several groups: layout, uniform and drop reports */
    const float rg[] = {1, 0, 0, 0,   1, 1, 1, 1,   0, 0, 0, 0,   -0.5f, 1, 0, 0};
    uint8_t uni[4], drop[4];
    CHECK_OK(mt_advantages(&o, rg, 4, 4, a, uni, drop));
    CHECK(uni[0] == 0 && uni[1] == 1 && uni[2] == 1 && uni[3] == 0);
    CHECK(drop[0] == 0 && drop[1] == 0 && drop[2] == 0 && drop[3] == 0); /* drop off */
    CHECK_NEAR(a[0], 0.75 / (0.5 + 1e-6));
    for (int i = 4; i < 12; i++) CHECK(a[i] == 0);
    float one[4];
    CHECK(mt_adv_group(&o, rg + 12, 4, one) == 0);
    CHECK(memcmp(one, a + 12, sizeof one) == 0); /* the same as the group alone */
    mt_adv_opts d = o;
    d.drop_uniform_groups = 1;
    CHECK_OK(mt_advantages(&d, rg, 4, 4, a, NULL, drop));
    CHECK(drop[0] == 0 && drop[1] == 1 && drop[2] == 1 && drop[3] == 0);
    CHECK_OK(mt_advantages(&d, NULL, 0, 4, NULL, NULL, NULL)); /* no groups */

    /* larger group: advantages sum to ~0 and have sample std ~1 when scaled */
    float big[64], ab[64];
    for (int i = 0; i < 64; i++) big[i] = mt_u01(mt_hash4(7, (uint64_t)i, 0, 0)) < 0.3f ? 1.0f : 0.0f;
    CHECK(mt_adv_group(&o, big, 64, ab) == 0);
    double s = 0, ss = 0;
    for (int i = 0; i < 64; i++) s += ab[i];
    for (int i = 0; i < 64; i++) ss += ((double)ab[i] - s / 64) * ((double)ab[i] - s / 64);
    CHECK(fabs(s) < 1e-4);
    CHECK(fabs(sqrt(ss / 63) - 1.0) < 1e-5);
}

/* ---- prompt files ---- */

static void load_err(const char *name, const char *content, int flags, const char *needle) {
    char path[700], want[900];
    snprintf(path, sizeof path, "%s/%s", tmp_root, name);
    write_text(path, content, strlen(content));
    snprintf(want, sizeof want, "%s:%s", path, needle); /* file:line: what */
    mt_prompt_set s;
    CHECK_ERR(mt_prompts_load(path, flags, &s), want);
    CHECK(s.n == 0 && s.prompt == NULL && s.text == NULL);
}

static void test_prompt_files(void) {
    char path[700];
    mt_prompt_set s;
    snprintf(path, sizeof path, "%s/good.tsv", tmp_root);
    const char good[] = "12+34=\t46\n57-81=\t-24\n3+4*5-2=\t21\n0*9=\t0"; /* last line without LF */
    write_text(path, good, strlen(good));
    CHECK_OK(mt_prompts_load(path, MT_PROMPTS_MATH, &s));
    CHECK(s.n == 4);
    CHECK(strcmp(s.prompt[0], "12+34=") == 0 && strcmp(s.answer[0], "46") == 0);
    CHECK(strcmp(s.prompt[1], "57-81=") == 0 && strcmp(s.answer[1], "-24") == 0);
    CHECK(strcmp(s.prompt[2], "3+4*5-2=") == 0 && strcmp(s.answer[2], "21") == 0);
    CHECK(strcmp(s.prompt[3], "0*9=") == 0 && strcmp(s.answer[3], "0") == 0);
    int32_t tok[32];
    CHECK(mt_prompt_ntokens(s.prompt[0]) == 7);
    CHECK(mt_prompt_encode(s.prompt[0], tok) == 7);
    const int32_t want[7] = {MT_BYTE_EOT, '1', '2', '+', '3', '4', '='};
    CHECK(memcmp(tok, want, sizeof want) == 0);
    mt_prompts_free(&s);
    mt_prompts_free(&s);
    CHECK(mt_prompt_encode("", tok) == 1 && tok[0] == MT_BYTE_EOT);

    /* without MT_PROMPTS_MATH any text is a prompt; fields keep their spaces and bytes */
    snprintf(path, sizeof path, "%s/free.tsv", tmp_root);
    const char free_text[] = "What is 2 + 2? \t 4 \n\xc3\xa9=\t046\n";
    write_text(path, free_text, strlen(free_text));
    CHECK_OK(mt_prompts_load(path, 0, &s));
    CHECK(s.n == 2 && strcmp(s.prompt[0], "What is 2 + 2? ") == 0 && strcmp(s.answer[0], " 4 ") == 0);
    CHECK(strcmp(s.answer[1], "046") == 0);
    CHECK(mt_prompt_encode(s.prompt[1], tok) == 4 && tok[1] == 0xc3 && tok[2] == 0xa9);
    mt_prompts_free(&s);

    /* one clear error naming file:line */
    load_err("notab.tsv", "1+1=\t2\n1+2=3\n", 0, "2: no TAB");
    load_err("empty_line.tsv", "1+1=\t2\n1+2=\t3\n\n4+4=\t8\n", 0, "3: empty line");
    load_err("trailing_blank.tsv", "1+1=\t2\n\n", 0, "2: empty line");
    load_err("two_tabs.tsv", "1+1=\t2\t3\n", 0, "1: answer holds a second TAB");
    load_err("empty_prompt.tsv", "1+1=\t2\n\t5\n", 0, "2: prompt is empty");
    load_err("empty_answer.tsv", "1+1=\t\n", 0, "1: answer is empty");
    load_err("crlf.tsv", "1+1=\t2\r\n", 0, "1: answer holds a CR");
    load_err("cr_prompt.tsv", "1+1=\t2\n\r1+1=\t2\n", 0, "2: prompt holds a CR");
    snprintf(path, sizeof path, "%s/nul.tsv", tmp_root);
    write_text(path, "1+1=\t2\n1+\0=\t2\n", 14);
    CHECK_ERR(mt_prompts_load(path, 0, &s), "nul.tsv:2: prompt holds a NUL");
    /* math checks */
    load_err("no_eq.tsv", "1+1=\t2\n1+1\t2\n", MT_PROMPTS_MATH, "2: prompt '1+1' is not an arithmetic");
    load_err("bad_expr.tsv", "1+=\t2\n", MT_PROMPTS_MATH, "1: prompt '1+='");
    load_err("two_eq.tsv", "1=1=\t1\n", MT_PROMPTS_MATH, "1: prompt");
    load_err("space.tsv", "1 + 1=\t2\n", MT_PROMPTS_MATH, "1: prompt");
    load_err("noncanon.tsv", "1+1=\t2\n40+6=\t046\n", MT_PROMPTS_MATH,
             "2: answer '046' is not an integer in canonical");
    load_err("minus0.tsv", "0*5=\t-0\n", MT_PROMPTS_MATH, "1: answer '-0'");
    load_err("wrong.tsv", "1+1=\t2\n2+2=\t4\n12+34=\t47\n", MT_PROMPTS_MATH, "3: answer 47 is wrong, 12+34= is 46");
    /* whole-file errors */
    snprintf(path, sizeof path, "%s/empty.tsv", tmp_root);
    write_text(path, "", 0);
    CHECK_ERR(mt_prompts_load(path, 0, &s), "empty.tsv: no prompts");
    snprintf(path, sizeof path, "%s/missing.tsv", tmp_root);
    remove(path);
    CHECK_ERR(mt_prompts_load(path, 0, &s), "missing.tsv");

    /* the writer: round trip, refuses what the loader refuses, leaves no .tmp */
    mt_prompt_writer w;
    char tmp[720];
    snprintf(path, sizeof path, "%s/written.tsv", tmp_root);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    remove(path); /* left by an earlier run */
    CHECK_OK(mt_prompt_writer_open(&w, path));
    CHECK_OK(mt_prompt_writer_add(&w, "7*13=", 5, "91", 2));
    CHECK_OK(mt_prompt_writer_add(&w, "5-9=xx", 4, "-4yy", 2)); /* lengths, not NULs, bound the fields */
    CHECK_ERR(mt_prompt_writer_add(&w, "1+1=", 4, "2\t", 2), "line 3: answer holds a second TAB");
    CHECK_ERR(mt_prompt_writer_add(&w, "", 0, "2", 1), "written.tsv: line 3: prompt is empty");
    CHECK_ERR(mt_prompt_writer_add(&w, "1\n=", 3, "2", 1), "line feed");
    CHECK(file_exists(tmp) && !file_exists(path));
    CHECK_OK(mt_prompt_writer_finish(&w));
    CHECK(!file_exists(tmp) && file_exists(path));
    mt_prompt_writer_abort(&w); /* after finish: harmless */
    CHECK_OK(mt_prompts_load(path, MT_PROMPTS_MATH, &s));
    CHECK(s.n == 2 && strcmp(s.prompt[1], "5-9=") == 0 && strcmp(s.answer[1], "-4") == 0);
    mt_prompts_free(&s);
    CHECK_OK(mt_prompt_writer_open(&w, path));
    CHECK_OK(mt_prompt_writer_add(&w, "1+1=", 4, "2", 1));
    mt_prompt_writer_abort(&w);
    CHECK(!file_exists(tmp));
    CHECK_OK(mt_prompts_load(path, 0, &s)); /* an aborted rewrite keeps the old file */
    CHECK(s.n == 2);
    mt_prompts_free(&s);
    snprintf(path, sizeof path, "%s/no/such/dir/x.tsv", tmp_root);
    CHECK_ERR(mt_prompt_writer_open(&w, path), "cannot create");
}

/* ---- the prompt files of `moetrain data math` ---- */

static int cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* Loads dir/name, checks every answer against mt_math_eval and that line i is document i
 * of the shard. */
static void load_split(const char *dir, const char *name, const char *shard, size_t expect, mt_prompt_set *s) {
    char path[1100];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    CHECK_OK(mt_prompts_load(path, MT_PROMPTS_MATH, s));
    CHECK(s->n == expect);
    for (size_t i = 0; i < s->n; i++) {
        long long v;
        char want[32];
        size_t pl = strlen(s->prompt[i]);
        CHECK(pl >= 2 && s->prompt[i][pl - 1] == '=' && strchr(s->prompt[i], '=') == s->prompt[i] + pl - 1);
        CHECK(mt_math_eval(s->prompt[i], &v) == 0);
        snprintf(want, sizeof want, "%lld", v);
        CHECK(strcmp(want, s->answer[i]) == 0);
        CHECK(mt_math_canonical(s->answer[i], strlen(s->answer[i])));
    }
    snprintf(path, sizeof path, "%s/%s", dir, shard);
    uint32_t *tok;
    size_t n;
    CHECK_OK(mt_shard_read(path, &tok, &n));
    mt_math_problem *pr;
    size_t cnt;
    CHECK_OK(mt_math_parse_problems(tok, n, &pr, &cnt));
    CHECK(cnt == expect);
    for (size_t i = 0; i < cnt; i++)
        CHECK(strcmp(pr[i].prompt, s->prompt[i]) == 0 && strcmp(pr[i].answer, s->answer[i]) == 0);
    free(pr);
    free(tok);
}

static void test_data_math_prompts(void) {
    char d1[600], d2[600], pa[1100], pb[1100];
    snprintf(d1, sizeof d1, "%s/math_a", tmp_root);
    snprintf(d2, sizeof d2, "%s/math_b", tmp_root);
    mt_math_opts o;
    mt_math_defaults(&o);
    o.n_train = 3000;
    o.n_val = 300;
    CHECK_OK(mt_math_parse_mix(&o, "add=1,sub=1,mul=1,multi=1"));
    CHECK_OK(mt_math_generate(&o, d1));
    CHECK_OK(mt_math_generate(&o, d2));
    mt_prompt_set tr, va;
    load_split(d1, "math_prompts_train.tsv", "math_train_000000.bin", 3000, &tr);
    load_split(d1, "math_prompts_val.tsv", "math_val_000000.bin", 300, &va);
    /* held out: no validation prompt is a training prompt; validation prompts distinct */
    const char **sorted = mt_xmalloc(tr.n * sizeof *sorted);
    memcpy(sorted, tr.prompt, tr.n * sizeof *sorted);
    qsort(sorted, tr.n, sizeof *sorted, cmp_str);
    for (size_t i = 0; i < va.n; i++) CHECK(!bsearch(&va.prompt[i], sorted, tr.n, sizeof *sorted, cmp_str));
    free(sorted);
    sorted = mt_xmalloc(va.n * sizeof *sorted);
    memcpy(sorted, va.prompt, va.n * sizeof *sorted);
    qsort(sorted, va.n, sizeof *sorted, cmp_str);
    for (size_t i = 1; i < va.n; i++) CHECK(strcmp(sorted[i - 1], sorted[i]) != 0);
    free(sorted);
    int neg = 0;
    for (size_t i = 0; i < tr.n; i++) neg += tr.answer[i][0] == '-';
    CHECK(neg > 100); /* sub and multi give negative answers */

    /* the reward of a completion that is the expected answer: 1; fed prompts start with EOT */
    mt_reward r;
    CHECK_OK(mt_reward_init(&r, "math", 1.0f, NULL));
    int32_t tok[64];
    for (size_t i = 0; i < va.n; i++) {
        int n = toks(va.answer[i], 1, tok);
        CHECK(mt_reward_score(&r, tok, n, 1, va.answer[i]) == 1.0f);
        CHECK(mt_reward_score(&r, tok, n - 1, 0, va.answer[i]) == -1.0f);
        size_t np = mt_prompt_encode(va.prompt[i], tok);
        CHECK(np == mt_prompt_ntokens(va.prompt[i]) && tok[0] == MT_BYTE_EOT && tok[np - 1] == '=');
    }
    mt_reward_free(&r);
    mt_prompts_free(&tr);
    mt_prompts_free(&va);

    /* deterministic, written atomically (no .tmp left) */
    const char *files[2] = {"math_prompts_train.tsv", "math_prompts_val.tsv"};
    for (int f = 0; f < 2; f++) {
        char *a, *b;
        size_t la, lb;
        snprintf(pa, sizeof pa, "%s/%s", d1, files[f]);
        snprintf(pb, sizeof pb, "%s/%s", d2, files[f]);
        CHECK_OK(mt_read_file(pa, &a, &la));
        CHECK_OK(mt_read_file(pb, &b, &lb));
        CHECK(la == lb && memcmp(a, b, la) == 0);
        free(a);
        free(b);
        snprintf(pa, sizeof pa, "%s/%s.tmp", d1, files[f]);
        CHECK(!file_exists(pa));
    }

    /* the tiny space: all 1-digit additions; train repeats its problems, never a val one */
    mt_math_defaults(&o);
    o.max_digits = 1;
    o.n_val = 60;
    o.n_train = 500;
    CHECK_OK(mt_math_generate(&o, d1));
    load_split(d1, "math_prompts_train.tsv", "math_train_000000.bin", 500, &tr);
    load_split(d1, "math_prompts_val.tsv", "math_val_000000.bin", 60, &va);
    for (size_t i = 0; i < va.n; i++)
        for (size_t j = 0; j < tr.n; j++) CHECK(strcmp(va.prompt[i], tr.prompt[j]) != 0);
    mt_prompts_free(&tr);
    mt_prompts_free(&va);
}

int main(void) {
    const char *env = getenv("MT_TEST_TMP");
    snprintf(tmp_root, sizeof tmp_root, "%s/test_reward", env && *env ? env : "/tmp/mt_test_reward");
    CHECK_OK(mt_mkdir_p(tmp_root));
    test_canonical();
    test_verdict();
    test_reward();
    test_advantage();
    test_prompt_files();
    test_data_math_prompts();
    printf("test_reward: all passed\n");
    return 0;
}
