/* train/run.c — the run driver of `moetrain train` (mt_train, see trainer.h): a trainer,
 * each step's micro-batches sampled from the training data, the cadence of evaluation,
 * progress lines, expert-load reports and checkpoints, and the report at the end. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "parallel/wire.h"
#include "base/trace.h"
#include "kernels/blas.h"
#include "kernels/tier.h"
#include "train/report.h"
#include "train/trainer.h"
#include "train/trainer_impl.h"

/* The start-up lines: model, threads and kernels, batch, layout, resume (rank 0). */
static void print_banner(const mt_trainer *t, const mt_report *rp, int n_moe, size_t step_tokens) {
    const mt_train_opts *o = &t->o;
    const mt_config *cfg = &t->cfg;
    const mt_dist *d = t->d;
    const int D = d->dp_size, W = d->size, S = o->pp * o->vpp;
    char gemm[64];
    if (o->bf16) snprintf(gemm, sizeof gemm, "kernels %s, GEMM bf16 x bf16 -> fp32", mt_cpu_tier_name(mt_cpu_tier()));
    else snprintf(gemm, sizeof gemm, "kernels %s, BLAS kernel %s", mt_cpu_tier_name(mt_cpu_tier()), mt_blas_corename());
    char mtp[48] = "";
    if (cfg->num_nextn_predict_layers > 0)
        snprintf(mtp, sizeof mtp, " + %d MTP block%s", cfg->num_nextn_predict_layers,
                 cfg->num_nextn_predict_layers > 1 ? "s" : "");
    printf("moetrain train: %zu parameters (%.1fM active per token), %d layers%s (%d MoE), "
           "%d threads, %s (%.0f GFLOP/s peak %s)\n",
           t->nfull, mt_model_active_params(cfg) / 1e6, cfg->num_hidden_layers, mtp, n_moe, t->nthr, gemm, rp->peak,
           o->peak_gflops > 0 ? "given" : "measured");
    char dp[64] = "";
    if (D > 1) snprintf(dp, sizeof dp, " x DP %d", D);
    printf("  batch %d x seq %d x accum %d%s = %zu tokens/step, %d steps, lr %.2e warmup %d, "
           "activations %.1f MiB, data %llu train tokens%s\n",
           o->batch, o->seq, o->accum, dp, step_tokens, o->steps, o->lr, o->warmup,
           (double)t->pipe.acts_bytes / 1048576.0,
           (unsigned long long)mt_loader_tokens(t->train), t->val || o->eval_every == 0 ? "" : " (no val split)");
    if (W > 1) {
        printf("  layout: %d ranks = PP %d x DP %d x TP %d%s%s", W, o->pp, D, o->tp, d->sp ? " (sequence parallel)" : "",
               t->tp.flash ? " (FlashComm: INT8 all-reduces)" : "");
        if (o->vpp > 1) printf(", %d chunks per stage (interleaved schedule)", o->vpp);
        else if (o->pp > 1) printf(" (1F1B schedule)");
        if (o->ep > 1)
            printf(", EP %d (%d experts per rank, %s all-to-all over %d node%s)", o->ep, cfg->n_routed_experts / o->ep,
                   t->a2a_mode == MT_A2A_HIER ? "hierarchical" : "flat", t->ep.a2a.nnodes,
                   t->ep.a2a.nnodes > 1 ? "s" : "");
        if (t->flash_ep) printf(" (FlashComm: the dispatch's rows as INT8)");
        if (t->overlap == MT_OVERLAP_PIPE)
            printf(", overlapped schedule (the forward of micro-batch i+1 runs with the backward of i)");
        printf("\n");
        const mt_wire *wi = mt_wire_get();
        if (wi->on)
            printf("  wire: an emulated link between %d nodes of %d ranks, %.3g GB/s per rank and direction, %.3g us "
                   "latency, for the expert exchanges, gradient buckets and pipeline messages that cross them; %s\n",
                   (W + o->ranks_per_node - 1) / o->ranks_per_node, o->ranks_per_node, wi->bw / 1e9, wi->lat * 1e6,
                   t->overlap == MT_OVERLAP_OFF ? "all blocking (--overlap off)"
                   : t->overlap == MT_OVERLAP_PIPE
                       ? "exchanges in flight while the other micro-batch computes, buckets during the backward "
                         "(--overlap pipe)"
                       : "exchanges in flight behind the shared experts, buckets during the backward (--overlap block)");
        if (o->pp > 1) {
            printf("  layers per virtual stage:");
            for (int st = 0; st < S; st++) printf(" %d", t->bounds[st + 1] - t->bounds[st]);
            printf("\n");
        }
    }
    if (D > 1)
        printf("  data parallel over %d ranks: %s\n", D,
               o->dist_opt ? "distributed optimizer (gradients reduce-scattered, AdamW sharded, "
                             "parameters all-gathered)"
                           : "gradients all-reduced");
    if (t->m.aux_scope == MT_AUX_EP_GROUP)
        printf("  balance loss over the EP group's tokens of each micro-batch (%g sequences; --aux-scope ep-group: "
               "its value depends on the layout)\n", (double)o->batch * o->ep / (d->sp ? o->tp : 1));
    if (t->start_step) printf("  resumed from %s at step %d\n", t->ckdir, t->start_step);
    printf("  optimizer state per rank: %.2f MiB (AdamW moments%s; the fullest rank)\n",
           (double)t->opt_bytes / 1048576.0, o->dist_opt && W > 1 ? ", sharded" : "");
    fflush(stdout);
}

