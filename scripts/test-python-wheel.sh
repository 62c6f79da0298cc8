#!/usr/bin/env bash
# The Python package as a user installs it, from a clean checkout, with nothing prebuilt:
#   1. `python -m build --sdist bindings/python`: the sdist carries the C sources (kfuse-src/),
#   2. a wheel built FROM that sdist (pip wheel, build isolation: scikit-build-core and cffi come
#      from the Python registry), so the sdist is proven self-contained; tagged cp38-abi3,
#   3. the wheel moved elsewhere and installed into a fresh venv (Debian's python3 with its
#      torch 1.13 as system site-packages); the sdist, the wheel's build tree and the moved wheel
#      are deleted; then, from an unrelated directory, kfuse.torch.GRU's forward and backward are
#      checked against torch.nn.GRU (same weights) and kfuse.numpy runs a KANLinear forward:
#      the bundled libkfuse.so.1 is found through the extension's $ORIGIN rpath alone.
# The library is built CPU-only here (-C cmake.define.KF_CUDA=OFF, to keep the lane to about a
# minute on 2 cores); the default build takes the CUDA backend where nvcc exists.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
WORK=$ROOT/build/pywheel
. scripts/lib.sh

bash scripts/install-deps.sh python3 python3-venv python3-torch python3-numpy build-essential cmake
rm -rf "$WORK"
mkdir -p "$WORK"

stage "sdist (python -m build --sdist bindings/python)"
/usr/bin/python3 -m venv "$WORK/tools"
"$WORK/tools/bin/pip" install -q --disable-pip-version-check --upgrade "pip>=23.1" build
"$WORK/tools/bin/python" -m build --sdist -o "$WORK/dist" bindings/python
sdist=$(ls "$WORK"/dist/kfuse-*.tar.gz)
tar tzf "$sdist" > "$WORK/sdist.txt"
grep -q "kfuse-src/capi/include/kfuse.h" "$WORK/sdist.txt" ||
  { echo "test-python-wheel: the sdist lacks the C sources" >&2; exit 1; }

stage "wheel from the sdist (pip wheel, isolated build)"
"$WORK/tools/bin/pip" wheel -q --disable-pip-version-check --no-deps -w "$WORK/dist" \
  -C cmake.define.KF_CUDA=OFF "$sdist"
wheel=$(ls "$WORK"/dist/kfuse-*-cp38-abi3-*.whl)
mkdir -p "$WORK/moved" && mv "$wheel" "$WORK/moved/" && wheel=$WORK/moved/$(basename "$wheel")

stage "fresh venv, install the moved wheel, delete the build products"
/usr/bin/python3 -m venv --system-site-packages "$WORK/venv"
"$WORK/venv/bin/pip" install -q --disable-pip-version-check --no-deps "$wheel"
rm -rf "$WORK/dist" "$WORK/moved" "$WORK/tools" bindings/python/build
site=$("$WORK/venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['platlib'])")
ls "$site/kfuse/libkfuse.so.1" "$site"/kfuse/_kfuse_cffi.abi3.so

stage "forward from the installed wheel"
cd /tmp
env -u LD_LIBRARY_PATH "$WORK/venv/bin/python" - <<'PY'
import numpy as np, torch, kfuse, kfuse.numpy as knp, kfuse.torch as kt
assert kfuse.__file__.startswith(__import__("sysconfig").get_paths()["platlib"]), kfuse.__file__
torch.manual_seed(0)
ref = torch.nn.GRU(7, 16, num_layers=2).double()
gru = kt.GRU(7, 16, num_layers=2)
gru.load_state_dict({k: v.float() for k, v in ref.state_dict().items()})
x = torch.randn(9, 4, 7, dtype=torch.float64)
y_ref, h_ref = ref(x)
y, h = gru(x.float().requires_grad_())
err = max((y.double() - y_ref).abs().max().item(), (h.double() - h_ref).abs().max().item())
assert err < 1e-5, err
y.sum().backward()
assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in gru.parameters())
ctx = kfuse.Context("cpu")
plan = kfuse.KanLinearPlan(ctx, 6, 5)
params = {"grid": knp.kan_uniform_grid(plan),
          "base_weight": np.random.rand(5, 6).astype(np.float32),
          "spline_weight": np.random.rand(5, 6, 8).astype(np.float32),
          "spline_scaler": np.ones((5, 6), np.float32)}
out = knp.kan_forward(plan, np.random.rand(3, 6).astype(np.float32) * 2 - 1, params)
assert out.shape == (3, 5) and np.isfinite(out).all()
print("installed wheel: kfuse %s from %s; GRU vs torch.nn.GRU max err %.1e; KANLinear forward ok"
      % (kfuse.version_string(), kfuse.__file__, err))
PY
stage "wheel lane passed"
