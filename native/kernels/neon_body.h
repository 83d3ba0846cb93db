/* The NEON dots, included twice by neon.c: ED_DOTPROD 1 (sdot, under a +dotprod target pragma) and
 * ED_DOTPROD 0 (baseline ARMv8-A). Mirrors ggml-org/llama.cpp ggml/src/ggml-cpu/arch/arm/quants.c: the
 * __ARM_NEON branches of ggml_vec_dot_{q4_0,q4_1,q5_0,q5_1,q8_0,iq4_nl}_q8_0/1 and q{2,3,4,5,6}_K_q8_K, where
 * ggml_vdotq_s32 is sdot or its fallback. The fallback here is smull + smlal2 + sadalp (3 instructions per
 * 16 bytes; ggml's takes 6): exact, since every pair of products fits int16 (|x| <= 128, |y| <= 127).
 */
#if ED_DOTPROD
#define ED_SFX(f) f##_dotprod
#else
#define ED_SFX(f) f##_neon
#endif

/* acc + 4 lanes of 4-product sums of a * b (lane grouping differs without sdot; totals agree) */
static inline int32x4_t ED_SFX(dot16)(int32x4_t acc, int8x16_t a, int8x16_t b) {
#if ED_DOTPROD
    return vdotq_s32(acc, a, b);
#else
    const int16x8_t p = vmlal_high_s8(vmull_s8(vget_low_s8(a), vget_low_s8(b)), a, b);
    return vpadalq_s16(acc, p);
#endif
}

/* Σ over one 32-quant block: xl * y[0..15] + xh * y[16..31] */
static inline int32x4_t ED_SFX(dot32)(int8x16_t xl, int8x16_t xh, const int8_t *y) {
    return ED_SFX(dot16)(ED_SFX(dot16)(vdupq_n_s32(0), xl, vld1q_s8(y)), xh, vld1q_s8(y + 16));
}

/* vec_dot and vec_dot_nx of a kernel written once as name##_n (one weight row against nc = 1..4
 * activation rows, always inlined, so each nc compiles to its own loop) */
