/* Standalone check of attention's inner loops (native/runtime/attention.c): for every level this CPU runs
 * (x86: AVX + F16C, AVX-512VL; aarch64: NEON), each loop must give the portable C loops' bits exactly on
 * random f16 keys and values: qk and pv for groups of 1..7 heads and head sizes with and without a tail
 * past a multiple of 8, scores and values over keys at scattered slots (values also over column ranges
 * and key counts past its key blocks), and the f16 rounding. Built and run by
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

#define MAX_GROUP 7
#define MAX_DH 264
#define CACHE_ROWS 96 /* slots of the key and value caches */
#define HKV 2         /* kv heads a cache row holds: the loops read head 1 */

static int check_level(const attn_loops *L, const char *level) {
    static float q[MAX_GROUP * MAX_DH], row[MAX_DH], s1[MAX_GROUP], s2[MAX_GROUP];
    static float out1[MAX_GROUP * MAX_DH], out2[MAX_GROUP * MAX_DH], w[MAX_GROUP * 80];
    static float sc1[MAX_GROUP * 80], sc2[MAX_GROUP * 80];
    static uint16_t cache[CACHE_ROWS * HKV * MAX_DH];
    static int64_t slots[80];
    const int64_t dhs[] = {20, 40, 64, 72, 128, 256, 264};
    int fails = 0, checks = 0;
    fill_f16(cache, CACHE_ROWS * HKV * MAX_DH);
    for (size_t i = 0; i < sizeof dhs / sizeof dhs[0]; i++) {
        const int64_t dh = dhs[i], stride = HKV * dh;
        const uint16_t *kv = cache + dh; /* head 1 of each row */
        for (int64_t group = 1; group <= MAX_GROUP; group++) {
            fill(q, group * dh, 1.0f);
            fill(w, group * 80, 1.0f);
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
                for (int64_t j = 0; j < t; j++) slots[j] = next_u32() % CACHE_ROWS;
                L->scores(q, group, dh, kv, stride, slots, t, row, sc1, t);
                loops_c.scores(q, group, dh, kv, stride, slots, t, row, sc2, t);
                fails += same("scores", level, sc1, sc2, group * t, dh * 1000 + t), checks++;
                const int64_t ranges[][2] = {{0, dh}, {8, dh}, {0, dh - 8}, {dh / 2 / 8 * 8, dh}};
                for (int r = 0; r < 4; r++) {
                    fill(out1, group * dh, 2.0f);
                    memcpy(out2, out1, sizeof(float) * (size_t)(group * dh));
                    L->values(out1, sc1, t, group, dh, ranges[r][0], ranges[r][1], kv, stride, slots, t);
                    loops_c.values(out2, sc1, t, group, dh, ranges[r][0], ranges[r][1], kv, stride, slots, t);
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
    }
    printf("%s: %d levels with their own loops checked\n", fails ? "FAILED" : "OK", levels);
    return fails != 0;
}
