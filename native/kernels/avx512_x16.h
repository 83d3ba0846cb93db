/* The repacked (x16) GEMM at the AVX-512 VNNI level, included by avx512.c under its VNNI target: one
 * int32 lane per weight row of a 16-row group (ed_kernels.h has the layout), so a block's whole integer
 * dot for 16 rows is 8 vpdpbusd of the unpacked weight bytes with a broadcast 4-byte step of the
 * activation, and the float work is one convert, one scale product and one FMA per block and activation
 * row for all 16 rows (vec_dot's layout spends those per 4 products). The weights are unsigned (Q4_0: q,
 * IQ4_NL: value + 128, Q8_0: q + 128) and each row's sum starts at -offset * Σy (the side table's sums),
 * so the integer dot is exact. Per output: acc = fma(d_w * d_y, (float) isum, acc) over the blocks in
 * order, the order of kernel_check's scalar x16 reference, whatever nc, so decode (nc = 1) and prompts
 * give the same bits.
 *
 * ggml-org/llama.cpp ggml/src/ggml-cpu/arch/x86/repack.cpp (ggml_gemm_q4_0_8x8_q8_0) is the same idea
 * with 8-row interleaves and per-4-row sums; this file is written for one vpdpbusd per 4 quants.
 */
#define ED_X16_NC 8 /* activation rows per call: 8 float sums, 8 unpacked weight vectors */

/* decode (nc <= 2) is a stream through the weights: `ahead` bytes further on, a block's worth of lines is
 * prefetched (prefetches never fault, so the last group's reach past the end is harmless). The distance
 * is per type, measured on a Zen 4 (2 threads, 300 MB of weights from DRAM, median GB/s of 4 interleaved
 * runs): the legacy types stream at the memory's rate with or without it (2 KiB ahead); Q4_K is faster
 * with none (32.0 against 28.6 at 2 KiB: the hardware prefetcher keeps up, the prefetches only take load
 * slots); Q6_K needs it, further ahead (29.4 at 8 KiB, 25.6 at 2 KiB, ~20 with none). On a Sapphire
 * Rapids-class Xeon (2 vCPU, scripts/bench_native_kernels.py --types Q4_K --shapes 8960x1536 1536x8960
 * 1536x1536 --threads 2 -r 5) Q4_K wants it: 22.6 / 20.1 / 19.1 GB/s at 4 KiB, 21.5 / 19.8 / 18.6 at
 * 2 KiB, 21.9 / 20.1 / 18.4 at 8 KiB, 19.5 / 18.0 / 15.4 with none; Q6_K there is 20-21 GB/s from 4 to
 * 16 KiB. So Q4_K's distance is the CPU vendor's (set_x16). A later interleaved A/B on that Xeon (3 rounds,
 * 8960x1536 and 1536x8960, the machine slower that hour) showed no difference, 17.8-18.9 / 19.0-19.3 GB/s at
 * 4 KiB against 18.7-18.9 / 19.0-19.5 with none: the first sweep's gain may have been the hour's noise.
 * Once the weights were in huge pages (edgellm/hugepages.py), the Xeon wanted both much nearer: 4
 * interleaved rounds of the same command, Q4_K / Q6_K at 1 KiB against 4 / 8 KiB: 24.9-26.6 and 23.6-26.4
 * against 25.0-25.8 and 21.4-23.3 (Q4_K), 22.9-24.5 and 24.3-25.6 against 22.2-23.2 and 20.2-22.3 (Q6_K);
 * Qwen2.5-Coder-1.5B Q4_K_M decode (`edgellm bench -p 0 -n 64`, 3 interleaved rounds) 25.4-25.6 against
 * 22.5-22.9 tok/s; 0.5-2 KiB all gave 24-25 and no Q4_K prefetch 22.8. So on Intel Q4_K, Q5_K and Q6_K
 * prefetch 1 KiB ahead; AMD keeps the Zen 4 figures (set_x16). A Zen 5 (EPYC, family 0x1A, 2 vCPU, weights
 * in huge pages) wants a Q4_K prefetch too: Qwen2.5-Coder-1.5B Q4_K_M decode (`edgellm bench -p 0 -n 64 -r 3`,
 * 8 interleaved rounds, EDGELLM_PF_Q4K) at 2 KiB 43.3-61.7 tok/s (median 46.3), 4 KiB 44.4-62.8 (45.8),
 * none 35.6-46.9 (38.8); 0.5-1 KiB as 2 KiB, Q6_K 1-8 KiB all alike. So AMD from family 0x1A on takes
 * 2 KiB; the Zen 3 and Zen 4 (0x19) keep none until measured again with the weights in huge pages. */
