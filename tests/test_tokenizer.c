/* tests/test_tokenizer.c — the tokenizer.json BPE on a vocabulary written here by hand:
 * exact ids of merges by rank, added tokens, both merge forms, Split pre-tokenizers,
 * decode round trips on UTF-8 text, the folder records, and every refusal naming its key.
 * (tests/test_tokenizer_e2e.sh compares ids with an independent Python BPE on learned files.) */
#include "base/common.h"
#include "data/tokenizer.h"
#include "rl/reward.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define CHECK(c) do { if (!(c)) { \
    fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #c); exit(1); } } while (0)
#define CHECK_OK(e) do { if ((e) != 0) { \
    fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #e, mt_last_error()); exit(1); } } while (0)
#define CHECK_ERR(e, needle) do { mt_error("%s", ""); if ((e) == 0) { \
    fprintf(stderr, "%s:%d: %s succeeded, expected an error with '%s'\n", __FILE__, __LINE__, #e, needle); exit(1); } \
    if (!strstr(mt_last_error(), needle)) { \
    fprintf(stderr, "%s:%d: error '%s' lacks '%s'\n", __FILE__, __LINE__, mt_last_error(), needle); exit(1); } } while (0)

static char root[4096];

/* The parts of the hand-made file a case may replace. */
typedef struct {
    const char *normalizer, *pre, *model_type, *model_extra, *merges, *added, *top_extra;
    int drop_byte; /* leave this byte's token out of the vocabulary (-1: none) */
} spec;

static const char *BYTELEVEL = "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": true, \"use_regex\": true}";
/* merges by rank: Ġ t, h e, Ġt he, a b, Ã ©  (Ġ is the space's stand-in, Ã© the bytes of é) */
static const char *MERGES = "[\"\xc4\xa0 t\", \"h e\", \"\xc4\xa0t he\", \"a b\", \"\xc3\x83 \xc2\xa9\"]";
static const char *ADDED = "[{\"id\": 261, \"content\": \"<|endoftext|>\", \"single_word\": false, \"lstrip\": false, "
                           "\"rstrip\": false, \"normalized\": false, \"special\": true}]";

static size_t put_utf8(char *o, unsigned cp) {
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    o[0] = (char)(0xc0 | cp >> 6), o[1] = (char)(0x80 | (cp & 63));
    return 2;
}

/* Writes the file of s to root/name and returns its path (static buffer). */
static const char *write_tok(const char *name, spec s) {
    static char path[4200];
    snprintf(path, sizeof path, "%s/%s", root, name);
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    fprintf(f, "{\"version\": \"1.0\", \"truncation\": null, \"padding\": null%s,\n\"added_tokens\": %s,\n",
            s.top_extra ? s.top_extra : "", s.added ? s.added : ADDED);
    fprintf(f, "\"normalizer\": %s,\n\"pre_tokenizer\": %s,\n\"post_processor\": null,\n", s.normalizer ? s.normalizer : "null",
            s.pre ? s.pre : BYTELEVEL);
    fprintf(f, "\"decoder\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"trim_offsets\": true, \"use_regex\": true},\n");
    fprintf(f, "\"model\": {\"type\": \"%s\", \"dropout\": null, \"unk_token\": null%s, \"vocab\": {",
            s.model_type ? s.model_type : "BPE", s.model_extra ? s.model_extra : "");
    int n = 0, first = 1;
    for (int b = 0; b < 256; b++) { /* GPT-2's byte stand-ins; token id = byte value */
        const int keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        const unsigned cp = keep ? (unsigned)b : 256u + (unsigned)n++;
        if (b == s.drop_byte) continue;
        char u[4];
        const size_t k = put_utf8(u, cp);
        fprintf(f, "%s\"%s%.*s\": %d", first ? "" : ", ", cp == '"' || cp == '\\' ? "\\" : "", (int)k, u, b);
        first = 0;
    }
    fprintf(f, ", \"\xc4\xa0t\": 256, \"he\": 257, \"\xc4\xa0the\": 258, \"ab\": 259, \"\xc3\x83\xc2\xa9\": 260},\n");
    fprintf(f, "\"merges\": %s}}\n", s.merges ? s.merges : MERGES);
    CHECK(fclose(f) == 0);
    return path;
}

static spec base(void) { return (spec){NULL, NULL, NULL, NULL, NULL, NULL, NULL, -1}; }

