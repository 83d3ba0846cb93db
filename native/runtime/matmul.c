/* The matmul driver: y (n, m) = x (n, k) times weight (m, k)^T, the weight read as stored (ggml blocks).
 *
 * Phase 0 quantizes the activation rows once to the weight's vec_dot type (ggml-cpu ggml_compute_forward
 * _mul_mat does the same with its `wdata`), chunks of whole rows. Phase 1 hands out chunks of weight
 * rows; inside a chunk, tiles of TILE_W weight rows meet every activation row in tiles of TILE_X, so a
 * weight block is read from memory once and stays in L1 while it meets all n rows (a GEMM loop, not n
 * matvecs). Each weight row meets up to ED_NX_MAX activation rows per vec_dot_nx call, which unpacks its
 * blocks once for them all, or a pair of weight rows meets them per vec_dot_2nx call where the level has
 * one (each activation block then loaded once for both); every output has vec_dot's bits, so any thread
 * count gives the same bits.
 *
 * Where the table has an AMX tile GEMM over the file's blocks (AMX machines with EDGELLM_REPACK=0), a
 * prompt of AMX_MIN_ROWS rows or more takes it instead: phase 0 also packs each quantized row into the
 * tiles' layout, and phase 1 multiplies 16 weight rows at a time with every row, again with vec_dot's
 * bits. (AMX machines that repack take their tiles inside the x16 GEMM, from its layout.)
 *
 * A weight repacked at load (ED_FLAG_X16: 16 rows' blocks interleaved, a SIMD lane per row) goes to the
 * level's x16 GEMM for every n, decode included, so prompts and decode keep one set of bits (not
 * vec_dot's: ed_kernels.h). Its activations carry a side table (block scales as float, quant sums),
 * written in phase 0 for every Q8_0 activation where the level has x16 kernels, so a matmul reusing the
 * activations of the one before finds it whatever that one's weight was.
 */
#include "runtime.h"

#define TILE_W 16
#define TILE_X 8
#define CHUNKS_PER_THREAD 4
#define AMX_MIN_ROWS 4
#ifndef PREFETCH_ROWS
#define PREFETCH_ROWS 2 /* decode: rows ahead whose lines are prefetched (-D to try others) */
#endif

/* whether phase 0 packs the activations for the AMX tile GEMM: by activation type alone, so a matmul
 * reusing the activations of the one before (i1) finds them packed whatever the weight types */
static int packs(const ed_op *op, const ed_kernel_table *kt) {
    return kt->amx_pack[kt->types[op->type].vec_dot_type] && op->n >= AMX_MIN_ROWS;
}

/* whether the AMX tile GEMM takes this matmul */
static int uses_amx(const ed_op *op, const ed_kernel_table *kt) { return packs(op, kt) && kt->types[op->type].amx_gemm; }

/* the packed activations follow the quantized rows, on a cache line */
static size_t packed_offset(const ed_op *op, size_t arow) { return ((size_t)op->n * arow + 63) & ~(size_t)63; }

/* whether phase 0 writes the x16 side tables (by activation type and level alone, as packs) */
static int sides(const ed_op *op, const ed_kernel_table *kt) {
    (void)op;
    return kt->types[ED_Q8_0].x16_gemm || kt->types[ED_Q4_0].x16_gemm || kt->types[ED_IQ4_NL].x16_gemm;
}

static int has_sides(const ed_op *op, const ed_kernel_table *kt, int vt) { return vt == ED_Q8_0 && sides(op, kt); }

/* whether F16 / BF16 activations also go to phase 1 as float32 rows (their values, exact) for the level's
 * float GEMM: by activation type, level and n alone (as packs), for a matmul reusing them */
#define FLOAT_GEMM_MIN_ROWS 4
static int float_rows(const ed_op *op, const ed_kernel_table *kt, int vt) {
    return (vt == ED_F16 || vt == ED_BF16) && kt->types[vt].float_gemm && op->n >= FLOAT_GEMM_MIN_ROWS;
}

