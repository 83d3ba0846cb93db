/* Dequantize one row of a ggml type to float32, for embedding lookup (get_rows). Ports of ggml-org/llama.cpp
 * ggml/src/ggml-quants.c dequantize_row_q4_0 .. dequantize_row_q6_K and dequantize_row_iq4_nl, with the same
 * float operations, so the results are bit-identical with edgellm.quants and gguf-py. */
#include <pthread.h>
#include <string.h>

#include "f16.h"
#include "runtime.h"

#define QK_K 256

static float f16le(const uint8_t *p) { return ed_rt_f16_lut[(uint16_t)(p[0] | (p[1] << 8))]; }

static void q4_0(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 18, y += 32) {
        const float d = f16le(b);
        for (int j = 0; j < 16; j++) {
            y[j] = ((b[2 + j] & 0x0F) - 8) * d;
            y[j + 16] = ((b[2 + j] >> 4) - 8) * d;
        }
    }
}

static void q4_1(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 20, y += 32) {
        const float d = f16le(b), m = f16le(b + 2);
        for (int j = 0; j < 16; j++) {
            y[j] = (b[4 + j] & 0x0F) * d + m;
            y[j + 16] = (b[4 + j] >> 4) * d + m;
        }
    }
}

static void q5_0(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 22, y += 32) {
        const float d = f16le(b);
        uint32_t qh;
        memcpy(&qh, b + 2, 4);
        for (int j = 0; j < 16; j++) {
            const uint8_t h0 = ((qh >> j) << 4) & 0x10, h1 = (qh >> (j + 12)) & 0x10;
            y[j] = (((b[6 + j] & 0x0F) | h0) - 16) * d;
            y[j + 16] = (((b[6 + j] >> 4) | h1) - 16) * d;
        }
    }
}

static void q5_1(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 24, y += 32) {
        const float d = f16le(b), m = f16le(b + 2);
        uint32_t qh;
        memcpy(&qh, b + 4, 4);
        for (int j = 0; j < 16; j++) {
            const uint8_t h0 = ((qh >> j) << 4) & 0x10, h1 = (qh >> (j + 12)) & 0x10;
            y[j] = ((b[8 + j] & 0x0F) | h0) * d + m;
            y[j + 16] = ((b[8 + j] >> 4) | h1) * d + m;
        }
    }
}

static void q8_0(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 34, y += 32) {
        const float d = f16le(b);
        for (int j = 0; j < 32; j++) y[j] = (int8_t)b[2 + j] * d;
    }
}

static const int8_t kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

static void iq4_nl(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 18, y += 32) {
        const float d = f16le(b);
        for (int j = 0; j < 16; j++) {
            y[j] = d * kvalues_iq4nl[b[2 + j] & 0x0F];
            y[j + 16] = d * kvalues_iq4nl[b[2 + j] >> 4];
        }
    }
}

/* block_q2_K: scales[16], qs[64], d, dmin */
static void q2_k(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 84) {
        const float d = f16le(b + 80), min = f16le(b + 82);
        const uint8_t *q = b + 16;
        int is = 0;
        for (int n = 0; n < QK_K; n += 128, q += 32) {
            for (int shift = 0; shift < 8; shift += 2) {
                for (int half = 0; half < 2; half++) {
                    const uint8_t sc = b[is++];
                    const float dl = d * (sc & 0xF), ml = min * (sc >> 4);
                    for (int l = 0; l < 16; l++) *y++ = dl * ((int8_t)((q[l + 16 * half] >> shift) & 3)) - ml;
                }
            }
        }
    }
}

/* block_q3_K: hmask[32], qs[64], scales[12], d */
static void q3_k(const uint8_t *b, float *y, int64_t nb) {
    const uint32_t kmask1 = 0x03030303, kmask2 = 0x0f0f0f0f;
    for (int64_t i = 0; i < nb; i++, b += 110) {
        const float d_all = f16le(b + 108);
        const uint8_t *q = b + 32, *hm = b;
        uint32_t aux[4];
        memcpy(aux, b + 96, 12);
        const uint32_t tmp = aux[2];
        aux[2] = ((aux[0] >> 4) & kmask2) | (((tmp >> 4) & kmask1) << 4);
        aux[3] = ((aux[1] >> 4) & kmask2) | (((tmp >> 6) & kmask1) << 4);
        aux[0] = (aux[0] & kmask2) | (((tmp >> 0) & kmask1) << 4);
        aux[1] = (aux[1] & kmask2) | (((tmp >> 2) & kmask1) << 4);
        const int8_t *scales = (const int8_t *)aux;
        int is = 0;
        uint8_t m = 1;
        for (int n = 0; n < QK_K; n += 128, q += 32) {
            for (int shift = 0; shift < 8; shift += 2, m <<= 1) {
                for (int half = 0; half < 2; half++) {
                    const float dl = d_all * (scales[is++] - 32);
                    const int o = 16 * half;
                    for (int l = 0; l < 16; l++)
                        *y++ = dl * ((int8_t)((q[l + o] >> shift) & 3) - ((hm[l + o] & m) ? 0 : 4));
                }
            }
        }
    }
}

static void scale_min_k4(int j, const uint8_t *q, uint8_t *d, uint8_t *m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4);
    }
}

