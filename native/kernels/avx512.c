/* AVX-512 (F, BW, VL) kernels, with VNNI variants of the legacy-block dots (avx512_body.h) and the
 * K-quant dots (avx512_kquants.h); target pragmas let a build without -march carry them. The activation
 * quantizers are the AVX2 ones (bit-identical across levels).
 *
 * ggml-org/llama.cpp ggml/src/ggml-cpu/arch/x86/quants.c has no 512-bit vec_dot for these types: an
 * AVX-512 build of ggml runs its AVX2 code with _mm256_dpbusd_epi32 in mul_sum_us8_pairs_float. Here
 * the legacy dots put two blocks in one 512-bit vector, and the K-quant dots take 64 quants per
 * vpmaddubsw, with the sub-block scales spread by vpermw; the arithmetic per block and per K-quant
 * sub-block is ggml's AVX2 one (vec_dot_q4_K_q8_K ...), so results agree to float summation order.
 *
 * Built with -DED_EMULATE_AVX512 (tests only), the same code compiles against SIMDe's portable
 * intrinsics (native/tests/avx512_emu.h) so a machine without AVX-512 can run and check it.
 */
#include "ed_blocks.h"

#include <math.h>

#if defined(__x86_64__) || defined(_M_X64)

#if defined(ED_EMULATE_AVX512)
#include "../tests/avx512_emu.h"
#define ED_TARGET_PUSH(t)
#define ED_TARGET_POP
#else
#include <immintrin.h>
#if defined(__clang__)
#define ED_PRAGMA(x) _Pragma(#x)
#define ED_TARGET_PUSH(t) ED_PRAGMA(clang attribute push(__attribute__((target(t))), apply_to = function))
#define ED_TARGET_POP _Pragma("clang attribute pop")
#else
#define ED_PRAGMA(x) _Pragma(#x)
#define ED_TARGET_PUSH(t) _Pragma("GCC push_options") ED_PRAGMA(GCC target(t))
#define ED_TARGET_POP _Pragma("GCC pop_options")
#endif
#endif

ED_TARGET_PUSH("avx2,fma,f16c,avx512f,avx512bw,avx512vl")

/* ------------------------------------------------------------------------------------- helpers */

static inline float hsum_f32x8(__m256 x) {
    __m128 r = _mm_add_ps(_mm256_extractf128_ps(x, 1), _mm256_castps256_ps128(x));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

static inline __m256 lo256(__m512 v) { return _mm512_castps512_ps256(v); }
static inline __m256 hi256(__m512 v) { return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)); }
static inline float hsum_f32x16(__m512 v) { return hsum_f32x8(_mm256_add_ps(lo256(v), hi256(v))); }

static inline int32_t hsum_i32x8(__m256i v) {
    __m128i r = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    r = _mm_add_epi32(r, _mm_unpackhi_epi64(r, r));
    return _mm_cvtsi128_si32(_mm_add_epi32(r, _mm_shuffle_epi32(r, 1)));
}

static inline __m256i add_halves_i32(__m512i v) {
    return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
}

static inline __m512i join256(__m256i lo, __m256i hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

/* two blocks' 16 nibble bytes -> 64 bytes 0..15: block 0 low nibbles, high nibbles, block 1 likewise */
static inline __m512i nibbles64(const uint8_t *q0, const uint8_t *q1) {
    const __m512i t = join256(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)q0)),
                              _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)q1)));
    return _mm512_and_si512(_mm512_srlv_epi64(t, _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0)), _mm512_set1_epi8(0x0F));
}

static inline __m512i qs64(const int8_t *q0, const int8_t *q1) {
    return join256(_mm256_loadu_si256((const __m256i *)q0), _mm256_loadu_si256((const __m256i *)q1));
}

/* + 16 where bit j of the block's qh is set: byte j of each 32-byte half is element j */
static inline __m512i with_fifth_bit(__m512i q, const uint8_t *qh0, const uint8_t *qh1) {
    uint32_t h0, h1;
    memcpy(&h0, qh0, 4);
    memcpy(&h1, qh1, 4);
    const __mmask64 k = (__mmask64)h0 | ((__mmask64)h1 << 32);
    return _mm512_mask_add_epi8(q, k, q, _mm512_set1_epi8(16));
}

