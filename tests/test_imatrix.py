"""edgellm.imatrix against llama.cpp's imatrix files: real fixtures from llama-imatrix (both formats, one
run; scripts/make_imatrix_fixtures.py) read to llama-quantize's floats, synthetic files for the per-expert,
count and legacy rules, and damaged files refused with ImatrixError."""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path

import gguf
import numpy as np
import pytest

from edgellm.imatrix import ImatrixError, load_imatrix

FIXTURES = Path(__file__).parent / "fixtures" / "quantize"
GGUF_FILE = FIXTURES / "smollm2.imatrix.gguf"
DAT_FILE = FIXTURES / "smollm2.imatrix.dat"
# sha256 over sorted (name, float32 bytes) of the entries. Checked once against llama-quantize itself: an
# LD_PRELOAD shim logged the imatrix floats of each of its ggml_quantize_chunk calls (IQ4_NL, Q4_0, Q4_K_M,
# either file), and they equalled these entries bit for bit.
ENTRIES_SHA256 = "90089eb4cca5319d29b121c7d56ebf5bfb1f89cf9be2badf2d6882d9d2721f5a"
F32 = np.float32


def _digest(entries: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for k in sorted(entries):
        h.update(k.encode())
        h.update(entries[k].tobytes())
    return h.hexdigest()


def _bits_equal(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype == np.float32 and a.view(np.uint32).tobytes() == b.view(np.uint32).tobytes()


# -- the real fixtures ----------------------------------------------------------------------------------


def test_gguf_and_dat_from_one_run_load_to_identical_entries():
    g, d = load_imatrix(GGUF_FILE), load_imatrix(DAT_FILE)
    assert (g.legacy, d.legacy) == (False, True)
    assert g.entries.keys() == d.entries.keys() and len(g.entries) == 30 * 7  # 7 matmuls in each layer
    assert all(_bits_equal(g.entries[k], d.entries[k]) for k in g.entries)
    assert g.datasets == d.datasets == ["tests/fixtures/text/licenses.txt"]
    assert g.chunks == d.chunks == 2
    assert (g.chunk_size, d.chunk_size) == (64, 0)  # the legacy format does not record it


def test_entries_are_the_floats_llama_quantize_uses():
    m = load_imatrix(GGUF_FILE)
    assert _digest(m.entries) == ENTRIES_SHA256
    assert m.entries["blk.0.ffn_down.weight"].shape == (1536,)
    assert m.entries["blk.0.attn_q.weight"].shape == (576,)
    assert all(e.dtype == np.float32 and np.all(np.isfinite(e)) for e in m.entries.values())


def test_gguf_entries_are_in_sum2_divided_by_counts_in_float32():
    raw = {t.name: np.asarray(t.data, dtype=F32).reshape(-1) for t in gguf.GGUFReader(GGUF_FILE).tensors}
    m = load_imatrix(GGUF_FILE)
    for name, e in m.entries.items():
        sums, counts = raw[name + ".in_sum2"], raw[name + ".counts"]
        assert counts.tolist() == [128.0]  # 2 chunks of 64 tokens, every token seen
        assert _bits_equal(e, sums / F32(128))


def test_dat_entries_are_stored_values_divided_by_ncall():
    buf = DAT_FILE.read_bytes()
    (n,), pos, want = struct.unpack_from("<i", buf), 4, {}
    for _ in range(n):
        (ln,) = struct.unpack_from("<i", buf, pos)
        name = buf[pos + 4 : pos + 4 + ln].decode()
        ncall, nval = struct.unpack_from("<ii", buf, pos + 4 + ln)
        pos += 12 + ln
        vals = np.frombuffer(buf, "<f4", nval, pos).astype(F32)
        pos += 4 * nval
        assert ncall == 2  # ceil(128 tokens / 64 per chunk)
        want[name] = vals / F32(ncall)
    m = load_imatrix(DAT_FILE)
    assert m.entries.keys() == want.keys()
    assert all(_bits_equal(m.entries[k], want[k]) for k in want)


# -- synthetic GGUF files: per expert, counts, metadata --------------------------------------------------


def _write_gguf(path, tensors, meta=True, datasets=("d.txt",), chunk_count_type="uint32"):
    w = gguf.GGUFWriter(path, "unused")
    w.kv_data[0].pop("general.architecture", None)
    w.add_string("general.type", "imatrix")
    if meta:
        w.add_array("imatrix.datasets", list(datasets))
        getattr(w, f"add_{chunk_count_type}")("imatrix.chunk_count", 5)
        w.add_uint32("imatrix.chunk_size", 32)
    for name, arr in tensors:
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _pair(name, sums, counts):
    return [(f"{name}.in_sum2", np.asarray(sums, F32)), (f"{name}.counts", np.asarray(counts, F32))]


def test_gguf_per_expert_sums_divided_by_their_own_counts_and_unseen_experts_weigh_one(tmp_path):
    sums = np.arange(4 * 32, dtype=F32).reshape(4, 32) + F32(1)  # (n_expert, ne0)
    sums[1] = np.nan  # an expert never routed to: its sums are not used at all
    counts = np.array([[10], [0], [3], [2**25 + 1]], F32)  # the last rounds to 2**25 in float32
    p = _write_gguf(tmp_path / "moe.gguf", _pair("blk.0.ffn_up_exps.weight", sums, counts))
    m = load_imatrix(p)
    e = m.entries["blk.0.ffn_up_exps.weight"]
    assert e.shape == (4 * 32,) and e.dtype == np.float32
    assert _bits_equal(e[0:32], sums[0] / F32(10))
    assert np.all(e[32:64] == 1)
    assert _bits_equal(e[64:96], sums[2] / F32(3))
    assert _bits_equal(e[96:128], sums[3] / F32(2**25))
    assert (m.datasets, m.chunks, m.chunk_size, m.legacy) == (["d.txt"], 5, 32, False)


@pytest.mark.parametrize(
    "count, divisor",
    [(2.5, 3), (0.5, 1), (3.49, 3), (0.4, None), (-0.5, None), (-7, None)],
)
def test_gguf_counts_are_rounded_half_away_from_zero_and_nonpositive_means_weight_one(
    tmp_path, count, divisor
):
    sums = np.full((1, 32), 6, F32)
    e = load_imatrix(_write_gguf(tmp_path / "c.gguf", _pair("a", sums, [[count]]))).entries["a"]
    assert np.all(e == (F32(6) / F32(divisor) if divisor else F32(1)))


def test_gguf_other_tensors_are_ignored_and_non_string_datasets_dropped(tmp_path):
    p = tmp_path / "x.gguf"
    w = gguf.GGUFWriter(p, "unused")
    w.kv_data[0].pop("general.architecture", None)
    w.add_array("imatrix.datasets", [1, 2])
    w.add_uint32("imatrix.chunk_count", 1)
    w.add_uint32("imatrix.chunk_size", 2)
    for name, arr in [*_pair("a", np.ones((1, 32)), [[1]]), ("stray.tensor", np.ones(8, F32))]:
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    m = load_imatrix(p)
    assert list(m.entries) == ["a"] and m.datasets == []


@pytest.mark.parametrize(
    "label, kwargs, message",
    [
        (
            "no metadata",
            dict(tensors=_pair("a", np.ones((1, 32)), [[1]]), meta=False),
            "missing imatrix metadata",
        ),
        ("wrong type", dict(tensors=_pair("a", np.ones((1, 32)), [[1]]), chunk_count_type="int32"), "uint32"),
        ("no counts", dict(tensors=_pair("a", np.ones((1, 32)), [[1]])[:1]), "mismatched sums and counts"),
        ("no sums", dict(tensors=_pair("a", np.ones((1, 32)), [[1]])[1:]), "mismatched sums and counts"),
        ("no tensors", dict(tensors=[]), "no data"),
        ("uneven", dict(tensors=_pair("a", np.ones((1, 33)), [[1], [1]])), "split evenly"),
        ("nan", dict(tensors=_pair("a", np.full((1, 32), np.nan), [[1]])), "non-finite"),
        ("inf", dict(tensors=_pair("a", np.full((1, 32), np.inf), [[2]])), "non-finite"),
        ("inf count", dict(tensors=_pair("a", np.ones((1, 32)), [[np.inf]])), "impossible count"),
        (
            "f16",
            dict(tensors=[("a.in_sum2", np.ones((1, 32), np.float16)), ("a.counts", np.ones((1, 1), F32))]),
            "must be F32",
        ),
    ],
)
def test_gguf_files_llama_quantize_refuses_raise_imatrix_error(tmp_path, label, kwargs, message):
    p = _write_gguf(tmp_path / "bad.gguf", **kwargs)
    with pytest.raises(ImatrixError, match=message):
        load_imatrix(p)


# -- synthetic legacy files -----------------------------------------------------------------------------


def _legacy(entries, trailer=(3, b"a.txt"), tail=b""):
    b = struct.pack("<i", len(entries))
    for name, ncall, vals in entries:
        b += struct.pack("<i", len(name)) + name + struct.pack("<ii", ncall, len(vals))
        b += np.asarray(vals, "<f4").tobytes()
    if trailer is not None:
        b += struct.pack("<i", trailer[0])
        if trailer[1] is not None:
            b += struct.pack("<i", len(trailer[1])) + trailer[1]
    return b + tail


def test_legacy_rules_ncall_duplicates_and_c_string_names(tmp_path):
    v = np.arange(1, 9, dtype=F32) * F32(0.3)
    entries = [
        (b"a", 3, v),
        (b"b", 0, v),  # ncall <= 0: the values are used as stored
        (b"c", -2, v),
        (b"a", 5, v[:4]),  # a repeated name replaces the earlier entry
        (b"d\0junk", 1, v),  # names are C strings
    ]
    p = tmp_path / "x.dat"
    p.write_bytes(_legacy(entries, trailer=(9, b"set\0.txt"), tail=b"ignored"))
    m = load_imatrix(p)
    assert sorted(m.entries) == ["a", "b", "c", "d"]
    assert _bits_equal(m.entries["a"], v[:4] / F32(5))
    assert all(_bits_equal(m.entries[k], v) for k in "bcd")
    assert (m.datasets, m.chunks, m.chunk_size, m.legacy) == (["set"], 9, 0, True)


@pytest.mark.parametrize(
    "trailer, chunks, datasets",
    [(None, 0, []), ((4, None), 4, []), ((4, b""), 4, []), ((-1, b"x"), -1, ["x"])],
)
def test_legacy_trailer_is_optional(tmp_path, trailer, chunks, datasets):
    p = tmp_path / "t.dat"
    p.write_bytes(_legacy([(b"a", 1, [1.0, 2.0])], trailer=trailer))
    m = load_imatrix(p)
    assert (m.chunks, m.datasets) == (chunks, datasets)
    assert m.entries["a"].tolist() == [1.0, 2.0]


def test_legacy_every_truncation_is_refused_or_ends_at_an_optional_field(tmp_path):
    full = _legacy([(b"blk.0.w", 2, [1.0, 2.0, 3.0]), (b"blk.1.w", 2, [4.0])], trailer=(7, b"data.txt"))
    end_entries = 4 + (4 + 7 + 8 + 12) + (4 + 7 + 8 + 4)
    ok_at = {end_entries: 0, end_entries + 4: 7, len(full): 7}  # cut -> chunk count the file then has
    p = tmp_path / "cut.dat"
    for cut in range(len(full) + 1):
        p.write_bytes(full[:cut])
        if cut in ok_at:
            m = load_imatrix(p)
            assert m.chunks == ok_at[cut] and m.entries["blk.1.w"].tolist() == [2.0]
        else:
            with pytest.raises(ImatrixError):
                load_imatrix(p)


@pytest.mark.parametrize(
    "data, message",
    [
        (b"", "neither a GGUF nor"),
        (b"\x00\x00", "neither a GGUF nor"),
        (struct.pack("<i", 0), "no data"),
        (struct.pack("<i", -5), "no data"),
        (struct.pack("<i", 2**31 - 1) + b"\0" * 64, "impossible"),  # refused before any allocation
        (struct.pack("<ii", 1, -3) + b"\0" * 16, "negative name length"),
        (struct.pack("<ii", 1, 1) + b"a" + struct.pack("<ii", 1, 0) + b"\0" * 8, "0 values"),
        (struct.pack("<ii", 1, 1) + b"a" + struct.pack("<ii", 1, 2**30), "truncated"),
        (_legacy([(b"a", 1, [np.nan])]), "non-finite"),
        (_legacy([(b"a", 0, [np.inf])]), "non-finite"),
    ],
)
def test_damaged_legacy_files_raise_imatrix_error(tmp_path, data, message):
    p = tmp_path / "bad.dat"
    p.write_bytes(data)
    with pytest.raises(ImatrixError, match=message):
        load_imatrix(p)


# -- damaged real files ---------------------------------------------------------------------------------


@pytest.mark.parametrize("source", [GGUF_FILE, DAT_FILE], ids=["gguf", "dat"])
def test_truncated_fixture_raises_imatrix_error(tmp_path, source):
    full = source.read_bytes()
    p = tmp_path / source.name
    for cut in [3, 4, 23, 24, 200, 5000, len(full) // 2, len(full) - 41, len(full) - 39, len(full) - 1]:
        p.write_bytes(full[:cut])
        with pytest.raises(ImatrixError):
            load_imatrix(p)


@pytest.mark.parametrize("source", [GGUF_FILE, DAT_FILE], ids=["gguf", "dat"])
def test_bit_flips_give_imatrix_error_or_a_valid_load_never_a_crash(tmp_path, source):
    full = source.read_bytes()
    rng = np.random.default_rng(0)
    p = tmp_path / source.name
    for _ in range(60):
        b = bytearray(full)
        pos = int(rng.integers(0, 4096))  # headers, names and counts live near the front
        b[pos] ^= 1 << int(rng.integers(0, 8))
        p.write_bytes(bytes(b))
        try:
            m = load_imatrix(p)
        except ImatrixError:
            continue
        assert all(np.all(np.isfinite(e)) for e in m.entries.values())


def test_not_a_file_and_missing_file(tmp_path):
    with pytest.raises(ImatrixError, match="not a regular file"):
        load_imatrix(tmp_path)
    with pytest.raises(FileNotFoundError):
        load_imatrix(tmp_path / "absent.gguf")
    assert issubclass(ImatrixError, ValueError)
