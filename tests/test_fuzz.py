"""Differential fuzzing of gs3d against gs3d.reference (issue 4, item 1).

Every example draws random shapes (sizes 1 and, where legal, 0), a dtype, a layout, mode,
padding, align_corners, output_mask, thread count, memory arrangements of every argument
(C/Fortran order, permuted axes, negative strides, steps, zero strides, unaligned, read-only)
and given output buffers, and a grid that mixes ordinary values with NaN, +-inf, +-1e30, -0.0
and subnormals.  The forward and the backward are compared with the float64 reference computed
from the very arrays passed (so on the same rounded inputs).

Examples per test: ``GS3D_FUZZ_EXAMPLES`` (default 200).  The run is derandomized and uses no
example database, so CI is reproducible; ``GS3D_FUZZ_RANDOM=1`` draws fresh examples instead.
Long run (documented in scripts/README.md):

    GS3D_FUZZ_EXAMPLES=20000 python -m pytest -q tests/test_fuzz.py
"""
import os

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, note, settings, strategies as st  # noqa: E402

import gs3d  # noqa: E402
from gs3d import reference as ref  # noqa: E402

from conftest import DTYPES, TOLERANCE, np_dtype  # noqa: E402

EXAMPLES = int(os.environ.get("GS3D_FUZZ_EXAMPLES", "200"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=os.environ.get("GS3D_FUZZ_RANDOM", "0") != "1",
    database=None,
    print_blob=True,
    suppress_health_check=list(HealthCheck),
)

SUBNORMAL = {"float64": 5e-324, "float32": 1e-45, "float16": 6e-8, "bfloat16": 1e-40}
SENTINEL = 7.0          # prefilled into given output buffers
ARRANGEMENTS = ("C", "F", "perm", "neg", "step", "unaligned", "readonly", "zero_stride")
# GS3D_FUZZ_SKIP="unaligned,..." leaves arrangements out (e.g. to look past a known report)
ARRANGEMENTS = tuple(a for a in ARRANGEMENTS
                     if a not in os.environ.get("GS3D_FUZZ_SKIP", "").split(","))


def _dtypes():
    names = list(DTYPES)
    try:
        import ml_dtypes  # noqa: F401
    except ImportError:
        names.remove("bfloat16")
    return names


# ---------------------------------------------------------------------------------------------
# building arrays with a given memory arrangement
# ---------------------------------------------------------------------------------------------

def arrange(a, how, rng, allow_zero_stride=True):
    """An array with the values of ``a`` (already of the target dtype) in another memory
    arrangement.  ``zero_stride`` changes the values (constant along one axis): callers always
    compute the reference from the returned array."""
    if how == "C" or a.size == 0:
        return np.ascontiguousarray(a)
    if how == "F":
        return np.asfortranarray(a)
    if how == "perm":
        perm = rng.permutation(a.ndim)
        return np.ascontiguousarray(a.transpose(perm)).transpose(np.argsort(perm))
    if how == "neg":
        flip = tuple(slice(None, None, -1) if rng.random() < 0.5 else slice(None)
                     for _ in range(a.ndim))
        return np.ascontiguousarray(a[flip])[flip]
    if how == "step":
        axis = int(rng.integers(a.ndim))
        shape = list(a.shape)
        shape[axis] *= 2
        big = np.zeros(shape, dtype=a.dtype)
        idx = tuple(slice(None, None, 2) if k == axis else slice(None) for k in range(a.ndim))
        big[idx] = a
        return big[idx]
    if how == "unaligned":
        buf = np.zeros(a.nbytes + a.itemsize, dtype=np.uint8)
        view = buf[1:1 + a.nbytes].view(a.dtype).reshape(a.shape)
        view[...] = a
        return view
    if how == "readonly":
        b = np.array(a)
        b.flags.writeable = False
        return b
    if how == "zero_stride" and allow_zero_stride:
        axis = int(rng.integers(a.ndim))
        idx = tuple(slice(0, 1) if k == axis else slice(None) for k in range(a.ndim))
        return np.broadcast_to(a[idx], a.shape)
    return np.ascontiguousarray(a)


def out_buffer(shape, dtype, how):
    """A writeable output buffer prefilled with SENTINEL: contiguous, Fortran or strided."""
    if how == "F":
        return np.asfortranarray(np.full(shape, SENTINEL, dtype=dtype))
    if how == "step":
        big = np.full(shape[:-1] + (2 * shape[-1],), SENTINEL, dtype=dtype)
        return big[..., ::2]
    return np.full(shape, SENTINEL, dtype=dtype)


# ---------------------------------------------------------------------------------------------
# comparison
# ---------------------------------------------------------------------------------------------

def compare(got, want, dtype, floor, what):
    """SPEC Precision: max |got - want| / (largest finite magnitude of want) within the dtype's
    tolerance, NaN positions and infinities equal.  ``floor`` (the magnitude of a single term,
    from the operands) stops the scale collapsing when a whole result cancels to ~0."""
    got = np.asarray(got.astype(np.float64))
    want = np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, what
    gn, wn = np.isnan(got), np.isnan(want)
    assert np.array_equal(gn, wn), (
        f"{what}: NaN positions differ at {np.argwhere(gn != wn)[:5].tolist()}: "
        f"got {got[gn != wn][:5]}, want {want[gn != wn][:5]}")
    fin = np.isfinite(want)
    assert np.array_equal(got[~fin], want[~fin], equal_nan=True), f"{what}: infinities differ"
    if not fin.any():
        return
    if dtype in ("float16", "bfloat16"):
        # the storage type may overflow where the float64 oracle does not
        assert np.isfinite(got[fin]).all() or np.abs(want[fin]).max() > 6e4, what
    scale = max(np.abs(want[fin]).max(), floor, np.finfo(np.float64).tiny)
    err = np.abs(got[fin] - want[fin]).max() / scale
    assert err <= TOLERANCE[dtype], (
        f"{what}: relative error {err:.3g} > {TOLERANCE[dtype]} (scale {scale:.3g}); worst at "
        f"{np.unravel_index(np.argmax(np.abs(got - want) * fin), got.shape)}")


def finite_max(a):
    a = np.asarray(a, dtype=np.float64)
    a = np.abs(a[np.isfinite(a)])
    return float(a.max()) if a.size else 0.0


def assert_bitwise(a, b, what):
    assert a.dtype == b.dtype and a.shape == b.shape, what
    assert np.array_equal(np.ascontiguousarray(a).view(np.uint8),
                          np.ascontiguousarray(b).view(np.uint8)), what


# ---------------------------------------------------------------------------------------------
# strategies
# ---------------------------------------------------------------------------------------------

def special_values(dtype):
    return [np.nan, np.inf, -np.inf, 1e30, -1e30, -0.0, SUBNORMAL[dtype], -SUBNORMAL[dtype],
            0.0, 1.0, -1.0, 0.5, -0.5]


@st.composite
def problems(draw, backward=True):
    dtype = draw(st.sampled_from(_dtypes()))
    dt = np_dtype(dtype)
    layout = draw(st.sampled_from(("NCDHW", "NDHWC")))
    mode = draw(st.sampled_from(("bilinear", "nearest", 0, 1)))
    padding = draw(st.sampled_from(("zeros", "border", "reflection", 0, 1, 2)))
    align = draw(st.booleans())
    N = draw(st.sampled_from((1, 1, 2, 0)))
    C = draw(st.sampled_from((1, 2, 3, 5, 9, 0)))     # 9: the channels-last path of NCDHW
    D, H, W = (draw(st.integers(1, 5)) for _ in range(3))
    Do, Ho, Wo = (draw(st.sampled_from((1, 2, 3, 4, 0))) for _ in range(3))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)

    # the grid: ordinary values (some snapped to voxel centres / edges) mixed with specials
    gshape = (N, Do, Ho, Wo, 3)
    grid = rng.uniform(-1.3, 1.3, gshape)
    if draw(st.booleans()):
        snap = rng.random(gshape) < 0.5
        grid[snap] = np.round(grid[snap] * 8) / 8
    p_special = draw(st.sampled_from((0.0, 0.05, 0.2, 0.6)))
    specials = special_values(dtype)
    if p_special and grid.size:
        chosen = draw(st.lists(st.sampled_from(specials), min_size=1, max_size=6))
        mask = rng.random(gshape) < p_special
        grid[mask] = rng.choice(np.array(chosen), size=int(mask.sum()))
    # a few exactly hand-placed special points (hypothesis can shrink these)
    if grid.size:
        for _ in range(draw(st.integers(0, 3))):
            pos = tuple(draw(st.integers(0, s - 1)) for s in gshape)
            grid[pos] = draw(st.sampled_from(specials))

    # input and grad_output: modest magnitudes; sometimes a few non-finite values
    xshape = (N, D, H, W, C) if layout == "NDHWC" else (N, C, D, H, W)
    goshape = (N, Do, Ho, Wo, C) if layout == "NDHWC" else (N, C, Do, Ho, Wo)
    x = rng.uniform(-4, 4, xshape)
    go = rng.uniform(-4, 4, goshape)
    if draw(st.integers(0, 9)) == 0:
        for arr in (x, go):
            if arr.size:
                m = rng.random(arr.shape) < 0.05
                arr[m] = rng.choice(np.array([np.nan, np.inf, -np.inf]), size=int(m.sum()))

    how = [draw(st.sampled_from(ARRANGEMENTS)) for _ in range(3)]
    with np.errstate(over="ignore"):          # 1e30 is inf in float16
        x = arrange(x.astype(dt), how[0], rng)
        grid = arrange(grid.astype(dt), how[1], rng)
        go = arrange(go.astype(dt), how[2], rng)
    num_threads = draw(st.sampled_from((None, None, 1, 2, 3)))
    mask = draw(st.sampled_from(((True, True), (True, False), (False, True), (False, False))))
    give = (draw(st.sampled_from((None, "C", "F", "step"))),
            draw(st.sampled_from((None, "C", "F", "step"))))
    det = draw(st.sampled_from((None, True, False)))
    return dict(dtype=dtype, layout=layout, mode=mode, padding=padding, align=align,
                x=x, grid=grid, go=go, num_threads=num_threads, mask=mask, give=give,
                det=det, how=how, seed=seed)


