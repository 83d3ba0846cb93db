/* Attention over the paged f16 KV cache (the contract of edgellm/backends/reference.py KVCache):
 * position p of sequence s lives at slot block_table[s, p / block_size] * block_size + p % block_size.
 *
 * Phase 0 stores the k, v rows of all n tokens (f32 -> f16, nearest even). Phase 1's chunks are (token,
 * kv head) pairs, or in prompts (tile of up to 16 consecutive tokens, kv head) pairs, or in a deep decode
 * step with fewer pairs than the threads want (token, key block), phases 2 and 3 then finishing
 * the softmax and the values (split_plan_of, below: the same bits as pair by pair); each token attends
 * causally over positions max(0, p - window + 1) .. p of its sequence, for every query head of the group
 * (of the tile) at once: a key row is converted from f16 once per group (per tile). The float
 * operations are the reference backend's: q rounded to f16, q.k * scale, optional softcap
 * c * tanh(s / c), softmax in f32, weights rounded to f16 before their product with the values. The q.k
 * sums run over 8 lanes, combined in a fixed order: the result does not depend on the thread count.
 *
 * A q8_0 cache (op->type = K kind | V kind << 8, a kind being ED_F16 or ED_Q8_0; 0 reads as f16) holds each
 * head's row as dh / 32 block_q8_0, quantized with the kernels' Q8_0 activation quantizer (ggml-cpu's
 * quantize_row_q8_0, as llama.cpp copies K and V into such a cache). Over q8_0 keys each query head is
 * quantized the same way and a score is, block by block in order, f32(d_k * d_q) * (exact integer sum)
 * added in f32 (ggml's vec_dot_q8_0_q8_0 with its blocks summed in order); q8_0 values are d * q (exact in
 * f32) and meet the softmax weights unrounded, as ggml-cpu's flash attention does with a quantized V:
 * edgellm/backends/reference.py's q8_0_scores and attention define the same operations.
 */
#include <math.h>
#include <string.h>

#include "f16.h"
#include "runtime.h"

#if defined(__clang__) /* the loops multiply then add: clang would fuse them by default (GCC's -std=c11 does not) */
#pragma STDC FP_CONTRACT OFF
#endif

static int64_t slot_of(const ed_op *op, int64_t seq, int64_t pos) {
    const int64_t bs = op->i1, n_blocks = op->i2, n_seqs = op->i3;
    if (seq < 0 || seq >= n_seqs || pos < 0 || pos / bs >= n_blocks) return -1;
    const int32_t blk = ((const int32_t *)op->src5)[seq * n_blocks + pos / bs];
    if (blk < 0) return -1;
    const int64_t slot = (int64_t)blk * bs + pos % bs;
    return slot < op->i5 ? slot : -1;
}

typedef struct { uint16_t d; int8_t qs[32]; } kv_q8; /* ggml's block_q8_0 */

/* The inner loops, in four builds with the same float operations in the same order (so the same bits; the
 * f16 loops' q and w hold f16 values, as the callers round them, so their products may fuse: below):
 * portable C, AVX + F16C for x86 CPUs with the kernels' AVX2 level (which requires F16C), at the
 * AVX-512 level the same with scores and values held in AVX-512VL's 32 vector registers, and NEON on
 * AArch64 (native/tests/attention_check.c compares each with the portable C).
 *   qk: s[h] = q_h . f16(krow) for the group's heads, each dot over 8 lanes (lane l takes elements
 *       l, l+8, ...) combined as ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7));
 *   pv: out_h += w[h * wstride] * f16(vrow), multiply then add.
 * Exact products: over an f16 cache both factors of every product are f16 values (q and the weights are
 * rounded to f16 first), 11 significant bits each, so the product is exact in f32 (22 bits, exponents far
 * inside f32's range) and a fused multiply-add rounds once, as the add alone does: the same bits as
 * multiply then add, in half the floating-point instructions. The NEON loops fuse those (llvm-mca's
 * Cortex-A72 model, the Pi 4's core: a values tile of 4 heads x 16 columns 62 -> 32 cycles a key, qk's 4
 * heads 29 -> 15 cycles per 8 elements). The AVX-512 loops fuse them too: on the Zen 5 a layer 2048 keys
 * deep on 2 threads (scripts/bench_attention.py --depth 2048 --layers 28 -r 9, 4 interleaved rounds) took
 * 84-96 us against 97-102 (Qwen2.5-1.5B's 2 x 6 x 128), 66-76 against 73-100 (gemma3's 1 x 4 x 256), SmolLM2's
 * 3 x 3 x 64 the same (59-67); on the Sapphire Rapids-class Xeon fused measured within noise. The AVX2
 * loops fuse them on AMD CPUs (the Zen 5 held to the AVX2 level, same runs: 104-111 us against 124-129,
 * 81-85 against 91-94, 68-71 against 71-73) and multiply then add on Intel's: fused they were 0-20% slower
 * on that Xeon, a tile's 8 sums then waiting on the FMA's latency (EDGELLM_ATTN_FMA=0 / 1 picks either).
 * q8_0 products (unrounded weights times d * q, or d_k * d_q times an integer sum) are not exact and are
 * never fused. */
typedef struct {
    void (*qk)(const float *q, int64_t group, int64_t dh, const uint16_t *krow, float *row, float *s);
    void (*pv)(float *out, const float *w, int64_t wstride, int64_t group, int64_t dh, const uint16_t *vrow,
               float *row);
    void (*round_f16)(float *x, int64_t n); /* x = f16(x), nearest even */
    /* For dh a multiple of 8 and every key mapped: the same sums over all t keys of a (token,
     * kv head) at once, keys at kv + slots[j] * stride. scores: sc[h * ldsc + j] = q_h . f16(key j) (qk's
     * bits; keys 8 at a time, their lane sums reduced together); values: out_h[d] += w[h * ldw + j] *
     * f16(value j)[d] for j = 0..t-1 in order and d in [d0, d1) (multiples of 8) (pv's bits; the sums held
     * in registers over all keys). The values loops' slots[t .. t_pf) are mapped too (the keys of a later
     * call, t_pf >= t): their rows may be prefetched, their values are not read. */
    void (*scores)(const float *q, int64_t group, int64_t dh, const uint16_t *kv, int64_t stride,
                   const int64_t *slots, int64_t t, float *kbuf, float *sc, int64_t ldsc);
    void (*values)(float *out, const float *w, int64_t ldw, int64_t group, int64_t dh, int64_t d0, int64_t d1,
                   const uint16_t *kv, int64_t stride, const int64_t *slots, int64_t t, int64_t t_pf);
    /* All t keys / values of a (token, kv head) at once over q8_0 rows (runs of nb blocks at base +
     * slots[j] * stride bytes): sc[h * ldsc + j] = q_h . key j with q8_scores' bits; out[h * ldo + d] +=
     * w[h * ldw + j] * (d_b * q[d]) for j in order and d < nb * 32, multiply then add (pv's steps on the
     * exact f32 value), where base and out may start past a row's first blocks (a column range). */
    void (*q8_scores_all)(const kv_q8 *q, int64_t group, int64_t nb, const char *base, int64_t stride,
                          const int64_t *slots, int64_t t, float *sc, int64_t ldsc);
    void (*q8_values_all)(float *out, int64_t ldo, const float *w, int64_t ldw, int64_t group, int64_t nb,
                          const char *base, int64_t stride, const int64_t *slots, int64_t t, int64_t t_pf);
    /* softmax's elementwise steps: the largest of x[0..n) (NaN never wins: -inf if all are), x -= m,
     * x /= d, x *= s (exact per element, so any width gives the same bits) */
    float (*max_of)(const float *x, int64_t n);
    void (*sub)(float *x, int64_t n, float m);
    void (*div)(float *x, int64_t n, float d);
    void (*mul)(float *x, int64_t n, float s);
} attn_loops;

static float combine(const float *l) { return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7])); }

/* the integer sum of one pair of q8_0 blocks: exact, so every build gets the same value */
static int32_t q8_isum_c(const int8_t *a, const int8_t *b) {
    int32_t s = 0;
    for (int j = 0; j < 32; j++) s += (int32_t)a[j] * b[j];
    return s;
}

/* s[h] = q_h . key over nb q8_0 blocks for the group's heads (blocks of head h at q + h * nb) */
static void q8_scores(const kv_q8 *q, int64_t group, int64_t nb, const kv_q8 *key, float *s) {
    for (int64_t h = 0; h < group; h++) {
        const kv_q8 *qh = q + h * nb;
        float acc = 0.0f;
        for (int64_t b = 0; b < nb; b++) {
            const float d = ed_rt_f16_lut[key[b].d] * ed_rt_f16_lut[qh[b].d];
            const float t = d * (float)q8_isum_c(key[b].qs, qh[b].qs);
            acc = acc + t;
        }
        s[h] = acc;
    }
}

static void qk_c(const float *q, int64_t group, int64_t dh, const uint16_t *krow, float *row, float *s) {
    for (int64_t d = 0; d < dh; d++) row[d] = ed_rt_f16_lut[krow[d]];
    for (int64_t h = 0; h < group; h++) {
        const float *a = q + h * dh;
        float acc[8] = {0};
        int64_t d = 0;
        for (; d + 8 <= dh; d += 8)
            for (int l = 0; l < 8; l++) acc[l] += a[d + l] * row[d + l];
        for (int l = 0; d < dh; d++, l++) acc[l] += a[d] * row[d];
        s[h] = combine(acc);
    }
}

static void pv_c(float *out, const float *w, int64_t wstride, int64_t group, int64_t dh, const uint16_t *vrow,
                 float *row) {
    for (int64_t d = 0; d < dh; d++) row[d] = ed_rt_f16_lut[vrow[d]];
    for (int64_t h = 0; h < group; h++) {
        const float wh = w[h * wstride];
        float *y = out + h * dh;
        for (int64_t d = 0; d < dh; d++) y[d] += wh * row[d];
    }
}

static void round_f16_c(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = ed_f16_round(x[i]);
}

