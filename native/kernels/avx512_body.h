/* The AVX-512 legacy-block dots, included twice by avx512.c: with ED_VNNI 0 (AVX-512 BW: vpmaddubsw +
 * vpmaddwd) and ED_VNNI 1 (vpdpbusd), each under its own target pragma. Two blocks fill one 512-bit
 * vector: bytes 0..31 are block ib, 32..63 block ib+1, so int32 lanes 0..7 and 8..15 are the two blocks'
 * partial sums and one FMA applies both scales ([d0 x 8, d1 x 8]).
 *
 * Without VNNI, signed x signed products use |x| * (y with x's sign) as ggml's mul_sum_i8_pairs_float
 * does (AVX-512 has no vpsignb, so the sign moves with a byte mask), and offset quants (Q4_0 = q - 8,
 * Q5_0 = q - 16) use the unsigned q and subtract off * Σy, exact in int16 (|q*y pair| <= 2*31*127). With
 * VNNI every weight is an unsigned u = x + off (signed Q8_0 and IQ4_NL values + 128) and a row's sum is
 * one vpdpbusd of u and y started from -off * Σy (load_y, once per activation pair for all weight
 * rows): Σ u*y - off*Σy = Σ x*y, exact in int32 (4 * 255 * 128 per lane).
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
#if ED_VNNI /* x + 128, unsigned: the rows' dots take off 128 * Σy once per activation pair */
    return (ED_SFX(wpair)){_mm512_xor_si512(x, _mm512_set1_epi8((char)0x80)), 0};
#else
    return (ED_SFX(wpair)){_mm512_abs_epi8(x), _mm512_movepi8_mask(x)};
#endif
}

static inline ED_SFX(wpair) ED_SFX(unpack_q8_0)(const block_q8_0 *x0, const block_q8_0 *x1) {
    return ED_SFX(signed_pair)(qs64(x0->qs, x1->qs));
}

static inline ED_SFX(wpair) ED_SFX(unpack_iq4_nl)(const block_iq4_nl *x0, const block_iq4_nl *x1) {
    const __m512i values = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)ed_kvalues_iq4nl));
    return ED_SFX(signed_pair)(_mm512_shuffle_epi8(values, nibbles64(x0->qs, x1->qs)));
}

/* An activation block pair as the weight rows meet it: its 64 quants, (without mins) its scales, and
 * with VNNI, for weights stored as q - off (Q4_0: 8, Q5_0: 16) or made so (Q8_0, IQ4_NL: x + 128),
 * -off * Σy per int32 lane, where the rows' vpdpbusd sums start */
typedef struct {
    __m512i q, bias;
    __m512 d;
} ED_SFX(ypair);

/* blocks a, b of activation row y (the scales are not needed with mins: heads_dm reads them) */
#define ED_LOAD_Y(y, a, b, MINS, OFF) ED_SFX(load_y)(y[a].qs, y[b].qs, &y[a], &y[b], MINS, OFF)

static inline ED_SFX(ypair) ED_SFX(load_y)(const int8_t *q0, const int8_t *q1, const void *h0, const void *h1,
                                           const int mins, const int off) {
    ED_SFX(ypair) p;
    p.q = qs64(q0, q1);
    p.d = mins ? _mm512_setzero_ps() : f16_pair(h0, h1);
    p.bias = _mm512_setzero_si512();
    (void)off;
#if ED_VNNI
    if (off) p.bias = _mm512_sub_epi32(p.bias, _mm512_dpbusd_epi32(p.bias, _mm512_set1_epi8((char)off), p.q));
#endif
    return p;
}

/* The int32 sums of a weight pair against an activation pair: with VNNI one vpdpbusd from the pair's
 * bias; without, signed x signed as |x| * (y with x's sign), offset kinds as u * y - off * y */
#if ED_VNNI /* one kind: the activation pair's bias carries the weight's offset */
static inline __m512i ED_SFX(dot_s)(ED_SFX(wpair) w, ED_SFX(ypair) y) { return _mm512_dpbusd_epi32(y.bias, w.q, y.q); }
static inline __m512i ED_SFX(dot_u)(ED_SFX(wpair) w, ED_SFX(ypair) y) { return ED_SFX(dot_s)(w, y); }
static inline __m512i ED_SFX(dot_o8)(ED_SFX(wpair) w, ED_SFX(ypair) y) { return ED_SFX(dot_s)(w, y); }
static inline __m512i ED_SFX(dot_o16)(ED_SFX(wpair) w, ED_SFX(ypair) y) { return ED_SFX(dot_s)(w, y); }
#else
static inline __m512i ED_SFX(dot_s)(ED_SFX(wpair) w, ED_SFX(ypair) y) {
    return ED_SFX(dot_us8)(w.q, _mm512_mask_sub_epi8(y.q, w.neg, _mm512_setzero_si512(), y.q));
}
static inline __m512i ED_SFX(dot_u)(ED_SFX(wpair) w, ED_SFX(ypair) y) { return ED_SFX(dot_us8)(w.q, y.q); }
static inline __m512i ED_SFX(dot_o8)(ED_SFX(wpair) w, ED_SFX(ypair) y) { return ED_SFX(dot_offset)(w.q, y.q, 8); }
static inline __m512i ED_SFX(dot_o16)(ED_SFX(wpair) w, ED_SFX(ypair) y) { return ED_SFX(dot_offset)(w.q, y.q, 16); }
#endif

