/* Block layouts, f16/bf16 conversions and the per-level table builders shared by the kernel sources.
 *
 * Layouts are ggml's (ggml-org/llama.cpp ggml/src/ggml-common.h: block_q4_0 ... block_q8_K) and are
 * checked with static asserts; the scalar conversions are ggml's (ggml/src/ggml-impl.h
 * ggml_compute_fp16_to_fp32 / ggml_compute_fp32_to_fp16 / ggml_compute_fp32_to_bf16), exact round to
 * nearest even, so every code path converts identically (F16C and NEON fcvt give the same bits).
 */
#ifndef ED_BLOCKS_H
#define ED_BLOCKS_H

#include <stdint.h>
#include <string.h>

#include "../ed_kernels.h"

#define QK 32    /* elements per legacy block (Q4_0 .. Q8_1, IQ4_NL) */
#define QK_K 256 /* elements per K-quant super-block */

typedef struct { uint16_t d; uint8_t qs[QK / 2]; } block_q4_0;
typedef struct { uint16_t d, m; uint8_t qs[QK / 2]; } block_q4_1;
typedef struct { uint16_t d; uint8_t qh[4]; uint8_t qs[QK / 2]; } block_q5_0;
typedef struct { uint16_t d, m; uint8_t qh[4]; uint8_t qs[QK / 2]; } block_q5_1;
typedef struct { uint16_t d; int8_t qs[QK]; } block_q8_0;
typedef struct { uint16_t d, s; int8_t qs[QK]; } block_q8_1; /* s = f16(d * sum(qs)) */
typedef struct { uint16_t d; uint8_t qs[QK / 2]; } block_iq4_nl;
/* Q2_K: 16 bytes of (min << 4 | scale) per 16 quants, 2-bit quants, then the super-block d and dmin */
typedef struct { uint8_t scales[QK_K / 16]; uint8_t qs[QK_K / 4]; uint16_t d, dmin; } block_q2_K;
/* Q3_K: the third bit of each quant, 2-bit quants, 16 6-bit scales (packed, +32), d */
typedef struct { uint8_t hmask[QK_K / 8]; uint8_t qs[QK_K / 4]; uint8_t scales[12]; uint16_t d; } block_q3_K;
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[QK_K / 2]; } block_q4_K;
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[QK_K / 8]; uint8_t qs[QK_K / 2]; } block_q5_K;
typedef struct { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; uint16_t d; } block_q6_K;
typedef struct { float d; int8_t qs[QK_K]; int16_t bsums[QK_K / 16]; } block_q8_K;

#if defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L
_Static_assert(sizeof(block_q4_0) == 18, "block_q4_0");
_Static_assert(sizeof(block_q4_1) == 20, "block_q4_1");
_Static_assert(sizeof(block_q5_0) == 22, "block_q5_0");
_Static_assert(sizeof(block_q5_1) == 24, "block_q5_1");
_Static_assert(sizeof(block_q8_0) == 34, "block_q8_0");
_Static_assert(sizeof(block_q8_1) == 36, "block_q8_1");
_Static_assert(sizeof(block_iq4_nl) == 18, "block_iq4_nl");
_Static_assert(sizeof(block_q2_K) == 84, "block_q2_K");
_Static_assert(sizeof(block_q3_K) == 110, "block_q3_K");
_Static_assert(sizeof(block_q4_K) == 144, "block_q4_K");
_Static_assert(sizeof(block_q5_K) == 176, "block_q5_K");
_Static_assert(sizeof(block_q6_K) == 210, "block_q6_K");
_Static_assert(sizeof(block_q8_K) == 292, "block_q8_K");
#endif

/* ggml-common.h kvalues_iq4nl */
static const int8_t ed_kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                             1,    13,   25,  38,  53,  69,  89,  113};
/* the same + 128, unsigned: IQ4_NL in the repacked (x16) kernels */
static const uint8_t ed_x16_iq4nl_u8[16] = {1, 24, 45, 63, 79, 93, 106, 118, 129, 141, 153, 166, 181, 197, 217, 241};

