"""ModelFile: round trips through gguf-py's GGUFWriter, a corpus of malformed files that must each raise
GGUFError (never another exception), a seeded mutation fuzz, and the two real models against gguf-py."""

from __future__ import annotations

import math
import mmap
import os
import random
import re
import struct
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf import GGUFValueType as VT

from edgellm.gguf import GGUFError, ModelFile, StringArray

# -- builders ----------------------------------------------------------------------------------------------


def write_with_gguf_py(path: Path, build, *, version: int = 3, **writer_kw) -> Path:
    """Write a file with gguf-py's GGUFWriter (always v3); `version=2` patches the version field, which
    is all v2 differs in for little-endian files (ggml/src/gguf.cpp reads both with the same code)."""
    w = gguf.GGUFWriter(path, "llama", **writer_kw)
    build(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if version != 3:
        with open(path, "r+b") as f:
            f.seek(4)
            f.write(struct.pack("<I", version))
    return path


def s_(text: str | bytes) -> bytes:
    """A GGUF string: u64 length + bytes."""
    b = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(b)) + b


def kv_(key: str | bytes, vtype: int, payload: bytes) -> bytes:
    return s_(key) + struct.pack("<I", vtype) + payload


def u32_(v: int) -> bytes:
    return struct.pack("<I", v)


def u64_(v: int) -> bytes:
    return struct.pack("<Q", v)


def ti_(name: str | bytes, ne, ttype: int, offset: int) -> bytes:
    """A tensor info: name, n_dims, ne[...], ggml type, offset into the data section."""
    return s_(name) + u32_(len(ne)) + b"".join(u64_(d) for d in ne) + u32_(ttype) + u64_(offset)


def raw_gguf(kvs=(), tis=(), data: bytes = b"", *, version: int = 3, magic: bytes = b"GGUF",
             n_tensors: int | None = None, n_kv: int | None = None,
             alignment: int = 32) -> bytes:  # fmt: skip
    """Assemble a GGUF file by hand, byte by byte, so any field can be made wrong."""
    out = magic + u32_(version) + u64_(len(tis) if n_tensors is None else n_tensors)
    out += u64_(len(kvs) if n_kv is None else n_kv)
    out += b"".join(kvs) + b"".join(tis)
    if tis or data:
        out += b"\0" * (-len(out) % alignment)
    return out + data


ARCH_KV = kv_("general.architecture", VT.STRING, s_("llama"))
F32_DATA = np.arange(64, dtype=np.float32).tobytes()  # 256 bytes: an F32 (32, 2)
Q8_DATA = bytes(range(34))  # one Q8_0 block


def valid_raw() -> bytes:
    """The baseline the malformed variants are cut from: two tensors, one F32 and one Q8_0."""
    tis = [ti_("a", (32, 2), QT.F32, 0), ti_("b", (32,), QT.Q8_0, 256)]
    return raw_gguf([ARCH_KV], tis, F32_DATA + Q8_DATA)


HEADER = 24  # magic, version, n_tensors, n_kv
FIRST_KV_END = HEADER + len(ARCH_KV)


@pytest.fixture
def write(tmp_path):
    counter = iter(range(10**9))

    def _write(blob: bytes, name: str | None = None) -> Path:
        p = tmp_path / (name or f"f{next(counter)}.gguf")
        p.write_bytes(blob)
        return p

    return _write


def every_value_type(w: gguf.GGUFWriter) -> None:
    w.add_key_value("t.u8", 255, VT.UINT8)
    w.add_key_value("t.i8", -128, VT.INT8)
    w.add_key_value("t.u16", 65535, VT.UINT16)
    w.add_key_value("t.i16", -32768, VT.INT16)
    w.add_key_value("t.u32", 2**32 - 1, VT.UINT32)
    w.add_key_value("t.i32", -(2**31), VT.INT32)
    w.add_key_value("t.f32", 1.5, VT.FLOAT32)
    w.add_key_value("t.bool_t", True, VT.BOOL)
    w.add_key_value("t.bool_f", False, VT.BOOL)
    w.add_key_value("t.str", "héllo ✓ wörld", VT.STRING)
    w.add_key_value("t.str_empty", "", VT.STRING)
    w.add_key_value("t.u64", 2**64 - 1, VT.UINT64)
    w.add_key_value("t.i64", -(2**63), VT.INT64)
    w.add_key_value("t.f64", math.pi, VT.FLOAT64)
    w.add_key_value("a.str", ["a", "bé", "", "日本語"], VT.ARRAY)
    w.add_key_value("a.i32", [1, -2, 3], VT.ARRAY)
    w.add_key_value("a.u8", [0, 7, 255], VT.ARRAY, sub_type=VT.UINT8)
    w.add_key_value("a.i64", [-(2**63), 2**63 - 1], VT.ARRAY, sub_type=VT.INT64)
    w.add_key_value("a.f32", [0.5, -2.25, 1e30], VT.ARRAY)
    w.add_key_value("a.f64", [math.e, -0.0], VT.ARRAY, sub_type=VT.FLOAT64)
    w.add_key_value("a.bool", [True, False, True], VT.ARRAY)
    w.add_key_value("a.nested", [[1, 2], [3, 4, 5]], VT.ARRAY)
    w.add_key_value("a.nested_str", [["x"], ["y", "zz"]], VT.ARRAY)


