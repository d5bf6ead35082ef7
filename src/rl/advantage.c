/* rl/advantage.c — group-relative advantages (see advantage.h). */
#include "rl/advantage.h"

#include "base/common.h"

#include <math.h>
#include <stddef.h>

void mt_adv_defaults(mt_adv_opts *o) {
    o->scale = 1;
    o->drop_uniform_groups = 0;
}

static int check_group_size(int G) {
    if (G < 2)
        return mt_error("group size %d: group-relative advantages need at least 2 completions per prompt", G);
    return 0;
}

/* Without the size check, so mt_advantages reports a bad reward with its group. */
static int group(const mt_adv_opts *o, const float *r, int G, float *adv, int *bad) {
    for (int i = 0; i < G; i++)
        if (!isfinite(r[i])) { *bad = i; return -1; }
    int uniform = 1;
    for (int i = 1; i < G; i++) uniform &= r[i] == r[0];
    if (uniform) {
        for (int i = 0; i < G; i++) adv[i] = 0.0f;
        return 1;
    }
    double mean = 0;
    for (int i = 0; i < G; i++) mean += r[i];
    mean /= G;
    double ss = 0; /* two passes: no cancellation of sum(r^2) - G mean^2 */
    for (int i = 0; i < G; i++) ss += (r[i] - mean) * (r[i] - mean);
    double den = o->scale ? sqrt(ss / (G - 1)) + MT_ADV_STD_EPS : 1.0;
    for (int i = 0; i < G; i++) adv[i] = (float)((r[i] - mean) / den);
    return 0;
}

int mt_adv_group(const mt_adv_opts *o, const float *r, int G, float *adv) {
    MT_ASSERT(o && (r || G <= 0) && (adv || G <= 0));
    if (check_group_size(G) != 0) return -1;
    int bad = -1, u = group(o, r, G, adv, &bad);
    if (u < 0) return mt_error("reward %d of the group is %g, not a finite number", bad, (double)r[bad]);
    return u;
}

int mt_advantages(const mt_adv_opts *o, const float *rewards, int n_groups, int group_size, float *adv,
                  uint8_t *uniform, uint8_t *drop) {
    MT_ASSERT(o);
    if (check_group_size(group_size) != 0) return -1;
    if (n_groups < 0) return mt_error("%d groups: the number of groups cannot be negative", n_groups);
    MT_ASSERT((rewards && adv) || n_groups == 0);
    for (int g = 0; g < n_groups; g++) {
        size_t at = (size_t)g * (size_t)group_size;
        int bad = -1, u = group(o, rewards + at, group_size, adv + at, &bad);
        if (u < 0)
            return mt_error("reward of completion %d of group %d is %g, not a finite number", bad, g,
                            (double)rewards[at + (size_t)bad]);
        if (uniform) uniform[g] = (uint8_t)u;
        if (drop) drop[g] = (uint8_t)(u && o->drop_uniform_groups);
    }
    return 0;
}
