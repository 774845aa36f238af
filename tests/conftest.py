"""Shared helpers of the gs3d tests."""
import numpy as np
import pytest

MODES = ("bilinear", "nearest")
PADDINGS = ("zeros", "border", "reflection")
LAYOUTS = ("NCDHW", "NDHWC")
DTYPES = ("float64", "float32", "float16", "bfloat16")

# SPEC, Precision: largest abs difference over the oracle's largest magnitude
TOLERANCE = {"float64": 1e-12, "float32": 1e-5, "float16": 1e-3, "bfloat16": 8e-3}


def np_dtype(name):
    if name == "bfloat16":
        ml_dtypes = pytest.importorskip("ml_dtypes")
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def to_layout(a, layout):
    """An NCDHW array in the given layout (a copy for NDHWC)."""
    return a if layout == "NCDHW" else np.ascontiguousarray(np.moveaxis(a, 1, 4))


def from_layout(a, layout):
    """Back to NCDHW axis order (a view)."""
    return a if layout == "NCDHW" else np.moveaxis(a, 4, 1)


def rel_err(got, want):
    """max |got - want| / max(|want|), with NaNs required at the same places."""
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape
    assert np.array_equal(np.isnan(got), np.isnan(want)), "NaN positions differ"
    fin = np.isfinite(want)
    assert np.array_equal(got[~fin], want[~fin]), "non-finite values differ"
    if not fin.any():
        return 0.0
    scale = max(np.abs(want[fin]).max(), np.finfo(np.float64).tiny)
    return float(np.abs(got[fin] - want[fin]).max() / scale)


def same_bits(a, b):
    """Both None, or the same shape and the same bytes (NaN payloads and signed zeros
    included), whatever the strides."""
    return (a is None and b is None) or (a is not None and b is not None
                                         and a.shape == b.shape and np.array_equal(
                                             np.ascontiguousarray(a).view(np.uint8),
                                             np.ascontiguousarray(b).view(np.uint8)))


def kernel_modules(need_simd=True):
    """The baseline kernel module, then every SIMD variant this CPU runs: AVX2, and AVX-512
    where the CPU has it (skips where the AVX2 one cannot run, unless ``need_simd`` is False:
    then the baseline alone).  Cross-build tests compare each variant with the baseline."""
    from gs3d import _kernels
    try:
        from gs3d import _kernels_avx2
    except ImportError:
        if not need_simd:
            return [_kernels]
        pytest.skip("the AVX2 variant is not built on this platform")
    if not _kernels.cpu_has_avx2():
        if not need_simd:
            return [_kernels]
        pytest.skip("this CPU lacks AVX2/FMA/F16C")
    modules = [_kernels, _kernels_avx2]
    if _kernels.cpu_has_avx512():
        from gs3d import _kernels_avx512
        modules.append(_kernels_avx512)
    return modules


def run_with(module, fn):
    """fn() with gs3d's kernels taken from ``module`` (the call cache is cleared on both sides:
    its scratch sets hold runners of the module that made them)."""
    from gs3d import _api
    saved = _api._kernels
    _api.clear_cache()
    _api._kernels = module
    try:
        return fn()
    finally:
        _api._kernels = saved
        _api.clear_cache()


@pytest.fixture(autouse=True)
def _requested_threads_on_small_shapes(monkeypatch):
    """gs3d runs small calls on fewer threads than requested (one per _WORK_PER_THREAD
    point-channels); the tests' shapes are small, so here every point-channel counts as a
    thread's worth and calls get the threads they ask for, up to one per point-channel
    (test_small_calls_use_fewer_threads checks the real rule; scripts run in subprocesses set
    the same value themselves)."""
    from gs3d import _api
    monkeypatch.setattr(_api, "_WORK_PER_THREAD", 1)
    _api.clear_cache()
    yield
    _api.clear_cache()


def check_by_finite_differences(loss, x, grid, dx, dg, rng):
    """float64 gradients of ``loss(x, grid)`` (sum(grad_output * forward)) against central
    differences: ``dx`` along three random directions (the forward is linear in the input, so
    the difference is exact up to rounding), ``dg`` per coordinate at 12 sampled grid
    points (the grid must keep clear of the kinks: integer coordinates, faces)."""
    h = 1e-3
    for _ in range(3):
        v = rng.standard_normal(x.shape)
        fd = (loss(x + h * v, grid) - loss(x - h * v, grid)) / (2 * h)
        assert abs(fd - np.sum(dx * v)) <= 1e-9 * max(1.0, abs(fd))
    h = 1e-6
    flat = grid.reshape(-1, 3)
    dflat = dg.reshape(-1, 3)
    for p in rng.choice(flat.shape[0], 12, replace=False):
        for a in range(3):
            gp, gm = flat.copy(), flat.copy()
            gp[p, a] += h
            gm[p, a] -= h
            fd = (loss(x, gp.reshape(grid.shape)) - loss(x, gm.reshape(grid.shape))) / (2 * h)
            assert abs(fd - dflat[p, a]) <= 1e-6 * max(1.0, abs(fd)), (p, a, fd, dflat[p, a])