RNG_BYTES = np.random.default_rng(0).integers(0, 256, size=(3, 68), dtype=np.uint8)  # 3 rows of 2 Q8_0 blocks
F32_2x32 = np.arange(64, dtype=np.float32).reshape(2, 32) / 7
F16_4D = np.arange(120, dtype=np.float16).reshape(2, 3, 4, 5)


def tensors(w: gguf.GGUFWriter) -> None:
    w.add_tensor("f32", F32_2x32)
    w.add_tensor("q8", RNG_BYTES, raw_dtype=QT.Q8_0)
    w.add_tensor("f16_4d", F16_4D)
    w.add_tensor("vec", np.ones(7, np.float32))


def full_file(w: gguf.GGUFWriter) -> None:
    every_value_type(w)
    tensors(w)


# -- round trip --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", [2, 3])
@pytest.mark.parametrize("use_mmap", [True, False])
def test_round_trip_keeps_every_value_and_its_type(tmp_path, version, use_mmap):
    mf = ModelFile(write_with_gguf_py(tmp_path / "m.gguf", full_file, version=version), use_mmap=use_mmap)
    assert mf.version == version
    assert mf.arch == "llama"
    scalars = {
        "t.u8": (255, VT.UINT8), "t.i8": (-128, VT.INT8), "t.u16": (65535, VT.UINT16),
        "t.i16": (-32768, VT.INT16), "t.u32": (2**32 - 1, VT.UINT32), "t.i32": (-(2**31), VT.INT32),
        "t.f32": (1.5, VT.FLOAT32), "t.bool_t": (True, VT.BOOL), "t.bool_f": (False, VT.BOOL),
        "t.str": ("héllo ✓ wörld", VT.STRING), "t.str_empty": ("", VT.STRING),
        "t.u64": (2**64 - 1, VT.UINT64), "t.i64": (-(2**63), VT.INT64), "t.f64": (math.pi, VT.FLOAT64),
    }  # fmt: skip
    for key, (value, vtype) in scalars.items():
        assert mf[key] == value and type(mf[key]) is type(value), key
        assert mf.metadata_types[key] == vtype, key
    for key in ("a.str", "a.i32", "a.u8", "a.i64", "a.f32", "a.f64", "a.bool", "a.nested", "a.nested_str"):
        assert mf.metadata_types[key] == VT.ARRAY

    strs = mf["a.str"]
    assert isinstance(strs, StringArray) and len(strs) == 4
    assert strs.tolist() == ["a", "bé", "", "日本語"] == list(strs)
    assert strs[1] == "bé" and strs[-1] == "日本語" and strs.bytes_at(3) == "日本語".encode()
    with pytest.raises(IndexError):
        strs[4]
    arrays = {
        "a.i32": ([1, -2, 3], np.int32), "a.u8": ([0, 7, 255], np.uint8),
        "a.i64": ([-(2**63), 2**63 - 1], np.int64), "a.f32": ([0.5, -2.25, np.float32(1e30)], np.float32),
        "a.f64": ([math.e, -0.0], np.float64), "a.bool": ([True, False, True], np.bool_),
    }  # fmt: skip
    for key, (values, dtype) in arrays.items():
        arr = mf[key]
        assert isinstance(arr, np.ndarray) and arr.dtype == dtype, key
        assert arr.tolist() == list(values), key
    nested = mf["a.nested"]
    assert [a.tolist() for a in nested] == [[1, 2], [3, 4, 5]]
    assert [a.tolist() for a in mf["a.nested_str"]] == [["x"], ["y", "zz"]]
    assert list(mf.metadata)[:1] == ["general.architecture"]  # file order kept


