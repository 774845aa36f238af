"""Nearest's own kernels: the backward scatter (serial, and the threaded version that maps
blocks of points in parallel before each thread scatters its depth slab) and the forward copy.

Each case is checked against the float64 reference, across thread counts bitwise, and with
guard bytes after the kernel's workspace and scratch.
"""
import zlib

import numpy as np
import pytest

import gs3d
from gs3d import reference
from conftest import TOLERANCE, np_dtype, rel_err, to_layout

# output shapes: fewer points than a tile, a few tiles with a tail, and more than one block
# (NBLOCK = 4096 points) with a tail
OUT_SHAPES = [(3, 4, 5), (7, 6, 9), (17, 16, 18)]


def _problem(rng, dtype, layout, C, out, kind, N=1):
    dt = np_dtype(dtype)
    D, H, W = 9, 10, 11
    x = rng.standard_normal((N, C, D, H, W))
    go = rng.standard_normal((N, C) + out)
    if kind == "random":
        q = rng.uniform(-1.2, 1.2, (N,) + out + (3,))
        q.flat[::13] = np.nan
        q.flat[4::29] = np.inf
        q.flat[7::31] = -1e30
    else:
        # a smooth warp: neighbouring points round to the same voxel, so voxels collect
        # several contributions, in point order
        axes = [np.linspace(-1.05, 1.05, s) for s in out]
        zz, yy, xx = np.meshgrid(*axes, indexing="ij")
        q = np.stack([xx, 0.9 * yy + 0.03, 0.8 * zz], -1)[None].repeat(N, 0)
    with np.errstate(over="ignore"):                  # -1e30 is -inf in 16 bits
        q = q.astype(dt)
    return (to_layout(x.astype(dt), layout), q, to_layout(go.astype(dt), layout))


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "bfloat16"])
@pytest.mark.parametrize("layout", ["NCDHW", "NDHWC"])
@pytest.mark.parametrize("C", [1, 3, 16])
@pytest.mark.parametrize("out", OUT_SHAPES)
@pytest.mark.parametrize("kind", ["smooth", "random"])
def test_nearest_backward_against_reference_and_across_threads(dtype, layout, C, out, kind):
    """NCDHW with C = 16 runs through the channels-last accumulator; 2 and 3 threads at N = 1
    run the threaded scatter (a tail block when the output has more than NBLOCK points)."""
    rng = np.random.default_rng(zlib.crc32(repr((dtype, layout, C, out, kind)).encode()))
    x, q, go = _problem(rng, dtype, layout, C, out, kind)
    f64 = lambda a: a.astype(np.float64)
    want_dx, _ = reference.grid_sample_3d_backward(f64(go), f64(x), f64(q), mode="nearest",
                                                   layout=layout)
    runs = [gs3d.grid_sample_3d_backward(go, x, q, mode="nearest", layout=layout,
                                         num_threads=t) for t in (1, 2, 3)]
    dx, dg = runs[0]
    assert rel_err(dx, want_dx) <= TOLERANCE[dtype]
    assert not dg.view(np.uint8).any()          # the grid gradient is +0 everywhere
    for dx_t, dg_t in runs[1:]:
        assert np.array_equal(dx_t.view(np.uint8), dx.view(np.uint8))
        assert np.array_equal(dg_t.view(np.uint8), dg.view(np.uint8))
    # each output alone gives the same bits
    dx1, _ = gs3d.grid_sample_3d_backward(go, x, q, mode="nearest", layout=layout,
                                          num_threads=2, output_mask=(True, False))
    _, dg1 = gs3d.grid_sample_3d_backward(go, x, q, mode="nearest", layout=layout,
                                          num_threads=2, output_mask=(False, True))
    assert np.array_equal(dx1.view(np.uint8), dx.view(np.uint8))
    assert not dg1.view(np.uint8).any()


@pytest.mark.parametrize("padding,align", [("border", True), ("reflection", False),
                                           ("reflection", True)])
