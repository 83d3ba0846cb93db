/* edgellm native kernels: the contract between the quantized dot-product kernels (native/kernels/) and
 * the runtime that drives them (native/runtime/: thread pool, matmul/GEMM driver, plan executor).
 *
 * Block layouts are ggml's (ggml-common.h in ggml-org/llama.cpp): block_q4_0, block_q4_1, block_q5_0,
 * block_q5_1, block_q8_0, block_q8_1, block_q2_K, block_q3_K, block_q4_K, block_q5_K, block_q6_K, block_q8_K,
 * f16, bf16, f32.
 *
 * A matmul multiplies weight rows (type W) with activation rows quantized ONCE per matmul to W's
 * vec_dot type, exactly as ggml-cpu pairs them (type_traits_cpu[W].vec_dot_type):
 *   Q4_0, Q5_0, Q8_0, IQ4_NL -> Q8_0      Q4_1, Q5_1 -> Q8_1
 *   Q2_K .. Q6_K              -> Q8_K      F16 -> F16     BF16 -> BF16     F32 -> F32
 * Activation quantizers round with round-to-nearest-even (rint), in every code path, so every code path
 * produces bit-identical quantized activations; dot products then differ only by float summation order.
 */
#ifndef ED_KERNELS_H
#define ED_KERNELS_H

#include <stddef.h>
#include <stdint.h>

/* ggml type ids (enum ggml_type) */
enum {
    ED_F32 = 0, ED_F16 = 1, ED_Q4_0 = 2, ED_Q4_1 = 3, ED_Q5_0 = 6, ED_Q5_1 = 7, ED_Q8_0 = 8, ED_Q8_1 = 9,
    ED_Q2_K = 10, ED_Q3_K = 11, ED_Q4_K = 12, ED_Q5_K = 13, ED_Q6_K = 14, ED_Q8_K = 15, ED_IQ4_NL = 20,
    ED_BF16 = 30, ED_TYPE_COUNT = 40
};

/* code paths, best last; ed_cpu_level() says which the running CPU supports */
enum { ED_LEVEL_SCALAR = 0, ED_LEVEL_AVX2 = 1, ED_LEVEL_AVX512 = 2, ED_LEVEL_NEON = 3 };

/* s[0] = dot(weight row vx, activation row vy) over n elements (n a multiple of the block size). */
typedef void (*ed_vec_dot_fn)(int n, float *s, const void *vx, const void *vy);
/* s[c * bs] = dot(vx, vy + c * by) for c < nc (1 <= nc <= ED_NX_MAX): one weight row against nc activation
 * rows, each weight block unpacked once for all of them. Every s[c * bs] is bit-identical to vec_dot's
 * (the same float operations in the same order per output), so callers may mix the two freely. */
typedef void (*ed_vec_dot_nx_fn)(int n, float *s, size_t bs, const void *vx, const void *vy, size_t by, int nc);
#define ED_NX_MAX 8
/* s[c * bs + r] = dot(vx + r * bx, vy + c * by) for r < 2, c < nc (1 <= nc <= ED_NX_MAX): two weight rows
 * against nc activation rows, each activation block loaded once for both; bit-identical to vec_dot too. */
typedef void (*ed_vec_dot_2nx_fn)(int n, float *s, size_t bs, const void *vx, size_t bx, const void *vy, size_t by,
                                  int nc);
/* AMX (amx_tile + amx_int8): activation row `lane` of a tile of ED_AMX_ROWS rows packed for the tile GEMM
 * (y: the row quantized to Q8_0 / Q8_1 / Q8_K, n elements; NULL packs a row of zeros); tile: n / 32 blocks of
 * ED_AMX_BLOCK_BYTES, or for Q8_K n / 256 of ED_AMX_KBLOCK_BYTES. */
typedef void (*ed_amx_pack_fn)(const void *y, int n, void *tile, int lane);
/* s[c * bs + r] = dot(vx + r * bx, activation row c) for r < nr (<= ED_AMX_ROWS) and c < nc, the
 * activations packed in whole tiles; scratch holds n / 32 * ED_AMX_WBLOCK_BYTES. Bit-identical to vec_dot. */
typedef void (*ed_amx_gemm_fn)(int n, float *s, size_t bs, const void *vx, size_t bx, int nr, const void *packed,
                               int nc, void *scratch);
