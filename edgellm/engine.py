"""The serving engine: continuous batching over a paged KV cache with prefix caching.

Requests enter a queue; one engine thread (or a caller, through `step()`) runs steps. Each step the
scheduler (edgellm/scheduler.py) plans one flat batch: one token for every decoding sequence plus chunks of
admitted prompts (at most `max_batch_tokens` in all, so a long prompt delays running streams by one chunk
at most); the ModelRunner below runs one forward over it and samples every row that needs a token in one
batched-sampler pass; the Engine applies the results: streams the text out, ends finished sequences (they
leave at once and free their blocks) and lets the scheduler commit full blocks to the prefix cache.
Promises: a sequence's tokens do not depend on what it is batched with (on a backend whose ops are
row-wise, like numba); a failing request (sampler error, bad input found late) fails alone; `cancel()`
stops a sequence within one step.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import itertools
import math
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from edgellm import reasoning, speculative, structured
from edgellm.generate import IndentLimit, StopMatcher
from edgellm.kvcache import PagedKV
from edgellm.sampler import RowSampler, Sampler, SamplingParams, vocab_dry_breakers
from edgellm.scheduler import Scheduled, Scheduler, SeqState, StepPlan

DEFAULT_BLOCK_SIZE = 16
DEFAULT_BATCH_TOKENS = 256


class RequestRejected(ValueError):
    """A request that can never run here (too long for the context or the KV memory)."""


class ContextOverflow(RequestRejected):
    """A prompt that does not fit in the context window (with room for one generated token)."""

    def __init__(self, message: str, n_prompt_tokens: int = 0, n_ctx: int = 0):
        super().__init__(message)
        self.n_prompt_tokens, self.n_ctx = n_prompt_tokens, n_ctx


class QueueFull(RuntimeError):
    """The waiting queue is at its limit; try again later."""


class ShuttingDown(RuntimeError):
    """The engine no longer accepts requests."""


@dataclass
class GenRequest:
    """One sequence to generate: prompt token ids, sampling parameters, limits and stop strings."""

    prompt_ids: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    max_tokens: int | None = None  # None: until the context is full; 0: the prompt is only read (cached)
    stop: Sequence[str] = ()
    logprobs: int | None = None  # None: no log-probabilities; k >= 0: the sampled token's and the top k
    grammar: str | None = None  # a compiled constraint (Engine.compile_grammar): the output must match it
    speculative: bool = True  # may guess ahead when the engine speculates (speculative.py)
    live: bool = False  # its events say how far it has got (Event.progress): llama-server's return_progress
    # and timings_per_token
    reasoning_budget: reasoning.BudgetSpec | None = None  # ends the reasoning after so many tokens
    # with logprobs: those of the distribution the sampler drew from (after its filters and temperature),
    # not of the raw logits (llama-server's post_sampling_probs)
    post_sampling: bool = False
    slot: int = -1  # llama-server's id_slot: the slot whose conversation this is (slot_tokens); -1 any
    # k >= 0: each prompt token's log-probability given those before it, and the top k (OpenAI's echo with
    # logprobs, vLLM's prompt_logprobs); the prompt is then computed whole (no prefix cache)
    prompt_logprobs: int | None = None
    # vLLM's min_tokens: until this many are generated, end-of-generation tokens are banned and stop
    # strings not looked for
    min_tokens: int = 0
    # llama-server's for code completion: a new line indented less than n_indent ends the answer (the line
    # left out); after t_max_predict_ms since the first token, a token with a new line ends it
    n_indent: int = 0
    t_max_predict_ms: int = 0


class TokenLogprob(NamedTuple):
    """A sampled token's log-probability under the model (the raw logits' log-softmax, before sampling
    changes them, as OpenAI's and llama-server's default report it) and the `top` most likely tokens."""

    logprob: float
    top: list[tuple[int, float]]  # (token id, log-probability), most likely first
    rank: int = 0  # prompt tokens: 1 + how many tokens the model found likelier (vLLM's rank); 0 unset


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int  # prompt tokens served by the prefix cache
    ttft_s: float | None  # arrival to first token
    total_s: float | None = None  # arrival to the end
    draft_tokens: int = 0  # speculative guesses checked
    draft_accepted: int = 0  # of those, kept
    queue_s: float | None = None  # arrival to admission (its prompt's reading began); None: never admitted

    @property
    def prompt_s(self) -> float:
        """Reading the prompt: admission to the first token (llama-server's prompt_ms)."""
        return max(0.0, (self.ttft_s or 0.0) - (self.queue_s or 0.0)) if self.ttft_s is not None else 0.0

    @property
    def generation_s(self) -> float:
        """First token to the end (llama-server's predicted_ms)."""
        return max(0.0, (self.total_s or 0.0) - self.ttft_s) if self.ttft_s is not None else 0.0


@dataclass(frozen=True)
class Progress:
    """How far a sequence has got, on its events when its request asked (GenRequest.live): prompt
    positions read so far (served by the prefix cache or computed) and tokens generated."""

    prompt_tokens: int
    cached_tokens: int  # of the prompt, served by the prefix cache
    prompt_done: int  # prompt positions whose K/V are in the cache (cached_tokens included)
    completion_tokens: int
    elapsed_s: float  # since arrival
    ttft_s: float | None  # arrival to the first token, once there is one
    queue_s: float = 0.0  # arrival to admission


@dataclass(frozen=True)
class Event:
    """A piece of one stream: new text and the token that completed it. The last event of a stream has a
    finish_reason ("stop", "length", "cancelled", "error") and usage; an "error" event has the message
    and an HTTP-like status saying whose fault it was (400 the request's, 503 shutdown, 500 ours)."""

    text: str
    token: int | None = None
    finish_reason: str | None = None
    error: str | None = None
    usage: Usage | None = None
    status: int = 200
    logprob: TokenLogprob | None = None  # the token's, when the request asked for log-probabilities
    # where the sequence stands (GenRequest.live): on each token's event, and on events of their own
    # (no text, no token) as its prompt is read: one when admitted, one per prompt chunk computed
    progress: Progress | None = None
    # GenRequest.prompt_logprobs: on an event of its own (no text, no token) before the first token's;
    # one entry per prompt token, the first None (nothing before it)
    prompt_logprobs: list[TokenLogprob | None] | None = None


class Stream:
    """A request's output as an async (or plain) iterator of Events. cancel() stops the sequence."""

    def __init__(self, engine: Engine, loop: asyncio.AbstractEventLoop | None):
        self._engine = engine
        self._loop = loop
        self._aq: asyncio.Queue[Event] | None = asyncio.Queue() if loop is not None else None
        self._q: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self.done = False
        self.cancelled = False

    def _push(self, ev: Event) -> None:  # engine thread
        if self._aq is not None:
            try:
                self._loop.call_soon_threadsafe(self._aq.put_nowait, ev)  # type: ignore[union-attr]
            except RuntimeError:  # the loop is closed: nobody is listening any more
                pass
        else:
            self._q.put(ev)

    def cancel(self) -> None:
        """Stop generating (the client went away); takes effect at the engine's next step."""
        if not self.done and not self.cancelled:
            self.cancelled = True
            self._engine._cancel(self)

    async def __anext__(self) -> Event:
        if self.done:
            raise StopAsyncIteration
        assert self._aq is not None, "this stream was opened without an event loop: iterate it plainly"
        ev = await self._aq.get()
        self.done = ev.finish_reason is not None
        return ev

    def __aiter__(self) -> AsyncIterator[Event]:
        return self

    def ready(self) -> list[Event]:
        """The events already produced, without waiting (plain streams only)."""
        out = []
        while not self.done and not self._q.empty():
            ev = self._q.get()
            self.done = ev.finish_reason is not None
            out.append(ev)
        return out

    def __iter__(self) -> Iterator[Event]:
        assert self._aq is None, "this stream was opened in an event loop: iterate it with async for"
        while not self.done:
            ev = self._q.get()
            self.done = ev.finish_reason is not None
            yield ev


class _Seq(SeqState):
    """Engine-side state of one sequence: its request, stream, sampler, detokenizer and stop matcher."""

    def __init__(self, req: GenRequest, stream: Stream, tokenizer: Any, guided: Any = None):
        super().__init__(req.prompt_ids)
        self.req = req
        self.constraint = structured.Constraint(req.grammar, guided) if req.grammar else None
        spec = req.reasoning_budget
        self.budget = reasoning.Budget(spec, lambda t: tokenizer.token_to_piece(t, True)) if spec else None
        self.spec: speculative.SeqSpec | None = None  # set by the engine when it may guess for this one
        self.draft: list[int] = []  # this step's guesses, appended to tokens until the step is applied
        self.stream = stream
        p = req.params
        self.sampler = RowSampler(
            p,
            dry_breakers=vocab_dry_breakers(tokenizer, p.dry_sequence_breakers) if p.dry_on else None,
            vocab=tokenizer,
        )
        self.detok = tokenizer.stream()
        self.stop = StopMatcher(req.stop)
        self.indent = IndentLimit(req.n_indent) if req.n_indent > 0 else None
        self.done = False  # its last event is out
        self.t_arrival = time.perf_counter()
        self.t_first: float | None = None
        self.t_admit: float | None = None  # first admitted: its prompt's reading began
        self.prompt_reported = -1  # live: the prompt positions its last progress event reported
        # GenRequest.prompt_logprobs: filled as the prompt is computed; it cannot come from the cache
        self.prompt_lp: list[TokenLogprob | None] | None = None
        if req.prompt_logprobs is not None:
            self.prompt_lp = [None] * self.n_prompt
            self.reuse_prefix = False

    def progress(self, prompt_done: int | None = None, now: float | None = None) -> Progress | None:
        """Where it stands, if its request asked (GenRequest.live); prompt_done: its prompt read so far
        (by default as far as its computed positions go)."""
        if not self.req.live:
            return None
        now = time.perf_counter() if now is None else now
        if prompt_done is None:
            prompt_done = self.n_prompt if self.t_first is not None else min(self.n_computed, self.n_prompt)
        ttft = (self.t_first - self.t_arrival) if self.t_first is not None else None
        elapsed = now - self.t_arrival
        queue = (self.t_admit - self.t_arrival) if self.t_admit is not None else elapsed
        return Progress(self.n_prompt, self.n_cached, prompt_done, self.n_generated, elapsed, ttft, queue)

    def drop_draft(self) -> list[int]:
        """Take this step's guesses back out of the tokens; returns them."""
        d, self.draft = self.draft, []
        if d:
            del self.tokens[len(self.tokens) - len(d) :]
        return d


@dataclass
class EngineStats:
    requests: int = 0
    finished: collections.Counter = field(default_factory=collections.Counter)  # by finish reason
    prompt_tokens: int = 0  # prompt tokens of admitted requests
    prompt_tokens_computed: int = 0  # positions run through the model for prompts (cache misses, recomputes)
    generated_tokens: int = 0
    preempted: int = 0
    draft_tokens: int = 0  # speculative guesses checked
    draft_accepted: int = 0  # of those, kept
    steps: int = 0
    busy_s: float = 0.0
    rows: int = 0  # sequences the steps ran, summed (rows / steps: busy slots per step)
    drafts: int = 0  # speculative guesses made (each of one or more tokens)
    prompt_s: float = 0.0  # finished requests' prompt reading (admission to first token), summed
    generation_s: float = 0.0  # finished requests' first token to end, summed
    n_tokens_max: int = 0  # the longest sequence (prompt and generated) seen


class Engine:
    """Continuous batching for one model. `submit` from any thread; `start` runs the step loop in a
    daemon thread (or the caller calls `step()` itself); `shutdown` stops it (letting running sequences
    finish for up to `grace` seconds). A step: `sched.schedule()` plans, `runner` executes the plan,
    `_update_from_output` applies the results."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        n_ctx: int,
        max_seqs: int = 4,
        kv_tokens: int | None = None,
        block_size: int = DEFAULT_BLOCK_SIZE,
        max_batch_tokens: int = DEFAULT_BATCH_TOKENS,
        max_queue: int = 64,
        prefix_caching: bool = True,
        spec: speculative.SpecConfig | None = None,
        draft_model: Any = None,
    ):
        if n_ctx <= 0 or max_seqs <= 0 or block_size <= 0 or max_batch_tokens <= 0 or max_queue < 0:
            raise ValueError("n_ctx, max_seqs, block_size and max_batch_tokens must be positive")
        self.model = model
        self.tokenizer = tokenizer
        self.n_ctx = n_ctx
        self.max_seqs = max_seqs
        self.max_batch_tokens = max(max_batch_tokens, max_seqs)  # room for every decoding sequence
        self.max_queue = max_queue
        kv_tokens = kv_tokens if kv_tokens else max_seqs * n_ctx
        n_blocks = -(-kv_tokens // block_size)
        # sliding-window rings are per sequence slot: a prefix cache (blocks shared across sequences) needs
        # full caches on every layer
        cache = model.new_kv_cache(n_ctx, max_seqs, block_size, n_blocks, window_rings=not prefix_caching)
        self.kv = PagedKV(cache, prefix_caching)
        self.eog = tokenizer.eog_ids
        # guesses overwrite K/V ahead of a sequence; a sliding-window ring would lose entries it still needs
        rings = not prefix_caching and bool(getattr(model, "window_layers", list)())
        self.spec = spec if spec is not None and spec.kind != "none" and not rings else None
        self.draft = None
        if self.spec is not None and self.spec.model is not None:
            if draft_model is None:
                raise ValueError(f"speculative decoding with {self.spec.model} needs that draft model loaded")
            self.draft = speculative.DraftModel(draft_model, n_ctx, max_seqs)
        self.costs = speculative.StepCosts()  # decode steps' and draft guesses' seconds, as they run
        self.stats = EngineStats()
        self._rates: collections.deque[tuple[float, int, int]] = collections.deque()  # (t, prompt, gen)
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._inbox: list[_Seq] = []  # submitted, not yet seen by the engine thread
        self._cancels: list[Stream] = []
        self._jobs: list[tuple[Callable[[], Any], concurrent.futures.Future]] = []  # call()
        # the tokens of the last sequence that ended in each slot (its request's `slot`, else the engine's
        # own): what llama-server's slot save writes, read on the engine thread (call())
        self.slot_tokens: dict[int, list[int]] = {}
        self.sched = Scheduler(self.kv, self.max_batch_tokens)
        self.runner = ModelRunner(model, self.kv.cache, self.eog)
        self._accepting = True
        self._stop_at: float | None = None  # shutdown: cancel what still runs at this time
        self._thread: threading.Thread | None = None
        self._stepping = threading.Lock()  # one step at a time, whoever calls it
        # the step whose sampled tokens are being applied: a sequence it ends keeps the positions the
        # step computed for it (not yet in n_computed) in the prefix cache (_fed)
        self._applying: tuple[StepPlan, RunnerOutput] | None = None

    # -- client side (any thread) ----------------------------------------------------------------------
    def check(self, req: GenRequest) -> None:
        """Raise RequestRejected if the request can never run here (submit checks this too)."""
        n = len(req.prompt_ids)
        if n == 0:
            raise RequestRejected("empty prompt: nothing to condition on")
        if req.max_tokens is not None and req.max_tokens < 0:
            raise RequestRejected(f"max_tokens must be at least 0, got {req.max_tokens}")
        if n + 1 > self.n_ctx:
            raise ContextOverflow(
                f"the prompt is {n} tokens but the context holds {self.n_ctx} (including at least one "
                f"generated token); shorten it or raise --ctx-size",
                n,
                self.n_ctx,
            )
        if self.kv.blocks_for(n + 1) > self.kv.n_blocks:
            raise RequestRejected(
                f"the prompt is {n} tokens but the KV memory holds {self.kv.n_blocks * self.kv.block_size}; "
                f"raise --kv-budget"
            )
        n_vocab = getattr(getattr(self.model, "config", None), "n_vocab", None)
        bad = [t for t in req.prompt_ids if not (0 <= t < (n_vocab or 1 << 62))]
        if bad:
            raise RequestRejected(f"token id {bad[0]} is outside the vocabulary of {n_vocab}")
        req.params.validate(n_vocab)
        k = req.prompt_logprobs
        if k is not None and not (isinstance(k, int) and k >= 0):
            raise RequestRejected(f"prompt_logprobs must be None or an int >= 0, got {k!r}")
        for name in ("min_tokens", "n_indent", "t_max_predict_ms"):
            v = getattr(req, name)
            if not (isinstance(v, int) and v >= 0):
                raise RequestRejected(f"{name} must be an int >= 0, got {v!r}")

    def compile_grammar(self, grammar: structured.Grammar) -> str:
        """A constraint compiled for this model's vocabulary, for GenRequest.grammar; GrammarError (a
        RequestRejected's kind of fault: the request's) names what is wrong."""
        n_vocab = self.model.config.n_vocab
        return structured.compile_grammar(grammar, structured.guided_tokenizer(self.tokenizer, n_vocab))

    def submit(self, req: GenRequest, loop: asyncio.AbstractEventLoop | None = None) -> Stream:
        """Queue a request; its events arrive on the returned Stream (async if `loop` is given)."""
        self.check(req)
        stream = Stream(self, loop)
        guided = None
        if req.grammar:
            guided = structured.guided_tokenizer(self.tokenizer, self.model.config.n_vocab)
        try:
            seq = _Seq(req, stream, self.tokenizer, guided)
            # (a reasoning budget may write other tokens than those sampled: no guesses to check then;
            # mirostat's state moves with each token drawn, which a guess cannot follow)
            if (
                self.spec is not None and req.speculative and req.logprobs is None and seq.budget is None
                and not seq.sampler.stateful and req.prompt_logprobs is None and not req.min_tokens
            ):  # fmt: skip
                seq.spec = speculative.SeqSpec(self.spec)
            if seq.constraint is not None and req.max_tokens is not None:
                need = seq.constraint.min_tokens()
                if need > req.max_tokens:
                    raise structured.GrammarError(
                        f"the constraint needs at least {need} tokens but max_tokens is {req.max_tokens}"
                    )
        except structured.GrammarError as e:
            raise RequestRejected(str(e)) from None
        with self._lock:
            if not self._accepting:
                raise ShuttingDown("the server is shutting down")
            if len(self.sched.waiting) + len(self._inbox) >= self.max_queue + self.n_free_seq_slots():
                raise QueueFull(f"the request queue is full ({self.max_queue} waiting); retry later")
            self._inbox.append(seq)
            self.stats.requests += 1
            self._wake.notify()
        return stream

    def call(self, fn: Callable[[], Any]) -> concurrent.futures.Future:
        """Run `fn` on the thread that steps the engine, between two steps (so it may use the model and
        backend, which are not thread-safe: embeddings do); its result or exception arrives in the
        future."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            if not self._accepting:
                raise ShuttingDown("the server is shutting down")
            self._jobs.append((fn, fut))
            self._wake.notify()
        return fut

    def end_reasoning(self, stream: Stream) -> concurrent.futures.Future:
        """End a running sequence's reasoning now (llama-server's reasoning control; its request armed a
        reasoning budget): a future of whether it was reasoning."""

        def end() -> bool:
            for s in itertools.chain(self.sched.running, self.sched.waiting):
                if s.stream is stream:
                    return s.budget is not None and s.budget.force()
            return False

        return self.call(end)

    def n_free_seq_slots(self) -> int:
        return max(0, self.max_seqs - len(self.sched.running))

    def _cancel(self, stream: Stream) -> None:
        with self._lock:
            self._cancels.append(stream)
            self._wake.notify()

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="edgellm-engine", daemon=True)
            self._thread.start()

    def shutdown(self, grace: float = 5.0, wait: bool = True) -> None:
        """Stop accepting requests; fail waiting ones; let running ones finish for up to `grace` seconds,
        then cancel them. With `wait`, return when the engine thread has ended."""
        with self._lock:
            self._accepting = False
            self._stop_at = time.perf_counter() + max(0.0, grace)
            self._wake.notify()
        if wait and self._thread is not None:
            self._thread.join()

    @property
    def accepting(self) -> bool:
        return self._accepting

    @property
    def running(self) -> bool:
        """Whether the engine's own thread steps it (start()); otherwise the caller calls step()."""
        return self._thread is not None and self._thread.is_alive()

    # -- metrics -----------------------------------------------------------------------------------------
    def metrics(self) -> dict[str, float]:
        """A snapshot for /metrics (read without the engine's lock: values may be one step apart)."""
        now = time.perf_counter()
        recent = [r for r in list(self._rates) if now - r[0] <= 10.0]
        span = (now - recent[0][0]) if recent else 0.0
        span = max(span, 1.0) if recent else 0.0
        px = self.kv.prefix
        s = self.stats
        return {
            "requests_total": s.requests,
            "requests_finished_stop": s.finished["stop"],
            "requests_finished_length": s.finished["length"],
            "requests_cancelled": s.finished["cancelled"],
            "requests_failed": s.finished["error"],
            "prompt_tokens_total": s.prompt_tokens,
            "prompt_tokens_computed_total": s.prompt_tokens_computed,
            "generation_tokens_total": s.generated_tokens,
            "preemptions_total": s.preempted,
            "draft_tokens_total": s.draft_tokens,
            "draft_accepted_total": s.draft_accepted,
            "steps_total": s.steps,
            "drafts_total": s.drafts,
            "prompt_seconds_total": s.prompt_s,
            "generation_seconds_total": s.generation_s,
            "n_tokens_max": s.n_tokens_max,
            "busy_rows_per_step": s.rows / s.steps if s.steps else 0.0,
            "queue_length": len(self.sched.waiting) + len(self._inbox),
            "running": len(self.sched.running),
            "kv_blocks_total": self.kv.n_blocks,
            "kv_blocks_used": self.kv.n_used(),
            "kv_block_size": self.kv.block_size,
            "prefix_cache_blocks": px.n_blocks if px else 0,
            "prefix_cache_lookup_tokens_total": px.lookup_tokens if px else 0,
            "prefix_cache_hit_tokens_total": px.hit_tokens if px else 0,
            "prefix_cache_hit_rate": px.hit_rate if px else 0.0,
            "prompt_tokens_per_second": sum(r[1] for r in recent) / span if span else 0.0,
            "generation_tokens_per_second": sum(r[2] for r in recent) / span if span else 0.0,
        }

    # -- the engine thread ---------------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._lock:
                while not (self._inbox or self._cancels or self._jobs or self.sched.has_work()):
                    if not self._accepting:
                        return
                    self._wake.wait()
            if not self.step() and not self._accepting:
                return

    def step(self) -> bool:
        """Take in new requests and cancellations, then run one step: schedule, forward and sample, apply.
        The engine thread calls this in a loop; a caller may instead drive the engine with it from its own
        thread, without `start()` (it returns at once when there is nothing to do). Returns False when the
        engine has nothing left to do after a shutdown."""
        with self._stepping:
            with self._lock:  # under the lock, so that submit's queue check always sees every request
                for s in self._inbox:
                    self.sched.add(s)
                self._inbox = []
                cancels, self._cancels = self._cancels, []
                jobs, self._jobs = self._jobs, []
                accepting, stop_at = self._accepting, self._stop_at
            for fn, fut in jobs:
                if fut.set_running_or_notify_cancel():
                    try:
                        fut.set_result(fn())
                    except Exception as e:  # noqa: BLE001 - the caller gets it
                        fut.set_exception(e)
            for st in cancels:
                self._drop(st, "cancelled")
            if not accepting:
                for s in list(self.sched.waiting):
                    self._finish(s, "error", "the server is shutting down", status=503)
                if stop_at is not None and time.perf_counter() >= stop_at:
                    for s in list(self.sched.running):
                        self._finish(s, "error", "the server is shutting down", status=503)
                if not self.sched.running:
                    return False
            if self.sched.has_work():
                self._step()
            return True

    def _drop(self, stream: Stream, reason: str) -> None:
        for s in itertools.chain(self.sched.running, self.sched.waiting):
            if s.stream is stream:
                self._finish(s, reason)
                return

    def _finish(
        self, s: _Seq, reason: str, error: str | None = None, flush: bool = True, status: int = 500
    ) -> None:
        """End a sequence: last event (with any text held back, unless a stop string ended it), free its
        slot and blocks. A sequence already ended is left alone."""
        if s.done:
            return
        s.done = True
        if self.draft is not None:
            self.draft.forget(s)
        text = ""
        if flush and reason in ("stop", "length"):
            text = (s.indent.flush() if s.indent is not None else "") + s.stop.flush() + s.detok.flush()
        keep = reason in ("stop", "length", "cancelled")
        if keep and s.slot >= 0:
            self.slot_tokens[s.req.slot if s.req.slot >= 0 else s.slot] = list(s.tokens)
        self.sched.finish(s, keep_tail=keep, fed=self._fed(s))
        self.stats.finished[reason] += 1
        now = time.perf_counter()
        ttft = (s.t_first - s.t_arrival) if s.t_first else None
        sp = s.spec
        queue = (s.t_admit - s.t_arrival) if s.t_admit is not None else None
        usage = Usage(s.n_prompt, s.n_generated, s.n_cached, ttft, now - s.t_arrival,
                      sp.drafted if sp else 0, sp.accepted if sp else 0, queue)  # fmt: skip
        self.stats.prompt_s += usage.prompt_s
        self.stats.generation_s += usage.generation_s
        self.stats.n_tokens_max = max(self.stats.n_tokens_max, len(s.tokens))
        status = status if reason == "error" else 200
        s.stream._push(Event(text, None, reason, error, usage, status, progress=s.progress()))

    def _step(self) -> None:
        """The scheduler plans, the runner executes the plan, the results are applied."""
        t0 = time.perf_counter()
        plan: StepPlan | None = None
        try:
            drafted = self._propose()
            plan = self.sched.schedule()
            if plan.finished:  # a sequence that alone outgrew the pool ends (runs nothing): its memory
                self._update_from_output(plan, RunnerOutput())  # is free now, so plan again into it
                plan = self.sched.schedule()
            self._keep_scheduled_drafts(plan, drafted)
            self._admitted(plan)
            decode = (  # timed for speculation, which weighs guesses by what steps cost
                self.spec is not None
                and bool(plan.run)
                and all(r.n_tokens == r.seq.pending == 1 + len(r.seq.draft) for r in plan.run)
            )
            t_run = time.perf_counter()
            out = self.runner.execute(plan.run) if plan.run else RunnerOutput()
            self._update_from_output(plan, out)
            if decode:  # what a decode step of this many tokens costs
                self.costs.step(plan.n_tokens, time.perf_counter() - t_run)
        except Exception as e:  # noqa: BLE001 - a bug must not kill the engine: fail what ran
            ended = [f.seq for f in plan.finished] if plan else []
            for s in [*self.sched.running, *ended]:
                self._finish(s, "error", f"internal error: {type(e).__name__}: {e}")
            return
        if plan.run:
            self.stats.steps += 1
            self.stats.rows += len(plan.run)
            self.stats.busy_s += time.perf_counter() - t0

    def _propose(self) -> list[_Seq]:
        """Speculation: guess the next tokens of each decoding sequence that may (prompt lookup), while
        few decode; the guesses are appended to its tokens for this step only. Returns who guessed."""
        cfg = self.spec
        if cfg is None:
            return []
        decoders = [s for s in self.sched.running if s.pending == 1 and s.spec is not None]
        n_decoding = sum(1 for s in self.sched.running if s.pending == 1)
        if not decoders or n_decoding > cfg.max_batch:
            return []
        drafted = []
        step = speculative.StepGuesses()  # each sequence's guesses must pay on top of those before it
        for s in decoders:
            if not s.spec.ready():
                continue
            k = min(s.spec.k, self.n_ctx - len(s.tokens) - 1)
            if s.req.max_tokens is not None:
                k = min(k, s.req.max_tokens - s.n_generated - 1)
            if k < cfg.draft_min:
                continue
            d = []
            if cfg.kind == "ngram-simple":
                d = speculative.ngram_draft(s.tokens, k, cfg.ngram_max, cfg.ngram_min)
                if d and cfg.adaptive and n_decoding > 1:  # under load: as many as pay for the larger step
                    # (alone, a lookup's guesses cost little, and its runs are kept or lost together, which
                    # the per-guess chance undervalues: its own k and pauses hold it then)
                    paying = self.costs.guesses(
                        s.spec.acceptance(False), n_decoding, speculative.bucket(len(d)), False, step
                    )
                    d = d[:paying]
                    if not d and self.draft is None:
                        continue
            s.spec.by_model = not d and self.draft is not None  # lookup first (kind ngram-simple + -md)
            if s.spec.by_model:
                if not s.spec.model_ready():
                    continue
                k = speculative.bucket(k)
                if s.spec.probe:  # after a pause: one guess, to learn whether guessing pays again
                    k, s.spec.probe = 1, False
                elif cfg.adaptive:  # only as many guesses as pay for their draft steps, if any
                    k = self.costs.guesses(s.spec.acceptance(True), n_decoding, k, True, step)
                    if k == 0:
                        if self.costs.known(n_decoding):
                            s.spec.pause()
                        continue
                    s.spec.paying()
                d = self.draft.propose(s, k)
                self.costs.guessed(self.draft.decode_n, self.draft.decode_s)
            if s.constraint is not None:  # only guesses the grammar allows (the check masks each row)
                d = d[: s.constraint.valid_prefix(d)]
            d = d[: speculative.bucket(len(d))]  # a few step sizes: a few captured plans, not one per length
            if len(d) < cfg.draft_min:
                continue
            extra = self.kv.blocks_for(s.n_computed + 1 + len(d)) - self.kv.blocks_for(s.n_computed + 1)
            if extra > self.kv.n_available() - len(self.sched.running):
                continue  # guesses never take memory another sequence needs
            s.draft = d
            s.tokens.extend(d)
            drafted.append(s)
        return drafted

    def _keep_scheduled_drafts(self, plan: StepPlan, drafted: list[_Seq]) -> None:
        """Guesses run only whole: a drafted sequence the plan feeds less than all of (the step's token
        budget) or not at all (preempted, ended) drops them and, if it runs, decodes its one token."""
        for s in drafted:
            i = next((j for j, r in enumerate(plan.run) if r.seq is s), None)
            if i is not None and plan.run[i].n_tokens == 1 + len(s.draft):
                continue
            s.drop_draft()
            if i is not None:
                plan.run[i] = Scheduled(s, 1)

    def _apply_speculation(self, plan: StepPlan, s: _Seq, taken: list[int]) -> None:
        """A drafted sequence's step: its guesses leave its tokens, what the check kept is accepted token
        by token (a stop ends it as usual) and its plan entry counts the positions whose K/V are sound:
        the last real token and the kept guesses."""
        d = s.drop_draft()
        kept = len(taken) - 1
        if s.spec.by_model:  # type: ignore[union-attr]
            self.draft.kept(s, len(s.tokens), len(d), kept)  # type: ignore[union-attr]
        s.spec.record(len(d), kept)  # type: ignore[union-attr]
        self.stats.draft_tokens += len(d)
        self.stats.draft_accepted += kept
        self.stats.drafts += 1
        for tok in taken:
            if s.done:
                break
            self._accept(s, tok)
        for j, r in enumerate(plan.run):
            if r.seq is s:
                plan.run[j] = Scheduled(s, 1 + kept)

    def _update_from_output(self, plan: StepPlan, out: RunnerOutput) -> None:
        """Apply a step: end what the plan ended and the rows that failed, append and stream the sampled
        tokens (ending sequences at eog, a stop string or a limit), then let the scheduler advance the
        computed positions and commit full blocks to the prefix cache."""
        self.stats.preempted += len(plan.preempted)
        self.stats.prompt_tokens += sum(a.seq.n_prompt for a in plan.admitted if not a.readmitted)
        for f in plan.finished:
            self._finish(f.seq, f.reason, f.error)
        for s, error, status in out.failed:
            self._finish(s, "error", error, status=status)
        # a prompt just read: the draft reads it too, in prompt time, if the sequence may guess soon (few
        # decode); else the draft catches up on the sequence when it first guesses, if ever
        if self.draft is not None and self.spec is not None:
            new = [s for s in out.sampled if s.t_first is None and s.spec is not None]
            if new and sum(1 for s in self.sched.running if s.pending <= 1) <= self.spec.max_batch:
                for s in new:
                    self._prefill_draft(s)
        self._report_prompts(plan)
        for s, scored in out.prompt_logprobs.items():
            if s.prompt_lp is not None:
                for pos, lp in scored:
                    s.prompt_lp[pos] = lp
        self._applying = (plan, out)
        try:
            for s, tok in out.sampled.items():
                self._accept(s, tok, out.logprobs.get(s))
        finally:
            self._applying = None
        for s, taken in out.speculated.items():
            self._apply_speculation(plan, s, taken)
        for s, _, _ in out.failed:  # a drafted row that failed: its guesses go
            s.drop_draft()
        n_prompt = self.sched.update_from_output(plan, out.computed)
        self.stats.prompt_tokens_computed += n_prompt
        if out.computed:
            self._rates.append((time.perf_counter(), n_prompt, out.n_rows))
            while len(self._rates) > 4096:
                self._rates.popleft()

    def _fed(self, s: _Seq) -> int:
        """The positions the step being applied computed for `s`, not yet in its n_computed (0 outside
        that; a drafted row's sound positions are known only once its guesses are checked: not counted)."""
        if self._applying is None:
            return 0
        plan, out = self._applying
        if s not in out.computed or s in out.speculated:
            return 0
        return next((r.n_tokens for r in plan.run if r.seq is s), 0)

    def _admitted(self, plan: StepPlan) -> None:
        """The sequences a step admits for the first time: their prompt's reading begins (its time counts
        from here, as llama-server's prompt_ms). Those that asked (GenRequest.live) get a progress event,
        as llama-server's return_progress sends them: one as a prompt starts (its cached part read),
        before the step computes it; then one per chunk computed (_report_prompts), the last (all of it
        read) before the first token. They never go back: a preempted prompt recomputes quietly up to
        where it was."""
        now = time.perf_counter()
        for a in plan.admitted:
            if not a.readmitted:
                a.seq.t_admit = now
                if a.seq.req.live:
                    self._report_prompt(a.seq, a.seq.n_cached, now)

    def _report_prompts(self, plan: StepPlan) -> None:
        """Progress events for the prompt chunks a step computed (see _admitted)."""
        for r in plan.run:
            s = r.seq
            if s.req.live and not s.done and s.t_first is None and s.n_computed < s.n_prompt:
                self._report_prompt(s, min(s.n_computed + r.n_tokens, s.n_prompt))

    @staticmethod
    def _report_prompt(s: _Seq, done: int, now: float | None = None) -> None:
        if done > s.prompt_reported:
            s.prompt_reported = done
            s.stream._push(Event("", progress=s.progress(done, now)))

    def _prefill_draft(self, s: _Seq) -> None:
        """The draft model reads a prompt as the target finishes it (before its first token, so the time
        counts as the prompt's); if the draft fails on it, this sequence goes on without its guesses."""
        try:
            self.draft.prefill(s)  # type: ignore[union-attr]
        except Exception:  # noqa: BLE001 - the target's answer does not depend on the draft
            s.spec.stop_model()  # type: ignore[union-attr]
            self.draft.forget(s)  # type: ignore[union-attr]

    def _accept(self, s: _Seq, tok: int, lp: TokenLogprob | None = None) -> None:
        """Append a sampled token: stream its text, or end the sequence."""
        if s.t_first is None:
            s.t_first = time.perf_counter()
            if s.prompt_lp is not None:
                s.stream._push(Event("", prompt_logprobs=list(s.prompt_lp)))
        if s.req.max_tokens == 0:  # the prompt only, read into the cache: its end is not generated
            self._finish(s, "length")
            return
        if s.budget is not None:  # its reasoning spent: the end tag in place of what was sampled
            want = s.budget.take(tok)
            if want != tok:
                if s.constraint is None or s.constraint.valid_prefix([want]):
                    tok, lp = want, None
                else:  # the grammar does not allow it here: the budget gives way
                    s.budget.state = reasoning.Budget.DONE
        s.n_generated += 1
        self.stats.generated_tokens += 1
        if tok in self.eog:
            self._finish(s, "stop")
            return
        s.tokens.append(tok)
        if s.constraint is not None:
            try:
                s.constraint.consume(tok)
            except structured.GrammarError as e:
                self._finish(s, "error", f"internal error: {e}")
                return
        text, hit = s.stop.push(s.detok.push(tok), check=s.n_generated >= s.req.min_tokens)
        if s.indent is not None:
            text, short = s.indent.push(text)
            if short:  # a line less indented than n_indent: the answer ends before it
                s.stream._push(Event(text, tok, logprob=lp, progress=s.progress()))
                self._finish(s, "length", flush=False)
                return
        if hit:
            s.stream._push(Event(text, tok, logprob=lp, progress=s.progress()))
            self._finish(s, "stop", flush=False)  # what follows the stop string is dropped
            return
        if s.constraint is not None and s.constraint.done:  # the grammar is complete: nothing can follow
            s.stream._push(Event(text, tok, logprob=lp, progress=s.progress()))
            self._finish(s, "stop")
            return
        limit = s.req.max_tokens is not None and s.n_generated >= s.req.max_tokens
        if s.req.t_max_predict_ms > 0 and "\n" in text:  # llama-server's generation time limit
            limit = limit or (time.perf_counter() - s.t_first) * 1e3 > s.req.t_max_predict_ms
        if limit or len(s.tokens) >= self.n_ctx:
            s.stream._push(Event(text, tok, logprob=lp, progress=s.progress()))
            self._finish(s, "length")
            return
        s.stream._push(Event(text, tok, logprob=lp, progress=s.progress()))


