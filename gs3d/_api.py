"""Public functions of gs3d: validation and dtype decisions here, arithmetic in ``_kernels``."""
from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Iterator, Optional, Tuple

import numpy as np

from . import _kernels
from ._validation import (
    GridSamplerError, as_input_array, check_output, check_problem, kernel_ready,
    parse_deterministic, parse_num_threads, parse_output_mask, parse_bool, volume_shape,
)

__all__ = [
    "grid_sample_3d", "grid_sample_3d_backward", "set_deterministic", "get_deterministic",
    "deterministic", "show_config", "GridSamplerError",
]

# Below this many point-channels per thread, extra threads cost more than they bring.  Results
# do not depend on the thread count, so this is purely a speed decision.
_WORK_PER_THREAD = 32768

_HALF_KIND = {"f2": 0, "bf16": 1}

# --------------------------------------------------------------------------------------------
# deterministic mode (the CANN switch is global; gs3d adds a context manager and a per-call flag)
# --------------------------------------------------------------------------------------------
_global_deterministic = False
_context_deterministic: contextvars.ContextVar = contextvars.ContextVar(
    "gs3d_deterministic", default=None)


def set_deterministic(enabled: bool) -> None:
    """Set the process-wide deterministic mode (like ``aclrtCtxSetSysParamOpt``)."""
    global _global_deterministic
    _global_deterministic = parse_bool(enabled, "enabled")


def get_deterministic() -> bool:
    """The deterministic mode in force here (context manager first, then the global switch)."""
    value = _context_deterministic.get()
    return _global_deterministic if value is None else value


@contextlib.contextmanager
def deterministic(enabled: bool = True) -> Iterator[None]:
    """Context manager: deterministic mode on (or off) inside the ``with`` block."""
    token = _context_deterministic.set(parse_bool(enabled, "enabled"))
    try:
        yield
    finally:
        _context_deterministic.reset(token)


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------

def _storage(arr: np.ndarray, kind: str) -> np.ndarray:
    """The array as the kernels store it: 16-bit formats are reinterpreted as uint16."""
    return arr.view(np.uint16) if kind in _HALF_KIND else arr


def _ndhwc(arr: np.ndarray, channels_last: bool) -> np.ndarray:
    """A view with axes (N, D, H, W, C) whatever the layout."""
    return arr if channels_last else arr.transpose(0, 2, 3, 4, 1)


def _compute_dtype(kind: str) -> np.dtype:
    return np.dtype(np.float64 if kind == "f8" else np.float32)