/* [f16 at p0 x 8, f16 at p1 x 8] as floats: the scales of two blocks (d leads every block) */
static inline __m512 f16_pair(const void *p0, const void *p1) {
    const __m128i h0 = _mm_set1_epi16((short)ed_load_u16(p0)), h1 = _mm_set1_epi16((short)ed_load_u16(p1));
    return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(h0), h1, 1));
}

/* the f16 pair at p as floats in lanes 0, 1 */
static inline __m128 f16x2(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm_cvtph_ps(_mm_cvtsi32_si128(v));
}

/* [dx0*dy0, m0*s0, dx1*dy1, m1*s1] from the (d, m) and (d, s) heads of Q4_1/Q5_1 and Q8_1 blocks */
static inline __m128 heads_dm(const void *x0, const void *x1, const void *y0, const void *y1) {
    return _mm_movelh_ps(_mm_mul_ps(f16x2(x0), f16x2(y0)), _mm_mul_ps(f16x2(x1), f16x2(y1)));
}

/* lanes 1 + 3 of the heads' running sum: Σ m*s */
static inline float ms_lanes13(__m128 ms) {
    return _mm_cvtss_f32(_mm_add_ss(_mm_shuffle_ps(ms, ms, 1), _mm_shuffle_ps(ms, ms, 3)));
}

/* lanes 0 and 2 of h spread to [h0 x 8, h2 x 8] */
static inline __m512 pair_scales(__m128 h) {
    const __m512i idx = _mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0);
    return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(h));
}

/* 16-bit lane indices [a x 8, b x 8, c x 8, d x 8] for vpermw */
static inline __m512i idx16(short a, short b, short c, short d) {
    return join256(_mm256_set_m128i(_mm_set1_epi16(b), _mm_set1_epi16(a)),
                   _mm256_set_m128i(_mm_set1_epi16(d), _mm_set1_epi16(c)));
}

#define ED_ALWAYS_INLINE static inline __attribute__((always_inline))

/* The table's entries from a kernel FN(n, s, bs, x, y, by, nc) for one weight row x nc activation rows
 * (nc a constant, so its per-row accumulators stay in registers): vec_dot is its nc = 1 instance and
 * vec_dot_nx takes the rows in groups of G (4, or 8 where the registers hold 8 rows' sums), then 4, 3,
 * 2 or 1, so both give the same bits per row. */
#define ED_NX_ENTRIES(FN, DOT, DOT_NX, G)                                                                 \
    static void DOT(int n, float *s, const void *vx, const void *vy) { FN(n, s, 0, vx, vy, 0, 1); }      \
    static void DOT_NX(int n, float *s, size_t bs, const void *vx, const void *vy, size_t by, int nc) {  \
        const uint8_t *y = vy;                                                                          \
        for (; nc >= G; nc -= G, s += G * bs, y += G * by) FN(n, s, bs, vx, y, by, G);                  \
        if (G > 4 && nc >= 4) FN(n, s, bs, vx, y, by, 4), nc -= 4, s += 4 * bs, y += 4 * by;            \
        if (nc == 3) FN(n, s, bs, vx, y, by, 3);                                                        \
        else if (nc == 2) FN(n, s, bs, vx, y, by, 2);                                                   \
        else if (nc == 1) FN(n, s, bs, vx, y, by, 1);                                                   \
    }

/* The same from a kernel FN(n, s, bs, x, bx, y, by, nr, nc) for nr (1 or 2) weight rows x nc activation
 * rows (FN1: its nr = 1 instance), and vec_dot_2nx: its nr = 2 instances */
#define ED_MN_ENTRIES(FN, FN1, DOT, DOT_NX, DOT_2NX)                                                     \
    ED_ALWAYS_INLINE void FN1(int n, float *s, size_t bs, const void *vx, const uint8_t *vy, size_t by, \
                                   const int nc) {                                                      \
        FN(n, s, bs, vx, 0, vy, by, 1, nc);                                                             \
    }                                                                                                   \
    ED_NX_ENTRIES(FN1, DOT, DOT_NX, 4)                                                                \
    static void DOT_2NX(int n, float *s, size_t bs, const void *vx, size_t bx, const void *vy, size_t by, \
                        int nc) {                                                                       \
        const uint8_t *y = vy;                                                                          \
        for (; nc >= 4; nc -= 4, s += 4 * bs, y += 4 * by) FN(n, s, bs, vx, bx, y, by, 2, 4);           \
        if (nc == 3) FN(n, s, bs, vx, bx, y, by, 2, 3);                                                 \
        else if (nc == 2) FN(n, s, bs, vx, bx, y, by, 2, 2);                                            \
        else if (nc == 1) FN(n, s, bs, vx, bx, y, by, 2, 1);                                            \
    }

