"""Dask adapter: forward and backward over ``dask.array`` inputs, so a batch larger than one
machine runs on a Dask cluster.

``import gs3d.dask`` imports dask (``import gs3d`` never does). The arrays may be chunked along
the batch axis N and the channel axis C; the spatial axes of ``input`` (and, in the backward,
the output-spatial axes of ``grad_output`` and ``grid``) are brought to one chunk, because one
output point may read any voxel. Each task runs gs3d's kernel on one (batch, channel) block:

- forward: blocks are independent in N and C (and in the output-spatial axes, which keep the
  chunking of ``grid``);
- input gradient: independent in N and C;
- grid gradient: a sum over channels. With one channel chunk it is computed in the task, with
  several each task computes a partial sum and the partials are added (in float64 for
  float64, float32 otherwise, then rounded once; so the last bits may differ from the
  in-memory call, which sums the channels in one order).

Threads: inside a Dask task the kernels use one thread (Dask already runs one task per worker
thread, so a worker started with ``nthreads=k`` keeps k cores busy); pass ``num_threads`` to
grant more. Outside Dask's parallel schedulers (the synchronous scheduler) the OpenMP default
applies.
"""
from __future__ import annotations

import operator
import sys
from typing import Any, Optional, Tuple, Union

import dask
import dask.array as da
import numpy as np

from . import _api
from ._validation import (
    check_problem, parse_bool, parse_layout, parse_mode, parse_num_threads, parse_output_mask,
    parse_padding,
)

__all__ = ["grid_sample_3d", "grid_sample_3d_backward"]

_SERIAL_SCHEDULERS = ("sync", "synchronous", "single-threaded")


def _task_threads(num_threads: Optional[int]) -> Optional[int]:
    """The kernel thread count inside a task: ``num_threads`` when given, else one thread on a
    distributed worker or in Dask's thread/process pools, else the OpenMP default (None)."""
    if num_threads is not None:
        return num_threads
    distributed = sys.modules.get("distributed")
    if distributed is not None:
        try:
            distributed.get_worker()
            return 1
        except ValueError:
            pass
    if dask.config.get("scheduler", None) in _SERIAL_SCHEDULERS:
        return None
    return 1


def _options(mode, padding_mode, align_corners, layout) -> dict:
    return {"mode": parse_mode(mode), "padding_mode": parse_padding(padding_mode),
            "align_corners": parse_bool(align_corners, "align_corners"),
            "layout": "NDHWC" if parse_layout(layout) else "NCDHW"}


def _stand_in(a) -> Optional[np.ndarray]:
    """A zero-stride numpy array with ``a``'s shape and dtype, for gs3d's checks."""
    if a is None:
        return None
    if any(isinstance(s, float) and s != s for s in a.shape):
        raise ValueError("gs3d.dask needs arrays of known shape (compute_chunk_sizes() first)")
    return np.broadcast_to(np.zeros((), dtype=a.dtype), a.shape)


def _as_dask(a) -> da.Array:
    return a if isinstance(a, da.Array) else da.asarray(a)


def _indices(channels_last: bool) -> Tuple[str, str, str]:
    """blockwise indices of (input, grad_output/output, grid)."""
    if channels_last:
        return "nijkc", "nopqc", "nopqz"
    return "ncijk", "ncopq", "nopqz"


def _is_half(dtype: np.dtype) -> bool:
    return dtype.itemsize == 2


# --------------------------------------------------------------------------------------------
# tasks
# --------------------------------------------------------------------------------------------

def _forward_block(x, grid, *, options, num_threads):
    return _api.grid_sample_3d(x, grid, num_threads=_task_threads(num_threads), **options)


def _backward_block(grad_output, x, grid, *, options, output_mask, partial, num_threads):
    """(input_grad block or None, grid_grad block with a length-1 channel axis, or None).

    ``partial``: the channels are split over several blocks, so the grid gradient is a partial
    sum, returned in the accumulation type (float32 for 16-bit storage)."""
    nt = _task_threads(num_threads)
    want_dx, want_dg = output_mask
    if partial and want_dg and _is_half(x.dtype):
        dx = _api.grid_sample_3d_backward(grad_output, x, grid, output_mask=(want_dx, False),
                                          num_threads=nt, **options)[0] if want_dx else None
        f32 = [np.asarray(a, dtype=np.float32) for a in (grad_output, x, grid)]
        dg = _api.grid_sample_3d_backward(*f32, output_mask=(False, True), num_threads=nt,
                                          **options)[1]
    else:
        dx, dg = _api.grid_sample_3d_backward(grad_output, x, grid, output_mask=output_mask,
                                              num_threads=nt, **options)
    return dx, (dg[:, None] if dg is not None else None)


# --------------------------------------------------------------------------------------------
# public functions
# --------------------------------------------------------------------------------------------

