# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False, nonecheck=False
"""Compute kernels of gs3d (private: call them through gs3d.grid_sample_3d[_backward]).

Every array reaches these functions already validated, as a view whose axes are ordered
(N, D, H, W, C) for volumes and (N, Do, Ho, Wo, 3) for grids, whatever the caller's layout: the
layout is only a permutation of strides here.  Element strides may be anything (negative, zero),
the Python layer guarantees they are multiples of the item size and that outputs do not overlap
inputs or themselves.

Storage types: float64, float32, and ``unsigned short`` for both 16-bit formats (``half_kind``
tells float16 from bfloat16).  The compute type ``acc_t`` is double for float64 and float for the
others; 16-bit results are accumulated in float32 and rounded once.

Points are processed in tiles of TILE output points: first the set-up of the whole tile (corner
offsets, weights, in-bounds bit masks), then the channel work, with channels-last, strided
(NCDHW) and single-channel variants that give bitwise the same results.

Parallel scatter without races and without dependence on the thread count: for each batch item
the input depth axis D is cut into one slab per thread; every thread walks the output points in
order (skipping whole tiles whose group's depth range misses its slab) and scatters only the
corners that fall into its own slab.  Each dx element therefore receives its contributions in
point order, whatever the number of threads and however the slabs are cut: results are bitwise
identical to the serial loop.  The slab boundaries are chosen from a sample of the grid so
that threads get similar amounts of work.
"""
from cpython.object cimport PyObject
from cpython.pythread cimport (
    NOWAIT_LOCK, WAIT_LOCK, PyThread_acquire_lock, PyThread_allocate_lock, PyThread_free_lock,
    PyThread_release_lock, PyThread_type_lock,
)
from cpython.ref cimport Py_INCREF
cimport cython
from cython.parallel cimport prange, threadid
from libc.math cimport rint, floor
from libc.string cimport memset
cimport numpy as cnp
import numpy as np

cnp.import_array()

cdef extern from "numpy/arrayobject.h":
    # declared here with a raw descriptor: it steals a reference to it
    object PyArray_Empty_steal "PyArray_Empty" (int nd, cnp.npy_intp* dims,
                                                cnp.PyArray_Descr* descr, int fortran)

from gs3d._helpers cimport (
    GS3D_OPENMP, omp_get_max_threads, f16_to_f32, f32_to_f16, bf16_to_f32, f32_to_bf16,
    map_coord, floor_index, gs3d_prefetch, gs3d_prefetch_w, gs3d_cpu_has_avx2, gs3d_cpu_has_avx512,
    MODE_NEAREST, MODE_BILINEAR,
    HALF_BF16, gs3d_map_axis_linear, GS3D_HAVE_F16C, gs3d_f16x8_hw,
    gs3d_corners_x, gs3d_corners_y, gs3d_corners_z, GS3D_HAVE_SIMD_GATHER, gs3d_forward_gather_avx2, gs3d_forward_gather_h,
    gs3d_bwd_args, gs3d_backward_gather_avx2, gs3d_setup_args, gs3d_setup_tile_f, gs3d_dot_f, gs3d_dot_d, gs3d_axpy_f, gs3d_axpy_d,
    gs3d_corners_f, gs3d_corners_d, GS3D_HAVE_V8D, gs3d_point_bwd_d, gs3d_corners2_d,
    GS3D_HAVE_HALF_SIMD, gs3d_dot_h, gs3d_store_h, gs3d_cl_args, gs3d_backward_cl_avx2, GS3D_CL_GOBUF,
    gs3d_clf_args, gs3d_forward_cl_avx2, gs3d_rows_args, gs3d_backward_rows, gs3d_tile_planes_f,
    gs3d_tile_planes_h, gs3d_transpose_f, gs3d_transpose_hf, gs3d_transpose_u16, gs3d_transpose_fh,
    gs3d_transpose_d,
)

ctypedef fused store_t:
    double
    float
    unsigned short

ctypedef fused acc_t:
    double
    float


cdef struct Geo:
    Py_ssize_t N, C, D, H, W, Do, Ho, Wo
    Py_ssize_t xs[5]     # input strides (elements), axes N, D, H, W, C
    Py_ssize_t gs[5]     # grad_output / forward output strides, axes N, Do, Ho, Wo, C
    Py_ssize_t qs[5]     # grid strides, axes N, Do, Ho, Wo, 3
    Py_ssize_t os[5]     # grid_grad strides
    Py_ssize_t ds[5]     # input_grad strides, axes N, D, H, W, C
    Py_ssize_t as_[4]    # float32 accumulator strides (16-bit input_grad), axes D, H, W, C
    int mode, padding, align, half_kind
    bint simd_gather     # through gs3d_forward/backward_gather_avx2 (see enable_simd_gather)
    bint prefetch_fwd    # prefetch corners ahead of the point loops in the forward
    bint prefetch_bwd    # and in the backward (see PREFETCH_BWD_MIN_KIB and _F64)
    int lead_row         # under that gate, the rows kernel's one corner row (see lead_row)
    Py_ssize_t qp, op    # and its point strides of the grid and grad_output / the output
    Py_ssize_t dp        # and of grid_grad (backward)
    Py_ssize_t xlast     # offset of the input's highest-addressed element (16-bit gathers)
    bint rows            # the backward's tiles may take gs3d_backward_rows (see backward_run)
    bint rows_dx         # and with an input gradient, by its accumulator's offsets


cdef enum:
    TILE = 64        # points per tile
    HULL_TILES = 4   # tiles per depth range kept for the depth slabs (tile_planes)
    SETUP8_MAX_SIZE = 2147483646    # largest axis of gs3d_setup_tile_f's int32 indices
    AHEAD = 8        # prefetch the corners of the point this many ahead
    XBLOCK = 16      # voxels along W per block of the channels-last transpositions
    STAGE = 64 * TILE    # values of compute type in a thread's scratch beyond its C

# Software prefetch of the corners ahead of the point loops (AHEAD points ahead in the tile
# loops and the channels-last kernels, a tile ahead in the AVX2 gather forward) pays only when
# a batch item's input, at the compute type's width (the accumulator of a 16-bit input gradient
# is float32), is larger than the caches keep near the core; below that the hints are pure
# overhead and the hardware prefetcher does as well.  Measured at one thread against the same
# build with no prefetch (AMD EPYC, 1-2 MiB L2 per core, 32 MiB L3, float32 NDHWC; ms):
#   backward, channels-last: 1x16x32^3 (2 MiB) smooth 0.88 vs 0.73 (2 threads) and 2.19 vs
#     1.98, 1x16x36^3 (2.8 MiB) 3.20 vs 3.01, 1x8x40^3 (2 MiB) 1.55 vs 1.30 (2 threads);
#     1x32x32^3 (4 MiB) even; 1x16x40^3 (4 MiB) 3.57 vs 4.7; 1x32x64^3 (32 MiB) random 21 vs
#     37 (2 threads).  Backward gather (C <= 8): no difference at 1x4x32^3 or 48^3, left on.
#   forward, gather: 1x16x32^3 (2 MiB) smooth 0.67 vs 0.55, 1x8x32^3 random 0.60 vs 0.49,
#     1x16x48^3 (7 MiB) random 3.50 vs 2.77, 1x1x128^3 NCDHW (8 MiB) random 28.2 vs 25.9 and
#     smooth even; 2x4x96^3 NCDHW (27 MiB) smooth 26.2 vs 27.5 (2 threads), 1x32x64^3
#     (32 MiB) even.  Forward channels-last, float16: 1x16x32^3 1.21 vs 1.11.
# float64's backward (the tile loop; a row of eight channels fills a cache line) pays from
# smaller items: measured on an Intel Xeon (2 MiB L2 per core), in-process A/B against no
# prefetch, 2 threads, float64: 8x8x32^3 (2 MiB per item) random NCDHW 1.41-1.42x, NDHWC
# 1.32-1.46x (1.43x at one thread), smooth 0.95-1.03x; 8x4x32^3 (1 MiB) random 1.34x but
# smooth 0.87-0.96x, 8x8x24^3 (0.84 MiB) random 1.28x, smooth 0.91-0.92x: so from 1.5 MiB,
# where smooth grids lose nothing.  (float32 from 0.5 MiB on the same host: random
# 0.93-1.31x, smooth 0.80-0.95x.)
# Under PREFETCH_BWD_MIN_KIB, gs3d_backward_rows (float32 and 16-bit, C a multiple of 8, tiles
# of smooth grids, and the grid gradient alone on any grid) still prefetches one corner row of
# the input for each point whose grid gradient it computes: the row that no earlier output row
# touched (lead_row).  On a smooth warp a point's other three rows were read one output row or
# one output plane before and are still near; the lead row is where the misses fall once the
# call's data does not stay in the caches from one call to the next (perf, 8x8x32^3 NDHWC at
# one thread: 29% of the rows kernel's samples on the loads of its two corners).  In-process
# A/B against no prefetch there (36af9f4), float32 NDHWC smooth, three runs, 2 threads / 1
# thread: 8x8x32^3 1.16-1.29x / 1.25-1.33x, 4x16x32^3 1.19-1.43x / 1.22-1.30x, 16x8x24^3
# 1.09-1.13x, 4x8x32^3 1.01-1.15x, 2x16x32^3 0.98-0.99x; NCDHW 4x16x32^3 1.10-1.11x; grids
# flipped in height, depth or both (lead rows 2, 1, 0) 1.23-1.29x; the grid gradient alone
# 1.02-1.03x smooth, 0.98-1.01x random; the input gradient alone (no row prefetched)
# 0.98-1.03x; float16 0.98-1.04x.  Small calls, whose data stays in the caches (1x16x32^3,
# 1x8x32^3, 2x8x32^3, 32x16x8^3, NCDHW 1x16x32^3): 0.97-1.00x, as a variant that left calls
# under 4 MiB of input without the hint measured them (the same build against itself:
# 0.97-1.02x); items past the gate, all four rows as before (1x32x32^3, 1x32x64^3):
# 0.97-1.01x.  Measured and not kept: all four rows on calls under 4 MiB (2x8x32^3,
# 1x16x32^3, 2x16x32^3, 4x8x32^3: 0.77-0.89x), the accumulator's lead row too (the input
# gradient alone 0.95x), and the same hint in the forward gather (0.81-1.04x).
# Prefetching never changes a result, only when the lines arrive.
# The float32 gather forward (enable_simd_gather; the tile loop keeps the item gate, untimed) with
# at most PREFETCH_FWD_FEW_MAX_C channels (its channel-plane, pair, four-channel and masked-load
# branches) also prefetches when the whole call's input, grid and output pass
# PREFETCH_FWD_FEW_MIN_KIB (few_call_prefetch_rule; 1.5x this host's 32 MiB L3), whatever its
# batch items: then they cannot stay in the caches from one call to the next, and each point's
# first read of an input row (the rows of the next depth plane, perf: 45% of the gather forward's
# samples at 2x4x96^3 smooth, on corners 4 and 6) comes from memory.  In-process A/B against
# 5ea801d, 2 threads, ratio of times (the spread is the host's state, which moved the same call up
# to 3.7x): 2x4x96^3 (74 MiB) smooth NCDHW 1.08-1.30x, NDHWC 1.28-1.47x, random NCDHW (through the
# copy) 1.20-1.44x, NDHWC 1.02-2.02x; 1x2x128^3 (56 MiB) smooth NCDHW 1.17-1.43x, random NDHWC
# 1.73x; 2x1x128^3 (80 MiB) 1.14-1.36x; many small items (NDHWC 16x4x48^3, 1.7 MiB items,
# 1.05-1.20x; 64x4x32^3 1.04-1.06x; 32x2x40^3 1.46x; NCDHW 16x1x64^3 1.22x).  Calls under it that
# lost or gained nothing with the hints: 1x4x96^3 (37 MiB; 2 threads 0.85-0.98x, one thread
# 0.96-1.19x), 1x1x128^3 (40 MiB, 0.94-1.04x), 4x4x64^3 (44 MiB, 1.02x), 2x2x96^3 (47 MiB, 0.98x),
# 1x6x64^3 (15 MiB, 0.82x), 2x4x64^3 (22 MiB, 0.81-0.92x); one that gained, 2x4x80^3 (43 MiB,
# 1.04-1.23x).  float64 (the tile loop) lost at 1x1x128^3 (0.92x) and keeps the item gate
# alone.  With the channels in planes (NCDHW) every channel's plane is prefetched, not only the
# first (2x4x96^3 smooth 1.24x against 1.06x; 1x4x128^3, past the item gate, 1.03x).
# On a grid that is not scattered (grid_scattered), a call gate of PREFETCH_FWD_FEW_SMOOTH_MIN_KIB
# (this host's L3) applies, but for four channels: there each point's rows come one after the
# other, and a call past the L3 has them in memory.  In-process A/B against the 48 MiB gate alone,
# 2 threads: 1x1x128^3 (40 MiB) smooth NCDHW 1.15-1.31x, NDHWC 1.29-1.33x, one thread 1.29-1.33x;
# 1x2x112^3 (37 MiB) smooth NCDHW 1.28x, NDHWC 1.54x; 1x3x104^3 (40 MiB) 1.30x; 1x6x88^3 NDHWC (39
# MiB) 1.19x; 1x5x88^3 NCDHW 1.13x; 2x3x80^3 NDHWC 1.24x; 2x2x96^3 (47 MiB) 1.06x; 1x1x120^3 (33
# MiB) 1.04x.  The same gate on scattered grids: 1x1x128^3 random NCDHW 0.92-0.95x, NDHWC
# 0.97-1.11x, 1x2x112^3 random NCDHW 0.75x; and with four channels (the 128-bit loads of rows4)
# 1x4x96^3 (37 MiB) smooth NDHWC 0.92-1.19x at 2 threads, the host's state deciding (one thread
# 1.09-1.17x), NCDHW 1x4x100^3 0.93-0.98x: four channels keep the 48 MiB gate.
# Where two or more threads share one batch item's channels-last copy (N below the thread
# count), one core reads lines the other core wrote, and the float32 forward prefetches from
# PREFETCH_FWD_SHARED_MIN_KIB of copy on: 1x8x64^3 (8 MiB) NCDHW smooth 0.95-1.48x, random
# 1.11-1.31x, 1x16x64^3 (16 MiB) 1.08-1.37x, 1x32x48^3 (13.5 MiB) 1.05-1.40x; under it
# 1x16x48^3 (6.75 MiB) 0.85-1.08x, 1x8x48^3 and 1x16x40^3 (3.4-3.9 MiB) 0.84x.  The tile loop
# on such a copy (C not a multiple of 8) gains too: 1x10x64^3 smooth 1.09x, random 1.25x,
# 1x12x64^3 smooth 1.22x, random 1.24x, 1x12x56^3 smooth 1.15x (against no hint).
# float64's forward (the tile loop) with a multiple of 8 channels contiguous in the caller's
# input (gs3d_corners_d: a point's corner rows are whole cache lines) also prefetches in a call
# past PREFETCH_FWD_F64_MIN_KIB (f64_call_prefetch_rule; this host's L3): then the call's data
# does not stay in the caches from one call to the next, and perf put 72% of the tile loop's
# samples on its corner loads.  In-process A/B against no hint, 2 threads, NDHWC: 8x8x32^3 (38
# MiB) smooth 0.97-1.30x, random 1.01-1.34x, one thread 1.21-1.36x; 4x16x32^3 random
# 1.17-1.39x; 2x16x40^3 smooth 1.34x, random 1.11x; 4x8x40^3 smooth 1.12x, random 1.24x;
# 2x8x48^3 (34 MiB, 6.75 MiB items) smooth 1.08-1.23x but random 0.90-0.95x.  Not gated:
# 1x16x32^3 (9 MiB) 0.80-0.85x; a channels-last copy of NCDHW, read right after it was written
# (8x8x32^3 smooth 0.88x); fewer channels, the other branches (16x4x32^3 1.15x, but 1x4x96^3
# 0.99-1.01x, 1x1x128^3 smooth 0.96x, 1x2x112^3 0.99x).
cdef enum:
    PREFETCH_BWD_MIN_KIB = 3072
    PREFETCH_BWD_MIN_KIB_F64 = 1536
    PREFETCH_FWD_MIN_KIB = 16384
    PREFETCH_FWD_FEW_MAX_C = 7
    PREFETCH_FWD_FEW_MIN_KIB = 49152
    PREFETCH_FWD_FEW_SMOOTH_MIN_KIB = 32768
    PREFETCH_FWD_SHARED_MIN_KIB = 7168
    PREFETCH_FWD_F64_MIN_KIB = 32768

# gs3d_backward_rows (see backward_tile) against the tile loop it replaces, in-process A/B, 2
# threads: with an input gradient it wins where a tile's points are close together (smooth
# grids: 1x16x32^3 NDHWC 1.11-1.18x, NCDHW 1.00-1.12x, 1x16x64^3 1.02-1.12x, 8x8x32^3 and
# 1x32x64^3 1.01-1.06x) but loses where they scatter over the volume (uniformly random grids
# through it: 8x8x32^3 0.90-0.94x, 1x16x64^3 0.87-0.93x, 1x32x64^3 0.86-0.94x): there every
# corner misses the cache, and the tile loop's separate set-up pass overlaps those misses
# better.  So a tile scatters through it only when its points' depth coordinates span at most
# ROWS_MAX_PLANES planes, or a quarter of the depth (tile_coherent: a uniformly random grid
# spans all of it; the bench's smooth warps span 3-4 planes at 32^3, 7-15 at 128^3); the grid
# gradient alone always takes it (1.07-1.49x at 32^3, 64^3 smooth 1.20-1.31x, random
# 1.00-1.07x).  The bits are the same either way.  float16 and bfloat16 storage follow the
# same rules (smooth grids with the input gradient 1.06-1.18x, the grid gradient alone
# 1.24-1.32x; README).
cdef enum:
    ROWS_MAX_PLANES = 8

# NCDHW (channel stride not 1) runs through channels-last memory when it has at least
# TRANSPOSE_MIN_C channels and the output has at least 1 / TRANSPOSE_MIN_FILL as many points as
# the input volume: input[n] is copied channels-last, input_grad[n] accumulated channels-last and
# transposed back at the end.  Those copies cost a few passes over the volume (input, and for the
# input gradient the write-back); the channel-outermost loop they replace costs per output point,
# several times more than the channels-last loop for C >= 8 but about the same for C <= 4.
# Measured at one thread (64^3 input, C = 8 and 32, smooth and random grids): with P at 0.42 and
# 0.24 of the volume the copies won 1.0-4x in all but one case (grid gradient only, C = 8:
# 0.84x); at 0.125 they lost up to 0.7x on smooth grids, at 0.03 up to 0.4x.
# The float32 bilinear backward, any padding (the AVX2 gather backward's case, whichever
# build runs it, so that both builds take one path and give one set of bits) takes the copies
# from TRANSPOSE_FEW_MIN_C channels: the gather backward on the channels-last copy
# reads and scatters a corner's channels in one or two lines, not in C planes (and from four
# channels in one 128-bit read-modify-write).  In-process A/B, 2 threads unless said: 2x4x96^3
# smooth 83.8 -> 57.8 ms, random 163 -> 108 ms; 1x4x64^3 smooth 11.3 -> 9.0 ms (1 thread
# 20.3 -> 15.5), random 18.7 -> 15.7 ms.  C = 5-7 (scalar scatter) gain less: 1x6x64^3 and
# 1x7x64^3 smooth 1.24-1.35x, random 1.04-1.09x, 2x6x64^3 random and 2x7x64^3 smooth 1.21x,
# 2x5x64^3 smooth even, and one loss, 1x7x48^3 smooth at 1 thread 0.9x (a 3 MiB volume whose
# copies weigh more); C = 2 and 3 gained nothing (0.88-1.10x).  N = 1 random grids lose the
# split of the points (see gs3d._api._may_split), and still gain.  float16/bfloat16 take the
# copies at exactly four channels (A/B, AVX-512 module, 2 threads: 1x4x48^3 random 1.27x,
# 2x4x64^3 smooth 1.29x, random bfloat16 1.45x, 1x4x48^3 smooth at 1 thread 1.23x; grid
# gradient only 0.93x); with 5-7 channels they lost (0.73-0.87x: the scalar scatter).
cdef enum:
    TRANSPOSE_MIN_C = 8
    TRANSPOSE_FEW_MIN_C = 4
    TRANSPOSE_MIN_FILL = 4

# The float32 bilinear forward of 4-7 NCDHW channels read the channel planes in place (the gather
# forward, GATHER_MAX_C) except on scattered grids (grid_scattered: most sampled tiles span more
# depth planes than ROWS_MAX_PLANES) of a batch item of at least FEW_FWD_MIN_KIB, where it took
# the channels-last copy (the baseline module still does; the SIMD modules now take it on any
# grid: see below): there each corner's C planes cost C misses (and C pages) where
# the copy's cost one.  In-process A/B, 2 threads, uniformly random grids: 1x4x128^3 2.3-2.4x
# faster (one thread 2.5x), 2x4x128^3 2.4x, 1x5x128^3 1.9x, 1x4x112^3 1.7x, 1x6x96^3 1.3x.  The
# gate was 16 MiB while the copy's buffer was allocated afresh by every plain call of that size
# (then 1x4x96^3 1.1x, 2x4x96^3 1.0x, 1x4x64^3 0.83x, 8x4x32^3 0.9x); since 2fe0e2d plain calls
# keep it.  Against that gate (36af9f4), with the copy from 1 MiB where each thread runs whole
# batch items (one thread, or N >= threads): 2x4x96^3 1.52-1.60x (one thread 1.09-1.18x), 4x4x48^3
# 1.14-1.44x, 2x4x64^3 1.15x, 2x6x64^3 1.01x, 1x4x48^3 at one thread 1.15-1.18x, and 8x4x32^3 (0.5
# MiB items, from a 256 KiB gate) 1.00-1.03x (one thread 1.03-1.15x): so from 1 MiB.  Where two
# threads share one batch item (N = 1), the copy one core writes the other reads back through its
# caches, and this host measured it at 0.99-1.24x in one run (1x4x48^3 to 1x6x80^3) and at 0.74x
# (1x4x48^3), 0.88-0.95x (1x4x64^3) in another, so there the 16 MiB gate stays
# (FEW_FWD_SHARED_MIN_KIB, since lowered: below).  Without the grid test smooth warps lost
# (2x4x96^3 0.85x, 2x6x64^3 0.88x).  (For four channels these figures predate rows4: see
# below.)  float16/bfloat16 with four channels lost or gained nothing (0.9-1.0x) but at 2x4x96^3
# random (1.16x), so they keep the planes.
# Four channels (FEW_FWD_ROWS_C): since the gather forward reads a channels-last copy of four
# channels into NCDHW output with one 128-bit load per corner (rows4, was eight gathers per
# channel), against the same code with the gathers (dfe24d5), in-process A/B, 2 threads: random
# 2x4x96^3 1.72x, 2x4x64^3 1.34x, 1x4x128^3 2.15x.  Smooth grids then gain from the copy too
# (2x4x96^3 1.43-1.50x, 4x4x64^3 1.26x, 2x4x48^3 1.20x, one thread 1x4x64^3 1.25x, 1x4x96^3
# 1.40x), so four channels take it on any grid where the gather forward runs (the baseline
# module's tile loop keeps the grid test: untimed); 5-7 (read with gathers) still lose on smooth
# grids (2x5x64^3 0.87x, 2x6x64^3 0.81x, 2x7x64^3 0.89x).  Where two threads share one batch item,
# four channels take it from FEW_FWD_SHARED_MIN_KIB: 1x4x64^3 (4 MiB) random 0.99-1.42x,
# smooth 1.12-1.34x, 1x4x96^3 random 2.12x, smooth 1.51x; 1x4x48^3 (1.7 MiB) random 0.84-0.88x;
# six channels lost there (1x6x64^3 random 0.85-0.94x).
# Five to seven channels: since they too are read with a load per corner (rowsm, masked), they
# take the copy as four do, on any grid and from FEW_FWD_SHARED_MIN_KIB where threads share an
# item.  In-process A/B against the grid test and a 16 MiB shared gate, 2 threads: smooth 2x7x64^3
# 1.56-1.57x, 1x7x80^3 1.58x, 2x5x96^3 1.30x, 1x6x96^3 1.28x, 1x6x64^3 1.29x (random 1.32x),
# 3x6x48^3 1.09x, 2x5x64^3 1.05x, 1x5x64^3 1.01x, one thread 2x6x64^3 1.13x, 1x6x64^3 1.31x;
# 2x6x64^3 at two threads 0.94-0.98x (a 30 MiB call, just under the forward's prefetch gate:
# 2x7x64^3, past it, is the 1.56x); unchanged under the gates (1x5x48^3, 4x6x32^3) 0.99-1.00x.
cdef enum:
    FEW_FWD_MIN_KIB = 1024
    FEW_FWD_SHARED_MIN_KIB = 4096
    FEW_FWD_ROWS_C = 4


