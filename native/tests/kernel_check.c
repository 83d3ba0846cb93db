/* Standalone check of the native kernels against cases written by tests/test_native_kernels_cross.py.
 *
 * For every level this CPU runs, and every case: the activation row quantized by from_float must equal
 * the numpy reference bytes exactly, and vec_dot(weight row, those bytes) must be within a per-type
 * relative tolerance of the float64 reference dot (sum of dequant(w) * roundtrip(x), with Q8_1's s-term).
 * Tolerances are relative to sum |w_i * x_i|: all levels quantize identically, so what is left is float
 * summation order (ggml's tests/test-quantize-fns.cpp bounds the error against the *unquantized* dot,
 * a much looser check). vec_dot_nx (one weight row x nc activation rows, through ed_vec_dot_nx, so the
 * vec_dot fallback too) must give every row vec_dot's bits exactly, and so must vec_dot_2nx (two weight
 * rows: the case's and its blocks in reverse order) where a level has it, float_gemm (F16/BF16 weights
 * against float32 activation rows) where a level has it, and amx_gemm (the AMX tile
 * GEMM: up to 16 weight rows against packed activation rows) where the CPU has AMX. Where a level has
 * a repacked (x16) GEMM for the type, 18 weight rows (the case's, rotated by a block each and, past the
 * first, with their quant and scale bytes flipped by a pattern of their own) are repacked
 * into two groups (the second padded) and every output against 1..11 activation rows must be the bits of
 * x16_ref, the layout's defined order, and the case's row within the tolerance of the expected dot.
 * Exit status 0 iff every check passes.
 * `--bench` also times each case.
 *
 * Case file (little-endian): "EDKC", u32 version (1), u32 count, then per case:
 *   u32 name_len, name, u32 wtype, u32 n, u32 wbytes, u32 atype, u32 abytes, f64 expected, f64 magnitude,
 *   f32 x[n], u8 w[wbytes], u8 a[abytes]
 */
#define _POSIX_C_SOURCE 199309L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../ed_kernels.h"

int ed_cpu_has_avx512vnni(void);
extern float ed_f16_table[1 << 16];

typedef struct {
    char name[128];
    uint32_t wtype, n, wbytes, atype, abytes;
    double expected, magnitude;
    float *x;
    uint8_t *w, *a;
} test_case;

static const char *level_name(int level) {
    static const char *names[] = {"scalar", "avx2", "avx512", "neon"};
    return level >= 0 && level < 4 ? names[level] : "?";
}

/* Relative tolerance against sum |w_i * x_i|, per weight type. */
static double rtol(uint32_t wtype) {
    switch (wtype) {
    case ED_F32: case ED_F16: case ED_BF16: return 1e-5; /* f32 lanes over up to a few thousand terms */
    case ED_Q2_K: case ED_Q3_K: /* as Q4_K: exact integer super-block sums; d * sum and (Q2_K) dmin * Σ min *
                                 * bsum round, and their difference may cancel (worst seen 7e-8 on every level) */
        return 2e-6;
    default: return 2e-6; /* exact integer block sums; only the per-block scale products round */
    }
}

static int rd(FILE *f, void *p, size_t n) { return fread(p, 1, n, f) == n; }

static test_case *load(const char *path, uint32_t *count) {
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); return NULL; }
    char magic[4];
    uint32_t version;
    if (!rd(f, magic, 4) || memcmp(magic, "EDKC", 4) || !rd(f, &version, 4) || version != 1 || !rd(f, count, 4)) {
        fprintf(stderr, "%s: not a version 1 case file\n", path);
        fclose(f);
        return NULL;
    }
    test_case *cs = calloc(*count ? *count : 1, sizeof(test_case));
    for (uint32_t i = 0; i < *count; i++) {
        test_case *c = &cs[i];
        uint32_t len;
        int ok = rd(f, &len, 4) && len < sizeof(c->name) && rd(f, c->name, len) && rd(f, &c->wtype, 4) &&
                 rd(f, &c->n, 4) && rd(f, &c->wbytes, 4) && rd(f, &c->atype, 4) && rd(f, &c->abytes, 4) &&
                 rd(f, &c->expected, 8) && rd(f, &c->magnitude, 8);
        if (ok) {
            /* 64-byte aligned, then offset: weight rows in a GGUF are only 2-byte aligned (18-byte blocks) */
            c->x = aligned_alloc(64, ((size_t)c->n * 4 + 127) / 64 * 64);
            c->w = (uint8_t *)aligned_alloc(64, (c->wbytes + 127) / 64 * 64) + (c->wtype == ED_F32 ? 4 : 2);
            c->a = aligned_alloc(64, (c->abytes + 127) / 64 * 64);
            ok = rd(f, c->x, (size_t)c->n * 4) && rd(f, c->w, c->wbytes) && rd(f, c->a, c->abytes);
        }
        if (!ok) {
            fprintf(stderr, "%s: truncated at case %u\n", path, i);
            fclose(f);
            return NULL;
        }
    }
    fclose(f);
    return cs;
}

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

