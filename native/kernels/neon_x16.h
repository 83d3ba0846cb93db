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

/* Q4_1, Q5_1: against Q8_1, their mins after the scales */
enum { X16N_Q4_0, X16N_IQ4_NL, X16N_Q8_0, X16N_Q4_1, X16N_Q5_0, X16N_Q5_1 };

/* the fifth bits of rows 4k..4k+3 of step t spread to bytes: 0xFF in each byte whose bit is set in mask
 * (the 64-bit masks 2t and 2t + 1, ed_kernels.h / x16.c's lane_masks: bit 4r + i is byte i of row r; Q5_0
 * passes them inverted, so its bytes say "clear") */
ED_INLINE void x16n_fifth_bytes(const uint8x16_t mask, const int k, uint8x16_t *lo, uint8x16_t *hi) {
    static const uint8_t bit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    const uint8x16_t m = vld1q_u8(bit);
    /* byte 2k of a mask holds rows 4k, 4k + 1, byte 2k + 1 rows 4k + 2, 4k + 3: each spread over 8 bytes */
    const uint8x16_t idx = vcombine_u8(vdup_n_u8((uint8_t)(2 * k)), vdup_n_u8((uint8_t)(2 * k + 1)));
    *lo = vtstq_u8(vqtbl1q_u8(mask, idx), m);
    *hi = vtstq_u8(vqtbl1q_u8(mask, vaddq_u8(idx, vdupq_n_u8(8))), m);
}

/* step t (0..3) of a group block's quants (q: after the 16 scales, and Q4_1's / Q5_1's 16 mins) as signed bytes: lo[k] (rows 4k..4k+3)
 * meets the activation's bytes 4t..4t+3, hi[k] its bytes 16 + 4t..16 + 4t + 3 */
ED_INLINE void x16n_step(const int kind, const uint8_t *q, const int t, int8x16_t lo[4], int8x16_t hi[4]) {
    for (int k = 0; k < 4; k++) {
        if (kind == X16N_Q5_0) { /* 64 bytes of masks, then Q4_0's nibbles: q - 16 is the nibble, less 16
                                  * (0xF0 above it) where the fifth bit is clear */
            const uint8x16_t v = vld1q_u8(q + 64 + 64 * t + 16 * k);
            uint8x16_t cl, ch;
            x16n_fifth_bytes(vmvnq_u8(vld1q_u8(q + 16 * t)), k, &cl, &ch);
            lo[k] = vreinterpretq_s8_u8(vsliq_n_u8(v, cl, 4));  /* cl << 4 | v & 15 */
            hi[k] = vreinterpretq_s8_u8(vsriq_n_u8(ch, v, 4)); /* ch & 0xF0 | v >> 4 */
        } else if (kind == X16N_Q5_1) { /* the same layout, quants 0..31: 16 above the nibble where set */
            const uint8x16_t v = vld1q_u8(q + 64 + 64 * t + 16 * k), m31 = vdupq_n_u8(31);
            uint8x16_t sl, sh;
            x16n_fifth_bytes(vld1q_u8(q + 16 * t), k, &sl, &sh);
            lo[k] = vreinterpretq_s8_u8(vandq_u8(vsliq_n_u8(v, sl, 4), m31));
            hi[k] = vreinterpretq_s8_u8(vandq_u8(vsriq_n_u8(sh, v, 4), m31));
        } else if (kind == X16N_Q8_0) { /* chunk t: quants 4t.., chunk t + 4: quants 16 + 4t.. */
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
    const int nb = n / QK, q41 = kind == X16N_Q4_1 || kind == X16N_Q5_1; /* against Q8_1, with mins */
    const int off = kind == X16N_Q4_0 ? 8 : 0; /* Q5_0's quants come signed */
    const int block = kind == X16N_Q8_0   ? 34
                      : kind == X16N_Q5_0 ? 22
                      : kind == X16N_Q5_1 ? 24
                      : q41               ? 20
                                          : 18; /* the file's block bytes */
    const size_t gb = (size_t)ED_X16_ROWS * block;
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
ED_X16N_ENTRY(q5_0, X16N_Q5_0)
ED_X16N_ENTRY(q5_1, X16N_Q5_1)
#undef ED_X16N_ENTRY

/* ---- K-quants: one super-block of 16 rows against one activation row at a time (prompts included: two
 * rows at once spill registers and model slower per dot than one, scripts/neon_mca.py). The float steps per
 * super-block are those of kernel_check's x16_ref_q4_K / x16_ref_q6_K and of the AVX2 and AVX-512 kernels
 * (avx2_x16.h) on exact integer sums, so the bits are theirs. A sub-block's 16 row dots are 4 int32 vectors
 * of sdot by element; each row's scale then multiplies its lane (mla): a row's sum is the same integer in
 * any order. */

/* the 16 rows' sums (4 vectors of 4 rows) to s[0..nr) */
ED_INLINE void x16n_store(float *s, const float32x4_t acc[4], int nr) {
    float t[ED_X16_ROWS];
    for (int k = 0; k < 4; k++) vst1q_f32(t + 4 * k, acc[k]);
    memcpy(s, t, sizeof(float) * (size_t)nr);
}

/* a super-block's float step for its 16 rows (4 vectors of 4): acc = fma(d * d_y, isum, acc), then, given
 * msum, acc = acc - (dmin * d_y) * msum in one rounding (vfms); the rows' f16 d at g, dmin 32 bytes on */
ED_INLINE void x16n_k_fold(float32x4_t acc[4], const uint8_t *g, float dy, const int32x4_t isum[4],
                           const int32x4_t *msum) {
    for (int k = 0; k < 4; k++) {
        const float32x4_t d = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)g + 4 * k)));
        acc[k] = vfmaq_f32(acc[k], vmulq_n_f32(d, dy), vcvtq_f32_s32(isum[k]));
        if (msum) {
            const float32x4_t dmin = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)(g + 32) + 4 * k)));
            acc[k] = vfmsq_f32(acc[k], vmulq_n_f32(dmin, dy), vcvtq_f32_s32(msum[k]));
        }
    }
}

