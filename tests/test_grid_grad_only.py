"""The float32 and 16-bit backward of a multiple of 8 channels contiguous in the input (NDHWC,
or NCDHW through its channels-last copy) runs through gs3d_backward_rows (no per-tile arrays):
the grid gradient alone always, the full call for tiles whose points are close together in
depth (tile_coherent), the tile loop otherwise and wherever the accumulator's channels are not
contiguous.  SPEC "Output mask" and "Determinism": each must give bitwise the tile loop's
results, at every thread count, for every way grad_output is laid out, and agree with the
reference.
"""
import numpy as np
import pytest

import gs3d
from gs3d import reference as ref
from conftest import TOLERANCE, kernel_modules, np_dtype, rel_err, run_with, same_bits, to_layout

# Wo = 13: a partial block of eight points at the end of every row of 13 (and tiles of 64
# points end mid-block); C = 72: more channels than one tile's staging holds at once.  D = 40:
# a uniformly random grid's tiles span more than a quarter of the depth, so the full call
# takes the tile loop there.  At least a quarter as many output points as voxels: NCDHW
# takes its channels-last copy (channels_last_pays), with grad_output staged a tile at a time
SHAPES = [(1, 8, (40, 3, 4), (5, 6, 13)), (2, 16, (40, 3, 5), (4, 5, 13)),
          (1, 72, (40, 3, 4), (3, 4, 13))]
# for NDHWC into a dense input_grad: fewer output points than a quarter of the voxels, so the
# split of one batch item's points (README), whose bits differ from the depth slabs', is never
# taken
FEW_POINTS = [(1, 8, (40, 7, 9), (5, 6, 13)), (2, 16, (40, 5, 19), (4, 5, 13)),
              (1, 72, (40, 4, 6), (3, 4, 13))]
CFGS = [dict(), dict(padding_mode="border"), dict(align_corners=True),
        dict(padding_mode="border", align_corners=True)]


def _case(N, C, in_sp, out_sp, seed, spread=1.2):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((N, C) + in_sp).astype(np.float32)
    go = rng.standard_normal((N, C) + out_sp).astype(np.float32)
    if spread is None:
        # close to the identity: every tile's points within a few planes of depth
        axes = [np.linspace(-1.0, 1.0, n) for n in out_sp]
        zz, yy, xx = np.meshgrid(*axes, indexing="ij")
        q = np.stack([xx, yy, zz], -1)[None] + rng.normal(0, 0.03, (N,) + out_sp + (3,))
        q = q.astype(np.float32)
    else:
        q = rng.uniform(-spread, spread, (N,) + out_sp + (3,)).astype(np.float32)
    # coordinates on the edges, and non-finite ones (SPEC "Non-finite coordinates")
    q.reshape(-1, 3)[:5] = [[1.0, -1.0, 0.5], [np.nan, 0.0, 0.0], [np.inf, 0.1, 0.2],
                            [-np.inf, -0.3, 0.9], [0.2, 0.3, np.nan]]
    return x, q, go


def _strided(a):
    """``a`` as a view whose points are not adjacent (every other element of a buffer twice
    as wide along the last axis: W for NCDHW, the channels for NDHWC)."""
    buf = np.full(a.shape[:-1] + (2 * a.shape[-1],), np.nan, a.dtype)
    view = buf[..., ::2]
    view[...] = a
    return view


def _check_reference(got, x, q, go, cfg, dtype="float32"):
    want = ref.grid_sample_3d_backward(go.astype(np.float64), x.astype(np.float64),
                                       q.astype(np.float64), **cfg)
    for a, r in zip(got, want):
        assert rel_err(a, r) <= TOLERANCE[dtype], cfg


