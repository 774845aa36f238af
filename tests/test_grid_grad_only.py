"""The grid gradient alone (output_mask (False, True)) of float32 inputs whose channels are
contiguous (NDHWC, or NCDHW through its channels-last copy) and a multiple of 8 has its own
kernel (gs3d_grid_grad_rows: no per-tile arrays).  SPEC "Output mask" and "Determinism": it
must give bitwise the grid gradient of the call that also computes the input gradient (the
tile loop), at every thread count, for every way grad_output is laid out, and agree with the
reference.
"""
import numpy as np
import pytest

import gs3d
from gs3d import reference as ref
from conftest import TOLERANCE, rel_err, to_layout

# Wo = 13: a partial block of eight points at the end of every row of 13 (and tiles of 64
# points end mid-block); C = 72: more channels than one tile's staging holds at once
SHAPES = [(1, 8, (6, 7, 9), (5, 6, 13)), (2, 16, (4, 5, 19), (4, 5, 13)),
          (1, 72, (3, 4, 6), (3, 4, 13))]
CFGS = [dict(), dict(padding_mode="border"), dict(align_corners=True),
        dict(padding_mode="border", align_corners=True)]


def _case(N, C, in_sp, out_sp, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((N, C) + in_sp).astype(np.float32)
    go = rng.standard_normal((N, C) + out_sp).astype(np.float32)
    q = rng.uniform(-1.2, 1.2, (N,) + out_sp + (3,)).astype(np.float32)
    # coordinates on the edges, and non-finite ones (SPEC "Non-finite coordinates")
    q.reshape(-1, 3)[:5] = [[1.0, -1.0, 0.5], [np.nan, 0.0, 0.0], [np.inf, 0.1, 0.2],
                            [-np.inf, -0.3, 0.9], [0.2, 0.3, np.nan]]
    return x, q, go


def _strided(a):
    """``a`` as a view whose points are not adjacent (every other element of a buffer twice
    as wide along the last spatial axis for NCDHW, along the channel axis for NDHWC)."""
    shape = a.shape[:-1] + (2 * a.shape[-1],)
    buf = np.full(shape, np.nan, a.dtype)
    view = buf[..., ::2]
    view[...] = a
    return view


@pytest.mark.parametrize("layout", ["NCDHW", "NDHWC"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"C{s[1]}")
@pytest.mark.parametrize("strided", [False, True])
def test_grid_grad_alone_is_the_full_calls(layout, shape, strided):
    x, q, go = _case(*shape, seed=shape[1])
    xl, gl = to_layout(x, layout), to_layout(go, layout)
    if strided:
        gl = _strided(gl)
    for cfg in CFGS:
        _, want = gs3d.grid_sample_3d_backward(gl, xl, q, layout=layout, num_threads=1, **cfg)
        _, r = ref.grid_sample_3d_backward(go.astype(np.float64), x.astype(np.float64),
                                           q.astype(np.float64), **cfg)
        assert rel_err(want, r) <= TOLERANCE["float32"], cfg
        for nt in (1, 2, 3):
            _, dg = gs3d.grid_sample_3d_backward(gl, xl, q, layout=layout, num_threads=nt,
                                                 output_mask=(False, True), **cfg)
            assert np.array_equal(dg.view(np.uint32), want.view(np.uint32)), (cfg, nt)
