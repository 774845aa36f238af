# cython: language_level=3
"""Small inline helpers shared by the kernels in _kernels.pyx.

Everything here is ``noexcept nogil``: coordinate mapping (SPEC, "Coordinate mapping"), the
half-precision conversions (SPEC, "Precision") and the OpenMP shim that lets the module build
and run serially without OpenMP.
"""
from libc.math cimport INFINITY
from libc.stdint cimport uint16_t, uint32_t

cdef extern from *:
    """
    #ifdef _OPENMP
    #include <omp.h>
    #define GS3D_OPENMP 1
    #else
    #define GS3D_OPENMP 0
    static int omp_get_max_threads(void) { return 1; }
    static int omp_get_thread_num(void) { return 0; }
    #endif
    #include <string.h>
    #include <math.h>
    /* the padding codes of the kernels' ``border`` arguments (PAD_* below): 0 zeros, 1 border,
       2 reflection (only gs3d_map4 and gs3d_axis8 tell 1 from 2) */
    #define GS3D_PAD_REFLECTION 2
    static int gs3d_cpu_has_avx2(void) {
    #if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")
               && __builtin_cpu_supports("f16c");
    #else
        return 0;
    #endif
    }
    /* the instructions of the AVX-512 build (gcc's check includes the OS's zmm state) */
    static int gs3d_cpu_has_avx512(void) {
    #if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
        __builtin_cpu_init();
        return gs3d_cpu_has_avx2() && __builtin_cpu_supports("avx512f")
               && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")
               && __builtin_cpu_supports("avx512bw");
    #else
        return 0;
    #endif
    }
    #if defined(__GNUC__) || defined(__clang__)
    #define GS3D_ALWAYS_INLINE static inline __attribute__((always_inline))
    #define GS3D_NOINLINE static __attribute__((noinline))
    #else
    #define GS3D_ALWAYS_INLINE static inline
    #define GS3D_NOINLINE static
    #endif
    /* the most channels gs3d_backward_cl_avx2 converts 16-bit grad_output for in place */
    #define GS3D_CL_GOBUF 64
    /* Prefetch hints.  On x86 they are volatile asm: gcc deems __builtin_prefetch free of side
       effects, so a helper made only of prefetches counts as a pure function and its calls are
       deleted as dead code (gcc 12 -O1 and up dropped every prefetch of these kernels that
       way).  prefetcht0 for writes too: PREFETCHW is not in the x86-64 baseline. */
    #if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
    #define gs3d_prefetch(p) __asm__ __volatile__("prefetcht0 %0" : : "m"(*(const char*)(p)))
    #define gs3d_prefetch_w(p) gs3d_prefetch(p)
    #elif defined(__GNUC__) || defined(__clang__)
    #define gs3d_prefetch(p) __builtin_prefetch((const void*)(p))
    #define gs3d_prefetch_w(p) __builtin_prefetch((const void*)(p), 1)
    #else
    #define gs3d_prefetch(p) ((void)0)
    #define gs3d_prefetch_w(p) ((void)0)
    #endif
    /* floor, inlined where SSE4.1 has a rounding instruction (the AVX2 build); the x86-64
       baseline compares the truncation instead of calling libm */
    GS3D_ALWAYS_INLINE double gs3d_floor(double v) {
    #if defined(__SSE4_1__) || !(defined(__x86_64__) || defined(__i386__))
        return floor(v);
    #else
        double t = (double)(long long)v;    /* |v| is small here: the cast cannot overflow */
        return t - (t > v);
    #endif
    }
    /* round half to even (the default rounding mode), inlined like gs3d_floor; |v| small */
    GS3D_ALWAYS_INLINE double gs3d_rint(double v) {
    #if defined(__SSE4_1__) || !(defined(__x86_64__) || defined(__i386__))
        return rint(v);
    #else
        const double big = 4503599627370496.0;          /* 2^52: adding it rounds to integer */
        return v >= 0.0 ? (v + big) - big : -((-v + big) - big);
    #endif
    }
    /* flags of map_axis: 1 samples something, 2 corner 0 in bounds, 4 corner 1 in bounds;
       the corners (bit j = corner 4 cz + 2 cy + cx) that each axis's flags admit */
    static const unsigned char gs3d_corners_x[8] = {0, 0, 0x55, 0x55, 0xAA, 0xAA, 0xFF, 0xFF};
    static const unsigned char gs3d_corners_y[8] = {0, 0, 0x33, 0x33, 0xCC, 0xCC, 0xFF, 0xFF};
    static const unsigned char gs3d_corners_z[8] = {0, 0, 0x0F, 0x0F, 0xF0, 0xF0, 0xFF, 0xFF};
    static void gs3d_axis_flags(const double* __restrict fidx, const double* __restrict okf,
                                int cnt, double sz, unsigned char* __restrict flags) {
        const double hi = sz - 1.0;
        int i;
        for (i = 0; i < cnt; i++) {
            double fl = fidx[i];
            int ok = okf[i] != 0.0;
            flags[i] = (unsigned char)(ok | ((ok & (fl >= 0.0) & (fl < sz)) << 1)
                                       | ((ok & (fl >= -1.0) & (fl < hi)) << 2));
        }
    }
    /* map_coord's reflection of a finite coordinate's u (lo, span: -0.5 and size without
       align_corners, 0 and size - 1 with): u - lo folded into [0, 2 span), then into
       [lo, lo + span] with *m's sign flipped at each mirror (the caller then clips it to
       [0, size - 1], as border padding does).  fmod(t, 2 span) by subtracting whole periods
       while t < 2^52, which is exact, as fmod is (see gs3d_fmod4).  Returns 0 (*uo unset,
       *m not to be used) when u - lo overflowed. */
    static inline int gs3d_reflect1(double u, double lo, double span, double* uo, double* m) {
        double t, r, per;
        if (span == 0.0) {
            *uo = 0.0;
            *m = 0.0;
            return 1;
        }
        t = u - lo;
        if (t < 0.0) {
            *m = -*m;
            t = -t;
        }
        per = 2.0 * span;
        if (t < 4503599627370496.0) {
            r = t - floor(t / per) * per;
            if (r < 0.0)
                r += per;
        } else {
            r = fmod(t, per);
        }
        if (r >= span) {
            u = lo + (span - (r - span));
            *m = -*m;
        } else {
            u = r + lo;
        }
        if (u != u)
            return 0;
        *uo = u;
        return 1;
    }
    GS3D_ALWAYS_INLINE void gs3d_axis1(
            double gv, double sz, double hi, double m0, const int align, const int border,
            const int nearest, double* frac, double* mult, double* fidx, double* okf) {
        double u = align ? (gv + 1.0) / 2.0 * hi : ((gv + 1.0) * sz - 1.0) / 2.0;
        double m = m0, uc, fl;
        int ok;
        if (border == GS3D_PAD_REFLECTION) {
            ok = gv - gv == 0.0;
            if (ok)
                ok = gs3d_reflect1(u, align ? 0.0 : -0.5, align ? hi : sz, &u, &m);
        } else if (border) {
            /* an infinity goes to its edge; NaN stays NaN and samples nothing */
            double edge = gv < 0.0 ? 0.0 : hi;
            u = (gv - gv == 0.0) ? u : edge;
            ok = gv == gv;
        } else {
            ok = gv - gv == 0.0;
        }
        if (border) {
            /* border and reflection clip u to [0, size - 1] (clip_coord) */
            m = ((u > 0.0) & (u < hi)) ? m : 0.0;
            u = u <= 0.0 ? 0.0 : u;
            u = u >= hi ? hi : u;
        }
        m = ok ? m : 0.0;
        u = ok ? u : 0.0;
        uc = u < -2.0 ? -2.0 : u;
        uc = uc > sz + 1.0 ? sz + 1.0 : uc;
        fl = nearest ? gs3d_rint(uc) : gs3d_floor(uc);
        *fidx = fl;
        *frac = u - fl;
        *mult = m;
        *okf = ok ? 1.0 : 0.0;
    }
    /* Map one axis of cnt points under padding ``border`` (GS3D_PAD_*; SPEC, "Coordinate
       mapping"): the same arithmetic as map_coord, as one loop of selects the compiler can
       vectorise under zeros and border (reflection's fold branches).  Writes the floor of u
       clamped to [-2, size + 1] (fidx), u - fidx (frac), the grid-gradient factor (mult, 0
       when clipped or dead) and 1.0 / 0.0 for "samples something" (okf), then the flags of
       map_axis (gs3d_axis_flags).  A dead point gets u = 0 and factor 0. */
    static void gs3d_map_axis_linear(const double* __restrict gin, int cnt, double sz, int align,
                                     int border, int nearest, double* __restrict frac,
                                     double* __restrict mult, double* __restrict fidx,
                                     double* __restrict okf, unsigned char* __restrict flags) {
        const double hi = sz - 1.0, m0 = align ? hi / 2.0 : sz / 2.0;
        int i;
        /* one loop per (align, border) so each is a straight run of selects */
    #define GS3D_AXIS_LOOP(A, B, R) for (i = 0; i < cnt; i++) \
            gs3d_axis1(gin[i], sz, hi, m0, A, B, R, &frac[i], &mult[i], &fidx[i], &okf[i])
    #define GS3D_AXIS_PADS(A, R) \
        if (border == GS3D_PAD_REFLECTION) GS3D_AXIS_LOOP(A, GS3D_PAD_REFLECTION, R); \
        else if (border) GS3D_AXIS_LOOP(A, 1, R); else GS3D_AXIS_LOOP(A, 0, R);
    #define GS3D_AXIS_LOOPS(R) \
        if (align) { GS3D_AXIS_PADS(1, R) } else { GS3D_AXIS_PADS(0, R) }
        if (nearest) { GS3D_AXIS_LOOPS(1) } else { GS3D_AXIS_LOOPS(0) }
    #undef GS3D_AXIS_LOOPS
    #undef GS3D_AXIS_PADS
    #undef GS3D_AXIS_LOOP
        gs3d_axis_flags(fidx, okf, cnt, sz, flags);
    }
    /* F16C conversions, in the build that has them (the AVX2 variant): exact like the
       portable routines below, which they replace there.  Signalling NaNs come back quiet,
       which no result can show: every loaded value goes through arithmetic (which quiets NaNs
       anyway) and every stored NaN is written as the one quiet NaN of its sign. */
    #if defined(__F16C__)
    #include <immintrin.h>
    #define GS3D_HAVE_F16C 1
    static inline float gs3d_f16_to_f32_hw(uint16_t h) { return _cvtsh_ss(h); }
    static inline uint16_t gs3d_f32_to_f16_hw(float f) {
        return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
    }
    /* eight float16 values at p into float32 (one vcvtph2ps) */
    static inline void gs3d_f16x8_hw(const uint16_t* p, float* out) {
        _mm256_storeu_ps(out, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)));
    }
    #else
    static inline void gs3d_f16x8_hw(const uint16_t* p, float* out) { (void)p; (void)out; }
    #define GS3D_HAVE_F16C 0
    static inline float gs3d_f16_to_f32_hw(uint16_t h) { (void)h; return 0.0f; }
    static inline uint16_t gs3d_f32_to_f16_hw(float f) { (void)f; return 0; }
    #endif
    /* Unit-stride channel loops of the float32 and float64 kernels, in blocks of eight so
       that each block is one vector operation without alias checks or peeling.  The dot
       product's order is dot_channels' (lane c % 8 for the first C - C % 8 channels, the rest
       in lane 0, then the fixed tree of lane_sum); the axpy is a[c] = a[c] + w * go[c].
       gs3d_corners is forward_tile's sum for one point, C a multiple of 8: r[c] = +0 plus
       w[j] * x[off[j] + c] for each corner j set in v, in corner order, every block of eight
       channels summed in registers (the sum kept in memory, as the loop it replaces keeps it,
       made every corner wait for the previous corner's store; with a tail of C % 8 channels
       that loop was the faster one).  The SIMD builds' float64 gs3d_corners_d is below (this
       one is gs3d_corners_d_loop there). */
    #define GS3D_CHANNEL_LOOPS(T, SUF) \
    static inline T gs3d_dot_##SUF(const T* __restrict go, const T* __restrict x, Py_ssize_t C) { \
        T s[8] = {0, 0, 0, 0, 0, 0, 0, 0}; \
        Py_ssize_t c = 0; \
        int l; \
        for (; c + 8 <= C; c += 8) \
            for (l = 0; l < 8; l++) s[l] = s[l] + go[c + l] * x[c + l]; \
        for (; c < C; c++) s[0] = s[0] + go[c] * x[c]; \
        return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7])); \
    } \
    static inline void gs3d_axpy_##SUF(T* __restrict a, T w, const T* __restrict go, \
                                       Py_ssize_t C) { \
        Py_ssize_t c = 0; \
        int l; \
        for (; c + 8 <= C; c += 8) \
            for (l = 0; l < 8; l++) a[c + l] = a[c + l] + w * go[c + l]; \
        for (; c < C; c++) a[c] = a[c] + w * go[c]; \
    } \
    static inline void gs3d_corners_##SUF(T* __restrict r, const T* __restrict x, \
                                          const Py_ssize_t* __restrict off, \
                                          const T* __restrict w, unsigned v, Py_ssize_t C) { \
        Py_ssize_t c; \
        int j, l; \
        for (c = 0; c < C; c += 8) { \
            T s[8] = {0, 0, 0, 0, 0, 0, 0, 0}; \
            for (j = 0; j < 8; j++) \
                if ((v >> j) & 1) \
                    for (l = 0; l < 8; l++) s[l] = s[l] + w[j] * x[off[j] + c + l]; \
            for (l = 0; l < 8; l++) r[c + l] = s[l]; \
        } \
    }
    GS3D_CHANNEL_LOOPS(float, f)
    #if defined(__AVX2__)
    #define gs3d_corners_d gs3d_corners_d_loop
    #endif
    GS3D_CHANNEL_LOOPS(double, d)
    #undef GS3D_CHANNEL_LOOPS
    #if defined(__AVX2__)
    #undef gs3d_corners_d
    #include <immintrin.h>
    /* float64 with a multiple of 8 channels in the SIMD builds: eight doubles as one vector
       (one 512-bit register in the AVX-512 build, two 256-bit ones in the AVX2 build), lane l
       holding channel c + l of a block of eight, so every lane's arithmetic is the scalar
       loops' (gs3d_corners_d_loop, gs3d_dot_d, gs3d_axpy_d) in the same order: the same bits
       in every build. */
    #define GS3D_HAVE_V8D 1
    #if defined(__AVX512F__)
    typedef __m512d gs3d_v8d;
    GS3D_ALWAYS_INLINE gs3d_v8d gs3d_v8d_zero(void) { return _mm512_setzero_pd(); }
    GS3D_ALWAYS_INLINE gs3d_v8d gs3d_v8d_set1(double v) { return _mm512_set1_pd(v); }
    GS3D_ALWAYS_INLINE gs3d_v8d gs3d_v8d_ld(const double* p) { return _mm512_loadu_pd(p); }
    GS3D_ALWAYS_INLINE void gs3d_v8d_st(double* p, gs3d_v8d v) { _mm512_storeu_pd(p, v); }
    GS3D_ALWAYS_INLINE gs3d_v8d gs3d_v8d_add(gs3d_v8d a, gs3d_v8d b) { return _mm512_add_pd(a, b); }
    GS3D_ALWAYS_INLINE gs3d_v8d gs3d_v8d_mul(gs3d_v8d a, gs3d_v8d b) { return _mm512_mul_pd(a, b); }
    /* lanes l + (l + 4) of a (low half) and of b (high half) */
    GS3D_ALWAYS_INLINE __m512d gs3d_fold_d(__m512d a, __m512d b) {
        return _mm512_add_pd(_mm512_shuffle_f64x2(a, b, 0x44), _mm512_shuffle_f64x2(a, b, 0xEE));
    }
    /* the eight corners' dot vectors reduced together in lane_sum's tree and operand order:
       d8[j] = ((s0 + s4) + (s2 + s6)) + ((s1 + s5) + (s3 + s7)) of S[j] */
    GS3D_ALWAYS_INLINE void gs3d_reduce8_d(gs3d_v8d s0, gs3d_v8d s1, gs3d_v8d s2, gs3d_v8d s3,
                                           gs3d_v8d s4, gs3d_v8d s5, gs3d_v8d s6, gs3d_v8d s7,
                                           double* d8) {
        /* lanes l + (l + 4) of corners 2k (low half) and 2k + 1 (high half) */
        const __m512d f0 = gs3d_fold_d(s0, s1), f1 = gs3d_fold_d(s2, s3);
        const __m512d f2 = gs3d_fold_d(s4, s5), f3 = gs3d_fold_d(s6, s7);
        /* (0 4) + (2 6) and (1 5) + (3 7): corners 0-3 in lo, 4-7 in hi, two lanes each */
        __m512d lo = _mm512_add_pd(_mm512_shuffle_f64x2(f0, f1, 0x88),
                                   _mm512_shuffle_f64x2(f0, f1, 0xDD));
        const __m512d hi = _mm512_add_pd(_mm512_shuffle_f64x2(f2, f3, 0x88),
                                         _mm512_shuffle_f64x2(f2, f3, 0xDD));
        /* their sums, corners 0 4 1 5 2 6 3 7, put in corner order */
        lo = _mm512_add_pd(_mm512_unpacklo_pd(lo, hi), _mm512_unpackhi_pd(lo, hi));
        _mm512_storeu_pd(d8, _mm512_permutexvar_pd(_mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7), lo));
    }
    #else
    typedef struct { __m256d l, h; } gs3d_v8d;      /* lanes 0-3, 4-7 */
    GS3D_ALWAYS_INLINE gs3d_v8d gs3d_v8d_zero(void) {
        gs3d_v8d r; r.l = r.h = _mm256_setzero_pd(); return r;
    }
    GS3D_ALWAYS_INLINE gs3d_v8d gs3d_v8d_set1(double v) {
        gs3d_v8d r; r.l = r.h = _mm256_set1_pd(v); return r;
    }
    GS3D_ALWAYS_INLINE gs3d_v8d gs3d_v8d_ld(const double* p) {
        gs3d_v8d r; r.l = _mm256_loadu_pd(p); r.h = _mm256_loadu_pd(p + 4); return r;
    }
    GS3D_ALWAYS_INLINE void gs3d_v8d_st(double* p, gs3d_v8d v) {
        _mm256_storeu_pd(p, v.l); _mm256_storeu_pd(p + 4, v.h);
    }
    GS3D_ALWAYS_INLINE gs3d_v8d gs3d_v8d_add(gs3d_v8d a, gs3d_v8d b) {
        gs3d_v8d r; r.l = _mm256_add_pd(a.l, b.l); r.h = _mm256_add_pd(a.h, b.h); return r;
    }
    GS3D_ALWAYS_INLINE gs3d_v8d gs3d_v8d_mul(gs3d_v8d a, gs3d_v8d b) {
        gs3d_v8d r; r.l = _mm256_mul_pd(a.l, b.l); r.h = _mm256_mul_pd(a.h, b.h); return r;
    }
    /* (0 4) + (2 6), (1 5) + (3 7) of a (low half) and of b (high half) */
    GS3D_ALWAYS_INLINE __m256d gs3d_pairs_d(gs3d_v8d a, gs3d_v8d b) {
        const __m256d fa = _mm256_add_pd(a.l, a.h), fb = _mm256_add_pd(b.l, b.h);
        return _mm256_add_pd(_mm256_permute2f128_pd(fa, fb, 0x20),
                             _mm256_permute2f128_pd(fa, fb, 0x31));
    }
    /* gs3d_reduce8_d (above) with 256-bit vectors */
    GS3D_ALWAYS_INLINE void gs3d_reduce8_d(gs3d_v8d s0, gs3d_v8d s1, gs3d_v8d s2, gs3d_v8d s3,
                                           gs3d_v8d s4, gs3d_v8d s5, gs3d_v8d s6, gs3d_v8d s7,
                                           double* d8) {
        const __m256d p01 = gs3d_pairs_d(s0, s1), p23 = gs3d_pairs_d(s2, s3);
        const __m256d p45 = gs3d_pairs_d(s4, s5), p67 = gs3d_pairs_d(s6, s7);
        /* corners 0 2 1 3 and 4 6 5 7, put in corner order */
        const __m256d r0 = _mm256_add_pd(_mm256_unpacklo_pd(p01, p23),
                                         _mm256_unpackhi_pd(p01, p23));
        const __m256d r1 = _mm256_add_pd(_mm256_unpacklo_pd(p45, p67),
                                         _mm256_unpackhi_pd(p45, p67));
        _mm256_storeu_pd(d8, _mm256_permute4x64_pd(r0, 0xD8));
        _mm256_storeu_pd(d8 + 4, _mm256_permute4x64_pd(r1, 0xD8));
    }
    #endif
    /* gs3d_corners_d_loop with the blocks of up to 32 channels summed side by side (each
       block's sum is still one chain of adds in corner order; a block at a time, that chain's
       latency was the loop's cost).  Eight channels (one block) take gs3d_corners2_d where
       forward_tile can (two points side by side), else the loop: as one 512-bit vector a
       point at a time they lost on the channels-last copy of NCDHW (8x8x32^3 smooth
       0.85-0.91x), and so did the loop compiled for exactly 8 (0.87-0.92x) */
    GS3D_ALWAYS_INLINE void gs3d_corners_d_blocks(double* __restrict r, const double* __restrict x,
                                                  const Py_ssize_t* __restrict off,
                                                  const double* __restrict w, unsigned v,
                                                  const int nb) {
        gs3d_v8d s[4], wj;
        int j, b;
        for (b = 0; b < nb; b++)
            s[b] = gs3d_v8d_zero();
        for (j = 0; j < 8; j++)
            if ((v >> j) & 1) {
                wj = gs3d_v8d_set1(w[j]);
                for (b = 0; b < nb; b++)
                    s[b] = gs3d_v8d_add(s[b], gs3d_v8d_mul(wj, gs3d_v8d_ld(x + off[j] + 8 * b)));
            }
        for (b = 0; b < nb; b++)
            gs3d_v8d_st(r + 8 * b, s[b]);
    }
    /* (out of line, so that the eight-channel loop inlined in forward_tile stays as it was) */
    GS3D_NOINLINE void gs3d_corners_d_wide(
            double* __restrict r, const double* __restrict x, const Py_ssize_t* __restrict off,
            const double* __restrict w, unsigned v, Py_ssize_t C) {
        Py_ssize_t c = 0;
        for (; c + 32 <= C; c += 32)
            gs3d_corners_d_blocks(r + c, x + c, off, w, v, 4);
        if (C - c == 24)
            gs3d_corners_d_blocks(r + c, x + c, off, w, v, 3);
        else if (C - c == 16)
            gs3d_corners_d_blocks(r + c, x + c, off, w, v, 2);
        else if (C - c == 8)
            gs3d_corners_d_blocks(r + c, x + c, off, w, v, 1);
    }
    static inline void gs3d_corners_d(double* __restrict r, const double* __restrict x,
                                      const Py_ssize_t* __restrict off, const double* __restrict w,
                                      unsigned v, Py_ssize_t C) {
        if (C < 16)
            gs3d_corners_d_loop(r, x, off, w, v, C);
        else
            gs3d_corners_d_wide(r, x, off, w, v, C);
    }
    /* gs3d_corners_d_loop for eight channels and two points at once (point i: offsets xb0,
       weights w[j * ws], mask v0, sums into r0; point i + 1: xb1, w[j * ws + 1], v1, r1):
       each point's sum is its own chain in corner order, the two chains side by side (one
       point at a time, its chain's latency was the loop's cost) */
    static inline void gs3d_corners2_d(double* __restrict r0, double* __restrict r1,
                                       const double* __restrict x, Py_ssize_t xb0,
                                       Py_ssize_t xb1, const Py_ssize_t* __restrict xd,
                                       const double* __restrict w, Py_ssize_t ws, unsigned v0,
                                       unsigned v1) {
        gs3d_v8d s0 = gs3d_v8d_zero(), s1 = gs3d_v8d_zero();
        int j;
        for (j = 0; j < 8; j++) {
            if ((v0 >> j) & 1)
                s0 = gs3d_v8d_add(s0, gs3d_v8d_mul(gs3d_v8d_set1(w[j * ws]),
                                                   gs3d_v8d_ld(x + xb0 + xd[j])));
            if ((v1 >> j) & 1)
                s1 = gs3d_v8d_add(s1, gs3d_v8d_mul(gs3d_v8d_set1(w[j * ws + 1]),
                                                   gs3d_v8d_ld(x + xb1 + xd[j])));
        }
        gs3d_v8d_st(r0, s0);
        gs3d_v8d_st(r1, s1);
    }
    /* one corner's dot vector: +0, plus go[c] * x[c] in lane c % 8, block by block (go's nb
       blocks in G; nb 0: C / 8 blocks read from go) */
    GS3D_ALWAYS_INLINE gs3d_v8d gs3d_dot8_d(const gs3d_v8d* G, const double* __restrict go,
                                            const double* __restrict xj, Py_ssize_t C,
                                            const int nb) {
        gs3d_v8d s = gs3d_v8d_zero();
        Py_ssize_t c;
        int b;
        if (nb)
            for (b = 0; b < nb; b++)
                s = gs3d_v8d_add(s, gs3d_v8d_mul(G[b], gs3d_v8d_ld(xj + 8 * b)));
        else
            for (c = 0; c < C; c += 8)
                s = gs3d_v8d_add(s, gs3d_v8d_mul(gs3d_v8d_ld(go + c), gs3d_v8d_ld(xj + c)));
        return s;
    }
    /* backward_tile's work for one float64 point, channels contiguous in the input, the
       accumulator and grad_output (go), C a multiple of 8 (nb blocks of eight kept in
       registers; 0: C / 8 at run time, read from go): d8[j] = gs3d_dot_d(go, x + xb + xd[j],
       C) for the corners j in vd (0 for the others; d8 untouched when vd is 0), then
       A[ab + ad[j] + c] += w[j * ws] * go[c] (gs3d_axpy_d) for the corners in vs, in corner
       order.  Each corner's dot is one vector from +0 (gs3d_dot8_d); the eight are reduced
       together by gs3d_reduce8_d. */
    GS3D_ALWAYS_INLINE void gs3d_point_bwd_d_body(const double* __restrict x, Py_ssize_t xb,
                                                  const Py_ssize_t* __restrict xd, double* A,
                                                  Py_ssize_t ab, const Py_ssize_t* __restrict ad,
                                                  const double* __restrict w, Py_ssize_t ws,
                                                  const double* __restrict go, unsigned vd,
                                                  unsigned vs, Py_ssize_t C,
                                                  double* __restrict d8, const int nb) {
        const gs3d_v8d z = gs3d_v8d_zero();
        gs3d_v8d G[4], wj;
        double* a;
        Py_ssize_t c;
        int j, b;
        if (!(vd | vs))
            return;         /* (go is not read) */
        for (b = 0; b < nb; b++)
            G[b] = gs3d_v8d_ld(go + 8 * b);
        if (vd) {
            const double* xp = x + xb;
            #define GS3D_DOT(J) ((vd >> (J)) & 1 ? gs3d_dot8_d(G, go, xp + xd[J], C, nb) : z)
            gs3d_reduce8_d(GS3D_DOT(0), GS3D_DOT(1), GS3D_DOT(2), GS3D_DOT(3), GS3D_DOT(4),
                           GS3D_DOT(5), GS3D_DOT(6), GS3D_DOT(7), d8);
            #undef GS3D_DOT
        }
        for (j = 0; j < 8; j++)
            if ((vs >> j) & 1) {
                wj = gs3d_v8d_set1(w[j * ws]);
                a = A + ab + ad[j];
                if (nb)
                    for (b = 0; b < nb; b++)
                        gs3d_v8d_st(a + 8 * b, gs3d_v8d_add(gs3d_v8d_ld(a + 8 * b),
                                                            gs3d_v8d_mul(wj, G[b])));
                else
                    for (c = 0; c < C; c += 8)
                        gs3d_v8d_st(a + c, gs3d_v8d_add(gs3d_v8d_ld(a + c),
                                                        gs3d_v8d_mul(wj, gs3d_v8d_ld(go + c))));
            }
    }
    GS3D_ALWAYS_INLINE void gs3d_point_bwd_d(const double* x, Py_ssize_t xb, const Py_ssize_t* xd,
                                             double* A, Py_ssize_t ab, const Py_ssize_t* ad,
                                             const double* w, Py_ssize_t ws, const double* go,
                                             unsigned vd, unsigned vs, Py_ssize_t C, double* d8) {
        switch (C) {
            case 8: gs3d_point_bwd_d_body(x, xb, xd, A, ab, ad, w, ws, go, vd, vs, 8, d8, 1); break;
            case 16: gs3d_point_bwd_d_body(x, xb, xd, A, ab, ad, w, ws, go, vd, vs, 16, d8, 2); break;
            case 24: gs3d_point_bwd_d_body(x, xb, xd, A, ab, ad, w, ws, go, vd, vs, 24, d8, 3); break;
            case 32: gs3d_point_bwd_d_body(x, xb, xd, A, ab, ad, w, ws, go, vd, vs, 32, d8, 4); break;
            default: gs3d_point_bwd_d_body(x, xb, xd, A, ab, ad, w, ws, go, vd, vs, C, d8, 0);
        }
    }
    #else
    #define GS3D_HAVE_V8D 0
    static inline void gs3d_corners2_d(double* r0, double* r1, const double* x, Py_ssize_t xb0,
                                       Py_ssize_t xb1, const Py_ssize_t* xd, const double* w,
                                       Py_ssize_t ws, unsigned v0, unsigned v1) {
        (void)r0; (void)r1; (void)x; (void)xb0; (void)xb1; (void)xd; (void)w; (void)ws;
        (void)v0; (void)v1;
    }
    static inline void gs3d_point_bwd_d(const double* x, Py_ssize_t xb, const Py_ssize_t* xd,
                                        double* A, Py_ssize_t ab, const Py_ssize_t* ad,
                                        const double* w, Py_ssize_t ws, const double* go,
                                        unsigned vd, unsigned vs, Py_ssize_t C, double* d8) {
        (void)x; (void)xb; (void)xd; (void)A; (void)ab; (void)ad; (void)w; (void)ws;
        (void)go; (void)vd; (void)vs; (void)C; (void)d8;
    }
    #endif
    /* The same dot product with 16-bit x (float16 when bf is 0, else bfloat16), eight
       channels converted at once (both exact) and summed as one vector: the lanes and the tree
       of gs3d_dot_f, so the bits of dot_channels' scalar loop.  AVX2 + F16C build only
       (GS3D_HAVE_HALF_SIMD), like gs3d_store_h below. */
    #if defined(__AVX2__) && defined(__F16C__)
    #define GS3D_HAVE_HALF_SIMD 1
    /* one 16-bit value (float16 when bf is 0, else bfloat16) as float32, exactly */
    static inline float gs3d_h_to_f32(uint16_t h, int bf) {
        uint32_t u = (uint32_t)h << 16;
        float v;
        if (!bf)
            return _cvtsh_ss(h);
        memcpy(&v, &u, 4);
        return v;
    }
    static inline float gs3d_dot_h(const float* __restrict go, const uint16_t* __restrict x,
                                   Py_ssize_t C, int bf) {
        __m256 acc = _mm256_setzero_ps(), xv;
        __m128i h;
        float s[8];
        Py_ssize_t c = 0;
        for (; c + 8 <= C; c += 8) {
            h = _mm_loadu_si128((const __m128i*)(x + c));
            xv = bf ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
                    : _mm256_cvtph_ps(h);
            acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_loadu_ps(go + c), xv));
        }
        _mm256_storeu_ps(s, acc);
        for (; c < C; c++)
            s[0] = s[0] + go[c] * gs3d_h_to_f32(x[c], bf);
        return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
    }
    /* n float32 values (a multiple of 8) rounded into 16-bit storage (float16 when bf is 0,
       else bfloat16), eight at a time: the bits of f32_to_f16 / f32_to_bf16 (round to nearest
       even; a NaN becomes, in float16, the quiet NaN of its sign, in bfloat16 its top half
       made quiet).  The caller rounds any remainder with those. */
    GS3D_ALWAYS_INLINE void gs3d_store8_h(__m256 v, uint16_t* __restrict d, int bf) {
        const __m256i one = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7fff);
        int k, nan = _mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        uint32_t u[8];
        if (bf) {
            __m256i w = _mm256_castps_si256(v);
            w = _mm256_add_epi32(w, _mm256_add_epi32(bias, _mm256_and_si256(
                _mm256_srli_epi32(w, 16), one)));
            w = _mm256_srli_epi32(w, 16);
            /* pack the low 16 bits of the eight lanes, in order */
            w = _mm256_packus_epi32(w, w);
            w = _mm256_permute4x64_epi64(w, 0x08);
            _mm_storeu_si128((__m128i*)d, _mm256_castsi256_si128(w));
        } else {
            _mm_storeu_si128((__m128i*)d, _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
        }
        if (nan) {
            _mm256_storeu_si256((__m256i*)u, _mm256_castps_si256(v));
            for (k = 0; k < 8; k++, nan >>= 1)
                if (nan & 1)
                    d[k] = bf ? (uint16_t)((u[k] >> 16) | 0x40)
                              : (uint16_t)(0x7e00 | ((u[k] >> 16) & 0x8000));
        }
    }
    static inline void gs3d_store_h(const float* __restrict a, uint16_t* __restrict d,
                                    Py_ssize_t n, int bf) {
        Py_ssize_t i;
        for (i = 0; i + 8 <= n; i += 8)
            gs3d_store8_h(_mm256_loadu_ps(a + i), d + i, bf);
    }
    #else
    static inline void gs3d_store_h(const float* a, uint16_t* d, Py_ssize_t n, int bf) {
        (void)a; (void)d; (void)n; (void)bf;
    }
    #define GS3D_HAVE_HALF_SIMD 0
    static inline float gs3d_dot_h(const float* go, const uint16_t* x, Py_ssize_t C, int bf) {
        (void)go; (void)x; (void)C; (void)bf; return 0.0f;
    }
    #endif
    /* The float32 bilinear forward (any padding), eight points per step with AVX2 (the AVX2
       build only; GS3D_HAVE_SIMD_GATHER says whether it is there).  It
       gives the bits of setup_tile + forward_tile: each axis mapped in double as gs3d_axis1
       maps it, weights rounded to float, wx * (wy * wz) per corner, corners summed from +0 in
       the order tnw .. bse with out-of-bounds corners skipped (a blend, never a read).  A point
       that samples nothing gets corner-0 index -2 on that axis, so no corner is in bounds.
       Offsets are int32: the caller checks that indices in [-2, size + 1] keep them in range
       (so do the callers of gs3d_map8 elsewhere: its indices are int32). */
    /* arguments of gs3d_backward_gather_avx2: the input x, the accumulator A (batch item
       applied, strides ax, ay, az, ac), grid q, grad_output go and grid_grad dq (points at
       steps qp, gp, dp; coordinate / channel strides qc, gc, dc), the input's strides and
       sizes, the depth slab [zlo, zhi) and the options */
    typedef struct {
        const float* x; float* A; const float* q; const float* go; float* dq;
        Py_ssize_t sx, sy, sz, xc, ax, ay, az, ac, W, H, D, C, qp, qc, gp, gc, dp, dc, zlo, zhi;
        int align, border, do_dx, do_dg, own_all;
        /* prefetch every channel plane's corner rows (else the first's) and grad_output
           ahead (gs3d_prefetch_go): items beyond the caches (the caller's prefetch_bwd) */
        int prefetch;
        /* scatter three or five to seven channels (at step 1 in A) with one masked
           read-modify-write per corner, not channel by channel: the caller sets it for tiles
           whose points scatter over the volume (on a smooth warp the next point's masked load
           of the same corner would wait for the masked store before it: 0.77-0.94x).
           In-process A/B, 2 threads, NDHWC random: 1x3x96^3 1.15x, 8x3x32^3 1.10x, 1x6x64^3
           1.43x, 1x7x64^3 1.52x; smooth 1.00-1.04x (the tile test) */
        int rmw;
        /* 16-bit storage (xk 1 float16, 2 bfloat16; 0: float32): input, grid, grad_output
           and grid_grad at xh, qh, goh, dqh instead of x, q, go, dq (the accumulator A stays
           float32); xlast: the offset from xh of the input's highest-addressed element */
        const uint16_t *xh, *qh, *goh;
        uint16_t* dqh;
        int xk;
        Py_ssize_t xlast;
    } gs3d_bwd_args;
    /* arguments of gs3d_setup_tile_f: cnt points at q, q + qp, ... (coordinate stride qc),
       float32, or 16-bit at qh of kind qk (1 float16, 2 bfloat16; converted exactly), the
       input's sizes and strides sx, sy, sz from offset xo (the batch item's), the
       accumulator's ax, ay, az, the depth slab [zlo, zhi) (all_planes: every plane) and
       setup_tile's options; out: setup_tile's arrays of a Tile of ``tile`` points */
    typedef struct {
        const float* q;
        const uint16_t* qh;
        int qk;
        Py_ssize_t qp, qc, W, H, D, xo, sx, sy, sz, ax, ay, az, zlo, zhi;
        int align, border, all_planes, do_dx, do_dg, own_all, cnt, tile;
        Py_ssize_t *xb, *ab;
        unsigned char *vd, *vs, *own;
        double *okv, *f, *w, *mult;
    } gs3d_setup_args;
    /* arguments of gs3d_backward_rows (below) */
    typedef struct {
        const float* x; float* A; const float* q; const float* go; float* dq;
        /* 16-bit storage of kind xk (1 float16, 2 bfloat16; 0: float32, these unused): the
           input, grid, grad_output and grid gradient (x, q, go and dq unused) */
        const uint16_t* xh; const uint16_t* qh; const uint16_t* goh; uint16_t* dqh;
        Py_ssize_t sx, sy, sz, ax, ay, az, W, H, D, C, qp, qc, gp, gc, dp, dc, zlo, zhi, nxt;
        int align, border, do_dx, do_dg, own_all, prefetch, lead, xk;
    } gs3d_rows_args;
    /* arguments of gs3d_backward_cl_avx2 (below) */
    typedef struct {
        const float* x; float* A; const float* go; float* dq;
        const uint16_t* xh;     /* 16-bit input (x unused), of kind xkind: 1 float16, 2 bfloat16 */
        const uint16_t* goh;    /* with xh and not staged: grad_output, 16-bit (go unused) */
        uint16_t* dqh;          /* with xh: the grid gradient, 16-bit (dq unused) */
        const Py_ssize_t *ob, *oq, *xb, *ab, *xd, *ad;
        const double *f, *w, *mult;
        const unsigned char *vd, *vs, *own;
        Py_ssize_t C, qc, px_lo, px_n, pa_lo, pa_n;
        int cnt, tile, ahead, xkind;
        int staged;             /* grad_output of point i at go + C i (else go + ob[i]) */
    } gs3d_cl_args;
    /* arguments of gs3d_forward_cl_avx2: the tile's points [i0, i1), point i written at
       out + ob[i] (ob not NULL) or out + (i - i0) * C */
    typedef struct {
        const float* x; float* out;
        const uint16_t* xh;     /* 16-bit input (x unused), of kind xkind: 1 float16, 2 bfloat16 */
        const Py_ssize_t *ob, *xb, *xd;
        const double* w;
        const unsigned char* vs;
        Py_ssize_t C, px_lo, px_n;
        int i0, i1, cnt, tile, ahead, xkind;
    } gs3d_clf_args;
    #if defined(__AVX2__)
    #include <immintrin.h>
    #define GS3D_HAVE_SIMD_GATHER 1
    /* fmod(t, per) of four lanes, t >= 0 (or NaN) and per > 0 an integer:
       t - floor(t / per) per, corrected by one period when the quotient rounded up (which
       float32 and 16-bit grids never reach, kept for exactness); exact, as fmod is, while
       t < 2^52 (t and the period's multiples are then whole multiples of t's last bit); the
       lanes in ``use`` with larger t, infinities or NaN go through fmod itself */
    static inline __m256d gs3d_fmod4(__m256d t, __m256d per, __m256d use) {
        const __m256d zero = _mm256_setzero_pd();
        __m256d r = _mm256_sub_pd(t, _mm256_mul_pd(_mm256_floor_pd(_mm256_div_pd(t, per)), per));
        int big, l;
        r = _mm256_blendv_pd(r, _mm256_add_pd(r, per), _mm256_cmp_pd(r, zero, _CMP_LT_OQ));
        big = _mm256_movemask_pd(_mm256_and_pd(
            use, _mm256_cmp_pd(t, _mm256_set1_pd(4503599627370496.0), _CMP_NLT_UQ)));
        if (big) {
            double tv[4], rv[4], pv[4];
            _mm256_storeu_pd(tv, t);
            _mm256_storeu_pd(rv, r);
            _mm256_storeu_pd(pv, per);
            for (l = 0; l < 4; l++)
                if ((big >> l) & 1)
                    rv[l] = fmod(tv[l], pv[l]);
            r = _mm256_loadu_pd(rv);
        }
        return r;
    }
    static inline void gs3d_map4(__m256d gv, double sz, int align, int border,
                                 __m256d* fl, __m256d* fr, __m256d* okm, __m256d* mult) {
        const __m256d zero = _mm256_setzero_pd(), one = _mm256_set1_pd(1.0);
        const __m256d two = _mm256_set1_pd(2.0), szv = _mm256_set1_pd(sz);
        const __m256d hi = _mm256_set1_pd(sz - 1.0);
        __m256d u, ok, uc, f, m = _mm256_set1_pd(align ? (sz - 1.0) / 2.0 : sz / 2.0);
        if (align)
            u = _mm256_mul_pd(_mm256_div_pd(_mm256_add_pd(gv, one), two), hi);
        else
            u = _mm256_div_pd(_mm256_sub_pd(_mm256_mul_pd(_mm256_add_pd(gv, one), szv), one), two);
        if (border == GS3D_PAD_REFLECTION) {
            /* map_coord's reflection (gs3d_reflect1) lane by lane: finite coordinates only;
               t = u - lo folded into [0, 2 span) (gs3d_fmod4), then into [lo, lo + span] with
               the multiplier's sign flipped at each mirror; clipped below */
            const double lo = align ? 0.0 : -0.5, span = align ? sz - 1.0 : sz;
            const __m256d sign = _mm256_set1_pd(-0.0);
            ok = _mm256_cmp_pd(_mm256_sub_pd(gv, gv), zero, _CMP_EQ_OQ);
            if (span == 0.0) {
                u = zero;
                m = zero;
            } else {
                const __m256d lov = _mm256_set1_pd(lo), spv = _mm256_set1_pd(span);
                const __m256d per = _mm256_set1_pd(2.0 * span);
                __m256d t = _mm256_sub_pd(u, lov), neg, r, up;
                neg = _mm256_and_pd(_mm256_cmp_pd(t, zero, _CMP_LT_OQ), sign);
                m = _mm256_xor_pd(m, neg);
                t = _mm256_xor_pd(t, neg);
                r = gs3d_fmod4(t, per, ok);
                up = _mm256_cmp_pd(r, spv, _CMP_GE_OQ);
                u = _mm256_blendv_pd(_mm256_add_pd(r, lov),
                                     _mm256_add_pd(lov, _mm256_sub_pd(spv, _mm256_sub_pd(r, spv))),
                                     up);
                m = _mm256_xor_pd(m, _mm256_and_pd(up, sign));
                ok = _mm256_and_pd(ok, _mm256_cmp_pd(u, u, _CMP_EQ_OQ));   /* overflowed */
            }
        } else if (border) {
            __m256d edge = _mm256_blendv_pd(hi, zero, _mm256_cmp_pd(gv, zero, _CMP_LT_OQ));
            __m256d fin = _mm256_cmp_pd(_mm256_sub_pd(gv, gv), zero, _CMP_EQ_OQ);
            u = _mm256_blendv_pd(edge, u, fin);
            ok = _mm256_cmp_pd(gv, gv, _CMP_EQ_OQ);
        } else {
            ok = _mm256_cmp_pd(_mm256_sub_pd(gv, gv), zero, _CMP_EQ_OQ);
        }
        if (border) {
            /* border and reflection clip u to [0, size - 1] (clip_coord): the factor is 0 at
               and beyond the edges */
            m = _mm256_and_pd(m, _mm256_and_pd(_mm256_cmp_pd(u, zero, _CMP_GT_OQ),
                                               _mm256_cmp_pd(u, hi, _CMP_LT_OQ)));
            u = _mm256_blendv_pd(u, zero, _mm256_cmp_pd(u, zero, _CMP_LE_OQ));
            u = _mm256_blendv_pd(u, hi, _mm256_cmp_pd(u, hi, _CMP_GE_OQ));
        }
        u = _mm256_and_pd(u, ok);
        *okm = ok;
        *mult = _mm256_and_pd(m, ok);
        uc = _mm256_blendv_pd(u, _mm256_set1_pd(-2.0), _mm256_cmp_pd(u, _mm256_set1_pd(-2.0), _CMP_LT_OQ));
        uc = _mm256_blendv_pd(uc, _mm256_set1_pd(sz + 1.0),
                              _mm256_cmp_pd(uc, _mm256_set1_pd(sz + 1.0), _CMP_GT_OQ));
        f = _mm256_floor_pd(uc);
        *fr = _mm256_sub_pd(u, f);
        *fl = _mm256_blendv_pd(_mm256_set1_pd(-2.0), f, ok);
    }
    /* eight input values at offset off as float32 (exact) */
    GS3D_ALWAYS_INLINE __m256 gs3d_cl_ld8(const float* x, const uint16_t* xh, Py_ssize_t off,
                                          const int xk) {
        if (xk == 0) return _mm256_loadu_ps(x + off);
    #if defined(__F16C__)
        if (xk == 1) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(xh + off)));
    #else
    #error "the AVX2 kernels need F16C (-mf16c)"
    #endif
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(
            _mm_loadu_si128((const __m128i*)(xh + off))), 16));
    }
    /* The input values at element offsets off (lanes in mask m; the others 0) as float32:
       float32 x (xk 0) by a masked gather; 16-bit xh (xk 1 float16, 2 bfloat16) by a masked
       gather of the 32-bit word at each offset, whose low half is the value (x86 is
       little-endian), converted exactly.  That word reaches one element further, so a lane at
       ``last``, the highest-addressed element of the array (an offset from xh), is read on its
       own instead. */
    GS3D_ALWAYS_INLINE __m256 gs3d_gather8(const float* x, const uint16_t* xh, const int xk,
                                           __m256i off, __m256i m, Py_ssize_t last) {
        __m256i edge, w;
        int e, l, wv[8];
        if (xk == 0)
            return _mm256_mask_i32gather_ps(_mm256_setzero_ps(), x, off, _mm256_castsi256_ps(m), 4);
        edge = last > 2147483647 ? _mm256_setzero_si256()
            : _mm256_and_si256(m, _mm256_cmpeq_epi32(off, _mm256_set1_epi32((int)last)));
        w = _mm256_mask_i32gather_epi32(_mm256_setzero_si256(), (const int*)xh, off,
                                        _mm256_andnot_si256(edge, m), 2);
        e = _mm256_movemask_ps(_mm256_castsi256_ps(edge));
        if (e) {
            _mm256_storeu_si256((__m256i*)wv, w);
            for (l = 0; l < 8; l++)
                if ((e >> l) & 1)
                    wv[l] = xh[last];
            w = _mm256_loadu_si256((const __m256i*)wv);
        }
        if (xk == 2)
            return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
        /* the low halves of the eight words, packed in order */
        w = _mm256_shuffle_epi8(w, _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1,
                                                    -1, -1, -1, 0, 1, 4, 5, 8, 9, 12, 13, -1, -1,
                                                    -1, -1, -1, -1, -1, -1));
        return _mm256_cvtph_ps(_mm256_castsi256_si128(_mm256_permute4x64_epi64(w, 0x08)));
    }
    /* The float32 values at element offsets off (a) and off + 1 (b) of the lanes in mask m
       (the others 0), both elements of a lane read by one 64-bit gather lane: half the
       gathered elements of two gs3d_gather8 calls, which cost per element (this host:
       two 4-lane 64-bit gathers took 0.75-0.8x the time of one 8-lane 32-bit gather).  Both
       elements of a lane in m must lie in the array.  In the gather forward, in-process A/B,
       2 threads, same bits: 1x1x128^3 NCDHW smooth 1.11x, random 1.06x (one thread NDHWC
       1.02x, 1.07x), 1x2x96^3 NCDHW smooth 1.05x, 1x3x64^3 NCDHW random 1.08x; the
       backward's corner values read the same way gained nothing (1x1x128^3 0.97-1.02x,
       1x3x64^3 NCDHW 1.04-1.11x, 2x2x64^3 0.97x) and read with gs3d_gather8. */
    GS3D_ALWAYS_INLINE void gs3d_gather_pairs8(const float* x, __m256i off, __m256i m,
                                               __m256* a, __m256* b) {
        const __m128i ol = _mm256_castsi256_si128(off), oh = _mm256_extracti128_si256(off, 1);
        const __m128i ml = _mm256_castsi256_si128(m), mh = _mm256_extracti128_si256(m, 1);
        /* points 0 1 4 5 and 2 3 6 7, so that the shuffles below give the points in order */
        const __m256d g0 = _mm256_mask_i32gather_pd(
            _mm256_setzero_pd(), (const double*)x, _mm_unpacklo_epi64(ol, oh),
            _mm256_castsi256_pd(_mm256_cvtepi32_epi64(_mm_unpacklo_epi64(ml, mh))), 4);
        const __m256d g1 = _mm256_mask_i32gather_pd(
            _mm256_setzero_pd(), (const double*)x, _mm_unpackhi_epi64(ol, oh),
            _mm256_castsi256_pd(_mm256_cvtepi32_epi64(_mm_unpackhi_epi64(ml, mh))), 4);
        *a = _mm256_shuffle_ps(_mm256_castpd_ps(g0), _mm256_castpd_ps(g1), _MM_SHUFFLE(2, 0, 2, 0));
        *b = _mm256_shuffle_ps(_mm256_castpd_ps(g0), _mm256_castpd_ps(g1), _MM_SHUFFLE(3, 1, 3, 1));
    }
    /* one value (input, or a grid coordinate) as float32 (exact), as gs3d_cl_ld8 */
    GS3D_ALWAYS_INLINE float gs3d_cl_ld1(const float* x, const uint16_t* xh, Py_ssize_t off,
                                         const int xk) {
        return xk == 0 ? x[off] : gs3d_h_to_f32(xh[off], xk == 2);
    }
    /* the k (<= 8) values at off, off + step, ... as float32 (exact, as gs3d_cl_ld1), lanes
       past k ``fill``: built in registers (eight scalar stores read back as one vector would
       stall store forwarding) */
    GS3D_ALWAYS_INLINE __m256 gs3d_ld8_step(const float* x, const uint16_t* xh, const int xk,
                                            Py_ssize_t off, Py_ssize_t step, int k, float fill) {
        if (k == 8)
            return _mm256_setr_ps(gs3d_cl_ld1(x, xh, off, xk), gs3d_cl_ld1(x, xh, off + step, xk),
                                  gs3d_cl_ld1(x, xh, off + 2 * step, xk),
                                  gs3d_cl_ld1(x, xh, off + 3 * step, xk),
                                  gs3d_cl_ld1(x, xh, off + 4 * step, xk),
                                  gs3d_cl_ld1(x, xh, off + 5 * step, xk),
                                  gs3d_cl_ld1(x, xh, off + 6 * step, xk),
                                  gs3d_cl_ld1(x, xh, off + 7 * step, xk));
        return _mm256_setr_ps(gs3d_cl_ld1(x, xh, off, xk),
                              k > 1 ? gs3d_cl_ld1(x, xh, off + step, xk) : fill,
                              k > 2 ? gs3d_cl_ld1(x, xh, off + 2 * step, xk) : fill,
                              k > 3 ? gs3d_cl_ld1(x, xh, off + 3 * step, xk) : fill,
                              k > 4 ? gs3d_cl_ld1(x, xh, off + 4 * step, xk) : fill,
                              k > 5 ? gs3d_cl_ld1(x, xh, off + 5 * step, xk) : fill,
                              k > 6 ? gs3d_cl_ld1(x, xh, off + 6 * step, xk) : fill, fill);
    }
    /* The depth planes [*lo, *hi] that the cnt (> 0) float32 points at q, q + qp, ... (z at
       q + 2 qc) need under bilinear padding ``border`` (GS3D_PAD_*): tile_planes' hull of
       planes_needed (corner planes z0, z0 + 1 and the key plane; a point that samples
       nothing needs plane 0 only), four points at a time, z mapped by gs3d_map4 (the
       mapping of axis_index).  The last point fills the lanes past cnt (the same planes
       again).  16-bit points (gs3d_tile_planes_h: float16, or bfloat16 with ``bf``) are
       converted exactly first, so the planes are those of the scalar loop too. */
    GS3D_ALWAYS_INLINE void gs3d_tile_planes_body(const float* qf, const uint16_t* qh,
                                                  const int xk, Py_ssize_t qp, Py_ssize_t qc,
                                                  Py_ssize_t cnt, Py_ssize_t D, int align,
                                                  int border, Py_ssize_t* lo, Py_ssize_t* hi) {
        const double sz = (double)D;
        const __m256d zero = _mm256_setzero_pd(), one = _mm256_set1_pd(1.0);
        const __m256d top = _mm256_set1_pd(sz - 1.0);
        __m256d vlo = _mm256_set1_pd(sz), vhi = _mm256_set1_pd(-1.0);
        __m256d fl, fr, ok, m, key;
        double r[4];
        const Py_ssize_t z = 2 * qc;
        Py_ssize_t p, e = cnt - 1;
        int l;
        for (p = 0; p < cnt; p += 4) {
            /* built in registers: a vector load of four separate stores would stall */
            const __m128 zv = _mm_setr_ps(gs3d_cl_ld1(qf, qh, z + p * qp, xk),
                                          gs3d_cl_ld1(qf, qh, z + (p + 1 < cnt ? p + 1 : e) * qp, xk),
                                          gs3d_cl_ld1(qf, qh, z + (p + 2 < cnt ? p + 2 : e) * qp, xk),
                                          gs3d_cl_ld1(qf, qh, z + (p + 3 < cnt ? p + 3 : e) * qp, xk));
            gs3d_map4(_mm256_cvtps_pd(zv), sz, align, border, &fl, &fr, &ok, &m);
            /* key_of: z0 clamped to [0, D - 1], 0 when nothing is sampled (fl is then -2) */
            key = _mm256_min_pd(_mm256_max_pd(fl, zero), top);
            vlo = _mm256_min_pd(vlo, _mm256_and_pd(_mm256_min_pd(key, fl), ok));
            vhi = _mm256_max_pd(vhi, _mm256_and_pd(_mm256_max_pd(key, _mm256_add_pd(fl, one)), ok));
        }
        _mm256_storeu_pd(r, vlo);
        *lo = (Py_ssize_t)r[0];
        for (l = 1; l < 4; l++) if ((Py_ssize_t)r[l] < *lo) *lo = (Py_ssize_t)r[l];
        _mm256_storeu_pd(r, vhi);
        *hi = (Py_ssize_t)r[0];
        for (l = 1; l < 4; l++) if ((Py_ssize_t)r[l] > *hi) *hi = (Py_ssize_t)r[l];
    }
    static void gs3d_tile_planes_f(const float* q, Py_ssize_t qp, Py_ssize_t qc,
                                   Py_ssize_t cnt, Py_ssize_t D, int align, int border,
                                   Py_ssize_t* lo, Py_ssize_t* hi) {
        gs3d_tile_planes_body(q, NULL, 0, qp, qc, cnt, D, align, border, lo, hi);
    }
    static void gs3d_tile_planes_h(const uint16_t* q, int bf, Py_ssize_t qp, Py_ssize_t qc,
                                   Py_ssize_t cnt, Py_ssize_t D, int align, int border,
                                   Py_ssize_t* lo, Py_ssize_t* hi) {
        if (bf)
            gs3d_tile_planes_body(NULL, q, 2, qp, qc, cnt, D, align, border, lo, hi);
        else
            gs3d_tile_planes_body(NULL, q, 1, qp, qc, cnt, D, align, border, lo, hi);
    }
    /* one axis of eight points: int32 corner-0 index, in-bounds masks of corners 0 and 1, and
       the float weights (1 - frac, frac) */
    static inline __m128i gs3d_mask_pd_to_epi32(__m256d m) {
        /* the low halves of four all-ones / all-zeros 64-bit lanes, as four 32-bit lanes */
        return _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(
            _mm256_castpd_si256(m), _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7)));
    }
    #if defined(__AVX512F__) && defined(__AVX512DQ__) && defined(__AVX512VL__)
    /* The AVX-512 build maps the eight points of an axis in one 512-bit pass of doubles: the
       operations of gs3d_map4 lane by lane, its masks as mask registers (x / 2 and x * 0.5
       round alike), so the same bits as the AVX2 build's two 256-bit passes below. */
    static inline void gs3d_axis8_256(__m256 c, double sz, int align, int border,
                                      __m256i* idx, __m256i* in0, __m256i* in1, __m256* w0,
                                      __m256* w1, __m256i* ok, __m256* mult);
    static inline void gs3d_axis8(__m256 c, double sz, int align, int border,
                                  __m256i* idx, __m256i* in0, __m256i* in1, __m256* w0,
                                  __m256* w1, __m256i* okv, __m256* mult) {
        if (border == GS3D_PAD_REFLECTION) {
            /* reflection: gs3d_map4's two passes (the AVX2 build's bits) */
            gs3d_axis8_256(c, sz, align, border, idx, in0, in1, w0, w1, okv, mult);
            return;
        }
        const __m512d zero = _mm512_setzero_pd(), one = _mm512_set1_pd(1.0);
        const __m512d two = _mm512_set1_pd(2.0), szv = _mm512_set1_pd(sz);
        const __m512d hi = _mm512_set1_pd(sz - 1.0);
        const __m512d gv = _mm512_cvtps_pd(c);
        const int n = (int)sz;
        __m512d u, uc, f, fl, fr, m = _mm512_set1_pd(align ? (sz - 1.0) / 2.0 : sz / 2.0);
        __mmask8 ok;
        if (align)
            u = _mm512_mul_pd(_mm512_div_pd(_mm512_add_pd(gv, one), two), hi);
        else
            u = _mm512_div_pd(_mm512_sub_pd(_mm512_mul_pd(_mm512_add_pd(gv, one), szv), one), two);
        if (border) {
            __m512d edge = _mm512_mask_blend_pd(_mm512_cmp_pd_mask(gv, zero, _CMP_LT_OQ), hi, zero);
            __mmask8 fin = _mm512_cmp_pd_mask(_mm512_sub_pd(gv, gv), zero, _CMP_EQ_OQ);
            u = _mm512_mask_blend_pd(fin, edge, u);
            m = _mm512_maskz_mov_pd(_mm512_cmp_pd_mask(u, zero, _CMP_GT_OQ)
                                    & _mm512_cmp_pd_mask(u, hi, _CMP_LT_OQ), m);
            u = _mm512_mask_blend_pd(_mm512_cmp_pd_mask(u, zero, _CMP_LE_OQ), u, zero);
            u = _mm512_mask_blend_pd(_mm512_cmp_pd_mask(u, hi, _CMP_GE_OQ), u, hi);
            ok = _mm512_cmp_pd_mask(gv, gv, _CMP_EQ_OQ);
        } else {
            ok = _mm512_cmp_pd_mask(_mm512_sub_pd(gv, gv), zero, _CMP_EQ_OQ);
        }
        u = _mm512_maskz_mov_pd(ok, u);
        m = _mm512_maskz_mov_pd(ok, m);
        uc = _mm512_mask_blend_pd(_mm512_cmp_pd_mask(u, _mm512_set1_pd(-2.0), _CMP_LT_OQ), u,
                                  _mm512_set1_pd(-2.0));
        uc = _mm512_mask_blend_pd(_mm512_cmp_pd_mask(uc, _mm512_set1_pd(sz + 1.0), _CMP_GT_OQ),
                                  uc, _mm512_set1_pd(sz + 1.0));
        f = _mm512_roundscale_pd(uc, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
        fr = _mm512_sub_pd(u, f);
        fl = _mm512_mask_blend_pd(ok, _mm512_set1_pd(-2.0), f);
        *okv = _mm256_movm_epi32(ok);
        *mult = _mm512_cvtpd_ps(m);
        *idx = _mm512_cvttpd_epi32(fl);
        *in0 = _mm256_and_si256(_mm256_cmpgt_epi32(*idx, _mm256_set1_epi32(-1)),
                                _mm256_cmpgt_epi32(_mm256_set1_epi32(n), *idx));
        *in1 = _mm256_and_si256(_mm256_cmpgt_epi32(*idx, _mm256_set1_epi32(-2)),
                                _mm256_cmpgt_epi32(_mm256_set1_epi32(n - 1), *idx));
        *w1 = _mm512_cvtpd_ps(fr);
        *w0 = _mm512_cvtpd_ps(_mm512_sub_pd(one, fr));
    }
    #else
    static inline void gs3d_axis8_256(__m256 c, double sz, int align, int border,
                                      __m256i* idx, __m256i* in0, __m256i* in1, __m256* w0,
                                      __m256* w1, __m256i* ok, __m256* mult);
    static inline void gs3d_axis8(__m256 c, double sz, int align, int border,
                                  __m256i* idx, __m256i* in0, __m256i* in1, __m256* w0,
                                  __m256* w1, __m256i* ok, __m256* mult) {
        gs3d_axis8_256(c, sz, align, border, idx, in0, in1, w0, w1, ok, mult);
    }
    #endif
    /* one axis of eight points as two passes of gs3d_map4 (border: GS3D_PAD_*) */
    static inline void gs3d_axis8_256(__m256 c, double sz, int align, int border,
                                      __m256i* idx, __m256i* in0, __m256i* in1, __m256* w0,
                                      __m256* w1, __m256i* ok, __m256* mult) {
        __m256d fl0, fr0, fl1, fr1, ok0, ok1, m0, m1;
        const __m256d one = _mm256_set1_pd(1.0);
        const int n = (int)sz;
        gs3d_map4(_mm256_cvtps_pd(_mm256_castps256_ps128(c)), sz, align, border, &fl0, &fr0,
                  &ok0, &m0);
        gs3d_map4(_mm256_cvtps_pd(_mm256_extractf128_ps(c, 1)), sz, align, border, &fl1, &fr1,
                  &ok1, &m1);
        *ok = _mm256_set_m128i(gs3d_mask_pd_to_epi32(ok1), gs3d_mask_pd_to_epi32(ok0));
        *mult = _mm256_set_m128(_mm256_cvtpd_ps(m1), _mm256_cvtpd_ps(m0));
        *idx = _mm256_set_m128i(_mm256_cvttpd_epi32(fl1), _mm256_cvttpd_epi32(fl0));
        *in0 = _mm256_and_si256(_mm256_cmpgt_epi32(*idx, _mm256_set1_epi32(-1)),
                                _mm256_cmpgt_epi32(_mm256_set1_epi32(n), *idx));
        *in1 = _mm256_and_si256(_mm256_cmpgt_epi32(*idx, _mm256_set1_epi32(-2)),
                                _mm256_cmpgt_epi32(_mm256_set1_epi32(n - 1), *idx));
        *w1 = _mm256_set_m128(_mm256_cvtpd_ps(fr1), _mm256_cvtpd_ps(fr0));
        *w0 = _mm256_set_m128(_mm256_cvtpd_ps(_mm256_sub_pd(one, fr1)),
                              _mm256_cvtpd_ps(_mm256_sub_pd(one, fr0)));
    }
    /* Load and map the k (<= 8) points at q, q + qp, ... (coordinate stride qc): per axis
       (x, y, z) the int32 corner-0 index idx, the in-bounds masks of corners 0 and 1 into
       m[2 axis], m[2 axis + 1], the weights into w[...] alike, and the sample and multiplier
       masks of gs3d_axis8.  Lanes past k are NaN: they sample nothing. */
    static inline void gs3d_map8(const float* q, const uint16_t* qh, const int qk,
                                 Py_ssize_t qp, Py_ssize_t qc, int k,
                                 Py_ssize_t W, Py_ssize_t H, Py_ssize_t D, int align, int border,
                                 __m256i* idx, __m256i* m, __m256* w, __m256i* ok,
                                 __m256* mult) {
        const double size[3] = {(double)W, (double)H, (double)D};
        __m256 c[3];
        float t[8];
        int l, a;
        for (a = 0; a < 3; a++) {
            const Py_ssize_t g = a * qc;
            if (k == 8) {
                c[a] = gs3d_ld8_step(q, qh, qk, g, qp, 8, NAN);
            } else {
                /* a partial block through memory: gs3d_ld8_step's conditional lanes here
                   made the gather forward 8-10% slower (code layout of this inlined path) */
                for (l = 0; l < 8; l++)
                    t[l] = l < k ? gs3d_cl_ld1(q, qh, g + l * qp, qk) : NAN;
                c[a] = _mm256_loadu_ps(t);
            }
        }
        for (a = 0; a < 3; a++)
            gs3d_axis8(c[a], size[a], align, border, &idx[a], &m[2 * a], &m[2 * a + 1],
                       &w[2 * a], &w[2 * a + 1], &ok[a], &mult[a]);
    }
    /* idx[2] * sz + idx[1] * sy + idx[0] * sx, lane by lane (int32) */
    static inline __m256i gs3d_offset8(const __m256i* idx, Py_ssize_t sx, Py_ssize_t sy,
                                       Py_ssize_t sz) {
        return _mm256_add_epi32(_mm256_add_epi32(
            _mm256_mullo_epi32(idx[2], _mm256_set1_epi32((int)sz)),
            _mm256_mullo_epi32(idx[1], _mm256_set1_epi32((int)sy))),
            _mm256_mullo_epi32(idx[0], _mm256_set1_epi32((int)sx)));
    }
    /* one block of eight points after mapping: int32 offset of corner 0, the in-bounds masks
       of corners 0 and 1 per axis and the weights (1 - frac, frac) per axis */
    typedef struct { __m256i base, m[6]; __m256 w[6]; } gs3d_block8;
    /* corner j = 4 cz + 2 cy + cx of eight mapped points, from the per-axis in-bounds masks
       m[2 axis + c] and weights w[2 axis + c] (gs3d_map8): in bounds along all three axes, and
       its weight wx * (wy * wz) (setup_tile's association) */
    GS3D_ALWAYS_INLINE __m256i gs3d_corner_mask8(const __m256i* m, int j) {
        return _mm256_and_si256(_mm256_and_si256(m[j & 1], m[2 + ((j >> 1) & 1)]), m[4 + (j >> 2)]);
    }
    GS3D_ALWAYS_INLINE __m256 gs3d_corner_weight8(const __m256* w, int j) {
        return _mm256_mul_ps(w[j & 1], _mm256_mul_ps(w[2 + ((j >> 1) & 1)], w[4 + (j >> 2)]));
    }
    /* Prefetch the four x-rows of corners (y, z) .. (y + 1, z + 1) of the lanes of ``lanes``
       (bits) whose first corner sits ``off`` floats from ``v``: hints only, an address outside
       the volume cannot fault. */
    static inline void gs3d_prefetch_corner_rows8(const float* v, __m256i off, unsigned lanes,
                                                  Py_ssize_t sy, Py_ssize_t sz) {
        int bo[8], l;
        _mm256_storeu_si256((__m256i*)bo, off);
        for (l = 0; l < 8; l++) {
            if ((lanes >> l) & 1) {
                const char* c0 = (const char*)v + 4 * (Py_ssize_t)bo[l];
                gs3d_prefetch(c0);
                gs3d_prefetch(c0 + 4 * sy);
                gs3d_prefetch(c0 + 4 * sz);
                gs3d_prefetch(c0 + 4 * (sy + sz));
            }
        }
    }
    /* gs3d_prefetch_corner_rows8 for each of the C channel planes (element step xc) */
    static inline void gs3d_prefetch_corner_rows8c(const float* v, __m256i off, unsigned lanes,
                                                   Py_ssize_t sy, Py_ssize_t sz, Py_ssize_t xc,
                                                   Py_ssize_t C) {
        Py_ssize_t c;
        for (c = 0; c < C; c++)
            gs3d_prefetch_corner_rows8(v + c * xc, off, lanes, sy, sz);
    }
    /* prefetch_span: every cache line of [p, p + n), n > 0 */
    GS3D_ALWAYS_INLINE void gs3d_cl_span(const char* p, Py_ssize_t n) {
        const char* end = p + n;
        if (n <= 64) { gs3d_prefetch(p); gs3d_prefetch(end - 1); return; }
        p -= ((size_t)p) & 63;
        for (; p < end; p += 64) gs3d_prefetch(p);
    }
    /* v[i][j] <- v[j][i] (8 x 8 floats) */
    GS3D_ALWAYS_INLINE void gs3d_transpose8(__m256* v) {
        __m256 t[8], u[8];
        int i;
        for (i = 0; i < 8; i += 2) {
            t[i] = _mm256_unpacklo_ps(v[i], v[i + 1]);
            t[i + 1] = _mm256_unpackhi_ps(v[i], v[i + 1]);
        }
        for (i = 0; i < 8; i += 4) {
            u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
            u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
            u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
            u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
        }
        for (i = 0; i < 4; i++) {
            v[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
            v[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
        }
    }
    /* the same for whole rows: nbytes from lo bytes after each corner row's x0, in a volume
       of isz-byte elements */
    static inline void gs3d_prefetch_rows8(const void* v, Py_ssize_t isz, __m256i off,
                                           unsigned lanes, Py_ssize_t sy, Py_ssize_t sz,
                                           Py_ssize_t lo, Py_ssize_t nbytes) {
        int bo[8], l;
        _mm256_storeu_si256((__m256i*)bo, off);
        for (l = 0; l < 8; l++) {
            if ((lanes >> l) & 1) {
                const char* c0 = (const char*)v + isz * (Py_ssize_t)bo[l] + lo;
                gs3d_cl_span(c0, nbytes);
                gs3d_cl_span(c0 + isz * sy, nbytes);
                gs3d_cl_span(c0 + isz * sz, nbytes);
                gs3d_cl_span(c0 + isz * (sy + sz), nbytes);
            }
        }
    }
    /* the first n floats at p (n <= 4, or <= 8 for the 256-bit pair), the other lanes 0,
       and nothing past them read; the store writes the first n lanes of v alone */
    GS3D_ALWAYS_INLINE __m128 gs3d_ld4n(const float* p, int n) {
    #if defined(__AVX512F__) && defined(__AVX512VL__)
        return _mm_maskz_loadu_ps((__mmask8)((1u << n) - 1), p);
    #else
        return _mm_maskload_ps(p, _mm_cmpgt_epi32(_mm_set1_epi32(n), _mm_setr_epi32(0, 1, 2, 3)));
    #endif
    }
    GS3D_ALWAYS_INLINE void gs3d_st4n(float* p, __m128 v, int n) {
    #if defined(__AVX512F__) && defined(__AVX512VL__)
        _mm_mask_storeu_ps(p, (__mmask8)((1u << n) - 1), v);
    #else
        _mm_maskstore_ps(p, _mm_cmpgt_epi32(_mm_set1_epi32(n), _mm_setr_epi32(0, 1, 2, 3)), v);
    #endif
    }
    GS3D_ALWAYS_INLINE __m256 gs3d_ld8n(const float* p, int n) {
    #if defined(__AVX512F__) && defined(__AVX512VL__)
        return _mm256_maskz_loadu_ps((__mmask8)((1u << n) - 1), p);
    #else
        return _mm256_maskload_ps(p, _mm256_cmpgt_epi32(_mm256_set1_epi32(n),
                                                        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
    #endif
    }
    GS3D_ALWAYS_INLINE void gs3d_st8n(float* p, __m256 v, int n) {
    #if defined(__AVX512F__) && defined(__AVX512VL__)
        _mm256_mask_storeu_ps(p, (__mmask8)((1u << n) - 1), v);
    #else
        _mm256_maskstore_ps(p, _mm256_cmpgt_epi32(_mm256_set1_epi32(n),
                                                  _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)), v);
    #endif
    }
    /* k points' sums of eight channels (sv[l], channel j in lane j) into the first nc channel
       runs dst[j * ds + l] (channels strided, points at step 1): a full block of eight points
       by a transposition in registers (in place: sv is overwritten) */
    GS3D_ALWAYS_INLINE void gs3d_runs8(__m256* sv, float* dst, Py_ssize_t ds, int k, int nc) {
        float r[8];
        int l, j;
        if (k == 8) {
            gs3d_transpose8(sv);
            for (j = 0; j < nc; j++)
                _mm256_storeu_ps(dst + j * ds, sv[j]);
            return;
        }
        for (l = 0; l < k; l++) {
            _mm256_storeu_ps(r, sv[l]);
            for (j = 0; j < nc; j++)
                dst[l + j * ds] = r[j];
        }
    }
    /* eight points' four channels (r[l]: point l's) as four channel vectors (v[c]: channel
       c of the eight points) */
    GS3D_ALWAYS_INLINE void gs3d_channels4x8(const __m128* r, __m256* v) {
        __m128 a0 = r[0], a1 = r[1], a2 = r[2], a3 = r[3];
        __m128 b0 = r[4], b1 = r[5], b2 = r[6], b3 = r[7];
        _MM_TRANSPOSE4_PS(a0, a1, a2, a3);
        _MM_TRANSPOSE4_PS(b0, b1, b2, b3);
        v[0] = _mm256_set_m128(b0, a0);
        v[1] = _mm256_set_m128(b1, a1);
        v[2] = _mm256_set_m128(b2, a2);
        v[3] = _mm256_set_m128(b3, a3);
    }
    /* the same as gs3d_runs8 for four channels (sv[l]: point l's four sums) */
    GS3D_ALWAYS_INLINE void gs3d_runs4(__m128* sv, float* dst, Py_ssize_t ds, int k) {
        float r[4];
        __m256 v[4];
        int l, j;
        if (k == 8) {
            gs3d_channels4x8(sv, v);
            for (j = 0; j < 4; j++)
                _mm256_storeu_ps(dst + j * ds, v[j]);
            return;
        }
        for (l = 0; l < k; l++) {
            _mm_storeu_ps(r, sv[l]);
            for (j = 0; j < 4; j++)
                dst[l + j * ds] = r[j];
        }
    }
    /* the same into 16-bit channel runs, each value rounded as gs3d_store8_h rounds */
    GS3D_ALWAYS_INLINE void gs3d_runs8h(__m256* sv, uint16_t* dst, Py_ssize_t ds, int k,
                                        int bf) {
        uint16_t r[8];
        int l, j;
        if (k == 8) {
            gs3d_transpose8(sv);
            for (j = 0; j < 8; j++)
                gs3d_store8_h(sv[j], dst + j * ds, bf);
            return;
        }
        for (l = 0; l < k; l++) {
            gs3d_store8_h(sv[l], r, bf);
            for (j = 0; j < 8; j++)
                dst[l + j * ds] = r[j];
        }
    }
    /* cnt points: coordinates q[p * qp + k * qc] (k = x, y, z), results out[p * op + c * oc];
       the input x (batch item applied) has element strides sx, sy, sz, xc along W, H, D and
       the C channels.  Tiles of 64 points: all blocks mapped first, with a prefetch of each
       point's four corner rows (in every channel plane), then, channel by channel, the gathers,
       so that the rows have a tile's worth of time to arrive.  With the channels contiguous
       in the input and either contiguous in the output or with the output's points at step 1
       (NCDHW), and C a multiple of 8 (``rows``), the whole corner rows are prefetched and
       each point's channels are summed eight at a time with contiguous loads instead (same
       arithmetic, per channel and corner; sixteen at a time in the AVX-512 build when C is a
       multiple of 16, and without mask tests for a point whose eight corners are all in
       bounds); into NCDHW, eight points' sums are transposed into eight channel runs.  Four
       channels contiguous in the input (``rows4``) take one 128-bit load per corner the same
       way, into NCDHW eight points' sums transposed into four channel runs; two, three and
       five to seven (``rowsm``) one masked load per corner (gs3d_ld8n: nothing
       past the channels read), masked stores into NDHWC and as many channel runs as channels
       into NCDHW.  In-process A/B against the gathers, 2 threads, same bits: 1x3x96^3 NDHWC
       smooth 1.32x, random 1.30x, 8x3x32^3 1.38x, 1x6x96^3 smooth 1.87x, random 2.66x,
       1x2x96^3 1.08x (four and eight channels, one channel 0.99-1.02x).  float32 rows at
       step 1 (one channel, or channel planes) read both x corners of a row at once
       (gs3d_gather_pairs8) in the blocks where no point has one x corner in bounds and the
       other out. */
    GS3D_ALWAYS_INLINE void gs3d_forward_gather_body(const float* x, const uint16_t* xh,
                                     const int xk, Py_ssize_t sx, Py_ssize_t sy,
                                     Py_ssize_t sz, Py_ssize_t W, Py_ssize_t H, Py_ssize_t D,
                                     const Py_ssize_t C, Py_ssize_t xc, const float* q,
                                     const uint16_t* qh, Py_ssize_t qp,
                                     Py_ssize_t qc, float* out, uint16_t* outh, Py_ssize_t op,
                                     Py_ssize_t oc, Py_ssize_t cnt, int align, int border,
                                     int prefetch, Py_ssize_t xlast) {
        float r[8];
        uint16_t rh[8];
        gs3d_block8 blk[8];
        __m256i idx[3], m, okv[3];
        /* channels contiguous in the input and the output (or the output's points at step 1),
           C a multiple of 8 (the only case of 16-bit storage, xk 1 or 2) */
        const int rows = xc == 1 && (oc == 1 || op == 1) && C % 8 == 0;
        /* four channels contiguous in the input (and the output, or the output's points at
           step 1): one 128-bit load per corner */
        const int rows4 = xk == 0 && xc == 1 && (oc == 1 || op == 1) && C == 4;
        /* two, three or five to seven float32 channels the same way (``rowsm``): one masked
           256-bit load per corner */
        const int rowsm = xk == 0 && xc == 1 && (oc == 1 || op == 1) && C > 1 && C < 8
                          && C != 4;
        /* float32 rows at step 1 (one channel, or channel planes): gs3d_gather_pairs8 */
        const int pairs = xk == 0 && sx == 1;
        /* byte range of a corner row (x0 and x1 with their channels) from x0 */
        const Py_ssize_t rlo = sx < 0 ? 4 * sx : 0, rlen = 4 * ((sx < 0 ? -sx : sx) + C);
        __m256 s, v, vo, mv[3];
        Py_ssize_t p0, p, c;
        int l, j, k, b, nb;
        for (p0 = 0; p0 < cnt; p0 += 64) {
            nb = (int)((cnt - p0 < 64 ? cnt - p0 : 64) + 7) / 8;
            for (b = 0; b < nb; b++) {
                gs3d_block8* B = &blk[b];
                p = p0 + 8 * b;
                k = cnt - p < 8 ? (int)(cnt - p) : 8;
                gs3d_map8(xk ? NULL : q + p * qp, xk ? qh + p * qp : NULL, xk, qp, qc, k, W, H, D,
                          align, border, idx, B->m, B->w, okv, mv);
                B->base = gs3d_offset8(idx, sx, sy, sz);
                if (!prefetch || xk)        /* (the hints count float32 offsets) */
                    continue;
                if ((rows || rows4 || rowsm) && rlen <= 512)
                    gs3d_prefetch_rows8(x, 4, B->base, (1u << k) - 1, sy, sz, rlo, rlen);
                else
                    /* every channel plane (NCDHW); channels at step +-1 share lines */
                    gs3d_prefetch_corner_rows8c(x, B->base, (1u << k) - 1, sy, sz, xc,
                                                xc == 1 || xc == -1 ? 1 : C);
            }
            for (b = 0; b < nb; b++) {
                const gs3d_block8* B = &blk[b];
                __m256i mj[8], oj[8];
                __m256 wj[8];
                p = p0 + 8 * b;
                k = cnt - p < 8 ? (int)(cnt - p) : 8;
                for (j = 0; j < 8; j++) {
                    const int jx = j & 1, jy = (j >> 1) & 1, jz = j >> 2;
                    mj[j] = gs3d_corner_mask8(B->m, j);
                    wj[j] = gs3d_corner_weight8(B->w, j);
                    oj[j] = _mm256_add_epi32(B->base, _mm256_set1_epi32((int)(jz * sz + jy * sy + jx * sx)));
                }
                if (rows || rows4 || rowsm) {
                    /* point by point, contiguous channels per load */
                    float wl[8][8];
                    int ol[8][8];
                    unsigned mb[8];
                    unsigned all = 0xFF;
                    for (j = 0; j < 8; j++) {
                        _mm256_storeu_ps(wl[j], wj[j]);
                        _mm256_storeu_si256((__m256i*)ol[j], oj[j]);
                        mb[j] = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(mj[j]));
                        all &= mb[j];
                    }
                    if (rows4) {
                        __m128 s4l[8];
                        for (l = 0; l < k; l++) {
                            __m128 s4 = _mm_setzero_ps();
                            if ((all >> l) & 1) {
                                for (j = 0; j < 8; j++)
                                    s4 = _mm_add_ps(s4, _mm_mul_ps(_mm_set1_ps(wl[j][l]),
                                                                   _mm_loadu_ps(x + ol[j][l])));
                            } else {
                                for (j = 0; j < 8; j++)
                                    if ((mb[j] >> l) & 1)
                                        s4 = _mm_add_ps(s4, _mm_mul_ps(_mm_set1_ps(wl[j][l]),
                                                                       _mm_loadu_ps(x + ol[j][l])));
                            }
                            if (oc == 1)
                                _mm_storeu_ps(out + (p + l) * op, s4);
                            else
                                s4l[l] = s4;
                        }
                        if (oc != 1)
                            gs3d_runs4(s4l, out + p, oc, k);
                        continue;
                    }
                    if (rowsm) {
                        /* two, three, five to seven channels: the same with 256-bit masked
                           loads (the eight-channel loop below with masked loads and stores was
                           0.92-0.97x as fast at 1x6x96^3 and 1x6x64^3; against a 128-bit copy of
                           this block for two and three channels, 1x3x96^3 and 1x2x96^3 NDHWC
                           measured 0.90-1.10x, within the host's noise) */
                        __m256 s8l[8];
                        for (l = 0; l < k; l++) {
                            s = _mm256_setzero_ps();
                            if ((all >> l) & 1) {
                                for (j = 0; j < 8; j++)
                                    s = _mm256_add_ps(s, _mm256_mul_ps(_mm256_set1_ps(wl[j][l]),
                                        gs3d_ld8n(x + ol[j][l], (int)C)));
                            } else {
                                for (j = 0; j < 8; j++)
                                    if ((mb[j] >> l) & 1)
                                        s = _mm256_add_ps(s, _mm256_mul_ps(
                                            _mm256_set1_ps(wl[j][l]),
                                            gs3d_ld8n(x + ol[j][l], (int)C)));
                            }
                            if (oc == 1)
                                gs3d_st8n(out + (p + l) * op, s, (int)C);
                            else
                                s8l[l] = s;
                        }
                        if (oc != 1)
                            gs3d_runs8(s8l, out + p, oc, k, (int)C);
                        continue;
                    }
    #if defined(__AVX512F__) && defined(__AVX512DQ__)
                    if (xk == 0 && C % 16 == 0) {
                        /* sixteen channels per load: the same sums lane by lane; into NCDHW,
                           each half of eight points' sums transposed into eight channel runs */
                        for (c = 0; c < C; c += 16) {
                            __m256 lo[8], hi[8];
                            for (l = 0; l < k; l++) {
                                __m512 s16 = _mm512_setzero_ps();
                                if ((all >> l) & 1) {
                                    for (j = 0; j < 8; j++)
                                        s16 = _mm512_add_ps(s16, _mm512_mul_ps(
                                            _mm512_set1_ps(wl[j][l]),
                                            _mm512_loadu_ps(x + ol[j][l] + c)));
                                } else {
                                    for (j = 0; j < 8; j++)
                                        if ((mb[j] >> l) & 1)
                                            s16 = _mm512_add_ps(s16, _mm512_mul_ps(
                                                _mm512_set1_ps(wl[j][l]),
                                                _mm512_loadu_ps(x + ol[j][l] + c)));
                                }
                                if (oc == 1) {
                                    _mm512_storeu_ps(out + (p + l) * op + c, s16);
                                } else {
                                    lo[l] = _mm512_castps512_ps256(s16);
                                    hi[l] = _mm512_extractf32x8_ps(s16, 1);
                                }
                            }
                            if (oc != 1) {
                                gs3d_runs8(lo, out + p + c * oc, oc, k, 8);
                                gs3d_runs8(hi, out + p + (c + 8) * oc, oc, k, 8);
                            }
                        }
                        continue;
                    }
    #endif
                    for (c = 0; c < C; c += 8) {
                        __m256 sv[8];
                        for (l = 0; l < k; l++) {
                            s = _mm256_setzero_ps();
                            if ((all >> l) & 1) {
                                /* every corner in bounds: no tests */
                                for (j = 0; j < 8; j++)
                                    s = _mm256_add_ps(s, _mm256_mul_ps(_mm256_set1_ps(wl[j][l]),
                                                                       gs3d_cl_ld8(x, xh, ol[j][l] + c, xk)));
                            } else {
                                for (j = 0; j < 8; j++)
                                    if ((mb[j] >> l) & 1)
                                        s = _mm256_add_ps(s, _mm256_mul_ps(_mm256_set1_ps(wl[j][l]),
                                                                           gs3d_cl_ld8(x, xh, ol[j][l] + c, xk)));
                            }
                            if (oc != 1)
                                sv[l] = s;
                            else if (xk)
                                gs3d_store8_h(s, outh + (p + l) * op + c, xk == 2);
                            else
                                _mm256_storeu_ps(out + (p + l) * op + c, s);
                        }
                        if (oc != 1 && xk)
                            gs3d_runs8h(sv, outh + p + c * oc, oc, k, xk == 2);
                        else if (oc != 1)
                            gs3d_runs8(sv, out + p + c * oc, oc, k, 8);
                    }
                    continue;
                }
                /* float32 rows at step 1 and no point with one x corner in bounds and the
                   other out: corners 2 r and 2 r + 1 share their masks, and one 64-bit lane
                   per point reads both */
                const int pb = pairs && _mm256_testz_si256(_mm256_xor_si256(B->m[0], B->m[1]),
                                                           _mm256_xor_si256(B->m[0], B->m[1]));
                for (c = 0; c < C; c++) {
                    const float* xcp = xk ? NULL : x + c * xc;
                    const uint16_t* xhp = xk ? xh + c * xc : NULL;
                    s = _mm256_setzero_ps();
                    for (j = 0; j < 8; j++) {
                        m = mj[j];
                        if (pb && !(j & 1))
                            gs3d_gather_pairs8(xcp, oj[j], m, &v, &vo);
                        else if (pb)
                            v = vo;
                        else
                            v = gs3d_gather8(xcp, xhp, xk, oj[j], m, xlast - c * xc);
                        s = _mm256_blendv_ps(s, _mm256_add_ps(s, _mm256_mul_ps(wj[j], v)),
                                             _mm256_castsi256_ps(m));
                    }
                    if (xk) {
                        /* rounded once, as st() rounds */
                        if (k == 8 && op == 1) {
                            gs3d_store8_h(s, outh + p + c * oc, xk == 2);
                        } else {
                            gs3d_store8_h(s, rh, xk == 2);
                            for (l = 0; l < k; l++)
                                outh[(p + l) * op + c * oc] = rh[l];
                        }
                    } else if (k == 8 && op == 1) {
                        _mm256_storeu_ps(out + p + c * oc, s);
                    } else {
                        _mm256_storeu_ps(r, s);
                        for (l = 0; l < k; l++)
                            out[(p + l) * op + c * oc] = r[l];
                    }
                }
            }
        }
    }
    /* setup_tile for float32 points at a fixed step under bilinear padding (any), eight
       points at a time through gs3d_map8 (the mapping, masks and weights of the gather
       kernels, which give setup_tile's bits): the weights wx * (wy * wz) and the per-axis
       (1 - frac, frac) in float, stored as doubles as setup_tile keeps them; the corner masks;
       the multipliers, zero for a point that samples nothing (setup_tile's okv); the key plane
       of ownership from the depth axis alone (key_of).  An axis that samples nothing has
       corner-0 index -2 here (0 in setup_tile): no corner of such a point is flagged, so its
       offsets are never used.  The weight arrays are written eight lanes at a time (a tile
       row holds a multiple of eight): lanes past cnt are never read. */
    GS3D_ALWAYS_INLINE void gs3d_store8_pd(double* d, __m256 v) {
        _mm256_storeu_pd(d, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
        _mm256_storeu_pd(d + 4, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
    }
    static void gs3d_setup_tile_f(const gs3d_setup_args* a) {
        const Py_ssize_t T = a->tile;
        __m256i idx[3], m[6], ok[3], vdv, okall;
        __m256 w[6], mult[3];
        int ix[8], iy[8], iz[8], vdb[8], oka[8], okz[8], j, l, k;
        Py_ssize_t p, key, z0;
        unsigned char v, slab;
        for (p = 0; p < a->cnt; p += 8) {
            k = a->cnt - p < 8 ? (int)(a->cnt - p) : 8;
            if (a->qk == 0)
                gs3d_map8(a->q + p * a->qp, NULL, 0, a->qp, a->qc, k, a->W, a->H, a->D, a->align,
                          a->border, idx, m, w, ok, mult);
            else
                gs3d_map8(NULL, a->qh + p * a->qp, a->qk, a->qp, a->qc, k, a->W, a->H, a->D,
                          a->align, a->border, idx, m, w, ok, mult);
            vdv = _mm256_setzero_si256();
            for (j = 0; j < 8; j++) {
                vdv = _mm256_or_si256(vdv, _mm256_and_si256(gs3d_corner_mask8(m, j),
                                                             _mm256_set1_epi32(1 << j)));
                gs3d_store8_pd(a->w + j * T + p, gs3d_corner_weight8(w, j));
            }
            for (j = 0; j < 6; j++)
                gs3d_store8_pd(a->f + j * T + p, w[j]);
            okall = _mm256_and_si256(_mm256_and_si256(ok[0], ok[1]), ok[2]);
            for (j = 0; j < 3; j++)
                gs3d_store8_pd(a->mult + j * T + p,
                               _mm256_and_ps(mult[j], _mm256_castsi256_ps(okall)));
            _mm256_storeu_si256((__m256i*)ix, idx[0]);
            _mm256_storeu_si256((__m256i*)iy, idx[1]);
            _mm256_storeu_si256((__m256i*)iz, idx[2]);
            _mm256_storeu_si256((__m256i*)vdb, vdv);
            _mm256_storeu_si256((__m256i*)oka, okall);
            _mm256_storeu_si256((__m256i*)okz, ok[2]);
            for (l = 0; l < k; l++) {
                const Py_ssize_t i = p + l;
                z0 = iz[l];
                a->xb[i] = a->xo + z0 * a->sz + (Py_ssize_t)iy[l] * a->sy
                           + (Py_ssize_t)ix[l] * a->sx;
                a->ab[i] = z0 * a->az + (Py_ssize_t)iy[l] * a->ay + (Py_ssize_t)ix[l] * a->ax;
                a->okv[i] = oka[l] ? 1.0 : 0.0;
                v = (unsigned char)vdb[l];
                slab = v;
                if (!a->all_planes)
                    slab = v & ((a->zlo <= z0 && z0 < a->zhi ? 0x0F : 0)
                                | (a->zlo <= z0 + 1 && z0 + 1 < a->zhi ? 0xF0 : 0));
                a->vd[i] = v;
                a->vs[i] = a->do_dx ? slab : 0;
                if (!a->do_dg || a->own_all) {
                    a->own[i] = a->do_dg ? 1 : 0;
                } else {
                    key = okz[l] ? (z0 < 0 ? 0 : (z0 > a->D - 1 ? a->D - 1 : z0)) : 0;
                    a->own[i] = a->zlo <= key && key < a->zhi;
                }
            }
        }
    }
    /* C = 1 gets its own copy with the channel loop folded away (same operations, same bits) */
    static void gs3d_forward_gather_avx2(const float* x, Py_ssize_t sx, Py_ssize_t sy,
                                     Py_ssize_t sz, Py_ssize_t W, Py_ssize_t H, Py_ssize_t D,
                                     Py_ssize_t C, Py_ssize_t xc, const float* q, Py_ssize_t qp,
                                     Py_ssize_t qc, float* out, Py_ssize_t op, Py_ssize_t oc,
                                     Py_ssize_t cnt, int align, int border, int prefetch) {
        if (C == 1)
            gs3d_forward_gather_body(x, NULL, 0, sx, sy, sz, W, H, D, 1, xc, q, NULL, qp, qc,
                                     out, NULL, op, oc, cnt, align, border, prefetch, 0);
        else
            gs3d_forward_gather_body(x, NULL, 0, sx, sy, sz, W, H, D, C, xc, q, NULL, qp, qc,
                                     out, NULL, op, oc, cnt, align, border, prefetch, 0);
    }
    /* The same for 16-bit storage (float16, or bfloat16 with ``bf``): input, grid and output,
       the values converted exactly, summed in float32 and rounded once, as the tile loop does;
       without prefetching.  ``xlast``: the offset from x of the array's highest-addressed
       element (see gs3d_gather8).  One channel gets its own copies too. */
    static void gs3d_forward_gather_h(const uint16_t* x, Py_ssize_t sx, Py_ssize_t sy,
                                      Py_ssize_t sz, Py_ssize_t W, Py_ssize_t H, Py_ssize_t D,
                                      Py_ssize_t C, Py_ssize_t xc, const uint16_t* q,
                                      Py_ssize_t qp, Py_ssize_t qc, uint16_t* out, Py_ssize_t op,
                                      Py_ssize_t oc, Py_ssize_t cnt, int align, int border,
                                      int bf, Py_ssize_t xlast) {
        if (bf && C == 1)
            gs3d_forward_gather_body(NULL, x, 2, sx, sy, sz, W, H, D, 1, xc, NULL, q, qp, qc,
                                     NULL, out, op, oc, cnt, align, border, 0, xlast);
        else if (bf)
            gs3d_forward_gather_body(NULL, x, 2, sx, sy, sz, W, H, D, C, xc, NULL, q, qp, qc,
                                     NULL, out, op, oc, cnt, align, border, 0, xlast);
        else if (C == 1)
            gs3d_forward_gather_body(NULL, x, 1, sx, sy, sz, W, H, D, 1, xc, NULL, q, qp, qc,
                                     NULL, out, op, oc, cnt, align, border, 0, xlast);
        else
            gs3d_forward_gather_body(NULL, x, 1, sx, sy, sz, W, H, D, C, xc, NULL, q, qp, qc,
                                     NULL, out, op, oc, cnt, align, border, 0, xlast);
    }
    /* The float32 bilinear backward (any padding) for up to 7 channels
       (BWD_GATHER_MAX_C), eight points per step with AVX2: the bits of setup_tile +
       backward_tile.  Per block of eight points, vectorised: the mapping (with the
       grid-gradient factors), corner masks and weights, the gathers and channel dots of the
       grid gradient (a chain from +0 in channel order, then + 0, as lane 0 of dot_channels
       for C < 8; eight channels would need lane_sum's tree instead; four to seven float32
       channels contiguous in the input are loaded once per point (masked from five) and
       transposed, not gathered), and
       both grid-gradient formulas of grid_grad_of, picked per point.  The input-gradient
       scatter stays point by point in order (scalar, the products w * go of one channel
       taken from a vector multiply, or one 128-bit read-modify-write per corner for four
       contiguous channels, one masked one for three and five to seven on scattered tiles:
       gs3d_bwd_args.rmw), so that every element receives its contributions
       in the order of the tile loop.  Corners are scattered only where their
       depth index is in [zlo, zhi), and the grid gradient is written for the points whose key
       plane (key_of) is there, unless own_all.  16-bit storage runs the same operations on its
       values converted exactly (input gathered by gs3d_gather8), scatters into a float32
       accumulator and rounds the grid gradient once (gs3d_store8_h, st's bits). */
    /* grid_grad_of for eight points, one per lane: d[j] the channel dots of corner j, w the
       weights wx0 wx1 wy0 wy1 wz0 wz1, mj[j] corner j in bounds, mall all eight in bounds.
       The sum factored by axis where every corner is in bounds, else the signed sum over the
       corners in bounds from +0 in corner order (a blend, so lanes of other points and
       corners out of bounds cannot disturb it, whatever their dots hold). */
    GS3D_ALWAYS_INLINE void gs3d_grid_grad8(const __m256* d, const __m256* w, const __m256i* mj,
                                            __m256i mall, __m256* gx_, __m256* gy_,
                                            __m256* gz_) {
        const __m256 zero = _mm256_setzero_ps();
        const __m256 wx0 = w[0], wx1 = w[1], wy0 = w[2], wy1 = w[3], wz0 = w[4], wz1 = w[5];
        __m256 hx, hy, hz, gx, gy, gz;
        int j;
        /* every corner in bounds: the sums factored by axis */
        hx = _mm256_add_ps(
            _mm256_mul_ps(wz0, _mm256_add_ps(_mm256_mul_ps(wy0, _mm256_sub_ps(d[1], d[0])),
                                             _mm256_mul_ps(wy1, _mm256_sub_ps(d[3], d[2])))),
            _mm256_mul_ps(wz1, _mm256_add_ps(_mm256_mul_ps(wy0, _mm256_sub_ps(d[5], d[4])),
                                             _mm256_mul_ps(wy1, _mm256_sub_ps(d[7], d[6])))));
        hy = _mm256_add_ps(
            _mm256_mul_ps(wz0, _mm256_add_ps(_mm256_mul_ps(wx0, _mm256_sub_ps(d[2], d[0])),
                                             _mm256_mul_ps(wx1, _mm256_sub_ps(d[3], d[1])))),
            _mm256_mul_ps(wz1, _mm256_add_ps(_mm256_mul_ps(wx0, _mm256_sub_ps(d[6], d[4])),
                                             _mm256_mul_ps(wx1, _mm256_sub_ps(d[7], d[5])))));
        hz = _mm256_add_ps(
            _mm256_mul_ps(wy0, _mm256_add_ps(_mm256_mul_ps(wx0, _mm256_sub_ps(d[4], d[0])),
                                             _mm256_mul_ps(wx1, _mm256_sub_ps(d[5], d[1])))),
            _mm256_mul_ps(wy1, _mm256_add_ps(_mm256_mul_ps(wx0, _mm256_sub_ps(d[6], d[2])),
                                             _mm256_mul_ps(wx1, _mm256_sub_ps(d[7], d[3])))));
        /* otherwise the corner by corner sum over the corners in bounds */
        gx = gy = gz = zero;
        for (j = 0; j < 8; j++) {
            const int jx = j & 1, jy = (j >> 1) & 1, jz = j >> 2;
            const __m256 m = _mm256_castsi256_ps(mj[j]);
            const __m256 fx = _mm256_mul_ps(w[2 + jy], w[4 + jz]);
            const __m256 fy = _mm256_mul_ps(w[jx], w[4 + jz]);
            const __m256 fz = _mm256_mul_ps(w[jx], w[2 + jy]);
            const __m256 ex = _mm256_mul_ps(d[j], fx), ey = _mm256_mul_ps(d[j], fy);
            const __m256 ez = _mm256_mul_ps(d[j], fz);
            gx = _mm256_blendv_ps(gx, jx ? _mm256_add_ps(gx, ex) : _mm256_sub_ps(gx, ex), m);
            gy = _mm256_blendv_ps(gy, jy ? _mm256_add_ps(gy, ey) : _mm256_sub_ps(gy, ey), m);
            gz = _mm256_blendv_ps(gz, jz ? _mm256_add_ps(gz, ez) : _mm256_sub_ps(gz, ez), m);
        }
        gx = _mm256_blendv_ps(gx, hx, _mm256_castsi256_ps(mall));
        gy = _mm256_blendv_ps(gy, hy, _mm256_castsi256_ps(mall));
        gz = _mm256_blendv_ps(gz, hz, _mm256_castsi256_ps(mall));
        *gx_ = gx; *gy_ = gy; *gz_ = gz;
    }
    /* the grid gradients gx, gy, gz of eight points, written for the lanes l < k set in
       ``lanes``: point l's at dq + o (float32, xk 0) or at dqh + o rounded once to 16-bit
       storage of kind xk (gs3d_store8_h: st's bits), o = oq[l] when oq is given, else
       o0 + l dp, its y and z components dc and 2 dc further on */
    GS3D_ALWAYS_INLINE void gs3d_put_grid_grad8(float* dq, uint16_t* dqh, const int xk,
                                                const Py_ssize_t* oq, Py_ssize_t o0,
                                                Py_ssize_t dp, Py_ssize_t dc, unsigned lanes,
                                                int k, __m256 gx, __m256 gy, __m256 gz) {
        float f[3][8];
        uint16_t h[3][8];
        Py_ssize_t o;
        int l;
        if (xk) {
            gs3d_store8_h(gx, h[0], xk == 2);
            gs3d_store8_h(gy, h[1], xk == 2);
            gs3d_store8_h(gz, h[2], xk == 2);
        } else {
            _mm256_storeu_ps(f[0], gx);
            _mm256_storeu_ps(f[1], gy);
            _mm256_storeu_ps(f[2], gz);
        }
        for (l = 0; l < k; l++) {
            if (!((lanes >> l) & 1))
                continue;
            o = oq ? oq[l] : o0 + l * dp;
            if (xk) {
                dqh[o] = h[0][l];
                dqh[o + dc] = h[1][l];
                dqh[o + 2 * dc] = h[2][l];
            } else {
                dq[o] = f[0][l];
                dq[o + dc] = f[1][l];
                dq[o + 2 * dc] = f[2][l];
            }
        }
    }
    /* the lanes of eight points (corner-0 depth indices iz, -2 for a dead z) whose grid
       gradient a call for the depth slab [zlo, zhi) writes: all with own_all, else those whose
       key plane (key_of: 0 for a dead z or below, D - 1 above) is in the slab */
    GS3D_ALWAYS_INLINE __m256i gs3d_own8(__m256i iz, int own_all, Py_ssize_t zlo, Py_ssize_t zhi,
                                         Py_ssize_t D) {
        __m256i key;
        if (own_all)
            return _mm256_set1_epi32(-1);
        key = _mm256_min_epi32(_mm256_max_epi32(iz, _mm256_setzero_si256()),
                               _mm256_set1_epi32((int)D - 1));
        return _mm256_and_si256(_mm256_cmpgt_epi32(key, _mm256_set1_epi32((int)zlo - 1)),
                                _mm256_cmpgt_epi32(_mm256_set1_epi32((int)zhi), key));
    }
    /* the lanes with a corner plane (iz or iz + 1) in [zlo, zhi): all with all_planes */
    GS3D_ALWAYS_INLINE __m256i gs3d_slab8(__m256i iz, int all_planes, Py_ssize_t zlo,
                                          Py_ssize_t zhi) {
        if (all_planes)
            return _mm256_set1_epi32(-1);
        return _mm256_and_si256(_mm256_cmpgt_epi32(iz, _mm256_set1_epi32((int)zlo - 2)),
                                _mm256_cmpgt_epi32(_mm256_set1_epi32((int)zhi), iz));
    }
    typedef struct {
        __m256i base, abase, iz, own, m[6];
        __m256 w[6], mult[3];
        int ownb, slabb;    /* lanes with grid-gradient / input-gradient work for this call */
    } gs3d_bblock8;
    /* grad_output of the 64 points GS3D_GO_AHEAD points after point p0 (isz-byte elements,
       points at step gp, channels at step gc): the next tiles' when points run on, as the
       gather loop's tiles of 64 do; hints only, past the array's end they do nothing.  With
       the channels at step 1 and several points in one run (NDHWC) one span, else C spans of
       64 points at step 1 (NCDHW); other strides none. */
    enum { GS3D_GO_AHEAD = 128 };
    static inline void gs3d_prefetch_go(const char* go, Py_ssize_t isz, Py_ssize_t p0,
                                        Py_ssize_t gp, Py_ssize_t gc, Py_ssize_t C) {
        Py_ssize_t c;
        if (gp == 1) {
            for (c = 0; c < C; c++)
                gs3d_cl_span(go + isz * (p0 + GS3D_GO_AHEAD + c * gc), 64 * isz);
        } else if (gc == 1 && gp == C) {
            gs3d_cl_span(go + isz * (p0 + GS3D_GO_AHEAD) * gp, 64 * isz * gp);
        }
    }
    GS3D_ALWAYS_INLINE void gs3d_backward_gather_body(const gs3d_bwd_args* a, Py_ssize_t cnt,
                                                      const Py_ssize_t C, const int h) {
        /* h: 16-bit storage, of kind xk (else float32, xk 0) */
        const int xk = h ? a->xk : 0;
        float wa[8][8], gov[8][8];
        int oa[8][8];
        unsigned vsb[8];
        gs3d_bblock8 blk[8];
        __m256i idx[3], iz, okv[3], mj[8], own, mall, slab;
        int ownb, slabb;
        __m256 mv[3], g[8], d[8], v, acc, gx, gy, gz;
        const Py_ssize_t sx = a->sx, sy = a->sy, sz = a->sz;
        const Py_ssize_t ax = a->ax, ay = a->ay, az = a->az;
        const int all_planes = a->zlo <= 0 && a->zhi >= a->D;
        Py_ssize_t p0, p, c;
        int l, j, k, b, nb;
        for (p0 = 0; p0 < cnt; p0 += 64) {
            nb = (int)((cnt - p0 < 64 ? cnt - p0 : 64) + 7) / 8;
            if (a->prefetch)
                gs3d_prefetch_go(h ? (const char*)a->goh : (const char*)a->go, h ? 2 : 4, p0,
                                 a->gp, a->gc, C);
            for (b = 0; b < nb; b++) {
                gs3d_bblock8* B = &blk[b];
                __m256i vld;
                p = p0 + 8 * b;
                k = cnt - p < 8 ? (int)(cnt - p) : 8;
                gs3d_map8(h ? NULL : a->q + p * a->qp, h ? a->qh + p * a->qp : NULL, xk, a->qp,
                          a->qc, k, a->W, a->H, a->D, a->align, a->border, idx, B->m, B->w, okv,
                          mv);
                vld = _mm256_and_si256(_mm256_and_si256(okv[0], okv[1]), okv[2]);
                for (l = 0; l < 3; l++)
                    B->mult[l] = _mm256_and_ps(mv[l], _mm256_castsi256_ps(vld));
                iz = idx[2];
                B->iz = iz;
                B->base = gs3d_offset8(idx, sx, sy, sz);
                B->abase = gs3d_offset8(idx, ax, ay, az);
                /* the points this call owns (grid gradient) and those with a corner plane in
                   [zlo, zhi) (input gradient): at N = 1 every thread maps every point, and
                   only those are prefetched and worked on */
                B->own = gs3d_own8(iz, a->own_all, a->zlo, a->zhi, a->D);
                slab = gs3d_slab8(iz, all_planes, a->zlo, a->zhi);
                ownb = a->do_dg ? _mm256_movemask_ps(_mm256_castsi256_ps(B->own)) : 0;
                slabb = a->do_dx ? _mm256_movemask_ps(_mm256_castsi256_ps(slab)) : 0;
                B->ownb = ownb & ((1 << k) - 1);
                B->slabb = slabb & ((1 << k) - 1);
                if (!h)         /* (the hints count float32 offsets) */
                    gs3d_prefetch_corner_rows8c(a->x, B->base, (unsigned)B->ownb, sy, sz,
                                                a->xc, a->prefetch ? C : 1);
                gs3d_prefetch_corner_rows8(a->A, B->abase, (unsigned)B->slabb, ay, az);
            }
            for (b = 0; b < nb; b++) {
                const gs3d_bblock8* B = &blk[b];
                p = p0 + 8 * b;
                k = cnt - p < 8 ? (int)(cnt - p) : 8;
                if (!(B->ownb | B->slabb))
                    continue;           /* nothing of these eight points is this call's */
                for (c = 0; c < C; c++) {
                    /* lanes past k zero (16-bit: converted exactly) */
                    const Py_ssize_t o = p * a->gp + c * a->gc;
                    g[c] = k == 8 && a->gp == 1
                        ? gs3d_cl_ld8(h ? NULL : a->go, h ? a->goh : NULL, o, xk)
                        : gs3d_ld8_step(h ? NULL : a->go, h ? a->goh : NULL, xk, o, a->gp, k,
                                        0.0f);
                    if (C != 1)
                        _mm256_storeu_ps(gov[c], g[c]);     /* for the scalar scatters */
                }
                mall = _mm256_set1_epi32(-1);
                for (j = 0; j < 8; j++) {
                    mj[j] = gs3d_corner_mask8(B->m, j);
                    mall = _mm256_and_si256(mall, mj[j]);
                }
                if (B->ownb) {
                    const __m256 zero = _mm256_setzero_ps();
                    own = B->own;
                    for (j = 0; j < 8; j++) {
                        const __m256i mg = _mm256_and_si256(mj[j], own);
                        const __m256i off = _mm256_add_epi32(B->base, _mm256_set1_epi32(
                            (int)((j >> 2) * sz + ((j >> 1) & 1) * sy + (j & 1) * sx)));
                        acc = zero;
                        if (C >= 4 && !h && a->xc == 1) {
                            /* four to seven contiguous channels: one 128-bit load (four) or
                               masked 256-bit load (five to seven) per point, zero where the
                               gather would be masked, transposed into the channel vectors the
                               gathers give.  In-process A/B against the gathers, 2 threads:
                               four channels 2x4x96^3 backward 1.10-1.15x, grid gradient alone
                               1.18x; NDHWC 1x6x64^3 smooth 1.07-1.13x, random 1.06-1.10x,
                               1x5x64^3 smooth 1.09x, grid gradient alone 1x7x64^3 1.36-1.37x,
                               2x5x64^3 random 1.01-1.02x.  Three channels by masked 128-bit
                               loads lost (grid gradient alone 1x3x96^3 random 0.91x). */
                            int ol[8];
                            __m128 r[8];
                            __m256 vc[8];
                            const unsigned mb = (unsigned)_mm256_movemask_ps(
                                _mm256_castsi256_ps(mg)) & ((1u << k) - 1);
                            _mm256_storeu_si256((__m256i*)ol, off);
                            if (C == 4) {
                                for (l = 0; l < 8; l++)
                                    r[l] = (mb >> l) & 1 ? _mm_loadu_ps(a->x + ol[l])
                                                         : _mm_setzero_ps();
                                gs3d_channels4x8(r, vc);
                            } else {
                                for (l = 0; l < 8; l++)
                                    vc[l] = (mb >> l) & 1 ? gs3d_ld8n(a->x + ol[l], (int)C)
                                                          : _mm256_setzero_ps();
                                gs3d_transpose8(vc);
                            }
                            for (c = 0; c < C; c++)
                                acc = _mm256_add_ps(acc, _mm256_mul_ps(g[c], vc[c]));
                        } else {
                            for (c = 0; c < C; c++) {
                                v = gs3d_gather8(h ? NULL : a->x + c * a->xc,
                                                 h ? a->xh + c * a->xc : NULL, xk, off, mg,
                                                 a->xlast - c * a->xc);
                                acc = _mm256_add_ps(acc, _mm256_mul_ps(g[c], v));
                            }
                        }
                        d[j] = _mm256_add_ps(acc, zero);
                    }
                    gs3d_grid_grad8(d, B->w, mj, mall, &gx, &gy, &gz);
                    gx = _mm256_mul_ps(B->mult[0], gx);
                    gy = _mm256_mul_ps(B->mult[1], gy);
                    gz = _mm256_mul_ps(B->mult[2], gz);
                    gs3d_put_grid_grad8(a->dq, a->dqh, xk, NULL, p * a->dp, a->dp, a->dc,
                                        (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(own)),
                                        k, gx, gy, gz);
                }
                if (B->slabb) {
                    float pr[8][8];
                    Py_ssize_t co[8];
                    __m256i pmv = _mm256_setzero_si256();
                    for (j = 0; j < 8; j++) {
                        const int jx = j & 1, jy = (j >> 1) & 1, jz = j >> 2;
                        __m256i vs = mj[j];
                        if (!all_planes) {
                            const __m256i z = _mm256_add_epi32(B->iz, _mm256_set1_epi32(jz));
                            vs = _mm256_and_si256(vs, _mm256_and_si256(
                                _mm256_cmpgt_epi32(z, _mm256_set1_epi32((int)a->zlo - 1)),
                                _mm256_cmpgt_epi32(_mm256_set1_epi32((int)a->zhi), z)));
                        }
                        co[j] = jz * az + jy * ay + jx * ax;
                        if (C == 1) {
                            /* the eight points' products w * go in one vector multiply (the
                               scalar products' bits), and per point its corner mask */
                            _mm256_storeu_ps(pr[j], _mm256_mul_ps(gs3d_corner_weight8(B->w, j),
                                                                  g[0]));
                            pmv = _mm256_or_si256(pmv, _mm256_and_si256(
                                vs, _mm256_set1_epi32(1 << j)));
                            continue;
                        }
                        vsb[j] = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(vs));
                        _mm256_storeu_ps(wa[j], gs3d_corner_weight8(B->w, j));
                        _mm256_storeu_si256((__m256i*)oa[j], _mm256_add_epi32(B->abase,
                            _mm256_set1_epi32((int)co[j])));
                    }
                    if (C == 1) {
                        /* one channel: per point, its corners in order (no tests when all
                           eight are in) */
                        int pm[8], ab8[8];
                        _mm256_storeu_si256((__m256i*)pm, pmv);
                        _mm256_storeu_si256((__m256i*)ab8, B->abase);
                        for (l = 0; l < k; l++) {
                            /* an index, not a pointer: corner 0 may lie outside A */
                            const Py_ssize_t o = ab8[l];
                            if (pm[l] == 0xFF) {
                                for (j = 0; j < 8; j++)
                                    a->A[o + co[j]] = a->A[o + co[j]] + pr[j][l];
                            } else {
                                for (j = 0; j < 8; j++)
                                    if ((pm[l] >> j) & 1)
                                        a->A[o + co[j]] = a->A[o + co[j]] + pr[j][l];
                            }
                        }
                    } else if (C == 4 && a->ac == 1) {
                        /* four contiguous channels: one 128-bit read-modify-write per corner,
                           dst[c] + w * go[c] lane by lane as below */
                        for (l = 0; l < k; l++) {
                            const __m128 gv = a->gc == 1 && !h
                                ? _mm_loadu_ps(a->go + (p + l) * a->gp)
                                : _mm_setr_ps(gov[0][l], gov[1][l], gov[2][l], gov[3][l]);
                            for (j = 0; j < 8; j++) {
                                if ((vsb[j] >> l) & 1) {
                                    float* dst = a->A + oa[j][l];
                                    _mm_storeu_ps(dst, _mm_add_ps(_mm_loadu_ps(dst),
                                        _mm_mul_ps(_mm_set1_ps(wa[j][l]), gv)));
                                }
                            }
                        }
                    } else if (a->rmw && a->ac == 1 && C == 3) {
                        /* three contiguous channels: one masked 128-bit
                           read-modify-write per corner (nothing past the channels touched),
                           lane by lane as below; the 256-bit branch below for three channels
                           measured 0.85-0.88x at 1x3x96^3 and 8x3x32^3 random, where this
                           branch against itself gave 0.90-1.02x: it stays */
                        for (l = 0; l < k; l++) {
                            const __m128 gv = _mm_setr_ps(gov[0][l], gov[1][l], gov[2][l], 0.0f);
                            for (j = 0; j < 8; j++) {
                                if ((vsb[j] >> l) & 1) {
                                    float* dst = a->A + oa[j][l];
                                    gs3d_st4n(dst, _mm_add_ps(gs3d_ld4n(dst, (int)C),
                                        _mm_mul_ps(_mm_set1_ps(wa[j][l]), gv)), (int)C);
                                }
                            }
                        }
                    } else if (a->rmw && a->ac == 1 && C > 4) {
                        /* five to seven: the same, 256-bit */
                        float gl[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
                        for (l = 0; l < k; l++) {
                            __m256 gv;
                            for (c = 0; c < C; c++)
                                gl[c] = gov[c][l];
                            gv = _mm256_loadu_ps(gl);
                            for (j = 0; j < 8; j++) {
                                if ((vsb[j] >> l) & 1) {
                                    float* dst = a->A + oa[j][l];
                                    gs3d_st8n(dst, _mm256_add_ps(gs3d_ld8n(dst, (int)C),
                                        _mm256_mul_ps(_mm256_set1_ps(wa[j][l]), gv)), (int)C);
                                }
                            }
                        }
                    } else {
                        for (l = 0; l < k; l++) {
                            for (j = 0; j < 8; j++) {
                                if ((vsb[j] >> l) & 1) {
                                    float* dst = a->A + oa[j][l];
                                    const float w = wa[j][l];
                                    for (c = 0; c < C; c++)
                                        dst[c * a->ac] = dst[c * a->ac] + w * gov[c][l];
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    /* C = 1 (the common single-channel volume) and C = 4 get their own copies with the
       channel loops folded away; same operations in the same order, so the same bits.  (The
       caller stops at BWD_GATHER_MAX_C = 7 channels, so no C = 8 copy.) */
    static void gs3d_backward_gather_avx2(const gs3d_bwd_args* a, Py_ssize_t cnt) {
        if (a->xk && a->C == 1)
            gs3d_backward_gather_body(a, cnt, 1, 1);
        else if (a->xk)
            gs3d_backward_gather_body(a, cnt, a->C, 1);
        else if (a->C == 1)
            gs3d_backward_gather_body(a, cnt, 1, 0);
        else if (a->C == 4)
            gs3d_backward_gather_body(a, cnt, 4, 0);
        else
            gs3d_backward_gather_body(a, cnt, a->C, 0);
    }
    /* The consuming loop of backward_tile for float32 with contiguous channels in the input,
       the accumulator and grad_output and C a multiple of 8 (AVX2 build): the points of one
       tile set up by setup_tile (its arrays passed in gs3d_cl_args), in order, with that
       loop's bits.  Each corner's channel dot is one 8-lane vector from +0 (channel c in lane
       c % 8, as gs3d_dot_f); the eight corners' vectors are then reduced together in
       lane_sum's tree and operand order (lanes 0 + 4, 1 + 5, 2 + 6, 3 + 7; then
       (0 4) + (2 6), (1 5) + (3 7); then their sum).  A corner outside the gather mask gets a
       zero vector, never a read.  The grid gradient is grid_grad_of's (the sum factored by
       axis when all eight corners are in bounds, else the signed sum over corners), computed
       for eight points at once (gs3d_grid_grad8, shared with the gather backward); the
       scatter is gs3d_axpy_f's, corner by corner, point by point in order.  16-bit storage
       (xkind 1 or 2): the input is read as gs3d_dot_h reads it (eight values converted
       exactly), grad_output comes already converted (staged: go + C i for point i) or is
       converted point by point into a buffer of GS3D_CL_GOBUF floats (at most that many
       channels), and the grid gradient is rounded by gs3d_store8_h (st's bits) into dqh.
       The caller has prefetched the first ``ahead`` points. */
    /* prefetch_corners for point k: the rows it gathers from and scatters into */
    GS3D_ALWAYS_INLINE void gs3d_cl_prefetch(const gs3d_cl_args* a, int k) {
        const unsigned gm = a->own[k] ? a->vd[k] : 0, sm = a->vs[k];
        int r;
        for (r = 0; r < 4; r++) {
            if ((gm >> (2 * r)) & 3)
                gs3d_cl_span((a->xkind ? (const char*)(a->xh + a->xb[k] + a->xd[2 * r])
                                       : (const char*)(a->x + a->xb[k] + a->xd[2 * r]))
                             + a->px_lo, a->px_n);
            if ((sm >> (2 * r)) & 3)
                gs3d_cl_span((const char*)(a->A + a->ab[k] + a->ad[2 * r]) + a->pa_lo, a->pa_n);
        }
    }
    GS3D_ALWAYS_INLINE __m256 gs3d_cl_dot(const gs3d_cl_args* a, const float* go, Py_ssize_t off,
                                          Py_ssize_t C, const int xk) {
        __m256 s = _mm256_setzero_ps();
        Py_ssize_t c;
    #if defined(__AVX512F__) && defined(__AVX512DQ__)
        if (xk == 0 && C % 16 == 0) {
            /* float32: sixteen products per multiply, added to the eight-lane sum in the
               same order.  (0 + p_c) + p_(c+8) is (0 + p_c) + (0 + p_(c+8)) bit for bit: 0 + p
               is p except that -0 becomes +0, and a sum that is not -0 (0 + p_c never is) is
               unchanged by adding either zero.  The first + 0 stays: without it a dot of
               signed zeros can end -0 (test_signed_zero_channel_dots_agree_across_builds) */
            __m512 p = _mm512_add_ps(_mm512_setzero_ps(), _mm512_mul_ps(
                _mm512_loadu_ps(go), _mm512_loadu_ps(a->x + off)));
            s = _mm256_add_ps(_mm512_castps512_ps256(p), _mm512_extractf32x8_ps(p, 1));
            for (c = 16; c < C; c += 16) {
                p = _mm512_mul_ps(_mm512_loadu_ps(go + c), _mm512_loadu_ps(a->x + off + c));
                s = _mm256_add_ps(s, _mm512_castps512_ps256(p));
                s = _mm256_add_ps(s, _mm512_extractf32x8_ps(p, 1));
            }
            return s;
        }
    #endif
        for (c = 0; c < C; c += 8)
            s = _mm256_add_ps(s, _mm256_mul_ps(_mm256_loadu_ps(go + c), gs3d_cl_ld8(a->x, a->xh, off + c, xk)));
        return s;
    }
    /* lanes 0 + 4, 1 + 5, 2 + 6, 3 + 7 of a (low half) and of b (high half) */
    GS3D_ALWAYS_INLINE __m256 gs3d_cl_fold(__m256 a, __m256 b) {
        return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20),
                             _mm256_permute2f128_ps(a, b, 0x31));
    }
    /* dst[c] += w * go[c] for the C (a multiple of 8) channels: gs3d_axpy_f's products and
       sums (sixteen lanes at a time in the AVX-512 build when C is a multiple of 16) */
    GS3D_ALWAYS_INLINE void gs3d_cl_axpy(float* dst, float wf, const float* go,
                                         const Py_ssize_t C) {
        const __m256 w = _mm256_set1_ps(wf);
        Py_ssize_t c;
    #if defined(__AVX512F__) && defined(__AVX512DQ__)
        if (C % 16 == 0) {
            const __m512 w16 = _mm512_broadcastss_ps(_mm256_castps256_ps128(w));
            for (c = 0; c < C; c += 16)
                _mm512_storeu_ps(dst + c, _mm512_add_ps(
                    _mm512_loadu_ps(dst + c), _mm512_mul_ps(w16, _mm512_loadu_ps(go + c))));
            return;
        }
    #endif
        for (c = 0; c < C; c += 8)
            _mm256_storeu_ps(dst + c, _mm256_add_ps(_mm256_loadu_ps(dst + c),
                                                    _mm256_mul_ps(w, _mm256_loadu_ps(go + c))));
    }
    /* the eight corners' dot vectors v[j] (8 lanes each; overwritten) reduced to one vector of
       their dots, corners 0 2 4 6 | 1 3 5 7, in lane_sum's tree and operand order */
    GS3D_ALWAYS_INLINE __m256 gs3d_cl_reduce8(__m256* v) {
        __m256 e, h;
        /* per half, the lane pairs of corners 0 2 4 6 (low) and 1 3 5 7 (high) */
        v[0] = gs3d_cl_fold(v[0], v[1]);
        v[2] = gs3d_cl_fold(v[2], v[3]);
        v[4] = gs3d_cl_fold(v[4], v[5]);
        v[6] = gs3d_cl_fold(v[6], v[7]);
        /* (0 4) + (2 6) and (1 5) + (3 7), two corners per half */
        e = _mm256_add_ps(_mm256_shuffle_ps(v[0], v[2], 0x44),
                          _mm256_shuffle_ps(v[0], v[2], 0xEE));
        h = _mm256_add_ps(_mm256_shuffle_ps(v[4], v[6], 0x44),
                          _mm256_shuffle_ps(v[4], v[6], 0xEE));
        /* their sums: the dots of corners 0 2 4 6 | 1 3 5 7 */
        return _mm256_add_ps(_mm256_shuffle_ps(e, h, 0x88), _mm256_shuffle_ps(e, h, 0xDD));
    }
    /* eight consecutive values of a tile array from index i0 (n of them, the rest 0), as floats */
    GS3D_ALWAYS_INLINE __m256 gs3d_cl_ld8d(const double* v, int i0, int n) {
        double t[8];
        int l;
        if (n == 8)
            return _mm256_set_m128(_mm256_cvtpd_ps(_mm256_loadu_pd(v + i0 + 4)),
                                   _mm256_cvtpd_ps(_mm256_loadu_pd(v + i0)));
        for (l = 0; l < 8; l++)
            t[l] = l < n ? v[i0 + l] : 0.0;
        return _mm256_set_m128(_mm256_cvtpd_ps(_mm256_loadu_pd(t + 4)),
                               _mm256_cvtpd_ps(_mm256_loadu_pd(t)));
    }
    GS3D_ALWAYS_INLINE void gs3d_cl_run(const gs3d_cl_args* a, const Py_ssize_t C, const int xk) {
        const Py_ssize_t T = a->tile, qc = a->qc;
        const int cnt = a->cnt;
        float gbuf[GS3D_CL_GOBUF];
        unsigned char vd8[8];
        __m256 R[8], v[8], d[8], w6[6], gx, gy, gz;
        __m256i vdv, mj[8], mall;
        int i, i0, n, l, j;
        unsigned gm;
        Py_ssize_t c;
        /* eight points at a time: each point's corner dots (one vector, corners 0 2 4 6 | 1 3
           5 7) and its input-gradient scatter in point order, then the eight points' grid
           gradients together, lane by lane with grid_grad_of's operations */
        for (i0 = 0; i0 < cnt; i0 += 8) {
            n = cnt - i0 < 8 ? cnt - i0 : 8;
            gm = 0;
            for (l = 0; l < 8; l++) {
                R[l] = _mm256_setzero_ps();
                vd8[l] = 0;
            }
            for (l = 0; l < n; l++) {
                i = i0 + l;
                const int k = i + a->ahead;
                const unsigned own = a->own[i], vs = a->vs[i], vd = own ? a->vd[i] : 0;
                /* (16-bit, in place: converted into gbuf below; a->go is not grad_output) */
                const float* go = a->staged ? a->go + C * i : xk ? gbuf : a->go + a->ob[i];
                if (k < cnt && (a->vs[k] || (a->own[k] && a->vd[k])))
                    gs3d_cl_prefetch(a, k);
                if (xk && !a->staged) {
                    if (vs | vd)
                        for (c = 0; c < C; c += 8)
                            _mm256_storeu_ps(gbuf + c, gs3d_cl_ld8(NULL, a->goh, a->ob[i] + c, xk));
                }
                if (own) {
                    gm |= 1u << l;
                    vd8[l] = (unsigned char)vd;
                }
                if (vd) {
                    for (j = 0; j < 8; j++)
                        v[j] = (vd >> j) & 1 ? gs3d_cl_dot(a, go, a->xb[i] + a->xd[j], C, xk)
                                             : _mm256_setzero_ps();
                    R[l] = gs3d_cl_reduce8(v);
                }
                for (j = 0; j < 8; j++)
                    if ((vs >> j) & 1)
                        gs3d_cl_axpy(a->A + a->ab[i] + a->ad[j], (float)a->w[j * T + i], go, C);
            }
            if (!gm)
                continue;
            /* R[k], lane l: point l's dot of corner 2k (k < 4) or 2 (k - 4) + 1 */
            gs3d_transpose8(R);
            for (j = 0; j < 8; j++)
                d[j] = R[(j >> 1) + 4 * (j & 1)];
            vdv = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)vd8));
            mall = _mm256_cmpeq_epi32(vdv, _mm256_set1_epi32(0xFF));
            for (j = 0; j < 8; j++) {
                const __m256i bit = _mm256_set1_epi32(1 << j);
                mj[j] = _mm256_cmpeq_epi32(_mm256_and_si256(vdv, bit), bit);
            }
            for (j = 0; j < 6; j++)
                w6[j] = gs3d_cl_ld8d(a->f + j * T, i0, n);
            gs3d_grid_grad8(d, w6, mj, mall, &gx, &gy, &gz);
            gx = _mm256_mul_ps(gs3d_cl_ld8d(a->mult, i0, n), gx);
            gy = _mm256_mul_ps(gs3d_cl_ld8d(a->mult + T, i0, n), gy);
            gz = _mm256_mul_ps(gs3d_cl_ld8d(a->mult + 2 * T, i0, n), gz);
            gs3d_put_grid_grad8(a->dq, a->dqh, xk, a->oq + i0, 0, 0, qc, gm, n, gx, gy, gz);
        }
    }
    /* the usual channel counts with the channel loops unrolled, per input kind */
    #define GS3D_CL_CASES(XK) switch (a->C) { \
            case 8: gs3d_cl_run(a, 8, XK); break; \
            case 16: gs3d_cl_run(a, 16, XK); break; \
            case 24: gs3d_cl_run(a, 24, XK); break; \
            case 32: gs3d_cl_run(a, 32, XK); break; \
            default: gs3d_cl_run(a, a->C, XK); }
    /* dst[l * ds + r] = src[r * ss + l] for r < R, l < L: the transposition between channel
       planes and channels-last rows (NCDHW <-> NDHWC copies, grad_output staged for
       gs3d_backward_cl_avx2), by 8 x 8 blocks in registers, the edges element by element.
       The source is float32 (xk 0), float16 (1) or bfloat16 (2) converted to float32 (exact,
       as gs3d_cl_ld8): the values, and their bits, of the scalar loops.  ``pf`` elements past
       the end of each source row in a block of eight rows are prefetched (the next call's,
       when they follow on; a last R % 8 rows are not). */
    GS3D_ALWAYS_INLINE void gs3d_transpose_body(const float* src, const uint16_t* srch,
                                                const int xk, Py_ssize_t ss, Py_ssize_t R,
                                                Py_ssize_t L, float* dst, Py_ssize_t ds,
                                                Py_ssize_t pf) {
        const Py_ssize_t r8 = R - R % 8, l8 = L - L % 8, isz = xk ? 2 : 4;
        Py_ssize_t r, l, k;
        __m256 v[8];
        for (r = 0; r < r8; r += 8) {
            if (pf > 0)
                for (k = 0; k < 8; k++)
                    gs3d_cl_span(xk ? (const char*)(srch + (r + k) * ss + L)
                                    : (const char*)(src + (r + k) * ss + L), pf * isz);
            for (l = 0; l < l8; l += 8) {
                for (k = 0; k < 8; k++)
                    v[k] = gs3d_cl_ld8(src, srch, (r + k) * ss + l, xk);
                gs3d_transpose8(v);
                for (k = 0; k < 8; k++)
                    _mm256_storeu_ps(dst + (l + k) * ds + r, v[k]);
            }
            for (l = l8; l < L; l++)
                for (k = 0; k < 8; k++)
                    dst[l * ds + r + k] = gs3d_cl_ld1(src, srch, (r + k) * ss + l, xk);
        }
        for (l = 0; l < L; l++)
            for (r = r8; r < R; r++)
                dst[l * ds + r] = gs3d_cl_ld1(src, srch, r * ss + l, xk);
    }
    static void gs3d_transpose_f(const float* src, Py_ssize_t ss, Py_ssize_t R, Py_ssize_t L,
                                 float* dst, Py_ssize_t ds, Py_ssize_t pf) {
        gs3d_transpose_body(src, NULL, 0, ss, R, L, dst, ds, pf);
    }
    static void gs3d_transpose_hf(const uint16_t* src, Py_ssize_t ss, Py_ssize_t R,
                                  Py_ssize_t L, float* dst, Py_ssize_t ds, Py_ssize_t pf, int bf) {
        if (bf)
            gs3d_transpose_body(NULL, src, 2, ss, R, L, dst, ds, pf);
        else
            gs3d_transpose_body(NULL, src, 1, ss, R, L, dst, ds, pf);
    }
    /* the same transposition of 16-bit values, copied as they are (8 x 8 blocks of 16-bit
       lanes) */
    static void gs3d_transpose_u16(const uint16_t* src, Py_ssize_t ss, Py_ssize_t R,
                                   Py_ssize_t L, uint16_t* dst, Py_ssize_t ds, Py_ssize_t pf) {
        const Py_ssize_t r8 = R - R % 8, l8 = L - L % 8;
        Py_ssize_t r, l, k;
        __m128i a[8], t[8];
        for (r = 0; r < r8; r += 8) {
            if (pf > 0)
                for (k = 0; k < 8; k++)
                    gs3d_cl_span((const char*)(src + (r + k) * ss + L), pf * 2);
            for (l = 0; l < l8; l += 8) {
                for (k = 0; k < 8; k++)
                    a[k] = _mm_loadu_si128((const __m128i*)(src + (r + k) * ss + l));
                for (k = 0; k < 8; k += 2) {
                    t[k] = _mm_unpacklo_epi16(a[k], a[k + 1]);      /* columns 0-3 */
                    t[k + 1] = _mm_unpackhi_epi16(a[k], a[k + 1]);  /* columns 4-7 */
                }
                for (k = 0; k < 8; k += 4) {
                    a[k] = _mm_unpacklo_epi32(t[k], t[k + 2]);      /* columns 0, 1 */
                    a[k + 1] = _mm_unpackhi_epi32(t[k], t[k + 2]);  /* 2, 3 */
                    a[k + 2] = _mm_unpacklo_epi32(t[k + 1], t[k + 3]);  /* 4, 5 */
                    a[k + 3] = _mm_unpackhi_epi32(t[k + 1], t[k + 3]);  /* 6, 7 */
                }
                /* a[k] (k < 4): columns 2k, 2k + 1 of rows r..r+3; a[k + 4] of rows r+4..r+7 */
                for (k = 0; k < 4; k++) {
                    _mm_storeu_si128((__m128i*)(dst + (l + 2 * k) * ds + r),
                                     _mm_unpacklo_epi64(a[k], a[k + 4]));
                    _mm_storeu_si128((__m128i*)(dst + (l + 2 * k + 1) * ds + r),
                                     _mm_unpackhi_epi64(a[k], a[k + 4]));
                }
            }
            for (l = l8; l < L; l++)
                for (k = 0; k < 8; k++)
                    dst[l * ds + r + k] = src[(r + k) * ss + l];
        }
        for (l = 0; l < L; l++)
            for (r = r8; r < R; r++)
                dst[l * ds + r] = src[r * ss + l];
    }
    /* the same transposition of float64 values (or any 64-bit ones: copied as they are), by
       4 x 4 blocks in registers */
    static void gs3d_transpose_d(const double* src, Py_ssize_t ss, Py_ssize_t R, Py_ssize_t L,
                                 double* dst, Py_ssize_t ds, Py_ssize_t pf) {
        const Py_ssize_t r4 = R - R % 4, l4 = L - L % 4;
        Py_ssize_t r, l, k;
        __m256d a0, a1, a2, a3, t0, t1, t2, t3;
        for (r = 0; r < r4; r += 4) {
            if (pf > 0)
                for (k = 0; k < 4; k++)
                    gs3d_cl_span((const char*)(src + (r + k) * ss + L), pf * 8);
            for (l = 0; l < l4; l += 4) {
                a0 = _mm256_loadu_pd(src + r * ss + l);
                a1 = _mm256_loadu_pd(src + (r + 1) * ss + l);
                a2 = _mm256_loadu_pd(src + (r + 2) * ss + l);
                a3 = _mm256_loadu_pd(src + (r + 3) * ss + l);
                t0 = _mm256_unpacklo_pd(a0, a1);    /* columns 0, 2 of rows r, r + 1 */
                t1 = _mm256_unpackhi_pd(a0, a1);    /* columns 1, 3 */
                t2 = _mm256_unpacklo_pd(a2, a3);
                t3 = _mm256_unpackhi_pd(a2, a3);
                _mm256_storeu_pd(dst + l * ds + r, _mm256_permute2f128_pd(t0, t2, 0x20));
                _mm256_storeu_pd(dst + (l + 1) * ds + r, _mm256_permute2f128_pd(t1, t3, 0x20));
                _mm256_storeu_pd(dst + (l + 2) * ds + r, _mm256_permute2f128_pd(t0, t2, 0x31));
                _mm256_storeu_pd(dst + (l + 3) * ds + r, _mm256_permute2f128_pd(t1, t3, 0x31));
            }
            for (l = l4; l < L; l++)
                for (k = 0; k < 4; k++)
                    dst[l * ds + r + k] = src[(r + k) * ss + l];
        }
        for (l = 0; l < L; l++)
            for (r = r4; r < R; r++)
                dst[l * ds + r] = src[r * ss + l];
    }
    /* dst[l * ds + r] = src[r * ss + l] rounded to 16-bit storage (float16, or bfloat16 when
       bf): eight values of dst at a time by gs3d_store8_h (the bits of store_planes' scalar
       rounding), the partial blocks of the edges through a padded block */
    static void gs3d_transpose_fh(const float* src, Py_ssize_t ss, Py_ssize_t R, Py_ssize_t L,
                                  uint16_t* dst, Py_ssize_t ds, int bf) {
        const Py_ssize_t l8 = L - L % 8;
        Py_ssize_t r, l, k, n;
        __m256 v[8];
        float e[8];
        uint16_t h[8];
        for (r = 0; r < R; r += 8) {
            n = R - r < 8 ? R - r : 8;
            for (l = 0; n == 8 && l < l8; l += 8) {
                for (k = 0; k < 8; k++)
                    v[k] = _mm256_loadu_ps(src + (r + k) * ss + l);
                gs3d_transpose8(v);
                for (k = 0; k < 8; k++)
                    gs3d_store8_h(v[k], dst + (l + k) * ds + r, bf);
            }
            for (l = n == 8 ? l8 : 0; l < L; l++) {
                for (k = 0; k < 8; k++)
                    e[k] = k < n ? src[(r + k) * ss + l] : 0.0f;
                gs3d_store8_h(_mm256_loadu_ps(e), h, bf);
                for (k = 0; k < n; k++)
                    dst[l * ds + r + k] = h[k];
            }
        }
    }
    static void gs3d_backward_cl_avx2(const gs3d_cl_args* a) {
        if (a->xkind == 0) { GS3D_CL_CASES(0) }
        else if (a->xkind == 1) { GS3D_CL_CASES(1) }
        else { GS3D_CL_CASES(2) }
    }
    #undef GS3D_CL_CASES
    /* backward_tile for cnt <= 64 float32 or 16-bit (xk, as gs3d_cl_run: values converted
       exactly, the grid gradient rounded once) points with channels contiguous in the input
       (W stride sx), in the float32 accumulator A (W stride ax) when do_dx, C a multiple of
       8, bilinear any padding: setup_tile and gs3d_cl_run's operations and bits without the
       tile's arrays.  The points are mapped eight at a time by gs3d_map8 (setup_tile_f's
       mapping: the same masks, weights and multipliers; the points owned and the corners in
       the depth slab [zlo, zhi) as gs3d_backward_gather_body finds them; with ``prefetch``,
       the first block's corner rows prefetched at once, every later point's by the point
       eight before it, as the tile loop's AHEAD does: all four rows of the input and the
       accumulator when ``prefetch`` is 1, only the input's row ``lead`` (depth + (lead >> 1),
       height + (lead & 1); see lead_row in _kernels.pyx) when 2); then point by point,
       in order, its corner dots (gs3d_cl_dot, reduced by gs3d_cl_reduce8) and its scatter
       (gs3d_cl_run's), and the eight points' grid gradients together (gs3d_grid_grad8).
       grad_output's point p is at go + p gp with its channels at step gc: read in place when
       gc is 1 (float32 off a 64-byte line with C <= 32: each point's copied to an aligned
       local first; 16-bit: converted into ``stage`` eight points at a time), else staged into
       ``stage`` (64 * 64 floats, the kernels' STAGE): the whole tile at once when its points
       are at step 1 and C * cnt fits (gs3d_transpose_f / _hf, as the tile loop stages it;
       the next tile's nxt points prefetched), else eight points at a time by 8 x 8
       transpositions.  Offsets are int32 (the caller checks int32_offsets). */
    /* the corner rows of the points of block B: of the input (xbytes, isz-byte elements) for
       the points owned, of the accumulator for those with corners in the slab */
    static inline void gs3d_rows_prefetch8(const gs3d_rows_args* a, const gs3d_bblock8* B,
                                           const char* xbytes, Py_ssize_t isz, Py_ssize_t rlo,
                                           Py_ssize_t rlen, Py_ssize_t alo, Py_ssize_t alen) {
        if (B->ownb)
            gs3d_prefetch_rows8(xbytes, isz, B->base, (unsigned)B->ownb, a->sy, a->sz, rlo,
                                rlen);
        if (B->slabb)
            gs3d_prefetch_rows8(a->A, 4, B->abase, (unsigned)B->slabb, a->ay, a->az, alo, alen);
    }
    /* of the points owned of block B, the input's lead row alone (xlead bytes from row x0) */
    static inline void gs3d_rows_lead8(const gs3d_bblock8* B, const char* xbytes,
                                       Py_ssize_t isz, Py_ssize_t xlead, Py_ssize_t rlen) {
        int bo[8], l;
        _mm256_storeu_si256((__m256i*)bo, B->base);
        for (l = 0; l < 8; l++)
            if ((B->ownb >> l) & 1)
                gs3d_cl_span(xbytes + isz * (Py_ssize_t)bo[l] + xlead, rlen);
    }
    GS3D_ALWAYS_INLINE void gs3d_backward_rows_body(const gs3d_rows_args* a, Py_ssize_t cnt,
                                                    float* stage, const Py_ssize_t C,
                                                    const int dx, const int xk) {
        const Py_ssize_t sx = a->sx, sy = a->sy, sz = a->sz, ax = a->ax, ay = a->ay, az = a->az;
        const Py_ssize_t isz = xk ? 2 : 4;
        const char* xbytes = xk ? (const char*)a->xh : (const char*)a->x;
        const Py_ssize_t rlo = sx < 0 ? isz * sx : 0, rlen = isz * ((sx < 0 ? -sx : sx) + C);
        const Py_ssize_t alo = ax < 0 ? 4 * ax : 0, alen = 4 * ((ax < 0 ? -ax : ax) + C);
        const int all_planes = a->zlo <= 0 && a->zhi >= a->D;
        /* the later points' corner rows prefetched: all four of the input and the
           accumulator, or the input's lead row alone (its offset in bytes from row x0) */
        const int lead_only = a->prefetch == 2;
        const Py_ssize_t xlead = isz * ((a->lead >> 1) * sz + (a->lead & 1) * sy) + rlo;
        const __m256 zero = _mm256_setzero_ps();
        gs3d_cl_args xa;            /* gs3d_cl_dot reads only its x */
        gs3d_bblock8 blk[8];
        __m256 R[8], v[8], d[8], mv[3], gx, gy, gz;
        __m256i idx[3], okv[3], vld, mj[8], mall, slab, vs8;
        float wa[8][8];
        /* a point's grad_output channels, copied here when read in place off a 64-byte
           boundary: its sixteen loads (eight dots, eight scatters, which the compiler must
           assume could change them in place) then stay within cache lines */
        float gl[32] __attribute__((aligned(64)));
        int ol[8][8], oa[8][8];
        unsigned mb[8], vsb[8], vd, vs;
        Py_ssize_t p, c;
        int l, j, k, b, cb, nb, r, whole;
        memset(&xa, 0, sizeof(xa));
        xa.x = a->x;
        xa.xh = a->xh;
        nb = (int)(cnt + 7) / 8;
        for (b = 0; b < nb; b++) {
            gs3d_bblock8* B = &blk[b];
            p = 8 * b;
            k = cnt - p < 8 ? (int)(cnt - p) : 8;
            gs3d_map8(xk ? NULL : a->q + p * a->qp, xk ? a->qh + p * a->qp : NULL, xk, a->qp,
                      a->qc, k, a->W, a->H, a->D, a->align, a->border, idx, B->m, B->w, okv, mv);
            vld = _mm256_and_si256(_mm256_and_si256(okv[0], okv[1]), okv[2]);
            for (j = 0; j < 3; j++)
                B->mult[j] = _mm256_and_ps(mv[j], _mm256_castsi256_ps(vld));
            B->iz = idx[2];
            B->base = gs3d_offset8(idx, sx, sy, sz);
            B->abase = dx ? gs3d_offset8(idx, ax, ay, az) : _mm256_setzero_si256();
            B->own = gs3d_own8(idx[2], a->own_all, a->zlo, a->zhi, a->D);
            slab = gs3d_slab8(idx[2], all_planes, a->zlo, a->zhi);
            B->ownb = (a->do_dg ? _mm256_movemask_ps(_mm256_castsi256_ps(B->own)) : 0)
                      & ((1 << k) - 1);
            B->slabb = (a->do_dx ? _mm256_movemask_ps(_mm256_castsi256_ps(slab)) : 0)
                       & ((1 << k) - 1);
        }
        whole = a->gc != 1 && a->gp == 1 && C * cnt <= 64 * 64;
        if (whole && xk)
            gs3d_transpose_hf(a->goh, a->gc, C, cnt, stage, C, a->nxt, xk == 2);
        else if (whole)
            gs3d_transpose_f(a->go, a->gc, C, cnt, stage, C, a->nxt);
        /* the first block's corner rows now, every later point's eight points ahead */
        if (lead_only)
            gs3d_rows_lead8(&blk[0], xbytes, isz, xlead, rlen);
        else if (a->prefetch)
            gs3d_rows_prefetch8(a, &blk[0], xbytes, isz, rlo, rlen, alo, alen);
        for (cb = 0; cb < nb; cb++) {
            const gs3d_bblock8* B = &blk[cb];
            int nxo[8], nxa[8];
            /* the next block's points whose rows to prefetch: all four of the input and of
               the accumulator, or the input's lead row alone */
            unsigned nown = 0, nsl = 0, nlead = 0;
            if (a->prefetch && cb + 1 < nb) {
                if (lead_only) {
                    nlead = (unsigned)blk[cb + 1].ownb;
                } else {
                    nown = (unsigned)blk[cb + 1].ownb;
                    nsl = (unsigned)blk[cb + 1].slabb;
                }
                _mm256_storeu_si256((__m256i*)nxo, blk[cb + 1].base);
                _mm256_storeu_si256((__m256i*)nxa, blk[cb + 1].abase);
            }
            if (!(B->ownb | B->slabb)) {
                /* nothing of these eight points is this call's */
                if (nlead)
                    gs3d_rows_lead8(&blk[cb + 1], xbytes, isz, xlead, rlen);
                else if (nown | nsl)
                    gs3d_rows_prefetch8(a, &blk[cb + 1], xbytes, isz, rlo, rlen, alo, alen);
                continue;
            }
            p = 8 * cb;
            k = cnt - p < 8 ? (int)(cnt - p) : 8;
            mall = _mm256_set1_epi32(-1);
            for (j = 0; j < 8; j++) {
                const Py_ssize_t cz = j >> 2, cy = (j >> 1) & 1, cx = j & 1;
                mj[j] = gs3d_corner_mask8(B->m, j);
                mall = _mm256_and_si256(mall, mj[j]);
                mb[j] = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(mj[j]));
                _mm256_storeu_si256((__m256i*)ol[j], _mm256_add_epi32(B->base,
                    _mm256_set1_epi32((int)(cz * sz + cy * sy + cx * sx))));
                if (!dx)
                    continue;
                vs8 = mj[j];
                if (!all_planes) {
                    const __m256i z = _mm256_add_epi32(B->iz, _mm256_set1_epi32((int)cz));
                    vs8 = _mm256_and_si256(vs8, _mm256_and_si256(
                        _mm256_cmpgt_epi32(z, _mm256_set1_epi32((int)a->zlo - 1)),
                        _mm256_cmpgt_epi32(_mm256_set1_epi32((int)a->zhi), z)));
                }
                vsb[j] = B->slabb ? (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(vs8))
                                    & (unsigned)B->slabb : 0;
                _mm256_storeu_ps(wa[j], gs3d_corner_weight8(B->w, j));
                _mm256_storeu_si256((__m256i*)oa[j], _mm256_add_epi32(B->abase,
                    _mm256_set1_epi32((int)(cz * az + cy * ay + cx * ax))));
            }
            if (a->gc != 1 && !whole) {
                /* stage[l C + c] = channel c of point p + l */
                for (c = 0; c < C; c += 8) {
                    for (r = 0; r < 8; r++)
                        v[r] = k == 8 && a->gp == 1
                            ? gs3d_cl_ld8(a->go, a->goh, (c + r) * a->gc + p, xk)
                            : gs3d_ld8_step(a->go, a->goh, xk, (c + r) * a->gc + p * a->gp,
                                            a->gp, k, 0.0f);
                    gs3d_transpose8(v);
                    for (l = 0; l < k; l++)
                        _mm256_storeu_ps(stage + l * C + c, v[l]);
                }
            } else if (xk && a->gc == 1) {
                /* 16-bit grad_output, channels contiguous: converted point by point */
                for (l = 0; l < k; l++)
                    for (c = 0; c < C; c += 8)
                        _mm256_storeu_ps(stage + l * C + c,
                                         gs3d_cl_ld8(NULL, a->goh, (p + l) * a->gp + c, xk));
            }
            for (l = 0; l < 8; l++) {
                const float* go = a->gc == 1 && !xk ? a->go + (p + l) * a->gp
                                  : stage + (whole ? p + l : l) * C;
                if (l < k && a->gc == 1 && !xk && C <= 32 && ((size_t)go & 63)) {
                    memcpy(gl, go, 4 * C);
                    go = gl;
                }
                for (r = 0; r < ((nown >> l) & 1 ? 4 : 0); r++)
                    gs3d_cl_span(xbytes + isz * (nxo[l] + (r >> 1) * sz + (r & 1) * sy) + rlo,
                                 rlen);
                for (r = 0; r < ((nsl >> l) & 1 ? 4 : 0); r++)
                    gs3d_cl_span((const char*)(a->A + nxa[l] + (r >> 1) * az + (r & 1) * ay) + alo,
                                 alen);
                if ((nlead >> l) & 1)
                    gs3d_cl_span(xbytes + isz * nxo[l] + xlead, rlen);
                vd = vs = 0;
                for (j = 0; j < 8; j++) {
                    vd |= ((mb[j] >> l) & 1u) << j;
                    if (dx)
                        vs |= ((vsb[j] >> l) & 1u) << j;
                }
                if (!((B->ownb >> l) & 1))
                    vd = 0;
                R[l] = zero;
                if (vd) {
                    for (j = 0; j < 8; j++)
                        v[j] = (vd >> j) & 1 ? gs3d_cl_dot(&xa, go, ol[j][l], C, xk) : zero;
                    R[l] = gs3d_cl_reduce8(v);
                }
                for (j = 0; j < (dx ? 8 : 0); j++)
                    if ((vs >> j) & 1)
                        gs3d_cl_axpy(a->A + oa[j][l], wa[j][l], go, C);
            }
            if (!B->ownb)
                continue;
            /* R[k], lane l: point l's dot of corner 2k (k < 4) or 2 (k - 4) + 1 */
            gs3d_transpose8(R);
            for (j = 0; j < 8; j++)
                d[j] = R[(j >> 1) + 4 * (j & 1)];
            gs3d_grid_grad8(d, B->w, mj, mall, &gx, &gy, &gz);
            gx = _mm256_mul_ps(B->mult[0], gx);
            gy = _mm256_mul_ps(B->mult[1], gy);
            gz = _mm256_mul_ps(B->mult[2], gz);
            gs3d_put_grid_grad8(a->dq, a->dqh, xk, NULL, p * a->dp, a->dp, a->dc,
                                (unsigned)B->ownb, k, gx, gy, gz);
        }
    }
    /* the usual channel counts with the channel loops unrolled, with and without the input
       gradient, per storage (float32, float16, bfloat16) */
    #define GS3D_ROWS_CASES(DX, XK) switch (a->C) { \
            case 8: gs3d_backward_rows_body(a, cnt, stage, 8, DX, XK); break; \
            case 16: gs3d_backward_rows_body(a, cnt, stage, 16, DX, XK); break; \
            case 24: gs3d_backward_rows_body(a, cnt, stage, 24, DX, XK); break; \
            case 32: gs3d_backward_rows_body(a, cnt, stage, 32, DX, XK); break; \
            default: gs3d_backward_rows_body(a, cnt, stage, a->C, DX, XK); }
    static void gs3d_backward_rows(const gs3d_rows_args* a, Py_ssize_t cnt, float* stage) {
        if (a->xk == 1 && a->do_dx) { GS3D_ROWS_CASES(1, 1) }
        else if (a->xk == 1) { GS3D_ROWS_CASES(0, 1) }
        else if (a->xk == 2 && a->do_dx) { GS3D_ROWS_CASES(1, 2) }
        else if (a->xk == 2) { GS3D_ROWS_CASES(0, 2) }
        else if (a->do_dx) { GS3D_ROWS_CASES(1, 0) }
        else { GS3D_ROWS_CASES(0, 0) }
    }
    #undef GS3D_ROWS_CASES
    /* The forward's channels-last loop for C a multiple of 8 (AVX2 build), with
       forward_tile's bits: per channel, from +0, w_j * x_j added corner by corner in corner
       order over the corners in bounds.  16-bit inputs are converted as gs3d_cl_ld8 does (the
       caller stages the float32 results and rounds them). */
    GS3D_ALWAYS_INLINE void gs3d_clf_run(const gs3d_clf_args* a, const Py_ssize_t C, const int xk) {
        const Py_ssize_t T = a->tile;
        int i, j, r;
        Py_ssize_t c;
        for (i = a->i0; i < a->i1; i++) {
            const unsigned vs = a->vs[i];
            const int k = i + a->ahead;
            float* o = a->ob ? a->out + a->ob[i] : a->out + (i - a->i0) * C;
            if (k < a->cnt && a->vs[k])
                for (r = 0; r < 4; r++)
                    if ((a->vs[k] >> (2 * r)) & 3)
                        gs3d_cl_span((xk ? (const char*)(a->xh + a->xb[k] + a->xd[2 * r])
                                         : (const char*)(a->x + a->xb[k] + a->xd[2 * r]))
                                     + a->px_lo, a->px_n);
            for (c = 0; c < C; c += 8) {
                __m256 s = _mm256_setzero_ps();
                for (j = 0; j < 8; j++)
                    if ((vs >> j) & 1)
                        s = _mm256_add_ps(s, _mm256_mul_ps(
                            _mm256_set1_ps((float)a->w[j * T + i]),
                            gs3d_cl_ld8(a->x, a->xh, a->xb[i] + a->xd[j] + c, xk)));
                _mm256_storeu_ps(o + c, s);
            }
        }
    }
    #define GS3D_CLF_CASES(XK) switch (a->C) { \
            case 8: gs3d_clf_run(a, 8, XK); break; \
            case 16: gs3d_clf_run(a, 16, XK); break; \
            case 24: gs3d_clf_run(a, 24, XK); break; \
            case 32: gs3d_clf_run(a, 32, XK); break; \
            default: gs3d_clf_run(a, a->C, XK); }
    static void gs3d_forward_cl_avx2(const gs3d_clf_args* a) {
        if (a->xkind == 0) { GS3D_CLF_CASES(0) }
        else if (a->xkind == 1) { GS3D_CLF_CASES(1) }
        else { GS3D_CLF_CASES(2) }
    }
    #undef GS3D_CLF_CASES
    #else
    #define GS3D_HAVE_SIMD_GATHER 0
    static void gs3d_forward_gather_avx2(const float* x, Py_ssize_t sx, Py_ssize_t sy,
                                     Py_ssize_t sz, Py_ssize_t W, Py_ssize_t H, Py_ssize_t D,
                                     Py_ssize_t C, Py_ssize_t xc, const float* q, Py_ssize_t qp,
                                     Py_ssize_t qc, float* out, Py_ssize_t op, Py_ssize_t oc,
                                     Py_ssize_t cnt, int align, int border, int prefetch) {
        (void)x; (void)sx; (void)sy; (void)sz; (void)W; (void)H; (void)D; (void)C; (void)xc;
        (void)q; (void)qp; (void)qc; (void)out; (void)op; (void)oc; (void)cnt; (void)align;
        (void)border; (void)prefetch;
    }
    static void gs3d_forward_gather_h(const uint16_t* x, Py_ssize_t sx, Py_ssize_t sy,
                                      Py_ssize_t sz, Py_ssize_t W, Py_ssize_t H, Py_ssize_t D,
                                      Py_ssize_t C, Py_ssize_t xc, const uint16_t* q,
                                      Py_ssize_t qp, Py_ssize_t qc, uint16_t* out, Py_ssize_t op,
                                      Py_ssize_t oc, Py_ssize_t cnt, int align, int border,
                                      int bf, Py_ssize_t xlast) {
        (void)x; (void)sx; (void)sy; (void)sz; (void)W; (void)H; (void)D; (void)C; (void)xc;
        (void)q; (void)qp; (void)qc; (void)out; (void)op; (void)oc; (void)cnt; (void)align;
        (void)border; (void)bf; (void)xlast;
    }
    static void gs3d_setup_tile_f(const gs3d_setup_args* a) { (void)a; }
    static void gs3d_backward_gather_avx2(const gs3d_bwd_args* a, Py_ssize_t cnt) {
        (void)a; (void)cnt;
    }
    static void gs3d_tile_planes_f(const float* q, Py_ssize_t qp, Py_ssize_t qc,
                                   Py_ssize_t cnt, Py_ssize_t D, int align, int border,
                                   Py_ssize_t* lo, Py_ssize_t* hi) {
        (void)q; (void)qp; (void)qc; (void)cnt; (void)D; (void)align; (void)border;
        (void)lo; (void)hi;
    }
    static void gs3d_tile_planes_h(const uint16_t* q, int bf, Py_ssize_t qp, Py_ssize_t qc,
                                   Py_ssize_t cnt, Py_ssize_t D, int align, int border,
                                   Py_ssize_t* lo, Py_ssize_t* hi) {
        (void)q; (void)bf; (void)qp; (void)qc; (void)cnt; (void)D; (void)align; (void)border;
        (void)lo; (void)hi;
    }
    static void gs3d_backward_cl_avx2(const gs3d_cl_args* a) { (void)a; }
    static void gs3d_backward_rows(const gs3d_rows_args* a, Py_ssize_t cnt, float* stage) {
        (void)a; (void)cnt; (void)stage;
    }
    static void gs3d_transpose_f(const float* src, Py_ssize_t ss, Py_ssize_t R, Py_ssize_t L,
                                 float* dst, Py_ssize_t ds, Py_ssize_t pf) {
        (void)src; (void)ss; (void)R; (void)L; (void)dst; (void)ds; (void)pf;
    }
    static void gs3d_transpose_hf(const uint16_t* src, Py_ssize_t ss, Py_ssize_t R,
                                  Py_ssize_t L, float* dst, Py_ssize_t ds, Py_ssize_t pf, int bf) {
        (void)src; (void)ss; (void)R; (void)L; (void)dst; (void)ds; (void)pf; (void)bf;
    }
    static void gs3d_transpose_u16(const uint16_t* src, Py_ssize_t ss, Py_ssize_t R,
                                   Py_ssize_t L, uint16_t* dst, Py_ssize_t ds, Py_ssize_t pf) {
        (void)src; (void)ss; (void)R; (void)L; (void)dst; (void)ds; (void)pf;
    }
    static void gs3d_transpose_fh(const float* src, Py_ssize_t ss, Py_ssize_t R, Py_ssize_t L,
                                  uint16_t* dst, Py_ssize_t ds, int bf) {
        (void)src; (void)ss; (void)R; (void)L; (void)dst; (void)ds; (void)bf;
    }
    static void gs3d_transpose_d(const double* src, Py_ssize_t ss, Py_ssize_t R, Py_ssize_t L,
                                 double* dst, Py_ssize_t ds, Py_ssize_t pf) {
        (void)src; (void)ss; (void)R; (void)L; (void)dst; (void)ds; (void)pf;
    }
    static void gs3d_forward_cl_avx2(const gs3d_clf_args* a) { (void)a; }
    #endif
    static inline float gs3d_bits_to_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
    static inline uint32_t gs3d_float_to_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
    """
    int GS3D_OPENMP
    int GS3D_HAVE_SIMD_GATHER
    ctypedef struct gs3d_bwd_args:
        const float* x
        float* A
        const float* q
        const float* go
        float* dq
        Py_ssize_t sx, sy, sz, xc, ax, ay, az, ac, W, H, D, C, qp, qc, gp, gc, dp, dc, zlo, zhi
        int align, border, do_dx, do_dg, own_all, prefetch, rmw
        const uint16_t* xh
        const uint16_t* qh
        const uint16_t* goh
        uint16_t* dqh
        int xk
        Py_ssize_t xlast
    void gs3d_backward_gather_avx2(const gs3d_bwd_args* a, Py_ssize_t cnt) noexcept nogil
    ctypedef struct gs3d_setup_args:
        const float* q
        const uint16_t* qh
        int qk
        Py_ssize_t qp, qc, W, H, D, xo, sx, sy, sz, ax, ay, az, zlo, zhi
        int align, border, all_planes, do_dx, do_dg, own_all, cnt, tile
        Py_ssize_t* xb
        Py_ssize_t* ab
        unsigned char* vd
        unsigned char* vs
        unsigned char* own
        double* okv
        double* f
        double* w
        double* mult
    void gs3d_setup_tile_f(const gs3d_setup_args* a) noexcept nogil
    void gs3d_tile_planes_f(const float* q, Py_ssize_t qp, Py_ssize_t qc, Py_ssize_t cnt,
                            Py_ssize_t D, int align, int border, Py_ssize_t* lo,
                            Py_ssize_t* hi) noexcept nogil
    void gs3d_tile_planes_h(const uint16_t* q, int bf, Py_ssize_t qp, Py_ssize_t qc,
                            Py_ssize_t cnt, Py_ssize_t D, int align, int border, Py_ssize_t* lo,
                            Py_ssize_t* hi) noexcept nogil
    ctypedef struct gs3d_cl_args:
        const float* x
        float* A
        const float* go
        float* dq
        const uint16_t* xh
        const uint16_t* goh
        uint16_t* dqh
        const Py_ssize_t* ob
        const Py_ssize_t* oq
        const Py_ssize_t* xb
        const Py_ssize_t* ab
        const Py_ssize_t* xd
        const Py_ssize_t* ad
        const double* f
        const double* w
        const double* mult
        const unsigned char* vd
        const unsigned char* vs
        const unsigned char* own
        Py_ssize_t C, qc, px_lo, px_n, pa_lo, pa_n
        int cnt, tile, ahead, xkind, staged
    void gs3d_backward_cl_avx2(const gs3d_cl_args* a) noexcept nogil
    ctypedef struct gs3d_rows_args:
        const float* x
        float* A
        const float* q
        const float* go
        float* dq
        const uint16_t* xh
        const uint16_t* qh
        const uint16_t* goh
        uint16_t* dqh
        Py_ssize_t sx, sy, sz, ax, ay, az, W, H, D, C, qp, qc, gp, gc, dp, dc, zlo, zhi, nxt
        int align, border, do_dx, do_dg, own_all, prefetch, lead, xk
    void gs3d_backward_rows(const gs3d_rows_args* a, Py_ssize_t cnt, float* stage) noexcept nogil
    void gs3d_transpose_f(const float* src, Py_ssize_t ss, Py_ssize_t R, Py_ssize_t L,
                          float* dst, Py_ssize_t ds, Py_ssize_t pf) noexcept nogil
    void gs3d_transpose_hf(const uint16_t* src, Py_ssize_t ss, Py_ssize_t R, Py_ssize_t L,
                           float* dst, Py_ssize_t ds, Py_ssize_t pf, int bf) noexcept nogil
    void gs3d_transpose_u16(const uint16_t* src, Py_ssize_t ss, Py_ssize_t R, Py_ssize_t L,
                            uint16_t* dst, Py_ssize_t ds, Py_ssize_t pf) noexcept nogil
    void gs3d_transpose_fh(const float* src, Py_ssize_t ss, Py_ssize_t R, Py_ssize_t L,
                           uint16_t* dst, Py_ssize_t ds, int bf) noexcept nogil
    void gs3d_transpose_d(const double* src, Py_ssize_t ss, Py_ssize_t R, Py_ssize_t L,
                          double* dst, Py_ssize_t ds, Py_ssize_t pf) noexcept nogil
    ctypedef struct gs3d_clf_args:
        const float* x
        float* out
        const uint16_t* xh
        const Py_ssize_t* ob
        const Py_ssize_t* xb
        const Py_ssize_t* xd
        const double* w
        const unsigned char* vs
        Py_ssize_t C, px_lo, px_n
        int i0, i1, cnt, tile, ahead, xkind
    void gs3d_forward_cl_avx2(const gs3d_clf_args* a) noexcept nogil
    void gs3d_forward_gather_avx2(const float* x, Py_ssize_t sx, Py_ssize_t sy, Py_ssize_t sz,
                              Py_ssize_t W, Py_ssize_t H, Py_ssize_t D, Py_ssize_t C,
                              Py_ssize_t xc, const float* q, Py_ssize_t qp, Py_ssize_t qc,
                              float* out, Py_ssize_t op, Py_ssize_t oc, Py_ssize_t cnt,
                              int align, int border, int prefetch) noexcept nogil
    void gs3d_forward_gather_h(const uint16_t* x, Py_ssize_t sx, Py_ssize_t sy, Py_ssize_t sz,
                               Py_ssize_t W, Py_ssize_t H, Py_ssize_t D, Py_ssize_t C,
                               Py_ssize_t xc, const uint16_t* q, Py_ssize_t qp, Py_ssize_t qc,
                               uint16_t* out, Py_ssize_t op, Py_ssize_t oc, Py_ssize_t cnt,
                               int align, int border, int bf, Py_ssize_t xlast) noexcept nogil
    float gs3d_dot_f(const float* go, const float* x, Py_ssize_t C) noexcept nogil
    double gs3d_dot_d(const double* go, const double* x, Py_ssize_t C) noexcept nogil
    int GS3D_HAVE_HALF_SIMD
    int GS3D_CL_GOBUF
    float gs3d_dot_h(const float* go, const uint16_t* x, Py_ssize_t C, int bf) noexcept nogil
    void gs3d_store_h(const float* a, uint16_t* d, Py_ssize_t n, int bf) noexcept nogil
    void gs3d_axpy_f(float* a, float w, const float* go, Py_ssize_t C) noexcept nogil
    void gs3d_axpy_d(double* a, double w, const double* go, Py_ssize_t C) noexcept nogil
    void gs3d_corners_f(float* r, const float* x, const Py_ssize_t* off, const float* w,
                        unsigned v, Py_ssize_t C) noexcept nogil
    void gs3d_corners_d(double* r, const double* x, const Py_ssize_t* off, const double* w,
                        unsigned v, Py_ssize_t C) noexcept nogil
    int GS3D_HAVE_V8D
    void gs3d_corners2_d(double* r0, double* r1, const double* x, Py_ssize_t xb0, Py_ssize_t xb1,
                         const Py_ssize_t* xd, const double* w, Py_ssize_t ws, unsigned v0,
                         unsigned v1) noexcept nogil
    void gs3d_point_bwd_d(const double* x, Py_ssize_t xb, const Py_ssize_t* xd, double* A,
                          Py_ssize_t ab, const Py_ssize_t* ad, const double* w, Py_ssize_t ws,
                          const double* go, unsigned vd, unsigned vs, Py_ssize_t C,
                          double* d8) noexcept nogil
    const unsigned char* gs3d_corners_x
    const unsigned char* gs3d_corners_y
    const unsigned char* gs3d_corners_z
    int omp_get_max_threads() noexcept nogil
    int omp_get_thread_num() noexcept nogil
    float gs3d_bits_to_float(uint32_t u) noexcept nogil
    int GS3D_HAVE_F16C
    float gs3d_f16_to_f32_hw(uint16_t h) noexcept nogil
    uint16_t gs3d_f32_to_f16_hw(float f) noexcept nogil
    void gs3d_f16x8_hw(const uint16_t* p, float* out) noexcept nogil
    uint32_t gs3d_float_to_bits(float f) noexcept nogil
    void gs3d_prefetch(const void* p) noexcept nogil
    void gs3d_prefetch_w(const void* p) noexcept nogil
    int gs3d_cpu_has_avx2() noexcept nogil
    int gs3d_cpu_has_avx512() noexcept nogil
    void gs3d_axis_flags(const double* fidx, const double* okf, int cnt, double sz,
                         unsigned char* flags) noexcept nogil
    int gs3d_reflect1(double u, double lo, double span, double* uo, double* m) noexcept nogil
    void gs3d_map_axis_linear(const double* gin, int cnt, double sz, int align, int border,
                              int nearest, double* frac, double* mult, double* fidx, double* okf,
                              unsigned char* flags) noexcept nogil

