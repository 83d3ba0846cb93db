/* AArch64 NEON kernels: activation quantizers, float dots and (neon_body.h) the quantized dots in two
 * variants, with the dot-product extension (sdot, picked when HWCAP_ASIMDDP says the CPU has it) and
 * without. NEON itself is baseline on AArch64, so only the sdot variant needs a target pragma.
 *
 * The quantizers follow ggml-cpu/arch/x86/quants.c quantize_row_q8_0/q8_1 (x * 127/amax, fcvtns rounds
 * to nearest even), not the ARM ones (which multiply by 1/d): every level writes the same bytes.
 */
#include "ed_blocks.h"

#if defined(__aarch64__)
#include <arm_neon.h>

#define ED_INLINE static inline __attribute__((always_inline))

/* f16 at p -> f32 with one fcvt */
static inline float f16n(const void *p) {
    __fp16 h;
    memcpy(&h, p, 2);
    return (float)h;
}

/* Q5_0/Q5_1: 0xFF in byte j where bit j of the block's 32-bit qh is set (lo: j < 16, hi: j >= 16) */
static inline void fifth_bits(const uint8_t *qh, uint8x16_t *lo, uint8x16_t *hi) {
    static const uint8_t bit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    static const uint8_t idx[32] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                    2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3};
    uint32_t h;
    memcpy(&h, qh, 4);
    const uint8x16_t b = vreinterpretq_u8_u32(vdupq_n_u32(h)), m = vld1q_u8(bit);
    *lo = vtstq_u8(vqtbl1q_u8(b, vld1q_u8(idx)), m);
    *hi = vtstq_u8(vqtbl1q_u8(b, vld1q_u8(idx + 16)), m);
}

static inline int8x16_t lo4(uint8x16_t b) { return vreinterpretq_s8_u8(vandq_u8(b, vdupq_n_u8(0x0F))); }
static inline int8x16_t hi4(uint8x16_t b) { return vreinterpretq_s8_u8(vshrq_n_u8(b, 4)); }

/* a Q6_K quant 0..63: 4 low bits (nib) | the 2 bits at the bottom of top2, shifted to bits 4-5 */
static inline uint8x16_t q6(uint8x16_t nib, uint8x16_t top2) {
    return vorrq_u8(nib, vshlq_n_u8(vandq_u8(top2, vdupq_n_u8(3)), 4));
}

static inline int32_t mins_dot_bsums(const uint8_t *mins, const int16_t *bsums) {
    const int16x8_t q8sums = vpaddq_s16(vld1q_s16(bsums), vld1q_s16(bsums + 8)); /* 8 sums of 32 */
    const int16x8_t m = vreinterpretq_s16_u16(vmovl_u8(vld1_u8(mins)));
    return vaddvq_s32(vaddq_s32(vmull_s16(vget_low_s16(q8sums), vget_low_s16(m)), vmull_high_s16(q8sums, m)));
}

/* ------------------------------------------------------------------- legacy weight blocks unpacked */

/* A Q4_0 .. Q8_0 / IQ4_NL block as signed quants (l: 0..15, h: 16..31) and its f16 scale (and min) as
 * floats, unpacked once per block for every activation row it meets (neon_body.h's vec_dot and nx). */
typedef struct {
    int8x16_t l, h;
    float d, m;
} nwblock;

static inline nwblock prep_q4_0(const block_q4_0 *x) {
    const uint8x16_t v = vld1q_u8(x->qs);
    const int8x16_t s8 = vdupq_n_s8(8);
    return (nwblock){vsubq_s8(lo4(v), s8), vsubq_s8(hi4(v), s8), f16n(&x->d), 0.0f};
}

static inline nwblock prep_q4_1(const block_q4_1 *x) {
    const uint8x16_t v = vld1q_u8(x->qs);
    return (nwblock){lo4(v), hi4(v), f16n(&x->d), f16n(&x->m)};
}

static inline nwblock prep_q5_0(const block_q5_0 *x) {
    uint8x16_t hl, hh;
    fifth_bits(x->qh, &hl, &hh);
    const uint8x16_t v = vld1q_u8(x->qs);
    /* q | 0xF0 where the fifth bit is clear is q - 16 as int8 */
    const uint8x16_t f0 = vdupq_n_u8(0xF0);
    return (nwblock){vreinterpretq_s8_u8(vorrq_u8(vandq_u8(v, vdupq_n_u8(0x0F)), vbicq_u8(f0, hl))),
                     vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(v, 4), vbicq_u8(f0, hh))), f16n(&x->d), 0.0f};
}

