"""The backend interface: the ops architectures are written against, on memory the backend owns.

A backend binds each weight once (it may dequantize, repack or upload it then), owns the KV cache, and
runs ops over a flat batch of N tokens (prefill: one sequence's prompt; decode: one token for each of B
sequences; or a mix). Shapes below use N tokens, D model width, H query heads, Hkv key/value heads,
Dh head width, V vocabulary, T cache positions.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from edgellm.gguf import QTensor


class BackendUnavailable(RuntimeError):
    """A backend cannot run here; the message says why in one line."""


@runtime_checkable
class KVCacheProtocol(Protocol):
    """What a backend's KV cache promises the code above it (the engine's PagedKV, the generators).

    K and V of every layer live in the backend's memory (host or device), in a pool of `n_blocks`
    blocks of `block_size` positions. Position p of sequence s (s < n_seqs, p < n_ctx) lives in block
    `block_table[s, p // block_size]` at offset p % block_size; -1 is unmapped. `block_table` is a host
    (n_seqs, ceil(n_ctx / block_size)) int32 array. A cache made with `n_blocks` starts unmapped and
    has exactly one writer, edgellm.kvcache.PagedKV, which calls `table_written()` after every change;
    a cache made without it maps every sequence to blocks of its own and nobody writes the table. A
    device backend copies the table to the device on the first forward after `table_written()` (a
    host cache reads the table in place). Only the backend's attention writes K and V, `copy_positions`
    copies them from block to block, and `write_block` restores what `read_block` read.
    """

    block_size: int
    n_ctx: int
    n_blocks: int
    n_seqs: int
    block_table: np.ndarray

    @property
    def nbytes(self) -> int:
        """Bytes of K and V storage (host or device)."""
        ...

    def table_written(self) -> None:
        """The block table changed: sync it before the next forward."""
        ...

    def check(self, seq_ids: np.ndarray, positions: np.ndarray) -> None:
        """Raise ValueError for a (seq, position) outside the context or in an unmapped block."""
        ...

    def clear(self, seq: int | None = None) -> None:
        """Forget a sequence's (or every) position; positions are overwritten before being read."""
        ...

    def copy_positions(self, src: int, dst: int, n: int) -> None:
        """Copy K and V of block src's first n positions into block dst, in every layer that reads the
        block table (a sliding-window ring keeps its own), ordered after the work already issued and
        before the next forward: the prefix cache's reuse of the first tokens of a block that another
        sequence holds (edgellm.kvcache.PagedKV.open)."""
        ...

    def read_block(self, block: int) -> tuple[np.ndarray, np.ndarray]:
        """Host copies of K and V of one block in every layer that reads the block table: (layers,
        block_size, n_kv_heads, row) arrays as stored (float16 values, or q8_0 rows as uint8), after the
        work already issued (a slot saved to a file, server.py)."""
        ...

    def write_block(self, block: int, k: np.ndarray, v: np.ndarray) -> None:
        """Store what read_block returned (from a cache of the same shape and types) into a block."""
        ...


# what `Backend.supports` is asked about: ops that read a weight take its ggml type
WEIGHT_OPS = ("matmul", "get_rows")


@dataclass(frozen=True)
class RopeSpec:
    """How positions rotate queries and keys (ggml's rope modes: 0 = normal/GPT-J pairs, 2 = neox halves)."""

    n_dims: int  # rotated dimensions of each head (<= Dh)
    freq_base: float
    neox: bool = False
    freq_scale: float = 1.0  # linear scaling: positions are multiplied by this
    freq_factors: np.ndarray | None = None  # (n_dims/2,) per-frequency divisors (Llama 3 rope_freqs)


