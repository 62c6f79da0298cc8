"""GPU benchmark of kfuse's SKLinear against what users run today, side by side in one run on one
device, fp32 with TF32 off everywhere (the precision kfuse computes in). The baselines are
benches/sklinear_baselines.py's (shared with benches/cpu_sklinear.py):

  - dense torch.nn.Linear (cuBLAS), what SKLinear replaces, through autograd;
  - two GEMMs (TwoGemm): the same layer as two GEMMs in eager torch on weights concatenated once
    ahead of the timing; forward = TwoGemm.forward, forward+backward = TwoGemm.forward_backward,
    the minimal GEMMs of the pass written out by hand (no autograd);
  - Panther (PantherCpuSKLinear): Panther's CPU-path kernel sequence (pawX/linear.cpp: expand,
    bmm chains per term, mean over terms; its hand-written bmm backward behind an autograd
    Function) transcribed to eager torch and run on CUDA tensors. Panther's own CUDA kernels
    need its compiled extension, which the GPU machine cannot install; these are not them;
  - kfuse through its C driver `kf_bench_sklinear --device cuda` (benches/bench_sklinear.c).

The two baselines share parameters drawn at Panther's scale (panther_construction_like on the
device: sign sketches, Kaiming W, S = W U^T / U^T W); their outputs and gradients are compared
once per shape (`max_rel_diff` in the JSON rows, max |diff| / max |ref|).

Every column is timed the same way: host clock around the call and a device synchronisation,
after warm-up, median over the repetitions. forward: torch.no_grad(); forward+backward: dx and
every parameter gradient (autograd columns: grads set to None before each rep, as kfuse's
driver overwrites them). Shapes: in=out in {256, 1024, 8192}, B=64, (L, k) in {(1, 16), (4, 32)}.

    python3 benches/gpu_sklinear.py --bench build-gpu/benches/kf_bench_sklinear [--md out.md]
"""
import argparse
import json
import os
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sklinear_baselines import (  # noqa: E402
    PantherCpuSKLinear, TwoGemm, dense, panther_construction_like,
)

SHAPES = [(n, L, k) for n in (256, 1024, 8192) for (L, k) in ((1, 16), (4, 32))]
B = 64


