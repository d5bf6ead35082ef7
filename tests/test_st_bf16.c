/* tests/test_st_bf16.c — the BF16 writer of base/safetensors (moetrain export --dtype bf16):
 * mt_f32_to_bf16 rounds to nearest, ties to even, on the cases a random tensor rarely hits
 * (exact ties both ways, a carry into the exponent, overflow to Inf, signed zero, NaNs whose
 * payload lies in the dropped bits), and a file written as BF16 reads back as the rounded values. */
#include "base/common.h"
#include "base/safetensors.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures = 0;
#define CHECK(c) do { if (!(c)) { \
    fprintf(stderr, "%s:%d: CHECK failed: %s (last error: %s)\n", __FILE__, __LINE__, #c, \
            mt_last_error()); failures++; } } while (0)

static float from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void test_rounding(void) {
    static const struct { uint32_t in; uint16_t out; } cases[] = {
        {0x3f800000u, 0x3f80}, /* 1.0: exact */
        {0x3f808000u, 0x3f80}, /* tie, kept part even: down */
        {0x3f818000u, 0x3f82}, /* tie, kept part odd: up */
        {0x3f808001u, 0x3f81}, /* just above a tie: up */
        {0x3f807fffu, 0x3f80}, /* just below a tie: down */
        {0x3fffffffu, 0x4000}, /* the carry reaches the exponent */
        {0x7f7fffffu, 0x7f80}, /* the largest float rounds past the largest bf16: Inf */
        {0x7f800000u, 0x7f80}, /* Inf */
        {0xff800000u, 0xff80}, /* -Inf */
        {0x80000000u, 0x8000}, /* -0 */
        {0x00000001u, 0x0000}, /* the smallest subnormal: to 0 */
        {0xbf818000u, 0xbf82}, /* ties to even for negatives too */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const uint16_t got = mt_f32_to_bf16(from_bits(cases[i].in));
        if (got != cases[i].out) {
            fprintf(stderr, "mt_f32_to_bf16(0x%08x) = 0x%04x, want 0x%04x\n", cases[i].in, got, cases[i].out);
            failures++;
        }
    }
    /* a NaN whose payload is only in the low bits must not round to Inf */
    static const uint32_t nans[] = {0x7f800001u, 0xff800001u, 0x7fc00000u, 0x7fffffffu};
    for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) {
        const uint16_t h = mt_f32_to_bf16(from_bits(nans[i]));
        CHECK((h & 0x7f80) == 0x7f80 && (h & 0x007f) != 0);
        CHECK((h & 0x8000) == ((nans[i] >> 16) & 0x8000));
    }
}

static void test_file(const char *dir) {
    enum { N = 4099 }; /* more than one conversion buffer */
    float *x = mt_xmalloc(N * sizeof(float)), *y = mt_xmalloc(N * sizeof(float));
    for (int i = 0; i < N; i++) x[i] = (float)sin(0.37 * i) * (float)(1 + i % 7) * 1e-2f;
    char path[1024];
    snprintf(path, sizeof path, "%s/w.safetensors", dir);
    mt_st_entry e[2] = {{"a", x, 1, {N}}, {"b", x, 2, {2, 3}}};
    CHECK(mt_st_write_as(path, e, 2, NULL, 0, MT_ST_BF16) == 0);
    mt_st_reader *r = NULL;
    CHECK(mt_st_open(&r, path) == 0);
    if (r) {
        int64_t sa[1] = {N}, sb[2] = {2, 3};
        CHECK(mt_st_read_f32(r, "a", y, 1, sa) == 0);
        int bad = 0;
        for (int i = 0; i < N; i++) {
            const uint32_t want = (uint32_t)mt_f32_to_bf16(x[i]) << 16;
            uint32_t got;
            memcpy(&got, &y[i], 4);
            bad += got != want;
        }
        CHECK(bad == 0);
        CHECK(mt_st_read_f32(r, "b", y, 2, sb) == 0);
        mt_st_close(r);
    }
    /* BF16 data: 2 bytes per value after the 8-byte length and the padded header */
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL);
    if (f) {
        uint64_t hlen = 0;
        CHECK(fread(&hlen, 8, 1, f) == 1);
        fseek(f, 0, SEEK_END);
        CHECK((uint64_t)ftell(f) == 8 + hlen + 2 * (N + 6));
        fclose(f);
    }
    free(x);
    free(y);
}

int main(void) {
    const char *base = getenv("MT_TEST_TMP");
    char dir[512];
    snprintf(dir, sizeof dir, "%s/test_st_bf16", base && *base ? base : "/tmp/mt_test_st_bf16");
    if (mt_mkdir_p(dir) != 0) {
        fprintf(stderr, "cannot create %s: %s\n", dir, mt_last_error());
        return 1;
    }
    test_rounding();
    test_file(dir);
    if (failures) {
        fprintf(stderr, "%d failure(s)\n", failures);
        return 1;
    }
    printf("test_st_bf16: ok\n");
    return 0;
}
