/* Standalone check of attention's inner loops (native/runtime/attention.c): for every level this CPU runs
 * (x86: AVX + F16C, AVX-512VL; aarch64: NEON), each loop must give the portable C loops' bits exactly on
 * random f16 keys and values: qk and pv for groups of 1..9, 12, 17 and 20 heads (past the values' 8-head
 * chunks and their even shares) and head sizes with and without a tail
 * past a multiple of 8, scores and values over keys at scattered slots (values also over column ranges
 * and key counts past its key blocks), the same two over q8_0 blocks (q8_scores_all, q8_values_all; at
 * the AVX-512 level with and without VNNI; at the AVX2 level fused and not, as AMD and Intel take them), and
 * the f16 rounding. Built and run by
 * tests/test_native_kernels_cross.py, for this machine and for aarch64 under qemu. Exit status 0 iff every
 * check passes.
 */
#include "../runtime/attention.c"

#include <stdio.h>
#include <stdlib.h>

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint32_t next_u32(void) { /* xorshift64* */
    rng_state ^= rng_state >> 12, rng_state ^= rng_state << 25, rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545F4914F6CDD1Dull) >> 32);
}

static float uniform(float lo, float hi) { return lo + (hi - lo) * (float)(next_u32() >> 8) / 16777216.0f; }

static void fill(float *x, int64_t n, float scale) {
    for (int64_t i = 0; i < n; i++) x[i] = uniform(-scale, scale);
}

/* f16 values as float, as the callers give the f16 loops their q and weights (rounded to f16): mostly
 * uniform in [-scale, scale], every fifth any finite f16 (subnormals to 65504), to reach the ends of the
 * products the loops fuse on the promise that they are exact */
static void fill_f16_valued(float *x, int64_t n, float scale) {
    for (int64_t i = 0; i < n; i++) {
        uint16_t h = (uint16_t)next_u32();
        if ((h & 0x7C00) == 0x7C00) h &= 0xBBFF; /* inf / NaN -> a finite value */
        x[i] = i % 5 == 4 ? ed_f16_to_f32(h) : ed_f16_round(uniform(-scale, scale));
    }
}

static void fill_f16(uint16_t *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = ed_f32_to_f16(uniform(-4.0f, 4.0f));
}

static int same(const char *what, const char *level, const float *a, const float *b, int64_t n, int64_t shape) {
    if (!memcmp(a, b, sizeof(float) * (size_t)n)) return 0;
    for (int64_t i = 0; i < n; i++)
        if (memcmp(a + i, b + i, sizeof(float))) {
            printf("FAIL %-7s %s (%lld): element %lld gives %.9g, portable C %.9g\n", level, what, (long long)shape,
                   (long long)i, a[i], b[i]);
            break;
        }
    return 1;
}

#define MAX_GROUP 20
#define MAX_DH 264
#define CACHE_ROWS 96 /* slots of the key and value caches */
#define HKV 2         /* kv heads a cache row holds: the loops read head 1 */

/* random q8_0 blocks; with `extreme`, some -128s (which a cache of another writer could hold; q's own blocks
 * come from the Q8_0 quantizer, -127..127) */
static void fill_q8(kv_q8 *b, int64_t n, int extreme) {
    for (int64_t i = 0; i < n; i++) {
        b[i].d = ed_f32_to_f16(uniform(0.001f, 0.05f));
        for (int e = 0; e < 32; e++) b[i].qs[e] = (int8_t)(next_u32() % 255 - 127);
        if (extreme && i % 5 == 0) b[i].qs[i % 32] = -128;
    }
}

/* q8_scores_all and q8_values_all against the portable loops: head sizes of 1..17 blocks (past the
 * transposed scores' stack), groups past their 8-head chunks, key counts around their 16-key steps,
 * values over a cache row's later blocks (a column range) */
