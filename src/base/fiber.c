/* base/fiber.c — two cooperative fibers on one thread (see fiber.h), over ucontext. */
#include "base/fiber.h"

#include <sys/mman.h>
#include <ucontext.h>

#include "base/common.h"
#include "base/trace.h"

/* the fibers' stacks: large and lazily backed (only the pages touched cost memory), a guard
 * page below each; made once and kept */
#define FIBER_STACK ((size_t)64 << 20)

static struct {
    ucontext_t main, ctx[2];
    void *stack[2];
    mt_fiber_fn fn[2];
    void *arg[2];
    int done[2];
    int cur;               /* -1 outside a pair */
} g;

static void *stack_of(int i) {
    if (!g.stack[i]) {
        void *p = mmap(NULL, FIBER_STACK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        MT_ASSERT(p != MAP_FAILED);
        MT_ASSERT(mprotect(p, 4096, PROT_NONE) == 0);
        g.stack[i] = p;
    }
    return g.stack[i];
}

/* AddressSanitizer must be told when the stack changes (else it reports false errors) */
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
static const void *s_bot[3]; /* each context's stack (index: context + 1), the thread's learned */
static size_t s_size[3];
static int s_from;
static void asan_start(void **fake, int to) { __sanitizer_start_switch_fiber(fake, s_bot[to + 1], s_size[to + 1]); }
static void asan_finish(void *fake) {
    __sanitizer_finish_switch_fiber(fake, &s_bot[s_from + 1], &s_size[s_from + 1]);
}
#else
static int s_from;
static void asan_start(void **fake, int to) { (void)fake, (void)to; }
static void asan_finish(void *fake) { (void)fake; }
#endif

/* makes `to` (-1: the caller of mt_fiber_pair) run, from the running context; `exiting`:
 * the running fiber has finished and is never resumed */
static void switch_to(int to, int exiting) {
    int from = g.cur;
    g.cur = to;
    mt_trace_fiber_switch(from, to);
    void *fake = NULL;
    asan_start(exiting ? NULL : &fake, to);
    s_from = from;
    swapcontext(from < 0 ? &g.main : &g.ctx[from], to < 0 ? &g.main : &g.ctx[to]);
    asan_finish(fake);
}

static void trampoline(void) {
    asan_finish(NULL);
    const int me = g.cur;
    g.fn[me](g.arg[me]);
    g.done[me] = 1;
    switch_to(g.done[1 - me] ? -1 : 1 - me, 1);
    MT_ASSERT(0); /* a finished fiber is never resumed */
}

void mt_fiber_pair(mt_fiber_fn a, void *aa, mt_fiber_fn b, void *ba) {
    MT_ASSERT(g.cur == -1); /* no nesting */
    g.fn[0] = a, g.fn[1] = b, g.arg[0] = aa, g.arg[1] = ba;
    for (int i = 0; i < 2; i++) {
        g.done[i] = 0;
        MT_ASSERT(getcontext(&g.ctx[i]) == 0);
        g.ctx[i].uc_stack.ss_sp = (char *)stack_of(i) + 4096;
        g.ctx[i].uc_stack.ss_size = FIBER_STACK - 4096;
        g.ctx[i].uc_link = NULL;
        makecontext(&g.ctx[i], trampoline, 0);
#if defined(__SANITIZE_ADDRESS__)
        s_bot[i + 1] = g.ctx[i].uc_stack.ss_sp;
        s_size[i + 1] = g.ctx[i].uc_stack.ss_size;
        /* a finished fiber never returns from its last frames: their redzones would stay
         * poisoned on the reused stack and trip the next pair's frames */
        __asan_unpoison_memory_region(g.ctx[i].uc_stack.ss_sp, g.ctx[i].uc_stack.ss_size);
#endif
    }
    switch_to(0, 0);
    /* back in the caller: both have finished (the last one to finish switches here) */
    MT_ASSERT(g.done[0] && g.done[1] && g.cur == -1);
}

int mt_fiber_id(void) { return g.cur; }

double mt_fiber_yield(void) {
    const int me = g.cur;
    if (me < 0 || g.done[1 - me]) return 0;
    double t0 = mt_now();
    switch_to(1 - me, 0);
    return mt_now() - t0;
}

__attribute__((constructor)) static void fiber_init(void) { g.cur = -1; }