/* bytes 4k..4k+3 of v (rows 4k..4k+3) widened to int32 lanes, unsigned or signed */
ED_INLINE int32x4_t x16n_u8_rows(const uint8x16_t v, const int k) {
    const uint16x8_t h = k < 2 ? vmovl_u8(vget_low_u8(v)) : vmovl_high_u8(v);
    return vreinterpretq_s32_u32(k & 1 ? vmovl_high_u16(h) : vmovl_u16(vget_low_u16(h)));
}

ED_INLINE int32x4_t x16n_s8_rows(const int8x16_t v, const int k) {
    const int16x8_t h = k < 2 ? vmovl_s8(vget_low_s8(v)) : vmovl_high_s8(v);
    return k & 1 ? vmovl_high_s16(h) : vmovl_s16(vget_low_s16(h));
}

/* Q4_K (and Q5_K, q5: the layout's offsets Q5K_*, each quant's fifth bit from its qh byte's bit j):
 * the layout's offsets Q4K_* (x16.c lane_q4_K): pair p's chunk j holds 4 quant bytes of each row, low
 * nibbles sub-block 2p, high 2p + 1; isum = Σ_j sc_j * dot_j, msum = Σ_j m_j * (the activation's sum over
 * sub-block j), then acc = fma(d * d_y, isum, acc), acc = acc - (dmin * d_y) * msum (one rounding each).
 * Each loaded vector gives both sub-blocks of its pair. */

/* the 4 lanes of an activation vector take immediates: chunk 4i + t of the pair meets lane t */
#define X16N_Q4K_PAIR(t)                                                                                     \
    for (int k = 0; k < 4; k++) {                                                                            \
        const uint8x16_t v = vld1q_u8(q + 64 * (4 * i + (t)) + 16 * k);                                      \
        int8x16_t wl = vreinterpretq_s8_u8(vandq_u8(v, m4)), wh = vreinterpretq_s8_u8(vshrq_n_u8(v, 4));     \
        if (q5) { /* the fifth bits (qh >> 2p: bit 0 low, bit 1 high nibbles) at bit 4 */                   \
            const uint8x16_t f = vshlq_u8(vld1q_u8(g + Q5K_QH + 64 * (4 * i + (t)) + 16 * k), down);          \
            wl = vreinterpretq_s8_u8(vandq_u8(vsliq_n_u8(v, f, 4), m31));                                    \
            wh = vreinterpretq_s8_u8(vsriq_n_u8(vandq_u8(vshlq_n_u8(f, 3), m16), v, 4));                     \
        }                                                                                                    \
        dl[k] = vdotq_laneq_s32(dl[k], wl, yl, t);                                                           \
        dh[k] = vdotq_laneq_s32(dh[k], wh, yh, t);                                                           \
    }

