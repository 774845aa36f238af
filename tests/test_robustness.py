"""Robustness of gs3d (issue 4, items 4, 5 and 7): concurrency and the GIL, leaks, fork.

The normal run keeps these quick.  ``python tests/test_robustness.py`` prints the measurements
behind them: the GIL overlap of two single-threaded calls in two Python threads, and the RSS
growth over 10,000 calls of each entry point (see scripts/README.md).
"""
import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import gs3d

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _bf16():
    try:
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    except ImportError:
        return np.dtype(np.float16)


# ---------------------------------------------------------------------------------------------
# concurrency: 8 Python threads, different arguments, results bitwise equal to the serial ones
# ---------------------------------------------------------------------------------------------

def _cases():
    rng = np.random.default_rng(4)
    dtypes = (np.float64, np.float32, np.float16, _bf16())
    modes = ("bilinear", "nearest")
    pads = ("zeros", "border", "reflection")
    cases = []
    for i in range(8):
        dt = np.dtype(dtypes[i % 4])
        layout = "NDHWC" if i % 3 == 0 else "NCDHW"
        N, C = 1 + i % 2, 1 + i % 3
        D, H, W = 6 + i, 9 - i % 4, 7 + i % 3
        Do, Ho, Wo = 5 + i % 3, 6, 4 + i
        x = rng.standard_normal((N, C, D, H, W))
        go = rng.standard_normal((N, C, Do, Ho, Wo))
        if layout == "NDHWC":
            x, go = np.moveaxis(x, 1, 4), np.moveaxis(go, 1, 4)
        grid = rng.uniform(-1.2, 1.2, (N, Do, Ho, Wo, 3))
        grid.ravel()[::17] = np.nan
        cases.append(dict(
            args=(go.astype(dt), x.astype(dt), grid.astype(dt)),
            kw=dict(mode=modes[i % 2], padding_mode=pads[i % 3], align_corners=bool(i % 2),
                    layout=layout, num_threads=(1, 2, None)[i % 3],
                    output_mask=((True, True), (True, False), (False, True))[i % 3])))
    return cases


def _same(a, b):
    if a is None or b is None:
        return a is None and b is None
    return (a.dtype == b.dtype and a.shape == b.shape
            and np.array_equal(np.ascontiguousarray(a).view(np.uint8),
                               np.ascontiguousarray(b).view(np.uint8)))


def test_eight_threads_backward_equals_serial():
    cases = _cases()
    serial = [gs3d.grid_sample_3d_backward(*c["args"], **c["kw"]) for c in cases]
    rounds = 6
    results = [[None] * rounds for _ in cases]
    errors = []
    barrier = threading.Barrier(len(cases))

    def work(i):
        try:
            barrier.wait()
            for r in range(rounds):
                results[i][r] = gs3d.grid_sample_3d_backward(*cases[i]["args"], **cases[i]["kw"])
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append((i, exc))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(cases))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for i, want in enumerate(serial):
        for r in range(rounds):
            got = results[i][r]
            assert _same(got[0], want[0]) and _same(got[1], want[1]), (i, r)


