"""The decode kernels' block dots, written as LLVM vector IR (Numba intrinsics).

LLVM's SLP vectorizer turns the scalar unrolled dots of legacy.py and kquants.py into vector code, but
widens every product to 32 bits and ends each 32-element block with its own horizontal sum: ~40
instructions a block. Here the same integers are computed on explicit vectors: quants unpacked as
<32 x i8>, products in i16, pairs summed to i32, and the sums of eight blocks reduced together in one
transpose tree. This IR is target-independent: LLVM lowers it to NEON, SSE or whatever the machine has,
so the numba backend stays portable. Where Numba compiles for x86-64 with AVX2 and F16C (X86 below), the
legacy blocks, Q4_K and Q6_K take x86's byte dot products instead (vpdpbusd with AVX-512 VNNI, else
vpmaddubsw + vpmaddwd) and vcvtph2ps: the same integers and floats, so the same bits (a test compares
the two paths).

Integer sums are exact in any order, so they equal the scalar loops' (and ggml-cpu's *_generic dot
products they follow). The legacy blocks' float terms are taken here too, eight at a time, each lane with
the scalar operations in legacy._term's order (the f16 scales converted as common.f16_to_f32 does), and
added to the running sum one by one in block order: the same bits. The K-quants' float lanes stay in
kquants.py. Layouts: ggml-org/llama.cpp ggml/src/ggml-common.h (block_q4_0 .. block_q8_0, block_q4_K,
block_q6_K).
"""

from __future__ import annotations

import os

import llvmlite.binding as llvm
import numba
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 = range(5)  # legacy.py's kinds (it takes them from here)
BLOCK_BYTES = {Q4_0: 18, Q4_1: 20, Q5_0: 22, Q5_1: 24, Q8_0: 34}
GROUP = 8  # blocks per acc8_* call

_i8, _i16, _i32, _i64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)


def _x86_level() -> str:
    """What Numba compiles for (numba.core.codegen's choice: NUMBA_CPU_FEATURES, else the host's features):
    "vnni" (x86-64 with AVX-512 VNNI and VL, which has AVX2 and F16C), "avx2" (with F16C), or "" (any other
    CPU: the portable IR). EDGELLM_NUMBA_SIMD=generic forces "" (tests compare the two)."""
    if os.environ.get("EDGELLM_NUMBA_SIMD", "").lower() == "generic":
        return ""
    if not llvm.get_process_triple().startswith("x86_64"):
        return ""
    features = numba.config.CPU_FEATURES
    if features is None:
        features = llvm.get_host_cpu_features().flatten()
    have = set(features.split(","))
    if not {"+avx2", "+f16c"} <= have:
        return ""
    return "vnni" if {"+avx512vnni", "+avx512vl"} <= have else "avx2"


# The legacy blocks' integer dots with x86's byte multiply-adds, as ggml's AVX2 dots do
# (ggml-org/llama.cpp ggml/src/ggml-cpu/arch/x86/quants.c mul_sum_us8_pairs_float, mul_sum_i8_pairs_float):
# vpdpbusd with VNNI, else vpmaddubsw + vpmaddwd; f16 scales with vcvtph2ps. Else portable IR.
X86 = _x86_level()


def _vec(t: ir.IntType, n: int) -> ir.VectorType:
    return ir.VectorType(t, n)


def _const(t: ir.IntType, vals: list[int]) -> ir.Constant:
    return ir.Constant(_vec(t, len(vals)), [ir.Constant(t, v) for v in vals])


def _splat(t: ir.IntType, v: int, n: int) -> ir.Constant:
    return _const(t, [v] * n)


def _at(builder, ptr, offset: int):
    return builder.gep(ptr, [ir.Constant(_i64, offset)])


def _load(builder, ptr, ty):
    """An unaligned load of ty at a byte pointer."""
    return builder.load(builder.bitcast(ptr, ty.as_pointer()), align=1)


def _shuffle(builder, x, y, idx: list[int]):
    return builder.shuffle_vector(x, y, _const(_i32, idx))


def _c(x, value: int) -> ir.Constant:
    """value splatted to the type of vector x."""
    return _splat(x.type.element, value, x.type.count)


