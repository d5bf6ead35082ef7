/* train/checkpoint.h — checkpoint folders (docs/FORMATS.md): config.json, model.safetensors,
 * plus what an exact resume needs: optimizer.safetensors (AdamW moments named
 * exp_avg.<param> / exp_avg_sq.<param>) and trainer_state.json (step, data position,
 * seed, hyper-parameters). checksums.json (XXH64 of every file) is written last; a folder
 * without it is incomplete. A run folder holds step_NNNNNNNN/ checkpoints and a file
 * `latest` naming the newest complete one. mt_ckpt_export writes a checkpoint's weights in
 * the sharded Hugging Face layout (DeepSeek-V3's), which every loader here reads too. */
#ifndef MT_TRAIN_CHECKPOINT_H
#define MT_TRAIN_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "data/tokenizer.h"
#include "model/model.h"

/* Writes a complete checkpoint as folder dir: into dir.tmp first (checksums.json last),
 * then renamed into place, or exchanged with an existing dir, so a crash leaves the old
 * folder or the new one. m_adam / v_adam may be NULL (weights only); state_json may be NULL.
 * tk (NULL or the byte tokenizer: none) is recorded as tokenizer.json and
 * tokenizer_config.json (mt_tokenizer_save_dir), covered by checksums.json. */
int mt_ckpt_save(const char *dir, const mt_model *m, const float *m_adam, const float *v_adam,
                 const char *state_json, const mt_tokenizer *tk);
/* Resolves a run folder (with `latest`) or a checkpoint folder to the checkpoint folder. */
int mt_ckpt_resolve(const char *path, char *out, size_t cap);
/* Verifies checksums.json of a checkpoint. If it is absent: error when `required`,
 * otherwise a warning (a checkpoint written by another tool). */
int mt_ckpt_verify(const char *dir, int required);
/* Loads dir/config.json. */
int mt_ckpt_load_config(const char *dir, mt_config *c);
/* Loads every parameter of m from dir/model.safetensors (or shards): a missing, extra or
 * wrong-shaped tensor is an error naming it; with tied embeddings a present
 * lm_head.weight is ignored with a warning. A NaN or Inf value is an error naming the first
 * tensor that holds one, unless allow_nonfinite (then a warning says the same). */
int mt_ckpt_load_weights(const char *dir, mt_model *m, int allow_nonfinite);
/* Loads the AdamW moments (non-finite values as for the weights). */
int mt_ckpt_load_optimizer(const char *dir, const mt_model *m, float *m_adam, float *v_adam, int allow_nonfinite);
/* Reads trainer_state.json (malloc'd string of *len bytes). */
int mt_ckpt_load_state(const char *dir, char **json, size_t *len);
/* Opens a run or checkpoint folder for inference or as a starting point: resolves it,
 * verifies checksums when present, loads config.json, builds the model, loads weights
 * (allow_nonfinite: as mt_ckpt_load_weights). */
int mt_ckpt_open_model(const char *path, mt_model *m, char *resolved, size_t cap, int allow_nonfinite);
/* Writes `latest` in run_dir pointing at the checkpoint folder name (atomically). */
int mt_ckpt_set_latest(const char *run_dir, const char *name);

/* The Hugging Face / DeepSeek-V3 folder layout (docs/FORMATS.md 4.7). */
typedef struct {
    int dtype;            /* enum mt_st_dtype (base/safetensors.h): F32, or BF16 rounded to nearest even */
    uint64_t shard_bytes; /* most tensor bytes per shard (> 0); a larger tensor gets a shard of its own */
    int allow_nonfinite;  /* as mt_ckpt_load_weights */
} mt_export_opts;
typedef struct {
    int shards, tensors;
    uint64_t bytes;       /* tensor data in all shards (the index's total_size) */
    size_t params;
} mt_export_info;
/* Writes the weights of checkpoint or run folder ckpt as folder out (absent or empty):
 * config.json, model-0000i-of-0000N.safetensors holding the tensors in checkpoint order,
 * model.safetensors.index.json, the tokenizer files when the checkpoint has them, and
 * checksums.json; staged in out.tmp and renamed into place. */
int mt_ckpt_export(const char *ckpt, const char *out, const mt_export_opts *o, mt_export_info *info);

#endif
