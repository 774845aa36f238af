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

Parallel scatter without races and without dependence on the thread count: for each batch item
the input depth axis D is cut into one slab per thread; every thread walks *all* output points in
order and scatters only the corners that fall into its own slab.  Each dx element therefore
receives its contributions in point order, whatever the number of threads and however the slabs
are cut: results are bitwise identical to the serial loop.  The slab boundaries are chosen from a
sample of the grid so that threads get similar amounts of work.
"""
cimport cython
from cython.parallel cimport prange, threadid
from libc.math cimport rint
from libc.stdlib cimport malloc, free
from libc.stdint cimport uint16_t

from gs3d._helpers cimport (
    GS3D_OPENMP, omp_get_max_threads, f16_to_f32, f32_to_f16, bf16_to_f32, f32_to_bf16,
    map_coord, floor_index, MODE_BILINEAR, MODE_NEAREST, HALF_F16, HALF_BF16,
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


# ---------------------------------------------------------------------------------------------
# per-point set-up
# ---------------------------------------------------------------------------------------------

cdef struct Corners:
    # bilinear: corner 0 index and in-bounds flags per axis, fractional weights per axis;
    # nearest: the rounded index in x0/y0/z0 and its flag in vx0/vy0/vz0
    Py_ssize_t x0, y0, z0
    bint vx0, vx1, vy0, vy1, vz0, vz1
    double wx1, wy1, wz1      # east/south/bottom fractions (ix - x0 ...), exact in double
    double mx, my, mz         # grid-gradient multipliers
    bint valid                # False: the point samples nothing
    Py_ssize_t key            # depth plane owning the point's grid gradient (from z alone)


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


cdef inline void setup_point(const store_t* q, Py_ssize_t qo, Py_ssize_t qc, Geo* g,
                             Corners* k) noexcept nogil:
    """Map the grid point at offset ``qo`` (component stride ``qc``) to its corners."""
    cdef double ix, iy, iz
    cdef int hk = g.half_kind
    cdef bint okz = axis_index(ld(q, qo + 2 * qc, hk), g.D, g, &iz, &k.mz, &k.z0)
    cdef bint oky = axis_index(ld(q, qo + qc, hk), g.H, g, &iy, &k.my, &k.y0)
    cdef bint okx = axis_index(ld(q, qo, hk), g.W, g, &ix, &k.mx, &k.x0)
    k.key = key_of(okz, k.z0, g.D)
    k.valid = okx and oky and okz
    if not k.valid:
        k.vx0 = k.vx1 = k.vy0 = k.vy1 = k.vz0 = k.vz1 = False
        return
    k.vx0 = 0 <= k.x0 < g.W
    k.vy0 = 0 <= k.y0 < g.H
    k.vz0 = 0 <= k.z0 < g.D
    if g.mode == MODE_NEAREST:
        k.vx1 = k.vy1 = k.vz1 = False
        return
    k.wx1 = ix - <double>k.x0
    k.wy1 = iy - <double>k.y0
    k.wz1 = iz - <double>k.z0
    k.vx1 = -1 <= k.x0 < g.W - 1
    k.vy1 = -1 <= k.y0 < g.H - 1
    k.vz1 = -1 <= k.z0 < g.D - 1


# ---------------------------------------------------------------------------------------------
# forward
# ---------------------------------------------------------------------------------------------

cdef void forward_points(const store_t* x, const store_t* q, store_t* out, acc_t* scratch,
                         Geo* g, Py_ssize_t start, Py_ssize_t stop) noexcept nogil:
    """Forward for flat point indices [start, stop) over (N, Do, Ho, Wo)."""
    cdef Corners k
    cdef Py_ssize_t idx, n, od, oh, ow, rem, c, C = g.C, xc = g.xs[4], oc = g.gs[4]
    cdef Py_ssize_t base, ob, P = g.Do * g.Ho * g.Wo, HW = g.Ho * g.Wo
    cdef Py_ssize_t cz, cy, cx, off
    cdef acc_t w, wx0, wx1, wy0, wy1, wz0, wz1
    cdef bint vz, vy, vx
    cdef int hk = g.half_kind
    for idx in range(start, stop):
        n = idx // P
        rem = idx - n * P
        od = rem // HW
        rem = rem - od * HW
        oh = rem // g.Wo
        ow = rem - oh * g.Wo
        setup_point(q, n * g.qs[0] + od * g.qs[1] + oh * g.qs[2] + ow * g.qs[3], g.qs[4], g, &k)
        ob = n * g.gs[0] + od * g.gs[1] + oh * g.gs[2] + ow * g.gs[3]
        for c in range(C):
            scratch[c] = 0
        if g.mode == MODE_NEAREST:
            if k.vx0 and k.vy0 and k.vz0:
                base = n * g.xs[0] + k.z0 * g.xs[1] + k.y0 * g.xs[2] + k.x0 * g.xs[3]
                for c in range(C):
                    scratch[c] = <acc_t>ld(x, base + c * xc, hk)
        elif k.valid:
            wx1 = <acc_t>k.wx1
            wy1 = <acc_t>k.wy1
            wz1 = <acc_t>k.wz1
            wx0 = <acc_t>(1.0 - k.wx1)
            wy0 = <acc_t>(1.0 - k.wy1)
            wz0 = <acc_t>(1.0 - k.wz1)
            base = n * g.xs[0] + k.z0 * g.xs[1] + k.y0 * g.xs[2] + k.x0 * g.xs[3]
            # corners in the SPEC order tnw, tne, tsw, tse, bnw, bne, bsw, bse
            for cz in range(2):
                vz = k.vz1 if cz else k.vz0
                if not vz:
                    continue
                for cy in range(2):
                    vy = k.vy1 if cy else k.vy0
                    if not vy:
                        continue
                    for cx in range(2):
                        vx = k.vx1 if cx else k.vx0
                        if not vx:
                            continue
                        w = (wx1 if cx else wx0) * (wy1 if cy else wy0) * (wz1 if cz else wz0)
                        off = base + cz * g.xs[1] + cy * g.xs[2] + cx * g.xs[3]
                        for c in range(C):
                            scratch[c] = scratch[c] + w * <acc_t>ld(x, off + c * xc, hk)
        for c in range(C):
            st(out, ob + c * oc, scratch[c], hk)


def forward(const store_t[:, :, :, :, :] inp, const store_t[:, :, :, :, :] grid,
            store_t[:, :, :, :, :] out, acc_t[:, ::1] scratch, int mode, int padding, bint align,
            int half_kind, int nthreads):
    """out[n, do, ho, wo, c] = sample of inp at grid[n, do, ho, wo] (axes already NDHWC-ordered).

    ``scratch`` has shape (nthreads, C) of the compute type.
    """
    cdef Geo g
    cdef Py_ssize_t total, chunk, nchunks, ci, isz = sizeof(store_t)
    if store_t is double:
        if acc_t is float:
            raise TypeError("compute type does not match the storage type")
    elif acc_t is double:
        raise TypeError("compute type does not match the storage type")
    g.N, g.D, g.H, g.W, g.C = inp.shape[0], inp.shape[1], inp.shape[2], inp.shape[3], inp.shape[4]
    g.Do, g.Ho, g.Wo = grid.shape[1], grid.shape[2], grid.shape[3]
    fill_strides(g.xs, inp.shape, inp.strides, isz, 5)
    fill_strides(g.qs, grid.shape, grid.strides, isz, 5)
    fill_strides(g.gs, out.shape, out.strides, isz, 5)
    g.mode, g.padding, g.align, g.half_kind = mode, padding, align, half_kind
    total = g.N * g.Do * g.Ho * g.Wo
    if total == 0 or g.C == 0:
        return
    if scratch.shape[0] < nthreads or scratch.shape[1] < g.C:
        raise ValueError("scratch too small")
    chunk = 256
    nchunks = (total + chunk - 1) // chunk
    with nogil:
        for ci in prange(nchunks, schedule='static', num_threads=nthreads):
            forward_points(&inp[0, 0, 0, 0, 0], &grid[0, 0, 0, 0, 0], &out[0, 0, 0, 0, 0],
                           &scratch[threadid(), 0], &g, ci * chunk, min(total, (ci + 1) * chunk))


# ---------------------------------------------------------------------------------------------
# backward
# ---------------------------------------------------------------------------------------------

cdef inline acc_t dot_channels(const acc_t* go, const store_t* x, Py_ssize_t off, Py_ssize_t xc,
                               Py_ssize_t C, int hk) noexcept nogil:
    """sum_c go[c] * x[off + c * xc] in a fixed order: four interleaved partial sums, then
    ((s0 + s1) + (s2 + s3)).  The same order for every stride, so results never depend on the
    layout, and the unit-stride loop vectorises without -ffast-math."""
    cdef acc_t s0 = 0, s1 = 0, s2 = 0, s3 = 0
    cdef Py_ssize_t c = 0
    if xc == 1:
        while c + 4 <= C:
            s0 = s0 + go[c] * <acc_t>ld(x, off + c, hk)
            s1 = s1 + go[c + 1] * <acc_t>ld(x, off + c + 1, hk)
            s2 = s2 + go[c + 2] * <acc_t>ld(x, off + c + 2, hk)
            s3 = s3 + go[c + 3] * <acc_t>ld(x, off + c + 3, hk)
            c += 4
    else:
        while c + 4 <= C:
            s0 = s0 + go[c] * <acc_t>ld(x, off + c * xc, hk)
            s1 = s1 + go[c + 1] * <acc_t>ld(x, off + (c + 1) * xc, hk)
            s2 = s2 + go[c + 2] * <acc_t>ld(x, off + (c + 2) * xc, hk)
            s3 = s3 + go[c + 3] * <acc_t>ld(x, off + (c + 3) * xc, hk)
            c += 4
    while c < C:
        s0 = s0 + go[c] * <acc_t>ld(x, off + c * xc, hk)
        c += 1
    return (s0 + s1) + (s2 + s3)


cdef inline void axpy_channels(acc_t* A, Py_ssize_t off, Py_ssize_t ac, acc_t w, const acc_t* go,
                               Py_ssize_t C) noexcept nogil:
    """A[off + c * ac] += w * go[c] for every channel."""
    cdef Py_ssize_t c
    if ac == 1:
        for c in range(C):
            A[off + c] += w * go[c]
    else:
        for c in range(C):
            A[off + c * ac] += w * go[c]


cdef void backward_points(const store_t* grad, const store_t* x, const store_t* q, store_t* dq,
                          acc_t* A, Py_ssize_t* As, acc_t* go, Geo* g, Py_ssize_t n,
                          Py_ssize_t p0, Py_ssize_t p1, Py_ssize_t zlo, Py_ssize_t zhi,
                          bint do_dx, bint do_dg, bint own_all) noexcept nogil:
    """Backward for the output points [p0, p1) of batch item ``n``.

    Scatters into the accumulator ``A`` (axes D, H, W, C with strides ``As``, already offset to
    batch item n) the corners whose depth index is in [zlo, zhi), and writes the grid gradient of
    the points this call owns: all of them when ``own_all``, else those whose key plane is in
    [zlo, zhi).
    """
    cdef Corners k
    cdef Py_ssize_t p, od, oh, ow, rem, c, C = g.C, xc = g.xs[4], gc = g.gs[4], ac = As[3]
    cdef Py_ssize_t qo, ob, base, abase, off, kp, zi, j
    cdef bint full_slab = zlo <= 0 and zhi >= g.D
    cdef bint owner, need_dx, okz, slab0, slab1
    cdef double uz, mz
    cdef acc_t dot, gx, gy, gz
    cdef acc_t wx[2]
    cdef acc_t wy[2]
    cdef acc_t wz[2]
    cdef bint vx[2]
    cdef bint vy[2]
    cdef bint vz[2]
    cdef Py_ssize_t xoff[8]
    cdef Py_ssize_t aoff[8]
    cdef acc_t wk[8]
    cdef int nok
    cdef int hk = g.half_kind
    if p0 >= p1:
        return
    od = p0 // (g.Ho * g.Wo)
    rem = p0 - od * g.Ho * g.Wo
    oh = rem // g.Wo
    ow = rem - oh * g.Wo - 1
    for p in range(p0, p1):
        # (od, oh, ow) of point p, without divisions
        ow += 1
        if ow == g.Wo:
            ow = 0
            oh += 1
            if oh == g.Ho:
                oh = 0
                od += 1
        qo = n * g.qs[0] + od * g.qs[1] + oh * g.qs[2] + ow * g.qs[3]
        if not full_slab:
            # cheap depth-only test first: most points have no corner in this slab
            okz = axis_index(ld(q, qo + 2 * g.qs[4], hk), g.D, g, &uz, &mz, &zi)
            kp = key_of(okz, zi, g.D)
            if not (zlo <= kp < zhi or (okz and zlo - 1 <= zi < zhi)):
                continue
        setup_point(q, qo, g.qs[4], g, &k)
        owner = do_dg and (own_all or zlo <= k.key < zhi)
        need_dx = do_dx and k.valid
        ob = n * g.gs[0] + od * g.gs[1] + oh * g.gs[2] + ow * g.gs[3]
        if need_dx or (owner and k.valid and g.mode == MODE_BILINEAR):
            if gc == 1:
                for c in range(C):
                    go[c] = <acc_t>ld(grad, ob + c, hk)
            else:
                for c in range(C):
                    go[c] = <acc_t>ld(grad, ob + c * gc, hk)
        if g.mode == MODE_NEAREST:
            if owner:
                off = n * g.os[0] + od * g.os[1] + oh * g.os[2] + ow * g.os[3]
                st(dq, off, <acc_t>0, hk)
                st(dq, off + g.os[4], <acc_t>0, hk)
                st(dq, off + 2 * g.os[4], <acc_t>0, hk)
            if need_dx and k.vx0 and k.vy0 and k.vz0 and zlo <= k.z0 < zhi:
                axpy_channels(A, k.z0 * As[0] + k.y0 * As[1] + k.x0 * As[2], ac, <acc_t>1, go, C)
            continue
        gx = 0
        gy = 0
        gz = 0
        if k.valid:
            wx[1] = <acc_t>k.wx1
            wy[1] = <acc_t>k.wy1
            wz[1] = <acc_t>k.wz1
            wx[0] = <acc_t>(1.0 - k.wx1)
            wy[0] = <acc_t>(1.0 - k.wy1)
            wz[0] = <acc_t>(1.0 - k.wz1)
            vx[0], vx[1], vy[0], vy[1], vz[0], vz[1] = k.vx0, k.vx1, k.vy0, k.vy1, k.vz0, k.vz1
            base = n * g.xs[0] + k.z0 * g.xs[1] + k.y0 * g.xs[2] + k.x0 * g.xs[3]
            abase = k.z0 * As[0] + k.y0 * As[1] + k.x0 * As[2]
            for j in range(8):
                # corner j = 4 cz + 2 cy + cx: tnw, tne, tsw, tse, bnw, bne, bsw, bse
                xoff[j] = base + (j >> 2) * g.xs[1] + ((j >> 1) & 1) * g.xs[2] + (j & 1) * g.xs[3]
                aoff[j] = abase + (j >> 2) * As[0] + ((j >> 1) & 1) * As[1] + (j & 1) * As[2]
            if owner:
                for j in range(8):
                    if vz[j >> 2] and vy[(j >> 1) & 1] and vx[j & 1]:
                        dot = dot_channels(go, x, xoff[j], xc, C, hk)
                        if j & 1:
                            gx = gx + dot * (wy[(j >> 1) & 1] * wz[j >> 2])
                        else:
                            gx = gx - dot * (wy[(j >> 1) & 1] * wz[j >> 2])
                        if (j >> 1) & 1:
                            gy = gy + dot * (wx[j & 1] * wz[j >> 2])
                        else:
                            gy = gy - dot * (wx[j & 1] * wz[j >> 2])
                        if j >> 2:
                            gz = gz + dot * (wx[j & 1] * wy[(j >> 1) & 1])
                        else:
                            gz = gz - dot * (wx[j & 1] * wy[(j >> 1) & 1])
            if need_dx:
                slab0 = vz[0] and zlo <= k.z0 < zhi
                slab1 = vz[1] and zlo <= k.z0 + 1 < zhi
                nok = 0
                for j in range(8):
                    if (slab1 if j >> 2 else slab0) and vy[(j >> 1) & 1] and vx[j & 1]:
                        aoff[nok] = aoff[j]
                        wk[nok] = wx[j & 1] * (wy[(j >> 1) & 1] * wz[j >> 2])
                        nok += 1
                if ac == 1:
                    for j in range(nok):
                        axpy_channels(A, aoff[j], 1, wk[j], go, C)
                else:
                    # channels outermost: consecutive read-modify-writes a whole channel plane
                    # apart would alias in the low address bits (power-of-two volumes) and
                    # stall on false store-to-load dependencies
                    for c in range(C):
                        for j in range(nok):
                            A[aoff[j] + c * ac] += wk[j] * go[c]
        if owner:
            off = n * g.os[0] + od * g.os[1] + oh * g.os[2] + ow * g.os[3]
            st(dq, off, <acc_t>k.mx * gx, hk)
            st(dq, off + g.os[4], <acc_t>k.my * gy, hk)
            st(dq, off + 2 * g.os[4], <acc_t>k.mz * gz, hk)


cdef void zero_planes(acc_t* A, Py_ssize_t* As, Geo* g, Py_ssize_t zlo, Py_ssize_t zhi) noexcept nogil:
    """Zero the accumulator planes [zlo, zhi), walking memory in order for either layout."""
    cdef Py_ssize_t z, y, xx, c, o
    if As[3] > As[2]:              # channels outermost in memory (NCDHW)
        for c in range(g.C):
            for z in range(zlo, zhi):
                for y in range(g.H):
                    o = c * As[3] + z * As[0] + y * As[1]
                    for xx in range(g.W):
                        A[o + xx * As[2]] = 0
    else:
        for z in range(zlo, zhi):
            for y in range(g.H):
                for xx in range(g.W):
                    o = z * As[0] + y * As[1] + xx * As[2]
                    for c in range(g.C):
                        A[o + c * As[3]] = 0


cdef inline void round_one(const float* A, Py_ssize_t a, unsigned short* dx, Py_ssize_t d,
                           int half_kind) noexcept nogil:
    if half_kind == HALF_BF16:
        dx[d] = f32_to_bf16(A[a])
    else:
        dx[d] = f32_to_f16(A[a])


cdef void round_planes(const float* A, Py_ssize_t* As, unsigned short* dx, Geo* g, Py_ssize_t n,
                       Py_ssize_t zlo, Py_ssize_t zhi) noexcept nogil:
    """Round the float32 accumulator planes [zlo, zhi) once into the 16-bit input_grad."""
    cdef Py_ssize_t z, y, xx, c, o, d
    cdef Py_ssize_t* ds = g.ds
    if ds[4] > ds[3]:              # channels outermost in memory (NCDHW)
        for c in range(g.C):
            for z in range(zlo, zhi):
                for y in range(g.H):
                    o = c * As[3] + z * As[0] + y * As[1]
                    d = n * ds[0] + c * ds[4] + z * ds[1] + y * ds[2]
                    for xx in range(g.W):
                        round_one(A, o + xx * As[2], dx, d + xx * ds[3], g.half_kind)
    else:
        for z in range(zlo, zhi):
            for y in range(g.H):
                for xx in range(g.W):
                    o = z * As[0] + y * As[1] + xx * As[2]
                    d = n * ds[0] + z * ds[1] + y * ds[2] + xx * ds[3]
                    for c in range(g.C):
                        round_one(A, o + c * As[3], dx, d + c * ds[4], g.half_kind)


cdef void choose_slabs(const store_t* q, Geo* g, Py_ssize_t n, int nt, Py_ssize_t* bounds) noexcept nogil:
    """Cut [0, D) into ``nt`` slabs of similar work, estimated from a sample of grid points.

    Any cut gives the same (bitwise) result; this only balances the threads.
    """
    cdef Py_ssize_t P = g.Do * g.Ho * g.Wo, HW = g.Ho * g.Wo, S, i, p, od, oh, ow, rem, z, t
    cdef double u, m, total, acc, plane_cost
    cdef double* cost = <double*>malloc(g.D * sizeof(double))
    if cost == NULL or nt <= 1:
        for t in range(nt + 1):
            bounds[t] = (g.D * t) // nt
        free(cost)
        return
    S = P if P < 4096 else 4096
    plane_cost = <double>(g.H * g.W) / 8.0 * <double>S / <double>P   # zeroing, in corner units
    for z in range(g.D):
        cost[z] = plane_cost
    for i in range(S):
        p = (i * P) // S
        od = p // HW
        rem = p - od * HW
        oh = rem // g.Wo
        ow = rem - oh * g.Wo
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
    free(cost)


def backward(const store_t[:, :, :, :, :] grad, const store_t[:, :, :, :, :] inp,
             const store_t[:, :, :, :, :] grid, store_t[:, :, :, :, :] dx,
             store_t[:, :, :, :, :] dgrid, acc_t[:, :, :, :] dx_acc, acc_t[:, ::1] scratch,
             int mode, int padding, bint align, int half_kind, bint want_dx, bint want_dg,
             int nthreads):
    """Gradients of the sampling with respect to ``inp`` (into ``dx``) and ``grid`` (``dgrid``).

    Axes are NDHWC-ordered views whatever the caller's layout.  ``dx_acc`` (D, H, W, C) is the
    float32 accumulator used for 16-bit dx (unused otherwise); ``scratch`` is (nthreads, C).
    """
    cdef Geo g
    cdef Py_ssize_t isz = sizeof(store_t), P, n, t, chunk, nchunks, ci
    cdef Py_ssize_t As[4]
    cdef Py_ssize_t* bounds
    cdef acc_t* A
    cdef int nt
    cdef bint half_acc = not (store_t is double or store_t is float)
    if store_t is double:
        if acc_t is float:
            raise TypeError("compute type does not match the storage type")
    elif acc_t is double:
        raise TypeError("compute type does not match the storage type")
    g.N, g.D, g.H, g.W, g.C = inp.shape[0], inp.shape[1], inp.shape[2], inp.shape[3], inp.shape[4]
    g.Do, g.Ho, g.Wo = grid.shape[1], grid.shape[2], grid.shape[3]
    fill_strides(g.xs, inp.shape, inp.strides, isz, 5)
    fill_strides(g.gs, grad.shape, grad.strides, isz, 5)
    fill_strides(g.qs, grid.shape, grid.strides, isz, 5)
    fill_strides(g.os, dgrid.shape, dgrid.strides, isz, 5)
    fill_strides(g.ds, dx.shape, dx.strides, isz, 5)
    fill_strides(g.as_, dx_acc.shape, dx_acc.strides, sizeof(acc_t), 4)
    g.mode, g.padding, g.align, g.half_kind = mode, padding, align, half_kind
    P = g.Do * g.Ho * g.Wo
    if g.N == 0 or not (want_dx or want_dg):
        return
    if scratch.shape[0] < nthreads or scratch.shape[1] < g.C:
        raise ValueError("scratch too small")
    if want_dx and half_acc and (dx_acc.shape[0] < g.D or dx_acc.shape[1] < g.H
                                 or dx_acc.shape[2] < g.W or dx_acc.shape[3] < g.C):
        raise ValueError("dx accumulator too small")
    A = NULL
    As[0] = As[1] = As[2] = As[3] = 0
    bounds = <Py_ssize_t*>malloc((nthreads + 1) * sizeof(Py_ssize_t))
    if bounds == NULL:
        raise MemoryError()
    with nogil:
        for n in range(g.N):
            if want_dx:
                if half_acc:
                    A = &dx_acc[0, 0, 0, 0]
                    As[0], As[1], As[2], As[3] = g.as_[0], g.as_[1], g.as_[2], g.as_[3]
                else:
                    A = <acc_t*>&dx[n, 0, 0, 0, 0]
                    As[0], As[1], As[2], As[3] = g.ds[1], g.ds[2], g.ds[3], g.ds[4]
                nt = nthreads if nthreads < g.D else <int>g.D
                choose_slabs(&grid[0, 0, 0, 0, 0], &g, n, nt, bounds)
                for t in prange(nt, schedule='static', chunksize=1, num_threads=nt):
                    zero_planes(A, As, &g, bounds[t], bounds[t + 1])
                    if P > 0:
                        backward_points(&grad[0, 0, 0, 0, 0], &inp[0, 0, 0, 0, 0],
                                        &grid[0, 0, 0, 0, 0], &dgrid[0, 0, 0, 0, 0], A, As,
                                        &scratch[threadid(), 0], &g, n, 0, P, bounds[t],
                                        bounds[t + 1], True, want_dg, False)
                    if half_acc:
                        round_planes(<float*>A, As, <unsigned short*>&dx[0, 0, 0, 0, 0], &g, n,
                                     bounds[t], bounds[t + 1])
            elif P > 0:
                chunk = 512
                nchunks = (P + chunk - 1) // chunk
                for ci in prange(nchunks, schedule='static', num_threads=nthreads):
                    backward_points(&grad[0, 0, 0, 0, 0], &inp[0, 0, 0, 0, 0],
                                    &grid[0, 0, 0, 0, 0], &dgrid[0, 0, 0, 0, 0], A, As,
                                    &scratch[threadid(), 0], &g, n, ci * chunk,
                                    min(P, (ci + 1) * chunk), 0, g.D, False, True, True)
    free(bounds)
