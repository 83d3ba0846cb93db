"""What llama.cpp's other samplers cost per request, and what scoring a prompt costs (echo / prompt_logprobs).

    python scripts/bench_samplers.py qwen2.5-coder-0.5b [--tokens 128] [--rounds 3] [--threads 2]

Each sampler variant generates `--tokens` from the same ~40-token prompt through `LLM.generate` (the whole
request, prompt included; rounds interleaved, medians printed). Then a ~1000-token prompt is read with one
token generated, plain and with every prompt token scored (GenRequest.prompt_logprobs), each round with a
distinct second token so that neither is served by the prefix cache.
"""

from __future__ import annotations

import argparse
import statistics
import time

from edgellm import LLM
from edgellm.engine import Engine, GenRequest

VARIANTS = {
    "plain (temp 0.8)": {},
    "dry 0.8 (last_n 64)": {"dry_multiplier": 0.8},
    "dry 0.8 (last_n -1)": {"dry_multiplier": 0.8, "dry_penalty_last_n": -1},
    "xtc 0.5 / 0.1": {"xtc_probability": 0.5, "xtc_threshold": 0.1},
    "top_n_sigma 1.0": {"top_n_sigma": 1.0},
    "dynatemp 0.5": {"dynatemp_range": 0.5},
    "mirostat 2": {"mirostat": 2},
    "mirostat 1": {"mirostat": 1},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    llm = LLM(a.model, n_ctx=2048, threads=a.threads)
    prompt = "Write a long story about a dragon who learns to cook. " * 3
    llm.generate(prompt, max_tokens=8, seed=1)  # warm up
    rates: dict[str, list[float]] = {k: [] for k in VARIANTS}
    for r in range(a.rounds):
        for k, kw in VARIANTS.items():
            t0 = time.perf_counter()
            c = llm.generate(prompt, max_tokens=a.tokens, seed=r, **kw)
            rates[k].append(len(c.tokens) / (time.perf_counter() - t0))
    for k, v in rates.items():
        print(f"{k:22s} {statistics.median(v):7.1f} tok/s (whole request, {a.tokens} tokens at most)")

    ids = llm.tokenize("The history of the river valley is long and varied. " * 90)[:1000]
    eng = Engine(llm.model, llm.tokenizer, n_ctx=2048)
    eng.start()
    times: dict[str, list[float]] = {"prompt read": [], "prompt scored (k=1)": []}
    try:
        for r in range(a.rounds):
            for i, k in enumerate(times):
                head = [ids[0], 1000 + 2 * r + i]  # a distinct second token: nothing from the prefix cache
                req = GenRequest(
                    head + ids[1:], llm.params(temperature=0), 1, prompt_logprobs=1 if i else None
                )
                t0 = time.perf_counter()
                list(eng.submit(req))
                times[k].append(time.perf_counter() - t0)
    finally:
        eng.shutdown()
    for k, v in times.items():
        print(f"{k:22s} {statistics.median(v) * 1000:7.0f} ms for {len(ids) + 1} prompt tokens, 1 generated")


if __name__ == "__main__":
    main()
