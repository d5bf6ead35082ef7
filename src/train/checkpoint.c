/* train/checkpoint.c — checkpoint folders: save, verify, load, export (see checkpoint.h). */
#include "train/checkpoint.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <xxhash.h>

#include "base/common.h"
#include "base/json.h"
#include "base/safetensors.h"

static const char *const ckpt_files[] = {"config.json", "model.safetensors", "optimizer.safetensors",
                                         "trainer_state.json", "tokenizer.json", "tokenizer_config.json", NULL};

static int file_xxh64(const char *path, unsigned long long *out) {
    int fd = mt_open_regular(path); /* a FIFO in place of a file would block the hash forever */
    if (fd < 0) return -1;
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        close(fd);
        return mt_error("%s: cannot open: %s", path, strerror(errno));
    }
    XXH64_state_t *st = XXH64_createState();
    XXH64_reset(st, 0);
    static _Thread_local char buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) XXH64_update(st, buf, n);
    int err = ferror(f);
    fclose(f);
    *out = XXH64_digest(st);
    XXH64_freeState(st);
    return err ? mt_error("%s: read error", path) : 0;
}

static void join(char *out, size_t cap, const char *dir, const char *name) {
    int n = snprintf(out, cap, "%s/%s", dir, name);
    MT_ASSERT(n > 0 && (size_t)n < cap); /* paths are bounded by the callers' 4096-byte buffers */
}

static int exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

static int write_params(const char *path, const mt_model *m, const float *base, const char *prefix) {
    mt_st_entry *e = mt_xcalloc((size_t)m->ntensors, sizeof *e);
    char **names = mt_xcalloc((size_t)m->ntensors, sizeof(char *));
    for (int i = 0; i < m->ntensors; i++) {
        const mt_tensor *t = &m->tensors[i];
        size_t n = strlen(prefix) + strlen(t->name) + 1;
        names[i] = mt_xmalloc(n);
        snprintf(names[i], n, "%s%s", prefix, t->name);
        e[i].name = names[i];
        e[i].data = base + t->offset;
        e[i].ndim = t->ndim;
        e[i].shape[0] = t->shape[0];
        e[i].shape[1] = t->shape[1];
    }
    int rc = mt_st_write(path, e, m->ntensors, NULL, 0);
    for (int i = 0; i < m->ntensors; i++) free(names[i]);
    free(names);
    free(e);
    return rc;
}

/* checksums.json of folder dir over those of names (NULL-terminated) that are present;
 * written last, it marks the folder complete. */
static int write_checksums(const char *dir, const char *const *names) {
    char path[4096];
    cJSON *root = cJSON_CreateObject(), *files = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "algorithm", "xxh64");
    for (int i = 0; names[i]; i++) {
        join(path, sizeof path, dir, names[i]);
        if (!exists(path)) continue;
        unsigned long long h;
        if (file_xxh64(path, &h) != 0) { cJSON_Delete(root); cJSON_Delete(files); return -1; }
        char hex[17];
        snprintf(hex, sizeof hex, "%016llx", h);
        cJSON_AddStringToObject(files, names[i], hex);
    }
    cJSON_AddItemToObject(root, "files", files);
    char *txt = cJSON_Print(root);
    cJSON_Delete(root);
    join(path, sizeof path, dir, "checksums.json");
    int rc = mt_write_file_atomic(path, txt, strlen(txt));
    free(txt);
    return rc;
}