def test_threads_sharing_one_input_forward_and_backward():
    """Many threads reading the same (read-only) arrays, each writing its own given buffers."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 9, 8, 7)).astype(np.float32)
    grid = rng.uniform(-1.1, 1.1, (2, 6, 5, 4, 3)).astype(np.float32)
    go = rng.standard_normal((2, 3, 6, 5, 4)).astype(np.float32)
    for a in (x, grid, go):
        a.flags.writeable = False
    want_out = gs3d.grid_sample_3d(x, grid, padding_mode="reflection")
    want = gs3d.grid_sample_3d_backward(go, x, grid, padding_mode="reflection")
    bad = []

    def work(k):
        out = np.empty_like(want_out)
        dx, dg = np.empty_like(want[0]), np.empty_like(want[1])
        for _ in range(20):
            gs3d.grid_sample_3d(x, grid, padding_mode="reflection", out=out,
                                num_threads=1 + k % 2)
            gs3d.grid_sample_3d_backward(go, x, grid, padding_mode="reflection",
                                         input_grad=dx, grid_grad=dg, num_threads=1 + k % 2)
            if not (_same(out, want_out) and _same(dx, want[0]) and _same(dg, want[1])):
                bad.append(k)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not bad


# ---------------------------------------------------------------------------------------------
# the GIL: released during kernels.  Measured, not asserted on timing.
# ---------------------------------------------------------------------------------------------

def _gil_problem(size):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 4, size, size, size)).astype(np.float32)
    grid = rng.uniform(-1, 1, (1, size, size, size, 3)).astype(np.float32)
    go = rng.standard_normal((1, 4, size, size, size)).astype(np.float32)
    return go, x, grid


def gil_overlap(size=48, repeats=3):
    """Two single-threaded backward calls, one after the other and then in two Python threads.

    The same 2 x ``repeats`` calls both times.  Returns a dict: serial and concurrent wall
    times, their ratio (about 0.5 when the kernels run at the same time on two idle cores, about
    1 when one waits for the other, i.e. the GIL is held) and the fraction of
    the concurrent phase during which both calls were inside gs3d at once."""
    args = _gil_problem(size)
    gs3d.grid_sample_3d_backward(*args, num_threads=1)          # warm-up
    t0 = time.perf_counter()
    for _ in range(2 * repeats):
        gs3d.grid_sample_3d_backward(*args, num_threads=1)
    serial = time.perf_counter() - t0
    spans = [[], []]
    barrier = threading.Barrier(2)

    def work(k):
        barrier.wait()
        for _ in range(repeats):
            a = time.perf_counter()
            gs3d.grid_sample_3d_backward(*args, num_threads=1)
            spans[k].append((a, time.perf_counter()))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(2)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    concurrent = time.perf_counter() - t0
    both = sum(max(0.0, min(b1, b2) - max(a1, a2))
               for a1, b1 in spans[0] for a2, b2 in spans[1])
    return dict(serial_s=serial, concurrent_s=concurrent, ratio=concurrent / serial,
                both_inside_fraction=both / concurrent, cpus=os.cpu_count())


def test_gil_overlap_sanity():
    """Runs the measurement on a small problem and checks only that it completes with sane
    numbers; the evidence of overlap is the printed ratio (``-s``, or the __main__ run)."""
    m = gil_overlap(size=24, repeats=2)
    print("\nGIL overlap (small):", {k: round(v, 4) for k, v in m.items()})
    assert m["serial_s"] > 0 and m["concurrent_s"] > 0
    assert 0.0 <= m["both_inside_fraction"] <= 1.0


# ---------------------------------------------------------------------------------------------
# leaks: RSS growth over many calls of every entry point (valid, with buffers, and rejected)
# ---------------------------------------------------------------------------------------------

def _rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _entry_points():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 5, 6, 7))
    grid = rng.uniform(-1.2, 1.2, (2, 4, 3, 5, 3))
    go = rng.standard_normal((2, 3, 4, 3, 5))
    h = [a.astype(np.float16) for a in (x, grid, go)]
    b = [a.astype(_bf16()) for a in (x, grid, go)]
    out = np.empty((2, 3, 4, 3, 5))
    dx, dg = np.empty_like(x), np.empty_like(grid)
    x_cl = np.ascontiguousarray(np.moveaxis(x, 1, 4))
    go_cl = np.ascontiguousarray(np.moveaxis(go, 1, 4))
    bad_grid = grid[..., :2]
    bplan = gs3d.plan_backward(go.shape, x.shape, grid.shape, x.dtype)
    fplan = gs3d.plan_forward(x.shape, grid.shape, x.dtype)

    def rejected():
        try:
            gs3d.grid_sample_3d_backward(go, x, bad_grid, input_grad=dx)
        except gs3d.GridSamplerError:
            return
        raise AssertionError("not rejected")

    return {
        "grid_sample_3d": lambda: gs3d.grid_sample_3d(x, grid),
        "grid_sample_3d(out=, NDHWC, f32)": lambda: gs3d.grid_sample_3d(
            x_cl.astype(np.float32), grid.astype(np.float32), layout="NDHWC"),
        "grid_sample_3d(out=, 2 threads)": lambda: gs3d.grid_sample_3d(x, grid, out=out,
                                                                        num_threads=2),
        "grid_sample_3d_backward": lambda: gs3d.grid_sample_3d_backward(go, x, grid),
        "grid_sample_3d_backward(buffers, 2 threads)": lambda: gs3d.grid_sample_3d_backward(
            go, x, grid, input_grad=dx, grid_grad=dg, num_threads=2),
        "grid_sample_3d_backward(NDHWC)": lambda: gs3d.grid_sample_3d_backward(
            go_cl, x_cl, grid, layout="NDHWC", padding_mode="border"),
        "grid_sample_3d_backward(float16)": lambda: gs3d.grid_sample_3d_backward(*h[::-1][:1],
                                                                                 *h[:2]),
        "grid_sample_3d_backward(bfloat16, mask)": lambda: gs3d.grid_sample_3d_backward(
            b[2], b[0], b[1], output_mask=(True, False), mode="nearest"),
        "grid_sample_3d_backward(rejected)": rejected,
        "plan_backward(...)(buffers)": lambda: bplan(go, x, grid, input_grad=dx, grid_grad=dg),
        "plan_forward(...)(out=)": lambda: fplan(x, grid, out=out),
        "plan_backward (made and run)": lambda: gs3d.plan_backward(
            go.shape, x.shape, grid.shape, x.dtype)(go, x, grid),
    }


def leak_check(calls, threaded_calls=None):
    """{entry point: RSS growth in bytes over ``calls`` calls, after a warm-up}.
    ``threaded_calls`` (default ``calls``) for the 2-thread entry points, which are slow on a
    loaded machine (OpenMP barriers wait for a descheduled thread)."""
    growth = {}
    for name, fn in _entry_points().items():
        n = calls if threaded_calls is None or "threads" not in name else threaded_calls
        for _ in range(max(100, n // 10)):
            fn()
        before = _rss_bytes()
        for _ in range(n):
            fn()
        growth[name] = _rss_bytes() - before
    return growth


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs Linux /proc")
@pytest.mark.skipif("asan" in os.environ.get("LD_PRELOAD", ""),
                    reason="RSS is meaningless under AddressSanitizer (freed memory is "
                           "quarantined)")
def test_no_leaks():
    calls = int(os.environ.get("GS3D_LEAK_CALLS", "1000"))
    growth = leak_check(calls, threaded_calls=min(calls, 200))
    print(f"\nRSS growth over {calls} calls (bytes):", growth)
    # generous: 1 MiB for each entry point (the bound for 10,000 calls); a leak of even
    # ~1 KiB a call exceeds it at the default 1,000 calls
    for name, g in growth.items():
        assert g < (1 << 20), f"{name}: RSS grew by {g} bytes over {calls} calls"


# ---------------------------------------------------------------------------------------------
# fork
# ---------------------------------------------------------------------------------------------

FORK_SCRIPT = textwrap.dedent("""
    import os, signal, sys
    import numpy as np
    import gs3d
    parent_threads, child_threads = int(sys.argv[1]), sys.argv[2]
    child_threads = None if child_threads == "None" else int(child_threads)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 4, 32, 32, 32))
    grid = rng.uniform(-1, 1, (1, 32, 32, 32, 3))    # big enough for 2 default threads
    go = rng.standard_normal((1, 4, 32, 32, 32))
    want = gs3d.grid_sample_3d_backward(go, x, grid, num_threads=parent_threads)
    pid = os.fork()
    if pid == 0:
        signal.alarm(3)             # a hung child is killed by SIGALRM
        got = gs3d.grid_sample_3d_backward(go, x, grid, num_threads=child_threads)
        os._exit(0 if all(np.array_equal(a, b) for a, b in zip(got, want)) else 1)
    _, status = os.waitpid(pid, 0)
    print(os.waitstatus_to_exitcode(status))