/* Row c's share of weight pair w (blocks a, b) into acc: [d_a x 8, d_b x 8] * the int sums, where d is
 * the product of the weight's and the activation's block scales (for the odd last block, b = a and the
 * upper half's scale is 0). Types with mins (Q4_1, Q5_1 against Q8_1) take [d_a, m_a*s_a, d_b, m_b*s_b]
 * from heads_dm and add the m*s lanes into ms; the others multiply the weight pair's scales wd,
 * converted once for every activation row, by the row's (converted once for both weight rows). */
#define ED_ROW_PAIR(DOT, MINS, acc, ms, w, wd, yp, a, b, odd)                                          \
    do {                                                                                                \
        const __m512 sum = _mm512_cvtepi32_ps(DOT(w, yp));                                            \
        __m512 sc;                                                                                      \
        if (MINS) {                                                                                     \
            __m128 h = heads_dm(&x[a], &x[b], &y[a], &y[b]);                                            \
            if (odd) h = _mm_blend_ps(h, _mm_setzero_ps(), 0xC);                                        \
            ms = _mm_add_ps(ms, h);                                                                     \
            sc = pair_scales(h);                                                                        \
        } else {                                                                                        \
            sc = _mm512_mul_ps(wd, yp.d);                                                               \
            if (odd) sc = _mm512_maskz_mov_ps(0x00FF, sc);                                              \
        }                                                                                               \
        acc = _mm512_fmadd_ps(sc, sum, acc);                                                            \
    } while (0)

/* nr (1 or 2) weight rows (vx + r * bx) against nc activation rows (vy + c * by): blocks in pairs, two
 * pairs per iteration into two accumulators; an odd last block is paired with itself at scale 0. Each
 * weight pair is unpacked once for all activation rows, each activation pair loaded once for both weight
 * rows; each output's float operations are those of the nr = nc = 1 instance, which is vec_dot itself,
 * so vec_dot_nx, vec_dot_2nx and vec_dot give the same bits. */
