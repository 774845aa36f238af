"""Public functions of gs3d: validation and dtype decisions here, arithmetic in ``_kernels``."""
from __future__ import annotations

import contextlib
import contextvars
import importlib
import math
import os
import threading
from typing import Any, Iterator, Optional, Tuple

import numpy as np

from . import _kernels as _baseline_kernels


def _select_kernels():
    """The kernel module for this CPU: the AVX-512 build when the CPU (and OS) has AVX-512 F,
    VL, DQ and BW, else the AVX2/FMA/F16C build when it has those, else the baseline build,
    each only if it was built. ``GS3D_SIMD=baseline`` or ``GS3D_SIMD=avx2`` caps the level.
    All give bitwise the same results."""
    cap = os.environ.get("GS3D_SIMD", "").lower()
    levels = []
    if cap not in ("baseline", "avx2") and _baseline_kernels.cpu_has_avx512():
        levels.append("avx512")
    if cap != "baseline" and _baseline_kernels.cpu_has_avx2():
        levels.append("avx2")
    for level in levels:
        try:
            return importlib.import_module(f"{__package__}._kernels_{level}"), level
        except ImportError:
            pass
    return _baseline_kernels, "baseline"


_kernels, SIMD_LEVEL = _select_kernels()
from ._validation import (
    LINE, MAX_THREADS, MODES, GridSamplerError, Problem, aligned_empty, as_input_array,
    check_output, check_problem, kernel_ready, parse_deterministic, parse_num_threads,
    parse_output_mask, parse_bool, volume_shape,
)

