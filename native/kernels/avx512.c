/* AVX-512 (F, BW, VL) kernels, with a VNNI variant of the legacy-block dots; target pragmas let a build
 * without -march carry them. The activation quantizers are the AVX2 ones (bit-identical across levels).
 *
 * ggml-org/llama.cpp ggml/src/ggml-cpu/arch/x86/quants.c has no 512-bit vec_dot for these types: an
 * AVX-512 build of ggml runs its AVX2 code with _mm256_dpbusd_epi32 in mul_sum_us8_pairs_float. Here
 * the legacy dots (avx512_body.h) put two blocks in one 512-bit vector, and the K-quant dots below take 64
 * quants per vpmaddubsw, with the sub-block scales spread by vpermw; the arithmetic per block and per
 * K-quant sub-block is ggml's AVX2 one (vec_dot_q4_K_q8_K ...), so results agree to float summation order.
 *
 * Built with -DED_EMULATE_AVX512 (tests only), the same code compiles against SIMDe's portable
 * intrinsics (native/tests/avx512_emu.h) so a machine without AVX-512 can run and check it.
 */
#include "ed_blocks.h"

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
#undef ED_VNNI

/* --------------------------------------------------------------------------- K-quants (vs Q8_K) */

/* The K-quant kernels take one weight row against nc activation rows (ED_NX_ENTRIES): each weight
 * sub-block is unpacked once for all rows, and each row's float operations are vec_dot's (its d and dmin
 * products, acc_m's and acc's fmadds, the final sums), in its order; the integer sums are exact. */
#define Q8K(c, i) ((const block_q8_K *)(vy + (c) * by) + (i))

/* Q4_K and Q5_K share all but the fifth bit: 4 x 64 quants per super-block, scales 2j, 2j+1 per 64.
 * Per super-block and row the scale sums (8 int32 lanes) and the min sums (8 lanes: min k times Q8_K's
 * bsums 2k + 2k+1) meet their float factors [d x 8, -dmin x 8] (times the row's d) in one 16-lane FMA */
ED_ALWAYS_INLINE void q45_K_n(int n, float *s, size_t bs, const void *vx, const uint8_t *vy, size_t by,
                              const int nc, const int five) {
    const size_t xstride = five ? sizeof(block_q5_K) : sizeof(block_q4_K);
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m256i pairs = _mm256_set_epi16(15, 15, 14, 14, 13, 13, 12, 12, 11, 11, 10, 10, 9, 9, 8, 8);
    __m512 acc[ED_NX_MAX];
    for (int c = 0; c < nc; c++) acc[c] = _mm512_setzero_ps();
    for (int i = 0; i < n / QK_K; i++) {
        const uint8_t *xb = (const uint8_t *)vx + i * xstride;
        const block_q4_K *x4 = (const block_q4_K *)xb; /* d, dmin, scales lead both layouts */
        const uint8_t *qs = five ? ((const block_q5_K *)xb)->qs : x4->qs;
        const __m512 wf = _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(ed_f16_table[ed_load_u16(&x4->d)]),
                                               _mm512_set1_ps(-ed_f16_table[ed_load_u16(&x4->dmin)]));
        uint32_t utmp[4];
        ed_unpack_scales_k4(x4->scales, utmp);
        const __m256i mins_and_scales = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)utmp));
        const __m256i mins2 = _mm256_permutexvar_epi16(pairs, mins_and_scales); /* each min twice */
        const __m512i scales = _mm512_castsi256_si512(mins_and_scales);
        __m512i hbits = _mm512_setzero_si512();
        if (five) {
            const __m256i h = _mm256_loadu_si256((const __m256i *)((const block_q5_K *)xb)->qh);
            hbits = join256(h, h);
        }
        __m512i sumi[ED_NX_MAX];
        for (int c = 0; c < nc; c++) sumi[c] = _mm512_setzero_si512();
        for (int j = 0; j < QK_K / 64; j++) {
            const __m256i bits = _mm256_loadu_si256((const __m256i *)(qs + 32 * j));
            __m512i q = _mm512_and_si512(join256(bits, _mm256_srli_epi16(bits, 4)), m4);
            if (five) { /* bit 2j of qh for the first 32 quants, bit 2j+1 for the next 32 */
                const __m512i sel = join256(_mm256_set1_epi8((char)(1 << (2 * j))),
                                            _mm256_set1_epi8((char)(1 << (2 * j + 1))));
                q = _mm512_mask_add_epi8(q, _mm512_test_epi8_mask(hbits, sel), q, _mm512_set1_epi8(16));
            }
            const __m512i sc = _mm512_permutexvar_epi16(idx16(2 * j, 2 * j, 2 * j + 1, 2 * j + 1), scales);
            for (int c = 0; c < nc; c++) {
                const __m512i p = _mm512_maddubs_epi16(q, _mm512_loadu_si512((const void *)(Q8K(c, i)->qs + 64 * j)));
                sumi[c] = _mm512_add_epi32(sumi[c], _mm512_madd_epi16(sc, p));
            }
        }
        for (int c = 0; c < nc; c++) {
            const __m256i msum = _mm256_madd_epi16(mins2, _mm256_loadu_si256((const __m256i *)Q8K(c, i)->bsums));
            const __m512 sm = _mm512_cvtepi32_ps(join256(add_halves_i32(sumi[c]), msum));
            acc[c] = _mm512_fmadd_ps(_mm512_mul_ps(wf, _mm512_set1_ps(Q8K(c, i)->d)), sm, acc[c]);
        }
    }
    for (int c = 0; c < nc; c++) s[c * bs] = hsum_f32x16(acc[c]);
}

