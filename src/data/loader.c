/* data/loader.c — deterministic window sampling over token shards (see loader.h).
 *
 * All shards are loaded into one array. The epoch permutation is a keyed Feistel network
 * on the smallest even-bit power-of-two domain covering the window count, with cycle
 * walking back into [0, W): a bijection computed per index from (seed, epoch) alone, so
 * no permutation is stored and any call order, thread or resumed run sees the same
 * batches. */
#include "data/loader.h"

#include "base/common.h"
#include "data/shard.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <xxhash.h>

#define FEISTEL_ROUNDS 6

struct mt_loader {
    int T;
    uint64_t seed;
    uint32_t *tokens;   /* all shards concatenated */
    uint64_t ntokens;
    uint32_t max_token;
    char *max_file;     /* the first shard holding max_token, for messages */
    int nshards;        /* shards holding at least one window */
    uint64_t *shard_off; /* [nshards] token offset of each such shard */
    uint64_t *win_cum;   /* [nshards+1] windows before each such shard */
    uint64_t nwindows;
};

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int ends_with(const char *s, const char *suf) {
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && strcmp(s + n - m, suf) == 0;
}

/* Does name contain split as a whole word (bounded by the name's ends or a character that is
 * not a letter or digit)? "math_val_000000.bin" has "val"; "eval_train.bin" does not. */
static int has_word(const char *name, const char *split) {
    size_t m = strlen(split);
    for (const char *p = strstr(name, split); p; p = strstr(p + 1, split)) {
        int left = p == name || !isalnum((unsigned char)p[-1]);
        int right = !isalnum((unsigned char)p[m]);
        if (left && right) return 1;
    }
    return 0;
}

/* Sorted paths of dir's files whose name has split as a word and ends in .bin. */
static int list_shards(const char *dir, const char *split, char ***paths, int *count) {
    DIR *d = opendir(dir);
    if (!d) return mt_error("%s: cannot open data directory: %s", dir, strerror(errno));
    char **names = NULL;
    int n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!has_word(e->d_name, split) || !ends_with(e->d_name, ".bin")) continue;
        if (n == cap) { cap = cap ? 2 * cap : 16; names = mt_xrealloc(names, (size_t)cap * sizeof *names); }
        size_t len = strlen(dir) + strlen(e->d_name) + 2;
        names[n] = mt_xmalloc(len);
        snprintf(names[n], len, "%s/%s", dir, e->d_name);
        n++;
    }
    closedir(d);
    if (n == 0) { free(names); return mt_error("%s: no shards for split '%s' (expected files named *%s*.bin)", dir, split, split); }
    qsort(names, (size_t)n, sizeof *names, cmp_str);
    *paths = names;
    *count = n;
    return 0;
}

int mt_loader_has_split(const char *dir, const char *split) {
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) return 0;
    char **paths = NULL;
    int np = 0;
    if (list_shards(dir, split, &paths, &np) != 0) return 0;
    for (int i = 0; i < np; i++) free(paths[i]);
    free(paths);
    return np > 0;
}

/* The shard files a loader of `split` reads: dir itself when it is a file, else its shards. */
static int shard_paths(const char *dir, const char *split, char ***paths, int *count) {
    struct stat st;
    if (stat(dir, &st) == 0 && S_ISREG(st.st_mode)) {
        *paths = mt_xmalloc(sizeof **paths);
        (*paths)[0] = mt_xstrdup(dir);
        *count = 1;
        return 0;
    }
    return list_shards(dir, split, paths, count);
}

int mt_loader_fingerprint(const char *dir, uint64_t *out) {
    static const char *const splits[] = {"train", "val"};
    XXH64_state_t *h = XXH64_createState();
    XXH64_reset(h, 0);
    int rc = 0;
    for (int s = 0; s < 2 && rc == 0; s++) {
        char **paths = NULL;
        int np = 0;
        if (shard_paths(dir, splits[s], &paths, &np) != 0) {
            if (s == 0) rc = -1; /* the train split must be there; val is optional */
            continue;
        }
        for (int i = 0; i < np; i++) {
            struct stat st;
            long long size = stat(paths[i], &st) == 0 ? (long long)st.st_size : -1;
            XXH64_update(h, paths[i], strlen(paths[i]) + 1);
            XXH64_update(h, &size, sizeof size);
            free(paths[i]);
        }
        free(paths);
    }
    *out = XXH64_digest(h);
    XXH64_freeState(h);
    return rc;
}

