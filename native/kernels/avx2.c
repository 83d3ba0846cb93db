/* AVX2 + FMA + F16C kernels, compiled with a target pragma so a build without -march carries them.
 *
 * Mirrors ggml-org/llama.cpp ggml/src/ggml-cpu/arch/x86/quants.c (the __AVX2__ branches of
 * quantize_row_q8_0/q8_1 and ggml_vec_dot_{q4_0,q4_1,q5_0,q5_1,q8_0,iq4_nl}_q8_0/1, q{4,5,6}_K_q8_K; Q2_K
 * and Q3_K live in avx2_q23k.c) and vec.cpp (ggml_vec_dot_f16/bf16/f32). Differences: the legacy dots run
 * two blocks per iteration into two accumulators (the FMA chain, not the ALUs, bounds ggml's
 * one-accumulator loop), Q4_1/Q5_1 form (dx*dy, m*s) with one F16C conversion of each 4-byte block head,
 * and Q8_K is vectorized (ggml uses the scalar reference on x86). Every quantizer rounds to nearest even,
 * bit-identical to scalar.c.
 */
#include "ed_blocks.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#elif defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif

/* ------------------------------------------------------------------------------------- helpers */

static inline float hsum_f32x8(__m256 x) {
    __m128 r = _mm_add_ps(_mm256_extractf128_ps(x, 1), _mm256_castps256_ps128(x));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

static inline int hsum_i32x8(__m256i a) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

static inline float f16(uint16_t h) { return _cvtsh_ss(h); }

/* the f16 pair at p (block heads: d,m of Q4_1/Q5_1, d,s of Q8_1) as floats in lanes 0, 1 */
static inline __m128 f16x2(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm_cvtph_ps(_mm_cvtsi32_si128(v));
}

/* f16(*xd) * f16(*yd) in all lanes */
static inline __m256 scale_xy(const void *xd, const void *yd) {
    return _mm256_set1_ps(ed_f16_table[ed_load_u16(xd)] * ed_f16_table[ed_load_u16(yd)]);
}

/* 16 bytes of nibbles -> 32 bytes 0..15: low nibbles first (elements 0..15), then high (16..31) */
static inline __m256i nibbles32(const uint8_t *p) {
    const __m256i t = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p));
    return _mm256_and_si256(_mm256_set1_epi8(0x0F), _mm256_srlv_epi64(t, _mm256_set_epi64x(4, 4, 0, 0)));
}

#define ED_ALWAYS_INLINE static inline __attribute__((always_inline))
#include "avx2_x16_legacy.h" /* bits32; the x16 helpers and the legacy types' x16 GEMM (for avx2_x16.h) */

/* Σ pairs of u8 * s8 products, as 8 float lanes of 4-element sums */
static inline __m256 dot_us8(__m256i ax, __m256i sy) {
    const __m256i p16 = _mm256_maddubs_epi16(ax, sy);
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_set1_epi16(1), p16));
}

/* the same for s8 * s8: |x| * (y with x's sign) */
static inline __m256 dot_s8(__m256i x, __m256i y) {
    return dot_us8(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
}

/* ------------------------------------------------------------------------- activation quantizers */

/* rint(v * mul) as int32, ties to even */
static inline __m256i rint_i32(__m256 v, __m256 mul) {
    const __m256 r = _mm256_round_ps(_mm256_mul_ps(v, mul), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    return _mm256_cvtps_epi32(r);
}

/* 8 int32 vectors' int8 saturation, in element order (the packs work per 128-bit lane; ggml's permute) */
static inline __m256i pack_i8(__m256i i0, __m256i i1, __m256i i2, __m256i i3) {
    const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
    return _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* 32 floats -> rint(x * id) as int8, in order; *sum (when asked) gets their int32 partial sums */
static inline __m256i round_pack32(const __m256 v[4], __m256 mul, __m256i *sum) {
    const __m256i i0 = rint_i32(v[0], mul), i1 = rint_i32(v[1], mul), i2 = rint_i32(v[2], mul);
    const __m256i i3 = rint_i32(v[3], mul);
    if (sum) *sum = _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
    return pack_i8(i0, i1, i2, i3);
}

static inline float amax32(const float *x, __m256 v[4]) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int j = 0; j < 4; j++) v[j] = _mm256_loadu_ps(x + 8 * j);
    __m256 m = _mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1]));
    m = _mm256_max_ps(m, _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
    __m128 m4 = _mm_max_ps(_mm256_extractf128_ps(m, 1), _mm256_castps256_ps128(m));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    return _mm_cvtss_f32(m4);
}

static void quantize_q8_0(const float *x, void *vy, int64_t n) {
    block_q8_0 *y = vy;
    for (int64_t i = 0; i < n / QK; i++, x += QK) {
        __m256 v[4];
        const float amax = amax32(x, v);
        y[i].d = ed_f32_to_f16(amax / 127.f);
        const __m256 mul = _mm256_set1_ps(amax != 0.0f ? 127.f / amax : 0.0f);
        _mm256_storeu_si256((__m256i *)y[i].qs, round_pack32(v, mul, NULL));
    }
}

static void quantize_q8_1(const float *x, void *vy, int64_t n) {
    block_q8_1 *y = vy;
    for (int64_t i = 0; i < n / QK; i++, x += QK) {
        __m256 v[4];
        __m256i sum;
        const float amax = amax32(x, v);
        const float d = amax / 127.f;
        const __m256 mul = _mm256_set1_ps(amax != 0.0f ? 127.f / amax : 0.0f);
        _mm256_storeu_si256((__m256i *)y[i].qs, round_pack32(v, mul, &sum));
        y[i].d = ed_f32_to_f16(d);
        y[i].s = ed_f32_to_f16(d * (float)hsum_i32x8(sum));
    }
}

/* ggml-quants.c quantize_row_q8_K_ref, vectorized: d = 1/(-127/max), q = min(127, rint(x * -127/max)) */
static void quantize_q8_K(const float *x, void *vy, int64_t n) {
    block_q8_K *y = vy;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        __m256 m = _mm256_setzero_ps();
        for (int j = 0; j < QK_K; j += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)));
        __m128 m4 = _mm_max_ps(_mm256_extractf128_ps(m, 1), _mm256_castps256_ps128(m));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float amax = _mm_cvtss_f32(m4);
        if (amax == 0.0f) {
            memset(&y[i], 0, sizeof(y[i]));
            continue;
        }
        float max = amax; /* the first element of largest magnitude, with its sign */
        const __m256 va = _mm256_set1_ps(amax);
        for (int j = 0; j < QK_K; j += 8) {
            const __m256 xj = _mm256_loadu_ps(x + j);
            const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_andnot_ps(sign, xj), va, _CMP_EQ_OQ));
            if (hit) {
                max = x[j + __builtin_ctz((unsigned)hit)];
                break;
            }
        }
        const float iscale = -127.f / max;
        const __m256 mul = _mm256_set1_ps(iscale);
        const __m256i lim = _mm256_set1_epi32(127);
        __m256i sums[4];
        for (int g = 0; g < QK_K / 64; g++) { /* 64 elements: 4 groups of 16 */
            __m256i q[8];
            const float *xg = x + 64 * g;
            int8_t *qg = y[i].qs + 64 * g;
            for (int k = 0; k < 8; k++) q[k] = _mm256_min_epi32(lim, rint_i32(_mm256_loadu_ps(xg + 8 * k), mul));
            _mm256_storeu_si256((__m256i *)qg, pack_i8(q[0], q[1], q[2], q[3]));
            _mm256_storeu_si256((__m256i *)(qg + 32), pack_i8(q[4], q[5], q[6], q[7]));
            /* group sums: hadd tree over the 4 pairs (q[0]+q[1], ...) -> [s0 s1 s2 s3] in both halves */
            const __m256i s01 = _mm256_hadd_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
            const __m256i s23 = _mm256_hadd_epi32(_mm256_add_epi32(q[4], q[5]), _mm256_add_epi32(q[6], q[7]));
            sums[g] = _mm256_hadd_epi32(s01, s23);
        }
        for (int g = 0; g < QK_K / 64; g++) {
            const __m128i s = _mm_add_epi32(_mm256_castsi256_si128(sums[g]), _mm256_extracti128_si256(sums[g], 1));
            int32_t t[4];
            _mm_storeu_si128((__m128i *)t, s);
            for (int k = 0; k < 4; k++) y[i].bsums[4 * g + k] = (int16_t)t[k];
        }
        y[i].d = 1.0f / iscale;
    }
}

