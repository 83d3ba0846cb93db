/* The repacked (x16) GEMM at the AVX2 level, included by avx2.c under its target pragma: the layout of
 * ed_kernels.h read as two halves of 8 rows (a 64-byte chunk's low 32 bytes are rows 0..7, its high 32
 * rows 8..15), one int32 lane per weight row. Without vpdpbusd the integer dots are vpmaddubsw pairs:
 * unsigned quants (Q4_0, Q4_1, Q5_0, Q5_1) sum a few products in int16 before vpmaddwd widens them, where they
 * cannot overflow (8 or 4 vectors: at most 8 * 2 * 15 * 127 or 4 * 2 * 31 * 127);
 * signed ones (Q8_0, IQ4_NL) take |w| * (y with w's sign), ggml's mul_sum_i8_pairs, widened at once. The
 * integers are exact, so every lane's float steps (convert, scale product, FMA per block or super-block)
 * are the AVX-512 kernels' (avx512_x16.h) and give their bits: kernel_check's x16_ref checks both.
 */
/* decode: Q5_K and Q6_K prefetch this far ahead (set_x16_avx2). Q5_K's group reads its fifth bits' lines
 * again for each pair of sub-blocks, and without it streamed at ~0.75x the file layout (1 thread, Zen 3:
 * 9.4 against 12.7 GB/s; 12.3-13.4 with it 8 KiB ahead, as AMD's x16_pf_q6_K in avx512_x16.h). On the
 * Sapphire Rapids-class Xeon held to this level (weights in huge pages) 8 KiB is too far: Qwen2.5-Coder-1.5B
 * Q4_K_M decode (`EDGELLM_NATIVE_LEVEL=avx2 edgellm bench -p 0 -n 64 -r 2`, 5-6 interleaved runs each) read
 * 20.9-21.5 GB/s at 8 KiB, 22.0-23.3 at 2 KiB, 20.8-21.6 at 4 KiB, 21.0-22.0 at 1 KiB; a Q4_K prefetch
 * (0.25-1 KiB ahead) added nothing, as the AVX-512 kernels found on AMD. So Intel 2 KiB, AMD 8 KiB.
 * A Zen 5 (AMD family 0x1A) held to this level wants Q4_K's decode prefetched too (x16a_pf_q4_K): the same
 * bench, 6 interleaved rounds (EDGELLM_PF_AVX2_Q4K, EDGELLM_PF_AVX2), 2 KiB 43.4-45.3 tok/s, 4 KiB 43.2-55.1,
 * none 33.3-39.6 (8 KiB far; 2 KiB far alike). So 2 KiB there; on the Zen 3 and Zen 4 (0x19), unmeasured
 * with the weights in huge pages, none as before. */
static size_t x16a_pf_far;
static size_t x16a_pf_q4_K; /* Q4_K's decode prefetch: set_x16_avx2 */

/* avx2.c has included avx2_x16_legacy.h: the helpers, x16a_legacy_nc and ED_X16A_ENTRY */
#define X16A_Q4_0(NC) x16a_legacy_nc(ED_Q4_0, n, s, bs, vx, nr, y, by, sd, side_row, NC)
#define X16A_Q4_1(NC) x16a_legacy_nc(ED_Q4_1, n, s, bs, vx, nr, y, by, sd, side_row, NC)
#define X16A_Q5_0(NC) x16a_legacy_nc(ED_Q5_0, n, s, bs, vx, nr, y, by, sd, side_row, NC)
#define X16A_Q5_1(NC) x16a_legacy_nc(ED_Q5_1, n, s, bs, vx, nr, y, by, sd, side_row, NC)
#define X16A_Q8_0(NC) x16a_legacy_nc(ED_Q8_0, n, s, bs, vx, nr, y, by, sd, side_row, NC)
#define X16A_IQ4_NL(NC) x16a_legacy_nc(ED_IQ4_NL, n, s, bs, vx, nr, y, by, sd, side_row, NC)
ED_X16A_ENTRY(x16a_gemm_q4_0, X16A_Q4_0)
ED_X16A_ENTRY(x16a_gemm_q4_1, X16A_Q4_1)
ED_X16A_ENTRY(x16a_gemm_q5_0, X16A_Q5_0)
ED_X16A_ENTRY(x16a_gemm_q5_1, X16A_Q5_1)
ED_X16A_ENTRY(x16a_gemm_q8_0, X16A_Q8_0)
ED_X16A_ENTRY(x16a_gemm_iq4_nl, X16A_IQ4_NL)

