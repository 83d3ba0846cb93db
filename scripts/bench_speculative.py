"""Speculative decoding's speed: plain decoding vs prompt lookup (ngram-simple) vs a draft model, on an
editing prompt whose answer copies much of the prompt, on a free-writing prompt, and (where llguidance is
installed) on a JSON-editing prompt answered under a JSON constraint (constrained rows guess too); greedy,
so every variant must give the same text (checked).

    python scripts/bench_speculative.py [--target qwen2.5-coder-1.5b] [--draft qwen2.5-coder-0.5b] [-r 3]
        [--variants plain,ngram-simple,draft,both] [--draft-max 8]
"""

from __future__ import annotations

import argparse
import statistics

import edgellm
from edgellm.speculative import SpecConfig

CODE = """import json


def load_config(path):
    with open(path) as f:
        data = json.load(f)
    if "name" not in data:
        raise ValueError("config needs a name")
    return data


def save_config(path, data):
    with open(path, "w") as f:
        json.dump(data, f, indent=2)
"""
DOC = """{"name": "edgellm", "version": "2.1.0", "license": "MIT",
 "dependencies": ["numpy", "numba", "llvmlite", "cffi", "gguf", "typer", "jinja2"],
 "scripts": {"edgellm": "edgellm.cli:app"}, "authors": [{"name": "A. Person", "email": "a@example.com"}]}"""
PROMPTS = {
    "edit": "Add type hints to every function in this code. Reply with the whole code only.\n\n" + CODE,
    "free": "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "json": 'Add a field "python": ">=3.10" to this JSON and print all of it back:\n' + DOC,
}
CONSTRAINED = {"json": {"response_format": "json"}}  # the answer held to JSON (llguidance)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-n", "--n-predict", type=int, default=128)
    ap.add_argument("-r", "--repetitions", type=int, default=3)
    ap.add_argument("--draft-max", type=int, default=8)
    ap.add_argument("--variants", default="plain,ngram-simple,draft,both", help="plain first, then others")
    a = ap.parse_args()
    every = {
        "plain": None,
        "ngram-simple": SpecConfig(draft_max=a.draft_max),
        "draft": SpecConfig(kind="draft", model=a.draft, draft_max=a.draft_max),
        "both": SpecConfig(model=a.draft, draft_max=a.draft_max),  # prompt lookup, else the draft model
    }
    names = a.variants.split(",")
    if names[0] != "plain" or any(n not in every for n in names):
        ap.error(f"--variants: plain first, then any of {', '.join(every)}")
    variants = {n: every[n] for n in names}
    try:
        import llguidance  # noqa: F401
    except ImportError:
        del PROMPTS["json"]
    # every variant loaded once, then the runs interleaved (each repetition runs every variant on each
    # prompt in turn), so the machine's slow spells fall on all of them alike
    llms = {
        name: edgellm.LLM(a.target, threads=a.threads, n_ctx=2048, spec=spec)
        for name, spec in variants.items()
    }
    runs: dict[tuple[str, str], list] = {(n, k): [] for n in variants for k in PROMPTS}
    for _ in range(a.repetitions):
        for kind, prompt in PROMPTS.items():
            for name, llm in llms.items():
                llm.open_engine()  # a fresh prefix cache and fresh timings: every run computes its prompt
                msgs = [{"role": "user", "content": prompt}]
                out = llm.chat(msgs, max_tokens=a.n_predict, temperature=0, **CONSTRAINED.get(kind, {}))
                runs[name, kind].append(out)
    for name in variants:
        for kind in PROMPTS:
            outs = runs[name, kind]
            rate = statistics.median(o.timings.generated_tokens / o.timings.generation_s for o in outs)
            plain = runs["plain", kind]
            base = statistics.median(o.timings.generated_tokens / o.timings.generation_s for o in plain)
            same = all(o.text == plain[0].text for o in outs)
            drafted = sum(o.timings.draft_tokens for o in outs)
            kept = sum(o.timings.draft_accepted for o in outs)
            acc = f", {kept}/{drafted} guesses kept ({kept / drafted:.0%})" if drafted else ""
            print(f"{a.target} {kind:<5} {name:<13} {rate:6.1f} tok/s = {rate / base:.2f}x plain"
                  f"{acc}; same text: {same}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