static void convert_f16(const float *x, void *vy, int64_t n) {
    uint16_t *y = vy;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) y[i] = ed_f32_to_f16(x[i]);
}

/* ggml_compute_fp32_to_bf16 on 8 lanes: round to nearest even, NaNs made quiet */
static inline __m256i bf16x8(__m256 v) {
    const __m256i u = _mm256_castps_si256(v);
    const __m256i mag = _mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF));
    const __m256i nan = _mm256_cmpgt_epi32(mag, _mm256_set1_epi32(0x7F800000));
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF))), 16);
    const __m256i q = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(64));
    return _mm256_blendv_epi8(r, q, nan);
}

static void convert_bf16(const float *x, void *vy, int64_t n) {
    uint16_t *y = vy;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m256i p = _mm256_packus_epi32(bf16x8(_mm256_loadu_ps(x + i)), bf16x8(_mm256_loadu_ps(x + i + 8)));
        _mm256_storeu_si256((__m256i *)(y + i), _mm256_permute4x64_epi64(p, _MM_SHUFFLE(3, 1, 2, 0)));
    }
    for (; i < n; i++) y[i] = ed_f32_to_bf16(x[i]);
}

static void convert_f32(const float *x, void *vy, int64_t n) { memcpy(vy, x, (size_t)n * sizeof(float)); }

/* ------------------------------------------------------------------------- legacy 32-element blocks */

/* Each dot runs blocks in pairs into two accumulators, then the odd block; per block: acc += d * Σq */

#define LEGACY_DOT(name, XT, YT, BLOCK)                                                  \
    static void name(int n, float *s, const void *vx, const void *vy) {                 \
        const XT *x = vx;                                                                 \
        const YT *y = vy;                                                                 \
        const int nb = n / QK;                                                            \
        __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();                    \
        __m128 ms0 = _mm_setzero_ps(), ms1 = _mm_setzero_ps();                            \
        int ib = 0;                                                                       \
        for (; ib + 1 < nb; ib += 2) {                                                    \
            acc0 = BLOCK(&x[ib], &y[ib], acc0, &ms0);                                     \
            acc1 = BLOCK(&x[ib + 1], &y[ib + 1], acc1, &ms1);                             \
        }                                                                                 \
        if (ib < nb) acc0 = BLOCK(&x[ib], &y[ib], acc0, &ms0);                            \
        const __m128 ms = _mm_add_ps(ms0, ms1);                                           \
        *s = hsum_f32x8(_mm256_add_ps(acc0, acc1)) + _mm_cvtss_f32(_mm_shuffle_ps(ms, ms, 1)); \
    }

static inline __m256 block_q4_0_q8_0(const block_q4_0 *x, const block_q8_0 *y, __m256 acc, __m128 *ms) {
    (void)ms;
    const __m256 d = scale_xy(&x->d, &y->d);
    const __m256i qx = _mm256_sub_epi8(nibbles32(x->qs), _mm256_set1_epi8(8));
    return _mm256_fmadd_ps(d, dot_s8(qx, _mm256_loadu_si256((const __m256i *)y->qs)), acc);
}

/* (dx*dy, mx*sy) from the two 4-byte heads; ms lane 1 collects Σ m*s */
static inline __m256 block_q4_1_q8_1(const block_q4_1 *x, const block_q8_1 *y, __m256 acc, __m128 *ms) {
    const __m128 p = _mm_mul_ps(f16x2(x), f16x2(y));
    *ms = _mm_add_ps(*ms, p);
    const __m256 xy = dot_us8(nibbles32(x->qs), _mm256_loadu_si256((const __m256i *)y->qs));
    return _mm256_fmadd_ps(_mm256_broadcastss_ps(p), xy, acc);
}

static inline __m256 block_q5_0_q8_0(const block_q5_0 *x, const block_q8_0 *y, __m256 acc, __m128 *ms) {
    (void)ms;
    const __m256 d = scale_xy(&x->d, &y->d);
    /* q | 0xF0 where the fifth bit is clear is q - 16 as int8 */
    const __m256i hi = _mm256_andnot_si256(bits32(x->qh), _mm256_set1_epi8((char)0xF0));
    const __m256i qx = _mm256_or_si256(nibbles32(x->qs), hi);
    return _mm256_fmadd_ps(d, dot_s8(qx, _mm256_loadu_si256((const __m256i *)y->qs)), acc);
}

static inline __m256 block_q5_1_q8_1(const block_q5_1 *x, const block_q8_1 *y, __m256 acc, __m128 *ms) {
    const __m128 p = _mm_mul_ps(f16x2(x), f16x2(y));
    *ms = _mm_add_ps(*ms, p);
    const __m256i hi = _mm256_and_si256(bits32(x->qh), _mm256_set1_epi8(0x10));
    const __m256i qx = _mm256_or_si256(nibbles32(x->qs), hi);
    const __m256 xy = dot_us8(qx, _mm256_loadu_si256((const __m256i *)y->qs));
    return _mm256_fmadd_ps(_mm256_broadcastss_ps(p), xy, acc);
}

static inline __m256 block_q8_0_q8_0(const block_q8_0 *x, const block_q8_0 *y, __m256 acc, __m128 *ms) {
    (void)ms;
    const __m256 d = scale_xy(&x->d, &y->d);
    const __m256i qx = _mm256_loadu_si256((const __m256i *)x->qs);
    return _mm256_fmadd_ps(d, dot_s8(qx, _mm256_loadu_si256((const __m256i *)y->qs)), acc);
}

static inline __m256 block_iq4_nl_q8_0(const block_iq4_nl *x, const block_q8_0 *y, __m256 acc, __m128 *ms) {
    (void)ms;
    const __m128i values = _mm_loadu_si128((const __m128i *)ed_kvalues_iq4nl);
    const __m128i m4 = _mm_set1_epi8(0x0F);
    const __m128i bits = _mm_loadu_si128((const __m128i *)x->qs);
    const __m256i qx = _mm256_set_m128i(_mm_shuffle_epi8(values, _mm_and_si128(_mm_srli_epi16(bits, 4), m4)),
                                        _mm_shuffle_epi8(values, _mm_and_si128(bits, m4)));
    const __m256 d = scale_xy(&y->d, &x->d);
    return _mm256_fmadd_ps(d, dot_s8(qx, _mm256_loadu_si256((const __m256i *)y->qs)), acc);
}

LEGACY_DOT(vec_dot_q4_0, block_q4_0, block_q8_0, block_q4_0_q8_0)
LEGACY_DOT(vec_dot_q4_1, block_q4_1, block_q8_1, block_q4_1_q8_1)
LEGACY_DOT(vec_dot_q5_0, block_q5_0, block_q8_0, block_q5_0_q8_0)
LEGACY_DOT(vec_dot_q5_1, block_q5_1, block_q8_1, block_q5_1_q8_1)
LEGACY_DOT(vec_dot_q8_0, block_q8_0, block_q8_0, block_q8_0_q8_0)
LEGACY_DOT(vec_dot_iq4_nl, block_iq4_nl, block_q8_0, block_iq4_nl_q8_0)

