# cython: language_level=3
"""The kernels of _kernels.pyx compiled for AVX2/FMA/F16C (see setup.py); gs3d._api picks this
module at import time when the CPU has those instructions."""
include "_kernels.pyx"
