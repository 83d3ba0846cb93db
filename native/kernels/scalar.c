/* Portable C99 kernels: activation quantizers and vec_dot for every supported weight type.
 *
 * The reference every SIMD level is tested against, and the fallback where none runs. Dot products mirror
 * ggml-org/llama.cpp ggml/src/ggml-cpu/quants.c (ggml_vec_dot_*_generic) and vec.cpp (ggml_vec_dot_f16 ...);
 * the Q8_0/Q8_1 quantizers mirror ggml-cpu/arch/x86/quants.c quantize_row_q8_0/q8_1 (d = amax/127,
 * q = rint(x * 127/amax), s = f16(d * sum q)), Q8_K mirrors ggml-quants.c quantize_row_q8_K_ref.
 */
#include <math.h>

#include "ed_blocks.h"

/* ------------------------------------------------------------------------- activation quantizers */

static float amax32(const float *x) {
    float amax = 0.0f;
    for (int j = 0; j < QK; j++) {
        const float a = fabsf(x[j]);
        amax = a > amax ? a : amax;
    }
    return amax;
}

static void quantize_q8_0(const float *x, void *vy, int64_t n) {
    block_q8_0 *y = vy;
    for (int64_t i = 0; i < n / QK; i++, x += QK) {
        const float amax = amax32(x);
        const float id = amax != 0.0f ? 127.f / amax : 0.0f;
        y[i].d = ed_f32_to_f16(amax / 127.f);
        for (int j = 0; j < QK; j++) y[i].qs[j] = (int8_t)ed_nearest_int(x[j] * id);
    }
}

static void quantize_q8_1(const float *x, void *vy, int64_t n) {
    block_q8_1 *y = vy;
    for (int64_t i = 0; i < n / QK; i++, x += QK) {
        const float amax = amax32(x);
        const float d = amax / 127.f;
        const float id = amax != 0.0f ? 127.f / amax : 0.0f;
        int sum = 0;
        for (int j = 0; j < QK; j++) {
            const int q = ed_nearest_int(x[j] * id);
            y[i].qs[j] = (int8_t)q;
            sum += q;
        }
        y[i].d = ed_f32_to_f16(d);
        y[i].s = ed_f32_to_f16(d * (float)sum);
    }
}

static void quantize_q8_K(const float *x, void *vy, int64_t n) {
    block_q8_K *y = vy;
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        float max = 0.0f, amax = 0.0f; /* max: the signed value of largest magnitude, first on ties */
        for (int j = 0; j < QK_K; j++) {
            const float a = fabsf(x[j]);
            if (a > amax) { amax = a; max = x[j]; }
        }
        if (amax == 0.0f) {
            memset(&y[i], 0, sizeof(y[i]));
            continue;
        }
        const float iscale = -127.f / max;
        for (int g = 0; g < QK_K / 16; g++) {
            int sum = 0;
            for (int j = 16 * g; j < 16 * g + 16; j++) {
                int q = ed_nearest_int(iscale * x[j]);
                q = q < 127 ? q : 127;
                y[i].qs[j] = (int8_t)q;
                sum += q;
            }
            y[i].bsums[g] = (int16_t)sum;
        }
        y[i].d = 1.0f / iscale;
    }
}

static void convert_f16(const float *x, void *vy, int64_t n) {
    uint16_t *y = vy;
    for (int64_t i = 0; i < n; i++) y[i] = ed_f32_to_f16(x[i]);
}

static void convert_bf16(const float *x, void *vy, int64_t n) {
    uint16_t *y = vy;
    for (int64_t i = 0; i < n; i++) y[i] = ed_f32_to_bf16(x[i]);
}

static void convert_f32(const float *x, void *vy, int64_t n) { memcpy(vy, x, (size_t)n * sizeof(float)); }

/* ------------------------------------------------------------------------- legacy 32-element blocks */