static float max_of_c(const float *x, int64_t n) {
    float m = -INFINITY;
    for (int64_t i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

static void sub_c(float *x, int64_t n, float m) {
    for (int64_t i = 0; i < n; i++) x[i] -= m;
}

static void div_c(float *x, int64_t n, float d) {
    for (int64_t i = 0; i < n; i++) x[i] /= d;
}

static void mul_c(float *x, int64_t n, float s) {
    for (int64_t i = 0; i < n; i++) x[i] *= s;
}

/* all keys at once, one at a time: qk_c's and pv_c's operations (dh a multiple of 8) */
static void scores_c(const float *q, int64_t group, int64_t dh, const uint16_t *kv, int64_t stride,
                     const int64_t *slots, int64_t t, float *kbuf, float *sc, int64_t ldsc) {
    float s[64];
    for (int64_t h0 = 0; h0 < group; h0 += 64) {
        const int64_t nh = group - h0 < 64 ? group - h0 : 64;
        for (int64_t j = 0; j < t; j++) {
            qk_c(q + h0 * dh, nh, dh, kv + slots[j] * stride, kbuf, s);
            for (int64_t h = 0; h < nh; h++) sc[(h0 + h) * ldsc + j] = s[h];
        }
    }
}

static void values_c(float *out, const float *w, int64_t ldw, int64_t group, int64_t dh, int64_t d0, int64_t d1,
                     const uint16_t *kv, int64_t stride, const int64_t *slots, int64_t t, int64_t t_pf) {
    (void)t_pf;
    for (int64_t j = 0; j < t; j++) {
        const uint16_t *v = kv + slots[j] * stride;
        for (int64_t h = 0; h < group; h++) {
            const float wh = w[h * ldw + j];
            float *y = out + h * dh;
            for (int64_t d = d0; d < d1; d++) y[d] += wh * ed_rt_f16_lut[v[d]];
        }
    }
}

static void q8_scores_all_c(const kv_q8 *q, int64_t group, int64_t nb, const char *base, int64_t stride,
                            const int64_t *slots, int64_t t, float *sc, int64_t ldsc) {
    for (int64_t j = 0; j < t; j++) {
        const kv_q8 *key = (const kv_q8 *)(base + slots[j] * stride);
        for (int64_t h = 0; h < group; h++) q8_scores(q + h * nb, 1, nb, key, sc + h * ldsc + j);
    }
}

static void q8_values_all_c(float *out, int64_t ldo, const float *w, int64_t ldw, int64_t group, int64_t nb,
                            const char *base, int64_t stride, const int64_t *slots, int64_t t, int64_t t_pf) {
    (void)t_pf;
    for (int64_t j = 0; j < t; j++) {
        const kv_q8 *v = (const kv_q8 *)(base + slots[j] * stride);
        for (int64_t h = 0; h < group; h++) {
            const float wh = w[h * ldw + j];
            float *y = out + h * ldo;
            for (int64_t b = 0; b < nb; b++) {
                const float d = ed_rt_f16_lut[v[b].d];
                for (int e = 0; e < 32; e++) y[b * 32 + e] += wh * (d * (float)v[b].qs[e]);
            }
        }
    }
}

static const attn_loops loops_c = {qk_c,     pv_c,  round_f16_c, scores_c, values_c, q8_scores_all_c, q8_values_all_c,
                                   max_of_c, sub_c, div_c,       mul_c};

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define ED_AVX __attribute__((target("avx,f16c,fma")))

ED_AVX static void qk_avx(const float *q, int64_t group, int64_t dh, const uint16_t *krow, float *row, float *s) {
    (void)row;
    const int64_t d8 = dh / 8 * 8;
    for (int64_t h0 = 0; h0 < group; h0 += 4) { /* 4 heads at a time share each converted key vector */
        const int64_t nh = group - h0 < 4 ? group - h0 : 4;
        __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
        for (int64_t d = 0; d < d8; d += 8) {
            const __m256 k = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(krow + d)));
            for (int64_t h = 0; h < nh; h++)
                acc[h] = _mm256_add_ps(acc[h], _mm256_mul_ps(_mm256_loadu_ps(q + (h0 + h) * dh + d), k));
        }
        for (int64_t h = 0; h < nh; h++) {
            float l[8];
            _mm256_storeu_ps(l, acc[h]);
            for (int64_t d = d8, j = 0; d < dh; d++, j++) l[j] += q[(h0 + h) * dh + d] * ed_rt_f16_lut[krow[d]];
            s[h0 + h] = combine(l);
        }
    }
}

ED_AVX static void pv_avx(float *out, const float *w, int64_t wstride, int64_t group, int64_t dh,
                          const uint16_t *vrow, float *row) {
    (void)row;
    const int64_t d8 = dh / 8 * 8;
    for (int64_t d = 0; d < d8; d += 8) {
        const __m256 v = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(vrow + d)));
        for (int64_t h = 0; h < group; h++) {
            float *y = out + h * dh + d;
            _mm256_storeu_ps(y, _mm256_add_ps(_mm256_loadu_ps(y), _mm256_mul_ps(_mm256_set1_ps(w[h * wstride]), v)));
        }
    }
    for (int64_t d = d8; d < dh; d++)
        for (int64_t h = 0; h < group; h++) out[h * dh + d] += w[h * wstride] * ed_rt_f16_lut[vrow[d]];
}

ED_AVX static void round_f16_avx(float *x, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(x + i, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT)));
    for (; i < n; i++) x[i] = ed_f16_round(x[i]);
}

/* 8 vectors of 8 lane sums -> their 8 combine()s, lane k from vector k: two hadd levels give each
 * vector's (l0+l1)+(l2+l3) and (l4+l5)+(l6+l7), the last add joins them, as combine() does */
ED_AVX static __m256 combine8(const __m256 *a) {
    const __m256 g1 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    const __m256 g2 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(g1, g2, 0x20), _mm256_permute2f128_ps(g1, g2, 0x31));
}

/* nh heads x nk keys (nh * nk <= 8, constants where inlined) of 8-lane sums held over d: each key vector
 * converted from f16 once per d for the nh heads, each q vector loaded once per d for the nk keys; the
 * sums go to acc[h][k0 + k]. `fuse` (a constant): the exact products added by FMAs (the same bits) */
ED_AVX static inline __attribute__((always_inline)) void scores_tile_avx(const float *q, const int nh, const int nk,
                                                                       int64_t dh, const uint16_t *const *rows,
                                                                       __m256 (*acc)[8], int k0, const int fuse) {
    __m256 a[4][8];
    for (int h = 0; h < nh; h++)
        for (int k = 0; k < nk; k++) a[h][k] = _mm256_setzero_ps();
    for (int64_t d = 0; d < dh; d += 8) {
        __m256 qv[4];
        for (int h = 0; h < nh; h++) qv[h] = _mm256_loadu_ps(q + h * dh + d);
        for (int k = 0; k < nk; k++) {
            const __m256 x = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(rows[k] + d)));
            for (int h = 0; h < nh; h++)
                a[h][k] = fuse ? _mm256_fmadd_ps(qv[h], x, a[h][k]) : _mm256_add_ps(a[h][k], _mm256_mul_ps(qv[h], x));
        }
    }
    for (int h = 0; h < nh; h++)
        for (int k = 0; k < nk; k++) acc[h][k0 + k] = a[h][k];
}

/* Keys 8 at a time, for up to 4 heads at once: the 8 keys' dot products in tiles of 4 heads x 2 keys, 2 x 4
 * or 1 x 8 (8 independent sums; each key converted once per tile, not stored), so every key's lanes see
 * the same operations in the same order as one key at a time; each head's 8 sums reduced together
 * (combine8). Keys past t repeat the last one (their sums are not stored). On a Zen 3, 2048 keys of
 * gemma3's 4 heads x 256 on 2 threads: 10-15% less time a layer than converting 8 keys into kbuf first
 * and reading them back for every head (9 loads per 8 products instead of 6; scripts/bench_attention.py). */
ED_AVX static inline __attribute__((always_inline)) void scores_body_avx(const float *q, int64_t group, int64_t dh,
                                                                       const uint16_t *kv, int64_t stride,
                                                                       const int64_t *slots, int64_t t, float *sc,
                                                                       int64_t ldsc, const int fuse) {
    for (int64_t j0 = 0; j0 < t; j0 += 8) {
        const int nk = t - j0 < 8 ? (int)(t - j0) : 8;
        const uint16_t *rows[8];
        for (int k = 0; k < 8; k++) rows[k] = kv + slots[j0 + (k < nk ? k : nk - 1)] * stride;
        for (int64_t j = j0 + 16; j < j0 + 24 && j < t; j++) /* the rows two groups ahead */
            for (int64_t d = 0; d < dh; d += 32) __builtin_prefetch(kv + slots[j] * stride + d);
        for (int64_t h0 = 0; h0 < group; h0 += 4) {
            const int nh = group - h0 < 4 ? (int)(group - h0) : 4, tk = nh >= 3 ? 2 : nh == 2 ? 4 : 8;
            const float *qh = q + h0 * dh;
            __m256 acc[4][8];
            for (int k = 0; k < 8; k += tk) {
                if (k >= nk) {
                    for (int h = 0; h < nh; h++)
                        for (int i = 0; i < tk; i++) acc[h][k + i] = _mm256_setzero_ps();
                    continue;
                }
                switch (nh) {
                case 4: scores_tile_avx(qh, 4, 2, dh, rows + k, acc, k, fuse); break;
                case 3: scores_tile_avx(qh, 3, 2, dh, rows + k, acc, k, fuse); break;
                case 2: scores_tile_avx(qh, 2, 4, dh, rows + k, acc, k, fuse); break;
                default: scores_tile_avx(qh, 1, 8, dh, rows + k, acc, k, fuse); break;
                }
            }
            for (int h = 0; h < nh; h++) {
                float r[8];
                _mm256_storeu_ps(r, combine8(acc[h]));
                memcpy(sc + (h0 + h) * ldsc + j0, r, sizeof(float) * (size_t)nk);
            }
        }
    }
}

ED_AVX static void scores_avx(const float *q, int64_t group, int64_t dh, const uint16_t *kv, int64_t stride,
                              const int64_t *slots, int64_t t, float *kbuf, float *sc, int64_t ldsc) {
    (void)kbuf;
    scores_body_avx(q, group, dh, kv, stride, slots, t, sc, ldsc, 0);
}

ED_AVX static void scores_avx_fma(const float *q, int64_t group, int64_t dh, const uint16_t *kv, int64_t stride,
                                  const int64_t *slots, int64_t t, float *kbuf, float *sc, int64_t ldsc) {
    (void)kbuf;
    scores_body_avx(q, group, dh, kv, stride, slots, t, sc, ldsc, 1);
}

/* scores_avx's bits in AVX-512's 512-bit registers: a vector holds two keys' 8-lane sums (key 2p in its
 * low half, key 2p + 1 in its high half) against the same 8 elements of q (broadcast to both halves), so
 * each multiply and add serves two keys with the same lane operations as before. Keys 8 at a time (4 such
 * pairs, each converted from f16 once per d), up to 6 heads at once (24 sums in registers, q loaded once
 * per d); at the end each head's 8 key sums are split back into 256-bit halves and reduced together
 * (combine8). The loops are bound by the floating-point ports: with these and values_avx512's 512-bit
 * tiles a layer 2048 keys deep on 2 threads of a Sapphire Rapids-class Xeon (scripts/bench_attention.py
 * --depth 2048 --layers 28, two interleaved rounds) takes 102-103 us against 117-132 with 256-bit vectors
 * (gemma3's 1 kv head x 4 x 256), 131-137 against 148-151 (Qwen2.5-1.5B's 2 x 6 x 128), 94-97 against
 * 103-105 (2 x 7 x 64), the same for SmolLM2's 3 x 3 x 64 (82-86). */
#define ED_AVX512 __attribute__((target("avx512f,avx512vl,avx,f16c,fma")))
ED_AVX512 static inline __attribute__((always_inline)) __m512 kv2_avx512(const uint16_t *a, const uint16_t *b) {
    const __m128i lo = _mm_loadu_si128((const __m128i *)a), hi = _mm_loadu_si128((const __m128i *)b);
    return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1));
}

ED_AVX512 static inline __attribute__((always_inline)) void scores8_avx512(const float *q, const int nh, int64_t dh,
                                                                          const uint16_t *const *rows, float *sc,
                                                                          int64_t ldsc, int nk) {
    __m512 acc[6][4];
    for (int h = 0; h < nh; h++)
        for (int p = 0; p < 4; p++) acc[h][p] = _mm512_setzero_ps();
    for (int64_t d = 0; d < dh; d += 8) {
        __m512 qv[6];
        for (int h = 0; h < nh; h++) qv[h] = _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_loadu_pd((const double *)(q + h * dh + d))));
#pragma GCC unroll 4
        for (int p = 0; p < 4; p++) {
            const __m512 kv = kv2_avx512(rows[2 * p] + d, rows[2 * p + 1] + d);
            for (int h = 0; h < nh; h++) acc[h][p] = _mm512_fmadd_ps(qv[h], kv, acc[h][p]); /* exact products */
        }
    }
    for (int h = 0; h < nh; h++) {
        __m256 a[8];
        for (int p = 0; p < 4; p++) {
            a[2 * p] = _mm512_castps512_ps256(acc[h][p]);
            a[2 * p + 1] = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[h][p]), 1));
        }
        float r[8];
        _mm256_storeu_ps(r, combine8(a));
        memcpy(sc + h * ldsc, r, sizeof(float) * (size_t)nk);
    }
}