/* ---------------------------------------------- legacy blocks, one weight row x nc activation rows */

/* A weight block unpacked once for nc rows. Per row the float operations are those of the single-row
 * block functions above (dot_s8(x, y) is dot_us8(|x|, y with x's sign)), so every output matches
 * vec_dot bit for bit: even blocks into acc0, odd into acc1, the same final sums. */
typedef struct {
    __m256i q, a; /* signed quants and their magnitudes */
    float d;
    __m128 dm; /* (d, m) for Q4_1/Q5_1 */
} wblock;

static inline wblock prep_q4_0(const block_q4_0 *x) {
    wblock w;
    w.q = _mm256_sub_epi8(nibbles32(x->qs), _mm256_set1_epi8(8));
    w.a = _mm256_sign_epi8(w.q, w.q);
    w.d = ed_f16_table[ed_load_u16(&x->d)];
    return w;
}

static inline wblock prep_q5_0(const block_q5_0 *x) {
    wblock w;
    const __m256i hi = _mm256_andnot_si256(bits32(x->qh), _mm256_set1_epi8((char)0xF0));
    w.q = _mm256_or_si256(nibbles32(x->qs), hi);
    w.a = _mm256_sign_epi8(w.q, w.q);
    w.d = ed_f16_table[ed_load_u16(&x->d)];
    return w;
}

static inline wblock prep_q8_0(const block_q8_0 *x) {
    wblock w;
    w.q = _mm256_loadu_si256((const __m256i *)x->qs);
    w.a = _mm256_sign_epi8(w.q, w.q);
    w.d = ed_f16_table[ed_load_u16(&x->d)];
    return w;
}

static inline wblock prep_q4_1(const block_q4_1 *x) {
    wblock w;
    w.q = nibbles32(x->qs);
    w.dm = f16x2(x);
    return w;
}

static inline wblock prep_q5_1(const block_q5_1 *x) {
    wblock w;
    const __m256i hi = _mm256_and_si256(bits32(x->qh), _mm256_set1_epi8(0x10));
    w.q = _mm256_or_si256(nibbles32(x->qs), hi);
    w.dm = f16x2(x);
    return w;
}

/* Q8_0 activations, nc rows: acc[c] += (dx * dy_c) * dot_s8(x, y_c) */
ED_ALWAYS_INLINE void rows_s8(const wblock *w, const uint8_t *vy, size_t by, int ib, __m256 *acc, const int nc) {
    for (int c = 0; c < nc; c++) {
        const block_q8_0 *y = (const block_q8_0 *)(vy + c * by) + ib;
        const __m256i qy = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)y->qs), w->q);
        acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(w->d * ed_f16_table[ed_load_u16(&y->d)]), dot_us8(w->a, qy), acc[c]);
    }
}

/* the f16 heads of two blocks as floats (d_a, m_a or s_a, d_b, m_b or s_b) */
static inline __m128 f16x2x2(const void *a, const void *b) {
    int32_t u, v;
    memcpy(&u, a, 4);
    memcpy(&v, b, 4);
    return _mm_cvtph_ps(_mm_insert_epi32(_mm_cvtsi32_si128(u), v, 1));
}

/* Q8_1 activations, rows in pairs (a, b): p = (dx*dy_a, mx*sy_a, dx*dy_b, mx*sy_b), the lanes of the
 * single-row p side by side; ms[pair] += p; acc_a += p0 * dot_us8, acc_b += p2 * dot_us8 */
ED_ALWAYS_INLINE void rows_u8(const wblock *w, const uint8_t *vy, size_t by, int ib, __m256 *acc, __m128 *ms,
                              const int nc) {
    const __m128 dm2 = _mm_movelh_ps(w->dm, w->dm);
    for (int c = 0; c < nc; c += 2) {
        const block_q8_1 *ya = (const block_q8_1 *)(vy + c * by) + ib;
        const block_q8_1 *yb = (const block_q8_1 *)(vy + (c + 1) * by) + ib;
        const __m128 p = _mm_mul_ps(dm2, f16x2x2(ya, yb));
        ms[c / 2] = _mm_add_ps(ms[c / 2], p);
        const __m256 pb = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(p), _mm256_set1_epi32(2));
        acc[c] = _mm256_fmadd_ps(_mm256_broadcastss_ps(p),
                                 dot_us8(w->q, _mm256_loadu_si256((const __m256i *)ya->qs)), acc[c]);
        acc[c + 1] = _mm256_fmadd_ps(pb, dot_us8(w->q, _mm256_loadu_si256((const __m256i *)yb->qs)), acc[c + 1]);
    }
}

/* nc rows (even for the Q8_1 kind): even blocks into acc0, odd into acc1, then vec_dot's final sums */
#define LEGACY_DOT_NX(name, single, XT, PREP, U8)                                                          \
    ED_ALWAYS_INLINE void name##_n(int n, float *s, size_t bs, const XT *x, const uint8_t *vy, size_t by,  \
                                   const int nc) {                                                          \
        const int nb = n / QK;                                                                              \
        __m256 acc0[ED_NX_MAX], acc1[ED_NX_MAX];                                                            \
        __m128 ms0[ED_NX_MAX / 2], ms1[ED_NX_MAX / 2];                                                      \
        for (int c = 0; c < nc; c++) acc0[c] = acc1[c] = _mm256_setzero_ps();                               \
        for (int c = 0; c < nc / 2; c++) ms0[c] = ms1[c] = _mm_setzero_ps();                                \
        int ib = 0;                                                                                         \
        for (; ib + 1 < nb; ib += 2) {                                                                      \
            const wblock w0 = PREP(&x[ib]);                                                                 \
            if (U8) rows_u8(&w0, vy, by, ib, acc0, ms0, nc);                                                \
            else rows_s8(&w0, vy, by, ib, acc0, nc);                                                        \
            const wblock w1 = PREP(&x[ib + 1]);                                                             \
            if (U8) rows_u8(&w1, vy, by, ib + 1, acc1, ms1, nc);                                            \
            else rows_s8(&w1, vy, by, ib + 1, acc1, nc);                                                    \
        }                                                                                                   \
        if (ib < nb) {                                                                                      \
            const wblock w0 = PREP(&x[ib]);                                                                 \
            if (U8) rows_u8(&w0, vy, by, ib, acc0, ms0, nc);                                                \
            else rows_s8(&w0, vy, by, ib, acc0, nc);                                                        \
        }                                                                                                   \
        for (int c = 0; c < nc; c++) {                                                                      \
            float m = 0.0f;                                                                                 \
            if (U8) {                                                                                       \
                const __m128 ms = _mm_add_ps(ms0[c / 2], ms1[c / 2]);                                       \
                m = c % 2 ? _mm_cvtss_f32(_mm_shuffle_ps(ms, ms, 3)) : _mm_cvtss_f32(_mm_shuffle_ps(ms, ms, 1)); \
            }                                                                                               \
            s[c * bs] = hsum_f32x8(_mm256_add_ps(acc0[c], acc1[c])) + m;                                    \
        }                                                                                                   \
    }                                                                                                       \
    static void name(int n, float *s, size_t bs, const void *vx, const void *vy, size_t by, int nc) {      \
        const uint8_t *y = vy;                                                                              \
        for (; nc >= 4; nc -= 4, s += 4 * bs, y += 4 * by) name##_n(n, s, bs, vx, y, by, 4);                \
        if (nc >= 2 && (U8 || nc == 2)) {                                                                   \
            name##_n(n, s, bs, vx, y, by, 2);                                                               \
            nc -= 2, s += 2 * bs, y += 2 * by;                                                              \
        } else if (nc == 3) {                                                                               \
            name##_n(n, s, bs, vx, y, by, 3);                                                               \
            nc = 0;                                                                                         \
        }                                                                                                   \
        if (nc == 1) single(n, s, vx, y);                                                                   \
    }

