"""Tests of the float64 numpy reference (gs3d/reference.py) against SPEC.md,
PyTorch and finite differences."""

import itertools

import numpy as np
import pytest

from gs3d import reference as ref

MODES = ("bilinear", "nearest")
PADDINGS = ("zeros", "border", "reflection")
LAYOUTS = ("NCDHW", "NDHWC")


def to_layout(a, layout):
    return a if layout == "NCDHW" else np.ascontiguousarray(np.moveaxis(a, 1, 4))


def from_layout(a, layout):
    return a if layout == "NCDHW" else np.moveaxis(a, 4, 1)


def fwd(x, g, mode="bilinear", pad="zeros", ac=False, layout="NCDHW"):
    return ref.grid_sample_3d(x, g, mode=mode, padding_mode=pad,
                              align_corners=ac, layout=layout)


def bwd(go, x, g, mode="bilinear", pad="zeros", ac=False, layout="NCDHW",
        mask=(True, True)):
    return ref.grid_sample_3d_backward(go, x, g, mode=mode, padding_mode=pad,
                                       align_corners=ac, output_mask=mask,
                                       layout=layout)


# ---------------------------------------------------------------------------
# 1. the worked example
# ---------------------------------------------------------------------------

def test_worked_example():
    x = np.arange(1, 10, dtype=np.float64).reshape(1, 1, 1, 3, 3)
    g = np.array([-1, -1, 0, -1, 1, -1, -1, 0, 0, 0, 1, 0],
                 dtype=np.float64).reshape(1, 1, 2, 2, 3)
    go = np.ones((1, 1, 1, 2, 2))
    out = fwd(x, g)
    dx, dg = bwd(go, x, g)
    kw = dict(rtol=0, atol=1e-12)
    np.testing.assert_allclose(out.ravel(), [0.25, 0.875, 2.0, 4.0], **kw)
    np.testing.assert_allclose(
        dx.ravel(), [0.25, 0, 0, 0.5, 0, 0, 0.125, 0.5, 0], **kw)
    np.testing.assert_allclose(
        dg.ravel(), [0.75, 0.75, -0.125, 2.625, -2.625, 0.875, 6.0, 2.25,
                     -1.0, 0.75, -12.0, -2.0], **kw)
    assert out.shape == (1, 1, 1, 2, 2) and out.dtype == np.float64
    assert dx.shape == x.shape and dg.shape == g.shape
    # integer codes and float32 / float16 inputs give the same (float64) result
    out2 = ref.grid_sample_3d(x.astype(np.float32), g.astype(np.float16),
                              mode=0, padding_mode=0)
    assert out2.dtype == np.float64
    np.testing.assert_array_equal(out2, out)


def test_output_mask_and_empty():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 4, 5, 6))
    g = rng.uniform(-1.2, 1.2, (2, 3, 2, 4, 3))
    go = rng.standard_normal((2, 3, 3, 2, 4))
    dx, dg = bwd(go, x, g)
    dx1, dg1 = bwd(go, x, g, mask=(True, False))
    dx2, dg2 = bwd(go, x, g, mask=(False, True))
    assert dg1 is None and dx2 is None
    np.testing.assert_array_equal(dx1, dx)
    np.testing.assert_array_equal(dg2, dg)
    assert bwd(go, x, g, mask=(False, False)) == (None, None)

    for N, C, Do in ((0, 3, 2), (2, 0, 2), (2, 3, 0)):
        for layout, mode in itertools.product(LAYOUTS, MODES):
            xe = to_layout(np.ones((N, C, 4, 5, 6)), layout)
            ge = np.zeros((N, Do, 2, 4, 3))
            goe = to_layout(np.ones((N, C, Do, 2, 4)), layout)
            out = fwd(xe, ge, mode=mode, layout=layout)
            assert out.shape == to_layout(np.empty((N, C, Do, 2, 4)), layout).shape
            dxe, dge = bwd(goe, xe, ge, mode=mode, layout=layout)
            assert dxe.shape == xe.shape and not dxe.any()
            assert dge.shape == ge.shape and not dge.any()

    with pytest.raises(ValueError):
        fwd(np.ones((1, 1, 0, 2, 2)), np.zeros((1, 1, 1, 1, 3)))
    with pytest.raises(ValueError):
        fwd(x, g, mode="bicubic")


