"""Prompt and decode throughput of the native backend's matmuls, one weight type and shape at a time.

    python scripts/bench_native_kernels.py [--types F16 BF16 Q4_0 Q8_0 Q4_K Q6_K] [--shapes 1536x576 ...]
                                           [--prompt-rows 128] [--threads 1] [-r 10] [--decode-mb 256]

For each type and weight shape (rows x row length, as `llama-bench` models have them): a prompt, the
--prompt-rows activation rows against the matrix (GFLOP/s: 2 x rows x length x prompt rows a second,
the matrix and rows in cache: the GEMM's own speed), and a decode step, one activation row against
copies of the matrix that add up to --decode-mb (GB/s of weight bytes, read from memory, as generation
reads them). The weights are llama-quantize's blocks of random normals (`edgellm.quantize`; the copies
repeat them), bound as a model's are (repacked where the level repacks that type). The kernel level is
the CPU's, or EDGELLM_NATIVE_LEVEL's. Each figure is the best of -r runs, prompt and decode interleaved:
on a shared VM other tenants only ever slow a run down. Compare builds by running this in each (same
machine, same hour), not against figures from another day.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from edgellm.backends.native import NativeBackend  # noqa: E402
from edgellm.gguf import QTensor  # noqa: E402
from edgellm.quantize import quantize_rows  # noqa: E402

SHAPES = ["576x576", "1536x576", "576x1536", "4864x896", "896x4864"]  # SmolLM2's and Qwen2.5-0.5B's


def weight(t: T, rows: int, k: int, rng: np.random.Generator) -> QTensor:
    data = quantize_rows(t, rng.standard_normal((rows, k)).astype(np.float32), None, 1)
    data.flags.writeable = False
    return QTensor("w", t, (k, rows), 0, data.nbytes, data)


def seconds(fn, *args) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def measure(nb: NativeBackend, t: T, rows: int, k: int, a: argparse.Namespace, rng) -> tuple[float, float]:
    """(prompt GFLOP/s, decode GB/s) of one type and shape, the best of a.r interleaved runs."""
    first = weight(t, rows, k, rng)
    copies = [nb.bind(first)] + [  # copies of the blocks: the speed does not depend on the values
        nb.bind(QTensor("w", t, first.ne, 0, first.nbytes, first.data.copy()))
        for _ in range(max(1, int(a.decode_mb * 1e6 / first.nbytes)) - 1)
    ]
    x = rng.standard_normal((a.prompt_rows, k)).astype(np.float32)
    x1 = x[:1].copy()

    def decode():
        for w in copies:
            nb.matmul(w, x1)

    nb.matmul(copies[0], x), decode()  # warm: caches, scratch, pages
    prompt_s = decode_s = float("inf")
    for _ in range(a.r):  # interleaved, so a noisy minute touches both
        prompt_s = min(prompt_s, seconds(nb.matmul, copies[0], x))
        decode_s = min(decode_s, seconds(decode))
    return 2.0 * rows * k * a.prompt_rows / prompt_s / 1e9, first.nbytes * len(copies) / decode_s / 1e9


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", nargs="+", default=["F16", "BF16", "Q4_0", "Q8_0", "Q4_K", "Q6_K"])
    ap.add_argument("--shapes", nargs="+", default=SHAPES, help="ROWSxLENGTH of the weight")
    ap.add_argument("--prompt-rows", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("-r", type=int, default=10, help="runs; the best is reported")
    ap.add_argument("--decode-mb", type=float, default=256.0, help="weight copies for decode, MB in all")
    a = ap.parse_args()
    nb = NativeBackend(threads=a.threads)
    rng = np.random.default_rng(0)
    print(f"native level {nb.level}, {a.threads} thread(s), prompt {a.prompt_rows} rows, best of {a.r}\n")
    print("| type | rows x length | prompt GFLOP/s | decode GB/s |\n|---|---|---|---|")
    for name in a.types:
        t = T[name]
        for shape in a.shapes:
            rows, k = (int(v) for v in shape.split("x"))
            block = GGML_QUANT_SIZES[t][0]
            if k % block:
                print(f"| {name} | {rows} x {k} | (rows of {block}-element blocks only) | |")
                continue
            gflops, gbs = measure(nb, t, rows, k, a, rng)
            print(f"| {name} | {rows} x {k} | {gflops:.1f} | {gbs:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
