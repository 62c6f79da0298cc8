#!/usr/bin/env python3
"""One physics-informed training step of a KAN [2, 32, 32, 1] (grid 5, order 3), kfuse against
efficient-kan in the same run: the step of examples/python/pinn_poisson.py (forward, the
Laplacian by torch.autograd.grad(..., create_graph=True) twice, the loss, backward to the
weights, Adam), at 8192 interior collocation points (and 2048 on the boundary), float32.

  kfuse          kfuse.torch.KANLinear layers
  efficient-kan  efficient_kan.KANLinear where installed, else its transcription in
                 tests/python/kan_reference.py; the same initial weights (its state_dict)

Times: the two steps alternate rep by rep after warm-up (benches/cpu_kan.py's time_interleaved),
median ms. Peak extra memory of one step, above what was allocated before it (the example's
peak_extra): on CUDA torch.cuda.max_memory_allocated; on the CPU torch.profiler allocation
events, plus kfuse's CPU arena (its workspace, outside torch). Goals (issue 37): kfuse >= 3x
faster, <= 1/5 of efficient-kan's peak extra memory. For a goal missed (or with --profile), the
top entries of torch.profiler over each step (self time, with input shapes) say what dominates.

    build/pyenv/bin/python benches/pinn_step.py [--device cuda] [--profile] [--out FILE.md]

(build/pyenv: the kfuse package as bash scripts/test-python.sh installs it.)

Writes benches/results/cpu_pinn.md (--device cuda: gpu_pinn.md; --quick: under /tmp).
"""
import argparse
import datetime
import os
import platform
import statistics
import subprocess
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "examples", "python"))
import pinn_poisson as pinn  # noqa: E402
from cpu_kan import cpu_line, sh, time_interleaved, wait_quiet  # noqa: E402
from isa import isa_line, python_cmd  # noqa: E402

MIB = 1 << 20
SPEED_GOAL, MEMORY_GOAL = 3.0, 5.0


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--points", type=int, default=8192, help="interior points (default 8192)")
    p.add_argument("--reps", type=int, default=15, help="timed steps per model (at most)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--budget", type=float, default=120.0,
                   help="seconds of timed steps (reps stop after the rep that passes it)")
    p.add_argument("--max-wait", type=float, default=120.0, help="quiet-box wait before timing, s")
    p.add_argument("--build-dir", default=os.path.join(REPO, "build", "cpu"),
                   help="the libkfuse build, for the ISA line (KF_CPU_ARCH)")
    p.add_argument("--profile", action="store_true",
                   help="list torch.profiler's top operators of each step even where both goals "
                        "are met")
    p.add_argument("--quick", action="store_true", help="256 points, 3 reps, written under /tmp")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    if a.quick:
        a.points, a.reps, a.warmup = 256, 3, 1
    return a


def profile_top(step, device, rows=12):
    """torch.profiler's top `rows` entries of one step(), by self time, with input shapes."""
    from torch.profiler import ProfilerActivity, profile
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts, record_shapes=True) as prof:
        step()
        pinn.sync(device)
    key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    evs = sorted(prof.key_averages(group_by_input_shape=True), key=lambda e: -getattr(e, key))
    total = sum(getattr(e, key) for e in evs) or 1
    out = ["| op | input shapes | calls | self ms | share |", "|---|---|---:|---:|---:|"]
    for e in evs[:rows]:
        shapes = str(e.input_shapes).replace("|", "/") if e.input_shapes else ""
        out.append("| `%s` | %s | %d | %.2f | %.0f%% |" % (
            e.key, shapes[:120], e.count, getattr(e, key) / 1e3, 100 * getattr(e, key) / total))
    return out