#define ED_X16_PF 2048
static size_t x16_pf_q4_K; /* 1024 on Intel, 2048 on AMD from family 0x1A (Zen 5), else 0: set_x16 */
static size_t x16_pf_q6_K; /* Q6_K and Q5_K: 8192 on AMD, 1024 on Intel */
ED_ALWAYS_INLINE void x16_prefetch_next(const uint8_t *g, size_t ahead, size_t block_bytes, int nc) {
    if (ahead && nc <= 2)
        for (size_t off = 0; off < block_bytes; off += 64) __builtin_prefetch(g + ahead + off);
}

/* the sums of nr (<= 16) weight rows against nc activation rows to s[c * bs + r] */
ED_ALWAYS_INLINE void x16_store(float *s, size_t bs, const __m512 *acc, int nr, int nc) {
    for (int c = 0; c < nc; c++) {
        if (nr == ED_X16_ROWS) {
            _mm512_storeu_ps(s + c * bs, acc[c]);
        } else {
            float t[ED_X16_ROWS];
            _mm512_storeu_ps(t, acc[c]);
            memcpy(s + c * bs, t, sizeof(float) * (size_t)nr);
        }
    }
}

/* x16_gemm from a kernel FN(n, s, bs, vx, nr, vy, by, nc) of nc (a constant) <= ED_X16_NC rows */
#define ED_X16_ENTRY(name, FN)                                                                              \
    static void name(int n, float *s, size_t bs, const void *vx, int nr, const void *vy, size_t by,           \
                     const void *side, size_t side_row, int nc) {                                             \
        (void)side, (void)side_row;                                                                           \
        const uint8_t *y = vy;                                                                                \
        for (; nc >= ED_X16_NC; nc -= ED_X16_NC, s += ED_X16_NC * bs, y += ED_X16_NC * by)                    \
            FN(n, s, bs, vx, nr, y, by, ED_X16_NC);                                                           \
        switch (nc) {                                                                                         \
        case 7: FN(n, s, bs, vx, nr, y, by, 7); break;                                                        \
        case 6: FN(n, s, bs, vx, nr, y, by, 6); break;                                                        \
        case 5: FN(n, s, bs, vx, nr, y, by, 5); break;                                                        \
        case 4: FN(n, s, bs, vx, nr, y, by, 4); break;                                                        \
        case 3: FN(n, s, bs, vx, nr, y, by, 3); break;                                                        \
        case 2: FN(n, s, bs, vx, nr, y, by, 2); break;                                                        \
        case 1: FN(n, s, bs, vx, nr, y, by, 1); break;                                                        \
        default: break;                                                                                       \
        }                                                                                                     \
    }

static inline __m512i x16_bcast4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* a 16-row group block's quants as 8 vectors of unsigned bytes, w[j] meeting the activation's bytes at
 * x16_yoff_*[j] */
static const int x16_yoff_q4[8] = {0, 16, 4, 20, 8, 24, 12, 28};
static const int x16_yoff_q8[8] = {0, 4, 8, 12, 16, 20, 24, 28};

static inline void x16_unpack_q4_0(const uint8_t *q, __m512i *w) {
    const __m512i m = _mm512_set1_epi8(0x0F);
    for (int j = 0; j < 4; j++) {
        const __m512i v = _mm512_loadu_si512((const void *)(q + 64 * j));
        w[2 * j] = _mm512_and_si512(v, m);
        w[2 * j + 1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m);
    }
}

static inline void x16_unpack_iq4_nl(const uint8_t *q, __m512i *w) {
    const __m128i u = _mm_loadu_si128((const __m128i *)ed_x16_iq4nl_u8);
    const __m512i values = _mm512_broadcast_i32x4(u), m = _mm512_set1_epi8(0x0F);
    for (int j = 0; j < 4; j++) {
        const __m512i v = _mm512_loadu_si512((const void *)(q + 64 * j));
        w[2 * j] = _mm512_shuffle_epi8(values, _mm512_and_si512(v, m));
        w[2 * j + 1] = _mm512_shuffle_epi8(values, _mm512_and_si512(_mm512_srli_epi16(v, 4), m));
    }
}

/* Q5_0: Q4_0's nibbles, + 16 where the block's fifth-bit mask for that vector says so */
static inline void x16_unpack_q5_0(const uint8_t *q, __m512i *w) {
    x16_unpack_q4_0(q + 64, w);
    for (int h = 0; h < 8; h++) {
        uint64_t k;
        memcpy(&k, q + 8 * h, 8);
        w[h] = _mm512_mask_add_epi8(w[h], (__mmask64)k, w[h], _mm512_set1_epi8(16));
    }
}

static inline void x16_unpack_q8_0(const uint8_t *q, __m512i *w) {
    for (int j = 0; j < 8; j++) w[j] = _mm512_loadu_si512((const void *)(q + 64 * j));
}