LEGACY_DOT_NX(vec_dot_nx_q4_0, vec_dot_q4_0, block_q4_0, prep_q4_0, 0)
LEGACY_DOT_NX(vec_dot_nx_q5_0, vec_dot_q5_0, block_q5_0, prep_q5_0, 0)
LEGACY_DOT_NX(vec_dot_nx_q8_0, vec_dot_q8_0, block_q8_0, prep_q8_0, 0)
LEGACY_DOT_NX(vec_dot_nx_q4_1, vec_dot_q4_1, block_q4_1, prep_q4_1, 1)
LEGACY_DOT_NX(vec_dot_nx_q5_1, vec_dot_q5_1, block_q5_1, prep_q5_1, 1)

/* --------------------------------------------------------------------------- K-quants (vs Q8_K) */

/* ggml get_scale_shuffle_k4: broadcast the 16-bit scale pair k (of 8) to all lanes */
static inline __m256i scale_k4(__m256i scales, int k) {
    return _mm256_shuffle_epi8(scales, _mm256_set1_epi16((short)((2 * k) | ((2 * k + 1) << 8))));
}

/* 8 mins (int16) * Q8_K's 16 bsums summed in pairs -> Σ mins[j] * (bsums[2j] + bsums[2j+1]) as 4 int32 */
static inline __m128i mins_dot(__m256i mins_and_scales, const int16_t *bsums) {
    const __m256i q8sums = _mm256_loadu_si256((const __m256i *)bsums);
    const __m128i q8s = _mm_hadd_epi16(_mm256_castsi256_si128(q8sums), _mm256_extracti128_si256(q8sums, 1));
    return _mm_madd_epi16(_mm256_extracti128_si256(mins_and_scales, 1), q8s);
}

static void vec_dot_q4_K(int n, float *s, const void *vx, const void *vy) {
    const block_q4_K *x = vx;
    const block_q8_K *y = vy;
    const __m256i m4 = _mm256_set1_epi8(0xF);
    __m256 acc = _mm256_setzero_ps();
    __m128 acc_m = _mm_setzero_ps();
    for (int i = 0; i < n / QK_K; i++) {
        const float d = y[i].d * f16(ed_load_u16(&x[i].d));
        const float dmin = -y[i].d * f16(ed_load_u16(&x[i].dmin));
        uint32_t utmp[4];
        ed_unpack_scales_k4(x[i].scales, utmp);
        const __m256i mins_and_scales = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)utmp));
        acc_m = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(mins_dot(mins_and_scales, y[i].bsums)), acc_m);
        const __m128i sc128 = _mm256_castsi256_si128(mins_and_scales);
        const __m256i scales = _mm256_set_m128i(sc128, sc128);
        const uint8_t *q4 = x[i].qs;
        const int8_t *q8 = y[i].qs;
        __m256i sumi = _mm256_setzero_si256();
        for (int j = 0; j < QK_K / 64; j++, q4 += 32, q8 += 64) {
            const __m256i q4bits = _mm256_loadu_si256((const __m256i *)q4);
            const __m256i q4l = _mm256_and_si256(q4bits, m4);
            const __m256i q4h = _mm256_and_si256(_mm256_srli_epi16(q4bits, 4), m4);
            const __m256i pl = _mm256_maddubs_epi16(q4l, _mm256_loadu_si256((const __m256i *)q8));
            const __m256i ph = _mm256_maddubs_epi16(q4h, _mm256_loadu_si256((const __m256i *)(q8 + 32)));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(_mm256_madd_epi16(scale_k4(scales, 2 * j), pl),
                                                           _mm256_madd_epi16(scale_k4(scales, 2 * j + 1), ph)));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    acc_m = _mm_add_ps(acc_m, _mm_movehl_ps(acc_m, acc_m));
    acc_m = _mm_add_ss(acc_m, _mm_movehdup_ps(acc_m));
    *s = hsum_f32x8(acc) + _mm_cvtss_f32(acc_m);
}

static void vec_dot_q5_K(int n, float *s, const void *vx, const void *vy) {
    const block_q5_K *x = vx;
    const block_q8_K *y = vy;
    const __m256i m4 = _mm256_set1_epi8(0xF);
    __m256 acc = _mm256_setzero_ps();
    __m128 acc_m = _mm_setzero_ps();
    for (int i = 0; i < n / QK_K; i++) {
        const float d = y[i].d * f16(ed_load_u16(&x[i].d));
        const float dmin = -y[i].d * f16(ed_load_u16(&x[i].dmin));
        uint32_t utmp[4];
        ed_unpack_scales_k4(x[i].scales, utmp);
        const __m256i mins_and_scales = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)utmp));
        acc_m = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(mins_dot(mins_and_scales, y[i].bsums)), acc_m);
        const __m128i sc128 = _mm256_castsi256_si128(mins_and_scales);
        const __m256i scales = _mm256_set_m128i(sc128, sc128);
        const __m256i hbits = _mm256_loadu_si256((const __m256i *)x[i].qh);
        const uint8_t *q5 = x[i].qs;
        const int8_t *q8 = y[i].qs;
        __m256i sumi = _mm256_setzero_si256();
        for (int j = 0; j < QK_K / 64; j++, q5 += 32, q8 += 64) {
            const __m256i q5bits = _mm256_loadu_si256((const __m256i *)q5);
            /* bit 2j of qh -> 16 for the low nibbles, bit 2j+1 for the high ones */
            const __m256i bl = _mm256_and_si256(_mm256_srli_epi16(hbits, 2 * j), _mm256_set1_epi8(1));
            const __m256i bh = _mm256_and_si256(_mm256_srli_epi16(hbits, 2 * j + 1), _mm256_set1_epi8(1));
            const __m256i q5l = _mm256_or_si256(_mm256_and_si256(q5bits, m4), _mm256_slli_epi16(bl, 4));
            const __m256i q5h =
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q5bits, 4), m4), _mm256_slli_epi16(bh, 4));
            const __m256i pl = _mm256_maddubs_epi16(q5l, _mm256_loadu_si256((const __m256i *)q8));
            const __m256i ph = _mm256_maddubs_epi16(q5h, _mm256_loadu_si256((const __m256i *)(q8 + 32)));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(_mm256_madd_epi16(scale_k4(scales, 2 * j), pl),
                                                           _mm256_madd_epi16(scale_k4(scales, 2 * j + 1), ph)));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    acc_m = _mm_add_ps(acc_m, _mm_movehl_ps(acc_m, acc_m));
    acc_m = _mm_add_ss(acc_m, _mm_movehdup_ps(acc_m));
    *s = hsum_f32x8(acc) + _mm_cvtss_f32(acc_m);
}

/* int8 scales k, k+1 of Q6_K widened to [k x 8, k+1 x 8] int16 (ggml get_scale_shuffle) */
static inline __m256i scale_pair_q6(__m128i scales, int k) {
    const __m128i idx = _mm_set_epi64x(0x0101010101010101LL * (k + 1), 0x0101010101010101LL * k);
    return _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales, idx));
}

