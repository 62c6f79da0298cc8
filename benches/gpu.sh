#!/usr/bin/env bash
# benches/gpu.sh: the one script to run on a GPU machine, from the repository root.
#
#   bash benches/gpu.sh [BUILD_DIR]        (BUILD_DIR defaults to build-gpu; scripts/gpu-bundle.sh
#                                           makes .gpu, the one to carry)
#
# BUILD_DIR is a build configured elsewhere with -DKF_CUDA=ON and carried here; libraries the GPU
# machine lacks (OpenBLAS, Criterion, zlib, ...) sit in BUILD_DIR/deps/. The build's own paths
# (RPATH, CTestTestfile) point at the machine it was built on, so the tests run as executables
# found under BUILD_DIR with LD_LIBRARY_PATH set, the way ctest would run them (--jobs 1).
#
# Parts (KF_GPU_PARTS, run in the order listed; default "tests memcheck racecheck bench_rnn
# bench_sklinear bench_kan"; "sanitizer" is memcheck racecheck):
#   tests           nvidia-smi, then every C test whose name matches one of KF_GPU_TESTS (globs,
#                   default test_*), the KAN tests' big shapes included
#   memcheck        compute-sanitizer memcheck on each CUDA test (Criterion forks a child per
#   racecheck       test: followed), the KAN tests' big shapes left out (minutes under the tool),
#                   test_rnn_cuda's racecheck filtered to the cases that cover every kernel;
#                   KF_GPU_SAN_TESTS names the tests (default: all four)
#   bench_rnn       benches/gpu_rnn.py: kfuse vs cuDNN's GRU and the eager A-GRU loop
#   bench_sklinear  benches/gpu_sklinear.py: vs dense nn.Linear, two GEMMs, Panther's formulation
#   bench_kan       benches/gpu_kan.py: KANLinear and KANConv2d vs efficient-kan's math, a dense
#                   GEMM, peak memory, PASS/MISS against the KAN targets
#   python          benches/gpu-python.sh: the Python package built against BUILD_DIR, its pytest
#                   suite (KF_PYTEST_K: a -k expression, e.g. cuda), benches/python_modules.py and
#                   benches/python_overhead.py on CUDA (KF_PY_PARTS picks among them; needs cffi
#                   and pycparser wheels in .whl/, carried)
#   profile_kan     Nsight Compute's per-kernel time summary (ncu --clock-control none, one metric:
#                   gpu__time_duration) of one kf_bench_kan run, forward and backward, warm-up 1
#                   and 1 rep, at KF_PROFILE_KAN_ARGS (default the big KANLinear shape, --B 8192
#                   --in 1024 --out 1024): which kernels (kan_gen, the cuBLAS products, ...) take
#                   the time; to $OUT/profile_kan.txt
#   kan_lowp        issue 16's low-precision row: kf_bench_kan forward and forward+backward of
#                   KANLinear (1024, 256, 256) and (8192, 1024, 1024) in f32, bf16 and f16 (the
#                   low ones on the tensor cores, cuda/plain.cu), one JSON line each, to
#                   $OUT/kan_lowp.jsonl, and the bf16/f32 and f16/f32 time ratios in the summary
#   skl_lowp        the same for SKLinear (kf_bench_sklinear) at 8192 x 8192, L = 1, k = 16, with
#                   B = 64 (DESIGN.md's shape: latency-bound) and B = 8192, to $OUT/skl_lowp.jsonl
#   rnn_lowp        the same for the GRU and A-GRU (kf_bench_rnn), T = 28, B = 128: H = 128 (the
#                   low plans on the persistent float32 kernels through conversions) and
#                   I = H = 512 (the plain path, input-side products on the tensor cores), to
#                   $OUT/rnn_lowp.jsonl
#   kkan            benches/gpu-python.sh's kkan part: the KKAN (Small) Fashion-MNIST epoch on the
#                   GPU (benches/kkan_epoch.py --device cuda; KF_KKAN_ARGS adds arguments); the
#                   data travels in a bundle made by `scripts/gpu-bundle.sh --python` (.gpu-py)
#
# A lease: KF_GPU_DEADLINE_S (seconds from the start) caps every step at what is left of it, less
# a margin, and skips (SKIP, "deadline") a step that would get under 20 s, so one device call
# ends with its summary inside its own limit: order the parts by what the lease owes most. Each
# step has its own cap too (tests 120 s per binary, sanitizer 150 s per run, benchmarks 240 s); a
# step cut by its cap reads TIMEOUT, never FAIL. Logs go to a scratch folder and come back as one
# file, $OUT/logs.tgz, beside $OUT/summary.txt (the table, printed last, then each benchmark's
# table) and each benchmark's .md: the tool returns at most 8 files.
#
# All parts take longer than one 600-second device call; with a 15-minute lease, one call with
# KF_GPU_DEADLINE_S=540 and the parts in priority order, e.g.
#   KF_GPU_DEADLINE_S=540 KF_GPU_PARTS="tests memcheck bench_kan python racecheck" bash benches/gpu.sh .gpu
# KF_GPU_TESTS runs the tests in the order of its globs (the first glob's matches first).
#
# KF_GPU_PRESET=owed: the first prepared call of issue 36 (the runs the CUDA code of 1.7-1.9
# owes, most owed first), ~470 s: 1.9's order-m KAN path and 1.8's SKLinear epilogue
# (test_kan_deriv, test_sklinear_epilogue: never run on a GPU), the float64 and low-precision
# tests (test_lowp, test_*_f64), then
# test_kan_linear_cuda (its big shapes, {4096, 21, 1024} among them) and every other test; memcheck
# on the first six; the kan_lowp, skl_lowp and rnn_lowp rows; profile_kan. Each of
# KF_GPU_DEADLINE_S, KF_GPU_TESTS, KF_GPU_SAN_TESTS and KF_GPU_PARTS set by the caller wins. The
# second call is the Python one: KF_GPU_PARTS=python KF_PYTEST_K=cuda (carry .gpu and .whl/).
#   KF_GPU_PRESET=owed bash benches/gpu.sh .gpu
set -u
cd "$(dirname "$0")/.." || exit 2
case ${KF_GPU_PRESET:-} in
    "") ;;
    owed)
        KF_GPU_DEADLINE_S=${KF_GPU_DEADLINE_S:-470}
        KF_GPU_TESTS=${KF_GPU_TESTS:-"test_kan_deriv test_sklinear_epilogue test_lowp test_sklinear_f64 test_kan_f64 test_rnn_f64 test_kan_linear_cuda test_*"}
        KF_GPU_SAN_TESTS=${KF_GPU_SAN_TESTS:-"test_kan_deriv test_sklinear_epilogue test_lowp test_sklinear_f64 test_kan_f64 test_rnn_f64"}
        KF_GPU_PARTS=${KF_GPU_PARTS:-"tests memcheck kan_lowp skl_lowp rnn_lowp profile_kan"} ;;
    *) echo "KF_GPU_PRESET=$KF_GPU_PRESET: expected owed (or unset)"; exit 2 ;;
