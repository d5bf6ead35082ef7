/* tests/test_data.c — token shards, the loader, the byte tokenizer, the synthetic math
 * corpus and text-to-shard conversion. Exits 1 with file:line on the first failure. */
#include "base/common.h"
#include "data/loader.h"
#include "data/math.h"
#include "data/prompts.h"
#include "data/shard.h"
#include "data/text.h"
#include "data/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define CHECK(c) do { if (!(c)) { \
    fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #c); exit(1); } } while (0)
#define CHECK_OK(e) do { if ((e) != 0) { \
    fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #e, mt_last_error()); exit(1); } } while (0)
/* e must fail with an error message containing needle */
#define CHECK_ERR(e, needle) do { mt_error("%s", ""); if ((e) == 0) { \
    fprintf(stderr, "%s:%d: %s succeeded, expected an error\n", __FILE__, __LINE__, #e); exit(1); } \
    if (!strstr(mt_last_error(), (needle))) { \
    fprintf(stderr, "%s:%d: error \"%s\" does not mention \"%s\"\n", __FILE__, __LINE__, mt_last_error(), (needle)); \
    exit(1); } } while (0)

static char tmp_root[512];

/* buf <- tmp_root/name */
static char *tpath(char *buf, size_t cap, const char *name) {
    snprintf(buf, cap, "%s/%s", tmp_root, name);
    return buf;
}

static void write_raw(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    CHECK(fwrite(data, 1, n, f) == n);
    CHECK(fclose(f) == 0);
}

static uint32_t le32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void put_le32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

/* ---- shards ---- */

static void check_shard_file(const char *path, const uint32_t *tok, size_t n, int width) {
    char *raw;
    size_t len;
    CHECK_OK(mt_read_file(path, &raw, &len));
    const unsigned char *u = (const unsigned char *)raw;
    CHECK(len == 1024 + n * (size_t)width);
    CHECK(le32(u) == (width == 2 ? 20240520u : 20240801u));
    CHECK(le32(u + 4) == (width == 2 ? 1u : 7u));
    CHECK(le32(u + 8) == n);
    for (int i = 3; i < 256; i++) CHECK(le32(u + 4 * i) == 0);
    for (size_t i = 0; i < n; i++) {
        const unsigned char *p = u + 1024 + i * (size_t)width;
        uint32_t v = width == 2 ? (uint32_t)p[0] | (uint32_t)p[1] << 8 : le32(p);
        CHECK(v == tok[i]);
    }
    free(raw);
    uint32_t *back;
    size_t nb;
    CHECK_OK(mt_shard_read(path, &back, &nb));
    CHECK(nb == n);
    CHECK(n == 0 || memcmp(back, tok, n * sizeof *tok) == 0);
    free(back);
}

static void test_shard_roundtrip(void) {
    char p[1024];
    uint32_t t16[] = {256, 0, 65535, 1, 255, 12345, 256};
    CHECK_OK(mt_shard_write(tpath(p, sizeof p, "s16.bin"), t16, 7));
    check_shard_file(p, t16, 7, 2);
    uint32_t t32[] = {256, 65536, 0, 4000000000u, 7};
    CHECK_OK(mt_shard_write(tpath(p, sizeof p, "s32.bin"), t32, 5));
    check_shard_file(p, t32, 5, 4);
    CHECK_OK(mt_shard_write(tpath(p, sizeof p, "s0.bin"), NULL, 0));
    check_shard_file(p, NULL, 0, 2);
    CHECK(!file_exists(tpath(p, sizeof p, "s16.bin.tmp")));
}

/* A file laid out exactly as llm.c's dev/data scripts write it (numpy <i4 header, <u2 or
 * <u4 tokens), built byte by byte here. */
