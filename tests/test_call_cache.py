"""The per-call signature cache of the plain functions (gs3d._api._calls) and the quick checks
of plans: same results, same errors, bounded, safe from several threads."""
import threading

import numpy as np
import pytest

import gs3d
from gs3d import GridSamplerError, _api
from conftest import np_dtype


@pytest.fixture(autouse=True)
def _fresh_cache():
    _api.clear_cache()
    yield
    _api.clear_cache()


def _case(rng, dtype="float32", layout="NCDHW", C=3):
    dt = np_dtype(dtype)
    x = rng.standard_normal((2, C, 5, 6, 7)).astype(dt)
    g = rng.standard_normal((2, C, 4, 5, 3)).astype(dt)
    q = rng.uniform(-1.2, 1.2, (2, 4, 5, 3, 3)).astype(dt)
    if layout == "NDHWC":
        x, g = (np.ascontiguousarray(np.moveaxis(a, 1, 4)) for a in (x, g))
    return g, x, q


def _bits(a):
    return None if a is None else np.ascontiguousarray(a).view(np.uint8).tobytes()


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "bfloat16"])
@pytest.mark.parametrize("layout", ["NCDHW", "NDHWC"])
def test_cached_calls_give_the_first_calls_bits(dtype, layout):
    g, x, q = _case(np.random.default_rng(0), dtype, layout)
    kw = dict(layout=layout, mode="nearest", padding_mode="border", align_corners=True)
    fwd = [gs3d.grid_sample_3d(x, q, **kw) for _ in range(3)]
    bwd = [gs3d.grid_sample_3d_backward(g, x, q, **kw) for _ in range(3)]
    assert len(_api._calls) == 2
    out = np.full_like(fwd[0], 7)
    dx, dq = np.full_like(x, 7), np.full_like(q, 7)
    assert gs3d.grid_sample_3d(x, q, out=out, **kw) is out
    r = gs3d.grid_sample_3d_backward(g, x, q, input_grad=dx, grid_grad=dq, **kw)
    assert r[0] is dx and r[1] is dq
    for a in fwd[1:] + [out]:
        assert _bits(a) == _bits(fwd[0])
    for a, b in bwd[1:] + [(dx, dq)]:
        assert _bits(a) == _bits(bwd[0][0]) and _bits(b) == _bits(bwd[0][1])
    # and what a plan (which never uses the cache) gives
    plan = gs3d.plan_backward(g.shape, x.shape, q.shape, x.dtype, **kw)
    assert all(_bits(a) == _bits(b) for a, b in zip(plan(g, x, q), bwd[0]))


def test_masks_are_part_of_the_signature():
    g, x, q = _case(np.random.default_rng(1))
    full = gs3d.grid_sample_3d_backward(g, x, q)
    for mask in ([True, False], (False, True), (False, False), [True, False]):
        got = gs3d.grid_sample_3d_backward(g, x, q, output_mask=mask)
        for want_it, a, b in zip(mask, got, full):
            assert (a is None) != want_it
            if want_it:
                assert _bits(a) == _bits(b)


@pytest.mark.parametrize("good,bad", [
    (dict(align_corners=True), dict(align_corners=1)),
    (dict(align_corners=False), dict(align_corners=0)),
    (dict(mode=0), dict(mode=False)),
    (dict(padding_mode=1), dict(padding_mode=True)),
    (dict(num_threads=1), dict(num_threads=True)),
    (dict(output_mask=(True, True)), dict(output_mask=(1, 1))),
    (dict(output_mask=[True, False]), dict(output_mask=[1, 0])),
    (dict(output_mask=(True, True)), dict(output_mask=(True, True, True))),
    (dict(deterministic=True), dict(deterministic=1)),
])
def test_a_cached_signature_does_not_accept_equal_values_of_other_types(good, bad):
    """1 == True and hash(1) == hash(True): the cache must not let a rejected value in."""
    g, x, q = _case(np.random.default_rng(2))
    backward_only = {"output_mask", "deterministic"}
    ops = ["bwd"] if set(good) & backward_only else ["fwd", "bwd"]
    for op in ops:
        run = ((lambda **k: gs3d.grid_sample_3d(x, q, **k)) if op == "fwd" else
               (lambda **k: gs3d.grid_sample_3d_backward(g, x, q, **k)))
        run(**good)
        run(**good)
        with pytest.raises(GridSamplerError):
            run(**bad)


