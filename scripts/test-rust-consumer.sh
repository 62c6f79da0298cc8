#!/usr/bin/env bash
# A crate outside the kfuse workspace (examples/rust-consumer) built and run the way downstream
# users would, with libkfuse found in each of kfuse-sys's ways (see its build.rs):
#   1. pkg-config of an install, linked dynamically: the binary runs from anywhere with no
#      LD_LIBRARY_PATH (the consumer's one-line build.rs writes DEP_KFUSE_LIB_DIR as an rpath),
#   2. the same install with the `static` feature: libkfuse.a and its Libs.private; the binary
#      loads no libkfuse.so,
#   3. nothing given (no KFUSE_LIB_DIR, no pkg-config entry): kfuse-sys builds the library from
#      the checkout with CMake (CPU backend here: KFUSE_CMAKE_ARGS=-DKF_CUDA=OFF), `static`.
# Each run checks kfuse's GRU against the consumer's own float64 torch.nn.GRU. About 2 minutes on
# 2 cores (3 compiles the library).
#   bash scripts/test-rust-consumer.sh [BUILD_DIR]  (a CPU build to install; default build/valgrind)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD=$(cd "${1:-build/valgrind}" && pwd)
OUT=$ROOT/build/rust-consumer
export PATH="$HOME/.cargo/bin:$PATH"
# kfuse's one crate dependency (half, offline from Debian's registry: ../.cargo/config.toml)
bash scripts/install-deps.sh librust-half-dev
export CARGO_TARGET_DIR=$OUT/target
unset KFUSE_LIB_DIR KFUSE_CMAKE_ARGS
rm -rf "$OUT/prefix"
cmake --install "$BUILD" --prefix "$OUT/prefix" >/dev/null
cd examples/rust-consumer
bin=$CARGO_TARGET_DIR/release/kfuse-rust-consumer

runs() { # label, "static" if the binary must not load libkfuse.so
  echo "rust-consumer ($1):"
  (cd /tmp && env -u LD_LIBRARY_PATH "$bin")
  if [ "${2:-}" = static ] && ldd "$bin" | grep -q libkfuse; then
    echo "test-rust-consumer: the $1 binary loads libkfuse.so" >&2
    exit 1
  fi
}

PKG_CONFIG_PATH="$OUT/prefix/lib/pkgconfig" cargo build --offline --release -q
runs "pkg-config, dynamic"
PKG_CONFIG_PATH="$OUT/prefix/lib/pkgconfig" cargo build --offline --release -q --features static
runs "pkg-config, static" static
if env -u PKG_CONFIG_PATH pkg-config --exists kfuse; then
  echo "test-rust-consumer: a kfuse.pc is installed system-wide: skipping the build-from-source run"
else
  env -u PKG_CONFIG_PATH KFUSE_CMAKE_ARGS=-DKF_CUDA=OFF cargo build --offline --release -q --features static
  runs "built from the checkout by kfuse-sys, static" static
fi
echo "test-rust-consumer: every way built and ran"