@dataclass
class RunnerOutput:
    """What one step's forward and sampling produced: the sequences whose fed tokens now have their K/V
    in the cache, a token for each sequence whose fed tokens reached its end, and the rows that failed
    (sequence, message, HTTP-like status)."""

    computed: set[_Seq] = field(default_factory=set)
    sampled: dict[_Seq, int] = field(default_factory=dict)
    failed: list[tuple[_Seq, str, int]] = field(default_factory=list)
    logprobs: dict[_Seq, TokenLogprob] = field(default_factory=dict)  # rows whose request asked
    speculated: dict[_Seq, list[int]] = field(default_factory=dict)  # drafted rows: kept guesses + 1
    # GenRequest.prompt_logprobs: (prompt position, its token's log-probability) for the positions computed
    prompt_logprobs: dict[_Seq, list[tuple[int, TokenLogprob]]] = field(default_factory=dict)
    n_rows: int = 0  # logits rows the forward produced (tokens generated, sampled or not)


def _short(s: _Seq) -> bool:
    """Whether the sequence has not yet generated its request's min_tokens."""
    return s.n_generated < s.req.min_tokens


class _TopK(NamedTuple):
    """A decode row as its top-k candidates (Backend.decode_top_k)."""

    ids: np.ndarray
    logits: np.ndarray