@pytest.mark.parametrize("use_mmap", [True, False])
def test_round_trip_tensors_are_zero_copy_read_only_views_in_ggml_order(tmp_path, use_mmap):
    path = write_with_gguf_py(tmp_path / "m.gguf", full_file)
    mf = ModelFile(path, use_mmap=use_mmap)
    assert list(mf.tensors) == ["f32", "q8", "f16_4d", "vec"]
    raw = path.read_bytes()
    base = np.frombuffer(mf._buf, np.uint8)  # the whole mapping (or, without mmap, the one read buffer)
    base_addr = base.__array_interface__["data"][0]

    f32, q8, f16, vec = (mf.tensors[n] for n in ("f32", "q8", "f16_4d", "vec"))
    assert (f32.type, f32.ne, f32.shape) == (QT.F32, (32, 2), (2, 32))
    assert (q8.type, q8.ne, q8.shape) == (QT.Q8_0, (64, 3), (3, 64))
    assert (f16.type, f16.ne, f16.shape) == (QT.F16, (5, 4, 3, 2), (2, 3, 4, 5))
    assert (vec.type, vec.ne, vec.shape) == (QT.F32, (7,), (7,))
    assert q8.n_elements == 192 and f16.n_elements == 120 and q8.type_name == "Q8_0"
    assert q8.data.shape == (3, 68) and f32.data.shape == (2, 128) and f16.data.shape == (24, 10)

    for t, src in ((f32, F32_2x32), (q8, RNG_BYTES), (f16, F16_4D), (vec, np.ones(7, np.float32))):
        assert t.data.dtype == np.uint8 and t.nbytes == src.nbytes == t.data.nbytes
        assert t.data.tobytes() == src.tobytes()
        assert raw[t.offset : t.offset + t.nbytes] == src.tobytes()
        assert t.offset % mf.alignment == 0 and t.offset >= mf.data_offset
        # zero copy: the view's first byte *is* the file's byte at t.offset within the one buffer
        assert t.data.__array_interface__["data"][0] == base_addr + t.offset
        assert not t.data.flags.owndata and not t.data.flags.writeable
        with pytest.raises(ValueError):
            t.data[0, 0] = 1
    np.testing.assert_array_equal(f32.data.view(np.float32).reshape(f32.shape), F32_2x32)
    np.testing.assert_array_equal(f16.data.view(np.float16).reshape(f16.shape), F16_4D)


def test_hand_built_file_matches_gguf_py_reader(write):
    """The raw builder the malformed corpus is cut from writes real GGUF: gguf-py reads it the same way."""
    p = write(valid_raw())
    mf, ref = ModelFile(p), gguf.GGUFReader(p)
    assert mf.data_offset == ref.data_offset
    assert [(t.name, t.ne, t.offset) for t in mf.tensors.values()] == [
        (t.name, tuple(int(d) for d in t.shape), int(t.data_offset)) for t in ref.tensors
    ]
    assert mf.tensors["a"].data.tobytes() == F32_DATA and mf.tensors["b"].data.tobytes() == Q8_DATA


def test_empty_arrays_and_file_without_tensors(write):
    # gguf-py refuses to write empty arrays; gguf.cpp reads them, and so must we
    kvs = [ARCH_KV, kv_("e.u32", VT.ARRAY, u32_(VT.UINT32) + u64_(0)),
           kv_("e.str", VT.ARRAY, u32_(VT.STRING) + u64_(0))]  # fmt: skip
    mf = ModelFile(write(raw_gguf(kvs)))  # ends right after the metadata: no padding, no data section
    assert mf.tensors == {} and mf["e.u32"].tolist() == [] and len(mf["e.str"]) == 0
    assert mf["e.str"].tolist() == []


def test_metadata_only_opens_a_file_cut_after_its_header(write):
    blob = valid_raw()
    mf = ModelFile(write(blob[: len(blob) - 100]), metadata_only=True)
    assert mf.arch == "llama" and mf.tensors == {}
    with pytest.raises(GGUFError):
        ModelFile(write(blob[: len(blob) - 100]))


def test_context_manager_and_accessors(write):
    with ModelFile(write(valid_raw())) as mf:
        assert "general.architecture" in mf and mf.get("nope", 5) == 5
        assert mf.arch_key("block_count", 0) == 0
        assert "arch='llama'" in repr(mf) and "tensors=2" in repr(mf)
        assert mf.tensors["a"].dequantize().shape == (2, 32)
    assert mf.tensors == {}