#define ED_X16_GEMM(name, QBYTES, UNPACK, YOFF, OFF)                                                           \
    ED_ALWAYS_INLINE void x16_##name##_nc(int n, float *s, size_t bs, const uint8_t *vx, int nr,                \
                                          const uint8_t *vy, size_t by, const uint8_t *side, size_t side_row,    \
                                          const int nc) {                                                       \
        const int nb = n / QK;                                                                                  \
        const size_t gb = ED_X16_ROWS * (2 + QBYTES);                                                           \
        __m512 acc[ED_X16_NC];                                                                                  \
        for (int c = 0; c < nc; c++) acc[c] = _mm512_setzero_ps();                                              \
        for (int b = 0; b < nb; b++) {                                                                          \
            const uint8_t *g = vx + (size_t)b * gb;                                                             \
            x16_prefetch_next(g, ED_X16_PF, gb, nc);                                                          \
            const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)g));                        \
            __m512i w[8];                                                                                       \
            UNPACK(g + 2 * ED_X16_ROWS, w);                                                                     \
            for (int c = 0; c < nc; c++) {                                                                      \
                const int8_t *yq = ((const block_q8_0 *)(vy + c * by))[b].qs;                                   \
                const float *yd = (const float *)(side + c * side_row);                                         \
                const int32_t *ys = (const int32_t *)(yd + nb);                                                 \
                __m512i i0 = _mm512_set1_epi32(-(OFF) * ys[b]), i1 = _mm512_setzero_si512();                    \
                for (int j = 0; j < 8; j += 2) {                                                                \
                    i0 = _mm512_dpbusd_epi32(i0, w[j], x16_bcast4(yq + YOFF[j]));                               \
                    i1 = _mm512_dpbusd_epi32(i1, w[j + 1], x16_bcast4(yq + YOFF[j + 1]));                       \
                }                                                                                               \
                const __m512 sc = _mm512_mul_ps(dw, _mm512_set1_ps(yd[b]));                                     \
                acc[c] = _mm512_fmadd_ps(sc, _mm512_cvtepi32_ps(_mm512_add_epi32(i0, i1)), acc[c]);             \
            }                                                                                                   \
        }                                                                                                       \
        x16_store(s, bs, acc, nr, nc);                                                                          \
    }                                                                                                           \
    static void x16_gemm_##name(int n, float *s, size_t bs, const void *vx, int nr, const void *vy, size_t by,   \
                                const void *side, size_t side_row, int nc) {                                    \
        const uint8_t *y = vy, *sd = side;                                                                      \
        for (; nc >= ED_X16_NC; nc -= ED_X16_NC, s += ED_X16_NC * bs, y += ED_X16_NC * by,                      \
                                sd += ED_X16_NC * side_row)                                                     \
            x16_##name##_nc(n, s, bs, vx, nr, y, by, sd, side_row, ED_X16_NC);                                  \
        switch (nc) {                                                                                           \
        case 7: x16_##name##_nc(n, s, bs, vx, nr, y, by, sd, side_row, 7); break;                               \
        case 6: x16_##name##_nc(n, s, bs, vx, nr, y, by, sd, side_row, 6); break;                               \
        case 5: x16_##name##_nc(n, s, bs, vx, nr, y, by, sd, side_row, 5); break;                               \
        case 4: x16_##name##_nc(n, s, bs, vx, nr, y, by, sd, side_row, 4); break;                               \
        case 3: x16_##name##_nc(n, s, bs, vx, nr, y, by, sd, side_row, 3); break;                               \
        case 2: x16_##name##_nc(n, s, bs, vx, nr, y, by, sd, side_row, 2); break;                               \
        case 1: x16_##name##_nc(n, s, bs, vx, nr, y, by, sd, side_row, 1); break;                               \
        default: break;                                                                                         \
        }                                                                                                       \
    }

ED_X16_GEMM(q4_0, QK / 2, x16_unpack_q4_0, x16_yoff_q4, 8)
ED_X16_GEMM(iq4_nl, QK / 2, x16_unpack_iq4_nl, x16_yoff_q4, 128)
ED_X16_GEMM(q5_0, QK / 2 + 4, x16_unpack_q5_0, x16_yoff_q4, 16)
ED_X16_GEMM(q8_0, QK, x16_unpack_q8_0, x16_yoff_q8, 128)
#undef ED_X16_GEMM

/* Q4_1 (and Q5_1, q5: Q5_0's masks and nibbles after the mins) against Q8_1: Q4_0's nibbles as they are
 * (no offset), and per block and activation row acc = fma(d_w * d_y, isum, acc), then
 * acc = fma(m_w, s_y, acc) with the Q8_1 block's s = d * Σq */