@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16"])
@pytest.mark.parametrize("layout", ["NCDHW", "NDHWC"])
@pytest.mark.parametrize("C", [1, 16])
@pytest.mark.parametrize("N", [1, 2])
def test_nearest_backward_paddings_batches_and_reversed_outputs(padding, align, dtype, layout,
                                                               C, N):
    """Other paddings, two batch items on three threads (the threaded scatter of item 1),
    and an input_grad given as a reversed view (negative strides: negative voxel offsets)."""
    rng = np.random.default_rng(zlib.crc32(repr((padding, align, dtype, layout, C, N)).encode()))
    x, q, go = _problem(rng, dtype, layout, C, (7, 6, 9), "random", N=N)
    opts = dict(mode="nearest", padding_mode=padding, align_corners=align, layout=layout)
    f64 = lambda a: a.astype(np.float64)
    want_dx, _ = reference.grid_sample_3d_backward(f64(go), f64(x), f64(q), **opts)
    dx1, _ = gs3d.grid_sample_3d_backward(go, x, q, num_threads=1, **opts)
    assert rel_err(dx1, want_dx) <= TOLERANCE[dtype]
    for t in (2, 3):
        dx, dg = gs3d.grid_sample_3d_backward(go, x, q, num_threads=t, **opts)
        assert np.array_equal(dx.view(np.uint8), dx1.view(np.uint8))
        assert not dg.view(np.uint8).any()
        rev = np.full(x.shape[::-1], 7, x.dtype).T[::-1, ::-1, ::-1, ::-1, ::-1]
        assert all(s < 0 for s in rev.strides)
        out, _ = gs3d.grid_sample_3d_backward(go, x, q, num_threads=t, input_grad=rev,
                                              output_mask=(True, False), **opts)
        assert out is rev and np.array_equal(np.ascontiguousarray(rev).view(np.uint8),
                                              dx1.view(np.uint8))


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "bfloat16"])
@pytest.mark.parametrize("layout", ["NCDHW", "NDHWC"])
@pytest.mark.parametrize("C", [1, 16])
def test_nearest_forward_against_reference_and_across_threads(dtype, layout, C):
    rng = np.random.default_rng(C)
    x, q, _ = _problem(rng, dtype, layout, C, (7, 6, 9), "random", N=2)
    x.flat[::7] = -0.0                                 # 0 + (-0) is +0, as the general loop
    want = reference.grid_sample_3d(x.astype(np.float64), q.astype(np.float64),
                                    mode="nearest", layout=layout)
    runs = [gs3d.grid_sample_3d(x, q, mode="nearest", layout=layout, num_threads=t)
            for t in (1, 2, 3)]
    assert rel_err(runs[0], want) == 0.0               # a copy: exact in every dtype
    assert not np.signbit(runs[0][runs[0] == 0]).any()
    for r in runs[1:]:
        assert np.array_equal(r.view(np.uint8), runs[0].view(np.uint8))


@pytest.mark.parametrize("out", OUT_SHAPES)
@pytest.mark.parametrize("layout,dtype", [("NCDHW", "float32"), ("NDHWC", "float64"),
                                          ("NCDHW", "float16")])
def test_nearest_backward_stays_inside_its_workspace(out, layout, dtype):
    """The kernel entry with a workspace of exactly ``workspace_bytes`` (and scratch of the
    documented size), both followed by guard bytes: the guards are untouched and the results
    are the API's."""
    from gs3d import _api
    from gs3d._validation import check_problem
    rng = np.random.default_rng(11)
    x, q, go = _problem(rng, dtype, layout, 16 if layout == "NCDHW" else 5, out, "random")
    pb = check_problem(x, q, go, "nearest", "zeros", False, layout)
    nt = 3
    res = _api._Resources(pb, nt, True)
    k = _api._kernels
    P = int(np.prod(out))
    n_ws = k.workspace_bytes(nt, x.shape[2] if layout == "NCDHW" else x.shape[1], P, 1)
    assert res.workspace.size == n_ws
    ws_buf = np.full(n_ws + 4096, 0xA5, np.uint8)
    sc_buf = np.full((nt + 2, res.scratch.shape[1]), 7, res.scratch.dtype)
    half = x.dtype.itemsize == 2
    st = (lambda a: a.view(np.uint16)) if half else (lambda a: a)
    perm = (lambda a: a) if layout == "NDHWC" else (lambda a: a.transpose(0, 2, 3, 4, 1))
    dx, dg = np.full(x.shape, 9, x.dtype), np.full(q.shape, 9, q.dtype)
    k.backward(perm(st(go)), perm(st(x)), st(q), perm(st(dx)), st(dg), res.dx_acc,
               sc_buf[:nt], ws_buf[:n_ws], 1, 0, False, res.half_kind, True, True, nt, res.xcl)
    assert np.all(ws_buf[n_ws:] == 0xA5) and np.all(sc_buf[nt:] == 7)
    want = gs3d.grid_sample_3d_backward(go, x, q, mode="nearest", layout=layout, num_threads=1)
    assert np.array_equal(st(dx), st(want[0])) and np.array_equal(st(dg), st(want[1]))


def test_nearest_workspace_holds_one_block_at_most():
    """The threaded nearest backward keeps one block of point indices, not the whole grid."""
    k = gs3d._api._kernels
    small, big = k.workspace_bytes(2, 64, 10 ** 3, 1), k.workspace_bytes(2, 64, 10 ** 7, 1)
    assert small < big and big - small < 3 * 4096 * 8


def test_nearest_backward_makes_no_copy_of_the_input():
    """NCDHW with many channels: the bilinear backward copies the input channels-last (for
    the grid gradient alone, into a buffer of its own); nearest's never reads the input."""
    from gs3d import _api
    from gs3d._validation import check_problem
    x = np.zeros((1, 16, 8, 8, 8), np.float32)
    q = np.zeros((1, 8, 8, 8, 3), np.float32)
    g = np.zeros((1, 16, 8, 8, 8), np.float32)
    for mode, copies in (("bilinear", True), ("nearest", False)):
        pb = check_problem(x, q, g, mode, "zeros", False, "NCDHW")
        res = _api._Resources(pb, 2, False, True)
        assert res.cl and (res.xcl.size == x.size) == copies
    # the forward reads it in either mode
    pb = check_problem(x, q, None, "nearest", "zeros", False, "NCDHW")
    assert _api._Resources(pb, 2, False).xcl.size == x.size
