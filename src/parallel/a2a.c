/* parallel/a2a.c — expert-parallel dispatch / combine, flat and hierarchical (see a2a.h).
 *
 * A plan is one or two stages. A stage moves rows between the ranks of one communicator:
 * sent row i is input row sidx[i] and goes to the peer whose block of the send buffer holds
 * it. Every sent row carries routing metadata (first exchange only) as ints:
 *   [src EP rank, token, m, (expert, slot, weight bits) x m]
 * FLAT: stage 0 over ep, input rows = tokens, one row per (token, owner rank).
 * HIER: stage 0 over ep, input rows = tokens, one row per (token, destination node) to the
 *       relay; stage 1 over the node communicator, input rows = the relay's stage-0 rows,
 *       one row per (relay row, owner rank in the node).
 * The rows received by the last stage are "items"; each expands to its pairs. Combine
 * runs the stages backwards, summing the rows that meet in one input row in the fixed
 * order of rord (see a2a.h for why that order makes FLAT and HIER bit-identical). */
#include "parallel/a2a.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "base/common.h"
#include "kernels/moe.h"
#include "parallel/dist.h"
#include "parallel/tp.h"
#include "parallel/watchdog.h"
#include "parallel/wire.h"
#include "base/fiber.h"
#include "base/trace.h"

/* The trace span of the exchange's own compute: packing rows into messages, the combine's
 * sums, the layout of what arrived (the permute and unpermute). Nested in the comm.a2a spans,
 * it counts as compute in the profile, as the local exchange's permute does. */
#define PERMUTE "moe.permute"
/* The part of a wait for rows after the other fiber handed the thread back (all of it
 * outside a fiber pair): what nothing hid. Nested in the comm.a2a spans; no total reads it. */
#define BLOCKED "a2a.blocked"

int mt_a2a_init(mt_a2a *a, MPI_Comm ep, int ranks_per_node) {
    memset(a, 0, sizeof *a);
    a->ep = ep;
    a->node = MPI_COMM_NULL;
    MPI_Comm_rank(ep, &a->rank);
    MPI_Comm_size(ep, &a->size);
    if (ranks_per_node < 0) return mt_error("a2a: ranks_per_node %d < 0", ranks_per_node);
    const int P = a->size;
    a->node_of = mt_xmalloc(sizeof(int) * (size_t)P);
    a->local_of = mt_xmalloc(sizeof(int) * (size_t)P);
    /* a node is named by its leader, its lowest EP rank; nodes are numbered in the order of
     * their leaders */
    int *leads = mt_xmalloc(sizeof(int) * (size_t)P);
    if (ranks_per_node > 0) {
        /* emulated nodes of ranks_per_node consecutive WORLD ranks (an EP group need not be
         * consecutive: with TP it strides over them) */
        int wr, *w = mt_xmalloc(sizeof(int) * (size_t)P);
        MPI_Comm_rank(MPI_COMM_WORLD, &wr);
        MPI_Allgather(&wr, 1, MPI_INT, w, 1, MPI_INT, ep);
        for (int r = 0; r < P; r++) {
            leads[r] = r;
            for (int q = 0; q < r; q++)
                if (w[q] / ranks_per_node == w[r] / ranks_per_node) { leads[r] = q; break; }
        }
        free(w);
    } else {
        MPI_Comm sh;
        MPI_Comm_split_type(ep, MPI_COMM_TYPE_SHARED, a->rank, MPI_INFO_NULL, &sh);
        int lead = a->rank;
        MPI_Allreduce(MPI_IN_PLACE, &lead, 1, MPI_INT, MPI_MIN, sh);
        MPI_Comm_free(&sh);
        MPI_Allgather(&lead, 1, MPI_INT, leads, 1, MPI_INT, ep);
    }
    for (int r = 0; r < P; r++) {
        int id = 0; /* number of distinct leaders below leads[r]: leaders are ranks r' == leads[r'] */
        for (int q = 0; q < leads[r]; q++) id += leads[q] == q;
        a->node_of[r] = id;
    }
    free(leads);
    a->nnodes = 0;
    for (int r = 0; r < P; r++)
        if (a->node_of[r] + 1 > a->nnodes) a->nnodes = a->node_of[r] + 1;
    a->node_start = mt_xcalloc((size_t)a->nnodes + 1, sizeof(int));
    a->node_rank = mt_xmalloc(sizeof(int) * (size_t)P);
    for (int r = 0; r < P; r++) a->local_of[r] = a->node_start[a->node_of[r] + 1]++;
    for (int n = 0; n < a->nnodes; n++) a->node_start[n + 1] += a->node_start[n];
    for (int r = 0; r < P; r++) a->node_rank[a->node_start[a->node_of[r]] + a->local_of[r]] = r;
    a->node_id = a->node_of[a->rank];
    a->local = a->local_of[a->rank];
    a->local_size = a->node_start[a->node_id + 1] - a->node_start[a->node_id];
    for (int n = 0; n < a->nnodes; n++) a->node_peers |= a->node_start[n + 1] - a->node_start[n] > 1;
    MPI_Comm_split(ep, a->node_id, a->rank, &a->node);
    MPI_Comm_set_name(a->node, "ep node (hierarchical all-to-all)");
    int nr;
    MPI_Comm_rank(a->node, &nr);
    MT_ASSERT(nr == a->local);
    return 0;
}

/* sends in flight and the buffers they read (a->sent) */
struct mt_a2a_sent {
    MPI_Request *req;
    int n;
    void *buf, *buf2; /* mt_alloc'd, malloc'd */
};

static void sent_free(struct mt_a2a_sent *e) {
    free(e->req);
    mt_free(e->buf);
    free(e->buf2);
}

/* frees the entries whose sends have completed (MPI_Testall also moves the others on) */
static void sent_progress(mt_a2a *a) {
    int k = 0;
    for (int i = 0; i < a->nsent; i++) {
        int done = 0;
        MPI_Testall(a->sent[i].n, a->sent[i].req, &done, MPI_STATUSES_IGNORE);
        if (done) sent_free(&a->sent[i]);
        else a->sent[k++] = a->sent[i];
    }
    a->nsent = k;
}

