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
# Steps: nvidia-smi; every C test; compute-sanitizer memcheck and racecheck on test_rnn_cuda;
# benches/gpu_rnn.py (kfuse vs cuDNN's GRU and the eager A-GRU loop). Everything goes to $OUT
# (default /tmp/kf-gpu-out), at most 8 files; a summary table prints last. Aim: under 8 minutes.
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

declare -a ROWS
row() { ROWS+=("$(printf '%-34s %-8s %s' "$1" "$2" "$3")"); }

# 1. the device
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 && row "nvidia-smi" ok "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)" \
    || row "nvidia-smi" FAIL "see nvidia-smi.txt"

# 2. every C test, as ctest would run it
: > "$OUT/tests.log"
tests=$(find "$BUILD" -maxdepth 3 -type f -name 'test_*' -perm -u+x ! -name '*.so*' | sort)
pass=0; fail=0; failed=""
for t in $tests; do
    name=$(basename "$t")
    case "$name" in test_header_*) args="" ;; *) args="--jobs 1" ;; esac
    echo "=== $name" >> "$OUT/tests.log"
    timeout 120 "$t" $args >> "$OUT/tests.log" 2>&1
    rc=$?
    echo "=== $name rc=$rc" >> "$OUT/tests.log"
    if [ $rc -eq 0 ]; then pass=$((pass + 1)); else fail=$((fail + 1)); failed="$failed $name"; fi
done
row "C tests" "$([ $fail -eq 0 ] && [ $pass -gt 0 ] && echo ok || echo FAIL)" "$pass passed, $fail failed${failed:+:$failed}"
cuda_line=$(grep -A100 '^=== test_rnn_cuda$' "$OUT/tests.log" | grep -m1 'Synthesis' || true)
row "  test_rnn_cuda" "" "${cuda_line:-no synthesis line (see tests.log)}"

# 3. compute-sanitizer on the CUDA test (Criterion forks a child per test: follow it)
RNN_CUDA=$(echo "$tests" | grep '/test_rnn_cuda$' | head -1)
if [ -n "$SAN" ] && [ -n "$RNN_CUDA" ]; then
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
        row "compute-sanitizer $tool" "$([ $rc -eq 0 ] && echo ok || echo "FAIL($rc)")" "$errs"
    done
else
    row "compute-sanitizer" SKIP "compute-sanitizer or test_rnn_cuda not found"
fi

# 4. benchmark against cuDNN and the eager A-GRU loop
BENCH=$(find "$BUILD" -maxdepth 3 -type f -name kf_bench_rnn -perm -u+x | head -1)
if [ -n "$BENCH" ]; then
    PYTHONUNBUFFERED=1 timeout 240 python3 benches/gpu_rnn.py --bench "$BENCH" \
        --json "$OUT/gpu_rnn.json" --md "$OUT/gpu_rnn.md" > "$OUT/gpu_rnn.log" 2>&1
    rc=$?
    row "benches/gpu_rnn.py" "$([ $rc -eq 0 ] && echo ok || echo "FAIL($rc)")" "gpu_rnn.md / gpu_rnn.json"
else
    row "benches/gpu_rnn.py" SKIP "kf_bench_rnn not found under $BUILD"
fi

# 5. summary (last)
{
    echo
    echo "==== kfuse GPU run summary ($SECONDS s) ===="
    for r in "${ROWS[@]}"; do echo "$r"; done
    if [ -f "$OUT/gpu_rnn.md" ]; then echo; cat "$OUT/gpu_rnn.md"; fi
    echo
    echo "files in $OUT: $(ls "$OUT" | paste -sd' ')"
} | tee "$OUT/summary.txt"