static void vec_dot_q4_0(int n, float *s, const void *vx, const void *vy) {
    const block_q4_0 *x = vx;
    const block_q8_0 *y = vy;
    float sumf = 0.0f;
    for (int ib = 0; ib < n / QK; ib++) {
        int sumi = 0;
        for (int j = 0; j < QK / 2; j++) {
            sumi += ((x[ib].qs[j] & 0x0F) - 8) * y[ib].qs[j];
            sumi += ((x[ib].qs[j] >> 4) - 8) * y[ib].qs[j + QK / 2];
        }
        sumf += (float)sumi * (ed_f16_table[ed_load_u16(&x[ib].d)] * ed_f16_table[y[ib].d]);
    }
    *s = sumf;
}

static void vec_dot_q4_1(int n, float *s, const void *vx, const void *vy) {
    const block_q4_1 *x = vx;
    const block_q8_1 *y = vy;
    float sumf = 0.0f;
    for (int ib = 0; ib < n / QK; ib++) {
        int sumi = 0;
        for (int j = 0; j < QK / 2; j++) {
            sumi += (x[ib].qs[j] & 0x0F) * y[ib].qs[j];
            sumi += (x[ib].qs[j] >> 4) * y[ib].qs[j + QK / 2];
        }
        sumf += (ed_f16_table[ed_load_u16(&x[ib].d)] * ed_f16_table[y[ib].d]) * (float)sumi +
                ed_f16_table[ed_load_u16(&x[ib].m)] * ed_f16_table[y[ib].s];
    }
    *s = sumf;
}

