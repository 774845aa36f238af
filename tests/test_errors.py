"""Invalid calls of gs3d.grid_sample_3d / grid_sample_3d_backward (SPEC "Errors").

Every rejected call must raise gs3d.GridSamplerError (a ValueError) with the CANN code
(161001 for a None tensor, 161002 otherwise), a message naming the argument, and must leave
every output buffer byte-for-byte unchanged.
"""
import numpy as np
import pytest

import ml_dtypes
try:  # torch tensors are one kind of array-like input; the tests that use them skip without it
    import torch
except ImportError:
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")

import gs3d
from gs3d import GridSamplerError

NULL, INVALID = 161001, 161002
BF16 = np.dtype(ml_dtypes.bfloat16)
LAYOUTS = ("NCDHW", "NDHWC")
OPS = ("fwd", "bwd")
SENTINEL = 7.0

# regexes that name an argument and not a longer name containing it
# (r"\binput\b" does not match "input_grad", r"\bmode\b" does not match "padding_mode")
NAME = {
    "input": r"\binput\b",
    "grid": r"\bgrid\b",
    "grad_output": r"\bgrad_output\b",
    "out": r"\bout\b",
    "input_grad": r"\binput_grad\b",
    "grid_grad": r"\bgrid_grad\b",
    "mode": r"\bmode\b",
    "padding_mode": r"\bpadding_mode\b",
    "layout": r"\blayout\b",
    "align_corners": r"\balign_corners\b",
    "output_mask": r"\boutput_mask\b",
    "num_threads": r"\bnum_threads\b",
    "deterministic": r"\bdeterministic\b",
}


# ----------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------

def vol(layout, N, C, D, H, W):
    return (N, C, D, H, W) if layout == "NCDHW" else (N, D, H, W, C)


