"""Strides, layouts, dtypes, empty tensors, non-finite coordinates and thread counts.

SPEC "Tensors and layouts": any strides are accepted and the result does not depend on them;
NDHWC and NCDHW of the same data agree. "Empty tensors", "Non-finite and extreme coordinates",
"Determinism".
"""
import numpy as np
import pytest

import ml_dtypes

import gs3d
from gs3d import reference as ref

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = [np.dtype(np.float64), np.dtype(np.float32), np.dtype(np.float16), BF16]
DTYPE_IDS = ["f64", "f32", "f16", "bf16"]
LAYOUTS = ("NCDHW", "NDHWC")
PADDINGS = ("zeros", "border", "reflection")
MODES = ("bilinear", "nearest")
# (mode, padding_mode, align_corners)
CONFIGS = [
    ("bilinear", "zeros", False),
    ("bilinear", "border", True),
    ("bilinear", "reflection", False),
    ("bilinear", "reflection", True),
    ("nearest", "zeros", True),
    ("nearest", "border", False),
]
ALL_CONFIGS = [(m, p, a) for m in MODES for p in PADDINGS for a in (False, True)]
SENTINEL = 7.0
TOL = {np.dtype(np.float64): 1e-12, np.dtype(np.float32): 1e-5, np.dtype(np.float16): 1e-3,
       BF16: 8e-3}


# ----------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------

def vol(layout, N, C, D, H, W):
    return (N, C, D, H, W) if layout == "NCDHW" else (N, D, H, W, C)


def to_cl(a):
    return np.ascontiguousarray(a.transpose(0, 2, 3, 4, 1))


def from_cl(a):
    return a.transpose(0, 4, 1, 2, 3)


def make(dtype=np.float64, layout="NCDHW", N=2, C=3, D=3, H=4, W=5, Do=2, Ho=3, Wo=4, seed=0,
         lo=-1.25, hi=1.25):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(vol(layout, N, C, D, H, W)).astype(dtype)
    q = rng.uniform(lo, hi, (N, Do, Ho, Wo, 3)).astype(dtype)
    go = rng.standard_normal(vol(layout, N, C, Do, Ho, Wo)).astype(dtype)
    return x, q, go


def kw_of(cfg, layout):
    mode, pad, ac = cfg
    return dict(mode=mode, padding_mode=pad, align_corners=ac, layout=layout)


def both(x, q, go, cfg, layout, **extra):
    kw = kw_of(cfg, layout)
    out_kw = {k: v for k, v in extra.items() if k == "out"}
    bwd_kw = {k: v for k, v in extra.items() if k != "out"}
    f = gs3d.grid_sample_3d(x, q, **kw, **out_kw)
    dx, dg = gs3d.grid_sample_3d_backward(go, x, q, **kw, **bwd_kw)
    return f, dx, dg


def assert_same(got, want, what=""):
    got_t, want_t = tuple(got), tuple(want)
    for name, a, b in zip(("forward", "input_grad", "grid_grad"), got_t, want_t):
        assert a.shape == b.shape, (what, name, a.shape, b.shape)
        assert a.dtype == b.dtype, (what, name)
        assert np.array_equal(a, b), (what, name, np.argwhere(a != b)[:5])


def bits(a):
    a = np.ascontiguousarray(a)
    return a.view({8: np.uint64, 4: np.uint32, 2: np.uint16}[a.dtype.itemsize])


def relerr(got, want):
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    scale = np.max(np.abs(want)) if want.size else 0.0
    diff = np.max(np.abs(got - want)) if want.size else 0.0
    return diff / scale if scale > 0 else diff


def ref_both(x, q, go, cfg, layout, mask=(True, True)):
    mode, pad, ac = cfg
    xf, qf, gof = (np.asarray(a, dtype=np.float64) for a in (x, q, go))
    f = ref.grid_sample_3d(xf, qf, mode=mode, padding_mode=pad, align_corners=ac, layout=layout)
    dx, dg = ref.grid_sample_3d_backward(gof, xf, qf, mode=mode, padding_mode=pad,
                                         align_corners=ac, output_mask=mask, layout=layout)
    return f, dx, dg


