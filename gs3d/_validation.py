"""Argument checking for the public API.

Every check runs before any kernel and before any output buffer is touched, so a rejected call
writes nothing.  Errors carry the CANN status codes of ``aclnnGridSampler3DBackward``.
"""
from __future__ import annotations

import math
import os
from typing import Any, NamedTuple, Optional, Tuple

import numpy as np

__all__ = ["GridSamplerError", "ERR_NULL", "ERR_INVALID"]

ERR_NULL = 161001     # ACLNN_ERR_PARAM_NULLPTR
ERR_INVALID = 161002  # ACLNN_ERR_PARAM_INVALID

MODES = {"bilinear": 0, "nearest": 1}
PADDINGS = {"zeros": 0, "border": 1, "reflection": 2}
LAYOUTS = ("NCDHW", "NDHWC")
_TooHardError = getattr(np, "exceptions", np).TooHardError
# native-byte-order float dtypes (a big-endian dtype is a different key)
_KINDS = {np.dtype(np.float64): "f8", np.dtype(np.float32): "f4", np.dtype(np.float16): "f2"}


class GridSamplerError(ValueError):
    """An invalid call.  ``code`` is the CANN status: 161001 (null tensor) or 161002 (invalid)."""

    def __init__(self, message: str, code: int = ERR_INVALID):
        super().__init__(message)
        self.code = code


def _fail(message: str, code: int = ERR_INVALID):
    raise GridSamplerError(message, code)


def _describe(obj: Any) -> str:
    if isinstance(obj, np.ndarray):
        return f"an array of shape {obj.shape} and dtype {obj.dtype}"
    return f"{type(obj).__name__} {obj!r}"[:120]


# --------------------------------------------------------------------------------------------
# scalar options
# --------------------------------------------------------------------------------------------

def _code(value: Any, names: dict, what: str) -> int:
    if isinstance(value, str):
        if value in names:
            return names[value]
        _fail(f"{what} must be one of {sorted(names, key=names.get)} or the codes "
              f"{sorted(names.values())}; got {value!r}")
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        _fail(f"{what} must be a string {sorted(names, key=names.get)} or an integer code "
              f"{sorted(names.values())}; got {_describe(value)}")
    if not 0 <= int(value) < len(names):
        _fail(f"{what} code must be in 0..{len(names) - 1}; got {int(value)}")
    return int(value)


def parse_mode(mode: Any) -> int:
    return _code(mode, MODES, "mode")


def parse_padding(padding_mode: Any) -> int:
    return _code(padding_mode, PADDINGS, "padding_mode")


def parse_layout(layout: Any) -> bool:
    """True for channels-last (NDHWC)."""
    if not isinstance(layout, str) or layout not in LAYOUTS:
        _fail(f"layout must be 'NCDHW' or 'NDHWC'; got {_describe(layout)}")
    return layout == "NDHWC"