ED_ALWAYS_INLINE void x16_q4_1_nc(int n, float *s, size_t bs, const uint8_t *vx, int nr, const uint8_t *vy,
                                  size_t by, const int nc, const int q5) {
    const int nb = n / QK;
    const size_t gb = ED_X16_ROWS * (q5 ? sizeof(block_q5_1) : sizeof(block_q4_1));
    __m512 acc[ED_X16_NC];
    for (int c = 0; c < nc; c++) acc[c] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *g = vx + (size_t)b * gb;
        x16_prefetch_next(g, ED_X16_PF, gb, nc);
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)g));
        const __m512 mw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(g + Q41_MIN)));
        __m512i w[8];
        if (q5)
            x16_unpack_q5_0(g + Q41_QS, w);
        else
            x16_unpack_q4_0(g + Q41_QS, w);
        for (int c = 0; c < nc; c++) {
            const block_q8_1 *y = (const block_q8_1 *)(vy + c * by) + b;
            __m512i i0 = _mm512_setzero_si512(), i1 = _mm512_setzero_si512();
            for (int j = 0; j < 8; j += 2) {
                i0 = _mm512_dpbusd_epi32(i0, w[j], x16_bcast4(y->qs + x16_yoff_q4[j]));
                i1 = _mm512_dpbusd_epi32(i1, w[j + 1], x16_bcast4(y->qs + x16_yoff_q4[j + 1]));
            }
            const __m512 sc = _mm512_mul_ps(dw, _mm512_set1_ps(ed_f16_to_f32(y->d)));
            acc[c] = _mm512_fmadd_ps(sc, _mm512_cvtepi32_ps(_mm512_add_epi32(i0, i1)), acc[c]);
            acc[c] = _mm512_fmadd_ps(mw, _mm512_set1_ps(ed_f16_to_f32(y->s)), acc[c]);
        }
    }
    x16_store(s, bs, acc, nr, nc);
}
#define X16_Q4_1(n, s, bs, vx, nr, y, by, nc) x16_q4_1_nc(n, s, bs, vx, nr, y, by, nc, 0)
#define X16_Q5_1(n, s, bs, vx, nr, y, by, nc) x16_q4_1_nc(n, s, bs, vx, nr, y, by, nc, 1)
ED_X16_ENTRY(x16_gemm_q4_1, X16_Q4_1)
ED_X16_ENTRY(x16_gemm_q5_1, X16_Q5_1)
#undef X16_Q4_1
#undef X16_Q5_1

/* Q4_K (and Q5_K, q5: each quant + 16 where its fifth bit is set) against Q8_K, per super-block and row:
 * isum = Σ_j sc_j * (sub-block j's integer dot) (mullo on the widened scale bytes), msum = Σ_j m_j * (the activation's sum over sub-block j) (vpdpwssd on the min
 * pairs against pairs of the activation's bsums added), then acc = fma(d_w * d_y, isum, acc) and
 * acc = fnmadd(dmin_w * d_y, msum, acc): the float steps of ggml's vec_dot_q4_K_q8_K per super-block. All
 * integers are exact: |isum| <= 8 * 63 * 32 * 31 * 128. Each half (sub-block) of a pair is unpacked in
 * turn, so 8 weight vectors and 8 rows' sums fit the registers. */
