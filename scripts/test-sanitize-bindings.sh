#!/usr/bin/env bash
# The sanitizer lane over the bindings: a use-after-free or out-of-bounds access at a binding
# boundary (a binding handing libkfuse a dead or too-small buffer) makes this script fail.
#   1. builds libkfuse with AddressSanitizer + UndefinedBehaviorSanitizer (KF_SANITIZE=ON, gcc's
#      runtimes, CPU backend, library target only) into build/asan-lib, linked with
#      tests/sanitize/blas_asan_check.c through -Wl,--wrap=cblas_sgemm (see below); or takes
#      the ASan build KF_ASAN_BUILD names (scripts/test.sh passes its build/asan, configured the
#      same way with the C tests on: the library's objects are the same),
#   2. installs bindings/python into its own venv build/pyenv-asan (Debian's /usr/bin/python3,
#      --system-site-packages for torch 1.13; the package's rpath points at build/asan-lib) and
#      runs pytest tests/python with libasan preloaded,
#   3. builds libkfuse without sanitizers (RelWithDebInfo, CPU) into build/valgrind-lib (or takes
#      the CPU build KF_CPU_BUILD names: scripts/test.sh passes build/valgrind) and runs
#      `cargo test --offline -p kfuse-sys -p kfuse` (unit, integration and doc tests; the benches
#      crate is skipped) with every test binary under valgrind memcheck (cargo's target runner;
#      the rustup cargo 1.95 here runs the executed doc tests through the runner too, checked;
#      an older cargo, e.g. Debian's fallback, runs them natively), target dir
#      build/rust-valgrind-target.
# Exits non-zero on any ASan/UBSan report, any valgrind error, or any test failure.
# Run after scripts/install-deps.sh; installs the few extra Debian packages it needs itself.
# Took 152 s on 2 cores with the build trees present (builds and pip install ~10 s, pytest under
# ASan ~30 s, the Rust tests under valgrind ~2 min, 95 s of it tests/rnn.rs's finite-difference
# references, now compiled at opt-level 1: about a quarter of that); a cold run on its own adds
# the two library builds and the crates' compile; under scripts/test.sh the two libraries are
# the ones it built already, build/asan and build/valgrind).
#
# Why each setting (keep them narrow: nothing here hides an error inside libkfuse):
#   LD_PRELOAD=libasan.so  python3 is not instrumented; ASan's runtime must come first in the
#                       process or it refuses to start ("ASan runtime does not come first").
#                       libubsan needs no preload (libkfuse loads it as a dependency).
#   LD_PRELOAD+=libstdc++.so  python3 does not link libstdc++, so when ASan starts there is no
#                       __cxa_throw for its interceptor to forward to, and the first C++ exception
#                       torch throws (an expected error, turned into a Python RuntimeError) dies
#                       with "AddressSanitizer: CHECK failed: asan_interceptors.cpp:320
#                       real___cxa_throw != 0". Preloading libstdc++ after libasan resolves it.
#   PYTHONMALLOC=malloc    CPython's pymalloc arenas would hide Python-side buffers (cffi
#                       ffi.new arrays, bytes) from ASan; with malloc every object is its own
#                       ASan allocation with redzones and a free quarantine. torch tensors come
#                       from c10::alloc_cpu (posix_memalign), which ASan intercepts anyway.
#   ASAN_OPTIONS detect_leaks=0  CPython and torch keep allocations until exit by design
#                       (interned objects, op registries); LeakSanitizer would report those.
#   pytest --capture=sys   ASan writes its report to file descriptor 2 and then exits; pytest's
#                       default fd-level capture would swallow it into a temporary file.
#   UBSAN_OPTIONS print_stacktrace=1  a stack with each report (the library is built with
#                       -fno-sanitize-recover=all, so any UBSan report already ends the process).
#   No suppression file is needed: torch 1.13 and CPython 3.11 run this suite clean under these
#   settings (no alloc_dealloc_mismatch, no protect_shadow_gap, no odr reports).
#   blas_asan_check.c      libkfuse reads most tensors (x, dy, weights) inside the statically
#                       linked OpenBLAS, which is not instrumented: a freed dy that only GEMM reads
#                       (the KAN backward) would go unseen. The wrapper checks, before each
#                       cblas_sgemm, that every row GEMM will touch in A, B and C is addressable,
#                       and lets ASan report the first bad byte with its allocation/free stacks.
#   valgrind -q --error-exitcode=99 --exit-on-first-error=yes  any invalid read/write, use of
#                       uninitialised memory in a branch, or bad free fails that test binary (and
#                       so cargo test). Leaks are not checked here (tests/kan.rs Box::leak()s
#                       shapes on purpose; scripts/test.sh's soak + valgrind covers library leaks).
# Environment: JOBS (build parallelism, default nproc), PYTEST_ARGS (extra pytest arguments),
# KF_ASAN_BUILD and KF_CPU_BUILD (existing build trees to use, brought up to date with
# `cmake --build --target kfuse` but not configured again; KF_ASAN_BUILD's libkfuse.so must carry
# the GEMM check: lib.sh's asan_gemm_check).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
JOBS=${JOBS:-$(nproc)}
export OMP_WAIT_POLICY=PASSIVE
PY=/usr/bin/python3
ASAN_LIB=${KF_ASAN_BUILD:-$ROOT/build/asan-lib}
VG_LIB=${KF_CPU_BUILD:-$ROOT/build/valgrind-lib}
VENV=$ROOT/build/pyenv-asan
CARGO_TARGET=$ROOT/build/rust-valgrind-target

. scripts/lib.sh

