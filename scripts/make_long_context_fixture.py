"""A long-context fixture from llama.cpp (through llama-cpp-python): the next-token distribution after a
4,096-token prompt (the license texts), for tests/test_forward.py's long-context check.

    LLAMA_CPP_LIB_PATH=... python scripts/make_long_context_fixture.py qwen2.5-coder-0.5b

Writes tests/fixtures/forward/<alias>-long.json: the prompt's token ids (llama.cpp's tokenization) and the
top-64 log-probabilities at its last position.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
TEXT = ROOT / "tests" / "fixtures" / "text" / "licenses.txt"
N_PROMPT = 4096
TOPK = 64


def main(alias: str) -> None:
    import llama_cpp

    sys.path.insert(0, str(ROOT))
    from edgellm import store

    path = store.resolve(alias)
    llm = llama_cpp.Llama(str(path), n_ctx=N_PROMPT + 16, n_batch=512, n_threads=2, logits_all=True,
                          verbose=False)  # fmt: skip
    ids = llm.tokenize(TEXT.read_bytes(), add_bos=True)[:N_PROMPT]
    assert len(ids) == N_PROMPT, len(ids)
    llm.eval(ids)
    x = np.asarray(llm.scores[len(ids) - 1], np.float64)
    lp = x - x.max() - np.log(np.exp(x - x.max()).sum())
    top = np.argsort(-lp)[:TOPK]
    out = {
        "alias": alias,
        "ids": [int(t) for t in ids],
        "top_ids": top.tolist(),
        "top_logprobs": lp[top].tolist(),
    }
    dest = ROOT / "tests" / "fixtures" / "forward" / f"{alias}-long.json"
    dest.write_text(json.dumps(out) + "\n")
    print(f"wrote {dest}: top-1 {int(top[0])} at {lp[top[0]]:.4f}")


if __name__ == "__main__":
    main(sys.argv[1])