ED_INLINE void x16n_k_1(int n, float *s, const uint8_t *vx, int nr, const block_q8_K *yb, const int q5) {
    const uint8x16_t m4 = vdupq_n_u8(0x0F), m16 = vdupq_n_u8(16), m31 = vdupq_n_u8(31);
    const size_t group = q5 ? Q5K_GROUP : Q4K_GROUP;
    float32x4_t acc[4] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
    for (int b = 0; b < n / QK_K; b++) {
        const uint8_t *g = vx + (size_t)b * group;
        const block_q8_K *y = yb + b;
        int32x4_t isum[4] = {vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0)};
        for (int p = 0; p < 4; p++) {
            const uint8_t *q = g + (q5 ? Q5K_QS : Q4K_QS) + 512 * p;
            const int8x16_t down = vdupq_n_s8((int8_t)(-2 * p));
            int32x4_t dl[4], dh[4];
            for (int k = 0; k < 4; k++) dl[k] = dh[k] = vdupq_n_s32(0);
            for (int i = 0; i < 2; i++) {
                const int8x16_t yl = vld1q_s8(y->qs + 64 * p + 16 * i), yh = vld1q_s8(y->qs + 64 * p + 32 + 16 * i);
                X16N_Q4K_PAIR(0)
                X16N_Q4K_PAIR(1)
                X16N_Q4K_PAIR(2)
                X16N_Q4K_PAIR(3)
            }
            const uint8x16_t sl = vld1q_u8(g + Q4K_SC + 32 * p), sh = vld1q_u8(g + Q4K_SC + 32 * p + 16);
            for (int k = 0; k < 4; k++) {
                isum[k] = vmlaq_s32(isum[k], dl[k], x16n_u8_rows(sl, k));
                isum[k] = vmlaq_s32(isum[k], dh[k], x16n_u8_rows(sh, k));
            }
        }
        int32x4_t msum[4] = {vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0)};
        for (int i = 0; i < 4; i++) {
            const uint8x16x2_t m = vld2q_u8(g + Q4K_MIN + 32 * i); /* the 16 rows' m_2i, then m_2i+1 */
            for (int o = 0; o < 2; o++) {
                const int16_t ys = (int16_t)(y->bsums[4 * i + 2 * o] + y->bsums[4 * i + 2 * o + 1]);
                const int16x8_t lo = vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(m.val[o])));
                const int16x8_t hi = vreinterpretq_s16_u16(vmovl_high_u8(m.val[o]));
                msum[0] = vmlal_n_s16(msum[0], vget_low_s16(lo), ys);
                msum[1] = vmlal_high_n_s16(msum[1], lo, ys);
                msum[2] = vmlal_n_s16(msum[2], vget_low_s16(hi), ys);
                msum[3] = vmlal_high_n_s16(msum[3], hi, ys);
            }
        }
        x16n_k_fold(acc, g, y->d, isum, msum);
    }
    x16n_store(s, acc, nr);
}
#undef X16N_Q4K_PAIR
static void x16n_q4_K_1(int n, float *s, const uint8_t *vx, int nr, const block_q8_K *yb) { x16n_k_1(n, s, vx, nr, yb, 0); }
static void x16n_q5_K_1(int n, float *s, const uint8_t *vx, int nr, const block_q8_K *yb) { x16n_k_1(n, s, vx, nr, yb, 1); }

/* Q6_K: the layout's offsets Q6K_* (x16.c lane_q6_K): ql chunk c holds ql[4c..4c+3] of each row, qh chunk c
 * qh[4c..4c+3]. Sub-block sb (16 quants) is half h = sb / 8, quarter t = sb % 8 / 2 (ggml
 * dequantize_row_q6_K's q1..q4), bytes 16 (sb % 2).. of its ql (t even: ql[64h..], odd: ql[64h + 32..];
 * t < 2 low nibbles, else high) and qh[32h + 16 (sb % 2)..] (bits 2t, 2t + 1). A sub-block's row dot starts
 * at -32 * (the activation's sum over it), so isum = Σ_sb sc_sb * Σ (q - 32) y, exactly the integer of the
 * AVX2 kernel's isum - 32 * msum; then acc = fma(d * d_y, isum, acc). Each chunk's loads give its 4
 * quarters (sub-blocks 8h + 2t + q, t = 0..3). */

