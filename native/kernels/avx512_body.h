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

/* A weight block pair unpacked once for every activation row it meets: the bytes the dot takes (for the
 * signed kinds |x| and x's sign mask, so each row only moves the sign onto y) */
typedef struct {
    __m512i q;
    __mmask64 neg;
} ED_SFX(wpair);

static inline ED_SFX(wpair) ED_SFX(unpack_q4_0)(const block_q4_0 *x0, const block_q4_0 *x1) {
    return (ED_SFX(wpair)){nibbles64(x0->qs, x1->qs), 0};
}

static inline ED_SFX(wpair) ED_SFX(unpack_q4_1)(const block_q4_1 *x0, const block_q4_1 *x1) {
    return (ED_SFX(wpair)){nibbles64(x0->qs, x1->qs), 0};
}

static inline ED_SFX(wpair) ED_SFX(unpack_q5_0)(const block_q5_0 *x0, const block_q5_0 *x1) {
    return (ED_SFX(wpair)){with_fifth_bit(nibbles64(x0->qs, x1->qs), x0->qh, x1->qh), 0};
}

static inline ED_SFX(wpair) ED_SFX(unpack_q5_1)(const block_q5_1 *x0, const block_q5_1 *x1) {
    return (ED_SFX(wpair)){with_fifth_bit(nibbles64(x0->qs, x1->qs), x0->qh, x1->qh), 0};
}

static inline ED_SFX(wpair) ED_SFX(signed_pair)(__m512i x) {
    return (ED_SFX(wpair)){_mm512_abs_epi8(x), _mm512_movepi8_mask(x)};
}

static inline ED_SFX(wpair) ED_SFX(unpack_q8_0)(const block_q8_0 *x0, const block_q8_0 *x1) {
    return ED_SFX(signed_pair)(qs64(x0->qs, x1->qs));
}

static inline ED_SFX(wpair) ED_SFX(unpack_iq4_nl)(const block_iq4_nl *x0, const block_iq4_nl *x1) {
    const __m512i values = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)ed_kvalues_iq4nl));
    return ED_SFX(signed_pair)(_mm512_shuffle_epi8(values, nibbles64(x0->qs, x1->qs)));
}

/* The int32 sums of a weight pair against an activation pair y (64 int8): signed x signed as |x| * (y
 * with x's sign), offset kinds (Q4_0 = q - 8, Q5_0 = q - 16) as u * y - off * y */
static inline __m512i ED_SFX(dot_s)(ED_SFX(wpair) w, __m512i y) {
    return ED_SFX(dot_us8)(w.q, _mm512_mask_sub_epi8(y, w.neg, _mm512_setzero_si512(), y));
}
static inline __m512i ED_SFX(dot_u)(ED_SFX(wpair) w, __m512i y) { return ED_SFX(dot_us8)(w.q, y); }
static inline __m512i ED_SFX(dot_o8)(ED_SFX(wpair) w, __m512i y) { return ED_SFX(dot_offset)(w.q, y, 8); }
static inline __m512i ED_SFX(dot_o16)(ED_SFX(wpair) w, __m512i y) { return ED_SFX(dot_offset)(w.q, y, 16); }

/* acc[c] += [d0 x 8, d1 x 8] * the int sums of weight pair w and row c's blocks a, b (scales: heads h) */
#define ED_FMA_PAIR(DOT, acc, h, w, a, b) \
    acc = _mm512_fmadd_ps(pair_scales(h), _mm512_cvtepi32_ps(DOT(w, qs64(y[a].qs, y[b].qs))), acc)

/* One weight row against nc activation rows (vy + c * by): blocks in pairs, two pairs per iteration into
 * two accumulators; an odd last block is paired with itself at scale 0. HEADS gives [d0, m0*s0, d1,
 * m1*s1] (the m*s lanes are 0 for types without mins). Each weight pair is unpacked once for all rows;
 * each row's float operations are those of the nc = 1 instance, which is vec_dot itself, so vec_dot_nx
 * and vec_dot give the same bits. */
