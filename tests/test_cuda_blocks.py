"""The cuda backend's block dequantizers (edgellm/backends/cuda_kernels/blocks.py): bit-exact with
edgellm.quants.dequantize for every block type inside a kernel, f16 / bf16 exact on every bit pattern, and
compiled to PTX without an FMA for every GPU generation edgellm supports.

The kernels run in a child python (this file run as a script): numba picks the simulator or the GPU when it
is first imported, and this pytest process may have imported it already. The child uses numba-cuda's
simulator, or the real GPU where EDGELLM_CUDA_DEVICE=1 (the GPU machine's check, as in conftest.py);
compile_ptx needs the simulator off, and no GPU.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T
from numba import cuda  # a global: the simulator swaps it for its own inside kernels

HERE = Path(__file__).resolve().parent
TARGETS = ((7, 5), (8, 0), (8, 6), (8, 9), (9, 0))  # as edgellm/backends/cuda_kernels/compile.py
FLOAT_TYPES = (T.F32, T.F16, T.BF16)
ON_DEVICE = os.environ.get("EDGELLM_CUDA_DEVICE") == "1"


# ------------------------------------------------------------------------------------ the child's work


def _launch(deq, w: np.ndarray, nb: int, qk: int) -> np.ndarray:
    """The nb blocks of qk values of every row of w through deq in one small kernel: (rows, nb * qk)."""

    @cuda.jit
    def dequant(w, out):  # out (rows, blocks, qk), global memory; grid-stride over (row, block)
        nb = out.shape[1]
        for item in range(cuda.grid(1), out.shape[0] * nb, cuda.gridsize(1)):
            deq(w, item // nb, item % nb, out[item // nb, item % nb])

    rows = w.shape[0]
    out = np.full((rows, nb, qk), np.nan, dtype=np.float32)  # a block never written stays NaN
    # the simulator runs each thread as a Python thread: one block of a handful; a GPU: a thread per block
    grid, threads = (-(-rows * nb // 32), 32) if ON_DEVICE else (1, min(8, rows * nb))
    dequant[grid, threads](np.ascontiguousarray(w), out)
    return out.reshape(rows, nb * qk)


def _check_types() -> None:
    """Each type's random 2-row weight of 2 blocks per row against quants.dequantize, bit for bit."""
    from random_weights import random_weight

    from edgellm import quants
    from edgellm.backends.cuda_kernels.blocks import QK, TYPE_SIZE, make_dequant

    for t in QK:
        k = 2 * QK[t]
        qt = random_weight(T(t), 2, k, np.random.default_rng(t))
        assert qt.data.shape == (2, 2 * TYPE_SIZE[t]), qt.data.shape
        got = _launch(make_dequant(t), qt.data, 2, QK[t])
        want = quants.dequantize(qt.data, t, (2, k))
        # as bits: assert_array_equal alone would take -0.0 for +0.0
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32), err_msg=T(t).name)


def _check_all_half_patterns() -> None:
    """Every f16 and bf16 bit pattern through the F16 / BF16 dequantizers (2048 blocks of 32 in one row)."""
    from edgellm.backends.cuda_kernels.blocks import make_dequant

    bits = np.arange(1 << 16, dtype=np.uint16)
    w = bits.astype("<u2").view(np.uint8).reshape(1, -1)
    got = _launch(make_dequant(T.F16), w, 2048, 32).reshape(-1)
    want = bits.view(np.float16).astype(np.float32)
    nan = np.isnan(want)  # NaN payloads: only NaN-ness is pinned
    np.testing.assert_array_equal(np.isnan(got), nan, err_msg="F16 NaNs")
    np.testing.assert_array_equal(got.view(np.uint32)[~nan], want.view(np.uint32)[~nan], err_msg="F16")
    got = _launch(make_dequant(T.BF16), w, 2048, 32).reshape(-1)
    want = (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)  # ggml_compute_bf16_to_fp32
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32), err_msg="BF16")


