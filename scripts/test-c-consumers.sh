#!/usr/bin/env bash
# Every form in which a C project links kfuse, each built from tests/consumer and run:
#   1. install (cmake --install) + find_package(kfuse): kfuse::kfuse and kfuse::kfuse_static,
#   2. the same install through pkg-config: shared, and --static (Libs.private),
#   3. the build tree as a package (-Dkfuse_DIR=<build directory>): shared and static,
#   4. add_subdirectory(<this checkout>) inside the consumer's own build (CPU backend).
#   bash scripts/test-c-consumers.sh [BUILD_DIR]   (default build/valgrind: a CPU-only build of
#                                                   the library; scripts/test.sh makes it)
# About a minute on 2 cores (the add_subdirectory form compiles the library once more).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD=$(cd "${1:-build/valgrind}" && pwd)
OUT=$ROOT/build/consumers
rm -rf "$OUT"
mkdir -p "$OUT"

run() { # name, the consumer binary's path, "static" if it must not load libkfuse.so
  echo "consumer ($1):"
  (cd /tmp && "$2")
  if [ "${3:-}" = static ] && ldd "$2" | grep -q libkfuse; then
    echo "test-c-consumers: the $1 consumer loads libkfuse.so" >&2
    exit 1
  fi
}

cmake --install "$BUILD" --prefix "$OUT/prefix" >/dev/null
for static in OFF ON; do
  cmake -S tests/consumer -B "$OUT/package-$static" -DCMAKE_PREFIX_PATH="$OUT/prefix" \
    -DKFUSE_STATIC=$static >/dev/null
  cmake --build "$OUT/package-$static" >/dev/null
  kind=$([ $static = ON ] && echo static || echo shared)
  LD_LIBRARY_PATH="$OUT/prefix/lib" run "find_package, $kind" "$OUT/package-$static/consumer" $kind

  cmake -S tests/consumer -B "$OUT/buildtree-$static" -Dkfuse_DIR="$BUILD" \
    -DKFUSE_STATIC=$static >/dev/null
  cmake --build "$OUT/buildtree-$static" >/dev/null
  run "build tree, $kind" "$OUT/buildtree-$static/consumer" $kind
done

export PKG_CONFIG_PATH="$OUT/prefix/lib/pkgconfig"
# shellcheck disable=SC2046  # pkg-config prints several words on purpose
cc tests/consumer/consumer.c $(pkg-config --cflags --libs kfuse) -o "$OUT/consumer_pc"
LD_LIBRARY_PATH="$OUT/prefix/lib" run "pkg-config" "$OUT/consumer_pc"
# --static: link libkfuse.a itself (the -l would prefer the .so) with Libs.private
# shellcheck disable=SC2046
cc tests/consumer/consumer.c $(pkg-config --cflags kfuse) "$OUT/prefix/lib/libkfuse.a" \
  $(pkg-config --static --libs-only-other --libs-only-L kfuse) \
  $(pkg-config --static --libs-only-l kfuse | sed 's/-lkfuse\b//') -o "$OUT/consumer_pc_static"
run "pkg-config --static" "$OUT/consumer_pc_static" static

cmake -S tests/consumer -B "$OUT/subdirectory" -DKFUSE_FORM=subdirectory \
  -DKFUSE_SOURCE_DIR="$ROOT" -DKF_CUDA=OFF -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$OUT/subdirectory" -j"$(nproc)" >/dev/null
run "add_subdirectory" "$OUT/subdirectory/consumer"
echo "test-c-consumers: every form built and ran"
