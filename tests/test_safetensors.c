/* tests/test_safetensors.c — safetensors reader/writer: bit-exact round trips, BF16 input,
 * sharded checkpoints with an HF index, and every header validation error (each message
 * must name the file and, where there is one, the tensor). */
#include "base/common.h"
#include "base/safetensors.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

static char *tpath(const char *name) {
    static char buf[8][1024];
    static int slot = 0;
    char *p = buf[slot++ % 8];
    snprintf(p, sizeof buf[0], "%s/%s", tmpdir, name);
    return p;
}

/* Writes a file by hand: 8-byte LE header length, header text (unpadded), data bytes. */
static void write_raw(const char *path, const char *header, uint64_t hlen_override,
                      const void *data, size_t len) {
    size_t h = strlen(header);
    uint64_t n = hlen_override ? hlen_override : h;
    unsigned char lb[8];
    for (int i = 0; i < 8; i++) lb[i] = (unsigned char)(n >> (8 * i));
    FILE *f = fopen(path, "wb");
    if (!f) { fprintf(stderr, "cannot create %s\n", path); exit(1); }
    fwrite(lb, 1, 8, f);
    fwrite(header, 1, h, f);
    if (len) fwrite(data, 1, len, f);
    fclose(f);
}

static int open_fails(const char *path) {
    mt_st_reader *r = NULL;
    int rc = mt_st_open(&r, path);
    if (rc == 0) mt_st_close(r);
    return rc;
}