esac
BUILD=$(cd "${1:-build-gpu}" && pwd -P) || { echo "no build directory ${1:-build-gpu}"; exit 2; }
OUT=${OUT:-/tmp/kf-gpu-out}
LOGS=$(mktemp -d /tmp/kf-gpu-logs.XXXX)
mkdir -p "$OUT"
SECONDS=0
DEADLINE=${KF_GPU_DEADLINE_S:-0}

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
pyl=$(echo "$pyl" | paste -sd:)
export LD_LIBRARY_PATH="$BUILD/deps:$BUILD:/usr/local/cuda/lib64:$pyl:${LD_LIBRARY_PATH:-}"
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || echo "")
ALL_TESTS=$(find "$BUILD" -maxdepth 3 -type f -name 'test_*' -perm -u+x ! -name '*.so*' | sort)
test_bin() { echo "$ALL_TESTS" | grep "/$1\$" | head -1; }

declare -a ROWS
row() { ROWS+=("$(printf '%-34s %-8s %s' "$1" "$2" "$3")"); }
T0=0  # start of the current step (SECONDS): rows of timed steps end with its duration
took() { echo "($((SECONDS - T0)) s)"; }
# The verdict of a step's exit status: a step cut by its `timeout` is TIMEOUT (its log ends early;
# rerun it alone with a larger limit), never read as a test failure.
verdict() { case $1 in 0) echo ok ;; 124) echo TIMEOUT ;; *) echo "FAIL($1)" ;; esac; }
# cap CAP: the seconds a step may take, CAP or what the deadline leaves (less 15 s for the
# summary); empty when under 20 s are left.
cap() {
    local c=$1
    if [ "$DEADLINE" -gt 0 ]; then
        local left=$((DEADLINE - SECONDS - 15))
        [ "$left" -lt "$c" ] && c=$left
    fi
    [ "$c" -ge 20 ] && echo "$c"
}

