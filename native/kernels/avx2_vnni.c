/* The legacy types' repacked (x16) GEMM at the AVX2 level on CPUs with AVX-VNNI (the VEX vpdpbusd of Intel's
 * Alder Lake and later cores, Zen 5): set over the AVX2 table's entries by set_x16_avx2 (avx2_x16.h) where
 * ed_cpu_has_avxvnni(). The layout and the float steps are x16a_legacy_nc's; the integer dots are the
 * AVX-512 VNNI kernels' (avx512_x16.h, ED_X16_GEMM) at 256 bits: each weight vector as unsigned bytes
 * (nibbles, Q5's fifth bits, Q8_0's stored x + 128, IQ4_NL's values + 128) against the activation's signed
 * bytes, the offset taken off once per block as -offset x the block's sum (the side table), so one
 * instruction per 32 products where vpmaddubsw, an int16 add and vpmaddwd took three. The integers are
 * exact, so the bits are the AVX2 and AVX-512 kernels' (kernel_check's x16_ref checks all three).
 * EDGELLM_AVXVNNI=0 keeps the plain AVX2 kernels.
 */
#include <string.h>

#include "ed_blocks.h"

#if defined(ED_BUILD_AVXVNNI)
#include <immintrin.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avxvnni"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avxvnni")
#endif

#define ED_ALWAYS_INLINE static inline __attribute__((always_inline))
#define ED_X16V_NC 4 /* activation rows per call, as ED_X16A_NC */

static inline __m256i x16v_bcast4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

static inline __m256i x16v_load(const uint8_t *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* 32 bits -> 32 bytes, 16 where the bit is set (a Q5 block's fifth bits) */
static inline __m256i x16v_fifth(const uint8_t *p) {
    uint32_t x;
    memcpy(&x, p, 4);
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32((int)x), shuf);
    b = _mm256_or_si256(b, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    return _mm256_and_si256(_mm256_cmpeq_epi8(b, _mm256_set1_epi64x(-1)), _mm256_set1_epi8(16));
}

/* the sums of one half's 8 rows (row 8h + r) against nc rows to s[c * bs + 8h + r], r < nr - 8h */
static inline void x16v_store(float *s, size_t bs, const __m256 *acc, int h, int nr, int nc) {
    const int n = nr - 8 * h < 8 ? nr - 8 * h : 8;
    for (int c = 0; c < nc; c++) {
        if (n == 8) {
            _mm256_storeu_ps(s + c * bs + 8 * h, acc[c]);
        } else if (n > 0) {
            float t[8];
            _mm256_storeu_ps(t, acc[c]);
            memcpy(s + c * bs + 8 * h, t, sizeof(float) * (size_t)n);
        }
    }
}

/* a half's weight vector v (0..7) of a group block's quants q (x16a_vector's), as unsigned bytes; iq4:
 * IQ4_NL's values + 128 in both lanes */
ED_ALWAYS_INLINE __m256i x16v_vector(int type, const uint8_t *q, int h, int v, __m256i iq4) {
    if (type == ED_Q8_0) return x16v_load(q + 64 * v + 32 * h);
    const int q5 = type == ED_Q5_0 || type == ED_Q5_1;
    const uint8_t *nib = q + (q5 ? 64 : 0) + 64 * (v / 2) + 32 * h;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256i w = _mm256_and_si256(v & 1 ? _mm256_srli_epi16(x16v_load(nib), 4) : x16v_load(nib), m4);
    if (q5) w = _mm256_or_si256(w, x16v_fifth(q + 8 * v + 4 * h));
    if (type == ED_IQ4_NL) w = _mm256_shuffle_epi8(iq4, w);
    return w;
}

/* x16a_legacy_nc's contract: nr (<= 16) rows of a group against nc (<= ED_X16V_NC) activation rows */
ED_ALWAYS_INLINE void x16v_legacy_nc(int type, int n, float *s, size_t bs, const uint8_t *vx, int nr, const uint8_t *vy,
                                     size_t by, const uint8_t *side, size_t side_row, const int nc) {
    const int q41 = type == ED_Q4_1 || type == ED_Q5_1; /* against Q8_1, with mins */
    const int nb = n / QK, qbytes = type == ED_Q8_0 ? 32 : type == ED_Q5_0 ? 20 : type == ED_Q5_1 ? 22 : q41 ? 18 : 16;
    const int off = type == ED_Q4_0 ? 8 : type == ED_Q5_0 ? 16 : type == ED_Q8_0 || type == ED_IQ4_NL ? 128 : 0;
    const size_t gb = (size_t)ED_X16_ROWS * (2 + qbytes), yb = q41 ? sizeof(block_q8_1) : sizeof(block_q8_0);
    const __m256i iq4 = _mm256_xor_si256(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)ed_kvalues_iq4nl)),
                                         _mm256_set1_epi8((char)0x80));
    for (int h = 0; h * 8 < nr; h++) {
        __m256 acc[ED_X16V_NC];
        for (int c = 0; c < nc; c++) acc[c] = _mm256_setzero_ps();
        for (int b = 0; b < nb; b++) {
            const uint8_t *g = vx + (size_t)b * gb;
            __m256i i0[ED_X16V_NC], i1[ED_X16V_NC];
            for (int c = 0; c < nc; c++) {
                const int32_t *ys = off ? (const int32_t *)((const float *)(side + c * side_row) + nb) : NULL;
                i0[c] = _mm256_set1_epi32(off ? -off * ys[b] : 0);
                i1[c] = _mm256_setzero_si256();
            }
            for (int v = 0; v < 8; v++) {
                const __m256i w = x16v_vector(type, g + (q41 ? Q41_QS : 32), h, v, iq4);
                const int yo = type == ED_Q8_0 ? 4 * v : (v & 1) * 16 + 4 * (v / 2);
                for (int c = 0; c < nc; c++) {
                    const uint8_t *yblk = vy + c * by + (size_t)b * yb;
                    const __m256i y = x16v_bcast4((const int8_t *)yblk + (q41 ? 4 : 2) + yo); /* past d (, s) */
                    if (v & 1) i1[c] = _mm256_dpbusd_avx_epi32(i1[c], w, y);
                    else i0[c] = _mm256_dpbusd_avx_epi32(i0[c], w, y);
                }
            }
            const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(g + 16 * h)));
            for (int c = 0; c < nc; c++) {
                const __m256i isum = _mm256_add_epi32(i0[c], i1[c]);
                if (q41) {
                    const block_q8_1 *y = (const block_q8_1 *)(vy + c * by) + b;
                    const __m256 mw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(g + Q41_MIN + 16 * h)));
                    const __m256 sc = _mm256_mul_ps(dw, _mm256_set1_ps(ed_f16_to_f32(y->d)));
                    acc[c] = _mm256_fmadd_ps(sc, _mm256_cvtepi32_ps(isum), acc[c]);
                    acc[c] = _mm256_fmadd_ps(mw, _mm256_set1_ps(ed_f16_to_f32(y->s)), acc[c]);
                } else {
                    const float *yd = (const float *)(side + c * side_row);
                    const __m256 sc = _mm256_mul_ps(dw, _mm256_set1_ps(yd[b]));
                    acc[c] = _mm256_fmadd_ps(sc, _mm256_cvtepi32_ps(isum), acc[c]);
                }
            }
        }
        x16v_store(s, bs, acc, h, nr, nc);
    }
}

