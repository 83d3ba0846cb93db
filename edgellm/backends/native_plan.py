"""Captured decode plans for the native backend: one `model.forward` recorded as a list of C op records
over fixed buffers, then replayed by one `ed_plan_run` call per decode step (DESIGN.md principle 4). The
capture (Capture, the arena layout) and the decode steps that replay plans (CapturedDecode) are shared with
the numba backend, whose plans replay in one compiled call (numba_cpu.NumbaPlan).

Capture runs the forward once with every op executing eagerly and also recording its op record. Each
array an op receives must live in memory the plan can own or trusts: a plan input (tokens, positions,
sequence ids), the output of an earlier op of the capture, or a bound vector of the backend (weights,
the KV cache and the backend's tables are passed as addresses by the backend itself). Anything else
means the forward computed something in numpy between ops, which a replay would miss: the capture is
refused and the step runs eagerly. When it succeeds, every op output is given a place in one arena,
reusing memory between buffers whose lifetimes do not overlap, and the records are relocated there.
Limits: an arch that writes into an op's output in place (x += ...) is not detected.
"""

from __future__ import annotations

import bisect
import logging
import weakref
from collections import OrderedDict
from typing import Any

import numpy as np

from edgellm import quants

POINTERS = ("src0", "src1", "src2", "src3", "src4", "src5", "src6", "src7", "dst")
MATMUL = 1
GET_ROWS = 2
NO_BARRIER = 1  # ED_FLAG_NO_BARRIER
ALIGN = 64


def address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


class Regions:
    """Sorted, non-overlapping address ranges [start, end) with an owner each; lookup by bisection."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.items: list[tuple[int, int, Any]] = []

    def add(self, start: int, end: int, owner: Any) -> None:
        i = bisect.bisect_right(self.starts, start)
        self.starts.insert(i, start)
        self.items.insert(i, (start, end, owner))

    def find(self, start: int, end: int) -> tuple[int, int, Any] | None:
        """The region holding [start, end), if one does."""
        i = bisect.bisect_right(self.starts, start) - 1
        if i >= 0:
            s, e, owner = self.items[i]
            if s <= start and end <= e:
                return self.items[i]
        return None


class Capture:
    """Watches one model.forward: hands out op outputs, checks op inputs, records op fields."""

    def __init__(self, inputs: list[np.ndarray], trusted: Regions, n_ctx: int):
        self.n_ctx = n_ctx  # positions the plan will see: rope tables are sized for them
        self.trusted = trusted
        self.input_arrays = inputs
        self.inputs = Regions()
        for a in inputs:
            self.inputs.add(address(a), address(a) + a.nbytes, a)
        self.buffers = Regions()  # op outputs of this capture, owner = index into self.arrays
        self.arrays: list[np.ndarray] = []
        self.ops: list[dict] = []
        self.keep: list[Any] = []  # backend tables the records point into
        self.refused: str | None = None

    def alloc(self, shape: tuple[int, ...]) -> np.ndarray:
        a = np.empty(shape, np.float32)
        if a.nbytes:
            self.buffers.add(address(a), address(a) + a.nbytes, len(self.arrays))
        self.arrays.append(a)
        return a

    def check(self, a: np.ndarray, what: str) -> None:
        """Refuse the capture unless `a` lives in plan-owned or trusted memory."""
        if self.refused is not None or a.nbytes == 0:
            return
        start = address(a)
        end = start + a.nbytes
        if not a.flags.c_contiguous or not (
            self.buffers.find(start, end) or self.inputs.find(start, end) or self.trusted.find(start, end)
        ):
            self.refuse(f"{what} receives an array computed outside the backend's ops")

    def refuse(self, why: str) -> None:
        if self.refused is None:
            self.refused = why

    def record(self, fields: dict) -> None:
        self.ops.append(dict(fields))


def _vec_dot_type(t: int) -> int:
    v = quants.quant_type(t).vec_dot_type
    return int(v) if v is not None else -1


class BoundPlan:
    """What every captured plan holds: its inputs (tokens, positions, sequence ids), the tables it points
    into, weak ties to its model and the cache arrays it read, and one arena for the capture's buffers
    (laid out by _arena_layout; `relocate` maps a capture address into it, `result` is the forward's
    result there)."""

    def __init__(self, cap: Capture, result: np.ndarray, model: Any, kv: Any, addresses=None):
        self.model = weakref.ref(model)
        self.tokens, self.positions, self.seq_ids = cap.input_arrays
        self.batch = len(self.tokens)
        self.keep = cap.keep
        self.kv_arrays = kv.arrays()
        offsets, size = _arena_layout(cap, result, addresses or _c_addresses)
        self.arena = np.empty(max(size, ALIGN) // 4 + ALIGN, np.float32)
        base = (address(self.arena) + ALIGN - 1) // ALIGN * ALIGN

        def relocate(addr: int) -> int:
            hit = cap.buffers.find(addr, addr + 1)
            return addr if hit is None else base + offsets[hit[2]] + addr - hit[0]

        self.relocate = relocate
        self.result = self.view(result)

    def view(self, a: np.ndarray) -> np.ndarray:
        """Capture buffer `a`'s place in the arena, as a float32 array of its shape."""
        start = self.relocate(address(a)) - address(self.arena)  # a view of the arena keeps it alive
        return self.arena.view(np.uint8)[start : start + a.nbytes].view(np.float32).reshape(a.shape)

    def take_inputs(self, kv: Any, tokens, positions, seq_ids, vocab: int, step_check, *check_args) -> None:
        """Copy a step's inputs into the plan's arrays and check them before a replay:
        `step_check(*check_args)` gives 0 (fine), 1 (a token id outside the vocabulary of `vocab`) or 2 (a
        position the cache does not hold: the cache says which and why); then the sliding-window chunk
        (more rows of one sequence than a ring holds), which the step check does not cover."""
        self.tokens[:] = tokens
        self.positions[:] = positions
        self.seq_ids[:] = seq_ids
        bad = step_check(*check_args)
        if bad == 1:
            raise ValueError(f"token id outside the vocabulary of {vocab}")
        if bad:
            kv.slots(self.seq_ids, self.positions)  # raises, saying which row and why
            raise ValueError("a position outside the context or its KV blocks")
        if kv.ring_layers and self.batch > kv.window_chunk:
            kv.check_window_chunk(self.seq_ids)

    def matches(self, model: Any, kv: Any) -> bool:
        """Whether this plan still points at the model's weights and the cache's arrays."""
        now = kv.arrays()
        return (
            self.model() is model
            and len(now) == len(self.kv_arrays)
            and all(a is b for a, b in zip(now, self.kv_arrays))
        )