static void vec_dot_q5_0(int n, float *s, const void *vx, const void *vy) {
    const block_q5_0 *x = vx;
    const block_q8_0 *y = vy;
    float sumf = 0.0f;
    for (int ib = 0; ib < n / QK; ib++) {
        uint32_t qh;
        memcpy(&qh, x[ib].qh, 4);
        int sumi = 0;
        for (int j = 0; j < QK / 2; j++) {
            const int x0 = (int)((x[ib].qs[j] & 0x0F) | (((qh >> j) & 1) << 4)) - 16;
            const int x1 = (int)((x[ib].qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16;
            sumi += x0 * y[ib].qs[j] + x1 * y[ib].qs[j + QK / 2];
        }
        sumf += (ed_f16_table[ed_load_u16(&x[ib].d)] * ed_f16_table[y[ib].d]) * (float)sumi;
    }
    *s = sumf;
}

static void vec_dot_q5_1(int n, float *s, const void *vx, const void *vy) {
    const block_q5_1 *x = vx;
    const block_q8_1 *y = vy;
    float sumf = 0.0f;
    for (int ib = 0; ib < n / QK; ib++) {
        uint32_t qh;
        memcpy(&qh, x[ib].qh, 4);
        int sumi = 0;
        for (int j = 0; j < QK / 2; j++) {
            const int x0 = (int)((x[ib].qs[j] & 0x0F) | (((qh >> j) & 1) << 4));
            const int x1 = (int)((x[ib].qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
            sumi += x0 * y[ib].qs[j] + x1 * y[ib].qs[j + QK / 2];
        }
        sumf += (ed_f16_table[ed_load_u16(&x[ib].d)] * ed_f16_table[y[ib].d]) * (float)sumi +
                ed_f16_table[ed_load_u16(&x[ib].m)] * ed_f16_table[y[ib].s];
    }
    *s = sumf;
}

static void vec_dot_q8_0(int n, float *s, const void *vx, const void *vy) {
    const block_q8_0 *x = vx;
    const block_q8_0 *y = vy;
    float sumf = 0.0f;
    for (int ib = 0; ib < n / QK; ib++) {
        int sumi = 0;
        for (int j = 0; j < QK; j++) sumi += x[ib].qs[j] * y[ib].qs[j];
        sumf += (float)sumi * (ed_f16_table[ed_load_u16(&x[ib].d)] * ed_f16_table[y[ib].d]);
    }
    *s = sumf;
}

static void vec_dot_iq4_nl(int n, float *s, const void *vx, const void *vy) {
    const block_iq4_nl *x = vx;
    const block_q8_0 *y = vy;
    float sumf = 0.0f;
    for (int ib = 0; ib < n / QK; ib++) {
        int sumi = 0;
        for (int j = 0; j < QK / 2; j++) {
            sumi += y[ib].qs[j] * ed_kvalues_iq4nl[x[ib].qs[j] & 0x0F];
            sumi += y[ib].qs[j + QK / 2] * ed_kvalues_iq4nl[x[ib].qs[j] >> 4];
        }
        sumf += (ed_f16_table[y[ib].d] * ed_f16_table[ed_load_u16(&x[ib].d)]) * (float)sumi;
    }
    *s = sumf;
}

/* --------------------------------------------------------------------------- K-quants (vs Q8_K) */

/* Σ bsums[j] * mins[j/2]: the block-minimum term of Q4_K/Q5_K, from Q8_K's precomputed 16-element sums */
static int mins_dot_bsums(const uint8_t *mins, const int16_t *bsums) {
    int sum = 0;
    for (int j = 0; j < QK_K / 16; j++) sum += bsums[j] * mins[j / 2];
    return sum;
}

/* ggml_vec_dot_q2_K_q8_K_generic. Each 16 quants have a 4-bit scale (low nibble of scales[j]) and a 4-bit
 * min (high nibble); bits 2k, 2k+1 of qs[32h + l] are quant 128h + 32k + l. */
static void vec_dot_q2_K(int n, float *s, const void *vx, const void *vy) {
    const block_q2_K *x = vx;
    const block_q8_K *y = vy;
    float sumf = 0.0f;
    for (int i = 0; i < n / QK_K; i++) {
        const uint8_t *q2 = x[i].qs, *sc = x[i].scales;
        const int8_t *q8 = y[i].qs;
        int summs = 0;
        for (int j = 0; j < QK_K / 16; j++) summs += y[i].bsums[j] * (sc[j] >> 4);
        int isum = 0;
        for (int h = 0; h < QK_K / 128; h++, q2 += 32)
            for (int shift = 0; shift < 8; shift += 2, q8 += 32, sc += 2) {
                int lo = 0, hi = 0; /* quants 0..15 and 16..31 of this chunk: two scale groups */
                for (int l = 0; l < 16; l++) {
                    lo += q8[l] * ((q2[l] >> shift) & 3);
                    hi += q8[l + 16] * ((q2[l + 16] >> shift) & 3);
                }
                isum += (sc[0] & 0xF) * lo + (sc[1] & 0xF) * hi;
            }
        const float dall = y[i].d * ed_f16_table[ed_load_u16(&x[i].d)];
        const float dmin = y[i].d * ed_f16_table[ed_load_u16(&x[i].dmin)];
        sumf += dall * (float)isum - dmin * (float)summs;
    }
    *s = sumf;
}

/* ggml_vec_dot_q3_K_q8_K_generic: quant = the 2 low bits in qs (laid out as Q2_K's), minus 4 where its
 * hmask bit (bit 4h + k of hmask[l] for chunk k of half h) is clear; 16 6-bit scales stored +32. ggml's
 * generic code spreads the integer sums over 8 float lanes; as vec_dot_q6_K, one exact sum per block here. */
static void vec_dot_q3_K(int n, float *s, const void *vx, const void *vy) {
    const block_q3_K *x = vx;
    const block_q8_K *y = vy;
    float sumf = 0.0f;
    for (int i = 0; i < n / QK_K; i++) {
        uint32_t utmp[4];
        ed_unpack_scales_q3(x[i].scales, utmp);
        const uint8_t *q3 = x[i].qs, *hm = x[i].hmask, *sc = (const uint8_t *)utmp;
        const int8_t *q8 = y[i].qs;
        int sumi = 0;
        unsigned m = 1;
        for (int h = 0; h < QK_K / 128; h++, q3 += 32)
            for (int shift = 0; shift < 8; shift += 2, m <<= 1, q8 += 32, sc += 2) {
                int lo = 0, hi = 0;
                for (int l = 0; l < 16; l++) {
                    lo += q8[l] * (((q3[l] >> shift) & 3) - (hm[l] & m ? 0 : 4));
                    hi += q8[l + 16] * (((q3[l + 16] >> shift) & 3) - (hm[l + 16] & m ? 0 : 4));
                }
                sumi += (sc[0] - 32) * lo + (sc[1] - 32) * hi;
            }
        sumf += (ed_f16_table[ed_load_u16(&x[i].d)] * y[i].d) * (float)sumi;
    }
    *s = sumf;
}

static void vec_dot_q4_K(int n, float *s, const void *vx, const void *vy) {
    const block_q4_K *x = vx;
    const block_q8_K *y = vy;
    float sumf = 0.0f;
    for (int i = 0; i < n / QK_K; i++) {
        uint32_t utmp[4];
        ed_unpack_scales_k4(x[i].scales, utmp);
        const uint8_t *sc = (const uint8_t *)utmp, *mn = sc + 8;
        const uint8_t *q4 = x[i].qs;
        const int8_t *q8 = y[i].qs;
        int sumi = 0;
        for (int j = 0; j < QK_K / 64; j++, q4 += 32, q8 += 64) {
            int lo = 0, hi = 0;
            for (int l = 0; l < 32; l++) {
                lo += (q4[l] & 0x0F) * q8[l];
                hi += (q4[l] >> 4) * q8[l + 32];
            }
            sumi += sc[2 * j] * lo + sc[2 * j + 1] * hi;
        }
        const float d = ed_f16_table[ed_load_u16(&x[i].d)] * y[i].d;
        const float dmin = ed_f16_table[ed_load_u16(&x[i].dmin)] * y[i].d;
        sumf += d * (float)sumi - dmin * (float)mins_dot_bsums(mn, y[i].bsums);
    }
    *s = sumf;
}

static void vec_dot_q5_K(int n, float *s, const void *vx, const void *vy) {
    const block_q5_K *x = vx;
    const block_q8_K *y = vy;
    float sumf = 0.0f;
    for (int i = 0; i < n / QK_K; i++) {
        uint32_t utmp[4];
        ed_unpack_scales_k4(x[i].scales, utmp);
        const uint8_t *sc = (const uint8_t *)utmp, *mn = sc + 8;
        const uint8_t *q4 = x[i].qs, *qh = x[i].qh;
        const int8_t *q8 = y[i].qs;
        int sumi = 0;
        for (int j = 0; j < QK_K / 64; j++, q4 += 32, q8 += 64) {
            int lo = 0, hi = 0;
            for (int l = 0; l < 32; l++) {
                lo += ((q4[l] & 0x0F) | (((qh[l] >> (2 * j)) & 1) << 4)) * q8[l];
                hi += ((q4[l] >> 4) | (((qh[l] >> (2 * j + 1)) & 1) << 4)) * q8[l + 32];
            }
            sumi += sc[2 * j] * lo + sc[2 * j + 1] * hi;
        }
        const float d = ed_f16_table[ed_load_u16(&x[i].d)] * y[i].d;
        const float dmin = ed_f16_table[ed_load_u16(&x[i].dmin)] * y[i].d;
        sumf += d * (float)sumi - dmin * (float)mins_dot_bsums(mn, y[i].bsums);
    }
    *s = sumf;
}

static void vec_dot_q6_K(int n, float *s, const void *vx, const void *vy) {
    const block_q6_K *x = vx;
    const block_q8_K *y = vy;
    float sumf = 0.0f;
    for (int i = 0; i < n / QK_K; i++) {
        const uint8_t *ql = x[i].ql, *qh = x[i].qh;
        const int8_t *q8 = y[i].qs, *sc = x[i].scales;
        int sumi = 0;
        /* each 128-element half: ql[0..63] low nibbles -> elements 0..63, high -> 64..127; qh 2 bits each */
        for (int h = 0; h < 2; h++, ql += 64, qh += 32, q8 += 128, sc += 8) {
            for (int g = 0; g < 2; g++) { /* 16-element groups l = 16g .. 16g+15 share a scale */
                int s0 = 0, s1 = 0, s2 = 0, s3 = 0;
                for (int l = 16 * g; l < 16 * g + 16; l++) {
                    s0 += (((ql[l] & 0x0F) | ((qh[l] & 3) << 4)) - 32) * q8[l];
                    s1 += (((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32) * q8[l + 32];
                    s2 += (((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32) * q8[l + 64];
                    s3 += (((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32) * q8[l + 96];
                }
                sumi += sc[g] * s0 + sc[g + 2] * s1 + sc[g + 4] * s2 + sc[g + 6] * s3;
            }
        }
        sumf += (ed_f16_table[ed_load_u16(&x[i].d)] * y[i].d) * (float)sumi;
    }
    *s = sumf;
}

/* ---------------------------------------------------------- float types: f32 accumulation in 8 lanes */

#define FLOAT_DOT(name, T, CONV)                                                     \
    static void name(int n, float *s, const void *vx, const void *vy) {             \
        const T *x = vx, *y = vy;                                                     \
        float acc[8] = {0};                                                           \
        int i = 0;                                                                    \
        for (; i + 8 <= n; i += 8)                                                    \
            for (int l = 0; l < 8; l++) acc[l] += CONV(x[i + l]) * CONV(y[i + l]);    \
        float sumf = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])); \
        for (; i < n; i++) sumf += CONV(x[i]) * CONV(y[i]);                           \
        *s = sumf;                                                                    \
    }

#define IDENT(v) (v)
FLOAT_DOT(vec_dot_f32, float, IDENT)
#define F16(h) ed_f16_table[h]
FLOAT_DOT(vec_dot_f16, uint16_t, F16)
FLOAT_DOT(vec_dot_bf16, uint16_t, ed_bf16_to_f32)

/* ------------------------------------------------------------------------------------- table */

int ed_fill_scalar(ed_kernel_table *t) {
    ed_table_init_common(t, ED_LEVEL_SCALAR);
    t->types[ED_Q4_0].vec_dot = vec_dot_q4_0;
    t->types[ED_Q4_1].vec_dot = vec_dot_q4_1;
    t->types[ED_Q5_0].vec_dot = vec_dot_q5_0;
    t->types[ED_Q5_1].vec_dot = vec_dot_q5_1;
    t->types[ED_Q8_0].vec_dot = vec_dot_q8_0;
    t->types[ED_IQ4_NL].vec_dot = vec_dot_iq4_nl;
    t->types[ED_Q2_K].vec_dot = vec_dot_q2_K;
    t->types[ED_Q3_K].vec_dot = vec_dot_q3_K;
    t->types[ED_Q4_K].vec_dot = vec_dot_q4_K;
    t->types[ED_Q5_K].vec_dot = vec_dot_q5_K;
    t->types[ED_Q6_K].vec_dot = vec_dot_q6_K;
    t->types[ED_F16].vec_dot = vec_dot_f16;
    t->types[ED_BF16].vec_dot = vec_dot_bf16;
    t->types[ED_F32].vec_dot = vec_dot_f32;
    t->from_float[ED_Q8_0] = quantize_q8_0;
    t->from_float[ED_Q8_1] = quantize_q8_1;
    t->from_float[ED_Q8_K] = quantize_q8_K;
    t->from_float[ED_F16] = convert_f16;
    t->from_float[ED_BF16] = convert_bf16;
    t->from_float[ED_F32] = convert_f32;
    return 1;
}
