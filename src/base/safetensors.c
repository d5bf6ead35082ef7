/* base/safetensors.c — safetensors reader and writer (see safetensors.h, docs/FORMATS.md).
 *
 * Reader: parses and validates every header up front (dtype, shape, byte size, offsets,
 * contiguity), keeps the files open and reads tensor data on demand with pread, so a
 * checkpoint larger than memory is never slurped. A directory is either one
 * model.safetensors or a Hugging Face index (model.safetensors.index.json) plus shards;
 * tensor lookup goes through a name-sorted table to the shard that holds the tensor.
 * Writer: streams header and data to path.tmp (BF16 converted chunk by chunk), fsyncs and
 * renames (atomic replace). */
#include "base/safetensors.h"

#include "base/common.h"
#include "base/json.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Same cap as the reference implementation: a header above this is corrupt. */
#define ST_MAX_HEADER ((uint64_t)100000000)
/* Largest integer a JSON number (double) holds exactly. */
#define ST_MAX_EXACT ((double)9007199254740992.0)
/* BF16 conversion buffer, in elements. */
#define ST_CHUNK ((size_t)1 << 20)

typedef struct {
    char *name;
    int dtype;                    /* enum mt_st_dtype */
    int ndim;
    int64_t shape[MT_ST_MAX_DIMS];
    uint64_t begin, end;          /* byte offsets relative to the data region */
    int shard;                    /* index into reader->shards */
} st_tensor;

typedef struct {
    char *path;
    int fd;
    uint64_t data_start;          /* 8 + header length */
} st_shard;

struct mt_st_reader {
    char *path;                   /* as given to mt_st_open */
    st_shard *shards;
    int n_shards;
    st_tensor *tensors;           /* shard order, then offset order */
    int n_tensors;
    int *by_name;                 /* tensor indices sorted by name */
    char **meta;                  /* key, value, key, value, ... */
    int n_meta;
};

static int host_is_little_endian(void) {
    const uint32_t one = 1;
    unsigned char b;
    memcpy(&b, &one, 1);
    return b == 1;
}

static int is_exact_uint(const cJSON *v, uint64_t *out) {
    if (!cJSON_IsNumber(v)) return 0;
    double d = v->valuedouble;
    if (!isfinite(d) || d < 0 || d > ST_MAX_EXACT || floor(d) != d) return 0;
    *out = (uint64_t)d;
    return 1;
}

/* pread the whole range or fail (short reads retried, EINTR handled). */
static int pread_full(int fd, void *buf, size_t len, uint64_t off, const char *path) {
    char *p = buf;
    while (len > 0) {
        size_t want = len > ((size_t)1 << 30) ? ((size_t)1 << 30) : len;
        ssize_t got = pread(fd, p, want, (off_t)off);
        if (got < 0) {
            if (errno == EINTR) continue;
            return mt_error("%s: read failed at byte %llu: %s", path, (unsigned long long)off,
                            strerror(errno));
        }
        if (got == 0)
            return mt_error("%s: unexpected end of file at byte %llu", path,
                            (unsigned long long)off);
        p += got;
        len -= (size_t)got;
        off += (uint64_t)got;
    }
    return 0;
}

