"""Type stub of the compiled kernels (gs3d/_kernels.pyx).

The kernels take 5-D views with axes ordered N, D, H, W, C (the grid N, Do, Ho, Wo, 3) of one
storage type: float64, float32, or uint16 holding float16/bfloat16 bits (``half_kind`` 0/1).
They do no validation: call them through :mod:`gs3d._api`.
"""
from typing import Any, Optional, Tuple

import numpy as np
import numpy.typing as npt
from typing_extensions import disjoint_base

_Store = npt.NDArray[Any]        # float64 / float32 / uint16 (16-bit formats)
_Acc = npt.NDArray[Any]          # float64 / float32 compute type

SCRATCH_EXTRA: int

def workspace_bytes(nthreads: int, D: int, P: int, mode: int = ...) -> int: ...
def channels_last_pays(C: int, D: int, H: int, W: int, P: int, few: bool = ...) -> bool: ...
def cpu_has_avx2() -> bool: ...
def cpu_has_avx512() -> bool: ...
def few_channels_backward(itemsize: int, C: int, mode: int, padding: int) -> bool: ...
def few_channels_forward(
    itemsize: int, C: int, D: int, H: int, W: int, mode: int, whole: bool = ...,
) -> bool: ...
def slab_bounds(
    grid: _Store, D: int, H: int, W: int, nt: int, mode: int = ..., padding: int = ...,
    align: bool = ...,
) -> Tuple[npt.NDArray[np.intp], npt.NDArray[np.float64]]: ...
def backward_lead_row(grid: _Store, half_kind: int = ...) -> int: ...
def forward_prefetches(
    itemsize: int, N: int, C: int, D: int, H: int, W: int, P: int, scattered: bool = True,
    in_place: bool = False,
) -> bool: ...
def openmp_enabled() -> bool: ...
def max_threads() -> int: ...
def forward(
    inp: _Store, grid: _Store, out: _Store, scratch: _Acc, workspace: npt.NDArray[np.uint8],
    mode: int, padding: int, align: bool, half_kind: int, nthreads: int, xcl: _Store,
) -> None: ...
def backward(
    grad: _Store, inp: _Store, grid: _Store, dx: _Store, dgrid: _Store, dx_acc: _Acc,
    scratch: _Acc, workspace: npt.NDArray[np.uint8], mode: int, padding: int, align: bool,
    half_kind: int, want_dx: bool, want_dg: bool, nthreads: int, xcl: _Store,
) -> None: ...

@disjoint_base     # an extension type: its instance layout is its own
class _Locked:
    def set_xcl(self, xcl: _Store) -> None: ...

@disjoint_base
class ForwardRunner(_Locked):
    line_out: bool
    copy_on_demand: bool
    def bind(
        self, dtype: np.dtype[Any], input_shape: Tuple[int, ...], grid_shape: Tuple[int, ...],
        output_shape: Tuple[int, ...], channels_last: bool, scratch: _Acc,
        workspace: npt.NDArray[np.uint8], xcl: _Store, mode: int, padding: int, align: bool,
        half_kind: int, nthreads: int,
    ) -> None: ...
    def run(self, x: npt.NDArray[Any], q: npt.NDArray[Any], out: npt.NDArray[Any]) -> None: ...
    def __call__(
        self, input: npt.NDArray[Any], grid: npt.NDArray[Any], *,
        out: Optional[npt.NDArray[Any]] = None,
    ) -> npt.NDArray[Any]: ...

@disjoint_base
class BackwardRunner(_Locked):
    def bind(
        self, dtype: np.dtype[Any], grad_output_shape: Tuple[int, ...],
        input_shape: Tuple[int, ...], grid_shape: Tuple[int, ...], channels_last: bool,
        want_dx: bool, want_dg: bool, dx_acc: _Acc, scratch: _Acc,
        workspace: npt.NDArray[np.uint8], xcl: _Store, dummy_dx: _Store, dummy_dg: _Store,
        mode: int, padding: int, align: bool, half_kind: int, nthreads: int,
    ) -> None: ...
    def run(
        self, go: npt.NDArray[Any], x: npt.NDArray[Any], q: npt.NDArray[Any],
        dx: Optional[npt.NDArray[Any]], dg: Optional[npt.NDArray[Any]], split: bool = ...,
    ) -> None: ...