static void vec_dot_q6_K(int n, float *s, const void *vx, const void *vy) {
    const block_q6_K *x = vx;
    const block_q8_K *y = vy;
    const __m256i m3 = _mm256_set1_epi8(3), m15 = _mm256_set1_epi8(15);
    __m256 acc = _mm256_setzero_ps();
    for (int i = 0; i < n / QK_K; i++) {
        const float d = y[i].d * f16(ed_load_u16(&x[i].d));
        const uint8_t *ql = x[i].ql, *qh = x[i].qh;
        const int8_t *q8 = y[i].qs;
        const __m128i scales = _mm_loadu_si128((const __m128i *)x[i].scales);
        /* quants are stored +32: subtract 32 * Σ scale * bsum once per block */
        const __m256i q8sums = _mm256_loadu_si256((const __m256i *)y[i].bsums);
        const __m256i sub = _mm256_slli_epi32(_mm256_madd_epi16(q8sums, _mm256_cvtepi8_epi16(scales)), 5);
        __m256i sumi = _mm256_setzero_si256();
        for (int j = 0; j < QK_K / 128; j++, ql += 64, qh += 32, q8 += 128) {
            const __m256i b1 = _mm256_loadu_si256((const __m256i *)ql);
            const __m256i b2 = _mm256_loadu_si256((const __m256i *)(ql + 32));
            const __m256i bh = _mm256_loadu_si256((const __m256i *)qh);
            const __m256i q0 =
                _mm256_or_si256(_mm256_and_si256(b1, m15), _mm256_slli_epi16(_mm256_and_si256(bh, m3), 4));
            const __m256i q1 = _mm256_or_si256(_mm256_and_si256(b2, m15),
                                               _mm256_slli_epi16(_mm256_and_si256(bh, _mm256_set1_epi8(12)), 2));
            const __m256i q2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b1, 4), m15),
                                               _mm256_and_si256(bh, _mm256_set1_epi8(48)));
            const __m256i q3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b2, 4), m15),
                                               _mm256_srli_epi16(_mm256_and_si256(bh, _mm256_set1_epi8(-64)), 2));
            const __m256i p0 = _mm256_maddubs_epi16(q0, _mm256_loadu_si256((const __m256i *)q8));
            const __m256i p1 = _mm256_maddubs_epi16(q1, _mm256_loadu_si256((const __m256i *)(q8 + 32)));
            const __m256i p2 = _mm256_maddubs_epi16(q2, _mm256_loadu_si256((const __m256i *)(q8 + 64)));
            const __m256i p3 = _mm256_maddubs_epi16(q3, _mm256_loadu_si256((const __m256i *)(q8 + 96)));
            /* scales 8j .. 8j+7: each 32-element product vector spans two 16-element scale groups */
            const __m256i s0 = scale_pair_q6(scales, 8 * j), s1 = scale_pair_q6(scales, 8 * j + 2);
            const __m256i s2 = scale_pair_q6(scales, 8 * j + 4), s3 = scale_pair_q6(scales, 8 * j + 6);
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(_mm256_madd_epi16(s0, p0), _mm256_madd_epi16(s1, p1)));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(_mm256_madd_epi16(s2, p2), _mm256_madd_epi16(s3, p3)));
        }
        sumi = _mm256_sub_epi32(sumi, sub);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    *s = hsum_f32x8(acc);
}

/* ------------------------------------------------- K-quants, one weight row x nc activation rows */

/* Per row, the float operations of vec_dot_q{4,5}_K / q6_K in their order (d, dmin products, acc_m's
 * fmadd, acc's fmadd, the final sums); the integer block sums are exact, so they may be formed in any
 * order. The weight quants and scales are unpacked once per 64 (128 for Q6_K) elements for all rows. */
#define K45_DOT_NX(name, single, XT, Q5)                                                                   \
    ED_ALWAYS_INLINE void name##_n(int n, float *s, size_t bs, const XT *x, const uint8_t *vy, size_t by,  \
                                   const int nc) {                                                          \
        const __m256i m4 = _mm256_set1_epi8(0xF);                                                           \
        __m256 acc[ED_NX_MAX];                                                                              \
        __m128 acc_m[ED_NX_MAX];                                                                            \
        for (int c = 0; c < nc; c++) acc[c] = _mm256_setzero_ps(), acc_m[c] = _mm_setzero_ps();             \
        for (int i = 0; i < n / QK_K; i++) {                                                                \
            const float xd = f16(ed_load_u16(&x[i].d)), xdmin = f16(ed_load_u16(&x[i].dmin));               \
            uint32_t utmp[4];                                                                               \
            ed_unpack_scales_k4(x[i].scales, utmp);                                                         \
            const __m256i mins_and_scales = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)utmp));   \
            const __m128i sc128 = _mm256_castsi256_si128(mins_and_scales);                                  \
            const __m256i scales = _mm256_set_m128i(sc128, sc128);                                          \
            __m256i sumi[ED_NX_MAX];                                                                        \
            for (int c = 0; c < nc; c++) {                                                                  \
                const block_q8_K *y = (const block_q8_K *)(vy + c * by) + i;                                \
                const float dmin = -y->d * xdmin;                                                           \
                acc_m[c] = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(mins_dot(mins_and_scales, y->bsums)), \
                                        acc_m[c]);                                                          \
                sumi[c] = _mm256_setzero_si256();                                                           \
            }                                                                                               \
            const uint8_t *q4 = x[i].qs;                                                                    \
            for (int j = 0; j < QK_K / 64; j++, q4 += 32) {                                                 \
                const __m256i bits = _mm256_loadu_si256((const __m256i *)q4);                               \
                __m256i ql = _mm256_and_si256(bits, m4);                                                    \
                __m256i qh = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);                              \
                if (Q5) {                                                                                   \
                    const __m256i hb = _mm256_loadu_si256((const __m256i *)((const block_q5_K *)(const void *)&x[i])->qh); \
                    const __m256i bl = _mm256_and_si256(_mm256_srli_epi16(hb, 2 * j), _mm256_set1_epi8(1)); \
                    const __m256i bh = _mm256_and_si256(_mm256_srli_epi16(hb, 2 * j + 1), _mm256_set1_epi8(1)); \
                    ql = _mm256_or_si256(ql, _mm256_slli_epi16(bl, 4));                                     \
                    qh = _mm256_or_si256(qh, _mm256_slli_epi16(bh, 4));                                     \
                }                                                                                           \
                const __m256i sl = scale_k4(scales, 2 * j), sh = scale_k4(scales, 2 * j + 1);               \
                for (int c = 0; c < nc; c++) {                                                              \
                    const int8_t *q8 = ((const block_q8_K *)(vy + c * by) + i)->qs + 64 * j;                \
                    const __m256i pl = _mm256_maddubs_epi16(ql, _mm256_loadu_si256((const __m256i *)q8));   \
                    const __m256i ph = _mm256_maddubs_epi16(qh, _mm256_loadu_si256((const __m256i *)(q8 + 32))); \
                    sumi[c] = _mm256_add_epi32(sumi[c], _mm256_add_epi32(_mm256_madd_epi16(sl, pl),         \
                                                                         _mm256_madd_epi16(sh, ph)));       \
                }                                                                                           \
            }                                                                                               \
            for (int c = 0; c < nc; c++) {                                                                  \
                const float d = ((const block_q8_K *)(vy + c * by) + i)->d * xd;                            \
                acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi[c]), acc[c]);           \
            }                                                                                               \
        }                                                                                                   \
        for (int c = 0; c < nc; c++) {                                                                      \
            __m128 am = _mm_add_ps(acc_m[c], _mm_movehl_ps(acc_m[c], acc_m[c]));                            \
            am = _mm_add_ss(am, _mm_movehdup_ps(am));                                                       \
            s[c * bs] = hsum_f32x8(acc[c]) + _mm_cvtss_f32(am);                                             \
        }                                                                                                   \
    }                                                                                                       \
    NX_ENTRY(name, single)

/* the table entry: groups of 4, then 3 or 2, a last single row through vec_dot itself */
#define NX_ENTRY(name, single)                                                                              \
    static void name(int n, float *s, size_t bs, const void *vx, const void *vy, size_t by, int nc) {      \
        const uint8_t *y = vy;                                                                              \
        for (; nc >= 4; nc -= 4, s += 4 * bs, y += 4 * by) name##_n(n, s, bs, vx, y, by, 4);                \
        if (nc == 3) name##_n(n, s, bs, vx, y, by, 3);                                                      \
        else if (nc == 2) name##_n(n, s, bs, vx, y, by, 2);                                                 \
        else if (nc == 1) single(n, s, vx, y);                                                              \
    }