/* takes req[n] (malloc'd) and the buffers they read: freed once the sends complete */
static void sent_add(mt_a2a *a, MPI_Request *req, int n, void *buf, void *buf2) {
    struct mt_a2a_sent e = {req, n, buf, buf2};
    int done = 0;
    MPI_Testall(n, req, &done, MPI_STATUSES_IGNORE);
    if (done) {
        sent_free(&e);
        return;
    }
    if (a->nsent == a->capsent) {
        a->capsent = a->capsent ? 2 * a->capsent : 16;
        a->sent = mt_xrealloc(a->sent, sizeof *a->sent * (size_t)a->capsent);
    }
    a->sent[a->nsent++] = e;
}

void mt_a2a_flush(mt_a2a *a) {
    if (!a->nsent) return;
    mt_watch_begin("MPI_Waitall", a->ep);
    for (int i = 0; i < a->nsent; i++) {
        MPI_Waitall(a->sent[i].n, a->sent[i].req, MPI_STATUSES_IGNORE);
        sent_free(&a->sent[i]);
    }
    mt_watch_end();
    a->nsent = 0;
}

void mt_a2a_free(mt_a2a *a) {
    mt_a2a_flush(a);
    free(a->sent);
    if (a->node != MPI_COMM_NULL) MPI_Comm_free(&a->node);
    free(a->node_of);
    free(a->local_of);
    free(a->node_start);
    free(a->node_rank);
    memset(a, 0, sizeof *a);
    a->node = MPI_COMM_NULL;
}

static void account(mt_a2a *a, int peer_ep, int64_t bytes, int rows) {
    if (peer_ep == a->rank) a->bytes.self += bytes;
    else if (a->node_of[peer_ep] != a->node_id) {
        a->bytes.inter += bytes;
        if (rows) a->bytes.inter_rows += bytes;
    } else {
        a->bytes.intra += bytes;
        if (rows) a->bytes.intra_rows += bytes;
    }
}

static int stage_peer(const mt_a2a_stage *s, int p) { return s->peer_ep ? s->peer_ep[p] : p; }

/* ---- building a stage: items pushed in any peer order, kept in push order per peer ---- */

typedef struct {
    int n, cap, nm, mcap;
    int32_t *peer, *sidx, *moff, *meta;
} itemlist;

static void il_push(itemlist *l, int peer, int sidx, const int32_t *meta, int nm) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 64;
        l->peer = mt_xrealloc(l->peer, sizeof(int32_t) * (size_t)l->cap);
        l->sidx = mt_xrealloc(l->sidx, sizeof(int32_t) * (size_t)l->cap);
        l->moff = mt_xrealloc(l->moff, sizeof(int32_t) * ((size_t)l->cap + 1));
    }
    while (l->nm + nm > l->mcap) {
        l->mcap = l->mcap ? 2 * l->mcap : 256;
        l->meta = mt_xrealloc(l->meta, sizeof(int32_t) * (size_t)l->mcap);
    }
    l->peer[l->n] = peer;
    l->sidx[l->n] = sidx;
    l->moff[l->n] = l->nm;
    memcpy(l->meta + l->nm, meta, sizeof(int32_t) * (size_t)nm);
    l->nm += nm;
    l->n++;
}

static void il_free(itemlist *l) {
    free(l->peer);
    free(l->sidx);
    free(l->moff);
    free(l->meta);
}

typedef struct { int32_t sidx, node, peer, i; } rkey;
static int rkey_cmp(const void *x, const void *y) {
    const rkey *a = x, *b = y;
    if (a->sidx != b->sidx) return a->sidx < b->sidx ? -1 : 1;
    if (a->node != b->node) return a->node < b->node ? -1 : 1;
    if (a->peer != b->peer) return a->peer < b->peer ? -1 : 1;
    return (a->i > b->i) - (a->i < b->i);
}

/* Only the stages over the EP group cross nodes (the hierarchical second stage stays in one),
 * so whether a stage is on the wire is the same on every rank of its communicator. */
static int stage_wired(const mt_a2a *a, MPI_Comm comm) { return mt_wire_get()->on && comm == a->ep && a->nnodes > 1; }

/* this rank's arrival stamps for sending cnt[p] items of `item` bytes to the peers of comm */
static void wire_stamps(const mt_a2a *a, const mt_a2a_stage *s, const int64_t *msg, double *stamp) {
    int64_t *bytes = mt_xmalloc(sizeof(int64_t) * (size_t)s->np);
    for (int p = 0; p < s->np; p++) bytes[p] = a->node_of[stage_peer(s, p)] != a->node_id ? msg[p] : 0;
    mt_wire_stamp(bytes, s->np, (a->rank + 1) % s->np, stamp);
    free(bytes);
}

static double latest(const double *t, int n) {
    double m = 0;
    for (int i = 0; i < n; i++)
        if (t[i] > m) m = t[i];
    return m;
}

/* The dispatch's stages send one message per peer that carries everything: a header
 * (items, metadata ints, the sender's failure flag, its wire arrival stamp), the items'
 * metadata and their rows. The receiver learns the sizes from the message (MPI_Mprobe), so
 * no count or metadata exchange is waited for in place before the rows can move: in the
 * overlapped schedule the whole stage travels behind the other fiber's compute. */
enum { HDR_INTS = 6 }; /* items, metadata ints, bad, unused, stamp (a double in two ints) */

/* this exchange's tag: every rank runs the same stages in the same order, so the counters
 * agree, and two fibers' messages between the same ranks never match each other's */
static int stage_tag(mt_a2a *a) {
    a->seq = (a->seq + 1) % 30000;
    return 1 + a->seq;
}

/* Sets up s from l, sends each peer its items (metadata and rows in[sidx, C]) and receives
 * theirs: *rmeta (*nrmeta ints) and *rrows [s->nrecv, C], peer blocks in order (mt_alloc'd
 * rows). bad: this rank failed before (it sends no items, only the flag). Returns -1
 * (mt_error) when this rank or a peer failed or a message does not parse. Every rank of
 * comm calls it; no collective agreement (one waited for in place would hold the rank
 * that is ahead until its peers finish their other fiber's turn). */
