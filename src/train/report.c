/* train/report.c — progress line, metrics, plot, profile and summary (see report.h). */
#include "train/report.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "parallel/wire.h"
#include "base/trace.h"
#include "kernels/blas.h"

void mt_rss_mark(mt_rss_peaks *p) {
    size_t x = mt_peak_rss();
    if (x > p->all) p->all = x;
    if (x > p->train) p->train = x;
}

void mt_rss_after_save(mt_rss_peaks *p) {
    size_t x = mt_peak_rss();
    if (x > p->all) p->all = x;
    mt_reset_peak_rss();
}

static void fmt_hms(char *buf, size_t cap, double s) {
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(buf, cap, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    else snprintf(buf, cap, "%ld:%02ld", t / 60, t % 60);
}

/* Draws OUT/loss.png from OUT/loss.tsv with gnuplot; returns 0 if the file was made. */
static int draw_plot(const char *out) {
    char cmd[8192], png[4200];
    snprintf(png, sizeof png, "%s/loss.png", out);
    remove(png);
    snprintf(cmd, sizeof cmd,
             "command -v gnuplot >/dev/null 2>&1 && gnuplot -e \"set terminal png size 900,500; "
             "set output '%s'; set xlabel 'step'; set ylabel 'loss'; set grid; "
             "set title 'moetrain training loss'; set datafile missing 'NaN'; "
             "plot '%s/loss.tsv' using 1:2 with lines title 'train loss', "
             "'' using 1:3 with points pt 7 title 'validation loss'\" 2>&1",
             png, out);
    FILE *f = NULL;
    if (system(cmd) != 0 || !(f = fopen(png, "rb"))) {
        mt_warn("gnuplot is missing or failed (apt-get install gnuplot-nox): no %s", png);
        return -1;
    }
    fclose(f);
    return 0;
}

int mt_report_open(mt_report *rp, const mt_train_opts *o, mt_dist *d, const mt_config *cfg, int start_step, int nthr) {
    memset(rp, 0, sizeof *rp);
    rp->o = o;
    rp->d = d;
    rp->start_step = start_step;
    rp->nthr = nthr;
    const int root = d->rank == 0;
    if (root) {
        if (o->metrics) snprintf(rp->metrics_name, sizeof rp->metrics_name, "--metrics %s", o->metrics);
        else snprintf(rp->metrics_name, sizeof rp->metrics_name, "%s/metrics.jsonl", o->out);
        rp->metrics = fopen(o->metrics ? o->metrics : rp->metrics_name, start_step ? "a" : "w");
        if (!rp->metrics) return mt_error("%s: cannot open: %s", rp->metrics_name, strerror(errno));
        snprintf(rp->tsv_name, sizeof rp->tsv_name, "%s/loss.tsv", o->out);
        rp->tsv = fopen(rp->tsv_name, start_step ? "a" : "w");
        if (!rp->tsv) return mt_error("%s: cannot open: %s", rp->tsv_name, strerror(errno));
    }
    if (o->profile) { /* the events of the whole run, up to 2^20 (24 MiB): the rest only count in the breakdown */
        size_t ev = (size_t)(o->steps - start_step + 1) * (size_t)(mt_config_layers(cfg) * 24 + 32) * (size_t)o->accum;
        mt_trace_enable(d->rank, ev < ((size_t)1 << 20) ? ev : (size_t)1 << 20);
    }
    rp->peak = o->peak_gflops > 0 ? o->peak_gflops : root ? mt_gemm_gflops(1024, 0.3, o->bf16) : 0.0;
    rp->flops_tok = mt_model_flops_per_token(cfg, o->seq);
    rp->cfg_mtp = cfg->num_nextn_predict_layers > 0;
    return 0;
}

int mt_report_close(mt_report *rp, int rc) {
    FILE *f[2] = {rp->metrics, rp->tsv};
    const char *name[2] = {rp->metrics_name, rp->tsv_name};
    for (int i = 0; i < 2; i++) {
        if (!f[i]) continue;
        if (rc != 0) fclose(f[i]);
        else rc = mt_file_close(f[i], name[i]);
    }
    rp->metrics = rp->tsv = NULL;
    return rc;
}

/* The records so far reached the files (rank 0; others have none). */
static int files_check(const mt_report *rp) {
    if (rp->metrics && mt_file_check(rp->metrics, rp->metrics_name) != 0) return -1;
    return rp->tsv ? mt_file_check(rp->tsv, rp->tsv_name) : 0;
}

void mt_report_time(mt_report *rp, mt_report_step *s, double t0, double c0, double comm) {
    const mt_train_opts *o = rp->o;
    mt_dist *d = rp->d;
    const int step = s->r.step, W = d->size, steady = step > rp->start_step + 1;
    const double dt = mt_now() - t0;
    s->dt = dt;
    s->comm = comm;
    if (o->profile) {
        /* the TP collectives and all-to-alls run inside the forward and backward spans; their
         * spans count only the waits (an exchange in flight behind compute is not in them,
         * and a fiber's spans exclude the other fiber's time), i.e. the exposed time, less
         * the exchange's own compute (moe.permute: packing, the combine's sums), which counts
         * as compute as the local exchange's permute does */
        double cf = mt_trace_total("fwd."), cb = mt_trace_total("bwd.");
        double ctp = mt_trace_total("comm.tp"), ca2a = mt_trace_total("comm.a2a") - mt_trace_total("moe.permute");
        double cpp = mt_trace_total("comm.pipeline"), cg = mt_trace_total("comm.gradients");
        double cpar = mt_trace_total("comm.params");
        double op = mt_trace_total("optimizer"), da = mt_trace_total("data");
        double comp = cf + cb - ctp - ca2a;
        /* inside the fiber pairs (--overlap pipe): the schedule's steady state, without the
         * step's first forward and last backward, which nothing can pair */
        double ca2a_pair = mt_trace_total_fiber("comm.a2a") - mt_trace_total_fiber("moe.permute");
        double prof[MT_PROF_ALL] = {comp, ctp, ca2a, cpp, cg, cpar, op, da,
                                    dt - comp - ctp - ca2a - cpp - cg - cpar - op - da,
                                    ca2a_pair, mt_trace_total("overlap.pair")};
        if (steady)
            for (int i = 0; i < MT_PROF_ALL; i++) rp->prof_sum[i] += prof[i];
        if (!o->quiet)
            printf("  profile rank %d step %d: compute %.3f s | exposed comm: TP %.3f, all-to-all %.3f, pipeline "
                   "wait (bubble + p2p) %.3f, gradients %.3f, params %.3f s | optimizer %.3f | data %.3f | "
                   "other %.3f\n",
                   d->rank, step, prof[0], prof[1], prof[2], prof[3], prof[4], prof[5], prof[6], prof[7], prof[8]);
    }
    double wait = 1.0 - (mt_busy_time() - c0) / (rp->nthr * dt);
    if (wait < 0) wait = 0;
    double tps = (double)s->r.tokens / dt;
    if (steady) {
        rp->busy_timed += dt * (1.0 - wait);
        rp->t_timed += dt;
        rp->tok_timed += (double)s->r.tokens;
        rp->comm_timed += comm;
        rp->steps_timed++;
    }
    rp->ema_tps = rp->ema_tps == 0 ? tps : 0.9 * rp->ema_tps + 0.1 * tps;
    double mfu = d->rank == 0 ? rp->flops_tok * tps / (rp->peak * W * 1e9) : 0.0;
    if (mfu > 1.0 && o->peak_gflops <= 0 && rp->remeasured < 3) { /* the start-up one ran on a busy machine */
        rp->remeasured++; /* a few times at most: a model whose GEMMs beat the 1024^3 one stays above */
        double p2 = mt_gemm_gflops(1024, 0.3, o->bf16);
        if (!o->quiet)
            printf("  step %d ran above the measured GEMM peak of %.0f GFLOP/s: measured again, %.0f GFLOP/s\n", step,
                   rp->peak, p2);
        if (p2 > rp->peak) rp->peak = p2;
        mfu = rp->flops_tok * tps / (rp->peak * W * 1e9);
    }
    s->tps = tps;
    s->wait = wait;
    s->mfu = mfu;
    s->elapsed = mt_now() - rp->t_begin;
    s->eta = (o->steps - step) * (s->elapsed / (step - rp->start_step));
}

int mt_report_step_done(mt_report *rp, const mt_report_step *s, int hidden_size) {
    const mt_train_opts *o = rp->o;
    const mt_step_result *r = &s->r;
    const int root = rp->d->rank == 0, W = rp->d->size, step = r->step;
    const int64_t *ab = s->a2a;
    if (r->finite && root) {
        fprintf(rp->metrics,
                "{\"event\":\"step\",\"step\":%d,\"loss\":%.6f,\"ce\":%.6f,\"balance\":%.6f,\"lr\":%.6e,"
                "\"grad_norm\":%.6f,\"tokens_per_s\":%.1f,\"mfu\":%.4f,\"wait\":%.4f,\"comm_s\":%.4f,\"elapsed\":%.2f",
                step, r->loss, r->ce, r->balance, r->lr, r->grad_norm, s->tps, s->mfu, s->wait, s->comm, s->elapsed);
        if (rp->cfg_mtp) fprintf(rp->metrics, ",\"mtp_ce\":%.6f", r->mtp);
        if (o->ep > 1)
            fprintf(rp->metrics, ",\"a2a_inter_bytes\":%lld,\"a2a_intra_bytes\":%lld,\"a2a_inter_rows_flat\":%lld,"
                    "\"a2a_inter_rows_hier\":%lld", (long long)ab[0], (long long)ab[1], (long long)ab[2],
                    (long long)ab[3]);
        if (s->a2a_err >= 0)
            fprintf(rp->metrics, ",\"flashcomm_ep_rel_err\":%.3e", s->a2a_err);
        if (mt_wire_get()->on) /* rank 0's sleep for the emulated link's arrivals during the step */
            fprintf(rp->metrics, ",\"wire_wait_s\":%.4f", mt_wire_get()->slept);
        if (o->tp > 1)
            fprintf(rp->metrics, ",\"tp_bytes\":%lld,\"tp_bytes_fp32\":%lld,\"flashcomm_rel_err\":%.3e",
                    (long long)s->tp_bytes[0], (long long)s->tp_bytes[1], s->tp_err);
        if (!isnan(s->val_loss)) fprintf(rp->metrics, ",\"val_loss\":%.6f", s->val_loss);
        fprintf(rp->metrics, "}\n");
        if (isnan(s->val_loss)) fprintf(rp->tsv, "%d\t%.6f\tNaN\n", step, r->loss);
        else fprintf(rp->tsv, "%d\t%.6f\t%.6f\n", step, r->loss, s->val_loss);
        if (files_check(rp) != 0) return -1;
    }
    mt_wire_get()->slept = 0;
    if (root && !o->quiet && (step % o->log_every == 0 || step == o->steps || step == rp->start_step + 1)) {
        char el[32], et[32];
        fmt_hms(el, sizeof el, s->elapsed);
        fmt_hms(et, sizeof et, s->eta);
        printf("step %*d/%d | loss %.4f | bal %.4f | lr %.2e | gnorm %.3f | %.0f tok/s | MFU %.1f%% | wait %.1f%% | ",
               (int)(log10(o->steps) + 1), step, o->steps, r->loss, r->balance, r->lr, r->grad_norm, rp->ema_tps,
               100 * s->mfu, 100 * s->wait);
        if (rp->cfg_mtp) printf("mtp %.4f | ", r->mtp);
        if (W > 1) printf("comm %.3fs | ", s->comm);
        if (o->ep > 1)
            printf("a2a inter-node %.2f MiB (flat would send %.2f MiB of rows, hier %.2f) | ", ab[0] / 1048576.0,
                   ab[2] * (double)hidden_size * 4 / 1048576.0, ab[3] * (double)hidden_size * 4 / 1048576.0);
        printf("%s elapsed | ETA %s", el, et);
        if (!isnan(s->val_loss)) printf(" | val %.4f", s->val_loss);
        printf("\n");
        if (mt_file_check(stdout, "stdout") != 0) return -1;
    }
    return 0;
}

int mt_report_skip(mt_report *rp, const mt_step_result *r, int bad) {
    if (rp->d->rank != 0) return 0;
    mt_warn("step %d: non-finite %s (loss %g, grad norm %g); update skipped (%d in a row)", r->step,
            isfinite(r->loss) ? "gradient" : "loss", r->loss, r->grad_norm, bad);
    fprintf(rp->metrics, "{\"event\":\"skip\",\"step\":%d,\"loss\":\"%g\",\"grad_norm\":\"%g\"}\n", r->step, r->loss,
            r->grad_norm);
    return files_check(rp);
}

int mt_report_expert_load(mt_report *rp, int step, const mt_config *cfg, const int64_t *load) {
    if (rp->d->rank != 0) return 0;
    const int quiet = rp->o->quiet, E = cfg->n_routed_experts;
    if (!quiet) printf("  expert load (max/mean tokens per expert):");
    fprintf(rp->metrics, "{\"event\":\"expert_load\",\"step\":%d,\"layers\":{", step);
    int first = 1;
    for (int l = 0; l < mt_config_layers(cfg); l++) {
        if (!mt_config_is_moe(cfg, l)) continue;
        const int64_t *ld = load + (size_t)l * E;
        int64_t mx = 0, tot = 0;
        for (int e = 0; e < E; e++) { tot += ld[e]; mx = ld[e] > mx ? ld[e] : mx; }
        double ratio = tot ? (double)mx / ((double)tot / E) : 0;
        if (!quiet) printf(" L%d %.2f", l, ratio);
        fprintf(rp->metrics, "%s\"%d\":{\"max\":%lld,\"mean\":%.2f}", first ? "" : ",", l, (long long)mx,
                (double)tot / E);
        first = 0;
    }
    fprintf(rp->metrics, "}}\n");
    if (!quiet) printf("\n");
    return files_check(rp) != 0 || (!quiet && mt_file_check(stdout, "stdout") != 0) ? -1 : 0;
}

int mt_report_balance(mt_report *rp, int step, const mt_balance_stats *bs) {
    if (rp->d->rank != 0) return 0;
    if (!rp->o->quiet)
        printf("  experts placed anew: %d moved; since the last placement the busiest EP rank's tokens were %.3fx "
               "the mean, %.3fx with the new placement\n",
               bs->moved, bs->busy_before, bs->busy_after);
    fprintf(rp->metrics, "{\"event\":\"expert_balance\",\"step\":%d,\"moved\":%d,\"busy_before\":%.4f,"
            "\"busy_after\":%.4f}\n", step, bs->moved, bs->busy_before, bs->busy_after);
    return files_check(rp) != 0 || (!rp->o->quiet && mt_file_check(stdout, "stdout") != 0) ? -1 : 0;
}

int mt_report_profile_summary(mt_report *rp) {
    mt_dist *d = rp->d;
    const int root = d->rank == 0;
    double *all = root ? mt_xmalloc(sizeof(double) * MT_PROF_ALL * (size_t)d->size) : NULL;
    for (int i = 0; i < MT_PROF_ALL; i++) rp->prof_sum[i] /= rp->steps_timed > 0 ? rp->steps_timed : 1;
    mt_group_gather_f64(&d->all, rp->prof_sum, MT_PROF_ALL, all);
    if (root) {
        static const char *const nm[MT_PROF_ALL] = {"compute",   "tp",   "a2a",   "pipeline_wait", "gradients", "params",
                                                    "optimizer", "data", "other", "a2a_paired",    "paired"};
        for (int rk = 0; rk < d->size; rk++) {
            fprintf(rp->metrics, "{\"event\":\"profile\",\"rank\":%d,\"pp_rank\":%d", rk,
                    rk / (d->tp_size * d->dp_size));
            for (int i = 0; i < MT_PROF_ALL; i++)
                fprintf(rp->metrics, ",\"%s_s\":%.6f", nm[i], all[(size_t)rk * MT_PROF_ALL + i]);
            fprintf(rp->metrics, "}\n");
        }
    }
    free(all);
    return files_check(rp);
}

int mt_report_summary(mt_report *rp, const mt_report_run *run) {
    const mt_train_opts *o = rp->o;
    mt_dist *d = rp->d;
    const int W = d->size;
    /* peak RSS of every rank (the planner's memory model is per rank) */
    /* and every rank's steady-state communication share (ns): the least any rank waited is
     * what the busiest rank, which sets the step, lost to exchanges; the rest of the others'
     * waits is the load imbalance */
    int64_t *rss_all = mt_xcalloc((size_t)d->size * 4, sizeof(int64_t));
    rss_all[d->rank] = (int64_t)rp->rss.all;
    rss_all[d->size + d->rank] = (int64_t)rp->rss.train;
    rss_all[2 * d->size + d->rank] = (int64_t)(rp->comm_timed * 1e9);
    rss_all[3 * d->size + d->rank] = (int64_t)(rp->t_timed * 1e9);
    mt_group_sum_i64(&d->all, rss_all, (size_t)d->size * 4);
    if (d->rank == 0) {
        double tps = rp->t_timed > 0 ? rp->tok_timed / rp->t_timed : 0;
        if (o->peak_gflops <= 0 && rp->steps_timed > 0) { /* the higher of two measurements */
            double p2 = mt_gemm_gflops(1024, 0.3, o->bf16);
            if (p2 > rp->peak) rp->peak = p2;
        }
        const double peak = rp->peak;
        double mfu = rp->flops_tok * tps / (peak * W * 1e9);
        double wait = rp->t_timed > 0 ? 1.0 - rp->busy_timed / rp->t_timed : 0;
        double comm_share = rp->t_timed > 0 ? rp->comm_timed / rp->t_timed : 0;
        size_t rss_peak = (size_t)rss_all[0];
        fprintf(rp->metrics,
                "{\"event\":\"summary\",\"steps\":%d,\"tokens_per_s\":%.1f,\"mfu\":%.4f,\"wait\":%.4f,"
                "\"peak_gflops\":%.1f,\"peak_rss_bytes\":%zu,\"dp\":%d,\"tp\":%d,\"sp\":%s,\"pp\":%d,\"vpp\":%d,"
                "\"ep\":%d,\"dist_opt\":%s,\"optimizer_bytes_per_rank\":%zu,\"activation_bytes_per_rank\":%zu,"
                "\"comm_share\":%.4f,\"step_time_s\":%.6f,\"ep_imbalance\":%.4f,\"precision\":\"%s\","
                "\"checkpoint\":\"%s\",\"peak_rss_bytes_per_rank\":[",
                o->steps, tps, mfu, wait, peak, rss_peak, d->dp_size, o->tp, d->sp ? "true" : "false", o->pp, o->vpp,
                o->ep,
                o->dist_opt ? "true" : "false", run->opt_bytes, run->acts_bytes, comm_share,
                rp->steps_timed > 0 ? rp->t_timed / rp->steps_timed : 0.0, run->ep_imbalance, o->bf16 ? "bf16" : "fp32",
                run->checkpoint);
        for (int i = 0; i < d->size; i++) fprintf(rp->metrics, "%s%lld", i ? "," : "", (long long)rss_all[i]);
        /* the peak of training alone: before each checkpoint was written */
        fprintf(rp->metrics, "],\"peak_rss_train_bytes_per_rank\":[");
        for (int i = 0; i < d->size; i++) fprintf(rp->metrics, "%s%lld", i ? "," : "", (long long)rss_all[d->size + i]);
        fprintf(rp->metrics, "],\"comm_share_per_rank\":[");
        double share_min = comm_share;
        for (int i = 0; i < d->size; i++) {
            const int64_t ti = rss_all[3 * d->size + i];
            const double sh = ti > 0 ? (double)rss_all[2 * d->size + i] / (double)ti : 0;
            if (sh < share_min) share_min = sh;
            fprintf(rp->metrics, "%s%.4f", i ? "," : "", sh);
        }
        fprintf(rp->metrics, "],\"comm_share_min\":%.4f}\n", share_min);
        if (!o->quiet) {
            char peaks[64];
            if (W > 1) snprintf(peaks, sizeof peaks, "%d x %.0f", W, peak);
            else snprintf(peaks, sizeof peaks, "%.0f", peak);
            printf("done: %.0f tok/s (steady state), MFU %.1f%% of %s GFLOP/s, threads waiting %.1f%%, "
                   "peak RSS %.0f MiB",
                   tps, 100 * mfu, peaks, 100 * wait, (double)rss_peak / 1048576.0);
            if (W > 1) printf(", communication %.1f%% of the step", 100 * comm_share);
            if (W > 1 && share_min < comm_share - 0.0005) printf(" (the least of any rank %.1f%%)", 100 * share_min);
            if (o->metrics) printf("\n  checkpoint %s\n  metrics    %s\n", run->checkpoint, o->metrics);
            else printf("\n  checkpoint %s\n  metrics    %s/metrics.jsonl\n", run->checkpoint, o->out);
        }
        if (files_check(rp) != 0 || mt_file_check(stdout, "stdout") != 0) {
            free(rss_all);
            return -1;
        }
        if (o->plot && draw_plot(o->out) == 0 && !o->quiet) printf("  plot       %s/loss.png\n", o->out);
    }
    free(rss_all);
    return 0;
}

void mt_report_trace(mt_report *rp) {
    if (!rp->o->profile) return;
    char tp[4200];
    snprintf(tp, sizeof tp, "%s/trace_rank%d.json", rp->o->out, rp->d->rank);
    if (mt_trace_write(tp) != 0) mt_warn("%s", mt_last_error());
    else if (!rp->o->quiet) printf("  trace      %s (open in Perfetto / chrome://tracing)\n", tp);
}
