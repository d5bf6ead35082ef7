/* plan/cluster.c — cluster JSON parsing (see cluster.h). */
#include "plan/cluster.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "base/json.h"

/* A positive number at obj[key] (obj may be NULL: missing). required = 0 keeps *out. */
static int num(const cJSON *obj, const char *what, const char *path, const char *key, int required,
               double *out) {
    const cJSON *v = obj ? cJSON_GetObjectItemCaseSensitive(obj, key) : NULL;
    if (!v) return required ? mt_error("%s: key %s%s: missing", what, path, key) : 0;
    if (!cJSON_IsNumber(v) || !(v->valuedouble > 0) || !isfinite(v->valuedouble))
        return mt_error("%s: key %s%s: must be a positive number", what, path, key);
    *out = v->valuedouble;
    return 0;
}

/* A number >= 0 at obj[key], missing = keep *out. */
static int num0(const cJSON *obj, const char *what, const char *path, const char *key, double *out) {
    const cJSON *v = obj ? cJSON_GetObjectItemCaseSensitive(obj, key) : NULL;
    if (!v) return 0;
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0) || !isfinite(v->valuedouble))
        return mt_error("%s: key %s%s: must be a number >= 0", what, path, key);
    *out = v->valuedouble;
    return 0;
}

/* [[GFLOP per call, efficiency], ...] ascending; NULL = none. */
static int parse_curve(const cJSON *curve, const char *what, const char *key, double *flops, double *eff, int *n) {
    *n = 0;
    if (!curve) return 0;
    const cJSON *pt;
    double last = 0;
    cJSON_ArrayForEach(pt, curve) {
        if (!cJSON_IsArray(pt) || cJSON_GetArraySize(pt) != 2 || *n == MT_CLUSTER_CURVE_MAX ||
            !cJSON_IsNumber(cJSON_GetArrayItem(pt, 0)) || !cJSON_IsNumber(cJSON_GetArrayItem(pt, 1)))
            return mt_error("%s: key %s: expected up to %d pairs [GFLOP, efficiency]", what, key, MT_CLUSTER_CURVE_MAX);
        double g = cJSON_GetArrayItem(pt, 0)->valuedouble, e = cJSON_GetArrayItem(pt, 1)->valuedouble;
        if (!(g > last) || !(e > 0 && e <= 1))
            return mt_error("%s: key %s: sizes must ascend and efficiencies be in (0, 1]", what, key);
        last = g;
        flops[*n] = g * 1e9;
        eff[(*n)++] = e;
    }
    return 0;
}

/* One entry of mpi: bandwidths (GB/s, optional) and scratch fractions. */
static int parse_mpi(const cJSON *o, const char *what, const char *path, mt_cluster_mpi *m) {
    memset(m, 0, sizeof *m);
    if (num(o, what, path, "allreduce_bw_gbs", 0, &m->ar_bw) || num(o, what, path, "reduce_scatter_bw_gbs", 0, &m->rs_bw) ||
        num(o, what, path, "allgather_bw_gbs", 0, &m->ag_bw) || num0(o, what, path, "allreduce_scratch", &m->ar_scratch) ||
        num0(o, what, path, "reduce_scatter_scratch", &m->rs_scratch) ||
        num0(o, what, path, "allgather_scratch", &m->ag_scratch) || num0(o, what, path, "ep_layer_s", &m->ep_layer_s) ||
        num0(o, what, path, "ep_byte_s", &m->ep_byte_s))
        return -1;
    m->ar_bw *= 1e9;
    m->rs_bw *= 1e9;
    m->ag_bw *= 1e9;
    return 0;
}

/* cpu: {cores_per_node, by_threads: [{threads, peak_tflops, memory_bw_gbs, attention,
 * gemm_curve, reserve_mb, peak_tflops_bf16, gemm_curve_bf16, attention_bf16}]} (ascending
 * threads; the bf16 keys optional: without them the entry has no bf16 GEMM, peak_bf16 = 0). */
