"""Packaging and typing: a light ``import gs3d``, the stubs (mypy.stubtest), and (with
GS3D_SLOW=1) the sdist installed into a fresh virtual environment passing the tests."""
import importlib.util
import os
import pathlib
import site
import subprocess
import sys

import pytest

import gs3d

PACKAGE = pathlib.Path(gs3d.__file__).resolve().parent
ROOT = pathlib.Path(__file__).resolve().parents[1]
SLOW = pytest.mark.skipif(not os.environ.get("GS3D_SLOW"), reason="set GS3D_SLOW=1 to run")


def test_import_gs3d_imports_no_framework():
    code = ("import sys, gs3d; print(' '.join(m for m in ('torch', 'jax', 'dask', 'distributed', "
            "'ml_dtypes') if m in sys.modules))")
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True, cwd=str(PACKAGE.parent)).stdout.strip()
    assert found == ""


def test_typing_files_are_shipped():
    for name in ("py.typed", "__init__.pyi", "_kernels.pyi"):
        assert (PACKAGE / name).is_file(), name


MYPY_CONFIG = """\
[mypy]
cache_dir = {cache}
[mypy-gs3d._validation,gs3d.__main__,gs3d.reference]
ignore_errors = True
[mypy-torch.*,jax.*,jaxlib.*,dask.*,distributed.*,ml_dtypes.*]
follow_imports = skip
ignore_missing_imports = True
"""
ADAPTERS = {"torch": "torch", "jax": "jax", "dask": "dask"}


def test_stubtest(tmp_path):
    """The stubs (__init__.pyi, _kernels.pyi) and the adapters' annotations match the runtime."""
    if importlib.util.find_spec("mypy") is None:
        pytest.skip("mypy is not installed")
    config = tmp_path / "mypy.ini"
    # untyped internals are not the stubs' business (their own type errors would stop stubtest)
    config.write_text(MYPY_CONFIG.format(cache=tmp_path / "cache"))
    allow = tmp_path / "allowlist.txt"
    allowed = [f"gs3d.{m}.__test__" for m in ("_kernels", "_kernels_avx2", "_kernels_avx512")]
    # (the Cython artefacts)
    # an adapter whose framework is not installed cannot be imported, so cannot be checked
    allowed += [f"gs3d.{name}(\\..*)?" for name, needs in ADAPTERS.items()
                if importlib.util.find_spec(needs) is None]
    allow.write_text("\n".join(allowed) + "\n")
    env = dict(os.environ)
    site_dirs = {pathlib.Path(p).resolve() for p in site.getsitepackages() + [site.getusersitepackages()]}
    if PACKAGE.parent not in site_dirs:
        # a source checkout (editable installs use import hooks mypy does not follow)
        env["MYPYPATH"] = str(PACKAGE.parent)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PACKAGE.parent),
                                                          env.get("PYTHONPATH")]))
    # run away from the package's parent directory: mypy takes the current directory's modules
    # for the user's own (site-packages would shadow libraries)
    proc = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "gs3d", "--mypy-config-file", str(config),
         "--allowlist", str(allow)],
        capture_output=True, text=True, cwd=str(tmp_path), env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@SLOW
def test_sdist_in_fresh_venv():
    """scripts/check_sdist.sh: python -m build, the sdist pip-installed into a new venv, the
    test files run against the installed package from outside the source tree."""
    script = ROOT / "scripts" / "check_sdist.sh"
    if not script.is_file():
        pytest.skip("not in a source checkout")
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, cwd=str(ROOT))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]


# --------------------------------------------------------------------------------------------
# docs: the README's option table, scipy column
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("align_corners", [True, False])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
def test_readme_table_scipy_column(mode, padding_mode, align_corners):
    ndimage = pytest.importorskip("scipy.ndimage")
    import numpy as np
    scipy_mode = {"zeros": "grid-constant", "border": "nearest",
                  "reflection": "mirror" if align_corners else "reflect"}[padding_mode]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 1, 4, 5, 6))
    grid = rng.uniform(-1.7, 1.7, (1, 3, 4, 5, 3))
    size = np.array(x.shape[2:])
    g = grid[0][..., ::-1]                                     # (z, y, x)
    u = (g + 1) / 2 * (size - 1) if align_corners else ((g + 1) * size - 1) / 2
    want = ndimage.map_coordinates(x[0, 0], np.moveaxis(u, -1, 0), order=int(mode == "bilinear"),
                                   mode=scipy_mode, cval=0.0)
    got = gs3d.grid_sample_3d(x, grid, mode=mode, padding_mode=padding_mode,
                              align_corners=align_corners)[0, 0]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


def test_kernel_modules_keep_their_prefetch_hints():
    """The kernels hide memory latency with software prefetch.  gcc once deleted every
    prefetch from both modules (it deems __builtin_prefetch side-effect free, so helpers made
    only of prefetches were dead code): the compiled modules must still hold them."""
    import platform
    import shutil
    objdump = shutil.which("objdump")
    if objdump is None or platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("needs objdump and an x86-64 build")
    names = ["_kernels"] + [m for m in ("_kernels_avx2", "_kernels_avx512")
                            if importlib.util.find_spec(f"gs3d.{m}")]
    for name in names:
        path = importlib.util.find_spec(f"gs3d.{name}").origin
        out = subprocess.run([objdump, "-d", "--no-show-raw-insn", path], capture_output=True,
                             text=True, check=True).stdout
        count = sum("prefetcht0" in line for line in out.splitlines())
        assert count >= 20, f"{name}: {count} prefetch instructions"


@pytest.mark.parametrize("cap", ["", "avx2", "baseline"])
def test_simd_level_is_the_best_the_cpu_runs_under_the_cap(cap):
    """gs3d picks the widest kernel module this CPU runs (AVX-512, then AVX2, then the
    baseline); GS3D_SIMD caps it, and show_config names the module in use."""
    from gs3d import _kernels
    code = ("import gs3d, gs3d._api as a; gs3d.show_config(); "
            "print(a.SIMD_LEVEL, a._kernels.__name__)")
    env = dict(os.environ, GS3D_SIMD=cap)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, check=True).stdout.split()
    level, module = out[-2], out[-1]
    built = {m for m in ("avx2", "avx512") if importlib.util.find_spec(f"gs3d._kernels_{m}")}
    want = "baseline"
    if cap != "baseline" and _kernels.cpu_has_avx2() and "avx2" in built:
        want = "avx2"
        if cap != "avx2" and _kernels.cpu_has_avx512() and "avx512" in built:
            want = "avx512"
    assert level == want
    assert module == ("gs3d._kernels" if want == "baseline" else f"gs3d._kernels_{want}")
    assert ("AVX-512" in " ".join(out)) == (want == "avx512")

