/* AMX machines (Sapphire Rapids and later: amx_tile + amx_int8): the legacy-block dots and an int8 tile
 * GEMM for prompts, giving the same bits. Included once by avx512.c, after the VNNI body (whose weight
 * unpacking it reuses), under a target pragma with amx-tile and amx-int8.
 *
 * The tile GEMM sums a whole block (32 products) per output in int32 (TDPBUSD: weights unsigned as in the
 * VNNI dots, activations signed, -off * Σy carried in the tile's start value), so its float work is one
 * FMA per block and output, where the VNNI dots of avx512_body.h do one per 4 products. For prompts and
 * decode to give the same bits, vec_dot on an AMX machine takes the same float steps:
 *   - its 16 float lanes are 16 blocks: lane t takes blocks 16 g + lane_block[t], g = 0, 1, ...;
 *   - each block adds fma(d_x * d_y, Σ, acc) to its lane (then fma(m_x, s_y, acc) for Q4_1 / Q5_1);
 *   - the lanes are summed by hsum_f32x16's tree.
 * The GEMM holds, for 16 weight rows, one accumulator per lane t with 16 activation rows in its float
 * lanes, walks each lane's blocks in the same order, and sums the 16 accumulators by the same tree.
 *
 * ggml-org/llama.cpp ggml/src/ggml-cpu/amx/mmq.cpp multiplies Q4_0/Q4_1/Q8_0 with TDPBSSD/TDPBUSD tiles
 * of repacked weights; this file shares its tile shapes (K = one 32-element block per tile op, so each
 * block keeps its own scale), not its code.
 */

/* the block (of a group of 16) in each float lane: where block_sums16's shuffles put it */
static inline __m512i lane_blocks(void) { return _mm512_set_epi32(15, 13, 11, 9, 14, 12, 10, 8, 7, 5, 3, 1, 6, 4, 2, 0); }
static const int ed_amx_lane_block[16] = {0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15};

/* the int32 sums of 16 blocks from 8 block-pair vectors (p[i]: lanes 0..7 block 2i, 8..15 block 2i+1),
 * block lane_block[t] in lane t */
static inline __m512i block_sums16(const __m512i p[8]) {
    __m512i q[4], r[2];
    for (int i = 0; i < 4; i++)
        q[i] = _mm512_add_epi32(_mm512_unpacklo_epi32(p[2 * i], p[2 * i + 1]),
                                _mm512_unpackhi_epi32(p[2 * i], p[2 * i + 1]));
    for (int i = 0; i < 2; i++)
        r[i] = _mm512_add_epi32(_mm512_unpacklo_epi64(q[2 * i], q[2 * i + 1]),
                                _mm512_unpackhi_epi64(q[2 * i], q[2 * i + 1]));
    return _mm512_add_epi32(_mm512_shuffle_i32x4(r[0], r[1], _MM_SHUFFLE(2, 0, 2, 0)),
                            _mm512_shuffle_i32x4(r[0], r[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

/* the f16 at byte `off` of blocks lane_block[t] (of `size` bytes from base) as floats, 0 outside k */
static inline __m512 gather_f16(const void *base, int size, int off, __mmask16 k) {
    const __m512i idx = _mm512_mullo_epi32(lane_blocks(), _mm512_set1_epi32(size));
    const __m512i v = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), k, idx, (const char *)base + off, 1);
    return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v));
}

/* hsum_f32x16's tree applied lane by lane to 16 vectors: v[t] holds float lane t of 16 outputs */
static inline __m512 lane_tree(const __m512 v[16]) {
    __m512 e[8], f[4];
    for (int i = 0; i < 8; i++) e[i] = _mm512_add_ps(v[i], v[i + 8]);
    for (int i = 0; i < 4; i++) f[i] = _mm512_add_ps(e[i + 4], e[i]);
    return _mm512_add_ps(_mm512_add_ps(f[0], f[2]), _mm512_add_ps(f[1], f[3]));
}

/* One weight row against nc activation rows in the block-lane order above; its nc = 1 instance is
 * vec_dot. A group's weight pairs are unpacked once for all nc rows; an odd last block is paired with
 * itself and its lane masked off. */