static int parse_cpu(mt_cluster *cl, const cJSON *cpu, const char *what) {
    if (!cpu) return 0;
    double cores = 0;
    if (num(cpu, what, "cpu.", "cores_per_node", 1, &cores)) return -1;
    if (cores != floor(cores) || cores > 1e6) return mt_error("%s: key cpu.cores_per_node: must be a whole number", what);
    cl->cores = (int)cores;
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(cpu, "by_threads"), *e;
    if (!cJSON_IsArray(arr) || cJSON_GetArraySize(arr) < 1)
        return mt_error("%s: key cpu.by_threads: expected a non-empty list", what);
    cJSON_ArrayForEach(e, arr) {
        if (cl->ncpu == MT_CLUSTER_THREADS_MAX)
            return mt_error("%s: key cpu.by_threads: at most %d entries", what, MT_CLUSTER_THREADS_MAX);
        mt_cluster_cpu *c = &cl->cpu[cl->ncpu];
        double th = 0, pk = 0, bw = 0, res = 0, pkb = 0;
        c->eff_att = cl->eff_att;
        if (num(e, what, "cpu.by_threads[].", "threads", 1, &th) ||
            num(e, what, "cpu.by_threads[].", "peak_tflops", 1, &pk) ||
            num(e, what, "cpu.by_threads[].", "peak_tflops_bf16", 0, &pkb) ||
            parse_curve(cJSON_GetObjectItemCaseSensitive(e, "gemm_curve_bf16"), what,
                        "cpu.by_threads[].gemm_curve_bf16", c->curve_bf16_flops, c->curve_bf16_eff, &c->ncurve_bf16) ||
            num(e, what, "cpu.by_threads[].", "memory_bw_gbs", 1, &bw) ||
            num(e, what, "cpu.by_threads[].", "attention", 0, &c->eff_att) ||
            num(e, what, "cpu.by_threads[].", "attention_bf16", 0, &c->eff_att_bf16) ||
            num0(e, what, "cpu.by_threads[].", "reserve_mb", &res) ||
            parse_curve(cJSON_GetObjectItemCaseSensitive(e, "gemm_curve"), what, "cpu.by_threads[].gemm_curve",
                        c->curve_flops, c->curve_eff, &c->ncurve))
            return -1;
        if (th != floor(th) || (cl->ncpu > 0 && th <= cl->cpu[cl->ncpu - 1].threads) || c->eff_att > 1 ||
            c->eff_att_bf16 > 1)
            return mt_error("%s: key cpu.by_threads: threads must be whole and ascending, attention <= 1", what);
        if (c->ncurve_bf16 > 0 && !(pkb > 0))
            return mt_error("%s: key cpu.by_threads[].gemm_curve_bf16: needs peak_tflops_bf16", what);
        c->threads = (int)th;
        c->peak = pk * 1e12;
        c->peak_bf16 = pkb * 1e12;
        c->mem_bw = bw * 1e9;
        c->reserve = res * 1048576.0;
        cl->ncpu++;
    }
    return 0;
}

int mt_cluster_for_device(mt_cluster *cl, int threads, int per_node) {
    if (cl->ncpu == 0)
        return mt_error("cluster %s: no cpu section (threads per device need a file from moetrain bench --calibrate)",
                        cl->name);
    if (threads < 1 || per_node < 1) return mt_error("cluster %s: threads and devices per node must be positive", cl->name);
    /* the entry with the most threads <= the request (else the smallest); rates scale
     * linearly in the threads beyond (or below) the measured ones, and by the share of
     * the cores when the node's ranks x threads exceed them (time slicing) */
    int k = 0;
    for (int i = 0; i < cl->ncpu; i++)
        if (cl->cpu[i].threads <= threads) k = i;
    const mt_cluster_cpu *c = &cl->cpu[k];
    const double want = (double)per_node * threads;
    const double scale = (double)threads / c->threads, share = want > cl->cores ? cl->cores / want : 1.0;
    cl->peak_bf16 = cl->peak_fp32 = c->peak * scale * share;
    /* the bf16 GEMM (train --bf16), scaled the same way; none in the entry: none */
    cl->gemm_bf16_peak = c->peak_bf16 * scale * share;
    cl->ncurve_bf16 = c->ncurve_bf16;
    memcpy(cl->curve_bf16_flops, c->curve_bf16_flops, sizeof cl->curve_bf16_flops);
    memcpy(cl->curve_bf16_eff, c->curve_bf16_eff, sizeof cl->curve_bf16_eff);
    cl->mem_bw = c->mem_bw * scale * share;
    cl->eff_att = c->eff_att;
    cl->eff_att_bf16 = c->eff_att_bf16;
    cl->ncurve = c->ncurve;
    memcpy(cl->curve_flops, c->curve_flops, sizeof cl->curve_flops);
    memcpy(cl->curve_eff, c->curve_eff, sizeof cl->curve_eff);
    cl->reserved_bytes = c->reserve;
    cl->intra_bw *= share;
    cl->inter_bw *= share;
    if (cl->nmpi > 0) {
        /* the collectives measured with the most ranks <= per_node at once; beyond them the
         * cores are shared by more ranks (MPI's copies and reductions run on one thread) */
        int j = 0;
        for (int i = 0; i < cl->nmpi; i++)
            if (cl->mpi[i].ranks <= per_node) j = i;
        const mt_cluster_mpi *m = &cl->mpi[j];
        const double s_now = per_node > cl->cores ? (double)cl->cores / per_node : 1.0;
        const double s_cal = m->ranks > cl->cores ? (double)cl->cores / m->ranks : 1.0, f = s_now / s_cal;
        cl->ar_bw = m->ar_bw * f, cl->rs_bw = m->rs_bw * f, cl->ag_bw = m->ag_bw * f;
        cl->ar_scratch = m->ar_scratch, cl->rs_scratch = m->rs_scratch, cl->ag_scratch = m->ag_scratch;
        cl->ep_layer_s = m->ep_layer_s / f, cl->ep_byte_s = m->ep_byte_s / f;
        cl->mpi_ranks = m->ranks;
    }
    cl->per_node = per_node;
    cl->dev_threads = threads;
    cl->dev_per_node = per_node;
    cl->dev_share = share;
    return 0;
}

