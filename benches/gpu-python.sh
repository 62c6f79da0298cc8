#!/usr/bin/env bash
# The Python package on a lent GPU machine, from the repository root, after benches/gpu.sh's
# carried build (.gpu/deps holds libkfuse): installs cffi and scikit-build-core (with pathspec and
# packaging) from wheels carried in .whl/ (`pip download -d .whl cffi scikit-build-core` here; the
# GPU machine reaches no package index), builds and installs bindings/python against .gpu/deps into
# /tmp/site, runs the pytest suite (CUDA tests included) and benches/python_modules.py on CUDA.
# Writes pytest.log and python_modules_gpu.md to $OUT. KF_PYTEST_K, when set, is pytest's -k
# expression (e.g. cuda: the tests that run on the GPU, for a short lease).
#   bash benches/gpu-python.sh [BUILD_DIR]      (default .gpu)
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD=$(cd "${1:-.gpu}" && pwd -P)
OUT=${OUT:-/tmp/kf-gpu-out}
mkdir -p "$OUT" /tmp/site
export LD_LIBRARY_PATH="$BUILD/deps:${LD_LIBRARY_PATH:-}"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 2
export PYTHONPATH=/tmp/site
KFUSE_LIBRARY_DIR="$BUILD/deps" KFUSE_INCLUDE_DIR="$ROOT/capi/include" \
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site \
  bindings/python > "$OUT/pytest.log" 2>&1 || { tail -20 "$OUT/pytest.log"; exit 2; }
(cd /tmp && python3 -m pytest -q -p no:cacheprovider ${KF_PYTEST_K:+-k "$KF_PYTEST_K"} "$ROOT/tests/python") >> "$OUT/pytest.log" 2>&1
rc=$?
echo "pytest (CUDA build, GPU present): exit $rc: $(tail -1 "$OUT/pytest.log")"
PYTHONUNBUFFERED=1 python3 benches/python_modules.py --device cuda --out "$OUT/python_modules_gpu.md" \
  > "$OUT/python_modules_gpu.log" 2>&1
rc2=$?
echo "python_modules.py --device cuda: exit $rc2"
[ -f "$OUT/python_modules_gpu.md" ] && grep -E '^\|' "$OUT/python_modules_gpu.md" | head -14
exit $((rc || rc2))
