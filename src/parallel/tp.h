/* parallel/tp.h — the model's tensor-parallel collectives (mt_tp_ops, model/model.h) over the
 * TP group of the layout: all-gather / reduce-scatter with sequence parallelism, all-reduce
 * without. Their time is counted as communication (mt_dist.comm_s) and traced as
 * "comm.tp". */
#ifndef MT_DIST_TP_H
#define MT_DIST_TP_H

#include "parallel/dist.h"
#include "model/model.h"

typedef struct {
    mt_tp_ops ops;
    mt_group *g;
} mt_tp;

void mt_tp_init(mt_tp *t, mt_group *g, int sp);

#endif
