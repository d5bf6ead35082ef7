/* data/text.h — turning documents into byte-token shard series.
 *
 * A shard set writes out_dir/<name>_000000.bin, _000001.bin, ... (shard.h format); every
 * document is the EOT token followed by its tokens, so each shard starts with EOT unless
 * a single document longer than a shard had to be split. Used by mt_text_to_shards and
 * the synthetic math corpus (math.h). */
#ifndef MT_DATA_TEXT_H
#define MT_DATA_TEXT_H

#include <stddef.h>
#include <stdint.h>

#include "data/tokenizer.h"

#define MT_SHARD_TOKENS_DEFAULT ((size_t)100000000)

typedef struct {
    char *prefix;        /* "out_dir/name" */
    size_t shard_tokens; /* maximum tokens per shard */
    uint32_t *buf;       /* the shard being filled */
    size_t n, cap;
    int nshards;         /* shards written so far */
    uint64_t ntokens;    /* tokens added so far (EOTs included) */
    uint64_t ndocs;
    uint32_t eot;        /* the token before every document (MT_BYTE_EOT unless set after init) */
} mt_shard_set;

/* Starts a set; shard_tokens 0 means MT_SHARD_TOKENS_DEFAULT, else it must be at most
 * INT32_MAX. Does not touch the disk. */
int mt_shard_set_init(mt_shard_set *s, const char *out_dir, const char *name, size_t shard_tokens);
/* Appends one document (EOT, then tok[0..n)). A document that does not fit the current
 * shard starts a new one; one longer than shard_tokens is split across shards. */
int mt_shard_set_add(mt_shard_set *s, const uint32_t *tok, size_t n);
/* Same for a byte string (byte tokens). */
int mt_shard_set_add_bytes(mt_shard_set *s, const char *bytes, size_t n);
/* Writes the last shard (an empty set still writes an empty _000000 shard) and deletes
 * higher-numbered shards of the same name left by an earlier, larger run. */
int mt_shard_set_finish(mt_shard_set *s);
/* Frees the buffers (after finish or on an error path). */
void mt_shard_set_free(mt_shard_set *s);

/* Each file is one document, encoded by tk (NULL: the byte tokenizer). The last val_fraction of the documents
 * (rounded; at least one and never all when val_fraction > 0) goes to out_dir/text_val_NNNNNN.bin, the rest to
 * text_train_NNNNNN.bin, shards of at most shard_tokens tokens (0 = default). With a
 * single file, its last val_fraction of bytes (cut at a UTF-8 character boundary) becomes
 * the validation document. val_fraction must be in [0,1); 0 writes no validation shard
 * (and removes text_val shards of an earlier run). The folder records the tokenizer
 * (mt_tokenizer_save_dir: tokenizer.json for a BPE, none for bytes).
 * Errors name a missing or unreadable file, or one a BPE cannot take (not UTF-8). */
int mt_text_to_shards(const char *const *files, int nfiles, const char *out_dir,
                      double val_fraction, size_t shard_tokens, const mt_tokenizer *tk);

#endif
