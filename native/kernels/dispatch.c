/* Runtime selection of the kernel level: CPU feature detection and one lazily built table per level.
 *
 * x86-64: cpuid for AVX2/FMA/F16C and AVX-512 F/BW/VL(/VNNI/BF16), with XGETBV confirming the OS saves the
 * YMM/ZMM state (ggml-cpu/arch/x86/cpu-feats.cpp does the same checks). aarch64: NEON is baseline;
 * the dot-product extension (sdot) comes from getauxval(AT_HWCAP) & HWCAP_ASIMDDP (sysctl on Apple).
 */
#define _GNU_SOURCE /* syscall() */
#include "ed_blocks.h"

#include <stdlib.h>

#if defined(__x86_64__) || defined(_M_X64)
#include <cpuid.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#elif defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#elif defined(__aarch64__) && defined(__APPLE__)
#include <sys/sysctl.h>
#endif

/* ------------------------------------------------------------------------------ CPU features */

enum {
    F_AVX2 = 1, F_AVX512 = 2, F_AVX512VNNI = 4, F_DOTPROD = 8, F_AMX = 16, F_AVX512BF16 = 32, F_INTEL = 64,
    F_AVXVNNI = 128,
    F_KNOWN = 1 << 30
};
static int g_features;

#if defined(__x86_64__) || defined(_M_X64)
static uint64_t xgetbv0(void) {
    uint32_t eax, edx;
    __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
    return ((uint64_t)edx << 32) | eax;
}

/* AMX int8 tiles: CPUID.7.0 EDX bits 24 (amx_tile) and 25 (amx_int8), XCR0 bits 17-18 (tile config and
 * data), then Linux's per-process grant of the tile data (XFEATURE_XTILEDATA = 18): without it the
 * first tile instruction faults. The kernel refuses the grant (ENOSPC) where a thread's sigaltstack is
 * too small for the larger signal frame, and then there is no AMX. */
static int amx_usable(uint32_t edx7, uint64_t xcr0) {
    const char *env = getenv("EDGELLM_AMX");
    if (env && env[0] == '0') return 0;
    if (!((edx7 >> 24) & 1) || !((edx7 >> 25) & 1) || (xcr0 & 0x60000) != 0x60000) return 0;
#if defined(__linux__) && defined(SYS_arch_prctl)
    return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18) == 0;
#else
    return 0;
#endif
}
#endif