# ---------------------------------------------------------------------------
# 2. against PyTorch
# ---------------------------------------------------------------------------

SHAPES = [  # (N, C, D, H, W, Do, Ho, Wo)
    (2, 3, 7, 5, 3, 5, 7, 4),
    (1, 2, 1, 4, 6, 3, 2, 5),   # D = 1 (span 0 for reflection + align_corners)
    (3, 1, 2, 1, 5, 2, 3, 3),   # H = 1
]


def _close_to_torch(ours, theirs, what):
    theirs = theirs.detach().numpy()
    assert ours.shape == theirs.shape, what
    scale = max(1.0, float(np.abs(theirs).max(initial=0.0)))
    err = float(np.abs(ours - theirs).max(initial=0.0))
    assert err <= 1e-12 * scale, f"{what}: max abs diff {err} (scale {scale})"


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("ac", [False, True])
@pytest.mark.parametrize("pad", PADDINGS)
@pytest.mark.parametrize("mode", MODES)
def test_against_torch(mode, pad, ac, layout):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    mcode, pcode = MODES.index(mode), PADDINGS.index(pad)
    rng = np.random.default_rng([MODES.index(mode), pcode, ac, LAYOUTS.index(layout)])
    seen = np.zeros(3)   # largest |out|, |dx|, |dgrid| over all cases
    for shape, lim in itertools.product(SHAPES, (1.5, 3.0)):
        N, C, D, H, W, Do, Ho, Wo = shape
        x = rng.standard_normal((N, C, D, H, W))
        g = rng.uniform(-lim, lim, (N, Do, Ho, Wo, 3))
        go = rng.standard_normal((N, C, Do, Ho, Wo))
        tx, tg, tgo = (torch.from_numpy(a) for a in (x, g, go))
        t_out = F.grid_sample(tx, tg, mode=mode, padding_mode=pad,
                              align_corners=ac)
        t_dx, t_dg = torch.ops.aten.grid_sampler_3d_backward(
            tgo, tx, tg, mcode, pcode, ac, [True, True])

        what = f"{mode}/{pad}/ac={ac}/{layout}/{shape}/lim={lim}"
        xl, gol = to_layout(x, layout), to_layout(go, layout)
        out = fwd(xl, g, mode, pad, ac, layout)
        dx, dg = bwd(gol, xl, g, mode, pad, ac, layout)
        assert out.shape == to_layout(np.empty((N, C, Do, Ho, Wo)), layout).shape
        assert dx.shape == xl.shape and dg.shape == g.shape
        _close_to_torch(from_layout(out, layout), t_out, "forward " + what)
        _close_to_torch(from_layout(dx, layout), t_dx, "dx " + what)
        _close_to_torch(dg, t_dg, "dgrid " + what)
        seen = np.maximum(seen, [np.abs(a).max() for a in (out, dx, dg)])
    # the comparison must be able to fail: the results are not all zero
    assert seen[0] > 0.1 and seen[1] > 0.1
    assert (seen[2] > 0.1) == (mode == "bilinear")


# ---------------------------------------------------------------------------
# 3. finite differences
# ---------------------------------------------------------------------------

def _padded_unclipped(g, S, pad, ac):
    """Independent formula for the padded (pre-clip) source coordinate."""
    u = (g + 1) / 2 * (S - 1) if ac else ((g + 1) * S - 1) / 2
    if pad == "reflection":
        lo, hi = (0.0, S - 1.0) if ac else (-0.5, S - 0.5)
        span = hi - lo
        if span == 0:
            return np.zeros_like(u)
        u = lo + span - np.abs(np.mod(u - lo, 2 * span) - span)  # triangle wave
    return u


