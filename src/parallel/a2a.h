/* parallel/a2a.h — the expert-parallel token exchange (MoE dispatch / combine) as a collective.
 *
 * Over an EP communicator of P ranks, E experts are owned in contiguous blocks: expert e
 * lives on EP rank e / (E/P). Every rank holds N token rows x[N,C] and, per token, K
 * selected experts sel[N*K] with routing weights w[N*K] (pair i = t*K + j). Dropless.
 *
 * Dispatch delivers to each rank one row per (token, expert) pair it owns, grouped by local
 * expert (the layout of the grouped expert GEMM): off[LE+1], LE = E/P, and inside one local
 * expert the pairs in (source rank, token, slot) order. The layout does not depend on the
 * mode; only the way the bytes travel does:
 *  - MT_A2A_FLAT: a token row goes once to every rank that owns >= 1 of its experts
 *    (deduplicated per rank), in one stage.
 *  - MT_A2A_HIER: ranks are grouped into nodes. A token row crosses to each destination node
 *    at most once, to a relay rank there (the rank with the sender's local index, modulo
 *    the node size; on the sender's own node, the sender itself), with the list of
 *    (expert, slot, weight) it must reach; the relay fans it out over the node communicator.
 * A dispatch stage sends each peer one message (point to point, tagged by the stage's
 * sequence number): a header (rows, metadata ints, a failure flag, the wire arrival stamp),
 * the rows' routing metadata and the rows; the receiver sizes it by MPI_Mprobe and checks
 * it. No count exchange or agreement goes before the rows, so nothing of a dispatch is
 * waited for in place. The stages record the counts; combine, gather and the backwards
 * move rows along them, point to point too (each peer's block, tagged the same way; a
 * collective's receives would wait for the peer to enter MPI again). A wait completes
 * this rank's receives; its sends complete later (mt_a2a_flush).
 *
 * Combine is the reverse: expert outputs y[R,C] in the dispatch layout go back and each
 * source token receives out[t] = sum_j w_j * y_j. The summation order is fixed and the same
 * in both modes, so FLAT and HIER give bit-identical results: on the owner rank the pairs of
 * one token in slot order; then the ranks of one node in ascending rank order (HIER does
 * this on the relay, so only one row per (token, node) crosses the inter-node link); then
 * the nodes in ascending node order. Every sum starts from a copy of its first term.
 *
 * Backward: dispatch_bwd(dxe) = sum over the pairs of a token of dxe rows (a combine with
 * unit weights); gather(dout) = dout[tok_r] in the dispatch layout (a dispatch of dout along
 * the plan), from which the expert side computes the combine's backward. The gradient of
 * the routing weights, dw_r = <dout[tok_r], y_r>, is computed in the dispatch layout; mt_a2a_dispatch_bwd_begin moves it back beside the input
 * gradients' rows (K more columns).
 *
 * Errors: when any rank's input is bad (a shape, an expert out of range) every rank's
 * dispatch returns -1 (mt_error() set on each; the failure flag travels in the first
 * stage's message, so nobody waits in a collective). A message that does not parse, which
 * a correct peer never sends, fails the rank that received it.
 * Byte counters: each call adds the bytes this rank sent (rows, routing metadata, counts) to
 * the context's counters, split by whether the peer is on another node, on the same node,
 * or is this rank itself (a local copy, not traffic). */
#ifndef MT_DIST_A2A_H
#define MT_DIST_A2A_H

#include <mpi.h>
#include <stdint.h>

typedef enum { MT_A2A_FLAT = 0, MT_A2A_HIER = 1 } mt_a2a_mode;

typedef struct {
    int64_t inter, intra, self;       /* all bytes sent: rows + routing metadata + counts */
    int64_t inter_rows, intra_rows;   /* of which token / output rows */
    double q8_err_sq, q8_ref_sq;      /* INT8 dispatch (q8): squared rounding error and values */
} mt_a2a_bytes;