#define ED_NX_ENTRIES(name)                                                                                \
    static void ED_SFX(name)(int n, float *s, const void *vx, const void *vy) {                            \
        ED_SFX(name##_n)(n, s, 1, vx, vy, 0, 1);                                                            \
    }                                                                                                       \
    static void ED_SFX(name##_nx)(int n, float *s, size_t bs, const void *vx, const void *vy, size_t by,   \
                                  int nc) {                                                                 \
        const uint8_t *y = vy;                                                                              \
        for (; nc >= 4; nc -= 4, s += 4 * bs, y += 4 * by) ED_SFX(name##_n)(n, s, bs, vx, y, by, 4);        \
        if (nc == 3) ED_SFX(name##_n)(n, s, bs, vx, y, by, 3);                                              \
        else if (nc == 2) ED_SFX(name##_n)(n, s, bs, vx, y, by, 2);                                         \
        else if (nc == 1) ED_SFX(name##_n)(n, s, bs, vx, y, by, 1);                                         \
    }

/* acc + a weight block's lanes against one Q8_0 / Q8_1 activation block, times d_w * d_y; the Q8_1 kinds
 * also add m_w * s_y to ms */
static inline float32x4_t ED_SFX(apply_q8_0)(const nwblock *w, const block_q8_0 *y, float32x4_t acc, float *ms) {
    (void)ms;
    return vfmaq_n_f32(acc, vcvtq_f32_s32(ED_SFX(dot32)(w->l, w->h, y->qs)), w->d * f16n(&y->d));
}

static inline float32x4_t ED_SFX(apply_q8_1)(const nwblock *w, const block_q8_1 *y, float32x4_t acc, float *ms) {
    *ms += w->m * f16n(&y->s);
    return vfmaq_n_f32(acc, vcvtq_f32_s32(ED_SFX(dot32)(w->l, w->h, y->qs)), w->d * f16n(&y->d));
}

/* One weight row against nc (1..4) activation rows: each weight block unpacked once for all of them, every
 * row's float operations those of nc = 1 (vec_dot), so every output has vec_dot's bits: even blocks into
 * acc0, odd into acc1, then one horizontal sum, plus the Q8_1 kinds' Σ m_w * s_y. */
#define ED_LEGACY_DOT_NEON(name, XT, YT, PREP, APPLY)                                                      \
    ED_INLINE void ED_SFX(name##_n)(int n, float *s, size_t bs, const XT *x, const uint8_t *vy, size_t by, \
                                    const int nc) {                                                         \
        const int nb = n / QK;                                                                              \
        float32x4_t acc0[4], acc1[4];                                                                       \
        float ms[4];                                                                                        \
        for (int c = 0; c < nc; c++) acc0[c] = acc1[c] = vdupq_n_f32(0.0f), ms[c] = 0.0f;                   \
        int ib = 0;                                                                                         \
        for (; ib + 1 < nb; ib += 2) {                                                                      \
            const nwblock w0 = PREP(&x[ib]), w1 = PREP(&x[ib + 1]);                                         \
            for (int c = 0; c < nc; c++) {                                                                  \
                const YT *y = (const YT *)(vy + c * by);                                                    \
                acc0[c] = APPLY(&w0, &y[ib], acc0[c], &ms[c]);                                              \
                acc1[c] = APPLY(&w1, &y[ib + 1], acc1[c], &ms[c]);                                          \
            }                                                                                               \
        }                                                                                                   \
        if (ib < nb) {                                                                                      \
            const nwblock w0 = PREP(&x[ib]);                                                                \
            for (int c = 0; c < nc; c++) acc0[c] = APPLY(&w0, (const YT *)(vy + c * by) + ib, acc0[c], &ms[c]); \
        }                                                                                                   \
        for (int c = 0; c < nc; c++) s[c * bs] = vaddvq_f32(vaddq_f32(acc0[c], acc1[c])) + ms[c];           \
    }                                                                                                       \
    ED_NX_ENTRIES(name)

ED_LEGACY_DOT_NEON(vec_dot_q4_0, block_q4_0, block_q8_0, prep_q4_0, ED_SFX(apply_q8_0))
ED_LEGACY_DOT_NEON(vec_dot_q4_1, block_q4_1, block_q8_1, prep_q4_1, ED_SFX(apply_q8_1))
ED_LEGACY_DOT_NEON(vec_dot_q5_0, block_q5_0, block_q8_0, prep_q5_0, ED_SFX(apply_q8_0))
ED_LEGACY_DOT_NEON(vec_dot_q5_1, block_q5_1, block_q8_1, prep_q5_1, ED_SFX(apply_q8_1))
ED_LEGACY_DOT_NEON(vec_dot_q8_0, block_q8_0, block_q8_0, prep_q8_0, ED_SFX(apply_q8_0))
ED_LEGACY_DOT_NEON(vec_dot_iq4_nl, block_iq4_nl, block_q8_0, prep_iq4_nl, ED_SFX(apply_q8_0))

/* --------------------------------------------------------------------------- K-quants (vs Q8_K) */

/* Each K-quant kernel is one weight row against nc (1..4) activation rows (the _n bodies, always inlined
 * with a constant nc): every super-block's quants are unpacked once for all rows, each row keeps its own
 * integer sums and float total, and its float operations are those of nc = 1 (vec_dot), so vec_dot_nx
 * gives vec_dot's bits. Loop order inside a super-block only moves exact integer sums. */
#define ED_K_ROW(i, c) ((const block_q8_K *)(vy + (c) * by) + (i))

/* Σ over 64 quants q[0..3] (16 each) * y[0..63] */
static inline int32_t ED_SFX(dot64)(int8x16_t q0, int8x16_t q1, const int8_t *y) {
    return vaddvq_s32(ED_SFX(dot16)(ED_SFX(dot16)(vdupq_n_s32(0), q0, vld1q_s8(y)), q1, vld1q_s8(y + 16)));
}

/* Q4_K/Q5_K: sumi[c] += sub-blocks 2j (l0, l1; scale s0) and 2j + 1 (u0, u1; scale s1) of super-block i
 * against activation row c */
ED_INLINE void ED_SFX(k45_pair)(int8x16_t l0, int8x16_t l1, int8x16_t u0, int8x16_t u1, int s0, int s1,
                                const uint8_t *vy, size_t by, int i, int j, int32_t *sumi, const int nc) {
    for (int c = 0; c < nc; c++) {
        const int8_t *q8 = ED_K_ROW(i, c)->qs + 64 * j;
        sumi[c] += ED_SFX(dot64)(l0, l1, q8) * s0 + ED_SFX(dot64)(u0, u1, q8 + 32) * s1;
    }
}

/* Q4_K/Q5_K: super-block i's float step per row, sumf[c] += d * sumi - dmin * Σ min * bsum (sc: the 8
 * scales, then the 8 mins; xd, xdmin: the block's f16 d and dmin) */
ED_INLINE void ED_SFX(k45_finish)(const uint8_t *sc, const void *xd, const void *xdmin, const uint8_t *vy, size_t by,
                                  int i, const int32_t *sumi, float *sumf, const int nc) {
    for (int c = 0; c < nc; c++) {
        const block_q8_K *y = ED_K_ROW(i, c);
        const int32_t mins = mins_dot_bsums(sc + 8, y->bsums);
        const float d = y->d * f16n(xd), dmin = y->d * f16n(xdmin);
        sumf[c] += d * (float)sumi[c] - dmin * (float)mins;
    }
}

ED_INLINE void ED_SFX(vec_dot_q4_K_n)(int n, float *s, size_t bs, const block_q4_K *x, const uint8_t *vy, size_t by,
                                      const int nc) {
    float sumf[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int i = 0; i < n / QK_K; i++) {
        uint32_t utmp[4];
        ed_unpack_scales_k4(x[i].scales, utmp);
        const uint8_t *sc = (const uint8_t *)utmp;
        const uint8_t *q4 = x[i].qs;
        int32_t sumi[4] = {0, 0, 0, 0};
        for (int j = 0; j < QK_K / 64; j++, q4 += 32) {
            const uint8x16_t b0 = vld1q_u8(q4), b1 = vld1q_u8(q4 + 16);
            const int8x16_t l0 = lo4(b0), l1 = lo4(b1), u0 = hi4(b0), u1 = hi4(b1);
            ED_SFX(k45_pair)(l0, l1, u0, u1, sc[2 * j], sc[2 * j + 1], vy, by, i, j, sumi, nc);
        }
        ED_SFX(k45_finish)(sc, &x[i].d, &x[i].dmin, vy, by, i, sumi, sumf, nc);
    }
    for (int c = 0; c < nc; c++) s[c * bs] = sumf[c];
}
ED_NX_ENTRIES(vec_dot_q4_K)

ED_INLINE void ED_SFX(vec_dot_q5_K_n)(int n, float *s, size_t bs, const block_q5_K *x, const uint8_t *vy, size_t by,
                                      const int nc) {
    const uint8x16_t m4 = vdupq_n_u8(0x0F), one = vdupq_n_u8(1), two = vdupq_n_u8(2);
    float sumf[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int i = 0; i < n / QK_K; i++) {
        uint32_t utmp[4];
        ed_unpack_scales_k4(x[i].scales, utmp);
        const uint8_t *sc = (const uint8_t *)utmp;
        const uint8_t *q5 = x[i].qs;
        uint8x16_t h0 = vld1q_u8(x[i].qh), h1 = vld1q_u8(x[i].qh + 16);
        int32_t sumi[4] = {0, 0, 0, 0};
        for (int j = 0; j < QK_K / 64; j++, q5 += 32) {
            const uint8x16_t b0 = vld1q_u8(q5), b1 = vld1q_u8(q5 + 16);
            /* bit 0 of the shifted qh: fifth bit of the low nibbles, bit 1: of the high nibbles */
            const int8x16_t l0 = vreinterpretq_s8_u8(vorrq_u8(vandq_u8(b0, m4), vshlq_n_u8(vandq_u8(h0, one), 4)));
            const int8x16_t l1 = vreinterpretq_s8_u8(vorrq_u8(vandq_u8(b1, m4), vshlq_n_u8(vandq_u8(h1, one), 4)));
            const int8x16_t u0 = vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(b0, 4), vshlq_n_u8(vandq_u8(h0, two), 3)));
            const int8x16_t u1 = vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(b1, 4), vshlq_n_u8(vandq_u8(h1, two), 3)));
            h0 = vshrq_n_u8(h0, 2);
            h1 = vshrq_n_u8(h1, 2);
            ED_SFX(k45_pair)(l0, l1, u0, u1, sc[2 * j], sc[2 * j + 1], vy, by, i, j, sumi, nc);
        }
        ED_SFX(k45_finish)(sc, &x[i].d, &x[i].dmin, vy, by, i, sumi, sumf, nc);
    }
    for (int c = 0; c < nc; c++) s[c * bs] = sumf[c];
}
ED_NX_ENTRIES(vec_dot_q5_K)

/* Σ over 16 quants (one Q6_K scale) */
static inline int32_t ED_SFX(dot16s)(uint8x16_t q, const int8_t *y) {
    return vaddvq_s32(ED_SFX(dot16)(vdupq_n_s32(0), vreinterpretq_s8_u8(q), vld1q_s8(y)));
}

ED_INLINE void ED_SFX(vec_dot_q6_K_n)(int n, float *s, size_t bs, const block_q6_K *x, const uint8_t *vy, size_t by,
                                      const int nc) {
    const uint8x16_t m4 = vdupq_n_u8(0x0F);
    float sumf[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int i = 0; i < n / QK_K; i++) {
        const uint8_t *ql = x[i].ql, *qh = x[i].qh;
        const int8_t *sc = x[i].scales;
        /* quants are stored +32: subtract 32 * Σ scale * bsum */
        int32_t mins[4] = {0, 0, 0, 0}, sumi[4] = {0, 0, 0, 0};
        for (int c = 0; c < nc; c++)
            for (int j = 0; j < QK_K / 16; j++) mins[c] += sc[j] * ED_K_ROW(i, c)->bsums[j];
        for (int h = 0; h < QK_K / 128; h++, ql += 64, qh += 32, sc += 8) {
            const uint8x16_t h0 = vld1q_u8(qh), h1 = vld1q_u8(qh + 16);
            const uint8x16_t b0 = vld1q_u8(ql), b1 = vld1q_u8(ql + 16);
            const uint8x16_t b2 = vld1q_u8(ql + 32), b3 = vld1q_u8(ql + 48);
            /* quants 0..63: low nibbles of ql[0..63], top bits 0-1 (0..31) / 2-3 (32..63) of qh;
             * quants 64..127: high nibbles, top bits 4-5 / 6-7 */
            const uint8x16_t q[8] = {
                q6(vandq_u8(b0, m4), h0),                 q6(vandq_u8(b1, m4), h1),
                q6(vandq_u8(b2, m4), vshrq_n_u8(h0, 2)),  q6(vandq_u8(b3, m4), vshrq_n_u8(h1, 2)),
                q6(vshrq_n_u8(b0, 4), vshrq_n_u8(h0, 4)), q6(vshrq_n_u8(b1, 4), vshrq_n_u8(h1, 4)),
                q6(vshrq_n_u8(b2, 4), vshrq_n_u8(h0, 6)), q6(vshrq_n_u8(b3, 4), vshrq_n_u8(h1, 6)),
            };
            for (int c = 0; c < nc; c++) {
                const int8_t *q8 = ED_K_ROW(i, c)->qs + 128 * h;
                for (int k = 0; k < 8; k++) sumi[c] += ED_SFX(dot16s)(q[k], q8 + 16 * k) * sc[k];
            }
        }
        for (int c = 0; c < nc; c++) sumf[c] += (ED_K_ROW(i, c)->d * f16n(&x[i].d)) * (float)(sumi[c] - 32 * mins[c]);
    }
    for (int c = 0; c < nc; c++) s[c * bs] = sumf[c];
}
ED_NX_ENTRIES(vec_dot_q6_K)

/* Q2_K/Q3_K: Σ over 32 quants with two scales, (q0 . y[0..15]) * s0 + (q1 . y[16..31]) * s1 */
static inline int32_t ED_SFX(dot32s)(uint8x16_t q0, uint8x16_t q1, const int8_t *y, int s0, int s1) {
    return ED_SFX(dot16s)(q0, y) * s0 + ED_SFX(dot16s)(q1, y + 16) * s1;
}

/* isum[c] += the 128 quants q[0..7] (Q2_K / Q3_K, half h of super-block i) against activation row c, each
 * 16 quants with their scale g[0..7] (a pair per 32) */
ED_INLINE void ED_SFX(q23_half)(const uint8x16_t q[8], const int g[8], const uint8_t *vy, size_t by, int i, int h,
                                int32_t *isum, const int nc) {
    for (int c = 0; c < nc; c++) {
        const int8_t *q8 = ED_K_ROW(i, c)->qs + 128 * h;
        for (int k = 0; k < 4; k++)
            isum[c] += ED_SFX(dot32s)(q[2 * k], q[2 * k + 1], q8 + 32 * k, g[2 * k], g[2 * k + 1]);
    }
}

ED_INLINE void ED_SFX(vec_dot_q2_K_n)(int n, float *s, size_t bs, const block_q2_K *x, const uint8_t *vy, size_t by,
                                      const int nc) {
    const uint8x16_t m3 = vdupq_n_u8(3), m4 = vdupq_n_u8(0x0F);
    float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int i = 0; i < n / QK_K; i++) {
        const uint8x16_t ms = vld1q_u8(x[i].scales);
        uint8_t sc[16];
        vst1q_u8(sc, vandq_u8(ms, m4));
        /* mins (high nibbles) against Q8_K's 16 bsums */
        const int16x8_t mn0 = vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(vshrq_n_u8(ms, 4))));
        const int16x8_t mn1 = vreinterpretq_s16_u16(vmovl_high_u8(vshrq_n_u8(ms, 4)));
        for (int c = 0; c < nc; c++) {
            const block_q8_K *y = ED_K_ROW(i, c);
            const float dmin = -y->d * f16n(&x[i].dmin);
            const int16x8_t b0 = vld1q_s16(y->bsums), b1 = vld1q_s16(y->bsums + 8);
            const int32x4_t s0 = vaddq_s32(vmull_s16(vget_low_s16(mn0), vget_low_s16(b0)), vmull_high_s16(mn0, b0));
            const int32x4_t s1 = vaddq_s32(vmull_s16(vget_low_s16(mn1), vget_low_s16(b1)), vmull_high_s16(mn1, b1));
            sum[c] += dmin * (float)vaddvq_s32(vaddq_s32(s0, s1));
        }
        const uint8_t *q2 = x[i].qs;
        int32_t isum[4] = {0, 0, 0, 0};
        /* per 128-element half: bits 2k, 2k+1 of q2[0..31] are quants 32k .. 32k+31 */
        for (int h = 0; h < QK_K / 128; h++, q2 += 32) {
            const uint8x16_t b0 = vld1q_u8(q2), b1 = vld1q_u8(q2 + 16);
            const uint8x16_t q[8] = {
                vandq_u8(b0, m3),                 vandq_u8(b1, m3),
                vandq_u8(vshrq_n_u8(b0, 2), m3),  vandq_u8(vshrq_n_u8(b1, 2), m3),
                vandq_u8(vshrq_n_u8(b0, 4), m3),  vandq_u8(vshrq_n_u8(b1, 4), m3),
                vshrq_n_u8(b0, 6),                vshrq_n_u8(b1, 6),
            };
            int g[8];
            for (int k = 0; k < 8; k++) g[k] = sc[8 * h + k];
            ED_SFX(q23_half)(q, g, vy, by, i, h, isum, nc);
        }
        for (int c = 0; c < nc; c++) sum[c] += (ED_K_ROW(i, c)->d * f16n(&x[i].d)) * (float)isum[c];
    }
    for (int c = 0; c < nc; c++) s[c * bs] = sum[c];
}
ED_NX_ENTRIES(vec_dot_q2_K)