static int stage_exchange(mt_a2a *a, mt_a2a_stage *s, MPI_Comm comm, const int *peer_ep, const itemlist *l,
                          int bad, const float *in, int C, int32_t **rmeta, int *nrmeta, float **rrows) {
    int np;
    MPI_Comm_size(comm, &np);
    mt_trace_begin(PERMUTE); /* the messages' packing, up to the sends */
    s->comm = comm;
    s->np = np;
    s->peer_ep = peer_ep;
    s->scnt = mt_xcalloc((size_t)np * 4, sizeof(int));
    s->sdis = s->scnt + np;
    s->rcnt = s->scnt + 2 * np;
    s->rdis = s->scnt + 3 * np;
    const int nl = bad ? 0 : l->n;
    int *smc = mt_xcalloc((size_t)np, sizeof(int)); /* metadata ints per peer */
    for (int i = 0; i < nl; i++) {
        s->scnt[l->peer[i]]++;
        smc[l->peer[i]] += (i + 1 < l->n ? l->moff[i + 1] : l->nm) - l->moff[i];
    }
    s->nsend = nl;
    const int64_t rowb = (int64_t)sizeof(float) * C;
    int64_t *mb = mt_xmalloc(sizeof(int64_t) * 2 * (size_t)np), *moff = mb + np; /* message bytes, offsets */
    int64_t tot = 0;
    for (int p = 0, off = 0; p < np; p++) {
        s->sdis[p] = off;
        off += s->scnt[p];
        mb[p] = (int64_t)sizeof(int32_t) * (HDR_INTS + smc[p]) + rowb * s->scnt[p];
        moff[p] = tot;
        tot += mb[p];
        if (mb[p] > INT_MAX && !bad) bad = mt_error("a2a: a message of %lld bytes exceeds the int range", (long long)mb[p]);
    }
    double *stamp = mt_xcalloc((size_t)np, sizeof(double));
    const int wired = stage_wired(a, comm);
    if (wired) wire_stamps(a, s, mb, stamp);
    /* messages, peer after peer: header, metadata, rows (rows stable by peer, as pushed) */
    char *sbuf = mt_alloc((size_t)tot + 1);
    s->sidx = mt_xmalloc(sizeof(int32_t) * ((size_t)nl + 1));
    int *fill = mt_xcalloc((size_t)np * 2, sizeof(int)), *mfill = fill + np;
    for (int p = 0; p < np; p++) {
        int32_t *h = (int32_t *)(sbuf + moff[p]);
        h[0] = bad ? 0 : s->scnt[p];
        h[1] = bad ? 0 : smc[p];
        h[2] = bad != 0;
        h[3] = 0;
        memcpy(h + 4, &stamp[p], sizeof(double));
    }
    for (int i = 0; i < nl; i++) {
        const int p = l->peer[i], len = (i + 1 < l->n ? l->moff[i + 1] : l->nm) - l->moff[i];
        const int k = fill[p]++;
        s->sidx[s->sdis[p] + k] = l->sidx[i];
        int32_t *m = (int32_t *)(sbuf + moff[p]) + HDR_INTS;
        memcpy(m + mfill[p], l->meta + l->moff[i], sizeof(int32_t) * (size_t)len);
        mfill[p] += len;
        float *row = (float *)((int32_t *)(sbuf + moff[p]) + HDR_INTS + smc[p]) + (size_t)k * C;
        memcpy(row, in + (size_t)l->sidx[i] * C, (size_t)rowb);
    }
    free(fill);
    free(stamp);
    mt_trace_end();
    const int tag = stage_tag(a);
    double t0 = MPI_Wtime();
    sent_progress(a);
    MPI_Request *sreq = mt_xmalloc(sizeof(MPI_Request) * (size_t)np);
    for (int p = 0; p < np; p++) {
        MPI_Isend(sbuf + moff[p], bad ? (int)sizeof(int32_t) * HDR_INTS : (int)mb[p], MPI_BYTE, p, tag, comm, &sreq[p]);
        account(a, stage_peer(s, p), (int64_t)sizeof(int32_t) * (HDR_INTS + smc[p]), 0);
        account(a, stage_peer(s, p), rowb * s->scnt[p], 1);
    }
    /* the turn (see xfer_finish): the other fiber computes while the messages travel */
    const double ran = mt_fiber_yield();
    mt_trace_begin(BLOCKED);
    char **rb = mt_xcalloc((size_t)np, sizeof(char *));
    int *rbytes = mt_xcalloc((size_t)np, sizeof(int));
    mt_watch_begin("MPI_Mprobe", comm);
    for (int p = 0; p < np; p++) {
        MPI_Message msg;
        MPI_Status st;
        MPI_Mprobe(p, tag, comm, &msg, &st);
        MPI_Get_count(&st, MPI_BYTE, &rbytes[p]);
        rb[p] = mt_alloc((size_t)rbytes[p] + 1);
        MPI_Mrecv(rb[p], rbytes[p], MPI_BYTE, &msg, MPI_STATUS_IGNORE);
    }
    mt_watch_end();
    sent_add(a, sreq, np, sbuf, NULL); /* the peers take the messages in their own waits */
    /* headers: checked, then the arrival of the latest (a sleep on the emulated wire) */
    int64_t rtot[2] = {0, 0};
    double arrive = 0;
    int *rmc = mt_xcalloc((size_t)np, sizeof(int));
    for (int p = 0; p < np; p++) {
        const int32_t *h = (const int32_t *)rb[p];
        if (rbytes[p] < (int)sizeof(int32_t) * HDR_INTS) {
            if (!bad) bad = mt_error("a2a: a message of %d bytes from rank %d is shorter than its header", rbytes[p], stage_peer(s, p));
            continue;
        }
        double t;
        memcpy(&t, h + 4, sizeof t);
        if (t > arrive) arrive = t;
        if (h[2]) {
            if (!bad) bad = mt_error("a2a: rank %d of the EP group failed", stage_peer(s, p));
            continue;
        }
        const int rc = h[0], rm = h[1];
        if (rc < 0 || rm < 0 || (int64_t)rm < 6 * (int64_t)rc || (rc == 0) != (rm == 0) ||
            (int64_t)rbytes[p] != (int64_t)sizeof(int32_t) * (HDR_INTS + rm) + rowb * rc) {
            if (!bad) bad = mt_error("a2a: bad message from rank %d: %d rows, %d metadata ints, %d bytes", stage_peer(s, p), rc, rm, rbytes[p]);
            continue;
        }
        s->rcnt[p] = rc;
        rmc[p] = rm;
        rtot[0] += rc;
        rtot[1] += rm;
    }
    if (!bad && (rtot[0] > INT_MAX || rtot[1] > INT_MAX))
        bad = mt_error("a2a: %lld rows / %lld metadata ints received exceed the int range", (long long)rtot[0], (long long)rtot[1]);
    if (wired) { mt_trace_begin("a2a.wire"); mt_wire_sleep_until(arrive); mt_trace_end(); }
    mt_trace_end();
    mt_dist_get()->comm_s += MPI_Wtime() - t0 - ran; /* what the other fiber's compute did not hide */
    mt_trace_begin(PERMUTE); /* the received messages into the stage's layout */
    if (!bad) {
        int off = 0, mo = 0;
        *rmeta = mt_xmalloc(sizeof(int32_t) * ((size_t)rtot[1] + 1));
        *rrows = mt_alloc((size_t)rowb * ((size_t)rtot[0] + 1));
        for (int p = 0; p < np; p++) {
            const int32_t *h = (const int32_t *)rb[p];
            s->rdis[p] = off;
            memcpy(*rmeta + mo, h + HDR_INTS, sizeof(int32_t) * (size_t)rmc[p]);
            memcpy(*rrows + (size_t)off * C, h + HDR_INTS + rmc[p], (size_t)rowb * (size_t)s->rcnt[p]);
            off += s->rcnt[p];
            mo += rmc[p];
        }
        s->nrecv = off;
        *nrmeta = mo;
        /* order in which combine sums the rows that return to one input row */
        rkey *k = mt_xmalloc(sizeof(rkey) * ((size_t)s->nsend + 1));
        for (int p = 0; p < np; p++)
            for (int i = s->sdis[p]; i < s->sdis[p] + s->scnt[p]; i++)
                k[i] = (rkey){s->sidx[i], a->node_of[stage_peer(s, p)], stage_peer(s, p), i};
        qsort(k, (size_t)s->nsend, sizeof *k, rkey_cmp);
        s->rord = mt_xmalloc(sizeof(int32_t) * ((size_t)s->nsend + 1));
        for (int i = 0; i < s->nsend; i++) s->rord[i] = k[i].i;
        free(k);
    }
    for (int p = 0; p < np; p++) mt_free(rb[p]);
    mt_trace_end();
    free(rb);
    free(rbytes);
    free(rmc);
    free(smc);
    free(mb);
    return bad ? -1 : 0;
}

