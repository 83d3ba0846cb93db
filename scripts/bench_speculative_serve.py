"""Speculative decoding under load: aggregate generation speed of a server with and without prompt lookup,
at 1 and 8 concurrent clients, edgellm serve against llama.cpp's llama-server -np N (same GGUF, threads).

Every client sends the editing prompt of bench_speculative.py (its code renamed per client, so no two
answers are the same text), greedy, streamed; a round is each client's requests one after another.
Reported: tokens streamed / wall time of the round, and speculative / plain per server and concurrency.

    python scripts/bench_speculative_serve.py [--model qwen2.5-coder-1.5b] [--threads 2]
        [--concurrency 1 8] [--llama-server PATH/llama-server] [--draft qwen2.5-coder-0.5b]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time

import httpx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_serve import free_port, start  # noqa: E402
from bench_speculative import PROMPTS  # noqa: E402

NAMES = ["config", "settings", "profile", "record", "options", "schema", "layout", "account"]


def prompt(i: int) -> str:
    return PROMPTS["edit"].replace("config", NAMES[i % len(NAMES)])


async def one(client: httpx.AsyncClient, url: str, i: int, max_tokens: int) -> int:
    body = {"model": "m", "messages": [{"role": "user", "content": prompt(i)}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True}  # fmt: skip
    n = 0
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                choices = json.loads(line[6:]).get("choices") or [{}]
                n += bool(choices[0].get("delta", {}).get("content"))
    return n


async def round_(url: str, conc: int, rounds: int, max_tokens: int) -> tuple[float, int]:
    async with httpx.AsyncClient(timeout=900, limits=httpx.Limits(max_connections=conc + 4)) as client:

        async def worker(w: int) -> int:
            return sum([await one(client, url, w * rounds + r, max_tokens) for r in range(rounds)])

        t0 = time.perf_counter()
        toks = sum(await asyncio.gather(*(worker(w) for w in range(conc))))
        return time.perf_counter() - t0, toks


def measure(name: str, cmd: list[str], url: str, ready: str, args, log: str) -> dict[int, float]:
    proc = start(cmd, url, ready, log, timeout=600)
    out = {}
    try:
        asyncio.run(round_(url, max(args.concurrency), 1, 16))  # warm-up: every batch size once
        for conc in args.concurrency:
            wall, toks = asyncio.run(round_(url, conc, args.rounds, args.max_tokens))
            out[conc] = toks / wall
            print(f"  {name} c={conc}: {toks} tokens in {wall:.1f} s = {out[conc]:.1f} tok/s", flush=True)
    finally:
        proc.terminate()
        proc.wait(60)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--rounds", type=int, default=1, help="requests per client")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--llama-server", help="llama.cpp's llama-server binary (omit: edgellm only)")
    ap.add_argument("--draft", help="also a draft model (alias or path): -md, llama-server's draft-simple")
    args = ap.parse_args()

    from edgellm import store

    path = str(store.resolve(args.model))
    tmp = tempfile.mkdtemp(prefix="bench_spec_serve_")
    slots, t = str(max(args.concurrency)), str(args.threads)
    results: dict[str, dict[str, dict[int, float]]] = {}
    specs = {"none": [], "ngram-simple": []}
    if args.draft:
        specs["draft-simple"] = ["-md", str(store.resolve(args.draft))]
    for spec, more in specs.items():
        port = free_port()
        cmd = [sys.executable, "-m", "edgellm", "serve", path, "--port", str(port), "-t", t, "--parallel",
               slots, "-c", "4096", "--spec-type", spec, *more]  # fmt: skip
        log = os.path.join(tmp, f"edgellm-{spec}.log")
        results.setdefault("edgellm", {})[spec] = measure(f"edgellm {spec}", cmd, f"http://127.0.0.1:{port}",
                                                          "/health", args, log)  # fmt: skip
        if args.llama_server:
            port = free_port()
            cmd = [args.llama_server, "-m", path, "--port", str(port), "-t", t, "-np", slots, "-c",
                   str(4096 * int(slots)), "--spec-type", spec, *more]  # fmt: skip
            log = os.path.join(tmp, f"llama-server-{spec}.log")
            results.setdefault("llama-server", {})[spec] = measure(
                f"llama-server {spec}", cmd, f"http://127.0.0.1:{port}", "/health", args, log
            )
    print(f"\n{args.model}, {args.threads} threads, {slots} slots, editing prompt, greedy, max_tokens "
          f"{args.max_tokens}\n")  # fmt: skip
    heads = " | ".join(f"{k} tok/s (ratio)" for k in list(specs)[1:])
    print(f"| server | clients | plain tok/s | {heads} |")
    print("|---|---|---|" + "---|" * (len(specs) - 1))
    for name, res in results.items():
        for conc in args.concurrency:
            a = res["none"][conc]
            cells = " | ".join(f"{res[k][conc]:.1f} ({res[k][conc] / a:.2f}x)" for k in list(specs)[1:])
            print(f"| {name} | {conc} | {a:.1f} | {cells} |")


if __name__ == "__main__":
    main()
