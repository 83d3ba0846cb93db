"""Random weights of every block type for the backend tests, and the one matmul check against the oracle."""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T

from edgellm import quants
from edgellm.backends.reference import ReferenceBackend, activation_roundtrip
from edgellm.gguf import QTensor

QUANTIZABLE = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.F32, T.F16, T.BF16]
# no reference quantizer: random blocks, with sane f16 scales at these byte offsets (d, and dmin if any)
F16_SCALES = {
    T.Q2_K: (80, 82),
    T.Q3_K: (108,),
    T.Q4_K: (0, 2),
    T.Q5_K: (0, 2),
    T.Q6_K: (208,),
    T.IQ4_NL: (0,),
}
RANDOM_BYTES = list(F16_SCALES)
ALL_TYPES = QUANTIZABLE + RANDOM_BYTES
ORACLE = ReferenceBackend()


def qtensor(data: np.ndarray, t: T, k: int) -> QTensor:
    data = np.ascontiguousarray(data).reshape(-1, quants.row_nbytes(t, k))
    return QTensor("w", t, (k, data.shape[0]), 0, data.nbytes, data)


def random_weight(t: T, m: int, k: int, rng: np.random.Generator) -> QTensor:
    """m x k weight of type t: quantized random normals, or random blocks whose f16 scales are a trained
    model's size (both signs, no inf/nan) where the reference has no quantizer."""
    if t in QUANTIZABLE:
        return qtensor(quants.quantize(rng.standard_normal((m, k)).astype(np.float32), t), t, k)
    q = quants.quant_type(t)
    blocks = rng.integers(0, 256, (m * k // q.block_size, q.type_size), dtype=np.uint8)
    for o in F16_SCALES[t]:
        s = (rng.uniform(0.5, 2.0, len(blocks)) * rng.choice([-1, 1], len(blocks)) * 2e-3).astype("<f2")
        blocks[:, o : o + 2] = s.view(np.uint8).reshape(-1, 2)
    return qtensor(blocks, t, k)


def assert_matmul_matches_oracle(b, qt: QTensor, x: np.ndarray, tol: float = 1e-5) -> None:
    """b's matmul (through its own arrays) within `tol` of the output scale (sum |x| |w|) of the exact
    reference's: the fast kernels sum in float32 in their own order, ~1e-7 of it."""
    if qt.type == T.BF16:  # ggml rounds activations to bf16 for BF16 weights; the reference does not
        x = quants.dequantize(quants.quantize(x, T.BF16), T.BF16, x.shape)
    want = ORACLE.matmul(ORACLE.bind(qt), x)
    got = b.to_host(b.matmul(b.bind(qt), b.from_host(x)))
    assert got.shape == want.shape and got.dtype == np.float32
    scale = (np.abs(activation_roundtrip(x, qt.type)) @ np.abs(ORACLE.bind(qt).f32).T).max()
    err = float(np.abs(got - want).max() / scale)
    assert err < tol, f"{b.name} {qt.type.name}: error {err:.2e} of the output scale"
