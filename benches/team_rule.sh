#!/bin/bash
# Before/after timing of the CPU team rule (cpu/team.h: a call under 2^21 multiply-adds runs in
# the caller's thread) for two builds of kfuse, interleaved case by case and round by round so
# that a shared box's load falls on both alike: tiny shapes, shapes between 2^20 and 2^21
# multiply-adds (where the rule's bound moved), and large ones (unchanged), on 2 threads.
#
#   bash benches/team_rule.sh BEFORE AFTER [ROUNDS] > raw.txt
#
# BEFORE and AFTER each hold a build's libkfuse.so.1 and its kf_bench_sklinear, kf_bench_kan and
# kf_bench_rnn (copied from build/main and build/main/benches). Prints one line per run:
# round|build|bench|arguments|the bench's fwd/fwdbwd median and min (ms).
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 BEFORE_DIR AFTER_DIR [ROUNDS]" >&2; exit 2; }
export OMP_WAIT_POLICY=PASSIVE
cases=(
    "sklinear|--in 32 --out 32 --L 1 --k 4 --B 4 --reps 3000 --warmup 50"
    "kan|--in 32 --out 32 --B 4 --reps 2000"
    "rnn|--T 4 --I 8 --H 16 --B 2 --reps 3000"
    "kan|--in 64 --out 64 --B 40 --reps 500"
    "rnn|--T 30 --I 32 --H 32 --B 8 --reps 500"
    "sklinear|--in 1024 --out 1024 --L 1 --k 16 --B 64 --reps 100"
    "kan|--in 256 --out 256 --B 1024 --reps 20"
    "rnn|--T 28 --I 28 --H 128 --B 128 --reps 10"
)
for round in $(seq "${3:-5}"); do
    for c in "${cases[@]}"; do
        bench=${c%%|*} args=${c#*|}
        for dir in "$1" "$2"; do
            printf '%s|%s|%s|%s|' "$round" "$dir" "$bench" "$args"
            # shellcheck disable=SC2086 # args is a list of flags
            LD_LIBRARY_PATH="$dir" "$dir/kf_bench_$bench" $args --threads 2 |
                grep -o '"fwd_ms_median.*fwdbwd_ms_min": [0-9.]*'
        done
    done
done
