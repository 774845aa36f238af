"""Per-call overhead of tiny calls: gs3d vs PyTorch (plain calls and the plan path).

    python bench/overhead.py [--repeat 7] [--number 2000]

Worked-example sizes (input (1, 1, 1, 3, 3), grid (1, 1, 2, 2, 3), float32). Reports best of
``--repeat`` timeit repeats of ``--number`` calls, in us/call, with ``num_threads`` left at the
default and at 1, alternating with torch (torch: ``set_num_threads`` of the same count). bench/run.py times the plain
calls only (median of single calls); this adds the plan path and best-of-many timing.
"""
import argparse
import os
import sys
import timeit

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import gs3d  # noqa: E402
import torch  # noqa: E402


def best_pair(f_gs3d, f_torch, number, repeat):
    """Best of ``repeat`` timeit runs of each, the two alternating (load drifts hit both)."""
    f_gs3d(), f_torch()
    a, b = [], []
    for _ in range(repeat):
        a.append(timeit.timeit(f_gs3d, number=number))
        b.append(timeit.timeit(f_torch, number=number))
    return min(a) / number * 1e6, min(b) / number * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--number", type=int, default=2000)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 1, 1, 3, 3), dtype=np.float32)
    q = rng.uniform(-1, 1, (1, 1, 2, 2, 3)).astype(np.float32)
    g = rng.standard_normal((1, 1, 1, 2, 2), dtype=np.float32)
    tx, tq, tg = torch.from_numpy(x), torch.from_numpy(q), torch.from_numpy(g)
    out, dx, dq = np.empty_like(g), np.empty_like(x), np.empty_like(q)
    default_torch_threads = torch.get_num_threads()
    print(f"gs3d {gs3d.__file__} simd={gs3d._api.SIMD_LEVEL}; best of {a.repeat} x {a.number}")
    print(f"{'case':34s} {'gs3d us':>8s} {'torch us':>9s} {'gs3d/torch':>10s}")
    for nt in (None, 1):
        torch.set_num_threads(default_torch_threads if nt is None else nt)
        kw = {} if nt is None else {"num_threads": nt}
        pf = gs3d.plan_forward(x.shape, q.shape, np.float32, **kw)
        pb = gs3d.plan_backward(g.shape, x.shape, q.shape, np.float32, **kw)
        t_fwd = lambda: torch.grid_sampler_3d(tx, tq, 0, 0, False)  # noqa: E731
        t_bwd = lambda: torch.ops.aten.grid_sampler_3d_backward(  # noqa: E731
            tg, tx, tq, 0, 0, False, [True, True])
        cases = [
            ("fwd", lambda: gs3d.grid_sample_3d(x, q, **kw), t_fwd),
            ("fwd plan", lambda: pf(x, q), t_fwd),
            ("fwd plan out=", lambda: pf(x, q, out=out), t_fwd),
            ("bwd", lambda: gs3d.grid_sample_3d_backward(g, x, q, **kw), t_bwd),
            ("bwd plan", lambda: pb(g, x, q), t_bwd),
            ("bwd plan out=", lambda: pb(g, x, q, input_grad=dx, grid_grad=dq), t_bwd),
        ]
        for name, fg, ft in cases:
            tg_, tt = best_pair(fg, ft, a.number, a.repeat)
            label = f"{name} [num_threads={nt}]"
            print(f"{label:34s} {tg_:8.2f} {tt:9.2f} {tg_ / tt:10.2f}", flush=True)
    torch.set_num_threads(default_torch_threads)


if __name__ == "__main__":
    main()