/* Writes the checkpoint's files into folder dir (made). */
static int save_files(const char *dir, const mt_model *m, const float *m_adam, const float *v_adam,
                      const char *state_json, const mt_tokenizer *tk) {
    char path[4096];
    if (mt_mkdir_p(dir) != 0) return -1;
    join(path, sizeof path, dir, "config.json");
    if (mt_config_save(&m->cfg, path) != 0) return -1;
    join(path, sizeof path, dir, "model.safetensors");
    if (write_params(path, m, m->params, "") != 0) return -1;
    if (m_adam && v_adam) {
        /* one file, two tensors per parameter */
        int n = m->ntensors;
        mt_st_entry *e = mt_xcalloc((size_t)2 * n, sizeof *e);
        char **names = mt_xcalloc((size_t)2 * n, sizeof(char *));
        for (int i = 0; i < 2 * n; i++) {
            const mt_tensor *t = &m->tensors[i % n];
            const char *pre = i < n ? "exp_avg." : "exp_avg_sq.";
            size_t len = strlen(pre) + strlen(t->name) + 1;
            names[i] = mt_xmalloc(len);
            snprintf(names[i], len, "%s%s", pre, t->name);
            e[i].name = names[i];
            e[i].data = (i < n ? m_adam : v_adam) + t->offset;
            e[i].ndim = t->ndim;
            e[i].shape[0] = t->shape[0];
            e[i].shape[1] = t->shape[1];
        }
        join(path, sizeof path, dir, "optimizer.safetensors");
        int rc = mt_st_write(path, e, 2 * n, NULL, 0);
        for (int i = 0; i < 2 * n; i++) free(names[i]);
        free(names);
        free(e);
        if (rc != 0) return -1;
    }
    if (state_json) {
        join(path, sizeof path, dir, "trainer_state.json");
        if (mt_write_file_atomic(path, state_json, strlen(state_json)) != 0) return -1;
    }
    if (tk && tk->bpe && mt_tokenizer_save_dir(tk, dir) != 0) return -1;
    return write_checksums(dir, ckpt_files);
}

/* A failed save removes what it wrote beside the checkpoint (a full disk must not fill up
 * further with half-written folders); the save's own error stays the one reported. */
static int drop_tmp(const char *dir, const char *tmp) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", mt_last_error());
    if (mt_rm_tree(tmp) != 0) mt_warn("%s", mt_last_error());
    return mt_error("%s: checkpoint not saved: %s", dir, msg);
}

