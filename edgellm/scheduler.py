"""The continuous-batching scheduler: which sequences run in the next step, with how many tokens each.

`schedule()` returns a plain StepPlan; the engine runs it and hands the results back through
`update_from_output()` (the seam of vLLM v1's vllm/v1/core/sched/scheduler.py). Planning maps and, to make
room, unmaps KV blocks through PagedKV, but never ends a sequence itself: one that must end (it alone
outgrows the pool) is listed in the plan, keeps its blocks, and is freed by `finish()` when the engine
applies the plan. No model, no streams, no threads: tests drive it with fake outputs.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from edgellm.kvcache import OutOfBlocks, PagedKV


class SeqState:
    """What the scheduler knows of one sequence. tokens = prompt + generated; the K/V of
    tokens[:n_computed] is in the cache, so tokens[n_computed:] is what the next steps feed (a prompt, or
    one new token). The engine appends sampled tokens and counts them in n_generated."""

    _ids = itertools.count()

    def __init__(self, tokens: Sequence[int]):
        self.id = next(self._ids)
        self.tokens = list(tokens)
        self.n_prompt = len(self.tokens)
        self.n_computed = 0
        self.n_cached = 0  # positions served by the prefix cache at its latest admission
        self.n_generated = 0
        self.slot = -1  # block table row while admitted
        self.admitted = False  # ever admitted (its prompt is counted once)
        self.reuse_prefix = True  # False: computed whole, nothing served by the prefix cache

    @property
    def pending(self) -> int:
        return len(self.tokens) - self.n_computed


class Scheduled(NamedTuple):
    seq: SeqState
    n_tokens: int  # tokens fed this step, from seq.n_computed on


class Admitted(NamedTuple):
    seq: SeqState
    n_cached: int  # leading positions mapped from the prefix cache, not computed
    readmitted: bool  # preempted before: it recomputes, its prompt was counted already


class Finish(NamedTuple):
    seq: SeqState
    reason: str  # "length" or "error"
    error: str | None = None


@dataclass
class StepPlan:
    """One step: what runs (decoders first, then prompt chunks of running sequences, then newly admitted
    ones), who was preempted to make room, who was admitted, and who the engine must end (still holding
    its blocks: they are freed when the plan is applied). A plan that ends a sequence runs nothing: the
    engine applies it and plans again into the memory it frees."""

    run: list[Scheduled] = field(default_factory=list)
    admitted: list[Admitted] = field(default_factory=list)
    preempted: list[SeqState] = field(default_factory=list)
    finished: list[Finish] = field(default_factory=list)

    @property
    def n_tokens(self) -> int:
        return sum(n for _, n in self.run)


class Scheduler:
    """FIFO admission with a prefix cache, within `max_batch_tokens` per step. Memory is reserved block by
    block as sequences grow; when it runs short the most recently admitted sequences give way (they are
    requeued first and recompute later). Not thread-safe: one engine thread drives it."""

    def __init__(self, kv: PagedKV, max_batch_tokens: int):
        if max_batch_tokens <= 0:
            raise ValueError(f"max_batch_tokens must be positive, got {max_batch_tokens}")
        self.kv = kv
        self.max_batch_tokens = max_batch_tokens
        self.waiting: collections.deque[SeqState] = collections.deque()
        self.running: list[SeqState] = []  # in admission order

    def add(self, seq: SeqState) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def finish(self, seq: SeqState, keep_tail: bool = False, fed: int = 0) -> None:
        """Take a sequence out (it ended, was cancelled or failed): free its slot and blocks. With
        `keep_tail` (its K/V are sound), its computed blocks go to the prefix cache, the partial last one
        too, for a continuation such as the conversation's next turn (PagedKV.close); `fed`: positions
        the step being applied computed beyond n_computed (a prompt read to its end in the step whose
        first token ends the sequence)."""
        if seq.slot >= 0:
            if keep_tail:
                self.kv.close(seq.slot, seq.tokens, min(seq.n_computed + fed, len(seq.tokens)))
            else:
                self.kv.close(seq.slot)
            seq.slot = -1
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)

    # -- planning -------------------------------------------------------------------------------------------
    def schedule(self) -> StepPlan:
        """Plan the next step: every decoding sequence one token, then prompt chunks of running sequences,
        then newly admitted ones, within max_batch_tokens."""
        plan = StepPlan()
        budget = self.max_batch_tokens
        for s in list(self.running):  # decoders first: their blocks are ensured, preempting if need be
            if s.pending == 1 and s in self.running and self._reserve(s, s.n_computed + 1, plan):
                plan.run.append(Scheduled(s, 1))
                budget -= 1
        for s in list(self.running):
            if s.pending > 1 and budget > 0 and s in self.running:
                n = min(s.pending, budget)
                if self._reserve(s, s.n_computed + n, plan):
                    plan.run.append(Scheduled(s, n))
                    budget -= n
        plan.run = [r for r in plan.run if r.seq in self.running]  # a later reserve may have preempted one
        # a sequence ended above frees its blocks when the plan is applied: admit into them next step
        while self.waiting and budget > 0 and self.kv.n_free_slots > 0 and not plan.finished:
            s = self._admissible()
            if s is None:
                break
            n = min(s.pending, budget)
            if not self._reserve(s, s.n_computed + n, plan, preempt=False):
                self._requeue(s)
                break
            plan.admitted.append(Admitted(s, s.n_cached, s.admitted))
            s.admitted = True
            plan.run.append(Scheduled(s, n))
            budget -= n
        if not plan.run and not plan.finished and self.waiting and not self.running:
            # nothing runs and nothing will free memory: should not happen (Engine.check sizes prompts)
            plan.finished.append(Finish(self.waiting[0], "error", "not enough KV memory for this request"))
        return plan

    def _admissible(self) -> SeqState | None:
        """The first waiting sequence that fits in memory now, admitted (slot opened, cached prefix
        mapped); None if the head of the queue must wait. A sequence whose prompt shares uncached full
        blocks with a prompt being computed waits for them, to read them from the cache next step."""
        reserve = len(self.running)  # one block of headroom per running sequence for its decoding
        for s in list(self.waiting):
            cached = self.kv.cached_prefix(s.tokens) if s.reuse_prefix else 0
            if s.reuse_prefix and self._shares_pending_prefix(s, cached):
                continue
            need = self.kv.blocks_for(len(s.tokens)) - cached // self.kv.block_size
            if need > self.kv.n_available() - reserve and self.running:
                return None  # FIFO: later requests do not overtake one that waits for memory
            self.waiting.remove(s)
            s.slot, s.n_cached = self.kv.open(s.tokens, reuse=s.reuse_prefix)
            s.n_computed = s.n_cached
            self.running.append(s)
            return s
        return None

    def _shares_pending_prefix(self, s: SeqState, cached: int) -> bool:
        bs = self.kv.block_size
        if self.kv.prefix is None or len(s.tokens) <= cached + bs:
            return False
        mine = np.asarray(s.tokens[: len(s.tokens) - 1], np.int64)
        for r in self.running:
            if r.pending <= 1:
                continue
            theirs = np.asarray(r.tokens[: len(mine)], np.int64)
            n = min(len(mine), len(theirs))
            diff = np.flatnonzero(mine[:n] != theirs[:n])
            common = (int(diff[0]) if diff.size else n) // bs * bs
            if common > cached and r.n_computed < common:
                return True
        return False

    def _reserve(self, s: SeqState, n_positions: int, plan: StepPlan, preempt: bool = True) -> bool:
        """Map blocks for s up to n_positions, preempting the most recently admitted other sequences if
        memory is short. False if s itself cannot run: it had to give way (preempt=False), or it alone
        fills the pool, and then it leaves `running` for plan.finished."""
        while True:
            try:
                self.kv.ensure(s.slot, n_positions)
                return True
            except OutOfBlocks:
                if not preempt:
                    return False
                victims = [r for r in self.running if r is not s]
                if not victims:  # s alone fills the pool: its answer ends here
                    self.running.remove(s)
                    if s.n_generated:
                        plan.finished.append(Finish(s, "length"))
                    else:
                        plan.finished.append(Finish(s, "error", "not enough KV memory for this prompt"))
                    return False
                self._requeue(victims[-1])
                plan.preempted.append(victims[-1])

    def _requeue(self, s: SeqState) -> None:
        """Give back a running sequence's slot and blocks and put it first in the queue; it recomputes its
        K/V when readmitted (cached blocks of its prefix usually survive in the prefix cache)."""
        self.running.remove(s)
        self.kv.close(s.slot)
        s.slot, s.n_computed = -1, 0
        self.waiting.appendleft(s)

    # -- applying -------------------------------------------------------------------------------------------
    def update_from_output(self, plan: StepPlan, computed: Collection[SeqState]) -> int:
        """Apply a step's results, after the engine appended the sampled tokens and ended whoever ended:
        the fed tokens of `computed` (the sequences whose forward ran) now have their K/V in the cache;
        the full blocks of those still admitted go to the prefix cache. Returns the prompt positions
        computed (cache misses and recomputes)."""
        n_prompt = 0
        for s, k in plan.run:
            if s in computed:
                n_prompt += max(0, min(s.n_computed + k, s.n_prompt) - s.n_computed)
                s.n_computed += k
        for s, _ in plan.run:
            if s.slot >= 0:
                self.kv.commit(s.slot, s.tokens, s.n_computed)
        return n_prompt
