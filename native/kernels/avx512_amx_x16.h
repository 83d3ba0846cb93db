/* AMX machines: the repacked (x16) GEMM's prompts on int8 tiles for the legacy types without mins
 * (Q4_0, Q5_0, IQ4_NL, Q8_0), with the bits of avx512_x16.h's kernels (whose unpacking it reuses).
 * Included once by avx512.c after avx512_amx.h, under its target pragma with amx-tile and amx-int8.
 *
 * The x16 layout's 64-byte chunks are already the K-interleaved operand of TDPBSSD: chunk j of a block
 * holds quants YOFF[j] .. YOFF[j] + 3 of each of the 16 weight rows, so a block's 8 unpacked chunks,
 * less the type's offset (signed: Q4_0 q - 8, Q5_0 q - 16, IQ4_NL its value, Q8_0 q) and stored at rows
 * YOFF[j] / 4, are the B tile (8 rows x 64 bytes); the A tile is 16 activation rows' 32 quants read where
 * they lie (stride: an activation row's bytes). One TDPBSSD gives a block's exact integer dots for 16 x 16
 * outputs (the VNNI kernel's isum, which adds -off * Σy instead: the same integer), and each output takes
 * the x16 float step, acc = fma(d_w * d_y, (float) isum, acc), in block order, so prompts give the bits
 * decode (the VNNI kernel, nc < 16) does. Rows of activations past the last whole 16 go to the VNNI kernel.
 *
 * Measured on a 2-vCPU Sapphire Rapids-class Xeon (`edgellm bench -p 128` through
 * scripts/bench_vs_llamacpp.py, against the VNNI x16 kernels): +5-7% on SmolLM2 Q4_0 / Q8_0 and
 * Qwen2.5-Coder-0.5B (Q5_0 / Q8_0). Q4_1 on tiles (the Q8_1 activation's f16 d and s per output) was 12%
 * slower than its VNNI kernel and stays there; the K-quants keep their VNNI kernels too. The file-layout
 * tile GEMM (avx512_amx.h) multiplies prompts at about the speed of these, but decode over the file's
 * blocks streams at 0.6-0.8x the x16 layout's rate there, so AMX machines repack as the others do.
 */

#define ED_X16_AMX_KB 32 /* blocks unpacked into B tiles at a time (16 KiB), for every 16 activation rows */
static _Thread_local _Alignas(64) uint8_t x16_amx_wbuf[ED_X16_AMX_KB * 512];

/* TDPBSSD of A tile `a` (16 activation rows, 32 quants each, `by` apart) and the B tile at wb into C tile
 * `c`, stored to out[16 activation rows][16 weight rows] */
#define X16_AMX_DOT(c, a, bt, yq, by, wb, out)                                                                \
    do {                                                                                                     \
        _tile_zero(c);                                                                                       \
        _tile_loadd(a, yq, (long)(by));                                                                      \
        _tile_loadd(bt, wb, 64);                                                                             \
        _tile_dpbssd(c, a, bt);                                                                              \
        _tile_stored(c, out, 64);                                                                            \
    } while (0)

/* block b's 16 x 16 integer dots (cb: activation row c's at cb[16 c ..]) into the 16 activation rows'
 * accumulators, the x16 float step: acc = fma(d_w * d_y, (float) isum, acc), d_y from the side tables */
ED_ALWAYS_INLINE void x16_amx_fold(__m512 *acc, const int32_t *cb, const uint8_t *g, int b, const uint8_t *side,
                                   size_t side_row) {
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)g));
    for (int c = 0; c < 16; c++) {
        const float *yd = (const float *)(side + c * side_row);
        const __m512 sc = _mm512_mul_ps(dw, _mm512_set1_ps(yd[b]));
        acc[c] = _mm512_fmadd_ps(sc, _mm512_cvtepi32_ps(_mm512_load_si512((const void *)(cb + 16 * c))), acc[c]);
    }
}