part_tests() {
    nvidia-smi > "$LOGS/tests.log" 2>&1 \
        && row "nvidia-smi" ok "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)" \
        || row "nvidia-smi" FAIL "see tests.log"
    local pass=0 fail=0 failed="" skipped="" t name args rc s g ordered="" seen=" "
    T0=$SECONDS
    # the tests in the order of the globs (the first glob's matches first), each once
    for g in ${KF_GPU_TESTS:-test_*}; do
        for t in $ALL_TESTS; do
            name=$(basename "$t")
            # shellcheck disable=SC2053
            [[ $name == $g ]] || continue
            [[ $seen == *" $name "* ]] && continue
            seen="$seen$name "
            ordered="$ordered $t"
        done
    done
    for t in $ordered; do
        name=$(basename "$t")
        s=$(cap 120) || { skipped="$skipped $name"; continue; }
        case "$name" in test_header_*) args="" ;; *) args="--jobs 1" ;; esac
        echo "=== $name" >> "$LOGS/tests.log"
        timeout "$s" "$t" $args >> "$LOGS/tests.log" 2>&1
        rc=$?
        echo "=== $name rc=$rc" >> "$LOGS/tests.log"
        if [ $rc -eq 0 ]; then pass=$((pass + 1)); else fail=$((fail + 1)); failed="$failed $name($(verdict $rc))"; fi
    done
    row "C tests" "$([ $fail -eq 0 ] && [ $pass -gt 0 ] && echo ok || echo FAIL)" \
        "$pass passed, $fail failed${failed:+:$failed}${skipped:+; deadline skipped:$skipped} $(took)"
    for name in test_rnn_cuda test_sklinear_cuda test_kan_linear_cuda test_kan_conv2d_cuda; do
        local line
        line=$(grep -A400 "^=== $name\$" "$LOGS/tests.log" | grep -m1 'Synthesis' || true)
        row "  $name" "" "${line:-no synthesis line (see tests.log)}"
    done
}

# sanitize TOOL: compute-sanitizer TOOL on each layer's CUDA test; the KAN tests' big shapes and,
# for racecheck, the recurrent cases that add no kernel are filtered out.
sanitize() {
    local tool=$1 name bin filt extra s rc log
    if [ -z "$SAN" ]; then row "$tool" SKIP "compute-sanitizer not found"; return; fi
    for name in ${KF_GPU_SAN_TESTS:-test_kan_linear_cuda test_kan_conv2d_cuda test_rnn_cuda test_sklinear_cuda}; do
        bin=$(test_bin "$name")
        [ -n "$bin" ] || { row "$tool $name" SKIP "not built"; continue; }
        case "$name" in
            test_kan_*) filt="--filter ${name#test_}/!(big_shapes)" ;;
            test_rnn_cuda) [ "$tool" = racecheck ] \
                && filt="--filter rnn_cuda/+(gru_persistent|agru_persistent|agru_per_step|gru_bidirectional_per_step_lengths|many_rows_per_block)" \
                || filt="" ;;
            *) filt="" ;;
        esac
        extra=""
        [ "$tool" = memcheck ] && extra="--leak-check no"
        s=$(cap 150) || { row "$tool $name" SKIP "deadline"; continue; }
        log="$LOGS/sanitizer-$tool-$name.log"
        T0=$SECONDS
        timeout "$s" "$SAN" --tool "$tool" $extra --target-processes all --error-exitcode 86 \
            "$bin" --jobs 1 $filt > "$log" 2>&1
        rc=$?
        row "$tool $name" "$(verdict $rc)" \
            "$(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" || echo "no summary") $(took)"
    done
}

