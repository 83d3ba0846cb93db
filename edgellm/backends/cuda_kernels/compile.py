"""Compile every cuda kernel to PTX for the GPU generations edgellm supports, without a GPU (numba-cuda's
compile_ptx through NVVM): `python -m edgellm.backends.cuda_kernels.compile [CC ...]` (default: 75 80 86
89 90). It runs where the simulator is off; CI uses it to type-check the kernels for real targets."""

from __future__ import annotations

import os
import sys

TARGETS = ((7, 5), (8, 0), (8, 6), (8, 9), (9, 0))
F1, F2, F3 = "float32[::1]", "float32[:, ::1]", "float32[:, :, ::1]"
I1, U16, U8 = "int32[::1]", "uint16[:, :, ::1]", "uint8[:, ::1]"


def kernels() -> list[tuple[str, object, str]]:
    """(name, python function, signature) of every kernel the backend launches, with the argument types
    its launches pass (device arrays C-contiguous; Python ints int64, floats float64, flags boolean)."""
    from edgellm.backends.cuda_kernels import attention, matmul, ops
    from edgellm.backends.cuda_kernels.blocks import QK

    out = [
        ("round_activations", ops.round_activations, f"void({F2}, {F2}, {F2}, int64)"),
        ("rms_norm", ops.rms_norm, f"void({F2}, {F1}, {F2}, float64, boolean)"),
        ("rope", ops.rope, f"void({F3}, {I1}, {F2}, {F2}, {F3}, int64, boolean)"),
        ("elementwise", ops.elementwise, f"void({F1}, {F1}, {F1}, {F1}, int64, int64, float64)"),
        ("columns", ops.columns, f"void({F2}, {F2}, int64)"),
        ("take_rows", ops.take_rows, f"void({F2}, {I1}, {F2})"),
        ("argmax", ops.argmax, f"void({F2}, {I1})"),
        ("store", attention.store, f"void({F3}, {F3}, {U16}, {U16}, int32[:, ::1], {I1}, {I1}, int64)"),
        (
            "attend",
            attention.attend,
            f"void({F3}, {U16}, {U16}, int32[:, ::1], {I1}, {I1}, {F3}, {F2}, int64, int64, float64, "
            "float64)",
        ),
    ]
    for t in sorted(QK):
        out.append((f"matmul[{t}]", matmul.matmul_kernel(t), f"void({U8}, {F2}, {F2}, {F2})"))
        out.append((f"get_rows[{t}]", matmul.rows_kernel(t), f"void({U8}, {I1}, {F2})"))
    return out


def compile_target(cc: tuple[int, int]) -> int:
    """PTX bytes over every kernel for one target; raises on the first kernel NVVM refuses."""
    from numba import config, cuda

    if config.ENABLE_CUDASIM:
        raise RuntimeError("compile_ptx needs the simulator off (unset NUMBA_ENABLE_CUDASIM)")
    total = 0
    for name, fn, sig in kernels():
        try:
            ptx, _ = cuda.compile_ptx(fn.py_func, sig, cc=cc)
        except Exception as e:
            raise RuntimeError(f"{name} for sm_{cc[0]}{cc[1]}: {e}") from e
        total += len(ptx)
    return total


def compile_all(targets=TARGETS) -> dict[tuple[int, int], int]:
    """compile_target for each target, in a process per core (each target takes ~35 s of one core)."""
    from concurrent.futures import ProcessPoolExecutor

    workers = max(1, min(len(targets), os.cpu_count() or 1))
    with ProcessPoolExecutor(workers) as pool:
        return dict(zip(targets, pool.map(compile_target, targets)))


if __name__ == "__main__":
    ccs = tuple((int(a[:-1]), int(a[-1])) for a in sys.argv[1:]) or TARGETS
    for cc, n in compile_all(ccs).items():
        print(f"sm_{cc[0]}{cc[1]}: {n} bytes of PTX")
