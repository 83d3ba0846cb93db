"""ModelFile: a GGUF file opened over one read-only mmap, validated before anything reads it.

Promises: opening is fast (token arrays are indexed in bulk, never turned into per-token Python objects
up front), every tensor is a zero-copy view into the mapping, and a malformed file raises `GGUFError`
naming what is wrong and the byte offset -- it never segfaults, hangs or allocates unbounded memory.
Format: ggml-org/llama.cpp `ggml/include/gguf.h` / `ggml/src/gguf.cpp` (versions 2 and 3).
"""

from __future__ import annotations

import io
import mmap
import os
import stat
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from edgellm.hugepages import huge_buffer

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS
# gguf.cpp rejects arrays of arrays outright; gguf-py writes them, so we read them, but only this deep
# (a file of nested one-element arrays would otherwise recurse until Python's stack gives out).
MAX_ARRAY_DEPTH = 8

# GGUF metadata value types (gguf.h: enum gguf_type)
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)
_SCALAR_DTYPES = {
    UINT8: np.dtype("<u1"),
    INT8: np.dtype("<i1"),
    UINT16: np.dtype("<u2"),
    INT16: np.dtype("<i2"),
    UINT32: np.dtype("<u4"),
    INT32: np.dtype("<i4"),
    FLOAT32: np.dtype("<f4"),
    BOOL: np.dtype("u1"),
    UINT64: np.dtype("<u8"),
    INT64: np.dtype("<i8"),
    FLOAT64: np.dtype("<f8"),
}
_TYPE_NAMES = [
    "uint8",
    "int8",
    "uint16",
    "int16",
    "uint32",
    "int32",
    "float32",
    "bool",
    "string",
    "array",
    "uint64",
    "int64",
    "float64",
]
_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")


class GGUFError(ValueError):
    """A GGUF file is malformed or unsupported; the message names the problem and the byte offset."""

    def __init__(self, message: str, offset: int | None = None, path: str | os.PathLike | None = None):
        where = f" at byte {offset}" if offset is not None else ""
        prefix = f"{path}: " if path is not None else ""
        super().__init__(f"{prefix}{message}{where}")
        self.offset = offset


class StringArray:
    """A GGUF array of strings, indexed once in bulk; items are decoded only when asked for."""

    def __init__(self, buf: memoryview, offsets: np.ndarray, lengths: np.ndarray):
        self._buf = buf
        self.offsets = offsets  # (n,) int64: byte offset of each string's first byte in the file
        self.lengths = lengths  # (n,) int64

    def __len__(self) -> int:
        return len(self.offsets)

    def bytes_at(self, i: int) -> bytes:
        o = int(self.offsets[i])
        return bytes(self._buf[o : o + int(self.lengths[i])])

    def __getitem__(self, i: int) -> str:
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        return self.bytes_at(i).decode("utf-8", errors="replace")

    def __iter__(self) -> Iterator[str]:
        return iter(self.tolist())

    def tolist(self) -> list[str]:
        return [b.decode("utf-8", errors="replace") for b in self.tobytes_list()]

    def tobytes_list(self) -> list[bytes]:
        if len(self) == 0:
            return []
        # one copy of the whole span, then slices: much faster than len(self) separate mmap reads
        start = int(self.offsets[0])
        end = int(self.offsets[-1] + self.lengths[-1])
        blob = bytes(self._buf[start:end])
        rel = (self.offsets - start).tolist()
        return [blob[o : o + n] for o, n in zip(rel, self.lengths.tolist(), strict=True)]

    def __repr__(self) -> str:
        return f"StringArray(n={len(self)})"


def array_element_type(v: Any) -> str | None:
    """GGUF element type name of a metadata array as ModelFile reads it ("float32", "string", "array"),
    or None for a scalar: known from the array object, without reading its items."""
    if isinstance(v, StringArray):
        return "string"
    if isinstance(v, np.ndarray):
        return v.dtype.name  # the GGUF scalar types map one to one onto these numpy names
    if isinstance(v, list):
        return "array"
    return None