/* Encodes s and compares with want[0..n). */
static void expect_ids(const mt_tokenizer *t, const char *s, const int32_t *want, size_t n) {
    int32_t *tok = NULL;
    size_t len = 0, cap = 0;
    CHECK_OK(mt_tokenizer_encode(t, "text", s, strlen(s), &tok, &len, &cap));
    int same = len == n;
    for (size_t i = 0; same && i < n; i++) same = tok[i] == want[i];
    if (!same) {
        fprintf(stderr, "encode \"%s\": got", s);
        for (size_t i = 0; i < len; i++) fprintf(stderr, " %d", tok[i]);
        fprintf(stderr, "\n");
    }
    CHECK(same);
    free(tok);
}

static void roundtrip(const mt_tokenizer *t, const char *s) {
    int32_t *tok = NULL;
    size_t len = 0, cap = 0, dl = 0, dc = 0;
    char *dec = NULL;
    CHECK_OK(mt_tokenizer_encode(t, "text", s, strlen(s), &tok, &len, &cap));
    mt_tokenizer_decode(t, tok, len, &dec, &dl, &dc);
    CHECK(dl == strlen(s) && memcmp(dec, s, dl) == 0);
    free(tok);
    free(dec);
}

static void test_encode(void) {
    mt_tokenizer t;
    CHECK_OK(mt_tokenizer_load(&t, write_tok("gpt2.json", base()), NULL));
    CHECK(t.bpe && t.eot == 261 && t.vocab == 262 && strcmp(t.eot_name, "<|endoftext|>") == 0);
    /* "the": t h e -> t he (no "t he" merge); " the": Ġ t h e -> Ġt h e -> Ġt he -> Ġthe */
    expect_ids(&t, "the the", (const int32_t[]){'t', 257, 258}, 3);
    expect_ids(&t, "aab", (const int32_t[]){'a', 259}, 2);
    expect_ids(&t, "\xc3\xa9", (const int32_t[]){260}, 1);
    /* the added token is cut out before the regex, the text around it encoded alone */
    expect_ids(&t, "abc<|endoftext|>x", (const int32_t[]){259, 'c', 261, 'x'}, 4);
    expect_ids(&t, "<|endoftext|", (const int32_t[]){'<', '|', 'e', 'n', 'd', 'o', 'f', 't', 'e', 'x', 't', '|'}, 12);
    expect_ids(&t, "", NULL, 0);
    /* GPT-2's regex: "  the" is " " + " the" (\s+(?!\S) leaves the last space to the word) */
    expect_ids(&t, "  the", (const int32_t[]){' ', 258}, 2);
    const char *texts[] = {"Hello, world! 12345 naïve café", "tabs\tand\nnew\r\nlines  ", "中文 日本語 Ελληνικά",
                           "emoji 😀🎉👍🏽 and <|endoftext|> inside", "   ", "x\x01\x7f\xc2\x85y"};
    for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) roundtrip(&t, texts[i]);
    CHECK(mt_tokenizer_is_text(&t, 'a') && mt_tokenizer_is_text(&t, 258) && !mt_tokenizer_is_text(&t, 261) &&
          !mt_tokenizer_is_text(&t, 262) && !mt_tokenizer_is_text(&t, -1));
    char *dec = NULL;
    size_t dl = 0, dc = 0;
    mt_tokenizer_decode(&t, (const int32_t[]){258, 261, 999}, 3, &dec, &dl, &dc);
    CHECK(strcmp(dec, " the<|endoftext|><999>") == 0);
    free(dec);
    /* the math verdict under this tokenizer: decoded text against the answer */
    CHECK(mt_math_verdict_tk(&t, (const int32_t[]){259, 261}, 2, 1, "ab") == MT_VERDICT_CORRECT);
    CHECK(mt_math_verdict_tk(&t, (const int32_t[]){'a', 'b', 261}, 3, 1, "ab") == MT_VERDICT_CORRECT);
    CHECK(mt_math_verdict_tk(&t, (const int32_t[]){259, 261}, 2, 1, "abc") == MT_VERDICT_WRONG);
    CHECK(mt_math_verdict_tk(&t, (const int32_t[]){259, 261}, 2, 0, "ab") == MT_VERDICT_MALFORMED);
    CHECK(mt_math_verdict_tk(&t, (const int32_t[]){259, 256}, 2, 1, "ab") == MT_VERDICT_MALFORMED); /* 256 is text here */
    CHECK(mt_math_verdict_tk(&t, (const int32_t[]){261, 259, 261}, 3, 1, "ab") == MT_VERDICT_MALFORMED);
    CHECK(mt_math_verdict_tk(&t, (const int32_t[]){999, 261}, 2, 1, "ab") == MT_VERDICT_MALFORMED);
    int32_t *tok = NULL;
    size_t len = 0, cap = 0;
    CHECK_ERR(mt_tokenizer_encode(&t, "doc.txt", "ab\xff", 3, &tok, &len, &cap), "doc.txt: not UTF-8 at byte 2");
    CHECK_ERR(mt_tokenizer_encode(&t, "doc.txt", "\xed\xa0\x80", 3, &tok, &len, &cap), "not UTF-8 at byte 0");
    CHECK_ERR(mt_tokenizer_encode(&t, "doc.txt", "\xc3", 1, &tok, &len, &cap), "not UTF-8 at byte 0");
    free(tok);
    mt_tokenizer_free(&t);

    /* pair-form merges, a Split that isolates digits in threes, then ByteLevel without regex */
    spec s = base();
    s.merges = "[[\"\xc4\xa0\", \"t\"], [\"h\", \"e\"], [\"\xc4\xa0t\", \"he\"], [\"a\", \"b\"], [\"\xc3\x83\", \"\xc2\xa9\"]]";
    s.pre = "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\p{N}{1,3}\"}, "
            "\"behavior\": \"Isolated\", \"invert\": false}, {\"type\": \"ByteLevel\", \"add_prefix_space\": false, "
            "\"trim_offsets\": true, \"use_regex\": false}]}";
    CHECK_OK(mt_tokenizer_load(&t, write_tok("seq.json", s), NULL));
    /* no regex split at spaces: " the the" is one piece, merged across its spaces */
    expect_ids(&t, " the the", (const int32_t[]){258, 258}, 2);
    expect_ids(&t, "ab12345", (const int32_t[]){259, '1', '2', '3', '4', '5'}, 6);
    roundtrip(&t, "ab 12345 x\n\n");
    mt_tokenizer_free(&t);

    /* ignore_merges: a pre-token that is itself a vocabulary entry stays whole */
    s = base();
    s.merges = "[\"h e\"]";
    CHECK_OK(mt_tokenizer_load(&t, write_tok("noign.json", s), NULL));
    expect_ids(&t, " the", (const int32_t[]){' ', 't', 257}, 3);
    mt_tokenizer_free(&t);
    s.model_extra = ", \"ignore_merges\": true";
    CHECK_OK(mt_tokenizer_load(&t, write_tok("ign.json", s), NULL));
    expect_ids(&t, " the", (const int32_t[]){258}, 1);
    expect_ids(&t, "the", (const int32_t[]){'t', 257}, 2);
    mt_tokenizer_free(&t);
}