# -- malformed files -----------------------------------------------------------------------------------------

A_INFO = ti_("a", (32, 2), QT.F32, 0)
TI_START = FIRST_KV_END  # with only ARCH_KV, the first tensor info starts here


def _alignment_kv(vtype: int, payload: bytes) -> list[bytes]:
    return [ARCH_KV, kv_("general.alignment", vtype, payload)]


def _one_tensor(ne=(32, 2), ttype=QT.F32, offset=0, data=F32_DATA, name="a") -> bytes:
    return raw_gguf([ARCH_KV], [ti_(name, ne, ttype, offset)], data)


def _deep_nesting(depth: int) -> bytes:
    payload = b"".join(u32_(VT.ARRAY) + u64_(1) for _ in range(depth)) + u32_(VT.UINT8) + u64_(0)
    return raw_gguf([kv_("deep", VT.ARRAY, payload)])


_KEY2 = FIRST_KV_END  # offset of a second key/value
_UNKNOWN_TYPE_FIELD = _KEY2 + len(s_("k"))
# tensor-info field offsets of "a" (name "a": 8+1 bytes, n_dims 4, ne 2*8, then type, then offset)
_A_TYPE = TI_START + 9 + 4 + 16
_A_OFFSET = _A_TYPE + 4

# (id, file bytes, regex the message must match, expected .offset or None when not meaningful)
MALFORMED = [
    ("bad-magic", b"GGML" + valid_raw()[4:], r"not a GGUF file \(magic b'GGML'", 0),
    ("text-file", b"hello, I am not a model at all\n" * 3, r"not a GGUF file", 0),
    ("version-0", raw_gguf([ARCH_KV], version=0), r"unsupported GGUF version 0", 4),
    ("version-1", raw_gguf([ARCH_KV], version=1), r"unsupported GGUF version 1", 4),
    ("version-4", raw_gguf([ARCH_KV], version=4), r"unsupported GGUF version 4", 4),
    ("big-endian-v3", b"GGUF" + struct.pack(">I", 3) + valid_raw()[8:], r"big-endian .*not supported", 4),
    ("big-endian-v2", b"GGUF" + struct.pack(">I", 2) + valid_raw()[8:], r"big-endian .*not supported", 4),
    ("huge-tensor-count", raw_gguf([ARCH_KV], n_tensors=2**63), r"tensor count \d+ is impossible", 8),
    ("max-tensor-count", raw_gguf([ARCH_KV], n_tensors=2**64 - 1), r"tensor count", 8),
    ("huge-kv-count", raw_gguf([ARCH_KV], n_kv=2**40), r"metadata count \d+ is impossible", 16),
    ("kv-count-one-too-many", raw_gguf([ARCH_KV], n_kv=2), r"truncated file: length of metadata key #1",
     FIRST_KV_END),
    ("tensor-count-one-too-many", raw_gguf([ARCH_KV], [A_INFO], n_tensors=2)[: TI_START + len(A_INFO)],
     r"truncated file: length of name of tensor #1 needs 8 bytes, 0 left", TI_START + len(A_INFO)),
    ("key-length-past-eof", raw_gguf([u64_(10**6) + b"abc"]), r"metadata key #0: string length 1000000 "
     r"runs past end of file", HEADER),
    ("key-length-2^64-1", raw_gguf([u64_(2**64 - 1) + b"abc"]), r"string length \d+ runs past end", HEADER),
    ("value-string-past-eof", raw_gguf([kv_("k", VT.STRING, u64_(2**40) + b"x")]),
     r"value of 'k': string length \d+ runs past end of file", HEADER + 9 + 4),
    ("key-invalid-utf8", raw_gguf([ARCH_KV, kv_(b"bad\xff\xfekey", VT.UINT8, b"\0")]),
     r"metadata key #1: invalid UTF-8", _KEY2),
    ("value-invalid-utf8", raw_gguf([kv_("k", VT.STRING, s_(b"\xc3\x28"))]), r"value of 'k': invalid UTF-8",
     HEADER + 9 + 4),
    ("unknown-value-type", raw_gguf([ARCH_KV, kv_("k", 13, b"\0" * 8)]),
     r"value of 'k': unknown metadata value type 13", _UNKNOWN_TYPE_FIELD),
    ("unknown-value-type-huge", raw_gguf([ARCH_KV, kv_("k", 2**32 - 1, b"\0" * 8)]),
     r"unknown metadata value type 4294967295", _UNKNOWN_TYPE_FIELD),
    ("unknown-array-type", raw_gguf([ARCH_KV, kv_("k", VT.ARRAY, u32_(77) + u64_(1) + b"\0" * 8)]),
     r"value of 'k': unknown array element type 77", _UNKNOWN_TYPE_FIELD + 4),
    ("array-u32-huge", raw_gguf([kv_("k", VT.ARRAY, u32_(VT.UINT32) + u64_(2**62) + b"\0" * 16)]),
     r"value of 'k': array of \d+ uint32 runs past end of file", HEADER + 9 + 4),
    ("array-u8-one-past-eof", raw_gguf([kv_("k", VT.ARRAY, u32_(VT.UINT8) + u64_(5) + b"1234")]),
     r"array of 5 uint8 runs past end of file", HEADER + 9 + 4),
    ("array-str-huge", raw_gguf([kv_("k", VT.ARRAY, u32_(VT.STRING) + u64_(2**63) + b"\0" * 16)]),
     r"value of 'k': array of \d+ strings runs past end of file", HEADER + 9 + 4),
    ("array-str-element-past-eof", raw_gguf([kv_("k", VT.ARRAY, u32_(VT.STRING) + u64_(3) + s_("ok")
                                             + u64_(999) + b"xyz" + b"\0" * 16)]),
     r"value of 'k'\[1\]: string length 999 runs past end of file", HEADER + 9 + 4 + 12 + 10),
    ("array-of-arrays-huge", raw_gguf([kv_("k", VT.ARRAY, u32_(VT.ARRAY) + u64_(2**60) + b"\0" * 16)]),
     r"array of \d+ arrays runs past end of file", HEADER + 9 + 4),
    ("arrays-nested-too-deep", _deep_nesting(9), r"nested more than 8 deep", None),
    ("arrays-nested-100k-deep", _deep_nesting(100_000), r"nested more than 8 deep", None),
    ("alignment-0", raw_gguf(_alignment_kv(VT.UINT32, u32_(0))), r"general.alignment must be a power "
     r"of two, got 0", _KEY2),
    ("alignment-3", raw_gguf(_alignment_kv(VT.UINT32, u32_(3))), r"power of two, got 3", _KEY2),
    ("alignment-float", raw_gguf(_alignment_kv(VT.FLOAT32, struct.pack("<f", 32.0))),
     r"general.alignment must be a uint32, got a float32", _KEY2),
    ("alignment-string", raw_gguf(_alignment_kv(VT.STRING, s_("32"))), r"must be a uint32, got a string",
     _KEY2),
    ("alignment-bool", raw_gguf(_alignment_kv(VT.BOOL, b"\1")), r"must be a uint32, got a bool", _KEY2),
    ("alignment-u64", raw_gguf(_alignment_kv(VT.UINT64, u64_(32))), r"must be a uint32, got a uint64", _KEY2),
    ("alignment-2^31-data-past-eof", raw_gguf(_alignment_kv(VT.UINT32, u32_(2**31)), [A_INFO]) + F32_DATA,
     r"data section starts past end of file", None),
    ("duplicate-key", raw_gguf([ARCH_KV, ARCH_KV]), r"duplicate metadata key 'general.architecture'", _KEY2),
    ("duplicate-tensor-name", raw_gguf([ARCH_KV], [A_INFO, ti_("a", (32,), QT.F32, 256)], F32_DATA * 2),
     r"duplicate tensor name 'a'", TI_START + len(A_INFO)),
    ("unknown-ggml-type", _one_tensor(ttype=200), r"tensor 'a': unknown ggml type 200", _A_TYPE),
    ("removed-ggml-type-4", _one_tensor(ttype=4), r"unknown ggml type 4", _A_TYPE),
    ("ggml-type-2^32-1", _one_tensor(ttype=2**32 - 1), r"unknown ggml type 4294967295", _A_TYPE),
    ("zero-size-dim", _one_tensor(ne=(32, 0)), r"tensor 'a': zero-size dimension in shape \[32, 0\]",
     TI_START),
    ("zero-size-row", _one_tensor(ne=(0, 2)), r"zero-size dimension", TI_START),
    ("zero-dims", raw_gguf([ARCH_KV], [ti_("a", (), QT.F32, 0)], F32_DATA), r"0 dimensions", TI_START),
    ("five-dims", _one_tensor(ne=(32, 1, 1, 1, 2)), r"tensor 'a': 5 dimensions \(1..4 allowed\)", TI_START),
    ("n-dims-2^32-1", raw_gguf([ARCH_KV], [s_("a") + u32_(2**32 - 1) + b"\0" * 64]), r"4294967295 dimensions",
     TI_START),
    ("row-not-multiple-of-block", _one_tensor(ne=(33, 1), ttype=QT.Q8_0, data=Q8_DATA * 2),
     r"row length 33 is not a multiple of Q8_0's block size 32", TI_START),
    ("k-quant-row-of-128", _one_tensor(ne=(128, 1), ttype=QT.Q4_K, data=b"\0" * 256),
     r"row length 128 is not a multiple of Q4_K's block size 256", TI_START),
    ("absurd-shape", _one_tensor(ne=(2**63, 2**63)), r"absurd shape", TI_START),
    ("shape-overflows-bytes", _one_tensor(ne=(2**40, 2**40, 2**40)), r"runs past end of file", _A_OFFSET + 8),
    ("tensor-offset-past-eof", _one_tensor(offset=2**40), r"tensor 'a': data \[\d+, \d+\) runs past end of "
     r"file", _A_OFFSET),
    ("tensor-offset-2^64-32", _one_tensor(offset=2**64 - 32), r"runs past end of file", _A_OFFSET),
    ("tensor-data-one-byte-short", _one_tensor()[:-1], r"tensor 'a': data .* runs past end of file",
     _A_OFFSET),
    ("tensor-misaligned", _one_tensor(offset=4, data=F32_DATA + b"\0" * 4),
     r"tensor 'a': data offset 4 is not aligned to 32", _A_OFFSET),
    ("tensor-misaligned-custom-alignment",
     raw_gguf(_alignment_kv(VT.UINT32, u32_(64)), [ti_("a", (32, 2), QT.F32, 32)], F32_DATA * 2,
              alignment=64),
     r"data offset 32 is not aligned to 64", None),
    ("tensor-name-invalid-utf8", raw_gguf([ARCH_KV], [ti_(b"\xff", (32,), QT.F32, 0)], F32_DATA),
     r"name of tensor #0: invalid UTF-8", TI_START),
    ("tensor-name-length-past-eof", raw_gguf([ARCH_KV], [u64_(2**50) + b"a"]), r"name of tensor #0: string "
     r"length \d+ runs past end of file", TI_START),
    ("data-section-missing", raw_gguf([ARCH_KV], [A_INFO])[:FIRST_KV_END + len(A_INFO)],
     r"data section starts past end of file|runs past end of file", None),
]  # fmt: skip