/* The TP collectives' bytes since the last call, summed over the ranks, and FlashComm's
 * relative rounding error over them. */
static void tp_step_bytes(mt_trainer *t, mt_tp_stats *prev, mt_report_step *s) {
    memset(s->tp_bytes, 0, sizeof s->tp_bytes);
    s->tp_err = 0;
    if (t->o.tp < 2) return;
    double e[4] = {(double)(t->tp.st.bytes - prev->bytes), (double)(t->tp.st.bytes_fp32 - prev->bytes_fp32),
                   t->tp.st.err_sq - prev->err_sq, t->tp.st.ref_sq - prev->ref_sq};
    *prev = t->tp.st;
    mt_group_sum_f64(&t->d->all, e, 4);
    s->tp_bytes[0] = (int64_t)e[0], s->tp_bytes[1] = (int64_t)e[1];
    s->tp_err = e[3] > 0 ? sqrt(e[2] / e[3]) : 0;
}

/* The expert all-to-all bytes since the last call, summed over the ranks: inter-node,
 * intra-node, and the inter-node rows a flat and a hierarchical exchange would send. */
static void a2a_step_bytes(mt_trainer *t, mt_a2a_bytes *prev, int64_t ab[4], double *err) {
    memset(ab, 0, 4 * sizeof *ab);
    double e[2] = {0, 0};
    if (t->have_ep) {
        ab[0] = t->ep.a2a.bytes.inter - prev->inter;
        ab[1] = t->ep.a2a.bytes.intra - prev->intra;
        ab[2] = t->ep.count.inter_rows[0], ab[3] = t->ep.count.inter_rows[1];
        e[0] = t->ep.a2a.bytes.q8_err_sq - prev->q8_err_sq, e[1] = t->ep.a2a.bytes.q8_ref_sq - prev->q8_ref_sq;
        *prev = t->ep.a2a.bytes;
        memset(&t->ep.count, 0, sizeof t->ep.count);
    }
    if (t->o.ep > 1) mt_group_sum_i64(&t->d->all, ab, 4);
    *err = -1;
    if (!t->flash_ep) return;
    mt_group_sum_f64(&t->d->all, e, 2);
    *err = e[1] > 0 ? sqrt(e[0] / e[1]) : 0;
}