# Interpolation and padding codes (the CANN codes).
cdef enum:
    MODE_BILINEAR = 0
    MODE_NEAREST = 1
    PAD_ZEROS = 0
    PAD_BORDER = 1
    PAD_REFLECTION = 2

# Which 16-bit format an ``unsigned short`` buffer holds.
cdef enum:
    HALF_F16 = 0
    HALF_BF16 = 1


# ---------------------------------------------------------------------------------------------
# Half precision <-> float32.  Both directions are exact / round-to-nearest-even, keep
# infinities, turn NaN into a quiet NaN of the same sign and handle float16 subnormals.
# ---------------------------------------------------------------------------------------------

cdef inline float f16_to_f32(uint16_t h) noexcept nogil:
    if GS3D_HAVE_F16C:
        return gs3d_f16_to_f32_hw(h)
    cdef uint32_t u = (<uint32_t>(h & 0x7fff)) << 13
    cdef uint32_t e = u & (<uint32_t>0x7c00 << 13)
    u += <uint32_t>(127 - 15) << 23
    if e == (<uint32_t>0x7c00 << 13):          # inf / NaN
        u += <uint32_t>(128 - 16) << 23
    elif e == 0:                                 # zero / subnormal: renormalise through the FPU
        u += <uint32_t>1 << 23
        u = gs3d_float_to_bits(gs3d_bits_to_float(u) - gs3d_bits_to_float(<uint32_t>113 << 23))
    return gs3d_bits_to_float(u | ((<uint32_t>(h & 0x8000)) << 16))


