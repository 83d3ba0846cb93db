/* The repacked (x16) GEMM at the NEON dot-product level (included by neon.c under its +dotprod target):
 * ed_kernels.h has the layout, 16 weight rows' blocks side by side with 4 bytes of each row in turn, so a
 * 16-byte vector holds 4 bytes of 4 rows and one `sdot` by element (vdotq_laneq_s32) multiplies them with
 * the same 4 activation bytes: 4 rows' partial dots in the 4 int32 lanes. A block's 16 row sums are 4 such
 * vectors, and the float work is one convert, one scale product and one FMA per 4 rows, block and
 * activation row (vec_dot spends those per row). Per output: acc = fma(d_w * d_y, (float) isum, acc) over
 * the blocks in order, the order of kernel_check's scalar x16 reference (and of the AVX2 and AVX-512
 * kernels), whatever nc, so decode (nc = 1) and prompts give the same bits on every level.
 *
 * The layout stores Q4_0 as its nibbles 0..15 (each row's sum starts at -8 * Σy, the side table's sum;
 * Q4_1's nibbles start at 0 and its min term, fma(m_w, s_y), follows each block's product),
 * IQ4_NL as nibble indices (looked up here as the signed values) and Q8_0 as q + 128 (xor 0x80 gives q
 * back as int8): every integer dot is exact. ggml-org/llama.cpp ggml/src/ggml-cpu/arch/arm/repack.cpp
 * (ggml_gemv_q4_0_4x4_q8_0, ggml_gemm_q4_0_4x4_q8_0) uses sdot by element on its 4-row interleave the
 * same way; this file follows edgellm's 16-row layout.
 */
#define ED_X16N_NC 2 /* activation rows per pass: 2 x 4 int and 2 x 4 float accumulators + 8 weight vectors */

enum { X16N_Q4_0, X16N_IQ4_NL, X16N_Q8_0, X16N_Q4_1 }; /* Q4_1: against Q8_1, its mins after the scales */

/* step t (0..3) of a group block's quants (q: after the 16 scales, and Q4_1's 16 mins) as signed bytes: lo[k] (rows 4k..4k+3)
 * meets the activation's bytes 4t..4t+3, hi[k] its bytes 16 + 4t..16 + 4t + 3 */
ED_INLINE void x16n_step(const int kind, const uint8_t *q, const int t, int8x16_t lo[4], int8x16_t hi[4]) {
    for (int k = 0; k < 4; k++) {
        if (kind == X16N_Q8_0) { /* chunk t: quants 4t.., chunk t + 4: quants 16 + 4t.. */
            const uint8x16_t x80 = vdupq_n_u8(0x80);
            lo[k] = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(q + 64 * t + 16 * k), x80));
            hi[k] = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(q + 64 * (t + 4) + 16 * k), x80));
        } else { /* chunk t: low nibbles quants 4t.., high nibbles 16 + 4t.. */
            const uint8x16_t v = vld1q_u8(q + 64 * t + 16 * k);
            const uint8x16_t l = vandq_u8(v, vdupq_n_u8(0x0F)), h = vshrq_n_u8(v, 4);
            if (kind == X16N_IQ4_NL) {
                const int8x16_t values = vld1q_s8(ed_kvalues_iq4nl);
                lo[k] = vqtbl1q_s8(values, l);
                hi[k] = vqtbl1q_s8(values, h);
            } else {
                lo[k] = vreinterpretq_s8_u8(l);
                hi[k] = vreinterpretq_s8_u8(h);
            }
        }
    }
}

/* the lanes take an immediate, so the four steps are spelled out */
#define X16N_DOTS(t)                                                                                         \
    do {                                                                                                     \
        int8x16_t lo[4], hi[4];                                                                              \
        x16n_step(kind, q, t, lo, hi);                                                                       \
        for (int c = 0; c < nc; c++)                                                                         \
            for (int k = 0; k < 4; k++) {                                                                    \
                isum[c][k] = vdotq_laneq_s32(isum[c][k], lo[k], yl[c], t);                                   \
                isum[c][k] = vdotq_laneq_s32(isum[c][k], hi[k], yh[c], t);                                   \
            }                                                                                                \
    } while (0)