/* Check one case at one level; returns the number of failures (0 or 1). */
static int check(const ed_kernel_table *k, const test_case *c, uint8_t *act, double *worst) {
    const ed_type_kernels *t = &k->types[c->wtype];
    if (!t->vec_dot) {
        printf("FAIL %-7s %s: no vec_dot for type %u\n", level_name(k->level), c->name, c->wtype);
        return 1;
    }
    if ((uint32_t)t->vec_dot_type != c->atype || ed_act_row_bytes(c->atype, c->n) != c->abytes ||
        !k->from_float[c->atype]) {
        printf("FAIL %-7s %s: activation type %d / %zu bytes, expected %u / %u\n", level_name(k->level),
               c->name, t->vec_dot_type, ed_act_row_bytes(c->atype, c->n), c->atype, c->abytes);
        return 1;
    }
    k->from_float[c->atype](c->x, act, c->n);
    if (memcmp(act, c->a, c->abytes)) {
        uint32_t j = 0;
        while (act[j] == c->a[j]) j++;
        printf("FAIL %-7s %s: quantized activation differs at byte %u (%u, expected %u)\n",
               level_name(k->level), c->name, j, act[j], c->a[j]);
        return 1;
    }
    float s = NAN;
    t->vec_dot((int)c->n, &s, c->w, act);
    const double err = fabs((double)s - c->expected), tol = rtol(c->wtype) * c->magnitude;
    const double rel = c->magnitude > 0 ? err / c->magnitude : err;
    if (rel > *worst) *worst = rel;
    if (!(err <= tol)) {
        printf("FAIL %-7s %s: dot %.9g, expected %.9g (error %.3g of magnitude %.6g, tolerance %.1g)\n",
               level_name(k->level), c->name, s, c->expected, err, c->magnitude, rtol(c->wtype));
        return 1;
    }
    return 0;
}

/* ed_vec_dot_nx over NX_ROWS distinct activation rows (x rotated), each nc in 1..ED_NX_MAX and strides
 * bs = 3 floats: every output must be bit-identical to vec_dot on that row. */
#define NX_ROWS 11
static int check_nx(const ed_kernel_table *k, const test_case *c, uint8_t *acts, float *xr) {
    const ed_type_kernels *t = &k->types[c->wtype];
    const size_t ab = c->abytes;
    for (int r = 0; r < NX_ROWS; r++) {
        for (uint32_t i = 0; i < c->n; i++) xr[i] = c->x[(i + 37u * (uint32_t)r) % c->n] * (1.0f + 0.25f * r);
        k->from_float[c->atype](xr, acts + r * ab, c->n);
    }
    float want[NX_ROWS], got[3 * NX_ROWS];
    for (int r = 0; r < NX_ROWS; r++) t->vec_dot((int)c->n, &want[r], c->w, acts + r * ab);
    for (int nc = 1; nc <= ED_NX_MAX; nc++) {
        for (int r0 = 0; r0 + nc <= NX_ROWS; r0 += nc) {
            for (int i = 0; i < 3 * NX_ROWS; i++) got[i] = NAN;
            ed_vec_dot_nx(t, (int)c->n, got, 3, c->w, acts + r0 * ab, ab, nc);
            for (int r = 0; r < nc; r++)
                if (memcmp(&got[3 * r], &want[r0 + r], sizeof(float))) {
                    printf("FAIL %-7s %s: vec_dot_nx (nc %d) row %d gives %.9g, vec_dot %.9g\n",
                           level_name(k->level), c->name, nc, r0 + r, got[3 * r], want[r0 + r]);
                    return 1;
                }
        }
    }
    return 0;
}

/* vec_dot_2nx, where the level has it: the case's weight row and the same blocks in reverse order (a
 * second valid row) against nc = 1..ED_NX_MAX rows at strides bs = 5 floats, every output vec_dot's bits */