class Backend(ABC):
    """One interface for every compute backend (reference numpy, numba, native C, devices).

    Ops take and return the backend's own arrays (numpy on the CPU backends, device arrays elsewhere);
    only `to_host` crosses to numpy. Token ids, positions and sequence ids come in as host int64 arrays.
    What a backend runs natively is declared by `supports`; what it does not is run by an explicit
    fallback it composes (and says so at load), never silently emulated.
    """

    name: str = "?"
    # True for a backend whose logits are expensive to move (a device): the engine then asks decode
    # steps for argmax ids or top-k candidates instead of whole (B, V) rows where the sampler allows it
    keeps_logits: bool = False

    # -- what runs here --------------------------------------------------------------------------------
    def supports(self, op: str, qtype: Any = None) -> bool:
        """Whether `op` ("matmul", "get_rows", "attention", ...) runs natively here; for the weight ops
        (WEIGHT_OPS) `qtype` is the weight's GGMLQuantizationType; for "kv_cache" it is a KV cache type
        ("f16", "q8_0": llama.cpp's -ctk / -ctv names). The default: everything."""
        return True

    def fallback_cost(self, t: QTensor) -> int:
        """Extra bytes of memory a weight this backend does not support takes when the fallback runs it
        (0 for a supported one). The default fallback keeps a float32 copy."""
        return 0 if self.supports("matmul", t.type) else int(np.prod(t.shape)) * 4

    # -- the host boundary -----------------------------------------------------------------------------
    def to_host(self, x: Any) -> np.ndarray:
        """x as a host numpy array (identity on the CPU backends; a device copies to the host)."""
        return x

    def from_host(self, x: np.ndarray) -> Any:
        """A host float32 array as this backend's array. Tools and tests use it; a forward never does:
        its activations start at get_rows."""
        return np.ascontiguousarray(x, np.float32)

    def take_rows(self, x: Any, rows: np.ndarray) -> Any:
        """Rows `rows` (host int64) of a 2-D x, as a new backend array (the rows that need logits)."""
        return x[np.asarray(rows, np.int64)]

    # -- weights ---------------------------------------------------------------------------------------
    def prepare(self, mf: Any) -> None:
        """Called with the ModelFile before any of its weights is bound: a device that cannot hold them
        raises BackendUnavailable saying so, before anything is uploaded. The default: nothing to check."""
        return None

    @abstractmethod
    def bind(self, t: QTensor) -> Any:
        """Take ownership of a weight tensor (called once per tensor at load); returns an opaque handle."""

    @abstractmethod
    def vector(self, t: QTensor) -> np.ndarray:
        """A small 1-D weight (norm scales, biases) as float32."""

    # -- ops -------------------------------------------------------------------------------------------
    @abstractmethod
    def get_rows(self, w: Any, ids: np.ndarray) -> np.ndarray:
        """Embedding lookup: ids (N,) -> (N, D) float32."""

    @abstractmethod
    def matmul(self, w: Any, x: np.ndarray) -> np.ndarray:
        """x (N, K) float32 times weight (M, K)ᵀ -> (N, M) float32."""

    @abstractmethod
    def rms_norm(self, x: np.ndarray, weight: np.ndarray | None, eps: float) -> np.ndarray:
        """Normalize the last axis by its root mean square, then scale by weight."""

    @abstractmethod
    def rope(self, x: np.ndarray, positions: np.ndarray, spec: RopeSpec) -> np.ndarray:
        """Rotate x (N, heads, Dh) by positions (N,)."""

    @abstractmethod
    def attention(
        self,
        q: np.ndarray,
        k: np.ndarray,
        v: np.ndarray,
        kv: Any,
        layer: int,
        seq_ids: np.ndarray,
        positions: np.ndarray,
        scale: float,
        window: int | None = None,
        softcap: float | None = None,
    ) -> np.ndarray:
        """Store every row's k, v (N, Hkv, Dh) at (seq, position) in the cache, then attend causally.

        q (N, H, Dh) -> (N, H, Dh): row i attends over positions max(0, p - window + 1) .. p of sequence
        seq_ids[i] (p = positions[i]) through the block table. `window` limits attention to the last
        `window` positions (sliding window). A position outside the context or in an unmapped block raises
        ValueError.
        """

    @abstractmethod
    def new_kv_cache(
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
        type_k: str = "f16",
        type_v: str = "f16",
    ) -> Any:
        """Allocate a paged KV cache for n_seqs sequences of up to n_ctx positions.

        `type_k`, `type_v`: how K and V rows are stored, "f16" or "q8_0" (ggml block_q8_0 per 32 values
        of a head, paged_kv.py); a backend that cannot hold a type says so (supports("kv_cache", type) is
        False) and raises ValueError naming it.

        `window_layers` attend to at most `window` positions (sliding window): they may keep only a ring
        of about window + one prefill chunk positions per sequence instead of n_ctx.

        The cache is a pool of blocks of `block_size` positions (default 16) and an int32 block table
        (n_seqs, ceil(n_ctx / block_size)); position p of sequence s lives in block
        `block_table[s, p // block_size]` (-1: unmapped) at offset p % block_size. Without `n_blocks`
        the pool holds n_seqs * ceil(n_ctx / block_size) blocks and each sequence owns consecutive ones;
        with `n_blocks` the pool holds that many and the table starts unmapped, for `edgellm.kvcache` to
        fill (blocks may be shared by several sequences). The result is a KVCacheProtocol; the CPU
        backends share backends/paged_kv.py's host layout.
        """

    # -- elementwise ops with plain numpy defaults ---------------------------------------------------------
    def silu_mul(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        """SwiGLU: silu(gate) * up."""
        e = np.exp(-np.asarray(gate, np.float64)).astype(np.float32)  # one rounding, the same on every CPU
        return gate / (np.float32(1) + e) * up

    def gelu_mul(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        """GeGLU, gelu(gate) * up, with GELU(tanh) looked up by the f16 value of gate as ggml does
        (ggml-cpu vec.h ggml_vec_geglu_f32 under GGML_GELU_FP16: 0 below -10, identity above 10)."""
        g = _gelu_f16_table()[gate.astype(np.float16).view(np.uint16)].astype(np.float32)
        g = np.where(gate <= -10, np.float32(0), np.where(gate >= 10, gate, g))
        return g * up

    def add(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """a + b, where b is a's shape or a row (a bias) added to every row of a."""
        return a + b

    def scale(self, x: np.ndarray, s: float) -> np.ndarray:
        """x * s (s rounded to float32 first)."""
        return x * np.float32(s)

    def softcap(self, x: np.ndarray, cap: float) -> np.ndarray:
        """cap * tanh(x / cap) (Gemma's logit soft-capping)."""
        c = np.float32(cap)
        return c * np.tanh((x / c).astype(np.float64)).astype(np.float32)

    def columns(self, x: np.ndarray, start: int, stop: int) -> np.ndarray:
        """Columns start..stop of a 2-D x, as a contiguous (N, stop - start) array (fused-QKV splits)."""
        return np.ascontiguousarray(x[:, start:stop])

    # -- decode steps ------------------------------------------------------------------------------------
    def decode_step(
        self, model: Any, tokens: np.ndarray, positions: np.ndarray, seq_ids: np.ndarray, kv: Any
    ) -> np.ndarray:
        """model.forward for one decode step (B rows, logits for all). A backend may record the step's
        ops once per batch size and replay them (native: one C call per step); the logits it returns may
        then live in the plan's memory, valid until the next step of that batch size: copy to keep them."""
        return model.forward(tokens, positions, seq_ids, kv)

    def decode_greedy(
        self, model: Any, tokens: np.ndarray, positions: np.ndarray, seq_ids: np.ndarray, kv: Any
    ) -> np.ndarray:
        """A decode step that returns each row's argmax token (B,) int64 (first maximum on ties, as the
        sampler's greedy; -1 for a row whose logits are not all finite) instead of its logits: a device
        keeps the logits where they are and moves B ids."""
        return greedy_ids(self.decode_step(model, tokens, positions, seq_ids, kv))

    def decode_top_k(
        self, model: Any, tokens: np.ndarray, positions: np.ndarray, seq_ids: np.ndarray, kv: Any, k: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """A decode step that returns each row's top-k candidates (top_k_rows) instead of its logits, for
        rows whose sampler starts with top-k and adds nothing to the logits: the chain finishes on the
        host over k values, the same token as over the whole row."""
        return top_k_rows(self.decode_step(model, tokens, positions, seq_ids, kv), k)


def top_k_rows(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids (B, k) int64, logits (B, k) float32): each row's k largest logits, largest first, ties by the
    lowest id: exactly the candidates (and their order) the sampler's top_k keeps."""
    k = max(1, min(int(k), logits.shape[-1]))
    ids = np.argsort(-logits, axis=-1, kind="stable")[:, :k].astype(np.int64)
    return ids, np.take_along_axis(logits, ids, axis=-1)


def greedy_ids(logits: np.ndarray) -> np.ndarray:
    """Row-wise argmax (first maximum), -1 where a row holds a NaN or an infinity as its maximum."""
    ids = np.argmax(logits, axis=-1).astype(np.int64)
    ids[~np.isfinite(np.max(logits, axis=-1))] = -1
    return ids


_GELU_TABLE: np.ndarray | None = None


def _gelu_f16_table() -> np.ndarray:
    """ggml_table_gelu_f16: GELU(tanh) of every f16 value, computed in f32, stored as f16."""
    global _GELU_TABLE
    if _GELU_TABLE is None:
        c, a = np.float32(0.7978845608028654), np.float32(0.044715)
        with np.errstate(all="ignore"):  # NaN and inf patterns (on aarch64 even their f16 -> f32 cast warns)
            x = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
            t = np.tanh((c * x * (np.float32(1) + a * x * x)).astype(np.float64)).astype(np.float32)
            _GELU_TABLE = np.float32(0.5) * x * (np.float32(1) + t)
        _GELU_TABLE = _GELU_TABLE.astype(np.float16)
    return _GELU_TABLE


_GELU_F32: np.ndarray | None = None


def gelu_table_f32() -> np.ndarray:
    """ggml's f16 GELU table widened to float32 (what the compiled GeGLU kernels index by f16 bits)."""
    global _GELU_F32
    if _GELU_F32 is None:
        _GELU_F32 = _gelu_f16_table().astype(np.float32)
    return _GELU_F32


def rope_table(spec: RopeSpec, n_pos: int) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin (n_pos, n_dims/2) float32 of positions 0.. (ggml-cpu ops.cpp ggml_rope_cache_init: the
    running product theta_{i+1} = theta_i * base^(-2/n_dims) in float32, whose rounding matters at long
    positions, then theta / factor_i * freq_scale); every backend's rope reads these values."""
    half = spec.n_dims // 2
    theta_scale = np.float32(spec.freq_base) ** np.float32(-2.0 / spec.n_dims)
    theta = np.empty((n_pos, half), np.float32)
    theta[:, 0] = np.arange(n_pos).astype(np.float32)
    for i in range(1, half):
        theta[:, i] = theta[:, i - 1] * theta_scale
    if spec.freq_factors is not None:
        theta = theta / spec.freq_factors.astype(np.float32)
    theta = theta * np.float32(spec.freq_scale)
    # cos/sin in float64, rounded once: numpy's float32 versions have per-CPU SIMD variants
    t64 = theta.astype(np.float64)
    return np.cos(t64).astype(np.float32), np.sin(t64).astype(np.float32)


class RopeTables:
    """rope_table per RopeSpec, computed once and grown by doubling (at least 256 positions). Growing makes
    new arrays, so tables a caller still points into (a captured plan) stay valid."""

    def __init__(self) -> None:
        self._tables: dict[int, tuple[RopeSpec, np.ndarray, np.ndarray]] = {}

    def get(self, spec: RopeSpec, n_pos: int) -> tuple[np.ndarray, np.ndarray]:
        entry = self._tables.get(id(spec))
        if entry is None or entry[0] is not spec or len(entry[1]) < n_pos:
            have = len(entry[1]) if entry is not None and entry[0] is spec else 0
            cos, sin = rope_table(spec, max(n_pos, 2 * have, 256))
            entry = self._tables[id(spec)] = (spec, cos, sin)
        return entry[1], entry[2]
