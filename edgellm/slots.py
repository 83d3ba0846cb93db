"""Slot save files (llama-server's `--slot-save-path` and `POST /slots/{id}?action=save|restore`): the
tokens of a conversation and their K/V rows, so that a server started later (or another slot) reads a
long prompt back from disk instead of computing it again.

The file is edgellm's own, not llama.cpp's session format (`llama_state_seq_save_file`, which holds
llama.cpp's own cache layout): the magic b"EDGLMKV1", a uint32 little-endian length and that many bytes
of a JSON header, then the tokens (int32 little-endian) and the K and V rows as the cache stores them,
(layers, tokens, KV heads, row) each: float16 values, or q8_0 rows' bytes. The header names the model
(`model_fingerprint`: its size and eight windows of its bytes, hashed), the cache's row shapes and types
and the token count; a file from another model, another cache type or with any size that does not add
up is refused by name, and token ids outside the vocabulary too.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

MAGIC = b"EDGLMKV1"
VERSION = 1
MAX_HEADER = 1 << 16
_WINDOWS, _WINDOW = 8, 1 << 16
# llama.cpp's fs_validate_filename, narrowed: a plain name in the save directory, no path, no dot file
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}")


class SlotFileError(ValueError):
    """A slot file that cannot be read back into this server's cache (the message says why)."""


def check_filename(name: Any) -> str:
    """`name` if it is a plain file name (letters, digits, `.`, `_`, `-`; not starting with a dot or
    dash, at most 255 characters), else ValueError: it is joined to the save directory."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or ".." in name:
        raise ValueError(
            "filename must be a plain file name (letters, digits, '.', '_', '-'; no path), got "
            + (repr(name)[:80] if isinstance(name, str) else type(name).__name__)
        )
    return name


def model_fingerprint(path: str | os.PathLike) -> str:
    """A hash of a model file's size and eight 64 KiB windows spread over it (its header and tensor
    data): two files that differ anywhere a window falls, or in size, differ here. Cheap on a Pi: it
    reads 512 KiB, not the file."""
    h = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        h.update(size.to_bytes(8, "little"))
        for i in range(_WINDOWS):
            at = max(0, (size - _WINDOW) * i // (_WINDOWS - 1))
            h.update(os.pread(fd, _WINDOW, at))
    finally:
        os.close(fd)
    return h.hexdigest()[:32]


def _layout(cache: Any) -> dict[str, Any]:
    """What a file must agree on with the cache it is read into."""
    (layers, _, heads, row_k), (_, _, _, row_v) = cache.block_shapes()
    return {"layers": layers, "kv_heads": heads, "type_k": cache.type_k, "row_k": row_k,
            "type_v": cache.type_v, "row_v": row_v}  # fmt: skip


def _dtype(kind: str) -> np.dtype:
    return np.dtype("<f2") if kind == "f16" else np.dtype(np.uint8)


def save(path: Path, fingerprint: str, cache: Any, tokens: list[int], k: np.ndarray, v: np.ndarray) -> int:
    """Write a slot file (through a temporary name, so a reader never sees half of one); returns the
    bytes written."""
    header = {"version": VERSION, "model_fingerprint": fingerprint, **_layout(cache), "n_tokens": len(tokens)}
    head = json.dumps(header).encode()
    parts = [MAGIC, struct.pack("<I", len(head)), head, np.asarray(tokens, "<i4").tobytes()]
    parts += [np.ascontiguousarray(k, _dtype(cache.type_k)).tobytes()]
    parts += [np.ascontiguousarray(v, _dtype(cache.type_v)).tobytes()]
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")  # one per writer
    try:
        with os.fdopen(fd, "wb") as f:
            for p in parts:
                f.write(p)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return sum(len(p) for p in parts)


def load(
    path: Path, fingerprint: str, cache: Any, n_vocab: int
) -> tuple[list[int], np.ndarray, np.ndarray, int]:
    """(tokens, K, V, bytes read) of a slot file saved from this model into a cache like `cache`;
    SlotFileError naming what does not fit, FileNotFoundError if there is no such file."""
    data = path.read_bytes()
    if data[: len(MAGIC)] != MAGIC or len(data) < len(MAGIC) + 4:
        raise SlotFileError(f"{path.name} is not an edgellm slot file")
    (n_head,) = struct.unpack_from("<I", data, len(MAGIC))
    at = len(MAGIC) + 4
    if n_head > MAX_HEADER or at + n_head > len(data):
        raise SlotFileError(f"{path.name}: its header is cut short or too long ({n_head} bytes)")
    try:
        header = json.loads(data[at : at + n_head])
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SlotFileError(f"{path.name}: its header is not JSON ({e})") from None
    if not isinstance(header, dict) or header.get("version") != VERSION:
        raise SlotFileError(f"{path.name}: not a version {VERSION} slot file")
    if header.get("model_fingerprint") != fingerprint:
        raise SlotFileError(f"{path.name} was saved from another model file than the one this server runs")
    want = _layout(cache)
    got = {key: header.get(key) for key in want}
    if got != want:
        diff = ", ".join(
            f"{key} {got[key]!r} (this cache: {want[key]!r})" for key in want if got[key] != want[key]
        )
        raise SlotFileError(f"{path.name} holds another KV cache layout: {diff}")
    n = header.get("n_tokens")
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise SlotFileError(f"{path.name}: n_tokens must be a count, got {n!r}")
    at += n_head
    shape_k = (want["layers"], n, want["kv_heads"], want["row_k"])
    shape_v = (want["layers"], n, want["kv_heads"], want["row_v"])
    dk, dv = _dtype(want["type_k"]), _dtype(want["type_v"])
    sizes = [4 * n, int(np.prod(shape_k)) * dk.itemsize, int(np.prod(shape_v)) * dv.itemsize]
    if at + sum(sizes) != len(data):
        raise SlotFileError(
            f"{path.name}: {len(data) - at} bytes after the header, {sum(sizes)} expected for {n} tokens"
        )
    tokens = np.frombuffer(data, "<i4", n, at)
    if n and (tokens.min() < 0 or tokens.max() >= n_vocab):
        raise SlotFileError(f"{path.name}: a token id outside this model's vocabulary of {n_vocab}")
    at += sizes[0]
    k = np.frombuffer(data, dk, sizes[1] // dk.itemsize, at).reshape(shape_k)
    v = np.frombuffer(data, dv, sizes[2] // dv.itemsize, at + sizes[1]).reshape(shape_v)
    if dk.kind == "f":
        k = k.astype(np.float16)
    if dv.kind == "f":
        v = v.astype(np.float16)
    return tokens.tolist(), k, v, len(data)
