"""The compiled kernels against the worked example, the float64 reference (exhaustive product of
options on small odd shapes), PyTorch (random cases) and finite differences of the forward."""
import itertools
import subprocess
import zlib
import sys

import numpy as np
import pytest

import gs3d
from gs3d import reference as ref

from conftest import (DTYPES, LAYOUTS, MODES, PADDINGS, TOLERANCE, check_by_finite_differences,
                      from_layout, kernel_modules, np_dtype, rel_err, to_layout)

WORKED = dict(
    x=np.arange(1, 10).reshape(1, 1, 1, 3, 3),
    grid=np.array([-1, -1, 0, -1, 1, -1, -1, 0, 0, 0, 1, 0]).reshape(1, 1, 2, 2, 3),
    grad=np.ones((1, 1, 1, 2, 2)),
    input_grad=[0.25, 0, 0, 0.5, 0, 0, 0.125, 0.5, 0],
    grid_grad=[0.75, 0.75, -0.125, 2.625, -2.625, 0.875, 6.0, 2.25, -1.0, 0.75, -12.0, -2.0],
    out=[0.25, 0.875, 2.0, 4.0],
)


# ---------------------------------------------------------------------------------------------
# 1. the worked example of the operator page
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_worked_example(dtype, layout):
    dt = np_dtype(dtype)
    x = to_layout(WORKED["x"].astype(dt), layout)
    grid = WORKED["grid"].astype(dt)
    grad = to_layout(WORKED["grad"].astype(dt), layout)
    dx, dgrid = gs3d.grid_sample_3d_backward(grad, x, grid, mode=0, padding_mode=0,
                                             align_corners=False, output_mask=(True, True),
                                             layout=layout)
    out = gs3d.grid_sample_3d(x, grid, layout=layout)
    assert dx.dtype == dt and dgrid.dtype == dt and out.dtype == dt
    # every value of the example is exactly representable, even in bfloat16
    assert from_layout(dx, layout).astype(np.float64).ravel().tolist() == WORKED["input_grad"]
    assert dgrid.astype(np.float64).ravel().tolist() == WORKED["grid_grad"]
    assert from_layout(out, layout).astype(np.float64).ravel().tolist() == WORKED["out"]


def test_demo_prints_the_worked_example():
    proc = subprocess.run([sys.executable, "-m", "gs3d", "demo"], capture_output=True,
                          text=True, check=True)
    lines = {ln.split(":")[0].strip(): ln.split(":", 1)[1].split() for ln in
             proc.stdout.splitlines() if ":" in ln and not ln.startswith("acl")}
    assert [float(v) for v in lines["input_grad"]] == WORKED["input_grad"]
    assert [float(v) for v in lines["grid_grad"]] == WORKED["grid_grad"]
    assert [float(v) for v in lines["forward"]] == WORKED["out"]


# ---------------------------------------------------------------------------------------------
# 2. against the float64 reference: every option, every dtype, small odd shapes
# ---------------------------------------------------------------------------------------------

SIZES = (1, 2, 3, 5, 7)
MASKS = ((True, True), (True, False), (False, True))


def _case(rng, sizes, C, dtype, layout, reach):
    """Random inputs rounded to ``dtype``; returns (kernel args, float64 NCDHW copies)."""
    D, H, W, Do, Ho, Wo = sizes
    N = 2
    dt = np_dtype(dtype)
    x = rng.standard_normal((N, C, D, H, W)).astype(dt)
    grad = rng.standard_normal((N, C, Do, Ho, Wo)).astype(dt)
    grid = rng.uniform(-1.0, 1.0, (N, Do, Ho, Wo, 3)) * rng.choice([1.05, 1.5, reach],
                                                                   (N, Do, Ho, Wo, 1))
    grid = grid.astype(dt)
    return ((to_layout(grad, layout), to_layout(x, layout), grid),
            tuple(a.astype(np.float64) for a in (grad, x, grid)))


OPTION_PRODUCT = list(itertools.product(MODES, PADDINGS, (False, True), LAYOUTS, DTYPES))