def test_output_errors_on_a_cached_signature_write_nothing():
    g, x, q = _case(np.random.default_rng(3))
    gs3d.grid_sample_3d(x, q)
    gs3d.grid_sample_3d_backward(g, x, q)
    with pytest.raises(GridSamplerError, match="overlaps the input input"):
        gs3d.grid_sample_3d(x, q, out=x[:, :, :4, :5, :3])
    ro = np.full(g.shape, 7, g.dtype)
    ro.flags.writeable = False
    with pytest.raises(GridSamplerError, match="read-only"):
        gs3d.grid_sample_3d(x, q, out=ro)
    dx, dq = np.full_like(x, 7), np.full_like(q, 7)
    with pytest.raises(GridSamplerError, match="grid_grad overlaps the input grid"):
        gs3d.grid_sample_3d_backward(g, x, q, input_grad=dx, grid_grad=q)
    assert (dx == 7).all() and (dq == 7).all()
    with pytest.raises(GridSamplerError, match="input_grad overlaps the input input"):
        gs3d.grid_sample_3d_backward(g, x, q, input_grad=x, grid_grad=dq)
    with pytest.raises(GridSamplerError, match="grid_grad overlaps input_grad"):
        gs3d.grid_sample_3d_backward(g, x, q, input_grad=dx,
                                     grid_grad=dx.reshape(-1)[:q.size].reshape(q.shape))
    assert (dx == 7).all() and (dq == 7).all()


def test_cache_and_pools_are_bounded():
    rng = np.random.default_rng(4)
    for n in range(3 * _api._CALLS_MAX):
        x = rng.standard_normal((1, 1, 2, 2, 2 + n)).astype(np.float32)
        q = rng.uniform(-1, 1, (1, 1, 1, 2, 3)).astype(np.float32)
        gs3d.grid_sample_3d(x, q)
        assert len(_api._calls) <= _api._CALLS_MAX
    # a big problem's scratch is not pooled with its signature but kept in the shared slots
    x = np.zeros((1, 1, 4, 4, 4), np.float16)
    q = np.zeros((1, 64, 64, 8, 3), np.float16)
    g = np.zeros((1, 1, 64, 64, 8), np.float16)
    gs3d.grid_sample_3d_backward(g, x, q, num_threads=4)
    call = next(c for c in _api._calls.values() if c.pb.kind == "f2")
    assert _api._Resources(call.pb, 4, True).nbytes > _api._POOL_MAX_BYTES
    assert call.pool[1] == [] and _api._big[-1].key[0] == call.pb
    # at most _POOL_DEPTH idle scratch sets per signature, however many threads called it
    g, x, q = _case(rng)
    results, barrier = [], threading.Barrier(6)

    def work():
        barrier.wait()
        for _ in range(20):
            results.append(gs3d.grid_sample_3d_backward(g, x, q, num_threads=1))

    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for call in _api._calls.values():
        assert len(call.pool[1]) <= _api._POOL_DEPTH
    assert all(_bits(a) == _bits(results[0][0]) for a, _ in results)


def test_threads_through_the_cache_give_serial_results():
    rng = np.random.default_rng(5)
    cases = [_case(rng, dt, lay) for dt in ("float32", "float16") for lay in ("NCDHW", "NDHWC")]
    lays = ["NCDHW", "NDHWC"] * 2
    want = [(gs3d.grid_sample_3d_backward(g, x, q, layout=lay),
             gs3d.grid_sample_3d(x, q, layout=lay)) for (g, x, q), lay in zip(cases, lays)]
    errors, barrier = [], threading.Barrier(8)

    def work(i):
        (g, x, q), lay = cases[i % 4], lays[i % 4]
        try:
            barrier.wait()
            for r in range(30):
                nt = None if r % 2 else 1 + r % 3
                dx, dq = gs3d.grid_sample_3d_backward(g, x, q, layout=lay, num_threads=nt)
                out = gs3d.grid_sample_3d(x, q, layout=lay, num_threads=nt)
                (wdx, wdq), wout = want[i % 4]
                assert _bits(dx) == _bits(wdx) and _bits(dq) == _bits(wdq)
                assert _bits(out) == _bits(wout)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append((i, exc))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


