/* The repacked (x16) weight layout and the activation side tables its kernels read (ed_kernels.h says
 * the layout). Plain C: the layout is the same for every level; the kernels are per level
 * (avx512_x16.h). The interleave follows llama.cpp's ggml/src/ggml-cpu/repack.cpp (make_block_q4_0x8 and
 * friends: rows' blocks side by side, 4 or 8 bytes of each row in turn) with 16 rows and 4-byte steps,
 * what one vpdpbusd takes per int32 lane.
 */
#include "ed_blocks.h"

/* bytes of quants per block and chunks of 64 bytes they fill in a group, per type; 0: no layout */
static int quant_bytes(int t) {
    switch (t) {
    case ED_Q4_0: case ED_IQ4_NL: return QK / 2;
    case ED_Q8_0: return QK;
    default: return 0;
    }
}

size_t ed_x16_side_bytes(int64_t n) { return (size_t)(n / QK) * (sizeof(float) + sizeof(int32_t)); }

void ed_x16_side(const void *y, int64_t n, void *side) {
    const block_q8_0 *b = y;
    const int64_t nb = n / QK;
    float *d = side;
    int32_t *s = (int32_t *)(d + nb);
    for (int64_t i = 0; i < nb; i++) {
        int32_t sum = 0;
        for (int j = 0; j < QK; j++) sum += b[i].qs[j];
        d[i] = ed_f16_to_f32(b[i].d);
        s[i] = sum;
    }
}

size_t ed_x16_bytes(int t, int64_t rows, int64_t n) {
    const int qb = quant_bytes(t);
    if (!qb || rows < 0 || n % QK) return 0;
    const int64_t groups = (rows + ED_X16_ROWS - 1) / ED_X16_ROWS;
    return (size_t)groups * (size_t)(n / QK) * ED_X16_ROWS * (2 + (size_t)qb);
}

int ed_x16_repack(int t, const void *src, size_t row_bytes, int64_t rows, int64_t n, void *dst) {
    const int qb = quant_bytes(t), bb = 2 + qb;
    if (!qb || n % QK || row_bytes != (size_t)(n / QK) * (size_t)bb) return 0;
    const int64_t nb = n / QK, groups = (rows + ED_X16_ROWS - 1) / ED_X16_ROWS;
    const uint8_t xor = t == ED_Q8_0 ? 0x80 : 0; /* Q8_0 quants stored unsigned: q + 128 */
    uint8_t *out = dst;
    for (int64_t g = 0; g < groups; g++)
        for (int64_t b = 0; b < nb; b++, out += ED_X16_ROWS * bb) {
            uint16_t *d = (uint16_t *)out;
            uint8_t *q = out + 2 * ED_X16_ROWS;
            for (int r = 0; r < ED_X16_ROWS; r++) {
                const int64_t row = g * ED_X16_ROWS + r;
                if (row >= rows) { /* past the last row: scale 0, quants 0 (128 for Q8_0's zero) */
                    d[r] = 0;
                    for (int j = 0; j < qb / 4; j++) memset(q + 64 * j + 4 * r, xor, 4);
                    continue;
                }
                const uint8_t *blk = (const uint8_t *)src + (size_t)row * row_bytes + (size_t)b * (size_t)bb;
                d[r] = ed_load_u16(blk);
                for (int j = 0; j < qb / 4; j++)
                    for (int i = 0; i < 4; i++) q[64 * j + 4 * r + i] = (uint8_t)(blk[2 + 4 * j + i] ^ xor);
            }
        }
    return 1;
}