def _adjacent_sums(builder, v):
    """<2n x iK> -> <n x iK>: lanes 2i and 2i + 1 added."""
    n = v.type.count
    return builder.add(
        _shuffle(builder, v, v, list(range(0, n, 2))), _shuffle(builder, v, v, list(range(1, n, 2)))
    )


def _half_sums(builder, v):
    """<2n x iK> -> <n x iK>: lane i plus lane n + i."""
    n = v.type.count // 2
    return builder.add(
        _shuffle(builder, v, v, list(range(n))), _shuffle(builder, v, v, list(range(n, 2 * n)))
    )


def _store8(context, builder, arrty, arr, v):
    """<8 x i32> v into arr[0:8]."""
    op = _data(context, builder, arrty, arr, ir.Constant(_i64, 0))
    builder.store(v, builder.bitcast(op, _vec(_i32, 8).as_pointer()), align=4)


def _data(context, builder, arrty, arr, offset):
    """Pointer to element `offset` of a 1-d array."""
    return builder.gep(context.make_array(arrty)(context, builder, arr).data, [offset])


def _nibbles(builder, qs):
    """<16 x i8> bytes -> <32 x i8>: the low nibbles (elements 0..15), then the high (16..31)."""
    if X86:  # the bytes in both halves (vbroadcasti128), the upper half's 32-bit lanes shifted by 4 (vpsrlvd)
        both = builder.bitcast(_shuffle(builder, qs, qs, list(range(16)) * 2), _vec(_i32, 8))
        both = builder.lshr(both, _const(_i32, [0] * 4 + [4] * 4))
        return builder.and_(builder.bitcast(both, _vec(_i8, 32)), _splat(_i8, 15, 32))
    lo = builder.and_(qs, _splat(_i8, 15, 16))
    hi = builder.lshr(qs, _splat(_i8, 4, 16))
    return _shuffle(builder, lo, hi, list(range(32)))