@pytest.mark.parametrize("num_threads", [None, 1, 2, 3, 10 ** 6])
@pytest.mark.parametrize("size", [(1, 1, 2, 2, 3), (2, 16, 32, 32, 3), (1, 64, 64, 64, 3)])
def test_cached_thread_count_follows_the_rules(num_threads, size, monkeypatch):
    """_Call.acquire() takes _threads(num_threads, work) threads: OpenMP's default read at
    each call; one thread in a forked child (the reduction for small calls, at the real
    _WORK_PER_THREAD: test_small_calls_use_fewer_threads)."""
    x = np.zeros((size[0], 8, 4, 4, 4), np.float32)
    q = np.zeros(size, np.float32)
    pb = gs3d._validation.check_problem(x, q, None, "bilinear", "zeros", False, "NCDHW")
    call = _api._Call(pb, (), num_threads)
    work = pb.N * int(np.prod(pb.out_spatial)) * pb.C
    for default in (1, 2, 5):
        monkeypatch.setattr(_api._kernels, "max_threads", lambda d=default: d)
        assert call.acquire().nt == _api._threads(num_threads, work)
    monkeypatch.setattr(_api, "_forked_child", True)
    assert call.acquire().nt == 1 == _api._threads(num_threads, work)


@pytest.mark.parametrize("num_threads", [None, 2, 4])
def test_small_calls_use_fewer_threads(num_threads, monkeypatch):
    """At most ``num_threads`` threads, and one per _WORK_PER_THREAD point-channels: the
    worked example runs on one thread whatever is asked, a large call on what is asked."""
    monkeypatch.setattr(_api, "_WORK_PER_THREAD", 32768)
    monkeypatch.setattr(_api._kernels, "max_threads", lambda: 4)
    x = np.zeros((1, 8, 4, 4, 4), np.float32)
    for size, want in (((1, 1, 2, 2, 3), 1), ((1, 32, 32, 32, 3), num_threads or 4)):
        q = np.zeros(size, np.float32)
        pb = gs3d._validation.check_problem(x, q, None, "bilinear", "zeros", False, "NCDHW")
        work = int(np.prod(size[:4])) * 8
        assert _api._threads(num_threads, work) == want
        assert _api._Call(pb, (), num_threads).acquire().nt == want
    assert _api._threads(3, 2 * 32768) == 2


def test_plan_quick_checks_keep_the_errors():
    g, x, q = _case(np.random.default_rng(6))
    plan = gs3d.plan_backward(g.shape, x.shape, q.shape, x.dtype)
    fplan = gs3d.plan_forward(x.shape, q.shape, x.dtype)
    dx, dq, out = np.full_like(x, 7), np.full_like(q, 7), np.full_like(g, 7)
    with pytest.raises(GridSamplerError, match="planned shape"):
        plan(g, x[:1], q)
    with pytest.raises(GridSamplerError, match="planned shape"):
        fplan(x, q.astype(np.float64))
    with pytest.raises(GridSamplerError, match="input_grad overlaps the input input"):
        plan(g, x, q, input_grad=x, grid_grad=dq)
    with pytest.raises(GridSamplerError, match="grid_grad overlaps input_grad"):
        plan(g, x, q, input_grad=dx, grid_grad=dx.reshape(-1)[-q.size:].reshape(q.shape))
    with pytest.raises(GridSamplerError, match="out overlaps the input input"):
        fplan(x, q, out=x.reshape(-1)[:g.size].reshape(g.shape))
    assert (dx == 7).all() and (dq == 7).all() and (out == 7).all()
    # views that do not overlap are accepted (they go through np.may_share_memory)
    big = np.full((2,) + out.shape, 7, out.dtype)
    view = big[1]
    assert fplan(x, q, out=view) is view
    assert _bits(view) == _bits(fplan(x, q)) and (big[0] == 7).all()


def test_a_mutated_mask_list_is_checked_again():
    """The last-signature memo matches options by identity, so it must never hold a mutable
    object: a list mask changed in place between calls is validated again."""
    g, x, q = _case(np.random.default_rng(7))
    mask = [True, True]
    gs3d.grid_sample_3d_backward(g, x, q, output_mask=mask)
    gs3d.grid_sample_3d_backward(g, x, q, output_mask=mask)
    mask[0] = 1
    with pytest.raises(GridSamplerError, match="output_mask"):
        gs3d.grid_sample_3d_backward(g, x, q, output_mask=mask)
    mask[0] = False
    dx, dq = gs3d.grid_sample_3d_backward(g, x, q, output_mask=mask)
    assert dx is None and dq is not None