def grid_sample_3d(input: Any, grid: Any, *, mode: Union[str, int] = "bilinear",
                   padding_mode: Union[str, int] = "zeros", align_corners: bool = False,
                   layout: str = "NCDHW", num_threads: Optional[int] = None) -> da.Array:
    """:func:`gs3d.grid_sample_3d` over dask arrays (lazy; ``.compute()`` runs it).

    ``input`` may be chunked along N and C, ``grid`` along N and its output-spatial axes; the
    result is chunked like them. ``num_threads``: kernel threads per task (default: see the
    module docstring). Invalid calls raise :class:`gs3d.GridSamplerError` here, before any
    task runs.
    """
    x, q = _as_dask(input), _as_dask(grid)
    options = _options(mode, padding_mode, align_corners, layout)
    if num_threads is not None:
        parse_num_threads(num_threads, 1)
    pb = check_problem(_stand_in(x), _stand_in(q), None, **options)
    x_ind, o_ind, q_ind = _indices(pb.channels_last)
    spatial = (1, 2, 3) if pb.channels_last else (2, 3, 4)
    x = x.rechunk({a: -1 for a in spatial})
    q = q.rechunk({4: -1})
    return da.blockwise(_forward_block, o_ind, x, x_ind, q, q_ind, dtype=x.dtype,
                        concatenate=True, options=options, num_threads=num_threads,
                        meta=np.empty((0,) * 5, dtype=x.dtype))


def grid_sample_3d_backward(grad_output: Any, input: Any, grid: Any, *,
                            mode: Union[str, int] = "bilinear",
                            padding_mode: Union[str, int] = "zeros", align_corners: bool = False,
                            output_mask: Tuple[bool, bool] = (True, True), layout: str = "NCDHW",
                            num_threads: Optional[int] = None,
                            ) -> Tuple[Optional[da.Array], Optional[da.Array]]:
    """:func:`gs3d.grid_sample_3d_backward` over dask arrays: ``(input_grad, grid_grad)``, lazy
    dask arrays, or None for a gradient ``output_mask`` does not ask for.

    ``input_grad`` is chunked like ``input`` along N and C; ``grid_grad`` like N, in one chunk
    otherwise. One task per (batch, channel) block computes both gradients.
    """
    g, x, q = _as_dask(grad_output), _as_dask(input), _as_dask(grid)
    options = _options(mode, padding_mode, align_corners, layout)
    want_dx, want_dg = parse_output_mask(output_mask)
    if num_threads is not None:
        parse_num_threads(num_threads, 1)
    pb = check_problem(_stand_in(x), _stand_in(q), _stand_in(g), **options)
    if not (want_dx or want_dg):
        return None, None
    cl = pb.channels_last
    x_ind, g_ind, q_ind = _indices(cl)
    c_axis = 4 if cl else 1
    spatial = (1, 2, 3) if cl else (2, 3, 4)
    # one chunk for every axis but N and C; C chunked alike in grad_output and input
    x = x.rechunk({a: -1 for a in spatial})
    g = g.rechunk({a: -1 for a in spatial})
    q = q.rechunk({1: -1, 2: -1, 3: -1, 4: -1})
    g, x = da.core.unify_chunks(g, g_ind, x, x_ind)[1]
    q = q.rechunk({0: x.chunks[0]})
    partial = len(x.chunks[c_axis]) > 1
    # one task per (n, c) block, returning a tuple; the gradients are picked out of it
    pairs = da.blockwise(_backward_block, "nc", g, g_ind, x, x_ind, q, q_ind,
                         concatenate=True, dtype=object, meta=np.empty((0, 0), dtype=object),
                         options=options, output_mask=(want_dx, want_dg), partial=partial,
                         num_threads=num_threads)
    dx = dg = None
    if want_dx:
        chunks = [x.chunks[0], x.chunks[c_axis], *[x.chunks[a] for a in spatial]]
        if cl:
            chunks = [chunks[0], *chunks[2:], chunks[1]]
        new_axis = [1, 2, 3] if cl else [2, 3, 4]
        dx = pairs.map_blocks(operator.getitem, 0, chunks=tuple(chunks), new_axis=new_axis,
                              dtype=x.dtype, meta=np.empty((0,) * 5, dtype=x.dtype))
    if want_dg:
        acc = x.dtype if not (partial and _is_half(x.dtype)) else np.dtype(np.float32)
        n_c = len(x.chunks[c_axis])
        dg_chunks = (x.chunks[0], (1,) * n_c, *[(s,) for s in q.shape[1:]])
        parts = pairs.map_blocks(operator.getitem, 1, chunks=dg_chunks, new_axis=[2, 3, 4, 5],
                                 dtype=acc, meta=np.empty((0,) * 6, dtype=acc))
        if partial:
            dg = parts.sum(axis=1, dtype=acc).astype(x.dtype)
        else:
            dg = parts[:, 0]
    return dx, dg
