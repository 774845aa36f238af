# cython: language_level=3
"""The kernels of _kernels.pyx compiled for AVX-512 (F, VL, DQ, BW) on top of AVX2/FMA/F16C (see
setup.py); gs3d._api picks this module at import time when the CPU and OS support those
instructions.  Only the coordinate mapping of the eight-point kernels uses 512-bit vectors."""
include "_kernels.pyx"
