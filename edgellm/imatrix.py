"""Importance matrices (llama-imatrix's GGUF and legacy .dat files) read into the floats llama-quantize uses.

Mirrors ggml-org/llama.cpp common/imatrix-loader.cpp `common_imatrix_load` (+ `_load_legacy`) and
tools/quantize/quantize.cpp `load_imatrix` (sums / counts, per expert) and src/llama-quant.cpp's
non-finite check. A damaged file raises `ImatrixError` naming what is wrong; nothing is allocated beyond
what the file holds.
"""

from __future__ import annotations

import mmap
import os
import stat
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType

from edgellm.gguf import UINT32, GGUFError, ModelFile, StringArray

F32 = np.float32
# common/imatrix-loader.h
KEY_DATASETS = "imatrix.datasets"
KEY_CHUNK_COUNT = "imatrix.chunk_count"
KEY_CHUNK_SIZE = "imatrix.chunk_size"
SUM_SUFFIX, COUNT_SUFFIX = ".in_sum2", ".counts"
_I32 = struct.Struct("<i")


class ImatrixError(ValueError):
    """An importance-matrix file llama-quantize would refuse (or crash on); the message says why."""


@dataclass
class ImportanceMatrix:
    """What llama-quantize hands its quantizers: per tensor name the float32 weights, expert after expert
    (tensor ne[0] values for each of its ne[2] experts), plus the file's provenance."""

    entries: dict[str, np.ndarray]  # name -> float32 (n_per_row * n_expert,)
    datasets: list[str] = field(default_factory=list)  # text files it was computed on ([] if absent)
    chunks: int = 0  # chunks of text processed (0 if absent)
    chunk_size: int = 0  # tokens per chunk (GGUF files only; 0 for legacy)
    legacy: bool = False  # read from the legacy .dat format


def load_imatrix(path: str | os.PathLike) -> ImportanceMatrix:
    """Read a llama-imatrix output file, GGUF or legacy .dat (told apart, as llama.cpp does, by whether
    it is a GGUF file). Raises ImatrixError for a damaged or unknown file, FileNotFoundError if absent."""
    path = Path(path)
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise ImatrixError(f"{path}: not a regular file")
    with open(path, "rb") as f:
        head = f.read(4)
    if head == b"GGUF":
        im = _load_gguf(path)
    else:
        im = _load_legacy(path, st.st_size)
    _check_finite(path, im.entries)
    return im


# -- GGUF format: per tensor <name>.in_sum2 (ne0, n_expert) raw sums and <name>.counts (1, n_expert) ------


def _load_gguf(path: Path) -> ImportanceMatrix:
    try:
        with ModelFile(path) as m:
            return _from_model_file(path, m)
    except GGUFError as e:
        raise ImatrixError(f"damaged GGUF imatrix: {e}") from None


