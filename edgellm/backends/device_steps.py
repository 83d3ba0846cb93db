"""What the device backends (vulkan / metal, cuda) share: a decode step recorded once per (model, KV cache,
batch size) and replayed with new token ids, positions and sequence ids, so a step costs the device's
work and three small uploads, not the Python of a forward.

A backend keeps its own record of the work (wgpu dispatches, CUDA launches) in Recording.work while
`_rec` is set, maps the step's host inputs to its input buffers through `_input_buffer`, and implements
`_new_recording`, `_new_plan` and `_replay`.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np


class Recording:
    """A decode step being recorded: its host inputs and their device buffers, the work, what to keep."""

    def __init__(self, inputs: tuple[np.ndarray, ...], buffers: list[Any]):
        self.inputs = inputs
        self.buffers = buffers
        self.work: list[Any] = []
        self.keep: list[Any] = []
        self.refused: str | None = None
        self.rope_limit = 1 << 62  # the plan holds for positions below this (its rope tables' length)
        self.vocab = 1 << 62

    def buffer_of(self, a: np.ndarray) -> Any:
        for host, buf in zip(self.inputs, self.buffers):
            if a is host:
                return buf
        return None


class Plan:
    """A recorded step: the inputs' buffers, the work, and where its logits and greedy ids land."""

    def __init__(self, rec: Recording, model: Any, kv: Any, logits: Any, ids: Any):
        self.model, self.kv = weakref.ref(model), weakref.ref(kv)
        self.buffers, self.work, self.keep = rec.buffers, rec.work, rec.keep
        self.rope_limit, self.vocab = rec.rope_limit, rec.vocab
        self.logits, self.ids = logits, ids


class RecordedSteps:
    """Mixin for a device Backend: `_step` records a decode step on first use and replays it after."""

    _rec: Recording | None = None

    def _init_steps(self) -> None:
        self._plans: dict[tuple[int, int, int], Plan | None] = {}  # None: recording refused: run eagerly
        self._rec = None

    def _new_recording(self, tokens: np.ndarray, positions: np.ndarray, seq_ids: np.ndarray) -> Recording:
        raise NotImplementedError

    def _new_plan(self, rec: Recording, model: Any, kv: Any, logits: Any, ids: Any) -> Plan:
        return Plan(rec, model, kv, logits, ids)

    def _replay(self, plan: Plan, tokens: np.ndarray, positions: np.ndarray, seq_ids: np.ndarray, kv) -> None:
        raise NotImplementedError

    def _argmax(self, logits: Any) -> Any:
        raise NotImplementedError

    def _flush(self) -> None:
        """Submit the work queued so far (a backend that batches submissions); the default: none."""

    def _input_buffer(self, a: np.ndarray, what: str) -> Any:
        """In a recording: the step's buffer for host input `a`, or None (and the recording refused: the
        op received host values that a replay would not update)."""
        if self._rec is None:
            return None
        buf = self._rec.buffer_of(a)
        if buf is None:
            self._rec.refused = f"{what} received host values that are not the step's inputs"
        return buf

    def _token_ids(self, ids: np.ndarray, vocab: int) -> np.ndarray:
        """get_rows' ids as host int64, each checked against the table's `vocab` rows; a recording keeps the
        smallest vocabulary its step saw, which a replay checks its ids against."""
        ids = np.asarray(ids, np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= vocab):
            raise ValueError(f"token id outside the vocabulary of {vocab}")
        if self._rec is not None:
            self._rec.vocab = min(self._rec.vocab, vocab)
        return ids

    def _check_replay(self, plan: Plan, tokens: np.ndarray, positions: np.ndarray, seq_ids, kv) -> None:
        if tokens.size and (tokens.min() < 0 or tokens.max() >= plan.vocab):
            raise ValueError(f"token id outside the vocabulary of {plan.vocab}")
        kv.check(seq_ids, positions)

    def _step(self, model: Any, tokens, positions, seq_ids, kv: Any) -> tuple[Any, Any]:
        """One decode step: (logits, greedy ids) on the device. The step of this (model, cache, batch size)
        is recorded on first use (running it too) and replayed after; a refused recording runs eagerly
        from then on."""
        tokens, positions, seq_ids = (np.asarray(a, np.int64) for a in (tokens, positions, seq_ids))
        key = (id(model), id(kv), len(tokens))
        plan = self._plans.get(key)
        if plan is not None and plan.model() is model and plan.kv() is kv:
            if int(positions.max(initial=0)) < plan.rope_limit:
                self._check_replay(plan, tokens, positions, seq_ids, kv)
                self._replay(plan, tokens, positions, seq_ids, kv)
                return plan.logits, plan.ids
        record = key not in self._plans or plan is not None  # None: refused before
        self._flush()
        rec = self._rec = self._new_recording(tokens, positions, seq_ids) if record else None
        try:
            logits = model.logits(model.hidden(tokens, positions, seq_ids, kv))
            ids = self._argmax(logits)
        finally:
            self._rec = None
        if rec is not None:
            self._plans[key] = None if rec.refused else self._new_plan(rec, model, kv, logits, ids)
        self._flush()
        return logits, ids