def _safe_grid(rng, shape, sizes, pad, ac, margin=1e-3):
    """Random grid whose padded coordinates stay `margin` away from integers
    (voxel faces, clip limits and, for align_corners=True, reflection folds)."""
    g = rng.uniform(-1.4, 1.4, shape)
    for a, S in enumerate(sizes):       # sizes = (W, H, D)
        while True:
            u = _padded_unclipped(g[..., a], S, pad, ac)
            bad = np.abs(u - np.rint(u)) < margin
            if pad == "reflection" and not ac:   # folds at -0.5 and S-0.5
                bad |= np.abs(u + 0.5) < margin
                bad |= np.abs(u - (S - 0.5)) < margin
            if not bad.any():
                break
            g[..., a] = np.where(bad, rng.uniform(-1.4, 1.4, shape[:-1]), g[..., a])
    return g


@pytest.mark.parametrize("ac", [False, True])
@pytest.mark.parametrize("pad", PADDINGS)
def test_finite_differences(pad, ac):
    rng = np.random.default_rng([PADDINGS.index(pad), ac, 7])
    N, C, D, H, W, Do, Ho, Wo = 2, 2, 3, 4, 5, 2, 3, 2
    x = rng.uniform(-1, 1, (N, C, D, H, W))
    g = _safe_grid(rng, (N, Do, Ho, Wo, 3), (W, H, D), pad, ac)
    go = rng.uniform(-1, 1, (N, C, Do, Ho, Wo))
    dx, dg = bwd(go, x, g, pad=pad, ac=ac)
    base = fwd(x, g, pad=pad, ac=ac)

    # dx: the forward is linear in the input, so the Jacobian column of input
    # element j is the forward of the unit vector e_j.
    dx_fd = np.zeros_like(x)
    for j in range(x.size):
        e = np.zeros(x.size)
        e[j] = 1.0
        dx_fd.flat[j] = np.sum(go * fwd(e.reshape(x.shape), g, pad=pad, ac=ac))
    np.testing.assert_allclose(dx, dx_fd, rtol=1e-12, atol=1e-13)
    # and linearity of the forward itself
    y = rng.uniform(-1, 1, x.shape)
    np.testing.assert_allclose(fwd(x + 2 * y, g, pad=pad, ac=ac),
                               base + 2 * fwd(y, g, pad=pad, ac=ac),
                               rtol=0, atol=1e-13)

    # dgrid: central differences, point by point
    h = 1e-6
    dg_fd = np.zeros_like(g)
    for idx in itertools.product(*(range(s) for s in g.shape)):
        n, d, i, j, a = idx
        gp, gm = g.copy(), g.copy()
        gp[idx] += h
        gm[idx] -= h
        diff = fwd(x, gp, pad=pad, ac=ac) - fwd(x, gm, pad=pad, ac=ac)
        dg_fd[idx] = np.sum(go[n, :, d, i, j] * diff[n, :, d, i, j]) / (2 * h)
    np.testing.assert_allclose(dg, dg_fd, rtol=1e-6, atol=1e-8)
    assert np.abs(dg).max() > 0.1
    if pad == "border":   # some coordinates are clipped: their gradient is 0
        assert (dg == 0).any()


# ---------------------------------------------------------------------------
# 4. non-finite and extreme coordinates
# ---------------------------------------------------------------------------

def _problem(rng, layout="NCDHW"):
    N, C, D, H, W = 1, 2, 3, 4, 5
    x = rng.uniform(1, 2, (N, C, D, H, W))
    g = rng.uniform(-0.9, 0.9, (N, 2, 2, 2, 3))
    go = rng.uniform(1, 2, (N, C, 2, 2, 2))
    return x, g, go