def make(dtype=np.float64, layout="NCDHW", N=2, C=3, D=4, H=5, W=6, Do=2, Ho=3, Wo=4, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(vol(layout, N, C, D, H, W)).astype(dtype)
    q = rng.uniform(-1.1, 1.1, (N, Do, Ho, Wo, 3)).astype(dtype)
    go = rng.standard_normal(vol(layout, N, C, Do, Ho, Wo)).astype(dtype)
    return x, q, go


def buffers(op, x, q, go, dtype=np.float64):
    """Valid output buffers for the (valid) problem x, q, go, filled with the sentinel."""
    if op == "fwd":
        return {"out": np.full(go.shape, SENTINEL, dtype=dtype)}
    return {"input_grad": np.full(x.shape, SENTINEL, dtype=dtype),
            "grid_grad": np.full(q.shape, SENTINEL, dtype=dtype)}


def run(op, x, q, go, **kw):
    if op == "fwd":
        return gs3d.grid_sample_3d(x, q, **kw)
    return gs3d.grid_sample_3d_backward(go, x, q, **kw)


def _owner(a):
    while isinstance(a, np.ndarray) and isinstance(a.base, np.ndarray):
        a = a.base
    return a


def snapshot(arrays):
    """Bytes of every ndarray given and of the arrays owning their memory."""
    snap = []
    for a in arrays:
        if isinstance(a, np.ndarray):
            for b in {id(a): a, id(_owner(a)): _owner(a)}.values():
                snap.append((b, b.tobytes()))
    return snap


def assert_unchanged(snap):
    for arr, before in snap:
        assert arr.tobytes() == before, "a rejected call wrote to a buffer"


def expect_error(op, x, q, go, code, name, bufs=None, **kw):
    """Call op; require GridSamplerError(code) naming `name`; buffers and inputs unchanged."""
    bufs = bufs or {}
    snap = snapshot(list(bufs.values()) + [x, q, go])
    with pytest.raises(GridSamplerError, match=NAME.get(name, name)) as ei:
        run(op, x, q, go, **kw, **bufs)
    assert isinstance(ei.value, ValueError)
    assert ei.value.code == code, (ei.value.code, str(ei.value))
    assert_unchanged(snap)
    return ei.value


def test_error_class():
    assert issubclass(GridSamplerError, ValueError)
    assert gs3d.GridSamplerError is GridSamplerError


# ----------------------------------------------------------------------------------------------
# invalid tensors
# ----------------------------------------------------------------------------------------------

def _set_C(a, layout, C):
    """a with its channel axis resized to C (repeating / cutting)."""
    ax = 1 if layout == "NCDHW" else 4
    idx = np.arange(C) % a.shape[ax]
    return np.take(a, idx, axis=ax)


TENSOR_CASES = {
    # name: (mutate(x, q, go, layout) -> (x, q, go), code, argument named, ops)
    "input_none": (lambda x, q, go, L: (None, q, go), NULL, "input", OPS),
    "grid_none": (lambda x, q, go, L: (x, None, go), NULL, "grid", OPS),
    "grad_output_none": (lambda x, q, go, L: (x, q, None), NULL, "grad_output", ("bwd",)),
    "input_4d": (lambda x, q, go, L: (x[0], q, go), INVALID, "input", OPS),
    "input_6d": (lambda x, q, go, L: (x[None], q, go), INVALID, "input", OPS),
    "input_0d": (lambda x, q, go, L: (np.array(1.0), q, go), INVALID, "input", OPS),
    "input_np_scalar": (lambda x, q, go, L: (np.float64(1.0), q, go), INVALID, "input", OPS),
    "grid_4d": (lambda x, q, go, L: (x, q[0], go), INVALID, "grid", OPS),
    "grid_6d": (lambda x, q, go, L: (x, q[..., None], go), INVALID, "grid", OPS),
    "grad_output_4d": (lambda x, q, go, L: (x, q, go[0]), INVALID, "grad_output", ("bwd",)),
    "grad_output_6d": (lambda x, q, go, L: (x, q, go[None]), INVALID, "grad_output", ("bwd",)),
    "grid_N": (lambda x, q, go, L: (x, q[:1], go), INVALID, "grid", OPS),
    "grid_N_bigger": (lambda x, q, go, L: (x, np.concatenate([q, q]), go), INVALID, "grid",
                      OPS),
    "grad_output_N": (lambda x, q, go, L: (x, q, go[:1]), INVALID, "grad_output", ("bwd",)),
    "grad_output_C": (lambda x, q, go, L: (x, q, _set_C(go, L, 2)), INVALID, "grad_output",
                      ("bwd",)),
    "grad_output_C_more": (lambda x, q, go, L: (x, q, _set_C(go, L, 4)), INVALID,
                           "grad_output", ("bwd",)),
    "grad_output_Wo": (lambda x, q, go, L: (x, q[:, :, :, :-1], go), INVALID, "grad_output",
                       ("bwd",)),
    "grad_output_Do": (lambda x, q, go, L: (x, q[:, :1], go), INVALID, "grad_output",
                       ("bwd",)),
    "grid_last_2": (lambda x, q, go, L: (x, q[..., :2], go), INVALID, "grid", OPS),
    "grid_last_4": (lambda x, q, go, L: (x, np.concatenate([q, q[..., :1]], -1), go),
                    INVALID, "grid", OPS),
    "grid_last_1": (lambda x, q, go, L: (x, q[..., :1], go), INVALID, "grid", OPS),
    "input_D0": (lambda x, q, go, L: (x[:, :, :0] if L == "NCDHW" else x[:, :0], q, go),
                 INVALID, "input", OPS),
    "input_H0": (lambda x, q, go, L: (x[:, :, :, :0] if L == "NCDHW" else x[:, :, :0], q, go),
                 INVALID, "input", OPS),
    "input_W0": (lambda x, q, go, L: (x[..., :0] if L == "NCDHW" else x[:, :, :, :0], q, go),
                 INVALID, "input", OPS),
    # mixed dtypes
    "grid_f32": (lambda x, q, go, L: (x, q.astype(np.float32), go), INVALID, "grid", OPS),
    "input_f32": (lambda x, q, go, L: (x.astype(np.float32), q, go), INVALID, "input", OPS),
    "grad_output_f32": (lambda x, q, go, L: (x, q, go.astype(np.float32)), INVALID,
                        "grad_output", ("bwd",)),
    "grid_f16_input_bf16": (lambda x, q, go, L: (x.astype(BF16), q.astype(np.float16),
                                                 go.astype(BF16)), INVALID, "grid", OPS),
    "grad_output_bf16_input_f16": (lambda x, q, go, L: (x.astype(np.float16),
                                                        q.astype(np.float16),
                                                        go.astype(BF16)),
                                   INVALID, "grad_output", ("bwd",)),
    # not arrays
    "input_list": (lambda x, q, go, L: (x.tolist(), q, go), INVALID, "input", OPS),
    "input_tuple": (lambda x, q, go, L: (tuple(x.tolist()), q, go), INVALID, "input", OPS),
    "input_float": (lambda x, q, go, L: (1.0, q, go), INVALID, "input", OPS),
    "input_int": (lambda x, q, go, L: (3, q, go), INVALID, "input", OPS),
    "input_str": (lambda x, q, go, L: ("abc", q, go), INVALID, "input", OPS),
    "grid_list": (lambda x, q, go, L: (x, q.tolist(), go), INVALID, "grid", OPS),
    "grid_float": (lambda x, q, go, L: (x, 0.5, go), INVALID, "grid", OPS),
    "grad_output_list": (lambda x, q, go, L: (x, q, go.tolist()), INVALID, "grad_output",
                         ("bwd",)),
    "grad_output_float": (lambda x, q, go, L: (x, q, 1.0), INVALID, "grad_output", ("bwd",)),
}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("case,op", [(c, op) for c in sorted(TENSOR_CASES)
                                     for op in TENSOR_CASES[c][3]])
def test_invalid_tensor(case, op, layout):
    mutate, code, name, ops = TENSOR_CASES[case]
    x, q, go = make(layout=layout)
    bufs = buffers(op, x, q, go)
    x2, q2, go2 = mutate(x, q, go, layout)
    expect_error(op, x2, q2, go2, code, name, bufs, layout=layout)
    # also without buffers
    expect_error(op, x2, q2, go2, code, name, layout=layout)


def test_none_tensors_both_none():
    x, q, go = make()
    e = expect_error("bwd", None, None, None, NULL, "grad_output|input|grid",
                     buffers("bwd", x, q, go))
    assert e.code == NULL


def _unsupported_dtypes():
    dts = [np.int32, np.int64, np.uint16, np.int16, np.bool_, np.complex64, np.complex128,
           np.object_, np.dtype(">f4"), np.dtype(">f8"), np.dtype(">f2"), np.dtype("<U3"),
           np.dtype("S4"), np.dtype(ml_dtypes.float8_e4m3fn)]
    if np.dtype(np.longdouble).itemsize > 8:
        dts.append(np.longdouble)
    return [np.dtype(d) for d in dts]


@pytest.mark.parametrize("which,op", [(w, op) for w in ["all", "input", "grid", "grad_output"]
                                      for op in OPS if not (op == "fwd" and w == "grad_output")])
@pytest.mark.parametrize("dtype", _unsupported_dtypes(), ids=str)
def test_unsupported_dtype(dtype, which, op):
    x, q, go = make(layout="NCDHW")
    bufs = buffers(op, x, q, go)
    conv = lambda a: a.astype(dtype)  # noqa: E731
    if which == "all":
        x2, q2, go2, name = conv(x), conv(q), conv(go), "input"
    elif which == "input":
        x2, q2, go2, name = conv(x), q, go, "input"
    elif which == "grid":
        x2, q2, go2, name = x, conv(q), go, "grid"
    else:
        x2, q2, go2, name = x, q, conv(go), "grad_output"
    assert x2.dtype == dtype or q2.dtype == dtype or go2.dtype == dtype
    expect_error(op, x2, q2, go2, INVALID, name, bufs)
    if which == "all":
        # with buffers of the same (unsupported) dtype too
        bufs2 = {k: np.full(v.shape, 7, dtype=dtype) if dtype.kind not in "US"
                 else np.full(v.shape, "7", dtype=dtype) for k, v in bufs.items()}
        expect_error(op, x2, q2, go2, INVALID, name, bufs2)


# ----------------------------------------------------------------------------------------------
# invalid options
# ----------------------------------------------------------------------------------------------

BAD_CODES = [-1, 3, 2 ** 70, -(2 ** 70), True, False, 0.0, 1.0, None, "", "linear",
             "Bilinear", "ZEROS", "bicubic", b"zeros", np.int64(7), np.float64(0.0), [0],
             np.bool_(True)]

OPTION_CASES = []
for v in BAD_CODES + [2]:          # 2 is a valid padding code but not a valid mode
    OPTION_CASES.append(("mode", v, OPS))
for v in BAD_CODES + ["bilinear", "nearest"]:
    OPTION_CASES.append(("padding_mode", v, OPS))
for v in ["ncdhw", "NHWC", "NCHW", "NDHWC ", "", 0, 1, True, None, b"NCDHW", 2 ** 70, 0.0]:
    OPTION_CASES.append(("layout", v, OPS))
for v in [1, 0, None, "True", "False", 1.0, 0.0, 2 ** 70, [True]]:
    OPTION_CASES.append(("align_corners", v, OPS))
for v in [0, -1, 1.5, 1.0, True, False, "2", np.int64(0), -(2 ** 70), np.float64(2.0), [2]]:
    OPTION_CASES.append(("num_threads", v, OPS))
for v in [(True,), (True, True, True), [], (), "TT", "ab", b"\x01\x01", None, True, 5, 0.0,
          (1, 0), (1, 1), (None, True), (True, None), ("True", "False"), (1.0, 0.0),
          {"a": True, "b": True}, {0: True, 1: True, 2: False}, {True, False},
          iter((True, True))]:
    OPTION_CASES.append(("output_mask", v, ("bwd",)))
for v in [1, 0, "yes", "True", 1.0, 0.0, [True], 2 ** 70]:
    OPTION_CASES.append(("deterministic", v, ("bwd",)))


@pytest.mark.parametrize("option,value,op", [(o, v, op) for o, v, ops in OPTION_CASES for op in ops],
                         ids=[f"{op}:{o}={v!r}"[:48] for o, v, ops in OPTION_CASES for op in ops])
def test_invalid_option(option, value, op):
    x, q, go = make()
    bufs = buffers(op, x, q, go)
    expect_error(op, x, q, go, INVALID, option, bufs, **{option: value})
    expect_error(op, x, q, go, INVALID, option, **{option: value})


@pytest.mark.parametrize("op", OPS)
def test_valid_option_spellings_accepted(op):
    """Integer codes, numpy scalars and numpy bools are accepted and give identical results."""
    x, q, go = make()
    ref = run(op, x, q, go, mode="nearest", padding_mode="reflection", align_corners=True)
    variants = [
        dict(mode=1, padding_mode=2, align_corners=True),
        dict(mode=np.int64(1), padding_mode=np.int32(2), align_corners=np.True_),
        dict(mode="nearest", padding_mode="reflection", align_corners=True, num_threads=1),
        dict(mode="nearest", padding_mode="reflection", align_corners=True,
             num_threads=np.int64(2)),
        dict(mode="nearest", padding_mode="reflection", align_corners=True, layout="NCDHW"),
    ]
    if op == "bwd":
        variants += [
            dict(mode=1, padding_mode=2, align_corners=True, output_mask=[True, True]),
            dict(mode=1, padding_mode=2, align_corners=True,
                 output_mask=np.array([True, True])),
            dict(mode=1, padding_mode=2, align_corners=True, output_mask=(np.True_, np.True_)),
            dict(mode=1, padding_mode=2, align_corners=True, deterministic=True),
            dict(mode=1, padding_mode=2, align_corners=True, deterministic=np.False_),
        ]
    for kw in variants:
        got = run(op, x, q, go, **kw)
        if op == "fwd":
            assert np.array_equal(got, ref), kw
        else:
            assert np.array_equal(got[0], ref[0]) and np.array_equal(got[1], ref[1]), kw


# ----------------------------------------------------------------------------------------------
# output buffers
# ----------------------------------------------------------------------------------------------

def _readonly(a):
    a = a.copy()
    a.flags.writeable = False
    return a


def _zero_stride_writeable(a):
    base = np.full(a.shape[1:], SENTINEL, dtype=a.dtype)
    return np.lib.stride_tricks.as_strided(base, a.shape, (0,) + base.strides, writeable=True)


def _self_overlap_writeable(a):
    """Writeable view whose elements overlap: the last two axes share one stride."""
    base = np.full(a.size, SENTINEL, dtype=a.dtype)
    st = list(np.empty(a.shape, a.dtype).strides)
    st[-2] = st[-1]
    return np.lib.stride_tricks.as_strided(base, a.shape, st, writeable=True)


def _other_layout_shape(a, layout):
    s = a.shape
    return (s[0], s[4], s[1], s[2], s[3]) if layout == "NDHWC" else (s[0], s[2], s[3], s[4], s[1])


BUFFER_CASES = {
    # name: make(valid_buffer, layout) -> bad buffer
    "readonly": lambda b, L: _readonly(b),
    "broadcast_to": lambda b, L: np.broadcast_to(np.full(b.shape[1:], SENTINEL, b.dtype),
                                                 b.shape),
    "zero_stride_writeable": lambda b, L: _zero_stride_writeable(b),
    "self_overlap_writeable": lambda b, L: _self_overlap_writeable(b),
    "shape_extra_axis": lambda b, L: np.full(b.shape + (1,), SENTINEL, b.dtype),
    "shape_4d": lambda b, L: np.full(b.shape[1:], SENTINEL, b.dtype),
    "shape_bigger": lambda b, L: np.full((b.shape[0] + 1,) + b.shape[1:], SENTINEL, b.dtype),
    "shape_smaller": lambda b, L: np.full(b.shape[:-1] + (b.shape[-1] - 1,), SENTINEL,
                                          b.dtype),
    "dtype_f32": lambda b, L: np.full(b.shape, SENTINEL, np.float32),
    "dtype_f16": lambda b, L: np.full(b.shape, SENTINEL, np.float16),
    "dtype_bf16": lambda b, L: np.full(b.shape, SENTINEL, BF16),
    "dtype_int64": lambda b, L: np.full(b.shape, 7, np.int64),
    "dtype_big_endian": lambda b, L: np.full(b.shape, SENTINEL, np.dtype(">f8")),
    "list": lambda b, L: b.tolist(),
    "scalar": lambda b, L: 7.0,
}
if torch is not None:
    BUFFER_CASES["torch_tensor"] = lambda b, L: torch.from_numpy(b.copy())


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("target", ["out", "input_grad", "grid_grad"])
@pytest.mark.parametrize("case", sorted(BUFFER_CASES))
def test_invalid_output_buffer(case, target, layout):
    op = "fwd" if target == "out" else "bwd"
    x, q, go = make(layout=layout)
    bufs = buffers(op, x, q, go)
    bad = BUFFER_CASES[case](bufs[target], layout)
    bufs[target] = bad
    if case == "torch_tensor":
        before = bad.clone()
        with pytest.raises(GridSamplerError, match=NAME[target]) as ei:
            run(op, x, q, go, layout=layout, **bufs)
        assert ei.value.code == INVALID
        assert torch.equal(bad, before)
        return
    expect_error(op, x, q, go, INVALID, target, bufs, layout=layout)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("target", ["out", "input_grad"])
def test_output_buffer_wrong_layout(target, layout):
    """A buffer of the other layout's shape (same data count) is rejected."""
    op = "fwd" if target == "out" else "bwd"
    x, q, go = make(layout=layout)
    bufs = buffers(op, x, q, go)
    shape = _other_layout_shape(bufs[target], layout)
    assert shape != bufs[target].shape
    good_shape = bufs[target].shape
    bufs[target] = np.full(shape, SENTINEL)
    expect_error(op, x, q, go, INVALID, target, bufs, layout=layout)
    # the other layout's shape as a transposed view of a right-shaped array
    perm = (0, 4, 1, 2, 3) if layout == "NDHWC" else (0, 2, 3, 4, 1)
    bufs[target] = np.full(good_shape, SENTINEL).transpose(perm)
    assert bufs[target].shape == shape
    expect_error(op, x, q, go, INVALID, target, bufs, layout=layout)


def test_output_buffer_wrong_dtype_half_kinds():
    """float16 buffer for a bfloat16 problem and vice versa."""
    for dt, other in ((BF16, np.float16), (np.float16, BF16)):
        x, q, go = make(dtype=dt)
        for op, target in (("fwd", "out"), ("bwd", "input_grad"), ("bwd", "grid_grad")):
            bufs = buffers(op, x, q, go, dtype=dt)
            bufs[target] = np.full(bufs[target].shape, SENTINEL, other)
            expect_error(op, x, q, go, INVALID, target, bufs)


def test_output_buffer_wrong_dtype_f32_problem():
    x, q, go = make(dtype=np.float32)
    for op, target in (("fwd", "out"), ("bwd", "input_grad"), ("bwd", "grid_grad")):
        bufs = buffers(op, x, q, go, dtype=np.float32)
        bufs[target] = np.full(bufs[target].shape, SENTINEL, np.float64)
        expect_error(op, x, q, go, INVALID, target, bufs)


# ---- overlaps --------------------------------------------------------------------------------

def _same_shape_problem(layout="NCDHW", C=3):
    """A problem where input.shape == grad_output.shape (D,H,W == Do,Ho,Wo)."""
    return make(layout=layout, C=C, D=2, H=3, W=4, Do=2, Ho=3, Wo=4)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_out_overlaps_input(layout):
    x, q, go = _same_shape_problem(layout)
    assert go.shape == x.shape
    kw = dict(layout=layout)
    expect_error("fwd", x, q, go, INVALID, "out", {"out": x}, **kw)
    expect_error("fwd", x, q, go, INVALID, "out", {"out": x[:]}, **kw)
    # a view of input with reversed axis: still the same memory
    xr = np.ascontiguousarray(x[..., ::-1])
    expect_error("fwd", xr[..., ::-1], q, go, INVALID, "out", {"out": xr}, **kw)
    # partial overlap through a shared base
    base = np.full(2 * x.size, SENTINEL)
    xv = base[: x.size].reshape(x.shape)
    xv[...] = x
    ov = base[x.size // 2: x.size // 2 + x.size].reshape(x.shape)
    expect_error("fwd", xv, q, go, INVALID, "out", {"out": ov}, **kw)


def test_out_overlaps_grid():
    # NDHWC with C == 3: the output has the grid's shape
    x, q, go = make(layout="NDHWC", C=3)
    assert go.shape == q.shape
    expect_error("fwd", x, q, go, INVALID, "out", {"out": q}, layout="NDHWC")
    expect_error("fwd", x, q, go, INVALID, "out", {"out": q[::1]}, layout="NDHWC")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_input_grad_overlaps_input(layout):
    x, q, go = make(layout=layout)
    gg = np.full(q.shape, SENTINEL)
    for ig in (x, x[:], x.view(), x.reshape(x.shape)):
        expect_error("bwd", x, q, go, INVALID, "input_grad",
                     {"input_grad": ig, "grid_grad": gg}, layout=layout)
    # partial overlap: input is the first half of a buffer, input_grad starts in its middle
    base = np.full(2 * x.size, SENTINEL)
    xv = base[: x.size].reshape(x.shape)
    xv[...] = x
    ig = base[x.size - 1: 2 * x.size - 1].reshape(x.shape)   # one shared element
    expect_error("bwd", xv, q, go, INVALID, "input_grad",
                 {"input_grad": ig, "grid_grad": gg}, layout=layout)
    # output_mask=(True, False) still checks input_grad
    expect_error("bwd", x, q, go, INVALID, "input_grad", {"input_grad": x},
                 layout=layout, output_mask=(True, False))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_input_grad_overlaps_grad_output(layout):
    x, q, go = _same_shape_problem(layout)
    expect_error("bwd", x, q, go, INVALID, "input_grad",
                 {"input_grad": go, "grid_grad": np.full(q.shape, SENTINEL)}, layout=layout)


def test_input_grad_overlaps_grid():
    base = np.full(1000, SENTINEL)
    x, q, go = make()
    qv = base[: q.size].reshape(q.shape)
    qv[...] = q
    ig = base[q.size - 3: q.size - 3 + x.size].reshape(x.shape)
    expect_error("bwd", x, qv, go, INVALID, "input_grad",
                 {"input_grad": ig, "grid_grad": np.full(q.shape, SENTINEL)})


def test_grid_grad_overlaps_inputs():
    x, q, go = make(layout="NDHWC", C=3)
    ig = np.full(x.shape, SENTINEL)
    expect_error("bwd", x, q, go, INVALID, "grid_grad", {"input_grad": ig, "grid_grad": q},
                 layout="NDHWC")
    expect_error("bwd", x, q, go, INVALID, "grid_grad", {"input_grad": ig, "grid_grad": q[:]},
                 layout="NDHWC")
    assert go.shape == q.shape
    expect_error("bwd", x, q, go, INVALID, "grid_grad", {"input_grad": ig, "grid_grad": go},
                 layout="NDHWC")
    # grid_grad overlaps input
    base = np.full(x.size + q.size, SENTINEL)
    xv = base[: x.size].reshape(x.shape)
    xv[...] = x
    gg = base[x.size - 2: x.size - 2 + q.size].reshape(q.shape)
    expect_error("bwd", xv, q, go, INVALID, "grid_grad", {"input_grad": ig, "grid_grad": gg},
                 layout="NDHWC")
    # output_mask=(False, True) still checks grid_grad
    expect_error("bwd", x, q, go, INVALID, "grid_grad", {"grid_grad": q},
                 layout="NDHWC", output_mask=(False, True))


def test_outputs_overlap_each_other():
    x, q, go = make()
    base = np.full(x.size + q.size, SENTINEL)
    ig = base[: x.size].reshape(x.shape)
    gg = base[x.size - 1: x.size - 1 + q.size].reshape(q.shape)
    expect_error("bwd", x, q, go, INVALID, "grid_grad|input_grad",
                 {"input_grad": ig, "grid_grad": gg})
    # identical memory: NDHWC, C == 3, input spatial == output spatial
    x, q, go = make(layout="NDHWC", C=3, D=2, H=3, W=4, Do=2, Ho=3, Wo=4)
    assert x.shape == q.shape
    buf = np.full(x.shape, SENTINEL)
    expect_error("bwd", x, q, go, INVALID, "grid_grad|input_grad",
                 {"input_grad": buf, "grid_grad": buf}, layout="NDHWC")
    expect_error("bwd", x, q, go, INVALID, "grid_grad|input_grad",
                 {"input_grad": buf, "grid_grad": buf[:]}, layout="NDHWC")


def test_interleaved_non_overlapping_buffers_accepted():
    """Buffers that interleave with an input (may_share_memory but no shared element) are
    valid and give the same result."""
    x, q, go = make()
    big = np.zeros(x.shape + (2,))
    big[..., 0] = x
    xv, ig = big[..., 0], big[..., 1]
    ig[...] = SENTINEL
    ref = gs3d.grid_sample_3d_backward(go, x, q)
    dx, dg = gs3d.grid_sample_3d_backward(go, xv, q, input_grad=ig)
    assert dx is ig
    assert np.array_equal(dx, ref[0]) and np.array_equal(dg, ref[1])
    assert np.array_equal(big[..., 0], x)   # input untouched


# ---- output_mask and buffers -----------------------------------------------------------------

@pytest.mark.parametrize("layout", LAYOUTS)
def test_output_mask_leaves_unwanted_buffer_untouched(layout):
    x, q, go = make(layout=layout)
    full_dx, full_dg = gs3d.grid_sample_3d_backward(go, x, q, layout=layout)
    ig = np.full(x.shape, SENTINEL)
    gg = np.full(q.shape, SENTINEL)

    dx, dg = gs3d.grid_sample_3d_backward(go, x, q, layout=layout, output_mask=(False, True),
                                          input_grad=ig, grid_grad=gg)
    assert dx is None
    assert dg is gg
    assert np.all(ig == SENTINEL)
    assert np.array_equal(dg, full_dg)

    ig[...] = SENTINEL
    gg[...] = SENTINEL
    dx, dg = gs3d.grid_sample_3d_backward(go, x, q, layout=layout, output_mask=(True, False),
                                          input_grad=ig, grid_grad=gg)
    assert dg is None
    assert dx is ig
    assert np.all(gg == SENTINEL)
    assert np.array_equal(dx, full_dx)

    ig[...] = SENTINEL
    gg[...] = SENTINEL
    dx, dg = gs3d.grid_sample_3d_backward(go, x, q, layout=layout, output_mask=(False, False),
                                          input_grad=ig, grid_grad=gg)
    assert dx is None and dg is None
    assert np.all(ig == SENTINEL) and np.all(gg == SENTINEL)

    # without buffers
    dx, dg = gs3d.grid_sample_3d_backward(go, x, q, layout=layout, output_mask=(False, True))
    assert dx is None and np.array_equal(dg, full_dg)


# ----------------------------------------------------------------------------------------------
# accepted array-likes
# ----------------------------------------------------------------------------------------------

class ArrayWrap:
    """Only __array__."""

    def __init__(self, a):
        self._a = a

    def __array__(self, dtype=None, copy=None):
        return self._a if dtype is None else self._a.astype(dtype)


class DLPackWrap:
    """Only __dlpack__ / __dlpack_device__."""

    def __init__(self, a):
        self._a = a

    def __dlpack__(self, *args, **kwargs):
        return self._a.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


class BrokenArray:
    def __array__(self, dtype=None, copy=None):
        raise RuntimeError("cannot convert")


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16, BF16], ids=str)
def test_array_like_accepted(dtype, layout):
    x, q, go = make(dtype=dtype, layout=layout)
    ref_f = gs3d.grid_sample_3d(x, q, layout=layout)
    ref_b = gs3d.grid_sample_3d_backward(go, x, q, layout=layout)
    wrappers = [ArrayWrap]
    if dtype != BF16:   # numpy cannot export bfloat16 through DLPack; torch has no bf16 numpy
        wrappers += [DLPackWrap]
        if torch is not None:
            wrappers += [torch.from_numpy,
                         lambda a: torch.from_numpy(
                             np.ascontiguousarray(a.transpose(4, 3, 2, 1, 0))).permute(4, 3, 2, 1, 0)]
    for wrap in wrappers:
        f = gs3d.grid_sample_3d(wrap(x), wrap(q), layout=layout)
        assert isinstance(f, np.ndarray) and f.dtype == np.dtype(dtype)
        assert np.array_equal(f, ref_f)
        dx, dg = gs3d.grid_sample_3d_backward(wrap(go), wrap(x), wrap(q), layout=layout)
        assert np.array_equal(dx, ref_b[0]) and np.array_equal(dg, ref_b[1])
        # mixing wrapped and plain arrays
        dx, dg = gs3d.grid_sample_3d_backward(go, wrap(x), q, layout=layout)
        assert np.array_equal(dx, ref_b[0]) and np.array_equal(dg, ref_b[1])


