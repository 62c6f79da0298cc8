#!/usr/bin/env bash
# benches/gpu.sh: the one script to run on a GPU machine, from the repository root.
#
#   bash benches/gpu.sh [BUILD_DIR]        (BUILD_DIR defaults to build-gpu)
#
# BUILD_DIR is a build configured elsewhere with -DKF_CUDA=ON and carried here; libraries the GPU
# machine lacks (OpenBLAS, Criterion, zlib, ...) sit in BUILD_DIR/deps/. The build's own paths
# (RPATH, CTestTestfile) point at the machine it was built on, so the tests run as executables
# found under BUILD_DIR with LD_LIBRARY_PATH set, the way ctest would run them (--jobs 1).
#
# Steps (KF_GPU_PARTS, default all: "tests sanitizer bench_rnn bench_sklinear bench_kan"):
# nvidia-smi and every C test (KF_GPU_TESTS: a name glob, default test_*); compute-sanitizer memcheck and
# racecheck on the CUDA tests (150 s each for SKLinear, KANLinear and KANConv2d; test_rnn_cuda's racecheck
# filtered to the cases that cover every kernel); benches/gpu_rnn.py (kfuse vs cuDNN's GRU and the
# eager A-GRU loop); benches/gpu_sklinear.py (kfuse vs dense nn.Linear, two eager GEMMs and
# Panther's formulation); benches/gpu_kan.py (KANLinear and KANConv2d vs efficient-kan's math in
# eager torch, unfold + it, and a dense GEMM with K = F*(G+k+1); peak memory; PASS/MISS against
# the KAN targets). Each benchmark writes its table to gpu_<name>.md; their logs (JSON rows) go to
# one file, gpu_benches.log. Everything goes to $OUT (default /tmp/kf-gpu-out), at most 8 files
# (tests.log, sanitizer-memcheck.log, sanitizer-racecheck.log, gpu_rnn.md, gpu_sklinear.md,
# gpu_kan.md, gpu_benches.log, summary.txt); a summary table prints last, one per call.
#
# All parts take longer than one 600-second device call: run them as three calls, each of which
# fits and prints its own summary (a step cut by its timeout reads TIMEOUT, not FAIL):
#   KF_GPU_PARTS=tests                         every C test, the big shapes included (~3 min)
#   KF_GPU_PARTS=sanitizer                     memcheck + racecheck, big shapes left out (<= 9 min)
#   KF_GPU_PARTS="bench_rnn bench_sklinear bench_kan"                                 (<= 9 min)
set -u
cd "$(dirname "$0")/.."
BUILD=$(cd "${1:-build-gpu}" && pwd -P) || { echo "no build directory ${1:-build-gpu}"; exit 2; }
OUT=${OUT:-/tmp/kf-gpu-out}
mkdir -p "$OUT"
SECONDS=0

pyl=$(python3 - <<'EOF' 2>/dev/null
import importlib.util, os
for m in ("nvidia.cublas", "nvidia.cuda_runtime", "nvidia.cu13"):
    try:
        s = importlib.util.find_spec(m)
    except Exception:
        s = None
    if s and s.submodule_search_locations:
        for d in s.submodule_search_locations:
            for sub in ("lib", "lib64"):
                p = os.path.join(d, sub)
                if os.path.isdir(p):
                    print(p)
EOF
)
export LD_LIBRARY_PATH="$BUILD/deps:$BUILD:/usr/local/cuda/lib64:$(echo "$pyl" | paste -sd:):${LD_LIBRARY_PATH:-}"
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || echo "")

PARTS=" ${KF_GPU_PARTS:-tests sanitizer bench_rnn bench_sklinear bench_kan} "
part() { [[ "$PARTS" == *" $1 "* ]]; }
declare -a ROWS
row() { ROWS+=("$(printf '%-34s %-8s %s' "$1" "$2" "$3")"); }
# The verdict of a step's exit status: a step cut by its `timeout` is TIMEOUT (its log ends early;
# rerun it alone with a larger limit), never read as a test failure.
verdict() { case $1 in 0) echo ok ;; 124) echo TIMEOUT ;; *) echo "FAIL($1)" ;; esac; }

# 1. the device (its report heads tests.log)
nvidia-smi > "$OUT/tests.log" 2>&1 && row "nvidia-smi" ok "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)" \
    || row "nvidia-smi" FAIL "see tests.log"

# 2. every C test, as ctest would run it
tests=$(find "$BUILD" -maxdepth 3 -type f -name "${KF_GPU_TESTS:-test_*}" -perm -u+x ! -name '*.so*' | sort)
pass=0; fail=0; failed=""
run_tests=$tests
part tests || run_tests=""
for t in $run_tests; do
    name=$(basename "$t")
    case "$name" in test_header_*) args="" ;; *) args="--jobs 1" ;; esac
    echo "=== $name" >> "$OUT/tests.log"
    timeout 120 "$t" $args >> "$OUT/tests.log" 2>&1
    rc=$?
    echo "=== $name rc=$rc" >> "$OUT/tests.log"
    if [ $rc -eq 0 ]; then pass=$((pass + 1)); else fail=$((fail + 1)); failed="$failed $name$([ $rc -eq 124 ] && echo '(TIMEOUT)')"; fi
