"""Numba matmul kernels over quantized weights as stored, computed like ggml-cpu's dot products.

One entry point per family: `matmul_legacy` (Q4_0 .. Q8_0, IQ4_NL vs Q8_0/Q8_1 activations),
`matmul_kquant` (Q2_K .. Q6_K vs Q8_K), `matmul_float` (F32, F16, BF16). Each takes
(kind, w, x, out, n_chunks): w the raw (M, row bytes) uint8 blocks, x (N, K) float32, out (N, M) float32;
it quantizes x once and computes out, the weight rows split into n_chunks ranges run in parallel (each
output is computed whole by one thread, so results do not depend on n_chunks). `compile_family` must run
before first use: it compiles (or loads from Numba's cache) with LLVM's SLP vectorizer on, which the
kernels are written for and Numba leaves off by default.
"""

from __future__ import annotations

import hashlib
from contextlib import contextmanager
from pathlib import Path

import numba
import numpy as np
from gguf import GGMLQuantizationType as T
from numba import njit, prange, types

from edgellm.backends.numba_kernels import floats, kquants, legacy, ops, simd
from edgellm.backends.numba_kernels.common import (
    quantize_q8_0,
    quantize_q8_k,
    round_rows_bf16,
    round_rows_f16,
)


def _cache_dir(module=legacy) -> Path | None:
    """The folder Numba caches this package's kernels in (one for all its modules: Numba picks it per
    source folder): the package's __pycache__, one under $NUMBA_CACHE_DIR, or a user-wide one where the
    package is read-only; None where caching is off."""
    for f in vars(module).values():
        path = getattr(getattr(f, "_cache", None), "_cache_path", None)
        if path:
            return Path(path)
    return None


def _drop_stale_cache(
    here: Path = Path(__file__).parent, code_path: str = "", cache: Path | None = None
) -> None:
    """Numba checks a cached function against its own source file only, yet a caller's cache holds its
    callees' code: after an edit to legacy.py, a cached matmul_legacy would run the old kernels. So the
    cache (`cache`, default here's __pycache__) is kept only while the hash of all kernel sources matches
    the one it was written with, and with the same choice of code path (simd.X86: EDGELLM_NUMBA_SIMD=generic
    compiles the portable IR on x86, which Numba's cache index, keyed by signature and CPU, cannot tell
    from the x86 code). The stamp sits in the cache it vouches for, so a run with another NUMBA_CACHE_DIR
    leaves the package's own cache alone."""
    sources = b"".join(p.read_bytes() for p in sorted(here.glob("*.py")))
    digest = hashlib.sha256(sources + code_path.encode()).hexdigest()
    cache = cache or here / "__pycache__"
    stamp = cache / "kernels.sha256"
    try:
        if stamp.is_file() and stamp.read_text() == digest:
            return
        for f in [*cache.glob("*.nbi"), *cache.glob("*.nbc")]:
            f.unlink(missing_ok=True)
        cache.mkdir(parents=True, exist_ok=True)
        stamp.write_text(digest)
    except OSError:  # a cache Numba cannot write either: it compiles without one
        pass


# before any kernel runs (Numba reads its cache at a function's first call)
if (_CACHE := _cache_dir()) is not None:
    _drop_stale_cache(code_path=simd.X86, cache=_CACHE)

F32 = np.float32

# ggml type -> (family, kernel kind)
KINDS: dict[T, tuple[str, int]] = {
    T.Q4_0: ("legacy", legacy.Q4_0),
    T.Q4_1: ("legacy", legacy.Q4_1),
    T.Q5_0: ("legacy", legacy.Q5_0),
    T.Q5_1: ("legacy", legacy.Q5_1),
    T.Q8_0: ("legacy", legacy.Q8_0),
    T.IQ4_NL: ("legacy", legacy.IQ4_NL),
    T.Q2_K: ("kquant", kquants.Q2_K),
    T.Q3_K: ("kquant", kquants.Q3_K),
    T.Q4_K: ("kquant", kquants.Q4_K),
    T.Q5_K: ("kquant", kquants.Q5_K),
    T.Q6_K: ("kquant", kquants.Q6_K),
    T.F32: ("float", floats.F32_KIND),
    T.F16: ("float", floats.F16_KIND),
    T.BF16: ("float", floats.BF16_KIND),
}