ED_ALWAYS_INLINE void x16_k_nc(int n, float *s, size_t bs, const uint8_t *vx, int nr, const uint8_t *vy,
                               size_t by, const int nc, const int q5) {
    const int nb = n / QK_K;
    const size_t group = q5 ? Q5K_GROUP : Q4K_GROUP;
    __m512 acc[ED_X16_NC];
    for (int c = 0; c < nc; c++) acc[c] = _mm512_setzero_ps();
    const __m512i m4 = _mm512_set1_epi8(0x0F), m16 = _mm512_set1_epi8(16);
    for (int b = 0; b < nb; b++) {
        const uint8_t *g = vx + (size_t)b * group;
        x16_prefetch_next(g, q5 ? x16_pf_q6_K : x16_pf_q4_K, group, nc); /* Q5_K: as AVX2's (avx2_x16.h) */
        __m512i isum[ED_X16_NC];
        for (int c = 0; c < nc; c++) isum[c] = _mm512_setzero_si512();
        for (int j = 0; j < 8; j++) { /* sub-block j: pair j / 2, low (even) or high (odd) nibbles */
            const uint8_t *q = g + (q5 ? Q5K_QS : Q4K_QS) + 512 * (j / 2);
            __m512i w[8];
            for (int k = 0; k < 8; k++) {
                const __m512i v = _mm512_loadu_si512((const void *)(q + 64 * k));
                w[k] = _mm512_and_si512(j & 1 ? _mm512_srli_epi16(v, 4) : v, m4);
                if (q5) { /* + 16 where bit j of the quant's qh byte is set */
                    const __m512i qh = _mm512_loadu_si512((const void *)(g + Q5K_QH + 64 * k));
                    const __mmask64 hi = _mm512_test_epi8_mask(qh, _mm512_set1_epi8((char)(1 << j)));
                    w[k] = _mm512_mask_add_epi8(w[k], hi, w[k], m16);
                }
            }
            const __m512i sc = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(g + Q4K_SC + 16 * j)));
            for (int c = 0; c < nc; c++) {
                const int8_t *yq = ((const block_q8_K *)(vy + c * by))[b].qs + 32 * j;
                __m512i i0 = _mm512_setzero_si512(), i1 = _mm512_setzero_si512();
                for (int k = 0; k < 8; k += 2) {
                    i0 = _mm512_dpbusd_epi32(i0, w[k], x16_bcast4(yq + 4 * k));
                    i1 = _mm512_dpbusd_epi32(i1, w[k + 1], x16_bcast4(yq + 4 * k + 4));
                }
                isum[c] = _mm512_add_epi32(isum[c], _mm512_mullo_epi32(_mm512_add_epi32(i0, i1), sc));
            }
        }
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)g));
        const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(g + 32)));
        for (int c = 0; c < nc; c++) {
            const block_q8_K *y = (const block_q8_K *)(vy + c * by) + b;
            const __m256i s32 = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y->bsums), _mm256_set1_epi16(1));
            int32_t pairs[4]; /* int16 pairs (sum of sub-block 2i, of 2i + 1) */
            _mm_storeu_si128((__m128i *)pairs,
                             _mm_packs_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1)));
            __m512i msum = _mm512_setzero_si512();
            for (int i = 0; i < 4; i++) {
                const __m512i m = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(g + Q4K_MIN + 32 * i)));
                msum = _mm512_dpwssd_epi32(msum, m, _mm512_set1_epi32(pairs[i]));
            }
            const __m512 dy = _mm512_set1_ps(y->d);
            acc[c] = _mm512_fmadd_ps(_mm512_mul_ps(d, dy), _mm512_cvtepi32_ps(isum[c]), acc[c]);
            acc[c] = _mm512_fnmadd_ps(_mm512_mul_ps(dmin, dy), _mm512_cvtepi32_ps(msum), acc[c]);
        }
    }
    x16_store(s, bs, acc, nr, nc);
}

/* Q2_K against Q8_K (the layout's offsets Q2K_*; avx2_x16.h's x16a_q2_K_nc says which chunks and bytes meet):
 * per super-block and row isum = Σ_sb sc_sb * (sub-block sb's integer dot, 4 vpdpbusd), msum = Σ_sb m_sb *
 * bsum_sb, then acc = fma(d * d_y, isum, acc), acc = fnmadd(dmin * d_y, msum, acc) */
ED_ALWAYS_INLINE void x16_q2_K_nc(int n, float *s, size_t bs, const uint8_t *vx, int nr, const uint8_t *vy,
                                  size_t by, const int nc) {
    __m512 acc[ED_X16_NC];
    for (int c = 0; c < nc; c++) acc[c] = _mm512_setzero_ps();
    const __m512i m3 = _mm512_set1_epi8(3), m15 = _mm512_set1_epi32(15);
    for (int b = 0; b < n / QK_K; b++) {
        const uint8_t *g = vx + (size_t)b * Q2K_GROUP;
        x16_prefetch_next(g, ED_X16_PF, Q2K_GROUP, nc);
        __m512i isum[ED_X16_NC], msum[ED_X16_NC];
        for (int c = 0; c < nc; c++) isum[c] = msum[c] = _mm512_setzero_si512();
        for (int sb = 0; sb < 16; sb++) {
            const uint8_t *q = g + Q2K_QS + 64 * (8 * (sb / 8) + 4 * (sb % 2));
            const __m128i shift = _mm_cvtsi32_si128(2 * (sb % 8 / 2));
            __m512i w[4];
            for (int k = 0; k < 4; k++)
                w[k] = _mm512_and_si512(_mm512_srl_epi16(_mm512_loadu_si512((const void *)(q + 64 * k)), shift), m3);
            const __m512i sc8 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(g + Q2K_SC + 16 * sb)));
            const __m512i sc = _mm512_and_si512(sc8, m15), mn = _mm512_srli_epi32(sc8, 4);
            for (int c = 0; c < nc; c++) {
                const block_q8_K *y = (const block_q8_K *)(vy + c * by) + b;
                const int8_t *yq = y->qs + 16 * sb;
                __m512i i0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[0], x16_bcast4(yq));
                __m512i i1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[1], x16_bcast4(yq + 4));
                i0 = _mm512_dpbusd_epi32(i0, w[2], x16_bcast4(yq + 8));
                i1 = _mm512_dpbusd_epi32(i1, w[3], x16_bcast4(yq + 12));
                isum[c] = _mm512_add_epi32(isum[c], _mm512_mullo_epi32(_mm512_add_epi32(i0, i1), sc));
                msum[c] = _mm512_add_epi32(msum[c], _mm512_madd_epi16(mn, _mm512_set1_epi32((uint16_t)y->bsums[sb])));
            }
        }
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)g));
        const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(g + 32)));
        for (int c = 0; c < nc; c++) {
            const __m512 dy = _mm512_set1_ps(((const block_q8_K *)(vy + c * by))[b].d);
            acc[c] = _mm512_fmadd_ps(_mm512_mul_ps(d, dy), _mm512_cvtepi32_ps(isum[c]), acc[c]);
            acc[c] = _mm512_fnmadd_ps(_mm512_mul_ps(dmin, dy), _mm512_cvtepi32_ps(msum[c]), acc[c]);
        }
    }
    x16_store(s, bs, acc, nr, nc);
}
ED_X16_ENTRY(x16_gemm_q2_K, x16_q2_K_nc)

