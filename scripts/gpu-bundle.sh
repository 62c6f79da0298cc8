#!/usr/bin/env bash
# Builds kfuse with CUDA here (a machine with nvcc but no GPU) in build-gpu/ and gathers what a
# lent GPU machine needs to run the tests and benchmarks into .gpu/ (git-ignored; the device tool
# carries it): libkfuse, the test/bench/example binaries, and the shared libraries they link that
# a bare GPU machine lacks (Criterion and its dependencies, zlib, ...). cuBLAS and the CUDA runtime
# come from the GPU machine's own CUDA 13 toolkit. Then, there: bash benches/gpu.sh .gpu
#
#   bash scripts/gpu-bundle.sh             .gpu/: the C tests, benchmarks and Python package
#   bash scripts/gpu-bundle.sh --python    .gpu-py/: the Python package alone (libkfuse stripped
#                                          of its debug sections, and its libraries) with
#                                          Fashion-MNIST as xz'd IDX files in .gpu-py/fmnist, for
#                                          benches/gpu.sh's kkan part: .gpu with the data is over
#                                          the 64 MiB a device call carries, this is about 58 MiB
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-}
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKF_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 >/dev/null
cmake --build build-gpu -j"$(nproc)"
if [ "$mode" = --python ]; then
  rm -rf .gpu-py && mkdir -p .gpu-py/deps .gpu-py/fmnist
  strip --strip-debug -o .gpu-py/deps/libkfuse.so.1 build-gpu/libkfuse.so.1
  ln -s libkfuse.so.1 .gpu-py/deps/libkfuse.so
  ldd .gpu-py/deps/libkfuse.so.1 | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' |
    grep -E '^lib(gfortran|quadmath|gomp)' | while read -r name path; do cp -L "$path" .gpu-py/deps/; done
  for f in /usr/share/datasets/fashion-mnist/*-ubyte.gz; do
    zcat "$f" | xz -9 -T"$(nproc)" > ".gpu-py/fmnist/$(basename "$f" .gz).xz"
  done
  du -sh .gpu-py | cat
  exit 0
fi
rm -rf .gpu && mkdir -p .gpu/bin .gpu/deps
cp -L build-gpu/libkfuse.so.1 .gpu/deps/libkfuse.so.1  # the SONAME the binaries load
ln -s libkfuse.so.1 .gpu/deps/libkfuse.so  # the name the Python package's build links against
for b in build-gpu/tests/test_* build-gpu/benches/kf_bench_* \
         build-gpu/examples/train_fmnist build-gpu/examples/hello_rnn; do
  [ -x "$b" ] && [ -f "$b" ] && cp "$b" .gpu/bin/
done
skip='^(linux-vdso|libc\.so|libm\.so|libpthread|libdl\.so|librt\.so|ld-linux|libresolv|libcuda\.so|libcublas|libcudart|libstdc\+\+|libgcc_s|libkfuse)'
for b in .gpu/bin/* .gpu/deps/libkfuse.so.1; do ldd "$b" 2>/dev/null || true; done |
  awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u |
  while read -r name path; do
    [[ $name =~ $skip ]] || cp -L "$path" ".gpu/deps/$name"
  done
du -sh .gpu | cat
