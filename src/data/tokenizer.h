/* data/tokenizer.h — the byte tokenizer (docs/FORMATS.md "Tokenizers").
 *
 * Token = byte value 0..255; MT_BYTE_EOT = 256 is end of text and precedes every
 * document in a shard; vocabulary size 257. */
#ifndef MT_DATA_TOKENIZER_H
#define MT_DATA_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#define MT_BYTE_EOT 256
#define MT_BYTE_VOCAB 257

/* Writes the n bytes of s as n tokens to out (room for n); returns n. */
size_t mt_byte_encode(const char *s, size_t n, uint32_t *out);
/* Decodes n tokens into out (at most cap bytes): ids < 256 become that byte, EOT becomes
 * nothing, any other id becomes '?'. Returns the bytes written; NUL-terminates when
 * fewer than cap bytes were written. */
size_t mt_byte_decode(const uint32_t *tok, size_t n, char *out, size_t cap);

#endif
