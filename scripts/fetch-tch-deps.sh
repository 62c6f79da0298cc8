#!/usr/bin/env bash
# For a machine without ../shared/tch-deps (developer machines and CI have it, and
# scripts/test-tch.sh uses it there): puts the crate sources that bindings/rust/kfuse-tch needs
# and no reachable registry has into build/tch-deps (never committed), each at a pinned revision:
#   tch-rs          0.10.3 (tch + torch-sys; libtorch 1.13)  LaurentMazare/tch-rs   58fcb8b6c4e3
#   ndarray         0.15.6                                   rust-ndarray/ndarray   tag 0.15.6
#   matrixmultiply  0.3.2                                    bluss/matrixmultiply   tag 0.3.2
#   rawpointer      0.2.1                                    bluss/rawpointer       tag v0.2.1
# (tch-rs has no tag for 0.10.3 in its history; 58fcb8b is the first commit at 0.10.3, before
# 0.11's libtorch 2.0.) The other crates tch needs come from Debian (scripts/test-tch.sh
# installs them): thiserror, zip, anyhow, num-complex, half, rand, lazy_static, libc, cc.
#
#   bash scripts/fetch-tch-deps.sh           fetch, then check
#   bash scripts/fetch-tch-deps.sh --check   only check what build/tch-deps holds (exit 1 if not
#                                            all there at the pinned versions)
#
# Where the sources come from: a git repository per crate, named by TCH_RS_GIT, NDARRAY_GIT,
# MATRIXMULTIPLY_GIT, RAWPOINTER_GIT: a local clone or bare mirror (used in place), or a URL
# (cloned bare into build/tch-deps/git/), by default GitHub's. The project's machines cannot
# reach GitHub: there, point the variables at mirrors brought in by other means, e.g.
#   TCH_RS_GIT=/work/.mirror/LaurentMazare+tch-rs/repo bash scripts/fetch-tch-deps.sh
# or unpack the four trees into build/tch-deps/{tch-rs,ndarray,matrixmultiply,rawpointer} by
# hand and run --check. tch-rs's third_party/ (PyTorch's Declarations yaml, only for
# regenerating its bindings) is left out.
set -euo pipefail
cd "$(dirname "$0")/.."
DEPS=${KFUSE_TCH_DEPS:-$PWD/build/tch-deps}  # KFUSE_TCH_DEPS: another place for them

# name  version  crate-manifests-to-check  revision  default-url
SOURCES=(
  "tch-rs 0.10.3 Cargo.toml,torch-sys/Cargo.toml 58fcb8b6c4e38cf1dbfcc58aa79f7ba9ce5b1fbb https://github.com/LaurentMazare/tch-rs"
  "ndarray 0.15.6 Cargo.toml e080d62bb23a1099468c5941345d71e8738472a3 https://github.com/rust-ndarray/ndarray"
  "matrixmultiply 0.3.2 Cargo.toml 38d8f1a74a652683f7ee806296c5ffa7d2717c65 https://github.com/bluss/matrixmultiply"
  "rawpointer 0.2.1 Cargo.toml e4f5800e86acc8cb610430a3f361977480e2b0a6 https://github.com/bluss/rawpointer"
)

# check NAME VERSION MANIFESTS: each manifest under $DEPS/NAME has package version VERSION.
check() {
  local name=$1 version=$2 manifests=$3 m v
  for m in ${manifests//,/ }; do
    if [ ! -f "$DEPS/$name/$m" ]; then
      echo "fetch-tch-deps: $DEPS/$name/$m is missing" >&2
      return 1
    fi
    v=$(sed -n 's/^version *= *"\(.*\)"/\1/p' "$DEPS/$name/$m" | head -1)
    if [ "$v" != "$version" ]; then
      echo "fetch-tch-deps: $DEPS/$name/$m is version '$v', expected $version" >&2
      return 1
    fi
  done
}

if [ "${1:-}" != --check ]; then
  for s in "${SOURCES[@]}"; do
    read -r name version manifests rev url <<<"$s"
    var=$(echo "${name//-/_}_GIT" | tr '[:lower:]' '[:upper:]')
    src=${!var:-$url}
    if [ ! -d "$src" ]; then
      mkdir -p "$DEPS/git"
      [ -d "$DEPS/git/$name" ] || git clone -q --bare "$src" "$DEPS/git/$name"
      src=$DEPS/git/$name
    fi
    echo "fetch-tch-deps: $name $version from $src at ${rev:0:12}"
    rm -rf "$DEPS/$name"
    mkdir -p "$DEPS/$name"
    # A partial mirror that lacks third_party's blobs makes git warn about them even though they
    # are excluded; its messages are shown only when the archive fails.
    if ! git -C "$src" archive "$rev" -- . ':(exclude)third_party' 2>"$DEPS/$name.log" | tar -x -C "$DEPS/$name"; then
      cat "$DEPS/$name.log" >&2
      exit 1
    fi
    rm -f "$DEPS/$name.log"
  done
fi

status=0
for s in "${SOURCES[@]}"; do
  read -r name version manifests _ <<<"$s"
  check "$name" "$version" "$manifests" || status=1
done
[ $status -eq 0 ] && echo "fetch-tch-deps: $DEPS holds tch-rs 0.10.3, ndarray 0.15.6, matrixmultiply 0.3.2, rawpointer 0.2.1"
exit $status
