"""`edgellm quantize`: rewrite a GGUF model in another llama-quantize file type, byte for byte as llama.cpp.

Mirrors ggml-org/llama.cpp src/llama-quant.cpp llama_model_quantize_impl: the same tensor order, metadata
(input key/values copied verbatim, then general.quantization_version and general.file_type), per-tensor
types (quant_rules.py), quantizers (kquants.py: ggml-quants.c bit for bit, in Numba) and
alignment, so the file equals llama-quantize's. Everything is checked before a byte is written; the file is
written under a temporary name and renamed at the end, so an interrupted run leaves nothing half-written.
"""

from __future__ import annotations

import os
import shutil
import struct
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from edgellm import kquants, quants
from edgellm import quant_rules as rules
from edgellm.gguf import ModelFile, QTensor
from edgellm.imatrix import ImportanceMatrix

try:
    import edgellm._native as _native
except ImportError:  # built without a C compiler: numpy dequantizes
    _native = None

T = GGMLQuantizationType
GGML_QNT_VERSION = 2  # ggml.h
GGUF_VERSION = 3
_UINT32, _STRING = 4, 8  # gguf_type GGUF_TYPE_UINT32, GGUF_TYPE_STRING
_SLAB_BYTES = 64 << 20  # float32 rows dequantized at a time (llama.cpp's slabs are bounded the same way)
_SPLIT_KEYS = ("split.no", "split.count", "split.tensors.count")


class QuantizeError(ValueError):
    """A request edgellm quantize refuses, before anything is written."""


@dataclass
class TensorPlan:
    tensor: QTensor
    new_type: GGMLQuantizationType
    nbytes: int  # bytes of the new tensor data

    @property
    def copied(self) -> bool:
        return self.new_type == self.tensor.type


@dataclass
class Plan:
    """What a quantization will write: checked before the first byte is."""

    ftype: rules.LlamaFileType
    tensors: list[TensorPlan]
    fallbacks: list[str]
    n_elements: int
    size_in: int
    size_out: int  # the whole output file, header included
    imatrix: dict[str, np.ndarray] = field(default_factory=dict)
    metadata: list[tuple[str, int | bytes]] = field(default_factory=list)  # keys added after file_type


def row_bytes(t: GGMLQuantizationType, n_per_row: int) -> int:
    block, size = GGML_QUANT_SIZES[t]
    return n_per_row // block * size


def quantize_rows(t: GGMLQuantizationType, x: np.ndarray, imatrix: np.ndarray | None, threads: int, out=None):
    """float32 (nrows, n_per_row) -> uint8 (nrows, row bytes), as ggml_quantize_chunk(t, ..., imatrix)."""
    return kquants.quantize_rows(t.name, x, imatrix, threads, out)


QUANTIZABLE = frozenset(rules.TENSOR_TYPES.values())


def _readable(t: GGMLQuantizationType) -> bool:
    try:
        quants.quant_type(t)
    except quants.UnknownQuantType:
        return False
    return True


def _model_shape(m: ModelFile) -> rules.ModelShape:
    arch = m.arch
    n_layer = m.arch_key("block_count")
    if not isinstance(n_layer, int) or n_layer <= 0:
        raise QuantizeError(
            f"{m.path}: no {arch}.block_count in the metadata: not a model llama.cpp can quantize"
        )

    def int_key(suffix: str, default: int) -> int:
        v = m.arch_key(suffix, default)
        if isinstance(v, np.ndarray):  # per-layer head counts (some architectures): llama.cpp reads layer 0
            v = int(v[0]) if v.size else default
        return int(v)

    return rules.ModelShape(
        arch,
        n_layer,
        int_key("attention.head_count", 1),
        int_key("attention.head_count_kv", 1),
        int_key("expert_count", 0),
    )