#define ED_AMX_DOT(name, XT, YT, UNPACK, MINS, OFF)                                                          \
    ED_ALWAYS_INLINE void name##_lanes(int n, float *s, size_t bs, const void *vx, const uint8_t *vy,         \
                                       size_t by, const int nc) {                                           \
        const XT *x = (const XT *)vx;                                                                       \
        const int nb = n / QK;                                                                              \
        __m512 acc[ED_NX_MAX];                                                                              \
        for (int c = 0; c < nc; c++) acc[c] = _mm512_setzero_ps();                                          \
        for (int g = 0; g < nb; g += 16) {                                                                  \
            const int nblk = nb - g < 16 ? nb - g : 16, np = (nblk + 1) / 2;                                \
            const __mmask16 k = _mm512_cmplt_epi32_mask(lane_blocks(), _mm512_set1_epi32(nblk));            \
            __m512i w[8];                                                                                   \
            for (int i = 0; i < 8; i++)                                                                     \
                w[i] = i < np ? UNPACK(&x[g + 2 * i], &x[g + 2 * i + (2 * i + 1 < nblk)]).q                 \
                              : _mm512_setzero_si512();                                                     \
            const __m512 dx = gather_f16(&x[g], sizeof(XT), 0, k);                                          \
            const __m512 mx = MINS ? gather_f16(&x[g], sizeof(XT), 2, k) : _mm512_setzero_ps();             \
            for (int c = 0; c < nc; c++) {                                                                  \
                const YT *y = (const YT *)(vy + c * by) + g;                                                \
                __m512i p[8];                                                                               \
                for (int i = 0; i < 8; i++) {                                                               \
                    p[i] = _mm512_setzero_si512();                                                          \
                    if (i >= np) continue;                                                                  \
                    const __m512i q = qs64(y[2 * i].qs, y[2 * i + (2 * i + 1 < nblk)].qs);                  \
                    const __m512i z = _mm512_setzero_si512();                                               \
                    const __m512i bias =                                                                    \
                        OFF ? _mm512_sub_epi32(z, _mm512_dpbusd_epi32(z, _mm512_set1_epi8((char)OFF), q)) : z; \
                    p[i] = _mm512_dpbusd_epi32(bias, w[i], q);                                              \
                }                                                                                           \
                const __m512 sum = _mm512_cvtepi32_ps(block_sums16(p));                                     \
                const __m512 sc = _mm512_mul_ps(dx, gather_f16(y, sizeof(YT), 0, k));                       \
                acc[c] = _mm512_mask3_fmadd_ps(sc, sum, acc[c], k);                                         \
                if (MINS) acc[c] = _mm512_mask3_fmadd_ps(mx, gather_f16(y, sizeof(YT), 2, k), acc[c], k);   \
            }                                                                                               \
        }                                                                                                   \
        for (int c = 0; c < nc; c++) s[c * bs] = hsum_f32x16(acc[c]);                                       \
    }                                                                                                       \
    ED_NX_ENTRIES(name##_lanes, vec_dot_##name##_amx, vec_dot_nx_##name##_amx, 4)

/* ------------------------------------------------------------------------------- the tile GEMM */

/* ldtilecfg's 64-byte operand (palette 1) */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} ed_tilecfg;

/* tiles: 0, 3 sums (16 weight rows x 16 activation rows, int32); 1, 4 weights (16 rows x 32 bytes, one
 * block); 2, 5 activations (8 rows of 16 x 4 bytes: TDPBUSD's K-interleaved layout) */
static void amx_config(void) {
    ed_tilecfg cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.palette = 1;
    for (int t = 0; t < 6; t += 3) {
        cfg.rows[t] = 16, cfg.colsb[t] = 64;
        cfg.rows[t + 1] = 16, cfg.colsb[t + 1] = 32;
        cfg.rows[t + 2] = 8, cfg.colsb[t + 2] = 64;
    }
    _tile_loadconfig(&cfg);
}

/* Activation rows packed for the GEMM (ED_AMX_ROWS rows a tile, ED_AMX_BLOCK_BYTES a block): per tile and
 * block, the 32 quants of row j at q[4 k + 64 ... ] in TDPBUSD's layout (bytes 4k..4k+3 of row j at
 * q[64 k + 4 j]), the scales as floats, Σ quants (Q8_0: for -off * Σy) and s (Q8_1). */
typedef struct {
    int8_t q[8 * 64];
    float d[16], s[16];
    int32_t sum[16];
} ed_amx_ablock;
_Static_assert(sizeof(ed_amx_ablock) == ED_AMX_BLOCK_BYTES, "packed activation block size");