/* ------------------------------------------------------------ legacy blocks: AVX-512 BW variant */

#define ED_VNNI 0
#include "avx512_body.h"
#include "avx512_kquants.h"
#undef ED_VNNI


/* ---------------------------------------------------------- float types: 2 x 16 f32 lanes, FMA */

/* v stays in a register: loaded once for both weight rows (GCC otherwise folds the load into each FMA,
 * two loads where one does) */
#if defined(ED_EMULATE_AVX512)
#define ED_IN_REGISTER(v) (void)(v)
#else
#define ED_IN_REGISTER(v) __asm__("" : "+v"(v))
#endif

/* hsum_f32x16 of up to 16 vectors at once: the same tree (lane i plus lane i + 8, then + 4, + 2, + 1), with
 * several vectors' partial sums side by side in one register, so the same bits; hsum_f32x16(v[o]) lands in
 * lane 4 * (o % 4) + o / 4 */
static inline __m512 hsum16_f32x16(const __m512 v[16]) {
    __m512 e[8], f[4], g[2];
    for (int p = 0; p < 8; p++) /* [e of v[2p] | e of v[2p + 1]], e[i] = v[i] + v[i + 8] */
        e[p] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * p], v[2 * p + 1], 0x44),
                             _mm512_shuffle_f32x4(v[2 * p], v[2 * p + 1], 0xEE));
    for (int q = 0; q < 4; q++) /* quarter k: f of v[4q + k], f[i] = e[i] + e[i + 4] */
        f[q] = _mm512_add_ps(_mm512_shuffle_f32x4(e[2 * q], e[2 * q + 1], 0x88),
                             _mm512_shuffle_f32x4(e[2 * q], e[2 * q + 1], 0xDD));
    for (int r = 0; r < 2; r++) /* quarter j: g of v[8r + j], then of v[8r + 4 + j], g[i] = f[i] + f[i + 2] */
        g[r] = _mm512_add_ps(_mm512_shuffle_ps(f[2 * r], f[2 * r + 1], 0x44),
                             _mm512_shuffle_ps(f[2 * r], f[2 * r + 1], 0xEE));
    return _mm512_add_ps(_mm512_shuffle_ps(g[0], g[1], 0x88), _mm512_shuffle_ps(g[0], g[1], 0xDD));
}

/* nr (1 or 2) weight rows (vx + r * bx) against nc (<= NC <= 8) activation rows (vy + c * by bytes, of type
 * YT): each weight vector converted once for every activation row, each activation vector loaded once for
 * both weight rows (a 2 x NC register tile, one 16-element half of a step at a time so that nothing spills).
 * Every output is computed by the operations of the nr = nc = 1 instance, which is vec_dot: two
 * accumulators over 32-element steps (the second for elements 16..31 of each step), a last 16-element step
 * into the first, their sum's hsum (hsum16_f32x16 sums the tile's outputs together by the same tree), then
 * the scalar tail. */