def describe_value(v: Any, width: int = 40) -> str:
    """A metadata value as one-line error messages show it: scalars by repr (long ones cut), arrays by
    their length and element type."""
    et = array_element_type(v)
    if et is not None:
        return f"<{et}[{len(v)}]>"  # e.g. <float32[262144]>
    r = repr(v)
    return r if len(r) <= width else r[: width - 3] + "..."


@dataclass(frozen=True)
class QTensor:
    """A tensor as stored: ggml type, shape and a zero-copy view of its raw quantized blocks."""

    name: str
    type: GGMLQuantizationType
    ne: tuple[int, ...]  # ggml order: ne[0] is the row length (innermost)
    offset: int  # absolute byte offset of the data in the file
    nbytes: int
    data: np.ndarray = field(repr=False)  # uint8 (n_rows, row_bytes): raw blocks, read-only mmap view

    @property
    def shape(self) -> tuple[int, ...]:
        """Numpy order: (..., rows, row_length)."""
        return tuple(reversed(self.ne))

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.ne, dtype=np.int64))

    @property
    def type_name(self) -> str:
        return self.type.name

    def dequantize(self) -> np.ndarray:
        """float32 array of `shape`, via the numpy reference dequantizer."""
        from edgellm import quants  # local: quants is only needed when a tensor is materialized

        return quants.dequantize(self.data, self.type, self.shape)


class _Reader:
    """Bounds-checked little-endian cursor over the mapping; every read validates against the file size."""

    def __init__(self, buf: memoryview, path):
        self.buf = buf
        self.size = len(buf)
        self.pos = 0
        self.path = path

    def error(self, msg: str, offset: int | None = None) -> GGUFError:
        return GGUFError(msg, self.pos if offset is None else offset, self.path)

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise self.error(f"truncated file: {what} needs {n} bytes, {self.size - self.pos} left")

    def u32(self, what: str) -> int:
        self.need(4, what)
        v = _U32.unpack_from(self.buf, self.pos)[0]
        self.pos += 4
        return v

    def u64(self, what: str) -> int:
        self.need(8, what)
        v = _U64.unpack_from(self.buf, self.pos)[0]
        self.pos += 8
        return v

    def string(self, what: str) -> str:
        start = self.pos
        n = self.u64(f"length of {what}")
        if n > self.size - self.pos:
            raise self.error(f"{what}: string length {n} runs past end of file", start)
        s = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        try:
            return s.decode("utf-8")
        except UnicodeDecodeError as e:
            raise self.error(f"{what}: invalid UTF-8", start) from e

    def scalar(self, vtype: int, what: str) -> Any:
        dt = _SCALAR_DTYPES[vtype]
        self.need(dt.itemsize, what)
        v = np.frombuffer(self.buf, dt, 1, self.pos)[0]
        self.pos += dt.itemsize
        if vtype == BOOL:
            return bool(v)
        return float(v) if dt.kind == "f" else int(v)

    def value(self, vtype: int, what: str) -> Any:
        if vtype in _SCALAR_DTYPES:
            return self.scalar(vtype, what)
        if vtype == STRING:
            return self.string(what)
        if vtype == ARRAY:
            return self.array(what)
        raise self.error(f"{what}: unknown metadata value type {vtype}", self.pos - 4)

    def array(self, what: str, depth: int = 1) -> Any:
        start = self.pos
        if depth > MAX_ARRAY_DEPTH:
            raise self.error(f"{what}: arrays nested more than {MAX_ARRAY_DEPTH} deep", start)
        etype = self.u32(f"element type of {what}")
        n = self.u64(f"length of {what}")
        if etype in _SCALAR_DTYPES:
            dt = _SCALAR_DTYPES[etype]
            if n > (self.size - self.pos) // dt.itemsize:
                raise self.error(f"{what}: array of {n} {_TYPE_NAMES[etype]} runs past end of file", start)
            arr = np.frombuffer(self.buf, dt, n, self.pos)
            self.pos += n * dt.itemsize
            return arr.astype(bool) if etype == BOOL else arr
        if etype == STRING:
            # each string takes at least its 8-byte length, which bounds n before we allocate anything
            if n > (self.size - self.pos) // 8:
                raise self.error(f"{what}: array of {n} strings runs past end of file", start)
            return self._string_array(n, what)
        if etype == ARRAY:
            if n > (self.size - self.pos) // 12:
                raise self.error(f"{what}: array of {n} arrays runs past end of file", start)
            return [self.array(f"{what}[{i}]", depth + 1) for i in range(n)]
        raise self.error(f"{what}: unknown array element type {etype}", start)

    def _string_array(self, n: int, what: str) -> StringArray:
        offsets = np.empty(n, np.int64)
        lengths = np.empty(n, np.int64)
        buf, size, unpack = self.buf, self.size, _U64.unpack_from
        pos = self.pos
        # The hot loop of opening a model (262k strings for Gemma): keep it to one unpack and a compare.
        for i in range(n):
            if pos + 8 > size:
                raise GGUFError(f"truncated file: {what}[{i}] length", pos, self.path)
            ln = unpack(buf, pos)[0]
            pos += 8
            if ln > size - pos:
                raise GGUFError(f"{what}[{i}]: string length {ln} runs past end of file", pos - 8, self.path)
            offsets[i] = pos
            lengths[i] = ln
            pos += ln
        self.pos = pos
        return StringArray(buf, offsets, lengths)