K45_DOT_NX(vec_dot_nx_q4_K, vec_dot_q4_K, block_q4_K, 0)
K45_DOT_NX(vec_dot_nx_q5_K, vec_dot_q5_K, block_q5_K, 1)

ED_ALWAYS_INLINE void vec_dot_nx_q6_K_n(int n, float *s, size_t bs, const block_q6_K *x, const uint8_t *vy,
                                        size_t by, const int nc) {
    const __m256i m3 = _mm256_set1_epi8(3), m15 = _mm256_set1_epi8(15);
    __m256 acc[ED_NX_MAX];
    for (int c = 0; c < nc; c++) acc[c] = _mm256_setzero_ps();
    for (int i = 0; i < n / QK_K; i++) {
        const float xd = f16(ed_load_u16(&x[i].d));
        const uint8_t *ql = x[i].ql, *qh = x[i].qh;
        const __m128i scales = _mm_loadu_si128((const __m128i *)x[i].scales);
        const __m256i sc16 = _mm256_cvtepi8_epi16(scales);
        __m256i sumi[ED_NX_MAX];
        for (int c = 0; c < nc; c++) { /* quants are stored +32: start from -32 * Σ scale * bsum */
            const __m256i q8sums = _mm256_loadu_si256((const __m256i *)((const block_q8_K *)(vy + c * by) + i)->bsums);
            sumi[c] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(_mm256_madd_epi16(q8sums, sc16), 5));
        }
        for (int j = 0; j < QK_K / 128; j++, ql += 64, qh += 32) {
            const __m256i b1 = _mm256_loadu_si256((const __m256i *)ql);
            const __m256i b2 = _mm256_loadu_si256((const __m256i *)(ql + 32));
            const __m256i bh = _mm256_loadu_si256((const __m256i *)qh);
            const __m256i q0 =
                _mm256_or_si256(_mm256_and_si256(b1, m15), _mm256_slli_epi16(_mm256_and_si256(bh, m3), 4));
            const __m256i q1 = _mm256_or_si256(_mm256_and_si256(b2, m15),
                                               _mm256_slli_epi16(_mm256_and_si256(bh, _mm256_set1_epi8(12)), 2));
            const __m256i q2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b1, 4), m15),
                                               _mm256_and_si256(bh, _mm256_set1_epi8(48)));
            const __m256i q3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b2, 4), m15),
                                               _mm256_srli_epi16(_mm256_and_si256(bh, _mm256_set1_epi8(-64)), 2));
            const __m256i s0 = scale_pair_q6(scales, 8 * j), s1 = scale_pair_q6(scales, 8 * j + 2);
            const __m256i s2 = scale_pair_q6(scales, 8 * j + 4), s3 = scale_pair_q6(scales, 8 * j + 6);
            for (int c = 0; c < nc; c++) {
                const int8_t *q8 = ((const block_q8_K *)(vy + c * by) + i)->qs + 128 * j;
                const __m256i p0 = _mm256_maddubs_epi16(q0, _mm256_loadu_si256((const __m256i *)q8));
                const __m256i p1 = _mm256_maddubs_epi16(q1, _mm256_loadu_si256((const __m256i *)(q8 + 32)));
                const __m256i p2 = _mm256_maddubs_epi16(q2, _mm256_loadu_si256((const __m256i *)(q8 + 64)));
                const __m256i p3 = _mm256_maddubs_epi16(q3, _mm256_loadu_si256((const __m256i *)(q8 + 96)));
                sumi[c] = _mm256_add_epi32(sumi[c], _mm256_add_epi32(_mm256_madd_epi16(s0, p0), _mm256_madd_epi16(s1, p1)));
                sumi[c] = _mm256_add_epi32(sumi[c], _mm256_add_epi32(_mm256_madd_epi16(s2, p2), _mm256_madd_epi16(s3, p3)));
            }
        }
        for (int c = 0; c < nc; c++) {
            const float d = ((const block_q8_K *)(vy + c * by) + i)->d * xd;
            acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi[c]), acc[c]);
        }
    }
    for (int c = 0; c < nc; c++) s[c * bs] = hsum_f32x8(acc[c]);
}
NX_ENTRY(vec_dot_nx_q6_K, vec_dot_q6_K)

/* ---------------------------------------------------------- float types: 8 f32 lanes, FMA (F32: four
 * chains, F16 and BF16: two) */

#define FLOAT_DOT(name, T, LOAD, CONV)                                                    \
    static void name(int n, float *s, const void *vx, const void *vy) {                  \
        const T *x = vx, *y = vy;                                                          \
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                        \
        int i = 0;                                                                         \
        for (; i + 32 <= n; i += 32) {                                                     \
            a0 = _mm256_fmadd_ps(LOAD(x + i), LOAD(y + i), a0);                            \
            a1 = _mm256_fmadd_ps(LOAD(x + i + 8), LOAD(y + i + 8), a1);                    \
            a2 = _mm256_fmadd_ps(LOAD(x + i + 16), LOAD(y + i + 16), a2);                  \
            a3 = _mm256_fmadd_ps(LOAD(x + i + 24), LOAD(y + i + 24), a3);                  \
        }                                                                                  \
        for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(LOAD(x + i), LOAD(y + i), a0);     \
        float sumf = hsum_f32x8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3))); \
        for (; i < n; i++) sumf += CONV(x[i]) * CONV(y[i]);                                \
        *s = sumf;                                                                         \
    }

#define LOAD_F32(p) _mm256_loadu_ps(p)
#define LOAD_F16(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#define LOAD_BF16(p) \
    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p))), 16))
#define IDENT(v) (v)

FLOAT_DOT(vec_dot_f32, float, LOAD_F32, IDENT)

/* F16 and BF16: two chains (elements 16q..16q+7 and 16q+8..16q+15; the last 8-element step in the
 * first), then hsum_f32x8 of their sum, then the tail in order. Two, not four as F32's, so that their
 * GEMMs keep these bits with few passes over K (f16_gemm in one, each weight row's conversion serving
 * three activation rows); decode reads a row about as quickly with two chains as with four
 * (DEVELOPERS.md, "Attention and float weights"). */
#define FLOAT_DOT2(name, T, LOAD, CONV)                                                                     \
    static void name(int n, float *s, const void *vx, const void *vy) {                                    \
        const T *x = vx, *y = vy;                                                                           \
        __m256 a0 = _mm256_setzero_ps(), a1 = a0;                                                           \
        int i = 0;                                                                                          \
        for (; i + 16 <= n; i += 16) {                                                                      \
            a0 = _mm256_fmadd_ps(LOAD(x + i), LOAD(y + i), a0);                                             \
            a1 = _mm256_fmadd_ps(LOAD(x + i + 8), LOAD(y + i + 8), a1);                                     \
        }                                                                                                   \
        if (i + 8 <= n) a0 = _mm256_fmadd_ps(LOAD(x + i), LOAD(y + i), a0), i += 8;                         \
        float sumf = hsum_f32x8(_mm256_add_ps(a0, a1));                                                     \
        for (; i < n; i++) sumf += CONV(x[i]) * CONV(y[i]);                                                 \
        *s = sumf;                                                                                          \
    }
FLOAT_DOT2(vec_dot_f16, uint16_t, LOAD_F16, f16)
FLOAT_DOT2(vec_dot_bf16, uint16_t, LOAD_BF16, ed_bf16_to_f32)

/* hsum_f32x8 of 8 vectors at once: the same tree (lane i plus lane i + 4, then + 2, + 1), several
 * vectors' partial sums side by side in one register, so the same bits; hsum_f32x8(v[o]) lands in lane
 * 4 * (o % 2) + o / 2 */