ED_AVX512 static void scores_avx512(const float *q, int64_t group, int64_t dh, const uint16_t *kv, int64_t stride,
                                    const int64_t *slots, int64_t t, float *kbuf, float *sc, int64_t ldsc) {
    (void)kbuf;
    for (int64_t j0 = 0; j0 < t; j0 += 8) {
        const int nk = t - j0 < 8 ? (int)(t - j0) : 8;
        const uint16_t *rows[8];
        for (int k = 0; k < 8; k++) rows[k] = kv + slots[j0 + (k < nk ? k : nk - 1)] * stride; /* repeats: unused */
        for (int64_t j = j0 + 16; j < j0 + 24 && j < t; j++) /* the rows two groups ahead */
            for (int64_t d = 0; d < dh; d += 32) __builtin_prefetch(kv + slots[j] * stride + d);
        for (int64_t h0 = 0; h0 < group;) {
            const int64_t left = group - h0, nh = left <= 6 ? left : left <= 12 ? (left + 1) / 2 : 6;
            const float *qh = q + h0 * dh;
            float *s = sc + h0 * ldsc + j0;
            switch (nh) {
            case 6: scores8_avx512(qh, 6, dh, rows, s, ldsc, nk); break;
            case 5: scores8_avx512(qh, 5, dh, rows, s, ldsc, nk); break;
            case 4: scores8_avx512(qh, 4, dh, rows, s, ldsc, nk); break;
            case 3: scores8_avx512(qh, 3, dh, rows, s, ldsc, nk); break;
            case 2: scores8_avx512(qh, 2, dh, rows, s, ldsc, nk); break;
            default: scores8_avx512(qh, 1, dh, rows, s, ldsc, nk); break;
            }
            h0 += nh;
        }
    }
}

/* out[h * ldo + d .. d + 8 * nv) += w[h * ldw + j] * value j for nh heads x nv vectors of 8 columns
 * (constants where inlined: nh * nv <= 12, so the sums, the nv converted values and a weight fit the 16
 * registers), j in order: nh * nv independent sums, each value vector converted once per key for all nh
 * heads. Value rows at kv + slots[j] * stride bytes, f16 or (q8, a constant where inlined) q8_0 blocks, a
 * value then being d * q (exact). At key j it also prefetches lines[j], lines[j + t], ... (below npf). */
#define ED_AVX2 __attribute__((target("avx2,f16c,fma")))
ED_AVX2 static inline __attribute__((always_inline)) void values_tile_avx(float *out, int64_t ldo, const float *w,
                                                                        int64_t ldw, const int nh, const int nv,
                                                                        const int q8, const int fuse, int64_t d,
                                                                        const char *kv, int64_t stride,
                                                                        const int64_t *slots, int64_t t,
                                                                        const char *const *lines, int64_t npf) {
    __m256 acc[8][4]; /* nh * nv <= 12 */
    for (int h = 0; h < nh; h++)
        for (int v = 0; v < nv; v++) acc[h][v] = _mm256_loadu_ps(out + h * ldo + d + 8 * v);
    for (int64_t j = 0; j < t; j++) {
        for (int64_t i = j; i < npf; i += t) __builtin_prefetch(lines[i]);
        const char *row = kv + slots[j] * stride;
        __m256 x[4];
        for (int v = 0; v < nv; v++) {
            if (q8) {
                const kv_q8 *blk = (const kv_q8 *)row + (d + 8 * v) / 32;
                const __m128i qs = _mm_loadl_epi64((const __m128i *)(blk->qs + (d + 8 * v) % 32));
                x[v] = _mm256_mul_ps(_mm256_set1_ps(ed_rt_f16_lut[blk->d]), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(qs)));
            } else {
                x[v] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + d + 8 * v)));
            }
        }
        for (int h = 0; h < nh; h++) {
            const __m256 wj = _mm256_set1_ps(w[h * ldw + j]);
            for (int v = 0; v < nv; v++) /* fused only over f16 values (exact products) */
                acc[h][v] = fuse && !q8 ? _mm256_fmadd_ps(wj, x[v], acc[h][v])
                                        : _mm256_add_ps(acc[h][v], _mm256_mul_ps(wj, x[v]));
        }
    }
    for (int h = 0; h < nh; h++)
        for (int v = 0; v < nv; v++) _mm256_storeu_ps(out + h * ldo + d + 8 * v, acc[h][v]);
}

#define ED_VT(NH, NV) values_tile_avx(o, ldo, wh, ldw, NH, NV, q8, fuse, d, kv, stride, sl, nj, pf, npf)
#define ED_VT2(NH) /* NH heads x up to 2 vectors */                                                          \
    if (nv == 2) ED_VT(NH, 2);                                                                                \
    else ED_VT(NH, 1);
#define ED_VT4(NH) /* NH heads x up to 4 vectors */                                                          \
    if (nv == 4) ED_VT(NH, 4);                                                                                \
    else ED_VT2(NH)

/* Keys in blocks of ED_VBLOCK, each block's columns [d0, d1) in tiles of heads x columns: heads 8 at a
 * time (9 and up as even shares), a tile being 2 or fewer heads x 32 columns, 3 to 6 x 16, 7 or 8 x 8
 * (with a Qwen2.5-1.5B group of 6 each value converts once for the 6 heads, not for 4 and again for 2,
 * and no tile has fewer than 4 sums to wait on). Each sum's terms are still added in key order (an
 * accumulator goes to out and back between blocks, exactly). A block's rows come from L1: its lines were
 * prefetched while the block before was multiplied, a few at each key of each tile. Prefetched only ahead
 * of the key loop of the first tile, as before, they came too late: in a 2048-deep Qwen2.5-1.5B decode
 * step at the AVX2 level, a third of the values' time was spent waiting on those prefetches. */
#define ED_VBLOCK 32
#define ED_VLINES (ED_VBLOCK * 10) /* prefetched lines of a block at most (a 256-wide f16 head: 8-9 a row) */
static inline int64_t values_heads(int64_t left) { return left <= 8 ? left : left <= 16 ? (left + 1) / 2 : 8; }
static inline int64_t values_vectors(int64_t nh, int64_t n8) {
    const int64_t most = nh <= 2 ? 4 : nh <= 6 ? 2 : 1;
    return n8 >= most ? most : n8 >= 2 ? 2 : 1;
}

/* values_avx and q8_values_all_avx2: out[h * ldo + d] += w[h * ldw + j] * value j [d] for d in [d0, d1), value
 * rows at kv + slots[j] * stride bytes of kind q8 (a constant where inlined; q8_0 columns come in whole
 * blocks), the rows' bytes [pf_begin, pf_end) prefetched a block ahead (past t, up to key t_pf) */
ED_AVX2 static inline __attribute__((always_inline)) void values_blocks(float *out, int64_t ldo, const float *w,
                                                                      int64_t ldw, int64_t group, const int q8,
                                                                      const int fuse, int64_t d0, int64_t d1,
                                                                      const char *kv, int64_t stride, int64_t pf_begin,
                                                                      int64_t pf_end, const int64_t *slots, int64_t t,
                                                                      int64_t t_pf) {
    int64_t tiles = 0; /* of a block */
    for (int64_t h0 = 0, nh; h0 < group; h0 += nh) {
        nh = values_heads(group - h0);
        for (int64_t d = d0; d < d1; d += 8 * values_vectors(nh, (d1 - d) / 8)) tiles++;
    }
    if (!tiles) return; /* no columns */
    const char *lines[ED_VLINES];
    for (int64_t j0 = 0; j0 < t; j0 += ED_VBLOCK) {
        const int64_t nj = t - j0 < ED_VBLOCK ? t - j0 : ED_VBLOCK;
        int64_t nlines = 0; /* the next block's lines, shared out among this block's tiles */
        for (int64_t j = j0 + ED_VBLOCK; j < j0 + 2 * ED_VBLOCK && j < t_pf; j++) {
            const uintptr_t row = (uintptr_t)(kv + slots[j] * stride);
            for (uintptr_t a = (row + (uintptr_t)pf_begin) & ~(uintptr_t)63; a < row + (uintptr_t)pf_end && nlines < ED_VLINES;
                 a += 64)
                lines[nlines++] = (const char *)a;
        }
        const int64_t share = (nlines + tiles - 1) / tiles;
        int64_t tile = 0;
        for (int64_t h0 = 0, nh; h0 < group; h0 += nh) {
            nh = values_heads(group - h0);
            float *o = out + h0 * ldo;
            const float *wh = w + h0 * ldw + j0;
            const int64_t *sl = slots + j0;
            for (int64_t d = d0; d < d1; tile++) {
                const int64_t nv = values_vectors(nh, (d1 - d) / 8);
                const int64_t first = tile * share < nlines ? tile * share : nlines;
                const char *const *pf = lines + first;
                const int64_t npf = nlines - first < share ? nlines - first : share;
                switch (nh) {
                case 8: ED_VT(8, 1); break;
                case 7: ED_VT(7, 1); break;
                case 6: ED_VT2(6) break;
                case 5: ED_VT2(5) break;
                case 4: ED_VT2(4) break;
                case 3: ED_VT2(3) break;
                case 2: ED_VT4(2) break;
                default: ED_VT4(1) break;
                }
                d += 8 * nv;
            }
        }
    }
}
#undef ED_VT
#undef ED_VT2
#undef ED_VT4

ED_AVX2 static void values_avx(float *out, const float *w, int64_t ldw, int64_t group, int64_t dh, int64_t d0,
                               int64_t d1, const uint16_t *kv, int64_t stride, const int64_t *slots, int64_t t,
                               int64_t t_pf) {
    values_blocks(out, dh, w, ldw, group, 0, 0, d0, d1, (const char *)kv, 2 * stride, 2 * d0, 2 * d1, slots, t, t_pf);
}

ED_AVX2 static void values_avx_fma(float *out, const float *w, int64_t ldw, int64_t group, int64_t dh, int64_t d0,
                                   int64_t d1, const uint16_t *kv, int64_t stride, const int64_t *slots, int64_t t,
                                   int64_t t_pf) {
    values_blocks(out, dh, w, ldw, group, 0, 1, d0, d1, (const char *)kv, 2 * stride, 2 * d0, 2 * d1, slots, t, t_pf);
}

/* The AVX-512 value tiles prefetch the rows this many keys ahead: a split decode step's next run of 64
 * keys (the same key in it). On the Zen 5, 2048 keys deep over 28 layers (scripts/bench_attention.py -r 9,
 * 3 interleaved rounds): 62-65 us a layer against 83-87 at 8 keys ahead for Qwen2.5-1.5B's 2 x 6 x 128,
 * 48-52 against 67-69 for gemma3's 1 x 4 x 256, 47-50 against 57-60 for SmolLM2's 3 x 3 x 64 (16 or 32
 * ahead: between; 96 or 128: no better). The AVX2 loops' prefetch a block ahead gained nothing from 2 or 4. */
#define ED_VPF 64
/* values_avx's bits in AVX-512's 512-bit registers (each column's sum alone, so any width gives the same
 * bits): nh heads x nv vectors of 16 columns (nh * nv <= 24) held over all the keys, each value vector
 * converted once per key (one pass over the tile's columns); value rows at kv + slots[j] * stride bytes,
 * f16 or (q8, a constant where inlined) q8_0 blocks, a value then being d * q (exact), as values_tile_avx */
