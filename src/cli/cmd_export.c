/* cli/cmd_export.c — `moetrain export`: a checkpoint's weights as a Hugging Face /
 * DeepSeek-V3 folder (config.json, sharded safetensors, model.safetensors.index.json;
 * docs/FORMATS.md 4.7), F32 or BF16. */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/common.h"
#include "base/safetensors.h"
#include "cli/args.h"
#include "cli/cli.h"
#include "train/checkpoint.h"

/* A size as Hugging Face's max_shard_size writes it: a number (a fraction allowed) and a
 * unit, decimal (KB = 1000) or binary (KiB = 1024), any case; a bare number is bytes. */
static int parse_size(const char *s, uint64_t *out) {
    static const struct { const char *unit; double mult; } units[] = {
        {"", 1}, {"B", 1}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
        {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0}};
    const char *p = s;
    while (isdigit((unsigned char)*p)) p++;
    if (p == s) return -1;
    if (*p == '.') {
        const char *f = ++p;
        while (isdigit((unsigned char)*p)) p++;
        if (p == f) return -1;
    }
    const double v = strtod(s, NULL);
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcasecmp(p, units[i].unit) != 0) continue;
        const double b = floor(v * units[i].mult);
        if (!(b >= 1) || b > 9.2e18) return -1;
        *out = (uint64_t)b;
        return 0;
    }
    return -1;
}

int mt_cmd_export(int argc, char **argv) {
    const char *ckpt = NULL, *out = NULL, *dtype = "f32", *size = "5GB";
    mt_export_opts o = {MT_ST_F32, 0, 0};
    mt_arg specs[] = {
        {"ckpt", MT_ARG_STR, &ckpt, "checkpoint or run folder (required)", NULL},
        {"out", MT_ARG_STR, &out, "output folder, absent or empty (required)", NULL},
        {"dtype", MT_ARG_STR, &dtype, "f32 (exact) or bf16 (rounded to nearest even) (default f32)", NULL},
        {"shard-size", MT_ARG_STR, &size, "most tensor bytes per shard file: 5GB, 500MB, 2GiB, bytes (default 5GB)", NULL},
        {"allow-nonfinite", MT_ARG_BOOL, &o.allow_nonfinite, "export a checkpoint that holds NaN or Inf values (a warning names them) instead of refusing it", NULL},
        {NULL, 0, NULL, NULL, NULL}};
    int rc = mt_args_parse("export", "--ckpt DIR --out DIR [--dtype f32|bf16] [--shard-size SIZE]", specs, argc, argv,
                           2, NULL, 0, NULL);
    if (rc) return rc > 0 ? 0 : mt_cli_fail();
    if (!ckpt || !out) { mt_error("moetrain export: --ckpt DIR and --out DIR are required"); return mt_cli_fail(); }
    if (strcmp(dtype, "f32") == 0) o.dtype = MT_ST_F32;
    else if (strcmp(dtype, "bf16") == 0) o.dtype = MT_ST_BF16;
    else { mt_error("moetrain export: --dtype must be f32 or bf16, got '%s'", dtype); return mt_cli_fail(); }
    if (parse_size(size, &o.shard_bytes) != 0) {
        mt_error("moetrain export: --shard-size expects a positive size such as 5GB, 500MB, 2GiB or 1048576 "
                 "(bytes), got '%s'", size);
        return mt_cli_fail();
    }
    mt_export_info info;
    if (mt_ckpt_export(ckpt, out, &o, &info) != 0) return mt_cli_fail();
    printf("exported %s to %s: %d tensors (%zu parameters), %llu bytes of %s tensor data in %d shard%s\n", ckpt, out,
           info.tensors, info.params, (unsigned long long)info.bytes, o.dtype == MT_ST_BF16 ? "BF16" : "F32",
           info.shards, info.shards == 1 ? "" : "s");
    return 0;
}
