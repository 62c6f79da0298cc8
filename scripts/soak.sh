#!/usr/bin/env bash
# Soak (issue 8): builds tests/soak/soak_rnn.c against the release library and runs [calls] GRU /
# A-GRU forward/backward calls with varying shapes inside a fixed, reserved arena, failing if RSS
# grows after warm-up; then a shorter run under valgrind --leak-check=full (or, without valgrind,
# under LeakSanitizer) that fails on any definite/indirect leak or memory error.
#   scripts/soak.sh [calls]        (default 100000; CI: 10000)
# Env: KF_SOAK_BUILD (default build/soak), KF_SOAK_LEAK_CALLS (default 300), KF_SOAK_LIB (an
# existing CPU build of the library to soak, brought up to date but not configured again;
# scripts/test.sh passes build/valgrind, RelWithDebInfo: the release build's -O3 code with -g;
# default: a Release build of its own in $KF_SOAK_BUILD/lib).
set -euo pipefail
calls=${1:-100000}
leak_calls=${KF_SOAK_LEAK_CALLS:-300}
root=$(cd "$(dirname "$0")/.." && pwd)
build=${KF_SOAK_BUILD:-$root/build/soak}
lib=${KF_SOAK_LIB:-$build/lib}
if [ -z "${KF_SOAK_LIB:-}" ]; then
  cmake -S "$root" -B "$lib" -DKF_CUDA=OFF -DKF_BUILD_TESTS=OFF -DKF_BUILD_EXAMPLES=OFF \
    -DKF_BUILD_BENCHES=OFF >/dev/null
fi
mkdir -p "$build"
cmake --build "$lib" -j"$(nproc)" --target kfuse >/dev/null
cc=${CC:-cc}
"$cc" -std=c11 -O2 -g -Wall -Wextra -Werror -D_POSIX_C_SOURCE=200809L -I"$root/capi/include" \
  "$root/tests/soak/soak_rnn.c" -L"$lib" -lkfuse -Wl,-rpath,"$lib" -lm \
  -o "$build/soak_rnn"
export OMP_WAIT_POLICY=PASSIVE
echo "== soak: $calls calls"
"$build/soak_rnn" "$calls"

echo "== leak check: $leak_calls calls"
if command -v valgrind >/dev/null; then
  # OpenMP's thread pool and OpenBLAS's buffers are process-lifetime ("still reachable"); only
  # definite and indirect leaks and memory errors fail the run.
  valgrind --leak-check=full --errors-for-leak-kinds=definite,indirect --show-leak-kinds=definite,indirect \
    --error-exitcode=3 -q "$build/soak_rnn" "$leak_calls" "$leak_calls" >"$build/valgrind.out" 2>"$build/valgrind.log" || {
      echo "FAIL: valgrind reported errors or leaks:" >&2; cat "$build/valgrind.log" >&2; exit 1; }
  echo "valgrind: no leaks, no memory errors"
else
  "$cc" -std=c11 -O1 -g -fsanitize=address -D_POSIX_C_SOURCE=200809L -I"$root/capi/include" \
    "$root/tests/soak/soak_rnn.c" -L"$lib" -lkfuse -Wl,-rpath,"$lib" -lm -o "$build/soak_rnn_lsan"
  ASAN_OPTIONS=detect_leaks=1 "$build/soak_rnn_lsan" "$leak_calls" "$leak_calls" >/dev/null
  echo "LeakSanitizer: no leaks"
fi