/* Q6_K against Q8_K, per super-block and row: isum = Σ_s sc_s * Σ q*y over sub-block s (16 quants, q the
 * unsigned 6-bit value: 4 vpdpbusd), msum = Σ_s sc_s * bsum_s (vpdpwssd on the scale pairs), then
 * acc = fma(d_w * d_y, (float) (isum - 32 * msum), acc): isum - 32 msum is ggml's integer
 * Σ_s sc_s Σ (q - 32) y exactly (|.| < 2^29), so this is vec_dot_q6_K_q8_K's float step per super-block. */
/* byte-wise M ? x : y (vpternlogd truth table 0xE4 over inputs x, y, M) */
static inline __m512i x16_select(__m512i x, __m512i y, __m512i m) { return _mm512_ternarylogic_epi32(x, y, m, 0xE4); }

/* Q6_K's unsigned 6-bit quants from a ql chunk pair (a: ql[4i..], b: ql[32 + 4i..] of a half) and its qh
 * chunk: lo = qh & 0x33 holds 2-bit fields 0 and 2 at bits 0-1 and 4-5, hi = (qh >> 2) & 0x33 fields 1
 * and 3, so each quant is one select of 4 low bits and 2 high bits (ggml dequantize_row_q6_K's q1..q4) */
ED_ALWAYS_INLINE __m512i x16_q6_quants(__m512i a, __m512i b, __m512i lo, __m512i hi, int t, __m512i m4) {
    switch (t) {
    case 0: return x16_select(a, _mm512_slli_epi16(lo, 4), m4);
    case 1: return x16_select(b, _mm512_slli_epi16(hi, 4), m4);
    case 2: return x16_select(_mm512_srli_epi16(a, 4), lo, m4);
    default: return x16_select(_mm512_srli_epi16(b, 4), hi, m4);
    }
}

/* Q6_K and Q3_K (the same scale pairs at Q6K_SC == Q3K_SC): sub-block sb's 16 rows' scales as int32 lanes */
ED_ALWAYS_INLINE __m512i x16_k16_scale(const uint8_t *g, int sb) {
    const __m512i p = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(g + Q6K_SC + 32 * (sb / 2))));
    return sb & 1 ? _mm512_srai_epi32(p, 16) : _mm512_srai_epi32(_mm512_slli_epi32(p, 16), 16);
}

/* isum += sc * (sub-block of 16 unsigned quants w[0..3] . the activation bytes yq[0..15]) */
ED_ALWAYS_INLINE __m512i x16_k16_dot(__m512i isum, const __m512i *w, const int8_t *yq, __m512i sc) {
    __m512i i0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[0], x16_bcast4(yq));
    __m512i i1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[1], x16_bcast4(yq + 4));
    i0 = _mm512_dpbusd_epi32(i0, w[2], x16_bcast4(yq + 8));
    i1 = _mm512_dpbusd_epi32(i1, w[3], x16_bcast4(yq + 12));
    return _mm512_add_epi32(isum, _mm512_mullo_epi32(_mm512_add_epi32(i0, i1), sc));
}

/* a super-block's float step for Q6_K (quants + 32: shift 5) and Q3_K (+ 4: shift 2): msum = Σ_s sc_s *
 * bsum_s by vpdpwssd on the scale pairs, acc = fma(d_w * d_y, (float) (isum - (msum << shift)), acc) */
