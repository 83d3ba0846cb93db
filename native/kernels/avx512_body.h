/* The AVX-512 legacy-block dots, included twice by avx512.c: with ED_VNNI 0 (AVX-512 BW: vpmaddubsw +
 * vpmaddwd) and ED_VNNI 1 (vpdpbusd), each under its own target pragma. Two blocks fill one 512-bit
 * vector: bytes 0..31 are block ib, 32..63 block ib+1, so int32 lanes 0..7 and 8..15 are the two blocks'
 * partial sums and one FMA applies both scales ([d0 x 8, d1 x 8]).
 *
 * Signed x signed products use |x| * (y with x's sign) as ggml's mul_sum_i8_pairs_float does; AVX-512 has
 * no vpsignb, so the sign moves with a byte mask. Offset quants (Q4_0 = q - 8, Q5_0 = q - 16) use the
 * unsigned q and subtract off * Σy, exact in int16 (|q*y pair| <= 2*31*127) and in int32 with VNNI.
 */
#if ED_VNNI
#define ED_SFX(f) f##_vnni
#else
#define ED_SFX(f) f##_bw
#endif

/* Σ of 4 u8 * s8 products per int32 lane (u <= 128, so vpmaddubsw cannot saturate) */
static inline __m512i ED_SFX(dot_us8)(__m512i u, __m512i s) {
#if ED_VNNI
    return _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, s);
#else
    return _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1));
#endif
}

/* Σ (u - off) * s per int32 lane */
static inline __m512i ED_SFX(dot_offset)(__m512i u, __m512i s, char off) {
    const __m512i o = _mm512_set1_epi8(off);
#if ED_VNNI
    const __m512i z = _mm512_setzero_si512();
    return _mm512_sub_epi32(_mm512_dpbusd_epi32(z, u, s), _mm512_dpbusd_epi32(z, o, s));
#else
    const __m512i p = _mm512_sub_epi16(_mm512_maddubs_epi16(u, s), _mm512_maddubs_epi16(o, s));
    return _mm512_madd_epi16(p, _mm512_set1_epi16(1));
#endif
}

/* Σ x * y for signed x, y (|y| <= 127) */
static inline __m512i ED_SFX(dot_s8)(__m512i x, __m512i y) {
    const __m512i sy = _mm512_mask_sub_epi8(y, _mm512_movepi8_mask(x), _mm512_setzero_si512(), y);
    return ED_SFX(dot_us8)(_mm512_abs_epi8(x), sy);
}

/* Each PAIR returns the int32 sums of blocks (x0, y0) and (x1, y1) */

static inline __m512i ED_SFX(pair_q4_0)(const block_q4_0 *x0, const block_q4_0 *x1, const block_q8_0 *y0,
                                        const block_q8_0 *y1) {
    return ED_SFX(dot_offset)(nibbles64(x0->qs, x1->qs), qs64(y0->qs, y1->qs), 8);
}

static inline __m512i ED_SFX(pair_q4_1)(const block_q4_1 *x0, const block_q4_1 *x1, const block_q8_1 *y0,
                                        const block_q8_1 *y1) {
    return ED_SFX(dot_us8)(nibbles64(x0->qs, x1->qs), qs64(y0->qs, y1->qs));
}

static inline __m512i ED_SFX(pair_q5_0)(const block_q5_0 *x0, const block_q5_0 *x1, const block_q8_0 *y0,
                                        const block_q8_0 *y1) {
    const __m512i q = with_fifth_bit(nibbles64(x0->qs, x1->qs), x0->qh, x1->qh);
    return ED_SFX(dot_offset)(q, qs64(y0->qs, y1->qs), 16);
}

static inline __m512i ED_SFX(pair_q5_1)(const block_q5_1 *x0, const block_q5_1 *x1, const block_q8_1 *y0,
                                        const block_q8_1 *y1) {
    const __m512i q = with_fifth_bit(nibbles64(x0->qs, x1->qs), x0->qh, x1->qh);
    return ED_SFX(dot_us8)(q, qs64(y0->qs, y1->qs));
}

static inline __m512i ED_SFX(pair_q8_0)(const block_q8_0 *x0, const block_q8_0 *x1, const block_q8_0 *y0,
                                        const block_q8_0 *y1) {
    return ED_SFX(dot_s8)(qs64(x0->qs, x1->qs), qs64(y0->qs, y1->qs));
}