/* x16_gemm entries: nc in calls of ED_X16V_NC, then the rest (a constant per instance) */
#define ED_X16V_ENTRY(name, TYPE)                                                                           \
    static void name(int n, float *s, size_t bs, const void *vx, int nr, const void *vy, size_t by,           \
                     const void *side, size_t side_row, int nc) {                                             \
        const uint8_t *y = vy, *sd = side;                                                                    \
        for (; nc >= ED_X16V_NC; nc -= ED_X16V_NC, s += ED_X16V_NC * bs, y += ED_X16V_NC * by,                \
                                 sd += sd ? ED_X16V_NC * side_row : 0)                                         \
            x16v_legacy_nc(TYPE, n, s, bs, vx, nr, y, by, sd, side_row, ED_X16V_NC);                          \
        if (nc == 3) x16v_legacy_nc(TYPE, n, s, bs, vx, nr, y, by, sd, side_row, 3);                          \
        else if (nc == 2) x16v_legacy_nc(TYPE, n, s, bs, vx, nr, y, by, sd, side_row, 2);                     \
        else if (nc == 1) x16v_legacy_nc(TYPE, n, s, bs, vx, nr, y, by, sd, side_row, 1);                     \
    }
ED_X16V_ENTRY(x16v_gemm_q4_0, ED_Q4_0)
ED_X16V_ENTRY(x16v_gemm_q4_1, ED_Q4_1)
ED_X16V_ENTRY(x16v_gemm_q5_0, ED_Q5_0)
ED_X16V_ENTRY(x16v_gemm_q5_1, ED_Q5_1)
ED_X16V_ENTRY(x16v_gemm_q8_0, ED_Q8_0)
ED_X16V_ENTRY(x16v_gemm_iq4_nl, ED_IQ4_NL)
#undef ED_X16V_ENTRY

int ed_set_x16_avxvnni(ed_kernel_table *t) {
    t->types[ED_Q4_0].x16_gemm = x16v_gemm_q4_0;
    t->types[ED_Q4_1].x16_gemm = x16v_gemm_q4_1;
    t->types[ED_Q5_0].x16_gemm = x16v_gemm_q5_0;
    t->types[ED_Q5_1].x16_gemm = x16v_gemm_q5_1;
    t->types[ED_Q8_0].x16_gemm = x16v_gemm_q8_0;
    t->types[ED_IQ4_NL].x16_gemm = x16v_gemm_iq4_nl;
    return 1;
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#else
int ed_set_x16_avxvnni(ed_kernel_table *t) { /* no x86-64, or a compiler without AVX-VNNI: the AVX2 kernels */
    (void)t;
    return 0;
}
#endif