""")


def _fork_child_status(parent_threads, child_threads):
    """Exit code of a forked child calling gs3d (0 ok, 1 wrong result, -14 hung: SIGALRM)."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", FORK_SCRIPT, str(parent_threads),
                           str(child_threads)], capture_output=True, text=True, timeout=120,
                          env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    return int(proc.stdout.strip().splitlines()[-1])


needs_fork = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


@needs_fork
def test_fork_child_single_threaded_after_threaded_parent():
    assert _fork_child_status(2, 1) == 0


@needs_fork
def test_fork_child_threaded_after_single_threaded_parent():
    assert _fork_child_status(1, 2) == 0


@needs_fork
@pytest.mark.parametrize("child_threads", [2, None])
def test_fork_child_threaded_after_threaded_parent(child_threads):
    """GNU OpenMP hangs a child forked after the parent used threads; gs3d detects the fork
    and runs the child's kernels on one thread, so the child completes with the same result."""
    assert _fork_child_status(2, child_threads) == 0


FORK_LOCKS_SCRIPT = textwrap.dedent("""
    import os, signal, threading
    import numpy as np
    import gs3d
    from gs3d import _api
    x = np.ones((1, 8, 64, 64, 64), np.float32)     # an 8 MiB output: recycled memory
    grid = np.zeros((1, 64, 64, 64, 3), np.float32)
    gs3d.grid_sample_3d(x, grid)                    # leaves an idle buffer behind
    held, done = threading.Event(), threading.Event()

    def hold():                     # another thread of the parent holds the cache's lock
        with _api._calls_lock:
            held.set()
            done.wait()
    threading.Thread(target=hold).start()
    held.wait()
    pid = os.fork()
    if pid == 0:
        signal.alarm(5)             # a hung child is killed by SIGALRM
        out = gs3d.grid_sample_3d(x, grid)
        gs3d.clear_cache()
        os._exit(0 if np.all(out == 1) else 1)
    done.set()
    _, status = os.waitpid(pid, 0)
    print(os.waitstatus_to_exitcode(status))
""")