# The AVX2 gather forward maps eight points at once and gathers each channel of each corner;
# measured at one thread against the tile loop (float32, smooth and random grids): C = 1-8
# 1.2-2.9x faster in both layouts, C = 16 0.97-1.18x, C = 32 NCDHW random 0.71x (every
# channel's gathers miss anew; the channels-last copy keeps a corner's channels together).
# Beyond GATHER_MAX_C it runs only with channels contiguous in the input (NDHWC, or the
# channels-last copy of NCDHW) and C a multiple of 8, reading each corner's channels with
# contiguous loads: against the tile loop with its C consumer, at one thread, 1x16x32^3
# 1.3-1.7x (NDHWC out) and 1.3-1.55x (NCDHW out), 1x8x48^3 NDHWC 1.2x.  So an NCDHW input
# with C = 8 takes the channels-last copy when channels_last_rule holds, rather than gathering
# each channel plane: plan, float32 random grids, 1 / 2 threads, 1x8x32^3 0.91 / 0.66 ->
# 0.52 / 0.27 ms, 1x8x64^3 9.5 / 4.6 -> 6.6 / 2.9 ms, 8x8x32^3 9.3 / 5.2 -> 4.6 / 2.8 ms
# (smooth 7.5 / 3.9 -> 3.7 / 2.0 ms).
cdef enum:
    GATHER_MAX_C = 8

# Its backward (gs3d_backward_gather_avx2, float32, not through a channels-last copy), measured
# against the tile loop at 1 and 2 threads, N = 1 and 2: C = 1-7 1.06-2.0x faster (random
# grids at N = 1 gain least: every thread maps every point), C = 8 0.92-1.04x (the tile loop's
# eight-lane channel dot is as fast), so it stops at 7.
cdef enum:
    BWD_GATHER_MAX_C = 7


# The threaded nearest backward (whenever batch items are not shared out whole among the
# threads: N below the thread count, or the channels-last NCDHW path) first finds, in parallel
# over points, the voxel of NBLOCK points, then scatters them, each thread into its own depth
# slab (no thread repeats another's set-up, as the threads of the bilinear slabs do on random
# grids).
cdef enum:
    NBLOCK = 4096


# columns of scratch a kernel needs beyond the C of the channel buffer
SCRATCH_EXTRA = STAGE


def workspace_bytes(int nthreads, Py_ssize_t D, Py_ssize_t P, int mode=MODE_BILINEAR):
    """Bytes of the ``workspace`` buffer the kernels need for ``P`` output points per batch
    item: one tile per thread, the slab bounds, the per-plane cost estimate and the depth range
    of every HULL_TILES tiles (the last three for the threaded backward; nearest uses the room
    of the depth ranges for its blocks of voxel indices instead, see nearest_index_tile)."""
    return (nthreads * sizeof(Tile) + (nthreads + 1) * sizeof(Py_ssize_t) + D * sizeof(double)
            + region_bytes(P, mode))


cdef inline Py_ssize_t region_bytes(Py_ssize_t P, int mode) noexcept nogil:
    """The last region of the workspace: the depth ranges of groups of HULL_TILES tiles
    (bilinear), or one block of nearest's voxel offsets, grad_output offsets and depth indices
    (threaded nearest)."""
    if mode == MODE_NEAREST:
        return 3 * min(P, <Py_ssize_t>NBLOCK) * sizeof(Py_ssize_t)
    return 2 * hull_groups(P) * sizeof(Py_ssize_t)


cdef inline Py_ssize_t hull_groups(Py_ssize_t P) noexcept nogil:
    """How many groups of HULL_TILES tiles ``P`` points make (one depth range each)."""
    return (P + HULL_TILES * TILE - 1) // (HULL_TILES * TILE)


cdef inline bint channels_last_rule(Py_ssize_t C, Py_ssize_t D, Py_ssize_t H, Py_ssize_t W,
                                    Py_ssize_t P, bint few) noexcept nogil:
    return ((C >= TRANSPOSE_MIN_C or (few and C >= TRANSPOSE_FEW_MIN_C))
            and P * TRANSPOSE_MIN_FILL >= D * H * W)


cdef inline bint few_channels_rule(int itemsize, Py_ssize_t C, int mode,
                                   int padding) noexcept nogil:
    """The backward whose NCDHW input takes the channels-last copies from
    TRANSPOSE_FEW_MIN_C channels: bilinear, any padding (the AVX2 gather backward's case,
    whichever build runs), float32 storage (``itemsize`` 4), or 16-bit
    storage with exactly TRANSPOSE_FEW_MIN_C channels (its one 128-bit read-modify-write per
    corner; see TRANSPOSE_MIN_C)."""
    return (mode == MODE_BILINEAR
            and (itemsize == 4 or (itemsize == 2 and C == TRANSPOSE_FEW_MIN_C)))


cdef inline bint few_channels_fwd_rule(int itemsize, Py_ssize_t C, Py_ssize_t item,
                                       int mode, bint whole) noexcept nogil:
    """The forward whose NCDHW input may take the channels-last copy from TRANSPOSE_FEW_MIN_C
    channels (on any grid where the gather forward runs, else on scattered grids: see
    FEW_FWD_MIN_KIB): float32 storage (``itemsize`` 4), bilinear, fewer than TRANSPOSE_MIN_C
    channels, ``item`` elements per batch item, of at least FEW_FWD_MIN_KIB when each thread
    runs whole batch items (``whole``: one thread, or at least as many batch items as
    threads), else FEW_FWD_SHARED_MIN_KIB."""
    cdef Py_ssize_t kib = FEW_FWD_MIN_KIB if whole else FEW_FWD_SHARED_MIN_KIB
    return (itemsize == 4 and mode == MODE_BILINEAR and TRANSPOSE_FEW_MIN_C <= C < TRANSPOSE_MIN_C
            and item * itemsize >= 1024 * kib)


def few_channels_backward(int itemsize, Py_ssize_t C, int mode, int padding):
    """few_channels_rule, for gs3d._api (``few`` of channels_last_pays)."""
    return bool(few_channels_rule(itemsize, C, mode, padding))


def few_channels_forward(int itemsize, Py_ssize_t C, Py_ssize_t D, Py_ssize_t H, Py_ssize_t W,
                         int mode, bint whole=True):
    """few_channels_fwd_rule, for gs3d._api (``few`` of channels_last_pays for a forward)."""
    return bool(few_channels_fwd_rule(itemsize, C, D * H * W * C, mode, whole))


def channels_last_pays(Py_ssize_t C, Py_ssize_t D, Py_ssize_t H, Py_ssize_t W, Py_ssize_t P,
                       bint few=False):
    """True when a volume (C, D, H, W) whose channel stride is not 1, sampled at ``P`` points
    per batch item, runs through channels-last copies (the buffers of those copies come from
    gs3d._api: a (D, H, W, C) accumulator of the compute type for the input gradient, and a
    D * H * W * C storage-type buffer for the input copy when it cannot live in input_grad).
    ``few``: a backward of few_channels_rule, which takes the copies from TRANSPOSE_FEW_MIN_C
    channels."""
    return bool(channels_last_rule(C, D, H, W, P, few))


def cpu_has_avx2():
    """True when this CPU has AVX2, FMA and F16C (the instructions of _kernels_avx2)."""
    return bool(gs3d_cpu_has_avx2())


def cpu_has_avx512():
    """True when this CPU (and OS) has AVX-512 F, VL, DQ and BW besides AVX2, FMA and F16C (the
    instructions of _kernels_avx512)."""
    return bool(gs3d_cpu_has_avx512())


def openmp_enabled():
    """True when the module was compiled with OpenMP."""
    return bool(GS3D_OPENMP)


def max_threads():
    """The OpenMP default thread count (1 without OpenMP)."""
    return omp_get_max_threads()


# ---------------------------------------------------------------------------------------------
# element access
# ---------------------------------------------------------------------------------------------

cdef inline double ld(const store_t* p, Py_ssize_t i, int half_kind) noexcept nogil:
    if store_t is double:
        return p[i]
    elif store_t is float:
        return p[i]
    else:
        if half_kind == HALF_BF16:
            return bf16_to_f32(p[i])
        return f16_to_f32(p[i])


cdef inline void st(store_t* p, Py_ssize_t i, acc_t v, int half_kind) noexcept nogil:
    if store_t is double:
        p[i] = v
    elif store_t is float:
        p[i] = <float>v
    else:
        if half_kind == HALF_BF16:
            p[i] = f32_to_bf16(<float>v)
        else:
            p[i] = f32_to_f16(<float>v)


cdef void fill_strides(Py_ssize_t* dst, Py_ssize_t* shape, Py_ssize_t* strides,
                       Py_ssize_t itemsize, int ndim) noexcept:
    """Element strides (the Python layer guarantees byte strides are item-size multiples)."""
    cdef int k
    for k in range(ndim):
        dst[k] = strides[k] // itemsize if shape[k] > 1 else 0


cdef int init_geo(Geo* g, const store_t[:, :, :, :, :] inp, const store_t[:, :, :, :, :] grid,
                  acc_t[:, ::1] scratch, int mode, int padding, bint align,
                  int half_kind) except -1:
    """Sizes, input and grid strides and options of a call (``scratch`` selects the compute
    type, which must match the storage type); output strides start at 0."""
    if store_t is double:
        if acc_t is float:
            raise TypeError("compute type does not match the storage type")
    elif acc_t is double:
        raise TypeError("compute type does not match the storage type")
    init_geo_raw(g, inp.shape, inp.strides, grid.shape, grid.strides, sizeof(store_t), mode,
                 padding, align, half_kind)
    return 0


cdef inline bint few_call_prefetch_rule(Py_ssize_t isz, Py_ssize_t N, Py_ssize_t C,
                                        Py_ssize_t L, Py_ssize_t P,
                                        bint scattered) noexcept nogil:
    """The gather forward's call gate (N batch items of L voxels and C channels sampled at P
    points, ``isz``-byte values): float32 with at most PREFETCH_FWD_FEW_MAX_C channels whose
    call (input, grid and output) passes PREFETCH_FWD_FEW_MIN_KIB, or, on a grid that is not
    ``scattered`` (grid_scattered) and with other than FEW_FWD_ROWS_C channels,
    PREFETCH_FWD_FEW_SMOOTH_MIN_KIB.  (True with ``scattered`` implies True without it.)"""
    cdef Py_ssize_t kib = call_kib(isz, N, C, L, P)
    return (isz == 4 and C <= PREFETCH_FWD_FEW_MAX_C
            and (kib > <Py_ssize_t>PREFETCH_FWD_FEW_MIN_KIB
                 or (not scattered and C != FEW_FWD_ROWS_C
                     and kib > <Py_ssize_t>PREFETCH_FWD_FEW_SMOOTH_MIN_KIB)))


cdef inline bint f64_call_prefetch_rule(Py_ssize_t N, Py_ssize_t C, Py_ssize_t L,
                                        Py_ssize_t P) noexcept nogil:
    """float64's call gate in the forward's tile loop (N batch items of L voxels and C
    channels, contiguous in the input, sampled at P points): a multiple of 8 channels (its
    gs3d_corners_d branch) in a call past PREFETCH_FWD_F64_MIN_KIB."""
    return C % 8 == 0 and call_kib(8, N, C, L, P) > <Py_ssize_t>PREFETCH_FWD_F64_MIN_KIB


cdef inline Py_ssize_t call_kib(Py_ssize_t isz, Py_ssize_t N, Py_ssize_t C, Py_ssize_t L,
                                Py_ssize_t P) noexcept nogil:
    """KiB of a forward call's input, grid and output (N batch items of L voxels and C
    channels sampled at P points, ``isz``-byte values)."""
    return N * (L * C + P * (3 + C)) * isz // 1024


cdef inline Py_ssize_t item_kib(Py_ssize_t values, Py_ssize_t isz) noexcept nogil:
    """KiB of a batch item of ``values`` values of ``isz`` bytes as the prefetch gates count
    them: 16-bit storage at 4 bytes a value (its compute type, float32)."""
    return values * (isz if isz > 4 else 4) // 1024


def forward_prefetches(int itemsize, Py_ssize_t N, Py_ssize_t C, Py_ssize_t D, Py_ssize_t H,
                       Py_ssize_t W, Py_ssize_t P, bint scattered=True, bint in_place=False):
    """For tests: whether the forward prefetches (float32 and 16-bit storage in the gather
    forward where it runs, see enable_simd_gather; float64 in the tile loop): a batch item's
    input past PREFETCH_FWD_MIN_KIB (item_kib), or few_call_prefetch_rule (``scattered``: the
    grid as grid_scattered finds it), or for float64 whose channels are contiguous in the
    caller's input (``in_place``: no channels-last copy) f64_call_prefetch_rule."""
    return bool(item_kib(D * H * W * C, itemsize) > <Py_ssize_t>PREFETCH_FWD_MIN_KIB
                or few_call_prefetch_rule(itemsize, N, C, D * H * W, P, scattered)
                or (itemsize == 8 and in_place and f64_call_prefetch_rule(N, C, D * H * W, P)))


cdef void init_geo_raw(Geo* g, Py_ssize_t* xshape, Py_ssize_t* xstrides, Py_ssize_t* qshape,
                       Py_ssize_t* qstrides, Py_ssize_t isz, int mode, int padding, bint align,
                       int half_kind) noexcept:
    """init_geo from shapes and byte strides (axes NDHWC-ordered) of items of ``isz`` bytes."""
    cdef int k
    cdef Py_ssize_t kib
    g.N, g.D, g.H, g.W, g.C = xshape[0], xshape[1], xshape[2], xshape[3], xshape[4]
    g.Do, g.Ho, g.Wo = qshape[1], qshape[2], qshape[3]
    fill_strides(g.xs, xshape, xstrides, isz, 5)
    fill_strides(g.qs, qshape, qstrides, isz, 5)
    for k in range(5):
        g.gs[k] = g.os[k] = g.ds[k] = 0
    for k in range(4):
        g.as_[k] = 0
    g.mode, g.padding, g.align, g.half_kind = mode, padding, align, half_kind
    g.simd_gather = False
    g.xlast = 0
    for k in range(5):
        if xshape[k] > 0 and g.xs[k] > 0:
            g.xlast += (xshape[k] - 1) * g.xs[k]
    kib = item_kib(g.D * g.H * g.W * g.C, isz)
    g.prefetch_fwd = kib > <Py_ssize_t>PREFETCH_FWD_MIN_KIB   # (forward_run may add more)
    g.prefetch_bwd = kib > <Py_ssize_t>(PREFETCH_BWD_MIN_KIB_F64 if isz == 8
                                        else PREFETCH_BWD_MIN_KIB)
    g.qp = g.op = g.dp = 0
    g.rows = g.rows_dx = False
    g.lead_row = 3


cdef bint flat_points(const Py_ssize_t* s, Geo* g, Py_ssize_t* step) noexcept nogil:
    """True when output point p (flat over Do, Ho, Wo) of an array with strides ``s`` (N, Do,
    Ho, Wo, ...) sits at p * step from its batch item's first point."""
    step[0] = s[3] if g.Wo > 1 else (s[2] if g.Ho > 1 else s[1])
    return ((g.Wo <= 1 or s[3] == step[0]) and (g.Ho <= 1 or s[2] == step[0] * g.Wo)
            and (g.Do <= 1 or s[1] == step[0] * g.Wo * g.Ho))


cdef bint int32_offsets(Geo* g, const Py_ssize_t* st) noexcept nogil:
    """True when the offset of every corner of indices in [-2, size + 1], in every channel, fits
    in an int32 in a volume of element strides ``st`` (D, H, W, C): the gathers and scatters
    of gs3d_forward/backward_gather_avx2 index with int32."""
    cdef Py_ssize_t reach = 0, k, s
    cdef Py_ssize_t extent[4]
    extent[0], extent[1], extent[2], extent[3] = g.D + 2, g.H + 2, g.W + 2, g.C
    for k in range(4):
        s = st[k] if st[k] >= 0 else -st[k]
        if extent[k] > 2147483647 // 4 or (s and extent[k] > (2147483647 // 2) // s):
            return False
        reach += extent[k] * s
        if reach > 2147483647 // 2:
            return False
    return True


cdef void enable_simd_gather(Geo* g) noexcept nogil:
    """Use the AVX2 gather forward (gs3d_forward_gather_avx2; 16-bit storage: see half_rows)
    where it applies: at most GATHER_MAX_C channels (or a multiple of 8 contiguous in the
    input, and in the output or with its points at step 1: its point-by-point branch),
    bilinear (any padding), grid and output points at fixed steps, int32 offsets."""
    g.simd_gather = (GS3D_HAVE_SIMD_GATHER and g.mode == MODE_BILINEAR
                     and (g.C <= GATHER_MAX_C or (g.C % 8 == 0 and g.xs[4] == 1))
                     and int32_offsets(g, &g.xs[1])
                     and flat_points(g.qs, g, &g.qp) and flat_points(g.gs, g, &g.op))
    if g.C > GATHER_MAX_C:
        # the point-by-point branch: output channels contiguous, or its points at step 1
        g.simd_gather = g.simd_gather and (g.gs[4] == 1 or g.op == 1)


cdef void half_rows(Geo* g) noexcept nogil:
    """16-bit storage takes the gather kernels (gs3d_forward_gather_h, and the backward's) where
    float32 would, given F16C, except for more than GATHER_MAX_C channels that are not a
    multiple of 8 (the float32 forward's rows branch takes any C, the 16-bit one only
    multiples of 8)."""
    g.simd_gather = (g.simd_gather and GS3D_HAVE_HALF_SIMD
                     and (g.C <= GATHER_MAX_C or g.C % 8 == 0))


# ---------------------------------------------------------------------------------------------
# channels-last copies (NCDHW with many channels, see TRANSPOSE_MIN_C)
# ---------------------------------------------------------------------------------------------

cdef bint channels_last_geo(Geo* g, Geo* gT, bint few) noexcept nogil:
    """When the input's channel stride is not 1 and channels_last_rule holds (``few`` as
    there): fill ``gT`` (``g`` with the input strides of a contiguous (D, H, W, C) copy of one
    batch item) and return True."""
    if g.xs[4] == 1 or not channels_last_rule(g.C, g.D, g.H, g.W, g.Do * g.Ho * g.Wo, few):
        return False
    gT[0] = g[0]
    gT.xs[0] = 0
    gT.xs[1] = g.H * g.W * g.C
    gT.xs[2] = g.W * g.C
    gT.xs[3] = g.C
    gT.xs[4] = 1
    gT.xlast = g.D * g.H * g.W * g.C - 1
    return True


cdef bint dense_strides(const Py_ssize_t* s, const Py_ssize_t* shape, int ndim) noexcept nogil:
    """True when axes of these element strides (0 for axes of size 1, as fill_strides makes
    them) tile one contiguous block of prod(shape) elements, in any axis order, upwards."""
    cdef Py_ssize_t extent = 1
    cdef int k, j, best
    cdef bint used[8]
    for k in range(ndim):
        used[k] = shape[k] <= 1
    for j in range(ndim):
        best = -1
        for k in range(ndim):
            if not used[k] and (best < 0 or s[k] < s[best]):
                best = k
        if best < 0:
            break
        if s[best] != extent:
            return False
        used[best] = True
        extent *= shape[best]
    return True


cdef void transpose_planes(const store_t* x, Geo* g, store_t* xT, Py_ssize_t zlo,
                           Py_ssize_t zhi) noexcept nogil:
    """Copy the depth planes [zlo, zhi) of one batch item of the input (``x`` points at its
    first element, strides ``g.xs``) into the contiguous (D, H, W, C) buffer ``xT``, blocked over
    W so that every cache line of a channel row is read in one go (rows contiguous along W:
    gs3d_transpose_f / gs3d_transpose_u16, 8 x 8 blocks in registers, gs3d_transpose_d 4 x 4)."""
    cdef Py_ssize_t z, y, x0, x1, xx, c, o, d, C = g.C
    cdef Py_ssize_t xs1 = g.xs[1], xs2 = g.xs[2], xs3 = g.xs[3], xs4 = g.xs[4]
    for z in range(zlo, zhi):
        for y in range(g.H):
            o = z * xs1 + y * xs2
            d = (z * g.H + y) * g.W * C
            if GS3D_HAVE_SIMD_GATHER and xs3 == 1:
                # rows contiguous along W: 8 x 8 blocks in registers, the next row prefetched
                # when it follows on in memory
                if store_t is float:
                    gs3d_transpose_f(&x[o], xs4, C, g.W, &xT[d], C, g.W if xs2 == g.W else 0)
                    continue
                elif store_t is not double:
                    gs3d_transpose_u16(&x[o], xs4, C, g.W, &xT[d], C, g.W if xs2 == g.W else 0)
                    continue
                else:
                    gs3d_transpose_d(&x[o], xs4, C, g.W, &xT[d], C, g.W if xs2 == g.W else 0)
                    continue
            x0 = 0
            while x0 < g.W:
                x1 = min(x0 + <Py_ssize_t>XBLOCK, g.W)
                for c in range(C):
                    for xx in range(x0, x1):
                        xT[d + xx * C + c] = x[o + xx * xs3 + c * xs4]
                x0 = x1


# ---------------------------------------------------------------------------------------------
# per-point set-up
# ---------------------------------------------------------------------------------------------

