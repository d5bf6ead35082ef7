/* train/report.h — what a training run tells its user: the progress line, metrics.jsonl
 * (events step, skip, expert_load, profile, summary), loss.tsv and its gnuplot plot, the
 * --profile breakdown, peak RSS and MFU. MFU's denominator is a GEMM measured at start-up
 * (low on a busy machine): it is measured again when a step runs above it, and at the end,
 * the highest kept; --peak-gflops pins it. Rank 0 prints and writes unless said otherwise. */
#ifndef MT_TRAIN_REPORT_H
#define MT_TRAIN_REPORT_H

#include <stdint.h>
#include <stdio.h>

#include "parallel/dist.h"
#include "model/model.h"
#include "train/trainer.h"

/* Peak RSS of the whole run and of training alone (the peak before each checkpoint; the
 * kernel's high-water mark is reset after each one). */
typedef struct { size_t all, train; } mt_rss_peaks;
void mt_rss_mark(mt_rss_peaks *p);
void mt_rss_after_save(mt_rss_peaks *p);

/* the --profile breakdown's parts (they sum to the step), then two more figures: the
 * all-to-all's exposed time inside the overlapped schedule's fiber pairs and the pairs' time */
enum { MT_PROF_N = 9, MT_PROF_ALL = MT_PROF_N + 2 };

typedef struct {
    const mt_train_opts *o;       /* the options in force */
    mt_dist *d;
    FILE *metrics, *tsv;          /* rank 0 */
    char metrics_name[4200], tsv_name[4200]; /* as errors name them ("--metrics PATH" when given) */
    int start_step, nthr;
    double peak;                  /* GEMM GFLOP/s of one rank: the MFU denominator (x ranks) */
    int remeasured;
    double flops_tok;             /* training FLOPs per token */
    int cfg_mtp;                  /* the model has MTP blocks: their CE is reported */
    double t_begin;               /* wall clock at the first step */
    /* steady state: every step after the first (warm-up) */
    double t_timed, tok_timed, busy_timed, comm_timed;
    int steps_timed;
    double ema_tps;
    double prof_sum[MT_PROF_ALL]; /* --profile: the breakdown summed over the steady-state steps */
    mt_rss_peaks rss;
} mt_report;

/* One step's figures as reported. */
typedef struct {
    mt_step_result r;
    double dt, comm;              /* wall and communication seconds of the step */
    double tps, wait, mfu;        /* tokens/s, threads' waiting share, MFU (mt_report_time) */
    double elapsed, eta;
    double val_loss;              /* NAN when not evaluated */
    int64_t a2a[4];               /* expert all-to-all: inter, intra-node bytes, inter-node rows flat, hier */
    double a2a_err;               /* --flashcomm-ep: the dispatch rows' RMS rounding error over their RMS (-1: off) */
    int64_t tp_bytes[2];          /* TP collectives: bytes sent, and as fp32 collectives (all ranks) */
    double tp_err;                /* FlashComm: RMS rounding error relative to the values' RMS (0: off) */
} mt_report_step;

/* Opens metrics (o->metrics or OUT/metrics.jsonl) and OUT/loss.tsv on rank 0, appended to
 * when resuming at start_step > 0; with --profile starts the trace; measures the GEMM peak
 * unless o->peak_gflops. Every write below is checked: the functions that write return -1
 * (rank 0) with an error naming the file (or stdout) when one failed. */
int mt_report_open(mt_report *rp, const mt_train_opts *o, mt_dist *d, const mt_config *cfg, int start_step, int nthr);
/* Closes the files. Returns rc when it is already an error (whose message stays the one
 * reported), else -1 if the last writes did not reach the files, else 0. */
int mt_report_close(mt_report *rp, int rc);

/* The step's timing since t0 (mt_now) and c0 (mt_busy_time): the --profile line (every
 * rank), the steady-state totals, tokens/s, waiting share and MFU (re-measuring the peak
 * when the step beat it), elapsed time and ETA, into s. */
void mt_report_time(mt_report *rp, mt_report_step *s, double t0, double c0, double comm);
/* A finite step's metrics record and loss.tsv line, and the progress line at its cadence. */
int mt_report_step_done(mt_report *rp, const mt_report_step *s, int hidden_size);
/* A skipped (non-finite) step: a warning and a skip event. bad: non-finite steps in a row. */
int mt_report_skip(mt_report *rp, const mt_step_result *r, int bad);
/* The expert-load line and event of a step (load: mt_trainer_expert_load). */
int mt_report_expert_load(mt_report *rp, int step, const mt_config *cfg, const int64_t *load);
/* --expert-balance's re-placement at step: a line and an "expert_balance" event (rank 0) */
int mt_report_balance(mt_report *rp, int step, const mt_balance_stats *bs);
/* --profile: every rank's mean breakdown per step into the metrics (collective). */
int mt_report_profile_summary(mt_report *rp);

/* What the summary says about the run besides the report's own figures. */
typedef struct {
    size_t opt_bytes, acts_bytes; /* per rank: AdamW moments and activations (the fullest rank) */
    double ep_imbalance;
    const char *checkpoint;       /* the last checkpoint written */
} mt_report_run;
/* The summary event and the closing lines, the plot (collective: every rank's RSS). */
int mt_report_summary(mt_report *rp, const mt_report_run *run);
/* --profile: writes OUT/trace_rank<R>.json (every rank). */
void mt_report_trace(mt_report *rp);

#endif
