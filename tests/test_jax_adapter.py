"""gs3d.jax: custom_vjp over pure_callback, under jit, grad and vmap."""
import numpy as np
import pytest

jax = pytest.importorskip("jax")
gj = pytest.importorskip("gs3d.jax")
from jax.test_util import check_grads  # noqa: E402

import gs3d  # noqa: E402
from conftest import PADDINGS, np_dtype  # noqa: E402

SHAPE = (2, 2, 3, 4, 5)        # N, C, D, H, W
OUT = (2, 3, 2)


def _grid(rng, n, align_corners, spatial=SHAPE[2:], out=OUT):
    """Grid points whose source coordinates stay 0.1 away from every integer and half-integer
    (the kinks of trilinear sampling, border clipping and reflection), inside and outside."""
    u = []
    for size in spatial[::-1]:                       # x indexes W, y H, z D
        whole = rng.integers(-2, size + 1, (n, *out))
        u_axis = whole + rng.uniform(0.1, 0.4, (n, *out))
        g = 2 * u_axis / (size - 1) - 1 if align_corners else (2 * u_axis + 1) / size - 1
        u.append(g)
    return np.stack(u, axis=-1)


@pytest.fixture(autouse=True)
def _x64():
    with jax.enable_x64(True):
        yield


@pytest.mark.parametrize("padding_mode", PADDINGS)
@pytest.mark.parametrize("align_corners", [False, True])
def test_grad_matches_finite_differences(padding_mode, align_corners):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(SHAPE)
    grid = _grid(rng, SHAPE[0], align_corners)

    def f(a, b):
        return gj.grid_sample_3d(a, b, padding_mode=padding_mode, align_corners=align_corners)

    check_grads(f, (x, grid), order=1, modes=["rev"], eps=1e-6, atol=1e-6, rtol=1e-6)
    check_grads(jax.jit(f), (x, grid), order=1, modes=["rev"], eps=1e-6, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("layout", ["NCDHW", "NDHWC"])
def test_jit_grad_equal_numpy_call(layout):
    rng = np.random.default_rng(1)
    x = rng.standard_normal(SHAPE)
    if layout == "NDHWC":
        x = np.ascontiguousarray(np.moveaxis(x, 1, 4))
    grid = rng.uniform(-1.2, 1.2, (SHAPE[0], *OUT, 3))
    kw = dict(mode="bilinear", padding_mode="border", align_corners=False, layout=layout)
    out = jax.jit(lambda a, b: gj.grid_sample_3d(a, b, **kw))(x, grid)
    np.testing.assert_array_equal(np.asarray(out), gs3d.grid_sample_3d(x, grid, **kw))
    go = rng.standard_normal(out.shape)
    loss = jax.jit(jax.grad(lambda a, b: (gj.grid_sample_3d(a, b, **kw) * go).sum(), (0, 1)))
    dx, dgrid = loss(x, grid)
    want = gs3d.grid_sample_3d_backward(go, x, grid, **kw)
    np.testing.assert_array_equal(np.asarray(dx), want[0])
    np.testing.assert_array_equal(np.asarray(dgrid), want[1])


def test_vmap():
    rng = np.random.default_rng(2)
    xs = rng.standard_normal((3, *SHAPE))
    grids = rng.uniform(-1, 1, (3, SHAPE[0], *OUT, 3))
    f = lambda a, b: gj.grid_sample_3d(a, b, mode="nearest", padding_mode="reflection")  # noqa: E731
    out = jax.jit(jax.vmap(f))(xs, grids)
    for i in range(3):
        np.testing.assert_array_equal(np.asarray(out[i]), gs3d.grid_sample_3d(
            xs[i], grids[i], mode="nearest", padding_mode="reflection"))
    # one input, many grids; and grad inside vmap
    out = jax.vmap(f, in_axes=(None, 0))(xs[0], grids)
    np.testing.assert_array_equal(np.asarray(out[2]), np.asarray(f(xs[0], grids[2])))
    g = jax.vmap(jax.grad(lambda a, b: gj.grid_sample_3d(a, b).sum(), (0, 1)), in_axes=(0, None))
    dx, dgrid = g(xs, grids[0])
    assert dx.shape == xs.shape and dgrid.shape == (3, *grids.shape[1:])
    want = gs3d.grid_sample_3d_backward(np.ones((SHAPE[0], SHAPE[1], *OUT)), xs[1], grids[0])
    np.testing.assert_array_equal(np.asarray(dx[1]), want[0])
    np.testing.assert_array_equal(np.asarray(dgrid[1]), want[1])


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_dtypes(dtype):
    dt = np_dtype(dtype)
    rng = np.random.default_rng(3)
    x = rng.standard_normal(SHAPE).astype(dt)
    grid = rng.uniform(-1, 1, (SHAPE[0], *OUT, 3)).astype(dt)
    out = gj.grid_sample_3d(x, grid)
    assert out.dtype == dt
    np.testing.assert_array_equal(np.asarray(out), gs3d.grid_sample_3d(x, grid))
    dx, dgrid = jax.grad(lambda a, b: gj.grid_sample_3d(a, b).astype(np.float32).sum(),
                         (0, 1))(x, grid)
    assert dx.dtype == dgrid.dtype == dt


def test_invalid_call_raises_at_trace_time():
    x = np.zeros(SHAPE)
    with pytest.raises(gs3d.GridSamplerError, match="batch size"):
        gj.grid_sample_3d(x, np.zeros((1, *OUT, 3)))
    with pytest.raises(gs3d.GridSamplerError, match="padding_mode"):
        gj.grid_sample_3d(x, np.zeros((2, *OUT, 3)), padding_mode="wrap")