ED_AVX512 static inline __attribute__((always_inline)) void values_tile_avx512(float *out, int64_t ldo, const float *w,
                                                                              int64_t ldw, const int nh, const int nv,
                                                                              const int q8, int64_t d, const char *kv,
                                                                              int64_t stride, const int64_t *slots,
                                                                              int64_t t, int64_t t_pf) {
    /* the tile's bytes of a row: [e0, e1) */
    const int64_t e0 = q8 ? d / 32 * (int64_t)sizeof(kv_q8) : 2 * d;
    const int64_t e1 = q8 ? (d + 16 * nv + 31) / 32 * (int64_t)sizeof(kv_q8) : 2 * (d + 16 * nv);
    __m512 acc[6][8]; /* nh * nv <= 24 */
    for (int h = 0; h < nh; h++)
        for (int v = 0; v < nv; v++) acc[h][v] = _mm512_loadu_ps(out + h * ldo + d + 16 * v);
    for (int64_t j = 0; j < t; j++) {
        if (j + ED_VPF < t_pf) {
            const char *next = kv + slots[j + ED_VPF] * stride;
            for (int64_t e = e0; e < e1; e += 64) __builtin_prefetch(next + e);
            if (q8) __builtin_prefetch(next + e1 - 1); /* rows of 34-byte blocks end off the 64-byte steps */
        }
        const char *row = kv + slots[j] * stride;
        __m512 wj[6];
        for (int h = 0; h < nh; h++) wj[h] = _mm512_set1_ps(w[h * ldw + j]);
#pragma GCC unroll 8
        for (int v = 0; v < nv; v++) {
            __m512 x;
            if (q8) {
                const kv_q8 *blk = (const kv_q8 *)row + (d + 16 * v) / 32;
                const __m128i qs = _mm_loadu_si128((const __m128i *)(blk->qs + (d + 16 * v) % 32));
                x = _mm512_mul_ps(_mm512_set1_ps(ed_rt_f16_lut[blk->d]), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(qs)));
            } else {
                x = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)row + d + 16 * v)));
            }
            for (int h = 0; h < nh; h++) /* f16 weights times f16 values: exact products, fused (above) */
                acc[h][v] = q8 ? _mm512_add_ps(acc[h][v], _mm512_mul_ps(wj[h], x))
                               : _mm512_fmadd_ps(wj[h], x, acc[h][v]);
        }
    }
    for (int h = 0; h < nh; h++)
        for (int v = 0; v < nv; v++) _mm512_storeu_ps(out + h * ldo + d + 16 * v, acc[h][v]);
}

/* the last 8 columns of a row whose width is an odd multiple of 8 (rare; f16 rows only): 256-bit sums, a
 * head at a time */
ED_AVX512 static void values8_avx512(float *out, int64_t ldo, const float *w, int64_t ldw, int64_t nh, int64_t d,
                                     const char *kv, int64_t stride, const int64_t *slots, int64_t t) {
    for (int64_t h = 0; h < nh; h++) {
        __m256 acc = _mm256_loadu_ps(out + h * ldo + d);
        for (int64_t j = 0; j < t; j++) {
            const uint16_t *src = (const uint16_t *)(kv + slots[j] * stride) + d;
            const __m256 x = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)src));
            acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_set1_ps(w[h * ldw + j]), x));
        }
        _mm256_storeu_ps(out + h * ldo + d, acc);
    }
}

#define ED_VT(NH, NV) values_tile_avx512(o, ldo, wh, ldw, NH, NV, q8, d, kv, stride, slots, t, t_pf)
#define ED_VT4(NH) /* NH heads x up to 4 vectors */                                                          \
    switch (nv) {                                                                                            \
    case 4: ED_VT(NH, 4); break;                                                                              \
    case 2: ED_VT(NH, 2); break;                                                                              \
    default: ED_VT(NH, 1); break;                                                                             \
    }
#define ED_VT8(NH) /* NH heads x up to 8 vectors */                                                          \
    if (nv == 8) ED_VT(NH, 8);                                                                               \
    else ED_VT4(NH)

/* out[h * ldo + d] += w[h * ldw + j] * value j [d] for d in [d0, d1): heads 6 at a time (group 7 and up as
 * even shares) x 64 columns, 3 or fewer x 128; value rows of kind q8 (a constant where inlined; q8_0
 * columns come in whole blocks) at kv + slots[j] * stride bytes, prefetched ED_VPF keys ahead up to key t_pf */
ED_AVX512 static inline __attribute__((always_inline)) void values_kind_avx512(float *out, int64_t ldo, const float *w,
                                                                              int64_t ldw, int64_t group, const int q8,
                                                                              int64_t d0, int64_t d1, const char *kv,
                                                                              int64_t stride, const int64_t *slots,
                                                                              int64_t t, int64_t t_pf) {
    for (int64_t h0 = 0; h0 < group;) {
        const int64_t left = group - h0, nh = left <= 6 ? left : left <= 12 ? (left + 1) / 2 : 6;
        float *o = out + h0 * ldo;
        const float *wh = w + h0 * ldw;
        int64_t d = d0;
        for (; d + 16 <= d1;) {
            const int64_t n16 = (d1 - d) / 16, most = nh <= 3 ? 8 : 4;
            const int64_t nv = n16 >= most ? most : n16 >= 4 ? 4 : n16 >= 2 ? 2 : 1;
            switch (nh) {
            case 6: ED_VT4(6) break;
            case 5: ED_VT4(5) break;
            case 4: ED_VT4(4) break;
            case 3: ED_VT8(3) break;
            case 2: ED_VT8(2) break;
            default: ED_VT8(1) break;
            }
            d += 16 * nv;
        }
        if (d < d1) values8_avx512(o, ldo, wh, ldw, nh, d, kv, stride, slots, t);
        h0 += nh;
    }
}
#undef ED_VT
#undef ED_VT4
#undef ED_VT8

ED_AVX512 static void values_avx512(float *out, const float *w, int64_t ldw, int64_t group, int64_t dh, int64_t d0,
                                    int64_t d1, const uint16_t *kv, int64_t stride, const int64_t *slots, int64_t t,
                                    int64_t t_pf) {
    values_kind_avx512(out, dh, w, ldw, group, 0, d0, d1, (const char *)kv, 2 * stride, slots, t, t_pf);
}

/* q8_values_all in 512-bit registers: q8_values_all_avx2's bits (each column's sum alone) */
ED_AVX512 static void q8_values_all_avx512(float *out, int64_t ldo, const float *w, int64_t ldw, int64_t group,
                                           int64_t nb, const char *base, int64_t stride, const int64_t *slots,
                                           int64_t t, int64_t t_pf) {
    values_kind_avx512(out, ldo, w, ldw, group, 1, 0, nb * 32, base, stride, slots, t, t_pf);
}

/* the 8 int32 lanes of each of 8 vectors summed, vector k's sum in lane k (exact) */
ED_AVX2 static __m256i isum8(const __m256i *p) {
    const __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
    const __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(p[4], p[5]), _mm256_hadd_epi32(p[6], p[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}

ED_AVX2 static void q8_scores_all_avx2(const kv_q8 *q, int64_t group, int64_t nb, const char *base, int64_t stride,
                                       const int64_t *slots, int64_t t, float *sc, int64_t ldsc) {
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t j0 = 0; j0 < t; j0 += 8) {
        const int nk = t - j0 < 8 ? (int)(t - j0) : 8;
        const kv_q8 *key[8];
        for (int k = 0; k < 8; k++) key[k] = (const kv_q8 *)(base + slots[j0 + (k < nk ? k : 0)] * stride);
        for (int64_t h = 0; h < group; h++) {
            const kv_q8 *qh = q + h * nb;
            __m256 acc = _mm256_setzero_ps();
            for (int64_t b = 0; b < nb; b++) {
                const __m256i y = _mm256_loadu_si256((const __m256i *)qh[b].qs);
                __m256i p[8];
                float dk[8];
                for (int k = 0; k < 8; k++) {
                    const __m256i x = _mm256_loadu_si256((const __m256i *)key[k][b].qs);
                    p[k] = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x)), ones);
                    dk[k] = ed_rt_f16_lut[key[k][b].d];
                }
                const __m256 d = _mm256_mul_ps(_mm256_loadu_ps(dk), _mm256_set1_ps(ed_rt_f16_lut[qh[b].d]));
                acc = _mm256_add_ps(acc, _mm256_mul_ps(d, _mm256_cvtepi32_ps(isum8(p))));
            }
            float r[8];
            _mm256_storeu_ps(r, acc);
            memcpy(sc + h * ldsc + j0, r, sizeof(float) * (size_t)nk);
        }
    }
}

/* q8_0 scores with AVX512-VNNI, 16 keys at a time: each key block's 32 bytes are transposed so that vector w
 * holds dword w of the 16 keys (key k in lane k) as unsigned bytes x + 128, once for all the heads; then
 * a head's 8 vpdpbusd against its block's dwords (broadcast) leave the 16 keys' integer sums in the lanes,
 * from -128 x the sum of the head's block (so sum (x + 128) q - 128 sum q = sum x q: exact, no horizontal
 * sums, no saturation). The float steps are q8_scores' per lane: f32(d_k * d_q) * isum added block by block
 * in order from 0. q8_scores_all_avx2 had 8 keys x 8-lane partial sums reduced per head and block. */
#define ED_AVX512VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,avx,f16c")))
#define ED_Q8T_BLOCKS 16   /* the most blocks a head (dh <= 512) for the transposed keys on the stack */
#define ED_Q8T_SUMS 4096   /* the most (head, block) pairs of q a call for their sums on the stack */

/* qs[k]: 32 bytes of key k (k < 16) -> tw[w] lane k = dword w of key k, each byte + 128: an 8 x 8 dword
 * transpose in each 256-bit half (keys 0-7, keys 8-15) */
ED_AVX512VNNI static inline __attribute__((always_inline)) void q8_transpose16(const int8_t *const *qs, __m512i *tw) {
    __m512i z[8], t[8], u[8];
    for (int i = 0; i < 8; i++)
        z[i] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)qs[i])),
                                  _mm256_loadu_si256((const __m256i *)qs[i + 8]), 1);
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm512_unpacklo_epi32(z[i], z[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(z[i], z[i + 1]);
    }
    for (int g = 0; g < 8; g += 4) {
        u[g] = _mm512_unpacklo_epi64(t[g], t[g + 2]);
        u[g + 1] = _mm512_unpackhi_epi64(t[g], t[g + 2]);
        u[g + 2] = _mm512_unpacklo_epi64(t[g + 1], t[g + 3]);
        u[g + 3] = _mm512_unpackhi_epi64(t[g + 1], t[g + 3]);
    }
    /* per 256-bit half: the 128-bit lanes 0 of a and b, or 1 of each */
    const __m512i lo = _mm512_set_epi64(13, 12, 5, 4, 9, 8, 1, 0), hi = _mm512_set_epi64(15, 14, 7, 6, 11, 10, 3, 2);
    const __m512i bias = _mm512_set1_epi8((char)0x80);
    for (int w = 0; w < 4; w++) {
        tw[w] = _mm512_xor_si512(_mm512_permutex2var_epi64(u[w], lo, u[w + 4]), bias);
        tw[w + 4] = _mm512_xor_si512(_mm512_permutex2var_epi64(u[w], hi, u[w + 4]), bias);
    }
}

/* the scores of nh (<= 8, a constant where inlined) heads against 16 transposed keys: sc[h * ldsc + k] for
 * the keys in mask m */
ED_AVX512VNNI static inline __attribute__((always_inline)) void q8_scores16_vnni(const kv_q8 *q, const int nh, int64_t nb,
                                                                                const __m512i (*tw)[8], const __m512 *dk,
                                                                                const int32_t *qsum, float *sc,
                                                                                int64_t ldsc, __mmask16 m) {
    __m512 acc[8];
    for (int h = 0; h < nh; h++) acc[h] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m512i s[8];
        for (int h = 0; h < nh; h++) s[h] = _mm512_set1_epi32(qsum[h * nb + b]);
        for (int w = 0; w < 8; w++)
            for (int h = 0; h < nh; h++) {
                int32_t qd;
                memcpy(&qd, q[h * nb + b].qs + 4 * w, 4);
                s[h] = _mm512_dpbusd_epi32(s[h], tw[b][w], _mm512_set1_epi32(qd));
            }
        for (int h = 0; h < nh; h++) {
            const __m512 d = _mm512_mul_ps(dk[b], _mm512_set1_ps(ed_rt_f16_lut[q[h * nb + b].d]));
            acc[h] = _mm512_add_ps(acc[h], _mm512_mul_ps(d, _mm512_cvtepi32_ps(s[h])));
        }
    }
    for (int h = 0; h < nh; h++) _mm512_mask_storeu_ps(sc + h * ldsc, m, acc[h]);
}

