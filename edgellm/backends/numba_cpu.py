"""The numba backend: quantized matmuls on the weights as stored, JIT-compiled, for machines without a
C compiler.

Weights stay the raw blocks of the mmapped file (no float32 copy). A matmul quantizes its activation
rows once to the weight's ggml vec_dot type and computes every output as ggml-cpu's scalar dot product
does (numba_kernels/), so results match the reference backend to float-summation order and are the same
for any thread count. RMSNorm, RoPE, attention over the (reference's paged float16) KV cache and the GLUs are
the reference's float32 operations compiled (numba_kernels/ops.py); embedding lookup and add stay numpy.
Kernels compile when the backend is made (ops) or the first weight of their family is bound (matmuls),
or on `warmup()`; never inside a timed step. Numba caches them on disk, so a second process pays no JIT.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgellm import quants
from edgellm.backends.base import BackendUnavailable, RopeSpec, RopeTables, gelu_table_f32
from edgellm.backends.cpu import physical_cores
from edgellm.backends.host import HostBackend
from edgellm.backends.paged_kv import KVCache
from edgellm.backends.reference import RefWeight
from edgellm.gguf import QTensor

try:
    import numba

    from edgellm.backends import numba_kernels as K
    from edgellm.backends.numba_kernels import ops as O
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


class NumbaBackend(HostBackend):
    name = "numba"

    @staticmethod
    def kernels_cached() -> bool:
        """Whether numba's on-disk cache already holds the kernels (else the first use compiles ~1 min)."""

        dirs = [Path(K.__file__).parent / "__pycache__"]
        if os.environ.get("NUMBA_CACHE_DIR"):
            dirs.append(Path(os.environ["NUMBA_CACHE_DIR"]))
        return any(next(d.rglob("*matmul_legacy*.nbi"), None) for d in dirs if d.is_dir())

    def __init__(self, threads: int | None = None):
        if numba is None:
            raise BackendUnavailable(f"numba is not importable ({_IMPORT_ERROR})")
        super().__init__()
        cores = physical_cores()
        limit = numba.config.NUMBA_NUM_THREADS
        self.threads = max(1, min(int(threads) if threads else cores, limit))
        _use_threads(self.threads)
        self._ropes = RopeTables()
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

    def warmup(self) -> None:
        """Compile (or load from cache) every kernel family now."""
        for family in K.MATMULS:
            K.compile_family(family)
        K.compile_family("ops")

    # -- the reference's other ops, compiled -----------------------------------------------------------
    def rms_norm(self, x: np.ndarray, weight: np.ndarray | None, eps: float) -> np.ndarray:
        x2 = _rows(x)
        out = np.empty_like(x2)
        w = weight if weight is not None else _NO_WEIGHT
        O.rms_norm(x2, np.ascontiguousarray(w, np.float32), weight is not None, float(eps), out)
        return out.reshape(x.shape)

    def rope(self, x: np.ndarray, positions: np.ndarray, spec: RopeSpec) -> np.ndarray:
        pos = np.ascontiguousarray(positions, np.int64)
        if pos.size and pos.min() < 0:
            raise ValueError(f"rope: negative position {int(pos.min())}")
        cos, sin = self._ropes.get(
            spec, int(pos.max(initial=0)) + 1
        )  # rows 0 .. max: the kernel indexes them
        x3 = np.ascontiguousarray(x, np.float32)
        out = np.empty_like(x3)
        O.rope(x3, cos, sin, pos, spec.n_dims, spec.neox, out)
        return out

    def attention(self, q, k, v, kv: KVCache, layer, seq_ids, positions, scale, window=None, softcap=None):
        positions = np.asarray(positions, np.int64)
        kv.check(seq_ids, positions)  # the kernel reads and writes unchecked
        kc, vc, table = kv.layer_view(layer)
        out = np.empty((q.shape[0], q.shape[1], v.shape[-1]), np.float32)
        k8, v8 = kv.type_k == "q8_0", kv.type_v == "q8_0"
        quantized = (k8, v8) if k8 or v8 else ()  # attention_q8 takes the two flags
        # the (token, kv head) pairs on Numba's threads where the work pays for waking them
        keys = int(positions.sum()) + len(positions) if window is None else len(positions) * int(window)
        parallel = (
            () if quantized else (self.threads > 1 and keys * q.shape[1] * q.shape[2] >= PARALLEL_MIN_MACS,)
        )
        if parallel and parallel[0] and getattr(_THREADS, "n", 0) != self.threads:
            _use_threads(self.threads)
        (O.attention_q8 if quantized else O.attention)(
            np.ascontiguousarray(q, np.float32),
            np.ascontiguousarray(k, np.float32),
            np.ascontiguousarray(v, np.float32),
            kc if k8 else kc.view(np.uint16),
            vc if v8 else vc.view(np.uint16),
            *quantized,
            table,
            kv.block_size,
            np.asarray(seq_ids, np.int64),
            positions,
            float(scale),
            int(window or 0),
            float(softcap or 0.0),
            out,
            *parallel,
        )
        return out

    def silu_mul(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        out = np.empty(gate.shape, np.float32)
        O.silu_mul(_flat(gate), _flat(up), out.reshape(-1))
        return out

    def gelu_mul(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        out = np.empty(gate.shape, np.float32)
        O.gelu_mul(_flat(gate), _flat(up), gelu_table_f32(), out.reshape(-1))
        return out

    def matmul(self, w: NumbaWeight, x: np.ndarray) -> np.ndarray:
        if w.family is None:  # a type without a Numba kernel: the fallback's dequantized product
            return self.fallback.matmul(w, x)
        raw = w.raw
        lead = x.shape[:-1]
        x2 = _rows(x)  # the kernels are compiled for C-contiguous, writable activations only
        n, k = x2.shape
        m = raw.shape[0]
        out = np.empty((n, m), np.float32)
        chunks = min(self.threads, m) if m * k * n >= PARALLEL_MIN_MACS else 1
        if chunks > 1 and getattr(_THREADS, "n", 0) != self.threads:  # another thread or backend
            _use_threads(self.threads)
        K.MATMULS[w.family](w.kind, raw, x2, out, chunks)
        return out.reshape(*lead, m)
