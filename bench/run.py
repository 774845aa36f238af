#!/usr/bin/env python
"""Benchmark suite: gs3d against PyTorch (CPU) on the same arrays, in the same process.

    python bench/run.py [--quick] [--out bench/results] [--filter SUBSTRING] [--list]

For every case gs3d and PyTorch (and volresample, for the forward cases it supports) run on the
same numpy data (torch gets ``torch.from_numpy`` views; NDHWC becomes a channels_last_3d tensor),
alternating per repetition after a warm-up, with the same thread count.  Reported: medians,
ratio torch/gs3d, throughput in M point-channels/s (N*Do*Ho*Wo*C / time), gs3d's peak extra
memory (tracemalloc) as a multiple of a float32 copy of dx, and the largest difference between
the gs3d and torch results relative to the largest torch value.  See bench/README.md.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import math
import os
import platform
import statistics
import sys
import time
import tracemalloc
import zlib
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import torch  # noqa: E402  (imported before gs3d so both share torch's libgomp)
import ml_dtypes  # noqa: E402
import gs3d  # noqa: E402

try:  # optional numpy-native peer (forward only, float32, align_corners=False, NCDHW)
    import volresample  # type: ignore
except Exception:  # pragma: no cover - optional
    volresample = None

SEED = 20240531
DEFAULT_THREADS = 2
MODES = {"bilinear": 0, "nearest": 1}
PADDINGS = {"zeros": 0, "border": 1, "reflection": 2}
DTYPES = {
    "f32": np.dtype(np.float32),
    "f64": np.dtype(np.float64),
    "f16": np.dtype(np.float16),
    "bf16": np.dtype(ml_dtypes.bfloat16),
}
TORCH_DTYPES = {"f32": torch.float32, "f64": torch.float64, "f16": torch.float16,
                "bf16": torch.bfloat16}

# Shapes (N, C, input side, output side) from the issue.
SHAPES_FULL = {
    "A": (1, 16, 32, 32),
    "B": (1, 32, 64, 64),
    "C": (2, 4, 96, 96),
    "D": (1, 1, 128, 128),
    "E": (8, 8, 32, 32),
}
# --quick: same case structure, small shapes.
SHAPES_QUICK = {
    "A": (1, 16, 16, 16),
    "B": (1, 8, 20, 16),
    "C": (2, 4, 16, 12),
    "D": (1, 1, 24, 24),
    "E": (4, 4, 12, 12),
}


# ------------------------------------------------------------------------------------------
# cases
# ------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Case:
    group: str
    direction: str            # "bwd" | "fwd"
    N: int
    C: int
    S_in: int
    S_out: int
    grid: str = "smooth"      # "smooth" | "random" | "worked"
    layout: str = "NCDHW"
    dtype: str = "f32"
    mode: str = "bilinear"
    padding: str = "zeros"
    align_corners: bool = False
    mask: Tuple[bool, bool] = (True, True)
    threads: int = DEFAULT_THREADS
    deterministic: Optional[bool] = None
    fixed_reps: Optional[int] = None  # the worked-example case: many reps

    @property
    def name(self) -> str:
        if self.grid == "worked":
            return f"{self.direction}:worked-example:T{self.threads}"
        parts = [self.direction, f"{self.N}x{self.C}x{self.S_in}^3-{self.S_out}^3", self.grid,
                 self.layout, self.dtype]
        if self.mode != "bilinear":
            parts.append(self.mode)
        if self.padding != "zeros":
            parts.append(self.padding)
        if self.align_corners:
            parts.append("ac")
        if self.mask != (True, True):
            parts.append("mask=" + "".join("T" if m else "F" for m in self.mask))
        if self.threads != DEFAULT_THREADS:
            parts.append(f"T{self.threads}")
        if self.deterministic is not None:
            parts.append(f"det={'T' if self.deterministic else 'F'}")
        return ":".join(parts)

    @property
    def points(self) -> int:
        if self.grid == "worked":
            return 4
        return self.N * self.S_out ** 3

    @property
    def point_channels(self) -> int:
        return self.points * self.C


def build_cases(quick: bool) -> List[Case]:
    S = SHAPES_QUICK if quick else SHAPES_FULL
    cases: List[Case] = []

    def add(group, key, **kw):
        N, C, si, so = S[key]
        cases.append(Case(group, N=N, C=C, S_in=si, S_out=so, **kw))

    # 1. float32, bilinear, zeros: every shape, both grids, both layouts, both directions.
    for d in ("bwd", "fwd"):
        for key in S:
            for grid in ("smooth", "random") if key == "A" or not quick else ("random",):
                for layout in ("NCDHW", "NDHWC"):
                    add("base-f32", key, direction=d, grid=grid, layout=layout)
    # 2. other dtypes on the two smallest shapes (torch half precision is very slow).
    two = ("A",) if quick else ("A", "E")
    grids = ("random",) if quick else ("smooth", "random")
    for dt in ("f16", "bf16", "f64"):
        for d in ("bwd", "fwd"):
            for key in two:
                for grid in grids:
                    for layout in ("NCDHW", "NDHWC"):
                        add("dtype", key, direction=d, grid=grid, layout=layout, dtype=dt)
    # 3. nearest and every padding mode (and align_corners=True) on one shape.
    variants = [("bilinear", "border", False), ("bilinear", "reflection", False),
                ("nearest", "zeros", False), ("nearest", "border", False),
                ("nearest", "reflection", False), ("bilinear", "zeros", True)]
    for mode, pad, ac in variants:
        for d in ("bwd", "fwd"):
            for grid in grids:
                add("mode-padding", "A", direction=d, grid=grid, mode=mode, padding=pad,
                    align_corners=ac)
            if d == "bwd" and not quick:
                add("mode-padding", "A", direction=d, grid="random", layout="NDHWC", mode=mode,
                    padding=pad, align_corners=ac)
    # 4. output_mask.
    for mask in ((True, False), (False, True)):
        for key in ("A",) if quick else ("A", "B"):
            for layout in ("NCDHW", "NDHWC"):
                add("output-mask", key, direction="bwd", layout=layout, mask=mask)
        for layout in () if quick else ("NCDHW", "NDHWC"):
            add("output-mask", "A", direction="bwd", grid="random", layout=layout, mask=mask)
    # 5. one thread (the base cases are the two-thread ones).
    for d in ("bwd", "fwd"):
        for key in ("A", "E") if quick else ("A", "B", "E"):
            for layout in ("NCDHW", "NDHWC"):
                add("threads", key, direction=d, layout=layout, threads=1)
    # 6. deterministic True vs False (per-call flag); NDHWC A random also shows the split of one
    # batch item in two halves (NCDHW A takes the channels-last copy instead).
    for det in (True, False):
        for key in ("A", "D") if quick else ("A", "D", "E"):
            for grid in grids:
                add("deterministic", key, direction="bwd", grid=grid, deterministic=det)
        for grid in () if quick else grids:
            add("deterministic", "A", direction="bwd", grid=grid, layout="NDHWC",
                deterministic=det)
    # 7. the worked example: per-call overhead.
    for d in ("bwd", "fwd"):
        for t in (1, 2):
            cases.append(Case("worked-example", d, 1, 1, 3, 2, grid="worked", threads=t,
                              fixed_reps=300 if quick else 2000))
    return cases


def build_pairs(quick: bool) -> List[Tuple[str, Case, Case]]:
    """The issue's relative targets as pairs (what, A, B) of gs3d backward configurations,
    each timed in one loop, A and B alternating on the same arrays: ratio = A time / B time.
    (Cases of the main table are timed minutes apart and meet different loads on a shared
    host, so ratios between them say little.)"""
    S = SHAPES_QUICK if quick else SHAPES_FULL
    pairs: List[Tuple[str, Case, Case]] = []

    def case(key, **kw):
        N, C, si, so = S[key]
        return Case("paired", "bwd", N=N, C=C, S_in=si, S_out=so, **kw)

    for key in ("A", "B", "D"):
        for layout in ("NCDHW", "NDHWC"):
            for grid in ("smooth", "random"):
                pairs.append(("1 thread / 2 threads", case(key, layout=layout, grid=grid,
                                                           threads=1),
                              case(key, layout=layout, grid=grid)))
    for key in ("A", "B"):
        for layout in ("NCDHW", "NDHWC"):
            for grid in ("smooth", "random"):
                pairs.append(("mask (T, T) / (F, T)", case(key, layout=layout, grid=grid),
                              case(key, layout=layout, grid=grid, mask=(False, True))))
    for key in ("A", "D", "E"):
        for grid in ("smooth", "random"):
            pairs.append(("deterministic on / off", case(key, grid=grid, deterministic=True),
                          case(key, grid=grid, deterministic=False)))
    # half precision against float32 on the same values (the float32 arrays rounded), on the
    # shapes of the dtype cases
    for dt in ("f16", "bf16"):
        for key in ("A",) if quick else ("A", "E"):
            for layout in ("NCDHW", "NDHWC"):
                for grid in ("smooth", "random"):
                    pairs.append((f"{dt} / f32", case(key, layout=layout, grid=grid, dtype=dt),
                                  case(key, layout=layout, grid=grid)))
    return pairs


# Indicative figures from /work/shared/PERF_NOTES.md (a C prototype; backward, trilinear, zeros,
# align_corners False, fp32, 2 threads).  Not a contract: shown for orientation only.
def target_for(c: Case) -> Optional[str]:
    if (c.direction != "bwd" or c.dtype != "f32" or c.mode != "bilinear" or c.padding != "zeros"
            or c.align_corners or c.threads != 2 or c.mask != (True, True) or c.grid == "worked"):
        return None
    if c.C == 1:
        return "5-12x"
    if c.layout == "NDHWC" and c.C == 16 and c.S_out == 32:
        return "~20x"
    if c.C == 32 and c.S_in == 64:
        return "12-20x" if c.layout == "NDHWC" else "10-17x"
    if c.layout == "NCDHW" and c.C >= 8:
        return "10-17x"
    return None


# ------------------------------------------------------------------------------------------
# data
# ------------------------------------------------------------------------------------------

def _rotation(axis: np.ndarray, angle: float) -> np.ndarray:
    axis = axis / np.linalg.norm(axis)
    k = np.array([[0, -axis[2], axis[1]], [axis[2], 0, -axis[0]], [-axis[1], axis[0], 0]])
    return np.eye(3) + math.sin(angle) * k + (1 - math.cos(angle)) * (k @ k)


def make_grid(rng: np.random.Generator, kind: str, N: int, So: int) -> np.ndarray:
    """float64 grid (N, So, So, So, 3)."""
    if kind == "random":
        return rng.uniform(-1.1, 1.1, size=(N, So, So, So, 3))
    # smooth: affine grid of a ~5 degree rotation about a random axis, a small shift, plus
    # 0.02 * Gaussian noise, in normalised coordinates.
    lin = (2.0 * np.arange(So) + 1.0) / So - 1.0
    z, y, x = np.meshgrid(lin, lin, lin, indexing="ij")
    base = np.stack([x, y, z], axis=-1)
    out = np.empty((N, So, So, So, 3))
    for n in range(N):
        angle = math.radians(5.0) * rng.choice([-1.0, 1.0]) * rng.uniform(0.8, 1.2)
        R = _rotation(rng.standard_normal(3), angle)
        shift = rng.uniform(-0.05, 0.05, size=3)
        out[n] = base @ R.T + shift + 0.02 * rng.standard_normal((So, So, So, 3))
    return out


WORKED = {
    "input": np.arange(1, 10, dtype=np.float32).reshape(1, 1, 1, 3, 3),
    "grid": np.array([-1, -1, 0, -1, 1, -1, -1, 0, 0, 0, 1, 0],
                     dtype=np.float32).reshape(1, 1, 2, 2, 3),
    "grad": np.ones((1, 1, 1, 2, 2), dtype=np.float32),
    "dx": [0.25, 0, 0, 0.5, 0, 0, 0.125, 0.5, 0],
    "dgrid": [0.75, 0.75, -0.125, 2.625, -2.625, 0.875, 6.0, 2.25, -1.0, 0.75, -12.0, -2.0],
    "out": [0.25, 0.875, 2.0, 4.0],
}


def make_data(c: Case) -> Dict[str, np.ndarray]:
    """Seeded numpy arrays in the case's layout and dtype (the same for gs3d and torch)."""
    if c.grid == "worked":
        return {"input": WORKED["input"], "grid": WORKED["grid"], "grad": WORKED["grad"]}
    key = f"{c.N},{c.C},{c.S_in},{c.S_out},{c.grid}".encode()
    rng = np.random.default_rng([SEED, zlib.crc32(key)])
    dt = DTYPES[c.dtype]
    gen = np.float64 if c.dtype == "f64" else np.float32
    if c.layout == "NCDHW":
        xs, gs = (c.N, c.C) + (c.S_in,) * 3, (c.N, c.C) + (c.S_out,) * 3
    else:
        xs, gs = (c.N,) + (c.S_in,) * 3 + (c.C,), (c.N,) + (c.S_out,) * 3 + (c.C,)
    x = rng.standard_normal(xs, dtype=gen).astype(dt)
    grid = make_grid(rng, c.grid, c.N, c.S_out).astype(dt)
    grad = rng.standard_normal(gs, dtype=gen).astype(dt) if c.direction == "bwd" else None
    return {"input": x, "grid": grid, "grad": grad}


