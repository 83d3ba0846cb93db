"""edgellm against llama.cpp's own llama-bench: same GGUF, same threads, same -p/-n, interleaved in one run.

    python scripts/bench_vs_llamacpp.py --llama-bench PATH [--llama-quantize PATH]
        [--models smollm2-135m gemma3-270m] [--variants Q4_0 Q8_0 F16] [--threads 1 2]
        [--backends native numba] [-p 128] [-n 64] [-d 0] [--rounds 3] [--json OUT] [--device vulkan]

llama-bench is built from the llama-cpp-python sdist (`pip download --no-binary :all: --no-deps
llama-cpp-python`, then in vendor/llama.cpp: `cmake -B build -DGGML_NATIVE=ON -DLLAMA_CURL=OFF
-DCMAKE_BUILD_TYPE=Release && cmake --build build -j2 --target llama-bench llama-quantize`); its path may
also come from $LLAMA_BENCH (and $LLAMA_QUANTIZE). Variants (Q4_0, Q8_0, F16, ...) of the first model are
made once with `llama-quantize --allow-requantize` into --variants-dir.

Each round runs, for every file and thread count: llama-bench (one repetition), then `edgellm bench` (one
repetition after its untimed warm-up) for every backend, each in a fresh process, so the machine's noise
falls on both sides alike; the table reports medians over the rounds and edgellm/llama.cpp ratios. It
also measures this machine's memory read bandwidth (numpy sum over 1 GiB, 1 and N threads) and reports
generation tok/s × weight bytes per token as a share of it, and the time from process start to the first
token of `edgellm run MODEL -p hi -n 1` (second run, so caches are warm).

`-d N` runs every test at depth N (N tokens already in the cache, untimed: llama-bench's -d); edgellm's
tg steps follow its -p prompt, llama-bench's do not, so tg at depth is compared with `-p 0`.

`--device vulkan` compares on a GPU (or lavapipe): llama-bench (a build with -DGGML_VULKAN=ON) with every
layer offloaded (-ngl 99) against `edgellm bench --backend vulkan` (--backends then defaults to vulkan).
ggml-vulkan ignores CPU devices such as lavapipe unless GGML_VK_VISIBLE_DEVICES names them: the script
sets it to 0 (override with $GGML_VK_VISIBLE_DEVICES), so both sides run on the same device; check
llama-bench's "ggml_vulkan: 0 = ..." line in --verbose output.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def _fmt(v: float | None, digits: int) -> str:
    """v to `digits` decimals, or '-' for a test not run (-p 0 or -n 0)."""
    return "-" if v is None else f"{v:.{digits}f}"


def _ratio(ours: float | None, theirs: float | None) -> str:
    return "-" if not ours or not theirs else f"{ours / theirs:.2f}"


BUSY: list[float] = []  # the CPU seconds / wall seconds of the last _run_json's process


def backend_spec(spec: str) -> tuple[str, dict[str, str]]:
    """`native:EDGELLM_AMX=0,EDGELLM_REPACK=1` -> ("native", {"EDGELLM_AMX": "0", ...}): a backend with
    environment settings for edgellm's process alone, so one run can interleave two configurations."""
    name, _, rest = spec.partition(":")
    env = {}
    for kv in filter(None, rest.split(",")):
        k, sep, v = kv.partition("=")
        if not sep or not k:
            raise SystemExit(f"--backends {spec!r}: settings are NAME=VALUE, comma-separated")
        env[k] = v
    return name, env


def _run_json(cmd: list[str], timeout: float = 900, env: dict[str, str] | None = None) -> object:
    """Run cmd and parse its JSON output; BUSY[0] becomes the cores it kept busy on average (its user +
    system CPU time over its wall time: the threads it really used, not the ones it was asked for)."""
    r0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    p = subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}
    )
    r1, wall = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter() - t0
    BUSY[:] = [(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime) / wall]
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-2000:]}")
    return json.loads(
        p.stdout[p.stdout.index("{") if p.stdout.lstrip().startswith("{") else p.stdout.index("[") :]
    )


def cpu_description() -> dict:
    """The CPU's model name, logical CPUs and the SIMD flags the kernels care about (/proc/cpuinfo)."""
    model, flags = "unknown", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, val = line.partition(":")
            if key.strip() == "model name" and model == "unknown":
                model = val.strip()
            elif key.strip() in ("flags", "Features") and not flags:
                flags = set(val.split())
    except OSError:
        pass
    keep = sorted(f for f in flags if f in SIMD_FLAGS or f.startswith(("avx512", "amx")))
    return {"model": model, "logical_cpus": os.cpu_count(), "flags": keep}


SIMD_FLAGS = {"sse4_2", "avx", "avx2", "fma", "f16c", "avx_vnni", "asimd", "asimddp", "i8mm", "sve", "bf16"}