# Row kernels are reached through function pointers (Numba first-class functions): a caller that called
# them directly would link and re-optimize their whole body, which for these unrolled kernels costs as much
# compile time as the kernel itself, again in every caller.
_W = types.Array(types.uint8, 2, "C", readonly=True)
_I8 = types.Array(types.int8, 2, "C")
_I32 = types.Array(types.int32, 2, "C")
_F = types.Array(types.float32, 2, "C")
_i = types.int64
_LEGACY_ROWS = types.void(_i, _W, _I8, _F, _F, _F, _i, _i)  # kind, w, qa, da, sa, out, lo, hi
_KQUANT_ROWS = types.void(_i, _W, _I8, _F, _I32, _F, _i, _i)  # kind, w, qa, da, bs, out, lo, hi
_FLOAT_ROWS = types.void(_i, _W, _F, _F, _i, _i)  # kind, w, xf, out, lo, hi


# One splitter per family (each compiled for exactly one function-pointer signature, then closed to new
# compilations so that callers pass the row kernel as a pointer instead of specializing on it).
@njit(cache=True, parallel=True, nogil=True)
def _split_legacy(rows, kind, w, qa, da, sa, out, n_chunks):
    """rows(kind, w, ..., out, lo, hi) over n_chunks contiguous ranges of weight rows, in parallel."""
    m = w.shape[0]
    if n_chunks <= 1:
        rows(kind, w, qa, da, sa, out, 0, m)
        return
    for t in prange(n_chunks):
        rows(kind, w, qa, da, sa, out, t * m // n_chunks, (t + 1) * m // n_chunks)


@njit(cache=True, parallel=True, nogil=True)
def _split_kquant(rows, kind, w, qa, da, bs, out, n_chunks):
    m = w.shape[0]
    if n_chunks <= 1:
        rows(kind, w, qa, da, bs, out, 0, m)
        return
    for t in prange(n_chunks):
        rows(kind, w, qa, da, bs, out, t * m // n_chunks, (t + 1) * m // n_chunks)


@njit(cache=True, parallel=True, nogil=True)
def _split_float(rows, kind, w, xf, out, n_chunks):
    m = w.shape[0]
    if n_chunks <= 1:
        rows(kind, w, xf, out, 0, m)
        return
    for t in prange(n_chunks):
        rows(kind, w, xf, out, t * m // n_chunks, (t + 1) * m // n_chunks)


@njit(cache=True, nogil=True)
def matmul_legacy(kind, w, x, out, n_chunks):
    n, k = x.shape
    qa = np.empty((n, k), np.int8)
    da = np.empty((n, k // 32), F32)
    sa = np.empty((n, k // 32), F32)  # Q8_1's s, filled for Q4_1/Q5_1 only (the only kernels reading it)
    quantize_q8_0(x, qa, da, sa, kind == legacy.Q4_1 or kind == legacy.Q5_1)
    _split_legacy(legacy.rows, kind, w, qa, da, sa, out, n_chunks)


@njit(cache=True, nogil=True)
def matmul_kquant(kind, w, x, out, n_chunks):
    n, k = x.shape
    qa = np.empty((n, k), np.int8)
    da = np.empty((n, k // 256), F32)
    bs = np.empty((n, k // 16), np.int32)
    quantize_q8_k(x, qa, da, bs)
    _split_kquant(kquants.rows, kind, w, qa, da, bs, out, n_chunks)


@njit(cache=True, nogil=True)
def matmul_float(kind, w, x, out, n_chunks):
    xf = x
    if kind == floats.F16_KIND:
        xf = np.empty_like(x)
        round_rows_f16(x, xf)
    elif kind == floats.BF16_KIND:
        xf = np.empty_like(x)
        round_rows_bf16(x, xf)
    _split_float(floats.rows, kind, w, xf, out, n_chunks)


def _compile_ops() -> None:
    """Call every op once on tiny inputs of the types the backend passes."""
    x, w, out = np.ones((2, 8), F32), np.ones(8, F32), np.empty((2, 8), F32)
    ops.rms_norm(x, w, True, 1e-6, out)
    x3 = np.ones((2, 2, 8), F32)
    ops.rope(
        x3,
        np.ones((2, 4), F32),
        np.ones((2, 4), F32),
        np.arange(2, dtype=np.int64),
        8,
        False,
        np.empty_like(x3),
    )
    cache = np.zeros((4, 1, 8), np.uint16)
    table = np.arange(2, dtype=np.int32).reshape(1, 2)
    pos, seq = np.arange(2, dtype=np.int64), np.zeros(2, np.int64)
    kv1 = x3[:, :1].copy()
    for parallel in (False, True):
        ops.attention(
            x3, kv1, kv1.copy(), cache, cache.copy(), table, 2, seq, pos, 1.0, 0, 0.0, x3.copy(), parallel
        )
    # over q8_0 rows (-ctk/-ctv q8_0): heads of 32, K and V each q8_0 (uint8 rows) or f16 (uint16)
    q32, kv32 = np.ones((2, 2, 32), F32), np.ones((2, 1, 32), F32)
    rows8, rows16 = np.zeros((4, 1, 34), np.uint8), np.zeros((4, 1, 32), np.uint16)
    for kc, vc in ((rows8, rows8), (rows8, rows16), (rows16, rows8)):
        k8, v8 = kc.dtype == np.uint8, vc.dtype == np.uint8
        ops.attention_q8(q32, kv32, kv32, kc, vc, k8, v8, table, 2, seq, pos, 1.0, 0, 0.0, q32.copy())
    v = np.ones(8, F32)
    ops.silu_mul(v, v, np.empty_like(v))
    ops.gelu_mul(v, v, np.zeros(65536, F32), np.empty_like(v))
    ops.add(v, v, np.empty_like(v))
    ops.scale(v, 1.0, np.empty_like(v))
    ops.softcap(v, 1.0, np.empty_like(v))
    ops.add_row(x, w, np.empty_like(x))
    ops.columns(x, 1, np.empty((2, 4), F32))


MATMULS = {"legacy": matmul_legacy, "kquant": matmul_kquant, "float": matmul_float}
_COMPILED: set[str] = set()


@contextmanager
def _slp_vectorizer():
    """Numba's compiler lock, held with LLVM's SLP vectorizer on (compile_family)."""
    from numba.core.compiler_lock import global_compiler_lock

    with global_compiler_lock:
        saved = numba.config.SLP_VECTORIZE
        numba.config.SLP_VECTORIZE = 1
        try:
            yield
        finally:
            numba.config.SLP_VECTORIZE = saved


def compile_family(family: str) -> None:
    """Compile (or load from cache) one family's kernels, serial and parallel, for the argument types
    matmul uses: read-only weights, C-contiguous float32 activations and outputs. "ops": the other ops;
    "plan": every family, then the decode plans' replay (plan.py).

    Numba keeps LLVM's SLP vectorizer off by default; the kernels' unrolled integer dots need it (2-4x).
    It is switched on only while these functions compile, under Numba's compiler lock so that no other
    compilation sees the setting.
    """
    if family in _COMPILED:
        return
    if family == "ops":  # attention's side-by-side key sums want the SLP vectorizer too
        with _slp_vectorizer():
            _compile_ops()
        _COMPILED.add(family)
        return
    if family == "plan":
        for f in (*MATMULS, "ops"):
            compile_family(f)
        from edgellm.backends.numba_kernels import plan

        with _slp_vectorizer():
            plan.compile_replay()
        _COMPILED.add(family)
        return

    fn = MATMULS[family]
    rows, split, sig = {
        "legacy": (legacy.rows, _split_legacy, _LEGACY_ROWS),
        "kquant": (kquants.rows, _split_kquant, _KQUANT_ROWS),
        "float": (floats.rows, _split_float, _FLOAT_ROWS),
    }[family]
    kind, k, row_bytes = {"legacy": (legacy.Q8_0, 32, 34), "kquant": (kquants.Q6_K, 256, 210)}.get(
        family, (floats.F32_KIND, 4, 16)
    )
    w = np.zeros((2, row_bytes), np.uint8)
    w.flags.writeable = False
    with _slp_vectorizer():
        rows.compile(sig)
        split.compile(types.void(types.FunctionType(sig), *sig.args[:-2], _i))
        split.disable_compile()
        for n in (1, legacy.UNPACK_MIN_ROWS):  # both decode and prompt paths
            for chunks in (1, 2):
                fn(kind, w, np.zeros((n, k), F32), np.empty((n, 2), F32), chunks)
    _COMPILED.add(family)