def parse_bool(value: Any, what: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        _fail(f"{what} must be a bool; got {_describe(value)}")
    return bool(value)


def parse_output_mask(output_mask: Any) -> Tuple[bool, bool]:
    if not isinstance(output_mask, (list, tuple, np.ndarray)):
        _fail(f"output_mask must be a list or tuple of two bools; got {_describe(output_mask)}")
    if isinstance(output_mask, np.ndarray) and output_mask.ndim != 1:
        _fail(f"output_mask must be one-dimensional; got shape {output_mask.shape}")
    if len(output_mask) != 2:
        _fail(f"output_mask must have length 2 (want_input_grad, want_grid_grad); "
              f"got length {len(output_mask)}")
    return (parse_bool(output_mask[0], "output_mask[0]"),
            parse_bool(output_mask[1], "output_mask[1]"))


# An explicit thread count above this is reduced to it: oversubscription beyond a few threads
# per core only costs time, and an absurd count must not reach the OpenMP runtime.
MAX_THREADS = min(1024, 4 * max(1, os.cpu_count() or 1))


def parse_num_threads(num_threads: Any, default: int) -> int:
    if num_threads is None:
        return max(1, min(default, MAX_THREADS))
    if isinstance(num_threads, (bool, np.bool_)) or not isinstance(num_threads, (int, np.integer)):
        _fail(f"num_threads must be None or a positive integer; got {_describe(num_threads)}")
    if num_threads < 1:
        _fail(f"num_threads must be None or a positive integer; got {int(num_threads)}")
    return int(min(num_threads, MAX_THREADS))


def parse_deterministic(deterministic: Any) -> Optional[bool]:
    if deterministic is None:
        return None
    return parse_bool(deterministic, "deterministic")


# --------------------------------------------------------------------------------------------
# arrays
# --------------------------------------------------------------------------------------------

def dtype_kind(dtype: np.dtype) -> Optional[str]:
    """'f8', 'f4', 'f2', 'bf16' for a supported dtype, else None (never imports ml_dtypes)."""
    kind = _KINDS.get(dtype)
    if kind is None and dtype.name == "bfloat16" and dtype.itemsize == 2:
        return "bf16"
    return kind


def as_input_array(obj: Any, name: str) -> np.ndarray:
    """A numpy view of a required input tensor (numpy arrays, ``__array__`` or DLPack objects)."""
    if obj is None:
        _fail(f"{name} is None; a tensor is required", ERR_NULL)
    if isinstance(obj, np.ndarray):
        return obj
    if hasattr(obj, "__array__") or hasattr(obj, "__dlpack__"):
        try:
            arr = np.asarray(obj) if hasattr(obj, "__array__") else np.from_dlpack(obj)
        except Exception as exc:  # noqa: BLE001 - any conversion failure is the caller's input
            _fail(f"{name} could not be converted to a numpy array: {exc}")
        if isinstance(arr, np.ndarray):
            return arr
    _fail(f"{name} must be a numpy array (or an object with __array__ or __dlpack__); "
          f"got {_describe(obj)}")


def check_dtype(arr: np.ndarray, name: str) -> str:
    kind = dtype_kind(arr.dtype)
    if kind is None:
        _fail(f"{name} must have dtype float64, float32, float16 or bfloat16 in native byte "
              f"order; got {arr.dtype.str} ({arr.dtype})")
    return kind


def check_ndim(arr: np.ndarray, name: str, axes: str):
    if arr.ndim != 5:
        _fail(f"{name} must be 5-D {axes}; got shape {arr.shape}")


# Buffers the kernels read or write many times start on a cache line: a 32- or 64-byte vector
# of channels at a 64-byte boundary never spans two lines (numpy's own large buffers start 16
# bytes into one).
LINE = 64


def aligned_empty(shape: tuple, dtype: Any, buf: Optional[np.ndarray] = None) -> np.ndarray:
    """An uninitialised C-contiguous array whose data starts on a LINE-byte boundary (a view
    into a slightly larger buffer: ``buf``, a 1-D uint8 array of at least its bytes + LINE,
    when given, else a new one)."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    if buf is None:
        buf = np.empty(nbytes + LINE, dtype=np.uint8)
    start = -buf.ctypes.data % LINE
    return buf[start:start + nbytes].view(dtype).reshape(shape)


def kernel_ready(arr: np.ndarray) -> np.ndarray:
    """The array itself when the kernels can read it through its strides, else a packed copy
    (on a cache line, as the buffers gs3d allocates)."""
    if arr.flags.aligned:     # data pointer and strides are multiples of the alignment
        isz = arr.dtype.itemsize
        if arr.dtype.alignment == isz or not any(s % isz for s in arr.strides):
            return arr
    copy = aligned_empty(arr.shape, arr.dtype)
    copy[...] = arr
    return copy


def _self_overlaps(arr: np.ndarray) -> bool:
    """Conservative test: can two different elements of ``arr`` share memory?"""
    if arr.size == 0:
        return False
    dims = sorted((abs(s), n) for s, n in zip(arr.strides, arr.shape) if n > 1)
    extent = arr.dtype.itemsize
    for stride, n in dims:
        if stride < extent:
            return True
        extent = stride * (n - 1) + extent
    return False


def _overlap(a: np.ndarray, b: np.ndarray) -> bool:
    if a.size == 0 or b.size == 0 or not np.may_share_memory(a, b):
        return False
    try:
        return bool(np.shares_memory(a, b, max_work=100_000))
    except _TooHardError:
        return True


def check_output(out: Any, name: str, shape: tuple, dtype: np.dtype, inputs: tuple,
                 others: tuple = ()) -> np.ndarray:
    """Check a caller-given output buffer; returns it (never writes it)."""
    if not isinstance(out, np.ndarray):
        _fail(f"{name} must be a writeable numpy array; got {_describe(out)}")
    if out.shape != shape:
        _fail(f"{name} must have shape {shape} (the layout's shape); got {out.shape}")
    if out.dtype != dtype:
        _fail(f"{name} must have dtype {dtype} like the inputs; got {out.dtype}")
    if not out.flags.writeable:
        _fail(f"{name} is read-only; pass a writeable array")
    if _self_overlaps(out):
        _fail(f"{name} has overlapping elements (zero or overlapping strides); pass an array "
              f"whose elements are distinct")
    for other_name, other in inputs:
        if _overlap(out, other):
            _fail(f"{name} overlaps the input {other_name}; outputs must not share memory with "
                  f"inputs")
    for other_name, other in others:
        if other is not None and _overlap(out, other):
            _fail(f"{name} overlaps {other_name}; the outputs must not share memory")
    return out


class Problem(NamedTuple):
    """A validated call, shapes in the caller's layout."""
    kind: str
    channels_last: bool
    mode: int
    padding: int
    align: bool
    N: int
    C: int
    in_spatial: tuple
    out_spatial: tuple


def volume_shape(N: int, C: int, spatial: tuple, channels_last: bool) -> tuple:
    return (N, *spatial, C) if channels_last else (N, C, *spatial)


def check_problem(input, grid, grad_output, mode, padding_mode, align_corners, layout) -> Problem:
    """Shared checks of the forward and the backward (``grad_output`` None for the forward)."""
    channels_last = parse_layout(layout)
    mode_c = parse_mode(mode)
    pad_c = parse_padding(padding_mode)
    align = parse_bool(align_corners, "align_corners")
    axes = "(N, D, H, W, C)" if channels_last else "(N, C, D, H, W)"
    check_ndim(input, "input", axes)
    check_ndim(grid, "grid", "(N, D_out, H_out, W_out, 3)")
    kind = check_dtype(input, "input")
    if check_dtype(grid, "grid") != kind or grid.dtype != input.dtype:
        _fail(f"grid dtype {grid.dtype} differs from input dtype {input.dtype}; all tensors "
              f"must share one dtype")
    if channels_last:
        N, D, H, W, C = input.shape
    else:
        N, C, D, H, W = input.shape
    if min(D, H, W) == 0:
        _fail(f"input spatial size (D, H, W) must be non-zero; got {(D, H, W)}")
    if grid.shape[4] != 3:
        _fail(f"grid last axis must have size 3 (x, y, z); got shape {grid.shape}")
    if grid.shape[0] != N:
        _fail(f"grid batch size {grid.shape[0]} differs from input batch size {N}")
    out_spatial = tuple(grid.shape[1:4])
    if grad_output is not None:
        check_ndim(grad_output, "grad_output", axes.replace("D, H, W", "D_out, H_out, W_out"))
        check_dtype(grad_output, "grad_output")
        if grad_output.dtype != input.dtype:
            _fail(f"grad_output dtype {grad_output.dtype} differs from input dtype "
                  f"{input.dtype}; all tensors must share one dtype")
        expect = volume_shape(N, C, out_spatial, channels_last)
        if grad_output.shape != expect:
            gN = grad_output.shape[0]
            gC = grad_output.shape[4] if channels_last else grad_output.shape[1]
            if gN != N:
                what = f"batch size {gN} differs from input's {N}"
            elif gC != C:
                what = f"channel count {gC} differs from input's {C}"
            else:
                what = "spatial shape differs from grid's (D_out, H_out, W_out) " + str(out_spatial)
            _fail(f"grad_output must have shape {expect} in layout {layout}; got "
                  f"{grad_output.shape}: {what}")
    return Problem(kind, channels_last, mode_c, pad_c, align, N, C, (D, H, W), out_spatial)