/* Q3_K: the 2 low bits minus 4 where hmask's `bit` is clear, as int8 -4 .. 3 (bytes of a uint8x16_t) */
static inline uint8x16_t ED_SFX(q3)(uint8x16_t low2, uint8x16_t hm, uint8_t bit) {
    const uint8x16_t four = vbicq_u8(vdupq_n_u8(4), vtstq_u8(hm, vdupq_n_u8(bit)));
    return vsubq_u8(low2, four);
}

ED_INLINE void ED_SFX(vec_dot_q3_K_n)(int n, float *s, size_t bs, const block_q3_K *x, const uint8_t *vy, size_t by,
                                      const int nc) {
    const uint8x16_t m3 = vdupq_n_u8(3);
    float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int i = 0; i < n / QK_K; i++) {
        uint32_t utmp[4];
        ed_unpack_scales_q3(x[i].scales, utmp);
        int8_t sc[16];
        vst1q_s8(sc, vsubq_s8(vreinterpretq_s8_u32(vld1q_u32(utmp)), vdupq_n_s8(32)));
        const uint8x16_t h0 = vld1q_u8(x[i].hmask), h1 = vld1q_u8(x[i].hmask + 16);
        const uint8_t *q3 = x[i].qs;
        int32_t isum[4] = {0, 0, 0, 0};
        /* chunk c = 4h + k (quants 32c .. 32c+31) takes bits 2k, 2k+1 of q3[32h + l] and bit c of hmask[l] */
        for (int h = 0; h < QK_K / 128; h++, q3 += 32) {
            const uint8x16_t b0 = vld1q_u8(q3), b1 = vld1q_u8(q3 + 16);
            const uint8_t b = (uint8_t)(1 << (4 * h));
            const uint8x16_t q[8] = {
                ED_SFX(q3)(vandq_u8(b0, m3), h0, b),
                ED_SFX(q3)(vandq_u8(b1, m3), h1, b),
                ED_SFX(q3)(vandq_u8(vshrq_n_u8(b0, 2), m3), h0, b << 1),
                ED_SFX(q3)(vandq_u8(vshrq_n_u8(b1, 2), m3), h1, b << 1),
                ED_SFX(q3)(vandq_u8(vshrq_n_u8(b0, 4), m3), h0, b << 2),
                ED_SFX(q3)(vandq_u8(vshrq_n_u8(b1, 4), m3), h1, b << 2),
                ED_SFX(q3)(vshrq_n_u8(b0, 6), h0, b << 3),
                ED_SFX(q3)(vshrq_n_u8(b1, 6), h1, b << 3),
            };
            int g[8];
            for (int k = 0; k < 8; k++) g[k] = sc[8 * h + k];
            ED_SFX(q23_half)(q, g, vy, by, i, h, isum, nc);
        }
        for (int c = 0; c < nc; c++) sum[c] += (ED_K_ROW(i, c)->d * f16n(&x[i].d)) * (float)isum[c];
    }
    for (int c = 0; c < nc; c++) s[c * bs] = sum[c];
}
ED_NX_ENTRIES(vec_dot_q3_K)

