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

/* tiles: 0, 3 sums (16 weight rows x 16 activation rows, int32); 1, 4 weights (16 rows x kbytes: one
 * block, or K-quant sub-block); 2, 5 activations (kbytes / 4 rows of 16 x 4 bytes: TDPBUSD's K-interleaved
 * layout) */
static _Thread_local int amx_config_kbytes; /* this thread's loaded configuration (0: none, or released) */
static void amx_config(int kbytes) {
    if (amx_config_kbytes == kbytes) return; /* loaded once per thread: avx512_amx_x16.h calls this per group */
    amx_config_kbytes = kbytes;
    ed_tilecfg cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.palette = 1;
    for (int t = 0; t < 6; t += 3) {
        cfg.rows[t] = 16, cfg.colsb[t] = 64;
        cfg.rows[t + 1] = 16, cfg.colsb[t + 1] = (uint16_t)kbytes;
        cfg.rows[t + 2] = (uint8_t)(kbytes / 4), cfg.colsb[t + 2] = 64;
    }
    _tile_loadconfig(&cfg);
}

/* tiles back to their initial state (the configuration with them: the next amx_config loads it again) */
static void amx_release(void) {
    _tile_release();
    amx_config_kbytes = 0;
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
        amx_config(32);                                                                                    \
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
        amx_release();                                                                                   \
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

/* --------------------------------------------------------------------------------- K-quants */

/* Q4_K, Q5_K and Q6_K against Q8_K: vec_dot's integers per super-block are exact whatever the lanes, so
 * on an AMX machine its float steps change to the GEMM's: per super-block, Q4_K/Q5_K
 * fma(d_x * d_y, Σ sc * q * y, acc) then fma(-(dmin_x * d_y), Σ m * bsums, acc); Q6_K
 * fma(d_x * d_y, Σ sc * q * y - 32 Σ sc * bsums, acc); one float accumulator, super-blocks in order. The
 * GEMM takes a tile product per 32-quant sub-block (Q6_K: per 16) and scales its int32 sums per weight row
 * (vpmulld); the min and -32 terms are vpdpwssd of int16 pairs. */
ED_ALWAYS_INLINE void q4_K_exact(int n, float *s, size_t bs, const void *vx, const uint8_t *vy, size_t by, const int nc) {
    q45_K_n_vnni(n, s, bs, vx, vy, by, nc, 0, 1);
}
ED_ALWAYS_INLINE void q5_K_exact(int n, float *s, size_t bs, const void *vx, const uint8_t *vy, size_t by, const int nc) {
    q45_K_n_vnni(n, s, bs, vx, vy, by, nc, 1, 1);
}
ED_ALWAYS_INLINE void q6_K_exact(int n, float *s, size_t bs, const void *vx, const uint8_t *vy, size_t by, const int nc) {
    q6_K_x_vnni(n, s, bs, vx, vy, by, nc, 1);
}
ED_NX_ENTRIES(q4_K_exact, vec_dot_q4_K_amx, vec_dot_nx_q4_K_amx, 8)
ED_NX_ENTRIES(q5_K_exact, vec_dot_q5_K_amx, vec_dot_nx_q5_K_amx, 8)
ED_NX_ENTRIES(q6_K_exact, vec_dot_q6_K_amx, vec_dot_nx_q6_K_amx, 4)

/* A Q8_K super-block of a tile of 16 activation rows (ED_AMX_KBLOCK_BYTES): quants by 32-quant chunk c
 * in TDPBUSD's layout (bytes 4k..4k+3 of chunk c of row j at q[512 c + 64 k + 4 j]), d, and the bsums as
 * int16 pairs per row: (bsums 2t, 2t+1) for Q6_K's scale pairs, (B 2t, B 2t+1), B c = Σ of chunk c, for
 * Q4_K/Q5_K's min pairs. */
typedef struct {
    int8_t q[8 * 512];
    float d[16];
    int32_t bsum16[8][16], bsum32[4][16];
} ed_amx_kblock;
_Static_assert(sizeof(ed_amx_kblock) == ED_AMX_KBLOCK_BYTES, "packed Q8_K block size");

static inline int32_t i16_pair(int a, int b) { return (int32_t)((uint32_t)(uint16_t)a | (uint32_t)(uint16_t)b << 16); }

static void amx_pack_q8_K(const void *vy, int n, void *tile, int lane) {
    ed_amx_kblock *p = tile;
    const block_q8_K *y = vy;
    for (int b = 0; b < n / QK_K; b++) {
        for (int c = 0; c < 8; c++)
            for (int k = 0; k < 8; k++) {
                if (y) memcpy(&p[b].q[512 * c + 64 * k + 4 * lane], &y[b].qs[32 * c + 4 * k], 4);
                else memset(&p[b].q[512 * c + 64 * k + 4 * lane], 0, 4);
            }
        const int16_t *bsums = y ? y[b].bsums : NULL;
        p[b].d[lane] = y ? y[b].d : 0.0f;
        for (int t = 0; t < 8; t++) p[b].bsum16[t][lane] = y ? i16_pair(bsums[2 * t], bsums[2 * t + 1]) : 0;
        for (int t = 0; t < 4; t++)
            p[b].bsum32[t][lane] = y ? i16_pair(bsums[4 * t] + bsums[4 * t + 1], bsums[4 * t + 2] + bsums[4 * t + 3]) : 0;
    }
}

/* 16 weight rows of a super-block, unpacked (Q4_K/Q5_K): quants by sub-block, scales, min pairs, d, dmin */
typedef struct {
    uint8_t q[8][16][32];
    int32_t sc[8][16], mins[4][16];
    float d[16], dmin[16];
} ed_amx_w45;
/* Q6_K: quants (+32) by 16-quant sub-block, scales, scale pairs, d */
typedef struct {
    uint8_t q[16][16][16];
    int32_t sc[16][16], pairs[8][16];
    float d[16];
} ed_amx_w6;
_Static_assert(sizeof(ed_amx_w45) <= 8 * ED_AMX_WBLOCK_BYTES && sizeof(ed_amx_w6) <= 8 * ED_AMX_WBLOCK_BYTES,
               "K-quant weight scratch");

static void unpack_w45(ed_amx_w45 *w, const uint8_t *xb, int r, int five) {
    const block_q4_K *x4 = (const block_q4_K *)xb; /* d, dmin, scales lead both layouts */
    const uint8_t *qs = five ? ((const block_q5_K *)xb)->qs : x4->qs;
    const __m256i m4 = _mm256_set1_epi8(0x0F), h = five ? _mm256_loadu_si256((const __m256i *)((const block_q5_K *)xb)->qh)
                                                         : _mm256_setzero_si256();
    for (int j = 0; j < 4; j++) {
        const __m256i bits = _mm256_loadu_si256((const __m256i *)(qs + 32 * j));
        __m256i lo = _mm256_and_si256(bits, m4), hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
        if (five) { /* qh bit 2j: +16 on the first 32 quants of this 64, bit 2j+1 on the next 32 */
            const __m256i s16 = _mm256_set1_epi8(16);
            lo = _mm256_mask_add_epi8(lo, _mm256_test_epi8_mask(h, _mm256_set1_epi8((char)(1 << (2 * j)))), lo, s16);
            hi = _mm256_mask_add_epi8(hi, _mm256_test_epi8_mask(h, _mm256_set1_epi8((char)(1 << (2 * j + 1)))), hi, s16);
        }
        _mm256_storeu_si256((__m256i *)w->q[2 * j][r], lo);
        _mm256_storeu_si256((__m256i *)w->q[2 * j + 1][r], hi);
    }
    uint32_t utmp[4];
    ed_unpack_scales_k4(x4->scales, utmp);
    const uint8_t *u = (const uint8_t *)utmp; /* scales 0..7, mins 8..15 */
    for (int k = 0; k < 8; k++) w->sc[k][r] = u[k];
    for (int t = 0; t < 4; t++) w->mins[t][r] = i16_pair(u[8 + 2 * t], u[9 + 2 * t]);
    w->d[r] = ed_f16_table[ed_load_u16(&x4->d)], w->dmin[r] = ed_f16_table[ed_load_u16(&x4->dmin)];
}

static void unpack_w6(ed_amx_w6 *w, const block_q6_K *x, int r) {
    const __m512i m15 = _mm512_set1_epi8(15), m48 = _mm512_set1_epi8(48);
    for (int h = 0; h < 2; h++) { /* as q6_K_n: qa = quants 0..63 of this half, qb = 64..127 */
        const __m512i lo = _mm512_loadu_si512((const void *)(x->ql + 64 * h));
        const __m256i bh = _mm256_loadu_si256((const __m256i *)(x->qh + 32 * h));
        const __m512i hb = join256(bh, _mm256_srli_epi16(bh, 2));
        const __m512i qa = _mm512_or_si512(_mm512_and_si512(lo, m15), _mm512_and_si512(_mm512_slli_epi16(hb, 4), m48));
        const __m512i qb = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(lo, 4), m15), _mm512_and_si512(hb, m48));
        _Alignas(64) uint8_t q[128];
        _mm512_store_si512(q, qa), _mm512_store_si512(q + 64, qb);
        for (int k = 0; k < 8; k++) memcpy(w->q[8 * h + k][r], q + 16 * k, 16);
    }
    for (int k = 0; k < 16; k++) w->sc[k][r] = x->scales[k];
    for (int t = 0; t < 8; t++) w->pairs[t][r] = i16_pair(x->scales[2 * t], x->scales[2 * t + 1]);
    w->d[r] = ed_f16_table[ed_load_u16(&x->d)];
}