static void test_round_trip(void) {
    float a[6] = {1.5f, -2.25f, 0.0f, -0.0f, INFINITY, 3.1415927f};
    float b[4];
    uint32_t nanbits = 0x7fc01234u, denorm = 0x00000001u;
    memcpy(&b[0], &nanbits, 4);
    memcpy(&b[1], &denorm, 4);
    b[2] = -1e30f;
    b[3] = 7.0f;
    float c = 42.0f;
    mt_st_entry e[4] = {
        {.name = "model.layers.0.mlp.gate.weight", .data = a, .ndim = 2, .shape = {2, 3}},
        {.name = "b", .data = b, .ndim = 1, .shape = {4}},
        {.name = "scalar", .data = &c, .ndim = 0},
        {.name = "empty", .data = NULL, .ndim = 2, .shape = {0, 5}},
    };
    const char *meta[] = {"step", "42", "note", "quote\" and \\ backslash"};
    const char *p = tpath("rt.safetensors");
    CHECK(mt_st_write(p, e, 4, meta, 2) == 0);
    CHECK(access(tpath("rt.safetensors.tmp"), F_OK) != 0);

    /* Layout: header length multiple of 8, compact JSON, file size exact. */
    char *raw = NULL;
    size_t len = 0;
    CHECK(mt_read_file(p, &raw, &len) == 0);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | (unsigned char)raw[i];
    CHECK(n % 8 == 0);
    CHECK(len == 8 + n + 24 + 16 + 4 + 0);
    CHECK(strncmp(raw + 8, "{\"__metadata__\":{\"format\":\"pt\",\"step\":\"42\"", 41) == 0);
    CHECK(strstr(raw + 8, "\"model.layers.0.mlp.gate.weight\":{\"dtype\":\"F32\",\"shape\":[2,3],"
                          "\"data_offsets\":[0,24]}") != NULL);
    CHECK(strstr(raw + 8, "\"scalar\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[40,44]}"));
    CHECK(strstr(raw + 8, "\"empty\":{\"dtype\":\"F32\",\"shape\":[0,5],\"data_offsets\":[44,44]}"));
    free(raw);

    mt_st_reader *r = NULL;
    CHECK(mt_st_open(&r, p) == 0);
    if (!r) return;
    CHECK(mt_st_count(r) == 4);
    CHECK(strcmp(mt_st_name(r, 0), "model.layers.0.mlp.gate.weight") == 0);
    CHECK(strcmp(mt_st_name(r, 1), "b") == 0);
    CHECK(strcmp(mt_st_metadata(r, "format"), "pt") == 0);
    CHECK(strcmp(mt_st_metadata(r, "step"), "42") == 0);
    CHECK(strcmp(mt_st_metadata(r, "note"), "quote\" and \\ backslash") == 0);
    CHECK(mt_st_metadata(r, "missing") == NULL);
    int nd = -1;
    int64_t sh[MT_ST_MAX_DIMS];
    CHECK(mt_st_has(r, "model.layers.0.mlp.gate.weight", &nd, sh) == 1 && nd == 2 &&
          sh[0] == 2 && sh[1] == 3);
    CHECK(mt_st_has(r, "scalar", &nd, sh) == 1 && nd == 0);
    CHECK(mt_st_has(r, "nope", NULL, NULL) == 0);

    float ra[6], rb[4], rc = 0;
    int64_t s23[2] = {2, 3}, s4[1] = {4}, s05[2] = {0, 5}, s32[2] = {3, 2};
    CHECK(mt_st_read_f32(r, "model.layers.0.mlp.gate.weight", ra, 2, s23) == 0);
    CHECK(memcmp(ra, a, sizeof a) == 0);
    CHECK(mt_st_read_f32(r, "b", rb, 1, s4) == 0);
    CHECK(memcmp(rb, b, sizeof b) == 0);
    CHECK(mt_st_read_f32(r, "scalar", &rc, 0, NULL) == 0 && rc == 42.0f);
    CHECK(mt_st_read_f32(r, "empty", NULL, 2, s05) == 0);
    CHECK_ERR(mt_st_read_f32(r, "model.layers.0.mlp.gate.weight", ra, 2, s32),
              "rt.safetensors", "model.layers.0.mlp.gate.weight", "[2, 3]", "[3, 2]");
    CHECK_ERR(mt_st_read_f32(r, "b", rb, 2, s23), "tensor b", "[4]", "[2, 3]");
    CHECK_ERR(mt_st_read_f32(r, "nope", ra, 1, s4), "rt.safetensors", "nope", "not found");
    mt_st_close(r);

    /* Overwrite in place (atomic replace) with no tensors at all. */
    CHECK(mt_st_write(p, NULL, 0, NULL, 0) == 0);
    CHECK(mt_st_open(&r, p) == 0);
    if (r) { CHECK(mt_st_count(r) == 0); mt_st_close(r); }

    /* Writer input errors. */
    mt_st_entry dup[2] = {{.name = "x", .data = a, .ndim = 1, .shape = {2}},
                          {.name = "x", .data = a, .ndim = 1, .shape = {2}}};
    CHECK_ERR(mt_st_write(tpath("dup.safetensors"), dup, 2, NULL, 0), "dup.safetensors", "x",
              "twice");
    mt_st_entry neg = {.name = "neg", .data = a, .ndim = 1, .shape = {-1}};
    CHECK_ERR(mt_st_write(tpath("neg.safetensors"), &neg, 1, NULL, 0), "neg");
    CHECK_ERR(mt_st_write("/nonexistent_dir_mt/x.safetensors", e, 1, NULL, 0),
              "/nonexistent_dir_mt/x.safetensors");
}

