/* parallel/distqueue.c — DistQueue (distqueue.h): owners' stores, the controller's table of
 * samples and its pending requests, all driven by one message loop (dq_serve). Every send is
 * an MPI_Isend from a private copy kept until it completes, so no rank ever blocks on
 * another inside the queue (a rank may send to itself: the controller is often a consumer
 * or an owner too). */
#include "parallel/distqueue.h"

#include <mpi.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/common.h"
#include "parallel/watchdog.h"

enum { TAG_META = 1, TAG_REQ, TAG_ASSIGN, TAG_SERVE, TAG_DATA, TAG_FREE, TAG_DONE, TAG_FIN, TAG_BYE };
enum { REQ_RANGE = 0, REQ_ANY = 1 };

/* A field this rank owns. */
typedef struct {
    int64_t id;
    int used;
    uint8_t *data[MT_DQ_MAX_FIELDS];
    size_t bytes[MT_DQ_MAX_FIELDS];
} dq_held;

/* The controller's view of a sample. */
typedef struct {
    int64_t id;                 /* -1: empty slot */
    uint32_t ready, taken;      /* fields put; tasks that took it */
    int version;
    int owner[MT_DQ_MAX_FIELDS];
    int64_t bytes[MT_DQ_MAX_FIELDS];
} dq_sample;

typedef struct {
    int from, kind, task, min_version;
    uint32_t need;
    int64_t a, b;               /* range: groups a .. b-1; any: a groups */
} dq_req;

typedef struct {
    MPI_Request r;
    void *buf;
} dq_send;

struct mt_dq {
    MPI_Comm comm;
    int rank, size;
    mt_dq_opts o;
    /* owner */
    dq_held *held;              /* [capacity] */
    int64_t nheld;
    /* sends in flight */
    dq_send *sends;
    int nsends, csends;
    /* controller: open-addressing table of live samples, keyed by id */
    dq_sample *tab;
    size_t tcap, tlive;
    dq_req *reqs;
    int nreqs, creqs;
    int closed, fins;
    int changed;                /* something arrived since the requests were last tried */
    /* consumer: the get in progress */
    int getting, assigned;
    int64_t expect;             /* DATA messages still to come */
    mt_dq_batch *out;
    uint32_t out_need;
    uint8_t **early;            /* DATA that came before its ASSIGN (another sender) */
    size_t *early_len;
    int nearly;
    int bye;
    mt_dq_stats st;
};

static void nap(void) {
    const struct timespec ts = {0, 50000};
    nanosleep(&ts, NULL);
}

/* ---- sends ---- */

static void dq_isend(mt_dq *q, void *buf, size_t bytes, int to, int tag) {
    MT_ASSERT(bytes <= (size_t)INT32_MAX);
    if (q->nsends == q->csends) {
        q->csends = q->csends ? 2 * q->csends : 16;
        q->sends = mt_xrealloc(q->sends, sizeof *q->sends * (size_t)q->csends);
    }
    dq_send *s = &q->sends[q->nsends++];
    s->buf = buf;
    MPI_Isend(buf, (int)bytes, MPI_BYTE, to, tag, q->comm, &s->r);
}

static void send_i64(mt_dq *q, const int64_t *v, size_t n, int to, int tag) {
    int64_t *c = mt_xmalloc(sizeof(int64_t) * (n ? n : 1));
    if (n) memcpy(c, v, sizeof(int64_t) * n);
    dq_isend(q, c, sizeof(int64_t) * n, to, tag);
}

static void reap_sends(mt_dq *q) {
    int k = 0;
    for (int i = 0; i < q->nsends; i++) {
        int done = 0;
        MPI_Test(&q->sends[i].r, &done, MPI_STATUS_IGNORE);
        if (done) free(q->sends[i].buf);
        else q->sends[k++] = q->sends[i];
    }
    q->nsends = k;
}

/* ---- the controller's table ---- */

static size_t slot_of(const mt_dq *q, int64_t id) {
    uint64_t h = (uint64_t)id * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 20) & (q->tcap - 1);
}

