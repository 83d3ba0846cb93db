"""Vulkan and Metal through wgpu: one WGSL kernel set (backends/wgsl/*.wgsl), weights and KV on the device.

`--backend vulkan` takes wgpu's Vulkan adapter (a GPU, or Mesa's lavapipe, a CPU driver, for tests);
`--backend metal` its Metal adapter on macOS. Weights are repacked to word-aligned blocks
(webgpu_layout.py) and uploaded once at bind, split over several buffers when a tensor is larger than the
device's largest storage binding; the paged KV cache and its block table live on the device; activations
stay there between ops. An op records a dispatch; `to_host` submits what is pending and reads one array
back. A decode step of B rows is captured once (the forward's dispatches over fixed buffers, as the
native backend's plans) and replayed: per step only token ids, positions and sequence ids go in (and the
block table when it changed) and logits, or B greedy ids, come out.

Numbers: matmuls multiply activations rounded as ggml-cpu rounds them (activations.wgsl) by the exactly
dequantized weights, summed in float32; RMSNorm, RoPE, embedding rows and the elementwise ops reproduce
the reference backend's float32 operations; attention follows it with the native backend's exp.
"""

from __future__ import annotations

import os
import string
import sys
import tempfile
import weakref
from pathlib import Path
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
from edgellm.backends.webgpu_layout import LAYOUT, repack
from edgellm.gguf import QTensor

try:  # wgpu-native's cffi handles, for replaying plans without wgpu-py's per-call wrappers
    from wgpu.backends.wgpu_native._api import ffi as _FFI
    from wgpu.backends.wgpu_native._api import lib as _LIB
except Exception:  # no wgpu, or another wgpu-py layout: plans replay through the public API
    _FFI = _LIB = None

FAMILY = {
    T.F32: "quants_float",
    T.F16: "quants_float",
    T.BF16: "quants_float",
    T.Q4_0: "quants_legacy",
    T.Q4_1: "quants_legacy",
    T.Q5_0: "quants_legacy",
    T.Q5_1: "quants_legacy",
    T.Q8_0: "quants_legacy",
    T.IQ4_NL: "quants_legacy",
    T.Q2_K: "quants_k",
    T.Q3_K: "quants_k",
    T.Q4_K: "quants_k",
    T.Q5_K: "quants_k",
    T.Q6_K: "quants_k",
}
ACTIVATION = {T.F16: "f16", T.BF16: "bf16", T.Q8_0: "q8_0", T.Q8_1: "q8_1", T.Q8_K: "q8_k"}
WG = 64  # invocations per workgroup, every kernel
PREFILL_TOKENS = 8  # matmul tokens sharing one dequantized weight quad
MAX_GROUP_WG = 8  # query heads per attention workgroup (attention.wgsl GMAX)
MAX_HEAD_DIM = 256
POOL_PER_SIZE = 16  # free activation buffers kept per size for reuse
ADAPTER_ORDER = {"DiscreteGPU": 0, "IntegratedGPU": 1, "VirtualGPU": 2, "Unknown": 3, "CPU": 4}
LIMITS = (
    "max-storage-buffer-binding-size",
    "max-buffer-size",
    "max-storage-buffers-per-shader-stage",
    "max-compute-workgroup-storage-size",
    "max-compute-invocations-per-workgroup",
    "max-compute-workgroups-per-dimension",
)


def wgsl_dir() -> Path:
    """The kernel sources: the source tree's backends/wgsl, or the copy a wheel installs in the package."""
    here = Path(__file__).resolve().parent
    for d in (here.parents[1] / "backends" / "wgsl", here / "wgsl"):
        if (d / "common.wgsl").is_file():
            return d
    raise BackendUnavailable("the WGSL kernel sources (backends/wgsl) are missing from this install")


def _source(name: str) -> str:
    return (wgsl_dir() / f"{name}.wgsl").read_text()


def _part(src: str, name: str) -> str:
    """The section of a .wgsl file after its `// ---- name ----` line (up to the next such line), with
    what comes before the first section (shared declarations)."""
    head, *sections = src.split("// ---- ")
    for s in sections:
        title, _, body = s.partition("\n")
        if title.strip(" -") == name:
            return head + body
    raise KeyError(name)


def find_adapter(kind: str):
    """wgpu's adapter of the asked kind ("vulkan" or "metal"), the most capable first; BackendUnavailable
    in one line when wgpu, the platform or a driver is missing."""
    if kind == "metal" and sys.platform != "darwin":
        raise BackendUnavailable(f"metal: needs macOS (this is {sys.platform}); use --backend vulkan here")
    if not os.environ.get("XDG_RUNTIME_DIR"):  # Mesa's drivers print an error at every start without one
        d = Path(tempfile.gettempdir()) / f"edgellm-xdg-{os.getuid() if hasattr(os, 'getuid') else 0}"
        d.mkdir(mode=0o700, exist_ok=True)
        os.environ["XDG_RUNTIME_DIR"] = str(d)
    try:
        import wgpu
    except ImportError:
        raise BackendUnavailable(f"{kind}: wgpu is not installed (pip install 'edgellm[gpu]')") from None
    want = {"vulkan": "Vulkan", "metal": "Metal"}[kind]
    try:
        adapters = [a for a in wgpu.gpu.enumerate_adapters_sync() if a.info.get("backend_type") == want]
    except Exception as e:  # a broken loader or driver
        raise BackendUnavailable(f"{kind}: wgpu found no usable {want} driver ({e})") from None
    if not adapters:
        hint = "install a Vulkan driver (Debian: mesa-vulkan-drivers libvulkan1) or your GPU's"
        raise BackendUnavailable(f"{kind}: no {want} adapter found; {hint}")
    return min(adapters, key=lambda a: ADAPTER_ORDER.get(a.info.get("adapter_type", "Unknown"), 3))


