/* The legacy types' repacked (x16) GEMM at the AVX2 level on CPUs with AVX-VNNI (the VEX vpdpbusd of Intel's
 * hybrid cores from Alder Lake on and the E-core Xeons, none with AVX-512): avx2_x16_legacy.h's
 * x16a_legacy_nc compiled with ED_X16A_VNNI, set over the AVX2 table's entries by set_x16_avx2
 * (avx2_x16.h) where ed_cpu_has_avxvnni(). The integer dots
 * are the AVX-512 VNNI kernels' (avx512_x16.h, ED_X16_GEMM) at 256 bits: each weight vector as unsigned
 * bytes (nibbles, Q5's fifth bits, Q8_0's stored x + 128, IQ4_NL's values + 128) against the activation's
 * signed bytes, the offset taken off once per block as -offset x the block's sum (the side table). The
 * integers are exact, so the bits are the AVX2 and AVX-512 kernels' (kernel_check's x16_ref checks all
 * three). EDGELLM_AVXVNNI=0 keeps the plain AVX2 kernels.
 */
#include <string.h>

#include "ed_blocks.h"

#if defined(ED_BUILD_AVXVNNI)
#include <immintrin.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avxvnni"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avxvnni")
#endif

#define ED_ALWAYS_INLINE static inline __attribute__((always_inline))
#define ED_X16A_VNNI 1
#include "avx2_x16_legacy.h" /* x16a_legacy_nc by vpdpbusd */

#define X16V(TYPE, NC) x16a_legacy_nc(TYPE, n, s, bs, vx, nr, y, by, sd, side_row, NC)
#define X16V_Q4_0(NC) X16V(ED_Q4_0, NC)
#define X16V_Q4_1(NC) X16V(ED_Q4_1, NC)
#define X16V_Q5_0(NC) X16V(ED_Q5_0, NC)
#define X16V_Q5_1(NC) X16V(ED_Q5_1, NC)
#define X16V_Q8_0(NC) X16V(ED_Q8_0, NC)
#define X16V_IQ4_NL(NC) X16V(ED_IQ4_NL, NC)
ED_X16A_ENTRY(x16v_gemm_q4_0, X16V_Q4_0)
ED_X16A_ENTRY(x16v_gemm_q4_1, X16V_Q4_1)
ED_X16A_ENTRY(x16v_gemm_q5_0, X16V_Q5_0)
ED_X16A_ENTRY(x16v_gemm_q5_1, X16V_Q5_1)
ED_X16A_ENTRY(x16v_gemm_q8_0, X16V_Q8_0)
ED_X16A_ENTRY(x16v_gemm_iq4_nl, X16V_IQ4_NL)

int ed_set_x16_avxvnni(ed_kernel_table *t) {
    t->types[ED_Q4_0].x16_gemm = x16v_gemm_q4_0;
    t->types[ED_Q4_1].x16_gemm = x16v_gemm_q4_1;
    t->types[ED_Q5_0].x16_gemm = x16v_gemm_q5_0;
    t->types[ED_Q5_1].x16_gemm = x16v_gemm_q5_1;
    t->types[ED_Q8_0].x16_gemm = x16v_gemm_q8_0;
    t->types[ED_IQ4_NL].x16_gemm = x16v_gemm_iq4_nl;
    return 1;
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#else
int ed_set_x16_avxvnni(ed_kernel_table *t) { /* no x86-64, or a compiler without AVX-VNNI: the AVX2 kernels */
    (void)t;
    return 0;
}
#endif