@pytest.mark.parametrize("ac", [False, True])
@pytest.mark.parametrize("pad", PADDINGS)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("axis", [0, 1, 2])
def test_nan_point_samples_nothing(axis, mode, pad, ac):
    rng = np.random.default_rng([axis, MODES.index(mode), PADDINGS.index(pad), ac])
    x, g, go = _problem(rng)
    g[0, 1, 0, 1, axis] = np.nan
    out = fwd(x, g, mode, pad, ac)
    dx, dg = bwd(go, x, g, mode, pad, ac)
    assert np.all(out[0, :, 1, 0, 1] == 0)
    assert np.all(dg[0, 1, 0, 1] == 0)
    assert np.isfinite(out).all() and np.isfinite(dx).all() and np.isfinite(dg).all()
    # no dx contribution: same as zeroing the point's grad_output
    go0 = go.copy()
    go0[0, :, 1, 0, 1] = 0
    dx0, dg0 = bwd(go0, x, g, mode, pad, ac)
    np.testing.assert_array_equal(dx, dx0)
    # the other points are unaffected
    g2 = g.copy()
    g2[0, 1, 0, 1] = 0.1
    out2 = fwd(x, g2, mode, pad, ac)
    out2[0, :, 1, 0, 1] = 0
    np.testing.assert_array_equal(out, out2)
    # even NaN input / grad_output at the dead point's corners is not read
    go_nan = go.copy()
    go_nan[0, :, 1, 0, 1] = np.nan
    dxn, dgn = bwd(go_nan, x, g, mode, pad, ac)
    np.testing.assert_array_equal(dxn, dx)
    assert np.all(dgn[0, 1, 0, 1] == 0)


@pytest.mark.parametrize("ac", [False, True])
@pytest.mark.parametrize("mode", MODES)
def test_inf_border_reads_edge(mode, ac):
    rng = np.random.default_rng([MODES.index(mode), ac, 3])
    x, g, go = _problem(rng)
    D, H, W = x.shape[2:]
    g[0, 0, 0, 0] = [np.inf, -np.inf, np.inf]       # corner voxel (D-1, 0, W-1)
    g[0, 0, 0, 1] = [-np.inf, 1e30, -1e30]          # huge finite clamps too
    out = fwd(x, g, mode, "border", ac)
    dx, dg = bwd(go, x, g, mode, "border", ac)
    np.testing.assert_array_equal(out[0, :, 0, 0, 0], x[0, :, D - 1, 0, W - 1])
    np.testing.assert_array_equal(out[0, :, 0, 0, 1], x[0, :, 0, H - 1, 0])
    assert np.all(dg[0, 0, 0, :2] == 0)
    # dx receives there
    only = np.zeros_like(go)
    only[0, :, 0, 0, 0] = go[0, :, 0, 0, 0]
    dxo, _ = bwd(only, x, g, mode, "border", ac)
    expect = np.zeros_like(x)
    expect[0, :, D - 1, 0, W - 1] = go[0, :, 0, 0, 0]
    np.testing.assert_array_equal(dxo, expect)

    # one infinite axis: interpolates on the W-1 face, dgrid x-component 0
    g2 = g.copy()
    g2[0, 0, 0, 0] = [np.inf, 0.3, -0.2]
    g_ref = g2.copy()
    g_ref[0, 0, 0, 0, 0] = 1.0 if ac else 1.5     # u = W-1 exactly / clipped
    out2 = fwd(x, g2, mode, "border", ac)
    np.testing.assert_allclose(out2, fwd(x, g_ref, mode, "border", ac),
                               rtol=0, atol=1e-15)
    _, dg2 = bwd(go, x, g2, mode, "border", ac)
    assert dg2[0, 0, 0, 0, 0] == 0
    if mode == "bilinear":
        assert np.all(dg2[0, 0, 0, 0, 1:] != 0)