static int check_2nx(const ed_kernel_table *k, const test_case *c, uint8_t *acts) {
    const ed_type_kernels *t = &k->types[c->wtype];
    if (!t->vec_dot_2nx) return 0;
    const size_t ab = c->abytes, bb = (size_t)t->block_bytes, nb = c->wbytes / bb;
    uint8_t *w2 = malloc(2 * c->wbytes);
    memcpy(w2, c->w, c->wbytes);
    for (size_t b = 0; b < nb; b++) memcpy(w2 + c->wbytes + b * bb, c->w + (nb - 1 - b) * bb, bb);
    float want[2][NX_ROWS], got[5 * ED_NX_MAX];
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < NX_ROWS; i++) t->vec_dot((int)c->n, &want[r][i], w2 + r * c->wbytes, acts + i * ab);
    int fails = 0;
    for (int nc = 1; nc <= ED_NX_MAX && !fails; nc++) {
        for (int i = 0; i < 5 * ED_NX_MAX; i++) got[i] = NAN;
        t->vec_dot_2nx((int)c->n, got, 5, w2, c->wbytes, acts + ab, ab, nc);
        for (int i = 0; i < nc && !fails; i++)
            for (int r = 0; r < 2; r++)
                if (memcmp(&got[5 * i + r], &want[r][1 + i], sizeof(float))) {
                    printf("FAIL %-7s %s: vec_dot_2nx (nc %d) weight row %d, row %d gives %.9g, vec_dot %.9g\n",
                           level_name(k->level), c->name, nc, r, 1 + i, got[5 * i + r], want[r][1 + i]);
                    fails = 1;
                    break;
                }
    }
    free(w2);
    return fails;
}

/* float_gemm (F16 / BF16 prompts), where the level has it: GEMM_ROWS weight rows (the case's, its blocks
 * reversed, then rotated by 2.. blocks), nr = 1..GEMM_ROWS of them, against nc = 1..NX_ROWS-1 activation
 * rows given as float32 (their f16 / bf16 values), strides bs = GEMM_ROWS; every output vec_dot's bits */
#define GEMM_ROWS 7
static int check_float_gemm(const ed_kernel_table *k, const test_case *c, uint8_t *acts) {
    const ed_type_kernels *t = &k->types[c->wtype];
    if (!t->float_gemm) return 0;
    const size_t ab = c->abytes, n = c->n, wb = c->wbytes;
    const size_t bb = (size_t)t->block_bytes, nb = wb / bb;
    uint8_t *w = malloc(GEMM_ROWS * wb);
    for (size_t r = 0; r < GEMM_ROWS; r++)
        for (size_t b = 0; b < nb; b++)
            memcpy(w + r * wb + b * bb, c->w + (r == 1 ? nb - 1 - b : (b + r) % nb) * bb, bb);
    float *yf = malloc(sizeof(float) * NX_ROWS * n), want[GEMM_ROWS][NX_ROWS], got[GEMM_ROWS * NX_ROWS];
    for (int i = 0; i < NX_ROWS; i++)
        for (size_t j = 0; j < n; j++) {
            uint16_t h;
            memcpy(&h, acts + i * ab + 2 * j, 2);
            const uint32_t bits = (uint32_t)h << 16;
            float v;
            memcpy(&v, &bits, 4);
            yf[i * n + j] = c->wtype == ED_F16 ? ed_f16_table[h] : v;
        }
    for (int r = 0; r < GEMM_ROWS; r++)
        for (int i = 0; i < NX_ROWS; i++) t->vec_dot((int)n, &want[r][i], w + r * wb, acts + i * ab);
    int fails = 0;
    for (int nr = 1; nr <= GEMM_ROWS && !fails; nr++)
        for (int nc = 1; nc < NX_ROWS && !fails; nc++) {
            for (int i = 0; i < GEMM_ROWS * NX_ROWS; i++) got[i] = NAN;
            t->float_gemm((int)n, got, GEMM_ROWS, w, wb, nr, yf + n, n, nc);
            for (int i = 0; i < nc && !fails; i++)
                for (int r = 0; r < nr; r++)
                    if (memcmp(&got[GEMM_ROWS * i + r], &want[r][1 + i], sizeof(float))) {
                        printf("FAIL %-7s %s: float_gemm (nr %d, nc %d) weight row %d, row %d gives %.9g, vec_dot %.9g\n",
                               level_name(k->level), c->name, nr, nc, r, 1 + i, got[GEMM_ROWS * i + r], want[r][1 + i]);
                        fails = 1;
                        break;
                    }
        }
    free(w);
    free(yf);
    return fails;
}