/* tile products of weight sub-blocks s, s+1 (wq: 16 rows at stride kb) with the activation chunks at
 * a0, a1 into cb[s], cb[s + 1] (16 x 16 int32 each) */
static inline void amx_pair(const uint8_t *w0, const uint8_t *w1, int kb, const int8_t *a0, const int8_t *a1,
                            int32_t *c0, int32_t *c1) {
    _tile_zero(0);
    _tile_zero(3);
    _tile_loadd(1, w0, kb);
    _tile_loadd(2, a0, 64);
    _tile_loadd(4, w1, kb);
    _tile_loadd(5, a1, 64);
    _tile_dpbusd(0, 1, 2);
    _tile_dpbusd(3, 4, 5);
    _tile_stored(0, c0, 64);
    _tile_stored(3, c1, 64);
}

static inline void store_rows(float *s, size_t bs, const __m512 *acc, int nr, int rows) {
    _Alignas(64) float out[16];
    for (int m = 0; m < nr; m++) {
        _mm512_store_ps(out, acc[m]);
        for (int j = 0; j < rows; j++) s[(size_t)j * bs + m] = out[j];
    }
}

static void q45_K_gemm(int n, float *s, size_t bs, const void *vx, size_t bx, int nr, const void *packed, int nc,
                       void *scratch, const int five) {
    const int nsb = n / QK_K;
    const size_t xs = five ? sizeof(block_q5_K) : sizeof(block_q4_K);
    ed_amx_w45 *W = scratch;
    memset(W, 0, sizeof(*W) * (size_t)nsb);
    for (int r = 0; r < nr; r++)
        for (int i = 0; i < nsb; i++) unpack_w45(&W[i], (const uint8_t *)vx + (size_t)r * bx + (size_t)i * xs, r, five);
    amx_config(32);
    _Alignas(64) int32_t cb[8][256];
    for (int i0 = 0; i0 < nc; i0 += 16) {
        const ed_amx_kblock *P = (const ed_amx_kblock *)packed + (size_t)(i0 / 16) * nsb;
        __m512 acc[16];
        for (int m = 0; m < 16; m++) acc[m] = _mm512_setzero_ps();
        for (int i = 0; i < nsb; i++) {
            for (int k = 0; k < 8; k += 2)
                amx_pair(W[i].q[k][0], W[i].q[k + 1][0], 32, &P[i].q[512 * k], &P[i].q[512 * (k + 1)], cb[k], cb[k + 1]);
            const __m512 dy = _mm512_loadu_ps(P[i].d);
            for (int m = 0; m < 16; m++) {
                __m512i sum = _mm512_setzero_si512(), mins = _mm512_setzero_si512();
                for (int k = 0; k < 8; k++)
                    sum = _mm512_add_epi32(sum, _mm512_mullo_epi32(_mm512_set1_epi32(W[i].sc[k][m]), _mm512_load_si512(cb[k] + 16 * m)));
                for (int t = 0; t < 4; t++)
                    mins = _mm512_dpwssd_epi32(mins, _mm512_set1_epi32(W[i].mins[t][m]), _mm512_loadu_si512(P[i].bsum32[t]));
                acc[m] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(W[i].d[m]), dy), _mm512_cvtepi32_ps(sum), acc[m]);
                acc[m] = _mm512_fnmadd_ps(_mm512_mul_ps(_mm512_set1_ps(W[i].dmin[m]), dy), _mm512_cvtepi32_ps(mins), acc[m]);
            }
        }
        store_rows(s + (size_t)i0 * bs, bs, acc, nr, nc - i0 < 16 ? nc - i0 : 16);
    }
    amx_release();
}