def to_torch(a: Optional[np.ndarray], layout: str, is_volume: bool):
    """A torch view of the numpy array (no copy); NDHWC volumes become channels_last_3d."""
    if a is None:
        return None
    if a.dtype.name == "bfloat16":
        t = torch.from_numpy(a.view(np.uint16)).view(torch.bfloat16)
    else:
        t = torch.from_numpy(a)
    if is_volume and layout == "NDHWC":
        t = t.permute(0, 4, 1, 2, 3)
    return t


def torch_to_numpy(t, layout: str, is_volume: bool) -> Optional[np.ndarray]:
    if t is None:
        return None
    if is_volume and layout == "NDHWC":
        t = t.permute(0, 2, 3, 4, 1)
    return t.detach().to(torch.float64).numpy()


# ------------------------------------------------------------------------------------------
# runners
# ------------------------------------------------------------------------------------------

def make_runners(c: Case, data: Dict[str, np.ndarray]):
    x, q, g = data["input"], data["grid"], data["grad"]
    tx, tq, tg = (to_torch(x, c.layout, True), to_torch(q, c.layout, False),
                  to_torch(g, c.layout, True))
    if c.layout == "NDHWC":
        assert tx.is_contiguous(memory_format=torch.channels_last_3d)
    mode_i, pad_i = MODES[c.mode], PADDINGS[c.padding]
    kw = dict(mode=c.mode, padding_mode=c.padding, align_corners=c.align_corners,
              layout=c.layout, num_threads=c.threads)
    if c.direction == "bwd":
        mask = list(c.mask)

        def run_gs3d():
            return gs3d.grid_sample_3d_backward(g, x, q, output_mask=c.mask,
                                                deterministic=c.deterministic, **kw)

        def run_torch():
            return torch.ops.aten.grid_sampler_3d_backward(tg, tx, tq, mode_i, pad_i,
                                                           c.align_corners, mask)
    else:
        def run_gs3d():
            return gs3d.grid_sample_3d(x, q, **kw)

        def run_torch():
            return torch.nn.functional.grid_sample(tx, tq, mode=c.mode, padding_mode=c.padding,
                                                   align_corners=c.align_corners)
    run_vr = None
    if (volresample is not None and c.direction == "fwd" and c.dtype == "f32"
            and not c.align_corners and c.layout == "NCDHW" and c.grid != "worked"):
        vmode = "linear" if c.mode == "bilinear" else "nearest"

        def run_vr():
            return volresample.grid_sample(x, q, mode=vmode, padding_mode=c.padding)
    return run_gs3d, run_torch, run_vr