/* The EP group and its node layout. */
typedef struct {
    MPI_Comm ep;        /* the caller's communicator (not owned) */
    MPI_Comm node;      /* the ranks of this node, ordered by EP rank (owned) */
    int rank, size;     /* in ep */
    int node_id, nnodes, local, local_size;
    int node_peers;     /* some node holds more than one rank (else a hierarchical exchange runs as flat) */
    int seq;            /* stages run so far (their messages' tags) */
    /* sends not yet known complete, with the buffers they read (freed once they are): a wait
     * for rows completes this rank's receives only, so it never waits for a peer busy with
     * its other fiber to take this rank's rows (Open MPI moves a large message only while
     * its receiver is inside MPI). Tested at every exchange, all waited for by mt_a2a_flush */
    struct mt_a2a_sent *sent;
    int nsent, capsent;
    int *node_of;       /* [size] node of each EP rank; nodes numbered by their lowest rank */
    int *local_of;      /* [size] index of each EP rank inside its node */
    int *node_start;    /* [nnodes+1] CSR of node_rank */
    int *node_rank;     /* EP ranks of node n, ascending: node_rank[node_start[n]..] */
    mt_a2a_bytes bytes; /* accumulated by every call; reset by the caller */
    /* FlashComm on the dispatch payload (train --flashcomm-ep int8): the tokens' rows travel
     * as INT8 with a scale per 128 values (mt_q8_encode), and every expert, local ones too,
     * computes on the decoded rows; the backward passes the gradient through the rounding */
    int q8;
} mt_a2a;

/* Collective over ep. ranks_per_node > 0 emulates nodes of that many consecutive ranks
 * (node = rank / ranks_per_node); 0 groups by shared memory (MPI_COMM_TYPE_SHARED).
 * Returns -1 (on every rank) when ranks_per_node < 0. */
int mt_a2a_init(mt_a2a *a, MPI_Comm ep, int ranks_per_node);
/* Waits for the sends still pending (their peers receive them in their own waits) and
 * frees their buffers: before the communicator goes; also frees a (mt_a2a_free). */
void mt_a2a_flush(mt_a2a *a);
void mt_a2a_free(mt_a2a *a);

/* One exchange stage (internal; exposed only so a plan can be embedded by value). */
typedef struct {
    MPI_Comm comm;
    int np;                   /* size of comm */
    const int *peer_ep;       /* [np] EP rank of each comm rank (NULL: identity) */
    int *scnt, *sdis, *rcnt, *rdis; /* rows per peer [np] */
    int nsend, nrecv;
    int32_t *sidx;            /* [nsend] input row of each sent row */
    int32_t *rord;            /* [nsend] sent rows ordered by (sidx, node of peer, peer) */
} mt_a2a_stage;

/* The routing of one dispatch, reused by combine and both backwards. */
typedef struct {
    mt_a2a_mode mode;
    int N, K, C, E, LE, e0;   /* e0 = first expert owned here, LE = E / size */
    int R;                    /* pairs received = rows of the dispatch layout */
    int32_t *off;             /* [LE+1] rows of local expert le: off[le]..off[le+1] */
    int32_t *src, *tok, *slot; /* [R] source EP rank, its token index and slot j */
    float *w;                 /* [R] routing weight of the pair */
    /* internal */
    int nst;                  /* 1 (FLAT) or 2 (HIER) */
    mt_a2a_stage st[2];
    int nitem;                /* rows received by the last stage */
    int32_t *item_p;          /* [nitem+1] pairs of item i: pair_pos[item_p[i]..item_p[i+1]] */
    int32_t *pair_pos;        /* [R] row in the dispatch layout, pairs in item, slot order */
} mt_a2a_plan;

/* One stage's rows in flight (internal; by value in mt_a2a_req). On the wire
 * (parallel/wire.h) the senders' arrival stamps travel with the rows. */
