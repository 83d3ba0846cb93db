/* The persistent thread pool and the plan executor (after ggml-cpu's ggml_graph_compute: every thread
 * walks the same op list, each op split across threads), with completion counts instead of barriers.
 *
 * Threads are started once by ed_pool_new. Between runs a worker spins for ~1 ms watching the run
 * counter (a decode loop calls again within that time, so waking costs nothing), then sleeps on a
 * condition variable. The caller of ed_plan_run is thread 0 and works too.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "f16.h"
#include "runtime.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define ED_PAUSE() _mm_pause()
#elif defined(__aarch64__)
#define ED_PAUSE() __asm__ __volatile__("yield")
#else
#define ED_PAUSE() ((void)0)
#endif

#define ED_SPIN_NS 1000000L /* how long an idle worker watches for the next run before sleeping */
#define ED_LINE 64

typedef struct {
    ed_pool *pool;
    int ith;
    void *scratch;
    size_t scratch_bytes;
    char pad[ED_LINE];
} ed_thread;

/* One phase of one op in the current run: its chunks, claimed and completed by any thread. */
typedef struct {
    _Alignas(ED_LINE) atomic_llong claimed;
    atomic_llong done;
    const ed_op *op; /* dereferenced only by a thread that claimed one of the n chunks */
    int64_t n;
    int phase;
    int wait; /* whether the phases before it must be complete before it starts */
} ed_step;

struct ed_pool {
    int n_threads;
    pid_t pid; /* the process that started the workers: a forked child has none of them */
    pthread_t *threads;
    ed_thread *thr;
    pthread_mutex_t run_mu; /* one plan at a time per pool */

    /* runs alternate between two step lists: a worker that lost its core may still be walking the last
     * run's list (finding nothing left to do) while the next run starts on the other */
    ed_step *steps[2];
    int n_steps[2], cap_steps[2];
    int nth_run[2]; /* threads sharing the run's chunks (1 for a single small op) */
    const ed_kernel_table *kt;
    void *shared;
    size_t shared_bytes;

