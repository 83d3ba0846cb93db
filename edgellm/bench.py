"""`edgellm bench`: prompt and generation speed of one model on one backend, measured like llama-bench.

pp: a -p token prompt in forwards of at most -ub tokens (llama-bench's ubatch, 512 by default; logits for
    its last token only), tokens/s; a sliding-window cache takes at most the tokens it holds per forward
    (512 for gemma3).
tg: -n single-token decode steps after a prompt, each a forward pass and a greedy pick, tokens/s
    (llama-bench's tg starts from an empty cache; here the steps follow the -p prompt, or one token
    when -p is 0, which costs the same within noise at these lengths).
ttft: time to the first generated token of a -p token prompt: prefill plus the first pick.
-d (depth, llama-bench's -d): each repetition first fills the cache with that many tokens, untimed; the
    pp prompt then follows them and the tg steps follow both (llama-bench's `-d 2048 -n 32` is
    `-d 2048 -p 0 -n 32` here).
Each repetition starts from a fresh cache. Warm-up (kernel compile or cache load, one untimed prompt and
step) happens before any timed region. Token ids are fixed pseudo-random ids: no tokenizer time.
Peak RSS is the process high-water mark (VmHWM); `rss_beyond_model_mb` subtracts the part of it that is
the mmapped model file (RssFile at the end of the run, which is at least the model pages touched) and
the weights the backend repacked at load into memory of their own (their file pages are let go).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

UBATCH = 512  # llama-bench's default -ub


@dataclass
class BenchResult:
    model: str
    backend: str
    threads: int
    n_prompt: int
    n_gen: int
    reps: int
    load_s: float
    n_depth: int = 0
    n_ubatch: int = 0  # the most tokens a prompt forward took (llama-bench's -ub)
    pp_tok_s: float | None = None
    tg_tok_s: float | None = None
    ttft_s: float | None = None
    peak_rss_mb: float | None = None
    rss_beyond_model_mb: float | None = None
    model_bytes: int = 0
    weight_bytes_per_token: int = 0
    cache_types: str = "f16/f16"  # K/V cache types (-ctk / -ctv)
    kv_cache_bytes: int = 0  # the bench's KV cache (its context of positions)
    runs: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


def proc_status_mb(key: str) -> float | None:
    """A kB field of /proc/self/status (VmHWM, VmRSS, RssAnon, RssFile) in MiB; None off Linux."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def weight_bytes_per_token(model) -> int:
    """Bytes of weights one decode step reads: every bound matrix once (the output matrix too, which is
    the token embedding when tied), but only one row of an untied embedding."""
    seen: dict[int, int] = {}

    def walk(obj) -> None:
        qt = getattr(obj, "qt", None)
        if qt is not None:
            seen[id(qt)] = int(qt.data.nbytes)
        elif isinstance(obj, np.ndarray) or hasattr(obj, "mem"):  # a host or a device vector
            seen[id(obj)] = int(obj.nbytes)

    for layer in model.layers:
        for v in vars(layer).values():
            walk(v)
    walk(model.output)
    walk(model.output_norm)
    if model.output is not model.tok_embd:
        qt = model.tok_embd.qt
        seen[id(qt)] = int(qt.data.nbytes) // max(1, int(qt.data.shape[0]))
    return sum(seen.values())


