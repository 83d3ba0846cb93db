"""`edgellm perplexity` and `edgellm tokenize`: evaluation and debugging commands."""

from __future__ import annotations

import json
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import typer

from edgellm.backends import names as backend_names

BACKEND_HELP = f"Compute backend: {', '.join(backend_names())} (auto: the fastest that runs here)."
MODEL_OPT_HELP = "Model, as llama.cpp spells it: same as MODEL."


# llama.cpp's -ctk / -ctv: how the KV cache stores K and V (edgellm.backends.paged_kv.CACHE_TYPES)
CACHE_OPTIONS = {
    "cache_type_k": lambda: typer.Option(
        "f16", "-ctk", "--cache-type-k", help="KV cache type for K: f16 or q8_0 (53% of f16's memory)."
    ),
    "cache_type_v": lambda: typer.Option(
        "f16", "-ctv", "--cache-type-v", help="KV cache type for V: f16 or q8_0."
    ),
}


def model_option():
    """`-m/--model`, llama.cpp's spelling of the positional MODEL (every command that takes one)."""
    return typer.Option(None, "-m", "--model", help=MODEL_OPT_HELP)


def perplexity(
    model: str | None = typer.Argument(None, help="Model alias or .gguf path (default: smollm2-135m)."),
    model_opt: str | None = model_option(),
    file: Path = typer.Option(..., "-f", "--file", help="Text file to score."),
    ctx: int = typer.Option(512, "-c", "--ctx-size", help="Tokens per chunk (llama-perplexity's -c)."),
    chunks: int | None = typer.Option(None, "--chunks", help="Score at most this many chunks."),
    backend: str = typer.Option("auto", "--backend", help=BACKEND_HELP),
    threads: int | None = typer.Option(None, "-t", "--threads"),
    save_logits: Path | None = typer.Option(None, "--save-logits", help="Save scored log-probs (.npz)."),
    kl_base: Path | None = typer.Option(None, "--kl-base", help="Compare with a --save-logits file by KL."),
    cache_type_k: str = CACHE_OPTIONS["cache_type_k"](),
    cache_type_v: str = CACHE_OPTIONS["cache_type_v"](),
) -> None:
    """Perplexity of a text, by llama.cpp's method (second half of each -c chunk)."""
    from edgellm.cli import pick_model
    from edgellm.llm import LLM
    from edgellm.perplexity import kl_divergence
    from edgellm.perplexity import perplexity as ppl_of

    llm = LLM(
        pick_model(model, model_opt),
        backend=backend,
        threads=threads,
        n_ctx=ctx,
        log=lambda m: print(m, file=sys.stderr),
        cache_type_k=cache_type_k,
        cache_type_v=cache_type_v,
    )
    text = file.read_text(encoding="utf-8")

    def progress(i: int, n: int, ppl: float) -> None:
        print(f"\r[{i}/{n}] running PPL = {ppl:.4f}", end="" if i < n else "\n", file=sys.stderr, flush=True)

    keep = save_logits is not None or kl_base is not None
    r = ppl_of(llm, text, ctx, max_chunks=chunks, keep_log_probs=keep, progress=progress)
    print(
        f"Final estimate: PPL = {r.ppl:.4f} +/- {r.ppl_err:.5f} ({r.n_chunks} chunks of {ctx}, "
        f"{r.n_scored} tokens scored)"
    )
    if save_logits is not None:
        with open(save_logits, "wb") as f:
            np.savez_compressed(f, log_probs=r.log_probs, tokens=r.tokens)
        print(f"saved log-probs of {r.n_scored} positions to {save_logits}", file=sys.stderr)
    if kl_base is not None:
        base = np.load(kl_base)
        if not np.array_equal(base["tokens"], r.tokens):
            raise ValueError(f"{kl_base} scored different tokens (another text, model vocabulary or -c)")
        k = kl_divergence(base["log_probs"], r.log_probs)
        print(
            f"KL(base || this): mean {k.mean_kl:.6f}, max {k.max_kl:.6f}; top-1 agreement "
            f"{100 * k.top1_agreement:.2f}%; confident disagreements (> 0.5 nats): "
            f"{k.confident_disagreements}"
        )