static void test_bf16_and_large(void) {
    /* Hand-written BF16 file without __metadata__ (it is optional on read). */
    uint16_t bf[4] = {0x3F80, 0xC020, 0x3E20, 0x4040}; /* 1, -2.5, 0.15625, 3 */
    const char *p = tpath("bf16.safetensors");
    write_raw(p, "{\"w\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[0,8]}}   ", 0, bf,
              sizeof bf);
    mt_st_reader *r = NULL;
    CHECK(mt_st_open(&r, p) == 0);
    if (r) {
        float w[4];
        int64_t s[2] = {2, 2};
        CHECK(mt_st_read_f32(r, "w", w, 2, s) == 0);
        CHECK(w[0] == 1.0f && w[1] == -2.5f && w[2] == 0.15625f && w[3] == 3.0f);
        CHECK(mt_st_metadata(r, "format") == NULL);
        mt_st_close(r);
    }

    /* Mixed dtypes, listed out of offset order, plus a BF16 tensor above the chunk size. */
    const size_t big = ((size_t)1 << 20) + 12345;
    size_t bytes = 12 + 2 * big;
    unsigned char *data = malloc(bytes);
    float f3[3] = {0.5f, -0.75f, 1e-3f};
    uint16_t *bb = malloc(2 * big);
    for (size_t i = 0; i < big; i++) bb[i] = (uint16_t)(0x3C00 + (i % 0x0800));
    memcpy(data, bb, 2 * big);
    memcpy(data + 2 * big, f3, 12);
    char hdr[512];
    snprintf(hdr, sizeof hdr,
             "{\"f\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[%zu,%zu]},"
             "\"__metadata__\":{\"format\":\"pt\",\"n\":7},"
             "\"big\":{\"dtype\":\"BF16\",\"shape\":[%zu],\"data_offsets\":[0,%zu]}}",
             2 * big, 2 * big + 12, big, 2 * big);
    p = tpath("mixed.safetensors");
    write_raw(p, hdr, 0, data, bytes);
    r = NULL;
    CHECK(mt_st_open(&r, p) == 0);
    if (r) {
        float *out = malloc(big * sizeof(float));
        int64_t s1[1] = {(int64_t)big}, s3[1] = {3};
        CHECK(mt_st_read_f32(r, "big", out, 1, s1) == 0);
        int ok = 1;
        for (size_t i = 0; i < big && ok; i++) {
            uint32_t u = (uint32_t)bb[i] << 16;
            ok = memcmp(&out[i], &u, 4) == 0;
        }
        CHECK(ok);
        float g[3];
        CHECK(mt_st_read_f32(r, "f", g, 1, s3) == 0 && memcmp(g, f3, 12) == 0);
        CHECK(mt_st_metadata(r, "n") == NULL); /* non-string metadata is dropped */
        CHECK(strcmp(mt_st_name(r, 0), "big") == 0); /* offset order */
        free(out);
        mt_st_close(r);
    }
    free(bb);
    free(data);
}

static void write_file(const char *path, const char *text) {
    CHECK(mt_write_file_atomic(path, text, strlen(text)) == 0);
}