def rel_err(a: Optional[np.ndarray], b: Optional[np.ndarray]) -> Optional[float]:
    """max |a - b| / max |b| (b = torch)."""
    if a is None or b is None:
        return None
    a = np.asarray(a, dtype=np.float64)
    denom = float(np.max(np.abs(b))) if b.size else 0.0
    diff = float(np.max(np.abs(a - b))) if b.size else 0.0
    return diff / denom if denom > 0 else diff


def n_mismatch(a: Optional[np.ndarray], b: Optional[np.ndarray], tol: float = 1e-3) -> int:
    """Elements where |a - b| > tol * max|b|: isolated float32 floor flips (a coordinate that
    rounds onto an integer in one library and just below it in the other) make the trilinear
    grid gradient jump, so the max error alone can look alarming on random grids."""
    if a is None or b is None or not b.size:
        return 0
    a = np.asarray(a, dtype=np.float64)
    return int(np.count_nonzero(np.abs(a - b) > tol * np.max(np.abs(b))))


def f64_oracle(c: Case, data: Dict[str, np.ndarray]):
    """torch float64 results from the (rounded) inputs, as numpy arrays in gs3d's layout."""
    x, q, g = (None if data[k] is None else np.asarray(data[k], dtype=np.float64)
               for k in ("input", "grid", "grad"))
    tx, tq, tg = to_torch(x, c.layout, True), to_torch(q, c.layout, False), to_torch(g, c.layout,
                                                                                    True)
    if c.direction == "bwd":
        dx, dg = torch.ops.aten.grid_sampler_3d_backward(
            tg, tx, tq, MODES[c.mode], PADDINGS[c.padding], c.align_corners, [True, True])
        return torch_to_numpy(dx, c.layout, True), dg.numpy()
    return torch_to_numpy(torch.nn.functional.grid_sample(
        tx, tq, mode=c.mode, padding_mode=c.padding, align_corners=c.align_corners),
        c.layout, True)


