#!/usr/bin/env bash
# The wheel built against numpy 2 (python -m build) installed with an old numpy in a fresh
# virtual environment, the tests run from outside the source tree.
#
#   scripts/check_oldest_numpy.sh path/to/gs3d-*.whl [numpy versions...]   (default 1.23.5)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
py="${PYTHON:-python3}"
wheel="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
shift
versions=("${@:-1.23.5}")
for v in "${versions[@]}"; do
    work="$(mktemp -d "${TMPDIR:-/tmp}/gs3d-numpy.XXXXXX")"
    "$py" -m venv "$work/venv"
    (
        # shellcheck disable=SC1091
        . "$work/venv/bin/activate"
        pip install -q "numpy==$v" "$wheel" pytest hypothesis ml_dtypes
        python -c "import numpy; assert numpy.__version__ == '$v', numpy.__version__"
        mkdir "$work/run" && cp -r "$root/tests" "$work/run/tests" && cd "$work/run"
        echo "== numpy $v ($(python -c 'import ml_dtypes; print("ml_dtypes", ml_dtypes.__version__)'))"
        env -u GS3D_SLOW python -m pytest -q -p no:cacheprovider tests
    ) || { echo "numpy $v: FAILED"; rm -rf "$work"; exit 1; }
    rm -rf "$work"
done