def tokenize(
    model: str | None = typer.Argument(None, help="Model alias or .gguf path (or -m, then TEXT alone)."),
    text: str | None = typer.Argument(None, help="Text to tokenize."),
    model_opt: str | None = model_option(),
    ids_only: bool = typer.Option(False, "--ids-only", help="Print only the ids, as a JSON list."),
    no_bos: bool = typer.Option(False, "--no-bos", help="Do not add BOS/EOS even if the model does."),
    parse_special: bool = typer.Option(False, "--parse-special", help="Turn special-token text into ids."),
) -> None:
    """Print the token ids (and pieces) of a text."""
    from edgellm import store
    from edgellm.cli import UsageError, pick_model
    from edgellm.gguf import ModelFile
    from edgellm.tokenizer import Tokenizer, format_tokens

    if text is None and model_opt is not None:  # `tokenize -m MODEL TEXT`: the one positional is the text
        model, text = None, model
    if text is None:
        raise UsageError("missing TEXT: edgellm tokenize MODEL TEXT (or -m MODEL TEXT)")
    mf = ModelFile(store.resolve(pick_model(model, model_opt)))
    tok = Tokenizer.from_gguf(mf)
    ids = tok.encode(text, add_special=not no_bos, parse_special=parse_special)
    if ids_only:
        print(json.dumps(ids))
        return
    for i, piece in format_tokens(tok, ids):
        print(f"{i:>8} {piece}")
    print(f"{len(ids)} tokens", file=sys.stderr)


def bench(
    model: str | None = typer.Argument(None, help="Model alias or .gguf path (default: smollm2-135m)."),
    model_opt: str | None = model_option(),
    n_prompt: int = typer.Option(128, "-p", "--n-prompt", min=0, help="Prompt tokens (pp test)."),
    n_gen: int = typer.Option(64, "-n", "--n-gen", min=0, help="Generated tokens (tg test)."),
    n_depth: int = typer.Option(
        0, "-d", "--n-depth", min=0, help="Tokens already in the cache before each test (llama-bench's -d)."
    ),
    ubatch: int = typer.Option(
        512, "-ub", "--ubatch-size", min=1, help="Most prompt tokens per forward (llama-bench's -ub)."
    ),
    reps: int = typer.Option(5, "-r", "--repetitions", min=1, help="Repetitions; medians are reported."),
    threads: int | None = typer.Option(None, "-t", "--threads"),
    backend: str = typer.Option("auto", "--backend", help=BACKEND_HELP),
    ctx: int | None = typer.Option(None, "-c", "--ctx-size", help="KV cache size (default: -d + -p + -n)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    cache_type_k: str = CACHE_OPTIONS["cache_type_k"](),
    cache_type_v: str = CACHE_OPTIONS["cache_type_v"](),
) -> None:
    """Prompt and generation speed, time to first token and peak memory, like llama-bench."""
    from edgellm.bench import format_result, run_bench
    from edgellm.cli import pick_model

    with _progress_line() as progress:
        r = run_bench(
            pick_model(model, model_opt),
            backend=backend,
            threads=threads,
            n_prompt=n_prompt,
            n_gen=n_gen,
            reps=reps,
            n_ctx=ctx,
            n_depth=n_depth,
            log=lambda m: print(m, file=sys.stderr),
            progress=progress,
            cache_types=(cache_type_k, cache_type_v),
            ubatch=ubatch,
        )
    print(json.dumps(r.as_dict()) if as_json else format_result(r))


@contextmanager
def _progress_line():
    """A transient spinner line on stderr saying what bench is doing, only when stderr is a terminal
    (a log or a pipe gets nothing); yields the callback that updates it, or None."""
    if not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console

    with Console(stderr=True).status("bench: loading", spinner="dots") as status:
        yield lambda what: status.update(f"bench: {what}")