static dq_sample *tab_find(mt_dq *q, int64_t id) {
    for (size_t i = slot_of(q, id);; i = (i + 1) & (q->tcap - 1)) {
        if (q->tab[i].id == id) return &q->tab[i];
        if (q->tab[i].id < 0) return NULL;
    }
}

static void tab_grow(mt_dq *q);

static dq_sample *tab_add(mt_dq *q, int64_t id) {
    if (2 * (q->tlive + 1) > q->tcap) tab_grow(q);
    size_t i = slot_of(q, id);
    while (q->tab[i].id >= 0) i = (i + 1) & (q->tcap - 1);
    dq_sample *s = &q->tab[i];
    memset(s, 0, sizeof *s);
    s->id = id;
    s->version = -1;
    q->tlive++;
    return s;
}

static void tab_grow(mt_dq *q) {
    dq_sample *old = q->tab;
    const size_t ocap = q->tcap;
    q->tcap = ocap ? 2 * ocap : 1024;
    q->tab = mt_xmalloc(sizeof *q->tab * q->tcap);
    for (size_t i = 0; i < q->tcap; i++) q->tab[i].id = -1;
    q->tlive = 0;
    for (size_t i = 0; i < ocap; i++)
        if (old[i].id >= 0) *tab_add(q, old[i].id) = old[i];
    free(old);
}

/* Linear probing's deletion: later entries of the run move back into the hole. */
static void tab_del(mt_dq *q, dq_sample *s) {
    size_t i = (size_t)(s - q->tab);
    q->tab[i].id = -1;
    q->tlive--;
    for (size_t j = (i + 1) & (q->tcap - 1); q->tab[j].id >= 0; j = (j + 1) & (q->tcap - 1)) {
        const size_t home = slot_of(q, q->tab[j].id);
        /* the entry at j may fill the hole at i when i lies on its probe path home .. j */
        if (((j - home) & (q->tcap - 1)) >= ((j - i) & (q->tcap - 1))) {
            q->tab[i] = q->tab[j];
            q->tab[j].id = -1;
            i = j;
        }
    }
}

static uint32_t all_tasks(const mt_dq *q) { return q->o.ntasks >= 32 ? 0xffffffffu : (1u << q->o.ntasks) - 1; }

/* The sample is gone for every task: its owners drop it. */
static void drop_sample(mt_dq *q, dq_sample *s) {
    int sent[64], ns = 0;
    for (int f = 0; f < q->o.nfields; f++) {
        if (!(s->ready & (1u << f))) continue;
        int seen = 0;
        for (int k = 0; k < ns; k++) seen |= sent[k] == s->owner[f];
        if (seen) continue;
        if (ns < 64) sent[ns++] = s->owner[f];
        const int64_t msg[2] = {1, s->id};
        send_i64(q, msg, 2, s->owner[f], TAG_FREE);
    }
    tab_del(q, s);
    q->st.live = (int64_t)q->tlive;
}

static int group_ready(mt_dq *q, int64_t g, uint32_t need, int task, int *version) {
    const int G = q->o.group;
    int v = -1;
    for (int k = 0; k < G; k++) {
        dq_sample *s = tab_find(q, g * G + k);
        if (!s || (s->ready & need) != need || (s->taken & (1u << task))) return 0;
        if (s->version >= 0 && (v < 0 || s->version < v)) v = s->version;
    }
    *version = v;
    return 1;
}

