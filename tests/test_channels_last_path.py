"""NCDHW with many channels runs through channels-last copies (``channels_last_pays``): a
channels-last copy of input[n] (in input_grad[n] when it is one block, else in a buffer), a
channels-last accumulator written back into input_grad, grad_output and the forward output read
and written in place.  SPEC "Tensors and layouts" and "Determinism": the results must be bitwise
those of the channels-last layout, whatever the strides, the output mask and the thread count.
"""
import numpy as np
import pytest

import gs3d
from gs3d import _api
from gs3d import reference as ref
from conftest import DTYPES, TOLERANCE, np_dtype, rel_err, same_bits as same

# W = 19 is more than one block (16) of the transpositions; P * 4 >= D * H * W below
N, D, H, W, Do, Ho, Wo = 2, 4, 5, 19, 5, 5, 6
CFGS = [dict(), dict(padding_mode="border", align_corners=True),
        dict(padding_mode="reflection"), dict(mode="nearest")]


def make(dtype, C, in_sp=(D, H, W), out_sp=(Do, Ho, Wo), n=N, seed=0):
    rng = np.random.default_rng(seed)
    dt = np_dtype(dtype)
    x = rng.standard_normal((n, C) + in_sp).astype(dt)
    go = rng.standard_normal((n, C) + out_sp).astype(dt)
    q = rng.uniform(-1.15, 1.15, (n,) + out_sp + (3,)).astype(dt)
    return x, q, go


def cl(a):
    return np.ascontiguousarray(np.moveaxis(a, 1, 4))


def pays(x, q):
    return _api._kernels.channels_last_pays(x.shape[1], *x.shape[2:], int(np.prod(q.shape[1:4])))


def channels_last_results(x, q, go, mask, cfg):
    """The same call in NDHWC layout (the channels-last kernel read directly), as NCDHW."""
    f = gs3d.grid_sample_3d(cl(x), q, layout="NDHWC", num_threads=1, **cfg)
    dx, dg = gs3d.grid_sample_3d_backward(cl(go), cl(x), q, layout="NDHWC", output_mask=mask,
                                          num_threads=1, **cfg)
    return np.moveaxis(f, 4, 1), None if dx is None else np.moveaxis(dx, 4, 1), dg


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mask", [(True, True), (False, True), (True, False)])
@pytest.mark.parametrize("C", [8, 13])
def test_ncdhw_equals_channels_last_bitwise(dtype, mask, C):
    x, q, go = make(dtype, C)
    assert pays(x, q)
    for cfg in CFGS:
        want = channels_last_results(x, q, go, mask, cfg)
        for nt in (1, 2, 3, 4):
            f = gs3d.grid_sample_3d(x, q, num_threads=nt, **cfg)
            dx, dg = gs3d.grid_sample_3d_backward(go, x, q, output_mask=mask, num_threads=nt,
                                                  **cfg)
            for name, a, b in zip(("forward", "input_grad", "grid_grad"), (f, dx, dg), want):
                assert same(a, b), (cfg, nt, name)


def _no_split_channels_last(x, q, go, mask, cfg, nt):
    """The NDHWC backward into a strided input_grad (which never takes the split of one batch
    item's points), as NCDHW."""
    buf = np.zeros(cl(x).shape[:4] + (2 * x.shape[1],), x.dtype)[..., ::2] if mask[0] else None
    dx, dg = gs3d.grid_sample_3d_backward(cl(go), cl(x), q, layout="NDHWC", output_mask=mask,
                                          num_threads=nt, input_grad=buf, **cfg)
    return None if dx is None else np.moveaxis(dx, 4, 1), dg


def _check_few_channel_copies(x, q, go, mask, dtype):
    """The bilinear backward of NCDHW (x, q, go) under every padding takes the copies
    (backward only) and gives bitwise the channels-last layout's results at 1-4 threads, right
    against the reference."""
    for cfg in CFGS[:3]:
        pb = _api.check_problem(x, q, go, "bilinear", cfg.get("padding_mode", "zeros"),
                                cfg.get("align_corners", False), "NCDHW")
        assert _api._copies_pay(pb, True) and not _api._copies_pay(pb, False)
        want = _no_split_channels_last(x, q, go, mask, cfg, 1)
        for nt in (1, 2, 3, 4):
            got = gs3d.grid_sample_3d_backward(go, x, q, output_mask=mask, num_threads=nt, **cfg)
            for name, a, b in zip(("input_grad", "grid_grad"), got, want):
                assert same(a, b), (cfg, nt, name)
        rdx, rdg = ref.grid_sample_3d_backward(*(a.astype(np.float64) for a in (go, x, q)),
                                               **cfg)
        for a, r in zip(got, (rdx, rdg)):
            assert a is None or rel_err(a, r) <= TOLERANCE[dtype], cfg


