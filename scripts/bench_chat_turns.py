"""Time to first token of each turn of a long conversation through the Python API (edgellm.LLM.chat):
with the engine's prefix cache, turns 2 and 3 compute only their new tokens.

    python scripts/bench_chat_turns.py [--model smollm2-135m] [--backend native] [--tokens 2000] [-t N]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import edgellm

TEXT = Path(__file__).resolve().parent.parent / "tests/fixtures/text/licenses.txt"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--backend", default="native")
    ap.add_argument("--tokens", type=int, default=2000, help="size of the first message, in tokens")
    ap.add_argument("-t", "--threads", type=int, default=None)
    ap.add_argument("-n", type=int, default=32, help="tokens per answer")
    a = ap.parse_args()
    llm = edgellm.LLM(a.model, backend=a.backend, threads=a.threads, n_ctx=4096)
    ids = llm.tokenize(TEXT.read_text(encoding="utf-8"), add_special=False)[: a.tokens]
    doc = llm.detokenize(ids)
    messages = [{"role": "user", "content": "Here is a licence text:\n\n" + doc + "\n\nWhat is it about?"}]
    follow = ["Who wrote it?", "Summarize it in one sentence."]
    ttfts = []
    for turn in range(3):
        t0 = time.perf_counter()
        first = None
        text = []
        for c in llm.chat_stream(messages, max_tokens=a.n, temperature=0):
            if first is None and c.token is not None:
                first = time.perf_counter() - t0
            text.append(c.text)
        t = llm.last_timings
        ttfts.append(first or float("nan"))
        n = len(llm.chat_prompt(messages))
        print(
            f"turn {turn + 1}: prompt {n} tokens ({t.cached_tokens} from the cache, {t.prompt_tokens} "
            f"computed), first token after {ttfts[-1]:.3f} s, {t.generation_tps:.1f} tok/s"
        )
        messages.append({"role": "assistant", "content": "".join(text)})
        if turn < 2:
            messages.append({"role": "user", "content": follow[turn]})
    print(f"TTFT ratios to turn 1: turn 2 {ttfts[1] / ttfts[0]:.3f}x, turn 3 {ttfts[2] / ttfts[0]:.3f}x")


if __name__ == "__main__":
    main()