static int cmp_i64(const void *a, const void *b) {
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Assigns groups[n] to request r: the consumer learns the samples, the owners get their orders. */
static void assign(mt_dq *q, const dq_req *r, const int64_t *groups, int n) {
    const int G = q->o.group;
    int64_t *msg = mt_xmalloc(sizeof(int64_t) * (1 + 2 * (size_t)n * G));
    msg[0] = (int64_t)n * G;
    /* per owner: consumer, count, then (id, field) pairs */
    int64_t **serve = mt_xcalloc((size_t)q->size, sizeof *serve);
    size_t *ns = mt_xcalloc((size_t)q->size, sizeof *ns), per = 2 + 2 * (size_t)n * G * MT_DQ_MAX_FIELDS;
    for (int i = 0; i < n; i++)
        for (int k = 0; k < G; k++) {
            const size_t at = (size_t)i * G + k;
            dq_sample *s = tab_find(q, groups[i] * G + k);
            msg[1 + 2 * at] = s->id, msg[2 + 2 * at] = s->version;
            for (int f = 0; f < q->o.nfields; f++) {
                if (!(r->need & (1u << f))) continue;
                const int w = s->owner[f];
                if (!serve[w]) {
                    serve[w] = mt_xmalloc(sizeof(int64_t) * per);
                    serve[w][0] = r->from, ns[w] = 2;
                }
                serve[w][ns[w]++] = s->id, serve[w][ns[w]++] = f;
            }
            s->taken |= 1u << r->task;
        }
    send_i64(q, msg, 1 + 2 * (size_t)n * G, r->from, TAG_ASSIGN);
    free(msg);
    for (int w = 0; w < q->size; w++) {
        if (!serve[w]) continue;
        serve[w][1] = (int64_t)(ns[w] - 2) / 2;
        dq_isend(q, serve[w], sizeof(int64_t) * ns[w], w, TAG_SERVE);
    }
    free(serve), free(ns);
    for (int i = 0; i < n; i++) /* taken by every task: gone */
        for (int k = 0; k < G; k++) {
            dq_sample *s = tab_find(q, groups[i] * G + k);
            if ((s->taken & all_tasks(q)) == all_tasks(q)) drop_sample(q, s);
        }
}

/* 1 when request r was answered. */
static int try_request(mt_dq *q, const dq_req *r) {
    int v;
    if (r->kind == REQ_RANGE) {
        for (int64_t g = r->a; g < r->b; g++)
            if (!group_ready(q, g, r->need, r->task, &v)) return 0;
        const int n = (int)(r->b - r->a);
        int64_t *gs = mt_xmalloc(sizeof(int64_t) * (size_t)(n ? n : 1));
        for (int i = 0; i < n; i++) gs[i] = r->a + i;
        assign(q, r, gs, n);
        free(gs);
        return 1;
    }
    /* any: the ready groups, oldest first; the too old ones are dropped */
    int64_t *gs = mt_xmalloc(sizeof(int64_t) * (q->tlive + 1));
    size_t ng = 0;
    for (size_t i = 0; i < q->tcap; i++) {
        const int64_t id = q->tab[i].id;
        if (id >= 0 && id % q->o.group == 0) gs[ng++] = id / q->o.group;
    }
    qsort(gs, ng, sizeof *gs, cmp_i64);
    size_t take = 0;
    for (size_t i = 0; i < ng && take < (size_t)r->a; i++) {
        if (!group_ready(q, gs[i], r->need, r->task, &v)) continue;
        if (v >= 0 && v < r->min_version) {
            for (int k = 0; k < q->o.group; k++) drop_sample(q, tab_find(q, gs[i] * q->o.group + k));
            q->st.dropped_samples += q->o.group;
            continue;
        }
        gs[take++] = gs[i];
    }
    const int answered = take == (size_t)r->a || q->closed == q->o.nproducers;
    if (answered) assign(q, r, gs, (int)take);
    free(gs);
    return answered;
}

static void try_requests(mt_dq *q) {
    if (!q->changed) return;
    q->changed = 0;
    int k = 0;
    for (int i = 0; i < q->nreqs; i++)
        if (!try_request(q, &q->reqs[i])) q->reqs[k++] = q->reqs[i];
    q->nreqs = k;
}

/* ---- the message loop ---- */

static dq_held *held_find(mt_dq *q, int64_t id) {
    for (int i = 0; i < q->o.capacity; i++)
        if (q->held[i].used && q->held[i].id == id) return &q->held[i];
    return NULL;
}

static void on_meta(mt_dq *q, const int64_t *m) { /* id, field, owner, bytes, version */
    dq_sample *s = tab_find(q, m[0]);
    if (!s) s = tab_add(q, m[0]);
    const int f = (int)m[1];
    s->ready |= 1u << f;
    s->owner[f] = (int)m[2];
    s->bytes[f] = m[3];
    if (m[4] >= 0 && (s->version < 0 || m[4] < s->version)) s->version = (int)m[4];
    q->st.live = (int64_t)q->tlive;
    if (q->st.live > q->st.live_peak) q->st.live_peak = q->st.live;
    q->changed = 1;
}

static void on_serve(mt_dq *q, const int64_t *m) { /* consumer, count, (id, field)... */
    for (int64_t i = 0; i < m[1]; i++) {
        const int64_t id = m[2 + 2 * i];
        const int f = (int)m[3 + 2 * i];
        dq_held *h = held_find(q, id);
        if (!h || !h->data[f]) mt_dist_abort("DistQueue: asked for a field this rank does not hold");
        uint8_t *b = mt_xmalloc(16 + h->bytes[f]);
        memcpy(b, &id, 8);
        const int64_t f64 = f;
        memcpy(b + 8, &f64, 8);
        memcpy(b + 16, h->data[f], h->bytes[f]);
        dq_isend(q, b, 16 + h->bytes[f], (int)m[0], TAG_DATA);
    }
}

static void on_free(mt_dq *q, const int64_t *m) {
    for (int64_t i = 0; i < m[0]; i++) {
        dq_held *h = held_find(q, m[1 + i]);
        if (!h) continue; /* two fields of one owner: dropped by the first order */
        for (int f = 0; f < MT_DQ_MAX_FIELDS; f++) free(h->data[f]);
        memset(h, 0, sizeof *h);
        q->nheld--;
    }
}

static int find_out(const mt_dq_batch *b, int64_t id) {
    int lo = 0, hi = b->n - 1;
    while (lo <= hi) {
        const int mid = (lo + hi) / 2;
        if (b->id[mid] == id) return mid;
        if (b->id[mid] < id) lo = mid + 1;
        else hi = mid - 1;
    }
    return -1;
}

static int on_data(mt_dq *q, uint8_t *buf, size_t len);

static void on_assign(mt_dq *q, const int64_t *m) { /* n, (id, version)... in id order */
    mt_dq_batch *b = q->out;
    b->n = (int)m[0];
    b->id = mt_xmalloc(sizeof(int64_t) * (size_t)(b->n ? b->n : 1));
    b->version = mt_xmalloc(sizeof(int) * (size_t)(b->n ? b->n : 1));
    for (int i = 0; i < b->n; i++) b->id[i] = m[1 + 2 * i], b->version[i] = (int)m[2 + 2 * i];
    int nf = 0;
    for (int f = 0; f < q->o.nfields; f++) {
        if (!(q->out_need & (1u << f))) continue;
        nf++;
        b->data[f] = mt_xcalloc((size_t)(b->n ? b->n : 1), sizeof *b->data[f]);
        b->bytes[f] = mt_xcalloc((size_t)(b->n ? b->n : 1), sizeof *b->bytes[f]);
    }
    q->expect = (int64_t)b->n * nf;
    q->assigned = 1;
    for (int k = 0; k < q->nearly; k++) {
        on_data(q, q->early[k], q->early_len[k]);
        free(q->early[k]);
    }
    q->nearly = 0;
}

/* 1 when buf was kept for later (it came before the assignment it belongs to). */
static int on_data(mt_dq *q, uint8_t *buf, size_t len) {
    if (q->getting && !q->assigned) {
        q->early = mt_xrealloc(q->early, sizeof *q->early * (size_t)(q->nearly + 1));
        q->early_len = mt_xrealloc(q->early_len, sizeof *q->early_len * (size_t)(q->nearly + 1));
        q->early[q->nearly] = buf, q->early_len[q->nearly++] = len;
        return 1;
    }
    int64_t id, f;
    memcpy(&id, buf, 8), memcpy(&f, buf + 8, 8);
    const int i = q->getting ? find_out(q->out, id) : -1;
    if (i < 0 || f < 0 || f >= q->o.nfields || q->out->data[f] == NULL || q->out->data[f][i])
        mt_dist_abort("DistQueue: a field arrived that this rank did not ask for");
    q->out->data[f][i] = mt_xmalloc(len - 16 + 1);
    memcpy(q->out->data[f][i], buf + 16, len - 16);
    q->out->bytes[f][i] = len - 16;
    q->expect--;
    return 0;
}

/* Handles every message that has arrived; 1 if there was one. */
static int dq_serve(mt_dq *q) {
    int any = 0;
    for (;;) {
        int flag = 0;
        MPI_Status st;
        MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, q->comm, &flag, &st);
        if (!flag) break;
        any = 1;
        int len = 0;
        MPI_Get_count(&st, MPI_BYTE, &len);
        uint8_t *buf = mt_xmalloc((size_t)len + 8);
        MPI_Recv(buf, len, MPI_BYTE, st.MPI_SOURCE, st.MPI_TAG, q->comm, MPI_STATUS_IGNORE);
        const int64_t *m = (const int64_t *)buf;
        switch (st.MPI_TAG) {
        case TAG_META: on_meta(q, m); break;
        case TAG_SERVE: on_serve(q, m); break;
        case TAG_FREE: on_free(q, m); break;
        case TAG_ASSIGN: on_assign(q, m); break;
        case TAG_DATA:
            if (on_data(q, buf, (size_t)len)) continue; /* kept */
            break;
        case TAG_REQ: {
            if (q->nreqs == q->creqs) {
                q->creqs = q->creqs ? 2 * q->creqs : 8;
                q->reqs = mt_xrealloc(q->reqs, sizeof *q->reqs * (size_t)q->creqs);
            }
            q->reqs[q->nreqs++] = (dq_req){st.MPI_SOURCE, (int)m[0], (int)m[1], (int)m[5], (uint32_t)m[2], m[3], m[4]};
            q->changed = 1;
            break;
        }
        case TAG_DONE: q->closed++, q->changed = 1; break;
        case TAG_FIN: q->fins++; break;
        case TAG_BYE: q->bye = 1; break;
        default: mt_dist_abort("DistQueue: a message with an unknown tag");
        }
        free(buf);
    }
    if (q->rank == 0) try_requests(q);
    reap_sends(q);
    return any;
}