int mt_loader_open(mt_loader **out, const char *dir, const char *split, int T, uint64_t seed) {
    MT_ASSERT(out && dir && split);
    *out = NULL;
    if (T < 1) return mt_error("%s: sequence length T=%d must be at least 1", dir, T);
    char **paths = NULL;
    int np = 0;
    if (shard_paths(dir, split, &paths, &np) != 0) return -1;
    mt_loader *L = mt_xcalloc(1, sizeof *L);
    L->T = T;
    L->seed = seed;
    L->shard_off = mt_xmalloc((size_t)np * sizeof *L->shard_off);
    L->win_cum = mt_xmalloc(((size_t)np + 1) * sizeof *L->win_cum);
    L->win_cum[0] = 0;
    int rc = 0;
    for (int i = 0; i < np && rc == 0; i++) {
        uint32_t *tok;
        size_t n;
        if (mt_shard_read(paths[i], &tok, &n) != 0) { rc = -1; break; }
        L->tokens = mt_xrealloc(L->tokens, (L->ntokens + n) * sizeof *L->tokens);
        memcpy(L->tokens + L->ntokens, tok, n * sizeof *tok);
        uint32_t mx = 0;
        for (size_t j = 0; j < n; j++)
            if (tok[j] > mx) mx = tok[j];
        if (mx > L->max_token || !L->max_file) {
            L->max_token = mx > L->max_token ? mx : L->max_token;
            free(L->max_file);
            L->max_file = mt_xstrdup(paths[i]);
        }
        free(tok);
        /* windows start at k*T and need T+1 tokens: k*T + T + 1 <= n */
        uint64_t w = n > (size_t)T ? (uint64_t)(n - 1) / (uint64_t)T : 0;
        if (w == 0) {
            mt_warn("%s: %zu tokens, fewer than T+1 = %d; no windows taken from it", paths[i], n, T + 1);
        } else {
            L->shard_off[L->nshards] = L->ntokens;
            L->win_cum[L->nshards + 1] = L->win_cum[L->nshards] + w;
            L->nshards++;
        }
        L->ntokens += n;
    }
    if (rc == 0 && L->nshards == 0)
        rc = mt_error("%s: no shard of split '%s' has the T+1 = %d tokens one window needs", dir, split, T + 1);
    for (int i = 0; i < np; i++) free(paths[i]);
    free(paths);
    if (rc != 0) { mt_loader_free(L); return -1; }
    L->nwindows = L->win_cum[L->nshards];
    *out = L;
    return 0;
}

void mt_loader_free(mt_loader *L) {
    if (!L) return;
    free(L->tokens);
    free(L->max_file);
    free(L->shard_off);
    free(L->win_cum);
    free(L);
}

uint64_t mt_loader_windows(const mt_loader *L) { return L->nwindows; }
uint32_t mt_loader_max_token(const mt_loader *L) { return L->max_token; }
const char *mt_loader_max_token_file(const mt_loader *L) { return L->max_file ? L->max_file : "(no shard)"; }
uint64_t mt_loader_tokens(const mt_loader *L) { return L->ntokens; }

const uint32_t *mt_loader_all_tokens(const mt_loader *L, uint64_t *n) {
    if (n) *n = L->ntokens;
    return L->tokens;
}

/* Position j of the epoch's permutation of [0, W). */
static uint64_t permute(uint64_t seed, uint64_t epoch, uint64_t j, uint64_t W) {
    if (W <= 1) return 0;
    int bits = 64 - __builtin_clzll(W - 1); /* 2^bits >= W */
    int half = (bits + 1) / 2;
    uint64_t mask = ((uint64_t)1 << half) - 1;
    uint64_t x = j;
    do { /* cycle walking: x stays on the cycle through j, which re-enters [0,W) */
        uint64_t l = x >> half, r = x & mask;
        for (int round = 0; round < FEISTEL_ROUNDS; round++) {
            uint64_t f = mt_hash4(seed, epoch, 0x6c6f616465720000ULL + (uint64_t)round, r) & mask;
            uint64_t t = l ^ f;
            l = r;
            r = t;
        }
        x = l << half | r;
    } while (x >= W);
    return x;
}

void mt_loader_window(const mt_loader *L, uint64_t w, int32_t *inputs, int32_t *targets) {
    MT_ASSERT(w < L->nwindows);
    int lo = 0, hi = L->nshards - 1; /* last shard s with win_cum[s] <= w */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (L->win_cum[mid] <= w) lo = mid; else hi = mid - 1;
    }
    const uint32_t *p = L->tokens + L->shard_off[lo] + (w - L->win_cum[lo]) * (uint64_t)L->T;
    for (int t = 0; t < L->T; t++) {
        inputs[t] = (int32_t)p[t];
        targets[t] = (int32_t)p[t + 1];
    }
}

void mt_loader_batch(const mt_loader *L, uint64_t first, int B, int32_t *inputs, int32_t *targets) {
    MT_ASSERT(B >= 0);
    for (int b = 0; b < B; b++) {
        uint64_t i = first + (uint64_t)b;
        uint64_t w = permute(L->seed, i / L->nwindows, i % L->nwindows, L->nwindows);
        mt_loader_window(L, w, inputs + (size_t)b * L->T, targets + (size_t)b * L->T);
    }
}