static inline __m256 hsum8_f32x8(const __m256 v[8]) {
    __m256 e[4], f[2];
    for (int p = 0; p < 4; p++) /* [e of v[2p] | e of v[2p + 1]], e[i] = v[i] + v[i + 4] */
        e[p] = _mm256_add_ps(_mm256_permute2f128_ps(v[2 * p], v[2 * p + 1], 0x20),
                             _mm256_permute2f128_ps(v[2 * p], v[2 * p + 1], 0x31));
    for (int q = 0; q < 2; q++) /* [g of v[4q], of v[4q + 2] | of v[4q + 1], of v[4q + 3]], g[i] = e[i] + e[i + 2] */
        f[q] = _mm256_add_ps(_mm256_shuffle_ps(e[2 * q], e[2 * q + 1], 0x44),
                             _mm256_shuffle_ps(e[2 * q], e[2 * q + 1], 0xEE));
    return _mm256_add_ps(_mm256_shuffle_ps(f[0], f[1], 0x88), _mm256_shuffle_ps(f[0], f[1], 0xDD));
}

/* v stays in a register: loaded once for both weight rows, not folded into each FMA */
#define ED_IN_REGISTER(v) __asm__("" : "+x"(v))

/* Prompts over F16 / BF16 weights (ed_float_gemm_fn): float32 activation rows holding their f16 / bf16
 * values, so only the weights are converted. vec_dot's two accumulators per output are independent
 * chains, so a tile of NR weight rows x NC activation rows runs CH of them at a time, a pass each, in
 * AVX2's 16 registers (FLOAT_GEMM: BF16's 2 x 6 x 1 chain, two passes, 2 conversions of two instructions
 * each and 6 loads per 12 FMAs), or both in one pass (FLOAT_GEMM_2CH: 2 x 3 x 2). Each accumulator sees
 * vec_dot's FMAs in vec_dot's order, then a0 + a1 and hsum_f32x8's tree (hsum8_f32x8): its bits. */
#define GEMM_STEP(T, LOAD, NR, i, h)                                                                        \
    {                                                                                                       \
        __m256 w[NR];                                                                                       \
        for (int r = 0; r < nr; r++) w[r] = LOAD((const T *)(vx + r * bx) + (i));                           \
        for (int c = 0; c < nc; c++) {                                                                      \
            __m256 v = _mm256_loadu_ps(y + c * ly + (i));                                                   \
            ED_IN_REGISTER(v);                                                                              \
            for (int r = 0; r < nr; r++) a[h][r][c] = _mm256_fmadd_ps(w[r], v, a[h][r][c]);                 \
        }                                                                                                   \
    }
/* accumulators q .. q + CH - 1 of every output over elements [k0, k0 + kb), resumed from and kept in acc
 * (pass 0 also takes the last 8-element steps into accumulator 0; kb: a multiple of 32, or all of n) */
#define GEMM_PASS(T, LOAD, NR, NC, CH, q)                                                                   \
    {                                                                                                       \
        __m256 a[CH][NR][NC];                                                                               \
        for (int h = 0; h < (CH); h++)                                                                      \
            for (int r = 0; r < nr; r++)                                                                    \
                for (int c = 0; c < nc; c++) a[h][r][c] = acc[(q) + h][r][c];                               \
        for (int i = k0 + 8 * (q); i < kend16; i += 16)                                                     \
            for (int h = 0; h < (CH); h++) GEMM_STEP(T, LOAD, NR, i + 8 * h, h)                             \
        if ((q) == 0)                                                                                       \
            for (int i = n16; i < kend8; i += 8) GEMM_STEP(T, LOAD, NR, i, 0) /* k0 <= n16 */             \
        for (int h = 0; h < (CH); h++)                                                                      \
            for (int r = 0; r < nr; r++)                                                                    \
                for (int c = 0; c < nc; c++) acc[(q) + h][r][c] = a[h][r][c];                               \
    }
/* NR x NC tiles of CH of the two chains a pass, K in blocks of 512 past KMAX elements (a tile's rows stay
 * in L1 for its passes); the weight rows in blocks of about GEMM_L2_BYTES (outer: a thread's share of a matrix can
 * outgrow a 512 KiB L2), activation rows NC at a time (they stay in L1), the block's weight rows NR at a
 * time */
#define FLOAT_GEMM(name, T, LOAD, CONV, NR, NC, CH, KMAX, CASES)                                             \
    ED_ALWAYS_INLINE void name##_tile(int n, float *s, size_t bs, const uint8_t *vx, size_t bx, const float *y, \
                                      size_t ly, const int nr, const int nc) {                              \
        const int n16 = n & ~15, n8 = n & ~7; /* n8 - n16: the last 8-element step */                      \
        __m256 acc[2][NR][NC];                                                                              \
        for (int q = 0; q < 2; q++)                                                                         \
            for (int r = 0; r < nr; r++)                                                                    \
                for (int c = 0; c < nc; c++) acc[q][r][c] = _mm256_setzero_ps();                            \
        const int kb = n <= (KMAX) ? n : 512;                                                               \
        for (int k0 = 0; k0 < n8; k0 += kb) {                                                               \
            const int kend16 = k0 + kb < n16 ? k0 + kb : n16;                                               \
            const int kend8 = k0 + kb < n8 ? k0 + kb : n8;                                                  \
            for (int q = 0; q < 2; q += (CH)) GEMM_PASS(T, LOAD, NR, NC, CH, q)                             \
        }                                                                                                   \
        float sums[2][8];                                                                                   \
        for (int half = 0; half < 2; half++) {                                                              \
            if (8 * half >= nr * nc) break;                                                                 \
            __m256 v[8];                                                                                    \
            for (int j = 0; j < 8; j++) {                                                                   \
                const int o = 8 * half + j, r = o % nr, c = o / nr; /* output o: row c, weight row r */      \
                v[j] = o < nr * nc ? _mm256_add_ps(acc[0][r][c], acc[1][r][c]) : _mm256_setzero_ps();         \
            }                                                                                               \
            _mm256_storeu_ps(sums[half], hsum8_f32x8(v));                                                   \
        }                                                                                                   \
        for (int c = 0; c < nc; c++)                                                                        \
            for (int r = 0; r < nr; r++) {                                                                  \
                const T *x = (const T *)(vx + r * bx);                                                      \
                const int o = c * nr + r, j = o % 8;                                                        \
                float sumf = sums[o / 8][4 * (j % 2) + j / 2];                                              \
                for (int i = n8; i < n; i++) sumf += CONV(x[i]) * y[c * ly + i];                            \
                s[c * bs + r] = sumf;                                                                       \
            }                                                                                               \
    }                                                                                                       \
    FLOAT_GEMM_DRIVER(name, NR, NC, CASES)
/* the GEMM over a level's tiles (name##_tile, NR x NC at most) */
#define FLOAT_GEMM_DRIVER(name, NR, NC, CASES)                                                              \
    static void name##_block(int n, float *s, size_t bs, const uint8_t *vx, size_t bx, int nr, const float *y, \
                             size_t ly, int nc) {                                                           \
        for (int c0 = 0; c0 < nc; c0 += (NC)) {                                                             \
            const int cn = nc - c0 < (NC) ? nc - c0 : (NC);                                                 \
            const float *yc = y + (size_t)c0 * ly;                                                          \
            for (int r0 = 0; r0 < nr; r0 += (NR)) {                                                         \
                const uint8_t *x = vx + (size_t)r0 * bx;                                                    \
                float *sc = s + (size_t)c0 * bs + r0;                                                       \
                switch ((nr - r0 < (NR) ? nr - r0 : (NR)) * 16 + cn) { CASES(name) } /* constant shapes */  \
            }                                                                                               \
        }                                                                                                   \
    }                                                                                                       \
    static void name(int n, float *s, size_t bs, const void *vx, size_t bx, int nr, const float *y, size_t ly, \
                     int nc) {                                                                              \
        const int rb = GEMM_L2_BYTES / bx >= (NR) ? (int)(GEMM_L2_BYTES / bx / (NR) * (NR)) : (NR);         \
        for (int b0 = 0; b0 < nr; b0 += rb)                                                                 \
            name##_block(n, s + b0, bs, (const uint8_t *)vx + (size_t)b0 * bx, bx, nr - b0 < rb ? nr - b0 : rb, \
                         y, ly, nc);                                                                        \
    }