def _keeps_logits(model: Any) -> bool:
    return bool(getattr(getattr(model, "backend", None), "keeps_logits", False))


def token_logprob(logits: np.ndarray, token: int, k: int, rank: bool = False) -> TokenLogprob:
    """`token`'s log-probability under softmax(logits) (float64 log-sum-exp) and the top k tokens';
    with `rank`, also 1 + the number of tokens with a larger logit."""
    x = logits.astype(np.float64)
    m = float(np.max(x))
    lse = m + math.log(float(np.sum(np.exp(x - m))))
    top: list[tuple[int, float]] = []
    if k > 0:
        k = min(k, x.size)
        idx = np.argpartition(-x, k - 1)[:k]
        idx = idx[np.lexsort((idx, -x[idx]))]  # most likely first; ties by id
        top = [(int(i), float(x[i] - lse)) for i in idx]
    return TokenLogprob(float(x[token] - lse), top, int(np.count_nonzero(x > x[token])) + 1 if rank else 0)


def sampled_logprob(
    sampler: Any, logits: np.ndarray, history: Sequence[int], token: int, k: int
) -> TokenLogprob:
    """`token`'s log-probability and the top k candidates' in the distribution `sampler` drew it from
    (RowSampler.distribution: after the logit steps, filters and temperature; greedy: the argmax alone),
    as llama-server's post_sampling_probs reports them; tokens the filters removed are not among them.
    The sampler's record of its last draw is used where it has one (XTC's chance and mirostat's state are
    not taken again)."""
    last = sampler.last_distribution()
    ids, p = last if last is not None else sampler.distribution(logits, history)
    hit = p[ids == token]
    top = np.lexsort((ids, -p))[: min(k, ids.size)]  # most likely first; ties by id
    return TokenLogprob(
        math.log(hit[0]) if hit.size and hit[0] > 0 else -math.inf,
        [(int(ids[i]), math.log(p[i])) for i in top if p[i] > 0],
    )


