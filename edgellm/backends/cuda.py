"""The cuda backend: numba.cuda kernels (backends/cuda_kernels/) on one NVIDIA GPU, weights and the paged KV
cache resident on the device, a decode step recorded once per batch size and replayed (as one CUDA graph
launch where stream capture works) so that only token ids go in and logits or greedy ids come out.

`pip install 'edgellm[cuda]'` (numba-cuda). Without it, a driver or a device, `--backend cuda` refuses in
one line before anything is uploaded. Under numba-cuda's simulator (NUMBA_ENABLE_CUDASIM=1) the same
kernels run on the CPU as Python: far too slow for a model, right for tests on tiny shapes.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import weakref
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType as T

from edgellm import quants
from edgellm.backends.base import (
    WEIGHT_OPS,
    Backend,
    BackendUnavailable,
    RopeSpec,
    gelu_table_f32,
    rope_table,
)
from edgellm.backends.device_steps import Plan, RecordedSteps, Recording
from edgellm.backends.paged_kv import DeviceKV
from edgellm.gguf import QTensor

# what matmul and get_rows run on the device (declared without a device; cuda_kernels.blocks has a
# dequantizer for each, which a test checks)
WEIGHT_TYPES = frozenset(
    int(t)
    for t in (T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.IQ4_NL)
    + (T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K)
)
MIN_CC = (7, 5)  # the oldest target the kernels are compiled and tested for (Turing)
log = logging.getLogger(__name__)


def _import_cuda() -> Any:
    try:
        from numba import cuda
    except ImportError as e:
        raise BackendUnavailable(
            f"cuda: numba-cuda is not installed (pip install 'edgellm[cuda]'): {e}"
        ) from e
    # numpy's np.row_stack alias, back before the first compile loads numba-cuda's registries (its docstring)
    import edgellm.backends.cuda_kernels  # noqa: F401

    return cuda


def _simulator_on() -> bool:
    """numba-cuda's simulator is asked for (NUMBA_ENABLE_CUDASIM), read without importing numba: `auto` asks
    on every load, and a server on the native backend never needs numba's ~40 MB and 0.4 s."""
    if "numba" in sys.modules:
        from numba import config

        return bool(config.ENABLE_CUDASIM)
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0").strip() not in ("", "0")


# the module whose import loads numba-cuda's lowering registries (numpy's functions among them), which
# numba-cuda otherwise loads at the first kernel compile
REGISTRIES = "numba.cuda.cudaimpl"


def registries_refusal() -> str | None:
    """Why numba-cuda cannot compile a kernel with this numpy (one line), or None: a clash between the two
    (numba-cuda 0.30 needs np.row_stack, which numpy 2.5 removed and cuda_kernels puts back) is refused
    here by name rather than at the first matmul."""
    import importlib

    import edgellm.backends.cuda_kernels  # noqa: F401 - the np.row_stack alias first, as _import_cuda

    try:
        importlib.import_module(REGISTRIES)
    except Exception as e:  # noqa: BLE001 - whatever the version clash raises, summed up in one line
        from importlib.metadata import PackageNotFoundError, version

        try:
            have = f"numba-cuda {version('numba-cuda')}"
        except PackageNotFoundError:
            have = "numba-cuda"
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return (
            f"cuda: {have} does not load with numpy {np.__version__} ({first}); "
            "install a numba-cuda and numpy that load together (pip install 'edgellm[cuda]')"
        )
    return None


def refusal() -> str | None:
    """Why the cuda backend cannot run here (one line), or None. Cheap where there is no NVIDIA device."""
    simulated = _simulator_on()
    if (
        not simulated
        and os.name == "posix"
        and not any(os.path.exists(p) for p in ("/dev/nvidiactl", "/dev/nvidia0", "/dev/dxg"))
    ):
        return "cuda: no NVIDIA GPU here (no /dev/nvidia* device)"
    try:
        cuda = _import_cuda()
    except BackendUnavailable as e:
        return str(e)
    if simulated:
        return None
    if (why := registries_refusal()) is not None:
        return why
    try:
        dev = cuda.get_current_device()
    except Exception as e:  # noqa: BLE001 - the driver's own error, summed up in one line
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return f"cuda: no usable CUDA driver or device ({first})"
    cc = tuple(dev.compute_capability)
    if cc < MIN_CC:
        name = dev.name.decode() if isinstance(dev.name, bytes) else dev.name
        return f"cuda: {name} has compute capability {cc[0]}.{cc[1]}; the kernels need 7.5 or newer"
    return None