@pytest.mark.parametrize("mode,padding,align,layout,dtype", OPTION_PRODUCT)
def test_against_reference(mode, padding, align, layout, dtype):
    rng = np.random.default_rng(zlib.crc32(repr((mode, padding, align, layout, dtype)).encode()))
    tol = TOLERANCE[dtype]
    for i in range(3):
        # cycle the sizes 1, 2, 3, 5, 7 through the six spatial axes
        sizes = tuple(SIZES[(i + 2 * j + len(mode)) % 5] for j in range(6))
        C = (1, 3, 4)[i]
        (grad, x, grid), (grad64, x64, grid64) = _case(rng, sizes, C, dtype, layout, 3.0)
        opts = dict(mode=mode, padding_mode=padding, align_corners=align)
        want_out = ref.grid_sample_3d(x64, grid64, **opts)
        out = gs3d.grid_sample_3d(x, grid, layout=layout, **opts)
        assert out.dtype == x.dtype
        assert rel_err(from_layout(out, layout), want_out) <= tol
        want_dx, want_dg = ref.grid_sample_3d_backward(grad64, x64, grid64, **opts)
        for mask in MASKS:
            dx, dg = gs3d.grid_sample_3d_backward(grad, x, grid, layout=layout,
                                                  output_mask=mask, **opts)
            assert (dx is None) == (not mask[0]) and (dg is None) == (not mask[1])
            if mask[0]:
                assert dx.dtype == x.dtype and dx.shape == x.shape
                assert rel_err(from_layout(dx, layout), want_dx) <= tol, ("dx", sizes, C, mask)
            if mask[1]:
                assert dg.dtype == x.dtype and dg.shape == grid.shape
                assert rel_err(dg, want_dg) <= tol, ("dgrid", sizes, C, mask)
                if mode == "nearest":
                    assert not np.any(dg.astype(np.float64))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_rounds_once(dtype):
    """Many points accumulate into one voxel: a float16/bfloat16 accumulator would drift far
    from the float64 result; one rounding at the end stays within SPEC's tolerance."""
    dt = np_dtype(dtype)
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, 2, 2, 2, 2)).astype(dt)
    grid = rng.uniform(-0.2, 0.2, (1, 20, 20, 20, 3)).astype(dt)
    grad = rng.uniform(0.5, 1.0, (1, 2, 20, 20, 20)).astype(dt)
    want_dx, want_dg = ref.grid_sample_3d_backward(*(a.astype(np.float64) for a in (grad, x, grid)))
    dx, dg = gs3d.grid_sample_3d_backward(grad, x, grid)
    assert rel_err(dx, want_dx) <= TOLERANCE[dtype]
    assert rel_err(dg, want_dg) <= TOLERANCE[dtype]
    # each element is the float64 value rounded once: within half a unit in the last place of
    # the storage format (plus the float32 accumulation error), which a 16-bit accumulator
    # summing ~1000 contributions per voxel would miss by many units
    want = want_dx[want_dx != 0]
    got = dx.astype(np.float64)[want_dx != 0]
    ulp = 2.0 ** (np.floor(np.log2(np.abs(want))) - (10 if dtype == "float16" else 7))
    assert np.all(np.abs(got - want) <= 0.5 * ulp + 1e-5 * np.abs(want))


# ---------------------------------------------------------------------------------------------
# 3. against PyTorch on random cases
# ---------------------------------------------------------------------------------------------

# C = 5 everywhere; C = 16 for float32 (the AVX2 build's channels-last loop in C for multiples
# of 8 channels, gs3d_backward_cl_avx2)
TORCH_CASES = ([c + (5,) for c in itertools.product(MODES, PADDINGS, (False, True), LAYOUTS,
                                                     ("float64", "float32"))]
               + [c + ("float32", 16) for c in itertools.product(MODES, PADDINGS, (False, True),
                                                                 LAYOUTS)])