def llama_bench(
    exe: str, model: Path, threads: int, n_prompt: int, n_gen: int, device: str | None, depth: int = 0
) -> dict:
    """pp and tg tok/s of one llama-bench repetition (every layer on the GPU with a device)."""
    gpu = ["-ngl", "99"] if device else ["-ngl", "0"]
    out = _run_json(
        [
            exe,
            *gpu,
            *(["-d", str(depth)] if depth else []),
            "-m",
            str(model),
            "-t",
            str(threads),
            "-p",
            str(n_prompt),
            "-n",
            str(n_gen),
            "-r",
            "1",
            "-o",
            "json",
        ]
    )
    res = {"busy": BUSY[0], "threads": out[0].get("n_threads") if out else None}
    for row in out:
        if row.get("n_prompt", 0) > 0 and row.get("n_gen", 0) == 0:
            res["pp"] = float(row["avg_ts"])
        elif row.get("n_gen", 0) > 0 and row.get("n_prompt", 0) == 0:
            res["tg"] = float(row["avg_ts"])
    return res


def edgellm_bench(model: Path, spec: str, threads: int, n_prompt: int, n_gen: int, depth: int = 0) -> dict:
    backend, env = backend_spec(spec)
    out = _run_json(
        [
            sys.executable,
            "-m",
            "edgellm.cli",
            "bench",
            str(model),
            *(["-d", str(depth)] if depth else []),
            "--backend",
            backend,
            "-t",
            str(threads),
            "-p",
            str(n_prompt),
            "-n",
            str(n_gen),
            "-r",
            "1",
            "--json",
        ],
        env=env,
    )
    return {
        "pp": out["pp_tok_s"],
        "tg": out["tg_tok_s"],
        "ttft": out["ttft_s"],
        "rss_beyond": out["rss_beyond_model_mb"],
        "bytes_per_token": out["weight_bytes_per_token"],
        "backend": out["backend"],
        "threads": out["threads"],
        "busy": BUSY[0],
    }


def first_token_s(model: str, spec: str, runs: int = 2) -> float:
    """Seconds from process start to the first byte `edgellm run MODEL -p hi -n 1` prints (last run)."""
    backend, env = backend_spec(spec)
    dt = float("nan")
    for _ in range(runs):
        t0 = time.perf_counter()
        p = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "edgellm.cli",
                "run",
                model,
                "-p",
                "hi",
                "-n",
                "1",
                "--temp",
                "0",
                "--backend",
                backend,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env={**os.environ, **env},
        )
        assert p.stdout is not None
        p.stdout.read(1)
        dt = time.perf_counter() - t0
        p.wait()
    return dt