ED_ALWAYS_INLINE void x16_k16_finish(__m512 *acc, const __m512i *isum, const uint8_t *g, const uint8_t *vy, size_t by,
                                     int b, const int nc, const int shift) {
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)g));
    for (int c = 0; c < nc; c++) {
        const block_q8_K *y = (const block_q8_K *)(vy + c * by) + b;
        int32_t pairs[8];
        memcpy(pairs, y->bsums, sizeof(pairs));
        __m512i msum = _mm512_setzero_si512();
        for (int i = 0; i < 8; i++) {
            const __m512i p = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(g + Q6K_SC + 32 * i)));
            msum = _mm512_dpwssd_epi32(msum, p, _mm512_set1_epi32(pairs[i]));
        }
        const __m512i total = _mm512_sub_epi32(isum[c], _mm512_slli_epi32(msum, shift));
        acc[c] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(y->d)), _mm512_cvtepi32_ps(total), acc[c]);
    }
}

ED_ALWAYS_INLINE void x16_q6_K_nc(int n, float *s, size_t bs, const uint8_t *vx, int nr, const uint8_t *vy,
                                  size_t by, const int nc) {
    const int nb = n / QK_K;
    __m512 acc[ED_X16_NC];
    for (int c = 0; c < nc; c++) acc[c] = _mm512_setzero_ps();
    const __m512i m4 = _mm512_set1_epi8(0x0F), m33 = _mm512_set1_epi8(0x33);
#define Q6K_LOAD(h, i)                                                                                      \
    const __m512i a = _mm512_loadu_si512((const void *)(g + Q6K_QL + 64 * (16 * (h) + (i))));                 \
    const __m512i b2 = _mm512_loadu_si512((const void *)(g + Q6K_QL + 64 * (16 * (h) + 8 + (i))));           \
    const __m512i qh = _mm512_loadu_si512((const void *)(g + Q6K_QH + 64 * (8 * (h) + (i))));                \
    const __m512i lo = _mm512_and_si512(qh, m33), hi = _mm512_and_si512(_mm512_srli_epi16(qh, 2), m33)
    for (int b = 0; b < nb; b++) {
        const uint8_t *g = vx + (size_t)b * Q6K_GROUP;
        x16_prefetch_next(g, x16_pf_q6_K, Q6K_GROUP, nc);
        __m512i isum[ED_X16_NC];
        for (int c = 0; c < nc; c++) isum[c] = _mm512_setzero_si512();
        if (nc <= 2) { /* decode: each chunk's 4 vectors made once, one sum per sub-block and row */
            for (int hq = 0; hq < 4; hq++) {
                const int h = hq / 2, q = hq % 2;
                __m512i part[4][2];
                for (int t = 0; t < 4; t++)
                    for (int c = 0; c < nc; c++) part[t][c] = _mm512_setzero_si512();
                for (int k = 0; k < 4; k++) {
                    Q6K_LOAD(h, 4 * q + k);
                    for (int t = 0; t < 4; t++) {
                        const __m512i w = x16_q6_quants(a, b2, lo, hi, t, m4);
                        for (int c = 0; c < nc; c++) {
                            const int8_t *yq = ((const block_q8_K *)(vy + c * by))[b].qs;
                            part[t][c] = _mm512_dpbusd_epi32(part[t][c], w, x16_bcast4(yq + 16 * (8 * h + 2 * t + q) + 4 * k));
                        }
                    }
                }
                for (int t = 0; t < 4; t++) {
                    const __m512i sc = x16_k16_scale(g, 8 * h + 2 * t + q);
                    for (int c = 0; c < nc; c++) isum[c] = _mm512_add_epi32(isum[c], _mm512_mullo_epi32(part[t][c], sc));
                }
            }
        } else { /* prompts: a sub-block's 4 vectors made once for all nc rows */
            for (int sb = 0; sb < 16; sb++) { /* sub-block sb: half h, quarter t of the half's 128, q */
                const int h = sb / 8, t = sb % 8 / 2, q = sb % 2;
                __m512i w[4];
                for (int k = 0; k < 4; k++) {
                    Q6K_LOAD(h, 4 * q + k);
                    w[k] = x16_q6_quants(a, b2, lo, hi, t, m4);
                }
                const __m512i sc = x16_k16_scale(g, sb);
                for (int c = 0; c < nc; c++)
                    isum[c] = x16_k16_dot(isum[c], w, ((const block_q8_K *)(vy + c * by))[b].qs + 16 * sb, sc);
            }
        }
        x16_k16_finish(acc, isum, g, vy, by, b, nc, 5);
    }
#undef Q6K_LOAD
    x16_store(s, bs, acc, nr, nc);
}

