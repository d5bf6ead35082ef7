/* cli/cmd_rl.c — `moetrain rl`. */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <xxhash.h>

#include "base/common.h"
#include "cli/args.h"
#include "cli/cli.h"
#include "parallel/dist.h"
#include "rl/rl.h"

int mt_cmd_rl(int argc, char **argv) {
    mt_rl_opts o;
    mt_rl_defaults(&o);
    const char *data = NULL;
    mt_train_opts *t = &o.train;
    double comm_timeout = MT_COMM_TIMEOUT_DEFAULT;
    mt_arg specs[] = {
        {"init", MT_ARG_STR, &t->init, "checkpoint or run folder of the policy to start from (required)", NULL},
        {"resume", MT_ARG_STR, &t->resume, "continue an rl run exactly from its run or checkpoint folder, with its settings (only --steps, --out, --threads, --save-every, --keep, --quiet, the dumps and the layout flags may be given)", NULL},
        {"out", MT_ARG_STR, &t->out, "run folder: checkpoints and metrics.jsonl (required)", NULL},
        {"data", MT_ARG_STR, &data, "folder of `data math`: its math_prompts_train.tsv / _val.tsv are the prompts", NULL},
        {"prompts", MT_ARG_STR, &o.prompts, "prompt file (PROMPT<TAB>ANSWER per line)", NULL},
        {"eval-prompts", MT_ARG_STR, &o.eval_prompts, "held-out prompt file for the greedy accuracy", NULL},
        {"task", MT_ARG_STR, &o.task, "reward: math (exact answer; default)", NULL},
        {"steps", MT_ARG_INT, &t->steps, "RL steps (default 50)", &t->set_steps},
        {"group", MT_ARG_INT, &o.group, "completions per prompt G (default 8)", NULL},
        {"prompts-per-step", MT_ARG_INT, &o.prompts_per_step, "prompts per step (default 16)", NULL},
        {"max-new", MT_ARG_INT, &o.max_new, "completion tokens at most (default 16)", NULL},
        {"temperature", MT_ARG_DBL, &o.temperature, "sampling temperature (default 1.0)", NULL},
        {"top-k", MT_ARG_INT, &o.top_k, "sample from the k most likely tokens, 0 = all (default 0)", NULL},
        {"top-p", MT_ARG_DBL, &o.top_p, "nucleus mass over the top-k (default 1.0)", NULL},
        {"slots", MT_ARG_INT, &o.slots, "sequences the rollout decodes together (default 64)", NULL},
        {"eps-low", MT_ARG_DBL, &o.eps_low, "clip below 1 - eps-low (default 0.2)", NULL},
        {"eps-high", MT_ARG_DBL, &o.eps_high, "clip above 1 + eps-high (default 0.2)", NULL},
        {"is-cap", MT_ARG_DBL, &o.is_cap, "cap of the truncated importance weight (default 5)", NULL},
        {"agg", MT_ARG_STR, &o.agg, "loss aggregation: token-mean (default), seq-mean-token-mean, seq-mean-token-sum-norm", NULL},
        {"no-scale", MT_ARG_BOOL, &o.no_scale, "advantages not divided by the group's std", NULL},
        {"drop-uniform", MT_ARG_BOOL, &o.drop_uniform, "leave out groups whose rewards are all equal", NULL},
        {"beta", MT_ARG_DBL, &o.beta, "weight of the k3 KL to the --init weights, kept frozen (default 0: none)", NULL},
        {"speculative", MT_ARG_BOOL, &o.speculative, "rollouts decode speculatively: the model's MTP block drafts the token after next and the next forward verifies it (the same completions in fewer forwards; needs num_nextn_predict_layers >= 1)", NULL},
        {"routing-replay", MT_ARG_BOOL, &o.routing_replay, "the trainer's forwards route each token to the experts the rollout chose", NULL},
        {"format-penalty", MT_ARG_DBL, &o.format_penalty, "reward of a malformed completion is -this (default 0)", NULL},
        {"micro-batch", MT_ARG_INT, &o.micro_batch, "completions per trainer micro-batch (default min(64, the rank's))", NULL},
        {"eval-every", MT_ARG_INT, &o.eval_every, "steps between held-out accuracies, 0 = start and end only", NULL},
        {"eval-n", MT_ARG_INT, &o.eval_n, "held-out prompts per evaluation (default 200)", NULL},
        {"lr", MT_ARG_DBL, &t->lr, "learning rate (default 1e-4, constant after --warmup)", NULL},
        {"warmup", MT_ARG_INT, &t->warmup, "linear warmup steps (default 0)", NULL},
        {"min-lr-ratio", MT_ARG_DBL, &t->min_lr_ratio, "final lr as a fraction of the peak, cosine (default 1: constant)", NULL},
        {"wd", MT_ARG_DBL, &t->wd, "AdamW weight decay (default 0)", NULL},
        {"clip", MT_ARG_DBL, &t->clip, "global gradient-norm clip, 0 = off (default 1.0)", NULL},
        {"seed", MT_ARG_U64, &t->seed, "seed of the prompt order and the sampling (default 1)", NULL},
        {"save-every", MT_ARG_INT, &t->save_every, "steps between checkpoints, 0 = only at the end", &t->set_save_every},
        {"keep", MT_ARG_INT, &t->keep, "checkpoints kept (default 2, 0 = all)", &t->set_keep},
        {"dump-rollouts", MT_ARG_STR, &o.dump_rollouts, "folder: each step's rollouts and loss as step_NNNNNNNN.json (FORMATS.md 8.1; step 1 starts from --init, step s from OUT/step_<s-1> with --save-every 1 --keep 0)", NULL},
        {"dump-grads", MT_ARG_STR, &o.dump_grads, "file: the first trained step's gradient (before clipping) as safetensors, checkpoint names; one process", NULL},
        {"threads", MT_ARG_INT, &t->threads, "threads (default: OMP_NUM_THREADS or all cores)", NULL},
        {"bf16", MT_ARG_BOOL, &t->bf16, "mixed precision for rollout and training (AVX512-BF16)", &t->set_bf16},
        {"quiet", MT_ARG_BOOL, &t->quiet, "no progress output", NULL},
        {"rollout-ranks", MT_ARG_INT, &o.rollout_ranks, "under mpirun: separate deployment, the last R ranks only roll out and the others only train (weights sent each step); 0 = every rank does both (default)", NULL},
        {"rollout-ep", MT_ARG_INT, &o.rollout_ep, "under mpirun, co-located: the rollout layout splits the routed experts over groups of N consecutive ranks (expert parallelism, as Pangu's inference layout), the rest of the weights copied on each; the switch sends each rank only its part (default 1: a whole copy per rank)", NULL},
        {"rollout-tp", MT_ARG_INT, &o.rollout_tp, "under mpirun, co-located: the rollout layout splits the attention heads and the dense FFN over groups of N consecutive ranks (tensor parallelism, no SP; Megatron's column/row split), each group sampling its ranks' prompts together; the switch sends each rank only its slices (default 1: none)", NULL},
        {"max-staleness", MT_ARG_INT, &o.max_staleness, "StaleSync: step n may train on completions sampled by version n-1-S (S steps old; default 0: synchronous); co-located the rollout of step n+S runs after step n-1, separate it overlaps training", NULL},
        {"stale-free", MT_ARG_BOOL, &o.stale_free, "with --rollout-ranks: sample with the newest weights that have arrived (fresher, not reproducible) instead of exactly version n-1-S", NULL},
        {"no-is-weight", MT_ARG_BOOL, &o.no_is_weight, "no truncated importance weight w = min(exp(logp_old - logp_behav), is-cap): w = 1 (the ablation of stale rollouts)", NULL},
        {"profile", MT_ARG_BOOL, &o.profile, "write a Chrome trace per rank (OUT/trace_rank<R>.json): rollout, waits, switch, training", NULL},
        {"pp", MT_ARG_INT, &t->pp, "under mpirun: training pipeline stages (the rollout runs on every rank from a whole copy of the weights)", NULL},
        {"tp", MT_ARG_INT, &t->tp, "under mpirun: training tensor-parallel size", NULL},
        {"sp", MT_ARG_BOOL, &t->sp, "sequence parallelism with --tp", NULL},
        {"ep", MT_ARG_INT, &t->ep, "under mpirun: training expert-parallel group size", NULL},
        {"dist-opt", MT_ARG_BOOL, &t->dist_opt, "under mpirun: ZeRO-1 (AdamW state sharded over DP)", NULL},
        {"a2a", MT_ARG_STR, &t->a2a, "expert all-to-all: hier (default) or flat", NULL},
        {"ranks-per-node", MT_ARG_INT, &t->ranks_per_node, "emulate nodes of this many consecutive ranks", NULL},
        {"comm-timeout", MT_ARG_DBL, &comm_timeout, "under mpirun: seconds one collective may wait before the job is ended as stuck, 0 = never (default 600)", NULL},
        {"allow-nonfinite", MT_ARG_BOOL, &t->allow_nonfinite, "load a checkpoint that holds NaN or Inf values (a warning names them) instead of refusing it", NULL},
        {NULL, 0, NULL, NULL, NULL}};
    int rc = mt_args_parse("rl", "--init CKPT --data DIR --out DIR [flags]", specs, argc, argv, 2, NULL, 0, NULL);
    const int multi = mt_dist_get()->size > 1;
    if (rc < 0 && multi) mt_dist_abort(mt_last_error());
    if (rc) return rc > 0 ? 0 : mt_cli_fail();
    if (mt_cli_comm_timeout("rl", comm_timeout) != 0) return multi ? (mt_dist_abort(mt_last_error()), 1) : mt_cli_fail();
    if (t->resume) { /* the run's settings come from it: only these flags make sense */
        static const char *const ok[] = {"--resume", "--steps", "--out", "--threads", "--save-every", "--keep", "--quiet",
                                         "--dump-rollouts", "--dump-grads", "--comm-timeout", "--allow-nonfinite",
                                         "--pp", "--tp", "--sp", "--ep", "--dist-opt", "--a2a", "--ranks-per-node",
                                         "--rollout-ranks", "--rollout-ep", "--rollout-tp", "--profile"};
        for (int i = 2; i < argc; i++) {
            if (strncmp(argv[i], "--", 2) != 0) continue;
            size_t n = strcspn(argv[i], "=");
            int found = 0;
            for (size_t k = 0; k < sizeof ok / sizeof ok[0]; k++) found |= strlen(ok[k]) == n && !strncmp(argv[i], ok[k], n);
            if (!found) {
                mt_error("rl: --resume takes the run's settings: %.*s cannot be given with it", (int)n, argv[i]);
                return multi ? (mt_dist_abort(mt_last_error()), 1) : mt_cli_fail();
            }
        }
    }
    char ptrain[4200], pval[4200];
    if (data && !o.prompts) {
        snprintf(ptrain, sizeof ptrain, "%s/math_prompts_train.tsv", data);
        o.prompts = ptrain;
    }
    if (data && !o.eval_prompts) {
        snprintf(pval, sizeof pval, "%s/math_prompts_val.tsv", data);
        struct stat st; /* stat, not fopen: a FIFO of that name must not block (the loader refuses it) */
        if (stat(pval, &st) == 0) o.eval_prompts = pval;
    }
    if (!t->out && !t->resume) { mt_error("rl: --out DIR is required"); return multi ? (mt_dist_abort(mt_last_error()), 1) : mt_cli_fail(); }
    XXH64_state_t *h = XXH64_createState();
    XXH64_reset(h, 0);
    for (int i = 2; i < argc; i++) XXH64_update(h, argv[i], strlen(argv[i]) + 1);
    t->args_hash = XXH64_digest(h);
    XXH64_freeState(h);
    if (mt_rl(&o) != 0) {
        if (multi) mt_dist_abort(mt_last_error());
        return mt_cli_fail();
    }
    return 0;
}