int mt_ckpt_save(const char *dir, const mt_model *m, const float *m_adam, const float *v_adam,
                 const char *state_json, const mt_tokenizer *tk) {
    /* the whole folder is written beside it (DIR.tmp), then put in place by one rename, or,
     * when DIR exists (saving a step again), by an atomic exchange: a crash leaves either the
     * old folder or the new one, never a mix */
    char tmp[4200], old[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", dir);
    if (mt_rm_tree(tmp) != 0) return -1; /* left by a crash */
    if (save_files(tmp, m, m_adam, v_adam, state_json, tk) != 0) return drop_tmp(dir, tmp);
    struct stat st;
    if (stat(dir, &st) != 0) {
        if (rename(tmp, dir) != 0) {
            mt_error("%s: cannot rename to %s: %s", tmp, dir, strerror(errno));
            return drop_tmp(dir, tmp);
        }
    } else if (renameat2(AT_FDCWD, tmp, AT_FDCWD, dir, RENAME_EXCHANGE) == 0) {
        mt_fsync_dir_of(dir);
        return mt_rm_tree(tmp); /* the old folder */
    } else { /* a file system without the exchange: move the old one aside first */
        snprintf(old, sizeof old, "%s.old", dir);
        if (mt_rm_tree(old) != 0) return drop_tmp(dir, tmp);
        if (rename(dir, old) != 0) {
            mt_error("%s: cannot put the new checkpoint in place: %s", dir, strerror(errno));
            return drop_tmp(dir, tmp);
        }
        if (rename(tmp, dir) != 0) {
            mt_error("%s: cannot put the new checkpoint in place: %s", dir, strerror(errno));
            if (rename(old, dir) != 0) mt_warn("%s: the previous checkpoint is left as %s", dir, old);
            return drop_tmp(dir, tmp);
        }
        mt_fsync_dir_of(dir);
        return mt_rm_tree(old);
    }
    mt_fsync_dir_of(dir);
    return 0;
}

int mt_ckpt_set_latest(const char *run_dir, const char *name) {
    char path[4096], line[512];
    join(path, sizeof path, run_dir, "latest");
    snprintf(line, sizeof line, "%s\n", name);
    return mt_write_file_atomic(path, line, strlen(line));
}

int mt_ckpt_resolve(const char *path, char *out, size_t cap) {
    char p[4096];
    struct stat st;
    if (stat(path, &st) != 0) return mt_error("%s: no such checkpoint or run folder", path);
    if (!S_ISDIR(st.st_mode)) return mt_error("%s: not a folder (expected a checkpoint folder)", path);
    join(p, sizeof p, path, "latest");
    if (exists(p)) {
        char *txt;
        if (mt_read_file(p, &txt, NULL) != 0) return -1;
        txt[strcspn(txt, "\r\n")] = 0;
        if (!txt[0] || strchr(txt, '/')) {
            free(txt);
            return mt_error("%s: does not name a checkpoint folder of the run", p);
        }
        snprintf(out, cap, "%s/%s", path, txt);
        free(txt);
        if (stat(out, &st) != 0 || !S_ISDIR(st.st_mode))
            return mt_error("%s names %s, which is not there", p, out);
        return 0;
    }
    join(p, sizeof p, path, "config.json");
    if (!exists(p)) return mt_error("%s: neither a checkpoint (no config.json) nor a run folder (no latest)", path);
    snprintf(out, cap, "%s", path);
    return 0;
}

int mt_ckpt_verify(const char *dir, int required) {
    char path[4096];
    join(path, sizeof path, dir, "checksums.json");
    if (!exists(path)) {
        if (required) return mt_error("%s: checkpoint is incomplete (no checksums.json)", dir);
        mt_warn("%s: no checksums.json (not written by moetrain?); loading without verification", dir);
        return 0;
    }
    cJSON *root = mt_json_read(path);
    if (!root) return -1;
    cJSON *files = cJSON_GetObjectItemCaseSensitive(root, "files");
    if (!cJSON_IsObject(files)) {
        cJSON_Delete(root);
        return mt_error("%s: key files: missing or not an object", path);
    }
    int rc = 0;
    cJSON *it;
    cJSON_ArrayForEach(it, files) {
        if (!cJSON_IsString(it)) { rc = mt_error("%s: key %s: not a string (a hex checksum)", path, it->string); break; }
        /* a listed name is a file of this folder, never a path out of it */
        if (!it->string[0] || strchr(it->string, '/') || strcmp(it->string, "..") == 0) {
            rc = mt_error("%s: key %s: not a file name of the checkpoint folder", path, it->string);
            break;
        }
        join(path, sizeof path, dir, it->string);
        unsigned long long h;
        if (file_xxh64(path, &h) != 0) { rc = -1; break; }
        char hex[17];
        snprintf(hex, sizeof hex, "%016llx", h);
        if (strcmp(hex, it->valuestring) != 0) {
            rc = mt_error("%s: checksum mismatch (file is corrupt or was changed after saving)", path);
            break;
        }
    }
    cJSON_Delete(root);
    return rc;
}

int mt_ckpt_load_config(const char *dir, mt_config *c) {
    char path[4096];
    join(path, sizeof path, dir, "config.json");
    return mt_config_load(c, path);
}

/* Non-finite values of a set, for the refusal or the warning: counted in one pass over the
 * floats as they land (the exponent's bits, so no compiler flag can fold the test away). */
typedef struct { size_t bad; int tensors; const char *first; size_t first_n; } nonfinite;

static void count_nonfinite(nonfinite *nf, const char *name, const float *x, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], 4);
        k += (u & 0x7f800000u) == 0x7f800000u;
    }
    if (!k) return;
    if (!nf->first) nf->first = name, nf->first_n = k;
    nf->bad += k;
    nf->tensors++;
}

/* A checkpoint with NaN or Inf weights would evaluate to nan and sample garbage without a
 * word: refused naming the first such tensor, unless asked for (forensics). */
