"""JAX adapter: :func:`grid_sample_3d` as a differentiable JAX function.

``import gs3d.jax`` imports jax (``import gs3d`` never does). The forward and the backward run
gs3d's CPU kernels through ``jax.pure_callback``; a ``jax.custom_vjp`` supplies the gradients,
so the function works under ``jax.jit``, ``jax.grad``/``jax.vjp`` and ``jax.vmap`` (batched
calls are folded into the batch axis N and run as one kernel call). Forward-mode
differentiation (``jax.jvp``, ``jax.jacfwd``) is not available, as for any ``custom_vjp``.

The callbacks receive the arrays on the host: on a CPU backend that is the arrays' own memory,
on an accelerator it is a device-to-host copy.
"""
from __future__ import annotations

import functools
from typing import Any, Tuple, Union

import jax
import numpy as np

from . import _api
from ._validation import check_problem, parse_bool, parse_mode, parse_padding, parse_layout

__all__ = ["grid_sample_3d"]


def _fold(a: np.ndarray) -> Tuple[np.ndarray, Tuple[int, ...]]:
    """(array with leading vmap axes folded into N, the leading axes)."""
    a = np.asarray(a)
    lead = a.shape[:-5]
    return a.reshape((-1,) + a.shape[-4:]) if lead else a, lead


def _unfold(a: np.ndarray, lead: Tuple[int, ...]) -> np.ndarray:
    return a.reshape(lead + (-1,) + a.shape[1:]) if lead else a


def _forward_host(x, grid, options):
    x, lead = _fold(x)
    grid, _ = _fold(grid)
    return _unfold(_api.grid_sample_3d(x, grid, **options), lead)


def _backward_host(grad_output, x, grid, options):
    grad_output, lead = _fold(grad_output)
    x, _ = _fold(x)
    grid, _ = _fold(grid)
    dx, dgrid = _api.grid_sample_3d_backward(grad_output, x, grid, output_mask=(True, True),
                                             **options)
    return _unfold(dx, lead), _unfold(dgrid, lead)


def _check(x, grid, options) -> Tuple[int, ...]:
    """Validate with gs3d's own checks at trace time; returns the output shape."""
    def stand_in(a):  # a zero-stride numpy array of the abstract value's shape and dtype
        return np.broadcast_to(np.zeros((), dtype=a.dtype), a.shape)
    pb = check_problem(stand_in(x), stand_in(grid), None, options["mode"],
                       options["padding_mode"], options["align_corners"], options["layout"])
    spatial = pb.out_spatial
    return (pb.N, *spatial, pb.C) if pb.channels_last else (pb.N, pb.C, *spatial)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _sample(x, grid, options_key):
    options = dict(options_key)
    shape = _check(x, grid, options)
    return jax.pure_callback(functools.partial(_forward_host, options=options),
                             jax.ShapeDtypeStruct(shape, x.dtype), x, grid,
                             vmap_method="broadcast_all")


def _sample_fwd(x, grid, options_key):
    return _sample(x, grid, options_key), (x, grid)


def _sample_bwd(options_key, residuals, grad_output):
    x, grid = residuals
    result = (jax.ShapeDtypeStruct(x.shape, x.dtype), jax.ShapeDtypeStruct(grid.shape, grid.dtype))
    return jax.pure_callback(functools.partial(_backward_host, options=dict(options_key)),
                             result, grad_output, x, grid, vmap_method="broadcast_all")


_sample.defvjp(_sample_fwd, _sample_bwd)


def grid_sample_3d(input: Any, grid: Any, *, mode: Union[str, int] = "bilinear",
                   padding_mode: Union[str, int] = "zeros", align_corners: bool = False,
                   layout: str = "NCDHW") -> jax.Array:
    """:func:`gs3d.grid_sample_3d` for JAX arrays, differentiable with respect to ``input``
    and ``grid`` (reverse mode), usable under ``jit`` and ``vmap``.

    Same arguments and result as :func:`gs3d.grid_sample_3d` (float64 needs
    ``jax_enable_x64``; bfloat16 and float16 work). Invalid calls raise
    :class:`gs3d.GridSamplerError` when the function is traced.
    """
    input = jax.numpy.asarray(input)
    grid = jax.numpy.asarray(grid)
    options = (("mode", parse_mode(mode)), ("padding_mode", parse_padding(padding_mode)),
               ("align_corners", parse_bool(align_corners, "align_corners")),
               ("layout", "NDHWC" if parse_layout(layout) else "NCDHW"))
    return _sample(input, grid, options)
