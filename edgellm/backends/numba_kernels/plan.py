"""One compiled decode step: `replay` runs a captured list of op records (numba_cpu.NumbaPlan) in a single
call, so a token costs one Python call into Numba instead of ~450 (one per op, each paying the Python
method, argument checks and Numba's dispatch: ~3-10 us apiece, a quarter of a small model's step).

A record is one row of an int64 table: its op code, then the op's sizes and the addresses of its arrays,
which `replay` turns back into arrays (`_array`) and hands to the same kernels the backend calls one op at
a time (matmul_*, ops.*, and the element-wise kernels below, which the eager backend uses too), so a replay
computes the same bits as the ops run one by one. Addresses are trusted: the capture admitted only memory
the plan owns or the backend bound, and the plan checks token ids and positions before every replay.
"""

from __future__ import annotations

import numpy as np
from numba import carray, njit, types
from numba.core.imputils import impl_ret_borrowed
from numba.extending import intrinsic

from edgellm.backends import numba_kernels as kernels
from edgellm.backends.numba_kernels import ops

F32 = np.float32

# op codes (column 0 of a record)
MATMUL, RMS_NORM, ROPE, ATTENTION, SILU_MUL, GELU_MUL, ADD, ADD_ROW, SCALE, SOFTCAP, COLUMNS = range(1, 12)
# matmul families (column 1 of a MATMUL record)
LEGACY, KQUANT, FLOAT = 0, 1, 2
# attention cache kinds (column 2 of an ATTENTION record): K q8_0, V q8_0 (else f16)
K_Q8, V_Q8 = 1, 2
WIDTH = 24  # int64 columns of a record
F_WIDTH = 2  # float64 columns (eps, scale, softcap)


@intrinsic
def _pointer(typingctx, addr, dtype):
    """addr (int64) as a pointer to dtype (np.float32, np.uint8, ...)."""
    ptr = types.CPointer(dtype.instance_type)

    def codegen(context, builder, sig, args):
        return builder.inttoptr(args[0], context.get_value_type(ptr))

    return ptr(addr, dtype), codegen


@intrinsic
def _readonly(typingctx, a):
    """The same array typed read-only (the matmul kernels are compiled for read-only weights)."""
    ro = a.copy(readonly=True)

    def codegen(context, builder, sig, args):
        return impl_ret_borrowed(context, builder, ro, args[0])

    return ro(a), codegen


@njit(cache=True, inline="always")
def _array(addr, shape, dtype):
    return carray(_pointer(addr, dtype), shape)


# Kernel signatures as the plan calls them (arrays made by carray: C-contiguous, writable; weights
# read-only): replay reaches every kernel through a function pointer of its signature (Numba first-class
# functions, as the matmul splitters reach their row kernels), so the kernels compile once, on their own,
# and replay itself stays a small function, quick to compile.
_F1, _F2, _F3 = (types.Array(types.float32, d, "C") for d in (1, 2, 3))
_W = types.Array(types.uint8, 2, "C", readonly=True)
_I64 = types.Array(types.int64, 1, "C")
_TABLE = types.Array(types.int32, 2, "C")
_F16_CACHE, _Q8_CACHE = types.Array(types.uint16, 3, "C"), types.Array(types.uint8, 3, "C")
_i, _f, _b = types.int64, types.float64, types.boolean
_att = (_F3, _F3, _F3, _F16_CACHE, _F16_CACHE, _TABLE, _i, _I64, _I64, _f, _i, _f, _F3, _b)


def _att_q8(k_cache, v_cache):
    return types.void(_F3, _F3, _F3, k_cache, v_cache, _b, _b, _TABLE, _i, _I64, _I64, _f, _i, _f, _F3)