class Plan(BoundPlan):
    """A captured forward: C op records over one arena, its inputs, and where the logits land."""

    def __init__(self, ffi: Any, lib: Any, pool: Any, cap: Capture, result: np.ndarray, model: Any, kv: Any):
        super().__init__(cap, result, model, kv)
        self.ffi, self.lib, self.pool = ffi, lib, pool
        vocab = next(
            (op["i1"] for op in cap.ops if op["code"] == GET_ROWS and op["src1"] == address(self.tokens)), -1
        )
        i64 = [ffi.cast("int64_t *", address(a)) for a in (self.tokens, self.seq_ids, self.positions)]
        table = ffi.cast("int32_t *", address(kv.block_table))
        self.check_args = (i64[0], vocab, table, *kv.block_table.shape, kv.block_size, kv.n_ctx, *i64[1:])
        self.check_args += (len(self.tokens),)
        self.n_ops = len(cap.ops)
        self.ops = ffi.new("ed_op[]", max(1, self.n_ops))
        prev: dict | None = None
        for i, rec in enumerate(cap.ops):
            rec = dict(rec)
            for p in POINTERS:
                if rec.get(p):
                    rec[p] = self.relocate(rec[p])
            if rec["code"] == MATMUL and prev is not None and _same_activations(prev, rec):
                # x is already quantized in the pool's scratch by the matmul just before, which writes
                # only its own output: no need to wait for it
                rec["i1"], rec["flags"] = 1, rec.get("flags", 0) | NO_BARRIER
            self.ops[i] = rec
            prev = rec

    def run(self, kv: Any, tokens: np.ndarray, positions: np.ndarray, seq_ids: np.ndarray) -> np.ndarray:
        """One replay: copy the inputs in, check them, run every op in one C call. Returns the logits
        (B, V) in the plan's own memory: valid until this plan runs again (copy them to keep them).

        Every Python line here runs with caches cold from the last step's weights (~1 us each): keep few."""
        self.take_inputs(
            kv, tokens, positions, seq_ids, self.check_args[1], self.lib.ed_step_check, *self.check_args
        )
        if self.lib.ed_plan_run(self.pool, self.ops, self.n_ops) != 0:
            raise RuntimeError("native plan rejected by the runtime")
        return self.result


def _same_activations(prev: dict, rec: dict) -> bool:
    vt = _vec_dot_type(rec["type"])
    return (
        prev["code"] == MATMUL
        and prev["src1"] == rec["src1"]
        and (prev["n"], prev["k"]) == (rec["n"], rec["k"])
        and _vec_dot_type(prev["type"]) == vt
        and vt not in (-1, int(quants.T.F32))
    )


def _c_addresses(rec: dict) -> list[int]:
    return [rec.get(p) for p in POINTERS]


def _arena_layout(cap: Capture, result: np.ndarray, addresses=_c_addresses) -> tuple[list[int], int]:
    """Byte offsets of every capture buffer in one arena: first fit among the buffers alive at the same
    time (alive from the op that writes it to the last op that reads it; the result to the end).
    `addresses(record)`: the addresses a record holds."""
    n = len(cap.arrays)
    first, last = [len(cap.ops)] * n, [-1] * n
    for i, rec in enumerate(cap.ops):
        for addr in addresses(rec):
            hit = cap.buffers.find(addr, addr + 1) if addr else None
            if hit is not None:
                b = hit[2]
                first[b], last[b] = min(first[b], i), max(last[b], i)
    hit = cap.buffers.find(address(result), address(result) + 1)
    last[hit[2]] = len(cap.ops) + 1
    offsets, placed, size = [0] * n, [], 0
    for b in sorted(range(n), key=lambda b: first[b]):
        if last[b] < 0:
            continue  # never used
        nbytes = (cap.arrays[b].nbytes + ALIGN - 1) // ALIGN * ALIGN
        live = sorted((o, o + s) for o, s, f, l in placed if l >= first[b] and f <= last[b])
        off = 0
        for lo, hi in live:
            if off + nbytes <= lo:
                break
            off = max(off, hi)
        offsets[b] = off
        placed.append((off, nbytes, first[b], last[b]))
        size = max(size, off + nbytes)
    return offsets, size


