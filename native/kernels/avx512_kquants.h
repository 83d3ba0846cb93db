/* The AVX-512 K-quant dots (against Q8_K), included twice by avx512.c like avx512_body.h: ED_VNNI 0
 * accumulates the int16 scale products with vpmaddwd + vpaddd, ED_VNNI 1 with one vpdpwssd (the same
 * exact integers, so both variants give the same bits). */
#if ED_VNNI
#define ED_SFX(f) f##_vnni
#define ED_DPWSSD(acc, a, b) _mm512_dpwssd_epi32(acc, a, b)
#else
#define ED_SFX(f) f##_bw
#define ED_DPWSSD(acc, a, b) _mm512_add_epi32(acc, _mm512_madd_epi16(a, b))
#endif

/* --------------------------------------------------------------------------- K-quants (vs Q8_K) */

/* The K-quant kernels take one weight row against nc activation rows (ED_NX_ENTRIES): each weight
 * sub-block is unpacked once for all rows, and each row's float operations are vec_dot's (its d and dmin
 * products, acc_m's and acc's fmadds, the final sums), in its order; the integer sums are exact. */
#define Q8K(c, i) ((const block_q8_K *)(vy + (c) * by) + (i))

/* Q4_K and Q5_K share all but the fifth bit: 4 x 64 quants per super-block, scales 2j, 2j+1 per 64.
 * Per super-block and row the scale sums (8 int32 lanes) and the min sums (8 lanes: min k times Q8_K's
 * bsums 2k + 2k+1) meet their float factors [d x 8, -dmin x 8] (times the row's d) in one 16-lane FMA */
ED_ALWAYS_INLINE void ED_SFX(q45_K_n)(int n, float *s, size_t bs, const void *vx, const uint8_t *vy, size_t by,
                              const int nc, const int five, const int exact) {
    const size_t xstride = five ? sizeof(block_q5_K) : sizeof(block_q4_K);
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m256i pairs = _mm256_set_epi16(15, 15, 14, 14, 13, 13, 12, 12, 11, 11, 10, 10, 9, 9, 8, 8);
    __m512 acc[ED_NX_MAX];
    float facc[ED_NX_MAX];
    for (int c = 0; c < nc; c++) acc[c] = _mm512_setzero_ps(), facc[c] = 0.0f;
    for (int i = 0; i < n / QK_K; i++) {
        const uint8_t *xb = (const uint8_t *)vx + i * xstride;
        const block_q4_K *x4 = (const block_q4_K *)xb; /* d, dmin, scales lead both layouts */
        const uint8_t *qs = five ? ((const block_q5_K *)xb)->qs : x4->qs;
        const __m512 wf = _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(ed_f16_table[ed_load_u16(&x4->d)]),
                                               _mm512_set1_ps(-ed_f16_table[ed_load_u16(&x4->dmin)]));
        uint32_t utmp[4];
        ed_unpack_scales_k4(x4->scales, utmp);
        const __m256i mins_and_scales = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)utmp));
        const __m256i mins2 = _mm256_permutexvar_epi16(pairs, mins_and_scales); /* each min twice */
        const __m512i scales = _mm512_castsi256_si512(mins_and_scales);
        __m512i hbits = _mm512_setzero_si512();
        if (five) {
            const __m256i h = _mm256_loadu_si256((const __m256i *)((const block_q5_K *)xb)->qh);
            hbits = join256(h, h);
        }
        __m512i sumi[ED_NX_MAX];
        for (int c = 0; c < nc; c++) sumi[c] = _mm512_setzero_si512();
        for (int j = 0; j < QK_K / 64; j++) {
            const __m256i bits = _mm256_loadu_si256((const __m256i *)(qs + 32 * j));
            __m512i q = _mm512_and_si512(join256(bits, _mm256_srli_epi16(bits, 4)), m4);
            if (five) { /* bit 2j of qh for the first 32 quants, bit 2j+1 for the next 32 */
                const __m512i sel = join256(_mm256_set1_epi8((char)(1 << (2 * j))),
                                            _mm256_set1_epi8((char)(1 << (2 * j + 1))));
                q = _mm512_mask_add_epi8(q, _mm512_test_epi8_mask(hbits, sel), q, _mm512_set1_epi8(16));
            }
            const __m512i sc = _mm512_permutexvar_epi16(idx16(2 * j, 2 * j, 2 * j + 1, 2 * j + 1), scales);
            for (int c = 0; c < nc; c++) {
                const __m512i p = _mm512_maddubs_epi16(q, _mm512_loadu_si512((const void *)(Q8K(c, i)->qs + 64 * j)));
                sumi[c] = ED_DPWSSD(sumi[c], sc, p);
            }
        }
        for (int c = 0; c < nc; c++) {
            const __m256i msum = _mm256_madd_epi16(mins2, _mm256_loadu_si256((const __m256i *)Q8K(c, i)->bsums));
            __m512i both = join256(add_halves_i32(sumi[c]), msum);
            if (exact) { /* the super-block's two integers (lanes 0 and 8), then the AMX GEMM's float steps */
                both = _mm512_add_epi32(both, _mm512_unpackhi_epi64(both, both));
                both = _mm512_add_epi32(both, _mm512_srli_epi64(both, 32));
                both = _mm512_add_epi32(both, _mm512_permutexvar_epi32(_mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 12, 0, 0, 0, 0, 0, 0, 0, 4), both));
                const __m512 f = _mm512_cvtepi32_ps(both);
                const float dy = Q8K(c, i)->d;
                facc[c] = fmaf(ed_f16_table[ed_load_u16(&x4->d)] * dy, _mm_cvtss_f32(_mm512_castps512_ps128(f)), facc[c]);
                facc[c] = fmaf(-(ed_f16_table[ed_load_u16(&x4->dmin)] * dy), _mm_cvtss_f32(_mm512_extractf32x4_ps(f, 2)),
                               facc[c]);
                continue;
            }
            const __m512 sm = _mm512_cvtepi32_ps(both);
            acc[c] = _mm512_fmadd_ps(_mm512_mul_ps(wf, _mm512_set1_ps(Q8K(c, i)->d)), sm, acc[c]);
        }
    }
    for (int c = 0; c < nc; c++) s[c * bs] = exact ? facc[c] : hsum_f32x16(acc[c]);
}