static void format_shape(char *buf, size_t cap, int ndim, const int64_t *shape) {
    size_t n = 0;
    n += (size_t)snprintf(buf + n, cap - n, "[");
    for (int i = 0; i < ndim && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
}

static void free_tensors(st_tensor *t, int n) {
    for (int i = 0; i < n; i++) free(t[i].name);
    free(t);
}

static int cmp_offset(const void *a, const void *b) {
    const st_tensor *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

/* One tensor entry of a header. */
static int parse_entry(const cJSON *item, st_tensor *t, const char *path) {
    const char *name = item->string;
    if (!cJSON_IsObject(item))
        return mt_error("%s: tensor %s: header entry is not an object", path, name);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(item, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(item, "shape");
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(item, "data_offsets");
    if (!cJSON_IsString(dt))
        return mt_error("%s: tensor %s: missing or non-string dtype", path, name);
    if (strcmp(dt->valuestring, "F32") == 0) t->dtype = MT_ST_F32;
    else if (strcmp(dt->valuestring, "BF16") == 0) t->dtype = MT_ST_BF16;
    else
        return mt_error("%s: tensor %s has unsupported dtype %s (F32 and BF16 are accepted)",
                        path, name, dt->valuestring);
    if (!cJSON_IsArray(sh))
        return mt_error("%s: tensor %s: missing or non-array shape", path, name);
    int nd = cJSON_GetArraySize(sh);
    if (nd > MT_ST_MAX_DIMS)
        return mt_error("%s: tensor %s has %d dimensions (at most %d supported)", path, name,
                        nd, MT_ST_MAX_DIMS);
    t->ndim = nd;
    uint64_t numel = 1;
    int i = 0;
    const cJSON *d;
    cJSON_ArrayForEach(d, sh) {
        uint64_t v;
        if (!is_exact_uint(d, &v) || v > (uint64_t)INT64_MAX)
            return mt_error("%s: tensor %s: shape entry %d is not a non-negative integer", path,
                            name, i);
        t->shape[i++] = (int64_t)v;
        if (v != 0 && numel > UINT64_MAX / 4 / v)
            return mt_error("%s: tensor %s: shape too large", path, name);
        numel *= v;
    }
    if (!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2 ||
        !is_exact_uint(cJSON_GetArrayItem(off, 0), &t->begin) ||
        !is_exact_uint(cJSON_GetArrayItem(off, 1), &t->end))
        return mt_error("%s: tensor %s: data_offsets must be two non-negative integers", path,
                        name);
    if (t->end < t->begin)
        return mt_error("%s: tensor %s: data_offsets [%llu, %llu] end before they begin", path,
                        name, (unsigned long long)t->begin, (unsigned long long)t->end);
    uint64_t bytes = numel * (t->dtype == MT_ST_F32 ? 4u : 2u);
    if (t->end - t->begin != bytes) {
        char s[160];
        format_shape(s, sizeof s, t->ndim, t->shape);
        return mt_error("%s: tensor %s: data_offsets [%llu, %llu] span %llu bytes, but %s %s "
                        "needs %llu", path, name, (unsigned long long)t->begin,
                        (unsigned long long)t->end, (unsigned long long)(t->end - t->begin),
                        dt->valuestring, s, (unsigned long long)bytes);
    }
    return 0;
}

/* Parses the header of one file. On success *fd_out is an open descriptor, the tensors are
 * returned in offset order (shard field set), and string metadata is appended to
 * (*meta, *n_meta) for keys not already present. */
static int parse_file(const char *path, int shard, int *fd_out, uint64_t *data_start,
                      st_tensor **out, int *n_out, char ***meta, int *n_meta) {
    int fd = mt_open_regular(path);
    if (fd < 0) return -1;
    struct stat stt;
    if (fstat(fd, &stt) != 0) {
        close(fd);
        return mt_error("%s: cannot stat: %s", path, strerror(errno));
    }
    uint64_t fsize = (uint64_t)stt.st_size;
    if (fsize < 8) {
        close(fd);
        return mt_error("%s: truncated: %llu bytes, shorter than the 8-byte header length",
                        path, (unsigned long long)fsize);
    }
    unsigned char lb[8];
    if (pread_full(fd, lb, 8, 0, path) != 0) { close(fd); return -1; }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | lb[i];
    if (hlen < 2 || hlen > fsize - 8) {
        close(fd);
        return mt_error("%s: header length %llu does not fit in the file (%llu bytes)", path,
                        (unsigned long long)hlen, (unsigned long long)fsize);
    }
    if (hlen > ST_MAX_HEADER) {
        close(fd);
        return mt_error("%s: header length %llu exceeds the %llu-byte limit", path,
                        (unsigned long long)hlen, (unsigned long long)ST_MAX_HEADER);
    }
    char *hdr = mt_xmalloc((size_t)hlen + 1);
    if (pread_full(fd, hdr, (size_t)hlen, 8, path) != 0) { free(hdr); close(fd); return -1; }
    hdr[hlen] = 0;
    char what[4200];
    snprintf(what, sizeof what, "%s: header", path);
    /* strict JSON: a NUL byte or anything but whitespace padding after the object is refused */
    cJSON *root = mt_json_parse(what, hdr, (size_t)hlen);
    free(hdr);
    if (!root || !cJSON_IsObject(root)) {
        if (root) mt_error("%s: header is not a JSON object", path);
        cJSON_Delete(root);
        close(fd);
        return -1;
    }

    int cap = cJSON_GetArraySize(root);
    st_tensor *t = mt_xcalloc((size_t)cap, sizeof *t);
    int n = 0;
    const cJSON *item;
    cJSON_ArrayForEach(item, root) {
        if (strcmp(item->string, "__metadata__") == 0) {
            if (!cJSON_IsObject(item) && !cJSON_IsNull(item)) {
                mt_error("%s: __metadata__ is not an object", path);
                goto fail;
            }
            const cJSON *kv;
            cJSON_ArrayForEach(kv, item) {
                if (!cJSON_IsString(kv) || !meta) continue;
                int dup = 0;
                for (int j = 0; j < *n_meta && !dup; j++)
                    dup = strcmp((*meta)[2 * j], kv->string) == 0;
                if (dup) continue;
                *meta = mt_xrealloc(*meta, (size_t)(*n_meta + 1) * 2 * sizeof(char *));
                (*meta)[2 * *n_meta] = mt_xstrdup(kv->string);
                (*meta)[2 * *n_meta + 1] = mt_xstrdup(kv->valuestring);
                (*n_meta)++;
            }
            continue;
        }
        if (parse_entry(item, &t[n], path) != 0) goto fail;
        t[n].name = mt_xstrdup(item->string);
        t[n].shard = shard;
        n++;
    }
    cJSON_Delete(root);
    root = NULL;

    /* Contiguity: sorted by offset, the tensors tile the data region exactly. */
    qsort(t, (size_t)n, sizeof *t, cmp_offset);
    uint64_t data_len = fsize - 8 - hlen, pos = 0;
    for (int i = 0; i < n; i++) {
        if (t[i].begin > pos) {
            mt_error("%s: gap of %llu bytes before tensor %s (data_offsets begin at %llu, "
                     "previous data ends at %llu)", path,
                     (unsigned long long)(t[i].begin - pos), t[i].name,
                     (unsigned long long)t[i].begin, (unsigned long long)pos);
            goto fail;
        }
        if (t[i].begin < pos) {
            mt_error("%s: tensor %s overlaps the previous tensor (data_offsets begin at %llu, "
                     "previous data ends at %llu)", path, t[i].name,
                     (unsigned long long)t[i].begin, (unsigned long long)pos);
            goto fail;
        }
        pos = t[i].end;
    }
    if (pos != data_len) {
        if (pos > data_len)
            mt_error("%s: truncated: tensors need %llu data bytes, the file holds %llu", path,
                     (unsigned long long)pos, (unsigned long long)data_len);
        else
            mt_error("%s: %llu trailing bytes after the last tensor (tensors cover %llu of "
                     "%llu data bytes)", path, (unsigned long long)(data_len - pos),
                     (unsigned long long)pos, (unsigned long long)data_len);
        goto fail;
    }
    *fd_out = fd;
    *data_start = 8 + hlen;
    *out = t;
    *n_out = n;
    return 0;
fail:
    cJSON_Delete(root);
    free_tensors(t, n);
    close(fd);
    return -1;
}

typedef struct {
    const char *name;
    int idx;
} st_name_idx;

static int cmp_name_idx(const void *a, const void *b) {
    return strcmp(((const st_name_idx *)a)->name, ((const st_name_idx *)b)->name);
}

static int find_tensor(const mt_st_reader *r, const char *name) {
    int lo = 0, hi = r->n_tensors - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(r->tensors[r->by_name[mid]].name, name);
        if (c == 0) return r->by_name[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid - 1;
    }
    return -1;
}

/* Builds the name index; fails on a name defined twice (e.g. in two shards). */
static int build_index(mt_st_reader *r) {
    /* (name, index) pairs: C11 qsort has no context argument, and no global state keeps
     * concurrent opens safe. */
    st_name_idx *tmp = mt_xmalloc((size_t)(r->n_tensors ? r->n_tensors : 1) * sizeof *tmp);
    for (int i = 0; i < r->n_tensors; i++) tmp[i] = (st_name_idx){r->tensors[i].name, i};
    qsort(tmp, (size_t)r->n_tensors, sizeof *tmp, cmp_name_idx);
    r->by_name = mt_xmalloc((size_t)(r->n_tensors ? r->n_tensors : 1) * sizeof(int));
    for (int i = 0; i < r->n_tensors; i++) r->by_name[i] = tmp[i].idx;
    free(tmp);
    for (int i = 1; i < r->n_tensors; i++) {
        const st_tensor *a = &r->tensors[r->by_name[i - 1]], *b = &r->tensors[r->by_name[i]];
        if (strcmp(a->name, b->name) != 0) continue;
        if (a->shard == b->shard)
            return mt_error("%s: tensor %s is defined twice", r->shards[a->shard].path, a->name);
        return mt_error("%s: tensor %s is defined twice (in %s and %s)", r->path, a->name,
                        r->shards[a->shard].path, r->shards[b->shard].path);
    }
    return 0;
}

static int add_shard(mt_st_reader *r, const char *path) {
    r->shards = mt_xrealloc(r->shards, (size_t)(r->n_shards + 1) * sizeof *r->shards);
    st_shard *s = &r->shards[r->n_shards];
    s->path = mt_xstrdup(path);
    s->fd = -1;
    s->data_start = 0;
    return r->n_shards++;
}

static int open_single(mt_st_reader *r, const char *file) {
    int s = add_shard(r, file);
    return parse_file(file, s, &r->shards[s].fd, &r->shards[s].data_start, &r->tensors,
                      &r->n_tensors, &r->meta, &r->n_meta);
}

static char *join_path(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = mt_xmalloc(n);
    snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static int cmp_str_ptr(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* HF index: {"metadata": {"total_size": N}, "weight_map": {name: file}}. */
static int open_index(mt_st_reader *r, const char *dir, const char *index_path) {
    cJSON *root = mt_json_read(index_path);
    if (!root || !cJSON_IsObject(root)) {
        if (root) mt_error("%s: not a JSON object", index_path);
        cJSON_Delete(root);
        return -1;
    }
    int rc = -1;
    char **names = NULL;          /* sorted copy of the weight_map keys */
    int n_names = 0;
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(wm)) {
        mt_error("%s: key weight_map: missing or not an object", index_path);
        goto done;
    }
    /* Shards, in order of first appearance. */
    const cJSON *e;
    cJSON_ArrayForEach(e, wm) {
        if (!cJSON_IsString(e) || !e->valuestring[0]) {
            mt_error("%s: weight_map entry %s: file name is not a non-empty string", index_path,
                     e->string);
            goto done;
        }
        if (strstr(e->valuestring, "..") || e->valuestring[0] == '/') {
            mt_error("%s: weight_map entry %s: file name %s leaves the checkpoint directory",
                     index_path, e->string, e->valuestring);
            goto done;
        }
        char *sp = join_path(dir, e->valuestring);
        int found = 0;
        for (int s = 0; s < r->n_shards && !found; s++) found = strcmp(r->shards[s].path, sp) == 0;
        if (!found) add_shard(r, sp);
        free(sp);
        names = mt_xrealloc(names, (size_t)(n_names + 1) * sizeof(char *));
        names[n_names++] = e->string;
    }
    qsort(names, (size_t)n_names, sizeof(char *), cmp_str_ptr);
    for (int i = 1; i < n_names; i++)
        if (strcmp(names[i - 1], names[i]) == 0) {
            mt_error("%s: weight_map lists tensor %s twice", index_path, names[i]);
            goto done;
        }
    for (int s = 0; s < r->n_shards; s++) {
        st_tensor *t = NULL;
        int n = 0;
        if (parse_file(r->shards[s].path, s, &r->shards[s].fd, &r->shards[s].data_start, &t, &n,
                       &r->meta, &r->n_meta) != 0)
            goto done;
        r->tensors = mt_xrealloc(r->tensors, (size_t)(r->n_tensors + n + 1) * sizeof *t);
        memcpy(r->tensors + r->n_tensors, t, (size_t)n * sizeof *t);
        r->n_tensors += n;
        free(t);
    }
    if (build_index(r) != 0) goto done;
    /* Every index entry must be in the shard it names, and every shard tensor listed. */
    cJSON_ArrayForEach(e, wm) {
        int ti = find_tensor(r, e->string);
        char *sp = join_path(dir, e->valuestring);
        if (ti < 0) {
            mt_error("%s: tensor %s is listed in %s but missing from this shard", sp, e->string,
                     index_path);
            free(sp);
            goto done;
        }
        if (strcmp(r->shards[r->tensors[ti].shard].path, sp) != 0) {
            mt_error("%s: tensor %s is listed in %s for this shard but found in %s", sp,
                     e->string, index_path, r->shards[r->tensors[ti].shard].path);
            free(sp);
            goto done;
        }
        free(sp);
    }
    if (r->n_tensors != n_names) {
        for (int i = 0; i < r->n_tensors; i++) {
            const char *nm = r->tensors[i].name;
            if (!bsearch(&nm, names, (size_t)n_names, sizeof(char *), cmp_str_ptr)) {
                mt_error("%s: tensor %s is not listed in %s", r->shards[r->tensors[i].shard].path,
                         nm, index_path);
                goto done;
            }
        }
        MT_ASSERT(0);
    }
    /* total_size is advisory (writers disagree on what it counts): warn, do not fail. */
    const cJSON *md = cJSON_GetObjectItemCaseSensitive(root, "metadata");
    const cJSON *ts = cJSON_IsObject(md) ? cJSON_GetObjectItemCaseSensitive(md, "total_size") : NULL;
    if (ts) {
        uint64_t want, have = 0;
        for (int i = 0; i < r->n_tensors; i++) have += r->tensors[i].end - r->tensors[i].begin;
        if (!is_exact_uint(ts, &want))
            mt_warn("%s: metadata.total_size is not a non-negative integer; ignored", index_path);
        else if (want != have)
            mt_warn("%s: metadata.total_size is %llu but the shards hold %llu tensor bytes",
                    index_path, (unsigned long long)want, (unsigned long long)have);
    }
    rc = 0;
done:
    free(names);
    cJSON_Delete(root);
    return rc;
}

int mt_st_open(mt_st_reader **out, const char *path) {
    MT_ASSERT(out && path);
    *out = NULL;
    if (!host_is_little_endian())
        return mt_error("%s: safetensors I/O needs a little-endian host", path);
    struct stat stt;
    if (stat(path, &stt) != 0) return mt_error("%s: cannot open: %s", path, strerror(errno));
    mt_st_reader *r = mt_xcalloc(1, sizeof *r);
    r->path = mt_xstrdup(path);
    int rc;
    if (S_ISDIR(stt.st_mode)) {
        char *single = join_path(path, "model.safetensors");
        char *index = join_path(path, "model.safetensors.index.json");
        if (access(single, F_OK) == 0) rc = open_single(r, single);
        else if (access(index, F_OK) == 0) rc = open_index(r, path, index);
        else rc = mt_error("%s: directory holds neither model.safetensors nor "
                           "model.safetensors.index.json", path);
        free(single);
        free(index);
        if (rc == 0 && !r->by_name) rc = build_index(r);
    } else {
        rc = open_single(r, path);
        if (rc == 0) rc = build_index(r);
    }
    if (rc != 0) {
        mt_st_close(r);
        return -1;
    }
    *out = r;
    return 0;
}

void mt_st_close(mt_st_reader *r) {
    if (!r) return;
    for (int s = 0; s < r->n_shards; s++) {
        if (r->shards[s].fd >= 0) close(r->shards[s].fd);
        free(r->shards[s].path);
    }
    free(r->shards);
    free_tensors(r->tensors, r->n_tensors);
    free(r->by_name);
    for (int i = 0; i < 2 * r->n_meta; i++) free(r->meta[i]);
    free(r->meta);
    free(r->path);
    free(r);
}

int mt_st_count(const mt_st_reader *r) { return r->n_tensors; }

const char *mt_st_name(const mt_st_reader *r, int i) {
    MT_ASSERT(i >= 0 && i < r->n_tensors);
    return r->tensors[i].name;
}

int mt_st_has(const mt_st_reader *r, const char *name, int *ndim, int64_t *shape) {
    int i = find_tensor(r, name);
    if (i < 0) return 0;
    const st_tensor *t = &r->tensors[i];
    if (ndim) *ndim = t->ndim;
    if (shape) memcpy(shape, t->shape, (size_t)t->ndim * sizeof(int64_t));
    return 1;
}

int mt_st_read_f32(mt_st_reader *r, const char *name, float *dst, int ndim, const int64_t *shape) {
    MT_ASSERT(r && name && ndim >= 0 && ndim <= MT_ST_MAX_DIMS);
    int i = find_tensor(r, name);
    if (i < 0) return mt_error("%s: tensor %s not found", r->path, name);
    const st_tensor *t = &r->tensors[i];
    const st_shard *s = &r->shards[t->shard];
    int same = t->ndim == ndim;
    for (int k = 0; same && k < ndim; k++) same = t->shape[k] == shape[k];
    if (!same) {
        char a[160], b[160];
        format_shape(a, sizeof a, t->ndim, t->shape);
        format_shape(b, sizeof b, ndim, shape);
        return mt_error("%s: tensor %s has shape %s, expected %s", s->path, name, a, b);
    }
    uint64_t bytes = t->end - t->begin, off = s->data_start + t->begin;
    if (bytes == 0) return 0;
    MT_ASSERT(dst);
    if (t->dtype == MT_ST_F32) return pread_full(s->fd, dst, (size_t)bytes, off, s->path);
    /* BF16: the upper 16 bits of an fp32, converted chunk by chunk. */
    size_t numel = (size_t)(bytes / 2), done = 0;
    uint16_t *buf = mt_xmalloc((numel < ST_CHUNK ? numel : ST_CHUNK) * sizeof(uint16_t));
    while (done < numel) {
        size_t m = numel - done < ST_CHUNK ? numel - done : ST_CHUNK;
        if (pread_full(s->fd, buf, m * 2, off + 2 * (uint64_t)done, s->path) != 0) {
            free(buf);
            return -1;
        }
        for (size_t j = 0; j < m; j++) {
            uint32_t u = (uint32_t)buf[j] << 16;
            memcpy(&dst[done + j], &u, 4);
        }
        done += m;
    }
    free(buf);
    return 0;
}

const char *mt_st_metadata(const mt_st_reader *r, const char *key) {
    for (int i = 0; i < r->n_meta; i++)
        if (strcmp(r->meta[2 * i], key) == 0) return r->meta[2 * i + 1];
    return NULL;
}

/* ---- writer ---- */

static cJSON *json_u64(uint64_t v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%llu", (unsigned long long)v);
    return cJSON_CreateRaw(buf);
}

/* Builds the header JSON (unpadded). Returns NULL after mt_error on bad entries. */
static char *build_header(const char *path, const mt_st_entry *entries, int n,
                          const char *const *meta, int n_meta, int dtype) {
    const uint64_t es = dtype == MT_ST_BF16 ? 2 : 4;
    cJSON *root = cJSON_CreateObject();
    cJSON *md = cJSON_AddObjectToObject(root, "__metadata__");
    cJSON_AddStringToObject(md, "format", "pt");
    for (int i = 0; i < n_meta; i++) {
        const char *k = meta[2 * i], *v = meta[2 * i + 1];
        MT_ASSERT(k && v);
        if (cJSON_GetObjectItemCaseSensitive(md, k))
            cJSON_ReplaceItemInObjectCaseSensitive(md, k, cJSON_CreateString(v));
        else
            cJSON_AddStringToObject(md, k, v);
    }
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        const mt_st_entry *e = &entries[i];
        if (!e->name || !e->name[0] || strcmp(e->name, "__metadata__") == 0) {
            mt_error("%s: tensor %d has an invalid name", path, i);
            goto fail;
        }
        if (cJSON_GetObjectItemCaseSensitive(root, e->name)) {
            mt_error("%s: tensor %s is given twice", path, e->name);
            goto fail;
        }
        if (e->ndim < 0 || e->ndim > MT_ST_MAX_DIMS) {
            mt_error("%s: tensor %s has %d dimensions", path, e->name, e->ndim);
            goto fail;
        }
        uint64_t numel = 1;
        cJSON *t = cJSON_AddObjectToObject(root, e->name);
        cJSON_AddStringToObject(t, "dtype", dtype == MT_ST_BF16 ? "BF16" : "F32");
        cJSON *sh = cJSON_AddArrayToObject(t, "shape");
        for (int k = 0; k < e->ndim; k++) {
            if (e->shape[k] < 0) {
                mt_error("%s: tensor %s has a negative dimension", path, e->name);
                goto fail;
            }
            uint64_t d = (uint64_t)e->shape[k];
            if (d != 0 && numel > (uint64_t)(ST_MAX_EXACT / 4) / d) {
                mt_error("%s: tensor %s is too large", path, e->name);
                goto fail;
            }
            numel *= d;
            cJSON_AddItemToArray(sh, json_u64(d));
        }
        if (numel > 0 && !e->data) {
            mt_error("%s: tensor %s has no data", path, e->name);
            goto fail;
        }
        cJSON *o = cJSON_AddArrayToObject(t, "data_offsets");
        cJSON_AddItemToArray(o, json_u64(off));
        off += es * numel;
        cJSON_AddItemToArray(o, json_u64(off));
    }
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    MT_ASSERT(s);
    char *copy = mt_xstrdup(s);
    cJSON_free(s);
    return copy;
fail:
    cJSON_Delete(root);
    return NULL;
}

/* Writes numel floats of x as BF16, through a bounded buffer. */
static int write_bf16(FILE *f, const float *x, size_t numel) {
    uint16_t buf[4096];
    for (size_t done = 0; done < numel;) {
        size_t m = numel - done < 4096 ? numel - done : 4096;
        for (size_t j = 0; j < m; j++) buf[j] = mt_f32_to_bf16(x[done + j]);
        if (fwrite(buf, sizeof buf[0], m, f) != m) return 0;
        done += m;
    }
    return 1;
}

int mt_st_write(const char *path, const mt_st_entry *entries, int n,
                const char *const *meta, int n_meta) {
    return mt_st_write_as(path, entries, n, meta, n_meta, MT_ST_F32);
}

int mt_st_write_as(const char *path, const mt_st_entry *entries, int n,
                   const char *const *meta, int n_meta, int dtype) {
    MT_ASSERT(path && n >= 0 && (n == 0 || entries) && n_meta >= 0 && (n_meta == 0 || meta));
    MT_ASSERT(dtype == MT_ST_F32 || dtype == MT_ST_BF16);
    if (!host_is_little_endian())
        return mt_error("%s: safetensors I/O needs a little-endian host", path);
    char *hdr = build_header(path, entries, n, meta, n_meta, dtype);
    if (!hdr) return -1;
    /* Pad with spaces so that the data starts 8-byte aligned, as the reference does. */
    size_t hlen = strlen(hdr), padded = (hlen + 7) / 8 * 8;
    hdr = mt_xrealloc(hdr, padded + 1);
    memset(hdr + hlen, ' ', padded - hlen);
    hdr[padded] = 0;

    size_t tn = strlen(path) + 8;
    char *tmp = mt_xmalloc(tn);
    snprintf(tmp, tn, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        int rc = mt_error("%s: cannot create: %s", tmp, strerror(errno));
        free(tmp); free(hdr);
        return rc;
    }
    unsigned char lb[8];
    for (int i = 0; i < 8; i++) lb[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    int ok = fwrite(lb, 1, 8, f) == 8 && fwrite(hdr, 1, padded, f) == padded;
    free(hdr);
    for (int i = 0; ok && i < n; i++) {
        size_t numel = 1;
        for (int k = 0; k < entries[i].ndim; k++) numel *= (size_t)entries[i].shape[k];
        if (!numel) continue;
        if (dtype == MT_ST_BF16) ok = write_bf16(f, entries[i].data, numel);
        else ok = fwrite(entries[i].data, sizeof(float), numel, f) == numel;
    }
    ok = ok && fflush(f) == 0 && fsync(fileno(f)) == 0;
    int err = errno;
    if (fclose(f) != 0 && ok) { ok = 0; err = errno; }
    if (!ok) {
        int rc = mt_error("%s: write failed: %s", tmp, strerror(err));
        unlink(tmp);
        free(tmp);
        return rc;
    }
    if (rename(tmp, path) != 0) {
        int rc = mt_error("%s: rename to %s failed: %s", tmp, path, strerror(errno));
        unlink(tmp);
        free(tmp);
        return rc;
    }
    free(tmp);
    return mt_fsync_dir_of(path); /* the rename made durable */
}
