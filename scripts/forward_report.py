"""Print the forward-pass figures against llama.cpp's fixtures: teacher-forced KL, confident disagreements,
top-1 agreement (with llama.cpp's own flash-attention on/off noise beside them) and whole-text perplexity.

    python scripts/forward_report.py [--backend reference] [smollm2-135m gemma3-270m]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from forward_checks import chunk_perplexity, load_fixture, teacher_forced_kl  # noqa: E402

import edgellm  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="*", default=["smollm2-135m", "gemma3-270m"])
    ap.add_argument("--backend", default="reference")
    args = ap.parse_args()
    for alias in args.models:
        llm = edgellm.LLM(alias, backend=args.backend, n_ctx=1024)
        fx = load_fixture(alias)
        kl, confident, agree = teacher_forced_kl(llm, alias)
        t = time.perf_counter()
        ours, ref = chunk_perplexity(llm, fx, fx["perplexity"]["chunks"])
        noise = fx["self_noise"]
        print(f"{alias} [{args.backend}]: KL {kl:.4f} (llama.cpp FA on/off {noise['mean_kl']:.4f}), "
              f"confident disagreements {confident} ({noise['confident_disagreements']}), top-1 agreement "
              f"{agree:.3f} ({noise['top1_agreement']:.3f}); PPL {ours:.3f} vs llama.cpp {ref:.3f} "
              f"({100 * (ours / ref - 1):+.2f}%, {time.perf_counter() - t:.0f} s)")  # fmt: skip


if __name__ == "__main__":
    main()
