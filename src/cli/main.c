/* cli/main.c — `moetrain <command> [flags]`: dispatch to the command files. */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "base/common.h"
#include "cli/cli.h"
#include "parallel/dist.h"
#include "kernels/blas.h"
#include "kernels/tier.h"

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} commands[] = {
    {"data", mt_cmd_data, "make token shards: `data math` (synthetic arithmetic) or `data text FILE...`"},
    {"train", mt_cmd_train, "train a model (new, --resume DIR or --init DIR)"},
    {"rl", mt_cmd_rl, "RL post-training (GRPO with verifiable rewards) from a checkpoint"},
    {"eval", mt_cmd_eval, "validation loss and math exact-match accuracy of a checkpoint"},
    {"generate", mt_cmd_generate, "sample text from a checkpoint given a prompt"},
    {"export", mt_cmd_export, "write a checkpoint as a Hugging Face / DeepSeek-V3 folder (sharded safetensors, F32 or BF16)"},
    {"info", mt_cmd_info, "parameters, active parameters, FLOPs per token, memory for a batch shape"},
    {"bench", mt_cmd_bench, "GEMM GFLOP/s of this machine and training throughput of a config"},
    {"dump", mt_cmd_dump, "write logits, losses and gradients of a checkpoint on a batch (testing)"},
    {"plan", mt_cmd_plan, "choose a parallel layout: model memory, compute and communication, simulate the pipeline schedule, search"},
};

static void usage(FILE *f) {
    fprintf(f, "moetrain — train Mixture-of-Experts language models\n\nusage: moetrain <command> [flags]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\n`moetrain <command> --help` lists a command's flags.\n");
}

int main(int argc, char **argv) {
    mt_memory_policy();
    /* a file that outgrows `ulimit -f` would kill the process without a word: ignored, the
     * write fails with EFBIG and the checked-write path reports it as it does ENOSPC */
    signal(SIGXFSZ, SIG_IGN);
    if (mt_cpu_tier_check() != 0) return mt_cli_fail();
    mt_blas_init(argc, argv);
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        if (strcmp(argv[1], commands[i].name) != 0) continue;
        /* MPI only for the commands that use it (train, rl): after mt_blas_init, which may
         * re-execute the binary, and as a singleton (world size 1) without mpirun */
        const int mpi = strcmp(argv[1], "train") == 0 || strcmp(argv[1], "rl") == 0;
        if (mpi && mt_dist_init(&argc, &argv) != 0) return mt_cli_fail();
        int rc = commands[i].fn(argc, argv);
        /* what a command printed reached stdout (a full disk or /dev/full is not a success) */
        if (rc == 0 && mt_file_check(stdout, "stdout") != 0) rc = mt_cli_fail();
        if (mpi) mt_dist_finalize();
        return rc;
    }
    fprintf(stderr, "moetrain: error: unknown command '%s' (see moetrain --help)\n", argv[1]);
    return 2;
}
