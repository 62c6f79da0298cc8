#!/usr/bin/env bash
# ThreadSanitizer run of the concurrency test (issues 8, 39): builds the CPU library sources and
# tests/c/test_concurrency.c (every op in every dtype: threads with their own contexts, and
# threads taking turns on one context's plans) with clang -fsanitize=thread (CPU-only, no CUDA)
# and runs it; fails on any ThreadSanitizer report or test failure.
#   scripts/tsan.sh [rounds]     (forward+backward rounds per thread, default 3)
#
# OpenMP: every context in the test has num_threads = 1, so each library call's parallel region is
# a team of one and no OpenMP worker threads exist (libgomp/libomp barriers are invisible to TSan
# and would otherwise be reported as false races). LLVM's libomp is used, and its Archer tool
# (libarcher.so, which tells TSan about OpenMP synchronisation) is loaded when present, so a run
# with KF_TSAN_OMP_THREADS > 1 (teams of that many threads inside each context; experimental) also
# stays free of false positives. The OpenBLAS archive is not instrumented: races inside it are not
# visible to TSan (test_concurrency's bit-identity check covers its results instead).
set -euo pipefail
rounds=${1:-3}
root=$(cd "$(dirname "$0")/.." && pwd)
build=${KF_TSAN_BUILD:-$root/build/tsan}
mkdir -p "$build"
cc=$(command -v clang || command -v clang-14)
blas_inc=/usr/include/$(gcc -dumpmachine)/openblas-pthread
blas_lib=/usr/lib/$(gcc -dumpmachine)/openblas-pthread/libopenblas.a
flags=(-std=c11 -O1 -g -fsanitize=thread -fno-omit-frame-pointer -fopenmp -march=x86-64-v3
       -DKF_BUILDING_LIBRARY -DKF_STATIC -I"$root/capi/include" -I"$root/core" -I"$root/host" -I"$root/common"
       -I"$blas_inc" -Wno-pass-failed)
# The library's sources compile in parallel, one per core (the flags go through a response file);
# xargs exits non-zero when any compile fails.
printf '%s\n' "${flags[@]}" >"$build/flags.rsp"
objs=() pairs=()
for src in "$root"/capi/src/*.c "$root"/core/*.c "$root"/host/*.c "$root"/cpu/*.c; do
  obj="$build/$(basename "$(dirname "$src")")_$(basename "$src" .c).o"
  objs+=("$obj") pairs+=("$src" "$obj")
done
printf '%s\0' "${pairs[@]}" | xargs -0 -n2 -P"$(nproc)" sh -c 'exec "$0" @"$1" -c "$2" -o "$3"' \
  "$cc" "$build/flags.rsp"
"$cc" "${flags[@]}" -DKF_CONCURRENCY_STANDALONE -I"$root/tests/c" "$root/tests/c/test_concurrency.c" \
  "${objs[@]}" "$blas_lib" -l:libgfortran.so.5 -lm -lpthread -o "$build/test_concurrency_tsan"

archer=/usr/lib/llvm-14/lib/libarcher.so
[[ -f "$archer" ]] && export OMP_TOOL_LIBRARIES=$archer
export OMP_WAIT_POLICY=PASSIVE
export KF_CONCURRENCY_ROUNDS=$rounds
export TSAN_OPTIONS="halt_on_error=1 exitcode=66 second_deadlock_stack=1 ignore_noninstrumented_modules=1 ${TSAN_OPTIONS:-}"
log="$build/tsan.log"
set +e
"$build/test_concurrency_tsan" >"$log" 2>&1
rc=$?
set -e
tail -3 "$log"
if [[ $rc -ne 0 ]] || grep -q 'WARNING: ThreadSanitizer' "$log"; then
  echo "FAIL: tsan (rc=$rc); log: $log" >&2
  grep -A30 'WARNING: ThreadSanitizer' "$log" | head -60 >&2
  exit 1
fi
echo "tsan: ok, no ThreadSanitizer report ($rounds rounds x 4 threads: own contexts, one context" \
  "in turn; every op x every dtype)"