cdef inline uint16_t f32_to_f16(float f) noexcept nogil:
    if GS3D_HAVE_F16C:
        if f != f:                               # NaN: the quiet NaN of its sign
            return <uint16_t>(0x7e00 | ((gs3d_float_to_bits(f) >> 16) & 0x8000))
        return gs3d_f32_to_f16_hw(f)
    cdef uint32_t u = gs3d_float_to_bits(f)
    cdef uint32_t sign = u & 0x80000000u
    cdef uint32_t o
    cdef uint32_t mant_odd
    u ^= sign
    if u >= (<uint32_t>(127 + 16) << 23):        # overflow, inf or NaN
        o = 0x7e00 if u > 0x7f800000u else 0x7c00
    elif u < (<uint32_t>113 << 23):              # result is subnormal or zero
        # adding the magic number makes the FPU do the round-to-nearest-even shift
        o = gs3d_float_to_bits(gs3d_bits_to_float(u) + gs3d_bits_to_float(<uint32_t>126 << 23)) \
            - (<uint32_t>126 << 23)
    else:
        mant_odd = (u >> 13) & 1
        u += (<uint32_t>(15 - 127) << 23) + 0xfff
        u += mant_odd
        o = u >> 13
    return <uint16_t>(o | (sign >> 16))


cdef inline float bf16_to_f32(uint16_t h) noexcept nogil:
    return gs3d_bits_to_float((<uint32_t>h) << 16)


