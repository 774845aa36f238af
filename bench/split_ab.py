"""A/B of the backward's split of one batch item in two halves (README, Determinism and
threads): the same float32 call through two plans, one made with the split allowed and one
with gs3d._api._may_split patched to refuse it, alternating, 9 timed runs each.

    python bench/split_ab.py C S LAYOUT GRID     # e.g. 16 32 NDHWC random; GRID random|smooth
"""
import sys, time, numpy as np, gs3d
from gs3d import _api
C, S, lay, kind = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
rng = np.random.default_rng(0)
dt = np.float32
shape = (1, S, S, S, C) if lay == "NDHWC" else (1, C, S, S, S)
x = rng.standard_normal(shape).astype(dt); go = rng.standard_normal(shape).astype(dt)
if kind == "random":
    q = rng.uniform(-1.1, 1.1, (1, S, S, S, 3)).astype(dt)
else:
    lin = np.linspace(-1, 1, S)
    q = (np.stack(np.meshgrid(lin, lin, lin, indexing="ij")[::-1], -1)[None] * 0.9
         + 0.02 * rng.standard_normal((1, S, S, S, 3))).astype(dt)
orig = _api._may_split
plans = {}
for nt in (1, 2):
    for on in (False, True):
        _api._may_split = orig if on else (lambda pb: False)
        plans[nt, on] = gs3d.plan_backward(go.shape, x.shape, q.shape, dt, layout=lay,
                                           num_threads=nt)
_api._may_split = orig
dx, dg = np.empty_like(x), np.empty_like(q)
def f(on, nt):
    return plans[nt, on](go, x, q, input_grad=dx, grid_grad=dg)
times = {}
for rep in range(9):
    for nt in (1, 2):
        for on in (False, True):
            t = time.perf_counter(); f(on, nt); times.setdefault((nt, on), []).append(time.perf_counter() - t)
for (nt, on), ts in sorted(times.items()):
    print(f"threads={nt} split={'on ' if on else 'off'} median {np.median(ts)*1e3:7.2f} ms  min {min(ts)*1e3:7.2f} ms")
