#!/usr/bin/env bash
# The Python package on a lent GPU machine, from the repository root, after benches/gpu.sh's
# carried build (.gpu/deps holds libkfuse): installs cffi and scikit-build-core (with pathspec and
# packaging) from wheels carried in .whl/ (`pip download -d .whl cffi scikit-build-core` here; the
# GPU machine reaches no package index), builds and installs bindings/python against .gpu/deps into
# /tmp/site, runs the pytest suite (CUDA tests included) and benches/python_modules.py on CUDA.
# Writes pytest.log and python_modules_gpu.md to $OUT. KF_PYTEST_K, when set, is pytest's -k
# expression (e.g. cuda: the tests that run on the GPU, for a short lease).
# KF_PY_PARTS picks what runs after the install (default "pytest modules overhead"): pytest,
# modules (benches/python_modules.py), overhead (benches/python_overhead.py --device cuda: the
# per-call cost of each Python layer against the bare C call, $OUT/python_overhead_gpu.md) and
# kkan (benches/kkan_epoch.py --device cuda: the KKAN (Small) epoch on the GPU, into
# $OUT/kkan_gpu.log; Fashion-MNIST from BUILD_DIR/fmnist/*.xz when the bundle carries it,
# `scripts/gpu-bundle.sh --python`, else from Debian's dataset folder).
#   bash benches/gpu-python.sh [BUILD_DIR]      (default .gpu)
set -u
cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD
BUILD=$(cd "${1:-.gpu}" && pwd -P)
OUT=${OUT:-/tmp/kf-gpu-out}
mkdir -p "$OUT" /tmp/site
export LD_LIBRARY_PATH="$BUILD/deps:${LD_LIBRARY_PATH:-}"
export PYTHONPATH=/tmp/site
# The install is skipped when /tmp/site already holds this library and package source (gpu.sh's
# python and kkan parts each run this script on one machine: about 10 s of device time saved).
stamp=$({ cat "$BUILD"/deps/libkfuse.so* bindings/python/pyproject.toml bindings/python/*.py \
  .whl/*.whl; find bindings/python/kfuse -name '*.py' -print0 | sort -z | xargs -0 cat; } \
  2>/dev/null | md5sum)
if [ "$(cat /tmp/site/.kfuse-stamp 2>/dev/null)" = "$stamp" ]; then
  echo "kfuse package already installed from this bundle" > "$OUT/pytest.log"
else
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl ||
    exit 2
  KFUSE_LIBRARY_DIR="$BUILD/deps" KFUSE_INCLUDE_DIR="$ROOT/capi/include" \
    python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site \
    bindings/python > "$OUT/pytest.log" 2>&1 || { tail -20 "$OUT/pytest.log"; exit 2; }
  echo "$stamp" > /tmp/site/.kfuse-stamp
fi
rc=0
for part in ${KF_PY_PARTS:-pytest modules overhead}; do
  case $part in
    pytest)
      (cd /tmp && python3 -m pytest -q -p no:cacheprovider ${KF_PYTEST_K:+-k "$KF_PYTEST_K"} \
        "$ROOT/tests/python") >> "$OUT/pytest.log" 2>&1
      r=$?
      echo "pytest (CUDA build, GPU present): exit $r: $(tail -1 "$OUT/pytest.log")" ;;
    modules)
      PYTHONUNBUFFERED=1 python3 benches/python_modules.py --device cuda \
        --out "$OUT/python_modules_gpu.md" > "$OUT/python_modules_gpu.log" 2>&1
      r=$?
      echo "python_modules.py --device cuda: exit $r"
      [ -f "$OUT/python_modules_gpu.md" ] && grep -E '^\|' "$OUT/python_modules_gpu.md" | head -14 ;;
    overhead)
      OMP_WAIT_POLICY=PASSIVE PYTHONUNBUFFERED=1 python3 benches/python_overhead.py --device cuda \
        --md "$OUT/python_overhead_gpu.md" > "$OUT/python_overhead_gpu.log" 2>&1
      r=$?
      echo "python_overhead.py --device cuda: exit $r" ;;
    kkan)
      data=/usr/share/datasets/fashion-mnist
      if ls "$BUILD"/fmnist/*.xz > /dev/null 2>&1; then
        data=/tmp/fmnist  # the bundle's xz'd IDX files, back to the gzip the reader takes
        mkdir -p "$data"
        python3 -c 'import gzip, lzma, os, sys
for f in sys.argv[2:]:
    gz = os.path.join(sys.argv[1], os.path.basename(f)[:-3] + ".gz")
    with lzma.open(f) as src, gzip.open(gz, "wb", 1) as dst:
        dst.write(src.read())' "$data" "$BUILD"/fmnist/*.xz
      fi
      PYTHONUNBUFFERED=1 python3 benches/kkan_epoch.py --device cuda --data-dir "$data" \
        ${KF_KKAN_ARGS:-} > "$OUT/kkan_gpu.log" 2>&1
      r=$?
      echo "kkan_epoch.py --device cuda: exit $r: $(grep -m1 kkan_epoch_summary "$OUT/kkan_gpu.log" || tail -3 "$OUT/kkan_gpu.log")" ;;
    *) r=2; echo "unknown part $part" ;;
  esac
  [ $r -eq 0 ] || rc=$r
done
exit $rc
