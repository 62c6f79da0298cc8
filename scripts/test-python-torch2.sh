#!/usr/bin/env bash
# The Python suite on the current torch 2.x from PyPI (the torch 1.13 lane is
# scripts/test-python.sh on Debian's python3-torch):
#   1. a virtual environment on Debian's /usr/bin/python3, WITHOUT the system site packages, at
#      ${KFUSE_TORCH2_VENV:-$HOME/.cache/kfuse/venv-torch2}: outside the repository, so that fresh
#      clones on this machine reuse it. Made on first use with PyPI's current torch (the default
#      wheel is the CUDA build: ~5 GB, some minutes the first time; pip's cache is kept), numpy,
#      cffi, pytest (test-python.sh adds scikit-build-core); reused while `import torch` works
#      there. A lock serialises concurrent setups.
#   2. scripts/test-python.sh with KFUSE_VENV pointing at it: the C library (build/main, or
#      KFUSE_LIBRARY_DIR), `pip install bindings/python`, pytest tests/python (opcheck, compile,
#      export, vmap tests run here; they skip on torch < 2.4). Exits non-zero on any failure and
#      when pytest collects no test.
# Run from anywhere: bash scripts/test-python-torch2.sh
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${KFUSE_TORCH2_VENV:-$HOME/.cache/kfuse/venv-torch2}
PY=/usr/bin/python3

printf '\n==== torch 2.x environment %s [%s]\n' "$VENV" "$(date +%T)"
bash scripts/install-deps.sh python3 python3-venv
mkdir -p "$(dirname "$VENV")"
(
  flock 9
  if ! "$VENV/bin/python" -c "import torch, numpy, cffi, pytest" 2>/dev/null; then
    rm -rf "$VENV"
    "$PY" -m venv "$VENV"
    "$VENV/bin/pip" install -q --disable-pip-version-check torch numpy "cffi>=1.15" pytest
  fi
) 9>"$VENV.lock"
"$VENV/bin/python" -c "
import sys, torch
print('torch', torch.__version__)
sys.exit(0 if tuple(int(v) for v in torch.__version__.split('.')[:2]) >= (2, 4) else
         'test-python-torch2: torch >= 2.4 needed, found ' + torch.__version__)"

KFUSE_VENV="$VENV" exec bash scripts/test-python.sh