def check(c: Case, data, res_g, res_t, res_v) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    half = c.dtype in ("f16", "bf16")
    oracle = f64_oracle(c, data) if half else None
    mism = 0
    if c.direction == "bwd":
        dx, dg = res_g
        tdx, tdg = res_t
        tdx, tdg = torch_to_numpy(tdx, c.layout, True), torch_to_numpy(tdg, c.layout, False)
        errs = []
        for k, want, mine, theirs in (("dx", c.mask[0], dx, tdx), ("dgrid", c.mask[1], dg, tdg)):
            if not want:
                continue
            out[f"err_{k}"] = rel_err(mine, theirs)
            errs.append(out[f"err_{k}"])
            mism += n_mismatch(mine, theirs)
            if half:
                ref = oracle[0 if k == "dx" else 1]
                out[f"err_{k}_gs3d_vs_f64"] = rel_err(mine, ref)
                out[f"err_{k}_torch_vs_f64"] = rel_err(theirs, ref)
        if half:
            out["err_gs3d_vs_f64"] = max(out[f"err_{k}_gs3d_vs_f64"] for k, w in
                                         (("dx", c.mask[0]), ("dgrid", c.mask[1])) if w)
            out["err_torch_vs_f64"] = max(out[f"err_{k}_torch_vs_f64"] for k, w in
                                          (("dx", c.mask[0]), ("dgrid", c.mask[1])) if w)
    else:
        ref = torch_to_numpy(res_t, c.layout, True)
        out["err_out"] = rel_err(res_g, ref)
        mism = n_mismatch(res_g, ref)
        if res_v is not None:
            out["err_volresample_vs_torch"] = rel_err(res_v, ref)
        if half:
            out["err_gs3d_vs_f64"] = rel_err(res_g, oracle)
            out["err_torch_vs_f64"] = rel_err(ref, oracle)
        errs = [out["err_out"]]
    out["err_max"] = max(errs) if errs else None
    out["n_mismatch_vs_torch"] = mism
    if c.grid == "worked":
        if c.direction == "bwd":
            ok = (np.allclose(res_g[0].ravel(), WORKED["dx"], atol=1e-6)
                  and np.allclose(res_g[1].ravel(), WORKED["dgrid"], atol=1e-5))
        else:
            ok = np.allclose(res_g.ravel(), WORKED["out"], atol=1e-6)
        out["worked_example_matches_spec"] = bool(ok)
    return out