static int nonfinite_verdict(const nonfinite *nf, const char *what, int allow) {
    if (!nf->bad) return 0;
    if (!allow)
        return mt_error("%s: tensor %s holds %zu NaN/Inf value(s), %zu in %d tensor(s) in all: refusing to load it "
                        "(--allow-nonfinite loads it anyway)", what, nf->first, nf->first_n, nf->bad, nf->tensors);
    mt_warn("%s: tensor %s holds %zu NaN/Inf value(s), %zu in %d tensor(s) in all; loaded as --allow-nonfinite asks",
            what, nf->first, nf->first_n, nf->bad, nf->tensors);
    return 0;
}

/* Is name an MTP block's copy of the embedding or the head (model.layers.{L+k-1}.embed_tokens
 * or .shared_head.head), which the model shares with the main stack? */
static int mtp_copy(const mt_config *c, const char *name) {
    int l = -1, n = 0;
    char rest[64];
    if (sscanf(name, "model.layers.%d.%63s%n", &l, rest, &n) != 2 || name[n] != 0) return 0;
    if (l < c->num_hidden_layers || l >= mt_config_layers(c)) return 0;
    return strcmp(rest, "embed_tokens.weight") == 0 || strcmp(rest, "shared_head.head.weight") == 0;
}

static int load_set(mt_st_reader *r, const char *what, const mt_model *m, float *base,
                    const char *prefix, int allow_tied_head, int allow_nonfinite) {
    char name[256];
    nonfinite nf = {0, 0, NULL, 0};
    for (int i = 0; i < m->ntensors; i++) {
        const mt_tensor *t = &m->tensors[i];
        snprintf(name, sizeof name, "%s%s", prefix, t->name);
        if (mt_st_read_f32(r, name, base + t->offset, t->ndim, t->shape) != 0) return -1;
        count_nonfinite(&nf, t->name, base + t->offset, t->numel);
    }
    /* extra tensors */
    for (int i = 0; i < mt_st_count(r); i++) {
        const char *nm = mt_st_name(r, i);
        if (strncmp(nm, prefix, strlen(prefix)) != 0) continue;
        if (mt_model_find(m, nm + strlen(prefix))) continue;
        if (allow_tied_head && strcmp(nm, "lm_head.weight") == 0) {
            mt_warn("%s: lm_head.weight present with tie_word_embeddings=true; ignored", what);
            continue;
        }
        if (!*prefix && mtp_copy(&m->cfg, nm)) {
            mt_warn("%s: %s is a copy of the shared %s (DeepSeek-V3 files carry one per MTP block); ignored", what, nm,
                    strstr(nm, "embed_tokens") ? "model.embed_tokens.weight" : "head");
            continue;
        }
        return mt_error("%s: unexpected tensor %s (not part of the model described by config.json)", what, nm);
    }
    if (nf.first) { /* the name, with the set's prefix, outlives the loop's buffer */
        snprintf(name, sizeof name, "%s%s", prefix, nf.first);
        nf.first = name;
    }
    return nonfinite_verdict(&nf, what, allow_nonfinite);
}

int mt_ckpt_load_weights(const char *dir, mt_model *m, int allow_nonfinite) {
    mt_st_reader *r;
    if (mt_st_open(&r, dir) != 0) return -1;
    int rc = load_set(r, dir, m, m->params, "", m->cfg.tie_word_embeddings, allow_nonfinite);
    mt_st_close(r);
    return rc;
}

int mt_ckpt_load_optimizer(const char *dir, const mt_model *m, float *m_adam, float *v_adam, int allow_nonfinite) {
    char path[4096];
    join(path, sizeof path, dir, "optimizer.safetensors");
    if (!exists(path)) return mt_error("%s: missing (cannot resume the optimizer state)", path);
    mt_st_reader *r;
    if (mt_st_open(&r, path) != 0) return -1;
    int rc = load_set(r, path, m, m_adam, "exp_avg.", 0, allow_nonfinite);
    if (rc == 0) rc = load_set(r, path, m, v_adam, "exp_avg_sq.", 0, allow_nonfinite);
    mt_st_close(r);
    return rc;
}

