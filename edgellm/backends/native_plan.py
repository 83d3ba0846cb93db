"""Captured decode plans for the native backend: one `model.forward` recorded as a list of C op records
over fixed buffers, then replayed by one `ed_plan_run` call per decode step (DESIGN.md principle 4).

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
import weakref
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


class Plan:
    """A captured forward: op records over one arena, its inputs, and where the logits land."""

    def __init__(self, ffi: Any, lib: Any, pool: Any, cap: Capture, result: np.ndarray, model: Any, kv: Any):
        self.ffi, self.lib, self.pool = ffi, lib, pool
        self.model = weakref.ref(model)
        self.tokens, self.positions, self.seq_ids = cap.input_arrays
        self.batch = len(self.tokens)
        self.keep = cap.keep
        self.kv_arrays = kv.arrays()
        vocab = next(
            (op["i1"] for op in cap.ops if op["code"] == GET_ROWS and op["src1"] == address(self.tokens)), -1
        )
        i64 = [ffi.cast("int64_t *", address(a)) for a in (self.tokens, self.seq_ids, self.positions)]
        table = ffi.cast("int32_t *", address(kv.block_table))
        self.check_args = (i64[0], vocab, table, *kv.block_table.shape, kv.block_size, kv.n_ctx, *i64[1:])
        self.check_args += (len(self.tokens),)
        offsets, size = _arena_layout(cap, result)
        self.arena = np.empty(max(size, ALIGN) // 4 + ALIGN, np.float32)
        base = (address(self.arena) + ALIGN - 1) // ALIGN * ALIGN

        def relocate(addr: int) -> int:
            hit = cap.buffers.find(addr, addr + 1)
            return addr if hit is None else base + offsets[hit[2]] + addr - hit[0]

        self.n_ops = len(cap.ops)
        self.ops = ffi.new("ed_op[]", max(1, self.n_ops))
        prev: dict | None = None
        for i, rec in enumerate(cap.ops):
            rec = dict(rec)
            for p in POINTERS:
                if rec.get(p):
                    rec[p] = relocate(rec[p])
            if rec["code"] == MATMUL and prev is not None and _same_activations(prev, rec):
                # x is already quantized in the pool's scratch by the matmul just before, which writes
                # only its own output: no need to wait for it
                rec["i1"], rec["flags"] = 1, rec.get("flags", 0) | NO_BARRIER
            self.ops[i] = rec
            prev = rec
        start = relocate(address(result)) - address(self.arena)  # a view of the arena keeps it alive
        self.result = self.arena.view(np.uint8)[start : start + result.nbytes].view(np.float32)
        self.result = self.result.reshape(result.shape)

    def matches(self, model: Any, kv: Any) -> bool:
        """Whether this plan still points at the model's weights and the cache's arrays."""
        now = kv.arrays()
        return (
            self.model() is model
            and len(now) == len(self.kv_arrays)
            and all(a is b for a, b in zip(now, self.kv_arrays))
        )

    def run(self, kv: Any, tokens: np.ndarray, positions: np.ndarray, seq_ids: np.ndarray) -> np.ndarray:
        """One replay: copy the inputs in, check them, run every op in one C call. Returns the logits
        (B, V) in the plan's own memory: valid until this plan runs again (copy them to keep them).

        Every Python line here runs with caches cold from the last step's weights (~1 us each): keep few."""
        self.tokens[:] = tokens
        self.positions[:] = positions
        self.seq_ids[:] = seq_ids
        bad = self.lib.ed_step_check(*self.check_args)
        if bad == 1:
            raise ValueError(f"token id outside the vocabulary of {self.check_args[1]}")
        if bad:
            kv.slots(self.seq_ids, self.positions)  # raises, saying which row and why
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


def _arena_layout(cap: Capture, result: np.ndarray) -> tuple[list[int], int]:
    """Byte offsets of every capture buffer in one arena: first fit among the buffers alive at the same
    time (alive from the op that writes it to the last op that reads it; the result to the end)."""
    n = len(cap.arrays)
    first, last = [len(cap.ops)] * n, [-1] * n
    for i, rec in enumerate(cap.ops):
        for p in POINTERS:
            addr = rec.get(p)
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