#define FLOAT_TILE512(fn, T, LOAD, CONV, YT, YLOAD, YCONV, NC)                                              \
    ED_ALWAYS_INLINE void fn(int n, float *s, size_t bs, const uint8_t *vx, size_t bx, const uint8_t *vy,     \
                             size_t by, const int nr, const int nc) {                                       \
        __m512 a[2][2][NC];                                                                                 \
        for (int h = 0; h < 2; h++)                                                                         \
            for (int r = 0; r < nr; r++)                                                                    \
                for (int c = 0; c < nc; c++) a[h][r][c] = _mm512_setzero_ps();                              \
        int i = 0;                                                                                          \
        for (; i + 32 <= n; i += 32)                                                                        \
            for (int h = 0; h < 2; h++) {                                                                   \
                __m512 w[2];                                                                                \
                for (int r = 0; r < nr; r++) w[r] = LOAD((const T *)(vx + r * bx) + i + 16 * h);            \
                for (int c = 0; c < nc; c++) {                                                              \
                    __m512 y = YLOAD((const YT *)(vy + c * by) + i + 16 * h);                               \
                    ED_IN_REGISTER(y);                                                                      \
                    for (int r = 0; r < nr; r++) a[h][r][c] = _mm512_fmadd_ps(w[r], y, a[h][r][c]);         \
                }                                                                                           \
            }                                                                                               \
        for (; i + 16 <= n; i += 16) {                                                                      \
            __m512 w[2];                                                                                    \
            for (int r = 0; r < nr; r++) w[r] = LOAD((const T *)(vx + r * bx) + i);                         \
            for (int c = 0; c < nc; c++) {                                                                  \
                const __m512 y = YLOAD((const YT *)(vy + c * by) + i);                                      \
                for (int r = 0; r < nr; r++) a[0][r][c] = _mm512_fmadd_ps(w[r], y, a[0][r][c]);             \
            }                                                                                               \
        }                                                                                                   \
        __m512 v[16];                                                                                       \
        for (int o = 0; o < 16; o++)                                                                        \
            v[o] = o % 2 < nr && o / 2 < nc ? _mm512_add_ps(a[0][o % 2][o / 2], a[1][o % 2][o / 2])          \
                                            : _mm512_setzero_ps();                                          \
        float sums[16];                                                                                     \
        _mm512_storeu_ps(sums, hsum16_f32x16(v));                                                           \
        for (int r = 0; r < nr; r++)                                                                        \
            for (int c = 0; c < nc; c++) {                                                                  \
                const T *x = (const T *)(vx + r * bx);                                                      \
                const YT *y = (const YT *)(vy + c * by);                                                    \
                const int o = 2 * c + r;                                                                    \
                float sumf = sums[4 * (o % 4) + o / 4];                                                     \
                for (int j = i; j < n; j++) sumf += CONV(x[j]) * YCONV(y[j]);                               \
                s[c * bs + r] = sumf;                                                                       \
            }                                                                                               \
    }

/* vec_dot, vec_dot_nx and vec_dot_2nx: both sides converted, a 2 x 4 tile (the F16/BF16 conversions
 * dominated one product at a time) */
#define FLOAT_MN512(name, T, LOAD, CONV)                                                                   \
    FLOAT_TILE512(name##_mn, T, LOAD, CONV, T, LOAD, CONV, 4)                                               \
    ED_MN_ENTRIES(name##_mn, name##_1n, vec_dot_##name, vec_dot_nx_##name, vec_dot_2nx_##name)

#define LOAD_F32(p) _mm512_loadu_ps(p)
#define LOAD_F16(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
#define LOAD_BF16(p) \
    _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p))), 16))
#define IDENT(v) (v)
#define F16(h) ed_f16_table[h]

FLOAT_MN512(f32, float, LOAD_F32, IDENT)
FLOAT_MN512(f16, uint16_t, LOAD_F16, F16)
FLOAT_MN512(bf16, uint16_t, LOAD_BF16, ed_bf16_to_f32)

/* Prompts over F16 / BF16 weights (ed_float_gemm_fn): the activations come as float32 rows holding their
 * f16 / bf16 values (exact), so only the weights are converted. vec_dot's two accumulators per output
 * are independent chains (elements 16h..16h+15 of every 32-element step, the last 16-element step in the
 * first), so a tile runs them one after the other, a pass each: one register per output lets a tile hold
 * 3 weight rows x 8 activation rows, 3 conversions and 8 loads per 24 FMAs. Each accumulator sees the
 * same FMAs in the same order as in vec_dot, then a0 + a1 and hsum_f32x16's tree (hsum16_f32x16): its
 * bits. */