static int detect(void) {
    int f = 0;
#if defined(__x86_64__) || defined(_M_X64)
    unsigned a = 0, b = 0, c = 0, d = 0; /* (gcc -O1 cannot see __get_cpuid set them) */
    if (__get_cpuid(0, &a, &b, &c, &d) && b == 0x756e6547u && d == 0x49656e69u && c == 0x6c65746eu)
        f |= F_INTEL; /* "Genu" "ineI" "ntel" in ebx, edx, ecx */
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    const int osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, fma = (c >> 12) & 1, f16c = (c >> 29) & 1;
    if (!osxsave || !avx) return 0;
    const uint64_t xcr0 = xgetbv0();
    const int os_ymm = (xcr0 & 0x6) == 0x6;      /* SSE + AVX state */
    const int os_zmm = (xcr0 & 0xE6) == 0xE6;    /* + opmask, ZMM0-15 upper halves, ZMM16-31 */
    if (__get_cpuid_max(0, 0) < 7) return 0;
    __cpuid_count(7, 0, a, b, c, d);
    const unsigned leaf7_subleaves = a; /* subleaf 1 holds AVX512_BF16 (EAX bit 5) */
    const int avx2 = (b >> 5) & 1, avx512f = (b >> 16) & 1, avx512bw = (b >> 30) & 1;
    const int avx512vl = (b >> 31) & 1, avx512vnni = (c >> 11) & 1;
    if (os_ymm && avx2 && fma && f16c) f |= F_AVX2;
#if defined(ED_BUILD_AVXVNNI)
    if ((f & F_AVX2) && leaf7_subleaves >= 1) { /* AVX-VNNI: CPUID.(7,1) EAX bit 4; EDGELLM_AVXVNNI=0 drops it */
        const char *env = getenv("EDGELLM_AVXVNNI");
        unsigned a1 = 0, b1 = 0, c1 = 0, d1 = 0;
        __cpuid_count(7, 1, a1, b1, c1, d1);
        if (((a1 >> 4) & 1) && !(env && env[0] == '0')) f |= F_AVXVNNI;
    }
#endif
    if ((f & F_AVX2) && os_zmm && avx512f && avx512bw && avx512vl) {
        f |= F_AVX512;
        if (avx512vnni) f |= F_AVX512VNNI;
        if (avx512vnni && amx_usable(d, xcr0)) f |= F_AMX;
        if (leaf7_subleaves >= 1) {
            __cpuid_count(7, 1, a, b, c, d);
            if ((a >> 5) & 1) f |= F_AVX512BF16;
        }
    }
#if defined(ED_EMULATE_AVX512) /* tests: avx512.c runs on SIMDe; ED_EMULATE_VNNI=0 picks the BW variant */
    if (f & F_AVX2) { /* assigned, not OR-ed: =0 must switch off a real VNNI bit too, so both variants
                       * run on every x86 host (an AVX-512 + VNNI Xeon included) */
        const char *vnni = getenv("ED_EMULATE_VNNI");
        f = (f & ~(F_AVX512VNNI | F_AMX | F_AVX512BF16)) | F_AVX512 | (vnni && vnni[0] == '0' ? 0 : F_AVX512VNNI);
        const char *bf16 = getenv("ED_EMULATE_BF16"); /* =0: the FMA kernels for BF16 */
        if (!(bf16 && bf16[0] == '0')) f |= F_AVX512BF16;
    }
#endif
#elif defined(__aarch64__) && defined(__linux__)
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif
    if (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) f |= F_DOTPROD;
#elif defined(__aarch64__) && defined(__APPLE__)
    int v = 0;
    size_t len = sizeof(v);
    if (sysctlbyname("hw.optional.arm.FEAT_DotProd", &v, &len, NULL, 0) == 0 && v) f |= F_DOTPROD;
#endif
    return f;
}

static int features(void) {
    int f = __atomic_load_n(&g_features, __ATOMIC_ACQUIRE);
    if (!(f & F_KNOWN)) {
        f = detect() | F_KNOWN; /* idempotent: racing threads store the same value */
        __atomic_store_n(&g_features, f, __ATOMIC_RELEASE);
    }
    return f;
}

int ed_cpu_has_dotprod(void) { return (features() & F_DOTPROD) != 0; }

int ed_cpu_has_avx512vnni(void) { return (features() & F_AVX512VNNI) != 0; }

int ed_cpu_has_amx(void) { return (features() & F_AMX) != 0; }

int ed_cpu_has_avxvnni(void) { return (features() & F_AVXVNNI) != 0; }

int ed_cpu_has_avx512bf16(void) { return (features() & F_AVX512BF16) != 0; }

int ed_cpu_is_intel(void) { return (features() & F_INTEL) != 0; }

int ed_cpu_family(void) {
#if defined(__x86_64__) || defined(_M_X64)
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    const int base = (a >> 8) & 0xF;
    return base == 0xF ? base + (int)((a >> 20) & 0xFF) : base;
#else
    return 0;
#endif
}

size_t ed_env_bytes(const char *name, size_t fallback) {
    const char *v = getenv(name);
    if (!v || !*v) return fallback;
    char *end;
    const unsigned long long n = strtoull(v, &end, 10);
    return *end == '\0' && n <= (1u << 20) ? (size_t)n : fallback;
}

/* ------------------------------------------------------------------------------------- tables */

