/* kernels/tier.c — the CPU tier of the kernels and the jumps to it (see tier.h).
 *
 * Each public kernel name is a one-instruction trampoline, `jmp *ptr`, to the function of
 * the tier in use: the arguments pass through untouched, so one line per name serves any
 * signature. The pointers start at the avx2 build (every supported CPU runs it) and are set
 * by a constructor, before main and before any kernel runs. This file is compiled for
 * plain x86-64, so that a CPU without AVX2 gets a message instead of an illegal
 * instruction. */
#include "kernels/tier.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/common.h"
#include "kernels/attention.h"
#include "kernels/moe.h"
#include "kernels/ops.h"
#include "kernels/rows.h"
#include "kernels/tier_names.h"

#define DECLARE(n) extern __typeof__(n) n##__avx2, n##__avx512, n##__avx512bf16;
MT_TIERED(DECLARE)
#undef DECLARE

/* the pointer each trampoline jumps through (used: referenced from asm only) */
#define POINTER(n) __attribute__((used)) static __typeof__(n) *n##__ptr = n##__avx2;
MT_TIERED(POINTER)
#undef POINTER

#define TRAMPOLINE(n) __asm__(".text\n.globl " #n "\n.type " #n ", @function\n.p2align 4\n" #n ":\n" \
                              "    jmp *" #n "__ptr(%rip)\n.size " #n ", .-" #n "\n");
MT_TIERED(TRAMPOLINE)
#undef TRAMPOLINE

static mt_tier g_tier = MT_TIER_AVX2, g_best = MT_TIER_AVX2;
static const char *g_bad_env; /* MT_CPU_TIER's value when it could not be honoured */

static const char *const tier_names[MT_TIER_COUNT] = {"avx2", "avx512", "avx512bf16"};

const char *mt_cpu_tier_name(mt_tier t) { return t >= 0 && t < MT_TIER_COUNT ? tier_names[t] : "?"; }

mt_tier mt_cpu_tier(void) { return g_tier; }

mt_tier mt_cpu_tier_best(void) { return g_best; }

static void point_to(mt_tier t) {
#define SET(n) n##__ptr = t == MT_TIER_AVX512BF16 ? n##__avx512bf16 : t == MT_TIER_AVX512 ? n##__avx512 : n##__avx2;
    MT_TIERED(SET)
#undef SET
    g_tier = t;
}

int mt_cpu_tier_set(mt_tier t) {
    if (t < 0 || t > g_best)
        return mt_error("CPU tier %s: this CPU supports at most %s", mt_cpu_tier_name(t), mt_cpu_tier_name(g_best));
    point_to(t);
    return 0;
}

int mt_cpu_tier_check(void) {
    if (!g_bad_env) return 0;
    return mt_error("MT_CPU_TIER=%s: expected auto, avx2, avx512 or avx512bf16, at most this CPU's best (%s)", g_bad_env,
                    mt_cpu_tier_name(g_best));
}

__attribute__((constructor)) static void tier_init(void) {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
        static const char msg[] = "moetrain: this CPU has no AVX2/FMA; moetrain needs an x86-64-v3 CPU "
                                  "(Haswell, Zen or later)\n";
        ssize_t w = write(2, msg, sizeof msg - 1);
        (void)w;
        _exit(1);
    }
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vl"))
        g_best = __builtin_cpu_supports("avx512bf16") ? MT_TIER_AVX512BF16 : MT_TIER_AVX512;
    mt_tier t = g_best;
    const char *e = getenv("MT_CPU_TIER");
    if (e && *e && strcmp(e, "auto") != 0) {
        int want = -1;
        for (int i = 0; i < MT_TIER_COUNT; i++)
            if (strcmp(e, tier_names[i]) == 0) want = i;
        if (want < 0 || want > (int)g_best) g_bad_env = e;
        else t = (mt_tier)want;
    }
    point_to(t);
}
