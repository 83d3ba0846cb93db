/* AVX2 + FMA + F16C dots of the low-bit K-quants Q2_K and Q3_K against Q8_K, single row and one weight row
 * x up to ED_NX_MAX activation rows; ed_fill_avx2 (avx2.c) puts them in the AVX2 table.
 *
 * Mirrors ggml-org/llama.cpp ggml/src/ggml-cpu/arch/x86/quants.c, the __AVX2__ branches of
 * ggml_vec_dot_q2_K_q8_K and ggml_vec_dot_q3_K_q8_K: 32 quants per vpmaddubsw, the 16-element sub-block
 * scales spread by get_scale_shuffle_q3k, Q2_K's mins against Q8_K's bsums. One difference in Q3_K: ggml
 * forms q - 4 (third bit clear) with a second vpmaddubsw and a subtraction per 32 quants; here the quants
 * stay unsigned (0..7) and 4 * Σ scale * bsum comes off once per super-block, as ggml's own Q6_K kernel
 * takes off its +32. The integer sums are the same; about 2 of 11 vector instructions per 32 quants go.
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

#define ED_ALWAYS_INLINE static inline __attribute__((always_inline))

static inline float hsum_f32x8(__m256 x) {
    __m128 r = _mm_add_ps(_mm256_extractf128_ps(x, 1), _mm256_castps256_ps128(x));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

static inline const block_q8_K *row(const void *vy, size_t by, int c, int i) {
    return (const block_q8_K *)((const uint8_t *)vy + c * by) + i;
}

/* 16 int8 scales widened to int16: sc[0] holds scales 0..7 in both 128-bit lanes, sc[1] scales 8..15 */
static inline __m256i widen_scales(__m128i s8, __m256i sc[2]) {
    const __m256i all = _mm256_cvtepi8_epi16(s8);
    const __m128i lo = _mm256_castsi256_si128(all), hi = _mm256_extracti128_si256(all, 1);
    sc[0] = _mm256_set_m128i(lo, lo);
    sc[1] = _mm256_set_m128i(hi, hi);
    return all;
}

/* ggml get_scale_shuffle_q3k: row k spreads int16 scale 2k (of the 8 in each lane) across the low 128-bit
 * lane and 2k+1 across the high one. A table, as in ggml: vpshufb takes it as a memory operand, where
 * 4 constants in registers would crowd out the multi-row kernels' accumulators. */
static const uint8_t k_shuffle_q3k[4][32] __attribute__((aligned(32))) = {
    {0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3},
    {4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7},
    {8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11},
    {12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15,
     14, 15, 14, 15},
};

static inline __m256i scale_q3k(__m256i sc, int k) {
    return _mm256_shuffle_epi8(sc, _mm256_load_si256((const __m256i *)k_shuffle_q3k[k]));
}

/* 128 quants (q[k]: 32 of them, unsigned) against q8[0..127]: int32 lanes of Σ scale * q * q8 */
static inline __m256i dot128(const __m256i q[4], __m256i sc, const int8_t *q8) {
    __m256i p[4];
    for (int k = 0; k < 4; k++) {
        p[k] = _mm256_maddubs_epi16(q[k], _mm256_loadu_si256((const __m256i *)(q8 + 32 * k)));
        p[k] = _mm256_madd_epi16(scale_q3k(sc, k), p[k]);
    }
    return _mm256_add_epi32(_mm256_add_epi32(p[0], p[1]), _mm256_add_epi32(p[2], p[3]));
}

/* Q2_K/Q3_K: bits 2k, 2k+1 of qs[0..31] are the low bits of quants 32k .. 32k+31 of a 128-element half */
static inline void unpack_q2(const uint8_t *qs, __m256i q[4]) {
    const __m256i m3 = _mm256_set1_epi8(3);
    const __m256i bits = _mm256_loadu_si256((const __m256i *)qs);
    q[0] = _mm256_and_si256(bits, m3);
    q[1] = _mm256_and_si256(_mm256_srli_epi16(bits, 2), m3);
    q[2] = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m3);
    q[3] = _mm256_and_si256(_mm256_srli_epi16(bits, 6), m3);
}

/* Q3_K quants 0..7 (q + 4): the low bits | bit k of hb (this half's hmask bits at 0..3) moved to bit 2.
 * 16-bit shifts by at most 2 keep every bit that survives the mask inside its own byte (and hb, hmask >> 4
 * for the second half, takes bits 0..3 of each byte from bits 4..7 of the same byte). */
static inline void unpack_q3(const uint8_t *qs, __m256i hb, __m256i q[4]) {
    const __m256i b2 = _mm256_set1_epi8(4);
    unpack_q2(qs, q);
    q[0] = _mm256_or_si256(q[0], _mm256_and_si256(_mm256_slli_epi16(hb, 2), b2));
    q[1] = _mm256_or_si256(q[1], _mm256_and_si256(_mm256_slli_epi16(hb, 1), b2));
    q[2] = _mm256_or_si256(q[2], _mm256_and_si256(hb, b2));
    q[3] = _mm256_or_si256(q[3], _mm256_and_si256(_mm256_srli_epi16(hb, 1), b2));
}