@pytest.mark.parametrize("blob,match,offset", [c[1:] for c in MALFORMED], ids=[c[0] for c in MALFORMED])
def test_malformed_file_raises_gguf_error_naming_the_problem(write, blob, match, offset):
    path = write(blob)
    with pytest.raises(GGUFError, match=match) as ei:
        ModelFile(path)
    assert str(path) in str(ei.value)
    if offset is not None:
        assert ei.value.offset == offset, str(ei.value)
        assert str(ei.value).endswith(f"at byte {offset}")


def test_big_endian_file_from_gguf_py_is_rejected_as_big_endian(tmp_path):
    path = write_with_gguf_py(tmp_path / "be.gguf", tensors, endianess=gguf.GGUFEndian.BIG)
    assert path.read_bytes()[:4] == b"GGUF"  # the magic is written the same; the version is swapped
    with pytest.raises(GGUFError, match="big-endian GGUF files are not supported") as ei:
        ModelFile(path)
    assert ei.value.offset == 4


def test_every_truncation_of_a_small_file_raises_gguf_error(tmp_path, write):
    """Cut a file with every metadata type and four tensors after every byte up to the end of the last
    tensor's data: each prefix must fail cleanly (the trailing padding after the last tensor is optional)."""
    blob = write_with_gguf_py(tmp_path / "full.gguf", full_file).read_bytes()
    mf = ModelFile(tmp_path / "full.gguf")
    data_end = max(t.offset + t.nbytes for t in mf.tensors.values())
    path = tmp_path / "cut.gguf"
    for n in range(data_end):
        path.write_bytes(blob[:n])
        with pytest.raises(GGUFError) as ei:
            ModelFile(path)
        assert re.search(r"truncated|past end of file|impossible for a|not a GGUF|empty", str(ei.value)), n
    path.write_bytes(blob[:data_end])
    assert len(ModelFile(path).tensors) == 4