def auto_refusal() -> str | None:
    """Why `auto` does not take cuda: unavailable, or the simulator (Python: slower than any CPU backend)."""
    return "cuda: the simulator is not a device" if _simulator_on() else refusal()


class CArray:
    """A float32 array in device memory: shape and reshape only; Backend.to_host reads it."""

    __slots__ = ("d",)
    dtype = np.dtype(np.float32)

    def __init__(self, d: Any):
        self.d = d

    shape = property(lambda self: tuple(self.d.shape))
    ndim = property(lambda self: len(self.d.shape))
    size = property(lambda self: int(np.prod(self.d.shape, dtype=np.int64)))
    nbytes = property(lambda self: 4 * self.size)

    def reshape(self, *shape: Any) -> CArray:
        if len(shape) == 1 and isinstance(shape[0], tuple | list):
            shape = tuple(shape[0])
        return CArray(self.d.reshape(*shape))

    def __array__(self, *args: Any, **kwargs: Any):
        raise TypeError("a device array; use Backend.to_host")

    def __repr__(self) -> str:
        return f"CArray{self.shape}"


class CWeight:
    """A weight on the device: the file's blocks as uint8 rows (rows, row bytes), its type and width."""

    def __init__(self, qt: QTensor, qtype: T, data: Any, cols: int):
        self.qt, self.type, self.data, self.rows, self.cols = qt, qtype, data, data.shape[0], cols


class CudaKV(DeviceKV):
    """K, V and the tables on the device: per layer (slots, Hkv, Dh) f16 bit patterns (uint16)."""

    def __init__(self, backend: CudaBackend, *args: Any, **kwargs: Any):
        super().__init__("cuda", *args, **kwargs)
        self.backend = backend
        n_layers, n_kv_heads, head_dim = args[:3]
        most = backend.k_attn.MAX_HEAD_DIM
        if head_dim > most:
            raise ValueError(f"cuda: head width {head_dim} is not supported (at most {most})")
        cuda = backend.cuda
        for layer in range(n_layers):
            shape = (max(self.layer_slots(layer), 1), n_kv_heads, head_dim)
            self.layers.append((cuda.device_array(shape, np.uint16), cuda.device_array(shape, np.uint16)))
        self.table_d = cuda.to_device(self.block_table)
        self.ring_d = cuda.to_device(self.ring_table) if self.ring_table is not None else None

    @property
    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in self.layers)

    def upload_table(self) -> None:
        self.table_d.copy_to_device(self.block_table, stream=self.backend.stream)

    def copy_positions(self, src: int, dst: int, n: int) -> None:
        """Device-to-device copies on the backend's stream (after the work issued, before the next)."""
        self.check_copy(src, dst, n)
        a, b = src * self.block_size, dst * self.block_size
        for layer in self.full_layers:
            for rows in self.layers[layer]:
                rows[b : b + n].copy_to_device(rows[a : a + n], stream=self.backend.stream)

    def read_block(self, block: int) -> tuple[np.ndarray, np.ndarray]:
        self.check_block(block)
        a, n, stream = block * self.block_size, self.block_size, self.backend.stream
        out = [np.stack([self.layers[i][j][a : a + n].copy_to_host(stream=stream) for i in self.full_layers])
               for j in (0, 1)]  # fmt: skip
        stream.synchronize()
        return out[0].view(np.float16), out[1].view(np.float16)

    def write_block(self, block: int, k: np.ndarray, v: np.ndarray) -> None:
        self.check_block(block, k, v)
        a, n, stream = block * self.block_size, self.block_size, self.backend.stream
        for j, host in enumerate((k, v)):
            bits = np.ascontiguousarray(host).view(np.uint16)
            for i, layer in enumerate(self.full_layers):
                self.layers[layer][j][a : a + n].copy_to_device(bits[i], stream=stream)
        stream.synchronize()  # the host arrays may go before an asynchronous copy ran

    def layer(self, layer: int) -> tuple[Any, Any, Any]:
        ring, _ = self._where[layer]
        k, v = self.layers[layer]
        return k, v, (self.ring_d if ring else self.table_d)