ED_ALWAYS_INLINE void q4_K_n(int n, float *s, size_t bs, const void *vx, const uint8_t *vy, size_t by, const int nc) {
    q45_K_n(n, s, bs, vx, vy, by, nc, 0);
}
ED_ALWAYS_INLINE void q5_K_n(int n, float *s, size_t bs, const void *vx, const uint8_t *vy, size_t by, const int nc) {
    q45_K_n(n, s, bs, vx, vy, by, nc, 1);
}
ED_NX_ENTRIES(q4_K_n, vec_dot_q4_K, vec_dot_nx_q4_K, 8)
ED_NX_ENTRIES(q5_K_n, vec_dot_q5_K, vec_dot_nx_q5_K, 8)

ED_ALWAYS_INLINE void q6_K_n(int n, float *s, size_t bs, const void *vx, const uint8_t *vy, size_t by, const int nc) {
    const block_q6_K *x = vx;
    const __m512i m15 = _mm512_set1_epi8(15), m48 = _mm512_set1_epi8(48);
    __m256 acc[ED_NX_MAX];
    for (int c = 0; c < nc; c++) acc[c] = _mm256_setzero_ps();
    for (int i = 0; i < n / QK_K; i++) {
        const float xd = ed_f16_table[ed_load_u16(&x[i].d)];
        const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x[i].scales));
        const __m512i scales = _mm512_castsi256_si512(sc16);
        __m512i sumi[ED_NX_MAX];
        for (int c = 0; c < nc; c++) sumi[c] = _mm512_setzero_si512();
        for (int h = 0; h < QK_K / 128; h++) {
            /* ql[0..63] low nibbles are quants 0..63 of this half, high nibbles 64..127; qh holds their
             * top 2 bits: bits 0-1 / 2-3 for quants 0..31 / 32..63, bits 4-5 / 6-7 for 64..95 / 96..127 */
            const __m512i lo = _mm512_loadu_si512((const void *)(x[i].ql + 64 * h));
            const __m256i bh = _mm256_loadu_si256((const __m256i *)(x[i].qh + 32 * h));
            const __m512i hb = join256(bh, _mm256_srli_epi16(bh, 2));
            const __m512i ha = _mm512_and_si512(_mm512_slli_epi16(hb, 4), m48), hbb = _mm512_and_si512(hb, m48);
            const __m512i qa = _mm512_or_si512(_mm512_and_si512(lo, m15), ha);
            const __m512i qb = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(lo, 4), m15), hbb);
            const short b = (short)(8 * h); /* scale k covers quants 16k .. 16k+15: 8 int16 lanes of p */
            const __m512i sa = _mm512_permutexvar_epi16(idx16(b, b + 1, b + 2, b + 3), scales);
            const __m512i sb = _mm512_permutexvar_epi16(idx16(b + 4, b + 5, b + 6, b + 7), scales);
            for (int c = 0; c < nc; c++) {
                const int8_t *q8 = Q8K(c, i)->qs + 128 * h;
                const __m512i pa = _mm512_maddubs_epi16(qa, _mm512_loadu_si512((const void *)q8));
                const __m512i pb = _mm512_maddubs_epi16(qb, _mm512_loadu_si512((const void *)(q8 + 64)));
                sumi[c] = _mm512_add_epi32(sumi[c], _mm512_add_epi32(_mm512_madd_epi16(sa, pa), _mm512_madd_epi16(sb, pb)));
            }
        }
        for (int c = 0; c < nc; c++) { /* quants are stored +32: subtract 32 * Σ scale * bsum once per block */
            const __m256i bsums = _mm256_loadu_si256((const __m256i *)Q8K(c, i)->bsums);
            const __m256i sub = _mm256_slli_epi32(_mm256_madd_epi16(bsums, sc16), 5);
            const __m256i total = _mm256_sub_epi32(add_halves_i32(sumi[c]), sub);
            acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(Q8K(c, i)->d * xd), _mm256_cvtepi32_ps(total), acc[c]);
        }
    }
    for (int c = 0; c < nc; c++) s[c * bs] = hsum_f32x8(acc[c]);
}
ED_NX_ENTRIES(q6_K_n, vec_dot_q6_K, vec_dot_nx_q6_K, 4)