def memory_bandwidth_gbs(threads: int, gib: float = 1.0, reps: int = 5) -> float:
    """Best read bandwidth of numpy sums over `gib` GiB split across `threads` threads (numpy releases the
    GIL inside the reduction)."""
    a = np.ones(int(gib * 2**30) // 8, np.float64)
    parts = np.array_split(a, threads)
    best = 0.0
    for _ in range(reps):
        ts = [threading.Thread(target=np.sum, args=(p,)) for p in parts]
        t0 = time.perf_counter()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        best = max(best, a.nbytes / (time.perf_counter() - t0) / 1e9)
    return best


def model_stem(path: Path) -> str:
    """The file's name without its quantization suffix (SmolLM2-135M-Instruct.Q4_1.gguf ->
    SmolLM2-135M-Instruct); Qwen2.5-Coder-0.5B-Instruct.gguf keeps its dots."""
    head, _, tail = path.stem.rpartition(".")
    return head if head and re.fullmatch(r"(?i)(I?Q\d\w*|B?F16|F32)", tail) else path.stem


def make_variants(quantize: str, src: Path, types: list[str], out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for t in types:
        dst = out_dir / f"{model_stem(src)}.{t.upper()}.gguf"
        if not dst.exists():
            tmp = dst.with_suffix(".partial")
            subprocess.run(
                [quantize, "--allow-requantize", str(src), str(tmp), t.upper()],
                check=True,
                capture_output=True,
            )
            os.replace(tmp, dst)
        paths.append(dst)
    return paths


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-bench", default=os.environ.get("LLAMA_BENCH"))
    ap.add_argument("--llama-quantize", default=os.environ.get("LLAMA_QUANTIZE"))
    ap.add_argument("--models", nargs="+", default=["smollm2-135m", "gemma3-270m"])
    ap.add_argument(
        "--variants", nargs="*", default=["Q4_0", "Q8_0", "F16"], help="made from the first model"
    )
    ap.add_argument("--variants-dir", type=Path, default=Path.home() / ".cache/edgellm/variants")
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    ap.add_argument(
        "--backends",
        nargs="+",
        help="default: native numba (with --device: that device); BACKEND:VAR=VALUE,... sets environment "
        "variables for that backend's processes (e.g. native:EDGELLM_AMX=0 beside native)",
    )
    ap.add_argument("--device", choices=["vulkan", "metal"], help="compare on this GPU backend (-ngl 99)")
    ap.add_argument("-p", type=int, default=128)
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("-d", type=int, default=0, help="tokens in the cache before each test (tg: with -p 0)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path, help="write every sample here")
    a = ap.parse_args()
    if not a.llama_bench:
        ap.error("give --llama-bench PATH or set $LLAMA_BENCH")
    a.backends = a.backends or ([a.device] if a.device else ["native", "numba"])
    if a.device == "vulkan":  # let ggml-vulkan use a CPU device (lavapipe) too
        os.environ.setdefault("GGML_VK_VISIBLE_DEVICES", "0")

    sys.path.insert(0, str(ROOT))
    from edgellm import store

    files = [Path(store.resolve(m)) for m in a.models]
    if a.variants:
        if not a.llama_quantize:
            ap.error(
                "variants need --llama-quantize PATH or $LLAMA_QUANTIZE (or pass --variants with no types)"
            )
        files[1:1] = make_variants(a.llama_quantize, files[0], a.variants, a.variants_dir)

    samples: dict[tuple, list[dict]] = {}
    for r in range(a.rounds):
        for f in files:
            for t in a.threads:
                print(f"round {r + 1}/{a.rounds}: {f.name} -t {t}", file=sys.stderr, flush=True)
                samples.setdefault((f.name, t, "llama.cpp"), []).append(
                    llama_bench(a.llama_bench, f, t, a.p, a.n, a.device, a.d)
                )
                for b in a.backends:
                    samples.setdefault((f.name, t, b), []).append(edgellm_bench(f, b, t, a.p, a.n, a.d))

    bw = {t: memory_bandwidth_gbs(t) for t in sorted(set(a.threads))}
    ttft = {b: first_token_s(a.models[0], b) for b in a.backends}

    def med(rows: list[dict], k: str) -> float | None:
        v = [x[k] for x in rows if x.get(k) is not None]
        return statistics.median(v) if v else None

    cpu = cpu_description()
    print(
        f"\nmedians of {a.rounds} interleaved rounds, pp{a.p} / tg{a.n}{f' at depth {a.d}' if a.d else ''}, "
        "tokens/s; "
        "ratio = edgellm / llama.cpp\n"
        f"CPU: {cpu['model']}, {cpu['logical_cpus']} logical CPUs, flags {' '.join(cpu['flags'])}\n"
        "threads: asked (llama-bench's n_threads / edgellm's) and cores kept busy on average "
        "(CPU time / wall time of the whole process, load included)\n"
    )
    print(
        "| model | threads | llama.cpp pp | llama.cpp tg | backend | pp | tg | pp ratio | tg ratio "
        "| tg GB/s (% of bw) | RSS beyond model MiB | threads llama.cpp / edgellm (busy) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for f in files:
        for t in a.threads:
            ref = samples[(f.name, t, "llama.cpp")]
            lpp, ltg = med(ref, "pp"), med(ref, "tg")
            for b in a.backends:
                rows = samples[(f.name, t, b)]
                pp, tg = med(rows, "pp"), med(rows, "tg")
                gbs = tg * rows[0]["bytes_per_token"] / 1e9 if tg else None
                print(
                    f"| {f.name} | {t} | {_fmt(lpp, 1)} | {_fmt(ltg, 1)} | {b} | "
                    f"{_fmt(pp, 1)} | {_fmt(tg, 1)} | {_ratio(pp, lpp)} | {_ratio(tg, ltg)} | "
                    f"{f'{gbs:.1f} ({100 * gbs / bw[t]:.0f}%)' if gbs else '-'} | "
                    f"{med(rows, 'rss_beyond'):.0f} | {ref[0].get('threads')} ({med(ref, 'busy'):.2f}) / "
                    f"{rows[0]['threads']} ({med(rows, 'busy'):.2f}) |"
                )
    print(
        "\nmemory read bandwidth (numpy sum over 1 GiB): "
        + ", ".join(f"{t} thread(s) {v:.1f} GB/s" for t, v in bw.items())
    )
    print(
        "process start to first token, `edgellm run "
        + a.models[0]
        + " -p hi -n 1` (second run): "
        + ", ".join(f"{b} {v:.2f} s" for b, v in ttft.items())
    )
    if a.json:
        a.json.write_text(
            json.dumps(
                {
                    "samples": {"|".join(map(str, k)): v for k, v in samples.items()},
                    "bandwidth_gbs": bw,
                    "first_token_s": ttft,
                    "cpu": cpu,
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