cdef inline bint axis_index(double gv, Py_ssize_t size, Geo* g, double* u, double* m,
                            Py_ssize_t* i0) noexcept nogil:
    """Map one normalised coordinate; ``i0`` gets floor(u) (bilinear) or round(u) (nearest)."""
    if not map_coord(gv, size, g.padding, g.align, u, m):
        i0[0] = 0
        return False
    if g.mode == MODE_NEAREST:
        # round half to even (the default FP rounding mode); clamp first so the cast is safe
        i0[0] = floor_index(rint(u[0] if u[0] > -2.0 else -2.0), size)
    else:
        i0[0] = floor_index(u[0], size)
    return True


cdef inline Py_ssize_t key_of(bint ok, Py_ssize_t z0, Py_ssize_t D) noexcept nogil:
    """The depth plane that owns a point's grid gradient (any fixed rule would do)."""
    if not ok or z0 < 0:
        return 0
    if z0 >= D:
        return D - 1
    return z0


cdef inline void planes_needed(const store_t* q, Py_ssize_t qo, Py_ssize_t qc, Geo* g,
                               Py_ssize_t* lo, Py_ssize_t* hi) noexcept nogil:
    """[lo, hi]: the depth planes a point needs, from its z coordinate alone: the planes of its
    corners and the plane that owns its grid gradient (planes outside [0, D) never matter)."""
    cdef double u, m
    cdef Py_ssize_t zi
    cdef bint okz = axis_index(ld(q, qo + 2 * qc, g.half_kind), g.D, g, &u, &m, &zi)
    cdef Py_ssize_t kp = key_of(okz, zi, g.D)
    lo[0] = min(kp, zi) if okz else kp
    hi[0] = max(kp, zi + 1) if okz else kp


cdef struct Cursor:
    # output point (od, oh, ow), advanced without divisions
    Py_ssize_t od, oh, ow


cdef inline void cursor_start(Cursor* c, Geo* g, Py_ssize_t p) noexcept nogil:
    cdef Py_ssize_t rem
    c.od = p // (g.Ho * g.Wo)
    rem = p - c.od * g.Ho * g.Wo
    c.oh = rem // g.Wo
    c.ow = rem - c.oh * g.Wo


cdef inline void cursor_next(Cursor* c, Geo* g) noexcept nogil:
    c.ow += 1
    if c.ow == g.Wo:
        c.ow = 0
        c.oh += 1
        if c.oh == g.Ho:
            c.oh = 0
            c.od += 1


cdef inline Py_ssize_t cursor_offset(Cursor* c, Py_ssize_t* s, Py_ssize_t n) noexcept nogil:
    """Offset of the point (batch item n) in an array with strides ``s`` (N, Do, Ho, Wo)."""
    return n * s[0] + c.od * s[1] + c.oh * s[2] + c.ow * s[3]


# ---------------------------------------------------------------------------------------------
# tiles: the set-up of TILE points at once, then the channel work
# ---------------------------------------------------------------------------------------------

cdef struct Tile:
    Py_ssize_t ob[TILE]          # offset of the point in grad_output / the forward output
    Py_ssize_t oq[TILE]          # offset of the point in grid_grad
    Py_ssize_t xb[TILE]          # input offset of corner 0 (batch included)
    Py_ssize_t ab[TILE]          # accumulator offset of corner 0
    Py_ssize_t xd[8]             # offset of corner j from corner 0, input and accumulator
    Py_ssize_t ad[8]
    Py_ssize_t px_lo, px_n      # byte range of a corner row (x0, x1, channels) in the input
    Py_ssize_t pa_lo, pa_n      # and in the accumulator, for prefetching
    double f[6 * TILE]           # wx0, wx1, wy0, wy1, wz0, wz1, axis-major (f[k * TILE + i])
    double w[8 * TILE]           # corner weights wx * (wy * wz), corner-major (w[j * TILE + i])
    double okv[TILE]             # 1.0: the point samples something along all three axes
    double mult[3 * TILE]        # grid-gradient multipliers, axis-major (x of every point, y, z)
    double cx[3 * TILE]          # coordinates, axis-major (x of every point, y, z)
    double fr[3 * TILE]          # fractions u - floor(u), axis-major
    double fi[3 * TILE]          # corner-0 index per axis (an integer-valued double), axis-major
    unsigned char fl[3 * TILE]   # AX_* flags per axis, axis-major
    double tmp[TILE]             # map_axis scratch
    unsigned char vd[TILE]       # bit j: corner j in bounds (gathered for the grid gradient)
    unsigned char vs[TILE]       # bit j: corner j in bounds and in this slab (scattered)
    unsigned char own[TILE]      # 1: this call writes the point's grid gradient


cdef inline Py_ssize_t xo(Tile* t, int i, int j) noexcept nogil:
    """Input offset of corner j of point i."""
    return t.xb[i] + t.xd[j]


cdef inline Py_ssize_t ao(Tile* t, int i, int j) noexcept nogil:
    """Accumulator offset of corner j of point i."""
    return t.ab[i] + t.ad[j]


cdef inline acc_t corner_weight(Tile* t, int i, int j, acc_t* type_only) noexcept nogil:
    """wx * (wy * wz) of corner j of point i, in the compute type (``type_only`` selects it),
    as setup_tile computed it."""
    return <acc_t>t.w[j * TILE + i]


cdef inline void corner_weights(Tile* t, int i, acc_t* w8) noexcept nogil:
    """All eight corner_weight values of point i."""
    cdef int j
    for j in range(8):
        w8[j] = <acc_t>t.w[j * TILE + i]


cdef inline void prefetch_span(const char* p, Py_ssize_t lo, Py_ssize_t nbytes,
                               bint for_write) noexcept nogil:
    """Ask for every cache line that holds a byte of [p + lo, p + lo + nbytes) (nbytes > 0)."""
    cdef const char* end = p + lo + nbytes
    if nbytes <= 64:
        # at most two lines (most rows of few channels): its first and last byte, no loop
        if for_write:
            gs3d_prefetch_w(p + lo)
            gs3d_prefetch_w(end - 1)
        else:
            gs3d_prefetch(p + lo)
            gs3d_prefetch(end - 1)
        return
    p = p + lo - ((<size_t>(p + lo)) & 63)        # start of the first line
    if for_write:
        while p < end:
            gs3d_prefetch_w(p)
            p += 64
    else:
        while p < end:
            gs3d_prefetch(p)
            p += 64


cdef inline void prefetch_corners(const store_t* x, acc_t* A, Tile* t, int i,
                                  unsigned char gather, unsigned char scatter) noexcept nogil:
    """Ask for the cache lines of point i's corners: the input rows it gathers from and the
    accumulator rows it scatters into (row r: corners 2r and 2r + 1, x0 and x1 with all their
    channels), for the rows holding a corner of the masks ``gather`` / ``scatter`` (bit j:
    corner j; nearest and edge points need fewer rows).  Only called for points whose corner
    offsets were set."""
    cdef int r
    for r in range(4):
        if (gather >> (2 * r)) & 3:
            prefetch_span(<const char*>&x[xo(t, i, 2 * r)], t.px_lo, t.px_n, False)
        if (scatter >> (2 * r)) & 3:
            prefetch_span(<const char*>&A[ao(t, i, 2 * r)], t.pa_lo, t.pa_n, True)


cdef inline void row_span(Py_ssize_t step, Py_ssize_t C, Py_ssize_t cstride, Py_ssize_t isz,
                          Py_ssize_t* lo, Py_ssize_t* nbytes) noexcept nogil:
    """Byte range, relative to corner x0, of corners x0 and x1 (``step`` apart) with their
    channels (all of them when contiguous, else the first only)."""
    cdef Py_ssize_t span = C if cstride == 1 else 1
    lo[0] = (step if step < 0 else 0) * isz
    nbytes[0] = ((step if step > 0 else -step) + span) * isz


cdef enum:
    AX_OK = 1        # map_axis flags: the point samples something along this axis,
    AX_IN0 = 2       # its corner 0 is in bounds,
    AX_IN1 = 4       # its corner 1 is in bounds (read under bilinear only)


cdef void map_axis(const double* gin, int cnt, Py_ssize_t size, Geo* g, double* frac,
                   double* mult, double* fidx, unsigned char* flags, double* okf) noexcept nogil:
    """Map one axis of ``cnt`` points: corner-0 index ``fidx`` (floor, or round for nearest,
    as a double), fraction ``frac`` = u - fidx, grid-gradient factor ``mult`` and flags (bit 0:
    samples something along this axis, bit 1: corner 0 in bounds, bit 2: corner 1 in bounds).

    Every padding runs through gs3d_map_axis_linear (loops with the arithmetic of map_coord
    and axis_index: floor, or round half to even for nearest; vectorisable under zeros and
    border).  A point that samples nothing gets index 0, fraction 0 and factor 0.  The arrays
    must not overlap; ``okf`` is scratch.
    """
    gs3d_map_axis_linear(gin, cnt, <double>size, g.align, g.padding, g.mode == MODE_NEAREST,
                         frac, mult, fidx, okf, flags)


cdef inline unsigned char corner_bits(unsigned char fx, unsigned char fy,
                                      unsigned char fz) noexcept nogil:
    """In-bounds corners as a bit mask (bit j = corner 4 cz + 2 cy + cx) from axis flags: per
    axis, the corners its AX_IN0 / AX_IN1 bits admit, looked up (gs3d_corners_x/y/z)."""
    return gs3d_corners_x[fx & 7] & gs3d_corners_y[fy & 7] & gs3d_corners_z[fz & 7]


cdef void tile_points(const store_t* q, Geo* g, Py_ssize_t n, Py_ssize_t p0, int cnt,
                      bint mapped, Tile* t) noexcept nogil:
    """The output points [p0, p0 + cnt) of batch item ``n``: their grad_output / output
    offsets (``t.ob``) and grid_grad offsets (``t.oq``), and with ``mapped`` their coordinates
    mapped along each axis (map_axis into ``t.fr``, ``t.mult``, ``t.fi``, ``t.fl``)."""
    cdef Cursor cur
    cdef Py_ssize_t qo, go, oo, qc = g.qs[4]
    cdef int i
    cdef int hk = g.half_kind
    cdef double* cx = t.cx
    cdef double* cy = &t.cx[TILE]
    cdef double* cz = &t.cx[2 * TILE]
    cursor_start(&cur, g, p0)
    qo = cursor_offset(&cur, g.qs, n)
    go = cursor_offset(&cur, g.gs, n)
    oo = cursor_offset(&cur, g.os, n)
    for i in range(cnt):
        if i:
            # next point: one step along Wo, or a wrap onto the next row (offsets recomputed)
            if cur.ow + 1 < g.Wo:
                cur.ow += 1
                qo += g.qs[3]
                go += g.gs[3]
                oo += g.os[3]
            else:
                cursor_next(&cur, g)
                qo = cursor_offset(&cur, g.qs, n)
                go = cursor_offset(&cur, g.gs, n)
                oo = cursor_offset(&cur, g.os, n)
        if mapped:
            cx[i] = ld(q, qo, hk)
            cy[i] = ld(q, qo + qc, hk)
            cz[i] = ld(q, qo + 2 * qc, hk)
        t.ob[i] = go
        t.oq[i] = oo
    if mapped:
        map_axis(cx, cnt, g.W, g, t.fr, t.mult, t.fi, t.fl, t.tmp)
        map_axis(cy, cnt, g.H, g, &t.fr[TILE], &t.mult[TILE], &t.fi[TILE], &t.fl[TILE], t.tmp)
        map_axis(cz, cnt, g.D, g, &t.fr[2 * TILE], &t.mult[2 * TILE], &t.fi[2 * TILE],
                 &t.fl[2 * TILE], t.tmp)


cdef void setup_nearest(const store_t* q, Geo* g, Py_ssize_t* As, Py_ssize_t n, Py_ssize_t p0,
                        int cnt, Py_ssize_t zlo, Py_ssize_t zhi, bint do_dg, bint own_all,
                        Tile* t) noexcept nogil:
    """setup_tile for nearest: the one voxel each point reads or scatters to (input offset
    ``t.xb``, accumulator offset ``t.ab``; ``t.vs`` 1 when it is in bounds and in the slab
    [zlo, zhi)) and the points whose (zero) grid gradient this call writes
    (``t.own``).  Weights are all 1, so none are stored."""
    cdef int i
    cdef unsigned char ok
    cdef Py_ssize_t x0, y0, z0
    tile_points(q, g, n, p0, cnt, True, t)
    for i in range(cnt):
        # corner 0 (the rounded index) in bounds on every axis
        ok = t.fl[i] & t.fl[TILE + i] & t.fl[2 * TILE + i] & (AX_OK | AX_IN0)
        x0 = <Py_ssize_t>t.fi[i]
        y0 = <Py_ssize_t>t.fi[TILE + i]
        z0 = <Py_ssize_t>t.fi[2 * TILE + i]
        t.xb[i] = n * g.xs[0] + z0 * g.xs[1] + y0 * g.xs[2] + x0 * g.xs[3]
        t.ab[i] = z0 * As[0] + y0 * As[1] + x0 * As[2]
        t.vs[i] = ok == (AX_OK | AX_IN0) and zlo <= z0 < zhi
    if not do_dg or own_all:
        memset(t.own, 1 if do_dg else 0, cnt)
    else:
        for i in range(cnt):
            t.own[i] = zlo <= key_of(t.fl[2 * TILE + i] & AX_OK, <Py_ssize_t>t.fi[2 * TILE + i],
                                     g.D) < zhi


cdef void setup_tile(const store_t* q, Geo* g, acc_t* As_dummy, Py_ssize_t* As, Py_ssize_t n,
                     Py_ssize_t p0, int cnt, Py_ssize_t zlo, Py_ssize_t zhi, bint do_dx,
                     bint do_dg, bint own_all, Tile* t) noexcept nogil:
    """Corners, weights and flags of the points [p0, p0 + cnt) of batch item ``n`` (bilinear;
    nearest has setup_nearest).

    Passes: read the tile's coordinates, map each axis for the whole tile (map_axis), combine
    the axes point by point into offsets and corner masks, then the per-axis weights and the
    eight corner weights as loops over the whole tile.  Weights are computed in the compute
    type ``acc_t`` (``As_dummy`` only selects it) and kept as doubles, which hold them
    exactly.  Corners out of bounds get no flag bit; their offsets are never read or written
    through (at most prefetched, which cannot fault).  float32 or 16-bit points at a fixed step
    (any padding) take gs3d_setup_tile_f (eight points at a time, the same arrays
    and bits; 16-bit coordinates converted exactly) in the SIMD builds.
    """
    cdef Py_ssize_t key, x0, y0, z0
    cdef int i, j
    cdef unsigned char fx, fy, fz, vd, valid, slab
    cdef bint all_planes
    cdef double* fr
    cdef double* fa
    cdef double* fb
    cdef double* mu
    cdef gs3d_setup_args sa
    for j in range(8):
        # corner j = 4 cz + 2 cy + cx: tnw, tne, tsw, tse, bnw, bne, bsw, bse
        t.xd[j] = (j >> 2) * g.xs[1] + ((j >> 1) & 1) * g.xs[2] + (j & 1) * g.xs[3]
        t.ad[j] = (j >> 2) * As[0] + ((j >> 1) & 1) * As[1] + (j & 1) * As[2]
    row_span(g.xs[3], g.C, g.xs[4], sizeof(store_t), &t.px_lo, &t.px_n)
    row_span(As[2], g.C, As[3], sizeof(acc_t), &t.pa_lo, &t.pa_n)
    all_planes = zlo <= 0 and zhi >= g.D      # the slab test cannot clear an in-bounds corner
    if store_t is not double and acc_t is float:
        if (GS3D_HAVE_SIMD_GATHER and (store_t is float or GS3D_HAVE_HALF_SIMD)
                and max(g.W, max(g.H, g.D)) <= <Py_ssize_t>SETUP8_MAX_SIZE
                and flat_points(g.qs, g, &sa.qp)):
            # eight points at a time in C (gs3d_setup_tile_f), the same arrays and bits; its
            # corner indices are int32 (every index in [-2, size + 1] must fit)
            tile_points(q, g, n, p0, cnt, False, t)
            if store_t is float:
                sa.q, sa.qh, sa.qk = &q[n * g.qs[0] + p0 * sa.qp], NULL, 0
            else:
                sa.q, sa.qh = NULL, &q[n * g.qs[0] + p0 * sa.qp]
                sa.qk = 2 if g.half_kind == HALF_BF16 else 1
            sa.qc, sa.W, sa.H, sa.D = g.qs[4], g.W, g.H, g.D
            sa.xo, sa.sx, sa.sy, sa.sz = n * g.xs[0], g.xs[3], g.xs[2], g.xs[1]
            sa.ax, sa.ay, sa.az, sa.zlo, sa.zhi = As[2], As[1], As[0], zlo, zhi
            sa.align, sa.border, sa.all_planes = g.align, g.padding, all_planes
            sa.do_dx, sa.do_dg, sa.own_all, sa.cnt, sa.tile = do_dx, do_dg, own_all, cnt, TILE
            sa.xb, sa.ab, sa.vd, sa.vs, sa.own = t.xb, t.ab, t.vd, t.vs, t.own
            sa.okv, sa.f, sa.w, sa.mult = t.okv, t.f, t.w, t.mult
            gs3d_setup_tile_f(&sa)
            return
    tile_points(q, g, n, p0, cnt, True, t)
    # combine the axes: offsets and corner masks point by point (integer work), then weights,
    # factors and corner weights in vectorisable passes over the tile
    for i in range(cnt):
        fx, fy, fz = t.fl[i], t.fl[TILE + i], t.fl[2 * TILE + i]
        valid = fx & fy & fz & AX_OK
        t.okv[i] = 1.0 if valid else 0.0
        x0 = <Py_ssize_t>t.fi[i]
        y0 = <Py_ssize_t>t.fi[TILE + i]
        z0 = <Py_ssize_t>t.fi[2 * TILE + i]
        t.xb[i] = n * g.xs[0] + z0 * g.xs[1] + y0 * g.xs[2] + x0 * g.xs[3]
        t.ab[i] = z0 * As[0] + y0 * As[1] + x0 * As[2]
        vd = corner_bits(fx, fy, fz) if valid else 0
        slab = vd
        if not all_planes:
            slab = vd & ((0x0F if zlo <= z0 < zhi else 0) | (0xF0 if zlo <= z0 + 1 < zhi else 0))
        t.vd[i] = vd
        t.vs[i] = slab if do_dx else 0
    if not do_dg or own_all:
        memset(t.own, 1 if do_dg else 0, cnt)
    else:
        for i in range(cnt):
            key = key_of(t.fl[2 * TILE + i] & AX_OK, <Py_ssize_t>t.fi[2 * TILE + i], g.D)
            t.own[i] = zlo <= key < zhi
    for j in range(3):
        # a point that samples nothing has grid gradient exactly +0 on every axis
        fr = &t.fr[j * TILE]
        fa = &t.f[2 * j * TILE]
        fb = &t.f[(2 * j + 1) * TILE]
        mu = &t.mult[j * TILE]
        for i in range(cnt):
            fa[i] = <acc_t>(1.0 - fr[i])
            fb[i] = <acc_t>fr[i]
            mu[i] = mu[i] if t.okv[i] != 0.0 else 0.0
    for j in range(8):
        # corner j = 4 cz + 2 cy + cx: wx * (wy * wz) in the compute type
        fa = &t.f[(j & 1) * TILE]
        fb = &t.f[(2 + ((j >> 1) & 1)) * TILE]
        fr = &t.f[(4 + (j >> 2)) * TILE]
        mu = &t.w[j * TILE]
        for i in range(cnt):
            mu[i] = <acc_t>fa[i] * (<acc_t>fb[i] * <acc_t>fr[i])


cdef inline void grid_grad_of(Tile* t, int i, const acc_t* dots, int dstride, store_t* dq,
                              Py_ssize_t qc, int hk) noexcept nogil:
    """Write point i's grid gradient from the channel dot products of its corners
    (``dots[j * dstride]``, for the corners flagged in ``t.vd``)."""
    cdef acc_t gx = 0, gy = 0, gz = 0, dot, fx, fy, fz
    cdef acc_t wx0 = <acc_t>t.f[i], wx1 = <acc_t>t.f[TILE + i]
    cdef acc_t wy0 = <acc_t>t.f[2 * TILE + i], wy1 = <acc_t>t.f[3 * TILE + i]
    cdef acc_t wz0 = <acc_t>t.f[4 * TILE + i], wz1 = <acc_t>t.f[5 * TILE + i]
    cdef int j
    cdef unsigned char vd = t.vd[i]
    cdef acc_t d0, d1, d2, d3, d4, d5, d6, d7
    if vd == 0xFF:
        # all eight corners in bounds (most points): the sums below, factored by axis
        d0, d1, d2, d3 = dots[0], dots[dstride], dots[2 * dstride], dots[3 * dstride]
        d4, d5, d6, d7 = dots[4 * dstride], dots[5 * dstride], dots[6 * dstride], dots[7 * dstride]
        gx = wz0 * (wy0 * (d1 - d0) + wy1 * (d3 - d2)) + wz1 * (wy0 * (d5 - d4) + wy1 * (d7 - d6))
        gy = wz0 * (wx0 * (d2 - d0) + wx1 * (d3 - d1)) + wz1 * (wx0 * (d6 - d4) + wx1 * (d7 - d5))
        gz = wy0 * (wx0 * (d4 - d0) + wx1 * (d5 - d1)) + wy1 * (wx0 * (d6 - d2) + wx1 * (d7 - d3))
        vd = 0
    for j in range(8 if vd else 0):
        if (vd >> j) & 1:
            dot = dots[j * dstride]
            fx = (wy1 if (j >> 1) & 1 else wy0) * (wz1 if j >> 2 else wz0)
            fy = (wx1 if j & 1 else wx0) * (wz1 if j >> 2 else wz0)
            fz = (wx1 if j & 1 else wx0) * (wy1 if (j >> 1) & 1 else wy0)
            gx = gx + dot * fx if j & 1 else gx - dot * fx
            gy = gy + dot * fy if (j >> 1) & 1 else gy - dot * fy
            gz = gz + dot * fz if j >> 2 else gz - dot * fz
    st(dq, t.oq[i], <acc_t>t.mult[i] * gx, hk)
    st(dq, t.oq[i] + qc, <acc_t>t.mult[TILE + i] * gy, hk)
    st(dq, t.oq[i] + 2 * qc, <acc_t>t.mult[2 * TILE + i] * gz, hk)


# ---------------------------------------------------------------------------------------------
# forward
# ---------------------------------------------------------------------------------------------