def make_plan(
    m: ModelFile,
    file_type: str,
    *,
    allow_requantize: bool = False,
    options: rules.Options | None = None,
    imatrix: dict[str, np.ndarray] | None = None,
    extra_metadata: list[tuple[str, int | bytes]] = (),
) -> Plan:
    """Every tensor's new type and size, with every refusal raised here, before anything is written."""
    name = file_type.upper()
    if name not in rules.FILE_TYPES:
        raise QuantizeError(
            f"unknown file type {file_type!r}; edgellm quantize writes: {', '.join(rules.FILE_TYPES)}"
        )
    ftype = rules.FILE_TYPES[name]
    opts = options or rules.Options()
    opts.has_imatrix = bool(imatrix)
    shape = _model_shape(m)
    ordered = sorted(m.tensors.values(), key=lambda t: rules.tensor_order_key(t.name))
    types, fallbacks = rules.plan_types([(t.name, t.ne, t.type) for t in ordered], ftype, shape, opts)
    plans, used_imatrix = [], {}
    for t in ordered:
        new = types[t.name]
        if new != t.type:
            if new not in QUANTIZABLE:
                raise QuantizeError(f"tensor {t.name}: edgellm cannot write type {new.name}")
            if not _readable(t.type):
                raise QuantizeError(
                    f"tensor {t.name}: edgellm cannot read type {t.type.name} to requantize it"
                )
            if rules.is_quantized(t.type) and not allow_requantize:
                raise QuantizeError(
                    f"tensor {t.name} is already {t.type.name}: requantizing is disabled "
                    "(pass --allow-requantize; quality is lower than quantizing the F16/F32 original)"
                )
            if imatrix and t.name in imatrix:
                w = imatrix[t.name]
                n_expert = t.ne[2] if len(t.ne) > 2 else 1
                if w.size == t.ne[0] * n_expert:
                    used_imatrix[t.name] = w
                elif rules.category(t.name) != "token_embd":  # llama.cpp ignores token_embd's mismatch only
                    raise QuantizeError(
                        f"imatrix has {w.size} values for tensor {t.name}, which needs {t.ne[0] * n_expert}"
                    )
        n_rows = t.n_elements // t.ne[0]
        plans.append(TensorPlan(t, new, n_rows * row_bytes(new, t.ne[0])))
    header = len(_header(m, plans, 0, extra_metadata))
    size_out = header + sum(_padded(p.nbytes, m.alignment) for p in plans)
    n_elements = sum(t.n_elements for t in ordered)
    return Plan(
        ftype, plans, fallbacks, n_elements, m.file_size, size_out, used_imatrix, list(extra_metadata)
    )


