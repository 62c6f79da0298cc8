#!/usr/bin/env bash
# Installs what is needed, builds kfuse, and runs the main job: an A-GRU sequence classifier
# trained through the C ABI on Fashion-MNIST rows (T=28, I=28, H=128, B=128), 2 epochs, on the
# CPU (or on CUDA with --device cuda, where built and available). Extra arguments go to the
# trainer (examples/train_fmnist --help).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build/main -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKF_CUDA=AUTO >/dev/null
cmake --build build/main -j"$(nproc)" --target train_fmnist
OMP_WAIT_POLICY=PASSIVE exec build/main/examples/train_fmnist "$@"