static inline uint32_t ed_f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float ed_bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* ggml_compute_fp16_to_fp32 */
static inline float ed_f16_to_f32(uint16_t h) {
    const uint32_t w = (uint32_t)h << 16;
    const uint32_t sign = w & 0x80000000u;
    const uint32_t two_w = w + w;
    const float normalized = ed_bits_f32((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
    const float denormalized = ed_bits_f32((two_w >> 17) | (126u << 23)) - 0.5f;
    return ed_bits_f32(sign | (two_w < (1u << 27) ? ed_f32_bits(denormalized) : ed_f32_bits(normalized)));
}

/* ggml_compute_fp32_to_fp16: round to nearest even, NaN -> 0x7E00 with the sign */
static inline uint16_t ed_f32_to_f16(float f) {
    float base = (__builtin_fabsf(f) * 0x1.0p+112f) * 0x1.0p-110f;
    const uint32_t w = ed_f32_bits(f);
    const uint32_t shl1_w = w + w;
    const uint32_t sign = w & 0x80000000u;
    uint32_t bias = shl1_w & 0xFF000000u;
    if (bias < 0x71000000u) bias = 0x71000000u;
    base = ed_bits_f32((bias >> 1) + 0x07800000u) + base;
    const uint32_t bits = ed_f32_bits(base);
    const uint32_t nonsign = ((bits >> 13) & 0x7C00u) + (bits & 0x0FFFu);
    return (uint16_t)((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

/* ggml_compute_fp32_to_bf16: round to nearest even, NaNs made quiet */
static inline uint16_t ed_f32_to_bf16(float f) {
    const uint32_t u = ed_f32_bits(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 64);
    return (uint16_t)((u + (0x7FFFu + ((u >> 16) & 1))) >> 16);
}

static inline float ed_bf16_to_f32(uint16_t h) { return ed_bits_f32((uint32_t)h << 16); }

/* The f16 at p (any alignment). */
static inline uint16_t ed_load_u16(const void *p) { uint16_t v; memcpy(&v, p, 2); return v; }

/* Round to nearest even for |v| <= 2^22 without libm (ggml-quants.c nearest_int). */
static inline int ed_nearest_int(float v) {
    const float val = v + 12582912.f;
    int32_t i;
    memcpy(&i, &val, 4);
    return (i & 0x007fffff) - 0x00400000;
}

/* Q4_K/Q5_K: 12 bytes -> 8 6-bit scales (out[0..7]) and 8 6-bit mins (out[8..15]) (ggml's utmp shuffle). */
static inline void ed_unpack_scales_k4(const uint8_t *scales, uint32_t utmp[4]) {
    const uint32_t kmask1 = 0x3f3f3f3f, kmask2 = 0x0f0f0f0f, kmask3 = 0x03030303;
    memcpy(utmp, scales, 12);
    utmp[3] = ((utmp[2] >> 4) & kmask2) | (((utmp[1] >> 6) & kmask3) << 4);
    const uint32_t uaux = utmp[1] & kmask1;
    utmp[1] = (utmp[2] & kmask2) | (((utmp[0] >> 6) & kmask3) << 4);
    utmp[2] = uaux;
    utmp[0] &= kmask1;
}

/* Q3_K: 12 bytes -> 16 6-bit scales as bytes 0..63 (ggml's aux shuffle in ggml_vec_dot_q3_K_q8_K; the
 * kernels subtract the +32 bias themselves) */
static inline void ed_unpack_scales_q3(const uint8_t *scales, uint32_t utmp[4]) {
    const uint32_t kmask1 = 0x03030303, kmask2 = 0x0f0f0f0f;
    uint32_t aux[3];
    memcpy(aux, scales, 12);
    utmp[3] = ((aux[1] >> 4) & kmask2) | (((aux[2] >> 6) & kmask1) << 4);
    utmp[2] = ((aux[0] >> 4) & kmask2) | (((aux[2] >> 4) & kmask1) << 4);
    utmp[1] = (aux[1] & kmask2) | (((aux[2] >> 2) & kmask1) << 4);
    utmp[0] = (aux[0] & kmask2) | (((aux[2] >> 0) & kmask1) << 4);
}

/* f16 -> f32 for every f16 bit pattern (256 KiB), filled before any table is handed out. The SIMD dots
 * convert block scales with it, as ggml-cpu does on x86 (ggml_table_f32_f16): a load instead of F16C
 * conversions that compete with the dot product for the floating-point pipes. */
extern float ed_f16_table[1 << 16];

/* Fill the parts of a table every level shares (block sizes, vec_dot types); kernels are set per level. */
void ed_table_init_common(ed_kernel_table *t, int level);

/* Per-level table builders; each returns 0 when that level is not compiled into this build. */
int ed_fill_scalar(ed_kernel_table *t);
int ed_fill_avx2(ed_kernel_table *t);
/* Whether levels with x16 kernels install them (EDGELLM_REPACK=0 says no; x16.c) */
int ed_repack_enabled(void);
void ed_fill_avx2_q23k(ed_kernel_table *t); /* the AVX2 Q2_K/Q3_K kernels, set by ed_fill_avx2 */
int ed_set_x16_avxvnni(ed_kernel_table *t); /* avx2_vnni.c: the legacy x16 GEMMs by AVX-VNNI; 0 where not built */
int ed_fill_avx512(ed_kernel_table *t);
int ed_fill_neon(ed_kernel_table *t, int dotprod);

#endif
