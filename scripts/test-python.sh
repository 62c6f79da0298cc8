#!/usr/bin/env bash
# Builds and tests the kfuse Python package (bindings/python) against the C library:
#   1. a virtual environment on Debian's /usr/bin/python3 with --system-site-packages (for
#      python3-torch 1.13 and numpy) plus cffi, scikit-build-core, pytest and tqdm from PyPI,
#   2. `pip install bindings/python` into it (scikit-build-core: CMake builds the cffi extension,
#      out-of-line API mode, abi3, cdef generated from capi/include/kfuse.h). With
#      KFUSE_LIBRARY_DIR set (scripts/test.sh passes build/main) it links that prebuilt library
#      with an rpath to it; without, pip builds libkfuse itself and bundles it in the package,
#   3. pytest tests/python. Exits non-zero on any failure, and when pytest collects no test,
#   4. a bounded soak of every kfuse.torch module (benches/soak_frontends.py: 300 forward +
#      backward calls per module, float32 and bfloat16, eager and, on torch >= 2.4, under
#      torch.compile), failing if resident memory, Python objects, plans or their caches grow
#      after warm-up (about 3 s on torch 1.13; on torch 2.x 17 s of CPU, mostly compiling, 60 s
#      wall on the shared 2-core box).
# Takes about a minute with a prebuilt library. Run from anywhere: bash scripts/test-python.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
export OMP_WAIT_POLICY=PASSIVE
PY=/usr/bin/python3
VENV=${KFUSE_VENV:-$ROOT/build/pyenv}
LIBDIR=${KFUSE_LIBRARY_DIR:-}
[ -n "$LIBDIR" ] && LIBDIR=$(cd "$LIBDIR" && pwd)  # relative to the repository root: made absolute

. scripts/lib.sh

stage "system packages (python3-venv, python3-torch, python3-numpy)"
bash scripts/install-deps.sh python3 python3-venv python3-numpy python3-torch python3-dev \
  build-essential cmake libopenblas-pthread-dev

stage "virtual environment $VENV"
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv --system-site-packages "$VENV"
fi
"$VENV/bin/python" -c "import cffi, pytest, tqdm, scikit_build_core" 2>/dev/null ||
  "$VENV/bin/pip" install -q --disable-pip-version-check "cffi>=1.15" pytest tqdm \
    "scikit-build-core>=0.10"
"$VENV/bin/python" -c "import torch, numpy; print('torch', torch.__version__, 'numpy', numpy.__version__)"

stage "pip install bindings/python (library: ${LIBDIR:-built by pip, bundled})"
KFUSE_LIBRARY_DIR="$LIBDIR" \
  "$VENV/bin/pip" install -q --disable-pip-version-check --no-build-isolation --no-deps \
  --force-reinstall bindings/python
# import from outside the source tree, so the installed package (not bindings/python) is tested
(cd /tmp && "$VENV/bin/python" -c "import kfuse; print('kfuse', kfuse.version_string(), 'from', kfuse.__file__)")

stage "pytest tests/python"
set +e
(cd "$ROOT" && "$VENV/bin/python" -m pytest -q -p no:cacheprovider tests/python)
rc=$?
set -e
pytest_verdict test-python "$rc"

stage "soak: kfuse.torch's modules, bounded (benches/soak_frontends.py --calls 300)"
(cd /tmp && "$VENV/bin/python" "$ROOT/benches/soak_frontends.py" --calls 300)
stage "python tests passed"
