"""GPU benchmark of kfuse's KANLinear and KANConv2d against efficient-kan's math and a dense GEMM,
side by side in one run on one device, fp32 with TF32 off everywhere (the precision kfuse
computes in):

  - kfuse through its C driver `kf_bench_kan --device cuda` (benches/bench_kan.c: public ABI,
    caller workspace sized by kf_kan_<layer>_workspace_size, its `workspace_bytes` being the
    call's whole extra memory);
  - efficient-kan: the eager-torch transcription of efficient-kan's KANLinear.b_splines and
    forward in benches/cpu_kan.py (kan_forward: materialised bases), run on CUDA tensors;
    KANConv2d: F.unfold + that transcription, folded back (benches/cpu_kan_conv.py's
    conv_kan_forward); forward+backward by autograd, dx and every parameter gradient;
  - a dense GEMM with K = F*(G+k+1) (F = in, or C_in*3*3 patch features with N = B*Ho*Wo rows):
    torch.mm, forward = the one product kfuse's forward is, forward+backward = the pass's three
    products (y = A W, dA = dy W^T, dW = dy^T A), as benches/cpu_kan.py defines it.

Every column is timed the same way: host clock around the call and a device synchronisation,
after warm-up, median over the repetitions (a loop stops early after --budget s). forward:
torch.no_grad(); forward+backward: grads set to None before each rep (kfuse's driver overwrites
them). Parameters as the driver draws them: x U(-1.2, 1.2), weights U(-0.1, 0.1), scaler
U(0.5, 1.5), efficient-kan's initial grid on [-1, 1].

Peak extra memory: efficient-kan's from torch.cuda.max_memory_allocated after
reset_peak_memory_stats, one pass after warm-up, less the memory allocated before it (inputs and
parameters) and less its outputs (y; for forward+backward also dx and the parameter gradients);
kfuse's is the driver's workspace_bytes.

Shapes (G = 5, k = 3): KANLinear (B, in, out) = (1024, 256, 256) and (8192, 1024, 1024);
KANConv2d 3x3, padding 1, B = 128, 32->32 on 28x28 and 32->64 on 32x32. Targets (the issue and
DESIGN.md), PASS/MISS: KANLinear >= 3x faster forward and >= 2.5x forward+backward than
efficient-kan, <= 1/10 of its peak extra memory, within 1.5x of the dense GEMM; KANConv2d (32->32,
28x28, B=128) >= 3x faster (forward and forward+backward) and >= 5x less memory than unfold +
efficient-kan.

    python3 benches/gpu_kan.py --bench build-gpu/benches/kf_bench_kan [--md out.md]
    python3 benches/gpu_kan.py --device cpu --bench build/cpu/benches/kf_bench_kan   # smoke run

--device cpu is a smoke run of the script itself (tiny shapes, few reps, torch on the CPU, memory
from torch.profiler allocation events as benches/cpu_kan.py measures it); its numbers mean
nothing. Exit status 1 when a kfuse run failed.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cpu_kan import G, K_ORD, MIB, kan_forward, peak_alloc  # noqa: E402
from cpu_kan_conv import KERNEL, PAD, conv_kan_forward  # noqa: E402

C = G + K_ORD  # B-spline coefficients per feature
LINEAR = [(1024, 256, 256), (8192, 1024, 1024)]  # (B, in, out)
CONV = [(128, 32, 32, 28, 28), (128, 32, 64, 32, 32)]  # (B, C_in, C_out, H, W)
SMOKE_LINEAR = [(64, 16, 24)]
SMOKE_CONV = [(2, 4, 6, 8, 8)]

dev = None


def sync():
    if dev.type == "cuda":
        torch.cuda.synchronize()


def median(v):
    v = sorted(v)
    return v[len(v) // 2] if len(v) % 2 else 0.5 * (v[len(v) // 2 - 1] + v[len(v) // 2])


def time_ms(fn, reps, warmup, budget):
    """(median ms, reps timed): host clock around fn() and a device synchronisation."""
    for _ in range(warmup):
        fn()
    sync()
    out = []
    t_start = time.perf_counter()
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        out.append((time.perf_counter() - t0) * 1e3)
        if budget > 0 and time.perf_counter() - t_start > budget:
            break
    return median(out), len(out)


def peak_extra(fn, out_bytes):
    """Peak bytes allocated during one fn() beyond what was allocated before it, less out_bytes
    (the pass's outputs). CUDA: max_memory_allocated; CPU (smoke): profiler allocation events."""
    if dev.type != "cuda":
        return peak_alloc(fn) - out_bytes
    sync()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    sync()
    return torch.cuda.max_memory_allocated() - base - out_bytes


def uniform(shape, lo, hi):
    return torch.rand(*shape, device=dev) * (hi - lo) + lo


def kan_params(n_out, nF):
    """grid [F, G+2k+1] (efficient-kan's initial one on [-1, 1]), base_weight, spline_weight,
    spline_scaler, drawn as bench_kan.c draws them."""
    h = 2.0 / G
    grid = (torch.arange(-K_ORD, G + K_ORD + 1) * h - 1.0).expand(nF, -1).contiguous().to(dev)
    params = [uniform((n_out, nF), -0.1, 0.1), uniform((n_out, nF, C), -0.1, 0.1),
              uniform((n_out, nF), 0.5, 1.5)]
    return grid, params


def bench_torch(forward, x, grid, params, dy, A, Wt, dyr, a):
    """efficient-kan's math (forward(x, grid, params)) and the dense GEMM A [N, K] x Wt [K, out]
    (dyr [N, out]): ({"ekan": (fwd, fwdbwd), "gemm": (fwd, fwdbwd)} ms, ekan peak extra bytes
    (fwd, fwdbwd), reps timed)."""
    xg = x.detach().clone().requires_grad_(True)
    pg = [q.detach().clone().requires_grad_(True) for q in params]

    def ekan_fwd():
        with torch.no_grad():
            forward(x, grid, params)

    def ekan_fb():
        xg.grad = None
        for q in pg:
            q.grad = None
        forward(xg, grid, pg).backward(dy)

    def gemm_fwd():
        torch.mm(A, Wt)

    def gemm_fb():
        torch.mm(A, Wt), torch.mm(dyr, Wt.t()), torch.mm(dyr.t(), A)

    # memory first, after a warm-up pass of each (lazy initialisation and cuBLAS workspaces are
    # then part of the base), with every gradient cleared before the measured pass
    ekan_fwd()
    ekan_fb()
    xg.grad = None
    for q in pg:
        q.grad = None
    out_f = dy.numel() * 4
    out_b = out_f + (x.numel() + sum(q.numel() for q in params)) * 4
    mem = (peak_extra(ekan_fwd, out_f), peak_extra(ekan_fb, out_b))
    res, reps = {}, {}
    for name, f, fb in (("ekan", ekan_fwd, ekan_fb), ("gemm", gemm_fwd, gemm_fb)):
        tf, nf = time_ms(f, a.reps, a.warmup, a.budget)
        tb, nb = time_ms(fb, a.reps, a.warmup, a.budget)
        res[name], reps[name] = (tf, tb), (nf, nb)
    return res, mem, reps


def bench_kfuse(a, extra):
    cmd = [a.bench, "--device", a.device, "--G", str(G), "--k", str(K_ORD), "--reps",
           str(a.reps), "--warmup", str(a.warmup), "--budget-s", str(int(max(1, a.budget)))]
    try:
        p = subprocess.run(cmd + [str(v) for v in extra], capture_output=True, text=True,
                           timeout=300)
    except (OSError, subprocess.SubprocessError) as e:
        return {"error": str(e)}
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("{")), None)
    if line is None:
        return {"error": (p.stdout + p.stderr).strip()[-400:] or f"exit {p.returncode}"}
    r = json.loads(line)
    if "error" not in r and p.returncode:
        r["error"] = f"exit {p.returncode}"
    return r


