#!/usr/bin/env bash
# Build gs3d with AddressSanitizer + UndefinedBehaviorSanitizer in a separate copy and run the
# test suite and the fuzzer against it.  Passes only with zero sanitizer reports.
#
#   scripts/sanitize.sh                      # copy to /tmp/gs3d-asan, build, run everything
#   GS3D_ASAN_DIR=/some/dir GS3D_FUZZ_EXAMPLES=500 scripts/sanitize.sh [extra pytest args]
#
# The normal in-place build of the checkout is not touched.  gcc's ASan runtime must be the
# first library loaded into the (uninstrumented) python, hence LD_PRELOAD; leak detection is
# off because CPython itself does not free everything at exit.  Reports of every process
# (pytest, and the subprocesses some tests start, which inherit the environment) go to
# $DIR/reports; UBSan reports go to stderr, which pytest runs with --capture=sys so that they
# are not swallowed (a UBSan report ends the process with status 1).  The whole output is kept
# in $DIR/pytest.log.  The script fails if any report was written, or if pytest fails.
set -euo pipefail

SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${GS3D_ASAN_DIR:-/tmp/gs3d-asan}"
PY="${PYTHON:-python}"
export GS3D_FUZZ_EXAMPLES="${GS3D_FUZZ_EXAMPLES:-300}"

echo "== copying $SRC -> $DIR"
rm -rf "$DIR"
mkdir -p "$DIR/reports"
cp -r "$SRC/gs3d" "$SRC/tests" "$SRC/setup.py" "$SRC/pyproject.toml" "$SRC/README.md" "$DIR/"
rm -f "$DIR"/gs3d/*.so "$DIR"/gs3d/_kernels.c
find "$DIR" -name __pycache__ -prune -exec rm -rf {} +

echo "== building with -fsanitize=address,undefined"
cd "$DIR"
GS3D_EXTRA_CFLAGS="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined -g" \
GS3D_EXTRA_LDFLAGS="-fsanitize=address,undefined" \
    "$PY" setup.py build_ext --inplace > "$DIR/build.log" 2>&1 || { tail -30 "$DIR/build.log"; exit 1; }
# every kernel build (the baseline and the AVX2 variant) must carry both runtimes; ldd's output
# is captured first (grep -q closing the pipe early fails the pipeline under pipefail)
for SO in "$DIR"/gs3d/_kernels*.so; do
    LINKED="$(ldd "$SO")"
    grep -q libasan <<<"$LINKED" || { echo "$SO is not linked against libasan"; exit 1; }
    grep -q libubsan <<<"$LINKED" || { echo "$SO is not linked against libubsan"; exit 1; }
done

LIBASAN="$(gcc -print-file-name=libasan.so)"
# libstdc++ is preloaded too: otherwise ASan's __cxa_throw interceptor finds no real function
# when a C++ library loaded later (torch, in the oracle and adapter tests) throws, and aborts
LIBSTDCXX="$(gcc -print-file-name=libstdc++.so.6)"
export LD_PRELOAD="$LIBASAN $LIBSTDCXX"
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:halt_on_error=1:log_path=$DIR/reports/asan"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export PYTHONPATH="$DIR"
export PYTHONDONTWRITEBYTECODE=1

"$PY" -c "import gs3d, sys; assert gs3d.__file__.startswith('$DIR'), gs3d.__file__; print('== gs3d from', gs3d.__file__)"

# Canary: prove the runtime is live, a heap overflow in a preloaded process must be reported.
CANARY="$DIR/canary"
mkdir -p "$CANARY"
cat > "$CANARY/c.c" <<'EOF'
#include <stdlib.h>
int main(void) { volatile char *p = malloc(8); p[8] = 1; free((void*)p); return 0; }
EOF
gcc -fsanitize=address -g "$CANARY/c.c" -o "$CANARY/c"
if ASAN_OPTIONS="detect_leaks=0:log_path=$CANARY/report" "$CANARY/c" 2>/dev/null; then
    echo "canary: AddressSanitizer did not fire"; exit 1
fi
grep -q "heap-buffer-overflow" "$CANARY"/report* && echo "== canary: AddressSanitizer fires"

echo "== pytest (whole suite incl. fuzzer, GS3D_FUZZ_EXAMPLES=$GS3D_FUZZ_EXAMPLES)"
# Two cross-build tests are left out: they require the baseline module's 16-bit input gradient
# to carry the same NaN sign as the SIMD modules' where NaNs of both signs meet in one sum.
# IEEE 754 leaves that to the operand order (x86 keeps the first operand's NaN), which the
# instrumented baseline build orders the other way: 643 of 1920 float16 values read 0x7e00
# against 0xfe00, no other difference (scripts/README.md).  The normal builds run them.
SKIP=(--deselect tests/test_plans.py::test_half_input_grad_rounding_agrees_across_builds
      --deselect tests/test_plans.py::test_half_input_grad_ties_and_nan_payloads_agree_across_builds)
status=0
"$PY" -m pytest -q -p no:cacheprovider --capture=sys "${SKIP[@]}" tests "$@" 2>&1 \
    | tee "$DIR/pytest.log" || status=$?

ubsan=$(grep -c "runtime error:" "$DIR/pytest.log" || true)
[ "$ubsan" -eq 0 ] || grep -A12 "runtime error:" "$DIR/pytest.log" | head -40
reports=$(( $(ls "$DIR/reports" | wc -l) + ubsan ))
echo "== sanitizer reports: $reports"
if [ "$reports" -ne 0 ]; then
    for f in "$DIR"/reports/*; do [ -e "$f" ] && { echo "--- $f"; head -40 "$f"; }; done
    exit 1
fi
echo "== pytest exit status: $status"
exit "$status"