def _threads(num_threads: Any, work: int) -> int:
    """Threads for a call: an explicit ``num_threads`` is used as given; the default (OpenMP's
    count) is reduced for small calls, where threads cost more than they bring."""
    threads = parse_num_threads(num_threads, _kernels.max_threads())
    if num_threads is None:
        threads = max(1, min(threads, work // _WORK_PER_THREAD))
    return threads


def _output(given: Optional[np.ndarray], shape: tuple, dtype: np.dtype) -> Tuple[np.ndarray, np.ndarray]:
    """(array returned to the caller, array the kernel writes): the latter is a temporary only
    when a given buffer's strides or alignment do not fit the kernels."""
    if given is None:
        arr = np.empty(shape, dtype=dtype)
        return arr, arr
    return given, kernel_ready(given)


# --------------------------------------------------------------------------------------------
# forward
# --------------------------------------------------------------------------------------------

def grid_sample_3d(input, grid, *, mode="bilinear", padding_mode="zeros", align_corners=False,
                   layout="NCDHW", num_threads=None, out=None) -> np.ndarray:
    """Sample a 5-D volume at the points of a normalised grid (``aclnnGridSampler3D``).

    Parameters
    ----------
    input : ndarray, shape (N, C, D, H, W) or (N, D, H, W, C) for ``layout="NDHWC"``
        The volume. float64, float32, float16 or bfloat16 (``ml_dtypes.bfloat16``); any strides.
    grid : ndarray, shape (N, D_out, H_out, W_out, 3)
        Sampling positions (x, y, z) normalised to [-1, 1]; x indexes W, y H, z D. Same dtype.
    mode : {"bilinear", "nearest"} or {0, 1}
        Trilinear interpolation ("bilinear", as in PyTorch) or nearest voxel (half to even).
    padding_mode : {"zeros", "border", "reflection"} or {0, 1, 2}
        What positions outside the volume read.
    align_corners : bool
        True: -1 and 1 are the centres of the corner voxels; False: their outer edges.
    layout : {"NCDHW", "NDHWC"}
        Axis order of ``input`` and of the result.
    num_threads : int or None
        Cap on OpenMP threads; None uses the OpenMP default (``OMP_NUM_THREADS``, threadpoolctl).
    out : ndarray, optional
        Buffer for the result, shape (N, C, D_out, H_out, W_out) (or channels-last), same dtype.

    Returns
    -------
    ndarray
        The sampled values (``out`` when given).

    Raises
    ------
    GridSamplerError
        For any invalid argument (``.code`` 161001 for a missing tensor, 161002 otherwise);
        nothing is written then.
    """
    x = as_input_array(input, "input")
    q = as_input_array(grid, "grid")
    pb = check_problem(x, q, None, mode, padding_mode, align_corners, layout)
    shape = volume_shape(pb.N, pb.C, pb.out_spatial, pb.channels_last)
    points = pb.N * int(np.prod(pb.out_spatial))
    nt = _threads(num_threads, points * max(pb.C, 1))
    if out is not None:
        check_output(out, "out", shape, x.dtype, (("input", x), ("grid", q)))
    result, target = _output(out, shape, x.dtype)
    if target.size == 0:
        return result
    acc = _compute_dtype(pb.kind)
    _kernels.forward(
        _ndhwc(_storage(kernel_ready(x), pb.kind), pb.channels_last),
        _storage(kernel_ready(q), pb.kind),
        _ndhwc(_storage(target, pb.kind), pb.channels_last),
        np.empty((nt, pb.C + _kernels.SCRATCH_EXTRA), dtype=acc),
        pb.mode, pb.padding, pb.align, _HALF_KIND.get(pb.kind, 0), nt)
    if target is not result:
        result[...] = target
    return result


# --------------------------------------------------------------------------------------------
# backward
# --------------------------------------------------------------------------------------------

def grid_sample_3d_backward(grad_output, input, grid, *, mode="bilinear", padding_mode="zeros",
                            align_corners=False, output_mask=(True, True), layout="NCDHW",
                            deterministic=None, num_threads=None, input_grad=None,
                            grid_grad=None):
    """Gradients of :func:`grid_sample_3d` (``aclnnGridSampler3DBackward``).

    Parameters
    ----------
    grad_output : ndarray, shape (N, C, D_out, H_out, W_out) or channels-last
        Gradient of the loss with respect to the sampled output.
    input, grid, mode, padding_mode, align_corners, layout, num_threads
        As in :func:`grid_sample_3d`.
    output_mask : (bool, bool)
        Which gradients to compute: (input_grad, grid_grad). One not asked for is returned as
        None, costs nothing, and a buffer given for it is left untouched.
    deterministic : bool or None
        Per-call override of :func:`set_deterministic` / :func:`deterministic`. gs3d's scatter is
        bitwise reproducible across runs and thread counts in every mode (see README), so this
        flag never changes the result or the speed today.
    input_grad, grid_grad : ndarray, optional
        Buffers for the results (shapes of ``input`` and ``grid``, same dtype), filled and
        returned.

    Returns
    -------
    (input_grad, grid_grad) : tuple of ndarray or None

    Raises
    ------
    GridSamplerError
        For any invalid argument; nothing is written then.
    """
    g = as_input_array(grad_output, "grad_output")
    x = as_input_array(input, "input")
    q = as_input_array(grid, "grid")
    pb = check_problem(x, q, g, mode, padding_mode, align_corners, layout)
    want_dx, want_dg = parse_output_mask(output_mask)
    parse_deterministic(deterministic)
    points = pb.N * int(np.prod(pb.out_spatial))
    nt = _threads(num_threads, points * max(pb.C, 1))
    inputs = (("grad_output", g), ("input", x), ("grid", q))
    if want_dx and input_grad is not None:
        check_output(input_grad, "input_grad", x.shape, x.dtype, inputs)
    if want_dg and grid_grad is not None:
        check_output(grid_grad, "grid_grad", q.shape, q.dtype, inputs,
                     (("input_grad", input_grad if want_dx else None),))
    dx = dx_k = dg = dg_k = None
    if want_dx:
        dx, dx_k = _output(input_grad, x.shape, x.dtype)
    if want_dg:
        dg, dg_k = _output(grid_grad, q.shape, q.dtype)
    if points == 0 or pb.C == 0:
        # nothing samples the input: zero gradients (SPEC, "Empty tensors")
        for arr in (dx, dg):
            if arr is not None:
                arr[...] = 0
        return dx, dg
    if want_dx or want_dg:
        kind, cl = pb.kind, pb.channels_last
        acc = _compute_dtype(kind)
        half = kind in _HALF_KIND
        store = np.uint16 if half else x.dtype
        D, H, W = pb.in_spatial
        if half and want_dx:
            # float32 accumulator for one batch item, in the memory order of input_grad
            dx_acc = _ndhwc(np.empty(volume_shape(1, pb.C, (D, H, W), cl), dtype=acc), cl)[0]
        else:
            dx_acc = np.empty((1, 1, 1, 1), dtype=acc)
        _kernels.backward(
            _ndhwc(_storage(kernel_ready(g), kind), cl),
            _ndhwc(_storage(kernel_ready(x), kind), cl),
            _storage(kernel_ready(q), kind),
            _ndhwc(_storage(dx_k, kind), cl) if want_dx else np.empty((1,) * 5, dtype=store),
            _storage(dg_k, kind) if want_dg else np.empty((1, 1, 1, 1, 3), dtype=store),
            dx_acc, np.empty((nt, pb.C + _kernels.SCRATCH_EXTRA), dtype=acc),
            pb.mode, pb.padding, pb.align, _HALF_KIND.get(kind, 0), want_dx, want_dg, nt)
        if want_dx and dx_k is not dx:
            dx[...] = dx_k
        if want_dg and dg_k is not dg:
            dg[...] = dg_k
    return dx, dg


def show_config() -> None:
    """Print the gs3d version, whether OpenMP is compiled in, and the default thread count."""
    from . import __version__
    print(f"gs3d {__version__}")
    print(f"  numpy:            {np.__version__}")
    print(f"  OpenMP:           {'yes' if _kernels.openmp_enabled() else 'no (serial kernels)'}")
    print(f"  default threads:  {_kernels.max_threads()}")