class _Plan(Plan):
    """A recorded step (its launches are Recording.work), and once captured its CUDA graph."""

    def __init__(self, rec: Recording, model: Any, kv: Any, logits: CArray, ids: Any):
        super().__init__(rec, model, kv, logits, ids)
        self.graph: Any = None  # an instantiated CUDA graph of the launches; False: capture failed
        self.replays = 0


class CudaBackend(RecordedSteps, Backend):
    """The numba.cuda kernels on the current CUDA device (see the module docstring)."""

    name = "cuda"
    keeps_logits = True
    weight_types = WEIGHT_TYPES

    def __init__(self, threads: int | None = None):
        why = refusal()
        if why is not None:
            raise BackendUnavailable(why)
        self.cuda = cuda = _import_cuda()
        from numba import config

        from edgellm.backends.cuda_kernels import attention, matmul, ops

        self.k_ops, self.k_attn, self.k_mm = ops, attention, matmul
        self.simulated = bool(config.ENABLE_CUDASIM)
        if self.simulated:
            _guard_simulated_shared_arrays()
        self.tb = ops.TB
        if self.simulated:
            self.device_name = "numba-cuda simulator"
        else:
            dev = cuda.get_current_device()
            self.device_name = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
        self.stream = cuda.stream()
        self.graphs = not self.simulated and os.environ.get("EDGELLM_CUDA_GRAPHS", "1") != "0"
        self._ropes: dict[int, tuple[RopeSpec, int, Any, Any]] = {}
        self._acts: dict[int, tuple[Any, int, CArray, Any]] = {}
        self._init_steps()
        self._keep: list[Any] = []  # host-made device arrays a queued launch may still read
        self._gelu: Any = None
        self._dummy = cuda.device_array((1, 1), np.float32)
        self.uploaded = 0

    # -- memory and launches ---------------------------------------------------------------------------------
    def free_memory(self) -> int | None:
        """Free bytes on the device (None under the simulator)."""
        if self.simulated:
            return None
        free, _total = self.cuda.current_context().get_memory_info()
        return int(free)

    def prepare(self, mf: Any) -> None:
        from edgellm.arch import matrices

        need = sum(t.data.nbytes for t in matrices(mf))
        free = self.free_memory()
        if free is not None and need > free:
            raise BackendUnavailable(
                f"cuda: the weights take {need / 2**30:.2f} GiB; {self.device_name} has "
                f"{free / 2**30:.2f} GiB free"
            )

    def _empty(self, shape: tuple[int, ...], dtype: Any = np.float32) -> Any:
        return self.cuda.device_array(tuple(int(s) for s in shape), dtype, stream=self.stream)

    def _launch(self, kernel: Any, grid: Any, block: Any, *args: Any) -> None:
        if self._rec is not None:
            self._rec.work.append((kernel, grid, block, args))
        if self.simulated:
            # the simulator's threads meet at syncthreads through the GIL: at Python's default 5 ms switch
            # interval each barrier costs 5 ms; 10 us makes the tests' kernels 30x faster
            old = sys.getswitchinterval()
            sys.setswitchinterval(1e-5)
            try:
                kernel[grid, block, self.stream](*args)
            finally:
                sys.setswitchinterval(old)
            return
        kernel[grid, block, self.stream](*args)

    def _blocks(self, n: int) -> int:
        """Blocks of a grid-stride kernel over n items (one under the simulator: its threads are Python's)."""
        return 1 if self.simulated else max(1, min(-(-int(n) // self.tb), 8192))

    def _per_item(self, n: int) -> int:
        """Blocks of a kernel that gives each item (a row, a head) a block of its own, striding past the
        grid (one block under the simulator)."""
        return 1 if self.simulated else max(1, min(int(n), 1 << 20))

    def _ints(self, a: np.ndarray, what: str) -> Any:
        """Host ints (ids, positions) as a device int32 array; in a recording, the plan's input buffer."""
        buf = self._input_buffer(a, what)
        if buf is not None:
            return buf
        buf = self.cuda.to_device(np.ascontiguousarray(a, np.int32), stream=self.stream)
        self._keep.append(buf)
        return buf

    def sync(self) -> None:
        self.stream.synchronize()
        self._keep = []

    # -- the host boundary -----------------------------------------------------------------------------------
    def to_host(self, x: CArray) -> np.ndarray:
        if not isinstance(x, CArray):
            raise TypeError(f"cuda: to_host takes a device array, got {type(x).__name__}")
        out = x.d.copy_to_host(stream=self.stream)
        self.sync()
        return np.asarray(out, np.float32)

    def from_host(self, x: np.ndarray) -> CArray:
        return CArray(self.cuda.to_device(np.ascontiguousarray(x, np.float32), stream=self.stream))

    def take_rows(self, x: CArray, rows: np.ndarray) -> CArray:
        rows = np.asarray(rows, np.int64)
        n = x.shape[0]
        if rows.size and (rows.min() < -n or rows.max() >= n):
            raise IndexError(f"row index out of range for {n} rows")
        flat = x.d.reshape(n, -1)
        out = self._empty((len(rows), flat.shape[1]))
        idx = self._ints(rows % max(n, 1), "take_rows")
        self._launch(self.k_ops.take_rows, self._blocks(out.size), self.tb, flat, idx, out)
        return CArray(out.reshape(len(rows), *x.shape[1:]))

    # -- weights ---------------------------------------------------------------------------------------------
    def supports(self, op: str, qtype: Any = None) -> bool:
        if op in WEIGHT_OPS:
            return qtype is not None and int(qtype) in self.weight_types
        if op == "kv_cache":
            return qtype == "f16"
        return True

    def bind(self, t: QTensor) -> CWeight:
        qtype, data = t.type, t.data
        if not self.supports("matmul", qtype):  # no kernel: a float32 copy, which the load report names
            qtype = T.F32
            data = (
                np.ascontiguousarray(t.dequantize(), np.float32).reshape(t.data.shape[0], -1).view(np.uint8)
            )
        if t.ne[0] % 32:  # float rows are taken in blocks of 32 values, quantized ones are whole blocks
            raise ValueError(f"cuda: {t.name} has rows of {t.ne[0]} values, not a multiple of 32")
        rows = np.ascontiguousarray(data).reshape(data.shape[0], -1)
        self.uploaded += rows.nbytes
        return CWeight(t, qtype, self.cuda.to_device(rows, stream=self.stream), t.ne[0])

    def vector(self, t: QTensor) -> CArray:
        return self.from_host(quants.dequantize(t.data, t.type, t.shape).reshape(-1))

    # -- ops -------------------------------------------------------------------------------------------------
    def get_rows(self, w: CWeight, ids: np.ndarray) -> CArray:
        ids_h = self._token_ids(ids, w.rows)
        out = self._empty((len(ids_h), w.cols))
        n_items = len(ids_h) * (w.cols // self.k_mm.QK[int(w.type)])
        kernel = self.k_mm.rows_kernel(int(w.type))
        self._launch(kernel, self._blocks(n_items), self.tb, w.data, self._ints(ids, "get_rows"), out)
        return CArray(out)

    def _activations(self, x: CArray, qtype: T) -> tuple[Any, Any]:
        """x rounded as ggml's dot products round activations for weights of this type, with Q8_1's
        corrections; made once per (array, rounding): the q, k and v matmuls share theirs."""
        ops = self.k_ops
        vdt = quants.quant_type(qtype).vec_dot_type
        kind = {
            T.F16: ops.ACT_F16,
            T.BF16: ops.ACT_BF16,
            T.Q8_0: ops.ACT_Q8_0,
            T.Q8_1: ops.ACT_Q8_1,
            T.Q8_K: ops.ACT_Q8_K,
        }.get(vdt, ops.ACT_NONE)
        if kind == ops.ACT_NONE:
            return x.d, self._dummy
        hit = self._acts.get(id(x.d))
        if hit is not None and hit[0]() is x.d and hit[1] == kind:
            return hit[2], hit[3]
        n, k = x.shape
        xa = self._empty((n, k))
        corr = self._empty((n, k // 32)) if kind == ops.ACT_Q8_1 else self._dummy
        qk = 256 if kind == ops.ACT_Q8_K else 32
        self._launch(ops.round_activations, self._blocks(n * k // qk), self.tb, x.d, xa, corr, kind)
        if len(self._acts) > 64:
            self._acts = {key: v for key, v in self._acts.items() if v[0]() is not None}
        self._acts[id(x.d)] = (weakref.ref(x.d), kind, xa, corr)
        return xa, corr

    def matmul(self, w: CWeight, x: CArray) -> CArray:
        n, k = x.shape[0], x.shape[-1]
        if x.ndim != 2 or k != w.cols:
            raise ValueError(f"matmul of {x.shape} by a ({w.rows}, {w.cols}) weight")
        xa, corr = self._activations(x, w.type)
        out = self._empty((n, w.rows))
        if n:
            grid = (1, 1) if self.simulated else (w.rows, min(-(-n // self.k_mm.NT), 65535))
            self._launch(self.k_mm.matmul_kernel(int(w.type)), grid, self.tb, w.data, xa, corr, out)
        return CArray(out)

    def rms_norm(self, x: CArray, weight: CArray | None, eps: float) -> CArray:
        n = x.shape[-1]
        rows = x.size // max(n, 1)
        if weight is not None and weight.size != n:
            raise ValueError(f"rms_norm weight of {weight.size} for rows of {n}")
        out = self._empty((rows, n))
        w = weight.d if weight is not None else self._dummy.reshape(1)
        if rows:
            self._launch(
                self.k_ops.rms_norm,
                self._per_item(rows),
                self.tb,
                x.d.reshape(rows, n),
                w,
                out,
                float(eps),
                weight is not None,
            )
        return CArray(out.reshape(*x.shape))

    def _rope_table(self, spec: RopeSpec, n_pos: int) -> tuple[int, Any, Any]:
        hit = self._ropes.get(id(spec))
        if hit is None or hit[0] is not spec or hit[1] < n_pos:
            have = hit[1] if hit is not None and hit[0] is spec else 0
            size = max(n_pos, 2 * have, 4096)
            cos, sin = rope_table(spec, size)
            hit = self._ropes[id(spec)] = (spec, size, self.cuda.to_device(cos), self.cuda.to_device(sin))
        return hit[1], hit[2], hit[3]

    def rope(self, x: CArray, positions: np.ndarray, spec: RopeSpec) -> CArray:
        n, heads, dh = x.shape
        pos = np.asarray(positions, np.int64)
        if pos.size and pos.min() < 0:
            raise ValueError("negative position")
        n_pos, cos, sin = self._rope_table(spec, int(pos.max(initial=0)) + 1)
        if self._rec is not None:
            self._rec.rope_limit = min(self._rec.rope_limit, n_pos)
        out = self._empty(x.shape)
        p = self._ints(positions, "rope")
        total = n * heads * (dh // 2)
        self._launch(
            self.k_ops.rope, self._blocks(total), self.tb, x.d, p, cos, sin, out, spec.n_dims, spec.neox
        )
        return CArray(out)

    def new_kv_cache(self, *args: Any, **kwargs: Any) -> CudaKV:
        return CudaKV(self, *args, **kwargs)

    def attention(self, q, k, v, kv: CudaKV, layer, seq_ids, positions, scale, window=None, softcap=None):
        if not isinstance(kv, CudaKV):
            raise TypeError("cuda: the KV cache must be this backend's own")
        n, n_head, dh = q.shape
        kv.check(seq_ids, positions)
        kv.sync()
        kc, vc, table = kv.layer(layer)
        seqs, pos = self._ints(seq_ids, "attention"), self._ints(positions, "attention")
        attn = self.k_attn
        self._launch(
            attn.store, self._blocks(k.size), self.tb, k.d, v.d, kc, vc, table, seqs, pos, kv.block_size
        )
        out = self._empty(q.shape)
        if n:
            # a recorded step reads positions from its input buffer: room for the whole context
            width = kv.n_ctx if self._rec is not None else int(np.max(positions)) + 1
            scores = self._empty((n * n_head, width))
            args = (q.d, kc, vc, table, seqs, pos, out, scores, kv.block_size)
            extra = (int(window or 0), float(np.float32(scale)), float(np.float32(softcap or 0.0)))
            self._launch(attn.attend, self._per_item(n * n_head), self.tb, *args, *extra)
        return CArray(out)

    def _elementwise(self, kind: int, a: CArray, b: Any, b_len: int = 1, f: float = 0.0) -> CArray:
        out = self._empty(a.shape)
        flat = out.reshape(-1)
        table = self._dummy.reshape(-1)
        if kind == self.k_ops.GELU_MUL:
            if self._gelu is None:
                self._gelu = self.cuda.to_device(gelu_table_f32())
            table = self._gelu
        if a.size:
            bd = b.d.reshape(-1) if b is not None else self._dummy.reshape(-1)
            args = (a.d.reshape(-1), bd, table, flat, kind, int(b_len), float(np.float32(f)))
            self._launch(self.k_ops.elementwise, self._blocks(a.size), self.tb, *args)
        return CArray(out)

    def silu_mul(self, gate: CArray, up: CArray) -> CArray:
        return self._elementwise(self.k_ops.SILU_MUL, gate, up)

    def gelu_mul(self, gate: CArray, up: CArray) -> CArray:
        return self._elementwise(self.k_ops.GELU_MUL, gate, up)

    def add(self, a: CArray, b: CArray) -> CArray:
        if b.size != a.size and b.size != a.shape[-1]:
            raise ValueError(f"add of {a.shape} and {b.shape}")
        return self._elementwise(self.k_ops.ADD, a, b, b_len=b.size)

    def scale(self, x: CArray, s: float) -> CArray:
        return self._elementwise(self.k_ops.SCALE, x, None, f=s)

    def softcap(self, x: CArray, cap: float) -> CArray:
        return self._elementwise(self.k_ops.SOFTCAP, x, None, f=cap)

    def columns(self, x: CArray, start: int, stop: int) -> CArray:
        out = self._empty((x.shape[0], stop - start))
        if out.size:
            self._launch(self.k_ops.columns, self._blocks(out.size), self.tb, x.d, out, int(start))
        return CArray(out)

    # -- decode steps ----------------------------------------------------------------------------------------
    def _argmax(self, logits: CArray) -> Any:
        rows = logits.shape[0]
        ids = self._empty((rows,), np.int32)
        self._launch(self.k_ops.argmax, self._per_item(rows), self.tb, logits.d, ids)
        return ids

    def _new_recording(self, tokens, positions, seq_ids) -> Recording:
        inputs = (tokens, positions, seq_ids)
        return Recording(inputs, [self.cuda.to_device(x.astype(np.int32)) for x in inputs])

    def _new_plan(self, rec: Recording, model: Any, kv: Any, logits: CArray, ids: Any) -> _Plan:
        return _Plan(rec, model, kv, logits, ids)

    def _replay(self, plan: _Plan, tokens, positions, seq_ids, kv) -> None:
        kv.sync()
        for buf, a in zip(plan.buffers, (tokens, positions, seq_ids)):
            buf.copy_to_device(np.ascontiguousarray(a, np.int32), stream=self.stream)
        if plan.graph is None and self.graphs and plan.replays >= 1:
            plan.graph = self._capture(plan)  # False: capture failed; replay launch by launch
        if plan.graph:
            from cuda.bindings import driver

            _check(driver.cuGraphLaunch(plan.graph, _handle(self.stream)), "cuGraphLaunch")
        else:
            for kernel, grid, block, args in plan.work:
                self._launch(kernel, grid, block, *args)
        plan.replays += 1

    def _capture(self, plan: _Plan) -> Any:
        """The plan's launches captured from the stream into an instantiated CUDA graph, or False (logged)
        where the driver or numba refuse (the launches then replay one by one)."""
        from cuda.bindings import driver

        h = _handle(self.stream)
        try:
            self.stream.synchronize()
            mode = driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
            _check(driver.cuStreamBeginCapture(h, mode), "cuStreamBeginCapture")
            try:
                for kernel, grid, block, args in plan.work:
                    kernel[grid, block, self.stream](*args)
            finally:
                err, graph = driver.cuStreamEndCapture(h)
            _check((err,), "cuStreamEndCapture")
            err, exe = driver.cuGraphInstantiate(graph, 0)
            _check((err,), "cuGraphInstantiate")
            return exe
        except Exception as e:  # noqa: BLE001 - a capture that fails costs speed, never correctness
            log.warning("cuda: decode steps replay launch by launch (graph capture failed: %s)", e)
            self.stream.synchronize()
            return False

    def decode_step(self, model, tokens, positions, seq_ids, kv) -> np.ndarray:
        return self.to_host(self._step(model, tokens, positions, seq_ids, kv)[0])

    def decode_greedy(self, model, tokens, positions, seq_ids, kv) -> np.ndarray:
        ids = self._step(model, tokens, positions, seq_ids, kv)[1]
        out = ids.copy_to_host(stream=self.stream)
        self.sync()
        return np.asarray(out, np.int64)[: len(tokens)]


def _guard_simulated_shared_arrays() -> None:
    """numba-cuda's simulator (0.30, simulator/kernelapi.py FakeCUDAShared.array) finds a block's shared
    array by its source line, allocating it on a miss without a lock: two threads that reach the line
    together can each allocate one, and then a reduction through it reads another thread's garbage (seen
    here as a decode step replayed with other logits, about one in eight). The same lookup, under a lock."""
    import traceback

    from numba.core import types
    from numba.cuda.simulator import kernelapi
    from numba.np import numpy_support

    shared = kernelapi.FakeCUDAShared
    if getattr(shared, "_edgellm_locked", False):
        return
    lock = threading.Lock()
    unlocked = shared.array

    def array(self: Any, shape: Any, dtype: Any, alignment: Any = None) -> Any:
        if alignment is not None or shape == 0:
            return unlocked(self, shape, dtype, alignment)
        caller = tuple(traceback.extract_stack(sys._getframe(1), limit=1)[-1][0:2])  # the kernel's line
        with lock:
            res = self._allocations.get(caller)
            if res is None:
                dt = numpy_support.as_dtype(dtype) if isinstance(dtype, types.Type) else dtype
                res = self._allocations[caller] = np.empty(shape, dt)
        return res

    shared.array = array
    shared._edgellm_locked = True


def _handle(stream: Any) -> Any:
    """A numba stream's CUstream for cuda-bindings' driver calls."""
    from cuda.bindings import driver

    h = stream.handle
    if isinstance(h, driver.CUstream):
        return h
    return driver.CUstream(int(getattr(h, "value", h) or 0))


def _check(result: tuple, what: str) -> None:
    err = result[0]
    if int(err) != 0:
        raise RuntimeError(f"{what}: {err!r}")


__all__ = ["CArray", "CudaBackend", "CudaKV", "auto_refusal", "refusal"]
