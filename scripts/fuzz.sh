#!/usr/bin/env bash
# Builds the libFuzzer harnesses of tests/fuzz (clang, ASan + UBSan, CPU-only) and runs each one
# for a bounded time. Fails on any crash, sanitizer report or harness oracle failure.
#   scripts/fuzz.sh [seconds-per-harness]     (default 60)
# Env: KF_FUZZ_BUILD (build dir, default build/fuzz), KF_FUZZ_JOBS (parallel fuzzing
# workers per harness, default 1), KF_FUZZ_WORK (scratch corpus / artifacts, default
# $KF_FUZZ_BUILD/work), KF_FUZZ_SEED (libFuzzer -seed; default a fresh random seed per run),
# KF_FUZZ_RUNS (stop after this many inputs; default unbounded). Every run first replays the
# committed corpus tests/fuzz/corpus/<harness> (read, never written): that part is deterministic,
# and every input a past run failed on is kept there, so a fixed bug stays fixed. The exploration
# after it is not bit-repeatable even from a fixed seed and run count (two runs of the same seed
# keep different inputs: measured), so a failure there is a new finding, not noise: reproduce it
# from the artifact (`$build/<harness> <artifact>`), fix the cause, commit the input to the corpus.
set -euo pipefail
secs=${1:-60}
root=$(cd "$(dirname "$0")/.." && pwd)
build=${KF_FUZZ_BUILD:-$root/build/fuzz}
work=${KF_FUZZ_WORK:-$build/work}
jobs=${KF_FUZZ_JOBS:-1}
cc=${CC:-}
if [[ -z "$cc" || "$cc" != *clang* ]]; then
  cc=$(command -v clang || command -v clang-14 || true)
fi
[[ -n "$cc" ]] || { echo "fuzz.sh: clang not found (apt-get install clang-14 libclang-rt-14-dev)" >&2; exit 2; }

CC=$cc cmake -S "$root/tests/fuzz" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j"$(nproc)" 2>&1 | grep -E 'error|Error' && exit 2 || true
[[ -x "$build/fuzz_rnn" && -x "$build/fuzz_layers" && -x "$build/fuzz_kan_conv" ]] || { echo "fuzz.sh: build failed" >&2; exit 2; }

# OpenMP threads spin-wait by default; the harness keeps contexts at 1-2 threads anyway.
export OMP_WAIT_POLICY=PASSIVE
export ASAN_OPTIONS=${ASAN_OPTIONS:-allocator_may_return_null=1:detect_leaks=0:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

status=0
for h in fuzz_rnn fuzz_layers fuzz_kan_conv; do
  mkdir -p "$work/$h/corpus" "$work/$h/artifacts"
  log="$work/$h/fuzz.log"
  echo "== $h: ${secs}s"
  set +e
  par=()
  [[ "$jobs" -gt 1 ]] && par=(-jobs="$jobs" -workers="$jobs")
  [[ -n "${KF_FUZZ_SEED:-}" ]] && par+=(-seed="$KF_FUZZ_SEED")
  [[ -n "${KF_FUZZ_RUNS:-}" ]] && par+=(-runs="$KF_FUZZ_RUNS")
  # run from the work dir: libFuzzer's -jobs mode writes fuzz-<n>.log into the cwd
  (cd "$work/$h" && exec "$build/$h" -max_total_time="$secs" -print_final_stats=1 -timeout=20 \
    -rss_limit_mb=2048 -max_len=512 "${par[@]}" \
    -artifact_prefix="$work/$h/artifacts/" "$work/$h/corpus" "$root/tests/fuzz/corpus/$h") \
    >"$log" 2>&1
  rc=$?
  set -e
  # with -jobs > 1 the workers log to fuzz-<n>.log in the cwd
  if [[ "$jobs" -gt 1 ]]; then cat "$work/$h"/fuzz-*.log >>"$log" 2>/dev/null; rm -f "$work/$h"/fuzz-*.log; fi
  grep -E '^#[0-9]+ +(DONE|INITED)' "$log" | tail -2 || true
  grep -E '^stat::' "$log" || true
  nfiles=$(ls "$work/$h/corpus" | wc -l)
  echo "   corpus: $nfiles files in $work/$h/corpus"
  if [[ $rc -ne 0 ]] || grep -qE 'ERROR: (AddressSanitizer|libFuzzer|LeakSanitizer)|runtime error:|fuzz_(rnn|layers|kan_conv) oracle' "$log"; then
    echo "FAIL: $h (rc=$rc); log: $log" >&2
    grep -E -A25 'ERROR:|runtime error:|oracle' "$log" | head -60 >&2
    ls "$work/$h/artifacts" >&2
    status=1
  else
    echo "   ok: no crash"
  fi
done
exit $status
