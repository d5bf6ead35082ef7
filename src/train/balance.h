/* train/balance.h — expert placement from measured load (EDP balance: train --expert-balance).
 *
 * Over an expert-parallel group of P ranks every MoE layer's E experts sit in E slots, slot s
 * on rank s / (E / P) (model.h, mt_expert_map). The busiest rank of a layer sets its pace: the
 * others wait for it in the combine. Every --expert-balance steps the trainer sums each
 * expert's routed tokens over the window (all ranks, the global batch), places each layer's
 * experts anew so that the ranks' token counts are as even as a greedy pass makes them, and
 * moves the experts that change rank (their weights and AdamW moments) point to point within
 * each EP group. Every rank computes the same placement from the same global counts. */
#ifndef MT_TRAIN_BALANCE_H
#define MT_TRAIN_BALANCE_H

#include <mpi.h>
#include <stdint.h>

#include "model/model.h"

enum { MT_BALANCE_MAX_RANKS = 4096 }; /* EP ranks (at most one expert each) */

/* One layer: load[E] tokens per logical expert, cur[E] its slot now. Fills nxt[E] with the new
 * slots and returns the experts that change rank (0: nxt = cur). Greedy: experts by load,
 * heaviest first (ties: lower id), each to the rank with the fewest tokens so far that has a
 * free slot (ties: the expert's own rank, then the lower rank); an expert that stays keeps
 * its slot, arrivals take the freed slots in ascending order (by expert id). Kept only when
 * the busiest rank's tokens drop by at least 1%. *busy0 / *busy1: the busiest rank's tokens
 * before and after (after = before when not kept); *mean: the ranks' mean. */
int mt_balance_layer(const int64_t *load, const int32_t *cur, int E, int P, int32_t *nxt, double *busy0,
                     double *busy1, double *mean);

/* Moves MoE layer l's experts of this EP rank (rank of P, over comm) from placement cur to
 * nxt in each of the narr arrays laid out like m's parameters from index lo[a] on (arr[a][0]
 * is parameter lo[a]: the weights, the moments): an expert leaving this rank is sent to its
 * new one, an arriving one written into its new slot; the experts that stay do not move.
 * node_of[P] (NULL: one node): on the emulated wire (parallel/wire.h) the experts sent to
 * another node take their link time, and the move ends when the last has arrived.
 * Collective over the EP group. */
void mt_balance_move(const mt_model *m, float *const *arr, const size_t *lo, int narr, MPI_Comm comm, int rank,
                     int P, const int *node_of, int l, const int32_t *cur, const int32_t *nxt);

#endif