stage "install dependencies"
export PATH="$HOME/.cargo/bin:$PATH"
PACKAGES=(build-essential cmake pkg-config libopenblas-pthread-dev valgrind
  python3 python3-venv python3-numpy python3-torch python3-dev
  librust-half-dev        # kfuse's bf16/f16 (the half crate)
  librust-criterion-dev)  # the workspace's benches member must resolve, though it is not built
command -v cargo >/dev/null || PACKAGES+=(cargo rustc)
bash scripts/install-deps.sh "${PACKAGES[@]}"

stage "libkfuse with ASan + UBSan ($ASAN_LIB; CPU backend; GEMM operands checked)"
if [ -z "${KF_ASAN_BUILD:-}" ]; then
  gemm_check=$(asan_gemm_check "$ASAN_LIB")
  cmake -S . -B "$ASAN_LIB" -DCMAKE_BUILD_TYPE=Debug -DKF_CUDA=OFF -DKF_SANITIZE=ON \
    -DKF_BUILD_TESTS=OFF -DKF_BUILD_EXAMPLES=OFF -DKF_BUILD_BENCHES=OFF \
    "$gemm_check" >/dev/null
fi
cmake --build "$ASAN_LIB" -j"$JOBS" --target kfuse
nm "$ASAN_LIB/libkfuse.so" | grep -c __wrap_cblas_sgemm >/dev/null ||
  { echo "test-sanitize-bindings: the GEMM check is not linked in" >&2; exit 1; }

LIBASAN=$(gcc -print-file-name=libasan.so)
[ -e "$LIBASAN" ] || { echo "test-sanitize-bindings: gcc's libasan.so not found" >&2; exit 1; }
LIBSTDCXX=$(gcc -print-file-name=libstdc++.so)
asan_env=(LD_PRELOAD="$LIBASAN $LIBSTDCXX" PYTHONMALLOC=malloc ASAN_OPTIONS=detect_leaks=0
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1)

stage "Python: venv $VENV, bindings/python against $ASAN_LIB"
[ -x "$VENV/bin/python" ] || "$PY" -m venv --system-site-packages "$VENV"
"$VENV/bin/python" -c "import cffi, pytest, tqdm, scikit_build_core" 2>/dev/null ||
  "$VENV/bin/pip" install -q --disable-pip-version-check "cffi>=1.15" pytest tqdm \
    "scikit-build-core>=0.10"
# Built from a copy of the sources, so bindings/python gets no build/ or egg-info of ours.
SRC=$(mktemp -d)
trap 'rm -rf "$SRC"' EXIT
cp -r bindings/python "$SRC/python"
rm -rf "$SRC/python/build" "$SRC/python/"*.egg-info
KFUSE_LIBRARY_DIR="$ASAN_LIB" KFUSE_INCLUDE_DIR="$ROOT/capi/include" \
  "$VENV/bin/pip" install -q --disable-pip-version-check --no-build-isolation --no-deps \
  --force-reinstall "$SRC/python"
(cd /tmp && env "${asan_env[@]}" "$VENV/bin/python" -c \
  "import kfuse, torch; print('kfuse', kfuse.version_string(), 'from', kfuse.__file__, '| torch', torch.__version__)")

stage "pytest tests/python under ASan + UBSan"
set +e
env "${asan_env[@]}" "$VENV/bin/python" -m pytest -q -p no:cacheprovider --capture=sys \
  ${PYTEST_ARGS:-} tests/python 2>&1 | tee "$ASAN_LIB/pytest.log"
rc=${PIPESTATUS[0]}
set -e
if grep -qE "AddressSanitizer|runtime error:" "$ASAN_LIB/pytest.log"; then
  echo "test-sanitize-bindings: ASan/UBSan reported an error (exit $rc); log: $ASAN_LIB/pytest.log" >&2
  exit "$((rc ? rc : 1))"
fi
pytest_verdict "test-sanitize-bindings (under ASan)" "$rc"

stage "libkfuse without sanitizers for valgrind ($VG_LIB; RelWithDebInfo, CPU backend)"
if [ -z "${KF_CPU_BUILD:-}" ]; then
  cmake -S . -B "$VG_LIB" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKF_CUDA=OFF \
    -DKF_BUILD_TESTS=OFF -DKF_BUILD_EXAMPLES=OFF -DKF_BUILD_BENCHES=OFF >/dev/null
fi
cmake --build "$VG_LIB" -j"$JOBS" --target kfuse

stage "Rust: cargo test --offline -p kfuse-sys -p kfuse, every test binary under valgrind"
(
  cd bindings/rust
  export KFUSE_LIB_DIR="$VG_LIB" CARGO_TARGET_DIR="$CARGO_TARGET"
  export CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER="valgrind -q --error-exitcode=99 --exit-on-first-error=yes"
  export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="$CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER"
  # The tests' own float64 references (finite differences over every weight) dominate under
  # valgrind; optimised (debug assertions, overflow checks and debug info kept) they take 16 s
  # instead of 65 s (tests/rnn.rs's one-thread finite-difference test, measured on a loaded box).
  # The library is the same build either way; scripts/test-rust.sh runs the unoptimised profile.
  export CARGO_PROFILE_DEV_OPT_LEVEL=1
  # valgrind runs one thread at a time, so the default-threads repeat of the finite-difference
  # test (there to catch races, ~45 s here) cannot show one: it runs natively in
  # scripts/test-rust.sh; its one-thread twin checks the same calls here.
  cargo test --offline -p kfuse-sys -p kfuse -- \
    --skip backward_matches_f64_finite_differences_default_threads
)

stage "sanitizer lane passed"
