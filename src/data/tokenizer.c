/* data/tokenizer.c — the byte tokenizer (see tokenizer.h). */
#include "data/tokenizer.h"

size_t mt_byte_encode(const char *s, size_t n, uint32_t *out) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n; i++) out[i] = u[i];
    return n;
}

size_t mt_byte_decode(const uint32_t *tok, size_t n, char *out, size_t cap) {
    size_t w = 0;
    for (size_t i = 0; i < n && w < cap; i++) {
        if (tok[i] == MT_BYTE_EOT) continue;
        out[w++] = tok[i] < 256 ? (char)(unsigned char)tok[i] : '?';
    }
    if (w < cap) out[w] = 0;
    return w;
}