static void test_directories(void) {
    float x[6] = {1, 2, 3, 4, 5, 6}, y[2] = {-1, -2}, z[3] = {9, 8, 7};
    /* Single file in a directory. */
    char d1[600];
    snprintf(d1, sizeof d1, "%s/single", tmpdir);
    CHECK(mt_mkdir_p(d1) == 0);
    mt_st_entry e1 = {.name = "x", .data = x, .ndim = 2, .shape = {3, 2}};
    CHECK(mt_st_write(tpath("single/model.safetensors"), &e1, 1, NULL, 0) == 0);
    mt_st_reader *r = NULL;
    CHECK(mt_st_open(&r, d1) == 0);
    if (r) { CHECK(mt_st_count(r) == 1 && mt_st_has(r, "x", NULL, NULL)); mt_st_close(r); }

    /* Two shards with an index. */
    char d2[600];
    snprintf(d2, sizeof d2, "%s/sharded", tmpdir);
    CHECK(mt_mkdir_p(d2) == 0);
    mt_st_entry s1[2] = {{.name = "x", .data = x, .ndim = 2, .shape = {3, 2}},
                         {.name = "y", .data = y, .ndim = 1, .shape = {2}}};
    mt_st_entry s2[1] = {{.name = "z", .data = z, .ndim = 1, .shape = {3}}};
    CHECK(mt_st_write(tpath("sharded/model-00001-of-00002.safetensors"), s1, 2, NULL, 0) == 0);
    CHECK(mt_st_write(tpath("sharded/model-00002-of-00002.safetensors"), s2, 1, NULL, 0) == 0);
    const char *idx = tpath("sharded/model.safetensors.index.json");
    write_file(idx, "{\"metadata\": {\"total_size\": 44}, \"weight_map\": {"
                    "\"z\": \"model-00002-of-00002.safetensors\","
                    "\"x\": \"model-00001-of-00002.safetensors\","
                    "\"y\": \"model-00001-of-00002.safetensors\"}}");
    r = NULL;
    CHECK(mt_st_open(&r, d2) == 0);
    if (r) {
        CHECK(mt_st_count(r) == 3);
        float gx[6], gy[2], gz[3];
        int64_t sx[2] = {3, 2}, sy[1] = {2}, sz[1] = {3};
        CHECK(mt_st_read_f32(r, "z", gz, 1, sz) == 0 && memcmp(gz, z, sizeof z) == 0);
        CHECK(mt_st_read_f32(r, "x", gx, 2, sx) == 0 && memcmp(gx, x, sizeof x) == 0);
        CHECK(mt_st_read_f32(r, "y", gy, 1, sy) == 0 && memcmp(gy, y, sizeof y) == 0);
        CHECK(strcmp(mt_st_metadata(r, "format"), "pt") == 0);
        CHECK_ERR(mt_st_read_f32(r, "z", gz, 1, sy), "model-00002-of-00002.safetensors", "z");
        mt_st_close(r);
    }

    /* Listed in the index, missing from its shard. */
    write_file(idx, "{\"metadata\": {\"total_size\": 44}, \"weight_map\": {"
                    "\"z\": \"model-00002-of-00002.safetensors\","
                    "\"w\": \"model-00002-of-00002.safetensors\","
                    "\"x\": \"model-00001-of-00002.safetensors\","
                    "\"y\": \"model-00001-of-00002.safetensors\"}}");
    CHECK_ERR(open_fails(d2), "model-00002-of-00002.safetensors", "tensor w", "missing");
    /* Mapped to the wrong shard. */
    write_file(idx, "{\"weight_map\": {\"z\": \"model-00001-of-00002.safetensors\","
                    "\"x\": \"model-00001-of-00002.safetensors\","
                    "\"y\": \"model-00002-of-00002.safetensors\"}}");
    CHECK_ERR(open_fails(d2), "model-0000", "tensor z");
    /* A shard tensor the index does not list. */
    write_file(idx, "{\"weight_map\": {\"z\": \"model-00002-of-00002.safetensors\","
                    "\"x\": \"model-00001-of-00002.safetensors\"}}");
    CHECK_ERR(open_fails(d2), "model-00001-of-00002.safetensors", "tensor y", "not listed");
    /* A shard file that does not exist. */
    write_file(idx, "{\"weight_map\": {\"x\": \"model-00009.safetensors\"}}");
    CHECK_ERR(open_fails(d2), "model-00009.safetensors", "cannot open");
    /* Broken index JSON, missing weight_map, non-string file. */
    write_file(idx, "{\"weight_map\": {\"x\": ");
    CHECK_ERR(open_fails(d2), "model.safetensors.index.json", "JSON");
    write_file(idx, "{\"metadata\": {}}");
    CHECK_ERR(open_fails(d2), "model.safetensors.index.json", "weight_map");
    write_file(idx, "{\"weight_map\": {\"x\": 3}}");
    CHECK_ERR(open_fails(d2), "model.safetensors.index.json", "x");

    /* Empty directory. */
    char d3[600];
    snprintf(d3, sizeof d3, "%s/emptydir", tmpdir);
    CHECK(mt_mkdir_p(d3) == 0);
    CHECK_ERR(open_fails(d3), "emptydir", "model.safetensors");
    CHECK_ERR(open_fails(tpath("does_not_exist.safetensors")), "does_not_exist.safetensors");
}