def test_truncation_at_each_section_boundary_of_the_real_layout(tmp_path):
    """Section boundaries located by gguf-py's reader (an independent parser) rather than by ours."""
    src = write_with_gguf_py(tmp_path / "full.gguf", full_file)
    blob = src.read_bytes()
    ref = gguf.GGUFReader(src)
    boundaries = {0, 4, 8, 16, 24, ref.data_offset, len(blob) - 1}
    boundaries |= {int(f.offset) for f in ref.fields.values() if not f.name.startswith("GGUF.")}
    boundaries |= {int(t.field.offset) for t in ref.tensors} | {int(t.data_offset) for t in ref.tensors}
    path = tmp_path / "cut.gguf"
    for n in sorted(boundaries):
        for cut in (n - 1, n, n + 1):
            if 0 <= cut < ref.tensors[-1].data_offset + ref.tensors[-1].n_bytes:
                path.write_bytes(blob[:cut])
                with pytest.raises(GGUFError):
                    ModelFile(path)


def test_random_mutations_either_open_or_raise_gguf_error(tmp_path):
    """300 seeded mutations of a valid small file (bit flips, random bytes, 0xFF runs, u64 length fields
    set to huge values): each one opens or raises GGUFError -- never another exception."""
    base = write_with_gguf_py(tmp_path / "full.gguf", full_file).read_bytes()
    rng = random.Random(1234)
    path = tmp_path / "mut.gguf"
    outcomes = {"opened": 0, "rejected": 0}
    for _ in range(300):
        blob = bytearray(base)
        for _ in range(rng.choice((1, 1, 2, 4, 8))):
            i = rng.randrange(len(blob))
            kind = rng.randrange(4)
            if kind == 0:
                blob[i] ^= 1 << rng.randrange(8)
            elif kind == 1:
                blob[i] = rng.randrange(256)
            elif kind == 2:
                blob[i : i + 8] = b"\xff" * len(blob[i : i + 8])
            else:
                blob[i : i + 8] = struct.pack("<Q", rng.choice((2**31, 2**32 + 1, 2**63, len(base) + 1)))[
                    : len(blob[i : i + 8])
                ]
        if rng.random() < 0.2:
            del blob[rng.randrange(len(blob)) :]
        path.write_bytes(bytes(blob))
        try:
            mf = ModelFile(path)
        except GGUFError:
            outcomes["rejected"] += 1
            continue
        outcomes["opened"] += 1
        for t in mf.tensors.values():  # what opened must be safe to read in full
            assert t.offset + t.nbytes <= len(blob)
            t.data.sum()
        for v in mf.metadata.values():
            if isinstance(v, StringArray):
                v.tolist()
    assert outcomes["rejected"] > 50 and outcomes["opened"] > 20, outcomes