@pytest.mark.parametrize("mask", [(True, True), (False, True), (True, False)])
@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("C", [4, 5, 7])
def test_few_channels_float32_backward(C, n, mask):
    """From TRANSPOSE_FEW_MIN_C = 4 channels the float32 bilinear backward takes the copies
    too, under every padding (with AVX2 the gather backward runs on the copy): bitwise the
    channels-last layout's results at 1-4 threads (N = 1: the slabs' in-order sums, as the
    strided NDHWC input_grad gets them), right against the reference; float64 and the forward
    keep the direct loops and their results."""
    x, q, go = make("float32", C, n=n, seed=20 + C)
    P = int(np.prod(q.shape[1:4]))
    assert _api._kernels.channels_last_pays(C, D, H, W, P, True) and not pays(x, q)
    _check_few_channel_copies(x, q, go, mask, "float32")
    pb = _api.check_problem(*(a.astype("float64") for a in (x, q, go)), "bilinear", "zeros",
                            False, "NCDHW")
    assert not _api._copies_pay(pb, True)


@pytest.mark.parametrize("mask", [(True, True), (False, True), (True, False)])
@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_few_channels_half_backward(dtype, n, mask):
    """float16/bfloat16 take the few-channel copies at exactly four channels (bilinear, every
    padding): bitwise the channels-last layout's results at 1-4 threads, right against the
    reference; five channels keep the direct loops."""
    x, q, go = make(dtype, 4, n=n, seed=40)
    _check_few_channel_copies(x, q, go, mask, dtype)
    x5, q5, go5 = make(dtype, 5, n=n, seed=41)
    pb = _api.check_problem(x5, q5, go5, "bilinear", "zeros", False, "NCDHW")
    assert not _api._copies_pay(pb, True)


def test_few_channels_float32_backward_against_torch():
    torch = pytest.importorskip("torch")
    x, q, go = make("float32", 4, n=1, seed=30)
    for padding in ("zeros", "border"):
        want = [t.numpy() for t in torch.ops.aten.grid_sampler_3d_backward(
            torch.from_numpy(go), torch.from_numpy(x), torch.from_numpy(q), 0,
            ["zeros", "border"].index(padding), True, [True, True])]
        for nt in (1, 2):
            got = gs3d.grid_sample_3d_backward(go, x, q, padding_mode=padding,
                                               align_corners=True, num_threads=nt)
            for a, b in zip(got, want):
                assert rel_err(a, b) <= TOLERANCE["float32"], (padding, nt)


@pytest.mark.parametrize("dtype", DTYPES)
def test_non_contiguous_input_grad_and_strided_inputs(dtype):
    """input_grad not one block per batch item (the input copy then goes to a buffer), inputs
    with negative and stepped strides, grad_output channels-last in memory."""
    x, q, go = make(dtype, 9, seed=1)
    want = channels_last_results(x, q, go, (True, True), {})
    dt = x.dtype
    big = np.full((N, 9, 2 * D, H, W + 3), 7, dtype=dt)
    dx_view = big[:, :, ::2, :, 1:W + 1]
    xs = np.ascontiguousarray(x[:, ::-1])[:, ::-1]          # negative channel stride
    gos = cl(go).transpose(0, 4, 1, 2, 3)                      # channel stride 1
    for nt in (1, 2, 3):
        dx, dg = gs3d.grid_sample_3d_backward(gos, xs, q, num_threads=nt, input_grad=dx_view)
        assert dx is dx_view
        assert same(np.ascontiguousarray(dx), want[1]) and same(dg, want[2]), nt
        untouched = np.ones(big.shape, bool)
        untouched[:, :, ::2, :, 1:W + 1] = False
        assert np.all(big[untouched].astype(np.float64) == 7)
        # Fortran-ordered input_grad: dense, but not as one block per batch item
        dxf = np.asfortranarray(np.zeros(x.shape, dtype=dt))
        got = gs3d.grid_sample_3d_backward(go, x[:, :, ::-1][:, :, ::-1], q, num_threads=nt,
                                           input_grad=dxf)
        assert got[0] is dxf and same(np.ascontiguousarray(dxf), want[1])
        out = np.zeros((Do, Ho, Wo, N, 9), dtype=dt).transpose(3, 4, 0, 1, 2)
        assert same(np.ascontiguousarray(gs3d.grid_sample_3d(xs, q, num_threads=nt, out=out)),
                    want[0])


