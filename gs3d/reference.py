"""Pure-numpy float64 reference implementation of 3-D grid sampling.

This module is the test oracle for gs3d.  It is written only from SPEC.md
(``torch.nn.functional.grid_sample`` on 5-D tensors and
``torch.ops.aten.grid_sampler_3d_backward``, plus gs3d's definitions for
non-finite and extreme coordinates).  Correctness and clarity come first; it
is vectorised over points with numpy (the only Python loops run over the 8
trilinear corners and, for the grid gradient, over channels).

Every computation is done in float64, whatever the dtype of the arguments.
The floating-point operations are ordered like PyTorch's CPU kernel so that,
for finite float64 data, results agree with it to the last bits in almost
every case.
"""

import numpy as np

__all__ = ["grid_sample_3d", "grid_sample_3d_backward"]

_MODES = {"bilinear": 0, "nearest": 1}
_PADDINGS = {"zeros": 0, "border": 1, "reflection": 2}
_LAYOUTS = ("NCDHW", "NDHWC")

_BILINEAR, _NEAREST = 0, 1
_ZEROS, _BORDER, _REFLECTION = 0, 1, 2


# --------------------------------------------------------------------------
# argument handling
# --------------------------------------------------------------------------

def _code(value, table, what):
    """Map a mode/padding name or integer code to its integer code."""
    if isinstance(value, str):
        if value in table:
            return table[value]
    elif isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        if int(value) in table.values():
            return int(value)
    raise ValueError(
        f"{what}: expected one of {sorted(table)} or codes "
        f"{sorted(table.values())}, got {value!r}")


def _f64(a, what):
    if a is None:
        raise ValueError(f"{what}: a tensor is required, got None")
    a = np.asarray(a).astype(np.float64)
    if a.ndim != 5:
        raise ValueError(f"{what}: expected a 5-D array, got shape {a.shape}")
    return a


def _check_layout(layout):
    if layout not in _LAYOUTS:
        raise ValueError(f"layout: expected one of {_LAYOUTS}, got {layout!r}")


def _to_ncdhw(a, layout):
    """(N,D,H,W,C) -> (N,C,D,H,W) for NDHWC; unchanged for NCDHW."""
    return a if layout == "NCDHW" else np.moveaxis(a, 4, 1)


def _from_ncdhw(a, layout):
    """(N,C,D,H,W) -> the requested layout, as a contiguous float64 array."""
    if layout == "NDHWC":
        a = np.moveaxis(a, 1, 4)
    return np.ascontiguousarray(a, dtype=np.float64)


def _check_input_grid(x, grid):
    """x is NCDHW float64, grid (N,Do,Ho,Wo,3) float64."""
    if grid.shape[4] != 3:
        raise ValueError(f"grid: last axis must be 3, got shape {grid.shape}")
    if grid.shape[0] != x.shape[0]:
        raise ValueError(f"grid: batch size {grid.shape[0]} differs from "
                         f"input's {x.shape[0]}")
    if min(x.shape[2:]) == 0:
        raise ValueError(f"input: spatial sizes (D, H, W) must be positive, "
                         f"got {x.shape[2:]}")


# --------------------------------------------------------------------------
# coordinates
# --------------------------------------------------------------------------

def _clip(u, size):
    """Border clipping of u to [0, size-1] and its derivative factor.

    The factor is 0 where u <= 0 or u >= size-1 (the borders count as
    clipped) and 1 strictly inside.
    """
    factor = np.where((u <= 0) | (u >= size - 1), 0.0, 1.0)
    return np.clip(u, 0.0, float(size - 1)), factor


def _source_index(g, size, padding, align_corners):
    """Unnormalise and pad one axis.

    g: normalised coordinates (float64 array).  Returns (u, mult, dead):
    u the padded source coordinate, mult = du/dg times the padding
    factors (the grid-gradient multiplier), dead a bool mask of points that
    sample nothing (NaN coordinate; +-inf or overflow with zeros or
    reflection padding).  u and mult are set to 0 where dead.
    """
    with np.errstate(invalid="ignore", over="ignore"):
        if align_corners:
            u = (g + 1) / 2 * (size - 1)
            dudg = (size - 1) / 2
        else:
            u = ((g + 1) * size - 1) / 2
            dudg = size / 2
        mult = np.full(g.shape, float(dudg))
        dead = np.isnan(g)

        if padding == _ZEROS:
            # +-inf (or a finite g whose u overflows) lies outside the input.
            dead = dead | ~np.isfinite(u)
        elif padding == _BORDER:
            # +-inf clamps to the edge.  Set it explicitly: with S = 1 and
            # align_corners=True u is inf * 0 = nan.
            pos = np.isposinf(g) | np.isposinf(u)
            neg = np.isneginf(g) | np.isneginf(u)
            u = np.where(pos, float(size - 1), np.where(neg, 0.0, u))
            u, f = _clip(u, size)
            mult = mult * f
        else:  # reflection
            # The reflected position of an infinite coordinate is undefined.
            dead = dead | np.isinf(g) | ~np.isfinite(u)
            if align_corners:
                lo, hi = 0.0, float(size - 1)
            else:
                lo, hi = -0.5, size - 0.5
            span = hi - lo
            if span == 0:
                u = np.zeros_like(u)
                mult = np.zeros_like(mult)
            else:
                d = u - lo
                t = np.abs(d)
                r = np.fmod(t, span)              # exact
                # k = floor(t / span) is odd iff (t mod 2*span) >= span.  This
                # is exact for any finite t (t / span rounded in float is not:
                # for t = 1e30 it always looks even).
                odd = np.fmod(t, 2 * span) >= span
                u = np.where(odd, lo + (span - r), lo + r)
                sign = np.where(d >= 0, 1.0, -1.0)
                sign = np.where(odd, -sign, sign)
                mult = mult * sign
                u, f = _clip(u, size)
                mult = mult * f

        dead = dead | np.isnan(u)
        u = np.where(dead, 0.0, u)
        mult = np.where(dead, 0.0, mult)
    return u, mult, dead