/* amx_gemm, where the level has it: the case's weight row and its blocks reversed, then rows of zeros up
 * to 16 (nr = 2 and 16), against the NX_ROWS rows packed in one tile (padded with zero rows), at strides
 * bs = 17 floats; every output must be vec_dot's bits. */
static int check_amx(const ed_kernel_table *k, const test_case *c, uint8_t *acts) {
    const ed_type_kernels *t = &k->types[c->wtype];
    if (!t->amx_gemm) return 0;
    const size_t ab = c->abytes, bb = (size_t)t->block_bytes, nb = c->wbytes / bb;
    uint8_t *w = calloc(ED_AMX_ROWS, c->wbytes);
    const size_t tile = t->vec_dot_type == ED_Q8_K ? c->n / 256 * ED_AMX_KBLOCK_BYTES : c->n / 32 * ED_AMX_BLOCK_BYTES;
    uint8_t *packed = aligned_alloc(64, tile), *scratch = malloc(c->n / 32 * ED_AMX_WBLOCK_BYTES);
    float *got = malloc(sizeof(float) * 17 * NX_ROWS);
    memcpy(w, c->w, c->wbytes);
    for (size_t b = 0; b < nb; b++) memcpy(w + c->wbytes + b * bb, c->w + (nb - 1 - b) * bb, bb);
    for (int lane = 0; lane < ED_AMX_ROWS; lane++)
        k->amx_pack[t->vec_dot_type](lane < NX_ROWS ? acts + lane * ab : NULL, (int)c->n, packed, lane);
    int fails = 0;
    for (int nr = 2; nr <= ED_AMX_ROWS && !fails; nr += ED_AMX_ROWS - 2) {
        for (int i = 0; i < 17 * NX_ROWS; i++) got[i] = NAN;
        t->amx_gemm((int)c->n, got, 17, w, c->wbytes, nr, packed, NX_ROWS, scratch);
        for (int i = 0; i < NX_ROWS && !fails; i++)
            for (int r = 0; r < nr; r++) {
                float want;
                t->vec_dot((int)c->n, &want, w + r * c->wbytes, acts + i * ab);
                if (memcmp(&got[17 * i + r], &want, sizeof(float))) {
                    printf("FAIL %-7s %s: amx_gemm (nr %d) weight row %d, row %d gives %.9g, vec_dot %.9g\n",
                           level_name(k->level), c->name, nr, r, i, got[17 * i + r], want);
                    fails = 1;
                    break;
                }
            }
    }
    free(w), free(packed), free(scratch), free(got);
    return fails;
}

/* One output of the x16 layout's order (Q4_0, Q5_0, IQ4_NL, Q8_0; Q4_1 / Q5_1, Q2_K, Q3_K, Q4_K / Q5_K and Q6_K have their own
 * below): Σ_b fma(d_w * d_y, (float) isum_b, acc) over the blocks, from the file's blocks (w) and a Q8_0
 * activation row (a). */
static const int8_t iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

static void scale_min_k4(int j, const uint8_t *q, int *d, int *m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4);
    }
}

/* Q4_K and Q5_K (q5: the fifth bits from qh): per super-block fma(d * d_y, Σ_j sc_j * isum_j, acc), then
 * fma(-(dmin * d_y), Σ_j m_j * ysum_j, acc) */
static float x16_ref_q4_K(int n, const uint8_t *w, const uint8_t *a, int q5) {
    float acc = 0.0f;
    for (int b = 0; b < n / 256; b++) {
        const uint8_t *wb = w + (size_t)b * (q5 ? 176 : 144), *ab = a + (size_t)b * 292;
        float dy;
        int16_t bsums[16];
        memcpy(&dy, ab, 4), memcpy(bsums, ab + 4 + 256, 32);
        int32_t isum = 0, msum = 0;
        for (int j = 0; j < 8; j++) {
            int sc, mn, dot = 0;
            scale_min_k4(j, wb + 4, &sc, &mn);
            for (int i = 0; i < 32; i++) {
                const uint8_t byte = wb[(q5 ? 48 : 16) + 32 * (j / 2) + i];
                const int fifth = q5 ? (wb[16 + i] >> j & 1) << 4 : 0;
                dot += ((j & 1 ? byte >> 4 : byte & 15) | fifth) * (int8_t)ab[4 + 32 * j + i];
            }
            isum += sc * dot;
            msum += mn * (bsums[2 * j] + bsums[2 * j + 1]);
        }
        uint16_t hd, hm;
        memcpy(&hd, wb, 2), memcpy(&hm, wb + 2, 2);
        acc = fmaf(ed_f16_table[hd] * dy, (float)isum, acc);
        acc = fmaf(-(ed_f16_table[hm] * dy), (float)msum, acc);
    }
    return acc;
}

