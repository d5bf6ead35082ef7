/* train/pipeline.h — the pipeline executor: runs this rank's action list of a schedule
 * (parallel/schedule.h) on the model chunks it holds, with blocking receives and non-blocking
 * sends of activations and gradients between pipeline ranks.
 *
 * A rank holds V chunks (virtual stages chunk*P + rank); chunk c is decoder layers
 * [lo[c], hi[c]) plus the embedding on virtual stage 0 and the final norm, head and loss on
 * the last (with TP the activations exchanged are this rank's rows of the residual stream,
 * a 1/TP block of the tokens under sequence parallelism). Each chunk has as many activation slots as the schedule keeps micro-batches of
 * it in flight; a slot is taken by the micro-batch's forward (or the receive before it) and
 * given back after its backward once the sends from it have completed. With P = V = 1 the
 * list is forward, backward per micro-batch: the plain gradient-accumulation loop; with
 * overlap (P = V = 1, mt_schedule_overlap) the forward of micro-batch i+1 and the backward of
 * i run as two fibers (base/fiber.h) that hand the thread to each other while they wait for
 * their expert exchanges, in two slots. */
#ifndef MT_TRAIN_PIPELINE_H
#define MT_TRAIN_PIPELINE_H

#include <stdint.h>

#include "parallel/dist.h"
#include "parallel/schedule.h"
#include "model/model.h"

typedef struct {
    mt_schedule sched;
    int P, V, M, rank, S;
    int lo[256], hi[256];      /* decoder layers of each local chunk */
    int nslot[256];            /* activation slots per chunk */
    mt_acts **slot;            /* [V][max slots] */
    int *slot_mb;              /* micro-batch held by each slot, -1 = free */
    mt_request *req;           /* [V][max slots][2]: pending sends from the slot (act, grad) */
    int maxslot;
    mt_group *grp;             /* the pipeline group of the last train/eval (its sends) */
    int last_bwd[256];         /* index in this rank's action list of each chunk's last backward */
    /* set on the model for those backwards (mt_model.grad_ready, its hook_ctx; NULL: none) */
    void (*grad_ready)(void *ctx, int layer);
    size_t acts_bytes;         /* activation memory of all slots */
} mt_pipe;

/* overlap: the overlapped schedule (one stage only). The layers of virtual stage s are [bounds[s], bounds[s+1]) (bounds has P*V+1 entries).
 * Errors (-1) when the schedule cannot be built (e.g. M not a multiple of P with V > 1) or
 * the message tags would not fit the MPI tag space (mt_dist_tag_ub). The slots' activations
 * run in bf16 (mixed precision) or fp32 (model.h, mt_acts_new_chunk). */
int mt_pipe_init(mt_pipe *p, const mt_config *c, int pp, int vpp, int m, int rank, const int *bounds, int B,
                 int T, int nthr, int policy, int tp, int sp, int bf16, int overlap);
void mt_pipe_free(mt_pipe *p);
/* Between steps: waits for the slots' pending sends and parks their activations (mt_acts_park). */
void mt_pipe_park(mt_pipe *p);

/* One training step's forward and backward of M micro-batches: inputs/targets/pos hold
 * micro-batch mb at offset mb*B*T (pos may be NULL), loss the whole step's (an objective's
 * tokens and the fed counts numbered over all M micro-batches). Adds the loss terms of the
 * forwards it ran to *st (ce on the last stage, balance of the layers held here). */
void mt_pipe_train(mt_pipe *p, mt_model *m, mt_group *pp, const int32_t *inputs, const int32_t *targets,
                   const int32_t *pos, int B, int T, const mt_loss *loss, float bal_scale, mt_step_stats *st);
/* Forward only of one micro-batch of nb <= B rows (evaluation) through every chunk, in
 * virtual-stage order: adds ce_sum / n_valid on the last stage; loss NULL or an objective
 * (its fn sees the log-probs; nothing is trained). */
void mt_pipe_eval(mt_pipe *p, mt_model *m, mt_group *pp, const int32_t *inputs, const int32_t *targets,
                  const int32_t *pos, int nb, int T, const mt_loss *loss, mt_step_stats *st);
/* Expert load counted by every slot's forwards (layer-major [L*E], summed into out). */
void mt_pipe_load(const mt_pipe *p, const mt_config *c, int64_t *out);
void mt_pipe_reset_load(mt_pipe *p);

#endif
