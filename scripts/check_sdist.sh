#!/usr/bin/env bash
# Packaging check: build the sdist and the wheel (python -m build), check what they carry,
# pip-install the sdist into a fresh virtual environment and run the test files there from
# outside the source tree, against the installed package.
#
#   scripts/check_sdist.sh            # fresh venv: torch is not installed, its tests skip
#   GS3D_SYSTEM_SITE=1 scripts/...    # venv with --system-site-packages (reuses an installed
#                                     # torch; gs3d itself still comes from the sdist)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
py="${PYTHON:-python3}"
work="$(mktemp -d "${TMPDIR:-/tmp}/gs3d-sdist.XXXXXX")"
trap 'rm -rf "$work"' EXIT

"$py" -m build --outdir "$work/dist" "$root"
sdist="$(ls "$work"/dist/gs3d-*.tar.gz)"
wheel="$(ls "$work"/dist/gs3d-*.whl)"
sdist_files="$(tar tzf "$sdist")"
wheel_files="$("$py" -m zipfile -l "$wheel")"
for f in gs3d/_kernels.pyx gs3d/_kernels_avx2.pyx gs3d/_kernels_avx512.pyx gs3d/_helpers.pxd \
         gs3d/__init__.pyi gs3d/_kernels.pyi gs3d/_kernels_avx2.pyi gs3d/_kernels_avx512.pyi \
         gs3d/py.typed; do
    grep -q "/$f\$" <<<"$sdist_files" || { echo "sdist lacks $f"; exit 1; }
done
for f in gs3d/__init__.pyi gs3d/_kernels.pyi gs3d/py.typed gs3d/torch.py gs3d/jax.py gs3d/dask.py; do
    grep -q "$f" <<<"$wheel_files" || { echo "wheel lacks $f"; exit 1; }
done
echo "sdist and wheel contents: ok"

venv_opts=()
[ -n "${GS3D_SYSTEM_SITE:-}" ] && venv_opts+=(--system-site-packages)
"$py" -m venv "${venv_opts[@]}" "$work/venv"
# shellcheck disable=SC1091
. "$work/venv/bin/activate"
pip install -q --upgrade pip
pip install -q "gs3d[test] @ file://$sdist"

# the tests, away from the source tree: gs3d must come from the venv
mkdir "$work/run"
cp -r "$root/tests" "$work/run/tests"
cd "$work/run"
python - <<'PY'
import gs3d, sys
assert gs3d.__file__.startswith(sys.prefix), gs3d.__file__
print("testing", gs3d.__file__)
gs3d.show_config()
PY
env -u GS3D_SLOW python -m pytest -q -p no:cacheprovider tests