/* Q4_K and Q5_K: the AVX-512 kernel's plan (x16_k_nc, the layout's offsets Q4K_*, Q5K_*) with vpmaddubsw. A
 * sub-block's 8 products per lane pair are summed in int16 (Q4_K: at most 8 * 2 * 15 * 128 = 30720; Q5_K, 4
 * at a time: 4 * 2 * 31 * 128 = 31744: exact), then vpmaddwd
 * against the row's scale in both halves of its lane adds sc_j * (the sub-block's integer dot) to the row's
 * int32 sum; the float steps per super-block are x16_q4_K_nc's, so the bits are the AVX-512 kernel's. */

/* 8 scale bytes (rows 8h..8h+7) as 8 lanes of the int16 pair (sc, sc) */
static inline __m256i x16a_scale_pairs(const uint8_t *p) {
    const __m256i s = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
    return _mm256_or_si256(s, _mm256_slli_epi32(s, 16));
}

/* one half's float steps for a super-block g against activation block y: acc = fma(d_w * d_y, isum, acc),
 * then acc = fnmadd(dmin_w * d_y, msum, acc), msum the mins against the sub-blocks' activation sums */
ED_ALWAYS_INLINE __m256 x16a_q4_K_float(const uint8_t *g, int h, const block_q8_K *y, __m256i isum, __m256 acc) {
    const __m256i s32 = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y->bsums), _mm256_set1_epi16(1));
    int32_t pairs[4]; /* int16 pairs (sum of sub-block 2i, of 2i + 1) */
    _mm_storeu_si128((__m128i *)pairs, _mm_packs_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1)));
    __m256i msum = _mm256_setzero_si256();
    for (int i = 0; i < 4; i++) {
        const __m256i m = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(g + Q4K_MIN + 32 * i + 16 * h)));
        msum = _mm256_add_epi32(msum, _mm256_madd_epi16(m, _mm256_set1_epi32(pairs[i])));
    }
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(g + 16 * h)));
    const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(g + 32 + 16 * h)));
    const __m256 dy = _mm256_set1_ps(y->d);
    acc = _mm256_fmadd_ps(_mm256_mul_ps(d, dy), _mm256_cvtepi32_ps(isum), acc);
    return _mm256_fnmadd_ps(_mm256_mul_ps(dmin, dy), _mm256_cvtepi32_ps(msum), acc);
}

/* Q5_K's fifth bits for sub-block j: 16 where bit j (bit = 1 << j in every byte) of the qh byte is set */
static inline __m256i x16a_fifth(__m256i qh, __m256i bit) {
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit), _mm256_set1_epi8(16));
}

/* the same for a constant j, by shifts (within each byte's lane: the mask drops what crossed) */
ED_ALWAYS_INLINE __m256i x16a_fifth_c(__m256i qh, const int j) {
    const __m256i m16 = _mm256_set1_epi8(16);
    if (j == 4) return _mm256_and_si256(qh, m16);
    return _mm256_and_si256(j < 4 ? _mm256_slli_epi16(qh, 4 - j) : _mm256_srli_epi16(qh, j - 4), m16);
}

/* decode (one activation row) of Q4_K, or Q5_K (q5, a constant): both halves of each 64-byte chunk at once,
 * so every line is read once and each loaded vector gives both nibbles (sub-blocks 2p and 2p + 1). Q5_K's
 * quants (up to 31) sum 4 products in int16 at most (4 * 2 * 31 * 128 = 31744), Q4_K's 8. */