ED_ALWAYS_INLINE void ED_SFX(q4_K_n)(int n, float *s, size_t bs, const void *vx, const uint8_t *vy, size_t by, const int nc) {
    ED_SFX(q45_K_n)(n, s, bs, vx, vy, by, nc, 0, 0);
}
ED_ALWAYS_INLINE void ED_SFX(q5_K_n)(int n, float *s, size_t bs, const void *vx, const uint8_t *vy, size_t by, const int nc) {
    ED_SFX(q45_K_n)(n, s, bs, vx, vy, by, nc, 1, 0);
}
ED_NX_ENTRIES(ED_SFX(q4_K_n), ED_SFX(vec_dot_q4_K), ED_SFX(vec_dot_nx_q4_K), 8)
ED_NX_ENTRIES(ED_SFX(q5_K_n), ED_SFX(vec_dot_q5_K), ED_SFX(vec_dot_nx_q5_K), 8)

ED_ALWAYS_INLINE void ED_SFX(q6_K_x)(int n, float *s, size_t bs, const void *vx, const uint8_t *vy, size_t by,
                                     const int nc, const int exact) {
    const block_q6_K *x = vx;
    const __m512i m15 = _mm512_set1_epi8(15), m48 = _mm512_set1_epi8(48);
    __m256 acc[ED_NX_MAX];
    float facc[ED_NX_MAX];
    for (int c = 0; c < nc; c++) acc[c] = _mm256_setzero_ps(), facc[c] = 0.0f;
    for (int i = 0; i < n / QK_K; i++) {
        const float xd = ed_f16_table[ed_load_u16(&x[i].d)];
        const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x[i].scales));
        const __m512i scales = _mm512_castsi256_si512(sc16);
        __m512i sumi[ED_NX_MAX];
        for (int c = 0; c < nc; c++) sumi[c] = _mm512_setzero_si512();
        for (int h = 0; h < QK_K / 128; h++) {
            /* ql[0..63] low nibbles are quants 0..63 of this half, high nibbles 64..127; qh holds their
             * top 2 bits: bits 0-1 / 2-3 for quants 0..31 / 32..63, bits 4-5 / 6-7 for 64..95 / 96..127 */
            const __m512i lo = _mm512_loadu_si512((const void *)(x[i].ql + 64 * h));
            const __m256i bh = _mm256_loadu_si256((const __m256i *)(x[i].qh + 32 * h));
            const __m512i hb = join256(bh, _mm256_srli_epi16(bh, 2));
            const __m512i ha = _mm512_and_si512(_mm512_slli_epi16(hb, 4), m48), hbb = _mm512_and_si512(hb, m48);
            const __m512i qa = _mm512_or_si512(_mm512_and_si512(lo, m15), ha);
            const __m512i qb = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(lo, 4), m15), hbb);
            const short b = (short)(8 * h); /* scale k covers quants 16k .. 16k+15: 8 int16 lanes of p */
            const __m512i sa = _mm512_permutexvar_epi16(idx16(b, b + 1, b + 2, b + 3), scales);
            const __m512i sb = _mm512_permutexvar_epi16(idx16(b + 4, b + 5, b + 6, b + 7), scales);
            for (int c = 0; c < nc; c++) {
                const int8_t *q8 = Q8K(c, i)->qs + 128 * h;
                const __m512i pa = _mm512_maddubs_epi16(qa, _mm512_loadu_si512((const void *)q8));
                const __m512i pb = _mm512_maddubs_epi16(qb, _mm512_loadu_si512((const void *)(q8 + 64)));
                sumi[c] = ED_DPWSSD(ED_DPWSSD(sumi[c], sa, pa), sb, pb);
            }
        }
        for (int c = 0; c < nc; c++) { /* quants are stored +32: subtract 32 * Σ scale * bsum once per block */
            const __m256i bsums = _mm256_loadu_si256((const __m256i *)Q8K(c, i)->bsums);
            const __m256i sub = _mm256_slli_epi32(_mm256_madd_epi16(bsums, sc16), 5);
            const __m256i total = _mm256_sub_epi32(add_halves_i32(sumi[c]), sub);
            if (exact) /* the super-block's integer, then the AMX GEMM's float step (avx512_amx.h) */
                facc[c] = fmaf(xd * Q8K(c, i)->d, (float)hsum_i32x8(total), facc[c]);
            else
                acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(Q8K(c, i)->d * xd), _mm256_cvtepi32_ps(total), acc[c]);
        }
    }
    for (int c = 0; c < nc; c++) s[c * bs] = exact ? facc[c] : hsum_f32x8(acc[c]);
}
ED_ALWAYS_INLINE void ED_SFX(q6_K_n)(int n, float *s, size_t bs, const void *vx, const uint8_t *vy, size_t by, const int nc) {
    ED_SFX(q6_K_x)(n, s, bs, vx, vy, by, nc, 0);
}
ED_NX_ENTRIES(ED_SFX(q6_K_n), ED_SFX(vec_dot_q6_K), ED_SFX(vec_dot_nx_q6_K), 4)

