#!/usr/bin/env bash
# Installs what is needed, builds kfuse, and runs every test that this machine can run:
#   1. the main build (CUDA backend too when nvcc exists) and its C tests (ctest; CUDA tests skip
#      without a GPU), then again under each OpenBLAS core type the CPU can run (AVX2, AVX-512),
#      and the RNN and SKLinear tests on the AVX2 kernels where the AVX-512 ones run by default,
#   2. the C tests again under AddressSanitizer + UndefinedBehaviorSanitizer (GEMM operands
#      checked too: tests/sanitize/blas_asan_check.c),
#   3. the fast C tests once under valgrind (memcheck, leaks are errors),
#   4. the ABI check: abidiff of the built library against abi/kfuse.abi,
#   5. a C consumer of every form: installed (find_package, pkg-config), build tree,
#      add_subdirectory; shared and static (scripts/test-c-consumers.sh),
#   6. the Python package (cffi; pytest against torch and float64 references, then a bounded soak
#      of every module) on Debian's torch 1.13
#      and on PyPI's torch 2.x (a venv kept in ~/.cache/kfuse), and as users get it:
#      sdist -> wheel (scikit-build-core builds libkfuse) -> moved -> fresh venv -> forward,
#   7. the sanitizer lane over the bindings: the Python tests against an ASan+UBSan libkfuse (GEMM
#      operands checked too), the Rust tests under valgrind (scripts/test-sanitize-bindings.sh),
#      then the Rust crates (bindings-current check, cargo test offline, a bounded soak of every
#      plan) and a downstream crate
#      (examples/rust-consumer: pkg-config dynamic and static, built from source), and the tch-rs
#      interop crate on Debian's libtorch 1.13 (scripts/test-tch.sh: tests, doc tests, example;
#      tch's sources from ../shared/tch-deps, else build/tch-deps, SKIPPED where neither is),
#   8. the API reference (scripts/build-docs.sh: Doxygen over kfuse.h, cargo doc, Sphinx with
#      autodoc and breathe, all with warnings as errors; scripts/check-api-docs.py holds it to
#      every declaration of kfuse.h and every module of the Python package),
#   9. the reliability suite, bounded (libFuzzer 30 s per harness, ThreadSanitizer, soak + valgrind leaks),
#  10. a smoke run of the main job (a few batches) and of the benchmark driver.
# Build trees live under build/: build/main, build/asan (also the sanitizer lane's ASan library),
# build/valgrind (the CPU-only build every later stage that needs one takes), and the reliability
# suite's build/fuzz and build/tsan (docs/architecture.md, "The build"). Took 28-40 min on 2 cores
# before those builds were shared (issue 38); the log ends with each stage's seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
JOBS=${JOBS:-$(nproc)}
export OMP_WAIT_POLICY=PASSIVE

. scripts/lib.sh

stage "install dependencies"
bash scripts/install-deps.sh

stage "README's results table against benches/results/ (scripts/check-readme-figures.py)"
python3 scripts/check-readme-figures.py

stage "build (RelWithDebInfo, KF_CUDA=AUTO)"
# No GPU runs this tree's CUDA code (scripts/gpu-bundle.sh builds for the lent device), so the
# CUDA sources are compiled for one architecture, sm_80, where the library's default is 80 and 90:
# the kernels have no per-architecture paths, and sm_80 has the smaller per-block limits ptxas
# checks. Halves nvcc's share of this build (23 s -> 13 s a file, measured on rnn_fwd_persistent.cu).
cmake -S . -B build/main -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKF_CUDA=AUTO \
  -DCMAKE_CUDA_ARCHITECTURES=80 >/dev/null
cmake --build build/main -j"$JOBS"

stage "C tests"
# One test at a time here, as a user runs them; the later passes over the same tests run $JOBS
# at once (the library's OpenMP teams wait passively, OMP_WAIT_POLICY above, so two tests share
# the cores without spinning; no test writes a file or depends on the machine being idle).
ctest --test-dir build/main --output-on-failure -j1

stage "OpenBLAS's kernels where it does not know the CPU (host/blas.c)"
# one process that calls a GEMM (the sketch initialisation of host/sklinear_init.c); the last core
# it names is the one the run above used
auto=$(bash scripts/openblas-cores.sh --check-auto build/main/benches/kf_bench_sklinear --in 64 \
  --out 64 --reps 1 --warmup 0)
echo "$auto"
default_core=$(printf '%s\n' "$auto" | sed -n 's/^OpenBLAS cores chosen[^:]*: //p' | awk '{print $NF}')

stage "C tests under each other OpenBLAS core type this CPU can run (scripts/openblas-cores.sh)"
# The run above used the core OpenBLAS (or host/blas.c) picked for this CPU. These runs force each
# other one, so one machine proves both the AVX2 kernels and (where the CPU has AVX-512) the
# AVX-512 ones, whose small-matrix path allocates unless host/blas.c steers around it (test_arena
# guards that). Tests labelled no_blas (tests/CMakeLists.txt) never reach OpenBLAS: not rerun.
cores=$(bash scripts/openblas-cores.sh --check build/main/tests/test_header_c99)
for core in $cores; do
  if [ "$core" = "$default_core" ]; then echo "OPENBLAS_CORETYPE=$core: the run above"; continue; fi
  echo "OPENBLAS_CORETYPE=$core"
  OPENBLAS_CORETYPE=$core ctest --test-dir build/main --output-on-failure -j"$JOBS" -LE 'example|no_blas'