/* ------------------------------------------------------------------------------------------ Q2_K */

/* per block: scales (low nibbles) as sc[2]; mins (high nibbles) as int16 */
static inline __m256i q2_scales(const block_q2_K *x, __m256i sc[2]) {
    const __m128i m4 = _mm_set1_epi8(0xF);
    const __m128i ms = _mm_loadu_si128((const __m128i *)x->scales);
    widen_scales(_mm_and_si128(ms, m4), sc);
    return _mm256_cvtepi8_epi16(_mm_and_si128(_mm_srli_epi16(ms, 4), m4));
}

/* Σ mins * bsums as 8 int32 lanes */
static inline __m256 q2_mins(__m256i mins, const block_q8_K *y) {
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(mins, _mm256_loadu_si256((const __m256i *)y->bsums)));
}

static void vec_dot_q2_K(int n, float *s, const void *vx, const void *vy) {
    const block_q2_K *x = vx;
    const block_q8_K *y = vy;
    __m256 acc = _mm256_setzero_ps();
    for (int i = 0; i < n / QK_K; i++) {
        const float d = y[i].d * ed_f16_table[ed_load_u16(&x[i].d)];
        const float dmin = -y[i].d * ed_f16_table[ed_load_u16(&x[i].dmin)];
        __m256i sc[2];
        const __m256i mins = q2_scales(&x[i], sc);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(dmin), q2_mins(mins, &y[i]), acc);
        __m256i sumi = _mm256_setzero_si256();
        for (int j = 0; j < QK_K / 128; j++) {
            __m256i q[4];
            unpack_q2(x[i].qs + 32 * j, q);
            sumi = _mm256_add_epi32(sumi, dot128(q, sc[j], y[i].qs + 128 * j));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    *s = hsum_f32x8(acc);
}

/* Per row, vec_dot_q2_K's float operations in its order; the weight half-blocks unpacked once for all rows */
ED_ALWAYS_INLINE void vec_dot_nx_q2_K_n(int n, float *s, size_t bs, const block_q2_K *x, const void *vy, size_t by,
                                        const int nc) {
    __m256 acc[ED_NX_MAX];
    for (int c = 0; c < nc; c++) acc[c] = _mm256_setzero_ps();
    for (int i = 0; i < n / QK_K; i++) {
        const float xd = ed_f16_table[ed_load_u16(&x[i].d)], xdmin = ed_f16_table[ed_load_u16(&x[i].dmin)];
        __m256i sc[2], sumi[ED_NX_MAX];
        const __m256i mins = q2_scales(&x[i], sc);
        for (int c = 0; c < nc; c++) {
            const block_q8_K *y = row(vy, by, c, i);
            acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(-y->d * xdmin), q2_mins(mins, y), acc[c]);
            sumi[c] = _mm256_setzero_si256();
        }
        for (int j = 0; j < QK_K / 128; j++) {
            __m256i q[4];
            unpack_q2(x[i].qs + 32 * j, q);
            for (int c = 0; c < nc; c++)
                sumi[c] = _mm256_add_epi32(sumi[c], dot128(q, sc[j], row(vy, by, c, i)->qs + 128 * j));
        }
        for (int c = 0; c < nc; c++)
            acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(row(vy, by, c, i)->d * xd), _mm256_cvtepi32_ps(sumi[c]), acc[c]);
    }
    for (int c = 0; c < nc; c++) s[c * bs] = hsum_f32x8(acc[c]);
}

/* ------------------------------------------------------------------------------------------ Q3_K */

/* per block: the 16 scales - 32 as sc[2] and as one int16 vector. ed_unpack_scales_q3 in SIMD: scale j is
 * the low (j < 8) or high nibble of scales[j % 8] | bits 2(j/4), 2(j/4)+1 of scales[8 + j % 4] at bits 4, 5
 * (the scalar shuffle's 4-byte stores, read back as one 16-byte vector, would stall store forwarding) */
static inline __m256i q3_scales(const block_q3_K *x, __m256i sc[2]) {
    const __m128i m4 = _mm_set1_epi8(0x0F);
    uint32_t top;
    memcpy(&top, x->scales + 8, 4);
    const __m128i lo = _mm_loadl_epi64((const __m128i *)x->scales);
    const __m128i nib = _mm_unpacklo_epi64(_mm_and_si128(lo, m4), _mm_and_si128(_mm_srli_epi16(lo, 4), m4));
    const __m128i hb = _mm_srlv_epi32(_mm_set1_epi32((int)top), _mm_setr_epi32(0, 2, 4, 6));
    const __m128i s6 = _mm_or_si128(nib, _mm_slli_epi16(_mm_and_si128(hb, _mm_set1_epi8(3)), 4));
    return widen_scales(_mm_sub_epi8(s6, _mm_set1_epi8(32)), sc);
}