typedef struct {
    mt_a2a *a;
    MPI_Request *req, *sreq;  /* [2 np] each: the receives (rows, stamps), the sends */
    int nrecv, nsend;         /* requests posted of each */
    MPI_Datatype type;
    MPI_Comm comm;            /* the stage's communicator (named by the watchdog) */
    int np, wired;
    double *stamp;            /* [2 np]: sent, received (wired only) */
    void *sbuf;               /* the rows sent (owned: freed once the sends are done), or NULL */
} mt_a2a_xfer;

/* A split-phase combine or gather (mt_a2a_combine_begin / mt_a2a_gather_begin): the
 * inter-node part of the exchange is in flight until the matching _end. */
typedef struct {
    int kind;                 /* 0: none pending, 1: combine, 2: gather */
    const mt_a2a_plan *p;
    int C;
    mt_a2a_xfer x;
    float *rbuf;              /* the rows being received (owned; the rows sent: x.sbuf) */
} mt_a2a_req;

/* Dispatch. x[N,C], sel[N*K] (experts in [0,E), E divisible by the EP size), w[N*K] (may
 * be NULL: weights 1). Fills plan (free with mt_a2a_plan_free) and returns in *xe a new
 * mt_alloc'd buffer [plan->R, C] (free with mt_free). Every rank of the EP group calls it; -1 on every rank on bad input (above). */
int mt_a2a_dispatch(mt_a2a *a, mt_a2a_mode mode, mt_a2a_plan *plan, float **xe, const float *x,
                    const int32_t *sel, const float *w, int N, int K, int C, int E);
void mt_a2a_plan_free(mt_a2a_plan *p);

/* Combine: out[N,C] = per source token sum_j wr_j * y_j, y[R,C] and wr[R] in the dispatch
 * layout of plan (wr = plan->w for the usual weighted combine; NULL: weights 1). */
void mt_a2a_combine(mt_a2a *a, const mt_a2a_plan *p, float *out, const float *y, const float *wr);
/* Backward of dispatch: dx[N,C] = sum over the pairs of token t of dxe[R,C] rows. */
void mt_a2a_dispatch_bwd(mt_a2a *a, const mt_a2a_plan *p, float *dx, const float *dxe);

/* The same two operations split in phases, for computing while the rows travel: _begin
 * sends (in the hierarchical mode, after the intra-node stage that comes first), _test says
 * whether _end would return at once (MPI has delivered and, on the wire, the arrival time has
 * come), _end completes and writes the result. Every rank begins and ends its operations in
 * the same order; one request holds one operation; the inputs may be reused after _begin. */
void mt_a2a_combine_begin(mt_a2a *a, const mt_a2a_plan *p, mt_a2a_req *r, const float *y, const float *wr);
void mt_a2a_combine_end(mt_a2a *a, mt_a2a_req *r, float *out);
void mt_a2a_gather_begin(mt_a2a *a, const mt_a2a_plan *p, mt_a2a_req *r, const float *x);
void mt_a2a_gather_end(mt_a2a *a, mt_a2a_req *r, float *xr);
int mt_a2a_test(mt_a2a_req *r);
/* The dispatch backward and the values' return in one exchange: as mt_a2a_combine_begin of
 * dxe with unit weights, each row widened by K columns that carry v[R] back to the source
 * tokens' slots (each pair's value in its slot, zeros elsewhere: every slot of a token is set
 * in exactly one row, so the sums on the way back are exact). mt_a2a_combine_end then writes
 * out[N, C + K]: per token its dx row (mt_a2a_dispatch_bwd's bits), then vs[t*K + j] = v of
 * pair (t, j)'s row on its expert's rank. */
void mt_a2a_dispatch_bwd_begin(mt_a2a *a, const mt_a2a_plan *p, mt_a2a_req *r, const float *dxe, const float *v);

/* xr[R,C] = x[tok_r] rows of the source tokens in the dispatch layout, unweighted (a
 * dispatch of new rows along an existing plan, e.g. the output gradient in the backward). */
void mt_a2a_gather(mt_a2a *a, const mt_a2a_plan *p, float *xr, const float *x);

#endif
