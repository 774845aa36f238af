# cython: language_level=3
"""The kernels of _kernels.pyx compiled for AVX-512 (F, VL, DQ, BW) on top of AVX2/FMA/F16C (see
setup.py); gs3d._api picks this module at import time when the CPU and OS support those
instructions.  Its own 512-bit code (in _helpers.pxd, under __AVX512F__): the coordinate
mapping of the eight-point kernels, the gather forward's sums of a multiple of 16 channels, the
channels-last backward's scatter (and float32 corner dots) of a multiple of 16 channels, and
float64's channel loops over a multiple of 8 channels (gs3d_v8d: eight doubles per register)."""
include "_kernels.pyx"