/* Q2_K and Q3_K: per 128-element half, the 2-bit fields at bit offsets 0, 2 (quants 0..63) and 4, 6
 * (64..127) of the same 32 bytes make two 64-quant vectors; scale k covers quants 16k .. 16k+15 */
static inline void q23_half(const uint8_t *qs, __m512i *qa, __m512i *qb) {
    const __m512i m3 = _mm512_set1_epi8(3);
    const __m256i bits = _mm256_loadu_si256((const __m256i *)qs);
    *qa = _mm512_and_si512(join256(bits, _mm256_srli_epi16(bits, 2)), m3);
    *qb = _mm512_and_si512(join256(_mm256_srli_epi16(bits, 4), _mm256_srli_epi16(bits, 6)), m3);
}

/* the int16 scale lanes for half h's two 64-quant vectors: scale k covers quants 16k .. 16k+15 */
static inline void q23_scales(__m512i scales, int h, __m512i *sa, __m512i *sb) {
    const short b = (short)(8 * h);
    *sa = _mm512_permutexvar_epi16(idx16(b, b + 1, b + 2, b + 3), scales);
    *sb = _mm512_permutexvar_epi16(idx16(b + 4, b + 5, b + 6, b + 7), scales);
}

/* Σ scale * q * q8 over one half (q8 = its 128 activations) */
static inline __m512i q23_dot_half(__m512i qa, __m512i qb, __m512i sa, __m512i sb, const int8_t *q8) {
    const __m512i pa = _mm512_maddubs_epi16(qa, _mm512_loadu_si512((const void *)q8));
    const __m512i pb = _mm512_maddubs_epi16(qb, _mm512_loadu_si512((const void *)(q8 + 64)));
    return _mm512_add_epi32(_mm512_madd_epi16(sa, pa), _mm512_madd_epi16(sb, pb));
}

/* ggml_vec_dot_q2_K_q8_K (AVX2) at 64 quants per vpmaddubsw: scales in the low nibbles, mins (against
 * Q8_K's bsums) in the high ones */