#define ED_AMX_PACK(name, YT, S)                                                                              \
    static void amx_pack_##name(const void *vy, int n, void *tile, int lane) {                             \
        ed_amx_ablock *p = tile;                                                                           \
        const YT *y = vy;                                                                                  \
        for (int b = 0; b < n / QK; b++) {                                                                 \
            int32_t sum = 0;                                                                               \
            for (int k = 0; k < 8; k++) {                                                                  \
                if (y) memcpy(&p[b].q[64 * k + 4 * lane], &y[b].qs[4 * k], 4);                             \
                else memset(&p[b].q[64 * k + 4 * lane], 0, 4);                                             \
            }                                                                                              \
            for (int i = 0; y && i < QK; i++) sum += y[b].qs[i];                                           \
            p[b].d[lane] = y ? ed_f16_to_f32(y[b].d) : 0.0f;                                               \
            p[b].s[lane] = y ? S : 0.0f;                                                                   \
            p[b].sum[lane] = sum;                                                                          \
        }                                                                                                  \
    }
ED_AMX_PACK(q8_0, block_q8_0, 0.0f)
ED_AMX_PACK(q8_1, block_q8_1, ed_f16_to_f32(y[b].s))

/* nr (<= 16) weight rows (vx + r * bx) against nc activation rows packed by amx_pack (whole tiles):
 * s[c * bs + r]. The weight rows are unpacked once into scratch (ED_AMX_WBLOCK_BYTES a block): per
 * block 16 rows x 32 unsigned bytes, then the rows' scales d and (Q4_1/Q5_1) m as floats. For each tile
 * of 16 activation rows and each float lane t of vec_dot, the lane's blocks in order: two tile products
 * at a time (blocks b and b + 16, tiles 0-2 and 3-5), stored and folded into the 16 weight rows'
 * accumulators with vec_dot's float steps. */
#define ED_AMX_GEMM(name, XT, UNPACK, MINS, OFF)                                                             \
    static void name##_amx_gemm(int n, float *s, size_t bs, const void *vx, size_t bx, int nr,              \
                                const void *packed, int nc, void *scratch) {                               \
        const int nb = n / QK;                                                                             \
        uint8_t *wq = scratch;                                                                             \
        float *wd = (float *)(wq + (size_t)nb * 512), *wm = wd + (size_t)nb * 16;                          \
        for (int r = 0; r < 16; r++) {                                                                     \
            const XT *x = (const XT *)((const uint8_t *)vx + (size_t)r * bx);                              \
            for (int b = 0; b < nb; b += 2) {                                                              \
                const int b1 = b + 1 < nb ? b + 1 : b;                                                     \
                const __m512i q = r < nr ? UNPACK(&x[b], &x[b1]).q : _mm512_setzero_si512();               \
                _mm256_storeu_si256((__m256i *)(wq + (size_t)b * 512 + r * 32), _mm512_castsi512_si256(q)); \
                if (b1 != b)                                                                               \
                    _mm256_storeu_si256((__m256i *)(wq + (size_t)b1 * 512 + r * 32),                       \
                                        _mm512_extracti64x4_epi64(q, 1));                                  \
            }                                                                                              \
            for (int b = 0; b < nb; b++) {                                                                 \
                wd[b * 16 + r] = r < nr ? ed_f16_to_f32(x[b].d) : 0.0f;                                    \
                wm[b * 16 + r] = r < nr && MINS ? ed_f16_to_f32(ed_load_u16((const uint8_t *)&x[b] + 2)) : 0.0f; \
            }                                                                                              \
        }                                                                                                  \
        amx_config();                                                                                      \
        _Alignas(64) int32_t c0[16 * 16], c1[16 * 16], bias0[16], bias1[16];                               \
        _Alignas(64) float out[16];                                                                        \
        __m512 lanes[16][16];                                                                              \
        for (int i0 = 0; i0 < nc; i0 += 16) {                                                              \
            const ed_amx_ablock *P = (const ed_amx_ablock *)packed + (size_t)(i0 / 16) * nb;               \
            for (int t = 0; t < 16; t++) {                                                                 \
                __m512 acc[16];                                                                            \
                for (int m = 0; m < 16; m++) acc[m] = _mm512_setzero_ps();                                 \
                for (int b = ed_amx_lane_block[t]; b < nb; b += 32) {                                      \
                    const int two = b + 16 < nb;                                                           \
                    if (OFF) {                                                                             \
                        const __m512i o = _mm512_set1_epi32(-(OFF));                                       \
                        _mm512_store_si512(bias0, _mm512_mullo_epi32(o, _mm512_loadu_si512(P[b].sum)));    \
                        _tile_loadd(0, bias0, 0);                                                          \
                    } else                                                                                 \
                        _tile_zero(0);                                                                     \
                    _tile_loadd(1, wq + (size_t)b * 512, 32);                                              \
                    _tile_loadd(2, P[b].q, 64);                                                            \
                    _tile_dpbusd(0, 1, 2);                                                                 \
                    if (two) {                                                                             \
                        if (OFF) {                                                                         \
                            const __m512i o = _mm512_set1_epi32(-(OFF));                                   \
                            _mm512_store_si512(bias1, _mm512_mullo_epi32(o, _mm512_loadu_si512(P[b + 16].sum))); \
                            _tile_loadd(3, bias1, 0);                                                      \
                        } else                                                                             \
                            _tile_zero(3);                                                                 \
                        _tile_loadd(4, wq + (size_t)(b + 16) * 512, 32);                                   \
                        _tile_loadd(5, P[b + 16].q, 64);                                                   \
                        _tile_dpbusd(3, 4, 5);                                                             \
                    }                                                                                      \
                    _tile_stored(0, c0, 64);                                                               \
                    if (two) _tile_stored(3, c1, 64);                                                      \
                    for (int h = 0; h <= two; h++) {                                                       \
                        const int bb = b + 16 * h;                                                         \
                        const int32_t *cs = h ? c1 : c0;                                                   \
                        const __m512 dy = _mm512_loadu_ps(P[bb].d), sy = _mm512_loadu_ps(P[bb].s);         \
                        for (int m = 0; m < 16; m++) {                                                     \
                            const __m512 sc = _mm512_mul_ps(_mm512_set1_ps(wd[bb * 16 + m]), dy);          \
                            const __m512 sum = _mm512_cvtepi32_ps(_mm512_load_si512(cs + 16 * m));         \
                            acc[m] = _mm512_fmadd_ps(sc, sum, acc[m]);                                     \
                            if (MINS) acc[m] = _mm512_fmadd_ps(_mm512_set1_ps(wm[bb * 16 + m]), sy, acc[m]); \
                        }                                                                                  \
                    }                                                                                      \
                }                                                                                          \
                for (int m = 0; m < 16; m++) lanes[m][t] = acc[m];                                         \
            }                                                                                              \
            const int rows = nc - i0 < 16 ? nc - i0 : 16;                                                  \
            for (int m = 0; m < nr; m++) {                                                                 \
                _mm512_store_ps(out, lane_tree(lanes[m]));                                                 \
                for (int j = 0; j < rows; j++) s[(size_t)(i0 + j) * bs + m] = out[j];                      \
            }                                                                                              \
        }                                                                                                  \
        _tile_release();                                                                                   \
    }