ED_INLINE void x16n_gemm_nc(const int kind, int n, float *s, size_t bs, const uint8_t *vx, int nr,
                            const uint8_t *vy, size_t by, const uint8_t *side, size_t side_row, const int nc) {
    const int nb = n / QK, q41 = kind == X16N_Q4_1;
    const int off = kind == X16N_Q4_0 ? 8 : 0;
    const size_t gb = ED_X16_ROWS * (2 + (kind == X16N_Q8_0 ? QK : q41 ? QK / 2 + 2 : QK / 2));
    const size_t yb = q41 ? sizeof(block_q8_1) : sizeof(block_q8_0);
    float32x4_t acc[ED_X16N_NC][4];
    for (int c = 0; c < nc; c++)
        for (int k = 0; k < 4; k++) acc[c][k] = vdupq_n_f32(0.0f);
    for (int b = 0; b < nb; b++) {
        const uint8_t *g = vx + (size_t)b * gb, *q = g + (q41 ? Q41_QS : 2 * ED_X16_ROWS);
        int32x4_t isum[ED_X16N_NC][4];
        int8x16_t yl[ED_X16N_NC], yh[ED_X16N_NC];
        for (int c = 0; c < nc; c++) {
            const int8_t *yq = (const int8_t *)(vy + c * by + (size_t)b * yb) + (q41 ? 4 : 2); /* past d (, s) */
            const int32_t *ys = off ? (const int32_t *)((const float *)(side + c * side_row) + nb) : NULL;
            yl[c] = vld1q_s8(yq);
            yh[c] = vld1q_s8(yq + 16);
            for (int k = 0; k < 4; k++) isum[c][k] = vdupq_n_s32(off ? -off * ys[b] : 0);
        }
        X16N_DOTS(0);
        X16N_DOTS(1);
        X16N_DOTS(2);
        X16N_DOTS(3);
        float32x4_t dw[4], mw[4]; /* the 16 rows' scales (and mins) */
        for (int k = 0; k < 4; k++) {
            dw[k] = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)g + 4 * k)));
            mw[k] = q41 ? vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)(g + Q41_MIN) + 4 * k))) : dw[k];
        }
        for (int c = 0; c < nc; c++) {
            const block_q8_1 *y1 = (const block_q8_1 *)(vy + c * by) + b;
            const float dy = q41 ? ed_f16_to_f32(y1->d) : ((const float *)(side + c * side_row))[b];
            for (int k = 0; k < 4; k++) {
                acc[c][k] = vfmaq_f32(acc[c][k], vmulq_n_f32(dw[k], dy), vcvtq_f32_s32(isum[c][k]));
                if (q41) acc[c][k] = vfmaq_f32(acc[c][k], mw[k], vdupq_n_f32(ed_f16_to_f32(y1->s)));
            }
        }
    }
    for (int c = 0; c < nc; c++) {
        float t[ED_X16_ROWS];
        for (int k = 0; k < 4; k++) vst1q_f32(t + 4 * k, acc[c][k]);
        memcpy(s + c * bs, t, sizeof(float) * (size_t)nr);
    }
}
#undef X16N_DOTS

#define ED_X16N_ENTRY(name, KIND)                                                                            \
    static void x16n_gemm_##name(int n, float *s, size_t bs, const void *vx, int nr, const void *vy, size_t by, \
                                 const void *side, size_t side_row, int nc) {                                \
        const uint8_t *y = vy, *sd = side;                                                                   \
        for (; nc >= ED_X16N_NC; nc -= ED_X16N_NC, s += ED_X16N_NC * bs, y += ED_X16N_NC * by,               \
                                 sd += sd ? ED_X16N_NC * side_row : 0)                                        \
            x16n_gemm_nc(KIND, n, s, bs, vx, nr, y, by, sd, side_row, ED_X16N_NC);                           \
        if (nc == 1) x16n_gemm_nc(KIND, n, s, bs, vx, nr, y, by, sd, side_row, 1); /* (ED_X16N_NC is 2) */   \
    }

ED_X16N_ENTRY(q4_0, X16N_Q4_0)
ED_X16N_ENTRY(q4_1, X16N_Q4_1)
ED_X16N_ENTRY(iq4_nl, X16N_IQ4_NL)
ED_X16N_ENTRY(q8_0, X16N_Q8_0)
#undef ED_X16N_ENTRY

static void set_x16_neon(ed_kernel_table *t) {
    t->types[ED_Q4_0].x16_gemm = x16n_gemm_q4_0;
    t->types[ED_Q4_1].x16_gemm = x16n_gemm_q4_1;
    t->types[ED_IQ4_NL].x16_gemm = x16n_gemm_iq4_nl;
    t->types[ED_Q8_0].x16_gemm = x16n_gemm_q8_0;
}
