"""The numba backend: quantized matmuls on the weights as stored, JIT-compiled, for machines without a
C compiler.

Weights stay the raw blocks of the mmapped file (no float32 copy). A matmul quantizes its activation
rows once to the weight's ggml vec_dot type and computes every output as ggml-cpu's scalar dot product
does (numba_kernels/), so results match the reference backend to float-summation order and are the same
for any thread count. RMSNorm, RoPE, attention over the (reference's paged float16) KV cache and the GLUs are
the reference's float32 operations compiled (numba_kernels/ops.py); the embedding lookup stays numpy.
Kernels compile when the backend is made (ops), the first weight of their family is bound (matmuls) or
the first decode step is captured (every family, then the plans' replay), or on `warmup()` (everything),
which a benchmark calls before timing. Numba caches them on disk, so a second process pays no JIT.

Decode steps are captured once per batch size as plans (native_plan.CapturedDecode, as the native
backend does) and replayed by one compiled call (numba_kernels/plan.py): the same kernels on the same
memory, without the ~450 Python calls a step of op-by-op dispatch costs.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgellm import quants
from edgellm.backends.base import BackendUnavailable, RopeSpec, RopeTables, gelu_table_f32
from edgellm.backends.cpu import physical_cores
from edgellm.backends.host import HostBackend
from edgellm.backends.native_plan import BoundPlan, Capture, CapturedDecode, Regions, address
from edgellm.backends.paged_kv import KVCache
from edgellm.backends.reference import RefWeight
from edgellm.gguf import QTensor

try:
    import numba

    from edgellm.backends import numba_kernels as K
    from edgellm.backends.numba_kernels import ops as O
    from edgellm.backends.numba_kernels import plan as P
except ImportError as e:  # pragma: no cover - numba is a dependency, but say why if it is missing
    numba = None
    _IMPORT_ERROR = str(e)

# Below this many multiply-adds a matmul runs on one thread: waking the pool costs more than it saves.
PARALLEL_MIN_MACS = 1 << 16


@dataclass
class NumbaWeight(RefWeight):
    """A bound weight: the raw (rows, row bytes) blocks, read-only, and its kernel (None: reference)."""

    raw: np.ndarray | None = None
    family: str | None = None
    kind: int = -1


def _rows(x: np.ndarray) -> np.ndarray:
    """x as a C-contiguous, writable (rows, last axis) float32 array."""
    x2 = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, x.shape[-1])
    return x2 if x2.flags.writeable else x2.copy()


def _flat(x: np.ndarray) -> np.ndarray:
    f = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    return f if f.flags.writeable else f.copy()


_NO_WEIGHT = np.ones(1, np.float32)
_ALL_TYPES = frozenset(int(t) for t in quants.supported_types())
# numba.set_num_threads is per calling thread (a server loads the model in one thread and runs it in
# another), so the size last set is remembered per thread; setting it costs ~3 us: not on every call
_THREADS = threading.local()


def _use_threads(n: int) -> None:
    numba.set_num_threads(n)
    _THREADS.n = n


class NumbaBackend(CapturedDecode, HostBackend):
    name = "numba"

    @staticmethod
    def kernels_cached() -> bool:
        """Whether numba's on-disk cache already holds the kernels (else the first use compiles ~1 min)."""

        cache = K._CACHE  # the folder Numba caches the package's kernels in (None: caching off)
        return cache is not None and all(
            next(cache.glob(f"*{f}*.nbi"), None) for f in ("matmul_legacy", "_replay")
        )

    def __init__(self, threads: int | None = None):
        if numba is None:
            raise BackendUnavailable(f"numba is not importable ({_IMPORT_ERROR})")
        super().__init__()
        cores = physical_cores()
        limit = numba.config.NUMBA_NUM_THREADS
        self.threads = max(1, min(int(threads) if threads else cores, limit))
        _use_threads(self.threads)
        self._ropes = RopeTables()
        self._trusted = Regions()  # bound vectors: memory a capture may read (weights, cache: by address)
        self._init_plans()
        K.compile_family("ops")

    def kernel_types(self, op: str) -> frozenset[int]:
        # get_rows dequantizes rows with numpy (quants.py) for every known type: no float32 copy
        return frozenset(int(t) for t in K.KINDS) if op == "matmul" else _ALL_TYPES

    def bind(self, t: QTensor) -> NumbaWeight:
        family, kind = K.KINDS.get(t.type, (None, -1))
        raw = None
        if family is not None and t.data.ndim == 2:
            raw = t.data.view()
            raw.flags.writeable = False  # one compiled signature for mmapped and in-memory weights
            K.compile_family(family)
        else:
            family = None
        return NumbaWeight(t, raw=raw, family=family, kind=kind)

    def vector(self, t: QTensor) -> np.ndarray:
        v = np.ascontiguousarray(self.fallback.vector(t), np.float32)
        if v.nbytes:  # the region keeps v alive: its memory can never be a later array's
            self._trusted.add(address(v), address(v) + v.nbytes, v)
        return v

    def warmup(self) -> None:
        """Compile (or load from cache) every kernel family and the decode plans' replay now."""
        K.compile_family("plan")

    # -- plumbing: each op runs now, and inside a capture also records itself for the plan ---------------
    def _record(self, what: str, fields: list, floats: tuple = ()) -> None:
        """Inside a capture: one plan record (numba_kernels/plan.py's columns). Arrays in `fields` must
        be the capture's or bound memory (checked) and become addresses the plan relocates; ints are
        kept (the addresses of the cache and the backend's tables are passed as ints)."""
        cap = self._cap
        if cap is None:
            return
        row, pointers = [], []
        for i, f in enumerate(fields):
            if isinstance(f, np.ndarray):
                cap.check(f, what)
                row.append(address(f))
                pointers.append(i)
            else:
                row.append(int(f))
        cap.record({"row": row, "pointers": pointers, "floats": [float(f) for f in floats]})

    def _new_plan(self, cap: Capture, logits: np.ndarray, model: Any, kv: Any) -> NumbaPlan:
        K.compile_family("plan")  # (on the first plan of a process; cached on disk)
        return NumbaPlan(self, cap, logits, model, kv)

    # -- ops ---------------------------------------------------------------------------------------------
    def _unreplayable(self, cap: Capture) -> str | None:
        if not cap.ops or "get_rows" not in cap.ops[0]:  # NumbaPlan runs it in numpy, then the rest
            return "the forward does not begin with the embedding lookup"
        return None

    def get_rows(self, w, ids):
        rows = self.fallback.get_rows(w, ids)
        cap = self._cap
        if cap is None:
            return rows
        # a plan runs the embedding lookup in numpy before its compiled ops: only as the first op, of the
        # plan's token ids
        if cap.ops or ids is not cap.input_arrays[0]:
            cap.refuse("get_rows other than the first op on the step's tokens")
            return rows
        out = self._out(rows.shape)
        out[...] = rows
        cap.record({"row": [0, address(out)], "pointers": [1], "floats": [], "get_rows": w})
        return out

    def rms_norm(self, x: np.ndarray, weight: np.ndarray | None, eps: float) -> np.ndarray:
        x2 = _rows(x)
        n, d = x2.shape
        out = self._out((n, d))
        w = np.ascontiguousarray(weight, np.float32) if weight is not None else None
        if w is not None and w.shape != (d,):
            raise ValueError(f"rms_norm: weight of shape {w.shape} for rows of {d}")
        self._record("rms_norm", [P.RMS_NORM, x2, n, d, w if w is not None else 0, out], (eps,))
        O.rms_norm(x2, w if w is not None else _NO_WEIGHT, w is not None, float(eps), out)
        return out.reshape(x.shape)

    def rope(self, x: np.ndarray, positions: np.ndarray, spec: RopeSpec) -> np.ndarray:
        pos = np.ascontiguousarray(positions, np.int64)
        if pos.size and pos.min() < 0:
            raise ValueError(f"rope: negative position {int(pos.min())}")
        x3 = np.ascontiguousarray(x, np.float32)
        n, heads, dh = x3.shape
        if spec.n_dims > dh or spec.n_dims % 2:
            raise ValueError(f"rope: {spec.n_dims} rotated dims in heads of {dh}")
        need = int(pos.max(initial=0)) + 1  # rows 0 .. max: the kernel indexes them
        if self._cap is not None:  # a plan sees any position of the context
            need = max(need, self._cap.n_ctx)
        cos, sin = self._ropes.get(spec, need)
        out = self._out(x3.shape)
        if self._cap is not None:
            self._cap.keep += [cos, sin]
            fields = [P.ROPE, x3, n, heads, dh, address(cos), address(sin), *cos.shape, pos, spec.n_dims]
            self._record("rope", [*fields, int(spec.neox), out])
        O.rope(x3, cos, sin, pos, spec.n_dims, spec.neox, out)
        return out

    def attention(self, q, k, v, kv: KVCache, layer, seq_ids, positions, scale, window=None, softcap=None):
        positions = np.ascontiguousarray(positions, np.int64)
        seq_ids = np.ascontiguousarray(seq_ids, np.int64)
        q, k, v = (np.ascontiguousarray(a, np.float32) for a in (q, k, v))
        kv.check(seq_ids, positions)  # the kernel reads and writes unchecked
        kc, vc, table = kv.layer_view(layer)
        n, n_head, dh = q.shape
        if k.shape != (n, k.shape[1], dh) or v.shape != k.shape or n_head % k.shape[1]:
            raise ValueError(f"attention: q {q.shape}, k {k.shape}, v {v.shape}")
        out = self._out((n, n_head, v.shape[-1]))
        k8, v8 = kv.type_k == "q8_0", kv.type_v == "q8_0"
        quantized = (k8, v8) if k8 or v8 else ()  # attention_q8 takes the two flags
        # the (token, kv head) pairs on Numba's threads where the work pays for waking them (plan.py's
        # _attention decides the same way at every replay)
        keys = int(positions.sum()) + len(positions) if window is None else len(positions) * int(window)
        parallel = (
            () if quantized else (self.threads > 1 and keys * q.shape[1] * q.shape[2] >= PARALLEL_MIN_MACS,)
        )
        if self._cap is not None:
            kinds = (P.K_Q8 if k8 else 0) | (P.V_Q8 if v8 else 0)
            fields = [P.ATTENTION, q, kinds, k, v, address(kc), address(vc)]
            fields += [n, n_head, k.shape[1], dh, kc.shape[0], kc.shape[-1], address(table), *table.shape]
            fields += [kv.block_size, seq_ids, positions, out, int(window or 0)]
            fields += [PARALLEL_MIN_MACS if self.threads > 1 else 0, vc.shape[-1]]
            self._record("attention", fields, (scale, softcap or 0.0))
        if parallel and parallel[0] and getattr(_THREADS, "n", 0) != self.threads:
            _use_threads(self.threads)
        (O.attention_q8 if quantized else O.attention)(
            q,
            k,
            v,
            kc if k8 else kc.view(np.uint16),
            vc if v8 else vc.view(np.uint16),
            *quantized,
            table,
            kv.block_size,
            seq_ids,
            positions,
            float(scale),
            int(window or 0),
            float(softcap or 0.0),
            out,
            *parallel,
        )
        return out

    def _binary(self, code: int, a: np.ndarray, b: np.ndarray, what: str, *extra: Any) -> np.ndarray:
        a2, b2 = _flat(a), _flat(b)
        if a.shape != b.shape:
            raise ValueError(f"{what}: shapes {a.shape} and {b.shape}")
        out = self._out(a.shape)
        flat = out.reshape(-1)
        self._record(what, [code, a2, b2, flat, a2.size, *(address(e) for e in extra)])
        fn = {P.SILU_MUL: O.silu_mul, P.GELU_MUL: O.gelu_mul, P.ADD: O.add}[code]
        fn(a2, b2, *extra, flat)
        return out

    def silu_mul(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        return self._binary(P.SILU_MUL, gate, up, "silu_mul")

    def gelu_mul(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        return self._binary(P.GELU_MUL, gate, up, "gelu_mul", gelu_table_f32())

    def add(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        if np.shape(b) == np.shape(a):
            return self._binary(P.ADD, a, b, "add")
        if np.ndim(b) != 1 or np.ndim(a) == 0 or np.shape(b)[0] != np.shape(a)[-1]:
            self._eager_only(f"add of shapes {np.shape(a)} and {np.shape(b)}")
            return super().add(a, b)
        a2, b1 = _rows(a), _flat(b)  # a bias: b added to every row of a
        out = self._out(a2.shape)
        self._record("add", [P.ADD_ROW, a2, b1, out, *a2.shape])
        O.add_row(a2, b1, out)
        return out.reshape(np.shape(a))

    def _unary(self, code: int, x: np.ndarray, f: float, what: str) -> np.ndarray:
        x1 = _flat(x)
        out = self._out(np.shape(x))
        flat = out.reshape(-1)
        self._record(what, [code, x1, 0, flat, x1.size], (f,))
        (O.scale if code == P.SCALE else O.softcap)(x1, float(f), flat)
        return out

    def scale(self, x: np.ndarray, s: float) -> np.ndarray:
        return self._unary(P.SCALE, x, s, "scale")

    def softcap(self, x: np.ndarray, cap: float) -> np.ndarray:
        return self._unary(P.SOFTCAP, x, cap, "softcap")

    def columns(self, x: np.ndarray, start: int, stop: int) -> np.ndarray:
        x2 = np.ascontiguousarray(x, np.float32)
        rows, width = x2.shape
        if not 0 <= start <= stop <= width:
            raise ValueError(f"columns {start}:{stop} of rows of {width}")
        out = self._out((rows, stop - start))
        self._record("columns", [P.COLUMNS, x2, 0, out, rows, width, start, stop])
        O.columns(x2, start, out)
        return out

    def take_rows(self, x: Any, rows: np.ndarray) -> Any:
        self._eager_only("take_rows")
        return super().take_rows(x, rows)

    def matmul(self, w: NumbaWeight, x: np.ndarray) -> np.ndarray:
        if w.family is None:  # a type without a Numba kernel: the fallback's dequantized product
            self._eager_only(f"matmul of a {w.qt.type.name} tensor has no numba kernel")
            return self.fallback.matmul(w, x)
        raw = w.raw
        lead = x.shape[:-1]
        x2 = _rows(x)  # the kernels are compiled for C-contiguous, writable activations only
        n, k = x2.shape
        if k != w.qt.ne[0]:
            raise ValueError(f"matmul: x has {k} columns, the weight {w.qt.ne[0]}")
        m = raw.shape[0]
        out = self._out((n, m))
        chunks = min(self.threads, m) if m * k * n >= PARALLEL_MIN_MACS else 1
        if self._cap is not None:
            family = {"legacy": P.LEGACY, "kquant": P.KQUANT, "float": P.FLOAT}[w.family]
            fields = [P.MATMUL, family, w.kind, address(raw), m, raw.shape[1], x2, n, k, out, chunks]
            self._record("matmul", fields)
        if chunks > 1 and getattr(_THREADS, "n", 0) != self.threads:  # another thread or backend
            _use_threads(self.threads)
        K.MATMULS[w.family](w.kind, raw, x2, out, chunks)
        return out.reshape(*lead, m)


class NumbaPlan(BoundPlan):
    """A captured decode step: the embedding lookup (numpy, on the step's tokens), then every other op as
    one table of records that plan.replay runs in one compiled call, over one arena."""

    def __init__(self, backend: NumbaBackend, cap: Capture, result: np.ndarray, model: Any, kv: Any):
        super().__init__(cap, result, model, kv, lambda rec: [rec["row"][i] for i in rec["pointers"]])
        self.threads = backend.threads
        self.get_rows = backend.fallback.get_rows
        first = cap.ops[0] if cap.ops else {}
        if "get_rows" not in first:
            raise ValueError("a numba plan starts with the embedding lookup")  # _unreplayable refuses others
        self.embedding = first["get_rows"]
        self.vocab = self.embedding.qt.ne[1]
        self.embedded = self.view(cap.arrays[cap.buffers.find(first["row"][1], first["row"][1] + 1)[2]])
        ops = cap.ops[1:]
        self.records = np.zeros((len(ops), P.WIDTH), np.int64)
        self.floats = np.zeros((len(ops), P.F_WIDTH), np.float64)
        for i, rec in enumerate(ops):
            row = list(rec["row"])
            for j in rec["pointers"]:
                row[j] = self.relocate(row[j])
            self.records[i, : len(row)] = row
            self.floats[i, : len(rec["floats"])] = rec["floats"]
        self.check_args = (kv.block_table, kv.block_size, kv.n_ctx, self.seq_ids, self.positions)

    def run(self, kv: Any, tokens: np.ndarray, positions: np.ndarray, seq_ids: np.ndarray) -> np.ndarray:
        """One replay: copy the inputs in, check them, look the tokens up, run every other op in one
        compiled call. Returns the logits (B, V) in the plan's own memory: valid until this plan runs
        again (copy them to keep them)."""
        self.take_inputs(
            kv,
            tokens,
            positions,
            seq_ids,
            self.vocab,
            P.step_check,
            self.tokens,
            self.vocab,
            *self.check_args,
        )
        self.embedded[...] = self.get_rows(self.embedding, self.tokens)
        if getattr(_THREADS, "n", 0) != self.threads:
            _use_threads(self.threads)
        P.replay(self.records, self.floats)
        return self.result