def _ids(n_vocab: int, n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(10, n_vocab - 10, max(n, 1)).astype(np.int64)


def _prefill(model, kv, ids: np.ndarray, seq: int = 0, start: int = 0, ubatch: int = UBATCH) -> np.ndarray:
    """The prompt (at positions start ..) in consecutive forwards of at most `ubatch` tokens, as
    llama-bench's ubatches, or fewer where a sliding-window cache takes fewer tokens of a sequence per
    forward (gemma3: 512). A forward's scratch grows with its tokens: the ubatch bounds the peak memory."""
    n = len(ids)
    step = max(1, min(ubatch, kv.window_chunk if getattr(kv, "ring_layers", None) else n))
    for s in range(0, n, step):
        e = min(n, s + step)
        pos = np.arange(start + s, start + e)
        logits = model.forward(
            ids[s:e], pos, np.full(e - s, seq, np.int64), kv, logits_rows=np.array([e - s - 1])
        )
    return logits


def run_bench(
    model: str | None,
    *,
    backend: str = "auto",
    threads: int | None = None,
    n_prompt: int = 128,
    n_gen: int = 64,
    reps: int = 5,
    n_ctx: int | None = None,
    n_depth: int = 0,
    log=None,
    progress: Callable[[str], None] | None = None,
    cache_types: tuple[str, str] = ("f16", "f16"),
    ubatch: int = UBATCH,
) -> BenchResult:
    """Measure one model; `progress`, if given, is told each stage as it starts ("warm-up", "pp128 2/5")."""
    from edgellm.llm import LLM

    def stage(what: str) -> None:
        if progress is not None:
            progress(what)

    if ubatch <= 0:
        raise ValueError(f"the ubatch must be positive, got {ubatch}")
    ctx = n_ctx or (n_depth + n_prompt + n_gen + 8)
    if n_depth + n_prompt + n_gen + 1 > ctx:
        what = f"-d {n_depth}, -p {n_prompt} and -n {n_gen}" if n_depth else f"-p {n_prompt} and -n {n_gen}"
        raise ValueError(f"{what} do not fit a context of {ctx}")
    llm = LLM(
        model, backend=backend, threads=threads, n_ctx=ctx, log=log, cache_type_k=cache_types[0],
        cache_type_v=cache_types[1],
    )  # fmt: skip
    m = llm.model
    stage("warm-up")
    if hasattr(llm.backend, "warmup"):
        llm.backend.warmup()
    n_vocab = m.config.n_vocab
    prompt = _ids(n_vocab, n_prompt)
    one = np.zeros(1, np.int64)

    kv = m.new_kv_cache(ctx, 1)  # one cache, reused: every repetition overwrites from position 0
    # warm-up: one prompt and a few steps, untimed (compiles or loads kernels, captures decode plans)
    _prefill(m, kv, prompt[: min(len(prompt), 8)])
    for i in range(3):
        m.decode_step(prompt[:1], np.array([8 + i]), one, kv)

    depth = _ids(n_vocab, n_depth, seed=1)[:n_depth]
    pp, tg, ttft = [], [], []
    for rep in range(reps):
        if n_depth > 0:
            stage(f"depth {n_depth} {rep + 1}/{reps}")
            _prefill(m, kv, depth, ubatch=ubatch)
        if n_prompt > 0:
            stage(f"pp{n_prompt} {rep + 1}/{reps}")
            t0 = time.perf_counter()
            logits = _prefill(m, kv, prompt, start=n_depth, ubatch=ubatch)
            tok = int(np.argmax(logits[-1]))
            dt = time.perf_counter() - t0
            pp.append(n_prompt / dt)
            ttft.append(dt)
        else:
            tok = int(prompt[0])
        if n_gen > 0:
            stage(f"tg{n_gen} {rep + 1}/{reps}")
            start = n_depth + max(n_prompt, 1)
            tok_arr = np.array([tok], np.int64)
            t0 = time.perf_counter()
            for i in range(n_gen):
                logits = m.decode_step(tok_arr, np.array([start + i]), one, kv)
                tok_arr[0] = int(np.argmax(logits[0]))
            tg.append(n_gen / (time.perf_counter() - t0))

    peak = proc_status_mb("VmHWM")
    rss_file = proc_status_mb("RssFile")
    model_bytes = Path(llm.path).stat().st_size
    beyond = None
    if peak is not None and rss_file is not None:  # weights repacked at load are the model too
        repacked = getattr(llm.backend, "repacked_bytes", 0) / 2**20
        beyond = peak - min(rss_file + repacked, model_bytes / 2**20 + repacked)
    return BenchResult(
        model=str(llm.path),
        backend=llm.backend.name,
        threads=int(getattr(llm.backend, "threads", None) or 1),
        n_prompt=n_prompt,
        n_gen=n_gen,
        reps=reps,
        load_s=llm.load_s,
        n_depth=n_depth,
        n_ubatch=ubatch,
        pp_tok_s=statistics.median(pp) if pp else None,
        tg_tok_s=statistics.median(tg) if tg else None,
        ttft_s=statistics.median(ttft) if ttft else None,
        peak_rss_mb=peak,
        rss_beyond_model_mb=beyond,
        model_bytes=model_bytes,
        weight_bytes_per_token=weight_bytes_per_token(m),
        cache_types=f"{m.cache_type_k}/{m.cache_type_v}",
        kv_cache_bytes=int(kv.nbytes),
        runs={"pp_tok_s": pp, "tg_tok_s": tg, "ttft_s": ttft},
    )


def format_result(r: BenchResult) -> str:
    def f(v, fmt):
        return "-" if v is None else format(v, fmt)

    name = Path(r.model).name
    lines = [
        "| model | backend | threads | test | t/s |",
        "|---|---|---|---|---|",
    ]
    at = f" @ d{r.n_depth}" if r.n_depth else ""  # (llama-bench writes a test at depth so)
    if r.pp_tok_s is not None:
        lines.append(f"| {name} | {r.backend} | {r.threads} | pp{r.n_prompt}{at} | {r.pp_tok_s:.2f} |")
    if r.tg_tok_s is not None:
        lines.append(f"| {name} | {r.backend} | {r.threads} | tg{r.n_gen}{at} | {r.tg_tok_s:.2f} |")
    lines.append(
        f"load {r.load_s * 1e3:.0f} ms · time to first token (pp{r.n_prompt}) {f(r.ttft_s, '.3f')} s · "
        f"peak RSS {f(r.peak_rss_mb, '.0f')} MiB ({f(r.rss_beyond_model_mb, '.0f')} MiB beyond the model) · "
        f"KV cache {r.cache_types} {r.kv_cache_bytes / 2**20:.1f} MiB · medians of {r.reps}"
    )
    if r.tg_tok_s:
        gbs = r.tg_tok_s * r.weight_bytes_per_token / 1e9
        lines.append(
            f"generation reads {r.weight_bytes_per_token / 2**20:.1f} MiB of weights per token: "
            f"{gbs:.1f} GB/s"
        )
    return "\n".join(lines)