ED_ALWAYS_INLINE void x16a_k_1(int n, float *s, const uint8_t *vx, int nr, const block_q8_K *y, const int q5) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const size_t group = q5 ? Q5K_GROUP : Q4K_GROUP;
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int b = 0; b < n / QK_K; b++) {
        const uint8_t *g = vx + (size_t)b * group;
        const size_t ahead = q5 ? x16a_pf_far : x16a_pf_q4_K;
        if (ahead)
            for (size_t off = 0; off < group; off += 64) __builtin_prefetch(g + ahead + off);
        __m256i isum[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
#pragma GCC unroll 4
        for (int p = 0; p < 4; p++) {
            const uint8_t *q = g + (q5 ? Q5K_QS : Q4K_QS) + 512 * p;
            const int8_t *yq = y[b].qs + 64 * p;
            __m256i lo[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()}, hi[2] = {lo[0], lo[0]};
            for (int k = 0; k < 8; k++) {
                const __m256i yl = x16a_bcast4(yq + 4 * k), yh = x16a_bcast4(yq + 32 + 4 * k);
                for (int h = 0; h < 2; h++) {
                    const __m256i v = x16a_load(q + 64 * k + 32 * h);
                    __m256i wl = _mm256_and_si256(v, m4), wh = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                    if (q5) {
                        const __m256i qh = x16a_load(g + Q5K_QH + 64 * k + 32 * h);
                        wl = _mm256_or_si256(wl, x16a_fifth_c(qh, 2 * p));
                        wh = _mm256_or_si256(wh, x16a_fifth_c(qh, 2 * p + 1));
                    }
                    lo[h] = _mm256_add_epi16(lo[h], _mm256_maddubs_epi16(wl, yl));
                    hi[h] = _mm256_add_epi16(hi[h], _mm256_maddubs_epi16(wh, yh));
                }
                if (k == 7 || (q5 && k == 3))
                    for (int h = 0; h < 2; h++) {
                        isum[h] = _mm256_add_epi32(isum[h], _mm256_madd_epi16(lo[h], x16a_scale_pairs(g + Q4K_SC + 32 * p + 8 * h)));
                        isum[h] = _mm256_add_epi32(isum[h], _mm256_madd_epi16(hi[h], x16a_scale_pairs(g + Q4K_SC + 32 * p + 16 + 8 * h)));
                        lo[h] = hi[h] = _mm256_setzero_si256();
                    }
            }
        }
        for (int h = 0; h < 2; h++) acc[h] = x16a_q4_K_float(g, h, y + b, isum[h], acc[h]);
    }
    for (int h = 0; h * 8 < nr; h++) x16a_store(s, 1, &acc[h], h, nr, 1);
}

/* prompts: nc (<= ED_X16A_NC) activation rows, a half and a sub-block at a time (Q5_K: q5) */
ED_ALWAYS_INLINE void x16a_k_nc(int n, float *s, size_t bs, const uint8_t *vx, int nr, const uint8_t *vy,
                                size_t by, const int nc, const int q5) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const size_t group = q5 ? Q5K_GROUP : Q4K_GROUP;
    for (int h = 0; h * 8 < nr; h++) {
        __m256 acc[ED_X16A_NC];
        for (int c = 0; c < nc; c++) acc[c] = _mm256_setzero_ps();
        for (int b = 0; b < n / QK_K; b++) {
            const uint8_t *g = vx + (size_t)b * group;
            __m256i isum[ED_X16A_NC];
            for (int c = 0; c < nc; c++) isum[c] = _mm256_setzero_si256();
            for (int j = 0; j < 8; j++) { /* sub-block j: pair j / 2, low (even) or high (odd) nibbles */
                const uint8_t *q = g + (q5 ? Q5K_QS : Q4K_QS) + 512 * (j / 2) + 32 * h;
                const __m256i sc = x16a_scale_pairs(g + Q4K_SC + 16 * j + 8 * h), bit = _mm256_set1_epi8((char)(1 << j));
                __m256i part[ED_X16A_NC];
                for (int c = 0; c < nc; c++) part[c] = _mm256_setzero_si256();
                for (int k = 0; k < 8; k++) {
                    const __m256i v = x16a_load(q + 64 * k);
                    __m256i w = _mm256_and_si256(j & 1 ? _mm256_srli_epi16(v, 4) : v, m4);
                    if (q5) w = _mm256_or_si256(w, x16a_fifth(x16a_load(g + Q5K_QH + 64 * k + 32 * h), bit));
                    for (int c = 0; c < nc; c++) {
                        const __m256i y = x16a_bcast4(((const block_q8_K *)(vy + c * by))[b].qs + 32 * j + 4 * k);
                        part[c] = _mm256_add_epi16(part[c], _mm256_maddubs_epi16(w, y));
                    }
                    if (k == 7 || (q5 && k == 3))
                        for (int c = 0; c < nc; c++) {
                            isum[c] = _mm256_add_epi32(isum[c], _mm256_madd_epi16(part[c], sc));
                            part[c] = _mm256_setzero_si256();
                        }
                }
            }
            for (int c = 0; c < nc; c++) acc[c] = x16a_q4_K_float(g, h, (const block_q8_K *)(vy + c * by) + b, isum[c], acc[c]);
        }
        x16a_store(s, bs, acc, h, nr, nc);
    }
}
/* one activation row takes the decode kernel (the same bits) */
#define X16A_Q4_K(NC)                                                                                        \
    ((NC) == 1 ? x16a_k_1(n, s, vx, nr, (const block_q8_K *)y, 0) : x16a_k_nc(n, s, bs, vx, nr, y, by, NC, 0))
