"""The scale searches behind ggml's quantizers, as Numba kernels that return ggml's floats bit for bit.

Ports of the static helpers in ggml-org/llama.cpp ggml/src/ggml-quants.c (nearest_int, make_qx_quants,
make_q3_quants, make_qkx2_quants, make_qkx3_quants, make_qp_quants, best_index_int8): float32 where the C
has float, the C's operation order, sums accumulated one element at a time in the C's loop order, no
fastmath (ggml-base is built for baseline x86-64, so no FMA contraction either). Arrays come whole with
an offset (`xo`, `lo`, `wo`); each routine takes its views once, so the hot loops index from 0 and Numba's
negative-index wraparound folds away.
"""

from __future__ import annotations

import numpy as np
from numba import njit

F32 = np.float32
GROUP_MAX_EPS = F32(1e-15)  # ggml-quants.c GROUP_MAX_EPS
_MAGIC = F32(12582912.0)  # 1.5 * 2**23: adding it leaves round-half-even(x) in the low mantissa bits
_TENTH = F32(0.1)

# error_model="numpy": a float division by zero gives inf/nan as in C instead of raising
kernel = njit(cache=True, nogil=True, error_model="numpy")
inline = njit(cache=True, nogil=True, error_model="numpy", inline="always")  # inlined in Numba IR


@kernel
def nearest_int(fval):
    """ggml's nearest_int: round half to even via the 12582912 trick (garbage past |x| > 4194303, as in C)."""
    val = F32(F32(fval) + _MAGIC)
    return np.int32((val.view(np.int32) & np.int32(0x007FFFFF)) - np.int32(0x00400000))


@inline
def clamp(v, lo, hi):
    """MAX(lo, MIN(hi, v)) in int32, the C's int (and int32 lanes vectorize where int64 ones don't)."""
    return max(np.int32(lo), min(np.int32(hi), np.int32(v)))


@inline
def _qx_terms(n, nmax, iscale, xs, ws, wx, a, b):
    """One pass of make_qx_quants' loop without its sums: a[i] = w*x[i]*l, b[i] = w*l*l. Free of the
    serial float sums, this loop vectorizes (as GCC vectorizes the C's); the sums follow in _sums."""
    lo, hi = np.int32(-nmax), np.int32(nmax - 1)  # int32 throughout: AVX2 converts int32, not int64
    for i in range(n):
        fl = F32(max(lo, min(hi, nearest_int(iscale * xs[i]))))
        a[i] = wx[i] * fl
        b[i] = ws[i] * fl * fl


@inline
def _signed_absmax(n, xs):
    """The first x of largest |x| (0 if all are 0), as the C's `if (ax > amax) { amax = ax; max = x[i]; }`."""
    mx = F32(0)
    amax = F32(0)
    for i in range(n):
        ax = abs(xs[i])
        if ax > amax:
            amax = ax
            mx = xs[i]
    return mx


@inline
def _sums(n, a, b):
    """(sum a, sum b), each accumulated in index order as the C's loop does."""
    sa = F32(0)
    sb = F32(0)
    for i in range(n):
        sa += a[i]
        sb += b[i]
    return sa, sb


@kernel
def make_qx_quants(n, nmax, x, xo, L, lo, w, wo, tmp):
    """make_qx_quants with rmse_type 1 and weights w[wo:wo+n] (x*x where the C passes qw = NULL).

    Signed symmetric quants: L[lo+i] = l + nmax, l in [-nmax, nmax-1]; returns the scale. tmp is float32
    scratch of at least 3n."""
    xs, ws, Ls = x[xo : xo + n], w[wo : wo + n], L[lo : lo + n]  # views: indices from 0 need no wraparound
    wx, a, b = tmp[:n], tmp[n : 2 * n], tmp[2 * n : 3 * n]
    mx = _signed_absmax(n, xs)
    if abs(mx) < GROUP_MAX_EPS:
        for i in range(n):
            Ls[i] = 0
        return F32(0)
    for i in range(n):
        wx[i] = ws[i] * xs[i]  # the C's w*x[i]*l is (w*x[i])*l
    fnmax = F32(nmax)
    iscale = F32(-fnmax / mx)
    for i in range(n):
        Ls[i] = clamp(nearest_int(iscale * xs[i]), -nmax, nmax - 1) + nmax
    _qx_terms(n, nmax, iscale, xs, ws, wx, a, b)
    sumlx, suml2 = _sums(n, a, b)
    scale = sumlx / suml2 if suml2 != 0 else F32(0)
    best = scale * sumlx
    for step in range(-9, 10):
        if step == 0:
            continue
        iscale = -(fnmax + _TENTH * F32(step)) / mx
        _qx_terms(n, nmax, iscale, xs, ws, wx, a, b)
        sumlx, suml2 = _sums(n, a, b)
        if suml2 > 0 and sumlx * sumlx > best * suml2:
            for i in range(n):
                Ls[i] = nmax + clamp(nearest_int(iscale * xs[i]), -nmax, nmax - 1)
            scale = sumlx / suml2
            best = scale * sumlx
    return scale


