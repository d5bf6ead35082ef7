/* dist/dist.c — MPI layout and collectives (see dist.h). */
#include "dist/dist.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "base/common.h"

static mt_dist g_dist = {.rank = 0, .size = 1, .dp_rank = 0, .dp_size = 1, .local_rank = 0, .local_size = 1};

int mt_dist_init(int *argc, char ***argv) {
    MT_ASSERT(!g_dist.initialized);
    int provided = 0;
    if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
        return mt_error("MPI_Init_thread failed");
    if (provided < MPI_THREAD_FUNNELED) {
        /* only the main thread calls MPI, so SINGLE works in practice; say so once */
        mt_warn("MPI provides thread level %d < MPI_THREAD_FUNNELED; continuing", provided);
    }
    g_dist.initialized = 1;
    g_dist.world = MPI_COMM_WORLD;
    MPI_Comm_rank(MPI_COMM_WORLD, &g_dist.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_dist.size);
    /* DP is the whole world in this slice; its own communicator keeps its traffic apart
     * from that of later groups */
    MPI_Comm_dup(MPI_COMM_WORLD, &g_dist.dp);
    MPI_Comm_rank(g_dist.dp, &g_dist.dp_rank);
    MPI_Comm_size(g_dist.dp, &g_dist.dp_size);
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, g_dist.rank, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &g_dist.local_rank);
    MPI_Comm_size(node, &g_dist.local_size);
    MPI_Comm_free(&node);
    /* the runtime pins OpenMP thread i to the i-th allowed CPU: right for one process per
     * node, wrong for several sharing the same CPUs (all their thread 0s on one core) */
    if (g_dist.local_size > 1 && !getenv("MT_PIN")) setenv("MT_PIN", "0", 1);
    return 0;
}

void mt_dist_finalize(void) {
    if (!g_dist.initialized) return;
    MPI_Comm_free(&g_dist.dp);
    MPI_Finalize();
    g_dist.initialized = 0;
}

mt_dist *mt_dist_get(void) { return &g_dist; }

void mt_dist_abort(const char *msg) {
    if (g_dist.size > 1) {
        fprintf(stderr, "moetrain: error: rank %d of %d: %s\n", g_dist.rank, g_dist.size, msg);
        fprintf(stderr, "moetrain: rank %d is ending the job (MPI_Abort)\n", g_dist.rank);
        fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, 1);
    } else {
        fprintf(stderr, "moetrain: error: %s\n", msg);
    }
    exit(1);
}

/* MPI counts are int: large buffers go in pieces of at most this many elements */
enum { MAX_COUNT = 1 << 30 };

static void allreduce(mt_dist *d, void *x, size_t n, size_t esize, MPI_Datatype t) {
    if (d->dp_size == 1 || n == 0) return;
    double t0 = MPI_Wtime();
    for (size_t i = 0; i < n; i += MAX_COUNT) {
        size_t c = n - i < MAX_COUNT ? n - i : MAX_COUNT;
        MPI_Allreduce(MPI_IN_PLACE, (char *)x + i * esize, (int)c, t, MPI_SUM, d->dp);
    }
    d->comm_s += MPI_Wtime() - t0;
}

void mt_dist_allreduce_sum_f32(mt_dist *d, float *x, size_t n) { allreduce(d, x, n, sizeof *x, MPI_FLOAT); }
void mt_dist_allreduce_sum_f64(mt_dist *d, double *x, size_t n) { allreduce(d, x, n, sizeof *x, MPI_DOUBLE); }
void mt_dist_allreduce_sum_i64(mt_dist *d, int64_t *x, size_t n) { allreduce(d, x, n, sizeof *x, MPI_INT64_T); }

void mt_dist_world_sum_i64(mt_dist *d, int64_t *x, size_t n) {
    if (d->size > 1 && n > 0) MPI_Allreduce(MPI_IN_PLACE, x, (int)n, MPI_INT64_T, MPI_SUM, d->world);
}

void mt_dist_grad_allreduce(mt_dist *d, float *g, size_t n, size_t bucket_bytes) {
    if (d->dp_size == 1 || n == 0) return;
    size_t be = bucket_bytes / sizeof(float);
    if (be < 1) be = 1;
    if (be > MAX_COUNT) be = MAX_COUNT;
    double t0 = MPI_Wtime();
    for (size_t i = 0; i < n; i += be) {
        size_t c = n - i < be ? n - i : be;
        MPI_Allreduce(MPI_IN_PLACE, g + i, (int)c, MPI_FLOAT, MPI_SUM, d->dp);
    }
    d->comm_s += MPI_Wtime() - t0;
}

void mt_dist_shard(const mt_dist *d, size_t n, int r, size_t *lo, size_t *hi) {
    MT_ASSERT(r >= 0 && r < d->dp_size);
    /* floor(n*r/D) without the overflow of n*r: n = q*D + m gives q*r + floor(m*r/D) */
    const size_t D = (size_t)d->dp_size, q = n / D, m = n % D;
    *lo = q * (size_t)r + m * (size_t)r / D;
    *hi = q * (size_t)(r + 1) + m * (size_t)(r + 1) / D;
}