cdef void nearest_forward_tile(const store_t* x, const store_t* q, store_t* out, Geo* g, Tile* t,
                               Py_ssize_t n, Py_ssize_t p0, int cnt, acc_t* type_only) noexcept nogil:
    """forward_tile for nearest: out = 0 + x[voxel] per channel (the general loop's sum of one
    weight-1 corner, bitwise), 0 for a point out of bounds; ``type_only`` selects the compute
    type."""
    cdef Py_ssize_t As[4]
    cdef Py_ssize_t c, C = g.C, xc = g.xs[4], oc = g.gs[4], pn
    cdef int i
    cdef acc_t s
    cdef int hk = g.half_kind
    As[0] = As[1] = As[2] = As[3] = 0
    setup_nearest(q, g, As, n, p0, cnt, 0, g.D, False, True, t)
    if xc == 1 and oc == 1:
        pn = C * <Py_ssize_t>sizeof(store_t)
        for i in range(min(cnt, <int>AHEAD)):
            if t.vs[i]:
                prefetch_span(<const char*>&x[t.xb[i]], 0, pn, False)
        for i in range(cnt):
            if i + AHEAD < cnt and t.vs[i + AHEAD]:
                prefetch_span(<const char*>&x[t.xb[i + AHEAD]], 0, pn, False)
            if t.vs[i]:
                for c in range(C):
                    s = 0
                    st(out, t.ob[i] + c, s + <acc_t>ld(x, t.xb[i] + c, hk), hk)
            else:
                for c in range(C):
                    st(out, t.ob[i] + c, <acc_t>0, hk)
        return
    for c in range(C):
        for i in range(cnt):
            s = 0
            if t.vs[i]:
                s = s + <acc_t>ld(x, t.xb[i] + c * xc, hk)
            st(out, t.ob[i] + c * oc, s, hk)


cdef void forward_tile(const store_t* x, const store_t* q, store_t* out, acc_t* scratch, Geo* g,
                       Tile* t, Py_ssize_t n, Py_ssize_t p0, int cnt, acc_t* obuf) noexcept nogil:
    """Forward for the points [p0, p0 + cnt) of batch item ``n``: for every channel,
    out = sum over in-bounds corners, in corner order, of w_k * x_k.

    ``obuf`` (SCRATCH_EXTRA values of the compute type, or NULL) stages the results of a group
    of points when the output's channel stride is not 1, so that each channel's run of
    consecutive points is written in one go instead of C scattered values per point."""
    cdef Py_ssize_t As[4]
    cdef Py_ssize_t c, C = g.C, xc = g.xs[4], oc = g.gs[4]
    cdef int i, j, i0, i1, per, ahead
    cdef unsigned char v
    cdef acc_t s, w
    cdef acc_t w8[8]
    cdef Py_ssize_t xo8[8]
    cdef acc_t* r
    cdef int hk = g.half_kind
    cdef gs3d_clf_args clf
    cdef bint use_cl = False, direct = False, out_flat = False, unstaged, pair_d = False
    cdef acc_t* r1
    cdef int k
    cdef Py_ssize_t pstep
    As[0] = As[1] = As[2] = As[3] = 0
    if g.mode == MODE_NEAREST:
        nearest_forward_tile(x, q, out, g, t, n, p0, cnt, scratch)
        return
    if store_t is float:
        if g.simd_gather:
            gs3d_forward_gather_avx2(&x[n * g.xs[0]], g.xs[3], g.xs[2], g.xs[1], g.W, g.H, g.D,
                                     C, xc, &q[n * g.qs[0] + p0 * g.qp], g.qp, g.qs[4],
                                     &out[n * g.gs[0] + p0 * g.op], g.op, oc, cnt, g.align,
                                     g.padding, g.prefetch_fwd)
            return
    elif store_t is not double:
        if g.simd_gather:
            gs3d_forward_gather_h(&x[n * g.xs[0]], g.xs[3], g.xs[2], g.xs[1], g.W, g.H, g.D,
                                  C, xc, &q[n * g.qs[0] + p0 * g.qp], g.qp, g.qs[4],
                                  &out[n * g.gs[0] + p0 * g.op], g.op, oc, cnt, g.align,
                                  g.padding, g.half_kind == HALF_BF16,
                                  g.xlast - n * g.xs[0])
            return
    setup_tile(q, g, scratch, As, n, p0, cnt, 0, g.D, True, False, True, t)
    # ``ahead``: the prefetch distance, or cnt for none (see PREFETCH_FWD_MIN_KIB)
    ahead = <int>AHEAD if g.prefetch_fwd else cnt
    for i in range(min(cnt, ahead) if g.prefetch_fwd else 0):
        # the points the in-loop prefetch (``ahead`` points ahead) cannot reach
        if t.vs[i]:
            prefetch_corners(x, scratch, t, i, t.vs[i], 0)
    if C == 1:
        for i in range(cnt):
            v = t.vs[i]
            if i + ahead < cnt and t.vs[i + ahead]:
                prefetch_corners(x, scratch, t, i + ahead, t.vs[i + ahead], 0)
            s = 0
            if v == 0xFF:
                # all corners in bounds: no mask tests
                corner_weights(t, i, w8)
                for j in range(8):
                    s = s + w8[j] * <acc_t>ld(x, xo(t, i, j), hk)
            else:
                for j in range(8):
                    if (v >> j) & 1:
                        s = s + corner_weight(t, i, j, scratch) * <acc_t>ld(x, xo(t, i, j), hk)
            st(out, t.ob[i], s, hk)
    elif xc == 1:
        # channels contiguous in the input (NDHWC, or the channels-last copy of NCDHW); the
        # output may have any channel stride
        per = 0
        if oc != 1 and obuf != NULL and C <= STAGE:    # (a point's C values fit)
            per = <int>min(<Py_ssize_t>TILE, STAGE // C)
        if store_t is float and acc_t is float:
            use_cl = GS3D_HAVE_SIMD_GATHER and C % 8 == 0 and (per or oc == 1)
        elif store_t is not double and acc_t is float:
            # 16-bit storage: always staged, the results rounded below (gs3d_store_h for a
            # channels-last output, else st)
            if GS3D_HAVE_HALF_SIMD and C % 8 == 0 and obuf != NULL and C <= STAGE:
                use_cl = True
                per = <int>min(<Py_ssize_t>TILE, STAGE // C)
        if ((store_t is double and acc_t is double) or (store_t is float and acc_t is float)):
            # a multiple of 8 channels into a channels-last output: each point's sums stored
            # there by gs3d_corners_d / _f (below) instead of copied from scratch
            direct = not use_cl and not per and oc == 1 and C % 8 == 0
        if store_t is double and acc_t is double:
            pair_d = GS3D_HAVE_V8D and C == 8 and (per or direct)
            # staged points consecutive in each channel plane (NCDHW): gs3d_transpose_d below
            out_flat = (GS3D_HAVE_SIMD_GATHER and per and flat_points(g.gs, g, &pstep)
                        and pstep == 1)
        i0 = 0
        while i0 < cnt:
            i1 = min(cnt, i0 + per) if per else cnt
            if use_cl:
                if acc_t is float:
                    # the loop below in C with AVX2 (gs3d_forward_cl_avx2): same bits
                    memset(&clf, 0, sizeof(clf))
                    clf.xb, clf.xd, clf.w, clf.vs = t.xb, t.xd, t.w, t.vs
                    clf.C, clf.px_lo, clf.px_n = C, t.px_lo, t.px_n
                    clf.i0, clf.i1, clf.cnt, clf.tile, clf.ahead = i0, i1, cnt, TILE, ahead
                    clf.out, clf.ob = obuf, NULL
                    if store_t is float:
                        clf.x, clf.xkind = x, 0
                        if not per:
                            clf.out, clf.ob = out, t.ob
                    elif store_t is not double:
                        clf.xh, clf.xkind = x, 2 if hk == HALF_BF16 else 1
                    gs3d_forward_cl_avx2(&clf)
            elif pair_d:
                # float64, eight channels, SIMD builds: two points at a time (gs3d_corners2_d;
                # the loop below's operations, same bits), each into its own row
                i = i0
                while i < i1:
                    for k in range(i, min(i + 2, i1)):
                        if k + ahead < cnt and t.vs[k + ahead]:
                            prefetch_corners(x, scratch, t, k + ahead, t.vs[k + ahead], 0)
                    r = &obuf[(i - i0) * C] if per else <acc_t*>&out[t.ob[i]]
                    if i + 1 < i1:
                        r1 = &obuf[(i + 1 - i0) * C] if per else <acc_t*>&out[t.ob[i + 1]]
                        if store_t is double and acc_t is double:
                            gs3d_corners2_d(r, r1, x, t.xb[i], t.xb[i + 1], t.xd, &t.w[i], TILE,
                                            t.vs[i], t.vs[i + 1])
                        i += 2
                    else:
                        for j in range(8):
                            xo8[j] = xo(t, i, j)
                        corner_weights(t, i, w8)
                        if store_t is double and acc_t is double:
                            gs3d_corners_d(r, x, xo8, w8, t.vs[i], C)
                        i += 1
            else:
                for i in range(i0, i1):
                    r = &obuf[(i - i0) * C] if per else scratch
                    if direct:
                        r = <acc_t*>&out[t.ob[i]]
                    v = t.vs[i]
                    if i + ahead < cnt and t.vs[i + ahead]:
                        prefetch_corners(x, scratch, t, i + ahead, t.vs[i + ahead], 0)
                    if ((store_t is double and acc_t is double)
                            or (store_t is float and acc_t is float)) and C % 8 == 0:
                        # the loops below in C, each channel's sum in a register (the same
                        # operations in the same order; float32 mostly takes
                        # gs3d_forward_cl_avx2 in the SIMD builds)
                        for j in range(8):
                            xo8[j] = xo(t, i, j)
                        corner_weights(t, i, w8)
                        if store_t is double and acc_t is double:
                            gs3d_corners_d(r, x, xo8, w8, v, C)
                        elif store_t is float and acc_t is float:
                            gs3d_corners_f(r, x, xo8, w8, v, C)
                    else:
                        for c in range(C):
                            r[c] = 0
                        for j in range(8):
                            if (v >> j) & 1:
                                w = corner_weight(t, i, j, scratch)
                                for c in range(C):
                                    r[c] = r[c] + w * <acc_t>ld(x, xo(t, i, j) + c, hk)
                    if not per and not direct:
                        for c in range(C):
                            st(out, t.ob[i] + c * oc, r[c], hk)
            if per and use_cl and oc == 1:
                # 16-bit channels-last output: each point's C values rounded eight at a time
                if store_t is not double and store_t is not float and acc_t is float:
                    for i in range(i0, i1):
                        gs3d_store_h(&obuf[(i - i0) * C], &out[t.ob[i]], C, hk == HALF_BF16)
            elif per:
                unstaged = False
                if store_t is double and acc_t is double:
                    if out_flat:
                        # 4 x 4 blocks
                        gs3d_transpose_d(obuf, C, i1 - i0, C, &out[t.ob[i0]], oc, 0)
                        unstaged = True
                if not unstaged:
                    for c in range(C):
                        for i in range(i0, i1):
                            st(out, t.ob[i] + c * oc, obuf[(i - i0) * C + c], hk)
            i0 = i1
    else:
        for c in range(C):
            for i in range(cnt):
                v = t.vs[i]
                s = 0
                for j in range(8):
                    if (v >> j) & 1:
                        s = s + corner_weight(t, i, j, scratch) * <acc_t>ld(x, xo(t, i, j) + c * xc, hk)
                st(out, t.ob[i] + c * oc, s, hk)


cdef void forward_chunk(const store_t* x, const store_t* q, store_t* out, acc_t* scratch, Geo* g,
                        Tile* t, Py_ssize_t ci, Py_ssize_t per_n, acc_t* obuf) noexcept nogil:
    """Tile ``ci`` of the flattened (batch, tile) range."""
    cdef Py_ssize_t n = ci // per_n
    cdef Py_ssize_t p0 = (ci - n * per_n) * TILE
    forward_tile(x, q, out, scratch, g, t, n, p0,
                 <int>min(<Py_ssize_t>TILE, g.Do * g.Ho * g.Wo - p0), obuf)


cdef void forward_item(const store_t* x, const store_t* q, store_t* out, acc_t* scratch,
                       Geo* g, Geo* gT, Tile* t, store_t* xT, Py_ssize_t n, Py_ssize_t per_n,
                       bint staged) noexcept nogil:
    """Batch item n of the channels-last forward on one thread: input[n] copied into ``xT``
    (geometry ``gT``), then all its tiles."""
    cdef Py_ssize_t ci
    transpose_planes(&x[n * g.xs[0]], g, xT, 0, g.D)
    for ci in range(per_n):
        forward_chunk(xT, q, out, scratch, gT, t, n * per_n + ci, per_n,
                      &scratch[g.C] if staged else NULL)


def forward(const store_t[:, :, :, :, :] inp, const store_t[:, :, :, :, :] grid,
            store_t[:, :, :, :, :] out, acc_t[:, ::1] scratch, unsigned char[::1] workspace,
            int mode, int padding, bint align, int half_kind, int nthreads, store_t[::1] xcl):
    """out[n, do, ho, wo, c] = sample of inp at grid[n, do, ho, wo] (axes already NDHWC-ordered).

    ``scratch`` has shape (nthreads, C) of the compute type, or (nthreads, C + SCRATCH_EXTRA)
    to stage results for an output whose channel stride is not 1.  ``xcl`` receives the
    channels-last copy of one batch item of ``inp`` when channels_last_pays (and the channel
    stride is not 1); with fewer than D * H * W * C elements the input is read in place.
    """
    cdef Geo g
    cdef Py_ssize_t isz = sizeof(store_t)
    init_geo(&g, inp, grid, scratch, mode, padding, align, half_kind)
    fill_strides(g.gs, out.shape, out.strides, isz, 5)
    if g.N * g.Do * g.Ho * g.Wo == 0 or g.C == 0:
        return
    if scratch.shape[0] < nthreads or scratch.shape[1] < g.C:
        raise ValueError("scratch too small")
    if workspace.shape[0] < nthreads * sizeof(Tile):
        raise ValueError("workspace too small")
    with nogil:
        forward_run(&inp[0, 0, 0, 0, 0], &grid[0, 0, 0, 0, 0], &out[0, 0, 0, 0, 0],
                    &scratch[0, 0], scratch.strides[0] // sizeof(acc_t),
                    scratch.shape[1] >= g.C + STAGE, <Tile*>&workspace[0], &xcl[0],
                    xcl.shape[0], &g, nthreads)


cdef bint grid_scattered(const store_t* q, Geo* g) noexcept nogil:
    """True when most of up to 16 tiles spread evenly over batch item 0's points fail
    tile_coherent (a uniformly random grid fails them all, smooth warps pass); False when the
    grid's points are not at one step."""
    cdef Py_ssize_t qp, P = g.Do * g.Ho * g.Wo, ntl = (P + TILE - 1) // TILE, k, p0, m, hits = 0
    if not flat_points(g.qs, g, &qp):
        return False
    m = min(<Py_ssize_t>16, ntl)
    for k in range(m):
        p0 = ((k * ntl) // m) * TILE
        hits += tile_coherent(&q[p0 * qp], qp, g.qs[4], <int>min(<Py_ssize_t>TILE, P - p0),
                              g.D, g.half_kind)
    return 2 * hits < m


cdef void forward_run(const store_t* x, const store_t* q, store_t* out, acc_t* scratch,
                      Py_ssize_t srow, bint staged, Tile* tiles, store_t* xcl, Py_ssize_t nxcl,
                      Geo* g, int nthreads) noexcept nogil:
    """The body of ``forward`` on raw pointers (``g`` filled, sizes checked, N * P * C > 0):
    ``scratch`` rows of ``srow`` values, one per thread; ``staged`` when a row has room for
    C + STAGE values; ``tiles`` one per thread; ``xcl`` of ``nxcl`` elements."""
    cdef Geo gT
    cdef Py_ssize_t P, per_n, nchunks, ci, n, z, item
    cdef bint few, items_per_thread
    P = g.Do * g.Ho * g.Wo
    per_n = (P + TILE - 1) // TILE
    nchunks = g.N * per_n
    item = g.D * g.H * g.W * g.C      # elements of one batch item of the input
    if store_t is not double:
        enable_simd_gather(g)
        if store_t is not float:
            half_rows(g)
    if store_t is float:
        # the gather forward's call gate (the tile loop keeps the item gate: untimed)
        # (the grid is looked at only where its answer decides)
        if (g.simd_gather
                and few_call_prefetch_rule(sizeof(store_t), g.N, g.C, g.D * g.H * g.W, P, False)
                and (few_call_prefetch_rule(sizeof(store_t), g.N, g.C, g.D * g.H * g.W, P, True)
                     or not grid_scattered(q, g))):
            g.prefetch_fwd = True
    if store_t is double:
        # (a channels-last copy is read right after it is written: no hints there)
        if g.xs[4] == 1 and f64_call_prefetch_rule(g.N, g.C, g.D * g.H * g.W, P):
            g.prefetch_fwd = True
    # several threads, each on whole batch items in its own copy (see below)
    items_per_thread = nthreads > 1 and g.N >= nthreads and nxcl >= nthreads * item
    # (see FEW_FWD_MIN_KIB)
    few = (few_channels_fwd_rule(sizeof(store_t), g.C, item, g.mode,
                                 nthreads == 1 or items_per_thread)
           and nxcl >= item
           and ((g.simd_gather and (g.gs[4] == 1 or g.op == 1)) or grid_scattered(q, g)))
    if ((not g.simd_gather or g.C % 8 == 0 or few) and channels_last_geo(g, &gT, few)
            and nxcl >= item):
        # batch item by batch item: a channels-last copy of the input, then its tiles (the
        # gather forward's point-by-point branch where it applies; for C = 8 too, where the
        # gather forward would otherwise read the channel planes)
        if store_t is not double:
            enable_simd_gather(&gT)
            if store_t is not float:
                half_rows(&gT)
        if items_per_thread:
            # at least as many batch items as threads: whole items per thread, each copied
            # into the thread's own part of xcl, so that no thread reads lines another
            # thread's core has just written (on random grids every tile reads the whole
            # copy, and such lines then cross between the cores one miss at a time: 8x8x32^3
            # random took longer on two threads than on one).  In-process A/B, 2 threads:
            # 8x8x32^3 float32 random 1.63-2.61x faster, smooth 1.06-1.08x (README)
            for n in prange(g.N, schedule='dynamic', chunksize=1, num_threads=nthreads):
                forward_item(x, q, out, &scratch[threadid() * srow], g, &gT, &tiles[threadid()],
                             &xcl[threadid() * item], n, per_n, staged)
            return
        if (store_t is float and nthreads > 1
                and item * <Py_ssize_t>sizeof(store_t)
                >= 1024 * <Py_ssize_t>PREFETCH_FWD_SHARED_MIN_KIB):
            # threads sharing one copy (see PREFETCH_FWD_SHARED_MIN_KIB)
            gT.prefetch_fwd = True
        for n in range(g.N):
            if nthreads == 1:
                forward_item(x, q, out, scratch, g, &gT, tiles, xcl, n, per_n, staged)
            else:
                for z in prange(g.D, schedule='static', num_threads=nthreads):
                    transpose_planes(&x[n * g.xs[0]], g, xcl, z, z + 1)
                for ci in prange(per_n, schedule='static', num_threads=nthreads):
                    forward_chunk(xcl, q, out, &scratch[threadid() * srow], &gT,
                                  &tiles[threadid()], n * per_n + ci, per_n,
                                  &scratch[threadid() * srow + g.C] if staged else NULL)
        return
    if nthreads == 1:
        # no OpenMP region at all: cheaper for small calls, and safe in a forked child
        for ci in range(nchunks):
            forward_chunk(x, q, out, scratch, g, tiles, ci, per_n,
                          &scratch[g.C] if staged else NULL)
    else:
        for ci in prange(nchunks, schedule='static', num_threads=nthreads):
            forward_chunk(x, q, out, &scratch[threadid() * srow], g, &tiles[threadid()], ci,
                          per_n, &scratch[threadid() * srow + g.C] if staged else NULL)


# the NCDHW -> NDHWC axis order of the kernels, as a permutation of a volume's axes
cdef Py_ssize_t TO_NDHWC[5]
TO_NDHWC[:] = [0, 2, 3, 4, 1]


cdef bint fits(cnp.ndarray a, const Py_ssize_t* shape, Py_ssize_t isz) noexcept:
    """``a`` is 5-D of ``shape``, aligned, and its strides are multiples of the item size
    ``isz`` (on the axes longer than 1, the only ones the kernels step along)."""
    cdef cnp.npy_intp* dims = cnp.PyArray_DIMS(a)
    cdef cnp.npy_intp* strides = cnp.PyArray_STRIDES(a)
    cdef int k
    if cnp.PyArray_NDIM(a) != 5 or not cnp.PyArray_FLAGS(a) & cnp.NPY_ARRAY_ALIGNED:
        return False
    for k in range(5):
        if dims[k] != shape[k] or (dims[k] > 1 and strides[k] % isz != 0):
            return False
    return True


cdef void ndhwc_dims(cnp.ndarray a, bint perm, Py_ssize_t* sh, Py_ssize_t* st) noexcept:
    """Shape and byte strides of the 5-D ``a`` with its axes in the kernels' N, D, H, W, C
    order (``perm``: ``a`` is N, C, D, H, W)."""
    cdef cnp.npy_intp* d = cnp.PyArray_DIMS(a)
    cdef cnp.npy_intp* s = cnp.PyArray_STRIDES(a)
    cdef int k, j
    for k in range(5):
        j = TO_NDHWC[k] if perm else k
        sh[k] = d[j]
        st[k] = s[j]


cdef int copy_shape(tuple shape, Py_ssize_t* dst) except -1:
    """dst[0:5] = shape, a 5-D shape."""
    cdef int k
    if len(shape) != 5:
        raise ValueError("a bound problem has 5-D shapes")
    for k in range(5):
        dst[k] = shape[k]
    return 0


cdef int check_buffer(cnp.ndarray arr, Py_ssize_t itemsize, bint contiguous) except -1:
    """A scratch array a runner keeps: aligned, writeable, non-empty, items of ``itemsize``
    bytes and, with ``contiguous``, C-contiguous."""
    if not (arr.flags.writeable and arr.flags.aligned and arr.size > 0
            and arr.dtype.itemsize == itemsize and (arr.flags.c_contiguous or not contiguous)):
        raise ValueError("scratch arrays must be aligned, writeable, non-empty and of the item "
                         "size of their type (all but dx_acc C-contiguous)")
    return 0


@cython.auto_pickle(False)
cdef class _Locked:
    """What the runners below share: the lock that serialises calls on one runner (they share
    its scratch), and the dtype, options and per-thread scratch rows they are bound to."""
    cdef PyThread_type_lock lock
    cdef object scratch, dtype
    cdef int kind               # 0: double, 1: float, 2: unsigned short (16-bit formats)
    cdef int nthreads, mode, padding, half_kind
    cdef bint align, channels_first, bound
    cdef Py_ssize_t isz, srow
    cdef char* scratch_p
    # the channels-last input copy (see channels_last_geo), or a one-element dummy
    cdef object xcl
    cdef Py_ssize_t nxcl
    cdef char* xcl_p

    def __cinit__(self, *args, **kwargs):
        self.lock = PyThread_allocate_lock()
        if self.lock == NULL:
            raise MemoryError()

    def __dealloc__(self):
        if self.lock != NULL:
            PyThread_free_lock(self.lock)

    cdef void acquire(self) noexcept:
        """Take the lock, waiting without the GIL if another thread holds it."""
        if not PyThread_acquire_lock(self.lock, NOWAIT_LOCK):
            with nogil:
                PyThread_acquire_lock(self.lock, WAIT_LOCK)

    cdef int bind_common(self, cnp.dtype dtype, bint channels_last, cnp.ndarray scratch,
                         Py_ssize_t min_cols, int mode, int padding, bint align, int half_kind,
                         int nthreads) except -1:
        """The part of ``bind`` both runners share: once only; the dtype and options; the
        ``scratch`` rows (nthreads, at least ``min_cols``) of the compute type."""
        if self.bound:
            raise ValueError("the runner is already bound")
        if nthreads < 1:
            raise ValueError("a bound problem runs on at least one thread")
        self.isz = dtype.itemsize
        self.kind = {8: 0, 4: 1, 2: 2}[self.isz]
        acc = np.float64 if self.kind == 0 else np.float32
        check_buffer(scratch, np.dtype(acc).itemsize, True)
        if (scratch.ndim != 2 or scratch.dtype != acc or scratch.shape[0] < nthreads
                or scratch.shape[1] < min_cols):
            raise ValueError("scratch too small")
        self.dtype, self.scratch = dtype, scratch
        self.scratch_p = <char*>cnp.PyArray_DATA(scratch)
        self.srow = scratch.shape[1]
        self.channels_first = not channels_last
        self.mode, self.padding, self.align, self.half_kind = mode, padding, align, half_kind
        self.nthreads = nthreads
        return 0

    def set_xcl(self, cnp.ndarray xcl):
        """Replace the channels-last input copy buffer (C-contiguous, of the storage type; the
        item size must be bound first)."""
        if not (xcl.flags.c_contiguous and xcl.flags.writeable and xcl.flags.aligned
                and xcl.size > 0 and xcl.dtype.itemsize == self.isz):
            raise ValueError("xcl must be aligned, writeable, C-contiguous, non-empty and of "
                             "the storage type's item size")
        self.acquire()
        self.xcl, self.xcl_p, self.nxcl = xcl, <char*>cnp.PyArray_DATA(xcl), xcl.size
        PyThread_release_lock(self.lock)


@cython.auto_pickle(False)     # raw pointers into its scratch; plans were never picklable
cdef class ForwardRunner(_Locked):
    """The forward of one validated problem on its own scratch, entered with a few C checks.

    gs3d._api binds it once (``bind``) to the shapes, dtype, options and scratch arrays of a
    validated problem; ``run`` then takes ndarrays in the caller's layout (no transposes or
    uint16 views) without acquiring typed memoryviews.  ``__call__`` is the plan's fast path:
    exact ndarrays of the planned shapes and dtype that need no copy and no overlap test (see
    ``__call__``) run at once; anything else goes to ``self._slow_call(input, grid, out)``,
    which a subclass provides (the full checks; it ends in ``run``).  Calls on one runner are
    serialised by its lock (the scratch is shared); the kernel runs without the GIL.
    """
    cdef object workspace
    cdef bint staged
    cdef Tile* tiles
    # True: a new output must start on a cache line (gs3d._api allocates it: aligned_empty)
    cdef public bint line_out
    # True: a channels-last problem that takes the channels-last input copy when its input's
    # channels are strided, the copy's buffer made by gs3d._api on the first such call
    cdef public bint copy_on_demand
    cdef Py_ssize_t in_shape[5]
    cdef Py_ssize_t grid_shape[5]
    cdef Py_ssize_t out_shape[5]

    def bind(self, cnp.dtype dtype, tuple input_shape, tuple grid_shape, tuple output_shape,
             bint channels_last, cnp.ndarray scratch, cnp.ndarray workspace, cnp.ndarray xcl,
             int mode, int padding, bint align, int half_kind, int nthreads):
        """Fix the problem (shapes in the caller's layout, already validated) and the scratch:
        ``scratch`` (nthreads, C + SCRATCH_EXTRA) of the compute type, ``workspace`` uint8,
        ``xcl`` the channels-last input copy (or a dummy), all C-contiguous.  Once only."""
        cdef Py_ssize_t C
        copy_shape(input_shape, self.in_shape)
        copy_shape(grid_shape, self.grid_shape)
        copy_shape(output_shape, self.out_shape)
        C = self.in_shape[4] if channels_last else self.in_shape[1]
        check_buffer(workspace, 1, True)
        check_buffer(xcl, dtype.itemsize, True)
        if workspace.size < <Py_ssize_t>(nthreads * sizeof(Tile)):
            raise ValueError("workspace too small")
        self.bind_common(dtype, channels_last, scratch, C, mode, padding, align, half_kind,
                         nthreads)
        self.workspace = workspace
        self.set_xcl(xcl)
        self.staged = self.srow >= C + STAGE
        self.tiles = <Tile*>cnp.PyArray_DATA(workspace)
        self.bound = True

    cdef int launch(self, cnp.ndarray x, cnp.ndarray q, cnp.ndarray out) except -1:
        """The kernel on arrays already checked against the bound problem."""
        cdef Geo g
        cdef Py_ssize_t xsh[5]
        cdef Py_ssize_t xst[5]
        cdef Py_ssize_t osh[5]
        cdef Py_ssize_t ost[5]
        cdef const char* xp = <const char*>cnp.PyArray_DATA(x)
        cdef const char* qp = <const char*>cnp.PyArray_DATA(q)
        cdef char* op = <char*>cnp.PyArray_DATA(out)
        ndhwc_dims(x, self.channels_first, xsh, xst)
        ndhwc_dims(out, self.channels_first, osh, ost)
        init_geo_raw(&g, xsh, xst, <Py_ssize_t*>cnp.PyArray_DIMS(q),
                     <Py_ssize_t*>cnp.PyArray_STRIDES(q), self.isz,
                     self.mode, self.padding, self.align, self.half_kind)
        fill_strides(g.gs, osh, ost, self.isz, 5)
        if g.N * g.Do * g.Ho * g.Wo == 0 or g.C == 0:
            return 0
        self.acquire()
        with nogil:
            if self.kind == 0:
                forward_run(<const double*>xp, <const double*>qp, <double*>op,
                            <double*>self.scratch_p, self.srow, self.staged, self.tiles,
                            <double*>self.xcl_p, self.nxcl, &g, self.nthreads)
            elif self.kind == 1:
                forward_run(<const float*>xp, <const float*>qp, <float*>op,
                            <float*>self.scratch_p, self.srow, self.staged, self.tiles,
                            <float*>self.xcl_p, self.nxcl, &g, self.nthreads)
            else:
                forward_run(<const unsigned short*>xp, <const unsigned short*>qp,
                            <unsigned short*>op, <float*>self.scratch_p, self.srow,
                            self.staged, self.tiles, <unsigned short*>self.xcl_p, self.nxcl,
                            &g, self.nthreads)
            PyThread_release_lock(self.lock)
        return 0

    def run(self, x, q, out):
        """The forward of ``x``, ``grid`` ``q`` into ``out`` (ndarrays in the caller's layout).

        The caller has done the full checks; repeated here, as the condition of entering the
        kernel, are those that memory safety rests on: bound, the bound shapes and dtype,
        aligned arrays with item-multiple strides, a writeable ``out``.  Overlap is the
        caller's (``check_output``)."""
        if not (self.bound and cnp.PyArray_Check(x) and cnp.PyArray_Check(q)
                and cnp.PyArray_Check(out)):
            raise ValueError("forward runner: not bound, or not three ndarrays")
        if not (fits(x, self.in_shape, self.isz) and fits(q, self.grid_shape, self.isz)
                and fits(out, self.out_shape, self.isz)):
            raise ValueError("forward runner: arrays must have the bound shapes, be aligned "
                             "and have item-multiple strides")
        if not (cnp.PyArray_EquivTypes(x.dtype, self.dtype)
                and cnp.PyArray_EquivTypes(q.dtype, self.dtype)
                and cnp.PyArray_EquivTypes(out.dtype, self.dtype)):
            raise ValueError("forward runner: arrays must have the bound dtype")
        if not cnp.PyArray_FLAGS(out) & cnp.NPY_ARRAY_WRITEABLE:
            raise ValueError("forward runner: out is read-only")
        self.launch(x, q, out)

    def __call__(self, input, grid, *, out=None):
        """``plan(input, grid, out=None)``: the sampled values (``out`` when given).

        At once, without a Python-level check, when ``input`` and ``grid`` are exact ndarrays
        of the planned shapes and (identical) dtype object, aligned with item-multiple strides,
        and ``out`` is None (and ``line_out`` False) or such an ndarray of the output shape,
        writeable, contiguous and owning its memory, as do ``input`` and ``grid`` (which it is
        not): such arrays need no copy and cannot overlap (the quick test of
        ``_api._check_out``), unless ``copy_on_demand`` holds, the input's channels are strided
        and the copy's buffer is not there yet.  Otherwise ``self._slow_call(input, grid,
        out)``."""
        cdef PyObject* dt = <PyObject*>self.dtype
        cdef cnp.ndarray x, q, o
        if not (self.bound and cnp.PyArray_CheckExact(input) and cnp.PyArray_CheckExact(grid)):
            return self._slow_call(input, grid, out)
        x, q = <cnp.ndarray>input, <cnp.ndarray>grid
        if not (<PyObject*>cnp.PyArray_DESCR(x) == dt and <PyObject*>cnp.PyArray_DESCR(q) == dt
                and fits(x, self.in_shape, self.isz) and fits(q, self.grid_shape, self.isz)):
            return self._slow_call(input, grid, out)
        if self.copy_on_demand and self.nxcl == 1 and cnp.PyArray_STRIDES(x)[4] != self.isz:
            return self._slow_call(input, grid, out)        # the copy's buffer is not there yet
        if out is None:
            if self.line_out:
                return self._slow_call(input, grid, out)
            Py_INCREF(self.dtype)
            o = PyArray_Empty_steal(5, <cnp.npy_intp*>self.out_shape,
                                    <cnp.PyArray_Descr*>dt, 0)      # fresh memory is aligned
        else:
            if not cnp.PyArray_CheckExact(out) or out is input or out is grid:
                return self._slow_call(input, grid, out)
            o = <cnp.ndarray>out
            if not (<PyObject*>cnp.PyArray_DESCR(o) == dt and fits(o, self.out_shape, self.isz)
                    and cnp.PyArray_FLAGS(o) & cnp.NPY_ARRAY_WRITEABLE
                    and cnp.PyArray_FLAGS(o) & (cnp.NPY_ARRAY_C_CONTIGUOUS
                                                | cnp.NPY_ARRAY_F_CONTIGUOUS)
                    and cnp.PyArray_FLAGS(o) & cnp.PyArray_FLAGS(x) & cnp.PyArray_FLAGS(q)
                    & cnp.NPY_ARRAY_OWNDATA
                    and cnp.PyArray_BASE(o) == NULL and cnp.PyArray_BASE(x) == NULL
                    and cnp.PyArray_BASE(q) == NULL):
                return self._slow_call(input, grid, out)
        self.launch(x, q, o)
        return o


# ---------------------------------------------------------------------------------------------
# backward
# ---------------------------------------------------------------------------------------------

cdef inline void load_channels(const store_t* p, Py_ssize_t off, Py_ssize_t C, int hk,
                               acc_t* out) noexcept nogil:
    """out[c] = p[off + c] in the compute type (float16 eight at a time with F16C)."""
    cdef Py_ssize_t c = 0
    cdef float v8[8]
    cdef int l
    if not (store_t is double or store_t is float):
        if GS3D_HAVE_F16C and hk != HALF_BF16:
            while c + 8 <= C:
                gs3d_f16x8_hw(&p[off + c], v8)
                for l in range(8):
                    out[c + l] = <acc_t>v8[l]
                c += 8
    while c < C:
        out[c] = <acc_t>ld(p, off + c, hk)
        c += 1


cdef inline acc_t lane_sum(const acc_t* s) noexcept nogil:
    """The fixed reduction tree of eight channel partial sums (see dot_channels)."""
    return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]))