# ----------------------------------------------------------------------------------------------
# views with the same logical content and other strides
# ----------------------------------------------------------------------------------------------

REV = (4, 3, 2, 1, 0)
PERM = (2, 0, 4, 1, 3)
INV_PERM = tuple(np.argsort(PERM))


def v_transposed(a):
    return np.ascontiguousarray(a.transpose(REV)).transpose(REV)


def v_permuted(a):
    return np.ascontiguousarray(a.transpose(PERM)).transpose(INV_PERM)


def v_stepped(a):
    steps = (2, 3, 2, 1, 2)
    big = np.full(tuple(n * s + 1 for n, s in zip(a.shape, steps)), SENTINEL, dtype=a.dtype)
    sl = tuple(slice(1, 1 + n * s, s) for n, s in zip(a.shape, steps))
    big[sl] = a
    return big[sl]


def v_negative(a):
    r = (slice(None, None, -1),) * 5
    return np.ascontiguousarray(a[r])[r]


def v_negative_last(a):
    return np.ascontiguousarray(a[..., ::-1])[..., ::-1]


def v_neg_step(a):
    """Negative and stepped on every axis of a larger array."""
    big = np.full(tuple(2 * n + 1 for n in a.shape), SENTINEL, dtype=a.dtype)
    sl = (slice(None, 0, -2),) * 5
    v = big[sl]
    assert v.shape == a.shape
    v[...] = a
    return v


def v_readonly(a):
    c = a.copy()
    c.flags.writeable = False
    return c


def v_fortran(a):
    f = np.asfortranarray(a)
    assert f.flags.f_contiguous
    return f


def v_misaligned(a):
    raw = np.zeros(a.nbytes + a.itemsize, dtype=np.uint8)
    v = raw[1: 1 + a.nbytes].view(a.dtype).reshape(a.shape)
    v[...] = a
    return v


def v_misaligned_strided(a):
    """Unaligned data pointer and byte strides that are not item-size multiples."""
    isz = a.itemsize
    raw = np.zeros(a.size * (isz + 1) + 8, dtype=np.uint8)
    # build through a structured dtype: itemsize isz+1 with the value at offset 0
    st = np.dtype({"names": ["v"], "formats": [a.dtype], "offsets": [0], "itemsize": isz + 1})
    s = raw[3: 3 + a.size * (isz + 1)].view(st).reshape(a.shape)
    v = s["v"]
    v[...] = a
    assert not v.flags.aligned or any(st_ % isz for st_ in v.strides)
    return v


