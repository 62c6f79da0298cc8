#!/usr/bin/env python3
"""kfuse's PyTorch modules against their reference modules, side by side through PyTorch, in one
run on one device:

  kfuse.torch.GRU   vs torch.nn.GRU
  kfuse.torch.AGRU  vs the eager reference A-GRU (tests/python/agru_reference.py: the Python cell
                    looped over time that users run today)

at T=28 I=28 H=128 B=128 (the main job) and T=784 I=1 H=128 B=128 (pixel sequence; fewer reps),
one layer, fp32, time-major input [T, B, I], h0 = zeros; A-GRU epsilon 1.0 (default) at T=28
and 0.1 at T=784 (see AGRU_EPSILON_LONG). Each pair gets the same weights (the
reference's state_dict loaded into the kfuse module with strict=True) and the same x and dy.

  forward          torch.no_grad(): y, h_n = module(x)
  forward+backward y, h_n = module(x) with x and every parameter requiring grad; y.backward(dy)
                   (grads set to None before each rep)

Before timing, the outputs are compared (y and h_n; then dx and every parameter's gradient), and
the largest absolute difference (and that over max|ref|) is printed beside the times, so the
timing is of the same computation. Then each pass is timed with the reference and kfuse calls
alternating rep by rep (so a change in the box's load hits both alike), after warm-up; median and
min over the reps are reported, in ms, with the ratio kfuse / reference of the medians (< 1 means
kfuse is faster) and its inverse.

Baselines at their best settings: OMP_WAIT_POLICY=PASSIVE and OPENBLAS_THREAD_TIMEOUT=4 are set
before torch is imported (unless already set in the environment; the values used are printed),
and torch.set_num_threads(nproc). kfuse's CPU context uses all online cores. On CUDA, timing is
host clock around the call with torch.cuda.synchronize() before and after, TF32 is off for cuDNN
and matmuls (kfuse computes in fp32), and the same code path runs with device='cuda'.

    build/pyenv/bin/python benches/python_modules.py                 # CPU, and CUDA if available
    build/pyenv/bin/python benches/python_modules.py --quick         # CI smoke (few reps)
    build/pyenv/bin/python benches/python_modules.py --device cpu --out benches/results/python_modules.md

(build/pyenv is the venv scripts/test-python.sh makes: Debian's python3-torch + the kfuse package.)
Options: --device cpu|cuda|all (default all: cpu, plus cuda when torch.cuda.is_available()),
--shapes 28,784, --reps N / --reps-long N (T=28 / T=784 timed reps), --warmup N, --out FILE.md.
Exit status 1 when a comparison fails (a non-finite output or a difference over --tol relative).
"""
import argparse
import datetime
import os
import platform
import statistics
import subprocess
import sys
import time

# Baselines' best thread settings: must precede torch's import (OpenMP reads them at load).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from isa import isa_line, python_cmd  # noqa: E402

SHAPES = {  # key -> (T, I, H, B)
    "28": (28, 28, 128, 128),
    "784": (784, 1, 128, 128),
}
# A-GRU epsilon at T=784: with the default 1.0 the 784-step recurrence (|h| grows to ~700) amplifies
# fp32 rounding without bound: the reference's own fp32 run is off from its fp64 run by ~100% in y
# and its gradients reach 1e16, so two fp32 implementations cannot agree and the timing would not
# be checked. At 0.1 both fp32 runs are within ~1e-4 (relative to max|.|) of fp64. T=28 keeps the
# default 1.0. Speed does not depend on the value.
AGRU_EPSILON_LONG = 0.1
ENV_KEYS = ("OMP_WAIT_POLICY", "OPENBLAS_THREAD_TIMEOUT", "OMP_NUM_THREADS",
            "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "KMP_BLOCKTIME", "LD_LIBRARY_PATH",
            "KFUSE_LIBRARY_DIR")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="few reps (a CI smoke run)")
    p.add_argument("--device", choices=("cpu", "cuda", "all"), default="all",
                   help="cpu, cuda, or all (default: cpu, plus cuda when available)")
    p.add_argument("--shapes", default="28,784", help="comma list of 28 and/or 784")
    p.add_argument("--reps", type=int, default=None, help="timed reps at T=28 (20; quick 3)")
    p.add_argument("--reps-long", type=int, default=None, help="timed reps at T=784 (5; quick 1)")
    p.add_argument("--warmup", type=int, default=None, help="warm-up calls (T=28: 3, T=784: 1; "
                   "quick: 1)")
    p.add_argument("--tol", type=float, default=1e-3,
                   help="fail when max|diff| / max|ref| exceeds this (default 1e-3)")
    p.add_argument("--out", default=None, help="write the table and machine info to FILE.md")
    a = p.parse_args(argv)
    for s in a.shapes.split(","):
        if s.strip() not in SHAPES:
            p.error("--shapes: unknown shape %r (known: %s)" % (s, ",".join(SHAPES)))
    return a


