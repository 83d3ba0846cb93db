"""Decode attention of the native backend at a depth, in microseconds a layer.

    python scripts/bench_attention.py [--shapes 1x4x256 3x3x64 2x7x64 2x6x128] [--depth 2048]
                                      [--layers 24] [--threads 2] [-r 5] [--steps 60] [--kv f16]

A shape is kv heads x query heads per kv head x head dim (gemma3-270m, SmolLM2-135M, Qwen2.5-Coder-0.5B
and -1.5B by default). The f16 cache of --layers layers is filled --depth deep with random rows, then
one decode step's attention op of every layer is run as one plan (ops back to back on the pool, as in
generation), --steps times. With the default 24 layers the caches outgrow the L3 cache, so each layer
reads its keys and values from memory, as a decode step does between the weights; `--layers 1` keeps
them in cache (the loops' own speed). Each figure is the 10th percentile of the steps, best of -r runs:
on a shared VM other tenants only ever slow a run down. `--kv q8_0` stores K and V as q8_0 blocks
(`-ctk q8_0 -ctv q8_0`), `--kv q8_0:f16` K only. Compare builds by running this in each (same
machine, same hour), not against figures from another day.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from edgellm.backends import native  # noqa: E402
from edgellm.backends.native import NativeBackend  # noqa: E402

SHAPES = ["1x4x256", "3x3x64", "2x7x64", "2x6x128"]


def decode_plan(nb: NativeBackend, shape: str, depth: int, layers: int, kv_types: tuple[str, str]) -> tuple:
    """A cache of `layers` layers filled `depth` deep and one decode step's attention op of every layer,
    captured as a plan: (ops, the arrays the ops point into)."""
    hkv, group, dh = (int(x) for x in shape.split("x"))
    kv = nb.new_kv_cache(layers, hkv, dh, depth + 16, 1, type_k=kv_types[0], type_v=kv_types[1])
    rng = np.random.default_rng(1)
    for layer in range(layers):
        for p0 in range(0, depth, 512):
            n = min(512, depth - p0)
            q = rng.standard_normal((n, hkv * group, dh)).astype(np.float32)
            k, v = rng.standard_normal((2, n, hkv, dh)).astype(np.float32)
            nb.attention(q, k, v, kv, layer, np.zeros(n, np.int64), np.arange(p0, p0 + n), dh**-0.5)
    q = rng.standard_normal((1, hkv * group, dh)).astype(np.float32)
    k, v = rng.standard_normal((2, 1, hkv, dh)).astype(np.float32)
    seq, pos = np.zeros(1, np.int64), np.array([depth], np.int64)
    fields: list[dict] = []
    nb._exec = lambda **f: fields.append(f)  # capture the ops instead of running them
    try:
        outs = [nb.attention(q, k, v, kv, layer, seq, pos, dh**-0.5) for layer in range(layers)]
    finally:
        del nb._exec
    ops = native.ffi.new("ed_op[]", layers)
    for op, f in zip(ops, fields):
        for name, value in f.items():
            setattr(op, name, value)
    return ops, (kv, q, k, v, seq, pos, outs)


def layer_us(nb: NativeBackend, ops, layers: int, steps: int) -> float:
    """The 10th percentile over `steps` runs of the plan, per layer."""
    times = []
    for _ in range(steps):
        t0 = time.perf_counter_ns()
        if native.lib.ed_plan_run(nb._pool, ops, layers) != 0:
            raise RuntimeError("the runtime rejected an attention op")
        times.append((time.perf_counter_ns() - t0) / layers / 1e3)
    return float(np.percentile(times, 10))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=SHAPES, help="KVHEADSxGROUPxHEADDIM")
    ap.add_argument("--depth", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("-r", type=int, default=5, help="runs; the best is reported")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--kv", default="f16", help="the cache's K[:V] type: f16, q8_0 (both), q8_0:f16")
    args = ap.parse_args()
    kind_k, kind_v = (args.kv.split(":") * 2)[:2]
    nb = NativeBackend(threads=args.threads)
    print(f"native level {nb.level}, {nb.threads} thread(s), {args.kv} cache, depth {args.depth}, ", end="")
    print(f"{args.layers} layer(s), best of {args.r}")
    print("\n| kv heads x group x head dim | us a layer | ns a key |\n|---|---|---|")
    for shape in args.shapes:
        # (_arrays: kept alive while the ops run)
        ops, _arrays = decode_plan(nb, shape, args.depth, args.layers, (kind_k, kind_v))
        best = min(layer_us(nb, ops, args.layers, args.steps) for _ in range(args.r))
        print(f"| {shape} | {best:.1f} | {best * 1e3 / (args.depth + 1):.1f} |")


if __name__ == "__main__":
    main()