# bench NAME: benches/gpu_NAME.py through the build's kf_bench_NAME; its table to $OUT/gpu_NAME.md,
# its output (JSON rows, then the table) to the logs' gpu_benches.log.
bench() {
    local b=$1 bin s rc
    bin=$(find "$BUILD" -maxdepth 3 -type f -name "kf_bench_$b" -perm -u+x | head -1)
    [ -n "$bin" ] || { row "benches/gpu_$b.py" SKIP "kf_bench_$b not found under $BUILD"; return; }
    s=$(cap 240) || { row "benches/gpu_$b.py" SKIP "deadline"; return; }
    T0=$SECONDS
    echo "=== benches/gpu_$b.py --bench $bin" >> "$LOGS/gpu_benches.log"
    PYTHONUNBUFFERED=1 timeout "$s" python3 "benches/gpu_$b.py" --bench "$bin" \
        --md "$OUT/gpu_$b.md" >> "$LOGS/gpu_benches.log" 2>&1
    rc=$?
    echo "=== benches/gpu_$b.py rc=$rc" >> "$LOGS/gpu_benches.log"
    row "benches/gpu_$b.py" "$(verdict $rc)" "gpu_$b.md / gpu_benches.log $(took)"
}

part_python() {
    local s rc
    s=$(cap 240) || { row "python (gpu-python.sh)" SKIP "deadline"; return; }
    T0=$SECONDS
    OUT="$LOGS" timeout "$s" bash benches/gpu-python.sh "$BUILD" > "$LOGS/gpu-python.out" 2>&1
    rc=$?
    for f in python_modules_gpu.md python_overhead_gpu.md; do
        [ -f "$LOGS/$f" ] && cp "$LOGS/$f" "$OUT/"
    done
    row "python (gpu-python.sh)" "$(verdict $rc)" "$(grep -m1 '^pytest' "$LOGS/gpu-python.out" || echo 'see gpu-python.out') $(took)"
}

part_profile_kan() {
    local bin ncu s rc
    bin=$(find "$BUILD" -maxdepth 3 -type f -name kf_bench_kan -perm -u+x | head -1)
    ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
    [ -n "$bin" ] || { row "profile_kan" SKIP "kf_bench_kan not found under $BUILD"; return; }
    [ -n "$ncu" ] || { row "profile_kan" SKIP "ncu not found"; return; }
    s=$(cap 240) || { row "profile_kan" SKIP "deadline"; return; }
    T0=$SECONDS
    # shellcheck disable=SC2086
    timeout "$s" "$ncu" --clock-control none --metrics gpu__time_duration.sum \
        --print-summary per-kernel "$bin" --device cuda \
        ${KF_PROFILE_KAN_ARGS:---B 8192 --in 1024 --out 1024} --warmup 1 --reps 1 \
        > "$OUT/profile_kan.txt" 2>&1
    rc=$?
    row "profile_kan" "$(verdict $rc)" "profile_kan.txt $(took)"
}

# lowp NAME BINARY LABEL KEYS SHAPE...: BINARY at each SHAPE (its flags) in f32, bf16 and f16, one
# JSON line each to $OUT/NAME.jsonl; $LOGS/NAME.txt has a line per row with its time ratio to the
# f32 row of the same shape (KEYS: the JSON fields that name the shape).
lowp() {
    local name=$1 binname=$2 label=$3 keys=$4 bin s rc shape dt
    shift 4
    bin=$(find "$BUILD" -maxdepth 3 -type f -name "$binname" -perm -u+x | head -1)
    [ -n "$bin" ] || { row "$name" SKIP "$binname not found under $BUILD"; return; }
    s=$(cap 240) || { row "$name" SKIP "deadline"; return; }
    T0=$SECONDS
    rc=0
    : > "$OUT/$name.jsonl"
    for shape in "$@"; do
        for dt in f32 bf16 f16; do
            # shellcheck disable=SC2086
            timeout "$s" "$bin" --device cuda $shape --dtype "$dt" --reps 20 --warmup 3 \
                >> "$OUT/$name.jsonl" 2>> "$LOGS/$name.err" || rc=$?
        done
    done
    python3 - "$OUT/$name.jsonl" "$label" "$keys" > "$LOGS/$name.txt" 2>&1 <<'PY'
import json, sys
label, keys = sys.argv[2], sys.argv[3].split()
rows = [r for r in (json.loads(l) for l in open(sys.argv[1]) if l.startswith("{"))
        if "dtype" in r]
for r in rows:
    shape = tuple(r[k] for k in keys)
    base = next((b for b in rows if b["dtype"] == "f32"
                 and tuple(b[k] for k in keys) == shape), r)
    print("%s (%s) %s: fwd %.4f ms (f32/this %.2fx), fwd+bwd %.4f ms (%.2fx)" % (
        label, ", ".join("%s=%s" % (k, v) for k, v in zip(keys, shape)), r["dtype"],
        r["fwd_ms_median"], base["fwd_ms_median"] / r["fwd_ms_median"],
        r["fwdbwd_ms_median"], base["fwdbwd_ms_median"] / r["fwdbwd_ms_median"]))
PY
    row "$name" "$(verdict $rc)" "$name.jsonl $(took)"
}