int mt_ckpt_load_state(const char *dir, char **json, size_t *len) {
    char path[4096];
    join(path, sizeof path, dir, "trainer_state.json");
    return mt_read_file(path, json, len);
}

/* mt_ckpt_open_model; infer: parameters only (no gradient buffer). */
static int open_model(const char *path, mt_model *m, char *resolved, size_t cap, int allow_nonfinite, int infer) {
    char dir[4096];
    mt_config cfg;
    if (mt_ckpt_resolve(path, dir, sizeof dir) != 0) return -1;
    if (mt_ckpt_verify(dir, 0) != 0) return -1;
    if (mt_ckpt_load_config(dir, &cfg) != 0) return -1;
    char cpath[4200];
    snprintf(cpath, sizeof cpath, "%s/config.json", dir);
    if (mt_model_check(&cfg, cpath) != 0 || (infer ? mt_model_init_infer(m, &cfg) : mt_model_init(m, &cfg)) != 0)
        return -1;
    if (mt_ckpt_load_weights(dir, m, allow_nonfinite) != 0) { mt_model_free(m); return -1; }
    if (resolved) snprintf(resolved, cap, "%s", dir);
    return 0;
}

int mt_ckpt_open_model(const char *path, mt_model *m, char *resolved, size_t cap, int allow_nonfinite) {
    return open_model(path, m, resolved, cap, allow_nonfinite, 0);
}

/* ---- export: the Hugging Face / DeepSeek-V3 folder layout ---- */

/* 0 when out may receive the export (absent, or an empty folder); an error otherwise, so a
 * folder holding anything (another model, the source itself) is never mixed into. */
static int export_target_ok(const char *out) {
    struct stat st;
    if (stat(out, &st) != 0) {
        if (errno == ENOENT) return 0;
        return mt_error("%s: cannot use as the output folder: %s", out, strerror(errno));
    }
    if (!S_ISDIR(st.st_mode)) return mt_error("%s: exists and is not a folder", out);
    DIR *d = opendir(out);
    if (!d) return mt_error("%s: cannot read the output folder: %s", out, strerror(errno));
    struct dirent *e;
    int empty = 1;
    while (empty && (e = readdir(d))) empty = strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0;
    closedir(d);
    return empty ? 0 : mt_error("%s: exists and is not empty (export writes a new folder: remove it or give "
                                "another --out)", out);
}

/* The shards, index, config.json, tokenizer and checksums.json of model m (a whole model,
 * parameters only) in the staging folder tmp. */