def test_missing_empty_directory_and_tiny_files(tmp_path, write):
    with pytest.raises(FileNotFoundError, match="no such model file"):
        ModelFile(tmp_path / "nope.gguf")
    with pytest.raises(GGUFError, match="is a directory") as ei:
        ModelFile(tmp_path)
    assert str(tmp_path) in str(ei.value)
    with pytest.raises(GGUFError, match="empty file") as ei:
        ModelFile(write(b""))
    assert ei.value.offset == 0
    with pytest.raises(GGUFError, match="not a GGUF file"):
        ModelFile(write(b"PK\x03\x04"))
    with pytest.raises(GGUFError, match=r"truncated file: the GGUF header needs 24 bytes, the file has 6"):
        ModelFile(write(b"GGUF\x03\x00"))
    fifo = tmp_path / "fifo.gguf"
    os.mkfifo(fifo)
    with pytest.raises(GGUFError, match="not a regular file"):  # and it must not block opening it
        ModelFile(fifo)


# -- real models ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    return ModelFile(smollm2_path)


@pytest.fixture(scope="module")
def smollm2_reader(smollm2_path):
    return gguf.GGUFReader(smollm2_path)  # ~2-6 s: the one slow oracle, used once


def test_smollm2_counts(smollm2):
    assert smollm2.version == 3 and smollm2.arch == "llama"
    assert len(smollm2.tensors) == 272
    assert len(smollm2["tokenizer.ggml.tokens"]) == 49152
    assert smollm2["tokenizer.ggml.model"] == "gpt2" and smollm2["tokenizer.ggml.pre"] == "smollm"
    assert smollm2.arch_key("block_count") == 30 and smollm2.arch_key("embedding_length") == 576
    assert smollm2["tokenizer.ggml.tokens"][1] == "<|im_start|>"


