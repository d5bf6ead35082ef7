/* data/bpe.h — a Hugging Face tokenizer.json of a byte-level BPE (used by tokenizer.c).
 *
 * Supported: model BPE with vocab, merges ("a b" strings or [a, b] pairs), ignore_merges;
 * normalizer null or an empty Sequence; pre_tokenizer ByteLevel, or a Sequence of Split
 * (Regex or String pattern, behavior Isolated) ending in ByteLevel; decoder ByteLevel;
 * added_tokens without lstrip/rstrip/single_word. Anything else is refused at load. */
#ifndef MT_DATA_BPE_H
#define MT_DATA_BPE_H

#include <stddef.h>
#include <stdint.h>

#include "data/tokenizer.h"

/* Parses tokenizer.json text (path only names it in errors); NULL after mt_error(). */
mt_bpe *mt_bpe_load(const char *path, const char *json, size_t len);
void mt_bpe_free(mt_bpe *b);
/* 1 + the highest id of the vocabulary and the added tokens. */
int32_t mt_bpe_vocab(const mt_bpe *b);
/* The id of the token whose text is s[0..n): an added token first, then the vocabulary;
 * -1 when there is none. */
int32_t mt_bpe_find(const mt_bpe *b, const char *s, size_t n);
/* 1 when id is an added token marked special. */
int mt_bpe_is_special(const mt_bpe *b, int32_t id);
/* 1 when id has a token (vocabulary or added). */
int mt_bpe_has(const mt_bpe *b, int32_t id);
/* See mt_tokenizer_encode / mt_tokenizer_decode. */
int mt_bpe_encode(const mt_bpe *b, const char *what, const char *s, size_t n, int32_t **out, size_t *len,
                  size_t *cap);
void mt_bpe_decode(const mt_bpe *b, const int32_t *tok, size_t n, char **out, size_t *len, size_t *cap);

#endif
