"""Greedy text of one backend against another on a chat prompt, token for token, with the top-1/top-2
margins where they part (a near-tie is a margin below tests/forward_checks.py's NEAR_TIE):

    python scripts/greedy_vs_backend.py [--model smollm2-135m] [--backends native vulkan] [-n 32] PROMPT
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("prompt", nargs="?", default="The capital of France is")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--backends", nargs=2, default=["native", "vulkan"])
    ap.add_argument("-n", type=int, default=32)
    a = ap.parse_args()
    sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
    from forward_checks import NEAR_TIE, greedy

    import edgellm
    from edgellm.store import resolve

    runs = []
    for b in a.backends:
        llm = edgellm.LLM(resolve(a.model), backend=b, n_ctx=a.n + 512)
        ids = llm.chat_prompt([{"role": "user", "content": a.prompt}])
        runs.append((b, llm, *greedy(llm, ids, a.n)))
    (b0, llm, ids0, m0), (b1, _, ids1, m1) = runs
    for b, _, ids, _ in runs:
        print(f"{b}: {llm.detokenize(ids)!r}")
    i = next((i for i, (x, y) in enumerate(zip(ids0, ids1)) if x != y), None)
    if i is None:
        print(f"identical for {a.n} tokens")
        return 0
    tie = "a near-tie" if m0[i] < NEAR_TIE else "NOT a near-tie"
    print(f"first difference at token {i}: {b0} {ids0[i]} (margin {m0[i]:.4f}), {b1} {ids1[i]} (margin "
          f"{m1[i]:.4f}): {tie} (NEAR_TIE {NEAR_TIE})")  # fmt: skip
    return 0 if m0[i] < NEAR_TIE else 1


if __name__ == "__main__":
    sys.exit(main())
