"""A toy device backend for the tests: the reference backend's numbers on arrays that refuse implicit numpy
conversion (as CuPy's do), and a KV cache whose block table lives 'on the device' and is synced only when
its owner says it changed. A forward, the engine or a sampler that touches a device array with numpy, or
forgets to sync the block table, fails here instead of on a GPU."""

from __future__ import annotations

from typing import Any

import numpy as np

from edgellm.backends.base import Backend, greedy_ids, top_k_rows
from edgellm.backends.paged_kv import KVCache
from edgellm.backends.reference import ReferenceBackend


class DeviceArray:
    """Device memory stand-in: shape, dtype, reshape, nothing numpy can read implicitly."""

    __array_priority__ = 1000

    def __init__(self, a: np.ndarray):
        assert isinstance(a, np.ndarray), type(a)
        self._a = a

    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)

    def reshape(self, *shape: Any) -> DeviceArray:
        return DeviceArray(self._a.reshape(*shape))

    def __array__(self, *args: Any, **kwargs: Any):
        raise TypeError("implicit conversion of a device array to numpy; use Backend.to_host")

    def __array_ufunc__(self, *args: Any, **kwargs: Any):
        raise TypeError("numpy arithmetic on a device array; use backend ops")

    def __iter__(self):
        raise TypeError("iterating a device array; use Backend.to_host")

    def __getitem__(self, key: Any):
        raise TypeError("indexing a device array from the host; use backend ops (take_rows, columns)")

    def __float__(self):
        raise TypeError("a device array is not a host scalar")


def dev(a: Any) -> np.ndarray:
    """The numpy array behind a device array; refuses host arrays where device ones are due."""
    if not isinstance(a, DeviceArray):
        raise TypeError(f"a host {type(a).__name__} was passed where a device array is due")
    return a._a


def host_ids(a: Any) -> np.ndarray:
    if isinstance(a, DeviceArray):
        raise TypeError("token ids, positions and sequence ids come from the host")
    return np.asarray(a, np.int64)


class ToyKV(KVCache):
    """paged_kv's layout with a device copy of the block table, refreshed only after table_written()."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.device_table = self.block_table.copy()
        self.syncs = 0
        self._dirty = False

    def table_written(self) -> None:
        super().table_written()
        self._dirty = True

    def sync(self) -> None:
        if self._dirty:
            self.device_table = self.block_table.copy()
            self.syncs += 1
            self._dirty = False

    def layer_view(self, layer: int):
        k, v, table = super().layer_view(layer)
        return k, v, (self.device_table if table is self.block_table else table)


class ToyDeviceBackend(Backend):
    """The reference backend behind a device boundary."""

    name = "toy-device"
    keeps_logits = True

    def __init__(self, threads: int | None = None):
        self.ref = ReferenceBackend()
        self.uploads = 0  # host -> device copies of activations (from_host): a forward needs none
        self.downloads = 0
        self.top_k_steps = 0  # decode steps that moved top-k candidates instead of logits

    def supports(self, op: str, qtype: Any = None) -> bool:
        return self.ref.supports(op, qtype)

    def bind(self, t):
        return self.ref.bind(t)  # "uploaded" once: the reference's weight handle

    def vector(self, t) -> DeviceArray:
        return DeviceArray(self.ref.vector(t))

    def from_host(self, x: np.ndarray) -> DeviceArray:
        self.uploads += 1
        return DeviceArray(np.ascontiguousarray(x, np.float32))

    def to_host(self, x: DeviceArray) -> np.ndarray:
        self.downloads += 1
        return dev(x).copy()

    def take_rows(self, x, rows):
        return DeviceArray(dev(x)[host_ids(rows)])

    def get_rows(self, w, ids):
        return DeviceArray(self.ref.get_rows(w, host_ids(ids)))

    def matmul(self, w, x):
        return DeviceArray(self.ref.matmul(w, dev(x)))

    def rms_norm(self, x, weight, eps):
        return DeviceArray(self.ref.rms_norm(dev(x), None if weight is None else dev(weight), eps))

    def rope(self, x, positions, spec):
        return DeviceArray(self.ref.rope(dev(x), host_ids(positions), spec))

    def attention(self, q, k, v, kv: ToyKV, layer, seq_ids, positions, scale, window=None, softcap=None):
        assert isinstance(kv, ToyKV), "the cache must be this backend's own"
        kv.sync()
        out = self.ref.attention(
            dev(q), dev(k), dev(v), kv, layer, host_ids(seq_ids), host_ids(positions), scale, window, softcap
        )
        return DeviceArray(out)

    def new_kv_cache(self, n_layers, n_kv_heads, head_dim, n_ctx, n_seqs, block_size=None, n_blocks=None,
                     window_layers=(), window=None, type_k="f16", type_v="f16") -> ToyKV:  # fmt: skip
        return ToyKV(
            n_layers, n_kv_heads, head_dim, n_ctx, n_seqs, block_size, n_blocks, window_layers, window,
            type_k=type_k, type_v=type_v,
        )  # fmt: skip

    def silu_mul(self, gate, up):
        return DeviceArray(self.ref.silu_mul(dev(gate), dev(up)))

    def gelu_mul(self, gate, up):
        return DeviceArray(self.ref.gelu_mul(dev(gate), dev(up)))

    def add(self, a, b):
        return DeviceArray(self.ref.add(dev(a), dev(b)))

    def scale(self, x, s):
        return DeviceArray(self.ref.scale(dev(x), s))

    def softcap(self, x, cap):
        return DeviceArray(self.ref.softcap(dev(x), cap))

    def columns(self, x, start, stop):
        return DeviceArray(self.ref.columns(dev(x), start, stop))

    def decode_top_k(self, model, tokens, positions, seq_ids, kv, k):
        logits = model.logits(model.hidden(tokens, positions, seq_ids, kv))  # stays on the device
        self.downloads += 1  # k candidates per row cross
        self.top_k_steps += 1
        return top_k_rows(dev(logits), k)

    def decode_greedy(self, model, tokens, positions, seq_ids, kv):
        logits = model.logits(model.hidden(tokens, positions, seq_ids, kv))  # stays on the device
        self.downloads += 1  # only the ids cross
        return greedy_ids(dev(logits))
