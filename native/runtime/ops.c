/* Op dispatch, validation, and the small ops: RMSNorm, RoPE, the GLUs, add/scale/softcap, copy.
 * Float operations are the reference backend's (edgellm/backends/reference.py) in the order of
 * edgellm/backends/numba_kernels/ops.py, so they agree with both to the last bit except where libm's
 * expf/tanhf differ from numpy's by an ulp. */
#include <math.h>
#include <string.h>

#include "f16.h"
#include "runtime.h"

#define P(x) ((const float *)(x))
#define SMALL_ELEMS 16384 /* below this an elementwise op is one chunk: spreading it costs more than it saves */

int64_t ed_matmul_chunks(const ed_op *op, int phase, int nth, const ed_kernel_table *kt);
int64_t ed_attention_chunks(const ed_op *op, int phase, int nth, const ed_kernel_table *kt);
size_t ed_attention_shared_scratch(const ed_op *op, int nth);

int ed_op_phases(const ed_op *op) {
    switch (op->code) {
    case ED_OP_MATMUL: return op->i1 ? 1 : 2; /* quantize x, then dot products */
    case ED_OP_ATTENTION: return 4;           /* store k, v, then attend (deep decode: scores, softmax, values) */
    default: return 1;
    }
}

int64_t ed_op_chunks(const ed_op *op, int phase, int nth, const ed_kernel_table *kt) {
    switch (op->code) {
    case ED_OP_MATMUL: return op->n ? ed_matmul_chunks(op, phase, nth, kt) : 0;
    case ED_OP_ATTENTION: return ed_attention_chunks(op, phase, nth, kt);
    case ED_OP_GET_ROWS: case ED_OP_RMS_NORM: case ED_OP_ROPE: case ED_OP_COPY: return ed_row_chunks(op->n, nth);
    case ED_OP_SILU_MUL: case ED_OP_GELU_MUL: case ED_OP_ADD: case ED_OP_SCALE: case ED_OP_SOFTCAP: {
        const int64_t total = op->n * op->k;
        if (total == 0) return 0;
        return total < SMALL_ELEMS || nth == 1 ? 1 : 4 * (int64_t)nth;
    }
    default: return 0;
    }
}

size_t ed_op_shared_scratch(const ed_op *op, int nth, const ed_kernel_table *kt) {
    if (op->code == ED_OP_ATTENTION) return ed_attention_shared_scratch(op, nth);
    return op->code == ED_OP_MATMUL ? ed_matmul_shared_scratch(op, kt) : 0;
}

int ed_op_valid(const ed_op *op, const ed_kernel_table *kt) {
    if (op->n < 0 || op->m < 0 || op->k < 0) return 0;
    switch (op->code) {
    case ED_OP_MATMUL: {
        if (op->type < 0 || op->type >= ED_TYPE_COUNT || !kt->types[op->type].vec_dot) return 0;
        const ed_type_kernels *tk = &kt->types[op->type];
        if (!kt->from_float[tk->vec_dot_type] && tk->vec_dot_type != ED_F32) return 0;
        int ab = kt->act_block_elems[tk->vec_dot_type];
        if ((op->flags & ED_FLAG_X16) && !tk->x16_gemm) return 0;
        return op->k % tk->block_elems == 0 && ab > 0 && op->k % ab == 0 &&
               op->i0 == op->k / tk->block_elems * tk->block_bytes;
    }
    case ED_OP_GET_ROWS: return ed_dequantize_supported(op->type);
    case ED_OP_ATTENTION: return op->i0 > 0 && op->m % op->i0 == 0 && op->i1 > 0 && ed_attention_valid(op);
    case ED_OP_ROPE: return op->i0 <= op->k && op->i0 % 2 == 0;
    case ED_OP_RMS_NORM: case ED_OP_SILU_MUL: case ED_OP_GELU_MUL: case ED_OP_ADD: case ED_OP_SCALE:
    case ED_OP_SOFTCAP: case ED_OP_NONE: return 1;
    case ED_OP_COPY: return op->i1 + op->k <= op->i0;
    default: return 0;
    }
}

void ed_op_run(const ed_op *op, int phase, ed_ctx *ctx) {
    switch (op->code) {
    case ED_OP_MATMUL: ed_matmul(op, phase, ctx); break;
    case ED_OP_ATTENTION: ed_attention(op, phase, ctx); break;
    case ED_OP_GET_ROWS: ed_get_rows(op, ctx); break;
    case ED_OP_RMS_NORM: ed_rms_norm(op, ctx); break;
    case ED_OP_ROPE: ed_rope(op, ctx); break;
    case ED_OP_COPY: ed_copy(op, ctx); break;
    case ED_OP_SILU_MUL: case ED_OP_GELU_MUL: case ED_OP_ADD: case ED_OP_SCALE: case ED_OP_SOFTCAP:
        ed_elementwise(op, ctx);
        break;
    default: break;
    }
}

