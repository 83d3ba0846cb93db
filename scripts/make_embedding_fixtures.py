"""Embedding fixtures from llama.cpp's `llama-embedding` (tests/test_embeddings.py compares against them).

    python scripts/make_embedding_fixtures.py --bin /path/to/llama.cpp/build/bin [--model smollm2-135m]

Runs `llama-embedding --pooling P --embd-normalize 2 --embd-output-format json` for each pooling and
prompt and writes tests/fixtures/embeddings/<model stem>.json: {pooling: {prompt: [floats]}}.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from pathlib import Path

from edgellm import store

PROMPTS = ["The quick brown fox jumps over the lazy dog.", "Paris is the capital of France."]
POOLINGS = ["last", "mean", "cls"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True, help="llama.cpp's build/bin (with llama-embedding)")
    ap.add_argument("--model", default="smollm2-135m")
    a = ap.parse_args()
    model = store.resolve(a.model)
    out: dict[str, dict[str, list[float]]] = {}
    env = {**os.environ, "LD_LIBRARY_PATH": a.bin}
    for pooling in POOLINGS:
        out[pooling] = {}
        for prompt in PROMPTS:
            cmd = [
                f"{a.bin}/llama-embedding",
                "-m",
                str(model),
                "--pooling",
                pooling,
                "--embd-normalize",
                "2",
                "--embd-output-format",
                "json",
                "-t",
                "2",
                "-p",
                prompt,
            ]
            r = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
            out[pooling][prompt] = [round(x, 7) for x in json.loads(r.stdout)["data"][0]["embedding"]]
    path = Path(__file__).parent.parent / "tests" / "fixtures" / "embeddings" / f"{model.stem}.json"
    path.write_text(json.dumps(out) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