/* quarter t's quants 0..63 of a chunk (a: its ql[64h..] bytes, b: ql[64h + 32..], qh, and qh >> 2) */
ED_INLINE int8x16_t x16n_q6(const int t, uint8x16_t a, uint8x16_t b, uint8x16_t qh, uint8x16_t qh2) {
    const uint8x16_t m6 = vdupq_n_u8(0x3F);
    switch (t) {
    case 0: return vreinterpretq_s8_u8(vandq_u8(vsliq_n_u8(a, qh, 4), m6));  /* a & 15 | (qh & 3) << 4 */
    case 1: return vreinterpretq_s8_u8(vandq_u8(vsliq_n_u8(b, qh2, 4), m6)); /* b & 15 | (qh >> 2 & 3) << 4 */
    case 2: return vreinterpretq_s8_u8(vandq_u8(vsriq_n_u8(qh, a, 4), m6));  /* a >> 4 | qh & 0x30 */
    default: return vreinterpretq_s8_u8(vsriq_n_u8(qh2, b, 4));             /* b >> 4 | (qh >> 2) & 0x30 */
    }
}

/* chunk step k (an immediate lane) of rows 4kk..4kk+3: the 4 quarters' dots */
#define X16N_Q6K_QUARTERS(k)                                                                                 \
    do {                                                                                                     \
        const uint8x16_t a = vld1q_u8(g + Q6K_QL + 64 * (16 * h + 4 * q + (k)) + 16 * kk);                   \
        const uint8x16_t b8 = vld1q_u8(g + Q6K_QL + 64 * (16 * h + 8 + 4 * q + (k)) + 16 * kk);              \
        const uint8x16_t qh = vld1q_u8(g + Q6K_QH + 64 * (8 * h + 4 * q + (k)) + 16 * kk);                   \
        const uint8x16_t qh2 = vshrq_n_u8(qh, 2);                                                            \
        for (int t = 0; t < 4; t++) dot[t] = vdotq_laneq_s32(dot[t], x16n_q6(t, a, b8, qh, qh2), yv[t], k);  \
    } while (0)

static void x16n_q6_K_1(int n, float *s, const uint8_t *vx, int nr, const block_q8_K *yb) {
    float32x4_t acc[4] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
    for (int b = 0; b < n / QK_K; b++) {
        const uint8_t *g = vx + (size_t)b * Q6K_GROUP;
        const block_q8_K *y = yb + b;
        int32x4_t isum[4] = {vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0)};
        for (int hq = 0; hq < 4; hq++) {
            const int h = hq / 2, q = hq % 2;
            int8x16_t yv[4], sc[4];
            for (int t = 0; t < 4; t++) {
                yv[t] = vld1q_s8(y->qs + 16 * (8 * h + 2 * t + q));
                sc[t] = vld2q_s8((const int8_t *)g + Q6K_SC + 32 * (4 * h + t)).val[q]; /* pair 4h + t, odd q */
            }
            for (int kk = 0; kk < 4; kk++) { /* rows 4kk..4kk+3 */
                int32x4_t dot[4];
                for (int t = 0; t < 4; t++) dot[t] = vdupq_n_s32(-32 * y->bsums[8 * h + 2 * t + q]);
                X16N_Q6K_QUARTERS(0);
                X16N_Q6K_QUARTERS(1);
                X16N_Q6K_QUARTERS(2);
                X16N_Q6K_QUARTERS(3);
                for (int t = 0; t < 4; t++) isum[kk] = vmlaq_s32(isum[kk], dot[t], x16n_s8_rows(sc[t], kk));
            }
        }
        x16n_k_fold(acc, g, y->d, isum, NULL);
    }
    x16n_store(s, acc, nr);
}
#undef X16N_Q6K_QUARTERS