/* Q2_K: per super-block fma(d * d_y, Σ_s sc_s * isum_s, acc), then fma(-(dmin * d_y), Σ_s m_s * bsum_s, acc) */
static float x16_ref_q2_K(int n, const uint8_t *w, const uint8_t *a) {
    float acc = 0.0f;
    for (int b = 0; b < n / 256; b++) {
        const uint8_t *wb = w + (size_t)b * 84, *ab = a + (size_t)b * 292;
        float dy;
        int16_t bsums[16];
        memcpy(&dy, ab, 4), memcpy(bsums, ab + 4 + 256, 32);
        int32_t isum = 0, msum = 0;
        for (int i = 0; i < 256; i++) { /* ggml dequantize_row_q2_K: quant 128h + 32j + l of qs[32h + l] >> 2j */
            const int h = i / 128, j = i % 128 / 32, l = i % 32, sb = i / 16;
            isum += (wb[sb] & 15) * ((wb[16 + 32 * h + l] >> (2 * j)) & 3) * (int8_t)ab[4 + i];
        }
        for (int sb = 0; sb < 16; sb++) msum += (wb[sb] >> 4) * bsums[sb];
        uint16_t hd, hm;
        memcpy(&hd, wb + 80, 2), memcpy(&hm, wb + 82, 2);
        acc = fmaf(ed_f16_table[hd] * dy, (float)isum, acc);
        acc = fmaf(-(ed_f16_table[hm] * dy), (float)msum, acc);
    }
    return acc;
}

/* Q3_K: per super-block fma(d * d_y, Σ_s (sc_s - 32) * Σ q * y over sub-block s of 16, acc); q and the
 * 6-bit sc_s read as ggml dequantize_row_q3_K does (its packing written out per sub-block here) */
static float x16_ref_q3_K(int n, const uint8_t *w, const uint8_t *a) {
    float acc = 0.0f;
    for (int b = 0; b < n / 256; b++) {
        const uint8_t *wb = w + (size_t)b * 110, *ab = a + (size_t)b * 292, *hm = wb, *qs = wb + 32, *sp = wb + 96;
        float dy;
        memcpy(&dy, ab, 4);
        int32_t isum = 0;
        for (int s = 0; s < 16; s++) { /* sub-block s = 8n + 2j + h: quants 128n + 32j + 16h + l */
            const int nn = s / 8, j = s % 8 / 2, h = s % 2;
            const int sc = (((sp[s % 8] >> (4 * (s / 8))) & 0xF) | ((sp[8 + s % 4] >> (2 * (s / 4))) & 3) << 4) - 32;
            int dot = 0;
            for (int l = 0; l < 16; l++) {
                const int q = ((qs[32 * nn + 16 * h + l] >> (2 * j)) & 3) - ((hm[16 * h + l] >> (4 * nn + j)) & 1 ? 0 : 4);
                dot += q * (int8_t)ab[4 + 16 * s + l];
            }
            isum += sc * dot;
        }
        uint16_t hd;
        memcpy(&hd, wb + 108, 2);
        acc = fmaf(ed_f16_table[hd] * dy, (float)isum, acc);
    }
    return acc;
}