def test_alternating_signatures_give_their_own_results():
    rng = np.random.default_rng(8)
    cases = [_case(rng, C=c) for c in (1, 2, 3)]
    want = [(gs3d.grid_sample_3d(x, q), gs3d.grid_sample_3d_backward(g, x, q))
            for g, x, q in cases]
    for r in range(3 * len(cases)):
        g, x, q = cases[r % len(cases)]
        wf, (wdx, wdq) = want[r % len(cases)]
        assert _bits(gs3d.grid_sample_3d(x, q)) == _bits(wf)
        dx, dq = gs3d.grid_sample_3d_backward(g, x, q)
        assert _bits(dx) == _bits(wdx) and _bits(dq) == _bits(wdq)
        if r == 4:
            _api.clear_cache()


def _message(fn):
    with pytest.raises(GridSamplerError) as ei:
        fn()
    return ei.value.code, str(ei.value)


def _overlap_cases(x, q, go):
    """(target, bad buffer) pairs that share memory with an input or the other output."""
    flat_x, flat_go = x.reshape(-1), go.reshape(-1)
    return [
        ("out", flat_x[:go.size].reshape(go.shape) if x.size >= go.size else None),
        ("input_grad", x), ("input_grad", flat_go[:x.size].reshape(x.shape)
                            if go.size >= x.size else None),
        ("grid_grad", q), ("grid_grad", q[::-1]), ("input_grad", x[:, ::-1]),
    ]


@pytest.mark.parametrize("layout", ["NCDHW", "NDHWC"])
def test_plans_reject_bad_buffers_like_the_functions(layout):
    """Plans and cached signatures share the quick output checks; every rejection must match
    the plain function's (cold cache) error and write nothing."""
    import test_errors as te
    x, q, go = te.make(layout=layout, N=2, C=3, D=4, H=5, W=6, Do=4, Ho=5, Wo=6)
    fplan = gs3d.plan_forward(x.shape, q.shape, x.dtype, layout=layout)
    bplan = gs3d.plan_backward(go.shape, x.shape, q.shape, x.dtype, layout=layout)
    cases = [(t, te.BUFFER_CASES[c](te.buffers("fwd" if t == "out" else "bwd", x, q, go)[t],
                                    layout))
             for c in sorted(te.BUFFER_CASES) if c != "torch_tensor"
             for t in ("out", "input_grad", "grid_grad")]
    cases += [c for c in _overlap_cases(x, q, go) if c[1] is not None]
    dx = np.full(x.shape, 7.0)
    cases.append(("grid_grad", dx.reshape(-1)[:q.size].reshape(q.shape)))
    for target, bad in cases:
        if target == "out":
            bufs = {"out": bad}
            plain = lambda: gs3d.grid_sample_3d(x, q, layout=layout, **bufs)  # noqa: E731
            planned = lambda: fplan(x, q, **bufs)  # noqa: E731
        else:
            bufs = te.buffers("bwd", x, q, go)
            if target == "grid_grad":
                bufs["input_grad"] = dx
            bufs[target] = bad
            plain = lambda: gs3d.grid_sample_3d_backward(go, x, q, layout=layout, **bufs)  # noqa: E731,E501
            planned = lambda: bplan(go, x, q, **bufs)  # noqa: E731
        snap = te.snapshot(list(bufs.values()) + [x, q, go, dx])
        _api.clear_cache()
        want = _message(plain)
        gs3d.grid_sample_3d(x, q, layout=layout)          # warm the cache: same errors
        gs3d.grid_sample_3d_backward(go, x, q, layout=layout)
        assert _message(plain) == want, (target, bad)
        assert _message(planned) == want, (target, bad)
        te.assert_unchanged(snap)


def test_quick_output_checks_accept_what_check_output_accepts():
    """Buffers the ownership test cannot clear (views) are still accepted when valid."""
    g, x, q = _case(np.random.default_rng(9))
    want_out = gs3d.grid_sample_3d(x, q)
    want_dx, want_dq = gs3d.grid_sample_3d_backward(g, x, q)
    fplan = gs3d.plan_forward(x.shape, q.shape, x.dtype)
    bplan = gs3d.plan_backward(g.shape, x.shape, q.shape, x.dtype)
    for run_f, run_b in ((lambda **k: gs3d.grid_sample_3d(x, q, **k),
                          lambda **k: gs3d.grid_sample_3d_backward(g, x, q, **k)),
                         (lambda **k: fplan(x, q, **k), lambda **k: bplan(g, x, q, **k))):
        both = np.full((2,) + x.shape, 7, x.dtype)           # two halves of one allocation
        out = np.full((2,) + want_out.shape, 7, x.dtype)[1]
        dq = np.asfortranarray(np.full(q.shape, 7, q.dtype))
        assert run_f(out=out) is out and _bits(out) == _bits(want_out)
        view = both[0]
        dx, dq2 = run_b(input_grad=view, grid_grad=dq)
        assert dx is view
        assert _bits(both[0]) == _bits(want_dx) and (both[1] == 7).all()
        assert _bits(dq) == _bits(want_dq) and dq2 is dq
        # inputs that are views (not owners) go through np.may_share_memory
        xs = np.stack([x, x])[0]
        assert _bits(gs3d.grid_sample_3d(xs, q, out=out)) == _bits(want_out)