def test_array_like_with_wrong_dtype_rejected():
    x, q, go = make()
    expect_error("fwd", ArrayWrap(x.astype(np.int32)), q, go, INVALID, "input")


@needs_torch
def test_torch_tensor_with_wrong_dtype_or_shape_rejected():
    x, q, go = make()
    expect_error("fwd", x, torch.from_numpy(q.astype(np.float32)), go, INVALID, "grid")
    expect_error("bwd", x, q, torch.from_numpy(go[0]), INVALID, "grad_output")


@pytest.mark.parametrize("op", OPS)
def test_failing_array_conversion_is_grid_sampler_error(op):
    x, q, go = make()
    bufs = buffers(op, x, q, go)
    expect_error(op, BrokenArray(), q, go, INVALID, "input", bufs)
    expect_error(op, x, BrokenArray(), go, INVALID, "grid", bufs)
    if op == "bwd":
        expect_error(op, x, q, BrokenArray(), INVALID, "grad_output", bufs)
    if torch is not None:
        # torch tensor needing grad cannot be viewed as numpy
        t = torch.from_numpy(x.copy()).requires_grad_(True)
        expect_error(op, t, q, go, INVALID, "input", bufs)


# ----------------------------------------------------------------------------------------------
# huge thread counts: must either work (capped) or be rejected cleanly -- never crash the
# process or leak a non-GridSamplerError.  Run in a subprocess so that a crash fails one test.
# ----------------------------------------------------------------------------------------------