def _coordinates(grid, D, H, W, padding, align_corners):
    """Returns (ix, iy, iz), (mx, my, mz), dead; each of shape (N, P)."""
    N = grid.shape[0]
    P = grid.shape[1] * grid.shape[2] * grid.shape[3]
    g = grid.reshape(N, P, 3)
    ix, mx, dx = _source_index(g[..., 0], W, padding, align_corners)
    iy, my, dy = _source_index(g[..., 1], H, padding, align_corners)
    iz, mz, dz = _source_index(g[..., 2], D, padding, align_corners)
    return (ix, iy, iz), (mx, my, mz), dx | dy | dz


def _corners(ix, iy, iz, dead, D, H, W, mode):
    """The corners a point reads, as a list of dicts (fixed SPEC order).

    Each corner has: lin (N,P) intp flat index into D*H*W (0 where invalid),
    valid (N,P) bool (in bounds and the point not dead), w (N,P) weight and,
    for bilinear, the per-axis factors f=(fx, fy, fz) and signs s=(sx, sy, sz).
    Nearest has a single corner with weight 1.
    """
    def inb(c, size):
        # float comparison: never cast an out-of-range float to int
        return (c >= 0) & (c <= size - 1)

    def flat(zc, yc, xc, valid):
        zi = np.where(valid, zc, 0.0).astype(np.intp)
        yi = np.where(valid, yc, 0.0).astype(np.intp)
        xi = np.where(valid, xc, 0.0).astype(np.intp)
        return (zi * H + yi) * W + xi

    if mode == _NEAREST:
        xn, yn, zn = np.rint(ix), np.rint(iy), np.rint(iz)   # half to even
        valid = ~dead & inb(xn, W) & inb(yn, H) & inb(zn, D)
        return [dict(lin=flat(zn, yn, xn, valid), valid=valid,
                     w=np.ones(ix.shape))]

    x0, y0, z0 = np.floor(ix), np.floor(iy), np.floor(iz)
    x1, y1, z1 = x0 + 1, y0 + 1, z0 + 1
    fxs = (x1 - ix, ix - x0)        # west, east
    fys = (y1 - iy, iy - y0)        # north, south
    fzs = (z1 - iz, iz - z0)        # top, bottom
    xs, ys, zs = (x0, x1), (y0, y1), (z0, z1)
    corners = []
    # tnw, tne, tsw, tse, bnw, bne, bsw, bse
    for kz in (0, 1):
        for ky in (0, 1):
            for kx in (0, 1):
                valid = (~dead & inb(xs[kx], W) & inb(ys[ky], H)
                         & inb(zs[kz], D))
                fx, fy, fz = fxs[kx], fys[ky], fzs[kz]
                corners.append(dict(
                    lin=flat(zs[kz], ys[ky], xs[kx], valid), valid=valid,
                    w=fx * fy * fz, f=(fx, fy, fz),
                    s=(1 if kx else -1, 1 if ky else -1, 1 if kz else -1)))
    return corners


def _gather(xf, lin):
    """xf (N,C,L), lin (N,P) -> (N,C,P)."""
    N, C, _ = xf.shape
    idx = np.broadcast_to(lin[:, None, :], (N, C, lin.shape[1]))
    return np.take_along_axis(xf, idx, axis=2)


# --------------------------------------------------------------------------
# public functions
# --------------------------------------------------------------------------