ED_AVX512VNNI static void q8_scores_all_vnni(const kv_q8 *q, int64_t group, int64_t nb, const char *base,
                                             int64_t stride, const int64_t *slots, int64_t t, float *sc, int64_t ldsc) {
    if (nb > ED_Q8T_BLOCKS || group * nb > ED_Q8T_SUMS) {
        q8_scores_all_avx2(q, group, nb, base, stride, slots, t, sc, ldsc);
        return;
    }
    int32_t qsum[ED_Q8T_SUMS]; /* -128 x the sum of each block of q: by vpsadbw over q + 128 (the split path
                                * calls this every few keys, where a byte loop cost ~10% of the layer) */
    const __m256i bias = _mm256_set1_epi8((char)0x80);
    for (int64_t i = 0; i < group * nb; i++) {
        const __m256i u = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)q[i].qs), bias);
        const __m256i s4 = _mm256_sad_epu8(u, _mm256_setzero_si256()); /* 4 sums of 8 bytes + 128 */
        const __m128i s2 = _mm_add_epi64(_mm256_castsi256_si128(s4), _mm256_extracti128_si256(s4, 1));
        const int32_t sum = (int32_t)(_mm_cvtsi128_si64(s2) + _mm_extract_epi64(s2, 1)) - 32 * 128;
        qsum[i] = -128 * sum;
    }
    __m512i tw[ED_Q8T_BLOCKS][8];
    __m512 dk[ED_Q8T_BLOCKS];
    const int64_t row_bytes = nb * (int64_t)sizeof(kv_q8);
    for (int64_t j0 = 0; j0 < t; j0 += 16) {
        const int nk = t - j0 < 16 ? (int)(t - j0) : 16;
        const kv_q8 *key[16];
        for (int k = 0; k < 16; k++) key[k] = (const kv_q8 *)(base + slots[j0 + (k < nk ? k : nk - 1)] * stride);
        for (int64_t j = j0 + 32; j < j0 + 48 && j < t; j++) /* the rows two steps ahead */
            for (int64_t e = 0; e < row_bytes + 63; e += 64)
                __builtin_prefetch(base + slots[j] * stride + (e < row_bytes ? e : row_bytes - 1));
        for (int64_t b = 0; b < nb; b++) {
            const int8_t *qs[16];
            uint16_t d[16];
            for (int k = 0; k < 16; k++) qs[k] = key[k][b].qs, d[k] = key[k][b].d;
            q8_transpose16(qs, tw[b]);
            dk[b] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)d));
        }
        const __mmask16 m = (__mmask16)((1u << nk) - 1);
        for (int64_t h0 = 0; h0 < group; h0 += 8) {
            const kv_q8 *qh = q + h0 * nb;
            const int32_t *sh = qsum + h0 * nb;
            float *s = sc + h0 * ldsc + j0;
            switch (group - h0 < 8 ? group - h0 : 8) {
            case 8: q8_scores16_vnni(qh, 8, nb, tw, dk, sh, s, ldsc, m); break;
            case 7: q8_scores16_vnni(qh, 7, nb, tw, dk, sh, s, ldsc, m); break;
            case 6: q8_scores16_vnni(qh, 6, nb, tw, dk, sh, s, ldsc, m); break;
            case 5: q8_scores16_vnni(qh, 5, nb, tw, dk, sh, s, ldsc, m); break;
            case 4: q8_scores16_vnni(qh, 4, nb, tw, dk, sh, s, ldsc, m); break;
            case 3: q8_scores16_vnni(qh, 3, nb, tw, dk, sh, s, ldsc, m); break;
            case 2: q8_scores16_vnni(qh, 2, nb, tw, dk, sh, s, ldsc, m); break;
            default: q8_scores16_vnni(qh, 1, nb, tw, dk, sh, s, ldsc, m); break;
            }
        }
    }
}

ED_AVX2 static void q8_values_all_avx2(float *out, int64_t ldo, const float *w, int64_t ldw, int64_t group, int64_t nb,
                                       const char *base, int64_t stride, const int64_t *slots, int64_t t,
                                       int64_t t_pf) {
    values_blocks(out, ldo, w, ldw, group, 1, 0, 0, nb * 32, base, stride, 0, nb * (int64_t)sizeof(kv_q8), slots, t,
                  t_pf);
}

/* max(x, m) keeps m where x is NaN or equal (vmaxps returns its second operand then), as x > m ? x : m */
ED_AVX static float max_of_avx(const float *x, int64_t n) {
    __m256 m = _mm256_set1_ps(-INFINITY);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) m = _mm256_max_ps(_mm256_loadu_ps(x + i), m);
    float l[8], r = -INFINITY;
    _mm256_storeu_ps(l, m);
    for (int k = 0; k < 8; k++) r = l[k] > r ? l[k] : r;
    for (; i < n; i++) r = x[i] > r ? x[i] : r;
    return r;
}

ED_AVX static void sub_avx(float *x, int64_t n, float m) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_sub_ps(_mm256_loadu_ps(x + i), _mm256_set1_ps(m)));
    for (; i < n; i++) x[i] -= m;
}

ED_AVX static void div_avx(float *x, int64_t n, float d) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_div_ps(_mm256_loadu_ps(x + i), _mm256_set1_ps(d)));
    for (; i < n; i++) x[i] /= d;
}

ED_AVX static void mul_avx(float *x, int64_t n, float s) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), _mm256_set1_ps(s)));
    for (; i < n; i++) x[i] *= s;
}

static const attn_loops loops_avx = {qk_avx,       pv_avx,     round_f16_avx,      scores_avx,         values_avx,
                                     q8_scores_all_avx2, q8_values_all_avx2, max_of_avx,
                                     sub_avx,      div_avx,    mul_avx};
/* the AVX2 level on AMD: the f16 products fused (the file's note) */
static const attn_loops loops_avx_fma = {qk_avx,       pv_avx,     round_f16_avx,      scores_avx_fma,  values_avx_fma,
                                         q8_scores_all_avx2, q8_values_all_avx2, max_of_avx,
                                         sub_avx,      div_avx,    mul_avx};
static const attn_loops loops_avx512 = {qk_avx,        pv_avx,  round_f16_avx, scores_avx512,
                                        values_avx512, q8_scores_all_avx2, q8_values_all_avx512, max_of_avx,
                                        sub_avx,       div_avx, mul_avx};
static const attn_loops loops_avx512_vnni = {qk_avx,        pv_avx,  round_f16_avx, scores_avx512,
                                             values_avx512, q8_scores_all_vnni, q8_values_all_avx512, max_of_avx,
                                             sub_avx,       div_avx, mul_avx};
#endif

#if defined(__aarch64__)
#include <arm_neon.h>
/* The portable loops in NEON (baseline on AArch64: the Pi 4's level as well as the Pi 5's): f16 keys and
 * values converted by fcvtl instead of the 256 KiB table, each (head, key) dot in qk_c's 8 lanes as two
 * vectors (lanes 0-3, 4-7), products of f16 values fused (vfmaq: exact products, the file's note), f16 rounding by
 * fcvtn / fcvtl (nearest even, as ed_f16_round), so the bits are the portable loops' (native/tests/
 * attention_check.c compares them). */
#define ED_NEON_INLINE static inline __attribute__((always_inline))

ED_NEON_INLINE float32x4_t kv4_neon(const uint16_t *p) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))); }

/* s[h] = q_h . f16(krow) for nh (<= 4) heads, qk_c's lanes and combine (the tail past d8 in lanes 0..) */
ED_NEON_INLINE void qk4_neon(const float *q, const int nh, int64_t dh, const uint16_t *krow, float *s) {
    const int64_t d8 = dh / 8 * 8;
    float32x4_t lo[4], hi[4];
    for (int h = 0; h < nh; h++) lo[h] = hi[h] = vdupq_n_f32(0.0f);
    for (int64_t d = 0; d < d8; d += 8) {
        const float32x4_t k0 = kv4_neon(krow + d), k1 = kv4_neon(krow + d + 4);
        for (int h = 0; h < nh; h++) {
            lo[h] = vfmaq_f32(lo[h], vld1q_f32(q + h * dh + d), k0);
            hi[h] = vfmaq_f32(hi[h], vld1q_f32(q + h * dh + d + 4), k1);
        }
    }
    float l[4][8];
    for (int h = 0; h < nh; h++) { /* no inner loop here (unrolled: lo and hi stay in registers above) */
        vst1q_f32(l[h], lo[h]);
        vst1q_f32(l[h] + 4, hi[h]);
    }
    for (int h = 0; h < nh; h++) {
        for (int64_t d = d8, j = 0; d < dh; d++, j++) l[h][j] += q[h * dh + d] * ed_rt_f16_lut[krow[d]];
        s[h] = combine(l[h]);
    }
}

static void qk_neon(const float *q, int64_t group, int64_t dh, const uint16_t *krow, float *row, float *s) {
    (void)row;
    for (int64_t h0 = 0; h0 < group; h0 += 4) {
        switch (group - h0 < 4 ? group - h0 : 4) {
        case 4: qk4_neon(q + h0 * dh, 4, dh, krow, s + h0); break;
        case 3: qk4_neon(q + h0 * dh, 3, dh, krow, s + h0); break;
        case 2: qk4_neon(q + h0 * dh, 2, dh, krow, s + h0); break;
        default: qk4_neon(q + h0 * dh, 1, dh, krow, s + h0); break;
        }
    }
}

static void pv_neon(float *out, const float *w, int64_t wstride, int64_t group, int64_t dh, const uint16_t *vrow,
                    float *row) {
    (void)row;
    const int64_t d4 = dh / 4 * 4;
    for (int64_t d = 0; d < d4; d += 4) {
        const float32x4_t v = kv4_neon(vrow + d);
        for (int64_t h = 0; h < group; h++) {
            float *y = out + h * dh + d;
            vst1q_f32(y, vfmaq_f32(vld1q_f32(y), vdupq_n_f32(w[h * wstride]), v));
        }
    }
    for (int64_t d = d4; d < dh; d++)
        for (int64_t h = 0; h < group; h++) out[h * dh + d] += w[h * wstride] * ed_rt_f16_lut[vrow[d]];
}

static void round_f16_neon(float *x, int64_t n) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(x + i, vcvt_f32_f16(vcvt_f16_f32(vld1q_f32(x + i))));
    for (; i < n; i++) x[i] = ed_f16_round(x[i]);
}

static void scores_neon(const float *q, int64_t group, int64_t dh, const uint16_t *kv, int64_t stride,
                        const int64_t *slots, int64_t t, float *kbuf, float *sc, int64_t ldsc) {
    (void)kbuf;
    float s[4];
    for (int64_t h0 = 0; h0 < group; h0 += 4) {
        const int nh = group - h0 < 4 ? (int)(group - h0) : 4;
        for (int64_t j = 0; j < t; j++) {
            qk_neon(q + h0 * dh, nh, dh, kv + slots[j] * stride, NULL, s);
            for (int h = 0; h < nh; h++) sc[(h0 + h) * ldsc + j] = s[h];
        }
    }
}

/* keys in blocks of ED_VBLOCK_NEON, so that a block's value rows come from memory in the first column pass
 * and from L1 in the others (each sum's terms still added in key order, through out between blocks) */
#define ED_VBLOCK_NEON 32
/* out[h * dh + d ..] += w[h * ldw + j] * value j [d ..] over nv vectors of 4 columns and nh heads, the sums
 * held in registers over the keys */
