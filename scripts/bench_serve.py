"""Serving benchmark: edgellm serve against llama-cpp-python's server, same model and threads.

Concurrency 1, 4, 8, 16: each client sends `--rounds` streamed chat requests one after another, each a
~200-token system prompt shared by every client plus the client's own question. Reported per server and
concurrency: aggregate generation tok/s (tokens streamed / wall time of the round), time to first token
p50/p99, and (edgellm) the prefix-cache hit rate of the round. Then TTFT with a system prompt nobody
shares (no prefix to reuse), for the "cached vs not" ratio.

    python scripts/bench_serve.py [--model smollm2-135m] [--threads 2] [--backend auto] [--no-llama-cpp]

With --ray (needs edgellm[ray]): `edgellm serve --ray` with 2 replicas x 1 thread against 1 replica x 2
threads (and the plain server with 2 threads), 8 clients over 2 system prompts that share nothing: the
same figures plus how the requests spread over the replicas.

    python scripts/bench_serve.py --ray [--model smollm2-135m] [--backend auto]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid

import httpx

SYSTEM = (
    "You are Edge, a friendly and knowledgeable assistant running entirely on a small computer without "
    "any connection to the internet. You answer questions about science, history, cooking, travel, "
    "programming and everyday life. Keep your answers clear and concrete, use short paragraphs, and give "
    "an example whenever an example would help the reader understand. If a question is ambiguous, state "
    "the most likely interpretation and answer that one. Never invent facts: when you are unsure, say so "
    "plainly and suggest how the reader could check. Be polite, be patient, and avoid jargon unless the "
    "reader uses it first. When you list steps, number them. When you compare things, mention at least "
    "one advantage and one drawback of each. Prefer metric units, and give temperatures in Celsius. "
    "Remember that the reader may be a student, a parent, a retiree or an engineer, and adapt the level "
    "of detail to the way the question is asked."
)
SYSTEM_B = (
    "Quill here: an exacting copy editor for a small publishing house. Rewrite the text the user gives "
    "you in plain, formal English. Keep its meaning and its order, remove every cliche and every filler "
    "word, split sentences longer than twenty-five words, and prefer active verbs. Do not add facts. Keep "
    "names, numbers and quotations exactly as they are. After the rewrite, list each change you made, "
    "one line per change, with the reason for it in a few words. When the user asks a question instead "
    "of giving text, answer it in the same plain style, in at most three short paragraphs, and say which "
    "style guide a professional editor would consult for a definitive answer to such a question."
)
TOPICS = [
    "how rainbows form", "the history of the bicycle", "how to bake bread at home", "why the sky is blue",
    "how a compiler works", "the life of honey bees", "how to plan a trip to Japan", "how vaccines work",
    "the rules of chess", "how solar panels make electricity", "the causes of the French Revolution",
    "how to start running", "what a black hole is", "how to keep houseplants alive", "how the internet works",
    "why leaves change colour", "how to make a good cup of tea", "what DNA does", "how airplanes fly",
    "the history of the printing press", "how to learn a new language", "how volcanoes erupt",
    "how batteries store energy", "how to write a good essay", "what causes the seasons",
    "how a refrigerator works", "the story of the moon landing", "how to save money",
    "how earthquakes happen",
    "what photosynthesis is", "how to cook rice", "why we need sleep",
]  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd: list[str], url: str, ready_path: str, log: str, timeout: float = 300) -> subprocess.Popen:
    proc = subprocess.Popen(cmd, stdout=open(log, "wb"), stderr=subprocess.STDOUT)  # noqa: SIM115
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            sys.exit(f"{cmd[:4]} exited; see {log}")
        try:
            if httpx.get(url + ready_path, timeout=5).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    proc.kill()
    sys.exit(f"{cmd[:4]} not ready after {timeout} s; see {log}")


def metrics(url: str) -> dict[str, float]:
    try:
        text = httpx.get(url + "/metrics", timeout=10).text
    except httpx.HTTPError:
        return {}
    out = {}
    for line in text.splitlines():
        if line.startswith("edgellm_"):
            k, v = line.split()
            out[k] = float(v)
    return out


async def one(client: httpx.AsyncClient, url: str, system: str, question: str, max_tokens: int, seed: int):
    """One streamed chat request: (ttft seconds, content chunks streamed)."""
    body = {
        "model": "m",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
        "max_tokens": max_tokens,
        "temperature": 0.7,
        "seed": seed,
        "stream": True,
    }
    t0 = time.perf_counter()
    ttft, n = None, 0
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices") and chunk["choices"][0].get("delta", {}).get("content"):
                n += 1
                if ttft is None:
                    ttft = time.perf_counter() - t0
    return (ttft if ttft is not None else time.perf_counter() - t0), n


async def round_(
    url: str, conc: int, rounds: int, max_tokens: int, shared: bool, start_at: int, systems=(SYSTEM,)
):
    """conc clients, each sending `rounds` requests in sequence (client w with system prompt w mod
    len(systems)); returns (wall s, tokens, ttfts)."""
    limits = httpx.Limits(max_connections=conc + 4)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:

        async def worker(w: int):
            out = []
            for r in range(rounds):
                i = start_at + w * rounds + r
                system = systems[w % len(systems)] if shared else f"Session {uuid.uuid4().hex}. " + SYSTEM
                q = f"Please explain {TOPICS[i % len(TOPICS)]} in detail."
                out.append(await one(client, url, system, q, max_tokens, seed=i))
            return out

        t0 = time.perf_counter()
        res = await asyncio.gather(*(worker(w) for w in range(conc)))
        wall = time.perf_counter() - t0
    flat = [x for per in res for x in per]
    return wall, sum(n for _, n in flat), [t for t, _ in flat]


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def bench(name: str, url: str, args, edgellm: bool) -> dict:
    out = {}
    # warm-up: caches the shared system prompt; on edgellm also meets every batch size once (the native
    # backend captures a decode plan per batch size)
    asyncio.run(round_(url, max(args.concurrency) if edgellm else 1, 1, 16, True, 900))
    for conc in args.concurrency:
        m0 = metrics(url) if edgellm else {}
        wall, toks, ttfts = asyncio.run(round_(url, conc, args.rounds, args.max_tokens, True, conc * 100))
        m1 = metrics(url) if edgellm else {}
        hit = None
        if m1:
            looked = (
                m1["edgellm_prefix_cache_lookup_tokens_total"]
                - m0["edgellm_prefix_cache_lookup_tokens_total"]
            )
            hits = m1["edgellm_prefix_cache_hit_tokens_total"] - m0["edgellm_prefix_cache_hit_tokens_total"]
            hit = hits / looked if looked else 0.0
        out[conc] = dict(
            tps=toks / wall, p50=pct(ttfts, 50), p99=pct(ttfts, 99), hit=hit, toks=toks, wall=wall
        )
        print(f"  {name} c={conc}: {toks} tokens in {wall:.1f} s", file=sys.stderr, flush=True)
    for conc in args.uncached:
        _, _, ttfts = asyncio.run(round_(url, conc, args.rounds, args.max_tokens, False, conc * 100 + 50))
        out[f"nocache{conc}"] = dict(p50=pct(ttfts, 50), p99=pct(ttfts, 99))
    return out


def bench_ray(args, path) -> None:
    """2 replicas x 1 thread, 1 replica x 2 threads (both on Ray Serve), the plain server x 2 threads."""
    tmp = tempfile.mkdtemp(prefix="bench_serve_ray_")
    conc, systems = 8, (SYSTEM, SYSTEM_B)
    setups = [("ray 2 x 1", ["--ray", "--replicas", "2", "-t", "1"]),
              ("ray 1 x 2", ["--ray", "--replicas", "1", "-t", "2"]),
              ("plain 1 x 2", ["-t", "2"])]  # fmt: skip
    rows = []
    for name, extra in setups:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        cmd = [sys.executable, "-m", "edgellm", "serve", str(path), "--port", str(port), *extra]
        cmd += ["--backend", args.backend, "--parallel", str(conc), "-c", "2048"]
        log = os.path.join(tmp, name.replace(" ", "_") + ".log")
        proc = start(cmd, url, "/health", log, timeout=600)
        want = int(extra[extra.index("--replicas") + 1]) if "--ray" in extra else 0
        while want and httpx.get(url + "/health", timeout=10).json().get("replicas_ready", 0) < want:
            time.sleep(0.5)  # /health is 200 from the first ready replica on
        try:
            asyncio.run(round_(url, conc, 1, 16, True, 900, systems))  # warm-up: caches both prompts
            m0 = metrics(url)
            wall, toks, ttfts = asyncio.run(
                round_(url, conc, args.rounds, args.max_tokens, True, 100, systems)
            )
            m1 = metrics(url)
            if "--ray" in extra:  # replicas report once a second
                time.sleep(2.5)
                m1 = metrics(url)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(120)
        d = {k: m1.get(k, 0) - m0.get(k, 0) for k in m1}
        looked = d.get("edgellm_prefix_cache_lookup_tokens_total", 0)
        hit = d.get("edgellm_prefix_cache_hit_tokens_total", 0) / looked if looked else 0.0
        per = sorted(int(v) for k, v in d.items() if k.startswith("edgellm_requests_total{"))
        rows.append((name, toks / wall, pct(ttfts, 50), pct(ttfts, 99), hit, per))
        print(f"  {name}: {toks} tokens in {wall:.1f} s", file=sys.stderr, flush=True)
    print(f"\n{args.model}, {conc} clients, 2 system prompts (~200 tokens, nothing shared), "
          f"{args.rounds} requests per client, max_tokens {args.max_tokens}\n")  # fmt: skip
    print("| setup | gen tok/s | TTFT p50 (s) | TTFT p99 (s) | prefix hit rate | requests per replica |")
    print("|---|---|---|---|---|---|")
    for name, tps, p50, p99, hit, per in rows:
        print(f"| {name} | {tps:.1f} | {p50:.3f} | {p99:.3f} | {100 * hit:.0f}% | {per or '-'} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8, 16])
    ap.add_argument("--uncached", type=int, nargs="*", default=[1, 8], help="concurrency levels for TTFT "
                    "without a shared prefix")  # fmt: skip
    ap.add_argument("--rounds", type=int, default=2, help="requests per client")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--no-llama-cpp", action="store_true")
    ap.add_argument("--ray", action="store_true", help="edgellm serve --ray: 2 x 1 against 1 x 2 threads")
    args = ap.parse_args()

    from edgellm import store

    path = store.resolve(args.model)
    if args.ray:
        bench_ray(args, path)
        return
    tmp = tempfile.mkdtemp(prefix="bench_serve_")
    results = {}
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "edgellm", "serve", str(path), "--port", str(port), "-t", str(args.threads)]
    cmd += ["--backend", args.backend, "--parallel", str(max(args.concurrency)), "-c", "2048"]
    proc = start(cmd, url, "/health", os.path.join(tmp, "edgellm.log"))
    try:
        backend = httpx.get(url + "/v1/models").json()["data"][0]["meta"]["backend"]
        results["edgellm"] = bench(f"edgellm ({backend})", url, args, edgellm=True)
    finally:
        proc.terminate()
        proc.wait(60)
    if not args.no_llama_cpp:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        cmd = [
            sys.executable,
            "-m",
            "llama_cpp.server",
            "--model",
            str(path),
            "--n_threads",
            str(args.threads),
        ]
        cmd += ["--n_threads_batch", str(args.threads), "--n_ctx", "2048", "--port", str(port)]
        cmd += ["--interrupt_requests", "False", "--verbose", "False"]
        proc = start(cmd, url, "/v1/models", os.path.join(tmp, "llama_cpp.log"))
        try:
            results["llama-cpp-python"] = bench("llama-cpp-python", url, args, edgellm=False)
        finally:
            proc.terminate()
            proc.wait(60)
    report(results, args, backend)


def report(results: dict, args, backend: str) -> None:
    print(f"\n{args.model}, {args.threads} threads, {args.rounds} requests per client, max_tokens "
          f"{args.max_tokens}, ~200-token shared system prompt (edgellm backend: {backend})\n")  # fmt: skip
    print("| server | conc | gen tok/s | TTFT p50 (s) | TTFT p99 (s) | prefix hit rate |")
    print("|---|---|---|---|---|---|")
    for name, res in results.items():
        for conc in args.concurrency:
            r = res[conc]
            hit = f"{100 * r['hit']:.0f}%" if r["hit"] is not None else "-"
            print(f"| {name} | {conc} | {r['tps']:.1f} | {r['p50']:.3f} | {r['p99']:.3f} | {hit} |")
    print()
    e = results["edgellm"]
    if 1 in e and 8 in e:
        print(f"edgellm 8 streams / 1 stream: {e[8]['tps'] / e[1]['tps']:.2f}x (target >= 3x)")
    lc = results.get("llama-cpp-python")
    if lc and 8 in e:
        print(f"edgellm / llama-cpp-python at 8 streams: {e[8]['tps'] / lc[8]['tps']:.2f}x (target >= 3x)")
    for conc in args.uncached:
        for name, res in results.items():
            if conc in res and f"nocache{conc}" in res:
                ratio = res[conc]["p50"] / res[f"nocache{conc}"]["p50"]
                print(f"{name} TTFT p50 at {conc} streams, shared system prompt / unshared: "
                      f"{res[conc]['p50']:.3f} / {res[f'nocache{conc}']['p50']:.3f} s = {ratio:.2f}x "
                      f"(target <= 0.5x)")  # fmt: skip


if __name__ == "__main__":
    main()