def _padded(n: int, align: int) -> int:
    return -(-n // align) * align


def _gguf_string(s: str) -> bytes:
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def _kv(key: str, value: int | bytes) -> bytes:
    if isinstance(value, bytes):
        return _gguf_string(key) + struct.pack("<IQ", _STRING, len(value)) + value
    return _gguf_string(key) + struct.pack("<II", _UINT32, value)


def imatrix_metadata(im: ImportanceMatrix, file_name: str) -> list[tuple[str, int | bytes]]:
    """The keys llama-quantize adds for an imatrix (tools/quantize/quantize.cpp: kv overrides, strings cut
    to 127 bytes, counts as uint32, the chunk count only when the file has one)."""
    kv: list[tuple[str, int | bytes]] = [("quantize.imatrix.file", os.fsencode(file_name)[:127])]
    if im.datasets:
        kv.append(("quantize.imatrix.dataset", im.datasets[0].encode()[:127]))
    kv.append(("quantize.imatrix.entries_count", len(im.entries)))
    if im.chunks > 0:
        kv.append(("quantize.imatrix.chunks_count", im.chunks))
    return kv


def _header(
    m: ModelFile, plans: list[TensorPlan], ftype: int = 0, extra: list[tuple[str, int | bytes]] = ()
) -> bytes:
    """gguf_get_meta_data of llama-quantize's output context, alignment padding included: the input's
    key/values in order, each key llama-quantize sets removed from its place and appended."""
    out = [b"GGUF", struct.pack("<I", GGUF_VERSION)]
    added = [("general.quantization_version", GGML_QNT_VERSION), ("general.file_type", int(ftype)), *extra]
    names = {k for k, _ in added} | set(_SPLIT_KEYS)
    kv = [m.metadata_bytes(k) for k in m.metadata if k not in names]
    kv += [_kv(k, v) for k, v in added]
    out.append(struct.pack("<QQ", len(plans), len(kv)))
    out += kv
    offset = 0
    for p in plans:
        ne = p.tensor.ne
        out.append(
            _gguf_string(p.tensor.name)
            + struct.pack(f"<I{len(ne)}QIQ", len(ne), *ne, int(p.new_type), offset)
        )
        offset += _padded(p.nbytes, m.alignment)
    blob = b"".join(out)
    return blob + bytes(_padded(len(blob), m.alignment) - len(blob))


def _dequantize_into(t: QTensor, r0: int, r1: int, x: np.ndarray) -> None:
    """Rows r0..r1 of t as float32 into x: the native runtime's ed_dequantize_row where it is built (the
    same bits as quants.dequantize, and it releases the GIL), else numpy. Refuses NaN and Inf."""
    rows = t.data[r0:r1]
    if _native is None or not _native.lib.ed_dequantize_row(
        int(t.type), _native.ffi.from_buffer(rows), _native.ffi.from_buffer("float[]", x), x.size
    ):
        x[:] = quants.dequantize(rows, t.type, x.shape)
    if not np.isfinite(x).all():
        raise QuantizeError(
            f"tensor {t.name} holds NaN or infinite values: its quantized data would not be valid"
        )


def _slab_part(t: QTensor, new_type, w, r0: int, r1: int, x: np.ndarray, out: np.ndarray) -> None:
    _dequantize_into(t, r0, r1, x)
    quantize_rows(new_type, x, w, 1, out)


class _Slab:
    """A float32 and a uint8 buffer, reused for every tensor (fresh ones cost a page fault per 4 KiB)."""

    def __init__(self) -> None:
        self.x = np.empty(_SLAB_BYTES // 4, np.float32)
        self.q = np.empty(_SLAB_BYTES, np.uint8)
        self.pending: Future | None = None  # the write of its last contents


class _Writer:
    """Writes the file in order on a thread of its own, so the disk works while the next slab is being
    computed: two slabs, one filling while the other is written."""

    def __init__(self, f) -> None:
        self._f = f
        self._thread = ThreadPoolExecutor(1)
        self._slabs = [_Slab(), _Slab()]
        self._turn = 0
        self._writes: list[Future] = []

    def slab(self) -> _Slab:
        s = self._slabs[self._turn]
        self._turn ^= 1
        if s.pending is not None:
            s.pending.result()
        return s

    def submit(self, fn, *args, slab: _Slab | None = None) -> None:
        keep = []
        for w in self._writes:  # a write that failed raises here, at the next one
            if w.done():
                w.result()
            else:
                keep.append(w)
        self._writes = [*keep, self._thread.submit(fn, *args)]
        fut = self._writes[-1]
        if slab is not None:
            slab.pending = fut

    def write(self, data, slab: _Slab | None = None) -> None:
        self.submit(self._f.write, data, slab=slab)

    def close(self, failed: bool) -> None:
        """Wait for every write (raising the first error), or on failure just stop."""
        self._thread.shutdown(wait=True, cancel_futures=failed)
        if not failed:
            for w in self._writes:
                w.result()


def _quantize_tensor(
    p: TensorPlan, w: np.ndarray | None, pool: ThreadPoolExecutor, threads: int, out: _Writer
):
    """Dequantize and quantize tensor p slab by slab, each slab's rows split over the pool's threads;
    yields the elements done after each slab."""
    t = p.tensor
    n_per_row = t.ne[0]
    n_rows = t.n_elements // n_per_row
    rows_per_expert = t.ne[1] if len(t.ne) > 1 else 1
    out_row = row_bytes(p.new_type, n_per_row)
    step = max(1, min(n_rows, _SLAB_BYTES // (4 * n_per_row), _SLAB_BYTES // out_row))
    r = 0
    while r < n_rows:
        # a slab never crosses an expert boundary: each expert has its own slice of the imatrix
        n = min(step, n_rows - r, rows_per_expert - r % rows_per_expert)
        slab = out.slab()
        x = slab.x[: n * n_per_row].reshape(n, n_per_row)
        qout = slab.q[: n * out_row].reshape(n, out_row)
        e = r // rows_per_expert
        w_e = None if w is None else w[e * n_per_row : (e + 1) * n_per_row]
        bounds = np.linspace(0, n, min(4 * threads, n) + 1).astype(int)
        parts = [(r + a, r + b, x[a:b], qout[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
        for f in [pool.submit(_slab_part, t, p.new_type, w_e, *part) for part in parts]:
            f.result()
        out.write(qout, slab)
        yield n * n_per_row
        r += n


@dataclass
class Report:
    plan: Plan
    seconds: float
    path: Path


def quantize_model(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    file_type: str,
    *,
    allow_requantize: bool = False,
    options: rules.Options | None = None,
    imatrix: str | os.PathLike | ImportanceMatrix | dict[str, np.ndarray] | None = None,
    imatrix_name: str | None = None,
    threads: int | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> Report:
    """Quantize `src` to `dst` as `llama-quantize [--allow-requantize] src dst file_type threads` does.

    `imatrix`: llama-imatrix's file (its path is recorded in the output's metadata, as llama-quantize
    does), an ImportanceMatrix read from the file `imatrix_name`, or bare {tensor name: weights}.
    `progress(tensor name, elements done, elements total)` is called as the work goes."""
    t0 = time.perf_counter()
    extra: list[tuple[str, int | bytes]] = []
    if isinstance(imatrix, (str, os.PathLike)):
        from edgellm.imatrix import load_imatrix

        im_name, imatrix = os.fspath(imatrix), load_imatrix(imatrix)
        extra = imatrix_metadata(imatrix, im_name)
    if isinstance(imatrix, ImportanceMatrix):
        extra = extra or imatrix_metadata(imatrix, imatrix_name or "")
        imatrix = imatrix.entries
    src, dst = Path(src), Path(dst)
    if dst.exists() and dst.resolve() == src.resolve():
        raise QuantizeError("the output file is the input file: write to another path")
    if not dst.parent.is_dir():
        raise QuantizeError(f"no such directory: {dst.parent}")
    threads = max(1, threads or os.cpu_count() or 1)
    with ModelFile(src) as m:
        plan = make_plan(
            m,
            file_type,
            allow_requantize=allow_requantize,
            options=options,
            imatrix=imatrix,
            extra_metadata=extra,
        )
        free = shutil.disk_usage(dst.parent).free
        if plan.size_out > free:
            raise QuantizeError(
                f"not enough disk space in {dst.parent}: the output needs {plan.size_out / 2**20:.1f} MiB, "
                f"{free / 2**20:.1f} MiB are free"
            )
        fd, tmp_name = tempfile.mkstemp(dir=dst.parent, prefix=f".{dst.name}.", suffix=".partial")
        tmp = Path(tmp_name)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(_header(m, plan.tensors, plan.ftype, plan.metadata))
                done = [0]

                def advance(n: int, name: str = "") -> None:
                    done[0] += n
                    if progress:
                        progress(name, done[0], plan.n_elements)

                out, failed = _Writer(f), True
                try:
                    with ThreadPoolExecutor(threads) as pool:
                        for p in plan.tensors:
                            if p.copied:
                                out.write(p.tensor.data)
                                advance(p.tensor.n_elements, p.tensor.name)
                            else:
                                w = plan.imatrix.get(p.tensor.name)
                                for n in _quantize_tensor(p, w, pool, threads, out):
                                    advance(n, p.tensor.name)
                            out.write(bytes(_padded(p.nbytes, m.alignment) - p.nbytes))
                            out.submit(m.evict, p.tensor)  # after its last read, in the writer's order
                    failed = False
                finally:
                    out.close(failed)
                f.flush()
                os.fsync(f.fileno())
            if tmp.stat().st_size != plan.size_out:  # a bug, not a user error: never rename a wrong file
                raise RuntimeError(f"wrote {tmp.stat().st_size} bytes, planned {plan.size_out}")
            os.replace(tmp, dst)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    return Report(plan, time.perf_counter() - t0, dst)