cdef inline acc_t dot_channels(const acc_t* go, const store_t* x, Py_ssize_t off, Py_ssize_t xc,
                               Py_ssize_t C, int hk) noexcept nogil:
    """sum_c go[c] * x[off + c * xc] in a fixed order: eight interleaved partial sums (channel
    c of the first C - C % 8 goes to lane c % 8, the rest to lane 0), then ``lane_sum``.  The
    same order for every stride, so results never depend on the layout, and the unit-stride
    loop vectorises (one 8-wide vector of partial sums) without -ffast-math."""
    cdef acc_t s[8]
    cdef Py_ssize_t c = 0
    cdef int l
    cdef float xv[8]
    if xc == 1:
        if store_t is float and acc_t is float:
            return gs3d_dot_f(go, &x[off], C)
        elif store_t is double and acc_t is double:
            return gs3d_dot_d(go, &x[off], C)
        elif not (store_t is double or store_t is float) and acc_t is float:
            if GS3D_HAVE_HALF_SIMD:
                return gs3d_dot_h(go, &x[off], C, hk == HALF_BF16)
    for l in range(8):
        s[l] = 0
    if xc == 1:
        if not (store_t is double or store_t is float):
            if GS3D_HAVE_F16C and hk != HALF_BF16:
                # float16 with F16C: eight values converted at once (exact, like ld)
                while c + 8 <= C:
                    gs3d_f16x8_hw(&x[off + c], xv)
                    for l in range(8):
                        s[l] = s[l] + go[c + l] * <acc_t>xv[l]
                    c += 8
        while c + 8 <= C:
            for l in range(8):
                s[l] = s[l] + go[c + l] * <acc_t>ld(x, off + c + l, hk)
            c += 8
    else:
        while c + 8 <= C:
            for l in range(8):
                s[l] = s[l] + go[c + l] * <acc_t>ld(x, off + (c + l) * xc, hk)
            c += 8
    while c < C:
        s[0] = s[0] + go[c] * <acc_t>ld(x, off + c * xc, hk)
        c += 1
    return lane_sum(s)


cdef inline void axpy_channels(acc_t* A, Py_ssize_t off, Py_ssize_t ac, acc_t w, const acc_t* go,
                               Py_ssize_t C) noexcept nogil:
    """A[off + c * ac] += w * go[c] for every channel."""
    cdef Py_ssize_t c
    if ac == 1:
        if acc_t is float:
            gs3d_axpy_f(&A[off], w, go, C)
        else:
            gs3d_axpy_d(&A[off], w, go, C)
    else:
        for c in range(C):
            A[off + c * ac] += w * go[c]


cdef inline void nearest_zero_grid_grad(store_t* dq, Geo* g, Tile* t, int cnt,
                                        acc_t* type_only) noexcept nogil:
    """Nearest's grid gradient, +0, for the points of the tile this call owns (``t.own``)."""
    cdef Py_ssize_t qc = g.os[4]
    cdef int i
    cdef int hk = g.half_kind
    for i in range(cnt):
        if t.own[i]:
            st(dq, t.oq[i], <acc_t>0, hk)
            st(dq, t.oq[i] + qc, <acc_t>0, hk)
            st(dq, t.oq[i] + 2 * qc, <acc_t>0, hk)


cdef void nearest_scatter(const store_t* grad, acc_t* A, Py_ssize_t* As, Geo* g,
                          const Py_ssize_t* ab, const Py_ssize_t* ob, const unsigned char* use,
                          int cnt, acc_t* go) noexcept nogil:
    """A[ab[i] + c * As[3]] += grad[ob[i] + c * gc] for every channel of the points i < cnt
    (at most TILE) with ``use[i]``, in point order (``go``: C values of scratch)."""
    cdef Py_ssize_t c, C = g.C, gc = g.gs[4], ac = As[3], pn
    cdef int i, m, k
    cdef int lst[TILE]
    cdef int hk = g.half_kind
    cdef const acc_t* gp
    # the points used, listed first: the loops below then have no data-dependent branch
    # (a quarter of the points of a random grid fall outside)
    k = 0
    for i in range(cnt):
        lst[k] = i
        k += use[i] != 0
    pn = (C if ac == 1 else 1) * <Py_ssize_t>sizeof(acc_t)
    for m in range(min(k, <int>AHEAD)):
        prefetch_span(<const char*>&A[ab[lst[m]]], 0, pn, True)
    if C == 1:
        for m in range(k):
            if m + AHEAD < k:
                gs3d_prefetch_w(&A[ab[lst[m + AHEAD]]])
            i = lst[m]
            A[ab[i]] += <acc_t>ld(grad, ob[i], hk)
    elif ac == 1 and gc == 1:
        # channels contiguous in both: one row per point
        for m in range(k):
            if m + AHEAD < k:
                prefetch_span(<const char*>&A[ab[lst[m + AHEAD]]], 0, pn, True)
            i = lst[m]
            if (store_t is float and acc_t is float) or (store_t is double and acc_t is double):
                gp = <const acc_t*>&grad[ob[i]]
            else:
                load_channels(grad, ob[i], C, hk, go)
                gp = go
            axpy_channels(A, ab[i], 1, 1, gp, C)
    else:
        # channels outermost: each channel's grad_output values of the points are one run
        # (NCDHW), and their accumulator rows (channels-last copy) or planes stay in cache
        for m in range(AHEAD, k):
            prefetch_span(<const char*>&A[ab[lst[m]]], 0, pn, True)
        for c in range(C):
            for m in range(k):
                i = lst[m]
                A[ab[i] + c * ac] += <acc_t>ld(grad, ob[i] + c * gc, hk)


cdef void nearest_backward_tile(const store_t* grad, const store_t* q, store_t* dq, acc_t* A,
                                Py_ssize_t* As, acc_t* go, Geo* g, Tile* t, Py_ssize_t n,
                                Py_ssize_t p0, int cnt, Py_ssize_t zlo, Py_ssize_t zhi,
                                bint do_dx, bint do_dg, bint own_all) noexcept nogil:
    """backward_tile for nearest.  The grid gradient is +0; each point in bounds adds its
    grad_output channels to the one input-gradient voxel it read (weight 1, so the sum is that
    of the general loop bitwise), in point order.  The input is not read at all."""
    if do_dx:
        setup_nearest(q, g, As, n, p0, cnt, zlo, zhi, do_dg, own_all, t)
    else:
        # grid gradient only: the coordinates do not matter
        tile_points(q, g, n, p0, cnt, False, t)
        memset(t.own, 1, cnt)
    if do_dg:
        nearest_zero_grid_grad(dq, g, t, cnt, A)
    if do_dx:
        nearest_scatter(grad, A, As, g, t.ab, t.ob, t.vs, cnt, go)


cdef void nearest_index_tile(const store_t* q, store_t* dq, Geo* g, Py_ssize_t* As, Tile* t,
                             Py_ssize_t n, Py_ssize_t p0, int cnt, bint do_dg, Py_ssize_t* bo,
                             Py_ssize_t bs, acc_t* type_only) noexcept nogil:
    """The first phase of the threaded nearest backward, for the points [p0, p0 + cnt): their
    accumulator offset, grad_output offset and depth index (-1 when out of bounds: offsets
    can be negative, for an input_grad of negative strides) into ``bo[0:cnt]``,
    ``bo[bs:bs + cnt]`` and ``bo[2 * bs:2 * bs + cnt]``, and their grid gradient (+0)."""
    cdef int i
    setup_nearest(q, g, As, n, p0, cnt, 0, g.D, do_dg, True, t)
    if do_dg:
        nearest_zero_grid_grad(dq, g, t, cnt, type_only)
    for i in range(cnt):
        bo[i] = t.ab[i]
        bo[bs + i] = t.ob[i]
        bo[2 * bs + i] = <Py_ssize_t>t.fi[2 * TILE + i] if t.vs[i] else -1


cdef void nearest_scatter_slab(const store_t* grad, acc_t* A, Py_ssize_t* As, Geo* g, Tile* t,
                               const Py_ssize_t* bo, Py_ssize_t bs, Py_ssize_t cnt,
                               Py_ssize_t zlo, Py_ssize_t zhi, acc_t* go) noexcept nogil:
    """The second phase: the points of a block (``bo`` from nearest_index_tile) whose voxel
    lies in the depth slab [zlo, zhi), in point order, TILE at a time."""
    cdef Py_ssize_t p0, i
    cdef int k
    p0 = 0
    while p0 < cnt:
        k = <int>min(<Py_ssize_t>TILE, cnt - p0)
        for i in range(k):
            t.vs[i] = zlo <= bo[2 * bs + p0 + i] < zhi          # (zlo >= 0)
        nearest_scatter(grad, A, As, g, &bo[p0], &bo[bs + p0], t.vs, k, go)
        p0 += k


