"""The native backend: every op in C (native/runtime/, native/kernels/) through the cffi extension
`edgellm._native`, on a persistent thread pool; decode steps captured once as plans and replayed in one C
call each (native_plan.py).

Weights stay the raw blocks of the mmapped file. A matmul quantizes its activation rows once to the
weight's ggml vec_dot type and runs the kernels' dot products in a tiled loop; the other ops are the
reference backend's float32 operations in C. A weight type without a kernel goes to the composed fallback
(host.py), and the load report says so. Work is split across threads by output rows only, so results are
the same bits for any thread count, and a replayed plan gives the same bits as the ops run one by one.
"""

from __future__ import annotations

import logging
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgellm import quants
from edgellm.backends.base import BackendUnavailable, RopeSpec, RopeTables, gelu_table_f32
from edgellm.backends.cpu import physical_cores
from edgellm.backends.host import HostBackend
from edgellm.backends.native_plan import Capture, CapturedDecode, Plan, Regions, address
from edgellm.backends.paged_kv import KVCache, row_bytes
from edgellm.backends.reference import RefWeight
from edgellm.gguf import QTensor
from edgellm.hugepages import HugeArena

log = logging.getLogger(__name__)

_IMPORT_ERROR = ""
try:
    from edgellm._native import ffi, lib
except ImportError as e:  # no C compiler at install time, or a build for another platform
    ffi = lib = None
    _IMPORT_ERROR = f"the C extension edgellm._native is not built ({e}); reinstall with a C compiler"

_KNOWN_TYPES = {int(t) for t in quants.supported_types()}

# op codes of native/runtime/ed_runtime.h
MATMUL, GET_ROWS, RMS_NORM, ROPE, ATTENTION, SILU_MUL, GELU_MUL, ADD, SCALE, SOFTCAP, COPY = range(1, 12)
X16 = 2  # ED_FLAG_X16: a matmul's weight is repacked
REPACK_STEP_BYTES = 4 << 20  # rows repacked (and their file pages let go) at a time
F16_KIND, Q8_0_KIND = 1, 8  # an ATTENTION op's cache kinds (ggml type ids; ed_runtime.h)


def available() -> str | None:
    """None if the native backend can run here, else why not (one line)."""
    if lib is None:
        return _IMPORT_ERROR
    if lib.ed_runtime_level() < 0:
        return "the native kernels have no code path for this CPU"
    return None