class ModelRunner:
    """Executes a plan's batch: one forward over every scheduled sequence's tokens (through the backend's
    fast decode paths when every row decodes), then one batched sampling pass. It reads the sequences and
    never changes them: the Engine applies its output."""

    def __init__(self, model: Any, cache: Any, eog: Iterable[int] = ()):
        self.model = model
        self.cache = cache
        self.eog = np.asarray(sorted(eog), np.int64)  # end-of-generation ids: banned before a min_tokens
        self._masker: concurrent.futures.ThreadPoolExecutor | None = None

    def _masks(self, batch: Sequence[Scheduled]) -> dict[_Seq, concurrent.futures.Future]:
        """Start the next-token masks of the constrained sequences this step samples, on a worker thread
        (llguidance releases the GIL), so they are computed while the forward runs; a drafted sequence's
        are a list, one for each row its check reads (Constraint.allowed_along)."""
        seqs = [s for s, k in batch if s.constraint is not None and s.n_computed + k == len(s.tokens)]
        if not seqs:
            return {}
        if self._masker is None:
            self._masker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="edgellm-mask")
        return {
            s: self._masker.submit(s.constraint.allowed_along, list(s.draft))
            if s.draft
            else self._masker.submit(s.constraint.allowed)
            for s in seqs
        }

    def execute(self, batch: Sequence[Scheduled]) -> RunnerOutput:
        out = RunnerOutput()
        masks = self._masks(batch)
        logits_of = self._forward(batch, out)
        out.n_rows = len(logits_of)
        drafted = [s for s, _ in batch if s in logits_of and s.draft]
        for s in drafted:  # check the guesses (speculative.verify)
            rows = logits_of[s]
            if s in masks:  # a constrained row: each row's disallowed tokens at -inf
                try:
                    allowed_rows = masks[s].result()
                except Exception as e:  # noqa: BLE001 - the row fails alone, as in _sample
                    out.failed.append((s, f"the constraint failed: {e}", 500))
                    continue
                rows = np.array(rows, dtype=np.float32)
                for row, allowed in zip(rows, allowed_rows, strict=True):
                    row[: len(allowed)][~allowed] = -np.inf
                    row[len(allowed) :] = -np.inf
            try:
                history = s.tokens[: len(s.tokens) - len(s.draft)]
                out.speculated[s] = speculative.verify(s.sampler, rows, s.draft, history)
            except ValueError as e:
                out.failed.append((s, f"sampling failed: {e}", 400))
        self._sample([s for s, _ in batch if s in logits_of and not s.draft], logits_of, out, masks)
        for s, tok in out.sampled.items():
            if s.req.logprobs is not None and s not in out.logprobs:
                out.logprobs[s] = token_logprob(np.asarray(logits_of[s]), tok, s.req.logprobs)
        return out

    def _forward(self, batch: Sequence[Scheduled], out: RunnerOutput) -> dict[_Seq, Any]:
        """One forward over the whole batch; logits for each sequence whose fed tokens reach its end.
        If the forward raises, each sequence is retried alone so only the culprit fails."""
        try:
            logits_of = self._run(batch, out)
            out.computed.update(s for s, _ in batch)
            return logits_of
        except Exception:  # noqa: BLE001 - isolate below
            if len(batch) == 1:
                out.failed.append((batch[0].seq, "the model failed on this request", 500))
                return {}
        logits_of = {}
        for item in batch:
            try:
                logits_of.update(self._run([item], out))
                out.computed.add(item.seq)
            except Exception as e:  # noqa: BLE001
                out.failed.append((item.seq, f"the model failed on this request: {e}", 500))
        return logits_of

    def _run(self, batch: Sequence[Scheduled], out: RunnerOutput) -> dict[_Seq, Any]:
        toks, pos, ids, rows, want = [], [], [], [], []
        scored: list[tuple[_Seq, int, int]] = []  # prompt logprobs: (sequence, first position, its row)
        n = 0
        for s, k in batch:
            start = s.n_computed
            toks.extend(s.tokens[start : start + k])
            pos.append(np.arange(start, start + k))
            ids.append(np.full(k, s.slot))
            if s.prompt_lp is not None and start < s.n_prompt - 1:  # rows whose next token is the prompt's
                for p in range(start, min(start + k, s.n_prompt - 1)):
                    scored.append((s, p, n + p - start))
            n += k
            if start + k == len(s.tokens):
                d = len(s.draft)
                rows.extend(range(n - 1 - d, n))  # a drafted row: logits after each guess too
                want.append(s)
        args = (
            np.asarray(toks, np.int64),
            np.concatenate(pos).astype(np.int64),
            np.concatenate(ids).astype(np.int64),
            self.cache,
        )
        # log-probabilities, constraints and a min_tokens not yet reached need whole rows
        full = any(s.req.logprobs is not None or s.constraint is not None or _short(s) for s in want)
        decode = len(rows) == n  # every fed token needs its logits: a decode step (drafted rows too)
        drafted = any(s.draft for s in want)

        def split(out: Any) -> list:  # a drafted sequence takes its rows as one (d + 1, ...) block
            blocks, i = [], 0
            for s in want:
                d = len(s.draft)
                blocks.append(out[i : i + d + 1] if d else out[i])
                i += d + 1
            return blocks

        if scored:  # prompt rows too: one forward gives every row asked for, the prompt's after the rest
            extra = [r for _, _, r in scored]
            x = self.model.forward(*args, logits_rows=np.asarray(rows + extra, np.int64))
            for (s, p, _), row in zip(scored, x[len(rows) :], strict=True):
                lp = token_logprob(np.asarray(row), s.tokens[p + 1], s.req.prompt_logprobs, rank=True)
                out.prompt_logprobs.setdefault(s, []).append((p + 1, lp))
            logits = split(x[: len(rows)])
        elif decode and not full and all(s.sampler.is_greedy and not s.sampler.pre for s in want):
            # all decode, all plain greedy: only the argmax ids leave the backend (a device keeps logits)
            picked = np.asarray(self.model.decode_greedy(*args), np.int64)
            logits = [v if isinstance(v, np.ndarray) else int(v) for v in split(picked)]
        elif (
            decode and not full and not drafted and _keeps_logits(self.model)
            and all(s.sampler.top_k_first for s in want)
        ):  # fmt: skip
            # all decode on a device, every chain starting with top-k: only k candidates per row cross
            k = max([s.sampler.params.top_k for s in want if not s.sampler.is_greedy] or [1])
            ids, vals = self.model.decode_top_k(*args, k)
            logits = [_TopK(ids[i], vals[i]) for i in range(len(want))]
        elif decode:  # all decode: the backend's fast path
            logits = split(self.model.decode_step(*args))  # (native: a captured plan replayed in one call)
        else:
            logits = split(self.model.forward(*args, logits_rows=np.asarray(rows, np.int64)))
        return {s: logits[i] for i, s in enumerate(want)}

    def _sample(
        self, seqs: list[_Seq], logits_of: dict[_Seq, Any], out: RunnerOutput, masks: dict | None = None
    ) -> None:
        """Sample one token for each sequence in one batched pass (rows that fail fail alone). A sequence
        whose value is already a token id (decode_greedy) takes it; -1 means its logits were not finite.
        A constrained row's disallowed tokens are set to -inf first (`masks`)."""
        for s in seqs:
            v = logits_of[s]
            if isinstance(v, int) and v < 0:
                out.failed.append((s, "sampling failed: the logits are not finite", 400))
            elif isinstance(v, int):
                out.sampled[s] = v
        for s in seqs:
            v = logits_of[s]
            if isinstance(v, _TopK):
                try:
                    out.sampled[s] = int(s.sampler.from_top(v.ids, v.logits))
                except ValueError as e:
                    out.failed.append((s, f"sampling failed: {e}", 400))
        seqs = [s for s in seqs if not isinstance(logits_of[s], (int, _TopK))]
        if not seqs:
            return
        x = np.stack([logits_of[s] for s in seqs])
        for i, s in enumerate(seqs):
            if _short(s) and self.eog.size:  # vLLM's min_tokens: no end yet
                x[i, self.eog[self.eog < x.shape[1]]] = -np.inf
            if masks and s in masks:
                try:
                    allowed = masks[s].result()
                except Exception as e:  # noqa: BLE001 - the row fails alone
                    out.failed.append((s, f"the constraint failed: {e}", 500))
                    continue
                x[i, : len(allowed)][~allowed] = -np.inf
                x[i, len(allowed) :] = -np.inf
        failed = {f[0] for f in out.failed}
        if failed:
            keep = [i for i, s in enumerate(seqs) if s not in failed]
            seqs, x = [seqs[i] for i in keep], x[keep]
            if not seqs:
                return
        sampler = Sampler()
        sampler.rows = [s.sampler for s in seqs]
        try:
            out.sampled.update(zip(seqs, (int(t) for t in sampler.sample(x, [s.tokens for s in seqs]))))
        except ValueError:  # some row cannot be sampled: sample row by row so only it fails
            for i, s in enumerate(seqs):
                try:
                    out.sampled[s] = int(s.sampler(x[i], s.tokens))
                except ValueError as e:
                    out.failed.append((s, f"sampling failed: {e}", 400))
        for i, s in enumerate(seqs):
            if s.req.post_sampling and s.req.logprobs is not None and s in out.sampled:
                out.logprobs[s] = sampled_logprob(s.sampler, x[i], s.tokens, out.sampled[s], s.req.logprobs)
