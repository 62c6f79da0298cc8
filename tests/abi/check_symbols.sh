#!/usr/bin/env bash
# The exported symbol table of libkfuse.so is exactly the set of functions kfuse.h declares
# with KF_API: nothing missing (a declared but unexported function fails to link for users),
# nothing extra (internal or third-party symbols leaking out would become ABI by accident).
#   usage: tests/abi/check_symbols.sh path/to/libkfuse.so
set -euo pipefail
lib=${1:?usage: check_symbols.sh LIB}
header="$(dirname "$0")/../../capi/include/kfuse.h"
declared=$(grep -oE '^KF_API [^(]*\b(kf_[a-z0-9_]+)\(' "$header" | grep -oE 'kf_[a-z0-9_]+\($' | tr -d '(' | sort -u)
exported=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TDBRW]$/ {print $3}' | sort -u)
missing=$(comm -23 <(echo "$declared") <(echo "$exported"))
extra=$(comm -13 <(echo "$declared") <(echo "$exported"))
status=0
[ -n "$missing" ] && { echo "declared in kfuse.h but not exported:"; echo "$missing"; status=1; }
[ -n "$extra" ] && { echo "exported but not declared in kfuse.h:"; echo "$extra"; status=1; }
[ $status -eq 0 ] && echo "check_symbols: $(echo "$declared" | wc -l) functions declared, all exported, nothing else"
exit $status
