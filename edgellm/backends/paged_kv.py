"""The paged KV cache in host memory that the CPU backends share: K and V (float16, or q8_0 blocks) in blocks
of positions, an int32 block table per sequence, and rings for sliding-window layers. It implements
base.KVCacheProtocol; the C attention (native/runtime/attention.c) and the numba kernels read exactly this
layout.

A q8_0 row (llama.cpp's `-ctk q8_0` / `-ctv q8_0`) is each head's Dh values as Dh / 32 ggml block_q8_0
(an f16 scale, then 32 int8), 34 bytes per 32 values against float16's 64 (53%). Rows are quantized as
ggml-cpu's quantize_row_q8_0 does when it copies K and V into such a cache (and the native kernels do for
activations): d = amax / 127 stored as f16, q = rint(x * (127 / amax)).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

DEFAULT_BLOCK_SIZE = 16  # positions per KV block (vLLM's default; llama.cpp's unified cache is one block)
WINDOW_CHUNK = 512  # most tokens of one sequence per forward on a sliding-window ring (PREFILL_CHUNK)
CACHE_TYPES = ("f16", "q8_0")  # what -ctk / -ctv take (llama.cpp's names)
Q8_0_BLOCK = 32  # values per block_q8_0
Q8_0_BYTES = 34  # f16 d + 32 int8


def check_cache_type(kind: str, head_dim: int, which: str = "K") -> str:
    """`kind` if a cache of heads of head_dim can hold it, else ValueError naming what is wrong."""
    if kind not in CACHE_TYPES:
        choices = ", ".join(CACHE_TYPES)
        raise ValueError(f"{which} cache type {kind!r} is not supported (choose from {choices})")
    if kind == "q8_0" and head_dim % Q8_0_BLOCK:
        raise ValueError(f"{which} cache type q8_0 needs heads that is a multiple of 32 (not {head_dim})")
    return kind


def row_bytes(kind: str, head_dim: int) -> int:
    """Bytes one head's row of head_dim values takes in a cache of type `kind`."""
    return head_dim // Q8_0_BLOCK * Q8_0_BYTES if kind == "q8_0" else 2 * head_dim