void ed_table_init_common(ed_kernel_table *t, int level) {
    static const struct { int type, elems, bytes, dot_type; } w[] = {
        {ED_F32, 1, 4, ED_F32},       {ED_F16, 1, 2, ED_F16},       {ED_BF16, 1, 2, ED_BF16},
        {ED_Q4_0, QK, 18, ED_Q8_0},   {ED_Q4_1, QK, 20, ED_Q8_1},   {ED_Q5_0, QK, 22, ED_Q8_0},
        {ED_Q5_1, QK, 24, ED_Q8_1},   {ED_Q8_0, QK, 34, ED_Q8_0},   {ED_IQ4_NL, QK, 18, ED_Q8_0},
        {ED_Q2_K, QK_K, 84, ED_Q8_K}, {ED_Q3_K, QK_K, 110, ED_Q8_K}, {ED_Q4_K, QK_K, 144, ED_Q8_K},
        {ED_Q5_K, QK_K, 176, ED_Q8_K}, {ED_Q6_K, QK_K, 210, ED_Q8_K},
    };
    static const struct { int type, elems, bytes; } a[] = {
        {ED_Q8_0, QK, 34}, {ED_Q8_1, QK, 36}, {ED_Q8_K, QK_K, 292}, {ED_F16, 1, 2}, {ED_BF16, 1, 2}, {ED_F32, 1, 4},
    };
    memset(t, 0, sizeof(*t));
    t->level = level;
    for (size_t i = 0; i < sizeof(w) / sizeof(w[0]); i++) {
        t->types[w[i].type].vec_dot_type = w[i].dot_type;
        t->types[w[i].type].block_elems = w[i].elems;
        t->types[w[i].type].block_bytes = w[i].bytes;
    }
    for (size_t i = 0; i < sizeof(a) / sizeof(a[0]); i++) {
        t->act_block_elems[a[i].type] = a[i].elems;
        t->act_block_bytes[a[i].type] = a[i].bytes;
    }
}

static int fill(ed_kernel_table *t, int level, int f) {
    switch (level) {
    case ED_LEVEL_SCALAR: return ed_fill_scalar(t);
    case ED_LEVEL_AVX2: return (f & F_AVX2) && ed_fill_avx2(t);
    case ED_LEVEL_AVX512: return (f & F_AVX512) && ed_fill_avx512(t);
    case ED_LEVEL_NEON: return ed_fill_neon(t, (f & F_DOTPROD) != 0);
    default: return 0;
    }
}

float ed_f16_table[1 << 16];

static ed_kernel_table g_tables[4];
static int g_state[4]; /* 0: not built yet, 1: available, 2: unavailable */
static char g_lock;

const ed_kernel_table *ed_kernels(int level) {
    if (level < 0 || level > 3) return NULL;
    int st = __atomic_load_n(&g_state[level], __ATOMIC_ACQUIRE);
    if (st == 0) {
        while (__atomic_test_and_set(&g_lock, __ATOMIC_ACQUIRE)) {
        }
        st = g_state[level];
        if (!ed_f16_table[0x3C00]) /* 1.0: not filled yet */
            for (uint32_t h = 0; h < (1u << 16); h++) ed_f16_table[h] = ed_f16_to_f32((uint16_t)h);
        if (st == 0) {
            st = fill(&g_tables[level], level, features()) ? 1 : 2;
            __atomic_store_n(&g_state[level], st, __ATOMIC_RELEASE);
        }
        __atomic_clear(&g_lock, __ATOMIC_RELEASE);
    }
    return st == 1 ? &g_tables[level] : NULL;
}

int ed_cpu_level(void) {
    static const int order[] = {ED_LEVEL_AVX512, ED_LEVEL_AVX2, ED_LEVEL_NEON};
    for (size_t i = 0; i < sizeof(order) / sizeof(order[0]); i++)
        if (ed_kernels(order[i])) return order[i];
    return ED_LEVEL_SCALAR;
}

void ed_vec_dot_nx(const ed_type_kernels *t, int n, float *s, size_t bs, const void *vx, const void *vy, size_t by,
                   int nc) {
    if (t->vec_dot_nx) {
        t->vec_dot_nx(n, s, bs, vx, vy, by, nc);
        return;
    }
    for (int c = 0; c < nc; c++) t->vec_dot(n, s + c * bs, vx, (const uint8_t *)vy + c * by);
}

size_t ed_act_row_bytes(int t, int64_t n) {
    const ed_kernel_table *k = ed_kernels(ED_LEVEL_SCALAR);
    if (t < 0 || t >= ED_TYPE_COUNT || n < 0 || !k->act_block_elems[t]) return 0;
    const int64_t blocks = (n + k->act_block_elems[t] - 1) / k->act_block_elems[t]; /* rounded up */
    return (size_t)blocks * (size_t)k->act_block_bytes[t];
}
