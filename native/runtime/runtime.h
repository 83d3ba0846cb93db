/* Internals shared by the runtime's translation units: the pool's per-run state and the op kernels. */
#ifndef ED_RUNTIME_INTERNAL_H
#define ED_RUNTIME_INTERNAL_H

#include <stdatomic.h>
#include <stdint.h>

#include "../ed_kernels.h"
#include "ed_runtime.h"

/* What an op kernel sees: its thread, the pool, the kernels, and which phase of the plan it runs (each
 * phase has its own counter for handing out chunks of work, zeroed before the plan runs). */
typedef struct {
    int ith, nth;
    ed_pool *pool;
    const ed_kernel_table *kt;
    int step; /* phases run before this one in the plan: picks the work counter */
} ed_ctx;

/* Phases of an op: a barrier separates consecutive phases (and consecutive ops). */
int ed_op_phases(const ed_op *op);
/* Bytes of the shared scratch the op needs (quantized activations), 0 if none. */
size_t ed_op_shared_scratch(const ed_op *op, const ed_kernel_table *kt);
/* Whether the op's fields are usable with this kernel table (type has a kernel, sizes divide). */
int ed_op_valid(const ed_op *op, const ed_kernel_table *kt);
void ed_op_run(const ed_op *op, int phase, ed_ctx *ctx);

/* chunks of work: each call returns the next chunk index (0, 1, ...) of the current phase */
int64_t ed_next_chunk(ed_ctx *ctx);
void *ed_shared_scratch(ed_ctx *ctx);
/* this thread's own scratch of at least `bytes` (grown on demand; valid until the thread's next call) */
void *ed_thread_scratch(ed_ctx *ctx, size_t bytes);

/* kernels of each op family */
void ed_matmul(const ed_op *op, int phase, ed_ctx *ctx);
void ed_attention(const ed_op *op, int phase, ed_ctx *ctx);
void ed_get_rows(const ed_op *op, ed_ctx *ctx);
void ed_rms_norm(const ed_op *op, ed_ctx *ctx);
void ed_rope(const ed_op *op, ed_ctx *ctx);
void ed_elementwise(const ed_op *op, ed_ctx *ctx);
void ed_copy(const ed_op *op, ed_ctx *ctx);

/* y = silu(a) * b over n floats, with the runtime's exp (vmath.c) */
void ed_silu_mul_span(const float *a, const float *b, float *y, int64_t n, const ed_kernel_table *kt);
/* x = exp(x) over n floats, in place (vmath.c) */
void ed_exp_span(float *x, int64_t n, const ed_kernel_table *kt);

/* dequantize one row of n elements of a ggml type to float32; 0 if the type is unsupported */
int ed_dequantize_row(int type, const void *src, float *dst, int64_t n);
int ed_dequantize_supported(int type);

/* rows [*r0, *r1) of `rows` for thread ith of nth, in contiguous, nearly equal parts */
static inline void ed_split(int64_t rows, int ith, int nth, int64_t *r0, int64_t *r1) {
    int64_t per = (rows + nth - 1) / nth;
    *r0 = per * ith < rows ? per * ith : rows;
    *r1 = *r0 + per < rows ? *r0 + per : rows;
}

#endif
