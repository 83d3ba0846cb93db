/* The repacked (x16) weight layout and the activation side tables its kernels read (ed_kernels.h says
 * the layout). Plain C: the layout is the same for every level; the kernels are per level
 * (avx512_x16.h). The interleave follows llama.cpp's ggml/src/ggml-cpu/repack.cpp (make_block_q4_0x8 and
 * friends: rows' blocks side by side, 4 or 8 bytes of each row in turn) with 16 rows and 4-byte steps,
 * what one vpdpbusd takes per int32 lane.
 */
#include "ed_blocks.h"

#include <stdlib.h>

int ed_repack_enabled(void) {
    const char *v = getenv("EDGELLM_REPACK");
    return !(v && v[0] == '0');
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

/* One row's block (blk) into lane r of a group block (out). */
typedef void (*lane_fn)(const uint8_t *blk, uint8_t *out, int r);

/* Q4_0 / IQ4_NL: 16 f16 scales, then 4 chunks of 64 bytes (row r's qs[4j..4j+3] at 64j + 4r) */
static void lane_q4(const uint8_t *blk, uint8_t *out, int r) {
    memcpy(out + 2 * r, blk, 2);
    for (int j = 0; j < 4; j++) memcpy(out + 32 + 64 * j + 4 * r, blk + 2 + 4 * j, 4);
}

/* Q4_1: 16 f16 scales, 16 f16 mins, then Q4_0's 4 chunks of 64 bytes of nibbles */
static void lane_q4_1(const uint8_t *blk, uint8_t *out, int r) {
    memcpy(out + 2 * r, blk, 2);
    memcpy(out + Q41_MIN + 2 * r, blk + 2, 2);
    for (int j = 0; j < 4; j++) memcpy(out + Q41_QS + 64 * j + 4 * r, blk + 4 + 4 * j, 4);
}

/* the fifth bits qh of a Q5_0 / Q5_1 block as 8 64-bit masks at out (mask h has bit 4r + i for the quant
 * that vector h of the Q4_0 unpacking puts in byte i of lane r: h = 2j quants 4j.., h = 2j + 1 quants
 * 16 + 4j..) */
static void lane_masks(uint32_t qh, uint8_t *out, int r) {
    for (int h = 0; h < 8; h++)
        for (int i = 0; i < 4; i++)
            if ((qh >> ((h & 1) * 16 + 4 * (h / 2) + i)) & 1) out[8 * h + (4 * r + i) / 8] |= 1u << ((4 * r + i) % 8);
}

/* Q5_0: 16 f16 scales, the 8 masks, then the nibbles as Q4_0's */
static void lane_q5_0(const uint8_t *blk, uint8_t *out, int r) {
    uint32_t qh;
    memcpy(out + 2 * r, blk, 2);
    memcpy(&qh, blk + 2, 4);
    lane_masks(qh, out + 32, r);
    for (int j = 0; j < 4; j++) memcpy(out + 96 + 64 * j + 4 * r, blk + 6 + 4 * j, 4);
}

/* Q5_1: Q4_1's scales and mins, the 8 masks, then the nibbles */
static void lane_q5_1(const uint8_t *blk, uint8_t *out, int r) {
    uint32_t qh;
    memcpy(out + 2 * r, blk, 2);
    memcpy(out + Q41_MIN + 2 * r, blk + 2, 2);
    memcpy(&qh, blk + 4, 4);
    lane_masks(qh, out + Q41_QS, r);
    for (int j = 0; j < 4; j++) memcpy(out + Q51_QS + 64 * j + 4 * r, blk + 8 + 4 * j, 4);
}

/* Q8_0: 16 f16 scales, then 8 chunks of 64 bytes, quants + 128 (unsigned) */
static void lane_q8_0(const uint8_t *blk, uint8_t *out, int r) {
    memcpy(out + 2 * r, blk, 2);
    for (int j = 0; j < 8; j++)
        for (int i = 0; i < 4; i++) out[32 + 64 * j + 4 * r + i] = (uint8_t)(blk[2 + 4 * j + i] ^ 0x80);
}

/* ggml get_scale_min_k4: sub-block j's 6-bit scale and min from the 12 packed bytes */
static void scale_min_k4(int j, const uint8_t *q, uint8_t *d, uint8_t *m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4);
    }
}