#define ED_AMX_ROWS 16
#define ED_AMX_BLOCK_BYTES 704   /* a packed Q8_0 / Q8_1 block (32 elements) of a tile */
#define ED_AMX_KBLOCK_BYTES 4928 /* a packed Q8_K super-block (256 elements) of a tile */
#define ED_AMX_WBLOCK_BYTES 720  /* amx_gemm's scratch per 32 weight elements */
/* Repacked weights (x16): rows in groups of ED_X16_ROWS, each group's blocks interleaved so that a SIMD
 * lane holds one weight row (llama.cpp's ggml-cpu repack.cpp interleaves Q4_0/IQ4_NL/Q8_0 rows the same
 * way for its ggml_gemm_* kernels). Group g, block b starts at (g * nb + b) * 16 * block_bytes: the 16
 * rows' f16 scales, then their quants in 64-byte chunks, chunk j holding 4 consecutive quant bytes of
 * each row (row r at bytes 4r..4r+3): Q4_0 / IQ4_NL chunk j (0..3) = qs[4j..4j+3] (low nibbles: quants
 * 4j.., high: 16+4j..); Q8_0 chunk j (0..7) = qs[4j..4j+3] + 128, unsigned. Q4_1 has the 16 rows' f16
 * mins after the scales, then Q4_0's chunks; Q5_0 and Q5_1 put 8 64-bit masks of the fifth bits before
 * the nibbles (x16.c's lane_masks). Rows past the last are zero.
 * One output is Σ_b fma(d_w * d_y, (float) isum_b, acc) in block order, isum_b the block's exact integer
 * dot (Q4_1, Q5_1, against Q8_1: then acc = fma(m_w, s_y, acc), s_y the activation block's f16 d * Σq): the same
 * bits at every level and batch size (decode and prompts), not vec_dot's bits. */
#define ED_X16_ROWS 16
/* Byte offsets in a K-quant group block (one super-block of 16 rows; native/kernels/x16.c's lane_q2_K,
 * lane_q4_K, lane_q5_K and lane_q6_K say what each holds), shared by the repacker and every level's
 * kernels. Q5_K is Q4_K's block with the fifth bits (the file's qh, in 4-byte steps per row) before the
 * nibbles; Q2_K is the file's size (scale bytes [16][16], then the 2-bit quants in 4-byte steps); Q3_K
 * has Q6_K's scale pairs and Q2_K's quant chunks, then its high bits (hmask) in 4-byte steps. */
#define Q4K_SC 64
#define Q4K_MIN 192
#define Q4K_QS 320
#define Q4K_GROUP (Q4K_QS + 2048)
#define Q5K_QH Q4K_QS
#define Q5K_QS (Q5K_QH + 512)
#define Q5K_GROUP (Q5K_QS + 2048)
#define Q2K_SC 64
#define Q2K_QS (Q2K_SC + 256)
#define Q2K_GROUP (Q2K_QS + 1024)
#define Q3K_SC Q6K_SC /* Q6_K's d and scale pairs */
#define Q3K_QS 288
#define Q3K_HM (Q3K_QS + 1024)
#define Q3K_GROUP (Q3K_HM + 512)
#define Q6K_SC 32
#define Q6K_QL 288
#define Q6K_QH (Q6K_QL + 2048)
#define Q6K_GROUP (Q6K_QH + 1024)
/* and in a Q4_1 group block: the 16 rows' f16 mins, then their nibbles in Q4_0's chunks; Q5_1 has Q5_0's
 * 64 bytes of fifth-bit masks between the mins and the nibbles */
#define Q41_MIN 32
#define Q41_QS 64
#define Q51_QS (Q41_QS + 64)
/* s[c * bs + r] for r < nr (<= 16), c < nc: group vx against activation rows vy + c * by (quantized to
 * the vec_dot type), side + c * side_row their side tables (ed_x16_side) */
typedef void (*ed_x16_gemm_fn)(int n, float *s, size_t bs, const void *vx, int nr, const void *vy, size_t by,
                               const void *side, size_t side_row, int nc);
/* A Q8_0 activation row's side table: its blocks' scales as float, then their quant sums as int32. */
void ed_x16_side(const void *y, int64_t n, void *side);
/* Bytes of the side table of a row of n elements. */
size_t ed_x16_side_bytes(int64_t n);
/* Bytes of `rows` weight rows of n elements of type t repacked (rows rounded up to a whole group), or 0
 * for a type that has no repacked layout. */
size_t ed_x16_bytes(int t, int64_t rows, int64_t n);
/* Repack `rows` rows (row_bytes apart) of type t into dst (ed_x16_bytes of it); 0 if t has no layout. */
int ed_x16_repack(int t, const void *src, size_t row_bytes, int64_t rows, int64_t n, void *dst);
/* F16 / BF16 weights in prompts: s[c * bs + r] = dot(vx + r * bx, activation row c) for r < nr, c < nc
 * (any counts: the kernel blocks them for its register tile), the activation rows given as float32
 * (y + c * ly) holding their F16 / BF16 values exactly (the vec_dot type's rows converted back), so that
 * only the weights need converting; bit-identical to vec_dot. */
typedef void (*ed_float_gemm_fn)(int n, float *s, size_t bs, const void *vx, size_t bx, int nr, const float *y,
                                 size_t ly, int nc);
/* y = x (n floats) converted to an activation type (Q8_0, Q8_1, Q8_K, F16, BF16; F32 is a copy). */
typedef void (*ed_from_float_fn)(const float *x, void *y, int64_t n);

