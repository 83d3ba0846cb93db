/* f16 <-> f32 as ggml does them in software (ggml/src/ggml-impl.h ggml_compute_fp16_to_fp32 /
 * ggml_compute_fp32_to_fp16, after FP16 by Maratyszcza): round to nearest even, the same bits as F16C's
 * _cvtss_sh and numpy's astype(float16). The f16 -> f32 direction also has a 64k-entry table. */
#ifndef ED_F16_H
#define ED_F16_H

#include <stdint.h>
#include <string.h>

static inline float ed_bits_f32(uint32_t w) { float f; memcpy(&f, &w, 4); return f; }
static inline uint32_t ed_f32_bits(float f) { uint32_t w; memcpy(&w, &f, 4); return w; }

static inline float ed_f16_to_f32(uint16_t h) {
    const uint32_t w = (uint32_t)h << 16;
    const uint32_t sign = w & 0x80000000u;
    const uint32_t two_w = w + w;
    const float exp_scale = 0x1.0p-112f;
    const float normalized = ed_bits_f32((two_w >> 4) + (0xE0u << 23)) * exp_scale;
    const float denormalized = ed_bits_f32((two_w >> 17) | (126u << 23)) - 0.5f;
    const uint32_t result = sign | (two_w < (1u << 27) ? ed_f32_bits(denormalized) : ed_f32_bits(normalized));
    return ed_bits_f32(result);
}

static inline uint16_t ed_f32_to_f16(float f) {
    const float scale_to_inf = 0x1.0p+112f;
    const float scale_to_zero = 0x1.0p-110f;
    float base = (f < 0 ? -f : f) * scale_to_inf * scale_to_zero;
    const uint32_t w = ed_f32_bits(f);
    const uint32_t shl1_w = w + w;
    const uint32_t sign = w & 0x80000000u;
    uint32_t bias = shl1_w & 0xFF000000u;
    if (bias < 0x71000000u) bias = 0x71000000u;
    base = ed_bits_f32((bias >> 1) + 0x07800000u) + base;
    const uint32_t bits = ed_f32_bits(base);
    const uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
    const uint32_t mantissa_bits = bits & 0x00000FFFu;
    const uint32_t nonsign = exp_bits + mantissa_bits;
    return (uint16_t)((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

static inline float ed_f16_round(float f) { return ed_f16_to_f32(ed_f32_to_f16(f)); }

/* f16 bits -> f32 for every f16 value; filled once by ed_rt_f16_lut_init() */
extern float ed_rt_f16_lut[65536];
void ed_rt_f16_lut_init(void);

#endif