@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16"])
def test_plans_use_the_channels_last_path(dtype):
    x, q, go = make(dtype, 12, seed=2)
    want = channels_last_results(x, q, go, (True, True), {})
    for mask in ((True, True), (False, True)):
        plan = gs3d.plan_backward(go.shape, x.shape, q.shape, x.dtype, output_mask=mask,
                                  num_threads=2)
        for _ in range(2):
            dx, dg = plan(go, x, q)
            assert same(dg, want[2]) and (dx is None or same(dx, want[1]))
            # a given input_grad that is not one block: the plan finds a buffer for the copy
            if mask[0]:
                buf = np.zeros(x.shape[:4] + (2 * W,), dtype=x.dtype)[..., ::2]
                got = plan(go, x, q, input_grad=buf)
                assert got[0] is buf and same(np.ascontiguousarray(buf), want[1])
    fplan = gs3d.plan_forward(x.shape, q.shape, x.dtype, num_threads=2)
    assert same(fplan(x, q), want[0])


@pytest.mark.parametrize("dtype", DTYPES)
def test_against_reference(dtype):
    x, q, go = make(dtype, 10, seed=3)
    x64, q64, go64 = (a.astype(np.float64) for a in (x, q, go))
    for cfg in CFGS[:3]:
        f = gs3d.grid_sample_3d(x, q, num_threads=2, **cfg)
        dx, dg = gs3d.grid_sample_3d_backward(go, x, q, num_threads=2, **cfg)
        rf = ref.grid_sample_3d(x64, q64, **cfg)
        rdx, rdg = ref.grid_sample_3d_backward(go64, x64, q64, **cfg)
        for got, want in ((f, rf), (dx, rdx), (dg, rdg)):
            assert rel_err(got, want) <= TOLERANCE[dtype], cfg


@pytest.mark.parametrize("dtype", ["float64", "float16"])
def test_under_the_thresholds(dtype):
    """Few output points for the volume (P * 4 < D * H * W), and C below 8: the direct loop,
    with the same results."""
    for C, in_sp, out_sp in ((8, (8, 8, 9), (3, 3, 4)), (7, (D, H, W), (Do, Ho, Wo))):
        x, q, go = make(dtype, C, in_sp, out_sp, seed=4)
        assert not pays(x, q)
        for cfg in CFGS[:2]:
            want = channels_last_results(x, q, go, (True, True), cfg)
            for nt in (1, 2, 3):
                got = (gs3d.grid_sample_3d(x, q, num_threads=nt, **cfg),
                       *gs3d.grid_sample_3d_backward(go, x, q, num_threads=nt, **cfg))
                for a, b in zip(got, want):
                    assert same(a, b), (C, cfg, nt)


def test_single_batch_item_and_depth_one():
    """N = 1, and a volume of one depth plane (more threads than planes)."""
    for in_sp, out_sp in (((1, 6, 20), (2, 4, 5)), ((3, 1, 17), (3, 2, 6))):
        x, q, go = make("float32", 16, in_sp, out_sp, n=1, seed=5)
        assert pays(x, q)
        want = channels_last_results(x, q, go, (True, True), {})
        for nt in (1, 2, 4):
            got = (gs3d.grid_sample_3d(x, q, num_threads=nt),
                   *gs3d.grid_sample_3d_backward(go, x, q, num_threads=nt))
            for a, b in zip(got, want):
                assert same(a, b), (in_sp, nt)