cdef inline bint tile_coherent(const store_t* q, Py_ssize_t qp, Py_ssize_t qc, int cnt,
                              Py_ssize_t D, int hk) noexcept nogil:
    """True when the depth coordinates of the cnt float32 or 16-bit (of kind ``hk``) points
    at q, q + qp, ... (z at 2 qc) span at most ROWS_MAX_PLANES planes of a depth D, or a
    quarter of them (see ROWS_MAX_PLANES).  An infinity, or a NaN first, fails; later NaNs are
    passed over (only the speed depends on the answer).  The span only grows, so the answer
    is known as soon as it is too wide: a uniformly random tile is rejected after a few
    points (which matters for 16-bit grids, converted point by point)."""
    cdef float lo = <float>ld(q, 2 * qc, hk), hi = lo, z
    cdef int i
    # (hi - lo) * D / 2 planes, either align_corners; NaN and infinities fail the test
    cdef double most = 2.0 * max(<Py_ssize_t>ROWS_MAX_PLANES, D // 4)
    for i in range(1, cnt):
        z = <float>ld(q, i * qp + 2 * qc, hk)
        lo = z if z < lo else lo
        hi = z if z > hi else hi
        if <double>(hi - lo) * <double>D > most:
            return False
    return <double>(hi - lo) * <double>D <= most


cdef void backward_tile(const store_t* grad, const store_t* x, const store_t* q, store_t* dq,
                        acc_t* A, Py_ssize_t* As, acc_t* go, acc_t* dots, Geo* g, Tile* t,
                        Py_ssize_t n, Py_ssize_t p0, int cnt, Py_ssize_t zlo, Py_ssize_t zhi,
                        bint do_dx, bint do_dg, bint own_all) noexcept nogil:
    """Backward for the points [p0, p0 + cnt) of batch item ``n``.

    Scatters into the accumulator ``A`` (axes D, H, W, C with strides ``As``, already offset to
    batch item n) the corners whose depth index is in [zlo, zhi), and writes the grid gradient of
    the points this call owns: all of them when ``own_all``, else those whose key plane is in
    [zlo, zhi).  ``go`` holds C values, ``dots`` 64 * TILE, of the compute type.

    Both channel loops below give bitwise the same results: the channel dot products use the
    same eight interleaved partial sums, and each input-gradient element receives the tile's
    contributions in point order.
    """
    cdef Py_ssize_t c, C = g.C, xc = g.xs[4], gc = g.gs[4], ac = As[3], C8 = C - C % 8, i8
    cdef int i, j, slot, i0, i1, per, ahead
    cdef acc_t* gp = go
    cdef unsigned char vs, vd
    cdef acc_t goc
    cdef acc_t d8[8]
    cdef acc_t w8[8]
    cdef int hk = g.half_kind
    cdef gs3d_bwd_args ba
    cdef gs3d_cl_args cl
    cdef bint staged, cl_ok, v8d = False, go_flat = False, go_staged
    cdef Py_ssize_t extra, pstep, nxt
    cdef gs3d_rows_args rw
    if g.mode == MODE_NEAREST:
        nearest_backward_tile(grad, q, dq, A, As, go, g, t, n, p0, cnt, zlo, zhi, do_dx, do_dg,
                              own_all)
        return
    if store_t is not double and acc_t is float:
        if g.simd_gather:
            ba.A = A
            if store_t is float:
                ba.x, ba.go, ba.dq = &x[n * g.xs[0]], &grad[n * g.gs[0] + p0 * g.op], \
                    &dq[n * g.os[0] + p0 * g.dp]
                ba.q = &q[n * g.qs[0] + p0 * g.qp]
                ba.xh = ba.qh = ba.goh = ba.dqh = NULL
                ba.xk, ba.xlast = 0, 0
            else:
                # 16-bit storage: the same kernel, values converted exactly, grid gradient
                # rounded once, input gradient in the float32 accumulator
                ba.x = ba.q = ba.go = ba.dq = NULL
                ba.xh, ba.goh = &x[n * g.xs[0]], &grad[n * g.gs[0] + p0 * g.op]
                ba.dqh, ba.qh = &dq[n * g.os[0] + p0 * g.dp], &q[n * g.qs[0] + p0 * g.qp]
                ba.xk = 2 if hk == HALF_BF16 else 1
                ba.xlast = g.xlast - n * g.xs[0]
            ba.sx, ba.sy, ba.sz, ba.xc = g.xs[3], g.xs[2], g.xs[1], g.xs[4]
            ba.ax, ba.ay, ba.az, ba.ac = As[2], As[1], As[0], As[3]
            ba.W, ba.H, ba.D, ba.C = g.W, g.H, g.D, C
            ba.qp, ba.qc, ba.gp, ba.gc, ba.dp, ba.dc = g.qp, g.qs[4], g.op, gc, g.dp, g.os[4]
            ba.zlo, ba.zhi = zlo, zhi
            ba.align, ba.border = g.align, g.padding
            ba.do_dx, ba.do_dg, ba.own_all = do_dx, do_dg, own_all
            ba.prefetch = g.prefetch_bwd
            # (see gs3d_bwd_args.rmw; two channels lost with it, 1x2x96^3 random 0.89x)
            ba.rmw = (store_t is float and do_dx and As[3] == 1 and C > 2 and C != 4
                      and not tile_coherent(&q[n * g.qs[0] + p0 * g.qp], g.qp, g.qs[4],
                                            <int>cnt, g.D, hk))
            gs3d_backward_gather_avx2(&ba, cnt)
            return
    if (store_t is not double and acc_t is float and g.rows
            and (not do_dx or (g.rows_dx and ac == 1
                               and tile_coherent(&q[n * g.qs[0] + p0 * g.qp], g.qp, g.qs[4],
                                                 cnt, g.D, hk)))):
        # channels contiguous in the input (and the accumulator): gs3d_backward_rows, the
        # channels-last loop's bits without the tile arrays of setup_tile (see ROWS_MAX_PLANES);
        # 16-bit storage converted exactly, the grid gradient rounded once
        rw.A = A
        rw.x = rw.q = rw.go = rw.dq = NULL
        rw.xh = rw.qh = rw.goh = rw.dqh = NULL
        if store_t is float:
            rw.x, rw.q = &x[n * g.xs[0]], &q[n * g.qs[0] + p0 * g.qp]
            rw.go = &grad[n * g.gs[0] + p0 * g.op]
            rw.dq = &dq[n * g.os[0] + p0 * g.dp] if do_dg else NULL
            rw.xk = 0
        else:
            rw.xh, rw.qh = &x[n * g.xs[0]], &q[n * g.qs[0] + p0 * g.qp]
            rw.goh = &grad[n * g.gs[0] + p0 * g.op]
            rw.dqh = &dq[n * g.os[0] + p0 * g.dp] if do_dg else NULL
            rw.xk = 2 if hk == HALF_BF16 else 1
        rw.dp = g.dp if do_dg else 0
        rw.dc = g.os[4] if do_dg else 0
        rw.sx, rw.sy, rw.sz, rw.ax, rw.ay, rw.az = g.xs[3], g.xs[2], g.xs[1], As[2], As[1], As[0]
        rw.W, rw.H, rw.D, rw.C = g.W, g.H, g.D, C
        rw.qp, rw.qc, rw.gp, rw.gc = g.qp, g.qs[4], g.op, gc
        rw.zlo, rw.zhi, rw.nxt = zlo, zhi, min(<Py_ssize_t>TILE, g.Do * g.Ho * g.Wo - p0 - cnt)
        # every corner row ahead past the gate, else the lead row alone (see lead_row)
        rw.align, rw.border = g.align, g.padding
        rw.prefetch = 1 if g.prefetch_bwd else 2
        rw.lead = g.lead_row
        rw.do_dx, rw.do_dg, rw.own_all = do_dx, do_dg, own_all
        gs3d_backward_rows(&rw, cnt, <float*>dots)
        return
    setup_tile(q, g, A, As, n, p0, cnt, zlo, zhi, do_dx, do_dg, own_all, t)
    # ``ahead``: the prefetch distance, or cnt for none (see PREFETCH_BWD_MIN_KIB and _F64)
    ahead = <int>AHEAD if g.prefetch_bwd else cnt
    for i in range(min(cnt, ahead) if g.prefetch_bwd else 0):
        # the points the in-loop prefetch (``ahead`` points ahead) cannot reach
        if t.vs[i] or (t.own[i] and t.vd[i]):
            prefetch_corners(x, A, t, i, t.vd[i] if t.own[i] else 0, t.vs[i])
    if C == 1:
        # one channel: no channel loops at all (same arithmetic as the general paths)
        for i in range(cnt):
            vs = t.vs[i]
            vd = t.vd[i] if t.own[i] else 0
            if i + ahead < cnt and (t.vs[i + ahead] or (t.own[i + ahead] and t.vd[i + ahead])):
                prefetch_corners(x, A, t, i + ahead, t.vd[i + ahead] if t.own[i + ahead] else 0,
                                 t.vs[i + ahead])
            if vs or vd:
                goc = <acc_t>ld(grad, t.ob[i], hk)
            if t.own[i]:
                if vd == 0xFF:
                    # all corners in bounds: no mask tests (0 + keeps the sign of a zero as
                    # the masked loop does)
                    for j in range(8):
                        d8[j] = 0 + goc * <acc_t>ld(x, xo(t, i, j), hk)
                else:
                    for j in range(8):
                        if (vd >> j) & 1:
                            d8[j] = 0
                            d8[j] = d8[j] + goc * <acc_t>ld(x, xo(t, i, j), hk)
                grid_grad_of(t, i, d8, 1, dq, g.os[4], hk)
            if vs == 0xFF:
                # all corners in bounds: no mask tests
                for j in range(8):
                    A[ao(t, i, j)] += <acc_t>t.w[j * TILE + i] * goc
                continue
            for j in range(8):
                if (vs >> j) & 1:
                    A[ao(t, i, j)] += corner_weight(t, i, j, A) * goc
        return
    if xc == 1 and (ac == 1 or not do_dx):
        # the loop below in C with AVX2 (gs3d_backward_cl_avx2), same bits.  grad_output is
        # read in place when its channel stride is 1 (16-bit: converted there, at most
        # GS3D_CL_GOBUF channels), else first staged into ``dots`` as float32, C values per
        # point
        if acc_t is float and store_t is not double:
            staged = gc != 1
            cl_ok = store_t is float or (GS3D_HAVE_HALF_SIMD and C <= GS3D_CL_GOBUF)
            if (cl_ok and GS3D_HAVE_SIMD_GATHER and C % 8 == 0
                    and (not staged or C * TILE <= STAGE)):
                memset(&cl, 0, sizeof(cl))
                cl.A, cl.ob, cl.oq, cl.xb, cl.ab = A, t.ob, t.oq, t.xb, t.ab
                cl.xd, cl.ad = t.xd, t.ad
                cl.f, cl.w, cl.mult, cl.vd, cl.vs, cl.own = t.f, t.w, t.mult, t.vd, t.vs, t.own
                cl.C, cl.qc = C, g.os[4]
                cl.px_lo, cl.px_n, cl.pa_lo, cl.pa_n = t.px_lo, t.px_n, t.pa_lo, t.pa_n
                cl.cnt, cl.tile, cl.ahead, cl.staged = cnt, TILE, ahead, staged
                if staged:
                    if flat_points(g.gs, g, &pstep) and pstep == 1:
                        # the tile's points consecutive in each channel plane (NCDHW): every
                        # point staged by 8 x 8 transpositions (unflagged ones are never read),
                        # the next tile's channel rows prefetched
                        nxt = min(<Py_ssize_t>TILE, g.Do * g.Ho * g.Wo - p0 - cnt)
                        if store_t is float:
                            gs3d_transpose_f(&grad[t.ob[0]], gc, C, cnt, dots, C, nxt)
                        else:
                            gs3d_transpose_hf(&grad[t.ob[0]], gc, C, cnt, dots, C, nxt,
                                              hk == HALF_BF16)
                    else:
                        for c in range(C):
                            for i in range(cnt):
                                if t.vs[i] or (t.own[i] and t.vd[i]):
                                    dots[i * C + c] = <acc_t>ld(grad, t.ob[i] + c * gc, hk)
                if store_t is float:
                    cl.x, cl.go, cl.dq, cl.xkind = x, dots if staged else grad, dq, 0
                    gs3d_backward_cl_avx2(&cl)
                    return
                else:
                    cl.xh, cl.goh, cl.go, cl.dqh = x, grad, dots, dq
                    cl.xkind = 2 if hk == HALF_BF16 else 1
                    gs3d_backward_cl_avx2(&cl)
                    return
        # channels contiguous in the input and the accumulator (NDHWC, or the channels-last
        # copies of NCDHW): per point, short vector loops over the channels of each corner.
        # grad_output may have any channel stride; when it is not 1, the values of a group of
        # points are first gathered channel by channel into ``dots`` (64 * TILE values), so
        # each channel's run of consecutive points is read in one go
        per = <int>min(<Py_ssize_t>TILE, STAGE // C) if gc != 1 and C <= STAGE else 0
        if store_t is double and acc_t is double:
            v8d = GS3D_HAVE_V8D and C % 8 == 0
            # staged points consecutive in each channel plane (NCDHW): gs3d_transpose_d below
            go_flat = (GS3D_HAVE_SIMD_GATHER and per and flat_points(g.gs, g, &pstep)
                       and pstep == 1)
        i0 = 0
        while i0 < cnt:
            i1 = min(cnt, i0 + per) if per else cnt
            go_staged = False
            if store_t is double and acc_t is double:
                if go_flat:
                    # 4 x 4 blocks (unflagged points too, never read)
                    gs3d_transpose_d(&grad[t.ob[i0]], gc, C, i1 - i0, dots, C, 0)
                    go_staged = True
            if per and not go_staged:
                for c in range(C):
                    for i in range(i0, i1):
                        if t.vs[i] or (t.own[i] and t.vd[i]):
                            dots[(i - i0) * C + c] = <acc_t>ld(grad, t.ob[i] + c * gc, hk)
            for i in range(i0, i1):
                vs = t.vs[i]
                vd = t.vd[i] if t.own[i] else 0
                if i + ahead < cnt and (t.vs[i + ahead] or (t.own[i + ahead] and t.vd[i + ahead])):
                    prefetch_corners(x, A, t, i + ahead,
                                     t.vd[i + ahead] if t.own[i + ahead] else 0,
                                     t.vs[i + ahead])
                if per:
                    gp = &dots[(i - i0) * C]
                elif (vs or vd) and gc == 1 and store_t is double and acc_t is double:
                    # float64: grad_output's values read in place
                    gp = <acc_t*>&grad[t.ob[i]]
                elif vs or vd:
                    if gc == 1:
                        load_channels(grad, t.ob[i], C, hk, go)
                    else:
                        # more channels than ``dots`` holds for one point: strided reads
                        for c in range(C):
                            go[c] = <acc_t>ld(grad, t.ob[i] + c * gc, hk)
                    gp = go
                if v8d:
                    # float64, a multiple of 8 channels, SIMD builds: the loops below in C
                    # (gs3d_point_bwd_d), the corners' dots reduced together, same bits
                    if store_t is double and acc_t is double:
                        gs3d_point_bwd_d(x, t.xb[i], t.xd, A, t.ab[i], t.ad, &t.w[i], TILE, gp,
                                         vd, vs, C, d8)
                    if t.own[i]:
                        grid_grad_of(t, i, d8, 1, dq, g.os[4], hk)
                    continue
                if t.own[i]:
                    for j in range(8):
                        if (vd >> j) & 1:
                            d8[j] = dot_channels(gp, x, xo(t, i, j), 1, C, hk)
                    grid_grad_of(t, i, d8, 1, dq, g.os[4], hk)
                for j in range(8):
                    if (vs >> j) & 1:
                        axpy_channels(A, ao(t, i, j), 1, corner_weight(t, i, j, A), gp, C)
            i0 = i1
        return
    # channels strided (NCDHW): channels outermost, so every inner loop stays in one channel
    # plane; points x corners x 8 partial sums of the dot products live in ``dots``
    for i in range(64 * cnt):
        dots[i] = 0
    for c in range(C):
        slot = <int>(c & 7) if c < C8 else 0
        for i in range(cnt):
            i8 = 8 * i
            vs = t.vs[i]
            vd = t.vd[i] if t.own[i] else 0
            if not (vs or vd):
                continue
            goc = <acc_t>ld(grad, t.ob[i] + c * gc, hk)
            for j in range(8):
                if (vd >> j) & 1:
                    dots[8 * (i8 + j) + slot] = dots[8 * (i8 + j) + slot] + goc * <acc_t>ld(
                        x, xo(t, i, j) + c * xc, hk)
            for j in range(8):
                if (vs >> j) & 1:
                    A[ao(t, i, j) + c * ac] += corner_weight(t, i, j, A) * goc
    for i in range(cnt):
        if t.own[i]:
            for j in range(8):
                d8[j] = lane_sum(&dots[8 * (8 * i + j)])
            grid_grad_of(t, i, d8, 1, dq, g.os[4], hk)


cdef void point_planes(const store_t* q, Geo* g, Py_ssize_t n, Py_ssize_t p0, Py_ssize_t cnt,
                       Py_ssize_t* lo, Py_ssize_t* hi) noexcept nogil:
    """lo, hi: the lowest and highest depth plane any of the points [p0, p0 + cnt) (p0 < P,
    cut at P) needs (see planes_needed)."""
    cdef Py_ssize_t P = g.Do * g.Ho * g.Wo, p, a, b, step
    cdef Py_ssize_t end = min(P, p0 + cnt)
    cdef Cursor cur
    if store_t is not double:
        # float32 or 16-bit points evenly spaced in memory, bilinear: four at a time with
        # AVX2 (the same planes; 16-bit values converted exactly first)
        if (GS3D_HAVE_SIMD_GATHER and (store_t is float or GS3D_HAVE_HALF_SIMD)
                and g.mode == MODE_BILINEAR and flat_points(g.qs, g, &step)):
            if store_t is float:
                gs3d_tile_planes_f(&q[n * g.qs[0] + p0 * step], step, g.qs[4], end - p0, g.D,
                                   g.align, g.padding, lo, hi)
            else:
                gs3d_tile_planes_h(&q[n * g.qs[0] + p0 * step], g.half_kind == HALF_BF16, step,
                                   g.qs[4], end - p0, g.D, g.align, g.padding, lo, hi)
            return
    lo[0], hi[0] = g.D, -1
    cursor_start(&cur, g, p0)
    for p in range(p0, end):
        if p > p0:
            cursor_next(&cur, g)
        planes_needed(q, cursor_offset(&cur, g.qs, n), g.qs[4], g, &a, &b)
        lo[0] = min(lo[0], a)
        hi[0] = max(hi[0], b)


cdef void tile_planes(const store_t* q, Geo* g, Py_ssize_t n, Py_ssize_t h,
                      Py_ssize_t* hull) noexcept nogil:
    """hull[2 h], hull[2 h + 1]: the lowest and highest depth plane any point
    of the tiles [HULL_TILES h, HULL_TILES (h + 1)) needs (a group of tiles, not each tile:
    the ranges of neighbouring tiles mostly overlap, and this keeps the array at a quarter of
    the size)."""
    point_planes(q, g, n, h * HULL_TILES * TILE, HULL_TILES * TILE, &hull[2 * h],
                 &hull[2 * h + 1])


cdef void backward_slab(const store_t* grad, const store_t* x, const store_t* q, store_t* dq,
                        acc_t* A, Py_ssize_t* As, acc_t* work, Geo* g, Tile* t, Py_ssize_t n,
                        Py_ssize_t zlo, Py_ssize_t zhi, bint do_dg,
                        const Py_ssize_t* hull) noexcept nogil:
    """All points of batch item n, in order, for the depth slab [zlo, zhi); with ``hull`` (the
    depth range of each group of HULL_TILES tiles, tile_planes), tiles whose group needs
    nothing from this slab are skipped whole."""
    cdef Py_ssize_t p0, ti = 0, h, P = g.Do * g.Ho * g.Wo
    if zlo >= zhi:
        return
    p0 = 0
    while p0 < P:
        h = 2 * (ti // HULL_TILES)
        if hull == NULL or (hull[h + 1] >= zlo and hull[h] < zhi):
            backward_tile(grad, x, q, dq, A, As, work, work + g.C, g, t, n, p0,
                          <int>min(<Py_ssize_t>TILE, P - p0), zlo, zhi, True, do_dg, False)
        p0 += TILE
        ti += 1


cdef void slab_task(const store_t* grad, const store_t* x, const store_t* q, store_t* dq,
                    acc_t* A, Py_ssize_t* As, acc_t* work, Geo* g, Tile* t, Py_ssize_t n,
                    Py_ssize_t zlo, Py_ssize_t zhi, bint do_dg, store_t* dx, bint store,
                    const Py_ssize_t* hull) noexcept nogil:
    """One thread's share of batch item n: zero its accumulator planes, scatter into them (and
    write the grid gradient of the points it owns), then, with ``store``, write them into
    ``dx`` (when the accumulator is not dx itself)."""
    zero_planes(A, As, g, zlo, zhi)
    backward_slab(grad, x, q, dq, A, As, work, g, t, n, zlo, zhi, do_dg, hull)
    if store:
        store_planes(A, As, dx, g, n, zlo, zhi)


cdef void cl_item_task(const store_t* grad, const store_t* x, const store_t* q, store_t* dq,
                       store_t* dx, acc_t* A, Py_ssize_t* As, acc_t* work, Geo* g, Geo* gT,
                       Tile* t, Py_ssize_t n, bint do_dg, bint in_dx) noexcept nogil:
    """Batch item n of the channels-last path on one thread: the input copy in dx[n] (with
    ``in_dx``; nearest reads no input), every depth plane scattered into the channels-last
    accumulator ``A`` (strides ``As``), then written into dx[n] once the copy is read."""
    cdef const store_t* xin = x
    if in_dx:
        transpose_planes(&x[n * g.xs[0]], g, &dx[n * g.ds[0]], 0, g.D)
        xin = &dx[n * g.ds[0]]
    slab_task(grad, xin, q, dq, A, As, work, gT, t, n, 0, g.D, do_dg, dx, not in_dx, NULL)
    if in_dx:
        store_planes(A, As, dx, gT, n, 0, g.D)


cdef void grid_grad_chunk(const store_t* grad, const store_t* x, const store_t* q, store_t* dq,
                          acc_t* work, Geo* g, Tile* t, Py_ssize_t n, Py_ssize_t ci) noexcept nogil:
    """Grid gradient only (no scatter): tile ``ci`` of batch item n."""
    cdef Py_ssize_t As[4]
    cdef Py_ssize_t P = g.Do * g.Ho * g.Wo
    As[0] = As[1] = As[2] = As[3] = 0
    backward_tile(grad, x, q, dq, <acc_t*>NULL, As, work, work + g.C, g, t, n, ci * TILE,
                  <int>min(<Py_ssize_t>TILE, P - ci * TILE), 0, g.D, False, True, True)


cdef void grid_grad_item(const store_t* grad, const store_t* x, const store_t* q, store_t* dq,
                         acc_t* work, Geo* g, Geo* gT, Tile* t, store_t* xT,
                         Py_ssize_t n) noexcept nogil:
    """The grid gradient alone of batch item n on one thread, through its channels-last copy
    in ``xT`` (geometry ``gT``)."""
    cdef Py_ssize_t ci
    transpose_planes(&x[n * g.xs[0]], g, xT, 0, g.D)
    for ci in range((g.Do * g.Ho * g.Wo + TILE - 1) // TILE):
        grid_grad_chunk(grad, xT, q, dq, work, gT, t, n, ci)


cdef inline void add_run(acc_t* A, const acc_t* B, Py_ssize_t n) noexcept nogil:
    """A[0:n] += B[0:n] element by element (vectorized by the compiler: the same sums), or
    A[0:n] = 0 when B is NULL."""
    cdef Py_ssize_t k
    if B == NULL:
        memset(A, 0, n * sizeof(acc_t))
    else:
        for k in range(n):
            A[k] = A[k] + B[k]


cdef void zero_planes(acc_t* A, Py_ssize_t* As, Geo* g, Py_ssize_t zlo, Py_ssize_t zhi) noexcept nogil:
    """Zero the accumulator planes [zlo, zhi)."""
    add_planes(A, NULL, As, g, zlo, zhi)


cdef void add_planes(acc_t* A, const acc_t* B, Py_ssize_t* As, Geo* g, Py_ssize_t zlo,
                     Py_ssize_t zhi) noexcept nogil:
    """A += B on the planes [zlo, zhi) of two accumulators of the same strides ``As`` (A = 0
    when B is NULL), walking memory in order for either layout: dense planes as runs of
    memory (add_run)."""
    cdef Py_ssize_t z, y, xx, c, o, k, n
    if zlo >= zhi:
        return
    if As[3] == 1 and As[2] == g.C and As[1] == g.W * g.C and As[0] == g.H * g.W * g.C:
        add_run(&A[zlo * As[0]], NULL if B == NULL else &B[zlo * As[0]], (zhi - zlo) * As[0])
        return
    if As[2] == 1 and As[1] == g.W and As[0] == g.H * g.W:
        n = (zhi - zlo) * As[0]
        for c in range(g.C):
            o = c * As[3] + zlo * As[0]
            add_run(&A[o], NULL if B == NULL else &B[o], n)
        return
    if As[3] > As[2]:              # channels outermost in memory (NCDHW)
        for c in range(g.C):
            for z in range(zlo, zhi):
                for y in range(g.H):
                    o = c * As[3] + z * As[0] + y * As[1]
                    for xx in range(g.W):
                        k = o + xx * As[2]
                        A[k] = 0 if B == NULL else A[k] + B[k]
    else:
        for z in range(zlo, zhi):
            for y in range(g.H):
                for xx in range(g.W):
                    o = z * As[0] + y * As[1] + xx * As[2]
                    for c in range(g.C):
                        k = o + c * As[3]
                        A[k] = 0 if B == NULL else A[k] + B[k]


# The split of a batch item's points in two halves, each scattered in order into its own
# accumulator, then summed: used when two depth slabs would make each thread set up and walk
# most tiles (random grids: every tile reaches every plane), measured as the busier of two
# slabs touching more than SPLIT_SHARE / 8 of the tiles.  The test is made for two slabs
# whatever the thread count (one thread runs the halves in turn), so the results are the same
# bits at every thread count.  Measured figures: README, Determinism and threads.
# SPLIT_ONE_CHANNEL: with one channel the points of a batch item are split whatever the
# grid.  On smooth grids the depth slabs share the scatter out too, but each thread also maps
# the tiles that straddle its slab's edge and first finds the depth range of every group of
# tiles (tile_planes); with one channel the mapping is most of the work, so the split (each
# thread maps exactly half the points, then one pass adds the two accumulators) wins at two
# threads and loses a little at one.  Measured in a scratch build through one plan, the two alternating, 2 threads, smooth
# grids: 1x1x64^3 NCDHW 4.14 -> 3.85 ms, 1x1x96^3 NDHWC 11.0 -> 9.3 ms, 1x1x128^3 NCDHW
# 32.2-36.6 -> 27.3-31.0 ms, NDHWC 35.4 -> 31.3 ms; with more channels the gain fades or turns
# (1x4x64^3 1.03x, 1x8x64^3 1.01x, 1x16x64^3 0.93x, 1x32x32^3 0.84x: the add pass grows with
# C), so those still split only when slabs would repeat most tiles.
cdef enum:
    SPLIT_SHARE = 6
    SPLIT_SAMPLE = 128      # tiles looked at, at most (evenly spaced)


cdef bint split_pays(const store_t* q, Geo* g, Py_ssize_t n, Py_ssize_t ntiles,
                     const Py_ssize_t* bounds) noexcept nogil:
    """True when the busier of two depth slabs [bounds[0], bounds[1]), [bounds[1], bounds[2])
    needs more than SPLIT_SHARE / 8 of a sample of the tiles (each tile's own depth range)."""
    cdef Py_ssize_t i, ti, k, lo, hi, seen = min(ntiles, <Py_ssize_t>SPLIT_SAMPLE)
    cdef Py_ssize_t cnt[2]
    cnt[0] = cnt[1] = 0
    for i in range(seen):
        ti = (i * ntiles) // seen
        point_planes(q, g, n, ti * TILE, TILE, &lo, &hi)
        for k in range(2):
            if hi >= bounds[k] and lo < bounds[k + 1]:
                cnt[k] += 1
    return 8 * max(cnt[0], cnt[1]) > SPLIT_SHARE * seen


cdef void split_task(const store_t* grad, const store_t* x, const store_t* q, store_t* dq,
                     acc_t* A, Py_ssize_t* As, acc_t* work, Geo* g, Tile* t, Py_ssize_t n,
                     Py_ssize_t t0, Py_ssize_t t1, bint do_dg) noexcept nogil:
    """Tiles [t0, t1) of batch item n into accumulator ``A`` (zeroed first, every plane), with
    the grid gradient of each of their points."""
    cdef Py_ssize_t ti, P = g.Do * g.Ho * g.Wo
    zero_planes(A, As, g, 0, g.D)
    for ti in range(t0, t1):
        backward_tile(grad, x, q, dq, A, As, work, work + g.C, g, t, n, ti * TILE,
                      <int>min(<Py_ssize_t>TILE, P - ti * TILE), 0, g.D, True, do_dg, True)


cdef void output_task(const store_t* grad, const store_t* x, const store_t* q, store_t* dq,
                      acc_t* A, Py_ssize_t* As, acc_t* work, Geo* g, Tile* t, Py_ssize_t n,
                      int k, int nt, Py_ssize_t ntiles, store_t* dx, bint store) noexcept nogil:
    """Task ``k`` of ``nt`` of the output split of batch item n: task 0 the input gradient
    (every plane, all points in order, no grid gradient: slab_task), tasks 1 to nt - 1 the
    grid gradient of their share of the tiles (grid_grad_chunk).  Each output is written by
    the code, and in the order, of the one-thread call, so the bits are the same."""
    cdef Py_ssize_t ci
    if k == 0:
        slab_task(grad, x, q, dq, A, As, work, g, t, n, 0, g.D, False, dx, store, NULL)
    else:
        for ci in range(((k - 1) * ntiles) // (nt - 1), (k * ntiles) // (nt - 1)):
            grid_grad_chunk(grad, x, q, dq, work, g, t, n, ci)


cdef inline bint store_run(const acc_t* A, store_t* dx, Py_ssize_t cnt, int hk) noexcept nogil:
    """Round ``cnt`` contiguous float32 accumulator values into contiguous 16-bit input_grad,
    eight at a time (gs3d_store_h: the bits of ``st``, which rounds the rest) where the build
    has it; False (nothing done) otherwise."""
    cdef Py_ssize_t i, n8 = cnt - cnt % 8
    if not (store_t is double or store_t is float) and acc_t is float:
        if GS3D_HAVE_HALF_SIMD:
            gs3d_store_h(A, dx, n8, hk == HALF_BF16)
            for i in range(n8, cnt):
                st(dx, i, A[i], hk)
            return True
    return False


cdef void store_planes(const acc_t* A, Py_ssize_t* As, store_t* dx, Geo* g, Py_ssize_t n,
                       Py_ssize_t zlo, Py_ssize_t zhi) noexcept nogil:
    """Write the accumulator planes [zlo, zhi) into input_grad (batch item n), rounded once for
    16-bit storage, walking the memory of input_grad in order."""
    cdef Py_ssize_t z, y, xx, x0, x1, c, o, d
    cdef Py_ssize_t* ds = g.ds
    cdef int hk = g.half_kind
    if ds[4] > ds[3]:              # channels outermost in memory (NCDHW)
        if As[3] == 1:
            # channels-last accumulator: a transposition, blocked over W like transpose_planes
            for z in range(zlo, zhi):
                for y in range(g.H):
                    o = z * As[0] + y * As[1]
                    d = n * ds[0] + z * ds[1] + y * ds[2]
                    if acc_t is float and GS3D_HAVE_SIMD_GATHER and ds[3] == 1:
                        # 8 x 8 blocks in registers (as transpose_planes), 16-bit storage
                        # rounded eight values at a time
                        if store_t is float:
                            gs3d_transpose_f(&A[o], As[2], g.W, g.C, &dx[d], ds[4], 0)
                            continue
                        elif store_t is not double:
                            gs3d_transpose_fh(&A[o], As[2], g.W, g.C, &dx[d], ds[4],
                                              hk == HALF_BF16)
                            continue
                    if store_t is double and acc_t is double:
                        if GS3D_HAVE_SIMD_GATHER and ds[3] == 1:
                            # 4 x 4 blocks in registers
                            gs3d_transpose_d(&A[o], As[2], g.W, g.C, &dx[d], ds[4], 0)
                            continue
                    x0 = 0
                    while x0 < g.W:
                        x1 = min(x0 + <Py_ssize_t>XBLOCK, g.W)
                        for c in range(g.C):
                            for xx in range(x0, x1):
                                st(dx, d + c * ds[4] + xx * ds[3], A[o + xx * As[2] + c], hk)
                        x0 = x1
            return
        for c in range(g.C):
            for z in range(zlo, zhi):
                for y in range(g.H):
                    o = c * As[3] + z * As[0] + y * As[1]
                    d = n * ds[0] + c * ds[4] + z * ds[1] + y * ds[2]
                    if ds[3] == 1 and As[2] == 1 and store_run(&A[o], &dx[d], g.W, hk):
                        continue
                    for xx in range(g.W):
                        st(dx, d + xx * ds[3], A[o + xx * As[2]], hk)
    else:
        for z in range(zlo, zhi):
            for y in range(g.H):
                if (ds[4] == 1 and As[3] == 1 and ds[3] == g.C and As[2] == g.C
                        and store_run(&A[z * As[0] + y * As[1]],
                                      &dx[n * ds[0] + z * ds[1] + y * ds[2]], g.W * g.C, hk)):
                    continue
                for xx in range(g.W):
                    o = z * As[0] + y * As[1] + xx * As[2]
                    d = n * ds[0] + z * ds[1] + y * ds[2] + xx * ds[3]
                    for c in range(g.C):
                        st(dx, d + c * ds[4], A[o + c * As[3]], hk)


cdef inline void carry_index(Py_ssize_t* i, Py_ssize_t* up, Py_ssize_t size) noexcept nogil:
    """Bring i[0] (>= size) back into [0, size), carrying into up[0]: a subtraction, or a
    division where i[0] spans two sizes or more."""
    if i[0] < 2 * size:
        i[0] -= size
        up[0] += 1
    else:
        up[0] += i[0] // size
        i[0] = i[0] % size


cdef void choose_slabs(const store_t* q, Geo* g, Py_ssize_t n, int nt, Py_ssize_t* bounds,
                       double* cost) noexcept nogil:
    """Cut [0, D) into ``nt`` slabs of similar work, estimated from a sample of grid points.

    Any cut gives the same (bitwise) result; this only balances the threads.
    """
    cdef Py_ssize_t P = g.Do * g.Ho * g.Wo, S, i, od, oh, ow, z, t, q0, r0, rr, step
    cdef double u, m, total, acc, plane_cost
    if nt <= 1:
        for t in range(nt + 1):
            bounds[t] = (g.D * t) // nt
        return
    S = P if P < 4096 else 4096
    plane_cost = <double>(g.H * g.W) / 8.0 * <double>S / <double>P   # zeroing, in corner units
    for z in range(g.D):
        cost[z] = plane_cost
    # sample i is point (i * P) // S: stepped forward by q0 or q0 + 1 points (carry of the
    # remainders r0), its (od, oh, ow) carried along instead of divided out for each sample
    q0 = P // S
    r0 = P - q0 * S
    rr = 0
    od = oh = ow = 0
    for i in range(S):
        if i > 0:
            step = q0
            rr += r0
            if rr >= S:
                rr -= S
                step += 1
            ow += step
            if ow >= g.Wo:
                carry_index(&ow, &oh, g.Wo)
                if oh >= g.Ho:
                    carry_index(&oh, &od, g.Ho)
        if axis_index(ld(q, n * g.qs[0] + od * g.qs[1] + oh * g.qs[2] + ow * g.qs[3] + 2 * g.qs[4],
                         g.half_kind), g.D, g, &u, &m, &z):
            if 0 <= z < g.D:
                cost[z] += 4.0
            if 0 <= z + 1 < g.D:
                cost[z + 1] += 4.0
    total = 0
    for z in range(g.D):
        total += cost[z]
    bounds[0] = 0
    t = 1
    acc = 0
    for z in range(g.D):
        acc += cost[z]
        while t < nt and acc >= total * t / nt:
            bounds[t] = z + 1
            t += 1
    while t <= nt:
        bounds[t] = g.D
        t += 1


cdef void probe_geo(Geo* g, const Py_ssize_t* qshape, const Py_ssize_t* qstrides, Py_ssize_t D,
                    Py_ssize_t H, Py_ssize_t W, Py_ssize_t isz, int mode, int padding, bint align,
                    int half_kind) noexcept:
    """``g`` for the tests' probes of a grid alone (shape and byte strides ``qshape``,
    ``qstrides``, items of ``isz`` bytes) over one batch item of D x H x W with one channel."""
    cdef Py_ssize_t xshape[5]
    cdef Py_ssize_t xstrides[5]
    cdef Py_ssize_t qsh[5]
    cdef Py_ssize_t qst[5]
    cdef int k
    xshape[0], xshape[1], xshape[2], xshape[3], xshape[4] = 1, D, H, W, 1
    for k in range(5):
        qsh[k], qst[k], xstrides[k] = qshape[k], qstrides[k], 0
    init_geo_raw(g, xshape, xstrides, qsh, qst, isz, mode, padding, align, half_kind)


def slab_bounds(const store_t[:, :, :, :, :] grid, Py_ssize_t D, Py_ssize_t H, Py_ssize_t W,
                int nt, int mode=MODE_BILINEAR, int padding=0, bint align=False):
    """The depth slab bounds (``nt + 1`` of them) that the threaded backward picks from batch
    item 0 of a float32 or float64 ``grid`` over an input of D x H x W, and the per-plane
    cost estimate they were cut from (choose_slabs; for tests: the bounds decide which thread
    scatters which planes and, for two slabs, whether the points are split)."""
    cdef Geo g
    if store_t is not float and store_t is not double:
        raise TypeError("slab_bounds takes a float32 or float64 grid")
    if (nt < 1 or D < 1 or H < 1 or W < 1 or grid.shape[4] != 3
            or grid.shape[0] * grid.shape[1] * grid.shape[2] * grid.shape[3] == 0):
        raise ValueError("slab_bounds needs nt, D, H, W >= 1 and a grid of shape (N, Do, Ho, "
                         "Wo, 3) with points")
    probe_geo(&g, &grid.shape[0], &grid.strides[0], D, H, W, sizeof(store_t), mode, padding,
              align, 0)
    bounds = np.empty(nt + 1, dtype=np.intp)
    cost = np.empty(D, dtype=np.float64)
    cdef Py_ssize_t[::1] b = bounds
    cdef double[::1] cv = cost
    choose_slabs(&grid[0, 0, 0, 0, 0], &g, 0, nt, &b[0], &cv[0])
    return bounds, cost


def backward_lead_row(const store_t[:, :, :, :, :] grid, int half_kind=0):
    """The corner row the backward prefetches alone below PREFETCH_BWD_MIN_KIB (lead_row,
    for tests) for ``grid`` (N, Do, Ho, Wo, 3): float64, float32, or uint16 holding 16-bit
    bits of ``half_kind``."""
    cdef Geo g
    if grid.shape[0] < 1 or grid.shape[4] != 3:
        raise ValueError("backward_lead_row needs a grid of shape (N >= 1, Do, Ho, Wo, 3)")
    probe_geo(&g, &grid.shape[0], &grid.strides[0], 1, 1, 1, sizeof(store_t), MODE_BILINEAR, 0,
              False, half_kind)
    if g.Do * g.Ho * g.Wo == 0:
        return lead_row(<const store_t*>NULL, &g)
    return lead_row(&grid[0, 0, 0, 0, 0], &g)


cdef void nearest_slabs(const store_t* grad, const store_t* q, store_t* dq, acc_t* A,
                        Py_ssize_t* As, acc_t* scratch, Py_ssize_t srow, Geo* g, Tile* tiles,
                        Py_ssize_t n, const Py_ssize_t* bounds, int nt, bint do_dg, store_t* dx,
                        bint store, Py_ssize_t* bo) noexcept nogil:
    """The threaded nearest backward of batch item n on ``nt`` threads, slab t being depth
    planes [bounds[t], bounds[t + 1]) (used whenever batch items are not shared out whole):
    zero the slabs, then, NBLOCK points at a time, map the
    points in parallel (nearest_index_tile into ``bo``) and scatter them slab by slab
    (nearest_scatter_slab), then with ``store`` write the slabs into ``dx``.  Every voxel gets
    its contributions in point order, as on one thread.  ``bo`` holds 3 * bs values, bs =
    min(P, NBLOCK) (region_bytes)."""
    cdef Py_ssize_t P = g.Do * g.Ho * g.Wo, b0, bn, ci, t
    cdef Py_ssize_t bs = min(P, <Py_ssize_t>NBLOCK)
    for t in prange(nt, schedule='static', chunksize=1, num_threads=nt):
        zero_planes(A, As, g, bounds[t], bounds[t + 1])
    b0 = 0
    while b0 < P:
        bn = min(bs, P - b0)
        for ci in prange((bn + TILE - 1) // TILE, schedule='static', num_threads=nt):
            nearest_index_tile(q, dq, g, As, &tiles[threadid()], n, b0 + ci * TILE,
                               <int>min(<Py_ssize_t>TILE, bn - ci * TILE), do_dg, &bo[ci * TILE],
                               bs, scratch)
        for t in prange(nt, schedule='static', chunksize=1, num_threads=nt):
            nearest_scatter_slab(grad, A, As, g, &tiles[threadid()], bo, bs, bn, bounds[t],
                                 bounds[t + 1], &scratch[threadid() * srow])
        b0 += bn
    if store:
        for t in prange(nt, schedule='static', chunksize=1, num_threads=nt):
            store_planes(A, As, dx, g, n, bounds[t], bounds[t + 1])


def backward(const store_t[:, :, :, :, :] grad, const store_t[:, :, :, :, :] inp,
             const store_t[:, :, :, :, :] grid, store_t[:, :, :, :, :] dx,
             store_t[:, :, :, :, :] dgrid, acc_t[:, :, :, :] dx_acc, acc_t[:, ::1] scratch,
             unsigned char[::1] workspace, int mode, int padding, bint align, int half_kind,
             bint want_dx, bint want_dg, int nthreads, store_t[::1] xcl):
    """Gradients of the sampling with respect to ``inp`` (into ``dx``) and ``grid`` (``dgrid``).

    Axes are NDHWC-ordered views whatever the caller's layout.  ``dx_acc`` (D, H, W, C) is the
    accumulator of one batch item: float32 for 16-bit dx, and, for an input whose channel
    stride is not 1 when channels_last_pays, a contiguous channels-last one of the compute type,
    which also takes the sums when the input's channel stride is 1 and dx's is not (otherwise
    float32/float64 accumulate in dx itself).  ``xcl`` (at least D * H * W * C
    elements, or a dummy) takes the channels-last copy of the input of that path when it cannot
    live in dx[n] (dx[n] not one contiguous block, or dx not wanted); without the buffers the
    kernel reads the input in place (nearest never reads it).  ``scratch`` is (nthreads,
    C + SCRATCH_EXTRA); ``workspace`` has ``workspace_bytes(nthreads, D, Do * Ho * Wo, mode)``
    bytes.  The kernels allocate nothing.
    """
    cdef Geo g
    cdef Py_ssize_t isz = sizeof(store_t), P
    cdef Py_ssize_t dshape[6]
    cdef bint half_acc = not (store_t is double or store_t is float)
    init_geo(&g, inp, grid, scratch, mode, padding, align, half_kind)
    fill_strides(g.gs, grad.shape, grad.strides, isz, 5)
    fill_strides(g.os, dgrid.shape, dgrid.strides, isz, 5)
    fill_strides(g.ds, dx.shape, dx.strides, isz, 5)
    fill_strides(g.as_, dx_acc.shape, dx_acc.strides, sizeof(acc_t), 4)
    P = g.Do * g.Ho * g.Wo
    if g.N == 0 or not (want_dx or want_dg):
        return
    if scratch.shape[0] < nthreads or scratch.shape[1] < g.C + SCRATCH_EXTRA:
        raise ValueError("scratch too small")
    if want_dx and half_acc and (dx_acc.shape[0] < g.D or dx_acc.shape[1] < g.H
                                 or dx_acc.shape[2] < g.W or dx_acc.shape[3] < g.C):
        raise ValueError("dx accumulator too small")
    if workspace.shape[0] < workspace_bytes(nthreads, g.D, P, mode):
        raise ValueError("workspace too small")
    dshape[4], dshape[5] = 1, 0          # one accumulator (see backward_run)
    dshape[0], dshape[1], dshape[2], dshape[3] = (dx_acc.shape[0], dx_acc.shape[1],
                                                  dx_acc.shape[2], dx_acc.shape[3])
    with nogil:
        backward_run(&grad[0, 0, 0, 0, 0], &inp[0, 0, 0, 0, 0], &grid[0, 0, 0, 0, 0],
                     &dx[0, 0, 0, 0, 0], &dgrid[0, 0, 0, 0, 0], &dx_acc[0, 0, 0, 0], dshape,
                     &scratch[0, 0], scratch.strides[0] // sizeof(acc_t), &workspace[0],
                     &xcl[0], xcl.shape[0], &g, want_dx, want_dg, nthreads, False)


cdef int lead_row(const store_t* q, Geo* g) noexcept nogil:
    """The corner row that no earlier output row (line of points along W) has touched when a
    point of an output row reaches it (depth + (r >> 1), height + (r & 1), as
    gs3d_backward_rows numbers them): on a smooth warp, the row of both upper corners (3) when
    the grid's depth and height coordinates grow with the output's, the lower one on each axis
    where they fall.  Judged on batch item 0, each axis alone: height from the y coordinates
    at the two ends of the output's line (Do/2, *, Wo/2), depth from the z coordinates at the
    ends of (*, Ho/2, Wo/2); a tie (one output plane, one line along H) or NaN there keeps
    that axis's upper row; 3 when there are no points.  A hint for prefetching only (see the
    notes above PREFETCH_BWD_MIN_KIB): never a result."""
    cdef Py_ssize_t a
    cdef int r = 3, hk = g.half_kind
    if g.Do * g.Ho * g.Wo == 0:
        return r
    # height: the y coordinates of (Do/2, 0, Wo/2) and (Do/2, Ho - 1, Wo/2)
    a = (g.Do // 2) * g.qs[1] + (g.Wo // 2) * g.qs[3] + g.qs[4]
    if ld(q, a + (g.Ho - 1) * g.qs[2], hk) < ld(q, a, hk):
        r -= 1
    # depth: the z coordinates of (0, Ho/2, Wo/2) and (Do - 1, Ho/2, Wo/2)
    a = (g.Ho // 2) * g.qs[2] + (g.Wo // 2) * g.qs[3] + 2 * g.qs[4]
    if ld(q, a + (g.Do - 1) * g.qs[1], hk) < ld(q, a, hk):
        r -= 2
    return r


cdef void backward_run(const store_t* grad, const store_t* x, const store_t* q, store_t* dx,
                       store_t* dgrid, acc_t* dacc, const Py_ssize_t* dacc_shape,
                       acc_t* scratch, Py_ssize_t srow, unsigned char* workspace, store_t* xcl,
                       Py_ssize_t nxcl, Geo* g, bint want_dx, bint want_dg,
                       int nthreads, bint split) noexcept nogil:
    """The body of ``backward`` on raw pointers: ``g`` filled (with the grad_output, grid_grad,
    input_grad and accumulator strides), sizes checked, N > 0 and a gradient wanted;
    ``dacc`` the accumulator of shape ``dacc_shape[0:4]``, repeated ``dacc_shape[4]`` times
    every ``dacc_shape[5]`` elements (16-bit storage with several: one per thread, each
    thread running whole batch items), ``scratch`` rows of ``srow`` values,
    ``xcl`` of ``nxcl`` elements.  ``split``: float32/float64 accumulating in a dense
    input_grad may scatter the two halves of a batch item's tiles into input_grad and ``dacc``
    (one per thread, or in turn on one), then add them (see split_pays)."""
    cdef Geo gT
    cdef Geo* gp
    cdef Py_ssize_t P, n, t, nchunks, ci, z, item
    cdef Py_ssize_t As[4]
    cdef Py_ssize_t Acl[4]
    cdef Py_ssize_t dims[4]
    cdef Py_ssize_t* bounds
    cdef double* cost
    cdef Py_ssize_t* hull
    cdef Py_ssize_t ntiles
    cdef Tile* tiles
    cdef acc_t* A
    cdef const store_t* xin
    cdef store_t* xT
    cdef int nt
    cdef bint half_acc = not (store_t is double or store_t is float)
    cdef bint cl, in_dx, store, points_split, slabs_repeat, few, acc_cl, use_acc
    cdef Py_ssize_t two[3]
    cdef Py_ssize_t* sb
    cdef const Py_ssize_t* ast
    P = g.Do * g.Ho * g.Wo
    item = g.D * g.H * g.W * g.C      # elements of one batch item of the input
    # the channels-last path, when it pays and its buffers are there
    dims[0], dims[1], dims[2], dims[3] = g.D, g.H, g.W, g.C
    # the strides of a contiguous (D, H, W, C) batch item (Acl; the channels-last
    # accumulator's), and whether the accumulator is one
    Acl[0], Acl[1], Acl[2], Acl[3] = g.H * g.W * g.C, g.W * g.C, g.C, 1
    acc_cl = True
    for z in range(4):
        acc_cl = acc_cl and dacc_shape[z] == dims[z] and (dims[z] <= 1 or g.as_[z] == Acl[z])
    few = few_channels_rule(sizeof(store_t), g.C, g.mode, g.padding)
    cl = channels_last_geo(g, &gT, few)
    in_dx = False
    if cl and want_dx:
        cl = acc_cl
        # (nearest's backward never reads the input: no copy of it anywhere)
        in_dx = dense_strides(&g.ds[1], dims, 4) and g.mode == MODE_BILINEAR
    if cl and not in_dx and g.mode == MODE_BILINEAR:
        cl = nxcl >= item
    gp = &gT if cl else g
    # float32/float64 whose input is already channels-last in memory but whose input_grad's
    # channels are strided (an NCDHW call on a torch channels_last_3d input, say) scatter, as
    # 16-bit storage does, into the accumulator when it is channels-last, each thread's
    # planes written into input_grad when done (the same bits: each element's sum in point
    # order either way); scattering into the channel planes cost up to 9x.  Not where the
    # points may be split (the accumulator is then the second half's; NDHWC only)
    use_acc = half_acc or (want_dx and not cl and not split and acc_cl and g.xs[4] == 1
                           and g.ds[4] != 1)
    # the strides of the input gradient's accumulator: the channels-last one, the float32
    # accumulator of 16-bit storage, or input_grad itself
    ast = &Acl[0] if cl else (&g.as_[0] if use_acc else &g.ds[1])
    As[0], As[1], As[2], As[3] = ast[0], ast[1], ast[2], ast[3]
    if store_t is not double and g.C <= BWD_GATHER_MAX_C:
        # the AVX2 gather path: on the input (float32 accumulates in dx itself, strides g.ds;
        # 16-bit storage in its float32 accumulator, strides g.as_), or for few channels on the
        # channels-last copy (TRANSPOSE_FEW_MIN_C), accumulating in the channels-last
        # accumulator (the copy's strides, which enable_simd_gather checks)
        enable_simd_gather(gp)
        if store_t is not float:
            half_rows(gp)
        gp.simd_gather = (gp.simd_gather
                          and (cl or not want_dx or int32_offsets(g, As))
                          and (not want_dg or flat_points(gp.os, gp, &gp.dp)))
    elif store_t is not double:
        # gs3d_backward_rows (see backward_tile): judged once per call, its point steps kept
        # in gp.qp, gp.op, gp.dp; the accumulator's offsets (the channels-last one, dx for
        # float32, the float32 accumulator of 16-bit storage)
        gp.rows = (GS3D_HAVE_SIMD_GATHER and g.mode == MODE_BILINEAR and gp.xs[4] == 1
                   and (store_t is float or GS3D_HAVE_HALF_SIMD)
                   and g.C % 8 == 0 and 8 * g.C <= STAGE
                   and flat_points(gp.qs, gp, &gp.qp) and flat_points(gp.gs, gp, &gp.op)
                   and (not want_dg or flat_points(gp.os, gp, &gp.dp))
                   and int32_offsets(gp, &gp.xs[1]))
        if gp.rows and want_dx:
            gp.rows_dx = int32_offsets(g, As)
        if gp.rows and not gp.prefetch_bwd:
            gp.lead_row = lead_row(q, gp)     # (the one row it prefetches under the gate)
    ntiles = (P + TILE - 1) // TILE
    A = NULL
    tiles = <Tile*>&workspace[0]
    bounds = <Py_ssize_t*>&workspace[nthreads * sizeof(Tile)]
    cost = <double*>&workspace[nthreads * sizeof(Tile) + (nthreads + 1) * sizeof(Py_ssize_t)]
    hull = <Py_ssize_t*>&workspace[nthreads * sizeof(Tile) + (nthreads + 1) * sizeof(Py_ssize_t)
                                   + g.D * sizeof(double)]
    if (want_dx and cl and nthreads > 1 and g.N >= nthreads and dacc_shape[4] >= nthreads
            and (in_dx or g.mode == MODE_NEAREST)):
        # the channels-last path with enough batch items for every thread: each item is the
        # serial loop on one thread (its input copy in dx[n], the thread's own channels-last
        # accumulator, all depth planes), so results are those of one thread, and no thread
        # repeats another's tile set-up (which depth slabs do on random grids)
        for n in prange(g.N, schedule='dynamic', chunksize=1, num_threads=nthreads):
            cl_item_task(grad, x, q, dgrid, dx, &dacc[threadid() * dacc_shape[5]], Acl,
                         &scratch[threadid() * srow], g, &gT, &tiles[threadid()], n, want_dg,
                         in_dx)
    elif (not want_dx and cl and g.mode == MODE_BILINEAR and nthreads > 1 and g.N >= nthreads
            and nxcl >= nthreads * item):
        # the grid gradient alone through channels-last copies, with enough batch items for
        # every thread: whole items per thread, each in its own copy (as the forward does,
        # see forward_run: no thread reads lines another thread's core has just written)
        for n in prange(g.N, schedule='dynamic', chunksize=1, num_threads=nthreads):
            grid_grad_item(grad, x, q, dgrid, &scratch[threadid() * srow], g, &gT,
                           &tiles[threadid()], &xcl[threadid() * item], n)
    elif (want_dx and not cl and nthreads > 1 and g.N >= nthreads
            and (not use_acc or dacc_shape[4] >= nthreads)):
        # enough batch items for every thread: each item is the serial loop on one thread
        # (its own dx[n], or with use_acc the thread's own accumulator, all depth planes),
        # so results are those of one thread, and no thread repeats another's tile
        # set-up (which depth slabs do on random grids)
        for n in prange(g.N, schedule='dynamic', chunksize=1, num_threads=nthreads):
            slab_task(grad, x, q,
                      dgrid, &dacc[threadid() * dacc_shape[5]] if use_acc
                      else <acc_t*>&dx[n * g.ds[0]], As,
                      &scratch[threadid() * srow], g, &tiles[threadid()], n, 0, g.D, want_dg,
                      dx, use_acc, NULL)
    else:
        for n in range(g.N):
            xin = x
            if cl and g.mode == MODE_BILINEAR:
                # channels-last copy of input[n]: in dx[n]'s own memory (overwritten at the
                # end anyway) when it is one block, else in xcl
                xT = &dx[n * g.ds[0]] if in_dx else xcl
                if nthreads == 1:
                    transpose_planes(&x[n * g.xs[0]], g, xT, 0, g.D)
                else:
                    for z in prange(g.D, schedule='static', num_threads=nthreads):
                        transpose_planes(&x[n * g.xs[0]], g, xT, z, z + 1)
                xin = xT
            if want_dx:
                # (its strides: As)
                if cl:
                    A = dacc
                    store = not in_dx          # else after every thread is done reading xT
                elif use_acc:
                    A = dacc
                    store = True
                else:
                    A = <acc_t*>&dx[n * g.ds[0]]
                    store = False
                nt = nthreads if nthreads < g.D else <int>g.D
                sb = NULL
                points_split = (split and not cl and not use_acc
                                and dacc_shape[0] * dacc_shape[1] * dacc_shape[2] * dacc_shape[3]
                                >= item
                                and dense_strides(&g.ds[1], dims, 4))
                slabs_repeat = False
                if g.mode == MODE_BILINEAR and ntiles >= 2:
                    if points_split and g.C == 1:
                        # one channel: the points are always split (SPLIT_ONE_CHANNEL)
                        slabs_repeat = True
                    elif points_split or (nthreads > 1 and want_dg):
                        # whether two depth slabs would make both threads set up most tiles:
                        # judged for two slabs at every thread count, so that the choice of
                        # the split of the points, and the results, never depend on it
                        sb = bounds if nt == 2 else two      # the slabs' own bounds at two
                        choose_slabs(q, gp, n, 2, sb, cost)
                        slabs_repeat = split_pays(q, gp, n, ntiles, sb)
                if slabs_repeat:
                    if points_split:
                        # two halves of the points, each scattered in order into its own
                        # accumulator (dx[n], dacc), then dx[n] += dacc: one half per thread,
                        # or the two in turn on one thread
                        if nthreads == 1:
                            for t in range(2):
                                split_task(grad, xin, q, dgrid, A if t == 0 else dacc, As,
                                           scratch, gp, tiles, n, (t * ntiles) // 2,
                                           ((t + 1) * ntiles) // 2, want_dg)
                            add_planes(A, dacc, As, gp, 0, g.D)
                        else:
                            for t in prange(2, schedule='static', chunksize=1, num_threads=2):
                                split_task(grad, xin, q, dgrid, A if t == 0 else dacc, As,
                                           &scratch[threadid() * srow], gp, &tiles[threadid()],
                                           n, (t * ntiles) // 2, ((t + 1) * ntiles) // 2,
                                           want_dg)
                            for z in prange(g.D, schedule='static', num_threads=nthreads):
                                add_planes(A, dacc, As, gp, z, z + 1)
                        continue
                    elif nthreads > 1 and want_dg:
                        # no split of the points here (16-bit storage, the channels-last copy,
                        # an input_grad that is not dense, several batch items, few output
                        # points): split the outputs instead, one thread scattering the input
                        # gradient and the others writing the grid gradient (no extra memory;
                        # the bits of one thread, see output_task)
                        for t in prange(nthreads, schedule='static', chunksize=1,
                                        num_threads=nthreads):
                            output_task(grad, xin, q, dgrid, A, As, &scratch[threadid() * srow],
                                        gp, &tiles[threadid()], n, <int>t, nthreads, ntiles,
                                        dx, store)
                        if cl and in_dx:
                            for z in prange(g.D, schedule='static', num_threads=nthreads):
                                store_planes(A, As, dx, gp, n, z, z + 1)
                        continue
                if sb != bounds:
                    choose_slabs(q, gp, n, nt, bounds, cost)
                if nt == 1:
                    # no OpenMP region at all: cheaper for small calls, safe in a forked child
                    slab_task(grad, xin, q,
                              dgrid, A, As, scratch, gp, tiles, n,
                              bounds[0], bounds[1], want_dg, dx, store, NULL)
                    if cl and in_dx:
                        store_planes(A, As, dx, gp, n, 0, g.D)
                elif g.mode == MODE_NEAREST:
                    nearest_slabs(grad, q, dgrid, A, As, scratch, srow, gp, tiles, n, bounds, nt,
                                  want_dg, dx, store, hull)
                else:
                    for ci in prange(hull_groups(P), schedule='static', num_threads=nt):
                        tile_planes(q, gp, n, ci, hull)
                    for t in prange(nt, schedule='static', chunksize=1, num_threads=nt):
                        slab_task(grad, xin,
                                  q, dgrid, A, As,
                                  &scratch[threadid() * srow], gp, &tiles[threadid()], n,
                                  bounds[t], bounds[t + 1], want_dg,
                                  dx, store, hull)
                    if cl and in_dx:
                        # a separate region: all reads of xT (in dx[n]) are done, and so is
                        # the grid gradient of batch item n
                        for z in prange(g.D, schedule='static', num_threads=nthreads):
                            store_planes(A, As, dx, gp, n, z, z + 1)
            else:
                nchunks = (P + TILE - 1) // TILE
                if nthreads == 1:
                    for ci in range(nchunks):
                        grid_grad_chunk(grad, xin,
                                        q, dgrid,
                                        scratch, gp, tiles, n, ci)
                else:
                    for ci in prange(nchunks, schedule='static', num_threads=nthreads):
                        grid_grad_chunk(grad, xin,
                                        q, dgrid,
                                        &scratch[threadid() * srow], gp, &tiles[threadid()], n, ci)


@cython.auto_pickle(False)     # raw pointers into its scratch; plans were never picklable
cdef class BackwardRunner(_Locked):
    """The backward of one validated problem on its own scratch, entered with a few C checks
    (the counterpart of ForwardRunner): gs3d._api binds it once (``bind``) to the shapes,
    dtype, options, output mask and scratch arrays of a validated problem; ``run`` then takes
    ndarrays in the caller's layout and storage type without acquiring typed memoryviews.
    Calls on one runner are serialised by its lock; the kernel runs without the GIL."""
    cdef object workspace, dacc, dummy_dx, dummy_dg
    cdef bint want_dx, want_dg
    cdef char* dacc_p
    cdef unsigned char* ws
    cdef Py_ssize_t dacc_shape[6]       # (D, H, W, C) of one accumulator, count, step
    cdef Py_ssize_t dacc_strides[4]
    cdef Py_ssize_t go_shape[5]
    cdef Py_ssize_t in_shape[5]
    cdef Py_ssize_t grid_shape[5]

    def bind(self, cnp.dtype dtype, tuple grad_output_shape, tuple input_shape,
             tuple grid_shape, bint channels_last, bint want_dx, bint want_dg,
             cnp.ndarray dx_acc, cnp.ndarray scratch, cnp.ndarray workspace, cnp.ndarray xcl,
             cnp.ndarray dummy_dx, cnp.ndarray dummy_dg, int mode, int padding, bint align,
             int half_kind, int nthreads):
        """Fix the problem (shapes in the caller's layout, already validated), the output mask
        and the scratch: ``dx_acc`` (D, H, W, C) of the compute type (or (1, 1, 1, 1) when no
        accumulator is needed; also (count, D, H, W, C): one dense accumulator per thread,
        the threads then taking whole batch items, for 16-bit storage or the channels-last
        path), ``scratch`` (nthreads, C + SCRATCH_EXTRA), ``workspace``
        uint8, ``xcl`` the channels-last input copy (or a dummy), and one-element 5-D dummies
        of the storage type for the gradients not wanted.  Once only."""
        cdef Py_ssize_t k, a0, C, D, H, W, P, acc_size = 8 if dtype.itemsize == 8 else 4
        copy_shape(grad_output_shape, self.go_shape)
        copy_shape(input_shape, self.in_shape)
        copy_shape(grid_shape, self.grid_shape)
        if channels_last:
            D, H, W, C = self.in_shape[1], self.in_shape[2], self.in_shape[3], self.in_shape[4]
        else:
            C, D, H, W = self.in_shape[1], self.in_shape[2], self.in_shape[3], self.in_shape[4]
        P = self.grid_shape[1] * self.grid_shape[2] * self.grid_shape[3]
        check_buffer(workspace, 1, True)
        check_buffer(xcl, dtype.itemsize, True)
        check_buffer(dx_acc, acc_size, False)
        check_buffer(dummy_dx, dtype.itemsize, True)
        check_buffer(dummy_dg, dtype.itemsize, True)
        if workspace.size < workspace_bytes(nthreads, D, P, mode):
            raise ValueError("workspace too small")
        if (dx_acc.ndim not in (4, 5) or (<object>dummy_dx).shape != (1,) * 5
                or (<object>dummy_dg).shape != (1, 1, 1, 1, 3)):
            raise ValueError("dx_acc is 4-D or 5-D, the dummies (1, 1, 1, 1, 1) and "
                             "(1, 1, 1, 1, 3)")
        # 5-D: (count, D, H, W, C), one dense accumulator after the other (one per thread,
        # for 16-bit storage or the channels-last path, the threads taking whole batch items)
        a0 = dx_acc.ndim - 4
        for k in range(dx_acc.ndim):
            if dx_acc.strides[k] % dx_acc.itemsize:
                raise ValueError("dx_acc strides must be multiples of its item size")
        for k in range(4):
            self.dacc_shape[k] = dx_acc.shape[a0 + k]
        fill_strides(self.dacc_strides, <Py_ssize_t*>cnp.PyArray_DIMS(dx_acc) + a0,
                     <Py_ssize_t*>cnp.PyArray_STRIDES(dx_acc) + a0, dx_acc.itemsize, 4)
        self.dacc_shape[4], self.dacc_shape[5] = 1, 0
        if a0:
            self.dacc_shape[4] = dx_acc.shape[0]
            self.dacc_shape[5] = dx_acc.strides[0] // dx_acc.itemsize
            if not (dense_strides(self.dacc_strides, self.dacc_shape, 4)
                    and self.dacc_shape[5] == (self.dacc_shape[0] * self.dacc_shape[1]
                                               * self.dacc_shape[2] * self.dacc_shape[3])):
                raise ValueError("a 5-D dx_acc holds dense accumulators, one after the other")
        if want_dx and dtype.itemsize == 2 and (self.dacc_shape[0] < D or self.dacc_shape[1] < H
                                                or self.dacc_shape[2] < W
                                                or self.dacc_shape[3] < C):
            raise ValueError("dx accumulator too small")
        self.bind_common(dtype, channels_last, scratch, C + SCRATCH_EXTRA, mode, padding, align,
                         half_kind, nthreads)
        self.workspace, self.dacc = workspace, dx_acc
        self.dummy_dx, self.dummy_dg = dummy_dx, dummy_dg
        self.want_dx, self.want_dg = want_dx, want_dg
        self.ws = <unsigned char*>cnp.PyArray_DATA(workspace)
        self.dacc_p = <char*>cnp.PyArray_DATA(dx_acc)
        self.set_xcl(xcl)
        self.bound = True

    cdef int launch(self, cnp.ndarray go, cnp.ndarray x, cnp.ndarray q, cnp.ndarray dx,
                    cnp.ndarray dg, bint split) except -1:
        """The kernel on arrays already checked against the bound problem."""
        cdef Geo g
        cdef Py_ssize_t sh[5]
        cdef Py_ssize_t st[5]
        cdef Py_ssize_t k
        cdef const char* gop = <const char*>cnp.PyArray_DATA(go)
        cdef const char* xp = <const char*>cnp.PyArray_DATA(x)
        cdef const char* qp = <const char*>cnp.PyArray_DATA(q)
        cdef char* dxp = <char*>cnp.PyArray_DATA(dx)
        cdef char* dgp = <char*>cnp.PyArray_DATA(dg)
        cdef bint perm = self.channels_first
        ndhwc_dims(x, perm, sh, st)
        init_geo_raw(&g, sh, st, <Py_ssize_t*>cnp.PyArray_DIMS(q),
                     <Py_ssize_t*>cnp.PyArray_STRIDES(q), self.isz,
                     self.mode, self.padding, self.align, self.half_kind)
        ndhwc_dims(go, perm, sh, st)
        fill_strides(g.gs, sh, st, self.isz, 5)
        ndhwc_dims(dx, perm, sh, st)
        fill_strides(g.ds, sh, st, self.isz, 5)
        fill_strides(g.os, <Py_ssize_t*>cnp.PyArray_DIMS(dg),
                     <Py_ssize_t*>cnp.PyArray_STRIDES(dg), self.isz, 5)
        for k in range(4):
            g.as_[k] = self.dacc_strides[k]
        if g.N == 0 or not (self.want_dx or self.want_dg):
            return 0
        self.acquire()
        with nogil:
            if self.kind == 0:
                backward_run(<const double*>gop, <const double*>xp, <const double*>qp,
                             <double*>dxp, <double*>dgp, <double*>self.dacc_p, self.dacc_shape,
                             <double*>self.scratch_p, self.srow, self.ws,
                             <double*>self.xcl_p, self.nxcl, &g, self.want_dx, self.want_dg,
                             self.nthreads, split)
            elif self.kind == 1:
                backward_run(<const float*>gop, <const float*>xp, <const float*>qp,
                             <float*>dxp, <float*>dgp, <float*>self.dacc_p, self.dacc_shape,
                             <float*>self.scratch_p, self.srow, self.ws,
                             <float*>self.xcl_p, self.nxcl, &g, self.want_dx, self.want_dg,
                             self.nthreads, split)
            else:
                backward_run(<const unsigned short*>gop, <const unsigned short*>xp,
                             <const unsigned short*>qp, <unsigned short*>dxp,
                             <unsigned short*>dgp, <float*>self.dacc_p, self.dacc_shape,
                             <float*>self.scratch_p, self.srow, self.ws,
                             <unsigned short*>self.xcl_p, self.nxcl, &g, self.want_dx,
                             self.want_dg, self.nthreads, split)
            PyThread_release_lock(self.lock)
        return 0

    def run(self, go, x, q, dx, dg, bint split=False):
        """The gradients for ``grad_output`` ``go``, input ``x`` and grid ``q`` into ``dx``
        and ``dg`` (ndarrays in the caller's layout; ignored, and may be None, for a gradient
        the runner was not bound to compute).  ``split``: a batch item's points may be split
        in two halves (see backward_run; the bound dx_acc is then the second half's
        accumulator, so it must not be shared with another call).

        The caller has done the full checks; repeated here, as the condition of entering the
        kernel, are those that memory safety rests on: bound, the bound shapes and dtype,
        aligned arrays with item-multiple strides, writeable outputs.  Overlap is the
        caller's."""
        if not (self.bound and cnp.PyArray_Check(go) and cnp.PyArray_Check(x)
                and cnp.PyArray_Check(q)):
            raise ValueError("backward runner: not bound, or inputs not ndarrays")
        if (dx is None and self.want_dx) or (dg is None and self.want_dg):
            raise ValueError("backward runner: a wanted gradient has no output array")
        if not self.want_dx:
            dx = self.dummy_dx
        if not self.want_dg:
            dg = self.dummy_dg
        if not (cnp.PyArray_Check(dx) and cnp.PyArray_Check(dg)):
            raise ValueError("backward runner: outputs must be ndarrays")
        if not (fits(go, self.go_shape, self.isz) and fits(x, self.in_shape, self.isz)
                and fits(q, self.grid_shape, self.isz)
                and (dx is self.dummy_dx or fits(dx, self.in_shape, self.isz))
                and (dg is self.dummy_dg or fits(dg, self.grid_shape, self.isz))):
            raise ValueError("backward runner: arrays must have the bound shapes, be aligned "
                             "and have item-multiple strides")
        for a in (go, x, q, dx, dg):
            if not (cnp.PyArray_EquivTypes(a.dtype, self.dtype) or a is self.dummy_dx
                    or a is self.dummy_dg):
                raise ValueError("backward runner: arrays must have the bound dtype")
        if not (cnp.PyArray_FLAGS(dx) & cnp.PyArray_FLAGS(dg) & cnp.NPY_ARRAY_WRITEABLE):
            raise ValueError("backward runner: an output is read-only")
        self.launch(go, x, q, dx, dg, split)

