"""Backward on an input of more than 2**31 elements (issue 4, item 6): 64-bit indexing.

    python scripts/large_volume.py                 # float16, (1, 1, 1291, 1291, 1291)
    python scripts/large_volume.py --no-dx         # grid gradient + forward only (~4.5 GB)
    python scripts/large_volume.py --size 1300 --points 96 --threads 2

The input is float16 NCDHW with S**3 elements (S = 1291 gives 2,151,685,171 > 2**31 =
2,147,483,648), filled slab by slab with a cheap deterministic pattern.  The grid holds a few
dozen well separated points, most of them in the last planes of the volume where the flat
element index exceeds 2**31 (including points on and just past the far faces, whose outer
corners are out of bounds), the rest anywhere.  The backward (and the forward) are then checked
point by point against gs3d.reference run on a small crop around each point, with the grid
value re-expressed for the crop and the grid gradient rescaled by (S - 1) / (s - 1): that is the
same mathematics (align_corners=True, zeros padding), so the float16 tolerance of SPEC (1e-3 of
the largest magnitude) applies.  The input gradient is also checked to be zero outside the
corners of the points.

Memory: input 2 bytes/element, input_grad 2 bytes/element, and gs3d's float32 accumulator for
16-bit input gradients 4 bytes/element: about 17.3 GB for S = 1291 (4.3 GB with --no-dx).
The script refuses to start when MemAvailable is below what it needs.

Prints the sizes, the time of each step, the worst relative error of each result, and PASS or
FAIL; exits non-zero on failure.
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import gs3d  # noqa: E402
from gs3d import reference as ref  # noqa: E402

TOL = 1e-3  # SPEC Precision, float16


def mem_available():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def fill(x):
    """x[0, 0, z, y, w] = ((7 z + 13 y + 29 w) mod 1009) / 252 - 2, a slab at a time."""
    S1, S2 = x.shape[3], x.shape[4]
    yy = (13 * np.arange(S1, dtype=np.int64))[:, None]
    ww = (29 * np.arange(S2, dtype=np.int64))[None, :]
    base = yy + ww
    for z in range(x.shape[2]):
        x[0, 0, z] = (((base + 7 * z) % 1009) / 252.0 - 2.0).astype(np.float16)


def choose_points(S, P, rng):
    """Float16 grid values (x, y, z) for P points with crops at least 6 voxels apart."""
    g16 = lambda u: np.float16(2.0 * u / (S - 1) - 1.0)  # noqa: E731
    u_of = lambda g: (float(g) + 1.0) / 2.0 * (S - 1)    # noqa: E731  align_corners=True
    one = np.float16(1.0)
    just_past = np.nextafter(one, np.float16(2))           # u slightly beyond S - 1
    pts, floors = [], []

    def ok(cand):
        f = [int(np.floor(u_of(c))) for c in cand]
        return all(max(abs(a - b) for a, b in zip(f, g)) >= 6 for g in floors), f

    # fixed far points: on the far corner, just past it, and on/near the far faces
    fixed = [(one, one, one), (just_past, just_past, just_past), (one, g16(S - 40.3), one),
             (g16(S - 700.5), one, just_past), (just_past, g16(S - 300.2), one)]
    for cand in fixed:
        good, f = ok(cand)
        if good:
            pts.append(cand)
            floors.append(f)
    while len(pts) < P:
        if len(pts) < 3 * P // 4:     # last planes: flat index beyond 2**31
            u = (rng.uniform(0, S - 1), rng.uniform(S / 2, S - 1), rng.uniform(S - 3, S - 1))
        else:
            u = tuple(rng.uniform(0, S - 1, 3))
        cand = tuple(g16(v) for v in u)
        good, f = ok(cand)
        if good:
            pts.append(cand)
            floors.append(f)
    return np.array(pts, dtype=np.float16)


def crop_case(x, g, S):
    """(crop of x as float64, crop grid value (float64), slices, multiplier ratio per axis)."""
    slices, gc, ratio = [], [], []
    for a in range(3):                       # a: 0 = x/W, 1 = y/H, 2 = z/D
        u = (float(g[a]) + 1.0) / 2.0 * (S - 1)
        lo = max(0, int(np.floor(u)) - 1)
        hi = min(S, lo + 4)
        lo = max(0, min(lo, hi - 2))
        s = hi - lo
        slices.append(slice(lo, hi))
        gc.append(2.0 * (u - lo) / (s - 1) - 1.0)
        ratio.append((S - 1) / (s - 1))
    sw, sh, sd = slices
    crop = x[:, :, sd, sh, sw].astype(np.float64)
    return crop, np.array(gc).reshape(1, 1, 1, 1, 3), (sd, sh, sw), np.array(ratio)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, default=1291, help="S: the input is S x S x S")
    ap.add_argument("--points", type=int, default=64)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--no-dx", action="store_true", help="grid gradient and forward only")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    S, P = args.size, args.points
    L = S ** 3
    need = L * (2 if args.no_dx else 8) + (1 << 30)
    print(f"gs3d from {gs3d.__file__}")
    print(f"input (1, 1, {S}, {S}, {S}) float16: {L:,} elements "
          f"({'>' if L > 2**31 else '<='} 2**31 = {2**31:,}), {2 * L / 1e9:.2f} GB; "
          f"needs ~{need / 1e9:.1f} GB, MemAvailable {mem_available() / 1e9:.1f} GB")
    if mem_available() < need:
        print("not enough memory available; use --no-dx or a smaller --size")
        return 2
    rng = np.random.default_rng(args.seed)

    t = time.perf_counter()
    x = np.empty((1, 1, S, S, S), dtype=np.float16)
    fill(x)
    print(f"fill:     {time.perf_counter() - t:7.2f} s")
    pts = choose_points(S, P, rng)
    grid = pts.reshape(1, 1, 1, P, 3)
    go = rng.uniform(-2, 2, (1, 1, 1, 1, P)).astype(np.float16)
    flat = [int(((np.floor((float(p[2]) + 1) / 2 * (S - 1)) * S
                  + np.floor((float(p[1]) + 1) / 2 * (S - 1))) * S
                 + np.floor((float(p[0]) + 1) / 2 * (S - 1)))) for p in pts]
    print(f"points:   {P}, {sum(f >= 2**31 for f in flat)} with a flat corner index >= 2**31 "
          f"(largest {max(flat):,})")
    opts = dict(mode="bilinear", padding_mode="zeros", align_corners=True,
                num_threads=args.threads)

    t = time.perf_counter()
    dx, dg = gs3d.grid_sample_3d_backward(go, x, grid, output_mask=(not args.no_dx, True),
                                          **opts)
    print(f"backward: {time.perf_counter() - t:7.2f} s "
          f"(output_mask={(not args.no_dx, True)}, threads={args.threads or 'default'})")
    t = time.perf_counter()
    out = gs3d.grid_sample_3d(x, grid, **opts)
    print(f"forward:  {time.perf_counter() - t:7.2f} s")

    t = time.perf_counter()
    worst = {"input_grad": 0.0, "grid_grad": 0.0, "forward": 0.0}
    nonzero_expected = 0
    for p in range(P):
        crop, gc, (sd, sh, sw), ratio = crop_case(x, pts[p], S)
        gop = go[..., p:p + 1].astype(np.float64)
        rdx, rdg = ref.grid_sample_3d_backward(gop, crop, gc, mode="bilinear",
                                               padding_mode="zeros", align_corners=True)
        rout = ref.grid_sample_3d(crop, gc, mode="bilinear", padding_mode="zeros",
                                  align_corners=True)
        want_dg = rdg.reshape(3) * ratio
        got_dg = dg[0, 0, 0, p].astype(np.float64)
        scale = max(np.abs(want_dg).max(), 1e-30)
        worst["grid_grad"] = max(worst["grid_grad"], np.abs(got_dg - want_dg).max() / scale)
        scale = max(abs(float(rout.ravel()[0])), 1e-30)
        worst["forward"] = max(worst["forward"],
                               abs(float(out[0, 0, 0, 0, p]) - float(rout.ravel()[0])) / scale)
        if dx is not None:
            got_dx = dx[:, :, sd, sh, sw].astype(np.float64)
            scale = max(np.abs(rdx).max(), 1e-30)
            worst["input_grad"] = max(worst["input_grad"], np.abs(got_dx - rdx).max() / scale)
            nonzero_expected += int(np.count_nonzero(rdx))
    print(f"check:    {time.perf_counter() - t:7.2f} s")
    ok = worst["grid_grad"] <= TOL and worst["forward"] <= TOL
    if dx is not None:
        ok = ok and worst["input_grad"] <= TOL
        t = time.perf_counter()
        nonzero = sum(int(np.count_nonzero(dx[0, 0, z])) for z in range(S))
        print(f"input_grad non-zeros: {nonzero} (expected at most {nonzero_expected}, the "
              f"reference's over all crops) [{time.perf_counter() - t:.2f} s]")
        ok = ok and nonzero <= nonzero_expected
    else:
        del worst["input_grad"]
    print("worst relative error: " + ", ".join(f"{k} {v:.2e}" for k, v in worst.items())
          + f" (tolerance {TOL})")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