def _acc_count(plan):
    """How many channels-last accumulators a backward plan holds (one per thread when the
    threads take whole batch items, else one)."""
    acc = plan._res.dx_acc
    return acc.shape[0] if acc.ndim == 5 else 1


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cfg", CFGS, ids=["zeros", "border-ac", "reflection", "nearest"])
@pytest.mark.parametrize("mask", [(True, True), (True, False)])
def test_threads_take_whole_batch_items(dtype, cfg, mask):
    """With at least as many batch items as threads (float64, whose accumulators are twice
    the size: twice as many), each thread runs whole items of the channels-last path with
    its own accumulator, with and without the grid gradient.  The plan holds one per thread, and the results are bitwise those of
    the channels-last layout at every thread count, with more items than threads (the items
    are handed out dynamically) and with an input_grad that is not one block per item (the
    input copy then needs the buffer, and the items run in turn)."""
    n = 9        # float64 takes the path at every thread count up to 4
    x, q, go = make(dtype, 8, n=n, seed=7)
    assert pays(x, q)
    want = channels_last_results(x, q, go, mask, cfg)
    big = 2 if dtype == "float64" else 1
    for nt in (1, 2, 3, 4):
        plan = gs3d.plan_backward(go.shape, x.shape, q.shape, x.dtype, num_threads=nt,
                                  output_mask=mask, **cfg)
        assert _acc_count(plan) == (nt if 1 < nt and big * nt <= n else 1), nt
        for _ in range(2):
            dx, dg = plan(go, x, q)
            assert same(dx, want[1]) and same(dg, want[2]), nt
        buf = np.zeros(x.shape[:4] + (2 * W,), dtype=x.dtype)[..., ::2]
        got = plan(go, x, q, input_grad=buf)
        assert got[0] is buf and same(np.ascontiguousarray(buf), want[1]), nt


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cfg", CFGS, ids=["zeros", "border-ac", "reflection", "nearest"])
def test_forward_and_grid_gradient_copy_whole_items(dtype, cfg):
    """The forward and the grid gradient alone, with at least as many batch items as threads
    (float64: twice as many), copy whole items, each thread into its own part of the copy
    buffer: the plans hold one copy per thread, and the results are bitwise those of the
    channels-last layout at every thread count, with more items than threads and exactly as
    many; with fewer items than threads, one copy (shared by the threads).  (Nearest's grid
    gradient reads no input and makes no copy.)"""
    itemsize = np.dtype(np_dtype(dtype)).itemsize
    for n in (9, 4, 1):
        x, q, go = make(dtype, 8, n=n, seed=12)
        assert pays(x, q)
        want = channels_last_results(x, q, go, (False, True), cfg)
        item = x[0].size
        for nt in (1, 2, 3, 4):
            copies = nt if 1 < nt <= n and nt * itemsize <= 4 * n else 1
            fplan = gs3d.plan_forward(x.shape, q.shape, x.dtype, num_threads=nt, **cfg)
            assert fplan._res.xcl.size == copies * item, (n, nt)
            bplan = gs3d.plan_backward(go.shape, x.shape, q.shape, x.dtype, num_threads=nt,
                                       output_mask=(False, True), **cfg)
            assert bplan._res.xcl.size == (1 if cfg.get("mode") == "nearest"
                                           else copies * item), (n, nt)
            for _ in range(2):
                assert same(fplan(x, q), want[0]), (n, nt)
                assert same(bplan(go, x, q)[1], want[2]), (n, nt)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_threads_take_whole_batch_items_against_torch(dtype):
    torch = pytest.importorskip("torch")
    x, q, go = make(dtype, 16, n=4, seed=8)
    want_dx, want_dg = (t.numpy() for t in torch.ops.aten.grid_sampler_3d_backward(
        torch.from_numpy(go), torch.from_numpy(x), torch.from_numpy(q), 0, 0, False,
        [True, True]))
    plan = gs3d.plan_backward(go.shape, x.shape, q.shape, x.dtype, num_threads=2)
    assert _acc_count(plan) == 2
    dx, dg = plan(go, x, q)
    assert rel_err(dx, want_dx) <= TOLERANCE[dtype] and rel_err(dg, want_dg) <= TOLERANCE[dtype]


