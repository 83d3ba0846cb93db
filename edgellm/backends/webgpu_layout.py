"""Word-aligned repacking of GGUF weight blocks for the WebGPU backend, whose shaders read storage as
`array<u32>`: every repacked block is a whole number of u32 words and its quant bytes start on a word.

Promise: `repack` only moves and pads bytes (values are untouched), so backends/wgsl/quants_*.wgsl
`deq4_<type>` dequantize a repacked block bit-exactly as gguf-py's `gguf.quants.dequantize` does the
GGUF block. Block fields mirror ggml-org/llama.cpp ggml/src/ggml-common.h (block_q4_0 ... block_q6_K);
the dequantization they feed mirrors ggml/src/ggml-quants.c dequantize_row_* and the Vulkan shaders
ggml/src/ggml-vulkan/vulkan-shaders/dequant_funcs.glsl (dequant_funcs.comp in older trees).

Repacked layouts, byte offsets inside one block (w = u32 word, little-endian; f16 halves are the low
16 bits of a word first; "pad" bytes are zero):

  F32     32 elems, 32 w: f32[32]                                   (GGUF order, no copy)
  F16     32 elems, 16 w: f16[32]                                   (GGUF order, no copy)
  BF16    32 elems, 16 w: bf16[32]                                  (GGUF order, no copy)
  Q4_0    32 elems,  5 w: qs[16] @0, d @16, pad[2] @18              (GGUF: d, qs)
  Q4_1    32 elems,  5 w: d @0, m @2, qs[16] @4                     (GGUF order, no copy)
  Q5_0    32 elems,  6 w: qh[4] @0, qs[16] @4, d @20, pad[2] @22    (GGUF: d, qh, qs)
  Q5_1    32 elems,  6 w: d @0, m @2, qh[4] @4, qs[16] @8           (GGUF order, no copy)
  Q8_0    32 elems,  9 w: qs[32] @0, d @32, pad[2] @34              (GGUF: d, qs)
  IQ4_NL  32 elems,  5 w: qs[16] @0, d @16, pad[2] @18              (GGUF: d, qs)
  Q2_K   256 elems, 21 w: scales[16] @0, qs[64] @16, d @80, dmin @82                (GGUF order, no copy)
  Q3_K   256 elems, 28 w: hmask[32] @0, qs[64] @32, scales[12] @96, d @108, pad[2] @110 (GGUF + pad)
  Q4_K   256 elems, 36 w: d @0, dmin @2, scales[12] @4, qs[128] @16                 (GGUF order, no copy)
  Q5_K   256 elems, 44 w: d @0, dmin @2, scales[12] @4, qh[32] @16, qs[128] @48     (GGUF order, no copy)
  Q6_K   256 elems, 53 w: ql[128] @0, qh[64] @128, scales[16] @192, d @208, pad[2] @210 (GGUF + pad)

The float types have no blocks in GGUF; they are cut into 32-element blocks here so that every type
shares the deq4_<type>(block_word, quad) interface.
"""

from __future__ import annotations

import sys

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T

