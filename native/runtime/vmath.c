/* exp-based activations in two builds with the same float operations in the same order, so the same
 * bits: portable C, and AVX for x86 CPUs with the kernels' AVX2 level.
 *
 * exp (SiLU, softmax) is Cephes' expf (as in sse_mathfun's exp_ps): x clamped to [-87.3, 88.7], n = floor(x log2(e) + 1/2),
 * r = x - n ln2 (in two parts), a degree-5 polynomial, times 2^n -- within 2 ulp of libm's expf, and 4-8x
 * faster in the AVX build. Multiply and add are separate (no FMA), which is what makes the builds agree.
 */
#include <math.h>
#include <string.h>

#include "runtime.h"

#define EXP_HI 88.7f
#define EXP_LO -87.3f
#define LOG2E 1.44269504088896341f
#define C1 0.693359375f
#define C2 -2.12194440e-4f
#define P0 1.9875691500e-4f
#define P1 1.3981999507e-3f
#define P2 8.3334519073e-3f
#define P3 4.1665795894e-2f
#define P4 1.6666665459e-1f
#define P5 5.0000001201e-1f

static inline float exp_c(float x) {
    x = x > EXP_HI ? EXP_HI : x;
    x = x < EXP_LO ? EXP_LO : x;
    const float n = floorf(x * LOG2E + 0.5f);
    float r = x - n * C1;
    r = r - n * C2;
    const float z = r * r;
    float y = P0;
    y = y * r + P1;
    y = y * r + P2;
    y = y * r + P3;
    y = y * r + P4;
    y = y * r + P5;
    y = y * z + r;
    y = y + 1.0f;
    const uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
    float p;
    memcpy(&p, &bits, 4);
    return y * p;
}

static void silu_mul_c(const float *a, const float *b, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = a[i] / (1.0f + exp_c(-a[i])) * b[i];
}

static void exp_c_span(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = exp_c(x[i]);
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define ED_AVX __attribute__((target("avx,avx2")))

ED_AVX static inline __m256 exp_avx(__m256 x) {
    x = _mm256_min_ps(x, _mm256_set1_ps(EXP_HI));
    x = _mm256_max_ps(x, _mm256_set1_ps(EXP_LO));
    const __m256 n = _mm256_floor_ps(_mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(LOG2E)), _mm256_set1_ps(0.5f)));
    __m256 r = _mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(C1)));
    r = _mm256_sub_ps(r, _mm256_mul_ps(n, _mm256_set1_ps(C2)));
    const __m256 z = _mm256_mul_ps(r, r);
    __m256 y = _mm256_set1_ps(P0);
    y = _mm256_add_ps(_mm256_mul_ps(y, r), _mm256_set1_ps(P1));
    y = _mm256_add_ps(_mm256_mul_ps(y, r), _mm256_set1_ps(P2));
    y = _mm256_add_ps(_mm256_mul_ps(y, r), _mm256_set1_ps(P3));
    y = _mm256_add_ps(_mm256_mul_ps(y, r), _mm256_set1_ps(P4));
    y = _mm256_add_ps(_mm256_mul_ps(y, r), _mm256_set1_ps(P5));
    y = _mm256_add_ps(_mm256_mul_ps(y, z), r);
    y = _mm256_add_ps(y, _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

ED_AVX static void silu_mul_avx(const float *a, const float *b, float *y, int64_t n) {
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(a + i);
        const __m256 e = exp_avx(_mm256_sub_ps(zero, x));
        _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_div_ps(x, _mm256_add_ps(one, e)), _mm256_loadu_ps(b + i)));
    }
    silu_mul_c(a + i, b + i, y + i, n - i);
}

ED_AVX static void exp_avx_span(float *x, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, exp_avx(_mm256_loadu_ps(x + i)));
    exp_c_span(x + i, n - i);
}
#endif

void ed_exp_span(float *x, int64_t n, const ed_kernel_table *kt) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (kt->level == ED_LEVEL_AVX2 || kt->level == ED_LEVEL_AVX512) {
        exp_avx_span(x, n);
        return;
    }
#endif
    (void)kt;
    exp_c_span(x, n);
}

void ed_silu_mul_span(const float *a, const float *b, float *y, int64_t n, const ed_kernel_table *kt) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (kt->level == ED_LEVEL_AVX2 || kt->level == ED_LEVEL_AVX512) {
        silu_mul_avx(a, b, y, n);
        return;
    }
#endif
    (void)kt;
    silu_mul_c(a, b, y, n);
}
