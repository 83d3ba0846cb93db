/* Test-only: the AVX-512 intrinsics avx512.c uses, from SIMDe's portable implementations
 * (libsimde-dev), so kernel_check can run the AVX-512 level on a CPU without it. Built with
 * -DED_EMULATE_AVX512; the few intrinsics SIMDe 0.7 lacks are composed from 256-bit halves below.
 */
#ifndef ED_AVX512_EMU_H
#define ED_AVX512_EMU_H

#include <math.h>
#include <string.h>

#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
#include <simde/x86/f16c.h>

#include "../kernels/ed_blocks.h"

static inline simde__m512i ed_emu_join(simde__m256i lo, simde__m256i hi) {
    return simde_mm512_inserti64x4(simde_mm512_castsi256_si512(lo), hi, 1);
}
static inline simde__m512 ed_emu_join_ps(simde__m256 lo, simde__m256 hi) {
    return simde_mm512_castpd_ps(simde_mm512_insertf64x4(simde_mm512_castpd256_pd512(simde_mm256_castps_pd(lo)),
                                                         simde_mm256_castps_pd(hi), 1));
}
static inline simde__m512 ed_emu_cvtepi32_ps(simde__m512i v) {
    return ed_emu_join_ps(simde_mm256_cvtepi32_ps(simde_mm512_castsi512_si256(v)),
                          simde_mm256_cvtepi32_ps(simde_mm512_extracti64x4_epi64(v, 1)));
}
static inline simde__m512 ed_emu_cvtph_ps(simde__m256i h) {
    return ed_emu_join_ps(simde_mm256_cvtph_ps(simde_mm256_castsi256_si128(h)),
                          simde_mm256_cvtph_ps(simde_mm256_extracti128_si256(h, 1)));
}
static inline simde__m512i ed_emu_cvtepu16_epi32(simde__m256i h) {
    return ed_emu_join(simde_mm256_cvtepu16_epi32(simde_mm256_castsi256_si128(h)),
                       simde_mm256_cvtepu16_epi32(simde_mm256_extracti128_si256(h, 1)));
}
/* vfmadd: one rounding per lane, as the instruction (SIMDe's portable form is a * b + c, two roundings,
 * which the x16 kernels' bit-exact check against fmaf would catch as a difference) */
static inline simde__m512 ed_emu_fmadd_ps(simde__m512 a, simde__m512 b, simde__m512 c) {
    float x[16], y[16], z[16];
    simde_mm512_storeu_ps(x, a), simde_mm512_storeu_ps(y, b), simde_mm512_storeu_ps(z, c);
    for (int i = 0; i < 16; i++) z[i] = fmaf(x[i], y[i], z[i]);
    return simde_mm512_loadu_ps(z);
}
static inline simde__m512 ed_emu_fnmadd_ps(simde__m512 a, simde__m512 b, simde__m512 c) {
    return ed_emu_fmadd_ps(simde_mm512_sub_ps(simde_mm512_setzero_ps(), a), b, c); /* -(a*b) + c, once */
}
/* vdpbf16ps as the instruction's pseudo-code orders it: per lane, + the odd pair's product, then + the
 * even pair's (bf16 products are exact in float; denormal flushing not modelled) */
static inline simde__m512 ed_emu_dpbf16_ps(simde__m512 acc, simde__m512i a, simde__m512i b) {
    float z[16];
    uint16_t x[32], y[32];
    simde_mm512_storeu_ps(z, acc), simde_mm512_storeu_si512(x, a), simde_mm512_storeu_si512(y, b);
    for (int j = 0; j < 16; j++) {
        z[j] += ed_bf16_to_f32(x[2 * j + 1]) * ed_bf16_to_f32(y[2 * j + 1]);
        z[j] += ed_bf16_to_f32(x[2 * j]) * ed_bf16_to_f32(y[2 * j]);
    }
    return simde_mm512_loadu_ps(z);
}
/* SIMDe 0.7 defines simde_mm512_shuffle_f32x4 but no native alias for it */
#ifndef _mm512_shuffle_f32x4
#define _mm512_shuffle_f32x4(a, b, imm8) simde_mm512_shuffle_f32x4(a, b, imm8)
#endif
#undef _mm512_fmadd_ps
#define _mm512_fmadd_ps(a, b, c) ed_emu_fmadd_ps(a, b, c)
#undef _mm512_fnmadd_ps
#define _mm512_fnmadd_ps(a, b, c) ed_emu_fnmadd_ps(a, b, c)
static inline simde__m512i ed_emu_cvtepu8_epi32(simde__m128i b) {
    return ed_emu_join(simde_mm256_cvtepu8_epi32(b), simde_mm256_cvtepu8_epi32(simde_mm_srli_si128(b, 8)));
}
static inline simde__m512i ed_emu_cvtepu8_epi16(simde__m256i b) {
    return ed_emu_join(simde_mm256_cvtepu8_epi16(simde_mm256_castsi256_si128(b)),
                       simde_mm256_cvtepu8_epi16(simde_mm256_extracti128_si256(b, 1)));
}
static inline simde__m512i ed_emu_srai_epi32(simde__m512i v, int n) {
    return ed_emu_join(simde_mm256_srai_epi32(simde_mm512_castsi512_si256(v), n),
                       simde_mm256_srai_epi32(simde_mm512_extracti64x4_epi64(v, 1), n));
}
#undef _mm512_srai_epi32
#define _mm512_srai_epi32(v, n) ed_emu_srai_epi32(v, n)
#undef _mm512_cvtepu8_epi32
#undef _mm512_cvtepu8_epi16
#define _mm512_cvtepu8_epi32(b) ed_emu_cvtepu8_epi32(b)
#define _mm512_cvtepu8_epi16(b) ed_emu_cvtepu8_epi16(b)
/* SIMDe 0.7.4 aliases _mm512_madd_epi16 with the masked form's arity, and has no __mmask64 alias */
#undef _mm512_madd_epi16
#define _mm512_madd_epi16(a, b) simde_mm512_madd_epi16(a, b)
#define __mmask64 simde__mmask64
#undef _mm512_cvtepi32_ps
#undef _mm512_cvtph_ps
#undef _mm512_cvtepu16_epi32
#define _mm512_cvtepi32_ps(v) ed_emu_cvtepi32_ps(v)
#define _mm512_cvtph_ps(h) ed_emu_cvtph_ps(h)
#define _mm512_cvtepu16_epi32(h) ed_emu_cvtepu16_epi32(h)

#endif