/* The cluster of a JSON text of len bytes (strict JSON: base/json.h). */
static int parse_text(mt_cluster *cl, const char *json, size_t len, const char *what) {
    memset(cl, 0, sizeof *cl);
    cl->eff_gemm = 0.7;
    cl->eff_att = 0.5;
    cl->eff_mem = 0.7;
    cJSON *root = mt_json_parse(what, json, len);
    if (!root) return -1;
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return mt_error("%s: not a JSON object", what);
    }
    int rc = -1;
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(root, "name");
    snprintf(cl->name, sizeof cl->name, "%s", cJSON_IsString(name) ? name->valuestring : "cluster");
    const cJSON *peak = cJSON_GetObjectItemCaseSensitive(root, "peak_tflops");
    const cJSON *intra = cJSON_GetObjectItemCaseSensitive(root, "intra_node");
    const cJSON *inter = cJSON_GetObjectItemCaseSensitive(root, "inter_node");
    const cJSON *eff = cJSON_GetObjectItemCaseSensitive(root, "efficiency");
    double dev = 0, pn = 0, bf16 = 0, fp32 = 0, mem = 0, mbw = 0, res = 0;
    double ibw = 0, ilat = 0, xbw = 0, xlat = 0;
    if (num(root, what, "", "devices", 1, &dev) || num(root, what, "", "devices_per_node", 1, &pn) ||
        num(peak, what, "peak_tflops.", "bf16", 1, &bf16) || num(peak, what, "peak_tflops.", "fp32", 0, &fp32) ||
        num(root, what, "", "memory_gb", 1, &mem) || num(root, what, "", "memory_bw_gbs", 1, &mbw) ||
        num(root, what, "", "reserved_gb", 0, &res) ||
        num(intra, what, "intra_node.", "bw_gbs", 1, &ibw) || num(intra, what, "intra_node.", "latency_us", 1, &ilat) ||
        num(inter, what, "inter_node.", "bw_gbs", 1, &xbw) || num(inter, what, "inter_node.", "latency_us", 1, &xlat) ||
        num(eff, what, "efficiency.", "gemm", 0, &cl->eff_gemm) ||
        num(eff, what, "efficiency.", "attention", 0, &cl->eff_att) ||
        num(eff, what, "efficiency.", "attention_bf16", 0, &cl->eff_att_bf16) ||
        num(eff, what, "efficiency.", "memory", 0, &cl->eff_mem))
        goto out;
    if (dev != floor(dev) || pn != floor(pn) || dev > 1e7 || (long)dev % (long)pn != 0) {
        mt_error("%s: key devices: must be a whole multiple of devices_per_node", what);
        goto out;
    }
    if (cl->eff_gemm > 1 || cl->eff_att > 1 || cl->eff_mem > 1 || cl->eff_att_bf16 > 1) {
        mt_error("%s: key efficiency: fractions must be in (0, 1]", what);
        goto out;
    }
    if (parse_curve(eff ? cJSON_GetObjectItemCaseSensitive(eff, "gemm_curve") : NULL, what, "efficiency.gemm_curve",
                    cl->curve_flops, cl->curve_eff, &cl->ncurve))
        goto out;
    if (parse_curve(eff ? cJSON_GetObjectItemCaseSensitive(eff, "gemm_curve_bf16") : NULL, what,
                    "efficiency.gemm_curve_bf16", cl->curve_bf16_flops, cl->curve_bf16_eff, &cl->ncurve_bf16))
        goto out;
    if (parse_cpu(cl, cJSON_GetObjectItemCaseSensitive(root, "cpu"), what)) goto out;
    const cJSON *mpi = cJSON_GetObjectItemCaseSensitive(root, "mpi");
    if (mpi) {
        double pp = 0, nr = pn;
        if (num0(mpi, what, "mpi.", "per_peer_mb", &pp) || num(mpi, what, "mpi.", "ranks", 0, &nr)) goto out;
        cl->mpi_per_peer = pp * 1048576.0;
        const cJSON *br = cJSON_GetObjectItemCaseSensitive(mpi, "by_ranks"), *e;
        cJSON_ArrayForEach(e, br) {
            if (cl->nmpi == 7) break;
            double r = 0;
            if (num(e, what, "mpi.by_ranks[].", "ranks", 1, &r) || parse_mpi(e, what, "mpi.by_ranks[].", &cl->mpi[cl->nmpi]))
                goto out;
            cl->mpi[cl->nmpi++].ranks = (int)r;
        }
        if (parse_mpi(mpi, what, "mpi.", &cl->mpi[cl->nmpi])) goto out;
        cl->mpi[cl->nmpi++].ranks = (int)nr;
        for (int i = 1; i < cl->nmpi; i++)
            if (cl->mpi[i].ranks <= cl->mpi[i - 1].ranks) {
                mt_error("%s: key mpi.by_ranks: ranks must ascend, below mpi.ranks", what);
                goto out;
            }
        const mt_cluster_mpi *t = &cl->mpi[cl->nmpi - 1];
        cl->ar_bw = t->ar_bw, cl->rs_bw = t->rs_bw, cl->ag_bw = t->ag_bw;
        cl->ar_scratch = t->ar_scratch, cl->rs_scratch = t->rs_scratch, cl->ag_scratch = t->ag_scratch;
        cl->ep_layer_s = t->ep_layer_s, cl->ep_byte_s = t->ep_byte_s;
        cl->mpi_ranks = t->ranks;
    }
    cl->devices = (int)dev;
    cl->per_node = (int)pn;
    cl->peak_bf16 = bf16 * 1e12;
    cl->peak_fp32 = (fp32 > 0 ? fp32 : bf16 / 2) * 1e12;
    /* a measured bf16 GEMM curve makes peak_tflops.bf16 the peak of that GEMM */
    cl->gemm_bf16_peak = cl->ncurve_bf16 > 0 ? cl->peak_bf16 : 0;
    cl->mem_bytes = mem * 1e9;
    cl->mem_bw = mbw * 1e9;
    cl->reserved_bytes = res * 1e9;
    cl->intra_bw = ibw * 1e9;
    cl->intra_lat = ilat * 1e-6;
    cl->inter_bw = xbw * 1e9;
    cl->inter_lat = xlat * 1e-6;
    rc = 0;