#define X16A_Q5_K(NC)                                                                                        \
    ((NC) == 1 ? x16a_k_1(n, s, vx, nr, (const block_q8_K *)y, 1) : x16a_k_nc(n, s, bs, vx, nr, y, by, NC, 1))
ED_X16A_ENTRY(x16a_gemm_q4_K, X16A_Q4_K)
ED_X16A_ENTRY(x16a_gemm_q5_K, X16A_Q5_K)
#undef X16A_Q4_K
#undef X16A_Q5_K

/* Q2_K (the layout's offsets Q2K_*, x16.c's lane_q2_K): rows 8h..8h+7 a half at a time; sub-block sb's
 * quants are chunks 8 (sb / 8) + 4 (sb % 2) + k (k < 4), shifted down by 2 (sb % 8 / 2), against the
 * activation's bytes 16 sb + 4k: 4 vpmaddubsw summed in int16 (at most 4 * 2 * 3 * 128) and vpmaddwd
 * against the rows' scale pairs. msum = Σ_sb m_sb * bsum_sb, then acc = fma(d * d_y, isum, acc) and
 * acc = fnmadd(dmin * d_y, msum, acc): kernel_check's x16_ref_q2_K. */
ED_ALWAYS_INLINE void x16a_q2_K_nc(int n, float *s, size_t bs, const uint8_t *vx, int nr, const uint8_t *vy,
                                   size_t by, const int nc) {
    const __m256i m3 = _mm256_set1_epi8(3), m15 = _mm256_set1_epi32(15);
    for (int h = 0; h * 8 < nr; h++) {
        __m256 acc[ED_X16A_NC];
        for (int c = 0; c < nc; c++) acc[c] = _mm256_setzero_ps();
        for (int b = 0; b < n / QK_K; b++) {
            const uint8_t *g = vx + (size_t)b * Q2K_GROUP;
            __m256i isum[ED_X16A_NC], msum[ED_X16A_NC];
            for (int c = 0; c < nc; c++) isum[c] = msum[c] = _mm256_setzero_si256();
#pragma GCC unroll 16
            for (int sb = 0; sb < 16; sb++) {
                const uint8_t *q = g + Q2K_QS + 64 * (8 * (sb / 8) + 4 * (sb % 2)) + 32 * h;
                const __m128i shift = _mm_cvtsi32_si128(2 * (sb % 8 / 2));
                const __m256i sc8 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(g + Q2K_SC + 16 * sb + 8 * h)));
                const __m256i sc = _mm256_and_si256(sc8, m15), mn = _mm256_srli_epi32(sc8, 4);
                __m256i part[ED_X16A_NC];
                for (int c = 0; c < nc; c++) part[c] = _mm256_setzero_si256();
                for (int k = 0; k < 4; k++) {
                    const __m256i w = _mm256_and_si256(_mm256_srl_epi16(x16a_load(q + 64 * k), shift), m3);
                    for (int c = 0; c < nc; c++) {
                        const __m256i y = x16a_bcast4(((const block_q8_K *)(vy + c * by))[b].qs + 16 * sb + 4 * k);
                        part[c] = _mm256_add_epi16(part[c], _mm256_maddubs_epi16(w, y));
                    }
                }
                const __m256i scp = _mm256_or_si256(sc, _mm256_slli_epi32(sc, 16)); /* (sc, sc) int16 pairs */
                for (int c = 0; c < nc; c++) {
                    const block_q8_K *y = (const block_q8_K *)(vy + c * by) + b;
                    isum[c] = _mm256_add_epi32(isum[c], _mm256_madd_epi16(part[c], scp));
                    /* (m, 0) pairs against (bsum, 0) */
                    msum[c] = _mm256_add_epi32(msum[c], _mm256_madd_epi16(mn, _mm256_set1_epi32((uint16_t)y->bsums[sb])));
                }
            }
            const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(g + 16 * h)));
            const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(g + 32 + 16 * h)));
            for (int c = 0; c < nc; c++) {
                const __m256 dy = _mm256_set1_ps(((const block_q8_K *)(vy + c * by))[b].d);
                acc[c] = _mm256_fmadd_ps(_mm256_mul_ps(d, dy), _mm256_cvtepi32_ps(isum[c]), acc[c]);
                acc[c] = _mm256_fnmadd_ps(_mm256_mul_ps(dmin, dy), _mm256_cvtepi32_ps(msum[c]), acc[c]);
            }
        }
        x16a_store(s, bs, acc, h, nr, nc);
    }
}
#define X16A_Q2_K(NC) x16a_q2_K_nc(n, s, bs, vx, nr, y, by, NC)
ED_X16A_ENTRY(x16a_gemm_q2_K, X16A_Q2_K)
#undef X16A_Q2_K

