#!/usr/bin/env bash
# Compares the ABI of a built libkfuse.so (needs debug info: a RelWithDebInfo or Debug build)
# with the committed baseline abi/kfuse.abi, restricted to what capi/include/kfuse.h declares.
# Any change fails: a removed or changed function or type is a break, and an addition must come
# with a baseline update (run with --update) in the same commit, saying why (docs/abi.md).
#   usage: scripts/abi-check.sh path/to/libkfuse.so [--update]
set -euo pipefail
cd "$(dirname "$0")/.."
lib=${1:?usage: abi-check.sh LIB [--update]}
current=$(mktemp)
trap 'rm -f "$current"' EXIT
abidw --headers-dir capi/include --no-corpus-path --no-show-locs \
  --out-file "$current" "$lib"
if [ "${2:-}" = "--update" ]; then
  cp "$current" abi/kfuse.abi
  echo "abi-check: baseline abi/kfuse.abi updated from $lib"
  exit 0
fi
if abidiff abi/kfuse.abi "$current"; then
  echo "abi-check: ABI identical to abi/kfuse.abi"
else
  echo "abi-check: the ABI differs from abi/kfuse.abi (see above). If the change is intended and" \
       "the version numbers declare it, update the baseline with: $0 $lib --update" >&2
  exit 1
fi