#define X16_Q4_K(n, s, bs, vx, nr, y, by, nc) x16_k_nc(n, s, bs, vx, nr, y, by, nc, 0)
#define X16_Q5_K(n, s, bs, vx, nr, y, by, nc) x16_k_nc(n, s, bs, vx, nr, y, by, nc, 1)
ED_X16_ENTRY(x16_gemm_q4_K, X16_Q4_K)
ED_X16_ENTRY(x16_gemm_q5_K, X16_Q5_K)
#undef X16_Q4_K
#undef X16_Q5_K
ED_X16_ENTRY(x16_gemm_q6_K, x16_q6_K_nc)

/* Q3_K against Q8_K (the layout's offsets Q3K_*, x16.c's lane_q3_K), per super-block and row: each quant
 * taken as q + 4 (0..7: its 2 low bits, + 4 where its high bit is set), isum = Σ_s sc_s * Σ (q + 4) * y over
 * sub-block s of 16 (4 vpdpbusd; the low bits as Q2_K's chunks and shifts), msum = Σ_s sc_s * bsum_s
 * (vpdpwssd on Q6_K's scale pairs), then acc = fma(d_w * d_y, (float) (isum - 4 * msum), acc): isum -
 * 4 msum is Σ_s sc_s Σ q * y exactly (|.| < 2^23), vec_dot_q3_K_q8_K's integer per super-block. */
ED_ALWAYS_INLINE void x16_q3_K_nc(int n, float *s, size_t bs, const uint8_t *vx, int nr, const uint8_t *vy,
                                  size_t by, const int nc) {
    __m512 acc[ED_X16_NC];
    for (int c = 0; c < nc; c++) acc[c] = _mm512_setzero_ps();
    const __m512i m3 = _mm512_set1_epi8(3), four = _mm512_set1_epi8(4);
    for (int b = 0; b < n / QK_K; b++) {
        const uint8_t *g = vx + (size_t)b * Q3K_GROUP;
        x16_prefetch_next(g, ED_X16_PF, Q3K_GROUP, nc);
        __m512i isum[ED_X16_NC];
        for (int c = 0; c < nc; c++) isum[c] = _mm512_setzero_si512();
        for (int sb = 0; sb < 16; sb++) { /* sub-block sb = 8n + 2j + h */
            const int j = sb % 8 / 2, h = sb % 2, bit = 4 * (sb / 8) + j;
            const uint8_t *q = g + Q3K_QS + 64 * (8 * (sb / 8) + 4 * h), *hm = g + Q3K_HM + 64 * 4 * h;
            const __m128i shift = _mm_cvtsi32_si128(2 * j);
            __m512i w[4];
            for (int k = 0; k < 4; k++) {
                const __m512i lo = _mm512_and_si512(_mm512_srl_epi16(_mm512_loadu_si512((const void *)(q + 64 * k)), shift), m3);
                const __mmask64 set = _mm512_test_epi8_mask(_mm512_loadu_si512((const void *)(hm + 64 * k)),
                                                            _mm512_set1_epi8((char)(1 << bit)));
                w[k] = _mm512_mask_add_epi8(lo, set, lo, four);
            }
            const __m512i sc = x16_k16_scale(g, sb);
            for (int c = 0; c < nc; c++)
                isum[c] = x16_k16_dot(isum[c], w, ((const block_q8_K *)(vy + c * by))[b].qs + 16 * sb, sc);
        }
        x16_k16_finish(acc, isum, g, vy, by, b, nc, 2);
    }
    x16_store(s, bs, acc, nr, nc);
}
ED_X16_ENTRY(x16_gemm_q3_K, x16_q3_K_nc)

static void set_x16(ed_kernel_table *t) {
    x16_pf_q4_K = ed_env_bytes("EDGELLM_PF_Q4K", ed_cpu_is_intel() ? 1024 : ed_cpu_family() >= 0x1A ? 2048 : 0);
    x16_pf_q6_K = ed_env_bytes("EDGELLM_PF_Q6K", ed_cpu_is_intel() ? 1024 : 8192);
    t->types[ED_Q6_K].x16_gemm = x16_gemm_q6_K;
    t->types[ED_Q2_K].x16_gemm = x16_gemm_q2_K;
    t->types[ED_Q3_K].x16_gemm = x16_gemm_q3_K;
    t->types[ED_Q4_K].x16_gemm = x16_gemm_q4_K;
    t->types[ED_Q5_K].x16_gemm = x16_gemm_q5_K;
    t->types[ED_Q5_0].x16_gemm = x16_gemm_q5_0;
    t->types[ED_Q4_0].x16_gemm = x16_gemm_q4_0;
    t->types[ED_Q4_1].x16_gemm = x16_gemm_q4_1;
    t->types[ED_Q5_1].x16_gemm = x16_gemm_q5_1;
    t->types[ED_IQ4_NL].x16_gemm = x16_gemm_iq4_nl;
    t->types[ED_Q8_0].x16_gemm = x16_gemm_q8_0;
}
