/* data/shard.h — llm.c-style token shards (docs/FORMATS.md "Token data").
 *
 * Header: 256 little-endian int32; [0] magic, [1] version, [2] token count.
 * 20240520/1 = uint16 tokens, 20240801/7 = uint32 tokens. The writer picks uint16 when
 * every token fits in 16 bits. */
#ifndef MT_DATA_SHARD_H
#define MT_DATA_SHARD_H

#include <stddef.h>
#include <stdint.h>

#define MT_SHARD_MAGIC16 20240520
#define MT_SHARD_VERSION16 1
#define MT_SHARD_MAGIC32 20240801
#define MT_SHARD_VERSION32 7

/* Writes tokens to path (atomically). */
int mt_shard_write(const char *path, const uint32_t *tokens, size_t n);
/* Reads and validates a whole shard into a malloc'd uint32 array. Errors name the file:
 * missing, too short, unknown magic/version, size disagreeing with the header. */
int mt_shard_read(const char *path, uint32_t **tokens, size_t *n);

#endif