static void stage_free(mt_a2a_stage *s) {
    free(s->scnt);
    free(s->sidx);
    free(s->rord);
    memset(s, 0, sizeof *s);
}

/* Walks received metadata: calls back per item. Returns -1 (mt_error) on malformed data.
 * Items must carry experts for which ok_expert() holds and slots in [0,K). */
typedef struct {
    const mt_a2a *a;
    int K, E, LE, hier_relay; /* hier_relay: experts must be on this node, else on this rank */
} mcheck;

static int meta_item(const mcheck *c, const int32_t *m, int left, int *len) {
    if (left < 6 || m[2] < 1 || m[2] > c->K || 3 + 3 * m[2] > left) return mt_error("a2a: malformed routing metadata");
    if (m[0] < 0 || m[0] >= c->a->size || m[1] < 0) return mt_error("a2a: bad source (rank %d, token %d)", m[0], m[1]);
    for (int q = 0; q < m[2]; q++) {
        int e = m[3 + 3 * q], j = m[4 + 3 * q];
        if (e < 0 || e >= c->E || j < 0 || j >= c->K) return mt_error("a2a: bad expert %d / slot %d received", e, j);
        int owner = e / c->LE;
        if (c->hier_relay ? c->a->node_of[owner] != c->a->node_id : owner != c->a->rank)
            return mt_error("a2a: expert %d delivered to the wrong rank %d", e, c->a->rank);
    }
    *len = 3 + 3 * m[2];
    return 0;
}

/* ---- moving rows ---- */

static MPI_Datatype row_type(int C) {
    MPI_Datatype t;
    MPI_Type_contiguous(C, MPI_FLOAT, &t);
    MPI_Type_commit(&t);
    return t;
}

/* Starts moving a stage's rows: forward (send scnt, receive rcnt) or back (the reverse).
 * Takes sb (mt_alloc'd): freed once the sends are done, which may be after xfer_finish.
 * Each peer's block is one message (none for an empty one), tagged by the stage's number;
 * on the wire its arrival stamp goes first, under the same tag (MPI keeps their order). */