def result_nbytes(res) -> int:
    if isinstance(res, tuple):
        return sum(r.nbytes for r in res if r is not None)
    return res.nbytes


def measure_memory(run_gs3d, c: Case) -> Dict[str, Any]:
    """Peak tracemalloc bytes during one gs3d call minus the bytes of what it returns (the
    scratch gs3d keeps between calls dropped first, so that the call allocates it)."""
    gs3d.clear_cache()
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        res = run_gs3d()
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    extra = peak - result_nbytes(res)
    dx_f32 = c.N * c.C * c.S_in ** 3 * 4 if c.grid != "worked" else 9 * 4
    return {"mem_peak_bytes": int(peak), "mem_extra_bytes": int(extra),
            "mem_extra_x_dx_f32": extra / dx_f32 if dx_f32 else None}


def _iqr(v: List[float]) -> float:
    q = statistics.quantiles(v, n=4) if len(v) >= 2 else [0, 0, 0]
    return q[2] - q[0]


@contextlib.contextmanager
def _gc_paused():
    """The garbage collector off (after a collection) while timing."""
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _alternate(run_a, run_b, reps: int) -> Tuple[List[float], List[float]]:
    """Seconds per call of run_a and run_b, called in turn ``reps`` times each."""
    pc = time.perf_counter
    ta: List[float] = []
    tb: List[float] = []
    for _ in range(reps):
        t0 = pc(); r = run_a(); ta.append(pc() - t0); del r
        t0 = pc(); r = run_b(); tb.append(pc() - t0); del r
    return ta, tb


