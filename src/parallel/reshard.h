/* parallel/reshard.h — moving a model between parallel layouts in memory.
 *
 * Every layout (pipeline stages, expert-parallel blocks, tensor-parallel slices) holds whole
 * docs/FORMATS.md tensors or row / column slices of them, each knowing its index in the whole model
 * (mt_tensor.full_index) and its slice (tp_dim, tp_off). Gathering assembles the whole
 * model's flat buffer (checkpoint order) on the group's rank 0 from the tensors the ranks
 * own; scattering gives every rank its part of a whole buffer held by rank 0. A gather from
 * one layout followed by a scatter into another switches a model's layout (checkpoint save
 * and load use them; so will RL's train <-> inference switch). Both are collective over the
 * group, point to point (tensor by tensor) and exact; only rank 0 holds a whole-model buffer,
 * the other ranks send from and receive into their own buffers. */
#ifndef MT_DIST_RESHARD_H
#define MT_DIST_RESHARD_H

#include "parallel/dist.h"
#include "model/model.h"

/* On the group's rank 0: full = the whole model (every element written) assembled from pbuf (a buffer laid out
 * like part: its parameters, gradients or moments) of every rank. A rank contributes the
 * tensors it owns: TP slices when own_tp, other non-expert tensors when own_dense,
 * routed-expert tensors when own_expert; replicas never. Exactly one rank must own each
 * element. full_t: the whole model's table (mt_model_layout); full is unused elsewhere. */
void mt_reshard_gather(mt_group *g, const mt_tensor *full_t, const mt_model *part, const float *pbuf, int own_tp,
                       int own_dense, int own_expert, float *full);
/* pbuf (laid out like part) = part's tensors of the whole buffer full, which the group's rank
 * 0 holds (unused elsewhere). */
void mt_reshard_scatter(mt_group *g, const mt_tensor *full_t, const float *full, const mt_model *part,
                        float *pbuf);

/* pbuf (laid out like part) = part's tensors of the whole buffer full, on this rank alone. */
void mt_reshard_extract(const mt_tensor *full_t, const float *full, const mt_model *part, float *pbuf);
/* On every rank of g: full = the whole model, assembled from the tensors the ranks own (the
 * same rule as mt_reshard_gather). Each rank packs its owned tensors once and the blocks go
 * point to point in g->size - 1 rounds (round j: to rank + j, from rank - j), so a rank holds
 * its own block and one received block besides full. RL's switch to the rollout layout. */
void mt_reshard_allgather(mt_group *g, const mt_tensor *full_t, int nfull, const mt_model *part, const float *pbuf,
                          int own_tp, int own_dense, int own_expert, float *full);
/* The same into another layout: dbuf = the tensors of the table dst_t[ndst] (whole tensors
 * or TP slices; offsets into dbuf), each rank sending every peer only the overlap of its
 * owned pieces with the pieces that peer's table holds. RL's switch to an expert- or
 * tensor-parallel rollout layout. full_t is not read (the pieces carry their shapes). */
void mt_reshard_allgather_to(mt_group *g, const mt_tensor *full_t, int nfull, const mt_model *part, const float *pbuf,
                             int own_tp, int own_dense, int own_expert, const mt_tensor *dst_t, int ndst, float *dbuf);

#endif
