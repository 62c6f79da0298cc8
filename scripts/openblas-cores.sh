#!/usr/bin/env bash
# Prints the OpenBLAS core types (OPENBLAS_CORETYPE values) this CPU can run whose GEMM kernels
# differ, one per line: the AVX2 ones (Haswell, Zen) on any x86-64-v3 CPU, and SkylakeX, the
# AVX-512 one whose small-matrix path the library must steer around (host/blas.c), where the CPU
# has AVX-512. (OpenBLAS 0.3.21 auto-detects Cooperlake on AVX-512-BF16 CPUs but cannot be forced
# to it; its sgemm kernels are SkylakeX's.) Nothing on other architectures.
#   scripts/openblas-cores.sh [--check LIB_USER]   with --check, also proves that the static
#   OpenBLAS inside libkfuse takes each core when forced: LIB_USER is any program linking libkfuse
#   (OpenBLAS names its core on stderr at load under OPENBLAS_VERBOSE=2); exits 1 if one is not.
#   scripts/openblas-cores.sh --check-auto PROGRAM [ARGS...]   runs PROGRAM (it must call a GEMM
#   through libkfuse) without OPENBLAS_CORETYPE and exits 1 if the kernels libkfuse's OpenBLAS
#   ends on are its Prescott fallback on a CPU with AVX2 and FMA: OpenBLAS 0.3.21 takes them on
#   CPUs newer than it (Emerald Rapids), and host/blas.c then picks by the CPU's features.
set -euo pipefail
[ "$(uname -m)" = x86_64 ] || exit 0
flags=$(grep -m1 '^flags' /proc/cpuinfo)
has() { for f in "$@"; do [[ " $flags " == *" $f "* ]] || return 1; done; }
if [ "${1:-}" = --check-auto ]; then
  shift
  seen=$(env -u OPENBLAS_CORETYPE OPENBLAS_VERBOSE=2 "$@" 2>&1 >/dev/null | sed -n 's/^Core: //p')
  last=$(printf '%s\n' "$seen" | tail -1)
  echo "OpenBLAS cores chosen (at load, then by host/blas.c where it re-picks):" $seen
  if [ -z "$last" ] || { has avx2 fma && [ "$last" = Prescott ]; }; then
    echo "openblas-cores: libkfuse's OpenBLAS runs '$last' kernels on a CPU with AVX2" >&2
    exit 1
  fi
  exit 0
fi
cores=()
has avx2 fma && cores+=(Haswell Zen)
has avx512f avx512bw avx512dq avx512vl avx512cd && cores+=(SkylakeX)
if [ "${1:-}" = --check ]; then
  for core in "${cores[@]}"; do
    got=$(OPENBLAS_VERBOSE=2 OPENBLAS_CORETYPE=$core "$2" 2>&1 >/dev/null | sed -n 's/^Core: //p' | head -1)
    if [ "$got" != "$core" ]; then
      echo "openblas-cores: OPENBLAS_CORETYPE=$core gave core '$got' in $2" >&2
      exit 1
    fi
  done
fi
printf '%s\n' "${cores[@]}"