/* Q3_K: the layout's offsets Q3K_* (x16.c lane_q3_K). Sub-block sb = 8n + 2j + h: qs chunks 8n + 4h + k
 * shifted down by 2j (2 low bits), hmask chunks 4h + k bit 4n + j (set: + 4), so each quant is q + 4 (0..7)
 * and its row dot starts at -4 * (the activation's sum over the sub-block): isum = Σ_sb sc_sb * Σ q y,
 * exactly the AVX2 / AVX-512 kernels' isum - 4 * msum; then acc = fma(d * d_y, isum, acc). Each pair of
 * chunk loads gives its 4 sub-blocks (j = 0..3): the low bits shifted down by 2j, the high bit moved to
 * bit 2, one bit select and a mask (scripts/neon_mca.py: 2.91 cycles a dot against vec_dot_nx's 3.31; a
 * sub-block at a time, 6 vector operations an sdot, it modelled 5.57). */
ED_INLINE int8x16_t x16n_q3(const int j, uint8x16_t qs, uint8x16_t hm) {
    const uint8x16_t m3 = vdupq_n_u8(3), m7 = vdupq_n_u8(7);
    switch (j) { /* bits 0-1: qs >> 2j, bit 2: bit j of hm */
    case 0: return vreinterpretq_s8_u8(vandq_u8(vsliq_n_u8(qs, hm, 2), m7));
    case 1: return vreinterpretq_s8_u8(vandq_u8(vbslq_u8(m3, vshrq_n_u8(qs, 2), vshlq_n_u8(hm, 1)), m7));
    case 2: return vreinterpretq_s8_u8(vandq_u8(vbslq_u8(m3, vshrq_n_u8(qs, 4), hm), m7));
    default: return vreinterpretq_s8_u8(vandq_u8(vsriq_n_u8(vshrq_n_u8(hm, 1), qs, 6), m7));
    }
}

#define X16N_Q3K_STEP(k)                                                                                     \
    do {                                                                                                     \
        const uint8x16_t qs = vld1q_u8(g + Q3K_QS + 64 * (8 * nn + 4 * h + (k)) + 16 * kk);                  \
        const uint8x16_t hm0 = vld1q_u8(g + Q3K_HM + 64 * (4 * h + (k)) + 16 * kk);                          \
        const uint8x16_t hm = nn ? vshrq_n_u8(hm0, 4) : hm0;                                                 \
        for (int j = 0; j < 4; j++) dot[j] = vdotq_laneq_s32(dot[j], x16n_q3(j, qs, hm), yv[j], k);          \
    } while (0)

static void x16n_q3_K_1(int n, float *s, const uint8_t *vx, int nr, const block_q8_K *yb) {
    float32x4_t acc[4] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
    for (int b = 0; b < n / QK_K; b++) {
        const uint8_t *g = vx + (size_t)b * Q3K_GROUP;
        const block_q8_K *y = yb + b;
        int32x4_t isum[4] = {vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0)};
        for (int nh = 0; nh < 4; nh++) { /* sub-blocks 8nn + 2j + h, j = 0..3 */
            const int nn = nh / 2, h = nh % 2;
            int8x16_t yv[4], sc[4];
            for (int j = 0; j < 4; j++) {
                yv[j] = vld1q_s8(y->qs + 16 * (8 * nn + 2 * j + h));
                sc[j] = vld2q_s8((const int8_t *)g + Q3K_SC + 32 * (4 * nn + j)).val[h]; /* pair 4nn + j */
            }
            for (int kk = 0; kk < 4; kk++) { /* rows 4kk..4kk+3 */
                int32x4_t dot[4];
                for (int j = 0; j < 4; j++) dot[j] = vdupq_n_s32(-4 * y->bsums[8 * nn + 2 * j + h]);
                X16N_Q3K_STEP(0);
                X16N_Q3K_STEP(1);
                X16N_Q3K_STEP(2);
                X16N_Q3K_STEP(3);
                for (int j = 0; j < 4; j++) isum[kk] = vmlaq_s32(isum[kk], dot[j], x16n_s8_rows(sc[j], kk));
            }
        }
        x16n_k_fold(acc, g, y->d, isum, NULL);
    }
    x16n_store(s, acc, nr);
}
#undef X16N_Q3K_STEP

/* Q2_K: the layout's offsets Q2K_* (x16.c lane_q2_K): sub-block sb's quants are chunks 8 (sb / 8) + 4 (sb %
 * 2) + k shifted down by 2 (sb % 8 / 2), its rows' scale bytes (scale | min << 4) at Q2K_SC + 16 sb;
 * isum = Σ_sb sc_sb * dot_sb, msum = Σ_sb m_sb * bsum_sb, then acc = fma(d * d_y, isum, acc) and acc =
 * acc - (dmin * d_y) * msum in one rounding (vfms): the AVX2 and AVX-512 kernels' steps. */