def q8_0_encode(x: np.ndarray) -> np.ndarray:
    """Rows (..., Dh) float32 as q8_0 blocks (..., Dh / 32 * 34) uint8, as quantize_row_q8_0 does
    (ggml-cpu quants: d = f16(amax / 127), q = nearest-even of x * (127 / amax); 0 for an all-zero block)."""
    x = np.asarray(x, np.float32)
    b = x.reshape(*x.shape[:-1], -1, Q8_0_BLOCK)
    amax = np.abs(b).max(axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.rint(b * inv).astype(np.int8)
    d = (amax / np.float32(127)).astype(np.float16)
    out = np.concatenate([d.view(np.uint8), q.view(np.uint8)], axis=-1)
    return out.reshape(*x.shape[:-1], -1)


def q8_0_decode(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """q8_0 rows (..., nb * 34) uint8 -> (scales (..., nb) float32, values (..., nb, 32) int8)."""
    b = np.ascontiguousarray(raw).reshape(*raw.shape[:-1], -1, Q8_0_BYTES)
    d = np.ascontiguousarray(b[..., :2]).view(np.float16)[..., 0].astype(np.float32)
    return d, np.ascontiguousarray(b[..., 2:]).view(np.int8)


def q8_0_values(raw: np.ndarray) -> np.ndarray:
    """q8_0 rows (..., nb * 34) -> their values (..., nb * 32) float32 (d * q: exact in float32)."""
    d, q = q8_0_decode(raw)
    return (q.astype(np.float32) * d[..., None]).reshape(*raw.shape[:-1], -1)


class KVCache:
    """Paged cache: k, v of shape (layers, slots, Hkv, Dh) float16, slots = n_blocks * block_size; a q8_0
    cache (type_k / type_v "q8_0") holds (layers, slots, Hkv, Dh / 32 * 34) uint8 rows of blocks instead.

    block_table (seqs, max_blocks_per_seq) int32 names the block holding each run of block_size positions
    of a sequence (-1: unmapped); position p of sequence s lives at slot
    block_table[s, p // block_size] * block_size + p % block_size. Without n_blocks, every sequence owns
    its own consecutive blocks (the layout `generate.py` uses); with n_blocks the table starts unmapped
    and `edgellm.kvcache` fills it from one shared pool.

    Sliding-window layers (`window_layers`, attending to at most `window` positions) can keep a ring
    instead: each sequence owns R blocks, R * block_size >= window + window_chunk - 1, and logical block j
    of sequence s is ring block s * R + j % R (`ring_table`). A forward may then carry at most
    window_chunk tokens of one sequence (so none of them overwrites a position another still reads); the
    ring rows live in k_ring, v_ring. llama.cpp sizes its SWA cache the same way (n_swa + n_ubatch).
    Use `layer_view(layer)` for a layer's (k, v, block table).
    """

    def __init__(
        self,
        n_layers: int,
        n_kv_heads: int,
        head_dim: int,
        n_ctx: int,
        n_seqs: int,
        block_size: int | None = None,
        n_blocks: int | None = None,
        window_layers: Sequence[int] = (),
        window: int | None = None,
        window_chunk: int = WINDOW_CHUNK,
        host_storage: bool = True,
        type_k: str = "f16",
        type_v: str = "f16",
    ):
        self.type_k = check_cache_type(type_k, head_dim, "K")
        self.type_v = check_cache_type(type_v, head_dim, "V")
        self.head_dim, self.n_kv_heads = int(head_dim), int(n_kv_heads)
        # a stored row's last axis: Dh float16 values, or a q8_0 row's bytes
        self.row_k = head_dim if self.type_k == "f16" else row_bytes(self.type_k, head_dim)
        self.row_v = head_dim if self.type_v == "f16" else row_bytes(self.type_v, head_dim)
        bs = int(block_size or DEFAULT_BLOCK_SIZE)
        if bs <= 0 or n_ctx <= 0 or n_seqs <= 0:
            raise ValueError(f"KV cache needs positive sizes, got block {bs}, ctx {n_ctx}, seqs {n_seqs}")
        per_seq = -(-n_ctx // bs)  # blocks one sequence may map
        if n_blocks is None:
            n_blocks = n_seqs * per_seq
            table = np.arange(n_blocks, dtype=np.int32).reshape(n_seqs, per_seq)
        else:
            table = np.full((n_seqs, per_seq), -1, np.int32)
        ring_blocks = -(-(int(window or 0) + window_chunk - 1) // bs)
        self.window_chunk = int(window_chunk)
        ring = sorted({int(i) for i in window_layers}) if window and ring_blocks < per_seq else []
        full = [i for i in range(n_layers) if i not in set(ring)]
        self._where = [(i in ring, (ring if i in ring else full).index(i)) for i in range(n_layers)]
        self.n_slots = int(n_blocks) * bs
        self.full_layers = full
        # a device cache (host_storage=False) keeps only the tables here
        keep = 1 if host_storage else 0

        # np.zeros, never zeros_like (which writes every zero): pages are taken as blocks fill, so a large
        # --kv-budget costs memory only as far as it is used. numpy asks for transparent huge pages on large
        # arrays, so the first write to each layer's rows takes 2 MiB (at most 4 MiB per layer beyond what
        # is used); 4 KiB pages would save that but cost a third of decode speed at depth 1024 (Zen 3).
        def rows(layers: int, slots: int, kind: str) -> np.ndarray:
            if kind == "q8_0":
                return np.zeros((layers, slots, n_kv_heads, row_bytes(kind, head_dim)), np.uint8)
            return np.zeros((layers, slots, n_kv_heads, head_dim), np.float16)

        self.k = rows(len(full) * keep, self.n_slots * keep, self.type_k)
        self.v = rows(len(full) * keep, self.n_slots * keep, self.type_v)
        self.ring_layers = ring
        self.ring_blocks = ring_blocks if ring else 0
        self.ring_table = (
            (
                np.arange(n_seqs, dtype=np.int32)[:, None] * ring_blocks + np.arange(per_seq) % ring_blocks
            ).astype(np.int32)
            if ring
            else None
        )
        self.n_ring_slots = n_seqs * ring_blocks * bs if ring else 0
        self.k_ring = rows(len(ring) * keep, self.n_ring_slots * keep, self.type_k)
        self.v_ring = rows(len(ring) * keep, self.n_ring_slots * keep, self.type_v)
        self.block_table = table
        self.block_size = bs
        self.n_blocks = int(n_blocks)
        self.n_ctx = n_ctx  # positions per sequence
        self.n_seqs = n_seqs
        self._checked: tuple = ()  # the arrays check() last passed, and copies of their values
        self.table_version = 0  # bumped by table_written(): host memory, so nothing to copy

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes + self.k_ring.nbytes + self.v_ring.nbytes

    def arrays(self) -> tuple[np.ndarray, ...]:
        """Every array the attention kernels read (a captured plan checks they are still these)."""
        return (self.k, self.v, self.block_table, self.k_ring, self.v_ring)

    def layer_view(self, layer: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """k, v (slots, Hkv, Dh) float16 (or (slots, Hkv, Dh / 32 * 34) uint8 q8_0 rows) and the int32
        block table of one layer."""
        ring, i = self._where[layer]
        if ring:
            return self.k_ring[i], self.v_ring[i], self.ring_table
        return self.k[i], self.v[i], self.block_table

    def check_window_chunk(self, seq_ids: np.ndarray) -> None:
        """Ring layers hold window + WINDOW_CHUNK - 1 positions: refuse a forward with more tokens of one
        sequence than that allows."""
        if self.ring_layers and len(seq_ids) > self.window_chunk:
            most = int(np.bincount(np.asarray(seq_ids, np.int64)).max())
            if most > self.window_chunk:
                raise ValueError(
                    f"{most} tokens of one sequence in one forward; a sliding-window cache takes at most "
                    f"{self.window_chunk}"
                )

    def check(self, seq_ids: np.ndarray, positions: np.ndarray) -> None:
        """check_window_chunk and slots' checks, made once per forward: every layer of a forward passes
        the same arrays, so a repeat of the last checked (unchanged) arrays returns at once."""
        c = self._checked
        if c and c[0] is seq_ids and c[1] is positions:
            if np.array_equal(c[2], seq_ids) and np.array_equal(c[3], positions):
                return
        self.check_window_chunk(seq_ids)
        self.slots(seq_ids, positions)
        self._checked = (seq_ids, positions, np.copy(seq_ids), np.copy(positions))

    def slots(
        self, seq_ids: np.ndarray, positions: np.ndarray, table: np.ndarray | None = None
    ) -> np.ndarray:
        """Cache slots (int64) of (seq, position) pairs, through `table` (default: the block table; a
        ring layer passes ring_table). Raises ValueError if a position is outside the context, or if a
        block holding it or any earlier position of its sequence is unmapped: attention reads positions
        0..p, and native kernels rely on this check having been made."""
        seq_ids = np.asarray(seq_ids, np.int64)
        positions = np.asarray(positions, np.int64)
        if positions.size == 0:
            return positions
        if positions.max() >= self.n_ctx or positions.min() < 0:
            bad = int(positions.max()) if positions.max() >= self.n_ctx else int(positions.min())
            raise ValueError(f"position {bad} is outside the context of {self.n_ctx}")
        if seq_ids.min() < 0 or seq_ids.max() >= self.n_seqs:
            raise ValueError(f"sequence id outside 0..{self.n_seqs - 1}")
        seqs, row_seq = np.unique(seq_ids, return_inverse=True)
        unmapped = self.block_table[seqs] < 0  # (distinct seqs, max blocks)
        first_hole = np.where(unmapped.any(axis=1), unmapped.argmax(axis=1), unmapped.shape[1])[row_seq]
        blk = positions // self.block_size
        if (blk >= first_hole).any():
            i = int(np.argmax(blk >= first_hole))
            raise ValueError(f"sequence {int(seq_ids[i])} has no KV block for position {int(positions[i])}")
        table = self.block_table if table is None else table
        return table[seq_ids, blk].astype(np.int64) * self.block_size + positions % self.block_size

    def table_written(self) -> None:
        """The block table's owner (edgellm.kvcache.PagedKV) changed it. The backends read this very
        array, so there is nothing to sync; the version lets a plan or a test see that it changed."""
        self.table_version += 1

    def clear(self, seq: int | None = None) -> None:
        """Nothing to free: positions are overwritten before they are read."""

    def check_copy(self, src: int, dst: int, n: int) -> None:
        """ValueError unless src and dst are two blocks of the pool and 0 < n <= block_size."""
        if not (0 <= src < self.n_blocks and 0 <= dst < self.n_blocks) or src == dst:
            raise ValueError(f"cannot copy block {src} to block {dst} of a pool of {self.n_blocks}")
        if not 0 < n <= self.block_size:
            raise ValueError(f"cannot copy {n} positions of a block of {self.block_size}")

    def copy_positions(self, src: int, dst: int, n: int) -> None:
        """K and V of block src's first n positions into block dst, in every layer the block table maps
        (KVCacheProtocol.copy_positions): q8_0 rows are copied as stored."""
        self.check_copy(src, dst, n)
        a, b = src * self.block_size, dst * self.block_size
        for rows in (self.k, self.v):
            rows[:, b : b + n] = rows[:, a : a + n]

    def block_shapes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Shapes of read_block's K and V: (block-table layers, block_size, n_kv_heads, row)."""
        head = (len(self.full_layers), self.block_size, self.n_kv_heads)
        return (*head, self.row_k), (*head, self.row_v)

    def check_block(self, block: int, k: np.ndarray | None = None, v: np.ndarray | None = None) -> None:
        if not 0 <= block < self.n_blocks:
            raise ValueError(f"block {block} is outside the pool of {self.n_blocks}")
        shapes = self.block_shapes()
        for got, shape, kind, which in zip((k, v), shapes, (self.type_k, self.type_v), "KV"):
            dtype = np.uint8 if kind == "q8_0" else np.float16
            if got is not None and (got.shape != shape or got.dtype != dtype):
                raise ValueError(
                    f"{which} of a block is {shape} {np.dtype(dtype)}, not {got.shape} {got.dtype}"
                )

    def read_block(self, block: int) -> tuple[np.ndarray, np.ndarray]:
        self.check_block(block)
        a = block * self.block_size
        return self.k[:, a : a + self.block_size].copy(), self.v[:, a : a + self.block_size].copy()

    def write_block(self, block: int, k: np.ndarray, v: np.ndarray) -> None:
        self.check_block(block, k, v)
        a = block * self.block_size
        self.k[:, a : a + self.block_size] = k
        self.v[:, a : a + self.block_size] = v


class DeviceKV(KVCache):
    """A cache whose K and V live on a device (vulkan, cuda): the tables stay here (the engine writes them),
    K and V are f16 only (a q8_0 cache is refused by name), and a changed block table is copied to the
    device before the next forward (`sync`). A subclass allocates `layers` [(K, V) per layer] and
    implements `upload_table`, `copy_positions`, `read_block` and `write_block`."""

    def __init__(self, backend_name: str, *args: Any, **kwargs: Any):
        for which in ("type_k", "type_v"):
            if kwargs.get(which, "f16") != "f16":
                kind = kwargs[which]
                raise ValueError(
                    f"{backend_name}: a {kind} KV cache (-ct{which[-1]}) is not supported, only f16"
                )
        super().__init__(*args, host_storage=False, **kwargs)
        self.layers: list[tuple[Any, Any]] = []
        self._dirty = False

    def layer_slots(self, layer: int) -> int:
        """K/V rows (slots) layer `layer` holds: the ring's for a sliding-window ring layer."""
        return self.n_ring_slots if self._where[layer][0] else self.n_slots

    def table_written(self) -> None:
        super().table_written()
        self._dirty = True

    def sync(self) -> None:
        """Copy the block table to the device if it changed."""
        if self._dirty:
            self.upload_table()
            self._dirty = False

    def upload_table(self) -> None:
        raise NotImplementedError

    def copy_positions(self, src: int, dst: int, n: int) -> None:
        raise NotImplementedError  # K and V are the subclass's device buffers

    def read_block(self, block: int) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def write_block(self, block: int, k: np.ndarray, v: np.ndarray) -> None:
        raise NotImplementedError