VIEWS = {
    "transposed": v_transposed,
    "permuted": v_permuted,
    "stepped": v_stepped,
    "negative": v_negative,
    "negative_last_axis": v_negative_last,
    "negative_stepped": v_neg_step,
    "readonly": v_readonly,
    "fortran": v_fortran,
    "misaligned": v_misaligned,
    "misaligned_strided": v_misaligned_strided,
}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("view", sorted(VIEWS))
def test_input_strides_do_not_matter(view, dtype, layout):
    x, q, go = make(dtype=dtype, layout=layout)
    f = VIEWS[view]
    for cfg in CONFIGS:
        base = both(x, q, go, cfg, layout)
        # all three at once, then each alone
        assert_same(both(f(x), f(q), f(go), cfg, layout), base, (view, cfg, "all"))
        assert_same(both(f(x), q, go, cfg, layout), base, (view, cfg, "input"))
        assert_same(both(x, f(q), go, cfg, layout), base, (view, cfg, "grid"))
        assert_same(both(x, q, f(go), cfg, layout), base, (view, cfg, "grad_output"))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_zero_stride_broadcast_inputs(dtype, layout):
    """np.broadcast_to views (zero strides, read-only) give the results of their copies."""
    x, q, go = make(dtype=dtype, layout=layout, N=2, C=3)
    # input constant along N and along D (axis 2 in NCDHW, 1 in NDHWC)
    dax = 2 if layout == "NCDHW" else 1
    xb = np.broadcast_to(np.take(x[:1], [0], axis=dax), x.shape)
    # grad_output constant along the channel axis and along W_out
    cax = 1 if layout == "NCDHW" else 4
    wax = 4 if layout == "NCDHW" else 3
    gob = np.broadcast_to(np.take(np.take(go, [1], axis=cax), [0], axis=wax), go.shape)
    # grid shared by the batch
    qb = np.broadcast_to(q[:1], q.shape)
    assert 0 in xb.strides and 0 in gob.strides and 0 in qb.strides
    assert not xb.flags.writeable
    for cfg in CONFIGS:
        want = both(np.ascontiguousarray(xb), np.ascontiguousarray(qb),
                    np.ascontiguousarray(gob), cfg, layout)
        assert_same(both(xb, qb, gob, cfg, layout), want, cfg)
        # fully broadcast scalar volume
        xs = np.broadcast_to(x.flat[0], x.shape)
        assert_same(both(xs, q, go, cfg, layout),
                    both(np.ascontiguousarray(xs), q, go, cfg, layout), (cfg, "scalar"))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_given_output_buffers_non_contiguous(dtype, layout):
    """Outputs written through strided views of larger arrays: equal to the plain results and
    nothing outside the views is written."""
    x, q, go = make(dtype=dtype, layout=layout)

    def strided_views():
        yield "stepped", lambda big: big[::2, ::3, 1::2, ::1, ::2], (2, 3, 2, 1, 2)
        yield "negative", lambda big: big[::-2, ::-1, ::-2, ::-1, ::-3], (2, 1, 2, 1, 3)
        yield "transposed", None, None
        yield "misaligned", None, None

    for cfg in CONFIGS:
        want = both(x, q, go, cfg, layout)
        for name, sl, steps in strided_views():
            bigs, views = [], []
            for shape in (go.shape, x.shape, q.shape):   # out, input_grad, grid_grad
                if name == "transposed":
                    big = np.full(tuple(shape[i] for i in REV), SENTINEL, dtype=dtype)
                    v = big.transpose(REV)
                elif name == "misaligned":
                    n = int(np.prod(shape))
                    big = np.zeros(n * dtype.itemsize + 1, dtype=np.uint8)
                    v = big[1:].view(dtype).reshape(shape)
                    v[...] = SENTINEL
                else:
                    big = np.full(tuple(n * s for n, s in zip(shape, steps)), SENTINEL,
                                  dtype=dtype)
                    v = sl(big)
                assert v.shape == shape
                bigs.append(big)
                views.append(v)
            got = both(x, q, go, cfg, layout, out=views[0], input_grad=views[1],
                       grid_grad=views[2])
            assert got[0] is views[0] and got[1] is views[1] and got[2] is views[2]
            assert_same(got, want, (name, cfg))
            if name in ("stepped", "negative"):
                for big, v in zip(bigs, views):
                    touched = np.zeros(big.shape, bool)
                    sl(touched)[...] = True
                    assert np.all(big[~touched] == SENTINEL), (name, "wrote outside the view")