/* Q6_K: per super-block fma(d * d_y, Σ_s sc_s * Σ (q - 32) * y over sub-block s of 16, acc) */
static float x16_ref_q6_K(int n, const uint8_t *w, const uint8_t *a) {
    float acc = 0.0f;
    for (int b = 0; b < n / 256; b++) {
        const uint8_t *wb = w + (size_t)b * 210, *ab = a + (size_t)b * 292;
        float dy;
        memcpy(&dy, ab, 4);
        int q[256];
        for (int h = 0; h < 2; h++) /* ggml dequantize_row_q6_K's unpacking */
            for (int l = 0; l < 32; l++) {
                const uint8_t *ql = wb + 64 * h, *qh = wb + 128 + 32 * h;
                q[128 * h + l] = (ql[l] & 0xF) | ((qh[l] >> 0) & 3) << 4;
                q[128 * h + l + 32] = (ql[l + 32] & 0xF) | ((qh[l] >> 2) & 3) << 4;
                q[128 * h + l + 64] = (ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4;
                q[128 * h + l + 96] = (ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4;
            }
        int32_t isum = 0;
        for (int sb = 0; sb < 16; sb++) {
            int dot = 0;
            for (int i = 0; i < 16; i++) dot += (q[16 * sb + i] - 32) * (int8_t)ab[4 + 16 * sb + i];
            isum += (int8_t)wb[192 + sb] * dot;
        }
        uint16_t hd;
        memcpy(&hd, wb + 208, 2);
        acc = fmaf(ed_f16_table[hd] * dy, (float)isum, acc);
    }
    return acc;
}

/* Q4_1 (and Q5_1, q5) against Q8_1: per block fma(d_w * d_y, isum, acc), then fma(m_w, s_y, acc) */
static float x16_ref_q4_1(int n, const uint8_t *w, const uint8_t *a, int q5) {
    float acc = 0.0f;
    for (int b = 0; b < n / 32; b++) {
        const uint8_t *wb = w + (size_t)b * (q5 ? 24 : 20), *ab = a + (size_t)b * 36, *qs = wb + (q5 ? 8 : 4);
        uint32_t qh = 0;
        if (q5) memcpy(&qh, wb + 4, 4);
        int32_t isum = 0;
        for (int i = 0; i < 32; i++)
            isum += ((i < 16 ? qs[i] & 15 : qs[i - 16] >> 4) | (int)((qh >> i) & 1) << 4) * (int8_t)ab[4 + i];
        uint16_t hd, hm, yd, ys;
        memcpy(&hd, wb, 2), memcpy(&hm, wb + 2, 2), memcpy(&yd, ab, 2), memcpy(&ys, ab + 2, 2);
        acc = fmaf(ed_f16_table[hd] * ed_f16_table[yd], (float)isum, acc);
        acc = fmaf(ed_f16_table[hm], ed_f16_table[ys], acc);
    }
    return acc;
}

static float x16_ref(uint32_t wtype, int n, const uint8_t *w, const uint8_t *a) {
    if (wtype == ED_Q4_1 || wtype == ED_Q5_1) return x16_ref_q4_1(n, w, a, wtype == ED_Q5_1);
    if (wtype == ED_Q4_K || wtype == ED_Q5_K) return x16_ref_q4_K(n, w, a, wtype == ED_Q5_K);
    if (wtype == ED_Q6_K) return x16_ref_q6_K(n, w, a);
    if (wtype == ED_Q2_K) return x16_ref_q2_K(n, w, a);
    if (wtype == ED_Q3_K) return x16_ref_q3_K(n, w, a);
    float acc = 0.0f;
    const int bb = wtype == ED_Q8_0 ? 34 : wtype == ED_Q5_0 ? 22 : 18;
    for (int b = 0; b < n / 32; b++) {
        const uint8_t *wb = w + (size_t)b * bb, *ab = a + (size_t)b * 34;
        int32_t isum = 0;
        for (int i = 0; i < 32; i++) {
            int q;
            if (wtype == ED_Q8_0) q = (int8_t)wb[2 + i];
            else if (wtype == ED_Q5_0) {
                uint32_t qh;
                memcpy(&qh, wb + 2, 4);
                const int nib = i < 16 ? wb[6 + i] & 15 : wb[6 + i - 16] >> 4;
                q = (nib | (int)((qh >> i) & 1) << 4) - 16;
            } else {
                const int nib = i < 16 ? wb[2 + i] & 15 : wb[2 + i - 16] >> 4;
                q = wtype == ED_Q4_0 ? nib - 8 : iq4nl_values[nib];
            }
            isum += q * (int8_t)ab[2 + i];
        }
        uint16_t hw, ha;
        memcpy(&hw, wb, 2), memcpy(&ha, ab, 2);
        acc = fmaf(ed_f16_table[hw] * ed_f16_table[ha], (float)isum, acc);
    }
    return acc;
}

#define X16_WROWS 18
#define X16_ACTS 37 /* activation rows: AMX machines take whole 16s on tiles, the rest as decode does */
static int check_x16(const ed_kernel_table *k, const test_case *c, float *xr) {
    const ed_type_kernels *t = &k->types[c->wtype];
    if (!t->x16_gemm) return 0;
    const size_t ab = c->abytes, bb = (size_t)t->block_bytes, nb = c->wbytes / bb;
    uint8_t *acts = malloc(X16_ACTS * ab);
    for (int r = 0; r < X16_ACTS; r++) {
        for (uint32_t i = 0; i < c->n; i++) xr[i] = c->x[(i + 37u * (uint32_t)r) % c->n] * (1.0f + 0.25f * r);
        k->from_float[c->atype](xr, acts + r * ab, c->n);
    }
    uint8_t *w = malloc(X16_WROWS * c->wbytes);
    for (int r = 0; r < X16_WROWS; r++)
        for (size_t b = 0; b < nb; b++) memcpy(w + r * c->wbytes + b * bb, c->w + (b + r) % nb * bb, bb);
    /* rotations alone repeat every nb rows (a row of one super-block is every row): rows past the first also
     * get their quant and scale bytes flipped by a pattern of their own (the f16 fields kept, so no NaN) */
    for (int r = 1; r < X16_WROWS; r++)
        for (size_t i = 0; i < c->wbytes; i++) {
            const size_t at = i % bb;
            const int f16 = c->wtype == ED_Q6_K ? at >= 208 : c->wtype == ED_Q2_K ? at >= 80 : c->wtype == ED_Q3_K ? at >= 108 : at < (c->wtype == ED_Q4_1 || c->wtype == ED_Q5_1 || c->wtype == ED_Q4_K || c->wtype == ED_Q5_K ? 4u : 2u);
            if (!f16) w[r * c->wbytes + i] ^= (uint8_t)(29 * r + 7 * i);
        }
    const size_t xbytes = ed_x16_bytes((int)c->wtype, X16_WROWS, c->n), sb = ed_x16_side_bytes(c->n);
    uint8_t *x16 = aligned_alloc(64, (xbytes + 63) / 64 * 64), *side = malloc(X16_ACTS * sb);
    float *got = malloc(sizeof(float) * 19 * X16_ACTS);
    int fails = !ed_x16_repack((int)c->wtype, w, c->wbytes, X16_WROWS, c->n, x16);
    if (fails) printf("FAIL %-7s %s: ed_x16_repack refused the type\n", level_name(k->level), c->name);
    if (c->atype == ED_Q8_0)
        for (int r = 0; r < X16_ACTS; r++) ed_x16_side(acts + r * ab, c->n, side + r * sb);
    const size_t group = ed_x16_bytes((int)c->wtype, 16, c->n);
    static const int ncs[] = {1, 3, 8, NX_ROWS, 16, X16_ACTS};
    for (size_t ni = 0; ni < sizeof(ncs) / sizeof(ncs[0]) && !fails; ni++) {
        const int nc = ncs[ni];
        for (int i = 0; i < 19 * X16_ACTS; i++) got[i] = NAN;
        for (int g = 0; g < 2; g++) /* strides bs = 19 floats: the second group's 2 rows land at 16, 17 */
            t->x16_gemm((int)c->n, got + 16 * g, 19, x16 + (size_t)g * group, g ? X16_WROWS - 16 : 16, acts,
                         ab, side, sb, nc);
        for (int i = 0; i < nc && !fails; i++) {
            if (!isnan(got[19 * i + X16_WROWS])) {
                printf("FAIL %-7s %s: x16_gemm wrote past row %d\n", level_name(k->level), c->name, X16_WROWS);
                fails = 1;
            }
            for (int r = 0; r < X16_WROWS && !fails; r++) {
                const float want = x16_ref(c->wtype, (int)c->n, w + r * c->wbytes, acts + i * ab);
                if (memcmp(&got[19 * i + r], &want, sizeof(float))) {
                    printf("FAIL %-7s %s: x16_gemm (nc %d) weight row %d, row %d gives %.9g, x16 order %.9g\n",
                           level_name(k->level), c->name, nc, r, i, got[19 * i + r], want);
                    fails = 1;
                }
            }
        }
    }
    /* the case's own row against its own activation (row 0 of acts is x itself): the expected dot */
    if (!fails) {
        const float s = x16_ref(c->wtype, (int)c->n, c->w, acts);
        const double err = fabs((double)s - c->expected), tol = rtol(c->wtype) * c->magnitude;
        if (!(err <= tol)) {
            printf("FAIL %-7s %s: x16 dot %.9g, expected %.9g (error %.3g of magnitude %.6g)\n",
                   level_name(k->level), c->name, s, c->expected, err, c->magnitude);
            fails = 1;
        }
    }
    free(w), free(x16), free(side), free(got), free(acts);
    return fails;
}

/* Single-thread time per call with the row in L1: the best of many short batches, so that a shared,
 * busy machine's preemptions drop out. */
static void bench(const ed_kernel_table *k, const test_case *c, uint8_t *act) {
    const ed_type_kernels *t = &k->types[c->wtype];
    if (!t->vec_dot) return;
    const int reps = 50, batches = 2000;
    float s, sink = 0;
    double dot_ns = 1e30, q_ns = 1e30;
    for (int b = 0; b < batches; b++) {
        double t0 = now_ns();
        for (int r = 0; r < reps; r++) {
            t->vec_dot((int)c->n, &s, c->w, act);
            sink += s;
        }
        double t1 = now_ns();
        for (int r = 0; r < reps; r++) k->from_float[c->atype](c->x, act, c->n);
        double t2 = now_ns();
        dot_ns = (t1 - t0) / reps < dot_ns ? (t1 - t0) / reps : dot_ns;
        q_ns = (t2 - t1) / reps < q_ns ? (t2 - t1) / reps : q_ns;
    }
    double nx_ns = 1e30; /* per row, ED_NX_MAX rows (the same activation row) per call */
    float sx[ED_NX_MAX];
    for (int b = 0; b < batches; b++) {
        double t0 = now_ns();
        for (int r = 0; r < reps; r++) {
            ed_vec_dot_nx(t, (int)c->n, sx, 1, c->w, act, 0, ED_NX_MAX);
            sink += sx[0];
        }
        double t1 = now_ns();
        nx_ns = (t1 - t0) / reps / ED_NX_MAX < nx_ns ? (t1 - t0) / reps / ED_NX_MAX : nx_ns;
    }
    printf("bench %-7s %-40s %8.1f ns/dot (%5.1f GB/s of weights) %8.1f ns/dot in nx %8.1f ns/from_float%s\n",
           level_name(k->level), c->name, dot_ns, c->wbytes / dot_ns, nx_ns, q_ns, sink == 12345.f ? " " : "");
}

int main(int argc, char **argv) {
    const char *path = NULL;
    int do_bench = 0, only = -1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--bench")) do_bench = 1;
        else if (!strcmp(argv[i], "--level") && i + 1 < argc) {
            const char *l = argv[++i];
            for (int v = 0; v < 4; v++)
                if (!strcmp(l, level_name(v))) only = v;
            if (only < 0) { fprintf(stderr, "unknown level %s\n", l); return 2; }
        } else path = argv[i];
    }
    if (!path) {
        fprintf(stderr, "usage: %s CASES.bin [--level scalar|avx2|avx512|neon] [--bench]\n", argv[0]);
        return 2;
    }
    uint32_t count;
    test_case *cs = load(path, &count);
    if (!cs) return 2;
    size_t max_a = 0;
    for (uint32_t i = 0; i < count; i++) max_a = cs[i].abytes > max_a ? cs[i].abytes : max_a;
    uint8_t *act = (uint8_t *)aligned_alloc(64, (max_a + 127) / 64 * 64) + 4;
    uint8_t *acts = aligned_alloc(64, (NX_ROWS * max_a + 127) / 64 * 64);
    uint32_t max_n = 1;
    for (uint32_t i = 0; i < count; i++) max_n = cs[i].n > max_n ? cs[i].n : max_n;
    float *xr = malloc(max_n * sizeof(float));

    printf("cpu level %s, dotprod %d, avx512vnni %d, avx512bf16 %d, amx %d, avxvnni %d; %u cases\n",
           level_name(ed_cpu_level()), ed_cpu_has_dotprod(), ed_cpu_has_avx512vnni(), ed_cpu_has_avx512bf16(),
           ed_cpu_has_amx(), ed_cpu_has_avxvnni(), count);
    int failures = 0, levels = 0;
    for (int level = 0; level < 4; level++) {
        const ed_kernel_table *k = ed_kernels(level);
        if (!k || (only >= 0 && level != only)) continue;
        levels++;
        double worst = 0;
        int fails = 0;
        for (uint32_t i = 0; i < count; i++) {
            const int f = check(k, &cs[i], act, &worst);
            fails += f                              ? f
                     : check_nx(k, &cs[i], acts, xr) ? 1
                     : check_2nx(k, &cs[i], acts)    ? 1
                     : check_float_gemm(k, &cs[i], acts) ? 1
                     : check_amx(k, &cs[i], acts)    ? 1
                                                     : check_x16(k, &cs[i], xr);
        }
        printf("%-7s %u cases, %d failed, worst relative dot error %.2g\n", level_name(level), count, fails, worst);
        failures += fails;
        if (do_bench)
            for (uint32_t i = 0; i < count; i++) bench(k, &cs[i], act);
    }
    if (only >= 0 && !levels) {
        printf("level %s is not available on this CPU/build\n", level_name(only));
        return 3;
    }
    printf("%s: %d levels, %d failures\n", failures ? "FAILED" : "OK", levels, failures);
    return failures ? 1 : 0;
}