static void test_llmc_format(void) {
    char p[1024];
    unsigned char buf[1024 + 4 * 6];
    memset(buf, 0, sizeof buf);
    put_le32(buf, 20240520); put_le32(buf + 4, 1); put_le32(buf + 8, 6);
    const uint16_t gpt2[6] = {50256, 15496, 11, 995, 0, 50256};
    for (int i = 0; i < 6; i++) { buf[1024 + 2 * i] = (unsigned char)gpt2[i]; buf[1025 + 2 * i] = (unsigned char)(gpt2[i] >> 8); }
    write_raw(tpath(p, sizeof p, "llmc_gpt2.bin"), buf, 1024 + 12);
    uint32_t *tok;
    size_t n;
    CHECK_OK(mt_shard_read(p, &tok, &n));
    CHECK(n == 6);
    for (int i = 0; i < 6; i++) CHECK(tok[i] == gpt2[i]);
    free(tok);

    memset(buf, 0, sizeof buf);
    put_le32(buf, 20240801); put_le32(buf + 4, 7); put_le32(buf + 8, 6);
    const uint32_t llama3[6] = {128000, 9906, 1917, 0, 128255, 128000};
    for (int i = 0; i < 6; i++) put_le32(buf + 1024 + 4 * i, llama3[i]);
    write_raw(tpath(p, sizeof p, "llmc_llama3.bin"), buf, sizeof buf);
    CHECK_OK(mt_shard_read(p, &tok, &n));
    CHECK(n == 6);
    CHECK(memcmp(tok, llama3, sizeof llama3) == 0);
    free(tok);
}

static void test_shard_errors(void) {
    char p[1024];
    uint32_t *tok = NULL;
    size_t n = 0;
    unsigned char buf[1024 + 20];
    memset(buf, 0, sizeof buf);
    put_le32(buf, 20240520); put_le32(buf + 4, 1); put_le32(buf + 8, 10);

    write_raw(tpath(p, sizeof p, "trunc.bin"), buf, 100);
    CHECK_ERR(mt_shard_read(p, &tok, &n), p);
    CHECK(strstr(mt_last_error(), "shorter"));

    write_raw(tpath(p, sizeof p, "mismatch.bin"), buf, 1024 + 18); /* 9 tokens, header says 10 */
    CHECK_ERR(mt_shard_read(p, &tok, &n), p);
    CHECK(strstr(mt_last_error(), "10 tokens"));
    write_raw(p, buf, 1024 + 20 + 0); /* 10 tokens: fine */
    CHECK_OK(mt_shard_read(p, &tok, &n));
    CHECK(n == 10);
    free(tok);

    put_le32(buf, 20240801); /* uint32 magic with uint16 version */
    write_raw(tpath(p, sizeof p, "magic.bin"), buf, 1024 + 20);
    CHECK_ERR(mt_shard_read(p, &tok, &n), p);
    CHECK(strstr(mt_last_error(), "magic"));
    put_le32(buf, 12345); put_le32(buf + 4, 1);
    write_raw(p, buf, 1024 + 20);
    CHECK_ERR(mt_shard_read(p, &tok, &n), p);

    put_le32(buf, 20240520); put_le32(buf + 8, 0xffffffffu); /* negative count */
    write_raw(tpath(p, sizeof p, "negative.bin"), buf, 1024);
    CHECK_ERR(mt_shard_read(p, &tok, &n), p);

    CHECK_ERR(mt_shard_read(tpath(p, sizeof p, "no_such_shard.bin"), &tok, &n), p);
    CHECK_ERR(mt_shard_write(tpath(p, sizeof p, "no_such_dir/x.bin"), NULL, 0),
              "no_such_dir");
}

/* ---- tokenizer ---- */

static void test_byte_tokenizer(void) {
    const char *s = "h\xc3\xa9!";
    uint32_t tok[8];
    CHECK(mt_byte_encode(s, 4, tok) == 4);
    CHECK(tok[0] == 'h' && tok[1] == 0xc3 && tok[2] == 0xa9 && tok[3] == '!');
    uint32_t mixed[6] = {MT_BYTE_EOT, 'a', 0xc3, 0xa9, 300, MT_BYTE_EOT};
    char out[8];
    CHECK(mt_byte_decode(mixed, 6, out, sizeof out) == 4);
    CHECK(strcmp(out, "a\xc3\xa9?") == 0);
    memset(out, 'x', sizeof out);
    CHECK(mt_byte_decode(mixed, 6, out, 2) == 2);
    CHECK(out[0] == 'a' && (unsigned char)out[1] == 0xc3 && out[2] == 'x');
    CHECK(MT_BYTE_VOCAB == 257 && MT_BYTE_EOT == 256);
}

