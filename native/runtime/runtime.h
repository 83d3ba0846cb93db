/* Internals shared by the runtime's translation units: the pool's per-run state and the op kernels. */
#ifndef ED_RUNTIME_INTERNAL_H
#define ED_RUNTIME_INTERNAL_H

#include <math.h>
#include <stdatomic.h>
#include <stdint.h>

#include "../ed_kernels.h"
#include "ed_runtime.h"

/* What an op kernel sees: its thread (for its scratch), the pool, the kernels, and the chunk of the op's
 * phase to run. A phase's work is cut into chunks (ed_op_chunks) that any thread may claim; each chunk
 * writes outputs no other chunk writes, from inputs no chunk of that phase writes. */
typedef struct {
    int ith, nth;
    ed_pool *pool;
    const ed_kernel_table *kt;
    int64_t chunk, n_chunks;
} ed_ctx;

/* Phases of an op: a phase starts once the phases it reads from are complete. */
int ed_op_phases(const ed_op *op);
/* Chunks of work in a phase of an op when nth threads share it (0: nothing to do). */
int64_t ed_op_chunks(const ed_op *op, int phase, int nth, const ed_kernel_table *kt);
/* Bytes of the shared scratch the op needs with nth threads (quantized activations, deep decode's
 * attention scores), 0 if none. */
size_t ed_op_shared_scratch(const ed_op *op, int nth, const ed_kernel_table *kt);
/* Whether the op's fields are usable with this kernel table (type has a kernel, sizes divide). */
int ed_op_valid(const ed_op *op, const ed_kernel_table *kt);
/* Run chunk ctx->chunk of ctx->n_chunks of a phase of an op. */
void ed_op_run(const ed_op *op, int phase, ed_ctx *ctx);

void *ed_shared_scratch(ed_ctx *ctx);
/* this thread's own scratch of at least `bytes` (grown on demand; valid until the thread's next call) */
void *ed_thread_scratch(ed_ctx *ctx, size_t bytes);

/* kernels of each op family */
void ed_matmul(const ed_op *op, int phase, ed_ctx *ctx);
size_t ed_matmul_shared_scratch(const ed_op *op, const ed_kernel_table *kt);
void ed_attention(const ed_op *op, int phase, ed_ctx *ctx);
/* whether an ATTENTION op's cache kinds (op->type) are known and fit its head size */
int ed_attention_valid(const ed_op *op);
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
/* a matmul's F16 / BF16 activation row as float32, at the table's level (the values ed_dequantize_row gives) */
void ed_act_row_to_f32(const ed_kernel_table *kt, int type, const void *src, float *dst, int64_t n);
int ed_dequantize_supported(int type);

/* part `part` of `parts` of rows 0..rows-1, contiguous and nearly equal: [*r0, *r1) */
/* c * tanh(x / c): tanh in double, rounded once to float, as the reference backend's tanh32. libm's tanhf
 * is an ulp off on some inputs and differs between libcs (glibc on aarch64 and x86-64 disagree), and in
 * attention an ulp of a weight can move its f16 rounding by a whole f16 ulp (~1e-4 in the output). */
static inline float ed_softcap(float x, float c) { return c * (float)tanh((double)(x / c)); }

static inline void ed_split(int64_t rows, int64_t part, int64_t parts, int64_t *r0, int64_t *r1) {
    int64_t per = (rows + parts - 1) / parts;
    *r0 = per * part < rows ? per * part : rows;
    *r1 = *r0 + per < rows ? *r0 + per : rows;
}

/* chunks for `rows` independent rows shared by nth threads: a few per thread, at most one per row */
static inline int64_t ed_row_chunks(int64_t rows, int nth) {
    const int64_t want = nth == 1 ? 1 : 4 * (int64_t)nth;
    return rows < want ? rows : want;
}

#endif
