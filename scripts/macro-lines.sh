#!/usr/bin/env bash
# Lines inside multi-line macro bodies (a #define continued by backslashes), per file: total
# lines, macro-body lines and their share, and the longest body (issue 38: kernels written as
# functions, no macro body over ~30 lines).
#   usage: scripts/macro-lines.sh [--max N] FILE...
# With --max N, exits 1 when a file has a macro body longer than N lines (naming it).
set -euo pipefail
max=0
if [ "${1:-}" = --max ]; then max=$2; shift 2; fi
status=0
printf '%-28s %6s %6s %5s %8s  %s\n' file lines macro share longest name
for f in "$@"; do
  read -r total body longest name < <(awk '
    { n++ }
    !inm && /^[[:space:]]*#[[:space:]]*define[[:space:]]/ && /\\[[:space:]]*$/ {
      inm = 1; cur = 0; nm = $0; sub(/^[[:space:]]*#[[:space:]]*define[[:space:]]+/, "", nm)
      sub(/[^A-Za-z0-9_].*/, "", nm); next }
    inm { body++; cur++; if (!/\\[[:space:]]*$/) { inm = 0; if (cur > best) { best = cur; bn = nm } } }
    END { printf "%d %d %d %s\n", n, body, best, (bn == "" ? "-" : bn) }' "$f")
  printf '%-28s %6d %6d %4d%% %8d  %s\n' "$f" "$total" "$body" $((100 * body / (total > 0 ? total : 1))) \
    "$longest" "$name"
  if [ "$max" -gt 0 ] && [ "$longest" -gt "$max" ]; then
    echo "  $f: macro $name has a body of $longest lines (more than $max): write it as a function"
    status=1
  fi
done
exit $status