/* 4 * Σ scale * bsum: what the +4 of the unsigned quants added */
static inline __m256i q3_bias(__m256i scales, const block_q8_K *y) {
    const __m256i bsums = _mm256_loadu_si256((const __m256i *)y->bsums);
    return _mm256_slli_epi32(_mm256_madd_epi16(bsums, scales), 2);
}

static void vec_dot_q3_K(int n, float *s, const void *vx, const void *vy) {
    const block_q3_K *x = vx;
    const block_q8_K *y = vy;
    __m256 acc = _mm256_setzero_ps();
    for (int i = 0; i < n / QK_K; i++) {
        const float d = y[i].d * ed_f16_table[ed_load_u16(&x[i].d)];
        __m256i sc[2];
        const __m256i bias = q3_bias(q3_scales(&x[i], sc), &y[i]);
        const __m256i hbits = _mm256_loadu_si256((const __m256i *)x[i].hmask);
        __m256i sumi = _mm256_setzero_si256();
        for (int j = 0; j < QK_K / 128; j++) {
            __m256i q[4];
            unpack_q3(x[i].qs + 32 * j, j ? _mm256_srli_epi16(hbits, 4) : hbits, q);
            sumi = _mm256_add_epi32(sumi, dot128(q, sc[j], y[i].qs + 128 * j));
        }
        sumi = _mm256_sub_epi32(sumi, bias);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    *s = hsum_f32x8(acc);
}

ED_ALWAYS_INLINE void vec_dot_nx_q3_K_n(int n, float *s, size_t bs, const block_q3_K *x, const void *vy, size_t by,
                                        const int nc) {
    __m256 acc[ED_NX_MAX];
    for (int c = 0; c < nc; c++) acc[c] = _mm256_setzero_ps();
    for (int i = 0; i < n / QK_K; i++) {
        const float xd = ed_f16_table[ed_load_u16(&x[i].d)];
        __m256i sc[2], sumi[ED_NX_MAX], bias[ED_NX_MAX];
        const __m256i scales = q3_scales(&x[i], sc);
        for (int c = 0; c < nc; c++) {
            bias[c] = q3_bias(scales, row(vy, by, c, i));
            sumi[c] = _mm256_setzero_si256();
        }
        const __m256i hbits = _mm256_loadu_si256((const __m256i *)x[i].hmask);
        for (int j = 0; j < QK_K / 128; j++) {
            __m256i q[4];
            unpack_q3(x[i].qs + 32 * j, j ? _mm256_srli_epi16(hbits, 4) : hbits, q);
            for (int c = 0; c < nc; c++)
                sumi[c] = _mm256_add_epi32(sumi[c], dot128(q, sc[j], row(vy, by, c, i)->qs + 128 * j));
        }
        for (int c = 0; c < nc; c++) {
            const __m256 si = _mm256_cvtepi32_ps(_mm256_sub_epi32(sumi[c], bias[c]));
            acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(row(vy, by, c, i)->d * xd), si, acc[c]);
        }
    }
    for (int c = 0; c < nc; c++) s[c * bs] = hsum_f32x8(acc[c]);
}

/* the table entries: groups of 4, then 3 or 2, a last single row through vec_dot itself */
#define NX_ENTRY(name, single, XT)                                                                          \
    static void name(int n, float *s, size_t bs, const void *vx, const void *vy, size_t by, int nc) {      \
        const uint8_t *y = vy;                                                                              \
        const XT *x = vx;                                                                                   \
        for (; nc >= 4; nc -= 4, s += 4 * bs, y += 4 * by) name##_n(n, s, bs, x, y, by, 4);                 \
        if (nc == 3) name##_n(n, s, bs, x, y, by, 3);                                                       \
        else if (nc == 2) name##_n(n, s, bs, x, y, by, 2);                                                  \
        else if (nc == 1) single(n, s, vx, y);                                                              \
    }

NX_ENTRY(vec_dot_nx_q2_K, vec_dot_q2_K, block_q2_K)
NX_ENTRY(vec_dot_nx_q3_K, vec_dot_q3_K, block_q3_K)

#if defined(__clang__)
#pragma clang attribute pop
#elif defined(__GNUC__)
#pragma GCC pop_options
#endif

void ed_fill_avx2_q23k(ed_kernel_table *t) {
    t->types[ED_Q2_K].vec_dot = vec_dot_q2_K;
    t->types[ED_Q3_K].vec_dot = vec_dot_q3_K;
    t->types[ED_Q2_K].vec_dot_nx = vec_dot_nx_q2_K;
    t->types[ED_Q3_K].vec_dot_nx = vec_dot_nx_q3_K;
}

#else
void ed_fill_avx2_q23k(ed_kernel_table *t) { (void)t; }
#endif
