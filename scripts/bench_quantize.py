"""edgellm quantize vs llama.cpp's llama-quantize: wall time, same model, types and threads, interleaved.

Usage: python scripts/bench_quantize.py --bin path/to/llama.cpp/build/bin [--model qwen2.5-coder-1.5b]
       [--types Q4_K_M,Q4_0,Q8_0] [-t 2] [-r 3]
Each repetition runs llama-quantize then `edgellm quantize` (a fresh process each, so numba's cache load is
counted) for every type, checks the two files are identical, and reports median seconds, the ratio
(edgellm / llama-quantize, < 1 is faster) and each side's peak RSS, with the CPU it ran on. Each run
starts after a `sync`; edgellm's time includes its fsync of the output (llama-quantize does none).
"""

from __future__ import annotations

import argparse
import filecmp
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from edgellm import store


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def timed(cmd: list[str], env: dict) -> tuple[float, int | None]:
    """Wall seconds and, where GNU time is installed, the command's peak RSS in MiB."""
    # start with no dirty pages: else a run pays for flushing the file the run before it wrote
    os.sync()
    gnu_time = shutil.which("time") if Path("/usr/bin/time").exists() else None
    full = [gnu_time, "-f", "maxrss=%M", *cmd] if gnu_time else cmd
    t0 = time.perf_counter()
    p = subprocess.run(full, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if p.returncode:
        sys.exit(f"{cmd[0]} failed ({p.returncode}):\n{p.stderr[-2000:]}")
    last = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""
    rss = int(last.split("=", 1)[1]) // 1024 if last.startswith("maxrss=") else None
    return seconds, rss


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", required=True, type=Path, help="llama.cpp's build/bin (llama-quantize)")
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--types", default="Q4_K_M,Q4_0,Q8_0")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--repetitions", type=int, default=3)
    args = ap.parse_args()
    src = store.resolve(args.model)
    env = dict(os.environ, LD_LIBRARY_PATH=str(args.bin))
    t = str(args.threads)
    print(f"CPU: {cpu_model()}, {os.cpu_count()} logical cores; model {src.name}; {t} threads")
    rows = []
    with tempfile.TemporaryDirectory(dir=Path.home()) as tmp:
        for qt in args.types.split(","):
            ours, theirs, rss = [], [], [None, None]
            for _ in range(args.repetitions):
                a, b = Path(tmp) / "llama.gguf", Path(tmp) / "edgellm.gguf"
                s, m = timed(
                    [str(args.bin / "llama-quantize"), "--allow-requantize", str(src), str(a), qt, t], env
                )
                theirs.append(s)
                rss[0] = m
                cmd = [
                    sys.executable,
                    "-m",
                    "edgellm",
                    "quantize",
                    str(src),
                    str(b),
                    qt,
                    "-t",
                    t,
                    "--allow-requantize",
                ]
                s, m = timed(cmd, dict(os.environ))
                ours.append(s)
                rss[1] = m
                if not filecmp.cmp(a, b, shallow=False):
                    sys.exit(f"{qt}: edgellm's file differs from llama-quantize's")
                a.unlink(), b.unlink()
            lq, ed = statistics.median(theirs), statistics.median(ours)
            rows.append((qt, lq, ed, ed / lq, rss[0], rss[1]))
            print(
                f"{qt}: llama-quantize {lq:.1f} s, edgellm {ed:.1f} s ({ed / lq:.2f}x), identical", flush=True
            )
    print("\n| type | llama-quantize s | edgellm s | ratio | peak RSS MiB (llama / edgellm) | files |")
    print("|---|---|---|---|---|---|")
    for qt, lq, ed, ratio, r0, r1 in rows:
        print(f"| {qt} | {lq:.1f} | {ed:.1f} | {ratio:.2f}x | {r0} / {r1} | identical |")


if __name__ == "__main__":
    main()
