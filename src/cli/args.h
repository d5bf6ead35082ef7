/* cli/args.h — a small table-driven flag parser shared by every command.
 * Flags are --name VALUE (or --name=VALUE); booleans are --name, and those with a `given`
 * slot (whose default may come from elsewhere, e.g. a resumed run) also --no-name, which
 * sets them to 0 and marks them given. Unknown flags, missing
 * values and malformed numbers (negative integers, NaN or infinite reals) are errors
 * naming the flag. */
#ifndef MT_CLI_ARGS_H
#define MT_CLI_ARGS_H

#include <stdint.h>

enum mt_arg_type { MT_ARG_STR, MT_ARG_INT, MT_ARG_U64, MT_ARG_DBL, MT_ARG_BOOL };

typedef struct {
    const char *name;        /* without the leading -- */
    int type;
    void *dst;
    const char *help;
    int *given;              /* optional: set to 1 when the flag appears */
} mt_arg;

/* Parses argv[first..argc) against specs (terminated by name == NULL). Positional
 * arguments are collected into pos (up to max_pos) and counted in *npos (NULL: none
 * allowed). Returns 0, 1 if --help was printed, -1 on error. */
int mt_args_parse(const char *cmd, const char *usage, const mt_arg *specs, int argc, char **argv,
                  int first, const char **pos, int max_pos, int *npos);
void mt_args_help(const char *cmd, const char *usage, const mt_arg *specs);

/* Resolves a config argument: an existing file, or a preset name found in configs/ next
 * to the executable (../configs/NAME.json), in ./configs, or in the configs/ of the source
 * tree it was built from. Returns a static buffer. */
const char *mt_cli_config_path(const char *name_or_path);

#endif
