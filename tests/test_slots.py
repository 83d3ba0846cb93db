"""Slot save files (edgellm/slots.py): a round trip through a host cache's layout, and every way a file
that does not fit this model and cache is refused by name."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from edgellm import slots
from edgellm.backends.paged_kv import KVCache


def _cache(type_k: str = "f16", type_v: str = "f16") -> KVCache:
    return KVCache(3, 2, 32, 64, 2, block_size=4, n_blocks=16, type_k=type_k, type_v=type_v)


def _rows(cache: KVCache, n: int) -> tuple[np.ndarray, np.ndarray]:
    r = np.random.default_rng(n)
    (layers, _, heads, row_k), (_, _, _, row_v) = cache.block_shapes()
    out = []
    for kind, row in ((cache.type_k, row_k), (cache.type_v, row_v)):
        if kind == "f16":
            out.append(r.standard_normal((layers, n, heads, row)).astype(np.float16))
        else:
            out.append(r.integers(0, 256, (layers, n, heads, row), dtype=np.uint8))
    return out[0], out[1]


@pytest.mark.parametrize("types", [("f16", "f16"), ("q8_0", "f16"), ("q8_0", "q8_0")])
def test_a_saved_slot_loads_back_bit_for_bit(tmp_path, types):
    cache = _cache(*types)
    k, v = _rows(cache, 7)
    tokens = [5, 9, 11, 3, 0, 99, 42]
    n = slots.save(tmp_path / "a.bin", "fp", cache, tokens, k, v)
    assert n == (tmp_path / "a.bin").stat().st_size and not list(tmp_path.glob(".*"))  # no temporary left
    got, gk, gv, read = slots.load(tmp_path / "a.bin", "fp", cache, n_vocab=100)
    assert got == tokens and read == n
    assert gk.dtype == k.dtype and gv.dtype == v.dtype
    np.testing.assert_array_equal(gk.view(np.uint8), k.view(np.uint8))
    np.testing.assert_array_equal(gv.view(np.uint8), v.view(np.uint8))
    assert slots.load(tmp_path / "a.bin", "fp", cache, 100)[0] == tokens  # read twice: nothing consumed
    slots.save(tmp_path / "empty.bin", "fp", cache, [], k[:, :0], v[:, :0])
    assert slots.load(tmp_path / "empty.bin", "fp", cache, 100)[0] == []


def test_a_file_that_does_not_fit_this_model_or_cache_is_refused_by_name(tmp_path):
    cache = _cache()
    k, v = _rows(cache, 5)
    good = tmp_path / "good.bin"
    slots.save(good, "fp", cache, [1, 2, 3, 4, 5], k, v)
    data = good.read_bytes()
    (n_head,) = struct.unpack_from("<I", data, 8)
    header = json.loads(data[12 : 12 + n_head])

    def rewritten(**fields) -> bytes:
        head = json.dumps({**header, **fields}).encode()
        return data[:8] + struct.pack("<I", len(head)) + head + data[12 + n_head :]

    cases = {
        "another model file": ("fp", rewritten(model_fingerprint="other")),
        "another KV cache layout: type_k 'q8_0'": ("fp", rewritten(type_k="q8_0")),
        "layers 4 (this cache: 3)": ("fp", rewritten(layers=4)),
        "n_tokens must be a count": ("fp", rewritten(n_tokens=-1)),
        "bytes after the header": ("fp", rewritten(n_tokens=6)),
        "not a version 1 slot file": ("fp", rewritten(version=2)),
        "is not an edgellm slot file": ("fp", b"GGUF" + data[4:]),
        "header is cut short": ("fp", data[:8] + struct.pack("<I", 1 << 20) + data[12:]),
        "header is not JSON": ("fp", data[:8] + struct.pack("<I", 3) + b"{x}"),
        "outside this model's vocabulary": (
            "fp",
            data.replace(struct.pack("<5i", 1, 2, 3, 4, 5), struct.pack("<5i", 1, 2, 300, 4, 5)),
        ),
    }
    for i, (fragment, (fp, blob)) in enumerate(cases.items()):
        path = tmp_path / f"bad{i}.bin"
        path.write_bytes(blob)
        with pytest.raises(slots.SlotFileError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
            slots.load(path, fp, cache, n_vocab=100)
    with pytest.raises(slots.SlotFileError, match="another model file"):
        slots.load(good, "a different model", cache, n_vocab=100)
    with pytest.raises(FileNotFoundError):
        slots.load(tmp_path / "none.bin", "fp", cache, 100)


def test_file_names_are_plain_names_in_the_save_directory():
    for ok in ("slot1.bin", "a", "chat-2024_01.kv", "A.b.c"):
        assert slots.check_filename(ok) == ok
    for bad in ("", "../x", "a/b", "a\\b", ".hidden", "-x", "x" * 256, "a..b", "é.bin", None, 5, "a b"):
        with pytest.raises(ValueError, match="plain file name"):
            slots.check_filename(bad)


def test_the_model_fingerprint_tells_files_apart_and_reads_little(tmp_path):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    body = np.random.default_rng(1).integers(0, 256, 3 << 20, dtype=np.uint8).tobytes()
    a.write_bytes(body)
    b.write_bytes(body[:-1] + bytes([body[-1] ^ 1]))  # the last byte differs (the last window)
    c.write_bytes(body + b"x")
    fps = [slots.model_fingerprint(p) for p in (a, b, c)]
    assert len(set(fps)) == 3 and slots.model_fingerprint(a) == fps[0]
    small = tmp_path / "small"
    small.write_bytes(b"tiny")
    assert len(slots.model_fingerprint(small)) == 32


def test_the_python_api_saves_a_chats_prompt_and_a_new_llm_reads_it_back(smollm2_path, tmp_path):
    """LLM.save_prompt_cache / load_prompt_cache: a chat's prompt saved after its answer; a new LLM
    reads it back (stepped by the caller, and by a started engine thread) and answers the same with all
    but the last prompt token from the cache; an LLM with another KV cache type refuses the file by name."""
    import edgellm

    system = "You are a careful assistant. Answer in one short sentence, and name your sources. " * 3
    msgs = [{"role": "system", "content": system}, {"role": "user", "content": "Why is the sea salty?"}]
    path = tmp_path / "chat.bin"
    llm = edgellm.LLM(smollm2_path, n_ctx=512, threads=1)
    first = llm.chat(msgs, max_tokens=6, temperature=0)
    n_prompt = len(llm.chat_prompt(msgs))
    assert llm.save_prompt_cache(path, msgs) == n_prompt
    assert llm.save_prompt_cache(tmp_path / "none.bin", "text never read") == 0
    for started in (False, True):
        again = edgellm.LLM(smollm2_path, n_ctx=512, threads=1)
        if started:
            again.engine.start()
        try:
            assert again.load_prompt_cache(path) == n_prompt
            out = again.chat(msgs, max_tokens=6, temperature=0)
        finally:
            again.engine.shutdown()
        assert out.text == first.text and out.timings.cached_tokens == n_prompt - 1
    q8 = edgellm.LLM(smollm2_path, n_ctx=512, threads=1, cache_type_k="q8_0")
    with pytest.raises(slots.SlotFileError, match="type_k 'f16' \\(this cache: 'q8_0'\\)"):
        q8.load_prompt_cache(path)
