/* cli/cmd_data.c — `moetrain data math|text`. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/common.h"
#include "cli/args.h"
#include "cli/cli.h"
#include "data/math.h"
#include "data/text.h"
#include "data/tokenizer.h"
#include "parallel/dist.h"

int mt_cli_fail(void) {
    fprintf(stderr, "moetrain: error: %s\n", mt_last_error());
    return 1;
}

int mt_cli_comm_timeout(const char *cmd, double seconds) {
    if (!(seconds >= 0) || !isfinite(seconds))
        return mt_error("%s: --comm-timeout must be a finite number of seconds >= 0 (0 = never)", cmd);
    mt_dist_set_timeout(seconds);
    return 0;
}

static int data_math(int argc, char **argv) {
    mt_math_opts o;
    mt_math_defaults(&o);
    const char *out = NULL, *mix = NULL;
    uint64_t ntrain = o.n_train, nval = o.n_val;
    int mind = o.min_digits, maxd = o.max_digits, terms = o.multi_terms, terms_given = 0;
    mt_arg specs[] = {
        {"out", MT_ARG_STR, &out, "output folder (required)", NULL},
        {"seed", MT_ARG_U64, &o.seed, "corpus seed (default 1)", NULL},
        {"train", MT_ARG_U64, &ntrain, "problems in the train split (default 200000)", NULL},
        {"val", MT_ARG_U64, &nval, "problems in the validation split (default 2000)", NULL},
        {"min-digits", MT_ARG_INT, &mind, "fewest digits of an operand (default 1)", NULL},
        {"max-digits", MT_ARG_INT, &maxd, "most digits of an operand (default 2)", NULL},
        {"mix", MT_ARG_STR, &mix, "operation weights, e.g. add=1,sub=1,mul=0.5,multi=0.5 (default add=1)", NULL},
        {"terms", MT_ARG_INT, &terms, "terms of a multi-step expression (--mix multi=W; default 3)", &terms_given},
        {"slip", MT_ARG_DBL, &o.slip, "fraction of the training additions whose ones digits carry written with that carry forgotten (a systematic mistake in the training text for RL to correct; the prompt files and validation stay exact; default 0)", NULL},
        {NULL, 0, NULL, NULL, NULL}};
    int rc = mt_args_parse("data math", "--out DIR [flags]\n\nWrites a seeded corpus of arithmetic problems "
                           "(one per document, byte tokens) as math_train_*.bin and math_val_*.bin, "
                           "and the same problems as RL prompt files math_prompts_train.tsv and "
                           "math_prompts_val.tsv (one \"PROMPT<TAB>ANSWER\" per line); "
                           "validation problems never occur in train.", specs, argc, argv, 3, NULL, 0, NULL);
    if (rc) return rc > 0 ? 0 : mt_cli_fail();
    if (!out) { mt_error("moetrain data math: --out DIR is required"); return mt_cli_fail(); }
    o.n_train = ntrain;
    o.n_val = nval;
    o.min_digits = mind;
    o.max_digits = maxd;
    o.multi_terms = terms;
    if (mix && mt_math_parse_mix(&o, mix) != 0) return mt_cli_fail();
    if (terms_given && !(mix && strstr(mix, "multi")))
        mt_warn("--terms shapes multi-step expressions, which --mix does not ask for (multi=W): no effect");
    double t0 = mt_now();
    if (mt_math_generate(&o, out) != 0) return mt_cli_fail();
    printf("wrote %llu train and %llu validation problems to %s (%.1f s)\n", (unsigned long long)o.n_train,
           (unsigned long long)o.n_val, out, mt_now() - t0);
    return 0;
}

static int data_text(int argc, char **argv) {
    const char *out = NULL, *tok_path = NULL, *eot_name = NULL;
    double valf = 0.05;
    int shard_m = 100;
    const char *files[1024];
    int nf = 0;
    mt_arg specs[] = {
        {"out", MT_ARG_STR, &out, "output folder (required)", NULL},
        {"val-fraction", MT_ARG_DBL, &valf, "fraction of documents held out for validation (default 0.05)", NULL},
        {"shard-mtokens", MT_ARG_INT, &shard_m, "tokens per shard, in millions (default 100)", NULL},
        {"tokenizer", MT_ARG_STR, &tok_path, "a Hugging Face tokenizer.json (byte-level BPE), or a folder holding one; "
                                             "copied into DIR (default: the byte tokenizer)", NULL},
        {"eot-token", MT_ARG_STR, &eot_name, "with --tokenizer: the end-of-text token's text (default: the file's "
                                             "<|endoftext|>, <|end_of_text|>, <\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c> or </s>)", NULL},
        {NULL, 0, NULL, NULL, NULL}};
    int rc = mt_args_parse("data text", "--out DIR FILE...\n\nEncodes text files with the byte tokenizer or "
                           "--tokenizer (each file one document, after an end-of-text token) into text_train_*.bin "
                           "and text_val_*.bin; a tokenizer.json goes into DIR with them.",
                           specs, argc, argv, 3, files, 1024, &nf);
    if (rc) return rc > 0 ? 0 : mt_cli_fail();
    if (!out) { mt_error("moetrain data text: --out DIR is required"); return mt_cli_fail(); }
    if (nf == 0) { mt_error("moetrain data text: no input files given"); return mt_cli_fail(); }
    if (valf < 0 || valf >= 1) { mt_error("moetrain data text: --val-fraction must be in [0, 1)"); return mt_cli_fail(); }
    if (shard_m < 1) { mt_error("moetrain data text: --shard-mtokens must be positive"); return mt_cli_fail(); }
    if (eot_name && !tok_path) { mt_error("moetrain data text: --eot-token needs --tokenizer"); return mt_cli_fail(); }
    mt_tokenizer tk;
    mt_tokenizer_byte(&tk);
    if (tok_path && mt_tokenizer_load_path(&tk, tok_path, eot_name) != 0) return mt_cli_fail();
    rc = mt_text_to_shards(files, nf, out, valf, (size_t)shard_m * 1000000, &tk);
    char desc[512];
    mt_tokenizer_describe(&tk, desc, sizeof desc);
    mt_tokenizer_free(&tk);
    if (rc != 0) return mt_cli_fail();
    printf("wrote shards of %d file(s) to %s (%s)\n", nf, out, desc);
    return 0;
}

int mt_cmd_data(int argc, char **argv) {
    if (argc >= 3 && strcmp(argv[2], "math") == 0) return data_math(argc, argv);
    if (argc >= 3 && strcmp(argv[2], "text") == 0) return data_text(argc, argv);
    if (argc >= 3 && (strcmp(argv[2], "--help") == 0 || strcmp(argv[2], "-h") == 0)) {
        printf("usage: moetrain data math --out DIR [flags]   synthetic arithmetic corpus\n"
               "       moetrain data text --out DIR FILE...   text files via the byte tokenizer or --tokenizer\n");
        return 0;
    }
    fprintf(stderr, "moetrain: error: data: expected 'math' or 'text' (see moetrain data --help)\n");
    return 2;
}