static void ED_SFX(set_dots)(ed_kernel_table *t) {
    t->types[ED_Q4_0].vec_dot = ED_SFX(vec_dot_q4_0);
    t->types[ED_Q4_1].vec_dot = ED_SFX(vec_dot_q4_1);
    t->types[ED_Q5_0].vec_dot = ED_SFX(vec_dot_q5_0);
    t->types[ED_Q5_1].vec_dot = ED_SFX(vec_dot_q5_1);
    t->types[ED_Q8_0].vec_dot = ED_SFX(vec_dot_q8_0);
    t->types[ED_IQ4_NL].vec_dot = ED_SFX(vec_dot_iq4_nl);
    t->types[ED_Q2_K].vec_dot = ED_SFX(vec_dot_q2_K);
    t->types[ED_Q3_K].vec_dot = ED_SFX(vec_dot_q3_K);
    t->types[ED_Q4_K].vec_dot = ED_SFX(vec_dot_q4_K);
    t->types[ED_Q5_K].vec_dot = ED_SFX(vec_dot_q5_K);
    t->types[ED_Q6_K].vec_dot = ED_SFX(vec_dot_q6_K);
    t->types[ED_Q4_0].vec_dot_nx = ED_SFX(vec_dot_q4_0_nx);
    t->types[ED_Q4_1].vec_dot_nx = ED_SFX(vec_dot_q4_1_nx);
    t->types[ED_Q5_0].vec_dot_nx = ED_SFX(vec_dot_q5_0_nx);
    t->types[ED_Q5_1].vec_dot_nx = ED_SFX(vec_dot_q5_1_nx);
    t->types[ED_Q8_0].vec_dot_nx = ED_SFX(vec_dot_q8_0_nx);
    t->types[ED_IQ4_NL].vec_dot_nx = ED_SFX(vec_dot_iq4_nl_nx);
    t->types[ED_Q2_K].vec_dot_nx = ED_SFX(vec_dot_q2_K_nx);
    t->types[ED_Q3_K].vec_dot_nx = ED_SFX(vec_dot_q3_K_nx);
    t->types[ED_Q4_K].vec_dot_nx = ED_SFX(vec_dot_q4_K_nx);
    t->types[ED_Q5_K].vec_dot_nx = ED_SFX(vec_dot_q5_K_nx);
    t->types[ED_Q6_K].vec_dot_nx = ED_SFX(vec_dot_q6_K_nx);
}

#undef ED_NX_ENTRIES
#undef ED_K_ROW
#undef ED_LEGACY_DOT_NEON
#undef ED_SFX