@pytest.mark.parametrize("mode,padding,align,layout,dtype,C", TORCH_CASES)
def test_against_torch(mode, padding, align, layout, dtype, C):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(zlib.crc32(repr(("torch", mode, padding, align, layout, dtype)
                                                 + ((C,) if C != 5 else ())).encode()))
    N, D, H, W, Do, Ho, Wo = 2, 9, 6, 11, 7, 8, 5
    dt = np.dtype(dtype)
    x = rng.standard_normal((N, C, D, H, W)).astype(dt)
    grad = rng.standard_normal((N, C, Do, Ho, Wo)).astype(dt)
    grid = rng.uniform(-1.4, 1.4, (N, Do, Ho, Wo, 3)).astype(dt)
    tx, tg, tq = (torch.from_numpy(a) for a in (x, grad, grid))
    mi, pi = MODES.index(mode), PADDINGS.index(padding)
    want_out = torch.nn.functional.grid_sample(tx, tq, mode=mode, padding_mode=padding,
                                               align_corners=align).numpy()
    want_dx, want_dg = (t.numpy() for t in torch.ops.aten.grid_sampler_3d_backward(
        tg, tx, tq, mi, pi, align, [True, True]))
    tol = 1e-12 if dtype == "float64" else 1e-5
    for threads in (1, 2):
        opts = dict(mode=mode, padding_mode=padding, align_corners=align, layout=layout,
                    num_threads=threads)
        out = gs3d.grid_sample_3d(to_layout(x, layout), grid, **opts)
        dx, dg = gs3d.grid_sample_3d_backward(to_layout(grad, layout), to_layout(x, layout),
                                              grid, **opts)
        assert rel_err(from_layout(out, layout), want_out) <= tol
        assert rel_err(from_layout(dx, layout), want_dx) <= tol
        assert rel_err(dg, want_dg) <= tol


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_against_torch_float64(dtype):
    """Halves are compared with PyTorch in float64 on the same rounded inputs."""
    torch = pytest.importorskip("torch")
    dt = np_dtype(dtype)
    rng = np.random.default_rng(11)
    x = rng.standard_normal((2, 6, 8, 7, 9)).astype(dt)
    grad = rng.standard_normal((2, 6, 6, 5, 7)).astype(dt)
    grid = rng.uniform(-1.2, 1.2, (2, 6, 5, 7, 3)).astype(dt)
    tx, tg, tq = (torch.from_numpy(a.astype(np.float64)) for a in (x, grad, grid))
    want_dx, want_dg = (t.numpy() for t in torch.ops.aten.grid_sampler_3d_backward(
        tg, tx, tq, 0, 0, False, [True, True]))
    dx, dg = gs3d.grid_sample_3d_backward(grad, x, grid)
    assert rel_err(dx, want_dx) <= TOLERANCE[dtype]
    assert rel_err(dg, want_dg) <= TOLERANCE[dtype]


# ---------------------------------------------------------------------------------------------
# 4. finite differences of the forward (float64, trilinear)
# ---------------------------------------------------------------------------------------------

def _grid_away_from_faces(rng, shape_in, out_shape, padding, align):
    """Normalised coordinates whose source positions sit inside voxels, away from faces, clip
    limits and reflection folds; reflection also gets points mirrored outside [-1, 1]."""
    D, H, W = shape_in
    comps = []
    for size in (W, H, D):
        cells = rng.integers(0, max(size - 1, 1), out_shape)
        u = cells + rng.uniform(0.15, 0.85, out_shape)
        if padding == "zeros":
            u = u + rng.choice([0.0, -1.0, 1.0], out_shape) * (size > 1)   # some half-outside
        if padding == "reflection":
            lo, span = (0.0, size - 1.0) if align else (-0.5, float(size))
            flip = rng.random(out_shape) < 0.5
            u = np.where(flip, 2 * lo - u, u)                              # mirrored about lo
            u = np.where(rng.random(out_shape) < 0.3, u + 2 * span, u)     # one period further
        g = 2 * u / (size - 1) - 1 if align else (2 * u + 1) / size - 1
        comps.append(g)
    return np.stack(comps, axis=-1)