/* Q6_K: the AVX-512 kernel's plan (x16_q6_K_nc, the layout's offsets Q6K_*) with vpmaddubsw. The quants
 * are unsigned (0..63), so two vpmaddubsw of a sub-block sum in int16 (at most 2 * 2 * 63 * 128 = 32256:
 * exact) before vpmaddwd against the row's scale in both halves of its lane; isum - 32 * msum and the float
 * step are x16_q6_K_nc's, so the bits are the AVX-512 kernel's. */

/* a chunk of rows 8hh..8hh+7: its ql pair (a: ql[4i..] of half h, b: ql[32 + 4i..]) and qh fields
 * (lo = qh & 0x33, hi = (qh >> 2) & 0x33), as x16_q6_K_nc's Q6K_LOAD */
typedef struct {
    __m256i a, b, lo, hi;
} x16a_q6_chunk;

ED_ALWAYS_INLINE x16a_q6_chunk x16a_q6_load(const uint8_t *g, int h, int i, int hh) {
    const __m256i m33 = _mm256_set1_epi8(0x33), qh = x16a_load(g + Q6K_QH + 64 * (8 * h + i) + 32 * hh);
    return (x16a_q6_chunk){x16a_load(g + Q6K_QL + 64 * (16 * h + i) + 32 * hh),
                           x16a_load(g + Q6K_QL + 64 * (16 * h + 8 + i) + 32 * hh), _mm256_and_si256(qh, m33),
                           _mm256_and_si256(_mm256_srli_epi16(qh, 2), m33)};
}

/* quarter t's quants of a chunk: x16_q6_quants with and/andnot/or for the select */
ED_ALWAYS_INLINE __m256i x16a_q6_quants(const x16a_q6_chunk *c, int t, __m256i m4) {
    switch (t) {
    case 0: return _mm256_or_si256(_mm256_and_si256(c->a, m4), _mm256_andnot_si256(m4, _mm256_slli_epi16(c->lo, 4)));
    case 1: return _mm256_or_si256(_mm256_and_si256(c->b, m4), _mm256_andnot_si256(m4, _mm256_slli_epi16(c->hi, 4)));
    case 2: return _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(c->a, 4), m4), _mm256_andnot_si256(m4, c->lo));
    default: return _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(c->b, 4), m4), _mm256_andnot_si256(m4, c->hi));
    }
}