static void q4_K_amx_gemm(int n, float *s, size_t bs, const void *vx, size_t bx, int nr, const void *packed, int nc,
                          void *scratch) {
    q45_K_gemm(n, s, bs, vx, bx, nr, packed, nc, scratch, 0);
}

static void q5_K_amx_gemm(int n, float *s, size_t bs, const void *vx, size_t bx, int nr, const void *packed, int nc,
                          void *scratch) {
    q45_K_gemm(n, s, bs, vx, bx, nr, packed, nc, scratch, 1);
}

static void q6_K_amx_gemm(int n, float *s, size_t bs, const void *vx, size_t bx, int nr, const void *packed, int nc,
                          void *scratch) {
    const int nsb = n / QK_K;
    ed_amx_w6 *W = scratch;
    memset(W, 0, sizeof(*W) * (size_t)nsb);
    for (int r = 0; r < nr; r++)
        for (int i = 0; i < nsb; i++) unpack_w6(&W[i], (const block_q6_K *)((const uint8_t *)vx + (size_t)r * bx) + i, r);
    amx_config(16);
    _Alignas(64) int32_t cb[16][256];
    for (int i0 = 0; i0 < nc; i0 += 16) {
        const ed_amx_kblock *P = (const ed_amx_kblock *)packed + (size_t)(i0 / 16) * nsb;
        __m512 acc[16];
        for (int m = 0; m < 16; m++) acc[m] = _mm512_setzero_ps();
        for (int i = 0; i < nsb; i++) {
            for (int k = 0; k < 16; k += 2) /* sub-blocks k, k+1: the two halves of chunk k / 2 */
                amx_pair(W[i].q[k][0], W[i].q[k + 1][0], 16, &P[i].q[256 * k], &P[i].q[256 * (k + 1)], cb[k], cb[k + 1]);
            const __m512 dy = _mm512_loadu_ps(P[i].d);
            for (int m = 0; m < 16; m++) {
                __m512i sum = _mm512_setzero_si512(), low = _mm512_setzero_si512();
                for (int k = 0; k < 16; k++)
                    sum = _mm512_add_epi32(sum, _mm512_mullo_epi32(_mm512_set1_epi32(W[i].sc[k][m]), _mm512_load_si512(cb[k] + 16 * m)));
                for (int t = 0; t < 8; t++)
                    low = _mm512_dpwssd_epi32(low, _mm512_set1_epi32(W[i].pairs[t][m]), _mm512_loadu_si512(P[i].bsum16[t]));
                sum = _mm512_sub_epi32(sum, _mm512_slli_epi32(low, 5)); /* quants are stored +32 */
                acc[m] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(W[i].d[m]), dy), _mm512_cvtepi32_ps(sum), acc[m]);
            }
        }
        store_rows(s + (size_t)i0 * bs, bs, acc, nr, nc - i0 < 16 ? nc - i0 : 16);
    }
    amx_release();
}

