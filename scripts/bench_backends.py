"""Prompt and generation speed of edgellm's CPU backends side by side, on the same models and threads.

    python scripts/bench_backends.py [--models smollm2-135m gemma3-270m] [--backends reference numba]
                                     [-p 128] [-n 32] [-r 3] [-t THREADS] [--json]

For each model and backend: load, warm up (the numba backend compiles or loads its kernels from cache at
load and runs one untimed prompt and step, so no JIT falls inside a timed region), then -r repetitions of
a -p token prompt (one forward pass over all of it, logits for the last token only, as llama-bench's pp)
and of -n single-token decode steps after it (tg). Reports medians in tokens/s and numba/reference ratios.
Token ids are fixed pseudo-random ids, so no tokenizer time is measured.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import edgellm  # noqa: E402


def _prompt(model, n_prompt: int) -> np.ndarray:
    rng = np.random.default_rng(0)
    return rng.integers(10, model.config.n_vocab - 10, n_prompt).astype(np.int64)


def _prefill_s(model, ids: np.ndarray) -> float:
    kv = model.new_kv_cache(len(ids) + 1, 1)
    n = len(ids)
    t0 = time.perf_counter()
    model.forward(ids, np.arange(n), np.zeros(n, np.int64), kv, logits_rows=np.array([n - 1]))
    return time.perf_counter() - t0


def _decode_s(model, ids: np.ndarray, n_gen: int) -> float:
    """Seconds for n_gen one-token steps after a prompt of ids (the prompt itself untimed)."""
    n = len(ids)
    kv = model.new_kv_cache(n + n_gen + 1, 1)
    model.forward(ids, np.arange(n), np.zeros(n, np.int64), kv, logits_rows=np.array([n - 1]))
    tok = np.array([int(ids[-1])])
    one = np.zeros(1, np.int64)
    t0 = time.perf_counter()
    for i in range(n_gen):
        logits = model.forward(tok, np.array([n + i]), one, kv)
        tok = np.array([int(np.argmax(logits[0]))])
    return time.perf_counter() - t0


def bench(alias: str, backend: str, threads: int | None, n_prompt: int, n_gen: int, reps: int) -> dict:
    t0 = time.perf_counter()
    llm = edgellm.LLM(alias, backend=backend, threads=threads, n_ctx=n_prompt + n_gen + 8)
    load_s = time.perf_counter() - t0
    model = llm.model
    ids = _prompt(model, n_prompt)
    _prefill_s(model, ids[:8])  # warm-up: every kernel and shape path once, outside the timings
    _decode_s(model, ids[:8], 2)
    pp = [n_prompt / _prefill_s(model, ids) for _ in range(reps)]
    tg = [n_gen / _decode_s(model, ids[:16], n_gen) for _ in range(reps)]
    return {
        "model": alias,
        "backend": backend,
        "threads": getattr(llm.backend, "threads", None),
        "load_s": round(load_s, 2),
        f"pp{n_prompt}": round(statistics.median(pp), 2),
        f"tg{n_gen}": round(statistics.median(tg), 2),
        "pp_all": [round(v, 2) for v in pp],
        "tg_all": [round(v, 2) for v in tg],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["smollm2-135m", "gemma3-270m"])
    ap.add_argument("--backends", nargs="+", default=["reference", "numba"])
    ap.add_argument("-p", "--n-prompt", type=int, default=128)
    ap.add_argument("-n", "--n-gen", type=int, default=32)
    ap.add_argument("-r", "--reps", type=int, default=3)
    ap.add_argument("-t", "--threads", type=int, default=None)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rows = []
    for alias in a.models:
        for backend in a.backends:
            r = bench(alias, backend, a.threads, a.n_prompt, a.n_gen, a.reps)
            rows.append(r)
            if not a.json:
                print(
                    f"{alias:14s} {backend:10s} t={r['threads']}  load {r['load_s']:6.2f} s  "
                    f"pp{a.n_prompt} {r[f'pp{a.n_prompt}']:8.2f} tok/s  "
                    f"tg{a.n_gen} {r[f'tg{a.n_gen}']:7.2f} tok/s"
                    f"   (pp {r['pp_all']}, tg {r['tg_all']})",
                    flush=True,
                )
        base = next((r for r in rows if r["model"] == alias and r["backend"] == "reference"), None)
        for r in rows:
            if base is not None and r["model"] == alias and r is not base and not a.json:
                pp, tg = f"pp{a.n_prompt}", f"tg{a.n_gen}"
                ratio = f"pp x{r[pp] / base[pp]:.2f}, tg x{r[tg] / base[tg]:.2f}"
                print(f"{'':14s} {r['backend']}/reference: {ratio}")
    if a.json:
        print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