static int check_q8(const attn_loops *L, const char *level, int *checks) {
    enum { MAXNB = 17, ROWS = 40, GROUPS = 20, KEYS = 70 };
    static kv_q8 cache[ROWS * HKV * MAXNB], q[GROUPS * MAXNB];
    static float sc1[GROUPS * KEYS], sc2[GROUPS * KEYS], w[GROUPS * KEYS];
    static float out1[GROUPS * MAXNB * 32], out2[GROUPS * MAXNB * 32];
    static int64_t slots[KEYS];
    const int64_t nbs[] = {1, 2, 4, 8, 16, 17}, groups[] = {1, 3, 6, 8, 9, 20}, ts[] = {1, 15, 16, 17, 70};
    int fails = 0;
    fill_q8(cache, ROWS * HKV * MAXNB, 1);
    for (size_t i = 0; i < sizeof nbs / sizeof nbs[0]; i++) {
        const int64_t nb = nbs[i], stride = HKV * nb * (int64_t)sizeof(kv_q8), dh = nb * 32;
        const char *base = (const char *)cache + nb * (int64_t)sizeof(kv_q8); /* head 1 of each row */
        for (size_t g = 0; g < sizeof groups / sizeof groups[0]; g++) {
            const int64_t group = groups[g];
            fill_q8(q, group * nb, 0);
            for (size_t k = 0; k < sizeof ts / sizeof ts[0]; k++) {
                const int64_t t = ts[k];
                for (int64_t j = 0; j < KEYS; j++) slots[j] = next_u32() % ROWS; /* past t: prefetched only */
                memset(sc1, 0, sizeof sc1), memset(sc2, 0, sizeof sc2);
                L->q8_scores_all(q, group, nb, base, stride, slots, t, sc1, KEYS);
                loops_c.q8_scores_all(q, group, nb, base, stride, slots, t, sc2, KEYS);
                fails += same("q8 scores", level, sc1, sc2, group * KEYS, nb * 1000 + t), (*checks)++;
                fill(w, group * KEYS, 1.0f);
                for (int64_t b0 = 0; b0 < nb; b0 += nb > 1 ? nb - 1 : 1) { /* whole rows, then the last block */
                    fill(out1, group * dh, 2.0f);
                    memcpy(out2, out1, sizeof(float) * (size_t)(group * dh));
                    const char *cols = base + b0 * (int64_t)sizeof(kv_q8);
                    const int64_t t_pf = b0 ? KEYS : t;
                    L->q8_values_all(out1 + b0 * 32, dh, w, KEYS, group, nb - b0, cols, stride, slots, t, t_pf);
                    loops_c.q8_values_all(out2 + b0 * 32, dh, w, KEYS, group, nb - b0, cols, stride, slots, t, t_pf);
                    fails += same("q8 values", level, out1, out2, group * dh, nb * 1000 + t), (*checks)++;
                }
            }
        }
    }
    return fails;
}

