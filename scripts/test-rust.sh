#!/usr/bin/env bash
# Rust bindings (bindings/rust): from a fresh clone,
#   1. installs what they need (Debian packages; only the missing ones, checked with dpkg-query),
#   2. builds the C library into build/main if it is not there (CPU only, library alone),
#   3. checks that kfuse-sys's committed src/bindings.rs is what bindgen makes of kfuse.h now,
#   4. runs `cargo test --offline` for the workspace (kfuse-sys: bindgen layout tests, unit and
#      doc tests; kfuse: unit, integration against a float64 reference, doc and compile_fail tests),
#   5. runs the example that trains an A-GRU through the safe crate (exits non-zero unless its
#      loss falls), and the soak example (soak_layers: 3000 forward + backward calls of each
#      plan in f32 and bf16; exits non-zero if the arena, the reserve or resident memory grows
#      after warm-up; about 4 s),
#   6. compiles the criterion benchmarks (benches/rust, a workspace of its own) without running them.
# Exits non-zero on any failure. About 1-2 minutes on 2 cores once build/main exists (plus about
# 1 minute the first time, to compile criterion and its dependencies).
# Cargo reads ../.cargo/config.toml: crates.io is replaced by Debian's /usr/share/cargo/registry
# and the network is off; the third-party crates are half (librust-half-dev: kfuse's bfloat16 and
# float16 element types) and criterion (librust-criterion-dev), a dev-dependency of the benchmarks.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
export OMP_WAIT_POLICY=PASSIVE
. scripts/lib.sh

stage "install dependencies"
PACKAGES=(
  build-essential cmake pkg-config libopenblas-pthread-dev  # the C library
  bindgen libclang1-14 libclang-common-14-dev               # the bindings-current check
  librust-half-dev                                          # kfuse's bf16/f16 (the half crate)
  librust-criterion-dev                                     # the benchmarks (benches/rust)
)
export PATH="$HOME/.cargo/bin:$PATH"
command -v cargo >/dev/null || PACKAGES+=(cargo rustc)       # Debian's toolchain as a fallback
command -v rustfmt >/dev/null || PACKAGES+=(rustfmt)         # bindgen formats with it
bash scripts/install-deps.sh "${PACKAGES[@]}"
cargo --version

if [ -z "${KFUSE_LIB_DIR:-}" ]; then
  if [ ! -e build/main/libkfuse.so ]; then
    stage "build the C library (build/main, CPU only)"
    cmake -S . -B build/main -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKF_CUDA=OFF \
      -DKF_BUILD_TESTS=OFF -DKF_BUILD_EXAMPLES=OFF -DKF_BUILD_BENCHES=OFF >/dev/null
    cmake --build build/main -j"$(nproc)" --target kfuse
  fi
  export KFUSE_LIB_DIR="$ROOT/build/main"
fi
KFUSE_LIB_DIR=$(cd "$KFUSE_LIB_DIR" && pwd)  # relative to the repository root: made absolute
echo "libkfuse from $KFUSE_LIB_DIR"

stage "kfuse-sys: committed bindings are current"
bash bindings/rust/kfuse-sys/generate.sh --check

cd bindings/rust
stage "cargo test --offline (kfuse-sys, kfuse)"
cargo test --offline --workspace

stage "example: train_agru_step"
cargo run --offline --release --example train_agru_step

stage "example: soak_layers, bounded"
cargo run --offline --release --example soak_layers -- --calls 3000

stage "benchmarks compile (benches/rust, a workspace of its own; not run)"
(cd "$ROOT/benches/rust" && cargo bench --offline --no-run)