#define GEMM_NR 3 /* weight rows of a tile */
#define GEMM_NC 8 /* activation rows of a tile (8 rows of k floats stay in L1 while weight rows pass) */
#define FLOAT_GEMM512(name, T, LOAD, CONV)                                                                 \
    ED_ALWAYS_INLINE void name##_gemm_tile(int n, float *s, size_t bs, const uint8_t *vx, size_t bx,         \
                                           const float *y, size_t ly, const int nr, const int nc) {         \
        const int n32 = n & ~31, n16 = n & ~15; /* n16 - n32: the last 16-element step, if any */          \
        __m512 part[GEMM_NR][GEMM_NC];                                                                      \
        for (int h = 0; h < 2; h++) {                                                                       \
            __m512 a[GEMM_NR][GEMM_NC];                                                                     \
            for (int r = 0; r < nr; r++)                                                                    \
                for (int c = 0; c < nc; c++) a[r][c] = _mm512_setzero_ps();                                 \
            for (int i = 16 * h; i < (h ? n32 : n16); i += 32) {                                            \
                __m512 w[GEMM_NR];                                                                          \
                for (int r = 0; r < nr; r++) w[r] = LOAD((const T *)(vx + r * bx) + i);                     \
                for (int c = 0; c < nc; c++) {                                                              \
                    __m512 v = _mm512_loadu_ps(y + c * ly + i);                                             \
                    ED_IN_REGISTER(v);                                                                      \
                    for (int r = 0; r < nr; r++) a[r][c] = _mm512_fmadd_ps(w[r], v, a[r][c]);               \
                }                                                                                           \
            }                                                                                               \
            for (int r = 0; r < nr; r++)                                                                    \
                for (int c = 0; c < nc; c++) part[r][c] = h ? _mm512_add_ps(part[r][c], a[r][c]) : a[r][c]; \
        }                                                                                                   \
        float sums[2][16];                                                                                  \
        for (int half = 0; half < 2; half++) {                                                              \
            if (16 * half >= nr * nc) break;                                                                \
            __m512 v[16];                                                                                   \
            for (int j = 0; j < 16; j++) {                                                                  \
                const int o = 16 * half + j; /* output o: activation row o / nr, weight row o % nr */        \
                v[j] = o < nr * nc ? part[o % nr][o / nr] : _mm512_setzero_ps();                            \
            }                                                                                               \
            _mm512_storeu_ps(sums[half], hsum16_f32x16(v));                                                 \
        }                                                                                                   \
        for (int c = 0; c < nc; c++)                                                                        \
            for (int r = 0; r < nr; r++) {                                                                  \
                const T *x = (const T *)(vx + r * bx);                                                      \
                const int o = c * nr + r, j = o % 16;                                                       \
                float sumf = sums[o / 16][4 * (j % 4) + j / 4];                                             \
                for (int i = n16; i < n; i++) sumf += CONV(x[i]) * y[c * ly + i];                           \
                s[c * bs + r] = sumf;                                                                       \
            }                                                                                               \
    }                                                                                                       \
    /* activation rows GEMM_NC at a time (outer: they stay in L1), weight rows GEMM_NR at a time */         \
    static void name##_gemm(int n, float *s, size_t bs, const void *vx, size_t bx, int nr, const float *y,     \
                            size_t ly, int nc) {                                                            \
        for (int c0 = 0; c0 < nc; c0 += GEMM_NC) {                                                          \
            const int cn = nc - c0 < GEMM_NC ? nc - c0 : GEMM_NC;                                           \
            const float *yc = y + (size_t)c0 * ly;                                                          \
            for (int r0 = 0; r0 < nr; r0 += GEMM_NR) {                                                      \
                const uint8_t *x = (const uint8_t *)vx + (size_t)r0 * bx;                                   \
                float *sc = s + (size_t)c0 * bs + r0;                                                       \
                const int rn = nr - r0 < GEMM_NR ? nr - r0 : GEMM_NR;                                       \
                switch (rn * 16 + cn) { /* constant shapes: the tile's registers are fixed */               \
                    GEMM_CASES(name, 3) GEMM_CASES(name, 2) GEMM_CASES(name, 1)                             \
                }                                                                                           \
            }                                                                                               \
        }                                                                                                   \
    }

#define GEMM_CASE(name, R, C)                                                                               \
    case R * 16 + C: name##_gemm_tile(n, sc, bs, x, bx, yc, ly, R, C); break;