#define X16N_Q2K_STEP(k)                                                                                     \
    dot = vdotq_laneq_s32(dot, vreinterpretq_s8_u8(vandq_u8(vshlq_u8(vld1q_u8(q + 64 * (k) + 16 * kk), shift), m3)), yv, k)

static void x16n_q2_K_1(int n, float *s, const uint8_t *vx, int nr, const block_q8_K *yb) {
    float32x4_t acc[4] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
    const uint8x16_t m3 = vdupq_n_u8(3), m15 = vdupq_n_u8(15);
    for (int b = 0; b < n / QK_K; b++) {
        const uint8_t *g = vx + (size_t)b * Q2K_GROUP;
        const block_q8_K *y = yb + b;
        int32x4_t isum[4], msum[4];
        for (int k = 0; k < 4; k++) isum[k] = msum[k] = vdupq_n_s32(0);
        for (int sb = 0; sb < 16; sb++) {
            const uint8_t *q = g + Q2K_QS + 64 * (8 * (sb / 8) + 4 * (sb % 2));
            const int8x16_t shift = vdupq_n_s8((int8_t)(-2 * (sb % 8 / 2))), yv = vld1q_s8(y->qs + 16 * sb);
            const uint8x16_t scm = vld1q_u8(g + Q2K_SC + 16 * sb), sc = vandq_u8(scm, m15), mn = vshrq_n_u8(scm, 4);
            for (int kk = 0; kk < 4; kk++) { /* rows 4kk..4kk+3 */
                int32x4_t dot = vdupq_n_s32(0);
                X16N_Q2K_STEP(0);
                X16N_Q2K_STEP(1);
                X16N_Q2K_STEP(2);
                X16N_Q2K_STEP(3);
                isum[kk] = vmlaq_s32(isum[kk], dot, x16n_u8_rows(sc, kk));
                msum[kk] = vmlaq_n_s32(msum[kk], x16n_u8_rows(mn, kk), y->bsums[sb]);
            }
        }
        x16n_k_fold(acc, g, y->d, isum, msum);
    }
    x16n_store(s, acc, nr);
}
#undef X16N_Q2K_STEP

#define ED_X16N_KQUANT_ENTRY(name)                                                                           \
    static void x16n_gemm_##name(int n, float *s, size_t bs, const void *vx, int nr, const void *vy, size_t by, \
                                 const void *side, size_t side_row, int nc) {                                \
        (void)side, (void)side_row;                                                                          \
        for (int c = 0; c < nc; c++) x16n_##name##_1(n, s + c * bs, vx, nr, (const block_q8_K *)((const uint8_t *)vy + c * by)); \
    }

ED_X16N_KQUANT_ENTRY(q2_K)
ED_X16N_KQUANT_ENTRY(q3_K)
ED_X16N_KQUANT_ENTRY(q4_K)
ED_X16N_KQUANT_ENTRY(q5_K)
ED_X16N_KQUANT_ENTRY(q6_K)
#undef ED_X16N_KQUANT_ENTRY

static void set_x16_neon(ed_kernel_table *t) {
    t->types[ED_Q4_0].x16_gemm = x16n_gemm_q4_0;
    t->types[ED_Q4_1].x16_gemm = x16n_gemm_q4_1;
    t->types[ED_IQ4_NL].x16_gemm = x16n_gemm_iq4_nl;
    t->types[ED_Q8_0].x16_gemm = x16n_gemm_q8_0;
    t->types[ED_Q5_0].x16_gemm = x16n_gemm_q5_0;
    t->types[ED_Q5_1].x16_gemm = x16n_gemm_q5_1;
    t->types[ED_Q2_K].x16_gemm = x16n_gemm_q2_K;
    t->types[ED_Q3_K].x16_gemm = x16n_gemm_q3_K;
    t->types[ED_Q4_K].x16_gemm = x16n_gemm_q4_K;
    t->types[ED_Q5_K].x16_gemm = x16n_gemm_q5_K;
    t->types[ED_Q6_K].x16_gemm = x16n_gemm_q6_K;
}
