"""Type stub of gs3d's public API (gs3d/__init__.py, gs3d/_api.py)."""
from typing import Any, ContextManager, Literal, Optional, Tuple, Union

import numpy as np
import numpy.typing as npt

from . import reference as reference
from ._validation import GridSamplerError as GridSamplerError

__version__: str
__all__ = [
    "BackwardPlan",
    "ForwardPlan",
    "GridSamplerError",
    "clear_cache",
    "deterministic",
    "get_deterministic",
    "grid_sample_3d",
    "grid_sample_3d_backward",
    "plan_backward",
    "plan_forward",
    "reference",
    "set_deterministic",
    "show_config",
]

# numpy arrays, objects with __array__, DLPack producers
_ArrayIn = Union[npt.ArrayLike, Any]
_Array = npt.NDArray[Any]
_Mode = Union[Literal["bilinear", "nearest"], int]
_Padding = Union[Literal["zeros", "border", "reflection"], int]
_Layout = Literal["NCDHW", "NDHWC"]

def grid_sample_3d(
    input: _ArrayIn,
    grid: _ArrayIn,
    *,
    mode: _Mode = "bilinear",
    padding_mode: _Padding = "zeros",
    align_corners: bool = False,
    layout: _Layout = "NCDHW",
    num_threads: Optional[int] = None,
    out: Optional[_Array] = None,
) -> _Array: ...
def grid_sample_3d_backward(
    grad_output: _ArrayIn,
    input: _ArrayIn,
    grid: _ArrayIn,
    *,
    mode: _Mode = "bilinear",
    padding_mode: _Padding = "zeros",
    align_corners: bool = False,
    output_mask: Tuple[bool, bool] = (True, True),
    layout: _Layout = "NCDHW",
    deterministic: Optional[bool] = None,
    num_threads: Optional[int] = None,
    input_grad: Optional[_Array] = None,
    grid_grad: Optional[_Array] = None,
) -> Tuple[Optional[_Array], Optional[_Array]]: ...
def set_deterministic(enabled: bool) -> None: ...
def get_deterministic() -> bool: ...
def deterministic(enabled: bool = True) -> ContextManager[None]: ...
def show_config() -> None: ...
def clear_cache() -> None: ...

class ForwardPlan:
    dtype: np.dtype[Any]
    input_shape: Tuple[int, ...]
    grid_shape: Tuple[int, ...]
    output_shape: Tuple[int, ...]
    @property
    def workspace_size(self) -> int: ...
    def __init__(
        self,
        input_shape: Tuple[int, ...],
        grid_shape: Tuple[int, ...],
        dtype: npt.DTypeLike,
        *,
        mode: _Mode = "bilinear",
        padding_mode: _Padding = "zeros",
        align_corners: bool = False,
        layout: _Layout = "NCDHW",
        num_threads: Optional[int] = None,
    ) -> None: ...
    def __call__(self, input: _ArrayIn, grid: _ArrayIn, *, out: Optional[_Array] = None) -> _Array: ...

class BackwardPlan:
    dtype: np.dtype[Any]
    grad_output_shape: Tuple[int, ...]
    input_shape: Tuple[int, ...]
    grid_shape: Tuple[int, ...]
    want_dx: bool
    want_dg: bool
    @property
    def workspace_size(self) -> int: ...
    def __init__(
        self,
        grad_output_shape: Tuple[int, ...],
        input_shape: Tuple[int, ...],
        grid_shape: Tuple[int, ...],
        dtype: npt.DTypeLike,
        *,
        mode: _Mode = "bilinear",
        padding_mode: _Padding = "zeros",
        align_corners: bool = False,
        output_mask: Tuple[bool, bool] = (True, True),
        layout: _Layout = "NCDHW",
        deterministic: Optional[bool] = None,
        num_threads: Optional[int] = None,
    ) -> None: ...
    def __call__(
        self,
        grad_output: _ArrayIn,
        input: _ArrayIn,
        grid: _ArrayIn,
        *,
        input_grad: Optional[_Array] = None,
        grid_grad: Optional[_Array] = None,
    ) -> Tuple[Optional[_Array], Optional[_Array]]: ...

def plan_forward(
    input_shape: Tuple[int, ...], grid_shape: Tuple[int, ...], dtype: npt.DTypeLike, **options: Any
) -> ForwardPlan: ...
def plan_backward(
    grad_output_shape: Tuple[int, ...],
    input_shape: Tuple[int, ...],
    grid_shape: Tuple[int, ...],
    dtype: npt.DTypeLike,
    **options: Any,
) -> BackwardPlan: ...