def median(v):
    v = sorted(v)
    return v[len(v) // 2] if len(v) % 2 else 0.5 * (v[len(v) // 2 - 1] + v[len(v) // 2])


def time_ms(fn, reps, warmup):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append((time.perf_counter() - t0) * 1e3)
    return median(out)


def bench_module(m, x, dy, reps, warmup):
    """An nn.Module through autograd: (forward ms, forward+backward ms)."""
    xg = x.detach().clone().requires_grad_(True)

    def fwd():
        with torch.no_grad():
            m(x)

    def fwdbwd():
        for q in m.parameters():
            q.grad = None
        xg.grad = None
        m(xg).backward(dy)
    return time_ms(fwd, reps, warmup), time_ms(fwdbwd, reps, warmup)


def bench_two_gemm(g2, x, dy, reps, warmup):
    """TwoGemm: (forward ms, hand-written forward+backward ms)."""
    def fwd():
        with torch.no_grad():
            g2.forward(x)
    return time_ms(fwd, reps, warmup), time_ms(lambda: g2.forward_backward(x, dy), reps, warmup)


def max_rel_diff(m, g2, x, dy):
    """max |diff| / max |ref| of TwoGemm's (y, dx, dS1s, dS2s, dbias) against module m's."""
    for q in m.parameters():
        q.grad = None
    xg = x.detach().clone().requires_grad_(True)
    y = m(xg)
    y.backward(dy)
    ref = (y, xg.grad, m.S1s.grad, m.S2s.grad, m.bias.grad)
    d = mx = 0.0
    for o, r in zip(g2.forward_backward(x, dy), ref):
        o, r = o.detach().double(), r.detach().double()
        d, mx = max(d, float((o - r).abs().max())), max(mx, float(r.abs().max()))
    for q in m.parameters():
        q.grad = None
    return d / mx if mx > 0 else d


def bench_kfuse(exe, n, L, k, reps, warmup):
    cmd = [exe, "--device", "cuda", "--in", str(n), "--out", str(n), "--L", str(L), "--k", str(k),
           "--B", str(B), "--reps", str(reps), "--warmup", str(warmup)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("{")), None)
    if line is None:
        return {"error": (p.stdout + p.stderr).strip()[-400:] or f"exit {p.returncode}"}
    return json.loads(line)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True, help="path of kf_bench_sklinear")
    ap.add_argument("--md", default=None)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda")
    torch.manual_seed(0)
    env = dict(device=torch.cuda.get_device_name(0), torch=torch.__version__)
    print(json.dumps(env), flush=True)
    rows = []
    for n, L, k in SHAPES:
        x = torch.rand(B, n, device=dev) * 2 - 1
        dy = torch.randn(B, n, device=dev)
        res = {}
        m = dense(n, n, dev)
        res["dense"] = bench_module(m, x, dy, a.reps, a.warmup)
        del m
        pm = PantherCpuSKLinear(n, n, L, k, device=dev)
        pm.load_state_dict(panther_construction_like(n, n, L, k, device=dev))
        g2 = TwoGemm(pm)
        rel = max_rel_diff(pm, g2, x, dy)
        res["two_gemm"] = bench_two_gemm(g2, x, dy, a.reps, a.warmup)
        res["panther_bmm"] = bench_module(pm, x, dy, a.reps, a.warmup)
        del pm, g2
        r = bench_kfuse(a.bench, n, L, k, a.reps, a.warmup)
        if "error" in r:
            print(f"kfuse {n} {L} {k}: {r['error']}", file=sys.stderr, flush=True)
            res["kfuse"] = None
        else:
            res["kfuse"] = (r["fwd_ms_median"], r["fwdbwd_ms_median"])
        row = dict(n=n, L=L, k=k, B=B, **res, max_rel_diff=rel)
        print(json.dumps(row), flush=True)
        rows.append(row)

    def cell(v, i):
        return "n/a" if v is None else f"{v[i]:.4f}"

    def ratio(a_, b_, i):
        return "n/a" if a_ is None or b_ is None else f"{b_[i] / a_[i]:.2f}x"
    lines = [f"# SKLinear on {env['device']} (fp32, TF32 off), B={B}, median ms over {a.reps} reps",
             "", f"torch {env['torch']}. Columns: kfuse; dense nn.Linear (autograd); the same two "
             "GEMMs in eager torch on pre-concatenated weights (backward: the minimal GEMMs by "
             "hand, no autograd); Panther's CPU-path kernel sequence (expand + bmm chains per "
             "term, its hand-written backward behind an autograd Function) transcribed to eager "
             "torch and run on CUDA (benches/sklinear_baselines.py). Ratios are baseline time / "
             "kfuse time (above 1: kfuse faster).", ""]
    for i, what in ((0, "forward"), (1, "forward+backward")):
        lines += [f"## {what}", "",
                  "| in=out | L | k | kfuse | dense | two GEMMs | Panther (bmm) | dense/kfuse "
                  "| two-GEMM/kfuse | Panther/kfuse |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            kf = r["kfuse"]
            lines.append(f"| {r['n']} | {r['L']} | {r['k']} | {cell(kf, i)} | {cell(r['dense'], i)}"
                         f" | {cell(r['two_gemm'], i)} | {cell(r['panther_bmm'], i)} | "
                         f"{ratio(kf, r['dense'], i)} | {ratio(kf, r['two_gemm'], i)} | "
                         f"{ratio(kf, r['panther_bmm'], i)} |")
        lines.append("")
    md = "\n".join(lines)
    print(md)
    if a.md:
        with open(a.md, "w") as f:
            f.write(md + "\n")


if __name__ == "__main__":
    main()