#define GEMM_CASES(name, R)                                                                                 \
    GEMM_CASE(name, R, 1) GEMM_CASE(name, R, 2) GEMM_CASE(name, R, 3) GEMM_CASE(name, R, 4)                 \
    GEMM_CASE(name, R, 5) GEMM_CASE(name, R, 6) GEMM_CASE(name, R, 7) GEMM_CASE(name, R, 8)

FLOAT_GEMM512(f16, uint16_t, LOAD_F16, F16)
FLOAT_GEMM512(bf16, uint16_t, LOAD_BF16, ed_bf16_to_f32)

ED_TARGET_POP

/* ------------------------------------------------- BF16 weights where the CPU has AVX512_BF16 */

/* vdpbf16ps: per float lane j, acc += x[2j+1] * y[2j+1], then acc += x[2j] * y[2j] (each product of two
 * bf16 values exact in float, each sum rounded; denormals flushed), 32 products per instruction where
 * the FMA kernels above do 16. vec_dot_bf16 here is two accumulators over 64-element steps (the second
 * for elements 32..63), a last 32-element step into the first, their sum's hsum, then the scalar tail;
 * the 2 x 4 tile (vec_dot_nx, vec_dot_2nx: prompts) computes every output by those operations, so its
 * bits. Activations are bf16 rows as for the FMA kernels (llama.cpp's vec_dot_type for BF16), so the
 * values multiplied are the same; only the summation order and the flushing of denormal products differ
 * (within the contract's tolerance). Mirrors the instruction's use in ggml-cpu's ggml_vec_dot_bf16
 * (ggml-org/llama.cpp, ggml/src/ggml-cpu/vec.cpp), not its code. */
#if defined(ED_EMULATE_AVX512)
#define BH_T simde__m512i
#define BH_LOAD(p) simde_mm512_loadu_si512((const void *)(p))
#define DPBF16(acc, a, b) ed_emu_dpbf16_ps(acc, a, b)
#else
#define BH_T __m512bh
#define BH_LOAD(p) ((__m512bh)_mm512_loadu_si512((const void *)(p)))
#define DPBF16(acc, a, b) _mm512_dpbf16_ps(acc, a, b)
#endif

ED_TARGET_PUSH("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512bf16")
ED_ALWAYS_INLINE void bf16dp_mn(int n, float *s, size_t bs, const uint8_t *vx, size_t bx, const uint8_t *vy,
                                size_t by, const int nr, const int nc) {
    __m512 a0[2][4], a1[2][4];
    for (int r = 0; r < nr; r++)
        for (int c = 0; c < nc; c++) a0[r][c] = a1[r][c] = _mm512_setzero_ps();
    int i = 0;
    for (; i + 64 <= n; i += 64) {
        BH_T w0[2], w1[2];
        for (int r = 0; r < nr; r++) {
            const uint16_t *x = (const uint16_t *)(vx + r * bx);
            w0[r] = BH_LOAD(x + i), w1[r] = BH_LOAD(x + i + 32);
        }
        for (int c = 0; c < nc; c++) {
            const uint16_t *y = (const uint16_t *)(vy + c * by);
            const BH_T y0 = BH_LOAD(y + i), y1 = BH_LOAD(y + i + 32);
            for (int r = 0; r < nr; r++) a0[r][c] = DPBF16(a0[r][c], w0[r], y0), a1[r][c] = DPBF16(a1[r][c], w1[r], y1);
        }
    }
    for (; i + 32 <= n; i += 32)
        for (int c = 0; c < nc; c++) {
            const BH_T y0 = BH_LOAD((const uint16_t *)(vy + c * by) + i);
            for (int r = 0; r < nr; r++) a0[r][c] = DPBF16(a0[r][c], BH_LOAD((const uint16_t *)(vx + r * bx) + i), y0);
        }
    __m512 v[16];
    for (int o = 0; o < 16; o++)
        v[o] = o % 2 < nr && o / 2 < nc ? _mm512_add_ps(a0[o % 2][o / 2], a1[o % 2][o / 2]) : _mm512_setzero_ps();
    float sums[16];
    _mm512_storeu_ps(sums, hsum16_f32x16(v));
    for (int r = 0; r < nr; r++)
        for (int c = 0; c < nc; c++) {
            const uint16_t *x = (const uint16_t *)(vx + r * bx), *y = (const uint16_t *)(vy + c * by);
            const int o = 2 * c + r;
            float sumf = sums[4 * (o % 4) + o / 4];
            for (int j = i; j < n; j++) sumf += ed_bf16_to_f32(x[j]) * ed_bf16_to_f32(y[j]);
            s[c * bs + r] = sumf;
        }
}
ED_MN_ENTRIES(bf16dp_mn, bf16dp_1n, vec_dot_bf16dp, vec_dot_nx_bf16dp, vec_dot_2nx_bf16dp)
ED_TARGET_POP

