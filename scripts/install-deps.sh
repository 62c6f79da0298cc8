#!/usr/bin/env bash
# Installs what kfuse needs on a fresh Debian 12 machine (run as root, or with sudo available).
# Idempotent: packages already present are not downloaded again.
#   scripts/install-deps.sh            the project's packages (below)
#   scripts/install-deps.sh PKG...     just these (the Python and Rust test scripts' extras)
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config git
  libopenblas-pthread-dev  # OpenBLAS, linked statically into libkfuse (pinned to 1 thread)
  libcriterion-dev         # C test framework
  zlib1g-dev               # the examples read the gzip'd IDX files
  dataset-fashion-mnist    # the main job's data (IDX files under /usr/share/datasets)
  abigail-tools            # abidw/abidiff: the ABI baseline check
  valgrind
  clang libclang-rt-14-dev libomp-dev  # libFuzzer, ThreadSanitizer (scripts/fuzz.sh, tsan.sh)
  python3 python3-numpy python3-torch  # benchmark baselines (Debian's CPU PyTorch 1.13)
  python3-matplotlib       # the benchmark scripts' SVG plots (benches/plots.py)
  libdnnl-dev              # oneDNN 2.6: the fastest-CPU-GRU baseline in benches/
  doxygen python3-sphinx python3-breathe python3-myst-parser  # the API reference (build-docs.sh)
)

(($#)) && PACKAGES=("$@")

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "install-deps: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
echo "install-deps: all ${#PACKAGES[@]} packages present"
