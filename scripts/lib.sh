# Shared by the test scripts (sourced, never run): the stage banner and pytest's verdict.

# stage TEXT: ends the stage before it (a line with its seconds), then a banner with the wall
# time and the seconds since the script started. stage_times prints every ended stage's seconds,
# so a CI log shows where its time went.
_kf_stage_name=
_kf_stage_t0=0
_kf_stage_times=()
stage() {
  local now=$SECONDS
  if [ -n "$_kf_stage_name" ]; then
    printf -- '---- %ds: %s\n' "$((now - _kf_stage_t0))" "$_kf_stage_name"
    _kf_stage_times+=("$(printf '%6ds  %s' "$((now - _kf_stage_t0))" "$_kf_stage_name")")
  fi
  _kf_stage_name=$*
  _kf_stage_t0=$now
  printf '\n==== %s [%s, %ds]\n' "$*" "$(date +%T)" "$now"
}
stage_times() {
  [ ${#_kf_stage_times[@]} -gt 0 ] || return 0
  echo "seconds per stage:"
  printf '%s\n' "${_kf_stage_times[@]}"
}

# pytest_verdict WHO RC: turns pytest's exit status into the script's. Status 5 (no test
# collected) is a failure too: a suite that silently ran nothing must not pass.
pytest_verdict() {
  local who=$1 rc=$2
  if [ "$rc" -eq 5 ]; then
    echo "$who: pytest collected no tests: failing" >&2
    return 1
  fi
  if [ "$rc" -ne 0 ]; then
    echo "$who: pytest failed (exit $rc)" >&2
    return "$rc"
  fi
}

# asan_gemm_check DIR: compiles tests/sanitize/blas_asan_check.c into DIR (absolute) and prints
# the CMake argument that links it into libkfuse.so through -Wl,--wrap=cblas_sgemm: an ASan
# libkfuse then checks every GEMM operand that the uninstrumented OpenBLAS reads (see that file).
# scripts/test.sh's ASan build and the sanitizer lane's (scripts/test-sanitize-bindings.sh) use it.
asan_gemm_check() {
  mkdir -p "$1"
  gcc -c -O1 -g -fPIC -fsanitize=address -fno-omit-frame-pointer -Wall -Wextra -Werror \
    -I/usr/include/x86_64-linux-gnu/openblas-pthread -I/usr/include/aarch64-linux-gnu/openblas-pthread \
    tests/sanitize/blas_asan_check.c -o "$1/blas_asan_check.o"
  echo "-DCMAKE_SHARED_LINKER_FLAGS=-Wl,--wrap=cblas_sgemm $1/blas_asan_check.o"
}
