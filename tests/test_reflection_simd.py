"""Reflection padding in the vectorised mapping (gs3d_map4, and through it the AVX-512 build's
gs3d_axis8): float32 and 16-bit grids at a fixed point step take the SIMD kernels under every
padding, and reflection there must give the bits of the scalar mapping (map_coord), which a
grid whose points are not at one fixed step still takes.  The coordinates reach far outside
[-1, 1] (many reflections), land exactly on the mirror edges, are huge (the fold's exact
shortcut stops at 2^52; those lanes take fmod itself), infinite, NaN, signed zeros and
subnormals; axes of one voxel (align_corners: nothing to reflect) and two.  SPEC "Padding"."""
import numpy as np
import pytest

import gs3d
from gs3d import reference as ref

from conftest import TOLERANCE, np_dtype, rel_err, same_bits as same

HALF_AND_SINGLE = ["float32", "float16", "bfloat16"]


def coords(rng, n, size):
    """Normalised coordinates of many kinds (``size``: the axis they are for)."""
    kind = rng.integers(0, 7, n)
    v = rng.uniform(-1.1, 1.1, n)
    v = np.where(kind == 1, rng.uniform(-60, 60, n), v)
    # mirror edges: u - lo a whole multiple of the span, for both align_corners
    edge = rng.integers(-30, 30, n)
    v = np.where(kind == 2, 2.0 * edge / max(size - 1, 1) - 1.0, v)
    v = np.where(kind == 3, 2.0 * edge / size - 1.0, v)
    v = np.where(kind == 4, rng.choice([-1, 1], n) * 10.0 ** rng.uniform(6, 36, n), v)
    v = np.where(kind == 5, rng.choice([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, -1e-45,
                                        3.0e38, -3.0e38], n), v)
    return v


def grids(dtype, shape, sizes, seed):
    """The same grid twice: contiguous (points at one step: the SIMD kernels) and as a view
    whose rows are not at a fixed step from each other (the scalar mapping)."""
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    q = np.stack([coords(rng, n, s) for s in sizes], -1).reshape(shape + (3,))
    with np.errstate(over="ignore"):
        q = q.astype(np_dtype(dtype))
    room = np.zeros(shape[:3] + (shape[3] + 1, 3), q.dtype)
    view = room[:, :, :, :shape[3]]
    view[...] = q
    assert not view.flags.c_contiguous
    return q, view


CASES = [((1, 1, 2), (1, 3, 5, 9)), ((7, 5, 3), (2, 4, 6, 11)), ((2, 9, 6), (1, 6, 7, 13))]


@pytest.mark.parametrize("dtype", HALF_AND_SINGLE)
@pytest.mark.parametrize("align", [False, True])
@pytest.mark.parametrize("C", [1, 3, 8])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_vectorised_reflection_matches_the_scalar_mapping(dtype, align, C, case):
    (D, H, W), qshape = CASES[case]
    N = qshape[0]
    q, qv = grids(dtype, qshape, (W, H, D), seed=100 * case + C + (1000 if align else 0))
    rng = np.random.default_rng(case + C)
    dt = np_dtype(dtype)
    x = rng.standard_normal((N, D, H, W, C)).astype(dt)
    go = rng.standard_normal((N,) + qshape[1:] + (C,)).astype(dt)
    kw = dict(padding_mode="reflection", align_corners=align, layout="NDHWC")
    for nt in (1, 2):
        assert same(gs3d.grid_sample_3d(x, q, num_threads=nt, **kw),
                    gs3d.grid_sample_3d(x, qv, num_threads=nt, **kw)), nt
        for mask in ((True, True), (False, True), (True, False)):
            # a strided input_grad: depth slabs, in-order sums, whichever grid
            bufs = [np.zeros(x.shape[:4] + (2 * C,), dt)[..., ::2] for _ in range(2)]
            a = gs3d.grid_sample_3d_backward(go, x, q, output_mask=mask, num_threads=nt,
                                             input_grad=bufs[0] if mask[0] else None, **kw)
            b = gs3d.grid_sample_3d_backward(go, x, qv, output_mask=mask, num_threads=nt,
                                             input_grad=bufs[1] if mask[0] else None, **kw)
            for u, v in zip(a, b):
                assert same(u, v), (nt, mask)


@pytest.mark.parametrize("dtype", HALF_AND_SINGLE + ["float64"])
@pytest.mark.parametrize("align", [False, True])
@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
def test_reflection_far_outside_against_reference(dtype, align, mode):
    """Far outside the volume but finite and moderate (many reflections), against the float64
    reference (the same values, rounded to the dtype first): the vectorised mapping
    (bilinear float32 and 16-bit) and the scalar one (float64, nearest), whose fold
    (gs3d_reflect1) subtracts whole periods where it called fmod before."""
    rng = np.random.default_rng(7 if align else 8)
    dt = np_dtype(dtype)
    D, H, W, C = 6, 5, 9, 4
    q = rng.uniform(-25, 25, (1, 4, 7, 10, 3)).astype(dt)
    x = rng.standard_normal((1, C, D, H, W)).astype(dt)
    go = rng.standard_normal((1, C, 4, 7, 10)).astype(dt)
    kw = dict(mode=mode, padding_mode="reflection", align_corners=align)
    f = gs3d.grid_sample_3d(x, q, **kw)
    dx, dg = gs3d.grid_sample_3d_backward(go, x, q, **kw)
    r64 = [a.astype(np.float64) for a in (go, x, q)]
    assert rel_err(f, ref.grid_sample_3d(r64[1], r64[2], **kw)) <= TOLERANCE[dtype]
    rdx, rdg = ref.grid_sample_3d_backward(*r64, **kw)
    assert rel_err(dx, rdx) <= TOLERANCE[dtype]
    # the grid gradient jumps at mirror edges; a sample this size lands on none of them
    assert rel_err(dg, rdg) <= TOLERANCE[dtype]