static void test_refusals(void) {
    mt_tokenizer t;
    spec s = base();
    s.normalizer = "{\"type\": \"NFC\"}";
    CHECK_ERR(mt_tokenizer_load(&t, write_tok("r1.json", s), NULL), "key normalizer: type NFC");
    s = base(), s.model_type = "WordPiece";
    CHECK_ERR(mt_tokenizer_load(&t, write_tok("r2.json", s), NULL), "key model.type: WordPiece");
    s = base(), s.model_extra = ", \"byte_fallback\": true";
    CHECK_ERR(mt_tokenizer_load(&t, write_tok("r3.json", s), NULL), "key model.byte_fallback");
    s = base(), s.merges = "[\"a q\"]";
    CHECK_ERR(mt_tokenizer_load(&t, write_tok("r4.json", s), NULL), "key model.merges[0]: \"aq\" is not in model.vocab");
    s = base(), s.merges = "[\"a b c\"]";
    CHECK_ERR(mt_tokenizer_load(&t, write_tok("r5.json", s), NULL), "model.merges[0]");
    s = base(), s.drop_byte = 0;
    CHECK_ERR(mt_tokenizer_load(&t, write_tok("r6.json", s), NULL), "no token for byte 0x00");
    s = base(), s.added = "[]";
    CHECK_ERR(mt_tokenizer_load(&t, write_tok("r7.json", s), NULL), "key added_tokens: no special end-of-text token");
    CHECK_OK(mt_tokenizer_load(&t, write_tok("r7.json", s), "ab")); /* named: any token will do */
    CHECK(t.eot == 259);
    mt_tokenizer_free(&t);
    s = base();
    CHECK_ERR(mt_tokenizer_load(&t, write_tok("r8.json", s), "<|eot|>"), "\"<|eot|>\" is neither in added_tokens");
    s.pre = "{\"type\": \"ByteLevel\", \"add_prefix_space\": true}";
    CHECK_ERR(mt_tokenizer_load(&t, write_tok("r9.json", s), NULL), "key pre_tokenizer.add_prefix_space");
    s = base(), s.pre = "{\"type\": \"Metaspace\"}";
    CHECK_ERR(mt_tokenizer_load(&t, write_tok("r10.json", s), NULL), "key pre_tokenizer: type Metaspace");
    s.pre = "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\": \"x\"}, "
            "\"behavior\": \"Removed\", \"invert\": false}, {\"type\": \"ByteLevel\"}]}";
    CHECK_ERR(mt_tokenizer_load(&t, write_tok("r11.json", s), NULL), "key pre_tokenizer.pretokenizers[0].behavior");
    s.pre = "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\": \"(\"}, "
            "\"behavior\": \"Isolated\", \"invert\": false}, {\"type\": \"ByteLevel\"}]}";
    CHECK_ERR(mt_tokenizer_load(&t, write_tok("r12.json", s), NULL), "pretokenizers[0].pattern: pattern does not compile");
    s.pre = "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"ByteLevel\"}, {\"type\": \"Split\", \"pattern\": "
            "{\"Regex\": \"x\"}, \"behavior\": \"Isolated\"}]}";
    CHECK_ERR(mt_tokenizer_load(&t, write_tok("r13.json", s), NULL), "pretokenizers[0]: type ByteLevel not supported (Split, then ByteLevel last)");
    s = base(), s.top_extra = ", \"extra\": 1";
    CHECK_ERR(mt_tokenizer_load(&t, write_tok("r14.json", s), NULL), "key (top level).extra: not supported");
    s = base(), s.added = "[{\"id\": 261, \"content\": \"<|endoftext|>\", \"lstrip\": true, \"special\": true}]";
    CHECK_ERR(mt_tokenizer_load(&t, write_tok("r15.json", s), NULL), "key added_tokens[0].lstrip");
    s = base(), s.added = "[{\"id\": 5, \"content\": \"<|endoftext|>\", \"special\": true}]";
    CHECK_ERR(mt_tokenizer_load(&t, write_tok("r16.json", s), NULL), "id 5 is");
    s = base(), s.top_extra = ", \"padding\": {}";
    CHECK_ERR(mt_tokenizer_load(&t, write_tok("r17.json", s), NULL), "appears more than once");
    CHECK_ERR(mt_tokenizer_load(&t, "/nonexistent/tokenizer.json", NULL), "/nonexistent/tokenizer.json");
}