def test_threads_take_whole_batch_items_against_finite_differences():
    """float64, four items on two threads: central differences of sum(grad * forward) along
    random directions of the input (the forward is linear in it) and of the grid."""
    x, q, go = make("float64", 8, n=4, seed=9)
    q = 0.9 * q                     # away from the borders, where the forward has kinks
    plan = gs3d.plan_backward(go.shape, x.shape, q.shape, x.dtype, num_threads=2)
    assert _acc_count(plan) == 2
    dx, dg = plan(go, x, q)
    rng = np.random.default_rng(10)

    def loss(xv, qv):
        return float(np.sum(go * gs3d.grid_sample_3d(xv, qv)))

    for _ in range(3):
        v = rng.standard_normal(x.shape)
        fd = (loss(x + 1e-3 * v, q) - loss(x - 1e-3 * v, q)) / 2e-3
        assert abs(fd - np.sum(dx * v)) <= 1e-9 * max(1.0, abs(fd))
    h = 1e-7
    for _ in range(3):
        v = rng.standard_normal(q.shape)
        fd = (loss(x, q + h * v) - loss(x, q - h * v)) / (2 * h)
        assert abs(fd - np.sum(dg * v)) <= 1e-5 * max(1.0, abs(fd))


@pytest.mark.parametrize("cfg", CFGS[:3], ids=["zeros", "border-ac", "reflection"])
@pytest.mark.parametrize("n", [1, 3])
def test_forward_eight_channels(cfg, n):
    """float32 NCDHW with C = 8 runs its forward through the channels-last copy (not the
    gather of each channel plane): against the reference and PyTorch, at 1 and 2 threads,
    with the bits of the NDHWC layout."""
    x, q, go = make("float32", 8, n=n, seed=11)
    assert pays(x, q)
    want = ref.grid_sample_3d(x.astype(np.float64), q.astype(np.float64), **cfg)
    cl_bits = channels_last_results(x, q, go, (True, True), cfg)[0]
    try:
        import torch
        tw = torch.nn.functional.grid_sample(
            torch.from_numpy(x), torch.from_numpy(q), mode="bilinear",
            padding_mode=cfg.get("padding_mode", "zeros"),
            align_corners=cfg.get("align_corners", False)).numpy()
    except ImportError:
        tw = None
    for nt in (1, 2):
        f = gs3d.grid_sample_3d(x, q, num_threads=nt, **cfg)
        assert rel_err(f, want) <= TOLERANCE["float32"] and same(f, cl_bits), nt
        if tw is not None:
            assert rel_err(f, tw) <= TOLERANCE["float32"], nt


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,threads", [(1, 1), (1, 2), (2, 2)])
def test_channels_last_layout_with_strided_channels(dtype, n, threads):
    """layout="NDHWC" with an input whose channels are strided (``np.moveaxis`` of an NCDHW
    array): the forward and the grid gradient alone take the channels-last copy as NCDHW does
    (reading the channel planes in place cost 4-7x), its buffer made by the first such call,
    through plain calls, plans and the forward plan's fast path; the results are the bits of
    the contiguous input, and a contiguous input makes no copy."""
    x, q, go = make(dtype, 8, n=n, seed=50 + n)
    assert pays(x, q)
    xc, xv, gol = cl(x), np.moveaxis(x, 1, 4), cl(go)
    assert xv.strides[4] != xv.itemsize
    item = xc[0].size
    # with at least as many items as threads, one copy per thread (float64: twice as many)
    copies = threads if 1 < threads <= n and threads * x.itemsize <= 4 * n else 1
    dg_only = dict(layout="NDHWC", output_mask=(False, True), num_threads=threads)
    for cfg in CFGS:
        fwd = dict(layout="NDHWC", num_threads=threads, **cfg)
        f_want = gs3d.grid_sample_3d(xc, q, **fwd)
        dg_want = gs3d.grid_sample_3d_backward(gol, xc, q, **dg_only, **cfg)[1]
        fplan = gs3d.plan_forward(xc.shape, q.shape, x.dtype, **fwd)
        bplan = gs3d.plan_backward(gol.shape, xc.shape, q.shape, x.dtype, **dg_only, **cfg)
        sizes = fplan.workspace_size, bplan.workspace_size
        assert same(fplan(xc, q), f_want) and same(bplan(gol, xc, q)[1], dg_want)
        assert (fplan.workspace_size, bplan.workspace_size) == sizes, "copied a contiguous input"
        # with the input gradient too (read in place, or copied into input_grad and summed
        # in a channels-last accumulator): the bits of the depth slabs, as a contiguous input
        # gives them into a strided input_grad (never the split of the points)
        got = gs3d.grid_sample_3d_backward(gol, xv, q, **fwd)
        for a, b in zip((np.moveaxis(got[0], 4, 1), got[1]),
                        _no_split_channels_last(x, q, go, (True, True), cfg, threads)):
            assert same(a, b), cfg
        # float32/float64 make the accumulator on the first such call, unless they have the
        # split's (N = 1); 16-bit storage has its own; nearest reads no input
        full = gs3d.plan_backward(gol.shape, xc.shape, q.shape, x.dtype, **fwd)
        size = full.workspace_size
        for a, b in zip(full(gol, xv, q), got):
            assert same(a, b), cfg
        bilinear32 = x.itemsize >= 4 and cfg.get("mode") != "nearest"
        grows = bilinear32 and n > 1
        assert (full.workspace_size > size) == grows, cfg
        # and then a contiguous input needs no input copy, even into a strided input_grad
        size = full.workspace_size
        buf = np.zeros(xc.shape[:4] + (2 * xc.shape[4],), x.dtype)[..., ::2]
        full(gol, xc, q, input_grad=buf)
        assert full.workspace_size == size and full._res.xcl.size == 1, cfg
        has_acc = bilinear32 or x.itemsize < 4
        assert full._res.dx_acc.shape[-4:] == (xc.shape[1:] if has_acc else (1, 1, 1, 1)), cfg
        for _ in range(2):
            assert same(gs3d.grid_sample_3d(xv, q, **fwd), f_want), cfg
            assert same(gs3d.grid_sample_3d_backward(gol, xv, q, **dg_only, **cfg)[1],
                        dg_want), cfg
            assert same(fplan(xv, q), f_want), cfg
            assert same(bplan(gol, xv, q)[1], dg_want), cfg
        # the kernels write the copy into the new buffers: each item-sized part of them then
        # holds one batch item channels-last (one part per thread when the threads take whole
        # items; a thread may have taken none); nearest's backward never reads the input
        for plan, used in ((fplan, True), (bplan, cfg.get("mode") != "nearest")):
            xcl = plan._res.xcl
            assert (plan.workspace_size > sizes[plan is bplan]) == used, cfg
            assert xcl.size == (item * copies if used else 1), cfg
            if not used:
                continue
            xcl.view(np.uint8)[...] = 0xFF          # all ones: a NaN in every format
            assert same(fplan(xv, q) if plan is fplan else bplan(gol, xv, q)[1],
                        f_want if plan is fplan else dg_want), cfg
            held = [any(same(part, xc[j].ravel()) for j in range(n))
                    for part in xcl.reshape(-1, item)]
            assert any(held) and all(h or (part.view(np.uint8) == 0xFF).all()
                                     for h, part in zip(held, xcl.reshape(-1, item))), cfg


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,threads", [(1, 1), (1, 2), (2, 2), (3, 2)])
def test_ncdhw_input_channels_last_in_memory(dtype, n, threads):
    """An NCDHW call whose input is channels-last in memory (a torch channels_last_3d tensor's
    array) and whose input_grad is not: the scatter goes into the channels-last accumulator
    (float32/float64 as 16-bit storage; into the channel planes it cost up to 9x), which then
    holds input_grad channels-last; the bits of the contiguous input, whatever input_grad's
    memory order, for every padding and nearest; a channels-last float32/float64 input_grad
    takes the sums itself."""
    x, q, go = make(dtype, 8, n=n, seed=60 + n)
    assert pays(x, q)
    xm = np.moveaxis(cl(x), 4, 1)                  # NCDHW shape, channels-last memory
    assert xm.strides[1] == xm.itemsize
    for cfg in CFGS:
        kw = dict(num_threads=threads, **cfg)
        want = gs3d.grid_sample_3d_backward(go, x, q, **kw)
        assert same(gs3d.grid_sample_3d_backward(go, xm, q, **kw)[0], want[0]), cfg
        plan = gs3d.plan_backward(go.shape, x.shape, q.shape, x.dtype, **kw)
        acc = plan._res.dx_acc
        for dx in (np.zeros_like(x), np.moveaxis(np.zeros_like(cl(x)), 4, 1)):
            acc[...] = np.nan
            got = plan(go, xm, q, input_grad=dx)
            assert got[0] is dx and same(dx, want[0]) and same(got[1], want[1]), cfg
            # the accumulator holds batch items of input_grad channels-last (one per thread
            # when the threads take whole items; a thread may have taken none), unless
            # float32/float64 input_grad has its channels contiguous itself
            if dx.strides[1] == dx.itemsize and x.itemsize >= 4:
                assert np.isnan(acc).all(), cfg
                continue
            held = [[same(part.astype(x.dtype), cl(want[0])[j].ravel()) for j in range(n)]
                    for part in acc.reshape(-1, x[0].size)]
            assert any(map(any, held)), cfg
            assert all(any(h) or np.isnan(part).all()
                       for h, part in zip(held, acc.reshape(-1, x[0].size))), cfg