def test_smollm2_matches_gguf_py_reader(smollm2, smollm2_reader):
    ref = smollm2_reader
    assert smollm2.data_offset == ref.data_offset
    tokens = smollm2["tokenizer.ggml.tokens"]
    ref_tokens = ref.fields["tokenizer.ggml.tokens"]
    for i in (0, 1, 2, 17, 1000, 30000, 49151, -1):
        assert tokens[i] == ref_tokens.contents(i), i
    assert tokens.tolist() == ref_tokens.contents()
    merges = smollm2["tokenizer.ggml.merges"]
    ref_merges = ref.fields["tokenizer.ggml.merges"]
    assert len(merges) == len(ref_merges.data) == 48900
    for i in (0, 1, 24000, 48899):
        assert merges[i] == ref_merges.contents(i)
    ref_types = ref.fields["tokenizer.ggml.token_type"].contents()
    np.testing.assert_array_equal(smollm2["tokenizer.ggml.token_type"], ref_types)
    for key in ("llama.rope.freq_base", "general.name", "tokenizer.chat_template", "llama.context_length"):
        assert smollm2[key] == pytest.approx(ref.fields[key].contents()), key
    assert len(ref.tensors) == len(smollm2.tensors)
    for rt in ref.tensors:
        t = smollm2.tensors[rt.name]
        assert t.type == rt.tensor_type and t.ne == tuple(int(d) for d in rt.shape), rt.name
        assert t.offset == rt.data_offset and t.nbytes == rt.n_bytes, rt.name
    # one tensor's bytes, end to end
    rt = ref.tensors[5]
    assert smollm2.tensors[rt.name].data.tobytes() == rt.data.tobytes()


def _first_strings_after_key(path: Path, key: str, count: int) -> tuple[list[bytes], int]:
    """Independently of ModelFile: find `key` in the file and read its string array's first items."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        k = m.find(s_(key))
        assert k > 0
        pos = k + len(s_(key))
        vtype, etype, n = struct.unpack_from("<IIQ", m, pos)
        assert (vtype, etype) == (VT.ARRAY, VT.STRING)
        pos += 16
        out = []
        for _ in range(count):
            (ln,) = struct.unpack_from("<Q", m, pos)
            out.append(m[pos + 8 : pos + 8 + ln])
            pos += 8 + ln
        return out, n


def test_gemma3_counts_and_token_strings(gemma3_path):
    mf = ModelFile(gemma3_path)
    assert mf.version == 3 and mf.arch == "gemma3" and len(mf.tensors) == 236
    tokens = mf["tokenizer.ggml.tokens"]
    assert isinstance(tokens, StringArray) and len(tokens) == 262144
    assert len(mf["tokenizer.ggml.scores"]) == 262144 and mf["tokenizer.ggml.scores"].dtype == np.float32
    assert len(mf["tokenizer.ggml.token_type"]) == 262144
    first, n = _first_strings_after_key(gemma3_path, "tokenizer.ggml.tokens", 300)
    assert n == 262144
    assert [tokens.bytes_at(i) for i in range(300)] == first
    assert [tokens[i] for i in range(4)] == ["<pad>", "<eos>", "<bos>", "<unk>"]
    # every string is where its length prefix says, back to back: the u64 before each string is its length
    offs, lens = tokens.offsets, tokens.lengths
    np.testing.assert_array_equal(offs[1:], offs[:-1] + lens[:-1] + 8)
    raw = np.frombuffer(mf._buf, np.uint8)
    for i in (0, 1, 131072, 262143):
        assert int(raw[offs[i] - 8 : offs[i]].view("<u8")[0]) == lens[i]
    # and the array ends exactly where the next key ("tokenizer.ggml.scores") begins
    next_key = s_("tokenizer.ggml.scores")
    assert bytes(raw[offs[-1] + lens[-1] :][: len(next_key)]) == next_key
    assert len(tokens.tolist()) == 262144


def test_real_model_tensors_lie_inside_the_file_without_overlap(real_model_paths):
    for path in real_model_paths:
        mf = ModelFile(path)
        spans = sorted((t.offset, t.offset + t.nbytes) for t in mf.tensors.values())
        assert spans[0][0] >= mf.data_offset and spans[-1][1] <= mf.file_size
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:], strict=False))