static int export_files(const char *tmp, const mt_model *m, const mt_tokenizer *tk, const mt_export_opts *o,
                        mt_export_info *info) {
    const int n = m->ntensors, bf16 = o->dtype == MT_ST_BF16;
    const uint64_t es = bf16 ? 2 : 4;
    /* tensors in checkpoint order, a new shard when the next would pass the size; one
     * larger than the size alone gets a shard of its own (tensors are never split) */
    int *shard = mt_xcalloc((size_t)n + 1, sizeof *shard), ns = 0;
    uint64_t used = 0, total = 0;
    for (int i = 0; i < n; i++) {
        const uint64_t b = (uint64_t)m->tensors[i].numel * es;
        if (i == 0 || (used > 0 && used + b > o->shard_bytes)) ns++, used = 0;
        shard[i] = ns - 1;
        used += b;
        total += b;
    }
    char **files = mt_xcalloc((size_t)ns + 8, sizeof *files); /* the shards, then the other files, NULL */
    mt_st_entry *e = mt_xcalloc((size_t)n + 1, sizeof *e);
    char path[4096];
    int rc = 0;
    for (int s = 0, i = 0; rc == 0 && s < ns; s++) {
        char name[64];
        snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", s + 1, ns);
        files[s] = mt_xstrdup(name);
        int k = 0;
        for (; i < n && shard[i] == s; i++, k++) {
            const mt_tensor *t = &m->tensors[i];
            e[k] = (mt_st_entry){t->name, m->params + t->offset, t->ndim, {t->shape[0], t->shape[1]}};
        }
        join(path, sizeof path, tmp, name);
        rc = mt_st_write_as(path, e, k, NULL, 0, o->dtype);
    }
    if (rc == 0) { /* {"metadata": {"total_size": bytes of tensor data}, "weight_map": {name: shard}} */
        cJSON *root = cJSON_CreateObject(), *md = cJSON_AddObjectToObject(root, "metadata");
        char num[32];
        snprintf(num, sizeof num, "%llu", (unsigned long long)total);
        cJSON_AddItemToObject(md, "total_size", cJSON_CreateRaw(num));
        cJSON *wm = cJSON_AddObjectToObject(root, "weight_map");
        for (int i = 0; i < n; i++) cJSON_AddStringToObject(wm, m->tensors[i].name, files[shard[i]]);
        char *txt = cJSON_Print(root);
        cJSON_Delete(root);
        join(path, sizeof path, tmp, "model.safetensors.index.json");
        rc = mt_write_file_atomic(path, txt, strlen(txt));
        free(txt);
    }
    if (rc == 0) {
        char *txt = mt_config_to_json_as(&m->cfg, bf16 ? "bfloat16" : "float32");
        join(path, sizeof path, tmp, "config.json");
        rc = mt_write_file_atomic(path, txt, strlen(txt));
        free(txt);
    }
    if (rc == 0 && tk->bpe) rc = mt_tokenizer_save_dir(tk, tmp);
    if (rc == 0) {
        const char *more[] = {"model.safetensors.index.json", "config.json", "tokenizer.json", "tokenizer_config.json"};
        for (int j = 0; j < 4; j++) files[ns + j] = mt_xstrdup(more[j]);
        rc = write_checksums(tmp, (const char *const *)files);
    }
    for (int j = 0; files[j]; j++) free(files[j]);
    free(files);
    free(e);
    free(shard);
    info->shards = ns;
    info->tensors = n;
    info->bytes = total;
    info->params = m->nparams;
    return rc;
}

int mt_ckpt_export(const char *ckpt, const char *out_arg, const mt_export_opts *o, mt_export_info *info) {
    MT_ASSERT(o->shard_bytes > 0 && (o->dtype == MT_ST_F32 || o->dtype == MT_ST_BF16));
    char out[4096], tmp[4200], dir[4096];
    snprintf(out, sizeof out, "%s", out_arg);
    /* "DIR/" must stage in DIR.tmp beside it, not in DIR/.tmp */
    for (size_t k = strlen(out); k > 1 && out[k - 1] == '/'; k--) out[k - 1] = 0;
    if (export_target_ok(out) != 0) return -1;
    mt_model m;
    if (open_model(ckpt, &m, dir, sizeof dir, o->allow_nonfinite, 1) != 0) return -1;
    mt_tokenizer tk;
    if (mt_tokenizer_load_dir(&tk, dir) != 0) { mt_model_free(&m); return -1; }
    snprintf(tmp, sizeof tmp, "%s.tmp", out);
    int rc = mt_rm_tree(tmp) != 0 || mt_mkdir_p(tmp) != 0 ? -1 : export_files(tmp, &m, &tk, o, info);
    mt_tokenizer_free(&tk);
    mt_model_free(&m);
    /* one rename puts the whole folder in place (over an empty one too) */
    if (rc == 0 && rename(tmp, out) != 0) rc = mt_error("%s: cannot rename to %s: %s", tmp, out, strerror(errno));
    if (rc != 0) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", mt_last_error());
        if (mt_rm_tree(tmp) != 0) mt_warn("%s", mt_last_error());
        return mt_error("%s: export not written: %s", out, msg);
    }
    mt_fsync_dir_of(out);
    return 0;
}