static void xfer_start(mt_a2a *a, mt_a2a_xfer *x, const mt_a2a_stage *s, int back, float *sb, float *rb, int C) {
    const int *sc = back ? s->rcnt : s->scnt, *sd = back ? s->rdis : s->sdis;
    const int *rc = back ? s->scnt : s->rcnt, *rd = back ? s->sdis : s->rdis;
    const int64_t rowb = (int64_t)sizeof(float) * C;
    const int np = s->np, tag = stage_tag(a);
    memset(x, 0, sizeof *x);
    x->a = a;
    x->np = np;
    x->comm = s->comm;
    x->type = row_type(C);
    x->sbuf = sb;
    x->req = mt_xmalloc(sizeof(MPI_Request) * 2 * (size_t)np);
    x->sreq = mt_xmalloc(sizeof(MPI_Request) * 2 * (size_t)np);
    double t0 = MPI_Wtime();
    sent_progress(a);
    int me;
    MPI_Comm_rank(s->comm, &me);
    x->wired = stage_wired(a, s->comm);
    if (x->wired) {
        x->stamp = mt_xcalloc(2 * (size_t)np, sizeof(double));
        int64_t *b = mt_xmalloc(sizeof(int64_t) * (size_t)np);
        for (int p = 0; p < np; p++) b[p] = (int64_t)sc[p] * rowb;
        wire_stamps(a, s, b, x->stamp);
        free(b);
    }
    for (int p = 0; p < np; p++) {
        if (p == me || rc[p] == 0) continue;
        if (x->wired) MPI_Irecv(x->stamp + np + p, 1, MPI_DOUBLE, p, tag, s->comm, &x->req[x->nrecv++]);
        MPI_Irecv(rb + (size_t)rd[p] * C, rc[p], x->type, p, tag, s->comm, &x->req[x->nrecv++]);
    }
    for (int p = 0; p < np; p++) {
        if (p == me || sc[p] == 0) continue;
        if (x->wired) MPI_Isend(x->stamp + p, 1, MPI_DOUBLE, p, tag, s->comm, &x->sreq[x->nsend++]);
        MPI_Isend(sb + (size_t)sd[p] * C, sc[p], x->type, p, tag, s->comm, &x->sreq[x->nsend++]);
    }
    MT_ASSERT(sc[me] == rc[me]);
    if (sc[me]) memcpy(rb + (size_t)rd[me] * C, sb + (size_t)sd[me] * C, (size_t)rowb * sc[me]);
    mt_dist_get()->comm_s += MPI_Wtime() - t0;
    for (int p = 0; p < np; p++) account(a, stage_peer(s, p), (int64_t)sc[p] * rowb, 1);
}

static int xfer_test(mt_a2a_xfer *x) {
    if (!x->req) return 1;
    int done = 0;
    MPI_Testall(x->nrecv, x->req, &done, MPI_STATUSES_IGNORE);
    return done && (!x->wired || mt_now() >= latest(x->stamp + x->np, x->np));
}

/* Inside the overlapped schedule's fiber pair (base/fiber.h) the turn order is the same on
 * every rank, whatever the timing: a fiber hands the thread over exactly once at each wait
 * for rows (here and in stage_exchange: the other fiber computes one piece, up to its own
 * next such wait, while the rows travel). Every rank therefore issues the two fibers'
 * exchanges in the same order, so their tags come from one counter (a timing-dependent
 * order measured no faster than the shared experts' overlap alone). A wait completes this
 * rank's receives only: the sends complete later (sent_add), as Open MPI moves a large
 * message only while its receiver is inside MPI, and waiting for them held a rank until its
 * peer, busy with its other fiber, came to its own wait. (A hierarchical exchange runs only
 * where some node holds several ranks, so its node stage is a real exchange too.) */
static void xfer_finish(mt_a2a_xfer *x) {
    if (!x->req) return;
    double t0 = MPI_Wtime();
    const double ran = mt_fiber_yield(); /* the turn: the other fiber computes while the rows travel */
    mt_trace_begin(BLOCKED);
    mt_watch_begin("MPI_Waitall", x->comm); /* so a stuck peer's report names the group */
    MPI_Waitall(x->nrecv, x->req, MPI_STATUSES_IGNORE);
    mt_watch_end();
    if (x->wired) { mt_trace_begin("a2a.wire"); mt_wire_sleep_until(latest(x->stamp + x->np, x->np)); mt_trace_end(); }
    mt_trace_end();
    mt_dist_get()->comm_s += MPI_Wtime() - t0 - ran; /* what the other fiber's compute did not hide */
    MPI_Type_free(&x->type); /* MPI keeps it for the sends still pending */
    free(x->req);
    sent_add(x->a, x->sreq, x->nsend, x->sbuf, x->stamp);
    memset(x, 0, sizeof *x);
}

/* in[.,C] -> the stage's send buffer, rows in send order (mt_alloc'd) */
static float *stage_pack(const mt_a2a_stage *s, const float *in, int C) {
    mt_trace_begin(PERMUTE);
    size_t rb = sizeof(float) * (size_t)C;
    float *sb = mt_alloc(rb * ((size_t)s->nsend + 1));
    for (int i = 0; i < s->nsend; i++) memcpy(sb + (size_t)i * C, in + (size_t)s->sidx[i] * C, rb);
    mt_trace_end();
    return sb;
}

/* in[.,C] -> returns the stage's received rows [nrecv, C] (mt_alloc'd) */
static float *stage_fwd(mt_a2a *a, const mt_a2a_stage *s, const float *in, int C) {
    float *sb = stage_pack(s, in, C), *rbuf = mt_alloc(sizeof(float) * (size_t)C * ((size_t)s->nrecv + 1));
    mt_a2a_xfer x;
    xfer_start(a, &x, s, 0, sb, rbuf, C);
    xfer_finish(&x);
    return rbuf;
}

/* ret: the rows [nsend, C] that came back; out[nin, C] = per input row the sum of its
 * returned rows, in rord order: ranks of one node, then nodes, each sum from a copy. */
static void stage_sum(const mt_a2a *a, const mt_a2a_stage *s, float *out, int nin, const float *ret, int C) {
    mt_trace_begin(PERMUTE);
    size_t rb = sizeof(float) * (size_t)C;
    float *acc = mt_alloc(rb);
    memset(out, 0, rb * (size_t)nin);
    /* peer of sent row i: the block it is in */
    int *pr = mt_xmalloc(sizeof(int) * ((size_t)s->nsend + 1));
    for (int p = 0; p < s->np; p++)
        for (int i = s->sdis[p]; i < s->sdis[p] + s->scnt[p]; i++) pr[i] = stage_peer(s, p);
    for (int q = 0; q < s->nsend;) {
        int row = s->sidx[s->rord[q]];
        float *o = out + (size_t)row * C;
        int first_node = 1;
        while (q < s->nsend && s->sidx[s->rord[q]] == row) {
            int node = a->node_of[pr[s->rord[q]]];
            memcpy(acc, ret + (size_t)s->rord[q] * C, rb);
            q++;
            while (q < s->nsend && s->sidx[s->rord[q]] == row && a->node_of[pr[s->rord[q]]] == node) {
                const float *r = ret + (size_t)s->rord[q] * C;
                for (int c = 0; c < C; c++) acc[c] += r[c];
                q++;
            }
            if (first_node) memcpy(o, acc, rb);
            else
                for (int c = 0; c < C; c++) o[c] += acc[c];
            first_node = 0;
        }
    }
    free(pr);
    mt_free(acc);
    mt_trace_end();
}