log = logging.getLogger(__name__)
_LOGGED: set[str] = set()
MAX_PLANS = 16  # captured plans kept per backend, most recently used first (each holds an arena)


class CapturedDecode:
    """decode_step for a host backend that captures plans: the first step of each (cache, model, batch
    size) runs eagerly while its ops are recorded (`self._cap` set: the backend's ops allocate outputs
    with it, check inputs and record themselves), later ones replay the plan. The backend provides
    `_trusted` (Regions of memory it bound), `_new_plan(cap, logits, model, kv)` and calls
    `_init_plans()` in its __init__."""

    name: str

    def _init_plans(self) -> None:
        self._cap: Capture | None = None
        self._plans: OrderedDict[tuple[int, int, int], Any] = OrderedDict()  # (kv, model, B) ids -> plan
        self._last: Any = None  # the plan of the last decode step

    def decode_step(
        self, model: Any, tokens: np.ndarray, positions: np.ndarray, seq_ids: np.ndarray, kv: Any
    ) -> np.ndarray:
        """model.forward(tokens, positions, seq_ids, kv) for B decode rows, replayed from a plan captured
        on the first step of each batch size (the first step runs eagerly while it is recorded)."""
        last = self._last  # the common case: the same cache, model and batch size as the step before
        if last is not None and last.batch == len(tokens) and last.matches(model, kv):
            return last.run(kv, tokens, positions, seq_ids)
        if self._cap is not None:  # a forward inside a capture (never expected): just run it
            return model.forward(tokens, positions, seq_ids, kv)
        key = (id(kv), id(model), len(tokens))
        plan = self._plans.get(key)
        if plan is None or not plan.matches(model, kv):  # (ids of dead objects are reused)
            plan, logits = self._capture(model, tokens, positions, seq_ids, kv)
            self._plans[key] = plan
            if len(self._plans) > MAX_PLANS:
                self._plans.popitem(last=False)
            return logits
        self._plans.move_to_end(key)
        if isinstance(plan, _Refused):
            return model.forward(tokens, positions, seq_ids, kv)
        self._last = plan
        return plan.run(kv, tokens, positions, seq_ids)

    def captured(self, model: Any, kv: Any, batch: int) -> Any:
        """The plan replaying model's decode steps of `batch` rows on kv, if one was captured."""
        plan = self._plans.get((id(kv), id(model), batch))
        live = plan is not None and not isinstance(plan, _Refused) and plan.matches(model, kv)
        return plan if live else None

    def _new_plan(self, cap: Capture, logits: np.ndarray, model: Any, kv: Any) -> Any:
        raise NotImplementedError

    def _out(self, shape: tuple[int, ...]) -> np.ndarray:
        """An op's output: the capture's buffer inside one, else a new array."""
        return self._cap.alloc(shape) if self._cap is not None else np.empty(shape, np.float32)

    def _eager_only(self, why: str) -> None:
        """An op a plan cannot replay: inside a capture, refuse it (the steps then run op by op)."""
        if self._cap is not None:
            self._cap.refuse(why)

    def _unreplayable(self, cap: Capture) -> str | None:
        """Why this backend's plans cannot replay a whole capture (None: they can)."""
        return None

    def _capture(self, model: Any, tokens, positions, seq_ids, kv) -> tuple[Any, np.ndarray]:
        inputs = [np.array(a, dtype=np.int64) for a in (tokens, positions, seq_ids)]
        self._cap = cap = Capture(inputs, self._trusted, int(kv.n_ctx))
        try:
            logits = model.forward(inputs[0], inputs[1], inputs[2], kv)
        finally:
            self._cap = None
        if cap.refused is None and not (
            isinstance(logits, np.ndarray)
            and logits.flags.c_contiguous
            and cap.buffers.find(address(logits), address(logits) + logits.nbytes)
        ):
            cap.refuse("the forward's result is not the output of a backend op")
        if cap.refused is None and (why := self._unreplayable(cap)):
            cap.refuse(why)
        if cap.refused is not None:
            msg = f"{self.name}: {type(model).__name__} decode steps run op by op: {cap.refused}"
            if msg not in _LOGGED:
                _LOGGED.add(msg)
                log.warning(msg)
            return _Refused(model), logits
        return self._new_plan(cap, logits, model, kv), logits


class _Refused:
    """A model whose forward cannot be captured: its decode steps run op by op."""

    def __init__(self, model: Any):
        self.model = weakref.ref(model)

    def matches(self, model: Any, kv: Any) -> bool:
        return self.model() is model