def test_big_scratch_is_reused_and_bounded(monkeypatch):
    """Scratch sets too big for a signature's pool are kept in a few shared slots: the next
    plain call of the same problem, thread count and mask takes the same set (and gives the
    same bits); the slots hold at most _BIG_SLOTS sets and _BIG_MAX_BYTES, the oldest dropped
    first; a set over _BIG_SET_MAX_BYTES is not kept; clear_cache frees them all."""
    rng = np.random.default_rng(8)
    x = rng.standard_normal((2, 12, 16, 16, 16)).astype(np.float32)   # the channels-last copies
    g = rng.standard_normal((2, 12, 12, 12, 12)).astype(np.float32)
    q = rng.uniform(-1.1, 1.1, (2, 12, 12, 12, 3)).astype(np.float32)
    first = gs3d.grid_sample_3d_backward(g, x, q, num_threads=2)
    assert len(_api._big) == 1
    kept = _api._big[0]
    assert kept.nbytes > _api._POOL_MAX_BYTES and kept.dx_acc.size > 1
    for _ in range(2):
        again = gs3d.grid_sample_3d_backward(g, x, q, num_threads=2)
        assert _api._big == [kept]
        assert all(_bits(a) == _bits(b) for a, b in zip(again, first))
    # another mask or thread count is another set
    gs3d.grid_sample_3d_backward(g, x, q, num_threads=1)
    gs3d.grid_sample_3d_backward(g, x, q, num_threads=2, output_mask=(True, False))
    assert len(_api._big) == 3 and _api._big[0] is kept
    # at most _BIG_SLOTS sets, the oldest dropped first
    for W in range(8, 8 + _api._BIG_SLOTS):
        xw = np.zeros(x.shape[:4] + (W,), np.float32)
        gs3d.grid_sample_3d_backward(g, xw, q, num_threads=2)
    assert len(_api._big) == _api._BIG_SLOTS and kept not in _api._big
    # and at most _BIG_MAX_BYTES in all
    monkeypatch.setattr(_api, "_BIG_MAX_BYTES", 2 * kept.nbytes)
    gs3d.grid_sample_3d_backward(g, x, q, num_threads=2)
    assert sum(r.nbytes for r in _api._big) <= 2 * kept.nbytes and _api._big[-1].key == kept.key
    monkeypatch.setattr(_api, "_BIG_SET_MAX_BYTES", kept.nbytes - 1)
    gs3d.clear_cache()
    assert _api._big == [] and _api._calls == {}
    gs3d.grid_sample_3d_backward(g, x, q, num_threads=2)
    assert _api._big == []