# ----------------------------------------------------------------------------------------------
# layouts
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("cfg", ALL_CONFIGS, ids=lambda c: "-".join(map(str, c)))
def test_layouts_agree(cfg, dtype):
    x, q, go = make(dtype=dtype, layout="NCDHW", C=4)
    f, dx, dg = both(x, q, go, cfg, "NCDHW")
    fc, dxc, dgc = both(to_cl(x), q, to_cl(go), cfg, "NDHWC")
    assert fc.shape == to_cl(f).shape and dxc.shape == to_cl(dx).shape
    assert np.array_equal(from_cl(fc), f)
    assert np.array_equal(from_cl(dxc), dx)
    assert np.array_equal(dgc, dg)
    # a channels-last *view* of NCDHW memory given as NDHWC
    fv, dxv, dgv = both(x.transpose(0, 2, 3, 4, 1), q, go.transpose(0, 2, 3, 4, 1), cfg,
                        "NDHWC")
    assert np.array_equal(from_cl(fv), f) and np.array_equal(from_cl(dxv), dx)
    assert np.array_equal(dgv, dg)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_dtypes_match_reference(dtype, layout):
    """Every dtype works with every layout, within the SPEC tolerance of the float64 oracle."""
    x, q, go = make(dtype=dtype, layout=layout, C=3)
    for cfg in ALL_CONFIGS:
        got = both(x, q, go, cfg, layout)
        want = ref_both(x, q, go, cfg, layout)
        for name, a, b in zip(("forward", "input_grad", "grid_grad"), got, want):
            assert a.dtype == dtype and a.shape == b.shape
            if cfg[0] == "nearest" and name == "grid_grad":
                assert np.all(np.asarray(a, np.float64) == 0)
            # skip grid_grad of half types: a grid coordinate sitting at a voxel boundary after
            # rounding makes the (discontinuous) derivative legitimately differ
            if name == "grid_grad" and dtype.itemsize == 2:
                continue
            assert relerr(a, b) <= TOL[dtype], (cfg, name, relerr(a, b))