    _Alignas(ED_LINE) atomic_int generation; /* runs dispatched to the workers; run g uses list g & 1 */
    _Alignas(ED_LINE) atomic_int inside[2];  /* workers walking each list */
    _Alignas(ED_LINE) atomic_int n_sleeping;
    atomic_int stop;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

/* ------------------------------------------------------------------------------- kernels, once */
static const ed_kernel_table *g_kt;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

/* EDGELLM_NATIVE_LEVEL=scalar|avx2|avx512|neon: a lower level than the CPU's best, where it runs (for
 * measuring one level against another on one machine); unknown or unavailable: the best */
static const ed_kernel_table *asked_level(void) {
    static const char *names[] = {"scalar", "avx2", "avx512", "neon"};
    const char *v = getenv("EDGELLM_NATIVE_LEVEL");
    for (int level = 0; v && level < 4; level++)
        if (!strcmp(v, names[level])) return ed_kernels(level);
    return NULL;
}

static void init_once(void) {
    ed_rt_f16_lut_init();
    g_kt = asked_level();
    if (!g_kt) g_kt = ed_kernels(ed_cpu_level());
    if (!g_kt) g_kt = ed_kernels(ED_LEVEL_SCALAR);
}

static const ed_kernel_table *kernels(void) {
    pthread_once(&g_once, init_once);
    return g_kt;
}

int ed_runtime_level(void) {
    const ed_kernel_table *kt = kernels();
    return kt ? kt->level : -1;
}

/* the level and, where the level has one, its variant: "avx2+vnni" (AVX-VNNI), "avx512+vnni",
 * "avx512+vnni+amx", "neon+dotprod" */
const char *ed_runtime_level_name(void) {
    switch (ed_runtime_level()) {
    case ED_LEVEL_SCALAR: return "scalar";
    case ED_LEVEL_AVX2: return ed_cpu_has_avxvnni() ? "avx2+vnni" : "avx2";
    case ED_LEVEL_AVX512: return ed_cpu_has_amx() ? "avx512+vnni+amx" : ed_cpu_has_avx512vnni() ? "avx512+vnni" : "avx512";
    case ED_LEVEL_NEON: return ed_cpu_has_dotprod() ? "neon+dotprod" : "neon";
    default: return "none";
    }
}

int ed_matmul_supported(int type) {
    const ed_kernel_table *kt = kernels();
    if (!kt || type < 0 || type >= ED_TYPE_COUNT || !kt->types[type].vec_dot) return 0;
    return kt->from_float[kt->types[type].vec_dot_type] != NULL;
}

int ed_get_rows_supported(int type) { return ed_dequantize_supported(type); }

int ed_repack_x16_supported(int type) {
    const ed_kernel_table *kt = kernels();
    return ed_matmul_supported(type) && kt->types[type].x16_gemm != NULL;
}

size_t ed_repack_x16_bytes(int type, int64_t rows, int64_t k) { return ed_x16_bytes(type, rows, k); }

int ed_repack_x16(int type, const void *src, size_t row_bytes, int64_t rows, int64_t k, void *dst) {
    return ed_x16_repack(type, src, row_bytes, rows, k, dst);
}

/* ------------------------------------------------------------------------------- sync helpers */
static void spin_until_at_least(atomic_llong *v, int64_t target) {
    for (unsigned spins = 0; atomic_load_explicit(v, memory_order_acquire) < target; spins++) {
        if (spins < 4096) ED_PAUSE();
        else sched_yield(); /* the thread finishing that chunk lost its core: let it run */
    }
}

void *ed_shared_scratch(ed_ctx *ctx) { return ctx->pool->shared; }

void *ed_thread_scratch(ed_ctx *ctx, size_t bytes) {
    ed_thread *t = &ctx->pool->thr[ctx->ith];
    if (t->scratch_bytes < bytes) {
        free(t->scratch);
        bytes = (bytes + 4095) & ~(size_t)4095;
        t->scratch = aligned_alloc(ED_LINE, bytes);
        t->scratch_bytes = t->scratch ? bytes : 0;
    }
    return t->scratch;
}

static long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

/* ------------------------------------------------------------------------------- the run */
/* Every thread walks the steps, claiming chunks until none are left, and waits before a step only for
 * the steps it depends on to be *complete* -- not for the other threads to arrive, as a barrier would.
 * A thread that lost its core between chunks holds nobody up: the others take the remaining chunks (and
 * it catches up by finding nothing left to claim). Like ggml's graph compute, minus the barriers. */
static void run_plan(ed_pool *pool, int ith, int b) {
    ed_ctx ctx = {.ith = ith, .nth = pool->nth_run[b], .pool = pool, .kt = pool->kt};
    ed_step *steps = pool->steps[b];
    int complete = 0; /* steps before this one known to be complete */
    for (int s = 0; s < pool->n_steps[b]; s++) {
        ed_step *st = &steps[s];
        if (st->wait)
            for (; complete < s; complete++) spin_until_at_least(&steps[complete].done, steps[complete].n);
        for (int64_t c; (c = atomic_fetch_add_explicit(&st->claimed, 1, memory_order_relaxed)) < st->n;) {
            ctx.chunk = c;
            ctx.n_chunks = st->n;
            ed_op_run(st->op, st->phase, &ctx);
            atomic_fetch_add_explicit(&st->done, 1, memory_order_release);
        }
    }
}

/* the steps (op phases) of a plan for nth threads in list b, counters zeroed (0: out of memory) */
static int prepare_steps(ed_pool *pool, int b, const ed_op *ops, int n_ops, int nth) {
    int steps = 0;
    for (int i = 0; i < n_ops; i++) steps += ed_op_phases(&ops[i]);
    if (steps > pool->cap_steps[b]) {
        free(pool->steps[b]);
        pool->steps[b] = aligned_alloc(ED_LINE, sizeof(ed_step) * (size_t)steps);
        pool->cap_steps[b] = pool->steps[b] ? steps : 0;
        if (!pool->steps[b]) return 0;
    }
    int s = 0;
    for (int i = 0; i < n_ops; i++) {
        for (int p = 0; p < ed_op_phases(&ops[i]); p++, s++) {
            ed_step *st = &pool->steps[b][s];
            atomic_store_explicit(&st->claimed, 0, memory_order_relaxed);
            atomic_store_explicit(&st->done, 0, memory_order_relaxed);
            st->op = &ops[i];
            st->phase = p;
            st->n = ed_op_chunks(&ops[i], p, nth, pool->kt);
            st->wait = s > 0 && !(p == 0 && (ops[i].flags & ED_FLAG_NO_BARRIER));
        }
    }
    pool->n_steps[b] = steps;
    pool->nth_run[b] = nth;
    return 1;
}

static void *worker_main(void *arg) {
    ed_thread *t = arg;
    ed_pool *pool = t->pool;
    int seen = 0;
    for (;;) {
        long t0 = now_ns();
        for (unsigned spins = 1; atomic_load_explicit(&pool->generation, memory_order_acquire) == seen; spins++) {
            ED_PAUSE();
            if ((spins & 255) == 0 && now_ns() - t0 > ED_SPIN_NS) {
                pthread_mutex_lock(&pool->mu);
                atomic_fetch_add(&pool->n_sleeping, 1);
                while (atomic_load(&pool->generation) == seen) pthread_cond_wait(&pool->cv, &pool->mu);
                atomic_fetch_sub(&pool->n_sleeping, 1);
                pthread_mutex_unlock(&pool->mu);
                break;
            }
        }
        const int g = seen = atomic_load(&pool->generation);
        if (atomic_load(&pool->stop)) return NULL;
        /* announce ourselves on the run's list, then make sure the run is still the latest: if not, the
         * main thread may be rewriting that list (it waits for inside == 0 only before it starts) */
        atomic_fetch_add(&pool->inside[g & 1], 1);
        if (atomic_load(&pool->generation) == g) run_plan(pool, t->ith, g & 1);
        atomic_fetch_sub(&pool->inside[g & 1], 1);
    }
}

/* start run g on the workers (seq_cst: a worker going to sleep either sees it or is seen asleep) */
static void wake_workers(ed_pool *pool, int g) {
    atomic_store(&pool->generation, g);
    if (atomic_load(&pool->n_sleeping) > 0) {
        pthread_mutex_lock(&pool->mu);
        pthread_cond_broadcast(&pool->cv);
        pthread_mutex_unlock(&pool->mu);
    }
}

ed_pool *ed_pool_new(int n_threads) {
    if (!kernels()) return NULL;
    if (n_threads < 1) n_threads = 1;
    ed_pool *pool = aligned_alloc(ED_LINE, (sizeof(ed_pool) + ED_LINE - 1) / ED_LINE * ED_LINE);
    if (!pool) return NULL;
    memset(pool, 0, sizeof *pool);
    pool->n_threads = n_threads;
    pool->pid = getpid();
    pool->kt = kernels();
    pool->thr = calloc(n_threads, sizeof(ed_thread));
    pool->threads = calloc(n_threads, sizeof(pthread_t));
    pthread_mutex_init(&pool->run_mu, NULL);
    pthread_mutex_init(&pool->mu, NULL);
    pthread_cond_init(&pool->cv, NULL);
    for (int i = 0; i < n_threads; i++) pool->thr[i] = (ed_thread){.pool = pool, .ith = i};
    for (int i = 1; i < n_threads; i++) {
        if (pthread_create(&pool->threads[i], NULL, worker_main, &pool->thr[i]) != 0) {
            pool->n_threads = i; /* run with the threads we got */
            break;
        }
    }
    return pool;
}

void ed_pool_free(ed_pool *pool) {
    if (!pool) return;
    atomic_store(&pool->stop, 1);
    wake_workers(pool, atomic_load(&pool->generation) + 1);
    for (int i = 1; i < pool->n_threads; i++) pthread_join(pool->threads[i], NULL);
    for (int i = 0; i < pool->n_threads; i++) free(pool->thr[i].scratch);
    free(pool->shared);
    free(pool->steps[0]);
    free(pool->steps[1]);
    free(pool->thr);
    free(pool->threads);
    pthread_mutex_destroy(&pool->run_mu);
    pthread_mutex_destroy(&pool->mu);
    pthread_cond_destroy(&pool->cv);
    free(pool);
}

int ed_pool_threads(const ed_pool *pool) { return pool->n_threads; }

/* Work of an op that is not worth spreading over threads (multiply-adds, or elements touched). */
static int small(const ed_op *op) {
    const int64_t limit = 1 << 17;
    switch (op->code) {
    case ED_OP_MATMUL: return op->n * op->m * op->k < limit;
    case ED_OP_ATTENTION: {
        int64_t keys = 0; /* positions attended over, all rows */
        for (int64_t r = 0; r < op->n && keys < limit; r++) keys += ((const int64_t *)op->src7)[r] + 1;
        return keys * op->m * op->k < limit;
    }
    case ED_OP_ROPE: return op->n * op->m * op->k < limit;
    default: return op->n * op->k < limit;
    }
}

int64_t ed_op_chunk_count(const ed_op *op, int phase, int n_threads) {
    const ed_kernel_table *kt = kernels();
    if (!kt || !ed_op_valid(op, kt) || phase < 0 || phase >= ed_op_phases(op)) return -1;
    return ed_op_chunks(op, phase, n_threads < 1 ? 1 : n_threads, kt);
}

int ed_plan_run(ed_pool *pool, const ed_op *ops, int n_ops) {
    const ed_kernel_table *kt = pool->kt;
    for (int i = 0; i < n_ops; i++)
        if (!ed_op_valid(&ops[i], kt)) return -1;
    if (n_ops == 0) return 0;
    pthread_mutex_lock(&pool->run_mu);
    if (pool->pid != getpid()) { /* forked: the workers stayed in the parent; run alone from now on */
        pool->n_threads = 1;
        pool->pid = getpid();
    }
    /* one small op (eager mode) runs on the caller alone: waking the workers costs more than it saves */
    const int nth = n_ops == 1 && small(ops) ? 1 : pool->n_threads;
    size_t shared = 0;
    for (int i = 0; i < n_ops; i++) {
        const size_t s = ed_op_shared_scratch(&ops[i], nth, kt);
        shared = s > shared ? s : shared;
    }
    int rc = 0;
    if (shared > pool->shared_bytes) {
        free(pool->shared);
        shared = (shared + 4095) & ~(size_t)4095;
        pool->shared = aligned_alloc(ED_LINE, shared);
        pool->shared_bytes = pool->shared ? shared : 0;
        if (!pool->shared) rc = -2;
    }
    const int g = atomic_load(&pool->generation) + 1, b = g & 1;
    /* a worker that lost its core two runs ago may still be walking list b (finding nothing to do) */
    for (unsigned spins = 0; atomic_load(&pool->inside[b]) > 0; spins++) {
        if (spins < 4096) ED_PAUSE();
        else sched_yield();
    }
    if (rc == 0 && !prepare_steps(pool, b, ops, n_ops, nth)) rc = -2;
    if (rc == 0) {
        if (nth > 1) wake_workers(pool, g);
        run_plan(pool, 0, b);
        ed_step *steps = pool->steps[b];
        for (int s = 0; s < pool->n_steps[b]; s++) spin_until_at_least(&steps[s].done, steps[s].n);
    }
    pthread_mutex_unlock(&pool->run_mu);
    return rc;
}