@pytest.mark.parametrize("ac", [False, True])
@pytest.mark.parametrize("pad", ["zeros", "reflection"])
@pytest.mark.parametrize("mode", MODES)
def test_inf_samples_nothing(mode, pad, ac):
    rng = np.random.default_rng([MODES.index(mode), ac, PADDINGS.index(pad)])
    x, g, go = _problem(rng)
    g[0, 0, 1, 0, 2] = np.inf
    g[0, 1, 1, 1, 0] = -np.inf
    out = fwd(x, g, mode, pad, ac)
    dx, dg = bwd(go, x, g, mode, pad, ac)
    assert np.all(out[0, :, 0, 1, 0] == 0) and np.all(out[0, :, 1, 1, 1] == 0)
    assert np.all(dg[0, 0, 1, 0] == 0) and np.all(dg[0, 1, 1, 1] == 0)
    go0 = go.copy()
    go0[0, :, 0, 1, 0] = 0
    go0[0, :, 1, 1, 1] = 0
    np.testing.assert_array_equal(dx, bwd(go0, x, g, mode, pad, ac)[0])


@pytest.mark.parametrize("ac", [False, True])
def test_huge_coordinates(ac):
    rng = np.random.default_rng([ac, 11])
    x, g, go = _problem(rng)
    D, H, W = x.shape[2:]
    g[0, 0, 0, 0] = [1e30, 0.1, 0.2]
    g[0, 0, 0, 1] = [0.1, -1e30, 0.2]
    g[0, 1, 1, 1] = [-1e300, 1e30, 3e29]
    for mode in MODES:
        out = fwd(x, g, mode, "zeros", ac)
        dx, dg = bwd(go, x, g, mode, "zeros", ac)
        assert np.all(out[0, :, 0, 0, :2] == 0) and np.all(out[0, :, 1, 1, 1] == 0)
        assert np.all(dg[0, 0, 0, :2] == 0) and np.all(dg[0, 1, 1, 1] == 0)
        assert np.isfinite(dx).all()
        for pad in ("border", "reflection"):
            out = fwd(x, g, mode, pad, ac)
            dx, dg = bwd(go, x, g, mode, pad, ac)
            for a in (out, dx, dg):
                assert np.isfinite(a).all()
            # every sampled value is a convex combination of input values
            assert out.min() >= x.min() - 1e-12 and out.max() <= x.max() + 1e-12
    # reflection of a huge coordinate is where exact arithmetic puts it:
    # compare with a grid whose coordinate is reduced exactly modulo the period
    for S, gv in ((W, 1e30), (W, -3e29), (W, 12345678.9)):
        u = ((gv + 1) / 2 * (S - 1)) if ac else (((gv + 1) * S - 1) / 2)
        u_ref = _padded_unclipped(np.array(gv), S, "reflection", ac)
        gg = np.zeros((1, 1, 1, 1, 3))
        gg[..., 0] = gv
        # the same point expressed through an equivalent small u
        g_small = gg.copy()
        g_small[..., 0] = ((2 * u_ref / (S - 1)) - 1) if ac else ((2 * u_ref + 1) / S - 1)
        a = fwd(x, gg, "bilinear", "reflection", ac)
        b = fwd(x, g_small, "bilinear", "reflection", ac)
        assert np.isfinite(u)
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-9)