/* Q2_K and Q3_K: per 128-element half, the 2-bit fields at bit offsets 0, 2 (quants 0..63) and 4, 6
 * (64..127) of the same 32 bytes make two 64-quant vectors; scale k covers quants 16k .. 16k+15 */
static inline void ED_SFX(q23_half)(const uint8_t *qs, __m512i *qa, __m512i *qb) {
    const __m512i m3 = _mm512_set1_epi8(3);
    const __m256i bits = _mm256_loadu_si256((const __m256i *)qs);
    *qa = _mm512_and_si512(join256(bits, _mm256_srli_epi16(bits, 2)), m3);
    *qb = _mm512_and_si512(join256(_mm256_srli_epi16(bits, 4), _mm256_srli_epi16(bits, 6)), m3);
}

/* the int16 scale lanes for half h's two 64-quant vectors: scale k covers quants 16k .. 16k+15 */
static inline void ED_SFX(q23_scales)(__m512i scales, int h, __m512i *sa, __m512i *sb) {
    const short b = (short)(8 * h);
    *sa = _mm512_permutexvar_epi16(idx16(b, b + 1, b + 2, b + 3), scales);
    *sb = _mm512_permutexvar_epi16(idx16(b + 4, b + 5, b + 6, b + 7), scales);
}

/* acc + Σ scale * q * q8 over one half (q8 = its 128 activations) */
static inline __m512i ED_SFX(q23_dot_half)(__m512i acc, __m512i qa, __m512i qb, __m512i sa, __m512i sb, const int8_t *q8) {
    const __m512i pa = _mm512_maddubs_epi16(qa, _mm512_loadu_si512((const void *)q8));
    const __m512i pb = _mm512_maddubs_epi16(qb, _mm512_loadu_si512((const void *)(q8 + 64)));
    return ED_DPWSSD(ED_DPWSSD(acc, sa, pa), sb, pb);
}