static inline nwblock prep_q5_1(const block_q5_1 *x) {
    uint8x16_t hl, hh;
    fifth_bits(x->qh, &hl, &hh);
    const uint8x16_t v = vld1q_u8(x->qs), b4 = vdupq_n_u8(0x10);
    return (nwblock){vreinterpretq_s8_u8(vorrq_u8(vandq_u8(v, vdupq_n_u8(0x0F)), vandq_u8(hl, b4))),
                     vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(v, 4), vandq_u8(hh, b4))), f16n(&x->d), f16n(&x->m)};
}

static inline nwblock prep_q8_0(const block_q8_0 *x) {
    return (nwblock){vld1q_s8(x->qs), vld1q_s8(x->qs + 16), f16n(&x->d), 0.0f};
}

static inline nwblock prep_iq4_nl(const block_iq4_nl *x) {
    const int8x16_t values = vld1q_s8(ed_kvalues_iq4nl);
    const uint8x16_t v = vld1q_u8(x->qs);
    return (nwblock){vqtbl1q_s8(values, vandq_u8(v, vdupq_n_u8(0x0F))), vqtbl1q_s8(values, vshrq_n_u8(v, 4)),
                     f16n(&x->d), 0.0f};
}

/* ------------------------------------------------------------------------- activation quantizers */

static inline float amax32(const float *x, float32x4_t v[8]) {
    for (int j = 0; j < 8; j++) v[j] = vld1q_f32(x + 4 * j);
    float32x4_t m = vabsq_f32(v[0]);
    for (int j = 1; j < 8; j++) m = vmaxq_f32(m, vabsq_f32(v[j]));
    return vmaxvq_f32(m);
}

/* 32 int32 in [-127, 127] -> 32 int8 at out; returns their sum */
static inline int32_t narrow32(const int32x4_t q[8], int8_t *out) {
    int32x4_t sum = q[0];
    for (int j = 0; j < 8; j += 2) {
        const int16x8_t h = vcombine_s16(vmovn_s32(q[j]), vmovn_s32(q[j + 1]));
        vst1_s8(out + 4 * j, vmovn_s16(h));
        if (j) sum = vaddq_s32(sum, q[j]);
        sum = vaddq_s32(sum, q[j + 1]);
    }
    return vaddvq_s32(sum);
}

static void quantize_q8_0(const float *x, void *vy, int64_t n) {
    block_q8_0 *y = vy;
    for (int64_t i = 0; i < n / QK; i++, x += QK) {
        float32x4_t v[8];
        int32x4_t q[8];
        const float amax = amax32(x, v);
        const float id = amax != 0.0f ? 127.f / amax : 0.0f;
        for (int j = 0; j < 8; j++) q[j] = vcvtnq_s32_f32(vmulq_n_f32(v[j], id));
        narrow32(q, y[i].qs);
        y[i].d = ed_f32_to_f16(amax / 127.f);
    }
}

static void quantize_q8_1(const float *x, void *vy, int64_t n) {
    block_q8_1 *y = vy;
    for (int64_t i = 0; i < n / QK; i++, x += QK) {
        float32x4_t v[8];
        int32x4_t q[8];
        const float amax = amax32(x, v);
        const float d = amax / 127.f, id = amax != 0.0f ? 127.f / amax : 0.0f;
        for (int j = 0; j < 8; j++) q[j] = vcvtnq_s32_f32(vmulq_n_f32(v[j], id));
        const int32_t sum = narrow32(q, y[i].qs);
        y[i].d = ed_f32_to_f16(d);
        y[i].s = ed_f32_to_f16(d * (float)sum);
    }
}

/* ggml-quants.c quantize_row_q8_K_ref: d = 1/(-127/max), q = min(127, rint(x * -127/max)) */
static void quantize_q8_K(const float *x, void *vy, int64_t n) {
    block_q8_K *y = vy;
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        float32x4_t m = vdupq_n_f32(0.0f);
        for (int j = 0; j < QK_K; j += 4) m = vmaxq_f32(m, vabsq_f32(vld1q_f32(x + j)));
        const float amax = vmaxvq_f32(m);
        if (amax == 0.0f) {
            memset(&y[i], 0, sizeof(y[i]));
            continue;
        }
        int first = 0; /* the first element of largest magnitude, with its sign */
        while (first < QK_K - 1 && __builtin_fabsf(x[first]) != amax) first++; /* bounded: NaN never matches */
        const float iscale = -127.f / x[first];
        const int32x4_t lim = vdupq_n_s32(127);
        for (int g = 0; g < QK_K / 32; g++) {
            int32x4_t q[8];
            for (int k = 0; k < 8; k++)
                q[k] = vminq_s32(lim, vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(x + 32 * g + 4 * k), iscale)));
            narrow32(q, y[i].qs + 32 * g);
            y[i].bsums[2 * g] = (int16_t)vaddvq_s32(vaddq_s32(vaddq_s32(q[0], q[1]), vaddq_s32(q[2], q[3])));
            y[i].bsums[2 * g + 1] = (int16_t)vaddvq_s32(vaddq_s32(vaddq_s32(q[4], q[5]), vaddq_s32(q[6], q[7])));
        }
        y[i].d = 1.0f / iscale;
    }
}