ED_NEON_INLINE void values_tile_neon(float *out, const float *w, int64_t ldw, const int nh, const int nv,
                                     int64_t dh, int64_t d, const uint16_t *kv, int64_t stride,
                                     const int64_t *slots, int64_t t) {
    float32x4_t acc[4][4];
    for (int h = 0; h < nh; h++)
        for (int v = 0; v < nv; v++) acc[h][v] = vld1q_f32(out + h * dh + d + 4 * v);
    for (int64_t j = 0; j < t; j++) {
        const uint16_t *src = kv + slots[j] * stride + d;
        float32x4_t x[4];
        for (int v = 0; v < nv; v++) x[v] = kv4_neon(src + 4 * v);
        for (int h = 0; h < nh; h++) {
            const float32x4_t wj = vdupq_n_f32(w[h * ldw + j]);
            for (int v = 0; v < nv; v++) acc[h][v] = vfmaq_f32(acc[h][v], wj, x[v]);
        }
    }
    for (int h = 0; h < nh; h++)
        for (int v = 0; v < nv; v++) vst1q_f32(out + h * dh + d + 4 * v, acc[h][v]);
}

#define ED_VALUES_TILE_NEON(NV)                                                                               \
    switch (nh) {                                                                                             \
    case 4: values_tile_neon(o, wh, ldw, 4, NV, dh, d, kv, stride, sl, nj); break;                            \
    case 3: values_tile_neon(o, wh, ldw, 3, NV, dh, d, kv, stride, sl, nj); break;                            \
    case 2: values_tile_neon(o, wh, ldw, 2, NV, dh, d, kv, stride, sl, nj); break;                            \
    default: values_tile_neon(o, wh, ldw, 1, NV, dh, d, kv, stride, sl, nj); break;                           \
    }

static void values_neon(float *out, const float *w, int64_t ldw, int64_t group, int64_t dh, int64_t d0, int64_t d1,
                        const uint16_t *kv, int64_t stride, const int64_t *slots, int64_t t, int64_t t_pf) {
    (void)t_pf;
    for (int64_t j0 = 0; j0 < t; j0 += ED_VBLOCK_NEON) {
        const int64_t nj = t - j0 < ED_VBLOCK_NEON ? t - j0 : ED_VBLOCK_NEON;
        for (int64_t h0 = 0; h0 < group; h0 += 4) {
            const int nh = group - h0 < 4 ? (int)(group - h0) : 4;
            float *o = out + h0 * dh;
            const float *wh = w + h0 * ldw + j0;
            const int64_t *sl = slots + j0;
            int64_t d = d0;
            for (; d + 16 <= d1; d += 16) ED_VALUES_TILE_NEON(4)
            for (; d < d1; d += 8) ED_VALUES_TILE_NEON(2) /* an odd block of 8 */
        }
    }
}
#undef ED_VALUES_TILE_NEON

static const attn_loops loops_neon = {qk_neon,  pv_neon, round_f16_neon, scores_neon, values_neon, q8_scores_all_c,
                                      q8_values_all_c, max_of_c, sub_c, div_c, mul_c};
#endif

#if defined(__x86_64__) && defined(__GNUC__)
/* whether the AVX2 level takes the fused loops: on AMD CPUs, or as EDGELLM_ATTN_FMA says (0 or 1: to
 * measure them on a new CPU; read as the prefetch distances are); decided once */
static int avx2_fused(void) {
    static atomic_int fused = -1;
    int f = atomic_load_explicit(&fused, memory_order_relaxed);
    if (f < 0) {
        f = ed_env_bytes("EDGELLM_ATTN_FMA", !ed_cpu_is_intel()) != 0;
        atomic_store_explicit(&fused, f, memory_order_relaxed);
    }
    return f;
}
#endif

static const attn_loops *loops(const ed_kernel_table *kt) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (kt->level == ED_LEVEL_AVX512) return ed_cpu_has_avx512vnni() ? &loops_avx512_vnni : &loops_avx512;
    if (kt->level == ED_LEVEL_AVX2) return avx2_fused() ? &loops_avx_fma : &loops_avx;
#endif
#if defined(__aarch64__)
    if (kt->level == ED_LEVEL_NEON) return &loops_neon;
#endif
    (void)kt;
    return &loops_c;
}

/* the K (which 0) or V (which 1) cache's kind: ED_Q8_0, or ED_F16 */
static int kind_of(const ed_op *op, int which) { return ((op->type >> (8 * which)) & 0xff) == ED_Q8_0 ? ED_Q8_0 : ED_F16; }

int ed_attention_valid(const ed_op *op) {
    for (int which = 0; which < 2; which++) {
        const int kind = (op->type >> (8 * which)) & 0xff;
        if (kind != 0 && kind != ED_F16 && kind != ED_Q8_0) return 0;
        if (kind == ED_Q8_0 && op->k % 32) return 0;
    }
    return (op->type >> 16) == 0;
}

/* one row (hkv * dh floats) into a cache row of its kind */
static void store_row(const float *x, uintptr_t cache, int64_t slot, int64_t row, int kind, const ed_kernel_table *kt) {
    if (kind == ED_Q8_0) {
        kt->from_float[ED_Q8_0](x, (kv_q8 *)cache + slot * (row / 32), row);
        return;
    }
    kt->from_float[ED_F16](x, (uint16_t *)cache + slot * row, row); /* nearest even (F16C's where the level has it) */
}

static void store(const ed_op *op, ed_ctx *ctx) {
    const int64_t hkv = op->i0, dh = op->k, row = hkv * dh;
    const int64_t *seq = (const int64_t *)op->src6, *pos = (const int64_t *)op->src7;
    int64_t r0, r1;
    ed_split(op->n, ctx->chunk, ctx->n_chunks, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        const int64_t slot = slot_of(op, seq[r], pos[r]);
        if (slot < 0) continue;
        store_row((const float *)op->src1 + r * row, op->src3, slot, row, kind_of(op, 0), ctx->kt);
        store_row((const float *)op->src2 + r * row, op->src4, slot, row, kind_of(op, 1), ctx->kt);
    }
}

/* the slots of positions lo .. lo+t-1 of a sequence (block table row `blocks`); 0 if one is unmapped */
static int key_slots(const ed_op *op, const int32_t *blocks, int64_t lo, int64_t t, int64_t *slots) {
    const int64_t bs = op->i1;
    for (int64_t j = 0; j < t; j++) {
        const int64_t ps = lo + j, blk = blocks[ps / bs];
        if (blk < 0 || (blk + 1) * bs > op->i5) return 0;
        slots[j] = blk * bs + ps % bs;
    }
    return 1;
}

/* raw scores x[0..n) -> x * scale, then softcap c * tanh(x / c) where the op has one */
static void scale_scores(const ed_op *op, float *x, int64_t n, const attn_loops *L) {
    const float scale = op->f0, softcap = op->f1;
    L->mul(x, n, scale);
    if (softcap > 0)
        for (int64_t i = 0; i < n; i++) x[i] = ed_softcap(x[i], softcap);
}

/* the sums of nr (a constant where inlined, <= 4) rows e + h * ld, each over j = 0..t-1 in order: the rows'
 * dependent chains interleave */
static inline __attribute__((always_inline)) void row_sums(const float *e, int64_t ld, int64_t t, const int nr,
                                                           float *total) {
    float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int64_t j = 0; j < t; j++)
        for (int h = 0; h < nr; h++) s[h] += e[h * ld + j];
    for (int h = 0; h < nr; h++) total[h] = s[h];
}

/* softmax over each of `rows` rows of t scores (row h at sc + h * ld), the weights rounded to f16 if
 * `round`: per row m = max, e = exp(x - m), e / Σe with the sum taken in order */
static void softmax(float *sc, int64_t rows, int64_t ld, int64_t t, int round, const attn_loops *L,
                    const ed_kernel_table *kt) {
    for (int64_t h0 = 0; h0 < rows; h0 += 4) {
        const int nr = rows - h0 < 4 ? (int)(rows - h0) : 4;
        float *e = sc + h0 * ld, total[4];
        for (int h = 0; h < nr; h++) {
            L->sub(e + h * ld, t, L->max_of(e + h * ld, t));
            ed_exp_span(e + h * ld, t, kt);
        }
        switch (nr) {
        case 4: row_sums(e, ld, t, 4, total); break;
        case 3: row_sums(e, ld, t, 3, total); break;
        case 2: row_sums(e, ld, t, 2, total); break;
        default: row_sums(e, ld, t, 1, total); break;
        }
        for (int h = 0; h < nr; h++) {
            L->div(e + h * ld, t, total[h]);
            if (round) L->round_f16(e + h * ld, t);
        }
    }
}

/* one (token r, kv head g) pair, all keys at once, over f16 or q8_0 K and V rows: positions lo .. lo+t-1;
 * 0 (nothing written) unless every key is mapped */
static int attend_keys(const ed_op *op, ed_ctx *ctx, const attn_loops *L, int64_t r, int64_t g, int64_t lo, int64_t t,
                       float *out) {
    const int64_t n_head = op->m, hkv = op->i0, dh = op->k, group = n_head / hkv, nb = dh / 32;
    const int k8 = kind_of(op, 0) == ED_Q8_0, v8 = kind_of(op, 1) == ED_Q8_0;
    /* scratch: slots (t), q as q8_0 (group * nb blocks) or f16-rounded floats (group, dh), 8 converted keys
     * (8, dh), scores (group, t) */
    const size_t qbytes = (sizeof(kv_q8) * (size_t)(group * nb) + 7) / 8 * 8;
    int64_t *slots = ed_thread_scratch(ctx, sizeof(int64_t) * t + qbytes + sizeof(float) * (group * dh + 8 * dh + group * t));
    if (!slots) return 0;
    kv_q8 *qq = (kv_q8 *)(slots + t);
    float *qh = (float *)((char *)qq + qbytes), *kbuf = qh + group * dh, *sc = kbuf + 8 * dh;
    if (!key_slots(op, (const int32_t *)op->src5 + ((const int64_t *)op->src6)[r] * op->i2, lo, t, slots))
        return 0;
    const float *q = (const float *)op->src0 + (r * n_head + g * group) * dh;
    const int64_t krow = hkv * (k8 ? nb * (int64_t)sizeof(kv_q8) : dh * 2), vrow = hkv * (v8 ? nb * (int64_t)sizeof(kv_q8) : dh * 2);
    const char *kc = (const char *)op->src3 + g * (krow / hkv), *vc = (const char *)op->src4 + g * (vrow / hkv);
    if (k8) { /* every key at once: raw scores, then scale and softcap */
        ctx->kt->from_float[ED_Q8_0](q, qq, group * dh);
        L->q8_scores_all(qq, group, nb, kc, krow, slots, t, sc, t);
    } else {
        memcpy(qh, q, sizeof(float) * group * dh);
        L->round_f16(qh, group * dh);
        L->scores(qh, group, dh, (const uint16_t *)kc, hkv * dh, slots, t, kbuf, sc, t);
    }
    scale_scores(op, sc, group * t, L);
    softmax(sc, group, t, t, !v8, L, ctx->kt);
    if (v8) L->q8_values_all(out, dh, sc, t, group, nb, vc, vrow, slots, t, t);
    else L->values(out, sc, t, group, dh, 0, dh, (const uint16_t *)vc, hkv * dh, slots, t, t);
    return 1;
}

/* the first position a token at p attends to */
static int64_t first_key(const ed_op *op, int64_t p) {
    const int64_t window = op->i4;
    return window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
}

/* Prompt tiles: consecutive tokens of one sequence attend together, their query heads stacked as one
 * group over the union of their key ranges, so each key and value row is converted once per tile instead
 * of once per token (flash attention's reuse). Every token's own scores, softmax and weighted sum are the
 * per-token path's operations in its order; the keys outside its range weigh exactly 0, which adds +0 to
 * each sum: the same results. */