/* ggml_vec_dot_q2_K_q8_K (AVX2) at 64 quants per vpmaddubsw: scales in the low nibbles, mins (against
 * Q8_K's bsums) in the high ones */
ED_ALWAYS_INLINE void ED_SFX(q2_K_n)(int n, float *s, size_t bs, const void *vx, const uint8_t *vy, size_t by, const int nc) {
    const block_q2_K *x = vx;
    const __m128i m4 = _mm_set1_epi8(0xF);
    __m256 acc[ED_NX_MAX];
    for (int c = 0; c < nc; c++) acc[c] = _mm256_setzero_ps();
    for (int i = 0; i < n / QK_K; i++) {
        const float xd = ed_f16_table[ed_load_u16(&x[i].d)], xdmin = ed_f16_table[ed_load_u16(&x[i].dmin)];
        const __m128i ms = _mm_loadu_si128((const __m128i *)x[i].scales);
        const __m256i mins = _mm256_cvtepi8_epi16(_mm_and_si128(_mm_srli_epi16(ms, 4), m4));
        __m512i sumi[ED_NX_MAX];
        for (int c = 0; c < nc; c++) {
            const __m256i prod = _mm256_madd_epi16(mins, _mm256_loadu_si256((const __m256i *)Q8K(c, i)->bsums));
            acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(-Q8K(c, i)->d * xdmin), _mm256_cvtepi32_ps(prod), acc[c]);
            sumi[c] = _mm512_setzero_si512();
        }
        const __m512i scales = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(_mm_and_si128(ms, m4)));
        for (int h = 0; h < QK_K / 128; h++) {
            __m512i qa, qb, sa, sb;
            ED_SFX(q23_half)(x[i].qs + 32 * h, &qa, &qb);
            ED_SFX(q23_scales)(scales, h, &sa, &sb);
            for (int c = 0; c < nc; c++)
                sumi[c] = ED_SFX(q23_dot_half)(sumi[c], qa, qb, sa, sb, Q8K(c, i)->qs + 128 * h);
        }
        for (int c = 0; c < nc; c++)
            acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(Q8K(c, i)->d * xd), _mm256_cvtepi32_ps(add_halves_i32(sumi[c])),
                                     acc[c]);
    }
    for (int c = 0; c < nc; c++) s[c * bs] = hsum_f32x8(acc[c]);
}
ED_NX_ENTRIES(ED_SFX(q2_K_n), ED_SFX(vec_dot_q2_K), ED_SFX(vec_dot_nx_q2_K), 4)

/* ggml_vec_dot_q3_K_q8_K (AVX2) at 64 quants per vpmaddubsw. As in avx2_q23k.c the quants stay unsigned
 * (+4 where the hmask bit is set, by a masked add) and 4 * Σ scale * bsum comes off once per block. */