@kernel
def make_q3_quants(n, nmax, x, xo, L, lo):
    """make_q3_quants with do_rmse = true (the only way quantize_row_q3_K_ref calls it); L int8."""
    xs, Ls = x[xo : xo + n], L[lo : lo + n]
    mx = _signed_absmax(n, xs)
    if abs(mx) < GROUP_MAX_EPS:
        for i in range(n):
            Ls[i] = 0
        return F32(0)
    iscale = F32(-F32(nmax) / mx)
    sumlx = F32(0)
    suml2 = F32(0)
    for i in range(n):
        l = clamp(nearest_int(iscale * xs[i]), -nmax, nmax - 1)
        Ls[i] = l
        xi = xs[i]
        w = xi * xi
        fl = F32(l)
        sumlx += w * xi * fl
        suml2 += w * fl * fl
    for _ in range(5):
        n_changed = 0
        for i in range(n):
            xi = xs[i]
            w = xi * xi
            fli = F32(Ls[i])
            slx = sumlx - w * xi * fli
            if slx > 0:
                sl2 = suml2 - w * fli * fli
                new_l = clamp(nearest_int(xi * sl2 / slx), -nmax, nmax - 1)
                if new_l != Ls[i]:
                    fnew = F32(new_l)
                    slx += w * xi * fnew
                    sl2 += w * fnew * fnew
                    if sl2 > 0 and slx * slx * suml2 > sumlx * sumlx * sl2:
                        Ls[i] = new_l
                        sumlx = slx
                        suml2 = sl2
                        n_changed += 1
        if n_changed == 0:
            break
    for i in range(n):
        Ls[i] += nmax
    return sumlx / suml2 if suml2 > 0 else F32(0)


@inline
def _qkx_terms(n, nmax, iscale, xm, xs, ws, Laux, a, b, c):
    """One pass of make_qkx2/3_quants' search loop without its sums: Laux[i] = l, a = w*l, b = w*l*l,
    c = w*l*x[i] (xm[i] = x[i] - min); vectorizes, the sums follow in index order."""
    hi = np.int32(nmax)
    for i in range(n):
        l = max(np.int32(0), min(hi, nearest_int(iscale * xm[i])))
        Laux[i] = l
        fl = F32(l)
        wl = ws[i] * fl
        a[i] = wl
        b[i] = wl * fl
        c[i] = wl * xs[i]


@inline
def _error(n, scale, mn, L, xs, ws, use_mad, e):
    """sum of w * |scale*L + min - x| (use_mad) or w * (scale*L + min - x)^2, summed in index order."""
    for i in range(n):
        diff = scale * F32(L[i]) + mn - xs[i]
        e[i] = ws[i] * (abs(diff) if use_mad else diff * diff)
    total = F32(0)
    for i in range(n):
        total += e[i]
    return total


