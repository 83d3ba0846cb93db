/* The repacked (x16) GEMM at the AVX2 level, included by avx2.c under its target pragma: the layout of
 * ed_kernels.h read as two halves of 8 rows (a 64-byte chunk's low 32 bytes are rows 0..7, its high 32
 * rows 8..15), one int32 lane per weight row. Without vpdpbusd the integer dots are vpmaddubsw pairs:
 * unsigned quants (Q4_0, Q5_0) sum a few products in int16 before vpmaddwd widens them, where they
 * cannot overflow (8 or 4 vectors: at most 8 * 2 * 15 * 127 or 4 * 2 * 31 * 127);
 * signed ones (Q8_0, IQ4_NL) take |w| * (y with w's sign), ggml's mul_sum_i8_pairs, widened at once. The
 * integers are exact, so every lane's float steps (convert, scale product, FMA per block or super-block)
 * are the AVX-512 kernels' (avx512_x16.h) and give their bits: kernel_check's x16_ref checks both.
 */
#define ED_X16A_NC 4 /* activation rows per call: 4 int sums, 4 float sums and the weights in 16 ymm */

static inline __m256i x16a_bcast4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

static inline __m256i x16a_load(const uint8_t *p) { return _mm256_loadu_si256((const __m256i *)p); }

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
 * (16 + 4 * (v / 2)); Q8_0 chunk v (bytes 4v). Q5_0's fifth bits (64-bit mask v, 32 bits a half) follow
 * 64 bytes of masks before its nibbles. Signed kinds come back signed. */
ED_ALWAYS_INLINE __m256i x16a_vector(int type, const uint8_t *q, int h, int v) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    if (type == ED_Q8_0) return _mm256_xor_si256(x16a_load(q + 64 * v + 32 * h), _mm256_set1_epi8((char)0x80));
    const uint8_t *nib = q + (type == ED_Q5_0 ? 64 : 0) + 64 * (v / 2) + 32 * h;
    __m256i w = _mm256_and_si256(v & 1 ? _mm256_srli_epi16(x16a_load(nib), 4) : x16a_load(nib), m4);
    if (type == ED_Q5_0) w = _mm256_or_si256(w, _mm256_and_si256(bits32(q + 8 * v + 4 * h), _mm256_set1_epi8(16)));
    if (type == ED_IQ4_NL) {
        const __m256i values = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)ed_kvalues_iq4nl));
        w = _mm256_shuffle_epi8(values, w);
    }
    return w;
}

/* Q4_0, Q5_0, Q8_0, IQ4_NL: nr (<= 16) rows of a group against nc (<= ED_X16A_NC) activation rows */
ED_ALWAYS_INLINE void x16a_legacy_nc(int type, int n, float *s, size_t bs, const uint8_t *vx, int nr, const uint8_t *vy,
                                     size_t by, const uint8_t *side, size_t side_row, const int nc) {
    const int nb = n / QK, qbytes = type == ED_Q8_0 ? 32 : type == ED_Q5_0 ? 20 : 16;
    const int off = type == ED_Q4_0 ? 8 : type == ED_Q5_0 ? 16 : 0; /* signed kinds: no offset */
    const int per16 = type == ED_Q4_0 ? 8 : 4;                       /* vectors summed in int16 */
    const size_t gb = (size_t)ED_X16_ROWS * (2 + qbytes);
    const __m256i ones = _mm256_set1_epi16(1);
    for (int h = 0; h * 8 < nr; h++) {
        __m256 acc[ED_X16A_NC];
        for (int c = 0; c < nc; c++) acc[c] = _mm256_setzero_ps();
        for (int b = 0; b < nb; b++) {
            const uint8_t *g = vx + (size_t)b * gb;
            __m256i isum[ED_X16A_NC], part[ED_X16A_NC];
            for (int c = 0; c < nc; c++) {
                const int32_t *ys = (const int32_t *)((const float *)(side + c * side_row) + nb);
                isum[c] = _mm256_set1_epi32(-off * ys[b]);
                part[c] = _mm256_setzero_si256();
            }
            for (int v = 0; v < 8; v++) {
                const __m256i w = x16a_vector(type, g + 32, h, v);
                const int yo = type == ED_Q8_0 ? 4 * v : (v & 1) * 16 + 4 * (v / 2);
                const __m256i aw = off ? w : _mm256_sign_epi8(w, w);
                for (int c = 0; c < nc; c++) {
                    const __m256i y = x16a_bcast4(((const block_q8_0 *)(vy + c * by))[b].qs + yo);
                    const __m256i p = _mm256_maddubs_epi16(aw, off ? y : _mm256_sign_epi8(y, w));
                    if (!off) {
                        isum[c] = _mm256_add_epi32(isum[c], _mm256_madd_epi16(p, ones));
                    } else {
                        part[c] = _mm256_add_epi16(part[c], p);
                        if (v % per16 == per16 - 1) {
                            isum[c] = _mm256_add_epi32(isum[c], _mm256_madd_epi16(part[c], ones));
                            part[c] = _mm256_setzero_si256();
                        }
                    }
                }
            }
            const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(g + 16 * h)));
            for (int c = 0; c < nc; c++) {
                const float *yd = (const float *)(side + c * side_row);
                const __m256 sc = _mm256_mul_ps(dw, _mm256_set1_ps(yd[b]));
                acc[c] = _mm256_fmadd_ps(sc, _mm256_cvtepi32_ps(isum[c]), acc[c]);
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
#define X16A_Q4_0(NC) x16a_legacy_nc(ED_Q4_0, n, s, bs, vx, nr, y, by, sd, side_row, NC)
#define X16A_Q5_0(NC) x16a_legacy_nc(ED_Q5_0, n, s, bs, vx, nr, y, by, sd, side_row, NC)
#define X16A_Q8_0(NC) x16a_legacy_nc(ED_Q8_0, n, s, bs, vx, nr, y, by, sd, side_row, NC)
#define X16A_IQ4_NL(NC) x16a_legacy_nc(ED_IQ4_NL, n, s, bs, vx, nr, y, by, sd, side_row, NC)
ED_X16A_ENTRY(x16a_gemm_q4_0, X16A_Q4_0)
ED_X16A_ENTRY(x16a_gemm_q5_0, X16A_Q5_0)
ED_X16A_ENTRY(x16a_gemm_q8_0, X16A_Q8_0)
ED_X16A_ENTRY(x16a_gemm_iq4_nl, X16A_IQ4_NL)
#undef X16A_Q4_0
#undef X16A_Q5_0
#undef X16A_Q8_0
#undef X16A_IQ4_NL
#undef ED_X16A_ENTRY

/* Legacy blocks only: AVX2 versions of the Q4_K and Q6_K kernels (the same integer plan, int16 partial
 * sums) gave prompts 1.5x but decode 0.6-0.7x the file layout's vec_dot (Qwen2.5-Coder-1.5B tg 13-15 vs
 * 21-24 tok/s at the AVX2 level of a Zen 4), and one kernel serves both, so K-quants keep the file's
 * layout here. The legacy blocks gain in both (SmolLM2 Q4_0: pp128 394 -> 832, tg 141 -> 215). */
static void set_x16_avx2(ed_kernel_table *t) {
    t->types[ED_Q4_0].x16_gemm = x16a_gemm_q4_0;
    t->types[ED_Q5_0].x16_gemm = x16a_gemm_q5_0;
    t->types[ED_Q8_0].x16_gemm = x16a_gemm_q8_0;
    t->types[ED_IQ4_NL].x16_gemm = x16a_gemm_iq4_nl;
}
