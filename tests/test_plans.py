"""Plans (the two-phase API), deterministic mode and thread counts."""
import numpy as np
import pytest

import gs3d
from conftest import kernel_modules, np_dtype, run_with, to_layout


def _case(rng, dtype="float32", layout="NCDHW"):
    dt = np_dtype(dtype)
    x = rng.standard_normal((2, 3, 5, 6, 7)).astype(dt)
    g = rng.standard_normal((2, 3, 4, 5, 3)).astype(dt)
    q = rng.uniform(-1.2, 1.2, (2, 4, 5, 3, 3)).astype(dt)
    if layout == "NDHWC":
        x, g = (np.ascontiguousarray(np.moveaxis(a, 1, 4)) for a in (x, g))
    return g, x, q


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "bfloat16"])
@pytest.mark.parametrize("layout", ["NCDHW", "NDHWC"])
@pytest.mark.parametrize("mask", [(True, True), (True, False), (False, True)])
def test_plan_backward_matches_function(dtype, layout, mask):
    g, x, q = _case(np.random.default_rng(1), dtype, layout)
    opts = dict(mode="bilinear", padding_mode="reflection", align_corners=True, layout=layout,
                output_mask=mask)
    plan = gs3d.plan_backward(g.shape, x.shape, q.shape, x.dtype, **opts)
    assert plan.workspace_size > 0
    want = gs3d.grid_sample_3d_backward(g, x, q, **opts)
    dx = np.full(x.shape, 7, dtype=x.dtype)
    dg = np.full(q.shape, 7, dtype=q.dtype)
    for _ in range(2):                       # the plan is reusable
        got = plan(g, x, q, input_grad=dx, grid_grad=dg)
        for a, b, buf in zip(got, want, (dx, dg)):
            if b is None:
                assert a is None and np.all(buf.astype(np.float64) == 7)
            else:
                assert a is buf and np.array_equal(a, b)
    got = plan(g, x, q)                      # and allocates outputs when none are given
    for a, b in zip(got, want):
        assert (a is None and b is None) or np.array_equal(a, b)


def test_plan_forward_matches_function():
    g, x, q = _case(np.random.default_rng(2))
    plan = gs3d.plan_forward(x.shape, q.shape, x.dtype, padding_mode="border")
    out = np.empty(plan.output_shape, dtype=x.dtype)
    assert plan(x, q, out=out) is out
    assert np.array_equal(out, gs3d.grid_sample_3d(x, q, padding_mode="border"))


def test_plan_validates_once_and_checks_each_call():
    g, x, q = _case(np.random.default_rng(3))
    with pytest.raises(gs3d.GridSamplerError) as e:
        gs3d.plan_backward(g.shape, x.shape, q.shape[:4] + (2,), x.dtype)
    assert e.value.code == 161002 and "grid" in str(e.value)
    with pytest.raises(gs3d.GridSamplerError):
        gs3d.plan_backward(g.shape, x.shape, q.shape, np.int32)
    with pytest.raises(gs3d.GridSamplerError):
        gs3d.plan_backward(g.shape, (2, 3, 5, 6), q.shape, x.dtype)
    plan = gs3d.plan_backward(g.shape, x.shape, q.shape, x.dtype)
    dx = np.full(x.shape, 7, dtype=x.dtype)
    for bad in (x[:1], x.astype(np.float64)):
        with pytest.raises(gs3d.GridSamplerError) as e:
            plan(g, bad, q, input_grad=dx)
        assert "input" in str(e.value)
    with pytest.raises(gs3d.GridSamplerError):
        plan(g, x, q, input_grad=x)          # overlaps an input
    readonly = np.full(x.shape, 7, dtype=x.dtype)
    readonly.flags.writeable = False
    with pytest.raises(gs3d.GridSamplerError):
        plan(g, x, q, input_grad=readonly)
    assert np.all(dx == 7)
    # a reversed (non-contiguous) buffer is valid and gets the same values
    rev = np.full(x.shape, 7, dtype=x.dtype)[::-1]
    assert np.array_equal(plan(g, x, q, input_grad=rev)[0], plan(g, x, q)[0])


def test_forward_plan_fast_path_hands_doubtful_arrays_to_the_full_checks():
    """The C fast path of plan(...) runs only arrays that need no copy and cannot overlap;
    every other array reaches the full checks: same results, same errors, nothing written."""
    g, x, q = _case(np.random.default_rng(4))
    plan = gs3d.plan_forward(x.shape, q.shape, x.dtype)
    want = plan(x, q)
    assert np.array_equal(want.view(np.uint8), gs3d.grid_sample_3d(x, q).view(np.uint8))
    # valid but not for the fast path: misaligned, reversed, a subclass, an equal dtype object
    raw = np.zeros(x.nbytes + 1, np.uint8)[1:].view(x.dtype).reshape(x.shape)
    raw[...] = x
    assert not raw.flags.aligned
    meta = np.dtype(x.dtype, metadata={"m": 1})
    assert meta == x.dtype and meta is not x.dtype
    for xi in (raw, x[::-1, ::-1].copy()[::-1, ::-1], x.view(np.memmap), x.view(meta)):
        assert np.array_equal(plan(xi, q).view(np.uint8), want.view(np.uint8))
    outs = [np.full(want.shape, 7, x.dtype)[..., ::-1], np.full(want.shape, 7, meta),
            np.full(want.shape[::-1], 7, x.dtype).T]
    for out in outs:
        assert plan(x, q, out=out) is out and np.array_equal(out, want)
    # invalid: read-only, overlapping an input, self-overlapping, wrong dtype or byte order
    readonly = np.full(want.shape, 7, x.dtype)
    readonly.flags.writeable = False
    big = np.zeros(x.size + want.size, x.dtype)
    xv = big[:x.size].reshape(x.shape)
    xv[...] = x
    overlapping = big[x.size - 5:x.size - 5 + want.size].reshape(want.shape)
    flat = np.full(want.size, 7, x.dtype)
    repeated = np.lib.stride_tricks.as_strided(flat, want.shape, (0,) + want.strides[1:])
    for xi, out in ((x, readonly), (xv, overlapping), (x, repeated),
                    (x, np.full(want.shape, 7, np.float64)), (x, np.full(want.shape, 7, ">f4"))):
        with pytest.raises(gs3d.GridSamplerError, match="out"):
            plan(xi, q, out=out)
        assert np.all(out == 7) if out is not overlapping else np.array_equal(xv, x)
    for xi in (x.astype(">f4"), x[:1], None, x.tolist()):
        with pytest.raises(gs3d.GridSamplerError, match="input"):
            plan(xi, q)


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16"])
@pytest.mark.parametrize("layout", ["NCDHW", "NDHWC"])
def test_backward_runner_matches_memoryview_entry_and_guards_memory(dtype, layout):
    """The bound BackwardRunner (what the API calls) and the typed-memoryview ``backward``
    entry give the same bits; the runner refuses arrays of other shapes, dtypes or
    alignment, read-only outputs and a missing output it is bound to fill, writing nothing."""
    from gs3d import _api
    from gs3d._validation import check_problem
    g, x, q = _case(np.random.default_rng(8), dtype, layout)
    pb = check_problem(x, q, g, "bilinear", "border", False, layout)
    res = _api._Resources(pb, 2, True)
    runner = _api._bind_backward_runner(res, x.dtype, True, True)
    dx, dg = np.full(x.shape, 9, x.dtype), np.full(q.shape, 9, q.dtype)
    runner.run(g, x, q, dx, dg)
    half = x.dtype.itemsize == 2
    st = (lambda a: a.view(np.uint16)) if half else (lambda a: a)
    perm = (lambda a: a) if layout == "NDHWC" else (lambda a: a.transpose(0, 2, 3, 4, 1))
    dx2, dg2 = np.full(x.shape, 7, x.dtype), np.full(q.shape, 7, q.dtype)
    # (the typed-memoryview entry takes one accumulator; the runner got one per thread for
    # 16-bit storage, as N >= threads here)
    acc = res.dx_acc[0] if res.dx_acc.ndim == 5 else res.dx_acc
    assert res.dx_acc.ndim == (5 if half else 4)
    _api._kernels.backward(perm(st(g)), perm(st(x)), st(q), perm(st(dx2)), st(dg2), acc,
                           res.scratch, res.workspace, 0, 1, False, res.half_kind, True, True,
                           2, res.xcl)
    assert np.array_equal(st(dx), st(dx2)) and np.array_equal(st(dg), st(dg2))
    want = gs3d.grid_sample_3d_backward(g, x, q, padding_mode="border", layout=layout,
                                        num_threads=2)
    assert np.array_equal(st(dx), st(want[0])) and np.array_equal(st(dg), st(want[1]))
    readonly = np.full(q.shape, 5, q.dtype)
    readonly.flags.writeable = False
    raw = np.zeros(x.nbytes + 1, np.uint8)[1:].view(x.dtype).reshape(x.shape)
    bad = [(g[:1], x, q, dx, dg), (g, x, q[..., :2], dx, dg), (g, x.astype(">" + x.dtype.str[1:]
           if not half else np.float32), q, dx, dg), (g, x, q, raw, dg), (g, x, q, dx, readonly),
           (g, x, q, dx, dg.tolist()), (g, x, q, None, dg), (g, x, q, dx, None)]
    for args in bad:
        out = np.full(x.shape, 3, x.dtype)
        with pytest.raises(ValueError, match="backward runner"):
            runner.run(*(out if a is dx else a for a in args))
        assert np.all(out == 3) and np.all(readonly == 5)


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
@pytest.mark.parametrize("dtype", ["float64", "float32", "float16"])
def test_deterministic_bitwise_across_threads(mode, dtype):
    """Many points hit the same voxels: the scatter order must not depend on the threads."""
    dt = np_dtype(dtype)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 5, 3, 3, 3)).astype(dt)
    q = rng.uniform(-1.1, 1.1, (1, 16, 16, 16, 3)).astype(dt)
    g = rng.standard_normal((1, 5, 16, 16, 16)).astype(dt)
    results = []
    for threads in (1, 2, 3, 4):
        with gs3d.deterministic():
            assert gs3d.get_deterministic()
            results.append(gs3d.grid_sample_3d_backward(g, x, q, mode=mode, num_threads=threads))
        results.append(gs3d.grid_sample_3d_backward(g, x, q, mode=mode, num_threads=threads,
                                                    deterministic=False))
    for dx, dg in results[1:]:
        assert np.array_equal(dx.view(np.uint8), results[0][0].view(np.uint8))
        assert np.array_equal(dg.view(np.uint8), results[0][1].view(np.uint8))


def bits_equal(a, b):
    return a.shape == b.shape and np.array_equal(a.view(np.uint8), b.view(np.uint8))