# ---- machine info ------------------------------------------------------------------------------

def sh(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def cpu_model():
    for line in sh(["lscpu"]).splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "?"


def loadavg():
    try:
        return os.getloadavg()
    except OSError:
        return (float("nan"),) * 3


def uptime_line():
    return sh(["uptime"]) or "load average: %.2f, %.2f, %.2f" % loadavg()


# ---- timing ------------------------------------------------------------------------------------

def make_sync(device):
    import torch
    if device == "cuda":
        return torch.cuda.synchronize
    return lambda: None


def time_pair(fn_ref, fn_kf, reps, warmup, sync):
    """Alternating ref, kfuse calls; lists of ms (ref, kfuse) over `reps` after `warmup`."""
    tr, tk = [], []
    for i in range(warmup + reps):
        for fn, out in ((fn_ref, tr), (fn_kf, tk)):
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            t1 = time.perf_counter()
            if i >= warmup:
                out.append((t1 - t0) * 1e3)
    return tr, tk


# ---- comparison --------------------------------------------------------------------------------

def maxdiff(pairs):
    """(max |a - b|, that / max |b|, all finite) over [(kfuse tensor, ref tensor), ...]."""
    import torch
    d, m, finite = 0.0, 0.0, True
    for a, b in pairs:
        a, b = a.detach().double(), b.detach().double()
        finite = finite and bool(torch.isfinite(a).all()) and bool(torch.isfinite(b).all())
        d = max(d, float((a - b).abs().max()))
        m = max(m, float(b.abs().max()))
    return d, (d / m if m > 0 else d), finite


def run_pair(name, ref, kf, x, dy, reps, warmup, device):
    """Checks then times one (reference, kfuse) module pair; returns result rows."""
    import torch
    sync = make_sync(device)
    ref_params = list(ref.parameters())
    kf_params = dict(kf.named_parameters())
    names = [n for n, _ in ref.named_parameters()]

    # ---- agreement: forward
    with torch.no_grad():
        yr, hr = ref(x)
        yk, hk = kf(x)
    fwd_diff = maxdiff([(yk, yr), (hk, hr)])

    # ---- agreement: forward+backward (dx and every parameter gradient)
    xr = x.detach().clone().requires_grad_(True)
    xk = x.detach().clone().requires_grad_(True)

    def fb(module, xg):
        for q in module.parameters():
            q.grad = None
        xg.grad = None
        y, _ = module(xg)
        y.backward(dy)
        return y

    yr2 = fb(ref, xr)
    yk2 = fb(kf, xk)
    grads = [(xk.grad, xr.grad), (yk2, yr2)]
    missing = [n for n in names if kf_params[n].grad is None]
    grads += [(kf_params[n].grad, p.grad) for n, p in zip(names, ref_params)
              if kf_params[n].grad is not None]
    bwd_diff = maxdiff(grads)

    # ---- timing
    def fwd(module):
        def f():
            with torch.no_grad():
                module(x)
        return f

    t_fwd = time_pair(fwd(ref), fwd(kf), reps, warmup, sync)
    t_fb = time_pair(lambda: fb(ref, xr), lambda: fb(kf, xk), reps, warmup, sync)

    rows = []
    for pas, (tr, tk), diff in (("fwd", t_fwd, fwd_diff), ("fwd+bwd", t_fb, bwd_diff)):
        rows.append(dict(op=name, pass_=pas, reps=reps, warmup=warmup,
                         ref_med=statistics.median(tr), ref_min=min(tr),
                         kf_med=statistics.median(tk), kf_min=min(tk),
                         diff=diff[0], rel=diff[1], finite=diff[2],
                         missing=missing if pas == "fwd+bwd" else []))
    return rows


def bench_device(device, shapes, a):
    import torch
    import kfuse.torch as kt

    sys.path.insert(0, os.path.join(REPO, "tests", "python"))
    from agru_reference import AGRU as RefAGRU

    rows = []
    for key in shapes:
        T, I, H, B = SHAPES[key]
        long = T > 100
        if a.quick:
            reps, warmup = (1 if long else 3), 1
        else:
            reps, warmup = (5 if long else 20), (1 if long else 3)
        if a.reps is not None and not long:
            reps = a.reps
        if a.reps_long is not None and long:
            reps = a.reps_long
        if a.warmup is not None:
            warmup = a.warmup

        torch.manual_seed(0)
        x = (torch.rand(T, B, I) * 2 - 1).to(device)
        dy = (torch.rand(T, B, H) * 2 - 1).to(device)

        pairs = []
        ref = torch.nn.GRU(I, H).to(device)
        kf = kt.GRU(I, H, device=device)
        kf.load_state_dict(ref.state_dict(), strict=True)
        pairs.append(("GRU", "torch.nn.GRU", ref, kf))

        eps = AGRU_EPSILON_LONG if long else 1.0
        ref = RefAGRU(I, H, epsilon=eps).to(device)
        kf = kt.AGRU(I, H, epsilon=eps, device=device)
        kf.load_state_dict(ref.state_dict(), strict=True)
        pairs.append(("A-GRU", "reference A-GRU loop, eps=%g" % eps, ref, kf))

        for name, refname, ref, kf in pairs:
            print("  %-5s %-5s T=%d I=%d H=%d B=%d: %d reps after %d warm-up ..."
                  % (device, name, T, I, H, B, reps, warmup), flush=True)
            for r in run_pair(name, ref, kf, x, dy, reps, warmup, device):
                r.update(device=device, T=T, I=I, H=H, B=B, ref=refname)
                rows.append(r)
                print("    %-8s ref %9.3f ms  kfuse %9.3f ms  kfuse/ref %.3fx  max|diff| %.2e "
                      "(%.1e of max|ref|)" % (r["pass_"], r["ref_med"], r["kf_med"],
                                             r["kf_med"] / r["ref_med"], r["diff"], r["rel"]),
                      flush=True)
    return rows


# ---- report ------------------------------------------------------------------------------------

def table(rows):
    head = ("| device | T | I | H | B | op | pass | reference | ref median ms | ref min ms "
            "| kfuse median ms | kfuse min ms | kfuse/ref | speed-up | max abs diff "
            "| diff / max abs ref | reps |")
    out = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        ratio = r["kf_med"] / r["ref_med"]
        out.append("| %s | %d | %d | %d | %d | %s | %s | %s | %.3f | %.3f | %.3f | %.3f | %.3fx "
                   "| %.1fx | %.2e | %.1e | %d+%d |" % (
                       r["device"], r["T"], r["I"], r["H"], r["B"], r["op"], r["pass_"],
                       r["ref"], r["ref_med"], r["ref_min"], r["kf_med"], r["kf_min"], ratio,
                       1.0 / ratio, r["diff"], r["rel"], r["warmup"], r["reps"]))
    return "\n".join(out)


def info_lines(a, devices, load_before, load_after, up_before, up_after, t_wall):
    import torch
    import kfuse
    lines = [
        "- date: %s" % datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S"),
        "- command: `%s`" % " ".join([os.path.relpath(sys.executable, REPO)
                                      if sys.executable.startswith(REPO) else sys.executable]
                                     + [os.path.relpath(sys.argv[0], REPO)
                                        if os.path.isabs(sys.argv[0]) else sys.argv[0]]
                                     + sys.argv[1:]),
        "- CPU (lscpu): %s; nproc %d" % (cpu_model(), os.cpu_count() or 0),
        "- ISA: " + isa_line(
                        os.environ.get("KFUSE_LIBRARY_DIR", os.path.join(REPO, "build", "main")),
                        python_cmd(sys.executable)),
        "- torch %s (torch.get_num_threads() = %d, set to nproc; interop %d); python %s"
        % (torch.__version__, torch.get_num_threads(), torch.get_num_interop_threads(),
           platform.python_version()),
        "- kfuse %s (%s); CPU context on all online cores"
        % (kfuse.version_string(), os.path.dirname(kfuse.__file__)),
        "- env (set before torch was imported): "
        + ", ".join("%s=%s" % (k, os.environ[k]) for k in ENV_KEYS if k in os.environ),
    ]
    if "cuda" in devices:
        lines.append("- CUDA: %s, torch CUDA %s, cuDNN %s; TF32 off (cudnn and matmul)"
                     % (torch.cuda.get_device_name(), torch.version.cuda,
                        torch.backends.cudnn.version()))
    lines += [
        "- load before: `%s`" % up_before,
        "- load after: `%s` (includes this run's own %d threads)" % (up_after,
                                                                     os.cpu_count() or 0),
        "- wall time of the run: %.0f s%s" % (t_wall, " (--quick)" if a.quick else ""),
    ]
    if max(load_before[0], load_after[0]) > 1.0:
        lines.append("- **Provisional:** the 1-minute load average was above 1 (%.2f before, "
                     "%.2f after) on a %d-core box shared with other jobs; times are inflated "
                     "and noisy (the alternating order shares the disturbance between the two "
                     "columns, so ratios are less affected than absolute times)."
                     % (load_before[0], load_after[0], os.cpu_count() or 0))
    return lines


def main(argv=None):
    a = parse_args(argv)
    load_before, up_before = loadavg(), uptime_line()
    t_start = time.time()

    import torch
    import kfuse  # noqa: F401

    nproc = os.cpu_count() or 1
    torch.set_num_threads(nproc)
    devices = ["cpu"] if a.device in ("cpu", "all") else []
    if a.device == "cuda" or (a.device == "all" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            print("python_modules: --device cuda but torch.cuda.is_available() is False",
                  file=sys.stderr)
            return 2
        devices.append("cuda")
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False

    print("kfuse modules vs references through PyTorch %s; torch threads %d (nproc %d); %s"
          % (torch.__version__, torch.get_num_threads(), nproc,
             ", ".join("%s=%s" % (k, os.environ[k]) for k in ENV_KEYS[:2])))
    print("load before: %s" % up_before, flush=True)

    shapes = [s.strip() for s in a.shapes.split(",")]
    rows = []
    for dev in devices:
        rows += bench_device(dev, shapes, a)

    load_after, up_after = loadavg(), uptime_line()
    info = info_lines(a, devices, load_before, load_after, up_before, up_after,
                      time.time() - t_start)
    tab = table(rows)
    print()
    print(tab)
    print()
    print("\n".join(info))

    bad = [r for r in rows if not r["finite"] or r["rel"] > a.tol or r["missing"]]
    for r in bad:
        print("python_modules: %s %s %s T=%d: outputs disagree (max|diff| %.2e, rel %.2e, "
              "finite %s, missing grads %s)" % (r["device"], r["op"], r["pass_"], r["T"],
                                                r["diff"], r["rel"], r["finite"], r["missing"]),
              file=sys.stderr)

    if a.out:
        md = [
            "# kfuse PyTorch modules vs their references (`benches/python_modules.py`)",
            "",
            "kfuse.torch.GRU vs torch.nn.GRU, kfuse.torch.AGRU vs the eager reference A-GRU "
            "(`tests/python/agru_reference.py`), through PyTorch, same weights "
            "(`load_state_dict(strict=True)`), same x and dy, one layer, fp32, time-major, "
            "h0 = zeros; A-GRU epsilon = 1.0 (default) at T=28 and 0.1 at T=784 (with 1.0 the "
            "784-step recurrence amplifies fp32 rounding so much that the reference's own fp32 "
            "run is ~100% off its fp64 run; speed does not depend on it). "
            "fwd: `torch.no_grad()`; fwd+bwd: x and all parameters require grad, "
            "`y.backward(dy)`. Reference and kfuse calls alternate rep by rep; median and min "
            "over the reps after warm-up (reps column: warm-up+timed). kfuse/ref < 1 means "
            "kfuse is faster. max abs diff: y and h_n (fwd); y, dx and every parameter "
            "gradient (fwd+bwd).",
            "",
            tab,
            "",
            "Machine and settings:",
            "",
        ] + info + [""]
        if bad:
            md += ["**Comparison failures:** " + "; ".join(
                "%s %s %s T=%d" % (r["device"], r["op"], r["pass_"], r["T"]) for r in bad), ""]
        d = os.path.dirname(os.path.abspath(a.out))
        os.makedirs(d, exist_ok=True)
        with open(a.out, "w") as f:
            f.write("\n".join(md))
        print("wrote %s" % a.out)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