def test_big_outputs_reuse_memory_their_callers_dropped(monkeypatch):
    """A new output of at least _RECYCLE_MIN_BYTES takes an idle buffer an earlier output left
    when nothing referred to it any more (a view keeps it), with the bits of an output the
    caller gives whatever the buffer held; idle buffers are bounded and clear_cache frees them;
    a list emptied during the search gives nothing."""
    monkeypatch.setattr(_api, "_RECYCLE_MIN_BYTES", 1 << 18)
    rng = np.random.default_rng(11)
    x = rng.standard_normal((1, 16, 24, 24, 24)).astype(np.float32)
    q = rng.uniform(-1.1, 1.1, (1, 24, 24, 24, 3)).astype(np.float32)
    g = rng.standard_normal((1, 16, 24, 24, 24)).astype(np.float32)
    want = gs3d.grid_sample_3d(x, q, out=np.empty_like(x))
    want_dx, want_dg = gs3d.grid_sample_3d_backward(g, x, q, input_grad=np.empty_like(x),
                                                    grid_grad=np.empty_like(q))
    out = gs3d.grid_sample_3d(x, q)
    assert _bits(out) == _bits(want) and out.ctypes.data % 64 == 0
    assert out.flags.c_contiguous and out.flags.writeable and _api._idle_out == []
    view = out[0, 3]
    seen = view.copy()
    del out
    assert _api._idle_out == []                 # the view still holds the buffer
    other = gs3d.grid_sample_3d(2 * x, q)
    assert not np.shares_memory(other, view) and np.array_equal(view, seen)
    del view
    assert len(_api._idle_out) == 1
    buf = _api._idle_out[0]
    buf[...] = 0xFF                             # NaN everywhere
    again = gs3d.grid_sample_3d(x, q)
    assert _api._idle_out == [] and np.shares_memory(again, buf) and _bits(again) == _bits(want)
    del again, other
    assert len(_api._idle_out) == 2
    for b in _api._idle_out:
        b[...] = 0xFF
    dx, dg = gs3d.grid_sample_3d_backward(g, x, q)
    assert _bits(dx) == _bits(want_dx) and _bits(dg) == _bits(want_dg)
    assert len(_api._idle_out) == 1 and not np.shares_memory(dx, _api._idle_out[0])
    # 16-bit outputs through the byte view keep their dtype
    xh, qh = x.astype(np.float16), q.astype(np.float16)
    h = gs3d.grid_sample_3d(xh, qh)
    assert h.dtype == np.float16 and h.ctypes.data % 64 == 0
    assert _bits(h) == _bits(gs3d.grid_sample_3d(xh, qh, out=np.empty_like(xh)))
    del h, dx, dg
    # bounded: at most _RECYCLE_SLOTS buffers and _RECYCLE_MAX_BYTES, the newest kept; a
    # request takes a buffer of its own size only
    gs3d.clear_cache()
    assert _api._idle_out == []
    monkeypatch.setattr(_api, "_RECYCLE_SLOTS", 2)
    u8 = np.dtype(np.uint8)
    a, b, c = (_api._recycled_empty((n,), u8, n) for n in (1 << 20, 3 << 20, 5 << 20))
    del a, b, c
    line = _api.LINE
    assert [b.nbytes for b in _api._idle_out] == [(3 << 20) + line, (5 << 20) + line]
    monkeypatch.setattr(_api, "_RECYCLE_MAX_BYTES", 5 << 20)
    a = _api._recycled_empty((1 << 20,), u8, 1 << 20)
    assert not any(np.shares_memory(a, b) for b in _api._idle_out)
    del a
    assert [b.nbytes for b in _api._idle_out] == [(1 << 20) + line]
    # a buffer over the bound is freed, not kept at the others' expense
    a = _api._recycled_empty((6 << 20,), u8, 6 << 20)
    del a
    assert [b.nbytes for b in _api._idle_out] == [(1 << 20) + line]
    # the list emptied while a buffer is looked for: nothing taken
    class Shrinking(list):
        def __getitem__(self, i):
            got = list.__getitem__(self, i)
            self.clear()
            return got
    monkeypatch.setattr(_api, "_idle_out", Shrinking(_api._idle_out))
    assert _api._take_idle((1 << 20) + line) is None


def test_recycled_outputs_are_never_shared_between_threads(monkeypatch):
    """Several Python threads making big outputs while they drop others: every output has the
    reference bits and no two live outputs share memory."""
    monkeypatch.setattr(_api, "_RECYCLE_MIN_BYTES", 1 << 18)
    rng = np.random.default_rng(12)
    x = rng.standard_normal((1, 16, 24, 24, 24)).astype(np.float32)
    q = rng.uniform(-1.1, 1.1, (1, 24, 24, 24, 3)).astype(np.float32)
    want = _bits(gs3d.grid_sample_3d(x, q, out=np.empty_like(x)))
    live, errors, lock, taken = [], [], threading.Lock(), []
    take = _api._take_idle

    def counted(size):
        got = take(size)
        taken.append(got is not None)
        return got
    monkeypatch.setattr(_api, "_take_idle", counted)

    def work():
        kept = []
        for _ in range(12):
            out = gs3d.grid_sample_3d(x, q, num_threads=1)
            with lock:
                if any(np.shares_memory(out, o) for o in live):
                    errors.append("shared")
                live.append(out)
            if _bits(out) != want:
                errors.append("bits")
            kept.append(out)
            if len(kept) > 2:
                old = kept.pop(0)
                with lock:
                    del live[next(i for i, o in enumerate(live) if o is old)]
                del old
    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(live) == 8
    assert len(taken) == 48 and any(taken)      # buffers were recycled
