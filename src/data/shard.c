/* data/shard.c — reading and writing llm.c-style token shards (see shard.h).
 *
 * All header and token words are encoded little-endian byte by byte, so the files are
 * the same on any host and match what llm.c's data scripts (numpy "<i4"/"<u2"/"<u4")
 * write. */
#include "data/shard.h"

#include "base/common.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define HEADER_WORDS 256
#define HEADER_BYTES (HEADER_WORDS * 4)
#define READ_CHUNK ((size_t)1 << 20) /* tokens per fread when loading */

static void put32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)v; p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16); p[3] = (unsigned char)(v >> 24);
}

static uint32_t get32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

int mt_shard_write(const char *path, const uint32_t *tokens, size_t n) {
    MT_ASSERT(path && (tokens || n == 0));
    if (n > (size_t)INT32_MAX)
        return mt_error("%s: %zu tokens do not fit one shard (max %d)", path, n, INT32_MAX);
    int wide = 0;
    for (size_t i = 0; i < n; i++)
        if (tokens[i] > 0xffff) { wide = 1; break; }
    size_t width = wide ? 4 : 2;
    size_t bytes = HEADER_BYTES + n * width;
    unsigned char *buf = mt_xcalloc(bytes, 1);
    put32(buf + 0, wide ? MT_SHARD_MAGIC32 : MT_SHARD_MAGIC16);
    put32(buf + 4, wide ? MT_SHARD_VERSION32 : MT_SHARD_VERSION16);
    put32(buf + 8, (uint32_t)n);
    unsigned char *p = buf + HEADER_BYTES;
    for (size_t i = 0; i < n; i++) {
        if (wide) { put32(p, tokens[i]); p += 4; }
        else { p[0] = (unsigned char)tokens[i]; p[1] = (unsigned char)(tokens[i] >> 8); p += 2; }
    }
    int rc = mt_write_file_atomic(path, buf, bytes);
    free(buf);
    return rc;
}

int mt_shard_read(const char *path, uint32_t **tokens, size_t *n) {
    MT_ASSERT(path && tokens && n);
    int fd = mt_open_regular(path); /* a FIFO named *train*.bin would block fopen forever */
    if (fd < 0) return -1;
    FILE *f = fdopen(fd, "rb");
    struct stat st;
    if (!f || fstat(fd, &st) != 0) {
        if (f) fclose(f);
        else close(fd);
        return mt_error("%s: cannot open shard: %s", path, strerror(errno));
    }
    uint64_t size = (uint64_t)st.st_size;
    unsigned char hdr[HEADER_BYTES];
    if (size < HEADER_BYTES || fread(hdr, 1, HEADER_BYTES, f) != HEADER_BYTES) {
        fclose(f);
        return mt_error("%s: shorter than the %d-byte shard header (%llu bytes)", path,
                        HEADER_BYTES, (unsigned long long)size);
    }
    uint32_t magic = get32(hdr), version = get32(hdr + 4);
    int32_t count = (int32_t)get32(hdr + 8);
    size_t width;
    if (magic == MT_SHARD_MAGIC16 && version == MT_SHARD_VERSION16) width = 2;
    else if (magic == MT_SHARD_MAGIC32 && version == MT_SHARD_VERSION32) width = 4;
    else {
        fclose(f);
        return mt_error("%s: not a token shard (magic %u version %u; expected %d/%d or %d/%d)",
                        path, magic, version, MT_SHARD_MAGIC16, MT_SHARD_VERSION16,
                        MT_SHARD_MAGIC32, MT_SHARD_VERSION32);
    }
    if (count < 0) { fclose(f); return mt_error("%s: negative token count %d in header", path, count); }
    size_t cnt = (size_t)count;
    uint64_t want = HEADER_BYTES + (uint64_t)cnt * width;
    if (size != want) {
        fclose(f);
        return mt_error("%s: file is %llu bytes but its header says %zu tokens of %zu bytes (%llu bytes)",
                        path, (unsigned long long)size, cnt, width, (unsigned long long)want);
    }
    uint32_t *out = mt_xmalloc(cnt * sizeof *out);
    unsigned char *chunk = mt_xmalloc(READ_CHUNK * width);
    for (size_t done = 0; done < cnt;) {
        size_t k = cnt - done < READ_CHUNK ? cnt - done : READ_CHUNK;
        if (fread(chunk, width, k, f) != k) {
            free(chunk); free(out); fclose(f);
            return mt_error("%s: read failed", path);
        }
        for (size_t i = 0; i < k; i++)
            out[done + i] = width == 4 ? get32(chunk + 4 * i)
                                       : (uint32_t)chunk[2 * i] | (uint32_t)chunk[2 * i + 1] << 8;
        done += k;
    }
    free(chunk);
    fclose(f);
    *tokens = out;
    *n = cnt;
    return 0;
}