static void test_folders(void) {
    char dir[4200], p[4300];
    snprintf(dir, sizeof dir, "%s/folder", root);
    CHECK_OK(mt_mkdir_p(dir));
    mt_tokenizer t, u, byte;
    mt_tokenizer_byte(&byte);
    CHECK_OK(mt_tokenizer_load_dir(&u, dir)); /* no tokenizer.json: bytes */
    CHECK(!u.bpe && u.eot == MT_BYTE_EOT && u.vocab == MT_BYTE_VOCAB);
    spec s = base();
    s.added = "[{\"id\": 261, \"content\": \"<|endoftext|>\", \"special\": true}, {\"id\": 262, \"content\": \"<x>\", \"special\": true}]";
    CHECK_OK(mt_tokenizer_load(&t, write_tok("two.json", s), "<x>"));
    CHECK(t.eot == 262);
    CHECK_OK(mt_tokenizer_save_dir(&t, dir)); /* the chosen end of text travels in tokenizer_config.json */
    CHECK_OK(mt_tokenizer_load_dir(&u, dir));
    CHECK(u.bpe && u.eot == 262 && mt_tokenizer_same(&t, &u) && !mt_tokenizer_same(&t, &byte));
    mt_tokenizer_free(&u);
    CHECK_OK(mt_tokenizer_load_path(&u, dir, NULL));
    CHECK(u.eot == 262);
    mt_tokenizer_free(&u);
    snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
    FILE *f = fopen(p, "wb");
    CHECK(f && fputs("{\"eos_token\": 7}", f) >= 0 && fclose(f) == 0);
    CHECK_ERR(mt_tokenizer_load_dir(&u, dir), "key eos_token");
    CHECK_OK(mt_tokenizer_save_dir(&byte, dir)); /* bytes: the folder's tokenizer files go */
    struct stat st;
    CHECK(stat(p, &st) != 0);
    CHECK_OK(mt_tokenizer_load_dir(&u, dir));
    CHECK(!u.bpe);
    mt_tokenizer_free(&t);
}

int main(void) {
    const char *env = getenv("MT_TEST_TMP");
    snprintf(root, sizeof root, "%s/test_tokenizer", env && *env ? env : "/tmp/mt_test_tokenizer");
    CHECK_OK(mt_mkdir_p(root));
    test_encode();
    test_refusals();
    test_folders();
    printf("test_tokenizer: all checks passed\n");
    return 0;
}