/* ---- loader ---- */

/* Shard whose token k is base + k, so every window has a unique first token. */
static void write_seq_shard(const char *path, uint32_t base, size_t n) {
    uint32_t *t = mt_xmalloc(n * sizeof *t);
    for (size_t k = 0; k < n; k++) t[k] = base + (uint32_t)k;
    CHECK_OK(mt_shard_write(path, t, n));
    free(t);
}

static void test_loader(void) {
    char dir[1024], p[1100];
    tpath(dir, sizeof dir, "loader");
    CHECK_OK(mt_mkdir_p(dir));
    const int T = 8;
    snprintf(p, sizeof p, "%s/d_train_000001.bin", dir); write_seq_shard(p, 1000, 30);  /* 3 windows */
    snprintf(p, sizeof p, "%s/d_train_000000.bin", dir); write_seq_shard(p, 0, 8 * 5 + 1); /* 5 windows */
    snprintf(p, sizeof p, "%s/d_train_000002.bin", dir); write_seq_shard(p, 2000, 8);  /* too short */
    snprintf(p, sizeof p, "%s/d_val_000000.bin", dir); write_seq_shard(p, 3000, 17);
    snprintf(p, sizeof p, "%s/notes_train.txt", dir); write_raw(p, "x", 1);

    mt_loader *L, *L2, *L3;
    CHECK_OK(mt_loader_open(&L, dir, "train", T, 42));
    CHECK(mt_loader_windows(L) == 8);
    CHECK(mt_loader_tokens(L) == 41 + 30 + 8);
    CHECK(mt_loader_max_token(L) == 2007);
    uint64_t nall;
    const uint32_t *all = mt_loader_all_tokens(L, &nall);
    CHECK(nall == 79 && all[0] == 0 && all[41] == 1000 && all[71] == 2000); /* sorted by name */

    int32_t in[16 * 8], tg[16 * 8], in2[16 * 8], tg2[16 * 8];
    /* file order windows */
    const int32_t first_of[8] = {0, 8, 16, 24, 32, 1000, 1008, 1016};
    for (int w = 0; w < 8; w++) {
        mt_loader_window(L, (uint64_t)w, in, tg);
        CHECK(in[0] == first_of[w]);
        for (int t = 0; t < T; t++) { CHECK(in[t] == first_of[w] + t); CHECK(tg[t] == in[t] + 1); }
    }
    /* every window exactly once per epoch; epochs differ */
    int32_t order[3][8];
    for (int e = 0; e < 3; e++) {
        int seen[8] = {0};
        mt_loader_batch(L, (uint64_t)e * 8, 8, in, tg);
        for (int b = 0; b < 8; b++) {
            int w = -1;
            for (int k = 0; k < 8; k++) if (first_of[k] == in[b * T]) w = k;
            CHECK(w >= 0);
            seen[w]++;
            order[e][b] = in[b * T];
            for (int t = 0; t < T; t++) CHECK(tg[b * T + t] == in[b * T + t] + 1);
        }
        for (int k = 0; k < 8; k++) CHECK(seen[k] == 1);
    }
    CHECK(memcmp(order[0], order[1], sizeof order[0]) != 0 || memcmp(order[1], order[2], sizeof order[0]) != 0);
    /* same (seed, index) -> same sample, whatever the call order or loader instance */
    mt_loader_batch(L, 5, 16, in, tg);
    CHECK_OK(mt_loader_open(&L2, dir, "train", T, 42));
    for (int b = 15; b >= 0; b--) mt_loader_batch(L2, 5 + (uint64_t)b, 1, in2 + b * T, tg2 + b * T);
    CHECK(memcmp(in, in2, sizeof in) == 0 && memcmp(tg, tg2, sizeof tg) == 0);
    mt_loader_batch(L2, 1000000, 2, in2, tg2); /* far ahead, then back */
    mt_loader_batch(L2, 5, 16, in2, tg2);
    CHECK(memcmp(in, in2, sizeof in) == 0);
    /* another seed -> another order */
    CHECK_OK(mt_loader_open(&L3, dir, "train", T, 43));
    int differs = 0;
    for (int e = 0; e < 3 && !differs; e++) {
        mt_loader_batch(L3, (uint64_t)e * 8, 8, in2, tg2);
        for (int b = 0; b < 8; b++) differs |= in2[b * T] != order[e][b];
    }
    CHECK(differs);
    mt_loader_free(L);
    mt_loader_free(L2);
    mt_loader_free(L3);

    /* val split and a single-file path */
    CHECK_OK(mt_loader_open(&L, dir, "val", T, 1));
    CHECK(mt_loader_windows(L) == 2 && mt_loader_tokens(L) == 17);
    mt_loader_free(L);
    snprintf(p, sizeof p, "%s/d_train_000001.bin", dir);
    CHECK_OK(mt_loader_open(&L, p, "train", T, 1));
    CHECK(mt_loader_windows(L) == 3);
    mt_loader_free(L);

    /* errors */
    CHECK_ERR(mt_loader_open(&L, dir, "test", T, 1), dir);
    CHECK(strstr(mt_last_error(), "test"));
    CHECK_ERR(mt_loader_open(&L, dir, "val", 17, 1), "val"); /* 17 tokens < T+1 */
    snprintf(p, sizeof p, "%s/no_such_dir", dir);
    CHECK_ERR(mt_loader_open(&L, p, "train", T, 1), p);
    snprintf(p, sizeof p, "%s/bad_train.bin", dir);
    write_raw(p, "garbage", 7);
    CHECK_ERR(mt_loader_open(&L, dir, "train", T, 1), p);
    remove(p);

    /* a bigger epoch is a permutation too */
    tpath(p, sizeof p, "big_train_000000.bin"); /* outside dir: it would join its split */
    write_seq_shard(p, 0, 1001 * 4 + 1);
    CHECK_OK(mt_loader_open(&L, p, "train", 4, 7));
    uint64_t W = mt_loader_windows(L);
    CHECK(W == 1001);
    char *hit = mt_xcalloc(W, 1);
    int32_t *bi = mt_xmalloc(W * 4 * sizeof *bi), *bt = mt_xmalloc(W * 4 * sizeof *bt);
    mt_loader_batch(L, 3 * W, (int)W, bi, bt);
    int fixed = 0;
    for (uint64_t b = 0; b < W; b++) {
        CHECK(bi[b * 4] % 4 == 0);
        uint64_t w = (uint64_t)bi[b * 4] / 4;
        CHECK(w < W && !hit[w]);
        hit[w] = 1;
        fixed += w == b;
    }
    CHECK(fixed < 20); /* a shuffle, not the identity */
    free(hit); free(bi); free(bt);
    mt_loader_free(L);
}