@pytest.mark.parametrize("padding", PADDINGS)
@pytest.mark.parametrize("align", (False, True))
def test_finite_differences(padding, align):
    rng = np.random.default_rng(PADDINGS.index(padding) * 2 + align)
    N, C, D, H, W = 2, 3, 4, 5, 6
    out_shape = (N, 3, 4, 2)
    x = rng.standard_normal((N, C, D, H, W))
    grid = _grid_away_from_faces(rng, (D, H, W), out_shape, padding, align)
    grad = rng.standard_normal((N, C) + out_shape[1:])
    opts = dict(padding_mode=padding, align_corners=align)
    dx, dg = gs3d.grid_sample_3d_backward(grad, x, grid, **opts)

    def loss(xv, gv):
        return float(np.sum(grad * gs3d.grid_sample_3d(xv, gv, **opts)))

    check_by_finite_differences(loss, x, grid, dx, dg, rng)


# ---------------------------------------------------------------------------------------------
# 5. inputs large enough for the kernels to prefetch (PREFETCH_FWD_MIN_KIB and
#    PREFETCH_BWD_MIN_KIB in _kernels.pyx: over 16 MiB per batch item at 4 bytes a value);
#    the other tests run with the prefetch off but for float64's backward, which prefetches
#    from 1.5 MiB (PREFETCH_BWD_MIN_KIB_F64).  Few output points keep the checks cheap.
# ---------------------------------------------------------------------------------------------

PREFETCH_CASES = [(16, 66), (4, 105), (1, 166)]     # C, S: S^3 * C * 4 bytes > 16 MiB


def _large_case(C, S, dtype, seed):
    rng = np.random.default_rng(seed)
    dt = np_dtype(dtype)
    assert S ** 3 * C * max(dt.itemsize, 4) > 16 * 2 ** 20
    x = rng.standard_normal((1, C, S, S, S)).astype(dt)
    grid = rng.uniform(-1.05, 1.05, (1, 5, 6, 7, 3)).astype(dt)
    grad = rng.standard_normal((1, C, 5, 6, 7)).astype(dt)
    return x, grid, grad