/* block_q4_K: d, dmin, scales[12], qs[128]; block_q5_K adds qh[32] before qs */
static void q45_k(const uint8_t *b, float *y, int64_t nb, int five) {
    const int bytes = five ? 176 : 144;
    for (int64_t i = 0; i < nb; i++, b += bytes) {
        const float d = f16le(b), min = f16le(b + 2);
        const uint8_t *scales = b + 4, *qh = b + 16, *ql = b + (five ? 48 : 16);
        uint8_t sc, mn, u1 = 1, u2 = 2;
        for (int is = 0; is < 8; is += 2, ql += 32, u1 <<= 2, u2 <<= 2) {
            scale_min_k4(is, scales, &sc, &mn);
            const float d1 = d * sc, m1 = min * mn;
            scale_min_k4(is + 1, scales, &sc, &mn);
            const float d2 = d * sc, m2 = min * mn;
            for (int l = 0; l < 32; l++) *y++ = d1 * ((ql[l] & 0xF) + (five && (qh[l] & u1) ? 16 : 0)) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * ((ql[l] >> 4) + (five && (qh[l] & u2) ? 16 : 0)) - m2;
        }
    }
}

/* block_q6_K: ql[128], qh[64], scales[16], d */
static void q6_k(const uint8_t *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, b += 210) {
        const float d = f16le(b + 208);
        const uint8_t *ql = b, *qh = b + 128;
        const int8_t *sc = (const int8_t *)(b + 192);
        for (int n = 0; n < QK_K; n += 128, y += 128, ql += 64, qh += 32, sc += 8) {
            for (int l = 0; l < 32; l++) {
                const int is = l / 16;
                const int8_t q1 = (int8_t)((ql[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int8_t q2 = (int8_t)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int8_t q3 = (int8_t)((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int8_t q4 = (int8_t)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l + 0] = d * sc[is + 0] * q1;
                y[l + 32] = d * sc[is + 2] * q2;
                y[l + 64] = d * sc[is + 4] * q3;
                y[l + 96] = d * sc[is + 6] * q4;
            }
        }
    }
}

int ed_dequantize_supported(int type) {
    switch (type) {
    case ED_F32: case ED_F16: case ED_BF16: case ED_Q4_0: case ED_Q4_1: case ED_Q5_0: case ED_Q5_1:
    case ED_Q8_0: case ED_Q2_K: case ED_Q3_K: case ED_Q4_K: case ED_Q5_K: case ED_Q6_K: case ED_IQ4_NL:
        return 1;
    default: return 0;
    }
}

static pthread_once_t g_lut_once = PTHREAD_ONCE_INIT;

int ed_dequantize_row(int type, const void *src, float *y, int64_t n) {
    const uint8_t *b = src;
    pthread_once(&g_lut_once, ed_rt_f16_lut_init);  /* called without a pool (edgellm quantize) */
    switch (type) {
    case ED_F32: memcpy(y, src, sizeof(float) * n); return 1;
    case ED_F16: for (int64_t i = 0; i < n; i++) y[i] = f16le(b + 2 * i); return 1;
    case ED_BF16:
        for (int64_t i = 0; i < n; i++) y[i] = ed_bits_f32((uint32_t)(b[2 * i] | (b[2 * i + 1] << 8)) << 16);
        return 1;
    case ED_Q4_0: q4_0(b, y, n / 32); return 1;
    case ED_Q4_1: q4_1(b, y, n / 32); return 1;
    case ED_Q5_0: q5_0(b, y, n / 32); return 1;
    case ED_Q5_1: q5_1(b, y, n / 32); return 1;
    case ED_Q8_0: q8_0(b, y, n / 32); return 1;
    case ED_IQ4_NL: iq4_nl(b, y, n / 32); return 1;
    case ED_Q2_K: q2_k(b, y, n / QK_K); return 1;
    case ED_Q3_K: q3_k(b, y, n / QK_K); return 1;
    case ED_Q4_K: q45_k(b, y, n / QK_K, 0); return 1;
    case ED_Q5_K: q45_k(b, y, n / QK_K, 1); return 1;
    case ED_Q6_K: q6_k(b, y, n / QK_K); return 1;
    default: return 0;
    }
}

/* An activation row of F16 / BF16 values (a matmul's, written by the level's from_float) as float32 for
 * the float GEMM: at the x86 levels with AVX2 (which imply F16C) F16C's conversion, which equals the
 * table's for every value but a signaling NaN (quieted), and from_float writes none; bf16 is a shift. */
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
__attribute__((target("avx2,f16c"))) static void f16_row_avx2(const uint16_t *h, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
    ed_dequantize_row(ED_F16, h + i, y + i, n - i);
}

__attribute__((target("avx2"))) static void bf16_row_avx2(const uint16_t *h, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(h + i)));
        _mm256_storeu_ps(y + i, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
    }
    ed_dequantize_row(ED_BF16, h + i, y + i, n - i);
}
#endif

void ed_act_row_to_f32(const ed_kernel_table *kt, int type, const void *src, float *y, int64_t n) {
#if defined(__x86_64__) && defined(__GNUC__)
    if ((kt->level == ED_LEVEL_AVX2 || kt->level == ED_LEVEL_AVX512) && (type == ED_F16 || type == ED_BF16)) {
        (type == ED_F16 ? f16_row_avx2 : bf16_row_avx2)(src, y, n);
        return;
    }
#endif
    (void)kt;
    ed_dequantize_row(type, src, y, n);
}

float ed_rt_f16_lut[65536];

void ed_rt_f16_lut_init(void) {
    for (uint32_t h = 0; h < 65536; h++) ed_rt_f16_lut[h] = ed_f16_to_f32((uint16_t)h);
}
