#!/usr/bin/env bash
# Two builds of kf_bench_sklinear (say, main's and a change's) alternated run by run, float32,
# bfloat16 and float16, in=out=256 and 8192, L=1, k=16: the smallest of ROUNDS runs' medians per
# cell (milliseconds) and B's time over A's. A loaded or shared box slows both alike.
#
#   bash benches/sklinear_ab.sh A/benches/kf_bench_sklinear B/benches/kf_bench_sklinear [ROUNDS]
#
# Environment: THREADS (default 2), BATCH (64), SHAPES ("256 8192"), DTYPES ("f32 bf16 f16"),
# ENV_B (assignments for B's runs only, e.g. ENV_B=KF_CPU_ISA=avx2 for its baseline kernels).
set -euo pipefail
A=$1 B=$2 ROUNDS=${3:-3}
for _ in $(seq "$ROUNDS"); do
  for s in ${SHAPES:-256 8192}; do
    for d in ${DTYPES:-f32 bf16 f16}; do
      reps=3000; [ "$s" -ge 4096 ] && reps=300
      for w in A B; do
        if [ $w = A ]; then bin=$A pre=(); else bin=$B pre=(${ENV_B:-}); fi
        env "${pre[@]}" "$bin" --in "$s" --out "$s" --B "${BATCH:-64}" --threads "${THREADS:-2}" \
          --reps $reps --dtype "$d" |
          python3 -c "import json,sys; d=json.load(sys.stdin); \
print('$s $d $w', d['fwd_ms_median'], d['fwdbwd_ms_median'])"
      done
    done
  done
done | python3 -c "
import collections, sys
runs = collections.defaultdict(list)
for line in sys.stdin:
    s, dt, w, f, fb = line.split()
    runs[(int(s), dt, w)].append((float(f), float(fb)))
print('| shape | dtype | A fwd | B fwd | B/A | A fwd+bwd | B fwd+bwd | B/A |')
print('|---|---|---|---|---|---|---|---|')
for s, dt in sorted({(k[0], k[1]) for k in runs}):
    a = [min(x[i] for x in runs[(s, dt, 'A')]) for i in (0, 1)]
    b = [min(x[i] for x in runs[(s, dt, 'B')]) for i in (0, 1)]
    cells = [a[0], b[0], b[0] / a[0], a[1], b[1], b[1] / a[1]]
    print(f'| {s}^2 | {dt} | ' + ' | '.join('%.4f' % c if i % 3 < 2 else '%.3f' % c
                                          for i, c in enumerate(cells)) + ' |')
"