cdef inline uint16_t f32_to_bf16(float f) noexcept nogil:
    cdef uint32_t u = gs3d_float_to_bits(f)
    if (u & 0x7fffffffu) > 0x7f800000u:          # NaN: keep the sign, make it quiet
        return <uint16_t>((u >> 16) | 0x40)
    u += 0x7fff + ((u >> 16) & 1)
    return <uint16_t>(u >> 16)


# ---------------------------------------------------------------------------------------------
# Coordinate mapping (SPEC, "Coordinate mapping" and "Non-finite and extreme coordinates").
# Done in double for every dtype: it costs little and keeps huge float32 coordinates finite.
# ---------------------------------------------------------------------------------------------

cdef inline double clip_coord(double u, Py_ssize_t size, double* mult) noexcept nogil:
    """Clip ``u`` to [0, size-1]; the derivative factor is 0 on and beyond the borders."""
    cdef double hi = <double>(size - 1)
    if u <= 0.0:
        mult[0] = 0.0
        return 0.0
    if u >= hi:
        mult[0] = 0.0
        return hi
    return u


cdef inline bint map_coord(double g, Py_ssize_t size, int padding, bint align,
                           double* u_out, double* mult) noexcept nogil:
    """Map a normalised coordinate to a padded source coordinate.

    Writes the coordinate to ``u_out`` and du/dg times the padding factors to ``mult``. Returns
    False when the point samples nothing along this axis (NaN, or an infinity under zeros or
    reflection padding).
    """
    cdef double u, m
    # a point that samples nothing still gets defined outputs: position 0, multiplier 0
    u_out[0] = 0.0
    mult[0] = 0.0
    if g != g:
        return False
    if g == INFINITY or g == -INFINITY:
        if padding == PAD_BORDER:
            u_out[0] = 0.0 if g < 0 else <double>(size - 1)
            return True
        return False
    if align:
        u = (g + 1.0) / 2.0 * <double>(size - 1)
        m = <double>(size - 1) / 2.0
    else:
        u = ((g + 1.0) * <double>size - 1.0) / 2.0
        m = <double>size / 2.0
    if padding == PAD_BORDER:
        u = clip_coord(u, size, &m)
    elif padding == PAD_REFLECTION:
        # folded about the edges exactly (gs3d_reflect1: fmod's parity, not a float
        # floor(t / span), which loses it for huge t), then clipped; False when it overflowed
        if not gs3d_reflect1(u, 0.0 if align else -0.5,
                             <double>(size - 1) if align else <double>size, &u, &m):
            return False
        u = clip_coord(u, size, &m)
    u_out[0] = u
    mult[0] = m
    return True


cdef inline Py_ssize_t floor_index(double u, Py_ssize_t size) noexcept nogil:
    """floor(u) for a finite ``u``, first clamped to [-2, size + 1] so the cast cannot overflow.

    Every clamped value stays outside [0, size) on the same side, so in-bounds tests are
    unchanged.
    """
    cdef Py_ssize_t i
    if u < -2.0:
        u = -2.0
    elif u > <double>(size + 1):
        u = <double>(size + 1)
    i = <Py_ssize_t>u
    return i - (<double>i > u)