#define ED_LEGACY_DOT512(name, XT, YT, UNPACK, DOT, HEADS)                                              \
    ED_ALWAYS_INLINE void ED_SFX(name##_n)(int n, float *s, size_t bs, const XT *x, const uint8_t *vy,    \
                                           size_t by, const int nc) {                                     \
        const int nb = n / QK;                                                                            \
        __m512 acc0[ED_NX_MAX], acc1[ED_NX_MAX];                                                          \
        __m128 ms[ED_NX_MAX];                                                                             \
        for (int c = 0; c < nc; c++) acc0[c] = acc1[c] = _mm512_setzero_ps(), ms[c] = _mm_setzero_ps();   \
        int ib = 0;                                                                                       \
        for (; ib + 3 < nb; ib += 4) {                                                                    \
            const ED_SFX(wpair) w0 = UNPACK(&x[ib], &x[ib + 1]), w1 = UNPACK(&x[ib + 2], &x[ib + 3]);     \
            for (int c = 0; c < nc; c++) {                                                                \
                const YT *y = (const YT *)(vy + c * by);                                                  \
                const __m128 h0 = HEADS(&x[ib], &x[ib + 1], &y[ib], &y[ib + 1]);                          \
                const __m128 h1 = HEADS(&x[ib + 2], &x[ib + 3], &y[ib + 2], &y[ib + 3]);                  \
                ms[c] = _mm_add_ps(ms[c], _mm_add_ps(h0, h1));                                            \
                ED_FMA_PAIR(DOT, acc0[c], h0, w0, ib, ib + 1);                                            \
                ED_FMA_PAIR(DOT, acc1[c], h1, w1, ib + 2, ib + 3);                                        \
            }                                                                                             \
        }                                                                                                 \
        for (; ib + 1 < nb; ib += 2) {                                                                    \
            const ED_SFX(wpair) w0 = UNPACK(&x[ib], &x[ib + 1]);                                          \
            for (int c = 0; c < nc; c++) {                                                                \
                const YT *y = (const YT *)(vy + c * by);                                                  \
                const __m128 h = HEADS(&x[ib], &x[ib + 1], &y[ib], &y[ib + 1]);                           \
                ms[c] = _mm_add_ps(ms[c], h);                                                             \
                ED_FMA_PAIR(DOT, acc0[c], h, w0, ib, ib + 1);                                             \
            }                                                                                             \
        }                                                                                                 \
        if (ib < nb) {                                                                                    \
            const ED_SFX(wpair) w0 = UNPACK(&x[ib], &x[ib]);                                              \
            for (int c = 0; c < nc; c++) {                                                                \
                const YT *y = (const YT *)(vy + c * by);                                                  \
                const __m128 h = _mm_blend_ps(HEADS(&x[ib], &x[ib], &y[ib], &y[ib]), _mm_setzero_ps(), 0xC); \
                ms[c] = _mm_add_ps(ms[c], h);                                                             \
                ED_FMA_PAIR(DOT, acc1[c], h, w0, ib, ib);                                                 \
            }                                                                                             \
        }                                                                                                 \
        for (int c = 0; c < nc; c++) s[c * bs] = hsum_f32x16(_mm512_add_ps(acc0[c], acc1[c])) + ms_lanes13(ms[c]); \
    }                                                                                                     \
    ED_NX_ENTRIES(ED_SFX(name##_n), ED_SFX(vec_dot_##name), ED_SFX(vec_dot_nx_##name))

ED_LEGACY_DOT512(q4_0, block_q4_0, block_q8_0, ED_SFX(unpack_q4_0), ED_SFX(dot_o8), heads_d)
ED_LEGACY_DOT512(q4_1, block_q4_1, block_q8_1, ED_SFX(unpack_q4_1), ED_SFX(dot_u), heads_dm)
ED_LEGACY_DOT512(q5_0, block_q5_0, block_q8_0, ED_SFX(unpack_q5_0), ED_SFX(dot_o16), heads_d)
ED_LEGACY_DOT512(q5_1, block_q5_1, block_q8_1, ED_SFX(unpack_q5_1), ED_SFX(dot_u), heads_dm)
ED_LEGACY_DOT512(q8_0, block_q8_0, block_q8_0, ED_SFX(unpack_q8_0), ED_SFX(dot_s), heads_d)
ED_LEGACY_DOT512(iq4_nl, block_iq4_nl, block_q8_0, ED_SFX(unpack_iq4_nl), ED_SFX(dot_s), heads_d)

static void ED_SFX(set_legacy)(ed_kernel_table *t) {
    t->types[ED_Q4_0].vec_dot = ED_SFX(vec_dot_q4_0), t->types[ED_Q4_0].vec_dot_nx = ED_SFX(vec_dot_nx_q4_0);
    t->types[ED_Q4_1].vec_dot = ED_SFX(vec_dot_q4_1), t->types[ED_Q4_1].vec_dot_nx = ED_SFX(vec_dot_nx_q4_1);
    t->types[ED_Q5_0].vec_dot = ED_SFX(vec_dot_q5_0), t->types[ED_Q5_0].vec_dot_nx = ED_SFX(vec_dot_nx_q5_0);
    t->types[ED_Q5_1].vec_dot = ED_SFX(vec_dot_q5_1), t->types[ED_Q5_1].vec_dot_nx = ED_SFX(vec_dot_nx_q5_1);
    t->types[ED_Q8_0].vec_dot = ED_SFX(vec_dot_q8_0), t->types[ED_Q8_0].vec_dot_nx = ED_SFX(vec_dot_nx_q8_0);
    t->types[ED_IQ4_NL].vec_dot = ED_SFX(vec_dot_iq4_nl), t->types[ED_IQ4_NL].vec_dot_nx = ED_SFX(vec_dot_nx_iq4_nl);
}

#undef ED_LEGACY_DOT512
#undef ED_FMA_PAIR
#undef ED_SFX