ED_ALWAYS_INLINE void ED_SFX(q3_K_n)(int n, float *s, size_t bs, const void *vx, const uint8_t *vy, size_t by, const int nc) {
    const block_q3_K *x = vx;
    const __m512i four = _mm512_set1_epi8(4);
    __m256 acc[ED_NX_MAX];
    for (int c = 0; c < nc; c++) acc[c] = _mm256_setzero_ps();
    for (int i = 0; i < n / QK_K; i++) {
        const float xd = ed_f16_table[ed_load_u16(&x[i].d)];
        uint32_t utmp[4];
        ed_unpack_scales_q3(x[i].scales, utmp);
        const __m128i s8 = _mm_sub_epi8(_mm_set_epi32((int)utmp[3], (int)utmp[2], (int)utmp[1], (int)utmp[0]),
                                        _mm_set1_epi8(32));
        const __m256i sc16 = _mm256_cvtepi8_epi16(s8);
        const __m512i scales = _mm512_castsi256_si512(sc16);
        const __m256i hm = _mm256_loadu_si256((const __m256i *)x[i].hmask);
        const __m512i hbits = join256(hm, hm);
        __m512i sumi[ED_NX_MAX];
        for (int c = 0; c < nc; c++) sumi[c] = _mm512_setzero_si512();
        for (int h = 0; h < QK_K / 128; h++) {
            __m512i qa, qb, sa, sb; /* chunk c (32 quants) of the block takes bit c of hmask[0..31] */
            ED_SFX(q23_half)(x[i].qs + 32 * h, &qa, &qb);
            const __m512i ma = join256(_mm256_set1_epi8((char)(1 << (4 * h))), _mm256_set1_epi8((char)(2 << (4 * h))));
            const __m512i mb = join256(_mm256_set1_epi8((char)(4 << (4 * h))), _mm256_set1_epi8((char)(8 << (4 * h))));
            qa = _mm512_mask_add_epi8(qa, _mm512_test_epi8_mask(hbits, ma), qa, four);
            qb = _mm512_mask_add_epi8(qb, _mm512_test_epi8_mask(hbits, mb), qb, four);
            ED_SFX(q23_scales)(scales, h, &sa, &sb);
            for (int c = 0; c < nc; c++)
                sumi[c] = ED_SFX(q23_dot_half)(sumi[c], qa, qb, sa, sb, Q8K(c, i)->qs + 128 * h);
        }
        for (int c = 0; c < nc; c++) {
            const __m256i bsums = _mm256_loadu_si256((const __m256i *)Q8K(c, i)->bsums);
            const __m256i bias = _mm256_slli_epi32(_mm256_madd_epi16(bsums, sc16), 2);
            const __m256i total = _mm256_sub_epi32(add_halves_i32(sumi[c]), bias);
            acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(Q8K(c, i)->d * xd), _mm256_cvtepi32_ps(total), acc[c]);
        }
    }
    for (int c = 0; c < nc; c++) s[c * bs] = hsum_f32x8(acc[c]);
}
ED_NX_ENTRIES(ED_SFX(q3_K_n), ED_SFX(vec_dot_q3_K), ED_SFX(vec_dot_nx_q3_K), 4)

#undef Q8K

static void ED_SFX(set_kquants)(ed_kernel_table *t) {
    t->types[ED_Q2_K].vec_dot = ED_SFX(vec_dot_q2_K), t->types[ED_Q2_K].vec_dot_nx = ED_SFX(vec_dot_nx_q2_K);
    t->types[ED_Q3_K].vec_dot = ED_SFX(vec_dot_q3_K), t->types[ED_Q3_K].vec_dot_nx = ED_SFX(vec_dot_nx_q3_K);
    t->types[ED_Q4_K].vec_dot = ED_SFX(vec_dot_q4_K), t->types[ED_Q4_K].vec_dot_nx = ED_SFX(vec_dot_nx_q4_K);
    t->types[ED_Q5_K].vec_dot = ED_SFX(vec_dot_q5_K), t->types[ED_Q5_K].vec_dot_nx = ED_SFX(vec_dot_nx_q5_K);
    t->types[ED_Q6_K].vec_dot = ED_SFX(vec_dot_q6_K), t->types[ED_Q6_K].vec_dot_nx = ED_SFX(vec_dot_nx_q6_K);
}

#undef ED_DPWSSD
#undef ED_SFX
