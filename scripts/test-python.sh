#!/usr/bin/env bash
# Builds and tests the kfuse Python package (bindings/python) against the C library:
#   1. the C library at build/main (built here with cmake if build/main/libkfuse.so.1 is absent;
#      KFUSE_LIBRARY_DIR points elsewhere to use another build),
#   2. a virtual environment on Debian's /usr/bin/python3 with --system-site-packages (for
#      python3-torch 1.13 and numpy) plus cffi, pytest and tqdm from PyPI,
#   3. `pip install bindings/python` into it (cffi out-of-line API mode; cdef generated from
#      capi/include/kfuse.h; rpath to the library),
#   4. pytest tests/python. Exits non-zero on any failure, and when pytest collects no test.
# Takes about a minute when the C build exists. Run from anywhere: bash scripts/test-python.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
JOBS=${JOBS:-$(nproc)}
export OMP_WAIT_POLICY=PASSIVE
PY=/usr/bin/python3
VENV=${KFUSE_VENV:-$ROOT/build/pyenv}
LIBDIR=${KFUSE_LIBRARY_DIR:-$ROOT/build/main}

stage() { printf '\n==== %s [%s]\n' "$*" "$(date +%T)"; }

stage "system packages (python3-venv, python3-torch, python3-numpy)"
bash scripts/install-deps.sh python3 python3-venv python3-numpy python3-torch python3-dev \
  build-essential cmake

if [ ! -e "$LIBDIR/libkfuse.so.1" ]; then
  stage "C library (absent at $LIBDIR: building it, CPU backend)"
  bash scripts/install-deps.sh
  cmake -S . -B "$LIBDIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKF_CUDA=AUTO \
    -DKF_BUILD_EXAMPLES=OFF -DKF_BUILD_BENCHES=OFF >/dev/null
  cmake --build "$LIBDIR" -j"$JOBS" --target kfuse
fi

stage "virtual environment $VENV"
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv --system-site-packages "$VENV"
fi
"$VENV/bin/python" -c "import cffi, pytest, tqdm, setuptools" 2>/dev/null ||
  "$VENV/bin/pip" install -q --disable-pip-version-check "cffi>=1.15" pytest tqdm "setuptools>=61"
"$VENV/bin/python" -c "import torch, numpy; print('torch', torch.__version__, 'numpy', numpy.__version__)"

stage "pip install bindings/python (library: $LIBDIR)"
rm -rf bindings/python/build bindings/python/kfuse.egg-info
KFUSE_LIBRARY_DIR="$LIBDIR" KFUSE_INCLUDE_DIR="$ROOT/capi/include" \
  "$VENV/bin/pip" install -q --disable-pip-version-check --no-build-isolation --no-deps \
  --force-reinstall bindings/python
rm -rf bindings/python/build bindings/python/kfuse.egg-info
# import from outside the source tree, so the installed package (not bindings/python) is tested
(cd /tmp && "$VENV/bin/python" -c "import kfuse; print('kfuse', kfuse.version_string(), 'from', kfuse.__file__)")

stage "pytest tests/python"
set +e
(cd "$ROOT" && "$VENV/bin/python" -m pytest -q -p no:cacheprovider tests/python)
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "test-python: pytest collected no tests: failing" >&2
  exit 1
fi
if [ "$rc" -ne 0 ]; then
  echo "test-python: pytest failed (exit $rc)" >&2
  exit "$rc"
fi
stage "python tests passed"
