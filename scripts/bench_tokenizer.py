"""Encode throughput, edgellm vs llama.cpp's tokenizer, side by side on the same machine and texts.

    python scripts/bench_tokenizer.py [--runs 5] [MODEL.gguf ...]

Texts: English prose (the license texts in /usr/share/common-licenses, ~250 kB) and code (Python standard
library modules, ~250 kB). llama.cpp runs through llama-cpp-python (vocab_only) with one llama_tokenize
call per text; edgellm through Tokenizer.encode, its word cache emptied before every run (cold: as for a
new prompt of unseen text) and also kept (warm: the same text again). Reports MB/s, medians of --runs,
and edgellm / llama.cpp ratios.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import sysconfig
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from edgellm.gguf import ModelFile  # noqa: E402
from edgellm.tokenizer import Tokenizer  # noqa: E402

DEFAULT_MODELS = [
    Path("/tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf"),
    Path("/tmp/models/gemma-3-270m-q4_k_m.gguf"),
]
TARGET = 250_000  # bytes of each text


def _collect(paths: list[Path]) -> str:
    parts, n = [], 0
    for p in paths:
        if n >= TARGET:
            break
        try:
            t = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        parts.append(t)
        n += len(t.encode())
    return "\n".join(parts)


def texts() -> dict[str, str]:
    prose = _collect(sorted(Path("/usr/share/common-licenses").glob("*")))
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    modules = [
        "argparse",
        "typing",
        "pathlib",
        "inspect",
        "dataclasses",
        "functools",
        "subprocess",
        "tarfile",
    ]
    code = _collect([stdlib / f"{m}.py" for m in modules])
    return {"prose": prose, "code": code}


def _median_time(fn, runs: int, setup=None) -> float:
    ts = []
    for _ in range(runs):
        if setup:
            setup()
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def bench_model(path: Path, corpus: dict[str, str], runs: int) -> list[tuple]:
    from llama_cpp import Llama

    sys.path.insert(0, str(ROOT / "scripts"))
    from make_tokenizer_fixtures import ll_tokenize

    t = time.perf_counter()
    tok = Tokenizer.from_gguf(ModelFile(path))
    tok.encode("warm up the vocabulary")
    load_s = time.perf_counter() - t
    llm = Llama(str(path), vocab_only=True, verbose=False)
    vocab = llm._model.vocab
    rows = []
    for kind, text in corpus.items():
        mb = len(text.encode()) / 1e6
        data = text.encode()
        ref = ll_tokenize(vocab, data, False, False)
        assert tok.encode(text, add_special=False) == ref, f"ids differ from llama.cpp on {kind}"
        t_ll = _median_time(lambda: ll_tokenize(vocab, data, False, False), runs)  # noqa: B023
        t_cold = _median_time(
            lambda: tok.encode(text, add_special=False),  # noqa: B023
            runs,
            setup=tok._model._cache.clear,
        )
        t_warm = _median_time(lambda: tok.encode(text, add_special=False), runs)  # noqa: B023
        rows.append((path.name, kind, len(ref), mb / t_ll, mb / t_cold, mb / t_warm, load_s))
    llm.close()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="*", type=Path, default=DEFAULT_MODELS)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    corpus = texts()
    print(", ".join(f"{k}: {len(v.encode()) / 1e3:.0f} kB" for k, v in corpus.items()))
    print(f"{'model':38} {'text':6} {'tokens':>7} {'llama.cpp':>10} {'edgellm cold':>13} {'warm':>8} "
          f"{'cold/llama':>10} {'warm/llama':>10}")  # fmt: skip
    for path in args.models:
        for name, kind, n, ll, cold, warm, load_s in bench_model(path, corpus, args.runs):
            print(f"{name:38} {kind:6} {n:7d} {ll:8.2f}MB/s {cold:9.2f}MB/s {warm:6.2f}MB/s "
                  f"{cold / ll:9.2f}x {warm / ll:9.2f}x   (vocab load {load_s:.2f}s)")  # fmt: skip


if __name__ == "__main__":
    main()