#define ED_TILE_MAX 16
#define ED_TILE_SCORES (1 << 20) /* floats of scores per tile at most (4 MiB of scratch) */

static int64_t tile_rows(const ed_op *op) {
    if (op->n < 2 * ED_TILE_MAX) return 1; /* decode and short steps: one token per chunk */
    /* the keys of the first and last token stand for the longest (a prompt's positions ascend; this only
     * sizes the tiles, whose scratch is sized by their own keys) */
    const int64_t *pos = (const int64_t *)op->src7, last = pos[0] > pos[op->n - 1] ? pos[0] : pos[op->n - 1];
    const int64_t group = op->m / op->i0, rows = ED_TILE_SCORES / (group * (last + 1));
    return rows >= ED_TILE_MAX ? ED_TILE_MAX : rows < 2 ? 1 : rows;
}

/* tokens r0 .. r0+nt-1 over kv head g (f16 or q8_0 K and V, as attend_keys per token); 0
 * where the tile does not qualify (the caller then attends token by token): one sequence, consecutive
 * positions, every key mapped */
static int attend_tile(const ed_op *op, ed_ctx *ctx, const attn_loops *L, int64_t r0, int64_t nt, int64_t g) {
    const int64_t n_head = op->m, hkv = op->i0, dh = op->k, group = n_head / hkv;
    const int64_t *seq = (const int64_t *)op->src6, *pos = (const int64_t *)op->src7;
    const int k8 = kind_of(op, 0) == ED_Q8_0, v8 = kind_of(op, 1) == ED_Q8_0;
    if (dh % 8) return 0;
    for (int64_t i = 0; i < nt; i++)
        if (seq[r0 + i] != seq[r0] || pos[r0 + i] != pos[r0] + i || slot_of(op, seq[r0], pos[r0 + i]) < 0) return 0;
    const int64_t lo = first_key(op, pos[r0]), t = pos[r0] + nt - lo, rows = nt * group;
    /* scratch: the keys' slots (t), q (rows, dh), scores (rows, t), 8 converted keys (8, dh), out (rows, dh) */
    int64_t *slots = ed_thread_scratch(ctx, sizeof(int64_t) * t + sizeof(float) * (rows * dh * 2 + rows * t + 8 * dh));
    if (!slots) return 0;
    float *qh = (float *)(slots + t), *sc = qh + rows * dh, *kbuf = sc + rows * t, *acc = kbuf + 8 * dh;
    if (!key_slots(op, (const int32_t *)op->src5 + seq[r0] * op->i2, lo, t, slots)) return 0;
    for (int64_t i = 0; i < nt; i++)
        memcpy(qh + i * group * dh, (const float *)op->src0 + ((r0 + i) * n_head + g * group) * dh,
               sizeof(float) * group * dh);
    if (k8) { /* q8_0 blocks of q (one token's heads after another: the blocks of each alone) in acc's room */
        const int64_t nb = dh / 32, krow = hkv * nb * (int64_t)sizeof(kv_q8);
        ctx->kt->from_float[ED_Q8_0](qh, acc, rows * dh);
        L->q8_scores_all((const kv_q8 *)acc, rows, nb, (const char *)op->src3 + g * (krow / hkv), krow, slots, t, sc, t);
    } else {
        L->round_f16(qh, rows * dh);
        L->scores(qh, rows, dh, (const uint16_t *)op->src3 + g * dh, hkv * dh, slots, t, kbuf, sc, t);
    }
    for (int64_t i = 0; i < nt; i++) {
        const int64_t a = first_key(op, pos[r0] + i) - lo, b = i + (t - nt) + 1; /* this token's keys: a .. b-1 */
        float *e = sc + i * group * t;
        for (int64_t h = 0; h < group; h++) scale_scores(op, e + h * t + a, b - a, L);
        softmax(e + a, group, t, b - a, !v8, L, ctx->kt);
        for (int64_t h = 0; h < group; h++) {
            memset(e + h * t, 0, sizeof(float) * (size_t)a);
            memset(e + h * t + b, 0, sizeof(float) * (size_t)(t - b));
        }
    }
    memset(acc, 0, sizeof(float) * rows * dh);
    if (v8) {
        const int64_t nb = dh / 32, vrow = hkv * nb * (int64_t)sizeof(kv_q8);
        L->q8_values_all(acc, dh, sc, t, rows, nb, (const char *)op->src4 + g * (vrow / hkv), vrow, slots, t, t);
    } else {
        L->values(acc, sc, t, rows, dh, 0, dh, (const uint16_t *)op->src4 + g * dh, hkv * dh, slots, t, t);
    }
    for (int64_t i = 0; i < nt; i++)
        memcpy((float *)op->dst + ((r0 + i) * n_head + g * group) * dh, acc + i * group * dh, sizeof(float) * group * dh);
    return 1;
}

/* Deep decode: a step of a few tokens has few (token, kv head) pairs (gemma3 has one kv head), each over
 * many keys, so most threads would idle while one attends. Such a step runs in three phases instead, as
 * flash-decoding splits the keys, but without its rescaled partial sums: phase 1 scores (token, key block)
 * chunks, phase 2 takes the softmax of each (token, head) row, phase 3 weighs the values in (token, column
 * block of the cache row) chunks. Every score, softmax row and output column is the per-token path's
 * operations in its order, so the bits are those of attend_token on any thread count. Scores and the
 * keys' slots live in the pool's shared scratch. A chunk covers every kv head of its keys, a run of keys
 * at a time (head after head over the run), so the cache rows (all kv heads of a slot, contiguous) are read
 * whole and close together, where chunks per kv head read 1 / hkv of each row: SmolLM2 (3 kv heads of 64)
 * 2048 keys deep on 2 threads of a Zen 4, ~197 -> ~175 us a layer, tg 77 -> 83 tok/s. Scores take runs of
 * ED_SPLIT_SCORE_RUN keys while the next run's whole rows are prefetched (~9% less time in attention than
 * runs of 64 without). (One thread keeps the pair-by-pair path: through these phases it measured ~10%
 * slower.) A q8_0 K or V takes the same phases with q8_scores_all / q8_values_all over the runs. */
#define ED_SPLIT_MIN_KEYS 256 /* the most keys of a token in the step, at least */
#define ED_SPLIT_MIN_BLOCK 128 /* keys per block, at least */
#define ED_SPLIT_RUN 64 /* keys per run of the values: the run's rows of the chunk's columns stay in L1 */
#define ED_SPLIT_SCORE_RUN 8 /* keys per run of the scores (one group of scores()) */

typedef struct {
    int64_t tmax;           /* the most keys of one token */
    int64_t ld;             /* row stride of the scores and slots: tmax padded off a power of two */
    int64_t kblock, kblocks; /* key blocks of a token: keys [kb * kblock, (kb + 1) * kblock) */
    int64_t dblock, dblocks; /* column blocks of a token's cache row of hkv * dh (multiples of 16; of 32, whole
                              * blocks, over a q8_0 V) */
} split_plan;

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* rows a multiple of 16 elements plus 16: rows 2^k apart would share their L1 sets (and 4K-alias) */
static int64_t padded_row(int64_t tmax) { return cdiv(tmax, 16) * 16 + 16; }

/* the most keys any token of the op attends over (positions clamped to the cache's) */
static int64_t max_keys(const ed_op *op) {
    const int64_t *pos = (const int64_t *)op->src7, cap = op->i1 * op->i2;
    int64_t tmax = 0;
    for (int64_t r = 0; r < op->n; r++) {
        const int64_t p = pos[r] < 0 ? 0 : pos[r] >= cap ? cap - 1 : pos[r], t = p + 1 - first_key(op, p);
        tmax = t > tmax ? t : tmax;
    }
    return tmax;
}

static int split_candidate(const ed_op *op, int nth) {
    return nth > 1 && op->n > 0 && tile_rows(op) == 1 && op->n * op->i0 < 4 * (int64_t)nth;
}

/* whether the op's phase 1 splits over keys for nth threads, and how (0: it attends per pair) */
static int split_plan_of(const ed_op *op, int nth, split_plan *sp) {
    const int64_t hkv = op->i0, dh = op->k, bs = op->i1;
    if (!split_candidate(op, nth) || dh % 8) return 0;
    const int64_t tmax = max_keys(op);
    if (tmax < ED_SPLIT_MIN_KEYS) return 0;
    const int64_t *seq = (const int64_t *)op->src6, *pos = (const int64_t *)op->src7;
    for (int64_t r = 0; r < op->n; r++) { /* every key mapped (the caller checked: else attend per pair) */
        if (slot_of(op, seq[r], pos[r]) < 0) return 0;
        const int32_t *blocks = (const int32_t *)op->src5 + seq[r] * op->i2;
        for (int64_t b = first_key(op, pos[r]) / bs; b <= pos[r] / bs; b++)
            if (blocks[b] < 0 || ((int64_t)blocks[b] + 1) * bs > op->i5) return 0;
    }
    const int64_t want = cdiv(4 * (int64_t)nth, op->n); /* chunks per token for about 4 per thread */
    int64_t kb = want < tmax / ED_SPLIT_MIN_BLOCK ? want : tmax / ED_SPLIT_MIN_BLOCK;
    sp->tmax = tmax;
    sp->ld = padded_row(tmax);
    sp->kblock = cdiv(cdiv(tmax, kb), 8) * 8;
    sp->kblocks = cdiv(tmax, sp->kblock);
    /* values: the fewest column blocks of the row (hkv * dh) that share evenly over the threads
     * (nth / gcd(n, nth) per token), so each thread reads long runs of every value row: blocks of one
     * cache line per row measured 10-30% slower at 2048 keys over 28 layers of 2 kv heads x 128 */
    int64_t a = op->n, b = nth;
    while (b) {
        const int64_t c = a % b;
        a = b, b = c;
    }
    const int64_t width = hkv * dh, unit = kind_of(op, 1) == ED_Q8_0 ? 32 : 16; /* whole q8_0 blocks */
    const int64_t wantd = nth / a, db = wantd < cdiv(width, unit) ? wantd : cdiv(width, unit);
    sp->dblock = cdiv(cdiv(width, db), unit) * unit;
    sp->dblocks = cdiv(width, sp->dblock);
    return 1;
}

size_t ed_attention_shared_scratch(const ed_op *op, int nth) {
    if (!split_candidate(op, nth)) return 0;
    const int64_t tmax = max_keys(op); /* scores (n, n_head, ld) and slots (n, ld) */
    return tmax < ED_SPLIT_MIN_KEYS ? 0 : (size_t)(op->n * padded_row(tmax)) * (sizeof(float) * (size_t)op->m + sizeof(int64_t));
}

static int64_t *split_slots(const ed_op *op, ed_ctx *ctx, const split_plan *sp) {
    return (int64_t *)((float *)ed_shared_scratch(ctx) + op->n * op->m * sp->ld);
}