def _split_case(rng, dtype, layout, C, smooth=False):
    """N = 1, a 6^3 input (16^3 for ``smooth``), 12^3 output points: random grids put every
    tile on every depth plane, so the default mode at two threads splits the points."""
    D = 16 if smooth else 6
    x = rng.standard_normal((1, C, D, D, D)).astype(dtype)
    g = rng.standard_normal((1, C, 12, 12, 12)).astype(dtype)
    if smooth:
        axis = np.linspace(-0.9, 0.9, 12)
        q = np.stack(np.meshgrid(axis, axis, axis, indexing="ij")[::-1], axis=-1)[None]
        q = (q + 0.01 * rng.standard_normal(q.shape)).astype(dtype)
    else:
        q = rng.uniform(-1.1, 1.1, (1, 12, 12, 12, 3)).astype(dtype)
    return to_layout(g, layout), to_layout(x, layout), q


def _input_grad_buffer(kind, x, layout):
    """None, a dense input_grad in the other memory order, or a strided one."""
    if kind == "new":
        return None
    if kind == "other_order":
        axes = (0, 2, 3, 4, 1) if layout == "NCDHW" else (0, 4, 1, 2, 3)
        inverse = np.argsort(axes)
        return np.empty(tuple(x.shape[a] for a in axes), x.dtype).transpose(inverse)
    return np.empty(x.shape[:-1] + (2 * x.shape[-1],), x.dtype)[..., ::2]