__all__ = [
    "grid_sample_3d", "grid_sample_3d_backward", "plan_forward", "plan_backward",
    "ForwardPlan", "BackwardPlan", "set_deterministic", "get_deterministic", "deterministic",
    "show_config", "clear_cache", "GridSamplerError",
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


# Outputs gs3d allocates start on a cache line (aligned_empty) from this size on; below it a
# call is short and a plain array (which owns its memory) keeps the caller's later checks
# cheapest.
_ALIGN_OUTPUT_BYTES = 1 << 18


def _buffer_bytes(a: np.ndarray) -> int:
    """Bytes of the memory behind ``a``: an aligned_empty view counts its whole buffer."""
    base = a.base
    return a.nbytes if base is None else base.nbytes


def _compute_dtype(kind: str) -> np.dtype:
    return np.dtype(np.float64 if kind == "f8" else np.float32)


class _Resources:
    """Everything a kernel call needs besides its arrays (owned by a plan; for plain calls,
    pooled per call signature, or when bigger kept in the shared slots ``_big``; see
    ``_Call``).  Used by one call at a time."""

    __slots__ = ("pb", "nt", "half_kind", "scratch", "workspace", "dx_acc", "dummy_dx",
                 "dummy_dg", "nbytes", "mode", "padding", "align", "out_empty", "in_empty",
                 "home", "plain_align", "cl", "xcl", "runner", "brunner", "split",
                 "align_out", "align_dx", "align_dg", "copy_on_demand", "copy_size",
                 "acc_on_demand", "key")

    def __init__(self, pb: Problem, nt: int, want_dx: bool, backward: bool = False):
        acc = _compute_dtype(pb.kind)
        store = np.uint16 if pb.kind in _HALF_KIND else acc     # float32/64 store what they compute
        D, H, W = pb.in_spatial
        self.pb = pb
        self.nt = nt
        self.half_kind = _HALF_KIND.get(pb.kind, 0)
        self.scratch = aligned_empty((nt, pb.C + _kernels.SCRATCH_EXTRA), acc)
        self.workspace = aligned_empty((_kernels.workspace_bytes(nt, D, math.prod(pb.out_spatial),
                                                                  pb.mode),), np.uint8)
        # NCDHW with many channels runs through channels-last copies (see the kernels):
        # a channels-last accumulator of one batch item, and a copy of input[n] that lives in
        # input_grad[n] when that is contiguous, else in ``xcl``
        copies = _copies_pay(pb, backward, nt)
        self.cl = copies and not pb.channels_last
        # the split of one batch item's points in two halves (see _may_split)
        self.split = backward and want_dx and _may_split(pb)
        if want_dx and self.cl:
            self.dx_acc = aligned_empty(_cl_acc_shape(pb, nt), acc)
        elif want_dx and self.split:
            self.dx_acc = aligned_empty((D, H, W, pb.C), acc)
        elif want_dx and pb.kind in _HALF_KIND:
            # float32 accumulators in the memory order of input_grad: one per thread when
            # every thread gets whole batch items (N >= threads: at most the size of one
            # float32 input_grad), else one for the batch item all threads share
            k = nt if 1 < nt <= pb.N else 1
            self.dx_acc = _ndhwc(aligned_empty(volume_shape(k, pb.C, (D, H, W),
                                                             pb.channels_last), acc),
                                 pb.channels_last)
            if k == 1:
                self.dx_acc = self.dx_acc[0]
        else:
            self.dx_acc = np.empty((1, 1, 1, 1), dtype=acc)
        # (nearest's backward never reads the input, so it makes no copy of it)
        copy_in = copies and not want_dx and not (backward and pb.mode == MODES["nearest"])
        # with at least as many batch items as threads, the forward and the grid gradient
        # alone copy whole items, one per thread (at most the size of a float32 input:
        # float64 needs N >= 2 threads)
        k = nt if 1 < nt <= pb.N and nt * np.dtype(store).itemsize <= 4 * pb.N else 1
        self.copy_size = D * H * W * pb.C * k
        self.xcl = aligned_empty((self.copy_size if copy_in and self.cl else 1,), store)
        # a channels-last problem takes the same copies when its input's channels are strided
        # (an np.moveaxis view of an NCDHW array, say), made by the first call with such an
        # input (reading the channel planes in place cost 2-7x): ``xcl`` (_grow_xcl), and for
        # float32/float64 with the input gradient the accumulator, unless the split's is
        # there (_grow_acc; 16-bit storage has its own, channels-last)
        self.copy_on_demand = copy_in and pb.channels_last
        self.acc_on_demand = (want_dx and copies and pb.channels_last and not self.split
                              and pb.kind not in _HALF_KIND and pb.mode == MODES["bilinear"])
        self.dummy_dx = np.empty((1,) * 5, dtype=store)
        self.dummy_dg = np.empty((1, 1, 1, 1, 3), dtype=store)
        self.home: Optional[list] = None       # the pool list of a _Call, if pooled
        self.key: Optional[tuple] = None       # what a plain call's big scratch is kept under
        self.nbytes = sum(_buffer_bytes(a) for a in (self.scratch, self.workspace, self.dx_acc,
                                                     self.xcl, self.dummy_dx, self.dummy_dg))
        # the options the runners are bound with
        self.mode, self.padding, self.align = pb.mode, pb.padding, pb.align
        self.out_empty = pb.N * pb.C * math.prod(pb.out_spatial) == 0    # output / grad_output
        self.in_empty = pb.N * pb.C * D * H * W == 0
        # a dtype whose alignment is its size: an aligned array's strides are multiples of it,
        # so ``kernel_ready`` keeps every aligned array (checked inline by _forward/_backward)
        dt = np.dtype(store)
        self.plain_align = dt.alignment == dt.itemsize
        # which outputs, when gs3d allocates them, start on a cache line (see _ALIGN_OUTPUT_BYTES):
        # the forward's output, input_grad and grid_grad
        P, L = math.prod(pb.out_spatial), D * H * W
        self.align_out, self.align_dx, self.align_dg = (
            pb.N * n * dt.itemsize >= _ALIGN_OUTPUT_BYTES for n in (P * pb.C, L * pb.C, P * 3))
        self.runner: Any = None     # the forward's _kernels.ForwardRunner, bound on first use
        self.brunner: Any = None    # the backward's _kernels.BackwardRunner, likewise


def _cl_acc_shape(pb: Problem, nt: int) -> tuple:
    """The channels-last input-gradient accumulator of the copies' path: one per thread when
    the threads run whole batch items (at most the size of a float32 input_grad; float64
    needs N >= 2 threads), else one batch item."""
    D, H, W = pb.in_spatial
    if 1 < nt and nt * _compute_dtype(pb.kind).itemsize <= 4 * pb.N:
        return (nt, D, H, W, pb.C)
    return (D, H, W, pb.C)


def _copies_pay(pb: Problem, backward: bool, nt: int = 1) -> bool:
    """True when the kernels run ``pb`` through channels-last copies if its input's channel
    stride is not 1 (always so for NCDHW): many channels, or from four for the float32
    bilinear backward, any padding (exactly four for float16/bfloat16), or for the float32
    bilinear forward of a large batch item (4-7 channels: on any grid where the SIMD kernels
    run, else on scattered grids, as the kernel decides per call; larger where ``nt``
    threads share a batch item; their rules, _kernels.channels_last_pays; the buffers are
    sized here from them)."""
    D, H, W = pb.in_spatial
    itemsize = 2 if pb.kind in _HALF_KIND else 8 if pb.kind == "f8" else 4
    if backward:
        few = _kernels.few_channels_backward(itemsize, pb.C, pb.mode, pb.padding)
    else:
        few = _kernels.few_channels_forward(itemsize, pb.C, D, H, W, pb.mode,
                                            nt == 1 or pb.N >= nt)
    return _kernels.channels_last_pays(pb.C, D, H, W, math.prod(pb.out_spatial), few)


def _may_split(pb: Problem) -> bool:
    """True when the bilinear backward of ``pb`` may split the points of its one batch item
    in two halves, each scattered in order into its own float32/float64 accumulator
    (input_grad and a (D, H, W, C) buffer), the two summed afterwards: on two threads, one
    half each.  The kernel decides from the grid (random grids, where depth slabs would make
    both threads set up most tiles; with one channel, any grid) and needs a dense
    input_grad; here, the shape rules: one batch item, no 16-bit storage, no channels-last
    copy, and at least a quarter as many output points as voxels (else the extra pass over
    the accumulator outweighs the gain).
    The choice never depends on the thread count or the deterministic mode."""
    D, H, W = pb.in_spatial
    P = math.prod(pb.out_spatial)
    return (pb.N == 1 and pb.mode == MODES["bilinear"] and pb.kind not in _HALF_KIND
            and 4 * P >= D * H * W
            and (pb.channels_last or not _copies_pay(pb, True)))


def _bind_runner(runner: Any, res: _Resources, dtype: np.dtype, out_shape: tuple) -> None:
    """Bind a ``_kernels.ForwardRunner`` to the problem and scratch of ``res``."""
    pb = res.pb
    runner.bind(dtype, volume_shape(pb.N, pb.C, pb.in_spatial, pb.channels_last),
                (pb.N, *pb.out_spatial, 3), out_shape, pb.channels_last, res.scratch,
                res.workspace, res.xcl, res.mode, res.padding, res.align, res.half_kind, res.nt)
    runner.line_out = res.align_out
    runner.copy_on_demand = res.copy_on_demand
    res.runner = runner


def _grown(res: _Resources, old: np.ndarray, new: np.ndarray) -> np.ndarray:
    """``new``, counted in ``res.nbytes`` in place of ``old`` (and ``res`` taken out of its
    signature's pool if that makes it too big for the pool: a plain call's set then goes to
    the shared slots ``_big`` when small enough, see _release)."""
    res.nbytes += _buffer_bytes(new) - _buffer_bytes(old)
    if res.nbytes > _POOL_MAX_BYTES:
        res.home = None
    return new


_grow_lock = threading.Lock()     # a forward plan may be called from several Python threads


def _grow_xcl(res: _Resources, runner: Any, size: int) -> None:
    """Give ``res`` and its runner a channels-last input copy buffer of ``size`` elements in
    place of the one-element dummy, once.  The lock covers the swap only: ``set_xcl`` waits
    for a kernel running on the runner (a call racing this one meanwhile runs on the dummy,
    reading the input in place: slower, the same bits)."""
    with _grow_lock:
        if res.xcl.size != 1:
            return
        res.xcl = _grown(res, res.xcl, aligned_empty((size,), res.xcl.dtype))
    runner.set_xcl(res.xcl)


def _grow_acc(res: _Resources, dtype: np.dtype, want_dg: bool) -> Any:
    """Give ``res`` the channels-last input-gradient accumulator of the copies' path in place
    of the dummy (see ``acc_on_demand``) and a backward runner bound to it; ``res.cl`` from
    then on, as for NCDHW (for the input copy's buffer, see _backward)."""
    res.acc_on_demand = False
    res.dx_acc = _grown(res, res.dx_acc, aligned_empty(_cl_acc_shape(res.pb, res.nt),
                                                       res.dx_acc.dtype))
    res.cl = True
    return _bind_backward_runner(res, dtype, True, want_dg)


def _bind_backward_runner(res: _Resources, dtype: np.dtype, want_dx: bool,
                          want_dg: bool) -> Any:
    """A ``_kernels.BackwardRunner`` bound to the problem, output mask and scratch of ``res``."""
    pb = res.pb
    runner = _kernels.BackwardRunner()
    runner.bind(dtype, volume_shape(pb.N, pb.C, pb.out_spatial, pb.channels_last),
                volume_shape(pb.N, pb.C, pb.in_spatial, pb.channels_last),
                (pb.N, *pb.out_spatial, 3), pb.channels_last, want_dx, want_dg, res.dx_acc,
                res.scratch, res.workspace, res.xcl, res.dummy_dx, res.dummy_dg, res.mode,
                res.padding, res.align, res.half_kind, res.nt)
    res.brunner = runner
    return runner


# GNU OpenMP cannot start a parallel region in a child forked after the parent used threads
# (the child waits forever for workers that were not copied). In a forked child gs3d therefore
# runs its kernels on the calling thread, without entering OpenMP; use the "spawn" or
# "forkserver" start method for children that should use several threads.
_forked_child = False


def _after_fork_in_child() -> None:
    global _forked_child, _calls_lock, _grow_lock
    _forked_child = True
    _calls_lock = threading.RLock()     # another parent thread may have held them at the fork
    _grow_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _threads(num_threads: Any, work: int) -> int:
    """Threads for a call: at most ``num_threads`` (OpenMP's count when None), and fewer for
    small calls, where starting threads costs more than they bring (one per _WORK_PER_THREAD
    point-channels); a forked child always runs on one thread (see above)."""
    threads = parse_num_threads(num_threads, 1 if _forked_child else _kernels.max_threads())
    if _forked_child:
        return 1
    return max(1, min(threads, work // _WORK_PER_THREAD))


# --------------------------------------------------------------------------------------------
# per-call cache of plain calls: what the validation derived from (shapes, dtypes, options)
# --------------------------------------------------------------------------------------------
# A plain call with numpy arrays and plain option values looks its signature up here; a hit
# means the same arguments passed every check before (the checks depend on nothing else), so
# only the output buffers are checked again. Each entry pools a few idle scratch sets, taken
# by one call at a time (list pop/append are atomic), so repeated small calls allocate nothing
# but their results. Bounded: a few entries, a few small scratch sets each; no user arrays.
_CALLS_MAX = 8                  # signatures remembered (oldest dropped first)
_POOL_DEPTH = 2                 # idle scratch sets kept per signature
_POOL_MAX_BYTES = 1 << 16       # bigger scratch sets are kept in the shared slots below
# Bigger scratch sets (channels-last copies and accumulators, workspaces of big outputs) are
# kept idle in a few slots shared by all signatures, up to _BIG_MAX_BYTES in all, the most
# recently used kept: fresh memory costs a page fault per 4 KiB on first touch, which at
# 1x16x32^3 made a plain call 0.25-0.35 ms (20-25%) slower than the same call through a plan
# (8x8x32^3 backward: 0.9 ms), and 1x32x64^3 NCDHW backward 47 ms against 19 ms when huge
# pages are short (its copy and accumulator have 32 MiB each).  Matched by (problem, threads,
# output mask), whatever the signature's options object; dropped by clear_cache.
_BIG_SLOTS = 4
_BIG_MAX_BYTES = 128 << 20      # idle in all
_BIG_SET_MAX_BYTES = 128 << 20  # larger sets are allocated per call
_big: list = []                 # idle big _Resources, oldest first; under _calls_lock
_calls: dict = {}
# Reentrant: a garbage collection inside a section under the lock may run a finalizer that
# calls gs3d (clear_cache, say) on the same thread, which must not wait for itself; the
# sections therefore survive the lists being emptied under them.
_calls_lock = threading.RLock()
_PLAIN = (str, int, bool, type(None))   # option types a signature may hold (1 != True here)
# The last signature of each direction, matched by the identity of its option objects (plain
# immutable values, so identity implies the same type and value) before any hashing: repeated
# calls from one place in the caller's code pass the very same objects.
_NEVER = object()
_last_fwd: tuple = (_NEVER,) * 9
_last_bwd: tuple = (_NEVER,) * 12


def _keep(idle: list, item: Any, slots: int, max_bytes: int) -> None:
    """Append ``item`` to ``idle`` (oldest first), then drop the oldest while more than
    ``slots`` items or ``max_bytes`` (of their ``nbytes``) are there.  Each step is one list
    operation: a finalizer run meanwhile may empty the list (see _calls_lock, _idle_out)."""
    idle.append(item)
    try:
        while len(idle) > slots or sum(i.nbytes for i in idle) > max_bytes:
            idle.pop(0)
    except IndexError:
        pass


def _take(idle: list, match: Any) -> Any:
    """The most recent item of ``idle`` for which ``match(item)``, taken off the list, or
    None; what was popped is checked, since the list may change meanwhile (see _keep)."""
    for i in range(len(idle) - 1, -1, -1):
        try:
            item = idle[i]
            if not match(item):
                continue
            got = idle.pop(i)
        except IndexError:
            return None
        if got is item:
            return got
        idle.append(got)        # not the one looked at: leave it
        return None
    return None


class _Call:
    """A validated call signature: its problem, result shape, thread rule and scratch pool."""

    __slots__ = ("pb", "shape", "want_dx", "want_dg", "cap", "fixed_nt", "pool")

    def __init__(self, pb: Problem, shape: tuple, num_threads: Any, want_dx: bool = False,
                 want_dg: bool = False):
        self.pb, self.shape, self.want_dx, self.want_dg = pb, shape, want_dx, want_dg
        self.cap = max(1, (pb.N * math.prod(pb.out_spatial) * max(pb.C, 1)) // _WORK_PER_THREAD)
        self.fixed_nt = None if num_threads is None else parse_num_threads(num_threads, 1)
        self.pool: Tuple[int, list] = (0, [])      # (thread count, idle _Resources of it)

    def acquire(self) -> _Resources:
        """Idle scratch for this call's thread count, or new scratch.  Give it back with
        ``_release``.  The count is ``_threads(num_threads, work)`` without re-parsing:
        OpenMP's default is read on each call."""
        if _forked_child or self.cap == 1:
            nt = 1
        elif self.fixed_nt is not None:
            nt = min(self.fixed_nt, self.cap)
        else:
            nt = max(1, min(_kernels.max_threads(), MAX_THREADS, self.cap))
        pool_nt, free = self.pool
        if nt == pool_nt:
            try:
                return free.pop()
            except IndexError:
                pass
        else:
            free = []                       # the thread count changed: a pool for the new one
            self.pool = (nt, free)
        key = (self.pb, nt, self.want_dx, self.want_dg)
        if _big:
            with _calls_lock:
                res = _take(_big, lambda r: r.key == key)
            if res is not None:
                return res
        res = _Resources(self.pb, nt, self.want_dx, self.want_dx or self.want_dg)
        res.key = key
        if res.nbytes <= _POOL_MAX_BYTES:
            res.home = free
        return res


def _release(res: _Resources) -> None:
    """Back to the pool it was made for (a list holds only scratch of its thread count), or,
    when too big for that, to the shared slots of idle big scratch (oldest dropped first)."""
    free = res.home
    if free is not None:
        if len(free) < _POOL_DEPTH:
            free.append(res)
    elif res.key is not None and res.nbytes <= _BIG_SET_MAX_BYTES:
        with _calls_lock:
            _keep(_big, res, _BIG_SLOTS, _BIG_MAX_BYTES)


def _remember(key: Optional[tuple], call: _Call, options: tuple) -> bool:
    """Cache ``call`` under ``key`` when its options are of plain types (never subclasses or
    numpy scalars, whose equality would blur 1 and True); True when cached."""
    if key is None or not all(v.__class__ in _PLAIN for v in options):
        return False
    with _calls_lock:
        if key not in _calls:
            try:
                while len(_calls) >= _CALLS_MAX:
                    del _calls[next(iter(_calls))]
            except (KeyError, StopIteration):   # emptied meanwhile (see _calls_lock)
                pass
            _calls[key] = call
    return True


def clear_cache() -> None:
    """Free the idle memory gs3d keeps to spare the page faults of fresh memory: the scratch
    of plain calls (pooled per call signature, and at most 128 MiB of bigger scratch sets,
    reused by the next call of the same problem) and the buffers of dropped outputs of 4 MiB
    or more (at most 128 MiB, reused by the next output of their size); and forget the
    remembered call signatures.  Plans keep their own scratch until they are deleted."""
    global _last_fwd, _last_bwd
    with _calls_lock:
        _calls.clear()
        _big.clear()
        _last_fwd, _last_bwd = (_NEVER,) * 9, (_NEVER,) * 12
    _idle_out.clear()


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
        Cap on OpenMP threads (small calls use fewer); None uses the OpenMP default
        (``OMP_NUM_THREADS``, threadpoolctl).
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
    global _last_fwd
    m = _last_fwd
    if (mode is m[0] and padding_mode is m[1] and align_corners is m[2] and layout is m[3]
            and num_threads is m[4] and input.__class__ is np.ndarray
            and grid.__class__ is np.ndarray and input.dtype is m[5] and grid.dtype is m[5]
            and input.shape == m[6] and grid.shape == m[7]):
        call = m[8]
    else:
        key = call = None
        if input.__class__ is np.ndarray and grid.__class__ is np.ndarray:
            try:
                key = (input.shape, grid.shape, input.dtype, grid.dtype, mode, mode.__class__,
                       padding_mode, padding_mode.__class__, align_corners,
                       align_corners.__class__, layout, layout.__class__, num_threads,
                       num_threads.__class__)
                call = _calls.get(key)
            except Exception:   # noqa: BLE001 - an unhashable option: the full checks report it
                key = call = None
            if call is not None:
                _last_fwd = (mode, padding_mode, align_corners, layout, num_threads, input.dtype,
                             input.shape, grid.shape, call)
    if call is not None:
        # a signature validated before: only the output buffer is new
        if out is not None:
            out = _check_out(out, call.shape, input.dtype, input, grid)
        res = call.acquire()
        try:
            return _forward(res, input, grid, out, call.shape)
        finally:
            _release(res)
    x = as_input_array(input, "input")
    q = as_input_array(grid, "grid")
    pb = check_problem(x, q, None, mode, padding_mode, align_corners, layout)
    shape = volume_shape(pb.N, pb.C, pb.out_spatial, pb.channels_last)
    _threads(num_threads, 0)        # validates num_threads (the _Call applies the rule)
    if out is not None:
        check_output(out, "out", shape, x.dtype, (("input", x), ("grid", q)))
    call = _Call(pb, shape, num_threads)
    if _remember(key, call, (mode, padding_mode, align_corners, layout, num_threads)):
        _last_fwd = (mode, padding_mode, align_corners, layout, num_threads, x.dtype, x.shape,
                     q.shape, call)
    res = call.acquire()
    try:
        return _forward(res, x, q, out, shape)
    finally:
        _release(res)


# Recycled output memory.  A new output of at least _RECYCLE_MIN_BYTES is carved from a buffer
# that an earlier output of gs3d left behind when the caller dropped it, if one of the same
# size is idle: fresh memory costs a page fault per 4 KiB page (or per 2 MiB huge
# page, when the kernel has them) and the kernel zeroes every page, and this host spends up to
# two thirds of a big call there (a plain 1x32x64^3 forward: 15.6 ms with fresh output, 4.8 ms
# with recycled; 6.5 against 4.6 when huge pages are at hand).  The buffer is handed back only
# when nothing refers to the output any more: the output's base is a byte array whose base is
# its _Lease, every view holds one of them (numpy stops collapsing a view's base chain at a
# base of another type), and only the lease's __del__ returns the buffer.  Idle buffers are
# bounded (the most recently returned kept; none over the bound) and freed by clear_cache.
_RECYCLE_MIN_BYTES = 4 << 20
_RECYCLE_MAX_BYTES = 128 << 20  # idle in all
_RECYCLE_SLOTS = 8              # idle buffers at most
# Idle buffers (uint8 arrays), oldest first.  No lock: a lease can die anywhere, inside a
# garbage collection that runs any finalizer, including one that calls gs3d (which would
# wait forever for a lock its own thread holds); _keep and _take survive the list changing
# under them.
_idle_out: list = []


class _Lease:
    """The base of an output carved from a recycled buffer: the buffer goes back to the idle
    list when the last array that uses it goes."""

    __slots__ = ("__array_interface__", "buf")
    __array_interface__: dict
    buf: np.ndarray

    def __del__(self) -> None:
        try:
            if self.buf.nbytes <= _RECYCLE_MAX_BYTES:   # (a bigger one would push all out)
                _keep(_idle_out, self.buf, _RECYCLE_SLOTS, _RECYCLE_MAX_BYTES)
        except Exception:       # module globals torn down at exit
            pass


def _take_idle(size: int) -> Optional[np.ndarray]:
    """An idle buffer of ``size`` bytes taken off the list (the most recent), or None."""
    return _take(_idle_out, lambda b: b.nbytes == size)


def _recycled_empty(shape: tuple, dtype: np.dtype, nbytes: int) -> np.ndarray:
    """An uninitialised C-contiguous array of ``shape`` and ``dtype`` (``nbytes`` bytes, at
    least _RECYCLE_MIN_BYTES) starting on a cache line, in an idle recycled buffer of its
    size or a new one."""
    size = nbytes + LINE
    buf = _take_idle(size)
    if buf is None:
        buf = np.empty(size, np.uint8)
    lease = _Lease()
    lease.buf = buf
    lease.__array_interface__ = {"shape": (size,), "typestr": "|u1", "version": 3,
                                 "data": (buf.ctypes.data, False)}
    return aligned_empty(shape, dtype, np.asarray(lease))


def _output(given: Optional[np.ndarray], shape: tuple, dtype: np.dtype, plain_align: bool,
            line: bool) -> Tuple[np.ndarray, np.ndarray]:
    """(array returned to the caller, array the kernel writes): the latter is a temporary only
    when a given buffer's strides or alignment do not fit the kernels (``plain_align``: see
    _Resources; kernel_ready's own test runs only when the quick one fails).  A new array
    starts on a cache line when ``line``, in recycled memory when big (_recycled_empty)."""
    if given is None:
        if not line:
            arr = np.empty(shape, dtype)
        else:
            nbytes = math.prod(shape) * dtype.itemsize
            arr = (_recycled_empty(shape, dtype, nbytes) if nbytes >= _RECYCLE_MIN_BYTES
                   else aligned_empty(shape, dtype))
        return arr, arr
    if plain_align and given.flags.aligned:
        return given, given
    return given, kernel_ready(given)


def _forward(res: _Resources, x, q, out, shape):
    """Run the forward into ``out`` (a new array when None) and return it.  One flat function:
    at the worked-example size each Python call level costs a noticeable part of the call."""
    result, target = _output(out, shape, x.dtype, res.plain_align, res.align_out)
    if res.out_empty:
        return result
    if not (res.plain_align and x.flags.aligned):
        x = kernel_ready(x)
    if not (res.plain_align and q.flags.aligned):
        q = kernel_ready(q)
    runner = res.runner
    if runner is None:
        runner = _kernels.ForwardRunner()
        _bind_runner(runner, res, x.dtype, shape)
    if res.copy_on_demand and res.xcl.size == 1 and x.strides[4] != x.itemsize:
        _grow_xcl(res, runner, res.copy_size)
    # the runner takes the arrays in the caller's layout and storage type (no views to make)
    runner.run(x, q, target)
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
    global _last_bwd
    m = _last_bwd
    if (mode is m[0] and padding_mode is m[1] and align_corners is m[2] and layout is m[3]
            and num_threads is m[4] and deterministic is m[5] and output_mask is m[6]
            and grad_output.__class__ is np.ndarray and input.__class__ is np.ndarray
            and grid.__class__ is np.ndarray and grad_output.dtype is m[7]
            and input.dtype is m[7] and grid.dtype is m[7] and grad_output.shape == m[8]
            and input.shape == m[9] and grid.shape == m[10]):
        call = m[11]
    else:
        key = call = None
        if (grad_output.__class__ is np.ndarray and input.__class__ is np.ndarray
                and grid.__class__ is np.ndarray):
            try:
                om = output_mask
                key = (grad_output.shape, input.shape, grid.shape, grad_output.dtype,
                       input.dtype, grid.dtype, mode, mode.__class__, padding_mode,
                       padding_mode.__class__, align_corners, align_corners.__class__, layout,
                       layout.__class__, num_threads, num_threads.__class__, deterministic,
                       deterministic.__class__, om.__class__, len(om), om[0], om[0].__class__,
                       om[1], om[1].__class__)
                call = _calls.get(key)
            except Exception:   # noqa: BLE001 - an odd option: the full checks report it
                key = call = None
            if call is not None and output_mask.__class__ is tuple:     # immutable: memo
                _last_bwd = (mode, padding_mode, align_corners, layout, num_threads,
                             deterministic, output_mask, input.dtype, grad_output.shape,
                             input.shape, grid.shape, call)
    if call is not None:
        # a signature validated before: only the output buffers are new
        want_dx, want_dg = call.want_dx, call.want_dg
        if input_grad is not None or grid_grad is not None:
            input_grad, grid_grad = _check_outs(input_grad, grid_grad, want_dx, want_dg,
                                                grad_output, input, grid)
        res = call.acquire()
        try:
            return _backward(res, grad_output, input, grid, want_dx, want_dg, input_grad,
                             grid_grad)
        finally:
            _release(res)
    g = as_input_array(grad_output, "grad_output")
    x = as_input_array(input, "input")
    q = as_input_array(grid, "grid")
    pb = check_problem(x, q, g, mode, padding_mode, align_corners, layout)
    want_dx, want_dg = parse_output_mask(output_mask)
    parse_deterministic(deterministic)
    _threads(num_threads, 0)        # validates num_threads (the _Call applies the rule)
    inputs = (("grad_output", g), ("input", x), ("grid", q))
    if want_dx and input_grad is not None:
        check_output(input_grad, "input_grad", x.shape, x.dtype, inputs)
    if want_dg and grid_grad is not None:
        check_output(grid_grad, "grid_grad", q.shape, q.dtype, inputs,
                     (("input_grad", input_grad if want_dx else None),))
    call = _Call(pb, x.shape, num_threads, want_dx, want_dg)
    if (key is not None and output_mask.__class__ in (tuple, list) and len(output_mask) == 2
            and _remember(key, call, (mode, padding_mode, align_corners, layout, num_threads,
                                      deterministic, *output_mask))
            and output_mask.__class__ is tuple):
        _last_bwd = (mode, padding_mode, align_corners, layout, num_threads, deterministic,
                     output_mask, x.dtype, g.shape, x.shape, q.shape, call)
    res = call.acquire()
    try:
        return _backward(res, g, x, q, want_dx, want_dg, input_grad, grid_grad)
    finally:
        _release(res)


def _items_dense(a: np.ndarray) -> bool:
    """True when every batch item ``a[n]`` is one dense block of memory, its axes in any order
    with positive strides: the kernels' test (dense_strides) for putting the channels-last
    input copy of the NCDHW backward in input_grad[n] itself."""
    step = a.itemsize
    for stride, size in sorted((st, n) for n, st in zip(a.shape[1:], a.strides[1:]) if n > 1):
        if stride != step:
            return False
        step *= size
    return True


def _backward(res: _Resources, g, x, q, want_dx, want_dg, input_grad, grid_grad):
    """Run the backward into the given buffers (new arrays when None); flat like _forward."""
    dx = dx_k = dg = dg_k = None
    pa = res.plain_align
    if want_dx:
        dx, dx_k = _output(input_grad, x.shape, x.dtype, pa, res.align_dx)
    if want_dg:
        dg, dg_k = _output(grid_grad, q.shape, q.dtype, pa, res.align_dg)
    if res.out_empty or res.in_empty:
        # nothing samples the input (N, C or the output size is 0): zero gradients
        for arr in (dx, dg):
            if arr is not None:
                arr[...] = 0
        return dx, dg
    if not (want_dx or want_dg):
        return dx, dg
    if not (pa and g.flags.aligned):
        g = kernel_ready(g)
    if not (pa and x.flags.aligned):
        x = kernel_ready(x)
    if not (pa and q.flags.aligned):
        q = kernel_ready(q)
    runner = res.brunner
    if runner is None:
        runner = _bind_backward_runner(res, x.dtype, want_dx, want_dg)
    # (the kernels copy an input channels-last only when its channel stride is not 1)
    strided = x.strides[4 if res.pb.channels_last else 1] != x.itemsize
    if res.acc_on_demand and strided:
        runner = _grow_acc(res, x.dtype, want_dg)
    if res.xcl.size == 1 and strided:
        if (res.cl and dx_k is not None and res.mode == MODES["bilinear"]
                and not _items_dense(dx_k)):
            # the channels-last input copy cannot live in this input_grad: a buffer for it
            _grow_xcl(res, runner, math.prod(res.dx_acc.shape[-4:]))
        elif res.copy_on_demand:
            _grow_xcl(res, runner, res.copy_size)
    # the runner takes the arrays in the caller's layout and storage type (no views to make)
    runner.run(g, x, q, dx_k, dg_k, res.split)
    if dx is not None and dx_k is not dx:
        dx[...] = dx_k
    if dg is not None and dg_k is not dg:
        dg[...] = dg_k
    return dx, dg


def show_config() -> None:
    """Print the gs3d version, whether OpenMP is compiled in, and the default thread count."""
    from . import __version__
    print(f"gs3d {__version__}")
    print(f"  numpy:            {np.__version__}")
    print(f"  OpenMP:           {'yes' if _kernels.openmp_enabled() else 'no (serial kernels)'}")
    print(f"  default threads:  {_kernels.max_threads()}")
    simd = {"avx512": "AVX-512 (F, VL, DQ, BW) + AVX2 + FMA + F16C (runtime dispatch)",
            "avx2": "AVX2 + FMA + F16C (runtime dispatch)",
            "baseline": "compiler baseline (x86-64: SSE2)"}[SIMD_LEVEL]
    print(f"  SIMD:             {simd}")


# --------------------------------------------------------------------------------------------
# plans: the two-phase API (validate and size once, then run with cheap checks)
# --------------------------------------------------------------------------------------------

def _shape_only(shape: Any, dtype: np.dtype, name: str) -> np.ndarray:
    """A zero-stride array of ``shape`` (no memory), so plans reuse the full validation."""
    if not isinstance(shape, (tuple, list)) or not all(
            isinstance(n, (int, np.integer)) and not isinstance(n, (bool, np.bool_)) and n >= 0
            for n in shape):
        raise GridSamplerError(f"{name} must be a tuple of non-negative integers; got {shape!r}")
    return np.lib.stride_tricks.as_strided(np.zeros(1, dtype=dtype), shape=tuple(int(n) for n in shape),
                                           strides=(0,) * len(shape), writeable=False)


def _plan_dtype(dtype: Any) -> np.dtype:
    try:
        return np.dtype(dtype)
    except TypeError:
        raise GridSamplerError(f"dtype must be a numpy dtype; got {dtype!r}") from None


def _run_input(arr: Any, name: str, shape: tuple, dtype: np.dtype) -> np.ndarray:
    """The per-call check of a plan: the array matches the planned shape and dtype."""
    arr = as_input_array(arr, name)
    if arr.shape != shape or arr.dtype != dtype:
        raise GridSamplerError(f"{name} must have the planned shape {shape} and dtype {dtype}; "
                               f"got {arr.shape} {arr.dtype}")
    return arr


# np.may_share_memory without the __array_function__ dispatch (only ndarrays reach it here)
_may_share = getattr(np.may_share_memory, "_implementation", np.may_share_memory)


def _run_output(out: Any, name: str, shape: tuple, dtype: np.dtype, inputs: tuple,
                others: tuple = ()) -> np.ndarray:
    """Cheap checks of a given output; the exact (slower) checks of ``check_output`` run only
    when the quick tests cannot clear the buffer (so the errors are the same).  Two arrays that
    each own their memory cannot overlap; other pairs go through ``np.may_share_memory``."""
    if (out.__class__ is np.ndarray and out.shape == shape
            and (out.dtype is dtype or out.dtype == dtype)):
        flags = out.flags
        if flags.writeable and (flags.c_contiguous or flags.f_contiguous):
            owner = flags.owndata and out.base is None
            for _, a in inputs + others if others else inputs:
                if a is None or (owner and a is not out and a.base is None
                                 and a.flags.owndata):
                    continue
                if _may_share(out, a):
                    break
            else:
                return out
    return check_output(out, name, shape, dtype, inputs, others)


def _owned_output(out: Any, shape: tuple, dtype: np.dtype) -> bool:
    """True when ``out`` is certainly a valid output apart from overlap with other arrays: an
    ndarray of ``shape`` and ``dtype``, writeable, contiguous (so no self-overlap) and owning
    its memory (so it overlaps no other array that owns its own)."""
    if (out.__class__ is np.ndarray and out.base is None and out.shape == shape
            and (out.dtype is dtype or out.dtype == dtype)):
        f = out.flags
        return f.owndata and f.writeable and (f.c_contiguous or f.f_contiguous)
    return False


def _check_out(out: Any, shape: tuple, dtype: np.dtype, x: np.ndarray,
               q: np.ndarray) -> np.ndarray:
    """The forward's ``out`` checks of a validated signature: the quick ownership test when
    every array owns its memory, else ``_run_output`` (same errors as ``check_output``)."""
    if (out is not x and out is not q and x.base is None and q.base is None
            and _owned_output(out, shape, dtype) and x.flags.owndata and q.flags.owndata):
        return out
    return _run_output(out, "out", shape, dtype, (("input", x), ("grid", q)))


def _check_outs(input_grad: Any, grid_grad: Any, want_dx: bool, want_dg: bool, g: np.ndarray,
                x: np.ndarray, q: np.ndarray) -> Tuple[Any, Any]:
    """The backward's buffer checks of a validated signature (in check_output's order): quick
    when every array owns its memory, else ``_run_output``."""
    owned = (g.base is None and x.base is None and q.base is None and g.flags.owndata
             and x.flags.owndata and q.flags.owndata)
    inputs = (("grad_output", g), ("input", x), ("grid", q))
    dx_owned = False
    if want_dx and input_grad is not None:
        if (owned and input_grad is not g and input_grad is not x and input_grad is not q
                and _owned_output(input_grad, x.shape, x.dtype)):
            dx_owned = True
        else:
            input_grad = _run_output(input_grad, "input_grad", x.shape, x.dtype, inputs)
    if want_dg and grid_grad is not None:
        dx = input_grad if want_dx else None
        if not (owned and grid_grad is not g and grid_grad is not x and grid_grad is not q
                and (dx is None or dx_owned and grid_grad is not dx)
                and _owned_output(grid_grad, q.shape, q.dtype)):
            grid_grad = _run_output(grid_grad, "grid_grad", q.shape, q.dtype, inputs,
                                    (("input_grad", dx),))
    return input_grad, grid_grad


# the selected module's runner class (a variable, so a base class mypy cannot resolve)
_ForwardRunner: Any = _kernels.ForwardRunner


def _workspace_size(plan: Any) -> int:
    """Bytes of scratch memory the plan owns and reuses on every call.  A channels-last plan
    adds the channels-last copy of an input batch item (or one per thread) the first time an
    input arrives with strided channels, when its forward or grid gradient takes that copy."""
    return plan._res.nbytes


class ForwardPlan(_ForwardRunner):
    """A validated forward for fixed shapes, dtype and options, owning its scratch memory.

    Made by :func:`plan_forward`; call it as ``plan(input, grid, out=None)``. The call itself
    is ``_kernels.ForwardRunner.__call__``: arrays that pass its C checks (see there) run at
    once, anything else goes through ``_slow_call``, the full checks.  Calls on one plan from
    several Python threads are serialised (the scratch is shared); make one plan per thread to
    run them in parallel.
    """

    def __init__(self, input_shape, grid_shape, dtype, *, mode="bilinear",
                 padding_mode="zeros", align_corners=False, layout="NCDHW", num_threads=None):
        dt = _plan_dtype(dtype)
        x = _shape_only(input_shape, dt, "input_shape")
        q = _shape_only(grid_shape, dt, "grid_shape")
        pb = check_problem(x, q, None, mode, padding_mode, align_corners, layout)
        self.dtype = x.dtype
        self.input_shape, self.grid_shape = x.shape, q.shape
        self.output_shape = volume_shape(pb.N, pb.C, pb.out_spatial, pb.channels_last)
        nt = _threads(num_threads, pb.N * math.prod(pb.out_spatial) * max(pb.C, 1))
        self._res = _Resources(pb, nt, False)
        _bind_runner(self, self._res, self.dtype, self.output_shape)

    @property
    def workspace_size(self) -> int:
        return _workspace_size(self)

    def _slow_call(self, input, grid, out) -> np.ndarray:
        """The call for arrays the C checks did not clear: the full checks (the same errors as
        ever), then ``_forward`` (which runs the kernel through this plan, under its lock)."""
        x, q, dt = input, grid, self.dtype
        if not (x.__class__ is np.ndarray and x.shape == self.input_shape
                and (x.dtype is dt or x.dtype == dt)):
            x = _run_input(x, "input", self.input_shape, dt)
        if not (q.__class__ is np.ndarray and q.shape == self.grid_shape
                and (q.dtype is dt or q.dtype == dt)):
            q = _run_input(q, "grid", self.grid_shape, dt)
        if out is not None:
            out = _check_out(out, self.output_shape, dt, x, q)
        return _forward(self._res, x, q, out, self.output_shape)


class BackwardPlan:
    """A validated backward for fixed shapes, dtype and options, owning its scratch memory.

    Made by :func:`plan_backward`; call it as
    ``plan(grad_output, input, grid, input_grad=None, grid_grad=None)``. Calls on one plan from
    several Python threads are serialised (the scratch is shared); make one plan per thread to
    run them in parallel.
    """

    def __init__(self, grad_output_shape, input_shape, grid_shape, dtype, *, mode="bilinear",
                 padding_mode="zeros", align_corners=False, output_mask=(True, True),
                 layout="NCDHW", deterministic=None, num_threads=None):
        dt = _plan_dtype(dtype)
        g = _shape_only(grad_output_shape, dt, "grad_output_shape")
        x = _shape_only(input_shape, dt, "input_shape")
        q = _shape_only(grid_shape, dt, "grid_shape")
        pb = check_problem(x, q, g, mode, padding_mode, align_corners, layout)
        self.want_dx, self.want_dg = parse_output_mask(output_mask)
        parse_deterministic(deterministic)
        self.dtype = x.dtype
        self.grad_output_shape, self.input_shape, self.grid_shape = g.shape, x.shape, q.shape
        nt = _threads(num_threads, pb.N * math.prod(pb.out_spatial) * max(pb.C, 1))
        self._res = _Resources(pb, nt, self.want_dx, True)
        self._lock = threading.Lock()

    @property
    def workspace_size(self) -> int:
        return _workspace_size(self)

    def __call__(self, grad_output, input, grid, *, input_grad=None, grid_grad=None):
        g, x, q, dt = grad_output, input, grid, self.dtype
        if not (g.__class__ is np.ndarray and g.shape == self.grad_output_shape
                and (g.dtype is dt or g.dtype == dt)):
            g = _run_input(g, "grad_output", self.grad_output_shape, dt)
        if not (x.__class__ is np.ndarray and x.shape == self.input_shape
                and (x.dtype is dt or x.dtype == dt)):
            x = _run_input(x, "input", self.input_shape, dt)
        if not (q.__class__ is np.ndarray and q.shape == self.grid_shape
                and (q.dtype is dt or q.dtype == dt)):
            q = _run_input(q, "grid", self.grid_shape, dt)
        if input_grad is not None or grid_grad is not None:
            input_grad, grid_grad = _check_outs(input_grad, grid_grad, self.want_dx,
                                                self.want_dg, g, x, q)
        lock = self._lock
        lock.acquire()      # cheaper than a with statement at this size
        try:
            return _backward(self._res, g, x, q, self.want_dx, self.want_dg, input_grad,
                             grid_grad)
        finally:
            lock.release()


def plan_forward(input_shape, grid_shape, dtype, **options) -> ForwardPlan:
    """Validate a forward once for fixed shapes, dtype and options (the first phase of the
    CANN two-phase API); the returned plan runs it with only cheap per-call checks and, when
    ``out`` is given, without allocating.  Options as in :func:`grid_sample_3d`."""
    return ForwardPlan(input_shape, grid_shape, dtype, **options)


def plan_backward(grad_output_shape, input_shape, grid_shape, dtype, **options) -> BackwardPlan:
    """Validate a backward once (the ``aclnnGridSampler3DBackwardGetWorkspaceSize`` phase);
    ``.workspace_size`` is the scratch it owns. Options as in
    :func:`grid_sample_3d_backward`."""
    return BackwardPlan(grad_output_shape, input_shape, grid_shape, dtype, **options)
