"""GGUF block formats: one table entry per ggml type with its layout, numpy reference (de)quantizer and
the activation type ggml pairs it with in dot products.

Promise: every dequantizer is bit-exact with gguf-py's `gguf.quants` (the oracle in tests/test_quants.py),
and every quantizer gguf-py also implements is bit-exact with it. Layouts mirror ggml-org/llama.cpp
ggml/src/ggml-common.h (block_q4_0 ... block_q8_K) and are checked against gguf.GGML_QUANT_SIZES at import.
These are references for tests and load-time conversion, not hot paths.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T

QK_K = 256  # elements per K-quant super-block

Blocks = np.ndarray  # (n_blocks, type_size) uint8, or (n_blocks, block_size) float32


@dataclass(frozen=True)
class QuantType:
    type: T  # ggml type enum
    name: str  # "Q4_0"
    block_size: int  # elements per block
    type_size: int  # bytes per block
    dequantize_blocks: Callable[[Blocks], Blocks]  # (n, type_size) uint8 -> (n, block_size) float32
    quantize_blocks: Callable[[Blocks], Blocks] | None  # (n, block_size) float32 -> (n, type_size) uint8
    vec_dot_type: T | None  # activation type of ggml's vec_dot for this type (ggml-cpu.c type_traits_cpu)


class UnknownQuantType(ValueError):
    """A ggml type this module has no block format for."""

    def __init__(self, t: int | T):
        self.type = int(t)
        try:
            label = f"{self.type} ({T(self.type).name})"
        except ValueError:
            label = f"{self.type} (not a ggml type)"
        names = ", ".join(q.name for q in _REGISTRY.values())
        super().__init__(f"unsupported ggml quantization type {label}; supported: {names}")


# ---------------------------------------------------------------------------------------------- helpers


def _split(blocks: np.ndarray, *widths: int) -> list[np.ndarray]:
    """Column slices of `blocks` with the given byte widths, then the rest."""
    parts, start = [], 0
    for w in widths:
        parts.append(blocks[:, start : start + w])
        start += w
    parts.append(blocks[:, start:])
    return parts


def _f16(b: np.ndarray) -> np.ndarray:
    """(n, 2k) little-endian f16 bytes -> (n, k) float32."""
    return b.view("<f2").astype(np.float32)


def _unpack(q: np.ndarray, bits: int, group: int) -> np.ndarray:
    """(n, nbytes) uint8 -> (n, nbytes * 8 // bits) uint8 fields, in ggml's element order.

    ggml packs each run of `group` bytes so that field k (bits k*bits..) of byte l is element
    k * group + l of that run: e.g. Q4_0 puts elements 0..15 in the low nibbles, 16..31 in the high ones.
    """
    n = q.shape[0]
    shifts = np.arange(0, 8, bits, dtype=np.uint8).reshape(1, 1, -1, 1)
    fields = (q.reshape(n, -1, 1, group) >> shifts) & np.uint8((1 << bits) - 1)
    return fields.reshape(n, -1)


def _pack(q: np.ndarray, bits: int, group: int) -> np.ndarray:
    """Inverse of _unpack: (n, m) uint8 fields (each < 2**bits) -> (n, m * bits // 8) uint8."""
    n = q.shape[0]
    per_byte = 8 // bits
    fields = q.reshape(n, -1, per_byte, group) << np.arange(0, 8, bits, dtype=np.uint8).reshape(1, 1, -1, 1)
    return np.bitwise_or.reduce(fields, axis=2).reshape(n, -1)


def _to_f16_bytes(x: np.ndarray) -> np.ndarray:
    """(n, k) float32 -> (n, 2k) uint8, rounded to nearest even like ggml's GGML_FP32_TO_FP16."""
    return np.ascontiguousarray(x.astype("<f2")).view(np.uint8)


def _max_by_abs(x: np.ndarray) -> np.ndarray:
    """(n, k) -> (n, 1): the signed value of largest magnitude, first one on ties (ggml's loop order);
    +0.0 for a block of zeros of either sign (ggml's `max` starts at 0.0f; only a larger |v| replaces it)."""
    m = np.take_along_axis(x, np.abs(x).argmax(axis=-1, keepdims=True), axis=-1)
    return np.where(m == 0, np.float32(0), m)


def _first_min_max(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(n, k) -> (n, 1) min and max as ggml's `if (v < min) min = v;` loop finds them: the first of equal
    values, which matters for signed zeros (numpy's min/max may return either of -0.0 and +0.0)."""
    lo = np.take_along_axis(x, (x == x.min(axis=-1, keepdims=True)).argmax(axis=-1, keepdims=True), axis=-1)
    hi = np.take_along_axis(x, (x == x.max(axis=-1, keepdims=True)).argmax(axis=-1, keepdims=True), axis=-1)
    return lo, hi


def _inverse(d: np.ndarray) -> np.ndarray:
    """1/d in float32, 0 where d == 0 (ggml: `id = d ? 1.0f/d : 0.0f`)."""
    with np.errstate(divide="ignore"):
        return np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)


def _roundf(x: np.ndarray) -> np.ndarray:
    """C roundf (half away from zero) without the x + 0.5 double rounding error near 0.5."""
    a = np.abs(x)
    floor = np.floor(a)
    return np.sign(x) * (floor + np.floor(2 * (a - floor)))


# ------------------------------------------------------------------------------------------ float types


def _dequant_f32(blocks: Blocks) -> Blocks:
    return blocks.view("<f4").astype(np.float32)


def _quant_f32(x: Blocks) -> Blocks:
    return np.ascontiguousarray(x.astype("<f4")).view(np.uint8)


def _dequant_f16(blocks: Blocks) -> Blocks:
    return _f16(blocks)


def _quant_f16(x: Blocks) -> Blocks:
    return _to_f16_bytes(x)


# ggml-impl.h ggml_compute_bf16_to_fp32 / ggml_compute_fp32_to_bf16
def _dequant_bf16(blocks: Blocks) -> Blocks:
    return (blocks.view("<u2").astype(np.uint32) << np.uint32(16)).view(np.float32)


def _quant_bf16(x: Blocks) -> Blocks:
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    is_nan = (u & 0x7FFFFFFF) > 0x7F800000
    quiet_nan = (u >> 16) | 64  # keep sign and payload, force the quiet bit
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16  # round to nearest even
    return np.where(is_nan, quiet_nan, rounded).astype("<u2").view(np.uint8)


# ---------------------------------------------------------------- legacy 32-element blocks (Q4_0 .. Q8_0)
# ggml-org/llama.cpp ggml/src/ggml-quants.c quantize_row_q4_0_ref .. dequantize_row_q8_0; float operation
# order as in gguf-py gguf/quants.py (Q4_0 .. Q8_0), so results are bit-identical.


def _dequant_q4_0(blocks: Blocks) -> Blocks:
    d, qs = _split(blocks, 2)
    q = _unpack(qs, 4, 16).astype(np.int8) - np.int8(8)
    return _f16(d) * q.astype(np.float32)


def _quant_q4_0(x: Blocks) -> Blocks:
    d = _max_by_abs(x) / np.float32(-8)
    q = np.trunc(x * _inverse(d) + np.float32(8.5)).astype(np.uint8).clip(0, 15)
    return np.concatenate([_to_f16_bytes(d), _pack(q, 4, 16)], axis=-1)


def _dequant_q4_1(blocks: Blocks) -> Blocks:
    d, m, qs = _split(blocks, 2, 2)
    return _f16(d) * _unpack(qs, 4, 16).astype(np.float32) + _f16(m)


def _quant_q4_1(x: Blocks) -> Blocks:
    lo, hi = _first_min_max(x)
    d = (hi - lo) / np.float32(15)
    q = np.trunc((x - lo) * _inverse(d) + np.float32(0.5)).astype(np.uint8).clip(0, 15)
    return np.concatenate([_to_f16_bytes(d), _to_f16_bytes(lo), _pack(q, 4, 16)], axis=-1)


def _five_bits(qh: np.ndarray, qs: np.ndarray) -> np.ndarray:
    """Q5_0/Q5_1 quants 0..31: low nibbles as Q4_0, bit 4 of element j is bit j of the uint32 qh."""
    return _unpack(qs, 4, 16) | (np.unpackbits(qh, axis=-1, bitorder="little") << np.uint8(4))


def _pack_five_bits(q: np.ndarray) -> list[np.ndarray]:
    qh = np.packbits(q >> np.uint8(4), axis=-1, bitorder="little")
    return [qh, _pack(q & np.uint8(0x0F), 4, 16)]


def _dequant_q5_0(blocks: Blocks) -> Blocks:
    d, qh, qs = _split(blocks, 2, 4)
    q = _five_bits(qh, qs).astype(np.int8) - np.int8(16)
    return _f16(d) * q.astype(np.float32)


def _quant_q5_0(x: Blocks) -> Blocks:
    d = _max_by_abs(x) / np.float32(-16)
    q = np.trunc(x * _inverse(d) + np.float32(16.5)).astype(np.uint8).clip(0, 31)
    return np.concatenate([_to_f16_bytes(d), *_pack_five_bits(q)], axis=-1)


def _dequant_q5_1(blocks: Blocks) -> Blocks:
    d, m, qh, qs = _split(blocks, 2, 2, 4)
    return _f16(d) * _five_bits(qh, qs).astype(np.float32) + _f16(m)


def _quant_q5_1(x: Blocks) -> Blocks:
    lo, hi = _first_min_max(x)
    d = (hi - lo) / np.float32(31)
    q = np.trunc((x - lo) * _inverse(d) + np.float32(0.5)).astype(np.uint8).clip(0, 31)
    return np.concatenate([_to_f16_bytes(d), _to_f16_bytes(lo), *_pack_five_bits(q)], axis=-1)


def _dequant_q8_0(blocks: Blocks) -> Blocks:
    d, qs = _split(blocks, 2)
    return qs.view(np.int8).astype(np.float32) * _f16(d)


def _quant_q8_0(x: Blocks) -> Blocks:
    d = np.abs(x).max(axis=-1, keepdims=True) / np.float32(127)
    q = _roundf(x * _inverse(d)).astype(np.int8)
    return np.concatenate([_to_f16_bytes(d), q.view(np.uint8)], axis=-1)


# ggml-org/llama.cpp ggml/src/ggml-common.h kvalues_iq4nl; dequantize_row_iq4_nl in ggml-quants.c
_IQ4_NL_VALUES = np.array(
    [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.float32
)


def _dequant_iq4_nl(blocks: Blocks) -> Blocks:
    d, qs = _split(blocks, 2)
    return _f16(d) * _IQ4_NL_VALUES[_unpack(qs, 4, 16)]


# ------------------------------------------------------------------ K-quants: 256-element super-blocks
# ggml-org/llama.cpp ggml/src/ggml-quants.c dequantize_row_q2_K .. dequantize_row_q6_K, quantize_row_q8_K_ref.
# Sub-block scale products are formed first (d * sc), then applied to the quants: y = (d*sc)*q - (dmin*m),
# the same float32 operations as ggml and gguf-py.


def _dequant_q2_k(blocks: Blocks) -> Blocks:
    n = blocks.shape[0]
    scales, qs, d, dmin = _split(blocks, QK_K // 16, QK_K // 4, 2)  # 16 sub-blocks of 16
    dl = (_f16(d) * (scales & np.uint8(0x0F)).astype(np.float32)).reshape(n, 16, 1)
    ml = (_f16(dmin) * (scales >> np.uint8(4)).astype(np.float32)).reshape(n, 16, 1)
    q = _unpack(qs, 2, 32).reshape(n, 16, 16).astype(np.float32)
    return (dl * q - ml).reshape(n, QK_K)


def _dequant_q3_k(blocks: Blocks) -> Blocks:
    n = blocks.shape[0]
    hmask, qs, scales, d = _split(blocks, QK_K // 8, QK_K // 4, 12)
    # 16 6-bit scales: low nibbles in bytes 0..7 (scale i and i+8 share byte i), 2 high bits in bytes 8..11
    sc = _unpack(scales[:, :8], 4, 8) | (_unpack(scales[:, 8:], 2, 4) << np.uint8(4))
    dl = (_f16(d) * (sc.astype(np.int8) - np.int8(32)).astype(np.float32)).reshape(n, 16, 1)
    # 3-bit quants: 2 low bits, minus 4 where the hmask bit is *clear*
    high = _unpack(hmask, 1, 32) ^ np.uint8(1)
    q = _unpack(qs, 2, 32).astype(np.int8) - (high << np.uint8(2)).astype(np.int8)
    return (dl * q.reshape(n, 16, 16).astype(np.float32)).reshape(n, QK_K)


def _scale_min_k4(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """12 bytes -> 8 6-bit scales and 8 6-bit mins (ggml-quants.c get_scale_min_k4)."""
    d, m, md = scales[:, 0:4], scales[:, 4:8], scales[:, 8:12]
    sc = np.concatenate([d & 63, (md & 0x0F) | ((d >> 6) << 4)], axis=-1)
    mn = np.concatenate([m & 63, (md >> 4) | ((m >> 6) << 4)], axis=-1)
    return sc, mn


def _apply_scale_min(d: np.ndarray, dmin: np.ndarray, scales: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Q4_K/Q5_K: 8 sub-blocks of 32, y = (d * sc) * q - (dmin * m)."""
    n = q.shape[0]
    sc, mn = _scale_min_k4(scales)
    d1 = (_f16(d) * sc.astype(np.float32)).reshape(n, 8, 1)
    m1 = (_f16(dmin) * mn.astype(np.float32)).reshape(n, 8, 1)
    return (d1 * q.reshape(n, 8, 32).astype(np.float32) - m1).reshape(n, QK_K)


def _dequant_q4_k(blocks: Blocks) -> Blocks:
    d, dmin, scales, qs = _split(blocks, 2, 2, 12)
    return _apply_scale_min(d, dmin, scales, _unpack(qs, 4, 32))


def _dequant_q5_k(blocks: Blocks) -> Blocks:
    d, dmin, scales, qh, qs = _split(blocks, 2, 2, 12, QK_K // 8)
    q = _unpack(qs, 4, 32) | (_unpack(qh, 1, 32) << np.uint8(4))
    return _apply_scale_min(d, dmin, scales, q)


def _dequant_q6_k(blocks: Blocks) -> Blocks:
    n = blocks.shape[0]
    ql, qh, scales, d = _split(blocks, QK_K // 2, QK_K // 4, QK_K // 16)
    dl = (_f16(d) * scales.view(np.int8).astype(np.float32)).reshape(n, 16, 1)
    q = (_unpack(ql, 4, 64) | (_unpack(qh, 2, 32) << np.uint8(4))).astype(np.int8) - np.int8(32)
    return (dl * q.reshape(n, 16, 16).astype(np.float32)).reshape(n, QK_K)


# block_q8_K: float d, int8 qs[256], int16 bsums[16] (sums of each 16 quants, used by K-quant vec_dots)
def _dequant_q8_k(blocks: Blocks) -> Blocks:
    d, qs, _bsums = _split(blocks, 4, QK_K)
    return d.view("<f4").astype(np.float32) * qs.view(np.int8).astype(np.float32)


def _quant_q8_k(x: Blocks) -> Blocks:
    mx = _max_by_abs(x)
    with np.errstate(divide="ignore"):
        iscale = np.where(mx == 0, np.float32(0), np.float32(-127) / mx).astype(np.float32)
    # nearest_int() in ggml-quants.c rounds half to even, like np.rint; MIN(127, v) guards -max*iscale
    q = np.minimum(np.rint(iscale * x), 127).astype(np.int8)
    bsums = q.reshape(-1, QK_K // 16, 16).sum(axis=-1, dtype=np.int16)
    with np.errstate(divide="ignore"):
        d = np.where(iscale == 0, np.float32(0), np.float32(1) / iscale).astype("<f4")
    return np.concatenate(
        [d.view(np.uint8), q.view(np.uint8), np.ascontiguousarray(bsums.astype("<i2")).view(np.uint8)],
        axis=-1,
    )


# ------------------------------------------------------------------------------------------------ table

_TABLE = (
    # QuantType(type, name, block_size, type_size, dequantize_blocks, quantize_blocks, vec_dot_type)
    QuantType(T.F32, "F32", 1, 4, _dequant_f32, _quant_f32, T.F32),
    QuantType(T.F16, "F16", 1, 2, _dequant_f16, _quant_f16, T.F16),
    QuantType(T.BF16, "BF16", 1, 2, _dequant_bf16, _quant_bf16, T.BF16),
    QuantType(T.Q4_0, "Q4_0", 32, 18, _dequant_q4_0, _quant_q4_0, T.Q8_0),
    QuantType(T.Q4_1, "Q4_1", 32, 20, _dequant_q4_1, _quant_q4_1, T.Q8_1),
    QuantType(T.Q5_0, "Q5_0", 32, 22, _dequant_q5_0, _quant_q5_0, T.Q8_0),
    QuantType(T.Q5_1, "Q5_1", 32, 24, _dequant_q5_1, _quant_q5_1, T.Q8_1),
    QuantType(T.Q8_0, "Q8_0", 32, 34, _dequant_q8_0, _quant_q8_0, T.Q8_0),
    QuantType(T.Q2_K, "Q2_K", 256, 84, _dequant_q2_k, None, T.Q8_K),
    QuantType(T.Q3_K, "Q3_K", 256, 110, _dequant_q3_k, None, T.Q8_K),
    QuantType(T.Q4_K, "Q4_K", 256, 144, _dequant_q4_k, None, T.Q8_K),
    QuantType(T.Q5_K, "Q5_K", 256, 176, _dequant_q5_k, None, T.Q8_K),
    QuantType(T.Q6_K, "Q6_K", 256, 210, _dequant_q6_k, None, T.Q8_K),
    QuantType(T.Q8_K, "Q8_K", 256, 292, _dequant_q8_k, _quant_q8_k, None),  # activations only
    QuantType(T.IQ4_NL, "IQ4_NL", 32, 18, _dequant_iq4_nl, None, T.Q8_0),
)

for _q in _TABLE:
    assert (_q.block_size, _q.type_size) == GGML_QUANT_SIZES[_q.type], _q.name
    assert _q.name == _q.type.name, _q.name

_REGISTRY: dict[int, QuantType] = {int(q.type): q for q in _TABLE}

# ------------------------------------------------------------------------------------------- public API


def quant_type(t: int | T) -> QuantType:
    """The block format of ggml type `t`; raises UnknownQuantType if edgellm has none."""
    try:
        return _REGISTRY[int(t)]
    except KeyError:
        raise UnknownQuantType(t) from None


def supported_types() -> list[T]:
    """Every ggml type with a registered block format, in table order."""
    return [q.type for q in _TABLE]


def row_nbytes(t: int | T, n_elements: int) -> int:
    """Bytes taken by `n_elements` consecutive values of type `t` (a whole number of blocks)."""
    q = quant_type(t)
    if n_elements < 0 or n_elements % q.block_size:
        raise ValueError(f"{n_elements} elements is not a whole number of {q.name} blocks of {q.block_size}")
    return n_elements // q.block_size * q.type_size


# Work in slices of about this many raw bytes so temporaries stay small on big tensors (token embeddings).
_CHUNK_BYTES = 1 << 20


def dequantize(raw: np.ndarray, t: int | T, shape: tuple[int, ...]) -> np.ndarray:
    """Raw bytes of a tensor of type `t` -> float32 array of `shape` (numpy order, last dim = row)."""
    q = quant_type(t)
    shape = tuple(int(s) for s in shape)
    n_elements = int(np.prod(shape, dtype=np.int64))
    row = shape[-1] if shape else 1
    expected = row_nbytes(q.type, row) * (n_elements // row if row else 0)
    flat = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
    if flat.size != expected:
        raise ValueError(f"{q.name} tensor of shape {shape} needs {expected} bytes, got {flat.size}")
    blocks = flat.reshape(-1, q.type_size)
    out = np.empty((blocks.shape[0], q.block_size), dtype=np.float32)
    step = max(1, _CHUNK_BYTES // q.type_size)
    # Inf/NaN scales in a damaged file give NaN weights, as in ggml; numpy need not warn about it.
    with np.errstate(invalid="ignore", over="ignore"):
        for i in range(0, blocks.shape[0], step):
            out[i : i + step] = q.dequantize_blocks(blocks[i : i + step])
    return out.reshape(shape)


def quantize(x: np.ndarray, t: int | T) -> np.ndarray:
    """float32 array (last dim a multiple of the block size) -> uint8 array (*x.shape[:-1], row bytes)."""
    q = quant_type(t)
    if q.quantize_blocks is None:
        names = ", ".join(p.name for p in _TABLE if p.quantize_blocks is not None)
        raise NotImplementedError(f"no reference quantizer for {q.name}; edgellm quantizes to: {names}")
    if np.ndim(x) == 0:
        raise ValueError("cannot quantize a 0-d array")
    x = np.ascontiguousarray(x, dtype=np.float32)
    row_bytes = row_nbytes(q.type, x.shape[-1])
    blocks = x.reshape(-1, q.block_size)
    out = np.empty((blocks.shape[0], q.type_size), dtype=np.uint8)
    step = max(1, _CHUNK_BYTES // (4 * q.block_size))
    for i in range(0, blocks.shape[0], step):
        out[i : i + step] = q.quantize_blocks(blocks[i : i + step])
    return out.reshape(*x.shape[:-1], row_bytes)