/* ---- math ---- */

static void test_math_eval(void) {
    long long v;
    CHECK(mt_math_eval("3+4*5-2", &v) == 0 && v == 21);
    CHECK(mt_math_eval("3+4*5-2=", &v) == 0 && v == 21);
    CHECK(mt_math_eval("57-81", &v) == 0 && v == -24);
    CHECK(mt_math_eval("2*3*4-30", &v) == 0 && v == -6);
    CHECK(mt_math_eval("10-2-3", &v) == 0 && v == 5);
    CHECK(mt_math_eval("0", &v) == 0 && v == 0);
    const char *bad[] = {"", "1+", "+1", "-1", "1 + 2", "1**2", "1==", "2=3", "a", "9999999999*9999999999",
                         "99999999999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) CHECK(mt_math_eval(bad[i], &v) != 0);
}

static void test_math_mix(void) {
    mt_math_opts o;
    mt_math_defaults(&o);
    CHECK(o.seed == 1 && o.n_train == 200000 && o.n_val == 2000 && o.min_digits == 1 && o.max_digits == 2);
    CHECK(o.w_add == 1 && o.w_sub == 0 && o.w_mul == 0 && o.w_multi == 0 && o.multi_terms == 3);
    CHECK_OK(mt_math_parse_mix(&o, "add=1,sub=1,mul=0.5,multi=0"));
    CHECK(o.w_add == 1 && o.w_sub == 1 && o.w_mul == 0.5 && o.w_multi == 0);
    CHECK_OK(mt_math_parse_mix(&o, "multi=2"));
    CHECK(o.w_add == 0 && o.w_sub == 0 && o.w_mul == 0 && o.w_multi == 2);
    CHECK_ERR(mt_math_parse_mix(&o, "add=1,div=2"), "div=2");
    CHECK_ERR(mt_math_parse_mix(&o, "add"), "'add'");
    CHECK_ERR(mt_math_parse_mix(&o, "add=-1"), "add=-1");
    CHECK_ERR(mt_math_parse_mix(&o, "sub=x"), "sub=x");
    CHECK_ERR(mt_math_parse_mix(&o, "add=1e999"), "add=1e999");
    CHECK_ERR(mt_math_parse_mix(&o, "add=0,sub=0"), "weight 0");
    CHECK(o.w_multi == 2 && o.w_add == 0); /* unchanged by failures */
}

static void check_problem(const mt_math_problem *pr) {
    long long v;
    size_t pl = strlen(pr->prompt);
    CHECK(pl >= 2 && pr->prompt[pl - 1] == '=');
    CHECK(mt_math_eval(pr->prompt, &v) == 0);
    CHECK(v == atoll(pr->answer));
}

static int cmp_text(const void *a, const void *b) { return strcmp(a, b); }

/* Problems (prompt+answer texts, sorted) of one split file; checks the shard layout. */
static char (*load_problems(const char *path, size_t expect))[96] {
    uint32_t *tok;
    size_t n;
    CHECK_OK(mt_shard_read(path, &tok, &n));
    CHECK(n > 0 && tok[0] == MT_BYTE_EOT);
    size_t docs = 0;
    for (size_t i = 0; i < n; i++) docs += tok[i] == MT_BYTE_EOT;
    CHECK(docs == expect);
    mt_math_problem *pr;
    size_t cnt;
    CHECK_OK(mt_math_parse_problems(tok, n, &pr, &cnt));
    CHECK(cnt == expect); /* every document parses */
    char (*texts)[96] = mt_xmalloc(cnt * sizeof *texts);
    for (size_t i = 0; i < cnt; i++) {
        check_problem(&pr[i]);
        snprintf(texts[i], sizeof texts[i], "%s%s", pr[i].prompt, pr[i].answer);
    }
    free(pr);
    free(tok);
    qsort(texts, cnt, sizeof *texts, cmp_text);
    return texts;
}

static int files_equal(const char *a, const char *b) {
    char *da, *db;
    size_t la, lb;
    CHECK_OK(mt_read_file(a, &da, &la));
    CHECK_OK(mt_read_file(b, &db, &lb));
    int eq = la == lb && memcmp(da, db, la) == 0;
    free(da);
    free(db);
    return eq;
}

static void test_math_generate(void) {
    char d1[1024], d2[1024], d3[1024], pa[1100], pb[1100];
    mt_math_opts o;
    mt_math_defaults(&o);
    o.n_train = 3000;
    o.n_val = 300;
    CHECK_OK(mt_math_parse_mix(&o, "add=1,sub=1,mul=1,multi=1"));
    CHECK_OK(mt_math_generate(&o, tpath(d1, sizeof d1, "math1")));
    CHECK_OK(mt_math_generate(&o, tpath(d2, sizeof d2, "math2")));
    o.seed = 2;
    CHECK_OK(mt_math_generate(&o, tpath(d3, sizeof d3, "math3")));
    snprintf(pa, sizeof pa, "%s/README.txt", d1);
    CHECK(file_exists(pa));
    snprintf(pa, sizeof pa, "%s/math_train_000001.bin", d1);
    CHECK(!file_exists(pa));
    const char *files[2] = {"math_train_000000.bin", "math_val_000000.bin"};
    for (int f = 0; f < 2; f++) {
        snprintf(pa, sizeof pa, "%s/%s", d1, files[f]);
        snprintf(pb, sizeof pb, "%s/%s", d2, files[f]);
        CHECK(files_equal(pa, pb));
        snprintf(pb, sizeof pb, "%s/%s", d3, files[f]);
        CHECK(!files_equal(pa, pb));
    }
    snprintf(pa, sizeof pa, "%s/math_train_000000.bin", d1);
    char (*train)[96] = load_problems(pa, 3000);
    snprintf(pa, sizeof pa, "%s/math_val_000000.bin", d1);
    char (*val)[96] = load_problems(pa, 300);
    int kinds[4] = {0};
    for (size_t i = 0; i < 3000; i++) {
        CHECK(!bsearch(train[i], val, 300, sizeof *val, cmp_text)); /* disjoint */
        int ops = 0;
        for (const char *c = train[i]; *c != '='; c++) ops += (*c == '+' || *c == '-' || *c == '*') && c != train[i];
        if (ops == 2) kinds[3]++;
        else { CHECK(ops == 1); kinds[strchr(train[i], '*') ? 2 : strchr(train[i], '+') ? 0 : 1]++; }
    }
    for (int k = 0; k < 4; k++) CHECK(kinds[k] > 500); /* roughly 750 each */
    for (size_t i = 1; i < 300; i++) CHECK(strcmp(val[i - 1], val[i]) != 0); /* val distinct */
    free(train);
    free(val);

    /* a tiny space: 1-digit additions, 100 problems */
    mt_math_defaults(&o);
    o.max_digits = 1;
    o.n_val = 60;
    o.n_train = 500;
    CHECK_OK(mt_math_generate(&o, d1));
    snprintf(pa, sizeof pa, "%s/math_train_000000.bin", d1);
    train = load_problems(pa, 500);
    snprintf(pa, sizeof pa, "%s/math_val_000000.bin", d1);
    val = load_problems(pa, 60);
    size_t distinct = 1;
    for (size_t i = 0; i < 500; i++) {
        CHECK(!bsearch(train[i], val, 60, sizeof *val, cmp_text));
        distinct += i > 0 && strcmp(train[i - 1], train[i]) != 0;
    }
    CHECK(distinct == 40); /* all the non-validation problems, with repeats */
    free(train);
    free(val);
    o.n_val = 100;
    CHECK_ERR(mt_math_generate(&o, d1), "none left");
    o.n_val = 101;
    CHECK_ERR(mt_math_generate(&o, d1), "only 100 distinct");
    o.n_val = 10;
    o.max_digits = 10;
    CHECK_ERR(mt_math_generate(&o, d1), "digits");
    o.max_digits = 7;
    o.w_multi = 1;
    CHECK_ERR(mt_math_generate(&o, d1), "overflow");
    o.multi_terms = 1;
    CHECK_ERR(mt_math_generate(&o, d1), "multi_terms");
}

/* --slip: the training text forgets the ones carry of a share of the additions; the prompt
 * files (the verifier's answers) and the validation split stay exact. */
static void test_math_slip(void) {
    char d1[1024], pa[1100];
    mt_math_opts o;
    mt_math_defaults(&o);
    o.n_train = 4000;
    o.n_val = 200;
    o.min_digits = 2;
    CHECK_OK(mt_math_parse_mix(&o, "add=1,sub=1"));
    o.slip = 0.6;
    CHECK_OK(mt_math_generate(&o, tpath(d1, sizeof d1, "slip")));
    uint32_t *tok;
    size_t n, cnt;
    mt_math_problem *pr;
    snprintf(pa, sizeof pa, "%s/math_train_000000.bin", d1);
    CHECK_OK(mt_shard_read(pa, &tok, &n));
    CHECK_OK(mt_math_parse_problems(tok, n, &pr, &cnt));
    CHECK(cnt == 4000);
    mt_prompt_set ps;
    snprintf(pa, sizeof pa, "%s/math_prompts_train.tsv", d1);
    CHECK_OK(mt_prompts_load(pa, MT_PROMPTS_MATH, &ps)); /* every answer true */
    CHECK(ps.n == 4000);
    size_t carries = 0, slipped = 0, subs = 0;
    for (size_t i = 0; i < cnt; i++) {
        long long v, x, y;
        CHECK(strcmp(pr[i].prompt, ps.prompt[i]) == 0);
        CHECK(mt_math_eval(pr[i].prompt, &v) == 0);
        long long a = atoll(pr[i].answer);
        if (sscanf(pr[i].prompt, "%lld+%lld=", &x, &y) == 2 && x % 10 + y % 10 >= 10) {
            carries++;
            CHECK(a == v || a == v - 10);
            slipped += a == v - 10;
        } else {
            subs += strchr(pr[i].prompt, '-') != NULL;
            CHECK(a == v); /* no ones carry, or a subtraction: written exactly */
        }
    }
    CHECK(subs > 1500 && carries > 700);
    CHECK(slipped > carries / 2 && slipped < carries * 7 / 10); /* ~60% */
    mt_prompts_free(&ps);
    free(pr);
    free(tok);
    snprintf(pa, sizeof pa, "%s/math_val_000000.bin", d1);
    free(load_problems(pa, 200)); /* checks every validation answer */

    o.slip = 1.5;
    CHECK_ERR(mt_math_generate(&o, d1), "slip 1.5");
    o.slip = 0.5;
    CHECK_OK(mt_math_parse_mix(&o, "sub=1"));
    CHECK_ERR(mt_math_generate(&o, d1), "has none");
}

static void test_math_parse(void) {
    const char *docs[] = {"12+34=46", "garbage", "5-9=-4", "1+=2", "3*3=9=9", "7*13=91", "", "2+2=-"};
    uint32_t tok[128];
    size_t n = 0;
    for (size_t d = 0; d < sizeof docs / sizeof *docs; d++) {
        tok[n++] = MT_BYTE_EOT;
        n += mt_byte_encode(docs[d], strlen(docs[d]), tok + n);
    }
    tok[n++] = 300; /* a non-byte token spoils its document */
    n += mt_byte_encode("1+1=2", 5, tok + n);
    mt_math_problem *pr;
    size_t cnt;
    CHECK_OK(mt_math_parse_problems(tok, n, &pr, &cnt));
    CHECK(cnt == 3);
    CHECK(strcmp(pr[0].prompt, "12+34=") == 0 && strcmp(pr[0].answer, "46") == 0);
    CHECK(strcmp(pr[1].prompt, "5-9=") == 0 && strcmp(pr[1].answer, "-4") == 0);
    CHECK(strcmp(pr[2].prompt, "7*13=") == 0 && strcmp(pr[2].answer, "91") == 0);
    free(pr);
    CHECK_OK(mt_math_parse_problems(tok, 0, &pr, &cnt));
    CHECK(cnt == 0);
    free(pr);
}

/* ---- text ---- */

static size_t read_split(const char *dir, const char *name, int nshards, size_t max_tokens, uint32_t *out) {
    char p[1100];
    size_t total = 0;
    for (int i = 0; i < nshards; i++) {
        snprintf(p, sizeof p, "%s/%s_%06d.bin", dir, name, i);
        uint32_t *tok;
        size_t n;
        CHECK_OK(mt_shard_read(p, &tok, &n));
        CHECK(n <= max_tokens && n > 0);
        memcpy(out + total, tok, n * sizeof *tok);
        total += n;
        free(tok);
    }
    snprintf(p, sizeof p, "%s/%s_%06d.bin", dir, name, nshards);
    CHECK(!file_exists(p));
    return total;
}

static void test_text(void) {
    char dir[1024], fa[1100], fb[1100], fc[1100];
    tpath(dir, sizeof dir, "text");
    CHECK_OK(mt_mkdir_p(dir));
    snprintf(fa, sizeof fa, "%s/a.txt", dir); write_raw(fa, "hello", 5);
    snprintf(fb, sizeof fb, "%s/b.txt", dir); write_raw(fb, "world, again", 12);
    snprintf(fc, sizeof fc, "%s/c.txt", dir); write_raw(fc, "val!", 4);
    const char *files[3] = {fa, fb, fc};
    char out[1100];
    snprintf(out, sizeof out, "%s/out", dir);
    uint32_t got[256], want[64];
    size_t k = 0;
    want[k++] = MT_BYTE_EOT; k += mt_byte_encode("hello", 5, want + k);
    want[k++] = MT_BYTE_EOT; k += mt_byte_encode("world, again", 12, want + k);
    /* 4-token shards: documents split across 2 + 4 shards */
    CHECK_OK(mt_text_to_shards(files, 3, out, 0.2, 4, NULL));
    size_t n = read_split(out, "text_train", 6, 4, got);
    CHECK(n == k && memcmp(got, want, k * sizeof *got) == 0);
    /* 16-token shards: EOT hello | EOT world, again; the 4 stale shards are removed */
    CHECK_OK(mt_text_to_shards(files, 3, out, 0.2, 16, NULL));
    n = read_split(out, "text_train", 2, 16, got);
    CHECK(n == k && memcmp(got, want, k * sizeof *got) == 0);
    n = read_split(out, "text_val", 1, 10, got);
    CHECK(n == 5 && got[0] == MT_BYTE_EOT && got[1] == 'v' && got[4] == '!');
    mt_loader *L;
    CHECK_OK(mt_loader_open(&L, out, "train", 4, 1));
    CHECK(mt_loader_tokens(L) == k && mt_loader_max_token(L) == MT_BYTE_EOT);
    mt_loader_free(L);

    /* one file: its last 10% of bytes (at a UTF-8 boundary) is the validation document */
    char big[100];
    for (int i = 0; i < 100; i++) big[i] = (char)('a' + i % 26);
    memcpy(big + 89, "\xe2\x82\xac", 3); /* a 3-byte character straddling the 90% mark */
    write_raw(fa, big, 100);
    CHECK_OK(mt_text_to_shards(files, 1, out, 0.1, 0, NULL));
    n = read_split(out, "text_train", 1, 200, got);
    CHECK(n == 93 && got[0] == MT_BYTE_EOT && got[92] == 0xac);
    n = read_split(out, "text_val", 1, 200, got);
    CHECK(n == 9 && got[0] == MT_BYTE_EOT && got[1] == (uint32_t)big[92]);
    /* no validation */
    CHECK_OK(mt_text_to_shards(files, 3, out, 0, 0, NULL));
    snprintf(fb, sizeof fb, "%.1000s/text_val_000000.bin", out);
    CHECK(!file_exists(fb));

    /* errors */
    snprintf(fb, sizeof fb, "%s/missing.txt", dir);
    files[1] = fb;
    CHECK_ERR(mt_text_to_shards(files, 3, out, 0.2, 0, NULL), fb);
    CHECK_ERR(mt_text_to_shards(files, 3, out, 1.0, 0, NULL), "fraction");
    CHECK_ERR(mt_text_to_shards(files, 0, out, 0.1, 0, NULL), out);
}

/* Split names are whole words of a file name: "eval_train.bin" is train data, not val. */
static void test_split_names(void) {
    char dir[600], p[700];
    snprintf(dir, sizeof dir, "%s/splits", tmp_root);
    CHECK_OK(mt_mkdir_p(dir));
    snprintf(p, sizeof p, "%s/fineweb_val_000000.bin", dir);
    remove(p); /* left by an earlier run */
    uint32_t t[4] = {1, 2, 3, 4};
    snprintf(p, sizeof p, "%s/eval_train.bin", dir);
    CHECK_OK(mt_shard_write(p, t, 4));
    CHECK(mt_loader_has_split(dir, "train") == 1);
    CHECK(mt_loader_has_split(dir, "val") == 0);
    snprintf(p, sizeof p, "%s/fineweb_val_000000.bin", dir);
    CHECK_OK(mt_shard_write(p, t, 4));
    CHECK(mt_loader_has_split(dir, "val") == 1);
    CHECK(mt_loader_has_split(p, "val") == 0); /* a single file has no separate split */
}

int main(void) {
    const char *env = getenv("MT_TEST_TMP");
    snprintf(tmp_root, sizeof tmp_root, "%s/test_data", env && *env ? env : "/tmp/mt_test_data");
    CHECK_OK(mt_mkdir_p(tmp_root));
    test_shard_roundtrip();
    test_llmc_format();
    test_shard_errors();
    test_byte_tokenizer();
    test_loader();
    test_math_eval();
    test_math_mix();
    test_math_parse();
    test_math_generate();
    test_math_slip();
    test_text();
    test_split_names();
    printf("test_data: all checks passed\n");
    return 0;
}