/* the entries on an AMX machine: these dots (no vec_dot_2nx: prompts take the GEMM) and GEMMs */
#define ED_SET(T, name)                                                                             \
    t->types[T].vec_dot = vec_dot_##name##_amx, t->types[T].vec_dot_nx = vec_dot_nx_##name##_amx,   \
    t->types[T].vec_dot_2nx = NULL, t->types[T].amx_gemm = name##_amx_gemm

static void set_amx(ed_kernel_table *t) {
    ED_SET(ED_Q4_0, q4_0);
    ED_SET(ED_Q4_1, q4_1);
    ED_SET(ED_Q5_0, q5_0);
    ED_SET(ED_Q5_1, q5_1);
    ED_SET(ED_Q8_0, q8_0);
    ED_SET(ED_IQ4_NL, iq4_nl);
    ED_SET(ED_Q4_K, q4_K);
    ED_SET(ED_Q5_K, q5_K);
    ED_SET(ED_Q6_K, q6_K);
    t->amx_pack[ED_Q8_0] = amx_pack_q8_0;
    t->amx_pack[ED_Q8_1] = amx_pack_q8_1;
    t->amx_pack[ED_Q8_K] = amx_pack_q8_K; /* Q2_K and Q3_K take Q8_K too, without a GEMM: their dots */
}
#undef ED_SET
#undef ED_AMX_TYPE
#undef ED_AMX_GEMM
#undef ED_AMX_PACK
#undef ED_AMX_DOT