def describe(p):
    with np.printoptions(threshold=200, precision=17):
        for k in ("x", "grid", "go"):
            note(f"{k} = np.array({p[k].astype(np.float64).tolist()!r}, dtype={p['dtype']!r})")
    keys = ("dtype", "layout", "mode", "padding", "align", "num_threads", "mask", "give", "det",
            "how", "seed")
    shapes = {k: p[k].shape for k in ("x", "grid", "go")}
    return ", ".join(f"{k}={p[k]!r}" for k in keys) + f", shapes={shapes}"


# ---------------------------------------------------------------------------------------------
# the fuzz tests
# ---------------------------------------------------------------------------------------------

@FUZZ
@given(problems())
def test_fuzz_backward(p):
    dtype, layout = p["dtype"], p["layout"]
    x, grid, go = p["x"], p["grid"], p["go"]
    dt = x.dtype
    opts = dict(mode=p["mode"], padding_mode=p["padding"], align_corners=p["align"],
                layout=layout)
    copies = [a.copy() for a in (x, grid, go)]
    # (given buffers only when non-empty: empty ones are covered by test_robustness.py)
    bufs = [out_buffer(shape, dt, how) if how and 0 not in shape else None
            for shape, how in zip((x.shape, grid.shape), p["give"])]
    dx, dg = gs3d.grid_sample_3d_backward(
        go, x, grid, output_mask=p["mask"], num_threads=p["num_threads"],
        deterministic=p["det"], input_grad=bufs[0], grid_grad=bufs[1], **opts)
    info = describe(p)
    # inputs are never written
    for a, c in zip((x, grid, go), copies):
        assert_bitwise(a, c, "an input was modified: " + info)
    want_dx, want_dg = ref.grid_sample_3d_backward(go, x, grid, output_mask=p["mask"], **opts)
    for got, want, buf, wanted, name in ((dx, want_dx, bufs[0], p["mask"][0], "input_grad"),
                                         (dg, want_dg, bufs[1], p["mask"][1], "grid_grad")):
        if not wanted:
            assert got is None, f"{name} returned although not asked for: {info}"
            if buf is not None:      # a buffer for an unwanted gradient is left untouched
                assert (buf.astype(np.float64) == SENTINEL).all(), f"{name} touched: {info}"
            continue
        assert got is not None and got.dtype == dt, info
        if buf is not None:
            assert got is buf, f"{name}: the given buffer was not returned: {info}"
        if name == "input_grad":
            floor = finite_max(go)
        else:
            D, H, W = (x.shape[1:4] if layout == "NDHWC" else x.shape[2:5])
            floor = finite_max(go) * finite_max(x) * max(D, H, W) / 2
        compare(got, want, dtype, floor, f"{name}: {info}")
    # deterministic mode: bitwise identical with one thread
    if p["det"] and (dx is not None or dg is not None):
        dx1, dg1 = gs3d.grid_sample_3d_backward(go, x, grid, output_mask=p["mask"],
                                                num_threads=1, deterministic=True, **opts)
        for a, b, name in ((dx, dx1, "input_grad"), (dg, dg1, "grid_grad")):
            if a is not None:
                assert_bitwise(np.asarray(a), b, f"{name} differs from num_threads=1: {info}")


@FUZZ
@given(problems())
def test_fuzz_forward(p):
    dtype, layout = p["dtype"], p["layout"]
    x, grid = p["x"], p["grid"]
    opts = dict(mode=p["mode"], padding_mode=p["padding"], align_corners=p["align"],
                layout=layout)
    copies = [a.copy() for a in (x, grid)]
    out_shape = p["go"].shape
    buf = (out_buffer(out_shape, x.dtype, p["give"][0])
           if p["give"][0] and 0 not in out_shape else None)
    out = gs3d.grid_sample_3d(x, grid, num_threads=p["num_threads"], out=buf, **opts)
    info = describe(p)
    for a, c in zip((x, grid), copies):
        assert_bitwise(a, c, "an input was modified: " + info)
    if buf is not None:
        assert out is buf, info
    assert out.dtype == x.dtype and out.shape == out_shape, info
    want = ref.grid_sample_3d(x, grid, **opts)
    compare(out, want, dtype, finite_max(x), f"forward: {info}")
