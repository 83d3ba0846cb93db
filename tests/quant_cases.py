"""Deterministic inputs for the quantizer tests, the same on every machine and numpy version.

`scripts/make_quant_fixtures.py` quantizes these with llama.cpp's own ggml (`ggml_quantize_chunk`) and
commits the digests in tests/fixtures/quantize/ggml.json; tests/test_quantize.py quantizes them with
edgellm and compares. No transcendental functions and no random generator: every value comes from
integer hashing and exact float32 arithmetic, so the bits cannot depend on libm or numpy's RNG streams.
"""

from __future__ import annotations

import numpy as np

N_PER_ROW = 512  # two 256-blocks, sixteen 32-blocks


def _uniform(n: int, seed: int) -> np.ndarray:
    """n values in [0, 1) from a 32-bit integer hash (lowbias32), exactly representable in float32."""
    x = (np.arange(n, dtype=np.uint64) + np.uint64(seed) * np.uint64(0x9E3779B9)) & np.uint64(0xFFFFFFFF)
    x ^= x >> np.uint64(16)
    x = (x * np.uint64(0x7FEB352D)) & np.uint64(0xFFFFFFFF)
    x ^= x >> np.uint64(15)
    x = (x * np.uint64(0x846CA68B)) & np.uint64(0xFFFFFFFF)
    x ^= x >> np.uint64(16)
    return ((x >> np.uint64(8)).astype(np.float32)) * np.float32(1.0 / (1 << 24))


def _bell(n: int, seed: int) -> np.ndarray:
    """Irwin-Hall(4) - 2: a bell-shaped float32 sample with mean 0, from exact sums of four uniforms."""
    parts = [_uniform(n, seed * 4 + i) for i in range(4)]
    return ((parts[0] + parts[1]) + (parts[2] + parts[3])) - np.float32(2)


def weights(nrows: int = 12, n_per_row: int = N_PER_ROW, seed: int = 1) -> np.ndarray:
    """float32 (nrows, n_per_row) shaped like real weights, plus the corner cases the quantizers branch on."""
    x = _bell(nrows * n_per_row, seed).reshape(nrows, n_per_row) * np.float32(0.05)
    x[:, ::97] *= np.float32(9)  # outliers, as real weight rows have
    x[1] = np.float32(0)  # an all-zero row: every scale is zero
    x[2] = np.float32(0.01)  # a constant row: max == min
    x[3] *= np.float32(1e-6)  # tiny values: scales near f16's subnormals
    x[4] = np.abs(x[4])  # all positive: the min/offset types' other branch
    x[5] = -np.abs(x[5])  # all negative
    x[6, :32] = np.float32(0)  # one zero block in an otherwise normal row
    x[6, 32:64] = np.float32(-0.2)  # one constant negative block
    x[7] *= np.float32(40)  # large values
    x[8, :32] = np.float32(-0.0)  # signed zeros: ggml's loops keep the first of equal values, numpy need not
    x[8, 32:64:2], x[8, 33:64:2] = np.float32(0.0), np.float32(-0.0)
    x[8, 64:96:2], x[8, 65:96:2] = np.float32(-0.0), np.float32(0.0)
    x[8, 256:512] = np.float32(-0.0)  # a whole 256-block of -0.0
    return x


def importance(n_per_row: int = N_PER_ROW, seed: int = 7) -> np.ndarray:
    """An imatrix-like weight per column: positive, spread over two orders of magnitude, a few zeros."""
    u = _uniform(n_per_row, seed)
    w = u * u * np.float32(10) + np.float32(0.1)
    w[::61] = np.float32(0)
    return w.astype(np.float32)


# (ggml type name, uses imatrix): every quantizer edgellm has, with and without importance weights
TYPES = [
    *("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"),
    *("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"),
    "IQ4_NL",
    "F16",
    "BF16",
]
CASES = [(t, imat) for t in TYPES for imat in (False, True)]