typedef struct {
    ed_vec_dot_fn vec_dot;      /* NULL: this weight type has no kernel */
    ed_vec_dot_nx_fn vec_dot_nx; /* NULL: callers loop over vec_dot (ed_vec_dot_nx does) */
    ed_vec_dot_2nx_fn vec_dot_2nx; /* NULL: callers take one weight row at a time */
    ed_amx_gemm_fn amx_gemm;    /* NULL: no AMX tile GEMM */
    ed_x16_gemm_fn x16_gemm;    /* NULL: no kernel for this type's repacked (x16) layout */
    ed_float_gemm_fn float_gemm; /* NULL: prompts take vec_dot_2nx / vec_dot_nx */
    int vec_dot_type;           /* ED_Q8_0, ED_Q8_1, ED_Q8_K, ED_F16, ED_BF16 or ED_F32 */
    int block_elems;            /* elements per block of the weight type (32, 256, 1) */
    int block_bytes;            /* bytes per block of the weight type */
} ed_type_kernels;

typedef struct {
    int level;                                   /* the ED_LEVEL_* these kernels are compiled for */
    ed_type_kernels types[ED_TYPE_COUNT];        /* indexed by weight type */
    ed_from_float_fn from_float[ED_TYPE_COUNT];  /* indexed by activation type (Q8_0, Q8_1, Q8_K, F16, BF16, F32) */
    ed_amx_pack_fn amx_pack[ED_TYPE_COUNT];      /* indexed by activation type; NULL: no AMX */
    int act_block_elems[ED_TYPE_COUNT];          /* elements / bytes per block of each activation type */
    int act_block_bytes[ED_TYPE_COUNT];
} ed_kernel_table;

/* The best level this CPU runs (cpuid + OS support on x86; getauxval HWCAP on aarch64). */
int ed_cpu_level(void);
/* Whether the aarch64 dot-product extension (sdot) is present (0 elsewhere). */
int ed_cpu_has_dotprod(void);
/* Whether AVX-512 VNNI (vpdpbusd) is present; the AVX-512 table then uses it (0 elsewhere). */
int ed_cpu_has_avx512vnni(void);
/* Whether AVX-512 BF16 (vdpbf16ps) is present; the AVX-512 table then takes BF16 weights with it. */
int ed_cpu_has_avx512bf16(void);
/* Whether AMX int8 tiles are usable: amx_tile + amx_int8, the OS saving tile state, and Linux granting
 * this process the tile data (arch_prctl ARCH_REQ_XCOMP_PERM); EDGELLM_AMX=0 switches them off. */
int ed_cpu_has_amx(void);
/* Whether AVX-VNNI (VEX vpdpbusd at 256 bits) is present and this build has its kernels (ED_BUILD_AVXVNNI):
 * the AVX2 table's legacy x16 GEMMs then take it; EDGELLM_AVXVNNI=0 switches it off. */
#if (defined(__x86_64__) || defined(_M_X64)) &&                                                                    \
    (defined(__clang__) ? __clang_major__ >= 12 : (defined(__GNUC__) && __GNUC__ >= 11))
#define ED_BUILD_AVXVNNI 1 /* GCC 11 and clang 12 know the avxvnni target and _mm256_dpbusd_avx_epi32 */
#endif
int ed_cpu_has_avxvnni(void);
/* The CPU's vendor is Intel (CPUID leaf 0): tunings measured per vendor, e.g. x16 Q4_K's prefetch. */
int ed_cpu_is_intel(void);
/* CPUID's display family on x86 (base + extended: AMD's Zen 3 and Zen 4 are 0x19, Zen 5 0x1A), else 0. */
int ed_cpu_family(void);
/* $name as a byte count (decimal, at most 1 MiB), else fallback: the decode prefetch distances can be
 * set from the environment (EDGELLM_PF_Q4K, EDGELLM_PF_Q6K, EDGELLM_PF_AVX2, EDGELLM_PF_AVX2_Q4K) to
 * measure them on a new CPU, as can attention's AVX2 loops (EDGELLM_ATTN_FMA, 0 or 1). */
size_t ed_env_bytes(const char *name, size_t fallback);
/* The kernel table for a level, or NULL when that level was not compiled into this build or the CPU
 * cannot run it. Each level's functions live in their own translation unit or carry
 * __attribute__((target(...))) so one x86 build carries scalar, AVX2 and AVX-512 without -march flags. */
const ed_kernel_table *ed_kernels(int level);

/* vec_dot_nx of type t in table k, or the loop over vec_dot where the table has none. */
void ed_vec_dot_nx(const ed_type_kernels *t, int n, float *s, size_t bs, const void *vx, const void *vy, size_t by,
                   int nc);

/* Bytes of an activation row of n elements in type t (for scratch sizing); 0 if t is unknown. */
size_t ed_act_row_bytes(int t, int64_t n);

#endif