_HUGE_THREADS_SCRIPT = r"""
import sys, numpy as np, gs3d
gs3d._api._WORK_PER_THREAD = 1      # this small call gets the threads it asks for (see conftest)
op, nt = sys.argv[1], int(sys.argv[2])
rng = np.random.default_rng(0)
x = rng.random((1, 2, 3, 3, 3)); q = rng.uniform(-1, 1, (1, 2, 2, 2, 3))
go = rng.random((1, 2, 2, 2, 2))
try:
    if op == "fwd":
        r = gs3d.grid_sample_3d(x, q, num_threads=nt)
        ok = np.array_equal(r, gs3d.grid_sample_3d(x, q, num_threads=1))
    else:
        a = gs3d.grid_sample_3d_backward(go, x, q, num_threads=nt)
        b = gs3d.grid_sample_3d_backward(go, x, q, num_threads=1)
        ok = np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    print("RESULT", "same" if ok else "different")
except gs3d.GridSamplerError as e:
    print("RESULT", "rejected", e.code, "num_threads" in str(e))
except BaseException as e:
    print("RESULT", "other", type(e).__name__, str(e)[:100])
"""


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("nt", [100_000, 2 ** 31, 2 ** 70])
def test_huge_num_threads_no_crash(nt, op):
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-c", _HUGE_THREADS_SCRIPT, op, str(nt)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"process died with return code {r.returncode}: {r.stderr[-300:]}"
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT")][-1]
    assert line in ("RESULT same", f"RESULT rejected {INVALID} True"), line
