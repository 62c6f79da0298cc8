"""GPU benchmark of kfuse's recurrent layers against what users run today, side by side in one run
on one device, all fp32:

  - torch.nn.GRU on CUDA (cuDNN), with TF32 off (the precision kfuse computes in) and, for the
    record, with torch's default cuDNN TF32 setting;
  - the eager Python A-GRU loop (benches/agru_ref.py) on CUDA;
  - kfuse through its C driver `kf_bench_rnn --device cuda` (benches/bench_rnn.c), which times
    each repetition from enqueue to kf_context_synchronize with a host clock.

The torch rows are timed the same way as the driver (host clock around the call and a
torch.cuda.synchronize()), after warm-up, and the median over the repetitions is reported, so the
three columns are comparable. Shapes, one layer: the main job (T=28, I=28, H=128, B=128), the
pixel sequence (T=784, I=1, H=128, B=128), the wider hidden sizes H=256 and H=512 at B=64 (T=28,
I=28; kfuse's per-step path) and a B=1 decode step (T=1, I=28, H=128). Each is reported per call
and per recurrent step, forward and forward+backward. The decode step (T*B <= 64) runs 5x the
repetitions so that their medians rest on enough samples; the whole script takes about a minute.

    python3 benches/gpu_rnn.py --bench build-gpu/benches/kf_bench_rnn \
        [--json out.json] [--md out.md] [--reps 20] [--warmup 5]
"""
import argparse
import json
import os
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from agru_ref import AGRU  # noqa: E402

SHAPES = [dict(T=28, I=28, H=128, B=128), dict(T=784, I=1, H=128, B=128),
          dict(T=28, I=28, H=256, B=64), dict(T=28, I=28, H=512, B=64),
          dict(T=1, I=28, H=128, B=1)]


def reps_for(s, reps):
    """Repetitions for shape s: more for the short calls, fewer for the eager loop at T=784."""
    return reps * 5 if s["T"] * s["B"] <= 64 else reps


def median(v):
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])


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
    return median(out), min(out)


def bench_torch(module, x, reps, warmup):
    """(fwd median, fwd min, fwd+bwd median, fwd+bwd min) in ms."""
    def fwd():
        with torch.no_grad():
            module(x)

    xg = x.detach().clone().requires_grad_(True)
    dy = None

    def fwdbwd():
        nonlocal dy
        y, _ = module(xg)
        if dy is None:
            dy = torch.randn_like(y)
        y.backward(dy)

    f = time_ms(fwd, reps, warmup)
    fb = time_ms(fwdbwd, reps, warmup)
    return f + fb