def paged(kv: Any, layer: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """k, v (slots, Hkv, Dh) float16 of one layer, its block table (seqs, blocks) int32 and block_size of
    a reference.KVCache (the layout the C attention reads)."""
    k, v, table = kv.layer_view(layer)
    return k, v, table, kv.block_size


@dataclass
class NativeWeight(RefWeight):
    """A bound weight: the raw (rows, row bytes) blocks and their address; which C ops take its type."""

    raw: np.ndarray | None = None
    ptr: int = 0
    rows: int = 0
    row_bytes: int = 0
    matmul_ok: bool = False
    get_rows_ok: bool = False
    x16: np.ndarray | None = None  # the rows repacked for the level's x16 GEMM (matmul reads these)


def _in_file(mf: Any, t: QTensor) -> bool:
    """Whether tensor t's rows are a view of file mf's bytes."""
    base = np.frombuffer(mf.buffer, np.uint8)
    lo = address(t.data)  # (bound rows are C-contiguous)
    return address(base) <= lo and lo + t.data.nbytes <= address(base) + base.nbytes


class NativeBackend(CapturedDecode, HostBackend):
    name = "native"

    def __init__(self, threads: int | None = None):
        why = available()
        if why is not None:
            raise BackendUnavailable(why)
        super().__init__()
        cores = physical_cores()
        self.threads = max(1, min(int(threads) if threads else cores, cores))
        self._pool = ffi.gc(lib.ed_pool_new(self.threads), lib.ed_pool_free)
        if self._pool == ffi.NULL:
            raise BackendUnavailable("the native runtime could not start its thread pool")
        self.level = ffi.string(lib.ed_runtime_level_name()).decode()
        self._trusted = Regions()  # bound vectors: trusted memory for captures
        self._ropes = RopeTables()  # plans keep the tables they point into
        self._init_plans()
        self._file: Any = None  # the ModelFile being bound (prepare): its pages of repacked weights go
        self.repacked_bytes = 0  # weights repacked or copied (in memory of their own, not the file's pages)
        self._arena = HugeArena()  # the repacked (and tied) weights, in huge pages: edgellm/hugepages.py

    def prepare(self, mf: Any) -> None:
        self._file = weakref.ref(mf)

    def kernel_types(self, op: str) -> frozenset[int]:
        test = {"matmul": lib.ed_matmul_supported, "get_rows": lib.ed_get_rows_supported}.get(op)
        return frozenset(t for t in _KNOWN_TYPES if test is not None and test(t))

    # -- weights ---------------------------------------------------------------------------------------
    def bind(self, t: QTensor) -> NativeWeight:
        w = NativeWeight(t)
        raw = t.data
        q = quants.quant_type(t.type) if int(t.type) in _KNOWN_TYPES else None
        whole_rows = q is not None and t.ne[0] % q.block_size == 0
        if (
            whole_rows
            and raw.ndim == 2
            and raw.flags.c_contiguous
            and raw.dtype == np.uint8
            and raw.shape[1] == t.ne[0] // q.block_size * q.type_size  # the C ops read exactly this
        ):
            w.raw, w.ptr, w.rows, w.row_bytes = raw, address(raw), raw.shape[0], raw.shape[1]
            w.matmul_ok = bool(lib.ed_matmul_supported(int(t.type)))
            w.get_rows_ok = bool(lib.ed_get_rows_supported(int(t.type)))
            self._repack(w)
        return w

    def _repack(self, w: NativeWeight) -> None:
        """Where the CPU's kernels multiply this type faster repacked (x16: 16 rows' blocks interleaved, a
        SIMD lane per row; native/kernels/x16.c), a copy of the rows in that layout for matmul, made once
        here (llama.cpp's repack.cpp does the same at load). The file's pages of the tensor are let go
        as its rows are repacked (read again only if touched), so resident memory stays about the
        model's size, at peak too. Left in the file's layout: the token embedding (get_rows reads it, so
        a tied output would hold two copies; llama.cpp does not repack it either: a tied one is copied
        as it is, _hold_tied), and rows of a --no-mmap copy, which cannot give its pages back."""
        t, mf = w.qt, self._file() if self._file is not None else None
        if mf is not None and not _in_file(mf, t):
            mf = None
        unmapped = mf is not None and not mf.mapped
        if unmapped or not w.matmul_ok:
            return
        if t.name == "token_embd.weight":
            if mf is not None and "output.weight" not in mf.tensors:
                self._hold_tied(w, mf)
            return
        typ, k = int(t.type), t.ne[0]
        if not lib.ed_repack_x16_supported(typ):
            return
        nbytes, group = lib.ed_repack_x16_bytes(typ, w.rows, k), lib.ed_repack_x16_bytes(typ, 16, k)
        x16 = self._arena.take(nbytes)
        step = 16 * max(1, REPACK_STEP_BYTES // (16 * w.row_bytes))  # whole groups of rows at a time

        def part(r0: int) -> bool:  # (cffi lets go of the GIL: the pool's threads repack side by side)
            r1 = min(w.rows, r0 + step)
            src = ffi.cast("void *", w.ptr + r0 * w.row_bytes)
            dst = ffi.cast("void *", address(x16) + r0 // 16 * group)
            ok = bool(lib.ed_repack_x16(typ, src, w.row_bytes, r1 - r0, k, dst))
            if mf is not None:
                mf.evict(t, r0 * w.row_bytes, (r1 - r0) * w.row_bytes)
            return ok

        starts = range(0, w.rows, step)
        if len(starts) > 1 and self.threads > 1:
            with ThreadPoolExecutor(self.threads) as ex:
                done = all(ex.map(part, starts))
        else:
            done = all(part(r0) for r0 in starts)
        if done:
            w.x16 = x16
            self.repacked_bytes += nbytes
        if mf is not None:
            mf.evict(t)

    def _hold_tied(self, w: NativeWeight, mf: Any) -> None:
        """A tied token embedding (the output matrix too: every token's logits read all of it) copied,
        in the file's layout, into the arena's huge pages and its file pages let go as it is copied,
        as _repack does: in the file's 4 KiB pages that stream pays a TLB miss every page (gemma3-270m's
        is 170 of its 235 MiB)."""
        copy = self._arena.take(w.rows * w.row_bytes).reshape(w.rows, w.row_bytes)
        step = max(1, REPACK_STEP_BYTES // w.row_bytes)
        for r0 in range(0, w.rows, step):
            r1 = min(w.rows, r0 + step)
            copy[r0:r1] = w.raw[r0:r1]
            mf.evict(w.qt, r0 * w.row_bytes, (r1 - r0) * w.row_bytes)
        mf.evict(w.qt)
        w.raw, w.ptr = copy, address(copy)
        self.repacked_bytes += copy.nbytes

    def vector(self, t: QTensor) -> np.ndarray:
        v = np.ascontiguousarray(self.fallback.vector(t), np.float32)
        if v.nbytes:  # the region keeps v alive: its memory can never be a later array's
            self._trusted.add(address(v), address(v) + v.nbytes, v)
        return v

    # -- plumbing --------------------------------------------------------------------------------------
    def _in(self, a: np.ndarray, what: str) -> int:
        if self._cap is not None:
            self._cap.check(a, what)
        return address(a)

    def _f32(self, x: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(x, dtype=np.float32)

    def _exec(self, **fields: Any) -> None:
        if self._cap is not None:
            self._cap.record(fields)
        if lib.ed_plan_run(self._pool, ffi.new("ed_op *", fields), 1) != 0:
            raise RuntimeError(f"native op {fields['code']} was rejected by the runtime")

    # -- ops -------------------------------------------------------------------------------------------
    def get_rows(self, w: NativeWeight, ids: np.ndarray) -> np.ndarray:
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        if not w.get_rows_ok:
            self._eager_only(f"get_rows of a {w.qt.type.name} tensor has no native kernel")
            return self.fallback.get_rows(w, ids)
        k = w.qt.ne[0]
        if ids.size and (ids.min() < 0 or ids.max() >= w.rows):
            raise ValueError(f"token id outside the vocabulary of {w.rows}")
        out = self._out((len(ids), k))
        if len(ids):
            self._exec(
                code=GET_ROWS, type=int(w.qt.type), n=len(ids), k=k, i0=w.row_bytes, i1=w.rows,
                src0=w.ptr, src1=self._in(ids, "get_rows"), dst=address(out),
            )  # fmt: skip
        return out

    def matmul(self, w: NativeWeight, x: np.ndarray) -> np.ndarray:
        if not w.matmul_ok:
            self._eager_only(f"matmul of a {w.qt.type.name} tensor has no native kernel")
            return self.fallback.matmul(w, x)
        k = w.qt.ne[0]
        if x.shape[-1] != k:
            raise ValueError(f"matmul: x has {x.shape[-1]} columns, the weight {k}")
        x = self._f32(x)
        n = x.size // k
        out = self._out((*x.shape[:-1], w.rows))
        if n:
            self._exec(
                code=MATMUL, type=int(w.qt.type), flags=X16 if w.x16 is not None else 0, n=n, m=w.rows, k=k,
                i0=w.row_bytes, src0=w.ptr if w.x16 is None else address(w.x16), src1=self._in(x, "matmul"),
                dst=address(out),
            )  # fmt: skip
        return out

    def rms_norm(self, x: np.ndarray, weight: np.ndarray | None, eps: float) -> np.ndarray:
        x = self._f32(x)
        d = x.shape[-1]
        out = self._out(x.shape)
        wp = 0
        if weight is not None:
            weight = self._f32(weight)
            if weight.shape != (d,):
                raise ValueError(f"rms_norm: weight of shape {weight.shape} for rows of {d}")
            wp = self._in(weight, "rms_norm")
        if x.size:
            self._exec(
                code=RMS_NORM, n=x.size // d, k=d, f0=float(eps), src0=self._in(x, "rms_norm"), src1=wp,
                dst=address(out),
            )  # fmt: skip
        return out

    def rope(self, x: np.ndarray, positions: np.ndarray, spec: RopeSpec) -> np.ndarray:
        x = self._f32(x)
        positions = np.ascontiguousarray(positions, dtype=np.int64)
        n, heads, dh = x.shape
        if spec.n_dims > dh or spec.n_dims % 2:
            raise ValueError(f"rope: {spec.n_dims} rotated dims in heads of {dh}")
        need = int(positions.max(initial=0)) + 1
        if self._cap is not None:
            need = max(need, self._cap.n_ctx)
        cos, sin = self._ropes.get(spec, need)
        out = self._out(x.shape)
        if self._cap is not None:
            self._cap.keep += [cos, sin]
        if x.size:
            self._exec(
                code=ROPE, n=n, m=heads, k=dh, i0=spec.n_dims, i1=int(spec.neox), i2=len(cos),
                src0=self._in(x, "rope"), src1=self._in(positions, "rope"), src2=address(cos),
                src3=address(sin), dst=address(out),
            )  # fmt: skip
        return out

    def attention(self, q, k, v, kv: KVCache, layer, seq_ids, positions, scale, window=None, softcap=None):
        q, k, v = self._f32(q), self._f32(k), self._f32(v)
        seq_ids = np.ascontiguousarray(seq_ids, dtype=np.int64)
        positions = np.ascontiguousarray(positions, dtype=np.int64)
        n, n_head, dh = q.shape
        n_kv = k.shape[1]
        if k.shape != (n, n_kv, dh) or v.shape != k.shape or n_head % n_kv:
            raise ValueError(f"attention: q {q.shape}, k {k.shape}, v {v.shape}")
        kv.check(seq_ids, positions)  # the C attention skips a row without a slot, silently
        kc, vc, table, block_size = paged(kv, layer)
        kinds = 0
        for which, (c, kind) in enumerate(((kc, kv.type_k), (vc, kv.type_v))):
            want = (n_kv, row_bytes(kind, dh)) if kind == "q8_0" else (n_kv, dh)
            dtype = np.uint8 if kind == "q8_0" else np.float16
            if c.shape[1:] != want or c.dtype != dtype or not c.flags.c_contiguous or len(c) != len(kc):
                raise ValueError(f"attention: a {kind} cache of shape {c.shape} for heads of {(n_kv, dh)}")
            kinds |= (Q8_0_KIND if kind == "q8_0" else F16_KIND) << (8 * which)
        if table.dtype != np.int32 or not table.flags.c_contiguous:
            raise ValueError("attention: the block table must be a C-contiguous int32 array")
        out = self._out(q.shape)
        if n:
            self._exec(
                code=ATTENTION, type=kinds, n=n, m=n_head, k=dh, i0=n_kv, i1=block_size, i2=table.shape[1],
                i3=table.shape[0], i4=int(window or 0), i5=kc.shape[0], f0=float(scale),
                f1=float(softcap or 0.0), src0=self._in(q, "attention"), src1=self._in(k, "attention"),
                src2=self._in(v, "attention"), src3=address(kc), src4=address(vc), src5=address(table),
                src6=self._in(seq_ids, "attention"), src7=self._in(positions, "attention"), dst=address(out),
            )  # fmt: skip
        return out

    def _binary(self, code: int, a: np.ndarray, b: np.ndarray, what: str, extra: int = 0) -> np.ndarray:
        a, b = self._f32(a), self._f32(b)
        if a.shape != b.shape:
            raise ValueError(f"{what}: shapes {a.shape} and {b.shape}")
        out = self._out(a.shape)
        if a.size:
            self._exec(
                code=code, n=1, k=a.size, src0=self._in(a, what), src1=self._in(b, what), src2=extra,
                dst=address(out),
            )  # fmt: skip
        return out

    def silu_mul(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        return self._binary(SILU_MUL, gate, up, "silu_mul")

    def gelu_mul(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        return self._binary(GELU_MUL, gate, up, "gelu_mul", address(gelu_table_f32()))

    def add(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        a, b = self._f32(a), self._f32(b)
        if b.shape == a.shape:
            return self._binary(ADD, a, b, "add")
        if b.ndim != 1 or a.ndim == 0 or b.shape[0] != a.shape[-1]:
            self._eager_only(f"add of shapes {a.shape} and {b.shape}")
            return a + b
        out = self._out(a.shape)  # a bias: b broadcast over the rows of a
        if a.size:
            self._exec(
                code=ADD, n=a.size // b.size, k=b.size, i0=1, src0=self._in(a, "add"),
                src1=self._in(b, "add"), dst=address(out),
            )  # fmt: skip
        return out

    def _unary(self, code: int, x: np.ndarray, f: float, what: str) -> np.ndarray:
        x = self._f32(x)
        out = self._out(x.shape)
        if x.size:
            self._exec(code=code, n=1, k=x.size, f0=float(f), src0=self._in(x, what), dst=address(out))
        return out

    def scale(self, x: np.ndarray, s: float) -> np.ndarray:
        return self._unary(SCALE, x, s, "scale")

    def softcap(self, x: np.ndarray, cap: float) -> np.ndarray:
        return self._unary(SOFTCAP, x, cap, "softcap")

    def columns(self, x: np.ndarray, start: int, stop: int) -> np.ndarray:
        x = self._f32(x)
        rows, width = x.shape
        if not 0 <= start <= stop <= width:
            raise ValueError(f"columns {start}:{stop} of rows of {width}")
        out = self._out((rows, stop - start))
        if out.size:
            self._exec(
                code=COPY, n=rows, k=stop - start, i0=width, i1=start, src0=self._in(x, "columns"),
                dst=address(out),
            )  # fmt: skip
        return out

    # -- captured decode steps (CapturedDecode) --------------------------------------------------------
    def _new_plan(self, cap: Capture, logits: np.ndarray, model: Any, kv: Any) -> Plan:
        return Plan(ffi, lib, self._pool, cap, logits, model, kv)