@pytest.mark.parametrize("C", [4, 7])
def test_few_channels_forward_copy_gates(C):
    """The float32 NCDHW forward of 4-7 channels takes the channels-last copy on any grid where
    the SIMD kernels run (on a scattered, uniformly random, one in the baseline module), for a
    batch item of at least FEW_FWD_MIN_KIB (1 MiB) where each thread runs whole batch items
    (one thread, or N >= threads), of at least FEW_FWD_SHARED_MIN_KIB (4 MiB) where threads
    share one; it reads the channel planes in place on smaller items, and on a smooth grid in
    the baseline module.  The bits of the NDHWC layout either way, at 1 and 2 threads, right
    against the reference (and PyTorch, whose own float32 error on these volumes comes near
    the spec's 1e-5: checked at twice that)."""
    rng = np.random.default_rng(70 + C)
    D, H, W = 32, 64, 64 if C == 4 else 40           # 2 MiB, 2.2 MiB per item
    x = rng.standard_normal((2, C, D, H, W)).astype(np.float32)
    assert x[0].nbytes >= 2 << 20
    lin = np.linspace(-0.9, 0.9, 64)
    smooth = np.stack(np.meshgrid(lin, lin, lin, indexing="ij")[::-1], axis=-1)[None]
    smooth = np.concatenate([smooth, smooth[:, ::-1]])
    grids = {"random": rng.uniform(-1.1, 1.1, (2, 64, 64, 64, 3)),
             "smooth": smooth + 0.01 * rng.standard_normal(smooth.shape)}
    rule, bilinear = _api._kernels.few_channels_forward, _api.MODES["bilinear"]
    assert rule(4, C, D, H, W, bilinear) and not rule(4, C, D, H, W, _api.MODES["nearest"])
    assert not rule(2, C, D, H, W, bilinear) and not rule(4, C, D, H, W, bilinear, False)
    # the gates: 1 MiB per batch item (4 channels of 64 x 64 x 16, or 7 of 32 x 32 x 37), and
    # 4 MiB where threads share one (4 channels of 64 x 64 x 64, 5 of 64 x 64 x 52)
    assert rule(4, 4, 16, 64, 64, bilinear) and not rule(4, 4, 15, 64, 64, bilinear)
    assert rule(4, 7, 37, 32, 32, bilinear) and not rule(4, 7, 36, 32, 32, bilinear)
    assert rule(4, 4, 64, 64, 64, bilinear, False)
    assert not rule(4, 4, 63, 64, 64, bilinear, False)
    assert rule(4, 5, 52, 64, 64, bilinear, False)
    assert not rule(4, 5, 51, 64, 64, bilinear, False)
    try:
        import torch
    except ImportError:
        torch = None
    for kind, q in grids.items():
        q = q.astype(np.float32)
        want = np.moveaxis(gs3d.grid_sample_3d(cl(x), q, layout="NDHWC", num_threads=1), 4, 1)
        exact = ref.grid_sample_3d(x.astype(np.float64), q.astype(np.float64))
        assert rel_err(want, exact) <= TOLERANCE["float32"]
        if torch is not None:
            tw = torch.nn.functional.grid_sample(torch.from_numpy(x), torch.from_numpy(q),
                                                 align_corners=False).numpy()
            assert rel_err(want, tw) <= 2 * TOLERANCE["float32"]
        # (batch items, threads): one thread, or a whole item per thread, copy; two threads
        # sharing one item of 2 MiB do not
        for n, nt in ((1, 1), (2, 1), (2, 2), (1, 2)):
            plan = gs3d.plan_forward(x[:n].shape, q[:n].shape, np.float32, num_threads=nt)
            xcl = plan._res.xcl
            copies = n >= nt
            assert xcl.size == (x[0].size * nt if copies else 1)
            xcl[...] = np.nan
            assert same(plan(x[:n], q[:n]), want[:n]), (kind, n, nt)
            # the copy is in the plan's buffer after any grid (the baseline module: after a
            # scattered one): each thread's part holds the last batch item it ran, the last item
            # among them (the items are handed out in order, schedule='dynamic', so on a busy
            # machine one thread may run both while the other has not started: its part
            # stays NaN)
            if copies:
                took = kind == "random" or _api.SIMD_LEVEL != "baseline"
                parts = [bytes(p.view(np.uint8)) for p in np.split(xcl, nt)]
                items = [bytes(cl(x[k:k + 1]).view(np.uint8)) for k in range(n)]
                unused = bytes(np.full(x[0].size, np.nan, np.float32).view(np.uint8))
                if took:
                    assert items[-1] in parts, (kind, n, nt)
                    assert all(p in items or p == unused for p in parts), (kind, n, nt)
                else:
                    assert parts == [unused] * nt, (kind, n, nt)
        # an output whose channels and points are both strided, which the load branches do not
        # write: the SIMD modules too take the copy there on a scattered grid alone
        plan = gs3d.plan_forward(x[:1].shape, q[:1].shape, np.float32, num_threads=1)
        plan._res.xcl[...] = np.nan
        out = np.full((1, C, 64, 64, 128), 5.0, np.float32)[..., ::2]
        assert plan(x[:1], q[:1], out=out) is out
        assert same(out, want[:1]) and (out.base[..., 1::2] == 5.0).all(), kind
        assert np.isnan(plan._res.xcl).all() == (kind != "random"), kind