static size_t packed_tile_bytes(const ed_op *op, int vt) {
    return vt == ED_Q8_K ? (size_t)(op->k / 256) * ED_AMX_KBLOCK_BYTES : (size_t)(op->k / 32) * ED_AMX_BLOCK_BYTES;
}

size_t ed_matmul_shared_scratch(const ed_op *op, const ed_kernel_table *kt) {
    const int vt = kt->types[op->type].vec_dot_type;
    if (vt == ED_F32) return 0;
    const size_t arow = ed_act_row_bytes(vt, op->k);
    if (has_sides(op, kt, vt)) return packed_offset(op, arow) + (size_t)op->n * ed_x16_side_bytes(op->k);
    if (float_rows(op, kt, vt)) return packed_offset(op, arow) + (size_t)(op->n * op->k) * sizeof(float);
    if (!packs(op, kt)) return (size_t)op->n * arow;
    const size_t tiles = (size_t)(op->n + ED_AMX_ROWS - 1) / ED_AMX_ROWS;
    return packed_offset(op, arow) + tiles * packed_tile_bytes(op, vt);
}

/* weight rows per chunk of the dot phase: whole tiles, a few chunks per thread so that a descheduled
 * thread's share is picked up by the others */
static int64_t chunk_rows(int64_t m, int nth) {
    const int64_t tiles = (m + TILE_W - 1) / TILE_W;
    const int64_t per = nth == 1 ? tiles : (tiles + CHUNKS_PER_THREAD * nth - 1) / (CHUNKS_PER_THREAD * nth);
    return per * TILE_W;
}

int64_t ed_matmul_chunks(const ed_op *op, int phase, int nth, const ed_kernel_table *kt) {
    if (op->i1) phase++;
    if (phase == 0) return kt->types[op->type].vec_dot_type == ED_F32 ? 0 : ed_row_chunks(op->n, nth);
    const int64_t rows = chunk_rows(op->m, nth);
    return (op->m + rows - 1) / rows;
}