/* Q2_K (a super-block of 256): 16 f16 d, 16 f16 dmin, the 16 sub-blocks' scale bytes as the file's
 * (scale in the low nibble, min in the high) [16][16], then 16 chunks of 64 bytes (row r's qs[4c..4c+3]
 * at 64c + 4r): the file's size */
static void lane_q2_K(const uint8_t *blk, uint8_t *out, int r) {
    memcpy(out + 2 * r, blk + 80, 2);
    memcpy(out + 32 + 2 * r, blk + 82, 2);
    for (int s = 0; s < 16; s++) out[Q2K_SC + 16 * s + r] = blk[s];
    for (int c = 0; c < 16; c++) memcpy(out + Q2K_QS + 64 * c + 4 * r, blk + 16 + 4 * c, 4);
}

/* Q4_K (a super-block of 256): 16 f16 d, 16 f16 dmin, the 8 sub-block scales as bytes [8][16], the mins
 * as byte pairs [4][16][2] (sub-blocks 2i, 2i+1: one vpdpwssd against the activation's pair of 32-sums),
 * then per pair of sub-blocks p 8 chunks of 64 bytes (row r's qs[32p + 4j..+3] at 512p + 64j + 4r: low
 * nibbles are sub-block 2p, high 2p + 1). nibbles: the group block's offset of those chunks. */
static void lane_k_nibbles(const uint8_t *blk, const uint8_t *qs, uint8_t *out, int r, int nibbles) {
    memcpy(out + 2 * r, blk, 2);
    memcpy(out + 32 + 2 * r, blk + 2, 2);
    for (int j = 0; j < 8; j++) {
        uint8_t sc, mn;
        scale_min_k4(j, blk + 4, &sc, &mn);
        out[Q4K_SC + 16 * j + r] = sc;
        out[Q4K_MIN + 32 * (j / 2) + 2 * r + (j & 1)] = mn;
    }
    for (int p = 0; p < 4; p++)
        for (int j = 0; j < 8; j++) memcpy(out + nibbles + 512 * p + 64 * j + 4 * r, qs + 32 * p + 4 * j, 4);
}

static void lane_q4_K(const uint8_t *blk, uint8_t *out, int r) { lane_k_nibbles(blk, blk + 16, out, r, Q4K_QS); }

/* Q5_K: Q4_K's block, and between the mins and the nibbles the file's qh (bit j of qh[i]: the fifth bit
 * of sub-block j's quant i) in 8 chunks of 64 bytes (row r's qh[4j..4j+3] at 64j + 4r) */
static void lane_q5_K(const uint8_t *blk, uint8_t *out, int r) {
    lane_k_nibbles(blk, blk + 48, out, r, Q5K_QS);
    for (int j = 0; j < 8; j++) memcpy(out + Q5K_QH + 64 * j + 4 * r, blk + 16 + 4 * j, 4);
}

/* Q3_K (a super-block of 256): 16 f16 d, the 16 scales (6-bit, less 32: ggml dequantize_row_q3_K's
 * unpacking of the 12 bytes) as int8 pairs [8][16][2] as Q6_K's, then Q2_K's 16 chunks of the 2-bit quants
 * (row r's qs[4c..4c+3] at 64c + 4r) and 8 chunks of the high bits (row r's hmask[4c..4c+3]): quant
 * 128n + 32j + 16h + l is bits 2j of qs[32n + 16h + l] and bit 4n + j of hmask[16h + l] (set: q = low
 * bits, clear: q = low bits - 4), in sub-block 8n + 2j + h of 16 */
static void lane_q3_K(const uint8_t *blk, uint8_t *out, int r) {
    memcpy(out + 2 * r, blk + 108, 2);
    uint32_t aux[4];
    memcpy(aux, blk + 96, 12);
    const uint32_t kmask1 = 0x03030303, kmask2 = 0x0f0f0f0f, tmp = aux[2];
    aux[2] = ((aux[0] >> 4) & kmask2) | (((tmp >> 4) & kmask1) << 4);
    aux[3] = ((aux[1] >> 4) & kmask2) | (((tmp >> 6) & kmask1) << 4);
    aux[0] = (aux[0] & kmask2) | (((tmp >> 0) & kmask1) << 4);
    aux[1] = (aux[1] & kmask2) | (((tmp >> 2) & kmask1) << 4);
    uint8_t sc[16];
    memcpy(sc, aux, 16);
    for (int s = 0; s < 16; s++) out[Q3K_SC + 32 * (s / 2) + 2 * r + (s & 1)] = (uint8_t)(int8_t)(sc[s] - 32);
    for (int c = 0; c < 16; c++) memcpy(out + Q3K_QS + 64 * c + 4 * r, blk + 32 + 4 * c, 4);
    for (int c = 0; c < 8; c++) memcpy(out + Q3K_HM + 64 * c + 4 * r, blk + 4 * c, 4);
}