# (kernel, its signature) in replay's argument order after (recs, fl)
KERNELS = (
    (kernels.matmul_legacy, types.void(_i, _W, _F2, _F2, _i)),
    (kernels.matmul_kquant, types.void(_i, _W, _F2, _F2, _i)),
    (kernels.matmul_float, types.void(_i, _W, _F2, _F2, _i)),
    (ops.rms_norm, types.void(_F2, _F1, _b, _f, _F2)),
    (ops.rope, types.void(_F3, _F2, _F2, _I64, _i, _b, _F3)),
    (ops.attention, types.void(*_att)),
    (ops.attention_q8, _att_q8(_Q8_CACHE, _Q8_CACHE)),
    (ops.attention_q8, _att_q8(_Q8_CACHE, _F16_CACHE)),
    (ops.attention_q8, _att_q8(_F16_CACHE, _Q8_CACHE)),
    (ops.silu_mul, types.void(_F1, _F1, _F1)),
    (ops.gelu_mul, types.void(_F1, _F1, _F1, _F1)),
    (ops.add, types.void(_F1, _F1, _F1)),
    (ops.add_row, types.void(_F2, _F1, _F2)),
    (ops.scale, types.void(_F1, _f, _F1)),
    (ops.softcap, types.void(_F1, _f, _F1)),
    (ops.columns, types.void(_F2, _i, _F2)),
)
REPLAY = types.void(
    types.Array(types.int64, 2, "C"),
    types.Array(types.float64, 2, "C"),
    *(types.FunctionType(sig) for _, sig in KERNELS),
)


@njit(cache=True, nogil=True)
def _replay(
    recs, fl, mm_legacy, mm_kquant, mm_float, rms_norm, rope, attention, att_q8, att_q8_k, att_q8_v,
    silu_mul, gelu_mul, add, add_row, scale, softcap, columns,
):  # fmt: skip
    for i in range(recs.shape[0]):
        r, f = recs[i], fl[i]
        code = r[0]
        if code == MATMUL:
            n, k, m = r[7], r[8], r[4]
            w = _readonly(_array(r[3], (m, r[5]), np.uint8))
            x, out = _array(r[6], (n, k), F32), _array(r[9], (n, m), F32)
            if r[1] == LEGACY:
                mm_legacy(r[2], w, x, out, r[10])
            elif r[1] == KQUANT:
                mm_kquant(r[2], w, x, out, r[10])
            else:
                mm_float(r[2], w, x, out, r[10])
        elif code == RMS_NORM:
            n, d = r[2], r[3]
            weight = _array(r[4], (d if r[4] else 1,), F32)
            rms_norm(_array(r[1], (n, d), F32), weight, r[4] != 0, f[0], _array(r[5], (n, d), F32))
        elif code == ROPE:
            n, h, dh, n_pos, half = r[2], r[3], r[4], r[7], r[8]
            rope(
                _array(r[1], (n, h, dh), F32),
                _array(r[5], (n_pos, half), F32),
                _array(r[6], (n_pos, half), F32),
                _array(r[9], (n,), np.int64),
                r[10],
                r[11] != 0,
                _array(r[12], (n, h, dh), F32),
            )
        elif code == ATTENTION:
            n, n_head, n_kv, dh, slots, window = r[7], r[8], r[9], r[10], r[11], r[20]
            q = _array(r[1], (n, n_head, dh), F32)
            k, v = _array(r[3], (n, n_kv, dh), F32), _array(r[4], (n, n_kv, dh), F32)
            table = _array(r[13], (r[14], r[15]), np.int32)
            seq_ids, positions = _array(r[17], (n,), np.int64), _array(r[18], (n,), np.int64)
            out = _array(r[19], (n, n_head, dh), F32)
            kinds = r[2]
            k_rows, v_rows = (slots, n_kv, r[12]), (slots, n_kv, r[22])
            if kinds == K_Q8 | V_Q8:
                kc, vc = _array(r[5], k_rows, np.uint8), _array(r[6], v_rows, np.uint8)
                att_q8(q, k, v, kc, vc, True, True, table, r[16], seq_ids, positions, f[0], window, f[1], out)
            elif kinds == K_Q8:
                kc, vc16 = _array(r[5], k_rows, np.uint8), _array(r[6], v_rows, np.uint16)
                att_q8_k(
                    q, k, v, kc, vc16, True, False, table, r[16], seq_ids, positions, f[0], window, f[1], out
                )
            elif kinds == V_Q8:
                kc16, vc = _array(r[5], k_rows, np.uint16), _array(r[6], v_rows, np.uint8)
                att_q8_v(
                    q, k, v, kc16, vc, False, True, table, r[16], seq_ids, positions, f[0], window, f[1], out
                )
            else:
                # the (token, kv head) pairs on Numba's threads where the work pays: numba_cpu's rule
                keys = n * window
                if window == 0:
                    keys = n
                    for j in range(n):
                        keys += positions[j]
                parallel = r[21] != 0 and keys * n_head * dh >= r[21]
                kc16, vc16 = _array(r[5], k_rows, np.uint16), _array(r[6], v_rows, np.uint16)
                sc, cap = f[0], f[1]
                attention(
                    q, k, v, kc16, vc16, table, r[16], seq_ids, positions, sc, window, cap, out, parallel
                )
        elif code == SILU_MUL or code == GELU_MUL or code == ADD:
            size = r[4]
            a, b, out = _array(r[1], (size,), F32), _array(r[2], (size,), F32), _array(r[3], (size,), F32)
            if code == SILU_MUL:
                silu_mul(a, b, out)
            elif code == GELU_MUL:
                gelu_mul(a, b, _array(r[5], (65536,), F32), out)
            else:
                add(a, b, out)
        elif code == ADD_ROW:
            n, k = r[4], r[5]
            add_row(_array(r[1], (n, k), F32), _array(r[2], (k,), F32), _array(r[3], (n, k), F32))
        elif code == SCALE or code == SOFTCAP:
            size = r[4]
            x, out = _array(r[1], (size,), F32), _array(r[3], (size,), F32)
            if code == SCALE:
                scale(x, f[0], out)
            else:
                softcap(x, f[0], out)
        elif code == COLUMNS:
            n, width, start, stop = r[4], r[5], r[6], r[7]
            columns(_array(r[1], (n, width), F32), start, _array(r[3], (n, stop - start), F32))