part_kkan() {
    local s rc
    s=$(cap 300) || { row "kkan (gpu-python.sh)" SKIP "deadline"; return; }
    T0=$SECONDS
    OUT="$LOGS" KF_PY_PARTS=kkan timeout "$s" bash benches/gpu-python.sh "$BUILD" \
        > "$LOGS/gpu-kkan.out" 2>&1
    rc=$?
    row "kkan (gpu-python.sh)" "$(verdict $rc)" "$(grep -m1 -o '"kfuse_epoch_s[^}]*' "$LOGS/kkan_gpu.log" 2>/dev/null || echo 'see gpu-kkan.out') $(took)"
}

for p in ${KF_GPU_PARTS:-tests memcheck racecheck bench_rnn bench_sklinear bench_kan}; do
    case $p in
        tests) part_tests ;;
        sanitizer) sanitize memcheck; sanitize racecheck ;;
        memcheck | racecheck) sanitize "$p" ;;
        bench_rnn | bench_sklinear | bench_kan) bench "${p#bench_}" ;;
        python) part_python ;;
        kkan) part_kkan ;;
        profile_kan) part_profile_kan ;;
        kan_lowp) lowp kan_lowp kf_bench_kan KANLinear "B in out" \
            "--B 1024 --in 256 --out 256" "--B 8192 --in 1024 --out 1024" ;;
        skl_lowp) lowp skl_lowp kf_bench_sklinear SKLinear "in out L k B" \
            "--in 8192 --out 8192 --L 1 --k 16 --B 64" \
            "--in 8192 --out 8192 --L 1 --k 16 --B 8192" ;;
        rnn_lowp) lowp rnn_lowp kf_bench_rnn RNN "cell T I H B" \
            "--cell gru --T 28 --I 28 --H 128 --B 128" "--cell gru --T 28 --I 512 --H 512 --B 128" \
            "--cell agru --T 28 --I 512 --H 512 --B 128" ;;
        *) row "$p" SKIP "unknown part" ;;
    esac
done

# summary (last): the table, then each benchmark's table; the logs in one archive
{
    echo
    echo "==== kfuse GPU run summary ($SECONDS s${KF_GPU_DEADLINE_S:+, deadline $KF_GPU_DEADLINE_S s}) ===="
    for r in "${ROWS[@]}"; do echo "$r"; done
    for md in "$OUT"/gpu_rnn.md "$OUT"/gpu_sklinear.md "$OUT"/gpu_kan.md "$OUT"/python_modules_gpu.md \
              "$OUT"/python_overhead_gpu.md; do
        [ -f "$md" ] && { echo; cat "$md"; }
    done
    for f in kan_lowp skl_lowp rnn_lowp; do
        [ -s "$LOGS/$f.txt" ] && { echo; cat "$LOGS/$f.txt"; }
    done
} > "$LOGS/summary.txt"
cp "$LOGS/summary.txt" "$OUT/summary.txt"
tar -C "$LOGS" -czf "$OUT/logs.tgz" . && echo "files in $OUT: $(ls "$OUT" | paste -sd' ')" >> "$OUT/summary.txt"
cat "$OUT/summary.txt"