def time_case(c: Case, budget: float, max_reps: int, extra_warm: int = 2) -> Dict[str, Any]:
    data = make_data(c)
    run_g, run_t, run_v = make_runners(c, data)
    torch.set_num_threads(c.threads)
    if run_v is not None:
        volresample.set_num_threads(c.threads)
    pc = time.perf_counter

    # warm-up (its results feed the correctness check)
    t0 = pc(); res_g = run_g(); tw_g = pc() - t0
    t0 = pc(); res_t = run_t(); tw_t = pc() - t0
    tw_v = 0.0
    res_v = None
    if run_v is not None:
        t0 = pc(); res_v = run_v(); tw_v = pc() - t0
    info = check(c, data, res_g, res_t, res_v)
    del res_g, res_t, res_v
    per_rep = tw_g + tw_t + tw_v
    if c.fixed_reps:
        n_warm = max(20, c.fixed_reps // 20)
        reps = c.fixed_reps
    else:
        n_warm = extra_warm if per_rep < 0.05 else 0   # extra warm-ups for the cheap cases
        reps = int(min(max_reps, max(5, budget // max(per_rep, 1e-9))))
    for _ in range(n_warm):
        run_g(); run_t()

    tv: List[float] = []
    with _gc_paused():
        tg, tt = _alternate(run_g, run_t, reps)      # gs3d / torch every repetition
        if run_v is not None:
            # volresample brings its own libgomp (a second OpenMP runtime, whose idle workers
            # spin for a while after each call): timed in its own block after the gs3d/torch
            # alternation so that it cannot slow them down, then given time to go idle.
            for _ in range(n_warm):
                run_v()
            for _ in range(reps):
                t0 = pc(); r = run_v(); tv.append(pc() - t0); del r
            time.sleep(0.05)
    mg, mt = statistics.median(tg), statistics.median(tt)
    rec: Dict[str, Any] = {
        "name": c.name, **dataclasses.asdict(c), "reps": reps,
        "points": c.points, "point_channels": c.point_channels,
        "gs3d_median_s": mg, "torch_median_s": mt, "ratio": mt / mg,
        "gs3d_mptch_s": c.point_channels / mg / 1e6,
        "torch_mptch_s": c.point_channels / mt / 1e6,
        "gs3d_min_s": min(tg), "torch_min_s": min(tt), "ratio_of_mins": min(tt) / min(tg),
        "gs3d_iqr_over_median": _iqr(tg) / mg, "torch_iqr_over_median": _iqr(tt) / mt,
        "gs3d_times_s": tg, "torch_times_s": tt, "target": target_for(c),
    }
    if tv:
        mv = statistics.median(tv)
        rec.update({"volresample_median_s": mv, "volresample_times_s": tv,
                    "torch_over_volresample": mt / mv,
                    "volresample_mptch_s": c.point_channels / mv / 1e6})
    rec.update(info)
    rec.update(measure_memory(run_g, c))
    return rec


def time_pair(what: str, a: Case, b: Case, reps: int) -> Dict[str, Any]:
    """gs3d under configurations a and b on the same arrays (of each one's dtype: the same
    seeded values, rounded), alternating, after warm-ups."""
    data = make_data(a)
    run_a = make_runners(a, data)[0]
    run_b = make_runners(b, data if b.dtype == a.dtype else make_data(b))[0]
    for _ in range(2):
        run_a(); run_b()
    with _gc_paused():
        ta, tb = _alternate(run_a, run_b, reps)
    ma, mb = statistics.median(ta), statistics.median(tb)
    return {"what": what, "a": a.name, "b": b.name, "reps": reps, "a_median_s": ma,
            "b_median_s": mb, "ratio": ma / mb, "a_times_s": ta, "b_times_s": tb}


def pairs_markdown(pairs: List[Dict[str, Any]]) -> str:
    lines = ["", "## Paired gs3d comparisons", "",
             "Two gs3d configurations on the same arrays in one loop, alternating (medians); "
             "ratio = A time / B time.", "",
             "| comparison | A | B | A ms | B ms | ratio |", "|---|---|---|---:|---:|---:|"]
    for p in pairs:
        lines.append(f"| {p['what']} | {p['a']} | {p['b']} | {p['a_median_s'] * 1e3:.3g} | "
                     f"{p['b_median_s'] * 1e3:.3g} | {p['ratio']:.2f} |")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------
# reporting
# ------------------------------------------------------------------------------------------

def machine_info() -> Dict[str, Any]:
    cpu = None
    flags: List[str] = []
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if cpu is None and line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                if not flags and line.startswith("flags"):
                    fl = line.split(":", 1)[1].split()
                    flags = [x for x in fl if x in ("avx2", "fma", "f16c", "avx512f", "avx512bw",
                                                    "avx512vl", "avx512_bf16", "avx512_fp16")]
    except OSError:
        pass
    omp_libs = []
    try:
        with open("/proc/self/maps") as f:
            omp_libs = sorted({ln.split()[-1] for ln in f if "omp" in ln.split()[-1]})
    except OSError:
        pass
    try:
        from gs3d import _kernels
        openmp = bool(_kernels.openmp_enabled())
        omp_max = int(_kernels.max_threads())
    except Exception:
        openmp, omp_max = None, None
    return {
        "cpu_model": cpu, "cpu_flags": flags, "os_cpu_count": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "platform": platform.platform(), "python": platform.python_version(),
        "numpy": np.__version__, "torch": torch.__version__,
        "gs3d": getattr(gs3d, "__version__", None), "ml_dtypes": ml_dtypes.__version__,
        "volresample": getattr(volresample, "__version__", None) if volresample else None,
        "gs3d_openmp": openmp, "gs3d_omp_max_threads": omp_max,
        "torch_parallel_info": torch.__config__.parallel_info(),
        "openmp_libraries_loaded": omp_libs,
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
        "default_threads": DEFAULT_THREADS,
    }


def background_busy(seconds: float = 1.0) -> float:
    """Fraction of all CPUs busy (user+nice+system) over a short idle wait: other processes."""
    def ticks():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return v[0] + v[1] + v[2], sum(v[:8])
    try:
        b0, t0 = ticks()
        time.sleep(seconds)
        b1, t1 = ticks()
        return (b1 - b0) / max(t1 - t0, 1)
    except OSError:
        return float("nan")


def _fmt_ms(s: Optional[float]) -> str:
    if s is None:
        return ""
    ms = s * 1e3
    return f"{ms:.3g}" if ms >= 0.1 else f"{ms:.4f}"


def _fmt(v: Optional[float], spec: str) -> str:
    return "" if v is None else format(v, spec)


def _err_cell(r: Dict[str, Any]) -> str:
    if "err_gs3d_vs_f64" in r:   # half precision: both against a float64 oracle
        return f"vs f64: gs3d {r['err_gs3d_vs_f64']:.1e}, torch {r['err_torch_vs_f64']:.1e}"
    cell = _fmt(r.get("err_max"), ".1e")
    if r.get("n_mismatch_vs_torch"):
        cell += f" ({r['n_mismatch_vs_torch']} el.)"
    return cell


NOISY = 0.25


def _noisy(r: Dict[str, Any]) -> str:
    return " ~" if max(r["gs3d_iqr_over_median"], r["torch_iqr_over_median"]) > NOISY else ""


def markdown(records: List[Dict[str, Any]], info: Dict[str, Any], args) -> str:
    lines = [
        "# gs3d vs PyTorch CPU grid_sample 3-D",
        "",
        f"CPU: {info['cpu_model']} ({info['os_cpu_count']} cpus) -- torch {info['torch']}, "
        f"numpy {info['numpy']}, gs3d {info['gs3d']}, volresample {info['volresample']}"
        f"{' -- QUICK run (small shapes)' if args.quick else ''}. Other load on the machine: "
        f"{info['background_busy_before']:.0%} of the CPUs busy before the run, "
        f"{info.get('background_busy_after', float('nan')):.0%} after.",
        "",
        "Medians of >= 5 alternating timed runs after warm-up; ratio = torch / gs3d (> 1: gs3d "
        "faster); M pt.ch/s = N*Do*Ho*Wo*C / gs3d median; mem = gs3d peak extra traced memory "
        "(beyond inputs and outputs) / bytes of a float32 dx; err = max|gs3d - torch| / "
        "max|torch| (with the number of elements off by > 1e-3 max|torch|, if any; half "
        "precision: each against torch float64 on the same rounded inputs); ~ after the ratio: "
        f"noisy (interquartile range > {NOISY:.0%} of the median); "
        "target = indicative prototype figure from PERF_NOTES.md. Case name: "
        "direction:NxCxIn^3-Out^3:grid:layout:dtype[:mode][:padding][:ac][:mask][:threads]"
        "[:det]; 2 threads unless :T1.",
        "",
        "| case | gs3d ms | torch ms | ratio | ratio of mins | M pt.ch/s | torch M pt.ch/s "
        "| volresample ms | mem (x dx f32) | err | reps | target |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    group = None
    for r in records:
        if r["group"] != group:
            group = r["group"]
            lines.append(f"| **{group}** | | | | | | | | | | | |")
        lines.append(
            f"| {r['name']} | {_fmt_ms(r['gs3d_median_s'])} | {_fmt_ms(r['torch_median_s'])} "
            f"| {r['ratio']:.2f}{_noisy(r)} | {r['ratio_of_mins']:.2f} | {r['gs3d_mptch_s']:.3g} | {r['torch_mptch_s']:.3g} "
            f"| {_fmt_ms(r.get('volresample_median_s'))} "
            f"| {_fmt(r.get('mem_extra_x_dx_f32'), '.2f')} | {_err_cell(r)} "
            f"| {r['reps']} | {r['target'] or ''} |")
    worked = [r for r in records if r["grid"] == "worked"]
    if worked:
        lines += ["", "Worked example (input (1,1,1,3,3), grid (1,1,2,2,3)): median per call",
                  "", "| case | gs3d us | torch us | ratio | gs3d extra bytes | matches SPEC |",
                  "|---|---:|---:|---:|---:|---|"]
        for r in worked:
            lines.append(f"| {r['name']} | {r['gs3d_median_s'] * 1e6:.1f} | "
                         f"{r['torch_median_s'] * 1e6:.1f} | {r['ratio']:.2f} | "
                         f"{r['mem_extra_bytes']} | {r.get('worked_example_matches_spec')} |")
    slower = [r for r in records if r["ratio"] < 1.0]
    lines += ["", f"{len(records)} cases; gs3d slower than torch in {len(slower)}; "
              f"geometric-mean ratio {geomean([r['ratio'] for r in records]):.2f} "
              f"(of mins {geomean([r['ratio_of_mins'] for r in records]):.2f})."]
    return "\n".join(lines) + "\n"


def geomean(vals: List[float]) -> float:
    vals = [v for v in vals if v > 0]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else float("nan")


def plot(records: List[Dict[str, Any]], path: str, quick: bool) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(records)
    fig, ax = plt.subplots(figsize=(11, max(3.0, 0.19 * n + 1.2)))
    ypos = np.arange(n)[::-1]
    colors = ["tab:blue" if r["direction"] == "bwd" else "tab:orange" for r in records]
    ratios = [r["ratio"] for r in records]
    ax.barh(ypos, ratios, color=colors, height=0.75)
    vr = [(y, r["torch_over_volresample"]) for y, r in zip(ypos, records)
          if "torch_over_volresample" in r]
    if vr:
        ax.plot([v for _, v in vr], [y for y, _ in vr], "k|", markersize=9,
                label="volresample (torch / volresample)")
    ax.axvline(1.0, color="red", linewidth=1)
    ax.set_xscale("log")
    ax.set_yticks(ypos)
    ax.set_yticklabels([r["name"] for r in records], fontsize=6)
    ax.set_ylim(-0.7, n - 0.3)
    ax.set_xlabel("speed-up = torch median / gs3d median (log scale; > 1: gs3d faster)")
    ax.set_title("gs3d vs PyTorch CPU (blue: backward, orange: forward)"
                 + (" -- quick run" if quick else ""))
    if vr:
        ax.legend(loc="lower right", fontsize=7)
    ax.grid(axis="x", which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------------------------------

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small shapes, few reps (smoke test)")
    ap.add_argument("--out", default=os.path.join(HERE, "results"), help="output directory")
    ap.add_argument("--filter", default=None, help="run only cases whose name contains this")
    ap.add_argument("--list", action="store_true", help="list case names and exit")
    ap.add_argument("--budget", type=float, default=None,
                    help="seconds of timed runs per case (default 2.5, quick 0.1); >= 5 reps")
    args = ap.parse_args(argv)

    cases = build_cases(args.quick)
    pair_specs = build_pairs(args.quick)
    if args.filter:
        cases = [c for c in cases if args.filter in c.name or args.filter == c.group]
        pair_specs = [p for p in pair_specs if args.filter == "paired"]
    if args.list:
        for c in cases:
            print(f"{c.group:15s} {c.name}")
        for what, a, b in pair_specs:
            print(f"{'paired':15s} {what}: {a.name} / {b.name}")
        return 0
    if not cases and not pair_specs:
        print("no case matches", file=sys.stderr)
        return 1
    budget = args.budget if args.budget is not None else (0.1 if args.quick else 2.5)
    max_reps = 5 if args.quick else 21
    extra_warm = 1 if args.quick else 2
    os.makedirs(args.out, exist_ok=True)
    info = machine_info()
    info["background_busy_before"] = background_busy()
    if info["background_busy_before"] > 0.15:
        print(f"warning: {info['background_busy_before']:.0%} of the CPUs were busy before the "
              "run started (other processes): timings will be noisy", file=sys.stderr)
    records = []
    t_start = time.perf_counter()
    for i, c in enumerate(cases, 1):
        rec = time_case(c, budget, max_reps, extra_warm)
        records.append(rec)
        vr = (f" vr={rec['volresample_median_s'] * 1e3:.3g}ms"
              if "volresample_median_s" in rec else "")
        print(f"[{i}/{len(cases)} {time.perf_counter() - t_start:6.1f}s] {c.name}: "
              f"gs3d {rec['gs3d_median_s'] * 1e3:.3g} ms, torch {rec['torch_median_s'] * 1e3:.3g}"
              f" ms, ratio {rec['ratio']:.2f}{vr}, err {rec.get('err_max') or 0:.1e}, "
              f"mem {rec['mem_extra_x_dx_f32']:.2f}x", flush=True)
    pairs = []
    for i, (what, a, b) in enumerate(pair_specs, 1):
        rec = time_pair(what, a, b, max(5, max_reps // 2))
        pairs.append(rec)
        print(f"[pair {i}/{len(pair_specs)} {time.perf_counter() - t_start:6.1f}s] {what}: "
              f"{a.name} {rec['a_median_s'] * 1e3:.3g} ms / {b.name} "
              f"{rec['b_median_s'] * 1e3:.3g} ms = {rec['ratio']:.2f}", flush=True)
    info["total_seconds"] = time.perf_counter() - t_start
    info["background_busy_after"] = background_busy()
    info["threads_used"] = sorted({c.threads for c in cases})
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"machine": info, "quick": args.quick, "seed": SEED, "budget_s": budget,
                   "cases": records, "pairs": pairs}, f, indent=1, default=str)
    md = (markdown(records, info, args) if records else "") + (pairs_markdown(pairs)
                                                                if pairs else "")
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(md)
    written = "results.json, results.md"
    try:
        if records:
            plot(records, os.path.join(args.out, "speedup.png"), args.quick)
            written += ", speedup.png"
    except ImportError:
        print("matplotlib missing: no speedup.png (pip install matplotlib)", file=sys.stderr)
    print()
    print(md)
    print(f"wrote {written} in {args.out} ({info['total_seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
