/* kernels/tier.h — which build of the hand-written kernels runs: one binary, every x86-64-v3 CPU.
 *
 * kernels/attention.c, ops.c, moe.c and rows.c are compiled once per CPU tier (CMakeLists.txt: each
 * with its own -march, its public functions renamed by kernels/tier_names.h), and the
 * public names (mt_attention_fwd, mt_rmsnorm_fwd, ...) jump to the tier chosen at start-up:
 *   avx2        x86-64-v3: AVX2 + FMA (Haswell, Zen 1-3 and later)
 *   avx512      x86-64-v4: AVX-512 F/BW/CD/DQ/VL (Skylake-SP, Ice Lake, Zen 4 and later)
 *   avx512bf16  x86-64-v4 + AVX512-BF16 (Cooper Lake, Sapphire Rapids, Zen 4 and later):
 *               the only tier with train --bf16
 * The best tier the CPU supports is the default (MT_CPU_TIER unset or auto);
 * MT_CPU_TIER=avx2|avx512|avx512bf16 forces one (a lower one: for tests, and to compare
 * tiers on one machine). Results are
 * bit-identical for any thread count within a tier; tiers may differ from each other in
 * the last bits (their sums split differently). */
#ifndef MT_KERNELS_TIER_H
#define MT_KERNELS_TIER_H

typedef enum { MT_TIER_AVX2 = 0, MT_TIER_AVX512 = 1, MT_TIER_AVX512BF16 = 2, MT_TIER_COUNT = 3 } mt_tier;

/* The tier the kernels run (chosen before main: the CPU's best, or MT_CPU_TIER). */
mt_tier mt_cpu_tier(void);
/* The best tier this CPU supports. */
mt_tier mt_cpu_tier_best(void);
/* "avx2", "avx512", "avx512bf16" */
const char *mt_cpu_tier_name(mt_tier t);
/* 0, or -1 with mt_last_error() set when MT_CPU_TIER names no tier or one this CPU lacks
 * (the kernels then run the best tier; main() refuses to start). */
int mt_cpu_tier_check(void);
/* Switches the kernels to tier t (at most the best; between steps, never during one):
 * lets a test compare the tiers in one process. Returns -1 (mt_last_error) if unsupported. */
int mt_cpu_tier_set(mt_tier t);

#endif