# type -> ((block_elems, block_words), source byte ranges of one GGUF block in repacked order).
# The ranges cover the whole GGUF block once; whatever is left of block_words * 4 is zero padding.
# Byte offsets are those of the ggml-common.h structs cited above.
_FORMATS: dict[T, tuple[tuple[int, int], tuple[tuple[int, int], ...]]] = {
    T.F32: ((32, 32), ((0, 128),)),
    T.F16: ((32, 16), ((0, 64),)),
    T.BF16: ((32, 16), ((0, 64),)),
    T.Q4_0: ((32, 5), ((2, 18), (0, 2))),  # block_q4_0 {d; qs[16]}
    T.Q4_1: ((32, 5), ((0, 20),)),  # block_q4_1 {d, m; qs[16]}
    T.Q5_0: ((32, 6), ((2, 22), (0, 2))),  # block_q5_0 {d; qh[4]; qs[16]}
    T.Q5_1: ((32, 6), ((0, 24),)),  # block_q5_1 {d, m; qh[4]; qs[16]}
    T.Q8_0: ((32, 9), ((2, 34), (0, 2))),  # block_q8_0 {d; qs[32]}
    T.IQ4_NL: ((32, 5), ((2, 18), (0, 2))),  # block_iq4_nl {d; qs[16]}
    T.Q2_K: ((256, 21), ((0, 84),)),  # block_q2_K {scales[16]; qs[64]; d, dmin}
    T.Q3_K: ((256, 28), ((0, 110),)),  # block_q3_K {hmask[32]; qs[64]; scales[12]; d}
    T.Q4_K: ((256, 36), ((0, 144),)),  # block_q4_K {d, dmin; scales[12]; qs[128]}
    T.Q5_K: ((256, 44), ((0, 176),)),  # block_q5_K {d, dmin; scales[12]; qh[32]; qs[128]}
    T.Q6_K: ((256, 53), ((0, 210),)),  # block_q6_K {ql[128]; qh[64]; scales[16]; d}
}

LAYOUT: dict[int, tuple[int, int]] = {t: shape for t, (shape, _) in _FORMATS.items()}


def _ggml_block(t: T) -> tuple[int, int]:
    """(elements, bytes) of one repack block in the GGUF file: float types are cut into LAYOUT's blocks."""
    elems, type_size = GGML_QUANT_SIZES[t]
    if elems == 1:
        return LAYOUT[t][0], LAYOUT[t][0] * type_size
    return elems, type_size


def _check_layouts() -> None:
    """Each range list is a permutation of the whole GGUF block, padded by less than a word."""
    assert sys.byteorder == "little", "repack views bytes as little-endian u32 words, as GGUF stores them"
    for t, ((elems, words), ranges) in _FORMATS.items():
        e, size = _ggml_block(t)
        assert e == elems, t.name
        assert sorted(b for r in ranges for b in range(*r)) == list(range(size)), t.name
        assert size <= 4 * words < size + 4, t.name
        assert all(a % 2 == 0 and b % 2 == 0 for a, b in ranges), t.name  # repack copies u16s


_check_layouts()


def repack(qtype: int, raw: np.ndarray) -> np.ndarray:
    """(rows, row_bytes) uint8 GGUF blocks of type `qtype` -> (rows, blocks_per_row * block_words) uint32
    in the word-aligned layout of the module docstring. Rows of the float types must hold a multiple of 32
    elements. Formats whose GGUF block is already word-aligned come back as a view of `raw` (no copy)."""
    try:
        t = T(qtype)
        (_, words), ranges = _FORMATS[t]
    except (ValueError, KeyError):
        names = ", ".join(f.name for f in _FORMATS)
        raise ValueError(f"no WebGPU layout for ggml type {qtype}; supported: {names}") from None
    if raw.dtype != np.uint8 or raw.ndim != 2 or not raw.flags.c_contiguous:
        raise ValueError(f"repack wants a C-contiguous 2-d uint8 array, got {raw.dtype} {raw.shape}")
    rows, row_bytes = raw.shape
    _, size = _ggml_block(t)
    if row_bytes % size:
        raise ValueError(f"{t.name} row of {row_bytes} bytes is not a whole number of {size}-byte blocks")
    n_blocks = row_bytes // size
    if len(ranges) == 1 and size == 4 * words:  # already word-aligned: reinterpret in place
        return raw.view(np.uint32)
    # copy in u16 units (every field is 2-byte aligned): half the elements of a byte copy, twice as fast
    blocks = raw.reshape(rows * n_blocks, size).view(np.uint16)
    out = np.empty((rows * n_blocks, 2 * words), dtype=np.uint16)
    at = 0
    for start, stop in ranges:  # a few column copies, each over all blocks at once
        out[:, at : at + (stop - start) // 2] = blocks[:, start // 2 : stop // 2]
        at += (stop - start) // 2
    out[:, at:] = 0
    return out.view(np.uint32).reshape(rows, n_blocks * words)