done
row "C tests" "$([ $fail -eq 0 ] && [ $pass -gt 0 ] && echo ok || echo FAIL)" "$pass passed, $fail failed${failed:+:$failed}"
for name in test_rnn_cuda test_sklinear_cuda test_kan_linear_cuda test_kan_conv2d_cuda; do
    cuda_line=$(grep -A400 "^=== $name\$" "$OUT/tests.log" | grep -m1 'Synthesis' || true)
    row "  $name" "" "${cuda_line:-no synthesis line (see tests.log)}"
done

# 3. compute-sanitizer on the CUDA test (Criterion forks a child per test: follow it)
RNN_CUDA=$(echo "$tests" | grep '/test_rnn_cuda$' | head -1)
# memcheck and racecheck on each layer's CUDA test other than the recurrent one (below, whose
# racecheck is filtered); their logs are appended to its logs afterwards (the file budget of $OUT)
if ! part sanitizer; then
    row "compute-sanitizer" SKIP "not in KF_GPU_PARTS"
elif [ -n "$SAN" ]; then
    for name in test_sklinear_cuda test_kan_linear_cuda test_kan_conv2d_cuda; do
        bin=$(echo "$tests" | grep "/$name\$" | head -1)
        [ -n "$bin" ] || continue
        for tool in memcheck racecheck; do
            extra=""
            [ "$tool" = memcheck ] && extra="--leak-check no"
            # the big shapes (a test of their own) take minutes under the sanitizer: left out
            filt="--filter ${name#test_}/!(big_shapes)"
            [ "$name" = test_sklinear_cuda ] && filt=""
            timeout 150 "$SAN" --tool "$tool" $extra --target-processes all --error-exitcode 86 \
                "$bin" --jobs 1 $filt > "$OUT/sanitizer-$tool.log.$name" 2>&1
            rc=$?
            row "$tool $name" "$(verdict $rc)" \
                "$(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer-$tool.log.$name" || echo "no summary")"
        done
    done
fi
if ! part sanitizer; then
    :
elif [ -n "$SAN" ] && [ -n "$RNN_CUDA" ]; then
    for tool in memcheck racecheck; do
        log="$OUT/sanitizer-$tool.log"
        extra=""
        [ "$tool" = memcheck ] && extra="--leak-check no"
        # racecheck is slow: run the cases that cover every kernel (persistent, per step, backward)
        filt=""
        [ "$tool" = racecheck ] && filt="--filter rnn_cuda/+(gru_persistent|agru_persistent|agru_per_step|gru_bidirectional_per_step_lengths|many_rows_per_block)"
        timeout "$([ $tool = memcheck ] && echo 200 || echo 150)" "$SAN" --tool "$tool" $extra --target-processes all --error-exitcode 86 \
            "$RNN_CUDA" --jobs 1 $filt > "$log" 2>&1
        rc=$?
        errs=$(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" || echo "no summary")
        row "$tool test_rnn_cuda" "$(verdict $rc)" "$errs"
    done
else
    row "compute-sanitizer" SKIP "compute-sanitizer or test_rnn_cuda not found"
fi

# the memcheck logs of both tests in one file (the file budget of $OUT)
for f in "$OUT"/sanitizer-*.log.test_*; do
    [ -f "$f" ] && { cat "$f" >> "${f%%.log.*}.log"; rm -f "$f"; }
done

# 4. benchmarks: recurrent layers against cuDNN and the eager A-GRU loop; SKLinear against dense,
#    two eager GEMMs and Panther's formulation; KANLinear and KANConv2d against efficient-kan's
#    math and a dense GEMM. Each .md holds the table; gpu_benches.log every script's output (the
#    JSON rows, then the table), one section each (the file budget of $OUT).
for b in rnn sklinear kan; do
    BENCH=$(find "$BUILD" -maxdepth 3 -type f -name "kf_bench_$b" -perm -u+x | head -1)
    if ! part "bench_$b"; then
        continue
    elif [ -n "$BENCH" ]; then
        echo "=== benches/gpu_$b.py --bench $BENCH" >> "$OUT/gpu_benches.log"
        PYTHONUNBUFFERED=1 timeout 240 python3 "benches/gpu_$b.py" --bench "$BENCH" \
            --md "$OUT/gpu_$b.md" >> "$OUT/gpu_benches.log" 2>&1
        rc=$?
        echo "=== benches/gpu_$b.py rc=$rc" >> "$OUT/gpu_benches.log"
        row "benches/gpu_$b.py" "$(verdict $rc)" "gpu_$b.md / gpu_benches.log"
    else
        row "benches/gpu_$b.py" SKIP "kf_bench_$b not found under $BUILD"
    fi
done

# 5. summary (last)
{
    echo
    echo "==== kfuse GPU run summary ($SECONDS s) ===="
    for r in "${ROWS[@]}"; do echo "$r"; done
    for md in "$OUT/gpu_rnn.md" "$OUT/gpu_sklinear.md" "$OUT/gpu_kan.md"; do [ -f "$md" ] && { echo; cat "$md"; }; done
    echo
    echo "files in $OUT: $(ls "$OUT" | paste -sd' ')"
} | tee "$OUT/summary.txt"