def _fifth_bits(builder, qh_ptr):
    """The 32 bits of a Q5 block's qh (little-endian) as <32 x i8> of 16 (bit set) or 0."""
    qh = _load(builder, qh_ptr, _vec(_i8, 4))
    spread = _shuffle(builder, qh, qh, [k // 8 for k in range(32)])
    bits = builder.and_(spread, _const(_i8, [1 << (k % 8) for k in range(32)]))
    is_set = builder.icmp_unsigned("!=", bits, ir.Constant(_vec(_i8, 32), None))
    return builder.select(is_set, _splat(_i8, 16, 32), ir.Constant(_vec(_i8, 32), None))


def _unsigned_quants(builder, kind: int, blk):
    """A 4- or 5-bit legacy block's 32 quants as <32 x i8>, in element order, before any offset."""
    if kind in (Q4_0, Q4_1):
        return _nibbles(builder, _load(builder, _at(builder, blk, 2 if kind == Q4_0 else 4), _vec(_i8, 16)))
    p = 2 if kind == Q5_0 else 4  # qh; qs follows it
    low4 = _nibbles(builder, _load(builder, _at(builder, blk, p + 4), _vec(_i8, 16)))
    return builder.or_(low4, _fifth_bits(builder, _at(builder, blk, p)))


def _legacy_quants(builder, kind: int, blk):
    """One legacy block's 32 quants as <32 x i8>, in element order, offsets applied (Q4_0 -8, Q5_0 -16)."""
    if kind == Q8_0:
        return _load(builder, _at(builder, blk, 2), _vec(_i8, 32))
    q = _unsigned_quants(builder, kind, blk)
    return builder.sub(q, _splat(_i8, 8 if kind == Q4_0 else 16, 32)) if kind in (Q4_0, Q5_0) else q


def _products(builder, q, a):
    """<32 x i8> q and a -> <32 x i16> q * a."""
    return builder.mul(builder.sext(q, _vec(_i16, 32)), builder.sext(a, _vec(_i16, 32)))


def _pair_sums(builder, q, a):
    """<32 x i8> quants and activations -> <16 x i32>: products summed in adjacent pairs (|q a| < 2^15)."""
    return _adjacent_sums(builder, builder.sext(_products(builder, q, a), _vec(_i32, 32)))


def _call_intrinsic(builder, name: str, ret, *args):
    """A call of the LLVM intrinsic `name` (its full, type-suffixed name) returning ret."""
    fnty = ir.FunctionType(ret, [a.type for a in args])
    return builder.call(builder.module.declare_intrinsic(name, fnty=fnty), list(args))


def _maddubs(builder, u, s):
    """vpmaddubsw: <32 x i8> unsigned u times signed s, adjacent products summed -> <16 x i16> (saturating:
    exact while every |u0 s0 + u1 s1| < 2^15, which every caller's ranges keep)."""
    return _call_intrinsic(builder, "llvm.x86.avx2.pmadd.ub.sw", _vec(_i16, 16), u, s)


def _dot4(builder, u, s):
    """<32 x i8> unsigned u times signed s -> <8 x i32>, each lane the sum of four adjacent products: one
    vpdpbusd with VNNI, else _maddubs and vpmaddwd with ones."""
    i32x8 = _vec(_i32, 8)
    if X86 == "vnni":  # the pre-LLVM-21 signature (i32 vectors): newer LLVMs upgrade it on parsing
        zero = ir.Constant(i32x8, None)
        bu, bs = builder.bitcast(u, i32x8), builder.bitcast(s, i32x8)
        return _call_intrinsic(builder, "llvm.x86.avx512.vpdpbusd.256", i32x8, zero, bu, bs)
    ones = _splat(_i16, 1, 16)
    return _call_intrinsic(builder, "llvm.x86.avx2.pmadd.wd", i32x8, _maddubs(builder, u, s), ones)


def _block_dot(builder, kind: int, blk, a):
    """One legacy block at byte pointer blk against the <32 x i8> activations a: the integer products summed
    exactly into lanes (<16 x i32> pairs, or <8 x i32> quadruples on x86); their total is the block's
    ggml sumi. On x86 the quants stay unsigned (Q4_0's -8, Q5_0's -16 come off as that offset times the
    activations, CSE'd between weight rows) and Q8_0 takes ggml's sign trick (|w| times a with w's sign):
    every vpmaddubsw pair below 2^15 (4-bit 2 * 15 * 128, 5-bit 2 * 31 * 128, 8-bit 2 * 128 * 128 - 1
    with |a| <= 127, what quantize_q8_0 gives)."""
    if not X86:
        return _pair_sums(builder, _legacy_quants(builder, kind, blk), a)
    if kind == Q8_0:
        w = _load(builder, _at(builder, blk, 2), _vec(_i8, 32))
        absw = _call_intrinsic(builder, "llvm.abs.v32i8", w.type, w, ir.Constant(ir.IntType(1), 0))
        return _dot4(builder, absw, _call_intrinsic(builder, "llvm.x86.avx2.psign.b", w.type, a, w))
    dot = _dot4(builder, _unsigned_quants(builder, kind, blk), a)
    if kind in (Q4_0, Q5_0):
        dot = builder.sub(dot, _dot4(builder, _splat(_i8, 8 if kind == Q4_0 else 16, 32), a))
    return dot


def _reduce_add(builder, v):
    name = f"llvm.vector.reduce.add.v{v.type.count}i{v.type.element.width}"
    return _call_intrinsic(builder, name, v.type.element, v)


def _f16_to_f32(builder, h):
    """<n x i16> f16 bits -> <n x float>, exactly as common.f16_to_f32 (ggml_compute_fp16_to_fp32): integer
    and float steps only, so no target needs a half type."""
    n = h.type.count
    u32, f32 = _vec(_i32, n), ir.VectorType(ir.FloatType(), n)
    w = builder.shl(builder.zext(h, u32), _splat(_i32, 16, n))
    sign = builder.and_(w, _splat(_i32, 0x80000000, n))
    two_w = builder.add(w, w)
    normal = builder.add(builder.lshr(two_w, _splat(_i32, 4, n)), _splat(_i32, 0xE0 << 23, n))
    normal = builder.fmul(builder.bitcast(normal, f32), ir.Constant(f32, [2.0**-112] * n))
    denormal = builder.or_(builder.lshr(two_w, _splat(_i32, 17, n)), _splat(_i32, 126 << 23, n))
    denormal = builder.fsub(builder.bitcast(denormal, f32), ir.Constant(f32, [0.5] * n))
    small = builder.icmp_unsigned("<", two_w, _splat(_i32, 1 << 27, n))
    bits = builder.select(small, builder.bitcast(denormal, u32), builder.bitcast(normal, u32))
    return builder.bitcast(builder.or_(sign, bits), f32)


def _f16_vec_to_f32(builder, h):
    """<n x i16> f16 bits -> <n x float>: vcvtph2ps on x86 (F16C), else _f16_to_f32's integer steps. The
    same numbers for every pattern (NaN for NaN: both quiet a signalling NaN)."""
    if X86:
        n = h.type.count
        halves = builder.bitcast(h, ir.VectorType(ir.HalfType(), n))
        return builder.fpext(halves, ir.VectorType(ir.FloatType(), n))
    return _f16_to_f32(builder, h)


def _f16s(builder, wp, first: int, stride: int):
    """The f16 at byte first of each of GROUP blocks stride bytes apart, as <GROUP x float>."""
    v = ir.Constant(_vec(_i16, GROUP), None)
    for k in range(GROUP):
        v = builder.insert_element(
            v, _load(builder, _at(builder, wp, first + stride * k), _i16), ir.Constant(_i32, k)
        )
    return _f16_vec_to_f32(builder, v)


def _legacy_acc8(kind: int):
    bb = BLOCK_BYTES[kind]

    @intrinsic
    def acc8(typingctx, w, w_off, a, a_off, dy, sy, b0, sumf):
        """sumf plus the float terms of the 8 blocks at byte w_off of w against a[a_off : a_off + 256] (the
        activation blocks b0 .. b0 + 7, scales dy[b0 ..] and Q8_1 sums sy[b0 ..]), added one by one in block
        order: each term in legacy._term's operand order, on vectors (the same IEEE operations per lane)."""

        def codegen(context, builder, sig, args):
            wp = _data(context, builder, sig.args[0], args[0], args[1])
            ap = _data(context, builder, sig.args[2], args[2], args[3])
            sums = [
                _block_dot(
                    builder,
                    kind,
                    _at(builder, wp, bb * b),
                    _load(builder, _at(builder, ap, 32 * b), _vec(_i8, 32)),
                )
                for b in range(GROUP)
            ]
            while len(sums) > 1:  # 8 x <n x i32> -> <n x i32>, lanes n/8 b .. n/8 (b + 1) from block b
                n = sums[0].type.count
                pairs = [
                    _shuffle(builder, sums[i], sums[i + 1], list(range(2 * n)))
                    for i in range(0, len(sums), 2)
                ]
                sums = [_adjacent_sums(builder, p) for p in pairs]
            block_sums = sums[0]
            while block_sums.type.count > GROUP:
                block_sums = _adjacent_sums(builder, block_sums)
            f32 = ir.VectorType(ir.FloatType(), GROUP)
            fs = builder.sitofp(block_sums, f32)
            dx = _f16s(builder, wp, 0, bb)
            dyp = _data(context, builder, sig.args[4], args[4], args[6])
            d_y = builder.load(builder.bitcast(dyp, f32.as_pointer()), align=4)
            if kind == Q4_0:  # sumi * d_x * d_y
                terms = builder.fmul(builder.fmul(fs, dx), d_y)
            elif kind == Q8_0:  # sumi * (d_x * d_y)
                terms = builder.fmul(fs, builder.fmul(dx, d_y))
            elif kind == Q5_0:  # (d_x * d_y) * sumi
                terms = builder.fmul(builder.fmul(dx, d_y), fs)
            else:  # Q4_1, Q5_1: (d_x * d_y) * sumi + m_x * s_y
                syp = _data(context, builder, sig.args[5], args[5], args[6])
                s_y = builder.load(builder.bitcast(syp, f32.as_pointer()), align=4)
                mins = builder.fmul(_f16s(builder, wp, 2, bb), s_y)
                terms = builder.fadd(builder.fmul(builder.fmul(dx, d_y), fs), mins)
            total = args[7]
            for k in range(GROUP):
                total = builder.fadd(total, builder.extract_element(terms, ir.Constant(_i32, k)))
            return total

        return types.float32(w, w_off, a, a_off, dy, sy, b0, sumf), codegen

    return acc8


def _legacy_sum1(kind: int):
    @intrinsic
    def sum1(typingctx, w, w_off, a, a_off):
        """The integer dot of the block at byte w_off of w with a[a_off : a_off + 32]."""

        def codegen(context, builder, sig, args):
            wp = _data(context, builder, sig.args[0], args[0], args[1])
            ap = _data(context, builder, sig.args[2], args[2], args[3])
            return _reduce_add(builder, _block_dot(builder, kind, wp, _load(builder, ap, _vec(_i8, 32))))

        return types.int32(w, w_off, a, a_off), codegen

    return sum1


acc8_q4_0, sum1_q4_0 = _legacy_acc8(Q4_0), _legacy_sum1(Q4_0)
acc8_q4_1, sum1_q4_1 = _legacy_acc8(Q4_1), _legacy_sum1(Q4_1)
acc8_q5_0, sum1_q5_0 = _legacy_acc8(Q5_0), _legacy_sum1(Q5_0)
acc8_q5_1, sum1_q5_1 = _legacy_acc8(Q5_1), _legacy_sum1(Q5_1)
acc8_q8_0, sum1_q8_0 = _legacy_acc8(Q8_0), _legacy_sum1(Q8_0)


def _lanes8(builder, prod):
    """<32 x i16> products -> <8 x i16>: lane l the sum of elements l, l + 8, l + 16, l + 24."""
    return _half_sums(builder, _half_sums(builder, prod))


# byte p of a reordered 32: element p // 4 + 8 (p % 4), so that each four adjacent bytes are one aux32
# lane's elements (l, l + 8, l + 16, l + 24) and one _dot4 lane sums exactly them (Q4_K),
# or one vpmaddubsw pair holds group g's lane l and the next its group g + 1's (Q6_K)
_LANE_ORDER = [p // 4 + 8 * (p % 4) for p in range(32)]


def _q6_k_parts(builder, l0, l1, h):
    """A Q6_K chunk's four 32-quant parts (unsigned, 0..63) from its ql bytes l0, l1 and qh bytes h: the
    fifth and sixth bits are bit pairs 0, 2, 4, 6 of qh, moved to bits 4 and 5. Byte-wise, so the parts
    come out in whatever order the bytes went in."""
    low = (builder.and_(l0, _c(l0, 15)), builder.and_(l1, _c(l1, 15)))
    high = (builder.lshr(l0, _c(l0, 4)), builder.lshr(l1, _c(l1, 4)))
    return (
        builder.or_(low[0], builder.shl(builder.and_(h, _c(h, 3)), _c(h, 4))),
        builder.or_(low[1], builder.shl(builder.and_(h, _c(h, 12)), _c(h, 2))),
        builder.or_(high[0], builder.and_(h, _c(h, 48))),
        builder.or_(high[1], builder.lshr(builder.and_(h, _c(h, 192)), _c(h, 2))),
    )


def _q6_k_lanes(builder, wp, ap):
    """A Q6_K super-block's eight aux32 lanes (<8 x i32>) in portable IR: products in i16, each group's
    16 summed into its eight lanes by a halving shuffle."""
    scales = builder.sext(_load(builder, _at(builder, wp, 192), _vec(_i8, 16)), _vec(_i32, 16))
    acc = ir.Constant(_vec(_i32, 16), None)
    v32 = _vec(_i8, 32)
    for c in range(2):  # ql[128] qh[64]: chunk c holds elements 128c + l, +32, +64, +96 (l < 32)
        l0 = _load(builder, _at(builder, wp, 64 * c), v32)
        l1 = _load(builder, _at(builder, wp, 64 * c + 32), v32)
        h = _load(builder, _at(builder, wp, 128 + 32 * c), v32)
        for k, q in enumerate(_q6_k_parts(builder, l0, l1, h)):
            q = builder.sub(q, _c(q, 32))
            prod = _products(builder, q, _load(builder, _at(builder, ap, 128 * c + 32 * k), v32))
            # <16 x i16>: groups g, g + 1 (elements 0..15 and 16..31), their two halves added; |.| < 2^13
            pairs = builder.add(
                _shuffle(builder, prod, prod, list(range(8)) + list(range(16, 24))),
                _shuffle(builder, prod, prod, list(range(8, 16)) + list(range(24, 32))),
            )
            g = 8 * c + 2 * k
            sc = _shuffle(builder, scales, scales, [g] * 8 + [g + 1] * 8)
            acc = builder.add(acc, builder.mul(builder.sext(pairs, _vec(_i32, 16)), sc))
    return _half_sums(builder, acc)


def _q6_k_lanes_x86(builder, wp, ap):
    """_q6_k_lanes with x86's byte dots: bytes reordered by _LANE_ORDER, so that vpmaddubsw's i16 lane 2l
    is group g's lane l (elements l, l + 8) and lane 2l + 1 group g + 1's (16 + l, 24 + l); the offset 32
    comes off as 32 times the activations (|pair| <= 2 * 63 * 128, after it <= 2 * 32 * 128); vpmaddwd
    with the two groups' scales then adds both into i32 lane l."""
    scales = builder.sext(_load(builder, _at(builder, wp, 192), _vec(_i8, 16)), _vec(_i16, 16))
    acc = ir.Constant(_vec(_i32, 8), None)
    v32 = _vec(_i8, 32)

    def reordered(ptr, offset):
        v = _load(builder, _at(builder, ptr, offset), v32)
        return _shuffle(builder, v, v, _LANE_ORDER)

    for c in range(2):
        l0, l1, h = reordered(wp, 64 * c), reordered(wp, 64 * c + 32), reordered(wp, 128 + 32 * c)
        for k, q in enumerate(_q6_k_parts(builder, l0, l1, h)):
            a = reordered(ap, 128 * c + 32 * k)
            pairs = builder.sub(_maddubs(builder, q, a), _maddubs(builder, _c(q, 32), a))
            g = 8 * c + 2 * k
            sc = _shuffle(builder, scales, scales, [g, g + 1] * 8)
            both = _call_intrinsic(builder, "llvm.x86.avx2.pmadd.wd", _vec(_i32, 8), pairs, sc)
            acc = builder.add(acc, both)
    return acc


@intrinsic
def lanes_q6_k(typingctx, w, w_off, a, a_off, out):
    """ggml's eight aux32 lanes of one Q6_K super-block (at byte w_off of w) with a[a_off : a_off + 256]:
    out[l] = sum over the 16 groups g of scale_g * (q * a summed over the elements 16g + l, 16g + 8 + l),
    as `ggml_vec_dot_q6_K_q8_K_generic` (ggml-org/llama.cpp ggml/src/ggml-cpu/quants.c)."""

    def codegen(context, builder, sig, args):
        wp = _data(context, builder, sig.args[0], args[0], args[1])
        ap = _data(context, builder, sig.args[2], args[2], args[3])
        lanes = (_q6_k_lanes_x86 if X86 else _q6_k_lanes)(builder, wp, ap)
        _store8(context, builder, sig.args[4], args[4], lanes)
        return context.get_dummy_value()

    return types.void(w, w_off, a, a_off, out), codegen


def _q4_k_scales_mins(builder, blk):
    """A Q4_K super-block's eight 6-bit scales and eight mins (<8 x i32> each), unpacked from scales[12]
    as ggml's utmp shuffle does (kmask1/2/3)."""
    u = [_load(builder, _at(builder, blk, 4 + 4 * i), _i32) for i in range(3)]
    k1, k2, k3 = (ir.Constant(_i32, k) for k in (0x3F3F3F3F, 0x0F0F0F0F, 0x03030303))

    def top2(x):  # bits 6, 7 of each byte, moved to bits 4, 5
        return builder.shl(builder.and_(builder.lshr(x, ir.Constant(_i32, 6)), k3), ir.Constant(_i32, 4))

    scales = (builder.and_(u[0], k1), builder.or_(builder.and_(u[2], k2), top2(u[0])))
    mins = (
        builder.and_(u[1], k1),
        builder.or_(builder.and_(builder.lshr(u[2], ir.Constant(_i32, 4)), k2), top2(u[1])),
    )

    def bytes8(pair):
        v = builder.insert_element(ir.Constant(_vec(_i32, 2), None), pair[0], ir.Constant(_i32, 0))
        v = builder.insert_element(v, pair[1], ir.Constant(_i32, 1))
        return builder.zext(builder.bitcast(v, _vec(_i8, 8)), _vec(_i32, 8))

    return bytes8(scales), bytes8(mins)


def _q4_k_lanes(builder, wp, ap, scales):
    """A Q4_K super-block's eight aux32 lanes (<8 x i32>) in portable IR: products in i16, each sub-block's
    32 summed into its eight lanes by halving shuffles."""
    acc = ir.Constant(_vec(_i32, 16), None)
    v32 = _vec(_i8, 32)
    for c in range(4):  # qs[128]: bytes 32c.. hold sub-block 2c (low nibbles) and 2c + 1 (high)
        qs = _load(builder, _at(builder, wp, 16 + 32 * c), v32)
        lo = builder.and_(qs, _c(qs, 15))
        hi = builder.lshr(qs, _c(qs, 4))
        a_lo = _load(builder, _at(builder, ap, 64 * c), v32)
        a_hi = _load(builder, _at(builder, ap, 64 * c + 32), v32)
        p_lo = _lanes8(builder, _products(builder, lo, a_lo))
        p_hi = _lanes8(builder, _products(builder, hi, a_hi))
        both = _shuffle(builder, p_lo, p_hi, list(range(16)))  # |.| < 4 * 15 * 128 < 2^13
        sc = _shuffle(builder, scales, scales, [2 * c] * 8 + [2 * c + 1] * 8)
        acc = builder.add(acc, builder.mul(builder.sext(both, _vec(_i32, 16)), sc))
    return _half_sums(builder, acc)


def _q4_k_lanes_x86(builder, wp, ap, scales):
    """_q4_k_lanes with x86's byte dots: quants and activations reordered by _LANE_ORDER (the same
    permutation for both nibbles of a byte), then _dot4 (each vpmaddubsw pair <= 2 * 15 * 128)."""
    acc = ir.Constant(_vec(_i32, 8), None)
    v32 = _vec(_i8, 32)
    for c in range(4):
        raw = _load(builder, _at(builder, wp, 16 + 32 * c), v32)
        qs = _shuffle(builder, raw, raw, _LANE_ORDER)
        for half, q in enumerate((builder.and_(qs, _c(qs, 15)), builder.lshr(qs, _c(qs, 4)))):
            a = _load(builder, _at(builder, ap, 64 * c + 32 * half), v32)
            dot = _dot4(builder, q, _shuffle(builder, a, a, _LANE_ORDER))
            acc = builder.add(acc, builder.mul(dot, _shuffle(builder, scales, scales, [2 * c + half] * 8)))
    return acc


@intrinsic
def lanes_q4_k(typingctx, w, w_off, a, a_off, bsums, bs_off, out):
    """One Q4_K super-block (at byte w_off of w) against a[a_off : a_off + 256], as
    `ggml_vec_dot_q4_K_q8_K_generic`: out[l] (l < 8) = ggml's aux32 lanes, the sum over sub-blocks t of
    scale_t * (q * a summed over the elements 32t + l, +8, +16, +24); out[8] = sum over t of min_t * (the
    activations' sums of sub-block t, bsums[bs_off + 2t] + bsums[bs_off + 2t + 1])."""

    def codegen(context, builder, sig, args):
        wp = _data(context, builder, sig.args[0], args[0], args[1])
        ap = _data(context, builder, sig.args[2], args[2], args[3])
        scales, mins = _q4_k_scales_mins(builder, wp)
        lanes = (_q4_k_lanes_x86 if X86 else _q4_k_lanes)(builder, wp, ap, scales)
        _store8(context, builder, sig.args[6], args[6], lanes)
        bp = _data(context, builder, sig.args[4], args[4], args[5])
        bs = builder.load(builder.bitcast(bp, _vec(_i32, 16).as_pointer()), align=4)
        summins = _reduce_add(builder, builder.mul(_adjacent_sums(builder, bs), mins))
        op = _data(context, builder, sig.args[6], args[6], ir.Constant(_i64, 8))
        builder.store(summins, op)
        return context.get_dummy_value()

    return types.void(w, w_off, a, a_off, bsums, bs_off, out), codegen