@needs_fork
def test_fork_child_with_the_parents_cache_lock_held():
    """A child forked while another parent thread held the call cache's lock gets a new one,
    so its calls do not wait for a thread that is not there."""
    assert _script_status(FORK_LOCKS_SCRIPT) == 0


GC_FINALIZER_SCRIPT = textwrap.dedent("""
    import faulthandler, gc
    import numpy as np
    import gs3d
    from gs3d import _api
    faulthandler.dump_traceback_later(60, exit=True)   # a hang exits with a traceback
    x = np.ones((1, 8, 64, 64, 64), np.float32)     # 8 MiB outputs and a big scratch set
    grid = np.zeros((1, 64, 64, 64, 3), np.float32)
    small = (np.ones((1, 2, 4, 4, 4), np.float32), np.zeros((1, 3, 3, 3, 3), np.float32))
    done = []

    class Model:                    # in a cycle: freed by a collection, which runs __del__
        def __init__(self):
            self.me = self

        def __del__(self):
            gs3d.clear_cache()
            done.append(gs3d.grid_sample_3d(*small).shape)

    # a collection inside an output lease's __del__ (its first tracked allocation)
    out = gs3d.grid_sample_3d(x, grid)
    Model()
    gc.set_threshold(1)
    del out
    gc.set_threshold(700)
    # what such a finalizer does inside a section under the cache's lock, on the same thread
    with _api._calls_lock:
        gs3d.clear_cache()
        gs3d.grid_sample_3d(*small)
        gs3d.grid_sample_3d_backward(x, x, grid)    # a big scratch set back to its slot
        gs3d.grid_sample_3d_backward(x, x, grid)    # and taken from it
    # and collections at nearly every allocation, everywhere
    gc.set_threshold(1)
    for _ in range(10):
        Model()
        out = gs3d.grid_sample_3d(x, grid)
        Model()
        del out
        dx, dg = gs3d.grid_sample_3d_backward(x, x, grid)
        Model()
        del dx, dg
    gc.set_threshold(700)
    gc.collect()
    print(len(done))
""")


def test_finalizers_calling_gs3d_inside_its_sections():
    """Garbage collections may run finalizers anywhere, also while gs3d holds its cache's lock
    or returns an output's buffer; finalizers that call gs3d there neither hang nor fail."""
    assert _script_status(GC_FINALIZER_SCRIPT) == 31