/* back: rows [nrecv, C] returned to their senders, summed into out[nin, C] (stage_sum);
 * takes back (mt_alloc'd) */
static void stage_bwd(mt_a2a *a, const mt_a2a_stage *s, float *out, int nin, float *back, int C) {
    float *ret = mt_alloc(sizeof(float) * (size_t)C * ((size_t)s->nsend + 1));
    mt_a2a_xfer x;
    xfer_start(a, &x, s, 1, back, ret, C);
    xfer_finish(&x);
    stage_sum(a, s, out, nin, ret, C);
    mt_free(ret);
}

/* An INT8 row (a->q8): the ceil(C/128) scales of a row of C values, then its C codes, padded
 * to whole floats, so that the stages move it as a row of q8_width(C) floats. */
static int q8_scales(int C) { return (C + MT_FLASHCOMM_BLOCK - 1) / MT_FLASHCOMM_BLOCK; }
static int q8_width(int C) { return q8_scales(C) + (C + 3) / 4; }

static float *q8_pack(mt_a2a *a, const float *x, int N, int C) {
    const int qc = q8_width(C), nb = q8_scales(C);
    float *o = mt_alloc(sizeof(float) * ((size_t)qc * N + 1));
    for (int n = 0; n < N; n++) {
        float *row = o + (size_t)n * qc;
        int8_t *q = (int8_t *)(row + nb);
        mt_q8_encode(x + (size_t)n * C, (size_t)C, row, q, &a->bytes.q8_err_sq, &a->bytes.q8_ref_sq);
        memset(q + C, 0, sizeof(float) * (size_t)(qc - nb) - (size_t)C);
    }
    return o;
}

static void q8_unpack(const float *in, float *out, int N, int C) {
    const int qc = q8_width(C), nb = q8_scales(C);
    for (int n = 0; n < N; n++) {
        const float *sc = in + (size_t)n * qc;
        const int8_t *q = (const int8_t *)(sc + nb);
        float *o = out + (size_t)n * C;
        for (int c = 0; c < C; c++) o[c] = (float)q[c] * sc[c / MT_FLASHCOMM_BLOCK];
    }
}

/* ---- dispatch ---- */

typedef struct { int32_t le, src, tok, slot, item; float w; } pkey;
static int pkey_cmp(const void *x, const void *y) {
    const pkey *a = x, *b = y;
    if (a->le != b->le) return a->le < b->le ? -1 : 1;
    if (a->src != b->src) return a->src < b->src ? -1 : 1;
    if (a->tok != b->tok) return a->tok < b->tok ? -1 : 1;
    return (a->slot > b->slot) - (a->slot < b->slot);
}

static int32_t fbits(float f) {
    int32_t i;
    memcpy(&i, &f, sizeof i);
    return i;
}
static float bitsf(int32_t i) {
    float f;
    memcpy(&f, &i, sizeof f);
    return f;
}

/* Pushes, for one source row with pairs (e[q], slot[q], wb[q]) q < m (slot order), one item
 * per group: group of a pair = key(owner) (rank or node), groups in ascending order. */
static void push_groups(itemlist *l, const mt_a2a *a, int by_node, int src, int tok, int sidx, const int32_t *e,
                        const int32_t *slot, const int32_t *wb, int m, int LE, int32_t *tmp) {
    int prev = -1;
    for (;;) {
        int g = INT_MAX;
        for (int q = 0; q < m; q++) {
            int o = e[q] / LE, k = by_node ? a->node_of[o] : o;
            if (k > prev && k < g) g = k;
        }
        if (g == INT_MAX) break;
        int n = 0;
        tmp[0] = src;
        tmp[1] = tok;
        for (int q = 0; q < m; q++) {
            int o = e[q] / LE, k = by_node ? a->node_of[o] : o;
            if (k != g) continue;
            tmp[3 + 3 * n] = e[q];
            tmp[4 + 3 * n] = slot[q];
            tmp[5 + 3 * n] = wb[q];
            n++;
        }
        tmp[2] = n;
        /* peer: FLAT -> the owner rank g; HIER -> the relay on node g */
        int peer;
        if (by_node) {
            int ns = a->node_start[g], sz = a->node_start[g + 1] - ns;
            peer = a->node_rank[ns + a->local % sz];
        } else {
            peer = g;
        }
        il_push(l, peer, sidx, tmp, 3 + 3 * n);
        prev = g;
    }
}

void mt_a2a_plan_free(mt_a2a_plan *p) {
    for (int s = 0; s < 2; s++) stage_free(&p->st[s]);
    free(p->off);
    free(p->src);
    free(p->tok);
    free(p->slot);
    free(p->w);
    free(p->item_p);
    free(p->pair_pos);
    memset(p, 0, sizeof *p);
}