static void convert_f16(const float *x, void *vy, int64_t n) {
    uint16_t *y = vy;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1_u16(y + i, vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(x + i))));
    for (; i < n; i++) y[i] = ed_f32_to_f16(x[i]);
}

static void convert_bf16(const float *x, void *vy, int64_t n) {
    uint16_t *y = vy;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const uint32x4_t u = vreinterpretq_u32_f32(vld1q_f32(x + i));
        const uint32x4_t nan = vcgtq_u32(vandq_u32(u, vdupq_n_u32(0x7FFFFFFF)), vdupq_n_u32(0x7F800000));
        const uint32x4_t odd = vandq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(1));
        const uint32x4_t r = vshrq_n_u32(vaddq_u32(u, vaddq_u32(odd, vdupq_n_u32(0x7FFF))), 16);
        const uint32x4_t q = vorrq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(64));
        vst1_u16(y + i, vmovn_u32(vbslq_u32(nan, q, r)));
    }
    for (; i < n; i++) y[i] = ed_f32_to_bf16(x[i]);
}

static void convert_f32(const float *x, void *vy, int64_t n) { memcpy(vy, x, (size_t)n * sizeof(float)); }

/* ---------------------------------------------------------- float types: 4 x 4 f32 lanes, FMA */

#define FLOAT_DOT(name, T, LOAD, CONV)                                                    \
    static void name(int n, float *s, const void *vx, const void *vy) {                  \
        const T *x = vx, *y = vy;                                                          \
        float32x4_t a0 = vdupq_n_f32(0.0f), a1 = a0, a2 = a0, a3 = a0;                     \
        int i = 0;                                                                         \
        for (; i + 16 <= n; i += 16) {                                                     \
            a0 = vfmaq_f32(a0, LOAD(x + i), LOAD(y + i));                                  \
            a1 = vfmaq_f32(a1, LOAD(x + i + 4), LOAD(y + i + 4));                          \
            a2 = vfmaq_f32(a2, LOAD(x + i + 8), LOAD(y + i + 8));                          \
            a3 = vfmaq_f32(a3, LOAD(x + i + 12), LOAD(y + i + 12));                        \
        }                                                                                  \
        for (; i + 4 <= n; i += 4) a0 = vfmaq_f32(a0, LOAD(x + i), LOAD(y + i));           \
        float sumf = vaddvq_f32(vaddq_f32(vaddq_f32(a0, a1), vaddq_f32(a2, a3)));          \
        for (; i < n; i++) sumf += CONV(x[i]) * CONV(y[i]);                                \
        *s = sumf;                                                                         \
    }

#define LOAD_F32(p) vld1q_f32(p)
#define LOAD_F16(p) vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p)))
#define LOAD_BF16(p) vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16))
#define IDENT(v) (v)
#define F16(h) f16n(&(h))

FLOAT_DOT(vec_dot_f32, float, LOAD_F32, IDENT)
FLOAT_DOT(vec_dot_f16, uint16_t, LOAD_F16, F16)
FLOAT_DOT(vec_dot_bf16, uint16_t, LOAD_BF16, ed_bf16_to_f32)

/* ------------------------------------------------------------------- quantized dots, two variants */

#define ED_DOTPROD 0
#include "neon_body.h"
#undef ED_DOTPROD

/* clang before 16 declares vdotq_s32 only when the whole file is built with +dotprod */
#if defined(__ARM_FEATURE_DOTPROD) || !defined(__clang__) || __clang_major__ >= 16
#define ED_HAVE_SDOT 1
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("dotprod"))), apply_to = function)
#elif defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("arch=armv8.2-a+dotprod")
#endif
#define ED_DOTPROD 1
#include "neon_body.h"
#undef ED_DOTPROD
#include "neon_x16.h"
#if defined(__clang__)
#pragma clang attribute pop
#elif defined(__GNUC__)
#pragma GCC pop_options
#endif
#endif

int ed_fill_neon(ed_kernel_table *t, int dotprod) {
    ed_table_init_common(t, ED_LEVEL_NEON);
    set_dots_neon(t);
#if defined(ED_HAVE_SDOT)
    if (dotprod) {
        set_dots_dotprod(t);
        if (ed_repack_enabled()) set_x16_neon(t);
    }
#else
    (void)dotprod;
#endif
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

#else
int ed_fill_neon(ed_kernel_table *t, int dotprod) {
    (void)t;
    (void)dotprod;
    return 0;
}
#endif