void mt_dq_progress(mt_dq *q) { dq_serve(q); }

/* Serves the queue until done(q) holds, sleeping briefly when nothing arrived. */
static void wait_until(mt_dq *q, int (*done)(mt_dq *), const char *what) {
    mt_watch_begin(what, q->comm);
    while (!done(q))
        if (!dq_serve(q)) nap();
    mt_watch_end();
}

void mt_dq_wait(mt_dq *q, int (*done)(void *ctx), void *ctx, const char *what) {
    mt_watch_begin(what, q->comm);
    while (!done(ctx))
        if (!dq_serve(q)) nap();
    mt_watch_end();
}

/* ---- the API ---- */

mt_dq *mt_dq_init(const mt_group *g, const mt_dq_opts *o) {
    MT_ASSERT(o->group >= 1 && o->nfields >= 1 && o->nfields <= MT_DQ_MAX_FIELDS && o->ntasks >= 1 &&
              o->ntasks <= 32 && o->capacity >= o->group && o->nproducers >= 0);
    mt_dq *q = mt_xcalloc(1, sizeof *q);
    MPI_Comm_dup(g->comm, &q->comm);
    MPI_Comm_set_name(q->comm, "distqueue");
    MPI_Comm_rank(q->comm, &q->rank);
    MPI_Comm_size(q->comm, &q->size);
    q->o = *o;
    q->held = mt_xcalloc((size_t)o->capacity, sizeof *q->held);
    if (q->rank == 0) tab_grow(q);
    return q;
}