done

stage "RNN and SKLinear C tests on the baseline kernels, where the CPU runs the AVX-512 ones"
# A CPU context runs the x86-64-v4 build of the recurrent and sketched-linear kernels where the
# CPU has AVX-512 (cpu/isa.c); KF_CPU_ISA=avx2 makes it run the baseline build of the same
# sources instead.
if grep -qw avx512f /proc/cpuinfo; then
  KF_CPU_ISA=avx2 ctest --test-dir build/main --output-on-failure -j"$JOBS" \
    -R 'rnn|sklinear|lowp|api|arena|threads'
fi

stage "C tests under ASan + UBSan (CPU backend; GEMM operands checked too)"
# libkfuse.so linked with the GEMM check (lib.sh's asan_gemm_check), so that this tree is the
# sanitizer lane's ASan library too (stage 7): one ASan build of the library, not two.
gemm_check=$(asan_gemm_check "$ROOT/build/asan")
cmake -S . -B build/asan -DCMAKE_BUILD_TYPE=Debug -DKF_CUDA=OFF -DKF_SANITIZE=ON \
  -DKF_BUILD_EXAMPLES=OFF -DKF_BUILD_BENCHES=OFF "$gemm_check" >/dev/null
cmake --build build/asan -j"$JOBS"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build/asan --output-on-failure -j"$JOBS"

stage "C tests under valgrind (CPU backend)"
# build/valgrind is the CPU-only build (RelWithDebInfo) that every later stage needing one takes:
# the ABI check, the C and Rust consumers, the sanitizer lane's valgrind half, the soak.
vg_tests=(test_api test_rnn_errors test_rnn)
cmake -S . -B build/valgrind -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKF_CUDA=OFF \
  -DKF_BUILD_EXAMPLES=OFF -DKF_BUILD_BENCHES=OFF >/dev/null
cmake --build build/valgrind -j"$JOBS" --target kfuse kfuse_static "${vg_tests[@]}"
# Criterion runs each test in a worker process: valgrind must follow it (--trace-children) and
# stop it on the first error (Criterion ignores a worker's valgrind exit code otherwise).
# valgrind runs a process's threads one at a time, so two workers at once (--jobs 2: Criterion
# warns that reports may interleave) keep both cores busy where --jobs 1 left one idle.
for t in "${vg_tests[@]}"; do
  [ -x build/valgrind/tests/$t ] || continue
  echo "valgrind $t"
  valgrind -q --trace-children=yes --exit-on-first-error=yes --error-exitcode=99 \
    --leak-check=full --errors-for-leak-kinds=definite \
    build/valgrind/tests/$t --jobs "$JOBS" --no-early-exit
done

stage "ABI check against abi/kfuse.abi"
bash scripts/abi-check.sh build/valgrind/libkfuse.so

stage "C consumers: find_package, pkg-config, build tree, add_subdirectory; shared and static"
bash scripts/test-c-consumers.sh build/valgrind

stage "Python package (scripts/test-python.sh)"
KFUSE_LIBRARY_DIR="$ROOT/build/main" bash scripts/test-python.sh

stage "Python package on torch 2.x from PyPI (scripts/test-python-torch2.sh)"
KFUSE_LIBRARY_DIR="$ROOT/build/main" bash scripts/test-python-torch2.sh

stage "the Python package as users install it (scripts/test-python-wheel.sh)"
bash scripts/test-python-wheel.sh

stage "sanitizer lane over the bindings (scripts/test-sanitize-bindings.sh)"
KF_ASAN_BUILD="$ROOT/build/asan" KF_CPU_BUILD="$ROOT/build/valgrind" \
  bash scripts/test-sanitize-bindings.sh

stage "Rust crates (scripts/test-rust.sh)"
bash scripts/test-rust.sh

stage "a Rust crate outside the workspace, dynamic and static (scripts/test-rust-consumer.sh)"
bash scripts/test-rust-consumer.sh build/valgrind

stage "tch-rs interop crate (scripts/test-tch.sh; tch's sources from ../shared/tch-deps)"
bash scripts/test-tch.sh

stage "API reference (scripts/build-docs.sh; warnings are errors)"
bash scripts/build-docs.sh

stage "reliability: fuzz, TSan, soak (scripts/test-reliability.sh, bounded)"
# 30 s of new inputs per harness after the committed corpus's replay (which is what keeps every
# past finding fixed); the long fresh-seed runs are recorded in benches/results/reliability.md.
KF_SOAK_LIB="$ROOT/build/valgrind" bash scripts/test-reliability.sh 30 10000

if [ -x build/main/examples/train_fmnist ]; then
  stage "main job smoke run (20 batches per epoch)"
  build/main/examples/train_fmnist --epochs 1 --limit-batches 20
fi
if [ -x build/main/benches/kf_bench_rnn ]; then
  stage "benchmark driver smoke run"
  build/main/benches/kf_bench_rnn --cell agru --T 28 --I 28 --H 128 --B 128 --reps 3 --warmup 1
fi
stage "KANConv2d benchmark smoke run (small shape, through the Python package)"
/usr/bin/python3 benches/cpu_kan_conv.py --quick

stage "all tests passed"
stage_times