def main(argv=None):
    a = parse_args(argv)
    t_start = time.time()
    device = torch.device(a.device)
    fused, ref = pinn.make_models(0, device, torch.float32)
    interior, f, boundary = pinn.collocation(a.points, 0, device, torch.float32)
    batch = (interior, f, boundary, 10.0)
    opts = [torch.optim.Adam(m.parameters(), lr=1e-3) for m in (fused, ref)]

    def stepper(model, opt):
        def step():
            pinn.train_step(model, opt, batch)
            pinn.sync(device)
        return step
    steps = {"kfuse": stepper(fused, opts[0]), "efficient-kan": stepper(ref, opts[1])}
    losses = {n: pinn.pinn_loss(m, *batch).item() for n, m in
              (("kfuse", fused), ("efficient-kan", ref))}  # the same weights: the same loss
    for _ in range(a.warmup):
        for s in steps.values():
            s()
    peak = {n: pinn.peak_extra(s, device, arena=n == "kfuse" and device.type == "cpu")[1]
            for n, s in steps.items()}
    busy = wait_quiet(a.max_wait) if device.type == "cpu" else 0.0
    times = time_interleaved(steps, a.reps, 0, a.budget)
    med = {n: statistics.median(t) for n, t in times.items()}
    speed = med["efficient-kan"] / med["kfuse"]
    mem = peak["efficient-kan"] / peak["kfuse"] if peak["kfuse"] else float("inf")
    results = [("speed-up over efficient-kan", "%.2fx" % speed, ">= %.0fx" % SPEED_GOAL,
                speed >= SPEED_GOAL),
               ("peak extra memory, kfuse / efficient-kan", "1/%.0f" % mem,
                "<= 1/%.0f" % MEMORY_GOAL, mem >= MEMORY_GOAL)]
    print("kfuse %.2f ms, efficient-kan %.2f ms (median of %d): %.2fx; peak extra %.2f against "
          "%.2f MiB: 1/%.0f" % (med["kfuse"], med["efficient-kan"], len(times["kfuse"]), speed,
                                peak["kfuse"] / MIB, peak["efficient-kan"] / MIB, mem), flush=True)
    cpu = device.type == "cpu"
    md = ["# PINN training step, kfuse against efficient-kan (`benches/pinn_step.py%s`)" % (
              "".join(" " + x for x in (argv if argv is not None else sys.argv[1:]))), "",
          "One physics-informed training step of examples/python/pinn_poisson.py (2-D Poisson, "
          "KAN [2, 32, 32, 1], grid 5, order 3, float32): forward, the Laplacian by "
          "`torch.autograd.grad(..., create_graph=True)` twice, the loss (interior residual + "
          "boundary), backward to the weights, Adam; %d interior and %d boundary points, on "
          "%s. efficient-kan: %s, the same initial weights. The two steps alternate rep by rep; "
          "median ms. Peak extra memory of one step above what was allocated before it: %s." % (
              a.points, boundary.shape[0], device, pinn.EFFICIENT_KAN,
              "torch.profiler allocation events (torch's CPU allocations), plus for kfuse its "
              "CPU context's arena (%.2f MiB)" % (pinn.kfuse_arena_bytes() / MIB) if cpu else
              "torch.cuda.max_memory_allocated"), "",
          "| model | ms per step (median) | reps | peak extra MiB | loss at the same start |",
          "|---|---:|---:|---:|---:|"]
    for n in steps:
        md.append("| %s | %.2f | %d | %.2f | %.6e |" % (n, med[n], len(times[n]), peak[n] / MIB,
                                                      losses[n]))
    md += ["", "| goal (issue 37) | measured | limit | result |", "|---|---:|---:|---|"]
    md += ["| %s | %s | %s | %s |" % (g, m, l, "PASS" if ok else "MISS")
           for g, m, l, ok in results]
    if a.profile or not all(ok for *_, ok in results):
        md += ["", "What dominates kfuse's step (torch.profiler, one step, self %s time, "
               "grouped by input shapes):" % ("CPU" if cpu else "CUDA"), ""]
        md += profile_top(steps["kfuse"], device)
        md += ["", "efficient-kan's step, the same way:", ""]
        md += profile_top(steps["efficient-kan"], device)
    git = sh(["git", "-C", REPO, "rev-parse", "--short", "HEAD"]).strip()
    dirty = sh(["git", "-C", REPO, "status", "--porcelain", "--", "capi", "cpu", "common",
                "cuda", "bindings"]).strip()
    import kfuse
    md += ["", "Machine and settings:", "",
           "- date: %s; wall time %.0f s" % (
               datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
               time.time() - t_start),
           "- " + (cpu_line() if cpu else "GPU: %s" % torch.cuda.get_device_name(device)),
           "- ISA: " + isa_line(a.build_dir, python_cmd(sys.executable)) if cpu
           else "- CUDA %s" % torch.version.cuda,
           "- torch %s, Python %s, %d torch threads (kfuse's context: the same count); env %s" % (
               torch.__version__, platform.python_version(), torch.get_num_threads(),
               ", ".join("%s=%s" % (k, os.environ[k])
                         for k in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS") if k in os.environ)),
           "- kfuse %s (git %s%s)" % (kfuse.version_string(), git,
                                      " + local changes" if dirty else "")]
    if cpu:
        load = os.getloadavg()
        md.append("- CPUs busy before timing (after waiting up to %.0f s for < 15%%): %.0f%%; load "
                  "average at the end %.2f %.2f %.2f" % (a.max_wait, 100 * busy, *load))
        if busy > 0.15 or load[0] > (os.cpu_count() or 1):
            md.append("- **Loaded box:** shared with other jobs while this ran; the absolute "
                      "times are inflated and noisy, the ratios come from interleaved steps of "
                      "the same run.")
    out = a.out or (os.path.join("/tmp", "kfuse-bench-quick", "%s_pinn.md" % (
        "cpu" if cpu else "gpu")) if a.quick else
        os.path.join(HERE, "results", "%s_pinn.md" % ("cpu" if cpu else "gpu")))
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as fh:
        fh.write("\n".join(md) + "\n")
    print("\n".join("%s: %s (%s) %s" % (g, m, l, "PASS" if ok else "MISS")
                    for g, m, l, ok in results))
    print("wrote %s" % out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