_AUTO: dict[str, str | None] = {}


# where a Linux GPU's user-space driver talks to it: Mesa's drivers (Intel, AMD, Broadcom V3D on a Pi,
# Adreno, Mali) through a DRM render node, NVIDIA's own driver, WSL2's dxg, Android's Adreno and Mali
_GPU_NODES = ("/dev/dri/renderD*", "/dev/nvidia[0-9]*", "/dev/dxg", "/dev/kgsl-3d*", "/dev/mali*")


def _no_gpu_device() -> str | None:
    """On Linux, why no GPU can be there (no device node): then `auto` need not load the Vulkan loader
    and every installed driver (lavapipe alone maps ~50 MB of LLVM) to find only a software adapter."""
    if not sys.platform.startswith("linux"):
        return None
    import glob

    if any(glob.glob(pattern) for pattern in _GPU_NODES):
        return None
    return "no GPU device here (/dev/dri/renderD*, /dev/nvidia*, /dev/dxg)"


def auto_refusal(kind: str) -> str | None:
    """Why `--backend auto` should not take this kind here (None: a real GPU it may take); probes the
    adapter once per process without opening a device, and not at all on a Linux machine without a GPU
    device node."""
    if kind not in _AUTO and (why := _no_gpu_device()) is not None:
        _AUTO[kind] = f"{kind}: {why}"
    if kind not in _AUTO:
        try:
            info = find_adapter(kind).info
            kind_of = info.get("adapter_type", "Unknown")
            _AUTO[kind] = (
                None
                if kind_of in ("DiscreteGPU", "IntegratedGPU")
                else f"{kind}: {info.get('device', '?')} is a {kind_of} adapter, slower than the CPU backends"
            )
        except BackendUnavailable as e:
            _AUTO[kind] = str(e)
    return _AUTO[kind]


