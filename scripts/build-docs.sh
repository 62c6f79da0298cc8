#!/usr/bin/env bash
# Builds the API reference into build/docs/ with every warning an error, and checks what it
# covers:
#   1. Doxygen over capi/include/kfuse.h (docs/api/Doxyfile; the header's plain comments read
#      through docs/api/doxygen_filter.py; an undocumented declaration fails) -> build/docs/doxygen
#   2. cargo doc for kfuse-sys and kfuse (RUSTDOCFLAGS="-D warnings"; every crate denies
#      missing_docs) -> build/docs/rust; and for kfuse-tch where scripts/test-tch.sh finds tch's
#      sources (its --doc mode)
#   3. the Python package's cffi extension (bindings/python's CMake, linked to a prebuilt
#      libkfuse), so that autodoc imports kfuse, kfuse.numpy and kfuse.torch (Debian's torch)
#   4. Sphinx (docs/api: breathe for the C reference, autodoc, myst_parser including
#      docs/ops/*.md and benches/results files) with -W --keep-going -> build/docs/html
#   5. scripts/check-api-docs.py: every declaration of kfuse.h described in Doxygen's output,
#      every module and public name of the Python package in the Sphinx build, every link into
#      rustdoc's pages resolved.
# libkfuse: $KFUSE_LIBRARY_DIR, else build/main or build/valgrind where one holds libkfuse.so,
# else a CPU-only build of the library alone into build/docs-lib. Open build/docs/html/index.html.
# About 40-60 s on 2 cores with a prebuilt library (cargo's first run compiles a little more).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=$ROOT/build/docs
. scripts/lib.sh

stage "docs: install dependencies (Doxygen, Sphinx, breathe, myst-parser)"
PACKAGES=(doxygen python3-sphinx python3-breathe python3-myst-parser
          python3-dev python3-cffi python3-torch python3-numpy cmake build-essential)
export PATH="$HOME/.cargo/bin:$PATH"
command -v cargo >/dev/null || PACKAGES+=(cargo rustc)
bash scripts/install-deps.sh "${PACKAGES[@]}"

LIB=${KFUSE_LIBRARY_DIR:-}
if [ -z "$LIB" ]; then
  for d in build/main build/valgrind; do
    [ -e "$d/libkfuse.so" ] && LIB=$ROOT/$d && break
  done
fi
if [ -z "$LIB" ]; then
  stage "docs: build libkfuse (CPU only, library alone) into build/docs-lib"
  cmake -S . -B build/docs-lib -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKF_CUDA=OFF \
    -DKF_BUILD_TESTS=OFF -DKF_BUILD_EXAMPLES=OFF -DKF_BUILD_BENCHES=OFF >/dev/null
  cmake --build build/docs-lib -j"$(nproc)" --target kfuse
  LIB=$ROOT/build/docs-lib
fi
echo "libkfuse from $LIB"
# from scratch every time: Sphinx re-reads (and warns about) only what changed since its last run
rm -rf "$OUT" build/docs-doctrees
mkdir -p "$OUT"

stage "docs: Doxygen over kfuse.h (warnings are errors)"
KF_DOCS_OUT=$OUT doxygen docs/api/Doxyfile

stage "docs: cargo doc (kfuse-sys, kfuse; -D warnings)"
(cd bindings/rust &&
  KFUSE_LIB_DIR=$LIB CARGO_TARGET_DIR=$ROOT/build/docs-cargo RUSTDOCFLAGS="-D warnings" \
    cargo doc --offline --no-deps -p kfuse-sys -p kfuse)
cp -r build/docs-cargo/doc "$OUT/rust"
rm -rf build/tch-target/doc/kfuse_tch
bash scripts/test-tch.sh --doc  # prints SKIPPED where tch's sources are nowhere
if [ -d build/tch-target/doc/kfuse_tch ]; then
  cp -r build/tch-target/doc/kfuse_tch "$OUT/rust/"
fi

stage "docs: the Python package's cffi extension (for autodoc)"
cmake -S bindings/python -B build/docs-py -DKFUSE_LIBRARY_DIR="$LIB" \
  -DPython_EXECUTABLE=/usr/bin/python3 >/dev/null
cmake --build build/docs-py --target _kfuse_cffi >/dev/null
rm -rf build/docs-py/pkg && mkdir -p build/docs-py/pkg
cp -r bindings/python/kfuse build/docs-py/pkg/
cp build/docs-py/_kfuse_cffi.abi3.so build/docs-py/pkg/kfuse/

stage "docs: Sphinx (-W --keep-going)"
KF_DOCS_OUT=$OUT PYTHONPATH=$ROOT/build/docs-py/pkg OMP_WAIT_POLICY=PASSIVE \
  /usr/bin/python3 -m sphinx -W --keep-going -q -b html -d build/docs-doctrees docs/api "$OUT/html"

stage "docs: coverage (scripts/check-api-docs.py)"
PYTHONPATH=$ROOT/build/docs-py/pkg /usr/bin/python3 scripts/check-api-docs.py "$OUT"
stage "docs built: $OUT/html/index.html"
