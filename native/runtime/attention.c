/* Attention over the paged f16 KV cache (the contract of edgellm/backends/reference.py KVCache):
 * position p of sequence s lives at slot block_table[s, p / block_size] * block_size + p % block_size.
 *
 * Phase 0 stores the k, v rows of all n tokens (f32 -> f16, nearest even). Phase 1 hands out (token,
 * kv head) pairs; each attends causally over positions max(0, p - window + 1) .. p of its sequence, for
 * every query head of the group at once (a key row is converted from f16 once per group). The float
 * operations are the reference backend's: q rounded to f16, q.k * scale, optional softcap
 * c * tanh(s / c), softmax in f32, weights rounded to f16 before their product with the values. The q.k
 * sums run over 8 lanes, combined in a fixed order: the result does not depend on the thread count.
 */
#include <math.h>
#include <string.h>

#include "f16.h"
#include "runtime.h"

static int64_t slot_of(const ed_op *op, int64_t seq, int64_t pos) {
    const int64_t bs = op->i1, n_blocks = op->i2, n_seqs = op->i3;
    if (seq < 0 || seq >= n_seqs || pos < 0 || pos / bs >= n_blocks) return -1;
    const int32_t blk = ((const int32_t *)op->src5)[seq * n_blocks + pos / bs];
    if (blk < 0) return -1;
    const int64_t slot = (int64_t)blk * bs + pos % bs;
    return slot < op->i5 ? slot : -1;
}

static float dot8(const float *a, const float *b, int64_t n) {
    float acc[8] = {0};
    int64_t d = 0;
    for (; d + 8 <= n; d += 8)
        for (int l = 0; l < 8; l++) acc[l] += a[d + l] * b[d + l];
    for (int l = 0; d < n; d++, l++) acc[l] += a[d] * b[d];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

static void store(const ed_op *op, ed_ctx *ctx) {
    const int64_t hkv = op->i0, dh = op->k, row = hkv * dh;
    const int64_t *seq = (const int64_t *)op->src6, *pos = (const int64_t *)op->src7;
    int64_t r0, r1;
    ed_split(op->n, ctx->ith, ctx->nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        const int64_t slot = slot_of(op, seq[r], pos[r]);
        if (slot < 0) continue;
        const float *k = (const float *)op->src1 + r * row, *v = (const float *)op->src2 + r * row;
        uint16_t *kc = (uint16_t *)op->src3 + slot * row, *vc = (uint16_t *)op->src4 + slot * row;
        for (int64_t j = 0; j < row; j++) {
            kc[j] = ed_f32_to_f16(k[j]);
            vc[j] = ed_f32_to_f16(v[j]);
        }
    }
}

void ed_attention(const ed_op *op, int phase, ed_ctx *ctx) {
    if (phase == 0) {
        store(op, ctx);
        return;
    }
    const int64_t n_head = op->m, hkv = op->i0, dh = op->k, group = n_head / hkv, window = op->i4;
    const int64_t *seq = (const int64_t *)op->src6, *pos = (const int64_t *)op->src7;
    const float scale = op->f0, softcap = op->f1;
    for (int64_t item = ed_next_chunk(ctx); item < op->n * hkv; item = ed_next_chunk(ctx)) {
        const int64_t r = item / hkv, g = item % hkv, s = seq[r], p = pos[r];
        float *out = (float *)op->dst + (r * n_head + g * group) * dh;
        const int64_t lo = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
        const int64_t t = p + 1 - lo;
        if (t <= 0 || slot_of(op, s, p) < 0) {
            memset(out, 0, sizeof(float) * group * dh);
            continue;
        }
        /* scratch: q (group, dh), key/value row (dh), scores (group, t), acc = out */
        float *qh = ed_thread_scratch(ctx, sizeof(float) * (group * dh + dh + group * t));
        if (!qh) continue;
        float *kv = qh + group * dh, *sc = kv + dh;
        const float *q = (const float *)op->src0 + (r * n_head + g * group) * dh;
        for (int64_t j = 0; j < group * dh; j++) qh[j] = ed_f16_round(q[j]);
        const uint16_t *kc = (const uint16_t *)op->src3, *vc = (const uint16_t *)op->src4;
        for (int64_t j = 0; j < t; j++) {
            const int64_t slot = slot_of(op, s, lo + j);
            if (slot < 0) {
                for (int64_t h = 0; h < group; h++) sc[h * t + j] = -INFINITY;
                continue;
            }
            const uint16_t *krow = kc + (slot * hkv + g) * dh;
            for (int64_t d = 0; d < dh; d++) kv[d] = ed_rt_f16_lut[krow[d]];
            for (int64_t h = 0; h < group; h++) {
                float x = dot8(qh + h * dh, kv, dh) * scale;
                if (softcap > 0) x = softcap * tanhf(x / softcap);
                sc[h * t + j] = x;
            }
        }
        for (int64_t h = 0; h < group; h++) {
            float *e = sc + h * t, mx = -INFINITY, total = 0.0f;
            for (int64_t j = 0; j < t; j++) mx = e[j] > mx ? e[j] : mx;
            for (int64_t j = 0; j < t; j++) {
                e[j] = expf(e[j] - mx);
                total += e[j];
            }
            for (int64_t j = 0; j < t; j++) e[j] = ed_f16_round(e[j] / total);
        }
        memset(out, 0, sizeof(float) * group * dh);
        for (int64_t j = 0; j < t; j++) {
            const int64_t slot = slot_of(op, s, lo + j);
            if (slot < 0) continue;
            const uint16_t *vrow = vc + (slot * hkv + g) * dh;
            for (int64_t d = 0; d < dh; d++) kv[d] = ed_rt_f16_lut[vrow[d]];
            for (int64_t h = 0; h < group; h++) {
                const float w = sc[h * t + j];
                float *o = out + h * dh;
                for (int64_t d = 0; d < dh; d++) o[d] += w * kv[d];
            }
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