static void test_header_errors(void) {
    unsigned char data[64] = {0};
    const char *p = tpath("bad.safetensors");

    write_raw(p, "{\"w\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,4]}}", 0, data, 4);
    CHECK_ERR(open_fails(p), "bad.safetensors", "tensor w", "F16");
    write_raw(p, "{\"w\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 0, data, 8);
    CHECK_ERR(open_fails(p), "bad.safetensors", "tensor w", "I64");

    write_raw(p, "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]", 0, data, 8);
    CHECK_ERR(open_fails(p), "bad.safetensors", "JSON");
    write_raw(p, "[1,2,3]", 0, data, 0);
    CHECK_ERR(open_fails(p), "bad.safetensors", "JSON");
    write_raw(p, "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}xx", 0, data, 8);
    CHECK_ERR(open_fails(p), "bad.safetensors", "header", "trailing text");

    /* Gap: [0,8] then [12,20]. */
    write_raw(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                 "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[12,20]}}", 0, data, 20);
    CHECK_ERR(open_fails(p), "bad.safetensors", "gap", "tensor b");
    /* Gap at the start. */
    write_raw(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 0, data, 12);
    CHECK_ERR(open_fails(p), "bad.safetensors", "gap", "tensor a");
    /* Overlap. */
    write_raw(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                 "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 0, data, 12);
    CHECK_ERR(open_fails(p), "bad.safetensors", "overlaps", "tensor b");
    /* Trailing bytes after the last tensor. */
    write_raw(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 0, data, 12);
    CHECK_ERR(open_fails(p), "bad.safetensors", "trailing");
    /* Truncated data. */
    write_raw(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 0, data, 10);
    CHECK_ERR(open_fails(p), "bad.safetensors", "truncated");
    /* Offsets disagree with shape. */
    write_raw(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 0, data, 8);
    CHECK_ERR(open_fails(p), "bad.safetensors", "tensor a", "12");
    /* Offsets reversed, negative shape, bad offsets type, missing dtype. */
    write_raw(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,0]}}", 0, data, 8);
    CHECK_ERR(open_fails(p), "bad.safetensors", "tensor a");
    write_raw(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 0, data, 8);
    CHECK_ERR(open_fails(p), "bad.safetensors", "tensor a", "shape");
    write_raw(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8.5]}}", 0, data, 8);
    CHECK_ERR(open_fails(p), "bad.safetensors", "tensor a", "data_offsets");
    write_raw(p, "{\"a\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 0, data, 8);
    CHECK_ERR(open_fails(p), "bad.safetensors", "tensor a", "dtype");
    write_raw(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}",
              0, data, 4);
    CHECK_ERR(open_fails(p), "bad.safetensors", "tensor a", "dimensions");
    write_raw(p, "{\"__metadata__\":[1],\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
              0, data, 4);
    CHECK_ERR(open_fails(p), "bad.safetensors", "__metadata__");

    /* Header length larger than the file; absurd length; file shorter than 8 bytes. */
    write_raw(p, "{}", 1000, NULL, 0);
    CHECK_ERR(open_fails(p), "bad.safetensors", "header length 1000");
    write_raw(p, "{}", UINT64_MAX, NULL, 0);
    CHECK_ERR(open_fails(p), "bad.safetensors", "header length");
    FILE *f = fopen(p, "wb");
    fwrite("abc", 1, 3, f);
    fclose(f);
    CHECK_ERR(open_fails(p), "bad.safetensors", "truncated");

    /* A valid file cut short by 4 bytes. */
    float v[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    mt_st_entry e = {.name = "v", .data = v, .ndim = 1, .shape = {8}};
    const char *q = tpath("cut.safetensors");
    CHECK(mt_st_write(q, &e, 1, NULL, 0) == 0);
    char *raw = NULL;
    size_t len = 0;
    CHECK(mt_read_file(q, &raw, &len) == 0);
    CHECK(truncate(q, (off_t)(len - 4)) == 0);
    free(raw);
    CHECK_ERR(open_fails(q), "cut.safetensors", "truncated");
    /* ... and cut inside the header. */
    CHECK(truncate(q, 20) == 0);
    CHECK_ERR(open_fails(q), "cut.safetensors", "header length");

    /* An empty header object is a valid, empty file. */
    write_raw(p, "{}      ", 0, NULL, 0);
    mt_st_reader *r = NULL;
    CHECK(mt_st_open(&r, p) == 0);
    if (r) { CHECK(mt_st_count(r) == 0); mt_st_close(r); }
    /* Duplicate tensor names in one header: the strict JSON reader refuses the repeated key. */
    write_raw(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                 "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 0, data, 8);
    CHECK_ERR(open_fails(p), "bad.safetensors", "key a", "more than once");
}

int main(void) {
    const char *base = getenv("MT_TEST_TMP");
    snprintf(tmpdir, sizeof tmpdir, "%s/test_safetensors", base && *base ? base : "/tmp/mt_test_st");
    if (mt_mkdir_p(tmpdir) != 0) {
        fprintf(stderr, "cannot create %s: %s\n", tmpdir, mt_last_error());
        return 1;
    }
    test_round_trip();
    test_bf16_and_large();
    test_directories();
    test_header_errors();
    if (failures) {
        fprintf(stderr, "test_safetensors: %d check(s) FAILED\n", failures);
        return 1;
    }
    printf("test_safetensors: all checks passed\n");
    return 0;
}