/* Q6_K (a super-block of 256): 16 f16 d, the 16 int8 scales as pairs [8][16][2] (sub-blocks 2i, 2i + 1:
 * one vpdpwssd against the activation's bsums pair), then the file's ql and qh in 4-byte steps per row:
 * ql chunk c (0..31) holds row r's ql[4c..4c+3] at 64c + 4r, qh chunk c (0..15) its qh[4c..4c+3] */
static void lane_q6_K(const uint8_t *blk, uint8_t *out, int r) {
    memcpy(out + 2 * r, blk + 208, 2);
    for (int i = 0; i < 8; i++) memcpy(out + Q6K_SC + 32 * i + 2 * r, blk + 192 + 2 * i, 2);
    for (int c = 0; c < 32; c++) memcpy(out + Q6K_QL + 64 * c + 4 * r, blk + 4 * c, 4);
    for (int c = 0; c < 16; c++) memcpy(out + Q6K_QH + 64 * c + 4 * r, blk + 128 + 4 * c, 4);
}

static const struct {
    int type, elems, bytes; /* the file's block */
    size_t group;           /* bytes of a 16-row group block */
    lane_fn lane;
} layouts[] = {
    {ED_Q4_0, QK, 18, 288, lane_q4},
    {ED_IQ4_NL, QK, 18, 288, lane_q4},
    {ED_Q4_1, QK, 20, 320, lane_q4_1},
    {ED_Q5_0, QK, 22, 352, lane_q5_0},
    {ED_Q5_1, QK, 24, 384, lane_q5_1},
    {ED_Q8_0, QK, 34, 544, lane_q8_0},
    {ED_Q2_K, QK_K, 84, Q2K_GROUP, lane_q2_K},
    {ED_Q3_K, QK_K, 110, Q3K_GROUP, lane_q3_K},
    {ED_Q4_K, QK_K, 144, Q4K_GROUP, lane_q4_K},
    {ED_Q5_K, QK_K, 176, Q5K_GROUP, lane_q5_K},
    {ED_Q6_K, QK_K, 210, Q6K_GROUP, lane_q6_K},
};

static int layout(int t) {
    for (int i = 0; i < (int)(sizeof(layouts) / sizeof(layouts[0])); i++)
        if (layouts[i].type == t) return i;
    return -1;
}

size_t ed_x16_bytes(int t, int64_t rows, int64_t n) {
    const int l = layout(t);
    if (l < 0 || rows < 0 || n % layouts[l].elems) return 0;
    const int64_t groups = (rows + ED_X16_ROWS - 1) / ED_X16_ROWS;
    return (size_t)groups * (size_t)(n / layouts[l].elems) * layouts[l].group;
}

int ed_x16_repack(int t, const void *src, size_t row_bytes, int64_t rows, int64_t n, void *dst) {
    const int l = layout(t);
    if (l < 0 || n % layouts[l].elems || row_bytes != (size_t)(n / layouts[l].elems) * (size_t)layouts[l].bytes)
        return 0;
    const int64_t nb = n / layouts[l].elems, groups = (rows + ED_X16_ROWS - 1) / ED_X16_ROWS;
    static const uint8_t zero[256]; /* a row past the last: scales 0 (its sums are never stored) */
    uint8_t *out = dst;
    for (int64_t g = 0; g < groups; g++)
        for (int64_t b = 0; b < nb; b++, out += layouts[l].group) {
            memset(out, 0, layouts[l].group); /* (lanes of Q5_0's and Q5_1's masks are set bit by bit) */
            for (int r = 0; r < ED_X16_ROWS; r++) {
                const int64_t row = g * ED_X16_ROWS + r;
                const uint8_t *blk = row < rows ? (const uint8_t *)src + (size_t)row * row_bytes +
                                                      (size_t)b * (size_t)layouts[l].bytes
                                                : zero;
                layouts[l].lane(blk, out, r);
            }
        }
    return 1;
}
