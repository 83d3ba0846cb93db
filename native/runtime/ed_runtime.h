/* edgellm native runtime: a persistent thread pool and a plan executor running arrays of op records
 * (matmul, norms, RoPE, attention over the paged f16 KV cache, GLUs, elementwise ops) in one call.
 *
 * This header is also the cffi cdef of the extension (native/build_native.py drops the preprocessor
 * lines), so it holds only plain declarations: no macros, no inline code.
 *
 * Determinism: every op splits its work over threads by whole output rows / (row, head) pairs and never
 * splits a reduction, so results are bit-identical for any thread count and between a plan and the same
 * ops run one by one.
 */
#ifndef ED_RUNTIME_H
#define ED_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

/* Op codes. Pointers are addresses (uintptr_t) so Python fills them with plain ints. Field use per op:
 *   MATMUL     src0 weight rows (M rows of i0 bytes, ggml type `type`), src1 x (n, k) f32, dst (n, m) f32;
 *              i1 = 1: x was quantized by the matmul just before (same x, same activation type): reuse it.
 *   GET_ROWS   src0 table (i1 rows of i0 bytes, type `type`), src1 ids (n,) int64, dst (n, k) f32;
 *              an id outside 0..i1-1 yields a row of zeros.
 *   RMS_NORM   src0 x (n, k), src1 weight (k,) or 0, dst (n, k); f0 = eps.
 *   ROPE       src0 x (n, m heads, k), src1 positions (n,) int64, src2 cos, src3 sin (i2 rows of i0/2) f32,
 *              dst; i0 = n_dims, i1 = neox; a position outside the table copies x unrotated.
 *   ATTENTION  src0 q (n, m, k), src1 k (n, i0, k), src2 v (n, i0, k) f32, src3 k cache, src4 v cache
 *              (slots, i0, k) f16 of this layer, src5 block_table (i3 seqs, i2 blocks) int32, src6 seq_ids,
 *              src7 positions (n,) int64, dst (n, m, k); i1 = block_size, i4 = window (0: none),
 *              i5 = slots; f0 = scale, f1 = softcap (0: none). Rows whose slot is unmapped write zeros.
 *              type = K kind | V kind << 8, a kind being ED_F16 (1; 0 reads as f16) or ED_Q8_0 (8: the
 *              cache holds (slots, i0, k / 32) block_q8_0, and k is a multiple of 32).
 *   SILU_MUL   src0 gate, src1 up, dst: n*k f32.   GELU_MUL  the same, src2 = ggml's GELU table (65536 f32)
 *   ADD        src0 a (n, k), src1 b (n, k), or (k,) broadcast over rows when i0 = 1, dst (n, k).
 *   SCALE      dst = src0 * f0 (n*k).              SOFTCAP   dst = f0 * tanh(src0 / f0) (n*k).
 *   COPY       dst (n, k) = columns i1..i1+k of src0 rows of i0 floats.
 */
enum {
    ED_OP_NONE = 0, ED_OP_MATMUL = 1, ED_OP_GET_ROWS = 2, ED_OP_RMS_NORM = 3, ED_OP_ROPE = 4,
    ED_OP_ATTENTION = 5, ED_OP_SILU_MUL = 6, ED_OP_GELU_MUL = 7, ED_OP_ADD = 8, ED_OP_SCALE = 9,
    ED_OP_SOFTCAP = 10, ED_OP_COPY = 11, ED_OP_COUNT = 12
};

/* op flags: ED_FLAG_NO_BARRIER: the op reads nothing the op before it writes, and writes nothing it
 * touches (consecutive matmuls of one input): threads start on it before that op is complete.
 * ED_FLAG_X16: a MATMUL's src0 is its weight repacked by ed_repack_x16 (ed_kernels.h: the x16 layout). */
enum { ED_FLAG_NO_BARRIER = 1, ED_FLAG_X16 = 2 };

typedef struct {
    int32_t code;
    int32_t type;
    int32_t flags;
    int32_t reserved;
    int64_t n, m, k;
    int64_t i0, i1, i2, i3, i4, i5;
    float f0, f1;
    uintptr_t src0, src1, src2, src3, src4, src5, src6, src7;
    uintptr_t dst;
} ed_op;

typedef struct ed_pool ed_pool;

/* A pool of n_threads (the caller is thread 0; n_threads - 1 workers are started now, once). */
ed_pool *ed_pool_new(int n_threads);
void ed_pool_free(ed_pool *pool);
int ed_pool_threads(const ed_pool *pool);

/* Run ops[0..n_ops) in order on the pool's threads, each op (phase) starting once those before it are
 * complete. Returns 0, or -1 when an op is malformed (unknown code, a weight type without a kernel):
 * then nothing was run; -2 when out of memory. */
int ed_plan_run(ed_pool *pool, const ed_op *ops, int n_ops);

/* How many chunks phase `phase` of an op is cut into when n_threads share it (0: the phase has nothing to
 * do), -1 for a malformed op or a phase it does not have: for tests and tools that check how work is
 * spread (an ATTENTION op of a deep decode step splits its keys: phases 2 and 3 have chunks). */
int64_t ed_op_chunk_count(const ed_op *op, int phase, int n_threads);

/* Checks of a decode step's inputs before a plan runs: 1 if a token is outside 0..n_vocab-1 (n_vocab < 0:
 * not checked), 2 if a (seq_ids[i], positions[i]) has no cache slot -- position outside 0..n_ctx-1,
 * sequence outside the table, or an unmapped block at or before the position's (reference.KVCache.slots'
 * rule) -- else 0. One C call, so the checks cost well under a microsecond per step. */
int ed_step_check(const int64_t *tokens, int64_t n_vocab, const int32_t *block_table, int64_t n_seqs,
                  int64_t max_blocks, int64_t block_size, int64_t n_ctx, const int64_t *seq_ids,
                  const int64_t *positions, int64_t n);

/* Dequantize n elements (whole blocks) of ggml type `type` to float32, bit-identical with edgellm.quants
 * and ggml's dequantize_row_*; returns 1, or 0 for a type it has no code for (edgellm quantize reads
 * its input through it, on several threads: the caller splits the rows). */
int ed_dequantize_row(int type, const void *src, float *dst, int64_t n);

/* Repacked weights: whether this CPU's kernels multiply type `type` repacked (the x16 layout: a lane per
 * weight row; EDGELLM_REPACK=0 says no), the bytes `rows` rows of k elements take repacked, and the
 * repack of rows row_bytes apart into dst (64-byte aligned); returns 1, or 0 for a type without it. */
int ed_repack_x16_supported(int type);
size_t ed_repack_x16_bytes(int type, int64_t rows, int64_t k);
int ed_repack_x16(int type, const void *src, size_t row_bytes, int64_t rows, int64_t k, void *dst);

/* Whether matmul / get_rows support a ggml weight type with the kernels of this build. */
int ed_matmul_supported(int type);
int ed_get_rows_supported(int type);
/* The kernel level in use (ED_LEVEL_* of ed_kernels.h) and its name. */
int ed_runtime_level(void);
const char *ed_runtime_level_name(void);

#endif