static int check_level(const attn_loops *L, const char *level) {
    static float q[MAX_GROUP * MAX_DH], row[MAX_DH], s1[MAX_GROUP], s2[MAX_GROUP];
    static float out1[MAX_GROUP * MAX_DH], out2[MAX_GROUP * MAX_DH], w[MAX_GROUP * 80];
    static float sc1[MAX_GROUP * 80], sc2[MAX_GROUP * 80], wv[MAX_GROUP * 80];
    static uint16_t cache[CACHE_ROWS * HKV * MAX_DH];
    static int64_t slots[80];
    const int64_t dhs[] = {20, 40, 64, 72, 128, 256, 264};
    int fails = 0, checks = 0;
    fill_f16(cache, CACHE_ROWS * HKV * MAX_DH);
    for (size_t i = 0; i < sizeof dhs / sizeof dhs[0]; i++) {
        const int64_t dh = dhs[i], stride = HKV * dh;
        const uint16_t *kv = cache + dh; /* head 1 of each row */
        const int64_t groups[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 17, MAX_GROUP};
        for (size_t g = 0; g < sizeof groups / sizeof groups[0]; g++) {
            const int64_t group = groups[g];
            fill_f16_valued(q, group * dh, 1.0f);
            fill_f16_valued(w, group * 80, 1.0f);
            L->qk(q, group, dh, kv, row, s1);
            loops_c.qk(q, group, dh, kv, row, s2);
            fails += same("qk", level, s1, s2, group, dh), checks++;
            fill(out1, group * dh, 2.0f);
            memcpy(out2, out1, sizeof(float) * (size_t)(group * dh));
            L->pv(out1, w, 3, group, dh, kv, row);
            loops_c.pv(out2, w, 3, group, dh, kv, row);
            fails += same("pv", level, out1, out2, group * dh, dh), checks++;
            if (dh % 8) continue; /* scores and values take whole vectors of 8 */
            const int64_t ts[] = {1, 5, 33, 70};
            for (size_t k = 0; k < sizeof ts / sizeof ts[0]; k++) {
                const int64_t t = ts[k];
                for (int64_t j = 0; j < 80; j++) slots[j] = next_u32() % CACHE_ROWS; /* past t: prefetched only */
                L->scores(q, group, dh, kv, stride, slots, t, row, sc1, t);
                loops_c.scores(q, group, dh, kv, stride, slots, t, row, sc2, t);
                fails += same("scores", level, sc1, sc2, group * t, dh * 1000 + t), checks++;
                memcpy(wv, sc1, sizeof(float) * (size_t)(group * t)); /* weights: f16 values, as softmax leaves them */
                loops_c.round_f16(wv, group * t);
                const int64_t ranges[][2] = {{0, dh}, {8, dh}, {0, dh - 8}, {dh / 2 / 8 * 8, dh}};
                for (int r = 0; r < 4; r++) {
                    const int64_t t_pf = r % 2 ? 80 : t;
                    fill(out1, group * dh, 2.0f);
                    memcpy(out2, out1, sizeof(float) * (size_t)(group * dh));
                    L->values(out1, wv, t, group, dh, ranges[r][0], ranges[r][1], kv, stride, slots, t, t_pf);
                    loops_c.values(out2, wv, t, group, dh, ranges[r][0], ranges[r][1], kv, stride, slots, t, t_pf);
                    fails += same("values", level, out1, out2, group * dh, dh * 1000 + t), checks++;
                }
            }
        }
    }
    /* f16 rounding: ordinary values, ties, the subnormal range, past the largest f16 */
    static float x1[4099], x2[4099];
    for (int i = 0; i < 4099; i++) {
        const float scales[] = {1.0f, 1e-6f, 1e-8f, 7e4f};
        x1[i] = uniform(-1.0f, 1.0f) * scales[i % 4];
        if (i % 7 == 0) x1[i] = ed_f16_to_f32((uint16_t)next_u32()) + ed_f16_to_f32(0x0001) * 0.5f; /* near ties */
        if (x1[i] != x1[i]) x1[i] = 0.0f; /* no NaN: only its payload could differ */
    }
    memcpy(x2, x1, sizeof x1);
    L->round_f16(x1, 4099);
    loops_c.round_f16(x2, 4099);
    fails += same("round_f16", level, x1, x2, 4099, 4099), checks++;
    fails += check_q8(L, level, &checks);
    printf("%s attention loops: %d checks, %d failed\n", level, checks, fails);
    return fails;
}

int main(void) {
    ed_rt_f16_lut_init();
    static const char *names[] = {"scalar", "avx2", "avx512", "neon"};
    int fails = 0, levels = 0;
    for (int level = 1; level < 4; level++) {
        const ed_kernel_table *kt = ed_kernels(level);
        if (!kt || loops(kt) == &loops_c) continue; /* a level this CPU lacks, or one with the portable loops */
        fails += check_level(loops(kt), names[level]);
        levels++;
#if defined(__x86_64__) && defined(__GNUC__)
        if (loops(kt) == &loops_avx512_vnni) { /* and the AVX-512 CPUs without VNNI */
            fails += check_level(&loops_avx512, "avx512 without vnni");
            levels++;
        }
        if (level == ED_LEVEL_AVX2) { /* the other AVX2 loops (fused on AMD, not on Intel) */
            const int fused = loops(kt) == &loops_avx_fma;
            fails += check_level(fused ? &loops_avx : &loops_avx_fma, fused ? "avx2 unfused" : "avx2 fused");
            levels++;
        }
#endif
    }
    printf("%s: %d levels with their own loops checked\n", fails ? "FAILED" : "OK", levels);
    return fails != 0;
}