def run_shape(layer, s, a):
    torch.manual_seed(0)
    if layer == "linear":
        B, n_in, n_out = s
        nF, N = n_in, B
        x, dy = uniform((B, n_in), -1.2, 1.2), uniform((B, n_out), -1.0, 1.0)
        dyr = dy

        def forward(xx, grid, ps):
            return kan_forward(xx, grid, *ps, K_ORD)
        extra = ["--B", B, "--in", n_in, "--out", n_out]
    else:
        B, cin, n_out, H, W = s
        Ho, Wo = H + 2 * PAD - KERNEL + 1, W + 2 * PAD - KERNEL + 1
        nF, N = cin * KERNEL * KERNEL, B * Ho * Wo
        x, dy = uniform((B, cin, H, W), -1.2, 1.2), uniform((B, n_out, Ho, Wo), -1.0, 1.0)
        dyr = dy.permute(0, 2, 3, 1).reshape(N, n_out)

        def forward(xx, grid, ps):
            return conv_kan_forward(xx, grid, ps, KERNEL, PAD, K_ORD)
        extra = ["--B", B, "--in", cin, "--out", n_out, "--kernel", KERNEL, "--H", H, "--W", W,
                 "--pad", PAD]
    grid, params = kan_params(n_out, nF)
    Kd = nF * (C + 1)
    A, Wt = uniform((N, Kd), 0.0, 1.0), uniform((Kd, n_out), 0.0, 1.0)
    res, mem, reps = bench_torch(forward, x, grid, params, dy, A, Wt, dyr, a)
    del x, dy, dyr, grid, params, A, Wt
    if dev.type == "cuda":
        torch.cuda.empty_cache()  # the driver runs in its own process, on the same device
    r = bench_kfuse(a, extra)
    row = dict(layer=layer, shape=list(s), G=G, k=K_ORD, **res, ekan_peak=list(mem),
               bases_bytes=N * nF * C * 4, reps=reps)
    if "error" in r:
        print(f"kfuse {layer} {s}: {r['error']}", file=sys.stderr, flush=True)
        row.update(kfuse=None, kfuse_ws=None, kfuse_error=r["error"])
    else:
        row.update(kfuse=(r["fwd_ms_median"], r["fwdbwd_ms_median"]),
                   kfuse_ws=r["workspace_bytes"], kfuse_version=r.get("version"),
                   reps=dict(reps, kfuse=(r["fwd_reps"], r["fwdbwd_reps"])))
    print(json.dumps(row), flush=True)
    return row