ED_ALWAYS_INLINE void q2_K_n(int n, float *s, size_t bs, const void *vx, const uint8_t *vy, size_t by, const int nc) {
    const block_q2_K *x = vx;
    const __m128i m4 = _mm_set1_epi8(0xF);
    __m256 acc[ED_NX_MAX];
    for (int c = 0; c < nc; c++) acc[c] = _mm256_setzero_ps();
    for (int i = 0; i < n / QK_K; i++) {
        const float xd = ed_f16_table[ed_load_u16(&x[i].d)], xdmin = ed_f16_table[ed_load_u16(&x[i].dmin)];
        const __m128i ms = _mm_loadu_si128((const __m128i *)x[i].scales);
        const __m256i mins = _mm256_cvtepi8_epi16(_mm_and_si128(_mm_srli_epi16(ms, 4), m4));
        __m512i sumi[ED_NX_MAX];
        for (int c = 0; c < nc; c++) {
            const __m256i prod = _mm256_madd_epi16(mins, _mm256_loadu_si256((const __m256i *)Q8K(c, i)->bsums));
            acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(-Q8K(c, i)->d * xdmin), _mm256_cvtepi32_ps(prod), acc[c]);
            sumi[c] = _mm512_setzero_si512();
        }
        const __m512i scales = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(_mm_and_si128(ms, m4)));
        for (int h = 0; h < QK_K / 128; h++) {
            __m512i qa, qb, sa, sb;
            q23_half(x[i].qs + 32 * h, &qa, &qb);
            q23_scales(scales, h, &sa, &sb);
            for (int c = 0; c < nc; c++)
                sumi[c] = _mm512_add_epi32(sumi[c], q23_dot_half(qa, qb, sa, sb, Q8K(c, i)->qs + 128 * h));
        }
        for (int c = 0; c < nc; c++)
            acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(Q8K(c, i)->d * xd), _mm256_cvtepi32_ps(add_halves_i32(sumi[c])),
                                     acc[c]);
    }
    for (int c = 0; c < nc; c++) s[c * bs] = hsum_f32x8(acc[c]);
}
ED_NX_ENTRIES(q2_K_n, vec_dot_q2_K, vec_dot_nx_q2_K, 4)

/* ggml_vec_dot_q3_K_q8_K (AVX2) at 64 quants per vpmaddubsw. As in avx2_q23k.c the quants stay unsigned
 * (+4 where the hmask bit is set, by a masked add) and 4 * Σ scale * bsum comes off once per block. */
ED_ALWAYS_INLINE void q3_K_n(int n, float *s, size_t bs, const void *vx, const uint8_t *vy, size_t by, const int nc) {
    const block_q3_K *x = vx;
    const __m512i four = _mm512_set1_epi8(4);
    __m256 acc[ED_NX_MAX];
    for (int c = 0; c < nc; c++) acc[c] = _mm256_setzero_ps();
    for (int i = 0; i < n / QK_K; i++) {
        const float xd = ed_f16_table[ed_load_u16(&x[i].d)];
        uint32_t utmp[4];
        ed_unpack_scales_q3(x[i].scales, utmp);
        const __m128i s8 = _mm_sub_epi8(_mm_set_epi32((int)utmp[3], (int)utmp[2], (int)utmp[1], (int)utmp[0]),
                                        _mm_set1_epi8(32));
        const __m256i sc16 = _mm256_cvtepi8_epi16(s8);
        const __m512i scales = _mm512_castsi256_si512(sc16);
        const __m256i hm = _mm256_loadu_si256((const __m256i *)x[i].hmask);
        const __m512i hbits = join256(hm, hm);
        __m512i sumi[ED_NX_MAX];
        for (int c = 0; c < nc; c++) sumi[c] = _mm512_setzero_si512();
        for (int h = 0; h < QK_K / 128; h++) {
            __m512i qa, qb, sa, sb; /* chunk c (32 quants) of the block takes bit c of hmask[0..31] */
            q23_half(x[i].qs + 32 * h, &qa, &qb);
            const __m512i ma = join256(_mm256_set1_epi8((char)(1 << (4 * h))), _mm256_set1_epi8((char)(2 << (4 * h))));
            const __m512i mb = join256(_mm256_set1_epi8((char)(4 << (4 * h))), _mm256_set1_epi8((char)(8 << (4 * h))));
            qa = _mm512_mask_add_epi8(qa, _mm512_test_epi8_mask(hbits, ma), qa, four);
            qb = _mm512_mask_add_epi8(qb, _mm512_test_epi8_mask(hbits, mb), qb, four);
            q23_scales(scales, h, &sa, &sb);
            for (int c = 0; c < nc; c++)
                sumi[c] = _mm512_add_epi32(sumi[c], q23_dot_half(qa, qb, sa, sb, Q8K(c, i)->qs + 128 * h));
        }
        for (int c = 0; c < nc; c++) {
            const __m256i bsums = _mm256_loadu_si256((const __m256i *)Q8K(c, i)->bsums);
            const __m256i bias = _mm256_slli_epi32(_mm256_madd_epi16(bsums, sc16), 2);
            const __m256i total = _mm256_sub_epi32(add_halves_i32(sumi[c]), bias);
            acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(Q8K(c, i)->d * xd), _mm256_cvtepi32_ps(total), acc[c]);
        }
    }
    for (int c = 0; c < nc; c++) s[c * bs] = hsum_f32x8(acc[c]);
}
ED_NX_ENTRIES(q3_K_n, vec_dot_q3_K, vec_dot_nx_q3_K, 4)

