#!/usr/bin/env bash
# The version has one source, the KF_VERSION_* macros of capi/include/kfuse.h (CMake reads them
# from there). Cargo needs a literal, so the Rust packages repeat it; this holds every copy to the
# header: the workspace version of bindings/rust, the kfuse crate's requirement on kfuse-sys, the
# benchmark crate, and the Python package (whose kfuse.__version__ is the loaded library's).
#   usage: tests/abi/check_versions.sh
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
header="$root/capi/include/kfuse.h"
part() { sed -nE "s/^#define KF_VERSION_$1 ([0-9]+)$/\1/p" "$header"; }
want="$(part MAJOR).$(part MINOR).$(part PATCH)"
status=0
check() { # file, what, found
  if [ "$3" != "$want" ]; then
    echo "$1: $2 is \"$3\", expected \"$want\" (kfuse.h)"
    status=1
  fi
}
check bindings/rust/Cargo.toml "[workspace.package] version" \
  "$(sed -nE 's/^version = "([^"]+)"$/\1/p' "$root/bindings/rust/Cargo.toml")"
check bindings/rust/kfuse/Cargo.toml "the kfuse-sys requirement" \
  "$(sed -nE 's/^kfuse-sys = .*version = "([^"]+)".*$/\1/p' "$root/bindings/rust/kfuse/Cargo.toml")"
check benches/rust/Cargo.toml "version" \
  "$(sed -nE 's/^version = "([^"]+)"$/\1/p' "$root/benches/rust/Cargo.toml")"
check bindings/python/pyproject.toml "[project] version" \
  "$(sed -nE 's/^version = "([^"]+)".*$/\1/p' "$root/bindings/python/pyproject.toml")"
[ $status -eq 0 ] && echo "check_versions: every Rust and Python package is at $want (kfuse.h)"
exit $status
