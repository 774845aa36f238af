"""PyTorch adapter: :func:`grid_sample`, a drop-in for ``torch.nn.functional.grid_sample`` on
5-D CPU tensors, backed by gs3d's kernels.

``import gs3d.torch`` imports torch (``import gs3d`` never does) and registers two custom
operators, ``torch.ops.gs3d.grid_sample_3d`` and ``torch.ops.gs3d.grid_sample_3d_backward``,
with an autograd formula and fake (meta) implementations, so they work with autograd,
``torch.compile`` and ``torch.library.opcheck``.

- Tensors reach the kernels as numpy views of their memory, without copies, whatever their
  strides. A ``channels_last_3d`` input goes to the channels-last (NDHWC) kernel path and its
  output and input gradient are ``channels_last_3d`` too; other inputs give contiguous results.
- Gradients autograd does not need are not computed (``needs_input_grad`` becomes gs3d's
  ``output_mask``).
- float64, float32, float16 and bfloat16 (the latter needs ``ml_dtypes``, part of the
  ``gs3d[torch]`` extra). Halves are accumulated in float32 and rounded once (see the README).
- Anything gs3d does not handle (not 5-D, not on the CPU, ``mode="bicubic"``, an unknown
  option) is passed to ``torch.nn.functional.grid_sample`` unchanged, which computes it or
  raises its usual error.
"""
from __future__ import annotations

from typing import Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as _F

from . import _api

__all__ = ["grid_sample"]

_MODES = {"bilinear": 0, "nearest": 1}
_PADDINGS = {"zeros": 0, "border": 1, "reflection": 2}
_DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)


def _channels_last(t: torch.Tensor) -> bool:
    """True when ``t``'s memory is channels-last 3-D (and not also plain contiguous)."""
    return (not t.is_contiguous()) and t.is_contiguous(memory_format=torch.channels_last_3d)


def _empty_volume(like: torch.Tensor, shape: Tuple[int, ...]) -> torch.Tensor:
    """A new (N, C, D, H, W) tensor, channels-last 3-D when ``like`` is."""
    fmt = torch.channels_last_3d if _channels_last(like) else torch.contiguous_format
    return torch.empty(shape, dtype=like.dtype, device=like.device, memory_format=fmt)


def _numpy(t: torch.Tensor) -> np.ndarray:
    """A numpy view of a CPU tensor's memory (no copy; bfloat16 via ``ml_dtypes``)."""
    t = t.detach()
    if t.dtype == torch.bfloat16:
        import ml_dtypes
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def _ndhwc(t: torch.Tensor) -> np.ndarray:
    """A numpy view with axes (N, D, H, W, C) of an (N, C, D, H, W) tensor."""
    return _numpy(t).transpose(0, 2, 3, 4, 1)


# --------------------------------------------------------------------------------------------
# the operators
# --------------------------------------------------------------------------------------------

@torch.library.custom_op("gs3d::grid_sample_3d", mutates_args=(), device_types="cpu")
def _forward_op(input: torch.Tensor, grid: torch.Tensor, mode: int, padding_mode: int,
                align_corners: bool) -> torch.Tensor:
    N, C = input.shape[:2]
    out = _empty_volume(input, (N, C, *grid.shape[1:4]))
    _api.grid_sample_3d(_ndhwc(input), _numpy(grid), mode=mode, padding_mode=padding_mode,
                        align_corners=align_corners, layout="NDHWC", out=_ndhwc(out))
    return out


@_forward_op.register_fake
def _forward_fake(input, grid, mode, padding_mode, align_corners):
    torch._check(input.dim() == 5 and grid.dim() == 5, lambda: "gs3d: 5-D tensors expected")
    return _empty_volume(input, (*input.shape[:2], *grid.shape[1:4]))


@torch.library.custom_op("gs3d::grid_sample_3d_backward", mutates_args=(), device_types="cpu")
def _backward_op(grad_output: torch.Tensor, input: torch.Tensor, grid: torch.Tensor, mode: int,
                 padding_mode: int, align_corners: bool, want_input_grad: bool,
                 want_grid_grad: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """(input_grad, grid_grad); a gradient not wanted is returned as an empty tensor."""
    dx = _empty_volume(input, tuple(input.shape)) if want_input_grad else input.new_empty(0)
    dg = torch.empty_like(grid, memory_format=torch.contiguous_format) if want_grid_grad \
        else grid.new_empty(0)
    if want_input_grad or want_grid_grad:
        _api.grid_sample_3d_backward(
            _ndhwc(grad_output), _ndhwc(input), _numpy(grid), mode=mode,
            padding_mode=padding_mode, align_corners=align_corners,
            output_mask=(want_input_grad, want_grid_grad), layout="NDHWC",
            input_grad=_ndhwc(dx) if want_input_grad else None,
            grid_grad=_numpy(dg) if want_grid_grad else None)
    return dx, dg


@_backward_op.register_fake
def _backward_fake(grad_output, input, grid, mode, padding_mode, align_corners,
                   want_input_grad, want_grid_grad):
    dx = _empty_volume(input, tuple(input.shape)) if want_input_grad else input.new_empty(0)
    dg = torch.empty_like(grid, memory_format=torch.contiguous_format) if want_grid_grad \
        else grid.new_empty(0)
    return dx, dg


def _setup_context(ctx, inputs, output):
    input, grid, mode, padding_mode, align_corners = inputs
    ctx.save_for_backward(input, grid)
    ctx.options = (mode, padding_mode, align_corners)


def _backward(ctx, grad_output):
    input, grid = ctx.saved_tensors
    want_dx, want_dg = bool(ctx.needs_input_grad[0]), bool(ctx.needs_input_grad[1])
    if not (want_dx or want_dg):
        return None, None, None, None, None
    dx, dg = _backward_op(grad_output, input, grid, *ctx.options, want_dx, want_dg)
    return (dx if want_dx else None), (dg if want_dg else None), None, None, None


torch.library.register_autograd("gs3d::grid_sample_3d", _backward, setup_context=_setup_context)


# --------------------------------------------------------------------------------------------
# the public function
# --------------------------------------------------------------------------------------------

def grid_sample(input: torch.Tensor, grid: torch.Tensor, mode: str = "bilinear",
                padding_mode: str = "zeros", align_corners: Optional[bool] = None) -> torch.Tensor:
    """``torch.nn.functional.grid_sample`` computed by gs3d for 5-D CPU tensors.

    Same arguments, result and gradients as ``F.grid_sample`` (``align_corners=None`` means
    False, as in PyTorch, without its warning). Calls gs3d cannot serve (not 5-D, not on the
    CPU, bicubic, a dtype other than float64/32/16 and bfloat16, mismatched dtypes) are handed
    to ``F.grid_sample``.
    """
    align = False if align_corners is None else align_corners
    if (isinstance(input, torch.Tensor) and isinstance(grid, torch.Tensor)
            and input.dim() == 5 and grid.dim() == 5
            and input.device.type == "cpu" and grid.device.type == "cpu"
            and input.dtype in _DTYPES and grid.dtype == input.dtype
            and mode in _MODES and padding_mode in _PADDINGS and isinstance(align, bool)):
        return _forward_op(input, grid, _MODES[mode], _PADDINGS[padding_mode], align)
    return _F.grid_sample(input, grid, mode=mode, padding_mode=padding_mode,
                          align_corners=align_corners)

