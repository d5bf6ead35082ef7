/* data/loader.h — deterministic sampling of training windows from token shards.
 *
 * A window is T+1 contiguous tokens of one shard (inputs = first T, targets = last T).
 * The shards' windows are numbered (non-overlapping, stride T); sample i of the run is
 * window perm_epoch(i mod n_windows) with epoch = i / n_windows and perm a seeded
 * permutation. So the batch of a step is a pure function of (seed, sample index): the
 * loader's position in a checkpoint is just the sample index. */
#ifndef MT_DATA_LOADER_H
#define MT_DATA_LOADER_H

#include <stdint.h>

typedef struct mt_loader mt_loader;

/* Opens the shards of `split` ("train" or "val") under dir: files named *<split>*.bin,
 * sorted by name. dir may also be a single .bin file. Errors: no shards, a bad shard,
 * no window at all; a shard shorter than T+1 tokens is skipped with a warning. */
int mt_loader_open(mt_loader **out, const char *dir, const char *split, int T, uint64_t seed);
void mt_loader_free(mt_loader *L);
/* 1 if dir is a folder holding at least one shard of `split` (a single .bin file has no
 * separate split: 0). */
int mt_loader_has_split(const char *dir, const char *split);
/* A hash of the names and sizes of the files the train and val loaders of dir would read
 * (ranks of one job must see the same data); -1 with the loader's error when the train
 * split cannot be listed. */
int mt_loader_fingerprint(const char *dir, uint64_t *out);
/* Number of distinct windows (one epoch). */
uint64_t mt_loader_windows(const mt_loader *L);
/* Largest token id in the data (for the vocab check), and the first shard that holds it. */
uint32_t mt_loader_max_token(const mt_loader *L);
const char *mt_loader_max_token_file(const mt_loader *L);
/* Total tokens over all shards. */
uint64_t mt_loader_tokens(const mt_loader *L);
/* Fills B rows of T inputs and targets with samples first .. first+B-1. */
void mt_loader_batch(const mt_loader *L, uint64_t first, int B, int32_t *inputs, int32_t *targets);
/* Window w in file order (no shuffling), for evaluation passes over all data. */
void mt_loader_window(const mt_loader *L, uint64_t w, int32_t *inputs, int32_t *targets);
/* All tokens of all shards concatenated in order (for document parsing, e.g. eval). */
const uint32_t *mt_loader_all_tokens(const mt_loader *L, uint64_t *n);

#endif
