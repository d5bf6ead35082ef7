/* data/tokenizer.h — the tokenizers (docs/FORMATS.md "Tokenizers").
 *
 * The byte tokenizer: token = byte value 0..255; MT_BYTE_EOT = 256 is end of text and
 * precedes every document in a shard; vocabulary size 257. It is the default.
 *
 * A Hugging Face tokenizer.json of a byte-level BPE (GPT-2, Llama-3, DeepSeek style):
 * added tokens split off first, then the Split / ByteLevel pre-tokenizers, then merges by
 * rank. Encoding equals Hugging Face's encode(text, add_special_tokens=False); every
 * feature of the file that would make it differ is refused at load with the key named.
 *
 * Where a tokenizer lives: a data folder or checkpoint folder holding tokenizer.json (and
 * tokenizer_config.json naming its "eos_token") uses that tokenizer; a folder without
 * tokenizer.json uses the byte tokenizer. */
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

typedef struct mt_bpe mt_bpe; /* a loaded tokenizer.json (data/bpe.c) */

typedef struct {
    mt_bpe *bpe;      /* NULL: the byte tokenizer */
    int32_t eot;      /* end-of-text id: starts every document, ends a completion */
    int32_t vocab;    /* 1 + the highest id the tokenizer can produce */
    char *eot_name;   /* the end-of-text token's text (BPE only) */
    char *json;       /* tokenizer.json's bytes as read (BPE only; copied into folders) */
    size_t json_len;
} mt_tokenizer;

/* The byte tokenizer (nothing to free, but mt_tokenizer_free is harmless). */
void mt_tokenizer_byte(mt_tokenizer *t);
/* Loads a tokenizer.json file. eot_name names the end-of-text token (its text, an added
 * token or a vocabulary entry); NULL takes the file's special added token among
 * <|endoftext|>, <|end_of_text|>, <｜end▁of▁sentence｜>, </s> (first of that list present).
 * Errors name the file and the key: not strict JSON, a model other than BPE, a normalizer
 * that changes text, a pre-tokenizer or decoder other than byte-level, BPE dropout, a
 * merge whose parts or result are not in the vocabulary, a byte with no token, no
 * end-of-text token. */
int mt_tokenizer_load(mt_tokenizer *t, const char *path, const char *eot_name);
/* The tokenizer of folder dir: dir/tokenizer.json with the "eos_token" of
 * dir/tokenizer_config.json when that file exists (else as mt_tokenizer_load with NULL),
 * or the byte tokenizer when dir has no tokenizer.json. */
int mt_tokenizer_load_dir(mt_tokenizer *t, const char *dir);
/* mt_tokenizer_load_dir when path is a folder; for a file, the tokenizer.json it is. */
int mt_tokenizer_load_path(mt_tokenizer *t, const char *path, const char *eot_name);
/* Records t in folder dir: tokenizer.json (the bytes read) and tokenizer_config.json
 * {"eos_token": ...}; for the byte tokenizer removes both so the folder means bytes. */
int mt_tokenizer_save_dir(const mt_tokenizer *t, const char *dir);
/* 1 when a and b tokenize alike (the same file bytes and end-of-text token). */
int mt_tokenizer_same(const mt_tokenizer *a, const mt_tokenizer *b);
/* "byte" or "tokenizer.json (V ids, end of text <name> = id)", for messages. */
void mt_tokenizer_describe(const mt_tokenizer *t, char *out, size_t cap);
void mt_tokenizer_free(mt_tokenizer *t);

/* Appends the tokens of text s[0..n) to *out (grown with realloc; *len tokens used, *cap
 * allocated). Returns 0, or -1 after mt_error() naming `what` and the byte offset when a
 * BPE tokenizer is given text that is not UTF-8 (Hugging Face cannot take it either). */
int mt_tokenizer_encode(const mt_tokenizer *t, const char *what, const char *s, size_t n, int32_t **out,
                        size_t *len, size_t *cap);
/* Appends the text of tokens tok[0..n) to *out (NUL-terminated, grown with realloc; *len
 * bytes used, *cap allocated). An added token becomes its text, EOT included; an id the
 * tokenizer does not know becomes "<id>" (the byte tokenizer: every id above 255, EOT
 * included). */
void mt_tokenizer_decode(const mt_tokenizer *t, const int32_t *tok, size_t n, char **out, size_t *len, size_t *cap);
/* 1 when id decodes to text of the vocabulary (the byte tokenizer: 0..255; BPE: an entry
 * of the model's vocab that is not an added special token). */
int mt_tokenizer_is_text(const mt_tokenizer *t, int32_t id);

#endif
