/* rl/advantage.h — group-relative advantages (RL.md "Advantage"; docs/FORMATS.md "RL
 * prompt files and rewards").
 *
 * Per group of G >= 2 rewards r: A_i = r_i - mean(r), divided by (std(r) + 1e-6) when
 * scale is on, std being the sample standard deviation (sum of squares over G - 1).
 * Computed in double, stored as float. A group whose rewards are all equal (uniform) has
 * A_i = 0 exactly; with drop_uniform_groups it is also reported for removal, and the
 * caller leaves it out of the step (and out of every denominator). Every token of
 * completion i carries A_i. */
#ifndef MT_RL_ADVANTAGE_H
#define MT_RL_ADVANTAGE_H

#include <stdint.h>

#define MT_ADV_STD_EPS 1e-6

typedef struct {
    int scale;               /* divide by (sample std + 1e-6); default 1 */
    int drop_uniform_groups; /* report uniform groups for removal; default 0 */
} mt_adv_opts;

void mt_adv_defaults(mt_adv_opts *o);

/* One group: adv[0..G) from r[0..G). Returns 1 if the group is uniform, 0 if not, -1 with
 * an error for G < 2 or a reward that is not finite (naming its index). */
int mt_adv_group(const mt_adv_opts *o, const float *r, int G, float *adv);

/* n_groups groups of group_size completions, group g at rewards[g*group_size ..]; adv has
 * the same layout. uniform[g] (may be NULL) is 1 for a uniform group; drop[g] (may be
 * NULL) is 1 for a group to remove (uniform and drop_uniform_groups on). Errors: a group
 * size < 2, n_groups < 0, a reward that is not finite (naming group and index). */
int mt_advantages(const mt_adv_opts *o, const float *rewards, int n_groups, int group_size, float *adv,
                  uint8_t *uniform, uint8_t *drop);

#endif