@pytest.mark.parametrize("C,S", [(4, 64), (5, 60), (7, 54)])
def test_few_channel_forward_shares_a_copy_from_4_MiB(C, S):
    """Four to seven channels, one batch item of just over 4 MiB on two threads
    (FEW_FWD_SHARED_MIN_KIB): both threads read one channels-last copy, on a random grid and a
    smooth one, into NCDHW output C channel runs at a time (a last block of one point: 41^3
    points).  The bits of the NDHWC layout, and of a channels-last view passed as NCDHW (read
    in place)."""
    rng = np.random.default_rng(75 + C)
    So = 41
    assert 4 << 20 <= C * S ** 3 * 4 < 5 << 20
    x = rng.standard_normal((1, C, S, S, S)).astype(np.float32)
    lin = np.linspace(-0.95, 0.95, So)
    smooth = np.stack(np.meshgrid(lin, lin, lin, indexing="ij")[::-1], axis=-1)[None]
    grids = {"random": rng.uniform(-1.1, 1.1, (1, So, So, So, 3)),
             "smooth": smooth + 0.01 * rng.standard_normal(smooth.shape)}
    view = np.moveaxis(cl(x), 4, 1)             # NCDHW, channel stride 1
    for kind, q in grids.items():
        q = q.astype(np.float32)
        want = np.moveaxis(gs3d.grid_sample_3d(cl(x), q, layout="NDHWC", num_threads=1), 4, 1)
        assert rel_err(want, ref.grid_sample_3d(x.astype(np.float64), q.astype(np.float64))) \
            <= TOLERANCE["float32"]
        plan = gs3d.plan_forward(x.shape, q.shape, np.float32, num_threads=2)
        xcl = plan._res.xcl
        assert xcl.size == x[0].size
        xcl[...] = np.nan
        assert same(plan(x, q), want), kind
        # (the baseline module reads the planes of a smooth grid)
        if kind == "random" or _api.SIMD_LEVEL != "baseline":
            assert same(xcl, cl(x).ravel()), kind
        else:
            assert np.isnan(xcl).all()
        assert same(gs3d.grid_sample_3d(view, q, num_threads=2), want), kind