def grid_sample_3d(input, grid, *, mode="bilinear", padding_mode="zeros",
                   align_corners=False, layout="NCDHW"):
    """Forward 3-D grid sampling; returns float64 in the input's layout.

    input: (N,C,D,H,W) or (N,D,H,W,C); grid: (N,Do,Ho,Wo,3).
    Result: (N,C,Do,Ho,Wo) or (N,Do,Ho,Wo,C).
    """
    mode = _code(mode, _MODES, "mode")
    padding = _code(padding_mode, _PADDINGS, "padding_mode")
    _check_layout(layout)
    x = _to_ncdhw(_f64(input, "input"), layout)
    grid = _f64(grid, "grid")
    _check_input_grid(x, grid)

    N, C, D, H, W = x.shape
    Do, Ho, Wo = grid.shape[1:4]
    P = Do * Ho * Wo
    (ix, iy, iz), _, dead = _coordinates(grid, D, H, W, padding,
                                         bool(align_corners))
    xf = x.reshape(N, C, D * H * W)
    out = np.zeros((N, C, P))
    with np.errstate(invalid="ignore", over="ignore"):
        for k in _corners(ix, iy, iz, dead, D, H, W, mode):
            v = _gather(xf, k["lin"])
            if mode == _NEAREST:
                contrib = v
            else:
                contrib = v * k["w"][:, None, :]
            # out-of-bounds corners add exactly nothing
            out = np.where(k["valid"][:, None, :], out + contrib, out)
    return _from_ncdhw(out.reshape(N, C, Do, Ho, Wo), layout)


def grid_sample_3d_backward(grad_output, input, grid, *, mode="bilinear",
                            padding_mode="zeros", align_corners=False,
                            output_mask=(True, True), layout="NCDHW"):
    """Backward of grid_sample_3d.

    Returns (input_grad, grid_grad), float64; input_grad in the input's
    layout, grid_grad shaped like grid.  A gradient not asked for in
    output_mask is returned as None.
    """
    mode = _code(mode, _MODES, "mode")
    padding = _code(padding_mode, _PADDINGS, "padding_mode")
    _check_layout(layout)
    if len(output_mask) != 2:
        raise ValueError(f"output_mask: expected length 2, got {output_mask!r}")
    want_dx, want_dgrid = bool(output_mask[0]), bool(output_mask[1])
    go = _to_ncdhw(_f64(grad_output, "grad_output"), layout)
    x = _to_ncdhw(_f64(input, "input"), layout)
    grid = _f64(grid, "grid")
    _check_input_grid(x, grid)
    if go.shape[0] != x.shape[0] or go.shape[1] != x.shape[1]:
        raise ValueError(f"grad_output: N, C {go.shape[:2]} differ from "
                         f"input's {x.shape[:2]}")
    if go.shape[2:] != grid.shape[1:4]:
        raise ValueError(f"grad_output: spatial shape {go.shape[2:]} differs "
                         f"from grid's {grid.shape[1:4]}")

    N, C, D, H, W = x.shape
    Do, Ho, Wo = grid.shape[1:4]
    P = Do * Ho * Wo
    L = D * H * W
    if not (want_dx or want_dgrid):
        return None, None

    (ix, iy, iz), mults, dead = _coordinates(grid, D, H, W, padding,
                                             bool(align_corners))
    corners = _corners(ix, iy, iz, dead, D, H, W, mode)
    gof = go.reshape(N, C, P)
    xf = x.reshape(N, C, L)
    dx = dgrid = None

    with np.errstate(invalid="ignore", over="ignore"):
        if want_dx:
            # Scatter w_k * grad into every in-bounds corner.  Updates are
            # ordered point-major, corner-minor (like a sequential kernel).
            K = len(corners)
            lin = np.stack([k["lin"] for k in corners], axis=-1)    # (N,P,K)
            valid = np.stack([k["valid"] for k in corners], axis=-1)
            w = np.stack([k["w"] for k in corners], axis=-1)
            n_idx = np.broadcast_to(np.arange(N)[:, None, None], (N, P, K))
            p_idx = np.broadcast_to(np.arange(P)[None, :, None], (N, P, K))
            nn, pp, ll, ww = (a[valid] for a in (n_idx, p_idx, lin, w))
            g_sel = gof[nn, :, pp]                                  # (M, C)
            contrib = g_sel if mode == _NEAREST else ww[:, None] * g_sel
            dxf = np.zeros((N, C, L))
            np.add.at(dxf, (nn[:, None], np.arange(C)[None, :], ll[:, None]),
                      contrib)
            dx = _from_ncdhw(dxf.reshape(N, C, D, H, W), layout)

        if want_dgrid:
            gsum = [np.zeros((N, P)) for _ in range(3)]
            if mode == _BILINEAR:
                vals = [_gather(xf, k["lin"]) for k in corners]
                for c in range(C):
                    goc = gof[:, c, :]
                    for k, v in zip(corners, vals):
                        vc = v[:, c, :]
                        fx, fy, fz = k["f"]
                        terms = (vc * fy * fz * goc,    # d/dix
                                 vc * fx * fz * goc,    # d/diy
                                 vc * fx * fy * goc)    # d/diz
                        for a in range(3):
                            new = (gsum[a] + terms[a] if k["s"][a] > 0
                                   else gsum[a] - terms[a])
                            gsum[a] = np.where(k["valid"], new, gsum[a])
            # nearest: piecewise constant, the gradient is exactly 0
            dg = np.stack([mults[a] * gsum[a] for a in range(3)], axis=-1)
            dg = np.where(dead[..., None], 0.0, dg)
            dgrid = np.ascontiguousarray(dg.reshape(N, Do, Ho, Wo, 3))
            if mode == _NEAREST:
                dgrid = np.zeros((N, Do, Ho, Wo, 3))

    return dx, dgrid
