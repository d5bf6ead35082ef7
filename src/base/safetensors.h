/* base/safetensors.h — reading and writing safetensors files (docs/FORMATS.md).
 *
 * Format: 8-byte little-endian header length N, N bytes of JSON header
 * {"__metadata__": {...}, name: {"dtype": "F32", "shape": [...], "data_offsets": [b, e]}},
 * then the data, tensors contiguous with no gaps in offset order.
 * The reader accepts F32 and BF16 (converted to F32), a single file or a directory holding
 * model.safetensors or a HF index (model.safetensors.index.json + shards). The writer stores
 * F32 as given or rounds to BF16 (nearest even). */
#ifndef MT_BASE_SAFETENSORS_H
#define MT_BASE_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#define MT_ST_MAX_DIMS 8

/* Element types of the subset read and written. */
enum mt_st_dtype { MT_ST_F32 = 0, MT_ST_BF16 = 1 };

typedef struct mt_st_reader mt_st_reader;

/* Opens path: a .safetensors file, or a directory with model.safetensors or
 * model.safetensors.index.json. Validates the header (JSON, dtypes, offsets inside the
 * file, no gaps/overlaps, total size). Errors name the file. */
int mt_st_open(mt_st_reader **out, const char *path);
void mt_st_close(mt_st_reader *r);
/* Number of tensors and their names (index i in [0, count)). */
int mt_st_count(const mt_st_reader *r);
const char *mt_st_name(const mt_st_reader *r, int i);
/* Returns 1 if the tensor exists, and its shape. */
int mt_st_has(const mt_st_reader *r, const char *name, int *ndim, int64_t *shape);
/* Reads tensor `name` as float32 into dst, checking that its shape equals
 * shape[0..ndim). Errors: missing tensor, wrong shape (both named), unsupported dtype. */
int mt_st_read_f32(mt_st_reader *r, const char *name, float *dst, int ndim, const int64_t *shape);
/* The value of a string key of __metadata__, or NULL. */
const char *mt_st_metadata(const mt_st_reader *r, const char *key);

typedef struct {
    const char *name;
    const float *data;           /* F32, row-major */
    int ndim;
    int64_t shape[MT_ST_MAX_DIMS];
} mt_st_entry;

/* Writes F32 tensors in the given order with __metadata__ {"format": "pt", plus the
 * optional key/value pairs meta[0..2*n_meta)}; atomically (tmp, fsync, rename). */
int mt_st_write(const char *path, const mt_st_entry *entries, int n,
                const char *const *meta, int n_meta);
/* mt_st_write storing every tensor as dtype (enum mt_st_dtype; BF16: mt_f32_to_bf16 of each value). */
int mt_st_write_as(const char *path, const mt_st_entry *entries, int n,
                   const char *const *meta, int n_meta, int dtype);

#endif