class ModelFile:
    """A GGUF file: typed metadata and tensors as raw block views into one read-only mmap."""

    def __init__(self, path: str | os.PathLike, *, use_mmap: bool = True, metadata_only: bool = False):
        """Open and validate `path`. `metadata_only` reads the header and skips tensors (a file cut short
        after its header, like a vocabulary donor, opens this way)."""
        self.path = Path(path)
        self._metadata_only = metadata_only
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            raise FileNotFoundError(f"no such model file: {self.path}") from None
        # checked before open(): opening a FIFO would block, and mmap of a directory fails with EINVAL
        if stat.S_ISDIR(st.st_mode):
            raise GGUFError("is a directory, not a GGUF file", path=self.path)
        if not stat.S_ISREG(st.st_mode):
            raise GGUFError("not a regular file", path=self.path)
        fd = os.open(self.path, os.O_RDONLY)
        try:
            self.file_size = os.fstat(fd).st_size
            if self.file_size < 24:  # magic, version and the two counts; mmap cannot map an empty file
                head = os.read(fd, 4)
                if self.file_size == 0:
                    raise GGUFError("empty file, not a GGUF file", 0, self.path)
                if head != GGUF_MAGIC[: len(head)]:
                    raise GGUFError(f"not a GGUF file (magic {head!r}, expected b'GGUF')", 0, self.path)
                raise GGUFError(
                    f"truncated file: the GGUF header needs 24 bytes, the file has {self.file_size}",
                    self.file_size,
                    self.path,
                )
            if use_mmap:
                self._mmap: mmap.mmap | None = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
                self._buf = memoryview(self._mmap)
            else:  # --no-mmap: read the whole file into memory
                self._mmap = None
                self._buf = memoryview(_read_all(fd))
        finally:
            os.close(fd)
        try:
            self._parse()
        except (struct.error, OverflowError, MemoryError, RecursionError) as e:  # belt and braces
            raise GGUFError(f"malformed file ({e})", path=self.path) from e

    @property
    def buffer(self) -> memoryview:
        """The whole file's bytes: the read-only mapping, or with use_mmap=False the copy read in."""
        return self._buf

    @property
    def mapped(self) -> bool:
        return self._mmap is not None

    # -- parsing ---------------------------------------------------------------------------------------
    def _parse(self) -> None:
        r = _Reader(self._buf, self.path)
        magic = bytes(r.buf[0:4])
        if magic != GGUF_MAGIC:
            raise GGUFError(f"not a GGUF file (magic {magic!r}, expected b'GGUF')", 0, self.path)
        r.pos = 4
        version = r.u32("version")
        if version not in SUPPORTED_VERSIONS:
            swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
            if swapped in (1, 2, 3):
                raise GGUFError(
                    "big-endian GGUF files are not supported (convert it on a little-endian machine)",
                    4,
                    self.path,
                )
            raise GGUFError(f"unsupported GGUF version {version} (supported: 2, 3)", 4, self.path)
        self.version = version
        n_tensors = r.u64("tensor count")
        n_kv = r.u64("metadata count")
        # each tensor info takes >= 8+4+8+4+8 bytes, each key/value >= 8+4+1: bound counts by the file size
        if n_tensors > r.size // 32:
            raise GGUFError(f"tensor count {n_tensors} is impossible for a {r.size}-byte file", 8, self.path)
        if n_kv > r.size // 13:
            raise GGUFError(f"metadata count {n_kv} is impossible for a {r.size}-byte file", 16, self.path)

        self.metadata: dict[str, Any] = {}
        self.metadata_types: dict[str, int] = {}
        # each key/value pair's bytes [start, end) in the file, which a writer copies (edgellm quantize)
        self.metadata_spans: dict[str, tuple[int, int]] = {}
        key_offsets: dict[str, int] = {}
        for i in range(n_kv):
            kpos = r.pos
            key = r.string(f"metadata key #{i}")
            if key in self.metadata:
                raise GGUFError(f"duplicate metadata key {key!r}", kpos, self.path)
            vtype = r.u32(f"type of {key!r}")
            self.metadata[key] = r.value(vtype, f"value of {key!r}")
            self.metadata_types[key] = vtype
            self.metadata_spans[key] = (kpos, r.pos)
            key_offsets[key] = kpos

        # gguf.cpp: general.alignment must be a uint32 and a power of two
        alignment = self.metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if "general.alignment" in self.metadata and self.metadata_types["general.alignment"] != UINT32:
            vt = self.metadata_types["general.alignment"]
            raise GGUFError(
                f"general.alignment must be a uint32, got a {_TYPE_NAMES[vt]}",
                key_offsets["general.alignment"],
                self.path,
            )
        if alignment <= 0 or alignment & (alignment - 1):
            raise GGUFError(
                f"general.alignment must be a power of two, got {alignment!r}",
                key_offsets["general.alignment"],
                self.path,
            )
        self.alignment = alignment

        infos = []
        for i in range(n_tensors):
            ipos = r.pos
            name = r.string(f"name of tensor #{i}")
            n_dims = r.u32(f"dims of {name!r}")
            if not 1 <= n_dims <= MAX_DIMS:
                msg = f"tensor {name!r}: {n_dims} dimensions (1..{MAX_DIMS} allowed)"
                raise GGUFError(msg, ipos, self.path)
            ne = tuple(r.u64(f"shape of {name!r}") for _ in range(n_dims))
            tpos = r.pos
            raw_type = r.u32(f"type of {name!r}")
            offset = r.u64(f"offset of {name!r}")
            infos.append((ipos, tpos, name, ne, raw_type, offset))

        self.data_offset = -(-r.pos // alignment) * alignment
        self.tensors: dict[str, QTensor] = {}
        if self._metadata_only:
            return
        # like gguf.cpp, only a file with tensors needs its data section (the padding) to exist
        if infos and self.data_offset > r.size:
            raise GGUFError("truncated file: tensor data section starts past end of file", r.pos, self.path)
        for ipos, tpos, name, ne, raw_type, offset in infos:
            if name in self.tensors:
                raise GGUFError(f"duplicate tensor name {name!r}", ipos, self.path)
            self.tensors[name] = self._tensor(ipos, tpos, name, ne, raw_type, offset)

    def _tensor(self, ipos, tpos, name, ne, raw_type, offset) -> QTensor:
        try:
            qtype = GGMLQuantizationType(raw_type)
        except ValueError:
            raise GGUFError(f"tensor {name!r}: unknown ggml type {raw_type}", tpos, self.path) from None
        if qtype not in GGML_QUANT_SIZES:
            msg = f"tensor {name!r}: ggml type {qtype.name} has no known block layout"
            raise GGUFError(msg, tpos, self.path)
        block_size, type_size = GGML_QUANT_SIZES[qtype]
        if any(d == 0 for d in ne):
            raise GGUFError(f"tensor {name!r}: zero-size dimension in shape {list(ne)}", ipos, self.path)
        if any(d > 2**62 for d in ne):
            raise GGUFError(f"tensor {name!r}: absurd shape {list(ne)}", ipos, self.path)
        if ne[0] % block_size:
            raise GGUFError(
                f"tensor {name!r}: row length {ne[0]} is not a multiple of {qtype.name}'s block "
                f"size {block_size}",
                ipos,
                self.path,
            )
        n_rows = 1
        for d in ne[1:]:
            n_rows *= d
        row_bytes = ne[0] // block_size * type_size
        nbytes = row_bytes * n_rows
        if offset % self.alignment:
            raise GGUFError(
                f"tensor {name!r}: data offset {offset} is not aligned to {self.alignment}",
                tpos + 4,
                self.path,
            )
        start = self.data_offset + offset
        if nbytes > self.file_size or start + nbytes > self.file_size:
            raise GGUFError(
                f"tensor {name!r}: data [{start}, {start + nbytes}) runs past end of file "
                f"({self.file_size} bytes)",
                tpos + 4,
                self.path,
            )
        data = np.frombuffer(self._buf, np.uint8, nbytes, start).reshape(n_rows, row_bytes)
        return QTensor(name, qtype, ne, start, nbytes, data)

    # -- access ----------------------------------------------------------------------------------------
    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def evict(self, t: QTensor, start: int = 0, nbytes: int | None = None) -> None:
        """Let the kernel drop tensor t's pages from this process's memory (read again from the file if
        touched): llama.cpp's unmap_weight, so one pass over a model never holds all of it at once.
        `start`/`nbytes`: only the pages wholly inside that span of the tensor's bytes."""
        if self._mmap is None or not hasattr(mmap, "MADV_DONTNEED"):
            return
        lo = t.offset + start
        hi = t.offset + (t.nbytes if nbytes is None else min(t.nbytes, start + nbytes))
        if nbytes is None:  # the whole tensor: its first and last pages too
            lo -= lo % mmap.PAGESIZE
        else:
            lo += -lo % mmap.PAGESIZE
            hi -= hi % mmap.PAGESIZE
        if hi > lo:
            self._mmap.madvise(mmap.MADV_DONTNEED, lo, hi - lo)

    def metadata_bytes(self, key: str) -> bytes:
        """The key/value pair `key` exactly as the file encodes it (key string, type, value)."""
        start, end = self.metadata_spans[key]
        return bytes(self._buf[start:end])

    def __getitem__(self, key: str) -> Any:
        return self.metadata[key]

    def __contains__(self, key: str) -> bool:
        return key in self.metadata

    def type_name(self, key: str) -> str:
        """GGUF type of metadata `key` ("uint32", "string", "array of float32"), for error messages."""
        vtype = self.metadata_types.get(key)
        name = _TYPE_NAMES[vtype] if vtype is not None else type(self.metadata.get(key)).__name__
        et = array_element_type(self.metadata.get(key))
        return f"array of {et}" if et is not None else name

    @property
    def arch(self) -> str:
        return str(self.metadata.get("general.architecture", "unknown"))

    def arch_key(self, suffix: str, default: Any = None) -> Any:
        """`{arch}.{suffix}` metadata, e.g. arch_key("block_count")."""
        return self.metadata.get(f"{self.arch}.{suffix}", default)

    def close(self) -> None:
        # tensor views keep the buffer exported; dropping references lets the mapping close with the object
        self.tensors = {}
        self.metadata = {}

    def __enter__(self) -> ModelFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ModelFile({str(self.path)!r}, arch={self.arch!r}, tensors={len(self.tensors)})"


def _read_all(fd: int) -> memoryview:
    """The file's bytes, read into memory of their own in huge pages (decode streams the weights from it:
    edgellm/hugepages.py), read-only; never two copies at once."""
    size = os.fstat(fd).st_size
    view = memoryview(huge_buffer(size))
    f, pos = io.FileIO(fd, closefd=False), 0
    while pos < size and (n := f.readinto(view[pos:])):
        pos += n
    return view[:pos].toreadonly()