def test_nonfinite_input_propagates():
    x = np.ones((1, 1, 3, 3, 3))
    x[0, 0, 0, 0, 0] = np.inf
    g = np.zeros((1, 1, 1, 2, 3))
    g[0, 0, 0, 0] = [-1, -1, -1]            # ac=True: u = 0, voxel 0 weight 1
    g[0, 0, 0, 1] = [0.4, 0.4, 0.4]         # u = 1.4: corners 1, 2 only
    out = fwd(x, g, ac=True)
    assert np.isposinf(out[0, 0, 0, 0, 0])
    assert out[0, 0, 0, 0, 1] == 1.0
    # NaN in grad_output reaches dx at the point's in-bounds corners only
    go = np.ones((1, 1, 1, 1, 2))
    go[0, 0, 0, 0, 1] = np.nan
    dx, dg = bwd(go, x, g, ac=True)
    assert np.isnan(dx[0, 0, 1, 1, 1]) and not np.isnan(dx[0, 0, 0, 0, 0])
    assert np.isnan(dg[0, 0, 0, 1]).all()
    # an in-bounds corner with weight 0 still multiplies: 0 * inf = nan
    g3 = np.full((1, 1, 1, 1, 3), -1.0)    # ac=True: u = 0 -> corners 0 and 1
    x3 = np.ones((1, 1, 2, 2, 2))
    x3[0, 0, 1, 1, 1] = np.inf              # the weight-0 far corner
    assert np.isnan(fwd(x3, g3, ac=True)).all()
    # out-of-bounds corners add nothing, even with inf grad_output / input
    go4 = np.full((1, 1, 1, 1, 1), np.inf)
    g4 = np.full((1, 1, 1, 1, 3), 5.0)
    for pad in ("zeros",):
        dx4, dg4 = bwd(go4, x3, g4, pad=pad, ac=True)
        assert not dx4.any() and not dg4.any()
        assert fwd(x3, g4, pad=pad, ac=True).ravel()[0] == 0


@pytest.mark.parametrize("ac", [False, True])
@pytest.mark.parametrize("pad", PADDINGS)
@pytest.mark.parametrize("mode", MODES)
def test_against_torch_on_lattice(mode, pad, ac):
    """Grid values on a 1/8 lattice hit voxel faces, half-integers (nearest
    rounds half to even), the clip limits (border factor 0 at u = 0 and
    u = S-1) and reflection folds exactly."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng([MODES.index(mode), PADDINGS.index(pad), ac, 5])
    x = rng.standard_normal((1, 2, 4, 5, 6))
    vals = np.arange(-20, 21) / 8.0
    g = np.stack(np.meshgrid(vals, vals[::3], vals[::5], indexing="ij"), -1)[None]
    go = rng.standard_normal((1, 2) + g.shape[1:4])
    tx, tg, tgo = (torch.from_numpy(np.ascontiguousarray(a)) for a in (x, g, go))
    t_out = torch.nn.functional.grid_sample(tx, tg, mode=mode, padding_mode=pad,
                                            align_corners=ac)
    t_dx, t_dg = torch.ops.aten.grid_sampler_3d_backward(
        tgo, tx, tg, MODES.index(mode), PADDINGS.index(pad), ac, [True, True])
    what = f"lattice {mode}/{pad}/ac={ac}"
    _close_to_torch(fwd(x, g, mode, pad, ac), t_out, "forward " + what)
    dx, dg = bwd(go, x, g, mode, pad, ac)
    _close_to_torch(dx, t_dx, "dx " + what)
    _close_to_torch(dg, t_dg, "dgrid " + what)


@pytest.mark.parametrize("ac", [False, True])
@pytest.mark.parametrize("mode", MODES)
def test_inf_border_size_one_axis(mode, ac):
    """S = 1 with align_corners=True makes u = inf * 0 = nan; border padding
    must still clamp an infinite coordinate to the (only) voxel."""
    x = np.arange(1.0, 7.0).reshape(1, 1, 1, 2, 3)   # D = 1
    g = np.array([[np.inf, np.inf, np.inf], [0.9, -0.9, -np.inf],
                  [-1e30, 1e30, 1e30]]).reshape(1, 1, 1, 3, 3)
    out = fwd(x, g, mode, "border", ac)
    dx, dg = bwd(np.ones((1, 1, 1, 1, 3)), x, g, mode, "border", ac)
    assert out.ravel()[0] == 6.0 and out.ravel()[2] == 4.0
    same = fwd(x, np.array([0.9, -0.9, 0.0]).reshape(1, 1, 1, 1, 3),
               mode, "border", ac)
    assert out.ravel()[1] == same.ravel()[0]
    assert np.isfinite(dx).all() and dx.sum() == 3.0
    assert np.all(dg[..., 2] == 0) and np.all(dg[0, 0, 0, [0, 2]] == 0)
