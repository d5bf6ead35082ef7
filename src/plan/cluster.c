/* plan/cluster.c — cluster JSON parsing (see cluster.h). */
#include "plan/cluster.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"

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

int mt_cluster_parse(mt_cluster *cl, const char *json, const char *what) {
    memset(cl, 0, sizeof *cl);
    cl->eff_gemm = 0.7;
    cl->eff_att = 0.5;
    cl->eff_mem = 0.7;
    cJSON *root = cJSON_Parse(json);
    if (!root || !cJSON_IsObject(root)) {
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
        num(eff, what, "efficiency.", "memory", 0, &cl->eff_mem))
        goto out;
    if (dev != floor(dev) || pn != floor(pn) || dev > 1e7 || (long)dev % (long)pn != 0) {
        mt_error("%s: key devices: must be a whole multiple of devices_per_node", what);
        goto out;
    }
    if (cl->eff_gemm > 1 || cl->eff_att > 1 || cl->eff_mem > 1) {
        mt_error("%s: key efficiency: fractions must be in (0, 1]", what);
        goto out;
    }
    const cJSON *curve = eff ? cJSON_GetObjectItemCaseSensitive(eff, "gemm_curve") : NULL;
    if (curve) {
        const cJSON *pt;
        double last = 0;
        cJSON_ArrayForEach(pt, curve) {
            if (!cJSON_IsArray(pt) || cJSON_GetArraySize(pt) != 2 || cl->ncurve == MT_CLUSTER_CURVE_MAX ||
                !cJSON_IsNumber(cJSON_GetArrayItem(pt, 0)) || !cJSON_IsNumber(cJSON_GetArrayItem(pt, 1))) {
                mt_error("%s: key efficiency.gemm_curve: expected up to %d pairs [GFLOP, efficiency]", what,
                         MT_CLUSTER_CURVE_MAX);
                goto out;
            }
            double g = cJSON_GetArrayItem(pt, 0)->valuedouble, e = cJSON_GetArrayItem(pt, 1)->valuedouble;
            if (!(g > last) || !(e > 0 && e <= 1)) {
                mt_error("%s: key efficiency.gemm_curve: sizes must ascend and efficiencies be in (0, 1]", what);
                goto out;
            }
            last = g;
            cl->curve_flops[cl->ncurve] = g * 1e9;
            cl->curve_eff[cl->ncurve++] = e;
        }
    }
    cl->devices = (int)dev;
    cl->per_node = (int)pn;
    cl->peak_bf16 = bf16 * 1e12;
    cl->peak_fp32 = (fp32 > 0 ? fp32 : bf16 / 2) * 1e12;
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

int mt_cluster_load(mt_cluster *cl, const char *path) {
    char *text;
    size_t len;
    if (mt_read_file(path, &text, &len) != 0) return -1;
    int rc = mt_cluster_parse(cl, text, path);
    free(text);
    return rc;
}

double mt_cluster_gemm_eff(const mt_cluster *cl, double flops) {
    if (cl->ncurve == 0) return cl->eff_gemm;
    if (flops <= cl->curve_flops[0]) return cl->curve_eff[0];
    for (int i = 1; i < cl->ncurve; i++) {
        if (flops > cl->curve_flops[i]) continue;
        double t = (log10(flops) - log10(cl->curve_flops[i - 1])) /
                   (log10(cl->curve_flops[i]) - log10(cl->curve_flops[i - 1]));
        return cl->curve_eff[i - 1] + t * (cl->curve_eff[i] - cl->curve_eff[i - 1]);
    }
    return cl->curve_eff[cl->ncurve - 1];
}
