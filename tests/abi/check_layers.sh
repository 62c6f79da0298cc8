#!/usr/bin/env bash
# The layers include only what docs/architecture.md allows: every quoted #include of a library
# source names a bare header found in one of its folder's allowed folders (no paths, so no
# "../capi/src/x.h" around the include path). capi/src is on no one's list but its own.
#   usage: tests/abi/check_layers.sh
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
allowed() {
  case $1 in
    capi/src) echo "capi/src core host common" ;;
    core) echo "core" ;;
    host) echo "host core common" ;;
    cpu) echo "cpu core host common" ;;
    cuda) echo "cuda core common" ;;
    common) echo "common" ;;
  esac
}
status=0
for dir in capi/src core host cpu cuda common; do
  for f in "$root/$dir"/*.c "$root/$dir"/*.h "$root/$dir"/*.cu "$root/$dir"/*.cuh; do
    [ -f "$f" ] || continue
    while read -r h; do
      [ "$h" = kfuse.h ] && continue
      ok=
      if [[ $h != */* ]]; then
        for a in $(allowed "$dir"); do [ -f "$root/$a/$h" ] && ok=1; done
      fi
      if [ -z "$ok" ]; then
        echo "${f#"$root"/} includes \"$h\": not a header of $(allowed "$dir")"
        status=1
      fi
    done < <(sed -nE 's/^[[:space:]]*#[[:space:]]*include[[:space:]]+"([^"]+)".*/\1/p' "$f")
  done
done
[ $status -eq 0 ] && echo "check_layers: every include is one its layer may make"
exit $status
