/* data/text.c — shard sets and text files to token shards (see text.h). */
#include "data/text.h"

#include "base/common.h"
#include "data/shard.h"
#include "data/tokenizer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int mt_shard_set_init(mt_shard_set *s, const char *out_dir, const char *name, size_t shard_tokens) {
    MT_ASSERT(s && out_dir && name);
    memset(s, 0, sizeof *s);
    if (shard_tokens == 0) shard_tokens = MT_SHARD_TOKENS_DEFAULT;
    if (shard_tokens > (size_t)INT32_MAX)
        return mt_error("%s: %zu tokens per shard exceeds the format's limit %d", out_dir, shard_tokens, INT32_MAX);
    size_t len = strlen(out_dir) + strlen(name) + 2;
    s->prefix = mt_xmalloc(len);
    snprintf(s->prefix, len, "%s/%s", out_dir, name);
    s->shard_tokens = shard_tokens;
    s->eot = MT_BYTE_EOT;
    return 0;
}

static char *shard_path(const mt_shard_set *s, int index) {
    size_t len = strlen(s->prefix) + 32;
    char *p = mt_xmalloc(len);
    snprintf(p, len, "%s_%06d.bin", s->prefix, index);
    return p;
}

static int flush(mt_shard_set *s) {
    char *path = shard_path(s, s->nshards);
    int rc = mt_shard_write(path, s->buf, s->n);
    free(path);
    if (rc != 0) return -1;
    s->nshards++;
    s->n = 0;
    return 0;
}

/* Makes room for k more tokens in the buffer (k <= shard_tokens - n). */
static void reserve(mt_shard_set *s, size_t k) {
    if (s->n + k <= s->cap) return;
    size_t cap = s->cap ? s->cap : 4096;
    while (cap < s->n + k) cap *= 2;
    if (cap > s->shard_tokens) cap = s->shard_tokens;
    s->buf = mt_xrealloc(s->buf, cap * sizeof *s->buf);
    s->cap = cap;
}

/* Appends EOT + n tokens taken from tok (uint32), itok (int32) or bytes (byte tokens). */
static int add_doc(mt_shard_set *s, const uint32_t *tok, const int32_t *itok, const unsigned char *bytes, size_t n) {
    if (s->n > 0 && s->n + n + 1 > s->shard_tokens && flush(s) != 0) return -1;
    reserve(s, 1);
    s->buf[s->n++] = s->eot;
    for (size_t done = 0; done < n;) {
        if (s->n == s->shard_tokens && flush(s) != 0) return -1;
        size_t k = s->shard_tokens - s->n;
        if (k > n - done) k = n - done;
        reserve(s, k);
        if (tok) memcpy(s->buf + s->n, tok + done, k * sizeof *tok);
        else if (itok) for (size_t i = 0; i < k; i++) s->buf[s->n + i] = (uint32_t)itok[done + i];
        else for (size_t i = 0; i < k; i++) s->buf[s->n + i] = bytes[done + i];
        s->n += k;
        done += k;
    }
    s->ntokens += n + 1;
    s->ndocs++;
    return 0;
}

int mt_shard_set_add(mt_shard_set *s, const uint32_t *tok, size_t n) {
    return add_doc(s, tok, NULL, NULL, n);
}

int mt_shard_set_add_bytes(mt_shard_set *s, const char *bytes, size_t n) {
    return add_doc(s, NULL, NULL, (const unsigned char *)bytes, n);
}

/* One document of text: bytes as they are, or its tokens under a BPE. */
static int add_text(mt_shard_set *s, const mt_tokenizer *tk, const char *what, const char *text, size_t n,
                    int32_t **tok, size_t *cap) {
    if (!tk || !tk->bpe) return mt_shard_set_add_bytes(s, text, n);
    size_t len = 0;
    if (mt_tokenizer_encode(tk, what, text, n, tok, &len, cap) != 0) return -1;
    return add_doc(s, NULL, *tok, NULL, len);
}

/* Deletes shards from..., stopping at the first missing one: shards an earlier run left
 * behind would otherwise join the split when the loader lists the directory. */
static void remove_stale(const mt_shard_set *s, int from) {
    for (int i = from;; i++) {
        char *path = shard_path(s, i);
        int gone = unlink(path) != 0;
        free(path);
        if (gone) break;
    }
}

int mt_shard_set_finish(mt_shard_set *s) {
    if ((s->n > 0 || s->nshards == 0) && flush(s) != 0) return -1;
    remove_stale(s, s->nshards);
    return 0;
}

void mt_shard_set_free(mt_shard_set *s) {
    free(s->prefix);
    free(s->buf);
    s->prefix = NULL;
    s->buf = NULL;
    s->n = s->cap = 0;
}

int mt_text_to_shards(const char *const *files, int nfiles, const char *out_dir,
                      double val_fraction, size_t shard_tokens, const mt_tokenizer *tk) {
    MT_ASSERT(out_dir && (files || nfiles == 0));
    if (nfiles < 1) return mt_error("%s: no input text files", out_dir);
    if (!(val_fraction >= 0.0 && val_fraction < 1.0))
        return mt_error("%s: validation fraction %g must be in [0,1)", out_dir, val_fraction);
    int nval = 0;
    if (nfiles > 1 && val_fraction > 0) {
        nval = (int)lround(val_fraction * nfiles);
        if (nval < 1) nval = 1;
        if (nval > nfiles - 1) nval = nfiles - 1;
    }
    if (mt_mkdir_p(out_dir) != 0) return -1;
    mt_shard_set train, val;
    if (mt_shard_set_init(&train, out_dir, "text_train", shard_tokens) != 0) return -1;
    if (mt_shard_set_init(&val, out_dir, "text_val", shard_tokens) != 0) { mt_shard_set_free(&train); return -1; }
    train.eot = val.eot = tk ? (uint32_t)tk->eot : MT_BYTE_EOT;
    int32_t *tok = NULL;
    size_t tcap = 0;
    int rc = 0;
    for (int i = 0; i < nfiles && rc == 0; i++) {
        char *data;
        size_t len;
        if (mt_read_file(files[i], &data, &len) != 0) { rc = -1; break; }
        if (nfiles == 1 && val_fraction > 0) {
            size_t cut = len - (size_t)((double)len * val_fraction);
            while (cut < len && ((unsigned char)data[cut] & 0xc0) == 0x80) cut++; /* UTF-8 continuation */
            rc = add_text(&train, tk, files[i], data, cut, &tok, &tcap);
            if (rc == 0) rc = add_text(&val, tk, files[i], data + cut, len - cut, &tok, &tcap);
        } else {
            rc = add_text(i >= nfiles - nval ? &val : &train, tk, files[i], data, len, &tok, &tcap);
        }
        free(data);
    }
    if (rc == 0) rc = mt_shard_set_finish(&train);
    if (rc == 0 && val.ndocs > 0) rc = mt_shard_set_finish(&val);
    else if (rc == 0) remove_stale(&val, 0);
    mt_tokenizer byte;
    mt_tokenizer_byte(&byte);
    if (rc == 0) rc = mt_tokenizer_save_dir(tk ? tk : &byte, out_dir);
    free(tok);
    mt_shard_set_free(&train);
    mt_shard_set_free(&val);
    return rc;
}
