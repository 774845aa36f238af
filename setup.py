"""Build script for the gs3d Cython extension.

OpenMP is probed: when the compiler cannot build and link a tiny OpenMP program, the extension is
built without it (the kernels then run serially) and a message says so.  The default build uses
neither ``-ffast-math`` (it would break the NaN handling the specification relies on) nor
``-march=native`` (wheels must run on any x86-64 machine).  ``GS3D_EXTRA_CFLAGS`` /
``GS3D_EXTRA_LDFLAGS`` add flags (the sanitizer build uses them).
"""
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import tempfile

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup

OPENMP_TEST = r"""
#include <omp.h>
int main(void) {
    int n = 0;
    #pragma omp parallel reduction(+:n)
    n += 1;
    return omp_get_max_threads() > 0 && n > 0 ? 0 : 1;
}
"""


def _openmp_flags():
    """Return (compile_args, link_args) for OpenMP, or ([], []) when the compiler lacks it."""
    if os.environ.get("GS3D_NO_OPENMP"):
        print("gs3d build: GS3D_NO_OPENMP is set; building without OpenMP (serial kernels)")
        return [], []
    if sys.platform == "win32":
        return ["/openmp"], []
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    cc = cc.split()
    candidates = [(["-fopenmp"], ["-fopenmp"]), (["-Xpreprocessor", "-fopenmp"], ["-lomp"])]
    tmp = tempfile.mkdtemp()
    try:
        src = os.path.join(tmp, "omp_test.c")
        with open(src, "w") as f:
            f.write(OPENMP_TEST)
        for cflags, lflags in candidates:
            exe = os.path.join(tmp, "omp_test")
            try:
                proc = subprocess.run(cc + cflags + [src, "-o", exe] + lflags,
                                      capture_output=True, text=True, timeout=120)
            except (OSError, subprocess.SubprocessError):
                continue
            if proc.returncode == 0 and subprocess.run([exe], capture_output=True).returncode == 0:
                return cflags, lflags
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("gs3d build: WARNING: the C compiler cannot build OpenMP programs; "
          "building without OpenMP, the kernels will run on one thread")
    return [], []


omp_c, omp_l = _openmp_flags()
# -fno-trapping-math (value-safe: it only declares that no code watches floating-point
# exception flags) lets gcc turn the selects of the set-up loops into vector blends.
extra_c = ["-O3", "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math"] + omp_c
if sys.platform == "win32":
    extra_c = ["/O2"] + omp_c
extra_c += os.environ.get("GS3D_EXTRA_CFLAGS", "").split()
extra_l = omp_l + os.environ.get("GS3D_EXTRA_LDFLAGS", "").split()



def _kernel_extension(name, simd_flags=()):
    return Extension(
        f"gs3d.{name}",
        [f"gs3d/{name}.pyx"],
        include_dirs=[np.get_include()],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_9_API_VERSION")],
        extra_compile_args=extra_c + list(simd_flags),
        extra_link_args=extra_l,
    )


# The same kernels three times: the x86-64 baseline, an AVX2/FMA/F16C variant and an AVX-512
# one (F, VL, DQ, BW on top of those) that gs3d picks at import time on CPUs that have the
# instructions (runtime dispatch: the default build still runs anywhere). -ffp-contract=off
# keeps FMA instructions out of the arithmetic, so all variants give bitwise the same results.
# The AVX-512 variant's own code is hand-written 512-bit intrinsics (the coordinate mapping,
# the forward's and the channels-last backward's loops over a multiple of 16 channels, and
# float64's over a multiple of 8; see gs3d/_kernels_avx512.pyx); its compiler-vectorised loops
# stay 256 bits wide
# (-mprefer-vector-width=256). On older AVX-512 CPUs (Skylake-SP, Cascade Lake) 512-bit
# floating-point work can lower the core's clock; the 512-bit loops were measured only on a
# Sapphire Rapids-class Xeon, and GS3D_SIMD=avx2 selects the AVX2 module instead.
_AVX2 = ["-mavx2", "-mfma", "-mf16c"]
extensions = [_kernel_extension("_kernels")]
if (platform.machine().lower() in ("x86_64", "amd64") and sys.platform != "win32"
        and not os.environ.get("GS3D_NO_SIMD_VARIANTS")):
    extensions.append(_kernel_extension("_kernels_avx2", _AVX2))
    extensions.append(_kernel_extension(
        "_kernels_avx512", _AVX2 + ["-mavx512f", "-mavx512vl", "-mavx512dq", "-mavx512bw",
                                    "-mprefer-vector-width=256"]))

setup(
    ext_modules=cythonize(
        extensions,
        compiler_directives={
            "language_level": 3,
            "boundscheck": False,
            "wraparound": False,
            "cdivision": True,
            "initializedcheck": False,
            "nonecheck": False,
        },
    ),
)