def _from_model_file(path: Path, m: ModelFile) -> ImportanceMatrix:
    if not m.tensors:
        raise ImatrixError(f"{path}: no data (the GGUF file holds no tensors)")
    # gguf_init_from_file reading the data (no_alloc = false) wants the tensors back to back in file
    # order, each padded to the alignment, and the whole padded blob present
    end = m.data_offset
    for t in m.tensors.values():
        if t.offset != end:
            raise ImatrixError(
                f"{path}: tensor {t.name!r} has data offset {t.offset - m.data_offset}, "
                f"expected {end - m.data_offset} (tensors must be stored back to back)"
            )
        end += -(-t.nbytes // m.alignment) * m.alignment
    if end > m.file_size:
        raise ImatrixError(
            f"{path}: truncated file: tensor data needs {end} bytes, the file has {m.file_size}"
        )
    missing = [k for k in (KEY_DATASETS, KEY_CHUNK_COUNT, KEY_CHUNK_SIZE) if k not in m]
    if missing:  # quantize.cpp load_imatrix: "missing imatrix metadata"
        raise ImatrixError(f"{path}: missing imatrix metadata {', '.join(missing)}: not an imatrix file")
    for key in (KEY_CHUNK_COUNT, KEY_CHUNK_SIZE):  # read with gguf_get_val_u32, which asserts the type
        if m.metadata_types[key] != UINT32:
            raise ImatrixError(f"{path}: {key} must be a uint32, got a {m.type_name(key)}")
    # datasets of any other type are ignored, as llama.cpp ignores them
    ds = m[KEY_DATASETS]
    datasets = ds.tolist() if isinstance(ds, StringArray) else []

    pairs: dict[str, list] = {}
    for name, t in m.tensors.items():
        for i, suffix in enumerate((SUM_SUFFIX, COUNT_SUFFIX)):
            if name.endswith(suffix):  # other tensors are ignored
                pairs.setdefault(name[: -len(suffix)], [None, None])[i] = t
    entries = {}
    for name in sorted(pairs):
        sums, counts = pairs[name]
        if sums is None or counts is None:
            raise ImatrixError(
                f"{path}: mismatched sums and counts for {name!r} (one of the pair is missing)"
            )
        for t in (sums, counts):
            if t.type != GGMLQuantizationType.F32:
                raise ImatrixError(f"{path}: {t.name} must be F32, got {t.type.name}")
        s = sums.data.reshape(-1).view("<f4").astype(F32)
        c = counts.data.reshape(-1).view("<f4")
        if s.size % c.size:
            raise ImatrixError(
                f"{path}: {name}: {s.size} sums do not split evenly over {c.size} experts' counts"
            )
        entries[name] = _normalize(s.reshape(c.size, -1), _lround(path, name, c))
    return ImportanceMatrix(entries, datasets, int(m[KEY_CHUNK_COUNT]), int(m[KEY_CHUNK_SIZE]), legacy=False)


def _lround(path: Path, name: str, c: np.ndarray) -> np.ndarray:
    """std::lround of each float32 count: half away from zero, exact (done in float64)."""
    c = c.astype(np.float64)
    if not np.all(np.isfinite(c)) or np.any(np.abs(c) >= 2.0**62):
        bad = c[~np.isfinite(c) | (np.abs(c) >= 2.0**62)][0]
        raise ImatrixError(f"{path}: {name}{COUNT_SUFFIX} holds an impossible count {bad}")
    r = np.trunc(c)
    r += np.where(np.abs(c - r) >= 0.5, np.sign(c), 0.0)
    return r.astype(np.int64)


def _normalize(sums: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """quantize.cpp load_imatrix: each expert's sums / float(count); an expert never seen (count <= 0)
    gets weight 1 everywhere."""
    count = counts.astype(F32)[:, None]  # (float) int64: round to nearest, as C converts
    with np.errstate(divide="ignore", invalid="ignore"):
        e = np.where(count > 0, sums / np.where(count > 0, count, F32(1)), F32(1)).astype(F32)
    return e.reshape(-1)


# -- legacy format: int32 n_entries, then per entry: int32 len, name, int32 ncall, int32 nval,
#    float32[nval] (sum/count)*ncall; then optionally int32 chunk count, int32 len, dataset name ---------


class _Cursor:
    def __init__(self, path: Path, buf, size: int):
        self.path, self.buf, self.size, self.pos = path, buf, size, 0

    def need(self, n: int, what: str) -> None:
        if self.pos + n > self.size:
            left = self.size - self.pos
            raise ImatrixError(
                f"{self.path}: truncated file: {what} needs {n} bytes at byte {self.pos}, {left} left"
            )

    def i32(self, what: str) -> int:
        self.need(4, what)
        v = _I32.unpack_from(self.buf, self.pos)[0]
        self.pos += 4
        return v

    def cstring(self, n: int, what: str) -> str:
        """n bytes read as llama.cpp reads them: a C string, cut at the first NUL."""
        self.need(n, what)
        raw = bytes(self.buf[self.pos : self.pos + n]).split(b"\0", 1)[0]
        self.pos += n
        return raw.decode("utf-8", errors="surrogateescape")


def _load_legacy(path: Path, size: int) -> ImportanceMatrix:
    if size < 4:
        raise ImatrixError(f"{path}: {size}-byte file is neither a GGUF nor a legacy imatrix file")
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        buf = memoryview(mm)
        try:
            return _parse_legacy(_Cursor(path, buf, len(mm)))
        finally:
            buf.release()


def _parse_legacy(r: _Cursor) -> ImportanceMatrix:
    path = r.path
    n_entries = r.i32("entry count")
    if n_entries < 1:
        raise ImatrixError(f"{path}: no data (entry count {n_entries}); not an imatrix file")
    if n_entries > r.size // 16:  # each entry takes at least 16 bytes
        raise ImatrixError(
            f"{path}: entry count {n_entries} is impossible for a {r.size}-byte file: not an imatrix file"
        )
    raw: dict[str, tuple[np.ndarray, int]] = {}
    for i in range(n_entries):
        start = r.pos
        n = r.i32(f"name length of entry {i + 1}")
        if n < 0:
            raise ImatrixError(f"{path}: entry {i + 1} at byte {start}: negative name length {n}")
        name = r.cstring(n, f"name of entry {i + 1}")
        ncall = r.i32(f"call count of {name!r}")
        nval = r.i32(f"value count of {name!r}")
        if nval < 1:
            raise ImatrixError(f"{path}: entry {i + 1} ({name!r}) at byte {start}: {nval} values")
        r.need(4 * nval, f"{nval} values of {name!r}")
        sums = np.frombuffer(r.buf, "<f4", nval, r.pos).astype(F32)
        r.pos += 4 * nval
        raw[name] = (sums, ncall)  # a repeated name replaces the earlier entry, as in llama.cpp's map

    chunks, datasets = 0, []
    if r.pos < r.size:  # the trailer is optional; old files end after the chunk count
        chunks = r.i32("chunk count after the entries")
        if r.pos < r.size:
            n = r.i32("dataset name length")
            if n > 0:
                datasets.append(r.cstring(n, "dataset name"))
    # trailing bytes past the dataset name are ignored, as llama.cpp ignores them

    entries = {}
    for name in sorted(raw):
        sums, ncall = raw[name]
        # the file holds (sum/count)*ncall: quantize.cpp divides by ncall again (float / int64 -> float)
        entries[name] = (sums / F32(ncall)).astype(F32) if ncall > 0 else sums
    return ImportanceMatrix(entries, datasets, chunks, 0, legacy=True)


def _check_finite(path: Path, entries: dict[str, np.ndarray]) -> None:
    """llama-quant.cpp refuses an imatrix holding NaN or inf (after the division by counts)."""
    for name, e in entries.items():
        bad = np.flatnonzero(~np.isfinite(e))
        if bad.size:
            i = int(bad[0])
            raise ImatrixError(
                f"{path}: {name}: non-finite value {e[i]} at index {i} "
                "(llama-quantize refuses it: 'imatrix contains non-finite value')"
            )