@pytest.mark.parametrize("C,S", PREFETCH_CASES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_prefetching_inputs_against_reference(C, S, layout, dtype):
    x, grid, grad = _large_case(C, S, dtype, seed=C)
    x64, q64, g64 = (a.astype(np.float64) for a in (x, grid, grad))
    want = (ref.grid_sample_3d(x64, q64), *ref.grid_sample_3d_backward(g64, x64, q64))
    xl, gl = to_layout(x, layout), to_layout(grad, layout)
    for threads in (1, 2):
        out = gs3d.grid_sample_3d(xl, grid, layout=layout, num_threads=threads)
        dx, dg = gs3d.grid_sample_3d_backward(gl, xl, grid, layout=layout, num_threads=threads)
        for got, w in ((from_layout(out, layout), want[0]), (from_layout(dx, layout), want[1]),
                       (dg, want[2])):
            assert rel_err(got, w) <= TOLERANCE[dtype], (threads, got.shape)


def test_prefetching_inputs_against_torch():
    """PyTorch's float32 source-index arithmetic loses about S * 2^-24 of a voxel, so on these
    sizes its own error against the float64 reference grows with S (measured: 6e-6 at S = 66,
    1.5e-5 at S = 166; gs3d's stays under 2e-7, test_prefetching_inputs_against_reference):
    the tolerance scales with S from the 1e-5 the small cases use."""
    torch = pytest.importorskip("torch")
    for C, S in PREFETCH_CASES:
        tol = 1e-5 * max(1.0, S / 64)
        x, grid, grad = _large_case(C, S, "float32", seed=10 + C)
        tx, tg, tq = (torch.from_numpy(a) for a in (x, grad, grid))
        want_dx, want_dg = (t.numpy() for t in torch.ops.aten.grid_sampler_3d_backward(
            tg, tx, tq, 0, 0, False, [True, True]))
        want_out = torch.nn.functional.grid_sample(tx, tq, align_corners=False).numpy()
        xl, gl = to_layout(x, "NDHWC"), to_layout(grad, "NDHWC")
        out = gs3d.grid_sample_3d(xl, grid, layout="NDHWC", num_threads=2)
        dx, dg = gs3d.grid_sample_3d_backward(gl, xl, grid, layout="NDHWC", num_threads=2)
        assert rel_err(from_layout(out, "NDHWC"), want_out) <= tol
        assert rel_err(from_layout(dx, "NDHWC"), want_dx) <= tol
        assert rel_err(dg, want_dg) <= tol


def test_forward_prefetch_gates():
    """The forward prefetches past PREFETCH_FWD_MIN_KIB of batch item (16 MiB at 4 bytes a
    value), and float32 with at most PREFETCH_FWD_FEW_MAX_C channels also past
    PREFETCH_FWD_FEW_MIN_KIB (48 MiB) of input, grid and output over the whole call, or
    PREFETCH_FWD_FEW_SMOOTH_MIN_KIB (32 MiB) on a grid that is not scattered, but for four
    channels."""
    for K in kernel_modules(need_simd=False):
        fp = K.forward_prefetches
        S, L = 96, 96 ** 3
        assert fp(4, 2, 4, S, S, S, L)                # 74 MiB call of 13.5 MiB items
        assert not fp(4, 1, 4, S, S, S, L)            # 37 MiB
        assert fp(4, 3, 7, 64, 64, 64, 2 ** 18)       # 51 MiB call of 7 MiB items
        assert not fp(4, 3, 8, 64, 64, 64, 2 ** 18)   # eight channels: the item gate alone
        assert not fp(8, 3, 4, 64, 64, 64, 2 ** 18)   # float64: 8 MiB items, 66 MiB call
        assert not fp(2, 4, 4, 96, 96, 96, L)         # 16-bit: 13.5 MiB items at 4 bytes, 74 MiB
        assert fp(4, 5, 4, 64, 64, 64, 2 ** 18)       # float32: 4 MiB items, 55 MiB call
        assert fp(8, 1, 4, 84, 84, 84, 1)             # the item gate: 18 MiB of float64
        assert fp(2, 1, 4, 105, 105, 105, 1)          # 17 MiB at 4 bytes a value
        assert fp(4, 1, 16, 66, 66, 66, 1) and not fp(4, 1, 16, 64, 64, 64, 1)
        # the call gate's edge: 48 MiB of input does not pass, with 64 points (7 KiB) more it
        # does
        assert not fp(4, 12, 4, 64, 64, 64, 0)
        assert fp(4, 12, 4, 64, 64, 64, 64)
        # on a grid grid_scattered does not call scattered, from 32 MiB
        L1 = 128 ** 3
        assert fp(4, 1, 1, 128, 128, 128, L1, scattered=False)      # 40 MiB
        assert not fp(4, 1, 1, 128, 128, 128, L1)                   # scattered: 48 MiB
        assert not fp(4, 16, 2, 64, 64, 64, 0, scattered=False)     # 32 MiB does not pass,
        assert fp(4, 16, 2, 64, 64, 64, 64, scattered=False)        # 20 KiB more does
        assert fp(4, 1, 7, 64, 64, 64, 96 ** 3, scattered=False)       # 41 MiB, 7 MiB item
        assert not fp(4, 1, 8, 64, 64, 64, 96 ** 3, scattered=False)   # eight channels
        # four channels (the 128-bit loads of rows4) keep the 48 MiB gate
        assert not fp(4, 1, 4, 96, 96, 96, L, scattered=False)        # 37 MiB
        assert fp(4, 2, 4, 96, 96, 96, L, scattered=False)            # 74 MiB
        assert not fp(8, 1, 1, 128, 128, 128, L1, scattered=False)     # float64
        # float64 with a multiple of 8 channels contiguous in the caller's input, from 32 MiB
        assert fp(8, 8, 8, 32, 32, 32, 32 ** 3, in_place=True)         # 38 MiB, 2 MiB items
        assert not fp(8, 8, 8, 32, 32, 32, 32 ** 3)                    # a channels-last copy
        assert not fp(8, 16, 4, 32, 32, 32, 32 ** 3, in_place=True)    # four channels, 44 MiB
        assert not fp(4, 16, 8, 32, 32, 32, 32 ** 3, in_place=True)    # float32, 38 MiB
        assert not fp(8, 8, 8, 64, 32, 32, 0, in_place=True)           # 32 MiB does not pass,
        assert fp(8, 8, 8, 64, 32, 32, 64, in_place=True)              # 44 KiB more does


@pytest.mark.parametrize("layout", LAYOUTS)
def test_forward_prefetching_call_against_reference(layout):
    """Few channels in a call past PREFETCH_FWD_FEW_MIN_KIB, batch items under the item gate:
    thirteen 4 MiB items (few points: no channels-last copy), at one and two threads; one of
    them alone (a 4 MiB call, under both gates: no hints) gives the same bits."""
    rng = np.random.default_rng(21)
    N, C, S = 13, 4, 64
    assert gs3d._kernels.forward_prefetches(4, N, C, S, S, S, 5 * 6 * 7)
    x = rng.standard_normal((N, C, S, S, S), dtype=np.float32)
    grid = rng.uniform(-1.05, 1.05, (N, 5, 6, 7, 3)).astype(np.float32)
    want = ref.grid_sample_3d(x.astype(np.float64), grid.astype(np.float64))
    xl = to_layout(x, layout)
    for threads in (1, 2):
        out = gs3d.grid_sample_3d(xl, grid, layout=layout, num_threads=threads)
        assert rel_err(from_layout(out, layout), want) <= TOLERANCE["float32"], threads
    one = gs3d.grid_sample_3d(xl[4:5], grid[4:5], layout=layout, num_threads=2)
    assert np.array_equal(one, out[4:5])


def test_forward_prefetching_smooth_call_against_its_halves():
    """One channel of 128^3 sampled on a smooth grid at 128^3 points: a 40 MiB call past
    PREFETCH_FWD_FEW_SMOOTH_MIN_KIB (grid_scattered finds the grid smooth), at one and two
    threads; each half of its points alone (24 MiB: no hints) gives the same bits, and a
    sample of points the float64 reference's values."""
    rng = np.random.default_rng(23)
    S = 128
    assert gs3d._kernels.forward_prefetches(4, 1, 1, S, S, S, S ** 3, scattered=False)
    assert not gs3d._kernels.forward_prefetches(4, 1, 1, S, S, S, S ** 3 // 2,
                                                scattered=False)
    x = rng.standard_normal((1, 1, S, S, S), dtype=np.float32)
    t = (np.arange(S) * 2 + 1) / S - 1
    zz, yy, xx = np.meshgrid(t, t, t, indexing="ij")
    c, s = np.cos(0.1), np.sin(0.1)
    grid = np.stack([c * xx - s * yy + 0.05, s * xx + c * yy, zz - 0.03], axis=-1)[None]
    grid = (grid + 0.02 * rng.standard_normal(grid.shape)).astype(np.float32)
    for threads in (1, 2):
        out = gs3d.grid_sample_3d(x, grid, num_threads=threads)
        for h in (slice(0, S // 2), slice(S // 2, S)):
            part = gs3d.grid_sample_3d(x, np.ascontiguousarray(grid[:, h]),
                                       num_threads=threads)
            assert np.array_equal(part, out[:, :, h]), (threads, h)
    pts = rng.integers(0, S, (300, 3))
    sub = np.ascontiguousarray(grid[0, pts[:, 0], pts[:, 1], pts[:, 2]]).reshape(1, 1, 1, 300, 3)
    want = ref.grid_sample_3d(x.astype(np.float64), sub.astype(np.float64))
    got = out[0, 0, pts[:, 0], pts[:, 1], pts[:, 2]]
    assert rel_err(got, want.ravel()) <= TOLERANCE["float32"]


def test_float64_forward_prefetching_call_against_its_halves():
    """float64, eight channels-last channels, eight batch items of 32^3 on a grid reaching
    past the borders: a 38 MiB call past PREFETCH_FWD_F64_MIN_KIB, at one and two threads;
    each half of its batch alone (19 MiB: no hints) gives the same bits, and a sample of
    points the reference's values."""
    rng = np.random.default_rng(24)
    N, C, S = 8, 8, 32
    assert gs3d._kernels.forward_prefetches(8, N, C, S, S, S, S ** 3, in_place=True)
    assert not gs3d._kernels.forward_prefetches(8, N // 2, C, S, S, S, S ** 3, in_place=True)
    x = rng.standard_normal((N, S, S, S, C))
    grid = rng.uniform(-1.1, 1.1, (N, S, S, S, 3))
    for threads in (1, 2):
        out = gs3d.grid_sample_3d(x, grid, layout="NDHWC", num_threads=threads)
        for h in (slice(0, N // 2), slice(N // 2, N)):
            part = gs3d.grid_sample_3d(x[h], grid[h], layout="NDHWC", num_threads=threads)
            assert np.array_equal(part, out[h]), (threads, h)
    pts = rng.integers(0, S, (200, 4))
    pts[:, 0] %= N
    for n in range(N):
        sel = pts[pts[:, 0] == n]
        sub = grid[n, sel[:, 1], sel[:, 2], sel[:, 3]].reshape(1, 1, 1, -1, 3)
        want = ref.grid_sample_3d(np.moveaxis(x[n:n + 1], 4, 1), sub)
        got = out[n, sel[:, 1], sel[:, 2], sel[:, 3]]
        assert rel_err(got, want[0, :, 0, 0].T) <= TOLERANCE["float64"], n


def test_forward_through_a_shared_copy_past_its_prefetch_gate():
    """NCDHW with eight channels and one batch item on two threads: both read one
    channels-last copy of 8 MiB, past PREFETCH_FWD_SHARED_MIN_KIB, where the forward
    prefetches from it.  The copy gives the NDHWC layout's bits."""
    rng = np.random.default_rng(22)
    C, S, So = 8, 64, 41                  # So^3 * 4 >= S^3: the channels-last copy pays
    assert gs3d._kernels.channels_last_pays(C, S, S, S, So ** 3)
    x = rng.standard_normal((1, C, S, S, S), dtype=np.float32)
    grid = rng.uniform(-1.05, 1.05, (1, So, So, So, 3)).astype(np.float32)
    plan = gs3d.plan_forward(x.shape, grid.shape, np.float32, num_threads=2)
    assert plan._res.xcl.size == x[0].size          # the copy both threads read
    out = plan(x, grid)
    cl = gs3d.grid_sample_3d(to_layout(x, "NDHWC"), grid, layout="NDHWC", num_threads=1)
    assert np.array_equal(out, from_layout(cl, "NDHWC"))
    want = ref.grid_sample_3d(x.astype(np.float64), grid.astype(np.float64))
    assert rel_err(out, want) <= TOLERANCE["float32"]


def test_prefetching_inputs_by_finite_differences():
    rng = np.random.default_rng(5)
    C, S = 4, 84                        # float64: 84^3 * 4 * 8 bytes > 16 MiB
    x = rng.standard_normal((1, C, S, S, S))
    out_shape = (1, 3, 4, 5)
    grid = _grid_away_from_faces(rng, (S, S, S), out_shape, "zeros", False)
    grad = rng.standard_normal((1, C) + out_shape[1:])
    dx, dg = gs3d.grid_sample_3d_backward(grad, x, grid, num_threads=2)

    def loss(xv, gv):
        return float(np.sum(grad * gs3d.grid_sample_3d(xv, gv, num_threads=2)))

    check_by_finite_differences(loss, x, grid, dx, dg, rng)