#ifndef GEMM_L2_BYTES
#define GEMM_L2_BYTES (192 * 1024)
#endif

#define GEMM_CASE(name, R, C)                                                                               \
    case R * 16 + C: name##_tile(n, sc, bs, x, bx, yc, ly, R, C); break;
#define GEMM_CASES_NC6(name, R)                                                                             \
    GEMM_CASE(name, R, 1) GEMM_CASE(name, R, 2) GEMM_CASE(name, R, 3) GEMM_CASE(name, R, 4)                 \
    GEMM_CASE(name, R, 5) GEMM_CASE(name, R, 6)
#define GEMM_CASES_2X6(name) GEMM_CASES_NC6(name, 2) GEMM_CASES_NC6(name, 1)

#define GEMM_CASES_2X3(name)                                                                                \
    GEMM_CASE(name, 2, 1) GEMM_CASE(name, 2, 2) GEMM_CASE(name, 2, 3) GEMM_CASE(name, 1, 1)                 \
    GEMM_CASE(name, 1, 2) GEMM_CASE(name, 1, 3)
/* Both chains an output in one pass over K, 2 weight rows x 3 activation rows: per 8-element step 2
 * conversions and 3 loads for 6 FMAs in 15 registers (the two weight vectors, then each activation vector
 * loaded once for both: GEMM_STEP). */
#define FLOAT_GEMM_2CH(name, T, LOAD, CONV)                                                                 \
    ED_ALWAYS_INLINE void name##_tile(int n, float *s, size_t bs, const uint8_t *vx, size_t bx, const float *y, \
                                      size_t ly, const int nr, const int nc) {                              \
        const int n16 = n & ~15, n8 = n & ~7;                                                               \
        __m256 a[2][2][3];                                                                                  \
        for (int h = 0; h < 2; h++)                                                                         \
            for (int r = 0; r < nr; r++)                                                                    \
                for (int c = 0; c < nc; c++) a[h][r][c] = _mm256_setzero_ps();                              \
        for (int i = 0; i < n16; i += 16) {                                                                 \
            GEMM_STEP(T, LOAD, 2, i, 0)                                                                     \
            GEMM_STEP(T, LOAD, 2, i + 8, 1)                                                                 \
        }                                                                                                   \
        if (n8 > n16) GEMM_STEP(T, LOAD, 2, n16, 0)                                                         \
        __m256 v[8];                                                                                        \
        for (int o = 0; o < 8; o++) /* output o: activation row o / nr, weight row o % nr */                \
            v[o] = o < nr * nc ? _mm256_add_ps(a[0][o % nr][o / nr], a[1][o % nr][o / nr])                  \
                               : _mm256_setzero_ps();                                                       \
        float sums[8];                                                                                      \
        _mm256_storeu_ps(sums, hsum8_f32x8(v));                                                             \
        for (int c = 0; c < nc; c++)                                                                        \
            for (int r = 0; r < nr; r++) {                                                                  \
                const T *x = (const T *)(vx + r * bx);                                                      \
                const int o = c * nr + r;                                                                   \
                float sumf = sums[4 * (o % 2) + o / 2];                                                     \
                for (int i = n8; i < n; i++) sumf += CONV(x[i]) * y[c * ly + i];                            \
                s[c * bs + r] = sumf;                                                                       \
            }                                                                                               \
    }                                                                                                       \
    FLOAT_GEMM_DRIVER(name, 2, 3, GEMM_CASES_2X3)
FLOAT_GEMM_2CH(f16_gemm, uint16_t, LOAD_F16, f16)
FLOAT_GEMM_2CH(bf16_gemm_1, uint16_t, LOAD_BF16, ed_bf16_to_f32)
FLOAT_GEMM(bf16_gemm_2, uint16_t, LOAD_BF16, ed_bf16_to_f32, 2, 6, 1, 1024, GEMM_CASES_2X6)
/* BF16: rows up to 1024 elements in 2 x 6 tiles, a pass per chain (2 conversions and 6 loads per 12
 * FMAs); longer rows in f16_gemm's 2 x 3 tiles, one pass (a Zen 3 thread, GFLOP/s, k 576 / 896 / 1536 /
 * 4864: 2 x 6 70 / 73 / 54 / 52, 2 x 3 62 / 66 / 66 / 66; the same bits) */
static void bf16_gemm(int n, float *s, size_t bs, const void *vx, size_t bx, int nr, const float *y, size_t ly,
                      int nc) {
    (n <= 1024 ? bf16_gemm_2 : bf16_gemm_1)(n, s, bs, vx, bx, nr, y, ly, nc);
}

#include "avx2_x16.h"

#if defined(__clang__)
#pragma clang attribute pop
#elif defined(__GNUC__)
#pragma GCC pop_options
#endif

int ed_fill_avx2(ed_kernel_table *t) {
    ed_table_init_common(t, ED_LEVEL_AVX2);
    t->types[ED_Q4_0].vec_dot = vec_dot_q4_0;
    t->types[ED_Q4_1].vec_dot = vec_dot_q4_1;
    t->types[ED_Q5_0].vec_dot = vec_dot_q5_0;
    t->types[ED_Q5_1].vec_dot = vec_dot_q5_1;
    t->types[ED_Q8_0].vec_dot = vec_dot_q8_0;
    t->types[ED_IQ4_NL].vec_dot = vec_dot_iq4_nl;
    t->types[ED_Q4_K].vec_dot = vec_dot_q4_K;
    t->types[ED_Q5_K].vec_dot = vec_dot_q5_K;
    t->types[ED_Q6_K].vec_dot = vec_dot_q6_K;
    t->types[ED_F16].vec_dot = vec_dot_f16, t->types[ED_F16].float_gemm = f16_gemm;
    t->types[ED_Q4_0].vec_dot_nx = vec_dot_nx_q4_0;
    t->types[ED_Q4_1].vec_dot_nx = vec_dot_nx_q4_1;
    t->types[ED_Q5_0].vec_dot_nx = vec_dot_nx_q5_0;
    t->types[ED_Q5_1].vec_dot_nx = vec_dot_nx_q5_1;
    t->types[ED_Q8_0].vec_dot_nx = vec_dot_nx_q8_0;
    t->types[ED_Q4_K].vec_dot_nx = vec_dot_nx_q4_K;
    t->types[ED_Q5_K].vec_dot_nx = vec_dot_nx_q5_K;
    t->types[ED_Q6_K].vec_dot_nx = vec_dot_nx_q6_K;
    ed_fill_avx2_q23k(t); /* Q2_K, Q3_K: avx2_q23k.c */
    t->types[ED_BF16].vec_dot = vec_dot_bf16, t->types[ED_BF16].float_gemm = bf16_gemm;
    t->types[ED_F32].vec_dot = vec_dot_f32;
    t->from_float[ED_Q8_0] = quantize_q8_0;
    t->from_float[ED_Q8_1] = quantize_q8_1;
    t->from_float[ED_Q8_K] = quantize_q8_K;
    t->from_float[ED_F16] = convert_f16;
    t->from_float[ED_BF16] = convert_bf16;
    t->from_float[ED_F32] = convert_f32;
    if (ed_repack_enabled()) set_x16_avx2(t);
    return 1;
}

#else
int ed_fill_avx2(ed_kernel_table *t) {
    (void)t;
    return 0;
}
#endif
