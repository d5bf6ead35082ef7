/* tests/test_balance.c — the expert placement from load (train/balance.h, mt_balance_layer):
 * a permutation of the slots, the stayers in their slots, the busiest rank's tokens never
 * worse, the greedy result on hand-made loads, nothing moved when balanced. Exits 1 with
 * file:line on the first failure. */
#include "base/common.h"
#include "train/balance.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(c) do { if (!(c)) { \
    fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #c); exit(1); } } while (0)

static int64_t rank_tokens(const int64_t *load, const int32_t *slot, int E, int P, int r) {
    int64_t s = 0;
    for (int e = 0; e < E; e++) s += slot[e] / (E / P) == r ? load[e] : 0;
    return s;
}

/* nxt is a permutation; an expert on the same rank kept its slot; moved = experts that changed rank */
static void check_shape(const int32_t *cur, const int32_t *nxt, int E, int P, int moved) {
    const int LE = E / P;
    unsigned char seen[256] = {0};
    int m = 0;
    for (int e = 0; e < E; e++) {
        CHECK(nxt[e] >= 0 && nxt[e] < E && !seen[nxt[e]]);
        seen[nxt[e]] = 1;
        if (nxt[e] / LE == cur[e] / LE) CHECK(nxt[e] == cur[e]);
        else m++;
    }
    CHECK(m == moved);
}

int main(void) {
    int32_t cur[64], nxt[64];
    double b0, b1, mean;
    /* E 8 over 2 ranks, the two heaviest on rank 0: one of them goes */
    {
        const int64_t load[8] = {100, 90, 10, 10, 10, 10, 10, 10};
        for (int e = 0; e < 8; e++) cur[e] = e;
        int mv = mt_balance_layer(load, cur, 8, 2, nxt, &b0, &b1, &mean);
        check_shape(cur, nxt, 8, 2, mv);
        CHECK(b0 == 210 && mean == 125);
        /* greedy: 100 -> r0, 90 -> r1, each 10 to the lighter rank (a tie to its own) until full:
         * r0 100 + 3 x 10, r1 90 + 3 x 10 */
        CHECK(rank_tokens(load, nxt, 8, 2, 0) == 130 && rank_tokens(load, nxt, 8, 2, 1) == 120);
        CHECK(b1 == 130 && mv > 0);
        CHECK(nxt[0] / 4 == 0 && nxt[1] / 4 == 1); /* the heaviest stays home (the tie goes to its rank) */
    }
    /* balanced already: nothing moves, nxt = cur */
    {
        const int64_t load[8] = {10, 10, 10, 10, 10, 10, 10, 10};
        for (int e = 0; e < 8; e++) cur[e] = (e * 3) % 8; /* any placement */
        int mv = mt_balance_layer(load, cur, 8, 2, nxt, &b0, &b1, &mean);
        CHECK(mv == 0 && b0 == 40 && b1 == 40 && !memcmp(cur, nxt, sizeof(int32_t) * 8));
    }
    /* a gain under 1% is not worth a move */
    {
        const int64_t load[4] = {1000, 995, 3, 1};
        for (int e = 0; e < 4; e++) cur[e] = e; /* r0: 1995 tokens, r1: 4; any pairing of the 1000s is worse */
        const int64_t load2[4] = {1000, 3, 995, 1}; /* r0 1003, r1 996: the greedy's 1001 is not 1% better */
        int mv = mt_balance_layer(load2, cur, 4, 2, nxt, &b0, &b1, &mean);
        CHECK(b0 == 1003 && mv == 0 && b1 == 1003 && !memcmp(cur, nxt, sizeof(int32_t) * 4));
        mv = mt_balance_layer(load, cur, 4, 2, nxt, &b0, &b1, &mean);
        check_shape(cur, nxt, 4, 2, mv);
        CHECK(b0 == 1995 && b1 == 1001 && mv == 2);
    }
    /* random loads, 64 experts over 1, 2, 4, 8, 16 ranks, shuffled placements: never worse */
    for (int P = 1; P <= 16; P *= 2)
        for (int trial = 0; trial < 50; trial++) {
            int64_t load[64];
            for (int e = 0; e < 64; e++) {
                load[e] = (int64_t)(mt_hash4(trial, P, e, 1) % 1000);
                cur[e] = e;
            }
            for (int e = 63; e > 0; e--) {
                int j = (int)(mt_hash4(trial, P, e, 2) % (uint64_t)(e + 1));
                int32_t t = cur[e];
                cur[e] = cur[j], cur[j] = t;
            }
            int mv = mt_balance_layer(load, cur, 64, P, nxt, &b0, &b1, &mean);
            check_shape(cur, nxt, 64, P, mv);
            int64_t mx = 0;
            for (int r = 0; r < P; r++) {
                int64_t x = rank_tokens(load, nxt, 64, P, r);
                mx = x > mx ? x : mx;
            }
            CHECK((double)mx == b1 && b1 <= b0 && (mv == 0 || b1 <= 0.99 * b0));
            CHECK(P > 1 || mv == 0);
        }
    printf("test_balance: ok\n");
    return 0;
}