void ed_matmul(const ed_op *op, int phase, ed_ctx *ctx) {
    const ed_kernel_table *kt = ctx->kt;
    const ed_type_kernels *tk = &kt->types[op->type];
    const int vt = tk->vec_dot_type;
    const int64_t n = op->n, m = op->m, k = op->k;
    const size_t arow = vt == ED_F32 ? sizeof(float) * k : ed_act_row_bytes(vt, k);
    const uint8_t *act = vt == ED_F32 ? (const uint8_t *)op->src1 : (const uint8_t *)ed_shared_scratch(ctx);
    if (op->i1) phase++; /* the activations are already quantized: only the dot products */

    const int pack = packs(op, kt), amx = uses_amx(op, kt);
    uint8_t *packed = pack ? (uint8_t *)act + packed_offset(op, arow) : NULL;
    /* (a table has either the file-layout AMX GEMM or x16 kernels: they never share the scratch) */
    const size_t side_row = ed_x16_side_bytes(k);
    uint8_t *side = has_sides(op, kt, vt) ? (uint8_t *)act + packed_offset(op, arow) : NULL;
    float *yf = float_rows(op, kt, vt) ? (float *)(act + packed_offset(op, arow)) : NULL;
    if (phase == 0) {
        int64_t r0, r1;
        ed_split(n, ctx->chunk, ctx->n_chunks, &r0, &r1);
        for (int64_t r = r0; r < r1; r++) {
            kt->from_float[vt]((const float *)op->src1 + r * k, (uint8_t *)act + r * arow, k);
            if (yf) ed_act_row_to_f32(kt, vt, act + r * arow, yf + r * k, k); /* the row's f16 / bf16 values, exact */
            if (side) ed_x16_side(act + r * arow, k, side + r * side_row);
            if (pack)
                kt->amx_pack[vt](act + r * arow, (int)k, packed + r / ED_AMX_ROWS * packed_tile_bytes(op, vt),
                                 (int)(r % ED_AMX_ROWS));
        }
        for (int64_t r = n; pack && r1 == n && r % ED_AMX_ROWS; r++) /* the last tile's rows past n: zeros */
            kt->amx_pack[vt](NULL, (int)k, packed + r / ED_AMX_ROWS * packed_tile_bytes(op, vt), (int)(r % ED_AMX_ROWS));
        return;
    }

    const uint8_t *w = (const uint8_t *)op->src0;
    const size_t wrow = (size_t)op->i0;
    float *y = (float *)op->dst;
    const ed_vec_dot_fn dot = tk->vec_dot;
    const int64_t rows = chunk_rows(m, ctx->nth);
    const int64_t c0 = ctx->chunk * rows, c1 = c0 + rows < m ? c0 + rows : m;
    void *scratch = amx ? ed_thread_scratch(ctx, (size_t)(k / 32) * ED_AMX_WBLOCK_BYTES) : NULL;
    if (op->flags & ED_FLAG_X16) { /* groups of 16 rows (chunks are whole groups) against every row */
        const size_t group = ed_x16_bytes(op->type, ED_X16_ROWS, k);
        for (int64_t j0 = c0; j0 < c1; j0 += ED_X16_ROWS) {
            const int nr = (int)(c1 - j0 < ED_X16_ROWS ? c1 - j0 : ED_X16_ROWS);
            tk->x16_gemm((int)k, &y[j0], (size_t)m, w + j0 / ED_X16_ROWS * group, nr, act, arow, side, side_row,
                         (int)n);
        }
        return;
    }
    if (yf) { /* the chunk's weight rows against every activation row (the kernel blocks them for its tile) */
        tk->float_gemm((int)k, &y[c0], (size_t)m, w + c0 * wrow, wrow, (int)(c1 - c0), yf, (size_t)k, (int)n);
        return;
    }
    if (scratch) { /* (out of memory: the dots below, which need none, give the same bits) */
        for (int64_t j0 = c0; j0 < c1; j0 += ED_AMX_ROWS) {
            const int nr = (int)(c1 - j0 < ED_AMX_ROWS ? c1 - j0 : ED_AMX_ROWS);
            tk->amx_gemm((int)k, &y[j0], (size_t)m, w + j0 * wrow, wrow, nr, packed, (int)n, scratch);
        }
        return;
    }
    for (int64_t j0 = c0; j0 < c1; j0 += TILE_W) {
        const int64_t j1 = j0 + TILE_W < c1 ? j0 + TILE_W : c1;
        for (int64_t i0 = 0; i0 < n; i0 += TILE_X) {
            const int64_t i1 = i0 + TILE_X < n ? i0 + TILE_X : n;
            if (i1 - i0 == 1) { /* a matvec (decode): the single-row kernel */
                for (int64_t j = j0; j < j1; j++) {
                    if (j + PREFETCH_ROWS < c1)
                        for (size_t b = 0; b < wrow; b += 64) __builtin_prefetch(w + (j + PREFETCH_ROWS) * wrow + b);
                    dot((int)k, &y[i0 * m + j], w + j * wrow, act + i0 * arow);
                }
                continue;
            }
            for (int64_t j = j0; j < j1; j += tk->vec_dot_2nx && j + 1 < j1 ? 2 : 1)
                for (int64_t i = i0; i < i1; i += ED_NX_MAX) {
                    const int nc = (int)(i1 - i < ED_NX_MAX ? i1 - i : ED_NX_MAX);
                    if (tk->vec_dot_2nx && j + 1 < j1)
                        tk->vec_dot_2nx((int)k, &y[i * m + j], (size_t)m, w + j * wrow, wrow, act + i * arow, arow, nc);
                    else
                        ed_vec_dot_nx(tk, (int)k, &y[i * m + j], (size_t)m, w + j * wrow, act + i * arow, arow, nc);
                }
        }
    }
}