/* phase 1: chunk = (token r, key block kb): raw scores of every head, scaled and softcapped */
static void split_scores(const ed_op *op, ed_ctx *ctx, const attn_loops *L, const split_plan *sp) {
    const int64_t n_head = op->m, hkv = op->i0, dh = op->k, group = n_head / hkv, nb = dh / 32;
    const int k8 = kind_of(op, 0) == ED_Q8_0;
    const int64_t r = ctx->chunk / sp->kblocks, kb = ctx->chunk % sp->kblocks;
    const int64_t *seq = (const int64_t *)op->src6, *pos = (const int64_t *)op->src7;
    const int64_t lo = first_key(op, pos[r]), t = pos[r] + 1 - lo, j0 = kb * sp->kblock;
    const int64_t nk = t - j0 < sp->kblock ? t - j0 : sp->kblock;
    if (nk <= 0) return;
    /* scratch: this block's slots (nk), q (n_head, dh) as f16-rounded floats or q8_0 blocks, 8 converted
     * keys (8, dh) */
    int64_t *slots = ed_thread_scratch(ctx, sizeof(int64_t) * nk + sizeof(float) * (n_head * dh + 8 * dh));
    if (!slots) return;
    float *qh = (float *)(slots + nk), *kbuf = qh + n_head * dh;
    if (!key_slots(op, (const int32_t *)op->src5 + seq[r] * op->i2, lo + j0, nk, slots)) return;
    memcpy(split_slots(op, ctx, sp) + r * sp->ld + j0, slots, sizeof(int64_t) * nk);
    const float *q = (const float *)op->src0 + r * n_head * dh;
    if (k8) { /* the blocks of q (34 bytes per 32 floats) fit where its floats would */
        ctx->kt->from_float[ED_Q8_0](q, qh, n_head * dh);
    } else {
        memcpy(qh, q, sizeof(float) * n_head * dh);
        L->round_f16(qh, n_head * dh);
    }
    float *sc = (float *)ed_shared_scratch(ctx) + r * n_head * sp->ld + j0;
    const char *keys = (const char *)op->src3;
    const int64_t head_bytes = k8 ? nb * (int64_t)sizeof(kv_q8) : dh * 2, row_bytes = hkv * head_bytes;
    for (int64_t u = 0; u < nk; u += ED_SPLIT_SCORE_RUN) {
        const int64_t nu = nk - u < ED_SPLIT_SCORE_RUN ? nk - u : ED_SPLIT_SCORE_RUN;
        for (int64_t j = u + ED_SPLIT_SCORE_RUN; j < u + 2 * ED_SPLIT_SCORE_RUN && j < nk; j++) /* next run */
            for (int64_t b = 0; b < row_bytes; b += 64) __builtin_prefetch(keys + slots[j] * row_bytes + b);
        for (int64_t g = 0; g < hkv; g++) {
            float *scg = sc + g * group * sp->ld + u;
            if (k8)
                L->q8_scores_all((const kv_q8 *)qh + g * group * nb, group, nb, keys + g * head_bytes, row_bytes,
                                 slots + u, nu, scg, sp->ld);
            else
                L->scores(qh + g * group * dh, group, dh, (const uint16_t *)op->src3 + g * dh, hkv * dh, slots + u, nu,
                          kbuf, scg, sp->ld);
        }
    }
    for (int64_t h = 0; h < n_head; h++) scale_scores(op, sc + h * sp->ld, nk, L);
}

/* phase 2: chunk = a run of up to split_rows() (token, head) rows of one token */
static int64_t split_rows(const ed_op *op, int nth) {
    const int64_t r = op->m / (2 * (int64_t)nth); /* about 2 chunks per thread for each token */
    return r < 1 ? 1 : r > 4 ? 4 : r;
}

static void split_softmax(const ed_op *op, ed_ctx *ctx, const attn_loops *L, const split_plan *sp) {
    const int64_t rr = split_rows(op, ctx->nth), per = cdiv(op->m, rr), r = ctx->chunk / per, h0 = ctx->chunk % per * rr;
    const int64_t p = ((const int64_t *)op->src7)[r], nr = op->m - h0 < rr ? op->m - h0 : rr;
    float *sc = (float *)ed_shared_scratch(ctx) + (r * op->m + h0) * sp->ld;
    softmax(sc, nr, sp->ld, p + 1 - first_key(op, p), kind_of(op, 1) != ED_Q8_0, L, ctx->kt);
}

/* phase 3: chunk = (token r, column block [c0, c1) of the cache row): for each kv head g the block
 * meets, out[d0, d1) of g's heads, a run of keys at a time over all of them (values add into out in key
 * order, so runs give the bits of one call) */
static void split_values(const ed_op *op, ed_ctx *ctx, const attn_loops *L, const split_plan *sp) {
    const int64_t n_head = op->m, hkv = op->i0, dh = op->k, group = n_head / hkv;
    const int64_t r = ctx->chunk / sp->dblocks, p = ((const int64_t *)op->src7)[r], t = p + 1 - first_key(op, p);
    const int64_t c0 = ctx->chunk % sp->dblocks * sp->dblock, c1 = c0 + sp->dblock < hkv * dh ? c0 + sp->dblock : hkv * dh;
    const int64_t g0 = c0 / dh, g1 = (c1 - 1) / dh;
    const int v8 = kind_of(op, 1) == ED_Q8_0;
    for (int64_t g = g0; g <= g1; g++) {
        const int64_t d0 = g == g0 ? c0 - g * dh : 0, d1 = g == g1 ? c1 - g * dh : dh;
        float *out = (float *)op->dst + (r * n_head + g * group) * dh;
        for (int64_t h = 0; h < group; h++) memset(out + h * dh + d0, 0, sizeof(float) * (size_t)(d1 - d0));
    }
    const float *w = (const float *)ed_shared_scratch(ctx) + r * n_head * sp->ld;
    const int64_t *slots = split_slots(op, ctx, sp) + r * sp->ld;
    for (int64_t u = 0; u < t; u += ED_SPLIT_RUN) {
        const int64_t nu = t - u < ED_SPLIT_RUN ? t - u : ED_SPLIT_RUN;
        for (int64_t g = g0; g <= g1; g++) {
            const int64_t d0 = g == g0 ? c0 - g * dh : 0, d1 = g == g1 ? c1 - g * dh : dh;
            float *out = (float *)op->dst + (r * n_head + g * group) * dh;
            if (v8)
                L->q8_values_all(out + d0, dh, w + g * group * sp->ld + u, sp->ld, group, (d1 - d0) / 32,
                                 (const char *)op->src4 + (g * dh + d0) / 32 * (int64_t)sizeof(kv_q8),
                                 hkv * dh / 32 * (int64_t)sizeof(kv_q8), slots + u, nu, t - u);
            else
                L->values(out, w + g * group * sp->ld + u, sp->ld, group, dh, d0, d1, (const uint16_t *)op->src4 + g * dh,
                          hkv * dh, slots + u, nu, t - u);
        }
    }
}

int64_t ed_attention_chunks(const ed_op *op, int phase, int nth, const ed_kernel_table *kt) {
    (void)kt;                                          /* the split and the tiles take every level */
    if (phase == 0) return ed_row_chunks(op->n, nth); /* stores */
    split_plan sp;
    const int split = split_plan_of(op, nth, &sp);
    if (phase == 2) return split ? op->n * cdiv(op->m, split_rows(op, nth)) : 0;
    if (phase == 3) return split ? op->n * sp.dblocks : 0;
    if (split) return op->n * sp.kblocks;
    const int64_t tr = tile_rows(op);
    return (op->n + tr - 1) / tr * op->i0; /* (tile of tokens, kv head) pairs */
}

static void attend_token(const ed_op *op, ed_ctx *ctx, const attn_loops *L, int64_t r, int64_t g);

void ed_attention(const ed_op *op, int phase, ed_ctx *ctx) {
    if (phase == 0) {
        store(op, ctx);
        return;
    }
    const attn_loops *L = loops(ctx->kt);
    split_plan sp;
    if (split_plan_of(op, ctx->nth, &sp)) {
        if (phase == 1) split_scores(op, ctx, L, &sp);
        else if (phase == 2) split_softmax(op, ctx, L, &sp);
        else split_values(op, ctx, L, &sp);
        return;
    }
    const int64_t hkv = op->i0, tr = tile_rows(op), r0 = ctx->chunk / hkv * tr, g = ctx->chunk % hkv;
    const int64_t nt = op->n - r0 < tr ? op->n - r0 : tr;
    if (nt > 1 && attend_tile(op, ctx, L, r0, nt, g)) return;
    for (int64_t r = r0; r < r0 + nt; r++) attend_token(op, ctx, L, r, g);
}

/* one (token r, kv head g) pair */
static void attend_token(const ed_op *op, ed_ctx *ctx, const attn_loops *L, int64_t r, int64_t g) {
    const int64_t n_head = op->m, hkv = op->i0, dh = op->k, group = n_head / hkv, bs = op->i1;
    const int64_t *seq = (const int64_t *)op->src6, *pos = (const int64_t *)op->src7;
    const int32_t *table = (const int32_t *)op->src5;
    const uint16_t *kc = (const uint16_t *)op->src3, *vc = (const uint16_t *)op->src4;
    const float scale = op->f0, softcap = op->f1;
    {
        const int64_t s = seq[r], p = pos[r];
        float *out = (float *)op->dst + (r * n_head + g * group) * dh;
        const int64_t lo = first_key(op, p), t = p + 1 - lo;
        memset(out, 0, sizeof(float) * group * dh);
        if (t <= 0 || slot_of(op, s, p) < 0) return; /* the caller checked: not expected */
        if (dh % 8 == 0 && attend_keys(op, ctx, L, r, g, lo, t, out)) return;
        /* an unmapped key (the caller checked: not expected) leaves a q8_0 cache's output zero; over f16 it
         * weighs 0, key by key. Scratch: the keys' slots (t), q (group, dh), one key/value row (dh), scores
         * (group, t), one step's scores (group); the output accumulates in out */
        if (kind_of(op, 0) == ED_Q8_0 || kind_of(op, 1) == ED_Q8_0) return;
        int64_t *slots = ed_thread_scratch(ctx, sizeof(int64_t) * t + sizeof(float) * (group * dh + dh + group * t + group));
        if (!slots) return;
        float *qh = (float *)(slots + t), *row = qh + group * dh, *sc = row + dh, *s1 = sc + group * t;
        memcpy(qh, (const float *)op->src0 + (r * n_head + g * group) * dh, sizeof(float) * group * dh);
        L->round_f16(qh, group * dh);
        const int32_t *blocks = table + s * op->i2;
        for (int pass = 0; pass < 2; pass++) { /* scores, softmax, then the weighted values */
            /* positions lo..p, a run within one block at a time: slot = blocks[b] * bs + offset */
            for (int64_t j = 0; j < t;) {
                const int64_t ps = lo + j, b = ps / bs, run = bs - ps % bs < t - j ? bs - ps % bs : t - j;
                const int64_t base = blocks[b] >= 0 && ((int64_t)blocks[b] + 1) * bs <= op->i5 ? blocks[b] * bs : -1;
                for (int64_t u = 0; u < run; u++, j++) {
                    if (base < 0) { /* unmapped (the caller checked: not expected): weight 0 */
                        for (int64_t h = 0; h < group && pass == 0; h++) sc[h * t + j] = -INFINITY;
                        continue;
                    }
                    const int64_t slot = base + ps % bs + u;
                    if (pass == 0) {
                        L->qk(qh, group, dh, kc + (slot * hkv + g) * dh, row, s1);
                        for (int64_t h = 0; h < group; h++) {
                            float x = s1[h] * scale;
                            if (softcap > 0) x = ed_softcap(x, softcap);
                            sc[h * t + j] = x;
                        }
                    } else {
                        L->pv(out, sc + j, t, group, dh, vc + (slot * hkv + g) * dh, row);
                    }
                }
            }
            if (pass == 0) softmax(sc, group, t, t, 1, L, ctx->kt);
        }
    }
}

int ed_step_check(const int64_t *tokens, int64_t n_vocab, const int32_t *block_table, int64_t n_seqs,
                  int64_t max_blocks, int64_t block_size, int64_t n_ctx, const int64_t *seq_ids,
                  const int64_t *positions, int64_t n) {
    for (int64_t i = 0; i < n && n_vocab >= 0; i++)
        if (tokens[i] < 0 || tokens[i] >= n_vocab) return 1;
    for (int64_t i = 0; i < n; i++) {
        const int64_t s = seq_ids[i], p = positions[i];
        if (s < 0 || s >= n_seqs || p < 0 || p >= n_ctx || p / block_size >= max_blocks) return 2;
        for (int64_t b = 0; b <= p / block_size; b++)
            if (block_table[s * max_blocks + b] < 0) return 2;
    }
    return 0;
}