def main():
    global dev
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bench", required=True, help="path of kf_bench_kan")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                    help="cpu: a smoke run of this script (tiny shapes)")
    ap.add_argument("--md", default=None)
    ap.add_argument("--reps", type=int, default=None, help="default 50 (cpu: 3)")
    ap.add_argument("--warmup", type=int, default=None, help="default 10 (cpu: 1)")
    ap.add_argument("--budget", type=float, default=6.0,
                    help="seconds after which a timed loop stops (at least one rep)")
    ap.add_argument("--layers", default="linear,conv", help="linear, conv or both")
    a = ap.parse_args()
    smoke = a.device == "cpu"
    a.reps = a.reps or (3 if smoke else 50)
    a.warmup = a.warmup if a.warmup is not None else (1 if smoke else 10)
    dev = torch.device(a.device)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if smoke:
        name = "CPU (smoke run: tiny shapes, numbers mean nothing)"
    else:
        name = torch.cuda.get_device_name(0)
    env = dict(device=name, torch=torch.__version__, cuda=torch.version.cuda,
               bench=os.path.abspath(a.bench))
    print(json.dumps(env), flush=True)
    layers = a.layers.split(",")
    plan = [("linear", s) for s in (SMOKE_LINEAR if smoke else LINEAR) if "linear" in layers] + \
           [("conv", s) for s in (SMOKE_CONV if smoke else CONV) if "conv" in layers]
    rows = [run_shape(layer, s, a) for layer, s in plan]

    def ms(v, i):
        return "n/a" if v is None else f"{v[i]:.3f}"

    def mib(b):
        return "n/a" if b is None else f"{b / MIB:.2f} MiB" if b < 100 * MIB else \
            f"{b / MIB:.0f} MiB"

    def ratio(num, den):
        return None if num is None or den is None else (float("inf") if den <= 0 else num / den)

    def fx(v, suffix="x"):
        return "n/a" if v is None else "inf" if v == float("inf") else f"{v:.2f}{suffix}"

    kver = next((r.get("kfuse_version") for r in rows if r.get("kfuse_version")), "?")
    lines = [f"# KANLinear and KANConv2d on {name} (fp32, TF32 off), G={G}, k={K_ORD}, "
             f"median ms over up to {a.reps} reps", "",
             f"torch {env['torch']} (CUDA {env['cuda']}), kfuse {kver} (`kf_bench_kan "
             f"--device {a.device}`). Columns: kfuse (C driver, caller workspace); efficient-kan's "
             "KANLinear math as an eager-torch transcription (benches/cpu_kan.py; KANConv2d: "
             "F.unfold + it, folded back: materialised bases), forward+backward by autograd with "
             "every gradient; a dense GEMM (torch.mm) with K = F*(G+k+1) over N rows (fwd: the "
             "one product; fwd+bwd: the pass's three products). Speed-up = efficient-kan time / "
             "kfuse time; kfuse/GEMM below 1: faster than the GEMM. Peak extra memory: "
             "efficient-kan's %s over one pass less the memory held before it and its outputs "
             "(y; fwd+bwd also dx and the parameter gradients); kfuse's workspace_bytes." % (
                 "torch.profiler allocation events" if smoke else
                 "torch.cuda.max_memory_allocated"), ""]
    for layer, title, head in (
            ("linear", "KANLinear", "(B, in, out)"),
            ("conv", f"KANConv2d {KERNEL}x{KERNEL}, padding {PAD}", "(B, C_in, C_out, H, W)")):
        lr = [r for r in rows if r["layer"] == layer]
        if not lr:
            continue
        lines += [f"## {title}", "",
                  f"| {head} | pass | kfuse ms | efficient-kan ms | GEMM ms | speed-up | "
                  "kfuse/GEMM | peak extra: kfuse | peak extra: efficient-kan | memory ratio |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in lr:
            for i, pas in enumerate(("fwd", "fwd+bwd")):
                kf = r["kfuse"]
                sp = ratio(r["ekan"][i], None if kf is None else kf[i])
                kg = ratio(None if kf is None else kf[i], r["gemm"][i])
                mr = ratio(r["ekan_peak"][i], r["kfuse_ws"])
                lines.append(
                    f"| {tuple(r['shape'])} | {pas} | {ms(kf, i)} | {ms(r['ekan'], i)} | "
                    f"{ms(r['gemm'], i)} | {fx(sp)} | {fx(kg, '')} | {mib(r['kfuse_ws'])} | "
                    f"{mib(r['ekan_peak'][i])} | {fx(mr)} |")
        lines += ["", "Bases tensor efficient-kan materialises ([N, F, G+k] fp32): " + "; ".join(
            f"{tuple(r['shape'])}: {mib(r['bases_bytes'])}" for r in lr) + ".", ""]

    # targets: every KANLinear shape; KANConv2d at its first shape (32->32 on 28x28, B=128)
    targets = []

    def target(what, v, lim, ok):
        targets.append((what, fx(v), lim, "n/a" if v is None else "PASS" if ok(v) else "MISS"))
    for r in rows:
        if r["layer"] == "conv" and r is not next(q for q in rows if q["layer"] == "conv"):
            continue
        kf, tag = r["kfuse"], ("KANLinear " if r["layer"] == "linear" else "KANConv2d ") + \
            str(tuple(r["shape"]))
        for i, pas in enumerate(("fwd", "fwd+bwd")):
            sp = ratio(r["ekan"][i], None if kf is None else kf[i])
            mr = ratio(r["ekan_peak"][i], r["kfuse_ws"])
            if r["layer"] == "linear":
                lim = 3.0 if i == 0 else 2.5
                target(f"{tag} {pas}: speed-up over efficient-kan", sp, f">= {lim}x",
                       lambda v, lim=lim: v >= lim)
                target(f"{tag} {pas}: peak extra memory, efficient-kan / kfuse", mr, ">= 10x",
                       lambda v: v >= 10)
                kg = ratio(None if kf is None else kf[i], r["gemm"][i])
                target(f"{tag} {pas}: kfuse time / dense GEMM time", kg, "<= 1.5x",
                       lambda v: v <= 1.5)
            else:
                target(f"{tag} {pas}: speed-up over unfold + efficient-kan", sp, ">= 3x",
                       lambda v: v >= 3)
                target(f"{tag} {pas}: peak extra memory, unfold+efficient-kan / kfuse", mr,
                       ">= 5x", lambda v: v >= 5)
    lines += ["## Targets (the issue and DESIGN.md)" + (" -- smoke shapes, not the targets' "
              "shapes" if smoke else ""), "", "| target | measured | limit | result |",
              "|---|---:|---:|---|"] + ["| %s | %s | %s | %s |" % t for t in targets]
    lines += ["", f"{sum(t[3] == 'PASS' for t in targets)} PASS, "
              f"{sum(t[3] == 'MISS' for t in targets)} MISS, "
              f"{sum(t[3] == 'n/a' for t in targets)} n/a."]
    md = "\n".join(lines)
    print(md)
    if a.md:
        with open(a.md, "w") as f:
            f.write(md + "\n")
    return 1 if any(r["kfuse"] is None for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