static int room(mt_dq *q) { return q->nheld < q->o.capacity; }

void mt_dq_put(mt_dq *q, int64_t id, int field, const void *data, size_t bytes, int version) {
    MT_ASSERT(id >= 0 && field >= 0 && field < q->o.nfields);
    dq_serve(q);
    dq_held *h = held_find(q, id);
    if (!h) {
        if (!room(q)) {
            const double t0 = mt_now();
            wait_until(q, room, "DistQueue: waiting for room (a full store: no consumer takes samples)");
            q->st.wait_put_s += mt_now() - t0;
        }
        for (int i = 0; i < q->o.capacity && !h; i++)
            if (!q->held[i].used) h = &q->held[i];
        h->used = 1, h->id = id;
        if (++q->nheld > q->st.held_peak) q->st.held_peak = q->nheld;
    }
    if (h->data[field]) mt_dist_abort("DistQueue: the same field of a sample was put twice");
    h->data[field] = mt_xmalloc(bytes + 1);
    memcpy(h->data[field], data, bytes);
    h->bytes[field] = bytes;
    const int64_t m[5] = {id, field, q->rank, (int64_t)bytes, version};
    send_i64(q, m, 5, 0, TAG_META);
}

void mt_dq_close(mt_dq *q) {
    send_i64(q, NULL, 0, 0, TAG_DONE);
    dq_serve(q);
}