def _grid(n: int, limit: int = 65535) -> tuple[int, int]:
    """n workgroups as a 2-D grid (x, y) within the per-dimension limit."""
    n = max(int(n), 1)
    if n <= limit:
        return n, 1
    return limit, -(-n // limit)


def _matvec_body(rows: int, tokens: int, tpr: int, has_min: bool, fmt: str) -> dict[str, str]:
    """matmul.wgsl's matvec written out for R rows x NT tokens of scalar accumulators: their declarations,
    the loop body (rows and tokens past the end are clamped to the last one and their sums dropped), and
    the finish: stores, after a sum over the TPR invocations of a row when there are several."""
    pad = " " * 16
    acc = [(r, t) for r in range(rows) for t in range(tokens)]
    declare = "\n".join(f"        var acc_{r}_{t} = 0.0;\n        var part_{r}_{t} = 0.0;" for r, t in acc)
    body = [f"{pad}let x_{t} = XR[min(n0 + {t}u, last_tok) * kq + qi];" for t in range(tokens)]
    for r in range(rows):
        body.append(f"{pad}let bw_{r} = min(row0 + {r}u, last_row) * p.row_words + blk * BW;")
        body.append(f"{pad}let w_{r} = deq4_{fmt}(bw_{r}, q);")
        body += [f"{pad}part_{r}_{t} += dot(w_{r}, x_{t});" for t in range(tokens)]
        if has_min:  # ggml's f16(d * sum q) instead of f16(d) * sum q, once per block (reference.py)
            body.append(f"{pad}if (q == 0u) {{")
            body.append(f"{pad}    let mn_{r} = min_{fmt}(bw_{r});")
            for t in range(tokens):
                c = f"CORR[min(n0 + {t}u, last_tok) * (p.k / 32u) + blk]"
                body.append(f"{pad}    part_{r}_{t} += opaque(mn_{r} * {c}, p.zero);")
            body.append(f"{pad}}}")
    # each block's sum apart, then added to the row's (as the CPU kernels sum per block): the rounding
    # error grows with the blocks of a row, not its elements
    body.append(f"{pad}if ((qi + TPR) / QPB != blk) {{")
    body += [f"{pad}    acc_{r}_{t} += part_{r}_{t};\n{pad}    part_{r}_{t} = 0.0;" for r, t in acc]
    body.append(f"{pad}}}")
    out = "Y[(n0 + {t}u) * p.ld + p.col0 + row0 + {r}u]"
    cond = "row0 + {r}u < p.m && n0 + {t}u < p.n"
    if tpr == 1:
        finish = "\n".join(
            f"        if ({cond.format(r=r, t=t)}) {{ {out.format(r=r, t=t)} = acc_{r}_{t}; }}"
            for r, t in acc
        )
    else:
        k = rows * tokens
        lines = [f"        red[lid * {k}u + {r * tokens + t}u] = acc_{r}_{t};" for r, t in acc]
        lines.append("        workgroupBarrier();")
        lines.append("        if (sub == 0u) {")
        for r, t in acc:
            j = r * tokens + t
            lines.append(f"            var s_{j} = 0.0;")
            lines.append(
                f"            for (var i = 0u; i < TPR; i++) {{ s_{j} += red[(lid + i) * {k}u + {j}u]; }}"
            )
            lines.append(f"            if ({cond.format(r=r, t=t)}) {{ {out.format(r=r, t=t)} = s_{j}; }}")
        lines += ["        }", "        workgroupBarrier();"]
        finish = "\n".join(lines)
    if tpr == 1:
        loop = (
            "            for (var blk = 0u; blk < kq / QPB; blk++) {\n"
            "              for (var q = 0u; q < QPB; q++) {\n"
            "                let qi = blk * QPB + q;"
        )
        end = "              }\n            }"
    else:
        loop = (
            "            for (var qi = sub; qi < kq; qi += TPR) {\n"
            "                let blk = qi / QPB;\n"
            "                let q = qi % QPB;"
        )
        end = "            }"
    return {"DECLARE": declare, "BODY": "\n".join(body), "FINISH": finish, "LOOP": loop, "END_LOOP": end}


class _Memory:
    """One device buffer behind one or more arrays; back to the pool when the last array goes."""

    __slots__ = ("buf", "pool", "__weakref__")

    def __init__(self, buf: Any, pool: dict | None):
        self.buf = buf
        self.pool = pool

    def __del__(self) -> None:
        if self.pool is not None:
            free = self.pool.setdefault(self.buf.size, [])
            if len(free) < POOL_PER_SIZE:  # beyond that, wgpu frees the buffer with its last reference
                free.append(self.buf)


class GArray:
    """A float32 array in device memory: shape and reshape only; Backend.to_host reads it."""

    __slots__ = ("mem", "shape")
    dtype = np.dtype(np.float32)

    def __init__(self, mem: _Memory, shape: tuple[int, ...]):
        self.mem = mem
        self.shape = tuple(int(s) for s in shape)

    @property
    def buf(self) -> Any:
        return self.mem.buf

    ndim = property(lambda self: len(self.shape))
    size = property(lambda self: int(np.prod(self.shape, dtype=np.int64)))
    nbytes = property(lambda self: 4 * self.size)

    def reshape(self, *shape: Any) -> GArray:
        if len(shape) == 1 and isinstance(shape[0], tuple | list):
            shape = tuple(shape[0])
        shape = list(shape)
        if -1 in shape:
            i = shape.index(-1)
            rest = int(np.prod([s for j, s in enumerate(shape) if j != i], dtype=np.int64))
            shape[i] = self.size // max(rest, 1)
        if int(np.prod(shape, dtype=np.int64)) != self.size:
            raise ValueError(f"cannot reshape {self.shape} to {tuple(shape)}")
        return GArray(self.mem, tuple(shape))

    def __array__(self, *args: Any, **kwargs: Any):
        raise TypeError("a device array; use Backend.to_host")

    def __repr__(self) -> str:
        return f"GArray{self.shape}"


class GWeight:
    """A weight on the device: its type, (rows, cols), and row chunks [(buffer, first row, rows)]."""

    def __init__(self, qt: QTensor, qtype: T, rows: int, cols: int, row_words: int, chunks: list):
        self.qt = qt  # the file's tensor (a view of the mapping): what was uploaded
        self.type, self.rows, self.cols, self.row_words, self.chunks = qtype, rows, cols, row_words, chunks


class WebGPUKV(DeviceKV):
    """K, V and the block table on the device: one K and one V buffer per layer, float16 pairs in u32
    words, slot-major (slots, Hkv, Dh)."""

    def __init__(self, backend: WebGPUBackend, *args: Any, **kwargs: Any):
        super().__init__(backend.name, *args, **kwargs)
        self.backend = backend
        n_layers, n_kv_heads, head_dim = args[:3]
        if head_dim > MAX_HEAD_DIM or head_dim % 8:
            raise ValueError(
                f"{backend.name}: head width {head_dim} is not supported (a multiple of 8, <= 256)"
            )
        self.head_dim, self.n_kv_heads = head_dim, n_kv_heads
        for layer in range(n_layers):
            slots = self.layer_slots(layer)
            size = max(slots * n_kv_heads * head_dim * 2, 16)
            backend.check_binding(size, f"the KV cache of one layer ({slots} positions)")
            self.layers.append((backend.storage(size), backend.storage(size)))
        self.table_buf = backend.upload_ints(self.block_table, writable=True)
        self.ring_buf = backend.upload_ints(self.ring_table) if self.ring_table is not None else None

    @property
    def nbytes(self) -> int:
        return sum(k.size + v.size for k, v in self.layers)

    def upload_table(self) -> None:
        self.backend.flush()  # after the work already recorded ran
        self.backend.device.queue.write_buffer(self.table_buf, 0, self.block_table.astype(np.int32))

    def copy_positions(self, src: int, dst: int, n: int) -> None:
        """Buffer copies after the work already recorded, through a scratch buffer: WebGPU forbids a copy
        within one buffer. The copies of one encoder run in order, so one scratch serves every layer."""
        self.check_copy(src, dst, n)
        row = self.n_kv_heads * self.head_dim * 2  # bytes of one position (a multiple of 16)
        a, b, size = src * self.block_size * row, dst * self.block_size * row, n * row
        backend = self.backend
        backend.flush()
        scratch = backend.storage(size)
        enc = backend.device.create_command_encoder()
        for layer in self.full_layers:
            for buf in self.layers[layer]:
                enc.copy_buffer_to_buffer(buf, a, scratch, 0, size)
                enc.copy_buffer_to_buffer(scratch, 0, buf, b, size)
        backend.device.queue.submit([enc.finish()])

    def read_block(self, block: int) -> tuple[np.ndarray, np.ndarray]:
        """Every layer's K then V rows of the block gathered into one buffer, read back at once."""
        self.check_block(block)
        size = self.block_size * self.n_kv_heads * self.head_dim * 2
        backend = self.backend
        backend.flush()
        layers = self.full_layers
        gather = backend.storage(2 * len(layers) * size)
        enc = backend.device.create_command_encoder()
        for j in (0, 1):
            for i, layer in enumerate(layers):
                enc.copy_buffer_to_buffer(
                    self.layers[layer][j], block * size, gather, (j * len(layers) + i) * size, size
                )
        backend.device.queue.submit([enc.finish()])
        data = np.frombuffer(backend.device.queue.read_buffer(gather, 0, 2 * len(layers) * size), np.float16)
        k_shape, v_shape = self.block_shapes()
        both = data.reshape(2, *k_shape)  # f16 K and V alike (a device cache holds no q8_0)
        return both[0].copy(), both[1].reshape(v_shape).copy()

    def write_block(self, block: int, k: np.ndarray, v: np.ndarray) -> None:
        self.check_block(block, k, v)
        size = self.block_size * self.n_kv_heads * self.head_dim * 2
        self.backend.flush()
        for j, host in enumerate((k, v)):
            for i, layer in enumerate(self.full_layers):
                self.backend.device.queue.write_buffer(
                    self.layers[layer][j], block * size, np.ascontiguousarray(host[i])
                )

    def layer(self, layer: int) -> tuple[Any, Any, Any, int]:
        """(K buffer, V buffer, block table buffer, table width) of one layer."""
        ring, _ = self._where[layer]
        k, v = self.layers[layer]
        if ring:
            return k, v, self.ring_buf, self.ring_table.shape[1]
        return k, v, self.table_buf, self.block_table.shape[1]


class _Plan(Plan):
    """A recorded step, with its command buffer encoded ahead of the next step and, where wgpu-native's
    C API is reachable, the dispatches as raw handles (encoding them costs no Python per dispatch)."""

    def __init__(self, rec: Recording, model: Any, kv: Any, logits: GArray, ids: Any):
        super().__init__(rec, model, kv, logits, ids)
        self.ready: Any = None  # the plan's command buffer, encoded ahead of the next step
        self.raw = (
            [(p._internal, bg._internal, *grid) for p, bg, grid in self.work] if _LIB is not None else None
        )


class WebGPUBackend(RecordedSteps, Backend):
    """The WGSL kernels on one wgpu device (see the module docstring)."""

    keeps_logits = True
    kind = "vulkan"
    weight_types = frozenset(LAYOUT)  # what matmul and get_rows run on the device (no device needed to ask)

    def __init__(self, threads: int | None = None):
        self.adapter = adapter = find_adapter(self.kind)  # first: it refuses by name where wgpu is missing
        import wgpu

        self.wgpu = wgpu
        self.name = self.kind
        info = adapter.info
        self.device_name = info.get("device", "?")
        # lavapipe (llvmpipe) and other software drivers: right for tests, never faster than the CPU backends
        self.software = info.get("adapter_type") == "CPU"
        limits = adapter.limits
        need = {
            "max-compute-workgroup-storage-size": 16384,  # attention.wgsl's tiles
            "max-storage-buffers-per-shader-stage": 8,
            "max-compute-invocations-per-workgroup": WG,
        }
        for key, least in need.items():
            if limits.get(key, 0) < least:
                raise BackendUnavailable(
                    f"{self.kind}: {self.device_name} has {key} {limits.get(key)}; need {least}"
                )
        self.device = adapter.request_device_sync(
            required_limits={k: limits[k] for k in LIMITS if k in limits}
        )
        self.max_binding = int(limits["max-storage-buffer-binding-size"])
        self.max_buffer = max(int(limits.get("max-buffer-size", self.max_binding)), self.max_binding)
        self.max_groups = int(limits.get("max-compute-workgroups-per-dimension", 65535))
        self._pool: dict[int, list[Any]] = {}
        self._pending: list[tuple[Any, Any, tuple[int, int, int]]] = []
        self._keepalive: list[Any] = []
        self._pipes: dict[Any, Any] = {}
        self._uniforms: dict[bytes, Any] = {}
        self._acts: dict[int, tuple[Any, str, GArray, Any]] = {}
        self._ropes: dict[int, tuple[RopeSpec, int, Any, Any]] = {}
        self._init_steps()
        self._gelu: Any = None
        self._dummy = self.storage(16)
        self.uploaded = 0  # bytes of weights on the device (wgpu does not say how much memory it has)

    # -- memory --------------------------------------------------------------------------------------------
    def check_binding(self, nbytes: int, what: str) -> None:
        if nbytes > self.max_binding:
            raise ValueError(
                f"{self.name}: {what} takes {nbytes / 2**20:.0f} MiB, more than this device's largest "
                f"binding ({self.max_binding / 2**20:.0f} MiB); use a smaller context"
            )

    def storage(self, nbytes: int, extra: int = 0) -> Any:
        if nbytes > self.max_buffer:
            raise ValueError(
                f"{self.name}: an array of {nbytes / 2**20:.0f} MiB exceeds this device's largest buffer "
                f"({self.max_buffer / 2**20:.0f} MiB); use a smaller batch or context"
            )
        u = self.wgpu.BufferUsage
        return self.device.create_buffer(
            size=max(int(nbytes), 16), usage=u.STORAGE | u.COPY_SRC | u.COPY_DST | extra
        )

    def upload_ints(self, a: np.ndarray, writable: bool = False) -> Any:
        u = self.wgpu.BufferUsage
        data = np.ascontiguousarray(a, np.int32).reshape(-1)
        if data.size == 0:
            data = np.zeros(4, np.int32)
        usage = u.STORAGE | (u.COPY_DST if writable else 0)
        return self.device.create_buffer_with_data(data=data, usage=usage)

    def _alloc(self, shape: tuple[int, ...]) -> GArray:
        nbytes = max(4 * int(np.prod(shape, dtype=np.int64)), 16)
        size = (nbytes + 255) & ~255
        if self._rec is not None:  # a plan's buffer: its own, for good
            mem = _Memory(self.storage(size), None)
            self._rec.keep.append(mem)
        else:
            free = self._pool.get(size)
            mem = _Memory(free.pop() if free else self.storage(size), self._pool)
        return GArray(mem, shape)

    def _uniform(self, *fields: Any) -> Any:
        """A uniform buffer of u32 / f32 fields (ints as u32, floats as f32), made once per distinct value."""
        words = np.zeros(-(-len(fields) // 4) * 4, np.uint32)
        for i, f in enumerate(fields):
            words[i] = np.float32(f).view(np.uint32) if isinstance(f, float | np.floating) else np.uint32(f)
        key = words.tobytes()
        buf = self._uniforms.get(key)
        if buf is None:
            if len(self._uniforms) > 8192:
                self._uniforms.clear()
            u = self.wgpu.BufferUsage
            buf = self._uniforms[key] = self.device.create_buffer_with_data(data=words, usage=u.UNIFORM)
        return buf

    # -- kernels -------------------------------------------------------------------------------------------
    def _pipeline(self, module: str, entry: str, qtype: T | None = None, **consts: int) -> Any:
        key = (module, entry, qtype, tuple(sorted(consts.items())))
        pipe = self._pipes.get(key)
        if pipe is None:
            src = _source("common")
            body = _source(module)
            if qtype is not None:
                block_elems, block_words = LAYOUT[int(qtype)]
                fmt = T(qtype).name.lower()
                src += "\n@group(0) @binding(0) var<storage, read> W: array<u32>;\n" + _source(
                    FAMILY[T(qtype)]
                )
                body = _part(body, entry)
                has_min = qtype in (T.Q4_1, T.Q5_1)
                subst = dict(QPB=block_elems // 4, BW=block_words, **consts)
                corr_binding = ""
                if has_min:  # Q4_1 / Q5_1 keep (d, m) as the f16 pair of the block's first word
                    src += f"\nfn min_{fmt}(bw: u32) -> f32 {{ return unpack2x16float(W[bw]).y; }}\n"
                    corr_binding = "@group(0) @binding(4) var<storage, read> CORR: array<f32>;"
                body = body.replace("//$CORR_BINDING", corr_binding)
                if entry == "matvec":
                    subst.update(_matvec_body(consts["R"], consts["NT"], consts["TPR"], has_min, fmt))
                body = string.Template(body).substitute({k: str(v) for k, v in subst.items()})
                body = body.replace("DEQ4(", f"deq4_{fmt}(")
                entry = "main" if entry == "matvec" else entry
            elif "// ---- " in body:
                body = _part(body, entry)
            src += "\n" + body
            mod = self.device.create_shader_module(code=src)
            pipe = self._pipes[key] = self.device.create_compute_pipeline(
                layout="auto", compute={"module": mod, "entry_point": entry}
            )
        return pipe

    def _dispatch(self, pipe: Any, buffers: dict[int, Any], groups: int, z: int = 1) -> None:
        """Record one dispatch; a binding is a buffer, or (buffer, byte offset, bytes) for part of one."""
        entries = []
        for b, buf in buffers.items():
            buf, offset, size = buf if isinstance(buf, tuple) else (buf, 0, buf.size)
            entries.append({"binding": b, "resource": {"buffer": buf, "offset": offset, "size": size}})
        bg = self.device.create_bind_group(layout=pipe.get_bind_group_layout(0), entries=entries)
        gx, gy = _grid(groups, self.max_groups)
        d = (pipe, bg, (gx, gy, z))
        self._pending.append(d)
        if self._rec is not None:
            self._rec.work.append(d)
        else:
            self._keepalive.append(buffers)

    def _encode(self, dispatches: list) -> Any:
        enc = self.device.create_command_encoder()
        cp = enc.begin_compute_pass()
        last = None
        for pipe, bg, grid in dispatches:
            if pipe is not last:
                cp.set_pipeline(pipe)
                last = pipe
            cp.set_bind_group(0, bg)
            cp.dispatch_workgroups(*grid)
        cp.end()
        return enc

    def _encode_raw(self, raw: list) -> Any:
        """_encode for a captured plan through wgpu-native's C functions directly (wgpu-py's wrappers cost
        ~5 us a call, most of a small model's step on a fast GPU); raw holds the handles of dispatches
        whose Python objects the plan keeps alive."""
        enc = self.device.create_command_encoder()
        cp = enc.begin_compute_pass()
        h, null = cp._internal, _FFI.NULL
        set_pipeline = _LIB.wgpuComputePassEncoderSetPipeline
        set_group = _LIB.wgpuComputePassEncoderSetBindGroup
        dispatch = _LIB.wgpuComputePassEncoderDispatchWorkgroups
        last = None
        for pipe, bg, x, y, z in raw:
            if pipe != last:
                set_pipeline(h, pipe)
                last = pipe
            set_group(h, 0, bg, 0, null)
            dispatch(h, x, y, z)
        cp.end()
        return enc

    def flush(self) -> None:
        """Submit every dispatch recorded so far."""
        if self._pending:
            self.device.queue.submit([self._encode(self._pending).finish()])
            self._pending = []
            self._keepalive = []

    def _ints(self, a: np.ndarray, what: str) -> Any:
        """A host int array (ids, positions) as a device int32 buffer; in a capture, the plan's input."""
        buf = self._input_buffer(a, what)
        if buf is not None:
            return buf
        buf = self.upload_ints(np.asarray(a))
        self._keepalive.append(buf)
        return buf

    # -- the host boundary ---------------------------------------------------------------------------------
    def to_host(self, x: GArray) -> np.ndarray:
        if not isinstance(x, GArray):
            raise TypeError(f"{self.name}: to_host takes a device array, got {type(x).__name__}")
        self.flush()
        data = self.device.queue.read_buffer(x.buf, 0, max(x.nbytes, 4))
        return np.frombuffer(data, np.float32)[: x.size].reshape(x.shape).copy()

    def from_host(self, x: np.ndarray) -> GArray:
        a = np.ascontiguousarray(x, np.float32)
        out = self._alloc(a.shape)
        if a.size:
            self.flush()  # keep the order: work already recorded may still read this pooled buffer
            self.device.queue.write_buffer(out.buf, 0, a.reshape(-1))
        return out

    def take_rows(self, x: GArray, rows: np.ndarray) -> GArray:
        rows = np.asarray(rows, np.int64)
        n, cols = x.shape[0], int(np.prod(x.shape[1:], dtype=np.int64))
        if rows.size and (rows.min() < -n or rows.max() >= n):
            raise IndexError(f"row index out of range for {n} rows")
        out = self._alloc((len(rows), *x.shape[1:]))
        idx = self._ints(rows % max(n, 1), "take_rows")
        self._elementwise("take_rows", {0: x.buf, 2: out.buf, 5: idx}, out.size, cols=cols)
        return out

    # -- weights -------------------------------------------------------------------------------------------
    def supports(self, op: str, qtype: Any = None) -> bool:
        if op in WEIGHT_OPS:
            return qtype is not None and int(qtype) in self.weight_types
        if op == "kv_cache":
            return qtype == "f16"
        return True

    def bind(self, t: QTensor) -> GWeight:
        qtype, data = t.type, t.data
        if int(qtype) not in LAYOUT:  # no kernel: a float32 copy, which the load report names with its cost
            qtype, data = (
                T.F32,
                np.ascontiguousarray(t.dequantize(), np.float32).reshape(t.data.shape[0], -1).view(np.uint8),
            )
        words = repack(int(qtype), np.ascontiguousarray(data))
        rows, row_words = words.shape
        per_chunk = max(1, min(self.max_binding, self.max_buffer) // max(row_words * 4, 1))
        chunks = []
        u = self.wgpu.BufferUsage
        for r0 in range(0, rows, per_chunk):
            part = np.ascontiguousarray(words[r0 : r0 + per_chunk]).reshape(-1)
            buf = self.device.create_buffer_with_data(
                data=part if part.size else np.zeros(4, np.uint32), usage=u.STORAGE
            )
            chunks.append((buf, r0, min(per_chunk, rows - r0)))
        return GWeight(t, qtype, rows, t.ne[0], row_words, chunks)

    def vector(self, t: QTensor) -> GArray:
        return self.from_host(quants.dequantize(t.data, t.type, t.shape).reshape(-1))

    # -- ops -----------------------------------------------------------------------------------------------
    def get_rows(self, w: GWeight, ids: np.ndarray) -> GArray:
        ids_h = self._token_ids(ids, w.rows)
        out = self._alloc((len(ids_h), w.cols))
        ids_buf = self._ints(ids, "get_rows")
        pipe = self._pipeline("matmul", "rows", w.type)
        for buf, r0, n in w.chunks:
            u = self._uniform(len(ids_h), w.cols, w.row_words, r0, n, _grid(len(ids_h))[0], 0, 0)
            self._dispatch(pipe, {0: buf, 1: ids_buf, 2: out.buf, 3: u}, len(ids_h))
        return out

    def _activations(self, x: GArray, qtype: T) -> tuple[GArray, Any]:
        """x rounded as ggml-cpu rounds activations for weights of this type (and Q8_1's corrections);
        made once per (array, activation type): the q, k, v matmuls share theirs."""
        act = ACTIVATION.get(quants.quant_type(qtype).vec_dot_type)
        if act is None:
            return x, None
        hit = self._acts.get(id(x.mem))
        if hit is not None and hit[0]() is x.mem and hit[1] == act:
            return hit[2], hit[3]
        n_blocks = x.size // (256 if act == "q8_k" else 32)
        xr = self._alloc(x.shape)
        corr = self._alloc((n_blocks,)) if act == "q8_1" else None
        u = self._uniform(n_blocks, _grid(-(-n_blocks // WG))[0] * WG, 0, 0)
        buffers = {0: x.buf, 1: xr.buf, 2: u}
        if corr is not None:
            buffers[3] = corr.buf
        self._dispatch(self._pipeline("activations", act), buffers, -(-n_blocks // WG))
        if len(self._acts) > 64:
            self._acts = {k: v for k, v in self._acts.items() if v[0]() is not None}
        self._acts[id(x.mem)] = (weakref.ref(x.mem), act, xr, corr)
        return xr, corr

    def matvec_shape(self, tokens: int) -> tuple[int, int]:
        """(rows per invocation R, invocations per row TPR) of the matmul kernel: a CPU driver wants many
        rows per workgroup and no reduction, a GPU coalesced reads."""
        if self.software:
            return 4, 1
        return (2 if tokens == 1 else 1), 16

    def matmul(self, w: GWeight, x: GArray) -> GArray:
        n, k = x.shape[0], x.shape[-1]
        if x.ndim != 2 or k != w.cols:
            raise ValueError(f"matmul of {x.shape} by a ({w.rows}, {w.cols}) weight")
        xr, corr = self._activations(x, w.type)
        out = self._alloc((n, w.rows))
        nt = 1 if n == 1 else PREFILL_TOKENS
        rows, tpr = self.matvec_shape(nt)
        pipe = self._pipeline("matmul", "matvec", w.type, R=rows, NT=nt, TPR=tpr)
        # tokens in groups whose output fits one binding (logits of a long prompt over a large vocabulary);
        # groups of 64 tokens keep every binding offset 256-byte aligned
        per_group = n if 4 * n * w.rows <= self.max_binding else self.max_binding // (4 * w.rows) // 64 * 64
        if per_group == 0:
            raise ValueError(f"{self.name}: one token's {w.rows} outputs exceed 64 of this device's bindings")
        for t0 in range(0, n, per_group):
            g = min(per_group, n - t0)
            y = (out.buf, 4 * t0 * w.rows, 4 * g * w.rows) if per_group < n else out.buf
            xg = (xr.buf, 4 * t0 * k, 4 * g * k) if per_group < n else xr.buf
            for buf, r0, m in w.chunks:
                groups = -(-m // (rows * WG // tpr))
                u = self._uniform(m, k, g, w.row_words, _grid(groups)[0], w.rows, r0, 0)
                buffers = {0: buf, 1: xg, 2: y, 3: u}
                if corr is not None:
                    buffers[4] = (
                        (corr.buf, 4 * t0 * (k // 32), 4 * g * (k // 32)) if per_group < n else corr.buf
                    )
                self._dispatch(pipe, buffers, groups)
        return out

    def rms_norm(self, x: GArray, weight: GArray | None, eps: float) -> GArray:
        n = x.shape[-1]
        rows = x.size // max(n, 1)
        if weight is not None and weight.size != n:
            raise ValueError(f"rms_norm weight of {weight.size} for rows of {n}")
        out = self._alloc(x.shape)
        hi = np.float32(eps)
        lo = np.float32(eps - float(hi))
        u = self._uniform(rows, n, int(weight is not None), _grid(rows)[0], hi, lo, 0, 0)
        w = weight.buf if weight is not None else self._dummy
        self._dispatch(self._pipeline("norm", "main"), {0: x.buf, 1: w, 2: out.buf, 3: u}, rows)
        return out

    def _rope_table(self, spec: RopeSpec, n_pos: int) -> tuple[int, Any, Any]:
        hit = self._ropes.get(id(spec))
        if hit is None or hit[0] is not spec or hit[1] < n_pos:
            have = hit[1] if hit is not None and hit[0] is spec else 0
            size = max(n_pos, 2 * have, 4096)
            cos, sin = rope_table(spec, size)
            u = self.wgpu.BufferUsage
            bufs = [
                self.device.create_buffer_with_data(data=a.reshape(-1), usage=u.STORAGE) for a in (cos, sin)
            ]
            hit = self._ropes[id(spec)] = (spec, size, *bufs)
        return hit[1], hit[2], hit[3]

    def rope(self, x: GArray, positions: np.ndarray, spec: RopeSpec) -> GArray:
        n, heads, dh = x.shape
        pos = np.asarray(positions, np.int64)
        if pos.size and pos.min() < 0:
            raise ValueError("negative position")
        n_pos, cos, sin = self._rope_table(spec, int(pos.max(initial=0)) + 1)
        if self._rec is not None:
            self._rec.rope_limit = min(self._rec.rope_limit, n_pos)
        out = self._alloc(x.shape)
        total = n * heads * (dh // 2)
        u = self._uniform(n, heads, dh, spec.n_dims, int(spec.neox), _grid(-(-total // WG))[0] * WG, 0, 0)
        buffers = {0: x.buf, 1: self._ints(positions, "rope"), 2: cos, 3: sin, 4: out.buf, 5: u}
        self._dispatch(self._pipeline("rope", "main"), buffers, -(-total // WG))
        return out

    def new_kv_cache(self, *args: Any, **kwargs: Any) -> WebGPUKV:
        return WebGPUKV(self, *args, **kwargs)

    def attention(self, q, k, v, kv: WebGPUKV, layer, seq_ids, positions, scale, window=None, softcap=None):
        if not isinstance(kv, WebGPUKV):
            raise TypeError(f"{self.name}: the KV cache must be this backend's own")
        n, n_head, dh = q.shape
        hkv = k.shape[1]
        kv.check(seq_ids, positions)
        kv.sync()
        kc, vc, table, tw = kv.layer(layer)
        seq_buf, pos_buf = self._ints(seq_ids, "attention"), self._ints(positions, "attention")
        common = (n, n_head, hkv, dh, kv.block_size, tw, int(window or 0))
        half_total = n * hkv * (dh // 2)
        gx = _grid(-(-half_total // WG))[0]
        u = self._uniform(*common, gx * WG, float(scale), float(softcap or 0.0), 0, 0)
        base = {0: seq_buf, 1: pos_buf, 2: table, 3: u}
        self._dispatch(
            self._pipeline("attention", "store"),
            {**base, 4: k.buf, 5: v.buf, 6: kc, 7: vc},
            -(-half_total // WG),
        )
        out = self._alloc(q.shape)
        u2 = self._uniform(*common, _grid(n * hkv)[0], float(scale), float(softcap or 0.0), 0, 0)
        z = -(-(n_head // hkv) // MAX_GROUP_WG)
        self._dispatch(
            self._pipeline("attention", "attend"),
            {**base, 3: u2, 4: q.buf, 5: kc, 6: vc, 7: out.buf},
            n * hkv,
            z,
        )
        return out

    def _elementwise(
        self, entry: str, buffers: dict, n: int, *, b_len=1, cols=1, start=0, width=1, f=0.0
    ) -> None:
        groups = -(-n // WG)
        u = self._uniform(n, b_len, cols, start, width, _grid(groups)[0] * WG, float(f), 0)
        self._dispatch(self._pipeline("elementwise", entry), {**buffers, 3: u}, groups)

    def _binary(self, entry: str, a: GArray, b: GArray, **kw: Any) -> GArray:
        out = self._alloc(a.shape)
        bufs = {0: a.buf, 1: b.buf, 2: out.buf}
        if entry == "gelu_mul":
            if self._gelu is None:
                u = self.wgpu.BufferUsage
                self._gelu = self.device.create_buffer_with_data(data=gelu_table_f32(), usage=u.STORAGE)
            bufs[4] = self._gelu
        self._elementwise(entry, bufs, out.size, **kw)
        return out

    def silu_mul(self, gate: GArray, up: GArray) -> GArray:
        return self._binary("silu_mul", gate, up)

    def gelu_mul(self, gate: GArray, up: GArray) -> GArray:
        return self._binary("gelu_mul", gate, up)

    def add(self, a: GArray, b: GArray) -> GArray:
        if b.size != a.size and b.size != a.shape[-1]:
            raise ValueError(f"add of {a.shape} and {b.shape}")
        return self._binary("add", a, b, b_len=b.size)

    def _unary(self, entry: str, x: GArray, f: float) -> GArray:
        out = self._alloc(x.shape)
        self._elementwise(entry, {0: x.buf, 2: out.buf}, out.size, f=f)
        return out

    def scale(self, x: GArray, s: float) -> GArray:
        return self._unary("scale", x, float(np.float32(s)))

    def softcap(self, x: GArray, cap: float) -> GArray:
        return self._unary("softcap", x, float(np.float32(cap)))

    def columns(self, x: GArray, start: int, stop: int) -> GArray:
        out = self._alloc((x.shape[0], stop - start))
        self._elementwise(
            "columns", {0: x.buf, 2: out.buf}, out.size, cols=x.shape[1], start=start, width=stop - start
        )
        return out

    # -- decode steps --------------------------------------------------------------------------------------
    def _argmax(self, logits: GArray) -> Any:
        rows, n = logits.shape
        ids = self.storage(4 * rows)
        if self._rec is not None:
            self._rec.keep.append(ids)
        u = self._uniform(rows, n, _grid(rows)[0], 0)
        self._dispatch(self._pipeline("sample", "argmax"), {0: logits.buf, 1: ids, 2: u}, rows)
        return ids

    def _new_recording(self, tokens, positions, seq_ids) -> Recording:
        inputs = (tokens, positions, seq_ids)
        return Recording(inputs, [self.upload_ints(x, writable=True) for x in inputs])

    def _new_plan(self, rec: Recording, model: Any, kv: Any, logits: GArray, ids: Any) -> _Plan:
        return _Plan(rec, model, kv, logits, ids)

    def _flush(self) -> None:
        self.flush()

    def _replay(self, plan: _Plan, tokens, positions, seq_ids, kv) -> None:
        kv.sync()
        self.flush()
        q = self.device.queue
        for buf, a in zip(plan.buffers, (tokens, positions, seq_ids)):
            q.write_buffer(buf, 0, a.astype(np.int32))
        q.submit([plan.ready or self._plan_commands(plan)])
        # the next step's commands are these again (only the inputs change): encode them now, while the
        # device works on this step, so that encoding is off the next step's critical path
        plan.ready = self._plan_commands(plan)

    def _plan_commands(self, plan: _Plan) -> Any:
        enc = self._encode_raw(plan.raw) if plan.raw is not None else self._encode(plan.work)
        return enc.finish()

    def decode_step(self, model, tokens, positions, seq_ids, kv) -> np.ndarray:
        return self.to_host(self._step(model, tokens, positions, seq_ids, kv)[0])

    def decode_greedy(self, model, tokens, positions, seq_ids, kv) -> np.ndarray:
        ids = self._step(model, tokens, positions, seq_ids, kv)[1]
        data = self.device.queue.read_buffer(ids, 0, 4 * len(tokens))
        return np.frombuffer(data, np.int32)[: len(tokens)].astype(np.int64)


class VulkanBackend(WebGPUBackend):
    kind = "vulkan"


class MetalBackend(WebGPUBackend):
    kind = "metal"


__all__ = ["GArray", "MetalBackend", "VulkanBackend", "WebGPUBackend", "find_adapter"]