def _compile_ptx() -> dict[str, str]:
    """PTX of a kernel around each type's deq, per target; the wrapper dequantizes into a local array as
    matmul does (a local and a global float32[::1] are one numba type: one compile covers both)."""
    from numba import float32

    from edgellm.backends.cuda_kernels.blocks import QK, make_dequant

    def wrapper(deq, qk):
        def kernel(w, out):
            vals = cuda.local.array(qk, float32)
            deq(w, 1, 1, vals)
            for j in range(qk):
                out[j] = vals[j]

        return kernel

    ptx = {}
    for cc in TARGETS:
        for t in QK:
            code, _ = cuda.compile_ptx(
                wrapper(make_dequant(t), QK[t]), "void(uint8[:, ::1], float32[::1])", cc=cc
            )
            ptx[f"{T(t).name} sm_{cc[0]}{cc[1]}"] = code
    return ptx


def _child(mode: str) -> None:
    """Run as `python test_cuda_blocks.py MODE`: print one JSON object, case -> None or what went wrong
    (compile: case -> its PTX)."""
    import traceback

    results: dict[str, str | None] = {}
    if mode == "compile":
        results.update(_compile_ptx())
    else:
        for name, check in (("types", _check_types), ("half patterns", _check_all_half_patterns)):
            try:
                check()
                results[name] = None
            except Exception:
                results[name] = traceback.format_exc()
    print(json.dumps(results))


def _run_child(mode: str, simulator: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["NUMBA_ENABLE_CUDASIM"] = "1" if simulator else "0"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE.parent), str(HERE), env.get("PYTHONPATH")) if p)
    p = subprocess.run(
        [sys.executable, __file__, mode], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert p.returncode == 0, f"child {mode} failed:\n{p.stdout[-4000:]}\n{p.stderr[-8000:]}"
    return json.loads(p.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------------------------- the tests


@pytest.fixture(scope="module")
def kernel_results() -> dict:
    return _run_child("check", simulator=not ON_DEVICE)


def test_every_block_type_dequantizes_bit_exact_with_quants_in_a_kernel(kernel_results):
    """F32 .. Q6_K: two rows of two blocks each, every (row, block) through its deq into global memory,
    equal to edgellm.quants.dequantize bit for bit (under the simulator, or the GPU when EDGELLM_CUDA_DEVICE
    is 1)."""
    assert kernel_results["types"] is None, kernel_results["types"]


def test_f16_and_bf16_dequantize_every_bit_pattern_exactly(kernel_results):
    """All 65536 f16 patterns as numpy's float16 -> float32 gives them (NaNs as NaNs), subnormals, signed
    zeros and infinities included; all 65536 bf16 patterns as their bits << 16."""
    assert kernel_results["half patterns"] is None, kernel_results["half patterns"]


def test_every_deq_compiles_to_ptx_for_every_gpu_generation_without_fma():
    """compile_ptx (the simulator off, no GPU needed) of each type's deq for sm_75 .. sm_90, and no float
    multiply-add left for ptxas to fuse: every f32 mul / add / sub carries .rn (rn.py's libdevice helpers),
    which keeps the rounding of quants.py on the GPU."""
    ptx = _run_child("compile", simulator=False)
    from edgellm.backends.cuda_kernels.blocks import QK

    assert len(ptx) == len(QK) * len(TARGETS)
    for case, code in ptx.items():
        cc = case.split(" sm_")[1]
        assert f".target sm_{cc}" in code, case
        assert "fma." not in code, case
        unrounded = re.findall(r"\b(?:mul|add|sub)(?:\.ftz)?\.f32\b", code)
        assert not unrounded, f"{case}: {sorted(set(unrounded))}"


def test_block_tables_match_ggml_and_make_dequant_refuses_other_types():
    from edgellm.backends.cuda_kernels.blocks import QK, TYPE_SIZE, make_dequant

    supported = {*FLOAT_TYPES, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.IQ4_NL}
    supported |= {T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K}
    assert set(QK) == set(TYPE_SIZE) == {int(t) for t in supported}
    for t in supported:
        block, size = GGML_QUANT_SIZES[t]
        if t in FLOAT_TYPES:  # "blocks" of 32 values
            block, size = 32, 32 * size
        assert (QK[int(t)], TYPE_SIZE[int(t)]) == (block, size), t.name
        assert make_dequant(t) is make_dequant(int(t))  # one function per type, made once
    assert len({id(make_dequant(t)) for t in supported}) == len(supported)
    for t in (T.Q8_K, T.IQ2_XXS, 12345):
        with pytest.raises(ValueError, match="no cuda dequantizer"):
            make_dequant(t)


if __name__ == "__main__":
    _child(sys.argv[1])