#undef Q8K

/* ---------------------------------------------------------- float types: 2 x 16 f32 lanes, FMA */

#define FLOAT_DOT512(name, T, LOAD, CONV)                                                \
    static void name(int n, float *s, const void *vx, const void *vy) {                  \
        const T *x = vx, *y = vy;                                                          \
        __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();                         \
        int i = 0;                                                                         \
        for (; i + 32 <= n; i += 32) {                                                     \
            a0 = _mm512_fmadd_ps(LOAD(x + i), LOAD(y + i), a0);                            \
            a1 = _mm512_fmadd_ps(LOAD(x + i + 16), LOAD(y + i + 16), a1);                  \
        }                                                                                  \
        for (; i + 16 <= n; i += 16) a0 = _mm512_fmadd_ps(LOAD(x + i), LOAD(y + i), a0);   \
        float sumf = hsum_f32x16(_mm512_add_ps(a0, a1));                                   \
        for (; i < n; i++) sumf += CONV(x[i]) * CONV(y[i]);                                \
        *s = sumf;                                                                         \
    }

#define LOAD_F32(p) _mm512_loadu_ps(p)
#define LOAD_F16(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
#define LOAD_BF16(p) \
    _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p))), 16))
#define IDENT(v) (v)
#define F16(h) ed_f16_table[h]

FLOAT_DOT512(vec_dot_f32, float, LOAD_F32, IDENT)
FLOAT_DOT512(vec_dot_f16, uint16_t, LOAD_F16, F16)
FLOAT_DOT512(vec_dot_bf16, uint16_t, LOAD_BF16, ed_bf16_to_f32)

ED_TARGET_POP

/* ----------------------------------------------------------- legacy blocks: AVX-512 VNNI variant */

ED_TARGET_PUSH("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")
#define ED_VNNI 1
#include "avx512_body.h"
#undef ED_VNNI
ED_TARGET_POP

int ed_fill_avx512(ed_kernel_table *t) {
    if (!ed_fill_avx2(t)) return 0; /* quantizers and anything not overridden below */
    /* AVX2's multi-row kernels match AVX2's vec_dot bits, not these: each type below sets both */
    for (int i = 0; i < ED_TYPE_COUNT; i++) t->types[i].vec_dot_nx = NULL, t->types[i].vec_dot_2nx = NULL;
    t->level = ED_LEVEL_AVX512;
    if (ed_cpu_has_avx512vnni())
        set_legacy_vnni(t);
    else
        set_legacy_bw(t);
    t->types[ED_Q2_K].vec_dot = vec_dot_q2_K, t->types[ED_Q2_K].vec_dot_nx = vec_dot_nx_q2_K;
    t->types[ED_Q3_K].vec_dot = vec_dot_q3_K, t->types[ED_Q3_K].vec_dot_nx = vec_dot_nx_q3_K;
    t->types[ED_Q4_K].vec_dot = vec_dot_q4_K, t->types[ED_Q4_K].vec_dot_nx = vec_dot_nx_q4_K;
    t->types[ED_Q5_K].vec_dot = vec_dot_q5_K, t->types[ED_Q5_K].vec_dot_nx = vec_dot_nx_q5_K;
    t->types[ED_Q6_K].vec_dot = vec_dot_q6_K, t->types[ED_Q6_K].vec_dot_nx = vec_dot_nx_q6_K;
    t->types[ED_F16].vec_dot = vec_dot_f16;
    t->types[ED_BF16].vec_dot = vec_dot_bf16;
    t->types[ED_F32].vec_dot = vec_dot_f32;
    return 1;
}

#else
int ed_fill_avx512(ed_kernel_table *t) {
    (void)t;
    return 0;
}
#endif