def test_flipped_input_with_flipped_grid_matches():
    """[..., ::-1] on the input's W axis with a negated grid x samples the same points."""
    x, q, go = make(D=3, H=4, W=5)
    qf = q.copy()
    qf[..., 0] = -qf[..., 0]
    for cfg in ALL_CONFIGS:
        if cfg[0] == "nearest":
            continue    # round-half-to-even is not symmetric under the flip
        f, dx, dg = both(x, q, go, cfg, "NCDHW")
        f2, dx2, dg2 = both(x[..., ::-1], qf, go, cfg, "NCDHW")
        np.testing.assert_allclose(f2, f, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(dx2[..., ::-1], dx, rtol=1e-12, atol=1e-12)
        dg2 = dg2.copy()
        dg2[..., 0] = -dg2[..., 0]
        np.testing.assert_allclose(dg2, dg, rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------------------------------
# empty tensors
# ----------------------------------------------------------------------------------------------

EMPTY = {
    "N0": dict(N=0),
    "C0": dict(C=0),
    "N0C0": dict(N=0, C=0),
    "Do0": dict(Do=0),
    "Ho0": dict(Ho=0),
    "Wo0": dict(Wo=0),
    "allout0": dict(Do=0, Ho=0, Wo=0),
}


def _empty_problem(case, dtype, layout):
    shape = dict(N=2, C=3, D=3, H=4, W=5, Do=2, Ho=3, Wo=4)
    shape.update(EMPTY[case])
    x, q, go = make(dtype=dtype, layout=layout, **shape)
    N, C, Do, Ho, Wo = (shape[k] for k in ("N", "C", "Do", "Ho", "Wo"))
    return x, q, go, vol(layout, N, C, Do, Ho, Wo)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("case", sorted(EMPTY))
def test_empty(case, dtype, layout):
    x, q, go, out_shape = _empty_problem(case, dtype, layout)
    for cfg in ALL_CONFIGS:
        kw = kw_of(cfg, layout)
        f = gs3d.grid_sample_3d(x, q, **kw)
        assert f.shape == out_shape and f.dtype == dtype
        dx, dg = gs3d.grid_sample_3d_backward(go, x, q, **kw)
        assert dx.shape == x.shape and dx.dtype == dtype
        assert dg.shape == q.shape and dg.dtype == dtype
        assert np.all(np.asarray(dx, np.float64) == 0)
        assert np.all(np.asarray(dg, np.float64) == 0)
        dx, dg = gs3d.grid_sample_3d_backward(go, x, q, output_mask=(False, True), **kw)
        assert dx is None and dg.shape == q.shape and np.all(np.asarray(dg, np.float64) == 0)
        dx, dg = gs3d.grid_sample_3d_backward(go, x, q, output_mask=(True, False), **kw)
        assert dg is None and dx.shape == x.shape and np.all(np.asarray(dx, np.float64) == 0)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("case", sorted(EMPTY))
def test_empty_given_buffers(case, dtype, layout):
    """Given buffers (some of them empty) are accepted; non-empty ones become zeros."""
    x, q, go, out_shape = _empty_problem(case, dtype, layout)
    for cfg in ALL_CONFIGS:
        kw = kw_of(cfg, layout)
        out = np.full(out_shape, SENTINEL, dtype=dtype)
        ig = np.full(x.shape, SENTINEL, dtype=dtype)
        gg = np.full(q.shape, SENTINEL, dtype=dtype)
        assert gs3d.grid_sample_3d(x, q, out=out, **kw) is out
        r = gs3d.grid_sample_3d_backward(go, x, q, input_grad=ig, grid_grad=gg, **kw)
        assert r[0] is ig and r[1] is gg
        assert np.all(np.asarray(ig, np.float64) == 0), "input_grad buffer not zeroed"
        assert np.all(np.asarray(gg, np.float64) == 0), "grid_grad buffer not zeroed"
        # strided given buffers too
        ig2 = np.full(x.shape[::-1], SENTINEL, dtype=dtype).transpose(REV)
        gg2 = np.full(q.shape[::-1], SENTINEL, dtype=dtype).transpose(REV)
        gs3d.grid_sample_3d_backward(go, x, q, input_grad=ig2, grid_grad=gg2, **kw)
        assert np.all(np.asarray(ig2, np.float64) == 0)
        assert np.all(np.asarray(gg2, np.float64) == 0)
        # output_mask: the unwanted buffer stays untouched
        ig[...] = SENTINEL
        gg[...] = SENTINEL
        r = gs3d.grid_sample_3d_backward(go, x, q, input_grad=ig, grid_grad=gg,
                                         output_mask=(False, True), **kw)
        assert r[0] is None and r[1] is gg
        assert np.all(np.asarray(ig, np.float64) == SENTINEL)
        assert np.all(np.asarray(gg, np.float64) == 0)
        ig[...] = SENTINEL
        gg[...] = SENTINEL
        r = gs3d.grid_sample_3d_backward(go, x, q, input_grad=ig, grid_grad=gg,
                                         output_mask=(True, False), **kw)
        assert r[1] is None and r[0] is ig
        assert np.all(np.asarray(gg, np.float64) == SENTINEL)
        assert np.all(np.asarray(ig, np.float64) == 0)


def test_empty_with_non_finite_grid():
    """C = 0 with NaN/inf grid values: grid_grad is still exactly zero."""
    x, q, go = make(C=0)
    q[0, 0, 0, 0] = np.nan
    q[1, 0, 0, 0] = np.inf
    for cfg in ALL_CONFIGS:
        dx, dg = gs3d.grid_sample_3d_backward(go, x, q, **kw_of(cfg, "NCDHW"))
        assert np.all(dg == 0) and dx.shape == x.shape


# ----------------------------------------------------------------------------------------------
# non-finite and extreme coordinates
# ----------------------------------------------------------------------------------------------

def _points_mask(q, points):
    m = np.zeros(q.shape[:4], bool)
    for p in points:
        m[p] = True
    return m


def _silence(q, go, mask, layout):
    """A copy of the problem where the masked points are harmless: grid 0, grad_output 0."""
    q2, go2 = q.copy(), go.copy()
    q2[mask] = 0
    if layout == "NCDHW":
        go2.transpose(0, 2, 3, 4, 1)[mask] = 0
    else:
        go2[mask] = 0
    return q2, go2


def _at(a, mask, layout):
    """Values of an output-shaped array at the masked points: (k, C)."""
    return (a.transpose(0, 2, 3, 4, 1) if layout == "NCDHW" else a)[mask]


def _check_samples_nothing(x, q, go, mask, cfg, layout, dtype):
    f, dx, dg = both(x, q, go, cfg, layout)
    q2, go2 = _silence(q, go, mask, layout)
    f2, dx2, dg2 = both(x, q2, go2, cfg, layout)
    fm = np.asarray(_at(f, mask, layout), np.float64)
    assert np.all(fm == 0), (cfg, "forward at dead points", fm)
    dgm = np.asarray(dg[mask], np.float64)
    assert np.all(dgm == 0), (cfg, "grid_grad at dead points", dgm)
    assert np.array_equal(dx, dx2), (cfg, "dead point contributed to input_grad")
    assert np.array_equal(_at(f, ~mask, layout), _at(f2, ~mask, layout)), cfg
    assert np.array_equal(dg[~mask], dg2[~mask]), cfg
    assert np.all(np.isfinite(np.asarray(dx, np.float64)))
    assert np.all(np.isfinite(np.asarray(dg, np.float64)))


DEAD_POINTS = [(0, 0, 0, 0), (0, 1, 2, 3), (1, 1, 0, 2)]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_nan_samples_nothing(dtype, layout):
    x, q, go = make(dtype=dtype, layout=layout)
    mask = _points_mask(q, DEAD_POINTS)
    for axes in ([0], [1], [2], [0, 1, 2]):
        qn = q.copy()
        for p in DEAD_POINTS:
            for a in axes:
                qn[p + (a,)] = np.nan
        for cfg in ALL_CONFIGS:
            _check_samples_nothing(x, qn, go, mask, cfg, layout, dtype)
            if dtype == np.float64:
                got, want = both(x, qn, go, cfg, layout), ref_both(x, qn, go, cfg, layout)
                for a, b in zip(got, want):
                    assert relerr(a, b) <= 1e-12, (cfg, axes)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("sign", [1, -1])
def test_inf_zeros_and_reflection_sample_nothing(sign, dtype, layout):
    x, q, go = make(dtype=dtype, layout=layout)
    mask = _points_mask(q, DEAD_POINTS)
    for axes in ([0], [1], [2], [0, 2]):
        qi = q.copy()
        for p in DEAD_POINTS:
            for a in axes:
                qi[p + (a,)] = sign * np.inf
        for cfg in ALL_CONFIGS:
            if cfg[1] == "border":
                continue
            _check_samples_nothing(x, qi, go, mask, cfg, layout, dtype)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_inf_border_clamps_to_edge(dtype, layout):
    """Border: +-inf behaves exactly like a far-outside finite coordinate (+-2: clipped to the
    edge, derivative factor 0)."""
    x, q, go = make(dtype=dtype, layout=layout)
    for axes in ([0], [1], [2], [0, 1], [0, 1, 2]):
        for sign in (1, -1):
            qi, qf = q.copy(), q.copy()
            for p in DEAD_POINTS:
                for a in axes:
                    qi[p + (a,)] = sign * np.inf
                    qf[p + (a,)] = sign * 2.0
            for mode in MODES:
                for ac in (False, True):
                    cfg = (mode, "border", ac)
                    got = both(x, qi, go, cfg, layout)
                    assert_same(got, both(x, qf, go, cfg, layout), (cfg, axes, sign))
                    for p in DEAD_POINTS:
                        for a in axes:
                            assert float(got[2][p + (a,)]) == 0.0
                    if dtype == np.float64:
                        want = ref_both(x, qi, go, cfg, layout)
                        for a, b in zip(got, want):
                            assert relerr(a, b) <= 1e-12, (cfg, axes, sign)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("mode", MODES)
def test_inf_border_corner_voxel(mode, dtype):
    """A single point at (+inf, -inf, +inf) reads voxel (z=D-1, y=0, x=W-1) exactly; input_grad
    receives grad_output there only; grid_grad 0."""
    x, _, _ = make(dtype=dtype, N=1, C=3, D=3, H=4, W=5)
    q = np.array([np.inf, -np.inf, np.inf], dtype=dtype).reshape(1, 1, 1, 1, 3)
    go = np.array([1.5, -2.0, 0.25], dtype=dtype).reshape(1, 3, 1, 1, 1)
    for ac in (False, True):
        cfg = (mode, "border", ac)
        f, dx, dg = both(x, q, go, cfg, "NCDHW")
        assert np.array_equal(f[0, :, 0, 0, 0], x[0, :, 2, 0, 4])
        want = np.zeros_like(x)
        want[0, :, 2, 0, 4] = go[0, :, 0, 0, 0]
        assert np.array_equal(dx, want)
        assert np.all(np.asarray(dg, np.float64) == 0)


def _extreme_values(dtype):
    if dtype == np.float64:
        return [1e30, -1e30, 1e300, -1e300, 1.7e308, -1.7e308, 5e-324, -5e-324, 2.2e-308,
                -0.0, 0.0]
    if dtype == np.float32:
        return [1e30, -1e30, 3e38, -3e38, 1e-45, -1e-45, 1.2e-38, -0.0]
    if dtype == np.float16:
        return [65504.0, -65504.0, 6e-8, -6e-8, 6.1e-5, -0.0, 1000.0]
    return [1e30, -1e30, 3e38, -3e38, 1e-40, -1e-40, -0.0]   # bfloat16


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_extreme_coordinates(dtype, layout):
    """Huge, subnormal and signed-zero coordinates in every padding: no crash, finite results,
    agreement with the float64 reference where the storage precision allows."""
    x, q, go = make(dtype=dtype, layout=layout, lo=-0.9, hi=0.9)
    pts = [(0, 0, 0, 0), (0, 1, 1, 1), (1, 0, 2, 3), (1, 1, 1, 2)]
    xmin, xmax = float(np.min(x.astype(np.float64))), float(np.max(x.astype(np.float64)))
    for v in _extreme_values(dtype):
        for a in range(3):
            qe = q.copy()
            for p in pts:
                qe[p + (a,)] = v
            qe[pts[2]] = v      # all three axes of one point
            for cfg in ALL_CONFIGS:
                got = both(x, qe, go, cfg, layout)
                for arr in got:
                    assert np.all(np.isfinite(np.asarray(arr, np.float64))), (v, a, cfg)
                huge_reflect = cfg[1] == "reflection" and abs(v) > 1e3
                if dtype == np.float64 or not huge_reflect:
                    # reflection of a huge coordinate computed in float32 lands elsewhere than
                    # in float64: compare only where the precision allows
                    want = ref_both(x, qe, go, cfg, layout)
                    for name, g_, w_ in zip(("forward", "input_grad", "grid_grad"), got, want):
                        if name == "grid_grad" and dtype.itemsize == 2:
                            continue
                        tol = TOL[dtype]
                        assert relerr(g_, w_) <= tol, (v, a, cfg, name, relerr(g_, w_))
                else:
                    # reflected points lie inside: bilinear output is a convex combination
                    f = np.asarray(got[0], np.float64)
                    assert np.all(f >= xmin - 1e-2 * abs(xmin) - 1e-2), (v, a, cfg)
                    assert np.all(f <= xmax + 1e-2 * abs(xmax) + 1e-2), (v, a, cfg)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_signed_zero_and_subnormal_equal_zero(dtype):
    """-0.0 and the smallest subnormals sample exactly like +0.0 (the centre).  (Not float16:
    its subnormals are normal float32 numbers and may legitimately move u by one float32 ulp.)"""
    x, q, go = make(dtype=dtype)
    tiny = {np.dtype(np.float64): 5e-324, np.dtype(np.float32): 1e-45,
            np.dtype(np.float16): None, BF16: 1e-40}[dtype]
    for v in (-0.0,) + ((tiny, -tiny) if tiny else ()):
        qz, qv = q.copy(), q.copy()
        qz[0, 0, 0, 0, :] = 0.0
        qv[0, 0, 0, 0, :] = v
        if dtype == np.float64:
            assert qv[0, 0, 0, 0, 0] == v
        for cfg in ALL_CONFIGS:
            got, want = both(x, qv, go, cfg, "NCDHW"), both(x, qz, go, cfg, "NCDHW")
            assert np.array_equal(got[0], want[0]), (v, cfg)
            assert np.array_equal(got[1], want[1]), (v, cfg)
            assert np.array_equal(got[2], want[2]), (v, cfg)


# ----------------------------------------------------------------------------------------------
# thread counts
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("deterministic", [True, None])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_thread_count_bitwise_identical(dtype, layout, deterministic):
    """Many points hit the same few voxels (input 3x3x3, output 16x16x16, C=5): results of
    num_threads 1..4 are bitwise identical, and identical across repeated runs."""
    x, q, go = make(dtype=dtype, layout=layout, N=2, C=5, D=3, H=3, W=3, Do=16, Ho=16, Wo=16,
                    seed=3, lo=-1.2, hi=1.2)
    for cfg in [("bilinear", "zeros", False), ("bilinear", "border", True),
                ("bilinear", "reflection", False), ("nearest", "zeros", False)]:
        kw = kw_of(cfg, layout)
        first = None
        for nt in (1, 2, 3, 4, 1, 4):
            f = gs3d.grid_sample_3d(x, q, num_threads=nt, **kw)
            dx, dg = gs3d.grid_sample_3d_backward(go, x, q, num_threads=nt,
                                                  deterministic=deterministic, **kw)
            cur = (bits(f), bits(dx), bits(dg))
            if first is None:
                first = cur
                assert np.any(np.asarray(dx, np.float64) != 0)
                continue
            for name, a, b in zip(("forward", "input_grad", "grid_grad"), cur, first):
                assert np.array_equal(a, b), (cfg, nt, name)


# The dead-point rules must not depend on what else the process has loaded.  In-process state
# (stack contents left by other libraries, e.g. after ``import torch``) once made the grid
# gradient of a NaN point NaN; run the check in a fresh process with torch imported first.
_DEAD_POINT_SCRIPT = r"""
import torch  # noqa: F401  (loaded first on purpose)
import numpy as np, gs3d
x = np.ones((1, 1, 2, 2, 2)); go = np.ones((1, 1, 1, 1, 1))
bad = []
for pad in ("zeros", "border", "reflection"):
    for v in (np.nan, np.inf, -np.inf):
        for ax in range(3):
            for ac in (False, True):
                q = np.zeros((1, 1, 1, 1, 3)); q[..., ax] = v
                dx, dg = gs3d.grid_sample_3d_backward(go, x, q, padding_mode=pad,
                                                      align_corners=ac)
                f = gs3d.grid_sample_3d(x, q, padding_mode=pad, align_corners=ac)
                dead = v != v or pad != "border"
                # dead points and border infinities (multiplier 0): grid_grad exactly 0
                ok = bool(np.all(dg == 0) and np.all(np.isfinite(dx)))
                if dead:
                    ok = ok and np.all(dx == 0) and np.all(f == 0)
                if not ok:
                    bad.append((pad, float(v), ax, ac, dg.ravel().tolist()))
# a finite coordinate whose u overflows (S=2, align_corners False: (g+1)*2 = inf) under
# reflection samples nothing
for ax in range(3):
    q = np.zeros((1, 1, 1, 1, 3)); q[..., ax] = 1.7e308
    dx, dg = gs3d.grid_sample_3d_backward(go, x, q, padding_mode="reflection")
    f = gs3d.grid_sample_3d(x, q, padding_mode="reflection")
    if not (np.all(dg == 0) and np.all(dx == 0) and np.all(f == 0)):
        bad.append(("reflection", 1.7e308, ax, False, dg.ravel().tolist()))
print("BAD", bad)
"""


def test_dead_points_independent_of_process_state():
    pytest.importorskip("torch")       # the child process imports it first on purpose
    import os
    import subprocess
    import sys
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-c", _DEAD_POINT_SCRIPT], capture_output=True,
                       text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr[-500:]
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("BAD")][-1]
    assert line == "BAD []", line