#define ED_LEGACY_DOT512(name, XT, YT, UNPACK, DOT, MINS, OFF)                                             \
    ED_ALWAYS_INLINE void ED_SFX(name##_mn)(int n, float *s, size_t bs, const uint8_t *vx, size_t bx,     \
                                            const uint8_t *vy, size_t by, const int nr, const int nc) {   \
        const int nb = n / QK;                                                                            \
        __m512 acc0[2][ED_NX_MAX], acc1[2][ED_NX_MAX];                                                    \
        __m128 ms[2][ED_NX_MAX];                                                                          \
        for (int r = 0; r < nr; r++)                                                                      \
            for (int c = 0; c < nc; c++)                                                                  \
                acc0[r][c] = acc1[r][c] = _mm512_setzero_ps(), ms[r][c] = _mm_setzero_ps();               \
        ED_SFX(wpair) w0[2], w1[2];                                                                       \
        __m512 wd0[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()}, wd1[2] = {wd0[0], wd0[0]};            \
        int ib = 0;                                                                                       \
        for (; ib + 3 < nb; ib += 4) {                                                                    \
            for (int r = 0; r < nr; r++) {                                                                \
                const XT *x = (const XT *)(vx + r * bx);                                                  \
                w0[r] = UNPACK(&x[ib], &x[ib + 1]), w1[r] = UNPACK(&x[ib + 2], &x[ib + 3]);               \
                if (!MINS) wd0[r] = f16_pair(&x[ib], &x[ib + 1]), wd1[r] = f16_pair(&x[ib + 2], &x[ib + 3]); \
            }                                                                                             \
            for (int c = 0; c < nc; c++) {                                                                \
                const YT *y = (const YT *)(vy + c * by);                                                  \
                const ED_SFX(ypair) y0 = ED_LOAD_Y(y, ib, ib + 1, MINS, OFF);                        \
                const ED_SFX(ypair) y1 = ED_LOAD_Y(y, ib + 2, ib + 3, MINS, OFF);                    \
                for (int r = 0; r < nr; r++) {                                                            \
                    const XT *x = (const XT *)(vx + r * bx);                                              \
                    ED_ROW_PAIR(DOT, MINS, acc0[r][c], ms[r][c], w0[r], wd0[r], y0, ib, ib + 1, 0);       \
                    ED_ROW_PAIR(DOT, MINS, acc1[r][c], ms[r][c], w1[r], wd1[r], y1, ib + 2, ib + 3, 0);   \
                }                                                                                         \
            }                                                                                             \
        }                                                                                                 \
        for (; ib + 1 < nb; ib += 2) {                                                                    \
            for (int r = 0; r < nr; r++) {                                                                \
                const XT *x = (const XT *)(vx + r * bx);                                                  \
                w0[r] = UNPACK(&x[ib], &x[ib + 1]);                                                       \
                if (!MINS) wd0[r] = f16_pair(&x[ib], &x[ib + 1]);                                         \
            }                                                                                             \
            for (int c = 0; c < nc; c++) {                                                                \
                const YT *y = (const YT *)(vy + c * by);                                                  \
                const ED_SFX(ypair) y0 = ED_LOAD_Y(y, ib, ib + 1, MINS, OFF);                        \
                for (int r = 0; r < nr; r++) {                                                            \
                    const XT *x = (const XT *)(vx + r * bx);                                              \
                    ED_ROW_PAIR(DOT, MINS, acc0[r][c], ms[r][c], w0[r], wd0[r], y0, ib, ib + 1, 0);       \
                }                                                                                         \
            }                                                                                             \
        }                                                                                                 \
        if (ib < nb) {                                                                                    \
            for (int r = 0; r < nr; r++) {                                                                \
                const XT *x = (const XT *)(vx + r * bx);                                                  \
                w0[r] = UNPACK(&x[ib], &x[ib]);                                                           \
                if (!MINS) wd0[r] = f16_pair(&x[ib], &x[ib]);                                             \
            }                                                                                             \
            for (int c = 0; c < nc; c++) {                                                                \
                const YT *y = (const YT *)(vy + c * by);                                                  \
                const ED_SFX(ypair) y0 = ED_LOAD_Y(y, ib, ib, MINS, OFF);                            \
                for (int r = 0; r < nr; r++) {                                                            \
                    const XT *x = (const XT *)(vx + r * bx);                                              \
                    ED_ROW_PAIR(DOT, MINS, acc1[r][c], ms[r][c], w0[r], wd0[r], y0, ib, ib, 1);           \
                }                                                                                         \
            }                                                                                             \
        }                                                                                                 \
        for (int r = 0; r < nr; r++)                                                                      \
            for (int c = 0; c < nc; c++)                                                                  \
                s[c * bs + r] = hsum_f32x16(_mm512_add_ps(acc0[r][c], acc1[r][c])) +                      \
                                (MINS ? ms_lanes13(ms[r][c]) : 0.0f);                                     \
    }                                                                                                     \
    ED_MN_ENTRIES(ED_SFX(name##_mn), ED_SFX(name##_1n), ED_SFX(vec_dot_##name), ED_SFX(vec_dot_nx_##name), \
                  ED_SFX(vec_dot_2nx_##name))

ED_LEGACY_DOT512(q4_0, block_q4_0, block_q8_0, ED_SFX(unpack_q4_0), ED_SFX(dot_o8), 0, 8)
ED_LEGACY_DOT512(q4_1, block_q4_1, block_q8_1, ED_SFX(unpack_q4_1), ED_SFX(dot_u), 1, 0)
ED_LEGACY_DOT512(q5_0, block_q5_0, block_q8_0, ED_SFX(unpack_q5_0), ED_SFX(dot_o16), 0, 16)
ED_LEGACY_DOT512(q5_1, block_q5_1, block_q8_1, ED_SFX(unpack_q5_1), ED_SFX(dot_u), 1, 0)
ED_LEGACY_DOT512(q8_0, block_q8_0, block_q8_0, ED_SFX(unpack_q8_0), ED_SFX(dot_s), 0, 128)
ED_LEGACY_DOT512(iq4_nl, block_iq4_nl, block_q8_0, ED_SFX(unpack_iq4_nl), ED_SFX(dot_s), 0, 128)

/* a type's three table entries from its kernel's names */
#define ED_SET(T, name)                                                                              \
    t->types[T].vec_dot = ED_SFX(vec_dot_##name), t->types[T].vec_dot_nx = ED_SFX(vec_dot_nx_##name), \
    t->types[T].vec_dot_2nx = ED_SFX(vec_dot_2nx_##name)

static void ED_SFX(set_legacy)(ed_kernel_table *t) {
    ED_SET(ED_Q4_0, q4_0);
    ED_SET(ED_Q4_1, q4_1);
    ED_SET(ED_Q5_0, q5_0);
    ED_SET(ED_Q5_1, q5_1);
    ED_SET(ED_Q8_0, q8_0);
    ED_SET(ED_IQ4_NL, iq4_nl);
}
#undef ED_SET

#undef ED_LEGACY_DOT512
#undef ED_FMA_PAIR
#undef ED_SFX