/* counts and displacements of the shards, in elements (shards must fit an int count) */
static void shard_counts(const mt_dist *d, size_t n, int *cnt, int *dis) {
    for (int r = 0; r < d->dp_size; r++) {
        size_t lo, hi;
        mt_dist_shard(d, n, r, &lo, &hi);
        MT_ASSERT(hi - lo <= (size_t)INT_MAX && lo <= (size_t)INT_MAX);
        cnt[r] = (int)(hi - lo);
        dis[r] = (int)lo;
    }
}

void mt_dist_reduce_scatter(mt_dist *d, const float *g, size_t n, float *shard) {
    if (d->dp_size == 1) {
        memcpy(shard, g, n * sizeof *g);
        return;
    }
    int *cnt = mt_xmalloc(sizeof(int) * (size_t)d->dp_size * 2), *dis = cnt + d->dp_size;
    shard_counts(d, n, cnt, dis);
    double t0 = MPI_Wtime();
    MPI_Reduce_scatter(g, shard, cnt, MPI_FLOAT, MPI_SUM, d->dp);
    d->comm_s += MPI_Wtime() - t0;
    free(cnt);
}

void mt_dist_allgather(mt_dist *d, float *p, size_t n) {
    if (d->dp_size == 1) return;
    int *cnt = mt_xmalloc(sizeof(int) * (size_t)d->dp_size * 2), *dis = cnt + d->dp_size;
    shard_counts(d, n, cnt, dis);
    double t0 = MPI_Wtime();
    MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, p, cnt, dis, MPI_FLOAT, d->dp);
    d->comm_s += MPI_Wtime() - t0;
    free(cnt);
}

void mt_dist_gather_shards(mt_dist *d, const float *shard, size_t n, float *full) {
    if (d->dp_size == 1) {
        memcpy(full, shard, n * sizeof *full);
        return;
    }
    int *cnt = mt_xmalloc(sizeof(int) * (size_t)d->dp_size * 2), *dis = cnt + d->dp_size;
    shard_counts(d, n, cnt, dis);
    double t0 = MPI_Wtime();
    MPI_Gatherv(shard, cnt[d->dp_rank], MPI_FLOAT, full, cnt, dis, MPI_FLOAT, 0, d->dp);
    d->comm_s += MPI_Wtime() - t0;
    free(cnt);
}

void mt_dist_scatter_shards(mt_dist *d, const float *full, size_t n, float *shard) {
    if (d->dp_size == 1) {
        memcpy(shard, full, n * sizeof *full);
        return;
    }
    int *cnt = mt_xmalloc(sizeof(int) * (size_t)d->dp_size * 2), *dis = cnt + d->dp_size;
    shard_counts(d, n, cnt, dis);
    double t0 = MPI_Wtime();
    MPI_Scatterv(full, cnt, dis, MPI_FLOAT, shard, cnt[d->dp_rank], MPI_FLOAT, 0, d->dp);
    d->comm_s += MPI_Wtime() - t0;
    free(cnt);
}

void mt_dist_bcast_f32(mt_dist *d, float *x, size_t n) {
    if (d->dp_size == 1) return;
    double t0 = MPI_Wtime();
    for (size_t i = 0; i < n; i += MAX_COUNT) {
        size_t c = n - i < MAX_COUNT ? n - i : MAX_COUNT;
        MPI_Bcast(x + i, (int)c, MPI_FLOAT, 0, d->dp);
    }
    d->comm_s += MPI_Wtime() - t0;
}

void mt_dist_barrier(mt_dist *d) {
    if (d->size > 1) MPI_Barrier(d->world);
}

int mt_dist_check_same(mt_dist *d, const char *what, uint64_t h) {
    if (d->size == 1) return 0;
    uint64_t *all = d->rank == 0 ? mt_xmalloc(sizeof(uint64_t) * (size_t)d->size) : NULL;
    MPI_Gather(&h, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, 0, d->world);
    int bad = -1;
    if (d->rank == 0)
        for (int r = 1; r < d->size && bad < 0; r++)
            if (all[r] != all[0]) bad = r;
    free(all);
    MPI_Bcast(&bad, 1, MPI_INT, 0, d->world);
    if (bad < 0) return 0;
    if (d->rank == 0)
        return mt_error("rank %d has a different %s than rank 0 (hash mismatch)", bad, what);
    return mt_error("rank 0 found that rank %d has a different %s than rank 0", bad, what);
}

uint64_t mt_dist_hash_exe(void) {
    FILE *f = fopen("/proc/self/exe", "rb");
    if (!f) return 0;
    XXH64_state_t *st = XXH64_createState();
    XXH64_reset(st, 0);
    char *buf = mt_xmalloc(1 << 20);
    size_t n;
    while ((n = fread(buf, 1, 1 << 20, f)) > 0) XXH64_update(st, buf, n);
    fclose(f);
    free(buf);
    uint64_t h = XXH64_digest(st);
    XXH64_freeState(st);
    return h;
}