@kernel
def make_qkx_quants(n, nmax, x, xo, w, wo, L, lo, Laux, rmin, rdelta, nstep, use_mad, strict, tmp):
    """make_qkx2_quants (strict=False) or make_qkx3_quants (strict=True, weights given), which differ only
    in the degenerate test (`max == min` vs `max <= min`). Asymmetric quants L in [0, nmax] (uint8) with a
    min; returns (scale, the_min), the_min = -min >= 0. tmp is float32 scratch of at least 4n."""
    xs, ws, Ls = x[xo : xo + n], w[wo : wo + n], L[lo : lo + n]
    xm, a, b, c = tmp[:n], tmp[n : 2 * n], tmp[2 * n : 3 * n], tmp[3 * n : 4 * n]
    mn = xs[0]
    mx = xs[0]
    sum_w = ws[0]
    sum_x = sum_w * xs[0]
    for i in range(1, n):
        xi = xs[i]
        if xi < mn:
            mn = xi
        if xi > mx:
            mx = xi
        wi = ws[i]
        sum_w += wi
        sum_x += wi * xi
    if mn > 0:
        mn = F32(0)
    if (mx <= mn) if strict else (mx == mn):
        for i in range(n):
            Ls[i] = 0
        return F32(0), -mn
    fnmax = F32(nmax)
    iscale = F32(fnmax / (mx - mn))
    scale = F32(1) / iscale
    for i in range(n):
        Ls[i] = clamp(nearest_int(iscale * (xs[i] - mn)), 0, nmax)
    best_error = _error(n, scale, mn, Ls, xs, ws, use_mad, a)
    if nstep < 1:
        return scale, -mn
    for i in range(n):
        xm[i] = xs[i] - mn  # the C's x[i] - min, recomputed below whenever min changes
    for step in range(nstep + 1):
        iscale = (rmin + rdelta * F32(step) + fnmax) / (mx - mn)
        _qkx_terms(n, nmax, iscale, xm, xs, ws, Laux, a, b, c)
        sum_l = F32(0)
        sum_l2 = F32(0)
        sum_xl = F32(0)
        for i in range(n):
            sum_l += a[i]
            sum_l2 += b[i]
            sum_xl += c[i]
        D = sum_w * sum_l2 - sum_l * sum_l
        if D > 0:
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
            if this_min > 0:
                this_min = F32(0)
                this_scale = sum_xl / sum_l2
            cur_error = _error(n, this_scale, this_min, Laux, xs, ws, use_mad, a)
            if cur_error < best_error:
                for i in range(n):
                    Ls[i] = Laux[i]
                best_error = cur_error
                scale = this_scale
                mn = this_min
                for i in range(n):
                    xm[i] = xs[i] - mn
    return scale, -mn


@kernel
def make_qp_quants(n, nmax, x, L, qw):
    """make_qp_quants: non-negative x[0:n] (sub-block scales or mins) to L[0:n] (uint8, as in the C, so
    out-of-range values wrap the same way) in [0, nmax] with weights qw[0:n]; returns the scale."""
    mx = F32(0)
    for i in range(n):
        mx = mx if mx > x[i] else x[i]
    if mx < GROUP_MAX_EPS:
        for i in range(n):
            L[i] = 0
        return F32(0)
    fnmax = F32(nmax)
    iscale = F32(fnmax / mx)
    for i in range(n):
        L[i] = nearest_int(iscale * x[i]) & 0xFF
    scale = F32(1) / iscale
    best_mse = F32(0)
    for i in range(n):
        diff = x[i] - scale * F32(L[i])
        best_mse += qw[i] * diff * diff
    for step in range(-4, 5):
        if step == 0:
            continue
        iscale_is = (_TENTH * F32(step) + fnmax) / mx
        scale_is = F32(1) / iscale_is
        mse = F32(0)
        for i in range(n):
            l = min(nmax, nearest_int(iscale_is * x[i]))
            diff = x[i] - scale_is * F32(l)
            mse += qw[i] * diff * diff
        if mse < best_mse:
            best_mse = mse
            iscale = iscale_is
    sumlx = F32(0)
    suml2 = F32(0)
    for i in range(n):
        l = min(nmax, nearest_int(iscale * x[i]))
        L[i] = l & 0xFF
        fl = F32(l)  # the C sums with the int l, not the uint8 it stored
        sumlx += qw[i] * x[i] * fl
        suml2 += qw[i] * fl * fl
    for _ in range(5):
        n_changed = 0
        for i in range(n):
            w = qw[i]
            fli = F32(L[i])
            slx = sumlx - w * x[i] * fli
            sl2 = suml2 - w * fli * fli
            if slx > 0 and sl2 > 0:
                new_l = min(nmax, nearest_int(x[i] * sl2 / slx))
                if new_l != L[i]:
                    fnew = F32(new_l)
                    slx += w * x[i] * fnew
                    sl2 += w * fnew * fnew
                    if slx * slx * suml2 > sumlx * sumlx * sl2:
                        L[i] = new_l & 0xFF
                        sumlx = slx
                        suml2 = sl2
                        n_changed += 1
        if n_changed == 0:
            break
    return sumlx / suml2 if suml2 > 0 else F32(0)


@kernel
def best_index_int8(n, val, x):
    """best_index_int8: index of the entry of the sorted table val[0:n] nearest to x (ties go up)."""
    if x <= F32(val[0]):
        return 0
    if x >= F32(val[n - 1]):
        return n - 1
    ml = 0
    mu = n - 1
    while mu - ml > 1:
        mav = (ml + mu) // 2
        if x < F32(val[mav]):
            mu = mav
        else:
            ml = mav
    return mu - 1 if x - F32(val[mu - 1]) < F32(val[mu]) - x else mu