/* against Q8_0 activations (their quants at offsetof(block_q8_0, qs)) and their side tables */
#define ED_X16_AMX(name, GB, QOFF, UNPACK, YOFF, OFF)                                                          \
    static void x16_amx_gemm_##name(int n, float *s, size_t bs, const void *vx, int nr, const void *vy,        \
                                    size_t by, const void *side, size_t side_row, int nc) {                  \
        const int full = nc / 16 * 16, nb = n / QK;                                                          \
        const size_t ab = sizeof(block_q8_0), aq = offsetof(block_q8_0, qs);                                 \
        const uint8_t *x = vx, *sd = side;                                                                   \
        if (full) {                                                                                          \
            uint8_t *wb = x16_amx_wbuf;                                                                      \
            _Alignas(64) int32_t cb[2][256];                                                                 \
            const __mmask16 keep = (__mmask16)((1u << nr) - 1);                                              \
            amx_config(32); /* tiles 0, 3: C; 1, 4: A (16 x 32 bytes); 2, 5: B (8 x 64 bytes) */             \
            for (int b0 = 0; b0 < nb; b0 += ED_X16_AMX_KB) {                                                 \
                const int kb = nb - b0 < ED_X16_AMX_KB ? nb - b0 : ED_X16_AMX_KB;                            \
                for (int i = 0; i < kb; i++) {                                                               \
                    __m512i w[8];                                                                            \
                    UNPACK(x + (size_t)(b0 + i) * (GB) + (QOFF), w);                                         \
                    for (int j = 0; j < 8; j++) /* signed: the offset taken off each weight */               \
                        _mm512_storeu_si512((void *)(wb + i * 512 + (YOFF)[j] * 16),                         \
                                           _mm512_sub_epi8(w[j], _mm512_set1_epi8((char)(OFF))));            \
                }                                                                                            \
                for (int c0 = 0; c0 < full; c0 += 16) {                                                      \
                    const uint8_t *y = (const uint8_t *)vy + (size_t)c0 * by, *ysd = sd + (size_t)c0 * side_row; \
                    __m512 acc[16];                                                                          \
                    for (int c = 0; c < 16; c++)                                                             \
                        acc[c] = b0 ? _mm512_maskz_loadu_ps(keep, s + (size_t)(c0 + c) * bs) : _mm512_setzero_ps(); \
                    int i = 0;                                                                               \
                    for (; i + 1 < kb; i += 2) { /* two blocks' tiles in flight, folded in block order */    \
                        const int b = b0 + i;                                                                \
                        X16_AMX_DOT(0, 1, 2, y + (size_t)b * ab + aq, by, wb + i * 512, cb[0]);              \
                        X16_AMX_DOT(3, 4, 5, y + (size_t)(b + 1) * ab + aq, by, wb + (i + 1) * 512, cb[1]);  \
                        x16_amx_fold(acc, cb[0], x + (size_t)b * (GB), b, ysd, side_row);  \
                        x16_amx_fold(acc, cb[1], x + (size_t)(b + 1) * (GB), b + 1, ysd, side_row); \
                    }                                                                                        \
                    if (i < kb) {                                                                            \
                        const int b = b0 + i;                                                                \
                        X16_AMX_DOT(0, 1, 2, y + (size_t)b * ab + aq, by, wb + i * 512, cb[0]);              \
                        x16_amx_fold(acc, cb[0], x + (size_t)b * (GB), b, ysd, side_row);  \
                    }                                                                                        \
                    for (int c = 0; c < 16; c++) _mm512_mask_storeu_ps(s + (size_t)(c0 + c) * bs, keep, acc[c]); \
                }                                                                                            \
            }                                                                                                \
        }                                                                                                    \
        if (nc > full)                                                                                       \
            x16_gemm_##name(n, s + (size_t)full * bs, bs, vx, nr, (const uint8_t *)vy + (size_t)full * by, by, \
                            sd ? sd + (size_t)full * side_row : NULL, side_row, nc - full);                  \
    }

ED_X16_AMX(q4_0, ED_X16_ROWS * sizeof(block_q4_0), 2 * ED_X16_ROWS, x16_unpack_q4_0, x16_yoff_q4, 8)
ED_X16_AMX(iq4_nl, ED_X16_ROWS * sizeof(block_iq4_nl), 2 * ED_X16_ROWS, x16_unpack_iq4_nl, x16_yoff_q4, 128)
ED_X16_AMX(q5_0, ED_X16_ROWS * sizeof(block_q5_0), 2 * ED_X16_ROWS, x16_unpack_q5_0, x16_yoff_q4, 16)
ED_X16_AMX(q8_0, ED_X16_ROWS * sizeof(block_q8_0), 2 * ED_X16_ROWS, x16_unpack_q8_0, x16_yoff_q8, 128)
#undef ED_X16_AMX
#undef X16_AMX_DOT

/* the legacy types' x16 GEMMs on tiles (set_x16 installed the VNNI ones, which take the rest of a call) */
static void set_x16_amx(ed_kernel_table *t) {
    t->types[ED_Q4_0].x16_gemm = x16_amx_gemm_q4_0;
    t->types[ED_IQ4_NL].x16_gemm = x16_amx_gemm_iq4_nl;
    t->types[ED_Q5_0].x16_gemm = x16_amx_gemm_q5_0;
    t->types[ED_Q8_0].x16_gemm = x16_amx_gemm_q8_0;
}
