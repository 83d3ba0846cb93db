"""Decode throughput of the numba backend's matmul kernels, one type at a time, in GB/s of weights.

    python scripts/bench_numba_kernels.py [--types Q4_0 Q5_0 Q8_0 Q4_K Q6_K] [--rows 4864] [--cols 1024]
                                          [--threads 1] [-r 15]

One activation row (a decode step) against a rows x cols matrix of each type: legacy types quantized from
random floats with gguf-py, K-quants random bytes (the speed does not depend on the values). Reports the
lower-quartile time of -r calls after a warm-up call, and the weight bytes read per second. The matrix is
a few MB, so a thread reads it from cache after the first call: this measures the kernel, not memory.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from edgellm.backends import numba_kernels as nk  # noqa: E402


def weights(t: T, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    block, size = GGML_QUANT_SIZES[t]
    if t in (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0):
        w = quants.quantize(rng.standard_normal((rows, cols)).astype(np.float32), t)
    else:
        w = rng.integers(0, 256, (rows, cols // block * size)).astype(np.uint8)
    w.flags.writeable = False
    return w


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", nargs="+", default=["Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q4_K", "Q6_K"])
    ap.add_argument("--rows", type=int, default=4864)
    ap.add_argument("--cols", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=1, help="row ranges run in parallel")
    ap.add_argument("-r", type=int, default=15)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, a.cols)).astype(np.float32)
    out = np.empty((1, a.rows), np.float32)
    print(f"| type | {a.rows} x {a.cols}, {a.threads} thread(s) | GB/s |\n|---|---|---|")
    for name in a.types:
        t = T[name]
        family, kind = nk.KINDS[t]
        nk.compile_family(family)
        w = weights(t, a.rows, a.cols, rng)
        fn = nk.MATMULS[family]
        fn(kind, w, x, out, a.threads)
        times = []
        for _ in range(a.r):
            t0 = time.perf_counter()
            fn(kind, w, x, out, a.threads)
            times.append(time.perf_counter() - t0)
        dt = sorted(times)[len(times) // 4]
        print(f"| {name} | {dt * 1e3:.2f} ms | {w.nbytes / dt / 1e9:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