/* ----------------------------------------------------------- legacy blocks: AVX-512 VNNI variant */

ED_TARGET_PUSH("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")
#define ED_VNNI 1
#include "avx512_body.h"
#include "avx512_kquants.h"
#undef ED_VNNI
#include "avx512_x16.h"
ED_TARGET_POP

#if !defined(ED_EMULATE_AVX512) /* SIMDe has no AMX */
ED_TARGET_PUSH("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,amx-tile,amx-int8")
#include "avx512_amx.h"
#include "avx512_amx_x16.h"
ED_TARGET_POP
#endif

int ed_fill_avx512(ed_kernel_table *t) {
    if (!ed_fill_avx2(t)) return 0; /* quantizers and anything not overridden below */
    /* AVX2's multi-row kernels match AVX2's vec_dot bits, not these: each type below sets both */
    for (int i = 0; i < ED_TYPE_COUNT; i++) t->types[i].vec_dot_nx = NULL, t->types[i].vec_dot_2nx = NULL;
    t->level = ED_LEVEL_AVX512;
    if (ed_cpu_has_avx512vnni())
        set_legacy_vnni(t), set_kquants_vnni(t);
    else
        set_legacy_bw(t), set_kquants_bw(t);
    /* the repacked layout: vpdpbusd's kernels where the CPU has it (without VNNI, AVX2's from
     * ed_fill_avx2, the same bits); with AMX, the legacy types' prompts on tiles read from the layout
     * (avx512_amx_x16.h). EDGELLM_REPACK=0 switches it off (ed_fill_avx2 then installed none): AMX
     * machines then multiply prompts with the tile GEMM over the file's blocks (avx512_amx.h). The two
     * AMX paths never share a table: the x16 side tables and packed activations share the scratch. */
    if (ed_cpu_has_avx512vnni() && ed_repack_enabled()) {
        set_x16(t);
#if !defined(ED_EMULATE_AVX512)
        if (ed_cpu_has_amx()) set_x16_amx(t);
#endif
    } else if (ed_cpu_has_amx()) {
        for (int i = 0; i < ED_TYPE_COUNT; i++) t->types[i].x16_gemm = NULL;
#if !defined(ED_EMULATE_AVX512)
        set_amx(t);
#endif
    }
    /* (no x16 layout for the floats: their 2 x 4 tile reads the file's rows) */
    t->types[ED_F16].vec_dot = vec_dot_f16, t->types[ED_F16].vec_dot_nx = vec_dot_nx_f16;
    t->types[ED_F16].vec_dot_2nx = vec_dot_2nx_f16, t->types[ED_F16].float_gemm = f16_gemm;
    t->types[ED_BF16].vec_dot = vec_dot_bf16, t->types[ED_BF16].vec_dot_nx = vec_dot_nx_bf16;
    t->types[ED_BF16].vec_dot_2nx = vec_dot_2nx_bf16, t->types[ED_BF16].float_gemm = bf16_gemm;
    if (ed_cpu_has_avx512bf16()) { /* prompts take the 2 x 4 tile over the bf16 rows: no float32 copies */
        t->types[ED_BF16].vec_dot = vec_dot_bf16dp, t->types[ED_BF16].vec_dot_nx = vec_dot_nx_bf16dp;
        t->types[ED_BF16].vec_dot_2nx = vec_dot_2nx_bf16dp, t->types[ED_BF16].float_gemm = NULL;
    }
    t->types[ED_F32].vec_dot = vec_dot_f32, t->types[ED_F32].vec_dot_nx = vec_dot_nx_f32;
    t->types[ED_F32].vec_dot_2nx = vec_dot_2nx_f32;
    return 1;
}

#else
int ed_fill_avx512(ed_kernel_table *t) {
    (void)t;
    return 0;
}
#endif