int mt_a2a_dispatch(mt_a2a *a, mt_a2a_mode mode, mt_a2a_plan *p, float **xe, const float *x,
                    const int32_t *sel, const float *w, int N, int K, int C, int E) {
    memset(p, 0, sizeof *p);
    *xe = NULL;
    int bad = 0;
    if (N < 0 || K < 1 || C < 1 || E < 1 || E % a->size != 0) {
        bad = mt_error("a2a: bad shape N=%d K=%d C=%d E=%d for an EP group of %d ranks", N, K, C, E, a->size);
        N = 0; /* nothing to send: the stages still run, so that no rank waits for this one */
        if (K < 1 || E % a->size != 0 || E < 1) K = 1, E = a->size;
        if (C < 1) C = 1;
    }
    for (int i = 0; i < N * K && !bad; i++)
        if (sel[i] < 0 || sel[i] >= E) bad = mt_error("a2a: token %d selects expert %d, not in [0,%d)", i / K, sel[i], E);
    const int LE = E / a->size;
    /* one node: the hierarchical exchange's first stage would only send rows to the ranks
     * themselves (each its own relay) at the cost of extra messages; one rank a node: its
     * second stage would be a copy to itself. Flat moves the same rows in the same order,
     * so the results are the same bits */
    if (a->nnodes == 1 || !a->node_peers) mode = MT_A2A_FLAT;
    p->mode = mode;
    p->N = N, p->K = K, p->C = C, p->E = E, p->LE = LE, p->e0 = a->rank * LE;
    p->nst = mode == MT_A2A_HIER ? 2 : 1;
    mcheck ck = {a, K, E, LE, 0};
    const int q8 = a->q8, Cw = q8 ? q8_width(C) : C; /* the width of a travelling row */

    int32_t *tmp = mt_xmalloc(sizeof(int32_t) * (3 + 3 * (size_t)K)), *slot = mt_xmalloc(sizeof(int32_t) * (size_t)K),
            *wb = mt_xmalloc(sizeof(int32_t) * (size_t)K);
    for (int j = 0; j < K; j++) slot[j] = j;
    itemlist l0 = {0};
    mt_trace_begin(PERMUTE);
    for (int t = 0; t < N && !bad; t++) {
        for (int j = 0; j < K; j++) wb[j] = fbits(w ? w[(size_t)t * K + j] : 1.0f);
        push_groups(&l0, a, mode == MT_A2A_HIER, a->rank, t, t, sel + (size_t)t * K, slot, wb, K, LE, tmp);
    }
    float *packed = q8 && !bad ? q8_pack(a, x, N, C) : NULL;
    mt_trace_end();
    int32_t *rmeta = NULL;
    float *rows = NULL;
    int nrmeta = 0;
    bad = stage_exchange(a, &p->st[0], a->ep, NULL, &l0, bad, q8 ? packed : x, Cw, &rmeta, &nrmeta, &rows);
    mt_free(packed);
    il_free(&l0);
    if (mode == MT_A2A_HIER) {
        /* the relay's fan-out inside the node */
        ck.hier_relay = 1;
        itemlist l1 = {0};
        int32_t *e = mt_xmalloc(sizeof(int32_t) * (size_t)K);
        for (int i = 0, o = 0; i < p->st[0].nrecv && !bad; i++) {
            int len;
            if (meta_item(&ck, rmeta + o, nrmeta - o, &len)) {
                bad = -1;
                break;
            }
            const int32_t *m = rmeta + o;
            for (int q = 0; q < m[2]; q++) e[q] = m[3 + 3 * q], slot[q] = m[4 + 3 * q], wb[q] = m[5 + 3 * q];
            /* group by owner rank; peers are node-local indices */
            int prev = -1;
            for (;;) {
                int g = INT_MAX;
                for (int q = 0; q < m[2]; q++)
                    if (e[q] / LE > prev && e[q] / LE < g) g = e[q] / LE;
                if (g == INT_MAX) break;
                int n = 0;
                tmp[0] = m[0];
                tmp[1] = m[1];
                for (int q = 0; q < m[2]; q++)
                    if (e[q] / LE == g) {
                        tmp[3 + 3 * n] = e[q], tmp[4 + 3 * n] = slot[q], tmp[5 + 3 * n] = wb[q];
                        n++;
                    }
                tmp[2] = n;
                il_push(&l1, a->local_of[g], i, tmp, 3 + 3 * n);
                prev = g;
            }
            o += len;
        }
        free(e);
        free(rmeta);
        rmeta = NULL;
        float *rows0 = rows;
        rows = NULL;
        bad = stage_exchange(a, &p->st[1], a->node, a->node_rank + a->node_start[a->node_id], &l1, bad, rows0, Cw,
                             &rmeta, &nrmeta, &rows);
        mt_free(rows0);
        il_free(&l1);
    }
    free(tmp);
    free(slot);
    free(wb);
    /* items of the last stage -> pairs, sorted into the grouped layout */
    ck.hier_relay = 0;
    const mt_a2a_stage *sl = &p->st[p->nst - 1];
    p->nitem = bad ? 0 : sl->nrecv;
    p->item_p = mt_xmalloc(sizeof(int32_t) * ((size_t)p->nitem + 1));
    int np = 0;
    for (int i = 0, o = 0; i < p->nitem; i++) {
        int len;
        if (meta_item(&ck, rmeta + o, nrmeta - o, &len)) {
            bad = -1;
            break;
        }
        p->item_p[i] = np;
        np += rmeta[o + 2];
        o += len;
    }
    if (bad) { /* no agreement needed: a rank that failed told every peer in the first stage */
        free(rmeta);
        mt_free(rows);
        mt_a2a_plan_free(p);
        return -1;
    }
    mt_trace_begin(PERMUTE); /* the plan and the rows in the grouped layout */
    p->item_p[p->nitem] = np;
    p->R = np;
    pkey *k = mt_xmalloc(sizeof(pkey) * ((size_t)np + 1));
    for (int i = 0, o = 0; i < p->nitem; i++) {
        const int32_t *m = rmeta + o;
        for (int q = 0; q < m[2]; q++)
            k[p->item_p[i] + q] = (pkey){m[3 + 3 * q] - p->e0, m[0], m[1], m[4 + 3 * q], p->item_p[i] + q,
                                         bitsf(m[5 + 3 * q])};
        o += 3 + 3 * m[2];
    }
    free(rmeta);
    qsort(k, (size_t)np, sizeof *k, pkey_cmp);
    p->off = mt_xcalloc((size_t)LE + 1, sizeof(int32_t));
    p->src = mt_xmalloc(sizeof(int32_t) * ((size_t)np + 1));
    p->tok = mt_xmalloc(sizeof(int32_t) * ((size_t)np + 1));
    p->slot = mt_xmalloc(sizeof(int32_t) * ((size_t)np + 1));
    p->w = mt_xmalloc(sizeof(float) * ((size_t)np + 1));
    p->pair_pos = mt_xmalloc(sizeof(int32_t) * ((size_t)np + 1));
    for (int r = 0; r < np; r++) {
        p->off[k[r].le + 1]++;
        p->src[r] = k[r].src, p->tok[r] = k[r].tok, p->slot[r] = k[r].slot, p->w[r] = k[r].w;
        p->pair_pos[k[r].item] = r; /* pairs of an item are consecutive in slot order */
    }
    for (int e = 0; e < LE; e++) p->off[e + 1] += p->off[e];
    free(k);

    float *items = rows;
    if (q8) {
        items = mt_alloc(sizeof(float) * ((size_t)C * p->nitem + 1));
        q8_unpack(rows, items, p->nitem, C);
        mt_free(rows);
    }
    float *out = mt_alloc(sizeof(float) * (size_t)C * ((size_t)np + 1));
    for (int i = 0; i < p->nitem; i++)
        for (int q = p->item_p[i]; q < p->item_p[i + 1]; q++)
            memcpy(out + (size_t)p->pair_pos[q] * C, items + (size_t)i * C, sizeof(float) * (size_t)C);
    mt_free(items);
    mt_trace_end();
    *xe = out;
    return 0;
}