def bench_kfuse(exe, cell, s, reps, warmup):
    cmd = [exe, "--device", "cuda", "--cell", cell, "--T", str(s["T"]), "--I", str(s["I"]),
           "--H", str(s["H"]), "--B", str(s["B"]), "--layers", "1", "--reps", str(reps),
           "--warmup", str(warmup)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    line = next((l for l in p.stdout.splitlines() if l.startswith("{")), None)
    if line is None:
        return {"error": (p.stdout + p.stderr).strip()[-400:] or f"exit {p.returncode}"}
    r = json.loads(line)
    if p.returncode != 0 and "error" not in r:
        r["error"] = f"exit {p.returncode}"
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True, help="path of kf_bench_rnn")
    ap.add_argument("--json", default=None)
    ap.add_argument("--md", default=None)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    a = ap.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    name = torch.cuda.get_device_name(0)
    env = dict(device=name, torch=torch.__version__, cudnn=torch.backends.cudnn.version())
    print(json.dumps(env), flush=True)
    rows = []
    for s in SHAPES:
        T, I, H, B = s["T"], s["I"], s["H"], s["B"]
        x = torch.rand(T, B, I, device=dev) * 2 - 1
        reps = reps_for(s, a.reps)
        reps_loop = max(3, a.reps // 4) if T > 100 else reps
        res = {}
        gru = torch.nn.GRU(I, H, 1).to(dev)
        for tf32 in (False, True):
            torch.backends.cudnn.allow_tf32 = tf32
            res["cudnn_tf32" if tf32 else "cudnn"] = bench_torch(gru, x, reps, a.warmup)
        torch.backends.cudnn.allow_tf32 = False
        loop = AGRU(I, H, 1).to(dev)
        res["agru_loop"] = bench_torch(loop, x, reps_loop, 2)
        kg = bench_kfuse(a.bench, "gru", s, reps, a.warmup)
        ka = bench_kfuse(a.bench, "agru", s, reps, a.warmup)
        for key, r in (("kfuse_gru", kg), ("kfuse_agru", ka)):
            if "error" in r:
                res[key] = None
                print(f"{key} {s}: {r['error']}", file=sys.stderr, flush=True)
            else:
                res[key] = (r["fwd_ms_median"], r["fwd_ms_min"], r["fwdbwd_ms_median"],
                            r["fwdbwd_ms_min"])
        row = dict(shape=s, reps=reps, reps_loop=reps_loop, **{k: (None if v is None else dict(
            fwd_ms_median=v[0], fwd_ms_min=v[1], fwdbwd_ms_median=v[2], fwdbwd_ms_min=v[3]))
            for k, v in res.items()}, kfuse_raw=dict(gru=kg, agru=ka))
        print(json.dumps(row), flush=True)
        rows.append(row)

    def f(v, k):
        return "n/a" if v is None else f"{v[k]:.3f}"

    def ratio(num, den, k):
        if num is None or den is None or den[k] <= 0:
            return "n/a"
        return f"{num[k] / den[k]:.2f}x"

    def per_step(v, k, T):
        return "n/a" if v is None else f"{v[k] * 1e3 / T:.2f}"

    md = [f"GPU recurrent layers, {name}, torch {torch.__version__}, cuDNN {env['cudnn']}; "
          f"fp32; median over {a.reps} reps ({a.reps * 5} for T*B <= 64; eager loop at T=784: "
          f"{max(3, a.reps // 4)}), host clock + synchronize, warm-up first. Per call in ms, "
          f"per step = per call / T in us.", "",
          "| shape | impl | fwd ms | fwd+bwd ms | fwd us/step | fwd+bwd us/step |",
          "|---|---|---|---|---|---|"]
    for r in rows:
        s = r["shape"]
        tag = f"T={s['T']} I={s['I']} H={s['H']} B={s['B']}"
        for k, label in (("cudnn", "torch.nn.GRU cuDNN fp32"),
                         ("cudnn_tf32", "torch.nn.GRU cuDNN default TF32"),
                         ("agru_loop", "A-GRU eager loop"),
                         ("kfuse_gru", "kfuse GRU"), ("kfuse_agru", "kfuse A-GRU")):
            v = r[k]
            md.append(f"| {tag} | {label} | {f(v, 'fwd_ms_median')} | "
                      f"{f(v, 'fwdbwd_ms_median')} | {per_step(v, 'fwd_ms_median', s['T'])} | "
                      f"{per_step(v, 'fwdbwd_ms_median', s['T'])} |")
    md += ["", "| shape | kfuse GRU / cuDNN fwd | kfuse GRU / cuDNN fwd+bwd "
           "| kfuse A-GRU / cuDNN fwd | kfuse A-GRU / cuDNN fwd+bwd "
           "| A-GRU loop / kfuse A-GRU fwd | loop / kfuse fwd+bwd |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        s = r["shape"]
        c, kg, ka, lp = r["cudnn"], r["kfuse_gru"], r["kfuse_agru"], r["agru_loop"]
        md.append(f"| T={s['T']} I={s['I']} H={s['H']} B={s['B']} | "
                  f"{ratio(kg, c, 'fwd_ms_median')} | {ratio(kg, c, 'fwdbwd_ms_median')} | "
                  f"{ratio(ka, c, 'fwd_ms_median')} | {ratio(ka, c, 'fwdbwd_ms_median')} | "
                  f"{ratio(lp, ka, 'fwd_ms_median')} | {ratio(lp, ka, 'fwdbwd_ms_median')} |")
    text = "\n".join(md) + "\n"
    print(text)
    if a.md:
        with open(a.md, "w") as fh:
            fh.write(text)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(dict(env=env, rows=rows), fh, indent=1)
    bad = any(r[k] is None for r in rows for k in ("kfuse_gru", "kfuse_agru"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