static inline __m512i ED_SFX(pair_iq4_nl)(const block_iq4_nl *x0, const block_iq4_nl *x1, const block_q8_0 *y0,
                                          const block_q8_0 *y1) {
    const __m512i values = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)ed_kvalues_iq4nl));
    const __m512i v = _mm512_shuffle_epi8(values, nibbles64(x0->qs, x1->qs));
    return ED_SFX(dot_s8)(v, qs64(y0->qs, y1->qs));
}

/* acc += [d0 x 8, d1 x 8] * the int sums of blocks a, b (scales from heads h) */
#define ED_FMA_PAIR(PAIR, acc, h, a, b) \
    acc = _mm512_fmadd_ps(pair_scales(h), _mm512_cvtepi32_ps(PAIR(&x[a], &x[b], &y[a], &y[b])), acc)

/* Blocks in pairs, two pairs per iteration into two accumulators; an odd last block is paired with
 * itself at scale 0. HEADS gives [d0, m0*s0, d1, m1*s1] (the m*s lanes are 0 for types without mins). */
#define ED_LEGACY_DOT512(name, XT, YT, PAIR, HEADS)                                                   \
    static void ED_SFX(name)(int n, float *s, const void *vx, const void *vy) {                        \
        const XT *x = vx;                                                                                \
        const YT *y = vy;                                                                                \
        const int nb = n / QK;                                                                           \
        __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();                                   \
        __m128 ms = _mm_setzero_ps();                                                                    \
        int ib = 0;                                                                                      \
        for (; ib + 3 < nb; ib += 4) {                                                                   \
            const __m128 h0 = HEADS(&x[ib], &x[ib + 1], &y[ib], &y[ib + 1]);                             \
            const __m128 h1 = HEADS(&x[ib + 2], &x[ib + 3], &y[ib + 2], &y[ib + 3]);                     \
            ms = _mm_add_ps(ms, _mm_add_ps(h0, h1));                                                     \
            ED_FMA_PAIR(PAIR, acc0, h0, ib, ib + 1);                                                     \
            ED_FMA_PAIR(PAIR, acc1, h1, ib + 2, ib + 3);                                                 \
        }                                                                                                \
        for (; ib + 1 < nb; ib += 2) {                                                                   \
            const __m128 h = HEADS(&x[ib], &x[ib + 1], &y[ib], &y[ib + 1]);                              \
            ms = _mm_add_ps(ms, h);                                                                      \
            ED_FMA_PAIR(PAIR, acc0, h, ib, ib + 1);                                                      \
        }                                                                                                \
        if (ib < nb) {                                                                                   \
            const __m128 h = _mm_blend_ps(HEADS(&x[ib], &x[ib], &y[ib], &y[ib]), _mm_setzero_ps(), 0xC);  \
            ms = _mm_add_ps(ms, h);                                                                      \
            ED_FMA_PAIR(PAIR, acc1, h, ib, ib);                                                          \
        }                                                                                                \
        *s = hsum_f32x16(_mm512_add_ps(acc0, acc1)) + ms_lanes13(ms);                                 \
    }

ED_LEGACY_DOT512(vec_dot_q4_0, block_q4_0, block_q8_0, ED_SFX(pair_q4_0), heads_d)
ED_LEGACY_DOT512(vec_dot_q4_1, block_q4_1, block_q8_1, ED_SFX(pair_q4_1), heads_dm)
ED_LEGACY_DOT512(vec_dot_q5_0, block_q5_0, block_q8_0, ED_SFX(pair_q5_0), heads_d)
ED_LEGACY_DOT512(vec_dot_q5_1, block_q5_1, block_q8_1, ED_SFX(pair_q5_1), heads_dm)
ED_LEGACY_DOT512(vec_dot_q8_0, block_q8_0, block_q8_0, ED_SFX(pair_q8_0), heads_d)
ED_LEGACY_DOT512(vec_dot_iq4_nl, block_iq4_nl, block_q8_0, ED_SFX(pair_iq4_nl), heads_d)

static void ED_SFX(set_legacy)(ed_kernel_table *t) {
    t->types[ED_Q4_0].vec_dot = ED_SFX(vec_dot_q4_0);
    t->types[ED_Q4_1].vec_dot = ED_SFX(vec_dot_q4_1);
    t->types[ED_Q5_0].vec_dot = ED_SFX(vec_dot_q5_0);
    t->types[ED_Q5_1].vec_dot = ED_SFX(vec_dot_q5_1);
    t->types[ED_Q8_0].vec_dot = ED_SFX(vec_dot_q8_0);
    t->types[ED_IQ4_NL].vec_dot = ED_SFX(vec_dot_iq4_nl);
}

#undef ED_LEGACY_DOT512
#undef ED_FMA_PAIR
#undef ED_SFX