def _script_status(script):
    """The last line a Python script printed (it must exit cleanly)."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=180, env=env, cwd=ROOT)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    return int(proc.stdout.strip().splitlines()[-1])


SPAWN_SCRIPT = textwrap.dedent("""
    import multiprocessing as mp
    import numpy as np
    import gs3d
    gs3d._api._WORK_PER_THREAD = 1    # threads whatever the size (see conftest), here and in the child

    def job(seed):
        rng = np.random.default_rng(seed)
        x = rng.standard_normal((1, 4, 32, 32, 32))
        grid = rng.uniform(-1, 1, (1, 24, 24, 24, 3))
        go = rng.standard_normal((1, 4, 24, 24, 24))
        return gs3d.grid_sample_3d_backward(go, x, grid, num_threads=2)

    if __name__ == "__main__":
        want = job(0)                                 # threaded kernels in the parent
        with mp.get_context("spawn").Pool(1) as pool:
            got = pool.apply_async(job, (0,)).get(timeout=60)
        print(all(np.array_equal(a, b) for a, b in zip(got, want)))
""")


def test_spawn_workaround(tmp_path):
    script = tmp_path / "spawn_gs3d.py"
    script.write_text(SPAWN_SCRIPT)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "True"


# ---------------------------------------------------------------------------------------------
# regressions: empty output buffers (found by the fuzzer)
# ---------------------------------------------------------------------------------------------

def test_empty_given_buffers_are_accepted():
    x = np.ones((2, 1, 1, 1, 1))
    grid = np.empty((2, 0, 1, 1, 3))
    go = np.empty((2, 1, 0, 1, 1))
    dx, dg = np.full_like(x, 7.0), np.empty((2, 0, 1, 1, 3))
    r = gs3d.grid_sample_3d_backward(go, x, grid, input_grad=dx, grid_grad=dg)
    assert r[0] is dx and r[1] is dg and (dx == 0).all()
    out = np.empty((2, 1, 0, 1, 1))
    assert gs3d.grid_sample_3d(x, grid, out=out) is out


# ---------------------------------------------------------------------------------------------
# regressions found by the fuzzer and the sanitizers
# ---------------------------------------------------------------------------------------------

def test_dead_point_grid_grad_is_plus_zero():
    x = np.ones((1, 1, 3, 3, 3))
    grid = np.array([[-5 / 3, 0.0, 0.0],       # valid; reflection gives x multiplier -1.5
                     [np.nan, 0.0, 0.0]]).reshape(1, 1, 1, 2, 3)
    go = np.ones((1, 1, 1, 1, 2))
    dg = gs3d.grid_sample_3d_backward(go, x, grid, padding_mode="reflection", num_threads=1)[1]
    assert not np.signbit(dg[0, 0, 0, 1]).any(), dg[0, 0, 0, 1]


def test_unaligned_contiguous_arrays_reach_the_kernels_aligned():
    from gs3d._validation import kernel_ready
    buf = np.zeros(3 * 8 + 1, dtype=np.uint8)
    grid = buf[1:].view(np.float64).reshape(1, 1, 1, 1, 3)     # C-contiguous, unaligned
    assert grid.flags.c_contiguous and not grid.flags.aligned
    assert kernel_ready(grid).flags.aligned


# ---------------------------------------------------------------------------------------------

if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    print("gs3d from", gs3d.__file__)
    m = gil_overlap()
    print("GIL overlap, two Python threads each calling backward with num_threads=1 "
          f"({os.cpu_count()} CPUs):")
    print(f"  serial (2 x {3} calls) {m['serial_s']:.3f} s, concurrent {m['concurrent_s']:.3f} s,"
          f" ratio {m['ratio']:.2f} (0.5 = full overlap, 1 = none); both inside gs3d "
          f"{100 * m['both_inside_fraction']:.0f}% of the concurrent time")
    calls = int(os.environ.get("GS3D_LEAK_CALLS", "10000"))
    growth = leak_check(calls)
    print(f"RSS growth over {calls} calls of each entry point (KiB):")
    for name, g in growth.items():
        print(f"  {name:45s} {g / 1024:8.1f}")
    worst = max(growth.values())
    print("leak check:", "PASS" if worst < (1 << 20) else "FAIL", f"(worst {worst / 1024:.1f} KiB,"
          " bound 1024 KiB)")


# A 16-bit volume whose last element ends a readable page, the next page unmapped: the SIMD
# kernels gather 16-bit values as 32-bit words (the value and the 2 bytes after it), except at
# the array's last element, which they must read on its own.  Results are compared bit for bit
# with float32 calls on the same values, rounded (the 16-bit kernels sum in float32 and round
# once).  In a subprocess, so that a fault fails this test only.
_GUARD_PAGE_SCRIPT = textwrap.dedent("""
    import ctypes, mmap, sys
    import numpy as np
    import gs3d
    dt = np.dtype(sys.argv[1]) if sys.argv[1] == "float16" else None
    if dt is None:
        import ml_dtypes
        dt = np.dtype(ml_dtypes.bfloat16)
    page = mmap.PAGESIZE
    buf = mmap.mmap(-1, 2 * page)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    base = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    assert libc.mprotect(base + page, page, 0) == 0, ctypes.get_errno()   # PROT_NONE
    rng = np.random.default_rng(5)
    for layout in ("NCDHW", "NDHWC"):
        for C in (1, 3):
            N, D, H, W = 2, 5, 6, 7
            shape = (N, C, D, H, W) if layout == "NCDHW" else (N, D, H, W, C)
            n = int(np.prod(shape))
            x = np.frombuffer(buf, dtype=dt, count=n, offset=page - 2 * n).reshape(shape)
            x[...] = rng.standard_normal(shape).astype(dt)
            q = rng.uniform(-1.05, 1.05, (N, 4, 5, 6, 3)).astype(dt)
            q[:, 0, 0, :3] = 1.0          # the last voxel exactly (align_corners=True)
            q[:, 1, 2, 3] = (1.0, 1.0, 0.99)
            gshape = (N, C, 4, 5, 6) if layout == "NCDHW" else (N, 4, 5, 6, C)
            g = rng.standard_normal(gshape).astype(dt)
            f32 = [a.astype(np.float32) for a in (x, q, g)]
            for pad in ("zeros", "border"):
                kw = dict(align_corners=True, padding_mode=pad, layout=layout)
                for T in (1, 2):
                    out = gs3d.grid_sample_3d(x, q, num_threads=T, **kw)
                    want = gs3d.grid_sample_3d(f32[0], f32[1], num_threads=T, **kw)
                    assert np.array_equal(out.view(np.uint16), want.astype(dt).view(np.uint16))
                    dx, dq = gs3d.grid_sample_3d_backward(g, x, q, num_threads=T, **kw)
                    wx, wq = gs3d.grid_sample_3d_backward(f32[2], f32[0], f32[1],
                                                          num_threads=T, **kw)
                    assert np.array_equal(dx.view(np.uint16), wx.astype(dt).view(np.uint16))
                    assert np.array_equal(dq.view(np.uint16), wq.astype(dt).view(np.uint16))
            # the point at (1, 1, 1) read the last element (in the last call: border)
            last = out[-1, -1, 0, 0, 0] if layout == "NCDHW" else out[-1, 0, 0, 0, -1]
            assert last.view(np.uint16) == x[-1, -1, -1, -1, -1].view(np.uint16)
    print("ok")
""")


@pytest.mark.parametrize("simd", ["", "avx2"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_gathers_stop_at_the_last_element(dtype, simd):
    if dtype == "bfloat16":
        pytest.importorskip("ml_dtypes")
    env = dict(os.environ)
    env.pop("GS3D_SIMD", None)
    if simd:
        env["GS3D_SIMD"] = simd
    r = subprocess.run([sys.executable, "-c", _GUARD_PAGE_SCRIPT, dtype], capture_output=True,
                       text=True, timeout=300, env=env, cwd=ROOT)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert r.stdout.strip() == "ok"