@pytest.mark.parametrize("layout", ["NCDHW", "NDHWC"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"C{s[1]}")
@pytest.mark.parametrize("strided", [False, True])
def test_grid_grad_alone_is_the_tile_loops(layout, shape, strided):
    x, q, go = _case(*shape, seed=shape[1])
    xl, gl = to_layout(x, layout), to_layout(go, layout)
    if strided:
        gl = _strided(gl)
    for cfg in CFGS:
        full = gs3d.grid_sample_3d_backward(gl, xl, q, layout=layout, num_threads=1, **cfg)
        _check_reference((np.moveaxis(full[0], 4, 1) if layout == "NDHWC" else full[0],
                          full[1]), x, q, go, cfg)
        for nt in (1, 2, 3):
            _, dg = gs3d.grid_sample_3d_backward(gl, xl, q, layout=layout, num_threads=nt,
                                                 output_mask=(False, True), **cfg)
            assert np.array_equal(dg.view(np.uint32), full[1].view(np.uint32)), (cfg, nt)


@pytest.mark.parametrize("layout", ["NCDHW", "NDHWC"])
@pytest.mark.parametrize("which", range(3))
@pytest.mark.parametrize("mask", [(True, True), (True, False)])
def test_coherent_tiles_give_the_tile_loops_bits(layout, which, mask):
    """A grid near the identity: with a dense input_grad its coherent tiles take
    gs3d_backward_rows.  NDHWC into a strided input_grad (channels not contiguous in the
    accumulator) takes the tile loop; the same bits.  (NCDHW accumulates channels-last either
    way: there the strided input_grad moves only the input copy, which must not matter.)"""
    shape = (SHAPES if layout == "NCDHW" else FEW_POINTS)[which]
    x, q, go = _case(*shape, seed=shape[1] + 1, spread=None)
    xl, gl = to_layout(x, layout), to_layout(go, layout)
    for cfg in CFGS:
        for nt in (1, 2, 3):
            dense = gs3d.grid_sample_3d_backward(gl, xl, q, layout=layout, num_threads=nt,
                                                 output_mask=mask, **cfg)
            strided = _strided(np.zeros(xl.shape, np.float32))
            tiles = gs3d.grid_sample_3d_backward(gl, xl, q, layout=layout, num_threads=nt,
                                                 output_mask=mask, input_grad=strided, **cfg)
            for a, b in zip(dense, tiles):
                assert (a is None) == (b is None)
                if a is not None:
                    assert np.array_equal(np.ascontiguousarray(a).view(np.uint32),
                                          np.ascontiguousarray(b).view(np.uint32)), (cfg, nt)
        if mask == (True, True):
            _check_reference((np.moveaxis(dense[0], 4, 1) if layout == "NDHWC" else dense[0],
                              dense[1]), x, q, go, cfg)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("layout", ["NCDHW", "NDHWC"])
@pytest.mark.parametrize("which", range(3))
@pytest.mark.parametrize("grid", ["coherent", "random"])
@pytest.mark.parametrize("strided", [False, True])
def test_16bit_rows_give_the_baseline_bits(dtype, layout, which, grid, strided):
    """16-bit storage takes gs3d_backward_rows too (values converted exactly, sums in float32,
    the grid gradient rounded once; grad_output converted eight points at a time, or a tile at
    a time when its channels are strided, its points at step 1 and a tile's values fit the
    staging buffer): the full call on a grid near the identity, the grid gradient alone on any
    grid.  Every mask, at 1, 2 and 3 threads, under every kernel module this CPU runs, gives
    the bits of the baseline build's tile loop at one thread, and agrees with the
    reference."""
    dt = np_dtype(dtype)
    shape = (SHAPES if layout == "NCDHW" else FEW_POINTS)[which]
    x, q, go = _case(*shape, seed=shape[1] + 2, spread=None if grid == "coherent" else 1.2)
    x, q, go = (a.astype(dt) for a in (x, q, go))
    xl, gl = to_layout(x, layout), to_layout(go, layout)
    if strided:
        gl = _strided(gl)
    for cfg in CFGS:
        for mask in [(True, True), (True, False), (False, True)]:
            runs = [run_with(m, lambda: [gs3d.grid_sample_3d_backward(
                gl, xl, q, layout=layout, num_threads=nt, output_mask=mask, **cfg)
                for nt in (1, 2, 3)]) for m in kernel_modules()]
            base = runs[0][0]
            for module_runs in runs:
                for got in module_runs:
                    assert all(same_bits(a, b) for a, b in zip(base, got)), (cfg, mask)
            if mask == (True, True):
                _check_reference((np.moveaxis(base[0], 4, 1) if layout == "NDHWC" else base[0],
                                  base[1]), x, q, go, cfg, dtype)



def test_lead_row_follows_the_grids_direction():
    """Below PREFETCH_BWD_MIN_KIB gs3d_backward_rows prefetches, for each point whose grid
    gradient it computes, one corner row: the one no earlier output row touched (lead_row).
    Row 3 (depth + 1, height + 1) on a grid near the identity; on each axis whose coordinates
    fall along the output, the lower row.  Each axis is judged alone: a tie (one output plane
    or one output line along H) or NaN at its probes keeps its upper row.  A view with
    negative strides is probed where it points, only batch item 0 counts, and every storage
    type and kernel module gives the same row."""
    _, q, _ = _case(2, 8, (6, 6, 6), (5, 6, 7), seed=3, spread=None)
    flips = {(): 3, (1,): 2, (2,): 1, (1, 2): 0}
    for module in kernel_modules(need_simd=False):
        for axes, row in flips.items():
            f = q.copy()
            for a in axes:
                f[..., a] *= -1
            for dt in (np.float64, np.float32):
                assert module.backward_lead_row(f.astype(dt)) == row, (axes, dt)
            for dtype, kind in (("float16", 0), ("bfloat16", 1)):
                bits = f.astype(np_dtype(dtype)).view(np.uint16)
                assert module.backward_lead_row(bits, kind) == row, (axes, dtype)
            # the same points reversed along depth and height by the view, not the values
            assert module.backward_lead_row(f[:, ::-1, ::-1]) == 3 - row, axes
            g = f.copy()
            g[1] = q[1, ::-1, ::-1]
            assert module.backward_lead_row(g) == row, axes
            # one axis tied (a single plane, a single line along H) or NaN at its probes: that
            # axis's upper row, the other axis as before
            assert module.backward_lead_row(f[:, :1]) == row | 2, axes
            assert module.backward_lead_row(f[:, :, :1]) == row | 1, axes
            h = f.copy()
            h[0, 2, -1, 3, 1] = np.nan                  # the far end of the height probe
            assert module.backward_lead_row(h) == row | 1, axes
            h = f.copy()
            h[0, 0, 3, 3, 2] = np.nan                   # the near end of the depth probe
            assert module.backward_lead_row(h) == row | 2, axes
        assert module.backward_lead_row(np.zeros((1, 4, 4, 4, 3), np.float32)) == 3
        assert module.backward_lead_row(np.full((1, 4, 4, 4, 3), np.nan)) == 3
        assert module.backward_lead_row(np.zeros((1, 0, 4, 4, 3), np.float32)) == 3


@pytest.mark.parametrize("flip", [(), (1,), (2,), (1, 2)])
def test_flipped_grids_give_the_tile_loops_bits(flip):
    """A grid near the identity, flipped in height and/or depth (each lead_row), with 64
    output points per plane: every tile lies in one output plane, so NDHWC into a dense
    input_grad takes gs3d_backward_rows with that row prefetched (fewer output points than a
    quarter of the voxels: no split of the points), and so does the grid gradient alone; a
    strided input_grad takes the tile loop.  The same bits, at 1, 2 and 3 threads, and the
    reference's values."""
    x, q, go = _case(2, 16, (40, 8, 8), (8, 8, 8), seed=11, spread=None)
    for a in flip:
        q[..., a] *= -1
    xl, gl = to_layout(x, "NDHWC"), to_layout(go, "NDHWC")
    assert gs3d._kernels.backward_lead_row(q) == 3 - sum(flip)
    for cfg in CFGS:
        for nt in (1, 2, 3):
            dense = gs3d.grid_sample_3d_backward(gl, xl, q, layout="NDHWC", num_threads=nt,
                                                 **cfg)
            tiles = gs3d.grid_sample_3d_backward(gl, xl, q, layout="NDHWC", num_threads=nt,
                                                 input_grad=_strided(np.zeros(xl.shape,
                                                                              np.float32)),
                                                 **cfg)
            alone = gs3d.grid_sample_3d_backward(gl, xl, q, layout="NDHWC", num_threads=nt,
                                                 output_mask=(False, True), **cfg)
            assert all(same_bits(a, b) for a, b in zip(dense, tiles)), (cfg, nt)
            assert same_bits(alone[1], dense[1]), (cfg, nt)
        _check_reference((np.moveaxis(dense[0], 4, 1), dense[1]), x, q, go, cfg)
