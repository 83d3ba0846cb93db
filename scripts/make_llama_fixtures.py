"""Make forward-pass fixtures from llama.cpp (via llama-cpp-python) for tests/test_forward_*.py.

For a model it records, with llama.cpp's own tokenization:
  - greedy continuations of a few prompts (64 tokens each) with the top-1/top-2 logit margin at every step;
  - teacher-forced log-probs over a >= 512-token text: the top-K ids and log-probs per position (K=256
    covers all but a sliver of the probability mass; the test folds the rest into one "other" bin);
  - perplexity of the license texts by llama-perplexity's method (chunks of -c, second half scored).

Usage (needs `pip install llama-cpp-python`; not needed by the tests):
    python scripts/make_llama_fixtures.py smollm2-135m
    python scripts/make_llama_fixtures.py gemma3-270m
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures" / "forward"
TEXT = ROOT / "tests" / "fixtures" / "text" / "licenses.txt"  # GPL-3 + Apache-2.0, as in DESIGN.md
PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):\n",
    "The three primary colors are",
    "Water boils at a temperature of",
    "In 1969, Neil Armstrong",
]
N_GEN = 64
N_CHAT = 32
CHAT = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
TOPK = 256
PPL_CTX = 256


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def main(alias: str) -> None:
    import llama_cpp

    sys.path.insert(0, str(ROOT))
    from edgellm import store

    path = store.resolve(alias)

    def open_llama(flash_attn: bool) -> llama_cpp.Llama:
        return llama_cpp.Llama(str(path), n_ctx=1024, n_batch=1024, n_ubatch=1024, n_threads=2,
                               logits_all=True, flash_attn=flash_attn, verbose=False)  # fmt: skip

    llm = open_llama(flash_attn=False)
    add_bos = llama_cpp.llama_vocab_get_add_bos(llama_cpp.llama_model_get_vocab(llm.model))
    out: dict = {
        "model": alias,
        "llama_cpp_version": llama_cpp.__version__,
        "flash_attn": False,
        "kv_type": "f16",
        "greedy": [],
    }

    def greedy(ids: list[int], n: int) -> tuple[list[int], list[float]]:
        llm.reset()
        llm.eval(ids)
        gen, margins = [], []
        for _ in range(n):
            logits = np.array(llm.scores[llm.n_tokens - 1], np.float32)
            top2 = np.argsort(-logits)[:2]
            gen.append(int(top2[0]))
            margins.append(round(float(logits[top2[0]] - logits[top2[1]]), 5))
            llm.eval([gen[-1]])
        return gen, margins

    for prompt in PROMPTS:
        ids = llm.tokenize(prompt.encode(), add_bos=True, special=False)
        gen, margins = greedy(ids, N_GEN)
        out["greedy"].append({"prompt": prompt, "prompt_ids": ids, "ids": gen, "margins": margins})
        print(f"{prompt!r}: {llm.detokenize(gen).decode(errors='replace')!r}", file=sys.stderr)

    # one-turn chat: the prompt as edgellm's template renders it (tests/test_chat.py pins that rendering
    # against llama.cpp's), tokenized and continued greedily by llama.cpp
    from edgellm.chat import ChatTemplate
    from edgellm.gguf import ModelFile

    tmpl = ChatTemplate.from_gguf(ModelFile(path))
    text = tmpl.render(CHAT, add_generation_prompt=True, strip_bos=bool(add_bos))
    ids = llm.tokenize(text.encode(), add_bos=True, special=True)
    gen, margins = greedy(ids, N_CHAT)
    out["chat"] = {"messages": CHAT, "prompt_ids": ids, "ids": gen, "margins": margins, "template": tmpl.name}
    print(f"chat: {llm.detokenize(gen).decode(errors='replace')!r}", file=sys.stderr)

    # teacher-forced: the first 600 tokens of the license text, one pass
    text = TEXT.read_text(encoding="utf-8")
    toks = llm.tokenize(text.encode(), add_bos=True, special=False)[:600]
    llm.reset()
    llm.eval(toks)
    lp = log_softmax(np.array(llm.scores[: len(toks)], np.float32))
    top = np.argsort(-lp, axis=1)[:, :TOPK]
    top_lp = np.take_along_axis(lp, top, axis=1)
    np.savez_compressed(
        FIX / f"{alias}-teacher.npz",
        tokens=np.array(toks, np.int32),
        top_ids=top.astype(np.int32),
        top_logprobs=top_lp.astype(np.float32),
    )
    covered = np.exp(top_lp).sum(axis=1)
    print(f"teacher-forced: {len(toks)} tokens, top-{TOPK} mass min {covered.min():.5f}", file=sys.stderr)

    # llama.cpp against itself: flash attention on vs off, the noise floor the tests hold edgellm to
    fa = open_llama(flash_attn=True)
    fa.eval(toks)
    lp_fa = log_softmax(np.array(fa.scores[: len(toks)], np.float32))
    del fa
    kl = (np.exp(lp) * (lp - lp_fa)).sum(axis=1)
    rows = np.arange(len(toks))
    lead = lp[rows, lp.argmax(1)] - lp[rows, lp_fa.argmax(1)]
    out["self_noise"] = {
        "what": "llama.cpp flash attention on vs off, teacher-forced on the same tokens",
        "mean_kl": float(kl.mean()),
        "confident_disagreements": int((lead > 0.5).sum()),
        "top1_agreement": float((lp.argmax(1) == lp_fa.argmax(1)).mean()),
    }
    print(f"self-noise: {out['self_noise']}", file=sys.stderr)

    # perplexity, llama-perplexity's method (tools/perplexity/perplexity.cpp)
    all_toks = llm.tokenize(text.encode(), add_bos=True, special=False)
    n_chunks = len(all_toks) // PPL_CTX
    first = PPL_CTX // 2
    nll, chunk_nll = [], []
    for i in range(n_chunks):
        chunk = list(all_toks[i * PPL_CTX : (i + 1) * PPL_CTX])
        if add_bos:
            chunk[0] = llm.token_bos()
        llm.reset()
        llm.eval(chunk)
        lpc = log_softmax(np.array(llm.scores[first : PPL_CTX - 1], np.float32))
        tgt = all_toks[i * PPL_CTX + first + 1 : (i + 1) * PPL_CTX]
        c_nll = -lpc[np.arange(len(tgt)), tgt]
        nll.extend(c_nll)
        chunk_nll.append(float(c_nll.mean()))
    ppl = math.exp(float(np.mean(nll)))
    out["perplexity"] = {
        "ctx": PPL_CTX,
        "chunks": n_chunks,
        "ppl": ppl,
        "text": TEXT.name,
        "chunk_mean_nll": chunk_nll,
    }
    print(f"perplexity -c {PPL_CTX}: {ppl:.4f} over {n_chunks} chunks", file=sys.stderr)
    (FIX / f"{alias}.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    FIX.mkdir(parents=True, exist_ok=True)
    main(sys.argv[1] if len(sys.argv) > 1 else "smollm2-135m")