@njit(cache=True, nogil=True)
def replay(recs, fl):
    """Run the records in order (see the module docstring; numba_cpu.NumbaPlan writes them). The kernels
    are named as module attributes: Numba passes those as bare function pointers, where a plain global
    would also embed its Python object's address, which Numba cannot cache."""
    _replay(
        recs, fl, kernels.matmul_legacy, kernels.matmul_kquant, kernels.matmul_float, ops.rms_norm,
        ops.rope, ops.attention, ops.attention_q8, ops.attention_q8, ops.attention_q8, ops.silu_mul,
        ops.gelu_mul, ops.add, ops.add_row, ops.scale, ops.softcap, ops.columns,
    )  # fmt: skip


def compile_replay() -> None:
    """Compile (or load from Numba's cache) every kernel for the signature replay calls it with, then
    replay. The caller holds Numba's compiler lock with the SLP vectorizer on (compile_family), and has
    compiled every matmul family first: replay must find their splitters already closed to new
    compilations, or it would compile slower copies of them."""
    for fn, sig in KERNELS:
        fn.compile(sig)
    _replay.compile(REPLAY)
    _replay.disable_compile()
    i64, f64 = np.zeros((0, WIDTH), np.int64), np.zeros((0, F_WIDTH), np.float64)
    replay(i64, f64)


@njit(cache=True, nogil=True)
def step_check(tokens, n_vocab, table, block_size, n_ctx, seq_ids, positions):
    """0 if every token id is in the vocabulary and every (sequence, position) is in the context with
    its blocks 0 .. position mapped (what attention reads); 1: a bad token id, 2: a bad position (the
    caller asks the cache which and why). As the native runtime's ed_step_check."""
    for i in range(tokens.size):
        if tokens[i] < 0 or tokens[i] >= n_vocab:
            return 1
    n_seqs, max_blocks = table.shape
    for i in range(positions.size):
        s, p = seq_ids[i], positions[i]
        if s < 0 or s >= n_seqs or p < 0 or p >= n_ctx or p // block_size >= max_blocks:
            return 2
        for b in range(p // block_size + 1):
            if table[s, b] < 0:
                return 2
    return 0