/* a half's scale pairs (sc_2i, sc_2i+1) as 8 lanes of (sc_s, sc_s), s = 2i + odd */
static inline __m256i x16a_q6_scale(const uint8_t *p, int odd) {
    const __m256i x = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p));
    return odd ? _mm256_blend_epi16(_mm256_srli_epi32(x, 16), x, 0xAA)
               : _mm256_blend_epi16(x, _mm256_slli_epi32(x, 16), 0xAA);
}

/* a super-block's float step of rows 8hh..8hh+7 for Q6_K (quants + 32: shift 5) and Q3_K (+ 4: shift 2), as
 * x16_k16_finish: msum from the scale pairs against the bsums, acc = fma(d_w * d_y, isum - (msum << shift)) */
ED_ALWAYS_INLINE void x16a_k16_finish(__m256 *acc, const __m256i *isum, const uint8_t *g, int hh, const uint8_t *vy,
                                      size_t by, int b, const int nc, const int shift) {
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(g + 16 * hh)));
    for (int c = 0; c < nc; c++) {
        const block_q8_K *y = (const block_q8_K *)(vy + c * by) + b;
        int32_t pairs[8];
        memcpy(pairs, y->bsums, sizeof(pairs));
        __m256i msum = _mm256_setzero_si256();
        for (int i = 0; i < 8; i++) {
            const __m256i p = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(g + Q6K_SC + 32 * i + 16 * hh)));
            msum = _mm256_add_epi32(msum, _mm256_madd_epi16(p, _mm256_set1_epi32(pairs[i])));
        }
        const __m256i total = _mm256_sub_epi32(isum[c], _mm256_slli_epi32(msum, shift));
        acc[c] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(y->d)), _mm256_cvtepi32_ps(total), acc[c]);
    }
}