#define ED_AMX_TYPE(name, XT, YT, MINS, OFF)                          \
    ED_AMX_DOT(name, XT, YT, unpack_##name##_vnni, MINS, OFF)         \
    ED_AMX_GEMM(name, XT, unpack_##name##_vnni, MINS, OFF)

ED_AMX_TYPE(q4_0, block_q4_0, block_q8_0, 0, 8)
ED_AMX_TYPE(q4_1, block_q4_1, block_q8_1, 1, 0)
ED_AMX_TYPE(q5_0, block_q5_0, block_q8_0, 0, 16)
ED_AMX_TYPE(q5_1, block_q5_1, block_q8_1, 1, 0)
ED_AMX_TYPE(q8_0, block_q8_0, block_q8_0, 0, 128)
ED_AMX_TYPE(iq4_nl, block_iq4_nl, block_q8_0, 0, 128)

/* the legacy types' entries on an AMX machine: these dots (no vec_dot_2nx: prompts take the GEMM) */
#define ED_SET(T, name)                                                                             \
    t->types[T].vec_dot = vec_dot_##name##_amx, t->types[T].vec_dot_nx = vec_dot_nx_##name##_amx,   \
    t->types[T].vec_dot_2nx = NULL, t->types[T].amx_gemm = name##_amx_gemm

static void set_legacy_amx(ed_kernel_table *t) {
    ED_SET(ED_Q4_0, q4_0);
    ED_SET(ED_Q4_1, q4_1);
    ED_SET(ED_Q5_0, q5_0);
    ED_SET(ED_Q5_1, q5_1);
    ED_SET(ED_Q8_0, q8_0);
    ED_SET(ED_IQ4_NL, iq4_nl);
    t->amx_pack[ED_Q8_0] = amx_pack_q8_0; /* every weight type taking Q8_0 / Q8_1 has amx_gemm above */
    t->amx_pack[ED_Q8_1] = amx_pack_q8_1;
}
#undef ED_SET
#undef ED_AMX_TYPE
#undef ED_AMX_GEMM
#undef ED_AMX_PACK
#undef ED_AMX_DOT