/* ---- combine and the backwards ---- */

/* part[nitem, W] = per item the weighted sum of its pairs' rows of y (W = C); with v, K
 * more columns (W = C + K): each pair's value in its slot, zeros elsewhere (mt_alloc'd) */
static float *combine_items(const mt_a2a_plan *p, const float *y, const float *wr, const float *v) {
    const int C = p->C, W = C + (v ? p->K : 0);
    mt_trace_begin(PERMUTE);
    float *part = mt_alloc(sizeof(float) * (size_t)W * ((size_t)p->nitem + 1));
    for (int i = 0; i < p->nitem; i++) {
        float *o = part + (size_t)i * W;
        if (v) memset(o + C, 0, sizeof(float) * (size_t)p->K);
        for (int q = p->item_p[i]; q < p->item_p[i + 1]; q++) {
            int r = p->pair_pos[q];
            const float *yr = y + (size_t)r * C;
            mt_moe_wrow(o, yr, wr ? wr[r] : 1.0f, C, q == p->item_p[i]);
            if (v) o[C + p->slot[r]] = v[r];
        }
    }
    mt_trace_end();
    return part;
}

void mt_a2a_combine(mt_a2a *a, const mt_a2a_plan *p, float *out, const float *y, const float *wr) {
    mt_a2a_req r = {0};
    mt_a2a_combine_begin(a, p, &r, y, wr);
    mt_a2a_combine_end(a, &r, out);
}

/* the combine's rows (with v: widened by the K values) back along the plan, in flight */
static void back_begin(mt_a2a *a, const mt_a2a_plan *p, mt_a2a_req *r, const float *y, const float *wr,
                       const float *v) {
    MT_ASSERT(r->kind == 0);
    const int W = p->C + (v ? p->K : 0);
    const mt_a2a_stage *s0 = &p->st[0];
    float *back = combine_items(p, y, wr, v);
    if (p->nst == 2) { /* the node's stage first: the relays sum what crosses back to each node */
        float *mid = mt_alloc(sizeof(float) * (size_t)W * ((size_t)s0->nrecv + 1));
        stage_bwd(a, &p->st[1], mid, s0->nrecv, back, W);
        back = mid;
    }
    *r = (mt_a2a_req){.kind = 1, .p = p, .C = W};
    r->rbuf = mt_alloc(sizeof(float) * (size_t)W * ((size_t)s0->nsend + 1));
    xfer_start(a, &r->x, s0, 1, back, r->rbuf, W);
}

void mt_a2a_combine_begin(mt_a2a *a, const mt_a2a_plan *p, mt_a2a_req *r, const float *y, const float *wr) {
    back_begin(a, p, r, y, wr, NULL);
}

void mt_a2a_dispatch_bwd_begin(mt_a2a *a, const mt_a2a_plan *p, mt_a2a_req *r, const float *dxe, const float *v) {
    back_begin(a, p, r, dxe, NULL, v);
}

void mt_a2a_combine_end(mt_a2a *a, mt_a2a_req *r, float *out) {
    MT_ASSERT(r->kind == 1);
    xfer_finish(&r->x);
    stage_sum(a, &r->p->st[0], out, r->p->N, r->rbuf, r->C);
    mt_free(r->rbuf);
    memset(r, 0, sizeof *r);
}

void mt_a2a_gather_begin(mt_a2a *a, const mt_a2a_plan *p, mt_a2a_req *r, const float *x) {
    MT_ASSERT(r->kind == 0);
    const mt_a2a_stage *s0 = &p->st[0];
    *r = (mt_a2a_req){.kind = 2, .p = p, .C = p->C};
    r->rbuf = mt_alloc(sizeof(float) * (size_t)p->C * ((size_t)s0->nrecv + 1));
    xfer_start(a, &r->x, s0, 0, stage_pack(s0, x, p->C), r->rbuf, p->C);
}

void mt_a2a_gather_end(mt_a2a *a, mt_a2a_req *r, float *xr) {
    MT_ASSERT(r->kind == 2);
    const mt_a2a_plan *p = r->p;
    const int C = p->C;
    xfer_finish(&r->x);
    float *items = r->rbuf;
    if (p->nst == 2) {
        items = stage_fwd(a, &p->st[1], r->rbuf, C);
        mt_free(r->rbuf);
    }
    mt_trace_begin(PERMUTE);
    for (int i = 0; i < p->nitem; i++)
        for (int q = p->item_p[i]; q < p->item_p[i + 1]; q++)
            memcpy(xr + (size_t)p->pair_pos[q] * C, items + (size_t)i * C, sizeof(float) * (size_t)C);
    mt_trace_end();
    mt_free(items);
    memset(r, 0, sizeof *r);
}

int mt_a2a_test(mt_a2a_req *r) { return r->kind == 0 || xfer_test(&r->x); }

void mt_a2a_dispatch_bwd(mt_a2a *a, const mt_a2a_plan *p, float *dx, const float *dxe) {
    mt_a2a_combine(a, p, dx, dxe, NULL);
}

void mt_a2a_gather(mt_a2a *a, const mt_a2a_plan *p, float *xr, const float *x) {
    mt_a2a_req r = {0};
    mt_a2a_gather_begin(a, p, &r, x);
    mt_a2a_gather_end(a, &r, xr);
}