ED_ALWAYS_INLINE void x16a_q6_K_nc(int n, float *s, size_t bs, const uint8_t *vx, int nr, const uint8_t *vy,
                                   size_t by, const int nc) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256 acc[2][ED_X16A_NC];
    for (int hh = 0; hh < 2; hh++)
        for (int c = 0; c < nc; c++) acc[hh][c] = _mm256_setzero_ps();
    for (int b = 0; b < n / QK_K; b++) {
        const uint8_t *g = vx + (size_t)b * Q6K_GROUP;
        if (nc == 1)
            for (size_t off = 0; off < Q6K_GROUP; off += 64) __builtin_prefetch(g + x16a_pf_far + off);
        for (int hh = 0; hh * 8 < nr; hh++) { /* rows 8hh..8hh+7: the low or high 32 bytes of each chunk */
            __m256i isum[ED_X16A_NC];
            for (int c = 0; c < nc; c++) isum[c] = _mm256_setzero_si256();
            if (nc == 1) { /* decode: each chunk's loads and qh fields once for its 4 quarters */
                const int8_t *yq = ((const block_q8_K *)vy)[b].qs;
                for (int hq = 0; hq < 4; hq++) {
                    const int h = hq / 2, q = hq % 2;
                    __m256i sc[4], part[4];
                    for (int t = 0; t < 4; t++) {
                        sc[t] = x16a_q6_scale(g + Q6K_SC + 32 * (4 * h + t) + 16 * hh, q);
                        part[t] = _mm256_setzero_si256();
                    }
                    for (int k = 0; k < 4; k++) {
                        const x16a_q6_chunk ch = x16a_q6_load(g, h, 4 * q + k, hh);
                        for (int t = 0; t < 4; t++) {
                            const __m256i w = x16a_q6_quants(&ch, t, m4);
                            const __m256i y = x16a_bcast4(yq + 16 * (8 * h + 2 * t + q) + 4 * k);
                            part[t] = _mm256_add_epi16(part[t], _mm256_maddubs_epi16(w, y));
                        }
                        if (k & 1) /* two products per int16 sum at most */
                            for (int t = 0; t < 4; t++) {
                                isum[0] = _mm256_add_epi32(isum[0], _mm256_madd_epi16(part[t], sc[t]));
                                part[t] = _mm256_setzero_si256();
                            }
                    }
                }
            } else {
#pragma GCC unroll 16
                for (int sb = 0; sb < 16; sb++) { /* sub-block sb: half h, quarter t of the half's 128, q */
                    const int h = sb / 8, t = sb % 8 / 2, q = sb % 2;
                    __m256i w[4];
                    for (int k = 0; k < 4; k++) {
                        const x16a_q6_chunk ch = x16a_q6_load(g, h, 4 * q + k, hh);
                        w[k] = x16a_q6_quants(&ch, t, m4);
                    }
                    const __m256i sc = x16a_q6_scale(g + Q6K_SC + 32 * (sb / 2) + 16 * hh, sb & 1);
                    for (int c = 0; c < nc; c++) {
                        const int8_t *yq = ((const block_q8_K *)(vy + c * by))[b].qs + 16 * sb;
                        const __m256i p01 = _mm256_add_epi16(_mm256_maddubs_epi16(w[0], x16a_bcast4(yq)),
                                                             _mm256_maddubs_epi16(w[1], x16a_bcast4(yq + 4)));
                        const __m256i p23 = _mm256_add_epi16(_mm256_maddubs_epi16(w[2], x16a_bcast4(yq + 8)),
                                                             _mm256_maddubs_epi16(w[3], x16a_bcast4(yq + 12)));
                        isum[c] = _mm256_add_epi32(isum[c], _mm256_add_epi32(_mm256_madd_epi16(p01, sc), _mm256_madd_epi16(p23, sc)));
                    }
                }
            }
            x16a_k16_finish(acc[hh], isum, g, hh, vy, by, b, nc, 5);
        }
    }
    for (int hh = 0; hh * 8 < nr; hh++) x16a_store(s, bs, acc[hh], hh, nr, nc);
}
#define X16A_Q6_K(NC) x16a_q6_K_nc(n, s, bs, vx, nr, y, by, NC)
ED_X16A_ENTRY(x16a_gemm_q6_K, X16A_Q6_K)
#undef X16A_Q6_K

/* Q3_K: the AVX-512 kernel's plan (x16_q3_K_nc, the layout's offsets Q3K_*) with vpmaddubsw, a half of 8
 * rows at a time as Q2_K's: the quants as q + 4 (0..7), 4 vpmaddubsw of a sub-block summed in int16 (at
 * most 4 * 2 * 7 * 128 = 7168: exact), vpmaddwd against the rows' scale in both halves of its lane;
 * isum - 4 * msum and the float step are x16_q3_K_nc's, so the bits are the AVX-512 kernel's. */
