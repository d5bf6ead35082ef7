/* base/json.h — the one strict way moetrain reads JSON (RFC 8259).
 *
 * cJSON alone is lenient: it reads 064, 64. and 1e999 (as infinity), and stops at a NUL
 * byte. Every reader of a JSON file (config.json, trainer_state.json, checksums.json,
 * rl_settings.json, cluster files, safetensors headers and indexes) goes through
 * mt_json_parse, so one rule holds everywhere (docs/FORMATS.md, "JSON"). */
#ifndef MT_BASE_JSON_H
#define MT_BASE_JSON_H

#include <stddef.h>

#include <cjson/cJSON.h>

/* 0 when text[0..len) is exactly one JSON value (surrounded by whitespace only): no NUL
 * byte, numbers in the RFC 8259 grammar and within double range, no NaN/Infinity, no
 * trailing comma, strings with valid escapes and no \u0000. Otherwise -1 after mt_error()
 * naming `what`, the object key where the bad token sits and the line. */
int mt_json_check(const char *what, const char *text, size_t len);

/* mt_json_check, then the cJSON tree (free with cJSON_Delete); NULL after mt_error() when
 * the text is not strict JSON or an object repeats a key (readers disagree on which wins). */
cJSON *mt_json_parse(const char *what, const char *text, size_t len);
/* The file at path read and parsed as above (errors name the path); NULL after mt_error(). */
cJSON *mt_json_read(const char *path);

/* Number `key` of object obj: 1 when read into *v, 0 when absent (or JSON null), -1 after
 * mt_error() naming `what` and the key when it is not a number, not an integer (with
 * `integer`; 8.0 is one) or outside [lo, hi], which `range` says in words. */
int mt_json_number(const char *what, const cJSON *obj, const char *key, int integer, double lo, double hi,
                   const char *range, double *v);

#endif
