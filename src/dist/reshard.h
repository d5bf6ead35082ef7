/* dist/reshard.h — moving a model between parallel layouts in memory.
 *
 * Every layout (pipeline stages, expert-parallel blocks, tensor-parallel slices) holds whole
 * MODEL.md tensors or row / column slices of them, each knowing its index in the whole model
 * (mt_tensor.full_index) and its slice (tp_dim, tp_off). Gathering builds the
 * whole model's flat buffer (checkpoint order) from the parts the ranks hold; scattering
 * gives every rank its part of a whole buffer. Together they switch a model from one layout
 * to another (save + load of checkpoints use them; so will RL's train <-> inference switch).
 * Both are collective over the group and exact (a gathered element is one rank's value
 * plus zeros). The whole buffer exists on every rank for the duration of the call: simple,
 * and fine for models that fit one process's memory; a streaming version (per tensor, point
 * to point) is the next step for larger ones. */
#ifndef MT_DIST_RESHARD_H
#define MT_DIST_RESHARD_H

#include "dist/dist.h"
#include "model/model.h"

/* full[nfull] on the group's rank 0 (root) or on every rank (root < 0) = the whole model
 * assembled from pbuf (a buffer laid out like part: its parameters, gradients or moments).
 * A rank contributes the tensors it is the owner of: TP slices when own_tp, other non-expert
 * tensors when own_dense, routed-expert tensors when own_expert; replicas never. Exactly one rank must own each
 * tensor. full_t: the whole model's table (mt_model_layout). full must have nfull floats
 * on every rank (scratch on the non-roots). */
void mt_reshard_gather(mt_group *g, int root, const mt_tensor *full_t, size_t nfull, const mt_model *part,
                       const float *pbuf, int own_tp, int own_dense, int own_expert, float *full);
/* pbuf (laid out like part) = part's tensors of the whole buffer full[nfull] held by the
 * group's rank 0 (broadcast first; full must have nfull floats on every rank). */
void mt_reshard_scatter(mt_group *g, const mt_tensor *full_t, float *full, size_t nfull, const mt_model *part,
                        float *pbuf);

#endif
