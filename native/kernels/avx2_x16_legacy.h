/* The legacy types' repacked (x16) GEMM at the AVX2 level (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL) and the
 * helpers the other x16 kernels share, included under a target pragma by avx2.c (through avx2_x16.h: the
 * integer dots by vpmaddubsw pairs) and by avx2_vnni.c (with ED_X16A_VNNI defined: by AVX-VNNI's VEX
 * vpdpbusd, one instruction where vpmaddubsw, an int16 add and vpmaddwd took three). Both sum the same
 * integers, so they give the same bits (and the AVX-512 kernels' of avx512_x16.h).
 */
#define ED_X16A_NC 4 /* activation rows per call: 4 int sums, 4 float sums and the weights in 16 ymm */

static inline __m256i x16a_bcast4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

static inline __m256i x16a_load(const uint8_t *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* 32 bits -> 32 bytes, 0xFF where the bit is set (ggml bytes_from_bits_32) */
static inline __m256i bits32(const uint8_t *p) {
    uint32_t x;
    memcpy(&x, p, 4);
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32((int)x), shuf);
    b = _mm256_or_si256(b, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    return _mm256_cmpeq_epi8(b, _mm256_set1_epi64x(-1));
}

/* the sums of one half's 8 rows (row 8h + r) against nc rows to s[c * bs + 8h + r], r < nr - 8h */
static inline void x16a_store(float *s, size_t bs, const __m256 *acc, int h, int nr, int nc) {
    const int n = nr - 8 * h < 8 ? nr - 8 * h : 8;
    for (int c = 0; c < nc; c++) {
        if (n == 8) {
            _mm256_storeu_ps(s + c * bs + 8 * h, acc[c]);
        } else if (n > 0) {
            float t[8];
            _mm256_storeu_ps(t, acc[c]);
            memcpy(s + c * bs + 8 * h, t, sizeof(float) * (size_t)n);
        }
    }
}

/* a half's weight vector v (0..7) of a legacy group block's quants q, as the AVX-512 kernels' w[v]: for
 * nibble types chunk v / 2, low nibbles for even v (activation bytes 4 * (v / 2)), high for odd
 * (16 + 4 * (v / 2)); Q8_0 chunk v (bytes 4v). Q5_0's and Q5_1's fifth bits (64-bit mask v, 32 bits a
 * half) are 64 bytes of masks before their nibbles. Signed kinds come back signed, or with `biased`
 * unsigned, + 128 (Q8_0's bytes as stored; IQ4_NL's values). */
ED_ALWAYS_INLINE __m256i x16a_vector(int type, const uint8_t *q, int h, int v, const int biased) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), bias = _mm256_set1_epi8((char)0x80);
    if (type == ED_Q8_0) return biased ? x16a_load(q + 64 * v + 32 * h) : _mm256_xor_si256(x16a_load(q + 64 * v + 32 * h), bias);
    const int q5 = type == ED_Q5_0 || type == ED_Q5_1;
    const uint8_t *nib = q + (q5 ? 64 : 0) + 64 * (v / 2) + 32 * h;
    __m256i w = _mm256_and_si256(v & 1 ? _mm256_srli_epi16(x16a_load(nib), 4) : x16a_load(nib), m4);
    if (q5) w = _mm256_or_si256(w, _mm256_and_si256(bits32(q + 8 * v + 4 * h), _mm256_set1_epi8(16)));
    if (type == ED_IQ4_NL) {
        const __m256i values = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)ed_kvalues_iq4nl));
        w = _mm256_shuffle_epi8(biased ? _mm256_xor_si256(values, bias) : values, w);
    }
    return w;
}

/* Q4_0, Q5_0, Q8_0, IQ4_NL (against Q8_0 and its side table), Q4_1 and Q5_1 (against Q8_1, their mins
 * after the scales: acc = fma(m_w, s_y, acc) after each block's product, as x16_q4_1_nc): nr (<= 16) rows of a group
 * against nc (<= ED_X16A_NC) activation rows. The integer sum of a block starts from -offset x the
 * activation block's sum (Q4_0 8, Q5_0 16; with vpdpbusd Q8_0 and IQ4_NL 128 too, their bytes biased). */
