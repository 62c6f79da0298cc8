#!/usr/bin/env bash
# Decide once (issue 38): a plan's op table is chosen at plan creation by its backend's select()
# (core/backend.h), so no entry a table lists branches on the dtype, the instruction set or the
# path again. For every op table of the kinds named (default: the recurrent, KAN and SKLinear
# layers), in cpu/, cuda/ and core/, every entry but the first
# (select) must be a function whose definition grep finds (not one a macro pastes together), and
# whose body reads none of: a dtype, the context's ISA, the CUDA plain-path predicate, the
# low-precision predicate, the AVX-512 build flag.
#   usage: tests/abi/check_dispatch.sh [rnn kan skl ...]
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
kinds=("$@")
[ ${#kinds[@]} -gt 0 ] || kinds=(rnn kan skl)
files=()
for f in "$root"/cpu/*.c "$root"/cpu/*.h "$root"/cuda/*.cu "$root"/cuda/*.cuh "$root"/core/*.c; do
  [ -f "$f" ] && files+=("$f")
done
forbidden='dtype|->isa\b|kf__cuda_rnn_plain\(|kf__dtype_is_lowp|KF_HAVE_CPU_V4'
status=0 checked=0
for kind in "${kinds[@]}"; do
  # The entries of every table of this kind: what follows the first (select) in the braces after
  # `kf__<kind>_ops NAME =`, or after `return` in a function that returns such a table (a
  # template's instances), templates' arguments stripped.
  entries=$(for f in "${files[@]}"; do
      awk -v kind="kf__${kind}_ops" '
        index($0, kind) && /=[[:space:]]*(\{|$)/ { on = 1; buf = "" }
        index($0, kind) && /\)[[:space:]]*\{[[:space:]]*$/ { ret = 1 }
        ret && /return[[:space:]]*\{/ { on = 1; buf = ""; ret = 0 }
        on {
          buf = buf $0
          if ($0 ~ /\}/) {
            sub(/^[^{]*\{/, "", buf); sub(/\}.*$/, "", buf)
            n = split(buf, a, ",")
            for (i = 2; i <= n; ++i) print a[i]
            on = 0
          }
        }' "$f"
    done | sed -E 's/<[^>]*>//g; s/^[[:space:]]+|[[:space:]]+$//g' | awk 'NF' | sort -u)
  for e in $entries; do
    [ "$e" = NULL ] || [ "$e" = nullptr ] && continue
    [ -n "${VERBOSE:-}" ] && echo "  $kind: $e"
    defs=0
    while IFS=: read -r f line _; do
      body=$(awk -v start="$line" 'NR >= start { print; if (NR > start && /^}/) exit; if (NR == start && /;[[:space:]]*$/) exit }' "$f")
      # a declaration (the first line ending in ';' before any '{') is not a definition
      head=$(printf '%s\n' "$body" | awk '/\{/ { print "def"; exit } /;[[:space:]]*$/ { print "decl"; exit }')
      [ "$head" = def ] || continue
      defs=$((defs + 1))
      if printf '%s\n' "$body" | grep -Eq "$forbidden"; then
        echo "${f#"$root"/}:$line: op-table entry $e re-dispatches per call:"
        printf '%s\n' "$body" | grep -En "$forbidden" | sed 's/^/    /'
        status=1
      fi
    done < <(grep -EnH "^[A-Za-z_][^#;]*[^A-Za-z0-9_]$e(<[^>]*>)?\(" "${files[@]}" || true)
    if [ $defs -eq 0 ]; then
      echo "op-table entry $e ($kind): no definition grep finds in cpu/, cuda/ or core/"
      status=1
    fi
    checked=$((checked + 1))
  done
done
[ $status -eq 0 ] && echo "check_dispatch: $checked op-table entries (${kinds[*]}), none re-dispatches"
exit $status
