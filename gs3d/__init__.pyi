"""Type stub of gs3d's public API (gs3d/__init__.py, gs3d/_api.py)."""
from typing import Any, ContextManager, Literal, Optional, Tuple, Union

import numpy as np
import numpy.typing as npt

from . import reference as reference
from ._validation import GridSamplerError as GridSamplerError

__version__: str
__all__ = [
    "GridSamplerError",
    "deterministic",
    "get_deterministic",
    "grid_sample_3d",
    "grid_sample_3d_backward",
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