static int got_all(mt_dq *q) { return q->assigned && q->expect == 0; }

static void get(mt_dq *q, const int64_t req[6], uint32_t need, mt_dq_batch *out) {
    MT_ASSERT(!q->getting);
    memset(out, 0, sizeof *out);
    q->getting = 1, q->assigned = 0, q->expect = 0, q->out = out, q->out_need = need;
    send_i64(q, req, 6, 0, TAG_REQ);
    const double t0 = mt_now();
    wait_until(q, got_all, "DistQueue: waiting for samples (their producer is slow, stuck or dead)");
    q->st.wait_get_s += mt_now() - t0;
    q->getting = 0, q->out = NULL;
}

void mt_dq_get_range(mt_dq *q, int task, uint32_t need, int64_t lo, int64_t hi, mt_dq_batch *out) {
    MT_ASSERT(task >= 0 && task < q->o.ntasks && lo <= hi && need && need < (1u << q->o.nfields));
    const int64_t r[6] = {REQ_RANGE, task, need, lo, hi, 0};
    get(q, r, need, out);
}

int mt_dq_get_any(mt_dq *q, int task, uint32_t need, int ngroups, int min_version, mt_dq_batch *out) {
    MT_ASSERT(task >= 0 && task < q->o.ntasks && ngroups >= 0 && need && need < (1u << q->o.nfields));
    if ((int64_t)ngroups * q->o.group > (int64_t)q->o.capacity * q->o.nproducers)
        mt_dist_abort("DistQueue: a consumer asks for more groups at once than the producers' stores can hold "
                      "(they would wait for room forever)");
    const int64_t r[6] = {REQ_ANY, task, need, ngroups, 0, min_version};
    get(q, r, need, out);
    return out->n / q->o.group;
}

void mt_dq_batch_free(mt_dq_batch *b) {
    for (int f = 0; f < MT_DQ_MAX_FIELDS; f++) {
        for (int i = 0; b->data[f] && i < b->n; i++) free(b->data[f][i]);
        free(b->data[f]), free(b->bytes[f]);
    }
    free(b->id), free(b->version);
    memset(b, 0, sizeof *b);
}

mt_dq_stats mt_dq_get_stats(const mt_dq *q) { return q->st; }

static int all_fin(mt_dq *q) { return q->fins == q->size; }
static int byed(mt_dq *q) { return q->bye && q->nsends == 0; }

void mt_dq_free(mt_dq *q) {
    if (!q) return;
    /* every rank's messages to the controller precede its FIN, the controller's to each rank
     * precede BYE: once BYE arrived nothing is left in flight to this rank */
    send_i64(q, NULL, 0, 0, TAG_FIN);
    if (q->rank == 0) {
        wait_until(q, all_fin, "DistQueue: waiting for every rank to finish");
        for (int w = 0; w < q->size; w++) send_i64(q, NULL, 0, w, TAG_BYE);
    }
    wait_until(q, byed, "DistQueue: waiting for the controller's last word");
    for (int i = 0; i < q->o.capacity; i++)
        for (int f = 0; f < MT_DQ_MAX_FIELDS; f++) free(q->held[i].data[f]);
    free(q->held), free(q->sends), free(q->tab), free(q->reqs), free(q->early), free(q->early_len);
    MPI_Comm_free(&q->comm);
    free(q);
}