int mt_train(const mt_train_opts *opts) {
    mt_trainer *t;
    if (mt_trainer_init(&t, opts) != 0) return -1;
    const mt_train_opts *o = mt_trainer_opts(t);
    const mt_config *cfg = mt_trainer_config(t);
    mt_dist *d = t->d;
    const int root = d->rank == 0;
    const size_t BT = (size_t)o->batch * o->seq;
    int32_t *in = mt_xmalloc(sizeof(int32_t) * BT * o->accum);
    int32_t *tg = mt_xmalloc(sizeof(int32_t) * BT * o->accum);
    int32_t *pos = o->doc_mode ? mt_xmalloc(sizeof(int32_t) * BT * o->accum) : NULL;
    const int L = mt_config_layers(cfg);
    int n_moe = 0;
    for (int l = 0; l < L; l++) n_moe += mt_config_is_moe(cfg, l);
    int64_t *load = n_moe > 0 ? mt_xmalloc(sizeof(int64_t) * (size_t)L * cfg->n_routed_experts) : NULL;
    mt_report rp;
    int rc = mt_report_open(&rp, o, d, cfg, t->start_step, t->nthr);
    if (rc != 0) goto done;
    if (root && !o->quiet) print_banner(t, &rp, n_moe, BT * o->accum * d->dp_size);

    char last_good[4096] = "(none)";
    if (o->resume) snprintf(last_good, sizeof last_good, "%s", t->ckdir);
    rp.t_begin = mt_now();
    mt_a2a_bytes a2a_prev = {0};
    mt_tp_stats tp_prev = t->tp.st;
    for (int step = t->start_step + 1; step <= o->steps; step++) {
        double t0 = mt_now(), c0 = mt_busy_time();
        d->comm_s = 0;
        mt_trace_reset_totals();
        mt_trace_begin("step");
        mt_trace_begin("data");
        /* micro-batch mb of DP rank r is micro-batch r*accum + mb of the global batch; every
         * pipeline stage reads it (the first needs the tokens, the last the targets, all the
         * document positions) */
        const uint64_t samples = mt_trainer_get_state(t)->samples;
        for (int mb = 0; mb < o->accum; mb++)
            mt_loader_batch(t->train, samples + ((uint64_t)d->dp_rank * o->accum + mb) * o->batch, o->batch,
                            in + mb * BT, tg + mb * BT);
        if (o->doc_mode)
            for (int mb = 0; mb < o->accum; mb++)
                mt_doc_positions(in + mb * BT, o->batch, o->seq, o->eot, pos + mb * BT);
        mt_trace_end();
        const mt_batch b = {o->accum, o->batch, o->seq, in, tg, pos, NULL, NULL, NULL, 0};
        mt_report_step s;
        memset(&s, 0, sizeof s);
        if (mt_trainer_step(t, &b, &s.r) != 0) { rc = -1; break; }
        const int bad = mt_trainer_get_state(t)->bad;
        if (!s.r.finite) {
            if (mt_report_skip(&rp, &s.r, bad) != 0) { rc = -1; break; }
            if (bad >= o->max_bad) {
                rc = mt_error("train: stopping after %d non-finite steps in a row (step %d); last good checkpoint: %s",
                              bad, step, last_good);
                break;
            }
        }
        /* after a finite step, inside its time (the move is communication), before its
         * checkpoint (which keeps the new placement) */
        mt_balance_stats bs;
        const int balanced = o->expert_balance > 0 && n_moe > 0 && step % o->expert_balance == 0 && step != o->steps &&
                             bad == 0;
        if (balanced) mt_trainer_balance(t, &bs);
        mt_trace_end(); /* step */
        mt_report_time(&rp, &s, t0, c0, d->comm_s);
        tp_step_bytes(t, &tp_prev, &s); /* the step's, not the evaluation's */
        s.val_loss = NAN;
        if (t->val && o->eval_every > 0 && (step % o->eval_every == 0 || step == o->steps))
            s.val_loss = mt_trainer_eval(t, t->val, o->eval_windows);
        a2a_step_bytes(t, &a2a_prev, s.a2a, &s.a2a_err);
        /* a write that failed (rank 0) ends the run: its metrics would be lost without a word */
        if (mt_report_step_done(&rp, &s, cfg->hidden_size) != 0) { rc = -1; break; }
        if (o->load_every > 0 && n_moe > 0 && (step % o->load_every == 0 || step == o->steps)) {
            mt_trainer_expert_load(t, load);
            if (mt_report_expert_load(&rp, step, cfg, load) != 0) { rc = -1; break; }
        }
        if (balanced && mt_report_balance(&rp, step, &bs) != 0) { rc = -1; break; }
        /* a checkpoint is written only after a finite step: it must be one to go back to */
        if (o->save_every > 0 && step % o->save_every == 0 && step != o->steps && bad == 0) {
            mt_rss_mark(&rp.rss);
            if (mt_trainer_save(t, last_good, sizeof last_good) != 0) { rc = -1; break; }
            mt_rss_after_save(&rp.rss);
        }
    }
    mt_rss_mark(&rp.rss); /* training's peak, before the final checkpoint */
    if (rc == 0 && mt_trainer_get_state(t)->bad > 0) {
        if (root) mt_warn("the last step was non-finite: no final checkpoint; last good checkpoint: %s", last_good);
    } else if (rc == 0) {
        if (mt_trainer_save(t, last_good, sizeof last_good) != 0) rc = -1;
    }
    mt_rss_after_save(&rp.rss);
    if (rc == 0 && o->profile && mt_report_profile_summary(&rp) != 0) rc = -1;
    /* the experts' load imbalance over the EP ranks (the planner's --imbalance) */
    const double ep_imb = rc == 0 ? mt_trainer_ep_imbalance(t) : 1.0;
    if (rc == 0) {
        const mt_report_run run = {t->opt_bytes, t->pipe.acts_bytes, ep_imb, last_good};
        if (mt_report_summary(&rp, &run) != 0) rc = -1;
    }
    mt_report_trace(&rp);
done:
    rc = mt_report_close(&rp, rc);
    free(load);
    free(in);
    free(tg);
    free(pos);
    mt_trainer_free(t);
    return rc;
}
