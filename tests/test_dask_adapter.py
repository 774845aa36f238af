"""gs3d.dask on a real distributed.LocalCluster (2 worker processes x 1 thread, loopback)."""
import numpy as np
import pytest

da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")
gd = pytest.importorskip("gs3d.dask")

import gs3d  # noqa: E402
from conftest import TOLERANCE, np_dtype, rel_err, to_layout  # noqa: E402


@pytest.fixture(scope="module")
def client():
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                       host="127.0.0.1", dashboard_address=None,
                                       silence_logs=40)
    try:
        with distributed.Client(cluster, timeout="60s") as c:
            c.wait_for_workers(2, timeout=60)
            yield c
    finally:
        cluster.close(timeout=30)


def _problem(dtype="float64", layout="NCDHW", seed=0, N=4, C=6):
    rng = np.random.default_rng(seed)
    dt = np_dtype(dtype)
    x = to_layout(rng.standard_normal((N, C, 5, 6, 7)), layout).astype(dt)
    grid = rng.uniform(-1.1, 1.1, (N, 3, 4, 5, 3)).astype(dt)
    go = to_layout(rng.standard_normal((N, C, 3, 4, 5)), layout).astype(dt)
    return x, grid, go


def _chunks(layout, n, c):
    return {0: n, (4 if layout == "NDHWC" else 1): c}


@pytest.mark.parametrize("layout", ["NCDHW", "NDHWC"])
@pytest.mark.parametrize("dtype", ["float64", "float32", "float16"])
def test_batch_chunks_equal_in_memory(client, layout, dtype):
    x, grid, go = _problem(dtype, layout)
    kw = dict(mode="bilinear", padding_mode="reflection", align_corners=False, layout=layout)
    X = da.from_array(x, chunks=_chunks(layout, 1, -1))
    Q = da.from_array(grid, chunks={0: 2, 1: 2})          # other batch chunks, split D_out
    G = da.from_array(go, chunks=_chunks(layout, 1, -1))
    out, dx, dg = client.compute([gd.grid_sample_3d(X, Q, **kw),
                                  *gd.grid_sample_3d_backward(G, X, Q, **kw)], sync=True)
    np.testing.assert_array_equal(out, gs3d.grid_sample_3d(x, grid, **kw))
    want_dx, want_dg = gs3d.grid_sample_3d_backward(go, x, grid, **kw)
    np.testing.assert_array_equal(dx, want_dx)
    np.testing.assert_array_equal(dg, want_dg)


@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16"])
def test_channel_chunks(client, dtype):
    """Forward and input gradient are exact per channel block; the grid gradient adds partial
    sums over channel blocks, so it equals the in-memory call to rounding."""
    x, grid, go = _problem(dtype, seed=1)
    kw = dict(mode="bilinear", padding_mode="border", align_corners=True)
    X = da.from_array(x, chunks=_chunks("NCDHW", 2, 2))
    G = da.from_array(go, chunks=_chunks("NCDHW", 1, 3))   # unified with X's chunks
    out, dx, dg = client.compute([gd.grid_sample_3d(X, grid, **kw),
                                  *gd.grid_sample_3d_backward(G, X, grid, **kw)], sync=True)
    np.testing.assert_array_equal(out, gs3d.grid_sample_3d(x, grid, **kw))
    want_dx, want_dg = gs3d.grid_sample_3d_backward(go, x, grid, **kw)
    np.testing.assert_array_equal(dx, want_dx)
    assert dg.dtype == want_dg.dtype
    tol = {"float64": 1e-14, "float32": 1e-6}.get(dtype, TOLERANCE[dtype])
    assert rel_err(dg, want_dg) <= tol


def test_output_mask_and_nearest(client):
    x, grid, go = _problem(seed=2)
    X, G = da.from_array(x, chunks={0: 1}), da.from_array(go, chunks={0: 1})
    dx, dg = gd.grid_sample_3d_backward(G, X, grid, mode="nearest", output_mask=(True, False))
    assert dg is None
    np.testing.assert_array_equal(client.compute(dx, sync=True), gs3d.grid_sample_3d_backward(
        go, x, grid, mode="nearest", output_mask=(True, False))[0])
    with pytest.raises(gs3d.GridSamplerError, match="batch size"):
        gd.grid_sample_3d(X, grid[:1])                     # checked before any task runs


def test_tasks_use_the_threads_the_worker_grants(client):
    # inside a task on a worker: one kernel thread per worker thread, unless asked otherwise
    assert client.submit(gd._task_threads, None, pure=False).result() == 1
    assert client.submit(gd._task_threads, 3, pure=False).result() == 3
    # a different kernel thread count changes nothing in the result (gs3d is deterministic)
    x, grid, go = _problem(seed=3, N=2)
    X = da.from_array(x, chunks={0: 1})
    got = client.compute(gd.grid_sample_3d(X, grid, num_threads=2), sync=True)
    np.testing.assert_array_equal(got, gs3d.grid_sample_3d(x, grid))
