"""Type stub of gs3d/_kernels_avx512.pyx: the same functions as gs3d/_kernels.pyx."""
from ._kernels import *