ED_ALWAYS_INLINE void x16a_q3_K_nc(int n, float *s, size_t bs, const uint8_t *vx, int nr, const uint8_t *vy,
                                   size_t by, const int nc) {
    const __m256i m3 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
    for (int hh = 0; hh * 8 < nr; hh++) {
        __m256 acc[ED_X16A_NC];
        for (int c = 0; c < nc; c++) acc[c] = _mm256_setzero_ps();
        for (int b = 0; b < n / QK_K; b++) {
            const uint8_t *g = vx + (size_t)b * Q3K_GROUP;
            __m256i isum[ED_X16A_NC];
            for (int c = 0; c < nc; c++) isum[c] = _mm256_setzero_si256();
#pragma GCC unroll 16
            for (int sb = 0; sb < 16; sb++) { /* sub-block sb = 8n + 2j + h */
                const int j = sb % 8 / 2, h = sb % 2;
                const uint8_t *q = g + Q3K_QS + 64 * (8 * (sb / 8) + 4 * h) + 32 * hh, *hm = g + Q3K_HM + 64 * 4 * h + 32 * hh;
                const __m128i shift = _mm_cvtsi32_si128(2 * j), hshift = _mm_cvtsi32_si128(4 * (sb / 8) + j);
                const __m256i sc = x16a_q6_scale(g + Q3K_SC + 32 * (sb / 2) + 16 * hh, sb & 1);
                __m256i part[ED_X16A_NC];
                for (int c = 0; c < nc; c++) part[c] = _mm256_setzero_si256();
                for (int k = 0; k < 4; k++) {
                    const __m256i lo = _mm256_and_si256(_mm256_srl_epi16(x16a_load(q + 64 * k), shift), m3);
                    const __m256i hi = _mm256_and_si256(_mm256_srl_epi16(x16a_load(hm + 64 * k), hshift), one);
                    const __m256i w = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 2)); /* bytes 0/1 << 2: no carry */
                    for (int c = 0; c < nc; c++) {
                        const __m256i y = x16a_bcast4(((const block_q8_K *)(vy + c * by))[b].qs + 16 * sb + 4 * k);
                        part[c] = _mm256_add_epi16(part[c], _mm256_maddubs_epi16(w, y));
                    }
                }
                for (int c = 0; c < nc; c++) isum[c] = _mm256_add_epi32(isum[c], _mm256_madd_epi16(part[c], sc));
            }
            x16a_k16_finish(acc, isum, g, hh, vy, by, b, nc, 2);
        }
        x16a_store(s, bs, acc, hh, nr, nc);
    }
}
#define X16A_Q3_K(NC) x16a_q3_K_nc(n, s, bs, vx, nr, y, by, NC)
ED_X16A_ENTRY(x16a_gemm_q3_K, X16A_Q3_K)
#undef X16A_Q3_K
#undef X16A_Q4_0
#undef X16A_Q4_1
#undef X16A_Q5_0
#undef X16A_Q5_1
#undef X16A_Q8_0
#undef X16A_IQ4_NL
#undef ED_X16A_ENTRY

/* Every x16 type. The K-quants' decode kernels read each weight line once and build each vector once
 * (x16a_q4_K_1, x16a_q6_K_nc's nc == 1 branch): 1 thread on a Zen 4 at the AVX2 level streams Q4_K at
 * 26 GB/s against 16.5 for the file layout's vec_dot, Q6_K at par (21); Qwen2.5-Coder-1.5B (Q4_K_M) gains
 * pp128 68 -> 102 tok/s and tg ~25 -> ~32 (2 threads). An earlier version (h outer, one sub-block at a
 * time, for decode too) decoded at 0.6-0.7x the file layout. The legacy blocks gain in both (SmolLM2
 * Q4_0: pp128 394 -> 832, tg 141 -> 215). */
static void set_x16_avx2(ed_kernel_table *t) {
    x16a_pf_far = ed_env_bytes("EDGELLM_PF_AVX2", ed_cpu_is_intel() ? 2048 : 8192);
    x16a_pf_q4_K = ed_env_bytes("EDGELLM_PF_AVX2_Q4K", !ed_cpu_is_intel() && ed_cpu_family() >= 0x1A ? 2048 : 0);
    t->types[ED_Q4_0].x16_gemm = x16a_gemm_q4_0;
    t->types[ED_Q4_1].x16_gemm = x16a_gemm_q4_1;
    t->types[ED_Q5_0].x16_gemm = x16a_gemm_q5_0;
    t->types[ED_Q5_1].x16_gemm = x16a_gemm_q5_1;
    t->types[ED_Q8_0].x16_gemm = x16a_gemm_q8_0;
    t->types[ED_IQ4_NL].x16_gemm = x16a_gemm_iq4_nl;
    t->types[ED_Q2_K].x16_gemm = x16a_gemm_q2_K;
    t->types[ED_Q3_K].x16_gemm = x16a_gemm_q3_K;
    t->types[ED_Q4_K].x16_gemm = x16a_gemm_q4_K;
    t->types[ED_Q5_K].x16_gemm = x16a_gemm_q5_K;
    t->types[ED_Q6_K].x16_gemm = x16a_gemm_q6_K;
    if (ed_cpu_has_avxvnni()) ed_set_x16_avxvnni(t); /* Q4_0 .. Q8_0, IQ4_NL by vpdpbusd (avx2_vnni.c) */
}