out:
    cJSON_Delete(root);
    return rc;
}

int mt_cluster_parse(mt_cluster *cl, const char *json, const char *what) {
    return parse_text(cl, json, strlen(json), what);
}

int mt_cluster_load(mt_cluster *cl, const char *path) {
    char *text;
    size_t len;
    if (mt_read_file(path, &text, &len) != 0) return -1;
    int rc = parse_text(cl, text, len, path); /* the length: a NUL byte inside is an error */
    free(text);
    return rc;
}

static double curve_eff(int n, const double *cf, const double *ce, double dflt, double flops) {
    if (n == 0) return dflt;
    if (flops <= cf[0]) return ce[0];
    for (int i = 1; i < n; i++) {
        if (flops > cf[i]) continue;
        double t = (log10(flops) - log10(cf[i - 1])) / (log10(cf[i]) - log10(cf[i - 1]));
        return ce[i - 1] + t * (ce[i] - ce[i - 1]);
    }
    return ce[n - 1];
}

double mt_cluster_gemm_eff(const mt_cluster *cl, double flops) {
    return curve_eff(cl->ncurve, cl->curve_flops, cl->curve_eff, cl->eff_gemm, flops);
}

double mt_cluster_gemm_eff_bf16(const mt_cluster *cl, double flops) {
    if (cl->ncurve_bf16 == 0) return mt_cluster_gemm_eff(cl, flops);
    return curve_eff(cl->ncurve_bf16, cl->curve_bf16_flops, cl->curve_bf16_eff, cl->eff_gemm, flops);
}