@pytest.mark.parametrize("buffer", ["new", "other_order", "strided"])
@pytest.mark.parametrize("mask", [(True, True), (True, False)])
@pytest.mark.parametrize("padding", ["zeros", "reflection"])
@pytest.mark.parametrize("C", [1, 5, 16])
@pytest.mark.parametrize("layout", ["NCDHW", "NDHWC"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_split_is_correct_and_the_same_at_every_thread_count(dtype, layout, C, padding, mask,
                                                             buffer):
    """On a random grid one batch item's points are split in two halves, each summed into its
    own accumulator, then added: right to the spec's tolerance, and the same bits in either
    mode at 1, 2 and 3 threads.  A strided input_grad takes the depth slabs instead (one
    in-order sum per element), which rounds differently: that shows the split was taken."""
    from conftest import TOLERANCE, from_layout, rel_err
    from gs3d import _api, reference
    rng = np.random.default_rng(C * 7 + len(padding))
    g, x, q = _split_case(rng, np.dtype(dtype), layout, C)

    def run(kind, threads, deterministic):
        out = _input_grad_buffer(kind, x, layout)
        dx, dg = gs3d.grid_sample_3d_backward(g, x, q, padding_mode=padding, layout=layout,
                                              output_mask=mask, num_threads=threads,
                                              input_grad=out, deterministic=deterministic)
        if out is not None:
            assert dx is out
        return np.ascontiguousarray(dx), dg

    first = run(buffer, 2, False)
    want_dx, want_dg = reference.grid_sample_3d_backward(
        from_layout(g, layout).astype(np.float64), from_layout(x, layout).astype(np.float64),
        q.astype(np.float64), padding_mode=padding, output_mask=mask)
    assert rel_err(from_layout(first[0], layout), want_dx) <= TOLERANCE[dtype]
    for threads in (1, 2, 3):
        for deterministic in (False, True):
            dx, dg = run(buffer, threads, deterministic)
            assert bits_equal(dx, first[0]), (threads, deterministic)
            assert (dg is None) == (first[1] is None)
            assert dg is None or bits_equal(dg, first[1]), (threads, deterministic)
    slabs = run("strided", 2, False)
    if mask[1]:
        assert bits_equal(slabs[1], first[1])       # grid_grad: per point, no sums
    pb = _api.check_problem(x, q, g, "bilinear", padding, False, layout)
    split = buffer != "strided" and _api._may_split(pb)
    # a random grid on 6^3 voxels: the two halves' sums round differently somewhere
    assert bits_equal(first[0], slabs[0]) != split


@pytest.mark.parametrize("align", [False, True])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("layout", ["NCDHW", "NDHWC"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_split_against_torch(dtype, layout, padding, align):
    """The split's input gradient against PyTorch's, at one and two threads, under either corner
    alignment (three channels: from four, float32 NCDHW under zeros or border padding takes
    the channels-last copies, which never split)."""
    torch = pytest.importorskip("torch")
    from conftest import from_layout, rel_err
    rng = np.random.default_rng(len(padding) + 3 * len(layout))
    g, x, q = _split_case(rng, np.dtype(dtype), layout, 3)
    want_dx, want_dg = (t.numpy() for t in torch.ops.aten.grid_sampler_3d_backward(
        torch.from_numpy(np.ascontiguousarray(from_layout(g, layout))),
        torch.from_numpy(np.ascontiguousarray(from_layout(x, layout))), torch.from_numpy(q),
        0, ["zeros", "border", "reflection"].index(padding), align, [True, True]))
    tol = 1e-12 if dtype == "float64" else 1e-5
    for threads in (1, 2):
        dx, dg = gs3d.grid_sample_3d_backward(g, x, q, padding_mode=padding, layout=layout,
                                              align_corners=align, num_threads=threads)
        assert rel_err(from_layout(dx, layout), want_dx) <= tol
        assert rel_err(dg, want_dg) <= tol
    slabs = gs3d.grid_sample_3d_backward(g, x, q, padding_mode=padding, layout=layout,
                                         align_corners=align, input_grad=_input_grad_buffer("strided", x, layout))
    assert not bits_equal(dx, np.ascontiguousarray(slabs[0]))      # the split was taken


@pytest.mark.parametrize("threads", [1, 2])
def test_split_against_finite_differences(threads):
    """float64 input and grid gradients against central differences of the forward."""
    from conftest import check_by_finite_differences
    rng = np.random.default_rng(21)
    g, x, q = _split_case(rng, np.float64, "NDHWC", 3)
    dx, dg = gs3d.grid_sample_3d_backward(g, x, q, layout="NDHWC", num_threads=threads)

    def loss(xv, qv):
        return float(np.sum(g * gs3d.grid_sample_3d(xv, qv, layout="NDHWC")))

    check_by_finite_differences(loss, x, q, dx, dg, rng)
    slabs = gs3d.grid_sample_3d_backward(g, x, q, layout="NDHWC",
                                         input_grad=_input_grad_buffer("strided", x, "NDHWC"))
    assert not bits_equal(dx, np.ascontiguousarray(slabs[0]))      # the split was taken


def _slab_bounds_by_hand(q, D, H, W, nt):
    """choose_slabs' rule, written out from its description (zeros padding, align_corners
    False): sample i of S = min(P, 4096) is point (i * P) // S of batch item 0; a sample with
    a finite z coordinate adds 4 to the cost of its two depth planes z0 = floor(u), z0 + 1
    that lie in [0, D); every plane starts at (H * W / 8) * S / P (its zeroing); the cut t
    falls after the first plane where the running total reaches total * t / nt."""
    z = q[0, ..., 2].astype(np.float64).ravel()
    P = z.size
    S = P if P < 4096 else 4096
    cost = [H * W / 8.0 * S / P] * D
    for i in range(S):
        g = z[(i * P) // S]
        if not np.isfinite(g):
            continue
        z0 = int(np.floor(((g + 1) * D - 1) / 2))
        for k in (z0, z0 + 1):
            if 0 <= k < D:
                cost[k] += 4.0
    total = 0.0
    for c in cost:
        total += c
    bounds, t, acc = [0], 1, 0.0
    for k in range(D):
        acc += cost[k]
        while t < nt and acc >= total * t / nt:
            bounds.append(k + 1)
            t += 1
    return bounds + [D] * (nt + 1 - len(bounds)), cost


@pytest.mark.parametrize("out_shape", [(5, 7, 9), (16, 16, 16), (20, 17, 13), (3, 1, 5000),
                                       (1, 4099, 2), (64, 2, 33), (3000, 2, 1), (5000, 1, 1)])
def test_slab_bounds_sample_the_documented_points(out_shape):
    """The threaded backward cuts the depth axis into slabs from a sample of the grid's
    points (choose_slabs; for two slabs the cut also feeds the split decision). The kernel
    steps from sample to sample instead of dividing each index out; its per-plane costs
    (which show a single sample taken from the wrong point: neighbouring points here have
    unrelated depths) and its bounds must be those of the rule written out by hand, in every
    module, for sample counts that do and do not divide the number of points, steps over one
    or more rows, grids with NaN and values outside [-1, 1], and a grid view whose rows and
    planes are padded (a sample carried to a wrong row or column there reads a pad value)."""
    rng = np.random.default_rng(sum(out_shape))
    q = rng.uniform(-1.1, 1.1, (1, *out_shape, 3))
    q[..., 2] = rng.uniform(-1.2, 1.2, out_shape)
    q.reshape(-1)[rng.integers(0, q.size, 20)] = np.nan
    Do, Ho, Wo = out_shape
    padded = np.full((1, Do, Ho + 1, Wo + 2, 3), 7.0)[:, :, :Ho, :Wo]
    padded[...] = q
    for module in kernel_modules():
        for D, nt in ((9, 2), (23, 3), (40, 4)):
            for grid in (q, q.astype(np.float32), padded):
                bounds, cost = module.slab_bounds(grid, D, 6, 5, nt)
                want_bounds, want_cost = _slab_bounds_by_hand(grid, D, 6, 5, nt)
                assert cost.tolist() == want_cost, (module.__name__, D)
                assert bounds.tolist() == want_bounds, (module.__name__, D)


@pytest.mark.parametrize("layout", ["NCDHW", "NDHWC"])
def test_split_stays_off_for_smooth_grids(layout):
    """On a smooth warp the depth slabs share out the work already: no split (the dense
    input_grad gets the bits of the strided one, which never splits)."""
    rng = np.random.default_rng(11)
    g, x, q = _split_case(rng, np.float32, layout, 3, smooth=True)
    for threads in (1, 2):
        dense = gs3d.grid_sample_3d_backward(g, x, q, layout=layout, num_threads=threads)
        out = _input_grad_buffer("strided", x, layout)
        strided = gs3d.grid_sample_3d_backward(g, x, q, layout=layout, num_threads=threads,
                                               input_grad=out)
        assert bits_equal(dense[0], np.ascontiguousarray(strided[0]))
        assert bits_equal(dense[1], strided[1])


@pytest.mark.parametrize("C", [1, 2])
def test_one_channel_always_splits(C):
    """With one channel the points are split whatever the grid (SPLIT_ONE_CHANNEL in
    gs3d/_kernels.pyx); from two channels, a grid on which two depth slabs share the tiles
    out keeps the slabs.  Four tiles of 64 points: tiles 0 and 2 sample voxel 0 with weight 1,
    tiles 1 and 3 depth plane 6 of 8.  grad_output is 1 at point 0 and 2**-24 at two points
    of tile 2 (the second half).  In point order 1 + 2**-24 rounds to 1, twice; the split
    sums the second half first: 1 + 2**-23.  The same bits at 1, 2 and 3 threads either way."""
    x = np.zeros((1, C, 8, 4, 4), np.float32)
    q = np.full((1, 1, 1, 256, 3), -1.0, np.float32)
    q[0, 0, 0, 64:128, 2] = q[0, 0, 0, 192:, 2] = 5.0 / 7.0
    g = np.zeros((1, C, 1, 1, 256), np.float32)
    g[:, :, 0, 0, 0] = 1.0
    g[:, :, 0, 0, [130, 150]] = 2.0 ** -24
    want = np.float32(1 + 2.0 ** -23) if C == 1 else np.float32(1.0)
    for threads in (1, 2, 3):
        dx, dg = gs3d.grid_sample_3d_backward(g, x, q, align_corners=True, num_threads=threads)
        assert np.all(dx[0, :, 0, 0, 0] == want), (threads, dx[0, :, 0, 0, 0])


@pytest.mark.parametrize("threads", [1, 2])
def test_plan_splits_like_the_function(threads):
    """A plan owns the split's accumulator and gives the function's bits, call after call."""
    rng = np.random.default_rng(5)
    g, x, q = _split_case(rng, np.float32, "NDHWC", 4)
    kw = dict(layout="NDHWC", num_threads=threads)
    want = gs3d.grid_sample_3d_backward(g, x, q, **kw)
    plan = gs3d.plan_backward(g.shape, x.shape, q.shape, np.float32, **kw)
    res = plan._res
    assert res.split and res.dx_acc.nbytes == x.nbytes
    assert plan.workspace_size >= res.dx_acc.nbytes + res.workspace.nbytes + res.scratch.nbytes
    dx, dg = np.empty_like(x), np.empty_like(q)
    for _ in range(2):
        got = plan(g, x, q, input_grad=dx, grid_grad=dg)
        assert got[0] is dx and got[1] is dg
        assert bits_equal(dx, want[0]) and bits_equal(dg, want[1])


def test_deterministic_switches():
    assert gs3d.get_deterministic() is False
    gs3d.set_deterministic(True)
    try:
        assert gs3d.get_deterministic() is True
        with gs3d.deterministic(False):
            assert gs3d.get_deterministic() is False
        assert gs3d.get_deterministic() is True
    finally:
        gs3d.set_deterministic(False)
    with pytest.raises(gs3d.GridSamplerError):
        gs3d.set_deterministic(1)


@pytest.mark.parametrize("layout", ["NCDHW", "NDHWC"])
@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "bfloat16"])
@pytest.mark.parametrize("C,N,threads", [(18, 2, 2), (24, 2, 2), (24, 1, 3)])
def test_simd_variants_agree_bitwise(layout, dtype, C, N, threads):
    """The AVX2 build (runtime dispatch) and the baseline build give the same bits (the
    16-bit dot products of the AVX2 build, gs3d_dot_h, included; C = 18: vector loops and a
    tail; C = 24: the channels-last tile consumers in C, gs3d_backward_cl_avx2 and
    gs3d_forward_cl_avx2, with whole batch items per thread and, at N = 1, depth slabs)."""
    g, x, q = _case(np.random.default_rng(5), dtype, layout)
    ax = 1 if layout == "NCDHW" else 4
    # C // 3 scaled copies of the 3 channels, so no two channels are alike
    g, x = (np.concatenate([a.astype(np.float64) * (1 + 0.37 * k) for k in range(C // 3)],
                           axis=ax)[:N].astype(a.dtype) for a in (g, x))
    q = q[:N]
    results = [run_with(m, lambda: gs3d.grid_sample_3d_backward(g, x, q, layout=layout,
                                                                num_threads=threads)
                        + (gs3d.grid_sample_3d(x, q, layout=layout, num_threads=threads),))
               for m in kernel_modules()]
    for other in results[1:]:
        for a, b in zip(results[0], other):
            assert np.array_equal(a.view(np.uint8), b.view(np.uint8))


@pytest.mark.parametrize("layout", ["NCDHW", "NDHWC"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_rounding_of_nan_and_inf_gradients_agrees_across_builds(layout, dtype):
    """16-bit input_grad is rounded eight values at a time in the SIMD builds (gs3d_store8_h:
    contiguous runs, and the transposition of the channels-last accumulator into NCDHW) and
    one by one in the baseline: with NaN (payloads of either sign) and infinities in
    grad_output, every value that is not NaN must round to the same bits, and every NaN be
    written in the same places as the quiet NaN of SPEC's rounding (float16: 0x7E00 with its
    sign; bfloat16: its top half with the quiet bit).  Which of two different NaN payloads a
    sum carries on is not specified (IEEE 754, and compilers may swap the operands of an
    addition), so NaN payloads and signs are not compared."""
    rng = np.random.default_rng(21)
    dt = np_dtype(dtype)
    C, S = 16, 9                              # channels-last copies; W = 9: a partial block
    x = rng.standard_normal((1, C, S, S, S)).astype(dt)
    g = rng.standard_normal((1, C, 6, 7, 5)).astype(dt)
    q = rng.uniform(-1.1, 1.1, (1, 6, 7, 5, 3)).astype(dt)
    gb = g.view(np.uint16).reshape(-1)
    pick = rng.choice(gb.size, 40, replace=False)
    # NaN with payloads (signalling ones included), of either sign, and infinities
    pats = ([0x7C01, 0xFC13, 0x7E55, 0xFD00, 0x7C00, 0xFC00] if dtype == "float16"
            else [0x7F81, 0xFF93, 0x7FD5, 0xFFA0, 0x7F80, 0xFF80])
    gb[pick] = np.resize(np.array(pats, dtype=np.uint16), pick.size)
    if layout == "NDHWC":
        x, g = (np.ascontiguousarray(np.moveaxis(a, 1, 4)) for a in (x, g))
    results = [run_with(m, lambda: gs3d.grid_sample_3d_backward(g, x, q, layout=layout,
                                                                num_threads=1))
               for m in kernel_modules()]
    dx0 = results[0][0].astype(np.float32)
    assert np.isnan(dx0).any() and np.isinf(dx0).any()
    for got in results:
        for a, b in zip(results[0], got):
            nan = np.isnan(a.astype(np.float32))
            assert np.array_equal(nan, np.isnan(b.astype(np.float32)))
            assert np.array_equal(a.view(np.uint16)[~nan], b.view(np.uint16)[~nan])
            bits = b.view(np.uint16)[nan]
            if dtype == "float16":
                assert np.all(bits & 0x7FFF == 0x7E00)
            else:
                assert np.all(bits & 0x7FC0 == 0x7FC0)


@pytest.mark.parametrize("W", [2**31 - 2, 2**31, 3 * 2**30])
def test_axes_beyond_int32_indices_agree_across_builds(W):
    """The SIMD builds' eight-point set-up indexes corners in int32; an axis of 2^31 voxels or
    more must take the scalar set-up (a broadcast input: no memory).  Sampling a volume of
    ones (one voxel deep and high) at interior points of its width gives exactly 1 in every
    build; the grid gradient is 0 along x, and -0.5 along y and z, where moving off the voxel
    centre moves weight into the zero padding (-1 x size / 2)."""
    x = np.broadcast_to(np.float32(1), (1, 1, 1, 1, W))
    q = np.zeros((1, 1, 1, 4, 3), np.float32)
    q[..., 0] = [-0.5, 0.0, 0.25, 0.9]
    g = np.ones((1, 1, 1, 1, 4), np.float32)

    def run():
        out = gs3d.grid_sample_3d(x, q, num_threads=1)
        _, dq = gs3d.grid_sample_3d_backward(g, x, q, output_mask=(False, True), num_threads=1)
        return out, dq

    want = np.zeros(q.shape, np.float32)
    want[..., 1:] = -0.5
    for out, dq in (run_with(m, run) for m in kernel_modules()):
        assert np.array_equal(out, np.ones_like(out))
        assert np.array_equal(dq.view(np.uint32), want.view(np.uint32))


def test_float16_conversions_agree_across_builds_on_every_bit_pattern():
    """The AVX2 build converts float16 with F16C, the baseline with portable bit routines:
    all 65536 patterns must load alike, and sums of two of them must round alike (and as numpy
    rounds them), with NaN written as the quiet NaN of its sign.  Where both voxels are NaN, the
    builds may keep either NaN's sign (README: where two NaNs meet in one sum; the SIMD builds
    add eight points at a time, and the compiler may swap an addition's operands)."""
    bits = np.arange(65536, dtype=np.uint16)
    a = bits.view(np.float16)
    b = np.random.default_rng(11).permutation(bits).view(np.float16)
    vol = np.stack([a, b], -1).reshape(65536, 1, 1, 1, 2)    # 65536 volumes of two voxels
    q = np.zeros((65536, 1, 1, 1, 3), dtype=np.float16)      # x = 0: the midpoint
    q_first = q.copy()
    q_first[..., 0] = -1.0                                   # align_corners: voxel 0 exactly

    def run():
        return (gs3d.grid_sample_3d(vol, q_first, mode="nearest", align_corners=True,
                                    num_threads=1).ravel(),
                gs3d.grid_sample_3d(vol, q, align_corners=True, num_threads=1).ravel())

    both_nan = np.isnan(a) & np.isnan(b)
    assert 0 < both_nan.sum() < 200       # (the exception below is a small set: 53 pairs)
    (first0, mid0), *variants = (run_with(m, run) for m in kernel_modules())
    for first, mid in variants:
        assert np.array_equal(first0.view(np.uint16), first.view(np.uint16))
        assert np.array_equal(mid0[~both_nan].view(np.uint16), mid[~both_nan].view(np.uint16))
        assert np.all(mid[both_nan].view(np.uint16) & 0x7fff == 0x7e00)
    with np.errstate(all="ignore"):
        # the kernels sum from +0 in corner order, in float32, and round once
        one = (np.float32(0) + np.float32(1) * a.astype(np.float32)).astype(np.float16)
        half = np.float32(0.5)
        two = ((np.float32(0) + half * a.astype(np.float32)) + half * b.astype(np.float32)
               ).astype(np.float16)
    for got, want in ((first, one), (mid, two)):
        nan = np.isnan(want)
        assert np.array_equal(got[~nan].view(np.uint16), want[~nan].view(np.uint16))
        sign = (want[nan].view(np.uint16) & 0x8000) if got is first else None
        assert np.isnan(got[nan]).all()
        assert np.all(got[nan].view(np.uint16) & 0x7fff == 0x7e00)
        if sign is not None:
            assert np.array_equal(got[nan].view(np.uint16) & 0x8000, sign)


def test_plan_shared_by_threads_gives_serial_results():
    """One plan called from several Python threads at once: its scratch is not corrupted."""
    import threading
    rng = np.random.default_rng(6)
    cases = [_case(rng) for _ in range(4)]
    g0, x0, q0 = cases[0]
    plan = gs3d.plan_backward(g0.shape, x0.shape, q0.shape, x0.dtype, num_threads=2)
    want = [plan(*c) for c in cases]
    got = [None] * len(cases)

    def work(i):
        for _ in range(5):
            got[i] = plan(*cases[i])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(cases))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for a, b in zip(got, want):
        assert all(np.array_equal(u, v) for u, v in zip(a, b))


@pytest.mark.parametrize("align", [False, True])
@pytest.mark.parametrize("padding", ["zeros", "border"])
def test_nearest_half_voxel_ties_agree_with_reference_in_both_builds(align, padding):
    """Nearest under zeros/border rounds in the vectorised set-up (rint with SSE4.1 in the AVX2
    build, an add-and-subtract of 2^52 in the baseline): positions on and around half voxels,
    in and out of the volume, must pick the reference's voxel in both builds."""
    from gs3d import reference
    rng = np.random.default_rng(12)
    W = 8
    x = rng.standard_normal((1, 2, 3, 4, W))
    u = np.concatenate([np.arange(-3.0, W + 3.0, 0.5), np.arange(-3.0, W + 3.0, 0.25) + 1e-9])
    q = np.zeros((1, 1, 1, len(u), 3))
    q[..., 0] = 2.0 * u / (W - 1) - 1.0 if align else (2.0 * u + 1.0) / W - 1.0
    q[..., 1:] = rng.uniform(-1.2, 1.2, (len(u), 2))
    go = rng.standard_normal((1, 2, 1, 1, len(u)))
    kw = dict(mode="nearest", padding_mode=padding, align_corners=align)
    want_f = reference.grid_sample_3d(x, q, **kw)
    want_dx, want_dg = reference.grid_sample_3d_backward(go, x, q, **kw)
    for module in kernel_modules():
        f = run_with(module, lambda: gs3d.grid_sample_3d(x, q, num_threads=1, **kw))
        dx, dg = run_with(module, lambda: gs3d.grid_sample_3d_backward(go, x, q, num_threads=1,
                                                                        **kw))
        assert np.array_equal(f, want_f)
        assert np.allclose(dx, want_dx, rtol=0, atol=1e-14)
        assert np.array_equal(dg, want_dg)


def _c1_grid(rng, n_points, size):
    """Normalised coordinates for a single-channel forward: uniform values in and around the
    volume, exact voxel centres and edges, half voxels, and the non-finite and huge values
    that must sample nothing or clamp."""
    q = rng.uniform(-1.3, 1.3, (n_points, 3))
    q[::5] = np.round(q[::5] * (size - 1)) / (size - 1)          # on voxel centres (align)
    q[1::7] = (np.round(q[1::7] * size) + 0.5) / size              # half voxels
    specials = np.array([np.nan, np.inf, -np.inf, 1e30, -1e30, -0.0, 1.0, -1.0, 1e-40])
    flat = q.reshape(-1)
    flat[3::11] = specials[np.arange(len(flat[3::11])) % len(specials)]
    return q


@pytest.mark.parametrize("align", [False, True])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("n_points", [1, 7, 8, 9, 63, 64, 65, 203])
@pytest.mark.parametrize("C,layout", [(1, "NCDHW"), (3, "NCDHW"), (2, "NDHWC"), (3, "NDHWC"),
                                      (6, "NDHWC"), (8, "NCDHW"), (9, "NDHWC"), (16, "NDHWC"),
                                      (16, "NCDHW"), (40, "NDHWC"), (72, "NCDHW")])
def test_float32_forward_agrees_across_builds(align, padding, n_points, C, layout):
    """The AVX2 build runs the float32 bilinear forward of up to 8 channels eight points at a
    time (gs3d_forward_gather_avx2; 2, 3 and 6 channels-last channels by masked loads), and
    from 16 channels on, for multiples of 8, consumes the
    tile loop's set-up in C (gs3d_forward_cl_avx2; NCDHW output through the staging buffer,
    in groups of 56 points at C = 72); the baseline build runs the scalar tile loop.  Both must
    give the same bits, for every tail length, with NaN/inf/huge coordinates, and agree with
    the float64 reference within the float32 tolerance (C = 9: the tile loop in both)."""
    from gs3d import reference
    rng = np.random.default_rng(n_points)
    x = rng.standard_normal((2, C, 4, 5, 6)).astype(np.float32)
    q = np.stack([_c1_grid(rng, n_points, 5) for _ in range(2)]).reshape(2, 1, 1, n_points, 3)
    q = q.astype(np.float32)
    want = reference.grid_sample_3d(x.astype(np.float64), q.astype(np.float64),
                                    mode="bilinear", padding_mode=padding, align_corners=align)
    if layout == "NDHWC":
        x = np.ascontiguousarray(np.moveaxis(x, 1, 4))
        want = np.moveaxis(want, 1, 4)
    kw = dict(mode="bilinear", padding_mode=padding, align_corners=align, num_threads=1,
              layout=layout)
    results = [run_with(m, lambda: gs3d.grid_sample_3d(x, q, **kw)) for m in kernel_modules()]
    scale = max(np.abs(want).max(), 1e-30)
    for r in results[1:]:
        assert np.array_equal(results[0].view(np.uint32), r.view(np.uint32))
        assert np.abs(r - want).max() / scale <= 1e-5


@pytest.mark.parametrize("align", [False, True])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("n_points", [1, 3, 4, 5, 64, 203])
@pytest.mark.parametrize("C,layout", [(1, "NCDHW"), (3, "NDHWC"), (8, "NDHWC"), (16, "NCDHW"),
                                      (16, "NDHWC"), (24, "NDHWC"), (32, "NCDHW"),
                                      (40, "NDHWC")])
def test_float64_agrees_across_builds(align, padding, n_points, C, layout):
    """float64 runs the tile loop in every build, its channel loops (gs3d_corners_d,
    gs3d_dot_d, gs3d_axpy_d) compiled for each build's instruction set, and in the SIMD builds
    a multiple of 8 channels through vectors of eight doubles (one 512-bit or two 256-bit
    registers: from 16 channels the forward's blocks side by side, and gs3d_point_bwd_d's dots
    reduced together; 8 to 32 channels unrolled, 40 the general loop; NCDHW's copies by
    gs3d_transpose_d): forward, input gradient and grid gradient must have the same bits in
    all, for every tail length, with NaN/inf/huge coordinates, at one thread and at two (a
    batch item per thread, and one item shared by both), and agree with the reference."""
    from gs3d import reference
    rng = np.random.default_rng(100 + n_points)
    x = rng.standard_normal((2, C, 4, 5, 6))
    q = np.stack([_c1_grid(rng, n_points, 5) for _ in range(2)]).reshape(2, 1, 1, n_points, 3)
    go = rng.standard_normal((2, C, 1, 1, n_points))
    kw = dict(mode="bilinear", padding_mode=padding, align_corners=align)
    want = [reference.grid_sample_3d(x, q, **kw), *reference.grid_sample_3d_backward(go, x, q,
                                                                                       **kw)]
    if layout == "NDHWC":
        x, go = (np.ascontiguousarray(np.moveaxis(a, 1, 4)) for a in (x, go))
        want[0], want[1] = np.moveaxis(want[0], 1, 4), np.moveaxis(want[1], 1, 4)
    for threads, n in ((1, 2), (2, 2), (2, 1)):
        kw.update(layout=layout, num_threads=threads)
        xn, qn, gon = x[:n], q[:n], go[:n]
        results = [run_with(m, lambda: (gs3d.grid_sample_3d(xn, qn, **kw),
                                        *gs3d.grid_sample_3d_backward(gon, xn, qn, **kw)))
                   for m in kernel_modules()]
        for r in results[1:]:
            for a, b in zip(results[0], r):
                assert np.array_equal(a.view(np.uint64), b.view(np.uint64)), (threads, n)
        for a, w in zip(results[0], want):
            w = w[:n]
            assert np.abs(a - w).max() <= 1e-12 * max(np.abs(w).max(), 1.0), (threads, n)


@pytest.mark.parametrize("C", [8, 16, 40, 72])
def test_float64_strided_grad_output_agrees_across_builds(C):
    """A channels-last grad_output whose channel stride is not 1 (an NCDHW array's axes moved):
    the float64 backward stages each group of points' values (at most 64 points, 56 at C = 72;
    tiles of 64, 64 and 22 points) before the per-point loops, channel by channel in the
    baseline build and by 4 x 4 transpositions in the SIMD builds.  Same bits in every build
    as with a contiguous grad_output, and the reference's values."""
    from gs3d import reference
    rng = np.random.default_rng(C)
    x = np.ascontiguousarray(np.moveaxis(rng.standard_normal((2, C, 5, 4, 6)), 1, 4))
    q = _c1_grid(rng, 2 * 150, 4).reshape(2, 3, 5, 10, 3)
    go_ncdhw = rng.standard_normal((2, C, 3, 5, 10))
    go_view = np.moveaxis(go_ncdhw, 1, 4)
    assert go_view.strides[4] != go_view.itemsize
    kw = dict(layout="NDHWC", padding_mode="zeros", num_threads=1)
    want = reference.grid_sample_3d_backward(go_view, x, q, layout="NDHWC")
    base = None
    for module in kernel_modules():
        for go in (go_view, np.ascontiguousarray(go_view)):
            r = run_with(module, lambda: gs3d.grid_sample_3d_backward(go, x, q, **kw))
            bits = [a.view(np.uint64) for a in r]
            if base is None:
                base = bits
                for a, w in zip(r, want):
                    assert np.abs(a - w).max() <= 1e-12 * max(np.abs(w).max(), 1.0)
            assert all(np.array_equal(a, b) for a, b in zip(base, bits)), module.__name__


@pytest.mark.parametrize("variant", ["grid_view", "out_view", "negative_strides", "ndhwc",
                                     "ndhwc_views", "ndhwc_into_ncdhw_order", "two_threads"])
@pytest.mark.parametrize("C", [1, 3, 4, 6, 16])
def test_float32_forward_strides_agree_across_builds(variant, C):
    """Grids whose points are not at one fixed step (the scalar path), strided outputs, volumes
    read backwards, the NDHWC layout (C = 3, 4, 6 and 16: the point-by-point branches of the
    gather forward, masked loads for 3 and 6), also read backwards into an output view, and
    threads: both builds give the same bits."""
    rng = np.random.default_rng(21)
    x = rng.standard_normal((2, C, 6, 7, 9)).astype(np.float32)
    q = _c1_grid(rng, 2 * 3 * 4 * 11, 7).reshape(2, 3, 4, 11, 3).astype(np.float32)
    kw = dict(padding_mode="border", num_threads=1)
    out = None
    if variant == "grid_view":
        q = np.concatenate([q, q], axis=3)[:, :, :, ::2]          # rows 22 apart, points 2
    elif variant == "negative_strides":
        x = x[:, :, ::-1, :, ::-1]
    elif variant in ("ndhwc", "ndhwc_into_ncdhw_order"):
        x = np.ascontiguousarray(np.moveaxis(x, 1, 4))
        kw["layout"] = "NDHWC"
    elif variant == "ndhwc_views":
        x = np.ascontiguousarray(np.moveaxis(x, 1, 4))[:, ::-1, :, ::-1]
        kw["layout"] = "NDHWC"
    elif variant == "two_threads":
        kw["num_threads"] = 2
    results = []
    for module in kernel_modules():
        if variant == "out_view":
            out = np.full((2, C, 3, 4, 22), 5.0, np.float32)[..., ::2]
        elif variant == "ndhwc_views":
            out = np.full((2, 3, 4, 22, C), 5.0, np.float32)[:, :, :, ::2]
        elif variant == "ndhwc_into_ncdhw_order":
            # channels 132 apart, points at step 1 (C = 16: the point-by-point branch with
            # each eight points' sums transposed into channel runs)
            out = np.moveaxis(np.full((2, C, 3, 4, 11), 5.0, np.float32), 1, 4)
        r = run_with(module, lambda: gs3d.grid_sample_3d(x, q, out=out, **kw))
        results.append(r)
        assert np.array_equal(results[0].view(np.uint32), r.view(np.uint32))
        if variant == "out_view":
            assert r.base is not None and np.all(r.base[..., 1::2] == 5.0)
        if variant == "ndhwc_views":
            assert r.base is not None and np.all(r.base[:, :, :, 1::2] == 5.0)
        if variant == "ndhwc_into_ncdhw_order":
            assert r is out            # written in place, not through a copy


@pytest.mark.parametrize("view", ["contiguous", "x_reversed", "x_strided"])
@pytest.mark.parametrize("C", [1, 3])
def test_float32_forward_pair_reads_agree_across_builds(view, C):
    """The gather forward reads the two x corners of a row with one 64-bit gather lane per
    point (gs3d_gather_pairs8) where the input's rows are at step 1 and no point of a block
    of eight has one x corner in bounds and the other out.  Blocks of interior points (the
    pairs), blocks with a point at x0 = -1 or x0 = W - 1 (one corner in: eight single
    gathers), points wholly outside along x, outside along y or z only, NaN, a pair ending
    at the array's last element, and a tail of five points: every build gives the same bits
    and the float64 reference's values; a reversed or strided x axis (no pairs) too."""
    from gs3d import reference
    rng = np.random.default_rng(31 + C)
    D, H, W = 5, 6, 20
    if view == "contiguous":
        x = rng.standard_normal((1, C, D, H, W)).astype(np.float32)
    elif view == "x_reversed":
        x = rng.standard_normal((1, C, D, H, W)).astype(np.float32)[..., ::-1]
    else:
        x = rng.standard_normal((1, C, D, H, 2 * W)).astype(np.float32)[..., ::2]
    n = 8 * 12 + 5
    u = rng.uniform(0.0, W - 1.0, n)           # x index coordinates: both corners in
    v = rng.uniform(0.0, H - 1.0, n)
    w = rng.uniform(0.0, D - 1.0, n)
    u[8 + 3] = -0.5                            # block 1: x0 = -1, one corner in
    u[16 + 6] = W - 0.75                       # block 2: x0 = W - 1
    u[24:32:2] = -3.0                          # block 3: both x corners out (pairs kept)
    v[32 + 1] = -4.0                           # block 4: out along y only
    w[32 + 5] = D + 2.0                        #          and along z only
    u[40 + 2] = np.nan                         # block 5: NaN
    u[48:56], v[48:56], w[48:56] = W - 1.5, H - 1.0, D - 1.0   # block 6: the array's end
    u[56 + 7], v[56 + 7], w[56 + 7] = W - 1.0, H - 1.0, D - 1.0  # its last element alone
    u[-2] = W - 0.5                            # the tail: x0 = W - 1
    q = np.stack([(2 * u + 1) / W - 1, (2 * v + 1) / H - 1, (2 * w + 1) / D - 1], axis=-1)
    q = q.reshape(1, 1, 1, n, 3).astype(np.float32)
    want = reference.grid_sample_3d(np.ascontiguousarray(x).astype(np.float64),
                                    q.astype(np.float64))
    results = [run_with(m, lambda: gs3d.grid_sample_3d(x, q, num_threads=1))
               for m in kernel_modules()]
    scale = np.abs(want).max()
    for r in results:
        assert np.array_equal(results[0].view(np.uint32), r.view(np.uint32))
        assert np.abs(r - want).max() / scale <= 1e-5
    assert (results[0][..., 40 + 2] == 0).all()        # a NaN coordinate samples nothing


def _backward_both_builds(go, x, q, **kw):
    """grid_sample_3d_backward under the baseline and the AVX2 build, as unsigned-integer
    views (their bits)."""
    results = []
    for module in kernel_modules():
        r = run_with(module, lambda: gs3d.grid_sample_3d_backward(go, x, q, **kw))
        results.append([None if a is None else a.view("u%d" % a.dtype.itemsize) for a in r])
    return results


def _points_backward_across_builds(rng, C, n_points, layout, opts, dtype="float32",
                                   grad_order=False):
    """The backward of ``n_points`` scattered points (_c1_grid, every fourth on the first
    one's corners) in a 9 x 5 x 6 volume of C channels: both builds give the same bits under
    1 and 3 threads (at N = 1 they split the input gradient into depth slabs) and every
    output_mask, and the float64 reference's values.  ``grad_order``: grad_output in the
    other layout's memory order (NDHWC: channels P apart, points at step 1; NCDHW: channel
    stride 1)."""
    from gs3d import reference
    from conftest import TOLERANCE
    dt = np_dtype(dtype)
    x = rng.standard_normal((1, C, 9, 5, 6)).astype(dt)
    q = _c1_grid(rng, n_points, 6).reshape(1, 1, 1, n_points, 3)
    # some points share corners: their input-gradient contributions meet in one voxel
    q[..., ::4, :] = q[..., :1, :]
    with np.errstate(over="ignore"):
        q = q.astype(dt)            # (float16: the huge coordinates become infinities)
    go = rng.standard_normal((1, C, 1, 1, n_points)).astype(dt)
    want = reference.grid_sample_3d_backward(go.astype(np.float64), x.astype(np.float64),
                                             q.astype(np.float64), **opts)
    if layout == "NDHWC":
        x = np.ascontiguousarray(np.moveaxis(x, 1, 4))
        go = np.moveaxis(go, 1, 4) if grad_order else np.ascontiguousarray(np.moveaxis(go, 1, 4))
        want = (np.moveaxis(want[0], 1, 4), want[1])
    elif grad_order:
        go = np.moveaxis(np.ascontiguousarray(np.moveaxis(go, 1, 4)), 4, 1)
    for threads, mask in ((1, (True, True)), (3, (True, True)), (2, (True, False)),
                          (2, (False, True))):
        base, *variants = _backward_both_builds(go, x, q, output_mask=mask, layout=layout,
                                                num_threads=threads, **opts)
        for a, b, w in ((a, b, w) for simd in variants for a, b, w in zip(base, simd, want)):
            assert (a is None) == (b is None)
            if a is None:
                continue
            assert np.array_equal(a, b), (n_points, threads, mask)
            got = b.view(dt).astype(np.float64)
            finite = np.isfinite(w)
            assert np.array_equal(np.isfinite(got), finite)
            scale = max(np.abs(w[finite]).max(initial=0.0), 1.0)
            tol = 1e-4 if dtype == "float32" else 4 * TOLERANCE[dtype]
            assert np.abs(got[finite] - w[finite]).max(initial=0.0) / scale <= tol


@pytest.mark.parametrize("align", [False, True])
@pytest.mark.parametrize("padding", ["zeros", "border"])
@pytest.mark.parametrize("kind", ["smooth", "random", "special"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_tile_depth_ranges_agree_across_builds(dtype, kind, padding, align):
    """At N = 1 on two or more threads each tile's range of depth planes (tile_planes; four
    float32 or 16-bit points at a time with AVX2, gs3d_tile_planes_f / _h, where the grid's
    points are evenly spaced) decides which depth slab works on it and whether the points are
    split.  A range too narrow drops contributions, a different one can change the split: the
    AVX2 and the baseline build must give the bits of one thread, for evenly spaced and other
    grids, every tail length, and NaN, infinite and huge depths."""
    dt = np_dtype(dtype)
    rng = np.random.default_rng(len(kind) + 3 * align + len(padding))
    for D, So in ((1, 5), (7, 9), (16, 13), (23, 21)):
        x = rng.standard_normal((1, 2, D, 6, 5)).astype(dt)
        axis = np.linspace(-1, 1, So)
        q = np.stack(np.meshgrid(axis, axis, axis, indexing="ij")[::-1], axis=-1)[None]
        if kind == "smooth":
            q = 1.05 * q + 0.02 * rng.standard_normal(q.shape)
        elif kind == "random":
            q = rng.uniform(-1.3, 1.3, q.shape)
        else:
            q = q.copy()
            hit = rng.random(q.shape) < 0.2
            q[hit] = rng.choice([np.nan, np.inf, -np.inf, 1e30, -1e30, -0.0, 1.0, -1.0],
                                hit.sum())
        with np.errstate(over="ignore"):        # 1e30 is infinite in float16
            q = q.astype(dt)
        go = rng.standard_normal((1, 2, So, So, So)).astype(dt)
        for grid in (q, q[:, :, ::-1], np.asfortranarray(q)):
            kw = dict(padding_mode=padding, align_corners=align)
            one = _backward_both_builds(go, x, grid, num_threads=1, **kw)[0]
            for threads in (2, 3):
                for bits in _backward_both_builds(go, x, grid, num_threads=threads, **kw):
                    assert all(np.array_equal(a, b) for a, b in zip(bits, one)), (D, threads)


@pytest.mark.parametrize("align", [False, True])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("C,layout", [(1, "NCDHW"), (3, "NDHWC"), (4, "NCDHW"), (6, "NDHWC"),
                                      (7, "NDHWC"), (8, "NCDHW")])
def test_few_channel_float32_backward_agrees_across_builds(align, padding, C, layout):
    """The AVX2 build runs the float32 bilinear backward of up to 7 channels eight points at a
    time (gs3d_backward_gather_avx2): vector mapping and grid-gradient dots, the input-gradient
    scatter point by point in order.  Both builds must give the same bits for every tail
    length, output_mask and thread count (at N = 1 the threads split the input gradient into
    depth slabs and each maps every point), and agree with the float64 reference (C = 8 and
    reflection: the tile loop in both).  The point counts give every tail of a block of eight
    (1 to 7 points, and none)."""
    for n_points in (1, 2, 7, 8, 9, 12, 13, 14, 65, 203):
        _points_backward_across_builds(np.random.default_rng(100 + n_points), C, n_points,
                                       layout, dict(mode="bilinear", padding_mode=padding,
                                                    align_corners=align))


@pytest.mark.parametrize("grad_order", [False, True])
@pytest.mark.parametrize("align", [False, True])
@pytest.mark.parametrize("padding", ["zeros", "border"])
def test_four_channels_last_float32_backward_agrees_across_builds(padding, align, grad_order):
    """NDHWC with 4 channels: the AVX2 gather backward scatters each corner's four contiguous
    channels with one 128-bit read-modify-write, taking grad_output's four values in one load
    when its channel stride is 1 and from the staged values otherwise (``grad_order``).  Same
    bits as the baseline build's per-channel loop (shared corners, tails, depth slabs at 3
    threads, every output_mask) and the float64 reference's values."""
    for n_points in (1, 7, 8, 13, 14, 203):
        _points_backward_across_builds(np.random.default_rng(500 + n_points), 4, n_points,
                                       "NDHWC", dict(mode="bilinear", padding_mode=padding,
                                                     align_corners=align),
                                       grad_order=grad_order)


@pytest.mark.parametrize("grad_order", [False, True])
@pytest.mark.parametrize("padding", ["zeros", "border"])
@pytest.mark.parametrize("C", [8, 16, 24, 32, 40])
@pytest.mark.parametrize("layout", ["NCDHW", "NDHWC"])
def test_multiple_of_eight_channels_float32_backward_agrees_across_builds(layout, C, padding,
                                                                          grad_order):
    """With a multiple of 8 channels, contiguous channels-last (NDHWC, or NCDHW through its
    channels-last copies), the AVX2 build consumes each tile in C (gs3d_backward_cl_avx2,
    unrolled for C = 8 .. 32, a loop for 40), reading grad_output in place when its channel
    stride is 1 and staging it per tile otherwise (NCDHW memory order, ``grad_order`` in
    NDHWC; NCDHW with ``grad_order`` has channel stride 1); the baseline build runs the
    Cython loop.  Same bits for edge points, points that sample nothing, shared corners,
    depth slabs at N = 1 (3 threads) and every output_mask, and the float64 reference's
    values."""
    _points_backward_across_builds(np.random.default_rng(300 + C), C, 203, layout,
                                   dict(mode="bilinear", padding_mode=padding,
                                        align_corners=False), grad_order=grad_order)


@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("C", [8, 16, 56, 64])
@pytest.mark.parametrize("layout", ["NCDHW", "NDHWC"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_multiple_of_eight_channels_half_backward_agrees_across_builds(dtype, layout, C,
                                                                        padding):
    """16-bit storage with a multiple of 8 channels: the AVX2 build runs gs3d_backward_cl_avx2
    on the staged, converted grad_output up to C = 56 (C = 64: the Cython loop in both
    builds); same bits as the baseline build and the reference's values, for every
    output_mask, 1 and 3 threads, several tiles and non-finite coordinates."""
    _points_backward_across_builds(np.random.default_rng(400 + C), C, 203, layout,
                                   dict(mode="bilinear", padding_mode=padding,
                                        align_corners=True), dtype)


@pytest.mark.parametrize("variant", ["grid_view", "grad_view", "dx_view", "dg_view",
                                     "negative_strides", "batch_two"])
@pytest.mark.parametrize("C", [1, 4])
def test_few_channel_float32_backward_strides_agree_across_builds(variant, C):
    """Grids, grad_outputs and grid gradients whose points are not at one fixed step, strided
    input gradients, volumes read backwards and two batch items (one thread each): both builds
    give the same bits, and caller-given outputs keep their other elements."""
    rng = np.random.default_rng(22)
    x = rng.standard_normal((1, C, 8, 7, 9)).astype(np.float32)
    q = _c1_grid(rng, 3 * 4 * 11, 7).reshape(1, 3, 4, 11, 3).astype(np.float32)
    go = rng.standard_normal((1, C, 3, 4, 11)).astype(np.float32)
    kw = dict(padding_mode="border", num_threads=2)
    if variant == "grid_view":
        q = np.concatenate([q, q], axis=3)[:, :, :, ::2]
    elif variant == "grad_view":
        go = np.concatenate([go, go], axis=4)[..., ::2]
    elif variant == "negative_strides":
        x = x[:, :, ::-1, :, ::-1]
    elif variant == "batch_two":
        x, q, go = (np.concatenate([a, a[:, ::-1] if a is q else -a]) for a in (x, q, go))
    results = []
    for module in kernel_modules():
        if variant == "dx_view":
            kw["input_grad"] = np.full((1, C, 8, 7, 18), 5.0, np.float32)[..., ::2]
        elif variant == "dg_view":
            kw["grid_grad"] = np.full((1, 3, 4, 22, 3), 5.0, np.float32)[:, :, :, ::2]
        r = run_with(module, lambda: gs3d.grid_sample_3d_backward(go, x, q, **kw))
        results.append(r)
        for name in ("input_grad", "grid_grad"):
            if name in kw:
                out = r[0] if name == "input_grad" else r[1]
                assert out is kw[name] and np.all(out.base[..., 1::2, :] == 5.0
                                                  if name == "grid_grad"
                                                  else out.base[..., 1::2] == 5.0)
    for other in results[1:]:
        for a, b in zip(results[0], other):
            assert np.array_equal(a.view(np.uint32), b.view(np.uint32))


def test_channels_last_copy_lives_in_sliced_input_grad():
    """The NCDHW backward with many channels copies the input channels-last into input_grad[n]
    when that item is one dense block, whatever the whole array's layout: an input_grad sliced
    along N (not C-contiguous) needs no extra buffer, and gives the same bits.  A strided item
    does need the buffer (one batch item of scratch), and gives the same bits too."""
    import tracemalloc
    from gs3d import _api
    rng = np.random.default_rng(30)
    x = rng.standard_normal((2, 16, 12, 12, 12)).astype(np.float32)
    q = rng.uniform(-1, 1, (2, 12, 12, 12, 3)).astype(np.float32)
    g = rng.standard_normal((2, 16, 12, 12, 12)).astype(np.float32)
    assert _api._kernels.channels_last_pays(16, 12, 12, 12, 12 ** 3)
    want = gs3d.grid_sample_3d_backward(g, x, q, num_threads=2)
    item = x[0].nbytes
    for make, extra_ok in ((lambda: np.full((4,) + x.shape[1:], 7, x.dtype)[::2], False),
                           (lambda: np.full(x.shape[:4] + (24,), 7, x.dtype)[..., ::2], True)):
        dx = make()
        assert not dx.flags.c_contiguous
        _api.clear_cache()
        gs3d.grid_sample_3d_backward(g, x, q, num_threads=2)         # warm the call cache
        _api._big.clear()       # (not its idle scratch: the call below makes its own)
        tracemalloc.start()
        got = gs3d.grid_sample_3d_backward(g, x, q, num_threads=2, input_grad=dx)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert got[0] is dx
        assert np.array_equal(dx.view(np.uint32), want[0].view(np.uint32))
        assert np.array_equal(got[1].view(np.uint32), want[1].view(np.uint32))
        # scratch of the call: the channels-last accumulators (one item per thread, each
        # thread running whole batch items), the grid gradient, and with a strided item the
        # input copy (one item more)
        assert (peak > 3.5 * item) == extra_ok, (peak, item)
        # the input copy is one batch item, whatever the number of accumulators
        plan = gs3d.plan_backward(g.shape, x.shape, q.shape, x.dtype, num_threads=2)
        plan(g, x, q, input_grad=make())
        assert plan._res.xcl.size == (x[0].size if extra_ok else 1)


@pytest.mark.parametrize("layout", ["NCDHW", "NDHWC"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("partner", [4, 2])
def test_channel_dot_keeps_its_lane_order(layout, dtype, partner):
    """In channel lanes 0 and ``partner``, products of +-2^22 that cancel only when lane_sum's
    tree sums them before lane 1 (lanes 0 + 4 first; then (0 4) + (2 6)); lane 1 carries a
    small term that is lost in any other order.  The grid gradient must be the small term's,
    in both builds (the 16-bit dot and the float32 eight-corner reduction of
    gs3d_backward_cl_avx2 in the AVX2 build included)."""
    from gs3d import reference
    from conftest import TOLERANCE, rel_err
    dt = np_dtype(dtype)
    rng = np.random.default_rng(9)
    x = np.zeros((1, 16, 6, 6, 6))
    x[:, 0], x[:, partner] = 2048.0, -2048.0
    x[:, 1] = rng.uniform(-0.2, 0.2, (1, 6, 6, 6))
    g = np.zeros((1, 16, 5, 5, 5))
    g[:, 0] = g[:, partner] = 2048.0
    g[:, 1] = 1.0
    q = rng.uniform(-0.9, 0.9, (1, 5, 5, 5, 3))
    x, g, q = (a.astype(dt) for a in (x, g, q))
    if layout == "NDHWC":
        x, g = (np.ascontiguousarray(np.moveaxis(a, 1, 4)) for a in (x, g))
    f64 = lambda a: a.astype(np.float64)
    _, want = reference.grid_sample_3d_backward(f64(g), f64(x), f64(q), layout=layout)
    assert np.abs(want).max() > 0.01
    for m in kernel_modules():
        _, dg = run_with(m, lambda: gs3d.grid_sample_3d_backward(g, x, q, layout=layout))
        assert rel_err(dg, want) <= TOLERANCE[dtype], m.__name__


@pytest.mark.parametrize("layout", ["NCDHW", "NDHWC"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
@pytest.mark.parametrize("C", [8, 16, 32])
def test_signed_zero_channel_dots_agree_across_builds(layout, dtype, C):
    """grad_output -0 everywhere, input -1 at even and +1 at odd x: every product of a
    channel dot is a signed zero, +0 at the west corners and -0 at the east ones.  A dot
    summed from +0 (as every build sums it) is +0; one that skips that first + 0 is -0 at
    the east corners, and the grid gradient's x component (east minus west dots) turns -0.
    The SIMD builds must give the baseline's bits, signs of zeros included, and the baseline
    gives +0: float32 with C = 16 and 32 runs the AVX-512 module's sixteen-products-per-
    multiply dot, C = 8 and 16-bit inputs the eight-lane one, float64 gs3d_point_bwd_d."""
    dt = np_dtype(dtype)
    rng = np.random.default_rng(C)
    sign = np.where(np.arange(7) % 2 == 0, -1.0, 1.0)
    x = to_layout(np.broadcast_to(sign, (1, C, 6, 5, 7)).astype(dt), layout)
    g = to_layout(np.full((1, C, 4, 5, 6), -0.0, dtype=dt), layout)
    q = rng.uniform(-0.95, 0.95, (1, 4, 5, 6, 3)).astype(dt)
    for threads in (1, 2):
        base, *variants = _backward_both_builds(g, x, q, layout=layout, num_threads=threads)
        assert not np.any(np.signbit(base[1].view(dt).astype(np.float32)))
        for bits in variants:
            assert all(np.array_equal(a, b) for a, b in zip(base, bits)), threads


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
@pytest.mark.parametrize("layout", ["NCDHW", "NDHWC"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_batch_items_on_their_own_accumulators(layout, dtype, mode):
    """16-bit storage with at least as many batch items as threads: each thread accumulates
    whole items in its own float32 accumulator (together at most one float32 input_grad).
    The bits are those of one thread, and the result is the reference's."""
    from gs3d import _api, reference
    from gs3d._validation import check_problem
    from conftest import TOLERANCE, rel_err, to_layout
    dt = np_dtype(dtype)
    rng = np.random.default_rng(12)
    N, C = 4, 5
    x = to_layout(rng.standard_normal((N, C, 3, 4, 3)).astype(dt), layout)
    g = to_layout(rng.standard_normal((N, C, 6, 7, 8)).astype(dt), layout)
    q = rng.uniform(-1.1, 1.1, (N, 6, 7, 8, 3)).astype(dt)
    runs = [gs3d.grid_sample_3d_backward(g, x, q, mode=mode, layout=layout, num_threads=t)
            for t in (1, 2, 3, 4)]
    for dx, dg in runs[1:]:
        assert np.array_equal(dx.view(np.uint16), runs[0][0].view(np.uint16))
        assert np.array_equal(dg.view(np.uint16), runs[0][1].view(np.uint16))
    f64 = lambda a: a.astype(np.float64)
    want = reference.grid_sample_3d_backward(f64(g), f64(x), f64(q), mode=mode, layout=layout)
    assert rel_err(runs[2][0], want[0]) <= TOLERANCE[dtype]
    assert rel_err(runs[2][1], want[1]) <= TOLERANCE[dtype]
    pb = check_problem(x, q, g, mode, "zeros", False, layout)
    for nt, count in ((1, 1), (3, 3), (4, 4), (5, 1)):
        res = _api._Resources(pb, nt, True, True)
        assert (res.dx_acc.shape[0] if res.dx_acc.ndim == 5 else 1) == count
        assert res.dx_acc.nbytes <= 4 * x.size
    # a 5-D accumulator must be dense accumulators one after the other
    res = _api._Resources(pb, 2, True, True)
    res.dx_acc = res.dx_acc[:, ::-1]
    with pytest.raises(ValueError, match="5-D dx_acc"):
        _api._bind_backward_runner(res, x.dtype, True, True)


@pytest.mark.parametrize("layout", ["NCDHW", "NDHWC"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_input_grad_rounding_agrees_across_builds(layout, dtype):
    """The rounding of the float32 accumulator into 16-bit input_grad (eight at a time in
    the AVX2 build, gs3d_store_h) gives the baseline's bits on NaNs with payloads and signs,
    infinities, overflow, subnormals and ties, for 1, 2 and 4 threads."""
    dt = np_dtype(dtype)
    rng = np.random.default_rng(13)
    N, C = 2, 8
    x = rng.standard_normal((N, C, 4, 5, 6)).astype(dt)
    mag = 10.0 ** rng.uniform(-9, 5.5, (N, C, 5, 6, 7))
    go = (rng.choice([-1.0, 1.0], mag.shape) * mag).astype(np.float32)
    bits = go.view(np.uint32)
    bits.flat[::11] = 0x7FC01234            # NaN with a payload
    bits.flat[3::13] = 0xFFC00001           # negative NaN
    go.flat[5::17] = np.inf
    go.flat[6::19] = -np.inf
    with np.errstate(over="ignore"):
        go = go.astype(dt)
    lin = [np.linspace(-1.1, 1.1, s) for s in (5, 6, 7)]
    zz, yy, xx = np.meshgrid(*lin, indexing="ij")
    q = np.stack([xx, yy, zz], -1)[None].repeat(N, 0).astype(dt)
    if layout == "NDHWC":
        x, go = (np.ascontiguousarray(np.moveaxis(a, 1, 4)) for a in (x, go))
    for t in (1, 2, 4):
        results = [run_with(m, lambda: gs3d.grid_sample_3d_backward(
            go, x, q, layout=layout, num_threads=t, output_mask=(True, False))[0])
            for m in kernel_modules()]
        u = [r.view(np.uint16) for r in results]
        assert all(np.array_equal(u[0], v) for v in u[1:])
        assert np.isnan(results[0].astype(np.float32)).any()
        assert np.isinf(results[0].astype(np.float32)).any()


@pytest.mark.parametrize("layout", ["NCDHW", "NDHWC"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_forward_ties_and_nan_payloads_agree_across_builds(layout, dtype):
    """Points halfway between two voxels whose 16-bit values differ by one unit with an odd
    first one: the float32 sample is an exact tie that must round up to the even value.  Some
    channels hold NaNs with payloads.  The AVX2 build stages a tile's samples and rounds each
    point's channels eight at a time (gs3d_store_h); both builds give the same bits."""
    dt = np_dtype(dtype)
    ulp = 2.0 ** (-7 if dtype == "bfloat16" else -10)
    rng = np.random.default_rng(15)
    C, P = 16, 70
    scale = 2.0 ** rng.integers(-3, 10, (1, C, 1, 1, 1)) * rng.choice([-1, 1], (1, C, 1, 1, 1))
    x = np.concatenate([(1 + ulp) * scale, (1 + 2 * ulp) * scale], axis=4)
    x = np.repeat(np.repeat(x, 2, axis=2), 2, axis=3).astype(np.float32)
    x[0, ::5, 0, 0, 1] = np.array([0x7FE00000, 0xFFF00000, 0x7FC10000, 0xFFC30000],
                                  np.uint32).view(np.float32)
    x = x.astype(dt)
    q = np.zeros((1, 1, 1, P, 3))                 # x = 0: halfway between the two columns
    q[..., 1:] = rng.choice([-1.0, 1.0], (1, 1, 1, P, 2))          # y, z on voxel centres
    q = q.astype(dt)
    if layout == "NDHWC":
        x = np.ascontiguousarray(np.moveaxis(x, 1, 4))
    for t in (1, 2):
        res = [run_with(m, lambda: gs3d.grid_sample_3d(x, q, layout=layout, align_corners=True,
                                                       num_threads=t))
               for m in kernel_modules()]
        assert all(np.array_equal(res[0].view(np.uint16), r.view(np.uint16)) for r in res[1:])
        out = np.asarray(res[1] if layout == "NCDHW" else np.moveaxis(res[1], 4, 1))
        out = out.astype(np.float64)[0, :, 0, 0]                       # (C, P)
        nan = np.isnan(out)
        assert nan[::5].any() and not nan[1::5].any()
        want = np.broadcast_to((1 + 2 * ulp) * scale[0, :, 0, 0], out.shape)
        assert np.array_equal(out[~nan], want[~nan])


@pytest.mark.parametrize("layout", ["NCDHW", "NDHWC"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_input_grad_ties_and_nan_payloads_agree_across_builds(layout, dtype):
    """Two output points land exactly on each voxel of one plane (weights exactly 1), so the
    float32 sums are exact ties between two 16-bit values with an odd last bit (round to
    even must go up) or NaNs with payloads (float16 keeps only the quiet NaN of its sign,
    bfloat16 keeps its top half): both builds give the same bits, and the ties round up."""
    dt = np_dtype(dtype)
    ulp = 2.0 ** (-7 if dtype == "bfloat16" else -10)     # of 1.0 in this dtype
    S, C = 5, 8
    x = np.ones((1, C, S, S, S), dt)
    lin = np.linspace(-1.0, 1.0, S)                        # exact voxel centres (align)
    yy, xx = np.meshgrid(lin, lin, indexing="ij")
    q = np.stack([xx, yy, np.zeros_like(xx)], -1)[None, None].repeat(2, 1).astype(dt)
    rng = np.random.default_rng(14)
    low = -20 if dtype == "bfloat16" else -3               # float16: no subnormal terms
    scale = 2.0 ** rng.integers(low, 10, (1, C, 1, S, S)) * rng.choice([-1, 1], (1, C, 1, S, S))
    go = np.concatenate([(1 + ulp) * scale, 0.5 * ulp * scale], axis=2).astype(np.float32)
    nan = np.array([0x7FE00000, 0xFFF00000], np.uint32).view(np.float32)
    go[0, ::3, 0, 1, :2] = nan
    go = go.astype(dt)
    if layout == "NDHWC":
        x, go = (np.ascontiguousarray(np.moveaxis(a, 1, 4)) for a in (x, go))
    for t in (1, 2):
        res = [run_with(m, lambda: gs3d.grid_sample_3d_backward(
            go, x, q, layout=layout, align_corners=True, num_threads=t,
            output_mask=(True, False))[0]) for m in kernel_modules()]
        assert all(np.array_equal(res[0].view(np.uint16), r.view(np.uint16)) for r in res[1:])
        plane = np.asarray(res[0] if layout == "NCDHW" else np.moveaxis(res[0], 4, 1))[0, :, 2]
        want = (1 + 2 * ulp) * scale[0, :, 0]
        fin = ~np.isnan(plane.astype(np.float64))
        assert (~fin).any() and np.array_equal(plane.astype(np.float64)[fin], want[fin])


@pytest.mark.parametrize("build", ["baseline", "avx2", "avx512"])
@pytest.mark.parametrize("direction,dtype,layout,padding", [
    ("forward", "float16", "NDHWC", "zeros"), ("forward", "float32", "NCDHW", "zeros"),
    ("forward", "float32", "NCDHW", "reflection"), ("forward", "float32", "NDHWC", "reflection"),
    ("forward", "bfloat16", "NCDHW", "zeros"), ("backward", "float32", "NCDHW", "zeros"),
    ("backward", "float16", "NCDHW", "zeros"), ("backward", "bfloat16", "NDHWC", "zeros")])
def test_more_channels_than_the_staging_buffer_stay_inside_the_scratch(build, direction, dtype,
                                                                       layout, padding):
    """C = 4104, more than the STAGE values a thread's scratch row keeps for staging a group
    of points: the kernels read and write point by point instead, so the scratch rows after
    the call's are untouched, and the results are the reference's.  Both builds (the
    baseline one runs every float32 forward through the tiles; reflection padding keeps the
    AVX2 one off its gather forward, so its tile forward is checked too)."""
    from gs3d import _api, reference
    from gs3d._validation import PADDINGS, check_problem
    from conftest import TOLERANCE, from_layout, rel_err, to_layout
    builds = kernel_modules()
    if build == "avx512" and len(builds) < 3:
        pytest.skip("this CPU lacks AVX-512")
    k = builds[["baseline", "avx2", "avx512"].index(build)]
    dt = np_dtype(dtype)
    rng = np.random.default_rng(16)
    C = k.SCRATCH_EXTRA + 8
    x = to_layout(rng.standard_normal((1, C, 2, 2, 3)).astype(dt), layout)
    go = to_layout(rng.standard_normal((1, C, 1, 1, 5)).astype(dt), layout)
    q = rng.uniform(-1.0, 1.0, (1, 1, 1, 5, 3)).astype(dt)
    pb = check_problem(x, q, go if direction == "backward" else None, "bilinear", padding,
                       False, layout)
    nt = 1
    res = run_with(k, lambda: _api._Resources(pb, nt, direction == "backward",
                                                backward=direction == "backward"))
    sc_buf = np.full((nt + 1, res.scratch.shape[1]), 7, res.scratch.dtype)
    half = dt.itemsize == 2
    st = (lambda a: a.view(np.uint16)) if half else (lambda a: a)
    perm = (lambda a: a) if layout == "NDHWC" else (lambda a: a.transpose(0, 2, 3, 4, 1))
    f64 = lambda a: from_layout(a, layout).astype(np.float64)
    if direction == "forward":
        out = np.full(go.shape, 9, dt)
        k.forward(perm(st(x)), st(q), perm(st(out)), sc_buf[:nt], res.workspace, 0,
                  PADDINGS[padding], False, res.half_kind, nt, res.xcl)
        want = reference.grid_sample_3d(f64(x), q.astype(np.float64), padding_mode=padding)
        assert rel_err(from_layout(out, layout), want) <= TOLERANCE[dtype]
    else:
        dx, dg = np.full(x.shape, 9, dt), np.full(q.shape, 9, dt)
        k.backward(perm(st(go)), perm(st(x)), st(q), perm(st(dx)), st(dg), res.dx_acc,
                   sc_buf[:nt], res.workspace, 0, 0, False, res.half_kind, True, True, nt,
                   res.xcl)
        want = reference.grid_sample_3d_backward(f64(go), f64(x), q.astype(np.float64))
        assert rel_err(from_layout(dx, layout), want[0]) <= TOLERANCE[dtype]
        assert rel_err(dg, want[1]) <= TOLERANCE[dtype]
    assert np.all(sc_buf[nt:] == 7)


def _output_split_cases():
    """Backwards that cannot split the points (16-bit storage, the channels-last copy of an
    NCDHW input with many channels, an input_grad that is not dense) on random grids, where
    two or more threads split the outputs instead: one scatters the input gradient, the others
    write the grid gradient (kernels: output_task)."""
    for dtype in ("float16", "bfloat16"):
        for layout in ("NCDHW", "NDHWC"):
            yield dtype, layout, 5, "new"
    for dtype in ("float32", "float64", "bfloat16"):
        yield dtype, "NCDHW", 16, "new"            # the channels-last copy in input_grad
        yield dtype, "NCDHW", 16, "strided"        # ... in a buffer
    for dtype in ("float32", "float64"):
        yield dtype, "NDHWC", 3, "strided"


@pytest.mark.parametrize("align", [False, True])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("dtype,layout,C,buffer", list(_output_split_cases()))
def test_output_split_is_correct_and_the_same_at_every_thread_count(dtype, layout, C, buffer,
                                                                    padding, align):
    """The output split writes each output with the one-thread code in the one-thread order:
    the same bits at 1 to 4 threads in both modes, with N = 1 and with fewer batch items than
    threads (the items then run in turn, each split), right to the spec's tolerance, under
    either corner alignment."""
    from conftest import TOLERANCE, from_layout, rel_err
    from gs3d import reference
    rng = np.random.default_rng(C + len(padding) + len(dtype))
    dt = np_dtype(dtype)
    for n in (1, 3):
        parts = [_split_case(rng, dt, layout, C) for _ in range(n)]
        g, x, q = (np.concatenate(a, axis=0) for a in zip(*parts))

        def run(threads, deterministic):
            out = _input_grad_buffer(buffer, x, layout)
            dx, dg = gs3d.grid_sample_3d_backward(g, x, q, padding_mode=padding,
                                                  align_corners=align, layout=layout,
                                                  num_threads=threads,
                                                  input_grad=out,
                                                  deterministic=deterministic)
            assert out is None or dx is out
            return np.ascontiguousarray(dx), dg

        first = run(1, True)
        want_dx, want_dg = reference.grid_sample_3d_backward(
            *(np.asarray(from_layout(a, layout), np.float64) for a in (g, x)),
            q.astype(np.float64), padding_mode=padding, align_corners=align)
        assert rel_err(from_layout(first[0], layout), want_dx) <= TOLERANCE[dtype]
        assert rel_err(first[1], want_dg) <= TOLERANCE[dtype]
        for threads in (2, 3, 4):
            for deterministic in (False, True):
                dx, dg = run(threads, deterministic)
                assert bits_equal(dx, first[0]), (n, threads, deterministic)
                assert bits_equal(dg, first[1]), (n, threads, deterministic)


@pytest.mark.parametrize("dtype,layout,C,buffer",
                         [c for c in _output_split_cases() if c[0] in ("float32", "float64")])
def test_output_split_against_torch(dtype, layout, C, buffer):
    torch = pytest.importorskip("torch")
    from conftest import from_layout, rel_err
    rng = np.random.default_rng(C + len(buffer))
    g, x, q = _split_case(rng, np.dtype(dtype), layout, C)
    want_dx, want_dg = (t.numpy() for t in torch.ops.aten.grid_sampler_3d_backward(
        torch.from_numpy(np.ascontiguousarray(from_layout(g, layout))),
        torch.from_numpy(np.ascontiguousarray(from_layout(x, layout))), torch.from_numpy(q),
        0, 0, False, [True, True]))
    tol = 1e-12 if dtype == "float64" else 1e-5
    dx, dg = gs3d.grid_sample_3d_backward(g, x, q, layout=layout, num_threads=2,
                                          input_grad=_input_grad_buffer(buffer, x, layout))
    assert rel_err(from_layout(dx, layout), want_dx) <= tol
    assert rel_err(dg, want_dg) <= tol


@pytest.mark.parametrize("layout,C,buffer", [("NCDHW", 16, "new"), ("NCDHW", 16, "strided"),
                                             ("NDHWC", 3, "strided")])
def test_output_split_against_finite_differences(layout, C, buffer):
    """float64 at two threads, against central differences of the forward."""
    from conftest import check_by_finite_differences
    rng = np.random.default_rng(31)
    g, x, q = _split_case(rng, np.float64, layout, C)
    dx, dg = gs3d.grid_sample_3d_backward(g, x, q, layout=layout, num_threads=2,
                                          input_grad=_input_grad_buffer(buffer, x, layout))

    def loss(xv, qv):
        return float(np.sum(g * gs3d.grid_sample_3d(xv, qv, layout=layout)))

    check_by_finite_differences(loss, x, q, dx, dg, rng)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
@pytest.mark.parametrize("layout", ["NCDHW", "NDHWC"])
def test_buffers_gs3d_allocates_start_on_a_cache_line(dtype, layout):
    """Outputs gs3d allocates of 256 KiB or more, and a plan's scratch, accumulators and
    channels-last copy, start on a 64-byte boundary (numpy's own large buffers start 16 bytes
    into a line); smaller outputs are plain arrays that own their memory.  The values are
    those written into buffers the caller gives, and into the returned arrays given back."""
    rng = np.random.default_rng(3)
    dt = np_dtype(dtype)
    big, small = (1, 16, 24, 24, 24), (1, 2, 6, 6, 6)
    for shape, mode in ((big, "bilinear"), (big, "nearest"), (small, "bilinear")):
        x = to_layout(rng.standard_normal(shape).astype(dt), layout)
        q = rng.uniform(-1.1, 1.1, (1,) + shape[2:] + (3,)).astype(dt)
        g = to_layout(rng.standard_normal(shape).astype(dt), layout)
        kw = dict(mode=mode, layout=layout, num_threads=2)
        out = gs3d.grid_sample_3d(x, q, **kw)
        dx, dg = gs3d.grid_sample_3d_backward(g, x, q, **kw)
        for a in (out, dx, dg):
            if a.nbytes >= 1 << 18:
                assert a.ctypes.data % 64 == 0 and a.flags.c_contiguous
            else:
                assert a.base is None and a.flags.owndata
        assert out.nbytes >= 1 << 18 or shape is small
        given = [np.empty_like(a) for a in (out, dx, dg)]
        gs3d.grid_sample_3d(x, q, out=given[0], **kw)
        gs3d.grid_sample_3d_backward(g, x, q, input_grad=given[1], grid_grad=given[2], **kw)
        for a, b in zip((out, dx, dg), given):
            assert np.array_equal(a.view(np.uint8), b.view(np.uint8))
        # the returned arrays given back as outputs
        for a in (out, dx, dg):
            a[...] = 7
        assert gs3d.grid_sample_3d(x, q, out=out, **kw) is out
        got = gs3d.grid_sample_3d_backward(g, x, q, input_grad=dx, grid_grad=dg, **kw)
        assert got[0] is dx and got[1] is dg
        for a, b in zip((out, dx, dg), given):
            assert np.array_equal(a.view(np.uint8), b.view(np.uint8))
        if shape is big:
            xb, qb, gb = x, q, g
    x, q, g = xb, qb, gb
    for backward in (False, True):
        if backward:
            plan = gs3d.plan_backward(g.shape, x.shape, q.shape, dt, layout=layout,
                                      num_threads=2)
        else:
            plan = gs3d.plan_forward(x.shape, q.shape, dt, layout=layout, num_threads=2)
        # and what a plan allocates when no output is given
        got = plan(g, x, q) if backward else (plan(x, q),)
        assert got[0].nbytes >= 1 << 18
        for a in got:
            assert (a.ctypes.data % 64 == 0 and a.base is not None if a.nbytes >= 1 << 18
                    else a.base is None)
        res = plan._res
        real = [a for a in (res.scratch, res.workspace, res.dx_acc, res.xcl) if a.size > 1]
        assert all(a.ctypes.data % 64 == 0 for a in real)
        # the forward of NCDHW copies the input channels-last; the backward accumulates
        # channels-last (NCDHW) or in halves (float32 NDHWC) or in float32 (16-bit)
        assert len(real) == (3 if layout == "NCDHW" or backward else 2), backward
        # the plan's size counts each aligned buffer whole
        assert plan.workspace_size >= sum(a.base.nbytes for a in real)
    # the copy made of an array the kernels cannot read in place starts on a line too
    from gs3d._validation import kernel_ready
    raw = np.zeros(x.nbytes + 1, np.uint8)[1:].view(x.dtype).reshape(x.shape)
    raw[...] = x
    copy = kernel_ready(raw)
    assert copy.ctypes.data % 64 == 0 and copy.dtype == x.dtype
    assert np.array_equal(copy.view(np.uint8), x.view(np.uint8))