ED_ALWAYS_INLINE void x16a_legacy_nc(int type, int n, float *s, size_t bs, const uint8_t *vx, int nr, const uint8_t *vy,
                                     size_t by, const uint8_t *side, size_t side_row, const int nc) {
    const int q41 = type == ED_Q4_1 || type == ED_Q5_1; /* against Q8_1, with mins */
    const int nb = n / QK, qbytes = type == ED_Q8_0 ? 32 : type == ED_Q5_0 ? 20 : type == ED_Q5_1 ? 22 : q41 ? 18 : 16;
#if defined(ED_X16A_VNNI)
    const int off = type == ED_Q4_0 ? 8 : type == ED_Q5_0 ? 16 : type == ED_Q8_0 || type == ED_IQ4_NL ? 128 : 0;
#else
    const int off = type == ED_Q4_0 ? 8 : type == ED_Q5_0 ? 16 : 0;
    const int uns = off || q41;                           /* unsigned quants; the others are signed */
    const int per16 = type == ED_Q4_0 || type == ED_Q4_1 ? 8 : 4; /* vectors summed in int16 */
    const __m256i ones = _mm256_set1_epi16(1);
#endif
    const size_t gb = (size_t)ED_X16_ROWS * (2 + qbytes), yb = q41 ? sizeof(block_q8_1) : sizeof(block_q8_0);
    for (int h = 0; h * 8 < nr; h++) {
        __m256 acc[ED_X16A_NC];
        for (int c = 0; c < nc; c++) acc[c] = _mm256_setzero_ps();
        for (int b = 0; b < nb; b++) {
            const uint8_t *g = vx + (size_t)b * gb;
            __m256i isum[ED_X16A_NC], part[ED_X16A_NC]; /* part: int16 sums, or vpdpbusd's second chain */
            for (int c = 0; c < nc; c++) {
                const int32_t *ys = off ? (const int32_t *)((const float *)(side + c * side_row) + nb) : NULL;
                isum[c] = _mm256_set1_epi32(off ? -off * ys[b] : 0);
                part[c] = _mm256_setzero_si256();
            }
            for (int v = 0; v < 8; v++) {
#if defined(ED_X16A_VNNI)
                const __m256i w = x16a_vector(type, g + (q41 ? Q41_QS : 32), h, v, 1);
#else
                const __m256i w = x16a_vector(type, g + (q41 ? Q41_QS : 32), h, v, 0);
                const __m256i aw = uns ? w : _mm256_sign_epi8(w, w);
#endif
                const int yo = type == ED_Q8_0 ? 4 * v : (v & 1) * 16 + 4 * (v / 2);
                for (int c = 0; c < nc; c++) {
                    const uint8_t *yblk = vy + c * by + (size_t)b * yb;
                    const __m256i y = x16a_bcast4((const int8_t *)yblk + (q41 ? 4 : 2) + yo); /* past d (, s) */
#if defined(ED_X16A_VNNI)
                    if (v & 1) part[c] = _mm256_dpbusd_avx_epi32(part[c], w, y);
                    else isum[c] = _mm256_dpbusd_avx_epi32(isum[c], w, y);
#else
                    const __m256i p = _mm256_maddubs_epi16(aw, uns ? y : _mm256_sign_epi8(y, w));
                    if (!uns) {
                        isum[c] = _mm256_add_epi32(isum[c], _mm256_madd_epi16(p, ones));
                    } else {
                        part[c] = _mm256_add_epi16(part[c], p);
                        if (v % per16 == per16 - 1) {
                            isum[c] = _mm256_add_epi32(isum[c], _mm256_madd_epi16(part[c], ones));
                            part[c] = _mm256_setzero_si256();
                        }
                    }
#endif
                }
            }
#if defined(ED_X16A_VNNI)
            for (int c = 0; c < nc; c++) isum[c] = _mm256_add_epi32(isum[c], part[c]);
#endif
            const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(g + 16 * h)));
            for (int c = 0; c < nc; c++) {
                if (q41) {
                    const block_q8_1 *y = (const block_q8_1 *)(vy + c * by) + b;
                    const __m256 mw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(g + Q41_MIN + 16 * h)));
                    const __m256 sc = _mm256_mul_ps(dw, _mm256_set1_ps(ed_f16_to_f32(y->d)));
                    acc[c] = _mm256_fmadd_ps(sc, _mm256_cvtepi32_ps(isum[c]), acc[c]);
                    acc[c] = _mm256_fmadd_ps(mw, _mm256_set1_ps(ed_f16_to_f32(y->s)), acc[c]);
                } else {
                    const float *yd = (const float *)(side + c * side_row);
                    const __m256 sc = _mm256_mul_ps(dw, _mm256_set1_ps(yd[b]));
                    acc[c] = _mm256_fmadd_ps(sc, _mm256_cvtepi32_ps(isum[c]), acc[c]);
                }
            }
        }
        x16a_store(s, bs, acc, h, nr, nc);
    }
}

/* x16_gemm entries: nc in calls of ED_X16A_NC, then the rest (a constant per instance) */
#define ED_X16A_ENTRY(name, CALL)                                                                           \
    static void name(int n, float *s, size_t bs, const void *vx, int nr, const void *vy, size_t by,           \
                     const void *side, size_t side_row, int nc) {                                             \
        const uint8_t *y = vy, *sd = side;                                                                    \
        (void)sd, (void)side_row;                                                                             \
        for (; nc >= ED_X16A_NC; nc -= ED_X16A_NC, s += ED_X16A_NC * bs, y += ED_X16A_NC * by,                \
                                 sd += sd ? ED_X16A_NC * side_row : 0)                                         \
            CALL(ED_X16A_NC);                                                                                 \
        if (nc == 3) CALL(3);                                                                                 \
        else if (nc == 2) CALL(2);                                                                            \
        else if (nc == 1) CALL(1);                                                                            \
    }
