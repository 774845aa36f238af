"""gs3d.torch: a drop-in for torch.nn.functional.grid_sample on 5-D CPU tensors."""
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional
gt = pytest.importorskip("gs3d.torch")

from conftest import MODES, PADDINGS  # noqa: E402

DTYPES = {"float64": torch.float64, "float32": torch.float32,
          "float16": torch.float16, "bfloat16": torch.bfloat16}
# largest |gs3d - float64 torch| over the largest magnitude, on the same (rounded) inputs
TOL = {"float64": 1e-12, "float32": 1e-5, "float16": 1e-3, "bfloat16": 8e-3}


def _problem(dtype=torch.float64, channels_last=False, seed=0, shape=(2, 3, 4, 5, 6),
             out=(3, 4, 2)):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)
    grid = (torch.rand((shape[0], *out, 3), generator=gen, dtype=torch.float64) * 2.4 - 1.2).to(dtype)
    if channels_last:
        x = x.to(memory_format=torch.channels_last_3d)
    return x, grid


def _rel(got, want):
    got, want = got.detach().double(), want.detach().double()
    return float((got - want).abs().max() / want.abs().max().clamp_min(1e-300))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("padding_mode", PADDINGS)
@pytest.mark.parametrize("align_corners", [False, True])
def test_equals_torch_forward_backward_float64(mode, padding_mode, align_corners):
    x, grid = _problem()
    x.requires_grad_()
    grid.requires_grad_()
    kw = dict(mode=mode, padding_mode=padding_mode, align_corners=align_corners)
    y = gt.grid_sample(x, grid, **kw)
    y_ref = F.grid_sample(x, grid, **kw)
    assert y.shape == y_ref.shape and y.dtype == y_ref.dtype
    assert _rel(y, y_ref) <= 1e-12
    go = torch.randn_like(y_ref)
    got = torch.autograd.grad(y, (x, grid), go)
    want = torch.autograd.grad(y_ref, (x, grid), go)
    for a, b in zip(got, want):
        assert a.shape == b.shape and a.dtype == b.dtype
        assert _rel(a, b) <= 1e-12


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("channels_last", [False, True])
def test_dtypes_and_channels_last(dtype, channels_last):
    if dtype == "bfloat16":
        pytest.importorskip("ml_dtypes")
    x, grid = _problem(DTYPES[dtype], channels_last, seed=1)
    x.requires_grad_()
    grid.requires_grad_()
    kw = dict(mode="bilinear", padding_mode="border", align_corners=False)
    y = gt.grid_sample(x, grid, **kw)
    assert y.dtype == DTYPES[dtype]
    assert y.is_contiguous(memory_format=torch.channels_last_3d if channels_last
                           else torch.contiguous_format)
    go = torch.randn(y.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    dx, dgrid = torch.autograd.grad(y, (x, grid), go.to(DTYPES[dtype]))
    assert dx.dtype == dgrid.dtype == DTYPES[dtype] and dx.shape == x.shape
    # float64 PyTorch on the same rounded inputs is the oracle
    x64 = x.detach().double().requires_grad_()
    g64 = grid.detach().double().requires_grad_()
    y64 = F.grid_sample(x64, g64, **kw)
    dx64, dg64 = torch.autograd.grad(y64, (x64, g64), go.to(DTYPES[dtype]).double())
    for got, want in ((y, y64), (dx, dx64), (dgrid, dg64)):
        assert _rel(got, want) <= TOL[dtype]


def test_gradcheck_float64():
    x, grid = _problem(shape=(1, 2, 3, 4, 3), out=(2, 2, 3), seed=3)
    x.requires_grad_()
    grid.requires_grad_()
    for padding_mode in PADDINGS:
        assert torch.autograd.gradcheck(
            lambda a, b: gt.grid_sample(a, b, padding_mode=padding_mode, align_corners=True),
            (x, grid))


def test_opcheck():
    x, grid = _problem(shape=(2, 2, 3, 4, 3), out=(2, 3, 2), seed=4)
    xr, gr = x.clone().requires_grad_(), grid.clone().requires_grad_()
    for args in [(x, grid, 0, 0, False), (xr, gr, 1, 2, True), (xr, grid, 0, 1, True),
                 (x.to(memory_format=torch.channels_last_3d), gr, 0, 2, False)]:
        torch.library.opcheck(gt._forward_op, args)
    go = torch.randn(2, 2, 2, 3, 2, dtype=torch.float64)
    for mask in [(True, True), (True, False), (False, True)]:
        torch.library.opcheck(gt._backward_op, (go, x, grid, 0, 0, False, *mask))


def test_no_copies_and_output_mask(monkeypatch):
    """The kernels see the tensors' own memory; only the gradients autograd needs are asked for."""
    seen = {}
    fwd, bwd = gt._api.grid_sample_3d, gt._api.grid_sample_3d_backward

    def spy_fwd(input, grid, **kw):
        seen["fwd"] = (input, grid, kw)
        return fwd(input, grid, **kw)

    def spy_bwd(grad_output, input, grid, **kw):
        seen["bwd"] = (grad_output, input, grid, kw)
        return bwd(grad_output, input, grid, **kw)

    monkeypatch.setattr(gt._api, "grid_sample_3d", spy_fwd)
    monkeypatch.setattr(gt._api, "grid_sample_3d_backward", spy_bwd)
    x, grid = _problem(torch.float32, channels_last=True, seed=5)
    x.requires_grad_()
    y = gt.grid_sample(x, grid)
    xa, ga, kw = seen["fwd"]
    assert kw["layout"] == "NDHWC" and xa.flags.c_contiguous   # channels_last_3d -> NDHWC
    assert xa.ctypes.data == x.data_ptr() and ga.ctypes.data == grid.data_ptr()
    assert kw["out"].ctypes.data == y.data_ptr()
    y.sum().backward()                       # grid does not require grad
    go, xb, gb, kw = seen["bwd"]
    assert kw["output_mask"] == (True, False) and kw["grid_grad"] is None
    assert xb.ctypes.data == x.data_ptr() and gb.ctypes.data == grid.data_ptr()
    assert kw["input_grad"].ctypes.data == x.grad.data_ptr()
    assert 0 in go.strides                   # the expanded ones of sum() are read, not copied
    x2, g2 = _problem(seed=6)
    g2.requires_grad_()
    gt.grid_sample(x2, g2, mode="nearest").sum().backward()
    assert seen["bwd"][3]["output_mask"] == (False, True) and x2.grad is None
    assert torch.count_nonzero(g2.grad) == 0


def test_strided_views_and_fallbacks():
    x, grid = _problem(shape=(2, 3, 8, 5, 6), seed=7)
    xv, gv = x[:, ::2, ::2].transpose(3, 4), grid[:, :, ::2]    # strided, permuted views
    assert not xv.is_contiguous() and not gv.is_contiguous()
    assert _rel(gt.grid_sample(xv, gv), F.grid_sample(xv, gv, align_corners=False)) <= 1e-12
    # 4-D and bicubic are handed to PyTorch
    x4, g4 = torch.randn(1, 2, 5, 5, dtype=torch.float64), torch.rand(1, 3, 3, 2, dtype=torch.float64)
    assert torch.equal(gt.grid_sample(x4, g4, mode="bicubic", align_corners=True),
                       F.grid_sample(x4, g4, mode="bicubic", align_corners=True))
    with pytest.raises(RuntimeError):
        gt.grid_sample(x, grid, mode="bicubic", align_corners=False)


def test_torch_compile_fullgraph():
    if not hasattr(torch, "compile"):
        pytest.skip("no torch.compile")
    x, grid = _problem(seed=8)
    f = torch.compile(lambda a, b: gt.grid_sample(a, b, padding_mode="border") * 2,
                      backend="eager", fullgraph=True)
    assert torch.equal(f(x, grid), 2 * gt.grid_sample(x, grid, padding_mode="border"))