void ed_get_rows(const ed_op *op, ed_ctx *ctx) {
    int64_t r0, r1;
    ed_split(op->n, ctx->chunk, ctx->n_chunks, &r0, &r1);
    const int64_t *ids = (const int64_t *)op->src1;
    for (int64_t r = r0; r < r1; r++) {
        float *y = (float *)op->dst + r * op->k;
        int64_t id = ids[r];
        if (id < 0 || id >= op->i1) memset(y, 0, sizeof(float) * op->k);
        else ed_dequantize_row(op->type, (const uint8_t *)op->src0 + id * op->i0, y, op->k);
    }
}

/* ggml_compute_forward_rms_norm_f32: sum of squares in double, scale = 1/sqrtf(mean + eps) */
void ed_rms_norm(const ed_op *op, ed_ctx *ctx) {
    int64_t r0, r1, d = op->k;
    ed_split(op->n, ctx->chunk, ctx->n_chunks, &r0, &r1);
    const float *w = P(op->src1);
    for (int64_t r = r0; r < r1; r++) {
        const float *x = P(op->src0) + r * d;
        float *y = (float *)op->dst + r * d;
        double s = 0.0;
        for (int64_t j = 0; j < d; j++) s += (double)x[j] * (double)x[j];
        const float scale = 1.0f / sqrtf((float)(s / (double)d + (double)op->f0));
        if (w) for (int64_t j = 0; j < d; j++) y[j] = (x[j] * scale) * w[j];
        else for (int64_t j = 0; j < d; j++) y[j] = x[j] * scale;
    }
}

/* rotate pairs (2i, 2i+1) (normal) or (i, i + n_dims/2) (neox) by the cached cos/sin of the position */
void ed_rope(const ed_op *op, ed_ctx *ctx) {
    int64_t r0, r1, heads = op->m, dh = op->k, half = op->i0 / 2;
    ed_split(op->n, ctx->chunk, ctx->n_chunks, &r0, &r1);
    const int64_t *pos = (const int64_t *)op->src1;
    for (int64_t r = r0; r < r1; r++) {
        const float *x = P(op->src0) + r * heads * dh;
        float *y = (float *)op->dst + r * heads * dh;
        if (x != y) memcpy(y, x, sizeof(float) * heads * dh);
        if (pos[r] < 0 || pos[r] >= op->i2) continue;
        const float *cs = P(op->src2) + pos[r] * half, *sn = P(op->src3) + pos[r] * half;
        for (int64_t h = 0; h < heads; h++) {
            const float *xh = x + h * dh;
            float *yh = y + h * dh;
            for (int64_t i = 0; i < half; i++) {
                const float c = cs[i], s = sn[i];
                const int64_t i0 = op->i1 ? i : 2 * i, i1 = op->i1 ? i + half : 2 * i + 1;
                const float a = xh[i0], b = xh[i1];
                yh[i0] = a * c - b * s;
                yh[i1] = a * s + b * c;
            }
        }
    }
}

void ed_elementwise(const ed_op *op, ed_ctx *ctx) {
    int64_t e0, e1; /* chunks of whole 64-element runs, so every chunk but the last is a multiple of 8 */
    ed_split((op->n * op->k + 63) / 64, ctx->chunk, ctx->n_chunks, &e0, &e1);
    e0 *= 64;
    e1 = e1 * 64 < op->n * op->k ? e1 * 64 : op->n * op->k;
    const float *a = P(op->src0), *b = P(op->src1);
    float *y = (float *)op->dst;
    const float f = op->f0;
    switch (op->code) {
    case ED_OP_SILU_MUL:
        ed_silu_mul_span(a + e0, b + e0, y + e0, e1 - e0, ctx->kt);
        break;
    case ED_OP_GELU_MUL: {
        /* ggml_vec_geglu_f32 under GGML_GELU_FP16: 0 below -10, identity above 10, else the f16 table */
        const float *table = P(op->src2);
        for (int64_t i = e0; i < e1; i++) {
            const float g = a[i];
            const float v = g <= -10.0f ? 0.0f : g >= 10.0f ? g : table[ed_f32_to_f16(g)];
            y[i] = v * b[i];
        }
        break;
    }
    case ED_OP_ADD:
        if (op->i0) {
            for (int64_t i = e0; i < e1; i++) y[i] = a[i] + b[i % op->k];
        } else {
            for (int64_t i = e0; i < e1; i++) y[i] = a[i] + b[i];
        }
        break;
    case ED_OP_SCALE:
        for (int64_t i = e0; i < e1; i++) y[i] = a[i] * f;
        break;
    case ED_OP_SOFTCAP:
        for (int64_t i = e0; i < e1; i++) y[i] = ed_softcap(a[i], f);
        break;
    default: break;
    }
}

void ed_copy(const ed_op *op, ed_ctx *ctx) {
    int64_t r0, r1;
    ed_split(op->n, ctx->chunk, ctx->n_chunks, &r0, &r1);
    for (int64_t r = r0; r < r1; r++)
        memcpy((float *)op->dst + r * op->k, P(op->src0) + r * op->i0 + op->i1, sizeof(float) * op->k);
}
